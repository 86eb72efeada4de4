"""Fit an engine calibration (simulator/engine.py) to measured runs, and score it on runs it has not seen.

`fit_engine(traces)` takes measured traces and the scenarios that describe them and fits the engine's
named physical parameters (engine.PARAMETERS) by bounded least squares (scipy.optimize.least_squares,
trust-region reflective, within each parameter's physical bounds) on relative residuals,
(predicted − measured) / measured, of

* every decode iteration's cadence, start to the next iteration's start where no prefill runs
  between them and the batch did not empty: the cost model's ``IterationCost.time_s`` for the measured
  batch size and context (loop gap included) plus the join time of the requests joining it;
* every prefill batch's duration (``PrefillCost.latency_s``: efficiency, correction, and the CPU issue
  floor, per batch, layer and request and per layer for the method's own launches);
* every quantize step (``PrefillCost.encode_s`` times the method's quantize factor);
* every transfer's duration: the link's fluid max-min sharing replayed from the measured transfer starts
  with the priced wire bytes, at line rate × efficiency, plus the latency.

The cost model is used directly: each trace's batches are priced once at neutral engine parameters
and the parameters enter those prices the way `ReplicaCostModel` applies them (on a trace the
simulator generated, the fit reproduces every item to rounding: tests/test_calibrate.py), so a fit
takes seconds, not a simulation per step. Each trace weighs the same in each residual kind (weights
1/√n). Parameters that share no residual are fitted apart (the problem is block-diagonal, so this is
exact); a host issue time is a max() floor, so each fit also starts where the floors bind and the
better optimum wins. Standard errors come from the Jacobian at the optimum, s²(JᵀJ)⁻¹ with s² the
residual variance; iterations of one run are not independent, so they are lower bounds. A parameter
is *held* at the scenario's value, not fitted, when no residual depends on it (e.g. a factor on a step
the method does not have), when the traces' structure cannot separate it from others (its Jacobian
column spanned by earlier parameters' at every start: a per-layer term when every trace has the same
layers), when the traces' engine replays each decode step as one CUDA graph (decode issue terms), or
when the traces do not resolve it: a standard error above half its natural size (``RESOLUTION``); the
least resolved goes first and the rest are refitted. The count of extra kernels is rounded to a whole
number and the rest refitted.

`cross_validate` fits on all traces (in-sample), on all but one (leave one trace out) and on all but
one configuration (its scenario: model × link), and simulates each trace with a calibration fitted
without it; the held-out errors are the ones to quote.
"""

from __future__ import annotations

import hashlib
import heapq
import math
import platform
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, overload

import numpy as np
import pandas as pd

from costmodel.methods import REFERENCE

from .config import ScenarioError
from .engine import FACTOR_STEPS, KIND, PARAMETERS, SCHEMA_VERSION, apply_values
from .load import load_scenario
from .resolve import REPO_ROOT, network_bandwidth_gbps, resolve

# What "resolved" means per parameter: a standard error at most half of max(|value|, this size).
RESOLUTION = {
    "decode.host_serial_s_per_iteration": 1e-4,
    "decode.host_issue_s_per_iteration": 1e-4,
    "decode.host_issue_s_per_layer": 1e-5,
    "decode.host_issue_s_per_request": 1e-5,
    "decode.extra_kernels_per_layer": 1.0,
    "decode.join_s_per_request": 1e-4,
    "prefill.prefill_efficiency": 0.1,
    "prefill.host_issue_s_per_iteration": 1e-4,
    "prefill.host_issue_s_per_layer": 1e-5,
    "prefill.host_issue_s_per_request": 1e-5,
    "network.efficiency": 0.1,
    "network.latency_s": 1e-4,
}
ISSUE_RESOLUTION = 1e-5  # methods.<m>.prefill_issue_s_per_layer
FACTOR_RESOLUTION = 0.2
MAX_ITERATIONS = 200  # decode iterations per trace in the fit, evenly spaced (_iteration_block)
KINDS = ("iteration", "prefill", "quantize", "transfer")
HELD_PREFIX = "; held at the scenarios' value: "


def resolution(name: str) -> float:
    if name.endswith("prefill_issue_s_per_layer"):
        return ISSUE_RESOLUTION
    return RESOLUTION.get(name, FACTOR_RESOLUTION)


# ---- one trace, priced once ------------------------------------------------------------------------
@dataclass
class TraceData:
    """A measured trace with its batches priced by the cost model at neutral engine parameters."""

    name: str
    scenario: str
    configuration: str
    method: str  # the method's name in the scenario (its label, if any)
    family: str  # its registry name: whose implementation factors apply
    values0: dict[str, float]  # the scenario's own value of every engine parameter
    blocks: dict[str, dict] = field(default_factory=dict)  # kind -> arrays (see _iteration_block, ...)
    files: dict[str, str] = field(default_factory=dict)  # file name -> sha256
    meta: dict = field(default_factory=dict)


def scenario_values(s) -> dict[str, float]:
    """Every engine parameter's value in the scenario."""
    out = {}
    for name in PARAMETERS:
        head, *rest = name.split(".")
        if head == "methods":
            f = s.calibration.implementation_factors.get(rest[0])
            out[name] = PARAMETERS[name].neutral if f is None else float(getattr(f, rest[1]))
        elif head == "network":
            out[name] = float(getattr(s.network, rest[0]))
        else:
            out[name] = float(getattr(getattr(s, head), rest[0]))
    return out


