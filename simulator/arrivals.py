"""The workload's arrivals: each request handed to the router at its arrival time, every request of one instant
together (so they can share a prefill batch), one timer per distinct arrival time.

The arrivals are one timer object (`Arrivals` itself, simulator/timers.py) set again for the next arrival
instant each time it fires, from the sorted column of arrival times: one heap entry pending at a time, nothing
made per arrival but the list of the instant's requests. It takes its event id when it is set, at the previous
arrival instant, as the timer made per instant did, so same-instant events run in the same order.

A module of its own so that it compiles with the entities (simulator/compiled.py); `run.MethodRun` starts it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import simpy

from .timers import Timer, loop, trait

if TYPE_CHECKING:
    from librt.vecs import vec  # pyright: ignore[reportMissingImports]


@trait
class ArrivalListener:
    """Who takes the requests of an arrival instant (the router)."""

    def on_arrivals(self, rids: list[int]) -> None:
        raise NotImplementedError


class Arrivals(Timer):
    __slots__ = ("loop", "arrival_s", "router", "rid")

    def __init__(self, env: simpy.Environment, arrival_s: vec[float], router: ArrivalListener):
        self.loop = loop(env)
        self.arrival_s = arrival_s  # sorted
        self.router = router
        self.rid = 0  # the next request to arrive

    def start(self) -> None:
        if len(self.arrival_s):
            self.loop.set_in(self, self.arrival_s[0])

    def fire(self) -> None:
        """Route every request arriving now, then set the timer again for the next arrival."""
        arrival, n = self.arrival_s, len(self.arrival_s)
        rid = first = self.rid
        now = arrival[rid]
        while rid < n and arrival[rid] <= now:
            rid += 1
        self.rid = rid
        self.router.on_arrivals([r for r in range(first, rid)])  # compiled, a C loop (list(range) calls by name)
        if rid < n:
            self.loop.set_in(self, arrival[rid] - now)
