"""A host shared with a link endpoint (network.link_busy_host_factor): the host terms follow the link's state.

realrun's link is a Python thread in the harness's process; while it moves KV the harness's host work slows
(realrun/traces/h200_repeats/hostcal_link*.csv). The simulator keeps two cost models per replica, idle and busy
(ReplicaCostModel.with_host_factor), and each process (simulator/link.py, EndpointHost) tells its replicas when
the first transfer to or from it starts and the last one ends. The timelines here are worked by hand.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, cast

import numpy as np
import pytest
import simpy

from decode_standins import FixedCost, Listener, records
from helpers import scenario
from realrun.hostcal import fit_link_host
from simulator.config import ScenarioError, parse_scenario
from simulator.decode import DecodeReplica, iteration_rows
from simulator.link import EndpointHost
from simulator.run import run_scenario

ROOT = Path(__file__).resolve().parent.parent


def _decode_timeline(idle: FixedCost, busy: FixedCost, transfer: tuple[float, float] | None):
    """One request (10 decode iterations) joins at 0; another request's transfer is in flight over `transfer`."""
    env = simpy.Environment()
    rec = records(1)
    rec.iteration_log = []
    rep = DecodeReplica(env, 0, cast(Any, idle), 64, rec)
    rep.listener = Listener()
    rep.host_levels = cast(Any, (idle, busy))
    host = EndpointHost([rep])
    rep.reserve(1.0)
    rep.arrive(0)
    if transfer is not None:
        wire = cast(Any, "wire")  # the link the transfer is on (the host only counts it)
        env.process(_at(env, transfer[0], lambda: host.started(wire)))
        env.process(_at(env, transfer[1], lambda: host.ended(wire)))
    env.run()
    return float(rec.finish[0]), rec.iteration_log


def _at(env, t, fn):
    yield env.timeout(t)
    fn()


def test_iterations_before_during_and_after_a_transfer_take_their_level():
    """Idle 10 ms, busy 12 ms per iteration; a transfer from 25 to 61 ms. Iterations 0-2 start idle (0, 10, 20 ms;
    the one in progress at 25 ms keeps its level), 3-5 busy (30, 42, 54 ms; the one in progress at 61 ms keeps its
    level), 6-9 idle again (66, 76, 86, 96 ms): the request finishes at 106 ms, in three segments."""
    finish, log = _decode_timeline(FixedCost(0.010), FixedCost(0.012), (0.025, 0.061))
    assert finish == pytest.approx(0.106, abs=1e-12)
    starts = [r[0] for r in iteration_rows(log)]
    assert starts == pytest.approx([0.0, 0.010, 0.020, 0.030, 0.042, 0.054, 0.066, 0.076, 0.086, 0.096], abs=1e-12)
    assert len(log) == 3


def test_the_iteration_rows_end_before_each_levels_loop_gap():
    """iteration_rows ends a row before the loop gap of its own level: idle 1 ms, busy 3 ms of the 10 / 12 ms."""
    _, log = _decode_timeline(FixedCost(0.010, serial_s=0.001), FixedCost(0.012, serial_s=0.003), (0.025, 0.061))
    rows = iteration_rows(log)
    assert [r[1] - r[0] for r in rows] == pytest.approx([0.009] * 3 + [0.009] * 3 + [0.009] * 4, abs=1e-12)


def test_equal_levels_cut_nothing():
    """The same cost model for both levels: one segment, the 10 iterations of 10 ms, as without any transfer."""
    idle = FixedCost(0.010)
    finish, log = _decode_timeline(idle, idle, (0.025, 0.061))
    assert finish == pytest.approx(0.100, abs=1e-12) and len(log) == 1
    alone, log_alone = _decode_timeline(idle, idle, None)
    assert alone == finish and [e[:6] for e in log_alone] == [e[:6] for e in log]


# ---- through a whole run ------------------------------------------------------------------------------------
FLOOR_S = 0.05  # prefill.host_issue_s_per_iteration: far above the GPU time of a 256-token prompt
SHARED = {
    "placement": "shared_gpu",
    "methods": ["baseline"],
    "prefill.host_issue_s_per_iteration": FLOOR_S,
    "network.bandwidth_gbps": 1.0,  # 256 FP16 tokens of the 8B: 33.5 MB, 0.268 s on the wire
    "workload.input_tokens": {"kind": "fixed", "tokens": 256},
    "workload.output_tokens": {"kind": "fixed", "tokens": 8},
    "workload.arrival": {"kind": "poisson", "rate_rps": 3.0},
    "workload.requests": 12,
}