def neutral(s):
    """The scenario with every engine parameter at the value that adds nothing."""
    return apply_values(s, {k: p.neutral for k, p in PARAMETERS.items()})


def load_trace_data(
    trace: str | Path, scenario_path: str | Path, name: str | None = None, scenario_label: str | None = None
) -> TraceData:
    from .validate import load_trace

    df, iterations, meta, req_path = load_trace(trace)
    method = meta.get("method")
    if method is None:
        raise ScenarioError(f"{trace}: no method in meta.json")
    s = load_scenario(
        scenario_path,
        [f"workload.trace_csv={req_path.resolve()}", "workload.arrival={kind: trace}", f"workload.requests={len(df)}"],
    )
    cfg = next((m for m in s.methods if m.output_name == method), None)
    if cfg is None:
        raise ScenarioError(f"{scenario_path}: methods: the trace's method {method!r} is not in the scenario")
    res = resolve(neutral(s), str(scenario_path))
    pre, dec = res.costs(cfg)
    td = TraceData(
        name=name or str(trace),
        scenario=scenario_label or str(scenario_path),
        configuration=Path(str(scenario_label or scenario_path)).stem,
        method=method,
        family=cfg.name,
        values0=scenario_values(s),
        meta={k: meta[k] for k in sorted(meta) if k != "notes"},
    )
    folder = req_path.parent
    for f in ("requests.csv", "iterations.csv", "meta.json"):
        if (folder / f).exists():
            td.files[f] = hashlib.sha256((folder / f).read_bytes()).hexdigest()
    if iterations is not None and len(iterations):
        td.blocks["iteration"] = _iteration_block(df, iterations, dec)
    td.blocks["prefill"], quantize = _prefill_blocks(df, pre)
    if quantize is not None:
        td.blocks["quantize"] = quantize
    net = s.network
    if (
        s.prefill.replicas == 1
        and net.links is None
        and not net.stream_layers
        and net.per_flow_gbps is None
        and math.isfinite(network_bandwidth_gbps(s))
    ):
        td.blocks["transfer"] = _transfer_block(df, pre, network_bandwidth_gbps(s))
    return td


def _iteration_block(df: pd.DataFrame, it: pd.DataFrame, dec) -> dict:
    start, end = it["start_s"].to_numpy(), it["end_s"].to_numpy()
    b = it["batch_size"].to_numpy().astype(np.int64)
    ctx = it["context_tokens"].to_numpy().astype(np.float64)
    joins = np.zeros(len(it), dtype=np.int64)
    k = np.searchsorted(start, df["decode_start_s"].to_numpy())  # decode_start_s = the joining iteration's start
    np.add.at(joins, np.clip(k, 0, len(it) - 1), 1)
    prefills = np.sort(df["prefill_start_s"].to_numpy())
    # the cadence of iteration i, to the next one's start, where the engine went straight on: no prefill
    # ran between them and the batch did not empty (every request of the next one new: it waited)
    nxt = np.arange(1, len(it))
    i = nxt - 1
    no_prefill = np.searchsorted(prefills, end[i]) == np.searchsorted(prefills, start[nxt])
    went_on = joins[nxt] < b[nxt]
    keep = i[no_prefill & went_on]
    # consecutive iterations of a run are not independent observations: keep at most MAX_ITERATIONS evenly
    # spaced ones per trace (the fit's weight per trace does not change; its standard errors grow honestly)
    if len(keep) > MAX_ITERATIONS:
        keep = keep[np.linspace(0, len(keep) - 1, MAX_ITERATIONS).round().astype(np.int64)]
    meas = start[keep + 1] - start[keep]
    cost = {int(bb): dec.iteration(int(bb)) for bb in np.unique(b[keep])}
    first = next(iter(cost.values()), None)
    return {
        "meas": meas,
        "batch": b[keep].astype(np.float64),
        "ctx": ctx[keep],
        "joins": joins[keep].astype(np.float64),
        "fixed0": np.array([cost[int(x)].decode_fixed_s for x in b[keep]]),
        "dequant_fixed0": np.array([cost[int(x)].dequant_fixed_s for x in b[keep]]),
        "approx_fixed0": np.array([cost[int(x)].approx_fixed_s for x in b[keep]]),
        "lm_head": np.array([dec._lm_head_s(int(x)) for x in b[keep]]),
        "decode_per_ctx": 0.0 if first is None else first.decode_per_ctx_s,
        "dequant_per_ctx": 0.0 if first is None else first.dequant_per_ctx_s,
        "approx_per_ctx": 0.0 if first is None else first.approx_per_ctx_s,
        "small_kernel_s": dec._small_kernel_s(),
        "layers": float(dec.model.layers),
        "stage_layers": dec.model.layers / dec.parallel.pipeline,
        "all": len(it),
    }


