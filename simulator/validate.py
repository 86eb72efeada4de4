"""Score the simulator against a measured run.

A measured run is a realrun trace or an engine's benchmark file:

* a realrun trace is a folder (or its `requests.csv`) in the format documented in README ("Trace format"): per
  request `arrival_s, prompt_tokens, output_tokens, prefill_start_s, prefill_end_s, quantize_end_s,
  transfer_start_s, transfer_end_s, decode_start_s, first_token_s, finish_s`; optionally `iterations.csv` (per
  decode iteration: `start_s, end_s, batch_size, context_tokens`) and `meta.json` (at least `method`);
* a benchmark file (simulator/engine_logs.py: vLLM `bench serve --save-detailed`, SGLang `bench_serving
  --output-details`, AIPerf `profile_export.jsonl`) gives per request its lengths, the client's time to first
  token and latency, and, in some formats, its send time. Without send times the requests arrive by the
  scenario's arrival process (its rate and seed), and only the distributions compare; without phase timestamps
  and iterations only JCT, TTFT and TPOT do. `notes` in the result say which.

The scenario must describe the measured system; validation replays the run's own requests through it
(`workload.trace_csv`), so only the model of the system differs, never the workload. A realrun trace whose
meta.json contradicts the scenario (another model, layer count, link rate, placement, batch or memory limit) is
refused, naming the field (`check_meta`).

Errors are (simulated − measured) / measured in percent, for the mean and p50/p90/p99 of JCT, TTFT and TPOT
(TPOT: the time from the first token to the last over the output tokens after the first, output − 1; requests of
one token have none), for the mean of each breakdown part the trace can resolve (decode is compared as decode +
dequantize + approximation, which a trace cannot split), and, with `iterations.csv`, for the decode iteration
time the cost model predicts for each measured batch (batch size and total context) — the direct check of the
per-iteration model, free of queueing — and for the cadence (`_cadence`: each iteration's start to the next one's,
priced with every engine term as the fit's items are). With a repeats index (simulator/noise.py) each error figure
has the run-to-run spread of its metric beside it.

The wait for KV room is reported beside the JCT error (`kv_wait_s`): per request, the time from its KV being
ready (`quantize_end_s`) to its transfer's start (`transfer_start_s`), which is when the decode side admits it
(realrun/harness.py admits by memory before the transfer, and so does the simulator's router), averaged over
the requests: measured, simulated, the error in percent and in seconds (the measured wait may be about 0,
where a percentage says nothing). With `network.kv_connector: p2p_push` the simulated KV waits on the decode
side after its transfer instead, in `decode_queue`.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd

from .comparison import PAIRED_BY, index_against_reference
from .config import ScenarioError
from .host_speed import host_speed_line, host_spread
from .measured import Measured, load_measured, read_index
from .process_pool import Progress, map_in_processes
from .run import run_scenario

MEASURABLE_PARTS = ("prefill_queue", "prefill", "quantize", "transfer_queue", "transfer", "decode_queue", "decode")


PHASE_COLUMNS = (
    "prefill_start_s",
    "prefill_end_s",
    "quantize_end_s",
    "transfer_start_s",
    "transfer_end_s",
    "decode_start_s",
)


def measured_parts(df: pd.DataFrame) -> pd.DataFrame:
    """Per request JCT, TTFT and TPOT, and the breakdown parts the run resolves (with phase timestamps), by the
    simulator's definitions. TTFT ends at the first token (`first_token_s`, else the prefill's end); TPOT is the
    time from the first token to the last over the output tokens after the first (a one-token request has none)."""
    # the columns it reads as arrays, and one frame built at the end rather than column by column (a tenth of the time)
    c = {
        k: df[k].to_numpy()
        for k in ("arrival_s", *PHASE_COLUMNS, "first_token_s", "finish_s", "output_tokens")
        if k in df.columns
    }
    out: dict[str, np.ndarray] = {}
    first = c["first_token_s"] if "first_token_s" in c else c["prefill_end_s"]
    if all(k in c for k in PHASE_COLUMNS):
        t_start = np.maximum(c["transfer_start_s"], c["quantize_end_s"])
        t_end = np.maximum(c["transfer_end_s"], c["quantize_end_s"])
        out["prefill_queue"] = c["prefill_start_s"] - c["arrival_s"]
        out["prefill"] = c["prefill_end_s"] - c["prefill_start_s"]
        out["quantize"] = c["quantize_end_s"] - c["prefill_end_s"]
        out["transfer_queue"] = t_start - c["quantize_end_s"]
        out["transfer"] = t_end - t_start
        out["decode_queue"] = c["decode_start_s"] - t_end
        out["decode"] = c["finish_s"] - c["decode_start_s"]
    out["jct"] = c["finish_s"] - c["arrival_s"]
    out["ttft"] = first - c["arrival_s"]
    n = c["output_tokens"]
    out["tpot"] = np.where(n > 1, (c["finish_s"] - first) / np.maximum(n - 1, 1), np.nan)
    return pd.DataFrame(out, index=df.index)


def _stats(s: pd.Series) -> dict[str, float]:
    x = s.dropna().to_numpy()
    if not len(x):
        return {"mean": math.nan, "p50": math.nan, "p90": math.nan, "p99": math.nan}
    p50, p90, p99 = np.percentile(x, [50, 90, 99])
    return {"mean": float(x.mean()), "p50": float(p50), "p90": float(p90), "p99": float(p99)}


def _err_pct(sim: float, meas: float) -> float | None:
    if not math.isfinite(sim) or not math.isfinite(meas) or abs(meas) < 1e-9:
        return None
    return 100.0 * (sim - meas) / meas


def _cadence(m: Measured, trace, scenario_path, s, items) -> dict | None:
    """The decode iterations' cadence (a realrun trace: each iteration's start to the next one's where the engine
    went straight on; a benchmark file: the inter-token latencies outside any prefill) against its price with
    everything the engine model adds to the kernels (joins, leavers, the KV copies, the after-prefill slowdowns,
    the busy link's host factor and the CPU's gap): the fit's iteration items (fit_items, calibrate.predict) at the
    simulated scenario's engine values. Unlike the iteration rows (`iteration_s`: each row against the steady
    iteration's price less the CPU's gap, part of which realrun spends inside its rows), like for like. None where
    the run has no such items."""
    from .calibrate import predict
    from .fit_items import scenario_values, trace_data

    td = items if items is not None else trace_data(m, scenario_path, str(trace))
    blk = td.blocks.get("iteration")
    if blk is None or not len(blk["meas"]):
        return None
    pred = np.asarray(predict(td, "iteration", scenario_values(s)), dtype=np.float64)
    meas = np.asarray(blk["meas"], dtype=np.float64)
    return {
        "measured_mean": float(meas.mean()),
        "predicted_mean": float(pred.mean()),
        "count": int(len(meas)),
        "median_abs_error_pct": float(100 * np.median(np.abs(pred - meas) / np.maximum(meas, 1e-12))),
    }


def replayed(m: Measured, engine_values: dict[str, float] | None = None, notes: list[str] | None = None):
    """The scenario validate simulates for a measured run: `m`'s, with `engine_values` where its placement uses them,
    and no first-seen prefill time where the process ran these prompts before; what it changes said in `notes`."""
    s, notes = m.scenario, notes if notes is not None else []
    if engine_values:
        from .engine import apply_values, not_applied

        skip = not_applied(s, engine_values)
        if skip:
            notes.append(f"not applied (placement {s.placement}): {', '.join(sorted(skip))}")
        s = apply_values(s, {k: v for k, v in engine_values.items() if k not in skip})
    if m.seen_before and s.prefill.host_first_seen_s_per_iteration:
        s = s.model_copy(update={"prefill": s.prefill.model_copy(update={"host_first_seen_s_per_iteration": 0.0})})
        notes.append(f"no prefill pays prefill.host_first_seen_s_per_iteration: {m.seen_before} ran these prompts")
    return s


def run_host_sensitivity(trace, scenario_path, method: str | None = None) -> float | None:
    """A measured run's host_sensitivity_of with no fit (validate --cv's, per run)."""
    m = load_measured(trace, scenario_path, None, method)
    return host_sensitivity_of(replayed(m), str(scenario_path), m.config.output_name)


def host_sensitivity_of(s, source: str, method: str) -> float | None:
    """The run's mean JCT elasticity in its host's speed (host_speed.host_sensitivity): its scenario `s` (as validate
    replays it) simulated again with every host time term x and / host_speed.HOST_STEP. None where the scenario
    prices no host time (host_speed.prices_host_time)."""
    from .engine import on_host
    from .host_speed import HOST_STEP, host_sensitivity, prices_host_time

    if not prices_host_time(s):
        return None
    fast, slow = (
        _stats(measured_parts(run_scenario(on_host(s, f), source=source, methods=[method]).requests)["jct"])["mean"]
        for f in (1.0 / HOST_STEP, HOST_STEP)
    )
    return round(host_sensitivity(fast, slow), 4)


def host_factor(td, s) -> dict | None:
    """The one factor on every host time term that fits this run alone at the scenario's engine values (the
    machine refit, calibrate --base --refit machine): far from 1, the run's machine spends more or less CPU time
    than the scenario's host terms say. None where nothing in the run moves with the host terms."""
    from .calibrate import fit_engine
    from .config import ScenarioError
    from .fit_items import scenario_values

    try:
        fit = fit_engine([td], "machine", {n: (v, None) for n, v in scenario_values(s).items()}, "the scenario")
    except ScenarioError:
        return None
    assert fit.factor is not None
    return {"value": float(fit.factor["value"]), "stderr": float(fit.factor["stderr"])}


