"""``build_report(run_dir)``: the simulate report, one page of the shared template (reports/page.py).

The first screen gives, per method, mean JCT, peak decode memory and the dequantization and
approximation overhead, each with its change against the baseline; below come the change table,
per-method statistics, the figures, the calibration profile and the resolved scenario. A change is
(method − baseline) / baseline, negative where the method takes less time or fewer bytes, as the
terminal prints it; green marks better, red worse.
"""

from __future__ import annotations

import html
import json
import math
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .banners import overload_banner
from .data import RunData, load_run, parts_in_words
from .figures import figure_notes, make_figures
from .page import FIGURES_SCRIPT_ID, Page, Section, write_page
from .style import fmt_bytes, fmt_pct, fmt_seconds, method_colours, method_label
from .tables import HIGHER_IS_BETTER, METRICS, changes_table, latency_table, metric_values

if TYPE_CHECKING:
    import pandas as pd

Progress = Callable[[int, int, str], None]

SOURCE_TEXT = {
    "measured": "timed on this GPU by kernels_calibration",
    "derived": "scaled from a profile measured on another GPU, each kernel's time split by unit and repriced at this "
    "GPU's rates (checked on the H100: 6.6 % median error per kernel, against 4.7 % for a fit to its own rows)",
    "roofline": "no profile for this GPU: datasheet peaks times named efficiency factors (least certain)",
}

# Page sections: (anchor, heading, lead text, figures in it).
FIGURE_SECTIONS = (
    (
        "breakdown",
        "JCT breakdown",
        f"Mean seconds per request in each of the {parts_in_words()} phases, stacked; the label on top is the total.",
        ("jct_breakdown",),
    ),
    (
        "distributions",
        "Latency distributions",
        "Empirical CDFs over every completed request; dotted lines mark the median and the 90th percentile.",
        ("cdf_jct", "cdf_ttft", "cdf_tpot"),
    ),
    (
        "memory",
        "Decode memory",
        "Memory in use on each decode replica over the run, as the simulator recorded it, "
        "against the replica's capacity.",
        ("decode_memory",),
    ),
    (
        "links",
        "Link utilisation",
        "Throughput of KV transfers on each prefill→decode link, with the link's capacity dashed.",
        ("link_utilisation",),
    ),
    (
        "tradeoff",
        "Accuracy/speed trade-off",
        "Relative error of the compressed attention kernels, from the "
        "calibration profile, beside each method's mean JCT.",
        ("accuracy_tradeoff",),
    ),
)


def _esc(x) -> str:
    return html.escape(str(x), quote=True)


def _swatch(colour: str) -> str:
    return f'<span class="sw" style="background:{colour}"></span>'


def _fmt(kind: str, v: float) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "–"
    return {"s": fmt_seconds, "bytes": fmt_bytes}.get(kind, lambda x: f"{x:.3g} req/s")(v)


def _change_cell(change: float, higher_is_better: bool = False, cls: str = "") -> str:
    if change is None or math.isnan(change):
        return f'<td class="na {cls}">–</td>'
    better = change > 0.05 if higher_is_better else change < -0.05
    worse = change < -0.05 if higher_is_better else change > 0.05
    tone = " better" if better else " worse" if worse else ""
    return f'<td class="{cls}{tone}">{fmt_pct(change)}</td>'


