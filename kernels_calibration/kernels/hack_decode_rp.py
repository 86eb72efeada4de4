"""Row-packed HACK decode attention: the padding rows of the 16-row dots do useful work.

hack_attn_decode.py gives the G = 8 query heads of a KV head a 16-row tile (mma.sync's M = 16), so
half of every per-element correction, softmax and rounding step runs on padding rows, and a
128-token tile at PI = 64 takes two P.V products (one per V block) with two [16, D] corrections.
Here the R = 16 / G copies of the head group fill the rows (row r = head r mod G, copy r div G):
  * scores are computed once for all rows (the copies repeat them: no extra work, the rows existed);
  * P.V: a tile is R V blocks (BN = R * PI tokens); copy k keeps only block k's columns of P'', so
    ONE INT8 product per channel group gives every block's sum in its own rows, and the block's
    scale, min and sums are applied in one [16, D] pass instead of R;
  * the copies' partial (O, l) are written as extra splits; the split combine adds them (same m).
Arithmetic changes that cut per-element CUDA-core work, each exact algebra or HACK-conform rounding:
  * Q is rounded to 8 bits per query head (one scale and min over head_dim) instead of per K
    partition: the homomorphic identity holds for any Q partition that covers the K partition, and
    the per-head scale a factors out of every K partition, so a score is
        a * [ sum_p sk_p I_p + beta sum_p sk_p ks_p + sum_p gamma_p mk_p ]
    (I_p the INT32 dot of K partition p, sk/mk/ks its scale, min and stored code sum, beta and gamma
    per row); a is applied inside the exp2 argument (one FMA) and the token terms are vectors;
  * P is rounded with one FMA: p * 255 + (1.5 * 2^23 + 128) leaves round(255 p) + 128 in the low
    byte of the float, which is p'' = round(255 p) - 128 as INT8 (round half to even, not up);
    the row sums of u = p'' + 128 come from the tensor cores (P'' times a ones tile);
  * O and l are kept times 255 (sum p v = (1/255) sum u v), and the 128 sum v' term of the shifted
    P'' is added to the INT32 product before its one conversion;
  * full tiles run without masks; only the last tile of the last split is masked.
The FP16 V tail (RQE) is multiplied by copy 0 only.  Without SE the code sums come from ones tiles
on the tensor cores (K: a ones Q tile, V: the per-copy block mask as INT8 rows).

Measured on the H200 (NOTES.md, session 3; batch 8, 64/8 heads, PI 64): 32K context 138.6 us
(register cap 128, 2 warps; SDPA 249.0 us, the head-major kernel 194-205 us), 1K 17.3 us (SDPA
17.2 us).  Offline sm_90 SASS (python -m kernels_calibration.sass): 2,946 warp-instructions per 128
tokens against 4,530 for the head-major kernel; at 241 registers per thread only 4 programs fit an
SM, which the register cap (ptxas spills a little) turns into 8.
"""
from __future__ import annotations

import math
from dataclasses import replace

import torch
import triton
import triton.language as tl

from .common import online_softmax, unpack_codes, use_asm
from .hack_core import cache_ptrs, flash_state, load_q_groups, store_partials, tail_pv
from .kv_cache import QuantKVCache, append_one


@triton.jit
def _kvec(KX, tok, tmask, p: tl.constexpr, NP: tl.constexpr, MASKED: tl.constexpr):
    if MASKED:
        r = tl.load(KX + tok * NP + p, mask=tmask, other=0)
    else:
        r = tl.load(KX + tok * NP + p)
    return r.to(tl.float32)


@triton.jit
def _part_term(x, i, KMN, KSC, KSM, kcs, tok, tmask, p: tl.constexpr, NP: tl.constexpr, beta, gamma,
               USE_SE: tl.constexpr, MASKED: tl.constexpr):
    """x + sk_p (I_p + beta ks_p) + gamma_p mk_p for one K partition ([R, BN]; x = 0 for the first).
    Each term is added to the dot's result in turn so that Triton keeps it in the dot's layout."""
    sk = _kvec(KSC, tok, tmask, p, NP, MASKED)
    mk = _kvec(KMN, tok, tmask, p, NP, MASKED)
    if USE_SE:
        ks = _kvec(KSM, tok, tmask, p, NP, MASKED)
        t = i.to(tl.float32) + beta[:, None] * ks[None, :]
    else:
        t = i.to(tl.float32) + beta[:, None] * kcs.to(tl.float32)
    x = x + t * sk[None, :]
    return x + gamma[:, None] * mk[None, :]


