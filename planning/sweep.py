"""Sweeps: a base scenario plus axes of values; every point is one full simulation.

A sweep file (YAML) names a base scenario, relative to itself, and the values to try:

    base: ../a10g_10gbps.yaml
    mode: grid                              # grid: every combination; list: the `points` as given
    set: {workload.requests: 300}           # applied to every point
    axes:
      network.bandwidth_gbps: [10, 25, 40]
      methods: [[baseline], [hack]]         # a whole list is one value
      methods.0.partition: [32, 64]         # paths index into lists; a preset name becomes a mapping
    linked:                                 # axes that move together: one grid dimension, zipped
      - {prefill.instance: [g5.12xlarge, g6e.12xlarge], prefill.pipeline_parallel: [2, 1]}
    slo: {ttft_p99_s: 60, jct_p90_s: 90}    # optional: marks rows that meet them, for goodput

Paths are applied shortest first, so `methods` is replaced before `methods.0.partition` edits it.
When a path runs through a preset name (`model: llama-3.1-70b`, a method `hack` in a list), the
name becomes `{preset: name}` (`{name: hack}` for methods) before the field is set.

The result is one tidy table: one row per point x method with the axis values, the pools'
layout and cost per hour, and the summary metrics flattened (`jct_p90_s`, `breakdown_transfer_s`,
`kv_wire_bytes_per_token`, ...). A point whose scenario is invalid, or a method that does not fit,
is a row with an `error` message instead of a failed sweep.
"""

from __future__ import annotations

import copy
import itertools
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np
import pandas as pd
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from simulator.config import Scenario, ScenarioError, first_error, parse_scenario, read_yaml, set_path
from simulator.load import resolve_workload_files
from simulator.resolve import instances_per_replica, network_bandwidth_gbps, price_usd_per_hour

from .executor import Executor, PlanningError, Task

# ---- SLOs -----------------------------------------------------------------------------------------
SLO_METRICS = tuple(f"{q}_{stat}_s" for q in ("ttft", "tpot", "jct") for stat in ("mean", "p50", "p90", "p99"))


def parse_slo(text: str | dict | None) -> dict[str, float]:
    """`ttft_p99_s=60,tpot_p99_s=0.5` (or a mapping) -> {metric: upper bound in seconds}."""
    if text is None:
        return {}
    if isinstance(text, str):
        pairs = {}
        for item in filter(None, (p.strip() for p in text.split(","))):
            if "=" not in item:
                raise PlanningError(f"--slo {item!r}: expected metric=seconds, e.g. ttft_p99_s=60")
            k, v = item.split("=", 1)
            pairs[k.strip()] = v.strip()
        text = pairs
    out = {}
    for k, v in text.items():
        if k not in SLO_METRICS:
            raise PlanningError(f"slo {k!r}: unknown metric; use one of {', '.join(SLO_METRICS)}")
        try:
            out[k] = float(v)
        except (TypeError, ValueError):
            raise PlanningError(f"slo {k}={v!r}: not a number of seconds") from None
        if not out[k] > 0:
            raise PlanningError(f"slo {k}={v}: must be > 0 seconds")
    return out


def slo_misses(row: dict, slo: dict[str, float]) -> list[tuple[str, float, float]]:
    """(metric, value, limit) for every target the row misses; a missing value, unfinished requests or
    an unstable run (a pool's utilisation >= 1: a longer run would miss any latency target) count as a miss."""
    misses = []
    if row.get("completed") is not None and row.get("requests") is not None and row["completed"] < row["requests"]:
        misses.append(("completed", row["completed"], row["requests"]))
    if isinstance(row.get("stable"), (bool, np.bool_)) and not row["stable"]:
        util = [float(row[k]) for k in row if k.startswith("utilisation_") and row[k] is not None]
        misses.append(("utilisation", max((u for u in util if u == u), default=math.inf), 1.0))
    for k, limit in slo.items():
        v = row.get(k)
        if v is None or not (v <= limit):  # NaN misses
            misses.append((k, math.nan if v is None else float(v), limit))
    return misses


# ---- the sweep file -------------------------------------------------------------------------------
class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class HeatmapSpec(_Strict):
    x: str = Field(description="axis path on the x axis")
    y: str = Field(description="axis path on the y axis")
    metric: str = Field("jct_p90_s", description="table column shown as colour")


