"""Fit an engine calibration (simulator/engine.py) to measured runs: a MAP fit toward the kernels' prices.

`fit_engine(traces)` takes measured runs priced once (simulator/fit_items.py: realrun traces, engine benchmark
files) and fits the engine's named physical parameters (engine.PARAMETERS), each with its shape (per decode step,
per layer, per request, per token; host time per step apart from GPU work) and a prior centred where the kernels
and the scenario put it (the scenario's value where the traces' scenarios agree, else the neutral one) with a
stated width (engine.Parameter.prior_width). The fit is the maximum a posteriori estimate, a regularised least
squares (scipy.optimize.least_squares, trust-region reflective, within each parameter's physical bounds) of

    Σ_traces Σ_kinds mean_items((predicted − measured) / price)² / DATA_SIGMA²  +  Σ_params (prior deviation)²

with the prior deviation (value − mean) / width, or ln(value / mean) / width for a factor; an item's price is the
cost model's time for it where the fit starts, held while it moves and renewed at the optimum (item_scales,
IRLS_STEPS solves; relative to the measured time instead, a noisy term would come out under its mean). Each trace
weighs the same in each kind of item (the mean over its items): the items of one run are not independent, and a
trace's systematic error on a kind is taken as one observation with the run-to-run spread DATA_SIGMA. The kinds:

* every decode iteration's cadence (realrun) or inter-token latency (benchmark files): the cost model's
  ``IterationCost.time_s`` for the batch size and context (loop gap included) plus the join time of the
  requests joining it, at least the decode host floor (max);
* every prefill batch's duration (``PrefillCost.latency_s``: efficiency, correction, and the CPU issue floor,
  per batch, layer and request and per layer for the method's own launches), or the first-token time of a
  request that found the engine idle;
* every quantize step: the profile's kernel times the method's quantize factor, at least its CPU issue floor
  per layer (quantize_issue_s_per_layer);
* every transfer's duration: the link's fluid max-min sharing (or, with network.round_robin_chunk_bytes, its
  round robin of chunks) replayed from the measured transfer starts with the priced wire bytes, at line rate ×
  efficiency, plus the latency.

Where a transfer was in flight at an item's start, its host terms (the loop gap, issue and joins; the prefill and
quantize floors) take network.link_busy_host_factor + link_busy_host_factor_per_gbps × the line rate, as the
simulator prices them (simulator/link.py, EndpointHost): two more host parameters, fitted beside the idle ones.

The cost model is used directly: each trace's batches are priced once at neutral engine parameters and the
parameters enter those prices the way `ReplicaCostModel` applies them (on a trace the simulator generated, the
fit reproduces every item to rounding: tests/test_calibrate.py), so a fit takes seconds, not a simulation per
step. Parameters that share no residual are fitted apart (the problem is block-diagonal, so this is exact); a
host floor is a max(), so each fit also starts where the floors bind and the better optimum wins.

A parameter is *fitted* when the traces identify it: its posterior standard deviation (the Laplace approximation
at the optimum, (JᵀJ)⁻¹ of the data and prior rows) is at most half its prior's, so the data, not the prior, set
it. Otherwise it is *held* at the prior's centre, with the reason: no residual depends on it (a factor on a step
the method does not have), the traces cannot separate it from the others (its data Jacobian column spanned by
earlier parameters': a per-layer term when every trace has the same layers), the traces' engine replays each
decode step as one CUDA graph (decode issue terms), or the data leave it where the prior put it (the least
identified goes first and the rest are refitted). So a parameter the runs do not constrain stays where the
kernels put it, and a prompt length, layer count or link the runs never saw is priced by the kernels' shapes,
not by a factor fitted elsewhere. The count of extra kernels is rounded to a whole number and the rest refitted.
Standard errors are those posterior deviations.

Runs of several machines (the index's column machine) are fitted with one factor per machine on every host time
term beside the shared parameters, normalised to a geometric mean of 1 (`_fit_machines`): the shared host terms are
the machines' typical CPU, and each machine's factor is in FitResult.machines.
A refit on a base calibration (`fit_engine(traces, refit, base)`, calibrate --base FILE --refit ...) moves a
calibration to another machine: the base's fitted values become the traces' scenarios' own, and `refit` says what
is fitted from there: every parameter ("all"), the host-scope ones ("host", GPU and link terms held), or one factor
on every host time term at once ("machine", `_fit_machine`: a CPU faster or slower than the base's runs the same
loop, launches and packing proportionally so; one factor is identifiable from a single run). What the refit holds
that the base fitted is written through, marked as carried.
"""

from __future__ import annotations

import heapq
import math
import platform
import subprocess
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Literal, overload

import numpy as np

from .engine import FACTOR_STEPS, HOST_TIMES, KIND, PARAMETERS, PROFILED_FACTOR_PRIOR_WIDTH, SCHEMA_VERSION
from .fit_items import TraceData, load_trace_data
from .link import round_robin_s
from .process_pool import Progress, map_in_processes
from .resolve import REPO_ROOT

# A trace's systematic relative error on one kind of item, the unit of the data term: the run-to-run spread of
# repeated recordings (issue 28: 1-7 % in mean JCT on the H200; simulator/noise.py measures it per metric).
DATA_SIGMA = 0.05
# solves per fit, the items' prices (item_scales) taken where the fit starts, then renewed at each optimum: on the
# h200_graphs traces a third solve moves no parameter by more than 3e-5 of itself (the first alone: 0.15 %)
IRLS_STEPS = 2
KINDS = ("iteration", "prefill", "quantize", "transfer", "handoff")
HELD_PREFIX = "; held at the prior's centre: "
FAR_FROM_PRIOR = 2.0  # format_fit lists a fitted parameter this many prior widths or more from its centre
IDENTIFIED = 0.5  # fitted when the posterior sd is at most this fraction of the prior's
# The prior widths times one scale: the grid `calibrate --prior-scale auto` chooses from by leave-one-configuration-out
# (crossval.choose_prior_scale). The widths (engine.PARAMETERS) state how far each kernel-derived value may be off;
# how far the fit should trust runs of a few configurations over them is a property of the runs, which only runs
# the fit has not seen can measure. 1 is the stated widths; narrower scales pull harder toward the kernels.
PRIOR_SCALES = (0.25, 0.5, 1.0)
CARRIED_PREFIX = "; carried from the base calibration, not refitted: "
# What a refit on a base calibration fits (calibrate --base FILE --refit ...): every parameter (all), the
# machine's terms (host: each host-scope parameter, priors centred on the base's values), or one factor on every
# host time term of the base (machine: a faster or slower CPU runs the same Python loop, launches and packing
# proportionally faster or slower; GPU and link terms carry to the same GPU and link).
REFITS = ("all", "host", "machine")
MACHINE_FACTOR = "machine_host_factor"
MACHINE_PRIOR_WIDTH = math.log(2.0)  # of ln(factor): one sd is a CPU twice as fast or half as fast


# The host time terms (scope host, in seconds): what a faster or slower CPU runs proportionally faster or slower.
# A fit on runs of several machines (the index's column machine): rounds of the shared fit at the machines' factors
# and the factors at the shared fit's values (block coordinate descent of one MAP objective), then the final fit
MACHINE_ROUNDS = 2


def on_machine(values: dict[str, float], factor: float) -> dict[str, float]:
    """`values` with every host time term times a machine's factor (HOST_TIMES)."""
    if factor == 1.0:
        return values
    out = dict(values)  # the same keys in the same order; the fit calls this per trace at every step
    for n in HOST_TIMES.intersection(values):
        out[n] = values[n] * factor
    return out


def prior_sd(name: str, at: float, prior_scale: float = 1.0, widths: dict[str, float] | None = None) -> float:
    """The prior's standard deviation in the parameter's unit, near `at` for a factor (a width in ln), with every
    width (the fit's `widths`, prior_widths, else the stated one) times `prior_scale` (PRIOR_SCALES)."""
    p = PARAMETERS[name]
    w = (widths or {}).get(name, p.prior_width) * prior_scale
    return w * max(abs(at), 1e-12) if p.log_prior else w


def prior_widths(names, traces: list[TraceData]) -> dict[str, float]:
    """Each parameter's prior width for a fit on `traces`: the stated one (engine.Parameter.prior_width), except a
    method's step factor where every run of that method executed the kernels its pools' measured profiles priced
    (TraceData.kernels_profiled: realrun runs kernels_calibration/kernels as they are), which is
    engine.PROFILED_FACTOR_PRIOR_WIDTH: there the kernels were measured, not guessed at, and a factor 2 would let
    the fit spend a kernel's time on what other terms got wrong."""
    out = {}
    for n in names:
        head, *rest = n.split(".")
        w = PARAMETERS[n].prior_width
        if head == "methods" and rest[1] in FACTOR_STEPS:
            runs = [td for td in traces if td.family == rest[0]]
            if runs and all(td.kernels_profiled for td in runs):
                w = PROFILED_FACTOR_PRIOR_WIDTH
        out[n] = w
    return out


# ---- predictions from engine parameters (as ReplicaCostModel and the Link apply them) ----------------
FIRST_SEEN = "prefill.host_first_seen_s_per_iteration"


def predict(td: TraceData, kind: str, v: dict[str, float], wrt: tuple[str, ...] = ()):
    """Predicted seconds of every measured item of one kind at engine parameter values v (every name);
    with `wrt`, also {name: d prediction / d value} for those names (exact: the model is linear in each
    parameter on either side of its max(GPU, host) floor; the link's efficiency by central differences)."""
    if kind == "transfer":
        return _predict_transfer(td.blocks[kind], v, wrt)
    pred, d = _predict_items(td.blocks[kind], kind, td.family, v, td.link_gbps, bool(wrt))
    if not wrt:
        return pred
    zero = np.zeros_like(pred)
    return pred, {name: d.get(name, zero) for name in wrt}


