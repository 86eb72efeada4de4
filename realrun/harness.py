"""The real disaggregated run on ONE GPU in ONE process: prefill and decode take turns.

What shares what (the matching simulator scenario must describe exactly this):
* One GPU, one Python process, one CUDA stream for compute.  Prefill and decode share the GPU's
  compute and memory and never overlap: the scheduler loop below is the only thing that launches
  compute kernels.
* Scheduler loop, one pass per decode-iteration boundary:
  1. requests whose arrival time has passed join the prefill queue (FCFS);
  2. if the prefill queue is not empty and its head's KV fits in the prefill side's parked-KV budget
     (``prefill_host_memory_bytes``: KV prefilled and not yet fully transferred; the head always
     goes when nothing is parked, as the simulator's prefill back-pressure), ONE prefill batch
     runs (the oldest requests, up to
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
     newly joined request = start_s of that iteration); requests that emitted their last token
     finish at the iteration's end (finish_s = end_s).
  With no decode work, no waiting prefill and nothing arrived, the loop sleeps until the next
  arrival or the next finished transfer.  So a waiting prefill delays decode by one prefill batch,
  and a prefill waits at most one decode iteration.
* The link (link.py) is a background thread with its own CUDA stream for the copies
  (GPU -> pinned host -> GPU, paced at link_gbps, round-robin chunks); it shares the GPU's copy
  engines and PCIe but no compute.  The sender's KV sits in a flat send buffer on the GPU and
  lands in a flat receive buffer on the same GPU.
* A decode iteration (step.py): running requests sit in batch slots 0..n-1.  At its start one
  kernel launch (kvcopy.py) places the joining requests' received KV into the lowest free slots and
  moves the last running requests into the slots finished ones left, so the slots stay dense; then
  the lengths and input tokens go to the GPU in one copy, and the whole step (embedding, every
  layer's projections, the KV method's append and attention, MLP, LM head, argmax) runs as one
  CUDA-graph replay of its (batch, context) bucket (``decode_mode="graphs"``, what vLLM and SGLang
  do) or launch by launch (``"eager"``); one host-device sync at its end reads the next tokens.
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
import os
import sys
import time
from dataclasses import dataclass, field

import torch

from . import kvcopy
from .kvformats import METHODS, KVMethodBase
from .link import CHUNK_BYTES, Link, Transfer
from .model import RandomLlama
from .step import DecodeStep
from .workload import Request

GIB = 1 << 30
SWITCH_INTERVAL_S = 0.0005  # the link thread must get the GIL back within ~0.5 ms to keep pace


@dataclass(frozen=True)
class RunConfig:
    method: str
    link_gbps: float
    kv_capacity_bytes: int
    prefill_max_batch_requests: int = 1
    prefill_max_batch_tokens: int = 16384
    max_decode_batch: int = 32
    max_total_tokens: int = 8192 + 128  # sizes the pool's per-slot capacity
    hack_prefill: str = "kernel"  # "kernel" (hack_attn_prefill) or "sdpa"
    decode_mode: str = "graphs"  # "graphs" (the step replayed per bucket) or "eager"
    prefill_host_memory_bytes: float = 64 * GIB  # parked-KV budget (the simulator's prefill host memory)
    chunk_bytes: int = CHUNK_BYTES
    seed: int = 0
    time_limit_s: float = 600.0  # abort a run that never drains (an unstable rate)
    step_times: bool = False  # time each iteration's parts on the GPU (CUDA events): Harness.step_rows
    # (the loop's CPU, the link thread's CPU) for the run (--pin-threads); None: the OS places them
    pin_cpus: tuple[int, int] | None = None


@dataclass
class _Req:
    req: Request
    t: dict = field(default_factory=dict)
    footprint: int = 0
    send: torch.Tensor | None = None
    recv: torch.Tensor | None = None
    tok: int = 0  # the next input token (the last one generated)
    wire: int = 0
    payload: int = 0  # separate placement: the bytes that travel
    slot: int = -1
    stored: int = 0
    generated: int = 0


class Harness:
    """role "both": the one-GPU run (run()); "prefill" / "decode": one side of the separate placement
    (separate.py), which uses prefill() or decode_iteration() alone (prefill allocates no slot pool)."""

    def __init__(self, model: RandomLlama, cfg: RunConfig, role: str = "both"):
        if cfg.method not in METHODS:
            raise ValueError(f"unknown method {cfg.method}")
        self.model, self.cfg = model, cfg
        self.device = model.device
        self.cuda = self.device.type == "cuda"
        self.method: KVMethodBase = METHODS[cfg.method](
            model.shape,
            self.device,
            cfg.max_decode_batch,
            cfg.max_total_tokens + 1,
            seed=cfg.seed,
            hack_prefill=cfg.hack_prefill,
        )
        self.role = role
        if role != "prefill":
            self.method.alloc_pool()
        self.step = DecodeStep(model, self.method, cfg.max_decode_batch, cfg.decode_mode) if role != "prefill" else None
        self.slots: list[_Req | None] = []
        self.host_issue: list[tuple[float, float]] = []  # (host time to issue, wall) per iteration
        self.moves: list[tuple[int, int]] = []  # (joins, compactions) per iteration
        # with cfg.step_times, per iteration: (host issue s, KV placement on the GPU s, the step's graph on the GPU s,
        # joins, compactions, batch bucket, context bucket)
        self.step_rows: list[tuple] = []

    def close(self) -> None:
        if self.step is not None:
            self.step.close()
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

    def prefill(self, batch: list[_Req], layer_done=None) -> None:
        """One prefill batch, then its encode into each request's flat send buffer.  layer_done(r, layer,
        layout): stream the KV by layers: the send buffers exist before the forward, each layer's KV is
        encoded right after its attention and layer_done is called (the encode then lies inside
        prefill_end_s, and quantize_end_s = prefill_end_s)."""
        m, meth = self.model, self.method
        ids = [self._prompt_ids(b.req) for b in batch]
        t_start = self.now()
        lens = [b.req.prompt_tokens for b in batch]
        layouts = [meth.wire_layout(n) for n in lens]
        views = []
        if layer_done is not None:
            for b, layout in zip(batch, layouts):
                b.send = torch.empty(layout.nbytes, dtype=torch.uint8, device=self.device)
                views.append(layout.views(b.send))
        x = m.embed[torch.cat(ids)]  # (T, hidden)
        pos = torch.cat([torch.arange(n, device=self.device) for n in lens])
        rot = m.rope_tables(pos)
        kept: list[list] = [[] for _ in batch]  # per request: (k, v, state) per layer
        bounds = [0]
        for n in lens:
            bounds.append(bounds[-1] + n)
        for layer, lw in enumerate(m.layers):
            q, k, v = m.qkv(lw, x, rot)  # (T, H, D)
            outs = []
            for i in range(len(batch)):
                a, b = bounds[i], bounds[i + 1]
                qi = q[a:b].transpose(0, 1)[None].contiguous()  # (1, HQ, P, D)
                ki = k[a:b].transpose(0, 1)[None].contiguous()  # (1, HKV, P, D)
                vi = v[a:b].transpose(0, 1)[None].contiguous()
                o, state = meth.prefill_attention(qi, ki, vi)
                if layer_done is not None:
                    meth.encode_layer(views[i], layer, ki[0], vi[0], state)
                    layer_done(batch[i], layer, layouts[i])
                else:
                    kept[i].append((ki[0], vi[0], state))
                outs.append(o[0].transpose(0, 1).reshape(b - a, -1))
            x = m.finish_layer(lw, x, torch.cat(outs) if len(outs) > 1 else outs[0])
        nxt = m.next_token(x[[bnd - 1 for bnd in bounds[1:]]])
        t_end = self.now()
        if layer_done is None:
            for i, b in enumerate(batch):
                b.send = torch.empty(layouts[i].nbytes, dtype=torch.uint8, device=self.device)
                v_i = layouts[i].views(b.send)
                for layer, (k, v, state) in enumerate(kept[i]):
                    meth.encode_layer(v_i, layer, k, v, state)
                kept[i] = None
            t_q = self.now()
        else:
            t_q = t_end
        toks = nxt.tolist()
        for i, b in enumerate(batch):
            b.t.update(prefill_start_s=t_start, prefill_end_s=t_end, first_token_s=t_end, quantize_end_s=t_q)
            b.generated = 1
            b.tok = toks[i]

    def place(self, joining: list[_Req]) -> list:
        """Joins take the lowest free slots; then the last running requests move into the slots still
        free below them, so slots 0..n-1 hold the n running requests.  Returns the kvcopy segments."""
        meth, slots = self.method, self.slots
        holes = [i for i, r in enumerate(slots) if r is None]
        segs: list = []
        for r in joining:
            i = holes.pop(0) if holes else len(slots)
            if i == len(slots):
                slots.append(r)
            else:
                slots[i] = r
            r.slot, r.stored = i, r.req.prompt_tokens
            segs += meth.join_segments(i, r.recv, r.req.prompt_tokens)
        moved = 0
        for i in holes:
            while slots and slots[-1] is None:
                slots.pop()
            if i >= len(slots):
                break
            r = slots.pop()
            segs += meth.move_segments(r.slot, i, r.stored)
            slots[i], r.slot = r, i
            moved += 1
        while slots and slots[-1] is None:
            slots.pop()
        self.moves.append((len(joining), moved))
        return segs

    def decode_iteration(self, joining: list[_Req]):
        m, dev = self.model, self.device
        t_start = self.now()
        if self.cuda:
            torch.cuda.reset_peak_memory_stats(dev)
        timed = self.cfg.step_times and self.cuda
        ev = [torch.cuda.Event(enable_timing=True) for _ in range(4)] if timed else []
        segs = self.place(joining)
        if timed:
            ev[0].record()
        kvcopy.kvcopy(segs, m.shape.layers, m.shape.kv_heads, dev)
        if timed:
            ev[1].record()
        for r in joining:
            r.recv = None
            r.t["decode_start_s"] = t_start
        run = self.slots
        n = len(run)
        stored = [r.stored for r in run]
        self.step.set_inputs([r.tok for r in run], stored)
        if timed:
            ev[2].record()
        shape = self.step.run(n, max(stored) + 1)
        if timed:
            ev[3].record()
        t_issued = time.perf_counter() - self.t0
        t_end = self.now()
        toks = self.step.tok_out[:n].tolist()
        self.host_issue.append((t_issued - t_start, t_end - t_start))
        if timed:
            joins, moved = self.moves[-1]
            self.step_rows.append(
                (t_issued - t_start, ev[0].elapsed_time(ev[1]) / 1e3, ev[2].elapsed_time(ev[3]) / 1e3, joins, moved)
                + tuple(shape)
            )
        peak = torch.cuda.max_memory_allocated(dev) if self.cuda else 0
        finished = []
        for i, r in enumerate(run):
            r.stored += 1
            r.generated += 1
            r.tok = toks[i]
            if r.generated >= r.req.output_tokens:
                r.t["finish_s"] = t_end
                finished.append(r)
                run[i] = None
        return (t_start, t_end, n, sum(stored) + n, peak), finished

    def iterate(self, ready: collections.deque, iterations: list) -> list[_Req] | None:
        """Join what is ready (continuous batching, up to max_decode_batch running requests) and run
        one decode iteration; its row goes to `iterations`.  Returns the finished requests, or None
        when nothing is running or joining."""
        joining = []
        running = sum(r is not None for r in self.slots)
        while ready and running + len(joining) < self.cfg.max_decode_batch:
            joining.append(ready.popleft())
        if not (running or joining):
            return None
        row, finished = self.decode_iteration(joining)
        iterations.append((len(iterations),) + row)
        return finished

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
        link = Link(
            cfg.link_gbps,
            lambda: time.perf_counter() - self.t0,
            self.device,
            cfg.chunk_bytes,
            cpu=None if cfg.pin_cpus is None else cfg.pin_cpus[1],
        )
        old_cpus = os.sched_getaffinity(0) if cfg.pin_cpus is not None else None
        if cfg.pin_cpus is not None:  # after the link thread started: it must not inherit the loop's one CPU
            os.sched_setaffinity(0, {cfg.pin_cpus[0]})
        arrivals = collections.deque(sorted(workload, key=lambda r: (r.arrival_s, r.request_id)))
        prefill_q: collections.deque[_Req] = collections.deque()
        admit_q: collections.deque[_Req] = collections.deque()
        in_flight: dict[int, _Req] = {}
        ready: collections.deque[_Req] = collections.deque()
        self.slots = []
        used_bytes = 0
        parked = 0  # wire bytes prefilled and not yet fully transferred (prefill back-pressure)
        done: list[_Req] = []
        iterations = []
        complete = True

        def take_transfers(block_s: float = 0.0) -> None:
            nonlocal parked
            while True:
                try:
                    tr = link.done.get(timeout=block_s) if block_s > 0 else link.done.get_nowait()
                except Exception:
                    return
                block_s = 0.0
                r = in_flight.pop(tr.key)
                r.t["transfer_end_s"] = tr.end_s
                r.send = None
                parked -= r.wire
                ready.append(r)

        def prefill_may_start() -> bool:
            return bool(prefill_q) and (
                parked == 0 or parked + meth.wire_bytes(prefill_q[0].req.prompt_tokens) <= cfg.prefill_host_memory_bytes
            )

        try:
            while len(done) < len(workload):
                now = self.now()
                if now > cfg.time_limit_s:
                    complete = False
                    break
                while arrivals and arrivals[0].arrival_s <= now:
                    prefill_q.append(_Req(arrivals.popleft()))
                take_transfers()
                if prefill_may_start():
                    batch, tokens = [], 0
                    while (
                        prefill_q
                        and len(batch) < cfg.prefill_max_batch_requests
                        and (not batch or tokens + prefill_q[0].req.prompt_tokens <= cfg.prefill_max_batch_tokens)
                    ):
                        b = prefill_q.popleft()
                        tokens += b.req.prompt_tokens
                        batch.append(b)
                    self.prefill(batch)
                    for b in batch:
                        b.footprint = meth.footprint_bytes(b.req.prompt_tokens + b.req.output_tokens)
                        b.wire = b.send.numel()
                        parked += b.wire
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
                finished = self.iterate(ready, iterations)
                if finished is not None:
                    for r in finished:
                        used_bytes -= r.footprint
                        done.append(r)
                    continue
                take_transfers()
                if prefill_may_start() or ready or (arrivals and arrivals[0].arrival_s <= self.now()):
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
            if old_cpus is not None:
                os.sched_setaffinity(0, old_cpus)
        rows = []
        everyone = (
            done
            + [r for r in self.slots if r is not None]
            + list(ready)
            + list(in_flight.values())
            + list(admit_q)
            + list(prefill_q)
        )
        nan = float("nan")
        for r in everyone:
            q = r.req
            t = r.t
            rows.append(
                (
                    q.request_id,
                    cfg.method,
                    q.arrival_s,
                    q.prompt_tokens,
                    q.output_tokens,
                    t.get("prefill_start_s", nan),
                    t.get("prefill_end_s", nan),
                    t.get("quantize_end_s", nan),
                    t.get("transfer_start_s", nan),
                    t.get("transfer_end_s", nan),
                    t.get("decode_start_s", nan),
                    t.get("first_token_s", nan),
                    t.get("finish_s", nan),
                )
            )
        return rows, iterations, complete and len(done) == len(workload)
