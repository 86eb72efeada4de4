"""A decode replica (or a colocated engine): continuous batching with memory admission, advanced in closed form.

Requests are admitted by the router, which reserves decode memory for them before the transfer starts: their
final KV (`decode.admission: reserve`, nothing is ever preempted) or the blocks of their first decode
iteration, later ones allocated as contexts grow (`on_demand`, simulator/admission.py; a step whose blocks do
not fit preempts). After its KV has arrived a request joins the batch at the next iteration boundary and takes
part in ``records.decode_iterations[rid]`` iterations, its context in the first being ``records.join_context[rid]``
(the scenario's ttft_at decides both: simulator/run.py); with ttft_at decode its first token is the end of that
first iteration. Where the replica prefills (a colocated engine's prompts, a preempted request's recompute),
vLLM's step scheduler (simulator/scheduler.py, `sched`) composes each step: it joins, preempts and takes
waiting requests at the boundary, and a step with prefill chunks is one iteration priced with them.

Between changes of batch membership every iteration costs ``fixed(B) + per_ctx * S_k`` where the
batch's total context grows by B each iteration (S_k = C + B·k at replica iteration k), so n
iterations take ``n·fixed + per_ctx·(n·C + B·(n·k + n(n-1)/2))``: one SimPy event per change of
membership, none per token.  An engine that issues iterations from the CPU makes each one last at
least host(B) (``IterationCost.host_s``); the host-bound iterations are the segment's first ones
(GPU time grows with the context), so the segment still has a closed form. Per-request decode/dequantize/
approximation times are the replica's running sums of those parts between the request's join and finish (a
snapshot at join; a preempted request's snapshots skip the iterations it sat out). The replica is a small state
machine driven by SimPy timeouts: a segment timer, replaced by an earlier one when a request
arrives mid-segment (it joins at the end of the iteration in progress).

A replica that goes down (simulator/faults.py) loses every request it holds (joined, waiting to
join, preempted, being prefilled, or reserved with its KV on the way) and its memory; it admits nothing
until it is back.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable
from typing import Protocol

import simpy

from costmodel.phases import ReplicaCostModel

from .columns import PREEMPTION, Records
from .step_price import Iteration, StepPrices, iteration_of
from .timers import Timer, loop, trait


@trait
class DecodeListener:
    """Who admits requests to decode replicas and holds their KV on the prefill side (the router)."""

    hold_kv: bool

    def release_kv(self, rid: int) -> None:
        raise NotImplementedError

    def on_memory_freed(self) -> None:
        raise NotImplementedError


@trait
class BlockAllocator:
    """On-demand KV blocks of the decode rows (simulator/admission.py), as the replica drives them."""

    bt: int  # tokens per block
    block_bytes: float
    counts: list[int]  # running requests by block phase

    @property
    def planned_bytes(self) -> float:
        raise NotImplementedError

    def free_blocks(self) -> int:
        raise NotImplementedError

    def newest(self) -> int:
        raise NotImplementedError

    def phase(self, rid: int) -> int:
        raise NotImplementedError

    def held_bytes(self, rid: int, k: int) -> float:
        raise NotImplementedError

    def remove(self, rid: int) -> tuple[int, int, int, int]:
        raise NotImplementedError

    def plan(self, k: int, n: int) -> None:
        raise NotImplementedError

    def segment_end(self, k: int) -> int:
        raise NotImplementedError

    def join(self, rid: int, k: int, context: int, finish_iter: int) -> None:
        raise NotImplementedError

    def allocate(self, k: int, n: int) -> None:
        raise NotImplementedError

    def leave(self, rid: int, fin: int) -> tuple[float, float] | None:
        raise NotImplementedError

    def clear(self) -> list[int]:
        raise NotImplementedError


@trait
class Steps:
    """vLLM's step scheduler on this replica (simulator/scheduler.py): preempted requests coming back, colocated
    prompts, transferred requests waiting to join, and each step's prefill chunks."""

    resumes: int
    step: list
    retry: bool

    @property
    def pending(self) -> bool:
        raise NotImplementedError

    def arrived(self, rid: int) -> None:
        raise NotImplementedError

    def compose(self, k: int) -> float:
        raise NotImplementedError

    def cost(self) -> Iteration:
        raise NotImplementedError

    def after_step(self) -> None:
        raise NotImplementedError

    def fail(self) -> tuple[list[int], list[int]]:
        raise NotImplementedError


@trait
class Cache:
    """The replica's prefix cache (simulator/prefix_cache.py), as the replica drives it."""

    def release(self, rid: int, computed_tokens: int, preempted: bool) -> None:
        raise NotImplementedError

    def trim(self, free_bytes: float) -> None:
        raise NotImplementedError

    def clear(self) -> None:
        raise NotImplementedError


class PrefillPartner(Protocol):
    """The prefill replica sharing this replica's GPU (placement: shared_gpu)."""

    def try_start(self) -> bool: ...


