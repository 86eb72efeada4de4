"""The derivation worked by hand from a made-up source profile and the datasheet figures typed in here: a bug in
derive.py (or in the unit rates it uses) that is committed together with regenerated profiles still fails here,
where the tests that compare with the committed profiles would not.

The rule (kernels_calibration/derive.py): the source's measured efficiencies are copy / 4800 GB/s and FP16 GEMM /
989.4 TFLOP/s (the H200's catalog peaks); a unit's rate on a GPU is its peak times that efficiency (tensor peaks
also times sustained / boost clock), the SFU 16 results and the ALU 4 x 32 lanes per SM per clock; a kernel's
source time per unit is split into its known parts (bytes, tensor and SFU work at the source's rates) and the
ALU rest, and each part is multiplied by source rate / target rate of its unit."""

from __future__ import annotations

import functools

import pytest

from kernels_calibration.derive import derive

# per-unit seconds are 1e-15 to 1e-12: pytest.approx's default absolute tolerance (1e-12) would pass anything
approx = functools.partial(pytest.approx, abs=0)

# a source profile no GPU produced: round numbers, so every step below can be followed by hand
SRC = {
    "memory_gbps": 4000.0,  # of the H200's 4800: efficiency 5/6
    "matmul_fp16_tflops": 700.0,  # of 989.4
    "matmul_fp8_tflops": 1400.0,
    "launch_overhead_s": 5e-6,
    "kernels": {
        "decode_attn.fp16": {"overhead_s": 4e-6, "s_per_unit": 6e-13},
        "prefill_attn.hack": {"overhead_s": 1e-5, "s_per_unit": 3e-15},
        "quantize.kv": {"overhead_s": 3e-6, "s_per_unit": 1e-13},
    },
    "provenance": {},
}
EFF_MEM, EFF_TENSOR = 4000 / 4800, 700 / 989.4
# the H200 (source): copy, FP16 and INT8 tensor, SFU and ALU rates
H200 = {
    "hbm": 4000e9,
    "fp16": 700e12,
    "int8": 1978.9e12 * EFF_TENSOR,
    "sfu": 132 * 1.98e9 * 16,
    "alu": 132 * 1.98e9 * 4 * 32,
}
# decode_attn.fp16 per KV element: 2 B, 2 x 16 FLOPs (8 query heads padded to an MMA's 16 rows), 8/256 exp
FP16_DECODE = {"hbm": 2.0, "fp16": 32.0, "sfu": 8 / 256}


def test_a_memory_bound_kernel_on_the_a100_80gb():
    """decode_attn.fp16 on the A100 80 GB (2039 GB/s, 312 TFLOP/s, 108 SMs at 1.41 GHz)."""
    src_parts = {u: FP16_DECODE[u] / H200[u] for u in FP16_DECODE}  # 5.0e-13, 4.571e-14, 7.473e-15
    assert src_parts["hbm"] == approx(5.0e-13) and src_parts["fp16"] == approx(4.5714e-14, rel=1e-4)
    alu_src = 6e-13 - sum(src_parts.values())  # 4.682e-14 s of CUDA-core work per unit
    assert alu_src == approx(4.6813e-14, rel=1e-4)
    a100 = {
        "hbm": 2039e9 * EFF_MEM,
        "fp16": 312e12 * EFF_TENSOR,
        "sfu": 108 * 1.41e9 * 16,
        "alu": 108 * 1.41e9 * 4 * 32,
    }
    want = {u: FP16_DECODE[u] / a100[u] for u in FP16_DECODE} | {"alu": alu_src * H200["alu"] / a100["alu"]}
    assert want["hbm"] == approx(1.17705e-12, rel=1e-5)  # 2 B at 1699.2 GB/s
    assert want["alu"] == approx(8.0349e-14, rel=1e-4)
    k = derive(SRC, "a100_80gb")["kernels"]["decode_attn.fp16"]
    got = k["parts_s_per_unit"]
    assert got["hbm"] == approx(want["hbm"], rel=1e-9)
    assert got["fp16_tensor"] == approx(want["fp16"], rel=1e-9)
    assert got["sfu"] == approx(want["sfu"], rel=1e-9)
    assert got["alu"] == approx(want["alu"], rel=1e-9)
    assert got["int8_tensor"] == 0.0
    assert k["s_per_unit"] == approx(1.41525e-12, rel=1e-4) and k["bound_by"] == "hbm"
    assert k["overhead_s"] == 4e-6  # the source's launch overhead, kept


