"""One engine calibration over every committed graph-mode H200 trace (realrun/traces/index_all.csv: 104 runs, 13
configurations, a host factor per session), and how it carries to other sessions and to H100s with each session's
host factor fitted from its other configurations (validate --cv --base). The leave-one-out figures on the 27
h200_graphs traces are tests/test_calibrate_measured.py's; the two modules are apart so that two test workers share
their fits (make test runs each file on one worker).

One fit over the 104 runs, shared by the tests of this module (about a minute and a half of CPU as Python).
"""

from __future__ import annotations

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

# Every committed graph-mode trace in one index (realrun/traces/index_all.csv: 104 runs, 13 configurations) with each
# run's device session as its machine (12 sessions, from its meta.json's git_rev and date): one fit, a host factor per
# session. The two fast sessions (2026-12-04 12:45, meta host issue 0.11-0.16 ms a step, and 2026-12-05 15:10,
# realrun/traces/h200_again) come out at 0.653 and 0.724 of the sessions' typical CPU, the others 0.96-1.21.
# validate --cv on that index (docs/calibration.md, "Runs of several machines in one fit"): held out by configuration
# 3.9 % (max 12.9 %) against 7.0 % with no fit; not in this module (52 minutes on two cores). Bounds: the fast
# sessions under 0.75, the others in 0.85-1.25.
ALL = ROOT / "realrun/traces/index_all.csv"
FAST_SESSIONS = {"h200-2026-12-04-1245", "h200-2026-12-05-1510"}


@pytest.fixture(scope="module")
def all_fit():
    from simulator.calibrate import fit_engine, load_index

    traces = load_index(ALL)
    assert len(traces) == 104 and len({td.configuration for td in traces}) == 13
    return fit_engine(traces)


def test_one_fit_over_every_session_gives_each_its_host_factor(all_fit):
    fit = all_fit
    f = {m: r["factor"] for m, r in fit.machines.items()}
    assert len(f) == 12 and sum(r["traces"] for r in fit.machines.values()) == 104
    assert all(f.pop(m) < 0.75 for m in FAST_SESSIONS), f
    assert all(0.85 < v < 1.25 for v in f.values()), f
    it = fit.residuals["iteration"]
    assert abs(it["total_pct_after"]) < 1.0, it


