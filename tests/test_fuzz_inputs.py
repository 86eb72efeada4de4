"""Fuzz the CLI's inputs: mutations of the shipped scenario files, --set values, a committed trace and a
sweep file. Whatever the mutation, the run either succeeds (writing strict JSON) or is refused per the
contract (tests/contract.py): one `error:` line naming the file or option, exit 2, no traceback,
nothing written, within CASE_SECONDS and a memory cap.  Derandomised, so CI sees the same cases."""

from __future__ import annotations

import copy
import math
import os
import random
import shutil
from pathlib import Path

import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from contract import assert_contract, invoke

ROOT = Path(__file__).resolve().parent.parent
SCENARIOS = sorted((ROOT / "scenarios").glob("*.yaml"))
TRACE = ROOT / "realrun" / "traces" / "h200" / "llama-3.1-8b-L32_10gbps_kvquant_r1"
TRACE_SCENARIO = ROOT / "scenarios" / "measured" / "h200_8b_10gbps.yaml"

FUZZ = settings(
    max_examples=int(os.environ.get("HACKSIM_FUZZ_EXAMPLES", 30)),
    deadline=None,
    # derandomised (tests/conftest.py's ci profile) unless told how many examples to draw
    **({"derandomize": False} if os.environ.get("HACKSIM_FUZZ_EXAMPLES") else {}),
    suppress_health_check=list(HealthCheck),
)

NASTY = [
    math.nan,
    math.inf,
    -math.inf,
    -1,
    0,
    1,
    0.5,
    2**63,
    10**30,
    1e308,
    -1e308,
    1e-308,
    "",
    "x",
    "inf",
    "nan",
    "llama-3.1-70b",
    "a100_80gb",
    [],
    {},
    None,
    True,
    [1, 2],
    {"preset": "nope"},
    {"name": "hack"},
    "a" * 500,
    [[[[[]]]]],
    {"kind": "trace"},
    -0.0,
]
NASTY_TEXT = [
    "nan",
    ".nan",
    ".inf",
    "-.inf",
    "-1",
    "0",
    "1e400",
    "99999999999999999999999",
    "[",
    "{",
    "]",
    "'",
    "&a [1, *a]",
    "*missing",
    "!!python/object:os.system ls",
    "~",
    "",
    "[a, b]",
    "{name: hack}",
    "0x10",
    "1_000",
    "true",
    "1.5",
    "\x00",
    "\ufeff",
    "10 # comment",
]
SET_PATHS = [
    "network.bandwidth_gbps",
    "network.latency_s",
    "network.per_flow_gbps",
    "network.links",
    "workload.arrival.rate_rps",
    "workload.arrival",
    "workload.requests",
    "workload.seed",
    "workload.trace_csv",
    "workload.input_tokens.max_tokens",
    "workload.dataset",
    "model",
    "model.layers",
    "model.max_context_tokens",
    "prefill.replicas",
    "prefill.instance",
    "decode.gpu_memory_utilization",
    "decode.kv_capacity_gib",
    "decode.max_batch_requests",
    "methods",
    "methods.0",
    "methods.0.partition",
    "methods.1.bits",
    "calibration.decode_profile",
    "placement",
    "name",
    "prefill.gpu.memory_bytes",
    "nonsense",
    "model.preset.x",
    "methods.x",
]


def _paths(node, prefix=()):
    """Every path into a parsed YAML tree (mappings and lists)."""
    yield prefix
    if isinstance(node, dict):
        for k, v in node.items():
            yield from _paths(v, prefix + (k,))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            yield from _paths(v, prefix + (i,))


def _mutate(tree, rnd: random.Random, value):
    value = copy.deepcopy(value)
    paths = [p for p in _paths(tree) if p]
    path = paths[rnd.randrange(len(paths))]
    parent = tree
    for k in path[:-1]:
        parent = parent[k]
    op = rnd.randrange(4)
    if op == 0 and isinstance(parent, dict):
        del parent[path[-1]]
    elif op == 1 and isinstance(parent, dict):
        parent[f"extra_{rnd.randrange(9)}"] = value
    else:
        parent[path[-1]] = value
    return tree


@FUZZ
@given(
    which=st.integers(0, len(SCENARIOS) - 1),
    seed=st.integers(0, 2**32 - 1),
    values=st.lists(st.sampled_from(NASTY), min_size=1, max_size=3),
)
def test_mutated_scenario_trees(tmp_path_factory, which, seed, values):
    tmp = tmp_path_factory.mktemp("tree")
    rnd = random.Random(seed)
    tree = yaml.safe_load(SCENARIOS[which].read_text())
    for v in values:
        tree = _mutate(tree, rnd, v)
    path = tmp / "s.yaml"
    path.write_text(yaml.safe_dump(tree, allow_unicode=True))
    r = invoke("simulate", path, "--requests", "6", "--out", tmp / "out", "--no-report")
    assert_contract(r, names=(str(path),), out=tmp / "out")


