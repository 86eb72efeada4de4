"""Sweep speed: 1,000 points of the default scenario at 2,000 requests each, one method per point.

    python benchmarks/sweep_speed.py [--sweep scenarios/sweeps/sweep_speed_1000.yaml] [--jobs N] [--json PATH]

Times the whole `sweep` path from a cold point cache (expanding and validating the points, hashing,
the process pool, writing the cache and the table), then the same sweep again from the cache
(what resuming costs). Beside it, the serial time of one point (the same simulation in this
process, after a warm-up), so the bound is explicit: points x per-point time / workers. Target on
the 2-core development machine: under 2 minutes.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from planning.executor import Executor, Task, simulate_point  # noqa: E402
from planning.sweep import load_sweep, prepare_points, run_sweep, write_table  # noqa: E402

TARGET_S = 120.0


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sweep", default="scenarios/sweeps/sweep_speed_1000.yaml")
    ap.add_argument("--jobs", type=int, default=None, help="workers (default: one per core)")
    ap.add_argument("--serial-sample", type=int, default=20, help="points timed one by one in this process")
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()

    load_before = os.getloadavg()[0]  # other work on the machine shares the cores; recorded beside the time
    spec, base = load_sweep(ROOT / args.sweep)
    t = time.perf_counter()
    points = prepare_points(spec, base, args.sweep)
    prepare_s = time.perf_counter() - t
    n, requests = len(points), points[0][1].workload.requests

    # serial per-point time: warm up (imports, profile loading), then time a spread of points
    sample = [points[i][1] for i in range(0, n, max(1, n // args.serial_sample))][: args.serial_sample]
    simulate_point(Task.of(sample[0]).scenario_json)
    per_point = []
    for s in sample:
        js = Task.of(s).scenario_json
        t = time.perf_counter()
        simulate_point(js)
        per_point.append(time.perf_counter() - t)
    point_s = statistics.mean(per_point)

    with tempfile.TemporaryDirectory() as tmp:
        cache = Path(tmp) / ".cache"
        t = time.perf_counter()
        with Executor("pool", jobs=args.jobs, cache_dir=cache) as ex:
            result = run_sweep(spec, base, ex, source=args.sweep)
            write_table(result.table, Path(tmp))
        cold_s = time.perf_counter() - t
        workers = result.stats.workers
        t = time.perf_counter()
        with Executor("pool", jobs=args.jobs, cache_dir=cache) as ex:
            again = run_sweep(spec, base, ex, source=args.sweep)
        resume_s = time.perf_counter() - t
    assert again.stats.simulated == 0 and again.table.equals(result.table)
    errors = int((result.table["error"] != "").sum())

    bound_s = n * point_s / workers
    rev = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout
    out = {
        "sweep": args.sweep,
        "points": n,
        "requests_per_point": requests,
        "methods_per_point": 1,
        "rows": len(result.table),
        "rows_with_errors": errors,
        "wall_s": round(cold_s, 2),
        "target_s": TARGET_S,
        "met_target": cold_s < TARGET_S,
        "points_per_s": round(n / cold_s, 2),
        "simulated_requests_per_s": round(n * requests / cold_s),
        "workers": workers,
        "serial_point_s": round(point_s, 4),
        "serial_point_s_min_max": [round(min(per_point), 4), round(max(per_point), 4)],
        "ideal_wall_s": round(bound_s, 2),
        "parallel_efficiency": round(bound_s / cold_s, 3),
        "prepare_points_s": round(prepare_s, 3),
        "resume_all_cached_s": round(resume_s, 2),
        "load_average_1m_before": round(load_before, 2),
        "load_average_1m_after": round(os.getloadavg()[0], 2),
        "machine": f"{platform.machine()} {os.cpu_count()} cores, Python {platform.python_version()}",
        "git_revision": rev.strip(),
    }
    print(json.dumps(out, indent=2))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(out, indent=2) + "\n")


if __name__ == "__main__":
    main()
