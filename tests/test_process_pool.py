"""simulator/process_pool.py: the map the long commands run their work through (validate, validate --cv, calibrate):
in order, one progress step per result, no more processes than items, and the same results in one process."""

from __future__ import annotations

import os

from simulator import process_pool
from tests.progress_spy import ProgressSpy


def _square(x: int) -> tuple[int, int]:
    return x * x, os.getpid()


def test_results_come_in_order_with_a_step_each_in_processes_and_in_one():
    for workers in (1, 3):
        bar = ProgressSpy()
        out = process_pool.map_in_processes(_square, list(range(7)), workers, bar, ("squaring", "items"))
        assert [r for r, _ in out] == [x * x for x in range(7)]
        assert bar.shown == [[7, "squaring", "items", 7]]
        if workers == 1:
            assert {p for _, p in out} == {os.getpid()}
        else:
            assert os.getpid() not in {p for _, p in out}


def test_no_more_processes_than_items(monkeypatch):
    started: list[int] = []
    real = process_pool.ProcessPoolExecutor

    def spy(max_workers, **kw):
        started.append(max_workers)
        return real(max_workers=max_workers, **kw)

    monkeypatch.setattr(process_pool, "ProcessPoolExecutor", spy)
    assert [r for r, _ in process_pool.map_in_processes(_square, [2, 3], 64)] == [4, 9]
    assert started == [2]


def test_nothing_to_do_shows_no_progress():
    bar = ProgressSpy()
    assert process_pool.map_in_processes(_square, [], 4, bar) == []
    assert bar.shown == []