def _predict_items(blk: dict, kind: str, m: str, v, gbps, jac: bool) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """predict for an iteration, prefill, quantize or handoff block of method m, or for several such blocks fused
    into one (_Fused: m is ANY_METHOD, and v's values, a block's scalars and `gbps`, the link's line rate, are arrays
    of each item's where the blocks differ): (seconds, with `jac` the derivatives by name)."""
    # the host terms' factor: 1, or while a transfer is in flight (where the host shares its process with the link
    # endpoint) a + b x the link's rate (network.link_busy_host_factor, simulator/link.py); a prefill item's floor
    # takes the prefill floor's own pair (network.link_busy_prefill_host_factor)
    a_name = "network.link_busy_prefill_host_factor" if kind == "prefill" else "network.link_busy_host_factor"
    b_name = a_name + "_per_gbps"
    fb = v[a_name] + v[b_name] * gbps
    n = len(blk["meas"])
    if kind == "handoff":
        return _predict_handoff(blk, v, jac, fb - 1.0, gbps)
    if kind == "iteration":  # at the level at its start (an iteration in progress keeps it: simulator/decode.py)
        busy = blk.get("busy")
        f = 1.0 + (np.zeros(n) if busy is None else busy) * (fb - 1.0)
        pred, d, host_s = _predict_steps(blk, kind, m, v, f, jac)
        w_b = np.zeros(n) if busy is None else busy.astype(np.float64)
        unit = blk.get("after_prefill_unit_s")  # shared_gpu: the decode iterations after a prefill run longer
        if unit is not None:
            pred = pred + v["decode.after_prefill_slowdown_fraction"] * unit
            if jac:
                d["decode.after_prefill_slowdown_fraction"] = unit
    elif kind in ("prefill", "quantize") and not blk.get("busy_left_s", np.zeros(1)).any():  # all idle
        f = np.ones(n)
        pred, d, host_s = _predict_steps(blk, kind, m, v, f, jac)
        w_b = np.zeros(n)
    elif kind in ("prefill", "quantize"):
        # at the busy level for the seconds the transfers in flight at its start last, at the idle one after
        # (simulator/prefill.py, `_busy_part`): T_b if that lasts T_b, else R + (1 - R / T_b) T_i
        left = blk["busy_left_s"]
        t_i, d_i, _ = _predict_steps(blk, kind, m, v, np.ones(n), jac)
        t_b, d_b, host_s = _predict_steps(blk, kind, m, v, np.full(n, fb), jac)
        rest = blk["rest"] if kind == "prefill" else np.zeros(n)
        t_i, t_b = t_i - rest, t_b - rest
        whole = left >= t_b
        safe_b = np.where(t_b > 0, t_b, 1.0)
        pred = np.where(whole, t_b, left + (1.0 - left / safe_b) * t_i) + rest
        w_b = np.where(whole, 1.0, left * t_i / safe_b**2)  # d pred / d T_b
        w_i = np.where(whole, 0.0, 1.0 - left / safe_b)  # d pred / d T_i
        d = {k: w_b * d_b[k] + w_i * d_i[k] for k in d_b}
        f = np.full(n, fb)
    else:
        raise ValueError(kind)
    if not jac:
        return pred, {}
    # d (host_s x f) / d a = host_s / f on the busy part; b: the same times the rate
    per_a = w_b * np.divide(host_s, f, out=np.zeros_like(f), where=f > 0)
    d[a_name] = per_a
    d[b_name] = per_a * gbps
    return pred, d


def _predict_steps(blk: dict, kind: str, m: str, v, f: np.ndarray, jac: bool):
    """Iteration, prefill or quantize items of method m (_predict_items) with every host term times f[i]: (seconds,
    derivatives by name, the host seconds that f multiplies where they count)."""
    fq, fd, fa = (v[f"methods.{m}.{s}"] for s in FACTOR_STEPS)
    d: dict[str, np.ndarray] = {}
    host_s = np.zeros_like(f)
    if kind == "iteration":
        mk = v.get(f"methods.{m}.decode_kernels_per_layer", 0.0)
        serial = v["decode.host_serial_s_per_iteration"] * f
        ctx = blk["ctx"]
        gpu = (
            blk["fixed0"]
            + blk["layers"] * (v["decode.extra_kernels_per_layer"] + mk) * blk["small_kernel_s"]
            + serial
            + fd * blk["dequant_fixed0"]
            + fa * blk["approx_fixed0"]
            + (blk["decode_per_ctx"] + fd * blk["dequant_per_ctx"] + fa * blk["approx_per_ctx"]) * ctx
        )
        issue = (
            v["decode.host_issue_s_per_iteration"]
            + blk["stage_layers"] * v["decode.host_issue_s_per_layer"]
            + blk["batch"] * v["decode.host_issue_s_per_request"]
        ) * f
        host = np.where(issue > 0, issue + blk["lm_head"] + serial, 0.0)
        # shared_gpu: the GPU's part slower by the prefills' clock slowdown (decode.after_prefill_clock_fraction)
        slow = 1.0 + blk.get("clock_slowdown", 0.0)
        if "clock_slowdown" in blk:
            gpu = serial + (gpu - serial) * slow
        join = (v["decode.join_s_per_request"] * blk["joins"] + v["decode.leave_s_per_request"] * blk["leaves"]) * f
        pred = np.maximum(gpu, host) + join
        if "place_s" in blk:  # the engine's KV copies at a batch change: GPU time at the scenario's rate
            pred = pred + blk["place_s"]
        if jac:
            g = (gpu >= host).astype(float)
            h = 1.0 - g
            host_s = serial + h * issue + join
            gs = g * slow
            d = {
                "decode.host_serial_s_per_iteration": f,
                "decode.extra_kernels_per_layer": gs * blk["layers"] * blk["small_kernel_s"],
                f"methods.{m}.decode_kernels_per_layer": gs * blk["layers"] * blk["small_kernel_s"],
                "decode.join_s_per_request": blk["joins"] * f,
                "decode.leave_s_per_request": blk["leaves"] * f,
                f"methods.{m}.dequantize": gs * (blk["dequant_fixed0"] + blk["dequant_per_ctx"] * ctx),
                f"methods.{m}.approximation": gs * (blk["approx_fixed0"] + blk["approx_per_ctx"] * ctx),
                "decode.host_issue_s_per_iteration": h * f,
                "decode.host_issue_s_per_layer": h * blk["stage_layers"] * f,
                "decode.host_issue_s_per_request": h * blk["batch"] * f,
            }
    elif kind == "prefill":
        # the model's work at the engine's speed, the method's own kernels (its correction among them) as profiled
        model = blk.get("model0", blk["gpu0"])
        eff = v["prefill.prefill_efficiency"]
        gpu = model / eff + (blk["gpu0"] - model) + (fa - 1.0) * blk["approx0"] + blk["hop"]
        mi = v.get(f"methods.{m}.prefill_issue_s_per_layer", 0.0)
        # a batch of a token count its process had not run: the CPU's first-seen time on its floor
        first = blk.get("first_seen", 0.0)  # a block made by hand may lack it (as model0)
        host = (
            v["prefill.host_issue_s_per_iteration"]
            + blk["layers"] * (v["prefill.host_issue_s_per_layer"] + blk["requests"] * mi)
            + blk["requests"] * v["prefill.host_issue_s_per_request"]
            + first * v[FIRST_SEEN]
        ) * f
        # an eagerly issued batch's CPU time the GPU cannot overlap (costmodel/phases.py, `_prefill`)
        exposed = (
            v["prefill.host_exposed_s_per_iteration"] + blk["layers"] * v["prefill.host_exposed_s_per_layer"]
        ) * f
        # where the GPU's work T is the longer, exp(-T / fade) of the first-seen time adds to it (prefill.py,
        # `_with_first_seen`)
        fade_s = blk.get("first_seen_fade_s", 0.0)
        t_gpu = gpu + exposed
        shown = first * v[FIRST_SEEN] * f
        x = np.exp(-t_gpu / fade_s) if fade_s > 0.0 else np.zeros_like(t_gpu)
        pred = np.maximum(t_gpu + shown * x, host) + blk["rest"]
        if jac:
            g = (t_gpu + shown * x >= host).astype(float)
            h = 1.0 - g
            # d pred / d T on the GPU's side: the shown share falls as T grows
            gs = g * (1.0 - shown * x / fade_s) if fade_s > 0.0 else g
            host_s = h * host + gs * exposed + g * shown * x
            d = {
                "prefill.prefill_efficiency": -gs * model / _square(eff),
                "prefill.host_exposed_s_per_iteration": gs * f,
                "prefill.host_exposed_s_per_layer": gs * blk["layers"] * f,
                f"methods.{m}.approximation": gs * blk["approx0"],
                "prefill.host_issue_s_per_iteration": h * f,
                "prefill.host_issue_s_per_layer": h * blk["layers"] * f,
                f"methods.{m}.prefill_issue_s_per_layer": h * blk["layers"] * blk["requests"] * f,
                "prefill.host_issue_s_per_request": h * blk["requests"] * f,
                FIRST_SEEN: (h + g * x) * first * f,
            }
    else:  # quantize
        gpu = fq * blk["enc0"]
        per = blk["layers"] * blk.get("requests", 1.0)  # the floor is per layer and request (costmodel _encode_s)
        host = per * v[f"methods.{m}.quantize_issue_s_per_layer"] * f
        pred = np.maximum(gpu, host)
        g = (gpu >= host).astype(float)
        host_s = (1 - g) * host
        d = {
            f"methods.{m}.quantize": g * blk["enc0"],
            f"methods.{m}.quantize_issue_s_per_layer": (1 - g) * per * f,
        }
    return pred, d, host_s


def _predict_handoff(blk: dict, v, jac: bool, busy_extra, gbps):
    """What a pass of the loop through a prefill costs the CPU beyond a plain pass on a shared GPU (or, placement
    separate, the wait between a prefill batch's KV encoded and the next batch's start): the prefill batch's serial
    time, at the level of its start (a host term: network.link_busy_host_factor while a transfer is in flight;
    `busy_step` the share of the passes that start so)."""
    serial = v["prefill.host_serial_s_per_iteration"]
    f_step = 1.0 + blk["busy_step"] * busy_extra
    pred = serial * f_step
    if not jac:
        return pred, {}
    per_a = blk["busy_step"] * serial
    return pred, {
        "prefill.host_serial_s_per_iteration": f_step,
        "network.link_busy_host_factor": per_a,
        "network.link_busy_host_factor_per_gbps": per_a * gbps,
    }


def _square(x):
    """x**2 as Python computes it for a float (C pow, which differs from x * x in the last bit for about one value in
    a thousand), elementwise for the array of a fused block (numpy's x**2 is x * x): a fused block prices its items
    bit for bit as their own blocks do."""
    if np.ndim(x) == 0:
        return x**2
    u, at = np.unique(x, return_inverse=True)
    return np.array([e**2 for e in u.tolist()])[at]


_LINK_MEMO = "_round_robin_at_rate"  # a transfer block's (rate, durations) last walked (_predict_transfer)


