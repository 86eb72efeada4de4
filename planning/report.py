"""The sweep report: one self-contained HTML page (plotly.js inlined, works offline, no timestamp).

It reads the sweep table only. Figures:
- cost per hour against goodput for every configuration, with the Pareto front (no other
  configuration is both cheaper and higher goodput) marked;
- heatmaps of a metric over two axes, one panel per method, the median over any other axes;
- with a single varying axis, the metric against it, one line per method.

Goodput: a configuration is a row's axis values other than the arrival rate, plus its method.
With SLOs in the sweep file, its goodput is the highest measured throughput among its rows that
meet every target (0 if none does); without SLOs it is simply the highest throughput.
"""
from __future__ import annotations

import html
import math
from pathlib import Path

import pandas as pd
import plotly.graph_objects as go
from plotly.offline import get_plotlyjs
from plotly.subplots import make_subplots

RATE_AXIS = "workload.arrival.rate_rps"
PALETTE = ("#2563eb", "#dc2626", "#059669", "#d97706", "#7c3aed", "#0891b2", "#db2777", "#4b5563")

CSS = """
body { margin:0; background:#f3f4f6; color:#1f2937; font:14px/1.5 -apple-system,'Segoe UI',Roboto,Arial,sans-serif; }
header { background:#111827; color:#f9fafb; padding:22px 36px; }
header h1 { margin:0 0 4px; font-size:24px; } header .sub { color:#9ca3af; font-size:13px; }
main { max-width:1320px; margin:0 auto; padding:12px 24px 40px; }
section { background:#fff; border:1px solid #e5e7eb; border-radius:10px; padding:16px 20px; margin:16px 0; }
section h2 { margin:0 0 4px; font-size:18px; } p.lead { margin:0 0 10px; color:#6b7280; }
.note { background:#fffbeb; border:1px solid #fde68a; color:#92400e; border-radius:8px; padding:6px 10px; margin:8px 0; }
table { border-collapse:collapse; font-size:12.5px; } td, th { padding:3px 8px; border-bottom:1px solid #e5e7eb; text-align:right; }
th { background:#f9fafb; } td.l, th.l { text-align:left; }
"""


def _esc(x) -> str:
    return html.escape(str(x))


# ---- goodput and the Pareto front ------------------------------------------------------------------------
def config_columns_of(df: pd.DataFrame, axis_paths: list[str]) -> list[str]:
    """The axes that make a configuration: all but the arrival rate (goodput is taken over it) and the
    `methods` list (the `method` column says which method the row is)."""
    return [p for p in axis_paths if p not in (RATE_AXIS, "methods") and p in df.columns]


def configurations(df: pd.DataFrame, axis_paths: list[str]) -> pd.DataFrame:
    """One row per configuration: its axis values, cost per hour, goodput and the rows it came from."""
    ok = df[df["error"] == ""].copy() if "error" in df.columns else df.copy()
    if ok.empty:
        return pd.DataFrame(columns=["config", "cost_usd_per_hour", "goodput_rps"])
    keys = config_columns_of(ok, axis_paths)
    good = ok["throughput_rps"].where(ok["meets_slo"], 0.0) if "meets_slo" in ok.columns else ok["throughput_rps"]
    ok["_goodput"] = good.astype(float)
    label = ok["method"].astype(str)
    for k in reversed(keys):
        label = k + "=" + ok[k].astype(str) + ", " + label
    ok["config"] = label
    g = ok.groupby("config", sort=False)
    out = pd.DataFrame({"cost_usd_per_hour": g["cost_usd_per_hour"].first(), "goodput_rps": g["_goodput"].max(),
                        "method": g["method"].first(), "rows": g.size()}).reset_index()
    return out


def pareto_front(conf: pd.DataFrame) -> pd.Series:
    """True for configurations that no other beats on both cost (lower) and goodput (higher)."""
    flags = pd.Series(False, index=conf.index)
    valid = conf[conf["cost_usd_per_hour"].notna() & (conf["goodput_rps"] > 0)]
    best = -math.inf
    for i, r in valid.sort_values(["cost_usd_per_hour", "goodput_rps"], ascending=[True, False], kind="stable").iterrows():
        if r["goodput_rps"] > best:
            flags[i] = True
            best = r["goodput_rps"]
    return flags


