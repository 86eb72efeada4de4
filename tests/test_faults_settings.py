"""Faults wherever the simulator runs: with prefix caching, with placement shared_gpu (a replica down takes
both phases on its GPUs) and placement colocated (a replica runs both phases). Exact single-request
timelines per fault kind, the direction of a lost cache, and conservation under random faults."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from contract import assert_contract, invoke
from helpers import scenario
from reports.data import RunData
from reports.figures import fault_windows
from simulator.config import ScenarioError
from simulator.decode import segment_time_s
from simulator.run import BREAKDOWN_PARTS, resolve, run_scenario
from simulator.step_price import iteration_of

PARTS = [f"{p}_s" for p in BREAKDOWN_PARTS]
SHARED = {"groups": 1, "shared_tokens": 2048, "block_tokens": 512}  # every prompt's first 4 blocks


def trace(tmp_path, rows):
    path = tmp_path / "t.csv"
    path.write_text("arrival_s,prompt_tokens,output_tokens\n" + "".join(f"{t},4096,32\n" for t in rows))
    return {"workload.trace_csv": str(path), "workload.requests": len(rows), "workload.arrival": {"kind": "trace"}}


def run(faults, policy=None, keep=False, **changes):
    s = scenario(
        methods=["baseline"],
        faults=faults,
        **{"decode.admission": "reserve", **({"fault_policy": policy} if policy else {}), **changes},
    )
    result = run_scenario(s, keep_runs=keep)
    rows = result.requests.sort_values("request_id")
    return rows, result.summary["methods"]["baseline"], result


def whole(row) -> None:
    np.testing.assert_allclose(sum(getattr(row, p) for p in PARTS), row.jct_s, rtol=1e-12)


@pytest.fixture(scope="module")
def costs():
    """TINY's baseline: a 4096-token prompt's prefill L (Lc with its first 2048 tokens cached), transfer T (Tc
    without the 2048 tokens a decode cache holds), decode D of 32 iterations from context 4096."""
    s = scenario(methods=["baseline"])
    pre, dec = resolve(s).costs(s.methods[0])
    it = dec.iteration(1)
    n = 32
    wire_per_token = pre.wire_bytes(1) - pre.wire_bytes(0)
    return {
        "L": pre.prefill((4096,)).latency_s,
        "Lc": pre.prefill((4096,), (2048,)).latency_s,
        "T": pre.wire_bytes(4096) * 8 / 10e9,
        "Tc": (pre.wire_bytes(4096) - 2048 * wire_per_token) * 8 / 10e9,
        "D": n * it.fixed_s + it.per_ctx_s * (n * 4096 + n * (n - 1) / 2),
    }


# ---- prefix caching ------------------------------------------------------------------------------------
PREFILL_CACHE = {"prefill.prefix_caching": True, "prefill.prefix_cache_gib": 1, "workload.prefix_sharing": SHARED}
DECODE_CACHE = {"decode.prefix_caching": True, "decode.prefix_cache_gib": 1, "workload.prefix_sharing": SHARED}


def test_prefill_down_loses_the_cache_a_retried_prompt_hit(tmp_path, costs):
    """Request 0 (t=0) leaves its prefix in the prefill cache; request 1 (t=100) hits it and runs Lc, is lost
    halfway, and prefills again when the replica is back: a whole L, as the cache went down with it."""
    L, Lc, T, D = costs["L"], costs["Lc"], costs["T"], costs["D"]
    calm, _, _ = run([], **PREFILL_CACHE, **trace(tmp_path, [0, 100]))
    assert calm.iloc[1].prefill_cached_tokens == 2048
    assert calm.iloc[1].prefill_end_s - calm.iloc[1].prefill_start_s == pytest.approx(Lc, rel=1e-12)
    hit, back = 100 + Lc / 2, 100 + Lc / 2 + 3
    rows, m, result = run(
        [{"kind": "prefill_replica_down", "target": 0, "start_s": hit, "end_s": back}],
        keep=True,
        **PREFILL_CACHE,
        **trace(tmp_path, [0, 100]),
    )
    row = rows.iloc[1]
    assert (row.prefill_start_s, row.prefill_cached_tokens, row.retries) == (pytest.approx(back, rel=1e-12), 0, 1)
    assert row.finish_s == pytest.approx(back + L + T + D, rel=1e-12)
    whole(row)
    # a lookup is a lookup: three of 4096 tokens, one hit of 2048
    assert m["prefix_cache"]["prefill"]["lookup_tokens"] == 3 * 4096
    assert m["prefix_cache"]["prefill"]["hit_tokens"] == 2048
    cache = result.runs["baseline"].prefix.prefill[0]
    assert cache.used_bytes == cache.evictable_bytes == 8 * cache.block_bytes  # every pin was returned


@pytest.mark.parametrize(
    ("policy", "prefill_at"), [("resend", None), ("reprefill", "hit")], ids=["resend", "reprefill"]
)
def test_decode_down_loses_the_cache_a_request_was_sent_against(tmp_path, costs, policy, prefill_at):
    """Request 1 is admitted against the decode cache (Tc on the wire), then its replica goes down during
    decode: sent again when it is back, it finds the cache empty and moves its whole KV (T)."""
    L, Tc, T, D = costs["L"], costs["Tc"], costs["T"], costs["D"]
    calm, _, _ = run([], **DECODE_CACHE, **trace(tmp_path, [0, 100]))
    assert calm.iloc[1].decode_cached_tokens == 2048
    assert calm.iloc[1].finish_s == pytest.approx(100 + L + Tc + D, rel=1e-12)
    hit, back = 100 + L + Tc + D / 2, 100 + L + Tc + D / 2 + 2 * L
    rows, m, _ = run(
        [{"kind": "decode_replica_down", "target": 0, "start_s": hit, "end_s": back}],
        {"on_loss": policy},
        **DECODE_CACHE,
        **trace(tmp_path, [0, 100]),
    )
    row = rows.iloc[1]
    assert row.prefill_start_s == pytest.approx(100 if prefill_at is None else hit, rel=1e-12)
    assert row.transfer_start_s == pytest.approx(back, rel=1e-12) and row.decode_cached_tokens == 0
    assert row.finish_s == pytest.approx(back + T + D, rel=1e-12)
    assert row.retries == 1
    whole(row)
    assert (m["prefix_cache"]["decode"]["lookup_tokens"], m["prefix_cache"]["decode"]["hit_tokens"]) == (
        3 * 4096,
        2048,
    )


@pytest.mark.parametrize("cache_gib", [1, None], ids=["own", "in_pool"])
def test_link_outage_with_a_decode_cache_resends_what_the_cache_lacks(tmp_path, costs, cache_gib):
    """The cache outlives a link: the re-sent request looks up again (counted), hits again, sends Tc. The cache
    in its own memory, or in the KV pool's free blocks (where the cut transfer's reservation also gives back the
    pins of its hits before the lookup again)."""
    L, Tc, D = costs["L"], costs["Tc"], costs["D"]
    cut, back = 100 + L + Tc / 2, 100 + L + Tc / 2 + 5
    rows, m, _ = run(
        [{"kind": "link_outage", "target": "p0", "start_s": cut, "end_s": back}],
        **{**DECODE_CACHE, "decode.prefix_cache_gib": cache_gib},
        **trace(tmp_path, [0, 100]),
    )
    row = rows.iloc[1]
    assert row.transfer_start_s == pytest.approx(back, rel=1e-12) and row.decode_cached_tokens == 2048
    assert row.finish_s == pytest.approx(back + Tc + D, rel=1e-12)
    whole(row)
    assert (m["prefix_cache"]["decode"]["lookup_tokens"], m["prefix_cache"]["decode"]["hit_tokens"]) == (
        3 * 4096,
        2 * 2048,
    )


def test_link_degradation_with_a_decode_cache_slows_the_smaller_transfer(tmp_path, costs):
    L, Tc, D = costs["L"], costs["Tc"], costs["D"]
    t0 = 100 + L
    rows, _, _ = run(
        [{"kind": "link_degradation", "target": "p0", "start_s": t0 + Tc / 4, "end_s": t0 + Tc / 2, "factor": 0.5}],
        **DECODE_CACHE,
        **trace(tmp_path, [0, 100]),
    )
    row = rows.iloc[1]
    assert row.transfer_end_s == pytest.approx(t0 + 9 * Tc / 8, rel=1e-12)
    assert row.finish_s == pytest.approx(t0 + 9 * Tc / 8 + D, rel=1e-12)


def cached_share(rows, column, after_s):
    late = rows[(rows["arrival_s"] >= after_s) & (rows["failure"] == "")]
    return late[column].sum() / late["prompt_tokens"].sum()


@pytest.mark.parametrize(
    ("kind", "cache", "column"),
    [
        ("decode_replica_down", DECODE_CACHE, "decode_cached_tokens"),
        ("prefill_replica_down", PREFILL_CACHE, "prefill_cached_tokens"),
    ],
)
def test_a_replica_down_lowers_the_hit_rate_after_it(kind, cache, column):
    """Eight shared prefixes, one replica per pool: the requests arriving in the minute after the replica
    comes back find less of their prefix cached than the same requests in a run without the fault."""
    load = {
        **cache,
        "workload.prefix_sharing": {"groups": 8, "shared_tokens": 2048, "block_tokens": 512},
        "workload.requests": 300,
        "workload.arrival": {"kind": "poisson", "rate_rps": 2.0},
        "workload.input_tokens": {"kind": "uniform", "min_tokens": 2048, "max_tokens": 4096},
        "workload.output_tokens": {"kind": "fixed", "tokens": 16},
        "prefill.max_batch_requests": 4,
    }
    calm, calm_m, _ = run([], **load)
    rows, m, _ = run([{"kind": kind, "target": 0, "start_s": 60, "end_s": 61}], **load)
    pool = "decode" if kind == "decode_replica_down" else "prefill"
    assert m["prefix_cache"][pool]["hit_rate"] < calm_m["prefix_cache"][pool]["hit_rate"]
    window = (rows["arrival_s"] >= 61) & (rows["arrival_s"] < 75)
    assert window.sum() > 10
    assert rows.loc[window, column].sum() < calm.loc[window, column].sum()


# ---- placement shared_gpu ------------------------------------------------------------------------------
def test_shared_gpu_lone_request_is_the_closed_form(tmp_path, costs):
    rows, _, _ = run([], placement="shared_gpu", **trace(tmp_path, [0]))
    row = rows.iloc[0]
    assert row.finish_s == pytest.approx(costs["L"] + costs["T"] + costs["D"], rel=1e-12)


@pytest.mark.parametrize("kind", ["prefill_replica_down", "decode_replica_down"])
@pytest.mark.parametrize("policy", ["resend", "reprefill"])
def test_shared_gpu_a_replica_down_takes_both_phases_on_its_gpus(tmp_path, costs, kind, policy):
    """Either kind takes pair 0 down: the request decoding there loses its KV, and so does the prefill host
    that could have re-sent it (the same GPUs' host): it prefills again when the pair is back."""
    L, T, D = costs["L"], costs["T"], costs["D"]
    hit, back = L + T + D / 2, L + T + D / 2 + 2 * L
    rows, m, _ = run(
        [{"kind": kind, "target": 0, "start_s": hit, "end_s": back}],
        {"on_loss": policy},
        placement="shared_gpu",
        **trace(tmp_path, [0]),
    )
    row = rows.iloc[0]
    assert row.prefill_start_s == pytest.approx(back, rel=1e-12)
    assert row.finish_s == pytest.approx(back + L + T + D, rel=1e-12)
    assert row.retries == 1 and m["retried"] == 1
    whole(row)


def test_shared_gpu_a_pair_down_during_prefill_moves_to_the_other_pair(tmp_path, costs):
    L, T, D = costs["L"], costs["T"], costs["D"]
    rows, _, _ = run(
        [{"kind": "decode_replica_down", "target": 0, "start_s": L / 2, "end_s": 1e6}],
        placement="shared_gpu",
        **{"prefill.replicas": 2, "decode.replicas": 2},
        **trace(tmp_path, [0]),
    )
    row = rows.iloc[0]
    assert (row.prefill_replica, row.decode_replica, row.retries) == (1, 1, 1)
    assert row.finish_s == pytest.approx(L / 2 + L + T + D, rel=1e-12)


@pytest.mark.parametrize("policy", ["resend", "reprefill"])
def test_shared_gpu_link_faults_are_those_of_separate_pools(tmp_path, costs, policy):
    L, T, D = costs["L"], costs["T"], costs["D"]
    back = L + T / 2 + 5.0
    rows, _, _ = run(
        [
            {"kind": "link_degradation", "target": "p0", "start_s": L, "end_s": L + T / 4, "factor": 0.5},
            {"kind": "link_outage", "target": "p0", "start_s": L + T / 2, "end_s": back},
        ],
        {"on_loss": policy},
        placement="shared_gpu",
        **trace(tmp_path, [0]),
    )
    row = rows.iloc[0]
    assert row.transfer_start_s == pytest.approx(back, rel=1e-12) and row.prefill_start_s == 0
    assert row.finish_s == pytest.approx(back + T + D, rel=1e-12)


# ---- placement colocated -------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def colo():
    """A lone 4096-token prompt on an idle colocated replica of TINY (chunks of 1536): its prefill P (three
    chunk steps) and decode Dc (31 iterations from context 4097)."""
    s = scenario(methods=["baseline"], placement="colocated")
    _, dec = resolve(s).costs(s.methods[0])
    chunks = [
        dec.mixed_step(0, ((n, past),), last) for n, past, last in ((1536, 0, 0), (1536, 1536, 0), (1024, 3072, 1))
    ]
    return sum(it.fixed_s for it, _ in chunks), segment_time_s(iteration_of(dec.iteration(1)), 31, 4097 - 3, 1, 3)


def colocated(tmp_path, faults, policy=None, rows=(0,), **changes):
    chunks = {"prefill.chunk_tokens": 1536, "decode.chunk_tokens": 1536}
    return run(faults, policy, placement="colocated", **{**chunks, **changes}, **trace(tmp_path, rows))


@pytest.mark.parametrize("kind", ["prefill_replica_down", "decode_replica_down"])
def test_colocated_replica_down_during_prefill_moves_the_prompt(tmp_path, colo, kind):
    """TINY colocated has two replicas; the request starts on replica 0, which goes down halfway through its
    chunks: the prompt starts again from its first chunk on replica 1 at that instant."""
    P, Dc = colo
    calm, _, _ = colocated(tmp_path, [])
    assert calm.iloc[0].finish_s == pytest.approx(P + Dc, rel=1e-12) and calm.iloc[0].decode_replica == 0
    rows, m, _ = colocated(tmp_path, [{"kind": kind, "target": 0, "start_s": P / 2, "end_s": P / 2 + 1}])
    row = rows.iloc[0]
    assert (row.prefill_replica, row.decode_replica, row.retries) == (1, 1, 1)
    assert row.prefill_start_s == pytest.approx(P / 2, rel=1e-12)
    assert row.finish_s == pytest.approx(P / 2 + P + Dc, rel=1e-12)
    whole(row)


@pytest.mark.parametrize("policy", ["resend", "reprefill"])
def test_colocated_replica_down_during_decode_prefills_again(tmp_path, colo, policy):
    """Replica 1 (idle) goes down, then replica 0 under the decoding request (one fault each, either kind):
    nothing is kept anywhere, so the request waits and prefills again when replica 1 is back, whatever the
    policy."""
    P, Dc = colo
    hit = P + Dc / 2
    rows, m, _ = colocated(
        tmp_path,
        [
            {"kind": "decode_replica_down", "target": 0, "start_s": hit, "end_s": hit + 7},
            {"kind": "prefill_replica_down", "target": 1, "start_s": P, "end_s": hit + 5},
        ],
        {"on_loss": policy},
    )
    row = rows.iloc[0]
    assert (row.decode_replica, row.retries) == (1, 1)
    assert row.prefill_start_s == pytest.approx(hit + 5, rel=1e-12)
    assert row.finish_s == pytest.approx(hit + 5 + P + Dc, rel=1e-12)
    whole(row)


def test_colocated_fail_stranded_and_queued_prompts(tmp_path, colo):
    P, Dc = colo
    _, m, _ = colocated(
        tmp_path, [{"kind": "decode_replica_down", "target": 0, "start_s": P / 2, "end_s": 9}], {"on_loss": "fail"}
    )
    assert m["failure_reasons"] == {"decode_replica_down": 1}
    down_for_good = [{"kind": "prefill_replica_down", "target": t, "start_s": P / 2, "end_s": math.inf} for t in (0, 1)]
    _, m, _ = colocated(tmp_path, down_for_good)
    assert m["failure_reasons"] == {"stranded": 1} and m["retried"] == 1
    # three prompts at 0: 0 and 2 queue on replica 0, 1 on replica 1, each replica running one request at a time;
    # replica 0 goes down during prompt 0's first chunk: prompt 0 is retried, prompt 2 moves to replica 1
    # unretried, after prompt 0 (arrival order)
    rows, m, _ = colocated(
        tmp_path,
        [{"kind": "decode_replica_down", "target": 0, "start_s": P / 6, "end_s": 1e6}],
        rows=(0, 0, 0),
        **{"decode.max_batch_requests": 1},
    )
    assert rows["decode_replica"].tolist() == [1, 1, 1] and rows["retries"].tolist() == [1, 0, 0]
    assert rows.iloc[0].prefill_start_s < rows.iloc[2].prefill_start_s
    assert (m["completed"], m["failed"]) == (3, 0)


def test_colocated_link_faults_and_unknown_replicas_are_refused():
    outage = {"kind": "link_outage", "target": "p0", "start_s": 0, "end_s": 1}
    with pytest.raises(
        ScenarioError, match=r"^test: scenario: faults\.0\.kind: link_outage: placement colocated has no link"
    ):
        scenario(placement="colocated", faults=[outage])
    down = {"kind": "decode_replica_down", "target": 2, "start_s": 0, "end_s": 1}
    with pytest.raises(ScenarioError, match=r"faults\.0\.target: no colocated replica 2"):
        scenario(placement="colocated", faults=[down])
    scenario(placement="colocated", faults=[{**down, "target": 1}])  # replicas 0, 1: one per pool's replica


def test_a_colocated_link_fault_is_refused_by_the_cli_per_the_contract(tmp_path):
    path = Path(__file__).resolve().parent.parent / "scenarios" / "colocated_vs_disaggregated.yaml"
    out = tmp_path / "out"
    fault = "faults=[{kind: link_degradation, target: p1, start_s: 0, end_s: 1, factor: 0.5}]"
    r = invoke("simulate", path, "--requests", "5", "--set", "placement=colocated", "--set", fault, "--out", out)
    line = assert_contract(r, names=(str(path),), out=out)
    assert line is not None and "faults.0.kind: link_degradation: placement colocated has no link" in line


# ---- conservation ----------------------------------------------------------------------------------------
REPLICA_FAULT = st.builds(
    lambda k, t, s, d: {"kind": k, "target": t, "start_s": s, "end_s": s + d},
    st.sampled_from(["prefill_replica_down", "decode_replica_down"]),
    st.integers(0, 1),
    st.floats(0, 15),
    st.one_of(st.floats(0.01, 10), st.just(math.inf)),
)
LINK_FAULT = st.builds(
    lambda k, t, s, d, f: {
        "kind": k,
        "target": f"p{t}",
        "start_s": s,
        "end_s": s + d,
        **({"factor": f} if k == "link_degradation" else {}),
    },
    st.sampled_from(["link_degradation", "link_outage"]),
    st.integers(0, 1),
    st.floats(0, 15),
    st.floats(0.01, 10),
    st.floats(0.05, 0.95),
)
SETTINGS = {
    "prefix_caching": {
        "prefill.prefix_caching": True,
        "prefill.prefix_cache_gib": 0.5,
        "decode.prefix_caching": True,
        "decode.prefix_cache_gib": 0.5,
        "workload.prefix_sharing": {"groups": 3, "shared_tokens": 1024, "block_tokens": 256},
    },
    "shared_gpu": {"placement": "shared_gpu"},
    "shared_gpu_prefix_caching": {
        "placement": "shared_gpu",
        "prefill.prefix_caching": True,
        "prefill.prefix_cache_gib": 0.5,
        "decode.prefix_caching": True,
        "decode.prefix_cache_gib": 0.5,
        "workload.prefix_sharing": {"groups": 3, "shared_tokens": 1024, "block_tokens": 256},
    },
    "colocated": {"placement": "colocated", "prefill.chunk_tokens": 1024, "decode.chunk_tokens": 1024},
    "colocated_prefix_caching": {
        "placement": "colocated",
        "prefill.chunk_tokens": 1024,
        "decode.chunk_tokens": 1024,
        "prefill.prefix_caching": True,
        "decode.prefix_caching": True,
        "workload.prefix_sharing": {"groups": 3, "shared_tokens": 1024, "block_tokens": 256},
    },
    "separate_prefix_caching_in_kv_pool": {
        "prefill.prefix_caching": True,
        "decode.prefix_caching": True,
        "decode.chunk_tokens": 512,
        "workload.prefix_sharing": {"groups": 3, "shared_tokens": 1024, "block_tokens": 256},
    },
}


@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    setting=st.sampled_from(sorted(SETTINGS)),
    faults=st.lists(st.one_of(REPLICA_FAULT, LINK_FAULT), min_size=1, max_size=6),
    policy=st.sampled_from(["resend", "reprefill", "fail"]),
    retries=st.integers(0, 3),
    stream=st.booleans(),
    admission=st.sampled_from([("reserve", "recompute"), ("on_demand", "recompute"), ("on_demand", "swap")]),
)
def test_every_request_ends_once_in_every_setting(setting, faults, policy, retries, stream, admission):
    """Completed + failed == requests, each request once; memory within capacity; every prefix cache's pins
    returned and its bytes those of its blocks."""
    if setting.startswith("colocated"):
        faults = [f for f in faults if not f["kind"].startswith("link")] or [
            {"kind": "decode_replica_down", "target": 0, "start_s": 5.0, "end_s": 8.0}
        ]
    s = scenario(
        methods=["baseline", "hack"],
        faults=faults,
        fault_policy={"on_loss": policy, "max_retries": retries},
        **SETTINGS[setting],
        **{
            "decode.admission": admission[0],
            "decode.preemption": admission[1],
            "decode.kv_capacity_gib": 2,
            "workload.requests": 30,
            "workload.arrival": {"kind": "poisson", "rate_rps": 2.0},
            "workload.output_tokens": {"kind": "uniform", "min_tokens": 1, "max_tokens": 400},
            "workload.input_tokens": {"kind": "uniform", "min_tokens": 256, "max_tokens": 4096},
            "prefill.replicas": 2,
            "decode.replicas": 2,
            "prefill.max_batch_requests": 4,
            "network.stream_layers": stream,
        },
    )
    result = run_scenario(s, keep_runs=True)
    for name, m in result.summary["methods"].items():
        assert m["completed"] + m["failed"] == 30
        df = result.requests[result.requests["method"] == name]
        assert sorted(df["request_id"]) == list(range(30))
        failed = df["failure"] != ""
        assert failed.sum() == m["failed"] and sum(m["failure_reasons"].values()) == m["failed"]
        assert df.loc[failed, "finish_s"].isna().all() and df.loc[~failed, "finish_s"].notna().all()
        assert (df["retries"] <= retries).all() and (df["retries"] > 0).sum() == m["retried"]
        ok = df[~failed]
        np.testing.assert_allclose(ok[PARTS].sum(axis=1), ok["jct_s"], rtol=1e-9, atol=1e-9)
        assert (ok[PARTS] >= -1e-9).all().all()
        r = result.runs[name]
        for rep in r.decode_replicas:  # every request has ended: nothing is reserved anywhere
            assert abs(rep.reserved_bytes) <= 1e-9 * rep.capacity_bytes and rep.slots_used == 0
        assert max((u for (_, _, u) in r.records.memory_log), default=0) <= r.decode_replicas[0].capacity_bytes * (
            1 + 1e-12
        )
        if r.prefix is not None:
            for pool, caches in (("prefill", r.prefix.prefill), ("decode", r.prefix.decode)):
                for cache in caches:
                    assert cache.pinned_blocks() == 0  # no pin left behind
                    if r.prefix.in_pool[pool]:  # within the free KV pool: everything has ended, all of it
                        assert cache.evictable_bytes <= r.prefix.pool_bytes[pool] * (1 + 1e-12)
                    else:
                        assert cache.used_bytes == cache.evictable_bytes <= cache.capacity_bytes
                    assert cache.hit_tokens <= cache.lookup_tokens