class ReportSpec(_Strict):
    heatmaps: list[HeatmapSpec] | None = Field(
        default=None, description="default: jct_p90_s and ttft_p99_s over the first two axes with more than one value"
    )


class SweepSpec(_Strict):
    name: str | None = Field(None, description="label in outputs; default: the file's stem")
    description: str = ""
    base: str = Field(description="base scenario YAML, relative to the sweep file")
    mode: Literal["grid", "list"] = Field(
        "grid", description="grid: every combination of the axes; list: the points as given"
    )
    set: dict[str, Any] = Field(default_factory=dict, description="path -> value applied to every point")
    axes: dict[str, list[Any]] = Field(default_factory=dict, description="grid: path -> values")
    linked: list[dict[str, list[Any]]] = Field(
        default_factory=list, description="grid: groups of paths whose values move together (zipped, equal lengths)"
    )
    points: list[dict[str, Any]] | None = Field(None, description="list: one mapping path -> value per point")
    slo: dict[str, float] = Field(default_factory=dict, description="optional targets (seconds) for goodput")
    report: ReportSpec = Field(default_factory=ReportSpec)

    @field_validator("axes")
    @classmethod
    def _non_empty(cls, v: dict) -> dict:
        for path, values in v.items():
            if not values:
                raise ValueError(f"axis {path} has no values")
        return v

    @field_validator("slo", mode="before")
    @classmethod
    def _slo(cls, v: Any) -> Any:
        try:
            return parse_slo(v) if v else {}
        except PlanningError as e:
            raise ValueError(str(e)) from None

    @model_validator(mode="after")
    def _mode(self) -> SweepSpec:
        if self.mode == "list":
            if not self.points:
                raise ValueError("mode: list needs a non-empty `points` list")
            if self.axes or self.linked:
                raise ValueError("mode: list takes `points`, not `axes`/`linked`")
        else:
            if self.points is not None:
                raise ValueError("`points` needs mode: list")
            if not self.axes and not self.linked:
                raise ValueError("a grid sweep needs at least one axis")
            seen = set(self.axes)
            for group in self.linked:
                lengths = {len(v) for v in group.values()}
                if len(lengths) != 1 or 0 in lengths:
                    raise ValueError(f"linked axes {list(group)} need equal, non-zero numbers of values")
                dup = seen & set(group)
                if dup:
                    raise ValueError(f"axis {sorted(dup)[0]} appears twice")
                seen |= set(group)
        return self

    def axis_paths(self) -> list[str]:
        if self.mode == "list":
            paths: list[str] = []
            for p in self.points or []:
                paths += [k for k in p if k not in paths]
            return paths
        return list(self.axes) + [k for g in self.linked for k in g]

    def expand(self) -> list[dict[str, Any]]:
        """Point values in a stable order (grid: the last axis varies fastest, linked groups last)."""
        if self.mode == "list":
            return [dict(p) for p in self.points or []]
        dims: list[list[dict[str, Any]]] = [[{path: v} for v in values] for path, values in self.axes.items()]
        for group in self.linked:
            n = len(next(iter(group.values())))
            dims.append([{path: values[i] for path, values in group.items()} for i in range(n)])
        return [{k: v for part in combo for k, v in part.items()} for combo in itertools.product(*dims)]


def load_sweep(path: str | Path) -> tuple[SweepSpec, Path]:
    """The validated spec and the base scenario's resolved path; errors are one-line PlanningErrors."""
    path = Path(path)
    raw = read_yaml(path, PlanningError, "sweep file")
    if not isinstance(raw, dict):
        raise PlanningError(f"{path}: expected a mapping at the top level")
    try:
        spec = SweepSpec.model_validate(raw)
    except ValidationError as e:
        raise PlanningError(first_error(str(path), e, "sweep")) from None
    base = (path.parent / spec.base).resolve()
    if not base.exists():
        raise PlanningError(f"{path}: base: no such file {base}")
    if spec.name is None:
        spec = spec.model_copy(update={"name": path.stem})
    return spec, base


# ---- building one point's scenario ------------------------------------------------------------------
def build_raw(base_raw: dict, values: dict[str, Any]) -> dict:
    raw = copy.deepcopy(base_raw)
    for path in sorted(values, key=lambda p: p.count(".")):  # stable: same depth keeps the given order
        set_path(raw, path, values[path])
    return raw