def _prefills(**changes):
    return run_scenario(scenario(**{**SHARED, **changes})).requests


def test_a_prefill_started_while_a_transfer_is_in_flight_takes_the_busy_floor_while_it_lasts():
    """1.2 + 0.05 x 2 Gbps = 1.3 times the 50 ms floor, 65 ms, for a prefill that starts while another request's
    KV is on the wire (shared_gpu: one process; 134 ms a transfer) and stays on it that long; one whose in-flight
    transfers end R seconds in runs R at the busy pace and the rest of its work at the idle one:
    R + (1 - R / 65 ms) x 50 ms; 50 ms where nothing is in flight at its start; 50 ms with the factor off."""
    df = _prefills(
        **{
            "network.link_busy_host_factor": 1.2,
            "network.link_busy_host_factor_per_gbps": 0.05,
            "network.bandwidth_gbps": 2.0,
            "workload.arrival": {"kind": "poisson", "rate_rps": 8.0},
            "workload.requests": 20,
        }
    )
    dur = (df.prefill_end_s - df.prefill_start_s).to_numpy()
    start, t0, t1 = df.prefill_start_s.to_numpy(), df.transfer_start_s.to_numpy(), df.transfer_end_s.to_numpy()
    left = np.array([max([e - s for b, e in zip(t0, t1) if b <= s < e], default=0.0) for s in start])
    busy = left > 0
    assert busy.any() and (~busy[1:]).any()  # some after a transfer has ended
    whole = left >= 1.3 * FLOOR_S
    part = busy & ~whole
    assert whole.sum() > 10 and part.sum() == 2  # both kinds occur in this run
    assert dur[whole] == pytest.approx(1.3 * FLOOR_S, rel=1e-9)
    assert dur[part] == pytest.approx(left[part] + (1 - left[part] / (1.3 * FLOOR_S)) * FLOOR_S, rel=1e-9)
    assert dur[~busy] == pytest.approx(FLOOR_S, rel=1e-9)
    off = _prefills()
    assert (off.prefill_end_s - off.prefill_start_s).to_numpy() == pytest.approx(FLOOR_S, rel=1e-9)


def test_the_prefill_floor_takes_its_own_busy_factor():
    """network.link_busy_prefill_host_factor: the prefill floor at 1.1 + 0.05 x 2 Gbps = 1.2 times while a transfer
    is in flight, not the other host terms' 1.3 (the same run as above, the general pair unchanged); left out, the
    prefill floor takes the general pair."""
    changes = {
        "network.link_busy_host_factor": 1.2,
        "network.link_busy_host_factor_per_gbps": 0.05,
        "network.bandwidth_gbps": 2.0,
        "workload.arrival": {"kind": "poisson", "rate_rps": 8.0},
        "workload.requests": 20,
    }
    general = _prefills(**changes)
    own = _prefills(
        **changes,
        **{"network.link_busy_prefill_host_factor": 1.1, "network.link_busy_prefill_host_factor_per_gbps": 0.05},
    )
    for df, f in ((general, 1.3), (own, 1.2)):
        dur = (df.prefill_end_s - df.prefill_start_s).to_numpy()
        start, t0, t1 = df.prefill_start_s.to_numpy(), df.transfer_start_s.to_numpy(), df.transfer_end_s.to_numpy()
        left = np.array([max([e - s for b, e in zip(t0, t1) if b <= s < e], default=0.0) for s in start])
        whole = left >= f * FLOOR_S
        assert whole.sum() > 5
        assert dur[whole] == pytest.approx(f * FLOOR_S, rel=1e-9)


