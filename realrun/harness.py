"""The real disaggregated run on ONE GPU in ONE process: prefill and decode take turns.

What shares what (the matching simulator scenario must describe exactly this):
* One GPU, one Python process, one CUDA stream for compute.  Prefill and decode share the GPU's
  compute and memory and never overlap: the scheduler loop below is the only thing that launches
  compute kernels.
* Scheduler loop, one pass per decode-iteration boundary:
  1. requests whose arrival time has passed join the prefill queue (FCFS);
  2. if the prefill queue is not empty, ONE prefill batch runs (the oldest requests, up to
     ``prefill_max_batch_requests`` (default 1) and ``prefill_max_batch_tokens`` prompt tokens;
     the first request always goes), then its quantize (encode) step; the prompt's first token
     comes out of the prefill (first_token_s = prefill_end_s).  For hack with the HACK prefill
     kernel the quantize kernels run inside the forward (the kernel reads codes), so they are in
     prefill_end_s - prefill_start_s and the quantize step is only the packing for the wire (the
     run log prints the quantize kernels' share);
  3. admission, strict FIFO: the oldest prefilled request whose final KV footprint
     (prompt + output tokens, in its method's format, see kvformats.py) fits into
     ``kv_capacity_bytes`` minus what admitted requests hold reserves it and starts its transfer
     (transfer_start_s); it holds the reservation until it finishes; transfers in flight share the
     link fairly;
  4. transfers the link thread finished (transfer_end_s) join the decode batch at this boundary,
     up to ``max_decode_batch`` running requests (continuous batching);
  5. if any request is decoding, ONE decode iteration runs for all of them (decode_start_s of a
     newly joined request = start_s of that iteration; its received KV is copied from the
     receive buffer into its batch slot inside that iteration); requests that emitted their last
     token finish at the iteration's end (finish_s = end_s).
  With no decode work, no waiting prefill and nothing arrived, the loop sleeps until the next
  arrival or the next finished transfer.  So a waiting prefill delays decode by one prefill batch,
  and a prefill waits at most one decode iteration.
* The link (link.py) is a background thread with its own CUDA stream for the copies
  (GPU -> pinned host -> GPU, paced at link_gbps, round-robin chunks); it shares the GPU's copy
  engines and PCIe but no compute.  The sender's KV sits in a flat send buffer on the GPU and
  lands in a flat receive buffer on the same GPU.
* A decode iteration: the dense part (embedding, norms, QKV/O projections, RoPE, MLP, LM head,
  argmax) replays CUDA graphs captured per batch size (dense.py); the attention of each layer
  (append + the method's kernels) runs eagerly between them; one host-device sync at its end.
* Decode memory: the KV of running requests lives in a preallocated slot pool (the kernels want
  one contiguous [batch, kv_heads, tokens, ...] tensor per layer) sized for max_decode_batch
  requests of the longest prompt + output; ``kv_capacity_bytes`` is enforced by the admission
  accounting above, not by the pool's size.
* Timestamps: time.perf_counter() relative to the run's start, read right after
  torch.cuda.synchronize() at every boundary.  Kernels are warmed up (Triton compiled for every
  variant the run can hit) before the run starts.
"""
from __future__ import annotations

import collections
import heapq
import sys
import time
from dataclasses import dataclass, field

import torch

from .dense import DenseSteps, pinned
from .kvformats import METHODS, KVMethodBase
from .link import CHUNK_BYTES, Link, Transfer
from .model import RandomLlama
from .workload import Request

GIB = 1 << 30
SWITCH_INTERVAL_S = 0.0005   # the link thread must get the GIL back within ~0.5 ms to keep pace


@dataclass(frozen=True)
class RunConfig:
    method: str
    link_gbps: float
    kv_capacity_bytes: int
    prefill_max_batch_requests: int = 1
    prefill_max_batch_tokens: int = 16384
    max_decode_batch: int = 32
    max_total_tokens: int = 8192 + 128       # sizes the pool's per-slot capacity
    hack_prefill: str = "kernel"             # "kernel" (hack_attn_prefill) or "sdpa"
    chunk_bytes: int = CHUNK_BYTES
    seed: int = 0
    time_limit_s: float = 600.0              # abort a run that never drains (an unstable rate)


