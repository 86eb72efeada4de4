"""Score the simulator against a measured trace.

A trace is a folder (or its `requests.csv`) in the format documented in README ("Trace format"):
per request `arrival_s, prompt_tokens, output_tokens, prefill_start_s, prefill_end_s,
quantize_end_s, transfer_start_s, transfer_end_s, decode_start_s, first_token_s, finish_s`;
optionally `iterations.csv` (per decode iteration: `start_s, end_s, batch_size, context_tokens`)
and `meta.json` (at least `method`). The scenario must describe the measured system; validation
replays the trace's own arrivals and lengths through it (`workload.trace_csv`), so only the model
of the system differs, never the workload.

Errors are (simulated − measured) / measured in percent, for the mean and p50/p90/p99 of JCT, TTFT
and TPOT, for the mean of each breakdown part the trace can resolve (decode is compared as
decode + dequantize + approximation, which a trace cannot split), and, with `iterations.csv`, for
the decode iteration time the cost model predicts for each measured batch (batch size and total
context) — the direct check of the per-iteration model, free of queueing.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pandas as pd

from . import files
from .config import ScenarioError
from .load import load_scenario
from .run import run_scenario
from .trace_rows import MEASURED_ITERATIONS, MEASURED_TRACE, check_trace_rows, read_csv_table

MEASURABLE_PARTS = ("prefill_queue", "prefill", "quantize", "transfer_queue", "transfer", "decode_queue", "decode")


def load_trace(path: str | Path) -> tuple[pd.DataFrame, pd.DataFrame | None, dict, Path]:
    """The trace's requests (checked row by row, see simulator.trace_rows), its iterations and meta."""
    path = Path(path)
    folder = path if path.is_dir() else path.parent
    req_path = folder / "requests.csv" if path.is_dir() else path
    if not req_path.exists():
        raise ScenarioError(f"{path}: no requests.csv")
    df = check_trace_rows(read_csv_table(req_path, ScenarioError), str(req_path), MEASURED_TRACE, ScenarioError)
    if "quantize_end_s" not in df.columns:
        df["quantize_end_s"] = df["prefill_end_s"]
    it_path = folder / "iterations.csv"
    iterations = None
    if it_path.exists():
        iterations = read_csv_table(it_path, ScenarioError)
        if len(iterations):
            iterations = check_trace_rows(iterations, str(it_path), MEASURED_ITERATIONS, ScenarioError)
    meta_path = folder / "meta.json"
    meta = {}
    if meta_path.exists():
        try:
            meta = json.loads(files.read_text(meta_path, ScenarioError, "meta.json"))
        except json.JSONDecodeError as e:
            raise ScenarioError(f"{meta_path}: line {e.lineno}: not valid JSON ({e.msg})") from None
        if not isinstance(meta, dict):
            raise ScenarioError(f"{meta_path}: expected a JSON object")
        if "method" in meta and not isinstance(meta["method"], str):
            raise ScenarioError(f"{meta_path}: method: expected a method name")
    return df.reset_index(drop=True), iterations, meta, req_path


def measured_parts(df: pd.DataFrame) -> pd.DataFrame:
    """The breakdown a trace resolves, by the simulator's definitions."""
    out = pd.DataFrame(index=df.index)
    t_start = np.maximum(df["transfer_start_s"], df["quantize_end_s"])
    t_end = np.maximum(df["transfer_end_s"], df["quantize_end_s"])
    out["prefill_queue"] = df["prefill_start_s"] - df["arrival_s"]
    out["prefill"] = df["prefill_end_s"] - df["prefill_start_s"]
    out["quantize"] = df["quantize_end_s"] - df["prefill_end_s"]
    out["transfer_queue"] = t_start - df["quantize_end_s"]
    out["transfer"] = t_end - t_start
    out["decode_queue"] = df["decode_start_s"] - t_end
    out["decode"] = df["finish_s"] - df["decode_start_s"]
    out["jct"] = df["finish_s"] - df["arrival_s"]
    out["ttft"] = df["prefill_end_s"] - df["arrival_s"]
    out["tpot"] = np.where(
        df["output_tokens"] > 1, (df["finish_s"] - df["prefill_end_s"]) / (df["output_tokens"] - 1), np.nan
    )
    return out


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


