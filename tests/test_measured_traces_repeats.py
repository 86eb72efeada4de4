"""The repeated H200 recordings (realrun/traces/h200_repeats): seven configurations, FP16 and HACK recorded three
times each with the same seed back to back in one process (KVQuant-style once), through `validate` with the
errors the simulator achieves on them (nothing fitted to them).

Configurations (scenarios/measured/h200g_*.yaml): `8b_small` (decode batches 1-16, never recorded before),
`8b_kvsat` (FP16's decode memory saturated, 5 GiB of KV for 2-6K-token prompts), and the link-bound
`70b8l_1gbps` again, recorded by `bash realrun/device_run.sh REV noise` and `... kvsat`; then `8b_sat` r9 (the GPU
near saturation: HACK's recordings spread by 11 % in mean JCT) and HACK at `8b_mem` r7.5, by `... satnoise`; then
the two 2.5 Gbps configurations of h200_graphs again, on another device session (`... noise70b25`, `... noise8b25`):
within the session they repeat to 0.2-2.2 %, against the first recordings their requests decode 7-19 % faster (the
launch-bound short-prompt prefills that pause the shared GPU run 16-30 % faster there).  The bounds are the
achieved absolute errors rounded up plus 2 percentage points."""

from __future__ import annotations

import csv
import json
import math
from collections import Counter
from pathlib import Path

import pytest

from simulator.validate import validate_index
from tests.recorded_runs import PROVENANCE

ROOT = Path(__file__).resolve().parent.parent
TRACES = ROOT / "realrun/traces/h200_repeats"
# trace: (|mean JCT error|, |mean decode-iteration error|) bounds in percent: achieved, rounded up, + 2. Since the
# scenarios carry hostcal's quantize floors and FP16's pack step, KVQuant-style and HACK tightened by 1-6 points and
# two FP16 traces (already predicted long) loosened by one: their pack adds 1.1-1.9 ms a request. Since the share of
# the first-seen prefill time a GPU-bound batch shows (prefill.host_first_seen_fade_s), 70b8l_2.5gbps KVQuant-style, the
# first method of its process, loosened by three: +7.5 -> +9.0 %, its 12-30 ms prefills priced 1.0-1.3 ms more where
# the recordings' first runs show 0.1-0.3 ms on the H200 (docs/calibration.md)
BOUNDS = {
    "h200g_70b8l_1gbps_baseline_r8_rep1": (5, 7),
    "h200g_70b8l_1gbps_baseline_r8_rep2": (7, 6),
    "h200g_70b8l_1gbps_baseline_r8_rep3": (7, 6),
    "h200g_70b8l_1gbps_hack_r8_rep1": (8, 9),
    "h200g_70b8l_1gbps_hack_r8_rep2": (4, 8),
    "h200g_70b8l_1gbps_hack_r8_rep3": (10, 8),
    "h200g_8b_kvsat_baseline_r2.5_rep1": (4, 3),
    "h200g_8b_kvsat_baseline_r2.5_rep2": (7, 3),
    "h200g_8b_kvsat_baseline_r2.5_rep3": (6, 3),
    "h200g_8b_kvsat_hack_r2.5_rep1": (8, 6),
    "h200g_8b_kvsat_hack_r2.5_rep2": (7, 6),
    "h200g_8b_kvsat_hack_r2.5_rep3": (12, 7),
    "h200g_8b_kvsat_kvquant_r2.5": (7, 4),
    "h200g_8b_small_baseline_r5_rep1": (4, 3),
    "h200g_8b_small_baseline_r5_rep2": (4, 4),
    "h200g_8b_small_baseline_r5_rep3": (5, 4),
    "h200g_8b_small_hack_r5_rep1": (4, 5),
    "h200g_8b_small_hack_r5_rep2": (9, 4),
    "h200g_8b_small_hack_r5_rep3": (6, 4),
    "h200g_8b_small_kvquant_r5": (5, 4),
    # satnoise, since a homomorphic prefill quantizes inside its forward (HACK at 8b_sat 23.5, 32.9 and 16.3 % before)
    "h200g_8b_sat_baseline_r9_rep1": (5, 4),
    "h200g_8b_sat_baseline_r9_rep2": (6, 5),
    "h200g_8b_sat_baseline_r9_rep3": (4, 4),
    "h200g_8b_sat_hack_r9_rep1": (22, 10),
    "h200g_8b_sat_hack_r9_rep2": (32, 11),
    "h200g_8b_sat_hack_r9_rep3": (14, 9),
    "h200g_8b_sat_kvquant_r9": (22, 8),
    "h200g_8b_mem_hack_r7.5_rep1": (14, 7),
    "h200g_8b_mem_hack_r7.5_rep2": (17, 7),
    "h200g_8b_mem_hack_r7.5_rep3": (8, 6),
    # noise70b25 / noise8b25 (another device session than the first recordings of these configurations)
    "h200g_70b8l_2.5gbps_baseline_r10_rep1": (10, 3),
    "h200g_70b8l_2.5gbps_baseline_r10_rep2": (12, 3),
    "h200g_70b8l_2.5gbps_baseline_r10_rep3": (11, 3),
    "h200g_70b8l_2.5gbps_hack_r10_rep1": (11, 3),
    "h200g_70b8l_2.5gbps_hack_r10_rep2": (11, 3),
    "h200g_70b8l_2.5gbps_hack_r10_rep3": (10, 3),
    "h200g_70b8l_2.5gbps_kvquant_r10": (11, 3),
    "h200g_8b_2.5gbps_baseline_r7.5_rep1": (12, 9),
    "h200g_8b_2.5gbps_baseline_r7.5_rep2": (14, 10),
    "h200g_8b_2.5gbps_baseline_r7.5_rep3": (14, 10),
    "h200g_8b_2.5gbps_hack_r7.5_rep1": (28, 6),
    "h200g_8b_2.5gbps_hack_r7.5_rep2": (22, 6),
    "h200g_8b_2.5gbps_hack_r7.5_rep3": (26, 6),
    "h200g_8b_2.5gbps_kvquant_r7.5": (15, 7),
}
ISSUE_27 = ("_70b8l_1gbps_", "_8b_kvsat_", "_8b_small_")  # the configurations issue 27's goal was set on


