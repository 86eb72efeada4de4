"""The sweep report: one page of the shared template (reports/page.py; plotly.js embedded unless a
path or URL is given, works offline, no timestamp).

It reads the sweep table only. The page opens on its most informative figure: the cost figure when
configurations differ in cost, else the heatmaps (or lines) of the SLO metrics. Methods keep the
colours they have in every other report (reports/style.py). Figures:
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
from plotly.subplots import make_subplots

from reports.page import Page, Section, render_page, write_page
from reports.style import method_colours, method_label

RATE_AXIS = "workload.arrival.rate_rps"


def _esc(x) -> str:
    return html.escape(str(x))


# ---- goodput and the Pareto front ------------------------------------------------------------------------
def config_columns_of(df: pd.DataFrame, axis_paths: list[str]) -> list[str]:
    """The axes that make a configuration: all but the arrival rate (goodput is taken over it) and the
    `methods` list (the `method` column says which method the row is)."""
    return [p for p in axis_paths if p not in (RATE_AXIS, "methods") and p in df.columns]


def configurations(df: pd.DataFrame, axis_paths: list[str]) -> pd.DataFrame:
    """One row per configuration: its axis values, cost per hour, goodput and the rows it came from."""
    ok = df.loc[df["error"] == ""].copy() if "error" in df.columns else df.copy()
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
    out = pd.DataFrame(
        {
            "cost_usd_per_hour": g["cost_usd_per_hour"].first(),
            "goodput_rps": g["_goodput"].max(),
            "method": g["method"].first(),
            "rows": g.size(),
        }
    ).reset_index()
    return out


def pareto_front(conf: pd.DataFrame) -> pd.Series:
    """True for configurations that no other beats on both cost (lower) and goodput (higher)."""
    flags = pd.Series(False, index=conf.index)
    valid = conf.loc[conf["cost_usd_per_hour"].notna() & (conf["goodput_rps"] > 0)]
    best = -math.inf
    for i, r in valid.sort_values(
        ["cost_usd_per_hour", "goodput_rps"], ascending=[True, False], kind="stable"
    ).iterrows():
        if r["goodput_rps"] > best:
            flags[i] = True
            best = r["goodput_rps"]
    return flags


# ---- figures ------------------------------------------------------------------------------------------------
def cost_goodput_figure(conf: pd.DataFrame, has_slo: bool) -> go.Figure:
    conf = conf.loc[conf["cost_usd_per_hour"].notna()]
    front = pareto_front(conf)
    fig = go.Figure()
    colours = method_colours([str(m) for m in dict.fromkeys(conf["method"])])
    for method, part in conf.groupby("method", sort=False):
        fig.add_trace(
            go.Scatter(
                x=part["cost_usd_per_hour"],
                y=part["goodput_rps"],
                mode="markers",
                name=method_label(str(method)),
                marker=dict(size=9, color=colours[str(method)], opacity=0.75),
                text=part["config"],
                hovertemplate="%{text}<br>$%{x:.2f}/h, %{y:.3g} req/s<extra></extra>",
            )
        )
    pf = conf.loc[front].sort_values("cost_usd_per_hour")
    fig.add_trace(
        go.Scatter(
            x=pf["cost_usd_per_hour"],
            y=pf["goodput_rps"],
            mode="lines+markers",
            name="Pareto front",
            line=dict(color="#111827", width=1.5, shape="hv"),
            marker=dict(size=14, symbol="circle-open", color="#111827", line=dict(width=2)),
            text=pf["config"],
            hovertemplate="Pareto: %{text}<br>$%{x:.2f}/h, %{y:.3g} req/s<extra></extra>",
        )
    )
    fig.update_layout(
        height=480,
        margin=dict(l=60, r=20, t=40, b=50),
        template="plotly_white",
        title="Cost per hour against goodput" + ("" if has_slo else " (throughput: no SLOs in the sweep file)"),
        xaxis_title="cost, USD per hour",
        yaxis_title="goodput, requests/s" if has_slo else "throughput, requests/s",
    )
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
    ok = df.loc[(df["error"] == "") & df[metric].notna()] if metric in df.columns else df.iloc[0:0]
    methods = list(dict.fromkeys(ok["method"]))
    cols = min(len(methods), 3) or 1
    rows = max(1, math.ceil(len(methods) / cols))
    fig = make_subplots(
        rows=rows,
        cols=cols,
        subplot_titles=[method_label(str(m)) for m in methods] or [""],
        horizontal_spacing=0.08,
        vertical_spacing=0.16,
    )
    xs, ys = _ordered(ok[x]), _ordered(ok[y])
    lo, hi = (float(ok[metric].min()), float(ok[metric].max())) if len(ok) else (0.0, 1.0)
    for k, m in enumerate(methods):
        part = ok.loc[ok["method"] == m].assign(_x=lambda d: d[x].astype(str), _y=lambda d: d[y].astype(str))
        piv = part.pivot_table(index="_y", columns="_x", values=metric, aggfunc="median").reindex(index=ys, columns=xs)
        z = [[None if pd.isna(v) else float(v) for v in row] for row in piv.to_numpy()]
        fig.add_trace(
            go.Heatmap(
                z=z,
                x=xs,
                y=ys,
                coloraxis="coloraxis",
                texttemplate="%{z:.3g}",
                hovertemplate=f"{x}=%{{x}}<br>{y}=%{{y}}<br>{metric}=%{{z:.4g}}<extra>{m}</extra>",
            ),
            row=k // cols + 1,
            col=k % cols + 1,
        )
        fig.update_xaxes(title_text=x, type="category", row=k // cols + 1, col=k % cols + 1)
        fig.update_yaxes(title_text=y, type="category", row=k // cols + 1, col=k % cols + 1)
    agg = f" (median over {', '.join(others)})" if others else ""
    fig.update_layout(
        height=340 * rows + 60,
        margin=dict(l=70, r=20, t=70, b=50),
        template="plotly_white",
        title=f"{metric} over {x} and {y}{agg}",
        coloraxis=dict(colorscale="Viridis", cmin=lo, cmax=hi, colorbar=dict(title=metric)),
    )
    return fig


def line_figure(df: pd.DataFrame, x: str, metric: str) -> go.Figure:
    ok = df.loc[(df["error"] == "") & df[metric].notna()] if metric in df.columns else df.iloc[0:0]
    fig = go.Figure()
    xs = _ordered(ok[x])
    colours = method_colours([str(m) for m in dict.fromkeys(ok["method"])])
    for m, part in ok.groupby("method", sort=False):
        s = part.groupby(part[x].astype(str))[metric].median().reindex(xs)
        fig.add_trace(
            go.Scatter(
                x=xs, y=s.to_numpy(), mode="lines+markers", name=method_label(str(m)), line=dict(color=colours[str(m)])
            )
        )
    fig.update_layout(
        height=400,
        template="plotly_white",
        title=f"{metric} against {x}",
        xaxis_title=x,
        yaxis_title=metric,
        xaxis_type="category",
    )
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
def _table_html(df: pd.DataFrame, left: set[str], table_id: str) -> str:
    head = "".join(f'<th class="{"l" if c in left else ""}">{_esc(c)}</th>' for c in df.columns)
    body = []
    for r in df.itertuples(index=False):
        cells = []
        for c, v in zip(df.columns, r):
            txt = f"{v:.4g}" if isinstance(v, float) else v
            cells.append(f'<td class="{"l" if c in left else ""}">{_esc(txt)}</td>')
        body.append("<tr>" + "".join(cells) + "</tr>")
    return (
        f'<div class="scroll"><table id="{table_id}" class="compact"><thead><tr>{head}</tr></thead>'
        f"<tbody>{''.join(body)}</tbody></table></div>"
    )


def _glance_html(df: pd.DataFrame, conf: pd.DataFrame, slo: dict) -> str:
    """Per method: rows, rows within the SLOs, the best goodput and what its configuration costs."""
    ok = df.loc[df["error"] == ""] if "error" in df.columns else df
    methods = [str(m) for m in dict.fromkeys(df["method"])] if "method" in df.columns else []
    colours = method_colours(methods)
    rows = []
    for m in methods:
        part = ok.loc[ok["method"].astype(str) == m]
        meets = int(part["meets_slo"].sum()) if slo and "meets_slo" in part.columns else None
        best = (
            conf.loc[conf["method"].astype(str) == m]
            .sort_values(["goodput_rps", "cost_usd_per_hour"], ascending=[False, True])
            .head(1)
        )
        good = f"{best['goodput_rps'].iloc[0]:.3g} req/s" if len(best) else "–"
        cost = best["cost_usd_per_hour"].iloc[0] if len(best) else math.nan
        rows.append(
            f'<tr><td><span class="sw" style="background:{colours[m]}"></span>{_esc(method_label(m))}</td>'
            f"<td>{len(part)}</td><td>{'–' if meets is None else meets}</td><td>{_esc(good)}</td>"
            f"<td>{'–' if pd.isna(cost) else f'${cost:.2f}/h'}</td></tr>"
        )
    return (
        '<table class="glance" id="table-glance"><thead><tr><th>method</th><th>rows</th><th>within the SLOs</th>'
        f"<th>best goodput</th><th>its cost</th></tr></thead><tbody>{''.join(rows)}</tbody></table>"
    )


def sweep_page(
    df: pd.DataFrame,
    *,
    name: str,
    description: str,
    base: str,
    axis_paths: list[str],
    slo: dict,
    heatmaps=None,
    stats_line: str = "",
) -> Page:
    figures: dict[str, go.Figure] = {}
    notes: list[str] = []
    conf = configurations(df, axis_paths)
    if "cost_usd_per_hour" in conf and conf["cost_usd_per_hour"].isna().any():
        notes.append(
            f"{int(conf['cost_usd_per_hour'].isna().sum())} configuration(s) have no price per hour "
            "and are left out of the cost figure"
        )
    flat_cost = bool(len(conf)) and conf["cost_usd_per_hour"].nunique() <= 1
    cost_notes = (
        (
            f"every configuration costs ${conf['cost_usd_per_hour'].iloc[0]:.2f}/h (no instance axis), so the "
            "cost figure has one column",
        )
        if flat_cost
        else ()
    )

    def others_of(x: str, y: str) -> list[str]:
        """Axes that still vary inside one (x, y) cell, so the cell is a median over them (an axis linked
        to x or y does not)."""
        ok = df.loc[df["error"] == ""] if "error" in df.columns else df
        cells = ok.astype({x: str, y: str}).groupby([x, y], sort=False)
        return [
            p for p in axis_paths if p not in (x, y, "methods") and p in ok.columns and cells[p].nunique().max() > 1
        ]

    metric_sections = []
    for i, (x, y, metric) in enumerate(heatmap_specs(df, axis_paths, heatmaps, slo)):
        if metric not in df.columns:
            notes.append(f"heatmap: no column {metric!r} in the table")
            continue
        fid = f"heatmap-{i}" if y else f"line-{i}"
        figures[fid] = heatmap_figure(df, x, y, metric, others_of(x, y)) if y else line_figure(df, x, metric)
        lead = f"{metric} per cell, one panel per method." if y else f"{metric} against {x}, one line per method."
        metric_sections.append(Section(fid, f"{metric} over {x}" + (f" and {y}" if y else ""), lead, (fid,)))
    cost_sections = []
    if len(conf):
        figures["cost-goodput"] = cost_goodput_figure(conf, bool(slo))
        lead = (
            "One marker per configuration (axis values other than the arrival rate, and method). "
            + (
                "Goodput: the highest measured throughput among its rows that meet every SLO, so it moves in the "
                "steps of the swept rates; `plan` bisects on the rate instead."
                if slo
                else "No SLOs in the sweep file, so this is the highest measured throughput."
            )
            + " Cost counts instances only (network is not priced)."
        )
        front = conf.loc[pareto_front(conf)].sort_values("cost_usd_per_hour")
        cost_sections.append(
            Section(
                "cost-goodput",
                "Cost per hour against goodput",
                lead,
                ("cost-goodput",),
                notes=cost_notes,
                body_html="<h3>Pareto front</h3><p class='lead'>Configurations that no other "
                "beats on both cost per hour and goodput, cheapest first.</p>"
                + _table_html(
                    front[["config", "cost_usd_per_hour", "goodput_rps", "rows"]], {"config"}, "table-pareto"
                ),
            )
        )
    # Open on the most informative figure: the cost figure only when costs differ.
    sections = (metric_sections + cost_sections) if flat_cost else (cost_sections + metric_sections)
    if notes and sections:
        sections[0].notes = tuple(notes)
    elif notes:
        sections.append(Section("notes", "Notes", notes=tuple(notes)))
    errors = df.loc[df["error"] != ""] if "error" in df.columns else df.iloc[0:0]
    if len(errors):
        shown = errors[["point", "method", "error"]].head(30)
        sections.append(
            Section(
                "errors",
                f"Points that did not run ({len(errors)} rows)",
                body_html=_table_html(shown, {"method", "error"}, "table-errors"),
            )
        )
    slo_txt = ", ".join(f"{k} ≤ {v:g} s" for k, v in slo.items()) or "none"
    subtitles = (
        f"base {base} · axes {', '.join(axis_paths)}",
        f"{df['point'].nunique()} points, {len(df)} rows, {len(errors)} with errors · SLOs: {slo_txt}"
        + (f" · {stats_line}" if stats_line else ""),
    )
    return Page(
        title=f"sweep · {name}",
        heading=f"Sweep · {name}",
        description=description,
        subtitles=subtitles,
        summary_html=_glance_html(df, conf, slo),
        sections=sections,
        figures=figures,
        footer="Made by hacksim sweep from results.csv.",
    )


def render(df: pd.DataFrame, *, plotlyjs: str | None = None, **kw) -> str:
    return render_page(sweep_page(df, **kw), plotlyjs=plotlyjs)


def write_report(df: pd.DataFrame, out: Path, *, plotlyjs: str | None = None, **kw) -> Path:
    return write_page(sweep_page(df, **kw), Path(out) / "report.html", plotlyjs=plotlyjs)


def figure_names(path: Path) -> list[str]:
    """The figure div ids in a written report (for tests)."""
    import re

    return re.findall(r'id="(fig-[a-z0-9-]+)"', Path(path).read_text())
