"""The simulator against the closed-form cost model, queueing theory and its own invariants."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from costmodel.transfer import transfer_s
from helpers import scenario
from simulator.decode import iterations_within, segment_sum_s
from simulator.resolve import resolve
from simulator.run import run_scenario
from simulator.step_price import Iteration
from simulator.workload import make_requests

PARTS = [
    "prefill_queue_s",
    "prefill_s",
    "quantize_s",
    "transfer_queue_s",
    "transfer_s",
    "decode_queue_s",
    "decode_s",
    "dequantize_s",
    "approximation_s",
]


def lone_timeline(s, cfg):
    """The closed-form timeline of the scenario's single request for one method."""
    res = resolve(s)
    reqs = make_requests(s)
    method = cfg
    pre, dec = res.costs(method)
    p, o = int(reqs.prompt_tokens[0]), int(reqs.output_tokens[0])
    arrival = float(reqs.arrival_s[0])
    pc = pre.prefill((p,))
    prefill_end = arrival + pc.latency_s
    encode_end = prefill_end + pc.encode_s
    net = s.network
    transfer_end = encode_end + transfer_s(
        pre.wire_bytes(p), net.bandwidth_gbps, net.efficiency, net.per_flow_gbps, net.latency_s
    )
    it = dec.iteration(1)
    # ttft_at decode: o iterations from context p, the first token at the end of the first; prefill: o - 1
    # iterations from context p + 1 after the prefill's token
    n, c = (o, p) if s.ttft_at == "decode" else (o - 1, p + 1)
    start = transfer_end + dec.on_arrival_s(p)
    finish = start + n * it.fixed_s + it.per_ctx_s * (n * c + n * (n - 1) / 2)
    first_token = start + it.fixed_s + it.per_ctx_s * c if s.ttft_at == "decode" else prefill_end
    return [
        (arrival, "arrive"),
        (arrival, "prefill_start"),
        (first_token, "first_token"),
        (encode_end, "quantized"),
        (encode_end, "transfer_start"),
        (transfer_end, "transfer_end"),
        (transfer_end, "decode_start"),
        (finish, "finish"),
    ]


def simulated_timeline(row):
    return [
        (row.arrival_s, "arrive"),
        (row.prefill_start_s, "prefill_start"),
        (row.first_token_s, "first_token"),
        (row.quantize_end_s, "quantized"),
        (row.transfer_start_s, "transfer_start"),
        (row.transfer_end_s, "transfer_end"),
        (row.decode_start_s, "decode_start"),
        (row.finish_s, "finish"),
    ]


@pytest.mark.parametrize("ttft_at", ["decode", "prefill"])
@pytest.mark.parametrize("method", ["baseline", "kvquant", "cachegen", "fp8", "hack", "hack_no_se", "hack_no_rqe"])
def test_single_request_timeline_equals_closed_form(method, ttft_at):
    s = scenario(methods=[method], ttft_at=ttft_at)
    result = run_scenario(s)
    row = next(result.requests.itertuples())
    got = simulated_timeline(row)
    want = lone_timeline(s, s.methods[0])
    assert [e for _, e in got] == [e for _, e in want]
    assert [t for t, _ in got] == pytest.approx([t for t, _ in want], rel=1e-12, abs=1e-12)


def test_single_request_exact_baseline_numbers():
    """A hand-checkable case: 4096-token prompt, FP16 KV of Llama-3.1-8B, 10 Gbps at full efficiency."""
    s = scenario(methods=["baseline"])
    row = next(run_scenario(s).requests.itertuples())
    kv_bytes = 4096 * 32 * 2 * 8 * 128 * 2  # tokens × layers × (K,V) × kv_heads × head_dim × FP16
    assert row.kv_wire_bytes == kv_bytes
    assert row.transfer_end_s - row.transfer_start_s == pytest.approx(kv_bytes * 8 / 10e9, rel=1e-12)
    assert row.quantize_s == 0 and row.dequantize_s == 0 and row.approximation_s == 0
    assert row.prefill_queue_s == 0 and row.transfer_queue_s == 0 and row.decode_queue_s == 0


