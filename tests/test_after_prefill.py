"""The decode iterations after a prefill on a shared GPU (decode.after_prefill_slowdown_fraction and
decode.after_prefill_clock_fraction, placement shared_gpu).

On the H200 a prefill's GEMMs leave the next memory-bound decode iterations slower (realrun.transient,
realrun/traces/h200_transient): in all by a fraction of the prefill's time (that time saturating at S: S x
(1 - exp(-P / S)), decode.after_prefill_saturation_s), the k-th iteration by (1 - decay) decay^(k-1) of it, a later
prefill restarting it (its amplitude replaced, not added to); and the power limit's lower clocks slow the GPU's part
of every iteration by a fraction each prefill of P s raises by clock x (1 - exp(-P / tau)), fading with tau in time,
the prefills' fractions adding. The timelines here are worked by hand.
"""

from __future__ import annotations

import ast
import math
from pathlib import Path
from typing import Any, cast

import numpy as np
import pandas as pd
import pytest
import simpy

from decode_standins import FixedCost, Listener, records
from helpers import scenario
from realrun.transient import fit_transient, prefill_pass_s
from simulator.config import ScenarioError
from simulator.decode import DecodeReplica, transient_amplitude_s
from simulator.fit_items import after_prefill_s, clock_slowdown


class _Prefill:
    """A partner prefill that asks for the GPU at each (ask_s, hold_s) and holds it hold_s once given."""

    def __init__(self, env, rep, asks: list[tuple[float, float]]):
        self.env, self.rep, self.holds = env, rep, []
        for ask_s, hold_s in asks:
            env.process(self._ask(ask_s, hold_s))

    def _ask(self, at_s: float, hold_s: float):
        yield self.env.timeout(at_s)
        self.holds.append(hold_s)
        if self.rep.yield_gpu():
            self.try_start()

    def try_start(self) -> bool:
        self.env.process(self._hold(self.holds.pop(0)))
        return True

    def _hold(self, hold_s: float):
        yield self.env.timeout(hold_s)
        self.rep.resume_after_prefill(hold_s)


def _timeline(
    fraction: float,
    decay: float,
    second_at_s: float | None = None,
    clock: tuple[float, float] = (0.0, 1.0),
    asks: tuple[tuple[float, float], ...] = ((0.025, 0.020),),
    saturation_s: float = 0.0,
):
    """Request 0 (10 iterations of 10 ms, 1 ms of it the CPU's gap) joins at 0; a prefill asks for the GPU at 25 ms
    and holds it 20 ms (or `asks`); request 1 (10 iterations) arrives at second_at_s, if given; clock: the clock
    slowdown's (fraction, tau); saturation_s: decode.after_prefill_saturation_s."""
    env = simpy.Environment()
    rec = records(1 if second_at_s is None else 2)
    rep = DecodeReplica(env, 0, cast(Any, FixedCost(0.010, serial_s=0.001)), 64, rec)
    rep.listener = Listener()
    rep.after_prefill_fraction, rep.after_prefill_decay = fraction, decay
    rep.after_prefill_sat_s = saturation_s
    rep.clock_fraction, rep.clock_tau_s = clock
    rep.partner = cast(Any, _Prefill(env, rep, list(asks)))
    rep.reserve(1.0)
    rep.arrive(0)
    if second_at_s is not None:

        def second():
            yield env.timeout(second_at_s)
            rep.reserve(1.0)
            rep.arrive(1)

        env.process(second())
    env.run()
    return [float(x) for x in rec.finish]


def test_without_the_transient_the_prefill_only_pauses_decode():
    """Iterations at 0, 10, 20 ms; the prefill waits for the boundary at 30 ms, holds the GPU to 50 ms; 7 more
    iterations: 120 ms."""
    assert _timeline(0.0, 0.5) == pytest.approx([0.120], abs=1e-12)


def test_the_iterations_after_the_prefill_take_their_share():
    """fraction 0.5 of the 20 ms prefill: 10 ms in all, the 7 iterations after it take 10 x (1 - 0.5^7) ms."""
    assert _timeline(0.5, 0.5) == pytest.approx([0.120 + 0.010 * (1 - 0.5**7)], abs=1e-12)
    # decay 0: all of it on the first iteration after the prefill
    assert _timeline(0.5, 0.0) == pytest.approx([0.130], abs=1e-12)


def test_a_segment_cut_short_keeps_only_its_iterations_share():
    """Request 1 arrives at 62 ms, during the first iteration of the segment that began at 50 ms (10 ms + its share,
    5 ms): the segment is cut there, at 65 ms. The remaining 5 ms: request 0's last 6 iterations take
    5 x (1 - 0.5^6), so it finishes as if nothing had joined (every iteration costs the same here); request 1's last
    4 iterations take 5 x 0.5^6 x (1 - 0.5^4)."""
    first, second = _timeline(0.5, 0.5, second_at_s=0.062)
    assert first == pytest.approx(0.065 + 0.005 * (1 - 0.5**6) + 0.060, abs=1e-12)
    assert second == pytest.approx(first + 0.005 * 0.5**6 * (1 - 0.5**4) + 0.040, abs=1e-12)