def validate(
    trace: str | Path,
    scenario_path: str | Path,
    overrides: list[str] | None = None,
    method: str | None = None,
    engine_values: dict[str, float] | None = None,
) -> dict:
    """Simulate the trace's system and compare; `engine_values` (engine.PARAMETERS names) replace the
    scenario's engine parameters (a calibration fitted in memory: simulator/calibrate.cross_validate)."""
    df, iterations, meta, req_path = load_trace(trace)
    method = method or meta.get("method")
    if method is None:
        raise ScenarioError(f"{trace}: no method in meta.json; pass --method")
    ov = list(overrides or []) + [
        f"workload.trace_csv={req_path.resolve()}",
        "workload.arrival={kind: trace}",
        f"workload.requests={len(df)}",
    ]
    s = load_scenario(scenario_path, ov)
    if engine_values:
        from .engine import apply_values

        s = apply_values(s, engine_values)
    if method not in {m.output_name for m in s.methods}:
        raise ScenarioError(f"{scenario_path}: methods: the trace's method {method!r} is not in the scenario")
    result = run_scenario(s, source=str(scenario_path), methods=[method])
    sim = result.requests.sort_values("arrival_s", kind="stable").reset_index(drop=True)
    # Both sides through the same timestamp definitions: the trace cannot split decode into
    # decode/dequantize/approximation, nor prefill from its homomorphic correction.
    meas, sim_parts = measured_parts(df), measured_parts(sim)
    out: dict = {
        "trace": str(trace),
        "scenario": str(scenario_path),
        "method": method,
        "requests": len(df),
        "metrics": {},
        "breakdown_s": {},
        "resolved_scenario": s.model_dump(mode="json"),
    }
    for metric in ("jct", "ttft", "tpot"):
        m, p = _stats(meas[metric]), _stats(sim_parts[metric])
        out["metrics"][f"{metric}_s"] = {"measured": m, "simulated": p}
        for q in ("mean", "p50", "p90", "p99"):
            out[f"{metric}_{q}_error_pct"] = _err_pct(p[q], m[q])
    for part in MEASURABLE_PARTS:
        m, p = float(meas[part].mean()), float(sim_parts[part].mean())
        out["breakdown_s"][part] = {"measured": m, "simulated": p}
        out[f"{part}_mean_error_pct"] = (
            _err_pct(p, m) if m > 1e-3 * max(out["metrics"]["jct_s"]["measured"]["mean"], 1e-9) else None
        )
    # what the trace cannot resolve, simulated: dequantization's share of the mean JCT
    out["dequantize_share_pct"] = (
        100.0 * float(sim["dequantize_s"].mean()) / out["metrics"]["jct_s"]["simulated"]["mean"]
        if "dequantize_s" in sim.columns
        else None
    )
    if iterations is not None and len(iterations):
        res = result.resolved  # the profiles and specs the simulation just used
        cfg = next(m for m in s.methods if m.output_name == method)
        _, dec = res.costs(cfg)
        measured_it = (iterations["end_s"] - iterations["start_s"]).to_numpy()
        # a trace's iteration rows run from one iteration's start to its end: the engine's work between
        # iterations (host_serial_s_per_iteration) is in the simulated cadence but not in the rows
        serial = dec.host_serial_s_per_iteration
        predicted_it = np.array(
            [
                dec.iteration(int(b)).time_s(float(c)) - serial
                for b, c in zip(iterations["batch_size"], iterations["context_tokens"])
            ]
        )
        out["iteration_s"] = {
            "measured_mean": float(measured_it.mean()),
            "predicted_mean": float(predicted_it.mean()),
            "count": int(len(measured_it)),
        }
        out["iteration_mean_error_pct"] = _err_pct(float(predicted_it.mean()), float(measured_it.mean()))
        rel = np.abs(predicted_it - measured_it) / np.maximum(measured_it, 1e-12)
        out["iteration_median_abs_error_pct"] = float(100 * np.median(rel))
    return out


