"""The engine calibration cross-validated on the committed graph-mode H200 traces (realrun/traces/h200_graphs):
the held-out errors docs/calibration.md quotes ("Calibrating an engine from measured runs"), each bound the achieved
figure plus 2 percentage points, so a change that makes the held-out predictions worse fails here and
tightening a bound records an improvement.  Held out: each trace predicted by a calibration fitted without
it (leave one trace out) and without its configuration (leave one configuration out); beside them, no fit.

One cross-validation (34 fits, 108 simulations) in two processes, shared by the tests of this module: about five
minutes as Python. The fit over every session's runs, and what it carries to: tests/test_calibrate_measured_sessions.py.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from simulator.crossval import cross_validate

ROOT = Path(__file__).resolve().parent.parent
INDEX = ROOT / "realrun/traces/h200_graphs/index.csv"
ALL = ROOT / "realrun/traces/index_all.csv"

# achieved (docs/calibration.md) + 2 pp. Since a homomorphic prefill quantizes inside its forward (HACK's prefill
# was priced 2-5 ms short a request, its quantize kernel placed after the forward under the pack's floor) and the
# prefill floor takes its own busy-link factor (hostcal): held out by configuration 5.0 -> 4.4 % mean, 18.7 ->
# 13.8 % max (8b_sat HACK r9), no fit 8.4 -> 7.4 % (before: FP16's pack priced, each method's quantize floor fitted
# from its own start, hostcal's quantize floors, prefill floor priors twice hostcal's standard errors: 5.6 -> 5.0 %)
# The decode iterations after a prefill on the shared GPU (decode.after_prefill_slowdown_fraction, measured by
# realrun.transient, not fitted): held out by configuration 4.4 -> 4.2 %, max 13.8 -> 13.0 %; by trace 4.3 -> 4.0 %.
# The prefills' clock slowdown (decode.after_prefill_clock_fraction, the power cap, measured by realrun.transient with
# the GPU's clock logged, not fitted): by configuration 4.24 -> 4.13 % (max 13.04 -> 13.00 %), by trace 4.05 -> 3.93 %.
# The iteration after a request leaves (decode.leave_s_per_request, hostcal's 0.18 ms in the scenarios, fitted): by
# configuration 4.13 -> 4.03 % (max 13.00 -> 12.44 %), by trace 3.93 -> 3.77 % (max 12.4 -> 11.9 %).
# The KV copies at a batch change (decode.kv_placement_gb_per_s, measured by realrun.placecal, not fitted): by
# configuration 4.03 -> 3.95 % (max 12.44 -> 12.07 %), by trace 3.77 -> 3.70 % (max 11.9 -> 12.1 %).
# The prefill efficiency on the model's work only, HACK's homomorphic attention at its profiled price (realrun.prefillcal:
# HACK's prefill is not power-capped; for the long prompts of realrun/traces/h200_long): by configuration 3.95 -> 4.18 %
# (max 12.07 -> 13.35 %), by trace 3.70 -> 3.85 % (max 12.1 -> 13.3 %).
# The after-prefill transient saturating and the clock lagging (realrun.transient with 0.2-0.9 s prefills, not
# fitted): by configuration 4.18 -> 4.22 % (max 13.35 -> 13.72 %), by trace 3.85 -> 3.97 % (max 13.3 -> 13.7 %).
# The CPU's time a pass of the loop through a prefill adds (prefill.host_serial_s_per_iteration, 0.40 ms from
# realrun.transient's probes in the scenarios, fitted to the traces' handoff items: 0.40 ms): by configuration 4.22 ->
# 3.9 % (max 13.7 -> 12.5 %), by trace 3.97 -> 3.7 % (max 13.7 -> 12.8 %); no fit 6.5 -> 5.7 %.
# The probes' fit with the sustained-duty and short-prefill runs (2026-12-05; fraction 0.0163, decay 0.719, saturation
# 0.0864 s, clock 0.0161, tau 0.116 s, the pass 0.34 ms): by configuration 3.9 -> 3.9 % (max 12.5 -> 12.4 %), by trace
# 3.7 -> 3.7 % (max 12.8 -> 12.7 %).
# The decode attention's share of the padding to the batch's longest context (attention_padding_share, measured by
# realrun.transient --mix, not fitted): with the first session's probe (the 8B's HACK 0.26, KVQuant-style 0.09) by
# configuration 3.9 -> 3.4 % (max 12.4 -> 9.8 %), by trace 3.7 -> 3.3 % (max 12.7 -> 10.4 %); with both sessions'
# (8B 0.05 / 0.12 / 0.19, the 70B-8L's KVQuant-style 0.09 and HACK 0.82) by configuration 3.5 % (max 10.7 %), by trace
# 3.4 % (max 11.2 %); no fit 5.7 -> 5.1 %.
# Each item's error relative to its price, renewed at the optimum (calibrate.item_scales), where it was relative to
# its own measured time (which fits a noisy term under its mean): in-sample 3.1 -> 3.1 % (max 10.5 -> 8.3 %), by
# trace 3.4 -> 3.7 % (max 11.2 -> 9.9 %), by configuration 3.5 -> 4.1 % (max 10.7 -> 12.0 %).
# The busy link's host levels from the harness's own link (realrun.transient's xfer and xferpre probes on the H200 host:
# the loop 1.026 + 0.0142 per Gbps, the prefill floor 1.0 + 0.0149, where hostcal's second link gave 1.31 + 0.0258 and
# 1.35 + 0.0100; the 27 fit 1.09 + 0.0136 from hostcal's prior, 1.08 + 0.0116 from the probes'): by configuration 4.1
# -> 4.1 % (max 12.0 -> 11.9 %, p50 TTFT 8.4 -> 7.7 %), by trace 3.7 -> 3.7 % (max 9.9 -> 9.8 %); no fit 5.1 -> 5.9 % (max 16.9 -> 19.1 %, 8b_sat HACK r9: the
# higher levels had covered part of what the fit puts in the prefill's efficiency and floors).
# The eager prefill's exposed host time (prefill.host_exposed_s_*: 0.49 ms + 0.0145 ms per layer from
# realrun.prefillprof, the eager forward against its CUDA-graph replay on three H100 hosts; not fitted to any trace): by
# configuration 4.1 -> 3.4 % (max 11.9 -> 11.4 %, p50 TTFT 7.7 -> 6.6 %, p50 TPOT 4.4 -> 3.6 %), by trace 3.7 -> 3.4 %
# (max 9.8 -> 10.6 %, p50 TTFT 6.5 -> 6.1 %, p50 TPOT 3.8 -> 3.5 %), in-sample 3.1 -> 2.6 %; no fit 5.9 -> 5.1 % (max
# 19.1 -> 16.6 %, p50 TTFT 13.8 -> 10.9 %).
# A prefill batch of a token count its process had not run (prefill.host_first_seen_s_per_iteration, 1.63 ms on the
# host floor, from realrun.prefillprof --first-seen; flagged in the first run of each process): by configuration 3.4 ->
# 3.4 % (max 11.4 -> 10.9 %, p50 TTFT 6.6 -> 6.4 %), by trace 3.4 -> 3.5 % (max 10.6 -> 11.8 %, 8b_2.5gbps
# KVQuant-style; p50 TTFT 6.1 -> 6.9 %, p50 TPOT 3.5 -> 3.7 %), in-sample 2.6 -> 2.6 % (max 7.8 -> 8.2 %); no fit 5.1
# -> 5.1 % (p50 TTFT 10.9 -> 10.6 %).
# The share of that time a GPU-bound batch shows, exp(-T / 46 ms) (prefill.host_first_seen_fade_s, from
# realrun.prefillprof --first-seen-fade-fit; with the link's round robin and chunk-rate ceiling before it): by
# configuration 3.3 -> 3.5 % (max 10.8 -> 10.3 %, p50 TTFT 6.6 -> 6.0 %, p50 TPOT 3.6 -> 3.7 %), by trace 3.4 -> 3.5 %
# (max 11.8 -> 12.3 %, p50 TTFT 6.2 -> 6.1 %, p50 TPOT 3.6 -> 3.8 %), in-sample 2.5 -> 2.6 %; no fit 5.0 -> 5.0 % (p50
# TTFT 10.9 -> 10.4 %).
# The method factors' narrow prior where the runs executed the profiled kernels (engine.PROFILED_FACTOR_PRIOR_WIDTH,
# 10 % for realrun on a measured profile, ln 2 before; KVQuant-style's dequantization, fitted 0.97 before, is held at 1):
# by configuration 3.5 -> 3.5 % (max 10.3 -> 9.9 %, p50 TTFT 6.0 -> 6.0 %, p50 TPOT 3.7 -> 3.7 %), by trace 3.5 -> 3.5 %
# (max 12.3 -> 12.4 %, p50 TTFT 6.1 -> 6.3 %, p50 TPOT 3.8 -> 3.7 %), in-sample 2.6 -> 2.7 %.
HELD_OUT = {
    "jct_mean_abs_error_pct": 3.5 + 2,
    "jct_max_abs_error_pct": 12.4 + 2,
    "tpot_p50_mean_abs_error_pct": 3.7 + 2,
    "ttft_p50_mean_abs_error_pct": 6.3 + 2,
}
HELD_OUT_CONFIGURATION = {
    "jct_mean_abs_error_pct": 3.5 + 2,
    "jct_max_abs_error_pct": 9.9 + 2,
    "tpot_p50_mean_abs_error_pct": 3.7 + 2,
    "ttft_p50_mean_abs_error_pct": 6.0 + 2,
}
TRACES_WITHIN_10PCT = 27 - 2
# the KVQuant-style dequantization traces: |predicted - measured share of JCT| in pp, achieved + 2
DEQUANTIZE_SHARE_PP = {"h200g_70b8l_dq_kvquant_r7.3": 0.2 + 2, "h200g_70b8l_dq_kvquant_r8.8": 0.0 + 2}
# Held out, since the busy link's levels come from the harness's own link (the probes above), three: 70b8l_1gbps, 2.6
# against 2.1 % (by 0.5 points; its recordings spread +-3.0 %: its no fit, at 1 Gbps, gains most from the lower level),
# 8b_2.5gbps, 6.4 against 5.6 % (by 0.8; +-10.4 %), and 8b_mem, 6.5 against 3.6 % (by 2.8; +-3.6 %).
# Held out, since each item's error is relative to its price (calibrate.item_scales), two: 8b_2.5gbps, 6.9 against
# 5.7 % (by 1.1 points; its recordings spread +-11.3 %), and 8b_mem, 6.6 against 4.6 % (by 2.0 points, +-4.8 %): the
# unbiased fit prices their FP16 and KVQuant-style runs long (8b_mem KVQuant-style r8.5 +12 %), where the low pull of
# errors relative to the measured times had offset terms priced long there; 70b8l_2.5gbps is now 1.5 against 2.0 %.
# Held out, since the attention's padding share (both sessions' probe; the scenarios carry it, so no fit moves too),
# one: 70b8l_2.5gbps, 2.5 against 2.0 % (by 0.5 points; its recordings spread +-5.3 %; the fit's HACK decode kernels
# per layer, shared by the two models, fall now the padding is priced). With the first session's probe alone, two:
# that one and 8b_mem, 4.5 against 3.8 % (a fold without it fitted KVQuant-style's dequantization 1.06, pricing its
# memory-bound KVQuant-style decode +6.4 and +9.5 %; no fit 4.6 % now). Before it, since a pass through a prefill costs the CPU its serial time (the scenarios carry the probes' 0.40 ms, so no
# fit improves too), one: 70b8l_2.5gbps, 2.3 against 2.0 % (by 0.3 points; its recordings spread +-5.3 %); 8b_2.5gbps
# 5.7 against 5.8 %. Since the prefill efficiency leaves HACK's homomorphic attention at its profiled price
# (docs/calibration.md, "Long prompts"), 8b_2.5gbps was predicted worse than with no fit too: 5.86 against 5.71 % (by 0.15 points; its
# recordings spread +-9.9 % across sessions; 5.85 against 5.60 % and 70b8l_2.5gbps 3.31 against 2.30 % since the
# after-prefill terms saturate: a fold without 8b_2.5gbps, whose 32-layer FP16 prefills at 130-384 tokens are the only
# host-bound short ones, fits the prefill floor per layer from 8-layer runs, 0.53 ms, and prices them +35 %). Before that, one: 70b8l_2.5gbps, 3.3 against 2.4 % (with the clock
# term; 3.1 against 2.6 % with the after-prefill term alone; before it 3.0 against 2.8 %; it was 2.85
# against 2.87 %): the fit pulls the busy-link host factor from hostcal's 1.31 to 1.00, 3.1 prior widths, a conflict
# `calibrate` lists; at hostcal's value that configuration is predicted at 2.1 %. (Before: 8b_2.5gbps, 9.5 against
# 8.2 %, while a prefill took the busy level for its whole length; 6.9 against 5.6 % once the scenarios carried
# hostcal's quantize floors, until the prefill floors' priors were set from hostcal's standard errors.) Any other
# configuration turning worse fails, and so does this one turning better (the list is exact).
# Since the share of the first-seen time a GPU-bound batch shows, four: 70b8l_1gbps 2.5 against 1.9 %, 70b8l_2.5gbps 1.5
# against 1.5 % (by less than 0.05 points), 8b_2.5gbps 6.2 against 5.6 % and 8b_mem 5.4 against 4.3 %, each inside its
# run-to-run spread (the fit takes the FP16 prefills' new time back by a faster prefill, which HACK's makes up by a
# larger homomorphic correction: docs/calibration.md, "How much of it shows behind a GPU-bound batch").
# Since the method factors' prior is 10 % wide on the profiled kernels, three: 70b8l_1gbps 2.5 against 1.9 %, 8b_2.5gbps
# 6.2 against 5.6 % and 8b_mem 5.3 against 4.3 %; 70b8l_2.5gbps 1.2 against 1.5 %. What moves when each leaves the fit is
# the busy link's host factor (its level and its growth per Gbps), not a kernel term.
WORSE_THAN_NO_FIT: list[str] = ["h200g_70b8l_1gbps", "h200g_8b_2.5gbps", "h200g_8b_mem"]


@pytest.fixture(scope="module")
def cv():
    return cross_validate(INDEX, workers=2)


@pytest.fixture(scope="module")
def graphs():
    """The 27 graph-mode traces as calibrate prices them (not changed by a fit)."""
    from simulator.calibrate import load_index

    return load_index(INDEX)


def test_held_out_errors_hold(cv):
    assert cv["traces"] == 27
    for key, bound in HELD_OUT.items():
        assert cv["held_out"][key] <= bound, (key, cv["held_out"][key])
    for key, bound in HELD_OUT_CONFIGURATION.items():
        assert cv["held_out_configuration"][key] <= bound, (key, cv["held_out_configuration"][key])
    assert cv["held_out"]["traces_jct_within_10pct"] >= TRACES_WITHIN_10PCT


def test_no_held_out_configuration_is_predicted_worse_than_with_no_fit(cv):
    """The fit carries: every configuration, predicted by a fit on the others, is predicted at least as well as
    by the kernels' prices and the scenario's own engine terms (the flag `validate --cv` raises), but for the known
    miss WORSE_THAN_NO_FIT names."""
    assert cv["worse_than_no_fit"] == WORSE_THAN_NO_FIT, [c for c in cv["configurations"] if c["worse_than_no_fit"]]
    assert len(cv["configurations"]) == 6
    # each of them lies outside the runs its fit saw (simulator/domain.py), and the flag says so
    from simulator.crossval import format_cv

    flag = next(line for line in format_cv(cv).splitlines() if line.startswith("flag: the fit predicts"))
    for c in cv["configurations"]:
        assert bool(c["outside_fit_runs"]) == (c["configuration"] not in ("h200g_70b8l_2.5gbps", "h200g_8b_sat")), c
    assert flag.count("it lies outside the runs its fit saw") == len(WORSE_THAN_NO_FIT), flag


# each method's mean JCT against FP16's over the same requests (18 rows: HACK and KVQuant-style at each configuration
# and rate), error in points, held out by configuration: achieved + 2 (docs/calibration.md, "A method against FP16")
AGAINST_FP16_HELD_OUT_PTS = {"mean_abs_error_pts": 4.6 + 2, "max_abs_error_pts": 14.3 + 2}


def test_each_method_against_fp16_held_out(cv):
    """The comparison a user asks of the simulator, HACK or KVQuant-style against FP16 on the same requests: held out
    by configuration within its bounds, and closer to the measured than no fit's (5.6 points mean, 26.2 max: the
    scenarios' own values, no fit involved)."""
    comp = cv["against_reference"]
    assert len(comp["rows"]) == 18 and all(r["reference"] == "baseline" for r in comp["rows"])
    held = comp["summary"]["held_out_configuration"]
    assert held["rows"] == 18
    for key, bound in AGAINST_FP16_HELD_OUT_PTS.items():
        assert held[key] <= bound, (key, held[key])
    none = comp["summary"]["no_fit"]
    assert none["mean_abs_error_pts"] == pytest.approx(5.6, abs=0.1) and none["max_abs_error_pts"] == pytest.approx(
        26.2, abs=0.1
    )
    assert held["mean_abs_error_pts"] < none["mean_abs_error_pts"]