def _glance_html(run: RunData) -> str:
    """Per method: mean JCT, peak decode memory, dequantize + approximation per request, and their changes."""
    colours = method_colours(run.methods, run.kinds)
    base = run.baseline
    summary = run.summary["methods"]

    def value(m, *path):
        v = summary.get(m) or {}
        for k in path:
            v = v.get(k) if isinstance(v, dict) else None
        return float(v) if isinstance(v, (int, float)) else math.nan

    def overhead(m):
        return value(m, "breakdown_s", "dequantize") + value(m, "breakdown_s", "approximation")

    def change(v, b):
        return (v - b) / b * 100 if b and math.isfinite(b) and math.isfinite(v) and b > 0 else math.nan

    host = run.summary.get("host_speed")  # simulate --host-spread: what the host's speed alone moves each mean JCT by
    rows = []
    for m in run.methods:
        jct, mem, over = value(m, "jct_s", "mean"), value(m, "peak_decode_memory_bytes"), overhead(m)
        share = f"{100 * over / jct:.1f}% of JCT" if jct > 0 and math.isfinite(over) else ""
        vs_base = base is not None and m != base
        spread = value(m, "host_spread_jct_mean_pct")
        rows.append(
            f"<tr><td>{_swatch(colours[m])}{_esc(method_label(m))}</td><td>{_esc(fmt_seconds(jct))}</td>"
            + (
                (f'<td class="d">±{spread:.1f}%</td>' if math.isfinite(spread) else '<td class="d">–</td>')
                if host
                else ""
            )
            + (_change_cell(change(jct, value(base, "jct_s", "mean")), cls="d") if vs_base else '<td class="d"></td>')
            + f"<td>{_esc(fmt_bytes(mem))}</td>"
            + (
                _change_cell(change(mem, value(base, "peak_decode_memory_bytes")), cls="d")
                if vs_base
                else '<td class="d"></td>'
            )
            + f'<td>{_esc(fmt_seconds(over))}</td><td class="d">{_esc(share)}</td></tr>'
        )
    return (
        '<table class="glance" id="table-glance"><thead><tr><th>method</th><th>JCT mean</th>'
        + ("<th>± host</th>" if host else "")
        + "<th>vs baseline</th><th>peak decode memory</th><th>vs baseline</th><th>dequantize + approximation</th>"
        f"<th>per request</th></tr></thead><tbody>{''.join(rows)}</tbody></table>"
        + (f'<p class="glance-note">{_esc(host["line"])}</p>' if host and host.get("line") else "")
    )


def _requests_per_method(run: RunData) -> int | None:
    """Requests each method was given: summary.json's `requests`, else completed + failed of a method."""
    n = run.summary.get("requests")
    if isinstance(n, (int, float)) and not isinstance(n, bool):
        return int(n)
    for m in run.methods:
        stats = run.summary["methods"].get(m) or {}
        done, failed = stats.get("completed"), stats.get("failed", 0)
        if isinstance(done, (int, float)):
            return int(done) + int(failed or 0)
    return None


def _outcomes_line(run: RunData) -> str | None:
    """Per method, how many requests failed (and why) and were retried, when any was."""
    parts = []
    for m in run.methods:
        stats = run.summary["methods"].get(m) or {}
        failed, retried = int(stats.get("failed") or 0), int(stats.get("retried") or 0)
        if failed or retried:
            why = ", ".join(f"{int(k):,} {r}" for r, k in (stats.get("failure_reasons") or {}).items())
            parts.append(
                f"{method_label(m)}: {int(stats.get('completed') or 0):,} completed, {failed:,} failed"
                + (f" ({why})" if why else "")
                + f", {retried:,} retried"
            )
    return "requests that a fault hit · " + "; ".join(parts) if parts else None


def _subtitles(run: RunData) -> tuple[str, ...]:
    methods = run.methods
    n = _requests_per_method(run)
    line = (
        f"run folder {run.run_dir.name} · {len(methods)} method(s) · "
        + ("baseline: " + method_label(run.baseline) if run.baseline else "no baseline in this run")
        + f" · {'–' if n is None else f'{n:,}'} requests per method, seed "
        + f"{run.summary.get('seed', '–')}"
    )
    outcomes = _outcomes_line(run)
    lines = (line,) if outcomes is None else (line, outcomes)
    profs = {role: (run.profiles or {}).get(role) for role in ("prefill", "decode")}
    profs = {k: v for k, v in profs.items() if isinstance(v, dict)}
    if not profs:
        return lines
    cal = "calibration: " + ", ".join(
        f"{role} {p.get('gpu', '?')} {p.get('source', 'unknown')}"
        + (f" from {p['derived_from']}" if p.get("derived_from") else "")
        for role, p in profs.items()
    )
    return (*lines, cal)


