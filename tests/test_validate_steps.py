"""`validate` on a step-timed recording (realrun --step-times, realrun/traces/h200_steps): the iteration split into
the host's serial time and the step graph's GPU time, each against its price; a broken steps.csv is refused in one
line naming it."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from contract import assert_contract, invoke
from realrun.steps import iteration_parts
from simulator.validate import validate

ROOT = Path(__file__).resolve().parent.parent
TRACE = ROOT / "realrun/traces/h200_steps/h200g_70b8l_2.5gbps_hack_r10"
SCENARIO = ROOT / "scenarios/measured/h200g_70b8l_2.5gbps.yaml"


@pytest.fixture(scope="module")
def result():
    return validate(TRACE, SCENARIO)


def test_split_against_prices(result):
    parts = iteration_parts(TRACE)
    steady = parts.host_serial_s[(parts.kind == "steady") & parts.host_serial_s.notna()]
    hs = result["host_serial_s"]
    assert hs["measured_mean"] == pytest.approx(float(steady.mean()))
    assert hs["count"] == len(steady) > 1000
    assert hs["predicted_mean"] == pytest.approx(0.00063)  # the scenario's host_serial_s_per_iteration
    assert result["host_serial_mean_error_pct"] == pytest.approx(100 * (0.00063 / steady.mean() - 1))
    gpu = result["step_gpu_s"]
    assert gpu["measured_mean"] == pytest.approx(float((parts.step_gpu_s + parts.place_gpu_s).mean()))
    # the GPU's price is the iteration's without the host serial: the iteration row's prediction
    assert gpu["predicted_mean"] == pytest.approx(result["iteration_s"]["predicted_mean"])
    # the recording: a steady host serial near 0.6 ms, a step priced within a few % (docs/calibration.md)
    assert 0.0004 < hs["measured_mean"] < 0.0009
    assert abs(result["step_gpu_mean_error_pct"]) < 5


def test_no_steps_file_no_split(tmp_path):
    t = tmp_path / "t"
    shutil.copytree(TRACE, t)
    (t / "steps.csv").unlink()
    v = validate(t, SCENARIO)
    assert "host_serial_s" not in v and "step_gpu_s" not in v and "iteration_s" in v


def test_broken_steps_file_refused(tmp_path):
    t = tmp_path / "t"
    shutil.copytree(TRACE, t)
    st = pd.read_csv(t / "steps.csv")
    st.drop(columns="host_issue_s").to_csv(t / "steps.csv", index=False)
    r = invoke("validate", t, "--scenario", SCENARIO)
    line = assert_contract(r, names=("steps.csv",))
    assert line is not None and "not a step-times file" in line
    st.iloc[: len(st) - 3].to_csv(t / "steps.csv", index=False)  # rows missing
    r = invoke("validate", t, "--scenario", SCENARIO)
    assert assert_contract(r, names=("steps.csv",)) is not None
    assert np.isfinite(st.step_gpu_s).all()


def test_index_table_columns(tmp_path):
    from simulator.validate import format_validation_table

    rows = [
        {"trace": "a", **dict.fromkeys(("jct_mean_error_pct",), 1.0), "step_gpu_mean_error_pct": -2.0},
        {"trace": "b", "jct_mean_error_pct": -3.0, "host_serial_mean_error_pct": 30.0},
    ]
    text = format_validation_table(rows)
    assert "step GPU" in text and "host serial" in text and "+30.0%" in text
    # without a step-timed trace the table keeps its columns
    assert "step GPU" not in format_validation_table([{"trace": "a", "jct_mean_error_pct": 1.0}])
