"""What each profiled kernel asks of each unit of a GPU, per canonical unit, and its time split by unit.

A kernel's time per unit (a calibration fit's ``s_per_unit``) is modelled as the sum of the times its
work spends on five units, each at that unit's rate on the GPU:

============  =====================================================  =========================================
unit          work per canonical unit (``KernelWork``)                rate (``UnitRates``)
============  =====================================================  =========================================
hbm           bytes read + written in device memory                   achievable copy bandwidth
fp16_tensor   FP16 tensor-core FLOPs (2 per multiply-add, padded)     FP16 peak x achieved GEMM fraction
int8_tensor   INT8 tensor-core ops; on a GPU without INT8 tensor      INT8 peak x the same fraction (else the
              cores the same products run on FP16 tensor cores        FP16 rate: exact, see below)
sfu           special-function ops (the softmax's exp2)               SMs x 16 per clock x SM clock
alu           CUDA-core instructions (unpack, convert, correction,    SMs x warp schedulers x 32 x SM clock
              softmax bookkeeping, address arithmetic, loads)
============  =====================================================  =========================================

plus the fit's ``overhead_s`` (launch and pipeline latency, per launch).  The bytes, tensor and SFU work
are known from each kernel's formula (``WORK``, at the profiled shapes: GQA group 8, head_dim 128, 2-bit
codes, Π = 64 unless the key says otherwise); the CUDA-core instructions are what the measured time
leaves once the known parts are priced at the measuring GPU's rates (``split``).  Where the known parts
alone exceed the measured time (the kernel overlapped them), they are scaled down to it and the ALU
part is zero.  ``reprice`` moves each part to another GPU by the ratio of that unit's rates.

Homomorphic products without INT8 tensor cores (V100): the 2-bit codes (0..3) and the INT8 query and
softmax values (−128..255) are integers FP16 represents exactly, each product (|x| ≤ 765) is exact in
the FP32 accumulator, and a sum over one MMA's inner dimension (d = 128 for Q·Kᵀ, a Π-token block for
P·V) stays below 128 · 765 < 2^24, so FP32 accumulation is exact too: FP16 tensor cores with FP32
accumulate return the integer results of the INT8 path bit for bit.  The INT8 work is priced there.

``ALU_INSTR_PER_UNIT`` holds the instruction counts the measured H200 profile implies
(``kernels_calibration/derive.py`` infers them; a test checks these copies), so the roofline for a GPU
without a profile prices kernels by the same work table.
"""

from __future__ import annotations

from dataclasses import dataclass

from .specs import GPUSpec

UNITS = ("hbm", "fp16_tensor", "int8_tensor", "sfu", "alu")

# The profiled attention shapes (kernels_calibration/profile.py): query heads per KV head, padded to an
# MMA's 16 rows; head_dim; code bits; partition.
GQA_GROUP = 8
MMA_ROWS = 16
HEAD_DIM = 128
CODE_BITS = 2
PARTITION = 64
LANES_PER_WARP = 32


@dataclass(frozen=True)
class KernelWork:
    """Work per canonical unit (calibration.py's units) on each unit of the GPU."""

    hbm_bytes: float = 0.0
    fp16_tensor_flops: float = 0.0
    int8_tensor_ops: float = 0.0
    sfu_ops: float = 0.0
    formula: str = ""


def hack_bytes_per_element(partition: int = PARTITION, bits: int = CODE_BITS, sums: bool = True) -> float:
    """Stored bytes per K/V element: codes + FP16 min and scale per partition (+ the code sum with SE:
    uint8 while (2^bits − 1) · Π ≤ 255, else int16).  measure.hack_cache_bytes counts the same."""
    sum_bytes = (1 if (2**bits - 1) * partition <= 255 else 2) if sums else 0
    return bits / 8 + (4 + sum_bytes) / partition


