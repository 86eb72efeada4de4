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
