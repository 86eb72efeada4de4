"""simulator/timers against what a timer stands for, env.timeout(delay).callbacks.append(fn): the same order
(same-instant timers in the order they were set, interleaved with SimPy's own events), the same clock, the same
event ids, under SimPy's own `env.run()` (with and without `until`) and under `timers.run`; the loop's heap
against a sort by (time, id). It leans on SimPy's queue internals (`_queue`, `_eid`, `_now`, `step`), so this is
where a SimPy change shows."""

from __future__ import annotations

from contextlib import contextmanager

import simpy
from hypothesis import given, settings
from hypothesis import strategies as st

from simulator import timers
from simulator.timers import Timer, call_in, loop
from simulator.timers import run as drive_queue

DELAYS = st.lists(st.sampled_from([0.0, 0.5, 1.0, 1.0, 2.5]), min_size=1, max_size=12)


def _trace(delays, use_call_in: list[bool], drive=simpy.Environment.run):
    """Set one timer per delay, each through call_in or env.timeout, and a process that sleeps on
    env.timeout beside them; each callback sets a follow-up timer of the same kind. Returns what ran, when."""
    env = simpy.Environment()
    log = []

    def setter(kind_call_in: bool):
        return (
            (lambda d, fn: call_in(env, d, fn)) if kind_call_in else (lambda d, fn: env.timeout(d).callbacks.append(fn))  # type: ignore[union-attr]
        )

    for i, (d, kind) in enumerate(zip(delays, use_call_in)):
        set_timer = setter(kind)

        def fire(_e, i=i, d=d, set_timer=set_timer):
            log.append((env.now, i))
            if d > 0:
                set_timer(d, lambda _e, i=i: log.append((env.now, f"{i}+")))

        set_timer(d, fire)

    def proc():
        for _ in range(3):
            yield env.timeout(1.0)
            log.append((env.now, "proc"))

    env.process(proc())
    drive(env)
    return log, next(env._eid), env.now


@settings(max_examples=60, deadline=None)
@given(delays=DELAYS, data=st.data())
def test_call_in_runs_as_a_timeout_would(delays, data):
    mixed = data.draw(st.lists(st.booleans(), min_size=len(delays), max_size=len(delays)))
    ref = _trace(delays, [False] * len(delays))
    assert _trace(delays, [True] * len(delays)) == ref  # same order, same clock, same number of event ids
    assert _trace(delays, mixed) == ref  # and mixed with timeouts


@settings(max_examples=60, deadline=None)
@given(delays=DELAYS, data=st.data())
def test_the_queue_driver_runs_what_env_run_runs(delays, data):
    """timers.run against SimPy's Environment.run over the same queue: timers, timeouts and a process, in the
    same order on the same clock."""
    mixed = data.draw(st.lists(st.booleans(), min_size=len(delays), max_size=len(delays)))
    assert _trace(delays, mixed, drive_queue) == _trace(delays, mixed)


def test_the_queue_driver_raises_a_failed_event_as_simpy_does():
    import pytest

    env = simpy.Environment()

    def proc():
        yield env.timeout(1.0)
        raise KeyError("lost")

    env.process(proc())
    with pytest.raises(KeyError, match="lost"):
        drive_queue(env)
    assert env.now == 1.0


def test_same_instant_timers_run_in_the_order_they_were_set():
    env = simpy.Environment()
    log = []
    for i in range(5):
        call_in(env, 1.0, lambda _e, i=i: log.append(i))
    env.timeout(1.0).callbacks.append(lambda _e: log.append("timeout"))  # type: ignore[union-attr]
    call_in(env, 1.0, lambda _e: log.append(5))
    env.run()
    assert log == [0, 1, 2, 3, 4, "timeout", 5] and env.now == 1.0


def test_a_negative_delay_is_refused():
    import pytest

    with pytest.raises(ValueError, match="negative delay"):
        call_in(simpy.Environment(), -1e-9, lambda _e: None)


class _Logged(Timer):
    def __init__(self, log: list, tag: object):
        self.log, self.tag = log, tag

    def fire(self) -> None:
        self.log.append(self.tag)


