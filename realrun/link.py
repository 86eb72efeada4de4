"""Emulated network link: GPU -> pinned host -> GPU, paced at R Gbps, fair share by round robin.

What is modelled: one link of rate R shared by every transfer in flight.  A background thread
serves the transfers in flight round robin, one chunk (default 4 MiB) at a time; each chunk is
copied device -> pinned host -> device on its own CUDA stream and is released by a pacer at the
link rate, so k concurrent transfers each progress at ≈ R/k (the fluid fair sharing the simulator
models) and a lone transfer of n bytes takes n·8/R seconds (plus at most one wake-up latency).
The D2H/H2D copies (PCIe, tens of GB/s) hide inside the pacing when R ≪ PCIe.

Pacer: a virtual wire clock.  When the link goes busy from idle the clock is set to now; every
chunk advances it by bytes·8/R; the thread sleeps until the clock before taking the next chunk.
A late wake-up (the GIL, the OS) does not lose link time while the link stays busy: the next
chunks are sent at once until the clock is ahead again (a token bucket that fills only while
busy), so only the last chunk's wake-up latency shows in a transfer's end time.
The main thread must not hold the GIL for long stretches: the harness lowers the interpreter's
switch interval (see harness.py).

The clock and the sleep are the caller's (`clock`, `sleep`): the harness passes the wall clock and
time.sleep; the tests pass a simulated clock whose sleep advances it, so the pacing is checked exactly
and does not depend on the machine's load (tests/realrun/test_link.py).  `start=False` leaves the
thread unstarted until `start()`: transfers submitted before it begin at one instant.
"""

from __future__ import annotations

import collections
import os
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

CHUNK_BYTES = 4 << 20


@dataclass
class Transfer:
    key: object
    src: torch.Tensor  # flat uint8 (device)
    dst: torch.Tensor  # flat uint8 (device), same size
    start_s: float = float("nan")
    end_s: float = float("nan")
    offset: int = field(default=0)


class Link:
    def __init__(
        self,
        gbps: float,
        clock: Callable[[], float],
        device: torch.device,
        chunk_bytes: int = CHUNK_BYTES,
        sleep: Callable[[float], None] = time.sleep,
        start: bool = True,
        cpu: int | None = None,
    ):
        if gbps <= 0:
            raise ValueError("link rate must be > 0 Gbps")
        self.bytes_per_s = gbps * 1e9 / 8
        self.clock = clock
        self.sleep = sleep
        self.device = device
        self.chunk = chunk_bytes
        self.cpu = cpu  # the one CPU the thread runs on (os.sched_setaffinity); None: wherever the OS puts it
        self.cuda = device.type == "cuda"
        self._in: queue.Queue = queue.Queue()
        self.done: queue.Queue = queue.Queue()
        self._stop = threading.Event()
        if self.cuda:
            self.stream = torch.cuda.Stream(device)
            try:
                self.staging = torch.empty(chunk_bytes, dtype=torch.uint8, pin_memory=True)
            except RuntimeError:  # pinning refused: pageable staging (copies then block the link thread only)
                self.staging = torch.empty(chunk_bytes, dtype=torch.uint8)
        else:
            self.stream = None
            self.staging = torch.empty(chunk_bytes, dtype=torch.uint8)
        self.thread = threading.Thread(target=self._run, name="link", daemon=True)
        if start:
            self.thread.start()

    def start(self) -> None:
        """Start serving (a link built with start=False)."""
        self.thread.start()

    def submit(self, tr: Transfer) -> None:
        if tr.src.numel() != tr.dst.numel():
            raise ValueError("src and dst sizes differ")
        tr.start_s = self.clock()
        self._in.put(tr)

    def close(self) -> None:
        self._stop.set()
        self._in.put(None)
        if self.thread.ident is not None:  # started
            self.thread.join(timeout=10)

    def _copy_chunk(self, tr: Transfer, n: int) -> None:
        a, b = tr.offset, tr.offset + n
        st = self.staging[:n]
        if self.cuda:
            with torch.cuda.stream(self.stream):
                st.copy_(tr.src[a:b], non_blocking=True)
                tr.dst[a:b].copy_(st, non_blocking=True)
            self.stream.synchronize()  # releases the GIL while it waits
        else:
            st.copy_(tr.src[a:b])
            tr.dst[a:b].copy_(st)
        tr.offset = b

    def _run(self) -> None:
        if self.cpu is not None:
            os.sched_setaffinity(0, {self.cpu})  # 0: this thread (Linux)
        active: collections.deque[Transfer] = collections.deque()
        wire_s = 0.0
        while not self._stop.is_set():
            # take new transfers (block only when idle)
            try:
                while True:
                    item = self._in.get(block=not active)
                    if item is None:
                        return
                    if not active:
                        wire_s = max(wire_s, self.clock())  # busy from idle: no saved-up credit
                    if item.src.numel() == 0:
                        item.end_s = item.start_s
                        self.done.put(item)
                        continue
                    active.append(item)
            except queue.Empty:
                pass
            if not active:
                continue
            tr = active.popleft()
            n = min(self.chunk, tr.src.numel() - tr.offset)
            self._copy_chunk(tr, n)
            wire_s += n / self.bytes_per_s
            delay = wire_s - self.clock()
            if delay > 0:
                self.sleep(delay)
            if tr.offset >= tr.src.numel():
                tr.end_s = self.clock()
                self.done.put(tr)
            else:
                active.append(tr)
