"""A progress display for process_pool.map_in_processes that records what it was told: per step `[count, label, unit,
advances]` in `shown` (the tests of validate, cross-validation, load_index and the map itself)."""

from __future__ import annotations


class ProgressSpy:
    def __init__(self) -> None:
        self.shown: list[list] = []

    def __call__(self, total: int, label: str, unit: str) -> _Step:
        return _Step(self.shown, total, label, unit)


class _Step:
    def __init__(self, shown: list[list], total: int, label: str, unit: str) -> None:
        self.row = [total, label, unit, 0]
        shown.append(self.row)

    def __enter__(self) -> _Step:
        return self

    def __exit__(self, *exc) -> bool:
        return False

    def advance(self) -> None:
        self.row[3] += 1
