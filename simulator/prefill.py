"""A prefill replica: FCFS batching of prompts, pipelined stages, quantization after the forward pass.

One process per replica. A batch takes queued requests in arrival order while it stays within
`max_batch_requests` and `max_batch_tokens` (a prompt longer than the token limit runs alone).
The replica is busy for the bottleneck stage plus the encode (quantize / entropy-code) step;
the batch's first tokens appear `latency_s` after it starts (all pipeline stages). KV waiting
for a decode replica is parked in this replica's host memory; when that memory is full the
replica does not start the next batch (back-pressure), and the wait counts as prefill queueing.
"""
from __future__ import annotations

from collections import deque
from typing import TYPE_CHECKING

import simpy

from costmodel.phases import ReplicaCostModel

if TYPE_CHECKING:
    from .run import MethodRun


class PrefillReplica:
    def __init__(self, env: simpy.Environment, index: int, cost: ReplicaCostModel, max_batch_requests: int,
                 max_batch_tokens: int, host_memory_bytes: float, run: "MethodRun"):
        self.env = env
        self.index = index
        self.cost = cost
        self.max_batch_requests = max_batch_requests
        self.max_batch_tokens = max_batch_tokens
        self.host_memory_bytes = host_memory_bytes
        self.run = run
        self.queue: deque[int] = deque()
        self.outstanding_tokens = 0          # queued + in service: the router's load measure
        self.parked_bytes = 0.0              # KV in host memory waiting for / in transfer
        self._wake: simpy.Event = env.event()
        self._space: simpy.Event = env.event()
        self._idle = True
        env.process(self._loop())

    def enqueue(self, rid: int) -> None:
        self.queue.append(rid)
        self.outstanding_tokens += int(self.run.prompt[rid])
        if self._idle and not self._wake.triggered:
            self._wake.succeed()

    def release_parked(self, bytes_: float) -> None:
        self.parked_bytes -= bytes_
        if not self._space.triggered:
            self._space.succeed()

    def _take_batch(self) -> list[int]:
        prompt = self.run.prompt
        batch = [self.queue.popleft()]
        tokens = int(prompt[batch[0]])
        while self.queue and len(batch) < self.max_batch_requests:
            nxt = int(prompt[self.queue[0]])
            if tokens + nxt > self.max_batch_tokens:
                break
            batch.append(self.queue.popleft())
            tokens += nxt
        return batch

    def _loop(self):
        env, run = self.env, self.run
        while True:
            if not self.queue:
                self._idle = True
                self._wake = env.event()
                yield self._wake
                self._idle = False
            # Back-pressure: the batch's KV must fit in host memory if no decode replica takes it.
            head_bytes = run.wire_bytes[self.queue[0]]
            while self.parked_bytes > 0 and self.parked_bytes + head_bytes > self.host_memory_bytes:
                self._space = env.event()
                yield self._space
            batch = self._take_batch()
            cost = self.cost.prefill(tuple(int(run.prompt[r]) for r in batch))
            start = env.now
            prefill_end = start + cost.latency_s
            encode_end = prefill_end + cost.encode_s
            for rid in batch:
                run.prefill_replica[rid] = self.index
                run.prefill_start[rid] = start
                run.prefill_end[rid] = prefill_end
                run.encode_end[rid] = encode_end
                run.approx_prefill[rid] = cost.approximation_s
                self.parked_bytes += run.wire_bytes[rid]
            run.router.on_prefill_started(batch, self, start, encode_end)
            env.timeout(encode_end - start).callbacks.append(lambda _e, b=batch: self._done(b))
            yield env.timeout(cost.stage_s + cost.encode_s)

    def _done(self, batch: list[int]) -> None:
        for rid in batch:
            self.outstanding_tokens -= int(self.run.prompt[rid])
        self.run.router.on_kv_ready(batch, self)
