"""A decode replica: continuous batching with memory admission, advanced in closed form.

Requests are admitted by the router, which reserves their final KV footprint (prompt + output
tokens in the method's memory format, plus its per-request reserve) against `capacity_bytes`
before the transfer starts, so memory never exceeds capacity and nothing is preempted. After its
KV has arrived, a request joins the batch at the next iteration boundary.

Between changes of batch membership every iteration costs ``fixed(B) + per_ctx * S_k`` where the
batch's total context grows by B each iteration (S_k = C + B·k at replica iteration k), so n
iterations take ``n·fixed + per_ctx·(n·C + B·(n·k + n(n-1)/2))``: one SimPy event per change of
membership, none per token. Per-request decode/dequantize/approximation times are the replica's
running sums of those parts between the request's join and finish (a snapshot at join).
"""
from __future__ import annotations

import heapq
import math
from typing import TYPE_CHECKING

import simpy

from costmodel.phases import IterationCost, ReplicaCostModel

if TYPE_CHECKING:
    from .run import MethodRun


def segment_sum_s(fixed_s: float, per_ctx_s: float, n: int, c: float, b: int, k: int) -> float:
    """Sum over iterations j = k .. k+n-1 of fixed + per_ctx * (c + b·j)."""
    return n * fixed_s + per_ctx_s * (n * c + b * (n * k + n * (n - 1) / 2))


def iterations_within(cost: IterationCost, elapsed_s: float, c: float, b: int, k: int) -> int:
    """Whole iterations, counted from iteration k, that finish within `elapsed_s` (quadratic in n)."""
    f, p = cost.fixed_s, cost.per_ctx_s
    # n·(f + p·(c + b·k)) + p·b·n(n-1)/2 <= elapsed  ->  (p·b/2) n² + (f + p(c + b·k) - p·b/2) n - elapsed <= 0
    a2 = p * b / 2
    a1 = f + p * (c + b * k) - a2
    if a2 <= 0:
        n = int(elapsed_s / a1) if a1 > 0 else 0
    else:
        n = int((-a1 + math.sqrt(a1 * a1 + 4 * a2 * elapsed_s)) / (2 * a2))
    # Guard float error at the boundary.
    while n > 0 and segment_sum_s(f, p, n, c, b, k) > elapsed_s * (1 + 1e-12):
        n -= 1
    return n