def test_breakdown_adds_up_to_jct():
    s = scenario(
        **{
            "workload.requests": 200,
            "workload.arrival": {"kind": "poisson", "rate_rps": 4.0},
            "prefill.max_batch_requests": 4,
            "decode.gpu_memory_utilization": 0.3,
        }
    )
    df = run_scenario(s).requests
    np.testing.assert_allclose(df[PARTS].sum(axis=1), df["jct_s"], rtol=1e-9, atol=1e-9)
    assert (df[PARTS] >= -1e-9).all().all()


def test_md1_queueing_delay_at_prefill():
    """Poisson arrivals, deterministic prefill service, one server: mean wait = ρD / (2(1-ρ))."""
    base = scenario(
        methods=["baseline"],
        **{
            "workload.output_tokens": {"kind": "fixed", "tokens": 2},
            "workload.input_tokens": {"kind": "fixed", "tokens": 1024},
            "network.bandwidth_gbps": 400,
        },
    )
    res = resolve(base)
    pre, _ = res.costs(base.methods[0])
    service_s = pre.prefill((1024,)).stage_s
    rho = 0.6
    s = scenario(
        methods=["baseline"],
        **{
            "workload.output_tokens": {"kind": "fixed", "tokens": 2},
            "workload.input_tokens": {"kind": "fixed", "tokens": 1024},
            "network.bandwidth_gbps": 400,
            "workload.requests": 40000,
            "workload.arrival": {"kind": "poisson", "rate_rps": rho / service_s},
        },
    )
    df = run_scenario(s).requests
    theory = rho * service_s / (2 * (1 - rho))
    assert df["prefill_queue_s"].mean() == pytest.approx(theory, rel=0.05)


def test_contended_link_shares_bandwidth(tmp_path):
    """Two equal transfers that start together each get half the link."""
    trace = tmp_path / "trace.csv"
    trace.write_text("arrival_s,prompt_tokens,output_tokens\n0.0,4096,32\n0.0,4096,32\n")
    s = scenario(
        methods=["baseline"],
        **{
            "prefill.max_batch_requests": 2,
            "workload.requests": 2,
            "workload.trace_csv": str(trace),
            "workload.arrival": {"kind": "trace"},
        },
    )
    df = run_scenario(s).requests
    assert df["prefill_start_s"].nunique() == 1  # batched together, so transfers start together
    alone = df["kv_wire_bytes"].iloc[0] * 8 / 10e9
    assert (df["transfer_end_s"] - df["transfer_start_s"]).tolist() == pytest.approx([2 * alone, 2 * alone], rel=1e-9)


def test_decode_memory_parking_is_recorded():
    """When decode memory is short, KV waits on the prefill side and the wait is transfer_queue."""
    s = scenario(
        methods=["baseline"],
        **{
            "workload.requests": 30,
            # 0.30 x 85.1e9 B (the A100 80 GB as the driver reports it) = 25.5 GB: room for a few requests only
            "decode.gpu_memory_utilization": 0.30,
            "workload.arrival": {"kind": "poisson", "rate_rps": 50.0},
        },
    )
    result = run_scenario(s, keep_runs=True)
    df = result.requests
    assert df["transfer_queue_s"].max() > 0
    run = result.runs["baseline"]
    cap = run.decode_replicas[0].capacity_bytes
    assert max(u for (_, _, u) in run.records.memory_log) <= cap


