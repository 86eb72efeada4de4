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
    """Packed inline-PTX unpack is only valid when compiling for a real NVIDIA GPU
    (HACKSIM_NO_ASM=1 turns it off to measure the plain per-element unpack)."""
    return t.is_cuda and not interpreting() and os.environ.get("HACKSIM_NO_ASM", "0") != "1"


def codes_per_byte(bits: int) -> int:
    if bits not in (2, 4, 8):
        raise ValueError(f"bits must be 2, 4 or 8, got {bits}")
    return 8 // bits


def sum_dtype(bits: int, partition: int) -> torch.dtype:
    """Stored code sums: uint8 when (2^bits - 1) * partition fits in 8 bits, else int16."""
    return torch.uint8 if (2**bits - 1) * partition <= 255 else torch.int16


@triton.jit
def unpack_codes(packed, SHIFT: tl.constexpr, BITS: tl.constexpr, USE_ASM: tl.constexpr):
    """uint8 tile -> int8 tile of the codes at bit offset SHIFT (values 0 .. 2^BITS - 1)."""
    if USE_ASM:
        # 4 bytes per 32-bit register: one shift and one mask give 4 codes.
        if BITS == 2:
            if SHIFT == 0:
                out = tl.inline_asm_elementwise("and.b32 $0, $1, 0x03030303;", "=r,r", [packed],
                                                dtype=tl.int8, is_pure=True, pack=4)
            elif SHIFT == 2:
                out = tl.inline_asm_elementwise("{ shr.b32 $0, $1, 2; and.b32 $0, $0, 0x03030303; }",
                                                "=r,r", [packed], dtype=tl.int8, is_pure=True, pack=4)
            elif SHIFT == 4:
                out = tl.inline_asm_elementwise("{ shr.b32 $0, $1, 4; and.b32 $0, $0, 0x03030303; }",
                                                "=r,r", [packed], dtype=tl.int8, is_pure=True, pack=4)
            else:
                out = tl.inline_asm_elementwise("{ shr.b32 $0, $1, 6; and.b32 $0, $0, 0x03030303; }",
                                                "=r,r", [packed], dtype=tl.int8, is_pure=True, pack=4)
        else:
            if SHIFT == 0:
                out = tl.inline_asm_elementwise("and.b32 $0, $1, 0x0F0F0F0F;", "=r,r", [packed],
                                                dtype=tl.int8, is_pure=True, pack=4)
            else:
                out = tl.inline_asm_elementwise("{ shr.b32 $0, $1, 4; and.b32 $0, $0, 0x0F0F0F0F; }",
                                                "=r,r", [packed], dtype=tl.int8, is_pure=True, pack=4)
    else:
        out = ((packed >> SHIFT) & ((1 << BITS) - 1)).to(tl.int8)
    return out


@triton.jit
def online_softmax(s, m_i, AXIS: tl.constexpr = 1):
    """Flash-attention step over a score tile s (log2 domain; masked entries -inf) whose token axis is
    AXIS: (m_new running max per row of the other axis, alpha = exp2(m_i - m_new) to rescale the
    state so far, p = exp2(s - m_new))."""
    m_new = tl.maximum(m_i, tl.max(s, AXIS))
    return m_new, tl.exp2(m_i - m_new), tl.exp2(s - tl.expand_dims(m_new, AXIS))
