"""Cross-validation (simulator/crossval.py) holds out what it says it holds out: each run's held-out prediction
comes from a fit on exactly the other runs, its held-out-configuration one from a fit on exactly the other
configurations' runs; no fit means none; a configuration predicted worse than with no fit is flagged; and a
SIGTERM ends the workers with the caller."""

from __future__ import annotations

import html
import json
import math
import signal
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import pytest

from simulator import comparison, crossval
from simulator.fit_items import TraceData
from tests.progress_spy import ProgressSpy

ROOT = Path(__file__).resolve().parent.parent
CONFIGS = ["a", "a", "b", "b", "b", "c"]


def _traces() -> list[TraceData]:
    return [
        TraceData(name=f"t{i}", scenario=f"{c}.yaml", configuration=c, method="m", family="baseline", values0={})
        for i, c in enumerate(CONFIGS)
    ]


class _Row:
    def __init__(self, i: int):
        self.trace, self.trace_path, self.scenario_path, self.method = f"t{i}", Path(f"t{i}"), Path("s"), None
        self.machine = None


def _spy(monkeypatch, traces: list[TraceData]) -> None:
    """Fits that record which runs they were given (as a bit mask in a parameter value) and scores that read it
    back: the folds are checked without fitting or simulating anything."""
    monkeypatch.setattr(crossval, "load_index", lambda index, *a: traces)
    monkeypatch.setattr("simulator.measured.read_index", lambda index: [_Row(i) for i in range(len(traces))])

    class Fit:
        def __init__(self, used):
            self.fitted = {"network.latency_s": float(sum(2 ** int(td.name[1:]) for td in used))}
            self.machines: dict = {}

    monkeypatch.setattr(crossval, "fit_engine", lambda used, prior_scale=1.0: Fit(used))

    def score(td, trace_path, scenario_path, method, values):
        mask = -1.0 if values is None else values["network.latency_s"]
        return {"jct_mean_error_pct": mask, "ttft_p50_error_pct": 0.0, "tpot_p50_error_pct": 0.0}

    monkeypatch.setattr(crossval, "_score", score)
    # each run's mean JCT elasticity in its host's speed: its meta's, else 0
    elasticity = {td.name: td.meta.get("elasticity", 0.0) for td in traces}
    monkeypatch.setattr(crossval, "run_host_sensitivity", lambda trace_path, *a: elasticity[trace_path.name])
    monkeypatch.setattr(crossval, "dequantize_shares", lambda *a: [])


@pytest.fixture
def spied(monkeypatch):
    _spy(monkeypatch, _traces())
    return crossval.cross_validate("index.csv", workers=1)


def test_each_held_out_prediction_comes_from_a_fit_without_it(spied):
    everyone = 2 ** len(CONFIGS) - 1
    for i, (r, config) in enumerate(zip(spied["per_trace"], CONFIGS)):
        same = sum(2**j for j, c in enumerate(CONFIGS) if c == config)
        assert r["no_fit"]["jct_mean_error_pct"] == -1.0  # no fit at all
        assert r["in_sample"]["jct_mean_error_pct"] == everyone
        assert r["held_out"]["jct_mean_error_pct"] == everyone - 2**i, r["trace"]
        # leave one configuration out: none of its runs, all of the others'
        assert r["held_out_configuration"]["jct_mean_error_pct"] == everyone - same, r["trace"]