@triton.jit
def _rp_scores(qi0, qi1, qi2, qi3, ones_q, beta, gm0, gm1, gm2, gm3, KC, KMN, KSC, KSM, tok, tmask,
               W: tl.constexpr, NP: tl.constexpr, GPP: tl.constexpr, USE_SE: tl.constexpr,
               USE_ASM: tl.constexpr, MASKED: tl.constexpr):
    """x [R, BN] with log2 score = a * x (see module docstring)."""
    j = tl.arange(0, W)
    if MASKED:
        kb = tl.load(KC + tok[None, :] * W + j[:, None], mask=tmask[None, :], other=0)  # [W, BN] uint8
    else:
        kb = tl.load(KC + tok[None, :] * W + j[:, None])
    k0 = unpack_codes(kb, 0, 2, USE_ASM)
    k1 = unpack_codes(kb, 2, 2, USE_ASM)
    k2 = unpack_codes(kb, 4, 2, USE_ASM)
    k3 = unpack_codes(kb, 6, 2, USE_ASM)
    if GPP == 1:
        c0 = 0
        c1 = 0
        c2 = 0
        c3 = 0
        if not USE_SE:
            c0 = tl.dot(ones_q, k0, out_dtype=tl.int32)
            c1 = tl.dot(ones_q, k1, out_dtype=tl.int32)
            c2 = tl.dot(ones_q, k2, out_dtype=tl.int32)
            c3 = tl.dot(ones_q, k3, out_dtype=tl.int32)
        x = _part_term(0.0, tl.dot(qi0, k0, out_dtype=tl.int32), KMN, KSC, KSM, c0, tok, tmask, 0, NP, beta, gm0,
                       USE_SE, MASKED)
        x = _part_term(x, tl.dot(qi1, k1, out_dtype=tl.int32), KMN, KSC, KSM, c1, tok, tmask, 1, NP, beta, gm1,
                       USE_SE, MASKED)
        x = _part_term(x, tl.dot(qi2, k2, out_dtype=tl.int32), KMN, KSC, KSM, c2, tok, tmask, 2, NP, beta, gm2,
                       USE_SE, MASKED)
        x = _part_term(x, tl.dot(qi3, k3, out_dtype=tl.int32), KMN, KSC, KSM, c3, tok, tmask, 3, NP, beta, gm3,
                       USE_SE, MASKED)
    elif GPP == 2:
        i0 = tl.dot(qi1, k1, tl.dot(qi0, k0, out_dtype=tl.int32), out_dtype=tl.int32)
        i1 = tl.dot(qi3, k3, tl.dot(qi2, k2, out_dtype=tl.int32), out_dtype=tl.int32)
        c0 = 0
        c1 = 0
        if not USE_SE:
            c0 = tl.dot(ones_q, k1, tl.dot(ones_q, k0, out_dtype=tl.int32), out_dtype=tl.int32)
            c1 = tl.dot(ones_q, k3, tl.dot(ones_q, k2, out_dtype=tl.int32), out_dtype=tl.int32)
        x = _part_term(0.0, i0, KMN, KSC, KSM, c0, tok, tmask, 0, NP, beta, gm0, USE_SE, MASKED)
        x = _part_term(x, i1, KMN, KSC, KSM, c1, tok, tmask, 1, NP, beta, gm2, USE_SE, MASKED)
    else:
        i0 = tl.dot(qi0, k0, out_dtype=tl.int32)
        i0 = tl.dot(qi1, k1, i0, out_dtype=tl.int32)
        i0 = tl.dot(qi2, k2, i0, out_dtype=tl.int32)
        i0 = tl.dot(qi3, k3, i0, out_dtype=tl.int32)
        c0 = 0
        if not USE_SE:
            c0 = tl.dot(ones_q, k0, out_dtype=tl.int32)
            c0 = tl.dot(ones_q, k1, c0, out_dtype=tl.int32)
            c0 = tl.dot(ones_q, k2, c0, out_dtype=tl.int32)
            c0 = tl.dot(ones_q, k3, c0, out_dtype=tl.int32)
        x = _part_term(0.0, i0, KMN, KSC, KSM, c0, tok, tmask, 0, NP, beta, gm0, USE_SE, MASKED)
    return x


