"""What the device probes (realrun.hostcal, transient, placecal, prefillcal) share: their device, their sets of
model shapes and their CSV rows."""

from __future__ import annotations

import csv
import os
import sys
from pathlib import Path

import torch


def probe_device(prog: str, smoke: bool) -> torch.device | None:
    """The device a probe runs on: the CPU under --smoke, with the Triton interpreter set before any kernel is
    imported, else the CUDA GPU; None, with the probe's one-line refusal printed, where there is none."""
    if smoke:
        os.environ.setdefault("TRITON_INTERPRET", "1")
        return torch.device("cpu")
    if not torch.cuda.is_available():
        print(f"{prog} needs a CUDA GPU", file=sys.stderr)
        return None
    return torch.device("cuda")


def parse_sets(text: str) -> list[tuple[str, int]]:
    """--sets "model:layers;model:layers" as (model, layers) pairs."""
    return [(p.split(":")[0], int(p.split(":")[1])) for p in text.split(";")]


def write_rows(path: Path, rows: list[dict]) -> None:
    """The rows so far, all of them, as a CSV (columns: the first row's keys), written whole beside the file and
    moved over it, so a probe cut off while writing leaves the last complete file; nothing where there are none."""
    if not rows:
        return
    tmp = path.with_name(path.name + ".tmp")
    with tmp.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    tmp.replace(path)


def print_fit(prog: str, compute) -> int:
    """A probe's --fit: print what `compute()` returns (exit 0), or one line naming the probe and why not (exit 2)."""
    try:
        text = compute()
    except (OSError, KeyError, ValueError) as e:
        print(f"{prog} --fit: {e}", file=sys.stderr)
        return 2
    print(text)
    return 0
