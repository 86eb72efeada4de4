"""The decode iterations after a prefill on a shared GPU (decode.after_prefill_slowdown_fraction, placement shared_gpu).

On the H200 a prefill's GEMMs leave the next memory-bound decode iterations slower (realrun.transient,
realrun/traces/h200_transient): in all by a fraction of the prefill's time, the k-th iteration by
(1 - decay) decay^(k-1) of it, a later prefill restarting it (its amplitude replaced, not added to).
The timelines here are worked by hand.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, cast

import numpy as np
import pandas as pd
import pytest
import simpy

from decode_standins import FixedCost, Listener, records
from helpers import scenario
from realrun.transient import fit_transient
from simulator.config import ScenarioError
from simulator.decode import DecodeReplica
from simulator.fit_items import after_prefill_s


class _Prefill:
    """A partner prefill that asks for the GPU at `ask_s` and holds it `hold_s` once given."""

    def __init__(self, env, rep, ask_s: float, hold_s: float):
        self.env, self.rep, self.hold_s = env, rep, hold_s
        env.process(self._ask(ask_s))

    def _ask(self, at_s: float):
        yield self.env.timeout(at_s)
        if self.rep.yield_gpu():
            self.try_start()

    def try_start(self) -> bool:
        self.env.process(self._hold())
        return True

    def _hold(self):
        yield self.env.timeout(self.hold_s)
        self.rep.resume_after_prefill(self.hold_s)


def _timeline(fraction: float, decay: float, second_at_s: float | None = None):
    """Request 0 (10 iterations of 10 ms) joins at 0; a prefill asks for the GPU at 25 ms and holds it 20 ms;
    request 1 (10 iterations) arrives at second_at_s, if given."""
    env = simpy.Environment()
    rec = records(1 if second_at_s is None else 2)
    rep = DecodeReplica(env, 0, cast(Any, FixedCost(0.010)), 64, rec)
    rep.listener = Listener()
    rep.after_prefill_fraction, rep.after_prefill_decay = fraction, decay
    rep.partner = cast(Any, _Prefill(env, rep, 0.025, 0.020))
    rep.reserve(1.0)
    rep.arrive(0)
    if second_at_s is not None:

        def second():
            yield env.timeout(second_at_s)
            rep.reserve(1.0)
            rep.arrive(1)

        env.process(second())
    env.run()
    return [float(x) for x in rec.finish]


def test_without_the_transient_the_prefill_only_pauses_decode():
    """Iterations at 0, 10, 20 ms; the prefill waits for the boundary at 30 ms, holds the GPU to 50 ms; 7 more
    iterations: 120 ms."""
    assert _timeline(0.0, 0.5) == pytest.approx([0.120], abs=1e-12)


def test_the_iterations_after_the_prefill_take_their_share():
    """fraction 0.5 of the 20 ms prefill: 10 ms in all, the 7 iterations after it take 10 x (1 - 0.5^7) ms."""
    assert _timeline(0.5, 0.5) == pytest.approx([0.120 + 0.010 * (1 - 0.5**7)], abs=1e-12)
    # decay 0: all of it on the first iteration after the prefill
    assert _timeline(0.5, 0.0) == pytest.approx([0.130], abs=1e-12)


def test_a_segment_cut_short_keeps_only_its_iterations_share():
    """Request 1 arrives at 62 ms, during the first iteration of the segment that began at 50 ms (10 ms + its share,
    5 ms): the segment is cut there, at 65 ms. The remaining 5 ms: request 0's last 6 iterations take
    5 x (1 - 0.5^6), so it finishes as if nothing had joined (every iteration costs the same here); request 1's last
    4 iterations take 5 x 0.5^6 x (1 - 0.5^4)."""
    first, second = _timeline(0.5, 0.5, second_at_s=0.062)
    assert first == pytest.approx(0.065 + 0.005 * (1 - 0.5**6) + 0.060, abs=1e-12)
    assert second == pytest.approx(first + 0.005 * 0.5**6 * (1 - 0.5**4) + 0.040, abs=1e-12)


def test_refused_where_not_modelled():
    with pytest.raises((ScenarioError, ValueError), match="after_prefill_slowdown_fraction.*shared_gpu only"):
        scenario(**{"decode.after_prefill_slowdown_fraction": 0.02})
    with pytest.raises((ScenarioError, ValueError), match="prefill.after_prefill_slowdown_fraction"):
        scenario(placement="shared_gpu", **{"prefill.after_prefill_slowdown_fraction": 0.02})
    scenario(placement="shared_gpu", **{"decode.after_prefill_slowdown_fraction": 0.02})


def test_a_shared_gpu_run_slows_by_it():
    from simulator.run import run_scenario

    common = {"methods": ["baseline"], "workload.requests": 40}
    base = run_scenario(scenario(placement="shared_gpu", **common)).requests["finish_s"].max()
    slow = (
        run_scenario(scenario(placement="shared_gpu", **common, **{"decode.after_prefill_slowdown_fraction": 0.05}))
        .requests["finish_s"]
        .max()
    )
    assert slow > base


def test_trace_items_carry_it_by_their_distance_from_the_prefill():
    """A prefill from 1.0 to 1.1 s (quantize end); iterations start at 0.95, 1.1, 1.12, 1.14: the first is before
    it, the next three are 0, 1, 2 iterations after it."""
    df = pd.DataFrame({"prefill_start_s": [1.0], "quantize_end_s": [1.1]})
    it = pd.DataFrame({"start_s": [0.95, 1.1, 1.12, 1.14]})
    got = after_prefill_s(df, it, it["start_s"].to_numpy(), 0.1, 0.5)
    assert got == pytest.approx([0.0, 0.01 * 0.5, 0.01 * 0.25, 0.01 * 0.125], abs=1e-15)


def _synthetic(fraction: float, decay: float, seed: int) -> pd.DataFrame:
    """Transient runs as realrun.transient writes them: 8 ms iterations growing 2 us per context token, 0.2 %
    noise, after each prefill of P s the k-th iteration fraction x P x (1 - decay) decay^(k-1) longer."""
    rng = np.random.default_rng(seed)
    rows, ctx = [], 2048
    for cycle in range(4):
        for event, tokens, event_s in [("prefill", 256, 0.012), ("prefill", 3072, 0.085), ("none", 0, 0.0)]:
            for k in range(1, 17):
                ctx += 1
                wall = 0.008 + 2e-6 * (ctx - 2048) + fraction * event_s * (1 - decay) * decay ** (k - 1)
                rows.append(
                    dict(
                        set="m:1",
                        method="baseline",
                        batch_size=8,
                        cycle=cycle,
                        event=event,
                        event_tokens=tokens,
                        event_s=event_s,
                        k=k,
                        max_context=ctx,
                        wall_s=wall * (1 + 0.002 * rng.standard_normal()),
                    )
                )
    return pd.DataFrame(rows)


def test_fit_recovers_known_values(tmp_path):
    p = tmp_path / "t.csv"
    _synthetic(0.02, 0.7, seed=3).to_csv(p, index=False)
    got = fit_transient([p])
    assert got["after_prefill_slowdown_fraction"] == pytest.approx(0.02, abs=0.002)
    assert got["after_prefill_decay_per_iteration"] == pytest.approx(0.7, abs=0.05)
    assert got["prefills"] == 8


def test_a_fitted_engine_with_it_is_refused_off_a_shared_gpu(tmp_path):
    """An engine file that fitted the after-prefill fraction would change nothing under placement separate: refused
    in one line naming it and the placement; under shared_gpu it applies."""
    import json

    import yaml

    from simulator.engine import PARAMETERS
    from simulator.load import load_scenario

    p = PARAMETERS["decode.after_prefill_slowdown_fraction"]
    doc = {
        "kind": "hacksim-engine-calibration",
        "schema_version": 1,
        "engine": "test",
        "parameters": {
            p.name: {
                "value": 0.03,
                "stderr": 0.004,
                "unit": p.unit,
                "fitted": True,
                "scope": p.scope,
                "shape": p.shape,
                "prior": {"centre": 0.0188, "width": p.prior_width},
            }
        },
        "provenance": {"traces": []},
    }
    (tmp_path / "engine.json").write_text(json.dumps(doc))
    raw = yaml.safe_load((Path(__file__).resolve().parent.parent / "scenarios/measured/h200g_8b_sat.yaml").read_text())
    raw["calibration"] = {"engine": "engine.json"}
    scen = tmp_path / "s.yaml"
    scen.write_text(yaml.safe_dump(raw))
    assert load_scenario(scen).decode.after_prefill_slowdown_fraction == 0.03
    raw["placement"] = "separate"
    raw["decode"] = {k: v for k, v in raw["decode"].items() if not k.startswith("after_prefill")}
    scen.write_text(yaml.safe_dump(raw))
    with pytest.raises(ScenarioError) as e:
        load_scenario(scen)
    msg = str(e.value)
    assert "decode.after_prefill_slowdown_fraction" in msg and "placement separate" in msg and "\n" not in msg


def test_fit_xfer_recovers_the_busy_link_slope(tmp_path):
    """xfer runs made with 0.63 ms of host time per iteration slowed by 0.02 x the link's Gbps while a transfer is
    in flight (past its first 10 ms), 1 % noise: the fit gives a = 1 and b = 0.02 within their errors."""
    from realrun.transient import fit_xfer

    rng = np.random.default_rng(5)
    rows = []
    for rate in (2.5, 10.0, 40.0):
        for cycle in range(4):
            for event, count in (("short", 16), ("long", 48), ("none", 16)):
                for k in range(1, count + 1):
                    since = (k - 1) * 0.009 if event != "none" else -1.0
                    busy = int(event == "long" or (event == "short" and since < 0.010))
                    extra = 0.00063 * 0.02 * rate if busy and since >= 0.010 else 0.0
                    wall = (0.0085 + extra) * (1 + 0.01 * rng.standard_normal())
                    rows.append(
                        dict(
                            set="m:1",
                            method="baseline",
                            batch_size=32,
                            link_gbps=rate,
                            cycle=cycle,
                            event=event,
                            k=k,
                            since_start_s=since,
                            busy=busy,
                            gap_s=0.0003,
                            max_context=2048,
                            wall_s=wall,
                        )
                    )
    p = tmp_path / "x.csv"
    pd.DataFrame(rows).to_csv(p, index=False)
    got = fit_xfer([p])
    a_se, b_se = got["stderr"]
    assert abs(got["link_busy_host_factor"] - 1.0) <= 3 * a_se + 1e-3
    assert abs(got["link_busy_host_factor_per_gbps"] - 0.02) <= 3 * b_se + 1e-4
    assert got["windows"] == 12