def prefill_share(df: pd.DataFrame) -> float | None:
    """The share of a run's span (first arrival to last finish) its prefill batches hold, from each batch's start to
    its quantize step's end (requests that started together count once); None without the phase timestamps. On a
    shared GPU a running request's next token waits for them, so its time is about the loop's cadence / (1 - d): an
    error of x % in the prefills' price moves TPOT and JCT by about x d / (1 - d) % (docs/calibration.md, "Where it
    stands")."""
    from .fit_items import _prefill_batches

    if not {"prefill_start_s", "quantize_end_s"} <= set(df.columns) or not len(df):
        return None
    starts, ends, _ = _prefill_batches(df)
    held = ends - starts
    span = float(df["finish_s"].max() - df["arrival_s"].min())
    return float(held[np.isfinite(held)].sum()) / span if span > 0 else None  # an unfinished batch: none


def validate(
    trace: str | Path,
    scenario_path: str | Path,
    overrides: list[str] | None = None,
    method: str | None = None,
    engine_values: dict[str, float] | None = None,
    items=None,
    host: bool = True,
) -> dict:
    """Simulate the run's system and compare; `engine_values` (engine.PARAMETERS names) replace the scenario's
    engine parameters (a calibration fitted in memory: simulator/crossval.py), those the scenario's placement
    applies (engine.not_applied: the rest are listed in `notes`); `items`: the trace's fit items
    (fit_items.load_trace_data, priced as here), if the caller has them, else priced from the run read here;
    `host`: also the run's host factor (host_factor) and its mean JCT's elasticity in its host's speed
    (host_sensitivity_of); a cross-validation, which does not show them per run, leaves them out."""
    m = load_measured(trace, scenario_path, overrides, method)
    method, df, notes = m.config.output_name, m.requests, list(m.notes)
    s = replayed(m, engine_values, notes)
    result = run_scenario(s, source=str(scenario_path), methods=[method])
    if result.engine_outside:  # simulator/domain.py: the scenario's engine calibration is extrapolated here
        notes.append(
            f"calibration.engine {Path(str(s.calibration.engine)).name}: this run lies outside the runs it was fitted "
            "on: " + "; ".join(result.engine_outside)
        )
    sim = result.requests.sort_values("arrival_s", kind="stable").reset_index(drop=True)
    # Both sides through the same timestamp definitions: the trace cannot split decode into
    # decode/dequantize/approximation, nor prefill from its homomorphic correction.
    meas, sim_parts = measured_parts(df), measured_parts(sim)
    out: dict = {
        "trace": str(trace),
        "scenario": str(scenario_path),
        "method": method,
        "family": m.config.name,  # the method's registry name (costmodel.methods.REFERENCE: FP16's)
        "source": m.source,
        "workload": {k: m.meta.get(k) for k in PAIRED_BY} if m.source == "realrun" else {},
        "requests": len(df),
        "notes": notes,
        "metrics": {},
        "breakdown_s": {},
        "resolved_scenario": s.model_dump(mode="json"),
    }
    for metric in ("jct", "ttft", "tpot"):
        mm, p = _stats(meas[metric]), _stats(sim_parts[metric])
        out["metrics"][f"{metric}_s"] = {"measured": mm, "simulated": p}
        for q in ("mean", "p50", "p90", "p99"):
            out[f"{metric}_{q}_error_pct"] = _err_pct(p[q], mm[q])
    for part in MEASURABLE_PARTS:
        if part not in meas.columns:
            out[f"{part}_mean_error_pct"] = None
            continue
        mm, p = float(meas[part].mean()), float(sim_parts[part].mean())
        out["breakdown_s"][part] = {"measured": mm, "simulated": p}
        out[f"{part}_mean_error_pct"] = (
            _err_pct(p, mm) if mm > 1e-3 * max(out["metrics"]["jct_s"]["measured"]["mean"], 1e-9) else None
        )
    # the wait for KV room, per request (module doc): the mean, its error in % (where the measured wait is not
    # negligible against the JCT, as for the parts) and in seconds
    if "transfer_queue" in meas.columns:
        mm, p = float(meas["transfer_queue"].mean()), float(sim_parts["transfer_queue"].mean())
        out["kv_wait_s"] = {"measured": mm, "simulated": p, "error_s": p - mm}
        out["kv_wait_mean_error_pct"] = out["transfer_queue_mean_error_pct"]
        out["kv_wait_error_s"] = p - mm
    else:
        out["kv_wait_mean_error_pct"] = out["kv_wait_error_s"] = None
    # what the trace cannot resolve, simulated: dequantization's share of the mean JCT
    out["dequantize_share_pct"] = (
        100.0 * float(sim["dequantize_s"].mean()) / out["metrics"]["jct_s"]["simulated"]["mean"]
        if "dequantize_s" in sim.columns
        else None
    )
    if s.placement == "shared_gpu":  # the prefills' hold on the shared GPU, and what it does to an error
        d_meas, d_sim = prefill_share(df), prefill_share(sim)
        if d_meas is not None and d_sim is not None:
            out["prefill_share"] = {"measured": d_meas, "simulated": d_sim, "amplification": d_meas / (1.0 - d_meas)}
    iterations = m.iterations
    if iterations is not None and len(iterations):
        res = result.resolved  # the profiles and specs the simulation just used
        _, dec = res.costs(next(c for c in s.methods if c.output_name == method))
        measured_it = (iterations["end_s"] - iterations["start_s"]).to_numpy()
        # a trace's iteration rows run from one iteration's start to its end: the engine's work between
        # iterations (host_serial_s_per_iteration) is in the simulated cadence but not in the rows
        serial = dec.host_serial_s_per_iteration
        from .fit_items import priced_contexts

        batch, ctx = iterations["batch_size"].to_numpy(), iterations["context_tokens"].to_numpy().astype(np.float64)
        ctx = priced_contexts(df, iterations["start_s"].to_numpy(), batch, ctx, dec)  # as the simulator prices them
        predicted_it = np.array([dec.iteration(int(b)).time_s(float(c)) - serial for b, c in zip(batch, ctx)])
        out["iteration_s"] = {
            "measured_mean": float(measured_it.mean()),
            "predicted_mean": float(predicted_it.mean()),
            "count": int(len(measured_it)),
        }
        out["iteration_mean_error_pct"] = _err_pct(float(predicted_it.mean()), float(measured_it.mean()))
        rel = np.abs(predicted_it - measured_it) / np.maximum(measured_it, 1e-12)
        out["iteration_median_abs_error_pct"] = float(100 * np.median(rel))
    if items is None:
        from .fit_items import trace_data

        items = trace_data(m, scenario_path, str(trace))
    cadence = _cadence(m, trace, scenario_path, s, items)
    out["host_factor"] = host_factor(items, s) if host else None
    if host:  # what the host's speed alone moves this run's mean JCT by (simulator/host_speed.py)
        out["host_sensitivity"] = host_sensitivity_of(s, str(scenario_path), method)
        if out["host_sensitivity"] is None:
            from .host_speed import NO_HOST_TIME

            out["notes"].append(f"host speed alone: n/a, {NO_HOST_TIME}")
    if cadence is not None:
        out["cadence_s"] = cadence
        out["cadence_mean_error_pct"] = _err_pct(cadence["predicted_mean"], cadence["measured_mean"])
        steps = m.files[0].parent / "steps.csv"
        if m.source == "realrun" and steps.exists():
            out.update(_step_split(steps, m, dec, predicted_it))
    return out


