"""Simulator speed: simulated requests per wall-second, start-up time and peak memory.

    python benchmarks/sim_speed.py [--requests 100000] [--method hack] [--scenario scenarios/a10g_10gbps.yaml]
                                   [--set path.to.field=value ...]

Start-up is the wall time from interpreter start to a validated scenario with its requests drawn
and cost models built (imports included); the event loop is timed separately, in wall and CPU time (on
a shared machine the CPU time says more about the code; the 1-minute load average is recorded beside
both). Results are printed and, with --json, written for committing (benchmarks/results/) with their
provenance: git revision, date, command, machine and versions, and which simulator modules ran compiled
(simulator/compiled.py; none where HACKSIM_PURE_PYTHON=1, or in a tree from before them).
benchmarks/paired.py runs it back to back against older revisions.
"""

from __future__ import annotations

import time

T0 = time.perf_counter()

import argparse  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import platform  # noqa: E402
import resource  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
from pathlib import Path  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import simulator  # noqa: E402
from simulator.load import load_scenario  # noqa: E402
from simulator.resolve import resolve  # noqa: E402
from simulator.run import MethodRun, summarize  # noqa: E402
from simulator.workload import make_requests  # noqa: E402

sys.path.insert(0, str(ROOT / "benchmarks"))
from scale_1m import cpu_model, versions  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--scenario", default="scenarios/a10g_10gbps.yaml")
    ap.add_argument("--requests", type=int, default=100_000)
    ap.add_argument("--method", default="hack")
    ap.add_argument("--set", action="append", default=[], help="path.to.field=value (repeatable)")
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()

    s = load_scenario(args.scenario, [f"workload.requests={args.requests}", *args.set])
    res = resolve(s, args.scenario)
    reqs = make_requests(s)
    cfg = next(m for m in s.methods if m.output_name == args.method)
    run = MethodRun(res, cfg, reqs, args.scenario)
    startup_s = time.perf_counter() - T0

    load_before = os.getloadavg()[0]
    t, cpu = time.perf_counter(), time.process_time()
    run.simulate()
    loop_s, loop_cpu_s = time.perf_counter() - t, time.process_time() - cpu
    t = time.perf_counter()
    df = run.requests_frame()
    summary = summarize(run)
    collect_s = time.perf_counter() - t
    peak_rss_bytes = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024

    out = {
        "scenario": args.scenario,
        "set": args.set,
        "method": args.method,
        "requests": args.requests,
        "startup_s": round(startup_s, 3),
        "event_loop_s": round(loop_s, 3),
        "collect_s": round(collect_s, 3),
        "event_loop_cpu_s": round(loop_cpu_s, 3),
        "requests_per_s": round(args.requests / loop_s),
        "requests_per_cpu_s": round(args.requests / loop_cpu_s),
        "requests_per_s_end_to_end": round(args.requests / (loop_s + collect_s)),
        "peak_rss_bytes": peak_rss_bytes,
        "events": next(run.env._eid),
        "simulated_span_s": round(float(df["finish_s"].max()), 1),
        "mean_jct_s": round(summary["jct_s"]["mean"], 3),
        "machine": f"{platform.machine()} {os.cpu_count()} cores, {cpu_model()}, Python {platform.python_version()}",
        "load_average_1m_before": round(load_before, 2),
        "load_average_1m_after": round(os.getloadavg()[0], 2),
        "versions": versions(),
        "compiled": list(getattr(simulator, "COMPILED", ())),
        "git_revision": subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True
        ).stdout.strip(),
        "date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "command": "python benchmarks/sim_speed.py " + " ".join(sys.argv[1:]),
    }
    print(json.dumps(out, indent=2))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(out, indent=2) + "\n")


if __name__ == "__main__":
    main()