def _prefill_blocks(df: pd.DataFrame, pre) -> tuple[dict, dict | None]:
    """Per prefill batch (the requests that started together): duration and quantize step."""
    g = df.groupby("prefill_start_s", sort=True)
    first = g.head(1).sort_values("prefill_start_s")
    prompts = [tuple(int(p) for p in grp["prompt_tokens"]) for _, grp in g]
    costs = [pre.prefill(p) for p in prompts]
    hop = (pre.parallel.pipeline - 1) * np.array([pre._stage_hop_s(sum(p)) for p in prompts])
    latency0 = np.array([c.latency_s for c in costs])
    prefill = {
        "meas": (first["prefill_end_s"] - first["prefill_start_s"]).to_numpy(),
        "gpu0": latency0 - hop,
        "approx0": np.array([c.approximation_s for c in costs]),
        "hop": hop,
        "requests": np.array([len(p) for p in prompts], dtype=np.float64),
        "layers": float(pre.model.layers),
    }
    enc0 = np.array([c.encode_s for c in costs])
    quantize = None
    if pre.method.encode in ("quantize", "quantize_keys", "cast") and (enc0 > 0).all():
        quantize = {"meas": (first["quantize_end_s"] - first["prefill_end_s"]).to_numpy(), "enc0": enc0}
    return prefill, quantize


def _transfer_block(df: pd.DataFrame, pre, line_gbps: float) -> dict:
    moved = (df["transfer_end_s"] > df["transfer_start_s"]).to_numpy()
    d = df.loc[moved].sort_values("transfer_start_s", kind="stable")
    return {
        "start": d["transfer_start_s"].to_numpy(),
        "meas": (d["transfer_end_s"] - d["transfer_start_s"]).to_numpy(),
        "bytes": np.array([pre.wire_bytes(int(p)) for p in d["prompt_tokens"]]),
        "line_bytes_per_s": line_gbps * 1e9 / 8,
    }


# ---- predictions from engine parameters (as ReplicaCostModel and the Link apply them) ----------------
def predict(td: TraceData, kind: str, v: dict[str, float], wrt: tuple[str, ...] = ()):
    """Predicted seconds of every measured item of one kind at engine parameter values v (every name);
    with `wrt`, also {name: d prediction / d value} for those names (exact: the model is linear in each
    parameter on either side of its max(GPU, host) floor; the link's two by central differences)."""
    blk, m = td.blocks[kind], td.family
    fq, fd, fa = (v[f"methods.{m}.{s}"] for s in FACTOR_STEPS)
    d: dict[str, np.ndarray] = {}
    if kind == "iteration":
        serial = v["decode.host_serial_s_per_iteration"]
        ctx = blk["ctx"]
        gpu = (
            blk["fixed0"]
            + blk["layers"] * v["decode.extra_kernels_per_layer"] * blk["small_kernel_s"]
            + serial
            + fd * blk["dequant_fixed0"]
            + fa * blk["approx_fixed0"]
            + (blk["decode_per_ctx"] + fd * blk["dequant_per_ctx"] + fa * blk["approx_per_ctx"]) * ctx
        )
        issue = (
            v["decode.host_issue_s_per_iteration"]
            + blk["stage_layers"] * v["decode.host_issue_s_per_layer"]
            + blk["batch"] * v["decode.host_issue_s_per_request"]
        )
        host = np.where(issue > 0, issue + blk["lm_head"] + serial, 0.0)
        pred = np.maximum(gpu, host) + v["decode.join_s_per_request"] * blk["joins"]
        if wrt:
            g = (gpu >= host).astype(float)
            h = 1.0 - g
            one = np.ones_like(ctx)
            d = {
                "decode.host_serial_s_per_iteration": one,
                "decode.extra_kernels_per_layer": g * blk["layers"] * blk["small_kernel_s"],
                "decode.join_s_per_request": blk["joins"],
                f"methods.{m}.dequantize": g * (blk["dequant_fixed0"] + blk["dequant_per_ctx"] * ctx),
                f"methods.{m}.approximation": g * (blk["approx_fixed0"] + blk["approx_per_ctx"] * ctx),
                "decode.host_issue_s_per_iteration": h,
                "decode.host_issue_s_per_layer": h * blk["stage_layers"],
                "decode.host_issue_s_per_request": h * blk["batch"],
            }
    elif kind == "prefill":
        work = blk["gpu0"] + (fa - 1.0) * blk["approx0"]
        eff = v["prefill.prefill_efficiency"]
        gpu = work / eff + blk["hop"]
        mi = v.get(f"methods.{m}.prefill_issue_s_per_layer", 0.0)
        host = (
            v["prefill.host_issue_s_per_iteration"]
            + blk["layers"] * (v["prefill.host_issue_s_per_layer"] + mi)
            + blk["requests"] * v["prefill.host_issue_s_per_request"]
        )
        pred = np.maximum(gpu, host)
        if wrt:
            g = (gpu >= host).astype(float)
            h = 1.0 - g
            d = {
                "prefill.prefill_efficiency": -g * work / eff**2,
                f"methods.{m}.approximation": g * blk["approx0"] / eff,
                "prefill.host_issue_s_per_iteration": h,
                "prefill.host_issue_s_per_layer": h * blk["layers"],
                f"methods.{m}.prefill_issue_s_per_layer": h * blk["layers"],
                "prefill.host_issue_s_per_request": h * blk["requests"],
            }
    elif kind == "quantize":
        pred = fq * blk["enc0"]
        d = {f"methods.{m}.quantize": blk["enc0"]}
    elif kind == "transfer":

        def at(eff: float, lat: float) -> np.ndarray:
            return processor_sharing_s(blk["start"], blk["bytes"], blk["line_bytes_per_s"] * eff) + lat

        eff = v["network.efficiency"]
        pred = at(eff, v["network.latency_s"])
        if "network.efficiency" in wrt:
            h = 1e-6 * eff
            d["network.efficiency"] = (at(eff + h, 0.0) - at(eff - h, 0.0)) / (2 * h)
        d["network.latency_s"] = np.ones_like(pred)
    else:
        raise ValueError(kind)
    if not wrt:
        return pred
    zero = np.zeros_like(pred)
    return pred, {n: d.get(n, zero) for n in wrt}


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
def _depends(name: str, td: TraceData) -> list[str]:
    """The residual kinds of a trace that a parameter enters."""
    head, *rest = name.split(".")
    if head == "methods":
        if rest[0] != td.family:
            return []
        kinds = {
            "quantize": ["quantize"],
            "dequantize": ["iteration"],
            "approximation": ["iteration", "prefill"],
            "prefill_issue_s_per_layer": ["prefill"],
        }[rest[1]]
    else:
        kinds = {"decode": ["iteration"], "prefill": ["prefill"], "network": ["transfer"]}[head]
    return [k for k in kinds if k in td.blocks]