def test_a_links_drain_end_by_hand():
    """drain_end_s on a 100 B/s link with 10 ms latency. Flows of 50 B (cap 20 B/s) and 200 B (no cap) from t = 0:
    water-filling gives 20 and 80 B/s, both drain at 2.5 s and arrive at 2.51 s. With a third flow of 100 B (no
    cap) the rates are 20 / 40 / 40 B/s: at 2.5 s the first and third have drained (the second has 100 B left),
    then the second runs alone at 100 B/s for 1 s: the last arrives at 3.51 s. The link's own run agrees."""
    from simulator.link import Link

    for flows, expect in (([(50, 20.0), (200, 1e9)], 2.51), ([(50, 20.0), (200, 1e9), (100, 1e9)], 3.51)):
        env = simpy.Environment()
        link = Link(env, "l", 100.0, 0.010)
        arrived: list[float] = []
        for i, (b, cap) in enumerate(flows):
            link.start(i, b, cap, lambda _r, t, out=arrived: out.append(t))
        assert link.drain_end_s() == pytest.approx(expect, abs=1e-9)
        env.run(until=1.0)  # part way: the prediction from there is the same
        assert link.drain_end_s() == pytest.approx(expect, abs=1e-9)
        env.run()
        assert max(arrived) == pytest.approx(expect, abs=1e-9)


def test_the_field_off_gives_the_same_bytes(tmp_path):
    """A scenario that spells out the defaults runs byte for byte as one that leaves them out."""
    a = _prefills()
    b = _prefills(**{"network.link_busy_host_factor": 1.0, "network.link_busy_host_factor_per_gbps": 0.0})
    assert a.to_csv() == b.to_csv()


@pytest.mark.parametrize(
    ("changes", "why"),
    [
        ({"placement": "colocated"}, "placement colocated"),
        ({"faults": [{"kind": "link_outage", "start_s": 1.0, "end_s": 2.0, "target": "p0"}]}, "faults"),
    ],
)
def test_refused_where_not_modelled(changes, why):
    with pytest.raises((ScenarioError, ValueError), match=f"link_busy_host_factor.*{why}"):
        scenario(**{"network.link_busy_host_factor": 1.5, **changes})


def test_the_busy_cost_model_scales_every_host_term_and_nothing_else():
    """with_host_factor(2): each host term doubled, the GPU terms as they were; factor 1 or no host term: itself."""
    from costmodel.methods import make_method
    from costmodel.phases import ReplicaCostModel
    from simulator.resolve import resolve

    _, dec = resolve(scenario(methods=["kvquant"]), "t").costs(make_method("kvquant"))
    terms = {
        "host_issue_s_per_iteration": 1e-3,
        "host_issue_s_per_layer": 2e-5,
        "host_issue_s_per_request": 3e-6,
        "host_serial_s_per_iteration": 4e-4,
        "join_s_per_request": 5e-4,
        "method_prefill_issue_s_per_layer": 6e-5,
        "method_quantize_issue_s_per_layer": 7e-5,
    }
    from dataclasses import replace

    base: ReplicaCostModel = replace(dec, **terms)
    busy = base.with_host_factor(2.0)
    for name, v in terms.items():
        assert getattr(busy, name) == 2 * v, name
    assert busy.iteration(8).decode_per_ctx_s == base.iteration(8).decode_per_ctx_s
    assert busy.iteration(8).dequant_fixed_s == base.iteration(8).dequant_fixed_s
    assert busy.iteration(8).decode_fixed_s == pytest.approx(base.iteration(8).decode_fixed_s + 4e-4, rel=1e-12)
    assert base.with_host_factor(1.0) is base
    none = replace(base, **{k: 0.0 for k in terms})
    assert none.with_host_factor(2.0) is none
    # a prefill replica's floor (its host_issue_s_* and the method's prefill issue) by its own factor, the rest by 2
    own = base.with_host_factor(2.0, prefill_floor_factor=1.25)
    floor = ("host_issue_s_per_iteration", "host_issue_s_per_layer", "host_issue_s_per_request")
    for name, v in terms.items():
        expect = 1.25 * v if name in (*floor, "method_prefill_issue_s_per_layer") else 2 * v
        assert getattr(own, name) == expect, name