def _step_split(steps: Path, m: Measured, dec, predicted_it: np.ndarray) -> dict:
    """A step-timed recording (realrun --step-times: steps.csv beside the trace, realrun/steps.py) split into the
    host's serial time per iteration (its steady iterations: no join, compaction or transfer; the loop gap before
    each plus its issue) and the step graph's GPU time (every iteration, CUDA events), each against its price: the
    scenario's host_serial_s_per_iteration and the iteration's price without it (the kernels' alone: on a shared
    GPU the after-prefill slowdowns are in the measured GPU time, not in this price)."""
    from realrun.steps import parts_of

    try:
        parts = parts_of(m.iterations, m.requests, pd.read_csv(steps))
    except (KeyError, ValueError, pd.errors.ParserError) as e:
        raise ScenarioError(f"{steps}: not a step-times file ({e})") from None
    serial = parts.host_serial_s[(parts.kind == "steady") & parts.host_serial_s.notna()]
    gpu = parts.step_gpu_s.to_numpy(float) + parts.place_gpu_s.to_numpy(float)
    out: dict = {"step_gpu_s": {"measured_mean": float(gpu.mean()), "predicted_mean": float(predicted_it.mean())}}
    out["step_gpu_mean_error_pct"] = _err_pct(float(predicted_it.mean()), float(gpu.mean()))
    if len(serial):
        priced = dec.host_serial_s_per_iteration
        out["host_serial_s"] = {"measured_mean": float(serial.mean()), "predicted_mean": priced, "count": len(serial)}
        out["host_serial_mean_error_pct"] = _err_pct(priced, float(serial.mean()))
    return out


