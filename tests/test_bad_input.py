"""Every kind of bad input the CLI meets is refused the same way: one `error:` line naming the file (and
the row or field), exit 2, no traceback, nothing written, within seconds and bounded memory; numbers
that mean something when infinite (bandwidths) are carried exactly, through sweep workers too."""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import yaml

from contract import assert_contract, check_strict_json, invoke
from simulator.config import Scenario, ScenarioError
from simulator.files import read_yaml, strict_json
from simulator.load import load_scenario
from simulator.trace_rows import TraceColumns, check_trace_rows

ROOT = Path(__file__).resolve().parent.parent
DEFAULT = ROOT / "scenarios" / "a10g_10gbps.yaml"
TRACE = ROOT / "realrun" / "traces" / "h200" / "llama-3.1-8b-L32_10gbps_hack_r1"
TRACE_SCENARIO = ROOT / "scenarios" / "measured" / "h200_8b_10gbps.yaml"

BOMB = (
    "\n".join(
        [f"a0: &a0 [{', '.join(['lol'] * 9)}]"]
        + [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 9)}]" for i in range(1, 10)]
        + ["model: {preset: *a9}"]
    )
    + "\n"
)


def _scenario_text(tmp_path: Path, text: str | bytes, name="s.yaml") -> Path:
    p = tmp_path / name
    p.write_bytes(text if isinstance(text, bytes) else text.encode())
    return p


def _trace(tmp_path: Path, edit) -> Path:
    """A copy of a committed trace with requests.csv edited by `edit(rows: list[list[str]])`."""
    folder = tmp_path / "trace"
    shutil.copytree(TRACE, folder)
    lines = (folder / "requests.csv").read_text().splitlines()
    rows = [line.split(",") for line in lines]
    edit(rows)
    (folder / "requests.csv").write_text("".join(",".join(r) + "\n" for r in rows))
    return folder


def _col(rows, name):
    return rows[0].index(name)


# ---- the scenario file ------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "content, message",
    [
        (os.urandom(0) + bytes(range(128, 256)) * 8, "not a text file"),
        (BOMB, "aliases expand to more than"),
        ("a: &a [1, *a]\n", "refers to a node that contains it"),
        ("[" * 5000 + "]" * 5000, "nested more than"),
        ("name: x\nmodel: [\n", "not valid YAML"),
        ("- just\n- a list\n", "expected a mapping"),
    ],
    ids=["binary", "alias-bomb", "recursive-alias", "deep-nesting", "truncated-yaml", "not-a-mapping"],
)
def test_unreadable_scenarios(tmp_path, content, message):
    path = _scenario_text(tmp_path, content)
    line = assert_contract(
        invoke("simulate", path, "--out", tmp_path / "out"), names=(str(path),), out=tmp_path / "out"
    )
    assert message in line


def test_directory_as_scenario(tmp_path):
    line = assert_contract(invoke("simulate", tmp_path), names=(str(tmp_path),))
    assert "is a directory" in line


@pytest.mark.parametrize(
    "args, message",
    [
        (["--set", "network.bandwidth_gbps=["], "not valid YAML"),
        (["--set", "network.bandwidth_gbps"], "expected path.to.field=value"),
        (["--set", "=3"], "empty field name"),
        (["--set", "methods.9.partition=32"], "no element 9"),
        (["--set", "network.latency_s.x=1"], "latency_s is a float"),
        (["--set", "network.latency_s=.nan"], "finite number"),
        (["--set", "workload.arrival.rate_rps=.inf"], "finite number"),
        (["--set", "model.layers=100000000000000000000000000000"], "model.layers"),
        (["--methods", ","], "--methods ','"),
        (["--methods", "nope"], "--methods: nope"),
        (["--requests", "0"], "workload.requests"),
        (["--requests", "1000000000"], "workload.requests"),
        (["--requests", "90000000"], "GiB of memory"),
    ],
    ids=[
        "set-yaml",
        "set-no-value",
        "set-empty-path",
        "set-no-element",
        "set-into-scalar",
        "nan",
        "inf-rate",
        "huge-int",
        "methods-comma",
        "methods-unknown",
        "requests-zero",
        "requests-bound",
        "requests-memory",
    ],
)
def test_bad_options(tmp_path, monkeypatch, args, message):
    monkeypatch.setattr("simulator.run.machine_memory_bytes", lambda: 16 * 2**30)  # the same on any machine
    out = tmp_path / "out"
    line = assert_contract(
        invoke("simulate", DEFAULT, "--requests", "5", *args, "--out", out)
        if "--requests" not in args
        else invoke("simulate", DEFAULT, *args, "--out", out),
        names=(str(DEFAULT), "--set", "--methods"),
        out=out,
    )
    assert message in line