def _index() -> list[dict]:
    with open(TRACES / "index.csv") as f:
        return list(csv.DictReader(f))


def test_every_trace_is_complete_and_repeats_share_their_configuration():
    idx = _index()
    assert {r["trace"] for r in idx} == set(BOUNDS)
    for row in idx:
        meta = json.loads((TRACES / row["trace"] / "meta.json").read_text())
        assert all(meta[k] for k in PROVENANCE), row["trace"]
        assert meta["gpu"] == "NVIDIA H200" and "complete=True" in meta["notes"]
        assert meta["decode_mode"] == "graphs" and meta["placement"] == "shared_gpu"
        assert (ROOT / row["scenario"]).exists()
        with open(TRACES / row["trace"] / "requests.csv") as f:
            reqs = list(csv.DictReader(f))
        assert len(reqs) == meta["requests"] and all(math.isfinite(float(r["finish_s"])) for r in reqs)
    # FP16 and HACK three times per configuration, KVQuant-style once; repeats share method, rate and seed
    counts = Counter(r["config"] for r in idx)
    assert sorted(counts.values()) == [1] * 5 + [3] * 13
    for config, n in counts.items():
        metas = [json.loads((TRACES / r["trace"] / "meta.json").read_text()) for r in idx if r["config"] == config]
        assert len({(m["method"], m["rate_rps"], m["seed"], m["requests"]) for m in metas}) == 1, config
        assert n == 1 or metas[0]["method"] in ("baseline", "hack")


@pytest.fixture(scope="module")
def rows():
    return {Path(r["trace"]).name: r for r in validate_index(TRACES / "index.csv")}


def test_errors_within_what_the_model_achieves(rows):
    for name, (jct, iteration) in BOUNDS.items():
        assert abs(rows[name]["jct_mean_error_pct"]) <= jct, (name, rows[name]["jct_mean_error_pct"])
        assert abs(rows[name]["iteration_mean_error_pct"]) <= iteration, name
    first = [r for n, r in rows.items() if any(c in n for c in ISSUE_27)]
    assert len(first) == 20
    mean = sum(abs(r["jct_mean_error_pct"]) for r in first) / len(first)
    # issue 27's goal on its configurations; achieved 3.7 % since a homomorphic prefill quantizes inside its forward
    # (4.0 % before; 4.9 % before the scenarios carried hostcal's quantize floors and FP16's pack; 4.7 % before the
    # host terms took the link's busy level; 5.5 % before the open V block and the prefill host floor)
    assert mean <= 5.0


def test_small_batch_iterations_within_5_percent(rows):
    """Issue 27: at decode batches 1-16 the iteration is priced within 5 % of the measured one (it was 7-8 % slow
    while every small kernel of the captured step was priced as a launch)."""
    small = {n: r for n, r in rows.items() if "_8b_small_" in n}
    assert len(small) == 7
    for name, r in small.items():
        assert abs(r["iteration_mean_error_pct"]) <= 5.0, (name, r["iteration_mean_error_pct"])