def test_held_out_is_what_a_fit_without_the_trace_predicts(cv):
    """Held out differs from in-sample (the trace left the fit), and every trace has all three."""
    differ = 0
    for r in cv["per_trace"]:
        ins, out = r["in_sample"]["jct_mean_error_pct"], r["held_out"]["jct_mean_error_pct"]
        assert ins is not None and out is not None and r["held_out_configuration"]["jct_mean_error_pct"] is not None
        differ += abs(ins - out) > 1e-6
    assert differ >= 20


def test_dequantization_share_of_the_kvquant_traces(cv):
    shares = {s["trace"]: s for s in cv["dequantize_share"]}
    for trace, bound in DEQUANTIZE_SHARE_PP.items():
        assert abs(shares[trace]["held_out_error_pp"]) <= bound, shares[trace]
        assert shares[trace]["measured_pct"] > 5  # where dequantization is a visible share of JCT


# Two configurations no fit has seen (realrun/traces/h200_steps/index_new_configs.csv: the 8B HACK at 2 req/s, the
# 70B-8L HACK at 25 req/s over 40 Gbps), mean |JCT error| over the two: no fit 8.2 %, the engine fitted on all 27
# graph-mode traces 7.3 % (-4.6 and -10.1 %; 7.4 % before the after-prefill terms saturated; 7.1 % before the KV
# copies: the 70B run's 200 joins at the fit's lower join time). Since the pass through a prefill: no fit 7.1 %, fitted
# 6.9 %. Since the attention's padding share: no fit 6.9 % (-3.5 / -10.2 %), fitted 7.5 % (-5.4 / -9.5 %): the fit is
# worse than none there by 0.6 points, a known miss: the 8B HACK at batches of 4-5 (8b_light), where the padding is
# small, has its step's GPU time priced about 4 % short by the fit (1.8 % before), whose HACK decode kernels per layer
# fell once the larger batches' padding was priced. Since each item's error is relative to its price: fitted 6.0 %
# (-4.7 / -7.3 %), better than no fit again. Bounds: achieved + 2, and the fit no worse than no fit.
NEW_CONFIGS = ROOT / "realrun/traces/h200_steps/index_new_configs.csv"
NEW_CONFIGS_FITTED_PCT = 6.0 + 2
NEW_CONFIGS_FIT_OVER_NONE_PP = 0.0


