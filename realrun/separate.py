"""The real run with prefill and decode on separate devices (placement ``separate``): two processes.

What runs where (the matching simulator scenario is ``placement: separate`` with one prefill and one
decode replica):
* The prefill process (device A, e.g. cuda:0): Poisson arrivals, FCFS prefill batches (as the
  one-GPU harness: up to ``prefill_max_batch_requests`` / ``prefill_max_batch_tokens``), then the
  encode into a flat send buffer on device A; the request's KV is then *parked* until its last byte
  is sent.  A prefill batch starts only while the parked KV plus its head's fits the parked-KV
  budget (``prefill_host_memory_bytes``; the head always goes when nothing is parked: the
  simulator's prefill back-pressure).  Prefill never waits for decode: the GPUs are separate.
* The link: the prefill process's sender thread serves the admitted transfers round robin, one
  chunk at a time: device A -> pinned host -> TCP socket on 127.0.0.1 -> the decode process's
  receiver thread -> pinned host -> device B, paced by the same token bucket as the one-GPU link
  (link.py: a lone transfer of n bytes takes n * 8 / R s; concurrent ones share R fairly).
  ``stream_layers``: the request is announced at prefill start, each layer's KV is encoded right
  after its attention and may leave as soon as it exists (the sender skips a transfer whose next
  layer is not ready).
* The decode process (device B): the admission policy of the simulator's router: announced requests
  wait in one FIFO; the head is admitted when its final KV footprint fits ``kv_capacity_bytes``
  minus what admitted requests hold (strict FIFO); admission reserves the memory, allocates the
  receive buffer and tells the prefill side to send (transfer_start_s); a request whose last byte
  has landed on device B (transfer_end_s) joins the decode batch at the next iteration boundary
  (continuous batching, the dense-slot step of step.py, CUDA graphs or eager); it frees its
  reservation when it finishes.
* Clock: time.perf_counter() (CLOCK_MONOTONIC, one clock for every process of the machine) minus a
  start time the launcher hands both processes.  The launcher merges the two sides' timestamps into
  one trace (trace.py format, placement "separate" in meta.json).

Wire protocol (one TCP connection, both directions): frames of a 25-byte header (type u8, request id
i64, offset i64, length u64) and ``length`` payload bytes.  Prefill -> decode: READY (payload: JSON
of the request's lengths, wire and footprint bytes), DATA (payload: KV bytes at ``offset`` of the
request's flat buffer), TOKEN (the prefill's token in ``offset``, sent when the prefill ends: with
streamed layers the request is announced before it exists), END (no more requests).
Decode -> prefill: ADMIT.  A request joins the decode batch once all its bytes and its token are in.
"""

from __future__ import annotations

import collections
import json
import multiprocessing as mp
import os
import queue
import socket
import struct
import sys
import threading
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path

import torch

from .harness import GIB, SWITCH_INTERVAL_S, Harness, RunConfig, _Req
from .link import CHUNK_BYTES
from .workload import Request

HEADER = struct.Struct("<BqqQ")
READY, DATA, END, ADMIT, TOKEN = 1, 2, 3, 4, 5


def _recv_exact(sock: socket.socket, view: memoryview) -> bool:
    got = 0
    while got < len(view):
        n = sock.recv_into(view[got:])
        if n == 0:
            return False
        got += n
    return True


def _recv_frame(sock: socket.socket, payload: memoryview | None = None):
    """(type, rid, offset, payload bytes or the number of bytes written into `payload`) or None at EOF."""
    head = bytearray(HEADER.size)
    if not _recv_exact(sock, memoryview(head)):
        return None
    kind, rid, off, n = HEADER.unpack(head)
    if payload is not None and kind == DATA:
        if not _recv_exact(sock, payload[:n]):
            return None
        return kind, rid, off, n
    body = bytearray(n)
    if n and not _recv_exact(sock, memoryview(body)):
        return None
    return kind, rid, off, bytes(body)


