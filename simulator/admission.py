"""On-demand KV blocks of a replica's decode rows (`decode.admission: on_demand`, the default).

vLLM and SGLang do not reserve a request's final KV when they admit it: they allocate KV blocks of
`block_tokens` tokens as its context grows (vLLM: `KVCacheManager.allocate_slots` each step). A request is
admitted (by the router, before its transfer) with the blocks of its first decode iteration's context; a
request that joined at iteration j with context c in it holds ⌈(c + k − j)/block_tokens⌉ blocks at iteration
k, one more at each k ≡ j − c + 1 (mod block_tokens). With the running requests counted by that phase, the
iteration at which the next block would not fit is closed form (`first_block_shortage`), so a segment of
iterations ends at the next finish or that shortage, whichever is first: one event per batch change, none
per token. At that iteration the step scheduler (simulator/scheduler.py) preempts the newest running
requests until the blocks fit, as vLLM's scheduler does, and brings preempted requests back (by recompute,
through the prefix cache, or by swap).
"""

from __future__ import annotations

import heapq
import math
from types import FunctionType
from typing import TYPE_CHECKING, Final

from costmodel.memory import kv_blocks

from .decode import BlockAllocator

if TYPE_CHECKING:
    from .decode import DecodeReplica


def _probe() -> None:
    pass


_NATIVE: Final = not isinstance(_probe, FunctionType)  # compiled by mypyc (simulator/timers.py)


def first_block_shortage(phase_counts: list[int], k: int, free_blocks: int, block_tokens: int) -> float:
    """The first replica iteration >= k that needs more new KV blocks than `free_blocks` leaves, on-demand
    allocation (math.inf if the batch never needs one).

    `phase_counts[r]` counts the running requests that take a new block at the iterations congruent to r
    (mod block_tokens): each takes one every block_tokens iterations.  Every block_tokens iterations the
    batch takes exactly B = Σ counts blocks, so the (free + 1)-th block is wanted free // B whole cycles on,
    at the phase that brings the cumulative count within the last cycle past free % B: O(block_tokens),
    whatever the batch size."""
    b = sum(phase_counts)
    if b == 0:
        return math.inf
    cycles, left = divmod(free_blocks, b)
    for d in range(block_tokens):
        left -= phase_counts[(k + d) % block_tokens]
        if left < 0:
            return k + cycles * block_tokens + d
    raise AssertionError("unreachable: the counts of one cycle sum to the batch")


