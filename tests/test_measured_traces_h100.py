"""The H100 recordings (realrun/traces/h100, h100b, h100c, h100d, h100e, h100f, h100_midlink, h100_pin, h100_midlink2,
h100_probe, h100_probe2, h100_probe3, h100_probe4; listed in
realrun/traces/index_h100.csv, h100_pin's pinned runs in its own index.csv):
every run complete, with its provenance, described by its scenario, in the session its index names; and the
across-session repeats index (realrun/traces/index_h100_sessions.csv) groups recordings of one configuration,
method and seed; the method-order check (realrun/traces/h100_order8b); two configurations new to the H100
(realrun/traces/h100_new, h100_new2, h100_new3); long prompts new to the H100 (realrun/traces/h100_long). How the H200 calibration carries to them:
tests/test_calibrate_measured_sessions.py."""

from __future__ import annotations

import json
import statistics
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import yaml

from simulator.measured import earlier_run
from tests.recorded_runs import check_recorded_run, rows

ROOT = Path(__file__).resolve().parent.parent
TRACES = ROOT / "realrun/traces"
SESSIONS = {  # folder: the session named in the index (its device call's start, UTC)
    "h100": "h100-2026-12-05-1234",
    "h100b": "h100-2026-12-05-1435",
    "h100c": "h100-2026-12-05-1626",
    "h100d": "h100-2026-12-05-1635",
    "h100e": "h100-2026-12-05-1649",
    "h100f": "h100-2026-12-05-1937",
    "h100_midlink": "h100-2026-12-05-2136",
    "h100_pin": "h100-2026-12-05-2136",  # the same machine, the next device call
    "h100_midlink2": "h100-2026-12-05-2203",
    "h100_probe": "h100-2026-12-06-0330",  # three device calls on one machine, the host probe beside each
    "h100_probe2": "h100-2026-12-06-0554",  # the same parts on another machine (h100, h100b, h100f), the probe beside
    "h100_probe3": "h100-2026-12-06-0622",  # parts h100f and h100 cut short: four configurations, the probe beside
    "h100_probe4": "h100-2026-12-06-0757",  # h100f, h100, h100b, h100f again on one machine, the probe beside
}


def test_every_h100_run_is_complete_with_provenance_and_described_by_its_scenario():
    index = rows(TRACES / "index_h100.csv")
    # h100_probe2 recorded 8b_small twice, h100_probe4 8b_small, 8b_sat, 70b8l_2.5gbps and 8b_kvsat twice: the folders
    # ending _rep1 are the second recordings, not in the sessions index
    assert len(index) == 188
    assert Counter(r["trace"].split("/")[0] for r in index) == {
        "h100": 11,
        "h100b": 9,
        "h100c": 12,
        "h100d": 9,
        "h100e": 12,
        "h100f": 9,
        "h100_midlink": 6,
        "h100_pin": 6,  # its unpinned runs; the pinned ones are in its own index
        "h100_midlink2": 6,
        "h100_probe": 27,
        "h100_probe2": 30,
        "h100_probe3": 12,
        "h100_probe4": 39,
    }
    for row in index:
        assert row["machine"] == SESSIONS[row["trace"].split("/")[0]], row
        meta = check_recorded_run(TRACES / row["trace"], ROOT / row["scenario"])
        assert meta["gpu"].startswith("NVIDIA H100"), row["trace"]
        scen = yaml.safe_load((ROOT / row["scenario"]).read_text())
        assert scen["prefill"]["gpu"] == scen["decode"]["gpu"] == "h100", row["scenario"]
    for session in SESSIONS:
        prov = json.loads((TRACES / session / "provenance.json").read_text())
        assert prov["gpu"].startswith("NVIDIA H100") and prov["command"].startswith("bash realrun/device_run.sh")


