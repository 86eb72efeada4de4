"""Hypothesis properties of the simulator: completion, memory, monotonicity in bandwidth."""

from __future__ import annotations

from unittest import mock

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from helpers import scenario
from simulator.decode import DecodeReplica
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


engines = st.fixed_dictionaries(
    {
        "workload.requests": st.integers(1, 30),
        "workload.seed": st.integers(0, 10_000),
        "workload.arrival": st.fixed_dictionaries({"kind": st.just("poisson"), "rate_rps": st.floats(0.5, 40.0)}),
        "workload.input_tokens": st.fixed_dictionaries(
            {"kind": st.just("uniform"), "min_tokens": st.integers(1, 600), "max_tokens": st.integers(600, 3000)}
        ),
        "workload.output_tokens": st.fixed_dictionaries(
            {"kind": st.just("uniform"), "min_tokens": st.integers(1, 8), "max_tokens": st.integers(8, 300)}
        ),
        "workload.prefix_sharing": st.one_of(
            st.none(),
            st.fixed_dictionaries(
                {"groups": st.integers(1, 4), "shared_tokens": st.integers(16, 1024), "block_tokens": st.just(64)}
            ),
        ),
        "placement": st.sampled_from(["separate", "shared_gpu", "colocated"]),
        "prefill.replicas": st.integers(1, 2),
        "prefill.max_batch_requests": st.integers(1, 6),
        "decode.replicas": st.integers(1, 2),
        "decode.max_batch_requests": st.integers(1, 24),
        "decode.max_batch_tokens": st.integers(24, 4096),
        "decode.admission": st.sampled_from(["on_demand", "reserve"]),
        "decode.preemption": st.sampled_from(["recompute", "swap"]),
        # from room for a few requests up: preemption, and a cache that lives in what they leave free
        "decode.kv_capacity_gib": st.floats(1.0, 4.0),
        "chunk_tokens": st.one_of(st.none(), st.integers(16, 2048)),
        "caching": st.sampled_from(["off", "kv_pool", "region"]),
        "methods": st.lists(st.sampled_from(["baseline", "hack", "fp8"]), min_size=1, max_size=2, unique=True),
    }
)


def engine_changes(changes: dict) -> dict:
    """An `engines` draw as scenario changes: chunk size and caching mode spread over both pools, a shared GPU's
    decode replicas matching its prefill replicas, a token budget no smaller than the request limit."""
    changes = dict(changes)
    chunk, caching = changes.pop("chunk_tokens"), changes.pop("caching")
    if changes["placement"] == "shared_gpu":
        changes["decode.replicas"] = changes["prefill.replicas"]
    changes["decode.max_batch_tokens"] = max(changes["decode.max_batch_tokens"], changes["decode.max_batch_requests"])
    sharing = changes.pop("workload.prefix_sharing")
    if caching == "region" and sharing is None:
        caching = "off"
    if sharing is not None:
        changes["workload.prefix_sharing"] = sharing
    for pool in ("prefill", "decode"):
        changes[f"{pool}.chunk_tokens"] = chunk
        changes[f"{pool}.prefix_caching"] = caching != "off"
        if caching == "region":
            changes[f"{pool}.prefix_cache_gib"] = 0.25
    return changes


@settings(max_examples=60, deadline=None, derandomize=True, database=None, suppress_health_check=[HealthCheck.too_slow])
@given(engines)
def test_every_engine_setting_finishes_each_request_once_within_memory(changes):
    """vLLM's step scheduler in every placement, with preemption (recompute, swap) and prefix caching (in the KV
    pool's free blocks, or a region): every request finishes exactly once, its breakdown adds up to its JCT,
    requests never hold more than a replica's KV pool, and a cache in the pool never holds more than they leave
    free (checked whenever a replica starts a step); at the end nothing is reserved and no block is pinned."""
    s = scenario(**engine_changes(changes))

    checked = []
    start = DecodeReplica._start_segment

    def checked_start(rep):
        cache = rep.cache
        held = rep.reserved_bytes + (cache.cache.evictable_bytes if cache is not None and cache.in_pool else 0.0)
        assert rep.reserved_bytes <= rep.capacity_bytes * (1 + 1e-12)
        assert held <= rep.capacity_bytes * (1 + 1e-12) + 1e-6
        checked.append(held)
        start(rep)

    with mock.patch.object(DecodeReplica, "_start_segment", checked_start):
        result = run_scenario(s, keep_runs=True)
    assert checked
    n = s.workload.requests
    for name, run in result.runs.items():
        rows = result.requests[result.requests["method"] == name]
        assert run.records.completed == n and sorted(rows["request_id"]) == list(range(n))
        assert (rows["finish_s"] >= rows["arrival_s"]).all()
        np.testing.assert_allclose(rows[PARTS + ["preemption_s"]].sum(axis=1), rows["jct_s"], rtol=1e-9, atol=1e-9)
        assert (rows[PARTS + ["preemption_s"]] >= -1e-9).all().all()
        for rep in run.decode_replicas:
            used = [u for (_, r, u) in run.records.memory_log if r == rep.index]
            assert max(used, default=0.0) <= rep.capacity_bytes * (1 + 1e-12)
            assert abs(rep.reserved_bytes) < 1e-3 and rep.slots_used == 0 and rep.host_reserved_bytes < 1e-3
        if run.prefix is not None:
            for cache in run.prefix.prefill + run.prefix.decode:
                assert cache.pinned_blocks() == 0
