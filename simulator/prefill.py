"""A prefill replica: vLLM's step scheduler on a prefill-only instance, pipelined stages, quantization after
the forward pass.

A small state machine driven by SimPy timeouts (no process per request). Each step follows vLLM v1's scheduler
(simulator/scheduler.py gives the rules and the source): prompts being prefilled in chunks continue first,
then queued prompts in arrival order while fewer than `max_batch_requests` run, each getting min(tokens left,
`chunk_tokens`, budget left) of the step's `max_batch_tokens` (a prompt's cached prefix is not computed and
does not count). Without `chunk_tokens` (chunked prefill off) prompts are never split: a step takes whole
prompts while they fit and a longer one runs alone. A prefill instance's prompts do not decode here (their
first token is sampled and the request leaves with its KV), so nothing is preempted: its KV pool holds the
prompts being prefilled, and the prefix cache the rest. A step is one forward pass over its chunks
(`ReplicaCostModel.prefill` with each chunk's earlier tokens as already there).

The replica is busy for the bottleneck stage plus the encode (quantize / entropy-code) step; the prompts a
step completes have their first tokens `latency_s` after it starts (all pipeline stages) and their KV after
the encode. KV waiting for a decode replica is held where `network.kv_connector` keeps it (simulator/connectors.py)
from the prompt's first step: in this replica's host memory (host_parked) or its GPU KV pool (nixl_pull); when
that is full no new prompt starts (back-pressure), and the wait counts as prefill queueing. Under p2p_push
nothing is held, but no step starts while KV of the earlier ones is being pushed.

A replica that goes down (simulator/faults.py) loses the prompts it is prefilling and the KV parked in its
host memory; its queue is handed back to the router; timers of the lost steps are ignored through a version
counter.
"""

from __future__ import annotations

import math
from collections import deque
from typing import TYPE_CHECKING, Final, Protocol

import simpy

from costmodel.phases import ReplicaCostModel

from .columns import Records
from .step_price import Prefill, PrefillPrices, prefill_of
from .timers import Timer, loop, trait

if TYPE_CHECKING:
    from librt.vecs import vec  # pyright: ignore[reportMissingImports]

    from .link import EndpointHost
    from .prefix_cache import PrefixCaching


@trait
class PrefillListener:
    """Who takes a batch's KV on (the router)."""

    def on_prefill_started(self, batch: list[int], replica: PrefillReplica, start_s: float, ready_s: float) -> None:
        raise NotImplementedError

    def on_kv_ready(self, batch: list[int], replica: PrefillReplica) -> None:
        raise NotImplementedError


class GPUSharer(Protocol):
    """The decode replica sharing this replica's GPU (placement: shared_gpu)."""

    @property
    def paused(self) -> bool: ...

    def yield_gpu(self) -> bool: ...

    def resume_after_prefill(self, prefill_s: float) -> None: ...


