"""Decode admission: on-demand KV blocks with preemption (recompute | swap) against reserving the final KV."""

from __future__ import annotations

import math
from types import SimpleNamespace
from unittest import mock

import numpy as np
import pytest

from helpers import scenario
from simulator.admission import OnDemandBlocks, first_block_shortage
from simulator.decode import DecodeReplica, segment_time_s
from simulator.run import BREAKDOWN_PARTS, resolve, run_scenario
from simulator.step_price import iteration_of


def test_first_block_shortage_matches_iteration_by_iteration_allocation():
    """On-demand blocks: the closed form against allocating every running request's blocks iteration by
    iteration until the free blocks run out."""

    rng = np.random.default_rng(11)
    for _ in range(300):
        bt = int(rng.choice([1, 4, 16]))
        k0 = int(rng.integers(0, 500))
        reqs = [(int(rng.integers(0, k0 + 1)), int(rng.integers(1, 5000))) for _ in range(int(rng.integers(0, 40)))]
        free = int(rng.integers(0, 200))
        counts = [0] * bt
        for j, p in reqs:
            counts[(j - p) % bt] += 1
        want, left = math.inf, free
        for k in range(k0, k0 + 100 * bt * (free + 1) + 1):
            left -= sum(1 for j, p in reqs if (p + k - j) % bt == 0)
            if left < 0:
                want = k
                break
            if not reqs:
                break
        assert first_block_shortage(counts, k0, free, bt) == want


def _blocks(block_tokens: int = 4, block_bytes: float = 1000.0) -> OnDemandBlocks:
    """OnDemandBlocks of a replica with no fixed per-request buffer (the blocks' arithmetic alone)."""
    cost = SimpleNamespace(block_tokens=block_tokens, block_bytes=block_bytes, kv_memory_bytes=lambda _t: 0.0)
    return OnDemandBlocks(SimpleNamespace(cost=cost, reserved_bytes=0.0, capacity_bytes=1e9, finish_heap=[]))


def test_a_segment_is_promised_the_blocks_of_its_later_iterations_only():
    """Blocks of 4 tokens. A request that joins at iteration 0 with context 3 takes a new block when its context
    reaches 5, 9, ... (iterations 2, 6, 10, 14: phase 2); one with context 4 at iterations 1, 5, 9, 13 (phase 1).
    Before any segment nothing is promised. A segment of iterations 10..12 is promised the blocks of 11 and 12:
    none (11 and 12 are phases 3 and 0); of 10..14, those of 11..14: one each (13 and 14), 2000 bytes."""
    b = _blocks()
    assert b.planned_bytes == 0.0
    b.join(0, 0, 3, 100)
    b.join(1, 0, 4, 100)
    assert b.counts == [0, 1, 1, 0]
    b.plan(10, 3)
    assert b.planned_bytes == 0.0
    b.plan(10, 5)
    assert b.planned_bytes == 2000.0


def test_a_replica_down_forgets_its_blocks_phases():
    """After clear() (the replica went down) a request joining at 0 with context 1 (phase 0: a new block at 4,
    8, ...) is the only one counted: a segment of 0..2 is promised nothing, of 0..4 one block."""
    b = _blocks()
    b.join(0, 0, 3, 100)
    b.join(1, 0, 4, 100)
    assert b.clear() == [0, 1]
    b.join(2, 0, 1, 100)
    assert b.counts == [1, 0, 0, 0]
    b.plan(0, 3)
    assert b.planned_bytes == 0.0
    b.plan(0, 5)
    assert b.planned_bytes == 1000.0


def _two_requests(tmp_path, preemption: str, outputs=(100, 100), **changes):
    """Two requests prefilled together (256-token prompts, 100 output tokens, FP16 KV of Llama-3.1-8B: 2 MiB
    blocks of 16 tokens) on a decode pool of 40 blocks. Their KV arrives at once: A starts alone, B joins at
    the next boundary (iteration 1); with 16 blocks each at admission, A takes one more at iterations 1, 17,
    33, 49, B at 2, 18, 34, 50, and at 65 A's block does not fit: B, the newest, is preempted."""
    trace = tmp_path / "two.csv"
    trace.write_text("arrival_s,prompt_tokens,output_tokens\n" + "".join(f"0,256,{o}\n" for o in outputs))
    return scenario(
        **{
            "workload": {"trace_csv": str(trace), "arrival": {"kind": "trace"}, "requests": len(outputs)},
            "prefill.max_batch_requests": 2,
            "decode.kv_capacity_gib": 40 * 2 / 1024,
            "decode.preemption": preemption,
            "methods": ["baseline"],
            **changes,
        }
    )


