"""Triton building blocks shared by HACK decode and prefill attention (2-bit K/V, D = 4 * W).

Homomorphic products (HACK, arXiv 2502.03589, eq. for one partition of length PI):
  sum a*b ~= s_a s_b sum a'b' + s_a m_b sum a' + m_a s_b sum b' + PI m_a m_b
Q rows are quantized in-kernel to 8 bits per partition (asymmetric; q'' = code - 128 is INT8 and
m~ = m + 128 s absorbs the shift).  K codes (0..3) meet INT8 q'' in INT8 tensor-core dots, one dot
per channel group of W = D / 4 channels (the four bit planes of one packed byte tile); groups are
summed in INT32 when a partition spans several groups (PI = 64, 128).
P (softmax numerator, in [0, 1] after the running max is subtracted) uses the fixed scale 1/255:
u = round(255 p) in 0..255, p'' = u - 128 INT8, so sum p v = (1/255) (s_v (sum p''v' + 128 sum v')
+ m_v sum u): the stored V code sums (SE) give sum v', or the kernel sums the codes (no SE).
Scores are in the log2 domain (qk_scale = log2(e) / sqrt(D) folded into the Q coefficients).
"""

from __future__ import annotations

import triton
import triton.language as tl

from .common import dequant_lut, dequant_table, unpack_codes


