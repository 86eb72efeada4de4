"""The terminal side of the reports, through rich: one progress bar and one table style.

The progress bar goes to stderr and only when stderr is a terminal, so stdout stays the result (a
table, or JSON with --json) and a pipe or a log file gets no bar. Tables print plain text when stdout
is not a terminal, wide enough that no column is cut.
"""

from __future__ import annotations

import contextvars
import io
import json
import math
import re
import sys
from collections.abc import Iterable, Sequence

from rich import box
from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TaskProgressColumn,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.table import Table
from rich.text import Text

PLAIN_WIDTH = 200  # columns for a table printed to a pipe or a file
JSON_HELP = "print the result as JSON on stdout (other messages go to stderr)"
QUIET_HELP = "print nothing but errors (and the JSON with --json)"
PLOTLYJS_HELP = (
    "load plotly.js in the HTML report from this path (written relative to the page) or URL instead of "
    "embedding its 4.8 MB; the default embeds it so the page works offline"
)


def plotlyjs_refusal(plotlyjs: str | None) -> str | None:
    """Why `--plotlyjs VALUE` cannot be used (None: it can). An empty or blank value was written as
    `src=".."` (the page's folder), a page whose figures never draw."""
    if plotlyjs is not None and not plotlyjs.strip():
        return f"--plotlyjs {plotlyjs!r}: give a path or URL of plotly.js, or leave the option out to embed it"
    return None


def to_json(obj) -> str:
    """Strict JSON as the output files write it (simulator/files.py): NaN becomes null, ±infinity the
    strings "Infinity" / "-Infinity", numpy scalars plain numbers."""

    def clean(o):
        if isinstance(o, float):
            if math.isinf(o):
                return "Infinity" if o > 0 else "-Infinity"
            return o if math.isfinite(o) else None
        if isinstance(o, dict):
            return {str(k): clean(v) for k, v in o.items()}
        if isinstance(o, (list, tuple)):
            return [clean(v) for v in o]
        if hasattr(o, "item") and callable(o.item):  # numpy scalar
            return clean(o.item())
        return o

    return json.dumps(clean(obj), indent=2, allow_nan=False)


_JSON_ERRORS = contextvars.ContextVar("json_errors", default=False)


def errors_as_json(on: bool) -> None:
    """Whether `print_error` also prints a JSON error object on stdout: a command with --json says so first
    thing; the CLI's callback turns it off before every command."""
    _JSON_ERRORS.set(on)


def json_errors_on() -> bool:
    return _JSON_ERRORS.get()


def print_error(message: str, prefix: str = "error: ") -> None:
    """A failed command's one `error:` line on stderr; with --json (`errors_as_json(True)`) also
    `{"error": message}` on stdout, so a pipeline reading stdout sees why."""
    print(f"{prefix}{message}", file=sys.stderr, flush=True)
    if _JSON_ERRORS.get():
        print(to_json({"error": message}), flush=True)


class Say:
    """Where a command's words go: stdout; stderr when stdout carries JSON (--json); nowhere with --quiet."""

    def __init__(self, as_json: bool, quiet: bool):
        self.as_json, self.quiet = as_json, quiet

    def __call__(self, text: str) -> None:
        if not self.quiet:
            print(text, file=sys.stderr if self.as_json else sys.stdout, flush=True)

    def result(self, text: str, obj) -> None:
        """The command's result: `text` for people, or `obj` as JSON on stdout with --json."""
        if self.as_json:
            print(to_json(obj), flush=True)
        else:
            self(text)


