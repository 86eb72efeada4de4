"""A replica's prefix cache: KV blocks kept by the hash of their prompt prefix, evicted least recently used.

This is vLLM's automatic prefix caching (and SGLang's radix cache) at the granularity of a workload's
hash blocks: a Mooncake trace's `hash_ids` (512 tokens each) or `workload.prefix_sharing`'s. Block i of
a prompt is identified by one hash that stands for the whole prefix up to it, so a prompt hits the
longest run of its leading blocks that are cached. Each block holds `block_bytes`: the method's KV for
`block_tokens` tokens, so a compressed format fits more blocks in the same capacity.

Blocks a running request uses are pinned (a reference count) and cannot be evicted; unpinned blocks
queue in recency order, and a prompt's blocks are touched tail first, so its head is the most recent
and eviction takes tails before the prefixes they extend (as vLLM frees a finished sequence's blocks).
The cache only keeps the bookkeeping: `evictable_bytes` lets its owner take memory back for requests
(one KV pool shared by requests and cached blocks), `capacity_bytes` bounds what it may hold.
"""
from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence


class PrefixCache:
    def __init__(self, capacity_bytes: float, block_bytes: float, block_tokens: int):
        self.capacity_bytes = capacity_bytes
        self.block_bytes = block_bytes
        self.block_tokens = block_tokens
        self._pins: dict[int, int] = {}                       # cached block -> requests using it
        self._lru: OrderedDict[int, None] = OrderedDict()     # unpinned blocks, least recent first
        self.lookup_tokens = 0        # prompt tokens looked up (hit rate = hit_tokens / lookup_tokens)
        self.hit_tokens = 0

    def __len__(self) -> int:
        return len(self._pins)

    @property
    def used_bytes(self) -> float:
        return len(self._pins) * self.block_bytes

    @property
    def evictable_bytes(self) -> float:
        return len(self._lru) * self.block_bytes

    def cached_blocks(self, hashes: Sequence[int]) -> int:
        """How many leading blocks of a prompt are cached (no side effects)."""
        pins = self._pins
        n = 0
        for h in hashes:
            if h not in pins:
                break
            n += 1
        return n

    def lookup(self, hashes: Sequence[int], prompt_tokens: int) -> int:
        """The prompt's cached prefix in tokens, counted in the hit rate; its blocks become the most recent.
        At least the prompt's last token is always computed (it yields the first output token)."""
        n = self.cached_blocks(hashes)
        self._touch(hashes[:n])
        hit = min(n * self.block_tokens, prompt_tokens - 1)
        self.lookup_tokens += prompt_tokens
        self.hit_tokens += hit
        return hit

    def insert(self, hashes: Sequence[int], pin: bool = False, room_bytes: float | None = None) -> int:
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
            room -= b
            added += 1
            if pin:
                self._pin(h)
        self._touch(hashes)
        return added

    def unpin(self, hashes: Sequence[int]) -> None:
        """A request done with its prefix blocks: the last user returns each to the recency queue."""
        pins, lru = self._pins, self._lru
        for h in reversed(hashes):
            n = pins.get(h)
            if n is None:
                continue
            pins[h] = n - 1
            if n == 1:
                lru[h] = None

    def evict(self, bytes_: float, keep: Sequence[int] = ()) -> float:
        """Drop least recent unpinned blocks until at least `bytes_` are freed (or none is left, or only
        blocks of `keep` are); returns the bytes freed."""
        freed = 0.0
        lru, pins = self._lru, self._pins
        kept = []
        keep_set = set(keep) if keep else ()
        while freed < bytes_ and lru:
            h, _ = lru.popitem(last=False)
            if h in keep_set:
                kept.append(h)
                continue
            del pins[h]
            freed += self.block_bytes
        for h in reversed(kept):
            lru[h] = None
            lru.move_to_end(h, last=False)
        return freed

    def _pin(self, h: int) -> None:
        n = self._pins[h]
        if n == 0:
            del self._lru[h]
        self._pins[h] = n + 1

    def _touch(self, hashes: Sequence[int]) -> None:
        lru = self._lru
        for h in reversed(hashes):
            if h in lru:
                lru.move_to_end(h)
