"""Score an engine calibration on runs it has not seen: held out by trace and, the headline, by configuration.

`cross_validate(index)` fits the engine (simulator/calibrate.py) on all runs of an index (in-sample), on all but
one (leave one trace out) and on all but one configuration (the runs of one scenario: model × link ×
workload), and simulates each run with the calibration fitted without it. Beside them, each
run is simulated with no fit at all (the scenario's own values: the kernels' prices and the scenario's engine
terms). The held-out-configuration figures are the ones to quote: they say how a calibration carries to a
setting it was not fitted on; a configuration whose held-out fit predicts it worse than no fit is flagged, and each
configuration's row names the parameters that move most without it (`moved_without`: what only it shows the fit).

A scheme is scored only where a fit without the run exists: with one run there is no leave-one-out fit, with one
configuration no leave-one-configuration-out fit, and the result says so (`notes`) rather than show the no-fit
prediction under a held-out name.

Folds run in `workers` processes; a SIGTERM or Ctrl-C to the caller (cli.py turns it into an exception) ends
them at once (`process_pool.map_in_processes`).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from costmodel.methods import REFERENCE

from .calibrate import (
    HOST_TIMES,
    PRIOR_SCALES,
    fit_engine,
    fit_values,
    load_index,
    on_machine,
    prior_sd,
    prior_widths,
)
from .comparison import against_reference, format_against_reference
from .config import ScenarioError
from .fit_items import TraceData
from .host_speed import host_speed_line, host_spread
from .noise import noise_summary
from .process_pool import Progress, map_in_processes
from .validate import host_gauge_lines, run_host_sensitivity

FITTING = ("fitting the folds", "fits")
SIMULATING = ("simulating the runs", "runs")

CV_KEYS = {
    "jct_mean_abs_error_pct": ("jct_mean_error_pct", np.mean),
    "jct_max_abs_error_pct": ("jct_mean_error_pct", np.max),
    "ttft_p50_mean_abs_error_pct": ("ttft_p50_error_pct", np.mean),
    "tpot_p50_mean_abs_error_pct": ("tpot_p50_error_pct", np.mean),
}
TRACE_KEYS = (
    "jct_mean_error_pct",
    "ttft_p50_error_pct",
    "tpot_p50_error_pct",
    "prefill_mean_error_pct",
    "quantize_mean_error_pct",
    "transfer_mean_error_pct",
    "decode_mean_error_pct",
    "iteration_mean_error_pct",
    "cadence_mean_error_pct",
)
SCHEMES = ("no_fit", "in_sample", "held_out", "held_out_configuration")
HEADS = {
    "no_fit": "no fit",
    "in_sample": "in-sample",
    "held_out": "held out (trace)",
    "held_out_configuration": "held out (config)",
}


def _score(td: TraceData, trace_path: Path, scenario_path: Path, method: str | None, values: dict | None) -> dict:
    from .validate import validate

    v = validate(trace_path, scenario_path, method=method, engine_values=values, items=td, host=False)
    out = {k: v.get(k) for k in TRACE_KEYS}
    jct = v["metrics"]["jct_s"]
    out["jct_mean_measured_s"], out["jct_mean_simulated_s"] = jct["measured"]["mean"], jct["simulated"]["mean"]
    out["dequantize_share_pct"] = v.get("dequantize_share_pct")
    return out


def _host_job(args) -> float | None:
    return run_host_sensitivity(*args)


def _host_sensitivities(rows: list, workers: int, progress: Progress | None = None) -> list[float | None]:
    """Each run's mean JCT elasticity in its host's speed with no fit (validate.host_sensitivity_of)."""
    jobs = [(r.trace_path, r.scenario_path, r.method) for r in rows]
    return map_in_processes(_host_job, jobs, workers, progress, ("host speed", "runs"))


def _add_host_spreads(per_trace: list[dict], rows: list, workers: int, noise, progress: Progress | None = None) -> dict:
    """Each run's `host_sensitivity` and `host_spread_jct_mean_pct` (it times the host's spread, host_speed.host_spread)
    into its per_trace row; the host's spread used."""
    host = host_spread(noise)
    for r, sens in zip(per_trace, _host_sensitivities(rows, workers, progress)):
        r["host_sensitivity"] = sens
        r["host_spread_jct_mean_pct"] = None if sens is None else round(sens * host["spread_pct"], 3)
    return host


def host_sensitivities(index_csv: str | Path, workers: int = 1) -> list[dict]:
    """Per run of an index: how much its mean JCT moves with its host's speed with no fit (host_speed.host_sensitivity),
    the elasticity `validate --cv` turns into each configuration's host spread."""
    from .measured import read_index

    rows = read_index(index_csv)
    return [
        {"trace": r.trace, "configuration": Path(r.scenario).stem, "host_sensitivity": x}
        for r, x in zip(rows, _host_sensitivities(rows, workers))
    ]


def summarise(per_trace: list[dict], scheme: str) -> dict:
    out = {}
    for key, (col, fn) in CV_KEYS.items():
        vals = [abs(r[scheme][col]) for r in per_trace if r[scheme].get(col) is not None]
        out[key] = round(float(fn(vals)), 3) if vals else None
    within = [
        abs(r[scheme]["jct_mean_error_pct"]) <= 10.0
        for r in per_trace
        if r[scheme].get("jct_mean_error_pct") is not None
    ]
    out["traces_jct_within_10pct"] = int(sum(within))
    return out