@pytest.mark.parametrize("preemption", ["recompute", "swap"])
def test_two_requests_outgrowing_memory_preempt_the_newest_in_closed_form(tmp_path, preemption):
    """vLLM's rules (simulator/scheduler.py): at 65 B is preempted and put back at the head of the waiting queue;
    no waiting request is scheduled in that step; from 66 B does not fit beside A (20 blocks of 19 free) and
    waits until A finishes (at 100). Swap: B's 20 blocks go to host memory and come back (the batch waits for
    both copies) and B decodes from 100 as planned. Recompute: B's KV is dropped; at 100 it is scheduled as a
    waiting request of its 320 tokens (prompt + 64 outputs), all in one step (chunked prefill off, budget
    16384), whose last token yields its next output; it decodes its last 35 from 101 at context 321."""
    s = _two_requests(tmp_path, preemption)
    r = run_scenario(s, keep_runs=True)
    df = r.requests.sort_values("request_id")
    a, b = df.iloc[0], df.iloc[1]
    assert df["preemptions"].tolist() == [0, 1] and r.summary["methods"]["baseline"]["preemptions"] == 1
    _, dec = resolve(s).costs(s.methods[0])
    it1, it2 = iteration_of(dec.iteration(1)), iteration_of(dec.iteration(2))
    block = dec.block_bytes
    seg0 = segment_time_s(it1, 1, 256, 1, 0)  # iteration 0: A alone
    seg1 = segment_time_s(it2, 64, 256 + 255, 2, 1)  # 1..64: both (context offsets 256 - 0, 256 - 1)
    # at 65 B held ceil(319 / 16) = 20 blocks; A takes one of them, 19 stay free: B (context 320) waits
    swap_out = dec.swap_s(20 * block) if preemption == "swap" else 0.0
    seg2 = swap_out + segment_time_s(it1, 35, 256, 1, 65)  # 65..99: A alone, then A finishes
    if preemption == "swap":
        back = dec.swap_s(20 * block)
        seg3 = segment_time_s(it1, 36, 320 - 100, 1, 100)  # 100..135: B's last 36 iterations
    else:
        L = dec.model.layers
        back = L * (dec._dense_layer_s(320) + dec.prefill_attention_s((320,))[0]) + dec._lm_head_s(1)
        seg3 = segment_time_s(it1, 35, 321 - 101, 1, 101)  # 101..135: B's last 35 iterations
    assert b.decode_start_s - a.decode_start_s == pytest.approx(seg0, rel=1e-12)
    assert a.finish_s - a.decode_start_s == pytest.approx(seg0 + seg1 + seg2, rel=1e-12)
    assert b.finish_s - b.decode_start_s == pytest.approx(seg1 + seg2 + back + seg3, rel=1e-12)
    assert b.preemption_s == pytest.approx(seg2 + back, rel=1e-12)
    assert a.preemption_s == pytest.approx(swap_out, rel=1e-12, abs=1e-15)  # A waited for the swap-out only
    assert b.decode_s == pytest.approx(seg1 + seg3, rel=1e-12)
    for row in (a, b):
        assert sum(row[f"{p}_s"] for p in BREAKDOWN_PARTS) == pytest.approx(row.jct_s, rel=1e-12)
    assert r.memory["used_bytes"].max() == 40 * block  # never more than the 40 blocks
    recomputed = list(r.runs["baseline"].records.recomputed)
    assert recomputed == ([0, 319] if preemption == "recompute" else [0, 0])  # B's KV of 319 tokens, again
    # reserve admits one at a time: the second waits for the first's final KV (2 x 23 blocks > 40)
    res = run_scenario(_two_requests(tmp_path, preemption, **{"decode.admission": "reserve"})).requests
    assert res["preemptions"].sum() == 0 and res["transfer_queue_s"].max() > 0


@pytest.mark.parametrize("preemption", ["recompute", "swap"])
def test_the_router_admits_again_as_soon_as_the_preempted_request_is_back(tmp_path, preemption):
    """The two requests above and a third, C, prefilled next: its KV waits on the prefill host (A and B leave too
    few blocks), and from 65 the router admits nothing while B, preempted, waits to come back (vLLM serves
    preempted requests before new ones). When A finishes, B is back in the batch and the router is told at
    once: C's transfer starts at A's finish, not later at B's."""
    s = _two_requests(tmp_path, preemption, outputs=(100, 100, 50))
    df = run_scenario(s).requests.sort_values("request_id")
    a, b, c = df.iloc[0], df.iloc[1], df.iloc[2]
    assert b.preemptions == 1 and c.prefill_end_s < a.finish_s
    assert c.transfer_start_s == a.finish_s < b.finish_s


