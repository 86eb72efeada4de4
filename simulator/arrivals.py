"""The workload's arrivals: each request handed to the router at its arrival time, every request of one instant
together (so they can share a prefill batch), one timer per distinct arrival time.

A module of its own so that it compiles with the entities (simulator/compiled.py); `run.MethodRun` starts it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import simpy

from .timers import call_in


class Arrivals:
    def __init__(self, env: simpy.Environment, arrival_s: Sequence[float], on_arrivals: Callable[[list[int]], None]):
        self.env = env
        self.arrival_s = arrival_s  # sorted
        self.on_arrivals = on_arrivals

    def start(self) -> None:
        if len(self.arrival_s):
            self._next(0, self.arrival_s[0])

    def _arrive(self, rid: int, _event: object = None) -> None:
        """Route every request arriving now, then set a timer for the next arrival."""
        arrival, n = self.arrival_s, len(self.arrival_s)
        now = arrival[rid]
        first = rid
        while rid < n and arrival[rid] <= now:
            rid += 1
        self.on_arrivals(list(range(first, rid)))
        if rid < n:
            self._next(rid, arrival[rid] - now)

    def _next(self, rid: int, delay_s: float) -> None:
        """The timer of the next arrival instant (a closure: compiled, it calls `_arrive` directly)."""
        call_in(self.env, delay_s, lambda _e: self._arrive(rid))