FOLDS = ("trace", "configuration")  # what validate --cv holds out by default: each run, then each configuration


def folds(traces: list[TraceData], by: tuple[str, ...] = FOLDS) -> list[tuple[str, tuple[int, ...]]]:
    """(scheme, the runs left out) of every fit: in-sample leaves none out; then, of `by`, a fold per run
    ("trace") and per configuration ("configuration"), each made only where the fit has runs left to learn from
    (module doc)."""
    out: list[tuple[str, tuple[int, ...]]] = [("in_sample", ())]
    if len(traces) > 1 and "trace" in by:
        out += [("held_out", (i,)) for i in range(len(traces))]
    configs = sorted({td.configuration for td in traces})
    if len(configs) > 1 and "configuration" in by:
        out += [
            ("held_out_configuration", tuple(i for i, td in enumerate(traces) if td.configuration == c))
            for c in configs
        ]
    return out


def cross_validate(
    index_csv: str | Path,
    workers: int = 1,
    noise: dict | None = None,
    by: tuple[str, ...] = FOLDS,
    prior_scale: float | str = 1.0,
    progress: Progress | None = None,
) -> dict:
    """No fit, in-sample (one fit on every run), held out (each run predicted by a fit without it) and held out
    by configuration (each configuration's runs predicted by a fit without any of them): per run the errors of
    each, their means, and per configuration no fit against the held-out fit (module doc).  `by` names the
    held-out folds to fit (FOLDS; by configuration alone: one fit per configuration instead of one per run too).
    `workers` > 1 fits and simulates in processes; `noise` (simulator/noise.py) adds the run-to-run spread beside
    the figures; `progress` (process_pool.map_in_processes) hears each fit and simulation as it ends. `prior_scale`
    multiplies every prior width (calibrate.PRIOR_SCALES); "auto" chooses it as calibrate --prior-scale auto does,
    nested: for each held-out configuration from the other configurations alone (_choose_scales), for the in-sample
    fit and the folds by trace from every run (not nested: a choice per run would cost a cross-validation per run;
    the notes say so)."""
    from .measured import read_index

    unknown = [b for b in by if b not in FOLDS]
    if unknown or not by:
        raise ScenarioError(f"folds: {', '.join(unknown) or 'none'}: each of {', '.join(FOLDS)} (one or both)")
    rows = read_index(index_csv)
    traces = load_index(index_csv, workers, progress)
    plan = folds(traces, by)
    if prior_scale == "auto":
        nested = [(s, out) for s, out in plan if s != "held_out"]
        kept = [_kept(traces, out) for _, out in nested]
        choice = dict(zip(nested, _choose_scales(traces, rows, kept, workers, progress=progress)))
        every = choice["in_sample", ()]["value"]
        scales = [choice[s, out]["value"] if (s, out) in choice else every for s, out in plan]
    else:
        if isinstance(prior_scale, str) or not prior_scale > 0:
            raise ScenarioError(f"prior scale: {prior_scale!r}: a positive number or auto")
        choice, scales = {}, [float(prior_scale)] * len(plan)
    fits = map_in_processes(
        _fit_without, [(traces, out, sc) for (_, out), sc in zip(plan, scales)], workers, progress, FITTING
    )
    per_trace: list[dict[str, Any]] = [
        {"trace": td.name, "scenario": td.scenario, "configuration": td.configuration, "method": td.method}
        for td in traces
    ]
    jobs: list[tuple] = []
    where: list[tuple[int, str]] = []
    for i, td in enumerate(traces):
        jobs.append((td, rows[i].trace_path, rows[i].scenario_path, rows[i].method, None))
        where.append((i, "no_fit"))
    for (scheme, out), (values, machines) in zip(plan, fits):
        for i in out if out else range(len(traces)):
            at = machine_values(values, machines, traces[i])
            jobs.append((traces[i], rows[i].trace_path, rows[i].scenario_path, rows[i].method, at))
            where.append((i, scheme))
    for (i, scheme), sc in zip(where, map_in_processes(_score_job, jobs, workers, progress, SIMULATING)):
        per_trace[i][scheme] = sc
    host = _add_host_spreads(per_trace, rows, workers, noise, progress)
    for r in per_trace:
        for scheme in SCHEMES:
            r.setdefault(scheme, {})
    result: dict[str, Any] = {"traces": len(traces), "index": str(index_csv), "notes": []}
    for scheme in SCHEMES:
        if any(r[scheme] for r in per_trace):
            result[scheme] = summarise(per_trace, scheme)
    if "trace" not in by:
        result["notes"].append("held out (trace): not fitted (folds by configuration only)")
    elif "held_out" not in result:
        result["notes"].append("held out (trace): needs two runs or more (a fit without the only run has no data)")
    if "configuration" not in by:
        result["notes"].append("held out (configuration): not fitted (folds by trace only)")
    elif "held_out_configuration" not in result:
        result["notes"].append("held out (configuration): needs two configurations or more (runs of two scenarios)")
    result["prior_scale"] = {"value": scales[0], **({"chosen": choice["in_sample", ()]} if choice else {})}
    if choice and "held_out" in result:
        result["notes"].append(
            f"held out (trace): the prior scale chosen on every run ({scales[0]:g}), not nested (the configurations' "
            "folds are)"
        )
    result["configurations"] = by_configuration(per_trace, noise)
    result["host_speed"] = host
    for (scheme, out), (values, _), sc in zip(plan, fits, scales):
        if scheme == "held_out_configuration":
            row = next(c for c in result["configurations"] if c["configuration"] == traces[out[0]].configuration)
            row["moved_without_it"] = moved_without(fits[0][0], values, [traces[i] for i in out])
            row["outside_fit_runs"] = outside_runs(
                [td for i, td in enumerate(traces) if i not in out], [traces[i] for i in out]
            )
            if choice:  # nested: chosen without this configuration
                row["prior_scale"] = sc
                row["prior_scale_grid"] = choice[scheme, out].get("held_out_jct_mean_abs_error_pct")
    worse = [c["configuration"] for c in result["configurations"] if c.get("worse_than_no_fit")]
    result["worse_than_no_fit"] = worse
    result["per_trace"] = per_trace
    result["dequantize_share"] = dequantize_shares(traces, rows, per_trace)
    result["against_reference"] = against_reference(per_trace, traces, [r.machine for r in rows], SCHEMES, noise)
    result["in_sample_fit"] = {n: {"value": v} for n, v in fits[0][0].items()}
    if fits[0][1]:
        result["in_sample_machines"] = fits[0][1]
    if noise:
        result["noise"] = noise_summary(noise)
    return result