def resolve_scenario(raw: dict, base_path: Path, source: str) -> Scenario:
    """parse_scenario plus load_scenario's trace rules (paths relative to the base scenario's folder)."""
    return resolve_workload_files(parse_scenario(raw, source), base_path.parent, source)


def read_base(base_path: Path) -> dict:
    raw = read_yaml(Path(base_path), PlanningError, "base scenario")
    if not isinstance(raw, dict):
        raise PlanningError(f"{base_path}: expected a mapping at the top level")
    return raw


# ---- cost and table rows ----------------------------------------------------------------------------
def cost_usd_per_hour(s: Scenario) -> float | None:
    """Σ pools replicas x instances per replica x price per instance; None when a pool has no price.

    With `placement: shared_gpu` prefill replica i and decode replica i run on the same GPUs, so the
    instances are paid once: the dearer of the two pools."""
    costs = []
    for pool in (s.prefill, s.decode):
        price = price_usd_per_hour(pool)
        if price is None:
            return None
        costs.append(pool.replicas * instances_per_replica(pool) * price)
    return max(costs) if getattr(s, "placement", "separate") == "shared_gpu" else sum(costs)


def config_columns(s: Scenario) -> dict[str, Any]:
    cost = cost_usd_per_hour(s)
    row: dict[str, Any] = {}
    for name, pool in (("prefill", s.prefill), ("decode", s.decode)):
        row[f"{name}_instance"] = pool.instance or ""
        gpu = pool.gpu
        assert gpu is not None  # PoolConfig fills it from the instance or refuses
        row[f"{name}_gpu"] = gpu.preset or gpu.name
        row[f"{name}_tensor_parallel"] = pool.tensor_parallel
        row[f"{name}_pipeline_parallel"] = pool.pipeline_parallel
        row[f"{name}_replicas"] = pool.replicas
        row[f"{name}_instances"] = pool.replicas * instances_per_replica(pool)
    row["network_bandwidth_gbps"] = network_bandwidth_gbps(s)
    row["rate_rps"] = getattr(s.workload.arrival, "rate_rps", math.nan)
    row["requests"] = s.workload.requests
    row["seed"] = s.workload.seed
    row["cost_usd_per_hour"] = math.nan if cost is None else cost
    return row


def _sub_name(key: str, sub: str) -> str:
    """jct_s + p90 -> jct_p90_s; breakdown_s + transfer -> breakdown_transfer_s;
    kv_bytes_per_token + wire -> kv_wire_bytes_per_token."""
    if key == "kv_bytes_per_token":
        return f"kv_{sub}_bytes_per_token"
    for unit in ("_s", "_bytes"):
        if key.endswith(unit):
            return f"{key[: -len(unit)]}_{sub}{unit}"
    return f"{key}_{sub}"


def metric_columns(summary: dict) -> dict[str, Any]:
    """One method's summary as flat columns (one level of nesting; anything deeper stays JSON text)."""

    def cell(x: Any) -> Any:
        if x is None:
            return math.nan
        return axis_cell(x)

    row: dict[str, Any] = {}
    for key, v in summary.items():
        if isinstance(v, dict):
            for sub, x in v.items():
                row[_sub_name(key, sub)] = cell(x)
        else:
            row[key] = cell(v)
    return row


def axis_cell(v: Any) -> Any:
    """Axis values as table cells: scalars as they are, lists and mappings as compact JSON."""
    if isinstance(v, (list, dict)):
        return json.dumps(v, separators=(",", ":"), sort_keys=isinstance(v, dict))
    return v


# ---- running a sweep ---------------------------------------------------------------------------------
@dataclass
class SweepResult:
    spec: SweepSpec
    table: pd.DataFrame
    stats: Any
    points: int


def prepare_points(spec: SweepSpec, base_path: Path, source: str) -> list[tuple[dict, Scenario | None, str | None]]:
    """(values, scenario or None, error or None) per point."""
    base_raw = read_base(base_path)
    out = []
    for i, values in enumerate(spec.expand()):
        merged = {**spec.set, **values}
        try:
            s = resolve_scenario(build_raw(base_raw, merged), base_path, f"{source} point {i}")
            out.append((values, s, None))
        except ScenarioError as e:
            out.append((values, None, str(e).removeprefix(f"{source} point {i}: ")))
    return out


