"""Reading the user's files safely and writing strict JSON: the edges where bad input is refused.

Every reader here turns a problem into one exception with a one-line message that names the file
(and the line, where there is one); the caller picks the exception class (`ScenarioError`,
`PlanningError`), and the CLI prints it and exits 2.

- Text files must be regular files, at most `MAX_TEXT_BYTES`, in UTF-8: a directory, a FIFO (which
  would block) or a binary file is refused before it is parsed.
- YAML is PyYAML's safe loader with aliases bounded: anchors and aliases are legal, but a document
  whose aliases would expand past `MAX_YAML_NODES` nodes (the "billion laughs" shape), or refer to
  themselves, is refused before anything expands it; so is nesting deeper than `MAX_YAML_DEPTH`, a
  key given twice in one mapping (PyYAML would keep the last silently; a merge `<<:` may still be
  overridden), and an integer longer than Python reads (`sys.get_int_max_str_digits()`, 4300).
- JSON is written strictly (RFC 8259): NaN becomes null and ±infinity the strings "Infinity" /
  "-Infinity" (pydantic's `ser_json_inf_nan="strings"` spelling, which the scenario schema reads back
  for the fields where infinity means something, such as an unlimited bandwidth).
- `check_out_dir` says before a run whether its output folder can be written, so a long run is
  never thrown away at the end; `remove_stale_temps` clears the temporary folders of runs that were
  killed before they could clean up.
"""

from __future__ import annotations

import copy
import functools
import glob
import json
import math
import os
import re
import shutil
import signal
import socket
import stat
import tempfile
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import yaml

from .process_pool import usable_cores

MAX_TEXT_BYTES = 4 * 2**20  # a scenario is ~2 KB; a sweep file a few KB
MAX_YAML_NODES = 100_000  # after alias expansion; the shipped files have a few hundred
MAX_YAML_DEPTH = 64  # nesting; the shipped files go 5 deep


def read_text(path: str | Path, error: type[Exception], what: str = "file", max_bytes: int = MAX_TEXT_BYTES) -> str:
    """The UTF-8 text of a regular file no larger than `max_bytes`; else `error` with one line."""
    path = Path(path)
    try:
        st = path.stat()
    except FileNotFoundError:
        raise error(f"{path}: no such file") from None
    except OSError as e:
        raise error(f"{path}: cannot read the {what}: {e.strerror or e}") from None
    if stat.S_ISDIR(st.st_mode):
        raise error(f"{path}: is a directory, not a {what}") from None
    if not stat.S_ISREG(st.st_mode):
        raise error(f"{path}: not a regular file") from None
    if st.st_size > max_bytes:
        raise error(f"{path}: {st.st_size} bytes, larger than the {max_bytes} a {what} may have") from None
    try:
        data = path.read_bytes()
    except OSError as e:
        raise error(f"{path}: cannot read the {what}: {e.strerror or e}") from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data[: e.start].count(b"\n") + 1
        raise error(f"{path}: line {line}: not a text file (bytes that are not UTF-8)") from None


class _BoundedLoader(yaml.SafeLoader):
    """SafeLoader that refuses documents whose aliases expand past MAX_YAML_NODES or loop."""

    _depth = 0

    def compose_node(self, parent, index):
        self._depth += 1
        try:
            if self._depth > MAX_YAML_DEPTH:
                raise _AliasBomb(f"nested more than {MAX_YAML_DEPTH} levels deep")
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1

    def get_single_node(self):
        node = super().get_single_node()
        if node is not None:
            _check_expansion(node)
        return node

    def construct_mapping(self, node, deep=False):
        if isinstance(node, yaml.MappingNode):
            seen: dict[Any, int] = {}
            for key, _ in node.value:
                if not isinstance(key, yaml.ScalarNode) or key.tag == "tag:yaml.org,2002:merge":
                    continue
                line = key.start_mark.line + 1
                if key.value in seen:
                    raise yaml.constructor.ConstructorError(
                        None,
                        None,
                        f"key {key.value!r} given twice (lines {seen[key.value]} and {line})",
                        key.start_mark,
                    )
                seen[key.value] = line
        return super().construct_mapping(node, deep=deep)

    def construct_yaml_int(self, node):
        try:
            return super().construct_yaml_int(node)
        except ValueError:  # longer than sys.get_int_max_str_digits(): Python refuses to read it
            raise yaml.constructor.ConstructorError(
                None, None, f"an integer of {len(str(node.value))} digits is more than can be read", node.start_mark
            ) from None


class _AliasBomb(yaml.YAMLError):
    pass


