"""A measured run loaded to be scored or fitted: a realrun trace or an engine's benchmark file with the scenario that
describes its system (load_measured), and the index files that list such runs (read_index). simulator/validate.py
scores a run against the simulator, simulator/fit_items.py prices its items for the engine fit; both read runs here.
"""

from __future__ import annotations

import json
import math
import re
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

import numpy as np
import pandas as pd

from costmodel.methods import KVMethod

from . import files
from .config import Scenario, ScenarioError
from .engine_logs import RequestLog, is_engine_log, read_engine_log
from .load import load_scenario
from .trace_rows import MEASURED_ITERATIONS, MEASURED_TRACE, check_trace_rows, read_csv_table

GIB = 2**30


# a trace folder's decode iterations: as realrun writes them, or gzipped as the committed traces keep them (their
# size in git, and what travels to a device machine)
ITERATIONS_FILES = ("iterations.csv", "iterations.csv.gz")


def iterations_file(folder: Path) -> Path | None:
    """The trace folder's iterations file (ITERATIONS_FILES, the first there), or None."""
    return next((folder / f for f in ITERATIONS_FILES if (folder / f).exists()), None)


def load_trace(path: str | Path) -> tuple[pd.DataFrame, pd.DataFrame | None, dict, Path]:
    """The trace's requests (checked row by row, see simulator.trace_rows), its iterations and meta."""
    path = Path(path)
    folder = path if path.is_dir() else path.parent
    req_path = folder / "requests.csv" if path.is_dir() else path
    if not req_path.exists():
        raise ScenarioError(f"{path}: no requests.csv")
    df = check_trace_rows(read_csv_table(req_path, ScenarioError), str(req_path), MEASURED_TRACE, ScenarioError)
    if "quantize_end_s" not in df.columns:
        df["quantize_end_s"] = df["prefill_end_s"]
    it_path = iterations_file(folder)
    iterations = None
    if it_path is not None:
        iterations = read_csv_table(it_path, ScenarioError)
        if len(iterations):
            iterations = check_trace_rows(iterations, str(it_path), MEASURED_ITERATIONS, ScenarioError)
    meta_path = folder / "meta.json"
    meta = {}
    if meta_path.exists():
        try:
            meta = json.loads(files.read_text(meta_path, ScenarioError, "meta.json"))
        except json.JSONDecodeError as e:
            raise ScenarioError(f"{meta_path}: line {e.lineno}: not valid JSON ({e.msg})") from None
        if not isinstance(meta, dict):
            raise ScenarioError(f"{meta_path}: expected a JSON object")
        if "method" in meta and not isinstance(meta["method"], str):
            raise ScenarioError(f"{meta_path}: method: expected a method name")
    return df.reset_index(drop=True), iterations, meta, req_path


@dataclass
class Measured:
    """A measured run read and the scenario that describes it, with the run's own requests as its workload."""

    source: str  # "realrun", or the benchmark format (simulator/engine_logs.py)
    requests: pd.DataFrame  # the measured trace's columns it has (a benchmark file: arrival, lengths, first, finish)
    iterations: pd.DataFrame | None
    meta: dict
    scenario: Scenario
    config: KVMethod  # the method's entry in it
    files: list[Path]
    log: RequestLog | None = None
    notes: list[str] = field(default_factory=list)
    workdir: tempfile.TemporaryDirectory | None = None  # holds a benchmark file's requests as the workload CSV
    # a realrun trace whose process had run the same prompts before (earlier_run): every prefill's token count seen
    seen_before: str | None = None


def load_measured(
    trace: str | Path, scenario_path: str | Path, overrides: list[str] | None = None, method: str | None = None
) -> Measured:
    """A realrun trace or a benchmark file (module doc) with the scenario loaded to replay its requests: its
    lengths, and its arrivals where it has send times (else the scenario's arrival process)."""
    trace = Path(trace)
    if is_engine_log(trace):
        return _load_log(trace, scenario_path, overrides, method)
    df, iterations, meta, req_path = load_trace(trace)
    method = method or meta.get("method")
    if method is None:
        raise ScenarioError(f"{trace}: no method in meta.json; pass --method")
    ov = list(overrides or []) + [
        f"workload.trace_csv={req_path.resolve()}",
        "workload.arrival={kind: trace}",
        f"workload.requests={len(df)}",
    ]
    s = load_scenario(scenario_path, ov)
    cfg = _method(s, method, scenario_path)
    check_meta(meta, s, req_path.parent / "meta.json", scenario_path)
    found = [req_path.parent / "requests.csv", iterations_file(req_path.parent), req_path.parent / "meta.json"]
    m = Measured("realrun", df, iterations, meta, s, cfg, [f for f in found if f is not None and f.exists()])
    m.seen_before = earlier_run(meta, req_path.parent.name)
    return m