@triton.jit
def split_prologue(LENS, HKV, TPS, G: tl.constexpr, G_PAD: tl.constexpr, PI: tl.constexpr, HAS_TAIL: tl.constexpr):
    """Split-K decode program (grid (B * H_kv, splits)): its (request, KV head) bh, split, the cache
    length L, LV = the tokens with quantized V (L rounded down to whole PI blocks when the last
    partial block is the FP16 tail), the token range [start, end) of this split, and the G_PAD query
    rows (qrow, mask g < G) of the KV head's GQA group."""
    bh = tl.program_id(0)
    split = tl.program_id(1)
    b = bh // HKV
    L = tl.load(LENS + b)
    if HAS_TAIL:
        LV = (L // PI) * PI
    else:
        LV = L
    start = split * TPS
    end = tl.minimum(start + TPS, LV)
    g = tl.arange(0, G_PAD)
    qrow = (b * HKV + bh % HKV) * G + g
    return bh, split, L, LV, start, end, g, g < G, qrow


@triton.jit
def cache_ptrs(
    KC, KMN, KSC, KSM, VC, VMN, VSC, VSM, bh, LMAX, NBLK, W: tl.constexpr, NP: tl.constexpr, D: tl.constexpr
):
    """The cache arrays of (request, KV head) bh at token 0 (codes, K metadata) and block 0 (V metadata)."""
    tok0 = bh.to(tl.int64) * LMAX
    moff = bh.to(tl.int64) * NBLK * D
    return (
        KC + tok0 * W,
        KMN + tok0 * NP,
        KSC + tok0 * NP,
        KSM + tok0 * NP,
        VC + tok0 * W,
        VMN + moff,
        VSC + moff,
        VSM + moff,
    )


@triton.jit
def flash_state(R: tl.constexpr, W: tl.constexpr):
    """Online-softmax state of R rows: running max, sum, and the four [R, W] output channel groups."""
    return (
        tl.full([R], float("-inf"), tl.float32),
        tl.zeros([R], tl.float32),
        tl.zeros([R, W], tl.float32),
        tl.zeros([R, W], tl.float32),
        tl.zeros([R, W], tl.float32),
        tl.zeros([R, W], tl.float32),
    )


@triton.jit
def tail_pv(o0, o1, o2, o3, p16, alpha, VT, bh, n, PI: tl.constexpr, D: tl.constexpr, W: tl.constexpr):
    """o_c <- alpha o_c + P V over the FP16 V tail (RQE) of (request, KV head) bh: p16 [R, PI], n rows valid."""
    tr = tl.arange(0, PI)
    j = tl.arange(0, W)
    vt = VT + (bh.to(tl.int64) * PI + tr)[:, None] * D + j[None, :]
    tm = (tr < n)[:, None]
    o0 = tl.dot(p16, tl.load(vt, mask=tm, other=0.0), o0 * alpha[:, None])
    o1 = tl.dot(p16, tl.load(vt + W, mask=tm, other=0.0), o1 * alpha[:, None])
    o2 = tl.dot(p16, tl.load(vt + 2 * W, mask=tm, other=0.0), o2 * alpha[:, None])
    o3 = tl.dot(p16, tl.load(vt + 3 * W, mask=tm, other=0.0), o3 * alpha[:, None])
    return o0, o1, o2, o3


@triton.jit
def store_partials(OP, LSEP, prow, rmask, o0, o1, o2, o3, l_i, m_i, D: tl.constexpr, W: tl.constexpr):
    """A split's normalized partial output O/l [rows, D] at partial rows prow and its log2-sum-exp
    (-inf for a row that saw no token), for combine_splits_kernel."""
    j = tl.arange(0, W)
    has = l_i > 0
    inv_l = 1.0 / tl.where(has, l_i, 1.0)
    lse = tl.where(has, m_i + tl.log2(tl.where(has, l_i, 1.0)), float("-inf"))
    tl.store(LSEP + prow, lse, mask=rmask)
    op = OP + prow[:, None] * D + j[None, :]
    tl.store(op, o0 * inv_l[:, None], mask=rmask[:, None])
    tl.store(op + W, o1 * inv_l[:, None], mask=rmask[:, None])
    tl.store(op + 2 * W, o2 * inv_l[:, None], mask=rmask[:, None])
    tl.store(op + 3 * W, o3 * inv_l[:, None], mask=rmask[:, None])


@triton.jit
def prefill_rows(HQ, HKV, L, G: tl.constexpr, BM: tl.constexpr):
    """Prefill program (grid (cdiv(L, BM), B * H_q)): its (request, query head) bhq, the KV head's bh,
    and the BM query rows it takes (rows, mask rows < L)."""
    mblk = tl.program_id(0)
    bhq = tl.program_id(1)
    bh = (bhq // HQ) * HKV + (bhq % HQ) // G
    rows = mblk * BM + tl.arange(0, BM)
    return mblk, bhq, bh, rows, rows < L


@triton.jit
def load_q_groups(Q, qrow, gmask, W: tl.constexpr, D: tl.constexpr):
    """The four channel groups [R, W] (FP32) of the query rows qrow of Q [rows, D]; masked rows are 0."""
    j = tl.arange(0, W)
    qp = Q + qrow[:, None] * D + j[None, :]
    q0 = tl.load(qp, mask=gmask[:, None], other=0.0).to(tl.float32)
    q1 = tl.load(qp + W, mask=gmask[:, None], other=0.0).to(tl.float32)
    q2 = tl.load(qp + 2 * W, mask=gmask[:, None], other=0.0).to(tl.float32)
    q3 = tl.load(qp + 3 * W, mask=gmask[:, None], other=0.0).to(tl.float32)
    return q0, q1, q2, q3


@triton.jit
def q_group_minmax(q0, q1, q2, q3, GPP: tl.constexpr):
    """Per-row min/max of each group's partition (GPP groups per partition)."""
    n0 = tl.min(q0, 1)
    n1 = tl.min(q1, 1)
    n2 = tl.min(q2, 1)
    n3 = tl.min(q3, 1)
    x0 = tl.max(q0, 1)
    x1 = tl.max(q1, 1)
    x2 = tl.max(q2, 1)
    x3 = tl.max(q3, 1)
    if GPP == 2:
        n0 = tl.minimum(n0, n1)
        n1 = n0
        n2 = tl.minimum(n2, n3)
        n3 = n2
        x0 = tl.maximum(x0, x1)
        x1 = x0
        x2 = tl.maximum(x2, x3)
        x3 = x2
    if GPP == 4:
        n0 = tl.minimum(tl.minimum(n0, n1), tl.minimum(n2, n3))
        n1 = n0
        n2 = n0
        n3 = n0
        x0 = tl.maximum(tl.maximum(x0, x1), tl.maximum(x2, x3))
        x1 = x0
        x2 = x0
        x3 = x0
    return n0, x0, n1, x1, n2, x2, n3, x3


@triton.jit
def q_quant_group(q, mn, mx, qk_scale):
    """8-bit asymmetric: returns (q'' int8 [R, W], a = s*qk_scale, b = m~*qk_scale, sum q'' [R])."""
    s = (mx - mn) / 255.0
    inv = tl.where(s > 0, 1.0 / s, 0.0)
    code = tl.floor((q - mn[:, None]) * inv[:, None] + 0.5)
    code = tl.minimum(tl.maximum(code, 0.0), 255.0) - 128.0
    return code.to(tl.int8), s * qk_scale, (mn + 128.0 * s) * qk_scale, tl.sum(code, 1)


@triton.jit
def q_quantize(q0, q1, q2, q3, qk_scale, PI: tl.constexpr, GPP: tl.constexpr):
    """Quantize the four channel groups of Q rows; returns int8 groups and per-group coefficients
    a (times I), b (times sum k'), c (times m_k) of their partition."""
    n0, x0, n1, x1, n2, x2, n3, x3 = q_group_minmax(q0, q1, q2, q3, GPP)
    qi0, a0, b0, s0 = q_quant_group(q0, n0, x0, qk_scale)
    qi1, a1, b1, s1 = q_quant_group(q1, n1, x1, qk_scale)
    qi2, a2, b2, s2 = q_quant_group(q2, n2, x2, qk_scale)
    qi3, a3, b3, s3 = q_quant_group(q3, n3, x3, qk_scale)
    if GPP == 2:
        s0 = s0 + s1
        s1 = s0
        s2 = s2 + s3
        s3 = s2
    if GPP == 4:
        s0 = s0 + s1 + s2 + s3
        s1 = s0
        s2 = s0
        s3 = s0
    c0 = a0 * s0 + PI * b0
    c1 = a1 * s1 + PI * b1
    c2 = a2 * s2 + PI * b2
    c3 = a3 * s3 + PI * b3
    return qi0, qi1, qi2, qi3, a0, a1, a2, a3, b0, b1, b2, b3, c0, c1, c2, c3


@triton.jit
def _k_term(i, a, b, c, KMN, KSC, KSM, ksum_codes, tok, tmask, p, NP: tl.constexpr, USE_SE: tl.constexpr):
    sk = tl.load(KSC + tok * NP + p, mask=tmask, other=0.0).to(tl.float32)
    mk = tl.load(KMN + tok * NP + p, mask=tmask, other=0.0).to(tl.float32)
    if USE_SE:
        ks = tl.load(KSM + tok * NP + p, mask=tmask, other=0).to(tl.float32)
    else:
        ks = ksum_codes.to(tl.float32)
    return (a[:, None] * i.to(tl.float32) + b[:, None] * ks[None, :]) * sk[None, :] + c[:, None] * mk[None, :]


@triton.jit
def hack_scores(
    qi0,
    qi1,
    qi2,
    qi3,
    a0,
    a1,
    a2,
    a3,
    b0,
    b1,
    b2,
    b3,
    c0,
    c1,
    c2,
    c3,
    KC,
    KMN,
    KSC,
    KSM,
    tok,
    tmask,
    W: tl.constexpr,
    NP: tl.constexpr,
    GPP: tl.constexpr,
    USE_SE: tl.constexpr,
    USE_ASM: tl.constexpr,
    SUMROW: tl.constexpr = -1,
):
    """Scores [R, BN] (log2 domain) of quantized Q rows against BN tokens of 2-bit K.
    KC, KMN, KSC, KSM point at token 0 of this (request, kv head).  Without SE the K code sums
    come from the tensor cores when SUMROW >= 0 (a padding row of q'' set to ones: its dot row is
    the per-group code sum), else from a reduction over the unpacked codes."""
    j = tl.arange(0, W)
    kb = tl.load(KC + tok[None, :] * W + j[:, None], mask=tmask[None, :], other=0)  # [W, BN] uint8
    k0 = unpack_codes(kb, 0, 2, USE_ASM)
    k1 = unpack_codes(kb, 2, 2, USE_ASM)
    k2 = unpack_codes(kb, 4, 2, USE_ASM)
    k3 = unpack_codes(kb, 6, 2, USE_ASM)
    i0 = tl.dot(qi0, k0, out_dtype=tl.int32)  # [R, BN]
    i1 = tl.dot(qi1, k1, out_dtype=tl.int32)
    i2 = tl.dot(qi2, k2, out_dtype=tl.int32)
    i3 = tl.dot(qi3, k3, out_dtype=tl.int32)
    if USE_SE:
        z0 = 0
        z1 = 0
        z2 = 0
        z3 = 0
    elif SUMROW >= 0:
        rsel = (tl.arange(0, qi0.shape[0]) == SUMROW)[:, None]
        z0 = tl.sum(tl.where(rsel, i0, 0), 0)
        z1 = tl.sum(tl.where(rsel, i1, 0), 0)
        z2 = tl.sum(tl.where(rsel, i2, 0), 0)
        z3 = tl.sum(tl.where(rsel, i3, 0), 0)
    else:
        z0 = tl.sum(k0.to(tl.int32), 0)
        z1 = tl.sum(k1.to(tl.int32), 0)
        z2 = tl.sum(k2.to(tl.int32), 0)
        z3 = tl.sum(k3.to(tl.int32), 0)
    if GPP == 1:
        s = _k_term(i0, a0, b0, c0, KMN, KSC, KSM, z0, tok, tmask, 0, NP, USE_SE)
        s += _k_term(i1, a1, b1, c1, KMN, KSC, KSM, z1, tok, tmask, 1, NP, USE_SE)
        s += _k_term(i2, a2, b2, c2, KMN, KSC, KSM, z2, tok, tmask, 2, NP, USE_SE)
        s += _k_term(i3, a3, b3, c3, KMN, KSC, KSM, z3, tok, tmask, 3, NP, USE_SE)
    elif GPP == 2:
        s = _k_term(i0 + i1, a0, b0, c0, KMN, KSC, KSM, z0 + z1, tok, tmask, 0, NP, USE_SE)
        s += _k_term(i2 + i3, a2, b2, c2, KMN, KSC, KSM, z2 + z3, tok, tmask, 1, NP, USE_SE)
    else:
        s = _k_term(i0 + i1 + i2 + i3, a0, b0, c0, KMN, KSC, KSM, z0 + z1 + z2 + z3, tok, tmask, 0, NP, USE_SE)
    return s


@triton.jit
def _v_update(o, p8, usum, vc, alpha, VMN, VSC, VSM, moff, bvalid, USE_SE: tl.constexpr, SUMROW: tl.constexpr):
    acc = tl.dot(p8, vc, out_dtype=tl.int32)  # [R, W]
    sv = tl.load(VSC + moff, mask=bvalid, other=0.0).to(tl.float32)
    mv = tl.load(VMN + moff, mask=bvalid, other=0.0).to(tl.float32)
    if USE_SE:
        vs = tl.load(VSM + moff, mask=bvalid, other=0).to(tl.float32)
    elif SUMROW >= 0:
        rsel = (tl.arange(0, p8.shape[0]) == SUMROW)[:, None]
        vs = tl.sum(tl.where(rsel, acc, 0), 0).to(tl.float32)
    else:
        vs = tl.sum(vc.to(tl.int32), 0).to(tl.float32)
    upd = sv[None, :] * (acc.to(tl.float32) + 128.0 * vs[None, :]) + mv[None, :] * usum[:, None]
    return o * alpha[:, None] + upd * (1.0 / 255.0)


@triton.jit
def hack_pv_block(
    o0,
    o1,
    o2,
    o3,
    p8,
    usum,
    alpha,
    VC,
    VMN,
    VSC,
    VSM,
    tok,
    tmask,
    blk,
    bvalid,
    W: tl.constexpr,
    D: tl.constexpr,
    USE_SE: tl.constexpr,
    USE_ASM: tl.constexpr,
    SUMROW: tl.constexpr,
):
    """o_c <- alpha o_c + P V over one V block: p8 [R, PI] INT8 (u - 128), usum = sum u per row.
    Metadata loads are masked by bvalid (a block wholly past the end contributes nothing)."""
    j = tl.arange(0, W)
    vb = tl.load(VC + tok[:, None] * W + j[None, :], mask=tmask[:, None], other=0)  # [PI, W] uint8
    mo = blk * D + j
    o0 = _v_update(o0, p8, usum, unpack_codes(vb, 0, 2, USE_ASM), alpha, VMN, VSC, VSM, mo, bvalid, USE_SE, SUMROW)
    o1 = _v_update(o1, p8, usum, unpack_codes(vb, 2, 2, USE_ASM), alpha, VMN, VSC, VSM, mo + W, bvalid, USE_SE, SUMROW)
    o2 = _v_update(
        o2, p8, usum, unpack_codes(vb, 4, 2, USE_ASM), alpha, VMN, VSC, VSM, mo + 2 * W, bvalid, USE_SE, SUMROW
    )
    o3 = _v_update(
        o3, p8, usum, unpack_codes(vb, 6, 2, USE_ASM), alpha, VMN, VSC, VSM, mo + 3 * W, bvalid, USE_SE, SUMROW
    )
    return o0, o1, o2, o3


@triton.jit
def quantize_p(p, USE_SE: tl.constexpr, SUMROW: tl.constexpr):
    """P in [0, 1] -> (p'' = round(255 p) - 128 as INT8 [R, N], sum of round(255 p) per row)."""
    u = tl.floor(p * 255.0 + 0.5)
    usum = tl.sum(u, 1)
    p8 = u - 128.0
    if not USE_SE:
        if SUMROW >= 0:
            p8 = tl.where((tl.arange(0, p.shape[0]) == SUMROW)[:, None], 1.0, p8)
    return p8.to(tl.int8), usum


@triton.jit
def split_cols(x):
    """[R, N] -> ([R, N/2] left half, [R, N/2] right half)."""
    x3 = tl.reshape(x, (x.shape[0], 2, x.shape[1] // 2))
    return tl.split(tl.permute(x3, (0, 2, 1)))


@triton.jit
def dequant_scores(
    q0,
    q1,
    q2,
    q3,
    KC,
    KMN,
    KSC,
    tok,
    tmask,
    W: tl.constexpr,
    NP: tl.constexpr,
    GPP: tl.constexpr,
    USE_ASM: tl.constexpr,
):
    """Fused dequantize-then-attend (KIVI-style): K codes -> FP16 in registers, FP16 dots.
    q_c are FP16 [R, W] already multiplied by qk_scale."""
    j = tl.arange(0, W)
    kb = tl.load(KC + tok[None, :] * W + j[:, None], mask=tmask[None, :], other=0)  # [W, BN]
    s = tl.dot(q0, _deq_k(kb, 0, USE_ASM, KMN, KSC, tok, tmask, 0 // GPP, NP))
    s = tl.dot(q1, _deq_k(kb, 2, USE_ASM, KMN, KSC, tok, tmask, 1 // GPP, NP), s)
    s = tl.dot(q2, _deq_k(kb, 4, USE_ASM, KMN, KSC, tok, tmask, 2 // GPP, NP), s)
    s = tl.dot(q3, _deq_k(kb, 6, USE_ASM, KMN, KSC, tok, tmask, 3 // GPP, NP), s)
    return s


@triton.jit
def _deq_k(kb, SH: tl.constexpr, USE_ASM: tl.constexpr, KMN, KSC, tok, tmask, p, NP: tl.constexpr):
    sk = tl.load(KSC + tok * NP + p, mask=tmask, other=0.0)
    mk = tl.load(KMN + tok * NP + p, mask=tmask, other=0.0)
    lo, hi = dequant_table(sk, mk, USE_ASM)
    return dequant_lut(kb, SH, lo[None, :], hi[None, :], USE_ASM)


@triton.jit
def dequant_pv(
    o0,
    o1,
    o2,
    o3,
    p16,
    alpha,
    VC,
    VMN,
    VSC,
    tok,
    tmask,
    blk,
    W: tl.constexpr,
    D: tl.constexpr,
    USE_ASM: tl.constexpr,
    bvalid=True,
):
    j = tl.arange(0, W)
    vb = tl.load(VC + tok[:, None] * W + j[None, :], mask=tmask[:, None], other=0)  # [BN, W]
    mo = blk * D + j
    o0 = tl.dot(p16, _deq_v(vb, 0, USE_ASM, VMN, VSC, mo, bvalid), o0 * alpha[:, None])
    o1 = tl.dot(p16, _deq_v(vb, 2, USE_ASM, VMN, VSC, mo + W, bvalid), o1 * alpha[:, None])
    o2 = tl.dot(p16, _deq_v(vb, 4, USE_ASM, VMN, VSC, mo + 2 * W, bvalid), o2 * alpha[:, None])
    o3 = tl.dot(p16, _deq_v(vb, 6, USE_ASM, VMN, VSC, mo + 3 * W, bvalid), o3 * alpha[:, None])
    return o0, o1, o2, o3


@triton.jit
def _deq_v(vb, SH: tl.constexpr, USE_ASM: tl.constexpr, VMN, VSC, moff, bvalid):
    sv = tl.load(VSC + moff, mask=bvalid, other=0.0)
    mv = tl.load(VMN + moff, mask=bvalid, other=0.0)
    lo, hi = dequant_table(sv, mv, USE_ASM)
    return dequant_lut(vb, SH, lo[None, :], hi[None, :], USE_ASM)


# ----------------------------------------------------------------------------- row-packed tile
# The tile of the row-packed decode kernel (hack_decode_rp.py), also the row-scaled prefill kernel's
# (hack_attn_prefill.py): Q rounded per row, P rounded with one FMA, P row sums on the tensor cores,
# O and l kept x255, 128 sum v' added in INT32 (see hack_decode_rp.py's docstring for the algebra).
@triton.jit
def _kvec(KX, tok, tmask, p: tl.constexpr, NP: tl.constexpr, MASKED: tl.constexpr):
    if MASKED:
        r = tl.load(KX + tok * NP + p, mask=tmask, other=0)
    else:
        r = tl.load(KX + tok * NP + p)
    return r.to(tl.float32)


@triton.jit
def _part_term(
    x,
    i,
    KMN,
    KSC,
    KSM,
    kcs,
    tok,
    tmask,
    p: tl.constexpr,
    NP: tl.constexpr,
    beta,
    gamma,
    USE_SE: tl.constexpr,
    MASKED: tl.constexpr,
):
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
def rp_scores(
    qi0,
    qi1,
    qi2,
    qi3,
    ones_q,
    beta,
    gm0,
    gm1,
    gm2,
    gm3,
    KC,
    KMN,
    KSC,
    KSM,
    tok,
    tmask,
    W: tl.constexpr,
    NP: tl.constexpr,
    GPP: tl.constexpr,
    USE_SE: tl.constexpr,
    USE_ASM: tl.constexpr,
    MASKED: tl.constexpr,
):
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
        x = _part_term(
            0.0, tl.dot(qi0, k0, out_dtype=tl.int32), KMN, KSC, KSM, c0, tok, tmask, 0, NP, beta, gm0, USE_SE, MASKED
        )
        x = _part_term(
            x, tl.dot(qi1, k1, out_dtype=tl.int32), KMN, KSC, KSM, c1, tok, tmask, 1, NP, beta, gm1, USE_SE, MASKED
        )
        x = _part_term(
            x, tl.dot(qi2, k2, out_dtype=tl.int32), KMN, KSC, KSM, c2, tok, tmask, 2, NP, beta, gm2, USE_SE, MASKED
        )
        x = _part_term(
            x, tl.dot(qi3, k3, out_dtype=tl.int32), KMN, KSC, KSM, c3, tok, tmask, 3, NP, beta, gm3, USE_SE, MASKED
        )
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
def _vblock(
    VX, blk, end, off, k: tl.constexpr, R: tl.constexpr, PI: tl.constexpr, D: tl.constexpr, MASKED: tl.constexpr
):
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
def _rp_v_update(
    o,
    p8,
    usum,
    alpha,
    vcode,
    cmask8,
    copy,
    VMN,
    VSC,
    VSM,
    blk,
    end,
    off,
    R: tl.constexpr,
    PI: tl.constexpr,
    D: tl.constexpr,
    USE_SE: tl.constexpr,
    MASKED: tl.constexpr,
):
    """o <- alpha o + sv (P''V' + 128 vs) + mv u for one channel group, each copy's rows against its
    own V block (o and l are kept times 255: sum p v = (1/255) sum u v)."""
    acc = tl.dot(p8, vcode, out_dtype=tl.int32)  # [R_rows, W]
    if USE_SE:
        vs = _sel_rows(
            copy,
            _vblock(VSM, blk, end, off, 0, R, PI, D, MASKED).to(tl.int32),
            _vblock(VSM, blk, end, off, 1, R, PI, D, MASKED).to(tl.int32),
            _vblock(VSM, blk, end, off, 2, R, PI, D, MASKED).to(tl.int32),
            _vblock(VSM, blk, end, off, 3, R, PI, D, MASKED).to(tl.int32),
            R,
        )
    else:
        vs = tl.dot(cmask8, vcode, out_dtype=tl.int32)  # each copy's block code sums
    a = _sel_rows(
        copy,
        _vblock(VSC, blk, end, off, 0, R, PI, D, MASKED).to(tl.float32),
        _vblock(VSC, blk, end, off, 1, R, PI, D, MASKED).to(tl.float32),
        _vblock(VSC, blk, end, off, 2, R, PI, D, MASKED).to(tl.float32),
        _vblock(VSC, blk, end, off, 3, R, PI, D, MASKED).to(tl.float32),
        R,
    )
    o = o * alpha[:, None] + a * (acc + vs * 128).to(tl.float32)  # sum u v' = sum p''v' + 128 sum v' (INT32)
    mv = _sel_rows(
        copy,
        _vblock(VMN, blk, end, off, 0, R, PI, D, MASKED).to(tl.float32),
        _vblock(VMN, blk, end, off, 1, R, PI, D, MASKED).to(tl.float32),
        _vblock(VMN, blk, end, off, 2, R, PI, D, MASKED).to(tl.float32),
        _vblock(VMN, blk, end, off, 3, R, PI, D, MASKED).to(tl.float32),
        R,
    )
    return o + mv * usum[:, None]


@triton.jit
def rp_tile(
    s0,
    end,
    m_i,
    l_i,
    o0,
    o1,
    o2,
    o3,
    qi0,
    qi1,
    qi2,
    qi3,
    ones_q,
    aq,
    beta,
    gm0,
    gm1,
    gm2,
    gm3,
    inblk,
    cmask8,
    ones_v,
    copy,
    KC,
    KMN,
    KSC,
    KSM,
    VC,
    VMN,
    VSC,
    VSM,
    W: tl.constexpr,
    D: tl.constexpr,
    NP: tl.constexpr,
    GPP: tl.constexpr,
    PI: tl.constexpr,
    R: tl.constexpr,
    BN: tl.constexpr,
    USE_SE: tl.constexpr,
    USE_ASM: tl.constexpr,
    MASKED: tl.constexpr,
    rows,
    CAUSAL: tl.constexpr,
):
    """One tile of BN tokens from s0 (tokens >= end masked when MASKED; token > row masked when CAUSAL,
    rows [R_rows] the query positions): the online-softmax state and the four O accumulators."""
    tok = s0 + tl.arange(0, BN)
    tmask = tok < end
    x = rp_scores(
        qi0,
        qi1,
        qi2,
        qi3,
        ones_q,
        beta,
        gm0,
        gm1,
        gm2,
        gm3,
        KC,
        KMN,
        KSC,
        KSM,
        tok,
        tmask,
        W,
        NP,
        GPP,
        USE_SE,
        USE_ASM,
        MASKED,
    )
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
    o0 = _rp_v_update(
        o0,
        p8,
        usum,
        alpha,
        unpack_codes(vb, 0, 2, USE_ASM),
        cmask8,
        copy,
        VMN,
        VSC,
        VSM,
        blk,
        end,
        j,
        R,
        PI,
        D,
        USE_SE,
        MASKED,
    )
    o1 = _rp_v_update(
        o1,
        p8,
        usum,
        alpha,
        unpack_codes(vb, 2, 2, USE_ASM),
        cmask8,
        copy,
        VMN,
        VSC,
        VSM,
        blk,
        end,
        j + W,
        R,
        PI,
        D,
        USE_SE,
        MASKED,
    )
    o2 = _rp_v_update(
        o2,
        p8,
        usum,
        alpha,
        unpack_codes(vb, 4, 2, USE_ASM),
        cmask8,
        copy,
        VMN,
        VSC,
        VSM,
        blk,
        end,
        j + 2 * W,
        R,
        PI,
        D,
        USE_SE,
        MASKED,
    )
    o3 = _rp_v_update(
        o3,
        p8,
        usum,
        alpha,
        unpack_codes(vb, 6, 2, USE_ASM),
        cmask8,
        copy,
        VMN,
        VSC,
        VSM,
        blk,
        end,
        j + 3 * W,
        R,
        PI,
        D,
        USE_SE,
        MASKED,
    )
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
    return (c0.to(tl.int8), c1.to(tl.int8), c2.to(tl.int8), c3.to(tl.int8), sq * qk_scale, beta, gm0, gm1, gm2, gm3)
