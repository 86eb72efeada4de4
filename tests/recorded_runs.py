"""Checks every committed realrun recording passes (tests/test_measured_traces_*.py): complete, with its
provenance, and described by the scenario its index names."""

from __future__ import annotations

import csv
import gzip
import json
import math
from pathlib import Path

import yaml

from simulator.measured import iterations_file

PROVENANCE = ("gpu", "driver", "torch", "triton", "python", "date", "git_rev", "command")


def rows(path: Path) -> list[dict]:
    with gzip.open(path, "rt") if path.suffix == ".gz" else open(path) as f:
        return list(csv.DictReader(f))


def check_recorded_run(folder: Path, scenario: Path) -> dict:
    """One graph-mode, shared-GPU recording: its meta.json's provenance, complete, every request finished, the
    iterations' tokens those the requests decoded; the scenario's placement, KV pool, decode batch, link and
    prefill host memory the recording's. Returns its meta."""
    meta = json.loads((folder / "meta.json").read_text())
    assert all(meta[k] for k in PROVENANCE), folder
    assert "complete=True" in meta["notes"], folder
    assert meta["decode_mode"] == "graphs" and meta["placement"] == "shared_gpu", folder
    reqs = rows(folder / "requests.csv")
    assert len(reqs) == meta["requests"] and all(math.isfinite(float(r["finish_s"])) for r in reqs), folder
    its_file = iterations_file(folder)
    assert its_file is not None, folder
    its = rows(its_file)
    assert sum(int(i["batch_size"]) for i in its) == sum(int(r["output_tokens"]) - 1 for r in reqs), folder
    scen = yaml.safe_load(scenario.read_text())
    assert scen["placement"] == "shared_gpu", scenario
    assert scen["decode"]["kv_capacity_gib"] * (1 << 30) == meta["kv_capacity_bytes"], scenario
    assert scen["decode"]["max_batch_requests"] == meta["max_decode_batch"], scenario
    assert scen["network"]["bandwidth_gbps"] == meta["link_gbps"], scenario
    assert scen["prefill"]["host_memory_gib"] * (1 << 30) == meta["prefill_host_memory_bytes"], scenario
    return meta