def format_validation(v: dict) -> str:
    from reports.terminal import render, table

    rows = []
    for metric in ("jct", "ttft", "tpot"):
        m, p = v["metrics"][f"{metric}_s"]["measured"], v["metrics"][f"{metric}_s"]["simulated"]
        for q in ("mean", "p50", "p90", "p99"):
            rows.append([f"{metric} {q} (s)", f"{m[q]:.4f}", f"{p[q]:.4f}", _pct(v[f"{metric}_{q}_error_pct"])])
    for part, mp in v["breakdown_s"].items():
        rows.append(
            [f"{part} mean (s)", f"{mp['measured']:.4f}", f"{mp['simulated']:.4f}", _pct(v[f"{part}_mean_error_pct"])]
        )
    if "iteration_s" in v:
        it = v["iteration_s"]
        rows.append(
            [
                "iteration mean (s)",
                f"{it['measured_mean']:.5f}",
                f"{it['predicted_mean']:.5f}",
                _pct(v["iteration_mean_error_pct"]),
            ]
        )
    title = f"validate {v['method']} on {v['trace']} ({v['requests']} requests) against {v['scenario']}"
    return render(table(["metric", "measured", "simulated", "error"], rows, title=title))


def _pct(e: float | None) -> str:
    return "n/a" if e is None else f"{e:+.1f}%"


SUMMARY_KEYS = (
    "jct_mean_error_pct",
    "ttft_p50_error_pct",
    "tpot_p50_error_pct",
    "prefill_mean_error_pct",
    "transfer_mean_error_pct",
    "decode_mean_error_pct",
    "iteration_mean_error_pct",
)


def read_index(index_csv: str | Path) -> list[tuple[str, str, Path, Path]]:
    """An index's rows (columns trace, scenario): (trace, scenario as written, trace path, scenario path);
    relative paths are tried against the current directory, then the index's folder."""
    index_csv = Path(index_csv)
    idx = read_csv_table(index_csv, ScenarioError, "trace index")
    missing = {"trace", "scenario"} - set(idx.columns)
    if missing:
        raise ScenarioError(f"{index_csv}: the index needs columns trace and scenario (missing {sorted(missing)})")
    if not len(idx):
        raise ScenarioError(f"{index_csv}: no rows")
    blank = idx.loc[:, ["trace", "scenario"]].isna().any(axis=1).to_numpy()
    if blank.any():
        raise ScenarioError(f"{index_csv} line {int(np.argmax(blank)) + 2}: empty trace or scenario")

    def where(p: str) -> Path:
        q = Path(p)
        return q if q.exists() or q.is_absolute() else index_csv.parent / q

    return [(str(t), str(scen), where(str(t)), where(str(scen))) for t, scen in zip(idx["trace"], idx["scenario"])]


def validate_index(index_csv: str | Path, overrides: list[str] | None = None) -> list[dict]:
    """Validate every trace an index lists (read_index).  One dict per trace: its name, scenario and the
    SUMMARY_KEYS errors."""
    rows = []
    for t, scen, trace_path, scenario_path in read_index(index_csv):
        v = validate(trace_path, scenario_path, overrides)
        rows.append(
            {
                "trace": str(t),
                "scenario": str(scen),
                "method": v["method"],
                "requests": v["requests"],
                **{k: v.get(k) for k in SUMMARY_KEYS},
            }
        )
    return rows


def format_validation_table(rows: list[dict]) -> str:
    from reports.terminal import render, table

    heads = ("jct mean", "ttft p50", "tpot p50", "prefill", "transfer", "decode", "iteration")
    body = [[r["trace"], *(_pct(r[k]) for k in SUMMARY_KEYS)] for r in rows]
    summary = []
    for label, fn in (("mean |error|", np.mean), ("max |error|", np.max)):
        vals = [
            fn([abs(r[k]) for r in rows if r[k] is not None]) if any(r[k] is not None for r in rows) else None
            for k in SUMMARY_KEYS
        ]
        summary.append([label, *(_pct(None if v is None else float(v)) for v in vals)])
    return render(table(["trace", *heads], body, footer_rows=summary))