_QK_PV = 2.0 * MMA_ROWS  # per KV element: G padded to 16 multiply-adds, 2 FLOPs each (Q·K or P·V)
_QK_PV_N8 = 2.0 * GQA_GROUP  # the Gluon kernels put the 8 query heads on mma.sync's N = 8: no padding
_EXP_PER_ELEMENT = GQA_GROUP / (2 * HEAD_DIM)  # one exp per (query head, token); 2·d K and V elements per token
_EXP_PER_FLOP = 1 / (4 * HEAD_DIM)  # prefill unit = 4·d FLOPs per (query, key) pair per head; one exp each


def _decode(bytes_: float, tensor: str, how: str, ops: float = _QK_PV) -> KernelWork:
    t = {"fp16_tensor_flops": ops} if tensor == "fp16" else {"int8_tensor_ops": ops}
    return KernelWork(hbm_bytes=bytes_, sfu_ops=_EXP_PER_ELEMENT, formula=how, **t)


_HACK = hack_bytes_per_element()
_DEQ = 0.25 + 4.0 / PARTITION  # kernels/dequant_attn_decode.dequantize_bytes: codes + FP16 min/scale
WORK: dict[str, KernelWork] = {
    "decode_attn.fp16": _decode(2.0, "fp16", "2 B per element; 2·16 FLOPs; 8/256 exp"),
    "decode_attn.fp8": _decode(1.0, "fp16", "1 B per element (converted to FP16 in registers); 2·16 FLOPs; 8/256 exp"),
    "decode_attn.dequant_fused": _decode(
        _HACK, "fp16", "codes + min/scale/sum per Π; FP16 products (N = 8); 8/256 exp", _QK_PV_N8
    ),
    "decode_attn.dequant_unfused": _decode(
        _DEQ + 2.0 + 2.0, "fp16", "dequantize (codes + min/scale read, 2 B written) then FP16 attention (2 B)"
    ),
    "decode_attn.hack": _decode(
        _HACK, "int8", "codes + min/scale/sum per Π; INT8 products (N = 8); 8/256 exp", _QK_PV_N8
    ),
    "decode_attn.hack_no_se": _decode(
        hack_bytes_per_element(sums=False), "int8", "codes + min/scale per Π (N = 8)", _QK_PV_N8
    ),
    "decode_attn.hack_no_rqe": _decode(
        _HACK, "int8", "as hack (the open V block requantized per step: overhead)", _QK_PV_N8
    ),
    "decode_attn.hack_pi32": _decode(hack_bytes_per_element(32), "int8", "as hack at Π = 32"),
    "decode_attn.hack_pi128": _decode(hack_bytes_per_element(128), "int8", "as hack at Π = 128 (int16 sums)"),
    "prefill_attn.fp16": KernelWork(
        fp16_tensor_flops=1.0,
        sfu_ops=_EXP_PER_FLOP,
        formula="1 FP16 FLOP per unit; one exp per 4·d FLOPs; Q/K/V/O bytes negligible",
    ),
    "prefill_attn.hack": KernelWork(
        int8_tensor_ops=1.0, sfu_ops=_EXP_PER_FLOP, formula="1 INT8 op per unit; one exp per 4·d ops; bytes negligible"
    ),
    "quantize.kv": KernelWork(hbm_bytes=2.0 + _HACK, formula="read 2 B, write codes + min/scale/sum per Π"),
    "dequantize.kv": KernelWork(hbm_bytes=_DEQ + 2.0, formula="read codes + min/scale, write 2 B"),
    "elementwise": KernelWork(hbm_bytes=1.0, formula="unit = bytes read + written"),
    # scoring kernels (issue 7): bytes per unit at the profiled shapes (GQA 8, head_dim 128): PQ: M code bytes +
    # 4·G FP32 scores per token and KV head (M = 2 / 8); quantized keys: bits/8 + 4/Π + 4·G/D per key element
    # (4 / 2 bits), tl.dot with G padded to 16 rows; top-k: read 4 B per score, write k = ctx/5 values and indices.
    "score.pq": KernelWork(hbm_bytes=2 + 4 * GQA_GROUP, formula="M=2 code bytes + 4·G FP32 scores"),
    "score.pq_m8": KernelWork(hbm_bytes=8 + 4 * GQA_GROUP, formula="M=8 code bytes + 4·G FP32 scores"),
    "score.quantized_keys": KernelWork(
        hbm_bytes=0.5 + 4 / PARTITION + 4 * GQA_GROUP / HEAD_DIM,
        fp16_tensor_flops=_QK_PV,
        formula="4-bit keys + scale/min per Π + scores",
    ),
    "score.quantized_keys_2bit": KernelWork(
        hbm_bytes=0.25 + 4 / PARTITION + 4 * GQA_GROUP / HEAD_DIM,
        fp16_tensor_flops=_QK_PV,
        formula="2-bit keys + scale/min per Π + scores",
    ),
    "select.topk": KernelWork(hbm_bytes=4 + (4 + 8) / 5, formula="read 4 B per score; write ctx/5 values + indices"),
}
for _k in ("dequant_fused", "hack", "hack_no_se", "hack_no_rqe"):  # the Triton twins of the Gluon kernels: tl.dot
    _w = WORK[f"decode_attn.{_k}"]  # pads the 8 query heads to 16 rows
    WORK[f"decode_attn.{_k}_triton"] = KernelWork(
        hbm_bytes=_w.hbm_bytes,
        sfu_ops=_w.sfu_ops,
        formula=_w.formula.replace("(N = 8)", "(16 rows)"),
        fp16_tensor_flops=_QK_PV if _w.fp16_tensor_flops else 0.0,
        int8_tensor_ops=_QK_PV if _w.int8_tensor_ops else 0.0,
    )