@triton.jit
def _sel_rows(copy, vec0, vec1, vec2, vec3, R: tl.constexpr):
    """[R_rows, W] tile whose rows of copy k hold vec_k."""
    if R == 1:
        t = tl.broadcast_to(vec0[None, :], (copy.shape[0], vec0.shape[0]))
    elif R == 2:
        t = tl.where((copy == 0)[:, None], vec0[None, :], vec1[None, :])
    else:
        t = tl.where((copy == 0)[:, None], vec0[None, :], vec1[None, :])
        t = tl.where((copy == 2)[:, None], vec2[None, :], t)
        t = tl.where((copy == 3)[:, None], vec3[None, :], t)
    return t


@triton.jit
def _vblock(VX, blk, end, off, k: tl.constexpr, R: tl.constexpr, PI: tl.constexpr, D: tl.constexpr,
            MASKED: tl.constexpr):
    """Metadata vector of V block blk + k (k < R) for channels off, in its stored dtype."""
    if k < R:
        if MASKED:
            r = tl.load(VX + (blk + k) * D + off, mask=(blk + k) * PI < end, other=0)
        else:
            r = tl.load(VX + (blk + k) * D + off)
    else:
        r = tl.zeros([off.shape[0]], VX.dtype.element_ty)
    return r


@triton.jit
def _rp_v_update(o, p8, usum, alpha, vcode, cmask8, copy, VMN, VSC, VSM, blk, end, off,
                 R: tl.constexpr, PI: tl.constexpr, D: tl.constexpr, USE_SE: tl.constexpr, MASKED: tl.constexpr):
    """o <- alpha o + sv (P''V' + 128 vs) + mv u for one channel group, each copy's rows against its
    own V block (o and l are kept times 255: sum p v = (1/255) sum u v)."""
    acc = tl.dot(p8, vcode, out_dtype=tl.int32)  # [R_rows, W]
    if USE_SE:
        vs = _sel_rows(copy, _vblock(VSM, blk, end, off, 0, R, PI, D, MASKED).to(tl.int32),
                       _vblock(VSM, blk, end, off, 1, R, PI, D, MASKED).to(tl.int32),
                       _vblock(VSM, blk, end, off, 2, R, PI, D, MASKED).to(tl.int32),
                       _vblock(VSM, blk, end, off, 3, R, PI, D, MASKED).to(tl.int32), R)
    else:
        vs = tl.dot(cmask8, vcode, out_dtype=tl.int32)  # each copy's block code sums
    a = _sel_rows(copy, _vblock(VSC, blk, end, off, 0, R, PI, D, MASKED).to(tl.float32),
                  _vblock(VSC, blk, end, off, 1, R, PI, D, MASKED).to(tl.float32),
                  _vblock(VSC, blk, end, off, 2, R, PI, D, MASKED).to(tl.float32),
                  _vblock(VSC, blk, end, off, 3, R, PI, D, MASKED).to(tl.float32), R)
    o = o * alpha[:, None] + a * (acc + vs * 128).to(tl.float32)  # sum u v' = sum p''v' + 128 sum v' (INT32)
    mv = _sel_rows(copy, _vblock(VMN, blk, end, off, 0, R, PI, D, MASKED).to(tl.float32),
                   _vblock(VMN, blk, end, off, 1, R, PI, D, MASKED).to(tl.float32),
                   _vblock(VMN, blk, end, off, 2, R, PI, D, MASKED).to(tl.float32),
                   _vblock(VMN, blk, end, off, 3, R, PI, D, MASKED).to(tl.float32), R)
    return o + mv * usum[:, None]


