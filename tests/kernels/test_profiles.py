"""The fitted and derived profiles: the fit recovers a known line, the committed profiles hold every
kernel key the cost model requires, and the derivation models what sm < 80 GPUs really do."""
import json
from pathlib import Path

import pytest

from kernels_calibration.derive import TARGETS, catalog_peaks, derive
from kernels_calibration.profile import build_profile, fit

PROFILES = Path(__file__).resolve().parents[2] / "kernels_calibration" / "profiles"
REQUIRED = ([f"decode_attn.{v}" for v in ("fp16", "fp8", "dequant_fused", "dequant_unfused", "hack", "hack_no_se",
                                            "hack_no_rqe")]
            + ["prefill_attn.fp16", "prefill_attn.hack", "quantize.kv", "dequantize.kv"])


def test_fit_recovers_line_and_reports_heldout_error():
    pts = [(u, 5e-6 + 2e-13 * u, i % 3 == 0) for i, u in enumerate([1e6, 3e6, 1e7, 3e7, 1e8, 3e8, 1e9])]
    f = fit(pts)
    assert f["overhead_s"] == pytest.approx(5e-6, rel=1e-6)
    assert f["s_per_unit"] == pytest.approx(2e-13, rel=1e-6)
    assert f["heldout_median_error_pct"] < 1e-6
    # a 10% bump on the held-out points shows up as ~10% error
    bumped = [(u, t * (1.1 if h else 1.0), h) for u, t, h in pts]
    assert fit(bumped)["heldout_median_error_pct"] == pytest.approx(100 * 0.1 / 1.1, abs=0.1)


def test_build_profile_picks_faster_fp16_per_shape():
    rows = []
    for ctx, t_sdpa, t_tri in ((1024, 20.0, 15.0), (4096, 40.0, 45.0), (16384, 130.0, 140.0)):
        for k, t in (("torch_sdpa_fp16", t_sdpa), ("fp16_triton", t_tri)):
            rows.append({"phase": "decode", "kernel": k, "batch": "8", "context_len": str(ctx), "q_heads": "64",
                         "partition": "0", "units": str(8 * ctx * 8 * 128 * 2), "time_us": str(t), "held_out": "False"})
    peaks = {"memory_gbps": 4000.0, "fp16_tflops": 700.0, "int8_tops": 900.0, "fp8_tflops": None,
             "launch_overhead_s": 5e-6}
    prof = build_profile(rows, peaks, {"git_rev": "x"})
    f = prof["kernels"]["decode_attn.fp16"]
    for ctx, t in ((1024, 15.0), (4096, 40.0), (16384, 130.0)):
        pred = (f["overhead_s"] + f["s_per_unit"] * 8 * ctx * 8 * 128 * 2) * 1e6
        assert pred == pytest.approx(t, rel=0.15)
    assert '"fp16_triton": 1' in prof["provenance"]["notes"]


@pytest.mark.parametrize("key", ("h200",) + TARGETS)
def test_committed_profiles_hold_the_contract(key):
    prof = json.loads((PROFILES / key / "profile.json").read_text())
    assert prof["schema_version"] == 1 and prof["gpu"] == key
    assert prof["source"] == ("measured" if key == "h200" else "derived")
    assert prof["derived_from"] == (None if key == "h200" else "h200")
    for k in REQUIRED:
        fit_ = prof["kernels"][k]
        assert fit_["overhead_s"] >= 0 and fit_["s_per_unit"] > 0
    assert prof["memory_gbps"] > 0 and prof["matmul_fp16_tflops"] > 0
    assert prof["provenance"]["notes"]


@pytest.mark.parametrize("key", TARGETS)
def test_derived_profiles_record_the_catalog_peaks(key):
    """A derived profile's GPU figures are the catalog's, for its own GPU and for the GPU it was derived from:
    this fails when catalog/data/gpus.yaml changes and the profiles were not re-derived."""
    prof = json.loads((PROFILES / key / "profile.json").read_text())
    assert prof["catalog"]["gpu"] == catalog_peaks(key)
    assert prof["catalog"]["source_gpu"] == catalog_peaks(prof["derived_from"])


@pytest.mark.parametrize("key", TARGETS)
def test_committed_derived_profiles_are_what_derive_writes(key):
    """No hand edits: each committed derived profile is derive.py's output from the committed H200 profile."""
    src = json.loads((PROFILES / "h200" / "profile.json").read_text())
    committed = json.loads((PROFILES / key / "profile.json").read_text())
    assert json.loads(json.dumps(derive(src, key))) == committed