def _staging(nbytes: int, cuda: bool) -> torch.Tensor:
    t = torch.empty(nbytes, dtype=torch.uint8)
    if cuda:
        try:
            return t.pin_memory()
        except RuntimeError:
            pass
    return t


# ---- the prefill side --------------------------------------------------------------------------
@dataclass
class _Out:
    """A transfer on the sender: byte ranges released in order (all at once, or layer by layer)."""

    rid: int
    src: torch.Tensor
    ranges: collections.deque = field(default_factory=collections.deque)  # (offset, bytes, event or None)
    pos: int = 0  # bytes sent of the range at the head
    total: int = 0
    sent: int = 0
    announced_all: bool = False


class Sender:
    """Paced round-robin sender (the token bucket of link.py) over a socket; one thread."""

    def __init__(
        self, sock: socket.socket, lock: threading.Lock, gbps: float, clock, cuda: bool, chunk_bytes: int = CHUNK_BYTES
    ):
        self.sock, self.lock, self.clock, self.cuda = sock, lock, clock, cuda
        self.bytes_per_s = gbps * 1e9 / 8
        self.chunk = chunk_bytes
        self.staging = _staging(chunk_bytes, cuda)
        self.stream = torch.cuda.Stream() if cuda else None
        self.admitted: queue.Queue = queue.Queue()
        self.done: queue.Queue = queue.Queue()  # (rid, time the last byte left)
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, name="sender", daemon=True)
        self.thread.start()

    def _ready(self, tr: _Out) -> bool:
        if not tr.ranges:
            return False
        ev = tr.ranges[0][2]
        return ev is None or ev.query()

    def _send_chunk(self, tr: _Out) -> int:
        off, nbytes, _ = tr.ranges[0]
        n = min(self.chunk, nbytes - tr.pos)
        a = off + tr.pos
        st = self.staging[:n]
        if self.cuda:
            with torch.cuda.stream(self.stream):
                st.copy_(tr.src[a : a + n], non_blocking=True)
            self.stream.synchronize()
        else:
            st.copy_(tr.src[a : a + n])
        with self.lock:
            self.sock.sendall(HEADER.pack(DATA, tr.rid, a, n))
            self.sock.sendall(memoryview(st.numpy()))
        tr.pos += n
        tr.sent += n
        if tr.pos >= nbytes:
            tr.ranges.popleft()
            tr.pos = 0
        return n

    def _run(self) -> None:
        active: collections.deque[_Out] = collections.deque()
        wire_s = 0.0
        while not self.stop.is_set():
            try:
                while True:
                    tr = self.admitted.get(block=not active, timeout=0.05 if not active else None)
                    if tr is None:
                        return
                    if not active:
                        wire_s = max(wire_s, self.clock())  # busy from idle: no saved-up credit
                    active.append(tr)
            except queue.Empty:
                pass
            if not active:
                continue
            for _ in range(len(active)):  # the next transfer with bytes ready (streamed layers may lag)
                if self._ready(active[0]):
                    break
                active.rotate(-1)
            else:
                time.sleep(2e-4)
                wire_s = max(wire_s, self.clock())
                continue
            tr = active.popleft()
            n = self._send_chunk(tr)
            wire_s += n / self.bytes_per_s
            delay = wire_s - self.clock()
            if delay > 0:
                time.sleep(delay)
            if tr.announced_all and tr.sent >= tr.total:
                self.done.put((tr.rid, self.clock()))
            else:
                active.append(tr)

    def close(self) -> None:
        self.stop.set()
        self.admitted.put(None)
        self.thread.join(timeout=10)


def prefill_main(args: dict, results, sync_q) -> None:
    """The prefill process: device args["prefill_device"], connects to the decode process."""
    try:
        results.put(("prefill", _prefill(args, results, sync_q)))
    except Exception:
        results.put(("prefill_error", traceback.format_exc()))


