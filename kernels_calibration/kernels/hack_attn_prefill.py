"""HACK prefill attention (the family's entry point): INT8 Q (quantized in the kernel) against the
2-bit K/V codes, causal, GQA.

    out = hack_attn_prefill(q, cache, use_se=True, config=PrefillConfig())
    ref = hack_attn_prefill_ref(q, cache, q_per_row=True)      # float64, what the kernel computes

grid (cdiv(L, BM), B * H_q).  Each program rounds its BM query rows to 8 bits (one scale and min per
row) and walks the cache one V block (PI tokens) at a time with the row-packed decode kernel's tile
(hack_core.rp_tile): four INT8 dots for Q.K^T (one per bit plane / channel group), the correction
terms with the stored sums (SE, or code sums on the tensor cores), online softmax, P rounded with one
FMA to INT8, four INT8 dots for P.V, O and l kept x255; blocks below the diagonal unmasked, the
diagonal band causal.  K/V are the quantized prefill KV that HACK sends over the wire (quantize.py);
the last partial V block is quantized with its own count (no FP16 tail in prefill: the FP16
originals are at hand).  16K tokens, batch 1, 64/8 heads on the H200: 31.2 ms at PI 64, 18.9 ms at
PI 128, against 10.3 ms for the FP16 Triton FlashAttention kernel (attn_prefill.py; DESIGN.md).

causal flops = 4 * H_q * D * sum_b L_b (L_b + 1) / 2 (attn_prefill.prefill_flops; counted as if
dense; INT8 ops).
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from .common import use_asm
from .hack_core import cache_ptrs, flash_state, load_q_groups, prefill_rows, q_round_rows, rp_tile
from .kv_cache import QuantKVCache, dequantize_cache_ref
from .launch import PrefillConfig


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
def _hack_prefill_kernel(
    Q,
    KC,
    KMN,
    KSC,
    KSM,
    VC,
    VMN,
    VSC,
    VSM,
    O,
    qk_scale,
    HQ,
    HKV,
    L,
    LMAX,
    NBLK,
    G: tl.constexpr,
    D: tl.constexpr,
    PI: tl.constexpr,
    BM: tl.constexpr,
    USE_SE: tl.constexpr,
    USE_ASM: tl.constexpr,
):
    """The row-packed decode kernel's tile (hack_core.rp_tile) on BM query rows of one head: Q rounded
    per row (its scale factored out of the scores), P rounded with one FMA, P row sums on the tensor
    cores, O and l kept x255, 128 sum v' added in INT32; one V block (PI tokens) per tile; unmasked
    below the diagonal, causal on it."""
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
        m_i, l_i, o0, o1, o2, o3 = rp_tile(
            s0,
            L,
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
            1,
            PI,
            USE_SE,
            USE_ASM,
            False,
            rows,
            False,
        )
    for s0 in range(lo_diag, tl.minimum(lo_diag + BM, L), PI):
        m_i, l_i, o0, o1, o2, o3 = rp_tile(
            s0,
            L,
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
            1,
            PI,
            USE_SE,
            USE_ASM,
            True,
            rows,
            True,
        )
    _store_rows(O + bhq.to(tl.int64) * L * D, rows, rmask, o0, o1, o2, o3, l_i, D, W)


def hack_attn_prefill(
    q: torch.Tensor, cache: QuantKVCache, use_se: bool = True, config: PrefillConfig = PrefillConfig()
) -> torch.Tensor:
    """q [B, HQ, L, D] fp16; cache holds the same L tokens for every request (rqe=False, so every
    V token is quantized) -> [B, HQ, L, D] fp16.  Defaults (measured at 16K tokens): BM 64 / 4 warps
    for PI <= 64, BM 128 / 8 warps for PI 128; 2 stages."""
    b, hq, seq, d = q.shape
    cb, hkv, lmax, cd = cache.shape
    block_m = config.block_m or (64 if cache.partition <= 64 else 128)
    if cb != b or cd != d or hq % hkv or lmax < seq:
        raise ValueError("q does not match the cache")
    if cache.rqe or cache.bits != 2 or d % 128 or cache.partition % (d // 4) or block_m % cache.partition:
        raise ValueError("prefill takes a 2-bit cache without tail, D % 128 == 0, PI | BM")
    o = torch.empty_like(q)
    qk_scale = 1.0 / math.sqrt(d) * 1.4426950408889634
    _hack_prefill_kernel[(triton.cdiv(seq, block_m), b * hq)](
        q.contiguous(),
        cache.k_codes,
        cache.k_min,
        cache.k_scale,
        cache.k_sum,
        cache.v_codes,
        cache.v_min,
        cache.v_scale,
        cache.v_sum,
        o,
        qk_scale,
        hq,
        hkv,
        seq,
        lmax,
        cache.v_min.shape[2],
        G=hq // hkv,
        D=d,
        PI=cache.partition,
        BM=block_m,
        USE_SE=use_se,
        USE_ASM=use_asm(q),
        **config.options(4 if block_m == 64 else 8, 2),
    )
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