# YAML 1.1 (PyYAML's SafeLoader) reads `1e-5` as a string: a float needs a dot there. Read exponent-only
# numbers as floats, as YAML 1.2 and JSON do, so a scenario may write `s_per_unit: 3.7e-12` or `1e-5`.
_BoundedLoader.add_constructor("tag:yaml.org,2002:int", _BoundedLoader.construct_yaml_int)
_BoundedLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float", re.compile(r"^[-+]?[0-9][0-9_]*[eE][-+]?[0-9]+$"), list("-+0123456789")
)


def _check_expansion(root) -> None:
    """Count the nodes of the document as the constructor would expand them (aliases copied), without
    expanding: one pass over the node graph, memoised per node, iterative (no recursion limit)."""
    size: dict[int, int] = {}
    active: set[int] = set()
    stack: list[tuple[Any, bool]] = [(root, False)]
    while stack:
        node, done = stack.pop()
        nid = id(node)
        if done:
            active.discard(nid)
            total = 1 + sum(size[id(c)] for c in _children(node))
            if total > MAX_YAML_NODES:
                raise _AliasBomb(f"aliases expand to more than {MAX_YAML_NODES} values")
            size[nid] = total
            continue
        if nid in size:
            continue
        if nid in active:
            raise _AliasBomb("an alias refers to a node that contains it")
        active.add(nid)
        stack.append((node, True))
        for c in _children(node):
            if id(c) in active:
                raise _AliasBomb("an alias refers to a node that contains it")
            if id(c) not in size:
                stack.append((c, False))


def _children(node) -> list:
    if isinstance(node, yaml.SequenceNode):
        return list(node.value)
    if isinstance(node, yaml.MappingNode):
        return [x for pair in node.value for x in pair]
    return []


def shown(text: str, limit: int = 80) -> str:
    """`text` quoted for a one-line message; a long one cut to its start and its length (a 5,000-digit value
    would otherwise fill the terminal)."""
    return repr(text) if len(text) <= limit else f"{text[: limit // 2]!r}... ({len(text):,} characters)"


def parse_override(item: str, error: type[Exception]) -> tuple[str, Any]:
    """`--set path.to.field=value` -> (path, the value read as YAML). An empty value is refused rather than
    read as null (which would quietly leave the field at its default); `null` says it outright."""
    if "=" not in item:
        raise error(f"--set {shown(item)}: expected path.to.field=value")
    path, value = item.split("=", 1)
    if not value.strip():
        raise error(f"--set {shown(item)}: no value after '=' (write null to clear an optional field)")
    return path.strip(), parse_yaml(value, f"--set {shown(item)}", error)


def parse_yaml(text: str, source: str, error: type[Exception]) -> Any:
    """YAML text -> Python data, aliases bounded; a problem raises `error` naming `source` and the line. A text
    read before from the same source is not parsed again (_parsed_yaml): a copy of what it gave."""
    if len(text) > _PARSED_MAX_CHARS:
        return _parse_yaml(text, source, error)
    return copy.deepcopy(_parsed_yaml(text, source, error))


# validate over an index reads each run's scenario, and the scenarios are few: PyYAML's pure-Python parser took 50 ms
# a scenario (the measured ones are mostly comments), a tenth of the time of validating a run, where a copy of the
# parsed content takes a fraction of a millisecond. Larger texts are parsed each time: the kept ones stay under 16 M
# characters. A text that fails is not kept (lru_cache keeps results, not exceptions).
_PARSED_MAX_CHARS = 2**18


@functools.lru_cache(maxsize=64)
def _parsed_yaml(text: str, source: str, error: type[Exception]) -> Any:
    return _parse_yaml(text, source, error)


def _parse_yaml(text: str, source: str, error: type[Exception]) -> Any:
    try:
        return yaml.load(text, Loader=_BoundedLoader)  # noqa: S506 - a SafeLoader subclass
    except _AliasBomb as e:
        raise error(f"{source}: {e}") from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" line {mark.line + 1}" if mark else ""
        problem = getattr(e, "problem", None)
        raise error(f"{source}:{where} not valid YAML" + (f" ({problem})" if problem else "")) from None
    except RecursionError:
        raise error(f"{source}: nested too deeply to read") from None


def read_yaml(path: str | Path, error: type[Exception], what: str = "YAML file") -> Any:
    """A YAML file's content; a missing, binary, huge or malformed file raises `error` with one line."""
    return parse_yaml(read_text(path, error, what), str(path), error)


