"""The graph-mode H200 traces (realrun/traces/h200_graphs): complete, with provenance, and through
`validate` with the errors the simulator achieves on them as it stands (not fitted to them).

27 traces of 150 requests, recorded by realrun/device_run.sh with the decode step replayed as CUDA
graphs, in the regimes where the methods differ (scenarios/measured/h200g_*.yaml say which).  The
bounds are the achieved mean absolute errors rounded up plus 2 percentage points: a change that makes
the predictions worse fails here; tightening them records an improvement.  Causes of the misses:
docs/calibration.md, "Measured runs on a GPU".
"""

from __future__ import annotations

import csv
from pathlib import Path

import pytest
import yaml

from realrun.hostcal import fit_host, fit_prefill_host, fit_quantize_host
from simulator.validate import validate_index
from tests.progress_spy import ProgressSpy
from tests.recorded_runs import check_recorded_run

ROOT = Path(__file__).resolve().parent.parent
TRACES = ROOT / "realrun/traces/h200_graphs"
# trace: (|mean decode error|, |mean decode-iteration error|) bounds in percent: achieved, rounded up, + 2. Since the
# busy link's host levels are the probe's of the harness's own link (2026-12-06; hostcal's second link had slowed the
# host more), FP16's decode at 25-40 Gbps is priced shorter: dq r8.8 -7.1 %, 8b_sat r11 -11.2 %, r9 -5.3 % (bounds 7, 8
# and 4 before); the fit, which agrees with the probe's level, moves the prefill's efficiency and floors instead.
BOUNDS = {
    "h200g_70b8l_1gbps_baseline_r8": (8, 6),
    "h200g_70b8l_1gbps_hack_r8": (5, 7),
    "h200g_70b8l_1gbps_kvquant_r8": (4, 8),
    "h200g_70b8l_2.5gbps_baseline_r10": (6, 7),
    "h200g_70b8l_2.5gbps_hack_r10": (6, 9),
    "h200g_70b8l_2.5gbps_kvquant_r10": (3, 9),
    "h200g_70b8l_dq_baseline_r7.3": (4, 10),
    "h200g_70b8l_dq_baseline_r8.8": (10, 11),
    "h200g_70b8l_dq_hack_r7.3": (8, 12),
    "h200g_70b8l_dq_hack_r8.8": (11, 15),
    "h200g_70b8l_dq_kvquant_r7.3": (5, 10),
    "h200g_70b8l_dq_kvquant_r8.8": (10, 11),
    "h200g_8b_2.5gbps_baseline_r7.5": (13, 7),
    "h200g_8b_2.5gbps_hack_r7.5": (4, 3),
    "h200g_8b_2.5gbps_kvquant_r7.5": (12, 3),
    "h200g_8b_mem_baseline_r7.5": (5, 4),
    "h200g_8b_mem_baseline_r8.5": (6, 4),
    "h200g_8b_mem_hack_r7.5": (9, 7),
    "h200g_8b_mem_hack_r8.5": (5, 6),
    "h200g_8b_mem_kvquant_r7.5": (3, 5),
    "h200g_8b_mem_kvquant_r8.5": (4, 4),
    "h200g_8b_sat_baseline_r11": (14, 8),
    "h200g_8b_sat_baseline_r9": (8, 6),
    "h200g_8b_sat_hack_r11": (13, 12),
    "h200g_8b_sat_hack_r9": (22, 11),
    "h200g_8b_sat_kvquant_r11": (8, 9),
    "h200g_8b_sat_kvquant_r9": (11, 7),
}


def _index():
    with open(TRACES / "index.csv") as f:
        return list(csv.DictReader(f))


def test_every_trace_is_complete_with_provenance():
    idx = _index()
    assert len(idx) >= 24
    methods = set()
    for row in idx:
        meta = check_recorded_run(TRACES / row["trace"], ROOT / row["scenario"])
        assert meta["gpu"] == "NVIDIA H200" and meta["requests"] >= 150
        methods.add(meta["method"])
    assert methods == {"baseline", "kvquant", "hack"}