def _engine(args: dict, role: str) -> Harness:
    """This process's side of the run on its device (the interpreter for Triton on the CPU)."""
    from .model import RandomLlama, model_shape

    sys.setswitchinterval(SWITCH_INTERVAL_S)  # the link threads must get the GIL back quickly
    dev = args[f"{role}_device"]
    if dev == "cpu":
        os.environ.setdefault("TRITON_INTERPRET", "1")
    else:
        torch.cuda.set_device(torch.device(dev))
    shape = model_shape(args["model"], args["layers"])
    model = RandomLlama(shape, torch.device(dev), seed=args["seed"], max_positions=args["max_total_tokens"] + 64)
    return Harness(model, _cfg(args), role=role)


def _cfg(args: dict) -> RunConfig:
    return RunConfig(
        method=args["method"],
        link_gbps=args["link_gbps"],
        kv_capacity_bytes=args["kv_capacity_bytes"],
        prefill_max_batch_requests=args["prefill_max_batch_requests"],
        prefill_max_batch_tokens=args["prefill_max_batch_tokens"],
        max_decode_batch=args["max_decode_batch"],
        max_total_tokens=args["max_total_tokens"],
        seed=args["seed"],
        decode_mode=args["decode_mode"],
        prefill_host_memory_bytes=args["prefill_host_memory_bytes"],
        time_limit_s=args["time_limit_s"],
        chunk_bytes=args["chunk_bytes"],
    )


