"""`librt.vecs`'s `vec` over `array.array`: a request's columns as Python (simulator/columns.py).

librt (mypyc's runtime library, which mypy brings) gives the compiled modules `vec[float]` and `vec[i64]`, packed
columns that compiled code indexes natively. As Python the columns are arrays, made by this `vec` with the same
behaviour for what the simulator does with a column: index it, assign an item, take its length, and read it as a
buffer. Python reads an array's items faster than a vec's, and librt is then not needed.
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
