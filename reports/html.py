"""``build_report(run_dir)``: one self-contained HTML page (plotly.js inlined once, no network).

All figures travel as one JSON object in ``<script type="application/json" id="hacksim-figures">``
(name -> plotly figure JSON) and a few lines of script draw each into ``<div id="fig-NAME">``, so the
page works from a file:// URL offline and tests can read every figure back from the HTML.
The page has no timestamp: the same run directory gives the same bytes.
"""
from __future__ import annotations

import html
import json
import math
from pathlib import Path
from typing import Callable

import pandas as pd
import plotly.io as pio
from plotly.offline import get_plotlyjs

from .data import RunData, load_run
from .figures import make_figures, figure_notes
from .style import fmt_bytes, fmt_pct, fmt_seconds, method_colours, method_label
from .tables import METRICS, latency_table, metric_values, reductions_table

FIGURES_SCRIPT_ID = "hacksim-figures"
Progress = Callable[[int, int, str], None]

SOURCE_TEXT = {
    "measured": "timed on this GPU by kernels_calibration",
    "derived": "scaled from a profile measured on another GPU, by the catalog's peak ratios",
    "roofline": "no profile for this GPU: datasheet peaks times named efficiency factors (least certain)",
}

CSS = """
:root { --ink:#1f2937; --muted:#6b7280; --line:#e5e7eb; --bg:#f3f4f6; --card:#ffffff; --accent:#dc2626; }
* { box-sizing: border-box; }
body { margin:0; background:var(--bg); color:var(--ink);
       font:14px/1.5 Inter,-apple-system,'Segoe UI',Roboto,Helvetica,Arial,sans-serif; }
header { background:linear-gradient(120deg,#111827,#1f2937 60%,#3f1d1d); color:#f9fafb; padding:28px 40px 22px; }
header h1 { margin:0 0 4px; font-size:26px; font-weight:650; letter-spacing:-.01em; }
header .sub { color:#9ca3af; font-size:12.5px; }
header .desc { color:#e5e7eb; font-size:15px; margin-bottom:4px; }
header .sub code { color:#fca5a5; }
.tiles { display:grid; grid-template-columns:repeat(auto-fit,minmax(150px,1fr)); gap:12px; margin-top:18px; }
.tile { background:rgba(255,255,255,.07); border:1px solid rgba(255,255,255,.12); border-radius:10px; padding:10px 14px; }
.tile .k { font-size:11px; text-transform:uppercase; letter-spacing:.06em; color:#9ca3af; }
.tile .v { font-size:19px; font-weight:650; margin-top:2px; }
.tile .d { font-size:12px; color:#d1d5db; }
.tile .good { color:#86efac; } .tile .bad { color:#fca5a5; }
nav { position:sticky; top:0; z-index:5; background:#fff; border-bottom:1px solid var(--line); padding:8px 40px;
      display:flex; gap:18px; flex-wrap:wrap; font-size:13px; }
nav a { color:var(--muted); text-decoration:none; } nav a:hover { color:var(--accent); }
main { max-width:1320px; margin:0 auto; padding:20px 24px 40px; }
section { background:var(--card); border:1px solid var(--line); border-radius:12px; padding:18px 22px; margin:18px 0;
          box-shadow:0 1px 2px rgba(0,0,0,.03); }
section h2 { margin:0 0 4px; font-size:18px; font-weight:650; }
section p.lead { margin:0 0 12px; color:var(--muted); }
.note { background:#fffbeb; border:1px solid #fde68a; color:#92400e; border-radius:8px; padding:8px 12px; margin:10px 0; }
.grid3 { display:grid; grid-template-columns:repeat(auto-fit,minmax(380px,1fr)); gap:12px; }
.figure { width:100%; }
table { border-collapse:collapse; width:100%; font-variant-numeric:tabular-nums; }
th, td { padding:6px 10px; border-bottom:1px solid var(--line); text-align:right; white-space:nowrap; }
th { font-weight:600; font-size:12px; color:#374151; background:#f9fafb; }
th:first-child, td:first-child { text-align:left; }
.scroll { overflow-x:auto; }
table.compact { font-size:13px; } table.compact th, table.compact td { padding:5px 6px; }
th.grp { text-align:center; border-left:2px solid var(--line); }
.grp0 { border-left:2px solid var(--line); }
table.left th, table.left td { text-align:left; }
.sw { display:inline-block; width:10px; height:10px; border-radius:3px; margin-right:6px; vertical-align:0; }
td.pos { color:#166534; } td.neg { color:#991b1b; } td.na { color:#9ca3af; }
.badge { display:inline-block; padding:1px 8px; border-radius:999px; font-size:12px; font-weight:600; }
.badge.measured { background:#dcfce7; color:#166534; } .badge.derived { background:#fef3c7; color:#92400e; }
.badge.roofline { background:#fee2e2; color:#991b1b; } .badge.unknown { background:#e5e7eb; color:#374151; }
details { border:1px solid var(--line); border-radius:8px; margin:8px 0; background:#fafafa; }
details > summary { cursor:pointer; padding:7px 12px; font-weight:600; }
details pre { margin:0; padding:10px 14px; border-top:1px solid var(--line); overflow-x:auto; font-size:12.5px;
              background:#fff; border-radius:0 0 8px 8px; }
dl.facts { display:grid; grid-template-columns:max-content 1fr; gap:4px 18px; margin:0 0 10px; }
dl.facts dt { color:var(--muted); } dl.facts dd { margin:0; }
footer { text-align:center; color:var(--muted); font-size:12px; padding:10px 0 30px; }
"""

