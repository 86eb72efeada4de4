"""`sweep` and `plan` through the typer app: outputs, one-line errors, the Parquet and Ray fallbacks."""

from __future__ import annotations

import json
import sys

import pandas as pd
import pytest
import typer
import yaml
from planning_helpers import write_sweep
from typer.testing import CliRunner

import planning.sweep as sweep_module
from planning.commands import register_commands
from planning.report import figure_names

SPEC = {
    "axes": {"network.bandwidth_gbps": [10, 40], "workload.arrival.rate_rps": [0.5, 2.0]},
    "set": {"workload.requests": 20},
    "slo": {"ttft_p99_s": 5},
}


@pytest.fixture
def run():
    app = typer.Typer(add_completion=False, pretty_exceptions_enable=False)
    register_commands(app)
    return lambda *args: CliRunner().invoke(app, [str(a) for a in args])


def test_sweep_writes_table_report_and_resumes(tmp_path, base_file, run, monkeypatch):
    monkeypatch.setattr(sweep_module, "parquet_available", lambda: False)  # as if pyarrow were not installed
    out = tmp_path / "out"
    r = run("sweep", write_sweep(tmp_path, SPEC), "--out", out, "--jobs", "2")
    assert r.exit_code == 0, r.output
    assert "8 rows (0 with errors)" in r.stdout and "4 points simulated" in r.stdout
    note = [line for line in r.stderr.splitlines() if "pyarrow" in line]
    assert len(note) == 1 and "CSV only" in note[0]
    df = pd.read_csv(out / "results.csv")
    assert len(df) == 8 and not (out / "results.parquet").exists()
    assert {"fig-cost-goodput", "fig-heatmap-0"} <= set(figure_names(out / "report.html"))
    r = run("sweep", write_sweep(tmp_path, SPEC), "--out", out)
    assert "0 points simulated, 4 from the cache" in r.stdout


def test_sweep_writes_parquet_when_pyarrow_is_there(tmp_path, base_file, run):
    pytest.importorskip("pyarrow")
    out = tmp_path / "out"
    assert run("sweep", write_sweep(tmp_path, SPEC), "--out", out, "--jobs", "1").exit_code == 0
    pd.testing.assert_frame_equal(
        pd.read_parquet(out / "results.parquet").drop(columns="error"),
        pd.read_csv(out / "results.csv").drop(columns="error"),
        check_dtype=False,
    )


@pytest.mark.parametrize(
    "args, message",
    [
        (["sweep", "missing.yaml"], "missing.yaml: no such file"),
        (["sweep", "{sweep}", "--ray", "--ray-address", "x"], "not both"),
        (["sweep", "{sweep}", "--jobs", "0"], "--jobs must be >= 1"),
        (["plan", "{base}", "--rate", "1", "--slo", "ttft=3"], "unknown metric"),
        (["plan", "{base}", "--rate", "0", "--slo", "ttft_p99_s=3"], "--rate must be > 0"),
        (["plan", "{base}", "--rate", "inf", "--slo", "ttft_p99_s=3"], "--rate must be > 0 requests/s and finite"),
        (["plan", "{base}", "--rate", "nan", "--slo", "ttft_p99_s=3"], "--rate must be > 0 requests/s and finite"),
        (["plan", "{base}", "--rate", "1", "--slo", "ttft_p99_s=inf"], "a target must be finite; leave ttft_p99_s out"),
    ],
)
def test_bad_input_exits_2_with_one_line(tmp_path, base_file, run, args, message):
    sweep = write_sweep(tmp_path, SPEC)
    r = run(*[a.format(sweep=sweep, base=base_file) for a in args])
    assert r.exit_code == 2
    assert r.stderr.startswith("error: ") and message in r.stderr and r.stderr.count("\n") == 1


def test_every_point_invalid_is_bad_input(tmp_path, base_file, run):
    r = run("sweep", write_sweep(tmp_path, {"axes": {"prefill.nonsense": [1, 2]}}), "--out", tmp_path / "o")
    assert r.exit_code == 2 and "every point is invalid" in r.stderr and "unknown field" in r.stderr
    assert not (tmp_path / "o" / "results.csv").exists()