def test_the_fit_carries_to_configurations_no_fit_has_seen(cv):
    from simulator.measured import read_index
    from simulator.validate import validate

    values = {name: r["value"] for name, r in cv["in_sample_fit"].items()}
    fitted, none = [], []
    for row in read_index(NEW_CONFIGS):
        fitted.append(abs(validate(row.trace_path, row.scenario_path, engine_values=values)["jct_mean_error_pct"]))
        none.append(abs(validate(row.trace_path, row.scenario_path)["jct_mean_error_pct"]))
    assert len(fitted) == 2
    mean_fitted, mean_none = sum(fitted) / 2, sum(none) / 2
    assert mean_fitted <= NEW_CONFIGS_FITTED_PCT, (fitted, none)
    assert mean_fitted <= mean_none + NEW_CONFIGS_FIT_OVER_NONE_PP, (fitted, none)


# Every configuration of the committed graph-mode recordings that the 27 do not have (realrun/traces/index_all.csv's
# seven others, 31 runs in eight sessions: 8b_kvsat, 8b_small, 8b_light, 8b_long, 70b8l_long, 70b8l_40gbps,
# 8b_pbatch), predicted by the engine fitted on the 27 as one machine: mean |JCT error| no fit 5.6 %, fitted 4.4 %
# (max 29.0 -> 22.5 %); better in five of the seven configurations, worse in 8b_light (3.5 -> 4.7 %) and 8b_long (2.6
# -> 3.4 %), the two one session alone recorded. The issue had found the fit on the 27 worse than no fit on new
# configurations (6.6 against 6.2 %). Bounds: achieved + 1.5, and better than no fit on the mean.
OTHER_CONFIGS_FITTED_PCT = 4.4 + 1.5