MACHINE_SCHEMES = ("no_fit", "base_gpu_link", "base", "machine_refit")
MACHINE_HEADS = {
    "no_fit": "no fit",
    "base_gpu_link": "base's gpu+link terms",  # calibration.engine_scopes [gpu, link]: the scenario's host terms
    "base": "base alone",
    "machine_refit": "base + machine factor",
}


def cross_validate_machine(
    index_csv: str | Path,
    base: dict[str, tuple[float, float | None]],
    base_name: str,
    workers: int = 1,
    noise: dict | None = None,
    base_domain: dict | None = None,
    progress: Progress | None = None,
) -> dict:
    """How a calibration moved to the runs' machine carries across their configurations (calibrate --base
    --refit machine): each configuration's runs on a machine predicted by the base calibration with the one host
    factor fitted to the other configurations recorded on that machine (the index's `machine` column; without it,
    all runs are one machine), beside the base alone and no fit. A configuration recorded on several machines is a
    row per machine, each run priced with its own machine's factor. A configuration with no other on its machine
    has no machine figure there, and the notes say so. Beside them the base's kernel and link terms alone on the
    scenarios' host terms (calibration.engine_scopes [gpu, link]). Per run the errors of each, their means, and per
    configuration and machine the factor; with the base's `base_domain` (its file's domain), where each configuration
    lies outside the runs the base was fitted on."""
    from .domain import outside_any
    from .engine import in_scopes
    from .measured import read_index

    rows = read_index(index_csv)
    traces = load_index(index_csv, workers, progress)
    machine = [r.machine or "" for r in rows]
    pairs = sorted({(td.configuration, machine[i]) for i, td in enumerate(traces)})
    base_values = {n: v for n, (v, _) in base.items()}
    # the base's kernel and link terms alone (calibration.engine_scopes [gpu, link]): what a machine with no runs of
    # its own can take from it while keeping the scenario's host terms
    gpu_link = in_scopes(base_values, ("gpu", "link"))
    folds: dict[tuple[str, str], dict] = {}
    notes: list[str] = []
    for c, m in pairs:
        others = [td for i, td in enumerate(traces) if td.configuration != c and machine[i] == m]
        if not others:
            on = f" on {m}" if m else ""
            notes.append(f"{c}{on}: no other configuration recorded on its machine: no machine factor to carry")
            continue
        fit = fit_engine(others, "machine", base, base_name)
        assert fit.factor is not None
        folds[c, m] = {
            "values": dict(fit.fitted),
            "factor": fit.factor["value"],
            "stderr": fit.factor["stderr"],
            "between_sd": fit.factor.get("between_configurations_sd"),  # the others' own factors' spread on ln
        }
        try:  # what its own runs give: a diagnostic (none where no item of its runs moves with the host terms)
            own = fit_engine(
                [td for i, td in enumerate(traces) if td.configuration == c and machine[i] == m],
                "machine",
                base,
                base_name,
            ).factor
        except ScenarioError:
            own = None
        if own is not None:
            folds[c, m].update(own=own["value"], own_stderr=own["stderr"])
    per_trace: list[dict[str, Any]] = [
        {
            "trace": td.name,
            "scenario": td.scenario,
            "configuration": td.configuration,
            "machine": machine[i] or None,
            "method": td.method,
        }
        for i, td in enumerate(traces)
    ]
    jobs: list[tuple] = []
    where: list[tuple[int, str]] = []
    for i, td in enumerate(traces):
        for scheme, values in (
            ("no_fit", None),
            ("base_gpu_link", gpu_link),
            ("base", base_values),
            ("machine_refit", folds.get((td.configuration, machine[i]), {}).get("values")),
        ):
            if scheme == "machine_refit" and values is None:
                continue
            jobs.append((td, rows[i].trace_path, rows[i].scenario_path, rows[i].method, values))
            where.append((i, scheme))
    for (i, scheme), sc in zip(where, map_in_processes(_score_job, jobs, workers, progress, SIMULATING)):
        per_trace[i][scheme] = sc
    host = _add_host_spreads(per_trace, rows, workers, noise, progress)
    for r in per_trace:
        for scheme in MACHINE_SCHEMES:
            r.setdefault(scheme, {})
    result: dict[str, Any] = {"traces": len(traces), "index": str(index_csv), "base_calibration": base_name}
    result["notes"] = notes
    for scheme in MACHINE_SCHEMES:
        if any(r[scheme] for r in per_trace):
            result[scheme] = summarise(per_trace, scheme)
    configurations = []
    for c, m in pairs:
        row = _configuration_row([r for r in per_trace if (r["machine"] or "") == m], c, MACHINE_SCHEMES, noise)
        row["machine"] = m or None
        row["machine_factor"] = folds[c, m]["factor"] if (c, m) in folds else None
        row["machine_factor_stderr"] = folds[c, m]["stderr"] if (c, m) in folds else None
        # what the configuration's own runs give (a diagnostic: the prediction does not use it), and whether its
        # session-mates' factor is more than twice their joint standard error from it on ln
        f = folds.get((c, m), {})
        row["machine_factor_own"] = f.get("own")
        row["machine_factor_own_stderr"] = f.get("own_stderr")
        row["machine_factor_between_sd"] = f.get("between_sd")  # None where one other configuration gave it
        row["factor_disagrees"] = "own" in f and abs(math.log(f["own"] / f["factor"])) > 2 * math.hypot(
            f["stderr"] / f["factor"], f["own_stderr"] / f["own"]
        )
        if base_domain:  # simulator/domain.py: where the base's fit is extrapolated
            runs = [td for i, td in enumerate(traces) if td.configuration == c and machine[i] == m and td.setting]
            row["outside_base_runs"] = outside_any(base_domain, [td.setting for td in runs])
        configurations.append(_against_no_fit(row))
    result["configurations"] = configurations
    result["host_speed"] = host
    result["worse_than_no_fit"] = [[c["configuration"], c["machine"]] for c in configurations if c["worse_than_no_fit"]]
    result["per_trace"] = per_trace
    result["against_reference"] = against_reference(per_trace, traces, machine, MACHINE_SCHEMES, noise)
    if noise:
        result["noise"] = noise_summary(noise)
    return result