def _changes_html(run: RunData) -> str:
    red, baseline = changes_table(run), run.baseline
    colours = method_colours(run.methods, run.kinds)
    if red is None or baseline is None:  # changes_table is None exactly when there is no baseline
        return (
            '<div class="note">This run has no <code>baseline</code> method, so there are no changes to '
            "compute; the absolute values are in the next table.</div>"
        )
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
            gain = -v if label not in HIGHER_IS_BETTER else v
            cls = "better" if gain >= 0.05 else ("worse" if gain <= -0.05 else "")
            # Tint grows with the size of the change, capped at 80%.
            a = min(abs(v), 80) / 80 * 0.35 if cls else 0.0
            bg = f"rgba(22,163,74,{a:.3f})" if gain > 0 else f"rgba(220,38,38,{a:.3f})"
            tip = f"{method_label(m)}: {_fmt(kinds[label], values.at[label, m])}"
            cells.append(f'<td class="{cls}" style="background:{bg}" title="{_esc(tip)}">{fmt_pct(v)}</td>')
        base_v = _fmt(kinds[label], values.at[label, baseline])
        body.append(f"<tr><td>{_esc(label)}</td><td>{_esc(base_v)}</td>{''.join(cells)}</tr>")
    return (
        f'<div class="scroll"><table id="table-changes"><thead><tr><th>metric</th><th>{_swatch(colours[baseline])}'
        f"baseline (absolute)</th>{head}</tr></thead><tbody>{''.join(body)}</tbody></table></div>"
    )


def _forms(stats: dict) -> str:
    """Which prefill attention ran, as 'fp16 990 · homomorphic 10' (runs written before it was recorded: –)."""
    forms = stats.get("prefill_attention")
    if not isinstance(forms, dict) or not forms:
        return "–"
    return " · ".join(f"{form} {int(n):,}" for form, n in forms.items())


def _latency_html(run: RunData) -> str:
    lat = latency_table(run)
    values = metric_values(run)
    colours = method_colours(run.methods, run.kinds)
    qs = ("mean", "p50", "p90", "p99")
    groups = (("jct", "JCT"), ("ttft", "TTFT"), ("tpot", "TPOT"))
    top = (
        '<tr><th rowspan="2">method</th><th rowspan="2">completed</th><th rowspan="2">throughput</th>'
        + "".join(f'<th colspan="4" class="grp">{g}</th>' for _, g in groups)
        + '<th colspan="2" class="grp">KV bytes/token</th><th rowspan="2">peak decode<br>memory</th>'
        + '<th rowspan="2">prefill attention<br>(requests per form)</th></tr>'
    )
    sub = (
        "<tr>"
        + "".join(f'<th class="{"grp0" if q == "mean" else ""}">{q}</th>' for _ in groups for q in qs)
        + '<th class="grp0">wire</th><th>memory</th></tr>'
    )
    rows = []
    for m in lat.index:
        done = lat.at[m, "completed"]
        cells = f"<td>{'–' if math.isnan(done) else f'{int(done):,}'}</td><td>{_esc(_fmt('rps', lat.at[m, 'throughput_rps']))}</td>"
        for key, _ in groups:
            cells += "".join(
                f'<td class="{"grp0" if q == "mean" else ""}">{_esc(fmt_seconds(lat.at[m, f"{key} {q}"]))}</td>'
                for q in qs
            )
        cells += "".join(
            f'<td class="{"grp0" if i == 0 else ""}">{_esc(fmt_bytes(values.at[label, m]))}</td>'
            for i, label in enumerate(("KV bytes/token on the wire", "KV bytes/token in memory", "Peak decode memory"))
        )
        cells += f"<td>{_esc(_forms(run.summary['methods'].get(m) or {}))}</td>"
        rows.append(f"<tr><td>{_swatch(colours[m])}{_esc(method_label(m))}</td>{cells}</tr>")
    return (
        f'<div class="scroll"><table id="table-methods" class="compact"><thead>{top}{sub}</thead>'
        f"<tbody>{''.join(rows)}</tbody></table></div>"
    )