def test_the_clock_slowdown_fades_in_time_over_the_iterations_after_the_prefill():
    """clock 0.1, tau 50 ms: the 20 ms prefill ending at 50 ms leaves the GPU's 9 ms of each iteration
    0.1 x (1 - exp(-20 / 50)) = 3.30 % slower, fading with 50 ms: the m-th of the 7 iterations after it by
    0.0330 x 9 ms x r^m, r = exp(-10 / 50) (its first iteration's wall time over tau)."""
    r = np.exp(-0.010 / 0.050)
    extra = 0.1 * (1 - np.exp(-0.4)) * 0.009 * sum(r**m for m in range(7))
    assert _timeline(0.0, 0.5, clock=(0.1, 0.050)) == pytest.approx([0.120 + extra], abs=1e-12)
    # with the after-prefill transient too, the two add
    both = 0.010 * (1 - 0.5**7) + extra
    assert _timeline(0.5, 0.5, clock=(0.1, 0.050)) == pytest.approx([0.120 + both], abs=1e-12)


def test_the_prefills_clock_slowdowns_add_up():
    """Two 20 ms prefills asking at 25 and 75 ms: the first runs 30-50 ms; iterations from 50 ms, the m-th longer by
    s1 x 9 ms x r^m (s1 = 0.1 x (1 - exp(-20 / 50))); the second asks during the third (50 + 20 ms and shares .. ),
    runs from that iteration's end e to e + 20 ms, and leaves s1 faded over e + 20 - 50 ms plus s1; the 4 after it
    take that x 9 ms x r^m."""
    tau = 0.050
    s1 = 0.1 * (1 - np.exp(-0.020 / tau))
    r = np.exp(-0.010 / tau)
    e = 0.080 + s1 * 0.009 * (1 + r + r**2)  # three iterations after the first prefill, with their shares
    s2 = s1 * np.exp(-(e + 0.020 - 0.050) / tau) + s1
    want = e + 0.020 + 0.040 + s2 * 0.009 * sum(r**m for m in range(4))
    assert _timeline(0.0, 0.5, clock=(0.1, tau), asks=((0.025, 0.020), (0.075, 0.020))) == pytest.approx(
        [want], abs=1e-12
    )


def test_a_long_prefill_leaves_a_saturated_transient():
    """fraction 0.5, decay 0.5, saturation 10 ms: the 20 ms prefill leaves 0.5 x 10 ms x (1 - exp(-2)) = 4.32 ms
    over the 7 iterations after it, (1 - 0.5^7) of it (against 0.5 x 20 ms = 10 ms unsaturated); a 1 ms one nearly
    its own 0.5 ms (10 x (1 - exp(-0.1)) = 0.952 ms of prefill)."""
    amp = 0.5 * 0.010 * (1 - np.exp(-2.0))
    assert _timeline(0.5, 0.5, saturation_s=0.010) == pytest.approx([0.120 + amp * (1 - 0.5**7)], abs=1e-12)
    amp = 0.5 * 0.010 * (1 - np.exp(-0.1))
    got = _timeline(0.5, 0.5, saturation_s=0.010, asks=((0.025, 0.001),))
    assert got == pytest.approx([0.101 + amp * (1 - 0.5**7)], abs=1e-12)
    assert transient_amplitude_s(0.001, 0.010) == pytest.approx(0.000952, abs=1e-6)
    assert transient_amplitude_s(0.02, 0.0) == 0.02  # 0: unsaturated


def test_refused_where_not_modelled():
    with pytest.raises((ScenarioError, ValueError), match="after_prefill_slowdown_fraction.*shared_gpu only"):
        scenario(**{"decode.after_prefill_slowdown_fraction": 0.02})
    with pytest.raises((ScenarioError, ValueError), match="prefill.after_prefill_slowdown_fraction"):
        scenario(placement="shared_gpu", **{"prefill.after_prefill_slowdown_fraction": 0.02})
    scenario(placement="shared_gpu", **{"decode.after_prefill_slowdown_fraction": 0.02})
    with pytest.raises((ScenarioError, ValueError), match="after_prefill_clock_fraction.*shared_gpu only"):
        scenario(**{"decode.after_prefill_clock_fraction": 0.02})
    with pytest.raises((ScenarioError, ValueError), match="prefill.after_prefill_clock_fraction"):
        scenario(placement="shared_gpu", **{"prefill.after_prefill_clock_fraction": 0.02})
    scenario(placement="shared_gpu", **{"decode.after_prefill_clock_fraction": 0.02})
    with pytest.raises((ScenarioError, ValueError), match="after_prefill_saturation_s.*shared_gpu only"):
        scenario(**{"decode.after_prefill_saturation_s": 0.07})
    with pytest.raises((ScenarioError, ValueError), match="prefill.after_prefill_saturation_s"):
        scenario(placement="shared_gpu", **{"prefill.after_prefill_saturation_s": 0.07})


def test_a_shared_gpu_run_slows_by_it():
    from simulator.run import run_scenario

    common = {"methods": ["baseline"], "workload.requests": 40}
    base = run_scenario(scenario(placement="shared_gpu", **common)).requests["finish_s"].max()
    slow = (
        run_scenario(scenario(placement="shared_gpu", **common, **{"decode.after_prefill_slowdown_fraction": 0.05}))
        .requests["finish_s"]
        .max()
    )
    assert slow > base