RENDER_JS = """
(function () {
  var specs = JSON.parse(document.getElementById('%s').textContent);
  Object.keys(specs).forEach(function (name) {
    var el = document.getElementById('fig-' + name);
    if (!el) { return; }
    var spec = specs[name];
    Plotly.newPlot(el, spec.data, spec.layout, {
      responsive: true, displaylogo: false, displayModeBar: 'hover',
      toImageButtonOptions: {format: 'png', filename: name, scale: 2}
    });
  });
  document.body.setAttribute('data-figures-drawn', Object.keys(specs).length);
})();
""" % FIGURES_SCRIPT_ID

# Page sections: (anchor, heading, lead text, figures in it).
FIGURE_SECTIONS = (
    ("breakdown", "JCT breakdown", "Mean seconds per request in each of the nine phases, stacked; the label on "
     "top is the total.", ("jct_breakdown",)),
    ("distributions", "Latency distributions", "Empirical CDFs over every completed request; dotted lines mark the "
     "median and the 90th percentile.", ("cdf_jct", "cdf_ttft", "cdf_tpot")),
    ("memory", "Decode memory", "Memory in use on each decode replica over the run, as the simulator recorded it, "
     "against the replica's capacity.", ("decode_memory",)),
    ("links", "Link utilisation", "Throughput of KV transfers on each prefill→decode link, with the link's "
     "capacity dashed.", ("link_utilisation",)),
    ("tradeoff", "Accuracy/speed trade-off", "Relative error of the compressed attention kernels, from the "
     "calibration profile, beside each method's mean JCT.", ("accuracy_tradeoff",)),
)


def _esc(x) -> str:
    return html.escape(str(x), quote=True)


def _fig_json(fig) -> str:
    # "</" inside a <script> would end it; "<\/" is the same JSON string.
    return pio.to_json(fig, validate=False, pretty=False).replace("</", "<\\/")


def _swatch(colour: str) -> str:
    return f'<span class="sw" style="background:{colour}"></span>'


def _tile(key: str, value: str, detail: str = "", good: bool | None = None) -> str:
    cls = "" if good is None else (" good" if good else " bad")
    return (f'<div class="tile"><div class="k">{_esc(key)}</div><div class="v">{_esc(value)}</div>'
            f'<div class="d{cls}">{_esc(detail)}</div></div>')


def _fmt(kind: str, v: float) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "–"
    return {"s": fmt_seconds, "bytes": fmt_bytes}.get(kind, lambda x: f"{x:.3g} req/s")(v)


