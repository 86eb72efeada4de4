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
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .columns import Records


class PrefixCache:
    def __init__(self, capacity_bytes: float, block_bytes: float, block_tokens: int):
        self.capacity_bytes = capacity_bytes
        self.block_bytes = block_bytes
        self.block_tokens = block_tokens
        self._pins: dict[int, int] = {}  # cached block -> requests using it
        self._lru: OrderedDict[int, None] = OrderedDict()  # unpinned blocks, least recent first
        self.lookup_tokens = 0  # prompt tokens looked up (hit rate = hit_tokens / lookup_tokens)
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

    def clear(self) -> None:
        """The replica went down (simulator/faults.py): every block is gone, pinned or not (its pins were the
        lost batches'); the lookup counters keep what was looked up."""
        self._pins.clear()
        self._lru.clear()

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

    def pin(self, hashes: Sequence[int]) -> None:
        """Pin cached blocks a running request uses (none of them is evicted until `unpin`)."""
        pins = self._pins
        for h in hashes:
            if h in pins:
                self._pin(h)

    @property
    def hit_rate(self) -> float:
        return self.hit_tokens / self.lookup_tokens if self.lookup_tokens else 0.0


class PrefixCaching:
    """One method run's prefix caches: one per replica of each pool that caches (`prefill.prefix_caching`,
    `decode.prefix_caching`), each of `prefix_cache_gib` in the method's memory format, and the per-request
    cached tokens they gave.

    * Prefill: when a batch starts, each prompt looks up its replica's cache; its cached prefix is not
      computed (the cost model prices L − c rows attending to the c cached keys, a compressed prefix
      restored to FP16 where the attention form needs it) and stays pinned until the batch ends, when the
      prompt's whole blocks are cached.
    * Decode: when the router admits a request to a decode replica, its prompt looks up that replica's
      cache; the cached prefix is copied into the request's own blocks there and is not transferred (the
      wire carries the rest). When the KV has arrived its whole blocks are cached. The cache is a region of
      `prefix_cache_gib` taken out of the decode replica's KV pool; requests reserve their own blocks in the
      rest, as without caching.
    * Faults: a replica that goes down loses its cache (`replica_down`); a request retried afterwards looks
      up again where it goes next, and the lookup counts in the hit rate like any other.
    """

    def __init__(self, records: Records, method_name: str, reqs, pre_cost, dec_cost, scenario, source: str):
        from costmodel.specs import GIB

        from .config import ScenarioError

        self.rec = records
        self.hashes = reqs.block_hashes
        self.hash_tokens = reqs.hash_block_tokens
        n = len(reqs)
        self.prefill_cached = [0] * n  # tokens of each prompt its prefill did not compute
        self.decode_cached = [0] * n  # tokens of each prompt the transfer did not carry
        self.sent_bytes = records.wire_bytes  # what each transfer carries (a copy once a decode hit cuts one)
        self.prefill: list[PrefixCache] = []
        self.decode: list[PrefixCache] = []
        self.decode_region_bytes = 0.0
        for pool, cost, caches in (("prefill", pre_cost, self.prefill), ("decode", dec_cost, self.decode)):
            cfg = getattr(scenario, pool)
            if not cfg.prefix_caching:
                continue
            gib = cfg.prefix_cache_gib
            if self.hashes is None:
                raise ScenarioError(
                    f"{source}: {pool}.prefix_caching: the workload has no prefix blocks (give "
                    f"workload.prefix_sharing or a Mooncake trace's hash_ids)"
                )
            cap = gib * GIB
            if cap >= cost.kv_capacity_bytes:
                raise ScenarioError(
                    f"{source}: {pool}.prefix_cache_gib: {gib} GiB is not less than the replica's KV "
                    f"pool ({cost.kv_capacity_bytes / GIB:.2f} GiB, {method_name})"
                )
            block = self.hash_tokens * cost.method.memory_bytes_per_token(cost.model) * cost.kv_replication
            caches.extend(PrefixCache(cap, block, self.hash_tokens) for _ in range(cfg.replicas))
            if pool == "decode":
                self.decode_region_bytes = cap
        self.wire_per_token = pre_cost.wire_bytes(1) - pre_cost.wire_bytes(0)

    def _whole_blocks(self, rid: int):
        return self.hashes[rid][: self.rec.prompt[rid] // self.hash_tokens]

    # ---- prefill hooks ------------------------------------------------------------------------
    def prefill_start(self, replica: int, batch: list[int]) -> tuple[int, ...] | None:
        """The cached tokens of each prompt of a starting batch (None: this pool does not cache)."""
        if not self.prefill:
            return None
        cache, prompt, out = self.prefill[replica], self.rec.prompt, []
        for rid in batch:
            hashes = self.hashes[rid]
            hit = cache.lookup(hashes, prompt[rid])
            cache.pin(hashes[: -(-hit // self.hash_tokens)])
            self.prefill_cached[rid] = hit
            out.append(hit)
        return tuple(out)

    def prefill_done(self, replica: int, batch: list[int]) -> None:
        if not self.prefill:
            return
        cache = self.prefill[replica]
        for rid in batch:
            cache.unpin(self.hashes[rid][: -(-self.prefill_cached[rid] // self.hash_tokens)])
            cache.insert(self._whole_blocks(rid))

    # ---- decode hooks -------------------------------------------------------------------------
    def decode_admit(self, rid: int, replica: int) -> None:
        """A request admitted to a decode replica: its cached prefix there is not sent."""
        if not self.decode:
            return
        hit = self.decode[replica].lookup(self.hashes[rid], self.rec.prompt[rid])
        if hit or self.decode_cached[rid]:  # a request sent again after a fault may miss where it hit before
            if self.sent_bytes is self.rec.wire_bytes:
                self.sent_bytes = list(self.rec.wire_bytes)
            self.decode_cached[rid] = hit
            self.sent_bytes[rid] = self.rec.wire_bytes[rid] - hit * self.wire_per_token

    def decode_arrived(self, rid: int, replica: int) -> None:
        if self.decode:
            self.decode[replica].insert(self._whole_blocks(rid))

    # ---- faults -------------------------------------------------------------------------------
    def replica_down(self, pool: str, replica: int) -> None:
        """A replica of `pool` went down (simulator/faults.py): its cache is lost with it."""
        caches = self.prefill if pool == "prefill" else self.decode
        if caches:
            caches[replica].clear()

    # ---- results -----------------------------------------------------------------------------
    def summary(self) -> dict:
        """Hit rate per pool: cached prompt tokens / prompt tokens looked up, over the pool's replicas."""
        out = {}
        for pool, caches in (("prefill", self.prefill), ("decode", self.decode)):
            if caches:
                looked = sum(c.lookup_tokens for c in caches)
                hit = sum(c.hit_tokens for c in caches)
                out[pool] = {
                    "hit_rate": hit / looked if looked else 0.0,
                    "hit_tokens": int(hit),
                    "lookup_tokens": int(looked),
                    "capacity_bytes": float(caches[0].capacity_bytes),
                    "block_bytes": float(caches[0].block_bytes),
                    "cached_blocks_at_end": [len(c) for c in caches],
                }
        return out