def test_trace_items_carry_it_by_their_distance_from_the_prefill():
    """A prefill from 1.0 to 1.1 s (quantize end); iterations start at 0.95, 1.1, 1.12, 1.14: the first is before
    it, the next three are 0, 1, 2 iterations after it."""
    df = pd.DataFrame({"prefill_start_s": [1.0], "quantize_end_s": [1.1]})
    it = pd.DataFrame({"start_s": [0.95, 1.1, 1.12, 1.14]})
    got = after_prefill_s(df, it, it["start_s"].to_numpy(), 0.1, 0.5)
    assert got == pytest.approx([0.0, 0.01 * 0.5, 0.01 * 0.25, 0.01 * 0.125], abs=1e-15)
    # saturating at 50 ms: 0.1 x 50 ms x (1 - exp(-2)) in place of 0.1 x 100 ms
    got = after_prefill_s(df, it, it["start_s"].to_numpy(), 0.1, 0.5, saturation_s=0.05)
    amp = 0.1 * 0.05 * (1 - np.exp(-2.0))
    assert got == pytest.approx([0.0, amp * 0.5, amp * 0.25, amp * 0.125], abs=1e-15)


def test_trace_items_carry_the_clock_slowdown_by_the_time_since_each_prefill():
    """Prefills of 0.1 s ending at 1.1 s and of 0.05 s ending at 1.2 s, clock 0.02, tau 0.1 s: nothing before the
    first; 0.02 x (1 - exp(-0.1 / 0.1)) = 1.26 % at its end, faded by exp(-0.05 / 0.1) 50 ms later; after the
    second, both (its own 0.02 x (1 - exp(-0.5)))."""
    df = pd.DataFrame({"prefill_start_s": [1.0, 1.15], "quantize_end_s": [1.1, 1.2]})
    t = np.array([1.05, 1.1, 1.15, 1.25])
    got = clock_slowdown(df, t, 0.02, 0.1)
    s1, s2 = 0.02 * (1 - np.exp(-1.0)), 0.02 * (1 - np.exp(-0.5))
    want = [0.0, s1, s1 * np.exp(-0.5), s1 * np.exp(-1.5) + s2 * np.exp(-0.5)]
    assert got == pytest.approx(want, abs=1e-15)


def test_trace_items_price_a_simulated_run_with_the_clock_to_its_approximation(tmp_path):
    """A run simulated with the clock slowdown (the H200 scenario's), written as a trace: its iteration items at the
    true values agree with the simulator's cadence to within 2 % of the clock's seconds (the simulator takes each
    segment's fade at its first iteration's length: simulator/decode.py, _clock_segment), though the clock adds
    far more than that."""
    import yaml

    from simulated_runs import TRUE, raw_system, simulate, write_realrun
    from simulator.calibrate import load_index, predict

    raw = raw_system(seed=3, clock=True)
    assert raw["decode"]["after_prefill_clock_fraction"] > 0
    tmp = tmp_path
    (tmp / "s.yaml").write_text(yaml.safe_dump(raw))
    rows = []
    for method, df, it in simulate(raw, TRUE, methods=["hack"]):
        write_realrun(tmp / method, method, df, it)
        rows.append(f"{method},s.yaml")
    (tmp / "index.csv").write_text("trace,scenario\n" + "\n".join(rows) + "\n")
    (td,) = load_index(tmp / "index.csv")
    blk = td.blocks["iteration"]
    v = {**td.values0, **TRUE}
    with_clock = predict(td, "iteration", v)
    slow = blk.pop("clock_slowdown")
    without = predict(td, "iteration", v)
    blk["clock_slowdown"] = slow
    share = with_clock - without
    err = with_clock - blk["meas"]
    assert np.sqrt(np.mean(share**2)) > 1e-5  # tens of microseconds per iteration
    assert np.sqrt(np.mean(err**2)) <= 0.02 * np.sqrt(np.mean(share**2))
    assert np.abs(err).max() <= 0.05 * np.abs(share).max()


def _synthetic(fraction: float, decay: float, seed: int, saturation_s: float = 1e9) -> pd.DataFrame:
    """Transient runs as realrun.transient writes them: 8 ms iterations growing 2 us per context token, 0.2 %
    noise, after each prefill of P s the k-th iteration fraction x S (1 - exp(-P / S)) x (1 - decay) decay^(k-1)
    longer (S = saturation_s: about P by default)."""
    rng = np.random.default_rng(seed)
    rows, ctx = [], 2048
    events = [("prefill", 256, 0.012), ("prefill", 3072, 0.085), ("prefill", 16384, 0.6), ("none", 0, 0.0)]
    for cycle in range(4):
        for event, tokens, event_s in events:
            amp = -saturation_s * np.expm1(-event_s / saturation_s)
            for k in range(1, 17):
                ctx += 1
                wall = 0.008 + 2e-6 * (ctx - 2048) + fraction * amp * (1 - decay) * decay ** (k - 1)
                rows.append(
                    dict(
                        set="m:1",
                        method="baseline",
                        batch_size=8,
                        cycle=cycle,
                        event=event,
                        event_tokens=tokens,
                        event_s=event_s,
                        k=k,
                        max_context=ctx,
                        wall_s=wall * (1 + 0.002 * rng.standard_normal()),
                    )
                )
    return pd.DataFrame(rows)


