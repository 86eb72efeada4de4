"""Run many scenario points: a content-addressed disk cache in front of a process pool or Ray tasks.

A point is one resolved `Scenario`; its key is sha256 of a code-version salt,
`scenario.model_dump_json()` and the calibration profiles the scenario is priced with, so two
points that resolve to the same scenario run once, and a rerun (an interrupted sweep, or `plan`
after `sweep`) reads finished points from `DIR/.cache/<key[:2]>/<key>.json` instead of simulating
them again. The salt hashes the source that decides every point's numbers (simulator, cost model,
catalogs), and each point adds the profile files its prefill and decode pools use, so editing any of
them invalidates the points they price instead of serving stale results, while a file added under
`kernels_calibration/profiles/` (or another GPU's profile re-measured) leaves the other points cached.

Each point runs every method of its scenario separately through `run_scenario`, so one method
that does not fit (say FP16 KV larger than a decode replica) becomes that method's error without
losing the others. Workers return only the summaries (a few KB), never request tables.

Backends: `serial` (in this process; for tests and jobs=1), `pool` (concurrent.futures
ProcessPoolExecutor, the default, one worker per core), `ray` (Ray tasks on a local Ray this
starts, or on the cluster at `ray_address`; `planning/raycluster.py` connects, and Ray is imported
only there, only when asked for).
"""

from __future__ import annotations

import concurrent.futures as cf
import contextlib
import hashlib
import json
import os
import signal
import sys
import time
from collections.abc import Iterable
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from simulator.files import strict_json, unjson_inf
from simulator.process_pool import end_now, usable_cores, worker_init

from . import ROOT, PlanningError

# Bumped when the shape of a cached result changes.
RESULT_VERSION = "1"
# What decides a point's numbers besides its scenario JSON: instance facts (network, host memory,
# intra-node bandwidth) are looked up by key at run time; the calibration profiles a point uses are
# hashed into its own key (profile_files).
SALT_GLOBS = ("simulator/**/*.py", "costmodel/**/*.py", "catalog/*.py", "catalog/data/*")


# The exit status when the Ray cluster's head stops answering during a run.
EXIT_CLUSTER_LOST = 3


def command_line() -> str:
    """The command that is running, as a shell would take it again (`python cli.py ...` for a script)."""
    import shlex

    argv = list(sys.argv)
    if argv and argv[0].endswith(".py"):
        argv.insert(0, "python")
    return shlex.join(argv)


# ---- stopping on signals ------------------------------------------------------------------------
class Interrupted(KeyboardInterrupt):
    """A run stopped by SIGINT (Ctrl-C), SIGTERM (`kill`, `timeout`, batch schedulers) or SIGHUP."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum

    @property
    def name(self) -> str:
        return signal.Signals(self.signum).name


STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


@contextlib.contextmanager
def stop_on_signals():
    """Turn the first SIGINT/SIGTERM/SIGHUP into `Interrupted` in the main thread, so the executor ends
    its workers and the caller says how to resume; later ones are ignored while that cleanup runs (a
    second Ctrl-C must not tear it apart with a traceback). Outside the main thread, a no-op."""
    fired: list[int] = []
    owner = os.getpid()

    def handler(signum, _frame):
        if os.getpid() != owner:
            # A forked pool worker inherits this handler until its initializer resets it: a SIGTERM
            # there (the parent ending its workers) ends it as the default would, with no traceback;
            # Ctrl-C and SIGHUP reach the parent too, which acts on them.
            if signum == signal.SIGTERM:
                signal.signal(signum, signal.SIG_DFL)
                os.kill(os.getpid(), signum)
            return
        if not fired:
            fired.append(signum)
            raise Interrupted(signum)

    try:
        old = {s: signal.signal(s, handler) for s in STOP_SIGNALS}
    except ValueError:  # not the main thread: signals cannot be handled here
        yield
        return
    try:
        yield
    finally:
        for s, h in old.items():
            signal.signal(s, h)


# ---- keys and cache ---------------------------------------------------------------------------
@lru_cache(maxsize=1)
def code_salt() -> str:
    h = hashlib.sha256(f"hacksim-point-v{RESULT_VERSION}".encode())
    files = sorted({p for g in SALT_GLOBS for p in ROOT.glob(g) if p.is_file() and "__pycache__" not in p.parts})
    for p in files:
        h.update(str(p.relative_to(ROOT)).encode())
        h.update(p.read_bytes())
    return h.hexdigest()


def profile_files(scenario) -> list[Path]:
    """The calibration profile files the scenario's prefill and decode pools are priced with (none for
    a roofline profile; a profile that cannot be read is the point's error, so it adds nothing here), and
    the measurements its methods' implementation profiles read."""
    from simulator.config import ScenarioError
    from simulator.resolve import resolve

    try:
        res = resolve(scenario, "point")
    except ScenarioError:
        return []
    from simulator.implementations import measurement_files

    return sorted(
        {Path(p.path) for p in (res.prefill.profile, res.decode.profile) if p.path}
        | set(measurement_files(scenario.methods))
    )