def _memory_terms_html(run: RunData) -> str:
    """How each method's decode KV pool was sized (summary.json decode_memory; costmodel/memory.py):
    per GPU, requested − weights − activation peak − non-torch − CUDA graphs, then whole blocks per replica."""
    rows = []
    colours = method_colours(run.methods, run.kinds)
    for m in run.methods:
        mem = (run.summary["methods"].get(m) or {}).get("decode_memory")
        if not isinstance(mem, dict):
            continue
        fixed = mem.get("fixed_pool_bytes")
        cells = [
            fmt_bytes(mem.get(k))
            for k in (
                "requested_bytes",
                "weights_bytes",
                "activation_peak_bytes",
                "non_torch_bytes",
                "cuda_graph_bytes",
                "kv_pool_bytes_per_gpu",
            )
        ]
        rows.append(
            f"<tr><td>{_swatch(colours[m])}{_esc(method_label(m))}</td>"
            + "".join(f"<td>{_esc(c)}</td>" for c in cells)
            + f"<td>{_esc(mem.get('gpus', '–'))}</td>"
            + f"<td>{_esc('fixed ' + fmt_bytes(fixed) if fixed is not None else '–')}</td>"
            + f"<td>{_esc(mem.get('block_tokens', '–'))} tokens, {_esc(fmt_bytes(mem.get('block_bytes')))}</td>"
            + f"<td>{int(mem.get('blocks', 0)):,}</td><td>{_esc(fmt_bytes(mem.get('kv_capacity_bytes')))}</td></tr>"
        )
    if not rows:
        return ""
    return (
        '<p class="lead">How the decode KV pool was sized, as vLLM sizes it: per GPU, the requested memory '
        "(utilization × memory) less the weights, the activation peak of a forward pass at max_batch_tokens, "
        "non-torch memory and CUDA graphs; the replica holds whole blocks of it.</p>"
        '<div class="scroll"><table id="table-memory" class="compact"><thead><tr><th>method</th>'
        "<th>requested</th><th>weights</th><th>activation peak</th><th>non-torch</th><th>CUDA graphs</th>"
        "<th>KV pool per GPU</th><th>GPUs</th><th>fixed pool</th><th>block</th><th>blocks</th>"
        f"<th>KV capacity per replica</th></tr></thead><tbody>{''.join(rows)}</tbody></table></div>"
    )


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
        rows.append(
            f"<tr><td>{role}</td><td>{_esc(p.get('gpu', '–'))}</td><td>{badge}</td>"
            f"<td>{_esc(p.get('derived_from') or '–')}</td><td><code>{_esc(p.get('path') or '–')}</code></td>"
            f"<td style='white-space:normal'>{_esc(SOURCE_TEXT.get(src, ''))}</td></tr>"
        )
    eng = prof.get("engine")
    if isinstance(eng, dict):  # an engine calibration (cli.py calibrate --traces) on top of the kernel profiles
        fitted = ", ".join(
            f"{k} = {v['value']:.4g} ± {v['stderr']:.2g}"
            for k, v in (eng.get("fitted") or {}).items()
            if isinstance(v, dict) and v.get("stderr") is not None
        )
        left = eng.get("not_applied") or []
        kept = (
            f"; not applied (calibration.engine_scopes {', '.join(eng.get('scopes') or [])}), the scenario's own: "
            + ", ".join(left)
            if left
            else ""
        )
        beyond = eng.get("outside") or []
        if beyond:  # simulator/domain.py: where this scenario extrapolates the fit
            kept += "; this scenario lies outside the runs it was fitted on: " + "; ".join(beyond)
        rows.append(
            f"<tr><td>engine</td><td>–</td><td>{_esc(eng.get('engine') or '–')}</td><td>–</td>"
            f"<td><code>{_esc(eng.get('path') or '–')}</code></td>"
            f"<td style='white-space:normal'>{_esc('fitted to measured runs: ' + fitted + kept)}</td></tr>"
        )
    return (
        '<div class="scroll"><table id="table-profiles" class="left"><thead><tr><th>role</th><th>GPU</th><th>source</th>'
        "<th>derived from</th><th>profile file</th><th>what the source means</th></tr></thead>"
        f"<tbody>{''.join(rows)}</tbody></table></div>"
    )


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
        names = [
            str(x.get("label") or x.get("name") or x.get("method") or "…") if isinstance(x, dict) else str(x) for x in v
        ]
        return ", ".join(names)
    return str(v)