def _prefill(args: dict, results, sync_q) -> dict:
    h = _engine(args, "prefill")
    model = h.model
    cuda = h.cuda
    meth = h.method
    if args["warmup"]:  # compile the prefill and encode kernels, prime cuDNN's plans, outside the run
        from .runner import prime_prefill_attention

        h.t0 = time.perf_counter()
        lo, hi = args["prompt_range"]
        for i, p in enumerate(sorted({lo, lo + 1, lo + 65, (lo + hi) // 2, hi})):
            h.prefill([_Req(Request(-1 - i, 0.0, p, 2))])
        if cuda:
            prime_prefill_attention(h, sorted({w[2] for w in args["workload"]}))
    sock = socket.create_connection(("127.0.0.1", args["port"]), timeout=120)
    sock.settimeout(None)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    lock = threading.Lock()
    results.put(("prefill_ready", None))
    t0 = sync_q.get(timeout=600)
    clock = lambda: time.perf_counter() - t0  # noqa: E731
    h.t0 = t0
    sender = Sender(sock, lock, args["link_gbps"], clock, cuda, args["chunk_bytes"])
    outs: dict[int, _Out] = {}

    def reader() -> None:
        """ADMIT frames go straight to the sender: a transfer starts while the prefill computes."""
        while True:
            fr = _recv_frame(sock)
            if fr is None:
                return
            if fr[0] == ADMIT:
                sender.admitted.put(outs[fr[1]])

    threading.Thread(target=reader, name="admits", daemon=True).start()
    stream = args["stream_layers"]
    work = [Request(*w) for w in args["workload"]]
    arrivals = collections.deque(sorted(work, key=lambda r: (r.arrival_s, r.request_id)))
    prefill_q: collections.deque[_Req] = collections.deque()
    reqs: dict[int, _Req] = {}
    parked = 0
    sent_done = 0

    def announce(r: _Req) -> None:
        foot = meth.footprint_bytes(r.req.prompt_tokens + r.req.output_tokens)
        body = json.dumps(
            {
                "prompt_tokens": r.req.prompt_tokens,
                "output_tokens": r.req.output_tokens,
                "arrival_s": r.req.arrival_s,
                "wire_bytes": r.wire,
                "payload_bytes": outs[r.req.request_id].total,
                "footprint_bytes": foot,
            }
        ).encode()
        with lock:
            sock.sendall(HEADER.pack(READY, r.req.request_id, 0, len(body)) + body)

    def send_token(r: _Req) -> None:
        with lock:
            sock.sendall(HEADER.pack(TOKEN, r.req.request_id, r.tok, 0))

    def payload(prompt_tokens: int) -> int:
        """The bytes that travel: every layer's ranges (the flat buffer's 16-byte padding stays home)."""
        layout = meth.wire_layout(prompt_tokens)
        return sum(n for layer in range(len(model.layers)) for _, n in layout.layer_ranges(layer))

    def layer_done(r: _Req, layer: int, layout) -> None:
        tr = outs[r.req.request_id]
        ev = None
        if cuda:
            ev = torch.cuda.Event()
            ev.record()
        for off, n in layout.layer_ranges(layer):
            tr.ranges.append((off, n, ev))
        if layer == len(model.layers) - 1:
            tr.announced_all = True

    def take_done() -> None:
        nonlocal parked, sent_done
        while True:
            try:
                rid, _ = sender.done.get_nowait()
            except queue.Empty:
                return
            parked -= reqs[rid].wire
            outs.pop(rid).src = None
            reqs[rid].send = None
            sent_done += 1

    t_limit = args["time_limit_s"]
    complete = True
    try:
        while sent_done < len(work):
            now = clock()
            if now > t_limit:
                complete = False
                break
            while arrivals and arrivals[0].arrival_s <= now:
                r = _Req(arrivals.popleft())
                reqs[r.req.request_id] = r
                prefill_q.append(r)
            take_done()
            head_wire = meth.wire_bytes(prefill_q[0].req.prompt_tokens) if prefill_q else 0
            if prefill_q and (parked == 0 or parked + head_wire <= args["prefill_host_memory_bytes"]):
                batch, tokens = [], 0
                while (
                    prefill_q
                    and len(batch) < args["prefill_max_batch_requests"]
                    and (not batch or tokens + prefill_q[0].req.prompt_tokens <= args["prefill_max_batch_tokens"])
                ):
                    b = prefill_q.popleft()
                    tokens += b.req.prompt_tokens
                    batch.append(b)
                if stream:
                    for b in batch:
                        b.wire = meth.wire_bytes(b.req.prompt_tokens)
                        outs[b.req.request_id] = _Out(b.req.request_id, None, total=payload(b.req.prompt_tokens))
                        parked += b.wire
                        announce(b)  # admitted (and sent) while the forward runs

                    def on_layer(r, layer, layout):
                        tr = outs[r.req.request_id]
                        tr.src = r.send
                        layer_done(r, layer, layout)

                    h.prefill(batch, layer_done=on_layer)
                    for b in batch:
                        send_token(b)
                else:
                    h.prefill(batch)
                    for b in batch:
                        b.wire = b.send.numel()
                        layout = meth.wire_layout(b.req.prompt_tokens)
                        tr = _Out(b.req.request_id, b.send, total=payload(b.req.prompt_tokens), announced_all=True)
                        for layer in range(len(model.layers)):
                            tr.ranges.extend((off, n, None) for off, n in layout.layer_ranges(layer))
                        outs[b.req.request_id] = tr
                        parked += b.wire
                        announce(b)
                        send_token(b)
                continue
            wait = (arrivals[0].arrival_s - clock()) if arrivals else 0.05
            time.sleep(max(1e-4, min(wait, 2e-3)))
        with lock:
            sock.sendall(HEADER.pack(END, 0, 0, 0))
    finally:
        sender.close()
        try:
            sock.shutdown(socket.SHUT_WR)
        except OSError:
            pass
    rows = {
        rid: {k: r.t.get(k) for k in ("prefill_start_s", "prefill_end_s", "quantize_end_s", "first_token_s")}
        for rid, r in reqs.items()
    }
    return {"requests": rows, "complete": complete}


# ---- the decode side ---------------------------------------------------------------------------
def decode_main(args: dict, results, port_q, sync_q) -> None:
    try:
        results.put(("decode", _decode(args, port_q, sync_q)))
    except Exception:
        results.put(("decode_error", traceback.format_exc()))


def _decode(args: dict, port_q, sync_q) -> dict:
    h = _engine(args, "decode")
    cfg = h.cfg
    if args["warmup"]:  # capture the step's graphs; compile kvcopy and the step once on dummy joins
        lo, hi = args["prompt_range"]
        h.step.capture_all(min_ctx=lo + 1, max_ctx=hi + args["output_range"][1])
        h.t0 = time.perf_counter()
        dummies = []
        for i, p in enumerate((lo, hi)):
            r = _Req(Request(-1 - i, 0.0, p, 2))
            r.recv, r.tok, r.generated = torch.zeros(h.method.wire_bytes(p), dtype=torch.uint8, device=h.device), 0, 1
            dummies.append(r)
        h.decode_iteration(dummies)
        h.slots.clear()
        h.host_issue.clear()
        h.moves.clear()
    cuda = h.cuda
    srv = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    srv.bind(("127.0.0.1", 0))
    srv.listen(1)
    port_q.put(srv.getsockname()[1])
    srv.settimeout(300)
    sock, _ = srv.accept()
    srv.close()
    sock.settimeout(None)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    t0 = sync_q.get(timeout=600)
    clock = lambda: time.perf_counter() - t0  # noqa: E731
    h.t0 = t0
    events: queue.Queue = queue.Queue()  # ("arrived", rid, t) | ("token", rid, tok) | ("end",)
    recv_bufs: dict[int, tuple] = {}  # rid -> (device buffer, [bytes received], bytes expected)
    stage = _staging(max(args["chunk_bytes"], 1 << 16), cuda)
    stream = torch.cuda.Stream() if cuda else None
    n_total = len(args["workload"])
    pending: collections.deque[_Req] = collections.deque()
    ready: collections.deque[_Req] = collections.deque()
    by_id: dict[int, _Req] = {}
    lock = threading.Lock()  # pending, used, recv_bufs, by_id and the socket's write side
    used = [0]

    def try_admit() -> None:
        """The simulator's router: strict FIFO, the head admitted as soon as its footprint fits (called
        with the lock held, when a request is announced and when one finishes)."""
        while pending and used[0] + pending[0].footprint <= cfg.kv_capacity_bytes:
            r = pending.popleft()
            used[0] += r.footprint
            recv_bufs[r.req.request_id] = (torch.empty(r.wire, dtype=torch.uint8, device=h.device), [0], r.payload)
            r.t["transfer_start_s"] = clock()
            sock.sendall(HEADER.pack(ADMIT, r.req.request_id, 0, 0))

    def receiver() -> None:
        view = memoryview(stage.numpy())
        while True:
            fr = _recv_frame(sock, view)
            if fr is None:
                events.put(("end",))
                return
            kind, rid, off, body = fr
            if kind == READY:
                info = json.loads(body)
                r = _Req(Request(rid, info["arrival_s"], info["prompt_tokens"], info["output_tokens"]))
                r.footprint, r.wire, r.tok, r.generated = info["footprint_bytes"], info["wire_bytes"], -1, 1
                r.payload = info["payload_bytes"]
                with lock:
                    by_id[rid] = r
                    pending.append(r)
                    try_admit()
            elif kind == END:
                events.put(("end",))
            elif kind == TOKEN:
                events.put(("token", rid, off))
            elif kind == DATA:
                with lock:
                    buf, got, want = recv_bufs[rid]
                n = body
                if cuda:
                    with torch.cuda.stream(stream):
                        buf[off : off + n].copy_(stage[:n], non_blocking=True)
                    stream.synchronize()
                else:
                    buf[off : off + n].copy_(stage[:n])
                got[0] += n
                if got[0] >= want:
                    events.put(("arrived", rid, clock()))

    threading.Thread(target=receiver, name="receiver", daemon=True).start()
    done: list[_Req] = []
    iterations = []
    complete = True

    def take_events(block_s: float = 0.0) -> None:
        while True:
            try:
                ev = events.get(timeout=block_s) if block_s > 0 else events.get_nowait()
            except queue.Empty:
                return
            block_s = 0.0
            if ev[0] == "arrived":
                with lock:
                    r = by_id[ev[1]]
                    r.recv = recv_bufs.pop(ev[1])[0]
                r.t["transfer_end_s"] = ev[2]
                if r.tok >= 0:
                    ready.append(r)
            elif ev[0] == "token":
                with lock:
                    r = by_id[ev[1]]
                r.tok = ev[2]
                if r.recv is not None:
                    ready.append(r)

    try:
        while len(done) < n_total:
            if clock() > args["time_limit_s"]:
                complete = False
                break
            take_events()
            finished = h.iterate(ready, iterations)
            if finished is not None:
                with lock:
                    for r in finished:
                        used[0] -= r.footprint
                        done.append(r)
                    try_admit()
                continue
            take_events(block_s=0.05)
    finally:
        try:
            sock.close()
        except OSError:
            pass
        h.close()
    with lock:
        rows = {
            rid: {k: r.t.get(k) for k in ("transfer_start_s", "transfer_end_s", "decode_start_s", "finish_s")}
            for rid, r in by_id.items()
        }
    return {
        "requests": rows,
        "iterations": iterations,
        "complete": complete,
        "host_issue_s": sum(x[0] for x in h.host_issue) / max(1, len(h.host_issue)),
    }


# ---- the launcher ------------------------------------------------------------------------------
def run_separate(
    model_name: str,
    layers: int | None,
    method: str,
    rate: float,
    link_gbps: float,
    n_requests: int,
    seed: int,
    kv_capacity_gib: float,
    out: Path,
    devices: tuple[str, str] = ("cuda:0", "cuda:1"),
    prompt_range=(1024, 8192),
    output_range=(16, 128),
    prefill_max_batch_requests: int = 1,
    prefill_max_batch_tokens: int = 16384,
    max_decode_batch: int = 32,
    decode_mode: str = "graphs",
    prefill_host_memory_gib: float = 64.0,
    stream_layers: bool = False,
    chunk_bytes: int = CHUNK_BYTES,
    time_limit_s: float = 600.0,
    warmup: bool = True,
    log=print,
) -> Path:
    """One trace of the separate placement: a prefill process on devices[0], a decode process on
    devices[1] (the same device twice runs both sides on one GPU: a dry run of the code path)."""
    from .runner import environment
    from .trace import write_trace
    from .workload import poisson_workload

    work = poisson_workload(n_requests, rate, seed, prompt_range, output_range)
    args = {
        "model": model_name,
        "layers": layers,
        "method": method,
        "link_gbps": link_gbps,
        "seed": seed,
        "kv_capacity_bytes": int(kv_capacity_gib * GIB),
        "prefill_max_batch_requests": prefill_max_batch_requests,
        "prefill_max_batch_tokens": prefill_max_batch_tokens,
        "max_decode_batch": max_decode_batch,
        "max_total_tokens": prompt_range[1] + output_range[1],
        "decode_mode": decode_mode,
        "prefill_host_memory_bytes": prefill_host_memory_gib * GIB,
        "time_limit_s": time_limit_s,
        "chunk_bytes": chunk_bytes,
        "stream_layers": stream_layers,
        "warmup": warmup,
        "prompt_range": tuple(prompt_range),
        "output_range": tuple(output_range),
        "prefill_device": devices[0],
        "decode_device": devices[1],
        "workload": [(w.request_id, w.arrival_s, w.prompt_tokens, w.output_tokens) for w in work],
    }
    ctx = mp.get_context("spawn")
    results, port_q, sync_dec, sync_pre = ctx.Queue(), ctx.Queue(), ctx.Queue(), ctx.Queue()
    dec = ctx.Process(target=decode_main, args=(args, results, port_q, sync_dec), name="decode")
    pre = None
    got: dict = {}
    try:
        dec.start()
        args = dict(args, port=port_q.get(timeout=900))  # the decode side listens: its warm-up is done
        pre = ctx.Process(target=prefill_main, args=(args, results, sync_pre), name="prefill")
        pre.start()
        started = False
        while len(got) < 2:
            kind, body = results.get(timeout=time_limit_s + 900)
            if kind.endswith("_error"):
                raise RuntimeError(f"the {kind[:-6]} process failed:\n{body}")
            if kind == "prefill_ready" and not started:
                t0 = time.perf_counter()  # one start time for both clocks (CLOCK_MONOTONIC)
                sync_dec.put(t0)
                sync_pre.put(t0)
                started = True
                continue
            got[kind] = body
    finally:
        for p in (pre, dec):
            if p is None or p.pid is None:
                continue
            p.join(timeout=30)
            if p.is_alive():
                p.terminate()
    nan = float("nan")
    rows = []
    for w in work:
        a = got["prefill"]["requests"].get(w.request_id, {})
        b = got["decode"]["requests"].get(w.request_id, {})
        t = {**{k: v for k, v in a.items() if v is not None}, **{k: v for k, v in b.items() if v is not None}}
        rows.append(
            (
                w.request_id,
                method,
                w.arrival_s,
                w.prompt_tokens,
                w.output_tokens,
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
    complete = got["prefill"]["complete"] and got["decode"]["complete"] and all(r[12] == r[12] for r in rows)
    env = environment()
    meta = {
        "method": method,
        "model": model_name,
        "layers": layers,
        "rate_rps": rate,
        "link_gbps": link_gbps,
        "seed": seed,
        "requests": n_requests,
        "kv_capacity_bytes": int(kv_capacity_gib * GIB),
        "prefill_max_batch_requests": prefill_max_batch_requests,
        "prefill_max_batch_tokens": prefill_max_batch_tokens,
        "prefill_host_memory_bytes": int(prefill_host_memory_gib * GIB),
        "max_decode_batch": max_decode_batch,
        "prompt_tokens": list(prompt_range),
        "output_tokens": list(output_range),
        "decode_mode": decode_mode,
        "placement": "separate",
        **env,
        "notes": "; ".join(
            [
                f"complete={complete}",
                f"two processes: prefill on {devices[0]}, decode on {devices[1]}"
                + (
                    " (the same device: a dry run of the code path, not the separate placement)"
                    if devices[0] == devices[1]
                    else ""
                ),
                f"KV over device -> pinned host -> TCP 127.0.0.1 -> pinned host -> device, paced at {link_gbps:g} "
                f"Gbps round robin in {chunk_bytes} B chunks" + (", streamed by layers" if stream_layers else ""),
                "decode admission: strict FIFO on the final KV footprint against kv_capacity_bytes; joins at the "
                "next iteration boundary; see realrun/separate.py",
                f"decode host issue (mean per iteration) {got['decode']['host_issue_s'] * 1e3:.3f} ms",
            ]
        ),
    }
    if layers is None:
        from .model import model_shape

        meta["layers"] = model_shape(model_name).layers
    write_trace(Path(out), rows, [tuple(it) for it in got["decode"]["iterations"]], meta)
    fin = [r for r in rows if r[12] == r[12]]
    log(
        f"separate {method} r{rate:g}: {len(fin)}/{n_requests} finished, mean JCT "
        f"{sum(r[12] - r[2] for r in fin) / max(1, len(fin)):.3f} s, {len(got['decode']['iterations'])} iterations "
        f"-> {out}"
    )
    return Path(out)
