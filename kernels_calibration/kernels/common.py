"""Helpers shared by the kernels: interpreter detection and the 2-bit/4-bit unpack.

Packed layout (used by every quantized tensor here), "channel-interleaved bit planes":
a row of D codes of ``bits`` bits is stored as W = D * bits / 8 bytes; byte j holds the codes of
channels j, j + W, j + 2W, ... (CPB = 8 / bits of them) at bit offsets 0, bits, 2*bits, ...
One load of a [rows, W] byte tile therefore yields, after one shift and one mask, CPB whole
[rows, W] code tiles for CPB contiguous channel groups: no shuffles, no interleave, and each
group is a ready dot operand.  On the GPU the shift+mask runs on 4 packed bytes per 32-bit
register (inline PTX); under TRITON_INTERPRET=1 (CPU tests) the same is done per element.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl


def interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def _fix_interpreter_scalar_index() -> None:
    """Triton 3.6's interpreter turns scalars into int via int(array of shape (1,)), which NumPy
    >= 2.4 rejects; loops with run-time bounds then fail on the CPU.  Re-register __index__ with
    .item() (interpreter only; compiled kernels are untouched)."""
    from triton.runtime import interpreter as _interp

    if getattr(_interp, "_hacksim_patched", False):
        return
    orig = _interp._patch_lang_tensor

    def patched(tensor, scope):
        orig(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.reshape(-1)[0]))

    _interp._patch_lang_tensor = patched
    _interp._hacksim_patched = True


if interpreting():
    _fix_interpreter_scalar_index()


def use_asm(t: torch.Tensor) -> bool:
    """Packed inline PTX is only valid when compiling for a real NVIDIA GPU (the interpreter runs the
    same arithmetic per element)."""
    return t.is_cuda and not interpreting()


def codes_per_byte(bits: int) -> int:
    if bits not in (2, 4, 8):
        raise ValueError(f"bits must be 2, 4 or 8, got {bits}")
    return 8 // bits


def sum_dtype(bits: int, partition: int) -> torch.dtype:
    """Stored code sums: uint8 when (2^bits - 1) * partition fits in 8 bits, else int16."""
    return torch.uint8 if (2**bits - 1) * partition <= 255 else torch.int16


# 2-bit code planes to INT8, 4 bytes per 32-bit register: one shift and one mask give 4 codes (shared
# with the Gluon kernels, gluon_decode.py)
UNPACK2_ASM = (
    "and.b32 $0, $1, 0x03030303;",
    "{ shr.b32 $0, $1, 2; and.b32 $0, $0, 0x03030303; }",
    "{ shr.b32 $0, $1, 4; and.b32 $0, $0, 0x03030303; }",
    "{ shr.b32 $0, $1, 6; and.b32 $0, $0, 0x03030303; }",
)
_UNPACK2_S0 = tl.constexpr(UNPACK2_ASM[0])
_UNPACK2_S2 = tl.constexpr(UNPACK2_ASM[1])
_UNPACK2_S4 = tl.constexpr(UNPACK2_ASM[2])
_UNPACK2_S6 = tl.constexpr(UNPACK2_ASM[3])


@triton.jit
def unpack_codes(packed, SHIFT: tl.constexpr, BITS: tl.constexpr, USE_ASM: tl.constexpr):
    """uint8 tile -> int8 tile of the codes at bit offset SHIFT (values 0 .. 2^BITS - 1)."""
    if USE_ASM:
        if BITS == 2:
            if SHIFT == 0:
                asm: tl.constexpr = _UNPACK2_S0
            elif SHIFT == 2:
                asm: tl.constexpr = _UNPACK2_S2
            elif SHIFT == 4:
                asm: tl.constexpr = _UNPACK2_S4
            else:
                asm: tl.constexpr = _UNPACK2_S6
            out = tl.inline_asm_elementwise(asm, "=r,r", [packed], dtype=tl.int8, is_pure=True, pack=4)
        else:
            if SHIFT == 0:
                out = tl.inline_asm_elementwise(
                    "and.b32 $0, $1, 0x0F0F0F0F;", "=r,r", [packed], dtype=tl.int8, is_pure=True, pack=4
                )
            else:
                out = tl.inline_asm_elementwise(
                    "{ shr.b32 $0, $1, 4; and.b32 $0, $0, 0x0F0F0F0F; }",
                    "=r,r",
                    [packed],
                    dtype=tl.int8,
                    is_pure=True,
                    pack=4,
                )
    else:
        out = ((packed >> SHIFT) & ((1 << BITS) - 1)).to(tl.int8)
    return out


# 2-bit codes to FP16 by table lookup, without an integer-to-float conversion (I2F runs at 16 per clock
# per SM on sm_90, an eighth of the FMA rate): the four values m, m + s, m + 2 s, m + 3 s of a (token,
# partition) or (block, channel) are two registers (dequant_table, one fma.rn.f16x2 rounding each: the
# FP16 values a dequantize kernel would write), and one prmt per two codes picks their bytes.  The
# selector comes from the codes with one multiply-add: code c in byte i becomes 0x22 c + 0x10, the
# nibble pair (2c, 2c + 1) that selects value c's two bytes.  Per four codes: shr, and, mad, prmt,
# shr, prmt (1.5 instructions per code).
# The four codes of a packed register must share a table: they do in the tensor-core operand
# layouts (four consecutive K elements of one token; four consecutive tokens of one V block and
# channel), which is where the kernels use it.
LUT2_ASM = (
    "{ .reg .b32 u, v, w;\n shr.b32 u, $2, SHIFT; and.b32 u, u, 0x03030303;"
    " mad.lo.u32 v, u, 0x22, 0x10101010;\n"
    " prmt.b32 $0, $3, $7, v; shr.b32 w, v, 16; prmt.b32 $1, $3, $7, w; }"
)
_LUT2_S0 = tl.constexpr(LUT2_ASM.replace("SHIFT", "0"))
_LUT2_S2 = tl.constexpr(LUT2_ASM.replace("SHIFT", "2"))
_LUT2_S4 = tl.constexpr(LUT2_ASM.replace("SHIFT", "4"))
_LUT2_S6 = tl.constexpr(LUT2_ASM.replace("SHIFT", "6"))


# the FP16 values of codes 0, 1 | 2, 3 of a (token, partition) or (block, channel): fma(s, (0, 1), m) and
# fma(s, (2, 3), m) in half2, one rounding each (shared with gluon_decode.py)
TABLE_ASM = (
    "{ .reg .b32 s2, m2, k01, k23; mov.b32 s2, {$2, $2}; mov.b32 m2, {$3, $3};"
    " mov.b32 k01, 0x3C000000; mov.b32 k23, 0x42004000;"
    " fma.rn.f16x2 $0, s2, k01, m2; fma.rn.f16x2 $1, s2, k23, m2; }"
)
_TABLE_S = tl.constexpr(TABLE_ASM)


@triton.jit
def dequant_table(scale, mn, USE_ASM: tl.constexpr):
    """(lo, hi) int32 tensors holding the FP16 values of codes 0, 1 | 2, 3 for FP16 scale and min
    (any shape): fma(s, (0, 1), m) and fma(s, (2, 3), m) in half2, one rounding each."""
    if USE_ASM:
        lo, hi = tl.inline_asm_elementwise(
            _TABLE_S,
            "=r,=r,h,h",
            [scale.to(tl.float16), mn.to(tl.float16)],
            dtype=(tl.int32, tl.int32),
            is_pure=True,
            pack=1,
        )
    else:
        sf = scale.to(tl.float16).to(tl.float32)
        mf = mn.to(tl.float16).to(tl.float32)
        lo = _fp16_pair(mf, sf + mf)
        hi = _fp16_pair(2.0 * sf + mf, 3.0 * sf + mf)
    return lo, hi


@triton.jit
def _fp16_pair(a, b):
    """Two float tensors -> int32 tensor holding FP16 a in the low half, FP16 b in the high half."""
    lo = a.to(tl.float16).to(tl.int16, bitcast=True).to(tl.int32) & 0xFFFF
    hi = b.to(tl.float16).to(tl.int16, bitcast=True).to(tl.int32) << 16
    return lo | hi


@triton.jit
def dequant_lut(packed, SHIFT: tl.constexpr, tab_lo, tab_hi, USE_ASM: tl.constexpr):
    """uint8 tile of 2-bit code planes -> FP16 values by table (dequant_table, broadcastable to the
    tile) for the codes at bit offset SHIFT."""
    if USE_ASM:
        lo = tl.broadcast_to(tab_lo, packed.shape)
        hi = tl.broadcast_to(tab_hi, packed.shape)
        if SHIFT == 0:
            asm: tl.constexpr = _LUT2_S0
        elif SHIFT == 2:
            asm: tl.constexpr = _LUT2_S2
        elif SHIFT == 4:
            asm: tl.constexpr = _LUT2_S4
        else:
            asm: tl.constexpr = _LUT2_S6
        out = tl.inline_asm_elementwise(
            asm, "=r,=r,r,r,r,r,r,r,r,r,r", [packed, lo, hi], dtype=tl.float16, is_pure=True, pack=4
        )
    else:
        code = ((packed >> SHIFT) & 3).to(tl.int32)
        word = tl.where(code < 2, tab_lo, tab_hi)
        bits = (word >> ((code & 1) * 16)) & 0xFFFF
        out = bits.to(tl.int16).to(tl.float16, bitcast=True)
    return out


@triton.jit
def online_softmax(s, m_i, AXIS: tl.constexpr = 1):
    """Flash-attention step over a score tile s (log2 domain; masked entries -inf) whose token axis is
    AXIS: (m_new running max per row of the other axis, alpha = exp2(m_i - m_new) to rescale the
    state so far, p = exp2(s - m_new))."""
    m_new = tl.maximum(m_i, tl.max(s, AXIS))
    return m_new, tl.exp2(m_i - m_new), tl.exp2(s - tl.expand_dims(m_new, AXIS))