def run_sweep(spec: SweepSpec, base_path: Path, executor: Executor, source: str = "sweep") -> SweepResult:
    points = prepare_points(spec, base_path, source)
    if all(s is None for _, s, _ in points):
        raise PlanningError(f"{source}: every point is invalid; point 0: {points[0][2]}")
    tasks = {i: Task.of(s) for i, (_, s, _) in enumerate(points) if s is not None}
    results = executor.run(tasks.values())
    return SweepResult(spec, build_table(spec, points, tasks, results), executor.stats, len(points))


INT_COLUMNS = tuple(
    f"{p}_{k}" for p in ("prefill", "decode") for k in ("tensor_parallel", "pipeline_parallel", "replicas", "instances")
) + ("requests", "seed", "completed")


def build_table(spec: SweepSpec, points, tasks: dict[int, Task], results: dict[str, dict]) -> pd.DataFrame:
    paths = spec.axis_paths()
    rows = []
    for i, (values, s, err) in enumerate(points):
        head = {"point": i, **{p: axis_cell(values.get(p)) for p in paths}}
        if s is None:
            rows.append({**head, "method": "", "error": err})
            continue
        conf = config_columns(s)
        res = results[tasks[i].key]
        for m in s.methods:
            name = m.output_name
            r = res["methods"].get(name, {"error": "no result"})
            row = {**head, "method": name, "scenario_key": tasks[i].key[:16], **conf}
            if "summary" in r:
                row.update(metric_columns(r["summary"]))
                row["error"] = ""
            else:
                row["error"] = r["error"]
            rows.append(row)
    df = pd.DataFrame(rows)
    if "error" not in df.columns:
        df["error"] = ""
    df["error"] = df["error"].fillna("")
    if spec.slo:
        ok = []
        for r in df.to_dict(orient="records"):
            ok.append(not r["error"] and not slo_misses(r, spec.slo))
        df["meets_slo"] = ok
    for c in INT_COLUMNS:
        if c in df.columns:
            df[c] = df[c].astype("Int64")  # stays integer beside error rows (empty in CSV)
    return df.loc[:, _column_order(list(df.columns))]


# Metric columns in reading order; any the simulator adds later follow, sorted by name.
METRIC_ORDER = (
    "completed",
    "throughput_rps",
    *(f"{q}_{s}_s" for q in ("jct", "ttft", "tpot") for s in ("mean", "p50", "p90", "p99")),
)


def _column_order(cols: list[str]) -> list[str]:
    """Same order whatever order the summaries' keys arrive in (fresh, cached, pool or Ray)."""
    first = [c for c in cols if c not in ("meets_slo", "error")]
    n_fixed = first.index("cost_usd_per_hour") + 1 if "cost_usd_per_hour" in first else len(first)
    fixed, metrics = first[:n_fixed], first[n_fixed:]
    known = [c for c in METRIC_ORDER if c in metrics]
    rest = sorted(c for c in metrics if c not in known)
    return fixed + known + rest + [c for c in ("meets_slo", "error") if c in cols]


# ---- writing ------------------------------------------------------------------------------------------
def parquet_available() -> bool:
    try:
        import pyarrow  # noqa: F401
    except ImportError:
        return False
    return True


def write_table(df: pd.DataFrame, out: Path) -> tuple[list[Path], str | None]:
    """results.csv, and results.parquet when pyarrow is installed; returns (written, note)."""
    import os

    out.mkdir(parents=True, exist_ok=True)
    written = []
    tmp = out / ".results.csv.tmp"
    df.to_csv(tmp, index=False)
    os.replace(tmp, out / "results.csv")
    written.append(out / "results.csv")
    if not parquet_available():
        return written, "results.parquet not written: pyarrow is not installed (pip install pyarrow); wrote CSV only"
    tmp = out / ".results.parquet.tmp"
    _parquet_safe(df).to_parquet(tmp, index=False, engine="pyarrow")
    os.replace(tmp, out / "results.parquet")
    written.append(out / "results.parquet")
    return written, None


def _parquet_safe(df: pd.DataFrame) -> pd.DataFrame:
    """Parquet columns have one type: an axis mixing numbers and names, or holding integers beyond int64,
    becomes text."""
    df = df.copy()
    for c in df.columns:
        if df[c].dtype == object and (
            len({type(v) for v in df[c] if v is not None}) > 1
            or any(isinstance(v, int) and not -(2**63) <= v < 2**63 for v in df[c])
        ):
            df[c] = df[c].map(lambda v: "" if v is None or (isinstance(v, float) and math.isnan(v)) else str(v))
    return df