def test_the_sessions_index_groups_one_configuration_method_and_seed():
    """Rows sharing config: the same scenario, method, rate, requests and seed, in different sessions."""
    groups: dict[str, list[dict]] = {}
    for row in rows(TRACES / "index_h100_sessions.csv"):
        groups.setdefault(row["config"], []).append(row)
    assert len(groups) == 33 and all(len(g) >= 2 for g in groups.values())
    for config, group in groups.items():
        metas = [json.loads((TRACES / r["trace"] / "meta.json").read_text()) for r in group]
        same = {(m["method"], m["rate_rps"], m["requests"], m["seed"], m["model"], m["layers"]) for m in metas}
        assert len(same) == 1 and len({r["scenario"] for r in group}) == 1, config
        assert len({r["trace"].split("/")[0] for r in group}) == len(group), config  # one recording per session


def test_the_pinned_runs_say_where_their_threads_ran():
    """realrun/traces/h100_pin: h100g_8b_sat r8 HACK and KVQuant-style three times each with the threads where the OS
    put them and three times with --pin-threads, complete, described by the 8b_sat scenario, each saying where its
    threads ran."""
    index = rows(TRACES / "h100_pin" / "index.csv")
    assert len(index) == 12
    for row in index:
        meta = check_recorded_run(TRACES / "h100_pin" / row["trace"], ROOT / row["scenario"])
        pinned = "satpin" in row["trace"]
        assert ("(--pin-threads)" in meta["notes"]) == pinned, row["trace"]
        assert ("threads: placed by the OS" in meta["notes"]) == (not pinned), row["trace"]
        assert row["machine"] == SESSIONS["h100_pin"]


def _probe_beside_each_run(session: str) -> dict[str, dict]:
    """realrun.cpustate.beside_runs over a session's probe files (cpustate_bg_PART.csv, one per device call): each
    recording's row from the one probe whose steps fall in its wall-clock span; every recording has one."""
    from realrun.cpustate import beside_runs

    folder = TRACES / session
    runs = sorted(p.parent for p in folder.glob("h100g_*/meta.json"))
    seen: dict[str, dict] = {}
    for probe in sorted(folder.glob("cpustate_bg_*.csv")):
        for row in beside_runs(probe, runs):
            if row["steps"]:
                assert row["trace"] not in seen, row
                seen[row["trace"]] = row
    assert len(seen) == len(runs), session
    return seen


def test_the_host_probe_held_one_speed_beside_the_ninth_sessions_runs():
    """realrun/traces/h100_probe: realrun.cpustate's pure-Python loop in the background of each device call
    (cpustate_bg_PART.csv) beside the 27 recordings' wall-clock spans: every run has probe steps within its span, and
    in each the loop's median is 0.87-0.92 ms: on this machine another CPU held one speed through the session, while
    one host factor (0.65-0.69, tests/test_calibrate_measured_sessions.py) fits every configuration."""
    seen = _probe_beside_each_run("h100_probe")
    assert len(seen) == 27
    for row in seen.values():
        assert row["steps"] > 400 and 0.87 < row["py_median_ms"] < 0.92, row


def test_the_host_probe_ran_about_twice_as_slow_in_the_tenth_session():
    """realrun/traces/h100_probe2: the probe beside the 30 recordings of another H100 machine. Its loop's median is
    1.5-1.9 ms in every run (the ninth session's 0.87-0.92 ms), and the host factor the session's configurations give
    each other is 1.12-1.17 (the ninth's 0.65-0.69, tests/test_calibrate_measured_sessions.py): between two sessions
    the probe moves with the host terms, where within one it does not order the runs (docs/calibration.md)."""
    seen = _probe_beside_each_run("h100_probe2")
    assert len(seen) == 30
    for row in seen.values():
        assert row["steps"] > 400 and 1.5 < row["py_median_ms"] < 1.9, row


def test_the_host_probe_ran_as_slow_beside_the_twelfth_sessions_runs():
    """realrun/traces/h100_probe4: the probe beside the 39 recordings of a fourth probed H100 machine (four device
    calls, cpustate_bg_h100f_rep1.csv the second h100f call's). Its loop's median is 1.52-1.84 ms in every run (median
    1.745 ms), as slow as the tenth session's 1.5-1.9 ms, and every run has at least 518 probe steps in its span."""
    seen = _probe_beside_each_run("h100_probe4")
    assert len(seen) == 39
    for row in seen.values():
        assert row["steps"] > 500 and 1.5 < row["py_median_ms"] < 1.85, row


