"""The fitted and derived profiles: the fit recovers a known line, the committed profiles hold every
kernel key the cost model requires, and the derivation models what sm < 80 GPUs really do."""

import functools
import json
from pathlib import Path

import pytest

from kernels_calibration.derive import MEASURED, TARGETS, catalog_peaks, derive
from kernels_calibration.profile import build_profile, fit

# seconds per unit are 1e-15 to 1e-12: pytest.approx's default absolute tolerance (1e-12) would pass anything
approx = functools.partial(pytest.approx, abs=0)
PROFILES = Path(__file__).resolve().parents[2] / "kernels_calibration" / "profiles"
REQUIRED = [
    f"decode_attn.{v}" for v in ("fp16", "fp8", "dequant_fused", "dequant_unfused", "hack", "hack_no_se", "hack_no_rqe")
] + ["prefill_attn.fp16", "prefill_attn.hack", "quantize.kv", "dequantize.kv"]


def test_fit_recovers_line_and_reports_heldout_error():
    pts = [(u, 5e-6 + 2e-13 * u, i % 3 == 0) for i, u in enumerate([1e6, 3e6, 1e7, 3e7, 1e8, 3e8, 1e9])]
    f = fit(pts)
    assert f["overhead_s"] == approx(5e-6, rel=1e-6)
    assert f["s_per_unit"] == approx(2e-13, rel=1e-6)
    assert f["heldout_median_error_pct"] < 1e-6
    # a 10% bump on the held-out points shows up as ~10% error
    bumped = [(u, t * (1.1 if h else 1.0), h) for u, t, h in pts]
    assert fit(bumped)["heldout_median_error_pct"] == approx(100 * 0.1 / 1.1, abs=0.1)


def test_build_profile_picks_faster_fp16_per_shape():
    rows = []
    for ctx, t_sdpa, t_tri in ((1024, 20.0, 15.0), (4096, 40.0, 45.0), (16384, 130.0, 140.0)):
        for k, t in (("torch_sdpa_fp16", t_sdpa), ("fp16_triton", t_tri)):
            rows.append(
                {
                    "phase": "decode",
                    "kernel": k,
                    "batch": "8",
                    "context_len": str(ctx),
                    "q_heads": "64",
                    "partition": "0",
                    "units": str(8 * ctx * 8 * 128 * 2),
                    "time_us": str(t),
                    "held_out": "False",
                }
            )
    peaks = {
        "memory_gbps": 4000.0,
        "fp16_tflops": 700.0,
        "int8_tops": 900.0,
        "fp8_tflops": None,
        "launch_overhead_s": 5e-6,
    }
    prof = build_profile(rows, peaks, {"git_rev": "x"})
    f = prof["kernels"]["decode_attn.fp16"]
    for ctx, t in ((1024, 15.0), (4096, 40.0), (16384, 130.0)):
        pred = (f["overhead_s"] + f["s_per_unit"] * 8 * ctx * 8 * 128 * 2) * 1e6
        assert pred == approx(t, rel=0.15)
    assert '"fp16_triton": 1' in prof["provenance"]["notes"]


@pytest.mark.parametrize("key", MEASURED + TARGETS)
def test_committed_profiles_hold_the_contract(key):
    prof = json.loads((PROFILES / key / "profile.json").read_text())
    assert prof["schema_version"] == 1 and prof["gpu"] == key
    assert prof["source"] == ("measured" if key in MEASURED else "derived")
    assert prof["derived_from"] == (None if key in MEASURED else "h200")
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


