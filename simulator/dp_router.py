"""The router of data-parallel decode engines (simulator/data_parallel.py says what is modelled and cites vLLM):
each request's engine picked by vLLM's DP load balancer when its KV is ready, a FIFO queue per engine.

A module of its own so that it compiles with the router it extends (simulator/compiled.py).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from typing import TYPE_CHECKING, Protocol

from .router import Router

if TYPE_CHECKING:
    from .columns import Records
    from .decode import DecodeReplica
    from .link import Link
    from .prefill import PrefillReplica
    from .prefix_cache import PrefixCaching

WAITING_WEIGHT = 4  # DPLBAsyncMPClient: score = waiting * 4 + running


class Group(Protocol):
    """A lock-step group of engines (data_parallel.LockstepGroup)."""

    def refresh(self) -> None: ...


class DataParallelRouter(Router):
    """The router, with decode engines picked by vLLM's DP load balancer and a queue per engine (module doc)."""

    def __init__(
        self,
        records: Records,
        prefix: PrefixCaching | None,
        prefill: list[PrefillReplica],
        decode: list[DecodeReplica],
        links: dict[tuple[int, int], Link],
        flow_cap_bytes_per_s: float,
        stream_layers: bool,
        layers: int,
        *,
        groups: Sequence[Group],
    ):
        super().__init__(records, prefix, prefill, decode, links, flow_cap_bytes_per_s, stream_layers, layers)
        self.groups = groups
        self.queues: list[deque[int]] = [deque() for _ in self.decode]  # per engine: routed, waiting for KV room

    def score(self, rep: DecodeReplica) -> int:
        """waiting * 4 + running (module doc): `slots_used` counts the engine's admitted requests, joined or not,
        preempted ones included; `batch` the running ones."""
        running = rep.batch
        waiting = len(self.queues[rep.index]) + rep.slots_used - running
        return WAITING_WEIGHT * waiting + running

    def pick_engine(self, prefill_replica: int) -> DecodeReplica:
        best, best_score = None, None
        for rep, _link in self.routes[prefill_replica]:  # in engine index order
            s = self.score(rep)
            if best_score is None or s < best_score:
                best, best_score = rep, s
        assert best is not None  # resolve refuses a prefill replica that reaches no decode replica
        return best

    def _ready(self, batch: list[int]) -> None:
        rec = self.rec
        for rid in batch:
            if rec.decode_iterations[rid] == 0:
                rec.finish_without_decode(rid)  # ttft_at prefill, one output token: no KV moves (Router._ready)
                self.release_kv(rid)
            else:
                self.queues[self.pick_engine(rec.prefill_replica[rid]).index].append(rid)
        self.try_admit()

    def on_memory_freed(self) -> None:
        for g in self.groups:
            g.refresh()
        self.try_admit()

    def try_admit(self) -> None:
        rec = self.rec
        for rep, queue in zip(self.decode, self.queues):
            while queue:
                rid = queue[0]
                p = rec.prefill_replica[rid]
                need, host = rec.admit_bytes[rid], rec.host_kv_bytes[rid]
                if self.links[(p, rep.index)].factor <= 0 or not rep.has_room(need, host):
                    break
                queue.popleft()
                rep.reserve(need, host)
                self._transfer(rid, p, rep)