@dataclass
class FitResult:
    values: dict[str, float]  # every parameter's value for each trace: the fitted ones replace
    fitted: dict[str, float]  # the traces' own (values holds the common fitted set)
    stderr: dict[str, float]
    notes: dict[str, str]
    held: dict[str, str]  # parameter -> why it was held
    residuals: dict  # kind -> {before/after rms, mean}
    start: dict[str, float]


def _start_value(name: str, traces: list[TraceData]) -> float:
    """Where the fit starts: the traces' scenarios' value where they agree, else the neutral one."""
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
) -> np.ndarray: ...


@overload
def _weighted_residuals(
    traces: list[TraceData],
    names: list[str],
    x: np.ndarray,
    kinds: set[tuple[int, str]],
    base: list[dict[str, float]],
    jac: Literal[True],
) -> tuple[np.ndarray, np.ndarray]: ...


def _weighted_residuals(
    traces: list[TraceData],
    names: list[str],
    x: np.ndarray,
    kinds: set[tuple[int, str]],
    base: list[dict[str, float]],
    jac: bool = False,
) -> np.ndarray | tuple[np.ndarray, np.ndarray]:
    """Relative residuals of the items of `kinds` ((trace index, kind) pairs), each trace and kind weighted
    1/sqrt(its items), at the parameters `names` = x over each trace's values `base`; with jac, also the
    Jacobian (items x names)."""
    out, rows = [], []
    for idx, td in enumerate(traces):
        v = dict(base[idx])
        v.update(zip(names, x))
        for kind in KINDS:
            if (idx, kind) not in kinds:
                continue
            meas = td.blocks[kind]["meas"]
            if not len(meas):
                continue
            w = 1.0 / meas / math.sqrt(len(meas))
            if jac:
                pred, d = predict(td, kind, v, tuple(names))
                rows.append(np.column_stack([d[n] * w for n in names]))
            else:
                pred = predict(td, kind, v)
            out.append((pred - meas) * w)
    r = np.concatenate(out) if out else np.zeros(0)
    if not jac:
        return r
    return r, (np.vstack(rows) if rows else np.zeros((0, len(names))))


def _components(names: list[str], traces: list[TraceData]) -> list[list[str]]:
    """Parameters grouped so that no residual depends on two groups (connected components)."""
    touches = {n: {(i, k) for i, td in enumerate(traces) for k in _depends(n, td)} for n in names}
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
    return ".host_issue_s_" in name or name.endswith(".prefill_issue_s_per_layer")


def floor_probe(name: str, traces: list[TraceData]) -> float:
    """A host issue time at which its floor alone reaches the median measured item it bounds: a second
    place to start the fit from (a floor below every item moves nothing, so a fit started at 0 stays there)."""
    kind = "iteration" if name.startswith("decode.") else "prefill"
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
        same = sum(("prefill" in names[k]) == ("prefill" in names[i]) for k in floors)
        x1[i] = floor_probe(names[i], traces) / (2 * same)
    return [x0, np.clip(x1, lo, hi)]


def _bounds(names) -> tuple[np.ndarray, np.ndarray]:
    return (np.array([PARAMETERS[n].bounds[0] for n in names]), np.array([PARAMETERS[n].bounds[1] for n in names]))