def _against_no_fit(row: dict) -> dict:
    """A (configuration, machine) row of cross_validate_machine with what predicts it (`predicted_by`: the base with
    its machine's factor where the machine has one, else the base alone) and whether that is worse than no fit."""
    final = row["machine_refit_jct_mean_abs_error_pct"]
    row["predicted_by"] = "machine_refit" if final is not None else "base"
    final = final if final is not None else row["base_jct_mean_abs_error_pct"]
    none = row["no_fit_jct_mean_abs_error_pct"]
    row["worse_than_no_fit"] = final is not None and none is not None and final > none
    return row


def host_speed_lines(host: dict | None) -> list[str]:
    """What a result's `host speed alone` column is (none without one)."""
    return [host_speed_line(host, "each configuration's")] if host else []


def _worse_by(c: dict, name: str, scheme: str, how: str = "") -> str:
    """A configuration row predicted worse than with no fit, for the flag: by how many points `scheme` misses more,
    and its recordings' run-to-run spread where known."""
    d = c[f"{scheme}_jct_mean_abs_error_pct"] - c["no_fit_jct_mean_abs_error_pct"]
    spread = c.get("run_to_run_jct_mean_pct")
    noise = "" if spread is None else f"; its recordings' mean JCT spreads ±{spread:.1f} % run to run"
    host = c.get("host_spread_jct_mean_pct")
    noise += "" if host is None else f"; the host's speed alone moves it ±{host:.1f} %"
    beyond = c.get("outside_fit_runs") or c.get("outside_base_runs")
    where = "; it lies outside the runs its fit saw, listed below" if beyond else ""
    return f"{name} (by {d:.1f} points{how}{noise}{where})"


def format_cv_machine(result: dict) -> str:
    """Per configuration: its machine, the factor fitted on the machine's other configurations, and its mean |JCT
    error| with no fit, the base alone and the base with the factor; then the means over the runs."""
    from reports.terminal import render, table

    def mag(x):
        return "n/a" if x is None else f"{x:.1f}%"

    noise = result.get("noise")
    heads = ["configuration", "machine", "traces", "factor (from the others)"]
    host = result.get("host_speed")
    heads += [f"mean |JCT err| {MACHINE_HEADS[s]}" for s in MACHINE_SCHEMES]
    heads += ["host speed alone"] if host else []
    heads += ["run-to-run (mean JCT)"] if noise else []
    heads += [""]
    body = []
    for c in result["configurations"]:
        f = c["machine_factor"]
        factor = "n/a" if f is None else f"{f:.3f} ± {c['machine_factor_stderr']:.2g}"
        row = [c["configuration"], c["machine"] or "(one)", str(c["traces"]), factor]
        row += [mag(c[f"{s}_jct_mean_abs_error_pct"]) for s in MACHINE_SCHEMES]
        if host:
            x = c.get("host_spread_jct_mean_pct")
            row.append("n/a" if x is None else f"±{x:.1f}%")
        if noise:
            x = c.get("run_to_run_jct_mean_pct")
            row.append("not recorded" if x is None else f"±{x:.1f}%")
        row.append("WORSE than no fit" if c.get("worse_than_no_fit") else "")
        body.append(row)
    foot = []
    for key, label in (("jct_mean_abs_error_pct", "mean |JCT error|"), ("jct_max_abs_error_pct", "max |JCT error|")):
        line = [label, "", str(result["traces"]), ""]
        line += [mag(result.get(s, {}).get(key)) for s in MACHINE_SCHEMES]
        foot.append(line + ([""] if host else []) + ([""] if noise else []) + [""])
    title = (
        f"each configuration predicted by {result['base_calibration']} with a machine factor fitted on the other "
        "configurations of its machine"
    )
    lines = [render(table(heads, body, title=title, footer_rows=foot)), *_machine_flags(result)]
    lines += format_against_reference(result, MACHINE_SCHEMES, MACHINE_HEADS)
    lines += host_gauge_lines(noise)
    lines += [f"note: {n}" for n in result["notes"]]
    return "\n".join(lines)


