"""The noise floor: how much a metric moves between recordings of the same configuration, method and seed.

A repeats index is a CSV with columns `trace`, `scenario` and `config`; rows sharing `config` are recordings of
one configuration (same system, method, requests and seed), such as `realrun/traces/h200_repeats/index.csv`;
a config recorded once gives no spread and is listed apart (`single_recordings`).
For every metric `validate` reports an error on (the mean and p50/p90/p99 of JCT, TTFT and TPOT, each breakdown
part's mean, the decode iteration's mean), `run_to_run_spread` computes from the recordings alone, no simulation:

* per configuration c with k_c recordings of values v_c1 .. v_ck and mean m_c: the spread, the sample standard
  deviation of the v_cr over m_c (in %), and the range, (max − min) / m_c (in %);
* pooled over configurations, the run-to-run spread of the metric:
  100 · sqrt( Σ_c Σ_r (v_cr / m_c − 1)² / Σ_c (k_c − 1) ), the pooled standard deviation of the recordings'
  values relative to their configuration's mean; and the largest range;
* the same pooled spread per scenario (`by_scenario`, keyed by the scenario file's stem, as `validate --cv` names a
  configuration: its methods and rates together), which `validate --cv --noise` prints beside each held-out
  configuration's error.

An error smaller than about twice the spread is inside the noise: a simulator cannot be shown to do better than
the measurement repeats. `validate --noise INDEX` prints the spread beside each error figure.

Where the recordings time a host-bound step (realrun's quantize step: kernel launches, at a floor of host time per
layer), `host_gauge` says how much of mean JCT's run-to-run spread is the host's speed during each recording: the
pooled correlation of each recording's relative deviation in mean JCT with its deviation in the step's mean (both
from its configuration's mean), the least-squares slope through the origin, and the spread of mean JCT left once the
gauge is known (100 · sqrt(Σ (y − b x)² / (dof − 1))): the floor a prediction could reach with the run's own host
speed, against the floor without it. None where no recording has the step.

What the host's speed alone moves a run's mean JCT by, before any recording of it, is simulator/host_speed.py's: the
quantize step's run-to-run spread here (HOST_GAUGE) is the host's speed spread it takes from a repeats index.

A method's mean JCT against the FP16 reference's (`validate`'s comparison, simulator/comparison.py) has its own
spread, `against_reference`: a realrun process records every method of one workload back to back on one host
(meta.json's `date`, its start, is the same for them), so each process that recorded a method and the reference over
the same requests (scenario, rate, seed, request count) gives one value, 100 · (JCT_method / JCT_reference − 1)
over their recordings' means; where one workload and method were recorded by two processes or more, their values'
pooled standard deviation in points, 100 · sqrt(Σ (g − ḡ)² / Σ (n − 1)), overall and per scenario. Benchmark files
say nothing of the process that ran them and add none.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from .comparison import PROCESS_META, WORKLOAD_META, against_pct
from .config import ScenarioError
from .host_speed import HOST_GAUGE

QUANTILES = ("mean", "p50", "p90", "p99")


def measured_run(trace: str | Path) -> tuple[dict[str, float], dict]:
    """The measured value of every metric validate scores (simulator/validate.py), from the trace alone (a realrun
    trace or a benchmark file: per-request metrics only), and the run's meta.json ({} for a benchmark file)."""
    from .engine_logs import is_engine_log, read_engine_log
    from .measured import load_trace
    from .validate import MEASURABLE_PARTS, _stats, measured_parts

    iterations = None
    meta: dict = {}
    if is_engine_log(trace):
        df = read_engine_log(trace).frame()
    else:
        df, iterations, meta, _ = load_trace(trace)
    parts = measured_parts(df)
    out: dict[str, float] = {}
    for metric in ("jct", "ttft", "tpot"):
        st = _stats(parts[metric])
        for q in QUANTILES:
            out[f"{metric}_{q}"] = st[q]
    for part in MEASURABLE_PARTS:
        if part in parts.columns:
            out[f"{part}_mean"] = float(parts[part].mean())
    if iterations is not None and len(iterations):
        out["iteration_mean"] = float((iterations["end_s"] - iterations["start_s"]).mean())
    return out, meta


def _pooled(deviations: dict[str, list[float]], dof: dict[str, int]) -> dict[str, float]:
    """Per metric, 100 x the pooled standard deviation of the relative deviations."""
    return {k: round(100.0 * math.sqrt(float(np.sum(np.square(d))) / dof[k]), 4) for k, d in sorted(deviations.items())}