def test_fit_recovers_known_values(tmp_path):
    p = tmp_path / "t.csv"
    _synthetic(0.02, 0.7, seed=3, saturation_s=0.08).to_csv(p, index=False)
    got = fit_transient([p])
    assert got["after_prefill_slowdown_fraction"] == pytest.approx(0.02, abs=0.002)
    assert got["after_prefill_decay_per_iteration"] == pytest.approx(0.7, abs=0.05)
    assert got["after_prefill_saturation_s"] == pytest.approx(0.08, rel=0.15)
    assert got["prefills"] == 12
    # a transient that does not saturate (linear in the prefill's time up to 0.6 s): the saturation comes out long
    _synthetic(0.02, 0.7, seed=3).to_csv(p, index=False)
    got = fit_transient([p])
    assert got["after_prefill_slowdown_fraction"] == pytest.approx(0.02, abs=0.002)
    assert got["after_prefill_saturation_s"] > 3.0


def _duty_run(clock: float, tau_s: float, seed: int, fraction: float = 0.01, decay: float = 0.7) -> pd.DataFrame:
    """Duty runs as realrun.transient --duty writes them (t_s, unix_s from 1e9 s): 8 ms iterations (context growing 1
    token each, 2 us per token) through 3-s blocks at 0, 0.5, 0 and 0.25 of the time in 40 ms prefills; each
    iteration (1 + clock x sum (1 - exp(-P / tau)) exp(-dt / tau)) times its level plus the after-prefill
    transient, 0.3 % noise."""
    rng = np.random.default_rng(seed)
    rows, t, ctx, ends = [], 0.0, 2048, []
    for block, duty in enumerate((0.0, 0.5, 0.0, 0.25, 0.0)):
        t0, pre, k, last = t, 0.0, 0, 0.0
        while t - t0 < 3.0:
            if duty and pre < duty * (t - t0):
                t += 0.040
                pre, k, last = pre + 0.040, 0, 0.040
                ends.append(t)
            ctx += 1
            k += 1 if (k or pre) else 0
            s = sum(-np.expm1(-0.040 / tau_s) * np.exp(-(t - e) / tau_s) for e in ends if t - e < 20 * tau_s)
            level = 0.008 + 2e-6 * (ctx - 2048)
            fast = fraction * last * (1 - decay) * decay ** (k - 1) if k else 0.0
            wall = (level * (1 + clock * s) + fast) * (1 + 0.003 * rng.standard_normal())
            rows.append(
                dict(
                    set="m:1",
                    method="baseline",
                    batch_size=32,
                    block=block,
                    duty=duty,
                    t_s=t,
                    unix_s=1e9 + t + wall,
                    k=k,
                    event_s=last,
                    max_context=ctx,
                    wall_s=wall,
                )
            )
            t += wall + 0.0006
    return pd.DataFrame(rows)


def test_fit_recovers_the_clock_slowdown(tmp_path):
    p = tmp_path / "duty.csv"
    _duty_run(0.02, 0.12, seed=4).to_csv(p, index=False)
    got = fit_transient([p], clock_tau_s=0.12)
    assert got["after_prefill_clock_fraction"] == pytest.approx(0.02, abs=3 * got["clock_fraction_se"] + 1e-3)
    assert got["after_prefill_slowdown_fraction"] == pytest.approx(0.01, abs=3 * got["fraction_se"] + 1e-3)
    # without the time constant the clock term stays out
    assert "after_prefill_clock_fraction" not in fit_transient([p])


def test_the_clock_time_constant_from_a_clock_log(tmp_path):
    """A clock log every 100 ms beside the duty run: 1,980 MHz less 300 x exp(-dt / 0.12 s) after each block's last
    prefill (the deficit during the blocks at 150 MHz): tau comes back."""
    from realrun.transient import clock_time_constant

    d = _duty_run(0.02, 0.12, seed=4)
    p = tmp_path / "duty.csv"
    d.to_csv(p, index=False)
    ends = []
    for blk in (1, 3):
        first = d[(d["block"] == blk) & (d["k"] == 1)]
        ends.append(float((first["unix_s"] - first["wall_s"]).max()))
    ts = np.arange(1e9, 1e9 + float(d["t_s"].max()), 0.1)
    clock = np.full(len(ts), 1980.0)
    for blk, e in zip((1, 3), ends):
        inside = d[d["block"] == blk]
        clock[(ts >= inside["unix_s"].min()) & (ts < e)] = 1830.0
        after = ts >= e
        clock[after] -= 300 * np.exp(-(ts[after] - e) / 0.12)
    stamps = pd.to_datetime(ts, unit="s").strftime("%Y/%m/%d %H:%M:%S.%f").str[:-3]
    smi = tmp_path / "smi.csv"
    pd.DataFrame({"timestamp": stamps, "clocks.current.sm [MHz]": clock.round()}).to_csv(smi, index=False)
    got = clock_time_constant(smi, [p])
    assert got["blocks"] == 2
    assert got["after_prefill_clock_time_constant_s"] == pytest.approx(0.12, rel=0.1)