@triton.jit
def _rp_tile(s0, end, m_i, l_i, o0, o1, o2, o3, qi0, qi1, qi2, qi3, ones_q, aq, beta, gm0, gm1, gm2, gm3,
             inblk, cmask8, ones_v, copy, KC, KMN, KSC, KSM, VC, VMN, VSC, VSM,
             W: tl.constexpr, D: tl.constexpr, NP: tl.constexpr, GPP: tl.constexpr, PI: tl.constexpr,
             R: tl.constexpr, BN: tl.constexpr, USE_SE: tl.constexpr, USE_ASM: tl.constexpr,
             MASKED: tl.constexpr, rows, CAUSAL: tl.constexpr):
    """One tile of BN tokens from s0 (tokens >= end masked when MASKED; token > row masked when CAUSAL,
    rows [R_rows] the query positions): the online-softmax state and the four O accumulators."""
    tok = s0 + tl.arange(0, BN)
    tmask = tok < end
    x = _rp_scores(qi0, qi1, qi2, qi3, ones_q, beta, gm0, gm1, gm2, gm3, KC, KMN, KSC, KSM, tok, tmask,
                   W, NP, GPP, USE_SE, USE_ASM, MASKED)
    if CAUSAL:
        x = tl.where((tok[None, :] <= rows[:, None]) & tmask[None, :], x, float("-inf"))
    elif MASKED:
        x = tl.where(tmask[None, :], x, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(x, 1) * aq)
    alpha = tl.exp2(m_i - m_new)
    p = tl.exp2(x * aq[:, None] - m_new[:, None])
    bits = (p * 255.0 + 12583040.0).to(tl.int32, bitcast=True)  # low byte: round(255 p) - 128 (INT8)
    p8 = tl.where(inblk, bits, 0).to(tl.int8)
    usum = tl.max(tl.dot(p8, ones_v, out_dtype=tl.int32), 1).to(tl.float32) + 128.0 * PI
    j = tl.arange(0, W)
    if MASKED:
        vb = tl.load(VC + tok[:, None] * W + j[None, :], mask=tmask[:, None], other=0)  # [BN, W] uint8
    else:
        vb = tl.load(VC + tok[:, None] * W + j[None, :])
    blk = s0 // PI
    o0 = _rp_v_update(o0, p8, usum, alpha, unpack_codes(vb, 0, 2, USE_ASM), cmask8, copy, VMN, VSC, VSM, blk, end,
                      j, R, PI, D, USE_SE, MASKED)
    o1 = _rp_v_update(o1, p8, usum, alpha, unpack_codes(vb, 2, 2, USE_ASM), cmask8, copy, VMN, VSC, VSM, blk, end,
                      j + W, R, PI, D, USE_SE, MASKED)
    o2 = _rp_v_update(o2, p8, usum, alpha, unpack_codes(vb, 4, 2, USE_ASM), cmask8, copy, VMN, VSC, VSM, blk, end,
                      j + 2 * W, R, PI, D, USE_SE, MASKED)
    o3 = _rp_v_update(o3, p8, usum, alpha, unpack_codes(vb, 6, 2, USE_ASM), cmask8, copy, VMN, VSC, VSM, blk, end,
                      j + 3 * W, R, PI, D, USE_SE, MASKED)
    l_i = l_i * alpha + usum
    return m_new, l_i, o0, o1, o2, o3


