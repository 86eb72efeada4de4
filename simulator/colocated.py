"""Colocated serving (`placement: colocated`): every engine serves both phases, as one vLLM engine does.

Each engine is a decode replica (simulator/decode.py) configured as the decode pool, with vLLM's step scheduler
(simulator/scheduler.py): each step its decode rows, then the chunks of prompts being prefilled, then waiting
prompts first come first served, within `max_batch_tokens` and `max_batch_requests` (`chunk_tokens` caps a
prompt's chunk; without it a prompt is never split). A step with chunks is one forward pass over all its rows
(`ReplicaCostModel.mixed_step`: the dense layers see every row and read the weights once, each chunk attends
to its prompt's earlier tokens, its KV is written in the method's memory format, a prompt's last chunk yields
its first token); between such steps the decode batch advances in closed form, so events are one per step
that carries prefill work and one per batch change, none per token.

There is no transfer: the prompt's KV is written in the engine's own format where it is read; the client's
first token is the last chunk's, and decode runs one iteration per further output token. Prompt blocks are
allocated chunk by chunk (on-demand admission) or the final KV reserved when the prompt starts (reserve).
The engines are `prefill.replicas + decode.replicas` (every GPU of both pools; the prefill pool may be left
out or given 0 replicas, so one engine on one GPU is `decode.replicas: 1`). The router sends each arrival to
the engine with the fewest prompt tokens queued or being prefilled (ties: the lowest index); a prompt leaves
that count when its prefill ends.

An engine that goes down (simulator/faults.py) loses its decode requests, the prompts it was prefilling and
the preempted ones it held (in arrival order); the prompts still waiting move to the live engines, and
arrivals wait while none is up.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .arrivals import ArrivalListener
from .decode import DecodeListener

if TYPE_CHECKING:
    from .decode import DecodeReplica
    from .scheduler import StepScheduler


class ColocatedRouter(DecodeListener, ArrivalListener):
    """Arrivals go to the live engine with the fewest prompt tokens queued or being prefilled (ties: the lowest
    index); while every engine is down they wait in a backlog (simulator/faults.py)."""

    def __init__(self, replicas: list[DecodeReplica], prefills: list[StepScheduler]):
        self.replicas = replicas
        self.prefills = prefills  # engine i's scheduler
        self.links: dict = {}
        self.hold_kv = False  # no KV is parked on another host: a request's KV is written where it decodes
        self.live = prefills  # the schedulers of the engines that are up
        self.backlog: list[int] = []

    def on_arrivals(self, rids: list[int]) -> None:
        live = self.live
        if not live:
            self.backlog.extend(rids)
            return
        if len(rids) == 1:  # most instants: one arrival
            best = _least_loaded(live)
            best.enqueue_prompt(rids[0])
            best.rep.wake()
            return
        touched = []
        for rid in rids:  # every arrival of the instant is queued before a step starts (they may share it)
            best = _least_loaded(live)
            best.enqueue_prompt(rid)
            touched.append(best)
        for sched in sorted(set(touched), key=lambda c: c.rep.index):
            sched.rep.wake()

    def replica_down(self, i: int) -> tuple[list[int], list[int]]:
        """Engine i goes down: returns (the requests it held, and the prompts still waiting there, which can go
        elsewhere); it takes no work until `replica_up`."""
        rep = self.replicas[i]
        queued = self.prefills[i].take_prompts()
        lost = rep.fail()
        if rep.cache is not None:
            rep.cache.clear()
        self.live = [c for c in self.prefills if not c.rep.down]
        return lost, queued

    def replica_up(self, i: int) -> None:
        self.replicas[i].recover()
        self.live = [c for c in self.prefills if not c.rep.down]
        backlog, self.backlog = self.backlog, []
        if backlog:
            self.on_arrivals(backlog)

    def on_memory_freed(self) -> None:
        """Memory freed: the engine's next step looks at its waiting prompts anyway (a finish ends a segment)."""

    def release_kv(self, rid: int) -> None:
        """Nothing to release: a colocated request's KV is written where it decodes."""


def _least_loaded(live: list[StepScheduler]) -> StepScheduler:
    """The engine with the fewest prompt tokens queued or being prefilled, the lowest index among equals (what
    `min` by (tokens, index) picks, without its key function's tuples)."""
    best = live[0]
    for c in live:
        if c.outstanding_tokens < best.outstanding_tokens or (
            c.outstanding_tokens == best.outstanding_tokens and c.rep.index < best.rep.index
        ):
            best = c
    return best