def format_validation(v: dict) -> str:
    from reports.terminal import render, table

    noise = v.get("noise")
    rows = []

    def row(label: str, measured: str, simulated: str, key: str) -> list[str]:
        out = [label, measured, simulated, _pct(v.get(key))]
        if noise:
            out.append(_spread(spread_of(noise, key)))
        return out

    for metric in ("jct", "ttft", "tpot"):
        m, p = v["metrics"][f"{metric}_s"]["measured"], v["metrics"][f"{metric}_s"]["simulated"]
        for q in ("mean", "p50", "p90", "p99"):
            rows.append(row(f"{metric} {q} (s)", f"{m[q]:.4f}", f"{p[q]:.4f}", f"{metric}_{q}_error_pct"))
        if metric == "jct" and v.get("kv_wait_s"):
            kv = v["kv_wait_s"]
            r = row(
                "kv wait mean (s)", f"{kv['measured']:.4f}", f"{kv['simulated']:.4f}", "transfer_queue_mean_error_pct"
            )
            r[3] += f" ({round(kv['error_s'], 4) or 0.0:+.4f} s)"
            rows.append(r)
    for part, mp in v["breakdown_s"].items():
        rows.append(
            row(f"{part} mean (s)", f"{mp['measured']:.4f}", f"{mp['simulated']:.4f}", f"{part}_mean_error_pct")
        )
    if "iteration_s" in v:
        it = v["iteration_s"]
        rows.append(
            row(
                "iteration mean (s)",
                f"{it['measured_mean']:.5f}",
                f"{it['predicted_mean']:.5f}",
                "iteration_mean_error_pct",
            )
        )
    if "cadence_s" in v:
        c = v["cadence_s"]
        rows.append(
            row("cadence mean (s)", f"{c['measured_mean']:.5f}", f"{c['predicted_mean']:.5f}", "cadence_mean_error_pct")
        )
    for key, label in (("step_gpu_s", "step GPU mean (s)"), ("host_serial_s", "host serial mean (s)")):
        if key in v:
            rows.append(
                row(
                    label,
                    f"{v[key]['measured_mean']:.5f}",
                    f"{v[key]['predicted_mean']:.5f}",
                    f"{key.removesuffix('_s')}_mean_error_pct",
                )
            )
    if "prefill_share" in v:
        d = v["prefill_share"]
        # a share, no error: the error column empty, the spread column as for a metric without one
        rows.append(
            ["prefill share of the GPU", f"{d['measured']:.3f}", f"{d['simulated']:.3f}", ""]
            + (["n/a"] if noise else [])
        )
    if v.get("host_sensitivity") is not None:
        hs = host_spread(noise)
        rows.append(
            row("host speed alone (mean JCT)", "", f"±{v['host_sensitivity'] * hs['spread_pct']:.1f} %", "host_none")
        )
        rows[-1][3] = ""
    if v.get("host_factor"):
        h = v["host_factor"]
        rows.append(
            row("host factor (this run alone)", "", f"{h['value']:.3f} ± {h['stderr']:.2g}", "host_factor_none")
        )
        rows[-1][3] = ""
    title = f"validate {v['method']} on {v['trace']} ({v['requests']} requests) against {v['scenario']}"
    heads = ["metric", "measured", "simulated", "error"] + (["run-to-run"] if noise else [])
    text = render(table(heads, rows, title=title))
    lines = [text] + [f"note: {n}" for n in v.get("notes", [])]
    if v.get("prefill_share") and v["prefill_share"]["measured"] >= 0.3:
        a = v["prefill_share"]["amplification"]
        lines.append(
            f"prefill share: the prefills hold the shared GPU {100 * v['prefill_share']['measured']:.0f} % of the run, "
            f"so an error of x % in their price moves TPOT and JCT by about {a:.1f} x %"
        )
    if noise:
        lines.append(
            f"run-to-run: the spread (1 sd) of the measured metric over repeated recordings ({noise['index']})"
        )
        lines += host_gauge_lines(noise)
    if v.get("host_sensitivity") is not None:
        lines.append(host_speed_line(host_spread(noise), "this run's"))
    return "\n".join(lines)


