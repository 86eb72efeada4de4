"""The decode attention's share of the padding to the batch's longest context
(calibration.implementation_factors.M.attention_padding_share).

realrun's decode step is a CUDA graph per (batch, longest-context) bucket and its attention kernels size their split
grids by the longest context (max_len), so a batch spread over contexts costs more than its total context says
(realrun.transient --mix). The cost model prices an iteration of B requests, total context S and longest L at
S + share x (B x L - S) (ReplicaCostModel.priced_context); the decode replica keeps B x L - S per segment (every
context grows by one per iteration), the fit's items take L from the trace's requests (fit_items.longest_context) or a
benchmark file's token times (Timeline.longest, worked by hand in tests/test_engine_logs.py). The timelines here are
worked by hand; the repricing of simulated
traces with the shares set (tests/test_calibrate.py, whose scenario carries them) checks the replica and the items
agree to rounding.
"""

from __future__ import annotations

import glob
from dataclasses import replace
from pathlib import Path
from typing import Any, cast

import numpy as np
import pandas as pd
import pytest
import simpy

from costmodel.phases import IterationCost
from decode_standins import FixedCost, Listener, records
from realrun.transient import padding_share, scenario_per_ctx_s
from simulator.decode import DecodeReplica
from simulator.fit_items import longest_context
from simulator.measured import load_scenario
from simulator.resolve import resolve

ROOT = Path(__file__).resolve().parent.parent
SCENARIOS = sorted(glob.glob(str(ROOT / "scenarios" / "measured" / "h200g_*.yaml")))
MIX = sorted((ROOT / "realrun" / "traces" / "h200_transient").glob("mix*.csv"))  # two device sessions


def test_the_priced_context_adds_the_share_of_the_padding():
    s = load_scenario(ROOT / "scenarios" / "measured" / "h200g_8b_sat.yaml", [])
    _, dec = resolve(s).costs(s.methods[0])
    zero = replace(dec, attention_padding_share=0.0)
    assert zero.priced_context(400.0, 2, 300.0) == 400.0  # by the total alone
    half = replace(dec, attention_padding_share=0.5)
    assert half.priced_context(400.0, 2, 300.0) == 500.0  # 400 + 0.5 x (2 x 300 - 400)
    assert half.priced_context(np.array([400.0, 600.0]), np.array([2, 2]), np.array([300.0, 300.0])).tolist() == [
        500.0,
        600.0,
    ]


class _PerCtx(FixedCost):
    """Every iteration 10 ms plus 1 µs per priced context token, with an attention padding share."""

    def __init__(self, share: float):
        super().__init__(0.010)
        self.attention_padding_share = share
        self._it = IterationCost(0.010, 1e-6, 0.0, 0.0, 0.0)


def _two_requests(share: float) -> tuple[float, float]:
    """Requests of 100 and 300 context tokens arrive at 0 for 10 and 20 iterations: the first starts the batch, the
    second joins at the next boundary (iteration 1)."""
    env = simpy.Environment()
    rec = records(2, [10, 20])
    rec.join_context[1] = 300
    rep = DecodeReplica(env, 0, cast(Any, _PerCtx(share)), 64, rec)
    rep.listener = Listener()
    for rid in (0, 1):
        rep.reserve(1.0)
        rep.arrive(rid)
    env.run()
    return float(rec.finish[0]), float(rec.finish[1])


def test_the_replica_prices_a_segment_at_its_padding():
    """Share 0.5. Iteration 0, request 0 alone (100 tokens): 0.0101 s. Iterations 1-9, both (offsets 100 and 299:
    S_k = 399 + 2k, longest 299 + k, padding 199): priced at 498.5 + 2k tokens, 0.09 + 1e-6 x (4,486.5 + 90) s; request
    0 is done at 0.1046765 s. Iterations 10-20, request 1 alone (299 + k, no padding): 0.11 + 1e-6 x (3,289 + 165) s.
    Share 0: iterations 1-9 by the total, 0.09 + 1e-6 x (3,591 + 90) s."""
    first, second = _two_requests(0.5)
    assert first == pytest.approx(0.1046765, abs=1e-12)
    assert second == pytest.approx(0.1046765 + 0.113454, abs=1e-12)
    first0, second0 = _two_requests(0.0)
    assert first0 == pytest.approx(0.103781, abs=1e-12)
    assert second0 == pytest.approx(0.103781 + 0.113454, abs=1e-12)