# A GPU and hosts no fit has seen (realrun/traces/index_h100.csv: eight H100 80 GB sessions, each on a machine of its
# own, 2026-12-05 12:34, 14:35, 16:26, 16:35, 16:49, 19:37, 21:36 and 22:03, realrun/traces/h100, h100b, h100c, h100d,
# h100e, h100f, h100_midlink with h100_pin, h100_midlink2; the third to fifth record the first two's configurations
# again, the sixth three configurations no other H100 session has, the seventh and eighth two configurations never
# recorded on any GPU (8b_sat's workload at 25 Gbps, 8b_2.5gbps's at 10), the seventh 8b_sat again (HACK and
# KVQuant-style three times each); eleven configurations, every method, 80 runs): priced with the H100's measured
# profile (kernels_calibration/profiles/h100, measured on another H100 the same day), the calibration over every H200
# session, and each configuration's host factor from its session's other configurations (validate --cv --base; a
# configuration of several sessions is a row for each). Mean |JCT error| no fit 4.8 % (max 30.2 %), the H200
# calibration alone 6.4 % (50.8 %), with the factor 4.3 % (27.3 %), against a run-to-run spread of mean JCT across
# the sessions of 5.6 % (realrun/traces/index_h100_sessions.csv). The seventh session's host runs the engine's host
# terms about a third faster than the H200 hosts the calibration was fitted on (factors 0.67-0.71 from each
# configuration's two session-mates): the calibration alone prices its host-bound short prefills long (8b_short10
# 30.4 % against 16.8 % with no fit), and its factor brings its three rows to 2.9, 1.0 and 4.7 %. In the eighth the
# two configurations disagree (8b_short10's runs put 8b_sat25's factor at 0.75, 8b_sat25's put 8b_short10's at 1.00),
# and 8b_short10 comes out 16.4 % against 4.5 % with no fit. Over the first six sessions' 62 runs: no fit 4.0 %, the
# calibration alone 3.9 %, with the factor 4.1 % (27.3 %: in the sixth the two configurations beside 8b_sat put its
# factor at 1.35 where its own runs sit near 1, and 8b_sat, near saturation, comes out +17.6 %; its factor's
# standard error says so: 1.35 +- 0.20, the spread of its six runs' own factors over the root of six, where every
# other row's is 0.02-0.11). The factor beats no fit in 14 of the 26 (configuration, session) rows. Bounds: achieved
# + 2, the factor better than no fit and no fit better than the calibration alone on the mean, which rows the factor
# beats no fit in, and which rows' factors come from runs that disagree (standard error over 0.15).
# The ninth session (2026-12-06 03:30, realrun/traces/h100_probe: nine of the configurations on one machine, 27 runs,
# the host probe beside them) adds 27 runs: over all 107, no fit 5.6 % (max 32.2 %), the calibration alone 7.7 %
# (54.1 %), with the factor 3.8 % (27.0 %), against a run-to-run spread of mean JCT across the sessions of 6.9 %; each of
# its nine rows better with the factor than with no fit (test below). The tenth (2026-12-06 05:54,
# realrun/traces/h100_probe2: nine configurations again on another machine, 30 runs, a host the probe timed at about
# twice the ninth's) brings 137 runs: no fit 5.1 % (max 32.2 %), the calibration alone 6.6 % (54.1 %), with the factor
# 3.6 % (27.0 %), against a run-to-run spread of mean JCT across the sessions of 6.6 %; three of its nine rows worse
# with the factor than with no fit (test below). The eleventh (06:22, realrun/traces/h100_probe3: four configurations,
# 12 runs, both calls cut short by the session's device time), whose configurations give each other 0.93-1.02, is
# worse with the factor in three of its four (8b_2.5gbps 9.2 against 4.0 %, 8b_sat 7.0 against 3.0 %, 8b_small 2.0
# against 1.2 %): over all 149 runs no fit 4.9 % (max 32.2 %), the calibration alone 6.5 % (54.1 %), with the factor
# 3.8 % (27.0 %), run to run +-6.5 %. The twelfth (07:57, realrun/traces/h100_probe4: the nine configurations again on
# another machine, four of them twice, 39 runs), whose configurations give each other 1.05-1.09, is worse with the
# factor in five of its nine (test below): over all 188 runs no fit 4.5 % (max 32.2 %), the calibration's gpu and link
# terms alone 4.6 % (28.4 %), the calibration alone 5.7 % (54.1 %), with the factor 3.8 % (27.0 %), p50 TPOT / TTFT
# 4.0 / 6.7 % (no fit 4.6 / 9.0 %), run to run +-6.0 % (p50 TPOT / TTFT +-5.8 / +-8.9 %); 23 of the 57 rows worse with
# the factor than with no fit.
H100 = ROOT / "realrun/traces/index_h100.csv"
# Since the h100g scenarios carry the H100 probes' busy-link levels (the loop's 1.28 + 0.0089 per Gbps where hostcal's
# H200 runs gave 1.31 + 0.0258; the prefill floor's 1.047 + 0.0148): no fit 4.8 % (max 29.6 %), the calibration alone
# 6.4 % (51.0 %), with the factor 4.3 % (27.0 %); 8b_mem at 16:26 turns worse with the factor (6.2 against 4.9 %) and
# 8b_small at 14:35 better (3.4 against 3.9 %). With the eager prefill's exposed host time in the h100g and h200g
# scenarios (prefill.host_exposed_s_*, realrun.prefillprof): over the 188 runs no fit 4.7 % (max 32.2 %), the
# calibration's gpu and link terms alone 4.6 % (28.4 %), the calibration alone 5.6 % (53.6 %), with the factor 3.7 %
# (27.4 %), p50 TPOT / TTFT 3.9 / 6.1 % (no fit 4.9 / 7.8 %); 24 of the 57 rows worse with the factor than with no
# fit, seven rows having changed sides, each by at most 0.4 points. With the first-seen prefill time
# (prefill.host_first_seen_s_per_iteration in the h100g and h200g scenarios and the fit): no fit 4.7 % (32.2 %), the gpu
# and link terms alone 4.5 % (28.4 %), the calibration alone 5.4 % (52.4 %), with the factor 3.5 % (26.6 %); 22 of the
# 57 rows worse with the factor than with no fit (70b8l_1gbps at 12:34 turned worse by 0.1 point; three rows better).
# With the share of the first-seen time a GPU-bound batch shows (prefill.host_first_seen_fade_s): no fit 4.8 % (32.2 %),
# the gpu and link terms alone 4.4 % (28.4 %), the calibration alone 5.3 % (52.5 %), with the factor 3.4 % (24.4 %);
# 21 of the 57 rows worse with the factor than with no fit (70b8l_1gbps at 12:34 better again).
H100_PCT = {"jct_mean_abs_error_pct": 3.8 + 2, "jct_max_abs_error_pct": 27.0 + 2}
H100_FACTOR_NOT_BETTER = {
    ("h100g_70b8l_1gbps", "h100-2026-12-05-1626"),
    ("h100g_70b8l_1gbps", "h100-2026-12-05-1649"),
    ("h100g_70b8l_2.5gbps", "h100-2026-12-05-1937"),
    ("h100g_70b8l_dq", "h100-2026-12-06-0554"),
    ("h100g_70b8l_dq", "h100-2026-12-06-0757"),
    ("h100g_8b_2.5gbps", "h100-2026-12-05-1626"),
    ("h100g_8b_2.5gbps", "h100-2026-12-06-0622"),
    ("h100g_8b_2.5gbps", "h100-2026-12-06-0757"),
    ("h100g_8b_kvsat", "h100-2026-12-05-1937"),
    ("h100g_8b_light", "h100-2026-12-05-1435"),
    ("h100g_8b_mem", "h100-2026-12-05-1649"),
    ("h100g_8b_mem", "h100-2026-12-06-0554"),
    ("h100g_8b_mem", "h100-2026-12-06-0757"),
    ("h100g_8b_sat", "h100-2026-12-05-1937"),
    ("h100g_8b_sat", "h100-2026-12-06-0622"),
    ("h100g_8b_sat25", "h100-2026-12-05-2203"),
    ("h100g_8b_short10", "h100-2026-12-05-2203"),
    ("h100g_8b_small", "h100-2026-12-05-1649"),
    ("h100g_8b_small", "h100-2026-12-06-0554"),
    ("h100g_8b_small", "h100-2026-12-06-0622"),
    ("h100g_8b_small", "h100-2026-12-06-0757"),
}
H100_FACTOR_RUNS_DISAGREE = {("h100g_8b_sat", "h100-2026-12-05-1937"), ("h100g_8b_kvsat", "h100-2026-12-05-1937")}