class DecodeReplica:
    def __init__(self, env: simpy.Environment, index: int, cost: ReplicaCostModel, max_batch_requests: int,
                 run: "MethodRun", memory_log: list | None):
        self.env = env
        self.index = index
        self.cost = cost
        self.capacity_bytes = cost.kv_capacity_bytes
        self.max_batch_requests = max_batch_requests
        self.run = run
        self.reserved_bytes = 0.0
        self.slots_used = 0                  # admitted (reserved) requests, joined or not
        self.memory_log = memory_log         # (time_s, replica, used_bytes)
        self.joining: list[int] = []         # KV arrived, waiting for the next boundary
        self.finish_heap: list[tuple[int, int]] = []   # (finish iteration, rid)
        self.iteration = 0                   # replica iteration counter k
        self.batch = 0                       # B
        self.ctx_offset = 0.0                # C = Σ (ctx_at_join - join_iteration)
        self.cum = [0.0, 0.0, 0.0]           # running decode, dequantize, approximation seconds
        self._wake: simpy.Event = env.event()
        self._waiting = False
        env.process(self._loop())

    # ---- admission (called by the router) ---------------------------------------------------
    def has_room(self, kv_bytes: float) -> bool:
        return self.slots_used < self.max_batch_requests and self.reserved_bytes + kv_bytes <= self.capacity_bytes

    def reserve(self, kv_bytes: float) -> None:
        self.reserved_bytes += kv_bytes
        self.slots_used += 1
        if self.memory_log is not None:
            self.memory_log.append((self.env.now, self.index, self.reserved_bytes))

    def arrive(self, rid: int, _time_s: float | None = None) -> None:
        """The request's KV is here; it joins at the next iteration boundary."""
        self.joining.append(rid)
        if self._waiting and not self._wake.triggered:
            self._wake.succeed()

    # ---- the batch ----------------------------------------------------------------------------
    def _admit_joining(self) -> None:
        run, k = self.run, self.iteration
        arrival_s = 0.0
        for rid in self.joining:
            run.decode_join[rid] = self.env.now
            run.snap_decode[rid], run.snap_dequant[rid], run.snap_approx[rid] = self.cum
            ctx0 = int(run.prompt[rid]) + 1
            self.ctx_offset += ctx0 - k
            self.batch += 1
            heapq.heappush(self.finish_heap, (k + int(run.output[rid]) - 1, rid))
            arrival_s += self.cost.on_arrival_s(int(run.prompt[rid]))
        self.joining.clear()
        if arrival_s > 0:
            # CacheGen decompress-once: the first iteration also decodes the arrivals' KV to FP16;
            # everyone in the batch waits for it, so it counts as dequantization for all of them.
            self.cum[1] += arrival_s
            self._pending_s = arrival_s
        else:
            self._pending_s = 0.0

    def _advance(self, n: int, cost: IterationCost) -> None:
        c, b, k = self.ctx_offset, self.batch, self.iteration
        self.cum[0] += segment_sum_s(cost.decode_fixed_s, cost.decode_per_ctx_s, n, c, b, k)
        self.cum[1] += segment_sum_s(0.0, cost.dequant_per_ctx_s, n, c, b, k)
        self.cum[2] += segment_sum_s(cost.approx_fixed_s, cost.approx_per_ctx_s, n, c, b, k)
        self.iteration += n

    def _finish_due(self) -> None:
        run, now = self.run, self.env.now
        freed = 0.0
        while self.finish_heap and self.finish_heap[0][0] <= self.iteration:
            _, rid = heapq.heappop(self.finish_heap)
            run.finish[rid] = now
            run.decode_s[rid] = self.cum[0] - run.snap_decode[rid]
            run.dequant_s[rid] = self.cum[1] - run.snap_dequant[rid]
            run.approx_decode[rid] = self.cum[2] - run.snap_approx[rid]
            ctx_final = int(run.prompt[rid]) + int(run.output[rid])
            # Remove the request's context from C: its context at iteration k is ctx0 + (k - join).
            self.ctx_offset -= ctx_final - self.iteration
            self.batch -= 1
            self.slots_used -= 1
            self.reserved_bytes -= run.kv_bytes[rid]
            freed += run.kv_bytes[rid]
            run.completed += 1
        if freed:
            if self.memory_log is not None:
                self.memory_log.append((now, self.index, self.reserved_bytes))
            run.router.on_memory_freed()

    def _loop(self):
        env = self.env
        while True:
            if not self.batch and not self.joining:
                self._waiting = True
                self._wake = env.event()
                yield self._wake
                self._waiting = False
            self._admit_joining()
            cost = self.cost.iteration(self.batch)
            n = self.finish_heap[0][0] - self.iteration
            seg_s = self._pending_s + segment_sum_s(cost.fixed_s, cost.per_ctx_s, n, self.ctx_offset, self.batch,
                                                    self.iteration)
            start = env.now
            self._waiting = True
            self._wake = env.event()
            yield env.timeout(seg_s) | self._wake
            self._waiting = False
            elapsed = env.now - start
            if elapsed < seg_s and self.joining:
                # A request arrived mid-segment: run to the end of the iteration in progress.
                done = iterations_within(cost, max(0.0, elapsed - self._pending_s), self.ctx_offset, self.batch,
                                         self.iteration)
                n = min(n, done + 1)
                boundary_s = self._pending_s + segment_sum_s(cost.fixed_s, cost.per_ctx_s, n, self.ctx_offset,
                                                             self.batch, self.iteration)
                if boundary_s > elapsed:
                    yield env.timeout(boundary_s - elapsed)
            self._advance(n, cost)
            self._finish_due()