def test_out_is_checked_before_simulating(tmp_path):
    afile = tmp_path / "afile"
    afile.write_text("x")
    for out, message in (
        (afile, "is a file, not a folder"),
        (afile / "sub", "is a file, not a folder"),
        (Path("/proc/hacksim/out"), "is not writable"),
    ):
        # 200k requests would take many seconds: a refusal within the bound shows nothing ran first
        line = assert_contract(
            invoke("simulate", DEFAULT, "--requests", "200000", "--out", out, seconds=5), names=("--out",)
        )
        assert message in line
    assert afile.read_text() == "x"


# ---- traces ------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "edit, message",
    [
        (lambda r: r[3].__setitem__(_col(r, "arrival_s"), "nan"), "line 4: arrival_s: empty or NaN"),
        (lambda r: r[3].__setitem__(_col(r, "arrival_s"), "inf"), "line 4: arrival_s: inf is not a finite time"),
        (lambda r: r[3].__setitem__(_col(r, "prefill_start_s"), "-2"), "line 4: prefill_start_s: -2 is not"),
        (lambda r: r[3].__setitem__(_col(r, "finish_s"), "0.5"), "line 4: finish_s (0.5) is before arrival_s"),
        (
            lambda r: r[4].__setitem__(_col(r, "request_id"), r[3][_col(r, "request_id")]),
            "line 5: request_id 2 repeats line 4",
        ),
        (
            lambda r: r.__setitem__(slice(2, 4), [r[3], r[2]]),
            "line 4: arrival_s 1.38148217 is earlier than the row above",
        ),
        (
            lambda r: r[2].__setitem__(_col(r, "output_tokens"), "2.5"),
            "line 3: output_tokens: 2.5 is not a whole number",
        ),
        (lambda r: r[2].__setitem__(_col(r, "prompt_tokens"), "abc"), "line 3: prompt_tokens: 'abc' is not a number"),
        (lambda r: r.__delitem__(slice(1, None)), "no rows"),
        (lambda r: [x.pop(c) for c in [_col(r, "finish_s")] for x in r], "missing column finish_s"),
    ],
    ids=[
        "nan-arrival",
        "inf-arrival",
        "negative",
        "finish-before-arrival",
        "duplicate-id",
        "unsorted",
        "fraction",
        "text",
        "no-rows",
        "no-column",
    ],
)
def test_bad_trace_rows(tmp_path, edit, message):
    trace = _trace(tmp_path, edit)
    line = assert_contract(
        invoke("validate", trace, "--scenario", TRACE_SCENARIO, "--out", tmp_path / "v"),
        names=(str(trace / "requests.csv"),),
        out=tmp_path / "v",
    )
    assert message in line


def test_empty_csvs(tmp_path):
    trace = _trace(tmp_path, lambda r: None)
    (trace / "requests.csv").write_text("")
    assert "empty file" in assert_contract(
        invoke("validate", trace, "--scenario", TRACE_SCENARIO), names=(str(trace / "requests.csv"),)
    )
    index = tmp_path / "index.csv"
    for text, message in (("", "empty file"), ("trace,scenario\n", "no rows"), ("trace\nx\n", "needs columns")):
        index.write_text(text)
        assert message in assert_contract(invoke("validate", index), names=(str(index),))


def test_nan_in_a_workload_trace_is_refused_not_looped(tmp_path):
    """A NaN arrival once rescheduled the arrival timer with a NaN delay forever."""
    csv = tmp_path / "t.csv"
    csv.write_text("arrival_s,prompt_tokens,output_tokens\n0,100,10\nnan,100,10\n")
    raw = yaml.safe_load(DEFAULT.read_text())
    raw["workload"] = {"trace_csv": "t.csv", "arrival": {"kind": "trace"}, "requests": 4}
    path = _scenario_text(tmp_path, yaml.safe_dump(raw))
    line = assert_contract(invoke("simulate", path, seconds=10), names=(str(csv),))
    assert "line 3: arrival_s" in line