def test_ray_missing_names_the_extra(tmp_path, base_file, run, monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)
    r = run("sweep", write_sweep(tmp_path, SPEC), "--ray")
    assert r.exit_code == 2 and "pip install 'hacksim[ray]'" in r.stderr


def test_plan_prints_the_answer_and_writes_every_candidate(tmp_path, base_file, run):
    cands = tmp_path / "cands.yaml"
    cands.write_text(
        yaml.safe_dump(
            {
                "prefill": [{"instance": "g6e.12xlarge", "tensor_parallel": 1, "replicas": [1, 2]}],
                "decode": [
                    {"instance": "g6e.12xlarge", "tensor_parallel": 1, "replicas": 1},
                    {"instance": "h200x1", "replicas": 1},
                ],
                "methods": ["baseline", "hack"],
            }
        )
    )
    r = run(
        "plan",
        base_file,
        "--rate",
        "1",
        "--slo",
        "ttft_p99_s=10,jct_p90_s=20",
        "--candidates",
        cands,
        "--steps",
        "3",
        "--out",
        tmp_path / "plan",
        "--jobs",
        "2",
    )
    assert r.exit_code == 0, r.output
    assert "answer: $20.99/h" in r.stdout and "note: decode: left out h200x1 (no price" in r.stdout
    table = pd.read_csv(tmp_path / "plan" / "plan.csv")
    assert len(table) == 4 and {"goodput_rps", "meets_slo", "cost_usd_per_hour"} <= set(table.columns)
    again = run(
        "plan",
        base_file,
        "--rate",
        "1",
        "--slo",
        "ttft_p99_s=10,jct_p90_s=20",
        "--candidates",
        cands,
        "--steps",
        "3",
        "--out",
        tmp_path / "plan",
        "--json",
        "--quiet",
    )
    assert again.exit_code == 0 and again.stderr == ""
    plan = json.loads(again.stdout)
    assert round(plan["answer"]["cost_usd_per_hour"], 2) == 20.99
    assert len(plan["candidates"]) == 4 and plan["candidates"][0]["candidate"] == plan["answer"]["candidate"]
    assert all(c["why_not"] for c in plan["candidates"][1:])


# ---- rough edges (issue 30) -----------------------------------------------------------------------------
@pytest.mark.parametrize(
    "args, message",
    [
        (["sweep", "{sweep}", "--ray-timeout", "inf"], "--ray-timeout inf: give seconds"),
        (["sweep", "{sweep}", "--ray-timeout", "nan"], "--ray-timeout nan: give seconds"),
        (["plan", "{base}", "--rate", "1", "--slo", "ttft_p99_s=3", "--ray-timeout", "0"], "--ray-timeout 0"),
        (["sweep", "{sweep}", "--jobs", "1000000"], "--jobs 1000000: at most"),
        (["plan", "{base}", "--rate", "1", "--slo", "ttft_p99_s=3", "--jobs", "1000000"], "--jobs 1000000"),
        (["plan", "{base}", "--rate", "1", "--slo", "ttft_p99_s=3,ttft_p99_s=4"], "--slo ttft_p99_s: given twice"),
        (["sweep", "{sweep}", "--out", ""], "--out '': an empty folder name"),
        (["plan", "{base}", "--rate", "1", "--slo", "ttft_p99_s=3", "--out", ""], "--out '': an empty folder"),
        (["plan", "{base}", "--rate", "1", "--slo", "ttft_p99_s=3", "--set", "workload.seed="], "no value after"),
    ],
    ids=[
        "timeout-inf",
        "timeout-nan",
        "timeout-0",
        "jobs-sweep",
        "jobs-plan",
        "slo-twice",
        "out-sweep",
        "out-plan",
        "set",
    ],
)
def test_rough_options_exit_2_with_one_line_before_any_work(tmp_path, base_file, run, monkeypatch, args, message):
    monkeypatch.chdir(tmp_path)
    sweep = write_sweep(tmp_path, SPEC)
    before = sorted(tmp_path.iterdir())
    r = run(*[a.format(sweep=sweep, base=base_file) for a in args])
    assert r.exit_code == 2, r.output
    assert r.stderr.startswith("error: ") and message in r.stderr and r.stderr.count("\n") == 1, r.stderr
    assert sorted(tmp_path.iterdir()) == before  # nothing written, no point simulated


