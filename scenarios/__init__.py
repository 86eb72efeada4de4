"""The example scenarios and sweeps, shipped as package data so a pip install has them too.

`hacksim scenarios` lists them. A command given a scenario or sweep path that does not exist looks
here next, so `hacksim simulate a10g_10gbps` or `hacksim sweep sweeps/hack_partition` works from any
folder; a file that does exist always wins.
"""

from __future__ import annotations

from pathlib import Path

EXAMPLES_DIR = Path(__file__).resolve().parent


def examples() -> list[Path]:
    """Every shipped scenario, sweep and candidates file, sorted by path."""
    return sorted(p for p in EXAMPLES_DIR.rglob("*.yaml") if "__pycache__" not in p.parts)


def resolve(path: str | Path) -> Path:
    """`path` if it exists, else the shipped example it names (`a10g_10gbps`, `a10g_10gbps.yaml`,
    `scenarios/sweeps/hack_partition.yaml`, ...), else `path` unchanged for the caller to refuse."""
    path = Path(path)
    if path.exists() or path.is_absolute():
        return path
    parts = path.parts[1:] if path.parts[:1] == ("scenarios",) else path.parts
    if not parts:
        return path
    named = EXAMPLES_DIR.joinpath(*parts)
    # `.yaml` added, not swapped in: `measured/h200g_70b8l_2.5gbps` has a dot that is not a suffix
    for candidate in (named, named.with_name(named.name + ".yaml")):
        if candidate.is_file() and candidate.suffix == ".yaml":
            return candidate
    return path
