"""The report's figures, as plotly Figures built from a loaded run (pure: no I/O).

``make_figures(run)`` returns name -> Figure; a figure whose data is absent is left out and the
reason is in ``figure_notes(run)``. Step-function series (memory, link throughput) and CDFs are
thinned to at most ``max_points`` points per trace so the page stays small: a step series keeps
each time bucket's minimum and maximum (peaks survive), a CDF keeps evenly spaced order statistics
(every kept point lies exactly on the empirical CDF).
"""

from __future__ import annotations

import math
from typing import Any, cast

import numpy as np
import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from .data import BREAKDOWN_PARTS, RunData, parts_in_words
from .style import (
    PART_COLOURS,
    PART_LABELS,
    base_layout,
    method_colours,
    method_label,
)

MAX_POINTS = 5000  # per trace; above this a series is thinned
MAX_PANELS = 8  # replicas or links drawn; the busiest are kept
GIB = 2**30

# Latency metrics drawn as CDFs: column, title, axis unit and the factor from seconds to it.
CDF_METRICS = (
    ("jct_s", "Job completion time (JCT)", "s", 1.0),
    ("ttft_s", "Time to first token (TTFT)", "s", 1.0),
    ("tpot_s", "Time per output token (TPOT)", "ms", 1e3),
)


# ----------------------------------------------------------------------------- thinning