def test_trace_rows_checker_is_reusable():
    cols = TraceColumns(required=("t_s", "n"), times=("t_s",), counts={"n": 0}, unique="id", sorted_by="t_s")
    ok = check_trace_rows(
        pd.DataFrame({"id": [1, 2], "t_s": ["0", "1.5"], "n": [0, 3.0]}), "x.jsonl", cols, ScenarioError, first_line=1
    )
    assert ok["t_s"].dtype == "float64" and ok["n"].dtype == "int64"
    with pytest.raises(ScenarioError, match=r"^x.jsonl line 2: t_s 0.5 is earlier than the row above \(1\)"):
        check_trace_rows(pd.DataFrame({"t_s": [1.0, 0.5], "n": [1, 1]}), "x.jsonl", cols, ScenarioError, first_line=1)


# ---- report -------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("run") / "out"
    r = invoke("simulate", DEFAULT, "--requests", "20", "--methods", "baseline,hack", "--out", out, "--no-report")
    assert r.exit_code == 0, r.stderr
    return out


def test_report_refuses_truncated_summary_and_unknown_format(tmp_path, run_dir):
    broken = tmp_path / "broken"
    shutil.copytree(run_dir, broken)
    text = (run_dir / "summary.json").read_text()
    (broken / "summary.json").write_text(text[: len(text) // 2])
    line = assert_contract(invoke("report", broken), names=(str(broken / "summary.json"),))
    assert "not valid JSON" in line and not (broken / "report.html").exists()
    line = assert_contract(invoke("report", run_dir, "--static", "gif"), names=("--static",))
    assert "unknown image format 'gif'" in line and not (run_dir / "report.html").exists()


# ---- infinity where it means something ----------------------------------------------------------------
def test_infinite_bandwidth_means_no_transfer_time_and_survives_json(tmp_path):
    out = tmp_path / "out"
    r = invoke(
        "simulate",
        DEFAULT,
        "--requests",
        "20",
        "--methods",
        "baseline",
        "--set",
        "network.bandwidth_gbps=.inf",
        "--set",
        "network.latency_s=0",
        "--out",
        out,
        "--no-report",
    )
    assert r.exit_code == 0, r.stderr
    check_strict_json(out)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["methods"]["baseline"]["breakdown_s"]["transfer"] == 0.0
    scenario = json.loads((out / "scenario.json").read_text())
    assert scenario["network"]["bandwidth_gbps"] == "Infinity"
    again = Scenario.model_validate_json((out / "scenario.json").read_text())  # what a sweep worker does
    assert again.network.bandwidth_gbps == math.inf
    assert Scenario.model_validate_json(again.model_dump_json()) == again


def test_infinite_bandwidth_crosses_sweep_workers(tmp_path):
    sweep = tmp_path / "sweep.yaml"
    sweep.write_text(
        yaml.safe_dump(
            {
                "base": str(DEFAULT),
                "set": {"workload.requests": 15, "methods": ["baseline"], "network.latency_s": 0},
                "axes": {"network.bandwidth_gbps": [10, math.inf]},
            }
        )
    )
    r = subprocess.run(
        [
            sys.executable,
            str(ROOT / "cli.py"),
            "sweep",
            str(sweep),
            "--out",
            str(tmp_path / "o"),
            "--jobs",
            "2",
            "--no-report",
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
    )
    assert r.returncode == 0, r.stderr
    df = pd.read_csv(tmp_path / "o" / "results.csv")
    assert df["network.bandwidth_gbps"].tolist() == [10, math.inf]
    assert df["breakdown_transfer_s"].iloc[0] > 0 and df["breakdown_transfer_s"].iloc[1] == 0
    check_strict_json(tmp_path / "o")


def test_non_finite_numbers_refused_where_meaningless():
    s = load_scenario(DEFAULT)
    raw = json.loads(strict_json(s.model_dump(mode="json")))
    for path in (("network", "latency_s"), ("decode", "gpu_memory_utilization"), ("prefill", "gpu", "memory_bytes")):
        node = raw
        for k in path[:-1]:
            node = node[k]
        for bad in (math.nan, math.inf):
            saved, node[path[-1]] = node[path[-1]], bad
            with pytest.raises(Exception, match="finite number|greater than|less than"):
                Scenario.model_validate(raw)
            node[path[-1]] = saved


def test_strict_json_writer():
    text = strict_json({"a": math.nan, "b": [math.inf, -math.inf, 1.5]})
    assert json.loads(text, parse_constant=lambda c: pytest.fail(c)) == {"a": None, "b": ["Infinity", "-Infinity", 1.5]}


def test_yaml_anchors_within_bounds_still_work(tmp_path):
    p = _scenario_text(tmp_path, "x: &x {a: 1}\ny: *x\nz: {<<: *x, b: 2}\n")
    assert read_yaml(p, ValueError) == {"x": {"a": 1}, "y": {"a": 1}, "z": {"a": 1, "b": 2}}


def test_yaml_exponent_without_a_dot_is_a_float(tmp_path):
    """YAML 1.1 reads `1e-5` as a string; scenarios read it as YAML 1.2 and JSON do (kernel costs are written so)."""
    p = _scenario_text(tmp_path, "a: 1e-5\nb: -3E+2\nc: 12\nd: 1.5e-3\ne: 1e5x\n")
    assert read_yaml(p, ValueError) == {"a": 1e-5, "b": -300.0, "c": 12, "d": 1.5e-3, "e": "1e5x"}


def test_refusal_in_a_fresh_process_prints_no_traceback(tmp_path):
    path = _scenario_text(tmp_path, BOMB)
    r = subprocess.run(
        [sys.executable, str(ROOT / "cli.py"), "simulate", str(path)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=60,
    )
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and r.stderr.startswith(f"error: {path}: aliases")


# ---- rough edges found by probing (issue 30) ----------------------------------------------------------
def _with_workload(tmp_path: Path, workload: dict) -> Path:
    raw = yaml.safe_load(DEFAULT.read_text())
    raw["workload"] = workload
    return _scenario_text(tmp_path, yaml.safe_dump(raw))


@pytest.mark.parametrize("kind", ["folder", "fifo"])
@pytest.mark.parametrize("field", ["trace", "trace_csv"])
def test_a_trace_path_that_is_not_a_regular_file_is_refused_at_once(tmp_path, kind, field):
    """A folder ended in a reader's traceback; a FIFO blocked the reader forever (the case bound fails it)."""
    target = tmp_path / "t"
    target.mkdir() if kind == "folder" else os.mkfifo(target)
    workload = (
        {"trace": {"format": "azure", "path": "t"}, "requests": 5}
        if field == "trace"
        else {"trace_csv": "t", "arrival": {"kind": "poisson", "rate_rps": 1}, "requests": 5}
    )
    path = _with_workload(tmp_path, workload)
    line = assert_contract(invoke("simulate", path, "--out", tmp_path / "out", seconds=10), names=(str(path),))
    where = "workload.trace.path" if field == "trace" else "workload.trace_csv"
    assert where in line and str(target) in line
    assert ("is a folder" if kind == "folder" else "not a regular file") in line


def test_an_integer_longer_than_python_reads_is_one_line(tmp_path):
    digits = "1" * 5000
    path = _scenario_text(tmp_path, DEFAULT.read_text().replace("requests: 300", f"requests: {digits}"))
    line = assert_contract(invoke("simulate", path), names=(str(path),))
    assert "5000 digits" in line and "line " in line
    line = assert_contract(invoke("simulate", DEFAULT, "--set", f"network.bandwidth_gbps={digits}"), names=("--set",))
    assert "5000 digits" in line


@pytest.mark.parametrize(
    "override, kept",
    [
        ("workload.requests=" + "9" * 5000, "--set 'workload.requests=9999999999999999999999'... (5,018 characters)"),
        ("x" * 5000, "--set 'xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx'... (5,000 characters): expected"),
        (
            "model=" + "x" * 5000,
            "unknown model 'xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx'... (5,000 characters); known:",
        ),
        (
            "network." + "x" * 5000 + "=1",
            "network.xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx... (5,000 characters): unknown field",
        ),
        (
            "methods=[" + "x" * 5000 + "]",
            "Input tag 'xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx'... (5,000 characters) found",
        ),
    ],
    ids=["digits", "no-equals", "model", "field", "method"],
)
def test_a_long_value_is_cut_in_the_one_line_error(override, kept):
    """A 5,000-character value or key is named by its start and its length, not echoed whole: the line stays
    one a terminal shows (it was over 5,000 characters)."""
    with pytest.raises(ScenarioError) as e:
        load_scenario(DEFAULT, [override])
    line = str(e.value)
    assert kept in line and len(line) < 500 and "\n" not in line, line[:300]


def test_a_key_given_twice_is_refused_not_overwritten(tmp_path):
    """PyYAML keeps the last of two equal keys; a scenario or sweep that says a thing twice is refused."""
    text = DEFAULT.read_text().replace("network:\n", "network:\n  bandwidth_gbps: 40\n", 1)
    assert text.count("bandwidth_gbps") == 2
    path = _scenario_text(tmp_path, text)
    line = assert_contract(invoke("simulate", path), names=(str(path),))
    assert "'bandwidth_gbps' given twice" in line
    # a merge key may still be overridden
    assert read_yaml(_scenario_text(tmp_path, "a: &a {x: 1}\nb: {<<: *a, x: 2}\n", "m.yaml"), ValueError) == {
        "a": {"x": 1},
        "b": {"x": 2},
    }


@pytest.mark.parametrize(
    "args, message",
    [
        (["--out", ""], "--out '': an empty folder name"),
        (["--out", "x" * 300], "File name too long"),
        (["--set", "network.bandwidth_gbps="], "no value after '='"),
        (["--set", "network.bandwidth_gbps=  "], "no value after '='"),
        # src=".." on the page (its folder): a report whose figures never draw
        (["--out", "o", "--plotlyjs", ""], "--plotlyjs '': give a path or URL of plotly.js"),
        # ran baseline once, silently
        (["--methods", "baseline,hack,baseline"], "baseline given twice"),
    ],
    ids=["empty-out", "long-out", "empty-set", "blank-set", "empty-plotlyjs", "method-twice"],
)
def test_empty_and_overlong_options(tmp_path, monkeypatch, args, message):
    monkeypatch.chdir(tmp_path)
    line = assert_contract(
        invoke("simulate", DEFAULT, "--requests", "5", *args), names=("--out", "--set", "--plotlyjs", "--methods")
    )
    assert message in line
    assert list(tmp_path.iterdir()) == []  # nothing written, not even into the current folder


@pytest.mark.parametrize("command", ["report", "validate", "sweep"])
def test_an_empty_plotlyjs_is_refused_by_every_command_that_writes_a_page(tmp_path, command):
    args = {"report": [tmp_path], "validate": [tmp_path / "i.csv"], "sweep": [tmp_path / "s.yaml"]}[command]
    line = assert_contract(invoke(command, *args, "--plotlyjs", " "), names=("--plotlyjs",))
    assert "give a path or URL of plotly.js" in line


def test_a_label_that_would_become_the_comparison_base_is_refused(tmp_path):
    raw = yaml.safe_load(DEFAULT.read_text())
    raw["methods"] = [{"name": "hack", "label": "baseline"}, "fp8"]
    path = _scenario_text(tmp_path, yaml.safe_dump(raw))
    line = assert_contract(invoke("simulate", path), names=(str(path),))
    assert "methods.0.label" in line and "comparison base" in line
    raw["methods"] = [{"name": "baseline", "label": "baseline"}, {"name": "hack", "label": "hack_pi64"}]
    assert load_scenario(_scenario_text(tmp_path, yaml.safe_dump(raw), "ok.yaml")).methods[0].output_name == "baseline"


def test_a_link_kept_at_almost_nothing_is_refused():
    """A factor of 1e-300 "completed" with a mean JCT of 3e301 s; below 1e-6 a link is out, not slow."""
    fault = {"kind": "link_degradation", "target": "p0", "start_s": 0, "end_s": 10}
    with pytest.raises(ScenarioError, match=r"faults\.0\.factor: Input should be greater than or equal to 0\.000001"):
        load_scenario(DEFAULT, [f"faults=[{json.dumps({**fault, 'factor': 1e-300})}]"])
    ok = load_scenario(DEFAULT, [f"faults=[{json.dumps({**fault, 'factor': 1e-6})}]"])
    assert ok.faults[0].factor == 1e-6


def test_simulate_on_a_sweep_file_says_to_run_sweep():
    sweep = ROOT / "scenarios" / "sweeps" / "a10g_bandwidth_methods.yaml"
    line = assert_contract(invoke("simulate", sweep), names=(str(sweep),))
    assert "a sweep file" in line and f"sweep {sweep}" in line


@pytest.mark.parametrize(
    "args",
    [
        ["simulate", DEFAULT, "--set", "network.bandwidth_gbps=-1", "--json"],
        ["plan", DEFAULT, "--rate", "1", "--slo", "ttft_p99_s=1,ttft_p99_s=2", "--json"],
        ["sweep", "no_such_sweep.yaml", "--json"],
    ],
    ids=["simulate", "plan", "sweep"],
)
def test_with_json_a_failure_is_a_json_object_on_stdout_too(args):
    r = invoke(*args)
    line = assert_contract(r, names=("error",))
    assert json.loads(r.stdout) == {"error": line.removeprefix("error: ")}


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["plan", DEFAULT, "--rate", "1", "--json"], "Missing option '--slo'."),
        (["simulate", DEFAULT, "--json", "--bogus"], "No such option: --bogus"),
        (["sweep", "x.yaml", "--jobs", "many", "--json"], "Invalid value for '--jobs'"),
    ],
    ids=["missing", "unknown", "type"],
)
def test_with_json_a_usage_error_is_a_json_object_on_stdout_too(args, message):
    """A usage error comes from the command-line parser, before the command (and its --json error path) runs:
    stdout was empty. Without --json stdout stays empty."""
    r = invoke(*args)
    assert r.exit_code == 2 and "Traceback" not in r.output
    assert json.loads(r.stdout)["error"].startswith(message) and message in r.stderr
    r = invoke(*[a for a in args if a != "--json"])
    assert r.exit_code == 2 and r.stdout == "" and message in r.stderr


@pytest.mark.parametrize("where", ["trace", "requests.csv", "index"])
def test_validate_refuses_a_fifo_at_once(tmp_path, where):
    """`validate` read a FIFO given as the trace (or as a trace folder's requests.csv, or as an index) with
    pandas, which blocked for ever (the case bound fails a hang)."""
    if where == "requests.csv":
        (tmp_path / "t").mkdir()
        fifo, args = tmp_path / "t" / "requests.csv", ["validate", tmp_path / "t", "--scenario", DEFAULT]
    elif where == "trace":
        fifo, args = tmp_path / "t.csv", ["validate", tmp_path / "t.csv", "--scenario", DEFAULT]
    else:
        fifo, args = tmp_path / "index.csv", ["validate", tmp_path / "index.csv"]
    os.mkfifo(fifo)
    line = assert_contract(invoke(*args, seconds=10), names=(str(fifo),))
    assert "not a regular file" in line


def test_a_text_read_twice_gives_a_copy_and_a_bad_one_fails_each_time():
    from simulator.files import parse_yaml

    text = "a: &x [1, 2]\nb: *x\nc: {d: 1e-5}\n"
    first = parse_yaml(text, "one.yaml", ScenarioError)
    first["a"].append(3)
    first["c"]["d"] = 0
    second = parse_yaml(text, "one.yaml", ScenarioError)  # the same file again: the kept result, copied
    assert second == {"a": [1, 2], "b": [1, 2], "c": {"d": 1e-5}}
    assert second["a"] is second["b"]  # an alias is one object, as a fresh parse gives it
    for source in ("one.yaml", "two.yaml"):  # the error names the file it came from, every time
        with pytest.raises(ScenarioError, match=rf"^{source}: line 2 not valid YAML"):
            parse_yaml("a: [1\n", source, ScenarioError)
