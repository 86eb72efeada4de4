"""Timers on SimPy's event queue: `call_in(env, delay_s, fn)` runs `fn(event)` at ``env.now + delay_s``.

It is what ``env.timeout(delay_s).callbacks.append(fn)`` does (the event protocol, simulator/__init__.py),
for a third less time per event: the entry pushed is the one `Environment.schedule` pushes for a timeout,
(time, NORMAL priority, the next event id, event), so timers run in the same order, same-instant ones in
the order they were set, and carry the same ids; the event is a bare object with the two attributes
`Environment.step` reads (`callbacks`, `_ok`) instead of a `Timeout` built through `Event.__init__` and
`schedule`. A run makes one or two of these per request per entity, so their cost is a tenth of the
event loop's.
"""

from __future__ import annotations

from collections.abc import Callable
from heapq import heappush
from typing import Any

import simpy
from simpy.events import NORMAL


class _Timer:
    __slots__ = ("callbacks",)
    _ok = True  # Environment.step: a timer never fails

    def __init__(self, fn: Callable[[Any], object]):
        self.callbacks: list | None = [fn]


def call_in(env: simpy.Environment, delay_s: float, fn: Callable[[Any], object]) -> None:
    """Run `fn(event)` `delay_s` seconds from now (after every event already set for that instant)."""
    if delay_s < 0:
        raise ValueError(f"negative delay {delay_s}")
    # SimPy types its queue as holding Events; a _Timer has the two attributes Environment.step reads
    heappush(env._queue, (env._now + delay_s, NORMAL, next(env._eid), _Timer(fn)))  # pyright: ignore[reportArgumentType]