def _header(run: RunData) -> str:
    methods = run.methods
    values = metric_values(run)
    first = run.summary["methods"].get(methods[0], {}) if methods else {}
    n_done = first.get("completed")
    tiles = [_tile("Methods", str(len(methods)), ", ".join(method_label(m) for m in methods[:4])
                   + ("…" if len(methods) > 4 else "")),
             _tile("Requests per method", "–" if n_done is None else f"{int(n_done):,}",
                   f"seed {run.summary.get('seed', '–')}")]
    base = run.baseline
    for label, kind, title in (("JCT mean", "s", "Best mean JCT"), ("TTFT p90", "s", "Best p90 TTFT"),
                               ("KV bytes/token on the wire", "bytes", "Least KV on the wire"),
                               ("Peak decode memory", "bytes", "Lowest peak decode memory")):
        row = values.loc[label].dropna() if label in values.index else pd.Series(dtype=float)
        if row.empty:
            continue
        best = row.idxmin()
        ties = [m for m in row.index if m != best and math.isclose(row[m], row[best], rel_tol=1e-9)]
        who = method_label(best) + (f" (+{len(ties)} tied)" if ties else "")
        detail, good = who, None
        if base is not None and best != base and base in row and row[base] > 0:
            red = (row[base] - row[best]) / row[base] * 100
            detail, good = f"{who}: {fmt_pct(-red)} vs baseline", red > 0
        tiles.append(_tile(title, _fmt(kind, row[best]), detail, good))
    profs = {role: (run.profiles or {}).get(role) for role in ("prefill", "decode")}
    profs = {k: v for k, v in profs.items() if isinstance(v, dict)}
    if profs:
        sources = sorted({str(p.get("source", "unknown")) for p in profs.values()})
        detail = ", ".join(f"{role} {p.get('gpu', '?')}" + (f" from {p['derived_from']}" if p.get("derived_from") else "")
                           for role, p in profs.items())
        tiles.append(_tile("Calibration", " / ".join(sources), detail,
                           None if sources == ["measured"] else False if "roofline" in sources else None))
    desc = (run.scenario or {}).get("description")
    desc_html = f'<div class="desc">{_esc(desc)}</div>' if desc else ""
    return (f'<header><h1>{_esc(run.name)}</h1>{desc_html}<div class="sub">hacksim report · run folder '
            f'<code>{_esc(run.run_dir.name)}</code> · {len(methods)} method(s)'
            f'{" · baseline: " + method_label(base) if base else " · no baseline in this run"}</div>'
            f'<div class="tiles">{"".join(tiles)}</div></header>')


def _reductions_html(run: RunData) -> str:
    red = reductions_table(run)
    colours = method_colours(run.methods, run.kinds)
    if red is None:
        return ('<div class="note">This run has no <code>baseline</code> method, so there are no reductions to '
                'compute; the absolute values are in the next table.</div>')
    if red.empty:
        return '<div class="note">Only the baseline was simulated: nothing to compare.</div>'
    values = metric_values(run)
    kinds = {label: kind for label, _, kind in METRICS}
    head = "".join(f"<th>{_swatch(colours[m])}{_esc(method_label(m))}</th>" for m in red.columns)
    body = []
    for label in red.index:
        cells = []
        for m in red.columns:
            v = red.at[label, m]
            if math.isnan(v):
                cells.append('<td class="na">–</td>')
                continue
            cls = "pos" if v >= 0.05 else ("neg" if v <= -0.05 else "")
            # Tint grows with the size of the change, capped at 80%.
            a = min(abs(v), 80) / 80 * 0.35 if cls else 0.0
            bg = f"rgba(22,163,74,{a:.3f})" if v > 0 else f"rgba(220,38,38,{a:.3f})"
            tip = f"{method_label(m)}: {_fmt(kinds[label], values.at[label, m])}"
            cells.append(f'<td class="{cls}" style="background:{bg}" title="{_esc(tip)}">{fmt_pct(v)}</td>')
        base_v = _fmt(kinds[label], values.at[label, run.baseline])
        body.append(f"<tr><td>{_esc(label)}</td><td>{_esc(base_v)}</td>{''.join(cells)}</tr>")
    return (f'<div class="scroll"><table id="table-reductions"><thead><tr><th>metric</th><th>{_swatch(colours[run.baseline])}'
            f'baseline (absolute)</th>{head}</tr></thead><tbody>{"".join(body)}</tbody></table></div>')