def test_a_fitted_engine_with_it_is_refused_off_a_shared_gpu(tmp_path):
    """An engine file that fitted the after-prefill fraction would change nothing under placement separate: refused
    in one line naming it and the placement; under shared_gpu it applies."""
    import json

    import yaml

    from simulator.engine import PARAMETERS
    from simulator.load import load_scenario

    p = PARAMETERS["decode.after_prefill_slowdown_fraction"]
    doc = {
        "kind": "hacksim-engine-calibration",
        "schema_version": 1,
        "engine": "test",
        "parameters": {
            p.name: {
                "value": 0.03,
                "stderr": 0.004,
                "unit": p.unit,
                "fitted": True,
                "scope": p.scope,
                "shape": p.shape,
                "prior": {"centre": 0.0129, "width": p.prior_width},
            }
        },
        "provenance": {"traces": []},
    }
    (tmp_path / "engine.json").write_text(json.dumps(doc))
    raw = yaml.safe_load((Path(__file__).resolve().parent.parent / "scenarios/measured/h200g_8b_sat.yaml").read_text())
    raw["calibration"] = {"engine": "engine.json"}
    scen = tmp_path / "s.yaml"
    scen.write_text(yaml.safe_dump(raw))
    assert load_scenario(scen).decode.after_prefill_slowdown_fraction == 0.03
    raw["placement"] = "separate"
    raw["decode"] = {k: v for k, v in raw["decode"].items() if not k.startswith("after_prefill")}
    scen.write_text(yaml.safe_dump(raw))
    with pytest.raises(ScenarioError) as e:
        load_scenario(scen)
    msg = str(e.value)
    assert "decode.after_prefill_slowdown_fraction" in msg and "placement separate" in msg and "\n" not in msg


def _xfer_row(rate, cycle, event, since_s, busy, wall_s, **more) -> dict:
    """One row as realrun.transient --xfer-gbps writes it (set m:1, method baseline, batch 32 unless `more` says)."""
    row = dict(set="m:1", method="baseline", batch_size=32, link_gbps=rate, cycle=cycle, event=event, k=0)
    row.update(since_start_s=since_s, busy=busy, gap_s=0.0003, max_context=2048, wall_s=wall_s)
    row.update(more)
    return row


def _xfer_windows_rows(rng, rates, extra_s, noise: float, **more) -> list[dict]:
    """A run's decode windows as realrun.transient --xfer-gbps writes them: per rate, four cycles of a short transfer
    (16 iterations), a long one (48) and none (16), 8.5 ms an iteration plus extra_s(rate) where it starts 10 ms or more
    into a transfer, times (1 + noise x a normal draw)."""
    rows = []
    for rate in rates:
        for cycle in range(4):
            for event, count in (("short", 16), ("long", 48), ("none", 16)):
                for k in range(1, count + 1):
                    since = (k - 1) * 0.009 if event != "none" else -1.0
                    busy = int(event == "long" or (event == "short" and since < 0.010))
                    extra = extra_s(rate) if busy and since >= 0.010 else 0.0
                    wall = (0.0085 + extra) * (1 + noise * rng.standard_normal())
                    rows.append(_xfer_row(rate, cycle, event, since, busy, wall, k=k, **more))
    return rows


def test_fit_xfer_recovers_the_busy_link_slope(tmp_path):
    """xfer runs made with 0.63 ms of host time per iteration slowed by 0.02 x the link's Gbps while a transfer is
    in flight (past its first 10 ms), 1 % noise: the fit gives a = 1 and b = 0.02 within their errors."""
    from realrun.transient import fit_xfer

    rng = np.random.default_rng(5)
    rows = _xfer_windows_rows(rng, (2.5, 10.0, 40.0), lambda rate: 0.00063 * 0.02 * rate, 0.01)
    p = tmp_path / "x.csv"
    pd.DataFrame(rows).to_csv(p, index=False)
    got = fit_xfer([p])
    a_se, b_se = got["stderr"]
    assert abs(got["link_busy_host_factor"] - 1.0) <= 3 * a_se + 1e-3
    assert abs(got["link_busy_host_factor_per_gbps"] - 0.02) <= 3 * b_se + 1e-4
    assert got["windows"] == 12
    other = tmp_path / "x4.csv"  # the same windows with 4 MiB chunks (realrun.transient --xfer-chunk-mib 4)
    pd.DataFrame(rows).assign(chunk_bytes=4 << 20).to_csv(other, index=False)
    assert fit_xfer([other])["windows"] == 12
    with pytest.raises(ValueError, match="several link chunks"):  # a file before the column: 1 MiB chunks
        fit_xfer([p, other])


