"""Checking a trace table before anything runs on it: one place for every trace format.

A trace (a workload to replay, a measured run to validate against, or a public format converted
into a table) is refused with one line naming the file and the line of the first bad row when:

- a required column is missing, or the table has no rows;
- a time is not a number, not finite or negative (a NaN arrival would stall the event loop);
- a token count is not a whole number in [minimum, MAX_TOKENS];
- a row's timestamps are out of order (finish before arrival, transfer end before its start, ...);
- an id repeats, or the rows are not in arrival order.

`TraceColumns` says which columns a format has and what holds between them; `check_trace_rows`
applies it to a DataFrame and returns it with those columns as float64 / int64. Line numbers count
the file's lines: for a CSV with a header, row 0 is line 2 (`first_line=2`, the default); a format
without a header line (JSON Lines) passes `first_line=1`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import cast

import numpy as np
import pandas as pd

MAX_TOKENS = 10**9  # far above any context length; keeps token counts inside int64 arithmetic


@dataclass(frozen=True)
class TraceColumns:
    """What a trace table must satisfy."""

    required: tuple[str, ...]  # columns that must be present
    times: tuple[str, ...] = ()  # seconds: finite, >= 0 (checked when present)
    counts: Mapping[str, int] = field(default_factory=dict)  # column -> least allowed whole number
    before: tuple[tuple[str, str], ...] = ()  # (a, b): a <= b on every row (both present)
    unique: str | None = None  # an id column whose values must not repeat
    sorted_by: str | None = None  # rows must be in non-decreasing order of it


def read_csv_table(path: str | Path, error: type[Exception], what: str = "trace") -> pd.DataFrame:
    """A CSV file as a DataFrame; a missing, empty, binary or malformed file raises `error` (one line)."""
    path = Path(path)
    if path.is_dir():
        raise error(f"{path}: is a directory, not a CSV file")
    if not path.exists():
        raise error(f"{path}: no such file")
    if not path.is_file():  # a FIFO would block the reader for ever
        raise error(f"{path}: not a regular file (a FIFO or a device?)")
    try:
        df = pd.read_csv(path)
    except pd.errors.EmptyDataError:
        raise error(f"{path}: empty file (a {what} needs a header line and rows)") from None
    except UnicodeDecodeError:
        raise error(f"{path}: not a text file (bytes that are not UTF-8)") from None
    except pd.errors.ParserError as e:
        raise error(f"{path}: not a valid CSV: {str(e).strip().splitlines()[-1]}") from None
    except OSError as e:
        raise error(f"{path}: cannot read: {e.strerror or e}") from None
    return df


class RowChecker:
    """Column checks that name the first bad row as `SOURCE line N: column: problem`. `lines` gives each
    row's line in the file (rows may have been filtered); by default row i is line i + first_line.
    `unit` names the position where a format has no lines (a JSON list: "request")."""

    def __init__(self, source: str, error: type[Exception], *, lines=None, first_line: int = 2, unit: str = "line"):
        self.source, self.error, self.lines, self.first_line, self.unit = source, error, lines, first_line, unit

    def number(self, i: int) -> int:
        return int(self.lines[i]) if self.lines is not None else int(i) + self.first_line

    def at(self, i: int) -> str:
        return f"{self.source} {self.unit} {self.number(i)}"

    def fail(self, i: int, message: str):
        raise self.error(f"{self.at(i)}: {message}")

    def numbers(self, values, col: str) -> np.ndarray:
        if isinstance(values, np.ndarray) and values.ndim > 1:  # a JSON list of lists: one cell per row
            values = [list(row) for row in values]
        raw = pd.Series(values)
        if raw.dtype == object:  # cells of JSON formats may be lists or objects where a number belongs
            containers = np.array([isinstance(v, (list, tuple, dict, set)) for v in raw], dtype=bool)
            if containers.any():
                i = int(np.argmax(containers))
                self.fail(i, f"{col}: {str(raw.iloc[i])[:40]!r} is not a number")
        x = cast(pd.Series, pd.to_numeric(raw, errors="coerce")).to_numpy(np.float64)  # a Series in, a Series out
        bad = np.isnan(x)
        if bad.any():
            i = int(np.argmax(bad))
            v = raw.iloc[i]
            self.fail(
                i,
                f"{col}: "
                + (
                    "empty or NaN"
                    if v is None or (isinstance(v, float) and math.isnan(v)) or str(v).strip() == ""
                    else f"{str(v)[:40]!r} is not a number"
                ),
            )
        return x

    def times(self, values, col: str) -> np.ndarray:
        """Seconds: finite and >= 0."""
        x = self.numbers(values, col)
        bad = ~np.isfinite(x) | (x < 0)
        if bad.any():
            i = int(np.argmax(bad))
            self.fail(i, f"{col}: {_num(x[i])} is not a finite time >= 0 s")
        return x

    def counts(self, values, col: str, least: int = 1) -> np.ndarray:
        """Whole numbers in [least, MAX_TOKENS], as int64."""
        x = self.numbers(values, col)
        bad = ~np.isfinite(x) | (x != np.floor(x)) | (x < least) | (x > MAX_TOKENS)
        if bad.any():
            i = int(np.argmax(bad))
            self.fail(i, f"{col}: {_num(x[i])} is not a whole number in [{least}, {MAX_TOKENS}]")
        return x.astype(np.int64)

    def ordered(self, earlier: np.ndarray, later: np.ndarray, col_earlier: str, col_later: str) -> None:
        bad = np.asarray(earlier > later)
        if bad.any():
            i = int(np.argmax(bad))
            self.fail(i, f"{col_later} ({_num(later[i])}) is before {col_earlier} ({_num(earlier[i])})")

    def unique(self, values, col: str) -> None:
        v = pd.Series(values).reset_index(drop=True)
        dup = v.duplicated().to_numpy()
        if dup.any():
            i = int(np.argmax(dup))
            j = int(np.argmax((v == v.iloc[i]).to_numpy()))
            self.fail(i, f"{col} {_num(v.iloc[i])} repeats {self.unit} {self.number(j)}")

    def sorted(self, values: np.ndarray, col: str) -> None:
        down = np.flatnonzero(values[1:] < values[:-1])
        if len(down):
            i = int(down[0]) + 1
            self.fail(
                i,
                f"{col} {_num(values[i])} is earlier than the row above ({_num(values[i - 1])}); "
                f"sort the rows by {col}",
            )


def check_trace_rows(
    df: pd.DataFrame,
    source: str,
    cols: TraceColumns,
    error: type[Exception],
    first_line: int = 2,
    lines=None,
    unit: str = "line",
) -> pd.DataFrame:
    """`df` with its time columns as float64 and count columns as int64, or `error` naming the first
    bad row as `source line N: ...` (see RowChecker for `first_line`, `lines`, `unit`)."""
    missing = [c for c in cols.required if c not in df.columns]
    if missing:
        raise error(f"{source}: missing column{'s' if len(missing) > 1 else ''} {', '.join(missing)}")
    if len(df) == 0:
        raise error(f"{source}: no rows")
    df = df.copy()
    check = RowChecker(source, error, lines=lines, first_line=first_line, unit=unit)
    for col in cols.times:
        if col in df.columns:
            df[col] = check.times(df[col], col)
    for col, least in cols.counts.items():
        if col in df.columns:
            df[col] = check.counts(df[col], col, least)
    for a, b in cols.before:
        if a in df.columns and b in df.columns:
            check.ordered(df[a].to_numpy(), df[b].to_numpy(), a, b)
    if cols.unique is not None and cols.unique in df.columns:
        check.unique(df[cols.unique], cols.unique)
    if cols.sorted_by is not None and cols.sorted_by in df.columns:
        check.sorted(df[cols.sorted_by].to_numpy(), cols.sorted_by)
    return df


def _num(v) -> str:
    """A cell as the user wrote it, near enough: 3, 2.5, -1, inf, 'abc'."""
    if isinstance(v, (int, float, np.integer, np.floating)) and not isinstance(v, bool):
        return f"{float(v):.10g}"
    return repr(str(v)[:40])


# The formats the simulator reads itself.
WORKLOAD_TRACE = TraceColumns(
    required=("prompt_tokens", "output_tokens"), counts={"prompt_tokens": 1, "output_tokens": 1}
)
WORKLOAD_TRACE_TIMED = TraceColumns(
    required=("arrival_s", "prompt_tokens", "output_tokens"),
    times=("arrival_s",),
    counts={"prompt_tokens": 1, "output_tokens": 1},
    sorted_by="arrival_s",
)
MEASURED_TIMES = (
    "arrival_s",
    "prefill_start_s",
    "prefill_end_s",
    "quantize_end_s",
    "transfer_start_s",
    "transfer_end_s",
    "decode_start_s",
    "first_token_s",
    "finish_s",
)
MEASURED_TRACE = TraceColumns(
    required=(
        "arrival_s",
        "prompt_tokens",
        "output_tokens",
        "prefill_start_s",
        "prefill_end_s",
        "transfer_start_s",
        "transfer_end_s",
        "decode_start_s",
        "finish_s",
    ),
    times=MEASURED_TIMES,
    counts={"prompt_tokens": 1, "output_tokens": 1},
    before=(
        ("arrival_s", "finish_s"),
        ("arrival_s", "prefill_start_s"),
        ("prefill_start_s", "prefill_end_s"),
        ("prefill_end_s", "quantize_end_s"),
        ("arrival_s", "transfer_start_s"),
        ("transfer_start_s", "transfer_end_s"),
        ("transfer_end_s", "decode_start_s"),
        ("decode_start_s", "finish_s"),
        ("prefill_end_s", "finish_s"),
    ),
    unique="request_id",
    sorted_by="arrival_s",
)
MEASURED_ITERATIONS = TraceColumns(
    required=("start_s", "end_s", "batch_size", "context_tokens"),
    times=("start_s", "end_s"),
    counts={"batch_size": 1, "context_tokens": 0},
    before=(("start_s", "end_s"),),
)