def test_fit_link_host_by_hand(tmp_path):
    """fit_link_host on hand-made runs: one run idle and at 10 and 40 Gbps, whose loop gap, join and quantize slow by
    1.5 at 10 Gbps and 2.25 at 40 Gbps (the line through them is 1.25 + 0.025 per Gbps), the prefill by 1.2 and 1.5
    (its own line: 1.1 + 0.01 per Gbps)."""
    head = "kind,method,model,layers,decode_mode,link_load_gbps,prompt_range,pass,batch_size,tokens,host_issue_s,wall_s,start_s,end_s,quantize_s\n"
    lines = []
    for load, f, fp in ((0.0, 1.0, 1.0), (10.0, 1.5, 1.2), (40.0, 2.25, 1.5)):
        t = 0.0
        # decode: batch 1 joins (issue 1 + 0.6 joined), then three iterations without a join (issue 0.2 ms), loop
        # gaps 0.3 ms: serial 0.5 ms, join 0.6 ms idle
        for b, issue in ((1, 0.8e-3), (1, 0.2e-3), (1, 0.2e-3), (1, 0.2e-3)):
            lines.append(f"decode,hack,m,2,graphs,{load},128-384,1,{b},100,{issue * f},0.001,{t},{t + 0.001}\n")
            t += 0.001 + 0.3e-3 * f
        lines.append(f"prefill,hack,m,2,graphs,{load},128-384,1,1,200,,{0.004 * fp},10,{10 + 0.004 * fp},{0.001 * f}\n")
    (tmp_path / "h.csv").write_text(head + "".join(lines))
    fit = fit_link_host([tmp_path / "h.csv"])
    assert fit["items"] == 6  # loop gap, join, quantize at two loads
    assert fit["link_busy_host_factor"] == pytest.approx(1.25, rel=1e-9)
    assert fit["link_busy_host_factor_per_gbps"] == pytest.approx(0.025, rel=1e-9)
    assert fit["prefill"]["items"] == 2
    assert fit["prefill"]["link_busy_prefill_host_factor"] == pytest.approx(1.1, rel=1e-9)
    assert fit["prefill"]["link_busy_prefill_host_factor_per_gbps"] == pytest.approx(0.01, rel=1e-9)


def test_parse_accepts_the_measured_fields():
    from helpers import TINY

    raw = {**TINY, "network": {**TINY["network"], "link_busy_host_factor": 1.33}}
    assert parse_scenario(raw, "t").network.link_busy_host_factor == 1.33


def _probe_levels(folder: str, pattern: str):
    """realrun.transient's fits on a folder's committed probe runs (the harness's own link moving KV beside decode
    windows and short prefills): the decode loop's (fit_xfer), the prefill floor's (fit_xfer_prefill), and the four
    scenario fields they give, each level at the field's floor of 1 where the estimate is below it."""
    from realrun.transient import fit_xfer, fit_xfer_prefill

    files = sorted((ROOT / folder).glob(pattern))
    loop, pre = fit_xfer(files), fit_xfer_prefill(files)
    assert pre["from"] == "llama-3.1-8b:32 baseline 128"
    want = {
        "link_busy_host_factor": max(1.0, loop["link_busy_host_factor"]),
        "link_busy_host_factor_per_gbps": loop["link_busy_host_factor_per_gbps"],
        "link_busy_prefill_host_factor": max(1.0, pre["link_busy_prefill_host_factor"]),
        "link_busy_prefill_host_factor_per_gbps": pre["link_busy_prefill_host_factor_per_gbps"],
    }
    return loop, pre, want


def _scenarios_carry(prefix: str, count: int, want: dict[str, float]) -> None:
    import yaml

    paths = sorted((ROOT / "scenarios/measured").glob(f"{prefix}_*.yaml"))
    assert len(paths) == count
    for path in paths:
        net = yaml.safe_load(path.read_text())["network"]
        for name, value in want.items():
            assert net[name] == pytest.approx(value, rel=0.02), (path.name, name)


def test_the_h200_scenarios_take_the_h200_probes_levels():
    """The h200g_* scenarios' busy-link host factors are realrun.transient's fits on the H200 host's committed probe
    runs (realrun/traces/h200_transient/xfer*.csv): the decode loop's pair for the host terms, the 32-layer FP16
    prefill's for the prefill floor; not a fit to any trace. hostcal's lumped runs (a second link kept busy) put both
    levels higher, by more than the probes' errors."""
    loop, pre, want = _probe_levels("realrun/traces/h200_transient", "xfer*.csv")
    assert loop["windows"] == 240 and pre["timing"] == "forward_s"
    host = fit_link_host(sorted((ROOT / "realrun/traces/h200_repeats").glob("hostcal_link*.csv")))
    assert host["link_busy_host_factor"] > loop["link_busy_host_factor"] + 3 * loop["stderr"][0]
    assert (
        host["prefill"]["link_busy_prefill_host_factor"] > pre["link_busy_prefill_host_factor"] + 3 * pre["stderr"][0]
    )
    _scenarios_carry("h200g", 15, want)


