"""Chunked prefill (prefill.chunk_tokens) and placement colocated: closed forms, queueing, direction."""

from __future__ import annotations

import numpy as np
import pytest

from helpers import scenario
from simulator.config import ScenarioError
from simulator.decode import segment_sum_s, segment_time_s
from simulator.load import load_scenario
from simulator.run import BREAKDOWN_PARTS, resolve, run_scenario


@pytest.mark.parametrize("method", ["baseline", "hack", "kvquant", "cachegen", "fp8"])
def test_lone_colocated_request_runs_its_chunks_then_decodes_in_closed_form(method):
    """4096-token prompt in 1536-token chunks (1536, 1536, 1024), each an iteration of an otherwise idle
    replica; the last chunk's token is the first; then 31 decode iterations from context 4097."""
    s = scenario(methods=[method], placement="colocated", **{"prefill.chunk_tokens": 1536})
    row = next(run_scenario(s).requests.itertuples())
    _, dec = resolve(s).costs(s.methods[0])
    chunks = [
        dec.mixed_iteration(0, n, past, last)
        for n, past, last in ((1536, 0, False), (1536, 1536, False), (1024, 3072, True))
    ]
    prefill_s = sum(it.fixed_s for it, _ in chunks)
    assert row.prefill_end_s - row.prefill_start_s == pytest.approx(prefill_s, rel=1e-12)
    assert row.prefill_start_s == row.arrival_s and row.first_token_s == row.prefill_end_s
    assert row.transfer_s == 0 and row.kv_wire_bytes > 0 and row.quantize_s == 0
    decode_s = segment_time_s(dec.iteration(1), 31, 4097 - 3, 1, 3)
    assert row.finish_s - row.decode_start_s == pytest.approx(decode_s, rel=1e-12)
    assert row.decode_start_s == row.prefill_end_s
    it = dec.iteration(1)
    approx = sum(pc.approximation_s for _, pc in chunks) + segment_sum_s(
        it.approx_fixed_s, it.approx_per_ctx_s, 31, 4094, 1, 3
    )
    assert row.approximation_s == pytest.approx(approx, rel=1e-12, abs=1e-15)
    assert (row.approximation_s > 0) == (method == "hack")
    assert sum(getattr(row, f"{p}_s") for p in BREAKDOWN_PARTS) == pytest.approx(row.jct_s, rel=1e-12)


def test_a_chunk_beside_decode_rows_costs_what_it_adds_to_their_iteration():
    s = scenario(methods=["hack"])
    _, dec = resolve(s).costs(s.methods[0])
    it, pc = dec.mixed_iteration(8, 512, 1024, False)
    base = dec.iteration(8)
    assert it.fixed_s - base.fixed_s == pytest.approx(pc.latency_s, rel=1e-12) and pc.latency_s > 0
    assert it.per_ctx_s == base.per_ctx_s
    # the chunk shares the weight reads with the decode rows: cheaper than alone
    alone, _ = dec.mixed_iteration(0, 512, 1024, False)
    assert pc.latency_s < alone.fixed_s


@pytest.mark.parametrize("method", ["baseline", "hack"])
def test_separate_prefill_in_chunks_is_the_sum_of_its_chunks(method):
    s = scenario(methods=[method], **{"prefill.chunk_tokens": 1000})
    row = next(run_scenario(s).requests.itertuples())
    pre, _ = resolve(s).costs(s.methods[0])
    parts = [
        pre.prefill((past + n,), (past,))
        for past, n in ((0, 1000), (1000, 1000), (2000, 1000), (3000, 1000), (4000, 96))
    ]
    assert row.prefill_end_s - row.prefill_start_s == pytest.approx(sum(p.latency_s for p in parts), rel=1e-12)
    assert row.quantize_end_s - row.prefill_end_s == pytest.approx(sum(p.encode_s for p in parts), rel=1e-12)
    # chunks re-read the earlier chunks' KV and launch more kernels: never faster than one pass
    assert row.prefill_end_s - row.prefill_start_s >= pre.prefill((4096,)).latency_s


