"""Public LLM-serving traces as workloads: each format read into arrivals and lengths.

`workload: {trace: {format: F, path: FILE}}` replays a recorded trace; `load_trace` returns its
requests after the filters (BurstGPT's model and log type), the time window (`start_s`,
`duration_s`, on the trace's own clock from its first request) and `rate_scale` (gaps divided by
it), arrivals from 0. The formats and the columns read:

| format | file | arrival | prompt tokens | output tokens |
|---|---|---|---|---|
| azure | CSV, Azure LLM inference traces 2023/2024 | `TIMESTAMP` (wall clock) | `ContextTokens` | `GeneratedTokens` |
| burstgpt | CSV, BurstGPT | `Timestamp` (s) | `Request tokens` | `Response tokens` |
| mooncake | JSONL, Mooncake traces | `timestamp` (ms) | `input_length` | `output_length` |
| vllm_bench | JSON, vLLM `benchmark_serving --save-result` | `start_times`, else Poisson at `request_rate` (seed 0), else all at 0 | `input_lens` | `output_lens` |
| csv | CSV, hacksim's own | `arrival_s` | `prompt_tokens` | `output_tokens` |

Mooncake's `hash_ids` (the prompt's prefix-block hashes) are kept per request (`Trace.block_hashes`)
for prefix caching. Requests that produced nothing are not requests to serve and are left out:
BurstGPT's failed rows (0 response tokens) and vLLM's failed requests (a non-empty `errors` entry).
A row that cannot be a request (a missing or non-finite value, a negative time, tokens that are not
whole numbers, a prompt without tokens, a time before the previous row's, a repeated request_id) is
refused with one line naming the file and its line (as an editor shows it, counting a CSV's header
line; for vLLM's lists, the request's position), by the checks every trace format shares
(simulator/trace_rows.py).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from .config import ScenarioError, TraceConfig
from .trace_rows import RowChecker

BURSTGPT_COLUMNS = ("Timestamp", "Model", "Request tokens", "Response tokens", "Total tokens", "Log Type")


@dataclass(frozen=True)
class Trace:
    arrival_s: np.ndarray  # (N,) float64, from 0, non-decreasing
    prompt_tokens: np.ndarray  # (N,) int64, >= 1
    output_tokens: np.ndarray  # (N,) int64, >= 1
    block_hashes: tuple | None = None  # Mooncake: per request, its prompt's block hashes

    def __len__(self) -> int:
        return len(self.arrival_s)


@dataclass(frozen=True)
class _Rows:
    """Parsed columns before the window, with each row's line in the file for messages."""

    time_s: np.ndarray
    prompt: np.ndarray
    output: np.ndarray
    line: np.ndarray
    hashes: list | None = None


def _fail(path, message: str) -> None:
    raise ScenarioError(f"workload.trace: {path}: {message}")


def _csv(path: Path, columns: tuple[str, ...]) -> pd.DataFrame:
    try:
        df = pd.read_csv(path, skipinitialspace=True)
    except FileNotFoundError:
        _fail(path, "no such file")
    except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError) as e:
        _fail(path, f"not a readable CSV ({str(e).splitlines()[0]})")
    df.columns = [str(c).strip() for c in df.columns]
    missing = [c for c in columns if c not in df.columns]
    if missing:
        _fail(path, f"no column {missing[0]!r} (columns: {', '.join(map(str, df.columns))})")
    return df


def _rows(path: Path, lines: np.ndarray, unit: str = "line") -> RowChecker:
    return RowChecker(f"workload.trace: {path}:", ScenarioError, lines=lines, unit=unit)


def _numbers(path: Path, values, name: str, lines: np.ndarray, unit: str = "line") -> np.ndarray:
    return _rows(path, lines, unit).times(values, name)


def _tokens(path: Path, values, name: str, lines: np.ndarray, least: int = 0, unit: str = "line") -> np.ndarray:
    return _rows(path, lines, unit).counts(values, name, least)