def test_the_report_names_what_a_replica_fault_takes_down(tmp_path):
    faults = [
        {"kind": "decode_replica_down", "target": 1, "start_s": 2, "end_s": 3},
        {"kind": "link_outage", "target": "p0", "start_s": 4, "end_s": 5},
    ]
    labels = {
        placement: [
            w[2] for w in fault_windows(RunData(tmp_path, {}, scenario={"placement": placement, "faults": faults}))
        ]
        for placement in ("separate", "shared_gpu", "colocated")
    }
    assert labels == {
        "separate": ["decode d1 down", "link p0 down"],
        "shared_gpu": ["GPUs of p1 and d1 down", "link p0 down"],
        "colocated": ["replica 1 down", "link p0 down"],
    }


@pytest.mark.parametrize(
    ("placement", "kind"),
    [
        ("shared_gpu", "decode_replica_down"),
        ("shared_gpu", "prefill_replica_down"),
        ("colocated", "prefill_replica_down"),
    ],
)
def test_nothing_runs_on_gpus_while_they_are_down(placement, kind):
    """Under load, the replica a fault takes down does neither phase during the window: no completed
    request's final attempt prefills or decodes there in [start, end), and requests were hit."""
    start, end = 20.0, 40.0
    rows, m, _ = run(
        [{"kind": kind, "target": 0, "start_s": start, "end_s": end}],
        placement=placement,
        **{
            "prefill.replicas": 2,
            "decode.replicas": 2,
            "prefill.max_batch_requests": 4,
            "workload.requests": 200,
            "workload.arrival": {"kind": "poisson", "rate_rps": 3.0},
            "workload.input_tokens": {"kind": "uniform", "min_tokens": 256, "max_tokens": 4096},
            "workload.output_tokens": {"kind": "uniform", "min_tokens": 1, "max_tokens": 400},
        },
    )
    assert m["retried"] > 0 and m["completed"] == 200
    on_prefill = rows[rows["prefill_replica"] == 0]
    assert not ((on_prefill["prefill_start_s"] < end) & (on_prefill["prefill_end_s"] > start)).any()
    on_decode = rows[rows["decode_replica"] == 0]
    assert not ((on_decode["decode_start_s"] < end) & (on_decode["finish_s"] > start)).any()
    assert ((rows["arrival_s"] >= start) & (rows["arrival_s"] < end)).sum() > 30  # the others worked meanwhile


def test_shared_gpu_a_prompt_moved_off_a_pair_is_not_sent_back_to_it(tmp_path, costs):
    """Pair 1 is down at the start, so both prompts queue on pair 0; it is back before pair 0 goes down for
    good. The queued prompt moves to pair 1 and, its layers streamed, is admitted at once: to pair 1's decode
    side, never to the pair going down at that instant (both sides of a pair stop before anything moves)."""
    L = costs["L"]
    rows, m, _ = run(
        [
            {"kind": "prefill_replica_down", "target": 1, "start_s": 0, "end_s": L / 4},
            {"kind": "decode_replica_down", "target": 0, "start_s": L / 2, "end_s": math.inf},
        ],
        {"on_loss": "fail"},
        placement="shared_gpu",
        **{"prefill.replicas": 2, "decode.replicas": 2, "network.stream_layers": True},
        **trace(tmp_path, [0, 0]),
    )
    assert rows["failure"].tolist() == ["decode_replica_down", ""]
    moved = rows.iloc[1]
    assert (moved.prefill_replica, moved.decode_replica, moved.retries) == (1, 1, 0)
    assert moved.prefill_start_s == pytest.approx(L / 2, rel=1e-12)