def _with_index_all(all_fit, index: Path) -> dict:
    """validate --cv --base on `index` with the calibration over every H200 session (all_fit) as the base."""
    from simulator.crossval import cross_validate_machine

    base = {n: (v, all_fit.stderr.get(n)) for n, v in all_fit.fitted.items()}
    return cross_validate_machine(index, base, "index_all", workers=2)


def _session_priced(all_fit, index: Path, traces: int, bounds: dict[str, float]) -> dict:
    """validate --cv --base on `index` with the calibration over every H200 session: `traces` runs, no notes, the
    factor's figures within `bounds`, and the calibration's kernel and link terms on the scenarios' host terms within
    half a point of no fit or better (index_h100 4.6 against 4.5 %, h100_probe 7.6 against 8.0, h100_probe2 3.5
    against 3.3, h100_probe4 2.5 against 3.1, h200_midlink 11.2 against 12.0)."""
    r = _with_index_all(all_fit, index)
    assert r["traces"] == traces and not r["notes"]
    for k, bound in bounds.items():
        assert r["machine_refit"][k] <= bound, r["machine_refit"]
    mean = {s: r[s]["jct_mean_abs_error_pct"] for s in ("no_fit", "base_gpu_link")}
    assert mean["base_gpu_link"] < mean["no_fit"] + 0.5, mean
    return r


def _priced_with_machine_factors(all_fit, index: Path, traces: int, bounds: dict[str, float]) -> dict:
    """_session_priced, and on the mean the factor better than no fit, no fit better than the calibration alone (the
    sessions' hosts run faster than the calibration's, mostly)."""
    r = _session_priced(all_fit, index, traces, bounds)
    mean = {s: r[s]["jct_mean_abs_error_pct"] for s in ("machine_refit", "no_fit", "base")}
    assert mean["machine_refit"] < mean["no_fit"] < mean["base"], mean
    return r