def test_fit_xfer_prefill_recovers_the_prefill_floors_busy_level(tmp_path):
    """xfer runs with prefill rows (realrun.transient --xfer-prefill): on a 32-layer set FP16's 128-token prefill
    (12 ms idle, host-bound) slowed by 1.05 + 0.008 x the link's Gbps with a long transfer in flight, its 384-token
    one less (1.02 + 0.004), HACK's more, an 8-layer set's not at all; 1 % noise; a pair whose transfer ended first
    (busy 0) is left out and the decode rows do not enter. The value is the 32-layer set's FP16 line at its shortest
    prompt, within its errors; every (set, method, prompt) has its own line."""
    from realrun.transient import fit_xfer, fit_xfer_prefill

    rng = np.random.default_rng(7)
    rows = []
    truth = {  # (set, method, prompt): idle seconds, a, b
        ("m:32", "baseline", 128): (0.012, 1.05, 0.008),
        ("m:32", "baseline", 384): (0.015, 1.02, 0.004),
        ("m:32", "hack", 128): (0.028, 1.10, 0.016),
        ("m:8", "baseline", 128): (0.008, 1.0, 0.0),
    }
    for rate in (2.5, 10.0, 25.0, 40.0):
        for cycle in range(3):
            for k in range(1, 17):  # decode rows: a quiet window and a busy one, the busy 0.63 ms x 0.02/Gbps longer
                rows.append(_xfer_row(rate, cycle, "none", -1.0, 0, 0.0085 * (1 + 0.01 * rng.standard_normal()), k=k))
                rows.append(_xfer_row(rate, cycle, "long", 0.01 + k * 0.009, 1, 0.0085 + 0.00063 * 0.02 * rate, k=k))
            for (set_name, method, tokens), (idle_s, a, b) in truth.items():
                for since, busy, wall in ((-1.0, 0, idle_s), (0.010, 1, idle_s * (a + b * rate))):
                    wall *= 1 + 0.01 * rng.standard_normal()
                    rows.append(
                        _xfer_row(
                            rate, cycle, "prefill", since, busy, wall, set=set_name, method=method, prompt_tokens=tokens
                        )
                    )
    # its transfer ended before the prefill did: not a busy prefill
    rows.append(_xfer_row(40.0, 0, "prefill", 0.010, 0, 1.0, set="m:32", prompt_tokens=128))
    p = tmp_path / "x.csv"
    pd.DataFrame([{"prompt_tokens": 0, **r} for r in rows]).to_csv(p, index=False)
    got = fit_xfer_prefill([p])
    a_se, b_se = got["stderr"]
    assert got["from"] == "m:32 baseline 128"
    assert abs(got["link_busy_prefill_host_factor"] - 1.05) <= 3 * a_se + 1e-3
    assert abs(got["link_busy_prefill_host_factor_per_gbps"] - 0.008) <= 3 * b_se + 1e-4
    assert set(got["lines"]) == {" ".join(map(str, k)) for k in truth}
    assert got["lines"]["m:32 baseline 128"]["pairs"] == 4 * 3
    assert got["lines"]["m:32 hack 128"]["b"] == pytest.approx(0.016, abs=0.002)
    assert got["lines"]["m:8 baseline 128"]["b"] == pytest.approx(0.0, abs=0.001)
    assert got["timing"] == "wall_s"
    # the prefill rows stay out of the decode loop's fit
    assert fit_xfer([p])["link_busy_host_factor_per_gbps"] == pytest.approx(0.02, abs=2e-3)
    # with the forward's own seconds (forward_s) the fit reads them: a quantize step of 10 ms that the link does
    # not slow (wall_s = forward_s + 0.010) no longer dilutes the ratio
    frame = pd.DataFrame([{"prompt_tokens": 0, **r} for r in rows])
    frame["forward_s"] = frame["wall_s"]
    frame.loc[frame["event"] == "prefill", "wall_s"] += 0.010
    frame.to_csv(p, index=False)
    got = fit_xfer_prefill([p])
    assert got["timing"] == "forward_s"
    assert abs(got["link_busy_prefill_host_factor_per_gbps"] - 0.008) <= 3 * got["stderr"][1] + 1e-4
    assert fit_xfer_prefill([p])["lines"]["m:32 baseline 128"]["b"] > 0.006
    # files without prefill rows: one line saying so
    pd.DataFrame([r for r in rows if r["event"] != "prefill"]).to_csv(p, index=False)
    with pytest.raises(ValueError, match="no prefill rows"):
        fit_xfer_prefill([p])


def test_the_xfer_fits_pair_rows_within_each_file(tmp_path):
    """Two files are two runs (realrun.transient --fit on several): their cycles share numbers, but a pair is one
    run's busy prefill over that run's idle one, never across runs, and each file is timed by its own columns. Run A
    (forward_s, its wall_s 1 s: never read) 10 ms idle and 12 ms busy, run B (wall_s only) 20 and 22: the ratios
    are 1.2 and 1.1, their mean 1.15 (pooled rows would give 34 / 30 = 1.133); the decode fit counts each run's
    windows."""
    from realrun.transient import fit_xfer, fit_xfer_prefill

    paths = []
    for name, (idle_s, busy_s), timed in (("a", (0.010, 0.012), "forward_s"), ("b", (0.020, 0.022), "wall_s")):
        rows = []
        for rate in (10.0, 40.0):
            for k in range(1, 9):
                rows.append(_xfer_row(rate, 0, "none", -1.0, 0, 0.0085, k=k))
                rows.append(_xfer_row(rate, 0, "long", 0.01 + k * 0.009, 1, 0.0085 + 0.00063 * 0.02 * rate, k=k))
            for since, busy, t in ((-1.0, 0, idle_s), (0.010, 1, busy_s)):
                more = {"forward_s": t} if timed == "forward_s" else {}
                wall = 1.0 if timed == "forward_s" else t
                rows.append(_xfer_row(rate, 0, "prefill", since, busy, wall, set="m:32", prompt_tokens=128, **more))
        p = tmp_path / f"{name}.csv"
        pd.DataFrame([{"prompt_tokens": 0, **r} for r in rows]).to_csv(p, index=False)
        paths.append(p)
    got = fit_xfer_prefill(paths)
    line = got["lines"]["m:32 baseline 128"]
    assert line["pairs"] == 4
    assert line["mean_ratio_by_gbps"] == {"10": 1.15, "40": 1.15}
    assert got["timing"] == "forward_s+wall_s"
    assert fit_xfer(paths)["windows"] == 4