def add_host_spread(result: dict | list[dict], noise: dict | None) -> dict | None:
    """validate's result (one run's dict or an index's rows) with `host_spread_jct_mean_pct` beside each run's
    `host_sensitivity`: what the host's run-to-run speed (host_speed.host_spread) alone moves its mean JCT by, in %.
    Returns what the figures were computed from, the line that says so with them (for the pages), or None where no
    run has an elasticity."""
    runs = result if isinstance(result, list) else [result]
    if all(r.get("host_sensitivity") is None for r in runs):
        return None
    host = host_spread(noise)
    for r in runs:
        if r.get("host_sensitivity") is not None:
            r["host_spread_jct_mean_pct"] = round(r["host_sensitivity"] * host["spread_pct"], 2)
    return {**host, "line": host_speed_line(host, "each run's" if isinstance(result, list) else "this run's")}


def host_gauge_lines(noise: dict | None) -> list[str]:
    """For people: how much of mean JCT's run-to-run spread the recordings' host-bound step explains, one line (none
    without a repeats index or a gauge)."""
    g = (noise or {}).get("host_gauge")
    if not g:
        return []
    return [
        f"host during a run: each recording's quantize steps (host-bound kernel launches) move with its mean JCT, "
        f"correlation {g['correlation']:.2f} over {g['recordings']} recordings; run to run ±{g['spread_pct']:.1f} %, "
        f"±{g['spread_given_gauge_pct']:.1f} % once a run's own host speed is known"
    ]


