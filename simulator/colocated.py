"""Colocated serving (`placement: colocated`): every GPU serves both phases, with chunked prefill.

Each replica is a decode replica (simulator/decode.py) that also holds a queue of prompts. While a prompt
is being prefilled, every iteration is a mixed one: the running decode rows plus one chunk of at most
`prefill.chunk_tokens` of that prompt's tokens, attending to its earlier chunks, in one forward pass
(`ReplicaCostModel.mixed_iteration`: the dense layers see B + n rows, the chunk's KV is encoded in the
method's format, its last chunk yields the first token). One prompt is prefilled at a time, in arrival
order; between prompts the decode batch advances in closed form as on a decode replica, so events are
one per chunk and one per batch change, none per token.

There is no transfer: the prompt's KV is written in the replica's own format where it is read. A prompt
starts once its replica can admit it (the decode admission: on demand, the blocks of its prompt and first
token; reserve, its final KV), and it joins the decode batch at the end of its last chunk, whose token is
the client's first, so decode runs one iteration per further output token. The router sends each arrival to
the replica with the fewest queued prompt tokens. The replicas are the GPUs of both pools:
`prefill.replicas + decode.replicas` of them, each configured as the decode pool (both pools must name the
same GPU and parallelism).

A replica that goes down (simulator/faults.py) loses its decode requests and the prompt it was prefilling
(the chunks done so far with it); its queued prompts move to the live replicas, and arrivals wait while
none is up.
"""

from __future__ import annotations

from collections import deque
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .columns import Records
    from .decode import DecodeReplica


class ChunkedPrefill:
    """The prompt queue of one colocated replica and the chunk in progress."""

    def __init__(self, replica: DecodeReplica, records: Records, chunk_tokens: int):
        self.rep = replica
        self.rec = records
        self.chunk_tokens = chunk_tokens
        self.queue: deque[int] = deque()
        self.outstanding_tokens = 0
        self.current: int | None = None  # the prompt being prefilled
        self.done_tokens = 0
        self.chunk: tuple | None = None  # the chunk of the running iteration: (tokens, PrefillCost)
        self.busy_s = 0.0  # Σ the chunks' share of the replica's time
        self._memo: dict = {}

    def enqueue(self, rid: int) -> None:
        self.queue.append(rid)
        self.outstanding_tokens += self.rec.prompt[rid]
        self.rep.wake()

    def next_chunk(self):
        """At an iteration boundary: the mixed iteration's cost if a chunk runs in it, else None."""
        rep, rec = self.rep, self.rec
        if self.current is None:
            if not self.queue:
                return None
            rid = self.queue[0]
            if not rep.has_room(rec.admit_bytes[rid], rec.host_kv_bytes[rid]):
                return None
            self.queue.popleft()
            rep.reserve(rec.admit_bytes[rid], rec.host_kv_bytes[rid])
            self.current, self.done_tokens = rid, 0
            rec.prefill_start[rid] = rep.env.now
            rec.prefill_replica[rid] = rec.decode_replica[rid] = rep.index
            rec.approx_prefill[rid] = 0.0
        rid = self.current
        prompt = rec.prompt[rid]
        n = min(self.chunk_tokens, prompt - self.done_tokens)
        key = (rep.batch, n, self.done_tokens, self.done_tokens + n == prompt)
        cost = self._memo.get(key)
        if cost is None:
            cost = self._memo[key] = rep.cost.mixed_iteration(*key)
        self.chunk = (n, cost[1])
        return cost[0]

    def fail(self) -> tuple[list[int], list[int]]:
        """The replica went down (simulator/faults.py): returns (the prompt being prefilled, whose chunks done
        so far are lost, and the prompts still queued)."""
        lost = [] if self.current is None else [self.current]
        queued = list(self.queue)
        self.queue.clear()
        self.current, self.chunk, self.done_tokens, self.outstanding_tokens = None, None, 0, 0
        return lost, queued

    def after_iteration(self) -> None:
        """The iteration that ran the chunk ended: the prompt advances, and after its last chunk it joins the
        decode batch (or finishes, with one output token)."""
        if self.chunk is None:
            return
        (n, pc), self.chunk = self.chunk, None
        rec, rep, rid = self.rec, self.rep, self.current
        assert rid is not None  # a chunk ran: its prompt is the current one
        self.busy_s += pc.latency_s
        rec.approx_prefill[rid] += pc.approximation_s
        self.done_tokens += n
        if self.done_tokens < rec.prompt[rid]:
            return
        self.current = None
        self.outstanding_tokens -= rec.prompt[rid]
        now = rep.env.now
        rec.prefill_end[rid] = rec.encode_end[rid] = now
        rec.prefill_form[rid] = pc.forms[0] if pc.forms else ""
        if rec.decode_iterations[rid] == 0:
            rec.finish_without_decode(rid)
            rep.release(rid, rec.admit_bytes[rid])
        else:
            rec.transfer_start[rid] = rec.transfer_end[rid] = now
            rep.joining.append(rid)


class ColocatedRouter:
    """Arrivals go to the live replica with the fewest queued prompt tokens (ties: the lowest index); while
    every replica is down they wait in a backlog (simulator/faults.py)."""

    def __init__(self, replicas: list[DecodeReplica], prefills: list[ChunkedPrefill]):
        self.replicas = replicas
        self.prefills = prefills  # replica i's prompt queue
        self.links: dict = {}
        self.hold_kv = False  # no KV is parked on another host: a request's KV is written where it decodes
        self.live = prefills  # the prompt queues of the replicas that are up
        self.backlog: list[int] = []

    def on_arrivals(self, rids: list[int]) -> None:
        live = self.live
        if not live:
            self.backlog.extend(rids)
            return
        for rid in rids:
            best = min(live, key=lambda c: (c.outstanding_tokens, c.rep.index))
            best.enqueue(rid)

    def replica_down(self, i: int) -> tuple[list[int], list[int]]:
        """Replica i goes down: returns (the requests it held, decoding or being prefilled, and the prompts
        still queued there), in that order of fate; it takes no work until `replica_up`."""
        lost_prompt, queued = self.prefills[i].fail()
        lost = self.replicas[i].fail() + lost_prompt
        self.live = [c for c in self.prefills if not c.rep.down]
        return lost, queued

    def replica_up(self, i: int) -> None:
        self.replicas[i].recover()
        self.live = [c for c in self.prefills if not c.rep.down]
        backlog, self.backlog = self.backlog, []
        if backlog:
            self.on_arrivals(backlog)

    def on_memory_freed(self) -> None:
        for colo in self.prefills:
            if colo.queue:
                colo.rep.wake()

    def release_kv(self, rid: int) -> None:
        """Nothing to release: a colocated request's KV is written where it decodes."""


def build(records: Records, replicas: list[DecodeReplica], chunk_tokens: int) -> ColocatedRouter:
    prefills = [ChunkedPrefill(rep, records, chunk_tokens) for rep in replicas]
    router = ColocatedRouter(replicas, prefills)
    for rep, colo in zip(replicas, prefills):
        rep.colo = colo
        rep.listener = router
        rep.on_arrival = False  # the KV is written here in the memory format: nothing arrives to decode
    return router
