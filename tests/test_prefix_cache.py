"""Prefix caching: the LRU block cache, shared-prefix workloads, and the prefill of a partly cached prompt."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from helpers import scenario
from simulator.config import ScenarioError
from simulator.load import load_scenario
from simulator.prefix_cache import PrefixCache
from simulator.run import resolve, run_scenario
from simulator.workload import make_requests


def test_lookup_hits_the_longest_cached_run_of_leading_blocks():
    c = PrefixCache(capacity_bytes=10.0, block_bytes=1.0, block_tokens=4)
    assert c.lookup([1, 2, 3], 12) == 0
    assert c.insert([1, 2, 3]) == 3 and len(c) == 3
    assert c.lookup([1, 2, 9, 3], 16) == 8  # blocks 1, 2; block 3 follows a miss
    assert c.lookup([1, 2, 3], 12) == 11  # the prompt's last token is always computed
    assert c.lookup([7, 1], 8) == 0
    assert (c.hit_tokens, c.lookup_tokens) == (19, 48)


def test_eviction_is_least_recently_used_tail_first_and_spares_pinned_blocks():
    c = PrefixCache(capacity_bytes=4.0, block_bytes=1.0, block_tokens=1)
    c.insert([1, 2])  # prompt A: head 1 more recent than tail 2
    c.insert([3, 4])  # prompt B
    c.lookup([1, 2], 3)  # A used again: B is now the least recent
    assert c.insert([5]) == 1  # evicts B's tail (4), then nothing more is needed
    assert c.cached_blocks([3, 4]) == 1 and c.cached_blocks([1, 2]) == 2
    c.insert([6, 7], pin=True)  # evicts 3 then 5? no: 3 (least recent), then A's tail 2
    assert c.cached_blocks([6, 7]) == 2 and c.cached_blocks([3]) == 0
    assert c.used_bytes == 4.0 and c.evictable_bytes == 2.0
    # pinned blocks stay: a prompt that needs more room than the unpinned blocks give gets what fits
    assert c.insert([8, 9, 10], pin=True) == 2
    assert c.cached_blocks([8, 9, 10]) == 2 and c.cached_blocks([6, 7]) == 2 and c.evictable_bytes == 0
    c.unpin([6, 7])
    assert c.evictable_bytes == 2.0
    assert c.evict(1.0) == 1.0 and c.cached_blocks([6, 7]) == 1  # the tail went first


def test_lookup_pin_pins_the_hit_blocks_and_makes_the_rest_most_recent():
    """lookup_pin (a prefill's lookup and pin in one pass): the blocks the hit covers leave the recency queue
    pinned; a cached block past the hit (the prompt's last token is always computed) becomes the most recent."""
    c = PrefixCache(capacity_bytes=5.0, block_bytes=1.0, block_tokens=4)
    c.insert([1, 2, 3])  # queue, least recent first: 3, 2, 1
    c.insert([7, 8])  # 3, 2, 1, 8, 7
    assert c.lookup_pin([1, 2, 3], 9) == 8  # three blocks cached, 8 tokens hit: blocks 1 and 2 pinned
    assert (c.hit_tokens, c.lookup_tokens) == (8, 9)
    assert c.pinned_blocks() == 2 and c.evictable_bytes == 3.0  # 8, 7, 3 queue, 3 the most recent
    assert c.evict(2.0) == 2.0 and c.cached_blocks([3]) == 1 and c.cached_blocks([8]) == c.cached_blocks([7]) == 0
    assert c.evict(10.0) == 1.0 and c.cached_blocks([1, 2, 3]) == 2  # 3 went; pinned 1 and 2 stay
    c.unpin([1, 2])
    assert c.evictable_bytes == 2.0 and c.evict(1.0) == 1.0 and c.cached_blocks([1, 2]) == 1  # the tail first


def test_insert_within_given_room_and_evict_for_an_owner():
    c = PrefixCache(capacity_bytes=100.0, block_bytes=2.0, block_tokens=16)
    assert c.insert([1, 2, 3], room_bytes=4.0) == 2  # the owner's pool had room for two
    assert c.evict(3.0) == 4.0 and len(c) == 0


def test_a_preempted_requests_run_is_evicted_tail_first_in_whole_engine_blocks():
    """A run of 40 tokens at 1 byte each, engine blocks of 4 tokens: 6 bytes wanted take 2 whole blocks off its
    tail (8 tokens: ceil(6 / 1 / 4) x 4), the run keeps its first 32; 40 bytes more take the rest."""
    c = PrefixCache(capacity_bytes=math.inf, block_bytes=16.0, block_tokens=16, token_bytes=1.0, unit=4)
    c.add_run(0, 0, 40)
    assert c.evictable_bytes == 40.0
    assert c.evict(6.0) == 8.0 and c.run(0) == (0, 32) and c.evictable_bytes == 32.0
    assert c.evict(40.0) == 32.0 and c.run(0) == (0, 0) and c.evictable_bytes == 0.0


def test_an_engine_finds_at_most_all_but_the_last_token_cached():
    """vLLM computes at least a request's last token (it yields the next output). Blocks of 16, a 32-token
    prompt whose 2 blocks are cached: 31 of 32 to compute are found cached; with 8 more tokens (a request
    preempted after 8 outputs) 32 of 40. Its own run of those 8 (from token 32) makes 40 of 41 cached, 40 of 40
    capped at 39."""
    from types import SimpleNamespace

    from simulator.prefix_cache import EngineCache

    cache = PrefixCache(capacity_bytes=math.inf, block_bytes=16.0, block_tokens=16, token_bytes=1.0)
    cache.insert([11, 12])
    hashes = {0: [11, 12]}
    engine = EngineCache(
        SimpleNamespace(
            decode=[cache], in_pool={"decode": True}, hashes=hashes, blocks_of=hashes.__getitem__, hash_tokens=16
        ),
        0,
    )
    assert (engine.peek(0, 32), engine.peek(0, 40)) == (31, 32)
    cache.add_run(0, 32, 8)
    assert (engine.peek(0, 41), engine.peek(0, 40)) == (40, 39)


def test_in_the_kv_pool_an_arrived_prompts_blocks_are_its_own_until_it_ends():
    """Decode cache in the KV pool: a request's KV arrives (a 40-token prompt, hash blocks of 16: 2 whole blocks,
    none found cached); its whole blocks enter the cache pinned, as the request's own memory: nothing of them
    can be evicted while it runs, and they are free (evictable) once it releases them."""
    from types import SimpleNamespace

    from simulator.prefix_cache import PrefixCaching

    cache = PrefixCache(capacity_bytes=math.inf, block_bytes=16.0, block_tokens=16, token_bytes=1.0)
    pc = SimpleNamespace(
        decode=[cache], in_pool={"decode": True}, pinned=[0], _whole_blocks=lambda rid: [21, 22, 23][: 40 // 16]
    )
    PrefixCaching.decode_arrived(pc, 0, 0)  # type: ignore[arg-type]
    assert pc.pinned == [2] and cache.pinned_blocks() == 2 and len(cache) == 2
    assert cache.evictable_bytes == 0.0 and cache.evict(1e9) == 0.0 and cache.cached_blocks([21, 22]) == 2
    cache.unpin([21, 22])
    assert cache.evictable_bytes == 32.0


def test_prefix_sharing_workload_gives_each_group_the_same_leading_blocks():
    s = scenario(
        **{
            "workload.requests": 200,
            "workload.input_tokens": {"kind": "uniform", "min_tokens": 100, "max_tokens": 3000},
            "workload.prefix_sharing": {"groups": 3, "shared_tokens": 1024, "block_tokens": 256},
        }
    )
    reqs = make_requests(s)
    blocks = reqs.block_hashes
    assert len(blocks) == 200 and reqs.hash_block_tokens == 256
    heads = {}
    for i in range(200):
        p, b = int(reqs.prompt_tokens[i]), blocks[i]
        assert len(b) == -(-p // 256)  # one hash per block, the last partial
        shared = min(4, p // 256)
        if shared:
            heads.setdefault(b[0], set()).add(tuple(b[:shared]))
        assert all(h >= 3 * 4 for h in b[shared:])  # the rest is the request's own
    assert sorted(heads) == [0, 4, 8]  # three groups, each its own blocks
    assert all(max(len(x) for x in v) == 4 and all(x == max(v, key=len)[: len(x)] for x in v) for v in heads.values())
    own = [h for i in range(200) for h in blocks[i] if h >= 12]
    assert len(own) == len(set(own))
    # the lengths and arrivals are the ones the workload gives without sharing
    plain = make_requests(
        scenario(
            **{
                "workload.requests": 200,
                "workload.input_tokens": {"kind": "uniform", "min_tokens": 100, "max_tokens": 3000},
            }
        )
    )
    assert np.array_equal(plain.prompt_tokens, reqs.prompt_tokens) and np.array_equal(plain.arrival_s, reqs.arrival_s)


@pytest.mark.parametrize("method", ["baseline", "fp8", "kvquant", "hack"])
def test_prefill_of_a_cached_prefix_computes_the_rest_against_it(method):
    """L tokens of which c are cached: GEMMs on L − c rows, (L − c)·c + (L − c)(L − c + 1)/2 query-key
    pairs, the new KV encoded, and a compressed prefix restored to FP16 for FP16 attention."""
    s = scenario(methods=[method])
    pre, _ = resolve(s).costs(s.methods[0])
    L, c = 4096, 3072
    full, part = pre.prefill((L,)), pre.prefill((L,), (c,))
    assert pre.prefill((L,), (0,)) == full
    layers, p, m = pre.model.layers, pre.profile, pre.model
    flops_per_pair = 4.0 * pre.q_heads_per_gpu * m.head_dim
    pairs = (L - c) * c + (L - c) * (L - c + 1) / 2
    attn = p.kernel("prefill_attn.fp16").time_s(flops_per_pair * pairs) + pre._cached_to_fp16_s(c)
    want = layers * (pre._dense_layer_s(L - c) + attn) + pre._lm_head_s(1)
    assert part.latency_s == pytest.approx(want, rel=1e-12)
    assert part.encode_s == pytest.approx(layers * pre._encode_layer_s(L - c), rel=1e-12)  # only the new KV
    assert (part.encode_s < full.encode_s) == (method != "baseline")
    assert part.latency_s < 0.4 * full.latency_s
    assert (pre._cached_to_fp16_s(c) == 0) == (method == "baseline")


# ---- prefix caching in the simulator ---------------------------------------------------------
CACHED = {
    "prefill.prefix_caching": True,
    "prefill.prefix_cache_gib": 2,
    "decode.prefix_caching": True,
    "decode.prefix_cache_gib": 2,
}


def test_a_request_after_its_group_computes_and_sends_only_the_uncached_rest():
    """Closed form: two lone requests of one group (4096-token prompts, 3072 shared = 6 hash blocks); the
    second's prefill is the cost model's for 1024 new tokens against 3072 cached ones and its transfer
    carries the KV of those 1024 tokens only."""
    for method in ("baseline", "hack"):
        s = scenario(
            **CACHED,
            **{
                "workload.requests": 2,
                "methods": [method],
                "workload.prefix_sharing": {"groups": 1, "shared_tokens": 3072},
            },
        )
        r = run_scenario(s)
        df = r.requests
        pre, _ = resolve(s).costs(s.methods[0])
        assert df["prefill_cached_tokens"].tolist() == [0, 3072] and df["decode_cached_tokens"].tolist() == [0, 3072]
        first, second = df.iloc[0], df.iloc[1]
        assert first["prefill_end_s"] - first["prefill_start_s"] == pytest.approx(
            pre.prefill((4096,)).latency_s, rel=1e-12
        )
        assert second["prefill_end_s"] - second["prefill_start_s"] == pytest.approx(
            pre.prefill((4096,), (3072,)).latency_s, rel=1e-12
        )
        sent = pre.wire_bytes(4096) - 3072 * pre.method.wire_bytes_per_token(pre.model)
        assert second["transfer_s"] == pytest.approx(sent / (10e9 / 8), rel=1e-9)
        assert first["transfer_s"] == pytest.approx(pre.wire_bytes(4096) / (10e9 / 8), rel=1e-9)
        pc = r.summary["methods"][method]["prefix_cache"]
        assert pc["prefill"]["hit_rate"] == pytest.approx(3072 / 8192) == pc["decode"]["hit_rate"]
        assert pc["prefill"]["block_bytes"] == pytest.approx(512 * pre.method.memory_bytes_per_token(pre.model))


def test_md1_queueing_delay_at_a_fully_cached_prefill():
    """Poisson arrivals, one prefill server whose every prompt after the first is cached but for its last
    token (deterministic service): mean wait = ρD / (2(1-ρ))."""
    fixed = {
        "workload.output_tokens": {"kind": "fixed", "tokens": 2},
        "network.bandwidth_gbps": 400,
        "workload.prefix_sharing": {"groups": 1, "shared_tokens": 4096},
        "methods": ["baseline"],
    }
    base = scenario(**CACHED, **fixed)
    service_s = resolve(base).costs(base.methods[0])[0].prefill((4096,), (4095,)).stage_s
    rho = 0.5
    s = scenario(
        **CACHED,
        **fixed,
        **{"workload.requests": 20000, "workload.arrival": {"kind": "poisson", "rate_rps": rho / service_s}},
    )
    df = run_scenario(s).requests
    assert (df["prefill_cached_tokens"].iloc[1:] == 4095).all()
    assert df["prefill_queue_s"].iloc[1:].mean() == pytest.approx(rho * service_s / (2 * (1 - rho)), rel=0.07)


def test_prefix_caching_lowers_prefill_and_transfer_and_a_compressed_cache_hits_more():
    s = load_scenario("scenarios/prefix_caching.yaml", ["workload.requests=150"])
    on = run_scenario(s).summary["methods"]
    off = run_scenario(
        load_scenario(
            "scenarios/prefix_caching.yaml",
            ["workload.requests=150", "prefill.prefix_caching=false", "decode.prefix_caching=false"],
        )
    ).summary["methods"]
    for m in on:
        assert on[m]["breakdown_s"]["prefill"] < off[m]["breakdown_s"]["prefill"]
        assert on[m]["breakdown_s"]["transfer"] < off[m]["breakdown_s"]["transfer"]
        assert "prefix_cache" not in off[m]
    rate = {m: on[m]["prefix_cache"]["prefill"]["hit_rate"] for m in on}
    # the same 8 GiB hold 8 of the 32 documents in FP16, 16 in FP8, all of them at 2 bits
    assert rate["baseline"] < rate["fp8"] < rate["hack"]
    assert rate["hack"] > 2 * rate["baseline"]


def test_mooncake_hash_ids_feed_the_cache(tmp_path):
    rows = [
        {"timestamp": 0, "input_length": 1500, "output_length": 4, "hash_ids": [1, 2, 3]},
        {"timestamp": 60000, "input_length": 1200, "output_length": 4, "hash_ids": [1, 2, 9]},
        {"timestamp": 120000, "input_length": 1100, "output_length": 4, "hash_ids": [5, 2, 3]},
    ]
    (tmp_path / "m.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    s = scenario(
        **CACHED,
        **{
            "workload": {"trace": {"format": "mooncake", "path": str(tmp_path / "m.jsonl")}, "requests": 3},
            "methods": ["hack"],
        },
    )
    df = run_scenario(s).requests
    assert df["prefill_cached_tokens"].tolist() == [0, 1024, 0]  # blocks 1, 2 (whole blocks only cached)


def _trace(tmp_path, rows):
    """A Mooncake trace of (timestamp ms, prompt tokens, hash ids), 4 output tokens each."""
    path = tmp_path / "m.jsonl"
    path.write_text(
        "".join(
            json.dumps({"timestamp": t, "input_length": n, "output_length": 4, "hash_ids": h}) + "\n"
            for t, n, h in rows
        )
    )
    return {"workload": {"trace": {"format": "mooncake", "path": str(path)}, "requests": len(rows)}}


@pytest.mark.parametrize("where", ["region", "kv_pool"])
def test_a_prompts_partial_last_block_is_not_cached(tmp_path, where):
    """A 1500-token prompt has two whole 512-token blocks and a partial third: only the two are cached, so a
    later prompt with the same three leading hashes and more hits 1024 tokens, on both pools."""
    cache = CACHED if where == "region" else {"prefill.prefix_caching": True, "decode.prefix_caching": True}
    s = scenario(
        **cache,
        **_trace(tmp_path, [(0, 1500, [1, 2, 3]), (60000, 2000, [1, 2, 3, 4])]),
        methods=["baseline"],
    )
    df = run_scenario(s).requests
    assert df["prefill_cached_tokens"].tolist() == [0, 1024]
    assert df["decode_cached_tokens"].tolist() == [0, 1024]


def test_a_region_is_sized_in_gib(tmp_path):
    """prefix_cache_gib is 2^30 bytes: a region of 4.12 blocks' worth of GiB holds 4 blocks (4.12 / 1.0737 GB
    would hold 3): five prompts of distinct single blocks leave the last four cached."""
    s0 = scenario(methods=["baseline"])
    pre, _ = resolve(s0).costs(s0.methods[0])
    block = 512 * pre.method.memory_bytes_per_token(pre.model)
    gib = 4.12 * block / 2**30
    rows = [(60000 * i, 600, [10 + i]) for i in range(5)]
    s = scenario(
        **{**CACHED, "prefill.prefix_cache_gib": gib, "decode.prefix_cache_gib": gib},
        **_trace(tmp_path, rows),
        methods=["baseline"],
    )
    pc = run_scenario(s).summary["methods"]["baseline"]["prefix_cache"]
    for pool in ("prefill", "decode"):
        assert pc[pool]["capacity_bytes"] == gib * 2**30 and not pc[pool]["in_kv_pool"]
        assert pc[pool]["cached_blocks_at_end"] == [4]


def test_in_the_kv_pool_the_cache_holds_what_requests_leave_free(tmp_path):
    """Without prefix_cache_gib the cache lives in the KV pool's free blocks: a decode replica's lookups hit
    whatever a finished request's blocks left there (nothing is taken out of the pool for it), and
    requests take evictable blocks back as they need them."""
    s = scenario(
        **{"prefill.prefix_caching": True, "decode.prefix_caching": True},
        **{
            "workload.requests": 2,
            "methods": ["baseline"],
            "workload.prefix_sharing": {"groups": 1, "shared_tokens": 3072},
        },
    )
    r = run_scenario(s, keep_runs=True)
    df = r.requests
    assert df["prefill_cached_tokens"].tolist() == [0, 3072] and df["decode_cached_tokens"].tolist() == [0, 3072]
    run = r.runs["baseline"]
    dec = run.decode_replicas[0]
    assert dec.capacity_bytes == run.dec_cost.kv_capacity_bytes  # no region taken out
    pc = r.summary["methods"]["baseline"]["prefix_cache"]["decode"]
    assert pc["in_kv_pool"] and pc["capacity_bytes"] == run.dec_cost.kv_capacity_bytes
    # both prompts' whole blocks (8 per 4096 tokens, 6 shared) are cached as free blocks
    assert pc["cached_blocks_at_end"] == [10]


def test_colocated_engines_cache_prefixes_too(tmp_path):
    """placement colocated with prefix caching: the second prompt of a group computes only its uncached rest
    (its first step is 1024 new tokens against 3072 cached)."""
    s = scenario(
        **{
            "placement": "colocated",
            "prefill": None,
            "decode.prefix_caching": True,
            "workload.requests": 2,
            "workload.arrival": {"kind": "poisson", "rate_rps": 0.001},
            "methods": ["hack"],
            "workload.prefix_sharing": {"groups": 1, "shared_tokens": 3072},
        }
    )
    df = run_scenario(s).requests
    _, dec = resolve(s).costs(s.methods[0])
    assert df["prefill_cached_tokens"].tolist() == [0, 3072]
    it, _ = dec.mixed_step(0, ((1024, 3072),), 1)
    second = df.iloc[1]
    assert second.prefill_end_s - second.prefill_start_s == pytest.approx(it.fixed_s, rel=1e-12)


@pytest.mark.parametrize(
    "changes, message",
    [
        (
            {"prefill.prefix_caching": True, "prefill.prefix_cache_gib": 1},
            "prefill.prefix_cache_gib: the workload has no prefix blocks",
        ),
        (
            {**CACHED, "workload.prefix_sharing": {"groups": 2, "shared_tokens": 512}, "decode.prefix_cache_gib": 1000},
            "decode.prefix_cache_gib: 1000",
        ),
    ],
)
def test_bad_prefix_caching_settings_name_the_field(changes, message):
    with pytest.raises(ScenarioError, match=message):
        s = scenario(**changes, methods=["baseline"])
        run_scenario(s)


def test_a_prefill_batch_counts_only_the_uncached_tokens_against_its_budget(tmp_path):
    """Prefill cache of 1 GiB, every prompt's first 2048 tokens shared: request 0 (t = 0) leaves them cached;
    requests 1 and 2 (4096 tokens, t = 100) each compute 4096 - 2048 = 2048 new tokens, 4096 together, which fit
    a 4096-token step: one batch, both starting at 100 and ending together."""
    path = tmp_path / "t.csv"
    path.write_text("arrival_s,prompt_tokens,output_tokens\n0,4096,32\n100,4096,32\n100,4096,32\n")
    s = scenario(
        methods=["baseline"],
        **{
            "prefill.prefix_caching": True,
            "prefill.prefix_cache_gib": 1,
            "prefill.max_batch_tokens": 4096,
            "prefill.max_batch_requests": 2,
            "workload.prefix_sharing": {"groups": 1, "shared_tokens": 2048, "block_tokens": 512},
            "workload.trace_csv": str(path),
            "workload.requests": 3,
            "workload.arrival": {"kind": "trace"},
        },
    )
    rows = run_scenario(s).requests.sort_values("request_id")
    assert rows["prefill_cached_tokens"].tolist() == [0, 2048, 2048]
    assert rows["prefill_start_s"].tolist()[1:] == [100.0, 100.0]
    assert rows["prefill_end_s"].iloc[1] == rows["prefill_end_s"].iloc[2]
