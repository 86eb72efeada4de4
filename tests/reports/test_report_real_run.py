"""The report of a real `simulate --out` run (the other report tests use a hand-made run folder): every output
file is written, and every figure shows the numbers of the tables beside it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from reports import figures_from_html
from reports.data import BREAKDOWN_PARTS
from reports.style import method_label

REPO = Path(__file__).resolve().parents[2]
METHODS = ["baseline", "kvquant", "hack"]
REQUESTS = 24
GIB = 2**30


@pytest.fixture(scope="module")
def out(tmp_path_factory):
    out = tmp_path_factory.mktemp("real") / "run"
    r = subprocess.run(
        [
            sys.executable,
            str(REPO / "cli.py"),
            "simulate",
            "scenarios/a10g_10gbps.yaml",
            "--requests",
            str(REQUESTS),
            "--methods",
            ",".join(METHODS),
            "--seed",
            "5",
            "--out",
            str(out),
            "--quiet",
        ],
        capture_output=True,
        text=True,
        cwd=REPO,
    )
    assert r.returncode == 0, r.stderr
    return out


def test_every_output_file_is_written(out):
    for name in (
        "summary.json",
        "requests.csv",
        "memory.csv",
        "links.csv",
        "scenario.json",
        "profiles.json",
        "report.html",
    ):
        assert (out / name).stat().st_size > 0, name
    df = pd.read_csv(out / "requests.csv")
    assert df.groupby("method").size().to_dict() == {m: REQUESTS for m in METHODS}
    parts = df[[f"{p}_s" for p in BREAKDOWN_PARTS]].sum(axis=1)
    assert np.allclose(parts, df["jct_s"], rtol=1e-9, atol=1e-12)


def test_figures_show_the_run_tables(out):
    summary = json.loads((out / "summary.json").read_text())["methods"]
    df = pd.read_csv(out / "requests.csv")
    figs = figures_from_html(out / "report.html")
    assert list(figs) == [
        "jct_breakdown",
        "cdf_jct",
        "cdf_ttft",
        "cdf_tpot",
        "decode_memory",
        "link_utilisation",
        "accuracy_tradeoff",
    ]
    labels = [method_label(m) for m in METHODS]
    # the breakdown: one bar per part and method, the summary's per-request means
    bars = [t for t in figs["jct_breakdown"]["data"] if t["type"] == "bar"]
    assert len(bars) == len(BREAKDOWN_PARTS)
    for part, bar in zip(BREAKDOWN_PARTS, bars):
        assert list(bar["x"]) == labels
        assert np.allclose(bar["y"], [summary[m]["breakdown_s"][part] for m in METHODS], rtol=1e-12), part
    # each CDF: every request's value, sorted, at (i + 1) / n
    for name, column, scale in (("cdf_jct", "jct_s", 1.0), ("cdf_ttft", "ttft_s", 1.0), ("cdf_tpot", "tpot_s", 1e3)):
        traces = {t["name"]: t for t in figs[name]["data"]}
        for m in METHODS:
            t = traces[method_label(m)]
            values = np.sort(df.loc[df["method"] == m, column].to_numpy() * scale)
            assert np.allclose(t["x"], values, rtol=1e-12), (name, m)
            assert np.allclose(t["y"], np.arange(1, REQUESTS + 1) / REQUESTS)
    # decode memory: each replica's panel states the largest KV capacity of the methods (summary.json), as a
    # dashed line where it is on scale; the curves peak where memory.csv does
    mem = figs["decode_memory"]
    cap_gib = max(summary[m]["decode_kv_capacity_bytes"] for m in METHODS) / GIB
    titles = [a["text"] for a in mem["layout"]["annotations"]]
    assert len(titles) == 2 and all(f"{cap_gib:.4g} GiB" in t for t in titles), titles
    assert all(float(t["y"][0]) == pytest.approx(cap_gib, rel=1e-12) for t in mem["data"] if t["name"] == "capacity")
    mem_csv = pd.read_csv(out / "memory.csv")
    for m in METHODS:
        peak = max(float(np.max(t["y"])) for t in mem["data"] if t["name"] == method_label(m))
        assert peak == pytest.approx(mem_csv.loc[mem_csv["method"] == m, "used_bytes"].max() / GIB, rel=1e-9), m
    # links: the scenario's 10 Gbps at efficiency 0.9 per link (links.csv's capacity), throughput never above it
    links = figs["link_utilisation"]
    net = json.loads((out / "scenario.json").read_text())["network"]
    usable_gbps = net["bandwidth_gbps"] * net["efficiency"]
    assert usable_gbps == pytest.approx(9.0)
    assert np.allclose(pd.read_csv(out / "links.csv")["capacity_gbps"], usable_gbps, rtol=1e-12)
    caps = [float(t["y"][0]) for t in links["data"] if t["name"] == "capacity"]
    assert caps and np.allclose(caps, usable_gbps, rtol=1e-12)
    assert 0 < max(float(np.max(t["y"])) for t in links["data"] if t["name"] != "capacity") <= usable_gbps + 1e-9


def test_report_tables_name_every_method_and_rebuild_identically(out):
    html = (out / "report.html").read_text()
    for needle in ('id="table-changes"', 'id="table-methods"', 'id="table-profiles"', "a10g_10gbps", "llama-3.1-70b"):
        assert needle in html, needle
    for m in METHODS:
        assert method_label(m) in html
    first = (out / "report.html").read_bytes()
    r = subprocess.run(
        [sys.executable, str(REPO / "cli.py"), "report", str(out)], capture_output=True, text=True, cwd=REPO
    )
    assert r.returncode == 0, r.stderr
    assert (out / "report.html").read_bytes() == first
