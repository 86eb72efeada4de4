"""HACK prefill attention: INT8 Q (quantized in-kernel) against the 2-bit K/V codes, causal, GQA.

grid (cdiv(L, BM), B * H_q).  Q rows are quantized per partition of PI channels to 8 bits on
entry; each iteration takes one V block (PI tokens): four INT8 dots for Q.K^T (one per bit plane /
channel group), the correction terms with the stored sums (SE), online softmax, P rounded to
multiples of 1/255 as INT8, four INT8 dots for P.V (hack_core.py).  K/V are the quantized
prefill KV that HACK sends over the wire (quantize.py); the last partial V block is quantized with
its own count (no FP16 tail in prefill: the FP16 originals are at hand).

causal flops = 4 * H_q * D * sum_b L_b (L_b + 1) / 2 (counted as if dense; INT8 ops).
"""
from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from .common import online_softmax, use_asm
from .hack_core import hack_pv, hack_scores, load_q_groups, q_quantize
from .kv_cache import QuantKVCache, dequantize_cache_ref


@triton.jit
def _hack_inner(o0, o1, o2, o3, l_i, m_i, qi0, qi1, qi2, qi3, a0, a1, a2, a3, b0, b1, b2, b3,
                c0, c1, c2, c3, kc, kmn, ksc, ksm, vc, vmn, vsc, vsm, rows, lo, hi, L,
                W: tl.constexpr, D: tl.constexpr, PI: tl.constexpr, NP: tl.constexpr, GPP: tl.constexpr,
                USE_SE: tl.constexpr, USE_ASM: tl.constexpr, MASKED: tl.constexpr):
    for s0 in range(lo, hi, PI):
        tok = s0 + tl.arange(0, PI)
        tmask = tok < L
        s = hack_scores(qi0, qi1, qi2, qi3, a0, a1, a2, a3, b0, b1, b2, b3, c0, c1, c2, c3,
                        kc, kmn, ksc, ksm, tok, tmask, W, NP, GPP, USE_SE, USE_ASM)
        if MASKED:
            s = tl.where((tok[None, :] <= rows[:, None]) & tmask[None, :], s, float("-inf"))
        m_new, alpha, p = online_softmax(s, m_i)
        o0, o1, o2, o3, lsum = hack_pv(o0, o1, o2, o3, p, alpha, vc, vmn, vsc, vsm, tok, tmask,
                                       s0 // PI, W, D, USE_SE, USE_ASM)
        l_i = l_i * alpha + lsum
        m_i = m_new
    return o0, o1, o2, o3, l_i, m_i


@triton.jit
def _hack_prefill_kernel(Q, KC, KMN, KSC, KSM, VC, VMN, VSC, VSM, O, qk_scale, HQ, HKV, L, LMAX, NBLK,
                         G: tl.constexpr, D: tl.constexpr, PI: tl.constexpr, BM: tl.constexpr,
                         USE_SE: tl.constexpr, USE_ASM: tl.constexpr):
    W: tl.constexpr = D // 4
    NP: tl.constexpr = D // PI
    GPP: tl.constexpr = PI // W
    mblk = tl.program_id(0)
    bhq = tl.program_id(1)
    b = bhq // HQ
    hq = bhq % HQ
    bh = b * HKV + hq // G
    rows = mblk * BM + tl.arange(0, BM)
    rmask = rows < L
    j = tl.arange(0, W)
    q0, q1, q2, q3 = load_q_groups(Q + bhq.to(tl.int64) * L * D, rows, rmask, W, D)
    qi0, qi1, qi2, qi3, a0, a1, a2, a3, b0, b1, b2, b3, c0, c1, c2, c3 = q_quantize(
        q0, q1, q2, q3, qk_scale, PI, GPP)
    tok0 = bh.to(tl.int64) * LMAX
    moff = bh.to(tl.int64) * NBLK * D
    m_i = tl.full([BM], float("-inf"), tl.float32)
    l_i = tl.zeros([BM], tl.float32)
    o0 = tl.zeros([BM, W], tl.float32)
    o1 = tl.zeros([BM, W], tl.float32)
    o2 = tl.zeros([BM, W], tl.float32)
    o3 = tl.zeros([BM, W], tl.float32)
    lo_diag = mblk * BM
    o0, o1, o2, o3, l_i, m_i = _hack_inner(
        o0, o1, o2, o3, l_i, m_i, qi0, qi1, qi2, qi3, a0, a1, a2, a3, b0, b1, b2, b3, c0, c1, c2, c3,
        KC + tok0 * W, KMN + tok0 * NP, KSC + tok0 * NP, KSM + tok0 * NP, VC + tok0 * W,
        VMN + moff, VSC + moff, VSM + moff, rows, 0, lo_diag, L, W, D, PI, NP, GPP, USE_SE, USE_ASM, False)
    o0, o1, o2, o3, l_i, m_i = _hack_inner(
        o0, o1, o2, o3, l_i, m_i, qi0, qi1, qi2, qi3, a0, a1, a2, a3, b0, b1, b2, b3, c0, c1, c2, c3,
        KC + tok0 * W, KMN + tok0 * NP, KSC + tok0 * NP, KSM + tok0 * NP, VC + tok0 * W,
        VMN + moff, VSC + moff, VSM + moff, rows, lo_diag, tl.minimum(lo_diag + BM, L), L,
        W, D, PI, NP, GPP, USE_SE, USE_ASM, True)
    inv_l = 1.0 / l_i
    op = O + bhq.to(tl.int64) * L * D + rows[:, None] * D + j[None, :]
    tl.store(op, (o0 * inv_l[:, None]).to(tl.float16), mask=rmask[:, None])
    tl.store(op + W, (o1 * inv_l[:, None]).to(tl.float16), mask=rmask[:, None])
    tl.store(op + 2 * W, (o2 * inv_l[:, None]).to(tl.float16), mask=rmask[:, None])
    tl.store(op + 3 * W, (o3 * inv_l[:, None]).to(tl.float16), mask=rmask[:, None])


def hack_attn_prefill(q: torch.Tensor, cache: QuantKVCache, use_se: bool = True, block_m: int | None = None,
                      num_warps: int | None = None, num_stages: int = 2) -> torch.Tensor:
    """q [B, HQ, L, D] fp16; cache holds the same L tokens for every request (rqe=False, so every
    V token is quantized) -> [B, HQ, L, D] fp16."""
    b, hq, seq, d = q.shape
    cb, hkv, lmax, cd = cache.shape
    if cb != b or cd != d or hq % hkv or lmax < seq:
        raise ValueError("q does not match the cache")
    if cache.rqe or cache.bits != 2 or d % 128 or cache.partition % (d // 4) or (block_m or 128) % cache.partition:
        raise ValueError("prefill takes a 2-bit cache without tail, D % 128 == 0, PI | BM")
    # measured on the H200 at 16K tokens (NOTES.md): BM 64 / 4 warps for PI <= 64, BM 128 / 8 warps for 128
    block_m = block_m or (64 if cache.partition <= 64 else 128)
    num_warps = num_warps or (4 if block_m == 64 else 8)
    o = torch.empty_like(q)
    qk_scale = 1.0 / math.sqrt(d) * 1.4426950408889634
    _hack_prefill_kernel[(triton.cdiv(seq, block_m), b * hq)](
        q.contiguous(), cache.k_codes, cache.k_min, cache.k_scale, cache.k_sum,
        cache.v_codes, cache.v_min, cache.v_scale, cache.v_sum, o, qk_scale, hq, hkv, seq, lmax,
        cache.v_min.shape[2], G=hq // hkv, D=d, PI=cache.partition, BM=block_m, USE_SE=use_se,
        USE_ASM=use_asm(q), num_warps=num_warps, num_stages=num_stages)
    return o


def hack_attn_prefill_ref(q: torch.Tensor, cache: QuantKVCache) -> torch.Tensor:
    """float64: Q rounded to 8 bits per partition, the cache's dequantized K/V, P to 1/255 steps."""
    k, v = dequantize_cache_ref(cache)
    pi = cache.partition
    b, hq, seq, d = q.shape
    qf = q.double().cpu()
    qp = qf.reshape(b, hq, seq, d // pi, pi)
    mn, mx = qp.amin(-1, keepdim=True), qp.amax(-1, keepdim=True)
    s = (mx - mn) / 255
    code = torch.where(s > 0, torch.floor((qp - mn) / torch.where(s > 0, s, 1) + 0.5), 0 * qp).clamp(0, 255)
    qd = (code * s + mn).reshape(qf.shape)
    g = hq // k.shape[1]
    kk = k[:, :, :seq].double().repeat_interleave(g, 1)
    vv = v[:, :, :seq].double().repeat_interleave(g, 1)
    sc = qd @ kk.transpose(-1, -2) / math.sqrt(d)
    sc = sc.masked_fill(torch.triu(torch.ones(seq, seq, dtype=torch.bool), 1), float("-inf"))
    p = torch.exp(sc - sc.amax(-1, keepdim=True))
    p = torch.floor(p * 255 + 0.5) / 255
    return (p @ vv) / p.sum(-1, keepdim=True)
