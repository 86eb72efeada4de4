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
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np
import pandas as pd
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from simulator.config import Scenario, ScenarioError, first_error, parse_scenario, read_yaml, set_path
from simulator.files import strict_json
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
            if k.strip() in pairs:
                raise PlanningError(
                    f"--slo {k.strip()}: given twice ({pairs[k.strip()]} and {v.strip()}); give it once"
                )
            pairs[k.strip()] = v.strip()
        text = pairs
    out = {}
    for k, v in text.items():
        if k not in SLO_METRICS:
            raise PlanningError(f"slo {k!r}: unknown metric; use one of {', '.join(SLO_METRICS)}")
        try:
            if isinstance(v, bool):
                raise TypeError
            out[k] = float(v)
        except (TypeError, ValueError):
            raise PlanningError(f"slo {k}={v!r}: not a number of seconds") from None
        if not out[k] > 0:
            raise PlanningError(f"slo {k}={v}: must be > 0 seconds")
        if math.isinf(out[k]):
            raise PlanningError(f"slo {k}={v}: a target must be finite; leave {k} out to set no target on it")
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


# A sweep of more points than this is refused (split it, or list the points that matter); past
# WARN_SWEEP_POINTS the sweep command warns before it starts. A point at the shipped sweeps' 300 requests
# takes about a second per method on one core, so 10,000 points are hours on a workstation.
MAX_SWEEP_POINTS = 100_000
WARN_SWEEP_POINTS = 10_000
# A sweep's name becomes a folder under out/sweeps/: one plain path component, short enough for any file system.
SWEEP_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.+=-]{0,99}")


class SweepSpec(_Strict):
    name: str | None = Field(
        None,
        description="label in outputs and the folder under out/sweeps/ by default: letters, digits and _ . + = -, "
        "at most 100 characters, not starting with a dot; default: the file's stem",
    )
    description: str = Field("", description="what the sweep asks, shown on its report")
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
    report: ReportSpec = Field(default_factory=ReportSpec, description="what the report shows")

    @field_validator("name")
    @classmethod
    def _name(cls, v: str | None) -> str | None:
        if v is not None and not SWEEP_NAME.fullmatch(v):
            shown = v if len(v) <= 60 else f"{v[:40]}... ({len(v)} characters)"
            raise ValueError(
                f"{shown!r} is not a plain folder name: letters, digits and _ . + = -, at most 100 characters, "
                "not starting with a dot (the name becomes out/sweeps/NAME)"
            )
        return v

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
        n = self.point_count()
        if n > MAX_SWEEP_POINTS:
            raise ValueError(
                f"{n:,} points, more than the {MAX_SWEEP_POINTS:,} a sweep may have: split it into several sweeps "
                "or list the points that matter (mode: list)"
            )
        return self

    def point_count(self) -> int:
        """How many points `expand` gives, without expanding them."""
        if self.mode == "list":
            return len(self.points or [])
        return math.prod(len(v) for v in self.axes.values()) * math.prod(
            len(next(iter(g.values()))) for g in self.linked
        )

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
        try:
            spec = spec.model_copy(update={"name": SweepSpec._name(path.stem)})
        except ValueError as e:
            raise PlanningError(f"{path}: name (the file's stem, as none is given): {e}") from None
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
) + (
    "requests",
    "seed",
    "completed",
    "failed",
    "retried",
    "preemptions",
    "decode_memory_blocks",
    "decode_memory_block_tokens",
    "decode_memory_gpus",
)
BOOL_COLUMNS = ("stable", "meets_slo")
# A config column that says again what an axis of the same name sets (the axis keeps the value as given,
# error rows included); dropped from the table when that axis is swept.
AXIS_TWINS = {
    **{
        f"{p}.{k}": f"{p}_{k}"
        for p in ("prefill", "decode")
        for k in ("instance", "tensor_parallel", "pipeline_parallel", "replicas")
    },
    "network.bandwidth_gbps": "network_bandwidth_gbps",
    "workload.arrival.rate_rps": "rate_rps",
    "workload.requests": "requests",
    "workload.seed": "seed",
}
# Summary fields that repeat another under a second name (decode_memory's kv_capacity_bytes is
# decode_kv_capacity_bytes).
REPEATED_METRICS = ("decode_memory_kv_capacity_bytes",)


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
    return tidy(df, paths)


def tidy(df: pd.DataFrame, paths: list[str]) -> pd.DataFrame:
    """Each fact in one column of one type: a config column that repeats a swept axis and a metric that
    repeats another go; byte counts are whole bytes and counts integers (Int64: empty beside error rows);
    yes/no columns are booleans (empty beside error rows)."""
    drop = [AXIS_TWINS[p] for p in paths if AXIS_TWINS.get(p) in df.columns]
    drop += [c for c in REPEATED_METRICS if c in df.columns]
    if "methods" in paths and "methods" in df.columns and "method" in df.columns:
        bare = df["methods"].map(lambda v: _bare_method(v)) == df["method"]
        if bool(bare.all()):  # each value a one-name list: the method column says it
            drop.append("methods")
    df = df.drop(columns=drop)
    for c in df.columns:
        if c in INT_COLUMNS or c.startswith("prefill_attention_"):
            df[c] = df[c].astype("Int64")
        elif _byte_count(c) and pd.api.types.is_numeric_dtype(df[c]):
            df[c] = df[c].round().astype("Int64")
        elif c in BOOL_COLUMNS and df[c].dtype == object:  # True/False beside NaN on error rows
            df[c] = df[c].astype("boolean")
    return df.loc[:, _column_order(list(df.columns))]


