"""A network link whose bandwidth is shared by concurrent transfers (max-min fair, per-flow caps).

The link is a fluid processor-sharing server: between changes of its flow set every flow drains
at a constant rate, so the next event is simply the earliest completion. Each change (a flow
starts or ends) recomputes rates by water-filling: flows capped below the fair share keep their
cap, the rest split what is left equally. One SimPy timeout per change; stale timeouts are
ignored through a version counter. A streaming flow (layer-by-layer KV) also carries the time
before which it cannot finish, because the last layer's KV does not exist before prefill ends.
`RoundRobinLink` (network.round_robin_chunk_bytes) serves the flows one chunk at a time instead, round robin, as
realrun's link thread does; it keeps the same interface and one event per start and completion.

Where the host work of replicas shares a process with a link endpoint (network.link_busy_host_factor: realrun,
whose link is a Python thread beside the harness's loop), `EndpointHost` is that process: it counts the transfers
in flight to or from it and tells its replicas when the first starts and when the last ends, so their host terms
follow the link's state (simulator/decode.py, simulator/prefill.py).

Faults (simulator/faults.py) scale the capacity (`set_factor`: a degraded link, or 0 for an outage,
during which nothing moves) and abort flows (`abort`: their bytes are lost; a flow that has drained
but waits out its latency is cancelled too).
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable
from typing import Final, Protocol

import simpy

from .columns import RowLog
from .timers import Timer, loop

EPS_BYTES: Final = 1e-3


def water_fill(caps: list[float], capacity: float) -> list[float]:
    """Max-min fair rates of flows with these caps (ascending) on a link of `capacity`: a flow capped below the fair
    share keeps its cap, the rest split what is left equally."""
    rates: list[float] = []
    left, n = capacity, len(caps)
    for i, cap in enumerate(caps):
        rate = min(cap, left / (n - i))
        rates.append(rate)
        if left != math.inf:  # an unlimited link stays unlimited (inf - inf would be NaN)
            left -= rate
    return rates


class LinkStateListener(Protocol):
    """A replica whose host terms follow the link's state (DecodeReplica, PrefillReplica)."""

    def link_busy_changed(self, busy: bool) -> None: ...


class EndpointHost:
    """One process whose host work shares the CPU (and the interpreter) with a link endpoint: the replicas in it
    (a prefill and a decode replica under placement shared_gpu, else one) hear `link_busy_changed(True)` when a
    transfer to or from the process starts with none in flight, and `(False)` when the last one ends."""

    __slots__ = ("flows", "links", "members")

    def __init__(self, members: list[LinkStateListener]):
        self.flows = 0  # transfers in flight to or from this process
        self.links: dict[Link, int] = {}  # the links they are on, with how many each
        self.members = members

    def started(self, link: Link) -> None:
        self.flows += 1
        self.links[link] = self.links.get(link, 0) + 1
        if self.flows == 1:
            for m in self.members:
                m.link_busy_changed(True)

    def ended(self, link: Link) -> None:
        self.flows -= 1
        n = self.links[link] - 1
        if n:
            self.links[link] = n
        else:
            del self.links[link]
        if self.flows == 0:
            for m in self.members:
                m.link_busy_changed(False)

    def busy_left_s(self) -> float:
        """How long the transfers in flight now keep this process busy if no other starts: until the last of them
        arrives, on the links they are on (each link's flows drained as the link shares it; inf in an outage)."""
        if not self.flows:
            return 0.0
        return max(link.drain_end_s() for link in self.links) - next(iter(self.links)).loop.now


class FlowEnd:
    """What a transfer's arrival runs: `arrived(rid, time_s)`, when its last byte is there. A subclass names what runs
    (the router's `router._Transfer`), its fields what a closure would capture: compiled, the link calls it
    directly, where a closure was a Python call with its arguments boxed."""

    def arrived(self, rid: int, time_s: float) -> None:
        raise NotImplementedError


class _Callback(FlowEnd):
    """`Link.start`'s end: a plain function `on_done(rid, time_s)`."""

    def __init__(self, on_done: Callable[[int, float], None]):
        self.on_done = on_done

    def arrived(self, rid: int, time_s: float) -> None:
        self.on_done(rid, time_s)