def _read_azure(path: Path, cfg: TraceConfig) -> _Rows:
    df = _csv(path, ("TIMESTAMP", "ContextTokens", "GeneratedTokens"))
    lines = np.arange(len(df)) + 2
    stamps = pd.to_datetime(df["TIMESTAMP"], errors="coerce", utc=True, format="mixed")
    if stamps.isna().any():
        i = int(np.argmax(stamps.isna().to_numpy()))
        _fail(path, f"line {lines[i]}: TIMESTAMP {df['TIMESTAMP'].iloc[i]!r} is not a date and time")
    time_s = (stamps - stamps.iloc[0]).dt.total_seconds().to_numpy(np.float64) if len(stamps) else np.zeros(0)
    return _Rows(
        time_s,
        _tokens(path, df["ContextTokens"].to_numpy(), "ContextTokens", lines, least=1),
        _tokens(path, df["GeneratedTokens"].to_numpy(), "GeneratedTokens", lines),
        lines,
    )


def _read_burstgpt(path: Path, cfg: TraceConfig) -> _Rows:
    df = _csv(path, BURSTGPT_COLUMNS)
    lines = np.arange(len(df)) + 2
    keep = np.ones(len(df), dtype=bool)
    for column, wanted in (("Model", cfg.models), ("Log Type", cfg.log_types)):
        if wanted is not None:
            values = df[column].astype(str).str.strip()
            unknown = sorted(set(wanted) - set(values))
            if unknown:
                _fail(path, f"no row has {column} {unknown[0]!r} (present: {', '.join(sorted(set(values)))})")
            keep &= values.isin(wanted).to_numpy()
    df, lines = df[keep], lines[keep]
    time_s = _numbers(path, df["Timestamp"].to_numpy(), "Timestamp", lines)
    prompt = _tokens(path, df["Request tokens"].to_numpy(), "Request tokens", lines, least=1)
    output = _tokens(path, df["Response tokens"].to_numpy(), "Response tokens", lines)
    served = output > 0  # BurstGPT records failed requests with 0 response tokens
    return _Rows(time_s[served], prompt[served], output[served], lines[served])


def _read_mooncake(path: Path, cfg: TraceConfig) -> _Rows:
    times, prompts, outputs, hashes = [], [], [], []
    try:
        text = path.read_text()
    except FileNotFoundError:
        _fail(path, "no such file")
    except (OSError, UnicodeDecodeError) as e:
        _fail(path, f"cannot read ({e})")
    lines = []
    for n, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            _fail(path, f"line {n}: not a JSON object")
        if not isinstance(row, dict):
            _fail(path, f"line {n}: not a JSON object")
        for key in ("timestamp", "input_length", "output_length"):
            if key not in row:
                _fail(path, f"line {n}: no {key!r}")
        times.append(row["timestamp"])
        prompts.append(row["input_length"])
        outputs.append(row["output_length"])
        h = row.get("hash_ids", [])
        if not isinstance(h, list):
            _fail(path, f"line {n}: hash_ids is not a list")
        bad = next((x for x in h if isinstance(x, bool) or not isinstance(x, int)), None)
        if bad is not None:
            _fail(path, f"line {n}: hash_ids: {str(bad)[:40]!r} is not a block hash (an integer)")
        hashes.append(tuple(h))
        lines.append(n)
    lines = np.asarray(lines, dtype=np.int64)
    return _Rows(
        _numbers(path, np.asarray(times, dtype=object), "timestamp", lines) / 1e3,
        _tokens(path, np.asarray(prompts, dtype=object), "input_length", lines, least=1),
        _tokens(path, np.asarray(outputs, dtype=object), "output_length", lines),
        lines,
        hashes,
    )