def test_the_h100_scenarios_take_the_h100_probes_levels():
    """The h100g_* scenarios' busy-link host factors are realrun.transient's fits on the H100 hosts' committed probe
    runs (realrun/traces/h100_transient, three): the decode loop's pair for the host terms, the prefill floor's own;
    not a fit to any trace."""
    _, pre, want = _probe_levels("realrun/traces/h100_transient", "xferpre*.csv")
    # below hostcal's 1.35 at a link rate near 0, by far more than either's error
    assert pre["link_busy_prefill_host_factor"] + 3 * pre["stderr"][0] < 1.35
    _scenarios_carry("h100g", 15, want)


# ---- calibrate: the busy level as two host parameters ---------------------------------------------------------
def test_calibrate_prices_busy_items_at_the_busy_level_and_its_derivatives_hold():
    """On a recorded trace (8b_sat HACK at 40 Gbps, realrun: one process), an item that starts with a transfer in
    flight has (part of) its host time times a + b x 39.2 (40 Gbps past the chunk rate's ceiling: link_busy_gbps); an
    idle one none. calibrate.predict's derivatives in a and b
    match central differences."""
    from simulator.calibrate import predict
    from simulator.fit_items import load_trace_data

    root = Path(__file__).resolve().parent.parent
    td = load_trace_data(
        root / "realrun/traces/h200_graphs/h200g_8b_sat_hack_r9", root / "scenarios/measured/h200g_8b_sat.yaml"
    )
    # 40 Gbps of 1 MiB chunks, 4,768 a second: the chunks' share (0.766) at the ceiling's 4,644 a second
    gbps = 40.0 * (1 - 0.766) + 0.766 * 4644 * (1 << 20) * 8 / 1e9
    assert td.link_gbps == pytest.approx(gbps, rel=1e-12)
    v = dict(td.values0)
    for kind in ("iteration", "prefill", "quantize"):
        # the prefill floor takes its own pair (network.link_busy_prefill_host_factor), every other host term this one
        pair = "network.link_busy_prefill_host_factor" if kind == "prefill" else "network.link_busy_host_factor"
        names = (pair, pair + "_per_gbps")
        blk = td.blocks[kind]
        busy = blk["busy"] if kind == "iteration" else (blk["busy_left_s"] > 0).astype(float)
        if kind != "quantize":  # at 40 Gbps the earlier request's KV has left before a prefill ends
            assert 0 < busy.sum() < len(busy), kind
        off = predict(td, kind, {**v, names[0]: 1.0, names[1]: 0.0})
        on = predict(td, kind, v)
        assert (on[busy == 0] == off[busy == 0]).all(), kind
        assert (on[busy == 1] >= off[busy == 1]).all(), kind
        _, d = predict(td, kind, v, names)
        for n, h in zip(names, (1e-4, 1e-6)):
            fd = (predict(td, kind, {**v, n: v[n] + h}) - predict(td, kind, {**v, n: v[n] - h})) / (2 * h)
            assert d[n] == pytest.approx(fd, rel=1e-5, abs=1e-9), (kind, n)
    # by hand, an iteration: the loop gap 0.63 ms and the joins' 0.61 ms each take (1.026 + 0.0142 x 39.2) = 1.58 x
    names = ("network.link_busy_host_factor", "network.link_busy_host_factor_per_gbps")
    blk = td.blocks["iteration"]
    i = int(np.flatnonzero(blk["busy"] == 1)[0])
    extra = (1.026 + 0.0142 * gbps - 1) * (0.00063 + 0.00061 * blk["joins"][i])
    off = predict(td, "iteration", {**v, names[0]: 1.0, names[1]: 0.0})
    assert predict(td, "iteration", v)[i] - off[i] == pytest.approx(extra, rel=1e-9)