class Flow:
    __slots__ = (
        "rid",
        "remaining_bytes",
        "cap_bytes_per_s",
        "not_before_s",
        "end",
        "rate",
        "cancelled",
        "finish_s",
    )

    def __init__(self, rid: int, bytes_: float, cap_bytes_per_s: float, not_before_s: float, end: FlowEnd):
        self.rid = rid
        self.remaining_bytes = bytes_
        self.cap_bytes_per_s = cap_bytes_per_s
        self.not_before_s = not_before_s
        self.end = end
        self.rate = 0.0
        self.cancelled = False
        self.finish_s = math.inf  # drained, waiting out the latency: when it arrives


class Link:
    def __init__(
        self,
        env: simpy.Environment,
        name: str,
        capacity_bytes_per_s: float,
        latency_s: float,
        log: RowLog | None = None,
    ):
        self.env = env
        self.loop = loop(env)  # its clock and timers (simulator/timers.py)
        self.name = name
        self.capacity = self.base_capacity = capacity_bytes_per_s
        self.factor = 1.0  # of base_capacity; 0 during an outage
        self.latency_s = latency_s
        self.flows: list[Flow] = []
        self.waiting: dict[int, Flow] = {}  # drained, arriving after the latency (or not_before_s), by request
        self._last_s = 0.0
        self._version = 0
        self.log = log  # (time_s, active_flows, throughput_bytes_per_s)

    def start(
        self,
        rid: int,
        bytes_: float,
        cap_bytes_per_s: float,
        on_done: Callable[[int, float], None],
        not_before_s: float = 0.0,
    ) -> None:
        """Begin a transfer; `on_done(rid, time_s)` runs when its last byte has arrived."""
        self.send(rid, bytes_, cap_bytes_per_s, _Callback(on_done), not_before_s)

    def send(self, rid: int, bytes_: float, cap_bytes_per_s: float, end: FlowEnd, not_before_s: float = 0.0) -> None:
        """Begin a transfer; `end.arrived(rid, time_s)` runs when its last byte has arrived."""
        self._advance()
        self.flows.append(Flow(rid, bytes_, cap_bytes_per_s, not_before_s, end))
        self._reschedule()

    def set_factor(self, factor: float) -> None:
        """Run at `factor` of the line rate from now on (0: an outage)."""
        self._advance()
        self.factor = factor
        self.capacity = self.base_capacity * factor
        self._reschedule()

    def abort(self, rids: set[int]) -> list[int]:
        """Drop the transfers of these requests (their bytes are lost); returns the requests dropped."""
        gone = self._cancel(rids)
        self.flows = [f for f in self.flows if not f.cancelled]
        self._reschedule()
        return [f.rid for f in gone]

    def _cancel(self, rids: set[int]) -> list[Flow]:
        """Up to now, then mark the flows of these requests cancelled (those waiting out their latency leave)."""
        self._advance()
        gone = [f for f in self.flows if f.rid in rids] + [self.waiting.pop(r) for r in rids if r in self.waiting]
        for f in gone:
            f.cancelled = True
        return gone

    def drain_end_s(self) -> float:
        """When the last transfer on the link now arrives if no other starts and the capacity holds: its flows
        drained as `_rates` shares the link, each arriving max(drained, not_before_s) + latency; inf in an
        outage. Reads the state, changes nothing."""
        now = self.loop.now
        end = max([f.finish_s for f in self.waiting.values()], default=now)
        dt0 = now - self._last_s
        left = [[max(f.remaining_bytes - f.rate * dt0, 0.0), f.cap_bytes_per_s, f.not_before_s] for f in self.flows]
        left.sort(key=lambda x: x[1])  # by cap, as _rates fills them
        t = now
        while left:
            rates = water_fill([x[1] for x in left], self.capacity)
            moving = [x[0] / r for x, r in zip(left, rates) if r > 0]
            if not moving:
                return math.inf
            dt = min(moving)
            t += dt
            rest = []
            for x, r in zip(left, rates):
                x[0] -= r * dt
                if x[0] <= EPS_BYTES + 1e-9 * r:
                    end = max(end, max(t, x[2]) + self.latency_s)
                else:
                    rest.append(x)
            left = rest
        return end

    def _advance(self) -> None:
        dt = self.loop.now - self._last_s
        if dt > 0:
            for f in self.flows:
                f.remaining_bytes -= f.rate * dt
        self._last_s = self.loop.now

    def _rates(self) -> None:
        flows = self.flows
        if len(flows) == 1:  # the usual case: the one flow takes what the link and its cap allow
            flows[0].rate = min(flows[0].cap_bytes_per_s, self.capacity)
            return
        flows = _by_cap(flows)
        for f, rate in zip(flows, water_fill([f.cap_bytes_per_s for f in flows], self.capacity)):
            f.rate = rate

    @staticmethod
    def _drained(f: Flow, now: float) -> bool:
        """Done: within a nanosecond's bytes of the end, or so close that the clock cannot represent
        the rest (late in a long run a tiny remainder would otherwise re-arm a zero-length timer forever)."""
        return f.remaining_bytes <= EPS_BYTES + 1e-9 * f.rate or (
            f.rate > 0 and now + f.remaining_bytes / f.rate == now
        )

    def _reschedule(self) -> None:
        self._rates()
        self._version += 1
        flows = self.flows
        if len(flows) == 1:  # the usual case, without the general case's lists and generators (same arithmetic)
            f = flows[0]
            if self.log is not None:
                self.log.add(self.loop.now, 1, 0 + f.rate)  # 0 + rate: sum()'s float, bit for bit
            if not f.rate > 0:
                return  # an outage: nothing drains until the capacity returns
            dt = max(f.remaining_bytes, 0.0) / f.rate
        else:
            if self.log is not None:
                self.log.add(self.loop.now, len(flows), sum(f.rate for f in flows))
            moving = [f for f in flows if f.rate > 0]
            if not moving:
                return  # idle, or an outage: nothing drains until the capacity returns
            dt = min(max(f.remaining_bytes, 0.0) / f.rate for f in moving)
        self.loop.set_in(_Drained(self, self._version), dt)

    def _on_timer(self, version: int) -> None:
        if version != self._version:
            return
        self._advance()
        now = self.loop.now
        done = self._take_drained(now)
        self._reschedule()
        self._deliver(done, now)

    def _take_drained(self, now: float) -> list[Flow]:
        """The flows drained by now, taken off the link."""
        done: list[Flow] = []
        left: list[Flow] = []
        drained = self._drained
        for f in self.flows:
            (done if drained(f, now) else left).append(f)
        self.flows = left
        return done

    def _deliver(self, done: list[Flow], now: float) -> None:
        """The flows drained now: each arrives after the latency (or at its not-before time), or now."""
        latency_s = self.latency_s
        for f in done:
            finish = max(now, f.not_before_s) + latency_s
            if finish <= now:
                f.end.arrived(f.rid, now)
            else:
                self.waiting[f.rid] = f
                f.finish_s = finish
                self._arrival_timer(f, finish, finish - now)

    def _arrival_timer(self, f: Flow, finish: float, delay_s: float) -> None:
        """The timer of a flow's KV arriving."""
        self.loop.set_in(_Arrived(self, f, finish), delay_s)

    def _arrived(self, f: Flow, t: float) -> None:
        if f.cancelled:
            return
        del self.waiting[f.rid]
        f.end.arrived(f.rid, t)


