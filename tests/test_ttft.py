"""Where the client's first token comes from (ttft_at): the decode instance at the end of the request's first
decode iteration (vLLM's disaggregated serving), or the prefill instance at the end of prefill."""

from __future__ import annotations

import numpy as np
import pytest

from helpers import scenario
from simulator.resolve import resolve
from simulator.run import run_scenario
from simulator.workload import make_requests


def _one(ttft_at: str, output: int = 32, method: str = "baseline"):
    s = scenario(methods=[method], ttft_at=ttft_at, **{"workload.output_tokens": {"kind": "fixed", "tokens": output}})
    return s, next(run_scenario(s).requests.itertuples())


def test_default_is_decode():
    assert scenario().ttft_at == "decode"


@pytest.mark.parametrize("method", ["baseline", "hack"])
def test_decode_ttft_is_the_end_of_the_first_decode_iteration(method):
    s, row = _one("decode", method=method)
    _, dec = resolve(s).costs(s.methods[0])
    p = int(make_requests(s).prompt_tokens[0])
    it = dec.iteration(1)
    # the first iteration recomputes the last prompt position: context = the prompt
    assert row.first_token_s == pytest.approx(row.decode_start_s + it.time_s(p), rel=1e-12)
    assert row.first_token_s > row.transfer_end_s > row.prefill_end_s
    # then one iteration per further token, contexts p + 1 .. p + 31
    rest = sum(it.time_s(p + j) for j in range(1, 32))
    assert row.finish_s - row.first_token_s == pytest.approx(rest, rel=1e-9)
    assert row.tpot_s == pytest.approx(rest / 31, rel=1e-9)
    assert row.ttft_s + 31 * row.tpot_s == pytest.approx(row.jct_s, rel=1e-12)


def test_prefill_ttft_is_the_end_of_prefill_and_decode_runs_one_iteration_fewer():
    s, pre_row = _one("prefill")
    _, dec_row = _one("decode")
    _, dec = resolve(s).costs(s.methods[0])
    p = int(make_requests(s).prompt_tokens[0])
    assert pre_row.first_token_s == pre_row.prefill_end_s
    it = dec.iteration(1)
    # prefill: 31 iterations from context p + 1; decode: 32 from context p (one iteration more)
    assert dec_row.finish_s - pre_row.finish_s == pytest.approx(it.time_s(p), rel=1e-9)
    assert dec_row.ttft_s > pre_row.ttft_s
    # the timeline up to the decode instance is the same
    for col in ("prefill_end_s", "quantize_end_s", "transfer_end_s", "decode_start_s"):
        assert getattr(dec_row, col) == getattr(pre_row, col)


def test_one_output_token():
    _, pre_row = _one("prefill", output=1)
    assert pre_row.finish_s == pre_row.quantize_end_s and pre_row.decode_replica == -1
    s, dec_row = _one("decode", output=1)
    # the decode instance yields the only token: the KV moves and one decode iteration runs
    assert dec_row.decode_replica == 0 and dec_row.kv_wire_bytes > 0
    assert dec_row.first_token_s == dec_row.finish_s > dec_row.transfer_end_s
    assert np.isnan(dec_row.tpot_s)


def test_requests_joining_together_see_their_first_token_together():
    s = scenario(
        methods=["baseline"],
        **{
            "prefill.max_batch_requests": 4,
            "workload.requests": 4,
            "workload.arrival": {"kind": "bursty", "rate_rps": 1000.0, "cv": 50.0},
        },
    )
    df = run_scenario(s).requests
    for _, g in df.groupby("decode_start_s"):
        assert g["first_token_s"].nunique() == 1
    assert (df["first_token_s"] > df["decode_start_s"]).all()


def test_every_first_token_lies_within_its_first_iteration_under_load():
    """Under contention the first token is still the end of the iteration the request joined: after its join,
    before its second token; TPOT and TTFT still add up to JCT."""
    s = scenario(
        methods=["baseline", "hack"],
        **{
            "workload.requests": 120,
            "workload.arrival": {"kind": "poisson", "rate_rps": 3.0},
            "workload.input_tokens": {"kind": "uniform", "min_tokens": 200, "max_tokens": 3000},
            "workload.output_tokens": {"kind": "uniform", "min_tokens": 2, "max_tokens": 60},
        },
    )
    df = run_scenario(s).requests
    assert (df["first_token_s"] > df["decode_start_s"]).all()
    assert (df["first_token_s"] <= df["finish_s"]).all()
    first_gap = df["first_token_s"] - df["decode_start_s"]
    assert (first_gap <= df["tpot_s"] * 3 + 1.0).all()
    np.testing.assert_allclose(df["ttft_s"] + (df["output_tokens"] - 1) * df["tpot_s"], df["jct_s"], rtol=1e-9)