def test_calibrate_prices_a_prefill_busy_for_part_of_it_by_hand():
    """Prefill items host-bound at a 50 ms floor, busy level 1.5x (75 ms), starting with 0, 20 ms and 1 s of transfers
    still in flight: 50 ms; 20 ms + (1 - 20 / 75) x 50 = 56.67 ms; 75 ms, as simulator/prefill.py times them."""
    from simulator.calibrate import predict
    from simulator.fit_items import load_trace_data

    root = Path(__file__).resolve().parent.parent
    td = load_trace_data(
        root / "realrun/traces/h200_graphs/h200g_8b_sat_hack_r9", root / "scenarios/measured/h200g_8b_sat.yaml"
    )
    three = np.ones(3)
    td.blocks["prefill"] = {
        "meas": three,
        "gpu0": three * 1e-3,
        "approx0": three * 0,
        "hop": three * 0,
        "requests": three,
        "layers": 32.0,
        "rest": three * 0,
        "busy_left_s": np.array([0.0, 0.020, 1.0]),
    }
    v = {**td.values0, "prefill.prefill_efficiency": 1.0, "prefill.host_issue_s_per_iteration": 0.050}
    v |= {"prefill.host_issue_s_per_layer": 0.0, "prefill.host_issue_s_per_request": 0.0}
    v |= {f"methods.{td.family}.prefill_issue_s_per_layer": 0.0}
    v |= {"network.link_busy_prefill_host_factor": 1.5, "network.link_busy_prefill_host_factor_per_gbps": 0.0}
    expect = [0.050, 0.020 + (1 - 0.020 / 0.075) * 0.050, 0.075]
    assert predict(td, "prefill", v) == pytest.approx(expect, rel=1e-12)
    # the other host terms' factor does not reach the prefill floor
    v |= {"network.link_busy_host_factor": 3.0}
    assert predict(td, "prefill", v) == pytest.approx(expect, rel=1e-12)


def test_fit_link_host_with_one_busy_load_gives_the_factor_alone(tmp_path):
    """Runs idle and at one busy load cannot tell a slope: the mean ratio, b = 0 (here every term 1.5x at 10 Gbps)."""
    head = "kind,method,model,layers,link_load_gbps,prompt_range,pass,batch_size,tokens,host_issue_s,wall_s,start_s,end_s\n"
    lines = []
    for load, f in ((0.0, 1.0), (10.0, 1.5)):
        t = 0.0
        for issue in (0.8e-3, 0.2e-3, 0.2e-3, 0.2e-3):
            lines.append(f"decode,hack,m,2,{load},128-384,1,1,100,{issue * f},0.001,{t},{t + 0.001}\n")
            t += 0.001 + 0.3e-3 * f
        lines.append(f"prefill,hack,m,2,{load},128-384,1,1,200,,{0.004 * f},10,{10 + 0.004 * f}\n")
    (tmp_path / "h.csv").write_text(head + "".join(lines))
    fit = fit_link_host([tmp_path / "h.csv"])
    assert fit["items"] == 2  # loop gap, join (no quantize column)
    assert fit["link_busy_host_factor"] == pytest.approx(1.5, rel=1e-9)
    assert fit["link_busy_host_factor_per_gbps"] == 0.0
    assert fit["prefill"]["items"] == 1
    assert fit["prefill"]["link_busy_prefill_host_factor"] == pytest.approx(1.5, rel=1e-9)