def point_key(scenario_json: str, profiles: Iterable[Path] = ()) -> str:
    h = hashlib.sha256((code_salt() + "\n" + scenario_json).encode())
    for p in profiles:
        h.update(b"\n" + p.read_bytes())
    return h.hexdigest()


@dataclass(frozen=True)
class Task:
    """One simulation to run: the resolved scenario as JSON, addressed by its key."""

    key: str
    scenario_json: str

    @classmethod
    def of(cls, scenario) -> Task:
        js = scenario.model_dump_json()
        return cls(point_key(js, profile_files(scenario)), js)


class PointCache:
    """One JSON file per finished point; writes are atomic (temp file + rename), so a kill mid-write
    leaves either the old state or the whole file."""

    def __init__(self, root: Path | None):
        self.root = None if root is None else Path(root)

    @staticmethod
    def _path(root: Path, key: str) -> Path:
        return root / key[:2] / f"{key}.json"

    def get(self, key: str) -> dict | None:
        if self.root is None:
            return None
        try:
            return unjson_inf(json.loads(self._path(self.root, key).read_text()))
        except (OSError, ValueError):
            return None

    def put(self, key: str, result: dict) -> None:
        if self.root is None or result.get("transient"):
            return
        path = self._path(self.root, key)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".tmp{os.getpid()}")
        tmp.write_text(strict_json(result, indent=None))
        os.replace(tmp, path)


# ---- the work of one point (runs in a worker) ----------------------------------------------------
def simulate_point(scenario_json: str) -> dict:
    """{"requests": n, "methods": {name: {"summary": {...}} | {"error": "one line"}}}.

    A `ScenarioError` (the model or a request's KV does not fit, ...) is deterministic and is cached
    as the method's error; any other exception marks the result transient so a rerun retries it."""
    from simulator.config import Scenario, ScenarioError
    from simulator.run import run_scenario

    s = Scenario.model_validate_json(scenario_json)
    out: dict = {"requests": s.workload.requests, "methods": {}}
    for m in s.methods:
        name = m.output_name
        try:
            r = run_scenario(s, source="point", methods=[name], sink=_no_tables)
            out["methods"][name] = {"summary": r.summary["methods"][name]}
        except ScenarioError as e:
            out["methods"][name] = {"error": str(e).removeprefix("point: ")}
        except Exception as e:  # noqa: BLE001 - a bug in one point must not end the sweep
            out["methods"][name] = {"error": f"{type(e).__name__}: {e}".splitlines()[0]}
            out["transient"] = True
    return out


def _no_tables(*_tables) -> None:
    """A point needs its summary only: its per-request tables are never built."""


def _warm_worker(parent_pid: int) -> None:
    """Import the simulator once per worker, not once per point; signals as process_pool.worker_init leaves them
    (the parent stops the workers; a worker ends with it)."""
    worker_init(parent_pid)
    import simulator.run  # noqa: F401


# ---- backends -------------------------------------------------------------------------------------
@dataclass
class Stats:
    simulated: int = 0  # points actually simulated in this run
    cached: int = 0  # points read from the cache
    wall_s: float = 0.0
    backend: str = ""
    workers: int = 0