def spread_of(noise: dict | None, error_key: str) -> float | None:
    """The pooled run-to-run spread (%, simulator/noise.py) of the metric behind an error key
    (jct_mean_error_pct: jct_mean); None without repeats of it."""
    if not noise:
        return None
    key = error_key.removesuffix("_error_pct")
    return noise["spread_pct"].get(KV_WAIT_SPREAD.get(key, key))


KV_WAIT_SPREAD = {"kv_wait_mean": "transfer_queue_mean"}  # the KV wait is the measured transfer_queue part


def _cell(key: str, e: float | None) -> str:
    """An index table's cell: an error in % or, for `*_error_s`, in seconds."""
    if key.endswith("_error_s"):
        return "n/a" if e is None else f"{round(e, 3) or 0.0:+.3f} s"  # no "-0.000 s"
    return _pct(e)


def _pct(e: float | None) -> str:
    return "n/a" if e is None else f"{e:+.1f}%"


def _spread(x: float | None) -> str:
    return "n/a" if x is None else f"±{x:.1f}%"


SUMMARY_KEYS = (
    "jct_mean_error_pct",
    "ttft_p50_error_pct",
    "tpot_p50_error_pct",
    "prefill_mean_error_pct",
    "transfer_mean_error_pct",
    "decode_mean_error_pct",
    "iteration_mean_error_pct",
    "cadence_mean_error_pct",
    "kv_wait_mean_error_pct",
    "kv_wait_error_s",
)
HEADS = (
    "jct mean",
    "ttft p50",
    "tpot p50",
    "prefill",
    "transfer",
    "decode",
    "iteration",
    "cadence",
    "kv wait",
    "kv wait (s)",
)
# step-timed recordings only (realrun --step-times): an index table shows them where a row has them
STEP_KEYS = ("step_gpu_mean_error_pct", "host_serial_mean_error_pct")
STEP_HEADS = ("step GPU", "host serial")