def test_host_time_in_the_scenarios_comes_from_the_microbenchmark():
    fit = fit_host([TRACES / "hostcal_graphs.csv"])
    for scen in (ROOT / "scenarios/measured").glob("h200g_*.yaml"):
        dec = yaml.safe_load(scen.read_text())["decode"]
        assert dec["host_issue_s_per_iteration"] == 0 and dec["host_issue_s_per_layer"] == 0
        assert dec["host_serial_s_per_iteration"] == pytest.approx(fit["host_serial_s_per_iteration"], rel=0.02)
        assert dec["join_s_per_request"] == pytest.approx(fit["join_s_per_request"], rel=0.02)
        assert dec["leave_s_per_request"] == pytest.approx(fit["leave_s_per_request"], rel=0.02)


def test_prefill_host_floor_in_the_scenarios_comes_from_the_microbenchmark():
    """realrun issues prefill eagerly from Python: the prefill pool's host floor and HACK's own launches are the
    hostcal prefills' fit (realrun.hostcal.fit_prefill_host), not a trace fit."""
    h200 = ROOT / "kernels_calibration/profiles/h200"
    files = [h200 / "hostcal_host1.csv", h200 / "hostcal_host2.csv", TRACES / "hostcal_graphs.csv"]
    fit = fit_prefill_host(files + [ROOT / "realrun/traces/h200_repeats/hostcal_link.csv"])
    assert fit["groups"] == 14
    for scen in (ROOT / "scenarios/measured").glob("h200g_*.yaml"):
        raw = yaml.safe_load(scen.read_text())
        pre = raw["prefill"]
        assert pre["host_issue_s_per_iteration"] == pytest.approx(fit["host_issue_s_per_iteration"], rel=0.02)
        assert pre["host_issue_s_per_layer"] == pytest.approx(fit["host_issue_s_per_layer"], rel=0.02)
        hack = raw["calibration"]["implementation_factors"]["hack"]
        assert hack["prefill_issue_s_per_layer"] == pytest.approx(fit["hack_prefill_issue_s_per_layer"], rel=0.02)


def test_quantize_floors_in_the_scenarios_come_from_the_microbenchmark():
    """The quantize step after prefill (FP16: the pack for the wire) of every method: realrun.hostcal.fit_quantize_host
    on the hostcal runs with the link idle (32 and 2 layers, short and long prompts), not a trace fit."""
    fit = fit_quantize_host(sorted((ROOT / "realrun/traces/h200_repeats").glob("hostcal_link*.csv")))
    assert {m: f["groups"] for m, f in fit.items()} == {"baseline": 4, "hack": 4, "kvquant": 4}
    for scen in (ROOT / "scenarios/measured").glob("h200g_*.yaml"):
        factors = yaml.safe_load(scen.read_text())["calibration"]["implementation_factors"]
        for method, f in fit.items():
            got = factors[method]["quantize_issue_s_per_layer"]
            assert got == pytest.approx(f["quantize_issue_s_per_layer"], rel=0.01), (scen.name, method)