def earlier_run(meta: dict, name: str) -> str | None:
    """Which run of the same process ran this trace's prompts before it, from meta.json's command (realrun's
    runner.run_set: each method in turn, per method each rate, per rate `--repeats` runs, all on the workload of one
    seed, so the same prompt lengths) and the trace folder's name (<label>_<method>_r<rate>[_rep<k>]); None where it
    was the first (or the command does not say)."""
    words = str(meta.get("command", "")).split()

    def values(flag: str) -> list[str]:
        if flag not in words:
            return []
        rest = words[words.index(flag) + 1 :]
        return rest[: next((i for i, w in enumerate(rest) if w.startswith("--")), len(rest))]

    methods, rates = values("--method"), values("--rate")
    method, rate = meta.get("method"), meta.get("rate_rps")
    if methods and method in methods and methods[0] != method:
        return f"{methods[0]}, the process's first method"
    try:
        if rates and rate is not None and float(rates[0]) != float(rate) and float(rate) in map(float, rates):
            return f"{method} at {float(rates[0]):g} req/s, the process's first rate"
    except ValueError:
        return None
    rep = name.rsplit("_rep", 1)
    if len(rep) == 2 and rep[1].isdigit() and int(rep[1]) > 1:
        return f"{rep[0]}_rep1"
    return None


def _load_log(trace: Path, scenario_path, overrides, method: str | None) -> Measured:
    log = read_engine_log(trace)
    df = log.frame()
    tmp = tempfile.TemporaryDirectory(prefix="hacksim-log-")
    csv = Path(tmp.name) / "requests.csv"
    df[["arrival_s", "prompt_tokens", "output_tokens"]].to_csv(csv, index=False)
    ov = list(overrides or []) + [f"workload.trace_csv={csv}", f"workload.requests={len(df)}"]
    if log.sends_known:
        ov.append("workload.arrival={kind: trace}")
    s = load_scenario(scenario_path, ov)
    notes = list(log.notes)
    if not log.sends_known:
        arrival = s.workload.arrival
        if arrival is None or arrival.kind == "trace":
            raise ScenarioError(
                f"{trace}: the file has no send times, and {scenario_path} no arrival process (workload.arrival) "
                f"to replay its requests with"
            )
        notes.append(f"arrivals: the scenario's workload.arrival ({_arrival(arrival)}, seed {s.workload.seed})")
        rate = getattr(arrival, "rate_rps", None)
        if log.request_rate is not None and math.isfinite(log.request_rate) and rate != log.request_rate:
            notes.append(
                f"the file's request_rate ({log.request_rate:g} req/s) differs from the scenario's ({rate} req/s)"
            )
    notes.append("no phase timestamps and no iterations: only JCT, TTFT and TPOT are compared")
    if method is None:
        if len(s.methods) != 1:
            names = ", ".join(m.output_name for m in s.methods)
            raise ScenarioError(
                f"{trace}: a benchmark file names no method: pass --method (or a method column in the index), or "
                f"give a scenario with one method (this one has {names})"
            )
        method = s.methods[0].output_name
    cfg = _method(s, method, scenario_path)
    return Measured(log.format, df, None, dict(log.meta), s, cfg, [trace], log, notes, tmp)


def _arrival(a) -> str:
    rate = getattr(a, "rate_rps", None)
    return f"{a.kind} at {rate:g} req/s" if rate is not None else a.kind


def _method(s, method: str, scenario_path):
    cfg = next((m for m in s.methods if m.output_name == method), None)
    if cfg is None:
        raise ScenarioError(f"{scenario_path}: methods: the trace's method {method!r} is not in the scenario")
    return cfg