def test_the_host_probe_orders_four_sessions_as_their_host_factors():
    """The probe's loop median within each run, session by session (h100_probe 0.897, h100_probe3 1.606, h100_probe4
    1.745, h100_probe2 1.757 ms), against the host factor the session's configurations give each other (0.65-0.69,
    0.93-1.02, 1.05-1.09, 1.12-1.17 of the H200 calibration's host terms, about 0.67, 0.97, 1.06, 1.14;
    tests/test_calibrate_measured_sessions.py): the sessions' medians are ordered as their factors. The probe orders
    sessions but is no precise predictor: the twelfth's and the tenth's medians differ by under 1 %, their factors by
    about 7 %."""
    medians = {}
    for session in ("h100_probe", "h100_probe3", "h100_probe4", "h100_probe2"):
        got = sorted(row["py_median_ms"] for row in _probe_beside_each_run(session).values())
        medians[session] = got[len(got) // 2]
    assert (
        medians["h100_probe"] < 1.0 < medians["h100_probe3"] < medians["h100_probe4"] < medians["h100_probe2"] < 2.0
    ), medians


def _prefill_ms(folder: Path) -> dict[str, float]:
    return {
        r["request_id"]: 1e3 * (float(r["prefill_end_s"]) - float(r["prefill_start_s"]))
        for r in rows(folder / "requests.csv")
    }


def _fp16_less_kvquant_ms(fp16: Path, kvquant: Path) -> float:
    """The median over requests of FP16's prefill less KVQuant-style's on the same prompt (the same forward)."""
    a, b = _prefill_ms(fp16), _prefill_ms(kvquant)
    return statistics.median(a[k] - b[k] for k in a)


def test_the_first_runs_extra_prefill_time_follows_the_order_on_an_h100():
    """realrun/traces/h100_order8b: 8b_2.5gbps with HACK first and FP16 last on two machines: FP16's prefill is
    KVQuant-style's (the same forward) to 0.2 ms, where in the seven sessions that ran FP16 first it is 0.6 ms or more
    longer (the first run's kernel choices, prefill.host_first_seen_s_per_iteration); validate reads the order."""
    order = TRACES / "h100_order8b"
    index = rows(order / "index.csv")
    assert len(index) == 6 and {r["machine"] for r in index} == {"h100-2026-12-07-0816", "h100-2026-12-07-0820"}
    for row in index:
        meta = check_recorded_run(order / row["trace"], ROOT / row["scenario"])
        assert meta["gpu"].startswith("NVIDIA H100") and "--method hack kvquant baseline" in meta["command"]
        if meta["method"] != "hack":
            assert earlier_run(meta, row["trace"]) == "hack, the process's first method"
    prov = json.loads((order / "provenance.json").read_text())
    assert prov["gpu"].startswith("NVIDIA H100") and "device_run.sh" in prov["command"]
    last = [
        _fp16_less_kvquant_ms(order / s / "h100g_8b_2.5gbps_baseline_r7.5", order / s / "h100g_8b_2.5gbps_kvquant_r7.5")
        for s in ("s0816", "s0820")
    ]
    assert all(abs(d) < 0.2 for d in last), last
    first = [
        _fp16_less_kvquant_ms(TRACES / r["trace"], TRACES / r["trace"].replace("_baseline_", "_kvquant_"))
        for r in rows(TRACES / "index_h100.csv")
        if "h100g_8b_2.5gbps_baseline" in r["trace"]
    ]
    assert len(first) == 7 and min(first) > 0.6, first


def _new_configurations_session(
    folder: Path, runs: int, machine: str, reps: Callable[[str], tuple[str, ...]] = lambda trace: ()
) -> tuple[set[str], list[tuple[Path, dict]]]:
    """One H100 session of configurations new to the H100: `runs` runs of one `machine` in its index, each (and the
    folders of its later calls, the trace's name ending in each of `reps(trace)`) complete with provenance from an
    H100, described by its h100g scenario, and the session's provenance; its configurations, and each run checked
    with its meta."""
    index = rows(folder / "index.csv")
    assert len(index) == runs and {r["machine"] for r in index} == {machine}
    checked = []
    for row in index:
        scen = yaml.safe_load((ROOT / row["scenario"]).read_text())
        assert scen["prefill"]["gpu"] == scen["decode"]["gpu"] == "h100", row["scenario"]
        for run in (folder / row["trace"], *(folder / (row["trace"] + r) for r in reps(row["trace"]))):
            meta = check_recorded_run(run, ROOT / row["scenario"])
            assert meta["gpu"].startswith("NVIDIA H100"), run
            assert scen["prefill"]["max_batch_requests"] == meta["prefill_max_batch_requests"], run
            checked.append((run, meta))
    prov = json.loads((folder / "provenance.json").read_text())
    assert prov["gpu"].startswith("NVIDIA H100") and prov["command"].startswith("bash realrun/device_run.sh")
    return {Path(r["scenario"]).stem for r in index}, checked


def _twice(trace: str) -> tuple[str, ...]:
    return ("_rep1",)  # the second call's folder


def test_the_two_configurations_new_to_the_h100_are_recorded_beside_a_known_one():
    """realrun/traces/h100_new: 8b_pbatch and 70b8l_40gbps, which no other H100 session has, beside 8b_small, which
    nine of the twelve earlier ones have (the session's host factor), twice on one machine (the second call's folders end _rep1)."""
    configs, _ = _new_configurations_session(TRACES / "h100_new", 9, "h100-2026-12-07-0920", _twice)
    assert configs == {"h100g_8b_small", "h100g_8b_pbatch", "h100g_70b8l_40gbps"}
    known = {Path(r["scenario"]).stem for r in rows(TRACES / "index_h100.csv")}
    assert configs - known == {"h100g_8b_pbatch", "h100g_70b8l_40gbps"}
    # a second session on a fresh machine (realrun/traces/h100_new2), the 70B's HACK run cut by the call's budget
    second, checked = _new_configurations_session(TRACES / "h100_new2", 8, "h100-2026-12-07-1019")
    assert second == configs and all(meta["git_rev"] == "45a7af8" for _, meta in checked)
    # a third on another machine (realrun/traces/h100_new3), twice back to back as the first (_rep1: the second call)
    third, checked = _new_configurations_session(TRACES / "h100_new3", 9, "h100-2026-12-07-1157", _twice)
    assert third == configs and all(meta["git_rev"] == "30d967b" for _, meta in checked)


def test_long_prompts_new_to_the_h100_are_recorded_beside_a_known_one():
    """realrun/traces/h100_long: 8b_long (decode batches to 16) and 70b8l_long, which no other H100 session has, beside
    8b_small (the session's host factor), three calls on one machine (8b_small's second and third end _rep1, _rep2)."""
    configs, checked = _new_configurations_session(
        TRACES / "h100_long",
        9,
        "h100-2026-12-07-1310",
        lambda trace: ("_rep1", "_rep2") if "8b_small" in trace else (),
    )
    assert len(checked) == 15
    for run, meta in checked:
        third = "8b_long" in run.name or run.name.endswith("_rep2")  # the third call: batches to 16
        assert meta["git_rev"] == ("1d8ea25+maxb16" if third else "1d8ea25"), run
        assert (run / "steps.csv").exists() == ("_long_" in run.name), run  # the long ones step-timed, as the H200's
    assert configs == {"h100g_8b_small", "h100g_8b_long", "h100g_70b8l_long"}
    known = {Path(r["scenario"]).stem for r in rows(TRACES / "index_h100.csv")}
    assert configs - known == {"h100g_8b_long", "h100g_70b8l_long"}
