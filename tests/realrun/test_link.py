"""The emulated link (realrun/link.py): a lone transfer takes bytes*8/R, concurrent transfers take chunks in
turn, a late wake-up costs no link time while the link stays busy, an idle link saves no credit, bytes
arrive intact.

The pacing is checked against a simulated clock whose sleep advances it (SimClock): every chunk's start
time is then exact and does not depend on the machine's load. One loose real-time test checks that the
wall clock and time.sleep drive the same pacer (a transfer never ends early, and ends within seconds)."""

from __future__ import annotations

import os
import time
import zlib

import pytest
import torch

from realrun.link import Link, Transfer

RATE_GBPS = 0.2
MIB = 1 << 20
CHUNK = MIB // 4
CHUNK_S = CHUNK * 8 / (RATE_GBPS * 1e9)  # one chunk's wire time
WAIT_S = 30  # a real-time bound on waiting for the link thread; only reached if the test fails


class SimClock:
    """Simulated time for the link thread: only `sleep` moves it. `late[i]` makes the i-th sleep wake that many
    seconds late; `at(t, fn)` runs fn at time t inside the sleep that crosses t (in the link thread, so a
    transfer submitted mid-flight joins at an exact instant)."""

    def __init__(self):
        self.now_s = 0.0
        self.sleeps: list[float] = []
        self.late: dict[int, float] = {}
        self._due: list[tuple[float, object]] = []

    def __call__(self) -> float:
        return self.now_s

    def at(self, time_s: float, fn) -> None:
        self._due.append((time_s, fn))
        self._due.sort(key=lambda d: d[0])

    def sleep(self, seconds: float) -> None:
        assert seconds > 0
        self.sleeps.append(seconds)
        wake_s = self.now_s + seconds + self.late.get(len(self.sleeps) - 1, 0.0)
        while self._due and self._due[0][0] <= wake_s:
            self.now_s, fn = self._due.pop(0)
            fn()
        self.now_s = wake_s


class RecordingLink(Link):
    """Logs each chunk as (transfer key, bytes, clock when it was taken)."""

    def __init__(self, *args, **kwargs):
        self.chunks: list[tuple[object, int, float]] = []
        super().__init__(*args, **kwargs)

    def _copy_chunk(self, tr, n):
        self.chunks.append((tr.key, n, self.clock()))
        super()._copy_chunk(tr, n)


def _buf(n, seed):
    return torch.randint(0, 256, (n,), dtype=torch.uint8, generator=torch.Generator().manual_seed(seed))


def _transfer(key, n):
    return Transfer(key, _buf(n, zlib.crc32(key.encode())), torch.zeros(n, dtype=torch.uint8))


def _sim_link(clock: SimClock, chunk=CHUNK) -> RecordingLink:
    return RecordingLink(RATE_GBPS, clock, torch.device("cpu"), chunk_bytes=chunk, sleep=clock.sleep, start=False)


def _run_together(sizes, clock=None):
    """Transfers submitted at one instant (before the link thread starts), served to the end."""
    clock = clock or SimClock()
    link = _sim_link(clock)
    trs = [_transfer(k, n) for k, n in sizes.items()]
    try:
        for tr in trs:
            link.submit(tr)
        link.start()
        done = [link.done.get(timeout=WAIT_S) for _ in trs]
    finally:
        link.close()
    for tr in trs:
        assert torch.equal(tr.src, tr.dst)
    return link, {tr.key: tr for tr in trs}, [tr.key for tr in done]


def _times(link, key):
    return [t for k, _, t in link.chunks if k == key]


def test_lone_transfer_takes_bytes_over_rate():
    link, trs, _ = _run_together({"a": 4 * MIB})
    a = trs["a"]
    assert (a.start_s, a.end_s) == (0.0, pytest.approx(4 * MIB * 8 / (RATE_GBPS * 1e9), rel=1e-12))
    assert _times(link, "a") == pytest.approx([i * CHUNK_S for i in range(16)], rel=1e-12, abs=1e-15)


def test_unaligned_size_and_partial_last_chunk():
    n = 3 * CHUNK + 12345
    link, trs, _ = _run_together({"a": n})
    assert [b for _, b, _ in link.chunks] == [CHUNK, CHUNK, CHUNK, 12345]
    assert trs["a"].end_s == pytest.approx(n * 8 / (RATE_GBPS * 1e9), rel=1e-12)  # the last chunk's bytes only


def test_concurrent_transfers_take_chunks_in_turn():
    """2 MiB and 6 MiB (8 and 24 chunks) together: chunks alternate while both are in flight, so the small one's
    8th chunk is the 15th on the wire and it ends after 15 chunk times (half the rate: 2 x 8 less the turn it
    went first); the large one ends after all 32."""
    link, trs, done = _run_together({"small": 2 * MIB, "large": 6 * MIB})
    order = [k for k, _, _ in link.chunks]
    assert order == ["small", "large"] * 8 + ["large"] * 16
    assert [t for _, _, t in link.chunks] == pytest.approx([i * CHUNK_S for i in range(32)], rel=1e-12, abs=1e-15)
    assert trs["small"].end_s == pytest.approx(15 * CHUNK_S, rel=1e-12)
    assert trs["large"].end_s == pytest.approx(32 * CHUNK_S, rel=1e-12)
    assert done == ["small", "large"]