def _by_cap(flows: list[Flow]) -> list[Flow]:
    """The flows by cap, ascending, equal caps in their order: `sorted` by the cap, by insertion where there are a few
    (compiled, C comparisons of the caps; sorted's key function is a Python call per flow)."""
    if len(flows) > 32:
        return sorted(flows, key=lambda f: f.cap_bytes_per_s)
    out = list(flows)
    for i in range(1, len(out)):
        f = out[i]
        cap = f.cap_bytes_per_s
        j = i - 1
        while j >= 0 and cap < out[j].cap_bytes_per_s:
            out[j + 1] = out[j]
            j -= 1
        out[j + 1] = f
    return out


class _Drained(Timer):
    """The link's next completion as planned at `version` (void once the flow set or the capacity changed)."""

    __slots__ = ("link", "version")

    def __init__(self, link: Link, version: int):
        self.link = link
        self.version = version

    def fire(self) -> None:
        self.link._on_timer(self.version)


class _Arrived(Timer):
    """A drained flow's last byte arriving, `latency_s` (or its not-before time) after it left."""

    __slots__ = ("link", "flow", "finish_s")

    def __init__(self, link: Link, flow: Flow, finish_s: float):
        self.link = link
        self.flow = flow
        self.finish_s = finish_s

    def fire(self) -> None:
        self.link._arrived(self.flow, self.finish_s)