def test_each_configuration_carries_what_the_host_speed_alone_moves_it_by(monkeypatch):
    """Each run's mean JCT elasticity in its host's time (validate.run_host_sensitivity: no fit, on a host 1.25x faster
    and slower) times the host's run-to-run spread (the repeats' own quantize step, else
    host_speed.HOST_SPEED_SPREAD_PCT) is its host spread; a configuration's is its runs' RMS, in the table."""
    from simulator.host_speed import HOST_SPEED_SPREAD_PCT

    traces = _traces()
    for td, e in zip(traces, (0.2, 0.4, 0.0, 0.0, 0.3, 1.0)):
        td.meta = {"elasticity": e}
    _spy(monkeypatch, traces)
    r = crossval.cross_validate("index.csv", workers=1, by=("configuration",))
    assert [t["host_sensitivity"] for t in r["per_trace"]] == pytest.approx([0.2, 0.4, 0.0, 0.0, 0.3, 1.0], abs=1e-4)
    spread = {c["configuration"]: c["host_spread_jct_mean_pct"] for c in r["configurations"]}
    h = HOST_SPEED_SPREAD_PCT
    assert spread == pytest.approx({"a": h * math.sqrt(0.1), "b": h * 0.3 / math.sqrt(3), "c": h}, abs=2e-3)
    assert r["host_speed"]["spread_pct"] == h
    text = crossval.format_cv(r)
    assert "host speed alone" in text and f"±{h:.1f}%" in text and f"(±{h:.1f} %, H200 device sessions'" in text
    noise = {"index": "repeats.csv", "spread_pct": {"jct_mean": 1.5, "quantize_mean": 10.0}, "range_pct": {}}
    own = crossval.cross_validate("index.csv", workers=1, by=("configuration",), noise=noise)
    assert own["host_speed"] == {"spread_pct": 10.0, "from": "repeats.csv: its recordings' quantize mean"}
    assert own["configurations"][2]["host_spread_jct_mean_pct"] == pytest.approx(10.0)


def test_folds_by_configuration_alone_fit_once_per_configuration(monkeypatch):
    """validate --cv --folds configuration: the in-sample fit and one per configuration, no fit per run; the
    held-out-configuration predictions are the same as with both, and the result says what was not fitted."""
    _spy(monkeypatch, _traces())
    fitted = []
    fit = crossval.fit_engine
    monkeypatch.setattr(crossval, "fit_engine", lambda used, prior_scale=1.0: fitted.append(len(used)) or fit(used))
    both = crossval.cross_validate("index.csv", workers=1)
    assert len(fitted) == 1 + len(CONFIGS) + len(set(CONFIGS))
    fitted.clear()
    only = crossval.cross_validate("index.csv", workers=1, by=("configuration",))
    assert sorted(fitted) == sorted([len(CONFIGS)] + [len(CONFIGS) - CONFIGS.count(c) for c in set(CONFIGS)])
    assert "held_out" not in only and only["notes"] == ["held out (trace): not fitted (folds by configuration only)"]
    for a, b in zip(both["per_trace"], only["per_trace"]):
        assert a["held_out_configuration"] == b["held_out_configuration"] and b["held_out"] == {}
    drop = "held_out_jct_mean_abs_error_pct"
    assert [c.pop(drop) for c in only["configurations"]] == [None] * len(set(CONFIGS))
    assert only["configurations"] == [{k: v for k, v in c.items() if k != drop} for c in both["configurations"]]
    assert "held out (trace)" not in crossval.format_cv(only).splitlines()[1]
    with pytest.raises(crossval.ScenarioError, match="folds: run"):
        crossval.cross_validate("index.csv", by=("run",))


def test_validate_folds_refuses_what_it_cannot_do(tmp_path):
    """--folds: an unknown value, without --cv, or with --base: one line naming the option, exit 2."""
    index = ROOT / "realrun/traces/h200_graphs/index.csv"
    cases = (
        (["--cv", "--folds", "runs"], "--folds: runs: one of both, configuration, trace"),
        (["--folds", "configuration"], "--folds chooses validate --cv's held-out fits: give --cv with it"),
        (["--cv", "--folds", "trace", "--base", str(tmp_path / "e.json")], "--folds: --cv --base fits one machine"),
    )
    for extra, said in cases:
        p = subprocess.run(
            [sys.executable, str(ROOT / "cli.py"), "validate", str(index), *extra], capture_output=True, text=True
        )
        assert p.returncode == 2 and p.stderr.strip().startswith("error: " + said), (extra, p.stderr)
        assert "Traceback" not in p.stderr and len(p.stderr.strip().splitlines()) == 1, p.stderr


def test_runs_of_one_configuration_have_no_held_out_configuration_and_say_why(monkeypatch):
    """Two runs of one scenario: each is held out from a fit on the other, but no configuration can be (a fit
    without the only one has no data): the result says so, and carries the run-to-run spread it was given."""
    traces = [
        TraceData(name=f"t{i}", scenario="a.yaml", configuration="a", method="m", family="baseline", values0={})
        for i in range(2)
    ]
    _spy(monkeypatch, traces)
    noise = {"index": "repeats.csv", "spread_pct": {"jct_mean": 1.5}, "range_pct": {}}
    result = crossval.cross_validate("index.csv", workers=1, noise=noise)
    assert "held_out" in result and "held_out_configuration" not in result
    assert result["notes"] == ["held out (configuration): needs two configurations or more (runs of two scenarios)"]
    assert result["noise"] == {
        "index": "repeats.csv",
        "spread_pct": {"jct_mean": 1.5},
        "host_gauge": None,
        "against_reference": None,
    }


