"""reports.terminal: a table printed to a pipe or a file is plain text wide enough that no column is cut."""

from __future__ import annotations

import io

from reports.terminal import PLAIN_WIDTH, render, table


def test_a_table_wider_than_the_plain_width_keeps_every_cell_whole():
    heads = [f"a rather long column heading number {i}" for i in range(8)]
    cells = [f"h100-2026-12-05-{1200 + i}" for i in range(8)]
    text = render(table(heads, [cells], title="wide"), stream=io.StringIO())  # not a terminal
    assert "…" not in text
    assert all(h in text for h in heads) and all(c in text for c in cells)
    assert max(len(line) for line in text.splitlines()) > PLAIN_WIDTH
    narrow = render(table(["a", "b"], [["1", "2"]]), stream=io.StringIO())
    assert max(len(line) for line in narrow.splitlines()) < 20  # a narrow one stays as it is (lines stripped)
