"""The event loop's CPU time against older revisions, back to back: benchmarks/sim_speed.py on each tree in turn.

    python benchmarks/paired.py --against ad46b8a --against d501956 [--rounds 3] [--json PATH]

Each revision is checked out (`git archive`) into a temporary folder and given this tree's benchmark scripts, so
every tree runs the same measurement of its own simulator; a revision with `scripts/build_compiled.py` has its
event loop compiled first (mypyc, as `make run` does), so it runs as it runs by default. Then, round by round and scenario by scenario, each
tree runs sim_speed.py in its own process, one after the other: the references, this tree as it runs by default
(its compiled modules where built: simulator/compiled.py) and this tree as Python (HACKSIM_PURE_PYTHON=1). A
shared machine's load moves every figure, and pairing runs back to back lets the ratios cancel most of it; the
CPU time of the event loop (`event_loop_cpu_s`, not wall) is compared, and the 1-minute load average is kept
beside each run. The ratio is reference CPU / this tree's CPU: best (min over rounds against min) and median.
This tree's runs, compiled and as Python, must end with the last reference's mean JCT (the same outputs: a
revision before the engine work of a0926fd simulates differently, and its JCT is only recorded).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# (name, scenario, requests, --set overrides): the default scenario, a colocated one and a prefix-caching one
SCENARIOS = [
    ("default", "scenarios/a10g_10gbps.yaml", 100_000, []),
    ("colocated", "scenarios/colocated_vs_disaggregated.yaml", 30_000, ["placement=colocated"]),
    ("prefix_caching", "scenarios/prefix_caching.yaml", 30_000, []),
]


def checkout(rev: str, into: Path) -> Path:
    tree = into / rev
    tree.mkdir(parents=True)
    archive = subprocess.run(["git", "archive", rev], cwd=ROOT, capture_output=True, check=True).stdout
    subprocess.run(["tar", "-x", "-C", str(tree)], input=archive, check=True)
    for script in ("sim_speed.py", "scale_1m.py"):  # the same measurement for every tree
        shutil.copy(ROOT / "benchmarks" / script, tree / "benchmarks" / script)
    if (tree / "scripts" / "build_compiled.py").exists():  # a revision that compiles its event loop runs compiled
        subprocess.run([sys.executable, "-m", "scripts.build_compiled"], cwd=tree, check=True, capture_output=True)
    return tree


def one_run(tree: Path, scenario: str, requests: int, sets: list[str], pure: bool) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "r.json"
        cmd = [sys.executable, "benchmarks/sim_speed.py", "--scenario", scenario, "--requests", str(requests)]
        cmd += [a for s in sets for a in ("--set", s)] + ["--json", str(out)]
        env = {k: v for k, v in os.environ.items() if k != "HACKSIM_PURE_PYTHON"}
        if pure:
            env["HACKSIM_PURE_PYTHON"] = "1"
        subprocess.run(cmd, cwd=tree, env=env, check=True, capture_output=True)
        return json.loads(out.read_text())


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--against", action="append", required=True, help="a git revision (repeatable)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--only", default=None, help="one of the scenarios' names")
    ap.add_argument("--scale", type=float, default=1.0, help="of each scenario's requests (a quick look: 0.05)")
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout
    dirty = subprocess.run(
        ["git", "status", "--porcelain", "--", "simulator", "costmodel"], cwd=ROOT, capture_output=True, text=True
    ).stdout
    scenarios = [(n, s, max(1, round(r * args.scale)), x) for n, s, r, x in SCENARIOS if args.only in (None, n)]
    started = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    runs: dict[str, dict[str, list[dict]]] = {name: {} for name, *_ in scenarios}
    with tempfile.TemporaryDirectory(prefix="hacksim-paired-") as tmp:
        trees = [(rev, checkout(rev, Path(tmp)), False) for rev in args.against]
        trees += [(head.strip(), ROOT, False), (f"{head.strip()} as Python", ROOT, True)]
        for r in range(args.rounds):
            for name, scenario, requests, sets in scenarios:
                for label, tree, pure in trees:
                    res = one_run(tree, scenario, requests, sets, pure)
                    runs[name].setdefault(label, []).append(res)
                    print(
                        f"round {r + 1} {name} {label}: event loop {res['event_loop_cpu_s']} CPU-s, "
                        f"load {res['load_average_1m_before']}",
                        file=sys.stderr,
                        flush=True,
                    )
    out: dict = {
        "what": "benchmarks/sim_speed.py run back to back, round by round, on each tree (python benchmarks/paired.py)",
        "command": "python benchmarks/paired.py " + " ".join(sys.argv[1:]),
        "date_utc": started,
        "this_tree": head.strip() + (" (with uncommitted simulator changes)" if dirty else ""),
        "machine": runs[scenarios[0][0]][trees[0][0]][0]["machine"],
        "versions": runs[scenarios[0][0]][trees[0][0]][0]["versions"],
        "scenarios": {},
    }
    for name, scenario, requests, sets in scenarios:
        per = runs[name]
        jct = {label: sorted({r["mean_jct_s"] for r in rs}) for label, rs in per.items()}
        same = [jct[label] for label, *_ in trees[len(args.against) - 1 :]]
        if any(j != same[0] or len(j) != 1 for j in same):
            sys.exit(f"{name}: this tree's mean JCT differs from {args.against[-1]}'s: {jct}")
        entry: dict = {
            "scenario": scenario,
            "set": sets,
            "requests": requests,
            "mean_jct_s": jct,
            "event_loop_cpu_s": {label: [r["event_loop_cpu_s"] for r in rs] for label, rs in per.items()},
            "load_average_1m": {label: [r["load_average_1m_before"] for r in rs] for label, rs in per.items()},
            "compiled_modules": {label: len(rs[0]["compiled"]) for label, rs in per.items()},
            "events": {label: rs[0]["events"] for label, rs in per.items()},
        }
        ratios = {}
        for ref, *_ in trees[: len(args.against)]:
            for label, *_ in trees[len(args.against) :]:
                a, b = entry["event_loop_cpu_s"][ref], entry["event_loop_cpu_s"][label]
                ratios[f"{ref} / {label}"] = {
                    "best": round(min(a) / min(b), 2),
                    "median": round(statistics.median(a) / statistics.median(b), 2),
                }
        entry["cpu_ratio"] = ratios
        out["scenarios"][name] = entry
    print(json.dumps(out, indent=2))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(out, indent=2) + "\n")


if __name__ == "__main__":
    main()