@dataclass
class _Req:
    req: Request
    t: dict = field(default_factory=dict)
    footprint: int = 0
    send: torch.Tensor | None = None
    recv: torch.Tensor | None = None
    first_token: torch.Tensor | None = None
    slot: int = -1
    stored: int = 0
    generated: int = 0


class Harness:
    def __init__(self, model: RandomLlama, cfg: RunConfig, dense: DenseSteps | None = None):
        if cfg.method not in METHODS:
            raise ValueError(f"unknown method {cfg.method}")
        self.model, self.cfg = model, cfg
        self.device = model.device
        self.cuda = self.device.type == "cuda"
        self.method: KVMethodBase = METHODS[cfg.method](model.shape, self.device, cfg.max_decode_batch,
                                                        cfg.max_total_tokens + 1, seed=cfg.seed,
                                                        hack_prefill=cfg.hack_prefill)
        self.method.alloc_pool()
        if dense is None or dense.max_n < cfg.max_decode_batch:
            dense = DenseSteps(model, cfg.max_decode_batch)
        self.dense = dense
        self.tok_slots = dense.tok_slots
        self.host_issue: list[tuple[float, float]] = []   # (host time to issue, wall) per iteration
        self.capture: list | None = None   # check.py: (layer, rows_slot, q, out) per layer, then ("x", x)

    def close(self) -> None:
        self.method.pool.clear()
        self.method._views.clear()
        self.method.scratch = None
        if self.cuda:
            torch.cuda.empty_cache()

    # ---- clock ---------------------------------------------------------------------------
    def _sync(self) -> None:
        if self.cuda:
            torch.cuda.synchronize(self.device)

    def now(self) -> float:
        self._sync()
        return time.perf_counter() - self.t0

    # ---- phases --------------------------------------------------------------------------
    def _prompt_ids(self, r: Request) -> torch.Tensor:
        g = torch.Generator().manual_seed(self.cfg.seed * 1_000_003 + r.request_id)
        return torch.randint(0, self.model.shape.vocab, (r.prompt_tokens,), generator=g).to(self.device)

    def prefill(self, batch: list[_Req]) -> None:
        m, meth = self.model, self.method
        ids = [self._prompt_ids(b.req) for b in batch]
        t_start = self.now()
        lens = [b.req.prompt_tokens for b in batch]
        x = m.embed[torch.cat(ids)]                                       # (T, hidden)
        pos = torch.cat([torch.arange(n, device=self.device) for n in lens])
        rot = m.rope_tables(pos)
        kept: list[list] = [[] for _ in batch]                            # per request: (k, v, state) per layer
        bounds = [0]
        for n in lens:
            bounds.append(bounds[-1] + n)
        for lw in m.layers:
            q, k, v = m.qkv(lw, x, rot)                                   # (T, H, D)
            outs = []
            for i in range(len(batch)):
                a, b = bounds[i], bounds[i + 1]
                qi = q[a:b].transpose(0, 1)[None].contiguous()            # (1, HQ, P, D)
                ki = k[a:b].transpose(0, 1)[None].contiguous()            # (1, HKV, P, D)
                vi = v[a:b].transpose(0, 1)[None].contiguous()
                o, state = meth.prefill_attention(qi, ki, vi)
                kept[i].append((ki[0], vi[0], state))
                outs.append(o[0].transpose(0, 1).reshape(b - a, -1))
            x = m.finish_layer(lw, x, torch.cat(outs) if len(outs) > 1 else outs[0])
        nxt = m.next_token(x[[bnd - 1 for bnd in bounds[1:]]])
        t_end = self.now()
        for i, b in enumerate(batch):
            layout = meth.wire_layout(b.req.prompt_tokens)
            b.send = torch.empty(layout.nbytes, dtype=torch.uint8, device=self.device)
            views = layout.views(b.send)
            for layer, (k, v, state) in enumerate(kept[i]):
                meth.encode_layer(views, layer, k, v, state)
            kept[i] = None
            b.first_token = nxt[i]
        t_q = self.now()
        for b in batch:
            b.t.update(prefill_start_s=t_start, prefill_end_s=t_end, first_token_s=t_end, quantize_end_s=t_q)
            b.generated = 1

    def decode_iteration(self, running: dict[int, _Req], joining: list[_Req], free_slots: list[int]):
        m, meth, dev = self.model, self.method, self.device
        t_start = self.now()
        if self.cuda:
            torch.cuda.reset_peak_memory_stats(dev)
        for r in joining:
            r.slot = heapq.heappop(free_slots)
            meth.unpack(r.slot, r.recv, r.req.prompt_tokens)
            r.recv = None
            r.stored = r.req.prompt_tokens
            self.tok_slots[r.slot] = r.first_token
            r.t["decode_start_s"] = t_start
            running[r.slot] = r
        slots = sorted(running)
        n, hi = len(slots), slots[-1] + 1
        lens_prev = [0] * hi
        for s in slots:
            lens_prev[s] = running[s].stored
        lens_attn = [lens_prev[i] + 1 if i in running else 0 for i in range(hi)]
        max_len = max(lens_attn)
        # both lens vectors start 16-byte aligned: Triton specialises pointers on alignment, and a
        # misaligned one would compile a new kernel variant in the middle of a measured run
        off = -(-hi // 4) * 4
        ints = torch.tensor(lens_prev + [0] * (off - hi) + lens_attn, dtype=torch.int32)
        ints = pinned(ints).to(dev, non_blocking=True) if self.cuda else ints
        lp_d, la_d = ints[:hi], ints[off:off + hi]
        b = self.dense.begin(n, torch.tensor(slots + [lens_prev[s] for s in slots], dtype=torch.int64))
        rows_slot = b.rows
        dense = n == hi
        s = m.shape
        for layer in range(s.layers):
            if not dense:   # a hole in the slots: scatter rows to slots (zeros where no request)
                qf = b.q.new_zeros((hi, s.q_heads, s.head_dim)).index_copy_(0, rows_slot, b.q)
                kf = b.k.new_zeros((hi, s.kv_heads, s.head_dim)).index_copy_(0, rows_slot, b.k)
                vf = b.v.new_zeros((hi, s.kv_heads, s.head_dim)).index_copy_(0, rows_slot, b.v)
            else:
                qf, kf, vf = b.q, b.k, b.v
            o = meth.decode_attention(layer, qf, kf, vf, lp_d, la_d, rows_slot, hi, n, max_len)
            if self.capture is not None:
                self.capture_lens = la_d
                self.capture.append((layer, rows_slot.clone(), qf.clone(), o.clone(),
                                     meth.reference_attention(layer, qf, la_d, hi)))
            if not dense:
                o = o.index_select(0, rows_slot)
            self.dense.after_attention(b, layer, o)
        if self.capture is not None:   # b.x: the last layer's output, the LM head's input
            self.capture.append(("x", rows_slot.clone(), b.x.clone()))
        t_issued = time.perf_counter() - self.t0
        t_end = self.now()
        self.host_issue.append((t_issued - t_start, t_end - t_start))
        peak = torch.cuda.max_memory_allocated(dev) if self.cuda else 0
        finished = []
        for sl in slots:
            r = running[sl]
            r.stored += 1
            r.generated += 1
            if r.generated >= r.req.output_tokens:
                r.t["finish_s"] = t_end
                finished.append(r)
        for r in finished:
            del running[r.slot]
            heapq.heappush(free_slots, r.slot)
        return (t_start, t_end, n, sum(lens_attn), peak), finished

    # ---- the loop ------------------------------------------------------------------------
    def run(self, workload: list[Request]):
        """Returns (request rows, iteration rows, complete) in the trace format's column order."""
        cfg, meth = self.cfg, self.method
        worst = max(meth.footprint_bytes(r.prompt_tokens + r.output_tokens) for r in workload)
        if worst > cfg.kv_capacity_bytes:
            raise ValueError(f"a request needs {worst} B of KV, more than the capacity {cfg.kv_capacity_bytes} B")
        if max(r.prompt_tokens + r.output_tokens for r in workload) > cfg.max_total_tokens:
            raise ValueError("a request is longer than max_total_tokens")
        old_switch = sys.getswitchinterval()
        sys.setswitchinterval(SWITCH_INTERVAL_S)
        self.t0 = time.perf_counter()
        self._sync()
        self.t0 = time.perf_counter()
        link = Link(cfg.link_gbps, lambda: time.perf_counter() - self.t0, self.device, cfg.chunk_bytes)
        arrivals = collections.deque(sorted(workload, key=lambda r: (r.arrival_s, r.request_id)))
        prefill_q: collections.deque[_Req] = collections.deque()
        admit_q: collections.deque[_Req] = collections.deque()
        in_flight: dict[int, _Req] = {}
        ready: collections.deque[_Req] = collections.deque()
        running: dict[int, _Req] = {}
        free_slots = list(range(cfg.max_decode_batch))
        used_bytes = 0
        done: list[_Req] = []
        iterations = []
        complete = True

        def take_transfers(block_s: float = 0.0) -> None:
            while True:
                try:
                    tr = link.done.get(timeout=block_s) if block_s > 0 else link.done.get_nowait()
                except Exception:
                    return
                block_s = 0.0
                r = in_flight.pop(tr.key)
                r.t["transfer_end_s"] = tr.end_s
                r.send = None
                ready.append(r)

        try:
            while len(done) < len(workload):
                now = self.now()
                if now > cfg.time_limit_s:
                    complete = False
                    break
                while arrivals and arrivals[0].arrival_s <= now:
                    prefill_q.append(_Req(arrivals.popleft()))
                if prefill_q:
                    batch, tokens = [], 0
                    while prefill_q and len(batch) < cfg.prefill_max_batch_requests and (
                            not batch or tokens + prefill_q[0].req.prompt_tokens <= cfg.prefill_max_batch_tokens):
                        b = prefill_q.popleft()
                        tokens += b.req.prompt_tokens
                        batch.append(b)
                    self.prefill(batch)
                    for b in batch:
                        b.footprint = meth.footprint_bytes(b.req.prompt_tokens + b.req.output_tokens)
                    admit_q.extend(batch)
                while admit_q and used_bytes + admit_q[0].footprint <= cfg.kv_capacity_bytes:
                    r = admit_q.popleft()
                    used_bytes += r.footprint
                    r.recv = torch.empty_like(r.send)
                    in_flight[r.req.request_id] = r
                    tr = Transfer(r.req.request_id, r.send, r.recv)
                    link.submit(tr)
                    r.t["transfer_start_s"] = tr.start_s
                take_transfers()
                joining = []
                while ready and len(running) + len(joining) < cfg.max_decode_batch:
                    joining.append(ready.popleft())
                if running or joining:
                    row, finished = self.decode_iteration(running, joining, free_slots)
                    iterations.append((len(iterations),) + row)
                    for r in finished:
                        used_bytes -= r.footprint
                        done.append(r)
                    continue
                if prefill_q or (arrivals and arrivals[0].arrival_s <= self.now()):
                    continue
                # idle: wait for the next arrival or the next finished transfer
                wait = (arrivals[0].arrival_s - self.now()) if arrivals else 0.05
                if in_flight:
                    take_transfers(block_s=max(min(wait, 0.05), 1e-4))
                elif wait > 0:
                    time.sleep(min(wait, 0.05))
        finally:
            link.close()
            sys.setswitchinterval(old_switch)
        rows = []
        everyone = done + list(running.values()) + list(ready) + list(in_flight.values()) + list(admit_q) + list(prefill_q)
        nan = float("nan")
        for r in everyone:
            q = r.req
            t = r.t
            rows.append((q.request_id, cfg.method, q.arrival_s, q.prompt_tokens, q.output_tokens,
                         t.get("prefill_start_s", nan), t.get("prefill_end_s", nan), t.get("quantize_end_s", nan),
                         t.get("transfer_start_s", nan), t.get("transfer_end_s", nan),
                         t.get("decode_start_s", nan), t.get("first_token_s", nan), t.get("finish_s", nan)))
        return rows, iterations, complete and len(done) == len(workload)
