"""The iteration after a request leaves the batch (decode.leave_s_per_request).

realrun keeps its batch slots dense: when a request finishes, the last running request's KV moves into its slot, in
the next iteration (realrun/harness.py, `place`); the 27 h200_graphs recordings show those iterations 0.27-0.64 ms
longer than their neighbours. The simulator adds the time to the first iteration after the finish; the timelines
here are worked by hand.
"""

from __future__ import annotations

from typing import Any, cast

import pandas as pd
import pytest
import simpy

from decode_standins import FixedCost, Listener, records
from simulator.decode import DecodeReplica


def _finishes(leave_s: float, iterations: list[int], per_token_s: float = 0.0) -> list[float]:
    """Requests of 100 prompt tokens and the given decode iterations (10 ms each): the first joins at 0, the others
    at the first boundary (10 ms); leave_s per leaving request; the engine's KV copies at a batch change costing
    per_token_s per context token (decode.kv_placement_gb_per_s)."""
    env = simpy.Environment()
    rec = records(len(iterations), iterations)
    cost = FixedCost(0.010)
    cost.leave_s_per_request = leave_s
    cost.kv_placement_bytes_per_s = 1.0 if per_token_s else 0.0
    cost.placement_s_per_token = per_token_s
    rep = DecodeReplica(env, 0, cast(Any, cost), 64, rec)
    rep.listener = Listener()
    for rid in range(len(iterations)):
        rep.reserve(1.0)
        rep.arrive(rid)
    env.run()
    return [float(x) for x in rec.finish]


def test_the_iteration_after_a_finish_carries_the_leave():
    """Requests of 3, 5 and 5 iterations: the first leaves at 30 ms, the others (from 10 ms) at 60; with 2 ms per
    leaver the iteration after 30 ms takes 12 ms: 62. Three leaving at 40 ms ([4, 3, 3, 5]): the next iteration
    takes 6 ms more, the last request's fifth iteration ends at 66 ms."""
    assert _finishes(0.0, [3, 5, 5]) == pytest.approx([0.030, 0.060, 0.060], abs=1e-12)
    assert _finishes(0.002, [3, 5, 5]) == pytest.approx([0.030, 0.062, 0.062], abs=1e-12)
    assert _finishes(0.002, [4, 3, 3, 5]) == pytest.approx([0.040, 0.040, 0.040, 0.066], abs=1e-12)


def test_the_last_leaver_leaves_nothing_to_a_later_batch():
    """When the batch empties, nobody moves: a request arriving later starts without the leave time."""
    env = simpy.Environment()
    rec = records(2, iterations=3)
    cost = FixedCost(0.010)
    cost.leave_s_per_request = 0.002
    rep = DecodeReplica(env, 0, cast(Any, cost), 64, rec)
    rep.listener = Listener()
    rep.reserve(1.0)
    rep.arrive(0)

    def later():
        yield env.timeout(0.100)
        rep.reserve(1.0)
        rep.arrive(1)

    env.process(later())
    env.run()
    assert [float(x) for x in rec.finish] == pytest.approx([0.030, 0.130], abs=1e-12)


def test_trace_items_count_the_leavers_of_the_iteration_before():
    """Rows at 0, 10, 20, 30 ms (9 ms each; the CPU's gap after); a request finishing at the end of the second row
    (or, in a simulated trace, after its gap) leaves work to the third, and its KV copies with it."""
    from simulator.fit_items import _iteration_block
    from simulator.load import load_scenario
    from simulator.run import resolve

    it = pd.DataFrame(
        {
            "start_s": [0.0, 0.010, 0.020, 0.030],
            "end_s": [0.009, 0.019, 0.029, 0.039],
            "batch_size": [2, 2, 1, 1],
            "context_tokens": [200, 202, 101, 102],
        }
    )
    for finish in (0.019, 0.020):
        df = pd.DataFrame(
            {
                "decode_start_s": [0.0, 0.0],
                "prompt_tokens": [99, 99],
                "finish_s": [finish, 0.039],
                "prefill_start_s": [-1.0, -1.0],
                "transfer_start_s": [-1.0, -1.0],
                "transfer_end_s": [-0.5, -0.5],
            }
        )
        s = load_scenario("scenarios/measured/h200g_8b_sat.yaml")
        _, dec = resolve(s, "x").costs(s.methods[0])
        blk = _iteration_block(df, it, dec)
        assert list(blk["leaves"]) == [0, 0, 1], finish
        # the scenario's KV copies (decode.kv_placement_gb_per_s): the two joins' 100 tokens each (the prompt and
        # the prefill's token) in the first row, half a move of the stayer at its 101 tokens in the third (its
        # slot a coin flip from being the last), as the replica charges them (test_kv_placement_at_joins...)
        assert dec.kv_placement_bytes_per_s > 0
        want = [2 * dec.placement_s(100), 0.0, 0.5 * dec.placement_s(101)]
        assert list(blk["place_s"]) == pytest.approx(want, rel=1e-12), finish


