"""Token-major HACK decode attention: the token axis is the score dot's M dimension.

Why: in hack_attn_decode.py the G = 8 query heads of a KV head are the M side of every dot (padded
to 16 rows).  M = 16 keeps Triton on mma.sync, with every operand staged through shared memory,
and the unpack between load and dot stops its pipeliner from streaming the loads (NOTES.md).  Here
the score product is transposed so the many-token side is M:
    S^T [BN, G_PAD] = K'_c [BN, W] . Q''_c^T [W, G_PAD]          (per channel group c, INT8)
With BN >= 64 and 4 warps Triton emits wgmma (`IGMMA`) with the unpacked codes as the A operand
straight from registers and streams the code bytes global -> shared (cp.async) ahead of use; only
the small, loop-invariant Q'' sits in shared memory.  P.V has two forms (v_side):
  1 (default): head-major, O [G_PAD, W] += P'' [G_PAD, BN] . V'_c [BN, W] on mma.sync
     (hack_core.hack_pv_block), V bytes in their natural [BN, W] layout;
  0: token-major too, O^T [D, G_PAD] = V'^T [D, BN] . P''^T [BN, G_PAD]: V^T needs the four bit
     planes of a byte in four rows (channels c*W + j), so row d reads byte d mod W (four rows per
     byte: HBM once, L1/shared memory four times) and shifts by 2*(d // W).  Padding the heads to 8
     instead of 16 (pad_heads_to=8: no padding head, 8-wide dots on mma.sync) is allowed here.
The arithmetic is HACK's (hack_core.py): the same Q and P rounding, the same correction terms
with the stored sums (SE) or code sums from a padding column of ones (no SE; summed codes when
there is no padding column), and the FP16 V tail (RQE); only the orientation changes, so results
agree with hack_attn_decode to rounding order.

Split-K with an optional fused combine (FUSED): every program writes its partial (O, log2-sum-exp)
and bumps a per-(request, KV head) counter; the program that arrives last merges the partials and
writes the output, then zeroes the counter for the next call (one counter buffer per device: calls
on different streams at the same time must not share it).  mode "dequant" is the fused
dequantize-then-attend baseline in the same form.  Only PI in {64, 128} (BN = PI) and head_dim 128.

Measured on the H200 (NOTES.md, run 9, 32K context, batch 8, 64/8 heads): 192 µs vs 203 µs for
the head-major kernel at PI 64 (the best token-major form: 4 warps, v_side 1, separate combine),
slower at PI 128 (199 vs 125 µs); the fused combine and v_side 0 were slower everywhere.  The
head-major kernel stayed the default (since replaced by the row-packed kernel, hack_decode_rp.py);
this one is `hack_attn_decode(..., transposed=True)`.
"""
from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from .common import online_softmax, unpack_codes, use_asm
from .hack_core import (cache_ptrs, dequant_pv, hack_pv_block, load_q_groups, q_quantize, split_prologue,
                        tail_pv)
from .kv_cache import QuantKVCache


@triton.jit
def _kmeta(KX, tok, tmask, p: tl.constexpr, NP: tl.constexpr):
    return tl.load(KX + tok * NP + p, mask=tmask, other=0).to(tl.float32)


@triton.jit
def _kterm(i, a, b, c, sk, mk, ks):
    """[BN, G] correction of one K partition: (a i + b ks) sk + c mk (a, b, c per head; sk, mk, ks per token)."""
    return (a[None, :] * i.to(tl.float32) + b[None, :] * ks[:, None]) * sk[:, None] + c[None, :] * mk[:, None]


@triton.jit
def _colsum(x, col: tl.constexpr):
    """Column `col` of an int32 [N, G_PAD] tile as a float vector [N] (code sums from a ones column)."""
    sel = (tl.arange(0, x.shape[1]) == col)[None, :]
    return tl.sum(tl.where(sel, x, 0), 1).to(tl.float32)


@triton.jit
def _ksum(i, ka, kb, SUMCOL: tl.constexpr):
    """K code sums [BN] of a partition: the ones column of its dot, or (no padding head) summed codes."""
    if SUMCOL >= 0:
        r = _colsum(i, SUMCOL)
    else:
        r = tl.sum(ka.to(tl.int32) + kb.to(tl.int32), 1).to(tl.float32)
    return r


@triton.jit
def _vsum(acc, vcode, SUMCOL: tl.constexpr):
    if SUMCOL >= 0:
        r = _colsum(acc, SUMCOL)
    else:
        r = tl.sum(vcode.to(tl.int32), 1).to(tl.float32)
    return r