def test_the_committed_probe_runs_give_the_h200_scenarios_values(capsys):
    """realrun.transient --fit on every committed file (realrun/traces/h200_transient/*.csv, the scenarios' command)
    gives the six numbers the h200g scenarios carry: they come from the probes, not from a trace. The files of other
    tools in the folder (prefillcal, placecal) are named as skipped; both clock logs (dutylong's and dutysat's) are
    read."""
    import glob

    import yaml

    from realrun.transient import main

    root = Path(__file__).resolve().parent.parent
    files = sorted(glob.glob(str(root / "realrun/traces/h200_transient/*.csv")))
    assert main(["--fit", *files]) == 0
    out, err = capsys.readouterr()
    assert "prefillcal.csv: not a realrun.transient file" in err and "placecal.csv" not in out
    got = {}
    for line in out.splitlines():
        got.update(ast.literal_eval(line))
    assert got["blocks"] == 12  # the blocks a clock log covers: dutylong's 8 and dutysat's 4
    scen = yaml.safe_load((root / "scenarios/measured/h200g_8b_sat.yaml").read_text())
    for name in (
        "after_prefill_slowdown_fraction",
        "after_prefill_decay_per_iteration",
        "after_prefill_saturation_s",
        "after_prefill_clock_fraction",
        "after_prefill_clock_time_constant_s",
    ):
        assert got[name] == scen["decode"][name], name
    # the CPU's time a pass through a prefill adds, from the files that time iterations on the host's clock
    assert got["settings"] == 27
    assert round(got["prefill.host_serial_s_per_iteration"], 5) == scen["prefill"]["host_serial_s_per_iteration"]


def test_prefill_pass_s_recovers_a_known_pass(tmp_path):
    """A duty file whose passes through a prefill take 0.3 ms more CPU than the plain ones (0.2 ms) gives 0.3 ms; a
    transient file timed on unix_s the same; a file with no prefill between its iterations is refused."""
    rows, t = [], 0.0
    for i in range(40):
        k = i % 4 + 1  # a prefill of 20 ms before every fourth iteration
        pre = 0.020 if k == 1 else 0.0
        t += pre + (0.0005 if k == 1 else 0.0002)  # the CPU's time before this iteration
        rows.append(
            dict(
                set="m:1",
                method="hack",
                batch_size=8,
                block=0,
                duty=0.5,
                t_s=t,
                k=k,
                event_s=0.020,
                max_context=2048,
                wall_s=0.005,
            )
        )
        t += 0.005
    duty = tmp_path / "duty.csv"
    pd.DataFrame(rows).to_csv(duty, index=False)
    assert prefill_pass_s([duty])["prefill.host_serial_s_per_iteration"] == pytest.approx(0.0003)
    tr = [dict(r, event="prefill", unix_s=r["t_s"] + r["wall_s"]) for r in rows]
    for r in tr:
        del r["block"], r["t_s"]
    trans = tmp_path / "trans.csv"
    pd.DataFrame(tr).to_csv(trans, index=False)
    assert prefill_pass_s([trans])["prefill.host_serial_s_per_iteration"] == pytest.approx(0.0003)
    flat = tmp_path / "flat.csv"
    pd.DataFrame([dict(r, k=2) for r in rows]).to_csv(flat, index=False)
    with pytest.raises(ValueError):
        prefill_pass_s([flat])


