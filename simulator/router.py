"""The router: picks prefill and decode replicas and starts KV transfers.

* Arrival: the prefill replica with the fewest outstanding prompt tokens (queued + in service);
  ties go to the lowest index.
* KV ready (after encode; at prefill start when layers are streamed): requests wait in one FIFO
  for decode memory. The head goes to the reachable decode replica with room and the smallest
  reserved fraction of its KV capacity; while the head fits nowhere, everyone behind it waits too
  (strict FIFO, no overtaking). That wait is the KV parked in prefill host memory.
* Admission reserves decode memory and starts the transfer on the link joining the two replicas.
* Where the KV waits follows `network.kv_connector` (simulator/connectors.py): in prefill host memory
  (host_parked, the default) or the prefill GPU's KV pool (nixl_pull), both as above; or (p2p_push) it is
  pushed at once to a decode replica picked round robin and waits there for decode memory (`push`).
* Faults (simulator/faults.py): a replica that is down takes no work and a link that is out carries
  none; arrivals wait in a backlog while every prefill replica is down. The KV of a request stays
  parked in its prefill replica's host memory until it has arrived (`hold_kv`: until the request
  finishes, so a lost decode replica can be made good by sending it again).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

from .arrivals import ArrivalListener
from .decode import DecodeListener
from .link import FlowEnd
from .prefill import PrefillListener

if TYPE_CHECKING:
    from .columns import Records
    from .decode import DecodeReplica
    from .link import EndpointHost, Link
    from .prefill import PrefillReplica
    from .prefix_cache import PrefixCaching


class Pusher(Protocol):
    """network.kv_connector p2p_push (simulator/connectors.py): KV pushed at once, admitted on the decode side."""

    def push(self, rid: int) -> None: ...

    def try_admit(self) -> None: ...


class Router(PrefillListener, DecodeListener, ArrivalListener):
    def __init__(
        self,
        records: Records,
        prefix: PrefixCaching | None,
        prefill: list[PrefillReplica],
        decode: list[DecodeReplica],
        links: dict[tuple[int, int], Link],
        flow_cap_bytes_per_s: float,
        stream_layers: bool,
        layers: int,
    ):
        self.rec = records
        self.prefix = prefix
        self.prefill = prefill
        self.decode = decode
        self.links = links
        self.routes = {  # prefill replica -> [(decode replica, the link to it)], in decode index order
            p: [(decode[d], links[(p, d)]) for d in range(len(decode)) if (p, d) in links] for p in range(len(prefill))
        }
        self.flow_cap = flow_cap_bytes_per_s
        self.stream_layers = stream_layers
        self.layers = layers
        self.pending: deque[int] = deque()
        self.backlog: list[int] = []  # arrivals while every prefill replica is down
        self.transfers: dict[int, tuple] = {}  # request -> (link, decode replica) while its KV moves
        self.hold_kv = False
        self.push: Pusher | None = None  # network.kv_connector p2p_push (simulator/connectors.P2PPush)
        # network.link_busy_host_factor: the process of each prefill and decode replica (simulator/link.py), told
        # when transfers to or from it are in flight; None: no host shares a process with a link endpoint
        self.prefill_hosts: list[EndpointHost] | None = None
        self.decode_hosts: list[EndpointHost] | None = None
        for rep in prefill:
            rep.listener = self
        for drep in decode:
            drep.listener = self

    def on_arrivals(self, rids: list[int]) -> None:
        """Requests arriving at one instant are all queued before any prefill batch starts, so they
        can share a batch; then idle replicas start in index order."""
        live = self.prefill
        if any(r.down for r in live):
            live = [r for r in live if not r.down]
            if not live:
                self.backlog.extend(rids)
                return
        if len(rids) == 1:
            best = _least_loaded(live)
            best.enqueue(rids[0])
            best.kick()
            return
        touched = []
        for rid in rids:
            best = _least_loaded(live)
            best.enqueue(rid)
            touched.append(best)
        for rep in sorted(set(touched), key=lambda r: r.index):
            rep.kick()

    def on_prefill_started(self, batch: list[int], replica: PrefillReplica, start_s: float, ready_s: float) -> None:
        if self.stream_layers:
            self._ready(batch)

    def on_kv_ready(self, batch: list[int], replica: PrefillReplica) -> None:
        if not self.stream_layers:
            self._ready(batch)
        else:
            self.try_admit()  # a streamed request admitted late now transfers at full rate

    def _ready(self, batch: list[int]) -> None:
        rec = self.rec
        for rid in batch:
            if rec.decode_iterations[rid] == 0:
                # The prefill's token is the whole output (ttft_at prefill, one output token): no KV moves, no decode.
                rec.finish_without_decode(rid)
                self.release_kv(rid)
            elif self.push is not None:
                self.push.push(rid)
            else:
                self.pending.append(rid)
        self.try_admit()

    def on_memory_freed(self) -> None:
        self.try_admit()

    def try_admit(self) -> None:
        if self.push is not None:
            self.push.try_admit()
            return
        rec = self.rec
        while self.pending:
            rid = self.pending[0]
            p = rec.prefill_replica[rid]
            need, host = rec.admit_bytes[rid], rec.host_kv_bytes[rid]
            best = None
            for rep, link in self.routes[p]:
                if (
                    link.factor > 0
                    and rep.has_room(need, host)
                    and (
                        best is None
                        or rep.reserved_bytes / rep.capacity_bytes < best.reserved_bytes / best.capacity_bytes
                    )
                ):
                    best = rep
            if best is None:
                return
            self.pending.popleft()
            if self.prefix is not None:
                self.prefix.decode_admit(rid, best.index)
            best.reserve(need, host)
            self._transfer(rid, p, best)

    def _transfer(
        self, rid: int, p: int, rep: DecodeReplica, arrive: Callable[[int, DecodeReplica], None] | None = None
    ) -> None:
        """Move the request's KV from prefill replica p to `rep`; when it is there, `arrive(rid, rep)` (by default
        the request joins the replica, which admitted it)."""
        rec = self.rec
        link = self.links[(p, rep.index)]
        now = link.loop.now
        rec.decode_replica[rid] = rep.index
        rec.transfer_start[rid] = now
        bytes_ = rec.wire_bytes[rid] if self.prefix is None else self.prefix.sent_bytes[rid]
        cap = self.flow_cap
        not_before = 0.0
        ready = rec.encode_end[rid]
        if self.stream_layers and now < ready:
            # Layers are produced at bytes / (ready - now); the last layer cannot leave before it exists.
            cap = min(cap, bytes_ / (ready - now))
            # ... and then takes its own bytes at the flow's rate (never faster than the link itself)
            not_before = ready + bytes_ / self.layers / min(self.flow_cap, link.capacity)

        hosts: tuple[EndpointHost, ...] = ()
        if self.prefill_hosts is not None and self.decode_hosts is not None:
            src, dst = self.prefill_hosts[p], self.decode_hosts[rep.index]
            hosts = (src,) if src is dst else (src, dst)  # shared_gpu: one process
            for h in hosts:
                h.started(link)

        self.transfers[rid] = (link, rep)
        link.send(rid, bytes_, cap, _Transfer(self, link, rep, hosts, arrive), not_before)

    def release_kv(self, rid: int) -> None:
        """The request's KV leaves its prefill replica (host memory, KV pool or push queue), unless a fault already
        took it."""
        rec = self.rec
        if rec.kv_held[rid]:
            rec.kv_held[rid] = False
            self.prefill[rec.prefill_replica[rid]].release_parked(rid)


class _Transfer(FlowEnd):
    """A transfer's end on its link (`Router._transfer`): the request's KV is at `rep`."""

    __slots__ = ("router", "link", "rep", "hosts", "arrive")

    def __init__(
        self,
        router: Router,
        link: Link,
        rep: DecodeReplica,
        hosts: tuple[EndpointHost, ...],
        arrive: Callable[[int, DecodeReplica], None] | None,
    ):
        self.router = router
        self.link = link
        self.rep = rep
        self.hosts = hosts
        self.arrive = arrive

    def arrived(self, rid: int, time_s: float) -> None:
        router, link, rep = self.router, self.link, self.rep
        router.rec.transfer_end[rid] = time_s
        del router.transfers[rid]
        for h in self.hosts:  # before the request joins: an idle replica starts at the idle level
            h.ended(link)
        if not router.hold_kv:
            router.release_kv(rid)
        if router.prefix is not None:
            router.prefix.decode_arrived(rid, rep.index)
        if self.arrive is None:
            rep.arrive(rid)
        else:
            self.arrive(rid, rep)


def _least_loaded(replicas: list[PrefillReplica]) -> PrefillReplica:
    """The replica with the fewest outstanding prompt tokens, the lowest index on a tie (`replicas` is in
    index order)."""
    best = replicas[0]
    for r in replicas:
        if r.outstanding_tokens < best.outstanding_tokens:
            best = r
    return best
