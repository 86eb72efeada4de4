"""The round-robin link (network.round_robin_chunk_bytes) against a transcription of realrun's link thread, chunk by
chunk (realrun/link.py `Link._run`: a deque served one chunk at a time at the line rate, the served transfer put back
before the transfers that started during its chunk are taken), and its use by the simulator and the fit."""

from __future__ import annotations

import collections
import math
import random

import numpy as np
import pytest
import simpy

from simulator.calibrate import processor_sharing_s
from simulator.link import Link, RoundRobinLink, round_robin_s
from simulator.timers import call_in, run


def realrun_thread(start: list[float], size: list[float], rate: float, chunk: float) -> list[float]:
    """realrun's pacer with no wake-up latency: a wire clock; each chunk ends chunk/rate after the last one (or after
    the start of a transfer that found the link idle); at each chunk's end the served transfer goes back to the
    deque's end unless it is done, then the transfers started by then are appended."""
    order = sorted(range(len(start)), key=lambda i: start[i])
    pending = collections.deque(order)
    active: collections.deque[int] = collections.deque()
    left = list(size)
    end = [math.nan] * len(start)
    wire = 0.0
    while pending or active:
        if not active:
            i = pending.popleft()
            wire = max(wire, start[i])
            active.append(i)
        while pending and start[pending[0]] <= wire:
            active.append(pending.popleft())
        i = active.popleft()
        n = min(chunk, left[i])
        left[i] -= n
        wire += n / rate
        if left[i] <= 0:
            end[i] = wire
        else:
            active.append(i)
    return [e - s for e, s in zip(end, start)]


def workload(seed: int, n: int, chunk: float, rate: float, most: float = 14.0) -> tuple[list[float], list[float]]:
    rng = random.Random(seed)
    t, start, size = 0.0, [], []
    for _ in range(n):
        t += rng.expovariate(1.0) * most / 1.75 * chunk / rate  # busy most of the time, often two or three at once
        start.append(t)
        size.append(rng.uniform(0.3, most) * chunk)  # from under one chunk to `most`, rarely whole ones
    return start, size


@pytest.mark.parametrize("seed,most", [(s, 14.0) for s in range(6)] + [(s, 300.0) for s in range(3)])
def test_matches_realruns_thread(seed, most):
    """Short transfers (chunk by chunk) and long ones (whole rounds sent at once between events)."""
    chunk, rate = 1 << 20, 2.5e9 / 8
    start, size = workload(seed, 60, chunk, rate, most)
    got = round_robin_s(start, size, rate, chunk)
    want = realrun_thread(start, size, rate, chunk)
    np.testing.assert_allclose(got, want, rtol=1e-9, atol=1e-9)


def test_lone_transfer_and_fluid_agree():
    """One transfer at a time: bytes over the rate, as on the fluid link; overlapping ones finish sooner on average
    than fair sharing gives (first-come first-served is nearer: sizes of little spread)."""
    chunk, rate = 1 << 20, 1e9 / 8
    assert round_robin_s([0.0, 10.0], [3.5 * chunk, 2 * chunk], rate, chunk) == pytest.approx(
        [3.5 * chunk / rate, 2 * chunk / rate]
    )
    start, size = workload(1, 200, chunk, rate / 1.6)  # busier: most transfers overlap
    rr = np.array(round_robin_s(start, size, rate, chunk))
    ps = processor_sharing_s(np.array(start), np.array(size), rate)
    assert rr.sum() < ps.sum()
    assert abs(rr.sum() + np.sum(start) - max(np.array(start) + rr)) > 0  # not degenerate


def test_small_chunks_approach_fair_sharing():
    chunk, rate = 1 << 20, 1e9 / 8
    start, size = workload(2, 80, chunk, rate / 1.5)
    ps = processor_sharing_s(np.array(start), np.array(size), rate)
    coarse = np.array(round_robin_s(start, size, rate, chunk))
    fine = np.array(round_robin_s(start, size, rate, chunk / 256))
    assert np.abs(fine - ps).max() < np.abs(coarse - ps).max() / 20


def _link_run(link_cls, start, size, rate, chunk, events=()):
    env = simpy.Environment()
    link = link_cls(env, "l", rate, 0.0, chunk) if link_cls is RoundRobinLink else link_cls(env, "l", rate, 0.0)
    end: dict[int, float] = {}
    for i, (t0, n) in enumerate(zip(start, size)):
        call_in(env, t0, lambda _t, i=i, n=n: link.start(i, n, math.inf, lambda r, t: end.__setitem__(r, t)))
    for t0, fn in events:
        call_in(env, t0, lambda _t, fn=fn: fn(link))
    probes: list[tuple[float, float]] = []
    return env, link, end, probes


