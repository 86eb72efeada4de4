"""A scenario file to a valid `Scenario`: YAML, `--set` overrides, the schema (simulator/config.py), then the
files the scenario names, relative to its own folder (a recorded trace, read by simulator/traces.py, gives the
request count when the scenario gives none; an engine calibration file, read by simulator/engine.py, replaces
the engine parameters it fitted).  Every problem is a one-line `ScenarioError` naming file and field.

The schema module reads no file a scenario names, so this loader sits above both it and the trace readers.
"""

from __future__ import annotations

import stat
from pathlib import Path

from .config import Scenario, ScenarioError, apply_overrides, parse_scenario, read_yaml


def load_scenario(path: str | Path, overrides: list[str] | None = None) -> Scenario:
    """The scenario in a YAML file, `overrides` (`path.to.field=value`) applied, and the files it names resolved."""
    path = Path(path)
    raw = read_yaml(path)
    if isinstance(raw, dict) and "base" in raw and {"axes", "points", "linked"} & set(raw) and "model" not in raw:
        raise ScenarioError(
            f"{path}: a sweep file (a base scenario and axes), not a scenario: run `hacksim sweep {path}`"
        )
    if isinstance(raw, dict) and overrides:
        try:
            raw = apply_overrides(raw, overrides)
        except ScenarioError as e:
            raise ScenarioError(f"{path}: {e}") from None
    return resolve_workload_files(parse_scenario(raw, str(path)), path.parent, str(path))


def resolve_workload_files(scenario: Scenario, folder: Path, source: str) -> Scenario:
    """Trace paths made absolute against `folder` (the scenario file's), a trace's request count filled
    in from the trace itself when the scenario gives none, and the engine calibration file's fitted
    parameters applied (`calibration.engine`, simulator/engine.py)."""
    scenario = _workload_files(scenario, folder, source)
    if scenario.calibration.engine is not None:
        from .engine import apply_engine_file  # reads the file: only once the scenario is known to be valid

        scenario = apply_engine_file(scenario, folder, source)
    return scenario


def _workload_files(scenario: Scenario, folder: Path, source: str) -> Scenario:
    wl = scenario.workload
    update: dict = {}
    if wl.trace_csv is not None:
        if not Path(wl.trace_csv).is_absolute():
            update["trace_csv"] = str((folder / wl.trace_csv).resolve())
        _regular_file(Path(update.get("trace_csv", wl.trace_csv)), source, "workload.trace_csv")
    trace = wl.trace
    if trace is not None:
        if not Path(trace.path).is_absolute():
            trace = trace.model_copy(update={"path": str((folder / trace.path).resolve())})
            update["trace"] = trace
        _regular_file(Path(trace.path), source, "workload.trace.path")
        if wl.requests is None:
            from .traces import load_trace  # pandas, and the file read, only for a scenario that needs them

            update["requests"] = len(load_trace(trace, source))
    if not update:
        return scenario
    return scenario.model_copy(update={"workload": wl.model_copy(update=update)})


def _regular_file(path: Path, source: str, field: str) -> None:
    """Refuse, before any reader opens it, a trace path that is not a regular file: a folder (the readers'
    errors differ by format), or a FIFO or device, which would block the reader forever."""
    try:
        mode = path.stat().st_mode
    except FileNotFoundError:
        return  # the trace's reader says so, in its own words
    except OSError as e:
        raise ScenarioError(f"{source}: {field}: {path}: cannot read it ({e.strerror or e})") from None
    if stat.S_ISDIR(mode):
        raise ScenarioError(f"{source}: {field}: {path} is a folder, not a trace file")
    if not stat.S_ISREG(mode):
        raise ScenarioError(f"{source}: {field}: {path} is not a regular file (a FIFO or a device?)")
