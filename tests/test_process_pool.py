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


def _cgroup(tmp_path, files: dict[str, str]):
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    return tmp_path


def test_a_cpu_quota_caps_the_cores(tmp_path, monkeypatch):
    monkeypatch.setattr(process_pool.os, "sched_getaffinity", lambda pid: set(range(64)), raising=False)
    v2 = _cgroup(tmp_path / "v2", {"cpu.max": "200000 100000\n"})
    assert process_pool.cgroup_cpu_quota(v2) == 2.0 and process_pool.usable_cores(v2) == 2
    assert process_pool.usable_cores(_cgroup(tmp_path / "half", {"cpu.max": "150000 100000\n"})) == 2  # 1.5: up
    assert process_pool.usable_cores(_cgroup(tmp_path / "tiny", {"cpu.max": "10000 100000\n"})) == 1
    assert process_pool.usable_cores(_cgroup(tmp_path / "none", {"cpu.max": "max 100000\n"})) == 64
    v1 = _cgroup(tmp_path / "v1", {"cpu/cpu.cfs_quota_us": "300000\n", "cpu/cpu.cfs_period_us": "100000\n"})
    assert process_pool.usable_cores(v1) == 3
    v1_none = _cgroup(tmp_path / "v1n", {"cpu/cpu.cfs_quota_us": "-1\n", "cpu/cpu.cfs_period_us": "100000\n"})
    assert process_pool.usable_cores(v1_none) == 64
    # no cgroup files, or unreadable ones: the affinity alone
    assert process_pool.usable_cores(tmp_path / "missing") == 64
    assert process_pool.usable_cores(_cgroup(tmp_path / "bad", {"cpu.max": "lots\n"})) == 64
    # a quota above the affinity leaves the affinity
    monkeypatch.setattr(process_pool.os, "sched_getaffinity", lambda pid: {0, 1}, raising=False)
    assert process_pool.usable_cores(v1) == 2