# the row-packed HACK step at 4 query heads per KV head (Llama-3.1-8B): 4 copies of the group fill the 16 rows
_w = WORK["decode_attn.hack_triton"]
WORK["decode_attn.hack_gqa4"] = KernelWork(
    hbm_bytes=_w.hbm_bytes,
    int8_tensor_ops=_QK_PV,
    sfu_ops=_EXP_PER_ELEMENT / 2,
    formula="codes + min/scale/sum per Π; INT8 products (16 rows: 4 copies of the 4-head group); 4/256 exp",
)


@dataclass(frozen=True)
class UnitRates:
    """Per-second rates of the five units (bytes, FLOPs, ops, instructions)."""

    hbm: float
    fp16_tensor: float
    int8_tensor: float | None  # None: no INT8 tensor cores (INT8 work runs at fp16_tensor)
    sfu: float
    alu: float

    def rate(self, unit: str) -> float:
        if unit == "int8_tensor" and self.int8_tensor is None:
            return self.fp16_tensor
        return getattr(self, unit)


def unit_rates(gpu: GPUSpec, memory_efficiency: float, tensor_efficiency: float) -> UnitRates:
    """A GPU's unit rates from its catalog figures: memory and tensor peaks times the named efficiencies
    (tensor rates at the sustained clock of a power-capped part), SFU and CUDA-core issue rates from SMs and
    the SM clock.  One tensor efficiency serves FP16 and INT8: the H200's INT8 GEMM measurement (torch._int_mm,
    47 % of peak) is held down by PyTorch's cuBLASLt call without a workspace (pytorch/pytorch#187094), while a
    tuned INT8 GEMM reaches 508 of 624 TOPS on the A100 (sgl-project/sglang#2752), near the FP16 GEMM's
    fraction."""
    clock_frac = gpu.clock_ghz / gpu.boost_clock_ghz
    per_sm_clock = gpu.sms * gpu.clock_ghz * 1e9
    return UnitRates(
        hbm=gpu.memory_bandwidth_gb_per_s * 1e9 * memory_efficiency,
        fp16_tensor=gpu.fp16_tensor_tflops * 1e12 * tensor_efficiency * clock_frac,
        int8_tensor=None
        if gpu.int8_tensor_tops is None
        else gpu.int8_tensor_tops * 1e12 * tensor_efficiency * clock_frac,
        sfu=per_sm_clock * gpu.sfu_ops_per_clock_per_sm,
        alu=per_sm_clock * gpu.warp_schedulers_per_sm * LANES_PER_WARP,
    )


