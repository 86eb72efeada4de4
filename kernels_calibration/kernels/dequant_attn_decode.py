"""Dequantize-then-attend decode (the family's entry point): the baselines that store the cache in
2 bits (KVQuant / KIVI style) and attend in FP16.

    out = dequant_attn_decode(q, cache, max_len=None, config=DequantDecodeConfig())
    ref = dequant_attn_decode_ref(q, cache)          # float64 attention over the dequantized cache

Kernels (dispatch.dequant_kernel chooses; config.kernel pins one):
  * fused, gluon_decode._dequant_mma_kernel: codes looked up to FP16 in the tensor-core operand
    registers of a one-warp program (Hopper, PI 64/128, GQA 8): 118.6 us at 32K / batch 8 on the
    H200 against SDPA's 253.6 (2.14x);
  * fused, head_major._quant_decode_kernel in its dequant mode (the Triton kernel elsewhere): 149 us;
  * unfused (what the HACK paper compared against): dequantize_cache writes the whole cache back to
    FP16 in device memory (reads codes + metadata, writes 2 bytes per element), then the FP16 decode
    kernel (attn_decode.fp_attn_decode) reads it again.
The FP16 tail of the cache (recent < PI tokens, as KIVI keeps a residual window) is used as is.
Both fused kernels dequantize by a 4-entry FP16 table per partition (common.dequant_lut): no
integer-to-float conversion, one rounding, the same FP16 values the dequantize kernel writes.

dequantize bytes = codes + metadata read + 2 * elements written (dequantize_bytes).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from . import dispatch
from .attn_decode import attn_decode_ref, fp_attn_decode
from .common import unpack_codes, use_asm
from .gluon_decode import dequant_attn_decode_gluon
from .head_major import quant_attn_decode_hm
from .kv_cache import QuantKVCache, dequantize_cache_ref
from .launch import DequantDecodeConfig, FpDecodeConfig, QuantizeConfig

__all__ = ["DequantDecodeConfig", "dequant_attn_decode", "dequant_attn_decode_ref", "dequantize_cache"]


@triton.jit
def _dequant_kernel(
    KC,
    KMN,
    KSC,
    VC,
    VMN,
    VSC,
    VT,
    LENS,
    KO,
    VO,
    HKV,
    LMAX,
    NBLK,
    D: tl.constexpr,
    PI: tl.constexpr,
    HAS_TAIL: tl.constexpr,
    BLOCK_T: tl.constexpr,
    USE_ASM: tl.constexpr,
):
    W: tl.constexpr = D // 4
    NP: tl.constexpr = D // PI
    bh = tl.program_id(0)
    tb = tl.program_id(1)
    L = tl.load(LENS + bh // HKV)
    if HAS_TAIL:
        LV = (L // PI) * PI
    else:
        LV = L
    if tb * BLOCK_T < L:
        t = tb * BLOCK_T + tl.arange(0, BLOCK_T)
        tmask = t < L
        row = bh.to(tl.int64) * LMAX + t
        j = tl.arange(0, W)
        kb = tl.load(KC + row[:, None] * W + j[None, :], mask=tmask[:, None], other=0)
        vb = tl.load(VC + row[:, None] * W + j[None, :], mask=tmask[:, None], other=0)
        mrow = (bh.to(tl.int64) * NBLK + t // PI) * D
        qmask = t < LV
        for c in tl.static_range(4):
            ch = c * W + j
            sk = tl.load(KSC + row[:, None] * NP + (ch // PI)[None, :], mask=tmask[:, None], other=0.0)
            mk = tl.load(KMN + row[:, None] * NP + (ch // PI)[None, :], mask=tmask[:, None], other=0.0)
            kval = unpack_codes(kb, 2 * c, 2, USE_ASM).to(tl.float16) * sk + mk
            tl.store(KO + row[:, None] * D + ch[None, :], kval, mask=tmask[:, None])
            sv = tl.load(VSC + mrow[:, None] + ch[None, :], mask=qmask[:, None], other=0.0)
            mv = tl.load(VMN + mrow[:, None] + ch[None, :], mask=qmask[:, None], other=0.0)
            vval = unpack_codes(vb, 2 * c, 2, USE_ASM).to(tl.float16) * sv + mv
            if HAS_TAIL:
                tr = tl.maximum(t - LV, 0)
                tv = tl.load(
                    VT + (bh.to(tl.int64) * PI + tr)[:, None] * D + ch[None, :],
                    mask=(tmask & (t >= LV))[:, None],
                    other=0.0,
                )
                vval = tl.where(qmask[:, None], vval, tv)
            tl.store(VO + row[:, None] * D + ch[None, :], vval, mask=tmask[:, None])


def dequantize_cache(
    cache: QuantKVCache,
    out: tuple[torch.Tensor, torch.Tensor] | None = None,
    max_len: int | None = None,
    config: QuantizeConfig = QuantizeConfig(),
):
    """Write the cache's K and V to FP16 [B, HKV, Lmax, D] (only tokens < lens[b]) into out (allocated
    when None); max_len: an upper bound of lens.  Returns (k, v)."""
    b, hkv, lmax, d = cache.shape
    ko, vo = (
        out
        if out is not None
        else (
            torch.empty((b, hkv, lmax, d), dtype=torch.float16, device=cache.k_codes.device),
            torch.empty((b, hkv, lmax, d), dtype=torch.float16, device=cache.k_codes.device),
        )
    )
    max_len = lmax if max_len is None else max_len
    _dequant_kernel[(b * hkv, triton.cdiv(max_len, config.block_t))](
        cache.k_codes,
        cache.k_min,
        cache.k_scale,
        cache.v_codes,
        cache.v_min,
        cache.v_scale,
        cache.v_tail,
        cache.lens,
        ko,
        vo,
        hkv,
        lmax,
        cache.v_min.shape[2],
        D=d,
        PI=cache.partition,
        HAS_TAIL=cache.rqe,
        BLOCK_T=config.block_t,
        USE_ASM=use_asm(cache.k_codes),
        **config.options(4, 3),
    )
    return ko, vo


def dequant_attn_decode(
    q: torch.Tensor,
    cache: QuantKVCache,
    max_len: int | None = None,
    config: DequantDecodeConfig = DequantDecodeConfig(),
    scratch: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> torch.Tensor:
    """q [B, HQ, D] fp16 (the new token's query, already appended to the cache) -> [B, HQ, D] fp16.
    max_len: an upper bound of lens (defaults to the capacity) that sizes the splits; scratch: the FP16
    K and V buffers of the unfused kernel (allocated when None)."""
    kernel = dispatch.dequant_kernel(q, cache, config)
    if kernel == "gluon":
        return dequant_attn_decode_gluon(q, cache, max_len=max_len, config=config)
    if kernel == "triton":
        return quant_attn_decode_hm(q, cache, mode="dequant", max_len=max_len, config=config)
    ko, vo = dequantize_cache(cache, scratch, max_len=max_len)
    fp = FpDecodeConfig(
        splits=config.splits, num_warps=config.num_warps, num_stages=config.num_stages, maxnreg=config.maxnreg
    )
    return fp_attn_decode(q, ko, vo, cache.lens, max_len=max_len, config=fp)


def dequant_attn_decode_ref(q: torch.Tensor, cache: QuantKVCache) -> torch.Tensor:
    """Exact float64 attention over the cache as it represents K and V (dequantized; FP16 tail where RQE)."""
    k, v = dequantize_cache_ref(cache)
    return attn_decode_ref(q, k, v, cache.lens.cpu())


def dequantize_bytes(n_elements: int, partition: int) -> float:
    """Per element: 2 bits of codes, metadata (fp16 min+scale per partition of K and V), 2 B written."""
    return n_elements * (0.25 + 4.0 / partition + 2.0)
