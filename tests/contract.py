"""The bad-input contract, as a test helper: run the CLI in this process under a time and memory
bound, and check that a refusal is one `error:` line naming the file, exit 2, no traceback, nothing
written.  A run that is accepted must write strict JSON (no NaN / Infinity tokens).

The time bound is CPU time of this process (ITIMER_PROF), not wall time: what a case costs does not change
when other processes share the machine, so a loaded 2-core CI machine neither fails a case that is merely
descheduled nor needs a looser bound.  A case that blocks without computing (a FIFO read, a lock) uses no
CPU: a wall-clock backstop of HANG_WALL_FACTOR times the bound fails it."""

from __future__ import annotations

import contextlib
import json
import resource
import signal
from pathlib import Path

from typer.testing import CliRunner

import cli

CASE_SECONDS = 20  # CPU seconds; every refusal here takes well under one, the accepted fuzz runs a few
CASE_EXTRA_BYTES = 3 * 2**30
HANG_WALL_FACTOR = 10


class CaseTimeout(Exception):
    pass


@contextlib.contextmanager
def limits(seconds: float = CASE_SECONDS, extra_bytes: int = CASE_EXTRA_BYTES):
    """Raise CaseTimeout after `seconds` of CPU time (or HANG_WALL_FACTOR times that in wall time); cap the
    address space at what is mapped now + `extra_bytes` (so an unbounded allocation fails as MemoryError
    instead of exhausting the machine)."""

    def on_cpu(_sig, _frame):
        raise CaseTimeout(f"a case used more than {seconds} s of CPU")

    def on_wall(_sig, _frame):
        raise CaseTimeout(f"a case ran longer than {seconds * HANG_WALL_FACTOR} s (blocked?)")

    old_handlers = signal.signal(signal.SIGPROF, on_cpu), signal.signal(signal.SIGALRM, on_wall)
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    mapped = int(Path("/proc/self/statm").read_text().split()[0]) * resource.getpagesize()
    cap = mapped + extra_bytes
    resource.setrlimit(resource.RLIMIT_AS, (cap if hard == resource.RLIM_INFINITY else min(cap, hard), hard))
    signal.setitimer(signal.ITIMER_PROF, seconds)
    signal.setitimer(signal.ITIMER_REAL, seconds * HANG_WALL_FACTOR)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_PROF, 0)
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGPROF, old_handlers[0])
        signal.signal(signal.SIGALRM, old_handlers[1])
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))


def invoke(*args, seconds: float = CASE_SECONDS):
    with limits(seconds):
        return CliRunner().invoke(cli.app, [str(a) for a in args])


def _strict(constant: str):
    raise ValueError(f"non-standard JSON token {constant}")


def check_strict_json(folder: Path) -> None:
    for path in Path(folder).rglob("*.json"):
        json.loads(path.read_text(), parse_constant=_strict)


def assert_contract(r, *, names: tuple[str, ...], out: Path | None = None, ok_codes=(0,)) -> str | None:
    """Accepted (an exit code in ok_codes) or refused per the contract; returns the error line or None.
    `names`: the refusal must mention one of them (the file, or the option it came from)."""
    exc = r.exception
    if exc is not None and not isinstance(exc, SystemExit):
        raise AssertionError(f"{type(exc).__name__}: {exc} (exit {r.exit_code}); stderr: {r.stderr[-400:]!r}") from exc
    if r.exit_code in ok_codes:
        if out is not None and Path(out).exists():
            check_strict_json(out)
        return None
    assert r.exit_code == 2, (r.exit_code, r.stderr[-600:])
    lines = r.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), r.stderr[-600:]
    assert "Traceback" not in r.stderr
    assert any(n in lines[0] for n in names), (names, lines[0])
    if out is not None:
        assert not Path(out).exists(), f"{out} was written by a refused run"
    return lines[0]
