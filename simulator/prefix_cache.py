"""A replica's prefix cache: KV blocks kept by the hash of their prompt prefix, evicted least recently used.

This is vLLM's automatic prefix caching (and SGLang's radix cache) at the granularity of a workload's
hash blocks: a Mooncake trace's `hash_ids` (512 tokens each) or `workload.prefix_sharing`'s. Block i of
a prompt is identified by one hash that stands for the whole prefix up to it, so a prompt hits the
longest run of its leading blocks that are cached, and only a prompt's whole blocks are cached (its last,
partial block is its own). Each block holds `block_bytes`: the method's KV for `block_tokens` tokens, so a
compressed format fits more blocks in the same memory.

Where the cache lives (`prefix_cache_gib`):
* In the KV pool's free blocks (the default), as in vLLM (`vllm/v1/core/block_pool.py`,
  `kv_cache_manager.py`, read at commit 00024d31): a block keeps its hash while a request uses it (pinned,
  counted in that request's memory) and after it is freed, in a free queue, until an allocation needs it.
  Freed blocks queue in the order they were freed, each request's tail first (`KVCacheManager.free` frees
  in reverse order, so tail blocks are evicted first), and allocations take the least recently freed. So the
  cache holds at most the pool's free bytes: its owner trims it (`trim`) whenever requests take memory.
  Besides its prompt's hash blocks, a preempted request's own blocks past them (whole blocks of
  `engine_block_tokens`: its prompt's last partial hash block and what it generated) are kept as one run
  under its id, evicted tail first, which only that request hits when it comes back.
* In a separate region of `prefix_cache_gib` per replica taken out of the KV pool (`capacity_bytes`), holding
  prompts' whole hash blocks copied from the requests that computed them; a running prefill pins the blocks it
  uses, and nothing else is kept.

The recency queue is a doubly linked list through the cached blocks' entries (`_Entry`: pins, place), as vLLM's
free block queue is (`FreeKVCacheBlockQueue` in `vllm/v1/core/kv_cache_utils.py`: a hit block leaves the middle
of the queue in O(1)); each hook looks its prompt's blocks up once and works on the entries it found.
tests/test_prefix_cache_lru.py checks the order against the per-block OrderedDict model it replaced.

A block shared by two running requests is counted in each one's memory (vLLM holds it once), so memory is
over-counted, never under, where running requests share a prefix.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import MutableSequence, Sequence
from typing import TYPE_CHECKING, Any

from .decode import Cache

if TYPE_CHECKING:
    from librt.vecs import vec  # pyright: ignore[reportMissingImports]

    from .columns import Records

# A block's hash (a run's key: -(rid + 1)). Any, not int: compiled (simulator/compiled.py), an int is unboxed from
# the hash list and boxed again for every dict operation, a new object for each hash above 256, whose lookup then
# compares by value (callgrind: a third of the cache's instructions); as Any the list's own objects are used.
Hash = Any
_RECENT_LISTS = 4096  # PrefixCaching.blocks_of: hash lists kept (a request's are asked for between its arrival and
# its KV's arrival at decode; ~1 KB each for a 9K-token prompt of 512-token blocks)


def _as_list(hashes: Sequence[Hash]) -> list[Hash]:
    """A prompt's hashes as a list (compiled, a list is indexed directly; any other sequence through calls)."""
    return hashes if isinstance(hashes, list) else list(hashes)


class _Entry:
    """A cached block (or a preempted request's run) and its place in the recency queue: a doubly linked list
    through the entries themselves, so a move is a few pointer writes in compiled code where an OrderedDict's
    `move_to_end` is a call by name and a hash lookup (~350 instructions)."""

    __slots__ = ("key", "run", "pins", "linked", "kept", "start", "tokens", "prev", "next")

    def __init__(self, key: Hash, run: bool) -> None:
        self.key = key
        self.run = run  # a preempted request's own blocks (key -(rid + 1)), not a prompt's hash block
        self.pins = 0  # requests using it (a block)
        self.linked = False  # in the recency queue
        self.kept = False  # not to be evicted now: a block of the prompt being inserted
        self.start = 0  # a run's first token
        self.tokens = 0  # a run's tokens
        self.prev: _Entry | None = None  # the next less recent entry in the queue
        self.next: _Entry | None = None  # the next more recent one


