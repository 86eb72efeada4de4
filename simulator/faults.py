"""Faults as scenario events: links that slow down or drop out, replicas that go down, and what happens
to the requests they hit.

A scenario's `faults:` list holds timed events `{kind, target, start_s, end_s, factor}`; each acts on
its target during [start_s, end_s) (end_s may be .inf: it never comes back). A fault that starts at
time t acts before anything else happening at t (its timer is scheduled when the run is built), and
faults at one instant act in the order listed. Overlapping faults on one target compose: a link
runs at the product of its active factors, a replica is down while any of its faults is active.

- link_degradation: the link runs at `factor` of its capacity; transfers in flight slow down.
- link_outage: the link carries nothing. Transfers in flight are lost (their bytes are gone, the KV is
  still parked in the prefill replica's host memory) and new ones wait for the link or take another.
- prefill_replica_down: the batches it is running are lost, and so is every KV parked in its host
  memory (waiting for a decode replica, or on the way to one); its queue goes to the other prefill
  replicas (or waits for one to come back). Requests whose KV was lost must prefill again.
- decode_replica_down: every request it holds loses its KV: those decoding or about to join, and
  those whose KV is on the way to it (still parked on their prefill replica).

A replica that goes down loses its prefix cache (simulator/prefix_cache.py) with it: every block,
pinned or not (the pins belong to the batches lost with the replica), so the cache comes back empty and
a request retried there misses where it hit before; each lookup of a retried request counts in the hit
rate as any other.

Where the two phases share GPUs, a replica down takes both phases on its GPUs:
- placement shared_gpu: prefill replica i and decode replica i share GPUs, so `prefill_replica_down` and
  `decode_replica_down` of target i both take the pair down (its prefill side first, then its decode
  side, at the same instant; it comes back decode side first, so its prefill finds the GPU free); the
  links are those of separate pools and fail the same way.
- placement colocated: each replica runs both phases, and either kind takes down replica `target` (the
  index requests.csv gives, 0 .. prefill.replicas + decode.replicas - 1): its decode requests, the prompts
  it was prefilling and the preempted requests it held are hit (in arrival order); the prompts still
  waiting there move to the live replicas, in their order (or wait for one to come back). Nothing is parked on another host, so `resend` prefills
  again as `reprefill` does. There is no link, so link faults are refused (simulator/config.py).

`fault_policy.on_loss` decides the fate of a request that lost its KV:
- resend: prefill replicas keep every request's KV in host memory until the request finishes (which
  holds host memory longer, so prefill may wait for room); a request whose KV survives there is sent
  again to a live decode replica, one whose copy died with its prefill replica prefills again;
- reprefill: the KV leaves prefill host memory once it has arrived (as without faults); a request
  whose KV is still parked is sent again, any other prefills again from the start;
- fail: the request fails, its reason the fault's kind.
A request is retried at most `max_retries` times; then it fails ("retries_exhausted"). When the run
ends, a request still waiting for a replica or link that never came back fails as "stranded". So
every request ends exactly once, completed or failed with a reason: completed + failed == requests.

A retried request keeps its arrival; its timestamps are those of the attempt that finished, so the
time lost to the fault is in the queue part before the retried phase (prefill_queue after a
re-prefill, transfer_queue after a re-send) and the breakdown still adds up to its JCT.
"""

from __future__ import annotations

import math
from collections import Counter
from typing import TYPE_CHECKING

from .colocated import ColocatedRouter
from .timers import call_in

if TYPE_CHECKING:
    import simpy

    from .columns import Records
    from .config import FaultEvent, FaultPolicy
    from .router import Router

STRANDED = "stranded"
RETRIES_EXHAUSTED = "retries_exhausted"


