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
from .hack_core import cache_ptrs, flash_state, hack_pv, hack_scores, load_q_groups, prefill_rows, q_quantize
from .hack_decode_rp import _rp_tile, q_round_rows
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
    mblk, bhq, bh, rows, rmask = prefill_rows(HQ, HKV, L, G, BM)
    q0, q1, q2, q3 = load_q_groups(Q + bhq.to(tl.int64) * L * D, rows, rmask, W, D)
    qi0, qi1, qi2, qi3, a0, a1, a2, a3, b0, b1, b2, b3, c0, c1, c2, c3 = q_quantize(
        q0, q1, q2, q3, qk_scale, PI, GPP)
    kc, kmn, ksc, ksm, vc, vmn, vsc, vsm = cache_ptrs(KC, KMN, KSC, KSM, VC, VMN, VSC, VSM, bh, LMAX, NBLK, W, NP, D)
    m_i, l_i, o0, o1, o2, o3 = flash_state(BM, W)
    lo_diag = mblk * BM
    o0, o1, o2, o3, l_i, m_i = _hack_inner(
        o0, o1, o2, o3, l_i, m_i, qi0, qi1, qi2, qi3, a0, a1, a2, a3, b0, b1, b2, b3, c0, c1, c2, c3,
        kc, kmn, ksc, ksm, vc, vmn, vsc, vsm, rows, 0, lo_diag, L, W, D, PI, NP, GPP, USE_SE, USE_ASM, False)
    o0, o1, o2, o3, l_i, m_i = _hack_inner(
        o0, o1, o2, o3, l_i, m_i, qi0, qi1, qi2, qi3, a0, a1, a2, a3, b0, b1, b2, b3, c0, c1, c2, c3,
        kc, kmn, ksc, ksm, vc, vmn, vsc, vsm, rows, lo_diag, tl.minimum(lo_diag + BM, L), L,
        W, D, PI, NP, GPP, USE_SE, USE_ASM, True)
    _store_rows(O + bhq.to(tl.int64) * L * D, rows, rmask, o0, o1, o2, o3, l_i, D, W)


@triton.jit
def _store_rows(O, rows, rmask, o0, o1, o2, o3, l_i, D: tl.constexpr, W: tl.constexpr):
    """O/l of the program's query rows, FP16, into one (request, head)'s [L, D] output."""
    j = tl.arange(0, W)
    inv_l = 1.0 / l_i
    op = O + rows[:, None] * D + j[None, :]
    tl.store(op, (o0 * inv_l[:, None]).to(tl.float16), mask=rmask[:, None])
    tl.store(op + W, (o1 * inv_l[:, None]).to(tl.float16), mask=rmask[:, None])
    tl.store(op + 2 * W, (o2 * inv_l[:, None]).to(tl.float16), mask=rmask[:, None])
    tl.store(op + 3 * W, (o3 * inv_l[:, None]).to(tl.float16), mask=rmask[:, None])


