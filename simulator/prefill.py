"""A prefill replica: FCFS batching of prompts, pipelined stages, quantization after the forward pass.

A small state machine driven by SimPy timeouts (no process per request). A batch takes queued requests in arrival order while it stays within
`max_batch_requests` and `max_batch_tokens` (a prompt longer than the token limit runs alone).
The replica is busy for the bottleneck stage plus the encode (quantize / entropy-code) step;
the batch's first tokens appear `latency_s` after it starts (all pipeline stages). KV waiting
for a decode replica is parked in this replica's host memory; when that memory is full the
replica does not start the next batch (back-pressure), and the wait counts as prefill queueing.

A replica that goes down (simulator/faults.py) loses the batches it is running and the KV parked in
its host memory; its queue is handed back to the router; timers of the lost batches are ignored
through a version counter.
"""

from __future__ import annotations

from collections import deque
from typing import TYPE_CHECKING, Protocol

import simpy

from costmodel.phases import ReplicaCostModel

from .columns import Records
from .timers import call_in

if TYPE_CHECKING:
    from .prefix_cache import PrefixCaching


class PrefillListener(Protocol):
    """Who takes a batch's KV on (the router)."""

    def on_prefill_started(self, batch: list[int], replica: PrefillReplica, start_s: float, ready_s: float) -> None: ...

    def on_kv_ready(self, batch: list[int], replica: PrefillReplica) -> None: ...


class GPUSharer(Protocol):
    """The decode replica sharing this replica's GPU (placement: shared_gpu)."""

    @property
    def paused(self) -> bool: ...

    def yield_gpu(self) -> bool: ...

    def resume_after_prefill(self) -> None: ...


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
    ):
        self.env = env
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
        self.running: list[list[int]] = []  # batches started whose KV is not ready yet
        self._version = 0
        self.partner: GPUSharer | None = None  # the decode replica sharing this GPU (placement: shared_gpu)
        self.busy_s = 0.0  # Σ time a batch held the replica (its load, simulator/overload.py)
        self.chunk_tokens = chunk_tokens

    def enqueue(self, rid: int) -> None:
        """Queue a request; the caller kicks the replica once every same-instant arrival is queued."""
        self.queue.append(rid)
        self.outstanding_tokens += self.rec.prompt[rid]

    def kick(self) -> None:
        if self._idle:
            self.try_start()

    def release_parked(self, bytes_: float) -> None:
        self.parked_bytes -= bytes_
        if self._idle and self.queue:
            self.try_start()

    def _take_batch(self) -> list[int]:
        prompt = self.rec.prompt
        batch = [self.queue.popleft()]
        tokens = prompt[batch[0]]
        limit = min(self.max_batch_tokens, self.chunk_tokens or self.max_batch_tokens)
        while self.queue and len(batch) < self.max_batch_requests:
            nxt = prompt[self.queue[0]]
            if tokens + nxt > limit:
                break
            batch.append(self.queue.popleft())
            tokens += nxt
        return batch

    def try_start(self) -> bool:
        """Start the next batch if there is one and the GPU is ours; True if it started."""
        rec, env, prefix = self.rec, self.env, self.prefix
        if not self.queue or self.down:
            self._idle = True
            return False
        # Back-pressure: the batch's KV must fit in host memory if no decode replica takes it.
        if self.parked_bytes > 0 and self.parked_bytes + rec.wire_bytes[self.queue[0]] > self.host_memory_bytes:
            self._idle = True
            return False
        if self.partner is not None and not self.partner.paused and not self.partner.yield_gpu():
            self._idle = True  # the decode partner hands the GPU over at its next boundary
            return False
        self._idle = False
        batch = self._take_batch()
        cached = prefix.prefill_start(self.index, batch) if prefix is not None else None
        if self.chunk_tokens and len(batch) == 1 and rec.prompt[batch[0]] > self.chunk_tokens:
            # prefill.chunk_tokens: a longer prompt runs alone, as chunks back to back
            cost = self.cost.chunked_prefill(rec.prompt[batch[0]], self.chunk_tokens, cached[0] if cached else 0)
        else:
            cost = self.cost.prefill(tuple([rec.prompt[r] for r in batch]), cached)
        start = env.now
        prefill_end = start + cost.latency_s
        encode_end = prefill_end + cost.encode_s
        for rid, form in zip(batch, cost.forms):
            rec.prefill_replica[rid] = self.index
            rec.prefill_form[rid] = form
            rec.prefill_start[rid] = start
            rec.prefill_end[rid] = prefill_end
            rec.encode_end[rid] = encode_end
            rec.approx_prefill[rid] = cost.approximation_s
            rec.kv_held[rid] = True
            self.parked_bytes += rec.wire_bytes[rid]
        self.running.append(batch)
        assert self.listener is not None
        self.listener.on_prefill_started(batch, self, start, encode_end)
        busy_s = cost.stage_s + cost.encode_s
        self.busy_s += busy_s
        v = self._version
        if busy_s == encode_end - start:  # one stage: the batch is done when the replica is free
            call_in(env, busy_s, lambda _e: v == self._version and self._done_then_next(batch))
        else:
            call_in(env, encode_end - start, lambda _e: v == self._version and self._done(batch))
            call_in(env, busy_s, lambda _e: v == self._version and self._next())
        return True

    def fail(self) -> tuple[list[int], list[int]]:
        """The replica goes down: returns (requests whose batch was running, requests still queued)."""
        lost = [r for b in self.running for r in b]
        queued = list(self.queue)
        self.queue.clear()
        self.running.clear()
        self.outstanding_tokens = 0
        self.parked_bytes = 0.0  # the host's memory, and every KV parked in it, is gone
        self.down, self._idle = True, True
        self._version += 1
        return lost, queued

    def recover(self) -> None:
        self.down = False
        self.try_start()

    def _next(self) -> None:
        if self.partner is not None:
            self.partner.resume_after_prefill()
        self.try_start()

    def _done_then_next(self, batch: list[int]) -> None:
        self._done(batch)
        self._next()

    def _done(self, batch: list[int]) -> None:
        self.running.remove(batch)
        if self.prefix is not None:
            self.prefix.prefill_done(self.index, batch)
        for rid in batch:
            self.outstanding_tokens -= self.rec.prompt[rid]
        assert self.listener is not None
        self.listener.on_kv_ready(batch, self)