def _read_vllm_bench(path: Path, cfg: TraceConfig) -> _Rows:
    try:
        doc = json.loads(path.read_text())
    except FileNotFoundError:
        _fail(path, "no such file")
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        _fail(path, f"not a readable JSON file ({str(e).splitlines()[0]})")
    if not isinstance(doc, dict) or "input_lens" not in doc or "output_lens" not in doc:
        _fail(
            path,
            "no input_lens and output_lens: save the benchmark with --save-result (and --save-detailed on newer vLLM)",
        )
    n = _list(path, doc, "input_lens")
    for key in ("output_lens", "errors", "start_times"):
        if (key == "output_lens" or doc.get(key) is not None) and _list(path, doc, key) != n:
            _fail(path, f"{key} has {len(doc[key])} entries for {n} requests (input_lens)")
    lines = np.arange(n) + 1  # the request's position in the lists
    errors = doc.get("errors") or [""] * n
    served = np.array([not e for e in errors], dtype=bool)
    prompt = _tokens(path, np.asarray(doc["input_lens"], dtype=object), "input_lens", lines, least=1, unit="request")
    output = _tokens(path, np.asarray(doc["output_lens"], dtype=object), "output_lens", lines, unit="request")
    if doc.get("start_times") is not None:
        start = _numbers(path, np.asarray(doc["start_times"], dtype=object), "start_times", lines, unit="request")
        time_s = start - start.min() if n else start
    else:
        rate = _request_rate(path, doc.get("request_rate"))
        if math.isfinite(rate):
            # vLLM's benchmark draws Poisson gaps at request_rate; the file keeps the rate, not the draws.
            time_s = (
                np.concatenate([[0.0], np.cumsum(np.random.default_rng(0).exponential(1 / rate, n - 1))])
                if n
                else np.zeros(0)
            )
        else:
            time_s = np.zeros(n)
        order = np.argsort(time_s, kind="stable")
        time_s = time_s[order]
    keep = served & (output > 0)
    return _Rows(time_s[keep], prompt[keep], output[keep], lines[keep])


def _list(path: Path, doc: dict, key: str) -> int:
    """The length of a per-request list; a value that is not a list is refused naming the key."""
    v = doc[key]
    if not isinstance(v, list):
        _fail(path, f"{key}: expected a list (one entry per request), got {type(v).__name__}")
    return len(v)


def _request_rate(path: Path, rate) -> float:
    """A vLLM benchmark's request_rate: a number > 0 of requests per second, or inf ("inf", or absent: every
    request at once); anything else (a negative rate would replay everything at t = 0) is refused."""
    if rate is None or (isinstance(rate, str) and rate.strip().lower() in ("inf", "infinity")):
        return math.inf
    if isinstance(rate, bool) or not isinstance(rate, (int, float)) or not rate > 0:
        _fail(path, f"request_rate: {str(rate)[:40]!r} is not a rate > 0 requests per second (or 'inf')")
    return float(rate)


def _read_csv(path: Path, cfg: TraceConfig) -> _Rows:
    df = _csv(path, ("arrival_s", "prompt_tokens", "output_tokens"))
    lines = np.arange(len(df)) + 2
    if "request_id" in df.columns:
        _rows(path, lines).unique(df["request_id"], "request_id")
    return _Rows(
        _numbers(path, df["arrival_s"].to_numpy(), "arrival_s", lines),
        _tokens(path, df["prompt_tokens"].to_numpy(), "prompt_tokens", lines, least=1),
        _tokens(path, df["output_tokens"].to_numpy(), "output_tokens", lines),
        lines,
    )


READERS = {
    "azure": _read_azure,
    "burstgpt": _read_burstgpt,
    "mooncake": _read_mooncake,
    "vllm_bench": _read_vllm_bench,
    "csv": _read_csv,
}


def load_trace(cfg: TraceConfig, source: str = "") -> Trace:
    """The trace's requests after filters, window and rate_scale; ScenarioError (one line) when the file is
    missing, malformed, out of order, or leaves no request."""
    path = Path(cfg.path)
    rows = READERS[cfg.format](path, cfg)
    unit = "request" if cfg.format == "vllm_bench" else "line"
    _rows(path, rows.line, unit).sorted(rows.time_s, "arrival_s")
    t = rows.time_s - (rows.time_s[0] if len(rows.time_s) else 0.0)
    keep = t >= cfg.start_s
    if cfg.duration_s is not None:
        keep &= t < cfg.start_s + cfg.duration_s
    if not keep.any():
        window = (
            f"[{cfg.start_s:g}, {cfg.start_s + cfg.duration_s:g}) s" if cfg.duration_s else f"from {cfg.start_s:g} s"
        )
        _fail(path, f"no request left (window {window} of a {t[-1] if len(t) else 0:g} s trace, after filters)")
    kept = t[keep]
    arrival = (kept - kept[0]) / cfg.rate_scale
    hashes = None if rows.hashes is None else tuple(h for h, k in zip(rows.hashes, keep) if k)
    return Trace(arrival, rows.prompt[keep], rows.output[keep], hashes)