def _byte_count(column: str) -> bool:
    """`peak_decode_memory_bytes`, `decode_memory_kv_pool_bytes_per_gpu`: a number of bytes (bytes per token
    is a mean, and stays fractional)."""
    return column.endswith("_bytes") or "_bytes_per_" in column and not column.endswith("_bytes_per_token")


def _bare_method(v: Any) -> str | None:
    """The name in a `methods` axis value that is a list of one bare name (`["hack"]`), else None."""
    try:
        value = json.loads(v) if isinstance(v, str) else v
    except ValueError:
        return None
    return value[0] if isinstance(value, list) and len(value) == 1 and isinstance(value[0], str) else None


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


def write_table(df: pd.DataFrame, out: Path, metadata: dict | None = None) -> tuple[list[Path], str | None]:
    """results.csv, and results.parquet when pyarrow is installed (with `metadata` and each column's unit
    in its metadata: `parquet_metadata`); returns (written, note). An empty `error` is an empty field in
    the CSV and null in the Parquet file."""
    from simulator.files import write_atomically

    out.mkdir(parents=True, exist_ok=True)
    df = df.assign(error=df["error"].where(df["error"] != "", None)) if "error" in df.columns else df
    written = [write_atomically(out / "results.csv", lambda p: df.to_csv(p, index=False))]
    if not parquet_available():
        return written, "results.parquet not written: pyarrow is not installed (pip install pyarrow); wrote CSV only"
    written.append(write_atomically(out / "results.parquet", lambda p: _write_parquet(df, p, metadata or {})))
    return written, None


def _write_parquet(df: pd.DataFrame, path: Path, metadata: dict) -> None:
    """The table with `hacksim` in the file's metadata (JSON: what the sweep ran and each column's unit) and
    each column's unit in its field's metadata (`unit`)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pa.Table.from_pandas(_parquet_safe(df), preserve_index=False)
    from .report import column_unit

    units = {c: u for c in df.columns if (u := column_unit(str(c))) is not None}
    fields = [f.with_metadata({"unit": units[f.name]}) if f.name in units else f for f in table.schema]
    meta = dict(table.schema.metadata or {})
    meta[b"hacksim"] = strict_json({**metadata, "units": units}, indent=None, sort_keys=True).encode()
    pq.write_table(pa.Table.from_arrays(table.columns, schema=pa.schema(fields, metadata=meta)), path)


def write_sweep_outputs(
    result: SweepResult,
    out: Path,
    sweep_file: Path,
    base: Path,
    *,
    report: bool = True,
    plotlyjs: str | None = None,
    stats_line: str = "",
) -> tuple[list[Path], list[str], dict]:
    """results.csv, results.parquet, report.html and sweep.json, written into a temporary folder inside `out`
    and moved in together (signals held), so an interrupt or a full disk leaves `out` as it was; without a
    report, an earlier run's report.html goes. Returns (the tables and report written, notes, sweep.json's
    content)."""
    import shutil
    import tempfile

    from simulator.files import move_into, remove_stale_temps, strict_json, temp_prefix

    from .report import write_report

    spec, df = result.spec, result.table
    failed = df.loc[df["error"] != ""]
    doc = {
        "sweep": str(sweep_file),
        "base": str(base),
        "spec": spec.model_dump(),
        "points": result.points,
        "rows": len(df),
        "errors": len(failed),
        "first_error": None
        if failed.empty
        else {k: failed.iloc[0][k] for k in ("point", "method", "error")} | {"point": int(failed.iloc[0]["point"])},
    }
    metadata = {"sweep": doc["spec"], "sweep_file": str(sweep_file), "base_file": str(base), "base": read_base(base)}
    out.mkdir(parents=True, exist_ok=True)
    remove_stale_temps(out)
    tmp = Path(tempfile.mkdtemp(prefix=temp_prefix(), dir=out))
    try:
        tables, note = write_table(df, tmp, metadata)
        if report:
            write_report(
                df,
                tmp,
                page_dir=out,
                name=spec.name or sweep_file.stem,
                description=spec.description,
                base=str(base),
                axis_paths=spec.axis_paths(),
                slo=spec.slo,
                heatmaps=spec.report.heatmaps,
                stats_line=stats_line,
                plotlyjs=plotlyjs,
            )
        (tmp / "sweep.json").write_text(strict_json(doc) + "\n")
        names = move_into(tmp, out)
        if not report:
            (out / "report.html").unlink(missing_ok=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    written = [out / p.name for p in tables] + ([out / "report.html"] if "report.html" in names else [])
    return written, [note] if note else [], doc


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