def run_to_run_spread(index_csv: str | Path) -> dict:
    """Each metric's run-to-run spread over the repeated recordings an index lists (module doc)."""
    from .measured import read_index

    rows = read_index(index_csv, require=("config",))
    groups: dict[str, list] = {}
    for r in rows:
        groups.setdefault(str(r.config), []).append(r)
    single = sorted(c for c, g in groups.items() if len(g) < 2)  # no degree of freedom: said, left out
    if len(single) == len(groups):
        raise ScenarioError(f"{index_csv}: every config has one recording: a run-to-run spread needs repeats")
    runs = {r.trace: measured_run(r.trace_path) for r in rows}
    against = against_reference_spread([(Path(str(r.scenario)).stem, *runs[r.trace]) for r in rows])
    groups = {c: g for c, g in groups.items() if c not in single}
    configurations = {}
    deviations: dict[str, list[float]] = {}
    dof: dict[str, int] = {}
    by_scenario: dict[str, tuple[dict[str, list[float]], dict[str, int]]] = {}
    ranges: dict[str, float] = {}
    for c, group in sorted(groups.items()):
        values = [runs[r.trace][0] for r in group]
        metrics = {}
        for key in sorted(set.intersection(*(set(v) for v in values))):
            x = np.array([v[key] for v in values], dtype=np.float64)
            mean = float(x.mean())
            if not np.isfinite(x).all() or abs(mean) < 1e-12:
                continue
            rel = x / mean - 1.0
            metrics[key] = {
                "values": [float(v) for v in x],
                "spread_pct": round(100.0 * float(np.std(x, ddof=1)) / mean, 4),
                "range_pct": round(100.0 * float(x.max() - x.min()) / mean, 4),
            }
            deviations.setdefault(key, []).extend(rel.tolist())
            dof[key] = dof.get(key, 0) + len(x) - 1
            devs, dofs = by_scenario.setdefault(Path(str(group[0].scenario)).stem, ({}, {}))
            devs.setdefault(key, []).extend(rel.tolist())
            dofs[key] = dofs.get(key, 0) + len(x) - 1
            ranges[key] = max(ranges.get(key, 0.0), metrics[key]["range_pct"])
        configurations[c] = {"traces": [r.trace for r in group], "metrics": metrics}
    spread = _pooled(deviations, dof)
    return {
        "host_gauge": host_gauge(configurations),
        "index": str(index_csv),
        "configurations": configurations,
        "spread_pct": spread,
        "range_pct": ranges,
        "single_recordings": single,
        "by_scenario": {sc: _pooled(devs, dofs) for sc, (devs, dofs) in sorted(by_scenario.items())},
        "against_reference": against,
    }


def against_reference_spread(recordings: list[tuple[str, dict[str, float], dict]]) -> dict | None:
    """The run-to-run spread, in points, of each method's mean JCT against the reference's (module doc), from
    (scenario stem, measured values, meta.json) per recording; None where no workload and method were recorded
    with the reference by two processes."""
    from costmodel.methods import REFERENCE

    cells: dict[tuple, dict[object, dict[str, list[float]]]] = {}
    for stem, values, meta in recordings:
        if "method" not in meta or PROCESS_META not in meta or "jct_mean" not in values:
            continue
        key = (stem, *(meta.get(k) for k in WORKLOAD_META))
        cell = cells.setdefault(key, {}).setdefault(meta[PROCESS_META], {})
        cell.setdefault(meta["method"], []).append(values["jct_mean"])
    devs: dict[str, list[float]] = {}
    dofs: dict[str, int] = {}
    for key, by_process in sorted(cells.items(), key=repr):
        methods = sorted({m for c in by_process.values() for m in c if m != REFERENCE})
        for m in methods:
            g = np.array([against_pct(c[m], c[REFERENCE]) for c in by_process.values() if m in c and REFERENCE in c])
            if len(g) < 2:
                continue
            devs.setdefault(key[0], []).extend((g - g.mean()).tolist())
            dofs[key[0]] = dofs.get(key[0], 0) + len(g) - 1
    if not dofs:
        return None
    every = [d for v in devs.values() for d in v]
    return {
        "reference": REFERENCE,
        "spread_pts": round(math.sqrt(float(np.sum(np.square(every))) / sum(dofs.values())), 4),
        "degrees_of_freedom": sum(dofs.values()),
        "by_scenario": {sc: round(math.sqrt(float(np.sum(np.square(devs[sc]))) / dofs[sc]), 4) for sc in sorted(dofs)},
    }


def host_gauge(configurations: dict, gauge: str = HOST_GAUGE, metric: str = "jct_mean") -> dict | None:
    """How much of `metric`'s run-to-run spread the recordings' own host-bound step explains (module doc), over the
    configurations whose recordings all have both (run_to_run_spread's `configurations`)."""
    x: list[float] = []
    y: list[float] = []
    dof = 0
    for c in configurations.values():
        m = c["metrics"]
        if gauge not in m or metric not in m:
            continue
        g, v = np.array(m[gauge]["values"]), np.array(m[metric]["values"])
        x += (g / g.mean() - 1.0).tolist()
        y += (v / v.mean() - 1.0).tolist()
        dof += len(v) - 1
    xs, ys = np.array(x), np.array(y)
    if dof < 2 or not float(xs @ xs) > 0 or not float(ys @ ys) > 0:
        return None
    slope = float(xs @ ys / (xs @ xs))
    left = ys - slope * xs
    return {
        "gauge": gauge,
        "metric": metric,
        "recordings": len(ys),
        "degrees_of_freedom": dof,
        "correlation": round(float(xs @ ys / math.sqrt(float(xs @ xs) * float(ys @ ys))), 4),
        "slope": round(slope, 4),
        "spread_pct": round(100.0 * math.sqrt(float(ys @ ys) / dof), 4),
        "spread_given_gauge_pct": round(100.0 * math.sqrt(float(left @ left) / (dof - 1)), 4),
    }


def noise_summary(
    noise: dict, keys: tuple[str, ...] = ("index", "spread_pct", "host_gauge", "against_reference")
) -> dict:
    """What a result carries of a repeats index's run-to-run spread (simulator/noise.py): where it came from, each
    metric's spread, the host gauge."""
    return {k: noise.get(k) for k in keys}