@FUZZ
@given(
    which=st.integers(0, len(SCENARIOS) - 1),
    seed=st.integers(0, 2**32 - 1),
    edits=st.lists(
        st.tuples(
            st.sampled_from(["insert", "delete", "replace", "truncate"]),
            st.floats(0, 1),
            st.sampled_from(NASTY_TEXT + ["\n", ":", "  ", "- ", "\t", "&x ", "*x"]),
        ),
        min_size=1,
        max_size=4,
    ),
)
def test_mutated_scenario_text(tmp_path_factory, which, seed, edits):
    tmp = tmp_path_factory.mktemp("text")
    text = SCENARIOS[which].read_text()
    for op, where, piece in edits:
        i = int(where * len(text))
        if op == "insert":
            text = text[:i] + piece + text[i:]
        elif op == "delete":
            text = text[:i] + text[i + 1 + len(piece) :]
        elif op == "replace":
            text = text[:i] + piece + text[i + len(piece) :]
        else:
            text = text[:i]
    path = tmp / "s.yaml"
    path.write_text(text)
    r = invoke("simulate", path, "--requests", "6", "--out", tmp / "out", "--no-report")
    assert_contract(r, names=(str(path),), out=tmp / "out")


@FUZZ
@given(sets=st.lists(st.tuples(st.sampled_from(SET_PATHS), st.sampled_from(NASTY_TEXT)), min_size=1, max_size=3))
def test_set_values(tmp_path_factory, sets):
    tmp = tmp_path_factory.mktemp("set")
    scenario = ROOT / "scenarios" / "a10g_10gbps.yaml"
    args = [a for p, v in sets for a in ("--set", f"{p}={v}")]
    r = invoke(
        "simulate", scenario, "--requests", "6", "--methods", "baseline", *args, "--out", tmp / "out", "--no-report"
    )
    assert_contract(r, names=(str(scenario), "--set"), out=tmp / "out")


TRACE_CELLS = ["nan", "inf", "-inf", "-1", "", "abc", "1e400", "0", "1.5", "999999999999", "2", '"', "1,2"]


@FUZZ
@given(
    ops=st.lists(
        st.tuples(
            st.sampled_from(["cell", "swap", "dup", "drop_col", "drop_row", "truncate"]),
            st.integers(0, 10**6),
            st.integers(0, 10**6),
            st.sampled_from(TRACE_CELLS),
        ),
        min_size=1,
        max_size=3,
    )
)
def test_mutated_traces(tmp_path_factory, ops):
    tmp = tmp_path_factory.mktemp("trace")
    folder = tmp / "trace"
    shutil.copytree(TRACE, folder)
    lines = (folder / "requests.csv").read_text().splitlines()
    rows = [line.split(",") for line in lines]
    text = None
    for op, a, b, cell in ops:
        n, m = len(rows), len(rows[0])
        if op == "cell" and n > 1:
            rows[1 + a % (n - 1)][b % m] = cell
        elif op == "swap" and n > 2:
            i, j = 1 + a % (n - 1), 1 + b % (n - 1)
            rows[i], rows[j] = rows[j], rows[i]
        elif op == "dup" and n > 1:
            rows.insert(1 + b % n, list(rows[1 + a % (n - 1)]))
        elif op == "drop_col" and m > 1:
            for r in rows:
                del r[a % m]
        elif op == "drop_row" and n > 1:
            del rows[1 + a % (n - 1)]
        elif op == "truncate":
            text = "".join(",".join(r) + "\n" for r in rows)
            text = text[: a % (len(text) + 1)]
    (folder / "requests.csv").write_text(text if text is not None else "".join(",".join(r) + "\n" for r in rows))
    r = invoke("validate", folder, "--scenario", TRACE_SCENARIO, "--out", tmp / "v")
    assert_contract(r, names=(str(folder / "requests.csv"), str(TRACE_SCENARIO)), out=tmp / "v")


@settings(FUZZ, max_examples=max(12, FUZZ.max_examples // 3))
@given(
    axes=st.dictionaries(
        st.sampled_from(SET_PATHS[:12] + ["methods.0.bits"]),
        st.lists(st.sampled_from(NASTY + [10, 25, 0.5, 100]), min_size=1, max_size=2),
        min_size=1,
        max_size=2,
    )
)
def test_mutated_sweeps(tmp_path_factory, axes):
    tmp = tmp_path_factory.mktemp("sweep")
    sweep = tmp / "sweep.yaml"
    sweep.write_text(
        yaml.safe_dump(
            {
                "base": str(ROOT / "scenarios" / "a10g_10gbps.yaml"),
                "set": {"workload.requests": 5, "methods": ["baseline"]},
                "axes": axes,
            }
        )
    )
    r = invoke("sweep", sweep, "--jobs", "1", "--out", tmp / "out", "--no-report")
    assert_contract(r, names=(str(sweep),), out=tmp / "out")
