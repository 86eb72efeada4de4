"""The prefill pool's serial time per batch (prefill.host_serial_s_per_iteration, simulator/prefill.py): after a
batch's KV is encoded the replica waits that long before its next step, and on a shared GPU the decode waits too;
a colocated scenario refuses a fitted value (its replicas run prefill with the decode pool's settings)."""

from __future__ import annotations

import numpy as np
import pytest
import yaml

from simulated_runs import raw_system, simulate, write_realrun
from simulator.calibrate import predict
from simulator.config import parse_scenario
from simulator.engine import not_applied
from simulator.fit_items import load_trace_data

SERIAL_S = 0.0015


def _backlog(placement: str, serial_s: float) -> dict:
    """BASE's system with every request arriving at once (a prefill backlog), at the given placement and serial."""
    raw = raw_system(seed=5, n=12, link_busy=False)
    raw["placement"] = placement
    raw["workload"]["arrival"] = {"kind": "poisson", "rate_rps": 1e6}
    raw["prefill"]["host_serial_s_per_iteration"] = serial_s
    return raw


@pytest.mark.parametrize("placement", ["separate", "shared_gpu"])
def test_each_prefill_batch_holds_its_replica_for_the_serial_time(placement):
    """A backlog of one-request prefill batches: each starts the serial time after the one before was encoded (on a
    shared GPU, plus the decode iterations that ran between them); without it, at once."""
    for serial in (0.0, SERIAL_S):
        _, df, it = simulate(_backlog(placement, serial), {}, methods=["baseline"])[0]
        d = df.sort_values("prefill_start_s")
        gap = d["prefill_start_s"].to_numpy()[1:] - d["quantize_end_s"].to_numpy()[:-1]
        if placement == "separate":
            assert gap == pytest.approx(np.full(len(gap), serial), abs=1e-9)
            continue
        # shared GPU: between two prefills the decode runs whole iterations (each a row plus its loop gap)
        starts = it["start_s"].to_numpy()
        resumed = 0
        for end_q, nxt in zip(d["quantize_end_s"].to_numpy()[:-1], d["prefill_start_s"].to_numpy()[1:]):
            between = starts[(starts >= end_q - 1e-12) & (starts < nxt)]
            if len(between):  # the first iteration after the prefill starts the serial time after it
                assert between[0] - end_q == pytest.approx(serial, abs=1e-9)
                resumed += 1
            else:  # the decode had nothing to run: the next prefill starts the serial time after
                assert nxt - end_q == pytest.approx(serial, abs=1e-9)
        assert resumed >= len(gap) // 2


def test_a_separate_runs_backlog_gives_the_fit_its_serial_time(tmp_path):
    """From a separate placement's trace with a prefill backlog, the fit's handoff item is the serial time the run
    was made with, repriced to rounding at the link's levels."""
    raw = _backlog("separate", SERIAL_S)
    raw["network"] = {**raw["network"], "link_busy_host_factor": 1.3}  # a level the item has to take
    scen = tmp_path / "sep.yaml"
    scen.write_text(yaml.safe_dump(raw))
    method, df, it = simulate(raw, {}, methods=["hack"])[0]
    td = load_trace_data(write_realrun(tmp_path / "run", method, df, it), scen)
    blk = td.blocks["handoff"]
    assert blk["count"] == len(df) - 1
    assert predict(td, "handoff", td.values0) == pytest.approx(blk["meas"], rel=1e-9)
    assert blk["meas"][0] >= SERIAL_S


def test_a_colocated_scenario_does_not_apply_it():
    raw = _backlog("separate", 0.0)
    raw["placement"] = "colocated"
    s = parse_scenario(raw, "test")
    assert not_applied(s, {"prefill.host_serial_s_per_iteration": SERIAL_S}) == {"prefill.host_serial_s_per_iteration"}