def _scenario_html(run: RunData) -> str:
    sc = run.scenario
    if not sc:
        return '<div class="note">scenario.json is missing.</div>'
    facts = "".join(f"<dt>{_esc(k)}</dt><dd>{_esc(_short(v))}</dd>" for k, v in sc.items())
    blocks = "".join(
        f"<details{' open' if i == 0 else ''}><summary>{_esc(k)}</summary><pre>{_esc(json.dumps(v, indent=2))}</pre></details>"
        for i, (k, v) in enumerate((k, v) for k, v in sc.items() if isinstance(v, (dict, list)))
    )
    return (
        f'<dl class="facts">{facts}</dl>{blocks}<details><summary>whole scenario.json</summary>'
        f"<pre>{_esc(json.dumps(sc, indent=2))}</pre></details>"
    )


def report_page(run: RunData, figures: dict, notes: dict[str, str]) -> Page:
    """The simulate report as a Page, from a loaded run and its figures."""
    sections = [
        Section(
            "changes",
            "Change against the baseline",
            "(method − baseline) / baseline: negative is less time or fewer bytes, as the terminal prints it; "
            "green where the method is better, red where worse (for throughput more is better). Hover a cell "
            "for the method's absolute value.",
            body_html=_changes_html(run),
        ),
        Section(
            "methods",
            "Per-method statistics",
            "Seconds unless marked; bytes in binary units.",
            body_html=_latency_html(run),
        ),
    ]
    for anchor, heading, lead, names in FIGURE_SECTIONS:
        shown = tuple(n for n in names if n in figures)
        msgs = tuple(dict.fromkeys(notes[n] for n in names if n in notes))
        body = _memory_terms_html(run) if anchor == "memory" else ""
        sections.append(Section(anchor, heading, lead if shown else "", shown, notes=msgs, body_html=body))
    sections += [
        Section(
            "profile",
            "Calibration profile",
            "Which kernel-cost profile priced prefill and decode, and how it was obtained.",
            body_html=_profile_html(run),
        ),
        Section("scenario", "Scenario", "The resolved scenario this run simulated.", body_html=_scenario_html(run)),
    ]
    if run.notes:
        sections.append(Section("data-notes", "Data notes", notes=tuple(run.notes)))
    desc = (run.scenario or {}).get("description") or ""
    return Page(
        title=run.name,
        heading=run.name,
        description=desc,
        subtitles=_subtitles(run),
        summary_html=overload_banner(run.summary) + (_glance_html(run) if run.methods else ""),
        sections=sections,
        figures=figures,
        footer="Made by hacksim reports from the run folder's files.",
    )


def build_report(
    run_dir: str | Path,
    *,
    progress: Progress | None = None,
    plotlyjs: str | None = None,
    final_dir: str | Path | None = None,
    tables: dict[str, pd.DataFrame] | None = None,
) -> Path:
    """Write ``run_dir/report.html`` from the run's files and return its path.

    ``progress``, if given, is called as ``progress(done, total, label)`` after each step; ``plotlyjs``
    (a path or URL) loads plotly.js from there instead of embedding it. ``final_dir``: the folder the
    run's files will move to (simulate builds the report beside the tables in a temporary folder and
    moves them together), named on the page and the base of a relative ``plotlyjs`` path. ``tables``: the
    CSV files' frames, still in memory where they were written (`load_run`), so they are not read back.
    """
    steps = ("read run files", "build figures", "write report.html")
    tick = (lambda i: progress(i + 1, len(steps), steps[i])) if progress else (lambda i: None)
    run = load_run(run_dir, tables)
    final = Path(run_dir) if final_dir is None else Path(final_dir)
    run = replace(run, run_dir=final)
    tick(0)
    figures = make_figures(run)
    notes = figure_notes(run)
    tick(1)
    out = write_page(
        report_page(run, figures, notes),
        Path(run_dir) / "report.html",
        plotlyjs=plotlyjs,
        page_path=final / "report.html",
    )
    tick(2)
    return out


def _decode_arrays(node: Any) -> Any:
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
