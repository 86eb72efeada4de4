"""Ending a `concurrent.futures.ProcessPoolExecutor` at once (a signal, an error), and the cores a pool may use,
shared by the sweep's executor (planning/executor.py) and cross-validation's folds (simulator/crossval.py)."""

from __future__ import annotations

import os
from concurrent.futures import ProcessPoolExecutor


def usable_cores() -> int:
    """The cores this process may run on (a container's or `taskset`'s share, where the OS says)."""
    try:
        return len(os.sched_getaffinity(0)) or 1
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


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