def thin_step(t: np.ndarray, y: np.ndarray, max_points: int = MAX_POINTS) -> tuple[np.ndarray, np.ndarray]:
    """Thin a step series to <= max_points, keeping each time bucket's first, min and max points."""
    t, y = np.asarray(t, float), np.asarray(y, float)
    n = len(t)
    if n <= max_points:
        return t, y
    n_buckets = max(1, max_points // 3)
    span = t[-1] - t[0]
    bucket = np.minimum(((t - t[0]) / span * n_buckets).astype(int), n_buckets - 1) if span > 0 else np.zeros(n, int)
    df = pd.DataFrame({"b": bucket, "y": y, "i": np.arange(n)})
    g = df.groupby("b", sort=True)
    keep = np.unique(
        np.concatenate(
            [
                g["i"].first().to_numpy(),
                df.loc[g["y"].idxmin(), "i"].to_numpy(),
                df.loc[g["y"].idxmax(), "i"].to_numpy(),
                [n - 1],
            ]
        )
    )
    return t[keep], y[keep]


def ecdf(values, max_points: int = MAX_POINTS) -> tuple[np.ndarray, np.ndarray]:
    """Empirical CDF points (x sorted, fraction <= x), at most max_points of them."""
    x = np.sort(np.asarray(values, float))
    x = x[np.isfinite(x)]
    n = len(x)
    if n == 0:
        return x, x
    idx = np.arange(n) if n <= max_points else np.unique(np.linspace(0, n - 1, max_points).round().astype(int))
    return x[idx], (idx + 1) / n


# ----------------------------------------------------------------------------- figures


def _breakdown_means(run: RunData) -> pd.DataFrame:
    """Mean seconds per (method, part): from summary.json, else averaged from requests.csv."""
    rows = {}
    for m in run.methods:
        b = (run.summary["methods"].get(m) or {}).get("breakdown_s")
        if b:
            rows[m] = {p: float(b.get(p, 0.0) or 0.0) for p in BREAKDOWN_PARTS}
        elif run.requests is not None:
            r = run.requests[run.requests["method"] == m]
            rows[m] = {p: float(r[f"{p}_s"].mean()) if f"{p}_s" in r else 0.0 for p in BREAKDOWN_PARTS}
    return pd.DataFrame.from_dict(rows, orient="index", columns=list(BREAKDOWN_PARTS))


def fig_breakdown(run: RunData) -> go.Figure | None:
    means = _breakdown_means(run)
    if means.empty:
        return None
    labels = [method_label(m) for m in means.index]
    total = means.sum(axis=1)
    fig = go.Figure()
    for p in BREAKDOWN_PARTS:
        share = np.where(total > 0, means[p] / total.replace(0, np.nan) * 100, 0.0)
        fig.add_bar(
            name=PART_LABELS[p],
            x=labels,
            y=means[p],
            marker_color=PART_COLOURS[p],
            customdata=np.stack([share, total], axis=-1),
            hovertemplate=(
                f"<b>%{{x}}</b><br>{PART_LABELS[p]}: %{{y:.4g}} s"
                "<br>%{customdata[0]:.1f}% of mean JCT (%{customdata[1]:.4g} s)<extra></extra>"
            ),
        )
    fig.add_scatter(
        # Lifted a little: "top center" alone lets the label touch the bar's top edge.
        x=labels,
        y=total + float(total.max()) * 0.012,
        mode="text",
        text=[f"{v:.3g} s" for v in total],
        textposition="top center",
        showlegend=False,
        hoverinfo="skip",
        textfont=dict(size=12, color="#374151"),
    )
    fig.update_layout(
        base_layout(
            f"Where a request's time goes: mean JCT in {parts_in_words()} parts",
            barmode="stack",
            yaxis_title="mean time per request (s)",
            xaxis_title=None,
            legend=dict(orientation="h", yanchor="top", y=-0.1, xanchor="left", x=0, title=None, traceorder="normal"),
            margin=dict(l=70, r=30, t=60, b=70),
            height=440,
        )
    )
    fig.update_yaxes(range=[0, float(total.max()) * 1.14 or 1])
    return fig


def fig_cdf(
    run: RunData, column: str, title: str, unit: str, scale: float, max_points: int = MAX_POINTS
) -> go.Figure | None:
    if run.requests is None or column not in run.requests:
        return None
    colours = method_colours(run.methods, run.kinds)
    fig = go.Figure()
    short = title.split("(")[-1].rstrip(")")
    for m in run.methods:
        vals = run.requests.loc[run.requests["method"] == m, column].to_numpy(float) * scale
        x, y = ecdf(vals, max_points)
        if len(x) == 0:
            continue
        fig.add_scatter(
            x=x,
            y=y,
            name=method_label(m),
            mode="lines",
            line=dict(color=colours[m], width=2.2, shape="hv"),
            hovertemplate=f"<b>{method_label(m)}</b><br>{short} ≤ %{{x:.4g}} {unit}<br>for %{{y:.1%}} of requests<extra></extra>",
        )
    if not fig.data:
        return None
    pooled = run.requests[column].to_numpy(float) * scale
    pooled = pooled[np.isfinite(pooled) & (pooled > 0)]
    # A long tail (p99 > 4x median) squeezes the body of every curve against the axis: use log x.
    log_x = len(pooled) > 0 and np.percentile(pooled, 99) > 4 * np.percentile(pooled, 50)
    # Bottom-right inside the axes: a CDF is near 100% there, so the corner is empty.
    fig.update_layout(
        base_layout(
            f"CDF of {title[0].lower() + title[1:]}",
            height=430,
            xaxis_title=f"{short} ({unit})",
            yaxis_title="fraction of requests",
            legend=dict(
                orientation="v",
                yanchor="bottom",
                y=0.03,
                xanchor="right",
                x=0.99,
                bgcolor="rgba(255,255,255,0.85)",
                bordercolor="#e5e7eb",
                borderwidth=1,
                font=dict(size=11),
            ),
            margin=dict(l=60, r=20, t=75, b=55),
        )
    )
    # Title just above the axes, clear of the mode bar in the top-right corner of a narrow figure.
    fig.update_layout(title=dict(yref="paper", y=1, yanchor="bottom", pad=dict(b=12)))
    fig.update_yaxes(range=[0, 1.02], tickformat=".0%")
    if log_x:
        ticks = _ticks_125(float(pooled.min()), float(pooled.max()))
        fig.update_xaxes(
            type="log", title_text=f"{short} ({unit}, log scale)", tickvals=ticks, ticktext=[f"{v:g}" for v in ticks]
        )
    for q in (0.5, 0.9):
        fig.add_hline(y=q, line=dict(color="#9ca3af", width=1, dash="dot"))
    return fig


def _ticks_125(lo: float, hi: float) -> list[float]:
    """1-2-5 tick values spanning [lo, hi] (log axes label only decades or odd digits otherwise)."""
    out = []
    for e in range(int(math.floor(math.log10(lo))), int(math.ceil(math.log10(hi))) + 1):
        out += [d * 10.0**e for d in (1, 2, 5)]
    inside = [v for v in out if lo <= v <= hi]
    below = [v for v in out if v < lo][-1:]
    above = [v for v in out if v > hi][:1]
    return [float(f"{v:.6g}") for v in below + inside + above]


def _busiest(df: pd.DataFrame, key: str, value: str, limit: int) -> list:
    order = cast(pd.Series, df.groupby(key)[value].mean()).sort_values(ascending=False)
    keys = list(order.index[:limit])
    return sorted(keys, key=_natural)


def _natural(key) -> tuple:
    """Sort "p2->d10" after "p2->d9": digit runs compare as numbers."""
    import re

    return tuple(int(t) if t.isdigit() else t for t in re.split(r"(\d+)", str(key)))


def fig_memory(run: RunData, max_points: int = MAX_POINTS) -> go.Figure | None:
    """Step lines of memory in use per decode replica, methods coloured, capacity dashed.

    When the capacity is far above every method's peak (> 2x), drawing it would flatten the
    curves against zero, so the axis stops above the peak and the capacity is stated in the
    panel's title instead.
    """
    mem = run.memory
    if mem is None or mem.empty:
        return None
    colours = method_colours(run.methods, run.kinds)
    replicas = _busiest(mem, "replica", "used_bytes", MAX_PANELS)
    t0, t_end = float(mem["time_s"].min()), float(mem["time_s"].max())
    titles, caps, peaks = [], {}, {}
    for r in replicas:
        sub = mem.loc[mem["replica"] == r]
        caps[r], peaks[r] = float(sub["capacity_bytes"].max()), float(sub["used_bytes"].max())
        name = f"decode replica d{r}" if str(r).isdigit() else f"decode replica {r}"
        cap, peak = caps[r], peaks[r]
        if cap > 0 and peak > 0 and cap > 2 * peak:
            name += f" · peak {peak / GIB:.3g} GiB = {peak / cap:.1%} of its {cap / GIB:.4g} GiB capacity (off scale)"
        elif cap > 0:
            name += f" · capacity {cap / GIB:.4g} GiB"
        titles.append(name)
    fig = make_subplots(
        rows=len(replicas),
        cols=1,
        shared_xaxes=True,
        vertical_spacing=0.08 if len(replicas) > 1 else 0,
        subplot_titles=titles,
    )
    capacity_shown = False  # one legend entry for the capacity lines
    for row, r in enumerate(replicas, start=1):
        sub = mem.loc[mem["replica"] == r]
        cap, peak = caps[r], peaks[r]
        for m in run.methods:
            s = sub.loc[sub["method"] == m].sort_values("time_s", kind="stable")
            if s.empty:
                continue
            t, y = thin_step(s["time_s"].to_numpy(), s["used_bytes"].to_numpy(), max_points)
            t, y = np.append(t, t_end), np.append(y, y[-1])  # hold the last value to the run's end
            fig.add_scatter(
                x=t,
                y=y / GIB,
                name=method_label(m),
                legendgroup=m,
                showlegend=row == 1,
                mode="lines",
                line=dict(color=colours[m], width=1.6, shape="hv"),
                customdata=y / cap * 100 if cap > 0 else None,
                hovertemplate=(
                    f"<b>{method_label(m)}</b> · replica {r}<br>t = %{{x:.4g}} s<br>"
                    f"used = %{{y:.3f}} GiB"
                    + (f" (%{{customdata:.2f}}% of {cap / GIB:.4g} GiB)" if cap > 0 else "")
                    + "<extra></extra>"
                ),
                row=row,
                col=1,
            )
        if cap > 0 and cap <= 2 * peak:
            fig.add_scatter(
                x=[t0, t_end],
                y=[cap / GIB] * 2,
                mode="lines",
                name="capacity",
                legendgroup="capacity",
                showlegend=not capacity_shown,
                line=dict(color="#111827", width=1.5, dash="dash"),
                hovertemplate=f"capacity of replica {r}: {cap / GIB:.4g} GiB<extra></extra>",
                row=row,
                col=1,
            )
            capacity_shown = True
            fig.update_yaxes(range=[0, cap / GIB * 1.06], row=row, col=1)
        else:
            top = peak if peak > 0 else (cap if cap > 0 else GIB)
            fig.update_yaxes(range=[0, top / GIB * 1.12], row=row, col=1)
        fig.update_yaxes(title_text="GiB", row=row, col=1)
    fig.update_xaxes(title_text="simulated time (s)", row=len(replicas), col=1)
    fig.update_layout(base_layout("Decode memory in use over time, per replica", height=170 + 230 * len(replicas)))
    mark_faults(fig, run, t_end)
    return fig


FAULT_FILL = "#dc2626"
FAULT_LABELS = {
    "link_degradation": "link {t} degraded x{f:g}",
    "link_outage": "link {t} down",
    "prefill_replica_down": "prefill p{t} down",
    "decode_replica_down": "decode d{t} down",
}
# where the phases share GPUs, either replica kind takes both down (simulator/faults.py)
SHARED_FAULT_LABELS = {"shared_gpu": "GPUs of p{t} and d{t} down", "colocated": "replica {t} down"}


def fault_windows(run: RunData) -> list[tuple[float, float, str]]:
    """(start_s, end_s, label) of every fault in the scenario (scenario.json's `faults`); end_s may be inf."""
    out = []
    shared = SHARED_FAULT_LABELS.get((run.scenario or {}).get("placement", ""))
    for f in (run.scenario or {}).get("faults") or []:
        if not isinstance(f, dict) or f.get("kind") not in FAULT_LABELS:
            continue
        try:
            start = float(f["start_s"])
            end = math.inf if f.get("end_s") in ("Infinity", None) else float(f["end_s"])
        except (KeyError, TypeError, ValueError):
            continue
        text = shared if shared and f["kind"].endswith("replica_down") else FAULT_LABELS[f["kind"]]
        label = text.format(t=f.get("target"), f=float(f.get("factor") or 0))
        out.append((start, end, label))
    return out


# Past this many windows a figure names them in its title instead of labelling each one (hundreds of labels
# would cover one another).
MAX_FAULT_LABELS = 20


def mark_faults(fig: go.Figure, run: RunData, t_end: float) -> None:
    """Shade each fault window across every panel of a time-series figure (the panels share one time axis)
    and label it above the top panel; many windows are counted in the title instead.

    The shapes and labels are set on the layout in one go: plotly's add_vrect per window and panel
    re-validated the whole layout each time, so 100 windows took minutes, and left a default "new text"
    label on every panel but the first."""
    windows = [(start, min(end, t_end), label) for start, end, label in fault_windows(run) if start < t_end]
    if not windows:
        return
    shapes = [
        dict(
            type="rect",
            xref="x",
            yref="paper",
            x0=start,
            x1=end,
            y0=0,
            y1=1,
            fillcolor=FAULT_FILL,
            opacity=0.12,
            line_width=0,
            layer="below",
        )
        for start, end, _ in windows
    ]
    labels = []
    if len(windows) <= MAX_FAULT_LABELS:
        labels = [
            dict(
                x=start,
                xref="x",
                y=1,
                yref="paper",
                yanchor="bottom",
                xanchor="left",
                text=label,
                showarrow=False,
                font=dict(size=10, color=FAULT_FILL),
            )
            for start, _, label in windows
        ]
    else:
        kinds = ", ".join(dict.fromkeys(label.split(" ", 2)[0] + " faults" for *_, label in windows))
        fig.update_layout(title_text=f"{fig.layout.title.text} · {len(windows)} fault windows shaded ({kinds})")
    fig.update_layout(
        shapes=list(fig.layout.shapes or ()) + shapes, annotations=list(fig.layout.annotations or ()) + labels
    )


def link_capacities(run: RunData) -> dict[str, float]:
    """Capacity in Gbps per link id: links.csv's capacity_gbps column, else found in scenario.json."""
    links = run.links
    names = sorted(links["link"].unique()) if links is not None else []
    caps: dict[str, float] = {}
    if links is not None and "capacity_gbps" in links:
        per_link = cast(pd.Series, links.groupby("link")["capacity_gbps"].max())
        caps = {str(k): float(v) for k, v in per_link.items() if np.isfinite(v)}
    missing = [n for n in names if n not in caps]
    if missing and run.scenario:
        found = _capacities_in(run.scenario.get("network", run.scenario), missing)
        caps.update({k: v for k, v in found.items() if k not in caps})
    return caps


def _gbps_value(d: dict) -> float | None:
    for k, v in d.items():
        if (
            isinstance(v, (int, float))
            and not isinstance(v, bool)
            and k.endswith("gbps")
            and any(w in k for w in ("capacity", "bandwidth", "link", "rate", "speed"))
        ):
            return float(v)
    for k, v in d.items():
        if isinstance(v, (int, float)) and not isinstance(v, bool) and k.endswith("_gbps"):
            return float(v)
    return None


def _capacities_in(net: Any, names: list[str]) -> dict[str, float]:
    """Per-link entries (a list of {id: ..., *_gbps} or a {link: gbps} map) win; else one uniform rate."""
    out: dict[str, float] = {}

    def walk(node):
        if isinstance(node, dict):
            for k, v in node.items():
                if k in names:
                    if isinstance(v, (int, float)) and not isinstance(v, bool):
                        out[k] = float(v)
                    elif isinstance(v, dict) and (gbps := _gbps_value(v)) is not None:
                        out[k] = gbps
            ids = [v for v in node.values() if isinstance(v, str) and v in names]
            if ids and (gbps := _gbps_value(node)) is not None:
                out[ids[0]] = gbps
            for v in node.values():
                walk(v)
        elif isinstance(node, list):
            for v in node:
                walk(v)

    walk(net)
    if len(out) < len(names):
        uniform = _gbps_value(net) if isinstance(net, dict) else None
        if uniform is not None:
            out.update({n: uniform for n in names if n not in out})
    return out


def window_mean_step(t, y, edges) -> np.ndarray:
    """Time-weighted mean of the step function (t, y) over each window [edges[i], edges[i+1]).

    The value before the first change is 0; the last value holds to the end.
    """
    t, y, edges = np.asarray(t, float), np.asarray(y, float), np.asarray(edges, float)
    # F(x) = integral of the step from t[0] to x, exact at every change and linear between.
    cum = np.concatenate([[0.0], np.cumsum(y[:-1] * np.diff(t))])
    k = np.searchsorted(t, edges, side="right") - 1
    before = k < 0
    kk = np.clip(k, 0, len(t) - 1)
    F = np.where(before, 0.0, cum[kk] + y[kk] * (edges - t[kk]))
    width = np.diff(edges)
    return np.where(width > 0, np.diff(F) / np.where(width > 0, width, 1), 0.0)


LINK_WINDOWS = 120  # windows over the run for link throughput


def fig_links(run: RunData, n_windows: int = LINK_WINDOWS) -> go.Figure | None:
    """Mean throughput per time window (instantaneous rates are on/off spikes that hide each other)."""
    links = run.links
    if links is None or links.empty:
        return None
    colours = method_colours(run.methods, run.kinds)
    caps = link_capacities(run)
    shown = _busiest(links, "link", "throughput_gbps", MAX_PANELS)
    t0, t_end = float(links["time_s"].min()), float(links["time_s"].max())
    if t_end <= t0:
        t_end = t0 + 1.0
    edges = np.linspace(t0, t_end, n_windows + 1)
    mid = (edges[:-1] + edges[1:]) / 2
    window_s = edges[1] - edges[0]
    fig = make_subplots(
        rows=len(shown),
        cols=1,
        shared_xaxes=True,
        vertical_spacing=0.07 if len(shown) > 1 else 0,
        subplot_titles=[
            f"link {k}" + (f" · capacity {caps[k]:.4g} Gbps" if k in caps else " · capacity unknown") for k in shown
        ],
    )
    flows = "active_flows" in links
    for row, k in enumerate(shown, start=1):
        sub = links.loc[links["link"] == k]
        cap = caps.get(k)
        for m in run.methods:
            s = sub.loc[sub["method"] == m].sort_values("time_s", kind="stable")
            if s.empty:
                continue
            tt = s["time_s"].to_numpy(float)
            gbps = window_mean_step(tt, s["throughput_gbps"].to_numpy(float), edges)
            custom = [gbps / cap * 100 if cap else np.full_like(gbps, np.nan)]
            extra = f"<br>%{{customdata[0]:.1f}}% of {cap:.4g} Gbps" if cap else ""
            if flows:
                custom.append(window_mean_step(tt, s["active_flows"].to_numpy(float), edges))
                extra += "<br>mean active flows: %{customdata[1]:.2f}"
            fig.add_scatter(
                x=mid,
                y=gbps,
                name=method_label(m),
                legendgroup=m,
                showlegend=row == 1,
                mode="lines",
                line=dict(color=colours[m], width=1.5),
                customdata=np.stack(custom, axis=-1),
                hovertemplate=(
                    f"<b>{method_label(m)}</b> · {k}<br>t = %{{x:.4g}} s ± {window_s / 2:.3g} s"
                    f"<br>mean throughput = %{{y:.4g}} Gbps{extra}<extra></extra>"
                ),
                row=row,
                col=1,
            )
        if cap:
            fig.add_scatter(
                x=[t0, t_end],
                y=[cap, cap],
                mode="lines",
                name="capacity",
                legendgroup="capacity",
                showlegend=row == 1,
                line=dict(color="#111827", width=1.5, dash="dash"),
                hovertemplate=f"capacity of {k}: {cap:.4g} Gbps<extra></extra>",
                row=row,
                col=1,
            )
        fig.update_yaxes(title_text="Gbps", rangemode="tozero", row=row, col=1)
    fig.update_xaxes(title_text="simulated time (s)", row=len(shown), col=1)
    fig.update_layout(
        base_layout(
            f"Link throughput over time (mean over {window_s:.3g} s windows) vs capacity", height=150 + 200 * len(shown)
        )
    )
    mark_faults(fig, run, t_end)
    return fig


def _method_partition(run: RunData, method: str) -> int | None:
    """The partition size Π the scenario gave a method, if it says (partition / partition_size / pi)."""
    e = run.method_configs.get(method, {})
    for key in ("partition", "partition_size", "partition_elements", "pi"):
        if isinstance(e.get(key), (int, float)) and not isinstance(e.get(key), bool):
            return int(e[key])
    return None


def accuracy_rows(run: RunData) -> pd.DataFrame | None:
    rows = (run.profiles or {}).get("accuracy")
    if not rows:
        return None
    df = pd.DataFrame(rows)
    if "rel_error" not in df:
        return None
    for c in ("kernel", "partition", "bits", "rounding", "inputs"):
        if c not in df:
            df[c] = None
    return df


def match_accuracy(run: RunData, acc: pd.DataFrame) -> pd.DataFrame:
    """Pair accuracy rows with methods: kernel (or its part after the last ".") == the method's
    output name or kind, else the longest method name it starts with ("hack_attn" -> hack);
    restricted to the method's partition size when the scenario names one."""
    methods = sorted(run.methods, key=len, reverse=True)
    kinds = run.kinds
    out = []
    for _, row in acc.iterrows():
        # A kernel key "decode_attn.hack" names its variant after the dot.
        kernel = str(row["kernel"]).rsplit(".", 1)[-1]
        # A kernel pairs with the methods named after it, or labelled variants of that kind.
        candidates = [m for m in run.methods if m == kernel or kinds.get(m) == kernel]
        if not candidates:
            prefix = next((x for x in methods if kernel.startswith(x + "_")), None)
            candidates = [prefix] if prefix else []
        partition: Any = row["partition"]  # one cell (pandas types a row's item as possibly a Series)
        for m in candidates:
            part = _method_partition(run, m)
            if part is not None and pd.notna(partition) and int(partition) != part:
                continue
            stats = run.summary["methods"].get(m) or {}
            jct = (stats.get("jct_s") or {}).get("mean")
            if jct is None:
                continue
            decode = (stats.get("breakdown_s") or {}).get("decode")
            out.append(
                dict(row, method=m, jct_mean_s=float(jct), decode_mean_s=None if decode is None else float(decode))
            )
    return pd.DataFrame(out)


def _config_label(row) -> str:
    bits = f"{int(row['bits'])}-bit" if pd.notna(row["bits"]) else ""
    part = f"Π={int(row['partition'])}" if pd.notna(row["partition"]) else ""
    extra = ", ".join(str(v) for v in (row["rounding"], row["inputs"]) if v is not None and pd.notna(v))
    return " ".join(x for x in (part, bits) if x) + (f" ({extra})" if extra else "")


LEGEND_LINE_PX = 21  # a legend entry's height at the report's 13 px font
LEGEND_GROUP_LINES = 2  # a legend group's title and the gap above it, in entries


def fig_tradeoff(run: RunData) -> go.Figure | None:
    acc = accuracy_rows(run)
    if acc is None:
        return None
    matched = match_accuracy(run, acc)
    colours = method_colours(run.methods, run.kinds)
    two = not matched.empty
    fig = make_subplots(
        rows=1,
        cols=2 if two else 1,
        horizontal_spacing=0.1,
        subplot_titles=["relative error by partition size Π"] + (["accuracy vs speed"] if two else []),
    )
    acc = acc.copy()
    acc["series"] = acc.apply(
        lambda r: " · ".join(
            str(v)
            for v in (r["kernel"], f"{int(r['bits'])}-bit" if pd.notna(r["bits"]) else None, r["rounding"], r["inputs"])
            if v is not None and pd.notna(v)
        ),
        axis=1,
    )
    palette = iter(("#a16207", "#0f766e", "#7c3aed", "#db2777", "#4d7c0f", "#1e40af", "#9a3412", "#475569") * 4)
    dashes = iter(("solid", "dash", "dot", "dashdot", "longdash") * 8)
    seen_kernels: set[str] = set()
    numeric_part = cast(pd.Series, pd.to_numeric(acc["partition"], errors="coerce"))  # a Series in, a Series out
    for series, s in acc.assign(_p=numeric_part).sort_values("_p").groupby("series", sort=False):
        kernel = str(s["kernel"].iloc[0])
        # A kernel named after a method wears its colour; its variants (bits, rounding) differ by dash.
        colour = colours.get(kernel) or next(palette)
        dash = "solid" if kernel not in seen_kernels else next(dashes)
        seen_kernels.add(kernel)
        fig.add_scatter(
            x=[str(int(p)) if pd.notna(p) else "n/a" for p in s["_p"]],
            y=s["rel_error"],
            name=series,
            mode="lines+markers",
            legendgroup="acc",
            legendgrouptitle_text="accuracy rows (left)",
            marker=dict(size=9, color=colour),
            line=dict(color=colour, width=1.8, dash=dash),
            hovertemplate=f"<b>{series}</b><br>Π = %{{x}}<br>relative error = %{{y:.3e}}<extra></extra>",
            row=1,
            col=1,
        )
    order = [str(int(p)) for p in sorted(numeric_part.dropna().unique())] + (
        ["n/a"] if numeric_part.isna().any() else []
    )
    fig.update_xaxes(
        title_text="partition size Π (elements)",
        type="category",
        categoryorder="array",
        categoryarray=order,
        row=1,
        col=1,
    )
    fig.update_yaxes(title_text="relative error (vs FP16)", type="log", exponentformat="power", row=1, col=1)
    if two:
        for key, s in matched.groupby("method", sort=False):
            m = str(key)
            text = [_config_label(r) for _, r in s.iterrows()]
            decode = s["decode_mean_s"].fillna(float("nan")).to_numpy()
            fig.add_scatter(
                x=s["rel_error"],
                y=s["jct_mean_s"],
                name=method_label(m),
                mode="markers",
                text=text,
                legendgroup="methods",
                legendgrouptitle_text="methods (right)",
                marker=dict(size=13, color=colours[m], line=dict(color="white", width=1)),
                customdata=decode,
                hovertemplate=(
                    f"<b>{method_label(m)}</b> %{{text}}<br>relative error = %{{x:.3e}}"
                    "<br>mean JCT = %{y:.4g} s<br>mean decode time = %{customdata:.4g} s<extra></extra>"
                ),
                row=1,
                col=2,
            )
        fig.update_xaxes(title_text="relative error (vs FP16, log)", type="log", exponentformat="power", row=1, col=2)
        fig.update_yaxes(title_text="mean JCT (s)", row=1, col=2)
    fig.update_yaxes(nticks=6, row=1, col=1)
    # Tall enough that the legend (one line per entry, a title per group) fits beside the plots unscrolled.
    traces = len(fig.data)  # pyright: ignore[reportArgumentType]  (plotly leaves data unannotated)
    entries = traces + LEGEND_GROUP_LINES * (1 + two)
    fig.update_layout(
        base_layout(
            "Accuracy/speed trade-off of the compressed-KV kernels",
            height=max(480, 90 + 60 + LEGEND_LINE_PX * entries),
            margin=dict(l=70, r=30, t=90, b=60),
        )
    )
    return fig


def make_figures(run: RunData, max_points: int = MAX_POINTS) -> dict[str, go.Figure]:
    """Every figure the run's data supports, by name, in page order."""
    figs: dict[str, go.Figure | None] = {"jct_breakdown": fig_breakdown(run)}
    for col, title, unit, scale in CDF_METRICS:
        figs[f"cdf_{col.removesuffix('_s')}"] = fig_cdf(run, col, title, unit, scale, max_points)
    figs["decode_memory"] = fig_memory(run, max_points)
    figs["link_utilisation"] = fig_links(run)
    figs["accuracy_tradeoff"] = fig_tradeoff(run)
    out = {k: v for k, v in figs.items() if v is not None}
    for fig in out.values():
        fig.update_xaxes(automargin=True)
        fig.update_yaxes(automargin=True)
    return out


def figure_notes(run: RunData) -> dict[str, str]:
    """Why a figure is absent or partial, by figure name."""
    notes = {}
    if run.requests is None:
        for col, *_ in CDF_METRICS:
            notes[f"cdf_{col.removesuffix('_s')}"] = (
                "requests.csv is missing, so there are no per-request distributions."
            )
    if run.memory is None or run.memory.empty:
        notes["decode_memory"] = "memory.csv is missing or empty."
    elif run.memory["replica"].nunique() > MAX_PANELS:
        notes["decode_memory"] = (
            f"Showing the {MAX_PANELS} fullest of {run.memory['replica'].nunique()} decode replicas."
        )
    if run.links is None or run.links.empty:
        notes["link_utilisation"] = "links.csv is missing or empty."
    else:
        parts = []
        if run.links["link"].nunique() > MAX_PANELS:
            parts.append(f"Showing the {MAX_PANELS} busiest of {run.links['link'].nunique()} links.")
        unknown = sorted(set(run.links["link"].unique()) - set(link_capacities(run)))
        if unknown:
            parts.append(
                f"No capacity found for {', '.join(unknown[:6])}{'…' if len(unknown) > 6 else ''} "
                "(neither a capacity_gbps column nor a *_gbps entry under scenario.network)."
            )
        if parts:
            notes["link_utilisation"] = " ".join(parts)
    acc = accuracy_rows(run)
    if acc is None:
        notes["accuracy_tradeoff"] = (
            "The calibration profile has no accuracy rows, so there is no accuracy/speed "
            "trade-off to show. Runs whose decode profile is measured or derived carry them "
            "(kernels_calibration/profiles/<gpu>/accuracy.csv); roofline profiles do not."
        )
    elif match_accuracy(run, acc).empty:
        notes["accuracy_tradeoff"] = (
            "No accuracy row's kernel matches a simulated method, so only the relative errors are shown, without speed."
        )
    return notes
