"""Dequantize-then-attend decode baselines (KVQuant / CacheGen every iteration; KIVI fused).

* unfused (what the HACK paper compared against): a dequantize kernel writes the whole 2-bit cache
  back to FP16 in device memory (reads codes + metadata, writes 2 bytes per element), then the FP16
  decode kernel reads it again;
* fused: ``hack_attn_decode(mode="dequant")`` dequantizes codes to FP16 in registers inside the
  attention loop (FP16 Q, FP16 P, FP16 tensor-core dots).
The FP16 tail of the cache (recent < PI tokens, as KIVI keeps a residual window) is used as is.

dequantize bytes = codes + metadata read + 2 * elements written.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from .attn_decode import fp_attn_decode
from .common import unpack_codes, use_asm
from .hack_attn_decode import hack_attn_decode
from .kv_cache import QuantKVCache


@triton.jit
def _dequant_kernel(KC, KMN, KSC, VC, VMN, VSC, VT, LENS, KO, VO, HKV, LMAX, NBLK,
                    D: tl.constexpr, PI: tl.constexpr, HAS_TAIL: tl.constexpr, BLOCK_T: tl.constexpr,
                    USE_ASM: tl.constexpr):
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
                tv = tl.load(VT + (bh.to(tl.int64) * PI + tr)[:, None] * D + ch[None, :],
                             mask=(tmask & (t >= LV))[:, None], other=0.0)
                vval = tl.where(qmask[:, None], vval, tv)
            tl.store(VO + row[:, None] * D + ch[None, :], vval, mask=tmask[:, None])


def dequantize_cache(cache: QuantKVCache, out: tuple[torch.Tensor, torch.Tensor] | None = None,
                     max_len: int | None = None, block_t: int = 64):
    """Write the cache's K and V to FP16 [B, HKV, Lmax, D] (only tokens < lens[b])."""
    b, hkv, lmax, d = cache.shape
    ko, vo = out if out is not None else (
        torch.empty((b, hkv, lmax, d), dtype=torch.float16, device=cache.k_codes.device),
        torch.empty((b, hkv, lmax, d), dtype=torch.float16, device=cache.k_codes.device))
    max_len = lmax if max_len is None else max_len
    _dequant_kernel[(b * hkv, triton.cdiv(max_len, block_t))](
        cache.k_codes, cache.k_min, cache.k_scale, cache.v_codes, cache.v_min, cache.v_scale,
        cache.v_tail, cache.lens, ko, vo, hkv, lmax, cache.v_min.shape[2], D=d, PI=cache.partition,
        HAS_TAIL=cache.rqe, BLOCK_T=block_t, USE_ASM=use_asm(cache.k_codes), num_warps=4)
    return ko, vo


def dequant_attn_decode(q: torch.Tensor, cache: QuantKVCache, fused: bool = True,
                        scratch: tuple[torch.Tensor, torch.Tensor] | None = None, **kw) -> torch.Tensor:
    if fused:
        return hack_attn_decode(q, cache, mode="dequant", **kw)
    ko, vo = dequantize_cache(cache, scratch, max_len=kw.get("max_len"))
    return fp_attn_decode(q, ko, vo, cache.lens, **kw)


def dequantize_bytes(n_elements: int, partition: int) -> float:
    """Per element: 2 bits of codes, metadata (fp16 min+scale per partition of K and V), 2 B written."""
    return n_elements * (0.25 + 4.0 / partition + 2.0)