def _latency_html(run: RunData) -> str:
    lat = latency_table(run)
    values = metric_values(run)
    colours = method_colours(run.methods, run.kinds)
    qs = ("mean", "p50", "p90", "p99")
    groups = (("jct", "JCT"), ("ttft", "TTFT"), ("tpot", "TPOT"))
    top = ('<tr><th rowspan="2">method</th><th rowspan="2">completed</th><th rowspan="2">throughput</th>'
           + "".join(f'<th colspan="4" class="grp">{g}</th>' for _, g in groups)
           + '<th colspan="2" class="grp">KV bytes/token</th><th rowspan="2">peak decode<br>memory</th></tr>')
    sub = "<tr>" + "".join(f'<th class="{"grp0" if q == "mean" else ""}">{q}</th>' for _ in groups for q in qs) \
        + '<th class="grp0">wire</th><th>memory</th></tr>'
    rows = []
    for m in lat.index:
        done = lat.at[m, "completed"]
        cells = f"<td>{'–' if math.isnan(done) else f'{int(done):,}'}</td><td>{_esc(_fmt('rps', lat.at[m, 'throughput_rps']))}</td>"
        for key, _ in groups:
            cells += "".join(f'<td class="{"grp0" if q == "mean" else ""}">{_esc(fmt_seconds(lat.at[m, f"{key} {q}"]))}</td>'
                             for q in qs)
        cells += "".join(f'<td class="{"grp0" if i == 0 else ""}">{_esc(fmt_bytes(values.at[label, m]))}</td>' for i, label in
                         enumerate(("KV bytes/token on the wire", "KV bytes/token in memory", "Peak decode memory")))
        rows.append(f"<tr><td>{_swatch(colours[m])}{_esc(method_label(m))}</td>{cells}</tr>")
    return (f'<div class="scroll"><table id="table-methods" class="compact"><thead>{top}{sub}</thead>'
            f'<tbody>{"".join(rows)}</tbody></table></div>')


def _profile_html(run: RunData) -> str:
    prof = run.profiles
    if not prof:
        return '<div class="note">profiles.json is missing: the calibration used for this run is unknown.</div>'
    rows = []
    for role in ("prefill", "decode"):
        p = prof.get(role)
        if not isinstance(p, dict):
            continue
        src = str(p.get("source", "unknown"))
        badge = f'<span class="badge {src if src in SOURCE_TEXT else "unknown"}">{_esc(src)}</span>'
        rows.append(f"<tr><td>{role}</td><td>{_esc(p.get('gpu', '–'))}</td><td>{badge}</td>"
                    f"<td>{_esc(p.get('derived_from') or '–')}</td><td><code>{_esc(p.get('path') or '–')}</code></td>"
                    f"<td style='white-space:normal'>{_esc(SOURCE_TEXT.get(src, ''))}</td></tr>")
    return ('<div class="scroll"><table id="table-profiles" class="left"><thead><tr><th>role</th><th>GPU</th><th>source</th>'
            '<th>derived from</th><th>profile file</th><th>what the source means</th></tr></thead>'
            f'<tbody>{"".join(rows)}</tbody></table></div>')


def _scalar(v) -> bool:
    return isinstance(v, (str, int, float, bool))


def _short(v, limit: int = 8) -> str:
    """One line for a scenario entry: scalars as k=v, nested objects by their name or preset."""
    if isinstance(v, dict):
        head = next((v[k] for k in ("name", "kind", "dataset") if _scalar(v.get(k))), None)
        parts = []
        for k, x in v.items():
            if x is None or (k in ("name", "kind", "dataset") and x == head):
                continue
            if _scalar(x):
                parts.append(f"{k}={x}")
            elif isinstance(x, dict):
                name = next((x[kk] for kk in ("name", "preset", "kind") if _scalar(x.get(kk))), None)
                if name is not None:
                    parts.append(f"{k}={name}")
        text = ", ".join(parts[:limit]) + (", …" if len(parts) > limit else "")
        return f"{head} ({text})" if head is not None and text else str(head) if head is not None else text or "…"
    if isinstance(v, list):
        names = [str(x.get("label") or x.get("name") or x.get("method") or "…") if isinstance(x, dict) else str(x) for x in v]
        return ", ".join(names)
    return str(v)


def _scenario_html(run: RunData) -> str:
    sc = run.scenario
    if not sc:
        return '<div class="note">scenario.json is missing.</div>'
    facts = "".join(f"<dt>{_esc(k)}</dt><dd>{_esc(_short(v))}</dd>" for k, v in sc.items())
    blocks = "".join(
        f"<details{' open' if i == 0 else ''}><summary>{_esc(k)}</summary><pre>{_esc(json.dumps(v, indent=2))}</pre></details>"
        for i, (k, v) in enumerate((k, v) for k, v in sc.items() if isinstance(v, (dict, list))))
    return (f'<dl class="facts">{facts}</dl>{blocks}<details><summary>whole scenario.json</summary>'
            f'<pre>{_esc(json.dumps(sc, indent=2))}</pre></details>')


def _fig_div(name: str, fig) -> str:
    height = fig.layout.height or 450
    return f'<div class="figure" id="fig-{name}" style="height:{int(height)}px"></div>'


