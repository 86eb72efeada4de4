"""The prefix cache's recency queue (simulator/prefix_cache.py: per-block entries in a linked list, fused
lookups) against a plain reference: the OrderedDict model it replaced, one entry a block, the queue of vLLM's
free blocks (vllm/v1/core/kv_cache_utils.py `FreeKVCacheBlockQueue`: freed blocks appended, allocation from the
head, a hit block taken out of the queue; vllm/v1/core/block_pool.py `BlockPool.free_blocks` appends in the
order given, `KVCacheManager.free` gives a request's blocks tail first; read at commit 00024d31).

Random operation sequences over a small universe of block hashes (so prompts share prefixes, repeat a hash,
fill the cache and evict) must give the same hits, the same return values, the same blocks cached and pinned,
and the same queue in the same order after every operation. Run as Python here; `HACKSIM_PURE_PYTHON= pytest
tests/test_prefix_cache_lru.py` runs it against the compiled module.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from simulator.prefix_cache import PrefixCache

Hash = Any


class ReferenceLRU:
    def __init__(
        self, capacity_bytes: float, block_bytes: float, block_tokens: int, token_bytes: float = 0.0, unit: int = 1
    ):
        self.capacity_bytes = capacity_bytes  # math.inf in the KV pool: its owner trims it (`evict`)
        self.block_bytes = block_bytes
        self.block_tokens = block_tokens
        self.token_bytes = token_bytes  # a run's bytes per token
        self.unit = unit  # runs are evicted in whole engine blocks of this many tokens
        self._pins: dict[Hash, int] = {}  # cached block -> requests using it
        self._lru: OrderedDict[Hash, None] = OrderedDict()  # unpinned blocks and runs, least recent first
        self._runs: dict[int, tuple[int, int]] = {}  # -(rid + 1) -> (first token, tokens) of a request's own blocks
        self._evictable = 0.0  # bytes of the unpinned blocks and runs
        self.lookup_tokens = 0  # prompt tokens looked up (hit rate = hit_tokens / lookup_tokens)
        self.hit_tokens = 0
        self.resumed_hit_tokens = 0  # tokens preempted requests found here when they came back

    def __len__(self) -> int:
        return len(self._pins)

    def pinned_blocks(self) -> int:
        """Blocks running requests use."""
        return len(self._pins) - sum(1 for h in self._lru if h >= 0)

    @property
    def used_bytes(self) -> float:
        return len(self._pins) * self.block_bytes

    @property
    def evictable_bytes(self) -> float:
        return self._evictable

    def cached_blocks(self, hashes: Sequence[Hash]) -> int:
        """How many leading blocks of a prompt are cached (no side effects)."""
        pins = self._pins
        n = 0
        for h in hashes:
            if h not in pins:
                break
            n += 1
        return n

    def lookup(self, hashes: Sequence[Hash], prompt_tokens: int) -> int:
        """The prompt's cached prefix in tokens, counted in the hit rate; its blocks become the most recent.
        At least the prompt's last token is always computed (it yields the first output token)."""
        n = self.cached_blocks(hashes)
        self._touch(hashes[:n])
        hit = min(n * self.block_tokens, prompt_tokens - 1)
        self.lookup_tokens += prompt_tokens
        self.hit_tokens += hit
        return hit

    def lookup_pin(self, hashes: Sequence[Hash], prompt_tokens: int) -> int:
        """`lookup`, then `pin` of the blocks the hit covers, in one pass: the cached blocks the hit leaves out
        become the most recent (the prompt's head last), the others leave the recency queue pinned, where
        lookup's move of them to its end would have been undone."""
        n = self.cached_blocks(hashes)
        bt = self.block_tokens
        hit = min(n * bt, prompt_tokens - 1)
        pinned = -(-hit // bt)
        lru = self._lru
        move_to_end = lru.move_to_end
        for i in range(n - 1, pinned - 1, -1):
            h = hashes[i]
            if h in lru:
                move_to_end(h)
        for i in range(pinned):
            self._pin(hashes[i])
        self.lookup_tokens += prompt_tokens
        self.hit_tokens += hit
        return hit

    def insert(self, hashes: Sequence[Hash], pin: bool = False, room_bytes: float | None = None) -> int:
        """Cache the prompt's leading blocks that fit (each new block first evicts the least recent unpinned
        ones beyond capacity or beyond `room_bytes` of new bytes); with `pin`, every block inserted or
        already cached is pinned. Returns the number of new blocks, which stop at the first that does not
        fit (a prefix without its head is useless)."""
        pins, lru, b = self._pins, self._lru, self.block_bytes
        added = 0
        room = self.capacity_bytes - self.used_bytes if room_bytes is None else room_bytes
        for h in hashes:
            if h in pins:
                if pin:
                    self._pin(h)
                continue
            if b > room:
                freed = self.evict(b - room, keep=hashes)
                room += freed
                if b > room:
                    break
            pins[h] = 0
            lru[h] = None
            self._evictable += b
            room -= b
            added += 1
            if pin:
                self._pin(h)
        self._touch(hashes)
        return added

    def unpin(self, hashes: Sequence[Hash]) -> None:
        """A request done with its prefix blocks: the last user returns each to the recency queue, the prompt's
        tail first (its head is the most recent)."""
        pins, lru = self._pins, self._lru
        for h in reversed(hashes):
            n = pins.get(h)
            if n is None:
                continue
            pins[h] = n - 1
            if n == 1:
                lru[h] = None
                self._evictable += self.block_bytes

    def add_run(self, rid: int, start: int, tokens: int) -> None:
        """A preempted request's own blocks from token `start` on (past its prompt's hash blocks it holds),
        freed as the most recent."""
        key = -(rid + 1)
        self._drop_run(key)
        if tokens <= 0:
            return
        self._runs[key] = (start, tokens)
        self._lru[key] = None
        self._evictable += tokens * self.token_bytes

    def run(self, rid: int) -> tuple[int, int]:
        """A request's run: (its first token, tokens kept); (0, 0) if none."""
        return self._runs.get(-(rid + 1), (0, 0))

    def take_run(self, rid: int) -> None:
        """The request is back: its run leaves the cache (its blocks are its own again)."""
        self._drop_run(-(rid + 1))

    def _drop_run(self, key: int) -> None:
        run = self._runs.pop(key, None)
        if run is not None:
            del self._lru[key]
            self._evictable -= run[1] * self.token_bytes

    def evict(self, bytes_: float, keep: Sequence[Hash] = ()) -> float:
        """Drop least recent unpinned blocks (and runs, tail first, in whole engine blocks) until at least
        `bytes_` are freed (or none is left, or only blocks of `keep` are); returns the bytes freed."""
        freed = 0.0
        lru, pins, runs = self._lru, self._pins, self._runs
        kept: list[object] = []
        keep_set = set(keep) if keep else ()
        while freed < bytes_ and lru:
            h = next(iter(lru))
            if h < 0:  # a run: its tail blocks first
                start, tokens = runs[h]
                want = math.ceil((bytes_ - freed) / self.token_bytes / self.unit) * self.unit
                if want < tokens:
                    runs[h] = (start, tokens - want)
                    freed += want * self.token_bytes
                    self._evictable -= want * self.token_bytes
                    break
                freed += tokens * self.token_bytes
                self._drop_run(h)
                continue
            del lru[h]
            if h in keep_set:
                kept.append(h)
                continue
            del pins[h]
            freed += self.block_bytes
            self._evictable -= self.block_bytes
        for h in reversed(kept):
            lru[h] = None
            lru.move_to_end(h, last=False)
        return freed

    def clear(self) -> None:
        """The replica went down (simulator/faults.py): every block is gone, pinned or not (its pins were the
        lost requests'); the lookup counters keep what was looked up."""
        self._pins.clear()
        self._lru.clear()
        self._runs.clear()
        self._evictable = 0.0

    def _pin(self, h: Hash) -> None:
        n = self._pins[h]
        if n == 0:
            del self._lru[h]
            self._evictable -= self.block_bytes
        self._pins[h] = n + 1

    def touch(self, hashes: Sequence[Hash]) -> None:
        """The blocks become the most recent, the prompt's head last."""
        self._touch(hashes)

    def _touch(self, hashes: Sequence[Hash]) -> None:
        lru = self._lru
        move_to_end = lru.move_to_end  # bound once: a method looked up by name is a slow call from compiled code
        for h in reversed(hashes):
            if h in lru:
                move_to_end(h)

    def pin(self, hashes: Sequence[Hash]) -> None:
        """Pin cached blocks a running request uses (none of them is evicted until `unpin`)."""
        pins = self._pins
        for h in hashes:
            if h in pins:
                self._pin(h)


def queue_of(cache: PrefixCache) -> list:
    """The new structure's recency queue, least recent first, as keys (runs as (key, start, tokens))."""
    out = []
    e = cache._head
    while e is not None:
        out.append((e.key, e.start, e.tokens) if e.run else e.key)
        e = e.next
    return out


def reference_queue(ref: ReferenceLRU) -> list:
    return [(h, *ref._runs[h]) if h < 0 else h for h in ref._lru]


def state(cache) -> tuple:
    probes = [[h] for h in range(UNIVERSE)]
    return (
        len(cache),
        cache.pinned_blocks(),
        cache.used_bytes,
        cache.evictable_bytes,
        [cache.cached_blocks(p) for p in probes],
        [cache.run(rid) for rid in range(RIDS)],
        cache.lookup_tokens,
        cache.hit_tokens,
    )


UNIVERSE = 12
RIDS = 3
hashes = st.one_of(st.lists(st.integers(0, UNIVERSE - 1), max_size=6), st.lists(st.integers(0, 3), max_size=6))
ops = st.lists(
    st.one_of(
        st.tuples(st.just("lookup"), hashes, st.integers(1, 40)),
        st.tuples(st.just("lookup_pin"), hashes, st.integers(1, 40)),
        st.tuples(st.just("insert"), hashes, st.booleans(), st.one_of(st.none(), st.floats(0, 6))),
        st.tuples(st.just("unpin"), st.integers(0, 5)),
        st.tuples(st.just("unpin_insert"), st.integers(0, 5), hashes, st.sampled_from([0, 0, 1, 2, 7])),
        st.tuples(st.just("pin"), hashes),
        st.tuples(st.just("touch"), hashes),
        st.tuples(st.just("add_run"), st.integers(0, RIDS - 1), st.integers(0, 20), st.integers(-2, 30)),
        st.tuples(st.just("take_run"), st.integers(0, RIDS - 1)),
        st.tuples(st.just("evict"), st.floats(0, 8), hashes),
        st.tuples(st.just("clear")),
    ),
    max_size=60,
)


def apply(cache, held: list[tuple[list[Hash], int]], op: tuple) -> object:
    """One operation. A pin is undone only by the request that took it (`held`: a hash list and how many of its
    leading blocks it pinned), as the simulator does; the fused `unpin_insert` is the reference's `unpin`, then
    `insert`."""
    kind = op[0]
    if kind == "lookup":
        return cache.lookup(op[1], op[2])
    if kind == "lookup_pin":
        hit = cache.lookup_pin(op[1], op[2])
        held.append((op[1], -(-hit // cache.block_tokens)))
        return hit
    if kind == "insert":
        if op[2]:  # pinned, as the simulator inserts a request's own blocks: with room for every one
            held.append((op[1], len(op[1])))
            return cache.insert(op[1], pin=True, room_bytes=math.inf)
        return cache.insert(op[1], room_bytes=op[3])
    if kind == "unpin" and held:
        hs, pinned = held.pop(op[1] % len(held))
        cache.unpin(hs[:pinned])
    elif kind == "unpin_insert" and held:
        hs, pinned = held.pop(op[1] % len(held))
        whole = op[3]
        if isinstance(cache, PrefixCache):
            return cache.unpin_insert(hs, pinned, whole)
        cache.unpin(hs[:pinned])
        return cache.insert(hs[:whole])
    elif kind == "pin":
        cache.pin(op[1])
        cached = [h for h in op[1] if cache.cached_blocks([h])]
        held.append((cached, len(cached)))
    elif kind == "touch":
        cache.touch(op[1])
    elif kind == "add_run":
        cache.add_run(op[1], op[2], op[3])
    elif kind == "take_run":
        cache.take_run(op[1])
    elif kind == "evict":
        return cache.evict(op[1], keep=op[2])
    elif kind == "clear":
        cache.clear()
        held.clear()
    return None


@settings(max_examples=1000, deadline=None)
@given(
    st.sampled_from([math.inf, 3.0, 5.0, 8.0]),
    st.integers(1, 4),
    st.integers(1, 4),
    ops,
)
def test_the_linked_queue_gives_the_reference_lrus_hits_evictions_and_order(capacity, block_tokens, unit, seq):
    new = PrefixCache(capacity, 1.0, block_tokens, 0.25, unit)
    ref = ReferenceLRU(capacity, 1.0, block_tokens, 0.25, unit)
    held_new: list = []
    held_ref: list = []
    for op in seq:
        got, want = apply(new, held_new, op), apply(ref, held_ref, op)
        assert got == want, op
        assert queue_of(new) == reference_queue(ref), op
        assert state(new) == state(ref), op
    # and what is left leaves in the same order, one block at a time
    while ref.evictable_bytes > 0:
        assert new.evict(0.25) == ref.evict(0.25)
        assert queue_of(new) == reference_queue(ref)
        assert state(new) == state(ref)


def test_a_prompts_blocks_queue_tail_first_and_a_hit_moves_them_as_the_reference_does():
    """A hand-worked case: prompt [1, 2, 3] inserted queues 3, 2, 1 (its head the most recent); [1, 2, 9] then
    hits 1 and 2 and inserts 9, queueing 3, 9, 2, 1; a 2-block eviction takes 3, then 9."""
    for cache in (PrefixCache(math.inf, 1.0, 4), ReferenceLRU(math.inf, 1.0, 4)):
        cache.insert([1, 2, 3])
        assert cache.lookup([1, 2, 9], 12) == 8
        cache.insert([1, 2, 9])
        assert cache.evict(2.0) == 2.0
        assert cache.cached_blocks([1, 2]) == 2 and cache.cached_blocks([3]) == cache.cached_blocks([9]) == 0
    new = PrefixCache(math.inf, 1.0, 4)
    new.insert([1, 2, 3])
    new.insert([1, 2, 9])
    assert queue_of(new) == [3, 9, 2, 1]