def test_the_h200_calibration_carries_to_an_h100(all_fit):
    r = _priced_with_machine_factors(all_fit, H100, 188, H100_PCT)  # the seventh and ninth sessions' fast hosts
    rows = {(c["configuration"], c["machine"]): c for c in r["configurations"]}
    assert len(rows) == 57 and len({c for c, _ in rows}) == 11, sorted(rows)
    for key, c in rows.items():
        assert 0.6 < c["machine_factor"] < 1.4, c
        assert (c["machine_factor_stderr"] > 0.15) == (key in H100_FACTOR_RUNS_DISAGREE), c
        better = c["machine_refit_jct_mean_abs_error_pct"] < c["no_fit_jct_mean_abs_error_pct"]
        assert better == (key not in H100_FACTOR_NOT_BETTER), c
    assert {tuple(x) for x in r["worse_than_no_fit"]} == H100_FACTOR_NOT_BETTER  # what validate's output flags


# One session of nine configurations (realrun/traces/h100_probe, an H100, 2026-12-06 03:30: every configuration the
# earlier H100 sessions recorded but 70b8l_dq and 8b_light, all on one machine): each configuration priced by the
# calibration over every H200 session with the host factor fitted on the session's eight others. Its host runs the host
# terms at 0.65-0.69 of the calibration's, and the eight others agree on it (+- 0.013-0.022): no fit 8.0 % (max
# 32.2 %), the calibration alone 11.3 % (54.1 %), with the factor 2.2 % (9.3 %), every configuration better than with
# no fit (docs/calibration.md, "Another GPU and host"). Bounds: achieved + 2.
H100_PROBE = ROOT / "realrun/traces/h100_probe/index.csv"
H100_PROBE_PCT = {"jct_mean_abs_error_pct": 2.2 + 2, "jct_max_abs_error_pct": 9.3 + 2}


def test_a_session_of_nine_configurations_shares_one_host_factor(all_fit):
    r = _priced_with_machine_factors(all_fit, H100_PROBE, 27, H100_PROBE_PCT)
    assert len(r["configurations"]) == 9 and not r["worse_than_no_fit"]
    for c in r["configurations"]:
        assert 0.6 < c["machine_factor"] < 0.75 and c["machine_factor_stderr"] < 0.05, c
        assert c["machine_refit_jct_mean_abs_error_pct"] < c["no_fit_jct_mean_abs_error_pct"], c
    # each configuration's own runs (the diagnostic): the two of short prompts, whose 32-layer prefills wait on the
    # host, give 0.60 where their eight session-mates give 0.69, and are flagged; the others agree
    split = {c["configuration"]: c["machine_factor_own"] for c in r["configurations"] if c["factor_disagrees"]}
    assert all(0 < c["machine_factor_between_sd"] < 0.2 for c in r["configurations"])  # eight others each
    assert split == {
        "h100g_8b_2.5gbps": pytest.approx(0.60, abs=0.03),
        "h100g_8b_short10": pytest.approx(0.60, abs=0.03),
    }


# The same nine configurations on another H100 machine (realrun/traces/h100_probe2, 2026-12-06 05:54, 30 runs: 8b_small
# twice), whose host runs the host terms at 1.12-1.17 of the calibration's (the ninth's 0.65-0.69), the eight others
# agreeing on each (+- 0.031-0.035): no fit 3.5 % (max 20.2 %), the calibration alone 2.9 % (14.8 %), with the factor
# 3.1 % (10.8 %); the factor is better than no fit in six of the nine and worse in 70b8l_dq (3.2 against 1.3 %),
# 8b_mem (4.9 against 0.8 %) and 8b_small (3.6 against 2.5 %), each inside its configuration's run-to-run spread
# (+-2.8, +-7.5, +-5.1 %). On a slow host the scenarios' own host terms (hostcal's) are near right already. With the
# eager prefill's exposed host time: no fit 3.3 % (19.6 %), the calibration alone 2.9 % (14.9 %), with the factor 3.0 %
# (10.8 %); 70b8l_1gbps turns worse with the factor too (1.84 against 1.80 %). With the first-seen prefill time: no fit
# 3.3 % (19.6 %), the calibration alone 2.9 % (15.2 %), with the factor 2.9 % (10.5 %); 70b8l_1gbps better with the factor
# again. Bounds: achieved + 2.
H100_PROBE2 = ROOT / "realrun/traces/h100_probe2/index.csv"