def render_html(run: RunData, figures: dict, notes: dict[str, str]) -> str:
    """The page as a string, from a loaded run and its figures."""
    sections, nav = [], []

    def add(anchor, heading, lead, body):
        nav.append(f'<a href="#{anchor}">{_esc(heading)}</a>')
        lead_html = f'<p class="lead">{_esc(lead)}</p>' if lead else ""
        sections.append(f'<section id="{anchor}"><h2>{_esc(heading)}</h2>{lead_html}{body}</section>')

    add("reductions", "Reductions against the baseline",
        "(baseline − method) / baseline: positive is better (green). Throughput is the gain. Hover a cell for the "
        "method's absolute value.", _reductions_html(run))
    add("methods", "Per-method statistics", "Seconds unless marked; bytes in binary units.", _latency_html(run))
    for anchor, heading, lead, names in FIGURE_SECTIONS:
        divs = [_fig_div(n, figures[n]) for n in names if n in figures]
        msgs = list(dict.fromkeys(notes[n] for n in names if n in notes))
        body = "".join(f'<div class="note">{_esc(m)}</div>' for m in msgs)
        if len(divs) > 1:
            body += f'<div class="grid3">{"".join(divs)}</div>'
        else:
            body += "".join(divs)
        add(anchor, heading, lead if divs else "", body)
    add("profile", "Calibration profile", "Which kernel-cost profile priced prefill and decode, and how it was "
        "obtained.", _profile_html(run))
    add("scenario", "Scenario", "The resolved scenario this run simulated.", _scenario_html(run))
    if run.notes:
        add("data-notes", "Data notes", "", "".join(f'<div class="note">{_esc(n)}</div>' for n in run.notes))

    blob = "{" + ",".join(f"{json.dumps(k)}:{_fig_json(f)}" for k, f in figures.items()) + "}"
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f'<title>hacksim · {_esc(run.name)}</title><style>{CSS}</style>'
        f'<script type="text/javascript">{get_plotlyjs()}</script></head><body>'
        f'{_header(run)}<nav>{"".join(nav)}</nav><main>{"".join(sections)}</main>'
        '<footer>Made by hacksim <code>reports</code> from the run folder\'s files; works offline.</footer>'
        f'<script type="application/json" id="{FIGURES_SCRIPT_ID}">{blob}</script>'
        f'<script type="text/javascript">{RENDER_JS}</script></body></html>\n'
    )


def build_report(run_dir: str | Path, *, progress: Progress | None = None) -> Path:
    """Write ``run_dir/report.html`` from the run's files and return its path.

    ``progress``, if given, is called as ``progress(done, total, label)`` after each step.
    """
    steps = ("read run files", "build figures", "write report.html")
    tick = (lambda i: progress(i + 1, len(steps), steps[i])) if progress else (lambda i: None)
    run = load_run(run_dir)
    tick(0)
    figures = make_figures(run)
    notes = figure_notes(run)
    tick(1)
    out = Path(run_dir) / "report.html"
    out.write_text(render_html(run, figures, notes), encoding="utf-8")
    tick(2)
    return out


def _decode_arrays(node):
    """plotly.py writes numpy arrays as {"dtype", "bdata"[, "shape"]}: turn them back into arrays."""
    import base64

    import numpy as np

    if isinstance(node, dict):
        if set(node) >= {"dtype", "bdata"} and set(node) <= {"dtype", "bdata", "shape"}:
            arr = np.frombuffer(base64.b64decode(node["bdata"]), dtype=np.dtype(node["dtype"]))
            if "shape" in node:
                shape = node["shape"]
                arr = arr.reshape([int(x) for x in (shape.split(",") if isinstance(shape, str) else shape)])
            return arr
        return {k: _decode_arrays(v) for k, v in node.items()}
    if isinstance(node, list):
        return [_decode_arrays(v) for v in node]
    return node


def figures_from_html(path: str | Path) -> dict[str, dict]:
    """Read back every figure embedded in a report.html: name -> {"data": [...], "layout": {...}}."""
    import re

    text = Path(path).read_text(encoding="utf-8")
    m = re.search(rf'<script type="application/json" id="{FIGURES_SCRIPT_ID}">(.*?)</script>', text, re.S)
    if m is None:
        raise ValueError(f"{path}: no embedded figures (is it a hacksim report?)")
    return _decode_arrays(json.loads(m.group(1)))