class PrefillReplica:
    def __init__(
        self,
        env: simpy.Environment,
        index: int,
        cost: ReplicaCostModel,
        max_batch_requests: int,
        max_batch_tokens: int,
        host_memory_bytes: float,
        records: Records,
        prefix: PrefixCaching | None,
        chunk_tokens: int | None,
        held_bytes: vec[float] | None = None,
        kv_in_pool: bool = False,
        wait_for_push: bool = False,
    ):
        self.env = env
        self.loop = loop(env)  # its clock and timers (simulator/timers.py)
        self.index = index
        self.cost = cost
        self.max_batch_requests = max_batch_requests
        self.max_batch_tokens = max_batch_tokens
        self.host_memory_bytes = host_memory_bytes
        self.rec = records
        self.prefix = prefix
        self.listener: PrefillListener | None = None  # set when the router is built
        self.queue: deque[int] = deque()
        self.outstanding_tokens = 0  # queued + in service: the router's load measure
        self.parked_bytes = 0.0  # KV in host memory waiting for / in transfer
        self._idle = True
        self.down = False  # a fault has taken the replica out
        self.running: list[list[int]] = []  # steps started whose KV is not encoded yet
        self._version = 0
        self.partner: GPUSharer | None = None  # the decode replica sharing this GPU (placement: shared_gpu)
        self._step_s = 0.0  # the last step's start to its KV encoded (the shared GPU's prefill, as a trace times it)
        self.busy_s = 0.0  # Σ time a step held the replica (its load, simulator/overload.py)
        self.chunk_tokens = chunk_tokens  # None: chunked prefill off
        self.partial: list[list[int]] = []  # chunked prefill: [rid, tokens done] of the prompts being prefilled
        self.inflight_bytes = 0.0  # KV pool bytes of the prompts being prefilled (the rest can cache prefixes)
        self.pool_cache = prefix is not None and bool(prefix.prefill) and prefix.in_pool["prefill"]
        # Where a prompt's KV waits for its decode replica (simulator/connectors.py): `held_bytes[rid]` it holds
        # from its first step against `host_memory_bytes` (host_parked: its wire bytes in host memory; nixl_pull:
        # its blocks in this GPU's KV pool, `kv_in_pool`), or (p2p_push, `wait_for_push`) nothing is held and a
        # step waits until the KV pushed by the earlier ones has left
        self.held_bytes = records.wire_bytes if held_bytes is None else held_bytes
        self.kv_in_pool = kv_in_pool
        self.wait_for_push = wait_for_push
        self.pushing = 0  # p2p_push: requests whose KV is being pushed
        # network.link_busy_host_factor: the host shares its process with a link endpoint (simulator/link.py,
        # EndpointHost); (idle, busy) cost models: a step started while a transfer is in flight takes the busy
        # one's host floors (prefill and quantize)
        self.host_levels: tuple[ReplicaCostModel, ReplicaCostModel] | None = None
        self.link_busy = False
        self.endpoint: EndpointHost | None = None  # its process, with the transfers in flight
        self._prices: dict[ReplicaCostModel, PrefillPrices] = {}  # one-prompt batches' prices (_one_prompt_prices)
        # the token counts of the batches its process has run (cost.host_first_seen_s_per_iteration: a batch of a
        # count not run before pays it; a recovered replica is a new process)
        self.seen_tokens: set[int] = set()

    def enqueue(self, rid: int) -> None:
        """Queue a request; the caller kicks the replica once every same-instant arrival is queued."""
        self.queue.append(rid)
        self.outstanding_tokens += self.rec.prompt[rid]

    def kick(self) -> None:
        if self._idle:
            self.try_start()

    def release_parked(self, rid: int) -> None:
        """The request's KV has left (or is no longer kept): what it held here is free."""
        if self.wait_for_push:
            self.pushing -= 1
            if self._idle and not self.pushing and (self.queue or self.partial):
                self.try_start()
            return
        self.parked_bytes -= self.held_bytes[rid]
        if self._idle and self.queue:
            self.try_start()

    def _take_batch(self) -> tuple[list[int], tuple[int, ...] | None]:
        """Chunked prefill off: the step's whole prompts, in order, while they fit max_batch_tokens (a longer
        one alone) and max_batch_requests; with their cached tokens (None: no prefix cache)."""
        prompt, i = self.rec.prompt, self.index
        prefix = self.prefix if self.prefix is not None and self.prefix.prefill else None
        rid = self.queue.popleft()
        batch = [rid]
        cached = [prefix.prefill_begin(i, rid)] if prefix is not None else None
        tokens = prompt[rid] - (cached[0] if cached else 0)
        while self.queue and len(batch) < self.max_batch_requests:
            nxt = self.queue[0]
            new = prompt[nxt] - (prefix.prefill_peek(i, nxt) if prefix is not None else 0)
            if tokens + new > self.max_batch_tokens:
                break
            self.queue.popleft()
            batch.append(nxt)
            if cached is not None and prefix is not None:
                cached.append(prefix.prefill_begin(i, nxt))
            tokens += new
        return batch, None if cached is None else tuple(cached)

    def _take_chunks(self, chunk_tokens: int) -> list[list[int]]:
        """Chunked prefill: the step's chunks, [rid, tokens done, new tokens]: the prompts being prefilled
        first, then queued ones while budget is left and fewer than max_batch_requests run."""
        prompt, prefix, i = self.rec.prompt, self.prefix, self.index
        budget = self.max_batch_tokens
        step = []
        for part in self.partial:
            if budget <= 0:
                break
            n = min(prompt[part[0]] - part[1], chunk_tokens, budget)
            step.append([part[0], part[1], n])
            budget -= n
        while self.queue and budget > 0 and len(self.partial) < self.max_batch_requests:
            rid = self.queue[0]
            if step and not self._host_room(rid):
                break
            self.queue.popleft()
            done = prefix.prefill_begin(i, rid) if prefix is not None else 0
            n = min(prompt[rid] - done, chunk_tokens, budget)
            self.partial.append([rid, done])
            self._begin(rid)
            step.append([rid, done, n])
            budget -= n
        return step

    def _host_room(self, rid: int) -> bool:
        """Back-pressure: a new prompt's KV must fit in host memory (nixl_pull: the KV pool) beside the KV held
        there (p2p_push holds none: `wait_for_push` gates the steps instead)."""
        if self.wait_for_push:
            return True
        return self.parked_bytes == 0 or self.parked_bytes + self.held_bytes[rid] <= self.host_memory_bytes

    def hold_pushed(self, rid: int) -> None:
        """p2p_push: the request's KV is being pushed; the next step waits until it has left (vLLM's
        wait_for_save)."""
        self.rec.kv_held[rid] = True
        self.pushing += 1

    def _pool_free_bytes(self) -> float:
        """KV pool bytes the prefix cache may keep: the prompts being prefilled hold theirs, and under nixl_pull
        so do the prefilled prompts whose KV the decode has not read yet."""
        return self.cost.kv_capacity_bytes - (self.parked_bytes if self.kv_in_pool else self.inflight_bytes)

    def _begin(self, rid: int) -> None:
        """A prompt's first step: its KV will be parked in host memory, and its GPU blocks are taken."""
        rec = self.rec
        rec.prefill_replica[rid] = self.index
        rec.prefill_start[rid] = self.loop.now
        rec.approx_prefill[rid] = 0.0
        if not self.wait_for_push:
            rec.kv_held[rid] = True
            self.parked_bytes += self.held_bytes[rid]
        if self.pool_cache:
            self.inflight_bytes += self.cost.kv_memory_bytes(rec.prompt[rid])

    def try_start(self) -> bool:
        """Start the next step if there is work and the GPU is ours; True if it started."""
        rec, prefix = self.rec, self.prefix
        if not (self.queue or self.partial) or self.down:
            self._idle = True
            return False
        # Back-pressure: a new prompt's KV must fit in host memory if no decode replica takes it.
        if not self.partial and not self._host_room(self.queue[0]):
            self._idle = True
            return False
        if self.pushing:  # p2p_push: the earlier steps' KV is still leaving
            self._idle = True
            return False
        if self.partner is not None and not self.partner.paused and not self.partner.yield_gpu():
            self._idle = True  # the decode partner hands the GPU over at its next boundary
            return False
        self._idle = False
        start = self.loop.now
        levels = self.host_levels
        if levels is not None:  # the host floors of the link's state now
            self.cost = levels[1] if self.link_busy else levels[0]
        if self.chunk_tokens is None:
            batch, cached = self._take_batch()
            for rid in batch:
                self._begin(rid)
            prompts = tuple([rec.prompt[r] for r in batch])
        else:
            step = self._take_chunks(self.chunk_tokens)
            prompts, cached = tuple(d + n for _, d, n in step), tuple(d for _, d, _ in step)
        if cached is None and len(prompts) == 1 and type(self.cost) is ReplicaCostModel:  # its price by length
            cost = self._one_prompt_prices().one_prompt(prompts[0])
        else:
            cost = prefill_of(self.cost.prefill(prompts, cached))
        first = self._first_seen(prompts, cached)
        if first:
            cost = _with_first_seen(self.cost, cost, len(prompts))
        forms = cost.forms
        latency_s, encode_s, busy_s = cost.latency_s, cost.encode_s, cost.stage_s + cost.encode_s
        if levels is not None and self.link_busy and self.endpoint is not None:
            idle = prefill_of(levels[0].prefill(prompts, cached))
            if first:
                idle = _with_first_seen(levels[0], idle, len(prompts))
            latency_s, encode_s, busy_s = self._busy_part(idle, cost)
        # the CPU's work after the step while the GPU waits (prefill.host_serial_s_per_iteration, at the level of the
        # step's start): the replica, and on a shared GPU the decode, wait for it; the KV is encoded before it
        busy_s += self.cost.host_serial_s_per_iteration
        if self.chunk_tokens is None:
            done = batch
        else:
            batch, done = [], []
            for (rid, d, n), form in zip(step, forms):
                batch.append(rid)
                rec.approx_prefill[rid] += cost.approximation_s
                if d + n == rec.prompt[rid]:
                    done.append(rid)
                    rec.prefill_form[rid] = form
            for part in self.partial:
                for rid, d, n in step:
                    if part[0] == rid:
                        part[1] = d + n
            self.partial = [p for p in self.partial if p[1] < rec.prompt[p[0]]]
        if self.pool_cache:
            assert prefix is not None
            prefix.prefill_trim(self.index, self._pool_free_bytes())
        prefill_end = start + latency_s
        encode_end = prefill_end + encode_s
        if self.chunk_tokens is None:
            for rid, form in zip(batch, forms):
                rec.prefill_form[rid] = form
                rec.approx_prefill[rid] = cost.approximation_s
        for rid in done:
            rec.prefill_end[rid] = prefill_end
            rec.encode_end[rid] = encode_end
        self.running.append(batch)
        assert self.listener is not None
        if done:
            self.listener.on_prefill_started(done, self, start, encode_end)
        self.busy_s += busy_s
        self._step_s = encode_end - start
        self._set_timers(busy_s, self._step_s, self._version, batch, done)
        return True

    def _one_prompt_prices(self) -> PrefillPrices:
        """The replica's cost model's one-prompt batches from its table by length (simulator/step_price.py), per cost
        model (the host levels' two)."""
        prices = self._prices.get(self.cost)
        if prices is None:
            prices = self._prices[self.cost] = PrefillPrices(self.cost)
        return prices

    def _first_seen(self, prompts: tuple[int, ...], cached: tuple[int, ...] | None) -> bool:
        """Whether the step pays cost.host_first_seen_s_per_iteration: its process has not run a batch of this many
        new tokens before (the count is remembered)."""
        if not self.cost.host_first_seen_s_per_iteration:
            return False
        tokens = sum(prompts) - (sum(cached) if cached else 0)
        if tokens in self.seen_tokens:
            return False
        self.seen_tokens.add(tokens)
        return True

    def _busy_part(self, idle: Prefill, busy: Prefill) -> tuple[float, float, float]:
        """A step that starts while transfers are in flight runs at the busy level until the last of them arrives
        (`EndpointHost.busy_left_s`: one prefill at a time in a process, and no transfer of its own starts before
        its KV is encoded) and at the idle level after. A part of the step (the forward pass, then the encode) that
        takes x_b seconds at the busy level and x_i at the idle one, starting with R seconds of the busy part left,
        takes x_b if R >= x_b, else R + (1 - R / x_b) x_i: its work done at the busy pace for R, the rest at the
        idle one. Transfers that start during the step (from another process into a shared_gpu pair) leave it
        as it is. Returns (latency, encode, busy) seconds."""
        assert self.endpoint is not None
        left_s = self.endpoint.busy_left_s()

        def part(r: float, x_b: float, x_i: float) -> float:
            return x_b if r >= x_b else r + (1.0 - r / x_b) * x_i

        lat = part(left_s, busy.latency_s, idle.latency_s)
        enc = part(max(left_s - lat, 0.0), busy.encode_s, idle.encode_s)
        stage = part(left_s, busy.stage_s, idle.stage_s)
        return lat, enc, stage + part(max(left_s - stage, 0.0), busy.encode_s, idle.encode_s)

    def _set_timers(self, busy_s: float, encoded_s: float, v: int, batch: list[int], done: list[int]) -> None:
        """A step's timers: its KV encoded after `encoded_s`, the replica free after `busy_s` (one timer where
        they coincide)."""
        lp = self.loop
        if busy_s == encoded_s:  # one stage: the step is done when the replica is free
            lp.set_in(_StepTimer(self, _STEP_END, v, batch, done), busy_s)
        else:
            lp.set_in(_StepTimer(self, _ENCODED, v, batch, done), encoded_s)
            lp.set_in(_StepTimer(self, _FREE, v, batch, done), busy_s)

    def link_busy_changed(self, busy: bool) -> None:
        """A transfer to or from this replica's process started with none in flight (busy), or the last one ended:
        the next step takes that level's host floors (a step in progress keeps its own)."""
        self.link_busy = busy

    def fail(self) -> tuple[list[int], list[int]]:
        """The replica goes down: returns (requests whose prefill had started, requests still queued)."""
        lost = list(dict.fromkeys([r for b in self.running for r in b] + [p[0] for p in self.partial]))
        queued = list(self.queue)
        self.queue.clear()
        self.running.clear()
        self.partial.clear()
        self.outstanding_tokens = 0
        self.parked_bytes = 0.0  # the host's memory, and every KV parked in it, is gone
        self.pushing = 0
        self.inflight_bytes = 0.0
        self.down, self._idle = True, True
        self._version += 1
        return lost, queued

    def recover(self) -> None:
        self.down = False
        self.seen_tokens.clear()  # a new process: its library caches are empty
        self.try_start()

    def _next(self) -> None:
        if self.partner is not None:
            self.partner.resume_after_prefill(self._step_s)
        self.try_start()

    # a step's timers (version: the replica's when the step started; a fault since voids them)
    def _step_end(self, version: int, batch: list[int], done: list[int]) -> None:
        if version == self._version:
            self._done(batch, done)
            self._next()

    def _encoded(self, version: int, batch: list[int], done: list[int]) -> None:
        if version == self._version:
            self._done(batch, done)

    def _free(self, version: int) -> None:
        if version == self._version:
            self._next()

    def _done(self, batch: list[int], done: list[int]) -> None:
        """A step's KV is encoded: the prompts it completed go on (their KV leaves the GPU for host memory)."""
        self.running.remove(batch)
        rec = self.rec
        for rid in done:
            self.outstanding_tokens -= rec.prompt[rid]
            if self.pool_cache:
                self.inflight_bytes -= self.cost.kv_memory_bytes(rec.prompt[rid])
            if self.prefix is not None:
                self.prefix.prefill_end(self.index, rid, self._pool_free_bytes())
        if done:
            assert self.listener is not None
            self.listener.on_kv_ready(done, self)


