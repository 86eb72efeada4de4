"""`librt.vecs`'s `vec` and `append` over `array.array`, for a Python without librt (simulator/columns.py).

librt (mypyc's runtime library, which mypy brings) gives the compiled modules `vec[float]` and `vec[i64]`, packed
columns that compiled code indexes natively. Without it the package runs as Python, and these stand in with the
same behaviour for what the simulator does with a column: index it, assign an item, append (in place here; librt's
`append` may return a new vec, so callers always keep what it returns), take its length, and read it as a buffer.
"""

from __future__ import annotations

from array import array

import numpy as np

i64 = int  # mypy_extensions.i64: an int as Python


class _Typed:
    """`vec[T]`: calling it makes a column of T (float: array "d", int: array "q")."""

    def __init__(self, code: str):
        self.code = code

    def __call__(self, items=(), *, capacity: int = 0) -> array:
        if isinstance(items, np.ndarray):  # its bytes, not its items one by one
            col = array(self.code)
            col.frombytes(items.astype(np.float64 if self.code == "d" else np.int64, copy=False).tobytes())
            return col
        return array(self.code, items)


class _Vec:
    def __getitem__(self, item_type: type) -> _Typed:
        return _Typed("d" if item_type is float else "q")


vec = _Vec()


def append(v: array, x) -> array:
    v.append(x)
    return v