class FaultInjector:
    """Schedules the scenario's faults on one method's run and decides the fate of the requests they hit."""

    def __init__(
        self,
        records: Records,
        env: simpy.Environment,
        router: Router | ColocatedRouter,
        faults: list[FaultEvent],
        policy: FaultPolicy,
    ):
        self.rec, self.policy = records, policy
        # placement colocated: one replica runs both phases; otherwise the router of separate pools
        self.colo: ColocatedRouter | None = router if isinstance(router, ColocatedRouter) else None
        self.router: Router | None = None if isinstance(router, ColocatedRouter) else router
        self.links = {link.name: link for link in router.links.values()}
        self.link_factors: dict[str, list[float]] = {name: [] for name in self.links}
        self.down: Counter = Counter()  # (pool, index) -> active faults
        # placement shared_gpu: a replica down takes both phases on its GPUs
        self.shared = self.router is not None and any(p.partner is not None for p in self.router.prefill)
        if self.router is not None:
            self.router.hold_kv = policy.on_loss == "resend"
        for f in faults:
            call_in(env, f.start_s, lambda _e, f=f: self._begin(f))
            if math.isfinite(f.end_s):
                call_in(env, f.end_s, lambda _e, f=f: self._end(f))

    def _unit(self, f: FaultEvent) -> str:
        """What a replica fault takes down: a prefill or decode replica, a shared_gpu pair, a colocated replica."""
        if self.colo is not None:
            return "colocated"
        if self.shared:
            return "pair"
        return "prefill" if f.kind == "prefill_replica_down" else "decode"

    def _separate(self) -> Router:
        assert self.router is not None, "only separate pools (placement separate or shared_gpu) have this"
        return self.router

    # ---- events ------------------------------------------------------------------------------------
    def _begin(self, f: FaultEvent) -> None:
        if f.kind.startswith("link"):
            name = str(f.target)
            link = self.links[name]
            self.link_factors[name].append(_factor(f))
            link.set_factor(math.prod(self.link_factors[name]))
            if link.factor == 0:
                self._transfers_lost(link.abort(set(link.waiting) | {fl.rid for fl in link.flows}), f.kind)
        else:
            unit, i = self._unit(f), int(f.target)
            self.down[(unit, i)] += 1
            if self.down[(unit, i)] == 1:
                down = {
                    "prefill": self._prefill_down,
                    "decode": self._decode_down,
                    "pair": self._pair_down,
                    "colocated": self._colocated_down,
                }
                down[unit](i, f.kind)
        if self.router is not None:
            self.router.try_admit()

    def _end(self, f: FaultEvent) -> None:
        if f.kind.startswith("link"):
            factors = self.link_factors[str(f.target)]
            factors.remove(_factor(f))
            self.links[str(f.target)].set_factor(math.prod(factors))
        else:
            unit, i = self._unit(f), int(f.target)
            self.down[(unit, i)] -= 1
            if self.down[(unit, i)] == 0:
                if self.colo is not None:
                    self.colo.replica_up(i)
                else:
                    router = self._separate()
                    if unit != "prefill":  # a pair's decode side first, so its prefill finds the GPU free
                        router.decode[i].recover()
                    if unit != "decode":
                        router.prefill[i].recover()
                        backlog, router.backlog = router.backlog, []
                        if backlog:
                            router.on_arrivals(backlog)
        if self.router is not None:
            self.router.try_admit()

    def _prefill_down(self, i: int, kind: str) -> None:
        rec, router = self.rec, self._separate()
        replica = router.prefill[i]
        lost, queued = replica.fail()
        if router.prefix is not None:
            router.prefix.replica_down("prefill", i)
        lost_set = set(lost)
        on_host = [r for r in router.pending if rec.prefill_replica[r] == i]
        if on_host:
            router.pending = type(router.pending)(r for r in router.pending if rec.prefill_replica[r] != i)
        moving = [r for r, (link, rep) in router.transfers.items() if rec.prefill_replica[r] == i]
        for r in moving:
            link, rep = router.transfers.pop(r)
            link.abort({r})
            if not rep.down:  # (a shared_gpu pair's own decode side has lost its memory already)
                rep.unreserve(r, rec.admit_bytes[r], rec.host_kv_bytes[r])
        for r in lost + on_host + moving:
            rec.kv_held[r] = False
        # the KV of requests decoding elsewhere (kept for a re-send) died with the host too
        for r in self._held_on(i):
            rec.kv_held[r] = False
        for r in lost + [r for r in on_host + moving if r not in lost_set]:
            self._hit(r, kind)
        if queued:
            router.on_arrivals(queued)

    def _held_on(self, i: int) -> list[int]:
        rec = self.rec
        if not self._separate().hold_kv:
            return []
        return [r for r in range(rec.n) if rec.kv_held[r] and rec.prefill_replica[r] == i]

    def _pair_down(self, i: int, kind: str) -> None:
        """shared_gpu: both sides of pair i stop before any request they lose is routed again (so none is
        routed back to the other side); then the prefill side's requests are hit, then the decode side's (the
        KV parked on the pair's host is gone, so those re-prefill rather than wait to be re-sent)."""
        lost = self._separate().decode[i].fail()
        self._prefill_down(i, kind)
        self._decode_down(i, kind, lost)

    def _decode_down(self, d: int, kind: str, lost: list[int] | None = None) -> None:
        """`lost`: the replica's requests, when it has already been failed (`_pair_down`)."""
        router = self._separate()
        if lost is None:
            lost = router.decode[d].fail()
        if router.prefix is not None:
            router.prefix.replica_down("decode", d)
        moving = [r for r, (link, rep) in router.transfers.items() if rep.index == d]
        for r in moving:
            link, _ = router.transfers.pop(r)
            link.abort({r})
        for r in lost + moving:
            self._hit(r, kind)

    def _colocated_down(self, i: int, kind: str) -> None:
        """A colocated replica down: its decode requests and the prompt it was prefilling are hit, in arrival
        order; its queued prompts move to the live replicas (simulator/colocated.py)."""
        assert self.colo is not None
        lost, queued = self.colo.replica_down(i)
        for r in sorted(lost):
            self._hit(r, kind)
        if queued:
            self.colo.on_arrivals(queued)

    def _transfers_lost(self, rids: list[int], kind: str) -> None:
        """Transfers cut by an outage: their reservations are released and the requests hit."""
        rec, router = self.rec, self._separate()
        for r in rids:
            _, rep = router.transfers.pop(r)
            rep.unreserve(r, rec.admit_bytes[r], rec.host_kv_bytes[r])
            self._hit(r, kind)

    # ---- a request's fate ----------------------------------------------------------------------------
    def _hit(self, rid: int, kind: str) -> None:
        rec, router = self.rec, self.router
        if rec.failure[rid]:
            # Already ended by an earlier hit at the same instant: a streamed request whose transfer an
            # outage cut while its prefill batch still ran, then lost again with that batch.
            return
        if self.policy.on_loss == "fail" or rec.retries[rid] >= self.policy.max_retries:
            if router is not None:
                router.release_kv(rid)
            rec.fail(rid, kind if self.policy.on_loss == "fail" else RETRIES_EXHAUSTED)
            return
        rec.retries[rid] += 1
        rec.preempt_s[rid] = 0.0  # time out of a lost attempt's batch is not this attempt's
        if rec.kv_held[rid]:
            self._separate().pending.append(rid)  # the KV is still parked: send it again
        elif router is not None:
            router.on_arrivals([rid])  # prefill again
        else:
            assert self.colo is not None
            self.colo.on_arrivals([rid])


def _factor(f: FaultEvent) -> float:
    """The fraction of its capacity a link keeps under a link fault."""
    return 0.0 if f.factor is None else f.factor  # link_outage: nothing (config.FaultEvent gives it no factor)


def faults_line(summary: dict) -> str:
    """One terminal line: per method, how many requests failed (and why) and how many were retried."""
    parts = []
    for name, m in summary.get("methods", {}).items():
        why = ", ".join(f"{n} {reason}" for reason, n in m.get("failure_reasons", {}).items())
        parts.append(f"{name} {m.get('failed', 0)} failed{f' ({why})' if why else ''}, {m.get('retried', 0)} retried")
    return "faults: " + "; ".join(parts)