def test_jobs_is_bounded_by_the_cores_here(tmp_path, base_file, run, monkeypatch):
    import planning.executor as executor

    monkeypatch.setattr(executor, "usable_cores", lambda: 2)
    r = run("sweep", write_sweep(tmp_path, SPEC), "--jobs", "9", "--out", tmp_path / "o")
    assert r.exit_code == 2 and "--jobs 9: at most 8 on this machine (4 per core" in r.stderr


@pytest.mark.parametrize(
    "name, message",
    [("../../x", "not a plain folder name"), ("{abs}", "not a plain folder name"), ("x" * 300, "300 characters")],
    ids=["dotdot", "absolute", "long"],
)
def test_a_sweep_name_cannot_leave_out_sweeps(tmp_path, base_file, run, monkeypatch, name, message):
    """A sweep's name became out/sweeps/NAME: `../../x` or an absolute name wrote outside out/."""
    here = tmp_path / "a" / "b"
    here.mkdir(parents=True)
    monkeypatch.chdir(here)
    elsewhere = tmp_path / "elsewhere"
    r = run("sweep", write_sweep(tmp_path, {**SPEC, "name": name.format(abs=elsewhere)}))
    assert r.exit_code == 2 and message in r.stderr and r.stderr.count("\n") == 1, r.stderr
    assert list(here.iterdir()) == [] and not (tmp_path / "x").exists() and not elsewhere.exists()


def test_a_huge_grid_is_refused_and_a_large_one_warned(tmp_path, base_file, run, monkeypatch):
    big = {"axes": {f"a{i}": list(range(10)) for i in range(6)}}  # 10^6 points
    r = run("sweep", write_sweep(tmp_path, big), "--out", tmp_path / "o")
    assert r.exit_code == 2 and "1,000,000 points, more than the 100,000 a sweep may have" in r.stderr
    monkeypatch.setattr(sweep_module, "WARN_SWEEP_POINTS", 3)
    r = run("sweep", write_sweep(tmp_path, SPEC), "--out", tmp_path / "o", "--jobs", "1", "--no-report")
    assert r.exit_code == 0 and "warning: sweep sweep has 4 points" in r.stderr
    r = run("sweep", write_sweep(tmp_path, SPEC), "--out", tmp_path / "o", "--quiet", "--no-report")
    assert r.exit_code == 0 and r.stderr == "" and r.stdout == ""


def test_sweep_json_is_sweep_json_and_the_files(tmp_path, base_file, run):
    out = tmp_path / "o"
    r = run("sweep", write_sweep(tmp_path, SPEC), "--out", out, "--jobs", "1", "--json")
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    saved = json.loads((out / "sweep.json").read_text())
    assert {k: doc[k] for k in saved} == saved and (saved["points"], saved["rows"], saved["errors"]) == (4, 8, 0)
    assert doc["files"] == [str(out / n) for n in ("results.csv", "results.parquet", "report.html")]
    assert doc["run"]["simulated"] == 4 and "wrote" not in r.stdout


def test_results_say_each_fact_once_in_its_type(tmp_path, base_file, run):
    pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    spec = {**SPEC, "axes": {**SPEC["axes"], "prefill.instance": ["g6e.12xlarge", "nope"]}}
    out = tmp_path / "o"
    assert run("sweep", write_sweep(tmp_path, spec), "--out", out, "--jobs", "1", "--no-report").exit_code == 0
    text = (out / "results.csv").read_text().splitlines()
    head = text[0].split(",")
    # the axes swept keep their values; the config columns that said them again, and a repeated metric, are gone
    for gone in ("network_bandwidth_gbps", "rate_rps", "prefill_instance", "decode_memory_kv_capacity_bytes"):
        assert gone not in head, gone
    assert len(head) == len(set(head))
    ok = next(line.split(",") for line in text[1:] if line.split(",")[head.index("method")] == "baseline")
    for col in ("peak_decode_memory_bytes", "decode_kv_capacity_bytes", "decode_memory_kv_pool_bytes_per_gpu"):
        assert ok[head.index(col)].isdigit(), (col, ok[head.index(col)])  # whole bytes, not 1.8e10 or 25322701946.88
    assert ok[head.index("error")] == ""
    table = pq.read_table(out / "results.parquet")
    df = table.to_pandas()
    assert df["error"].isna().sum() == 8 and df["error"].notna().sum() == 4  # null, not "", where nothing failed
    assert str(df["peak_decode_memory_bytes"].dtype) == "Int64" and str(df["stable"].dtype) == "boolean"
    meta = json.loads(table.schema.metadata[b"hacksim"])
    assert meta["base"]["name"] == "tiny-plan" and meta["sweep"]["axes"] == spec["axes"]
    assert meta["units"]["jct_p90_s"] == "s" and meta["units"]["network.bandwidth_gbps"] == "Gbit/s"
    assert (
        meta["units"]["peak_decode_memory_bytes"] == "bytes"
        and meta["units"]["kv_wire_bytes_per_token"] == "bytes/token"
    )
    assert table.schema.field("ttft_p99_s").metadata == {b"unit": b"s"}