def test_a_slower_session_of_the_same_nine_configurations(all_fit):

    r = _session_priced(
        all_fit, H100_PROBE2, 30, {"jct_mean_abs_error_pct": 3.1 + 2, "jct_max_abs_error_pct": 10.8 + 2}
    )
    assert len(r["configurations"]) == 9
    assert r["machine_refit"]["jct_mean_abs_error_pct"] < r["no_fit"]["jct_mean_abs_error_pct"]
    for c in r["configurations"]:
        assert 1.05 < c["machine_factor"] < 1.25 and c["machine_factor_stderr"] < 0.05, c
    assert {c for c, _ in r["worse_than_no_fit"]} == {
        "h100g_70b8l_dq",
        "h100g_8b_mem",
        "h100g_8b_small",
    }


# The nine configurations on a fourth probed H100 machine (realrun/traces/h100_probe4, 2026-12-06 07:57, four device
# calls: 8b_small, 8b_sat, 70b8l_2.5gbps and 8b_kvsat recorded twice, 39 runs), whose host the probe timed as slow as the
# tenth's (median 1.745 against 1.757 ms) while its configurations give each other 1.048-1.088 (the tenth's 1.12-1.17),
# the eight others agreeing on each (+- 0.026-0.030): no fit 3.0 % (max 11.1 %), the calibration's gpu and link terms
# alone 2.5 % (8.8 %), the calibration alone 2.8 % (9.9 %), with the factor 3.7 % (12.7 %). The factor is worse than no
# fit on the mean, as in the eleventh session, and in five of the nine: 70b8l_2.5gbps (1.2 against 1.0 %), 70b8l_dq (7.9
# against 3.8 %, outside its +-3.7 % run to run; the gpu and link terms alone give it 7.5 %), 8b_2.5gbps (7.9 against
# 2.0 %), 8b_mem (5.5 against 2.5 %) and 8b_small (4.5 against 3.6 %), whose own runs put the factor at 0.94 where its
# eight session-mates give 1.088 (flagged). With the eager prefill's exposed host time: no fit 3.1 % (9.3 %), the gpu
# and link terms alone 2.5 % (7.9 %), the calibration alone 2.7 % (9.2 %), with the factor 3.7 % (11.9 %); worse than no
# fit in 70b8l_dq (6.9 against 4.4 %), 8b_2.5gbps (7.7 against 2.0 %), 8b_mem (5.3 against 3.1 %), 8b_sat (4.99 against
# 4.96 %) and 8b_small (4.6 against 4.1 %); 70b8l_2.5gbps now better (1.54 against 1.56 %). With the first-seen prefill
# time: no fit 3.2 % (9.3 %), the gpu and link terms alone 2.5 % (7.7 %), the calibration alone 2.6 % (8.4 %), with the
# factor 3.5 % (11.5 %); 8b_sat no longer worse than no fit. Bounds: achieved + 2; the gpu
# and link terms alone within half a point of no fit or better; the factor worse than no fit on the mean, a known miss
# this test pins, and in which configurations.
H100_PROBE4 = ROOT / "realrun/traces/h100_probe4/index.csv"


def test_a_twelfth_session_where_the_factor_does_not_carry(all_fit):

    r = _session_priced(
        all_fit, H100_PROBE4, 39, {"jct_mean_abs_error_pct": 3.7 + 2, "jct_max_abs_error_pct": 12.7 + 2}
    )
    assert len(r["configurations"]) == 9
    mean = {s: r[s]["jct_mean_abs_error_pct"] for s in ("machine_refit", "no_fit")}
    assert mean["no_fit"] < mean["machine_refit"], mean  # 3.1 against 3.7 %: the known miss
    for c in r["configurations"]:
        assert 1.0 < c["machine_factor"] < 1.15 and c["machine_factor_stderr"] < 0.05, c
    split = {c["configuration"]: c["machine_factor_own"] for c in r["configurations"] if c["factor_disagrees"]}
    assert split == {"h100g_8b_small": pytest.approx(0.94, abs=0.03)}
    assert {c for c, _ in r["worse_than_no_fit"]} == {
        "h100g_70b8l_dq",
        "h100g_8b_2.5gbps",
        "h100g_8b_mem",
        "h100g_8b_small",
    }


