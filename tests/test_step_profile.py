"""The decode step replayed as a CUDA graph, measured kernel by kernel on the H200 and on an H100 (python -m
realrun.stepprof -> kernels_calibration/profiles/<gpu>/stepprof_*.csv), against the cost model's decode iteration.

The small kernels of a captured step (norms, RoPE, SiLU, products, residual adds, index writes, copies) cost what
they cost inside the graph, not a launch each: the profile's `elementwise.in_graph_overhead_s` is fitted from the
two small-batch files (kernels_calibration/dense_bench.py, in_graph_fit) and the decode pools of the measured
scenarios (cuda_graphs: true) charge it.  The two *_large files (batches 16-64, longer contexts) are not in the fit:
they check it."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from kernels_calibration.dense_bench import in_graph_fit, small_kernel_in_graph_s
from simulator.load import load_scenario
from simulator.resolve import resolve

ROOT = Path(__file__).resolve().parent.parent
H200 = ROOT / "kernels_calibration/profiles/h200"
FILES = {  # step profile -> the measured scenario of that model shape (its decode pool as realrun runs it)
    "stepprof_8b.csv": "h200g_8b_sat.yaml",
    "stepprof_8b_large.csv": "h200g_8b_sat.yaml",
    "stepprof_70b8l.csv": "h200g_70b8l_dq.yaml",
    "stepprof_70b8l_large.csv": "h200g_70b8l_dq.yaml",
}


H100 = ROOT / "kernels_calibration/profiles/h100"
H100_FILES = {  # the same steps on H100 80 GB (2026-12-05), priced by the H100's measured profile (the *_large not in it)
    "stepprof_8b.csv": "h100g_8b_small.yaml",
    "stepprof_8b_large.csv": "h100g_8b_small.yaml",
    "stepprof_70b8l.csv": "h100g_70b8l_dq.yaml",
    "stepprof_70b8l_large.csv": "h100g_70b8l_dq.yaml",
}


def _rows(name: str, folder: Path = H200) -> list[dict]:
    with (folder / name).open() as f:
        return list(csv.DictReader(f))


def _errors(files: dict[str, str] = FILES, folder: Path = H200) -> list[tuple[str, str, int, float]]:
    out = []
    for name, scen in files.items():
        s = load_scenario(ROOT / "scenarios/measured" / scen)
        res = resolve(s)
        for row in (r for r in _rows(name, folder) if r["kind"] == "step"):
            method = next(m for m in s.methods if m.output_name == row["method"])
            dec = res.costs(method)[1]
            b = int(row["batch"])
            ctx = (int(row["context"]) + 1) * b  # every request attends to its context and the new token
            c = dec.iteration(b)
            gpu_s = (
                c.decode_fixed_s
                + c.decode_per_ctx_s * ctx
                + c.dequant_fixed_s
                + c.dequant_per_ctx_s * ctx
                + c.approx_fixed_s
                + c.approx_per_ctx_s * ctx
                - dec.host_serial_s_per_iteration  # the replay is the GPU's part alone
            )
            out.append((name, row["method"], b, 100 * (gpu_s / float(row["replay_s"]) - 1)))
    return out


def test_the_profile_carries_the_in_graph_cost_fitted_from_the_small_batch_step_profiles():
    prof = json.loads((H200 / "profile.json").read_text())
    rows = _rows("stepprof_8b.csv") + _rows("stepprof_70b8l.csv")
    fit = in_graph_fit(rows)
    assert prof["kernels"]["elementwise"]["in_graph_overhead_s"] == pytest.approx(fit["in_graph_overhead_s"])
    # inside the graph a small kernel costs less than a launch (4.8 us) and more than the bare kernel
    assert 2e-6 < fit["in_graph_overhead_s"] < prof["kernels"]["elementwise"]["overhead_s"]


def test_small_kernel_cost_by_hand():
    """One step of 2 layers: two small kernels per layer (5 us and 3 us), a GEMM and a Triton kernel that do not
    count, one kernel run once per step (argmax, count < layers) that does not either; 10 kernels per replay and
    2 us between them in all -> (4 * 4 us) / 4 + 2 us / 10 = 4.2 us."""
    key = {"method": "baseline", "model": "m", "layers": "2", "batch": "1"}
    rows = [
        dict(kind="step", **key, kernels="10", gap_s="2e-6", replay_s="1e-3"),
        dict(kind="kernel", **key, name="void at::native::layer_norm", count="2", mean_s="5e-6"),
        dict(kind="kernel", **key, name="void at::native::add", count="2", mean_s="3e-6"),
        dict(kind="kernel", **key, name="nvjet_sm90_gemm", count="4", mean_s="50e-6"),
        dict(kind="kernel", **key, name="_fp_decode_kernel", count="2", mean_s="9e-6"),
        dict(kind="kernel", **key, name="void at::native::reduce_kernel argmax", count="1", mean_s="35e-6"),
    ]
    ((_, per),) = small_kernel_in_graph_s(rows)
    assert per == pytest.approx(4.2e-6)
    assert in_graph_fit(rows) == {"in_graph_overhead_s": pytest.approx(4.2e-6), "in_graph_steps": 1}


def test_step_replays_within_5_percent_from_batch_2_to_64():
    """What the iteration's GPU part is priced at against the measured replay: within 5.5 % for every method and
    shape at batches 2-64 (the HACK GQA-4 kernel at batch 16 and 1K context, +11.5 %, excepted below);
    batch 1 (+9 to +14 % for the 8B shape: one bucket runs fewer and shorter small kernels) is bounded apart."""
    errs = _errors()
    assert len(errs) == 21 + 15 + 8 + 12
    for name, method, b, err in errs:
        if b == 1:
            assert abs(err) <= 14, (name, method, b, err)
        elif name == "stepprof_8b.csv" and method == "hack" and b == 16:
            assert abs(err) <= 12.5, (name, method, b, err)
        else:
            assert abs(err) <= 5.5, (name, method, b, err)
    above_1 = [abs(err) for _, _, b, err in errs if b > 1]
    assert sum(above_1) / len(above_1) <= 3.5  # achieved 2.7 %


def test_h100_step_replays_priced_by_its_measured_profile():
    """On an H100 (kernels_calibration/profiles/h100, measured there) the same comparison: within 4 % for every method
    and shape at batches 2-64 (achieved -2.8 to +3.8 %; the large files, batches 16-64 at 2K / 3K contexts, on another
    H100 than the profile's, -2.6 to +2.8 %) but the HACK GQA-4 kernel at batches 8-16 and 1K contexts (+6.4 / +10.3 %,
    the H200's +4.8 / +11.5 % pattern); batch 1 +0.1 to +8.6 %. Mean |error| above batch 1: 1.6 %."""
    errs = _errors(H100_FILES, H100)
    assert len(errs) == 21 + 15 + 21 + 12
    for name, method, b, err in errs:
        if b == 1:
            assert abs(err) <= 10, (name, method, b, err)
        elif name == "stepprof_8b.csv" and method == "hack" and b >= 8:
            assert abs(err) <= 12.5, (name, method, b, err)
        else:
            assert abs(err) <= 4, (name, method, b, err)
    above_1 = [abs(err) for _, _, b, err in errs if b > 1]
    assert sum(above_1) / len(above_1) <= 2.2


def test_launch_priced_small_kernels_would_miss_the_small_batches():
    """The same comparison with every small kernel priced as a launch (cuda_graphs false): the small batches come
    out 2-10 % slower than measured at batches 2-16 of the 8B shape, the error the in-graph cost removes."""
    s = load_scenario(ROOT / "scenarios/measured/h200g_8b_sat.yaml", ["decode.cuda_graphs=false"])
    res = resolve(s)
    dec = res.costs(next(m for m in s.methods if m.output_name == "baseline"))[1]
    worse = []
    for row in (r for r in _rows("stepprof_8b.csv") if r["kind"] == "step" and r["method"] == "baseline"):
        b = int(row["batch"])
        c = dec.iteration(b)
        gpu_s = c.decode_fixed_s + c.decode_per_ctx_s * (int(row["context"]) + 1) * b - dec.host_serial_s_per_iteration
        worse.append(100 * (gpu_s / float(row["replay_s"]) - 1))
    assert min(worse[1:]) > 5  # every batch 2..16 priced more than 5 % too slow
