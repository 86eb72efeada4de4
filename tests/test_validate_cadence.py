"""validate's decode cadence (simulator/validate.py, `_cadence`): each decode iteration's start to the next one's
where the engine went straight on, against its price with everything the engine model adds (joins, leavers, the
KV copies, the after-prefill slowdowns, the busy link and the CPU's gap): the fit's iteration items at the
simulated scenario's engine values. A run the simulator made, written as a trace, comes back at its own cadence;
the iteration rows (`iteration_s`) against the steady price are a coarser figure beside it."""

from __future__ import annotations

import pandas as pd
import pytest
import yaml

from simulated_runs import TRUE, raw_system, simulate, write_realrun
from simulator.validate import HEADS, SUMMARY_KEYS, format_validation_table, validate, validate_index


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """HACK on BASE's system (link idle in the fit's sense: no busy-link level, no after-prefill terms), simulated
    at TRUE and written as a realrun trace beside its scenario."""
    folder = tmp_path_factory.mktemp("cadence")
    raw = raw_system(seed=5, link_busy=False, n=60)
    scen = folder / "system.yaml"
    scen.write_text(yaml.safe_dump(raw))
    [(method, df, it)] = simulate(raw, TRUE, methods=["hack"])
    trace = write_realrun(folder / "hack", method, df, it)
    pd.DataFrame({"trace": ["hack"], "scenario": ["system.yaml"]}).to_csv(folder / "index.csv", index=False)
    return trace, scen, folder / "index.csv"


def test_a_simulated_run_comes_back_at_its_own_cadence(run):
    trace, scen, _ = run
    v = validate(trace, scen, engine_values=TRUE)
    c = v["cadence_s"]
    assert c["count"] > 50
    assert c["predicted_mean"] == pytest.approx(c["measured_mean"], rel=1e-6)
    assert v["cadence_mean_error_pct"] == pytest.approx(0.0, abs=1e-4)
    assert c["median_abs_error_pct"] == pytest.approx(0.0, abs=1e-4)


def test_the_cadence_prices_the_engine_values_validated(run):
    """Another loop gap than the run's: every iteration of the cadence costs the difference more (the link idle:
    no busy factor on it), where the rows against the steady price (which leave the gap out) do not move."""
    trace, scen, _ = run
    at_truth = validate(trace, scen, engine_values=TRUE)
    slower = validate(trace, scen, engine_values={**TRUE, "decode.host_serial_s_per_iteration": 0.0009})
    grew = slower["cadence_s"]["predicted_mean"] - at_truth["cadence_s"]["predicted_mean"]
    assert grew == pytest.approx(0.0005, rel=1e-6)
    assert slower["cadence_s"]["measured_mean"] == at_truth["cadence_s"]["measured_mean"]
    assert slower["cadence_mean_error_pct"] > 2.0


def test_the_index_table_has_the_cadence_column(run):
    _, _, index = run
    rows = validate_index(index)
    assert "cadence_mean_error_pct" in SUMMARY_KEYS and "cadence" in HEADS
    assert rows[0]["cadence_mean_error_pct"] is not None
    assert "cadence" in format_validation_table(rows)