def _predict_transfer(blk: dict, v: dict[str, float], wrt: tuple[str, ...]):
    chunk = blk.get("chunk_bytes", 0)  # a hand-built block may lack it: fluid sharing

    def at(eff: float, lat: float) -> np.ndarray:
        rate = blk["line_bytes_per_s"] * eff
        if chunk:  # the simulator's round-robin link itself (simulator/link.py)
            # the walk at the last rate asked is kept with the block: a fit that does not move the link's
            # efficiency asks for the same rate at every step
            memo = blk.get(_LINK_MEMO)
            if memo is None or memo[0] != rate:
                memo = (rate, np.array(round_robin_s(blk["start"].tolist(), blk["bytes"].tolist(), rate, chunk)))
                blk[_LINK_MEMO] = memo
            return memo[1] + lat
        return processor_sharing_s(blk["start"], blk["bytes"], rate) + lat

    eff = v["network.efficiency"]
    pred = at(eff, v["network.latency_s"])
    if not wrt:
        return pred
    d: dict[str, np.ndarray] = {}
    if "network.efficiency" in wrt and chunk:
        # the link is busy through every transfer's life, so its time is the bytes sent meanwhile over the rate: -t /
        # eff, the order of the chunks held (the order jumps as the rate moves a start across a chunk's end, which a
        # difference quotient would take for the slope)
        d["network.efficiency"] = -(pred - v["network.latency_s"]) / eff
    elif "network.efficiency" in wrt:
        h = 1e-6 * eff
        d["network.efficiency"] = (at(eff + h, 0.0) - at(eff - h, 0.0)) / (2 * h)
    d["network.latency_s"] = np.ones_like(pred)
    zero = np.zeros_like(pred)
    return pred, {name: d.get(name, zero) for name in wrt}


def processor_sharing_s(start: np.ndarray, size: np.ndarray, rate: float) -> np.ndarray:
    """Durations of flows on one link shared equally by the flows in flight (a fluid processor-sharing
    server, the simulator's Link without caps), each starting at start[i] (sorted) with size[i] bytes.
    Virtual time V grows at rate / n(t) while n flows are in flight; a flow ends when V has grown by its
    size since it started, so flows end in the order of V(start) + size: a heap, O(n log n)."""
    n = len(start)
    end = np.empty(n)
    heap: list[tuple[float, int]] = []
    v, t, i = 0.0, float(start[0]) if n else 0.0, 0
    while i < n or heap:
        t_next_start = float(start[i]) if i < n else math.inf
        if heap:
            v_end, j = heap[0]
            t_end = t + (v_end - v) * len(heap) / rate
            if t_end <= t_next_start:
                heapq.heappop(heap)
                v, t = v_end, t_end
                end[j] = t
                continue
        if heap:
            v += (t_next_start - t) * rate / len(heap)
        t = t_next_start
        heapq.heappush(heap, (v + float(size[i]), i))
        i += 1
    return end - start


# ---- the fit ---------------------------------------------------------------------------------------
def depends(name: str, td: TraceData) -> list[str]:
    """The residual kinds of a trace that a parameter enters."""
    head, *rest = name.split(".")
    if head == "methods":
        if rest[0] != td.family:
            return []
        kinds = {
            "quantize": ["quantize"],
            "quantize_issue_s_per_layer": ["quantize"],
            "dequantize": ["iteration"],
            "approximation": ["iteration", "prefill"],
            "prefill_issue_s_per_layer": ["prefill"],
            "decode_kernels_per_layer": ["iteration"],
        }[rest[1]]
    elif name.startswith("network.link_busy_prefill_host"):  # the prefill floor's level while the link moves KV
        kinds = ["prefill"]
    elif name.startswith("network.link_busy_host"):  # the other host terms' level while the link moves KV
        kinds = ["iteration", "quantize", "handoff"]
    elif name == "prefill.host_serial_s_per_iteration":  # the prefill step's CPU time after it
        kinds = ["handoff"]
    else:
        kinds = {"decode": ["iteration"], "prefill": ["prefill"], "network": ["transfer"]}[head]
    return [k for k in kinds if k in td.blocks]


@dataclass
class FitResult:
    values: dict[str, float]  # every candidate's value: the fitted ones, else the prior's centre
    fitted: dict[str, float]
    stderr: dict[str, float]  # the fitted ones' posterior standard deviations
    notes: dict[str, str]
    held: dict[str, str]  # parameter -> why it was held
    residuals: dict  # kind -> {before/after rms, mean}
    start: dict[str, float]  # each candidate's prior centre (where the fit starts)
    refit: str = "all"  # REFITS
    base: str | None = None  # the base calibration's path, with --base
    carried: set[str] = field(default_factory=set)  # base-fitted parameters written through unrefitted
    factor: dict | None = None  # refit machine: the factor's value, stderr, prior and the terms it scales
    machines: dict[str, dict] = field(default_factory=dict)  # runs of several machines: each one's host factor
    prior_scale: float = 1.0  # every prior width times this (PRIOR_SCALES)
    widths: dict[str, float] = field(default_factory=dict)  # each candidate's prior width (prior_widths), unscaled
    # each fitted parameter's configurations by their share of the runs' information about it (support)
    support: dict[str, dict[str, float]] = field(default_factory=dict)


def _start_value(name: str, traces: list[TraceData]) -> float:
    """The prior's centre and where the fit starts: the traces' scenarios' value where they agree (the kernels'
    price with the scenario's engine terms), else the neutral one."""
    vals = {td.values0[name] for td in traces}
    return vals.pop() if len(vals) == 1 else PARAMETERS[name].neutral


@overload
def _weighted_residuals(
    traces: list[TraceData],
    names: list[str],
    x: np.ndarray,
    kinds: set[tuple[int, str]],
    base: list[dict[str, float]],
    jac: Literal[False] = False,
    scales: dict | None = None,
) -> np.ndarray: ...


@overload
def _weighted_residuals(
    traces: list[TraceData],
    names: list[str],
    x: np.ndarray,
    kinds: set[tuple[int, str]],
    base: list[dict[str, float]],
    jac: Literal[True],
    scales: dict | None = None,
) -> tuple[np.ndarray, np.ndarray]: ...


def _weighted_residuals(
    traces: list[TraceData],
    names: list[str],
    x: np.ndarray,
    kinds: set[tuple[int, str]],
    base: list[dict[str, float]],
    jac: bool = False,
    scales: dict | None = None,
) -> np.ndarray | tuple[np.ndarray, np.ndarray]:
    """The data term's residuals: the errors of the items of `kinds` ((trace index, kind) pairs) relative to each
    item's scale (`scales[trace index, kind]`, item_scales; without it its measured time), each trace and kind
    weighted 1/sqrt(its items), in units of DATA_SIGMA, at the parameters `names` = x over each trace's values
    `base`; with jac, (residuals, Jacobian items x names). Rows in _item_blocks' order, priced fused (_Fused)."""
    fused = _fused(traces, kinds)
    pred, dt = fused.predict(traces, names, x, base, jac)
    scale = fused.meas if scales is None else fused.concat(scales)
    w = 1.0 / scale / fused.sqrt_items / DATA_SIGMA
    r = ((pred - fused.meas) * w)[fused.row_items]
    if dt is None:
        return r
    wf = w * fused.concat({b: traces[b[0]].host_factor for b in fused.blocks})
    for col, n in enumerate(names):
        np.multiply(dt[col], wf if n in HOST_TIMES else w, out=dt[col])
    return r, dt.T[fused.row_items]  # C-contiguous, as the solver's products were written for


def item_scales(
    traces: list[TraceData], names: list[str], x: np.ndarray, kinds: set[tuple[int, str]], base: list[dict[str, float]]
) -> dict[tuple[int, str], np.ndarray]:
    """Each item's scale in the data term: its price at `x`, held fixed while the fit moves (the measured time where
    the price is not a positive part of it). An item's error relative to its own measured time would pull a noisy
    term low: the value that minimises squared relative errors sits under the items' mean by about twice their
    variance in logs. Weights that do not move with the item's own measurement have no such pull (IRLS_STEPS)."""
    fused = _fused(traces, kinds)
    p, _ = fused.predict(traces, names, x, base, False)
    scale = np.where(np.isfinite(p) & (p > 0.05 * fused.meas), p, fused.meas)
    return {b: scale[slice(*fused.span[b])] for b in fused.blocks}


def _item_blocks(traces: list[TraceData], kinds: set[tuple[int, str]]) -> list[tuple[int, str]]:
    """The (trace index, kind) pairs of `kinds` that have items, in the data term's row order (by trace, then
    KINDS)."""
    return [
        (idx, kind)
        for idx, td in enumerate(traces)
        for kind in KINDS
        if (idx, kind) in kinds and len(td.blocks[kind]["meas"])
    ]


# ---- the data term's blocks fused across traces -----------------------------------------------------
ANY_METHOD = "*"  # a fused block's method: methods.*.x stands for each item's own method's x
_REQUIRED = object()  # _ItemValues.get without a default


def _same(vals: list) -> bool:
    """Whether the values are all one value, bit for bit (a -0.0 beside a 0.0 is not)."""
    first = vals[0]
    return vals.count(first) == len(vals) and (first != 0 or len({math.copysign(1.0, v) for v in vals}) == 1)


class _Group:
    """The blocks of one kind whose formula (_predict_items) takes the same branches (_branches), concatenated into
    one block: arrays end to end, a scalar as it is where the blocks share it, else repeated per item. Its items are
    lo:hi of the fused blocks' (_Fused)."""

    def __init__(self, kind: str, blocks: list[tuple[int, str]], traces: list[TraceData], span: dict):
        self.kind = kind
        self.traces = [i for i, _ in blocks]
        self.families = [traces[i].family for i in self.traces]
        blks = [traces[i].blocks[k] for i, k in blocks]
        self.counts = np.array([len(blk["meas"]) for blk in blks], dtype=np.int64)
        self.lo, self.hi = span[blocks[0]][0], span[blocks[-1]][1]
        if len(blks) == 1:
            self.blk = blks[0]
        else:
            self.blk = {}
            for key, first in blks[0].items():
                vals = [blk[key] for blk in blks]
                self.blk[key] = np.concatenate(vals) if isinstance(first, np.ndarray) else self.per_block(vals)
        self.names: dict[str, list[str]] = {}  # a name as each block's trace reads it (methods.*.x: its method's)
        self.of_method: dict[str, np.ndarray | bool] = {}  # method -> whether each item is one of its

    def per_block(self, vals: list):
        """One value per block as the items' values: the value where the blocks share it, else each item's."""
        return vals[0] if _same(vals) else np.repeat(np.array(vals, dtype=np.float64), self.counts)

    def own(self, name: str) -> list[str]:
        if name not in self.names:
            tail = name.removeprefix(f"methods.{ANY_METHOD}.")
            own = [f"methods.{m}.{tail}" for m in self.families] if tail != name else [name] * len(self.families)
            self.names[name] = own
        return self.names[name]

    def column(self, name: str, d: dict[str, np.ndarray]):
        """The items' derivative by `name` from the fused derivatives `d`: methods.<m>.x is methods.*.x on the items
        of method m and 0 on the others (their own blocks' derivatives have no such name)."""
        head, _, rest = name.partition(".")
        if head != "methods":
            return d.get(name, 0.0)
        m, _, step = rest.partition(".")
        dn = d.get(f"methods.{ANY_METHOD}.{step}")
        if dn is None:
            return 0.0
        if m not in self.of_method:
            mine = [f == m for f in self.families]
            self.of_method[m] = all(mine) or (any(mine) and np.repeat(np.array(mine), self.counts))
        mask = self.of_method[m]
        if mask is True:
            return dn
        return 0.0 if mask is False else np.where(mask, dn, 0.0)