# ---- figures ------------------------------------------------------------------------------------------------
def cost_goodput_figure(conf: pd.DataFrame, has_slo: bool) -> go.Figure:
    conf = conf[conf["cost_usd_per_hour"].notna()]
    front = pareto_front(conf)
    fig = go.Figure()
    for k, (method, part) in enumerate(conf.groupby("method", sort=False)):
        fig.add_trace(go.Scatter(
            x=part["cost_usd_per_hour"], y=part["goodput_rps"], mode="markers", name=str(method),
            marker=dict(size=9, color=PALETTE[k % len(PALETTE)], opacity=0.75),
            text=part["config"], hovertemplate="%{text}<br>$%{x:.2f}/h, %{y:.3g} req/s<extra></extra>"))
    pf = conf[front].sort_values("cost_usd_per_hour")
    fig.add_trace(go.Scatter(
        x=pf["cost_usd_per_hour"], y=pf["goodput_rps"], mode="lines+markers", name="Pareto front",
        line=dict(color="#111827", width=1.5, shape="hv"),
        marker=dict(size=14, symbol="circle-open", color="#111827", line=dict(width=2)),
        text=pf["config"], hovertemplate="Pareto: %{text}<br>$%{x:.2f}/h, %{y:.3g} req/s<extra></extra>"))
    fig.update_layout(
        height=480, margin=dict(l=60, r=20, t=40, b=50), template="plotly_white",
        title="Cost per hour against goodput" + ("" if has_slo else " (throughput: no SLOs in the sweep file)"),
        xaxis_title="cost, USD per hour", yaxis_title="goodput, requests/s" if has_slo else "throughput, requests/s")
    return fig


def _ordered(values) -> list[str]:
    seen = []
    for v in values:
        if str(v) not in seen:
            seen.append(str(v))
    try:
        return sorted(seen, key=float)
    except ValueError:
        return seen