def test_the_busy_growth_follows_the_chunks_the_link_sends():
    """network.link_busy_host_factor_chunk_bytes: growths measured at 1 MiB chunks, priced for a link sending 4 MiB
    ones, keep their bytes' share and a quarter of their chunks' share, by hand; past the chunk rate ceiling the
    chunks' share stays at the ceiling's rate; the same chunk below it, or the field at 0, leave the line rate."""
    import yaml

    from simulator.resolve import link_busy_gbps, link_busy_host_factor, link_busy_prefill_host_factor

    raw = yaml.safe_load((ROOT / "scenarios/measured/h200g_8b_sat.yaml").read_text())
    net = raw["network"]  # 40 Gbps
    net.update(round_robin_chunk_bytes=4 << 20, link_busy_host_factor_chunk_bytes=1 << 20)
    net.update(link_busy_host_factor_chunk_share=0.8, link_busy_host_factor_max_chunks_per_s=6000.0)
    s = parse_scenario(raw, "t")
    gbps = 40 * (0.2 + 0.8 / 4)
    assert link_busy_gbps(s) == pytest.approx(gbps, rel=1e-12)
    a, b = net["link_busy_host_factor"], net["link_busy_host_factor_per_gbps"]
    assert link_busy_host_factor(s) == pytest.approx(a + b * gbps, rel=1e-12)
    pa, pb = net["link_busy_prefill_host_factor"], net["link_busy_prefill_host_factor_per_gbps"]
    assert link_busy_prefill_host_factor(s) == pytest.approx(pa + pb * gbps, rel=1e-12)

    def at(**change) -> float:
        return link_busy_gbps(parse_scenario({**raw, "network": {**net, **change}}, "t"))

    assert at(round_robin_chunk_bytes=1 << 20) == 40  # 4,768 chunks a second: under the ceiling
    ceiling_gbps = 6000 * (1 << 20) * 8 / 1e9  # 50.3 Gbps of 1 MiB chunks
    assert at(round_robin_chunk_bytes=1 << 20, bandwidth_gbps=100) == pytest.approx(100 * 0.2 + 0.8 * ceiling_gbps)
    assert at(round_robin_chunk_bytes=0, bandwidth_gbps=100) == pytest.approx(100 * 0.2 + 0.8 * ceiling_gbps)
    assert at(bandwidth_gbps=100) == pytest.approx(100 * (0.2 + 0.8 / 4))  # 2,980 chunks a second of 4 MiB
    assert at(link_busy_host_factor_chunk_bytes=0, bandwidth_gbps=100) == 100
    assert at(round_robin_chunk_bytes=1 << 20, bandwidth_gbps=100, link_busy_host_factor_max_chunks_per_s=".inf") == 100


def test_the_chunk_fields_defaults_are_the_h200_probes():
    """network.link_busy_host_factor_chunk_share's and _max_chunks_per_s's defaults are realrun.transient's
    fit_xfer_chunks on the committed H200 probe (realrun/traces/h200_xferwide: the 32-layer 8B's decode loop beside
    transfers at 1-100 Gbps in 1 and 4 MiB chunks), not a fit to any trace."""
    from realrun.transient import fit_xfer_chunks
    from simulator.config import NetworkConfig

    got = fit_xfer_chunks(sorted((ROOT / "realrun/traces/h200_xferwide").glob("xferwide*.csv")))
    fields = NetworkConfig.model_fields
    assert fields["link_busy_host_factor_chunk_share"].default == got["link_busy_host_factor_chunk_share"]
    assert fields["link_busy_host_factor_max_chunks_per_s"].default == got["link_busy_host_factor_max_chunks_per_s"]
    low, high = got["ceiling_interval_kchunks_s"]
    assert high < math.inf and got["stderr"] < 0.15  # the probe does constrain both


def test_an_h100_hosts_chunk_share_agrees_with_the_defaults():
    """The same probe on an H100 machine (realrun/traces/h100_xferwide: 1, 2, 4 and 16 MiB chunks at 5-100 Gbps in
    three processes): fit_xfer_chunks gives a chunk share of 0.62 (se 0.10) with the same ceiling; against the
    default (the H200 host's 0.766, se 0.071) within two combined standard errors, so the h100g scenarios keep it."""
    from realrun.transient import fit_xfer_chunks
    from simulator.config import NetworkConfig

    h100 = fit_xfer_chunks(sorted((ROOT / "realrun/traces/h100_xferwide").glob("xferwide*.csv")))
    h200 = fit_xfer_chunks(sorted((ROOT / "realrun/traces/h200_xferwide").glob("xferwide*.csv")))
    assert h100["link_busy_host_factor_chunk_share"] == pytest.approx(0.62, abs=0.005)
    assert h100["stderr"] < 0.15
    gap = abs(
        h100["link_busy_host_factor_chunk_share"]
        - NetworkConfig.model_fields["link_busy_host_factor_chunk_share"].default
    )
    assert gap < 2 * math.hypot(h100["stderr"], h200["stderr"])
    low, high = h100["ceiling_interval_kchunks_s"]
    assert low * 1e3 <= NetworkConfig.model_fields["link_busy_host_factor_max_chunks_per_s"].default <= high * 1e3