def test_the_fit_on_the_27_carries_to_every_other_committed_configuration(cv):
    from simulator.measured import read_index
    from simulator.validate import validate

    values = {name: r["value"] for name, r in cv["in_sample_fit"].items()}
    known = {row.scenario_path.stem for row in read_index(INDEX)}
    fitted, none = [], []
    for row in read_index(ALL):
        if row.scenario_path.stem in known:
            continue
        fitted.append(abs(validate(row.trace_path, row.scenario_path, engine_values=values)["jct_mean_error_pct"]))
        none.append(abs(validate(row.trace_path, row.scenario_path)["jct_mean_error_pct"]))
    assert len(fitted) == 31 and len(known) == 6
    mean_fitted, mean_none = sum(fitted) / len(fitted), sum(none) / len(none)
    assert mean_fitted <= OTHER_CONFIGS_FITTED_PCT, (mean_fitted, mean_none)
    assert mean_fitted < mean_none, (mean_fitted, mean_none)


# Every graph-mode run of the other H200 sessions (index_all.csv's 77 outside h200_graphs, and h200_midlink's and
# h200_midlink2's 12: 89 runs, 14 configurations, nine of them new to the fit), predicted by the engine fitted on the 27:
# the whole calibration 8.2 % (max 39.0 %), its gpu and link terms alone (calibration.engine_scopes [gpu, link]) 6.8 %
# (31.4 %), no fit 7.8 % (29.9 %) (docs/calibration.md, "engine_scopes"): its kernel and link terms carry to other
# sessions, its host terms are its sessions' hosts'. Bounds: achieved + 1, and that order.
OTHER_SESSIONS_PCT = {"all": 8.2 + 1, "gpu_link": 6.8 + 1}