def test_a_preempted_request_waits_a_step_then_recomputes_in_chunks(tmp_path):
    """The two requests above with chunk_tokens 16, no prefix cache. At 65 B (320 tokens, 319 computed) is
    preempted; in that step no waiting request is scheduled (vLLM schedules waiting ones only in a step that
    preempted none). From 66 B recomputes 16 tokens a step beside A's row, a block each (19 free, A takes one
    at 81): after 83 it holds 18 blocks (288 tokens) and none is free, so at 84 it cannot grow and, the newest
    running request, preempts itself. From 85 it starts again (A takes its block at 97); A finishes at 99
    with B at 240 tokens; B's last 5 chunks run alone (100..104, the last yielding its token) and its last 35
    decode iterations from 105 at context 321."""
    s = _two_requests(tmp_path, "recompute", **{"decode.chunk_tokens": 16})
    r = run_scenario(s, keep_runs=True)
    df = r.requests.sort_values("request_id")
    a, b = df.iloc[0], df.iloc[1]
    rec = r.runs["baseline"].records
    assert df["preemptions"].tolist() == [0, 2] and list(rec.recomputed) == [0, 319 + 288]
    _, dec = resolve(s).costs(s.methods[0])
    L = dec.model.layers

    def alone(n, past, sample):  # a step of one chunk on an otherwise idle replica (baseline: nothing to encode)
        head = dec._lm_head_s(1) if sample else 0.0
        return L * (dec._dense_layer_s(n) + dec.prefill_attention_s((past + n,), (past,))[0]) + head

    tail = sum(alone(16, past, past == 304) for past in (240, 256, 272, 288, 304))
    tail += segment_time_s(iteration_of(dec.iteration(1)), 35, 321 - 105, 1, 105)
    assert b.finish_s - a.finish_s == pytest.approx(tail, rel=1e-12)


@pytest.mark.parametrize("a_output, hit_blocks", [(100, 17), (80, 19)])
def test_a_preempted_request_recomputes_only_its_blocks_evicted_meanwhile(tmp_path, a_output, hit_blocks):
    """The two requests above with prefix caching in the KV pool's free blocks (vLLM's default). At 65 B frees
    its 20 blocks: its 19 full ones (304 of its 319 computed tokens) stay cached as free blocks, tail first in
    line for eviction. A (100 outputs) takes a block at 81 and at 97 with nothing else free: the cache gives up
    B's last two; at 100 B hits 17 blocks (272 tokens), computes 48 tokens of which 47 again (its 320th is its
    next output's). A with 80 outputs finishes at 80 before needing another block: B hits all 19 and
    recomputes 15."""
    s = _two_requests(tmp_path, "recompute", outputs=(a_output, 100), **{"decode.prefix_caching": True})
    r = run_scenario(s, keep_runs=True)
    df = r.requests.sort_values("request_id")
    a, b = df.iloc[0], df.iloc[1]
    rec = r.runs["baseline"].records
    hit = hit_blocks * 16
    assert list(rec.recomputed) == [0, 319 - hit] and b.preemptions == 1
    _, dec = resolve(s).costs(s.methods[0])
    L = dec.model.layers
    back = L * (dec._dense_layer_s(320 - hit) + dec.prefill_attention_s((320,), (hit,))[0]) + dec._lm_head_s(1)
    resume = a_output  # B comes back as A finishes
    seg3 = segment_time_s(iteration_of(dec.iteration(1)), 35, 321 - (resume + 1), 1, resume + 1)
    assert b.finish_s - a.finish_s == pytest.approx(back + seg3, rel=1e-12)


@pytest.mark.parametrize("method", ["baseline", "hack", "cachegen", "kvquant", "fp8"])
def test_a_lone_request_runs_the_same_under_both_admissions(method):
    s = {"methods": [method]}
    on = run_scenario(scenario(**s)).requests
    off = run_scenario(scenario(**s, **{"decode.admission": "reserve"})).requests
    assert on.drop(columns=[]).equals(off)


PRESSURE = {
    "workload.requests": 300,
    "workload.arrival": {"kind": "poisson", "rate_rps": 2.0},
    "decode.kv_capacity_gib": 6,
    "prefill.max_batch_requests": 8,
    "network.bandwidth_gbps": 100,
    "workload.output_tokens": {"kind": "uniform", "min_tokens": 16, "max_tokens": 1024},
    "workload.input_tokens": {"kind": "uniform", "min_tokens": 256, "max_tokens": 4096},
}


