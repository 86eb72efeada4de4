"""The committed H200 traces through `validate`: the simulator's errors on measured runs it was not
fitted to.

realrun/traces/h200 holds 18 traces (Llama-3.1-8B at 10 and 40 Gbps, 8 layers of Llama-3.1-70B at
10 Gbps; FP16 baseline, KVQuant-style, HACK; two Poisson rates each), recorded on one H200 by
realrun/device_run.sh.  The scenarios in scenarios/measured take every cost from the committed
kernel profile (kernels, GEMMs at layer shapes, elementwise kernels) and the harness's host cost from
the realrun.hostcal microbenchmark (kernels_calibration/profiles/h200/hostcal_host{1,2}.csv, no
trace involved).  BOUNDS are the absolute errors this model achieves, rounded up, plus 2 percentage
points: a change that makes any prediction worse fails here, and tightening them is how an
improvement is recorded (the six HACK traces were recorded with the register-capped row-packed
decode kernel and the row-scaled prefill kernel; their bounds are that recording's).  The two 70B
HACK traces were recorded with the Gluon decode kernel, the default above 2K tokens at GQA 8 (the 8B
runs, GQA 4, run the row-packed kernel); that lease's host was slower (smoke run, same code path:
host issue 1.20 vs 1.07 ms; 70B median iteration +3 % although the attention got faster), so their
bounds are wider than the row-packed recording's (11, 3, 9) and (13, 5, 13).  Achieved figures and
their causes: docs/calibration.md, "Earlier traces".
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from realrun.hostcal import fit_host
from simulator.measured import iterations_file
from simulator.validate import validate_index

ROOT = Path(__file__).resolve().parent.parent
TRACES = ROOT / "realrun/traces/h200"

# trace: (|mean JCT error|, |p50 TTFT error|, |p50 TPOT error|) bounds in percent
BOUNDS = {
    "llama-3.1-70b-L8_10gbps_baseline_r2": (10, 4, 11),
    "llama-3.1-70b-L8_10gbps_baseline_r3.5": (10, 3, 9),
    "llama-3.1-70b-L8_10gbps_hack_r2": (14, 6, 9),
    "llama-3.1-70b-L8_10gbps_hack_r3.5": (21, 3, 25),
    "llama-3.1-70b-L8_10gbps_kvquant_r2": (13, 3, 11),
    "llama-3.1-70b-L8_10gbps_kvquant_r3.5": (20, 7, 17),
    "llama-3.1-8b-L32_10gbps_baseline_r1": (3, 8, 10),
    "llama-3.1-8b-L32_10gbps_baseline_r1.6": (4, 8, 5),
    "llama-3.1-8b-L32_10gbps_hack_r1": (5, 11, 5),
    "llama-3.1-8b-L32_10gbps_hack_r1.6": (3, 8, 7),
    "llama-3.1-8b-L32_10gbps_kvquant_r1": (27, 10, 32),
    "llama-3.1-8b-L32_10gbps_kvquant_r1.6": (11, 12, 8),
    "llama-3.1-8b-L32_40gbps_baseline_r1.5": (19, 7, 23),
    "llama-3.1-8b-L32_40gbps_baseline_r3": (22, 8, 33),
    "llama-3.1-8b-L32_40gbps_hack_r1.5": (6, 10, 10),
    "llama-3.1-8b-L32_40gbps_hack_r3": (9, 23, 13),
    "llama-3.1-8b-L32_40gbps_kvquant_r1.5": (5, 7, 10),
    "llama-3.1-8b-L32_40gbps_kvquant_r3": (20, 7, 24),
}

# trace: (|mean decode error|, |mean decode-iteration error|) bounds in percent, the same rule: the decode
# part (join to finish) and the iteration time the cost model predicts for each measured (batch, context)
DECODE_BOUNDS = {
    "llama-3.1-70b-L8_10gbps_baseline_r2": (13, 14),
    "llama-3.1-70b-L8_10gbps_baseline_r3.5": (13, 11),
    "llama-3.1-70b-L8_10gbps_hack_r2": (16, 14),
    "llama-3.1-70b-L8_10gbps_hack_r3.5": (24, 19),
    "llama-3.1-70b-L8_10gbps_kvquant_r2": (15, 12),
    "llama-3.1-70b-L8_10gbps_kvquant_r3.5": (21, 15),
    "llama-3.1-8b-L32_10gbps_baseline_r1": (5, 6),
    "llama-3.1-8b-L32_10gbps_baseline_r1.6": (5, 4),
    "llama-3.1-8b-L32_10gbps_hack_r1": (8, 13),
    "llama-3.1-8b-L32_10gbps_hack_r1.6": (5, 3),
    "llama-3.1-8b-L32_10gbps_kvquant_r1": (30, 23),
    "llama-3.1-8b-L32_10gbps_kvquant_r1.6": (10, 8),
    "llama-3.1-8b-L32_40gbps_baseline_r1.5": (26, 30),
    "llama-3.1-8b-L32_40gbps_baseline_r3": (26, 5),
    "llama-3.1-8b-L32_40gbps_hack_r1.5": (9, 10),
    "llama-3.1-8b-L32_40gbps_hack_r3": (7, 14),
    "llama-3.1-8b-L32_40gbps_kvquant_r1.5": (3, 7),
    "llama-3.1-8b-L32_40gbps_kvquant_r3": (20, 6),
}


@pytest.fixture(scope="module")
def rows():
    return {r["trace"]: r for r in validate_index(TRACES / "index.csv")}


def test_every_committed_trace_is_validated(rows):
    assert set(rows) == set(BOUNDS) == set(DECODE_BOUNDS) and len(BOUNDS) == 18
    # 3 configurations x 3 methods x 2 rates
    assert {r["method"] for r in rows.values()} == {"baseline", "kvquant", "hack"}
    for name in BOUNDS:
        assert iterations_file(TRACES / name) is not None and (TRACES / name / "meta.json").exists()


@pytest.mark.parametrize("trace", sorted(BOUNDS))
def test_errors_within_what_the_model_achieves(rows, trace):
    r = rows[trace]
    jct, ttft, tpot = BOUNDS[trace]
    assert abs(r["jct_mean_error_pct"]) <= jct, r
    assert abs(r["ttft_p50_error_pct"]) <= ttft, r
    assert abs(r["tpot_p50_error_pct"]) <= tpot, r
    # the link is emulated exactly, the wire bytes are realrun's (the 2-bit formats' open V block in FP16
    # included) and the prefill is priced from the kernel profile: both stay close (the 8B 10 Gbps KVQuant-style
    # run at 1 req/s: transfer +8.4 %, its decode 25 % short of this earlier host-bound decode path)
    assert abs(r["transfer_mean_error_pct"]) <= 9 and abs(r["prefill_mean_error_pct"]) <= 8, r
    decode, iteration = DECODE_BOUNDS[trace]
    assert abs(r["decode_mean_error_pct"]) <= decode, r
    assert abs(r["iteration_mean_error_pct"]) <= iteration, r


def test_summary_over_all_traces(rows):
    """The headline figures docs/calibration.md quotes (mean absolute errors over the 18 traces)."""

    def mean_abs(key):
        return sum(abs(r[key]) for r in rows.values()) / len(rows)

    # with the 70B HACK traces recorded on the Gluon kernel: 9.9, 5.6, 12.2, 4.1 (all on the row-packed
    # kernel: 9.3, 5.5, 11.5, 4.0)
    assert mean_abs("jct_mean_error_pct") <= 10.5
    assert mean_abs("ttft_p50_error_pct") <= 6.0
    assert mean_abs("tpot_p50_error_pct") <= 12.5
    assert mean_abs("prefill_mean_error_pct") <= 4.5
    # decode 11.8 %, decode iteration 9.4 %
    assert mean_abs("decode_mean_error_pct") <= 13.0
    assert mean_abs("iteration_mean_error_pct") <= 10.5


def test_host_calibration_in_the_scenarios_comes_from_the_microbenchmark():
    """The measured scenarios' host-issue fields are the hostcal fit (two H200 hosts), not trace fits."""
    h200 = ROOT / "kernels_calibration/profiles/h200"
    fit = fit_host([h200 / "hostcal_host1.csv", h200 / "hostcal_host2.csv"])
    for scen in (ROOT / "scenarios/measured").glob("h200_*.yaml"):  # h200g_*: test_measured_traces_graphs.py
        dec = yaml.safe_load(scen.read_text())["decode"]
        for key in ("host_issue_s_per_iteration", "host_issue_s_per_layer", "host_serial_s_per_iteration"):
            assert dec[key] == pytest.approx(fit[key], rel=0.02), (scen.name, key)


def test_a_trace_reads_its_iterations_plain_or_gzipped(tmp_path):
    """The committed traces keep iterations.csv gzipped (simulator/measured.py, ITERATIONS_FILES); realrun writes it
    plain: both read the same, and the plain file comes first where a folder has both."""
    import gzip
    import shutil

    from simulator.measured import load_trace

    src = ROOT / "realrun/traces/h200_graphs/h200g_8b_mem_baseline_r7.5"
    gz = iterations_file(src)
    assert gz is not None and gz.name == "iterations.csv.gz"
    plain = tmp_path / "plain"
    plain.mkdir()
    for f in ("requests.csv", "meta.json"):
        shutil.copy(src / f, plain / f)
    (plain / "iterations.csv").write_bytes(gzip.decompress(gz.read_bytes()))
    a, b = load_trace(src), load_trace(plain)
    assert a[1] is not None and len(a[1]) > 100 and a[1].equals(b[1]) and a[0].equals(b[0])
    shutil.copy(gz, plain / "iterations.csv.gz")
    (plain / "iterations.csv").write_text("iteration,start_s,end_s,batch_size,context_tokens,peak_memory_bytes\n")
    assert iterations_file(plain) == plain / "iterations.csv" and len(load_trace(plain)[1]) == 0