def cv_machine_notes(result: dict) -> list[str]:
    """validate --cv --base's lines beside its tables (the flags, the host speed, the notes): the terminal's and the
    page's."""
    return [*_machine_flags(result), *host_gauge_lines(result.get("noise")), *(f"note: {n}" for n in result["notes"])]


def _machine_flags(result: dict) -> list[str]:
    lines = host_speed_lines(result.get("host_speed"))
    worse = [c for c in result["configurations"] if c.get("worse_than_no_fit")]
    if worse:

        def how_much(c: dict) -> str:
            on = f" on {c['machine']}" if c["machine"] else ""
            how = "" if c["predicted_by"] == "machine_refit" else ", the base alone"
            return _worse_by(c, f"{c['configuration']}{on}", c["predicted_by"], how)

        lines.append(
            f"flag: {len(worse)} of {len(result['configurations'])} configurations (a row per machine) are predicted "
            "worse than with no fit: " + ", ".join(how_much(c) for c in worse)
        )
    split = [c for c in result["configurations"] if c.get("factor_disagrees")]
    if split:
        lines.append(
            f"flag: {len(split)} configuration(s) whose own runs put the host factor elsewhere than their machine's "
            "other configurations do (beyond twice their joint standard error): "
            + ", ".join(
                f"{c['configuration']}{' on ' + c['machine'] if c['machine'] else ''} ({c['machine_factor_own']:.3f} "
                f"against {c['machine_factor']:.3f})"
                for c in split
            )
            + ": the machine's configurations load its host differently, and one factor carries the others' to it"
        )
    beyond = [c for c in result["configurations"] if c.get("outside_base_runs")]
    if beyond:
        lines.append(
            f"where each configuration lies outside the runs {result['base_calibration']} was fitted on "
            "(simulator/domain.py: it extrapolates the base there):"
        )
        lines += [
            f"  {c['configuration']}{' on ' + c['machine'] if c['machine'] else ''}: "
            + "; ".join(c["outside_base_runs"])
            for c in beyond
        ]
    return lines


def by_configuration(per_trace: list[dict], noise: dict | None = None) -> list[dict]:
    """Per configuration: its runs' mean |JCT error| with no fit and held out by configuration, and whether the
    held-out fit is worse than none (the flag `validate --cv` raises); with `noise` (simulator/noise.py), the
    run-to-run spread of mean JCT over that scenario's repeated recordings where it has some
    (`run_to_run_jct_mean_pct`, None where not)."""
    out = []
    for c in sorted({r["configuration"] for r in per_trace}):
        row = _configuration_row(per_trace, c, SCHEMES, noise)
        nf, ho = row["no_fit_jct_mean_abs_error_pct"], row["held_out_configuration_jct_mean_abs_error_pct"]
        row["worse_than_no_fit"] = bool(nf is not None and ho is not None and ho > nf)
        out.append(row)
    return out


MOVED_LEAST_SD = 0.5  # a parameter that moves less than this share of its prior's width is not listed
MOVED_MOST = 3  # at most this many per configuration, the largest moves first


def outside_runs(fitted_on: list[TraceData], runs: list[TraceData]) -> list[str]:
    """Each way `runs` (a held-out configuration's) lie outside the settings of the runs a fit saw (domain.outside),
    each said once."""
    from .domain import domain_of, outside_any

    return outside_any(
        domain_of([td.setting for td in fitted_on if td.setting]), [td.setting for td in runs if td.setting]
    )


def moved_without(in_sample: dict[str, float], held_out: dict[str, float], runs: list[TraceData]) -> list[dict]:
    """What a configuration alone tells the fit: the parameters its runs are priced with (every engine-wide one and
    their methods' own) whose value in the fit without it differs from the in-sample fit's by at least
    MOVED_LEAST_SD of the prior's width, the largest first (at most MOVED_MOST). A parameter a fit holds is priced
    at the runs' scenario's own value, so one fitted in-sample and held without the configuration shows as a move
    back to the scenario's value. Values are the shared ones (runs of several machines: before a machine's
    factor). Where a held-out configuration is predicted worse than no fit, these are what to record more of."""
    own = runs[0].values0
    families = {td.family for td in runs}
    widths = prior_widths(own, runs)
    out = []
    for name in sorted(set(in_sample) | set(held_out)):
        head, *rest = name.split(".")
        if name not in own or (head == "methods" and rest[0] not in families):
            continue
        a, b = in_sample.get(name, own[name]), held_out.get(name, own[name])
        sd = prior_sd(name, a if a else b, widths=widths)
        if sd > 0 and abs(b - a) >= MOVED_LEAST_SD * sd:
            out.append({"name": name, "in_sample": a, "held_out": b, "shift_prior_sd": round((b - a) / sd, 2)})
    out.sort(key=lambda m: -abs(m["shift_prior_sd"]))
    return out[:MOVED_MOST]