def test_an_interrupted_write_leaves_the_previous_outputs(tmp_path, base_file, run, monkeypatch):
    """The tables and the report are written beside each other in a temporary folder and moved in together."""
    import planning.report as report_module

    out = tmp_path / "o"
    sweep = write_sweep(tmp_path, SPEC)
    assert run("sweep", sweep, "--out", out, "--jobs", "1").exit_code == 0
    before = {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()}
    sweep.write_text(sweep.read_text().replace("requests: 20", "requests: 21"))

    def stop(*_a, **_k):
        raise KeyboardInterrupt

    monkeypatch.setattr(report_module, "write_page", stop)
    r = run("sweep", sweep, "--out", out, "--jobs", "1")
    assert r.exit_code == 130 and "interrupted by SIGINT" in r.stderr
    assert {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()} == before
    assert not list(out.glob(".hacksim-*"))


def test_an_interrupt_before_any_point_finished_names_no_cache(tmp_path, base_file, run, monkeypatch):
    """Ctrl-C before the first point ends: no cache folder exists, so the message offers no resume from it."""

    def stop(*_a, **_k):
        raise KeyboardInterrupt

    monkeypatch.setattr(sweep_module, "run_sweep", stop)
    out = tmp_path / "o"
    r = run("sweep", write_sweep(tmp_path, SPEC), "--out", out, "--jobs", "1")
    assert r.exit_code == 130 and r.stderr == "interrupted by SIGINT before any point finished; nothing was written\n"
    assert not out.exists()
    (out / ".cache").mkdir(parents=True)  # an earlier run's points: those a rerun resumes from
    r = run("sweep", write_sweep(tmp_path, SPEC), "--out", out, "--jobs", "1")
    assert r.exit_code == 130 and f"are cached in {out / '.cache'}; run the same command to resume" in r.stderr


def test_sweep_and_candidates_files_have_schemas():
    import jsonschema

    from planning.executor import ROOT

    folder = ROOT / "scenarios" / "sweeps"
    for kind in ("sweep", "candidates"):
        shipped = json.loads((folder / f"{kind}.schema.json").read_text())
        r = CliRunner().invoke(__import__("cli").app, ["schema", kind])
        assert json.loads(r.stdout) == shipped, (
            f"regenerate it: python cli.py schema {kind} > {folder}/{kind}.schema.json"
        )
        jsonschema.Draft202012Validator.check_schema(shipped)
    for path in sorted(folder.glob("*.yaml")):
        first = path.read_text().splitlines()[0]
        assert first.startswith("# yaml-language-server: $schema="), path
        schema = json.loads((folder / first.split("$schema=", 1)[1]).read_text())
        assert not list(jsonschema.Draft202012Validator(schema).iter_errors(yaml.safe_load(path.read_text()))), path
    sweep = jsonschema.Draft202012Validator(json.loads((folder / "sweep.schema.json").read_text()))
    assert not sweep.is_valid({"base": "b.yaml", "axes": {"a": [1]}, "slo": {"ttft_p98_s": 1}})
    assert not sweep.is_valid({"base": "b.yaml", "axes": {"a": [1]}, "name": "../x"})
    assert not sweep.is_valid({"base": "b.yaml", "axes": {"a": [1]}, "nonsense": 1})
    assert sweep.is_valid({"base": "b.yaml", "axes": {"a": [1]}, "slo": {"ttft_p99_s": 1}, "name": "ok_1"})
