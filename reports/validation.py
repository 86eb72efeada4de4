"""The validation pages: one trace (measured against simulated, per metric, with the error on each
bar) and many traces (each trace's errors against the 5 % / 10 % bands), in the shared page template.

Reads the dicts `simulator.validate.validate` and `validate_index` return (also saved as
validation.json); never imports the simulator. An error is (simulated − measured) / measured.
"""

from __future__ import annotations

import html
import json
import math
from pathlib import Path

import plotly.graph_objects as go

from .page import Page, Section, write_page
from .style import FONT, PART_COLOURS, fmt_pct, fmt_seconds

QUANTILES = ("mean", "p50", "p90", "p99")
MEASURED_COLOUR, SIMULATED_COLOUR = "#9ca3af", "#111827"
# Metrics, not methods: ink for JCT, and the phase colours of what each metric mostly is.
INDEX_METRICS = (
    ("jct_mean_error_pct", "JCT mean", "#111827"),
    ("ttft_p50_error_pct", "TTFT p50", PART_COLOURS["prefill"]),
    ("tpot_p50_error_pct", "TPOT p50", PART_COLOURS["decode"]),
    ("prefill_mean_error_pct", "prefill", PART_COLOURS["quantize"]),
    ("transfer_mean_error_pct", "transfer", PART_COLOURS["transfer"]),
    ("kv_wait_mean_error_pct", "KV wait", PART_COLOURS["transfer_queue"]),
)


def _esc(x) -> str:
    return html.escape(str(x), quote=True)


def _rows(v: dict) -> list[tuple[str, float, float, float | None, str]]:
    """(label, measured s, simulated s, error %, error key) for every metric the trace resolves."""
    rows = []
    for metric in ("jct", "ttft", "tpot"):
        for q in QUANTILES:
            key = f"{metric}_{q}_error_pct"
            rows.append(
                (
                    f"{metric.upper()} {q}",
                    v["metrics"][f"{metric}_s"]["measured"][q],
                    v["metrics"][f"{metric}_s"]["simulated"][q],
                    v.get(key),
                    key,
                )
            )
        if metric == "jct" and v.get("kv_wait_s"):  # the wait for KV room beside the JCT (simulator/validate.py)
            kv = v["kv_wait_s"]
            key = "kv_wait_mean_error_pct"
            rows.append(("KV wait mean", kv["measured"], kv["simulated"], v.get(key), key))
    for part, mp in v["breakdown_s"].items():
        key = f"{part}_mean_error_pct"
        rows.append((f"{part} mean", mp["measured"], mp["simulated"], v.get(key), key))
    if "iteration_s" in v:
        it = v["iteration_s"]
        key = "iteration_mean_error_pct"
        rows.append(("decode iteration mean", it["measured_mean"], it["predicted_mean"], v.get(key), key))
    if "cadence_s" in v:
        c = v["cadence_s"]
        key = "cadence_mean_error_pct"
        rows.append(("decode cadence mean", c["measured_mean"], c["predicted_mean"], v.get(key), key))
    return rows


def _spread(noise: dict | None, error_key: str) -> float | None:
    """The run-to-run spread (%) of the metric behind an error (simulator/noise.py, in validation.json)."""
    if not noise:
        return None
    key = error_key.removesuffix("_error_pct")
    key = "transfer_queue_mean" if key == "kv_wait_mean" else key  # the KV wait is the transfer_queue part
    return noise.get("spread_pct", {}).get(key)


def _spread_cell(x: float | None) -> str:
    return '<td class="na">n/a</td>' if x is None else f"<td>±{x:.1f}%</td>"


