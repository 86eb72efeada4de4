"""Sampled mutation testing, area by area: a kill ratio per area in an hour rather than `make mutate`'s hours.

    python -m scripts.mutation_sample --json out/mutants.json    # every area, 20 mutants each, seed 0 (make mutate-sample)
    python -m scripts.mutation_sample --per-area 40 --seed 1 --area faults --area link
    python -m scripts.mutation_sample --rerun out/mutants.json   # after adding tests: only the survivors again

Each area (AREAS below) is a set of product modules and the test files written for them, wherever they live (the
colocated router's fault tests sit with the faults'). The mutants are mutmut's
own (mutmut.mutation.file_mutation.create_mutations, the operators `make mutate` applies: a number + 1, a string
wrapped in XX, an operator or comparison swapped, an argument dropped or set to None, ...), every mutation inside a
function of the area's modules, in the order mutmut makes them. A fixed-seed random sample of `--per-area` of them
(random.Random(f"{seed}:{area}").sample) is run one at a time: the mutant is written into a scratch copy of the
tracked tree (git ls-files), and the area's tests run there (`python -m pytest -x`, PYTHONPATH pointing at the copy
so that subprocesses import the mutant too); a failing run kills it, one that passes lets it survive. A run past the
timeout (ten times the area's clean run, at least two minutes more) counts as killed and is reported as a timeout.
The area's tests must pass on the unmutated copy first, or the area is reported as not run.

The ratio is "k of n sampled mutants killed" with the Wilson score 95 % interval for the area's whole population
of mutants (sampling without replacement from a finite population only narrows it). It is a lower bound for the
whole suite: a mutant that survives the area's tests may fall to another area's. Each survivor is printed as a
diff, to be read: a real gap wants a test, an equivalent mutant (no input can tell it apart) is named as such in
docs/testing.md, where the last run's figures are. `--rerun` an earlier `--json` of the same seed and size once
tests are added: the mutants it killed stay killed (a test added cannot revive one), the survivors run again, and an
area whose modules changed since runs whole (its sample is another).

One process at a time, at the priority it is started with (the Makefile target: nice -n 19).
"""

from __future__ import annotations

import argparse
import difflib
import importlib.util
import json
import math
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# area: (modules mutated, tests run against each mutant)
AREAS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "faults": (
        ("simulator/faults.py",),
        ("tests/test_faults_bites.py", "tests/test_faults.py", "tests/test_faults_settings.py"),
    ),
    "admission": (("simulator/admission.py",), ("tests/test_admission.py",)),
    "prefix caching": (("simulator/prefix_cache.py",), ("tests/test_prefix_cache.py",)),
    "colocated": (("simulator/colocated.py",), ("tests/test_colocated.py", "tests/test_faults_settings.py")),
    "MoE": (
        ("costmodel/expert_parallel.py",),
        ("tests/test_moe_bites.py", "tests/test_moe.py", "tests/test_data_parallel.py"),
    ),
    "trace readers": (
        ("simulator/traces.py", "simulator/trace_rows.py"),
        ("tests/test_traces.py", "tests/test_bad_input.py"),
    ),
    "calibration": (
        ("simulator/calibrate.py", "simulator/fit_items.py", "costmodel/calibration.py"),
        ("tests/test_calibrate.py", "tests/test_engine_logs.py"),
    ),
    "validate": (
        ("simulator/validate.py", "simulator/crossval.py"),
        ("tests/test_validate.py", "tests/test_crossval.py", "tests/test_engine_logs.py", "tests/test_noise.py"),
    ),
    "overload": (("simulator/overload.py",), ("tests/test_overload_bites.py", "tests/test_overload.py")),
    "derivation": (
        ("kernels_calibration/derive.py",),
        ("tests/kernels/test_derive_hand.py", "tests/kernels/test_profiles.py", "tests/test_hardware.py"),
    ),
    "reports' data": (
        ("reports/data.py",),
        ("tests/reports/test_report_breakdown_bites.py", "tests/reports/test_report_html.py"),
    ),
    "scheduler": (("simulator/scheduler.py",), ("tests/test_admission.py", "tests/test_colocated.py")),
    "connectors": (("simulator/connectors.py",), ("tests/test_connectors.py",)),
    "link": (
        ("simulator/link.py",),
        ("tests/test_hand_worked.py", "tests/test_simulator.py", "tests/test_faults_bites.py", "tests/test_faults.py"),
    ),
    "decode": (
        ("simulator/decode.py",),
        (
            "tests/test_simulator.py",
            "tests/test_memory.py",
            "tests/test_admission.py",
            "tests/test_faults.py",
            "tests/test_faults_settings.py",
            "tests/test_offload_methods.py",
        ),
    ),
    "prefill": (
        ("simulator/prefill.py",),
        (
            "tests/test_simulator.py",
            "tests/test_prefill_forms.py",
            "tests/test_colocated.py",
            "tests/test_prefix_cache.py",
            "tests/test_connectors.py",
            "tests/test_faults.py",
        ),
    ),
    "costmodel": (
        (
            "costmodel/phases.py",
            "costmodel/memory.py",
            "costmodel/transfer.py",
            "costmodel/roofline.py",
            "costmodel/kernel_work.py",
            "costmodel/collectives.py",
            "costmodel/methods/base.py",
            "costmodel/methods/hack.py",
            "costmodel/methods/kvquant.py",
            "costmodel/methods/cachegen.py",
            "costmodel/methods/fp8.py",
        ),
        (
            "tests/test_hand_worked.py",
            "tests/test_methods.py",
            "tests/test_collectives.py",
            "tests/test_memory.py",
            "tests/test_prefill_forms.py",
            "tests/test_implementations.py",
            "tests/test_step_profile.py",
            "tests/test_moe.py",
            "tests/test_colocated.py",
            "tests/kernels/test_profiles.py",
            "tests/test_offload_methods.py",
        ),
    ),
}