def test_derivation_splits_each_kernel_by_unit_and_reprices_the_parts():
    """Each derived kernel is its H200 time split by unit (known bytes, tensor and SFU work; the rest on the
    ALU), each part moved by the ratio of the two GPUs' rates for that unit; the parts add up."""
    from costmodel.kernel_work import UNITS, WORK, reprice, split, unit_rates
    from kernels_calibration.derive import efficiencies, gpu

    src = json.loads((PROFILES / "h200" / "profile.json").read_text())
    eff = efficiencies(src)
    h200, a100 = unit_rates(gpu("h200"), *eff), unit_rates(gpu("a100_80gb"), *eff)
    prof = derive(src, "a100_80gb")
    for name, k in prof["kernels"].items():
        assert sum(k["parts_s_per_unit"].values()) == approx(k["s_per_unit"], rel=1e-12), name
        src_name = k["from"].removeprefix("the H200 ") if "from" in k else name
        if name != "decode_attn.fp8":  # the A100 has no FP8 hardware: software conversion adds ALU work
            assert sum(k["source_parts_s_per_unit"].values()) == approx(
                src["kernels"][src_name]["s_per_unit"], rel=1e-9
            ), name
        assert k["bound_by"] in UNITS
    # by hand for the Triton HACK kernel that runs on the A100: bytes at the copy bandwidth, the rest on the ALU
    h = src["kernels"]["decode_attn.hack_triton"]["s_per_unit"]
    parts = split(WORK["decode_attn.hack_triton"], h, h200)
    assert parts["hbm"] == approx(0.328125 / 4220.4e9, rel=1e-4)
    assert parts["alu"] == approx(h - parts["hbm"] - parts["int8_tensor"] - parts["sfu"])
    want = reprice(parts, h200, a100)
    assert want["hbm"] == approx(parts["hbm"] * 4800 / 2039, rel=1e-9)  # bandwidth ratio
    assert want["alu"] == approx(parts["alu"] * (132 * 1.98) / (108 * 1.41), rel=1e-9)  # issue-rate ratio
    assert prof["kernels"]["decode_attn.hack"]["s_per_unit"] == approx(sum(want.values()))
    assert prof["kernels"]["decode_attn.hack"]["from"] == "the H200 decode_attn.hack_triton"


def test_no_int8_tensor_cores_prices_the_homomorphic_products_on_fp16_tensor_cores():
    """V100: INT8 work runs at the FP16 tensor rate (exact, kernel_work), not on CUDA cores, so HACK decode
    is faster than FP16 decode there as on every other GPU (its 6x fewer bytes), and HACK prefill's INT8
    part costs what an FP16 product of the same shape costs."""
    src = json.loads((PROFILES / "h200" / "profile.json").read_text())
    v100 = derive(src, "v100")
    assert v100["matmul_int8_tops"] is None and "FP16 tensor cores" in v100["provenance"]["notes"]
    k = v100["kernels"]
    units = 8 * 32768 * 8 * 128 * 2
    assert k["decode_attn.hack"]["s_per_unit"] * units < k["decode_attn.fp16"]["s_per_unit"] * units
    pre = k["prefill_attn.hack"]
    assert pre["parts_s_per_unit"]["int8_tensor"] == approx(
        pre["work_per_unit"]["int8_tensor_ops"] / (v100["unit_rates"]["gpu"]["fp16_tensor_tflops"] * 1e12), rel=1e-3
    )
    # memory-bound kernels scale with bandwidth
    a100 = derive(src, "a100_40gb")
    ratio = a100["kernels"]["decode_attn.fp16"]["s_per_unit"] / src["kernels"]["decode_attn.fp16"]["s_per_unit"]
    assert ratio == approx(4800 / 1555, rel=0.02)


def test_integer_products_are_exact_on_fp16_inputs_with_fp32_accumulation():
    """The claim behind pricing V100's homomorphic products on FP16 tensor cores: 2-bit codes and INT8 values
    are exact in FP16, and their dot products over d = 128 (and a PI-token block) are exact in FP32."""
    import numpy as np

    rng = np.random.default_rng(0)
    q = rng.integers(-128, 128, size=(64, 128))  # INT8 query
    k = rng.integers(0, 4, size=(128, 512))  # 2-bit K codes
    p = rng.integers(0, 256, size=(64, 64))  # softmax quantized to 8 bits (unsigned)
    v = rng.integers(0, 4, size=(64, 128))  # 2-bit V codes, one PI = 64 block
    extremes = ((np.full((8, 128), -128), np.full((128, 8), 3)), (np.full((8, 64), 255), np.full((64, 8), 3)))
    for a, b in ((q, k), (p, v)) + extremes:
        exact = a.astype(np.int64) @ b.astype(np.int64)
        fp16_in = a.astype(np.float16).astype(np.float32) @ b.astype(np.float16).astype(np.float32)
        assert np.array_equal(fp16_in.astype(np.int64), exact)
        assert np.abs(exact).max() < 2**24