def validate_index(
    index_csv: str | Path, overrides: list[str] | None = None, workers: int = 1, progress: Progress | None = None
) -> list[dict]:
    """Validate every trace an index lists (read_index), in `workers` processes, `progress` told of each
    (process_pool.map_in_processes).  One dict per trace: its name, scenario and the SUMMARY_KEYS errors (and
    STEP_KEYS', None without steps.csv), and what pairs it with FP16's runs of the same workload
    (format_validation_table's comparison: configuration, machine, family, source, workload, the measured and
    simulated mean JCT)."""
    jobs = [(r, overrides) for r in read_index(index_csv)]
    return map_in_processes(_index_row, jobs, workers, progress, ("validating the runs", "runs"))


def _index_row(job) -> dict:
    r, overrides = job
    v = validate(r.trace_path, r.scenario_path, overrides, r.method)
    jct = v["metrics"]["jct_s"]
    return {
        "trace": r.trace,
        "scenario": r.scenario,
        "configuration": Path(str(r.scenario)).stem,
        "machine": r.machine,
        "method": v["method"],
        "family": v["family"],
        "source": v["source"],
        "workload": v["workload"],
        "jct_mean_measured_s": jct["measured"]["mean"],
        "jct_mean_simulated_s": jct["simulated"]["mean"],
        "requests": v["requests"],
        **{k: v.get(k) for k in SUMMARY_KEYS + STEP_KEYS},
        "host_factor": (v.get("host_factor") or {}).get("value"),
        "host_sensitivity": v.get("host_sensitivity"),
    }


def format_validation_table(rows: list[dict], noise: dict | None = None) -> str:
    from reports.terminal import render, table

    steps = any(r.get(k) is not None for r in rows for k in STEP_KEYS)
    keys, heads = (SUMMARY_KEYS + STEP_KEYS, HEADS + STEP_HEADS) if steps else (SUMMARY_KEYS, HEADS)
    host = any(r.get("host_factor") is not None for r in rows)
    speed = any(r.get("host_sensitivity") is not None for r in rows)
    spread = host_spread(noise)["spread_pct"]
    body = [
        [r["trace"], *(_cell(k, r.get(k)) for k in keys)]
        + ([_factor(r.get("host_factor"))] if host else [])
        + ([_spread(None if r.get("host_sensitivity") is None else r["host_sensitivity"] * spread)] if speed else [])
        for r in rows
    ]
    summary = []
    for label, fn in (("mean |error|", np.mean), ("max |error|", np.max)):
        vals = [
            fn([abs(r[k]) for r in rows if r.get(k) is not None]) if any(r.get(k) is not None for r in rows) else None
            for k in keys
        ]
        summary.append([label, *(_cell(k, None if v is None else float(v)) for k, v in zip(keys, vals))])
    if noise:
        summary.append(["run-to-run spread", *(_spread(spread_of(noise, k)) for k in keys)])
    summary = [r + [""] * (host + speed) for r in summary]
    extra = (["host ×"] if host else []) + (["host speed alone (mean JCT)"] if speed else [])
    text = render(table(["trace", *heads] + extra, body, footer_rows=summary))
    if noise:
        text += f"\nrun-to-run spread: 1 sd of the measured metric over repeated recordings ({noise['index']})"
        text += "".join("\n" + x for x in host_gauge_lines(noise))
    if host:
        text += (
            "\nhost ×: the one factor on every host time term that fits each run alone at its scenario's values; far "
            "from 1, that machine's CPU runs the engine loop faster (< 1) or slower than the scenario says (put the "
            "scenario there with calibration.host_speed_factor, or move a calibration there: calibrate --traces RUNS "
            "--base FILE --refit machine)"
        )
    if speed:
        text += "\n" + host_speed_line(host_spread(noise), "each run's")
    return text + "".join("\n" + x for x in index_against_reference(rows, noise))


def _factor(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.2f}"
