"""Hypothesis properties of the simulator: completion, memory, monotonicity in bandwidth."""

from __future__ import annotations

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from helpers import scenario
from simulator.run import run_scenario

METHODS = ["baseline", "kvquant", "cachegen", "fp8", "hack", "hack_no_se", "hack_no_rqe"]
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

cluster = st.fixed_dictionaries(
    {
        "workload.requests": st.integers(1, 40),
        "workload.seed": st.integers(0, 10_000),
        "workload.arrival": st.fixed_dictionaries(
            {"kind": st.sampled_from(["poisson", "bursty"]), "rate_rps": st.floats(0.2, 50.0)}
        ),
        "workload.input_tokens": st.fixed_dictionaries(
            {"kind": st.just("uniform"), "min_tokens": st.integers(1, 500), "max_tokens": st.integers(500, 6000)}
        ),
        "workload.output_tokens": st.fixed_dictionaries(
            {"kind": st.just("uniform"), "min_tokens": st.integers(1, 4), "max_tokens": st.integers(4, 200)}
        ),
        "prefill.replicas": st.integers(1, 3),
        "prefill.max_batch_requests": st.integers(1, 8),
        "decode.replicas": st.integers(1, 3),
        "decode.max_batch_requests": st.integers(1, 32),
        # From ample decode memory down to room for a couple of requests, so KV gets parked.
        "decode.gpu_memory_utilization": st.floats(0.3, 0.9),
        "network.bandwidth_gbps": st.floats(1.0, 400.0),
        "network.stream_layers": st.booleans(),
        "methods": st.lists(st.sampled_from(METHODS), min_size=1, max_size=2, unique=True),
        "placement": st.sampled_from(["separate", "shared_gpu"]),
    }
)

SETTINGS = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@SETTINGS
@given(cluster)
def test_every_request_completes_exactly_once_within_memory(changes):
    if changes["placement"] == "shared_gpu":
        changes["decode.replicas"] = changes["prefill.replicas"]
    s = scenario(**changes)
    result = run_scenario(s, keep_runs=True)
    df = result.requests
    n = s.workload.requests
    for name, run in result.runs.items():
        rows = df[df["method"] == name]
        assert run.records.completed == n
        assert sorted(rows["request_id"]) == list(range(n))  # once each
        assert rows["finish_s"].notna().all()
        assert (rows["finish_s"] >= rows["arrival_s"]).all()
        np.testing.assert_allclose(rows[PARTS].sum(axis=1), rows["jct_s"], rtol=1e-9, atol=1e-9)
        assert (rows[PARTS] >= -1e-9).all().all()
        for rep in run.decode_replicas:
            used = [u for (_, r, u) in run.records.memory_log if r == rep.index]
            assert max(used, default=0.0) <= rep.capacity_bytes * (1 + 1e-12)
            assert rep.reserved_bytes == 0 or abs(rep.reserved_bytes) < 1e-3  # everything released


@settings(max_examples=40, deadline=None)
@given(
    lo=st.floats(0.5, 100.0),
    factor=st.floats(1.0, 20.0),
    method=st.sampled_from(METHODS),
    prompt=st.integers(1, 8000),
    output=st.integers(1, 64),
    stream=st.booleans(),
)
def test_more_bandwidth_never_raises_a_lone_requests_jct(lo, factor, method, prompt, output, stream):
    def jct(bw):
        s = scenario(
            methods=[method],
            **{
                "network.bandwidth_gbps": bw,
                "network.stream_layers": stream,
                "workload.input_tokens": {"kind": "fixed", "tokens": prompt},
                "workload.output_tokens": {"kind": "fixed", "tokens": output},
            },
        )
        return run_scenario(s).requests["jct_s"].iloc[0]

    assert jct(lo * factor) <= jct(lo) * (1 + 1e-12)
