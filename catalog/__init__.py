"""The project's catalogs: GPUs, cloud instances, models, workloads, interconnects and implementation profiles, as
data files with sources.

`catalog/data/*.yaml` hold the facts (units in field names, a `sources` list and `notes` per
entry); this module only loads them. Scenarios reference entries by key and may override fields.
"""

from __future__ import annotations

from functools import cache
from pathlib import Path

import yaml

DATA_DIR = Path(__file__).parent / "data"
KINDS = ("gpus", "instances", "models", "workloads", "interconnects", "implementations")


@cache
def load(kind: str) -> dict[str, dict]:
    """Entries of one catalog by key. The returned dicts must not be mutated."""
    if kind not in KINDS:
        raise ValueError(f"unknown catalog {kind!r}; known: {', '.join(KINDS)}")
    entries = yaml.safe_load((DATA_DIR / f"{kind}.yaml").read_text())
    out: dict[str, dict] = {}
    for e in entries:
        if e["key"] in out:
            raise ValueError(f"catalog/data/{kind}.yaml: duplicate key {e['key']!r}")
        out[e["key"]] = e
    return out


def entry(kind: str, key: str) -> dict:
    """One entry, with a one-line error naming the known keys when it is missing."""
    entries = load(kind)
    if key not in entries:
        raise KeyError(f"unknown {kind[:-1]} {key!r}; known: {', '.join(sorted(entries))}")
    return dict(entries[key])