def _least_squares(
    traces, names, start, base, kinds, warm: dict[str, float] | None = None
) -> tuple[dict[str, float], dict[str, float], set[str]]:
    """Fit `names` from each of _starts; the better optimum wins. Returns values, standard errors and the
    parameters the others determine there."""
    from scipy.optimize import least_squares

    lo, hi = _bounds(names)
    scale = np.array([max(abs(start[n]), resolution(n)) for n in names])

    def fun(x):
        return _weighted_residuals(traces, names, x, kinds, base)

    def jac(x):
        return _weighted_residuals(traces, names, x, kinds, base, jac=True)[1]

    res = min(
        (
            least_squares(
                fun,
                x,
                jac=jac,  # pyright: ignore[reportArgumentType]  (scipy: a callable, typed by its default "2-point")
                bounds=(lo, hi),
                x_scale=scale,
                method="trf",
                tr_solver="exact",
                xtol=1e-9,
                ftol=1e-9,
                gtol=1e-9,
                max_nfev=500,
            )
            for x in _starts(traces, names, start, warm)
        ),
        key=lambda r: r.cost,
    )
    se, dependent = standard_errors(res.fun, jac(res.x), names)
    return dict(zip(names, res.x.tolist())), se, dependent


def structurally_dependent(traces, names, start, base, kinds) -> set[str]:
    """The parameters whose Jacobian column the earlier ones span at each start of the fit where it is not
    zero (host floors off, and binding): e.g. a per-layer term beside a per-iteration one when every trace has
    the same layers, or extra kernels beside the loop gap. The fit holds them before it starts."""
    dependent, independent = set(), set()
    for x in _starts(traces, names, start):
        j = _weighted_residuals(traces, names, x, kinds, base, jac=True)[1]
        dep = standard_errors(np.zeros(j.shape[0]), j, names)[1]
        dependent |= dep
        independent |= {n for i, n in enumerate(names) if n not in dep and np.any(j[:, i] != 0)}
    return dependent - independent


def standard_errors(r: np.ndarray, j: np.ndarray, names: list[str]) -> tuple[dict[str, float], set[str]]:
    """s^2 (J^T J)^-1 at the optimum, s^2 = |r|^2 / (m - p), and the parameters the others determine.  A
    parameter no residual moves there (a zero column: a host floor that binds nowhere) has an infinite
    standard error; so has one whose unit-scaled column the earlier ones (in `names` order, PARAMETERS'
    order in a fit) span to 1e-9: the traces cannot tell it apart from them; the others' errors come
    from the independent columns."""
    m, p = j.shape
    s2 = float(r @ r) / max(m - p, 1)
    se = np.full(p, math.inf)
    dependent: set[str] = set()
    keep: list[int] = []
    for i in range(p):
        col = j[:, i]
        norm = float(np.linalg.norm(col))
        if norm == 0:
            continue
        u = col / norm
        if keep:
            basis = j[:, keep] / np.linalg.norm(j[:, keep], axis=0)
            coef = np.linalg.lstsq(basis, u, rcond=None)[0]
            if np.linalg.norm(u - basis @ coef) < 1e-9:
                dependent.add(names[i])
                continue
        keep.append(i)
    if keep:
        cov = np.linalg.inv(j[:, keep].T @ j[:, keep]) * s2
        se[keep] = np.sqrt(np.maximum(np.diag(cov), 0.0))
    return dict(zip(names, se.tolist())), dependent


def fit_engine(traces: list[TraceData]) -> FitResult:
    """Fit every engine parameter the traces resolve (module doc); hold the rest at the scenarios' values.
    BLAS runs single-threaded: the matrices are small, and threads only contend (with a process pool too)."""
    from threadpoolctl import threadpool_limits

    with threadpool_limits(1):
        return _fit_engine(traces)


def _fit_engine(traces: list[TraceData]) -> FitResult:
    families = sorted({td.family for td in traces})
    candidates = [n for n in PARAMETERS if not n.startswith("methods.") or n.split(".")[1] in families]
    graphs = all(td.meta.get("decode_mode") == "graphs" for td in traces)
    start = {n: _start_value(n, traces) for n in candidates}
    base = [dict(td.values0) for td in traces]
    held: dict[str, str] = {}
    kinds_of = {n: {(i, k) for i, td in enumerate(traces) for k in _depends(n, td)} for n in candidates}
    active = []
    for n in candidates:
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
        h = max(resolution(n), abs(start[n])) * 0.5
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
    fitted: dict[str, float] = {}
    stderr: dict[str, float] = {}
    notes: dict[str, str] = {}
    for group in _components(active, traces):
        kinds = set().union(*(kinds_of[n] for n in group))
        names = list(group)
        for n in sorted(structurally_dependent(traces, names, start, base, kinds), key=names.index):
            held[n] = "these traces cannot tell it apart from the other parameters (collinear Jacobian columns)"
            names.remove(n)
        warm = None
        x: dict[str, float] = {}
        se: dict[str, float] = {}
        while names:
            x, se, dependent = _least_squares(traces, names, start, base, kinds, warm)
            warm = x
            unresolved = {
                n: se[n] / max(abs(x[n]), resolution(n))
                for n in names
                if not se[n] <= 0.5 * max(abs(x[n]), resolution(n))
            }
            if not unresolved:
                break
            flat = [n for n in unresolved if math.isinf(unresolved[n])]
            for worst in flat or [max(unresolved, key=lambda k: unresolved[k])]:
                if worst in dependent:
                    held[worst] = (
                        "these traces cannot tell it apart from the other parameters (collinear Jacobian columns)"
                    )
                elif worst in flat:
                    held[worst] = "no residual moves with it at the optimum (" + _why_flat(worst) + ")"
                else:
                    held[worst] = (
                        f"not resolved by these traces: standard error {_fmt(se[worst])} against a value "
                        f"of {_fmt(x[worst])} (needs at most half of "
                        f"{_fmt(max(abs(x[worst]), resolution(worst)))})"
                    )
                names.remove(worst)
        if not names:
            continue
        for n in names:
            if PARAMETERS[n].integer:
                whole = float(round(x[n]))
                if whole == x[n]:
                    continue
                notes[n] = f"fitted {x[n]:.3f} ± {se[n]:.3f}, rounded to {whole:.0f}: a count; the rest refitted"
                rest = [k for k in names if k != n]
                base = [{**b, n: whole} for b in base]
                if rest:
                    x2, se2, _ = _least_squares(traces, rest, start, base, kinds, warm=x)
                    x.update(x2)
                    se.update(se2)
                x[n] = whole
        for n in names:
            fitted[n] = x[n]
            stderr[n] = se[n]
    values = {n: fitted.get(n, start[n]) for n in candidates}
    return FitResult(
        values=values,
        fitted=fitted,
        stderr=stderr,
        notes=notes,
        held=held,
        residuals=residual_summary(traces, fitted),
        start=start,
    )