def validation_figure(v: dict) -> go.Figure:
    rows = _rows(v)
    labels = [r[0] for r in rows]
    noise = v.get("noise")
    text = [
        ("n/a" if r[3] is None else f"{r[3]:+.1f}%")
        + ("" if _spread(noise, r[4]) is None else f" (±{_spread(noise, r[4]):.1f})")
        for r in rows
    ]
    fig = go.Figure(
        [
            go.Bar(
                name="measured",
                x=labels,
                y=[r[1] for r in rows],
                marker_color=MEASURED_COLOUR,
                hovertemplate="%{x}: %{y:.4f} s measured<extra></extra>",
            ),
            go.Bar(
                name="simulated",
                x=labels,
                y=[r[2] for r in rows],
                marker_color=SIMULATED_COLOUR,
                text=text,
                textposition="outside",
                hovertemplate="%{x}: %{y:.4f} s simulated (error %{text})<extra></extra>",
            ),
        ]
    )
    fig.update_layout(
        barmode="group",
        template="plotly_white",
        height=520,
        font=dict(family=FONT, size=13),
        title=dict(text=f"Simulated vs measured: {v['method']}, {v['requests']} requests", x=0.01),
        yaxis_title="seconds (log)",
        yaxis_type="log",
        xaxis_tickangle=-35,
        legend=dict(orientation="h", y=1.02, yanchor="bottom", x=1, xanchor="right"),
        margin=dict(l=70, r=30, t=80, b=140),
    )
    return fig


# The goals an error is coloured against, the same in the header, the table and the index page: mean JCT
# within 5 %, every other metric within 10 %.
JCT_MEAN_GOAL_PCT, GOAL_PCT = 5.0, 10.0


def goal_pct(label: str) -> float:
    """The goal for a metric by its row label ("JCT mean", "TTFT p50", ...)."""
    return JCT_MEAN_GOAL_PCT if label == "JCT mean" else GOAL_PCT


def _error_cell(e: float | None, goal_pct: float = GOAL_PCT) -> str:
    if e is None or (isinstance(e, float) and math.isnan(e)):
        return '<td class="na">n/a</td>'
    tone = "better" if abs(e) <= goal_pct else "worse"
    return f'<td class="{tone}">{_esc(fmt_pct(e))}</td>'


def _seconds_cell(e: float | None) -> str:
    """An error in seconds (simulated − measured), where a percentage of a wait near 0 says nothing."""
    if e is None or (isinstance(e, float) and math.isnan(e)):
        return '<td class="na">n/a</td>'
    return f"<td>{round(e, 3) or 0.0:+.3f} s</td>"  # no "-0.000 s"


def _metric_table(v: dict) -> str:
    noise = v.get("noise")
    body = "".join(
        f"<tr><td>{_esc(label)}</td><td>{_esc(fmt_seconds(m))}</td><td>{_esc(fmt_seconds(p))}</td>"
        + _error_cell(e, goal_pct(label))
        + (_spread_cell(_spread(noise, key)) if noise else "")
        + "</tr>"
        for label, m, p, e, key in _rows(v)
    )
    spread_head = "<th>run-to-run spread</th>" if noise else ""
    return (
        '<div class="scroll"><table id="table-validation"><thead><tr><th>metric</th><th>measured</th>'
        f"<th>simulated</th><th>error</th>{spread_head}</tr></thead><tbody>{body}</tbody></table></div>"
    )


def _notes_html(v: dict) -> str:
    notes = list(v.get("notes") or [])
    noise = v.get("noise")
    if noise:
        notes.append(
            f"run-to-run spread: one standard deviation of the measured metric over repeated recordings of one "
            f"configuration and seed ({noise.get('index', '')}); an error within about twice it is inside the noise"
        )
    if v.get("host_speed"):  # simulator.validate.add_host_spread
        notes.append(v["host_speed"]["line"])
    return "".join(f"<p>{_esc(n)}</p>" for n in notes)


def _glance(cells: list[tuple[str, str, str]]) -> str:
    head = "".join(f"<th>{_esc(k)}</th>" for k, _, _ in cells)
    vals = "".join(f'<td class="{cls}">{_esc(val)}</td>' for _, val, cls in cells)
    return (
        f'<table class="glance" id="table-glance"><thead><tr>{head}</tr></thead><tbody><tr>{vals}</tr></tbody></table>'
    )


