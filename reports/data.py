"""Reading a finished run's files (the contract of ``cli.py simulate --out DIR``) into one object.

The report reads files and DataFrames only; it never imports the simulator (style rule 7), so a
report can be rebuilt from a saved run directory on any machine with pandas and plotly. Method
labels, colours and order come from the method registry (`costmodel.methods`: pure, no SimPy).

Files (all optional but ``summary.json``; a missing one leaves its section with a note):

- ``summary.json``   per-method statistics: completed, jct_s/ttft_s/tpot_s {mean,p50,p90,p99},
  breakdown_s (the parts of BREAKDOWN_PARTS, seconds), peak_decode_memory_bytes, kv_bytes_per_token {wire,memory},
  throughput_rps.
- ``requests.csv``   one row per request per method (latencies in seconds, sizes in bytes).
- ``memory.csv``     step function of decode memory: method, replica, time_s, used_bytes, capacity_bytes.
- ``links.csv``      step function of link use: method, link, time_s, active_flows, throughput_gbps
  [, capacity_gbps].
- ``scenario.json``  the resolved scenario, free-form nested JSON.
- ``profiles.json``  which calibration profile priced prefill and decode, and optional accuracy rows.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from costmodel import methods as registry

BASELINE = registry.REFERENCE

# The ten parts of a request's JCT, in the order they happen (preemption: decode admission on demand).
BREAKDOWN_PARTS = (
    "prefill_queue",
    "prefill",
    "quantize",
    "transfer_queue",
    "transfer",
    "decode_queue",
    "decode",
    "dequantize",
    "approximation",
    "preemption",
)
_COUNTS = ("no", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten", "eleven", "twelve")


def parts_in_words(n: int = len(BREAKDOWN_PARTS)) -> str:
    """How many parts the breakdown has, as prose writes it ("ten"), so a sentence never miscounts them."""
    return _COUNTS[n] if 0 <= n < len(_COUNTS) else str(n)


def order_methods(methods) -> list[str]:
    """The registry's methods in its display order (baseline first), then the rest by name."""
    methods = list(dict.fromkeys(methods))
    return sorted(methods, key=lambda m: (registry.display_rank(m), m))


@dataclass(frozen=True)
class RunData:
    """Everything a report shows, as plain dicts and DataFrames."""

    run_dir: Path
    summary: dict[str, Any]
    requests: pd.DataFrame | None = None
    memory: pd.DataFrame | None = None
    links: pd.DataFrame | None = None
    scenario: dict[str, Any] | None = None
    profiles: dict[str, Any] | None = None
    notes: tuple[str, ...] = field(default_factory=tuple)

    @property
    def name(self) -> str:
        return str(self.summary.get("scenario") or (self.scenario or {}).get("name") or self.run_dir.name)

    @property
    def methods(self) -> list[str]:
        found = list(self.summary.get("methods", {}))
        if not found and self.requests is not None and "method" in self.requests:
            found = list(self.requests["method"].unique())
        return order_methods(found)

    @property
    def method_configs(self) -> dict[str, dict]:
        """Scenario method entries by output name (its ``label``, else its ``name``)."""
        cfg = (self.scenario or {}).get("methods")
        if isinstance(cfg, dict):
            entries = [dict(v, name=v.get("name", k)) if isinstance(v, dict) else {"name": k} for k, v in cfg.items()]
        elif isinstance(cfg, list):
            entries = [e for e in cfg if isinstance(e, dict)]
        else:
            entries = []
        out = {}
        for e in entries:
            key = e.get("label") or e.get("name") or e.get("method") or e.get("kind")
            if key is not None:
                out[str(key)] = e
        return out

    @property
    def kinds(self) -> dict[str, str]:
        """Output name -> method kind (e.g. a labelled "hack_pi32" -> "hack"), where the scenario says."""
        return {k: str(e.get("name") or e.get("method") or e.get("kind") or k) for k, e in self.method_configs.items()}

    @property
    def baseline(self) -> str | None:
        return BASELINE if BASELINE in self.methods else None


class RunDataError(ValueError):
    """A run folder's file that cannot be read (truncated, not JSON/CSV); the message is one line."""