def known_parts(work: KernelWork, rates: UnitRates) -> dict[str, float]:
    """Seconds per unit of the work the formulas know (everything but the ALU)."""
    return {
        "hbm": work.hbm_bytes / rates.rate("hbm"),
        "fp16_tensor": work.fp16_tensor_flops / rates.rate("fp16_tensor"),
        "int8_tensor": work.int8_tensor_ops / rates.rate("int8_tensor"),
        "sfu": work.sfu_ops / rates.rate("sfu"),
    }


def split(work: KernelWork, s_per_unit: float, rates: UnitRates) -> dict[str, float]:
    """A measured s_per_unit split into seconds per unit on each unit (they add up to s_per_unit)."""
    parts = known_parts(work, rates)
    known = sum(parts.values())
    if known >= s_per_unit:
        return {**{u: t * s_per_unit / known for u, t in parts.items()}, "alu": 0.0}
    return {**parts, "alu": s_per_unit - known}


def reprice(parts: dict[str, float], source: UnitRates, target: UnitRates) -> dict[str, float]:
    """Each unit's seconds per unit moved from the source GPU's rate to the target's."""
    return {u: t * source.rate(u) / target.rate(u) for u, t in parts.items()}


def alu_instructions(parts: dict[str, float], rates: UnitRates) -> float:
    """CUDA-core instructions per unit the ALU part implies."""
    return parts["alu"] * rates.alu


# FP8 (e4m3) KV on a GPU without FP8 hardware (before Ada/Hopper) is converted to FP16 in software: shift,
# mask, bias and pack, about 6 instructions per element against 2 for the hardware convert (an assumption,
# stated as such; the H200's measured FP8 kernel uses the hardware convert).
FP8_CONVERT_INSTR_PER_ELEMENT = 2.0
FP8_SOFTWARE_CONVERT_INSTR_PER_ELEMENT = 6.0
FP8_SOFTWARE_CONVERT_EXTRA_INSTR = FP8_SOFTWARE_CONVERT_INSTR_PER_ELEMENT - FP8_CONVERT_INSTR_PER_ELEMENT

