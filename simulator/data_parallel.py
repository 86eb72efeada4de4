"""Data-parallel decode engines of a mixture-of-experts model (`decode.data_parallel: N` with
`decode.expert_parallel: true`): each decode replica is one vLLM deployment of N engines (DP ranks) of
`tensor_parallel` GPUs each, whose experts form one expert-parallel group of N·T GPUs.

What is modelled (vLLM, vllm-project/vllm; the costs are costmodel/expert_parallel.py's):

* **Engines.** Each engine is a normal decode replica (simulator/decode.py): its own scheduler, its own KV pool
  sized from an engine's GPUs (weights: the experts over N·T GPUs, the rest over T), its own requests,
  on-demand blocks and preemption. Engine r of decode replica d has index d·N + r wherever the outputs name a
  decode replica (requests.csv `decode_replica`, memory.csv `replica`); it reaches prefill over replica d's links.
* **Routing** (`DataParallelRouter`): when a request's KV is ready on the prefill side, the disaggregated proxy
  hands it to the decode deployment, whose API server picks an engine at once: vLLM's internal DP load
  balancer, `DPLBAsyncMPClient.get_core_engine_for_request` (vllm/v1/engine/core_client.py), scores every
  engine by ``waiting * 4 + running`` and takes the lowest, scanning in rank order with a strict ``<`` (ties:
  the lowest rank, for the one API server whose scan starts at rank 0). The rule as vLLM's maintainers
  describe it in vllm-project/vllm PR #47420 (2026-07-02, which then rotated the scan start) and as it stood
  until PR #49204 (2026-07-20, which weighs waiting requests by KV usage and floors the score by in-flight
  counts). `running` is the engine's running batch; `waiting` every request routed to it that is not in that
  batch: queued for KV room, its KV moving, arrived but not yet joined, or preempted (vLLM keeps a request
  whose remote KV is loading in the scheduler's waiting queue, `WAITING_FOR_REMOTE_KVS`). The counts are
  exact here; vLLM's front end sees the coordinator's snapshot (every 100 ms) plus its own increments since.
  With several decode replicas the score runs over every engine the prefill replica reaches.
* **Admission**: each engine admits its own queue in order (FIFO per engine, no overtaking within it) when its
  KV pool has room for the request's first blocks (as a single replica does, simulator/admission.py), and the
  transfer starts then: vLLM's decode scheduler allocates the blocks and starts the connector's pull when the
  request fits. A request never moves to another engine (vLLM has no migration).
* **Lock-step** (`LockstepGroup`): while any engine of the group has work every engine steps, idle ones
  running dummy batches (vllm/v1/engine/core.py, `DPEngineCoreProc.run_busy_loop`), every rank padded to the
  largest token count of the step (vllm/v1/worker/dp_utils.py). An engine holding b requests in a group whose
  largest holds g is priced by `ReplicaCostModel.lockstep_iteration(b, g)`: dense layers and experts at g
  padded rows (the experts see N·g tokens), its own attention and LM head. The group re-reads g whenever an
  engine starts a segment (a join, a finish, a preemption, a re-admission) and when one finishes a request;
  when g changes every other busy engine ends its segment at its next iteration boundary (`wake`) and is
  priced again. Assumed: engines whose steps are priced alike stay in step, but their boundaries are not
  aligned (an engine that was idle starts at once rather than at the group's next boundary: at most one
  step early), and each engine's step has its own attention where the real one waits for the slowest
  engine's (costmodel/expert_parallel.py lists what else is not modelled).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from costmodel.phases import IterationCost, ReplicaCostModel

from .dp_router import WAITING_WEIGHT, DataParallelRouter
from .timers import call_in

if TYPE_CHECKING:
    import simpy

    from .decode import DecodeReplica


class LockstepGroup:
    """The engines of one data-parallel deployment, which step together: the rows every engine is padded to."""

    def __init__(self, env: simpy.Environment):
        self.env = env
        self.engines: list[DecodeReplica] = []
        self.padded_rows = 0  # the largest running batch when last read

    def step_rows(self, rank: int, batch: int) -> int:
        """Rows every engine runs in a step engine `rank` starts now with `batch` requests."""
        rows = max([batch] + [e.batch for i, e in enumerate(self.engines) if i != rank])
        self._note(rows, rank)
        return rows

    def refresh(self) -> None:
        """An engine's batch may have changed without a new segment (a finish that left it idle)."""
        self._note(max(e.batch for e in self.engines), -1)

    def _note(self, rows: int, rank: int) -> None:
        if rows == self.padded_rows:
            return
        self.padded_rows = rows
        for i, e in enumerate(self.engines):
            if i != rank and e.batch:
                call_in(self.env, 0, lambda _e, rep=e: rep.wake())  # priced again at its next boundary


@dataclass(frozen=True, eq=False, kw_only=True)
class EngineCost(ReplicaCostModel):
    """An engine's costs: its own replica's, with each iteration priced at the group's padded rows."""

    group: LockstepGroup = field(repr=False)
    rank: int = 0

    def iteration(self, batch_size: int) -> IterationCost:
        return self.lockstep_iteration(batch_size, self.group.step_rows(self.rank, batch_size))


def engine_cost(base: ReplicaCostModel, group: LockstepGroup, rank: int) -> EngineCost:
    fields = {f.name: getattr(base, f.name) for f in dataclasses.fields(base) if f.init}
    return EngineCost(**fields, group=group, rank=rank)


def build_engines(
    env: simpy.Environment,
    cost: ReplicaCostModel,
    replicas: int,
    engines_per_replica: int,
    make: Callable[[int, ReplicaCostModel], DecodeReplica],
) -> tuple[list[LockstepGroup], list[DecodeReplica]]:
    """`replicas` groups of `engines_per_replica` engines; `make(index, cost)` builds one decode replica."""
    groups, engines = [], []
    for d in range(replicas):
        g = LockstepGroup(env)
        for r in range(engines_per_replica):
            rep = make(d * engines_per_replica + r, engine_cost(cost, g, r))
            g.engines.append(rep)
            engines.append(rep)
        groups.append(g)
    return groups, engines


__all__ = ["WAITING_WEIGHT", "DataParallelRouter", "EngineCost", "LockstepGroup", "build_engines", "engine_cost"]