def _tone(e: float | None, goal: float) -> str:
    return "" if e is None else "better" if abs(e) <= goal else "worse"


def _scenario_html(scenario: dict | None, path: str) -> str:
    if not scenario:
        return f"<p>scenario file <code>{_esc(path)}</code></p>"
    blocks = "".join(
        f"<details><summary>{_esc(k)}</summary><pre>{_esc(json.dumps(x, indent=2))}</pre></details>"
        for k, x in scenario.items()
        if isinstance(x, (dict, list))
    )
    facts = "".join(
        f"<dt>{_esc(k)}</dt><dd>{_esc(x)}</dd>" for k, x in scenario.items() if not isinstance(x, (dict, list))
    )
    return f'<p>from <code>{_esc(path)}</code>, with the trace\'s own arrivals and lengths</p><dl class="facts">{facts}</dl>{blocks}'


def validation_page(v: dict) -> Page:
    glance = [
        (
            f"{m.upper()} {q} error",
            fmt_pct(v.get(f"{m}_{q}_error_pct")),
            _tone(v.get(f"{m}_{q}_error_pct"), goal_pct(f"{m.upper()} {q}")),
        )
        for m, q in (("jct", "mean"), ("ttft", "p50"), ("tpot", "p50"))
    ]
    if v.get("kv_wait_s"):
        kv = v["kv_wait_s"]
        glance.append(
            (
                "KV wait error",
                f"{fmt_pct(v.get('kv_wait_mean_error_pct'))} ({round(kv['error_s'], 3) or 0.0:+.3f} s)",
                _tone(v.get("kv_wait_mean_error_pct"), GOAL_PCT),
            )
        )
    if v.get("host_spread_jct_mean_pct") is not None:  # beside the JCT error: the host's share of its floor
        glance.insert(1, ("host speed alone (JCT mean)", f"±{v['host_spread_jct_mean_pct']:.1f}%", ""))
    if "iteration_mean_error_pct" in v:
        glance.append(
            (
                "decode iteration error",
                fmt_pct(v["iteration_mean_error_pct"]),
                _tone(v["iteration_mean_error_pct"], goal_pct("decode iteration mean")),
            )
        )
    sections = [
        Section(
            "errors",
            "Simulated against measured",
            "Each metric measured on the real system and simulated from "
            "the same arrivals and lengths; the label is the error, (simulated − measured) / measured.",
            ("validation",),
        ),
        Section(
            "table",
            "Every metric",
            f"Green within the goal, red beyond: mean JCT within {JCT_MEAN_GOAL_PCT:g} % of the measured value, "
            f"every other metric within {GOAL_PCT:g} % (the header's colours are the same).",
            body_html=_metric_table(v) + _notes_html(v),
        ),
        Section(
            "scenario",
            "Scenario",
            "The resolved scenario the simulation ran (click to open a part).",
            body_html=_scenario_html(v.get("resolved_scenario"), v["scenario"]),
        ),
    ]
    return Page(
        title=f"validation · {Path(str(v['trace'])).name}",
        heading=f"Validation: {Path(str(v['trace'])).name}",
        description=f"method {v['method']}, {v['requests']} requests",
        subtitles=(f"trace {v['trace']} · scenario {v['scenario']}",),
        summary_html=_glance(glance),
        sections=sections,
        figures={"validation": validation_figure(v)},
        footer="Made by hacksim validate from the trace and the scenario.",
    )


def write_validation_report(
    v: dict, path: str | Path, *, plotlyjs: str | None = None, page_path: Path | None = None
) -> Path:
    """`page_path`: where the page will be read from, when it is written elsewhere first (write_page)."""
    return write_page(validation_page(v), path, plotlyjs=plotlyjs, page_path=page_path)


