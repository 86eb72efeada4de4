"""The roofline calibration profile: what the cost model uses for a GPU with no measured or derived profile.

Each kernel's time per unit is the larger of its bytes over achievable memory bandwidth and its
ALU instructions over the GPU's CUDA-core instruction rate (plus the tensor-core term where it
does matrix work). Every factor below is named and comes from a hardware fact or a measurement
on the lent H200, never from a paper's end-to-end result:

* `DEQUANT_INSTR_PER_ELEMENT`: the fused dequantize-then-attend kernel (kernels_calibration, table
  lookup in registers) costs 2.95e-13 s per KV element on the H200 (profile fit, session 4; 149 µs
  for 8 × 32K × 8 KV heads × 128 × 2 elements); at 33.5 T instructions/s (67 FP32 TFLOP/s ÷ 2 per
  FMA) that is ≈9.9 instruction slots per element.  (Issue 3's first probe, with integer-to-float
  conversions, took ≈240 µs: ≈15.)
* `HACK_INSTR_PER_ELEMENT`: the row-packed HACK decode kernel, 2.89e-13 s per element (135.5 µs at
  the same shape): ≈9.7.  (The first INT8 probe: ≈184 µs, ≈11.5.)
* `ROOFLINE_ATTENTION_EFFICIENCY`: FlashAttention-2's forward pass reaches 50-73 % of dense
  tensor peak on A100/H100 (Dao, arXiv 2307.08691, fig. 4-6); 0.6 is the middle.
"""
from __future__ import annotations

from .calibration import (
    ROOFLINE_INT8_EFFICIENCY,
    ROOFLINE_LAUNCH_OVERHEAD_S,
    ROOFLINE_MATMUL_EFFICIENCY,
    ROOFLINE_MEMORY_EFFICIENCY,
    CalibrationProfile,
    KernelFit,
)
from .specs import GPUSpec

DEQUANT_INSTR_PER_ELEMENT = 2.95e-13 * 33.5e12   # ≈9.9, the H200 fused-dequant kernel (profile, session 4)
HACK_INSTR_PER_ELEMENT = 2.89e-13 * 33.5e12      # ≈9.7, the H200 row-packed HACK decode kernel
FP8_CONVERT_INSTR_PER_ELEMENT = 2.0              # fp8 -> fp16 convert + pack, per element (hardware cvt)
FP8_SOFTWARE_CONVERT_INSTR_PER_ELEMENT = 6.0     # no FP8 hardware (before Ada/Hopper): shift, mask, bias, pack
QUANTIZE_INSTR_PER_ELEMENT = 30.0   # min/max, scale, round, pack, sum: twice the first dequantize probe (the
                                    # measured Triton quantize kernel is slower still, ~0.5 TB/s, not optimized)
ROOFLINE_ATTENTION_EFFICIENCY = 0.6
ROOFLINE_ALU_EFFICIENCY = 1.0     # folded into the measured instruction counts above
QUANT_BYTES_PER_ELEMENT = 0.25 + 5.0 / 64   # 2-bit codes + FP16 min/scale + uint8 sum per Π=64


def alu_instr_per_s(gpu: GPUSpec) -> float:
    """CUDA-core instruction rate: FP32 TFLOP/s counts an FMA as two operations."""
    return gpu.fp32_tflops * 1e12 / 2.0 * ROOFLINE_ALU_EFFICIENCY


def int8_dot_ops_per_s(gpu: GPUSpec) -> float:
    """INT8 dot rate: tensor cores where present, else DP4A on CUDA cores (V100)."""
    if gpu.int8_tensor_tops is not None:
        return gpu.int8_tensor_tops * 1e12 * ROOFLINE_INT8_EFFICIENCY
    return gpu.int8_dp4a_tops * 1e12 * ROOFLINE_INT8_EFFICIENCY


def roofline_profile(gpu: GPUSpec) -> CalibrationProfile:
    bw = gpu.memory_bandwidth_gb_per_s * 1e9 * ROOFLINE_MEMORY_EFFICIENCY    # bytes/s
    alu = alu_instr_per_s(gpu)
    fp16 = gpu.fp16_tensor_tflops * 1e12 * ROOFLINE_MATMUL_EFFICIENCY
    int8 = int8_dot_ops_per_s(gpu)

    def per_elem(bytes_: float, instr: float) -> float:
        return max(bytes_ / bw, instr / alu)

    fp16_decode = 2.0 / bw
    hack_decode = per_elem(QUANT_BYTES_PER_ELEMENT, HACK_INSTR_PER_ELEMENT)
    # Without SE each query head re-sums the codes: 2·d_h ops per token per query head, i.e.
    # (GQA group 8) · 2·d_h / (2·d_h elements per token per KV head) = 8 more per element.
    hack_no_se_decode = per_elem(QUANT_BYTES_PER_ELEMENT - 1.0 / 64, HACK_INSTR_PER_ELEMENT + 8.0)
    dequant = per_elem(QUANT_BYTES_PER_ELEMENT + 2.0, DEQUANT_INSTR_PER_ELEMENT)
    o = ROOFLINE_LAUNCH_OVERHEAD_S
    kernels = {
        "decode_attn.fp16": KernelFit(o, fp16_decode),
        "decode_attn.fp8": KernelFit(o, per_elem(1.0, FP8_CONVERT_INSTR_PER_ELEMENT if gpu.fp8_tensor_tflops
                                                 else FP8_SOFTWARE_CONVERT_INSTR_PER_ELEMENT)),
        "decode_attn.dequant_fused": KernelFit(o, per_elem(QUANT_BYTES_PER_ELEMENT, DEQUANT_INSTR_PER_ELEMENT)),
        "decode_attn.dequant_unfused": KernelFit(2 * o, dequant + fp16_decode),
        "decode_attn.hack": KernelFit(o, hack_decode),
        "decode_attn.hack_no_se": KernelFit(o, hack_no_se_decode),
        # Requantizing one Π-token V block per request per iteration is <1 % of the KV pass at
        # ≥8K context; measured profiles capture it, the roofline does not.
        "decode_attn.hack_no_rqe": KernelFit(o, hack_decode),
        "prefill_attn.fp16": KernelFit(o, 1.0 / (fp16 * ROOFLINE_ATTENTION_EFFICIENCY)),
        "prefill_attn.hack": KernelFit(o, 1.0 / (int8 * ROOFLINE_ATTENTION_EFFICIENCY)),
        "quantize.kv": KernelFit(o, per_elem(2.0 + QUANT_BYTES_PER_ELEMENT, QUANTIZE_INSTR_PER_ELEMENT)),
        "dequantize.kv": KernelFit(o, dequant),
    }
    return CalibrationProfile(
        gpu=gpu.key,
        source="roofline",
        memory_gbps=bw / 1e9,
        matmul_fp16_tflops=fp16 / 1e12,
        matmul_int8_tops=int8 / 1e12,
        matmul_fp8_tflops=None if gpu.fp8_tensor_tflops is None else gpu.fp8_tensor_tflops * ROOFLINE_MATMUL_EFFICIENCY,
        launch_overhead_s=o,
        kernels=kernels,
        provenance={"notes": "roofline over catalog peaks with the named efficiency factors in costmodel/roofline.py"},
    )