def test_drain_end_and_outage():
    """drain_end_s: every byte in flight sent one chunk at a time; an outage stops the chunk in service, which goes
    on when the capacity returns."""
    chunk, rate = 1 << 20, 1e9 / 8
    seen = {}
    env, link, end, _ = _link_run(
        RoundRobinLink,
        [0.0, 0.001],
        [3 * chunk, 2 * chunk],
        rate,
        chunk,
        events=[
            (0.002, lambda lk: seen.__setitem__("drain", lk.drain_end_s())),
            (0.010, lambda lk: lk.set_factor(0.0)),
            (0.020, lambda lk: lk.set_factor(1.0)),
        ],
    )
    run(env)
    assert seen["drain"] == pytest.approx(5 * chunk / rate)
    assert max(end.values()) == pytest.approx(5 * chunk / rate + 0.010)


@pytest.mark.parametrize(
    "aborted,ends_in_chunks",
    [
        (0, {1: 3.5, 2: 4.5}),  # 1 and 2 alternate from 0.5 chunk times on: 1 ends after 3 of their chunks, 2 after 4
        (1, {0: 3.0, 2: 4.0}),  # 0's chunk goes on, then 2, 0, 2
    ],
)
def test_abort_keeps_the_cycle(aborted, ends_in_chunks):
    """Aborting the transfer in service loses its chunk and the next one starts at once; aborting another leaves the
    chunk in service and the order of the rest."""
    chunk, rate = 1 << 20, 1e9 / 8
    c_s = chunk / rate
    env, link, end, _ = _link_run(
        RoundRobinLink,
        [0.0, 0.0, 0.0],
        [2 * chunk, 2 * chunk, 2 * chunk],
        rate,
        chunk,
        events=[(0.5 * c_s, lambda lk: lk.abort({aborted}))],
    )
    run(env)
    assert end == pytest.approx({k: v * c_s for k, v in ends_in_chunks.items()})


def test_fluid_link_unchanged_by_the_subclass():
    chunk, rate = 1 << 20, 1e9 / 8
    start, size = workload(3, 40, chunk, rate)
    env, link, end, _ = _link_run(Link, start, size, rate, chunk)
    run(env)
    ps = processor_sharing_s(np.array(start), np.array(size), rate)
    np.testing.assert_allclose([end[i] - start[i] for i in range(len(start))], ps, rtol=1e-9, atol=1e-12)


def test_the_simulator_moves_kv_on_the_round_robin_link(tmp_path):
    """A scenario with network.round_robin_chunk_bytes: its transfers take the times round_robin_s gives their starts
    and sizes (the simulated run's own), where the fluid link's are processor sharing's; a lone transfer the same."""
    from helpers import scenario
    from simulator.run import run_scenario

    trace = tmp_path / "w.csv"
    rows = "".join(f"{0.02 * i},{300 + 37 * (i % 5)},4\n" for i in range(12))  # a burst: transfers overlap
    trace.write_text("arrival_s,prompt_tokens,output_tokens\n" + rows)
    base = {
        "workload": {"trace_csv": str(trace), "arrival": {"kind": "trace"}, "requests": 12},
        "methods": ["baseline"],
        "network.bandwidth_gbps": 1.0,
        "network.efficiency": 1.0,
        "network.latency_s": 0.0,
    }
    chunk = 1 << 20
    out = {}
    for name, extra in (("fluid", {}), ("rr", {"network.round_robin_chunk_bytes": chunk})):
        df = run_scenario(scenario(**base, **extra)).requests.sort_values("transfer_start_s")
        out[name] = df
    for name, df in out.items():
        start = df["transfer_start_s"].to_numpy()
        took = (df["transfer_end_s"] - df["transfer_start_s"]).to_numpy()
        size = df["kv_wire_bytes"].to_numpy().astype(float)
        rate = 1e9 / 8
        if name == "rr":
            want = np.array(round_robin_s(start.tolist(), size.tolist(), rate, chunk))
        else:
            want = processor_sharing_s(start, size, rate)
        np.testing.assert_allclose(took, want, rtol=1e-9, atol=1e-9)
    assert not np.allclose(
        (out["rr"]["transfer_end_s"] - out["rr"]["transfer_start_s"]).to_numpy(),
        (out["fluid"]["transfer_end_s"] - out["fluid"]["transfer_start_s"]).to_numpy(),
    )


def test_a_trace_whose_link_sent_other_chunks_is_refused():
    """validate and calibrate refuse a realrun trace whose meta.json notes name another chunk than the scenario's,
    in one line naming the field; the shipped h200g scenario carries its recordings' 1 MiB."""
    from pathlib import Path

    from helpers import scenario
    from simulator.config import ScenarioError
    from simulator.load import load_scenario
    from simulator.measured import check_meta, link_chunk_bytes

    root = Path(__file__).resolve().parent.parent
    meta_path = root / "realrun/traces/h200_graphs/h200g_8b_mem_baseline_r7.5/meta.json"
    meta = __import__("json").loads(meta_path.read_text())
    assert link_chunk_bytes(meta) == 1 << 20
    shipped = load_scenario(root / "scenarios/measured/h200g_8b_mem.yaml")
    check_meta(meta, shipped, meta_path, "h200g_8b_mem.yaml")  # agrees: nothing raised
    with pytest.raises(ScenarioError, match=r"round_robin_chunk_bytes is 0") as e:
        check_meta({"notes": meta["notes"]}, scenario(), meta_path, "s.yaml")
    assert "\n" not in str(e.value)