def test_md1_queueing_delay_at_a_chunked_prefill():
    """Poisson arrivals, one prefill server, every prompt run as the same chunks: mean wait = ρD / (2(1-ρ))."""
    fixed = {
        "workload.output_tokens": {"kind": "fixed", "tokens": 2},
        "network.bandwidth_gbps": 400,
        "prefill.chunk_tokens": 1024,
        "methods": ["baseline"],
    }
    base = scenario(**fixed)
    service_s = resolve(base).costs(base.methods[0])[0].chunked_prefill(4096, 1024).stage_s
    rho = 0.5
    s = scenario(
        **fixed, **{"workload.requests": 20000, "workload.arrival": {"kind": "poisson", "rate_rps": rho / service_s}}
    )
    df = run_scenario(s).requests
    assert df["prefill_queue_s"].mean() == pytest.approx(rho * service_s / (2 * (1 - rho)), rel=0.07)


def test_colocated_prefill_queueing_lies_between_a_pooled_and_a_split_queue():
    """One-token requests (prefill only) on two colocated replicas, each prompt the same chunks: the router
    sends each arrival to the replica with fewer queued tokens, so the wait is below two independent M/D/1
    queues at half the rate each, and both replicas serve."""
    fixed = {
        "workload.output_tokens": {"kind": "fixed", "tokens": 1},
        "prefill.chunk_tokens": 2048,
        "placement": "colocated",
        "methods": ["baseline"],
    }
    base = scenario(**fixed)
    _, dec = resolve(base).costs(base.methods[0])
    service_s = dec.mixed_iteration(0, 2048, 0, False)[0].fixed_s + dec.mixed_iteration(0, 2048, 2048, True)[0].fixed_s
    rho = 0.6
    s = scenario(
        **fixed,
        **{"workload.requests": 20000, "workload.arrival": {"kind": "poisson", "rate_rps": 2 * rho / service_s}},
    )
    r = run_scenario(s)
    df = r.requests
    wait = df["prefill_queue_s"].mean()
    assert 0 < wait < rho * service_s / (2 * (1 - rho))
    assert np.allclose(df["prefill_end_s"] - df["prefill_start_s"], service_s, rtol=1e-12)
    assert r.summary["methods"]["baseline"]["utilisation"]["prefill"] == pytest.approx(rho, rel=0.05)
    assert 0.5 <= (df["decode_replica"] == 0).mean() < 0.65  # ties (both idle) go to replica 0


def test_colocated_saves_the_transfer_and_pays_in_decode_iterations():
    s = "scenarios/colocated_vs_disaggregated.yaml"
    sep = run_scenario(load_scenario(s, ["workload.requests=120", "methods=[baseline,hack]"]))
    col = run_scenario(load_scenario(s, ["workload.requests=120", "methods=[baseline,hack]", "placement=colocated"]))
    for m in ("baseline", "hack"):
        a, b = sep.summary["methods"][m], col.summary["methods"][m]
        assert b["breakdown_s"]["transfer"] == 0 < a["breakdown_s"]["transfer"]
        assert b["ttft_s"]["mean"] < a["ttft_s"]["mean"]
        assert b["tpot_s"]["mean"] > a["tpot_s"]["mean"]  # chunks share the decode iterations
        assert b["completed"] == 120 and b["utilisation"]["network"] == 0
    # the same four GPUs
    assert col.requests["decode_replica"].max() == 3 and sep.requests["decode_replica"].max() == 1


@pytest.mark.parametrize(
    "changes, message",
    [
        ({"placement": "colocated", "prefill.gpu": "h100"}, "same gpu, tensor_parallel and pipeline_parallel"),
        (
            {"placement": "colocated", "prefill.prefix_caching": True, "prefill.prefix_cache_gib": 1},
            "prefix caching is modelled for separate pools only",
        ),
        ({"prefill.chunk_tokens": 0}, "prefill.chunk_tokens"),
    ],
)
def test_bad_colocated_settings_name_the_field(changes, message):
    with pytest.raises(ScenarioError, match=message):
        scenario(**changes)
