"""The sweep report: one page of the shared template (reports/page.py; plotly.js embedded unless a
path or URL is given, works offline, no timestamp).

It reads the sweep table only. The page opens on its most informative figure: the cost figure when
configurations differ in cost, else the heatmaps (or lines) of the SLO metrics. Methods keep the
colours they have in every other report (reports/style.py). Figures:
- cost per hour against goodput for every configuration, with the Pareto front (no other
  configuration is both cheaper and higher goodput) marked;
- heatmaps of a metric over two axes, one panel per method, the median over any other axes;
- with a single varying axis, the metric against it, one line per method.

Goodput: a configuration is a row's axis values other than the arrival rate and the workload seed,
plus its method. With SLOs in the sweep file, its goodput for one seed is the highest measured
throughput among its rows that meet every target (0 if none does); without SLOs it is simply the
highest throughput. With a `workload.seed` axis a configuration's goodput is the mean over its seeds,
with their range; two configurations whose ranges overlap are a tie, since the seeds do not tell them
apart: neither dominates the other on goodput, so at one cost both stand on the Pareto front and share
a tie number. With one seed nothing shows the noise, and the page says so.

Axes and metrics are named in words with their unit (`jct_p90_s` is "JCT p90 (s)"); a heatmap cell
where every run meets the SLOs carries a ✓.
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
SEED_AXIS = "workload.seed"
MEETS = "✓"
_WORDS = {"jct": "JCT", "ttft": "TTFT", "tpot": "TPOT", "kv": "KV", "usd": "USD", "gpu": "GPU", "slo": "SLO"}


def _esc(x) -> str:
    return html.escape(str(x))


# Units by the end of a column's name (the house's unit suffixes), longest first.
UNIT_SUFFIXES = (
    ("_bytes_per_token", "bytes/token"),
    ("_bytes_per_gpu", "bytes"),
    ("_usd_per_hour", "USD/h"),
    ("_bytes", "bytes"),
    ("_gbps", "Gbit/s"),
    ("_rps", "requests/s"),
    ("_gib", "GiB"),
    ("_s", "s"),
)


def column_unit(column: str) -> str | None:
    """The unit of a results column, from its name: `jct_p90_s` -> s; utilisation is a fraction of capacity."""
    if column.startswith("utilisation_") or column.endswith("_utilization"):
        return "fraction of capacity"
    return next((unit for suffix, unit in UNIT_SUFFIXES if column.endswith(suffix)), None)


def readable(column: str) -> str:
    """A column or axis path in words with its unit: `jct_p90_s` -> "JCT p90 (s)",
    `network.bandwidth_gbps` -> "network bandwidth (Gbit/s)", `methods.0.partition` -> "methods[0] partition"."""
    unit = column_unit(column)
    stem = column
    for suffix, u in UNIT_SUFFIXES:
        if u == unit and column.endswith(suffix):
            stem = column[: -len(suffix)]
            break
    parts: list[str] = []
    for part in stem.split("."):
        if part.isdigit() and parts:
            parts[-1] += f"[{part}]"
        else:
            parts.append(" ".join(_WORDS.get(w, w) for w in part.split("_") if w))
    text = " ".join(parts)
    return f"{text} ({unit})" if unit else text


# ---- goodput and the Pareto front ------------------------------------------------------------------------
def config_columns_of(df: pd.DataFrame, axis_paths: list[str]) -> list[str]:
    """The axes that make a configuration: all but the arrival rate (goodput is taken over it), the
    workload seed (goodput is averaged over it) and the `methods` list (the `method` column says which
    method the row is)."""
    return [p for p in axis_paths if p not in (RATE_AXIS, SEED_AXIS, "methods") and p in df.columns]


def seed_column(df: pd.DataFrame) -> str | None:
    """The column holding each row's workload seed: the swept axis, else the table's `seed`."""
    return next((c for c in (SEED_AXIS, "seed") if c in df.columns), None)


def configurations(df: pd.DataFrame, axis_paths: list[str]) -> pd.DataFrame:
    """One row per configuration: its axis values, cost per hour, goodput (the mean over its seeds, with
    their minimum and maximum), how many seeds and rows it came from."""
    ok = df.loc[df["error"] == ""].copy() if "error" in df.columns else df.copy()
    if ok.empty:
        return pd.DataFrame(
            columns=["config", "cost_usd_per_hour", "goodput_rps", "goodput_min_rps", "goodput_max_rps", "seeds"]
        )
    keys = config_columns_of(ok, axis_paths)
    good = ok["throughput_rps"].where(ok["meets_slo"], 0.0) if "meets_slo" in ok.columns else ok["throughput_rps"]
    ok["_goodput"] = good.astype(float)
    label = ok["method"].astype(str)
    for k in reversed(keys):
        label = k + "=" + ok[k].astype(str) + ", " + label
    ok["config"] = label
    seed = seed_column(ok)
    ok["_seed"] = ok[seed].astype(str) if seed is not None else ""
    per_seed = ok.groupby(["config", "_seed"], sort=False)["_goodput"].max()  # the best rate within the SLOs
    g, by_seed = ok.groupby("config", sort=False), per_seed.groupby(level="config", sort=False)
    out = pd.DataFrame(
        {
            "cost_usd_per_hour": g["cost_usd_per_hour"].first(),
            "goodput_rps": by_seed.mean(),
            "goodput_min_rps": by_seed.min(),
            "goodput_max_rps": by_seed.max(),
            "seeds": by_seed.size(),
            "method": g["method"].first(),
            "rows": g.size(),
        }
    ).reset_index()
    return out


def _range(conf: pd.DataFrame, i) -> tuple[float, float]:
    r = conf.loc[i]
    lo = r["goodput_min_rps"] if "goodput_min_rps" in conf.columns else r["goodput_rps"]
    hi = r["goodput_max_rps"] if "goodput_max_rps" in conf.columns else r["goodput_rps"]
    return float(lo), float(hi)


def pareto_front(conf: pd.DataFrame) -> pd.Series:
    """True for configurations that no other dominates: one dominates another when it costs no more and
    its goodput is clearly higher (its lowest seed above the other's highest), or costs less and is not
    clearly lower. Goodputs whose seed ranges overlap are ties; with one seed that is equality."""
    flags = pd.Series(False, index=conf.index)
    valid = conf.loc[conf["cost_usd_per_hour"].notna() & (conf["goodput_rps"] > 0)]
    for i in valid.index:
        cost_i, (lo_i, hi_i) = valid.at[i, "cost_usd_per_hour"], _range(valid, i)
        dominated = False
        for j in valid.index:
            if j == i:
                continue
            cost_j, (lo_j, hi_j) = valid.at[j, "cost_usd_per_hour"], _range(valid, j)
            higher, lower = lo_j > hi_i, hi_j < lo_i
            if (cost_j <= cost_i and higher) or (cost_j < cost_i and not lower):
                dominated = True
                break
        flags[i] = not dominated
    return flags


def tie_groups(conf: pd.DataFrame, front: pd.Series) -> dict:
    """Configurations on the front at one cost whose goodputs cannot be told apart (seed ranges that overlap,
    directly or through others), numbered 1, 2, ... cheapest first: {index: group}; one alone has none."""
    on = conf.loc[front].sort_values(["cost_usd_per_hour", "goodput_rps"], ascending=[True, False], kind="stable")
    groups: dict = {}
    members: list[list] = []
    for i in on.index:
        lo_i, hi_i = _range(on, i)
        for group in members:
            j = group[-1]
            if on.at[j, "cost_usd_per_hour"] == on.at[i, "cost_usd_per_hour"] and not (
                _range(on, j)[0] > hi_i or _range(on, j)[1] < lo_i
            ):
                group.append(i)
                break
        else:
            members.append([i])
    n = 0
    for group in members:
        if len(group) > 1:
            n += 1
            groups.update({i: n for i in group})
    return groups


# ---- figures ------------------------------------------------------------------------------------------------
def cost_goodput_figure(conf: pd.DataFrame, has_slo: bool) -> go.Figure:
    conf = conf.loc[conf["cost_usd_per_hour"].notna()]
    front = pareto_front(conf)
    fig = go.Figure()
    colours = method_colours([str(m) for m in dict.fromkeys(conf["method"])])
    spread = "seeds" in conf.columns and bool((conf["seeds"] > 1).any())
    for method, part in conf.groupby("method", sort=False):
        fig.add_trace(
            go.Scatter(
                x=part["cost_usd_per_hour"],
                y=part["goodput_rps"],
                mode="markers",
                name=method_label(str(method)),
                marker=dict(size=9, color=colours[str(method)], opacity=0.75),
                error_y=dict(
                    type="data",
                    symmetric=False,
                    array=(part["goodput_max_rps"] - part["goodput_rps"]).to_numpy(),
                    arrayminus=(part["goodput_rps"] - part["goodput_min_rps"]).to_numpy(),
                    thickness=1.2,
                    width=4,
                )
                if spread
                else None,
                text=part["config"],
                hovertemplate="%{text}<br>$%{x:.2f}/h, %{y:.3g} req/s"
                + (" (mean over seeds; bar: their range)" if spread else "")
                + "<extra></extra>",
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
    """`metric` per (x, y) cell, one panel per method, the median over `others`; a cell where every run
    meets the SLOs (the table's `meets_slo`) carries a ✓ after its value."""
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
    has_slo = "meets_slo" in ok.columns
    rx, ry, rm = readable(x), readable(y), readable(metric)
    for k, m in enumerate(methods):
        part = ok.loc[ok["method"] == m].assign(_x=lambda d: d[x].astype(str), _y=lambda d: d[y].astype(str))
        piv = part.pivot_table(index="_y", columns="_x", values=metric, aggfunc="median").reindex(index=ys, columns=xs)
        z = [[None if pd.isna(v) else float(v) for v in row] for row in piv.to_numpy()]
        meets = (
            part.assign(_m=part["meets_slo"].astype(float))
            .pivot_table(index="_y", columns="_x", values="_m", aggfunc="mean")
            .reindex(index=ys, columns=xs)
            .to_numpy()
            if has_slo
            else None
        )
        text = [
            [
                "" if v is None else f"{v:.3g}" + (f" {MEETS}" if meets is not None and meets[i][j] == 1 else "")
                for j, v in enumerate(row)
            ]
            for i, row in enumerate(z)
        ]
        share = (
            [[("–" if pd.isna(f) else f"{100 * f:.0f}%") for f in row] for row in meets] if meets is not None else None
        )
        fig.add_trace(
            go.Heatmap(
                z=z,
                x=xs,
                y=ys,
                text=text,
                customdata=share,
                coloraxis="coloraxis",
                texttemplate="%{text}",
                hovertemplate=f"{rx} = %{{x}}<br>{ry} = %{{y}}<br>{rm} = %{{z:.4g}}"
                + ("<br>runs meeting the SLOs: %{customdata}" if has_slo else "")
                + f"<extra>{method_label(str(m))}</extra>",
            ),
            row=k // cols + 1,
            col=k % cols + 1,
        )
        fig.update_xaxes(title_text=rx, type="category", row=k // cols + 1, col=k % cols + 1)
        fig.update_yaxes(title_text=ry, type="category", row=k // cols + 1, col=k % cols + 1)
    agg = f" (median over {', '.join(readable(o) for o in others)})" if others else ""
    fig.update_layout(
        height=340 * rows + 60,
        margin=dict(l=70, r=20, t=70, b=50),
        template="plotly_white",
        title=f"{rm} over {rx} and {ry}{agg}" + (f"; {MEETS}: every run meets the SLOs" if has_slo else ""),
        coloraxis=dict(colorscale="Viridis", cmin=lo, cmax=hi, colorbar=dict(title=rm)),
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
        title=f"{readable(metric)} against {readable(x)}",
        xaxis_title=readable(x),
        yaxis_title=readable(metric),
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


def _goodput_text(r) -> str:
    """`1.2 req/s`, or with several seeds `1.2 req/s (1.1–1.3 over 3 seeds)`."""
    text = f"{r['goodput_rps']:.3g} req/s"
    if r.get("seeds", 1) > 1:
        text += f" ({r['goodput_min_rps']:.3g}–{r['goodput_max_rps']:.3g} over {int(r['seeds'])} seeds)"
    return text


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
        good = _goodput_text(best.iloc[0]) if len(best) else "–"
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
        lead = (
            f"{readable(metric)} per cell, one panel per method"
            + (f"; {MEETS} marks a cell where every run meets the SLOs." if slo and "meets_slo" in df.columns else ".")
            if y
            else f"{readable(metric)} against {readable(x)}, one line per method."
        )
        heading = f"{readable(metric)} over {readable(x)}" + (f" and {readable(y)}" if y else "")
        metric_sections.append(Section(fid, heading, lead, (fid,)))
    cost_sections = []
    if len(conf):
        figures["cost-goodput"] = cost_goodput_figure(conf, bool(slo))
        lead = (
            "One marker per configuration (axis values other than the arrival rate and the seed, and method). "
            + (
                "Goodput: the highest measured throughput among its rows that meet every SLO, so it moves in the "
                "steps of the swept rates; `plan` bisects on the rate instead."
                if slo
                else "No SLOs in the sweep file, so this is the highest measured throughput."
            )
            + " Cost counts instances only (network is not priced)."
        )
        on_front = pareto_front(conf)
        groups = tie_groups(conf, on_front)
        sizes = pd.Series(groups).value_counts().to_dict() if groups else {}
        front = conf.loc[on_front].assign(
            tie=lambda d: [
                f"tie {groups[i]} ({sizes[groups[i]]} configurations)" if i in groups else "" for i in d.index
            ]
        )
        front = front.sort_values(["cost_usd_per_hour", "goodput_rps"], ascending=[True, False], kind="stable")
        seeds = int(conf["seeds"].max()) if "seeds" in conf.columns and len(conf) else 1
        if seeds > 1:
            lead += (
                f" Goodput is the mean over {seeds} workload seeds; the bars and the range column give the lowest and "
                "highest seed. Configurations whose ranges overlap cannot be told apart: they are ties."
            )
            shown = front.assign(
                goodput_range_rps=[
                    f"{a:.4g}–{b:.4g}" for a, b in zip(front["goodput_min_rps"], front["goodput_max_rps"])
                ]
            )[["config", "cost_usd_per_hour", "goodput_rps", "goodput_range_rps", "seeds", "tie"]]
        else:
            shown = front[["config", "cost_usd_per_hour", "goodput_rps", "rows", "tie"]]
        seed_notes = (
            ()
            if seeds > 1
            else (
                "Each configuration ran with one workload seed, so a goodput difference here may be seed-to-seed "
                "noise, which nothing in this sweep measures, and only exact equality is called a tie: add a "
                f"{SEED_AXIS} axis (e.g. [0, 1, 2]) to see the spread and call ties ties.",
            )
        )
        cost_sections.append(
            Section(
                "cost-goodput",
                "Cost per hour against goodput",
                lead,
                ("cost-goodput",),
                notes=cost_notes + seed_notes,
                body_html="<h3>Pareto front</h3><p class='lead'>Configurations that no other "
                "beats on both cost per hour and goodput, cheapest first; configurations at one cost whose "
                "goodputs the seeds cannot tell apart share a tie number.</p>"
                + _table_html(shown, {"config", "tie"}, "table-pareto"),
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


def write_report(
    df: pd.DataFrame, out: Path, *, plotlyjs: str | None = None, page_dir: Path | None = None, **kw
) -> Path:
    """`out/report.html`; `page_dir`: the folder the page moves to, when `out` is a temporary one."""
    page_path = None if page_dir is None else Path(page_dir) / "report.html"
    return write_page(sweep_page(df, **kw), Path(out) / "report.html", plotlyjs=plotlyjs, page_path=page_path)


def figure_names(path: Path) -> list[str]:
    """The figure div ids in a written report (for tests)."""
    import re

    return re.findall(r'id="(fig-[a-z0-9-]+)"', Path(path).read_text())
