"""Compact storage for what a run records: one machine number per value, no Python object per entry.

A run of a million requests keeps about twenty values per request and two log rows per request per
log. As Python lists of floats and tuples that is ~2 KB per request (a pointer plus a 24-byte float
object per value, a tuple per row); as typed columns it is 8 bytes a value. Entities index and assign
these like lists (`run.finish[rid] = now`), and append log rows (`log.add(t, r, x)`); `numpy` reads them
without copying at the end.

Compiled (mypyc), a request's column is a `librt.vecs.vec[float]` (or `vec[i64]`): mypyc's packed array, which
the compiled modules index natively (a C load or store), where an `array.array` item was a Python call that boxed
the index and the value (and parsed the float through `PyArg_Parse`): a fifth of a default run's instructions in
the event loop (callgrind). librt is mypyc's runtime library and comes with mypy. As Python the columns are
`array.array`s (`vec_fallback`, the same API), whose items Python reads faster than a vec's (41 against 79 ns),
and librt is not needed. The logs grow, so they stay `array`s, which grow by an eighth (a vec doubles).
"""

from __future__ import annotations

import math
import struct
from array import array
from types import FunctionType
from typing import Final

import numpy as np
import numpy.typing as npt


def _probe() -> None:
    pass


# compiled by mypyc, a module's function is a builtin, not a Python function (simulator/timers.py)
_NATIVE: Final = not isinstance(_probe, FunctionType)
if _NATIVE:
    from librt.vecs import append as vec_append  # pyright: ignore[reportMissingImports]
    from librt.vecs import vec  # pyright: ignore[reportMissingImports]
    from mypy_extensions import i64
else:  # as Python: the same API over array.array (bound through globals(), so that the type checkers and mypyc
    # see librt's types alone)
    from . import vec_fallback

    globals().update(vec=vec_fallback.vec, i64=vec_fallback.i64)  # vec_append: compiled only

# A decode replica's cumulative seconds (DecodeReplica.cum): running decode, dequantize, approximation, fetch,
# preemption; the step scheduler (scheduler.py) adds to the last.
PREEMPTION: Final = 4

_FLUSH_ROWS: Final = 1024  # RowLog: rows kept in a chunk before they are copied into the array


def floats(values) -> vec[float]:
    """A float64 column holding `values` (a numpy array or any iterable)."""
    if isinstance(values, np.ndarray):
        return vec[float](values.astype(np.float64, copy=False))
    return vec[float](values)


def ints(values) -> vec[i64]:
    """An int64 column holding `values`."""
    if isinstance(values, np.ndarray):
        return vec[i64](values.astype(np.int64, copy=False))
    return vec[i64](values)


def nans(n: int) -> vec[float]:
    return vec[float](np.full(n, math.nan))


def filled(n: int, value: int) -> vec[i64]:
    return vec[i64](np.full(n, value, dtype=np.int64))


def view(col, dtype: npt.DTypeLike = np.float64) -> np.ndarray:
    """The column (or a log's array) as a numpy array sharing its memory (read-only use: a log must not grow
    meanwhile)."""
    return np.frombuffer(col, dtype=dtype) if len(col) else np.zeros(0, dtype=dtype)


class RowLog:
    """Rows of `width` numbers appended one at a time, kept flat in a float64 array.

    Compiled, a row's numbers go into a `vec[float]` of `_FLUSH_ROWS` rows made with room for them (a C store
    each), and that chunk into the array by one copy of its buffer when it is full; as Python, into a list of
    Python floats packed by one `struct` call (the array's own `extend` converts each number through
    `PyArg_Parse`). Either way the array holds exactly the C doubles `extend` would have put in it. The array,
    unlike a vec, grows by an eighth, not twice: the memory log of a million requests is 72 MB."""

    __slots__ = ("width", "_data", "_chunk", "_rows", "_pack")

    def __init__(self, width: int):
        self.width = width
        self._data = array("d")
        # the rows not yet in _data: compiled, in a chunk; as Python, in a list
        self._chunk: vec[float] = vec[float](capacity=_FLUSH_ROWS * width if _NATIVE else 0)
        self._rows: list = []
        self._pack = struct.Struct(f"{_FLUSH_ROWS * width}d").pack

    def append(self, row: tuple) -> None:
        """A row (a tuple of `width` numbers)."""
        if _NATIVE:
            chunk = self._chunk
            for x in row:
                chunk = vec_append(chunk, float(x))
            self._chunk = chunk
            if len(chunk) >= _FLUSH_ROWS * self.width:
                self._flush()
            return
        rows = self._rows
        rows.extend(row)
        if len(rows) >= _FLUSH_ROWS * self.width:
            self._flush()

    def add(self, a: float, b: float, c: float) -> None:
        """A row of three numbers (the memory and link logs'), without a tuple."""
        if _NATIVE:
            chunk = vec_append(vec_append(vec_append(self._chunk, a), b), c)
            self._chunk = chunk
            if len(chunk) >= _FLUSH_ROWS * self.width:
                self._flush()
            return
        rows = self._rows
        rows.append(a)
        rows.append(b)
        rows.append(c)
        if len(rows) >= _FLUSH_ROWS * self.width:
            self._flush()

    def _flush(self) -> None:
        """The rows held into the array: compiled, a full or partial chunk (a copy of its buffer); as Python, a full
        list packed by one `struct` call, or a partial one extended."""
        if _NATIVE:
            self._data.frombytes(memoryview(self._chunk).cast("B"))  # pyright: ignore[reportArgumentType]  (a buffer)
            self._chunk = vec[float](capacity=_FLUSH_ROWS * self.width)
            return
        rows = self._rows
        if len(rows) == _FLUSH_ROWS * self.width:
            self._data.frombytes(self._pack(*rows))
        else:
            self._data.extend(rows)
        rows.clear()

    @property
    def data(self) -> array:
        """Every row so far, flat (the rows still held are moved into the array first)."""
        if len(self._chunk) or self._rows:
            self._flush()
        return self._data

    def __len__(self) -> int:
        return (len(self._data) + len(self._chunk) + len(self._rows)) // self.width

    def table(self) -> np.ndarray:
        """(rows, width) float64, sharing the log's memory."""
        return view(self.data).reshape(-1, self.width)

    def column(self, i: int) -> np.ndarray:
        return self.table()[:, i]

    def __iter__(self):
        return iter(map(tuple, self.table().tolist()))