def test_longest_context_from_a_traces_requests():
    """Iterations at 0, 1, 2, 3 s; a request of 100 prompt tokens joins the first and finishes in the third (its
    context 101, 102, 103), one of 300 joins the second and finishes after the fourth (301, 302, 303)."""
    df = pd.DataFrame({"prompt_tokens": [100, 300], "decode_start_s": [0.0, 1.0], "finish_s": [2.5, 3.5]})
    start = np.array([0.0, 1.0, 2.0, 3.0])
    assert longest_context(df, start, np.array([0, 1])).tolist() == [101.0, 301.0, 302.0, 303.0]


def _mix_rows(share: float, price_s: float, noise_s: float = 0.0, seed: int = 0) -> pd.DataFrame:
    """Mix runs of batches 8, 16, 32: uniform ones at 2,000 tokens each, spread ones of the same total whose longest is
    3,000; an iteration costs 5 ms + price_s per context token priced with `share`."""
    rng = np.random.default_rng(seed)
    rows = []
    for b in (8, 16, 32):
        total = b * 2000
        for kind, longest in (("uniform", 2000), ("spread", 3000)):
            for k in range(16):
                wall = 0.005 + price_s * (total + share * (b * longest - total)) + noise_s * rng.standard_normal()
                rows.append(
                    dict(
                        set="m:1",
                        method="hack",
                        batch_size=b,
                        kind=kind,
                        k=k,
                        max_context=longest,
                        context_tokens=total,
                        wall_s=wall,
                    )
                )
    return pd.DataFrame(rows)


def test_padding_share_recovers_a_known_share(tmp_path):
    price = 5e-8
    path = tmp_path / "mix.csv"
    _mix_rows(0.3, price).to_csv(path, index=False)
    got = padding_share([path], lambda *_: price)["m:1 hack"]
    assert got["share"] == pytest.approx(0.3, abs=1e-3) and got["value"] == pytest.approx(0.3)
    # none, under noise: not resolved, held at 0
    _mix_rows(0.0, price, noise_s=2e-4, seed=1).to_csv(path, index=False)
    got = padding_share([path], lambda *_: price)["m:1 hack"]
    assert abs(got["share"]) <= 2 * got["se"] and got["value"] == 0.0


def test_the_committed_mix_runs_give_the_h200_scenarios_shares():
    """realrun.transient --fit on the committed mix runs of both sessions, priced by the committed scenarios: every
    share resolved but the 8-layer 70B's FP16 (0); the 70B's HACK kernel (one wave of programs) pays nearly all of its
    padding; every h200g scenario carries its model's values."""
    assert len(MIX) == 5
    got = padding_share(MIX, scenario_per_ctx_s(SCENARIOS))
    assert {k: v["value"] for k, v in got.items()} == {
        "llama-3.1-70b:8 baseline": 0.0,
        "llama-3.1-70b:8 hack": 0.82,
        "llama-3.1-70b:8 kvquant": 0.09,
        "llama-3.1-8b:32 baseline": 0.05,
        "llama-3.1-8b:32 hack": 0.19,
        "llama-3.1-8b:32 kvquant": 0.12,
    }
    for path in SCENARIOS:
        s = load_scenario(path, [])
        key = f"{s.model.name.lower()}:{s.model.layers}"
        for m in s.methods:
            f = s.calibration.implementation_factors.get(m.name)
            assert (f.attention_padding_share if f else 0.0) == got[f"{key} {m.name}"]["value"], (path, m.name)