@triton.jit
def q_round_rows(q0, q1, q2, q3, qk_scale, PI: tl.constexpr, GPP: tl.constexpr):
    """Q rows (four channel groups [R, W], FP32) to 8 bits with one scale and min per row:
    q'' = code - 128 (INT8 per group); log2 score = aq * x with x as in _rp_scores (aq = scale *
    qk_scale, beta = min / scale + 128, gm_c = sum of q'' over the K partition of group c + PI beta)."""
    mn = tl.minimum(tl.minimum(tl.min(q0, 1), tl.min(q1, 1)), tl.minimum(tl.min(q2, 1), tl.min(q3, 1)))
    mx = tl.maximum(tl.maximum(tl.max(q0, 1), tl.max(q1, 1)), tl.maximum(tl.max(q2, 1), tl.max(q3, 1)))
    sq = (mx - mn) / 255.0
    sq = tl.where(sq > 0, sq, 1.0)  # a constant row is exact with any scale (all codes 0)
    inv = 1.0 / sq
    c0 = tl.minimum(tl.maximum(tl.floor((q0 - mn[:, None]) * inv[:, None] + 0.5), 0.0), 255.0) - 128.0
    c1 = tl.minimum(tl.maximum(tl.floor((q1 - mn[:, None]) * inv[:, None] + 0.5), 0.0), 255.0) - 128.0
    c2 = tl.minimum(tl.maximum(tl.floor((q2 - mn[:, None]) * inv[:, None] + 0.5), 0.0), 255.0) - 128.0
    c3 = tl.minimum(tl.maximum(tl.floor((q3 - mn[:, None]) * inv[:, None] + 0.5), 0.0), 255.0) - 128.0
    beta = mn * inv + 128.0
    gm0 = tl.sum(c0, 1)
    gm1 = tl.sum(c1, 1)
    gm2 = tl.sum(c2, 1)
    gm3 = tl.sum(c3, 1)
    if GPP == 2:
        gm0 = gm0 + gm1
        gm2 = gm2 + gm3
    if GPP == 4:
        gm0 = gm0 + gm1 + gm2 + gm3
    gm0 += PI * beta
    gm1 += PI * beta
    gm2 += PI * beta
    gm3 += PI * beta
    return (c0.to(tl.int8), c1.to(tl.int8), c2.to(tl.int8), c3.to(tl.int8), sq * qk_scale, beta,
            gm0, gm1, gm2, gm3)


