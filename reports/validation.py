"""The validation figure: measured against simulated, per metric, with the error on each bar.

Reads the dict `simulator.validate.validate` returns (also saved as validation.json); never
imports the simulator.
"""
from __future__ import annotations

import html
import json
from pathlib import Path

import plotly.graph_objects as go
from plotly.offline import get_plotlyjs

QUANTILES = ("mean", "p50", "p90", "p99")


def validation_figure(v: dict) -> go.Figure:
    labels, measured, simulated, errors = [], [], [], []
    for metric in ("jct", "ttft", "tpot"):
        for q in QUANTILES:
            labels.append(f"{metric.upper()} {q}")
            measured.append(v["metrics"][f"{metric}_s"]["measured"][q])
            simulated.append(v["metrics"][f"{metric}_s"]["simulated"][q])
            errors.append(v.get(f"{metric}_{q}_error_pct"))
    for part, mp in v["breakdown_s"].items():
        labels.append(f"{part} mean")
        measured.append(mp["measured"])
        simulated.append(mp["simulated"])
        errors.append(v.get(f"{part}_mean_error_pct"))
    text = ["n/a" if e is None else f"{e:+.1f}%" for e in errors]
    fig = go.Figure([
        go.Bar(name="measured", x=labels, y=measured, marker_color="#6b7280",
               hovertemplate="%{x}: %{y:.4f} s measured<extra></extra>"),
        go.Bar(name="simulated", x=labels, y=simulated, marker_color="#dc2626", text=text, textposition="outside",
               hovertemplate="%{x}: %{y:.4f} s simulated (error %{text})<extra></extra>"),
    ])
    fig.update_layout(barmode="group", template="plotly_white", height=520,
                      title=f"Simulated vs measured: {html.escape(str(v['method']))}, {v['requests']} requests",
                      yaxis_title="seconds (log)", yaxis_type="log", legend_orientation="h")
    return fig


def _write_page(path: str | Path, heading: str, subtitle: str, fig: go.Figure, data) -> Path:
    """A self-contained page (plotly.js embedded): heading, figure, the raw numbers."""
    path = Path(path)
    page = f"""<!doctype html><html><head><meta charset="utf-8"><title>hacksim validation</title>
<script>{get_plotlyjs()}</script></head><body style="font-family:sans-serif;margin:24px">
<h1>{html.escape(heading)}</h1><p>{html.escape(subtitle)}</p>
<div id="validation"></div>
<script>var f={fig.to_json()};Plotly.newPlot("validation",f.data,f.layout,{{responsive:true}});</script>
<pre>{html.escape(json.dumps(data, indent=2))}</pre></body></html>"""
    path.write_text(page)
    return path


def write_validation_report(v: dict, path: str | Path) -> Path:
    """A self-contained page with the figure and the raw numbers."""
    return _write_page(path, f"Validation: {v['trace']}", f"scenario {v['scenario']}", validation_figure(v), v)


INDEX_METRICS = (("jct_mean_error_pct", "JCT mean", "#dc2626"), ("ttft_p50_error_pct", "TTFT p50", "#2563eb"),
                 ("tpot_p50_error_pct", "TPOT p50", "#16a34a"), ("prefill_mean_error_pct", "prefill", "#9333ea"),
                 ("transfer_mean_error_pct", "transfer", "#6b7280"))


def validation_index_figure(rows: list[dict]) -> go.Figure:
    """Errors of many traces (simulator.validate.validate_index rows): one group of bars per trace,
    with the goal bands (mean JCT within 5 %, p50 TTFT/TPOT within 10 %) shaded."""
    names = [str(r["trace"]).removeprefix("llama-3.1-") for r in rows]
    fig = go.Figure()
    for key, label, color in INDEX_METRICS:
        vals = [r.get(key) for r in rows]
        fig.add_bar(name=label, x=names, y=vals, marker_color=color,
                    hovertemplate="%{x}<br>" + label + " error %{y:+.1f}%<extra></extra>")
    fig.add_hrect(y0=-10, y1=10, fillcolor="#16a34a", opacity=0.08, line_width=0)
    fig.add_hrect(y0=-5, y1=5, fillcolor="#16a34a", opacity=0.10, line_width=0)
    fig.update_layout(barmode="group", template="plotly_white", height=560,
                      legend=dict(orientation="h", y=1.02, yanchor="bottom", x=0),
                      title=dict(text=f"Simulated vs measured over {len(rows)} traces: (simulated - measured) / "
                                      "measured; shaded: within 5 % and 10 %", y=0.97),
                      yaxis_title="error (%)", xaxis_tickangle=-35, margin=dict(b=160, t=100))
    return fig


def write_validation_index_report(rows: list[dict], path: str | Path) -> Path:
    return _write_page(path, f"Validation over {len(rows)} traces", "shaded: within 5 % and 10 %",
                       validation_index_figure(rows), rows)