class RoundRobinLink(Link):
    """A link that serves its transfers one chunk at a time, round robin (network.round_robin_chunk_bytes; realrun's
    link thread, realrun/link.py `Link._run`): the chunk in service moves at min(its flow's cap, the capacity), the
    others wait; when it ends, the next flow in the cycle sends its next chunk (the last one's rest, if smaller). A
    transfer that starts while a chunk is in service takes its place in the cycle right after that chunk's flow, as
    realrun's thread appends it to its deque after putting the served transfer back: every flow already in the cycle
    sends one more chunk before it does. A lone transfer takes its bytes over the rate, as on the fluid link; with
    several in flight, chunks of a fixed size finish them nearer to first-come first-served than fair sharing does
    (about one chunk's time sooner on average at 1 Gbps and 1 MiB chunks in the h200g recordings). Events stay one
    per start and completion: between them the walk over the chunks is arithmetic (`_next_drain_s`)."""

    def __init__(
        self,
        env: simpy.Environment,
        name: str,
        capacity_bytes_per_s: float,
        latency_s: float,
        chunk_bytes: float,
        log: RowLog | None = None,
    ):
        super().__init__(env, name, capacity_bytes_per_s, latency_s, log)
        if not chunk_bytes > 0:
            raise ValueError("a round-robin link needs chunks of more than 0 bytes")
        self.chunk_bytes = chunk_bytes
        self.pos = 0  # the flow whose chunk is in service (self.flows is the cycle's order)
        self.chunk_left = 0.0  # bytes of that chunk still to send
        self.joined = 0  # flows that started during that chunk: placed right after it, served after a full cycle
        self.chunk_start_s = -math.inf  # when that chunk started

    def _rate(self, f: Flow) -> float:
        return min(f.cap_bytes_per_s, self.capacity)

    def send(self, rid: int, bytes_: float, cap_bytes_per_s: float, end: FlowEnd, not_before_s: float = 0.0) -> None:
        self._advance()
        f = Flow(rid, bytes_, cap_bytes_per_s, not_before_s, end)
        if not self.flows:
            self.flows.append(f)
            self.pos, self.joined = 0, 0
            self.chunk_left = min(self.chunk_bytes, bytes_)
            self.chunk_start_s = self.loop.now
        elif self.loop.now == self.chunk_start_s:
            # the chunk in service starts at this instant: realrun's thread took this transfer with the others before
            # it chose (at its deque's end): last in the cycle before the flow now in service
            self.flows.insert(self.pos, f)
            self.pos += 1
        else:
            self.flows.insert(self.pos + 1 + self.joined, f)
            self.joined += 1
        self._reschedule()

    def _next_chunk(self, at_s: float) -> None:
        """The chunk in service ended at `at_s`: on to the next flow in the cycle (past the ones that joined during
        it)."""
        n = len(self.flows)
        self.pos = (self.pos + 1 + self.joined) % n
        self.joined = 0
        f = self.flows[self.pos]
        self.chunk_left = min(self.chunk_bytes, max(f.remaining_bytes, 0.0))
        self.chunk_start_s = at_s

    def _serving_drained(self) -> bool:
        f = self.flows[self.pos]
        return f.remaining_bytes <= EPS_BYTES + 1e-9 * self._rate(f)

    def _advance(self) -> None:
        dt = self.loop.now - self._last_s
        self._last_s = self.loop.now
        while dt > 0 and self.flows:
            f = self.flows[self.pos]
            rate = self._rate(f)
            if not rate > 0:
                return  # an outage: nothing moves
            need = self.chunk_left / rate
            if need > dt and self.chunk_left - rate * dt > EPS_BYTES + 1e-9 * rate:
                f.remaining_bytes -= rate * dt
                self.chunk_left -= rate * dt
                return
            dt -= need
            f.remaining_bytes -= self.chunk_left
            self.chunk_left = 0.0
            if f.remaining_bytes <= EPS_BYTES + 1e-9 * rate:
                return  # drained: the completion timer takes it out (it fires at this instant)
            self._next_chunk(self.loop.now if dt <= 0 else self.loop.now - dt)
            if dt > 0:
                dt -= self._skip_rounds(dt)

    def _skip_rounds(self, dt: float) -> float:
        """At a chunk's start, send the whole rounds that fit in `dt` seconds and in which every flow sends a full
        chunk and none its last (each flow one chunk a round, in the cycle's order from here); their seconds."""
        c = self.chunk_bytes
        round_s = 0.0
        fewest = math.inf
        for f in self.flows:
            rate = self._rate(f)
            if not rate > 0:
                return 0.0
            round_s += c / rate
            fewest = min(fewest, f.remaining_bytes)
        rounds = min(math.floor(dt / round_s), math.floor(fewest / c) - 1)
        if rounds <= 0:
            return 0.0
        for f in self.flows:
            f.remaining_bytes -= rounds * c
        return rounds * round_s

    def _rates(self) -> None:
        for i, f in enumerate(self.flows):
            f.rate = self._rate(f) if i == self.pos else 0.0

    def _next_drain_s(self) -> float:
        """Seconds from now until the next flow drains if none starts (inf in an outage): the chunks walked in the
        cycle's order, a whole round at once where no flow can finish in it."""
        flows, c = self.flows, self.chunk_bytes
        n = len(flows)
        rem = [max(f.remaining_bytes, 0.0) for f in flows]
        rates = [self._rate(f) for f in flows]
        if any(not r > 0 for r in rates):
            return math.inf
        pos, joined = self.pos, self.joined
        t = self.chunk_left / rates[pos]
        rem[pos] -= self.chunk_left
        while True:
            if rem[pos] <= EPS_BYTES + 1e-9 * rates[pos]:
                return t
            pos = (pos + 1 + joined) % n
            joined = 0
            # whole rounds in which every flow sends a full chunk and none sends its last
            rounds = math.floor(min(rem) / c) - 1.0
            if rounds > 0:
                round_s = 0.0
                for r in rates:
                    round_s += c / r
                t += rounds * round_s
                rem = [x - rounds * c for x in rem]
            take = min(c, rem[pos])
            t += take / rates[pos]
            rem[pos] -= take

    def drain_end_s(self) -> float:
        now = self.loop.now
        end = max([f.finish_s for f in self.waiting.values()], default=now)
        if not self.flows:
            return end
        dt0 = now - self._last_s
        rates = [self._rate(f) for f in self.flows]
        if any(not r > 0 for r in rates):
            return math.inf
        # one chunk at a time: the last flow drains when every byte in flight has been sent
        total_s = -dt0
        for f, r in zip(self.flows, rates):
            total_s += max(f.remaining_bytes, 0.0) / r
        last = now + max(total_s, 0.0)
        return max(end, max(last, max(f.not_before_s for f in self.flows)) + self.latency_s)

    def abort(self, rids: set[int]) -> list[int]:
        gone = self._cancel(rids)
        if any(f.cancelled for f in self.flows):
            flows, pos, j = self.flows, self.pos, self.joined
            serving, joined = flows[pos], flows[pos + 1 : pos + 1 + j]
            after = [f for f in flows[pos + 1 + j :] + flows[:pos] if not f.cancelled]  # served next, in order
            joined = [f for f in joined if not f.cancelled]
            if serving.cancelled:  # its chunk is lost; the next flow starts one now
                self.flows, self.pos, self.joined = after + joined, 0, 0
                if self.flows:
                    self.chunk_left = min(self.chunk_bytes, max(self.flows[0].remaining_bytes, 0.0))
                    self.chunk_start_s = self.loop.now
            else:  # the chunk in service goes on, then the flows after it, then it and the ones that joined during it
                self.flows, self.pos, self.joined = [serving, *joined, *after], 0, len(joined)
        self._reschedule()
        return [f.rid for f in gone]

    def _reschedule(self) -> None:
        self._rates()
        self._version += 1
        if self.log is not None:
            self.log.add(self.loop.now, len(self.flows), 0.0 + sum(f.rate for f in self.flows))
        if not self.flows:
            return
        dt = self._next_drain_s()
        if dt == math.inf:
            return
        self.loop.set_in(_Drained(self, self._version), max(dt, 0.0))

    def _take_drained(self, now: float) -> list[Flow]:
        """The flow in service if it sent its last chunk, and after it each next one that has (one drains at a
        time: the others wait for their turns)."""
        done: list[Flow] = []
        while self.flows and self._serving_drained():
            done.append(self.flows[self.pos])
            if len(self.flows) == 1:
                self.flows = []
                break
            self._next_chunk_after_drained()
        return done

    def _next_chunk_after_drained(self) -> None:
        """The flow in service sent its last chunk: it leaves the cycle, which goes on with the flow after it (past
        the ones that joined during that chunk, as realrun does not put a finished transfer back)."""
        n = len(self.flows)
        nxt = (self.pos + 1 + self.joined) % n
        del self.flows[self.pos]
        if nxt > self.pos:
            nxt -= 1
        self.pos, self.joined = nxt % len(self.flows), 0
        f = self.flows[self.pos]
        self.chunk_left = min(self.chunk_bytes, max(f.remaining_bytes, 0.0))
        self.chunk_start_s = self.loop.now