def transient_amplitude_s(prefill_s: float, saturation_s: float) -> float:
    """What decode.after_prefill_slowdown_fraction multiplies after a prefill of prefill_s seconds: the prefill's
    seconds, saturating at decode.after_prefill_saturation_s (saturation_s x (1 - exp(-prefill_s / saturation_s));
    0: no saturation). realrun.transient: after 0.2-0.9 s prefills the iterations run about as much longer as after
    0.07-0.1 s ones (realrun/traces/h200_transient/translong_*.csv)."""
    if saturation_s <= 0.0:
        return prefill_s
    return -saturation_s * math.expm1(-prefill_s / saturation_s)


def clock_share(prefill_s: float, tau_s: float) -> float:
    """The clock slowdown a prefill of prefill_s seconds leaves at its end, per unit of
    decode.after_prefill_clock_fraction: a first-order lag toward the capped level while the prefill runs,
    1 - exp(-prefill_s / tau) (prefill_s / tau for a short one; at most 1 for one much longer than tau)."""
    return -math.expm1(-prefill_s / tau_s)


def segment_sum_s(fixed_s: float, per_ctx_s: float, n: float, c: float, b: int, k: float) -> float:
    """Sum over iterations j = k .. k+n-1 of fixed + per_ctx * (c + b·j)."""
    return n * fixed_s + per_ctx_s * (n * c + b * (n * k + n * (n - 1) / 2))


def host_bound_count(cost: Iteration, n: float, c: float, b: int, k: int) -> float:
    """How many of iterations k .. k+n-1 wait on the host (GPU time below cost.host_s): the first
    ones, since the GPU time grows with the context.  n may be math.inf."""
    h = cost.host_s
    if h <= 0:
        return 0
    f, p = cost.fixed_s, cost.per_ctx_s
    if p * b <= 0:
        return n if f + p * c < h else 0
    first_gpu_bound = math.ceil((h - f - p * c) / (p * b))  # first j with GPU time >= host time
    return min(n, max(0, first_gpu_bound - k))


def segment_time_s(cost: Iteration, n: int, c: float, b: int, k: int) -> float:
    """Wall time of iterations k .. k+n-1: each max(fixed + per_ctx·S_j, host)."""
    if cost.host_s <= 0:  # no host floor (host_bound_count: none wait on the host)
        return segment_sum_s(cost.fixed_s, cost.per_ctx_s, n, c, b, k)
    nh = host_bound_count(cost, n, c, b, k)
    return nh * cost.host_s + segment_sum_s(cost.fixed_s, cost.per_ctx_s, n - nh, c, b, k + nh)


def _gpu_iterations_within(f: float, p: float, elapsed_s: float, c: float, b: int, k: int) -> int:
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


def iterations_within(cost: Iteration, elapsed_s: float, c: float, b: int, k: int) -> int:
    """Whole iterations, counted from iteration k, that finish within `elapsed_s`."""
    h = cost.host_s
    nh = host_bound_count(cost, math.inf, c, b, k)
    if nh > 0:
        done = int(elapsed_s / h * (1 + 1e-12))
        if done < nh:
            return done
        elapsed_s -= nh * h
        return int(nh) + _gpu_iterations_within(cost.fixed_s, cost.per_ctx_s, max(0.0, elapsed_s), c, b, k + int(nh))
    return _gpu_iterations_within(cost.fixed_s, cost.per_ctx_s, elapsed_s, c, b, k)