def test_derive_reference_prints_what_kernel_work_keeps(capsys):
    """`python -m kernels_calibration.derive --reference` prints the Python that costmodel/kernel_work.py keeps
    as REFERENCE_RATES and REFERENCE_PARTS: run as code, it gives the committed values (to its 4-7 digits)."""
    from costmodel.kernel_work import REFERENCE_PARTS, REFERENCE_RATES, UnitRates
    from kernels_calibration.derive import print_reference

    print_reference(json.loads((PROFILES / "h200" / "profile.json").read_text()))
    namespace: dict = {"UnitRates": UnitRates}
    exec(capsys.readouterr().out, namespace)
    for unit in ("hbm", "fp16_tensor", "int8_tensor", "sfu", "alu"):
        assert getattr(namespace["REFERENCE_RATES"], unit) == approx(getattr(REFERENCE_RATES, unit), rel=1e-5)
    assert namespace["REFERENCE_PARTS"].keys() == REFERENCE_PARTS.keys()
    for name, p in namespace["REFERENCE_PARTS"].items():
        assert p == approx(REFERENCE_PARTS[name], rel=1e-3, abs=1e-30), name


def test_roofline_prices_kernels_like_the_derivation():
    """The roofline reprices the same H200 split (kernel_work.REFERENCE_PARTS, which must match the committed
    H200 profile), so for every catalog GPU it agrees with the derived profile's per-unit costs."""
    from costmodel.kernel_work import REFERENCE_PARTS, REFERENCE_RATES
    from costmodel.roofline import roofline_s_per_unit
    from kernels_calibration.derive import gpu, reference_parts

    src = json.loads((PROFILES / "h200" / "profile.json").read_text())
    rates, parts = reference_parts(src)
    for unit in ("hbm", "fp16_tensor", "int8_tensor", "sfu", "alu"):
        assert getattr(REFERENCE_RATES, unit) == approx(getattr(rates, unit), rel=1e-5)
    assert set(REFERENCE_PARTS) == set(parts)
    for name, p in parts.items():
        for unit, t in p.items():
            assert REFERENCE_PARTS[name][unit] == approx(t, rel=1e-3, abs=1e-30), (name, unit)
    for key in ("h200",) + TARGETS:
        prof = derive(src, key) if key != "h200" else src
        for name, spu in roofline_s_per_unit(gpu(key)).items():
            assert spu == approx(prof["kernels"][name]["s_per_unit"], rel=2e-3), (key, name)


def test_docs_table_is_what_derive_computes():
    """The HACK/FP16 table of docs/methods.md ("Derived profiles") is derive.py's output for every catalog GPU (the
    H100's derived row included: its measured one is tests/kernels/test_derive_h100.py's)."""
    import re

    from kernels_calibration.derive import ratio_rows

    src = json.loads((PROFILES / "h200" / "profile.json").read_text())
    rows = {r["gpu"]: r for r in ratio_rows({k: derive(src, k) for k in MEASURED + TARGETS})}
    page = (PROFILES.parents[1] / "docs" / "methods.md").read_text()
    found = 0
    for line in page.splitlines():
        m = re.match(r"\| (\w+) \| ([\d.]+)x \| ([\d.]+)x \| ([\d.]+)x \| ([\d.]+)x \|", line)
        if m and m.group(1) in rows:
            r = rows[m.group(1)]
            got = [float(x) for x in m.groups()[1:]]
            want = [r["decode_4096"], r["decode_32768"], r["prefill_4096"], r["prefill_32768"]]
            assert got == approx([round(w, 2) for w in want], abs=0.006), m.group(1)
            found += 1
    assert found == len(rows)