def test_stream_layers_overlaps_transfer_with_prefill():
    plain = run_scenario(scenario(methods=["baseline"])).requests.iloc[0]
    streamed = run_scenario(scenario(methods=["baseline"], **{"network.stream_layers": True})).requests.iloc[0]
    assert streamed.transfer_start_s < plain.transfer_start_s
    assert streamed.jct_s < plain.jct_s
    # The last layer's KV still crosses the link after prefill, at the link's rate (10 Gbps, no per-flow
    # cap in this scenario): at least its bytes / the link rate after the KV is ready.
    layers = run_scenario(scenario(methods=["baseline"])).resolved.model.layers
    last_layer_s = streamed.kv_wire_bytes / layers / (10e9 / 8)
    assert streamed.transfer_end_s >= streamed.quantize_end_s + last_layer_s * (1 - 1e-9)
    # also when the link outruns the prefill (the earlier layers are all across by then)
    fast = run_scenario(
        scenario(methods=["baseline"], **{"network.stream_layers": True, "network.bandwidth_gbps": 3200})
    ).requests.iloc[0]
    last_layer_s = fast.kv_wire_bytes / layers / (3200e9 / 8)
    assert fast.transfer_end_s - fast.quantize_end_s == pytest.approx(last_layer_s, rel=1e-3)


def test_same_seed_same_results_other_seed_differs():
    s = scenario(
        **{
            "workload.requests": 50,
            "workload.arrival": {"kind": "poisson", "rate_rps": 2.0},
            "workload.input_tokens": {"kind": "uniform", "min_tokens": 100, "max_tokens": 3000},
        }
    )
    a, b = run_scenario(s).requests, run_scenario(s).requests
    assert a.equals(b)
    c = run_scenario(
        scenario(
            **{
                "workload.requests": 50,
                "workload.seed": 1,
                "workload.arrival": {"kind": "poisson", "rate_rps": 2.0},
                "workload.input_tokens": {"kind": "uniform", "min_tokens": 100, "max_tokens": 3000},
            }
        )
    ).requests
    assert not a.equals(c)


def only_fixed_and_per_ctx(fixed_s: float, per_ctx_s: float, host_s: float = 0.0) -> Iteration:
    """An iteration costing fixed_s + per_ctx_s · context (all of it decode), at least host_s."""
    zero = 0.0
    return Iteration(fixed_s, per_ctx_s, zero, zero, zero, zero, zero, zero, host_s, fixed_s, per_ctx_s)


def test_closed_form_segment_matches_iteration_by_iteration():
    rng = np.random.default_rng(3)
    for _ in range(50):
        f, p = rng.uniform(1e-3, 1e-2), rng.uniform(1e-9, 1e-7)
        c, b, k, n = (
            rng.uniform(1e3, 1e5),
            int(rng.integers(1, 64)),
            int(rng.integers(0, 1000)),
            int(rng.integers(1, 500)),
        )
        step = sum(f + p * (c + b * j) for j in range(k, k + n))
        assert segment_sum_s(f, p, n, c, b, k) == pytest.approx(step, rel=1e-9)

        cost = only_fixed_and_per_ctx(f, p)
        elapsed = rng.uniform(0, step)
        m = iterations_within(cost, elapsed, c, b, k)
        assert segment_sum_s(f, p, m, c, b, k) <= elapsed * (1 + 1e-12)
        assert segment_sum_s(f, p, m + 1, c, b, k) > elapsed