@triton.jit
def _scores_t(kc, kmn, ksc, ksm, tok, tmask, j, qt0, qt1, qt2, qt3, a0, b0, c0, a2, b2, c2,
              W: tl.constexpr, NP: tl.constexpr, GPP: tl.constexpr, MODE: tl.constexpr, USE_SE: tl.constexpr,
              SUMCOL: tl.constexpr, USE_ASM: tl.constexpr):
    """S^T [BN, G_PAD] (log2 domain, -inf past tmask) of BN tokens of 2-bit K: homomorphic INT8 dots
    with the correction terms (MODE 0; a, b, c of partitions 0 and 1, i.e. groups 0 and 2) or the
    codes dequantized to FP16 against FP16 Q (MODE 1)."""
    kb = tl.load(kc + tok[:, None] * W + j[None, :], mask=tmask[:, None], other=0)      # [BN, W] u8
    k0 = unpack_codes(kb, 0, 2, USE_ASM)
    k1 = unpack_codes(kb, 2, 2, USE_ASM)
    k2 = unpack_codes(kb, 4, 2, USE_ASM)
    k3 = unpack_codes(kb, 6, 2, USE_ASM)
    if MODE == 0:
        if GPP == 2:
            i0 = tl.dot(k1, qt1, tl.dot(k0, qt0, out_dtype=tl.int32), out_dtype=tl.int32)   # [BN, G_PAD]
            i1 = tl.dot(k3, qt3, tl.dot(k2, qt2, out_dtype=tl.int32), out_dtype=tl.int32)
            if USE_SE:
                ks0 = _kmeta(ksm, tok, tmask, 0, NP)
                ks1 = _kmeta(ksm, tok, tmask, 1, NP)
            else:
                ks0 = _ksum(i0, k0, k1, SUMCOL)
                ks1 = _ksum(i1, k2, k3, SUMCOL)
            s = _kterm(i0, a0, b0, c0, _kmeta(ksc, tok, tmask, 0, NP), _kmeta(kmn, tok, tmask, 0, NP), ks0)
            s += _kterm(i1, a2, b2, c2, _kmeta(ksc, tok, tmask, 1, NP), _kmeta(kmn, tok, tmask, 1, NP), ks1)
        else:   # GPP == 4: one partition spans the row
            i0 = tl.dot(k0, qt0, out_dtype=tl.int32)
            i0 = tl.dot(k1, qt1, i0, out_dtype=tl.int32)
            i0 = tl.dot(k2, qt2, i0, out_dtype=tl.int32)
            i0 = tl.dot(k3, qt3, i0, out_dtype=tl.int32)
            if USE_SE:
                ks0 = _kmeta(ksm, tok, tmask, 0, NP)
            else:
                ks0 = _ksum(i0, k0, k1, SUMCOL)
                if SUMCOL < 0:
                    ks0 += _ksum(i0, k2, k3, SUMCOL)
            s = _kterm(i0, a0, b0, c0, _kmeta(ksc, tok, tmask, 0, NP), _kmeta(kmn, tok, tmask, 0, NP), ks0)
    else:
        sk0 = tl.load(ksc + tok * NP, mask=tmask, other=0.0)[:, None]
        mk0 = tl.load(kmn + tok * NP, mask=tmask, other=0.0)[:, None]
        if GPP == 2:
            sk1 = tl.load(ksc + tok * NP + 1, mask=tmask, other=0.0)[:, None]
            mk1 = tl.load(kmn + tok * NP + 1, mask=tmask, other=0.0)[:, None]
        else:
            sk1 = sk0
            mk1 = mk0
        s = tl.dot(k0.to(tl.float16) * sk0 + mk0, qt0)
        s = tl.dot(k1.to(tl.float16) * sk0 + mk0, qt1, s)
        s = tl.dot(k2.to(tl.float16) * sk1 + mk1, qt2, s)
        s = tl.dot(k3.to(tl.float16) * sk1 + mk1, qt3, s)
    return tl.where(tmask[:, None], s, float("-inf"))


