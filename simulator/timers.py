"""Timers beside SimPy's event queue: a `Timer` object whose `fire()` runs at a given time, kept on the
environment's `Loop`, a heap of its own that runs merged with SimPy's queue in SimPy's order.

SimPy orders its queue by (time, priority, event id): a timeout's entry is (now + delay, NORMAL, the next id of
``env._eid``, event). A timer here takes its id from the same count when it is set (the loop becomes
``env._eid``: SimPy's own events draw their ids from it too) and sorts by (time, id) among timers, all of
NORMAL priority; `Loop.step` takes the earlier of the timer heap's head and SimPy's queue's head by SimPy's
full key. So timers and SimPy's events run in the order `env.timeout(delay_s).callbacks.append(fn)` ran them
when every timer was a timeout: same-instant ones in the order they were set, interleaved with SimPy's events
as their ids say, on the same clock (tests/test_timers.py runs random timelines both ways). A SimPy event
still runs through SimPy's own `Environment.step`, so processes, timeouts and `env.run(until=...)` work as
before (the loop puts its `step` and `peek` on the environment, which `Environment.run` calls).

Why not SimPy's queue: a timer there was a 4-tuple, a boxed time and id, an event object with a callback list
and a closure, each made and freed, and `heapq` compared the tuples field by field through Python's generic
comparison (a timer's push and pop were 16 % of a default run's instructions, callgrind at 5,000 requests). Compiled (mypyc), a `Timer`
is one object with the time and id as C fields, the heap's comparisons are C comparisons of them, and `fire`
is a direct call of the subclass's method: each entity's timer is a small subclass naming what it runs
(`link._Drained`, `decode._SegmentEnd`, ...), its fields what a closure captured. `call_in(env, delay_s, fn)`
keeps the older interface for what runs rarely (faults, a deferred wake): `fn(timer)` at ``now + delay_s``.

The loop keeps the clock as a C field too (`Loop.now`, also written to ``env._now``, which SimPy's `now`
returns): compiled entities read it natively, where ``env._now`` is a dictionary lookup on a Python object.
`run(env)` drives both queues to their end, as ``env.run()`` does, faster.
"""

from __future__ import annotations

from collections.abc import Callable
from heapq import heappop, heappush
from types import FunctionType
from typing import Any

import simpy
from simpy.core import EmptySchedule
from simpy.events import NORMAL

try:
    # mypyc's traits: an interface a compiled class may implement beside its base class (the router is each entity's
    # listener), called natively through it; a plain base class as Python. mypy brings the package, so the build has it
    from mypy_extensions import trait
except ImportError:

    def trait(cls):  # type: ignore[misc,no-redef]
        return cls


class Timer:
    """A timer on a `Loop`: `fire()` runs at `time_s`; `eid` is its SimPy event id (the order among timers and
    SimPy's events of one instant). A subclass names what runs; one object is set once (or, never void, set
    again after it fired: `arrivals.Arrivals`)."""

    __slots__ = ("time_s", "eid")
    # set by the loop when the timer is set (no __init__ to call: a subclass's own is the only one that runs)
    time_s: float
    eid: int

    def fire(self) -> None:
        raise NotImplementedError


def _probe() -> None:
    pass


# Compiled by mypyc, a module's function is a builtin, not a Python function. Then the loop sifts its heap of
# timers itself on their C fields; as Python it keeps (time, id, timer) entries that `heapq`'s C code sifts, which
# is faster there than the sift written out in Python (0.4 against 1.0 us a pop and push) or heapq comparing
# timers through a Python `__lt__` (0.6 us). The same order either way: by (time, id), ids unique.
_NATIVE = not isinstance(_probe, FunctionType)


class _Call(Timer):
    """`call_in`'s timer: `fn(timer)`."""

    __slots__ = ("fn",)

    def __init__(self, fn: Callable[[Any], object]):
        self.fn = fn

    def fire(self) -> None:
        self.fn(self)