def _max_concurrent(df):
    t = np.concatenate([df["decode_start_s"].to_numpy(), df["finish_s"].to_numpy()])
    d = np.concatenate([np.ones(len(df)), -np.ones(len(df))])
    order = np.lexsort((d, t))
    return int(np.cumsum(d[order]).max())


def test_queueing_sanity_with_room_to_spare_and_under_memory_pressure():
    # a loaded run with memory to spare: on-demand is reserve, request for request
    roomy = {**PRESSURE, "decode.kv_capacity_gib": 50, "methods": ["baseline", "hack"]}
    on = run_scenario(scenario(**roomy)).requests
    off = run_scenario(scenario(**roomy, **{"decode.admission": "reserve"})).requests
    assert on.equals(off) and on["preemptions"].sum() == 0
    # under pressure: everything completes, memory stays within capacity, the breakdown sums to JCT
    for preemption in ("recompute", "swap"):
        r = run_scenario(scenario(**PRESSURE, **{"decode.preemption": preemption, "methods": ["baseline", "hack"]}))
        df = r.requests
        assert r.summary["methods"]["baseline"]["preemptions"] > 0 and len(df) == 600
        assert (r.memory["used_bytes"] <= r.memory["capacity_bytes"] * (1 + 1e-12)).all()
        parts = sum(df[f"{p}_s"] for p in BREAKDOWN_PARTS)
        assert np.allclose(parts, df["jct_s"], rtol=1e-9, atol=1e-9)
        assert (df.loc[df["preemptions"] > 0, "preemption_s"] > 0).all()  # others too wait for a recompute
        assert (df["decode_s"] > 0).all() and (df["preemption_s"] >= 0).all()


def test_on_demand_runs_more_requests_at_once_than_reserve_and_compressed_kv_preempts_less():
    on = run_scenario(scenario(**PRESSURE, methods=["baseline", "hack"]))
    off = run_scenario(scenario(**PRESSURE, methods=["baseline", "hack"], **{"decode.admission": "reserve"}))
    base_on = on.requests[on.requests.method == "baseline"]
    base_off = off.requests[off.requests.method == "baseline"]
    assert _max_concurrent(base_on) > _max_concurrent(base_off)
    assert base_on["transfer_queue_s"].mean() < base_off["transfer_queue_s"].mean()
    pre = {m: v["preemptions"] for m, v in on.summary["methods"].items()}
    assert pre["hack"] < pre["baseline"]


@pytest.mark.parametrize("placement", ["separate", "shared_gpu", "colocated"])
@pytest.mark.parametrize("preemption", ["recompute", "swap"])
def test_under_pressure_a_cache_in_the_kv_pool_holds_only_what_requests_leave_free(placement, preemption):
    """Memory pressure with prefix caching in the KV pool's free blocks (vLLM's default), in each placement:
    requests are preempted and come back, hitting their cached blocks; at every step the requests' blocks
    plus the cache's stay within the pool, every request finishes once, its breakdown adds up, and nothing is
    left reserved or pinned."""
    changes = {
        **PRESSURE,
        "workload.requests": 150,
        "placement": placement,
        "prefill.prefix_caching": True,
        "decode.prefix_caching": True,
        "prefill.chunk_tokens": 1024,
        "decode.chunk_tokens": 1024,
        "decode.preemption": preemption,
        "workload.prefix_sharing": {"groups": 3, "shared_tokens": 1024, "block_tokens": 64},
        "methods": ["baseline"],
    }
    worst = []
    start = DecodeReplica._start_segment

    def checked_start(rep):
        assert rep.cache is not None and rep.cache.in_pool
        worst.append((rep.reserved_bytes + rep.cache.cache.evictable_bytes) / rep.capacity_bytes)
        start(rep)

    with mock.patch.object(DecodeReplica, "_start_segment", checked_start):
        r = run_scenario(scenario(**changes), keep_runs=True)
    m, run = r.summary["methods"]["baseline"], r.runs["baseline"]
    assert max(worst) <= 1 + 1e-12 and max(worst) > 0.99  # the pool filled up, cache included
    assert m["completed"] == 150 and m["preemptions"] > 0 and m["prefix_cache"]["decode"]["hit_tokens"] > 0
    if preemption == "recompute":  # preempted requests come back to part of their blocks
        assert sum(c.resumed_hit_tokens for c in run.prefix.decode) > 0
    df = r.requests
    np.testing.assert_allclose(sum(df[f"{p}_s"] for p in BREAKDOWN_PARTS), df["jct_s"], rtol=1e-9, atol=1e-9)
    for rep in run.decode_replicas:
        assert abs(rep.reserved_bytes) < 1e-3 and rep.slots_used == 0 and rep.cache.cache.pinned_blocks() == 0