class _ItemValues:
    """Engine parameter values for a fused block's items, each its trace's (`values`, one dict per block), read as
    predict reads its dict of values (v[name], v.get(name, default)): one value where the blocks share it, else an
    array of each item's."""

    def __init__(self, group: _Group, values: list[dict[str, float]]):
        self.group, self.values = group, values
        self.memo: dict[str, float | np.ndarray] = {}

    def __getitem__(self, name: str):
        if name not in self.memo:  # a formula reads some names twice (prefill's busy part prices both levels)
            self.memo[name] = self.group.per_block([v[n] for v, n in zip(self.values, self.group.own(name))])
        return self.memo[name]

    def get(self, name: str, default=None):
        return self.group.per_block([v.get(n, default) for v, n in zip(self.values, self.group.own(name))])


def _branches(kind: str, blk: dict) -> tuple:
    """What _predict_items branches on for a block (its keys; for prefill and quantize whether any item starts with a
    transfer in flight; prefill's first-seen fade) and which of its values are arrays: blocks alike in these are
    fused into one (_Group); a block whose arrays are not one value per item stays alone."""
    n = len(blk["meas"])
    shape = tuple(sorted((key, isinstance(a, np.ndarray)) for key, a in blk.items()))
    if any(isinstance(a, np.ndarray) and a.shape != (n,) for a in blk.values()):
        shape += (id(blk),)
    busy = kind in ("prefill", "quantize") and bool(blk.get("busy_left_s", np.zeros(1)).any())
    return kind, shape, busy, blk.get("first_seen_fade_s")


class _Fused:
    """The items of a fit's blocks (_item_blocks), priced a kind at a time rather than a trace at a time: per-call
    overhead on a trace's few hundred items, not arithmetic, was the fit's time. The blocks alike in their formula's
    branches are one _Group, priced in one pass of _predict_items with each item's trace's values (_ItemValues);
    transfers, a walk of each trace's link, per trace (predict). Elementwise arithmetic gives each item the same
    floats either way, so the residuals and Jacobian are bit for bit those of predict per block
    (tests/test_calibrate.py). The items are priced group by group; `row_items` puts them back in _item_blocks'
    order (the least-squares solver's SVD is not invariant to the rows' order at the last bit)."""

    def __init__(self, traces: list[TraceData], blocks: list[tuple[int, str]]):
        self.blocks = blocks
        self.held = [traces[i].blocks[k] for i, k in blocks]  # while cached, the ids in its key stay theirs
        alike: dict[tuple, list[int]] = {}
        alone = []
        for b, (_, kind) in enumerate(blocks):
            if kind == "transfer":
                alone.append(b)
            else:
                alike.setdefault(_branches(kind, self.held[b]), []).append(b)
        self.span: dict[tuple[int, str], tuple[int, int]] = {}  # (trace, kind) -> its items lo:hi, as priced
        lo = 0
        for b in [b for members in alike.values() for b in members] + alone:
            self.span[blocks[b]] = (lo, lo + len(self.held[b]["meas"]))
            lo = self.span[blocks[b]][1]
        self.groups = [
            _Group(key[0], [blocks[b] for b in members], traces, self.span) for key, members in alike.items()
        ]
        self.alone = [blocks[b] for b in alone]
        self.counts = np.array([hi - lo for lo, hi in self.span.values()], dtype=np.int64)
        self.meas = self.concat(dict(zip(blocks, (blk["meas"] for blk in self.held))))
        self.sqrt_items = self.concat({b: math.sqrt(hi - lo) for b, (lo, hi) in self.span.items()})
        self.row_items = np.concatenate([np.arange(*self.span[b]) for b in blocks] or [np.zeros(0, dtype=np.int64)])
        self.trace_ids = sorted({i for i, _ in blocks})

    def concat(self, per_block: dict) -> np.ndarray:
        """Each block's items' values (an array, or one value for all its items), in the order priced."""
        if not self.span:
            return np.zeros(0)
        vals = [per_block[b] for b in self.span]
        if isinstance(vals[0], np.ndarray):
            return np.concatenate(vals)
        return np.repeat(np.array(vals, dtype=np.float64), self.counts)

    def predict(
        self, traces: list[TraceData], names: list[str], x: np.ndarray, base: list[dict[str, float]], jac: bool
    ):
        """Every item's predicted seconds, and with jac their derivatives (names x items), in the order priced, at
        `names` = x over each trace's `base` (the values predict is given per trace)."""
        pred = np.empty(len(self.meas))
        dt = np.empty((len(names), len(self.meas))) if jac else None
        at = dict(zip(names, x))
        values = {i: on_machine({**base[i], **at}, traces[i].host_factor) for i in self.trace_ids}
        for g in self.groups:
            v = _ItemValues(g, [values[i] for i in g.traces])
            gbps = g.per_block([traces[i].link_gbps for i in g.traces])
            pred[g.lo : g.hi], d = _predict_items(g.blk, g.kind, ANY_METHOD, v, gbps, jac)
            if dt is not None:
                for col, n in enumerate(names):
                    dt[col, g.lo : g.hi] = g.column(n, d)
        wrt = tuple(names)
        for i, kind in self.alone:
            lo, hi = self.span[i, kind]
            if dt is None:
                pred[lo:hi] = np.asarray(predict(traces[i], kind, values[i]))
            else:
                p, d = predict(traces[i], kind, values[i], wrt)
                pred[lo:hi] = p
                for col, n in enumerate(names):
                    dt[col, lo:hi] = d[n]
        return pred, dt


_FUSED: dict[tuple, _Fused] = {}  # the last few fits' fused blocks, by the blocks' identity (_fused)
_FUSED_KEPT = 8


def _fused(traces: list[TraceData], kinds: set[tuple[int, str]]) -> _Fused:
    """The blocks of `kinds` fused (_Fused), built once per fit and kept while the blocks are the same objects: a
    trace's blocks are priced once (fit_items) and not changed after."""
    blocks = _item_blocks(traces, kinds)
    key = tuple((i, k, id(traces[i].blocks[k]), traces[i].family) for i, k in blocks)
    fused = _FUSED.pop(key, None) or _Fused(traces, blocks)
    _FUSED[key] = fused  # the most recently used last
    while len(_FUSED) > _FUSED_KEPT:
        del _FUSED[next(iter(_FUSED))]
    return fused


