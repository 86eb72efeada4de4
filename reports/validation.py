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


def write_validation_report(v: dict, path: str | Path) -> Path:
    """A self-contained page with the figure and the raw numbers."""
    path = Path(path)
    fig = validation_figure(v)
    body = fig.to_json()
    page = f"""<!doctype html><html><head><meta charset="utf-8"><title>hacksim validation</title>
<script>{get_plotlyjs()}</script></head><body style="font-family:sans-serif;margin:24px">
<h1>Validation: {html.escape(str(v['trace']))}</h1><p>scenario {html.escape(str(v['scenario']))}</p>
<div id="validation"></div>
<script>var f={body};Plotly.newPlot("validation",f.data,f.layout,{{responsive:true}});</script>
<pre>{html.escape(json.dumps(v, indent=2))}</pre></body></html>"""
    path.write_text(page)
    return path