def test_int8_work_without_int8_tensor_cores_runs_at_the_fp16_rate():
    """prefill_attn.hack (1 INT8 op and 1/512 exp per unit) on the V100 (125 TFLOP/s FP16, no INT8 tensor cores,
    80 SMs at 1.53 GHz): the INT8 part moves to the FP16 tensor rate, 1 / (125e12 x 0.7075) s per op."""
    src_int8 = 1 / H200["int8"]
    src_sfu = (1 / 512) / H200["sfu"]
    alu_src = 3e-15 - src_int8 - src_sfu  # 1.819e-15
    v100 = {"fp16": 125e12 * EFF_TENSOR, "sfu": 80 * 1.53e9 * 16, "alu": 80 * 1.53e9 * 4 * 32}
    got = derive(SRC, "v100")["kernels"]["prefill_attn.hack"]["parts_s_per_unit"]
    assert got["int8_tensor"] == approx(1 / v100["fp16"], rel=1e-9)  # 1.1308e-14
    assert got["int8_tensor"] == approx(1.13075e-14, rel=1e-4)
    assert got["sfu"] == approx((1 / 512) / v100["sfu"], rel=1e-9)
    assert got["alu"] == approx(alu_src * H200["alu"] / v100["alu"], rel=1e-9)
    assert got["alu"] == approx(3.8834e-15, rel=1e-3)


def test_a_power_capped_part_runs_its_clock_bound_units_at_the_sustained_clock():
    """T4: 0.9 GHz sustained of a 1.59 GHz boost (65 TFLOP/s FP16 at boost, 320 GB/s, 40 SMs): tensor, SFU and
    ALU rates at 0.9 GHz, the copy bandwidth untouched."""
    t4 = {
        "hbm": 320e9 * EFF_MEM,
        "fp16": 65e12 * EFF_TENSOR * 0.9 / 1.59,
        "sfu": 40 * 0.9e9 * 16,
        "alu": 40 * 0.9e9 * 4 * 32,
    }
    prof = derive(SRC, "t4")
    got = prof["kernels"]["decode_attn.fp16"]["parts_s_per_unit"]
    for unit, field in (("hbm", "hbm"), ("fp16", "fp16_tensor"), ("sfu", "sfu")):
        assert got[field] == approx(FP16_DECODE[unit] / t4[unit], rel=1e-9), unit
    alu_src = 6e-13 - sum(FP16_DECODE[u] / H200[u] for u in FP16_DECODE)
    assert got["alu"] == approx(alu_src * H200["alu"] / t4["alu"], rel=1e-9)
    assert prof["matmul_fp16_tflops"] == approx(round(65 * EFF_TENSOR * 0.9 / 1.59, 1))  # 26.0
    assert prof["memory_gbps"] == approx(round(320 * EFF_MEM, 1))  # 266.7


def test_known_work_above_the_measured_time_is_scaled_down_to_it():
    """quantize.kv moves 2 B + 0.328125 B (2-bit codes, FP16 min and scale and a uint8 sum per 64) per element:
    2.328125 / 4000e9 = 5.82e-13 s at the source's copy rate, above its measured 1e-13 (the kernel overlapped):
    the known part is scaled to 1e-13 and the ALU gets nothing; on the H100 (3350 GB/s) it costs
    1e-13 x 4800 / 3350."""
    got = derive(SRC, "h100")["kernels"]["quantize.kv"]
    assert got["source_parts_s_per_unit"]["hbm"] == approx(1e-13, rel=1e-12)
    assert got["source_parts_s_per_unit"]["alu"] == 0.0
    assert got["s_per_unit"] == approx(1e-13 * 4800 / 3350, rel=1e-9)


def test_a_gpu_outside_the_catalog_is_derived_from_its_short_spec():
    """derive_for takes any GPU's completed fields: an RTX 3090 given by its short spec (71 TFLOP/s FP16, 936 GB/s,
    82 SMs at 1.695 GHz) prices decode_attn.fp16's bytes at 936 x 5/6 GB/s and its ALU work at 82 x 1.695 GHz."""
    from costmodel.specs import GPUSpec, complete_gpu_fields
    from kernels_calibration.derive import derive_for, peaks_of

    fields, derived = complete_gpu_fields(
        {"memory_bytes": 25_327_697_920, "memory_bandwidth_gb_per_s": 936, "fp16_tensor_tflops": 71, "sms": 82,
         "boost_clock_ghz": 1.695, "name": "rtx3090"}
    )  # fmt: skip
    assert "fp32_tflops" in derived and "memory_bytes" not in derived
    prof = derive_for(SRC, GPUSpec.from_fields("rtx3090", fields), peaks_of(fields), "rtx3090")
    got = prof["kernels"]["decode_attn.fp16"]["parts_s_per_unit"]
    assert got["hbm"] == approx(2.0 / (936e9 * EFF_MEM), rel=1e-9)
    alu_src = 6e-13 - sum(FP16_DECODE[u] / H200[u] for u in FP16_DECODE)
    assert got["alu"] == approx(alu_src * H200["alu"] / (82 * 1.695e9 * 128), rel=1e-9)
    assert prof["gpu"] == "rtx3090" and prof["catalog"]["gpu"]["fp32_tflops"] == approx(2 * 82 * 128 * 1.695e-3)