# The fitted numbers a least-squares solve gives: numpy's LAPACK picks BLAS kernels for the CPU, whose
# summation order moves the last bits (OpenBLAS's Haswell and Sandybridge kernels are up to 5 ulps apart on
# the H200 rows).  Every other field of a refit must be equal.
SOLVER_FIELDS = ("overhead_s", "s_per_unit", "graph_replay_intercept_s")
SOLVER_ULPS = 16


def _same_profile(new, old, path=""):
    import math

    if isinstance(old, dict):
        assert isinstance(new, dict) and set(new) == set(old), (path, sorted(set(new) ^ set(old)))
        for k in old:
            _same_profile(new[k], old[k], f"{path}.{k}")
    elif path.rsplit(".", 1)[-1] in SOLVER_FIELDS and isinstance(old, float) and old:
        assert abs(new - old) <= SOLVER_ULPS * math.ulp(old), (path, new, old)
    else:
        assert new == old and type(new) is type(old), (path, new, old)


@pytest.mark.parametrize("key", MEASURED)
def test_committed_measured_profile_refits_exactly_from_its_committed_rows(tmp_path, key):
    """profiles/<key>/profile.json carries its own provenance and is what its recorded command makes of
    the files it names: they lie beside it with the recorded hashes and row counts, and running the
    command again gives the same profile, field for field (the solver's fitted floats to its last-bit
    rounding, SOLVER_ULPS), provenance included.  No hand edits."""
    import hashlib
    import shlex

    from kernels_calibration.profile import ROOT, main

    folder = PROFILES / key
    old = json.loads((folder / "profile.json").read_text())
    prov = old["provenance"]
    for k in ("gpu_name", "driver", "torch", "triton", "git_rev", "date", "command", "fitted_from", "row_revisions"):
        assert prov.get(k), k
    assert set(prov["fitted_from"]) == {
        "profile_rows.csv",
        "dense_rows.csv",
        "stepprof_8b.csv",
        "stepprof_70b8l.csv",
        "peaks.json",
    }
    for name, rec in prov["fitted_from"].items():
        data = (folder / name).read_bytes()
        assert hashlib.sha256(data).hexdigest() == rec["sha256"], name
        if "rows" in rec:
            assert rec["rows"] == data.decode().strip().count("\n"), name
    cmd = shlex.split(prov["command"])
    assert cmd[:3] == ["python", "-m", "kernels_calibration.profile"]
    args = [str(ROOT / a) if (ROOT / a).exists() else a for a in cmd[3:]]
    assert main(args + ["--out", str(tmp_path)]) == 0
    _same_profile(json.loads((tmp_path / "profile.json").read_text()), old)


def test_profile_comparison_catches_a_changed_fit():
    """The refit test's comparison fails on a fit that moved by more than the solver's rounding, and on
    any other field that differs."""
    prof = json.loads((PROFILES / "h200" / "profile.json").read_text())
    moved = json.loads(json.dumps(prof))
    moved["kernels"]["decode_attn.hack"]["s_per_unit"] *= 1 + 1e-12
    with pytest.raises(AssertionError):
        _same_profile(moved, prof)
    noted = json.loads(json.dumps(prof))
    noted["provenance"]["command"] += " --quick"
    with pytest.raises(AssertionError):
        _same_profile(noted, prof)


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
        assert (before["kernel"], before["context_len"], before["partition"]) == (
            after["kernel"],
            str(after["context_len"]),
            str(after["partition"]),
        )
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
    got = {
        (r["batch"], r["context_len"], r["q_heads"], r["partition"]): r["time_us"]
        for r in rows
        if r["kernel"] == "hack" and r["phase"] == "decode"
    }
    assert got == {(r["batch"], r["context_len"], r["q_heads"], r["partition"]): r["time_us"] for r in new}
    variants = [r for r in old if r["phase"] == "score"]
    assert len(merge_rows([variants, variants])) == len(variants)