def _configuration_row(per_trace: list[dict], c: str, schemes, noise: dict | None) -> dict[str, Any]:
    """One configuration's runs: their count, each scheme's mean |JCT error| (None unless every run has one) and,
    with `noise`, the run-to-run spread of mean JCT over that scenario's repeats (None where it has none)."""
    rs = [r for r in per_trace if r["configuration"] == c]
    row: dict[str, Any] = {"configuration": c, "traces": len(rs)}
    for scheme in schemes:
        vals = [abs(r[scheme]["jct_mean_error_pct"]) for r in rs if r[scheme].get("jct_mean_error_pct") is not None]
        row[f"{scheme}_jct_mean_abs_error_pct"] = round(float(np.mean(vals)), 3) if len(vals) == len(rs) else None
    host = [r["host_spread_jct_mean_pct"] for r in rs if r.get("host_spread_jct_mean_pct") is not None]
    if host:  # the host's speed alone, over its runs (their RMS)
        row["host_spread_jct_mean_pct"] = round(math.sqrt(float(np.mean(np.square(host)))), 3)
    if noise is not None:
        row["run_to_run_jct_mean_pct"] = noise.get("by_scenario", {}).get(c, {}).get("jct_mean")
    return row


def measured_dequantize_share_pct(trace: Path, reference: Path) -> float:
    """Dequantization's share of the mean JCT in a measured trace of a method that dequantizes every
    iteration (KVQuant), from the trace and a reference trace of the FP16 baseline over the same requests
    (same configuration, rate and seed): a least-squares line of each trace's iteration durations
    (end - start) in batch size and total context, the method's minus the baseline's at each of the
    method's iterations is its dequantization (its attention runs the same FP16 kernel on the dequantized
    cache; the line difference also holds its 2-bit append against the FP16 one); each request in the
    batch waits for it, as the simulator counts it."""
    from .measured import load_trace

    def line(it: pd.DataFrame) -> np.ndarray:
        x = np.column_stack([np.ones(len(it)), it["batch_size"], it["context_tokens"]])
        return np.linalg.lstsq(x, (it["end_s"] - it["start_s"]).to_numpy(), rcond=None)[0]

    df, it, _, _ = load_trace(trace)
    _, it_ref, _, _ = load_trace(reference)
    if it is None or it_ref is None:
        raise ScenarioError(
            f"{trace if it is None else reference}: no iterations.csv (the dequantization share needs its iterations)"
        )
    x = np.column_stack([np.ones(len(it)), it["batch_size"], it["context_tokens"]])
    extra_s = x @ (line(it) - line(it_ref))
    waited_s = float(np.sum(it["batch_size"].to_numpy() * extra_s))
    return 100.0 * waited_s / float((df["finish_s"] - df["arrival_s"]).sum())


def dequantize_shares(traces: list[TraceData], rows: list, per_trace: list[dict]) -> list[dict]:
    """For each trace of a method that dequantizes every iteration, recorded with GPU-bound iterations (decode
    as CUDA graphs, meta.json decode_mode) and with a baseline twin (same scenario, rate and seed) in the
    index: the measured share of JCT in dequantization and the predicted ones."""
    out = []
    for i, td in enumerate(traces):
        if (
            td.source != "realrun"
            or "iteration" not in td.blocks
            or not td.blocks["iteration"]["dequant_per_ctx"] > 0
            or td.meta.get("decode_mode") != "graphs"
        ):
            continue  # no per-iteration dequantization; or host-bound iterations (eager) hide its GPU time
        twin = next(
            (
                j
                for j, o in enumerate(traces)
                if o.family == REFERENCE
                and o.source == "realrun"
                and "iteration" in o.blocks  # a twin without iterations has no line to subtract
                and o.scenario == td.scenario
                and o.meta.get("rate_rps") == td.meta.get("rate_rps")
                and o.meta.get("seed") == td.meta.get("seed")
            ),
            None,
        )
        if twin is None:
            continue
        measured = measured_dequantize_share_pct(rows[i].trace_path, rows[twin].trace_path)
        entry = {"trace": td.name, "reference": traces[twin].name, "measured_pct": round(measured, 3)}
        for scheme in SCHEMES:
            pred = per_trace[i].get(scheme, {}).get("dequantize_share_pct")
            if pred is not None:
                entry[f"{scheme}_pct"] = round(pred, 3)
                entry[f"{scheme}_error_pp"] = round(pred - measured, 3)
        out.append(entry)
    return out


def _fit_without(args) -> tuple[dict[str, float], dict[str, float]]:
    """The fit without the runs `out` (with every prior width times `scale`): its values, and each machine's host
    factor where the runs name machines."""
    traces, out, scale = args
    fit = fit_engine([td for i, td in enumerate(traces) if i not in out], prior_scale=scale)
    return fit_values(fit), {m: r["factor"] for m, r in fit.machines.items()}


def _kept(traces: list[TraceData], out: tuple[int, ...]) -> tuple[int, ...]:
    return tuple(i for i in range(len(traces)) if i not in out)


def choose_prior_scale(
    index_csv: str | Path,
    traces: list[TraceData],
    workers: int = 1,
    grid: tuple[float, ...] = PRIOR_SCALES,
    progress: Progress | None = None,
) -> dict:
    """The prior scale (calibrate.PRIOR_SCALES) a calibration on every run of an index should use: the one whose
    fits without each configuration predict that configuration's runs best (_choose_scales). `traces`: the index's
    runs as calibrate.load_index priced them (the caller's, not priced again)."""
    from .measured import read_index

    return _choose_scales(traces, read_index(index_csv), [tuple(range(len(traces)))], workers, grid, progress)[0]