def _why_flat(name: str) -> str:
    if name.startswith("decode.host_issue"):
        return "no iteration waits on the host at these traces' values: their engine issues each step as one graph"
    if name.startswith("prefill.host_issue") or name.endswith("prefill_issue_s_per_layer"):
        return "no prefill waits on the host"
    if name.endswith((".quantize", ".dequantize", ".approximation")):
        return "the cost model gives this method no time for the step"
    return "it does not enter these traces' predictions"


def _fmt(x: float) -> str:
    return f"{x:.3g}"


def residual_summary(traces: list[TraceData], fitted: dict[str, float]) -> dict:
    """Per residual kind: RMS and mean relative error over the traces at the scenarios' values and with
    the fitted ones (each trace weighted equally)."""
    out = {}
    for kind in KINDS:
        before, after, n = [], [], 0
        for td in traces:
            if kind not in td.blocks or not len(td.blocks[kind]["meas"]):
                continue
            meas = td.blocks[kind]["meas"]
            n += len(meas)
            before.append((predict(td, kind, td.values0) - meas) / meas)
            after.append((predict(td, kind, {**td.values0, **fitted}) - meas) / meas)
        if before:
            out[kind] = {
                "items": n,
                "traces": len(before),
                "rms_pct_before": round(100 * float(np.mean([np.sqrt(np.mean(r**2)) for r in before])), 3),
                "rms_pct_after": round(100 * float(np.mean([np.sqrt(np.mean(r**2)) for r in after])), 3),
                "mean_pct_before": round(100 * float(np.mean([np.mean(r) for r in before])), 3),
                "mean_pct_after": round(100 * float(np.mean([np.mean(r) for r in after])), 3),
            }
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
    keys = ("gpu", "decode_mode", "placement")
    parts = []
    for k in keys:
        vals = sorted({str(td.meta.get(k)) for td in traces if td.meta.get(k) is not None})
        if vals:
            parts.append(f"{k} {'/'.join(vals)}")
    return "; ".join(parts)