@dataclass(frozen=True)
class Mutant:
    path: str  # relative to the tree's root
    function: str  # the top-level function or Class.method it sits in
    index: int  # its place among mutmut's mutations of that function, from 1
    line: int
    original: str = field(repr=False, compare=False)  # the module as it is
    make: Callable[[], str] = field(repr=False, compare=False)  # the whole mutated module

    def source(self) -> str:
        return self.make()

    def diff(self) -> str:
        lines = difflib.unified_diff(self.original.splitlines(True), self.source().splitlines(True), n=0)
        return "".join(line for line in lines if not line.startswith(("---", "+++", "@@")))


def mutants_of(root: Path, path: str) -> list[Mutant]:
    """Every mutmut mutation inside a function or method of `root / path` (what mutmut makes mutants of), in
    mutmut's order."""
    import libcst as cst
    from libcst.metadata import MetadataWrapper, PositionProvider
    from mutmut.mutation.file_mutation import create_mutations, deep_replace

    original = (root / path).read_text()
    module, mutations, _, _ = create_mutations(path, original)
    positions = MetadataWrapper(module, unsafe_skip_copy=True).resolve(PositionProvider)
    owners = _owners(module)
    out, seen = [], {}

    def maker(m) -> Callable[[], str]:
        def make() -> str:
            mutated = deep_replace(module, m.original_node, m.mutated_node)
            assert isinstance(mutated, cst.Module)
            return mutated.code

        return make

    for m in mutations:
        name = owners.get(id(m.contained_by_top_level_function))
        if name is None:
            continue
        seen[name] = seen.get(name, 0) + 1
        pos = positions.get(m.original_node)
        out.append(Mutant(path, name, seen[name], pos.start.line if pos else 0, original, maker(m)))
    return out


def _owners(module) -> dict[int, str]:
    """id(function node) -> "Class.method" or "function", for the top-level ones mutmut mutates."""
    import libcst as cst

    names = {}
    for stmt in module.body:
        if isinstance(stmt, cst.FunctionDef):
            names[id(stmt)] = stmt.name.value
        elif isinstance(stmt, cst.ClassDef) and isinstance(stmt.body, cst.IndentedBlock):
            for s in stmt.body.body:
                if isinstance(s, cst.FunctionDef):
                    names[id(s)] = f"{stmt.name.value}.{s.name.value}"
    return names


