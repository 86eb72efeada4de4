"""realrun.cpustate: the host CPU's speed probe (no GPU here: the pure-Python loop alone, and its summary)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from realrun.cpustate import beside_runs, main, measure, summarise

ROOT = Path(__file__).resolve().parent.parent


def test_summarise_finds_two_speeds_and_their_share(tmp_path):
    """Steps whose pure-Python loop takes 2 ms or 4 ms (30 % slow, in stretches) and a quantize step that follows
    them (5 or 7.5 ms), 2 % noise: the two speeds, the slow share and a high correlation; a file without the
    quantize step has no such entry."""
    rng = np.random.default_rng(3)
    slow = np.repeat(rng.random(100) < 0.3, 20)  # stretches of 20 steps
    py = np.where(slow, 0.004, 0.002) * (1 + 0.02 * rng.standard_normal(len(slow)))
    quant = np.where(slow, 0.0075, 0.005) * (1 + 0.02 * rng.standard_normal(len(slow)))
    frame = pd.DataFrame(dict(tag="a", t_s=np.arange(len(slow)) * 0.01, py_s=py, quant_s=quant, cpu=3, cpu_end=3))
    frame["steal_ticks"] = 0
    p = tmp_path / "c.csv"
    frame.to_csv(p, index=False)
    got = summarise([p])["a"]
    assert got["steps"] == 2000 and got["cpus"] == [3] and got["migrations"] == 0
    assert got["py_s"]["fast_ms"] == pytest.approx(2.0, rel=0.02)
    assert got["py_s"]["slow_ms"] == pytest.approx(4.0, rel=0.02)
    assert got["py_s"]["slow_share"] == pytest.approx(slow.mean(), abs=0.01)
    assert got["quant_s"]["slow_ms"] == pytest.approx(7.5, rel=0.02)
    assert got["correlation"] > 0.95
    frame.assign(quant_s=float("nan"), tag="b").to_csv(p, index=False)
    got = summarise([p])["b"]
    assert "quant_s" not in got and "correlation" not in got


def test_measure_times_the_python_loop_without_a_gpu(tmp_path):
    rows = measure(0.05, "cpu", gpu=False)
    assert rows and all(r["py_s"] > 0 and math.isnan(r["quant_s"]) for r in rows)
    assert all(r["cpu"] >= 0 and r["steal_ticks"] >= 0 for r in rows)
    assert all(r["wall_s"] > 1.7e9 for r in rows)  # the wall clock, beside a recording's wall_start_s
    calls = []
    rows = measure(3600.0, "cpu", gpu=False, stop=lambda: calls.append(1) or len(calls) >= 2)
    assert len(rows) == 2  # stop() (SIGTERM in main) ends it after the step under way; the rows are kept
    out = tmp_path / "c.csv"
    assert main(["--seconds", "0.05", "--no-gpu", "--out", str(out), "--tag", "x"]) == 0
    assert main(["--seconds", "0.05", "--no-gpu", "--out", str(out), "--tag", "y"]) == 0
    assert set(pd.read_csv(out)["tag"]) == {"x", "y"}  # appended, one header


def test_the_h200_hosts_cpu_ran_at_two_speeds():
    """The committed probe (realrun/traces/h200_transient/cpustate.csv, three processes of about 30 s on the H200
    host): the pure-Python loop at two speeds 1.8x or more apart in each, switching with the quantize step (step by
    step correlation above 0.7), with no migration between CPUs and no steal to speak of (realrun/DESIGN.md)."""
    got = summarise([ROOT / "realrun/traces/h200_transient/cpustate.csv"])
    assert sorted(got) == ["run1", "run2", "run3"]
    for row in got.values():
        assert row["py_s"]["slow_ms"] >= 1.8 * row["py_s"]["fast_ms"]
        assert 0.2 < row["py_s"]["slow_share"] < 0.8
        assert row["correlation"] > 0.7
        assert row["migrations"] == 0 and row["steal_ticks"] <= 1


def test_beside_runs_takes_the_probe_steps_within_each_recordings_span(tmp_path):
    """Two recordings' wall-clock spans over a probe whose loop is fast (1 ms) for 10 s, then slow (2 ms): the first
    sees only fast steps, the second three quarters slow; a meta.json without the span is left out."""
    wall = 1.8e9 + np.arange(0, 20, 0.01)
    py = np.where(wall < 1.8e9 + 10, 0.001, 0.002)
    pd.DataFrame(
        dict(tag="bg", t_s=wall - 1.8e9, wall_s=wall, py_s=py, quant_s=float("nan"), cpu=1, cpu_end=1, steal_ticks=0)
    ).to_csv(tmp_path / "p.csv", index=False)
    for name, span in (("a", (1.8e9 + 1, 1.8e9 + 5)), ("b", (1.8e9 + 8, 1.8e9 + 16)), ("c", None)):
        (tmp_path / name).mkdir()
        meta = {"method": "hack"} if span is None else {"wall_start_s": span[0], "wall_end_s": span[1]}
        (tmp_path / name / "meta.json").write_text(json.dumps(meta))
    got = beside_runs(tmp_path / "p.csv", [tmp_path / n for n in "abc"])
    assert [g["trace"] for g in got] == ["a", "b"]
    assert got[0]["slow_share"] == 0 and got[0]["py_median_ms"] == pytest.approx(1.0)
    assert got[1]["slow_share"] == pytest.approx(0.75, abs=0.01) and got[1]["py_median_ms"] == pytest.approx(2.0)
    assert got[0]["steps"] == pytest.approx(400, abs=2)


def test_a_second_cpu_saw_the_h200_hosts_two_speeds_beside_the_recordings():
    """realrun/traces/h200_midlink2: the probe in the background of the recordings (another CPU than the engine's, as
    the OS placed it) ran the loop at two speeds 1.5x or more apart, each of the six runs with a share of slow steps
    between 0.1 and 0.9; the share does not order the runs' host factors (docs/calibration.md)."""
    folder = ROOT / "realrun/traces/h200_midlink2"
    got = summarise([folder / "cpustate_bg_midlink.csv"])["bg_midlink"]
    assert got["py_s"]["slow_ms"] >= 1.5 * got["py_s"]["fast_ms"] and got["migrations"] == 0
    runs = sorted(p.parent for p in folder.glob("h200g_*/meta.json"))
    beside = beside_runs(folder / "cpustate_bg_midlink.csv", runs)
    assert len(beside) == 6 and all(r["steps"] > 300 and 0.1 < r["slow_share"] < 0.9 for r in beside), beside
