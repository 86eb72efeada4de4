"""Row-packed HACK decode attention: the padding rows of the 16-row dots do useful work.

The head-major kernel (head_major.py) gives the G = 8 query heads of a KV head a 16-row tile (mma.sync's M = 16), so
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

The loop body is hack_core.rp_tile (shared with the row-scaled prefill kernel).  It issues 2,946
warp-instructions per 128 tokens offline (sm_90) against 4,530 for the head-major kernel
(head_major.py); at 241 registers per thread only 4 programs fit an SM, which the register cap above
2K tokens (ptxas spills a little) turns into 8 (DESIGN.md).  The fused decode step (APPEND) has the
last split append the new token before it attends.
"""

from __future__ import annotations

from dataclasses import replace

import torch
import triton
import triton.language as tl

from .common import online_softmax, use_asm
from .hack_core import cache_ptrs, flash_state, load_q_groups, q_round_rows, rp_scores, rp_tile, store_partials, tail_pv
from .kv_cache import QuantKVCache, append_one
from .launch import DecodeConfig
from .split_k import run_quant_split_decode


@triton.jit
def _rp_decode_kernel(
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
    KN,
    VN,
    LENS_OUT,
    seed,
    G: tl.constexpr,
    RP: tl.constexpr,
    R: tl.constexpr,
    D: tl.constexpr,
    PI: tl.constexpr,
    USE_SE: tl.constexpr,
    HAS_TAIL: tl.constexpr,
    USE_ASM: tl.constexpr,
    APPEND: tl.constexpr = False,
    STOCHASTIC: tl.constexpr = True,
):
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
            append_one(
                KN, VN, L, bh, KC, KMN, KSC, KSM, VC, VMN, VSC, VSM, VT, LMAX, NBLK, seed, D, PI, 2, True, STOCHASTIC
            )
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
        m_i, l_i, o0, o1, o2, o3 = rp_tile(
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
            kc,
            kmn,
            ksc,
            ksm,
            vc,
            vmn,
            vsc,
            vsm,
            W,
            D,
            NP,
            GPP,
            PI,
            R,
            BN,
            USE_SE,
            USE_ASM,
            False,
            copy,
            False,
        )
    if end_full < end:
        m_i, l_i, o0, o1, o2, o3 = rp_tile(
            end_full,
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
            kc,
            kmn,
            ksc,
            ksm,
            vc,
            vmn,
            vsc,
            vsm,
            W,
            D,
            NP,
            GPP,
            PI,
            R,
            BN,
            USE_SE,
            USE_ASM,
            True,
            copy,
            False,
        )
    if HAS_TAIL:
        # RQE: the last < PI tokens have quantized K but FP16 V; copy 0 of the last split takes them.
        if (split == NSPLIT - 1) & (L > LV):
            tok = LV + tl.arange(0, PI)
            tmask = tok < L
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
                True,
            )
            x = tl.where(tmask[None, :], x, float("-inf"))
            m_new, alpha, p = online_softmax(x * aq[:, None], m_i)
            p = tl.where((copy == 0)[:, None], p * 255.0, 0.0)  # o and l are kept times 255
            o0, o1, o2, o3 = tail_pv(o0, o1, o2, o3, p.to(tl.float16), alpha, VT, bh, L - LV, PI, D, W)
            l_i = l_i * alpha + tl.sum(p, 1)
            m_i = m_new
    # each copy is a split of its own
    store_partials(OP, LSEP, qrow.to(tl.int64) * (NSPLIT * R) + split * R + copy, rmask, o0, o1, o2, o3, l_i, m_i, D, W)


def row_copies(g: int) -> tuple[int, int]:
    """(rows of the dot tile, copies of the head group in it) for G query heads per KV head."""
    rp = max(16, triton.next_power_of_2(g))
    return rp, max(1, rp // g)


def row_packed_supported(q: torch.Tensor, cache: QuantKVCache) -> bool:
    """The shapes this kernel takes: 2-bit codes, head_dim 128, PI 32/64/128, 4-16 query heads per KV head."""
    b, hkv, _, d = cache.shape
    g = q.shape[1] // hkv if q.dim() == 3 and q.shape[1] % hkv == 0 else 0
    return cache.bits == 2 and d == 128 and cache.partition in (32, 64, 128) and 4 <= g <= 16


# Above LONG_CONTEXT tokens: registers capped at 128 (8 programs per SM instead of 4) and, at PI <= 64,
# 2 warps; shorter contexts: 4 warps, no cap (DESIGN.md, the row-packed kernel).
LONG_CONTEXT = 2048
LONG_MAXNREG = 128


def launch_options(cache: QuantKVCache, max_len: int, config: DecodeConfig) -> dict:
    """The measured launch defaults under config's own fields."""
    long = max_len > LONG_CONTEXT
    return config.options(4 if not long or cache.partition > 64 else 2, 3, LONG_MAXNREG if long else None)


def hack_attn_decode_rp(
    q: torch.Tensor,
    cache: QuantKVCache,
    use_se: bool = True,
    max_len: int | None = None,
    config: DecodeConfig = DecodeConfig(),
    append: tuple | None = None,
):
    """q [B, HQ, D] fp16 (the new token's query, already appended to the cache) -> [B, HQ, D] fp16.
    max_len: an upper bound of lens (defaults to the capacity) that sizes the splits.
    append = (k_new, v_new, seed, stochastic): the fused step (hack_decode_step); returns (out, cache)."""
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
    opts = launch_options(cache, max_len, config)

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

    out = run_quant_split_decode(
        _rp_decode_kernel,
        q,
        cache,
        max_len,
        bn,
        config,
        *extra,
        partials_per_row=r,
        G=g,
        RP=rp,
        R=r,
        D=d,
        PI=pi,
        USE_SE=use_se,
        HAS_TAIL=cache.rqe,
        USE_ASM=use_asm(q),
        APPEND=append is not None,
        STOCHASTIC=stochastic,
        **opts,
    )
    if append is not None:
        return out, replace(cache, lens=extra[2])
    return out


def hack_decode_step(
    q: torch.Tensor,
    cache: QuantKVCache,
    k_new: torch.Tensor,
    v_new: torch.Tensor,
    stochastic: bool = True,
    seed: int = 0,
    use_se: bool = True,
    max_len: int | None = None,
    config: DecodeConfig = DecodeConfig(),
) -> tuple[torch.Tensor, QuantKVCache]:
    """One fused HACK decode step: append (k_new, v_new [B, H_kv, D]) and attend with q [B, H_q, D]
    over the appended cache in one attention launch (+ the split combine) instead of append_token's
    extra launch.  Returns (output [B, H_q, D], the cache with lens + 1), the cache identical to
    append_token's.  The attention differs from append_token + the row-packed kernel only at the step
    that fills a V block: that block is attended in FP16 (the tail) and quantized for later steps.
    max_len: an upper bound of the lengths after the append."""
    return hack_attn_decode_rp(
        q, cache, use_se=use_se, max_len=max_len, config=config, append=(k_new, v_new, seed, stochastic)
    )
