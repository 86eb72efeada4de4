"""Head-major quantized decode attention: the G = H_q / H_kv query heads of a KV head are the M side of
every tensor-core dot (padded to G_PAD >= 16 rows), tokens the N side.  Two modes share the loop:
  MODE 0, HACK: Q rounded to 8 bits per K partition in the kernel, INT8 dots against the 2-bit codes
    with the correction terms (hack_core.hack_scores, hack_pv_block), P rounded to 1/255 steps;
  MODE 1, fused dequantize-then-attend (KIVI-style): codes looked up to FP16 in registers
    (common.dequant_lut, a per-partition table, no integer-to-float conversion), FP16 dots.
Split-K (split_k.py): grid (B * H_kv, splits); each program walks tiles of BN = max(PI, 128) tokens
(K needs no token blocking: its partitions lie along head_dim; P is split into PI-column chunks, one
P.V product per V block) and the split owning the end of the cache also multiplies the FP16 V tail
(RQE).  Without SE the K and V code sums come from the tensor cores: a padding query row (and P row)
of ones makes its dot row the code sum (SUMROW), or from a reduction when there is no padding row.

This is the HACK kernel for shapes the row-packed one does not take (head_dim other than 128, fewer
than 4 or more than 16 query heads per KV head) and the fused-dequant kernel wherever the Gluon one
does not run (before Hopper, PI 32, GQA other than 8).

Work of one decode step (per KV element visited: Q.K and P.V for G query heads):
  flops = 4 * G * sum(lens) * H_kv * D;  bytes = cache.nbytes_visited() + Q and O.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .common import online_softmax, use_asm
from .hack_core import (
    cache_ptrs,
    dequant_pv,
    dequant_scores,
    flash_state,
    hack_pv_block,
    hack_scores,
    load_q_groups,
    q_quantize,
    quantize_p,
    split_cols,
    split_prologue,
    store_partials,
    tail_pv,
)
from .kv_cache import QuantKVCache
from .launch import DecodeConfig
from .split_k import run_quant_split_decode


@triton.jit
def _quant_decode_kernel(
    Q,
    KC,
    KMN,
    KSC,
    KSM,
    VC,
    VMN,
    VSC,
    VSM,
    VT,
    LENS,
    OP,
    LSEP,
    qk_scale,
    HKV,
    LMAX,
    NBLK,
    TPS,
    NSPLIT,
    G: tl.constexpr,
    G_PAD: tl.constexpr,
    D: tl.constexpr,
    PI: tl.constexpr,
    USE_SE: tl.constexpr,
    HAS_TAIL: tl.constexpr,
    MODE: tl.constexpr,
    USE_ASM: tl.constexpr,
    SUMROW: tl.constexpr,
    BN: tl.constexpr,
):
    W: tl.constexpr = D // 4
    NP: tl.constexpr = D // PI
    GPP: tl.constexpr = PI // W
    bh, split, L, LV, start, end, g, gmask, qrow = split_prologue(LENS, HKV, TPS, G, G_PAD, PI, HAS_TAIL)
    q0, q1, q2, q3 = load_q_groups(Q, qrow, gmask, W, D)  # [G_PAD, W] each, channel group c = c*W..
    kc, kmn, ksc, ksm, vc, vmn, vsc, vsm = cache_ptrs(KC, KMN, KSC, KSM, VC, VMN, VSC, VSM, bh, LMAX, NBLK, W, NP, D)
    m_i, l_i, o0, o1, o2, o3 = flash_state(G_PAD, W)
    if MODE == 0:
        qi0, qi1, qi2, qi3, a0, a1, a2, a3, b0, b1, b2, b3, c0, c1, c2, c3 = q_quantize(
            q0, q1, q2, q3, qk_scale, PI, GPP
        )
        if not USE_SE:
            if SUMROW >= 0:  # a padding query row of ones: its dot row is the K code sum
                one = (g == SUMROW)[:, None]
                qi0 = tl.where(one, 1, qi0).to(tl.int8)
                qi1 = tl.where(one, 1, qi1).to(tl.int8)
                qi2 = tl.where(one, 1, qi2).to(tl.int8)
                qi3 = tl.where(one, 1, qi3).to(tl.int8)
    else:
        qh0 = (q0 * qk_scale).to(tl.float16)
        qh1 = (q1 * qk_scale).to(tl.float16)
        qh2 = (q2 * qk_scale).to(tl.float16)
        qh3 = (q3 * qk_scale).to(tl.float16)
    # Tiles of BN tokens (BN = PI, 2 PI or 4 PI): K needs no token blocking (its partitions lie
    # along D); P is split into PI-column chunks, one P.V product per V block.
    ones = tl.full([G_PAD], 1.0, tl.float32)
    for s0 in range(start, end, BN):
        tok = s0 + tl.arange(0, BN)
        tmask = tok < end
        if MODE == 0:
            s = hack_scores(
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
                kc,
                kmn,
                ksc,
                ksm,
                tok,
                tmask,
                W,
                NP,
                GPP,
                USE_SE,
                USE_ASM,
                SUMROW,
            )
        else:
            s = dequant_scores(qh0, qh1, qh2, qh3, kc, kmn, ksc, tok, tmask, W, NP, GPP, USE_ASM)
        s = tl.where(tmask[None, :], s, float("-inf"))
        m_new, alpha, p = online_softmax(s, m_i)
        blk = s0 // PI
        t0 = s0 + tl.arange(0, PI)
        if MODE == 0:
            p8, usum = quantize_p(p, USE_SE, SUMROW)
            lsum = usum * (1.0 / 255.0)
            if BN == PI:
                o0, o1, o2, o3 = hack_pv_block(
                    o0,
                    o1,
                    o2,
                    o3,
                    p8,
                    usum,
                    alpha,
                    vc,
                    vmn,
                    vsc,
                    vsm,
                    t0,
                    t0 < end,
                    blk,
                    True,
                    W,
                    D,
                    USE_SE,
                    USE_ASM,
                    SUMROW,
                )
            elif BN == 2 * PI:
                pa, pb = split_cols(p8)
                o0, o1, o2, o3 = hack_pv_block(
                    o0,
                    o1,
                    o2,
                    o3,
                    pa,
                    tl.sum(pa.to(tl.float32), 1) + 128.0 * PI,
                    alpha,
                    vc,
                    vmn,
                    vsc,
                    vsm,
                    t0,
                    t0 < end,
                    blk,
                    True,
                    W,
                    D,
                    USE_SE,
                    USE_ASM,
                    SUMROW,
                )
                o0, o1, o2, o3 = hack_pv_block(
                    o0,
                    o1,
                    o2,
                    o3,
                    pb,
                    tl.sum(pb.to(tl.float32), 1) + 128.0 * PI,
                    ones,
                    vc,
                    vmn,
                    vsc,
                    vsm,
                    t0 + PI,
                    t0 + PI < end,
                    blk + 1,
                    s0 + PI < end,
                    W,
                    D,
                    USE_SE,
                    USE_ASM,
                    SUMROW,
                )
            else:
                pl, pr = split_cols(p8)
                pa, pb = split_cols(pl)
                pc, pd = split_cols(pr)
                o0, o1, o2, o3 = hack_pv_block(
                    o0,
                    o1,
                    o2,
                    o3,
                    pa,
                    tl.sum(pa.to(tl.float32), 1) + 128.0 * PI,
                    alpha,
                    vc,
                    vmn,
                    vsc,
                    vsm,
                    t0,
                    t0 < end,
                    blk,
                    True,
                    W,
                    D,
                    USE_SE,
                    USE_ASM,
                    SUMROW,
                )
                o0, o1, o2, o3 = hack_pv_block(
                    o0,
                    o1,
                    o2,
                    o3,
                    pb,
                    tl.sum(pb.to(tl.float32), 1) + 128.0 * PI,
                    ones,
                    vc,
                    vmn,
                    vsc,
                    vsm,
                    t0 + PI,
                    t0 + PI < end,
                    blk + 1,
                    s0 + PI < end,
                    W,
                    D,
                    USE_SE,
                    USE_ASM,
                    SUMROW,
                )
                o0, o1, o2, o3 = hack_pv_block(
                    o0,
                    o1,
                    o2,
                    o3,
                    pc,
                    tl.sum(pc.to(tl.float32), 1) + 128.0 * PI,
                    ones,
                    vc,
                    vmn,
                    vsc,
                    vsm,
                    t0 + 2 * PI,
                    t0 + 2 * PI < end,
                    blk + 2,
                    s0 + 2 * PI < end,
                    W,
                    D,
                    USE_SE,
                    USE_ASM,
                    SUMROW,
                )
                o0, o1, o2, o3 = hack_pv_block(
                    o0,
                    o1,
                    o2,
                    o3,
                    pd,
                    tl.sum(pd.to(tl.float32), 1) + 128.0 * PI,
                    ones,
                    vc,
                    vmn,
                    vsc,
                    vsm,
                    t0 + 3 * PI,
                    t0 + 3 * PI < end,
                    blk + 3,
                    s0 + 3 * PI < end,
                    W,
                    D,
                    USE_SE,
                    USE_ASM,
                    SUMROW,
                )
        else:
            p16 = p.to(tl.float16)
            lsum = tl.sum(p, 1)
            if BN == PI:
                o0, o1, o2, o3 = dequant_pv(o0, o1, o2, o3, p16, alpha, vc, vmn, vsc, t0, t0 < end, blk, W, D, USE_ASM)
            elif BN == 2 * PI:
                pa, pb = split_cols(p16)
                o0, o1, o2, o3 = dequant_pv(o0, o1, o2, o3, pa, alpha, vc, vmn, vsc, t0, t0 < end, blk, W, D, USE_ASM)
                o0, o1, o2, o3 = dequant_pv(
                    o0,
                    o1,
                    o2,
                    o3,
                    pb,
                    ones,
                    vc,
                    vmn,
                    vsc,
                    t0 + PI,
                    t0 + PI < end,
                    blk + 1,
                    W,
                    D,
                    USE_ASM,
                    s0 + PI < end,
                )
            else:
                pl, pr = split_cols(p16)
                pa, pb = split_cols(pl)
                pc, pd = split_cols(pr)
                o0, o1, o2, o3 = dequant_pv(o0, o1, o2, o3, pa, alpha, vc, vmn, vsc, t0, t0 < end, blk, W, D, USE_ASM)
                o0, o1, o2, o3 = dequant_pv(
                    o0,
                    o1,
                    o2,
                    o3,
                    pb,
                    ones,
                    vc,
                    vmn,
                    vsc,
                    t0 + PI,
                    t0 + PI < end,
                    blk + 1,
                    W,
                    D,
                    USE_ASM,
                    s0 + PI < end,
                )
                o0, o1, o2, o3 = dequant_pv(
                    o0,
                    o1,
                    o2,
                    o3,
                    pc,
                    ones,
                    vc,
                    vmn,
                    vsc,
                    t0 + 2 * PI,
                    t0 + 2 * PI < end,
                    blk + 2,
                    W,
                    D,
                    USE_ASM,
                    s0 + 2 * PI < end,
                )
                o0, o1, o2, o3 = dequant_pv(
                    o0,
                    o1,
                    o2,
                    o3,
                    pd,
                    ones,
                    vc,
                    vmn,
                    vsc,
                    t0 + 3 * PI,
                    t0 + 3 * PI < end,
                    blk + 3,
                    W,
                    D,
                    USE_ASM,
                    s0 + 3 * PI < end,
                )
        l_i = l_i * alpha + lsum
        m_i = m_new
    if HAS_TAIL:
        # RQE: the last < PI tokens have quantized K but FP16 V; the last split multiplies them.
        if (split == NSPLIT - 1) & (L > LV):
            tok = LV + tl.arange(0, PI)
            tmask = tok < L
            if MODE == 0:
                s = hack_scores(
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
                    kc,
                    kmn,
                    ksc,
                    ksm,
                    tok,
                    tmask,
                    W,
                    NP,
                    GPP,
                    USE_SE,
                    USE_ASM,
                    SUMROW,
                )
            else:
                s = dequant_scores(qh0, qh1, qh2, qh3, kc, kmn, ksc, tok, tmask, W, NP, GPP, USE_ASM)
            s = tl.where(tmask[None, :], s, float("-inf"))
            m_new, alpha, p = online_softmax(s, m_i)
            o0, o1, o2, o3 = tail_pv(o0, o1, o2, o3, p.to(tl.float16), alpha, VT, bh, L - LV, PI, D, W)
            l_i = l_i * alpha + tl.sum(p, 1)
            m_i = m_new
    store_partials(OP, LSEP, qrow.to(tl.int64) * NSPLIT + split, gmask, o0, o1, o2, o3, l_i, m_i, D, W)


# Fused dequant above DEQUANT_LONG tokens: 2 warps, and at PI <= 64 a cap of 168 registers (6 programs
# per SM); at PI 128 the cap is slower (DESIGN.md).
DEQUANT_LONG = 2048
DEQUANT_MAXNREG = 168


def head_major_supported(cache: QuantKVCache) -> bool:
    """The shapes this kernel takes: 2-bit codes, head_dim a multiple of 128, PI a multiple of head_dim / 4."""
    d = cache.shape[3]
    return cache.bits == 2 and d % 128 == 0 and cache.partition % (d // 4) == 0


def quant_attn_decode_hm(
    q: torch.Tensor,
    cache: QuantKVCache,
    mode: str = "hack",
    use_se: bool = True,
    max_len: int | None = None,
    config: DecodeConfig = DecodeConfig(),
) -> torch.Tensor:
    """q [B, HQ, D] fp16 (the new token's query, already appended to the cache) -> [B, HQ, D] fp16.
    mode "hack" or "dequant"; max_len: an upper bound of lens (defaults to the capacity) that sizes
    the splits."""
    b, hkv, lmax, d = cache.shape
    g = cache.query_group(q)
    if cache.bits != 2 or d % 128:
        raise ValueError("HACK attention kernels take 2-bit codes and head_dim a multiple of 128")
    pi = cache.partition
    if pi % (d // 4):
        raise ValueError(f"partition {pi} must be a multiple of head_dim/4 = {d // 4}")
    block_n = max(pi, 128)
    max_len = lmax if max_len is None else max_len
    if mode == "dequant" and max_len > DEQUANT_LONG:
        opts = config.options(2, 3, DEQUANT_MAXNREG if pi <= 64 else None)
    else:
        opts = config.options(2 if mode == "hack" else 4, 3)
    g_pad = max(16, triton.next_power_of_2(g))
    sumrow = g if g < g_pad else -1  # a padding row computes code sums on the tensor cores (no SE)
    return run_quant_split_decode(
        _quant_decode_kernel,
        q,
        cache,
        max_len,
        block_n,
        config,
        G=g,
        G_PAD=g_pad,
        D=d,
        PI=pi,
        USE_SE=use_se,
        HAS_TAIL=cache.rqe,
        MODE=0 if mode == "hack" else 1,
        USE_ASM=use_asm(q),
        SUMROW=sumrow,
        BN=block_n,
        **opts,
    )
