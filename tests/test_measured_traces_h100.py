"""The H100 recordings (realrun/traces/h100, h100b, h100c, h100d, h100e; listed in realrun/traces/index_h100.csv):
every run complete, with its provenance, described by its scenario, in the session its index names; and the
across-session repeats index (realrun/traces/index_h100_sessions.csv) groups recordings of one configuration,
method and seed. How the H200 calibration carries to them: tests/test_calibrate_measured.py."""

from __future__ import annotations

import csv
import json
from collections import Counter
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
TRACES = ROOT / "realrun/traces"
PROVENANCE = ("gpu", "driver", "torch", "triton", "python", "date", "git_rev", "command")
SESSIONS = {  # folder: the session named in the index (its device call's start, UTC)
    "h100": "h100-2026-12-05-1234",
    "h100b": "h100-2026-12-05-1435",
    "h100c": "h100-2026-12-05-1626",
    "h100d": "h100-2026-12-05-1635",
    "h100e": "h100-2026-12-05-1649",
}


def _rows(path: Path) -> list[dict]:
    with open(path) as f:
        return list(csv.DictReader(f))


def test_every_h100_run_is_complete_with_provenance_and_described_by_its_scenario():
    rows = _rows(TRACES / "index_h100.csv")
    assert len(rows) == 53 and Counter(r["trace"].split("/")[0] for r in rows) == {
        "h100": 11,
        "h100b": 9,
        "h100c": 12,
        "h100d": 9,
        "h100e": 12,
    }
    for row in rows:
        folder = TRACES / row["trace"]
        session = row["trace"].split("/")[0]
        assert row["machine"] == SESSIONS[session], row
        meta = json.loads((folder / "meta.json").read_text())
        assert all(meta[k] for k in PROVENANCE), row["trace"]
        assert meta["gpu"].startswith("NVIDIA H100") and "complete=True" in meta["notes"], row["trace"]
        assert meta["decode_mode"] == "graphs" and meta["placement"] == "shared_gpu"
        reqs = _rows(folder / "requests.csv")
        assert len(reqs) == meta["requests"]
        its = _rows(folder / "iterations.csv")
        assert sum(int(i["batch_size"]) for i in its) == sum(int(r["output_tokens"]) - 1 for r in reqs)
        scen = yaml.safe_load((ROOT / row["scenario"]).read_text())
        assert scen["prefill"]["gpu"] == scen["decode"]["gpu"] == "h100", row["scenario"]
        assert scen["decode"]["kv_capacity_gib"] * (1 << 30) == meta["kv_capacity_bytes"]
        assert scen["decode"]["max_batch_requests"] == meta["max_decode_batch"]
        assert scen["network"]["bandwidth_gbps"] == meta["link_gbps"]
        assert scen["prefill"]["host_memory_gib"] * (1 << 30) == meta["prefill_host_memory_bytes"]
    for session in SESSIONS:
        prov = json.loads((TRACES / session / "provenance.json").read_text())
        assert prov["gpu"].startswith("NVIDIA H100") and prov["command"].startswith("bash realrun/device_run.sh")


def test_the_sessions_index_groups_one_configuration_method_and_seed():
    """Rows sharing config: the same scenario, method, rate, requests and seed, in different sessions."""
    groups: dict[str, list[dict]] = {}
    for row in _rows(TRACES / "index_h100_sessions.csv"):
        groups.setdefault(row["config"], []).append(row)
    assert len(groups) == 18 and all(len(g) >= 2 for g in groups.values())
    for config, rows in groups.items():
        metas = [json.loads((TRACES / r["trace"] / "meta.json").read_text()) for r in rows]
        same = {(m["method"], m["rate_rps"], m["requests"], m["seed"], m["model"], m["layers"]) for m in metas}
        assert len(same) == 1 and len({r["scenario"] for r in rows}) == 1, config
        assert len({r["trace"].split("/")[0] for r in rows}) == len(rows), config  # one recording per session