def _bars_layout(title: str, yaxis_title: str, height: int, **kw) -> dict:
    """The layout of the pages' error bars per trace and per configuration: grouped, plotly white, the legend across
    the top right; `kw` the figure's own (tick angle, margins)."""
    return dict(
        barmode="group",
        template="plotly_white",
        height=height,
        font=dict(family=FONT, size=13),
        legend=dict(orientation="h", y=1.02, yanchor="bottom", x=1, xanchor="right"),
        title=dict(text=title, x=0.01),
        yaxis_title=yaxis_title,
        **kw,
    )


def validation_index_figure(rows: list[dict]) -> go.Figure:
    """Errors of many traces (simulator.validate.validate_index rows): one group of bars per trace,
    with the goal bands (mean JCT within 5 %, p50 TTFT/TPOT within 10 %) shaded."""
    names = [str(r["trace"]).removeprefix("llama-3.1-") for r in rows]
    fig = go.Figure()
    for key, label, color in INDEX_METRICS:
        vals = [r.get(key) for r in rows]
        fig.add_bar(
            name=label,
            x=names,
            y=vals,
            marker_color=color,
            hovertemplate="%{x}<br>" + label + " error %{y:+.1f}%<extra></extra>",
        )
    fig.add_hrect(y0=-10, y1=10, fillcolor="#16a34a", opacity=0.08, line_width=0)
    fig.add_hrect(y0=-5, y1=5, fillcolor="#16a34a", opacity=0.10, line_width=0)
    fig.update_layout(
        _bars_layout(
            "Error per trace, (simulated − measured) / measured",
            "error (%)",
            height=560,
            xaxis_tickangle=-35,
            margin=dict(l=70, r=30, t=90, b=170),
        )
    )
    return fig


def _index_table(rows: list[dict], noise: dict | None = None) -> str:
    keys = [k for k, _, _ in INDEX_METRICS]
    speed = any(r.get("host_spread_jct_mean_pct") is not None for r in rows)  # simulator.validate.add_host_spread
    # the host's speed alone beside the JCT error it is the floor of
    heads = [label for _, label, _ in INDEX_METRICS]
    heads[1:1] = ["host speed alone"] if speed else []
    head = "".join(f"<th>{_esc(label)}</th>" for label in heads) + "<th>KV wait (s)</th>"

    def cells(r: dict) -> list[str]:
        out = [_error_cell(r.get(k), JCT_MEAN_GOAL_PCT if k == "jct_mean_error_pct" else GOAL_PCT) for k in keys]
        out[1:1] = [_spread_cell(r.get("host_spread_jct_mean_pct"))] if speed else []
        return out

    body = "".join(
        f"<tr><td>{_esc(r['trace'])}</td>"
        f'<td title="{_esc(r.get("scenario", ""))}">{_esc(Path(str(r.get("scenario", ""))).name)}</td>'
        + "".join(cells(r))
        + _seconds_cell(r.get("kv_wait_error_s"))
        + "</tr>"
        for r in rows
    )
    foot = ""
    if noise:
        spreads = [_spread_cell(_spread(noise, k)) for k in keys]
        spreads[1:1] = ["<td></td>"] if speed else []
        foot = "<tfoot><tr><td>run-to-run spread</td><td></td>" + "".join(spreads) + "<td></td></tr></tfoot>"
    return (
        f'<div class="scroll"><table id="table-validation-index"><thead><tr><th>trace</th><th>scenario</th>{head}'
        f"</tr></thead><tbody>{body}</tbody>{foot}</table></div>"
    )