# ---- strict JSON -----------------------------------------------------------------------------------
def jsonable(o: Any) -> Any:
    """NaN -> None, ±inf -> "Infinity"/"-Infinity", numpy scalars -> Python; containers recursively."""
    if isinstance(o, float) or type(o).__module__ == "numpy" and hasattr(o, "dtype") and o.dtype.kind == "f":
        o = float(o)
        if math.isnan(o):
            return None
        if math.isinf(o):
            return "Infinity" if o > 0 else "-Infinity"
        return o
    if isinstance(o, dict):
        return {k: jsonable(v) for k, v in o.items()}
    if isinstance(o, (list, tuple)):
        return [jsonable(v) for v in o]
    if type(o).__module__ == "numpy" and hasattr(o, "item"):
        return o.item()
    return o


def strict_json(o: Any, indent: int | None = 2, **kw) -> str:
    """`json.dumps` that never writes NaN/Infinity tokens (see `jsonable`)."""
    return json.dumps(jsonable(o), indent=indent, allow_nan=False, **kw)


def unjson_inf(o: Any) -> Any:
    """The inverse of `jsonable` for infinities: "Infinity"/"-Infinity" strings back to floats."""
    if o == "Infinity":
        return math.inf
    if o == "-Infinity":
        return -math.inf
    if isinstance(o, dict):
        return {k: unjson_inf(v) for k, v in o.items()}
    if isinstance(o, list):
        return [unjson_inf(v) for v in o]
    return o


# ---- CSV ----------------------------------------------------------------------------------------
CSV_CHUNK_ROWS = 200_000
CSV_SLICE_ROWS = 25_000  # rows formatted by one task: a few MB of text, enough tasks to keep every worker busy
# Formatting numbers is nearly all of a CSV file's cost (about 0.1 us a float: 2.6 s of CPU for a million requests'
# requests.csv), and pyarrow does it without the GIL: slices of rows are formatted side by side on this many threads
# (the cores this process may use, at most 4), and their text written in order, so the bytes are the same whatever
# the number of threads.
CSV_THREADS = min(4, usable_cores())
_pool: ThreadPoolExecutor | None = None


def _csv_pool() -> ThreadPoolExecutor:
    global _pool
    if _pool is None:
        _pool = ThreadPoolExecutor(CSV_THREADS, thread_name_prefix="hacksim-csv")
    return _pool


def _forget_pool() -> None:
    """In a forked child: the parent's threads are not there, so the child makes its own pool when it needs one."""
    global _pool
    _pool = None


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_pool)


def _csv_text(table, options):
    """The rows of a pyarrow Table as CSV text (a pyarrow Buffer), without the header."""
    import pyarrow as pa
    import pyarrow.csv as pacsv

    sink = pa.BufferOutputStream()
    pacsv.write_csv(table, sink, write_options=options)
    return sink.getvalue()


class CsvAppender:
    """A CSV file written by pyarrow's CSV formatter, a chunk of rows at a time, from DataFrames with the same
    columns (no text copy of a whole table in memory). Numbers are written in the shortest form that reads back
    to the same float (`0`, `0.00001`, `4.02951405568e+11`), NaN as an empty field. Text is written bare, or,
    with `quote_text`, every text field quoted (for tables whose text may hold a comma, a quote or a line
    break). Slices of `CSV_SLICE_ROWS` rows are formatted on `CSV_THREADS` threads while the caller
    builds the next chunk, and written in order; at most `2 x CSV_THREADS` slices wait at a time."""

    def __init__(self, path: str | Path, quote_text: bool = False, chunk_rows: int = CSV_CHUNK_ROWS):
        self.path, self.quote_text, self.chunk_rows = Path(path), quote_text, chunk_rows
        self._file = self._schema = self._options = None
        self._pending: deque[Future] = deque()

    def write(self, df) -> None:
        import pyarrow as pa
        import pyarrow.csv as pacsv

        if self._file is None:
            self._schema = pa.Schema.from_pandas(df.iloc[:0], preserve_index=False)
            self._file = open(self.path, "wb")
            self._file.write((",".join(_csv_field(str(c)) for c in df.columns) + "\n").encode())
            self._options = pacsv.WriteOptions(
                include_header=False, quoting_style="needed" if self.quote_text else "none"
            )
        for i in range(0, len(df), self.chunk_rows):
            table = pa.Table.from_pandas(df.iloc[i : i + self.chunk_rows], schema=self._schema, preserve_index=False)
            for j in range(0, table.num_rows, CSV_SLICE_ROWS):
                self._pending.append(_csv_pool().submit(_csv_text, table.slice(j, CSV_SLICE_ROWS), self._options))
            self._drain(2 * CSV_THREADS)

    def _drain(self, keep: int) -> None:
        """Write the formatted slices, oldest first, until at most `keep` are waiting."""
        assert self._file is not None
        while len(self._pending) > keep:
            self._file.write(self._pending.popleft().result())

    def close(self) -> None:
        """Write what is still being formatted and close the file."""
        if self._file is not None:
            try:
                self._drain(0)
            finally:
                self.abandon()

    def abandon(self) -> None:
        """Close the file without waiting for the slices still being formatted (a run that failed)."""
        for f in self._pending:
            f.cancel()
        self._pending.clear()
        if self._file is not None:
            self._file.close()
            self._file = None