def heatmap_figure(df: pd.DataFrame, x: str, y: str, metric: str, others: list[str]) -> go.Figure:
    ok = df[(df["error"] == "") & df[metric].notna()] if metric in df.columns else df.iloc[0:0]
    methods = list(dict.fromkeys(ok["method"]))
    cols = min(len(methods), 3) or 1
    rows = max(1, math.ceil(len(methods) / cols))
    fig = make_subplots(rows=rows, cols=cols, subplot_titles=methods or [""], horizontal_spacing=0.08,
                        vertical_spacing=0.16)
    xs, ys = _ordered(ok[x]), _ordered(ok[y])
    lo, hi = (float(ok[metric].min()), float(ok[metric].max())) if len(ok) else (0.0, 1.0)
    for k, m in enumerate(methods):
        part = ok[ok["method"] == m].assign(_x=lambda d: d[x].astype(str), _y=lambda d: d[y].astype(str))
        piv = part.pivot_table(index="_y", columns="_x", values=metric, aggfunc="median").reindex(index=ys, columns=xs)
        z = [[None if pd.isna(v) else float(v) for v in row] for row in piv.to_numpy()]
        fig.add_trace(go.Heatmap(
            z=z, x=xs, y=ys, coloraxis="coloraxis", texttemplate="%{z:.3g}",
            hovertemplate=f"{x}=%{{x}}<br>{y}=%{{y}}<br>{metric}=%{{z:.4g}}<extra>{m}</extra>"),
            row=k // cols + 1, col=k % cols + 1)
        fig.update_xaxes(title_text=x, type="category", row=k // cols + 1, col=k % cols + 1)
        fig.update_yaxes(title_text=y, type="category", row=k // cols + 1, col=k % cols + 1)
    agg = f" (median over {', '.join(others)})" if others else ""
    fig.update_layout(height=340 * rows + 60, margin=dict(l=70, r=20, t=70, b=50), template="plotly_white",
                      title=f"{metric} over {x} and {y}{agg}",
                      coloraxis=dict(colorscale="Viridis", cmin=lo, cmax=hi, colorbar=dict(title=metric)))
    return fig


def line_figure(df: pd.DataFrame, x: str, metric: str) -> go.Figure:
    ok = df[(df["error"] == "") & df[metric].notna()] if metric in df.columns else df.iloc[0:0]
    fig = go.Figure()
    xs = _ordered(ok[x])
    for k, (m, part) in enumerate(ok.groupby("method", sort=False)):
        s = part.groupby(part[x].astype(str))[metric].median().reindex(xs)
        fig.add_trace(go.Scatter(x=xs, y=s.to_numpy(), mode="lines+markers", name=str(m),
                                 line=dict(color=PALETTE[k % len(PALETTE)])))
    fig.update_layout(height=400, template="plotly_white", title=f"{metric} against {x}", xaxis_title=x,
                      yaxis_title=metric, xaxis_type="category")
    return fig


def heatmap_specs(df: pd.DataFrame, axis_paths: list[str], requested, slo: dict) -> list[tuple[str, str, str]]:
    if requested:
        return [(h.x, h.y, h.metric) for h in requested]
    varying = [p for p in axis_paths if p in df.columns and p != "methods" and df[p].astype(str).nunique() > 1]
    metrics = list(slo) or ["jct_p90_s", "ttft_p99_s"]
    if len(varying) >= 2:
        return [(varying[0], varying[1], m) for m in metrics]
    if len(varying) == 1:
        return [(varying[0], "", m) for m in metrics]
    return []


# ---- the page -------------------------------------------------------------------------------------------------
def _table_html(df: pd.DataFrame, left: set[str]) -> str:
    head = "".join(f'<th class="{"l" if c in left else ""}">{_esc(c)}</th>' for c in df.columns)
    body = []
    for r in df.itertuples(index=False):
        cells = []
        for c, v in zip(df.columns, r):
            txt = f"{v:.4g}" if isinstance(v, float) else v
            cells.append(f'<td class="{"l" if c in left else ""}">{_esc(txt)}</td>')
        body.append("<tr>" + "".join(cells) + "</tr>")
    return f"<table><tr>{head}</tr>{''.join(body)}</table>"


def render(df: pd.DataFrame, *, name: str, description: str, base: str, axis_paths: list[str], slo: dict,
           heatmaps=None, stats_line: str = "") -> str:
    figures: list[tuple[str, go.Figure]] = []
    notes: list[str] = []
    conf = configurations(df, axis_paths)
    if "cost_usd_per_hour" in conf and conf["cost_usd_per_hour"].isna().any():
        notes.append(f"{int(conf['cost_usd_per_hour'].isna().sum())} configuration(s) have no price per hour "
                     "and are left out of the cost figure")
    if len(conf) and conf["cost_usd_per_hour"].nunique() == 1:
        notes.append(f"every configuration costs ${conf['cost_usd_per_hour'].iloc[0]:.2f}/h (no instance axis), so "
                     "the cost figure has one column")
    if len(conf):
        figures.append(("cost-goodput", cost_goodput_figure(conf, bool(slo))))
    def others_of(x: str, y: str) -> list[str]:
        """Axes that still vary inside one (x, y) cell, so the cell is a median over them (an axis linked
        to x or y does not)."""
        ok = df[df["error"] == ""] if "error" in df.columns else df
        cells = ok.astype({x: str, y: str}).groupby([x, y], sort=False)
        return [p for p in axis_paths if p not in (x, y, "methods") and p in ok.columns
                and cells[p].nunique().max() > 1]
    for i, (x, y, metric) in enumerate(heatmap_specs(df, axis_paths, heatmaps, slo)):
        if metric not in df.columns:
            notes.append(f"heatmap: no column {metric!r} in the table")
            continue
        if y:
            figures.append((f"heatmap-{i}", heatmap_figure(df, x, y, metric, others_of(x, y))))
        else:
            figures.append((f"line-{i}", line_figure(df, x, metric)))
    errors = df[df["error"] != ""] if "error" in df.columns else df.iloc[0:0]
    sections = []
    if notes:
        sections.append("".join(f'<div class="note">{_esc(n)}</div>' for n in notes))
    leads = {"cost-goodput": "One marker per configuration (axis values other than the arrival rate, and method). "
             + ("Goodput: the highest measured throughput among its rows that meet every SLO, so it moves in the "
                "steps of the swept rates; `plan` bisects on the rate instead." if slo else
                "No SLOs in the sweep file, so this is the highest measured throughput.")
             + " Cost counts instances only (network is not priced)."}
    for fid, fig in figures:
        div = fig.to_html(full_html=False, include_plotlyjs=False, div_id=f"fig-{fid}",
                          config={"displaylogo": False})
        lead = f'<p class="lead">{_esc(leads[fid])}</p>' if fid in leads else ""
        sections.append(f"<section>{lead}{div}</section>")
    if len(conf):
        front = conf[pareto_front(conf)].sort_values("cost_usd_per_hour")
        sections.append('<section><h2>Pareto front</h2><p class="lead">Configurations that no other beats on both '
                        'cost per hour and goodput, cheapest first.</p>'
                        + _table_html(front[["config", "cost_usd_per_hour", "goodput_rps", "rows"]], {"config"})
                        + "</section>")
    if len(errors):
        shown = errors[["point", "method", "error"]].head(30)
        sections.append(f'<section><h2>Points that did not run ({len(errors)} rows)</h2>'
                        + _table_html(shown, {"method", "error"}) + "</section>")
    slo_txt = ", ".join(f"{k} ≤ {v:g} s" for k, v in slo.items()) or "none"
    header = (f"<header><h1>Sweep · {_esc(name)}</h1><div class='sub'>{_esc(description)}</div>"
              f"<div class='sub'>base {_esc(base)} · axes {_esc(', '.join(axis_paths))} · "
              f"{df['point'].nunique()} points, {len(df)} rows, {len(errors)} with errors · SLOs: {_esc(slo_txt)}"
              f"{' · ' + _esc(stats_line) if stats_line else ''}</div></header>")
    return ("<!DOCTYPE html>\n<html lang='en'><head><meta charset='utf-8'>"
            f"<title>hacksim sweep · {_esc(name)}</title><style>{CSS}</style>"
            f"<script type='text/javascript'>{get_plotlyjs()}</script></head><body>{header}<main>"
            + "".join(sections) + "</main></body></html>\n")


def write_report(df: pd.DataFrame, out: Path, **kw) -> Path:
    import os

    path = Path(out) / "report.html"
    tmp = path.with_suffix(".html.tmp")
    tmp.write_text(render(df, **kw))
    os.replace(tmp, path)
    return path


def figure_names(path: Path) -> list[str]:
    """The figure div ids in a written report (for tests)."""
    import re

    return re.findall(r'id="(fig-[a-z0-9-]+)"', Path(path).read_text())