def _comparison_table(comp: dict, noise: dict | None) -> str:
    """Each method's mean JCT against FP16's (simulator/comparison.py, index_comparison): measured, simulated, the error in
    points and, with repeats, the comparison's run-to-run spread."""

    def pct(x: float | None) -> str:
        return "–" if x is None else f"{x:+.1f} %"

    machines = any(r["machine"] for r in comp["rows"])
    head = "<th>configuration</th>" + ("<th>machine</th>" if machines else "") + "<th>req/s</th><th>method</th>"
    head += "<th>measured</th><th>simulated</th><th>error (points)</th>" + ("<th>run to run</th>" if noise else "")
    body = ""
    for r in comp["rows"]:
        rate, sim = r["workload"].get("rate_rps"), r["no_fit"]
        body += f"<tr><td>{_esc(r['configuration'])}</td>" + (
            f"<td>{_esc(r['machine'] or '')}</td>" if machines else ""
        )
        body += f"<td>{'' if rate is None else f'{rate:g}'}</td><td>{_esc(r['method'])}</td>"
        body += f"<td>{pct(r['measured_pct'])}</td><td>{pct(sim and sim['predicted_pct'])}</td>"
        body += f"<td>{'–' if sim is None else format(sim['error_pts'], '+.1f')}</td>"
        if noise:
            x = r["run_to_run_pts"]
            body += f"<td>{'not recorded' if x is None else f'±{x:.1f}'}</td>"
        body += "</tr>"
    return (
        f'<div class="scroll"><table id="table-against-reference"><thead><tr>{head}</tr></thead>'
        f"<tbody>{body}</tbody></table></div>"
    )


def validation_index_page(
    rows: list[dict], noise: dict | None = None, comparison: dict | None = None, host_speed: dict | None = None
) -> Page:
    """`host_speed`: simulator.validate.add_host_spread's, the line under the table that says what each run's
    `host speed alone` figure is."""

    def mean_abs(key):
        vals = [abs(r[key]) for r in rows if r.get(key) is not None]
        return sum(vals) / len(vals) if vals else None

    def within(key, goal):
        return sum(1 for r in rows if r.get(key) is not None and abs(r[key]) <= goal)

    glance = [
        (f"mean |error| {label}", "–" if mean_abs(k) is None else f"{mean_abs(k):.1f}%", "")
        for k, label, _ in INDEX_METRICS[:3]
    ]
    glance.append(("JCT within 5 %", f"{within('jct_mean_error_pct', 5)} of {len(rows)}", ""))
    sections = [
        Section(
            "errors",
            "Error per trace",
            "Shaded: within 5 % and within 10 % of the measured value.",
            ("validation_index",),
        ),
        Section(
            "traces",
            "Every trace",
            "JCT green within 5 %, the others within 10 %"
            + ("; the last row: each metric's run-to-run spread over repeated recordings." if noise else "."),
            body_html=_index_table(rows, noise) + _notes_html({"noise": noise, "host_speed": host_speed}),
        ),
    ]
    comp = comparison  # simulator.comparison.index_comparison: each method against FP16, where the index has both
    if comp is not None:
        s = comp["summary"]["no_fit"]
        sections.append(
            Section(
                "against-fp16",
                f"Each method against {comp['rows'][0]['reference']}",
                f"Mean JCT against {comp['rows'][0]['reference']}'s over the same requests on the same host, in %; "
                f"the simulated value misses by {s['mean_abs_error_pts']:.1f} points on average "
                f"({s['max_abs_error_pts']:.1f} at worst)"
                + (
                    f", against a run-to-run spread of ±{comp['run_to_run_pts']:.1f} points."
                    if comp.get("run_to_run_pts") is not None
                    else "."
                ),
                body_html=_comparison_table(comp, noise),
            )
        )
    return Page(
        title=f"validation · {len(rows)} traces",
        heading=f"Validation over {len(rows)} traces",
        subtitles=("error = (simulated − measured) / measured",),
        summary_html=_glance(glance),
        sections=sections,
        figures={"validation_index": validation_index_figure(rows)},
        footer="Made by hacksim validate from the traces and their scenarios.",
    )