def test_leavers_followed_only_by_new_requests_leave_nothing():
    """Request 0 (3 iterations) alone, request 1 waiting for a slot (max batch 1) joins as it leaves: nobody stayed,
    nothing moves: 1 starts at 30 ms without the leave time."""
    env = simpy.Environment()
    rec = records(2, iterations=3)
    cost = FixedCost(0.010)
    cost.leave_s_per_request = 0.002
    rep = DecodeReplica(env, 0, cast(Any, cost), 1, rec)
    rep.slots_at_join = True
    rep.listener = Listener()
    for rid in (0, 1):
        rep.reserve(1.0)
        rep.arrive(rid)
    env.run()
    assert [float(x) for x in rec.finish] == pytest.approx([0.030, 0.060], abs=1e-12)


def test_hostcal_measures_the_leave_beside_the_join(tmp_path):
    """hostcal rows of a graphs run: 0.25 ms of issue per iteration, 0.6 ms more per joining request in its first
    iteration, 0.2 ms more per leaver in the iteration after the batch shrank: fit_host gives both back."""
    from realrun.hostcal import fit_host

    batches = [1, 2, 2, 3, 3, 3, 2, 2, 4, 4, 2, 2, 2]
    rows, prev = [], 0
    for b in batches:
        issue = 0.00025 + 0.0006 * max(0, b - prev) + 0.0002 * max(0, prev - b)
        rows.append(
            dict(kind="decode", method="baseline", model="llama-3.1-8b", layers=2, decode_mode="graphs", **{"pass": 1})
            | dict(batch_size=b, tokens=0, host_issue_s=issue, wall_s=0.001)
        )
        prev = b
    p = tmp_path / "hostcal.csv"
    pd.DataFrame(rows).to_csv(p, index=False)
    got = fit_host([p])
    assert got["leave_s_per_request"] == pytest.approx(0.0002, abs=1e-12)
    assert got["host_serial_s_per_iteration"] > 0


def test_kv_placement_at_joins_and_after_leavers():
    """10 us per token: the first request's 100 tokens placed before the first iteration (1 ms: it ends at 11 ms),
    the second's before the second (22 ms); the first request's third iteration ends at 32 ms and it leaves. The
    batch keeps one: an even chance the leaver's slot was the last (nothing moves), so half a move of the stayer at
    its 102 tokens (joined at 100 in iteration 1, now iteration 3): 0.51 ms before the fourth iteration (42.51 ms);
    the second request's fifth and last iteration ends at 62.51 ms. Without a rate, no copy time at all
    (leave_s_per_request is 0 here either way)."""
    assert _finishes(0.0, [3, 5]) == pytest.approx([0.030, 0.060], abs=1e-12)
    assert _finishes(0.0, [3, 5], per_token_s=1e-5) == pytest.approx([0.032, 0.06251], abs=1e-12)


def test_placement_prices_a_requests_decode_memory_over_the_rate():
    """The FP16 8B holds 32 layers x 8 KV heads x 128 x (K, V) x 2 B = 131,072 B per token (blocks of one token):
    2,048 tokens over the measured scenario's 870 GB/s is 0.3086 ms; a scenario without the field copies nothing."""
    from simulator.load import load_scenario
    from simulator.run import resolve

    s = load_scenario("scenarios/measured/h200g_8b_sat.yaml")
    _, dec = resolve(s, "x").costs(next(m for m in s.methods if m.name == "baseline"))
    assert dec.placement_s(2048) == pytest.approx(2048 * 131072 / 870e9, rel=1e-12)
    s0 = s.model_copy(update={"decode": s.decode.model_copy(update={"kv_placement_gb_per_s": 0.0})})
    _, dec0 = resolve(s0, "x").costs(next(m for m in s0.methods if m.name == "baseline"))
    assert dec0.placement_s(2048) == 0.0
