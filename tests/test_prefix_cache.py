"""Prefix caching: the LRU block cache, shared-prefix workloads, and the prefill of a partly cached prompt."""
from __future__ import annotations

import numpy as np
import pytest

from helpers import scenario
from simulator.prefix_cache import PrefixCache
from simulator.run import resolve
from simulator.workload import make_requests


def test_lookup_hits_the_longest_cached_run_of_leading_blocks():
    c = PrefixCache(capacity_bytes=10.0, block_bytes=1.0, block_tokens=4)
    assert c.lookup([1, 2, 3], 12) == 0
    assert c.insert([1, 2, 3]) == 3 and len(c) == 3
    assert c.lookup([1, 2, 9, 3], 16) == 8            # blocks 1, 2; block 3 follows a miss
    assert c.lookup([1, 2, 3], 12) == 11              # the prompt's last token is always computed
    assert c.lookup([7, 1], 8) == 0
    assert (c.hit_tokens, c.lookup_tokens) == (19, 48)


def test_eviction_is_least_recently_used_tail_first_and_spares_pinned_blocks():
    c = PrefixCache(capacity_bytes=4.0, block_bytes=1.0, block_tokens=1)
    c.insert([1, 2])              # prompt A: head 1 more recent than tail 2
    c.insert([3, 4])              # prompt B
    c.lookup([1, 2], 3)           # A used again: B is now the least recent
    assert c.insert([5]) == 1     # evicts B's tail (4), then nothing more is needed
    assert c.cached_blocks([3, 4]) == 1 and c.cached_blocks([1, 2]) == 2
    c.insert([6, 7], pin=True)    # evicts 3 then 5? no: 3 (least recent), then A's tail 2
    assert c.cached_blocks([6, 7]) == 2 and c.cached_blocks([3]) == 0
    assert c.used_bytes == 4.0 and c.evictable_bytes == 2.0
    # pinned blocks stay: a prompt that needs more room than the unpinned blocks give gets what fits
    assert c.insert([8, 9, 10], pin=True) == 2
    assert c.cached_blocks([8, 9, 10]) == 2 and c.cached_blocks([6, 7]) == 2 and c.evictable_bytes == 0
    c.unpin([6, 7])
    assert c.evictable_bytes == 2.0
    assert c.evict(1.0) == 1.0 and c.cached_blocks([6, 7]) == 1     # the tail went first


def test_insert_within_given_room_and_evict_for_an_owner():
    c = PrefixCache(capacity_bytes=100.0, block_bytes=2.0, block_tokens=16)
    assert c.insert([1, 2, 3], room_bytes=4.0) == 2                   # the owner's pool had room for two
    assert c.evict(3.0) == 4.0 and len(c) == 0


def test_prefix_sharing_workload_gives_each_group_the_same_leading_blocks():
    s = scenario(**{"workload.requests": 200, "workload.input_tokens": {"kind": "uniform", "min_tokens": 100,
                                                                        "max_tokens": 3000},
                    "workload.prefix_sharing": {"groups": 3, "shared_tokens": 1024, "block_tokens": 256}})
    reqs = make_requests(s)
    blocks = reqs.block_hashes
    assert len(blocks) == 200 and reqs.hash_block_tokens == 256
    heads = {}
    for i in range(200):
        p, b = int(reqs.prompt_tokens[i]), blocks[i]
        assert len(b) == -(-p // 256)                                  # one hash per block, the last partial
        shared = min(4, p // 256)
        if shared:
            heads.setdefault(b[0], set()).add(tuple(b[:shared]))
        assert all(h >= 3 * 4 for h in b[shared:])                     # the rest is the request's own
    assert sorted(heads) == [0, 4, 8]                                  # three groups, each its own blocks
    assert all(max(len(x) for x in v) == 4 and all(x == max(v, key=len)[:len(x)] for x in v) for v in heads.values())
    own = [h for i in range(200) for h in blocks[i] if h >= 12]
    assert len(own) == len(set(own))
    # the lengths and arrivals are the ones the workload gives without sharing
    plain = make_requests(scenario(**{"workload.requests": 200, "workload.input_tokens": {
        "kind": "uniform", "min_tokens": 100, "max_tokens": 3000}}))
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
    assert part.encode_s == pytest.approx(layers * pre._encode_layer_s(L - c), rel=1e-12)     # only the new KV
    assert (part.encode_s < full.encode_s) == (method != "baseline")
    assert part.latency_s < 0.4 * full.latency_s
    assert (pre._cached_to_fp16_s(c) == 0) == (method == "baseline")