def test_derivation_models_sm_below_80():
    src = json.loads((PROFILES / "h200" / "profile.json").read_text())
    v100, a100 = derive(src, "v100"), derive(src, "a100_40gb")
    assert v100["matmul_int8_tops"] is None
    assert "FMA" in v100["provenance"]["notes"]
    units = 5.4e8
    t = {g: {k: p["kernels"][k]["s_per_unit"] * units for k in ("decode_attn.hack", "decode_attn.fp16")}
         for g, p in (("v100", v100), ("a100", a100))}
    # HACK's INT8 dots on V100 run on CUDA cores: slower than FP16 there, faster than FP16 on A100
    assert t["v100"]["decode_attn.hack"] > t["v100"]["decode_attn.fp16"]
    assert t["a100"]["decode_attn.hack"] < t["a100"]["decode_attn.fp16"]
    # memory-bound kernels scale with bandwidth
    assert (a100["kernels"]["decode_attn.fp16"]["s_per_unit"] / src["kernels"]["decode_attn.fp16"]["s_per_unit"]
            == pytest.approx(src["memory_gbps"] / a100["memory_gbps"], rel=1e-3))


def test_committed_h200_profile_refits_from_its_committed_rows(tmp_path):
    """profiles/h200/profile.json is what --fit-only makes of the committed rows (kernels from
    profile_rows.csv, GEMM and elementwise fits from dense_rows.csv beside it): no hand edits."""
    import json

    from kernels_calibration.profile import main

    h200 = Path(__file__).resolve().parents[2] / "kernels_calibration" / "profiles" / "h200"
    assert main(["--fit-only", str(h200 / "profile_rows.csv"), "--out", str(tmp_path)]) == 0
    new, old = json.loads((tmp_path / "profile.json").read_text()), json.loads((h200 / "profile.json").read_text())
    assert new["gemm"] == old["gemm"] and set(new["kernels"]) == set(old["kernels"])
    for key, fit in old["kernels"].items():
        assert new["kernels"][key]["s_per_unit"] == pytest.approx(fit["s_per_unit"], rel=1e-9), key
        assert new["kernels"][key]["overhead_s"] == pytest.approx(fit["overhead_s"], rel=1e-9, abs=1e-15), key


def test_bench_hack_only_merges_rows_in_place(tmp_path):
    """bench --hack-only: re-measured rows replace the table's rows of the same kernel, phase,
    context and PI where they stand; rows the table lacks are appended; the rest is untouched."""
    import csv

    from kernels_calibration.bench import COLUMNS, merge_rows

    table = Path(__file__).resolve().parents[2] / "kernels_calibration" / "profiles" / "h200" / "bench_attention.csv"
    old = list(csv.DictReader(table.open()))
    hack = [r for r in old if r["kernel"] == "hack" and r["phase"] == "decode"]
    new = [dict(r, time_us=1.5) for r in hack] + [dict(hack[0], context_len=777, time_us=2.5)]
    rows = merge_rows(new, table)
    assert len(rows) == len(old) + 1 and set(rows[0]) >= set(COLUMNS)
    for before, after in zip(old, rows):
        assert (before["kernel"], before["context_len"], before["partition"]) == \
            (after["kernel"], str(after["context_len"]), str(after["partition"]))
        assert after["time_us"] == (1.5 if before in hack else float(before["time_us"]))
    assert rows[-1]["context_len"] == 777 and rows[-1]["time_us"] == 2.5


def test_profile_fit_only_later_rows_replace_earlier(tmp_path):
    """profile --fit-only OLD NEW: NEW's rows take the place of OLD's rows of the same kernel and shape
    (a faster or a slower re-measurement alike); rows differing in a variant column stay apart."""
    import csv

    from kernels_calibration.profile import merge_rows

    path = Path(__file__).resolve().parents[2] / "kernels_calibration" / "profiles" / "h200" / "profile_rows.csv"
    old = list(csv.DictReader(path.open()))
    hack = [r for r in old if r["kernel"] == "hack" and r["phase"] == "decode"]
    # slower: still replaces; a new rows.csv may lack columns the old one has empty (scoring variants)
    new = [{k: v for k, v in dict(r, time_us=str(float(r["time_us"]) * 3)).items() if v != ""} for r in hack]
    rows = merge_rows([old, new])
    assert len(rows) == len(old)
    got = {(r["batch"], r["context_len"], r["q_heads"], r["partition"]): r["time_us"] for r in rows
           if r["kernel"] == "hack" and r["phase"] == "decode"}
    assert got == {(r["batch"], r["context_len"], r["q_heads"], r["partition"]): r["time_us"] for r in new}
    variants = [r for r in old if r["phase"] == "score"]
    assert len(merge_rows([variants, variants])) == len(variants)


def test_profile_only_rejects_unknown_groups(tmp_path, capsys):
    from kernels_calibration.profile import main

    with pytest.raises(SystemExit) as e:
        main(["--only", "hack,nope", "--out", str(tmp_path / "p")])
    assert e.value.code == 2 and "unknown group(s) ['nope']" in capsys.readouterr().err
    assert not (tmp_path / "p").exists()