def test_the_fits_kernel_and_link_terms_carry_to_other_sessions(cv):
    from simulator.engine import in_scopes
    from simulator.measured import read_index
    from simulator.validate import validate

    values = {name: r["value"] for name, r in cv["in_sample_fit"].items()}
    gpu_link = in_scopes(values, ("gpu", "link"))  # what calibration.engine_scopes [gpu, link] applies
    rows = [r for r in read_index(ALL) if "h200_graphs" not in r.trace_path.parts]
    for extra in ("h200_midlink", "h200_midlink2"):
        rows += read_index(ROOT / "realrun/traces" / extra / "index.csv")
    errors: dict[str, list[float]] = {"all": [], "gpu_link": [], "none": []}
    for row in rows:
        for key, v in (("all", values), ("gpu_link", gpu_link), ("none", None)):
            errors[key].append(abs(validate(row.trace_path, row.scenario_path, engine_values=v)["jct_mean_error_pct"]))
    assert len(rows) == 89 and len({r.scenario_path.stem for r in rows}) == 14
    mean = {k: sum(e) / len(e) for k, e in errors.items()}
    for key, bound in OTHER_SESSIONS_PCT.items():
        assert mean[key] <= bound, mean
    assert mean["gpu_link"] < mean["none"] < mean["all"], mean