class Loop:
    """An environment's timers and clock (`loop(env)` makes it on first use and installs it): a binary heap of
    `Timer`s by (time, id) (`heap` compiled, `entries` as Python: `_NATIVE`), merged with SimPy's queue in `step`;
    the count of SimPy's event ids (``env._eid`` is this object, `__next__`), and the clock (`now`, mirrored to
    ``env._now``)."""

    __slots__ = ("env", "heap", "entries", "queue", "now", "next_eid", "native")

    def __init__(self, env: simpy.Environment):
        self.env = env
        self.heap: list[Timer] = []
        self.entries: list[tuple[float, int, Timer]] = []
        self.queue: list[Any] = env._queue  # SimPy's (time, priority, id, event) entries
        self.now: float = env._now
        self.next_eid: int = next(env._eid)  # the id SimPy would give next: none is skipped
        self.native = _NATIVE  # a field: compiled, a module global is a dictionary lookup

    def __iter__(self) -> Loop:
        return self

    def __next__(self) -> object:  # object: mypyc's iterator slot returns a Python object, not a native int
        """SimPy's `next(env._eid)`: its events and the timers take ids from one count."""
        eid = self.next_eid
        self.next_eid = eid + 1
        return eid

    def set_at(self, timer: Timer, time_s: float) -> None:
        """Put `timer` on the heap at `time_s` with the next event id (after every event already set for that
        instant)."""
        eid = self.next_eid
        self.next_eid = eid + 1
        timer.time_s = time_s
        timer.eid = eid
        if not self.native:
            heappush(self.entries, (time_s, eid, timer))
            return
        heap = self.heap
        heap.append(timer)
        pos = len(heap) - 1
        while pos > 0:  # sift up (heapq's _siftdown)
            up = (pos - 1) >> 1
            p = heap[up]
            if time_s < p.time_s or (time_s == p.time_s and eid < p.eid):
                heap[pos] = p
                pos = up
            else:
                break
        heap[pos] = timer

    def set_in(self, timer: Timer, delay_s: float) -> None:
        """Put `timer` on the heap `delay_s` seconds from now."""
        if delay_s < 0:
            raise ValueError(f"negative delay {delay_s}")
        if self.native:
            self.set_at(timer, self.now + delay_s)
            return
        eid = self.next_eid  # as Python, set_at's part written out: a call is a tenth of a microsecond
        self.next_eid = eid + 1
        time_s = timer.time_s = self.now + delay_s
        timer.eid = eid
        heappush(self.entries, (time_s, eid, timer))

    def _pop(self) -> Timer:
        """Take the earliest timer off the heap (a non-empty one)."""
        if not self.native:
            return heappop(self.entries)[2]
        heap = self.heap
        last = heap.pop()
        n = len(heap)
        if n == 0:
            return last
        top = heap[0]
        t, eid = last.time_s, last.eid
        pos, child = 0, 1
        while child < n:  # sift `last` down from the root
            c = heap[child]
            right = child + 1
            if right < n:
                r = heap[right]
                if r.time_s < c.time_s or (r.time_s == c.time_s and r.eid < c.eid):
                    child, c = right, r
            if c.time_s < t or (c.time_s == t and c.eid < eid):
                heap[pos] = c
                pos = child
                child = 2 * pos + 1
            else:
                break
        heap[pos] = last
        return top

    def _simpy_first(self) -> bool:
        """SimPy's queue holds the next event: its head's (time, priority, id) is before the timer heap's."""
        queue = self.queue
        if not queue:
            return False
        if self.native:
            if not self.heap:
                return True
            timer = self.heap[0]
            time_s, eid = timer.time_s, timer.eid
        else:
            if not self.entries:
                return True
            time_s, eid, _ = self.entries[0]
        head = queue[0]
        t = head[0]
        if t != time_s:
            return t < time_s
        prio = head[1]
        if prio != NORMAL:
            return prio < NORMAL
        return head[2] < eid

    def step(self) -> None:
        """Process the next event, a timer or SimPy's (`Environment.step`'s contract: EmptySchedule when none)."""
        env = self.env
        if self._simpy_first():
            self.now = self.queue[0][0]  # what SimPy's step sets env._now to, before any callback reads it
            simpy.Environment.step(env)
            return
        if not (self.heap or self.entries):
            raise EmptySchedule
        timer = self._pop()
        self.now = env._now = timer.time_s
        timer.fire()

    def peek(self) -> float:
        """The time of the next event (`Environment.peek`: inf when none)."""
        if self._simpy_first():
            return self.queue[0][0]
        if self.heap:
            return self.heap[0].time_s
        return self.entries[0][0] if self.entries else float("inf")


def loop(env: simpy.Environment) -> Loop:
    """The environment's `Loop`, made and installed on first use: ``env._eid`` becomes it, and ``env.step`` and
    ``env.peek`` its own, so ``env.run()`` runs timers and SimPy's events together."""
    found: Any = env.__dict__.get("_timer_loop")
    if found is not None:
        return found
    lp = Loop(env)
    env.__dict__["_timer_loop"] = lp
    env._eid = lp  # type: ignore[assignment]  # SimPy only calls next() on it
    env.__dict__["step"] = lp.step
    env.__dict__["peek"] = lp.peek
    return lp


def call_in(env: simpy.Environment, delay_s: float, fn: Callable[[Any], object]) -> None:
    """Run `fn(timer)` `delay_s` seconds from now (after every event already set for that instant)."""
    loop(env).set_in(_Call(fn), delay_s)


def run(env: simpy.Environment) -> None:
    """Process every timer and SimPy event until none is left: what ``env.run()`` does, faster."""
    lp = loop(env)
    heap, entries, queue = lp.heap, lp.entries, lp.queue  # heap or entries: the other stays empty
    while heap or entries or queue:
        if queue and lp._simpy_first():  # then SimPy's event (rare in a run: every entity sets timers)
            lp.step()
            continue
        timer = lp._pop()  # a timer is waiting: _simpy_first says so when none is
        lp.now = env._now = timer.time_s
        timer.fire()