# A session no fit has seen on the H200 (realrun/traces/h200_midlink, 2026-12-06: 8b_sat25 and 8b_short10, never
# recorded on an H200 before), priced by the calibration over every earlier session: that session's host ran the host
# terms at 0.6-0.7 of the calibration's, so the calibration alone is off by 22.3 % (max 41.2 %) where no fit is by
# 12.0 % (22.2 %), a known miss this test pins; the factor from the session's other configuration brings it to 3.8 %
# (8.8 %) (docs/calibration.md, "Two configurations the H200 had not recorded"). Bounds: achieved + 2, the factor better
# than no fit, better than the calibration alone, in each configuration.
H200_MIDLINK = ROOT / "realrun/traces/h200_midlink/index.csv"
H200_MIDLINK_PCT = {"jct_mean_abs_error_pct": 3.8 + 2, "jct_max_abs_error_pct": 8.8 + 2}


def test_a_new_h200_session_is_priced_with_its_host_factor(all_fit):
    r = _priced_with_machine_factors(all_fit, H200_MIDLINK, 6, H200_MIDLINK_PCT)  # the session's fast host
    for c in r["configurations"]:
        assert c["machine_factor"] < 0.8, c
        assert c["machine_refit_jct_mean_abs_error_pct"] < c["no_fit_jct_mean_abs_error_pct"], c


# The same part on another H200 machine two hours later (realrun/traces/h200_midlink2, 2026-12-06 03:56, the host probe
# beside it): mean JCT -3 to +10 % off the first session's, and the two configurations disagree on the host, as the H100s'
# eighth session's did: 8b_short10's runs put 8b_sat25's factor at 0.64, 8b_sat25's put 8b_short10's at 0.82. No fit
# 8.9 % (max 25.8 %), the calibration alone 17.0 % (45.4 %), with the factor 8.8 % (19.1 %), 8b_sat25 worse with it
# than with no fit (5.2 against 2.7 %). Bounds: achieved + 2; the calibration alone worse than no fit (a known miss),
# and which configuration the factor does not help.
H200_MIDLINK2 = ROOT / "realrun/traces/h200_midlink2/index.csv"
H200_MIDLINK2_PCT = {"jct_mean_abs_error_pct": 8.8 + 2, "jct_max_abs_error_pct": 19.1 + 2}


def test_a_second_h200_session_of_the_two_configurations_disagrees_on_its_host(all_fit):
    from tests.recorded_runs import check_recorded_run, rows

    for row in rows(H200_MIDLINK2):
        meta = check_recorded_run(H200_MIDLINK2.parent / row["trace"], ROOT / row["scenario"])
        assert meta["gpu"] == "NVIDIA H200" and meta["wall_end_s"] > meta["wall_start_s"]
    r = _with_index_all(all_fit, H200_MIDLINK2)
    assert r["traces"] == 6 and not r["notes"]
    for k, bound in H200_MIDLINK2_PCT.items():
        assert r["machine_refit"][k] <= bound, r["machine_refit"]
    assert r["base"]["jct_mean_abs_error_pct"] > r["no_fit"]["jct_mean_abs_error_pct"] + 5
    f = {c["configuration"]: c["machine_factor"] for c in r["configurations"]}
    assert f["h200g_8b_sat25"] < 0.7 and f["h200g_8b_short10"] > 0.75, f
    assert all(c["factor_disagrees"] for c in r["configurations"])  # each one's own runs give the other's factor
    assert all(c["machine_factor_between_sd"] is None for c in r["configurations"])  # one other: no spread to give
    assert [tuple(x) for x in r["worse_than_no_fit"]] == [("h200g_8b_sat25", "h200-2026-12-06-0355")]