# Configurations no fit has seen, long prompts (realrun/traces/h200_long, every method). The 8B at 8-16K tokens, 1
# req/s: no fit FP16 +0.4, KVQuant-style -2.2, HACK +4.4 % (mean 2.3 %); the engine fitted on the 27 traces -0.0,
# +1.3, +9.2 % (mean 3.5 %; -0.1, +1.4, +13.3 % while the prefill efficiency, 0.947 from prompts of up to 4K tokens,
# divided HACK's homomorphic attention too, which realrun.prefillcal finds at its profiled price: HACK's prefill does
# not pull the clock into the power cap as FP16's does). HACK's prefill is still priced 2.9 % long there (its GEMMs
# take the efficiency): a known gap, pinned (HACK fitted more than 2 points above no fit), so fixing it has to change
# this test. 8 layers of the 70B at 6-12K tokens, 1.5 req/s (recorded after that change): no fit -1.5, -2.7, -2.8 %
# (mean 2.3 %), fitted -0.2, +0.2, +1.4 % (mean 0.6 %; HACK +4.1 % before it). Then the after-prefill terms
# saturate (realrun.transient after 0.2-0.9 s prefills: the linear forms priced the iterations after these prompts'
# prefills up to 9x too long): the 8B no fit -0.4, -3.4, +2.7 % (mean 2.2 %), fitted -0.5, +0.2, +7.7 % (mean 2.8 %);
# the 70B no fit -2.0, -3.1, -3.3 % (mean 2.8 %), fitted -0.8, -0.3, +0.5 % (mean 0.5 %). With the attention's
# padding share (both sessions' probe): the 8B no fit -0.3, -2.1, +5.4 % (mean 2.6 %), fitted -0.7, -0.7, +8.7 % (mean
# 3.4 %); the 70B no fit -1.9, -2.8, -3.0 % (mean 2.6 %), fitted -0.3, -0.6, +0.8 % (mean 0.6 %). With each item's
# error relative to its price: the 8B fitted +0.0, +0.3, +10.0 % (mean 3.4 %), the 70B +0.4, +0.7, +2.5 % (mean 1.2 %).
# With the eager prefill's exposed host time (prefill.host_exposed_s_*, realrun.prefillprof): the 8B no fit -1.1,
# -2.2, +5.3 % (mean 2.9 %), fitted -1.4, -1.4, +7.9 % (mean 3.6 %): HACK's gap to no fit 4.7 -> 2.6 points; the 70B
# no fit -2.5, -2.9, -3.1 % (mean 2.8 %), fitted -0.8, -0.8, +0.4 % (mean 0.7 %). With the share of the first-seen
# time a GPU-bound batch shows: the 8B fitted -1.8, -2.3, +7.2 % against HACK's +5.3 % with no fit (gap 1.9 points;
# the fit's larger homomorphic correction, docs/calibration.md). Bounds: achieved + 2.
LONG = ROOT / "realrun/traces/h200_long/index.csv"
LONG_PCT = {"8b": (2.6 + 2, 3.4 + 2), "70b8l": (2.6 + 2, 1.2 + 2)}  # (no fit, fitted) mean |JCT error|


def test_long_prompts_against_no_fit(cv):
    from simulator.measured import read_index
    from simulator.validate import validate

    values = {name: r["value"] for name, r in cv["in_sample_fit"].items()}
    fitted: dict[tuple[str, str], float] = {}
    none: dict[tuple[str, str], float] = {}
    for row in read_index(LONG):
        parts = row.trace_path.name.split("_")  # h200g, model, long, method, rate
        key = (parts[1], parts[3])
        fitted[key] = validate(row.trace_path, row.scenario_path, engine_values=values)["jct_mean_error_pct"]
        none[key] = validate(row.trace_path, row.scenario_path)["jct_mean_error_pct"]
    assert len(fitted) == 6
    for model, (bound_none, bound_fitted) in LONG_PCT.items():
        mine = [k for k in fitted if k[0] == model]
        assert len(mine) == 3, model
        assert sum(abs(none[k]) for k in mine) / 3 <= bound_none, (model, none)
        assert sum(abs(fitted[k]) for k in mine) / 3 <= bound_fitted, (model, fitted)
    assert fitted[("8b", "hack")] > none[("8b", "hack")] + 1.5, (fitted, none)  # the gap above
    assert abs(fitted[("70b8l", "hack")]) <= abs(none[("70b8l", "hack")]), (fitted, none)