def test_a_configuration_predicted_worse_than_no_fit_is_flagged():
    per_trace = [
        {
            "configuration": "a",
            "no_fit": {"jct_mean_error_pct": -3.0},
            "held_out_configuration": {"jct_mean_error_pct": 4.0},
        },
        {
            "configuration": "a",
            "no_fit": {"jct_mean_error_pct": 3.4},
            "held_out_configuration": {"jct_mean_error_pct": -3.0},
        },
        {
            "configuration": "b",
            "no_fit": {"jct_mean_error_pct": 10.0},
            "held_out_configuration": {"jct_mean_error_pct": 2.0},
        },
    ]
    for r in per_trace:
        r["in_sample"], r["held_out"] = {}, {}
    rows = {c["configuration"]: c for c in crossval.by_configuration(per_trace)}
    # a: mean |error| 3.5 held out against 3.2 with no fit: worse; b: 2 against 10
    assert rows["a"]["held_out_configuration_jct_mean_abs_error_pct"] == 3.5
    assert rows["a"]["no_fit_jct_mean_abs_error_pct"] == 3.2
    assert rows["a"]["worse_than_no_fit"] and not rows["b"]["worse_than_no_fit"]
    assert "run_to_run_jct_mean_pct" not in rows["a"]
    # with repeated recordings of scenario a (simulator/noise.py, by_scenario): its spread beside its errors, in the
    # table validate --cv prints; b was not recorded twice
    noise = {"index": "r.csv", "spread_pct": {"jct_mean": 2.0}, "by_scenario": {"a": {"jct_mean": 3.25}}}
    configurations = crossval.by_configuration(per_trace, noise)
    rows = {c["configuration"]: c for c in configurations}
    assert rows["a"]["run_to_run_jct_mean_pct"] == 3.25 and rows["b"]["run_to_run_jct_mean_pct"] is None
    result = {
        "traces": 3,
        "per_trace": [{**r, "trace": f"t{i}"} for i, r in enumerate(per_trace)],
        "configurations": configurations,
        "worse_than_no_fit": ["a"],
        "noise": noise,
        "no_fit": crossval.summarise(per_trace, "no_fit"),
        "held_out_configuration": crossval.summarise(per_trace, "held_out_configuration"),
    }
    text = crossval.format_cv(result)
    line_a = next(x for x in text.splitlines() if x.startswith("a ") and "WORSE" in x)
    assert "±3.2%" in line_a or "±3.3%" in line_a
    assert "not recorded" in next(x for x in text.splitlines() if x.startswith("b "))
    # the flag says by how much, against the configuration's own run-to-run spread
    flag = next(x for x in text.splitlines() if x.startswith("flag:"))
    assert flag.endswith("a (by 0.3 points; its recordings' mean JCT spreads ±3.2 % run to run)") or flag.endswith(
        "a (by 0.3 points; its recordings' mean JCT spreads ±3.3 % run to run)"
    ), flag


