"""Each method against the FP16 reference: the comparison a user asks of the simulator, and its error.

A method's mean JCT against FP16's (costmodel.methods.REFERENCE) on the same requests and host, 100 · (JCT_method /
JCT_FP16 − 1), as measured and as each scheme prices it (no fit; with `validate --cv`, each fit), and the error in
points: `against_reference`. `validate INDEX` takes it from its rows (`index_comparison`), `validate --cv` from its
scores (simulator/crossval.py); simulator/noise.py gives its run-to-run spread (`against_reference_spread`), pairing
recordings as `workload_key` does.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from costmodel.methods import REFERENCE

from .fit_items import TraceData

# what makes one workload in a realrun meta.json (the requests), and the process that recorded it (its start: one
# process records every method of a configuration back to back on one host)
WORKLOAD_META = ("rate_rps", "seed", "requests")
PROCESS_META = "date"
PAIRED_BY = (*WORKLOAD_META, PROCESS_META)


def against_pct(own_s: Sequence[float], reference_s: Sequence[float]) -> float:
    """A method's mean JCT against the reference's, in %: 100 · (mean of its runs / mean of the reference's − 1)."""
    return 100.0 * (float(np.mean(own_s)) / float(np.mean(reference_s)) - 1.0)


def workload_key(td: TraceData, machine: str | None) -> tuple:
    """What pairs a run with the reference method's runs over the same requests on the same host: its configuration
    and machine and, for a realrun trace, its rate, seed, request count and process (PAIRED_BY: every method of
    a configuration is recorded back to back in one process on one host, which starts at meta.json's `date`); a
    benchmark file's, its configuration (the scenario says its workload) and machine."""
    extra = tuple(td.meta.get(k) for k in PAIRED_BY) if td.source == "realrun" else ()
    return (td.configuration, machine or "", *extra)


def against_reference(
    per_trace: list[dict], traces: list[TraceData], machines: Sequence[str | None], schemes, noise: dict | None = None
) -> dict:
    """Each method's mean JCT against the FP16 reference's (costmodel.methods.REFERENCE) over the same requests on
    the same host (workload_key): measured, 100 · (JCT_method / JCT_reference − 1) over their runs' means, and as each
    scheme predicts it, with the error in points, the question a method comparison asks of the simulator. Per row
    the run-to-run spread of the measured value where `noise` has it for the scenario (noise.against_reference_spread);
    per scheme the mean and max |error|. Rows need a reference run and every run's score in the scheme."""
    groups: dict[tuple, list[int]] = {}
    for i, td in enumerate(traces):
        groups.setdefault(workload_key(td, machines[i]), []).append(i)
    spread = ((noise or {}).get("against_reference") or {}).get("by_scenario", {})

    def ratio_pct(own: list[int], ref: list[int], scheme: str, field: str) -> float | None:
        a = [per_trace[i][scheme].get(field) for i in own]
        b = [per_trace[i][scheme].get(field) for i in ref]
        if any(x is None for x in a + b):
            return None
        return against_pct(a, b)

    rows: list[dict[str, Any]] = []
    for key in sorted(groups, key=repr):
        idx = groups[key]
        ref = [i for i in idx if traces[i].family == REFERENCE]
        if not ref:
            continue
        for method in sorted({traces[i].method for i in idx if traces[i].family != REFERENCE}):
            own = [i for i in idx if traces[i].method == method]
            measured = ratio_pct(own, ref, "no_fit", "jct_mean_measured_s")
            row: dict[str, Any] = {
                "configuration": key[0],
                "machine": key[1] or None,
                "method": method,
                "workload": dict(zip(PAIRED_BY, key[2:])),  # realrun: rate, seed, requests and the process's start
                "reference": traces[ref[0]].method,
                "runs": [traces[i].name for i in own],
                "reference_runs": [traces[i].name for i in ref],
                "measured_pct": None if measured is None else round(measured, 3),
                "run_to_run_pts": spread.get(key[0]),
            }
            for scheme in schemes:
                pred = ratio_pct(own, ref, scheme, "jct_mean_simulated_s")
                row[scheme] = (
                    None
                    if pred is None or measured is None
                    else {"predicted_pct": round(pred, 3), "error_pts": round(pred - measured, 3)}
                )
            rows.append(row)
    summary = {}
    for scheme in schemes:
        errs = [abs(r[scheme]["error_pts"]) for r in rows if r[scheme]]
        if errs:
            summary[scheme] = {
                "rows": len(errs),
                "mean_abs_error_pts": round(float(np.mean(errs)), 3),
                "max_abs_error_pts": round(float(np.max(errs)), 3),
            }
    pooled = (noise or {}).get("against_reference")
    return {"rows": rows, "summary": summary, "run_to_run_pts": None if pooled is None else pooled["spread_pts"]}


def format_against_reference(result: dict, schemes, heads: dict[str, str]) -> list[str]:
    """The comparison's table (against_reference): per row the measured value and each scheme's prediction with its
    error in points, the run-to-run spread beside them where recorded; nothing where no run has a reference."""
    from reports.terminal import render, table

    comp = result.get("against_reference")
    if not comp or not comp["rows"]:
        return []
    shown = [s for s in schemes if s in comp["summary"]]
    noise = "noise" in result
    machines = any(r["machine"] for r in comp["rows"])

    def cell(x: dict | None) -> str:
        return "n/a" if x is None else f"{x['predicted_pct']:+.1f}% ({x['error_pts']:+.1f})"

    def spread(x: float | None) -> str:
        return "not recorded" if x is None else f"±{x:.1f}"

    body = []
    for r in comp["rows"]:
        rate = r["workload"].get("rate_rps")
        line = [r["configuration"], *([r["machine"] or ""] if machines else [])]
        line += ["" if rate is None else f"{rate:g}", r["method"], str(len(r["runs"]))]
        line += ["n/a" if r["measured_pct"] is None else f"{r['measured_pct']:+.1f}%"]
        line += [cell(r[s]) for s in shown] + ([spread(r["run_to_run_pts"])] if noise else [])
        body.append(line)
    lead = ["", *([""] if machines else []), "", "", "", ""]
    foot = []
    for key, label in (("mean_abs_error_pts", "mean |error| (points)"), ("max_abs_error_pts", "max |error| (points)")):
        foot.append([label, *lead[1:], *(f"{comp['summary'][s][key]:.1f}" for s in shown)])
        if noise:
            foot[-1].append(spread(comp["run_to_run_pts"]) if key == "mean_abs_error_pts" else "")
    heads_row = ["configuration", *(["machine"] if machines else []), "req/s", "method", "runs", "measured"]
    heads_row += [heads[s] for s in shown] + (["run-to-run (points)"] if noise else [])
    ref = comp["rows"][0]["reference"]
    title = (
        f"each method's mean JCT against {ref}'s over the same requests on the same host, in %: measured, and "
        "predicted (error in points)"
    )
    return [render(table(heads_row, body, footer_rows=foot, title=title))]


def index_against_reference(rows: list[dict], noise: dict | None = None) -> list[str]:
    """index_comparison's table; nothing where no row has FP16's beside it."""
    comp = index_comparison(rows, noise)
    if comp is None:
        return []
    doc = {"against_reference": comp, **({"noise": noise} if noise else {})}
    return format_against_reference(doc, ("no_fit",), {"no_fit": "simulated"})


def index_comparison(rows: list[dict], noise: dict | None = None) -> dict | None:
    """validate_index's rows as against_reference compares them (each method's mean JCT against FP16's over
    the same requests on the same host, as the scenario prices it: the scheme `no_fit`); None where no row has FP16's
    beside it (or the rows predate the comparison's fields)."""
    if not rows or any("jct_mean_measured_s" not in r for r in rows):
        return None
    runs = [
        TraceData(
            name=r["trace"],
            scenario=r["scenario"],
            configuration=r["configuration"],
            method=r["method"],
            family=r["family"],
            values0={},
            meta=r["workload"],
            source=r["source"],
        )
        for r in rows
    ]
    scores = [
        {"no_fit": {"jct_mean_measured_s": r["jct_mean_measured_s"], "jct_mean_simulated_s": r["jct_mean_simulated_s"]}}
        for r in rows
    ]
    comp = against_reference(scores, runs, [r["machine"] for r in rows], ("no_fit",), noise)
    return comp if comp["rows"] else None