def prior_residuals(
    names: list[str],
    x: np.ndarray,
    centre: dict[str, float],
    prior_scale: float = 1.0,
    widths: dict[str, float] | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """The prior term: each parameter's deviation from its centre in prior widths (the fit's `widths`, else the
    stated ones, each times `prior_scale`), and its derivative."""
    r, dr = np.zeros(len(names)), np.zeros(len(names))
    for i, n in enumerate(names):
        p = PARAMETERS[n]
        w = (widths or {}).get(n, p.prior_width) * prior_scale
        if p.log_prior:
            xi = max(float(x[i]), 1e-12)
            r[i] = math.log(xi / centre[n]) / w
            dr[i] = 1.0 / (xi * w)
        else:
            r[i] = (float(x[i]) - centre[n]) / w
            dr[i] = 1.0 / w
    return r, dr


def _components(names: list[str], traces: list[TraceData]) -> list[list[str]]:
    """Parameters grouped so that no residual depends on two groups (connected components)."""
    touches = {n: {(i, k) for i, td in enumerate(traces) for k in depends(n, td)} for n in names}
    groups: list[tuple[list[str], set]] = []
    for n in names:
        merged, keep = [n], set(touches[n])
        rest = []
        for g, t in groups:
            if t & keep:
                merged += g
                keep |= t
            else:
                rest.append((g, t))
        groups = rest + [(merged, keep)]
    return [sorted(g, key=list(PARAMETERS).index) for g, _ in groups]


def is_host_floor(name: str) -> bool:
    """A CPU issue time: it moves a prediction only where it exceeds the GPU time (a max() floor)."""
    return ".host_issue_s_" in name or name.endswith(("_issue_s_per_layer",))


def _floor_kind(name: str) -> str:
    if name.endswith(".quantize_issue_s_per_layer"):
        return "quantize"
    return "iteration" if name.startswith("decode.") else "prefill"


def floor_probe(name: str, traces: list[TraceData]) -> float:
    """A host issue time at which its floor alone reaches the median measured item it bounds: a second
    place to start the fit from (a floor below every item moves nothing, so a fit started at 0 stays there)."""
    kind = _floor_kind(name)
    method = name.split(".")[1] if name.startswith("methods.") else None
    per = []
    for td in traces:
        blk = td.blocks.get(kind)
        if blk is None or not len(blk["meas"]) or (method is not None and td.family != method):
            continue
        if name.endswith("per_layer"):
            per.append(np.median(blk["meas"]) / blk["stage_layers" if kind == "iteration" else "layers"])
        elif name.endswith("per_request"):
            per.append(np.median(blk["meas"] / blk["batch" if kind == "iteration" else "requests"]))
        else:
            per.append(np.median(blk["meas"]))
    lo, hi = PARAMETERS[name].bounds
    return float(np.clip(np.median(per), lo, hi)) if per else lo


def _starts(traces, names, start, warm=None) -> list[np.ndarray]:
    """Where a fit of `names` starts: `start` (or `warm`, a previous optimum of a superset of them: a refit
    after holding one), and, with host floors, also where they bind (a floor below every item moves
    nothing, so a fit started there stays there): together the floors of a kind at half the median
    item's time."""
    lo, hi = _bounds(names)
    x0 = np.clip(np.array([(warm or start)[n] for n in names], dtype=float), lo, hi)
    floors = [i for i, n in enumerate(names) if is_host_floor(n)]
    if not floors:
        return [x0]
    x1 = x0.copy()
    for i in floors:
        same = sum(_floor_kind(names[k]) == _floor_kind(names[i]) and _shares_items(names[k], names[i]) for k in floors)
        x1[i] = floor_probe(names[i], traces) / (2 * same)
    return [x0, np.clip(x1, lo, hi)]


def _shares_items(a: str, b: str) -> bool:
    """Two floors of one kind add up in the same items unless they belong to two different methods."""
    ma = a.split(".")[1] if a.startswith("methods.") else None
    mb = b.split(".")[1] if b.startswith("methods.") else None
    return ma is None or mb is None or ma == mb


def _bounds(names) -> tuple[np.ndarray, np.ndarray]:
    return (np.array([PARAMETERS[n].bounds[0] for n in names]), np.array([PARAMETERS[n].bounds[1] for n in names]))


def _map_fit(
    traces,
    names,
    start,
    base,
    kinds,
    warm: dict[str, float] | None = None,
    prior_scale: float = 1.0,
    widths: dict[str, float] | None = None,
) -> tuple[dict[str, float], dict[str, float], set[str], np.ndarray]:
    """The MAP estimate of `names` from each of _starts (the lower objective wins). Returns values, posterior
    standard deviations, the parameters no data residual moves there, and the data Jacobian there."""
    from scipy.optimize import least_squares

    lo, hi = _bounds(names)
    scale = np.array([prior_sd(n, start[n], prior_scale, widths) for n in names])

    def solve(x0: np.ndarray, sc: dict):
        def fun(x):
            return np.concatenate(
                [
                    _weighted_residuals(traces, names, x, kinds, base, scales=sc),
                    prior_residuals(names, x, start, prior_scale, widths)[0],
                ]
            )

        def jac(x):
            j = _weighted_residuals(traces, names, x, kinds, base, jac=True, scales=sc)[1]
            return np.vstack([j, np.diag(prior_residuals(names, x, start, prior_scale, widths)[1])])

        return least_squares(
            fun,
            x0,
            jac=jac,  # pyright: ignore[reportArgumentType]  (scipy: a callable, typed by its default "2-point")
            bounds=(lo, hi),
            x_scale=scale,
            method="trf",
            tr_solver="exact",
            xtol=1e-10,
            ftol=1e-10,
            gtol=1e-10,
            max_nfev=500,
        )

    def reweighted(x0: np.ndarray):
        """Iteratively reweighted: the items' scales at the last optimum (item_scales), IRLS_STEPS times."""
        x, out = x0, None
        for _ in range(IRLS_STEPS):
            sc = item_scales(traces, names, x, kinds, base)
            r = solve(x, sc)
            x, out = r.x, (r, sc)
        assert out is not None
        return out

    res, sc = min((reweighted(x) for x in _starts(traces, names, start, warm)), key=lambda rs: rs[0].cost)
    j_data = _weighted_residuals(traces, names, res.x, kinds, base, jac=True, scales=sc)[1]
    sd = posterior_sd(j_data, prior_residuals(names, res.x, start, prior_scale, widths)[1])
    flat = {n for i, n in enumerate(names) if not np.any(j_data[:, i] != 0)}
    return dict(zip(names, res.x.tolist())), dict(zip(names, sd.tolist())), flat, j_data


def posterior_sd(j_data: np.ndarray, prior_slope: np.ndarray) -> np.ndarray:
    """The Laplace approximation at the optimum: sqrt(diag((JᵀJ + P)⁻¹)), J the data residuals' Jacobian (in
    units of DATA_SIGMA), P = diag(prior_slope²) the prior's precision (1 / width², in the parameter's unit)."""
    h = j_data.T @ j_data + np.diag(np.square(prior_slope))
    return np.sqrt(np.maximum(np.diag(np.linalg.inv(h)), 0.0))


def marginal_sd(
    traces,
    names: list[str],
    x: dict[str, float],
    held: list[str],
    start,
    base,
    kinds,
    prior_scale: float = 1.0,
    widths: dict[str, float] | None = None,
) -> dict[str, float]:
    """The posterior standard deviations of the fitted `names` at x with the parameters `held` (fixed at their prior
    centres, `start`: collinear with others, or too loosely constrained to fit) taken as free under their priors
    instead (the Laplace approximation over both, read for `names`): a fitted parameter that carries a held partner's
    share of a collinear column is as uncertain as that partner's prior, which the fit's own errors, conditional on
    the held values, leave out. Chains of holds (one held with partners later held themselves) are all in `held`."""
    full = list(names) + [h for h in held if h not in names]
    xf = np.array([x[n] for n in names] + [start[h] for h in full[len(names) :]], dtype=float)
    sc = item_scales(traces, full, xf, kinds, base)
    j_full = _weighted_residuals(traces, full, xf, kinds, base, jac=True, scales=sc)[1]
    sd = posterior_sd(j_full, prior_residuals(full, xf, start, prior_scale, widths)[1])
    return dict(zip(names, sd[: len(names)].tolist()))


def collinear(j: np.ndarray, i: int) -> bool:
    """Whether data column i lies in the span of the others (to 1e-9 of its unit-scaled norm): the traces cannot
    tell the parameter apart from the others, only the prior can (a per-layer term beside a per-batch one when
    every trace has the same layers)."""
    return collinear_partners(j, i, [str(k) for k in range(j.shape[1])]) is not None


COLLINEAR = "these traces cannot tell it apart from the other parameters (collinear Jacobian columns)"


def collinear_partners(j: np.ndarray, i: int, names: list[str]) -> list[str] | None:
    """Where column i is collinear (`collinear`), the other parameters whose data columns make it up: held at its
    prior's centre, column i's error there is carried by these, which the traces then fit to the sum; else None."""
    norm = float(np.linalg.norm(j[:, i]))
    keep = [k for k in range(j.shape[1]) if k != i and np.linalg.norm(j[:, k]) > 0]
    if norm == 0 or not keep:
        return None
    col = j[:, i] / norm
    basis = j[:, keep] / np.linalg.norm(j[:, keep], axis=0)
    coef = np.linalg.lstsq(basis, col, rcond=None)[0]
    if not np.linalg.norm(col - basis @ coef) < 1e-9:
        return None
    return [names[k] for k, c in zip(keep, coef) if abs(c) > 1e-6]


def fit_engine(
    traces: list[TraceData],
    refit: str = "all",
    base: dict[str, tuple[float, float | None]] | None = None,
    base_name: str | None = None,
    prior_scale: float = 1.0,
) -> FitResult:
    """Fit every engine parameter the traces identify (module doc); hold the rest at the prior's centre.
    With `base` (a calibration's fitted parameters: name -> (value, stderr)), those values are the traces'
    scenarios' own before the fit (where it starts, the priors' centres, the residuals' "before"); `refit`
    (REFITS) says what is fitted: every parameter, the host-scope ones, or one machine factor on every host
    time term; what a refit holds that the base fitted is written through (carried). `prior_scale` multiplies every
    parameter's prior width (PRIOR_SCALES: crossval.choose_prior_scale picks one by held-out configurations).
    BLAS runs single-threaded: the matrices are small, and threads only contend (with a process pool too); and a fit
    is then the same to the last bit on a machine of any core count (a threaded SVD's sums are not)."""
    import scipy.optimize  # noqa: F401  scipy's own BLAS, loaded before the limit: threadpoolctl limits only those loaded
    from threadpoolctl import threadpool_limits

    if refit not in REFITS:
        raise ValueError(f"refit must be one of {', '.join(REFITS)}, got {refit!r}")
    if not prior_scale > 0:
        raise ValueError(f"prior_scale must be positive, got {prior_scale!r}")
    if base:
        values = {n: v for n, (v, _) in base.items()}
        traces = [
            replace(td, values0={**td.values0, **{n: v for n, v in values.items() if n in td.values0}}) for td in traces
        ]
    with threadpool_limits(1):
        machines = sorted({td.machine for td in traces if td.machine})
        if refit != "machine" and len(machines) > 1:
            fit = _fit_machines(traces, refit, machines, prior_scale)
        else:
            fit = _fit_engine(traces, refit, prior_scale)
    fit.prior_scale = prior_scale
    if base:
        fit.base = base_name
        scale = fit.factor["value"] if fit.factor is not None else None
        unused = _unused_by({td.placement for td in traces})
        for n, (v, se) in base.items():
            if n in unused:  # the runs' placement does not use it: a file carrying it would be refused there
                continue
            if n not in fit.values:  # a method none of these runs has: its terms come through as the base has them,
                # its host times scaled by the machine's factor (the same CPU runs its launches and packing)
                fit.start[n] = v
                if scale is not None and n in HOST_TIMES:
                    v, se = v * scale, None if se is None else se * scale
                    fit.held[n] = f"no run of this method: the base's {_fmt(fit.start[n])} s × the machine factor"
                else:
                    fit.held[n] = "no run of this method"
            elif n in fit.fitted:
                continue
            fit.fitted[n] = v
            fit.values[n] = v
            fit.carried.add(n)
            if se is not None:
                fit.stderr[n] = se
    return fit


def _unused_by(placements: set[str]) -> set[str]:
    """The parameters none of these placements uses (engine.not_applied_in): a fit holds them, a refit writes none
    of them through."""
    from .engine import not_applied_in

    return set.intersection(*(not_applied_in(p) for p in placements)) if placements else set()


def _result(traces, candidates, start, widths, fitted, stderr, notes, held, refit: str, factor: dict | None = None):
    """A FitResult: every candidate's value (the fitted ones, else the prior's centre), the prior widths the fit used
    (prior_widths) and the residuals before and after, from what the fit found."""
    return FitResult(
        values={n: fitted.get(n, start[n]) for n in candidates},
        fitted=fitted,
        stderr=stderr,
        notes=notes,
        held=held,
        residuals=residual_summary(traces, fitted),
        start=start,
        refit=refit,
        factor=factor,
        widths=widths,
    )


def _fit_engine(traces: list[TraceData], refit: str = "all", prior_scale: float = 1.0) -> FitResult:
    families = sorted({td.family for td in traces})
    candidates = [n for n in PARAMETERS if not n.startswith("methods.") or n.split(".")[1] in families]
    graphs = all(td.meta.get("decode_mode") == "graphs" for td in traces)
    placements = {td.placement for td in traces}
    start = {n: _start_value(n, traces) for n in candidates}
    widths = prior_widths(candidates, traces)
    base = [dict(td.values0) for td in traces]
    held: dict[str, str] = {}
    kinds_of = {n: {(i, k) for i, td in enumerate(traces) for k in depends(n, td)} for n in candidates}
    unused = _unused_by(placements)
    active = []
    for n in candidates:
        if n in unused:
            held[n] = (
                f"placement {'/'.join(sorted(placements))} does not use it (the replicas run prefill as chunks "
                f"of decode iterations with the decode pool's settings, and move no KV)"
            )
            continue
        if refit != "all" and PARAMETERS[n].scope != "host":
            held[n] = f"--refit {refit} fits the machine's (host) terms; this one is {PARAMETERS[n].scope}"
            continue
        if refit == "machine":
            continue  # _fit_machine: one factor on the host time terms
        if not kinds_of[n]:
            held[n] = "no residual of these traces depends on it"
            continue
        if graphs and n.startswith("decode.host_issue"):
            # one CUDA-graph launch per decode step: no launches per layer or request overlap the GPU, and the
            # CPU time before the launch is serial (the loop gap); a floor here would only stand in for a
            # GPU-time mispricing
            held[n] = (
                "the traces' engine replays each decode step as one CUDA graph (meta decode_mode): its CPU "
                "time before the launch is serial, in the loop gap"
            )
            continue
        # a parameter that moves no residual where the fit starts (e.g. host issue time while every
        # iteration is GPU-bound, or a factor on a step the cost model gives no time) cannot be fitted
        h = prior_sd(n, start[n], prior_scale, widths) * 0.5
        probe = np.array([start[n]])
        _lo, hi = PARAMETERS[n].bounds
        step = h if start[n] + h <= hi else -h
        if is_host_floor(n):
            step = floor_probe(n, traces) - start[n]
        r0 = _weighted_residuals(traces, [n], probe, kinds_of[n], base)
        r1 = _weighted_residuals(traces, [n], probe + step, kinds_of[n], base)
        if not np.any(np.abs(r1 - r0) > 1e-12):
            held[n] = "no residual moves with it (" + _why_flat(n) + ")"
            continue
        active.append(n)
    if refit == "machine":
        return _fit_machine(traces, candidates, start, widths, base, held, kinds_of)
    fitted: dict[str, float] = {}
    stderr: dict[str, float] = {}
    notes: dict[str, str] = {}
    joint: dict[str, list[str]] = {}  # a fitted parameter -> the collinear ones held beside it
    support: dict[str, dict[str, float]] = {}
    for group in _components(active, traces):
        kinds = set().union(*(kinds_of[n] for n in group))
        names = list(group)
        warm = None
        x: dict[str, float] = {}
        sd: dict[str, float] = {}
        # held in this group where residuals move with them (collinear, or too loosely constrained): their priors
        # enter the fitted ones' errors (marginal_sd)
        held_moving: list[str] = []
        while names:
            x, sd, flat, j_data = _map_fit(traces, names, start, base, kinds, warm, prior_scale, widths)
            warm = x
            # identified: the runs constrain it to at most IDENTIFIED of the stated width (prior_widths: a profiled
            # kernel's factor its narrower one; the posterior sd with those priors, whatever the scale: which
            # parameters the runs pin down is theirs, the scale only sets how hard the rest is pulled toward the
            # kernels)
            sd1 = sd
            if prior_scale != 1.0:
                slope = prior_residuals(names, np.array([x[n] for n in names]), start, widths=widths)[1]
                sd1 = dict(zip(names, posterior_sd(j_data, slope).tolist()))
            ratio = {n: sd1[n] / prior_sd(n, x[n], widths=widths) for n in names}
            unidentified = {n: r for n, r in ratio.items() if r > IDENTIFIED}
            if not unidentified:
                break
            worst = max(unidentified, key=lambda k: (k in flat, unidentified[k]))
            partners = None if worst in flat else collinear_partners(j_data, names.index(worst), names)
            if worst in flat:
                held[worst] = "no residual moves with it at the optimum (" + _why_flat(worst) + ")"
            elif partners is not None:
                held[worst] = COLLINEAR + (f": with {', '.join(partners)}" if partners else "")
                held_moving.append(worst)
                for other in partners:
                    joint.setdefault(other, []).append(worst)
            else:
                held[worst] = (
                    f"the traces do not constrain it: posterior sd {_fmt(sd1[worst])} against the prior's "
                    f"{_fmt(prior_sd(worst, x[worst], widths=widths))} (fitted needs at most {IDENTIFIED:g} of it)"
                )
                held_moving.append(worst)
            names.remove(worst)
        if not names:
            continue
        for n in names:
            if PARAMETERS[n].integer:
                whole = float(round(x[n]))
                if whole == x[n]:
                    continue
                notes[n] = f"fitted {x[n]:.3f} ± {sd[n]:.3f}, rounded to {whole:.0f}: a count; the rest refitted"
                rest = [k for k in names if k != n]
                base = [{**b, n: whole} for b in base]
                if rest:
                    x2, sd2, _, _ = _map_fit(
                        traces, rest, start, base, kinds, warm=x, prior_scale=prior_scale, widths=widths
                    )
                    x.update(x2)
                    sd.update(sd2)
                x[n] = whole
        if held_moving:  # the fitted ones' errors with the held ones free under their priors (marginal)
            sd = {**sd, **marginal_sd(traces, names, x, held_moving, start, base, kinds, prior_scale, widths)}
        for n in names:
            fitted[n] = x[n]
            stderr[n] = sd[n]
        support.update(_support(traces, kinds, names, j_data))
    for n, others in joint.items():
        if n in fitted:  # its value is the traces' sum less the others' centres: their prior widths are in its error
            note = (
                f"fitted jointly with {', '.join(others)}, held at the prior's centre: an error there is carried "
                f"here, and its standard error includes their prior widths"
            )
            notes[n] = notes[n] + "; " + note if n in notes else note
    fit = _result(traces, candidates, start, widths, fitted, stderr, notes, held, refit)
    fit.support = {n: support[n] for n in fitted if n in support}
    return fit


SUPPORT_SHOWN = 0.05  # support: the configurations with at least this share of a parameter's information
PINNED_BY_ONE = 0.5  # format_fit names a parameter whose one configuration has at least this share


def _support(
    traces: list[TraceData], kinds: set[tuple[int, str]], names: list[str], j_data: np.ndarray
) -> dict[str, dict[str, float]]:
    """For each of `names`, the share of the runs' information about it (the sum of its squared data Jacobian
    entries, j_data's column: rows in _item_blocks' order) that each configuration's runs give, largest first, those
    of at least SUPPORT_SHOWN: a parameter one configuration pins down carries to settings unlike it only as far as
    the model's shape does (what `validate --cv` measures by holding that configuration out)."""
    blocks = _item_blocks(traces, kinds)
    configs = np.repeat(
        np.array([traces[i].configuration for i, _ in blocks], dtype=object),
        [len(traces[i].blocks[k]["meas"]) for i, k in blocks],
    )
    out = {}
    for col, n in enumerate(names):
        info = np.square(j_data[:, col])
        total = float(info.sum())
        if not total > 0:
            continue
        share = {c: float(info[configs == c].sum()) / total for c in dict.fromkeys(configs.tolist())}
        kept = sorted(((c, v) for c, v in share.items() if v >= SUPPORT_SHOWN), key=lambda cv: -cv[1])
        out[n] = {c: round(v, 4) for c, v in kept}
    return out


def _fit_machines(traces: list[TraceData], refit: str, machines: list[str], prior_scale: float = 1.0) -> FitResult:
    """The engine fitted to runs of several machines (the index's column machine): the shared parameters with each
    machine's host time terms times its factor, and each factor (prior N(0, MACHINE_PRIOR_WIDTH) on its ln) at the
    shared values, in MACHINE_ROUNDS rounds, then the shared fit at the last factors. The factors are normalised to a
    geometric mean of 1 over the machines, so the shared host terms are those of the machines' typical CPU: what a
    run on a machine the fit has not seen is priced with. A run without a machine takes the factor 1."""

    def shared(factors: dict[str, float]) -> FitResult:
        at = [replace(td, host_factor=factors.get(td.machine or "", 1.0)) for td in traces]
        return _fit_engine(at, refit, prior_scale)

    factors = dict.fromkeys(machines, 1.0)
    for _ in range(MACHINE_ROUNDS):
        fitted = shared(factors).fitted
        raw = {m: _machine_factor([td for td in traces if td.machine == m], fitted) for m in machines}
        mid = math.exp(float(np.mean([math.log(f) for f in raw.values()])))
        factors = {m: f / mid for m, f in raw.items()}
    fit = shared(factors)
    fit.machines = {m: {"factor": factors[m], "traces": sum(td.machine == m for td in traces)} for m in machines}
    return fit


def _machine_factor(traces: list[TraceData], values: dict[str, float]) -> float:
    """One machine's factor on the host time terms at the shared fitted `values` (the rest each run's scenario's own,
    as the fit holds them): the MAP estimate of its ln with the prior N(0, MACHINE_PRIOR_WIDTH), over every item of
    its runs (1 where none moves with the host terms)."""
    from scipy.optimize import least_squares

    base = [{**td.values0, **{n: v for n, v in values.items() if n in td.values0}} for td in traces]
    kinds = {(i, k) for i, td in enumerate(traces) for k in KINDS if k in td.blocks and len(td.blocks[k]["meas"])}
    none = np.zeros(0)
    sc = item_scales(traces, [], none, kinds, base)

    def r(u: np.ndarray) -> np.ndarray:
        at = [replace(td, host_factor=math.exp(float(u[0]))) for td in traces]
        return np.append(_weighted_residuals(at, [], none, kinds, base, scales=sc), u[0] / MACHINE_PRIOR_WIDTH)

    res = least_squares(r, [0.0], bounds=([math.log(1 / 8)], [math.log(8.0)]), method="trf", diff_step=1e-3)
    return math.exp(float(res.x[0]))


def _machine_u(traces, names, x0, kinds, base, lo, hi) -> tuple[float, float] | None:
    """ln s of one factor s on the host time terms `names` (x0 at s = 1) over the items `kinds` of `traces`, and its
    posterior sd: the MAP estimate with the prior N(0, MACHINE_PRIOR_WIDTH), least squares from a grid's best start
    within [lo, hi], the items' scales renewed at each optimum (IRLS_STEPS). None where no residual moves with it."""
    from scipy.optimize import least_squares

    sc: dict | None = None  # the items' scales (item_scales), renewed at each optimum below

    def data(u: float) -> np.ndarray:
        return _weighted_residuals(traces, names, x0 * math.exp(u), kinds, base, scales=sc)

    def slope(u: float) -> np.ndarray:  # d data / d ln s
        x = x0 * math.exp(u)
        return _weighted_residuals(traces, names, x, kinds, base, jac=True, scales=sc)[1] @ x

    if not names or not np.any(np.abs(data(math.log(2.0)) - data(0.0)) > 1e-12):
        return None
    grid = np.linspace(lo, hi, 33)
    cost = [float(np.sum(np.square(data(u))) + (u / MACHINE_PRIOR_WIDTH) ** 2) for u in grid]
    u = float(grid[int(np.argmin(cost))])
    for _ in range(IRLS_STEPS):
        sc = item_scales(traces, names, x0 * math.exp(u), kinds, base)
        res = least_squares(
            lambda v: np.append(data(float(v[0])), v[0] / MACHINE_PRIOR_WIDTH),
            [u],
            jac=lambda v: np.append(slope(float(v[0])), 1 / MACHINE_PRIOR_WIDTH)[:, None],  # pyright: ignore[reportArgumentType]
            bounds=([lo], [hi]),
            method="trf",
            xtol=1e-12,
            ftol=1e-12,
            gtol=1e-12,
        )
        u = float(res.x[0])
    ju = slope(u)
    return u, 1.0 / math.sqrt(float(ju @ ju) + 1 / MACHINE_PRIOR_WIDTH**2)


def _fit_machine(traces, candidates, start, widths, base, held, kinds_of) -> FitResult:
    """One factor s on every host time term (scope host, in seconds) at once: values = start × s, the MAP
    estimate of ln s with the prior N(0, MACHINE_PRIOR_WIDTH) (least squares over a grid's best start, s in
    [1/8, 8] within every term's bounds). Its standard error is the larger of the fit's and the spread of the runs'
    own factors (each run fitted alone, `factor["runs"]`) over √runs: where the runs of one machine disagree more than
    their items' noise says (their host items miss differently), that spread is what the next run moves it by; the
    terms' standard errors follow by the delta method. A term the runs' scenarios disagree on, or at zero, is held
    (a factor on it would write one value for all, or change nothing). Raises ScenarioError when no residual moves
    with the factor."""
    from .config import ScenarioError

    names = []
    for n in candidates:
        p = PARAMETERS[n]
        if n in held or p.scope != "host":
            continue
        if p.unit != "s":
            held[n] = "a ratio (the host terms' level while the link moves KV), not a time: the factor leaves it"
            continue
        if len({td.values0[n] for td in traces}) > 1:
            held[n] = "the runs' scenarios disagree on it: a machine factor would write one value for all of them"
        elif start[n] == 0.0:
            held[n] = "zero in the runs' scenarios: a factor leaves it at zero"
        else:
            names.append(n)
    kinds = set().union(*(kinds_of[n] for n in names)) if names else set()
    x0 = np.array([start[n] for n in names])
    his = [PARAMETERS[n].bounds[1] / start[n] for n in names]
    lo, hi = math.log(1 / 8), math.log(min([8.0, *his]))
    found = _machine_u(traces, names, x0, kinds, base, lo, hi)
    if found is None:
        raise ScenarioError(
            "--refit machine: no residual of these runs moves with the host terms (none waits on the CPU at "
            "these values, or the scenarios give them none): nothing fits a machine factor"
        )
    u, sd_u = found
    runs = []  # ln of each run's own factor
    if len(traces) > 1:
        for i, td in enumerate(traces):
            one = _machine_u([td], names, x0, {(0, k) for j, k in kinds if j == i}, [base[i]], lo, hi)
            if one is not None:
                runs.append(one[0])
    sd_runs = float(np.std(runs, ddof=1)) / math.sqrt(len(runs)) if len(runs) > 1 else 0.0
    own = _configuration_factors(traces, names, x0, kinds, base, lo, hi)
    s, sd = math.exp(u), max(sd_u, sd_runs)
    fitted = {n: start[n] * s for n in names}
    stderr = {n: start[n] * s * sd for n in names}
    notes = {n: f"the start {_fmt(start[n])} s × the machine factor {s:.4f}" for n in names}
    factor = {
        "value": s,
        "stderr": s * sd,
        "prior": {"centre": 1.0, "width": MACHINE_PRIOR_WIDTH, "of": "ln(value)"},
        "terms": names,
    }
    if runs:
        factor["runs"] = [round(math.exp(r), 4) for r in runs]
    if own:
        factor["configurations"] = {c: round(math.exp(v), 4) for c, v in own.items()}
    if len(own) > 1:
        factor["between_configurations_sd"] = round(float(np.std(list(own.values()), ddof=1)), 4)
    return _result(traces, candidates, start, widths, fitted, stderr, notes, held, "machine", factor)


def _configuration_factors(traces, names, x0, kinds, base, lo, hi) -> dict[str, float]:
    """Where the runs span two or more configurations, ln of each configuration's own factor (its runs fitted
    together, as _machine_u): whether one factor describes the machine, or its configurations disagree on the host
    (they load it differently: host-bound short prefills against a GPU-bound loop), in which case the spread between
    them, not the runs' noise, is what a configuration the runs do not have would move it by."""
    configs = sorted({td.configuration for td in traces})
    out: dict[str, float] = {}
    if len(configs) < 2:
        return out
    for c in configs:
        idx = [i for i, td in enumerate(traces) if td.configuration == c]
        at = {i: j for j, i in enumerate(idx)}
        one = _machine_u(
            [traces[i] for i in idx],
            names,
            x0,
            {(at[i], k) for i, k in kinds if i in at},
            [base[i] for i in idx],
            lo,
            hi,
        )
        if one is not None:
            out[c] = one[0]
    return out


def _why_flat(name: str) -> str:
    if name.startswith("decode.host_issue"):
        return "no iteration waits on the host at these traces' values: their engine issues each step as one graph"
    if name.startswith("prefill.host_issue") or name.endswith("prefill_issue_s_per_layer"):
        return "no prefill waits on the host"
    if name.endswith("quantize_issue_s_per_layer"):
        return "no quantize step waits on the host"
    if name.endswith((".quantize", ".dequantize", ".approximation")):
        return "the cost model gives this method no time for the step, or a host floor covers it"
    return "it does not enter these traces' predictions"


def _fmt(x: float) -> str:
    return f"{x:.3g}"


def residual_summary(traces: list[TraceData], fitted: dict[str, float]) -> dict:
    """Per residual kind, over the traces at the scenarios' values and with the fitted ones (each trace weighted
    equally): the RMS and mean of the items' relative errors, and the error of their total (the trace's summed price
    against its summed measured time: what the fit matches; of items that spread, the mean relative error sits above
    it)."""
    out = {}
    for kind in KINDS:
        before, after, n = [], [], 0
        for td in traces:
            if kind not in td.blocks or not len(td.blocks[kind]["meas"]):
                continue
            meas = td.blocks[kind]["meas"]
            n += len(meas)
            before.append((predict(td, kind, td.values0), meas))
            after.append((predict(td, kind, on_machine({**td.values0, **fitted}, td.host_factor)), meas))
        if before:
            out[kind] = {"items": n, "traces": len(before)}
            for when, rows in (("before", before), ("after", after)):
                rel = [(p - m) / m for p, m in rows]
                out[kind][f"rms_pct_{when}"] = round(100 * float(np.mean([np.sqrt(np.mean(r**2)) for r in rel])), 3)
                out[kind][f"mean_pct_{when}"] = round(100 * float(np.mean([np.mean(r) for r in rel])), 3)
                total = [float(np.sum(p)) / float(np.sum(m)) - 1 for p, m in rows]
                out[kind][f"total_pct_{when}"] = round(100 * float(np.mean(total)), 3)
    return out


# ---- the file --------------------------------------------------------------------------------------
def git_rev() -> str:
    try:
        out = subprocess.run(
            ["git", "-C", str(REPO_ROOT), "rev-parse", "HEAD"], check=False, capture_output=True, text=True, timeout=10
        )
        return out.stdout.strip() or "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def engine_description(traces: list[TraceData]) -> str:
    keys = ("gpu", "decode_mode", "placement", "backend", "model_id")
    parts = []
    for k in keys:
        vals = sorted({str(td.meta.get(k)) for td in traces if td.meta.get(k) is not None})
        if vals:
            parts.append(f"{k} {'/'.join(vals)}")
    return "; ".join(parts)


def base_mismatch(base_engine: str, traces: list[TraceData]) -> str | None:
    """A line when a base calibration (its `engine` description) was fitted on another GPU or decode mode than these
    runs: its GPU terms are then carried to kernels they were not fitted on. None when they agree or either is
    silent."""

    def parts(text: str) -> dict[str, set[str]]:
        out = {}
        for item in text.split("; "):
            key, _, vals = item.partition(" ")
            if vals:
                out[key] = set(vals.split("/"))
        return out

    base, here = parts(base_engine), parts(engine_description(traces))
    for key in ("gpu", "decode_mode"):
        if key in base and key in here and not base[key] & here[key]:
            return (
                f"the base calibration was fitted on {key} {'/'.join(sorted(base[key]))}, these runs have "
                f"{'/'.join(sorted(here[key]))}: its GPU and link terms are carried as they are (--refit all fits them "
                "here)"
            )
    return None


FIT_METHOD = (
    "maximum a posteriori: scipy.optimize.least_squares (trf) within each parameter's bounds on the errors, relative "
    f"to each item's price (taken where the fit starts, renewed at each optimum: {IRLS_STEPS} solves), of iteration "
    "cadences or inter-token latencies, prefill (or idle first-token), quantize and transfer "
    f"durations, each trace weighted equally per kind, in units of a trace's run-to-run spread {DATA_SIGMA:g}, plus "
    "each parameter's deviation from its prior (centre: the scenarios' value, else neutral; width: "
    "engine.Parameter.prior_width, of ln(value) for a factor; a method's step factor engine.PROFILED_FACTOR_PRIOR_WIDTH "
    "where its runs executed the kernels the measured profile priced); fitted where the posterior sd is at most "
    f"{IDENTIFIED:g} of the prior's, else held at the centre; standard errors: the posterior sd"
)


def engine_file(
    fit: FitResult,
    traces: list[TraceData],
    index: str,
    command: str,
    version: str,
    prior_choice: dict | None = None,
    base_domain: dict | None = None,
) -> dict:
    """The engine calibration file (engine.EngineFile) for a fit: every candidate parameter with its value,
    standard error, whether it was fitted, its scope and shape and prior, the residuals, the runs' domain
    (simulator/domain.py; with a base calibration's `base_domain`, the union of both), and where it all came
    from; with `prior_choice` (crossval.choose_prior_scale), how the priors' scale was chosen."""
    import scipy

    from .domain import domain_of, merge_domains

    params = {}
    for n, v in fit.values.items():
        p = PARAMETERS[n]
        rec = {
            "value": float(v),
            "stderr": None,
            "fitted": n in fit.fitted,
            "unit": p.unit,
            "bounds": list(p.bounds),
            "scope": p.scope,
            "shape": p.shape,
            "prior": {
                "centre": fit.start[n],
                "width": fit.widths.get(n, p.prior_width) * fit.prior_scale,
                "of": "ln(value)" if p.log_prior else "value",
            },
            "note": p.meaning,
        }
        if n in fit.fitted:
            rec["stderr"] = float(fit.stderr[n]) if n in fit.stderr else None
            if n in fit.support and n not in fit.carried:
                rec["support"] = fit.support[n]
            if n in fit.carried:
                rec["note"] += CARRIED_PREFIX + f"{fit.base}; " + fit.held.get(n, "")
            elif n in fit.notes:
                rec["note"] += "; " + fit.notes[n]
        else:
            rec["note"] += HELD_PREFIX + fit.held.get(n, "")
        params[n] = rec
    about: dict = {"method": FIT_METHOD, "residuals": fit.residuals, "traces": len(traces)}
    if fit.prior_scale != 1.0 or prior_choice is not None:
        about["prior_scale"] = {"value": fit.prior_scale, **(prior_choice or {"chosen_by": "given (--prior-scale)"})}
    if fit.refit != "all" or fit.base is not None:
        about["refit"] = fit.refit
        about["base"] = fit.base
    if fit.factor is not None:
        about[MACHINE_FACTOR] = fit.factor
    if fit.machines:
        about["machines"] = {
            "about": "runs of several machines (the index's column machine): each machine's factor on every host time "
            "term; the parameters' host time terms are the machines' typical CPU (factors' geometric mean 1), what a "
            "scenario is priced with; move the file to one machine with calibrate --base FILE --refit machine",
            "factors": fit.machines,
        }
    return {
        "schema_version": SCHEMA_VERSION,
        "kind": KIND,
        "engine": engine_description(traces),
        "parameters": params,
        "fit": about,
        "domain": merge_domains(domain_of([td.setting for td in traces if td.setting]), base_domain),
        "provenance": {
            "index": index,
            "command": command,
            "git_rev": git_rev(),
            "hacksim": version,
            "numpy": np.__version__,
            "scipy": scipy.__version__,
            "python": platform.python_version(),
            "traces": [
                {
                    "trace": td.name,
                    "scenario": td.scenario,
                    "method": td.method,
                    "source": td.source,
                    "files": td.files,
                    "items": {k: int(len(b["meas"])) for k, b in td.blocks.items()},
                    "notes": td.notes,
                    **{
                        k: td.meta[k]
                        for k in ("gpu", "driver", "torch", "triton", "git_rev", "date", "decode_mode", "placement")
                        if k in td.meta
                    },
                }
                for td in traces
            ],
        },
    }


def load_index(index_csv: str | Path, workers: int = 1, progress: Progress | None = None) -> list[TraceData]:
    """Every run an index lists (validate.read_index: trace, scenario; optional method), priced once, in `workers`
    processes, `progress` told of each (process_pool.map_in_processes); its configuration is its scenario's name (an
    index's `config` column groups repeats: simulator/noise.py)."""
    from .measured import read_index

    return map_in_processes(_load_row, read_index(index_csv), workers, progress, ("reading the runs", "runs"))


def _load_row(r) -> TraceData:
    return replace(
        load_trace_data(r.trace_path, r.scenario_path, r.trace, r.scenario, method=r.method), machine=r.machine
    )


def fit_values(fit: FitResult) -> dict[str, float]:
    """What a fit changes in a scenario: its fitted parameters (held ones stay each scenario's own)."""
    return dict(fit.fitted)


# ---- for people ------------------------------------------------------------------------------------
SCOPES = (
    ("host", "machine-specific (host CPU time: this machine and engine build)"),
    ("gpu", "GPU kernels against the profile (carry to the same GPU and kernels)"),
    ("link", "link"),
)


def format_fit(doc: dict) -> str:
    """The engine calibration file for people: the fitted parameters by scope with their shape, prior and
    standard error, the residuals before and after, each held parameter with the reason, and what each run gave
    the fit."""
    from reports.terminal import render, table

    params = doc["parameters"]
    out = []
    about = doc["fit"]
    factor = about.get(MACHINE_FACTOR)
    if factor is not None:
        where = "the base calibration" if about.get("base") else "the runs' scenarios"
        out.append(
            f"machine host factor {factor['value']:.4f} ± {factor['stderr']:.2g} (prior 1 ×÷ "
            f"{math.exp(factor['prior']['width']):.3g}): each of the {len(factor['terms'])} host time terms below is "
            f"its value in {where} times it"
            + (
                f"; the runs alone give {min(factor['runs']):.3f}–{max(factor['runs']):.3f}"
                if len(factor.get("runs", ())) > 1
                else ""
            )
        )
        own = factor.get("configurations", {})
        if len(own) > 1:
            out.append(
                "each configuration's runs alone: "
                + ", ".join(f"{c} {v:.3f}" for c, v in own.items())
                + f" (spread ×÷ {math.exp(factor['between_configurations_sd']):.3g} between them: what a configuration "
                "these runs do not have may move the factor by, where they load the host differently)"
            )
    ps = about.get("prior_scale")
    if ps is not None:
        grid = ps.get("held_out_jct_mean_abs_error_pct")
        how = "" if grid is None else ": " + ", ".join(f"x{s} {e:.2f} %" for s, e in grid.items())
        out.append(f"prior widths x{ps['value']:g} (the stated widths times it), {ps['chosen_by']}{how}")
    machines = about.get("machines")
    if machines:
        out.append(
            "runs of several machines: one factor each on the host time terms below (those of the machines' typical "
            "CPU, factors' geometric mean 1): "
            + ", ".join(f"{m} {r['factor']:.3f} ({r['traces']} runs)" for m, r in machines["factors"].items())
        )

    def carried(r: dict) -> bool:
        return CARRIED_PREFIX in r.get("note", "")

    for scope, title in SCOPES:
        rows = [
            [
                n,
                f"{r['value']:.4g}",
                f"{r['stderr']:.2g}",
                r["unit"],
                _prior_text(r),
                r.get("shape", ""),
            ]
            for n, r in params.items()
            if r["fitted"] and not carried(r) and r.get("scope", "gpu") == scope
        ]
        if rows:
            out.append(
                render(
                    table(
                        ["parameter", "value", "std err", "unit", "prior", "shape"],
                        rows,
                        title=f"{title}: fitted to {doc['fit']['traces']} traces",
                        right=("value", "std err"),
                    )
                )
            )
    res = [
        [
            k,
            str(v["items"]),
            f"{v['rms_pct_before']:.1f}%",
            f"{v['rms_pct_after']:.1f}%",
            f"{v['mean_pct_before']:+.1f}%",
            f"{v['mean_pct_after']:+.1f}%",
            f"{v['total_pct_before']:+.1f}%" if "total_pct_before" in v else "",
            f"{v['total_pct_after']:+.1f}%" if "total_pct_after" in v else "",
        ]
        for k, v in doc["fit"]["residuals"].items()
    ]
    heads = ["residual", "items", "rms before", "rms after", "mean before", "mean after", "total before", "total after"]
    out.append(render(table(heads, res)))
    kept = [(n, r) for n, r in params.items() if carried(r)]
    if kept:
        out.append(
            f"carried from the base calibration {about.get('base')} (--refit {about.get('refit')}; not refitted):"
        )
        out += [f"  {n} = {r['value']:.4g} {r['unit']}" for n, r in kept]
    pinned = [
        (n, r["support"]) for n, r in params.items() if r.get("support") and max(r["support"].values()) >= PINNED_BY_ONE
    ]
    if pinned and len({c for r in params.values() for c in r.get("support", {})}) > 1:  # of one configuration: all
        out.append(
            f"pinned down mostly by one configuration ({PINNED_BY_ONE:.0%} or more of the runs' information about it: a "
            "setting unlike that one relies on this value carrying to it; validate --cv --folds configuration measures "
            "whether it does):"
        )
        out += [f"  {n}: " + ", ".join(f"{c} {v:.0%}" for c, v in sup.items()) for n, sup in pinned]
    far = [(n, r, prior_distance(r)) for n, r in params.items() if r["fitted"] and not carried(r)]
    far = [(n, r, z) for n, r, z in far if z > FAR_FROM_PRIOR]
    if far:
        out.append(
            f"fitted more than {FAR_FROM_PRIOR:g} prior widths from where the kernels and the scenarios put them (the runs "
            "disagree with that value: a term the model lacks may be carried here, and may not carry to other settings):"
        )
        out += [f"  {n}: {r['prior']['centre']:.4g} -> {r['value']:.4g}, {z:.1f} widths" for n, r, z in far]
    out.append("held at the prior's centre (where the kernels and the scenarios put them):")
    out += [
        f"  {n} = {r['value']:.4g}: {r['note'].split(HELD_PREFIX)[-1]}" for n, r in params.items() if not r["fitted"]
    ]
    from .domain import describe

    where = describe(doc.get("domain") or {})
    if where:  # a scenario outside these settings extrapolates the fit (simulate and validate say so)
        out.append("fitted on runs of (5th-95th percentile lengths):")
        out += [f"  {line}" for line in where]
    lacking = [(t["trace"], t.get("notes") or []) for t in doc["provenance"]["traces"]]
    if any(n for _, n in lacking):
        out.append("what the runs lack, and what they gave the fit instead:")
        out += [f"  {name}: {'; '.join(notes)}" for name, notes in lacking if notes]
    return "\n".join(out)


def prior_distance(r: dict) -> float:
    """How far a parameter record's value lies from its prior's centre, in prior widths (on ln for a factor)."""
    p = r["prior"]
    if p["of"] == "ln(value)":
        return abs(math.log(max(r["value"], 1e-300) / max(p["centre"], 1e-300))) / p["width"]
    return abs(r["value"] - p["centre"]) / p["width"]


def _prior_text(r: dict) -> str:
    p = r.get("prior")
    if not p:
        return ""
    if p["of"] == "ln(value)":
        return f"{p['centre']:.3g} ×÷ {math.exp(p['width']):.3g}"
    return f"{p['centre']:.3g} ± {p['width']:.2g}"