def sample(root: Path, area: str, per_area: int, seed: int) -> tuple[int, list[Mutant]]:
    """(how many mutants the area has in the tree at `root`, the fixed-seed sample of them)."""
    population = [m for path in AREAS[area][0] for m in mutants_of(root, path)]
    rng = random.Random(f"{seed}:{area}")
    picked = sorted(rng.sample(range(len(population)), min(per_area, len(population))))
    return len(population), [population[i] for i in picked]


def wilson(k: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """Wilson score interval for a proportion k / n (Wilson 1927; Agresti & Coull 1998)."""
    if n == 0:
        return math.nan, math.nan
    p = k / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return max(0.0, centre - half), min(1.0, centre + half)


class Scratch:
    """A copy of the tracked tree where one module at a time is swapped for a mutant."""

    def __init__(self) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="hacksim-mutants-"))
        files = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout
        for rel in filter(None, files.decode().split("\0")):
            src = ROOT / rel
            if src.is_file():
                dst = self.dir / rel
                dst.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(src, dst)
        self.env = {**os.environ, "PYTHONPATH": str(self.dir), "HYPOTHESIS_PROFILE": "ci"}
        self.env.pop("HACKSIM_REQUIRE_BROWSER", None)
        self.env.pop("HACKSIM_REQUIRE_COMPILED", None)
        where = subprocess.run(
            [sys.executable, "-c", "import simulator, costmodel; print(simulator.__file__, costmodel.__file__)"],
            cwd=self.dir,
            env=self.env,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.split()
        assert all(Path(w).is_relative_to(self.dir) for w in where), f"the copy is not what Python imports: {where}"

    def write(self, rel: str, text: str) -> None:
        path = self.dir / rel
        path.write_text(text)
        # the byte-code cache is keyed on the source's mtime (seconds) and size: a mutant of the same size
        # written within the second would run the previous one's code
        Path(importlib.util.cache_from_source(str(path))).unlink(missing_ok=True)

    def run(self, tests: tuple[str, ...], timeout_s: float) -> tuple[str, float]:
        """("passed" | "failed" | "timeout", wall seconds)."""
        start = time.monotonic()
        try:
            proc = subprocess.run(
                [sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", "-p", "no:randomly", *tests],
                cwd=self.dir,
                env=self.env,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                timeout=timeout_s,
                start_new_session=True,
            )
        except subprocess.TimeoutExpired:
            return "timeout", time.monotonic() - start
        return ("passed" if proc.returncode == 0 else "failed"), time.monotonic() - start

    def close(self) -> None:
        shutil.rmtree(self.dir, ignore_errors=True)


def run_area(scratch: Scratch, area: str, per_area: int, seed: int, log, before: dict | None = None) -> dict:
    """The area's sample run. With `before` (this area's result from an earlier run of the same seed and size),
    the mutants it killed count as killed without a run, when the area's modules have not changed since (the
    same mutants: the tests are the only thing that moved, and a test added cannot let a killed mutant live)."""
    paths, tests = AREAS[area]
    total, picked = sample(scratch.dir, area, per_area, seed)  # the copy: edits to the tree meanwhile stay out
    diffs = [m.diff() for m in picked]
    known = {}
    if before is not None and before.get("mutants") == total and [o["diff"] for o in before["outcomes"]] == diffs:
        known = {i: o["outcome"] for i, o in enumerate(before["outcomes"]) if o["outcome"] != "passed"}
    clean, clean_s = scratch.run(tests, timeout_s=3600)
    log(
        f"{area}: {total} mutants, {len(picked)} sampled ({len(known)} killed before); clean run {clean} in "
        f"{clean_s:.0f} s"
    )
    result = {"area": area, "modules": list(paths), "tests": list(tests), "mutants": total, "clean_s": clean_s}
    if clean != "passed":
        return {**result, "error": f"the area's tests do not pass unmutated ({clean})"}
    timeout_s = max(10 * clean_s, clean_s + 120)
    outcomes = []
    for i, (m, diff) in enumerate(zip(picked, diffs)):
        entry = {"path": m.path, "function": m.function, "index": m.index, "line": m.line, "diff": diff}
        if i in known:
            outcomes.append({**entry, "outcome": known[i], "carried": True})
            continue
        scratch.write(m.path, m.source())
        try:
            outcome, took_s = scratch.run(tests, timeout_s)
        finally:
            scratch.write(m.path, m.original)
        log(f"  {outcome:7s} {took_s:5.0f} s  {m.path}:{m.line} {m.function} #{m.index}")
        outcomes.append({**entry, "outcome": outcome})
    killed = sum(o["outcome"] != "passed" for o in outcomes)
    lo, hi = wilson(killed, len(outcomes))
    return {**result, "sampled": len(outcomes), "killed": killed, "interval": [lo, hi], "outcomes": outcomes}


def summary_line(r: dict) -> str:
    if "error" in r:
        return f"{r['area']:15s} not run: {r['error']}"
    n, k = r["sampled"], r["killed"]
    lo, hi = r["interval"]
    timeouts = sum(o["outcome"] == "timeout" for o in r["outcomes"])
    extra = f", {timeouts} by timeout" if timeouts else ""
    return (
        f"{r['area']:15s} {k:3d} of {n:3d} sampled killed ({100 * k / n:5.1f} %, 95 % interval "
        f"{100 * lo:.0f}-{100 * hi:.0f} %) of {r['mutants']} mutants{extra}"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--per-area", type=int, default=20, help="mutants sampled per area (default 20)")
    parser.add_argument("--seed", type=int, default=0, help="the sample's seed (default 0)")
    parser.add_argument("--area", action="append", choices=sorted(AREAS), help="only this area (repeatable)")
    parser.add_argument("--json", type=Path, help="also write every outcome here")
    parser.add_argument("--list", action="store_true", help="print each area's sample and stop")
    parser.add_argument(
        "--rerun",
        type=Path,
        help="an earlier --json of the same seed and size: run only the mutants that survived it (in areas whose "
        "modules are unchanged; an area whose modules changed runs whole)",
    )
    args = parser.parse_args(argv)
    if args.per_area < 1:
        parser.error("--per-area must be at least 1")
    areas = args.area or list(AREAS)

    def log(msg: str) -> None:
        print(msg, file=sys.stderr, flush=True)

    if args.list:
        for area in areas:
            total, picked = sample(ROOT, area, args.per_area, args.seed)
            print(f"{area}: {len(picked)} of {total}")
            for m in picked:
                print(
                    f"  {m.path}:{m.line} {m.function} #{m.index}\n"
                    + "".join(f"    {d}" for d in m.diff().splitlines(True))
                )
        return 0
    before = {}
    if args.rerun:
        prev = json.loads(args.rerun.read_text())
        if (prev["seed"], prev["per_area"]) != (args.seed, args.per_area):
            parser.error(f"--rerun {args.rerun}: seed {prev['seed']}, {prev['per_area']} per area: give the same")
        before = {r["area"]: r for r in prev["areas"] if "outcomes" in r}
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # through the finally below: the copy is removed
    scratch = Scratch()
    results = []
    try:
        for area in areas:
            results.append(run_area(scratch, area, args.per_area, args.seed, log, before.get(area)))
            if args.json:
                args.json.write_text(
                    json.dumps({"seed": args.seed, "per_area": args.per_area, "areas": results}, indent=1)
                )
    finally:
        scratch.close()
    print(f"sampled mutation testing: {args.per_area} mutants per area, seed {args.seed}")
    for r in results:
        print(summary_line(r))
    k = sum(r.get("killed", 0) for r in results)
    n = sum(r.get("sampled", 0) for r in results)
    if n:
        print(f"{'all areas':15s} {k:3d} of {n:3d} sampled killed ({100 * k / n:5.1f} %)")
    for r in results:
        for o in r.get("outcomes", []):
            if o["outcome"] == "passed":
                print(
                    f"\nsurvived ({r['area']}): {o['path']}:{o['line']} {o['function']} #{o['index']}\n{o['diff']}",
                    end="",
                )
    return 0


if __name__ == "__main__":
    sys.exit(main())