def write_validation_index_report(
    rows: list[dict],
    path: str | Path,
    *,
    plotlyjs: str | None = None,
    noise: dict | None = None,
    page_path: Path | None = None,
    comparison: dict | None = None,
    host_speed: dict | None = None,
) -> Path:
    page = validation_index_page(rows, noise, comparison, host_speed)
    return write_page(page, path, plotlyjs=plotlyjs, page_path=page_path)


# ---- validate --cv: held out by configuration, against no fit -------------------------------------------------------
# no fit grey, the fit the goals are stated for ink, any other fit a blue
NO_FIT_COLOUR, HEADLINE_COLOUR, CV_FIT_COLOURS = "#9ca3af", "#111827", ("#93c5fd", "#3b82f6", "#1e40af")


def _cv_label(c: dict) -> str:
    return c["configuration"].removeprefix("h200g_").removeprefix("h100g_") + (
        f" · {c['machine']}" if c.get("machine") else ""
    )


def crossval_figure(result: dict, schemes: dict[str, str], headline: str) -> go.Figure:
    """Per configuration: its runs' mean |JCT error| under each scheme (no fit first), the host's speed alone and,
    with repeats, the measured run-to-run spread as markers: a bar under its marker is inside what the host alone
    moves the configuration by."""
    configs = result["configurations"]
    names = [_cv_label(c) for c in configs]
    fig = go.Figure()
    fits = iter(CV_FIT_COLOURS)
    for s, label in schemes.items():
        colour = NO_FIT_COLOUR if s == "no_fit" else HEADLINE_COLOUR if s == headline else next(fits, None)
        fig.add_bar(
            name=label,
            x=names,
            y=[c.get(f"{s}_jct_mean_abs_error_pct") for c in configs],
            marker_color=colour,
            hovertemplate="%{x}<br>" + label + " %{y:.1f}%<extra></extra>",
        )
    for key, label, symbol in (
        ("host_spread_jct_mean_pct", "host speed alone", "line-ew"),
        ("run_to_run_jct_mean_pct", "run to run (measured)", "diamond-open"),
    ):
        ys = [c.get(key) for c in configs]
        if any(y is not None for y in ys):
            fig.add_scatter(
                name=label,
                x=names,
                y=ys,
                mode="markers",
                marker=dict(
                    symbol=symbol,
                    size=26 if symbol == "line-ew" else 10,
                    color="#dc2626",
                    line=dict(width=2.5, color="#dc2626"),
                ),
                hovertemplate="%{x}<br>" + label + " ±%{y:.1f}%<extra></extra>",
            )
    fig.add_hline(y=JCT_MEAN_GOAL_PCT, line_dash="dot", line_color="#16a34a")
    fig.update_layout(
        _bars_layout(
            "Mean |JCT error| of each configuration's runs",
            "mean |JCT error| (%)",
            height=480,
            xaxis_tickangle=-25,
            margin=dict(l=70, r=30, t=90, b=130),
        )
    )
    return fig


def _mag_cell(x: float | None, goal: float | None = None) -> str:
    if x is None:
        return '<td class="na">n/a</td>'
    tone = "" if goal is None else f' class="{"better" if x <= goal else "worse"}"'
    return f"<td{tone}>{x:.1f}%</td>"