class PrefixCache:
    def __init__(
        self, capacity_bytes: float, block_bytes: float, block_tokens: int, token_bytes: float = 0.0, unit: int = 1
    ):
        self.capacity_bytes = capacity_bytes  # math.inf in the KV pool: its owner trims it (`evict`)
        self.block_bytes = block_bytes
        self.block_tokens = block_tokens
        self.token_bytes = token_bytes  # a run's bytes per token
        self.unit = unit  # runs are evicted in whole engine blocks of this many tokens
        self._blocks: dict[Hash, _Entry] = {}  # cached block -> its entry (pins, place in the queue)
        self._runs: dict[int, _Entry] = {}  # -(rid + 1) -> a request's own blocks (first token, tokens)
        # the recency queue of unpinned blocks and runs, least recent first (vLLM's free block queue)
        self._head: _Entry | None = None
        self._tail: _Entry | None = None
        self._evictable = 0.0  # bytes of the unpinned blocks and runs
        self.lookup_tokens = 0  # prompt tokens looked up (hit rate = hit_tokens / lookup_tokens)
        self.hit_tokens = 0
        self.resumed_hit_tokens = 0  # tokens preempted requests found here when they came back

    def __len__(self) -> int:
        return len(self._blocks)

    def pinned_blocks(self) -> int:
        """Blocks running requests use."""
        queued = 0
        e = self._head
        while e is not None:
            if not e.run:
                queued += 1
            e = e.next
        return len(self._blocks) - queued

    @property
    def used_bytes(self) -> float:
        return len(self._blocks) * self.block_bytes

    @property
    def evictable_bytes(self) -> float:
        return self._evictable

    # ---- the recency queue ----------------------------------------------------------------------
    def _unlink(self, e: _Entry) -> None:
        p, n = e.prev, e.next
        if p is None:
            self._head = n
        else:
            p.next = n
        if n is None:
            self._tail = p
        else:
            n.prev = p
        e.prev = None
        e.next = None
        e.linked = False

    def _append(self, e: _Entry) -> None:
        """`e` (not queued) becomes the most recent."""
        t = self._tail
        e.prev = t
        if t is None:
            self._head = e
        else:
            t.next = e
        self._tail = e
        e.linked = True

    def _to_end(self, e: _Entry) -> None:
        """`e` (queued) becomes the most recent (`_unlink`, then `_append`, written out: the hottest move)."""
        t = self._tail
        if e is t:
            return
        p, n = e.prev, e.next
        if p is None:
            self._head = n
        else:
            p.next = n
        if n is not None:  # not the tail, so it has a next
            n.prev = p
        e.prev = t
        e.next = None
        if t is not None:
            t.next = e
        self._tail = e

    def _requeue(self, found: list[_Entry | None], lo: int, hi: int) -> None:
        """The queued entries of found[lo:hi] become the most recent, found[hi - 1] first and found[lo] last (a
        prompt's head the most recent): `_to_end` of each, written out, the queue's ends kept in locals."""
        head, tail = self._head, self._tail
        for i in range(hi - 1, lo - 1, -1):
            e = found[i]
            if e is None or not e.linked or e is tail:
                continue
            p, n = e.prev, e.next
            if p is None:
                head = n
            else:
                p.next = n
            if n is not None:  # (always: e is queued and not the tail)
                n.prev = p
            e.prev = tail
            e.next = None
            if tail is not None:  # (always, as above)
                tail.next = e
            tail = e
        self._head = head
        self._tail = tail

    def _push_front(self, e: _Entry) -> None:
        """`e` (not queued) becomes the least recent."""
        h = self._head
        e.next = h
        if h is None:
            self._tail = e
        else:
            h.prev = e
        self._head = e
        e.linked = True

    def cached_blocks(self, hashes: Sequence[Hash]) -> int:
        """How many leading blocks of a prompt are cached (no side effects)."""
        blocks = self._blocks
        n = 0
        for h in hashes:
            if h not in blocks:
                break
            n += 1
        return n

    def _leading(self, hs: list[Hash]) -> list[_Entry | None]:
        """The entries of the prompt's leading cached blocks (one lookup a block, reused by the caller)."""
        blocks = self._blocks
        out: list[_Entry | None] = []
        for h in hs:
            e = blocks.get(h)
            if e is None:
                break
            out.append(e)
        return out

    def lookup(self, hashes: Sequence[Hash], prompt_tokens: int) -> int:
        """The prompt's cached prefix in tokens, counted in the hit rate; its blocks become the most recent.
        At least the prompt's last token is always computed (it yields the first output token)."""
        found = self._leading(_as_list(hashes))
        n = len(found)
        self._requeue(found, 0, n)
        hit = min(n * self.block_tokens, prompt_tokens - 1)
        self.lookup_tokens += prompt_tokens
        self.hit_tokens += hit
        return hit

    def lookup_pin(self, hashes: Sequence[Hash], prompt_tokens: int) -> int:
        """`lookup`, then `pin` of the blocks the hit covers, in one pass: the cached blocks the hit leaves out
        become the most recent (the prompt's head last), the others leave the recency queue pinned, where
        lookup's move of them to its end would have been undone."""
        found = self._leading(_as_list(hashes))
        n = len(found)
        bt = self.block_tokens
        hit = min(n * bt, prompt_tokens - 1)
        pinned = -(-hit // bt)
        self._requeue(found, pinned, n)
        b = self.block_bytes
        head, tail = self._head, self._tail
        for i in range(pinned):  # `_pin` of each, `_unlink` written out, the queue's ends in locals
            e = found[i]
            if e is None:  # (none is: found holds the leading cached blocks)
                continue
            if e.pins == 0:
                if e.linked:
                    p, nx = e.prev, e.next
                    if p is None:
                        head = nx
                    else:
                        p.next = nx
                    if nx is None:
                        tail = p
                    else:
                        nx.prev = p
                    e.prev = None
                    e.next = None
                    e.linked = False
                self._evictable -= b
            e.pins += 1
        self._head = head
        self._tail = tail
        self.lookup_tokens += prompt_tokens
        self.hit_tokens += hit
        return hit

    def insert(self, hashes: Sequence[Hash], pin: bool = False, room_bytes: float | None = None) -> int:
        """Cache the prompt's leading blocks that fit (each new block first evicts the least recent unpinned
        ones beyond capacity or beyond `room_bytes` of new bytes); with `pin`, every block inserted or
        already cached is pinned. Returns the number of new blocks, which stop at the first that does not
        fit (a prefix without its head is useless); then every cached one becomes the most recent, the
        prompt's head last."""
        hs = _as_list(hashes)
        blocks = self._blocks
        return self._insert(hs, len(hs), [blocks.get(h) for h in hs], pin, room_bytes)

    def unpin_insert(self, hashes: Sequence[Hash], pinned: int, whole: int) -> int:
        """`unpin(hashes[:pinned])`, then `insert(hashes[:whole])`, with one lookup a block: a prefill done
        with the blocks it hit caches its prompt's whole blocks."""
        hs = _as_list(hashes)
        blocks = self._blocks
        pinned = min(pinned, len(hs))
        whole = min(whole, len(hs))
        found = [blocks.get(hs[i]) for i in range(max(pinned, whole))]
        b = self.block_bytes
        head, tail = self._head, self._tail
        for i in range(pinned - 1, -1, -1):  # `unpin`, `_append` written out, the queue's ends in locals
            e = found[i]
            if e is None:
                continue
            n = e.pins
            e.pins = n - 1
            if n == 1:
                if not e.linked:
                    e.prev = tail
                    if tail is None:
                        head = e
                    else:
                        tail.next = e
                    tail = e
                    e.linked = True
                self._evictable += b
        self._head = head
        self._tail = tail
        return self._insert(hs, whole, found, False, None)

    def _insert(
        self, hs: list[Hash], count: int, found: list[_Entry | None], pin: bool, room_bytes: float | None
    ) -> int:
        """`insert(hs[:count])`, where found[i] is hs[i]'s entry as it was before (None: not cached then). The
        blocks of hs[:count] are never evicted here, so an entry found stays current."""
        blocks, b = self._blocks, self.block_bytes
        added = 0
        room = self.capacity_bytes - self.used_bytes if room_bytes is None else room_bytes
        marked = False  # the prompt's cached blocks are marked kept (where an eviction is needed)
        for i in range(count):
            e = found[i]
            if e is None:
                h = hs[i]
                e = blocks.get(h)  # a block listed twice was inserted at its first place
                if e is None:
                    if b > room:
                        if not marked:  # every cached block of hs[:count] is in found (the rest are not cached)
                            marked = True
                            for j in range(count):
                                f = found[j]
                                if f is not None:
                                    f.kept = True
                        room += self._evict(b - room, None)
                        if b > room:
                            break
                    e = blocks[h] = _Entry(h, False)
                    e.kept = marked
                    self._append(e)
                    self._evictable += b
                    room -= b
                    added += 1
                found[i] = e
            if pin:
                self._pin(e)
        # every cached block of the prompt becomes the most recent, head last. found[i] is None only past the first
        # block that did not fit, where it was not cached, or where its hash is listed again after one inserted
        # here: the move at that first place, later in this loop, decides where it goes.
        self._requeue(found, 0, count)
        if marked:
            for j in range(count):
                f = found[j]
                if f is not None:
                    f.kept = False
        return added

    def unpin(self, hashes: Sequence[Hash]) -> None:
        """A request done with its prefix blocks: the last user returns each to the recency queue, the prompt's
        tail first (its head is the most recent)."""
        hs = _as_list(hashes)
        blocks = self._blocks
        for i in range(len(hs) - 1, -1, -1):
            e = blocks.get(hs[i])
            if e is None:
                continue
            n = e.pins
            e.pins = n - 1
            if n == 1:
                if not e.linked:
                    self._append(e)
                self._evictable += self.block_bytes

    def add_run(self, rid: int, start: int, tokens: int) -> None:
        """A preempted request's own blocks from token `start` on (past its prompt's hash blocks it holds),
        freed as the most recent."""
        key = -(rid + 1)
        self._drop_run(key)
        if tokens <= 0:
            return
        e = self._runs[key] = _Entry(key, True)
        e.start = start
        e.tokens = tokens
        self._append(e)
        self._evictable += tokens * self.token_bytes

    def run(self, rid: int) -> tuple[int, int]:
        """A request's run: (its first token, tokens kept); (0, 0) if none."""
        e = self._runs.get(-(rid + 1))
        return (0, 0) if e is None else (e.start, e.tokens)

    def take_run(self, rid: int) -> None:
        """The request is back: its run leaves the cache (its blocks are its own again)."""
        self._drop_run(-(rid + 1))

    def _drop_run(self, key: int) -> None:
        e = self._runs.pop(key, None)
        if e is not None:
            self._unlink(e)
            self._evictable -= e.tokens * self.token_bytes

    def evict(self, bytes_: float, keep: Sequence[Hash] = ()) -> float:
        """Drop least recent unpinned blocks (and runs, tail first, in whole engine blocks) until at least
        `bytes_` are freed (or none is left, or only blocks of `keep` are); returns the bytes freed."""
        return self._evict(bytes_, set(keep) if keep else None)

    def _evict(self, bytes_: float, keep_set: set[Hash] | None) -> float:
        freed = 0.0
        blocks = self._blocks
        kept: list[_Entry] = []
        while freed < bytes_:
            e = self._head
            if e is None:
                break
            if e.run:  # a run: its tail blocks first
                want = math.ceil((bytes_ - freed) / self.token_bytes / self.unit) * self.unit
                if want < e.tokens:
                    e.tokens -= want
                    freed += want * self.token_bytes
                    self._evictable -= want * self.token_bytes
                    break
                freed += e.tokens * self.token_bytes
                self._drop_run(e.key)
                continue
            self._unlink(e)
            if e.kept or (keep_set is not None and e.key in keep_set):
                kept.append(e)
                continue
            del blocks[e.key]
            freed += self.block_bytes
            self._evictable -= self.block_bytes
        for i in range(len(kept) - 1, -1, -1):
            self._push_front(kept[i])
        return freed

    def clear(self) -> None:
        """The replica went down (simulator/faults.py): every block is gone, pinned or not (its pins were the
        lost requests'); the lookup counters keep what was looked up."""
        e = self._head
        while e is not None:  # unlinked one by one: no reference cycle is left for the collector
            n = e.next
            e.prev = None
            e.next = None
            e.linked = False
            e = n
        self._head = None
        self._tail = None
        self._blocks.clear()
        self._runs.clear()
        self._evictable = 0.0

    def _pin(self, e: _Entry) -> None:
        if e.pins == 0:
            if e.linked:
                self._unlink(e)
            self._evictable -= self.block_bytes
        e.pins += 1

    def touch(self, hashes: Sequence[Hash]) -> None:
        """The blocks become the most recent, the prompt's head last."""
        hs = _as_list(hashes)
        blocks = self._blocks
        for i in range(len(hs) - 1, -1, -1):
            e = blocks.get(hs[i])
            if e is not None and e.linked:
                self._to_end(e)

    def pin(self, hashes: Sequence[Hash]) -> None:
        """Pin cached blocks a running request uses (none of them is evicted until `unpin`)."""
        blocks = self._blocks
        for h in hashes:
            e = blocks.get(h)
            if e is not None:
                self._pin(e)

    @property
    def hit_rate(self) -> float:
        return self.hit_tokens / self.lookup_tokens if self.lookup_tokens else 0.0


class PrefixCaching:
    """One method run's prefix caches: one per replica of each pool that caches (`prefill.prefix_caching`,
    `decode.prefix_caching`; under placement colocated, one per engine, as the decode pool says), in the
    method's memory format, and the per-request cached tokens they gave.

    * Prefill (separate pools): when a prompt starts its prefill, it looks up its replica's cache; its cached
      prefix is not computed (the cost model prices the rest attending to the cached keys, a compressed prefix
      restored to FP16 where the attention form needs it) and stays pinned until its prefill ends, when its
      whole blocks are cached. In the KV pool, the cache holds what the prompts being prefilled leave free.
    * Decode (separate pools): when the router admits a request to a decode replica, its prompt looks up that
      replica's cache; the cached prefix is not transferred (the wire carries the rest). When the KV has
      arrived its whole blocks are cached: in the KV pool they are the request's own, pinned until it finishes
      or is preempted; in a region, copies.
    * Engines (colocated, and a decode replica's preempted requests): a prompt looks up when it is scheduled,
      computes the rest in chunks, and its whole blocks are cached when its prefill ends; a preempted request
      frees its blocks into the cache and, when it is scheduled again, hits what was not evicted meanwhile.
    * Faults: a replica that goes down loses its cache (`replica_down`); a request retried afterwards looks
      up again where it goes next, and the lookup counts in the hit rate like any other.
    The hit rate counts each prompt's first lookup on a replica, not a preempted request's.
    """

    def __init__(
        self,
        records: Records,
        method_name: str,
        reqs,
        pre_cost,
        dec_cost,
        scenario,
        source: str,
        prefill_replicas: int,
        decode_replicas: int,
    ):
        from costmodel.specs import GIB

        from .config import ScenarioError

        self.rec = records
        n = len(reqs)
        self.hashes = reqs.block_hashes if reqs.block_hashes is not None else _NoHashes()
        self._recent: OrderedDict[int, list[Hash]] = OrderedDict()  # rid -> its hash list (blocks_of)
        self.hash_tokens = reqs.hash_block_tokens
        self.prefill_cached = [0] * n  # tokens of each prompt its prefill did not compute
        self.decode_cached = [0] * n  # tokens of each prompt the transfer did not carry
        self.pinned = [0] * n  # leading hash blocks a request pins where the cache is in the KV pool
        self.sent_bytes: MutableSequence[float] | vec[float] = (
            records.wire_bytes
        )  # what each transfer carries (a copy once a decode hit cuts one)
        self._sent_copied = False
        self.prefill: list[PrefixCache] = []
        self.decode: list[PrefixCache] = []
        self.in_pool = {"prefill": False, "decode": False}
        self.pool_bytes = {"prefill": pre_cost.kv_capacity_bytes, "decode": dec_cost.kv_capacity_bytes}
        self.decode_region_bytes = 0.0
        for pool, cost, caches, replicas in (
            ("prefill", pre_cost, self.prefill, prefill_replicas),
            ("decode", dec_cost, self.decode, decode_replicas),
        ):
            cfg = getattr(scenario, pool)
            if not cfg.prefix_caching or not replicas:
                continue
            gib = cfg.prefix_cache_gib
            token_bytes = cost.method.memory_bytes_per_token(cost.model) * cost.kv_replication
            block = self.hash_tokens * token_bytes
            if gib is None:  # in the KV pool's free blocks
                self.in_pool[pool] = True
                caches.extend(
                    PrefixCache(math.inf, block, self.hash_tokens, token_bytes, cost.block_tokens)
                    for _ in range(replicas)
                )
                continue
            if reqs.block_hashes is None:
                raise ScenarioError(
                    f"{source}: {pool}.prefix_cache_gib: the workload has no prefix blocks to keep in a region "
                    f"(give workload.prefix_sharing or a Mooncake trace's hash_ids)"
                )
            cap = gib * GIB
            if cap >= cost.kv_capacity_bytes:
                raise ScenarioError(
                    f"{source}: {pool}.prefix_cache_gib: {gib} GiB is not less than the replica's KV "
                    f"pool ({cost.kv_capacity_bytes / GIB:.2f} GiB, {method_name})"
                )
            caches.extend(PrefixCache(cap, block, self.hash_tokens) for _ in range(replicas))
            if pool == "decode":
                self.decode_region_bytes = cap
        self.wire_per_token = pre_cost.method.wire_bytes_per_token(pre_cost.model)

    def blocks_of(self, rid: int) -> list[Hash]:
        """Request `rid`'s prompt hash blocks. A prefix-sharing workload makes a request's list on demand
        (workload.SharedPrefixBlocks), and a request's hooks ask for it four or five times: the lists of the last
        `_RECENT_LISTS` requests asked about are kept."""
        recent = self._recent
        got = recent.get(rid)
        if got is None:
            got = recent[rid] = _as_list(self.hashes[rid])  # a list: the cache indexes it directly
            if len(recent) > _RECENT_LISTS:
                recent.popitem(last=False)
        return got

    def _whole_blocks(self, rid: int):
        return self.blocks_of(rid)[: self.rec.prompt[rid] // self.hash_tokens]

    def engine(self, replica: int) -> EngineCache | None:
        """Replica `replica`'s cache as its step scheduler and decode rows use it (None: the pool does not cache)."""
        return EngineCache(self, replica) if self.decode else None

    # ---- prefill hooks ------------------------------------------------------------------------
    def prefill_begin(self, replica: int, rid: int) -> int:
        """A prompt starts its prefill: its cached tokens (0 where this pool does not cache), pinned until
        `prefill_end`."""
        if not self.prefill:
            return 0
        hit = self.prefill[replica].lookup_pin(self.blocks_of(rid), self.rec.prompt[rid])
        self.prefill_cached[rid] = hit
        return hit

    def prefill_peek(self, replica: int, rid: int) -> int:
        """The cached tokens a queued prompt would find now (no side effects)."""
        cache = self.prefill[replica]
        hit = cache.cached_blocks(self.blocks_of(rid)) * self.hash_tokens
        return min(hit, self.rec.prompt[rid] - 1)

    def prefill_end(self, replica: int, rid: int, free_bytes: float) -> None:
        """A prompt's prefill ended: its whole blocks are cached (in the KV pool: within the `free_bytes` the
        prompts being prefilled leave)."""
        if not self.prefill:
            return
        cache = self.prefill[replica]
        ht = self.hash_tokens
        cache.unpin_insert(self.blocks_of(rid), -(-self.prefill_cached[rid] // ht), self.rec.prompt[rid] // ht)
        if self.in_pool["prefill"]:
            self.prefill_trim(replica, free_bytes)

    def prefill_trim(self, replica: int, free_bytes: float) -> None:
        """In the KV pool: the cache keeps no more than `free_bytes`."""
        if self.in_pool["prefill"]:
            cache = self.prefill[replica]
            if cache.evictable_bytes > free_bytes:
                cache.evict(cache.evictable_bytes - free_bytes)

    # ---- decode hooks (the router) ----------------------------------------------------------------
    def decode_admit(self, rid: int, replica: int) -> None:
        """A request admitted to a decode replica: its cached prefix there is not sent (in the KV pool: it is
        the request's own from now, pinned)."""
        if not self.decode:
            return
        cache, hashes = self.decode[replica], self.blocks_of(rid)
        if self.in_pool["decode"]:
            hit = cache.lookup_pin(hashes, self.rec.prompt[rid])
            self.pinned[rid] = -(-hit // self.hash_tokens)
        else:
            hit = cache.lookup(hashes, self.rec.prompt[rid])
        if hit or self.decode_cached[rid]:  # a request sent again after a fault may miss where it hit before
            if not self._sent_copied:  # a flag: compiled, a column is a value (`is` would compare two boxes)
                self.sent_bytes = list(self.rec.wire_bytes)
                self._sent_copied = True
            self.decode_cached[rid] = hit
            self.sent_bytes[rid] = self.rec.wire_bytes[rid] - hit * self.wire_per_token

    def decode_arrived(self, rid: int, replica: int) -> None:
        if not self.decode:
            return
        whole = self._whole_blocks(rid)
        if self.in_pool["decode"]:
            self.decode[replica].insert(whole[self.pinned[rid] :], pin=True, room_bytes=math.inf)
            self.pinned[rid] = len(whole)
        else:
            self.decode[replica].insert(whole)

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
                in_pool = self.in_pool[pool]
                out[pool] = {
                    "hit_rate": hit / looked if looked else 0.0,
                    "hit_tokens": int(hit),
                    "lookup_tokens": int(looked),
                    "in_kv_pool": in_pool,
                    "capacity_bytes": float(self.pool_bytes[pool] if in_pool else caches[0].capacity_bytes),
                    "block_bytes": float(caches[0].block_bytes),
                    "cached_blocks_at_end": [len(c) for c in caches],
                }
        return out


class EngineCache(Cache):
    """The prefix cache of one engine replica (a decode replica, or a colocated engine) as its step scheduler
    (simulator/scheduler.py) and its decode rows use it."""

    def __init__(self, caching: PrefixCaching, replica: int):
        self.pc = caching
        self.cache = caching.decode[replica]
        self.in_pool = caching.in_pool["decode"]

    def peek(self, rid: int, tokens: int) -> int:
        """Tokens of a request with `tokens` to compute whose KV is cached here (at most tokens − 1): its
        prompt's leading cached blocks, then a preempted request's run where every block before it hit."""
        pc = self.pc
        hit = self.cache.cached_blocks(pc.blocks_of(rid)) * pc.hash_tokens
        start, run = self.cache.run(rid)
        if run and hit >= start:
            hit = max(hit, start + run)
        return min(hit, tokens - 1)

    def take(self, rid: int, hit: int, count: bool) -> None:
        """The request is scheduled with `hit` tokens cached: its hit blocks become its own (pinned; in a
        region, the most recent), its run leaves the cache; a prompt's first lookup counts in the hit rate."""
        pc, cache = self.pc, self.cache
        hashes = pc.blocks_of(rid)
        blocks = min(-(-hit // pc.hash_tokens), len(hashes))
        if self.in_pool:
            cache.pin(hashes[:blocks])
            pc.pinned[rid] = blocks
            cache.take_run(rid)
        else:
            cache.touch(hashes[:blocks])
        if count:
            cache.lookup_tokens += pc.rec.prompt[rid]
            cache.hit_tokens += hit
            pc.prefill_cached[rid] = hit
        else:
            cache.resumed_hit_tokens += hit

    def computed(self, rid: int, tokens: int) -> None:
        """The request's `tokens` are all computed here: its prompt's whole blocks are cached (in the KV pool,
        pinned as its own)."""
        pc = self.pc
        whole = pc._whole_blocks(rid)
        if self.in_pool:
            self.cache.insert(whole[pc.pinned[rid] :], pin=True, room_bytes=math.inf)
            pc.pinned[rid] = len(whole)
        else:
            self.cache.insert(whole)

    def release(self, rid: int, computed_tokens: int, preempted: bool) -> None:
        """The request frees its blocks (it finished, or was preempted with `computed_tokens` computed): in the
        KV pool they stay cached as free blocks, tail first, a preempted request's own blocks past its prompt's
        hash blocks as its run."""
        if not self.in_pool:
            return
        pc, cache = self.pc, self.cache
        hashes = pc.blocks_of(rid)
        pinned = pc.pinned[rid]
        if preempted:
            # the prompt's whole hash blocks it computed are cached (the ones it hit are pinned already)
            whole = min(computed_tokens, pc.rec.prompt[rid]) // pc.hash_tokens
            if whole > pinned:
                cache.insert(hashes[pinned:whole], pin=True, room_bytes=math.inf)
                pinned = whole
            start = pinned * pc.hash_tokens
            cache.add_run(rid, start, computed_tokens // cache.unit * cache.unit - start)
        cache.unpin(hashes[:pinned])
        pc.pinned[rid] = 0

    def trim(self, free_bytes: float) -> None:
        """In the KV pool: the cache keeps no more than the `free_bytes` requests leave."""
        cache = self.cache
        if self.in_pool and cache.evictable_bytes > free_bytes:
            cache.evict(cache.evictable_bytes - free_bytes)

    def clear(self) -> None:
        self.cache.clear()


class _NoHashes:
    """A workload without prefix blocks: every prompt is its own (nothing is shared between requests)."""

    def __getitem__(self, rid: int) -> tuple:
        return ()