# meta.json keys realrun writes (realrun/harness.py) and the scenario value each must agree with
META_FIELDS = (
    ("model", "model.preset", lambda s: s.model.preset),
    ("layers", "model.layers", lambda s: s.model.layers),
    ("link_gbps", "network.bandwidth_gbps", lambda s: s.network.bandwidth_gbps),
    ("placement", "placement", lambda s: s.placement),
    ("max_decode_batch", "decode.max_batch_requests", lambda s: s.decode.max_batch_requests),
    ("prefill_max_batch_requests", "prefill.max_batch_requests", lambda s: s.prefill.max_batch_requests),
    (
        "kv_capacity_bytes",
        "decode.kv_capacity_gib",
        lambda s: None if s.decode.kv_capacity_gib is None else s.decode.kv_capacity_gib * GIB,
    ),
)


def check_meta(meta: dict, s, meta_path: Path, scenario_path) -> None:
    """Refuse a trace whose meta.json contradicts the scenario it is validated or fitted against, naming the
    field: a 70B run against an 8B scenario would be scored and fitted as if it were the 8B's."""
    for key, where, get in META_FIELDS:
        if key not in meta or meta[key] is None:
            continue
        want = get(s)
        if want is None:
            continue
        got = meta[key]
        same = (
            math.isclose(float(got), float(want), rel_tol=1e-6)
            if isinstance(got, (int, float)) and not isinstance(got, bool) and isinstance(want, (int, float))
            else str(got) == str(want)
        )
        if not same:
            raise ScenarioError(
                f"{meta_path}: {key} {got!r} contradicts {scenario_path}'s {where} {want!r}: validate a trace "
                f"against the scenario of the system that recorded it"
            )
    chunk = link_chunk_bytes(meta)
    if chunk is not None and chunk != s.network.round_robin_chunk_bytes:
        raise ScenarioError(
            f"{meta_path}: the link sent round-robin chunks of {chunk} B (notes) where {scenario_path}'s "
            f"network.round_robin_chunk_bytes is {s.network.round_robin_chunk_bytes}: validate a trace against the "
            f"scenario of the system that recorded it"
        )


def link_chunk_bytes(meta: dict) -> int | None:
    """The chunk realrun's link thread sent round robin (meta.json's notes: "round-robin N B chunks",
    realrun/harness.py); None where the notes do not say."""
    found = re.search(r"round-robin (\d+) B chunks", str(meta.get("notes", "")))
    return int(found.group(1)) if found else None


class IndexRow(NamedTuple):
    """One row of an index: the trace and scenario as written, their paths, and the optional columns."""

    trace: str
    scenario: str
    trace_path: Path
    scenario_path: Path
    method: str | None = None  # a benchmark file's method (realrun traces name theirs in meta.json)
    config: str | None = None  # a repeats index's group: recordings of one configuration, method and seed
    machine: str | None = None  # the machine (host) the run was recorded on: validate --cv --base groups by it


def read_index(index_csv: str | Path, require: tuple[str, ...] = ()) -> list[IndexRow]:
    """An index's rows (columns trace, scenario; optional method, config, machine and `require`d ones); relative paths
    are tried against the current directory, then the index's folder, then hacksim's own folder (the shipped
    indexes name `scenarios/measured/...` as the repository has them, so they run from any folder)."""
    index_csv = Path(index_csv)
    idx = read_csv_table(index_csv, ScenarioError, "trace index")
    need = ("trace", "scenario", *require)
    missing = set(need) - set(idx.columns)
    if missing:
        raise ScenarioError(
            f"{index_csv}: the index needs columns {', '.join(need)} (missing {', '.join(sorted(missing))})"
        )
    if not len(idx):
        raise ScenarioError(f"{index_csv}: no rows")
    blank = idx.loc[:, list(need)].isna().any(axis=1).to_numpy()
    if blank.any():
        raise ScenarioError(f"{index_csv} line {int(np.argmax(blank)) + 2}: empty {' or '.join(need)}")

    def where(p: str) -> Path:
        q = Path(p)
        if q.exists() or q.is_absolute() or (index_csv.parent / q).exists():
            return q if q.exists() or q.is_absolute() else index_csv.parent / q
        from .resolve import REPO_ROOT

        return REPO_ROOT / q if (REPO_ROOT / q).exists() else index_csv.parent / q

    def optional(col: str) -> list[str | None]:
        if col not in idx.columns:
            return [None] * len(idx)
        return [None if (isinstance(v, float) and math.isnan(v)) else str(v) for v in idx[col]]

    return [
        IndexRow(str(t), str(scen), where(str(t)), where(str(scen)), m, c, h)
        for t, scen, m, c, h in zip(
            idx["trace"], idx["scenario"], optional("method"), optional("config"), optional("machine")
        )
    ]