def _cv_configuration_table(result: dict, schemes: dict[str, str]) -> str:
    configs = result["configurations"]
    machines = any(c.get("machine") for c in configs)
    host = any(c.get("host_spread_jct_mean_pct") is not None for c in configs)
    noise = "noise" in result
    head = "<th>configuration</th>" + ("<th>machine</th><th>factor (from the others)</th>" if machines else "")
    head += "<th>traces</th>" + "".join(f"<th>{_esc(label)}</th>" for label in schemes.values())
    head += ("<th>host speed alone</th>" if host else "") + ("<th>run to run</th>" if noise else "") + "<th></th>"
    body = ""
    for c in configs:
        body += f"<tr><td>{_esc(c['configuration'])}</td>"
        if machines:
            f = c.get("machine_factor")
            factor = "n/a" if f is None else f"{f:.3f} ± {c.get('machine_factor_stderr') or 0:.2g}"
            body += f"<td>{_esc(c.get('machine') or '(one)')}</td><td>{_esc(factor)}</td>"
        body += f"<td>{c['traces']}</td>"
        body += "".join(_mag_cell(c.get(f"{s}_jct_mean_abs_error_pct"), JCT_MEAN_GOAL_PCT) for s in schemes)
        if host:
            body += _spread_cell(c.get("host_spread_jct_mean_pct"))
        if noise:
            x = c.get("run_to_run_jct_mean_pct")
            body += "<td>not recorded</td>" if x is None else _spread_cell(x)
        body += '<td class="worse">worse than no fit</td>' if c.get("worse_than_no_fit") else "<td></td>"
        body += "</tr>"
    foot = ""
    for key, label, goal in (
        ("jct_mean_abs_error_pct", "mean |JCT error|", JCT_MEAN_GOAL_PCT),
        ("jct_max_abs_error_pct", "max |JCT error|", 2 * JCT_MEAN_GOAL_PCT),
    ):
        foot += f"<tr><td>{label}</td>" + ("<td></td><td></td>" if machines else "") + f"<td>{result['traces']}</td>"
        foot += "".join(_mag_cell((result.get(s) or {}).get(key), goal) for s in schemes)
        foot += "<td></td>" * (host + noise + 1) + "</tr>"
    return (
        f'<div class="scroll"><table id="table-cv-configurations"><thead><tr>{head}</tr></thead><tbody>{body}</tbody>'
        f"<tfoot>{foot}</tfoot></table></div>"
    )


def _cv_trace_table(result: dict, schemes: dict[str, str]) -> str:
    rows = result["per_trace"]
    shown = [s for s in schemes if any(isinstance(r.get(s), dict) and r[s] for r in rows)]
    host = any(r.get("host_spread_jct_mean_pct") is not None for r in rows)
    head = "<th>trace</th><th>configuration</th>" + "".join(f"<th>{_esc(schemes[s])}</th>" for s in shown)
    head += "<th>host speed alone</th>" if host else ""
    body = "".join(
        f"<tr><td>{_esc(r['trace'])}</td><td>{_esc(r['configuration'])}</td>"
        + "".join(_error_cell((r.get(s) or {}).get("jct_mean_error_pct"), GOAL_PCT) for s in shown)
        + (_spread_cell(r.get("host_spread_jct_mean_pct")) if host else "")
        + "</tr>"
        for r in rows
    )
    return (
        f'<div class="scroll"><table id="table-cv-traces"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>'
        "</div>"
    )


def _cv_against_table(comp: dict, schemes: dict[str, str]) -> str:
    """Each method's mean JCT against FP16's (simulator/comparison.py), measured, and each scheme's error in points."""

    def pts(x: dict | None) -> str:
        return '<td class="na">–</td>' if not x else f"<td>{x['error_pts']:+.1f}</td>"

    shown = [s for s in schemes if any(r.get(s) for r in comp["rows"])]
    head = "<th>configuration</th><th>req/s</th><th>method</th><th>measured</th>"
    head += "".join(f"<th>{_esc(schemes[s])} (points)</th>" for s in shown)
    body = ""
    for r in comp["rows"]:
        rate = r["workload"].get("rate_rps")
        where = r["configuration"] + (f" · {r['machine']}" if r.get("machine") else "")
        body += f"<tr><td>{_esc(where)}</td><td>{'' if rate is None else f'{rate:g}'}</td><td>{_esc(r['method'])}</td>"
        body += f"<td>{r['measured_pct']:+.1f} %</td>" + "".join(pts(r.get(s)) for s in shown) + "</tr>"
    return (
        f'<div class="scroll"><table id="table-cv-against-reference"><thead><tr>{head}</tr></thead>'
        f"<tbody>{body}</tbody></table></div>"
    )


