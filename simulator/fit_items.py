"""The measured items an engine fit compares with the cost model: each trace read and its batches priced once.

`load_trace_data(trace, scenario)` reads a measured run and the scenario that describes it and returns a
`TraceData`: per residual kind (simulator/calibrate.py) the measured seconds of every item and what the cost model
needs to price it at any engine parameters, priced once at neutral ones.

**Realrun traces** (requests.csv, iterations.csv, meta.json: README "Trace format") give every kind:

* ``iteration``: every decode iteration's cadence, start to the next one's start, where no prefill ran between them
  and the batch did not empty, at the measured batch size and total context, with the requests joining it;
* ``prefill``: every prefill batch (the requests that started together), start to end;
* ``quantize``: its quantize step, prefill end to quantize end (methods that quantize after prefill);
* ``transfer``: every transfer, start to end, replayed on one fair-shared link from the measured starts;
* ``handoff`` (placement shared_gpu): what a pass of the loop through a prefill costs the CPU beyond a plain pass
  (the iteration's end to the prefill's start plus its quantize's end to the next iteration's start, less the
  loop's plain gap): the prefill batch's serial time, one item per trace (`_handoff_block`); with placement
  separate and one prefill replica, from a batch's quantize end to the next batch's start where that one was
  waiting (`_backlog_block`).

Each iteration item also says whether a transfer was in flight at its start (``busy``: where the host shares its
process with the link's endpoint its host terms then take network.link_busy_host_factor), and each prefill and
quantize item for how many seconds from its start (``busy_left_s``: until the transfers in flight then have ended).

**Engine benchmark files** (simulator/engine_logs.py: vLLM, SGLang, AIPerf) give per-request timings only: no
phase timestamps, no iteration log. Where the file has the times the client sent each request, the run's
timeline is rebuilt from them (`Timeline`): request r streams its first token at send + TTFT and its k-th at that
plus its first k − 1 gaps (or evenly spaced at its TPOT where its chunks are not one per token); it is in the
decode batch from joining it to its last token. It joins at its first token where that comes out of the decode
iteration it joins (ttft_at decode, colocated); where the first token comes out of the prefill (ttft_at prefill)
it may wait for a transfer or KV room first, so it joins one gap before its second token (`joined_at`). Then

* ``iteration`` items are its inter-token latencies: the k-th gap is one decode iteration of the batch in decode
  at the gap's midpoint at its total context (each one's prompt plus the tokens it has streamed), joined by the
  requests that joined in the gap (ttft_at prefill: the first gap, which holds the wait to join, is left out); where
  prefill runs on the decode GPUs (placement shared_gpu or colocated), only gaps during which no request was in
  prefill (between its send and its first token) count, as in a realrun trace. A request whose chunks are not one
  per token gives one item instead: its TPOT, (latency − TTFT) / (output − 1), against the iteration priced at
  the batch and context averaged over its decode;
* ``prefill`` items are the first-token times of requests that found the engine idle (from their send to their
  first token no other request was in flight): a one-request prefill, plus (``ttft_at: decode``) the rest of the
  way to the first token priced at the scenario's values (quantize, the transfer at line rate, the first decode
  iteration). Client-side time (HTTP, tokenization) is not modelled apart and lands in the prefill host floor.
  A benchmark file has no transfer times: its items are all priced at the idle host level.

What cannot be rebuilt is left out, and `TraceData.notes` says so: without send times the batch each token was
decoded in is unknown, and the file gives no item (its requests still validate: simulator/validate.py); with
placement colocated, prefill runs as chunks of decode iterations priced with the decode pool's settings, so the
prefill items are left out (the prefill pool's parameters do not apply there: simulator/engine.py).
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
import pandas as pd

from .decode import clock_share, transient_amplitude_s
from .domain import setting_of
from .engine import PARAMETERS, apply_values, priced, stored_value
from .engine_logs import RequestLog
from .measured import Measured, load_measured
from .resolve import link_busy_gbps, link_busy_prefill_factors, network_bandwidth_gbps, resolve

MAX_ITERATIONS = 200  # decode items per trace in the fit, evenly spaced (consecutive ones are not independent)
TPOT_SAMPLES = 16  # times in a request's decode its TPOT item averages the batch and context over


@dataclass
class TraceData:
    """A measured run with its items priced by the cost model at neutral engine parameters."""

    name: str
    scenario: str
    configuration: str
    method: str  # the method's name in the scenario (its label, if any)
    family: str  # its registry name: whose implementation factors apply
    values0: dict[str, float]  # the scenario's own value of every engine parameter
    blocks: dict[str, dict] = field(default_factory=dict)  # kind -> arrays (see _iteration_block, ...)
    files: dict[str, str] = field(default_factory=dict)  # file name -> sha256
    meta: dict = field(default_factory=dict)
    source: str = "realrun"  # or the benchmark format (simulator/engine_logs.py)
    placement: str = "separate"
    notes: list[str] = field(default_factory=list)  # what the run lacks, and what it gives the fit instead
    link_gbps: float = 0.0  # the link's line rate: the busy host factor grows with it (network.link_busy_host_factor)
    machine: str | None = None  # the machine (host) it was recorded on: the index's column machine
    host_factor: float = 1.0  # the fit's factor on its machine's host time terms (calibrate, machines)
    # the run executed the kernels its pools' measured profiles priced (ran_profiled_kernels): its method factors'
    # priors are engine.PROFILED_FACTOR_PRIOR_WIDTH wide (calibrate.prior_widths)
    kernels_profiled: bool = False
    # what the fit's parameters are the slopes of: GPU, placement, model, method, link rate, prefill batch, lengths
    # (simulator/domain.py): the calibration's domain is its runs' union
    setting: dict = field(default_factory=dict)


# how realrun records its command in meta.json (realrun/runner.py environment: the CLI, or a library call)
REALRUN_COMMANDS = ("python -m realrun", "realrun.runner.")


def ran_profiled_kernels(source: str, meta: dict, profiles) -> bool:
    """Whether a run executed the kernels its pools' profiles priced: recorded by realrun (its meta's command; realrun
    runs kernels_calibration/kernels as they are) on the GPU every pool's profile was measured on (the meta's gpu is
    the measured profile's provenance gpu_name). A trace in realrun's format from another pipeline, one without that
    provenance, or one priced with a derived or roofline profile is not."""
    if source != "realrun" or not str(meta.get("command", "")).startswith(REALRUN_COMMANDS):
        return False
    gpu = meta.get("gpu")
    return bool(gpu) and all(p.source == "measured" and p.provenance.get("gpu_name") == gpu for p in profiles)


def scenario_values(s) -> dict[str, float]:
    """Every engine parameter's value in the scenario, as it prices it (a host time term times
    calibration.host_speed_factor: engine.priced; apply_values takes such values back)."""
    s = priced(s)
    out = {}
    for name in PARAMETERS:
        if name.startswith("network.link_busy_prefill_host_factor"):
            a, b = link_busy_prefill_factors(s.network)  # the general factor's where not given
            out[name] = b if name.endswith("_per_gbps") else a
        else:
            out[name] = stored_value(s, name)
    return out


def neutral(s):
    """The scenario with every engine parameter at the value that adds nothing."""
    return apply_values(s, {k: p.neutral for k, p in PARAMETERS.items()})


def load_trace_data(
    trace: str | Path,
    scenario_path: str | Path,
    name: str | None = None,
    scenario_label: str | None = None,
    method: str | None = None,
    configuration: str | None = None,
) -> TraceData:
    """A realrun trace (folder or requests.csv) or an engine benchmark file, priced against the scenario."""
    m = load_measured(trace, scenario_path, method=method)
    return trace_data(m, scenario_path, name or str(trace), scenario_label, configuration)


def trace_data(
    m: Measured,
    scenario_path: str | Path,
    name: str,
    scenario_label: str | None = None,
    configuration: str | None = None,
) -> TraceData:
    """A measured run already read (measured.load_measured) priced against its scenario: load_trace_data for a
    caller that holds the run (validate)."""
    s, cfg = m.scenario, m.config
    res = resolve(neutral(s), str(scenario_path))
    pre, dec = res.costs(cfg)
    td = TraceData(
        name=name,
        scenario=scenario_label or str(scenario_path),
        configuration=configuration or Path(str(scenario_label or scenario_path)).stem,
        method=cfg.output_name,
        family=cfg.name,
        values0=scenario_values(s),
        meta={k: m.meta[k] for k in sorted(m.meta) if k != "notes"},
        source=m.source,
        placement=s.placement,
        notes=list(m.notes),
    )
    td.kernels_profiled = ran_profiled_kernels(m.source, m.meta, (pre.profile, dec.profile))
    td.setting = setting_of(s, m.requests["prompt_tokens"], m.requests["output_tokens"], [cfg.name])
    rate = link_busy_gbps(s)  # the busy factor's growth multiplies it (by chunk where measured at another)
    td.link_gbps = rate if math.isfinite(rate) else 0.0
    for f in m.files:
        td.files[f.name] = hashlib.sha256(f.read_bytes()).hexdigest()
    if m.log is not None:
        _log_blocks(td, m.log, s, pre, dec, resolve(s, str(scenario_path)).costs(cfg))
        return td
    df, iterations = m.requests, m.iterations
    if iterations is not None and len(iterations):
        from_decode = s.ttft_at == "decode" and s.placement != "colocated"  # as the simulator's join context
        td.blocks["iteration"] = _iteration_block(df, iterations, dec, 0 if from_decode else 1)
        if s.placement == "shared_gpu":  # per unit of decode.after_prefill_slowdown_fraction (calibrate.predict)
            blk = td.blocks["iteration"]
            blk["after_prefill_unit_s"] = after_prefill_s(
                df,
                iterations,
                blk["start"],
                1.0,
                s.decode.after_prefill_decay_per_iteration,
                s.decode.after_prefill_saturation_s,
            )
            if s.decode.after_prefill_clock_fraction:  # the GPU's part runs this much slower (calibrate.predict)
                blk["clock_slowdown"] = clock_slowdown(
                    df,
                    blk["start"],
                    s.decode.after_prefill_clock_fraction,
                    s.decode.after_prefill_clock_time_constant_s,
                )
        if s.placement == "shared_gpu":
            td.blocks["handoff"] = _handoff_block(df, iterations)
    if s.placement == "separate" and s.prefill.replicas == 1:
        backlog = _backlog_block(df)
        if backlog["count"]:
            td.blocks["handoff"] = backlog
    td.blocks["prefill"], quantize = _prefill_blocks(df, pre, m.seen_before is not None)
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
        td.blocks["transfer"] = _transfer_block(df, pre, network_bandwidth_gbps(s), s.network.round_robin_chunk_bytes)
    return td


# ---- realrun traces ------------------------------------------------------------------------------------
def iteration_features(
    dec,
    batch: np.ndarray,
    ctx: np.ndarray,
    joins: np.ndarray,
    meas: np.ndarray,
    busy: np.ndarray | None = None,
    leaves: np.ndarray | None = None,
) -> dict:
    """What the cost model needs to price decode items at any engine parameters (calibrate.predict): per item
    its batch, total context, joining requests and requests that left in the iteration before (none where not
    given: a benchmark file's token times do not place a finish in an iteration), and the iteration's parts at
    neutral parameters. `batch` may be a (items, samples) array: each item is then the mean of its samples'
    iterations (a TPOT item)."""
    b2 = np.atleast_2d(batch.T).T if batch.ndim == 1 else batch  # (items, samples)
    cost = {int(bb): dec.iteration(int(bb)) for bb in np.unique(b2)}
    first = next(iter(cost.values()), None)

    def mean_of(f) -> np.ndarray:
        table = {k: f(k, c) for k, c in cost.items()}
        return np.array([[table[int(x)] for x in row] for row in b2]).mean(axis=1) if len(b2) else np.zeros(0)

    return {
        "meas": meas,
        "batch": b2.mean(axis=1).astype(np.float64) if len(b2) else np.zeros(0),
        "ctx": ctx.astype(np.float64),
        "joins": joins.astype(np.float64),
        "leaves": np.zeros(len(meas)) if leaves is None else leaves.astype(np.float64),
        "busy": np.zeros(len(meas)) if busy is None else busy.astype(np.float64),  # 1: a transfer in flight
        "fixed0": mean_of(lambda k, c: c.decode_fixed_s),
        "dequant_fixed0": mean_of(lambda k, c: c.dequant_fixed_s),
        "approx_fixed0": mean_of(lambda k, c: c.approx_fixed_s),
        "lm_head": mean_of(lambda k, c: dec._lm_head_s(k)),
        "decode_per_ctx": 0.0 if first is None else first.decode_per_ctx_s,
        "dequant_per_ctx": 0.0 if first is None else first.dequant_per_ctx_s,
        "approx_per_ctx": 0.0 if first is None else first.approx_per_ctx_s,
        "small_kernel_s": dec._small_kernel_s(in_graph=dec.decode_graphs),  # as ReplicaCostModel._iteration prices them
        "layers": float(dec.model.layers),
        "stage_layers": dec.model.layers / dec.parallel.pipeline,
    }


def longest_context(df: pd.DataFrame, start: np.ndarray, k: np.ndarray, join_extra_tokens: int = 1) -> np.ndarray:
    """Per iteration the longest context in its batch: a request is in iterations k (the one it joins) to the last
    one starting before its finish, its context at iteration i its prompt + join_extra_tokens + (i - k), as the
    iteration rows count it (realrun: the tokens stored before the step and the new one)."""
    last = np.searchsorted(start, df["finish_s"].to_numpy() - CSV_EPS_S, "left")
    offset = np.full(len(start), -np.inf)
    for a, z, off in zip(k, last, df["prompt_tokens"].to_numpy() + join_extra_tokens - k):
        if 0 <= a < z:
            np.maximum(offset[a:z], off, out=offset[a:z])
    return np.where(np.isfinite(offset), offset + np.arange(len(start)), 0.0)


def priced_contexts(
    df: pd.DataFrame, start: np.ndarray, batch: np.ndarray, ctx: np.ndarray, dec, k=None, join_extra_tokens: int = 1
) -> np.ndarray:
    """The iterations' contexts as the decode replica prices them: with the attention's grid sized by the longest
    context (ReplicaCostModel.priced_context), its share of the padding to it too; else the totals as they are. `k`:
    the iteration each request joins (_joins), where the caller has it."""
    if not dec.attention_padding_share:
        return ctx
    if k is None:
        k = _joins(df, start)[1]
    return dec.priced_context(ctx, batch, longest_context(df, start, k, join_extra_tokens))


def _iteration_block(df: pd.DataFrame, it: pd.DataFrame, dec, join_extra_tokens: int = 1) -> dict:
    start, end = it["start_s"].to_numpy(), it["end_s"].to_numpy()
    b = it["batch_size"].to_numpy().astype(np.int64)
    ctx = it["context_tokens"].to_numpy().astype(np.float64)
    joins, k = _joins(df, start)
    priced = priced_contexts(df, start, b, ctx, dec, k, join_extra_tokens)
    place = np.zeros(len(it))  # the engine's KV copies (decode.kv_placement_gb_per_s), GPU seconds, as the replica's
    joined_ctx = np.zeros(len(it))  # the joiners' context in their first iteration (the simulator's join_context)
    if dec.kv_placement_bytes_per_s > 0:
        first = df["prompt_tokens"].to_numpy() + join_extra_tokens
        np.add.at(place, np.clip(k, 0, len(it) - 1), [dec.placement_s(int(p)) for p in first])
        np.add.at(joined_ctx, np.clip(k, 0, len(it) - 1), first)
    # a request that finished in iteration j leaves work to j + 1 where requests stayed (decode.leave_s_per_request):
    # j is the last iteration starting before its finish (a simulated trace's finish is its row's end plus the
    # CPU's gap)
    leaves = np.zeros(len(it), dtype=np.int64)
    j = np.searchsorted(start, df["finish_s"].to_numpy() - CSV_EPS_S, "left")  # = j + 1
    np.add.at(leaves, j[(j > 0) & (j < len(it))], 1)
    leaves[joins >= b] = 0  # every request of it new: the batch had emptied
    if dec.kv_placement_bytes_per_s > 0:  # after leavers, the expected moves (simulator/decode.py, _moves_s): of
        # the requests that stayed, at their mean context in this iteration
        for i in np.flatnonzero(leaves):
            stay = b[i] - joins[i]
            place[i] += leaves[i] * stay / (stay + leaves[i]) * dec.placement_s((ctx[i] - joined_ctx[i]) / stay)
    # the cadence of iteration i, to the next one's start, where the engine went straight on
    keep = _evenly(np.flatnonzero(_straight_on(df, start, end, joins, b)))
    busy = link_busy_at(df, start[keep])
    blk = iteration_features(dec, b[keep], priced[keep], joins[keep], start[keep + 1] - start[keep], busy, leaves[keep])
    blk["place_s"] = place[keep]
    blk["all"] = len(it)
    blk["start"] = start[keep]
    return blk


# times written to a CSV and read back: an iteration starting as a prefill ends (or a request finishes) may read as
# a hair before it
CSV_EPS_S = 1e-9


def _joins(df: pd.DataFrame, starts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per iteration the requests joining it, and per request the iteration it joins (decode_start_s = the joining
    iteration's start)."""
    joins = np.zeros(len(starts), dtype=np.int64)
    k = np.searchsorted(starts, df["decode_start_s"].to_numpy())
    np.add.at(joins, np.clip(k, 0, len(starts) - 1), 1)
    return joins, k


def _straight_on(
    df: pd.DataFrame, starts: np.ndarray, ends: np.ndarray, joins: np.ndarray, b: np.ndarray
) -> np.ndarray:
    """For iterations 0..n-2, whether the engine went straight on to the next one: no prefill started between them
    and the batch did not empty (every request of the next one new: it waited)."""
    prefills = np.sort(df["prefill_start_s"].to_numpy())
    nxt = np.arange(1, len(starts))
    no_prefill = np.searchsorted(prefills, ends[nxt - 1]) == np.searchsorted(prefills, starts[nxt])
    return no_prefill & (joins[nxt] < b[nxt])


def _batch_rows(df: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    """The prefill batches (the requests that started together) as df.groupby("prefill_start_s") gives them, without
    its per-group frames: the rows by start, stably (a batch's rows in the trace's order; no start: in none), and
    where each batch begins among them."""
    starts = df["prefill_start_s"].to_numpy(np.float64)
    rows = np.flatnonzero(~np.isnan(starts))
    rows = rows[np.argsort(starts[rows], kind="stable")]
    heads = np.flatnonzero(np.diff(starts[rows], prepend=np.nan) != 0)
    return rows, heads


def _prefill_batches(df: pd.DataFrame) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per prefill batch (the requests that started together), in order: its start, its quantize's end and its last
    request's arrival."""
    rows, heads = _batch_rows(df)
    first = rows[heads]
    arrival = df["arrival_s"].to_numpy(np.float64)[rows]
    return (
        df["prefill_start_s"].to_numpy(np.float64)[first],
        df["quantize_end_s"].to_numpy(np.float64)[first],
        np.fmax.reduceat(arrival, heads),
    )


def _handoff_block(df: pd.DataFrame, it: pd.DataFrame) -> dict:
    """Placement shared_gpu: what a pass of the loop through a prefill costs the CPU beyond a plain pass, the prefill
    batch's serial time (prefill.host_serial_s_per_iteration, simulator/prefill.py). A pass the loop went straight
    through: from a decode iteration's end to the prefill's start, plus from its quantize's end to the next
    iteration's start, less the run's mean gap between two iterations with nothing between them (the loop's own
    gap, in the simulator decode.host_serial_s_per_iteration with the issue before the launch, which a row holds).
    Only where the request had arrived by the iteration's end (the loop did not wait for it), and where the next
    iteration kept a request of the one before (it did not wait for a join); the gap subtracted is the mean of the
    gaps at the link's level at the iteration's start (a transfer in flight slows the CPU). One item, the mean: a
    CPU's time of a millisecond spreads by tens of % from one pass to the next, and a least squares of relative
    errors would pull toward the short ones; what a run's timeline sums is the mean (its price is linear in the
    levels, so `busy_step`, the share of the passes that start while a transfer is in flight, prices it exactly)."""
    starts, ends = it["start_s"].to_numpy(np.float64), it["end_s"].to_numpy(np.float64)
    b = it["batch_size"].to_numpy()
    joins, _ = _joins(df, starts)
    ps, qe, arrived = _prefill_batches(df)
    # the plain gaps: no prefill between the two iterations, the batch went on
    j = np.flatnonzero(_straight_on(df, starts, ends, joins, b))
    gap_level = link_busy_at(df, starts[j])
    gaps = starts[j + 1] - ends[j]
    i = np.searchsorted(ends, ps + CSV_EPS_S, "right") - 1  # the last iteration ended by the prefill's start
    nxt = i + 1
    ok = (i >= 0) & (nxt < len(it)) & np.isfinite(qe)
    ok[ok] &= (arrived[ok] <= ends[i[ok]] + CSV_EPS_S) & (starts[nxt[ok]] >= qe[ok] - CSV_EPS_S)
    # one prefill between them, and the next iteration went on with the batch
    later = np.searchsorted(ps, starts[np.minimum(nxt, len(it) - 1)] - CSV_EPS_S, "left")
    ok &= later == np.arange(len(ps)) + 1
    ok[ok] &= joins[nxt[ok]] < b[nxt[ok]]
    i, ps, qe, nxt = i[ok], ps[ok], qe[ok], nxt[ok]
    if not (len(i) and len(gaps)):
        return {"meas": np.zeros(0), "busy_step": np.zeros(0), "count": 0}
    level = link_busy_at(df, starts[i])
    mean_gap = {x: float(gaps[gap_level == x].mean()) if (gap_level == x).any() else float(gaps.mean()) for x in (0, 1)}
    plain_s = np.where(level > 0, mean_gap[1], mean_gap[0])
    return {
        "meas": np.array([np.mean((ps - ends[i]) + (starts[nxt] - qe) - plain_s)]),
        "busy_step": np.array([link_busy_at(df, ps).mean()]),
        "count": len(i),
    }


def _backlog_block(df: pd.DataFrame) -> dict:
    """Placement separate, one prefill replica: the prefill batch's serial time where the next batch was waiting, from
    a batch's quantize end to the next one's start (prefill.host_serial_s_per_iteration, at the level of the batch's
    start); one item, the mean (as `_handoff_block`). A batch that starts as a transfer ends (within 1 us) is left
    out: the parked-KV budget may have held it back."""
    ps, qe, arrived = _prefill_batches(df)
    waiting = (arrived[1:] <= qe[:-1] + CSV_EPS_S) & np.isfinite(qe[:-1])  # the next batch was there: no idle wait
    # ... and not held back by the parked-KV budget, which a transfer's end releases
    ends = np.sort(df["transfer_end_s"].to_numpy(np.float64))
    at = np.searchsorted(ends, ps[1:] - 1e-6)
    released = (at < len(ends)) & (np.abs(ends[np.minimum(at, len(ends) - 1)] - ps[1:]) <= 1e-6)
    waiting &= ~released
    if not waiting.any():
        return {"meas": np.zeros(0), "busy_step": np.zeros(0), "count": 0}
    return {
        "meas": np.array([np.mean((ps[1:] - qe[:-1])[waiting])]),
        "busy_step": np.array([link_busy_at(df, ps[:-1][waiting]).mean()]),
        "count": int(waiting.sum()),
    }


def _prefills_on_gpu(df: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    """Each prefill's end on the shared GPU (its quantize's end) and its seconds there (from its start), in the
    requests' order, those not prefilled left out."""
    pre_end = df["quantize_end_s"].to_numpy(np.float64)
    held = pre_end - df["prefill_start_s"].to_numpy(np.float64)
    ok = np.isfinite(held)
    return pre_end[ok], held[ok]


def after_prefill_s(
    df: pd.DataFrame, it: pd.DataFrame, t: np.ndarray, fraction: float, decay: float, saturation_s: float = 0.0
) -> np.ndarray:
    """The after-prefill time of the iterations starting at t (decode.after_prefill_slowdown_fraction, placement
    shared_gpu): after the last prefill that ended before t[i], of P seconds on the GPU (its start to its quantize's
    end), with j iterations started between its end and t[i], fraction x A(P) x (1 - decay) x decay^j, A the
    prefill's seconds saturating at saturation_s (transient_amplitude_s; a later prefill restarts it, as
    simulator/decode.py does)."""
    pre_end, held = _prefills_on_gpu(df)
    held = np.array([transient_amplitude_s(float(p), saturation_s) for p in held])
    order = np.argsort(pre_end, kind="stable")
    pre_end, held = pre_end[order], held[order]
    out = np.zeros(len(t))
    eps = CSV_EPS_S
    last = np.searchsorted(pre_end, t + eps, "right") - 1  # the last prefill ended at or before t[i]
    has = last >= 0
    starts = it["start_s"].to_numpy(np.float64)
    j = np.searchsorted(starts, t[has] - eps, "left") - np.searchsorted(starts, pre_end[last[has]] - eps, "left")
    out[has] = fraction * held[last[has]] * (1.0 - decay) * decay ** np.maximum(j, 0)
    return out


def clock_slowdown(df: pd.DataFrame, t: np.ndarray, fraction: float, tau_s: float) -> np.ndarray:
    """The clock slowdown at times t (decode.after_prefill_clock_fraction, placement shared_gpu): over the prefills
    that ended at or before t[i], each of P seconds on the GPU (its start to its quantize's end), fraction x
    (1 - exp(-P / tau)) x exp(-(t[i] - its end) / tau) (clock_share), as simulator/decode.py counts it."""
    pre_end, held = _prefills_on_gpu(df)
    share = np.array([clock_share(float(p), tau_s) for p in held])
    dt = t[:, None] - pre_end[None, :]
    w = np.where(dt >= -CSV_EPS_S, np.exp(-np.maximum(dt, 0.0) / tau_s), 0.0)
    return fraction * (w @ share)


def link_busy_at(df: pd.DataFrame, t: np.ndarray) -> np.ndarray:
    """1 where a transfer was in flight at time t[i] (started at or before it, not yet ended), else 0: the host
    terms' level where the host shares its process with the link's endpoint (network.link_busy_host_factor)."""
    return (link_busy_left(df, t) > 0).astype(np.float64)


def link_busy_left(df: pd.DataFrame, t: np.ndarray) -> np.ndarray:
    """Seconds from t[i] until every transfer in flight at t[i] has ended (0 where none is): a prefill or quantize
    step runs at the busy host level that long and at the idle one after (simulator/prefill.py, `_busy_part`; no
    transfer starts during a step where the host shares its process with the link endpoint: realrun)."""
    moved = (df["transfer_end_s"] > df["transfer_start_s"]).to_numpy()
    starts = df["transfer_start_s"].to_numpy()[moved]
    ends = df["transfer_end_s"].to_numpy()[moved]
    order = np.argsort(starts, kind="stable")
    starts, ends = starts[order], ends[order]
    last_end = np.maximum.accumulate(ends) if len(ends) else ends  # of the transfers started so far
    k = np.searchsorted(starts, t, "right")  # transfers started at or before t[i]
    out = np.zeros(len(t))
    has = k > 0
    out[has] = np.maximum(last_end[k[has] - 1] - t[has], 0.0)
    return out


def _evenly(keep: np.ndarray) -> np.ndarray:
    """At most MAX_ITERATIONS of the items, evenly spaced: consecutive iterations of a run are not independent
    observations (the fit's weight per trace does not change; its standard errors grow honestly)."""
    if len(keep) > MAX_ITERATIONS:
        keep = keep[np.linspace(0, len(keep) - 1, MAX_ITERATIONS).round().astype(np.int64)]
    return keep


def prefill_block(
    prompts: list[tuple[int, ...]],
    meas: np.ndarray,
    pre,
    rest: np.ndarray | None = None,
    busy_left_s: np.ndarray | None = None,
    first_seen: np.ndarray | None = None,
) -> dict:
    """Prefill items: batches of these prompts measured `meas` seconds, each plus `rest` seconds the fit holds;
    `busy_left_s`: the seconds each starts with transfers in flight (until the last of them ends); `first_seen`:
    1 where the batch's token count had not run in its process before (first_seen_batches)."""
    costs = [pre.prefill(p) for p in prompts]
    hop = (pre.parallel.pipeline - 1) * np.array([pre._stage_hop_s(sum(p)) for p in prompts])
    latency0 = np.array([c.latency_s for c in costs])
    # the part prefill_efficiency divides (the model's work, not the method's own kernels: costmodel/phases.py), from
    # the price at half the speed: model / 0.5 - model / 1
    half = replace(pre, prefill_efficiency=0.5)
    model0 = np.array([half.prefill(p).latency_s for p in prompts]) - latency0
    return {
        "meas": meas,
        "gpu0": latency0 - hop,
        "model0": model0,
        "approx0": np.array([c.approximation_s for c in costs]),
        "hop": hop,
        "requests": np.array([len(p) for p in prompts], dtype=np.float64),
        "layers": float(pre.model.layers),
        "rest": np.zeros(len(prompts)) if rest is None else rest,
        # seconds from its start until the transfers in flight then have all ended (0: none in flight)
        "busy_left_s": np.zeros(len(prompts)) if busy_left_s is None else busy_left_s,
        "first_seen": np.zeros(len(prompts)) if first_seen is None else first_seen.astype(np.float64),
        "first_seen_fade_s": float(pre.host_first_seen_fade_s),
    }


def first_seen_batches(tokens, seen_before: bool = False) -> np.ndarray:
    """Per batch, in the order they ran, 1 where no earlier batch of the process had its token count (the prefill
    replica's memory, simulator/prefill.py: prefill.host_first_seen_s_per_iteration); all 0 where the process had
    run the same prompts before the trace (measured.earlier_run)."""
    seen: set[int] = set()
    out = np.zeros(len(tokens))
    for i, t in enumerate(tokens):
        if not seen_before and int(t) not in seen:
            out[i] = 1.0
        seen.add(int(t))
    return out


def _prefill_blocks(df: pd.DataFrame, pre, seen_before: bool = False) -> tuple[dict, dict | None]:
    """Per prefill batch (the requests that started together): duration and quantize step."""
    rows, heads = _batch_rows(df)
    first = df.iloc[rows[heads]]
    tokens = df["prompt_tokens"].to_numpy()[rows]
    prompts = [tuple(int(p) for p in grp) for grp in np.split(tokens, heads[1:])] if len(rows) else []
    took_s = (first["prefill_end_s"] - first["prefill_start_s"]).to_numpy()
    busy_left_s = link_busy_left(df, first["prefill_start_s"].to_numpy())
    seen = first_seen_batches([sum(p) for p in prompts], seen_before)
    prefill = prefill_block(prompts, took_s, pre, busy_left_s=busy_left_s, first_seen=seen)
    quantize = None
    measured_q = (first["quantize_end_s"] - first["prefill_end_s"]).to_numpy()
    # no quantize kernel after the forward (FP16; a homomorphic prefill, whose forward quantized): a step the trace
    # records is the engine packing the KV for the wire, a host floor (ReplicaCostModel._encode_s), with no GPU work
    # to scale (at neutral engine parameters the floors are 0)
    if pre.method.encode is None:
        enc0 = np.zeros(len(prompts))
    else:
        enc0 = np.array([pre.prefill(p).encode_s for p in prompts])
    packs = bool(len(measured_q)) and bool((measured_q > 0).all()) and not (enc0 > 0).any()
    if packs or (pre.method.encode in ("quantize", "quantize_keys", "cast") and (enc0 > 0).all()):
        quantize = {
            "meas": measured_q,
            "enc0": enc0,
            "layers": pre.model.layers / pre.parallel.pipeline,
            "requests": np.array([len(p) for p in prompts], dtype=np.float64),  # the floor is per request too
            # the step's level is set at its start (simulator/prefill.py, _busy_part): what is left of the
            # transfers in flight then once the forward pass is done; a transfer that starts during the step leaves
            # it as it is (in realrun none does: its transfers start after the quantize step)
            "busy_left_s": np.maximum(busy_left_s - took_s, 0.0),
        }
    return prefill, quantize


def _transfer_block(df: pd.DataFrame, pre, line_gbps: float, chunk_bytes: int = 0) -> dict:
    moved = (df["transfer_end_s"] > df["transfer_start_s"]).to_numpy()
    d = df.loc[moved].sort_values("transfer_start_s", kind="stable")
    return {
        "start": d["transfer_start_s"].to_numpy(),
        "meas": (d["transfer_end_s"] - d["transfer_start_s"]).to_numpy(),
        "bytes": np.array([pre.wire_bytes(int(p)) for p in d["prompt_tokens"]]),
        "line_bytes_per_s": line_gbps * 1e9 / 8,
        "chunk_bytes": chunk_bytes,  # network.round_robin_chunk_bytes: 0, fluid fair sharing
    }


# ---- engine benchmark files ------------------------------------------------------------------------------
def token_times(log: RequestLog) -> list[np.ndarray]:
    """Per request, when the client received each output token: its first at send + TTFT, then after each
    streamed gap (one per token), else evenly spaced to its end."""
    out = []
    for r in range(len(log)):
        first = log.send_s[r] + log.ttft_s[r]
        n, gaps = int(log.output_tokens[r]), log.itl_s[r]
        if len(gaps) == n - 1:
            t = first + np.concatenate([[0.0], np.cumsum(gaps)])
        else:
            t = first + np.linspace(0.0, log.latency_s[r] - log.ttft_s[r], n)
        out.append(t)
    return out


def joined_at(times: list[np.ndarray], ttft_at: str) -> np.ndarray:
    """When each request joined the decode batch. Where the first token comes out of the decode iteration a
    request joins (ttft_at decode, colocated), at its first token; where it comes out of the prefill (ttft_at
    prefill), the request may wait for a transfer or for KV room before it joins, so it joined when the
    iteration of its second token started: one gap (its next one, else the first) before that token."""
    out = np.empty(len(times))
    for r, t in enumerate(times):
        if ttft_at != "prefill" or len(t) < 2:
            out[r] = t[0]
        else:
            gap = t[2] - t[1] if len(t) > 2 else t[1] - t[0]
            out[r] = max(t[0], t[1] - gap)
    return out


class Timeline:
    """The decode batch of a benchmark run rebuilt from its requests' token times: at any time, who is in decode
    (from joining it to its last token) and their total context (prompt + tokens streamed so far)."""

    def __init__(self, log: RequestLog, times: list[np.ndarray], joined: np.ndarray | None = None):
        self.first = np.array([t[0] for t in times])
        self.joined = self.first if joined is None else joined
        self.last = np.array([t[-1] for t in times])
        self.send = log.send_s
        prompt, out = log.prompt_tokens.astype(np.float64), log.output_tokens.astype(np.float64)
        oj, ol = np.argsort(self.joined, kind="stable"), np.argsort(self.last, kind="stable")
        self._joined, self._last, self._first = self.joined[oj], self.last[ol], np.sort(self.first)
        self._cum_p_joined = np.concatenate([[0.0], np.cumsum(prompt[oj])])
        self._cum_p_last = np.concatenate([[0.0], np.cumsum(prompt[ol])])
        self._cum_o_last = np.concatenate([[0.0], np.cumsum(out[ol])])
        self._tokens = np.sort(np.concatenate(times))
        self._times, self._prompt = times, prompt

    def batch(self, t: np.ndarray) -> np.ndarray:
        """Requests in decode at t: joined at or before t, last token after t."""
        return np.searchsorted(self._joined, t, "right") - np.searchsorted(self._last, t, "right")

    def context(self, t: np.ndarray) -> np.ndarray:
        """Their KV tokens: their prompts, plus every token streamed by t less those of the requests already done
        and the first tokens of those still waiting to join (one each)."""
        joined, done = np.searchsorted(self._joined, t, "right"), np.searchsorted(self._last, t, "right")
        waiting = np.searchsorted(self._first, t, "right") - joined
        emitted = np.searchsorted(self._tokens, t, "right")
        return (self._cum_p_joined[joined] - self._cum_p_last[done]) + emitted - self._cum_o_last[done] - waiting

    def longest(self, t: np.ndarray) -> np.ndarray:
        """The longest context among the requests in decode at each t (any shape): prompt + tokens streamed by t."""
        t = np.asarray(t, dtype=np.float64)
        order = np.argsort(t.ravel(), kind="stable")
        ts = t.ravel()[order]
        out = np.zeros(len(ts))
        lo, hi = np.searchsorted(ts, self.joined, "left"), np.searchsorted(ts, self.last, "left")
        for r in np.flatnonzero(hi > lo):
            a, z = lo[r], hi[r]
            np.maximum(out[a:z], self._prompt[r] + np.searchsorted(self._times[r], ts[a:z], "right"), out=out[a:z])
        res = np.empty_like(out)
        res[order] = out
        return res.reshape(t.shape)

    def priced_context(self, dec, t: np.ndarray) -> np.ndarray:
        """The context of the batch at each t as the decode iteration is priced (ReplicaCostModel.priced_context)."""
        ctx = self.context(t)
        if not dec.attention_padding_share:
            return ctx
        return dec.priced_context(ctx, np.maximum(self.batch(t), 1), self.longest(t))

    def in_prefill(self, a: np.ndarray, b: np.ndarray, skip: np.ndarray) -> np.ndarray:
        """Whether any request other than skip[i] was in prefill (sent, first token not yet out) during
        (a[i], b[i])."""
        out = np.zeros(len(a), dtype=bool)
        for i in range(len(a)):
            busy = (self.send < b[i]) & (self.first > a[i])
            busy[skip[i]] = False
            out[i] = busy.any()
        return out

    def joins(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        """Requests that joined the batch in (a[i], b[i]]."""
        return np.searchsorted(self._joined, b, "right") - np.searchsorted(self._joined, a, "right")


def _log_blocks(td: TraceData, log: RequestLog, s, pre, dec, own) -> None:
    """The iteration and prefill items a benchmark file gives (module doc); what it cannot give, in td.notes."""
    if not log.sends_known:
        td.notes.append("left out of the fit: without send times the batch each token was decoded in is unknown")
        return
    times = token_times(log)
    from_prefill = s.ttft_at == "prefill" and s.placement != "colocated"
    line = Timeline(log, times, joined_at(times, "prefill" if from_prefill else "decode"))
    shares = s.placement in ("shared_gpu", "colocated")  # prefill runs on the decode GPUs
    per_token = log.per_token()
    # inter-token latencies of the requests that streamed one chunk per token; where the first token comes out of
    # the prefill, the first gap also holds the wait to join (transfer, KV room): not an iteration
    skip = 1 if from_prefill else 0
    req, a, b = [], [], []
    for r in np.flatnonzero(per_token & (log.output_tokens > 1 + skip)):
        t = times[r][skip:]
        req.append(np.full(len(t) - 1, r))
        a.append(t[:-1])
        b.append(t[1:])
    items: list[dict] = []
    if req:
        r_i, a_i, b_i = np.concatenate(req), np.concatenate(a), np.concatenate(b)
        keep = np.arange(len(r_i))
        if shares:
            keep = keep[~line.in_prefill(a_i, b_i, r_i)]
        keep = keep[np.argsort((a_i[keep] + b_i[keep]) / 2, kind="stable")]
        keep = _evenly(keep)
        mid = (a_i[keep] + b_i[keep]) / 2
        items.append(
            iteration_features(
                dec,
                np.maximum(line.batch(mid), 1),
                line.priced_context(dec, mid),
                line.joins(a_i[keep], b_i[keep]),
                b_i[keep] - a_i[keep],
            )
        )
    # TPOT of the requests whose chunks carried several tokens
    rest = np.flatnonzero(~per_token & (log.output_tokens > 1))
    if len(rest):
        if shares:
            rest = rest[~line.in_prefill(line.joined[rest], line.last[rest], rest)]
        if len(rest):
            frac = (np.arange(TPOT_SAMPLES) + 0.5) / TPOT_SAMPLES
            samples = line.joined[rest, None] + frac[None, :] * (line.last[rest] - line.joined[rest])[:, None]
            n = log.output_tokens[rest] - 1
            items.append(
                iteration_features(
                    dec,
                    np.maximum(line.batch(samples), 1),
                    line.priced_context(dec, samples).mean(axis=1),
                    line.joins(line.joined[rest], line.last[rest]) / n,
                    (log.latency_s[rest] - log.ttft_s[rest]) / n,
                )
            )
            td.notes.append(f"{len(rest)} requests streamed several tokens per chunk: their TPOT stands for their ITLs")
    if items:
        td.blocks["iteration"] = _concat_items(items)
    else:
        td.notes.append("no decode item: no request streamed two tokens" + (" outside a prefill" if shares else ""))
    if s.placement == "colocated":
        td.notes.append(
            "no prefill item: placement colocated runs prefill as chunks of decode iterations, priced with the "
            "decode pool's settings (the prefill pool's parameters do not apply)"
        )
        return
    # requests that found the engine idle: nobody else in flight from their send to their first token
    idle = np.array(
        [
            not np.any((line.send < line.first[r]) & (line.last > line.send[r]) & (np.arange(len(log)) != r))
            for r in range(len(log))
        ],
        dtype=bool,
    )
    rows = np.flatnonzero(idle)
    if not len(rows):
        td.notes.append("no prefill item: no request found the engine idle")
        return
    prompts = [(int(log.prompt_tokens[r]),) for r in rows]
    rest_s = np.zeros(len(rows))
    if s.ttft_at == "decode":
        own_pre, own_dec = own
        rest_s = np.array([_to_first_token_s(s, own_pre, own_dec, p[0]) for p in prompts])
    # a prompt length no request sent before had (one prefill replica: every earlier prompt ran there)
    by_send = np.argsort(log.send_s, kind="stable")
    seen = np.zeros(len(log))
    seen[by_send] = first_seen_batches(np.asarray(log.prompt_tokens)[by_send])
    td.blocks["prefill"] = prefill_block(prompts, log.ttft_s[rows], pre, rest_s, first_seen=seen[rows])
    td.notes.append(f"prefill: the first-token times of the {len(rows)} requests that found the engine idle")


def _to_first_token_s(s, pre, dec, prompt: int) -> float:
    """ttft_at decode: from a lone request's prefill end to its first token, at the scenario's values: quantize,
    the transfer at the link's rate, the first decode iteration."""
    rate = network_bandwidth_gbps(s) * 1e9 / 8 * s.network.efficiency
    wire = pre.wire_bytes(prompt) / rate if math.isfinite(rate) else 0.0
    return pre.prefill((prompt,)).encode_s + wire + s.network.latency_s + dec.iteration(1).time_s(prompt)


def _concat_items(items: list[dict]) -> dict:
    out = dict(items[0])
    for key in (
        "meas",
        "batch",
        "ctx",
        "joins",
        "leaves",
        "busy",
        "fixed0",
        "dequant_fixed0",
        "approx_fixed0",
        "lm_head",
    ):
        out[key] = np.concatenate([it[key] for it in items])
    return out