def _choose_scales(
    traces: list[TraceData],
    rows: list,
    subsets: list[tuple[int, ...]],
    workers: int,
    grid=PRIOR_SCALES,
    progress: Progress | None = None,
) -> list[dict]:
    """For each subset of the runs (indices), the scale of `grid` whose leave-one-configuration-out fits within the
    subset give its runs the least mean |JCT error| (each run predicted by the fit without its configuration, as
    held out by configuration scores them; ties to the wider priors): how far the fit should trust these runs over
    the kernels' prices, measured on configurations it did not see. A subset of one configuration has nothing to
    hold out and keeps the stated widths (1). Every fit and simulation of every subset runs in one pool."""
    plan: list[tuple[int, float, tuple[int, ...]]] = []  # (subset, scale, the runs held out)
    for k, sub in enumerate(subsets):
        configs = sorted({traces[i].configuration for i in sub})
        if len(configs) < 2:
            continue
        for s in grid:
            plan += [(k, s, tuple(i for i in sub if traces[i].configuration == c)) for c in configs]
    jobs_fit = [(traces, _out_of(subsets[k], out, len(traces)), s) for k, s, out in plan]
    fits = map_in_processes(_fit_without, jobs_fit, workers, progress, ("prior scale: fitting", "fits"))
    jobs, where = [], []
    for (k, s, out), (values, machines) in zip(plan, fits):
        for i in out:
            at = machine_values(values, machines, traces[i])
            jobs.append((traces[i], rows[i].trace_path, rows[i].scenario_path, rows[i].method, at))
            where.append((k, s))
    errors: dict[tuple[int, float], list[float]] = {}
    for key, sc in zip(
        where, map_in_processes(_score_job, jobs, workers, progress, ("prior scale: simulating", "runs"))
    ):
        e = sc.get("jct_mean_error_pct")
        errors.setdefault(key, []).append(math.inf if e is None else abs(e))
    chosen: list[dict] = []
    for k, sub in enumerate(subsets):
        configs = sorted({traces[i].configuration for i in sub})
        if len(configs) < 2:
            chosen.append({"value": 1.0, "chosen_by": "one configuration: none to hold out, the stated prior widths"})
            continue
        mean = {s: float(np.mean(errors[k, s])) for s in grid}
        best = min(sorted(grid, reverse=True), key=lambda s: round(mean[s], 3))
        chosen.append(
            {
                "value": best,
                "chosen_by": f"leave-one-configuration-out over {len(configs)} configurations ({len(sub)} runs): the "
                "scale whose fits without each configuration predict its runs' mean JCT best",
                "held_out_jct_mean_abs_error_pct": {f"{s:g}": round(mean[s], 3) for s in grid},
            }
        )
    return chosen


def _out_of(sub: tuple[int, ...], held: tuple[int, ...], n: int) -> tuple[int, ...]:
    """The runs a fit within `sub` without `held` leaves out of all n: everything outside sub, and held."""
    keep = set(sub) - set(held)
    return tuple(i for i in range(n) if i not in keep)


def machine_values(values: dict[str, float], machines: dict[str, float], td: TraceData) -> dict[str, float]:
    """A fit's values for a run: on a machine the fit has a factor for, every host time term times it (the fitted
    ones and the run's scenario's own); else the fit's values as they are (a machine it has not seen: its typical
    CPU)."""
    f = machines.get(td.machine or "")
    if f is None:
        return values
    own = {n: td.values0[n] for n in HOST_TIMES if td.values0.get(n)}  # the nonzero ones the fit did not write
    return on_machine({**own, **values}, f)


def _score_job(args) -> dict:
    return _score(*args)