class DecodeReplica:
    def __init__(
        self,
        env: simpy.Environment,
        index: int,
        cost: ReplicaCostModel,
        max_batch_requests: int,
        records: Records,
        host_capacity_bytes: float = float("inf"),
        prefix_region_bytes: float = 0.0,
        blocks: Callable[[DecodeReplica], BlockAllocator] | None = None,
    ):
        self.env = env
        self.loop = loop(env)  # its clock and timers (simulator/timers.py)
        self.index = index
        self.cost = cost
        # a decode prefix cache (simulator/prefix_cache.py) takes its region out of the KV pool
        self.capacity_bytes = cost.kv_capacity_bytes - prefix_region_bytes
        self.max_batch_requests = max_batch_requests
        self.rec = records
        self.listener: DecodeListener | None = None  # set when the router is built
        self.reserved_bytes = 0.0
        self.host_capacity_bytes = host_capacity_bytes  # offloaded KV (PQCache, HCAttention)
        self.host_reserved_bytes = 0.0
        self.slots_used = 0  # admitted (reserved) requests, joined or not
        # decode.batch_slot_at join (realrun's rule): admission takes no batch slot; joins wait for one
        self.slots_at_join = False
        self.admit_slots: float = float(max_batch_requests)  # math.inf under batch_slot_at join
        self.memory_log = records.memory_log  # (time_s, replica, used_bytes)
        self.joining: list[int] = []  # KV arrived, waiting for the next boundary
        self.finish_heap: list[tuple[int, int]] = []  # (finish iteration, rid)
        self.iteration = 0  # replica iteration counter k
        self.batch = 0  # B
        self.ctx_offset = 0.0  # C = Σ (ctx_at_join - join_iteration)
        # calibration.implementation_factors.M.attention_padding_share: the attention pays that share of the padding to
        # the batch's longest context, B x (max offset + k) - S_k = B x max offset - C, the same over a segment; the
        # running rows' offsets (ctx_at_join - join_iteration) by rid and a max-heap of them (stale entries skipped)
        self.pad_share = cost.attention_padding_share
        self._offsets: dict[int, float] = {}
        self._offset_heap: list[tuple[float, int]] = []
        self.cum = [0.0, 0.0, 0.0, 0.0, 0.0]  # running decode, dequantize, approximation, fetch, preemption seconds
        self._seg: tuple | None = None  # running segment: (start_s, cost, iterations, on-arrival s)
        self._cut = False  # the segment was cut short for a joining request
        self._left = 0  # requests that left since the last segment started (decode.leave_s_per_request)
        self._version = 0  # timers of superseded segments are ignored
        self.on_arrival = cost.method.dequantize_on_arrival
        self.down = False  # a fault has taken the replica out
        self.partner: PrefillPartner | None = None  # the prefill replica sharing this GPU (placement: shared_gpu)
        self._paused = False  # the shared GPU is running a prefill batch
        self._prefill_waiting = False
        # decode.after_prefill_slowdown_fraction (shared_gpu): the iterations after a prefill run longer, in all by
        # fraction x the prefill's time (saturating at after_prefill_sat_s: transient_amplitude_s), the k-th by
        # (1 - decay) decay^(k-1) of it; the running segment's m-th iteration by _transient_s (1 - decay) decay^m,
        # its first m by _transient_s (1 - decay^m) (_after_s)
        self.after_prefill_fraction = 0.0
        self.after_prefill_decay = 0.0
        self.after_prefill_sat_s = 0.0
        self._transient_s = 0.0  # extra seconds still ahead from the last prefill, at the segment's start
        # decode.after_prefill_clock_fraction (shared_gpu): the power limit's lower clocks after the prefills slow the
        # GPU's part of each iteration by a fraction that every prefill of P s raises by clock_fraction x
        # (1 - exp(-P / tau)) (clock_share) and that fades in time with tau (clock_tau_s); the running segment's
        # m-th iteration takes _clock_s (1 - r) r^m more, r = exp(-its first iteration / tau) (its GPU time and
        # cadence taken as the first iteration's)
        self.clock_fraction = 0.0
        self.clock_tau_s = 1.0
        self._clock = 0.0  # the slowdown (fraction of the GPU time) at _clock_at_s
        self._clock_at_s = 0.0
        self._clock_s = 0.0  # the running segment's clock seconds, all its iterations to come (a geometric sum)
        self._clock_decay = 0.0  # r
        # decode.admission on_demand: KV blocks allocated as contexts grow, preemption (simulator/admission.py)
        self.blocks = blocks(self) if blocks is not None else None
        # vLLM's steps (simulator/scheduler.py): preempted requests back by recompute or swap, colocated prompts
        self.sched: Steps | None = None
        self.cache: Cache | None = None  # a prefix cache in the KV pool's free blocks (simulator/prefix_cache.py)
        # network.link_busy_host_factor: the host shares its process with a link endpoint (simulator/link.py,
        # EndpointHost); (idle, busy) cost models, the busy one's host terms taken while a transfer is in flight
        self.host_levels: tuple[ReplicaCostModel, ReplicaCostModel] | None = None
        self.link_busy = False
        # the decode iteration by batch size as an Iteration (simulator/step_price.py), per cost model (_iteration)
        self._iterations: dict[ReplicaCostModel, StepPrices] = {}

    # ---- admission (called by the router) ---------------------------------------------------
    def has_room(self, kv_bytes: float, host_bytes: float = 0.0) -> bool:
        if self.down:
            return False
        if self.blocks is not None:  # on demand: not into the running segment's blocks, nor before the preempted
            sched = self.sched
            if sched is not None and sched.resumes:
                return False
            kv_bytes += self.blocks.planned_bytes
        return (
            self.slots_used < self.admit_slots
            and self.reserved_bytes + kv_bytes <= self.capacity_bytes
            and self.host_reserved_bytes + host_bytes <= self.host_capacity_bytes
        )

    def reserve(self, kv_bytes: float, host_bytes: float = 0.0) -> None:
        self.reserved_bytes += kv_bytes
        self.host_reserved_bytes += host_bytes
        self.slots_used += 1
        if self.memory_log is not None:
            self.memory_log.add(self.loop.now, self.index, self.reserved_bytes)
        if self.cache is not None:
            self.cache.trim(self.capacity_bytes - self.reserved_bytes)

    def arrive(self, rid: int) -> None:
        """The request's KV is here; it joins at the next iteration boundary (with a step scheduler, as a
        waiting request of one token)."""
        if self.sched is not None:
            self.sched.arrived(rid)
            return
        self.joining.append(rid)
        self.wake()

    def wake(self) -> None:
        """Something new waits for the next iteration boundary: start one now if idle, else end the running
        segment with the iteration in progress."""
        if self._paused:
            return  # the shared GPU is running a prefill; we resume after it
        if self.slots_at_join and self.batch >= self.max_batch_requests:
            return  # no batch slot: the joiner waits for the next finish, which ends the segment anyway
        if self._seg is None:
            self._start_segment()
        elif not self._cut:
            self._cut_at_next_boundary()

    def trim_cache(self) -> None:
        """A prefix cache in the KV pool's free blocks keeps no more than the blocks requests leave free."""
        if self.cache is not None:
            self.cache.trim(self.capacity_bytes - self.reserved_bytes)

    def _cut_at_next_boundary(self) -> None:
        """End the running segment with the iteration in progress."""
        assert self._seg is not None  # called while a segment runs
        start_s, cost, n, pending_s = self._seg
        elapsed = self.loop.now - start_s
        c, b, k = self._priced_c(), self.batch, self.iteration
        if self._transient_s or self._clock_s:  # iterations end later by their after-prefill shares: count up
            done = iterations_within(cost, max(0.0, elapsed - pending_s - self._after_s(n)), c, b, k)
            while done < n and pending_s + segment_time_s(cost, done + 1, c, b, k) + self._after_s(done + 1) <= elapsed:
                done += 1
        else:
            done = iterations_within(cost, max(0.0, elapsed - pending_s), c, b, k)
        m = min(n, done + 1)
        boundary_s = pending_s + segment_time_s(cost, m, c, b, k)
        if self._transient_s or self._clock_s:
            boundary_s += self._after_s(m)
        self._seg = (start_s, cost, m, pending_s)
        self._cut = True
        self._schedule(max(0.0, start_s + boundary_s - self.loop.now))

    def fail(self) -> list[int]:
        """The replica goes down: returns the requests it was decoding or about to (their KV is lost).
        Requests reserved here whose KV is still on the way are the router's to collect."""
        arrived, held = self.sched.fail() if self.sched is not None else ([], [])
        lost = self.joining + arrived
        if self.blocks is None:
            lost += [rid for _, rid in self.finish_heap]
        else:  # on demand: the running requests
            lost += self.blocks.clear()
        lost = list(dict.fromkeys(lost + held))  # ... then those partly computed, ready or preempted
        self.joining.clear()
        self.finish_heap.clear()
        self.batch, self.ctx_offset, self.slots_used = 0, 0.0, 0
        self._offsets.clear()
        self._offset_heap.clear()
        self.reserved_bytes = self.host_reserved_bytes = 0.0
        self._seg, self._cut, self.down = None, False, True
        self._left = 0
        self._paused = self._prefill_waiting = False  # shared_gpu: the partner prefill went down with it
        self._transient_s = self._clock = self._clock_s = 0.0
        self._version += 1  # the running segment's timer is void
        if self.memory_log is not None:
            self.memory_log.add(self.loop.now, self.index, 0.0)
        return lost

    def recover(self) -> None:
        self.down = False

    def unreserve(self, rid: int, kv_bytes: float, host_bytes: float = 0.0) -> None:
        """A reservation whose KV will not arrive (its transfer was lost): its prefix-cache hits here go too."""
        self.reserved_bytes -= kv_bytes
        self.host_reserved_bytes -= host_bytes
        self.slots_used -= 1
        if self.cache is not None:
            self.cache.release(rid, 0, False)
        if self.memory_log is not None:
            self.memory_log.add(self.loop.now, self.index, self.reserved_bytes)

    # ---- a GPU shared with a prefill replica (placement: shared_gpu) ---------------------------
    @property
    def paused(self) -> bool:
        """The shared GPU is running the partner's prefill batch."""
        return self._paused

    def yield_gpu(self) -> bool:
        """The partner prefill asks for the GPU: True if it may start now; otherwise it gets the GPU at
        the end of the iteration in progress (prefill first at every boundary)."""
        if self._seg is None:
            self._paused = True
            return True
        self._prefill_waiting = True
        if not self._cut:
            self._cut_at_next_boundary()
        return False

    def resume_after_prefill(self, prefill_s: float) -> None:
        """The partner's prefill step (prefill_s from its start to its KV encoded) gave the GPU back."""
        self._paused = False
        if self.after_prefill_fraction:  # a later prefill restarts the transient (realrun.transient: no build-up)
            self._transient_s = self.after_prefill_fraction * transient_amplitude_s(prefill_s, self.after_prefill_sat_s)
        if self.clock_fraction:  # the prefills' clock slowdowns add, each fading from its end
            now, tau = self.loop.now, self.clock_tau_s
            self._clock = self._clock * math.exp(-(now - self._clock_at_s) / tau) + self.clock_fraction * clock_share(
                prefill_s, tau
            )
            self._clock_at_s = now
        sched = self.sched
        if self._seg is None and (self.batch or self.joining or (sched is not None and sched.pending)):
            self._start_segment()

    # ---- a host shared with a link endpoint (network.link_busy_host_factor) ----------------------
    def link_busy_changed(self, busy: bool) -> None:
        """A transfer to or from this replica's process started with none in flight (busy), or the last one ended:
        iterations from the next boundary on take that level's host terms (the one in progress keeps its own)."""
        self.link_busy = busy
        levels = self.host_levels
        if levels is not None and levels[0] is not levels[1] and self._seg is not None and not self._cut:
            self._cut_at_next_boundary()

    # ---- the batch ----------------------------------------------------------------------------
    def _schedule(self, delay_s: float) -> None:
        self._version += 1
        self.loop.set_in(_SegmentEnd(self, self._version), delay_s)

    def _on_timer(self, version: int) -> None:
        if version != self._version:
            return  # superseded by a cut
        assert self._seg is not None  # a live timer ends a running segment
        _, cost, n, _ = self._seg
        self._advance(n, cost)
        if self._transient_s or self._clock_s:  # the after-prefill time this segment took counts as decode time
            self.cum[0] += self._after_s(n)
            self._transient_s *= self.after_prefill_decay**n
            if self._transient_s < 1e-12:
                self._transient_s = 0.0
            self._clock_s = 0.0  # the next segment takes the clock's state at its start
        self._finish_due()
        if self.sched is not None:
            self.sched.after_step()
        if self._prefill_waiting:
            self._prefill_waiting = False
            self._seg = None
            self._paused = True
            assert self.partner is not None
            if self.partner.try_start():
                return  # the prefill runs; it resumes us when its batch ends
            self._paused = False
        self._start_segment()

    def _start_segment(self) -> None:
        levels = self.host_levels
        if levels is not None:  # the host terms of the link's state (a change cut the last segment here)
            self.cost = levels[1] if self.link_busy else levels[0]
        blocks, sched, k = self.blocks, self.sched, self.iteration
        stall_s = 0.0
        if sched is not None and (sched.pending or (blocks is not None and blocks.counts[k % blocks.bt])):
            # the step: decode rows' blocks (preempting), chunks, waiting requests
            before = self.reserved_bytes
            stall_s = sched.compose(k)
            if stall_s:
                self.cum[PREEMPTION] += stall_s  # everyone in the batch waits for the swap copies
            if self.memory_log is not None and self.reserved_bytes != before:
                self.memory_log.add(self.loop.now, self.index, self.reserved_bytes)
        wait = None
        if self.slots_at_join and len(self.joining) > self.max_batch_requests - self.batch:
            room = self.max_batch_requests - self.batch  # realrun: joins up to max_batch_requests running
            self.joining, wait = self.joining[:room], self.joining[room:]
        joined = self.joining  # _admit_joining gives the replica a fresh list
        # the work the last leavers left to this iteration, where requests stayed (none to move into their slots
        # otherwise)
        leave_s = 0.0
        if self._left and self.batch:
            leave_s = self.cost.leave_s_per_request * self._left
            if self.cost.kv_placement_bytes_per_s > 0:  # the KV moved into their slots (kv_placement_gb_per_s)
                leave_s += self._moves_s(self._left)
        self._left = 0
        pending_s = self._admit_joining() + stall_s
        if wait:
            self.joining = wait
        chunks = sched is not None and sched.step
        if not self.batch and not chunks:
            self._seg = None
            return
        if leave_s:
            pending_s += leave_s
            self.cum[0] += leave_s  # everyone in the batch waits for it: decode time
        cost = sched.cost() if chunks and sched is not None else self._iteration()
        c, b, now = self._priced_c(), self.batch, self.loop.now
        if self._clock:
            self._clock_segment(cost, now + pending_s, c, b, k)
        if joined and self.rec.ttft_at_decode:
            # the joiners' first token: the end of this segment's first iteration, which always runs whole
            # (a cut ends a segment at the end of the iteration in progress)
            first = now + pending_s + segment_time_s(cost, 1, c, b, k)
            if self._transient_s or self._clock_s:
                first += self._after_s(1)
            for rid in joined:
                self.rec.first_token[rid] = first
        if chunks or (sched is not None and sched.retry):
            n = 1  # a step with prefill chunks, or one after a preemption that others wait behind
            if blocks is not None:
                blocks.plan(k, 1)
        elif blocks is None:
            n = self.finish_heap[0][0] - k
        else:  # ... or the first iteration whose new KV blocks do not fit
            n = blocks.segment_end(k) - k
            blocks.plan(k, n)  # promised (admission.py)
        seg_s = pending_s + segment_time_s(cost, n, c, b, k)
        if self._transient_s or self._clock_s:  # a prefill on the shared GPU left the iterations after it slower
            seg_s += self._after_s(n)
        self._seg = (now, cost, n, pending_s)
        self._cut = False
        self._schedule(seg_s)

    # ---- requests the step scheduler hands over (simulator/scheduler.py) ----------------------------
    def join_ready(self, jobs: list) -> None:
        """Requests whose tokens finished computing here in the last step decode from iteration k: a
        colocated prompt (its last chunk yielded the first token) or a preempted request whose recompute
        yielded its next token. They hold the blocks of their computed tokens; their context at k is one more."""
        rec, k, now, cum = self.rec, self.iteration, self.loop.now, self.cum
        for job in jobs:
            rid = job.rid
            if job.first:
                rec.decode_join[rid] = now
                (
                    rec.snap_decode[rid],
                    rec.snap_dequant[rid],
                    rec.snap_approx[rid],
                    rec.snap_fetch[rid],
                    rec.snap_preempt[rid],
                ) = cum
            else:
                self._back(job)
            self._add_row(rid, k, job.target + 1, k + job.left)

    def rejoin(self, job, k: int, held: float) -> None:
        """A swapped request back at iteration k, its KV copied in (`held` bytes): it decodes as planned."""
        self._back(job)
        self._add_row(job.rid, k, job.target, k + job.left)

    def _back(self, job) -> None:
        """A preempted request is back: its time away is preemption, and the running sums of the iterations
        it sat out are not its own."""
        rec, rid = self.rec, job.rid
        rec.preempt_s[rid] += self.loop.now - job.t0
        snaps = (rec.snap_decode, rec.snap_dequant, rec.snap_approx, rec.snap_fetch, rec.snap_preempt)
        for i, (now_v, then_v) in enumerate(zip(self.cum, job.cum0)):
            snaps[i][rid] += now_v - then_v

    def _add_row(self, rid: int, k: int, context: int, finish: int) -> None:
        self.ctx_offset += context - k
        if self.pad_share:
            self._row_in(rid, context - k)
        self.batch += 1
        heapq.heappush(self.finish_heap, (finish, rid))
        if self.blocks is not None:
            self.blocks.join(rid, k, context, finish)

    def remove_row(self, rid: int, k: int, held: float) -> tuple[int, int]:
        """A decode row preempted at iteration k, holding `held` bytes: returns (its context at k, its
        iterations left from k)."""
        assert self.blocks is not None  # only on-demand admission preempts
        _, j, c, fin = self.blocks.remove(rid)
        self.batch -= 1
        self.ctx_offset -= c - j
        if self.pad_share:
            self._offsets.pop(rid, None)
        self.reserved_bytes -= held
        return c + k - j, fin - k

    def finish_job(self, job) -> None:
        """A preempted request whose recompute yielded its last token finishes without decoding again."""
        self._back(job)
        self._finished(job.rid, job.held)
        self._freed(job.held)

    def leave_without_decode(self, rid: int, held: float) -> None:
        """A colocated prompt whose first token was its only one leaves (Records.finish_without_decode)."""
        self.reserved_bytes -= held
        self.host_reserved_bytes -= self.rec.host_kv_bytes[rid]
        self.slots_used -= 1
        if self.cache is not None:
            self.cache.release(rid, self.rec.prompt[rid], False)
        self._freed(held)

    def _admit_joining(self) -> float:
        """Join the waiting requests; returns the work the next iteration carries for them: the engine's
        join time (decode.join_s_per_request each) and any on-arrival decoding."""
        if not self.joining:
            return 0.0
        rec, k = self.rec, self.iteration
        arrival_s = 0.0
        cost = self.cost
        join_s = cost.join_s_per_request * len(self.joining)
        if cost.kv_placement_bytes_per_s > 0:  # each one's KV copied into its slot (kv_placement_gb_per_s)
            for rid in self.joining:
                join_s += cost.placement_s(int(rec.join_context[rid]))
        now = self.loop.now
        blocks, heap = self.blocks, self.finish_heap
        for rid in self.joining:
            rec.decode_join[rid] = now
            (
                rec.snap_decode[rid],
                rec.snap_dequant[rid],
                rec.snap_approx[rid],
                rec.snap_fetch[rid],
                rec.snap_preempt[rid],
            ) = self.cum
            context, finish = int(rec.join_context[rid]), k + int(rec.decode_iterations[rid])
            self.ctx_offset += context - k
            if self.pad_share:
                self._row_in(rid, context - k)
            heapq.heappush(heap, (finish, rid))
            if blocks is not None:
                blocks.join(rid, k, context, finish)
            if self.on_arrival:
                arrival_s += self.cost.on_arrival_s(rec.prompt[rid])
        self.batch += len(self.joining)
        self.joining = []
        # CacheGen decompress-once: the first iteration also decodes the arrivals' KV to FP16;
        # everyone in the batch waits for it, so it counts as dequantization for all of them.
        self.cum[1] += arrival_s
        self.cum[0] += join_s  # likewise the engine's join work, as decode
        return arrival_s + join_s

    def _moves_s(self, left: int) -> float:
        """The KV copies after `left` requests left a batch that kept self.batch (kv_placement_gb_per_s): the
        engine refills each slot a leaver left below the new batch size with the last running request's KV
        (realrun.harness.place), in expectation left x batch / (batch + left) moves (the leavers' slots uniform
        among the batch's) of a request at the batch's mean context."""
        b = self.batch
        mean_ctx = (self.ctx_offset + b * self.iteration) / b
        return left * b / (b + left) * self.cost.placement_s(mean_ctx)

    def _row_in(self, rid: int, offset: float) -> None:
        self._offsets[rid] = offset
        heapq.heappush(self._offset_heap, (-offset, rid))

    def _priced_c(self) -> float:
        """C as the iterations are priced: with an attention padding share, C + share x (B x max offset - C) (the
        batch's longest context sets the attention's split grid: ReplicaCostModel.priced_context), else C."""
        if not self.pad_share or not self.batch:
            return self.ctx_offset
        heap, offsets = self._offset_heap, self._offsets
        while heap and offsets.get(heap[0][1]) != -heap[0][0]:  # left, or back since with another offset
            heapq.heappop(heap)
        longest = -heap[0][0] if heap else 0.0
        return self.ctx_offset + self.pad_share * (self.batch * longest - self.ctx_offset)

    def _iteration(self) -> Iteration:
        """The cost model's decode iteration at the batch's size, as an `Iteration`: from a table by batch size
        per cost model (the host levels' two) where the iteration depends on the batch size alone (the cost
        model's own `iteration`), else read from the cost model each time (a data-parallel engine's lock-step
        iteration depends on its group: simulator/data_parallel.py; a test's stand-in)."""
        cost = self.cost
        if type(cost) is not ReplicaCostModel:
            return iteration_of(cost.iteration(self.batch))
        prices = self._iterations.get(cost)
        if prices is None:
            prices = self._iterations[cost] = StepPrices(cost)
        return prices.iteration(self.batch)

    def _after_s(self, m: int) -> float:
        """The after-prefill seconds of the running segment's first m iterations (its callers skip it where none)."""
        return self._transient_s * (1.0 - self.after_prefill_decay**m) + self._clock_s * (1.0 - self._clock_decay**m)

    def _clock_segment(self, cost: Iteration, first_at_s: float, c: float, b: int, k: int) -> None:
        """The clock slowdown's seconds for the segment whose first iteration starts at first_at_s (after the
        segment's on-arrival work): the slowdown faded to then times that iteration's GPU time (none where the host
        bounds it), fading per iteration as that iteration's wall time over tau (the later iterations' own lengths
        and shares left out: about 1 % of the clock's seconds at the H200 scenarios' 5-15 ms iterations, against
        a trace's items, which take each iteration's own start: tests/test_after_prefill.py)."""
        tau = self.clock_tau_s
        s0 = self._clock * math.exp(-(first_at_s - self._clock_at_s) / tau)
        if s0 < 1e-9:  # faded: nothing more to count
            self._clock = self._clock_s = 0.0
            return
        self._clock, self._clock_at_s = s0, first_at_s
        gpu_s = cost.fixed_s + cost.per_ctx_s * (c + b * k)
        first_s = max(gpu_s, cost.host_s)
        gpu_s -= self.cost.host_serial_s_per_iteration  # the CPU's gap between iterations keeps its pace
        r = math.exp(-first_s / tau)
        self._clock_s = s0 * gpu_s / (1.0 - r) if gpu_s > 0 and gpu_s + 1e-15 >= cost.host_s else 0.0
        self._clock_decay = r

    def _advance(self, n: int, cost: Iteration) -> None:
        c, b, k = self._priced_c(), self.batch, self.iteration
        if self.rec.iteration_log is not None:  # off unless asked for: a row per iteration is not the hot path's
            seg = self._seg
            assert seg is not None  # a segment is advancing
            self.rec.iteration_log.append(
                (
                    seg[0],
                    seg[3],
                    n,
                    c,
                    b,
                    k,
                    cost,
                    self.cost.host_serial_s_per_iteration,
                    self._transient_s,
                    self.after_prefill_decay,
                    self._clock_s,
                    self._clock_decay,
                    c - self.ctx_offset,
                )
            )
        cum = self.cum
        ctx = n * c + b * (n * k + n * (n - 1) / 2)  # the iterations' contexts summed (segment_sum_s)
        cum[0] += n * cost.decode_fixed_s + cost.decode_per_ctx_s * ctx
        if cost.host_s:  # iterations waiting on the host: the wait counts as decode time
            cum[0] += segment_time_s(cost, n, c, b, k) - segment_sum_s(cost.fixed_s, cost.per_ctx_s, n, c, b, k)
        if cost.dequant_per_ctx_s or cost.dequant_fixed_s:
            cum[1] += n * cost.dequant_fixed_s + cost.dequant_per_ctx_s * ctx
        if cost.approx_fixed_s or cost.approx_per_ctx_s:
            cum[2] += n * cost.approx_fixed_s + cost.approx_per_ctx_s * ctx
        if cost.fetch_fixed_s or cost.fetch_per_ctx_s:
            cum[3] += n * cost.fetch_fixed_s + cost.fetch_per_ctx_s * ctx
        if self.blocks is not None:
            self.blocks.allocate(k + 1, n - 1)
            if self.memory_log is not None:
                self.memory_log.add(self.env._now, self.index, self.reserved_bytes)
            if self.cache is not None:
                self.trim_cache()
        self.iteration += n

    def _finish_due(self) -> None:
        rec = self.rec
        freed = 0.0
        heap = self.finish_heap
        blocks = self.blocks
        while heap and heap[0][0] <= self.iteration:
            fin, rid = heapq.heappop(heap)
            if blocks is not None:
                left = blocks.leave(rid, fin)
                if left is None:
                    continue  # the entry of a request preempted since
                ctx_term, held = left
            else:
                # Remove the request's context from C: its context at iteration k is ctx0 + (k - join).
                ctx_term = float(int(rec.join_context[rid] + rec.decode_iterations[rid]) - self.iteration)
                held = rec.kv_bytes[rid]
            self._finished(rid, held)
            self._left += 1
            self.ctx_offset -= ctx_term
            if self.pad_share:
                self._offsets.pop(rid, None)
            self.batch -= 1
            freed += held
        if freed:
            self._freed(freed)

    def _finished(self, rid: int, held: float) -> None:
        """A request's last token is out: its records, and its memory and slot go."""
        rec, cum = self.rec, self.cum
        rec.finish[rid] = self.loop.now
        rec.decode_s[rid] = cum[0] - rec.snap_decode[rid]
        rec.dequant_s[rid] = cum[1] - rec.snap_dequant[rid]
        rec.approx_decode[rid] = cum[2] - rec.snap_approx[rid]
        rec.fetch_s[rid] = cum[3] - rec.snap_fetch[rid]
        rec.preempt_s[rid] += cum[4] - rec.snap_preempt[rid]
        self.slots_used -= 1
        self.reserved_bytes -= held
        self.host_reserved_bytes -= rec.host_kv_bytes[rid]
        rec.completed += 1
        if self.cache is not None:
            self.cache.release(rid, rec.prompt[rid] + rec.output[rid], False)
        listener = self.listener
        assert listener is not None
        if listener.hold_kv:
            listener.release_kv(rid)

    def _freed(self, bytes_: float) -> None:
        if self.memory_log is not None:
            self.memory_log.add(self.loop.now, self.index, self.reserved_bytes)
        assert self.listener is not None
        self.listener.on_memory_freed()


