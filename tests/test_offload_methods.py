"""FP4, PQCache and HCAttention: formats, hardware checks, host memory, and their place in the simulation."""

from __future__ import annotations

import pytest

from costmodel.methods import FP8, PQCache, make_method
from costmodel.roofline import roofline_profile
from helpers import scenario
from simulator.config import ScenarioError
from simulator.resolve import gpu_spec, resolve
from simulator.run import run_scenario

INSTANCE_POOLS = {
    "prefill": {
        "instance": "g5.12xlarge",
        "tensor_parallel": 1,
        "replicas": 2,
        "max_batch_requests": 2,
        "max_batch_tokens": 8192,
    },
    "decode": {
        "instance": "g6.12xlarge",
        "tensor_parallel": 1,
        "replicas": 2,
        "max_batch_requests": 32,
        "max_batch_tokens": 2048,
        "gpu_memory_utilization": 0.95,
        "host_memory_gib": 40,
    },
}


def offload_scenario(**changes):
    return scenario(
        **{
            **INSTANCE_POOLS,
            "network.bandwidth_gbps": 40,
            "workload.input_tokens": {"kind": "uniform", "min_tokens": 4096, "max_tokens": 16384},
            "workload.output_tokens": {"kind": "uniform", "min_tokens": 16, "max_tokens": 64},
            "workload.arrival": {"kind": "poisson", "rate_rps": 2.0},
            "workload.requests": 60,
            **changes,
        }
    )


def test_offload_methods_hold_less_gpu_memory_and_use_host_memory():
    s = offload_scenario(methods=["baseline", "pqcache", "hcattention"])
    result = run_scenario(s, keep_runs=True)
    m = result.summary["methods"]
    assert m["pqcache"]["kv_bytes_per_token"]["memory"] < 0.05 * m["baseline"]["kv_bytes_per_token"]["memory"]
    assert m["hcattention"]["kv_bytes_per_token"]["memory"] < 0.5 * m["baseline"]["kv_bytes_per_token"]["memory"]
    assert m["pqcache"]["kv_bytes_per_token"]["host"] == m["baseline"]["kv_bytes_per_token"]["memory"]
    assert m["baseline"]["kv_bytes_per_token"]["host"] == 0
    for name in ("pqcache", "hcattention"):
        assert m[name]["completed"] == 60
        assert m[name]["offload_fetch_s"] > 0
        run = result.runs[name]
        assert all(abs(r.host_reserved_bytes) < 1e-3 for r in run.decode_replicas)  # all released
    df = result.requests
    assert (df["offload_fetch_s"] <= df["decode_s"] + 1e-12).all()  # fetch is part of decode


def test_host_memory_limits_offloaded_requests():
    long_decode = {
        "workload.output_tokens": {"kind": "fixed", "tokens": 1000},
        "workload.arrival": {"kind": "poisson", "rate_rps": 50.0},
    }
    tight = offload_scenario(methods=["pqcache"], **{"decode.host_memory_gib": 3.0, **long_decode})
    roomy = offload_scenario(methods=["pqcache"], **long_decode)
    t, r = run_scenario(tight).requests, run_scenario(roomy).requests
    assert t["transfer_queue_s"].mean() > r["transfer_queue_s"].mean()
    with pytest.raises(ScenarioError, match="decode.host_memory_gib"):
        run_scenario(offload_scenario(methods=["pqcache"], **{"decode.host_memory_gib": 0.5}))


def test_pqcache_needs_host_cpus_and_caps_kmeans():
    with pytest.raises(ScenarioError, match="host.vcpus"):
        run_scenario(scenario(methods=["pqcache"]))  # pools given by GPU only: no host CPUs known
    s = offload_scenario(methods=["pqcache"])
    pre, _ = resolve(s).costs(make_method("pqcache"))
    for tokens in (512, 4096, 16384):
        latency = pre.prefill((tokens,)).latency_s
        t = pre.pq_iterations(tokens, latency)
        assert 1 <= t <= PQCache().kmeans_max_iterations
        # The cap keeps clustering within the GPU prefill time unless a single iteration outlasts it.
        assert t * pre.kmeans_iteration_s(tokens) <= latency or t == 1


def test_fp4_needs_hardware_or_emulation():
    with pytest.raises(ScenarioError, match="FP4 tensor cores"):
        run_scenario(scenario(methods=[{"name": "fp4", "emulate": False}]))
    emulated = run_scenario(scenario(methods=["fp4"])).summary["methods"]["fp4"]
    assert emulated["breakdown_s"]["dequantize"] > 0
    native = run_scenario(
        scenario(
            methods=[{"name": "fp4", "emulate": False}],
            **{"decode.gpu": {"preset": "a100_80gb", "fp4_tensor_tflops": 1000.0}},
        )
    )
    assert native.summary["methods"]["fp4"]["breakdown_s"]["dequantize"] == 0
    assert emulated["kv_bytes_per_token"]["wire"] == pytest.approx(0.5625 / 2 * 131072)


def test_fp8_priced_by_fp8_hardware():
    s = scenario()
    a100 = gpu_spec(s.decode.gpu)
    h100 = gpu_spec(scenario(**{"decode.gpu": "h100"}).decode.gpu)
    per_byte = lambda g: roofline_profile(g).kernel("decode_attn.fp8").s_per_unit * g.memory_bandwidth_gb_per_s  # noqa: E731
    assert per_byte(a100) > per_byte(h100)  # software FP8 conversion on Ampere costs ALU time
    assert FP8().wire_bytes_per_element() == 1.0


def test_measured_scoring_fits_replace_the_roofline_estimate():
    import dataclasses

    from costmodel.calibration import KernelFit
    from costmodel.phases import ReplicaCostModel

    s = offload_scenario()
    res = resolve(s)
    base = roofline_profile(res.decode.gpu)
    slow = dataclasses.replace(
        base, kernels={**base.kernels, "score.pq": KernelFit(0.0, 1e-9), "score.quantized_keys": KernelFit(0.0, 1e-9)}
    )
    for name in ("pqcache", "hcattention"):
        method = make_method(name)
        costs = [
            ReplicaCostModel(
                model=res.model, gpu=res.decode.gpu, parallel=res.decode.parallel, method=method, profile=prof
            ).iteration(4)
            for prof in (base, slow)
        ]
        assert costs[1].approx_per_ctx_s > 3 * costs[0].approx_per_ctx_s


def test_pqcache_fetches_its_missed_top_k_over_pcie_by_hand():
    """PQCache's fetch per context token and layer on one GPU: the top-k fraction (0.2) it attends, less the
    half its GPU cache holds (cache_hit_rate 0.5), of the token's K and V (2 x 8 KV heads x 128 dims of
    Llama-3.1-8B at TP 1) in FP16, over the GPU's PCIe link (its catalog rate, GB/s as 1e9 bytes/s)."""
    s = offload_scenario(methods=["pqcache"])
    _, dec = resolve(s).costs(s.methods[0])
    env = dec.decode_env()
    assert env.kv_units_per_token == 2 * 8 * 128
    _, per_ctx = dec.method.decode_layer_terms(env)
    want = 0.2 * (1 - 0.5) * 2 * 8 * 128 * 2 / (dec.gpu.pcie_gb_per_s * 1e9)
    assert per_ctx["fetch"] == pytest.approx(want, rel=1e-12, abs=0)