def crossval_page(result: dict, schemes: dict[str, str], headline: str, notes: list[str], flags: bool = True) -> Page:
    """validate --cv's page (and --cv --base's): `result` is its validation.json, `schemes` its error columns in
    order (key -> label, no fit first), `headline` the scheme the goals are stated for, `notes` the lines the
    terminal prints beside its tables (simulator.crossval.cv_notes, cv_machine_notes); `flags` False where the
    result has no prediction its worse-than-no-fit flags are about (folds by trace alone)."""
    configs = result["configurations"]
    top, none = result.get(headline) or {}, result.get("no_fit") or {}
    worse = sum(bool(c.get("worse_than_no_fit")) for c in configs)
    glance = [
        (
            f"mean |JCT error| {schemes[headline]}",
            fmt_pct(top.get("jct_mean_abs_error_pct"), signed=False),
            _tone(top.get("jct_mean_abs_error_pct"), JCT_MEAN_GOAL_PCT),
        ),
        (
            f"max |JCT error| {schemes[headline]}",
            fmt_pct(top.get("jct_max_abs_error_pct"), signed=False),
            _tone(top.get("jct_max_abs_error_pct"), 2 * JCT_MEAN_GOAL_PCT),
        ),
        ("mean |JCT error| no fit", fmt_pct(none.get("jct_mean_abs_error_pct"), signed=False), ""),
        ("max |JCT error| no fit", fmt_pct(none.get("jct_max_abs_error_pct"), signed=False), ""),
    ]
    if flags:
        glance.append(
            ("configurations worse than no fit", f"{worse} of {len(configs)}", "worse" if worse else "better")
        )
    sections = [
        Section(
            "configurations",
            "Each configuration against no fit",
            f"Each configuration's runs predicted by the fit without them ({schemes[headline]}) beside no fit, mean "
            f"|JCT error|, green within {JCT_MEAN_GOAL_PCT:g} % (the totals' max within {2 * JCT_MEAN_GOAL_PCT:g} %); "
            "the red marks: what the host's speed alone moves the configuration by and, with repeats, its measured "
            "run-to-run spread.",
            ("crossval",),
            body_html=_cv_configuration_table(result, schemes) + "".join(f"<p>{_esc(n)}</p>" for n in notes),
        ),
        Section(
            "traces",
            "Every trace",
            "Mean JCT error per run, (simulated − measured) / measured, green within 10 %.",
            body_html=_cv_trace_table(result, schemes),
        ),
    ]
    comp = result.get("against_reference")
    if comp and comp.get("rows"):
        sections.append(
            Section(
                "against-fp16",
                f"Each method against {comp['rows'][0]['reference']}",
                f"Mean JCT against {comp['rows'][0]['reference']}'s over the same requests on the same host, in %: "
                "measured, and each prediction's error in points.",
                body_html=_cv_against_table(comp, schemes),
            )
        )
    return Page(
        title=f"cross-validation · {result['traces']} traces",
        heading=f"Cross-validated calibration over {result['traces']} traces",
        description=f"index {result['index']}",
        subtitles=("error = (simulated − measured) / measured",),
        summary_html=_glance(glance),
        sections=sections,
        figures={"crossval": crossval_figure(result, schemes, headline)},
        footer="Made by hacksim validate --cv from the traces and their scenarios.",
    )


def write_crossval_report(
    result: dict,
    path: str | Path,
    *,
    schemes: dict[str, str],
    headline: str,
    notes: list[str],
    flags: bool = True,
    plotlyjs: str | None = None,
    page_path: Path | None = None,
) -> Path:
    page = crossval_page(result, schemes, headline, notes, flags)
    return write_page(page, path, plotlyjs=plotlyjs, page_path=page_path)