# The step-timed recordings (realrun/traces/h200_steps, realrun --step-times: CUDA events and the host's timing around
# every step, 2026-12-04 17:00-17:40): the four in committed configurations give a machine factor of 1.26 (that build
# spends more CPU per step), which carries to the two in configurations never recorded: mean |JCT error| 6.9 -> 2.6 %
# (-4.6 / -9.2 -> -2.1 / -3.1 %); with the attention's padding share 1.26 again, 7.5 -> 3.3 % (-2.9 / -3.6 %); with
# each item's error relative to its price 1.18, 6.0 -> 2.7 % (-2.8 / -2.6 %). Bound: achieved + 2.
STEPS_KNOWN = ROOT / "realrun/traces/h200_steps/index.csv"
STEPS_NEW_MACHINE_PCT = 2.7 + 2


def test_a_machine_refit_carries_to_the_new_configurations(cv):
    from simulator.calibrate import fit_engine, load_index
    from simulator.measured import read_index
    from simulator.validate import validate

    base = {name: (r["value"], None) for name, r in cv["in_sample_fit"].items()}
    fit = fit_engine(load_index(STEPS_KNOWN), "machine", base, "h200_graphs")
    assert 1.15 <= fit.factor["value"] <= 1.4, fit.factor
    refit, before = [], []
    for row in read_index(NEW_CONFIGS):
        refit.append(abs(validate(row.trace_path, row.scenario_path, engine_values=fit.fitted)["jct_mean_error_pct"]))
        values = {n: v for n, (v, _) in base.items()}
        before.append(abs(validate(row.trace_path, row.scenario_path, engine_values=values)["jct_mean_error_pct"]))
    assert sum(refit) / 2 <= STEPS_NEW_MACHINE_PCT and sum(refit) < sum(before), (refit, before)


# A new machine: the repeats (realrun/traces/h200_repeats) were recorded in three device sessions, which the index's
# machine column names; the third (2026-12-04 12:45, the two 2.5 Gbps configurations) ran its host loop faster (meta
# host_issue 0.11-0.16 ms a step against 0.19-0.30 ms in h200_graphs), so the engine fitted on h200_graphs prices both
# its configurations long. validate --cv --base: each configuration predicted with one machine factor on every host
# time term fitted on the other configurations of its session (calibrate --base --refit machine). Mean |JCT error|
# no fit 7.8 %, the h200_graphs calibration alone 6.0 %, with the factor 3.4 % (max 26.6 / 23.2 / 18.3 %); the fast
# session's 8b_2.5gbps 13.8 -> 1.6 % (factor 0.672) and 70b8l_2.5gbps 7.7 -> 3.3 % (0.683); the other sessions' factors
# 0.96-1.04. With the attention's padding share: 7.2 / 5.8 / 3.3 % (max 26.7 / 21.2 / 16.8 %), the fast session 12.9 ->
# 1.7 % and 7.3 -> 3.1 %. With each item's error relative to its price (the factor's fit too): 7.2 / 6.4 / 2.9 % (max
# 26.7 / 29.9 / 11.8 %), the fast session 18.6 -> 2.1 % (factor 0.645) and 8.9 -> 3.3 % (0.632). Bounds: achieved + 2,
# and the factor at least 2 points better than the calibration alone.
REPEATS = ROOT / "realrun/traces/h200_repeats/index.csv"
MACHINE_CV_PCT = 2.9 + 2
FAST_SESSION_PCT = {"h200g_8b_2.5gbps": 2.1 + 2, "h200g_70b8l_2.5gbps": 3.3 + 2}


def test_the_machine_refit_cross_validated_on_the_repeats(cv):
    from simulator.crossval import cross_validate_machine

    base = {name: (r["value"], None) for name, r in cv["in_sample_fit"].items()}
    r = cross_validate_machine(REPEATS, base, "h200_graphs", workers=2)
    assert r["traces"] == 44 and not r["notes"]
    refit, alone = r["machine_refit"]["jct_mean_abs_error_pct"], r["base"]["jct_mean_abs_error_pct"]
    assert refit <= MACHINE_CV_PCT and refit < alone - 2, (refit, alone)
    factors = {c["configuration"]: c["machine_factor"] for c in r["configurations"]}
    assert all(0.6 <= factors[c] <= 0.75 for c in FAST_SESSION_PCT), factors
    assert all(0.9 <= f <= 1.1 for c, f in factors.items() if c not in FAST_SESSION_PCT), factors
    for c in r["configurations"]:
        if c["configuration"] in FAST_SESSION_PCT:
            assert c["machine_refit_jct_mean_abs_error_pct"] <= FAST_SESSION_PCT[c["configuration"]], c
            assert c["machine_refit_jct_mean_abs_error_pct"] < c["base_jct_mean_abs_error_pct"] - 4, c


