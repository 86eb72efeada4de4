"""Mixture-of-experts models: catalog facts, the expected-distinct-experts pricing of decode, expert
parallelism's all-to-all, and MoE requests through the simulator (closed form, queueing, direction)."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

import catalog
from costmodel import collectives as co
from costmodel.phases import ReplicaCostModel
from costmodel.specs import FP16_BYTES, ModelSpec
from helpers import scenario
from simulator.config import ScenarioError
from simulator.load import load_scenario
from simulator.resolve import resolve
from simulator.run import run_scenario
from test_simulator import lone_timeline, simulated_timeline

MODEL_FIELDS = (
    "layers",
    "hidden_size",
    "heads",
    "kv_heads",
    "head_dim",
    "intermediate_size",
    "vocab_size",
    "mlp",
    "qkv_bias",
    "tied_embeddings",
    "experts",
    "active_experts",
    "expert_intermediate_size",
)


def spec(key: str, **changes) -> ModelSpec:
    e = {**catalog.entry("models", key), **changes}
    return ModelSpec(key=key, name=e["name"], **{f: e.get(f, 0) for f in MODEL_FIELDS})


@pytest.mark.parametrize("key, total_b, active_b", [("mixtral-8x7b", 46.7, 12.9), ("qwen3-30b-a3b", 30.5, 3.3)])
def test_catalog_moe_models_have_the_cited_total_and_active_parameters(key, total_b, active_b):
    m = spec(key)
    assert m.is_moe and m.active_experts < m.experts
    assert m.params / 1e9 == pytest.approx(total_b, rel=0.01)
    assert m.active_params / 1e9 == pytest.approx(active_b, rel=0.02)
    assert all(catalog.entry("models", key)["sources"])


def test_distinct_experts_is_the_uniform_routing_expectation():
    """E·(1 − (1 − k/E)^T) against exact enumeration of every routing of T tokens to k-of-E experts."""
    for e, k, t in ((4, 2, 2), (5, 2, 3), (6, 3, 2), (4, 1, 3)):
        m = ModelSpec(
            key="m",
            name="m",
            layers=1,
            hidden_size=8,
            heads=1,
            kv_heads=1,
            head_dim=8,
            intermediate_size=8,
            vocab_size=8,
            experts=e,
            active_experts=k,
            expert_intermediate_size=8,
        )
        choices = list(itertools.combinations(range(e), k))
        exact = np.mean([len(set().union(*r)) for r in itertools.product(choices, repeat=t)])
        assert m.distinct_experts(t) == pytest.approx(exact, rel=1e-12)
    q = spec("qwen3-30b-a3b")
    assert q.distinct_experts(1) == pytest.approx(8) and q.distinct_experts(4096) == pytest.approx(128)
    assert spec("llama-3.1-8b").distinct_experts(32) == 0


def _moe_scenario(**changes):
    base = {"model": "qwen3-30b-a3b", "methods": ["baseline", "hack"]}
    return scenario(**{**base, **changes})


def grouped_gemm_by_hand(cost, rows, n, kd, groups):
    """One fused-MoE GEMM at the roofline: FLOPs or bytes (each touched expert's weights once), one launch."""
    prof = cost.profile
    ov = prof.launch_overhead_s if prof.gemm is None else prof.gemm.overhead_s
    ce, me = (1.0, 1.0) if prof.gemm is None else (prof.gemm.compute_efficiency, prof.gemm.memory_efficiency)
    return ov + max(
        2 * rows * n * kd / (prof.matmul_fp16_tflops * 1e12 * ce),
        FP16_BYTES * (groups * n * kd + rows * kd + rows * n) / (prof.memory_gbps * 1e9 * me),
    )


def test_moe_layer_at_batch_one_reads_k_experts_and_all_of_them_at_prefill():
    """The roofline MoE block by hand: router GEMM, then two grouped GEMMs reading the touched experts'
    weights once; a lone decode token touches k experts, an 8K-token prefill batch all of them."""
    s = _moe_scenario()
    _, dec = resolve(s).costs(s.methods[0])
    m = dec.model
    h, ei, k = m.hidden_size, m.expert_intermediate_size, m.active_experts
    for tokens, groups in ((1, k), (8192, m.experts)):
        want = (
            dec.gemm_s(tokens, m.experts, h)
            + grouped_gemm_by_hand(dec, tokens * k, 2 * ei, h, groups)
            + grouped_gemm_by_hand(dec, tokens * k, h, ei, groups)
        )  # tensor_parallel 1: no all-reduce
        assert dec._moe_s(tokens) == pytest.approx(want, rel=1e-9 if tokens == 1 else 1e-6)
    # decode at batch 1 reads the weights of k of E experts: far less than a dense MLP of the same size
    dense = ModelSpec(
        **{
            **m.__dict__,
            "experts": 0,
            "active_experts": 0,
            "expert_intermediate_size": 0,
            "intermediate_size": m.experts * ei,
        }
    )
    dense_cost = ReplicaCostModel(
        model=dense, gpu=dec.gpu, parallel=dec.parallel, method=dec.method, profile=dec.profile
    )
    assert dec.iteration(1).fixed_s < 0.5 * dense_cost.iteration(1).fixed_s


def test_expert_parallelism_trades_the_mlp_allreduce_for_two_alltoalls():
    """Tensor-parallel experts: every GPU runs all T·k rows on 1/p of each touched expert, then an
    all-reduce. Expert parallelism: each GPU runs its T·k/p rows on its 1/p share of the touched experts at
    full width, between a dispatch and a combine all-to-all of its T/p tokens' k copies."""
    common = {"decode.instance": "p4de.24xlarge", "decode.tensor_parallel": 8}
    tp = _moe_scenario(**common)
    ep = _moe_scenario(**common, **{"decode.expert_parallel": True})
    (_, d_tp), (_, d_ep) = resolve(tp).costs(tp.methods[0]), resolve(ep).costs(ep.methods[0])
    par, m, p = d_ep.parallel, d_ep.model, 8
    assert par.expert_parallel and not d_tp.parallel.expert_parallel and par.interconnect.key == "nvswitch"
    h, ei, k = m.hidden_size, m.expert_intermediate_size, m.active_experts
    for t in (1, 64, 4096):
        d = m.distinct_experts(t)
        a2a = co.alltoall_s(t / p * k * h * FP16_BYTES, p, par.interconnect, par.intra_node_gb_per_s)
        want_ep = (
            d_ep.gemm_s(t / p, m.experts, h)
            + grouped_gemm_by_hand(d_ep, t * k / p, 2 * ei, h, d / p)
            + grouped_gemm_by_hand(d_ep, t * k / p, h, ei, d / p)
            + 2 * a2a
        )
        want_tp = (
            d_tp.gemm_s(t, m.experts, h)
            + grouped_gemm_by_hand(d_tp, t * k, 2 * ei / p, h, d)
            + grouped_gemm_by_hand(d_tp, t * k, h, ei / p, d)
            + d_tp.allreduce_s(t)
        )
        assert d_ep._moe_s(t) == pytest.approx(want_ep, rel=1e-9)
        assert d_tp._moe_s(t) == pytest.approx(want_tp, rel=1e-9)
    # profiles.json lists the all-to-all per decode batch size
    prof = run_scenario(ep, methods=["baseline"]).profiles()
    assert [r["tokens"] for r in prof["collectives"]["decode"]["alltoall"]] == [1, 8, 32, 64]
    assert "alltoall" not in run_scenario(tp, methods=["baseline"]).profiles()["collectives"]["decode"]


def test_alltoall_bus_bandwidth_is_the_cited_nvlink_figure():
    nvs = co.from_catalog(catalog.entry("interconnects", "nvswitch"))
    cited = next(
        m for m in catalog.entry("interconnects", "nvswitch")["measured"] if m["what"] == "alltoall_bus_gb_per_s"
    )
    link = catalog.entry("gpus", cited["gpu"])["nvlink_gb_per_s"]
    n = 8 * 2**30
    bus_gb_per_s = n * 7 / 8 / (co.alltoall_s(n, 8, nvs, link) - co.alltoall_s(0.0, 8, nvs, link)) / 1e9
    assert bus_gb_per_s == pytest.approx(cited["value"], rel=0.01)
    assert co.alltoall_s(1e6, 1, nvs, link) == 0


def test_expert_parallelism_is_refused_where_it_cannot_apply():
    with pytest.raises(ScenarioError, match="decode.expert_parallel: Llama-3.1-8B is not a mixture of experts"):
        scenario(**{"decode.expert_parallel": True})
    with pytest.raises(ScenarioError, match="do not spread evenly"):
        _moe_scenario(
            **{
                "model": "mixtral-8x7b",
                "decode.instance": "p4de.24xlarge",
                "decode.gpu": "a100_80gb",
                "decode.tensor_parallel": 3,
                "decode.expert_parallel": True,
            }
        )
    with pytest.raises(ScenarioError, match="needs experts >= 2"):
        scenario(**{"model": {"preset": "llama-3.1-8b", "experts": 8}})


@pytest.mark.parametrize("method", ["baseline", "hack"])
def test_lone_moe_request_timeline_equals_closed_form(method):
    s = _moe_scenario(methods=[method])
    row = next(run_scenario(s).requests.itertuples())
    got, want = simulated_timeline(row), lone_timeline(s, s.methods[0])
    assert [t for t, _ in got] == pytest.approx([t for t, _ in want], rel=1e-12, abs=1e-12)


def test_md1_queueing_delay_at_moe_prefill():
    """Poisson arrivals, deterministic MoE prefill service, one server: mean wait = ρD / (2(1-ρ))."""
    fixed = {
        "workload.output_tokens": {"kind": "fixed", "tokens": 2},
        "workload.input_tokens": {"kind": "fixed", "tokens": 1024},
        "network.bandwidth_gbps": 400,
    }
    base = _moe_scenario(methods=["baseline"], **fixed)
    service_s = resolve(base).costs(base.methods[0])[0].prefill((1024,)).stage_s
    rho = 0.5
    s = _moe_scenario(
        methods=["baseline"],
        **fixed,
        **{"workload.requests": 20000, "workload.arrival": {"kind": "poisson", "rate_rps": rho / service_s}},
    )
    df = run_scenario(s).requests
    assert df["prefill_queue_s"].mean() == pytest.approx(rho * service_s / (2 * (1 - rho)), rel=0.07)


def test_kv_takes_a_larger_share_of_moe_decode_so_compression_saves_more():
    """Qwen3-30B-A3B against the same model with one dense MLP of all its experts' width (same weight
    bytes): at batch 8 and 8K context per request the MoE iteration reads the weights of about 52 of 128
    experts, so the KV's share of it is larger than in the dense one, and so is the share of the iteration
    HACK saves."""
    s = _moe_scenario()
    res = resolve(s)
    (_, moe_base), (_, moe_hack) = res.costs(s.methods[0]), res.costs(s.methods[1])
    m = moe_base.model
    dense_model = ModelSpec(
        **{
            **m.__dict__,
            "experts": 0,
            "active_experts": 0,
            "expert_intermediate_size": 0,
            "intermediate_size": m.experts * m.expert_intermediate_size,
        }
    )

    def costs(model, method_cost):
        return ReplicaCostModel(
            model=model,
            gpu=method_cost.gpu,
            parallel=method_cost.parallel,
            method=method_cost.method,
            profile=method_cost.profile,
        )

    b, ctx = 8, 8 * 8192
    share = {}
    saving = {}
    for name, base, hack in (
        ("moe", moe_base, moe_hack),
        ("dense", costs(dense_model, moe_base), costs(dense_model, moe_hack)),
    ):
        it = base.iteration(b)
        share[name] = it.per_ctx_s * ctx / it.time_s(ctx)
        saving[name] = 1 - hack.iteration(b).time_s(ctx) / it.time_s(ctx)
    assert share["moe"] > 1.5 * share["dense"] and saving["moe"] > 1.5 * saving["dense"] > 0


def test_shipped_moe_scenario_runs_with_expert_parallelism():
    s = load_scenario("scenarios/moe_qwen3_30b_a3b.yaml", ["workload.requests=40"])
    assert s.model.experts == 128 and s.decode.expert_parallel
    summary = run_scenario(s).summary["methods"]
    assert summary["hack"]["jct_s"]["mean"] < summary["baseline"]["jct_s"]["mean"]
    assert all(v["completed"] == 40 for v in summary.values())
