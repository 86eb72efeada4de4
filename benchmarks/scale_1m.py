"""A million requests through the whole CLI: wall time, peak memory and events of one process.

    python benchmarks/scale_1m.py [--requests 1000000] [--method hack] [--scenario scenarios/a10g_10gbps.yaml]
                                  [--json benchmarks/results/scale_1m.json]

Runs `cli.py simulate SCENARIO --requests N --methods METHOD --out DIR` (every output: summary.json,
requests.csv, memory.csv, links.csv, scenario.json, profiles.json, report.html) as a child process and
measures it from outside: wall time from spawn to exit (interpreter start and imports included) and
the child's peak resident memory (wait4's ru_maxrss). The child is the CLI itself, with SimPy's event
counter read at exit. The machine's load average is recorded beside the figures, because a shared
machine's wall time says as much about its neighbours as about the code.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def child(events_file: str, cli_args: list[str]) -> None:
    """Run the CLI in this process, counting SimPy events (the ids of every environment created)."""
    sys.path.insert(0, str(ROOT))
    import simpy

    envs: list = []
    init = simpy.Environment.__init__

    def counting_init(self, *a, **kw):
        init(self, *a, **kw)
        envs.append(self)

    simpy.Environment.__init__ = counting_init
    import cli

    try:
        cli.app(cli_args, standalone_mode=False)
    finally:
        Path(events_file).write_text(json.dumps(sum(next(e._eid) for e in envs)))


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def versions() -> dict:
    from importlib.metadata import PackageNotFoundError, version

    out = {}
    for pkg in ("numpy", "pandas", "simpy", "pyarrow", "pydantic"):
        try:
            out[pkg] = version(pkg)
        except PackageNotFoundError:
            out[pkg] = None
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--scenario", default="scenarios/a10g_10gbps.yaml")
    ap.add_argument("--requests", type=int, default=1_000_000)
    ap.add_argument("--method", default="hack")
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--keep", type=Path, default=None, help="write the outputs here instead of a temporary folder")
    args = ap.parse_args()

    with tempfile.TemporaryDirectory(prefix="hacksim-scale-") as tmp:
        out = args.keep or Path(tmp) / "out"
        events_file = Path(tmp) / "events.json"
        cmd = [
            sys.executable,
            str(Path(__file__).resolve()),
            "--child",
            str(events_file),
            "simulate",
            args.scenario,
            "--requests",
            str(args.requests),
            "--methods",
            args.method,
            "--out",
            str(out),
            "--quiet",
        ]
        load_before = os.getloadavg()[0]
        started = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        t0 = time.perf_counter()
        proc = subprocess.Popen(cmd, cwd=ROOT)
        _, status, usage = os.wait4(proc.pid, 0)
        wall_s = time.perf_counter() - t0
        load_after = os.getloadavg()[0]
        if os.waitstatus_to_exitcode(status) != 0:
            sys.exit(f"the simulation failed (exit {os.waitstatus_to_exitcode(status)})")
        summary = json.loads((out / "summary.json").read_text())["methods"][args.method]
        sizes = {p.name: p.stat().st_size for p in sorted(out.iterdir()) if p.is_file()}
        result = {
            "scenario": args.scenario,
            "method": args.method,
            "requests": args.requests,
            "wall_s": round(wall_s, 2),
            "peak_rss_bytes": usage.ru_maxrss * 1024,
            "cpu_s": round(usage.ru_utime + usage.ru_stime, 2),
            "events": json.loads(events_file.read_text()),
            "completed": summary["completed"],
            "mean_jct_s": round(summary["jct_s"]["mean"], 3),
            "output_bytes": sizes,
            "load_average_1m_before": round(load_before, 2),
            "load_average_1m_after": round(load_after, 2),
            "machine": f"{platform.machine()} {os.cpu_count()} cores, {cpu_model()}, Python {platform.python_version()}",
            "versions": versions(),
            "git_revision": subprocess.run(
                ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True
            ).stdout.strip(),
            "date_utc": started,
            "command": "python benchmarks/scale_1m.py " + " ".join(sys.argv[1:]),
        }
    print(json.dumps(result, indent=2))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[1] == "--child":
        child(sys.argv[2], sys.argv[3:])
    else:
        main()