_STEP_END: Final = 0
_ENCODED: Final = 1
_FREE: Final = 2


def _with_first_seen(model: ReplicaCostModel, c: Prefill, requests: int) -> Prefill:
    """A batch of a token count its process has not run: the CPU's first-seen time F (the GEMMs' kernel choice for a
    new row count) on the host floor, and where the GPU's work T is the longer, exp(-T / fade) of it on that too:
    max(T + F exp(-T / fade), floor + F), as calibrate.predict prices it. The choices stall the CPU between launches
    while the GPU has little queued, so a short batch shows most of F and one whose kernels run long hides it
    (realrun's first runs of 1-4K-token prompts are no slower than the repeats); fade 0: on the floor only."""
    first_s = model.host_first_seen_s_per_iteration
    floor_s = model.prefill_host_s(requests) + first_s
    fade_s = model.host_first_seen_fade_s
    # c.latency_s is max(T, floor): where the floor is the longer, T + F exp(-T / fade) stays under floor + F
    shown_s = first_s * math.exp(-c.latency_s / fade_s) if fade_s > 0.0 else 0.0
    stages = model.parallel.pipeline
    stage_s = max(c.stage_s + shown_s / stages, floor_s / stages)
    return Prefill(stage_s, max(c.latency_s + shown_s, floor_s), c.approximation_s, c.encode_s, c.forms)


class _StepTimer(Timer):
    """A step's timer: its end (`_STEP_END`: encoded and free at once), its KV encoded, or the replica free;
    `version` the replica's when the step started."""

    __slots__ = ("rep", "kind", "version", "batch", "done")

    def __init__(self, rep: PrefillReplica, kind: int, version: int, batch: list[int], done: list[int]):
        self.rep = rep
        self.kind = kind
        self.version = version
        self.batch = batch
        self.done = done

    def fire(self) -> None:
        if self.kind == _STEP_END:
            self.rep._step_end(self.version, self.batch, self.done)
        elif self.kind == _ENCODED:
            self.rep._encoded(self.version, self.batch, self.done)
        else:
            self.rep._free(self.version)
