"""The roofline calibration profile: what the cost model uses for a GPU with no measured or derived profile.

It prices each kernel the way kernels_calibration/derive.py derives a profile (costmodel/kernel_work.py):
the measured H200 kernel's time per unit split by unit (HBM bytes, FP16 tensor, INT8 tensor, SFU, CUDA-core
ALU; ``REFERENCE_PARTS``), each part repriced at this GPU's rate for its unit.  The GPU's rates come from
its catalog figures times the H200's measured fractions of its peaks (``ROOFLINE_MEMORY_EFFICIENCY``,
``ROOFLINE_MATMUL_EFFICIENCY``); every launch costs ``ROOFLINE_LAUNCH_OVERHEAD_S``.  Where the GPU has no
INT8 tensor cores the homomorphic products run on its FP16 tensor cores (exact; kernel_work says why).
Nothing here comes from a paper's end-to-end result.

Before Hopper the Gluon decode kernels do not run, so the HACK and fused-dequant decode keys take their
Triton twins' split; FP8 KV without FP8 hardware adds kernel_work's software-conversion instructions.

``DEQUANT_INSTR_PER_ELEMENT`` and ``FP8_CONVERT_INSTR_PER_ELEMENT`` price FP4's emulated dequantization
(methods.FP4) at the CUDA-core rate ``alu_instr_per_s``: the fused dequantize-then-attend Triton kernel costs
2.95e-13 s per KV element on the H200 (decode_attn.dequant_fused_triton), ≈9.9 instruction slots at
33.5 T/s; the hardware FP8 -> FP16 convert is 2 per element.
"""

from __future__ import annotations

from .calibration import (
    ROOFLINE_LAUNCH_OVERHEAD_S,
    ROOFLINE_MATMUL_EFFICIENCY,
    ROOFLINE_MEMORY_EFFICIENCY,
    CalibrationProfile,
    KernelFit,
)
from .kernel_work import (
    FP8_CONVERT_INSTR_PER_ELEMENT,
    FP8_SOFTWARE_CONVERT_EXTRA_INSTR,
    REFERENCE_PARTS,
    REFERENCE_RATES,
    reprice,
    unit_rates,
)
from .specs import GPUSpec

DEQUANT_INSTR_PER_ELEMENT = 2.95e-13 * 33.5e12  # ≈9.9, the H200 fused-dequant Triton kernel
__all__ = ["DEQUANT_INSTR_PER_ELEMENT", "FP8_CONVERT_INSTR_PER_ELEMENT", "alu_instr_per_s", "roofline_profile"]

ROOFLINE_KERNELS = (
    "decode_attn.fp16",
    "decode_attn.fp8",
    "decode_attn.dequant_fused",
    "decode_attn.dequant_unfused",
    "decode_attn.hack",
    "decode_attn.hack_no_se",
    "decode_attn.hack_no_rqe",
    "prefill_attn.fp16",
    "prefill_attn.hack",
    "quantize.kv",
    "dequantize.kv",
    "decode_attn.hack_gqa4",
)
GLUON_KEYS = ("decode_attn.dequant_fused", "decode_attn.hack", "decode_attn.hack_no_se", "decode_attn.hack_no_rqe")
GLUON_MIN_COMPUTE_CAPABILITY = 9.0


def alu_instr_per_s(gpu: GPUSpec) -> float:
    """FP32 CUDA-core operation rate: FP32 TFLOP/s counts an FMA as two operations."""
    return gpu.fp32_tflops * 1e12 / 2.0


def roofline_s_per_unit(gpu: GPUSpec) -> dict[str, float]:
    """Seconds per unit of every roofline kernel on this GPU (and the Triton twins where Gluon runs)."""
    rates = unit_rates(gpu, ROOFLINE_MEMORY_EFFICIENCY, ROOFLINE_MATMUL_EFFICIENCY)
    gluon = float(gpu.compute_capability) >= GLUON_MIN_COMPUTE_CAPABILITY
    out = {}
    for key in ROOFLINE_KERNELS + (tuple(f"{k}_triton" for k in GLUON_KEYS) if gluon else ()):
        parts = dict(REFERENCE_PARTS[key if gluon or key not in GLUON_KEYS else f"{key}_triton"])
        if key == "decode_attn.fp8" and gpu.fp8_tensor_tflops is None:
            parts["alu"] += FP8_SOFTWARE_CONVERT_EXTRA_INSTR / REFERENCE_RATES.alu
        out[key] = sum(reprice(parts, REFERENCE_RATES, rates).values())
    return out


def roofline_profile(gpu: GPUSpec) -> CalibrationProfile:
    rates = unit_rates(gpu, ROOFLINE_MEMORY_EFFICIENCY, ROOFLINE_MATMUL_EFFICIENCY)
    o = ROOFLINE_LAUNCH_OVERHEAD_S
    kernels = {
        key: KernelFit(2 * o if key == "decode_attn.dequant_unfused" else o, spu)
        for key, spu in roofline_s_per_unit(gpu).items()
    }
    return CalibrationProfile(
        gpu=gpu.key,
        source="roofline",
        memory_gbps=rates.hbm / 1e9,
        matmul_fp16_tflops=rates.fp16_tensor / 1e12,
        matmul_int8_tops=None if rates.int8_tensor is None else rates.int8_tensor / 1e12,
        matmul_fp8_tflops=None if gpu.fp8_tensor_tflops is None else gpu.fp8_tensor_tflops * ROOFLINE_MATMUL_EFFICIENCY,
        launch_overhead_s=o,
        kernels=kernels,
        provenance={
            "notes": "roofline: the measured H200 kernels split by unit (costmodel/kernel_work.py), "
            "repriced at this GPU's catalog rates times the H200's measured efficiencies"
        },
    )
