"""Stopping a sweep: SIGTERM (kill, timeout, schedulers) and Ctrl-C end every worker process, keep the
finished points in the cache, say how to resume, and print no traceback; a parent killed outright
(SIGKILL) takes its workers with it. Orphans are looked for by PID.

Nothing here depends on the machine's speed: each wait polls for its condition and returns as soon as it
holds; DEADLINE_S bounds a wait only so that a hang fails rather than blocks (no passing run comes near it,
however loaded the machine). The slow points are a million requests each: over a minute of CPU at the
simulator's 12-15k requests/s, where the signal reaches them a second or two after they start, so they do not
finish first however the machine's load stalls this test's polling (at 100,000 they took 10 s, which a
loaded machine could reach)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
DEADLINE_S = 300
SLOW_REQUESTS = 1_000_000

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")


def _children(pid: int) -> list[int]:
    kids = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if fields[1] == str(pid):
            kids.append(int(stat.parent.name))
    return kids


def _running(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _wait(predicate, seconds: float = DEADLINE_S) -> bool:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        if predicate():
            return True
        time.sleep(0.1)
    return predicate()


def _start_sweep(tmp_path: Path) -> tuple[subprocess.Popen, Path, list[int]]:
    """Two quick points and two that run for minutes, on two workers: returns once the quick ones are
    cached and both workers are busy with the slow ones (a worker takes a slow point as soon as its quick one
    is done)."""
    sweep = tmp_path / "sweep.yaml"
    sweep.write_text(
        yaml.safe_dump(
            {
                "base": str(ROOT / "scenarios" / "a10g_10gbps.yaml"),
                "set": {"methods": ["baseline"]},
                "axes": {"workload.requests": [20, 21, SLOW_REQUESTS, SLOW_REQUESTS + 1]},
            }
        )
    )
    out = tmp_path / "out"
    proc = subprocess.Popen(
        [sys.executable, str(ROOT / "cli.py"), "sweep", str(sweep), "--out", str(out), "--jobs", "2", "--no-report"],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    cached = lambda: len(list((out / ".cache").glob("*/*.json")))  # noqa: E731
    try:
        assert _wait(lambda: cached() >= 2 or proc.poll() is not None), "the quick points never finished"
        assert proc.poll() is None, proc.communicate()
        workers = _children(proc.pid)
        assert len([w for w in workers if _running(w)]) >= 2, workers
    except BaseException:
        os.killpg(proc.pid, signal.SIGKILL)
        raise
    return proc, out, workers


@pytest.mark.parametrize("sig, to_group", [(signal.SIGTERM, False), (signal.SIGINT, True)], ids=["SIGTERM", "Ctrl-C"])
def test_signal_ends_workers_keeps_cache_and_says_how_to_resume(tmp_path, sig, to_group):
    proc, out, workers = _start_sweep(tmp_path)
    try:
        (os.killpg if to_group else os.kill)(proc.pid, sig)  # a terminal's Ctrl-C reaches the whole group
        _, stderr = proc.communicate(timeout=DEADLINE_S)
        gone = _wait(lambda: not any(_running(w) for w in workers))
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        orphans = [w for w in workers if _running(w)]
        for w in orphans:  # the test's own processes, by PID, if the check below fails
            os.kill(w, signal.SIGKILL)
    assert gone and not orphans, f"orphaned workers {orphans}"
    assert proc.returncode == 128 + sig, stderr
    assert "Traceback" not in stderr
    lines = stderr.strip().splitlines()
    assert len(lines) == 1 and f"interrupted by {signal.Signals(sig).name}" in lines[0], stderr
    assert str(out / ".cache") in lines[0] and "run the same command to resume: python " in lines[0]
    assert len(list((out / ".cache").glob("*/*.json"))) == 2
    assert not (out / "results.csv").exists()


def test_workers_die_with_a_killed_parent(tmp_path):
    proc, _, workers = _start_sweep(tmp_path)
    os.kill(proc.pid, signal.SIGKILL)
    try:
        assert _wait(lambda: not any(_running(w) for w in workers)), f"orphaned workers {workers}"
    finally:
        for w in workers:  # the test's own processes, by PID, if the check failed
            if _running(w):
                os.kill(w, signal.SIGKILL)
        proc.communicate(timeout=DEADLINE_S)


def test_killing_the_pool_waits_for_its_manager_thread():
    """Python's exit hook for process pools writes to the pool's wake-up pipe while the pool's manager thread
    closes it: a sweep stopped by SIGTERM printed an `OSError: [Errno 9] Bad file descriptor` traceback after
    its message (1 run in 8). Once `_kill_pool` returns, the manager thread has ended, so there is no race."""
    import concurrent.futures as cf

    from planning.executor import Executor

    ex = Executor("pool", jobs=2)
    ex._pool = cf.ProcessPoolExecutor(max_workers=2)
    futures = [ex._pool.submit(time.sleep, 60) for _ in range(4)]
    futures[0].running() or time.sleep(0.5)
    manager = ex._pool._executor_manager_thread
    assert manager is not None and manager.is_alive()
    ex._kill_pool()
    assert not manager.is_alive()


def test_a_forked_worker_ends_quietly_on_sigterm_before_its_initializer():
    """A pool worker is forked with the parent's handler, which raised `Interrupted` in the worker (a traceback
    from the child) when the parent ended its workers before their initializer had reset it."""
    from planning.executor import stop_on_signals

    with stop_on_signals():
        pid = os.fork()
        if pid == 0:  # the child: what a worker does between fork and its initializer
            try:
                os.kill(os.getpid(), signal.SIGTERM)
                time.sleep(30)
                os._exit(0)
            except BaseException:
                os._exit(3)
        _, status = os.waitpid(pid, 0)
    assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGTERM, status


def test_the_pool_forks_no_more_workers_than_there_are_points(base_file):
    """Python forks every worker of a pool up front: --jobs 8 for two points forks two."""
    import yaml

    from planning.executor import Executor, Task
    from simulator.config import parse_scenario

    raw = yaml.safe_load(base_file.read_text())
    tasks = [Task.of(parse_scenario({**raw, "workload": {**raw["workload"], "seed": s}}, "t")) for s in (1, 2)]
    with Executor("pool", jobs=8) as ex:
        ex.run(tasks, progress=False)
        assert ex.stats.workers == 2
