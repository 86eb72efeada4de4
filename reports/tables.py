"""Tables of the report as DataFrames (pure): per-method statistics and changes against the baseline.

A change is ``(method - baseline) / baseline * 100`` for every metric: negative means the method
takes less time or fewer bytes than the baseline, the sign the terminal table prints. Throughput is
the one row where larger is better (HIGHER_IS_BETTER).
"""

from __future__ import annotations

import math
from typing import Any

import pandas as pd

from .data import RunData

# (row label, path into a method's summary, kind): kind picks the unit for display.
METRICS = (
    ("JCT mean", ("jct_s", "mean"), "s"),
    ("JCT p90", ("jct_s", "p90"), "s"),
    ("TTFT mean", ("ttft_s", "mean"), "s"),
    ("TTFT p90", ("ttft_s", "p90"), "s"),
    ("TPOT mean", ("tpot_s", "mean"), "s"),
    ("TPOT p90", ("tpot_s", "p90"), "s"),
    ("KV bytes/token on the wire", ("kv_bytes_per_token", "wire"), "bytes"),
    ("KV bytes/token in memory", ("kv_bytes_per_token", "memory"), "bytes"),
    ("Peak decode memory", ("peak_decode_memory_bytes",), "bytes"),
    ("Peak decode KV cache", ("peak_decode_kv_bytes",), "bytes"),
    ("Throughput", ("throughput_rps",), "rps"),
)
HIGHER_IS_BETTER = {"Throughput"}
ALWAYS_SHOWN = [label for label, _, _ in METRICS if label != "Peak decode KV cache"]


def _get(stats: dict, path: tuple[str, ...]) -> float:
    v: Any = stats
    for k in path:
        if not isinstance(v, dict) or k not in v or v[k] is None:
            return math.nan
        v = v[k]
    try:
        return float(v)
    except (TypeError, ValueError):
        return math.nan


def metric_values(run: RunData) -> pd.DataFrame:
    """Absolute values: one row per metric of METRICS, one column per method (seconds, bytes, req/s).

    A metric no method reports (e.g. peak_decode_kv_bytes from an older run) is left out.
    """
    data = {m: [_get(run.summary["methods"].get(m) or {}, path) for _, path, _ in METRICS] for m in run.methods}
    df = pd.DataFrame(data, index=[label for label, _, _ in METRICS], columns=run.methods, dtype=float)
    return df.loc[df.notna().any(axis=1) | df.index.isin(ALWAYS_SHOWN)]


def changes_table(run: RunData) -> pd.DataFrame | None:
    """Percent change of each metric against the baseline, one column per non-baseline method.

    None when the run has no baseline. A metric the baseline lacks (or has as 0) is NaN.
    """
    if run.baseline is None:
        return None
    values, base = metric_values(run), run.baseline
    out = {}
    for m in run.methods:
        if m == run.baseline:
            continue
        col = []
        for label in values.index:
            b, v = values.at[label, base], values.at[label, m]
            col.append((v - b) / b * 100 if b and math.isfinite(b) and math.isfinite(v) else math.nan)
        out[m] = col
    return pd.DataFrame(out, index=values.index, columns=[m for m in run.methods if m != run.baseline])


def latency_table(run: RunData) -> pd.DataFrame:
    """Per method: completed requests and mean/p50/p90/p99 of JCT, TTFT, TPOT (seconds)."""
    rows = {}
    for m in run.methods:
        s = run.summary["methods"].get(m) or {}
        row = {"completed": _get(s, ("completed",)), "throughput_rps": _get(s, ("throughput_rps",))}
        for metric in ("jct_s", "ttft_s", "tpot_s"):
            for q in ("mean", "p50", "p90", "p99"):
                row[f"{metric.removesuffix('_s')} {q}"] = _get(s, (metric, q))
        rows[m] = row
    return pd.DataFrame.from_dict(rows, orient="index")