class OnDemandBlocks(BlockAllocator):
    def __init__(self, replica: DecodeReplica):
        cost = replica.cost
        self.rep = replica
        self.bt = cost.block_tokens
        self.block_bytes = cost.block_bytes
        self.reserve_bytes = cost.kv_memory_bytes(0)  # the method's fixed per-request buffer
        self.counts = [0] * self.bt  # running requests by block phase
        # rid -> (phase, join iteration, context at join, finish iteration), in join order (the newest last);
        # a finish-heap entry whose iteration differs is stale (the request was preempted since)
        self.running: dict[int, tuple[int, int, int, int]] = {}
        self._plan: tuple[int, int] = (0, 0)  # the running segment's later iterations, whose blocks it is promised
        self._planned: float | None = 0.0  # their bytes (None: not counted yet)

    def clear(self) -> list[int]:
        """The replica went down (simulator/faults.py): forget every request; returns the running ones."""
        lost = list(self.running)
        self.counts = [0] * self.bt
        self.running.clear()
        self._plan, self._planned = (0, 0), 0.0
        return lost

    def free_blocks(self) -> int:
        rep = self.rep
        return int((rep.capacity_bytes - rep.reserved_bytes) // self.block_bytes) if self.block_bytes > 0 else 2**62

    def newest(self) -> int:
        """The running request that joined last (vLLM preempts the tail of its running list)."""
        return next(reversed(self.running))

    def phase(self, rid: int) -> int:
        return self.running[rid][0]

    def remove(self, rid: int) -> tuple[int, int, int, int]:
        """A running request preempted: its (phase, join iteration, context at join, finish iteration)."""
        st = self.running.pop(rid)
        self.counts[st[0]] -= 1
        return st

    def held_bytes(self, rid: int, k: int) -> float:
        """Bytes the running request holds once iteration k's blocks are allocated."""
        _, j, c, _ = self.running[rid]
        return kv_blocks(c + k - j, self.bt) * self.block_bytes + self.reserve_bytes

    # ---- the batch --------------------------------------------------------------------------
    def join(self, rid: int, k: int, context: int, finish_iter: int) -> None:
        phase = (k - context + 1) % self.bt
        self.counts[phase] += 1
        self.running[rid] = (phase, k, context, finish_iter)

    def leave(self, rid: int, fin: int) -> tuple[float, float] | None:
        """A finish-heap entry is due: None if it is stale (the request was preempted), else the request's
        (context-offset term, bytes held) as it leaves."""
        st = self.running.get(rid)
        if st is None or st[3] != fin:
            return None
        del self.running[rid]
        phase, j, c, _ = st
        self.counts[phase] -= 1
        return c - j, -(-(c + fin - 1 - j) // self.bt) * self.block_bytes + self.reserve_bytes  # kv_blocks

    def segment_end(self, k: int) -> int:
        """The iteration that ends a segment starting at k: the next finish, or the first iteration after k
        whose new blocks do not fit if that comes first."""
        heap, running = self.rep.finish_heap, self.running
        while True:  # the next finish (stale entries dropped)
            fin, rid = heap[0]
            st = running.get(rid)
            if st is not None and st[3] == fin:
                break
            heapq.heappop(heap)
        if self.block_bytes <= 0:
            return fin
        rep = self.rep
        free = int((rep.capacity_bytes - rep.reserved_bytes) // self.block_bytes)
        if k + 1 + (free // len(running)) * self.bt >= fin:  # not even the whole cycles the free blocks give reach it
            return fin
        shortage = first_block_shortage(self.counts, k + 1, free, self.bt)  # an iteration, or math.inf: never
        return fin if shortage >= fin else int(shortage)

    def _new_blocks(self, k: int, n: int) -> int:
        """Blocks the running requests take over iterations k .. k+n-1."""
        if n <= 0:
            return 0
        bt = self.bt
        cycles, rest = divmod(n, bt)
        blocks = cycles * len(self.running)
        if rest:  # the phases start .. start+rest-1, wrapping past bt
            counts, start = self.counts, k % bt
            end = start + rest
            if not _NATIVE:  # as Python, sum's C loop over slices
                return blocks + sum(counts[start:end]) + (sum(counts[: end - bt]) if end > bt else 0)
            for i in range(start, min(end, bt)):  # compiled, a C loop (a slice is a new list, summed by name)
                blocks += counts[i]
            for i in range(end - bt):
                blocks += counts[i]
        return blocks

    def plan(self, k: int, n: int) -> None:
        """A segment of iterations k .. k+n-1 starts: the blocks it will take are promised to it (the router
        admits no request into them meanwhile); counted when first asked."""
        self._plan = (k + 1, n - 1)
        self._planned = None

    @property
    def planned_bytes(self) -> float:
        if self._planned is None:
            k, n = self._plan
            self._planned = self._new_blocks(k, n) * self.block_bytes
        return self._planned

    def allocate(self, k: int, n: int) -> None:
        """Iterations k .. k+n-1 ran (each fits, by `segment_end` and `plan`): their new blocks are taken."""
        if self._plan == (k, n):  # the segment ran as planned (not cut short)
            self.rep.reserved_bytes += self.planned_bytes
        else:
            self.rep.reserved_bytes += self._new_blocks(k, n) * self.block_bytes
        self._plan, self._planned = (0, 0), 0.0