def test_closed_form_with_host_issue_matches_iteration_by_iteration():
    """Iterations last max(GPU time, host time): the closed form (host-bound ones first) equals
    the iteration-by-iteration sum, and iterations_within inverts it, in host-bound, mixed and
    GPU-bound segments."""
    from simulator.decode import segment_time_s

    rng = np.random.default_rng(7)
    for _ in range(200):
        f, p = rng.uniform(1e-3, 1e-2), rng.uniform(1e-9, 1e-7)
        c, b, k, n = (
            rng.uniform(1e3, 1e5),
            int(rng.integers(1, 64)),
            int(rng.integers(0, 1000)),
            int(rng.integers(1, 500)),
        )
        gpu = [f + p * (c + b * j) for j in range(k, k + n)]
        h = float(rng.choice([0.0, rng.uniform(0.5, 1.5) * gpu[len(gpu) // 2], 2 * gpu[-1]]))

        cost = only_fixed_and_per_ctx(f, p, h)
        step = sum(max(g, h) for g in gpu)
        assert segment_time_s(cost, n, c, b, k) == pytest.approx(step, rel=1e-9)
        elapsed = rng.uniform(0, step)
        m = iterations_within(cost, elapsed, c, b, k)
        assert segment_time_s(cost, m, c, b, k) <= elapsed * (1 + 1e-9)
        assert segment_time_s(cost, m + 1, c, b, k) > elapsed * (1 - 1e-9)


def test_host_issue_sets_a_floor_under_decode_iterations():
    """A host-bound engine: every iteration takes the host time, TPOT rises by it, and the wait is
    counted as decode time (the breakdown still sums to the JCT)."""
    base = scenario(methods=["baseline"], **{"workload.requests": 20})
    slow = scenario(methods=["baseline"], **{"workload.requests": 20, "decode.host_issue_s_per_layer": 0.002})
    a, b = run_scenario(base), run_scenario(slow)
    ra, rb = a.requests, b.requests
    layers = a.resolved.model.layers
    assert (rb["tpot_s"] >= layers * 0.002 * 0.999).all()
    assert (rb["decode_s"] > ra["decode_s"]).all()
    from simulator.run import BREAKDOWN_PARTS

    parts = [f"{part}_s" for part in BREAKDOWN_PARTS]
    assert np.allclose(rb[parts].sum(axis=1), rb["jct_s"], rtol=1e-9, atol=1e-9)


def test_hack_beats_baseline_on_slow_link_and_transfers_fewer_bytes():
    s = scenario(methods=["baseline", "hack"], **{"network.bandwidth_gbps": 5})
    summary = run_scenario(s).summary["methods"]
    assert summary["hack"]["kv_bytes_per_token"]["wire"] < 0.2 * summary["baseline"]["kv_bytes_per_token"]["wire"]
    assert summary["hack"]["breakdown_s"]["transfer"] < summary["baseline"]["breakdown_s"]["transfer"]
    assert math.isclose(sum(summary["hack"]["breakdown_s"].values()), summary["hack"]["jct_s"]["mean"], rel_tol=1e-9)


def test_shared_gpu_prefill_takes_turns_with_decode(tmp_path):
    """placement: shared_gpu: a prefill that arrives mid-decode waits for the iteration boundary, then the
    decode pauses for exactly the prefill batch (its forward pass and quantization)."""
    trace = tmp_path / "trace.csv"
    trace.write_text("arrival_s,prompt_tokens,output_tokens\n0.0,4096,400\n1.0,2048,8\n")
    common = {
        "workload.trace_csv": str(trace),
        "workload.arrival": {"kind": "trace"},
        "workload.requests": 2,
        "methods": ["hack"],
    }
    sep = run_scenario(scenario(**common)).requests.set_index("request_id")
    shared_result = run_scenario(scenario(placement="shared_gpu", **common), keep_runs=True)
    shared = shared_result.requests.set_index("request_id")
    first, second = shared.loc[0], shared.loc[1]
    assert first.decode_start_s < 1.0 < first.finish_s  # request 1 was decoding when request 2 came
    assert second.prefill_start_s > 1.0  # ... so request 2 waited for a boundary
    assert second.prefill_start_s - 1.0 < 0.1  # (less than one iteration)
    pre, _ = resolve(scenario(placement="shared_gpu", **common)).costs(scenario(**common).methods[0])
    busy = pre.prefill((2048,))
    assert first.finish_s - sep.loc[0].finish_s == pytest.approx(busy.stage_s + busy.encode_s, rel=1e-9)
    # A lone request is not affected by sharing.
    lone = {**common, "workload.requests": 1}
    assert run_scenario(scenario(placement="shared_gpu", **lone)).requests["finish_s"].iloc[0] == pytest.approx(
        run_scenario(scenario(**lone)).requests["finish_s"].iloc[0], rel=1e-12
    )


def test_fixed_kv_pool_replaces_computed_capacity():
    result = run_scenario(scenario(methods=["baseline"], **{"decode.kv_capacity_gib": 3.0}), keep_runs=True)
    assert result.runs["baseline"].decode_replicas[0].capacity_bytes == 3.0 * 2**30
    with pytest.raises(Exception, match="kv_capacity_gib"):
        run_scenario(scenario(methods=["baseline"], **{"decode.kv_capacity_gib": 500.0}))


def test_gluon_priced_kernels_fall_back_to_their_triton_twins_where_gluon_does_not_run():
    """The H200 profile prices HACK's PI-64 decode step and fused dequant on the Gluon kernels, which take
    GQA 8 and head_dim 128 only; a GQA-4 model (Llama-3.1-8B) runs the Triton kernels, priced by the
    *_triton fits, and so does HACK at a partition the Gluon kernel does not take; HACK's step at GQA 4 has
    a fit of its own (decode_attn.hack_gqa4), which a profile without it replaces by the twin."""
    from costmodel.calibration import load_profile
    from costmodel.methods import HACK, KVQuant
    from costmodel.specs import ModelSpec

    prof = load_profile(Path(__file__).resolve().parent.parent / "kernels_calibration/profiles/h200/profile.json")

    def model(heads, kv_heads, head_dim=128):
        return ModelSpec(
            key="m",
            name="m",
            layers=2,
            hidden_size=heads * head_dim,
            heads=heads,
            kv_heads=kv_heads,
            head_dim=head_dim,
            intermediate_size=4096,
            vocab_size=1000,
        )

    gqa8, gqa4, d64 = model(64, 8), model(32, 8), model(64, 8, head_dim=64)
    for key, method in (
        ("hack", HACK()),
        ("hack_no_se", HACK(summation_elimination=False)),
        ("hack_no_rqe", HACK(requantization_elimination=False)),
        ("dequant_fused", KVQuant(dequant_kernel="fused")),
    ):
        assert method.decode_kernel(prof, gqa8) is prof.kernel(f"decode_attn.{key}")
        # measured at the model's own group where the profile has it (HACK's step at GQA 4), else the twin
        own = prof.kernels.get(f"decode_attn.{key}_gqa4")
        assert method.decode_kernel(prof, gqa4) is (own or prof.kernel(f"decode_attn.{key}_triton"))
        assert method.decode_kernel(prof, d64) is prof.kernel(f"decode_attn.{key}_triton")
    assert HACK(partition=32).decode_kernel(prof, gqa8) is prof.kernel("decode_attn.hack_pi32")
    assert HACK(partition=32, summation_elimination=False).decode_kernel(prof, gqa8) is prof.kernel(
        "decode_attn.hack_no_se_triton"
    )
    assert HACK().decode_kernel(prof, gqa4) is prof.kernel("decode_attn.hack_gqa4")
    from dataclasses import replace

    from costmodel.methods import decode_fit

    without = replace(prof, kernels={k: v for k, v in prof.kernels.items() if k != "decode_attn.hack_gqa4"})
    assert decode_fit(without, "hack", gqa4) is prof.kernel("decode_attn.hack_triton")
    # the Gluon kernels are the faster per KV element (the H200 profile)
    for key in ("hack", "hack_no_se", "hack_no_rqe", "dequant_fused"):
        assert prof.kernel(f"decode_attn.{key}").s_per_unit < prof.kernel(f"decode_attn.{key}_triton").s_per_unit


def test_hack_partition_uses_its_measured_decode_kernel():
    from costmodel.calibration import load_profile
    from costmodel.methods import HACK

    prof = load_profile(Path(__file__).resolve().parent.parent / "kernels_calibration/profiles/h200/profile.json")
    assert HACK(partition=128).decode_kernel(prof) is prof.kernel("decode_attn.hack_pi128")
    assert HACK(partition=64).decode_kernel(prof) is prof.kernel("decode_attn.hack")
    assert HACK(partition=128, summation_elimination=False).decode_kernel(prof) is prof.kernel("decode_attn.hack_no_se")