class Executor:
    """Runs batches of tasks; keeps its pool or Ray connection open between batches (plan runs many).

    Use as a context manager. `run(tasks)` returns {key: result} for every task."""

    def __init__(
        self,
        backend: str = "pool",
        jobs: int | None = None,
        ray_address: str | None = None,
        cache_dir: Path | None = None,
        label: str = "sweep",
        connect_timeout_s: float = 30.0,
        progress: bool = True,
    ):
        if backend not in ("serial", "pool", "ray"):
            raise PlanningError(f"unknown backend {backend!r}; use serial, pool or ray")
        if jobs is not None and jobs < 1:
            raise PlanningError(f"--jobs must be >= 1, got {jobs}")
        self.backend = backend
        self.jobs = jobs or usable_cores()
        self.ray_address = ray_address
        self.connect_timeout_s = connect_timeout_s
        self.progress = progress
        self.cache = PointCache(cache_dir)
        self.label = label
        self.stats = Stats(backend=backend)
        self._pool: cf.ProcessPoolExecutor | None = None
        self._ray = None
        self._ray_started = False
        self._ray_fn = None
        self._ray_output = None  # raycluster.RayOutput while a Ray this started runs
        self._watch = None  # raycluster.HeadWatch on that Ray's head

    def __enter__(self) -> Executor:
        if self.backend == "ray":
            self._start_ray()
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None
        if self._watch is not None:
            self._watch.stop()
            self._watch = None
        if self._ray is not None and self._ray_started:
            self._ray.shutdown()
        self._ray = None
        if self._ray_output is not None:
            self._ray_output.restore()
            self._ray_output = None

    def _kill_pool(self) -> None:
        """Stop now (Ctrl-C, an error): drop queued points and end the workers instead of waiting for
        them; finished points are already in the cache."""
        pool, self._pool = self._pool, None
        if pool is None:
            return
        end_now(pool)

    # -- Ray --
    def _start_ray(self) -> None:
        from . import raycluster

        ray = raycluster.import_ray(self.ray_address)
        if not ray.is_initialized():  # else: a Ray the caller started; it is the caller's to stop
            self._ray_output = raycluster.RayOutput()
            try:
                if self.ray_address:
                    raycluster.connect(ray, self.ray_address, self.connect_timeout_s)
                else:
                    raycluster.start_local(ray, self.jobs, self.connect_timeout_s)
            except BaseException:
                self._ray_output.restore()
                self._ray_output = None
                raise
            self._ray_started = True
            head = raycluster.gcs_address(ray, self.ray_address)
            if head is not None:
                from reports.terminal import json_errors_on

                as_json = json_errors_on()  # read here: the watch thread has a context of its own
                self._watch = raycluster.HeadWatch(
                    head, self.connect_timeout_s, lambda s: self._head_lost(head, s, as_json)
                )
                self._watch.start()
        self._ray = ray
        self._ray_fn = self._ray.remote(num_cpus=1, max_retries=2)(simulate_point)
        self.stats.workers = int(self._ray.cluster_resources().get("CPU", 0))

    def _head_lost(self, head: str, seconds: float, as_json: bool) -> None:
        """In the watch thread: say that the head is gone, what is cached and how to resume, and end the
        process now (Ray's calls would wait for the head, and its exit hooks too)."""
        from reports.terminal import to_json

        cache = self.cache.root
        kept = (
            f"the {self.stats.simulated} point(s) finished in this run are cached in {cache}; once the cluster is "
            f"back, run the same command to resume: {command_line()}"
            if cache is not None
            else "give --out DIR to keep finished points for a rerun"
        )
        message = f"the Ray head at {head} has not answered for {seconds:.0f} s (--ray-timeout): {kept}"
        try:
            sys.stderr.write(f"\nerror: {message}\n")
            sys.stderr.flush()
            if as_json and self._ray_output is not None:
                self._ray_output.write_result(to_json({"error": message}) + "\n")
        finally:
            os._exit(EXIT_CLUSTER_LOST)

    # -- dispatch --
    def run(self, tasks: Iterable[Task], progress: bool | None = None) -> dict[str, dict]:
        """{key: result} for every task; a progress bar on a terminal unless `progress` (default: the
        executor's) is False."""
        from reports.terminal import ProgressBar  # here, not at the top: workers import this module without reports

        t0 = time.monotonic()
        unique: dict[str, Task] = {}
        for t in tasks:
            unique.setdefault(t.key, t)
        results: dict[str, dict] = {}
        todo = []
        with ProgressBar(
            len(unique) if (self.progress if progress is None else progress) else 0, self.label, "points"
        ) as bar:
            for key, task in unique.items():
                hit = self.cache.get(key)
                if hit is not None:
                    results[key] = hit
                    self.stats.cached += 1
                    bar.advance(cached=True, error=_has_error(hit))
                else:
                    todo.append(task)
            try:
                for key, result in self._dispatch(todo):
                    self.cache.put(key, result)
                    results[key] = result
                    self.stats.simulated += 1
                    bar.advance(error=_has_error(result))
            finally:
                self.stats.wall_s += time.monotonic() - t0
        return results

    def _dispatch(self, todo: list[Task]):
        if not todo:
            return
        if self.backend == "serial" or (self.backend == "pool" and (self.jobs == 1 or len(todo) == 1)):
            self.stats.workers = max(self.stats.workers, 1)
            for t in todo:
                yield t.key, simulate_point(t.scenario_json)
        elif self.backend == "pool":
            if self._pool is None:
                # Python forks every worker of a pool up front: no more than there are points to run.
                workers = min(self.jobs, len(todo))
                self._pool = cf.ProcessPoolExecutor(
                    max_workers=workers, initializer=_warm_worker, initargs=(os.getpid(),)
                )
                self.stats.workers = workers
            futures = {self._pool.submit(simulate_point, t.scenario_json): t.key for t in todo}
            try:
                for f in cf.as_completed(futures):
                    yield futures[f], f.result()
            except BaseException:
                self._kill_pool()
                raise
        else:
            if self._ray is None or self._ray_fn is None:
                self._start_ray()
            ray, ray_fn = self._ray, self._ray_fn
            assert ray is not None and ray_fn is not None  # _start_ray sets both
            refs = {ray_fn.remote(t.scenario_json): t.key for t in todo}
            pending = list(refs)
            try:
                while pending:
                    done, pending = ray.wait(pending, num_returns=min(len(pending), 64), timeout=0.5)
                    for ref in done:
                        yield refs[ref], ray.get(ref)
            except Exception:
                if self._watch is not None:
                    self._watch.settle(self.connect_timeout_s + 5)  # a lost head: the watch ends the process
                raise
            except BaseException:
                for ref in pending:
                    ray.cancel(ref, force=True)
                raise


def _has_error(result: dict) -> bool:
    return any("error" in m for m in result.get("methods", {}).values()) or "error" in result