def test_quantize_floor_fit_by_hand(tmp_path):
    """fit_quantize_host on hand-made rows: FP16's medians 0.2 ms at 2 layers and 1.5 ms at 32 layers give the slope
    through the origin (2 x 0.2 + 32 x 1.5) / (2^2 + 32^2) = 48.4 / 1028 ms per layer; the first FP16 pass (a second
    exists), a busy link's rows and rows without a quantize step stay out."""
    head = "kind,method,model,layers,decode_mode,link_load_gbps,prompt_range,pass,quantize_s\n"
    rows = [
        "prefill,baseline,llama-3.1-8b,2,graphs,0.0,1024-3072,1,0.009",
        "prefill,baseline,llama-3.1-8b,2,graphs,0.0,1024-3072,2,0.0001",
        "prefill,baseline,llama-3.1-8b,2,graphs,0.0,1024-3072,2,0.0002",
        "prefill,baseline,llama-3.1-8b,2,graphs,0.0,1024-3072,2,0.0003",
        "prefill,baseline,llama-3.1-8b,32,graphs,0.0,1024-3072,2,0.0015",
        "prefill,baseline,llama-3.1-8b,32,graphs,40.0,1024-3072,2,0.0090",
        "decode,baseline,llama-3.1-8b,32,graphs,0.0,1024-3072,2,",
    ]
    (tmp_path / "q.csv").write_text(head + "\n".join(rows) + "\n")
    fit = fit_quantize_host([tmp_path / "q.csv"])
    assert fit == {"baseline": {"quantize_issue_s_per_layer": pytest.approx(48.4e-3 / 1028), "groups": 2}}


def test_prefill_host_fit_by_hand(tmp_path):
    """fit_prefill_host on hand-made rows: 2-layer walls of 2.3 ms (FP16) and 3.5 ms (HACK), 32-layer HACK 32.0 ms
    give per batch a, per layer b and HACK's h from a + 2b = 2.3, a + 2b + 2h = 3.5, a + 32(b + h) = 32.0:
    b + h = 28.5 / 30 = 0.95, h = 0.6, b = 0.35, a = 1.6 ms.  The first FP16 pass (a second exists), a busy link,
    the GPU-bound 32-layer FP16 run and the 70B rows stay out."""
    head = "kind,method,model,layers,pass,link_load_gbps,tokens,wall_s\n"
    rows = [
        ("baseline", "llama-3.1-8b", 2, 2, 0, [2.2, 2.3, 2.4]),
        ("baseline", "llama-3.1-8b", 2, 1, 0, [70.0, 71.0, 72.0]),  # cold first pass
        ("baseline", "llama-3.1-8b", 2, 2, 50, [9.0, 9.0, 9.0]),  # link busy
        ("baseline", "llama-3.1-8b", 32, 2, 0, [19.0, 21.0, 23.0]),  # GPU-bound
        ("hack", "llama-3.1-8b", 2, 1, 0, [3.4, 3.5, 3.9]),
        ("hack", "llama-3.1-8b", 32, 1, 0, [31.0, 32.0, 40.0]),
        ("hack", "llama-3.1-70b", 2, 1, 0, [5.0, 6.0, 7.0]),
    ]
    lines = [
        f"prefill,{m},{model},{layers},{p},{load},{512 + 100 * i},{w / 1e3}\n"
        for m, model, layers, p, load, walls in rows
        for i, w in enumerate(walls)
    ]
    lines.append("decode,hack,llama-3.1-8b,2,1,0,513,0.5\n")
    (tmp_path / "h.csv").write_text(head + "".join(lines))
    fit = fit_prefill_host([tmp_path / "h.csv"])
    assert fit["groups"] == 3
    assert fit["host_issue_s_per_iteration"] == pytest.approx(1.6e-3, rel=1e-9)
    assert fit["host_issue_s_per_layer"] == pytest.approx(0.35e-3, rel=1e-9)
    assert fit["hack_prefill_issue_s_per_layer"] == pytest.approx(0.6e-3, rel=1e-9)


@pytest.fixture(scope="module")
def rows():
    return validate_index(TRACES / "index.csv")