@triton.jit
def _hack_prefill_rs_kernel(Q, KC, KMN, KSC, KSM, VC, VMN, VSC, VSM, O, qk_scale, HQ, HKV, L, LMAX, NBLK,
                            G: tl.constexpr, D: tl.constexpr, PI: tl.constexpr, BM: tl.constexpr,
                            USE_SE: tl.constexpr, USE_ASM: tl.constexpr):
    """Row-scaled variant: the decode row-packed kernel's tile (hack_decode_rp._rp_tile) on BM query
    rows of one head: Q rounded per row (its scale factored out of the scores), P rounded with one
    FMA, P row sums on the tensor cores, O and l kept x255, 128 sum v' added in INT32; one V block
    (PI tokens) per tile; unmasked below the diagonal, causal on it."""
    W: tl.constexpr = D // 4
    NP: tl.constexpr = D // PI
    GPP: tl.constexpr = PI // W
    mblk, bhq, bh, rows, rmask = prefill_rows(HQ, HKV, L, G, BM)
    q0, q1, q2, q3 = load_q_groups(Q + bhq.to(tl.int64) * L * D, rows, rmask, W, D)
    qi0, qi1, qi2, qi3, aq, beta, gm0, gm1, gm2, gm3 = q_round_rows(q0, q1, q2, q3, qk_scale, PI, GPP)
    ones_q = tl.full([BM, W], 1, tl.int8)
    inblk = tl.full([BM, PI], 1, tl.int1)
    cmask8 = tl.full([BM, PI], 1, tl.int8)
    ones_v = tl.full([PI, 16], 1, tl.int8)
    copy = tl.zeros([BM], tl.int32)
    kc, kmn, ksc, ksm, vc, vmn, vsc, vsm = cache_ptrs(KC, KMN, KSC, KSM, VC, VMN, VSC, VSM, bh, LMAX, NBLK, W, NP, D)
    m_i, l_i, o0, o1, o2, o3 = flash_state(BM, W)
    lo_diag = mblk * BM
    for s0 in range(0, lo_diag, PI):
        m_i, l_i, o0, o1, o2, o3 = _rp_tile(
            s0, L, m_i, l_i, o0, o1, o2, o3, qi0, qi1, qi2, qi3, ones_q, aq, beta, gm0, gm1, gm2, gm3,
            inblk, cmask8, ones_v, copy, kc, kmn, ksc, ksm, vc, vmn, vsc, vsm,
            W, D, NP, GPP, PI, 1, PI, USE_SE, USE_ASM, False, rows, False)
    for s0 in range(lo_diag, tl.minimum(lo_diag + BM, L), PI):
        m_i, l_i, o0, o1, o2, o3 = _rp_tile(
            s0, L, m_i, l_i, o0, o1, o2, o3, qi0, qi1, qi2, qi3, ones_q, aq, beta, gm0, gm1, gm2, gm3,
            inblk, cmask8, ones_v, copy, kc, kmn, ksc, ksm, vc, vmn, vsc, vsm,
            W, D, NP, GPP, PI, 1, PI, USE_SE, USE_ASM, True, rows, True)
    _store_rows(O + bhq.to(tl.int64) * L * D, rows, rmask, o0, o1, o2, o3, l_i, D, W)


def hack_attn_prefill(q: torch.Tensor, cache: QuantKVCache, use_se: bool = True, block_m: int | None = None,
                      num_warps: int | None = None, num_stages: int = 2, row_scaled: bool = True) -> torch.Tensor:
    """q [B, HQ, L, D] fp16; cache holds the same L tokens for every request (rqe=False, so every
    V token is quantized) -> [B, HQ, L, D] fp16.  row_scaled (default): the kernel built on the
    row-packed decode kernel's tile, Q rounded per row (run 22 at 16K: 31.2 vs 34.4 ms at PI 64,
    19.0 vs 24.5 ms at PI 128); False: the earlier kernel, Q rounded per partition."""
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
    kernel = _hack_prefill_rs_kernel if row_scaled else _hack_prefill_kernel
    kernel[(triton.cdiv(seq, block_m), b * hq)](
        q.contiguous(), cache.k_codes, cache.k_min, cache.k_scale, cache.k_sum,
        cache.v_codes, cache.v_min, cache.v_scale, cache.v_sum, o, qk_scale, hq, hkv, seq, lmax,
        cache.v_min.shape[2], G=hq // hkv, D=d, PI=cache.partition, BM=block_m, USE_SE=use_se,
        USE_ASM=use_asm(q), num_warps=num_warps, num_stages=num_stages)
    return o


def hack_attn_prefill_ref(q: torch.Tensor, cache: QuantKVCache, q_per_row: bool = False) -> torch.Tensor:
    """float64: Q rounded to 8 bits per partition (per row of head_dim with q_per_row, as the
    row-scaled kernel does), the cache's dequantized K/V, P to 1/255 steps."""
    k, v = dequantize_cache_ref(cache)
    pi = q.shape[-1] if q_per_row else cache.partition
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