def needs_quotes(df) -> bool:
    """Whether some text value of `df` holds a comma, a quote or a line break."""
    text = [c for c in df.columns if df[c].dtype == object or str(df[c].dtype).startswith("str")]
    return any(df[c].astype(str).drop_duplicates().str.contains(r'[,"\r\n]').any() for c in text)


def write_csv(df, path: str | Path, chunk_rows: int = CSV_CHUNK_ROWS) -> None:
    """`df` as one CSV file (CsvAppender), text quoted only when some value needs it."""
    out = CsvAppender(path, needs_quotes(df), chunk_rows)
    try:
        out.write(df)
    finally:
        out.close()


def _csv_field(v: str) -> str:
    return '"' + v.replace('"', '""') + '"' if any(ch in v for ch in ',"\r\n') else v


# ---- output folders --------------------------------------------------------------------------------
def write_atomically(path: Path, write: Callable[[Path], object]) -> Path:
    """`write(tmp)` into a temporary file beside `path`, then rename it to `path`; a failed write (a full
    disk, an interrupt) removes the temporary file and leaves `path` as it was."""
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    try:
        write(tmp)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return path


def check_out_dir(path: str | Path, error: type[Exception], option: str = "--out") -> None:
    """Refuse now, before any work, an output folder that cannot be created or written (an empty
    name too: it would be the current folder)."""
    if str(path) == "":
        raise error(f"{option} '': an empty folder name (give a folder, or . for the current one)")
    try:
        _check_out_dir(Path(path), error, option)
    except OSError as e:  # a name longer than the file system allows, a loop of links, ...
        raise error(f"{option} {path}: {e.strerror or e}") from None


def _check_out_dir(path: Path, error: type[Exception], option: str) -> None:
    given = path
    probe = path
    while not probe.exists():
        if probe.is_symlink():
            raise error(f"{option} {given}: {probe} is a broken symbolic link")
        parent = probe.parent
        if parent == probe:
            break
        probe = parent
    if not probe.is_dir():
        what = "is a file, not a folder" if probe == given else f"{probe} is a file, not a folder"
        raise error(f"{option} {given}: {what}")
    try:
        if not os.access(probe, os.W_OK | os.X_OK):
            raise PermissionError
        os.rmdir(tempfile.mkdtemp(prefix=".hacksim-probe-", dir=probe))  # root passes os.access everywhere
    except OSError:
        raise error(f"{option} {given}: {probe} is not writable") from None


def temp_prefix() -> str:
    """`.hacksim-HOST-PID-`: the name of a temporary output folder, as `remove_stale_temps` reads it back."""
    return f".hacksim-{socket.gethostname()}-{os.getpid()}-"


class held_signals:
    """Hold SIGINT, SIGTERM and SIGHUP (delivered when the block ends) while files move into place, so an
    interrupt never leaves half of a run's files beside the previous run's other half."""

    SIGNALS = {signal.SIGINT, signal.SIGTERM, signal.SIGHUP}

    def __enter__(self) -> None:
        self._old = signal.pthread_sigmask(signal.SIG_BLOCK, self.SIGNALS)

    def __exit__(self, *exc) -> None:
        signal.pthread_sigmask(signal.SIG_SETMASK, self._old)


def move_into(tmp: Path, out: Path) -> list[str]:
    """Move every file of the folder `tmp` into `out` (replacing files of the same names) with signals
    held; returns the names moved."""
    names = sorted(f.name for f in tmp.iterdir())
    with held_signals():
        for name in names:
            os.replace(tmp / name, out / name)
    return names


def remove_stale_temps(folder: Path) -> list[Path]:
    """Remove `.hacksim-HOST-PID-*` folders in `folder` left by a run on this machine whose process is
    gone (killed with SIGKILL, or the machine stopped); returns them. A folder of a live process, or of
    another machine (a shared file system), stays."""
    host = socket.gethostname()
    gone = []
    for p in Path(folder).glob(f".hacksim-{glob.escape(host)}-*-*"):
        pid = p.name[len(f".hacksim-{host}-") :].split("-", 1)[0]
        if p.is_dir() and pid.isdigit() and not _alive(int(pid)):
            shutil.rmtree(p, ignore_errors=True)
            gone.append(p)
    return gone


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process
        return True
    return True