@triton.jit
def _rp_decode_kernel(Q, KC, KMN, KSC, KSM, VC, VMN, VSC, VSM, VT, LENS, OP, LSEP,
                      qk_scale, HKV, LMAX, NBLK, TPS, NSPLIT, KN, VN, LENS_OUT, seed,
                      G: tl.constexpr, RP: tl.constexpr, R: tl.constexpr, D: tl.constexpr, PI: tl.constexpr,
                      USE_SE: tl.constexpr, HAS_TAIL: tl.constexpr, USE_ASM: tl.constexpr,
                      APPEND: tl.constexpr = False, STOCHASTIC: tl.constexpr = True):
    W: tl.constexpr = D // 4
    NP: tl.constexpr = D // PI
    GPP: tl.constexpr = PI // W
    BN: tl.constexpr = R * PI
    bh = tl.program_id(0)
    split = tl.program_id(1)
    b = bh // HKV
    L = tl.load(LENS + b)
    if APPEND:
        # Fused decode step (RQE only): the last split appends the new token (K quantized at position
        # L, V into the FP16 tail; a tail that fills is quantized into the cache, as append_token does)
        # and then attends over L + 1 tokens, the tail in FP16 (quantizing after the step's attention).
        # No other program reads position L or the tail block, so no other program waits for it.
        LV = (L // PI) * PI
        if split == NSPLIT - 1:
            if bh % HKV == 0:
                tl.store(LENS_OUT + b, L + 1)
            append_one(KN, VN, L, bh, KC, KMN, KSC, KSM, VC, VMN, VSC, VSM, VT, LMAX, NBLK, seed,
                       D, PI, 2, True, STOCHASTIC)
            tl.debug_barrier()  # the new token's K codes and V row, written above, are read below
        L = L + 1
    elif HAS_TAIL:
        LV = (L // PI) * PI
    else:
        LV = L
    start = split * TPS
    end = tl.minimum(start + TPS, LV)
    r = tl.arange(0, RP)
    copy = r // G
    rmask = r < G * R
    qrow = (b * HKV + bh % HKV) * G + r % G
    # --- Q: 8 bits per query head (one scale/min over head_dim), q'' = code - 128.
    q0, q1, q2, q3 = load_q_groups(Q, qrow, rmask, W, D)
    qi0, qi1, qi2, qi3, aq, beta, gm0, gm1, gm2, gm3 = q_round_rows(q0, q1, q2, q3, qk_scale, PI, GPP)
    ones_q = tl.full([RP, W], 1, tl.int8)
    cols = tl.arange(0, BN)
    inblk = (cols[None, :] // PI) == copy[:, None]
    cmask8 = inblk.to(tl.int8)
    ones_v = tl.full([BN, 16], 1, tl.int8)
    kc, kmn, ksc, ksm, vc, vmn, vsc, vsm = cache_ptrs(KC, KMN, KSC, KSM, VC, VMN, VSC, VSM, bh, LMAX, NBLK, W, NP, D)
    m_i, l_i, o0, o1, o2, o3 = flash_state(RP, W)
    end_full = start + tl.maximum(end - start, 0) // BN * BN
    for s0 in range(start, end_full, BN):
        m_i, l_i, o0, o1, o2, o3 = _rp_tile(
            s0, end, m_i, l_i, o0, o1, o2, o3, qi0, qi1, qi2, qi3, ones_q, aq, beta, gm0, gm1, gm2, gm3,
            inblk, cmask8, ones_v, copy, kc, kmn, ksc, ksm, vc, vmn, vsc, vsm,
            W, D, NP, GPP, PI, R, BN, USE_SE, USE_ASM, False, copy, False)
    if end_full < end:
        m_i, l_i, o0, o1, o2, o3 = _rp_tile(
            end_full, end, m_i, l_i, o0, o1, o2, o3, qi0, qi1, qi2, qi3, ones_q, aq, beta, gm0, gm1, gm2, gm3,
            inblk, cmask8, ones_v, copy, kc, kmn, ksc, ksm, vc, vmn, vsc, vsm,
            W, D, NP, GPP, PI, R, BN, USE_SE, USE_ASM, True, copy, False)
    if HAS_TAIL:
        # RQE: the last < PI tokens have quantized K but FP16 V; copy 0 of the last split takes them.
        if (split == NSPLIT - 1) & (L > LV):
            tok = LV + tl.arange(0, PI)
            tmask = tok < L
            x = _rp_scores(qi0, qi1, qi2, qi3, ones_q, beta, gm0, gm1, gm2, gm3, kc, kmn, ksc, ksm, tok, tmask,
                           W, NP, GPP, USE_SE, USE_ASM, True)
            x = tl.where(tmask[None, :], x, float("-inf"))
            m_new, alpha, p = online_softmax(x * aq[:, None], m_i)
            p = tl.where((copy == 0)[:, None], p * 255.0, 0.0)  # o and l are kept times 255
            o0, o1, o2, o3 = tail_pv(o0, o1, o2, o3, p.to(tl.float16), alpha, VT, bh, L - LV, PI, D, W)
            l_i = l_i * alpha + tl.sum(p, 1)
            m_i = m_new
    # each copy is a split of its own
    store_partials(OP, LSEP, qrow.to(tl.int64) * (NSPLIT * R) + split * R + copy, rmask, o0, o1, o2, o3, l_i, m_i,
                   D, W)


def row_copies(g: int) -> tuple[int, int]:
    """(rows of the dot tile, copies of the head group in it) for G query heads per KV head."""
    rp = max(16, triton.next_power_of_2(g))
    return rp, max(1, rp // g)


def row_packed_supported(q: torch.Tensor, cache: QuantKVCache) -> bool:
    """The shapes this kernel takes: 2-bit codes, head_dim 128, PI 32/64/128, 4-16 query heads per KV head."""
    b, hkv, _, d = cache.shape
    g = q.shape[1] // hkv if q.dim() == 3 and q.shape[1] % hkv == 0 else 0
    return cache.bits == 2 and d == 128 and cache.partition in (32, 64, 128) and 4 <= g <= 16


def hack_attn_decode_rp(q: torch.Tensor, cache: QuantKVCache, use_se: bool = True, splits: int | None = None,
                        max_len: int | None = None, num_warps: int = 4, num_stages: int = 2,
                        maxnreg: int | None = None, append: tuple | None = None):
    """q [B, HQ, D] fp16 (the new token's query, already appended to the cache) -> [B, HQ, D] fp16.
    maxnreg caps registers per thread (more programs per SM; ptxas spills beyond the cap).
    append = (k_new, v_new, seed, stochastic): the fused step (hack_decode_step); returns (out, cache)."""
    from .hack_attn_decode import default_splits, run_split_decode

    b, hkv, lmax, d = cache.shape
    g = cache.query_group(q)
    if cache.bits != 2 or d != 128:
        raise ValueError("the row-packed HACK decode kernel takes 2-bit codes and head_dim 128")
    pi = cache.partition
    if pi not in (32, 64, 128):
        raise ValueError(f"partition {pi} must be 32, 64 or 128")
    rp, r = row_copies(g)
    if r > 4:
        raise ValueError(f"{g} query heads per KV head: at most 4 copies of the group fit the kernel")
    bn = r * pi
    max_len = lmax if max_len is None else max_len
    splits = splits or default_splits(b, hkv, max_len, bn, q.device)
    tps = triton.cdiv(triton.cdiv(max_len, splits), bn) * bn
    splits = triton.cdiv(max_len, tps)
    qk_scale = 1.0 / math.sqrt(d) * 1.4426950408889634
    q = q.contiguous()

    if append is not None:
        k_new, v_new, seed, stochastic = append
        if not cache.rqe:
            raise ValueError("the fused decode step needs the RQE cache (FP16 V tail)")
        if k_new.shape != (b, hkv, d) or v_new.shape != (b, hkv, d):
            raise ValueError(f"k_new/v_new must be {(b, hkv, d)}")
        lens_out = torch.empty_like(cache.lens)
        extra = (k_new.contiguous(), v_new.contiguous(), lens_out, seed)
    else:
        stochastic = True
        extra = (q, q, cache.lens, 0)  # unused

    def launch(op, lsep):
        _rp_decode_kernel[(b * hkv, splits)](
            q, cache.k_codes, cache.k_min, cache.k_scale, cache.k_sum,
            cache.v_codes, cache.v_min, cache.v_scale, cache.v_sum, cache.v_tail, cache.lens, op, lsep,
            qk_scale, hkv, lmax, cache.v_min.shape[2], tps, splits, *extra,
            G=g, RP=rp, R=r, D=d, PI=pi, USE_SE=use_se, HAS_TAIL=cache.rqe, USE_ASM=use_asm(q),
            APPEND=append is not None, STOCHASTIC=stochastic,
            num_warps=num_warps, num_stages=num_stages, **({"maxnreg": maxnreg} if maxnreg else {}))

    out = run_split_decode(launch, q, splits * r)
    if append is not None:
        return out, replace(cache, lens=extra[2])
    return out


def hack_decode_step(q: torch.Tensor, cache: QuantKVCache, k_new: torch.Tensor, v_new: torch.Tensor,
                     stochastic: bool = True, seed: int = 0, use_se: bool = True, splits: int | None = None,
                     max_len: int | None = None, num_warps: int | None = None, num_stages: int = 3,
                     maxnreg: int | None = None) -> tuple[torch.Tensor, QuantKVCache]:
    """One fused HACK decode step: append (k_new, v_new [B, H_kv, D]) and attend with q [B, H_q, D]
    over the appended cache in one attention launch (+ the split combine) instead of append_token's
    extra launch.  Returns (output [B, H_q, D], the cache with lens + 1), the cache identical to
    append_token's.  The attention differs from append_token + hack_attn_decode only at the step
    that fills a V block: that block is attended in FP16 (the tail) and quantized for later steps.
    max_len: an upper bound of the lengths after the append.  Defaults as hack_attn_decode's."""
    num_warps, maxnreg = launch_defaults(cache, max_len, num_warps, maxnreg)
    return hack_attn_decode_rp(q, cache, use_se=use_se, splits=splits, max_len=max_len, num_warps=num_warps,
                               num_stages=num_stages, maxnreg=maxnreg, append=(k_new, v_new, seed, stochastic))


def launch_defaults(cache: QuantKVCache, max_len: int | None, num_warps: int | None,
                    maxnreg: int | None) -> tuple[int, int | None]:
    """Measured defaults (NOTES.md, runs 16 and 20): above 2K tokens cap registers at 128 (two programs
    more per SM), 2 warps at PI <= 64, 4 at PI 128; short contexts: 4 warps, no cap.  maxnreg 0: no cap."""
    ml = cache.shape[2] if max_len is None else max_len
    if num_warps is None:
        num_warps = 4 if ml <= 2048 or cache.partition > 64 else 2
    if maxnreg is None and ml > 2048:
        maxnreg = 128
    return num_warps, maxnreg or None