# The measured H200 profile split by unit: its unit rates (copy 4220.4 GB/s; FP16 GEMM 693.4 of 989.4 TFLOP/s,
# the same fraction of the INT8 peak; SFU and issue rates at 132 SMs x 1.98 GHz) and each kernel's seconds per
# unit on each unit (`python -m kernels_calibration.derive --reference` prints these from the committed
# profile; tests/kernels/test_profiles.py checks they still match it).  The roofline reprices them.
REFERENCE_RATES = UnitRates(
    hbm=4.220400e12, fp16_tensor=6.934000e14, int8_tensor=1.386870e15, sfu=4.181760e12, alu=3.345408e13
)
REFERENCE_PARTS: dict[str, dict[str, float]] = {
    "decode_attn.hack": {
        "hbm": 7.7747e-14,
        "fp16_tensor": 0.0,
        "int8_tensor": 1.1537e-14,
        "sfu": 7.4729e-15,
        "alu": 4.6717e-14,
    },
    "decode_attn.hack_gqa4": {
        "hbm": 7.7747e-14,
        "fp16_tensor": 0.0,
        "int8_tensor": 2.3074e-14,
        "sfu": 3.7365e-15,
        "alu": 7.9930e-13,
    },
    "decode_attn.hack_no_se": {
        "hbm": 7.4045e-14,
        "fp16_tensor": 0.0,
        "int8_tensor": 1.1537e-14,
        "sfu": 7.4729e-15,
        "alu": 5.8144e-14,
    },
    "decode_attn.hack_no_rqe": {
        "hbm": 7.7747e-14,
        "fp16_tensor": 0.0,
        "int8_tensor": 1.1537e-14,
        "sfu": 7.4729e-15,
        "alu": 9.1237e-14,
    },
    "decode_attn.fp8": {
        "hbm": 2.3694e-13,
        "fp16_tensor": 4.6149e-14,
        "int8_tensor": 0.0,
        "sfu": 7.4729e-15,
        "alu": 7.9927e-14,
    },
    "decode_attn.dequant_fused": {
        "hbm": 7.7747e-14,
        "fp16_tensor": 2.3075e-14,
        "int8_tensor": 0.0,
        "sfu": 7.4729e-15,
        "alu": 1.0208e-13,
    },
    "decode_attn.dequant_unfused": {
        "hbm": 1.0218e-12,
        "fp16_tensor": 4.6149e-14,
        "int8_tensor": 0.0,
        "sfu": 7.4729e-15,
        "alu": 3.0793e-13,
    },
    "decode_attn.dequant_fused_triton": {
        "hbm": 7.7747e-14,
        "fp16_tensor": 4.6149e-14,
        "int8_tensor": 0.0,
        "sfu": 7.4729e-15,
        "alu": 1.6356e-13,
    },
    "decode_attn.hack_triton": {
        "hbm": 7.7747e-14,
        "fp16_tensor": 0.0,
        "int8_tensor": 2.3074e-14,
        "sfu": 7.4729e-15,
        "alu": 1.8083e-13,
    },
    "decode_attn.hack_no_se_triton": {
        "hbm": 7.4045e-14,
        "fp16_tensor": 0.0,
        "int8_tensor": 2.3074e-14,
        "sfu": 7.4729e-15,
        "alu": 1.9735e-13,
    },
    "decode_attn.hack_no_rqe_triton": {
        "hbm": 7.7747e-14,
        "fp16_tensor": 0.0,
        "int8_tensor": 2.3074e-14,
        "sfu": 7.4729e-15,
        "alu": 2.2769e-13,
    },
    "decode_attn.fp16": {
        "hbm": 4.2264e-13,
        "fp16_tensor": 4.1159e-14,
        "int8_tensor": 0.0,
        "sfu": 6.6648e-15,
        "alu": 0.0,
    },
    "decode_attn.hack_pi32": {
        "hbm": 9.6259e-14,
        "fp16_tensor": 0.0,
        "int8_tensor": 2.3074e-14,
        "sfu": 7.4729e-15,
        "alu": 1.9725e-13,
    },
    "decode_attn.hack_pi128": {
        "hbm": 7.0343e-14,
        "fp16_tensor": 0.0,
        "int8_tensor": 2.3074e-14,
        "sfu": 7.4729e-15,
        "alu": 6.9566e-14,
    },
    "prefill_attn.fp16": {"hbm": 0.0, "fp16_tensor": 1.4056e-15, "int8_tensor": 0.0, "sfu": 4.5522e-16, "alu": 0.0},
    "prefill_attn.hack": {
        "hbm": 0.0,
        "fp16_tensor": 0.0,
        "int8_tensor": 7.2105e-16,
        "sfu": 4.6706e-16,
        "alu": 6.1661e-15,
    },
    "quantize.kv": {"hbm": 5.5164e-13, "fp16_tensor": 0.0, "int8_tensor": 0.0, "sfu": 0.0, "alu": 3.7181e-12},
    "dequantize.kv": {"hbm": 5.4793e-13, "fp16_tensor": 0.0, "int8_tensor": 0.0, "sfu": 0.0, "alu": 2.8635e-13},
    "score.pq": {"hbm": 8.0561e-12, "fp16_tensor": 0.0, "int8_tensor": 0.0, "sfu": 0.0, "alu": 3.7572e-11},
    "score.pq_m8": {"hbm": 9.4778e-12, "fp16_tensor": 0.0, "int8_tensor": 0.0, "sfu": 0.0, "alu": 1.5319e-10},
    "score.quantized_keys": {
        "hbm": 1.9252e-13,
        "fp16_tensor": 4.6149e-14,
        "int8_tensor": 0.0,
        "sfu": 0.0,
        "alu": 2.7707e-13,
    },
    "score.quantized_keys_2bit": {
        "hbm": 1.3328e-13,
        "fp16_tensor": 4.6149e-14,
        "int8_tensor": 0.0,
        "sfu": 0.0,
        "alu": 3.8781e-13,
    },
    "select.topk": {"hbm": 1.5164e-12, "fp16_tensor": 0.0, "int8_tensor": 0.0, "sfu": 0.0, "alu": 2.2755e-11},
    "elementwise": {"hbm": 2.3694e-13, "fp16_tensor": 0.0, "int8_tensor": 0.0, "sfu": 0.0, "alu": 3.7974e-14},
}