class Records:
    """One method's run as its entities see it: every request's facts, set before the run, and what
    happens to it, written by the entity that does it (the prefill replica its prefill times, the router
    its transfer times, the decode replica its join and finish). Entities get this object, and their
    partners, when they are built; none reads another entity's fields. Columns are indexed by request id.

    Facts per request: `prompt`, `output` (tokens), `arrival` (s), `wire_bytes` (KV on the wire),
    `kv_bytes` (its final KV in decode memory), `admit_bytes` (reserved at admission: the final KV, or
    under on-demand admission its first iteration's blocks), `host_kv_bytes` (offloaded to decode host
    memory), `decode_iterations` and `join_context` (simulator/decode.py).
    Written during the run: the times in seconds (`prefill_start` .. `finish`), the breakdown sums
    (`approx_prefill`, `decode_s`, `dequant_s`, `approx_decode`, `fetch_s`, `preempt_s`) with the decode
    replica's running sums at join (`snap_*`), the replicas and prefill form a request took, `kv_held`
    (its KV counts in its prefill replica's host memory), `preemptions`, `recomputed`, `retries`, `failure` (why it
    failed, "" if it did not), the `completed` and `failed` counts, and the memory and link logs.
    """

    def __init__(
        self,
        *,
        prompt: np.ndarray,
        output: np.ndarray,
        arrival_s: np.ndarray,
        wire_bytes: np.ndarray,
        kv_bytes: np.ndarray,
        admit_bytes: np.ndarray | None,
        host_kv_bytes: np.ndarray,
        decode_iterations: np.ndarray,
        join_context: np.ndarray,
        ttft_at_decode: bool,
    ):
        n = len(prompt)
        self.n = n
        self.ttft_at_decode = ttft_at_decode  # the first token is the end of the first decode iteration
        self.prompt = ints(prompt)
        self.output = ints(output)
        self.arrival = floats(arrival_s)
        self.wire_bytes = floats(wire_bytes)
        self.kv_bytes = floats(kv_bytes)
        self.admit_bytes = self.kv_bytes if admit_bytes is None else floats(admit_bytes)
        self.host_kv_bytes = floats(host_kv_bytes)
        self.decode_iterations = ints(decode_iterations)
        self.join_context = ints(join_context)
        self.prefill_start, self.prefill_end, self.encode_end = nans(n), nans(n), nans(n)
        self.transfer_start, self.transfer_end, self.decode_join = nans(n), nans(n), nans(n)
        self.first_token, self.finish = nans(n), nans(n)
        self.approx_prefill, self.decode_s, self.dequant_s = nans(n), nans(n), nans(n)
        self.approx_decode, self.fetch_s = nans(n), nans(n)
        self.snap_decode, self.snap_dequant, self.snap_approx = nans(n), nans(n), nans(n)
        self.snap_fetch, self.snap_preempt = nans(n), nans(n)
        self.preemptions = filled(n, 0)
        self.recomputed = filled(n, 0)  # tokens computed again after preemptions (cache hits excluded)
        self.preempt_s = floats(np.zeros(n))
        self.prefill_replica = filled(n, -1)
        self.prefill_form = [""] * n  # the prefill attention form each request ran (fp16 / homomorphic)
        self.decode_replica = filled(n, -1)
        self.kv_held = bytearray(n)
        self.retries = filled(n, 0)
        self.failure = [""] * n
        self.completed = 0
        self.failed = 0
        self.memory_log = RowLog(3)  # (time_s, replica, used_bytes)
        self.link_logs: dict[str, RowLog] = {}  # link name -> (time_s, active_flows, throughput_bytes_per_s)
        self.iteration_log: list | None = None  # a list: decode replicas log their segments (decode.iteration_rows)

    def fail(self, rid: int, reason: str) -> None:
        """The request ends without finishing (simulator/faults.py says why)."""
        self.failure[rid] = reason
        self.finish[rid] = math.nan
        self.failed += 1

    def finish_without_decode(self, rid: int) -> None:
        """The prefill's token was the whole output: no KV moves, no decode."""
        t = self.encode_end[rid]
        self.transfer_start[rid] = self.transfer_end[rid] = self.decode_join[rid] = self.finish[rid] = t
        self.decode_s[rid] = self.dequant_s[rid] = self.approx_decode[rid] = self.fetch_s[rid] = 0.0
        self.completed += 1
