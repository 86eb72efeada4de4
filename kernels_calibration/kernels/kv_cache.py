"""The quantized KV cache of one layer, and the decode-step append of one new token per request.

Modelled (HACK, arXiv 2502.03589): K partitions lie along head_dim, so a new token's K is its own
partitions and is quantized once.  V partitions lie along the sequence:
  * with requantization elimination (RQE, ``rqe=True``): the last, not yet full V block (< PI
    tokens) stays FP16 in ``v_tail`` [B, H, PI, D]; when it reaches PI tokens it is quantized and
    its codes, min, scale and sums are written to the cache;
  * without RQE (``rqe=False``): every V token is in the quantized cache; appending a token
    dequantizes the partial block, adds the token, and requantizes the block (new min/scale), which
    costs the extra work and error the ablation measures.
Per request b the cache holds lens[b] tokens (ragged); the capacity L_max is fixed at allocation.
The append kernel (one program per (request, kv head)) also writes lens + 1 to a new tensor.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch
import triton
import triton.language as tl

from .common import sum_dtype
from .quantize import _pack_rows, _quant_codes, dequantize_k_ref, dequantize_v_ref, quantize_k, quantize_v


@dataclass(frozen=True)
class QuantKVCache:
    k_codes: torch.Tensor  # uint8 [B, H, Lmax, W]
    k_min: torch.Tensor  # fp16 [B, H, Lmax, NP]
    k_scale: torch.Tensor  # fp16 [B, H, Lmax, NP]
    k_sum: torch.Tensor  # uint8|int16 [B, H, Lmax, NP]
    v_codes: torch.Tensor  # uint8 [B, H, Lmax, W]
    v_min: torch.Tensor  # fp16 [B, H, NBLK, D]
    v_scale: torch.Tensor  # fp16 [B, H, NBLK, D]
    v_sum: torch.Tensor  # uint8|int16 [B, H, NBLK, D]
    v_tail: torch.Tensor  # fp16 [B, H, PI, D] (RQE tail; unused when rqe=False)
    lens: torch.Tensor  # int32 [B]
    partition: int
    bits: int
    rqe: bool

    @property
    def shape(self):
        b, h, lmax, w = self.k_codes.shape
        return b, h, lmax, w * 8 // self.bits

    def query_group(self, q) -> int:
        """Query heads per KV head of a decode query q [B, H_q, D] over this cache; ValueError when q's
        batch, head_dim or head count does not fit the cache."""
        b, hkv, lmax, d = self.shape
        if q.shape[0] != b or q.shape[2] != d or q.shape[1] % hkv:
            raise ValueError(f"q {tuple(q.shape)} does not match cache {(b, hkv, lmax, d)}")
        return q.shape[1] // hkv

    def nbytes_visited(self) -> int:
        """Bytes a decode step must read: codes, metadata and sums of lens tokens, plus the tail."""
        b, h, _, d = self.shape
        tokens = int(self.lens.sum())
        pi = self.partition
        sb = 1 if sum_dtype(self.bits, pi) == torch.uint8 else 2
        per_tok = 2 * d * self.bits // 8 + (d // pi) * (4 + sb) + d * (4 + sb) / pi
        return int(h * tokens * per_tok)


def build_cache(
    k: torch.Tensor,
    v: torch.Tensor,
    lens: torch.Tensor,
    partition: int = 64,
    bits: int = 2,
    rqe: bool = True,
    stochastic: bool = True,
    seed: int = 0,
    capacity: int | None = None,
) -> QuantKVCache:
    """Quantize a prefilled FP16 KV ([B, H, L, D]) of lens[b] tokens into a cache of `capacity` tokens."""
    b, h, seq, d = k.shape
    cap = max(seq, capacity or seq)
    cap = triton.cdiv(cap, partition) * partition
    if cap > seq:
        pad = torch.zeros((b, h, cap - seq, d), dtype=k.dtype, device=k.device)
        k, v = torch.cat([k, pad], 2), torch.cat([v, pad], 2)
    lens = lens.to(device=k.device, dtype=torch.int32)
    kc, kmn, ksc, ksm = quantize_k(k, partition, bits, stochastic, seed)
    lv = (lens // partition) * partition if rqe else lens
    vc, vmn, vsc, vsm = quantize_v(v, lv, partition, bits, stochastic, seed + 1)
    tail = torch.zeros((b, h, partition, d), dtype=torch.float16, device=k.device)
    if rqe:
        idx = (lv[:, None] + torch.arange(partition, device=k.device)[None, :]).clamp(max=cap - 1)  # (B, PI)
        gathered = torch.gather(v, 2, idx[:, None, :, None].expand(b, h, partition, d).long())
        keep = torch.arange(partition, device=k.device)[None, :] < (lens - lv)[:, None]
        tail = torch.where(keep[:, None, :, None], gathered, tail)
    return QuantKVCache(kc, kmn, ksc, ksm, vc, vmn, vsc, vsm, tail, lens, partition, bits, rqe)


def dequantize_cache_ref(cache: QuantKVCache) -> tuple[torch.Tensor, torch.Tensor]:
    """FP32 K, V [B, H, Lmax, D] as the cache represents them (tail in FP16 where RQE)."""
    pi, bits = cache.partition, cache.bits
    k = dequantize_k_ref(cache.k_codes.cpu(), cache.k_min.cpu(), cache.k_scale.cpu(), pi, bits)
    v = dequantize_v_ref(cache.v_codes.cpu(), cache.v_min.cpu(), cache.v_scale.cpu(), pi, bits)
    if cache.rqe:
        lens = cache.lens.cpu()
        for b in range(k.shape[0]):
            lv = int(lens[b]) // pi * pi
            n = int(lens[b]) - lv
            v[b, :, lv : lv + n] = cache.v_tail[b, :, :n].float().cpu()
    return k, v


@triton.jit
def append_one(
    KN,
    VN,
    pos,
    bh,
    KC,
    KMN,
    KSC,
    KSM,
    VC,
    VMN,
    VSC,
    VSM,
    VT,
    LMAX,
    NBLK,
    seed,
    D: tl.constexpr,
    PI: tl.constexpr,
    BITS: tl.constexpr,
    RQE: tl.constexpr,
    STOCHASTIC: tl.constexpr,
):
    """Append the new token (KN, VN [B*H, D] fp16, row bh) at position pos of (request, head) bh: its K
    quantized as its own NP partitions; its V into the FP16 tail (RQE; the block is quantized when the
    tail fills) or into the requantized partial block (no RQE).  One program per (b, h) calls it (the
    append kernel, or the fused decode step of hack_decode_rp.py)."""
    NP: tl.constexpr = D // PI
    W: tl.constexpr = D * BITS // 8
    LEVELS: tl.constexpr = (1 << BITS) - 1
    d = tl.arange(0, D)
    row = bh.to(tl.int64) * LMAX + pos
    # --- K: the new token is its own NP partitions.
    k = tl.load(KN + bh * D + d).to(tl.float32)
    k3 = tl.reshape(k, (1, NP, PI))
    offs = tl.reshape(row.to(tl.int32) * D + d, (1, NP, PI))
    y, mn16, sc16 = _quant_codes(
        k3, tl.min(k3, axis=2)[:, :, None], tl.max(k3, axis=2)[:, :, None], offs, seed, BITS, STOCHASTIC
    )
    packed = _pack_rows(tl.reshape(y, (1, D)), 1, D, BITS)
    wc = tl.arange(0, W)
    tl.store(KC + row * W + wc[None, :], packed.to(tl.uint8))
    pc = tl.arange(0, NP)
    tl.store(KMN + row * NP + pc, tl.reshape(mn16, (NP,)).to(tl.float16))
    tl.store(KSC + row * NP + pc, tl.reshape(sc16, (NP,)).to(tl.float16))
    tl.store(KSM + row * NP + pc, tl.reshape(tl.sum(y, axis=2), (NP,)).to(KSM.dtype.element_ty))
    # --- V
    vnew = tl.load(VN + bh * D + d).to(tl.float32)
    blk = pos // PI
    slot = pos % PI
    t = tl.arange(0, PI)
    brow = bh.to(tl.int64) * LMAX + blk * PI + t  # [PI] cache rows of this block
    mrow = (bh.to(tl.int64) * NBLK + blk) * D + d  # [D] this block's metadata
    if RQE:
        tl.store(VT + (bh * PI + slot) * D + d, vnew.to(tl.float16))
        if slot == PI - 1:  # the tail is full: quantize it into the cache (the [PI, D] tile is read only then)
            x = tl.load(VT + (bh * PI + t)[:, None] * D + d[None, :], mask=t[:, None] < slot, other=0.0)
            x = tl.where(t[:, None] == slot, vnew[None, :], x.to(tl.float32))
            _store_block(x, PI, t, d, brow, mrow, VC, VMN, VSC, VSM, seed, D, BITS, STOCHASTIC)
    else:
        # Dequantize the partial block, add the token, requantize with the new min and scale.
        byte = tl.load(VC + brow[:, None] * W + (d % W)[None, :], mask=t[:, None] < slot, other=0)
        code = ((byte.to(tl.int32) >> ((d // W) * BITS)[None, :]) & LEVELS).to(tl.float32)
        old_s = tl.load(VSC + mrow, mask=slot > 0, other=0.0).to(tl.float32)
        old_m = tl.load(VMN + mrow, mask=slot > 0, other=0.0).to(tl.float32)
        x = code * old_s[None, :] + old_m[None, :]
        x = tl.where(t[:, None] == slot, vnew[None, :], x)
        _store_block(x, slot + 1, t, d, brow, mrow, VC, VMN, VSC, VSM, seed, D, BITS, STOCHASTIC)


@triton.jit
def _store_block(
    x, cnt, t, d, brow, mrow, VC, VMN, VSC, VSM, seed, D: tl.constexpr, BITS: tl.constexpr, STOCHASTIC: tl.constexpr
):
    """Quantize the first cnt rows of a V block x [PI, D] per channel and store codes, min, scale, sums."""
    W: tl.constexpr = D * BITS // 8
    wc = tl.arange(0, W)
    tmask = t < cnt
    mn = tl.min(tl.where(tmask[:, None], x, float("inf")), axis=0)
    mx = tl.max(tl.where(tmask[:, None], x, float("-inf")), axis=0)
    offs2 = (brow[:, None] * D + d[None, :]).to(tl.int32) + 7919
    y2, mn2, sc2 = _quant_codes(x, mn[None, :], mx[None, :], offs2, seed, BITS, STOCHASTIC)
    y2 = tl.where(tmask[:, None], y2, 0.0)
    packed2 = _pack_rows(y2, x.shape[0], D, BITS)
    tl.store(VC + brow[:, None] * W + wc[None, :], packed2.to(tl.uint8), mask=tmask[:, None])
    tl.store(VMN + mrow, tl.reshape(mn2, (D,)).to(tl.float16))
    tl.store(VSC + mrow, tl.reshape(sc2, (D,)).to(tl.float16))
    tl.store(VSM + mrow, tl.sum(y2, axis=0).to(VSM.dtype.element_ty))


@triton.jit
def _append_kernel(
    KN,
    VN,
    LENS,
    LENS_OUT,
    KC,
    KMN,
    KSC,
    KSM,
    VC,
    VMN,
    VSC,
    VSM,
    VT,
    H,
    LMAX,
    NBLK,
    seed,
    D: tl.constexpr,
    PI: tl.constexpr,
    BITS: tl.constexpr,
    RQE: tl.constexpr,
    STOCHASTIC: tl.constexpr,
):
    # KN, VN [B, H, D] fp16: the new token; one program per (b, h).
    bh = tl.program_id(0)
    b = bh // H
    pos = tl.load(LENS + b)
    if bh % H == 0:
        tl.store(LENS_OUT + b, pos + 1)
    append_one(
        KN, VN, pos, bh, KC, KMN, KSC, KSM, VC, VMN, VSC, VSM, VT, LMAX, NBLK, seed, D, PI, BITS, RQE, STOCHASTIC
    )


def append_token(
    cache: QuantKVCache, k_new: torch.Tensor, v_new: torch.Tensor, stochastic: bool = True, seed: int = 0
) -> QuantKVCache:
    """Append one token per request (k_new, v_new [B, H, D] fp16) in place; returns the cache with
    lens + 1.  The caller guarantees lens < Lmax (no host sync here)."""
    b, h, lmax, d = cache.shape
    if k_new.shape != (b, h, d) or v_new.shape != (b, h, d):
        raise ValueError(f"k_new/v_new must be {(b, h, d)}")
    nblk = cache.v_min.shape[2]
    lens_out = torch.empty_like(cache.lens)
    _append_kernel[(b * h,)](
        k_new.contiguous(),
        v_new.contiguous(),
        cache.lens,
        lens_out,
        cache.k_codes,
        cache.k_min,
        cache.k_scale,
        cache.k_sum,
        cache.v_codes,
        cache.v_min,
        cache.v_scale,
        cache.v_sum,
        cache.v_tail,
        h,
        lmax,
        nblk,
        seed,
        D=d,
        PI=cache.partition,
        BITS=cache.bits,
        RQE=cache.rqe,
        STOCHASTIC=stochastic,
        num_warps=4,
    )
    return replace(cache, lens=lens_out)