def test_each_method_against_the_reference_over_the_same_requests():
    """A method's mean JCT against FP16's is taken within one workload on one host (comparison.workload_key): a realrun
    run pairs with FP16's of the same process (meta date) and rate, a benchmark file with FP16's of its configuration
    on its machine. a, process d1: FP16 measured 1.0 s (no fit 1.1, held out 1.0), HACK 1.5 (1.5, 1.6): measured +50 %,
    no fit +36.36 % (−13.64 points), held out +60 % (+10); HACK's second run in process d2 has no FP16 beside it and
    makes no row; b (benchmark files): KVQuant-style on m1 with FP16 there, 2.0 against 1.6 (two FP16 runs, mean of
    1.5 and 1.7): +25 %; on m2 no FP16. A scheme that did not score every run of a row leaves it out."""

    def trace(name, c, family, source="realrun", date=None):
        meta = {"rate_rps": 5.0, "seed": 1, "requests": 10, "date": date} if source == "realrun" else {"date": "x"}
        return TraceData(name, f"{c}.yaml", c, family, family, {}, meta=meta, source=source)

    def scored(meas, no_fit, held):
        return {
            "no_fit": {"jct_mean_measured_s": meas, "jct_mean_simulated_s": no_fit},
            "held_out_configuration": {}
            if held is None
            else {"jct_mean_measured_s": meas, "jct_mean_simulated_s": held},
        }

    traces = [
        trace("f", "a", "baseline", date="d1"),
        trace("h", "a", "hack", date="d1"),
        trace("h2", "a", "hack", date="d2"),
        trace("bf1", "b", "baseline", "vllm"),
        trace("bf2", "b", "baseline", "vllm"),
        trace("bk", "b", "kvquant", "vllm"),
        trace("bk2", "b", "kvquant", "vllm"),
    ]
    machines = [None, None, None, "m1", "m1", "m1", "m2"]
    per_trace = [
        scored(1.0, 1.1, 1.0),
        scored(1.5, 1.5, 1.6),
        scored(9.0, 9.0, 9.0),
        scored(1.5, 1.5, 1.5),
        scored(1.7, 1.7, None),
        scored(2.0, 2.0, 2.0),
        scored(2.0, 2.0, 2.0),
    ]
    schemes = ("no_fit", "held_out_configuration")
    noise = {"against_reference": {"spread_pts": 6.0, "by_scenario": {"a": 4.5}}}
    comp = comparison.against_reference(per_trace, traces, machines, schemes, noise)
    rows = {(r["configuration"], r["method"]): r for r in comp["rows"]}
    assert set(rows) == {("a", "hack"), ("b", "kvquant")}
    a, b = rows["a", "hack"], rows["b", "kvquant"]
    assert a["runs"] == ["h"] and a["reference_runs"] == ["f"] and a["workload"]["date"] == "d1"
    assert a["measured_pct"] == pytest.approx(50.0)
    assert a["no_fit"] == {
        "predicted_pct": pytest.approx(100 * (1.5 / 1.1 - 1), abs=1e-3),
        "error_pts": pytest.approx(-13.636, abs=1e-3),
    }
    assert a["held_out_configuration"]["error_pts"] == pytest.approx(10.0)
    assert a["run_to_run_pts"] == 4.5 and b["run_to_run_pts"] is None
    assert b["machine"] == "m1" and b["reference_runs"] == ["bf1", "bf2"] and b["measured_pct"] == pytest.approx(25.0)
    assert b["held_out_configuration"] is None  # bf2 has no held-out score
    assert comp["summary"]["no_fit"] == {
        "rows": 2,
        "mean_abs_error_pts": pytest.approx(13.636 / 2, abs=1e-3),
        "max_abs_error_pts": pytest.approx(13.636, abs=1e-3),
    }
    assert comp["summary"]["held_out_configuration"]["rows"] == 1 and comp["run_to_run_pts"] == 6.0
    text = "\n".join(
        comparison.format_against_reference({"against_reference": comp, "noise": {}}, schemes, crossval.HEADS)
    )
    line = next(x for x in text.splitlines() if x.startswith("a "))
    assert "+50.0%" in line and "+36.4% (-13.6)" in line and "+60.0% (+10.0)" in line and "±4.5" in line
    assert "not recorded" in next(x for x in text.splitlines() if x.startswith("b "))
    assert comparison.format_against_reference({"against_reference": {"rows": []}}, schemes, crossval.HEADS) == []