def _read_csv(
    path: Path, required: tuple[str, ...], notes: list[str], usecols=None, labels: tuple[str, ...] = ("method",)
) -> pd.DataFrame | None:
    """`labels`: text columns with few distinct values, read as categories (a million-row run's
    memory.csv holds the method's name two million times)."""
    if not path.is_file():
        notes.append(f"{path.name} not found: its figure is left out.")
        return None
    try:
        df = pd.read_csv(path, usecols=usecols, dtype={c: "category" for c in labels})
    except pd.errors.EmptyDataError:
        notes.append(f"{path.name} is empty: its figure is left out.")
        return None
    except (pd.errors.ParserError, UnicodeDecodeError, OSError) as e:
        raise RunDataError(
            f"{path}: not a readable CSV ({str(e).strip().splitlines()[-1] if str(e) else type(e).__name__})"
        ) from None
    return _checked(path.name, df, required, notes)


def _checked(name: str, df: pd.DataFrame, required: tuple[str, ...], notes: list[str]) -> pd.DataFrame | None:
    missing = [c for c in required if c not in df.columns]
    if missing:
        notes.append(f"{name} lacks column(s) {', '.join(missing)}: its figure is left out.")
        return None
    return df


def _held(
    name: str, df: pd.DataFrame, required: tuple[str, ...], notes: list[str], usecols=None, labels=("method",)
) -> pd.DataFrame | None:
    """A table handed over in memory, shaped as `_read_csv` reads its file: the same columns, the labels as
    categories (the CSV's numbers read back to the same floats: they are written in their shortest exact form)."""
    if usecols is not None and not all(usecols(c) for c in df.columns):
        df = df.loc[:, [c for c in df.columns if usecols(c)]]
    text = [c for c in labels if c in df.columns and not isinstance(df[c].dtype, pd.CategoricalDtype)]
    if text:
        df = df.assign(**{c: df[c].astype("category") for c in text})
    return _checked(name, df, required, notes)


def _read_json(path: Path, notes: list[str]) -> dict | None:
    if not path.is_file():
        notes.append(f"{path.name} not found.")
        return None
    return _json_object(path)


def _json_object(path: Path) -> dict:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise RunDataError(f"{path}: line {e.lineno}: not valid JSON ({e.msg}); is the file complete?") from None
    except (UnicodeDecodeError, OSError) as e:
        raise RunDataError(f"{path}: cannot read ({type(e).__name__})") from None
    if not isinstance(data, dict):
        raise RunDataError(f"{path}: expected a JSON object")
    return data


REQUEST_COLUMNS = ("method", "jct_s", "ttft_s", "tpot_s")  # of requests.csv, what the figures read


def request_columns(summary: dict) -> set[str]:
    """The columns of requests.csv the report reads: the latencies, and the breakdown parts where summary.json
    lacks them."""
    wanted: set[str] = set(REQUEST_COLUMNS)
    if not all(m.get("breakdown_s") for m in summary["methods"].values()):
        wanted |= {f"{p}_s" for p in BREAKDOWN_PARTS}
    return wanted


def load_run(run_dir: str | Path, tables: dict[str, pd.DataFrame] | None = None) -> RunData:
    """Load a run directory; only ``summary.json`` is required.

    ``tables``: requests, memory and links frames the writer of the folder's CSV files still holds, by file
    name ("requests.csv", ...), used instead of reading those files back (simulate hands them over); a frame
    that lacks a column the report reads is not used, and its file is read."""
    run_dir = Path(run_dir)
    tables = tables or {}
    summary_path = run_dir / "summary.json"
    if not summary_path.is_file():
        raise FileNotFoundError(f"{summary_path} not found: is {run_dir} the --out folder of a simulate run?")
    notes: list[str] = []
    summary = _json_object(summary_path)
    summary.setdefault("methods", {})
    if not isinstance(summary["methods"], dict) or not all(isinstance(m, dict) for m in summary["methods"].values()):
        raise RunDataError(f"{summary_path}: methods: expected an object of per-method objects")

    def table(name: str, required: tuple[str, ...], usecols: set[str] | None = None, labels=("method",)):
        held, pick = tables.get(name), None if usecols is None else usecols.__contains__
        if held is not None and all(c in held.columns for c in usecols or required):
            return _held(name, held, required, notes, pick, labels)
        return _read_csv(run_dir / name, required, notes, pick, labels)

    requests = table("requests.csv", REQUEST_COLUMNS, usecols=request_columns(summary))
    memory = table("memory.csv", ("method", "replica", "time_s", "used_bytes", "capacity_bytes"))
    links = table("links.csv", ("method", "link", "time_s", "throughput_gbps"), labels=("method", "link"))
    scenario = _read_json(run_dir / "scenario.json", notes)
    profiles = _read_json(run_dir / "profiles.json", notes)
    return RunData(run_dir, summary, requests, memory, links, scenario, profiles, tuple(notes))
