"""Process pools as the CLI's long commands run them: the cores a pool may use, a worker that leaves signals to its
parent and ends with it, a map over items in order with a progress display, and ending a pool at once (a signal, an
error). Shared by the sweep's executor (planning/executor.py), cross-validation's folds (simulator/crossval.py) and
validate's index (simulator/validate.py)."""

from __future__ import annotations

import math
import os
import signal
import sys
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path
from typing import Any

# what map_in_processes tells a progress display: the count of items, a label and a unit; its context's advance()
# once per result (cli.py: reports.terminal.ProgressBar)
Progress = Callable[[int, str, str], AbstractContextManager[Any]]


CGROUP_ROOT = Path("/sys/fs/cgroup")


def usable_cores(cgroup_root: Path = CGROUP_ROOT) -> int:
    """The cores this process may use: those it may run on (`taskset`, a cpuset), and no more than a CPU quota
    allows (a container's `--cpus`, a Kubernetes limit: the cgroup's quota over its period, rounded up). A quota
    is no affinity: a container limited to 2 CPUs of a 64-core host is shown all 64, and a pool of 64 processes
    there runs each at a thirty-second of a core, its memory 64 times over."""
    try:
        cores = len(os.sched_getaffinity(0)) or 1
    except AttributeError:  # not Linux
        cores = os.cpu_count() or 1
    quota = cgroup_cpu_quota(cgroup_root)
    return cores if quota is None else max(1, min(cores, math.ceil(quota)))


def cgroup_cpu_quota(root: Path = CGROUP_ROOT) -> float | None:
    """The CPUs the cgroup's quota allows (quota / period), None where there is none or it cannot be read: cgroup
    v2's `cpu.max` ("max 100000": none), else v1's `cpu.cfs_quota_us` (-1: none) and `cpu.cfs_period_us`, as a
    container sees its own cgroup at the root (the kernel's Documentation/admin-guide/cgroup-v2.rst, "cpu.max", and
    Documentation/scheduler/sched-bwc.rst for v1)."""
    try:
        v2 = root / "cpu.max"
        if v2.is_file():
            quota, period = v2.read_text().split()[:2]
            return None if quota == "max" else _share(float(quota), float(period))
        v1 = root / "cpu"
        quota_us = float((v1 / "cpu.cfs_quota_us").read_text())
        return None if quota_us < 0 else _share(quota_us, float((v1 / "cpu.cfs_period_us").read_text()))
    except (OSError, ValueError):
        return None


def _share(quota: float, period: float) -> float | None:
    return quota / period if quota > 0 and period > 0 else None


def end_now(pool: ProcessPoolExecutor) -> None:
    """Drop the queued work and end the workers instead of waiting for them.

    Order matters. `shutdown(wait=False, cancel_futures=True)` first, so the pool's manager thread is told to stop
    and no new work goes out; then the workers are terminated and joined; then the manager thread is joined (with
    a bound), because it closes the pool's wake-up pipe once it sees the workers gone and Python's exit hook for
    process pools writes to that pipe: racing the close, it printed a "Bad file descriptor" traceback after the
    interrupted message. A `shutdown(wait=True)` after terminating the workers instead can wait forever on a
    manager thread that died of the broken pool."""
    procs = list((getattr(pool, "_processes", None) or {}).values())
    manager = getattr(pool, "_executor_manager_thread", None)
    pool.shutdown(wait=False, cancel_futures=True)
    for p in procs:
        p.terminate()
    for p in procs:
        p.join(timeout=5)
    if manager is not None:
        manager.join(timeout=10)


def worker_init(parent_pid: int) -> None:
    """A pool worker's start. Ctrl-C and a hangup reach the whole process group; only the parent acts on them (it
    ends the workers), so a worker never dies mid-result. A worker ends on SIGTERM, and on Linux also when the parent
    dies, even by SIGKILL: no orphans."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    if not sys.platform.startswith("linux"):
        return
    try:
        import ctypes

        PR_SET_PDEATHSIG = 1
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    except (OSError, AttributeError):
        return
    if os.getppid() != parent_pid:  # the parent died before prctl took effect
        os._exit(1)


def map_in_processes(
    fn, items: list, workers: int, progress: Progress | None = None, what: tuple[str, str] = ("", "")
) -> list:
    """fn over items, in order, in `workers` processes when > 1 (fn and the items picklable). `progress` is called
    with the count and `what` (a label, a unit) and its context's `advance()` once per result. Any exception in the
    caller while they run (a signal turned into one) ends the workers before it goes on."""
    with progress(len(items), *what) if progress is not None and items else nullcontext() as bar:
        if workers <= 1 or len(items) < 2:
            out = []
            for x in items:
                out.append(fn(x))
                if bar is not None:
                    bar.advance()
            return out
        # no more processes than items: a fork-started pool starts all of them at once, and a core count can be 100+
        pool = ProcessPoolExecutor(
            max_workers=min(workers, len(items)), initializer=worker_init, initargs=(os.getpid(),)
        )
        try:
            out = []
            for r in pool.map(fn, items):
                out.append(r)
                if bar is not None:
                    bar.advance()
        except BaseException:
            end_now(pool)  # the workers ended, the manager thread joined: no traceback at exit
            raise
        pool.shutdown(wait=True)
        return out