def test_mix_excess_and_fit_route_every_probe_file(tmp_path, capsys):
    """realrun.transient --fit takes every probe file at once (the scenario files' command): the mix runs give the
    spread batch's excess over the uniform one (5 % here) and the attention's padding share (none for a set no
    scenario prices), the duty runs each block's excess, the rest their fits."""
    from realrun.transient import main, mix_excess

    rows = [
        dict(set="m:1", method="hack", batch_size=8, kind=kind, k=k, max_context=2048, context_tokens=16384, wall_s=w)
        for kind, w in (("uniform", 0.010), ("spread", 0.0105))
        for k in range(4)
    ]
    mix = tmp_path / "mix.csv"
    pd.DataFrame(rows).to_csv(mix, index=False)
    assert mix_excess([mix]) == {"m:1 hack B8": pytest.approx(5.0)}
    duty = tmp_path / "duty.csv"
    _duty_run(0.02, 0.12, seed=4).to_csv(duty, index=False)
    assert main(["--fit", str(mix), str(duty)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert "m:1 hack B8" in out[0] and "'m:1 hack': {'share': None" in out[1] and "duty m:1 baseline B32" in out[2]
    assert "after_prefill_slowdown_fraction" in out[3]


def test_duty_excess_recovers_each_blocks_slowdown(tmp_path):
    """A duty file whose iterations grow with the context (a line) and run 3 % over it through the two 0.5 blocks
    (5 % in the iterations right after a prefill, which the zero blocks' line leaves out) gives 0 / 3 / 3 / 0."""
    from realrun.transient import duty_excess

    rows, ctx = [], 2048
    for block, duty in enumerate((0.0, 0.5, 0.5, 0.0)):
        for i in range(60):
            k = (i % 6) + 1 if duty else (i + 1 if block == 3 and i < 4 else 0)
            over = 0.05 if (duty and k == 1) or (block == 3 and 0 < k) else (0.03 if duty else 0.0)
            wall = (0.008 + 1e-6 * ctx) * (1.0 + over)
            rows.append(
                dict(
                    set="m:1",
                    method="hack",
                    batch_size=32,
                    block=block,
                    duty=duty,
                    t_s=0.0,
                    k=k,
                    event_s=0.01,
                    max_context=ctx,
                    wall_s=wall,
                )
            )
            ctx += 1
    p = tmp_path / "duty.csv"
    pd.DataFrame(rows).to_csv(p, index=False)
    assert duty_excess([p]) == {"duty m:1 hack B32": [0.0, 3.0, 3.0, 0.0]}


def test_a_sustained_share_of_prefill_does_not_build_up():
    """The committed dutysat runs (24 s at 50 % prefill duty beside decode batches of 32): the FP16 iterations' slowdown
    over the zero-duty line is as large in the last four 3-s blocks as in the first four (within a point: no slower
    thermal term), and the zero-duty blocks after them are back on the line."""
    import glob

    from realrun.transient import duty_excess

    root = Path(__file__).resolve().parent.parent
    got = duty_excess(sorted(glob.glob(str(root / "realrun/traces/h200_transient/dutysat_*.csv"))))
    for name in ("dutysat_8b llama-3.1-8b:32 baseline B32", "dutysat_70b llama-3.1-70b:8 baseline B32"):
        blocks = got[name]
        assert len(blocks) == 11
        assert min(blocks[1:9]) > 1.0  # the power cap's slowdown holds through every 50 % block
        assert abs(np.mean(blocks[5:9]) - np.mean(blocks[1:5])) < 1.0, blocks
        assert max(abs(x) for x in blocks[9:]) < 0.5, blocks


def _xfer_chunk_runs(tmp_path, rates, ceiling_kchunks_s: float) -> list:
    """xfer runs at 1 and 4 MiB chunks whose extra host time per iteration is 0.002 ms per Gbps (bytes) plus 0.04 ms
    per thousand chunks a second up to `ceiling_kchunks_s`, 0.3 % noise and one 60 ms hiccup."""
    rng = np.random.default_rng(7)
    paths = []
    for mib in (1, 4):

        def extra_s(rate: float, mib: int = mib) -> float:
            return 1e-3 * (0.002 * rate + 0.04 * min(rate * 1e9 / 8 / (mib << 20) / 1e3, ceiling_kchunks_s))

        rows = _xfer_windows_rows(rng, rates, extra_s, 0.003, chunk_bytes=mib << 20)
        hiccup = next(r for r in rows if (r["link_gbps"], r["cycle"], r["event"], r["k"]) == (rates[0], 0, "none", 3))
        hiccup["wall_s"] = 0.060  # a host hiccup: left out
        paths.append(tmp_path / f"x{mib}_{ceiling_kchunks_s}.csv")
        pd.DataFrame(rows).to_csv(paths[-1], index=False)
    return paths


def test_fit_xfer_chunks_splits_the_growth_between_chunks_and_bytes(tmp_path):
    """Runs without a ceiling: the fit gives both terms, the chunk share at 1 MiB (0.04 x 0.1192 / (0.002 + 0.04 x
    0.1192) = 0.705) within its errors and no ceiling; runs whose chunk term stops at 3,000 chunks a second (60 and
    100 Gbps added): the ceiling's interval holds 3,000. One chunk alone is refused."""
    from realrun.transient import fit_xfer_chunks

    paths = _xfer_chunk_runs(tmp_path, (5.0, 10.0, 25.0, 40.0), math.inf)
    got = fit_xfer_chunks(paths)
    share = 0.04 * 0.11920929 / (0.002 + 0.04 * 0.11920929)
    assert abs(got["link_busy_host_factor_chunk_share"] - share) <= 3 * got["stderr"] + 0.01 and got["stderr"] < 0.05
    per_gbps_se, per_kchunk_se = got["extra_ms"]["stderr"][1:]
    assert abs(got["extra_ms"]["per_gbps"] - 0.002) <= 3 * per_gbps_se + 1e-5
    assert abs(got["extra_ms"]["per_kchunk_s"] - 0.04) <= 3 * per_kchunk_se + 1e-4
    assert got["link_busy_host_factor_max_chunks_per_s"] == math.inf
    assert got["windows"] == 32 and set(got["lines"]) == {"1 MiB", "4 MiB"}
    capped = fit_xfer_chunks(_xfer_chunk_runs(tmp_path, (5.0, 10.0, 25.0, 40.0, 60.0, 100.0), 3.0))
    low, high = capped["ceiling_interval_kchunks_s"]
    assert low <= 3.0 <= high < 6.0
    assert abs(capped["link_busy_host_factor_chunk_share"] - share) <= 3 * capped["stderr"] + 0.01
    with pytest.raises(ValueError, match="two link chunks"):
        fit_xfer_chunks(paths[:1])
