"""Timers on SimPy's event queue: `call_in(env, delay_s, fn)` runs `fn(event)` at ``env.now + delay_s``.

It is what ``env.timeout(delay_s).callbacks.append(fn)`` does (the event protocol, simulator/__init__.py),
for a third less time per event: the entry pushed is the one `Environment.schedule` pushes for a timeout,
(time, NORMAL priority, the next event id, event), so timers run in the same order, same-instant ones in
the order they were set, and carry the same ids; the event is a bare object with the two attributes
`Environment.step` reads (`callbacks`, `_ok`) instead of a `Timeout` built through `Event.__init__` and
`schedule`. A run makes one or two of these per request per entity, so their cost is a tenth of the
event loop's.

`run(env)` drives the queue to its end as `env.run()` does, event by event in the same order on the same
clock; it calls a timer's function straight from the queue entry, where `Environment.step` would swap its
callback list out and loop over it (a run's every event is a timer: that call and loop were a tenth of its
time). Any other event (a process, a `Timeout`) goes through SimPy's own protocol, exactly as `step` runs it,
so entities and tests may mix them. tests/test_timers.py runs random timelines through both.

The compiled modules read the clock as `env._now`, the field SimPy's `now` property returns: from compiled code
the property is a call into an interpreted function (16 reads a request in the default scenario), the field
one dictionary lookup. A timer's function is a closure (`lambda _e: self._method(args)`) rather than a
`functools.partial` of a bound method: compiled, the closure calls the method directly, where the partial
goes through the method's Python wrapper and its argument parsing.
"""

from __future__ import annotations

from collections.abc import Callable
from heapq import heappop, heappush
from typing import Any

import simpy
from simpy.events import NORMAL


class _Timer:
    __slots__ = ("callbacks",)
    _ok = True  # Environment.step: a timer never fails

    def __init__(self, fn: Callable[[Any], object]):
        self.callbacks: list[Callable[[Any], object]] | None = [fn]  # Environment.step sets it to None once run


def call_in(env: simpy.Environment, delay_s: float, fn: Callable[[Any], object]) -> None:
    """Run `fn(event)` `delay_s` seconds from now (after every event already set for that instant)."""
    if delay_s < 0:
        raise ValueError(f"negative delay {delay_s}")
    queue: list = env._queue  # SimPy types it as holding Events; a _Timer has the two attributes Environment.step reads
    heappush(queue, (env._now + delay_s, NORMAL, next(env._eid), _Timer(fn)))


def run(env: simpy.Environment) -> None:
    """Process every event on `env`'s queue until it is empty: what ``env.run()`` does, faster for timers."""
    queue: Any = env._queue  # (time, priority, id, event): a _Timer or any SimPy event
    timer = _Timer
    while queue:
        env._now, _, _, event = heappop(queue)
        if type(event) is timer:
            fns: Any = event.callbacks  # a list until Environment.step runs it (never, here)
            fns[0](event)
            continue
        # Environment.step (simpy 4.1): callbacks, then a failure nobody defused is raised (no `until` here, so
        # no StopSimulation to catch)
        callbacks, event.callbacks = event.callbacks, None
        for callback in callbacks:
            callback(event)
        if not event._ok and not hasattr(event, "_defused"):
            exc = type(event._value)(*event._value.args)
            exc.__cause__ = event._value
            raise exc