@triton.jit
def _store_o(dst, o, o0, o1, o2, o3, inv_l, gmask, dd, j, W: tl.constexpr, VSIDE: tl.constexpr):
    """Rows dst[g] (pointer per head) <- normalized output: O^T [D, G_PAD] or four [G_PAD, W] groups."""
    ty = dst.dtype.element_ty
    if VSIDE == 0:
        tl.store(dst[None, :] + dd[:, None], (o * inv_l[None, :]).to(ty), mask=gmask[None, :])
    else:
        dp = dst[:, None] + j[None, :]
        tl.store(dp, (o0 * inv_l[:, None]).to(ty), mask=gmask[:, None])
        tl.store(dp + W, (o1 * inv_l[:, None]).to(ty), mask=gmask[:, None])
        tl.store(dp + 2 * W, (o2 * inv_l[:, None]).to(ty), mask=gmask[:, None])
        tl.store(dp + 3 * W, (o3 * inv_l[:, None]).to(ty), mask=gmask[:, None])


@triton.jit
def _hack_decode_t_kernel(Q, KC, KMN, KSC, KSM, VC, VMN, VSC, VSM, VT, LENS, OP, LSEP, OUT, CNT,
                          qk_scale, HKV, LMAX, NBLK, TPS, NSPLIT,
                          G: tl.constexpr, G_PAD: tl.constexpr, D: tl.constexpr, PI: tl.constexpr,
                          USE_SE: tl.constexpr, HAS_TAIL: tl.constexpr, MODE: tl.constexpr,
                          USE_ASM: tl.constexpr, SUMCOL: tl.constexpr, FUSED: tl.constexpr,
                          VSIDE: tl.constexpr):
    W: tl.constexpr = D // 4
    NP: tl.constexpr = D // PI
    GPP: tl.constexpr = PI // W
    BN: tl.constexpr = PI
    bh, split, L, LV, start, end, g, gmask, qrow = split_prologue(LENS, HKV, TPS, G, G_PAD, PI, HAS_TAIL)
    j = tl.arange(0, W)
    dd = tl.arange(0, D)
    q0, q1, q2, q3 = load_q_groups(Q, qrow, gmask, W, D)    # [G_PAD, W] each, channel group c = c*W..
    kc, kmn, ksc, ksm, vc, vmn, vsc, vsm = cache_ptrs(KC, KMN, KSC, KSM, VC, VMN, VSC, VSM, bh, LMAX, NBLK, W, NP, D)
    m_i = tl.full([G_PAD], float("-inf"), tl.float32)
    l_i = tl.zeros([G_PAD], tl.float32)
    o = tl.zeros([D, G_PAD], tl.float32)                  # O^T (VSIDE 0)
    o0 = tl.zeros([G_PAD, W], tl.float32)                 # O by channel group (VSIDE 1)
    o1 = tl.zeros([G_PAD, W], tl.float32)
    o2 = tl.zeros([G_PAD, W], tl.float32)
    o3 = tl.zeros([G_PAD, W], tl.float32)
    vrow = dd % W                                         # V^T row d reads byte d mod W ...
    vshift = (dd // W) * 2                                # ... at bit offset 2 (d // W)
    if MODE == 0:
        qi0, qi1, qi2, qi3, a0, a1, a2, a3, b0, b1, b2, b3, c0, c1, c2, c3 = q_quantize(
            q0, q1, q2, q3, qk_scale, PI, GPP)
        if not USE_SE:
            if SUMCOL >= 0:   # a padding head of ones: its score column is the K code sum
                one = (g == SUMCOL)[:, None]
                qi0 = tl.where(one, 1, qi0).to(tl.int8)
                qi1 = tl.where(one, 1, qi1).to(tl.int8)
                qi2 = tl.where(one, 1, qi2).to(tl.int8)
                qi3 = tl.where(one, 1, qi3).to(tl.int8)
        qt0 = tl.trans(qi0)                               # [W, G_PAD] int8
        qt1 = tl.trans(qi1)
        qt2 = tl.trans(qi2)
        qt3 = tl.trans(qi3)
    else:
        a0 = tl.zeros([G_PAD], tl.float32)   # no correction terms in FP16 arithmetic
        b0 = a0
        c0 = a0
        a2 = a0
        b2 = a0
        c2 = a0
        qt0 = tl.trans((q0 * qk_scale).to(tl.float16))
        qt1 = tl.trans((q1 * qk_scale).to(tl.float16))
        qt2 = tl.trans((q2 * qk_scale).to(tl.float16))
        qt3 = tl.trans((q3 * qk_scale).to(tl.float16))
    for s0 in range(start, end, BN):
        tok = s0 + tl.arange(0, BN)
        tmask = tok < end
        s = _scores_t(kc, kmn, ksc, ksm, tok, tmask, j, qt0, qt1, qt2, qt3, a0, b0, c0, a2, b2, c2,
                      W, NP, GPP, MODE, USE_SE, SUMCOL, USE_ASM)
        blk = s0 // PI
        if VSIDE == 0:
            vb = tl.load(vc + tok[None, :] * W + vrow[:, None], mask=tmask[None, :], other=0)   # [D, BN] u8
            vcode = ((vb >> vshift[:, None].to(tl.uint8)) & 3).to(tl.int8)
            sv = tl.load(vsc + blk * D + dd).to(tl.float32)
            mv = tl.load(vmn + blk * D + dd).to(tl.float32)
        m_new, alpha, p = online_softmax(s, m_i, 0)                                   # p [BN, G_PAD]
        if MODE == 0:
            u = tl.floor(p * 255.0 + 0.5)
            usum = tl.sum(u, 0)
            p8 = u - 128.0
            if not USE_SE:
                if SUMCOL >= 0:
                    p8 = tl.where((g == SUMCOL)[None, :], 1.0, p8)
            if VSIDE == 0:
                acc = tl.dot(vcode, p8.to(tl.int8), out_dtype=tl.int32)                   # [D, G_PAD]
                if USE_SE:
                    vs = tl.load(vsm + blk * D + dd).to(tl.float32)
                else:
                    vs = _vsum(acc, vcode, SUMCOL)
                upd = sv[:, None] * (acc.to(tl.float32) + 128.0 * vs[:, None]) + mv[:, None] * usum[None, :]
                o = o * alpha[None, :] + upd * (1.0 / 255.0)
            else:   # head-major P.V on mma.sync (hack_core), V bytes in their natural [BN, W] layout
                o0, o1, o2, o3 = hack_pv_block(o0, o1, o2, o3, tl.trans(p8.to(tl.int8)), usum, alpha,
                                               vc, vmn, vsc, vsm, tok, tmask, blk, True,
                                               W, D, USE_SE, USE_ASM, SUMCOL)
            l_i = l_i * alpha + usum * (1.0 / 255.0)
        else:
            if VSIDE == 0:
                vd = vcode.to(tl.float16) * sv[:, None].to(tl.float16) + mv[:, None].to(tl.float16)
                o = tl.dot(vd, p.to(tl.float16), o * alpha[None, :])
            else:
                o0, o1, o2, o3 = dequant_pv(o0, o1, o2, o3, tl.trans(p.to(tl.float16)), alpha, vc,
                                            vmn, vsc, tok, tmask, blk, W, D, USE_ASM)
            l_i = l_i * alpha + tl.sum(p, 0)
        m_i = m_new
    if HAS_TAIL:
        # RQE: the last < PI tokens have quantized K but FP16 V; the last split multiplies them.
        if (split == NSPLIT - 1) & (L > LV):
            tok = LV + tl.arange(0, BN)
            tmask = tok < L
            s = _scores_t(kc, kmn, ksc, ksm, tok, tmask, j, qt0, qt1, qt2, qt3, a0, b0, c0, a2, b2, c2,
                          W, NP, GPP, MODE, USE_SE, SUMCOL, USE_ASM)
            m_new, alpha, p = online_softmax(s, m_i, 0)
            tr = tl.arange(0, BN)
            if VSIDE == 0:
                vt = tl.load(VT + (bh.to(tl.int64) * PI + tr)[None, :] * D + dd[:, None],
                             mask=(tr < L - LV)[None, :], other=0.0)                       # [D, PI] fp16
                o = tl.dot(vt, p.to(tl.float16), o * alpha[None, :])
            else:
                o0, o1, o2, o3 = tail_pv(o0, o1, o2, o3, tl.trans(p.to(tl.float16)), alpha, VT, bh, L - LV, PI, D, W)
            l_i = l_i * alpha + tl.sum(p, 0)
            m_i = m_new
    has = l_i > 0
    lse = tl.where(has, m_i + tl.log2(tl.where(has, l_i, 1.0)), float("-inf"))
    inv_l = 1.0 / tl.where(has, l_i, 1.0)
    if NSPLIT == 1:
        _store_o(OUT + qrow.to(tl.int64) * D, o, o0, o1, o2, o3, inv_l, gmask, dd, j, W, VSIDE)
    else:
        prow = qrow.to(tl.int64) * NSPLIT + split
        tl.store(LSEP + prow, lse, mask=gmask)
        _store_o(OP + prow * D, o, o0, o1, o2, o3, inv_l, gmask, dd, j, W, VSIDE)
        if FUSED:
            # Last program of this (request, KV head) to finish merges the partials.  The barrier
            # orders every thread's stores before the (release) atomic; the acquire side reads
            # the partials from L2 (.cg), not from a possibly stale L1.
            tl.debug_barrier()
            done = tl.atomic_add(CNT + bh, 1, sem="acq_rel")
            if done == NSPLIT - 1:
                mx = tl.full([G_PAD], float("-inf"), tl.float32)
                for sp in range(0, NSPLIT):
                    mx = tl.maximum(mx, tl.load(LSEP + qrow.to(tl.int64) * NSPLIT + sp, mask=gmask,
                                                other=float("-inf"), cache_modifier=".cg"))
                mx = tl.where(mx == float("-inf"), 0.0, mx)
                wsum = tl.zeros([G_PAD], tl.float32)
                acc_o = tl.zeros([D, G_PAD], tl.float32)
                for sp in range(0, NSPLIT):
                    r = qrow.to(tl.int64) * NSPLIT + sp
                    w = tl.exp2(tl.load(LSEP + r, mask=gmask, other=float("-inf"), cache_modifier=".cg") - mx)
                    wsum += w
                    acc_o += w[None, :] * tl.load(OP + r[None, :] * D + dd[:, None], mask=gmask[None, :],
                                                  other=0.0, cache_modifier=".cg")
                out = acc_o / tl.maximum(wsum, 1e-30)[None, :]
                tl.store(OUT + qrow[None, :] * D + dd[:, None], out.to(OUT.dtype.element_ty), mask=gmask[None, :])
                tl.atomic_xchg(CNT + bh, 0)


_COUNTERS: dict = {}


def _counters(n: int, device: torch.device) -> torch.Tensor:
    """A zeroed int32 counter per (request, KV head), kept between calls (the kernel re-zeroes it).
    One buffer per device: calls on different streams at the same time must not share it."""
    key = (device.type, device.index)
    buf = _COUNTERS.get(key)
    if buf is None or buf.numel() < n:
        buf = torch.zeros(max(n, 1024), dtype=torch.int32, device=device)
        _COUNTERS[key] = buf
    return buf


def hack_attn_decode_t(q: torch.Tensor, cache: QuantKVCache, use_se: bool = True, mode: str = "hack",
                       splits: int | None = None, max_len: int | None = None, num_warps: int = 4,
                       num_stages: int = 3, fused_combine: bool = False, v_side: int = 1,
                       pad_heads_to: int = 16) -> torch.Tensor:
    """Same contract as hack_attn_decode (q [B, HQ, D] fp16 -> [B, HQ, D] fp16), token-major products."""
    from .hack_attn_decode import combine_splits_kernel, default_splits

    b, hkv, lmax, d = cache.shape
    g = cache.query_group(q)
    if cache.bits != 2 or d != 128:
        raise ValueError("the token-major kernel takes 2-bit codes and head_dim 128")
    pi = cache.partition
    if pi not in (64, 128):
        raise ValueError(f"the token-major kernel takes partition 64 or 128, got {pi}")
    g_pad = max(pad_heads_to, triton.next_power_of_2(g))   # 8: no padding head (mma.sync, not wgmma)
    max_len = lmax if max_len is None else max_len
    splits = splits or default_splits(b, hkv, max_len, pi, q.device)
    tps = triton.cdiv(triton.cdiv(max_len, splits), pi) * pi
    splits = triton.cdiv(max_len, tps)
    q = q.contiguous()
    out = torch.empty_like(q)
    op = torch.empty((b * q.shape[1], splits, d), dtype=torch.float32, device=q.device)
    lsep = torch.empty((b * q.shape[1], splits), dtype=torch.float32, device=q.device)
    cnt = _counters(b * hkv, q.device)
    _hack_decode_t_kernel[(b * hkv, splits)](
        q, cache.k_codes, cache.k_min, cache.k_scale, cache.k_sum,
        cache.v_codes, cache.v_min, cache.v_scale, cache.v_sum, cache.v_tail, cache.lens, op, lsep, out, cnt,
        1.0 / math.sqrt(d) * 1.4426950408889634, hkv, lmax, cache.v_min.shape[2], tps, splits,
        G=g, G_PAD=g_pad, D=d, PI=pi, USE_SE=use_se, HAS_TAIL=cache.rqe, MODE=0 if mode == "hack" else 1,
        USE_ASM=use_asm(q), SUMCOL=g if g < g_pad else -1, FUSED=fused_combine, VSIDE=v_side,
        num_warps=num_warps, num_stages=num_stages)
    if splits > 1 and not fused_combine:
        combine_splits_kernel[(b * q.shape[1],)](op, lsep, out, splits, D=d, S_PAD=triton.next_power_of_2(splits),
                                                 num_warps=4)
    return out
