"""Overload is said, not hidden: each pool's utilisation in summary.json, "stable", one terminal line,
a report banner, and plan counting an unstable rate as a miss."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from contract import invoke
from helpers import scenario
from simulator.overload import arrival_window_s, is_stable, overload_line, utilisation
from simulator.resolve import resolve
from simulator.run import run_scenario

FIXED = {
    "workload.output_tokens": {"kind": "fixed", "tokens": 2},
    "workload.input_tokens": {"kind": "fixed", "tokens": 1024},
    "network.bandwidth_gbps": 400,
}


def _service_s() -> float:
    base = scenario(methods=["baseline"], **FIXED)
    pre, _ = resolve(base).costs(base.methods[0])
    c = pre.prefill((1024,))
    return c.stage_s + c.encode_s


def test_hand_worked_utilisation():
    """Three arrivals 10 s apart: window 30 s. Prefill 12 busy-seconds on 2 replicas: 12/60. One 1 GB/s link
    carrying 15 GB: 15/30. Decode: 2 replicas of 10 GB, 4 slots, no host memory; held 20 s with 6 GB,
    10 s with 4 GB: memory (120+40)/(2·10·30) = 0.2667, slots 30/(2·4·30) = 0.125."""
    u = utilisation(
        arrival_s=np.array([0.0, 10.0, 20.0]),
        prefill_busy_s=12.0,
        prefill_replicas=2,
        link_bytes={"p0": 15e9},
        link_capacity_bytes_per_s={"p0": 1e9},
        held_s=np.array([20.0, 10.0]),
        held_kv_bytes=np.array([6e9, 4e9]),
        held_host_bytes=np.zeros(2),
        decode_replicas=2,
        decode_kv_capacity_bytes=10e9,
        decode_host_capacity_bytes=0.0,
        decode_max_batch=4,
    )
    assert u == pytest.approx({"prefill": 0.2, "network": 0.5, "decode": 160 / 600})
    assert is_stable(u)
    assert not is_stable({**u, "network": 1.0})
    assert arrival_window_s(np.array([5.0])) != arrival_window_s(np.array([5.0]))  # NaN: one request
    assert is_stable({"prefill": math.nan})


@pytest.mark.parametrize("rho", [0.5, 0.8])
def test_prefill_utilisation_is_the_offered_load(rho):
    """One replica, one request per batch, deterministic service S at Poisson rate λ: utilisation ≈ λS."""
    s_s = _service_s()
    s = scenario(
        methods=["baseline"],
        **FIXED,
        **{"workload.requests": 4000, "workload.arrival": {"kind": "poisson", "rate_rps": rho / s_s}},
    )
    m = run_scenario(s).summary["methods"]["baseline"]
    assert m["utilisation"]["prefill"] == pytest.approx(rho, rel=0.04)
    assert m["stable"] is True


def test_twenty_fold_overload_is_flagged():
    s = scenario(
        methods=["baseline", "hack"],
        **FIXED,
        **{"workload.requests": 400, "workload.arrival": {"kind": "poisson", "rate_rps": 20 / _service_s()}},
    )
    summary = run_scenario(s).summary
    for m in summary["methods"].values():
        assert m["stable"] is False and m["utilisation"]["prefill"] == pytest.approx(20, rel=0.15)
    line = overload_line(summary)
    assert line.startswith("warning: ") and "\n" not in line and "baseline (prefill" in line and "hack (prefill" in line


def test_a_burst_has_unbounded_utilisation(tmp_path):
    trace = tmp_path / "t.csv"
    trace.write_text("arrival_s,prompt_tokens,output_tokens\n" + "0,1024,4\n" * 3)
    s = scenario(
        methods=["baseline"],
        **{"workload.requests": 3, "workload.trace_csv": str(trace), "workload.arrival": {"kind": "trace"}},
    )
    m = run_scenario(s).summary["methods"]["baseline"]
    assert m["utilisation"]["prefill"] == math.inf and m["stable"] is False


def test_cli_warns_once_and_report_shows_a_banner(tmp_path):
    out = tmp_path / "out"
    r = invoke(
        "simulate",
        "scenarios/a10g_10gbps.yaml",
        "--requests",
        "200",
        "--methods",
        "baseline,hack",
        "--set",
        "workload.arrival.rate_rps=4",
        "--out",
        out,
    )
    assert r.exit_code == 0, r.stderr
    warnings = [line for line in r.stderr.splitlines() if line.startswith("warning:")]
    assert len(warnings) == 1 and "baseline (prefill" in warnings[0]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["methods"]["hack"]["stable"] is False
    assert set(summary["methods"]["hack"]["utilisation"]) == {"prefill", "network", "decode"}
    page = (out / "report.html").read_text()
    assert page.count('class="banner-overload"') == 1 and "hack (prefill" in page

    calm = tmp_path / "calm"
    r = invoke("simulate", "scenarios/a10g_10gbps.yaml", "--requests", "60", "--methods", "hack", "--out", calm)
    assert r.exit_code == 0 and "warning:" not in r.stderr
    assert json.loads((calm / "summary.json").read_text())["methods"]["hack"]["stable"] is True
    assert "banner-overload" not in (calm / "report.html").read_text()


def test_plan_counts_an_unstable_rate_as_a_miss():
    from planning.sweep import slo_misses

    row = {
        "completed": 10,
        "requests": 10,
        "ttft_p99_s": 1.0,
        "stable": False,
        "utilisation_prefill": 1.7,
        "utilisation_network": 0.2,
        "utilisation_decode": math.nan,
    }
    assert slo_misses(row, {"ttft_p99_s": 5}) == [("utilisation", 1.7, 1.0)]
    assert slo_misses({**row, "stable": True}, {"ttft_p99_s": 5}) == []