def round_robin_s(start: list[float], size: list[float], rate: float, chunk_bytes: float) -> list[float]:
    """Durations of transfers on one `RoundRobinLink` of `rate` bytes/s without caps or latency, each starting at
    start[i] with size[i] bytes (calibrate prices a recording's transfers with it, as the simulator moves them).

    With one rate for every flow the link is realrun's thread itself, walked on its wire clock: each chunk ends
    chunk / rate after the last (or after the start of a transfer that found the link idle); at its end the served
    transfer goes back to the cycle's end unless done, then the transfers started by then join after it. Between
    changes (a start, a finish) whole rounds in which every transfer sends a full chunk and none its last, and that end
    before the next start, are sent at once. tests/test_link_round_robin.py holds it to a chunk-by-chunk transcription
    of realrun's thread and to the simulator's `RoundRobinLink`."""
    n = len(start)
    order = sorted(range(n), key=lambda i: start[i])
    left = [float(x) for x in size]
    end = [math.nan] * n
    cycle: deque[int] = deque()
    c = float(chunk_bytes)
    chunk_s = c / rate
    wire = 0.0
    nxt = 0  # the next transfer to start, in start order
    changed = True
    while nxt < n or cycle:
        if not cycle:  # idle: the next start finds the link free
            i = order[nxt]
            nxt += 1
            wire = max(wire, start[i])
            cycle.append(i)
            changed = True
        while nxt < n and start[order[nxt]] <= wire:
            cycle.append(order[nxt])
            nxt += 1
            changed = True
        if changed:
            changed = False
            fewest = math.inf
            for j in cycle:
                fewest = min(fewest, left[j])
            rounds = math.floor(fewest / c) - 1
            if rounds > 0 and nxt < n:  # every round's last chunk ends before the next start
                rounds = min(rounds, math.ceil((start[order[nxt]] - wire) / (len(cycle) * chunk_s)) - 1)
            if rounds > 0:
                for j in cycle:
                    left[j] -= rounds * c
                wire += rounds * len(cycle) * chunk_s
        i = cycle.popleft()
        take = min(c, left[i])
        left[i] -= take
        wire += take / rate
        if left[i] <= 0:
            end[i] = wire
            changed = True
        else:
            cycle.append(i)
    return [e - s for e, s in zip(end, start)]