def test_a_transfer_joining_mid_flight_shares_from_its_next_chunk():
    """A (6 chunks) alone from 0; B (2 chunks) submitted at 2.5 chunk times, while A's third chunk is on the wire:
    A's chunks at 0, 1, 2, then A and B alternate (A 3, B 4, A 5, B 6, A 7): B ends at 7, A at 8."""
    clock = SimClock()
    link = _sim_link(clock)
    a, b = _transfer("a", 6 * CHUNK), _transfer("b", 2 * CHUNK)
    clock.at(2.5 * CHUNK_S, lambda: link.submit(b))
    try:
        link.submit(a)
        link.start()
        done = [link.done.get(timeout=WAIT_S) for _ in range(2)]
    finally:
        link.close()
    assert b.start_s == pytest.approx(2.5 * CHUNK_S, rel=1e-12)
    assert [k for k, _, _ in link.chunks] == ["a", "a", "a", "a", "b", "a", "b", "a"]
    assert _times(link, "b") == pytest.approx([4 * CHUNK_S, 6 * CHUNK_S], rel=1e-12)
    assert (b.end_s, a.end_s) == (pytest.approx(7 * CHUNK_S, rel=1e-12), pytest.approx(8 * CHUNK_S, rel=1e-12))
    assert [tr.key for tr in done] == ["b", "a"]
    assert torch.equal(a.src, a.dst) and torch.equal(b.src, b.dst)


def test_a_late_wake_up_costs_no_link_time_while_busy():
    """8 chunks; the sleep after the 3rd chunk wakes 2.5 chunk times late (at 5.5). The wire clock is then behind:
    chunks 4 and 5 go at once (5.5), the 6th after a half-chunk sleep (6), and the transfer still ends at 8, not
    10.5 (the token bucket of the module docstring)."""
    clock = SimClock()
    clock.late[2] = 2.5 * CHUNK_S
    link, trs, _ = _run_together({"a": 8 * CHUNK}, clock)
    c = CHUNK_S
    assert _times(link, "a") == pytest.approx([0, c, 2 * c, 5.5 * c, 5.5 * c, 5.5 * c, 6 * c, 7 * c], rel=1e-12)
    assert clock.sleeps == pytest.approx([c, c, c, 0.5 * c, c, c], rel=1e-9)
    assert trs["a"].end_s == pytest.approx(8 * c, rel=1e-12)


def test_idle_link_saves_no_credit():
    """A 1-chunk transfer ends at 1; the link idles 0.3 s; a 2-chunk transfer then takes its full 2 chunk times
    (an idle link that kept its wire clock would send it at once)."""
    clock = SimClock()
    link = _sim_link(clock)
    first, second = _transfer("first", CHUNK), _transfer("second", 2 * CHUNK)
    try:
        link.submit(first)
        link.start()
        link.done.get(timeout=WAIT_S)
        clock.now_s += 0.3  # the link thread is blocked on its empty queue: no race
        link.submit(second)
        link.done.get(timeout=WAIT_S)
    finally:
        link.close()
    assert first.end_s == pytest.approx(CHUNK_S, rel=1e-12)
    assert second.start_s == pytest.approx(CHUNK_S + 0.3, rel=1e-12)
    assert second.end_s - second.start_s == pytest.approx(2 * CHUNK_S, rel=1e-9)


def test_an_empty_transfer_ends_at_once_and_takes_no_turn():
    link, trs, done = _run_together({"empty": 0, "a": 2 * CHUNK})
    assert trs["empty"].end_s == trs["empty"].start_s == 0.0
    assert [k for k, _, _ in link.chunks] == ["a", "a"] and done == ["empty", "a"]
    assert trs["a"].end_s == pytest.approx(2 * CHUNK_S, rel=1e-12)


def test_mismatched_sizes_are_refused():
    link = _sim_link(SimClock())
    with pytest.raises(ValueError, match="sizes differ"):
        link.submit(Transfer(0, _buf(10, 0), torch.zeros(11, dtype=torch.uint8)))
    link.close()


def test_wall_clock_smoke():
    """The harness's clock and time.sleep: a 4 MiB transfer at 0.2 Gbps (0.17 s) never ends early (the pacer
    sleeps at least until each chunk's wire time) and ends within seconds even on a loaded machine; the bytes
    arrive intact."""
    t0 = time.perf_counter()
    link = Link(RATE_GBPS, lambda: time.perf_counter() - t0, torch.device("cpu"), chunk_bytes=MIB)
    n = 4 * MIB
    tr = _transfer("a", n)
    try:
        link.submit(tr)
        link.done.get(timeout=WAIT_S)
    finally:
        link.close()
    expect_s = n * 8 / (RATE_GBPS * 1e9)
    assert expect_s * (1 - 1e-9) <= tr.end_s - tr.start_s < expect_s + 5.0
    assert torch.equal(tr.src, tr.dst)


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="needs os.sched_setaffinity")
def test_a_link_given_a_cpu_runs_its_thread_there():
    """Link(cpu=c): the link thread puts itself on CPU c (the harness's --pin-threads); the caller's CPUs stay."""
    before = os.sched_getaffinity(0)
    cpu = max(before)
    clock = SimClock()
    link = Link(RATE_GBPS, clock, torch.device("cpu"), chunk_bytes=CHUNK, sleep=clock.sleep, cpu=cpu)
    try:
        link.submit(_transfer("a", CHUNK))
        link.done.get(timeout=WAIT_S)  # the thread has run: it pinned itself before taking the transfer
        assert link.thread.native_id is not None
        assert os.sched_getaffinity(link.thread.native_id) == {cpu}
    finally:
        link.close()
    assert os.sched_getaffinity(0) == before