class ProgressBar:
    """`label ━━━━━━━━╸━━━ 340/1000 points 34% 0:00:12 elapsed 0:00:23 left (3 cached)`.

    A context manager; `advance()` once per finished item. Does nothing unless `stream` (stderr by
    default) is a terminal and there is something to count."""

    def __init__(self, total: int, label: str, unit: str = "", stream=None):
        self.console = Console(file=stream if stream is not None else sys.stderr)
        self.enabled = total > 0 and self.console.is_terminal
        self.total, self.label, self.unit = total, label, unit
        self.cached = self.errors = 0
        self._progress: Progress | None = None
        self._task = None

    def __enter__(self) -> ProgressBar:
        if self.enabled:
            self._progress = Progress(
                TextColumn("{task.description}"),
                BarColumn(),
                MofNCompleteColumn(),
                TextColumn(self.unit),
                TaskProgressColumn(),
                TimeElapsedColumn(),
                TextColumn("elapsed"),
                TimeRemainingColumn(),
                TextColumn("left {task.fields[note]}"),
                console=self.console,
            )
            self._progress.start()
            self._task = self._progress.add_task(self.label, total=self.total, note="")
        return self

    def advance(self, *, cached: bool = False, error: bool = False) -> None:
        self.cached += cached
        self.errors += error
        if self._progress is not None and self._task is not None:
            extra = ", ".join(
                p
                for p in (
                    f"{self.cached} cached" if self.cached else "",
                    f"{self.errors} with errors" if self.errors else "",
                )
                if p
            )
            self._progress.update(self._task, advance=1, note=f"({extra})" if extra else "")

    def __exit__(self, *exc) -> bool:
        if self._progress is not None:
            self._progress.stop()
            self._progress = None
        return False


def table(
    columns: Sequence[str],
    rows: Iterable[Sequence[str]],
    *,
    title: str | None = None,
    footer_rows: Iterable[Sequence[str]] = (),
    left: int = 1,
    right: Sequence[str] | None = None,
) -> Table:
    """A rich Table in the house style: the first `left` columns left-aligned, the rest right-aligned
    (numbers), or, given `right`, just those columns right-aligned; an optional title above and summary
    rows under a gap."""
    t = Table(
        title=None if title is None else Text(one_line(title), no_wrap=True, overflow="ignore"),
        title_justify="left",
        box=box.SIMPLE_HEAD,
        show_edge=False,
        pad_edge=False,
    )
    for i, c in enumerate(columns):
        flush_right = c in right if right is not None else i >= left
        t.add_column(Text(c), justify="right" if flush_right else "left", no_wrap=True)
    rows, footer_rows = list(rows), list(footer_rows)
    for i, r in enumerate(rows):
        t.add_row(*_cells(r), end_section=bool(footer_rows) and i == len(rows) - 1)
    for r in footer_rows:
        t.add_row(*_cells(r))
    return t


def _cells(row: Sequence) -> list:
    """Text as it is: a name from the user's file is neither rich markup (`[bold]`, `[/x]`) nor broken
    over lines by a line break in it."""
    return [Text(one_line(c)) if isinstance(c, str) else c for c in row]


_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


def one_line(text: str) -> str:
    """`text` with line breaks and other control characters written as escapes (`\\n`), so a name read
    from a file prints on one line."""
    return _CONTROL.sub(lambda m: m.group().encode("unicode_escape").decode(), text)


def _natural_width(renderable) -> int:
    """The columns `renderable` takes when nothing is cut (a table's widest cells and its padding)."""
    wide = Console(file=io.StringIO(), width=100_000)
    return wide.measure(renderable).maximum


def render(*renderables, stream=None) -> str:
    """Text of rich renderables as a terminal of `stream`'s width would show it, or without colour and PLAIN_WIDTH
    wide, or wider where a table needs it so that no column is cut, when `stream` (stdout by default) is not a
    terminal."""
    target = Console(file=stream if stream is not None else sys.stdout)
    width = target.width if target.is_terminal else max([PLAIN_WIDTH, *(_natural_width(r) for r in renderables)])
    buf = io.StringIO()
    console = Console(
        file=buf,
        width=width,
        force_terminal=target.is_terminal,
        color_system=target.color_system,  # pyright: ignore[reportArgumentType]  (rich types it str, not its Literal)
        highlight=False,
    )
    for r in renderables:
        console.print(r)
    return "\n".join(line.rstrip() for line in buf.getvalue().rstrip("\n").splitlines())