# A third session (realrun/traces/h200_pbsession, 2026-12-05): two committed configurations (8b_2.5gbps, 8b_sat; FP16
# and HACK) beside the batched-prefill one no fit has seen (8b_pbatch, recorded a second time). Each configuration
# predicted with the factor from the session's other two: mean |JCT error| 9.5 % against 13.5 % with the h200_graphs
# calibration alone (no fit 12.3 %); 8b_pbatch 19.9 -> 14.8 % (factor 1.10). With each item's error relative to its
# price: 7.0 % against 9.1 % alone; 8b_pbatch 14.3 -> 9.9 % (1.075), 8b_sat 8.4 -> 5.9 % (1.091), but 8b_2.5gbps
# 2.1 -> 3.9 % (1.127, from the other two: the calibration alone is already within its +-11.3 %). Bounds: achieved + 2,
# and the factor better than the calibration alone on the session's mean and on the configurations but 8b_2.5gbps.
PBSESSION = ROOT / "realrun/traces/h200_pbsession/index.csv"
PBSESSION_PCT = 7.0 + 2
PBSESSION_FACTOR_NOT_BETTER = {"h200g_8b_2.5gbps"}


def test_the_machine_refit_carries_to_a_batched_prefill_configuration(cv):
    from simulator.crossval import cross_validate_machine

    base = {name: (r["value"], None) for name, r in cv["in_sample_fit"].items()}
    r = cross_validate_machine(PBSESSION, base, "h200_graphs", workers=2)
    assert r["traces"] == 7 and not r["notes"]
    assert r["machine_refit"]["jct_mean_abs_error_pct"] <= PBSESSION_PCT, r["machine_refit"]
    assert r["machine_refit"]["jct_mean_abs_error_pct"] < r["base"]["jct_mean_abs_error_pct"], r
    for c in r["configurations"]:
        assert 1.0 < c["machine_factor"] < 1.25, c
        better = c["machine_refit_jct_mean_abs_error_pct"] < c["base_jct_mean_abs_error_pct"]
        assert better == (c["configuration"] not in PBSESSION_FACTOR_NOT_BETTER), c


def test_narrower_priors_no_longer_carry_better_to_held_out_configurations(cv, graphs):
    """calibrate --prior-scale on the 27 graph-mode traces: every prior width times 0.25 predicts the held-out
    configurations' runs at 3.46 % mean |JCT error| against 3.39 % at the stated widths (the cv fixture's figure, the
    same folds). Before the first-seen prefill time (prefill.host_first_seen_s_per_iteration) the quarter widths did
    better (3.21 against 3.36 %; 3.57 against 4.13 % before the eager prefill's exposed host time): narrower priors had
    held the fit away from what the model then lacked. So --prior-scale auto now chooses 1 here (docs/calibration.md;
    nested, each configuration's scale chosen without it, from `validate --cv --folds configuration --prior-scale
    auto`, too slow for this suite). Bound: achieved + 0.3, and not better than the stated widths by 0.05 or more."""
    from simulator.crossval import _choose_scales
    from simulator.measured import read_index

    (narrow,) = _choose_scales(graphs, read_index(INDEX), [tuple(range(len(graphs)))], 2, grid=(0.25,))
    at_quarter = narrow["held_out_jct_mean_abs_error_pct"]["0.25"]
    assert at_quarter <= 3.46 + 0.3
    assert at_quarter > cv["held_out_configuration"]["jct_mean_abs_error_pct"] - 0.05


def test_each_fitted_parameter_says_which_configurations_pin_it_down(tmp_path, graphs):
    """support: each configuration's share of the runs' information about a fitted parameter. On h200_graphs the
    prefill's host floor per layer and the KVQuant-style prefill's own launches come from 8b_2.5gbps, the only
    configuration whose 32-layer prefills all wait on the CPU (what validate --cv finds moving when it is held out); a
    term every run's iterations inform (the decode loop's gap) from none above half. The file keeps it and calibrate
    names the pinned ones."""
    from simulator.calibrate import SUPPORT_SHOWN, engine_file, fit_engine, format_fit
    from simulator.engine import read_engine_file

    traces = graphs
    fit = fit_engine(traces)
    assert set(fit.support) == set(fit.fitted)
    for name, share in fit.support.items():
        assert all(v >= SUPPORT_SHOWN for v in share.values()) and sum(share.values()) <= 1.0 + 5e-4, (
            name,
            share,
        )  # rounded to 4 places
        assert list(share.values()) == sorted(share.values(), reverse=True), (name, share)
    for name in ("prefill.host_issue_s_per_layer", "methods.kvquant.prefill_issue_s_per_layer"):
        assert next(iter(fit.support[name])) == "h200g_8b_2.5gbps" and fit.support[name]["h200g_8b_2.5gbps"] > 0.8
    assert max(fit.support["decode.host_serial_s_per_iteration"].values()) < 0.5
    doc = engine_file(fit, traces, str(INDEX), "test", "0")
    path = tmp_path / "engine.json"
    path.write_text(json.dumps(doc))
    assert read_engine_file(path, ValueError).parameters["prefill.host_issue_s_per_layer"].support is not None
    text = format_fit(doc)
    pinned = text.split("pinned down mostly by one configuration")[1].split("held at the prior")[0]
    assert "prefill.host_issue_s_per_layer: h200g_8b_2.5gbps" in pinned
    assert "decode.host_serial_s_per_iteration" not in pinned