def engine_file(fit: FitResult, traces: list[TraceData], index: str, command: str, version: str) -> dict:
    """The engine calibration file (engine.EngineFile) for a fit: every candidate parameter with its value,
    standard error and whether it was fitted, the residuals, and where it all came from."""
    import scipy

    params = {}
    for n, v in fit.values.items():
        p = PARAMETERS[n]
        rec = {
            "value": float(v),
            "stderr": None,
            "fitted": n in fit.fitted,
            "unit": p.unit,
            "bounds": list(p.bounds),
            "note": p.meaning,
        }
        if n in fit.fitted:
            rec["stderr"] = float(fit.stderr[n])
            if n in fit.notes:
                rec["note"] += "; " + fit.notes[n]
        else:
            rec["note"] += HELD_PREFIX + fit.held.get(n, "")
        params[n] = rec
    return {
        "schema_version": SCHEMA_VERSION,
        "kind": KIND,
        "engine": engine_description(traces),
        "parameters": params,
        "fit": {
            "method": "scipy.optimize.least_squares (trf) within each parameter's bounds, on relative residuals "
            "of iteration cadences, prefill, quantize and transfer durations, each trace weighted "
            "equally per kind; standard errors s^2 (J^T J)^-1 at the optimum",
            "residuals": fit.residuals,
            "traces": len(traces),
        },
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
                    "files": td.files,
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


# ---- the index: fit, and score held out ------------------------------------------------------------
def load_index(index_csv: str | Path) -> list[TraceData]:
    """Every trace an index lists (validate.read_index), priced once."""
    from .validate import read_index

    return [
        load_trace_data(trace_path, scenario_path, name=t, scenario_label=scen)
        for t, scen, trace_path, scenario_path in read_index(index_csv)
    ]


def fit_values(fit: FitResult) -> dict[str, float]:
    """What a fit changes in a scenario: its fitted parameters (held ones stay each scenario's own)."""
    return dict(fit.fitted)


CV_KEYS = {
    "jct_mean_abs_error_pct": ("jct_mean_error_pct", np.mean),
    "jct_max_abs_error_pct": ("jct_mean_error_pct", np.max),
    "ttft_p50_mean_abs_error_pct": ("ttft_p50_error_pct", np.mean),
    "tpot_p50_mean_abs_error_pct": ("tpot_p50_error_pct", np.mean),
}
TRACE_KEYS = (
    "jct_mean_error_pct",
    "ttft_p50_error_pct",
    "tpot_p50_error_pct",
    "prefill_mean_error_pct",
    "quantize_mean_error_pct",
    "transfer_mean_error_pct",
    "decode_mean_error_pct",
    "iteration_mean_error_pct",
)
SCHEMES = ("in_sample", "held_out", "held_out_configuration")


def _score(td: TraceData, trace_path: Path, scenario_path: Path, values: dict[str, float]) -> dict:
    from .validate import validate

    v = validate(trace_path, scenario_path, engine_values=values)
    out = {k: v.get(k) for k in TRACE_KEYS}
    out["dequantize_share_pct"] = v.get("dequantize_share_pct")
    return out


def summarise(per_trace: list[dict], scheme: str) -> dict:
    out = {}
    for key, (col, fn) in CV_KEYS.items():
        vals = [abs(r[scheme][col]) for r in per_trace if r[scheme].get(col) is not None]
        out[key] = round(float(fn(vals)), 3) if vals else None
    within = [
        abs(r[scheme]["jct_mean_error_pct"]) <= 10.0
        for r in per_trace
        if r[scheme].get("jct_mean_error_pct") is not None
    ]
    out["traces_jct_within_10pct"] = int(sum(within))
    return out


def cross_validate(index_csv: str | Path, workers: int = 1) -> dict:
    """In-sample (one fit on every trace), held out (each trace predicted by a fit without it) and held out
    by configuration (each scenario's traces predicted by a fit without any of them): per trace the
    errors of each, and their means (module doc).  `workers` > 1 fits the folds in processes."""
    from .validate import read_index

    rows = read_index(index_csv)
    traces = load_index(index_csv)
    folds: list[tuple[str, tuple[int, ...]]] = [("in_sample", ())]
    folds += [("held_out", (i,)) for i in range(len(traces))]
    configs = sorted({td.configuration for td in traces})
    if len(configs) > 1:
        folds += [
            ("held_out_configuration", tuple(i for i, td in enumerate(traces) if td.configuration == c))
            for c in configs
        ]
    fits = _map(_fit_without, [(traces, out) for _, out in folds], workers)
    per_trace: list[dict[str, Any]] = [
        {"trace": td.name, "scenario": td.scenario, "configuration": td.configuration, "method": td.method}
        for td in traces
    ]
    jobs, where = [], []
    for (scheme, out), values in zip(folds, fits):
        for i in out if out else range(len(traces)):
            jobs.append((traces[i], rows[i][2], rows[i][3], values))
            where.append((i, scheme))
    scores = _map(_score_job, jobs, workers)
    for (i, scheme), sc in zip(where, scores):
        per_trace[i][scheme] = sc
    for r in per_trace:
        for scheme in SCHEMES:
            r.setdefault(scheme, {})
    result = {"traces": len(traces), "index": str(index_csv)}
    for scheme in SCHEMES:
        if any(r[scheme] for r in per_trace):
            result[scheme] = summarise(per_trace, scheme)
    result["per_trace"] = per_trace
    result["dequantize_share"] = dequantize_shares(traces, rows, per_trace)
    result["in_sample_fit"] = {n: {"value": v} for n, v in fits[0].items()}
    return result


def measured_dequantize_share_pct(trace: Path, reference: Path) -> float:
    """Dequantization's share of the mean JCT in a measured trace of a method that dequantizes every
    iteration (KVQuant), from the trace and a reference trace of the FP16 baseline over the same requests
    (same configuration, rate and seed): a least-squares line of each trace's iteration durations
    (end - start) in batch size and total context, the method's minus the baseline's at each of the
    method's iterations is its dequantization (its attention runs the same FP16 kernel on the dequantized
    cache; the line difference also holds its 2-bit append against the FP16 one); each request in the
    batch waits for it, as the simulator counts it."""
    from .validate import load_trace

    def line(it: pd.DataFrame) -> np.ndarray:
        x = np.column_stack([np.ones(len(it)), it["batch_size"], it["context_tokens"]])
        return np.linalg.lstsq(x, (it["end_s"] - it["start_s"]).to_numpy(), rcond=None)[0]

    df, it, _, _ = load_trace(trace)
    _, it_ref, _, _ = load_trace(reference)
    if it is None or it_ref is None:
        raise ScenarioError(
            f"{trace if it is None else reference}: no iterations.csv (the dequantization share needs its iterations)"
        )
    x = np.column_stack([np.ones(len(it)), it["batch_size"], it["context_tokens"]])
    extra_s = x @ (line(it) - line(it_ref))
    waited_s = float(np.sum(it["batch_size"].to_numpy() * extra_s))
    return 100.0 * waited_s / float((df["finish_s"] - df["arrival_s"]).sum())


def dequantize_shares(traces: list[TraceData], rows: list, per_trace: list[dict]) -> list[dict]:
    """For each trace of a method that dequantizes every iteration, recorded with GPU-bound iterations (decode
    as CUDA graphs, meta.json decode_mode) and with a baseline twin (same scenario, rate and seed) in the
    index: the measured share of JCT in dequantization and the predicted ones."""
    out = []
    for i, td in enumerate(traces):
        if (
            "iteration" not in td.blocks
            or not td.blocks["iteration"]["dequant_per_ctx"] > 0
            or td.meta.get("decode_mode") != "graphs"
        ):
            continue  # no per-iteration dequantization; or host-bound iterations (eager) hide its GPU time
        twin = next(
            (
                j
                for j, o in enumerate(traces)
                if o.family == REFERENCE
                and "iteration" in o.blocks  # a twin without iterations has no line to subtract
                and o.scenario == td.scenario
                and o.meta.get("rate_rps") == td.meta.get("rate_rps")
                and o.meta.get("seed") == td.meta.get("seed")
            ),
            None,
        )
        if twin is None:
            continue
        measured = measured_dequantize_share_pct(rows[i][2], rows[twin][2])
        entry = {"trace": td.name, "reference": traces[twin].name, "measured_pct": round(measured, 3)}
        for scheme in SCHEMES:
            pred = per_trace[i].get(scheme, {}).get("dequantize_share_pct")
            if pred is not None:
                entry[f"{scheme}_pct"] = round(pred, 3)
                entry[f"{scheme}_error_pp"] = round(pred - measured, 3)
        out.append(entry)
    return out


def _fit_without(args) -> dict[str, float]:
    traces, out = args
    return fit_values(fit_engine([td for i, td in enumerate(traces) if i not in out]))


def _score_job(args) -> dict:
    return _score(*args)


def _map(fn, items: list, workers: int) -> list:
    """fn over items, in `workers` processes when > 1 (each fit single-threaded in its BLAS)."""
    if workers <= 1 or len(items) < 2:
        return [fn(x) for x in items]
    from concurrent.futures import ProcessPoolExecutor

    with ProcessPoolExecutor(max_workers=workers) as pool:
        return list(pool.map(fn, items))


# ---- for people ------------------------------------------------------------------------------------
def format_fit(doc: dict) -> str:
    """The engine calibration file for people: the fitted parameters with standard errors, the residuals
    before and after, and each held parameter with the reason."""
    from reports.terminal import render, table

    params = doc["parameters"]
    fitted = [[n, f"{r['value']:.4g}", f"{r['stderr']:.2g}", r["unit"]] for n, r in params.items() if r["fitted"]]
    res = [
        [
            k,
            str(v["items"]),
            f"{v['rms_pct_before']:.1f}%",
            f"{v['rms_pct_after']:.1f}%",
            f"{v['mean_pct_before']:+.1f}%",
            f"{v['mean_pct_after']:+.1f}%",
        ]
        for k, v in doc["fit"]["residuals"].items()
    ]
    held = [
        f"  {n} = {r['value']:.4g}: {r['note'].split(HELD_PREFIX)[-1]}" for n, r in params.items() if not r["fitted"]
    ]
    return "\n".join(
        [
            render(
                table(
                    ["parameter", "value", "std err", "unit"],
                    fitted,
                    title=f"engine calibration fitted to {doc['fit']['traces']} traces",
                )
            ),
            render(table(["residual", "items", "rms before", "rms after", "mean before", "mean after"], res)),
            "held at the scenarios' values:",
            *held,
        ]
    )


def format_cv(result: dict) -> str:
    """Per trace: JCT mean error in-sample, held out (leave one trace out) and held out by configuration;
    then the means the issue's goals are stated in."""
    from reports.terminal import render, table

    def pct(x):
        return "n/a" if x is None else f"{x:+.1f}%"

    schemes = [s for s in SCHEMES if s in result]
    heads = {"in_sample": "in-sample", "held_out": "held out (trace)", "held_out_configuration": "held out (config)"}
    body = []
    for r in result["per_trace"]:
        body.append(
            [
                r["trace"],
                *(pct(r[s].get("jct_mean_error_pct")) for s in schemes),
                pct(r["held_out"].get("tpot_p50_error_pct")),
                pct(r["held_out"].get("ttft_p50_error_pct")),
            ]
        )
    foot = []
    for key, label in (
        ("jct_mean_abs_error_pct", "mean |JCT error|"),
        ("jct_max_abs_error_pct", "max |JCT error|"),
        ("tpot_p50_mean_abs_error_pct", "mean |TPOT p50 error|"),
        ("ttft_p50_mean_abs_error_pct", "mean |TTFT p50 error|"),
    ):
        foot.append([label, *(pct(result[s].get(key)) for s in schemes), "", ""])
    foot.append(
        ["traces within 10 %", *(f"{result[s]['traces_jct_within_10pct']}/{result['traces']}" for s in schemes), "", ""]
    )
    return render(
        table(
            ["trace", *(f"JCT {heads[s]}" for s in schemes), "TPOT p50 held out", "TTFT p50 held out"],
            body,
            footer_rows=foot,
            title=f"cross-validated engine calibration, {result['traces']} traces",
        )
    )