# Two configurations no H100 run had (realrun/traces/h100_new, an H100, 2026-12-07 09:20: 8b_pbatch at 10 requests/s,
# prefill batches of up to four, and 70b8l_40gbps at 20, every method, rates the simulator set before they ran) beside
# 8b_small: the calibration over every H200 session with the factor from the session's other configurations (0.68-0.73,
# a fast host) gives 8b_pbatch 2.4 % and 70b8l_40gbps 4.0 % against 8.6 and 10.4 % with no fit; the session's nine
# runs 3.1 % (max 5.5 %) against 9.7 % (14.8 %), the calibration alone 11.1 % (23.3 %) (docs/calibration.md, "The H100
# calibration on configurations it has not seen"). Bounds: achieved + 2.
H100_NEW = ROOT / "realrun/traces/h100_new/index.csv"


def test_two_configurations_new_to_the_h100_with_the_sessions_factor(all_fit):
    r = _priced_with_machine_factors(
        all_fit, H100_NEW, 9, {"jct_mean_abs_error_pct": 3.1 + 2, "jct_max_abs_error_pct": 5.5 + 2}
    )
    assert {c["configuration"] for c in r["configurations"]} == {
        "h100g_8b_small",
        "h100g_8b_pbatch",
        "h100g_70b8l_40gbps",
    }
    assert not r["worse_than_no_fit"]
    for c in r["configurations"]:
        assert 0.6 < c["machine_factor"] < 0.8 and c["machine_factor_stderr"] < 0.05, c
        assert c["machine_refit_jct_mean_abs_error_pct"] < c["no_fit_jct_mean_abs_error_pct"] - 4, c


# The same two beside 8b_small in a third session (realrun/traces/h100_new3, 2026-12-07 11:57, another machine) whose
# host runs at about the calibration's speed (factors 0.91-0.98): no fit is already at 3.5 % (max 7.7 %) there, and the
# calibration over every H200 session with the factor gives 3.7 % (9.8 %), 70b8l_40gbps and 8b_pbatch by 1.0 and 1.7
# points worse than no fit (8b_pbatch's KVQuant-style run priced 7.7 % short with no fit, its host slow); the factor
# pays where the host differs from the calibration's (docs/calibration.md, "The H100 calibration on configurations it
# has not seen").
# Bounds: achieved + 2.
H100_NEW3 = ROOT / "realrun/traces/h100_new3/index.csv"


def test_a_host_at_the_calibrations_speed_leaves_the_factor_nothing_to_gain(all_fit):
    r = _session_priced(all_fit, H100_NEW3, 9, {"jct_mean_abs_error_pct": 3.7 + 2, "jct_max_abs_error_pct": 9.8 + 2})
    for c in r["configurations"]:
        assert 0.85 < c["machine_factor"] < 1.05, c
    mean = {s: r[s]["jct_mean_abs_error_pct"] for s in ("machine_refit", "no_fit")}
    assert abs(mean["machine_refit"] - mean["no_fit"]) < 1.0, mean
    assert {c for c, _ in r["worse_than_no_fit"]} == {"h100g_70b8l_40gbps", "h100g_8b_pbatch"}


# Long prompts no H100 run had (realrun/traces/h100_long, 2026-12-07 13:10, one machine: 8b_long, 8-16K-token prompts at
# 0.8 req/s, and 70b8l_long, 6-12K at 1.2, every method, rates the simulator set before they ran) beside 8b_small: no fit
# is already close on the long ones (3.0 and 3.5 %; 8b_small 9.1 %, a fast host); the calibration over every H200
# session, whose 8B prompts stop at 16K and whose 70B's at 12K, with the factor from the session's other configurations
# (0.73-0.84) gives 1.4, 1.4 and 4.0 %; the nine runs 2.3 % (max 8.4 %) against 5.2 % (13.1 %), each configuration
# better than no fit (docs/calibration.md, "The H100 calibration on configurations it has not seen"). Bounds: achieved + 2.
H100_LONG = ROOT / "realrun/traces/h100_long/index.csv"


def test_long_prompts_new_to_the_h100_with_the_sessions_factor(all_fit):
    r = _session_priced(all_fit, H100_LONG, 9, {"jct_mean_abs_error_pct": 2.3 + 2, "jct_max_abs_error_pct": 8.4 + 2})
    assert not r["worse_than_no_fit"]
    for c in r["configurations"]:
        assert 0.65 < c["machine_factor"] < 0.9, c
        assert c["machine_refit_jct_mean_abs_error_pct"] < c["no_fit_jct_mean_abs_error_pct"], c