@contextmanager
def _heap(native: bool):
    """The loop's heap sifted by its own code (`native`: what runs compiled) or by heapq (what runs as Python)."""
    was = timers._NATIVE
    timers._NATIVE = native
    try:
        yield
    finally:
        timers._NATIVE = was


@settings(max_examples=40, deadline=None)
@given(times=st.lists(st.integers(0, 6).map(lambda k: k / 4), min_size=1, max_size=300), native=st.booleans())
def test_the_heap_pops_by_time_then_id(times, native):
    """Hundreds of timers, many at one instant (a heap of depth 8): they fire by time, ties by the order set."""
    with _heap(native):
        env = simpy.Environment()
        lp, log = loop(env), []
        for i, t in enumerate(times):
            lp.set_at(_Logged(log, i), t)
        assert env.peek() == min(times)
        drive_queue(env)
        assert env.peek() == float("inf")
    assert log == sorted(range(len(times)), key=lambda i: (times[i], i))


@settings(max_examples=40, deadline=None)
@given(
    delays=st.lists(st.sampled_from([0.0, 0.25, 0.5, 1.0]), min_size=1, max_size=60),
    native=st.booleans(),
    data=st.data(),
)
def test_many_timers_run_as_timeouts_would(delays, native, data):
    """A deeper heap than _trace's: every timer sets a follow-up, mixed with SimPy timeouts, both drivers."""
    mixed = data.draw(st.lists(st.booleans(), min_size=len(delays), max_size=len(delays)))
    ref = _trace(delays, [False] * len(delays))
    with _heap(native):
        assert _trace(delays, mixed) == ref
        assert _trace(delays, mixed, drive_queue) == ref


def _until_trace(use_call_in: bool):
    env = simpy.Environment()
    log = []
    for i, d in enumerate([0.5, 1.0, 1.0, 1.5, 2.0]):
        if use_call_in:
            call_in(env, d, lambda _e, i=i: log.append((env.now, i)))
        else:
            env.timeout(d).callbacks.append(lambda _e, i=i: log.append((env.now, i)))  # type: ignore[union-attr]
    env.run(until=1.0)  # SimPy's stop comes before the timers of that instant (URGENT)
    log.append(("stopped", env.now, env.peek()))
    env.run()
    return log, next(env._eid)


def test_env_run_until_stops_timers_as_it_stops_timeouts():
    ref = _until_trace(False)
    assert ref[0][:2] == [(0.5, 0), ("stopped", 1.0, 1.0)]  # the reference is what the docs say
    assert _until_trace(True) == ref


def test_the_loop_continues_simpy_s_event_ids():
    """A loop installed after SimPy events were set takes the next id SimPy would have given: a timer set after a
    timeout of the same instant runs after it, one set before a later timeout runs before it, no id skipped."""
    env = simpy.Environment()
    log = []
    env.timeout(1.0).callbacks.append(lambda _e: log.append("timeout 1"))  # type: ignore[union-attr]
    call_in(env, 1.0, lambda _e: log.append("timer 1"))
    call_in(env, 2.0, lambda _e: log.append("timer 2"))
    env.timeout(2.0).callbacks.append(lambda _e: log.append("timeout 2"))  # type: ignore[union-attr]
    assert env.peek() == 1.0
    drive_queue(env)
    assert log == ["timeout 1", "timer 1", "timer 2", "timeout 2"]
    assert next(env._eid) == 4 and env.now == 2.0


def test_the_loop_sifts_its_own_heap_only_when_compiled():
    """As Python (the tests' default) heapq sifts; in a child with the compiled modules, the loop's own code."""
    import os
    import subprocess
    import sys

    import pytest

    from simulator.compiled import current

    assert timers._NATIVE is False
    if not current():
        if os.environ.get("HACKSIM_REQUIRE_COMPILED"):
            pytest.fail("the compiled modules are not built or not current: make compiled")
        pytest.skip("the compiled modules are not built (make compiled)")
    env = {k: v for k, v in os.environ.items() if k != "HACKSIM_PURE_PYTHON"}
    code = "import simulator, simulator.timers as t; print('timers' in simulator.COMPILED, t._NATIVE)"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True).stdout
    assert out.split() == ["True", "True"]