def test_profile_only_rejects_unknown_groups(tmp_path, capsys):
    from kernels_calibration.profile import main

    with pytest.raises(SystemExit) as e:
        main(["--only", "hack,nope", "--out", str(tmp_path / "p")])
    assert e.value.code == 2 and "unknown group(s) ['nope']" in capsys.readouterr().err
    assert not (tmp_path / "p").exists()


def test_rows_at_another_gqa_group_fit_their_own_key():
    """Decode rows at 4 query heads per KV head fit decode_attn.<key>_gqa4 and leave the group-8 fit
    (the contract's unit) as the group-8 rows alone make it; rows that time an engine's append + attend
    (phase decode_ragged) are kept beside the fits, not fitted."""

    def row(heads, b, ctx, t_us, phase="decode", kernel="hack"):
        hq, hkv = heads
        return {
            "phase": phase,
            "kernel": kernel,
            "batch": str(b),
            "context_len": str(ctx),
            "q_heads": str(hq),
            "kv_heads": str(hkv),
            "partition": "64",
            "bits": "2",
            "held_out": "False",
            "units": str(b * ctx * hkv * 128 * 2),
            "time_us": str(t_us),
        }

    g8 = [row((64, 8), b, c, 10 + 1.5e-7 * b * c * 8 * 256) for b, c in ((1, 2048), (8, 4096), (16, 16384))]
    g4 = [row((32, 8), b, c, 13 + 9e-7 * b * c * 8 * 256) for b, c in ((1, 2048), (8, 4096), (16, 16384))]
    ragged = [row((32, 8), 8, 2304, 500.0, phase="decode_ragged", kernel="hack_append_attend")]
    peaks = {
        "memory_gbps": 4000.0,
        "fp16_tflops": 700.0,
        "int8_tops": 900.0,
        "fp8_tflops": None,
        "launch_overhead_s": 5e-6,
    }
    alone = build_profile(g8, peaks, {"git_rev": "x"})["kernels"]
    both = build_profile(g8 + g4 + ragged, peaks, {"git_rev": "x"})["kernels"]
    assert both["decode_attn.hack"] == alone["decode_attn.hack"]
    assert both["decode_attn.hack_gqa4"]["s_per_unit"] == approx(9e-13, rel=1e-6)
    assert both["decode_attn.hack_gqa4"]["overhead_s"] == approx(13e-6, rel=1e-6)
    assert not any("ragged" in k or "append" in k for k in both)


def test_measure_gqa4_and_append_attend_run_on_the_cpu(monkeypatch):
    """The device measurement's code path at tiny shapes under the interpreter, the timer replaced: the
    GQA-4 decode step and an engine's append + attend over ragged lengths produce rows in the contract's
    units (sum of the attended lengths x KV heads x head_dim x 2)."""
    from kernels_calibration import measure

    monkeypatch.setattr(measure, "ROT_BYTES", 1)
    ran = []

    def one_pass(step, n_rot, replays=30):
        for i in range(n_rot):
            step(i)
        ran.append(n_rot)
        return 1e-5

    monkeypatch.setattr(measure, "time_graph", one_pass)
    (m,) = measure.measure_decode(("hack",), 2, 150, 4, 1, 128, 64, device="cpu")
    assert (m.q_heads, m.kv_heads, m.units) == (4, 1, 2 * 151 * 1 * 128 * 2)
    r = measure.measure_append_attend(3, 300, 4, 1, ragged=True, device="cpu")
    assert measure.ragged_lens(3, 300) == [75, 187, 299]
    assert r.phase == "decode_ragged" and r.units == (76 + 188 + 300) * 128 * 2
    assert ran == [1, 1]