def _children(pid: int) -> set[int]:
    try:
        text = Path(f"/proc/{pid}/task/{pid}/children").read_text()
    except OSError:
        return set()
    return {int(x) for x in text.split()}


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc for the worker processes")
@pytest.mark.parametrize("command", ["validate --cv", "validate", "calibrate"])
def test_sigterm_ends_the_workers_and_exits_143_without_a_traceback(tmp_path, command):
    """validate --cv --workers 2 on the committed traces, validate of the index alone and calibrate --prior-scale
    auto, SIGTERM once its workers exist: it exits 128 + 15 with one line and no traceback, no worker outlives it,
    and calibrate writes no file."""
    index = ROOT / "realrun/traces/h200_graphs/index.csv"
    args = {
        "validate --cv": ["validate", str(index), "--cv"],
        "validate": ["validate", str(index)],
        "calibrate": ["calibrate", "--traces", str(index), "--out", str(tmp_path / "e.json"), "--prior-scale", "auto"],
    }[command]
    p = subprocess.Popen(
        [sys.executable, str(ROOT / "cli.py"), *args, "--workers", "2"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=ROOT,
    )
    workers: set[int] = set()
    deadline = time.monotonic() + 300  # the state waited for is "workers started", however slow the machine
    while time.monotonic() < deadline and p.poll() is None:
        workers = _children(p.pid)
        if len(workers) >= 2:
            break
        time.sleep(0.2)
    assert len(workers) >= 2, "the workers never started"
    p.send_signal(signal.SIGTERM)
    out, err = p.communicate(timeout=120)
    assert p.returncode == 128 + signal.SIGTERM, err
    assert "Traceback" not in err and "interrupted by SIGTERM" in err and len(err.strip().splitlines()) == 1, err
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and any(Path(f"/proc/{w}").exists() for w in workers):
        time.sleep(0.2)
    alive = [w for w in workers if Path(f"/proc/{w}").exists() and "zombie" not in _state(w)]
    assert not alive, alive
    assert not (tmp_path / "e.json").exists()


def _state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/status").read_text().split("State:")[1].split("\n")[0].lower()
    except (OSError, IndexError):
        return "gone"


def test_fold_list_makes_no_held_out_fold_without_runs_to_fit():
    one = _traces()[:1]
    assert crossval.folds(one) == [("in_sample", ())]
    two = _traces()[:2]  # two runs of one configuration
    assert crossval.folds(two) == [("in_sample", ()), ("held_out", (0,)), ("held_out", (1,))]


def test_a_machine_row_predicted_worse_than_no_fit_is_flagged():
    """validate --cv --base: a (configuration, machine) row whose prediction (the base with its machine's factor, or
    the base alone where its machine has no other configuration) is worse than no fit is flagged, by how much and
    beside its run-to-run spread."""

    def row(c, m, none, base, refit, spread=None):
        return crossval._against_no_fit(
            {
                "configuration": c,
                "machine": m,
                "traces": 3,
                "no_fit_jct_mean_abs_error_pct": none,
                "base_gpu_link_jct_mean_abs_error_pct": base + 0.5,
                "base_jct_mean_abs_error_pct": base,
                "machine_refit_jct_mean_abs_error_pct": refit,
                "machine_factor": None if refit is None else 1.1,
                "machine_factor_stderr": None if refit is None else 0.01,
                "run_to_run_jct_mean_pct": spread,
            }
        )

    rows = [
        row("a", "m1", 2.0, 2.5, 1.0),  # the factor beats no fit though the base alone does not
        row("a", "m2", 2.0, 1.5, 3.2, spread=4.0),  # the factor is worse than no fit
        row("b", "m1", 5.0, 6.0, None),  # no factor on its machine: the base alone, worse
        row("c", "m3", 4.0, 3.0, None),
    ]
    assert [(r["predicted_by"], r["worse_than_no_fit"]) for r in rows] == [
        ("machine_refit", False),
        ("machine_refit", True),
        ("base", True),
        ("base", False),
    ]
    result = {
        "traces": 12,
        "base_calibration": "engine.json",
        "configurations": rows,
        "notes": [],
        "noise": {"index": "r.csv", "spread_pct": {"jct_mean": 4.0}},
    }
    text = crossval.format_cv_machine(result)
    assert "mean |JCT err| base's gpu+link terms" in text.splitlines()[1], text  # the column beside the base alone
    flagged = [x.split()[:2] for x in text.splitlines() if x.endswith("WORSE than no fit")]
    assert flagged == [["a", "m2"], ["b", "m1"]], text
    flag = text.splitlines()[-1]
    assert flag.startswith("flag: 2 of 4 configurations"), flag
    assert "a on m2 (by 1.2 points; its recordings' mean JCT spreads ±4.0 % run to run)" in flag, flag
    assert "b on m1 (by 1.0 points, the base alone)" in flag, flag


def test_what_only_a_configuration_shows_is_the_parameters_its_absence_moves():
    """moved_without: the parameters a held-out configuration is priced with whose value moves by at least half
    their prior's width without it, largest first, at most three; a parameter held without it moves back to its
    scenario's value; another method's parameters are not the configuration's."""
    own = {
        "network.latency_s": 0.0,  # prior width 1 ms
        "decode.join_s_per_request": 0.0006,  # prior width 1 ms
        "prefill.host_issue_s_per_layer": 0.00033,  # prior width 0.2 ms
        "decode.leave_s_per_request": 0.0002,
        "methods.hack.quantize_issue_s_per_layer": 0.000153,  # prior width 0.5 ms
        "methods.kvquant.quantize_issue_s_per_layer": 0.000358,
    }
    runs = [
        TraceData(name=f"t{i}", scenario="a.yaml", configuration="a", method=m, family=m, values0=own)
        for i, m in enumerate(("baseline", "hack"))
    ]
    in_sample = {
        "network.latency_s": 0.0003,
        "decode.join_s_per_request": 0.0005,
        "prefill.host_issue_s_per_layer": 0.0005,  # fitted in-sample, held without the configuration
        "decode.leave_s_per_request": 0.0002,
        "methods.hack.quantize_issue_s_per_layer": 0.0002,
        "methods.kvquant.quantize_issue_s_per_layer": 0.0001,
    }
    held_out = {
        "network.latency_s": 0.0015,  # +1.2 sd
        "decode.join_s_per_request": 0.00095,  # +0.45 sd: under the threshold
        "decode.leave_s_per_request": 0.0002,  # unmoved
        "methods.hack.quantize_issue_s_per_layer": 0.0009,  # +1.4 sd
        "methods.kvquant.quantize_issue_s_per_layer": 0.0009,  # +1.6 sd, but no run of this configuration is KVQuant
    }
    moved = crossval.moved_without(in_sample, held_out, runs)
    assert [m["name"] for m in moved] == [
        "methods.hack.quantize_issue_s_per_layer",
        "network.latency_s",
        "prefill.host_issue_s_per_layer",
    ]
    assert [m["shift_prior_sd"] for m in moved] == [1.4, 1.2, -0.85]
    back = moved[2]
    assert back["in_sample"] == 0.0005 and back["held_out"] == own["prefill.host_issue_s_per_layer"]
    # a fourth move, larger than the others, pushes the smallest out: at most MOVED_MOST
    held_out["decode.join_s_per_request"] = 0.003
    moved = crossval.moved_without(in_sample, held_out, runs)
    assert len(moved) == crossval.MOVED_MOST == 3
    assert moved[0]["name"] == "decode.join_s_per_request"
    assert "prefill.host_issue_s_per_layer" not in [m["name"] for m in moved]


def test_each_held_out_configuration_says_what_its_absence_moved(monkeypatch):
    """validate --cv: each configuration's row carries the parameters its fold moved (the spied fits write a bit mask
    of the runs they saw into network.latency_s, so without a configuration the value drops by its runs' bits), and
    the text lists them under the table."""
    traces = [replace(td, values0={"network.latency_s": 0.0}) for td in _traces()]
    _spy(monkeypatch, traces)
    result = crossval.cross_validate("index.csv", workers=1, by=("configuration",))
    everyone = 2 ** len(CONFIGS) - 1
    for c in result["configurations"]:
        same = sum(2**j for j, x in enumerate(CONFIGS) if x == c["configuration"])
        (m,) = c["moved_without_it"]
        assert (m["name"], m["in_sample"], m["held_out"]) == ("network.latency_s", everyone, everyone - same)
    text = crossval.format_cv(result)
    assert "what only each configuration shows the fit" in text
    assert f"  c: network.latency_s {everyone} -> {everyone - 32}" in text


def test_the_nested_prior_scale_is_chosen_without_the_held_out_configuration(monkeypatch):
    """validate --cv --prior-scale auto: each held-out configuration's scale comes from fits that never saw its runs.
    The stubbed fits favour the narrow priors (0.25) whenever they were given configuration c's run and the wide ones
    (1) otherwise, so a choice made with c's run anywhere in it lands on 0.25: the in-sample choice and those made
    without a or b do; the one made without c lands on 1."""
    _spy(monkeypatch, _traces())

    class Fit:
        def __init__(self, used, prior_scale):
            self.fitted = {"saw_c": float(any(td.configuration == "c" for td in used)), "scale": prior_scale}
            self.machines: dict = {}

    monkeypatch.setattr(crossval, "fit_engine", lambda used, prior_scale=1.0: Fit(used, prior_scale))
    rank = {0.25: 1.0, 0.5: 2.0, 1.0: 3.0}

    def score(td, trace_path, scenario_path, method, values):
        if values is None:
            return {"jct_mean_error_pct": 5.0, "ttft_p50_error_pct": 0.0, "tpot_p50_error_pct": 0.0}
        e = rank[values["scale"]] if values["saw_c"] else 4.0 - rank[values["scale"]]
        return {"jct_mean_error_pct": e, "ttft_p50_error_pct": 0.0, "tpot_p50_error_pct": 0.0}

    monkeypatch.setattr(crossval, "_score", score)
    r = crossval.cross_validate("index.csv", workers=1, by=("configuration",), prior_scale="auto")
    assert r["prior_scale"]["value"] == 0.25
    assert {c["configuration"]: c["prior_scale"] for c in r["configurations"]} == {"a": 0.25, "b": 0.25, "c": 1.0}
    both = crossval.cross_validate("index.csv", workers=1, prior_scale="auto")  # the folds by trace: not nested
    assert both["held_out"] and any("chosen on every run (0.25), not nested" in n for n in both["notes"])
    assert "each chosen without it (nested): a 0.25, b 0.25, c 1" in crossval.format_cv(both)
    with pytest.raises(crossval.ScenarioError, match="prior scale"):
        crossval.cross_validate("index.csv", workers=1, prior_scale=-1.0)


def _cv_result() -> dict:
    """A validate --cv result of two configurations, one held out worse than no fit, as crossval writes it."""
    per_trace = [
        {"trace": "a1", "configuration": "a", "no_fit": {"jct_mean_error_pct": -3.0}},
        {"trace": "a2", "configuration": "a", "no_fit": {"jct_mean_error_pct": 3.4}},
        {"trace": "b1", "configuration": "b", "no_fit": {"jct_mean_error_pct": 10.0}},
    ]
    for r, held, host in zip(per_trace, (4.0, -3.0, 2.0), (1.5, 2.5, 7.0)):
        r.update(
            in_sample={"jct_mean_error_pct": held / 2}, held_out={}, held_out_configuration={"jct_mean_error_pct": held}
        )
        r["host_spread_jct_mean_pct"] = host
    configurations = crossval.by_configuration(per_trace)
    configurations[0]["host_spread_jct_mean_pct"], configurations[1]["host_spread_jct_mean_pct"] = 2.1, 7.0
    return {
        "traces": 3,
        "index": "index.csv",
        "notes": ["held out (trace): not fitted (folds by configuration only)"],
        "per_trace": per_trace,
        "configurations": configurations,
        "worse_than_no_fit": ["a"],
        "host_speed": {"spread_pct": 18.1, "from": "H200 device sessions' quantize step"},
        **{s: crossval.summarise(per_trace, s) for s in ("no_fit", "in_sample", "held_out_configuration")},
    }


def test_the_cross_validation_page_shows_each_configuration_against_no_fit():
    """validation.html of validate --cv: the headline figures, each configuration's mean |JCT error| per scheme with
    the host's speed alone beside it and the flag, every run's error, and the lines the terminal prints beside its
    tables (crossval.cv_notes: the same as format_cv's)."""
    from reports.validation import crossval_page

    result = _cv_result()
    schemes = {k: crossval.HEADS[k] for k in crossval.SCHEMES if k in result}
    notes = crossval.cv_notes(result)
    text = crossval.format_cv(result)
    assert notes and all(n in text for n in notes) and any(n.startswith("flag: the fit predicts 1") for n in notes)
    page = crossval_page(result, schemes, "held_out_configuration", notes)
    assert "3.0%" in page.summary_html and "1 of 2" in page.summary_html  # the runs: |4|, |-3| and |2| held out
    body = "".join(s.body_html for s in page.sections)
    table = body[body.index('id="table-cv-configurations"') : body.index("</table>")]
    assert table.count("<tr>") == 1 + 2 + 2  # the head, a and b, mean and max
    assert "worse than no fit" in table.split("<td>a</td>")[1].split("</tr>")[0]
    assert "worse than no fit" not in table.split("<td>b</td>")[1].split("</tr>")[0]
    assert "<td>±2.1%</td>" in table and "<td>±7.0%</td>" in table
    assert 'id="table-cv-traces"' in body and body.count("<td>a1</td>") == 1 and "+4.0%" in body
    assert all(html.escape(n) in body for n in notes)
    fig = page.figures["crossval"]
    assert [t.name for t in fig.data] == ["no fit", "in-sample", "held out (config)", "host speed alone"]
    assert list(fig.data[2].y) == [3.5, 2.0] and list(fig.data[3].y) == [2.1, 7.0]
    # folds by trace alone: no held-out configuration for the flag to be about, no count of it
    assert "worse than no fit" not in crossval_page(result, schemes, "in_sample", notes, flags=False).summary_html


def test_validate_cv_out_writes_its_page_beside_the_json(tmp_path, monkeypatch):
    """validate --cv --out: validation.json and validation.html, the page drawn from the JSON that was written."""
    from tests.test_cli import here

    result = _cv_result()
    monkeypatch.setattr(crossval, "cross_validate", lambda *a, **k: result)
    out = tmp_path / "cv"
    r = here("validate", ROOT / "realrun/traces/h200_graphs/index.csv", "--cv", "--out", out)
    assert r.returncode == 0, r.stderr
    assert sorted(p.name for p in out.iterdir()) == ["validation.html", "validation.json"]
    assert json.loads((out / "validation.json").read_text())["configurations"] == result["configurations"]
    page = (out / "validation.html").read_text()
    assert "Cross-validated calibration over 3 traces" in page and 'id="table-cv-configurations"' in page


@pytest.mark.parametrize(("args", "expected"), [((), 3), (("--workers", "1"), 1), (("--workers", "5"), 5)])
def test_validate_cv_fits_its_folds_one_process_per_core_unless_told(monkeypatch, args, expected):
    """validate --cv without --workers hands cross_validate the cores this process may use; --workers N overrides
    it."""
    import cli as cli_module
    from tests.test_cli import here

    seen: dict = {}

    def spy(*a, **k):
        seen.update(k)
        return _cv_result()

    monkeypatch.setattr(crossval, "cross_validate", spy)
    monkeypatch.setattr(cli_module, "usable_cores", lambda: 3)
    r = here("validate", ROOT / "realrun/traces/h200_graphs/index.csv", "--cv", "--json", *args)
    assert r.returncode == 0, r.stderr
    assert seen["workers"] == expected


def test_progress_hears_each_fit_and_simulation_as_it_ends(monkeypatch):
    """cross_validate's `progress`: one display per step, told its count, advanced once per result; the result is
    the one without it."""
    _spy(monkeypatch, _traces())
    bar = ProgressSpy()
    with_bar = crossval.cross_validate("index.csv", workers=1, progress=bar)
    assert with_bar == crossval.cross_validate("index.csv", workers=1)
    fits = 1 + len(CONFIGS) + len(set(CONFIGS))  # in-sample, one per run, one per configuration
    runs = len(CONFIGS) * 4  # no fit, in-sample and the two held-out schemes
    assert bar.shown == [
        [fits, "fitting the folds", "fits", fits],
        [runs, "simulating the runs", "runs", runs],
        [len(CONFIGS), "host speed", "runs", len(CONFIGS)],
    ]


@pytest.mark.parametrize(("args", "expected"), [((), 3), (("--workers", "2"), 2)])
def test_validate_on_an_index_runs_one_process_per_core_unless_told(monkeypatch, args, expected):
    """validate INDEX.csv (no --cv) hands validate_index the cores this process may use; --workers N overrides it."""
    import cli as cli_module
    import simulator.validate as validate_module
    from tests.test_cli import here

    seen: dict = {}

    def spy(index, overrides, workers, progress):
        seen["workers"] = workers
        return []

    monkeypatch.setattr(validate_module, "validate_index", spy)
    monkeypatch.setattr(cli_module, "usable_cores", lambda: 3)
    r = here("validate", ROOT / "realrun/traces/h200_graphs/index.csv", "--json", *args)
    assert r.returncode == 0, r.stderr
    assert seen["workers"] == expected
