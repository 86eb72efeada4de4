"""Engine calibration (simulator/calibrate.py, simulator/engine.py): the fit recovers the parameters a trace the
simulator generated was made with, its standard errors are honest, the file round-trips into a scenario."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml

from simulator.calibrate import (
    engine_file,
    fit_engine,
    load_index,
    predict,
    standard_errors,
)
from simulator.config import ScenarioError, parse_scenario
from simulator.decode import iteration_rows
from simulator.engine import PARAMETERS, apply_values, read_engine_file
from simulator.load import load_scenario
from simulator.run import MethodRun, resolve, run_scenario
from simulator.workload import make_requests

ROOT = Path(__file__).resolve().parent.parent
BASE = ROOT / "scenarios" / "measured" / "h200g_8b_sat.yaml"

# what the "engine" really does: every value differs from the scenario file's (BASE)
# (one model: a constant per layer is a constant, so extra kernels and prefill issue time per layer stay the
# file's, 3 and 0, and the fit must hold them, naming why)
TRUE = {
    "decode.host_serial_s_per_iteration": 0.0004,
    "decode.join_s_per_request": 0.001,
    "prefill.prefill_efficiency": 0.8,
    "prefill.host_issue_s_per_iteration": 0.012,
    "network.efficiency": 0.7,
    "network.latency_s": 0.002,
    "methods.kvquant.quantize": 2.0,
    "methods.kvquant.dequantize": 1.5,
    "methods.kvquant.prefill_issue_s_per_layer": 1e-4,
    "methods.hack.quantize": 3.0,
    "methods.hack.approximation": 1.3,
    "methods.hack.prefill_issue_s_per_layer": 4e-4,
}
COLUMNS = [
    "request_id",
    "method",
    "arrival_s",
    "prompt_tokens",
    "output_tokens",
    "prefill_start_s",
    "prefill_end_s",
    "quantize_end_s",
    "transfer_start_s",
    "transfer_end_s",
    "decode_start_s",
    "first_token_s",
    "finish_s",
]


def _raw() -> dict:
    raw = yaml.safe_load(BASE.read_text())
    raw["workload"] = {
        "input_tokens": {"kind": "uniform", "min_tokens": 64, "max_tokens": 4096},
        "output_tokens": {"kind": "uniform", "min_tokens": 16, "max_tokens": 96},
        "arrival": {"kind": "poisson", "rate_rps": 6.0},
        "requests": 80,
        "seed": 3,
    }
    raw["network"]["bandwidth_gbps"] = 10
    return raw


def _simulated_traces(tmp_path: Path) -> Path:
    """The simulator run at TRUE, written as measured traces (requests.csv, iterations.csv, meta.json) with
    an index whose scenario is BASE's system at the file's own engine values."""
    raw = _raw()
    scen_path = tmp_path / "system.yaml"
    scen_path.write_text(yaml.safe_dump(raw))
    s = apply_values(parse_scenario(raw, "test"), TRUE)
    res, reqs = resolve(s, "test"), make_requests(s)
    rows = []
    for cfg in s.methods:
        run = MethodRun(res, cfg, reqs, "test")
        run.records.iteration_log = []
        run.simulate()
        df = run.requests_frame()
        df["quantize_end_s"] = df["encode_end_s"] if "encode_end_s" in df.columns else df["quantize_end_s"]
        folder = tmp_path / cfg.output_name
        folder.mkdir()
        df[COLUMNS].to_csv(folder / "requests.csv", index=False)
        it = pd.DataFrame(
            iteration_rows(run.records.iteration_log), columns=["start_s", "end_s", "batch_size", "context_tokens"]
        )
        it.to_csv(folder / "iterations.csv", index=False)
        (folder / "meta.json").write_text(json.dumps({"method": cfg.output_name, "decode_mode": "graphs"}))
        rows.append((cfg.output_name, str(scen_path)))
    pd.DataFrame(rows, columns=["trace", "scenario"]).to_csv(tmp_path / "index.csv", index=False)
    return tmp_path / "index.csv"


@pytest.fixture(scope="module")
def simulated(tmp_path_factory):
    index = _simulated_traces(tmp_path_factory.mktemp("calib"))
    return index, load_index(index)


def test_fit_recovers_the_parameters_of_a_simulated_trace(simulated):
    _, traces = simulated
    fit = fit_engine(traces)
    assert set(fit.fitted) == set(TRUE), (sorted(fit.fitted), fit.held)
    for name, true in TRUE.items():
        # the simulator's own trace: no noise, so the fit lands on the truth (to the solver's tolerance)
        assert fit.fitted[name] == pytest.approx(true, rel=1e-4, abs=1e-7), name
        assert fit.stderr[name] <= 1e-3 * max(true, 1e-4), name
    # what cannot be seen is held, with the reason: graphs (one launch per step), methods without the step,
    # per-layer terms the one model's traces cannot tell from per-iteration ones
    assert "CUDA graph" in fit.held["decode.host_issue_s_per_layer"]
    assert "no time for the step" in fit.held["methods.baseline.dequantize"]
    for name in ("decode.extra_kernels_per_layer", "prefill.host_issue_s_per_layer"):
        assert "cannot tell it apart" in fit.held[name], name


def test_fit_recovers_known_parameters_from_noisy_items_within_its_standard_errors(simulated):
    """Every measured item replaced by the truth's prediction times 3 % lognormal noise: each parameter
    comes back within three of its standard errors, and those errors are not vanishing."""
    _, clean = simulated
    rng = np.random.default_rng(7)
    traces = []
    for td in clean:
        v = {**td.values0, **TRUE}
        blocks = {}
        for kind, blk in td.blocks.items():
            blocks[kind] = {**blk, "meas": predict(td, kind, v) * rng.lognormal(0.0, 0.03, len(blk["meas"]))}
        traces.append(type(td)(**{**td.__dict__, "blocks": blocks}))
    fit = fit_engine(traces)
    for name, true in TRUE.items():
        if name not in fit.fitted:
            continue
        se = fit.stderr[name]
        if PARAMETERS[name].integer:
            assert fit.fitted[name] == true, name
            continue
        assert 0 < se < 0.5 * max(true, 1e-4), (name, se)
        assert abs(fit.fitted[name] - true) <= 3 * se, (name, fit.fitted[name], true, se)
    assert {
        "decode.host_serial_s_per_iteration",
        "prefill.prefill_efficiency",
        "network.efficiency",
        "methods.kvquant.dequantize",
    } <= set(fit.fitted)


def test_standard_errors_match_ordinary_least_squares():
    """On a linear model the Jacobian's covariance is the textbook one, s² (XᵀX)⁻¹; a column the others
    span is named, not given an error."""
    rng = np.random.default_rng(1)
    x = rng.uniform(0, 10, 200)
    j = np.column_stack([np.ones_like(x), x])
    r = rng.normal(0, 0.5, 200)
    se, dependent = standard_errors(r, j, ["a", "b"])
    cov = np.linalg.inv(j.T @ j) * (r @ r) / (200 - 2)
    assert se["a"] == pytest.approx(np.sqrt(cov[0, 0]))
    assert se["b"] == pytest.approx(np.sqrt(cov[1, 1]))
    assert not dependent
    se, dependent = standard_errors(r, np.column_stack([j, 2 * j[:, 1], np.zeros_like(x)]), ["a", "b", "c", "d"])
    assert dependent == {"c"} and np.isinf(se["c"]) and np.isinf(se["d"])


def test_engine_file_round_trips_into_a_scenario(simulated, tmp_path):
    index, traces = simulated
    fit = fit_engine(traces)
    doc = engine_file(fit, traces, str(index), "test", "0")
    path = tmp_path / "engine.json"
    path.write_text(json.dumps(doc))
    eng = read_engine_file(path, ScenarioError)
    assert eng.fitted() == pytest.approx(fit.fitted)
    assert doc["provenance"]["traces"][0]["files"]["requests.csv"]
    raw = _raw()
    raw["calibration"] = {"engine": "engine.json"}
    scen = tmp_path / "calibrated.yaml"
    scen.write_text(yaml.safe_dump(raw))
    s = load_scenario(scen)
    assert s.decode.join_s_per_request == pytest.approx(TRUE["decode.join_s_per_request"], rel=1e-4)
    assert s.network.efficiency == pytest.approx(TRUE["network.efficiency"], rel=1e-4)
    assert s.calibration.implementation_factors["kvquant"].dequantize == pytest.approx(1.5, rel=1e-4)
    assert s.decode.extra_kernels_per_layer == 3  # held: the file's
    # reports name the file and what it fitted
    eng = run_scenario(s, source=str(scen), methods=["kvquant"]).profiles()["engine"]
    assert eng["path"] == str(path.resolve()) and "network.efficiency" in eng["fitted"]
    assert "decode.extra_kernels_per_layer" in eng["held"]


@pytest.mark.parametrize(
    "content, message",
    [
        ("{", "not valid JSON"),
        (
            (
                '{"schema_version": 1, "kind": "hacksim-engine-calibration", "parameters": {"decode.nope": '
                '{"value": 1, "fitted": true}}}'
            ),
            "decode.nope: unknown parameter",
        ),
        (
            (
                '{"schema_version": 1, "kind": "hacksim-engine-calibration", "parameters": {"network.efficiency": '
                '{"value": 1.5, "fitted": true}}}'
            ),
            "outside its bounds",
        ),
    ],
)
def test_a_bad_engine_file_is_one_line_naming_it(tmp_path, content, message):
    (tmp_path / "engine.json").write_text(content)
    raw = _raw()
    raw["calibration"] = {"engine": "engine.json"}
    scen = tmp_path / "s.yaml"
    scen.write_text(yaml.safe_dump(raw))
    with pytest.raises(ScenarioError, match=message) as e:
        load_scenario(scen)
    assert "calibration.engine" in str(e.value) and "\n" not in str(e.value)


def test_calibrate_traces_cli_writes_the_file_and_refuses_bad_input(simulated, tmp_path):
    index, _ = simulated
    out = tmp_path / "engine.json"
    p = subprocess.run(
        [sys.executable, str(ROOT / "cli.py"), "calibrate", "--traces", str(index), "--out", str(out), "--json"],
        check=False,
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    assert p.returncode == 0, p.stderr
    doc = json.loads(p.stdout)
    assert json.loads(out.read_text()) == doc
    assert doc["parameters"]["network.efficiency"]["fitted"]
    bad = tmp_path / "bad.csv"
    bad.write_text("trace\nx\n")
    p = subprocess.run(
        [sys.executable, str(ROOT / "cli.py"), "calibrate", "--traces", str(bad), "--out", str(tmp_path / "e2.json")],
        check=False,
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    assert p.returncode == 2 and "scenario" in p.stderr and "Traceback" not in p.stderr
    assert not (tmp_path / "e2.json").exists()


def test_validate_cv_cli_json_shape(simulated, tmp_path):
    index, _ = simulated
    p = subprocess.run(
        [sys.executable, str(ROOT / "cli.py"), "validate", str(index), "--cv", "--json"],
        check=False,
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    assert p.returncode == 0, p.stderr
    r = json.loads(p.stdout)
    keys = {
        "jct_mean_abs_error_pct",
        "jct_max_abs_error_pct",
        "ttft_p50_mean_abs_error_pct",
        "tpot_p50_mean_abs_error_pct",
    }
    assert r["traces"] == 3 and keys <= set(r["held_out"]) and keys <= set(r["in_sample"])
    assert "held_out_configuration" not in r  # one configuration: nothing to leave out
    assert [t["trace"] for t in r["per_trace"]] == ["baseline", "kvquant", "hack"]
    # the traces are the simulator's own at the parameters fitted in-sample: errors vanish there
    assert r["in_sample"]["jct_max_abs_error_pct"] < 0.1
    # the KVQuant trace's dequantization share, measured against its baseline twin, beside the prediction
    (share,) = r["dequantize_share"]
    assert share["trace"] == "kvquant" and share["reference"] == "baseline" and share["measured_pct"] > 0
    p = subprocess.run(
        [sys.executable, str(ROOT / "cli.py"), "validate", str(index.parent / "hack"), "--cv"],
        check=False,
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    assert p.returncode == 2 and "--cv needs an index" in p.stderr