def test_errors_within_what_the_model_achieves(rows):
    def mean_abs(key):
        return sum(abs(r[key]) for r in rows) / len(rows)

    # achieved: 12.4, 18.3, 11.6, 7.3, 3.1, 5.2 %; decode 11.2 % (the host terms at the link's busy level while a
    # transfer is in flight since: 14.6, 21.1, 13.8, 8.9, 3.8, 5.2 %, decode 12.8 % before; small kernels priced
    # inside the graph since 2026-12-03: the launch-priced ones had hidden part of the host time these rows carry;
    # see tests/kernels/test_step_profile.py for the step replays themselves; the 2-bit formats' open V block on
    # the wire and the prefill's host floor from hostcal since: 15.6, 24.3, 14.6, 12.6, 8.4, 5.2 %, decode 13.5 %)
    assert mean_abs("jct_mean_error_pct") <= 14.0
    assert mean_abs("ttft_p50_error_pct") <= 20.0
    assert mean_abs("tpot_p50_error_pct") <= 13.5
    assert mean_abs("prefill_mean_error_pct") <= 9.0
    transfer = [abs(r["transfer_mean_error_pct"]) for r in rows if r["transfer_mean_error_pct"] is not None]
    assert len(transfer) == 23 and sum(transfer) / len(transfer) <= 4.5
    assert mean_abs("iteration_mean_error_pct") <= 7.0
    assert mean_abs("decode_mean_error_pct") <= 13.0
    # the link-bound 70B-shape configurations are where the model holds best
    link = [r for r in rows if "70b8l_1gbps" in r["trace"] or "70b8l_2.5gbps" in r["trace"]]
    assert len(link) == 6 and all(abs(r["jct_mean_error_pct"]) <= 9 for r in link)


def test_decode_and_iteration_errors_per_trace(rows):
    by_name = {Path(r["trace"]).name: r for r in rows}
    assert set(by_name) == set(BOUNDS)
    for name, (decode, iteration) in BOUNDS.items():
        r = by_name[name]
        assert abs(r["decode_mean_error_pct"]) <= decode, (name, r["decode_mean_error_pct"])
        assert abs(r["iteration_mean_error_pct"]) <= iteration, (name, r["iteration_mean_error_pct"])


def test_each_method_against_fp16_as_the_scenarios_price_it(rows, tmp_path):
    """`validate index.csv` (no fit) prints each method's mean JCT against FP16's over the same requests in the same
    process, measured and simulated: 18 comparisons on the 27 traces, 5.6 points off on average (26.2 at worst,
    `8b_sat` HACK r9: +79 % measured, +53 % priced), the same as `validate --cv`'s no-fit column
    (tests/test_calibrate_measured.py)."""
    from simulator.comparison import index_against_reference
    from simulator.validate import format_validation_table

    table = index_against_reference(rows)
    assert table and "against baseline's" in table[0]
    lines = table[0].splitlines()
    assert sum(x.startswith("h200g_") for x in lines) == 18
    mean = next(x for x in lines if x.startswith("mean |error| (points)")).split()[-1]
    worst = next(x for x in lines if x.startswith("max |error| (points)")).split()[-1]
    assert (float(mean), float(worst)) == pytest.approx((5.6, 26.2), abs=0.05)
    sat9 = next(x for x in lines if x.startswith("h200g_8b_sat ") and " 9 " in x and "hack" in x)
    assert "+79.2%" in sat9 and "+52.9% (-26.2)" in sat9
    assert table[0] in format_validation_table(rows)
    # the validation page (validate INDEX --out) has it as a section of its own
    from reports.validation import write_validation_index_report
    from simulator.comparison import index_comparison

    page = write_validation_index_report(
        rows, tmp_path / "v.html", plotlyjs="plotly.min.js", comparison=index_comparison(rows)
    ).read_text()
    assert 'id="against-fp16"' in page and page.count("<tr>", page.index("table-against-reference")) == 19
    assert "misses by 5.6 points on average (26.2 at worst)." in page


def test_validating_the_index_in_processes_gives_the_same_rows(rows):
    """validate_index over two worker processes: the same rows, in the index's order, as one process gives, and a
    progress display told each run as it ends."""
    bar = ProgressSpy()
    assert validate_index(TRACES / "index.csv", workers=2, progress=bar) == rows
    assert bar.shown == [[len(rows), "validating the runs", "runs", len(rows)]]
