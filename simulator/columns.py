"""Compact storage for what a run records: one machine number per value, no Python object per entry.

A run of a million requests keeps about twenty values per request and two log rows per request per
log. As Python lists of floats and tuples that is ~2 KB per request (a pointer plus a 24-byte float
object per value, a tuple per row); as typed arrays it is 8 bytes a value. Entities index and assign
these like lists (`run.finish[rid] = now`), and append log rows as tuples (`log.append((t, r, x))`);
`numpy` reads them without copying at the end.
"""
from __future__ import annotations

import math
from array import array

import numpy as np


def floats(values) -> array:
    """A float64 column holding `values` (a numpy array or any iterable)."""
    if isinstance(values, np.ndarray):
        return array("d", values.astype(np.float64, copy=False).tobytes())
    return array("d", values)


def ints(values) -> array:
    """An int64 column holding `values`."""
    if isinstance(values, np.ndarray):
        return array("q", values.astype(np.int64, copy=False).tobytes())
    return array("q", values)


def nans(n: int) -> array:
    return array("d", [math.nan]) * n


def filled(n: int, value: int) -> array:
    return array("q", [value]) * n


def view(col: array, dtype=np.float64) -> np.ndarray:
    """The column as a numpy array sharing its memory (read-only use: the array must not grow meanwhile)."""
    return np.frombuffer(col, dtype=dtype) if len(col) else np.zeros(0, dtype=dtype)


class RowLog:
    """Rows of `width` numbers appended one tuple at a time, kept flat in a float64 array."""

    __slots__ = ("width", "data")

    def __init__(self, width: int):
        self.width = width
        self.data = array("d")

    def append(self, row) -> None:
        self.data.extend(row)

    def __len__(self) -> int:
        return len(self.data) // self.width

    def table(self) -> np.ndarray:
        """(rows, width) float64, sharing the log's memory."""
        return view(self.data).reshape(-1, self.width)

    def column(self, i: int) -> np.ndarray:
        return self.table()[:, i]

    def __iter__(self):
        return iter(map(tuple, self.table().tolist()))