# ---- for people ------------------------------------------------------------------------------------
def format_cv(result: dict) -> str:
    """Per trace: JCT mean error with no fit, in-sample, held out by trace and by configuration; the means the
    goals are stated in; then per configuration no fit against held out, flagging a fit worse than none."""
    from reports.terminal import render, table

    def pct(x):
        return "n/a" if x is None else f"{x:+.1f}%"

    def mag(x):
        return "n/a" if x is None else f"{x:.1f}%"

    def spread_text(x):
        return "not recorded" if x is None else f"±{x:.1f}%"

    schemes = [s for s in SCHEMES if s in result]
    noise = result.get("noise")
    host = result.get("host_speed")
    # TPOT and TTFT beside JCT: held out by trace where that exists, else in-sample
    other = "held_out" if "held_out" in result else "in_sample"
    body = []
    for r in result["per_trace"]:
        body.append(
            [
                r["trace"],
                *(pct(r[s].get("jct_mean_error_pct")) for s in schemes),
                pct(r[other].get("tpot_p50_error_pct")),
                pct(r[other].get("ttft_p50_error_pct")),
            ]
        )
    foot = []
    for key, label, spread_key in (
        ("jct_mean_abs_error_pct", "mean |JCT error|", "jct_mean"),
        ("jct_max_abs_error_pct", "max |JCT error|", "jct_mean"),
        ("tpot_p50_mean_abs_error_pct", "mean |TPOT p50 error|", "tpot_p50"),
        ("ttft_p50_mean_abs_error_pct", "mean |TTFT p50 error|", "ttft_p50"),
    ):
        spread = noise["spread_pct"].get(spread_key) if noise else None
        foot.append(
            [
                label + ("" if spread is None else f" (run-to-run ±{spread:.1f}%)"),
                *(pct(result[s].get(key)) for s in schemes),
                "",
                "",
            ]
        )
    foot.append(
        ["traces within 10 %", *(f"{result[s]['traces_jct_within_10pct']}/{result['traces']}" for s in schemes), "", ""]
    )
    parts = [
        render(
            table(
                [
                    "trace",
                    *(f"JCT {HEADS[s]}" for s in schemes),
                    f"TPOT p50 {HEADS[other]}",
                    f"TTFT p50 {HEADS[other]}",
                ],
                body,
                footer_rows=foot,
                title=f"cross-validated engine calibration, {result['traces']} traces",
            )
        )
    ]
    configs = [
        [
            c["configuration"],
            str(c["traces"]),
            mag(c["no_fit_jct_mean_abs_error_pct"]),
            mag(c["held_out_configuration_jct_mean_abs_error_pct"]),
            *([] if host is None else [spread_text(c.get("host_spread_jct_mean_pct"))]),
            *([] if "noise" not in result else [spread_text(c.get("run_to_run_jct_mean_pct"))]),
            "WORSE than no fit" if c["worse_than_no_fit"] else "",
        ]
        for c in result["configurations"]
    ]
    spread_head = [] if "noise" not in result else ["run-to-run (mean JCT)"]
    host_head = [] if host is None else ["host speed alone"]
    parts.append(
        render(
            table(
                ["configuration", "traces", "mean |JCT err| no fit", "held out (config)", *host_head, *spread_head, ""],
                configs,
                title="each configuration predicted by a fit on the others, against no fit",
            )
        )
    )
    parts += _cv_flags(result)
    parts += format_against_reference(result, SCHEMES, HEADS)
    parts += _cv_tail(result)
    return "\n".join(parts)


def cv_notes(result: dict) -> list[str]:
    """validate --cv's lines beside its tables (the flags, where each configuration lies, what moves without it, the
    prior scale, the machines, the host speed, the notes): the terminal's and the page's."""
    return [*_cv_flags(result), *_cv_tail(result)]


def _cv_flags(result: dict) -> list[str]:
    parts = host_speed_lines(result.get("host_speed"))
    if result["worse_than_no_fit"]:
        by_name = {c["configuration"]: c for c in result["configurations"]}

        parts.append(
            f"flag: the fit predicts {len(result['worse_than_no_fit'])} held-out configuration(s) worse than no fit: "
            + ", ".join(_worse_by(by_name[n], n, "held_out_configuration") for n in result["worse_than_no_fit"])
        )
    beyond = [c for c in result["configurations"] if c.get("outside_fit_runs")]
    if beyond:
        parts.append(
            "where each held-out configuration lies outside the runs its fit saw (simulator/domain.py: it extrapolates "
            "the fit there; inside every range: "
            + (", ".join(c["configuration"] for c in result["configurations"] if c not in beyond) or "none")
            + "):"
        )
        parts += [f"  {c['configuration']}: " + "; ".join(c["outside_fit_runs"]) for c in beyond]
    moved = [c for c in result["configurations"] if c.get("moved_without_it")]
    if moved:
        parts.append(
            f"what only each configuration shows the fit (parameters that move by {MOVED_LEAST_SD} of their prior's "
            "width or more when its runs leave it, in-sample -> held out):"
        )
        for c in moved:
            parts.append(
                f"  {c['configuration']}: "
                + ", ".join(
                    f"{m['name']} {m['in_sample']:.4g} -> {m['held_out']:.4g} ({m['shift_prior_sd']:+.1f} sd)"
                    for m in c["moved_without_it"]
                )
            )
    return parts


def _cv_tail(result: dict) -> list[str]:
    parts = _prior_scale_lines(result)
    machines = result.get("in_sample_machines")
    if machines:
        parts.append(
            "runs of several machines (the index's column machine): each fit gives every machine it has runs of a "
            "factor on the host time terms, and a held-out run on such a machine is priced with it (in-sample: "
            + ", ".join(f"{m} {f:.3f}" for m, f in machines.items())
            + "); a machine the fit has none of gets its typical CPU (factor 1)"
        )
    parts += host_gauge_lines(result.get("noise"))
    parts += [f"note: {n}" for n in result.get("notes", [])]
    return parts


def _prior_scale_lines(result: dict) -> list[str]:
    """validate --cv's prior scale: what the in-sample fit used and, chosen (auto), the grid's held-out errors and
    each held-out configuration's own choice (nested: made without it)."""
    ps = result.get("prior_scale", {"value": 1.0})
    chosen = ps.get("chosen")
    if chosen is None:
        return [] if ps["value"] == 1.0 else [f"prior scale: every prior width times {ps['value']:g}"]
    grid = chosen.get("held_out_jct_mean_abs_error_pct")
    how = "" if grid is None else " (" + ", ".join(f"x{s}: {e:.2f} %" for s, e in grid.items()) + ")"
    lines = [f"prior scale (auto): {ps['value']:g} in-sample, {chosen['chosen_by']}{how}"]
    nested = [c for c in result["configurations"] if "prior_scale" in c]
    if nested:
        lines.append(
            "  held out by configuration, each chosen without it (nested): "
            + ", ".join(f"{c['configuration']} {c['prior_scale']:g}" for c in nested)
        )
    return lines