def iteration_rows(log: list) -> list[tuple[float, float, int, float]]:
    """A decode replica's iterations as a measured trace records them (iterations.csv: start_s, end_s,
    batch_size, context_tokens) from its segment log (Records.iteration_log): iteration m of a segment
    starts after the segment's on-arrival work and m iterations (each with its after-prefill share, where a
    prefill on the shared GPU left one); a row ends before the CPU work between
    iterations (host_serial_s_per_iteration), which a trace's rows leave out."""
    rows = []
    for start_s, pending_s, n, c, b, k, cost, serial, after_s, decay, clock_s, clock_decay, pad in log:
        t = start_s
        for m in range(n):
            step = segment_time_s(cost, 1, c, b, k + m) + (pending_s if m == 0 else 0.0)
            if after_s:  # the m-th iteration's share of the after-prefill time
                step += after_s * (1.0 - decay) * decay**m
            if clock_s:  # ... and of the clock slowdown
                step += clock_s * (1.0 - clock_decay) * clock_decay**m
            rows.append((t, t + step - serial, b, c - pad + b * (k + m)))
            t += step
    return rows


class _SegmentEnd(Timer):
    """The end of the decode segment planned at `version` (void once a cut re-planned it)."""

    __slots__ = ("rep", "version")

    def __init__(self, rep: DecodeReplica, version: int):
        self.rep = rep
        self.version = version

    def fire(self) -> None:
        self.rep._on_timer(self.version)
