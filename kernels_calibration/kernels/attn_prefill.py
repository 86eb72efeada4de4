"""FP16 causal prefill attention, FlashAttention-2 style (Triton), with GQA.

grid (cdiv(L, BM), B * H_q); each program keeps a [BM, D] Q tile and streams K/V blocks of BN
tokens up to the diagonal (blocks strictly below it without the causal mask, the diagonal band
with it); FP16 operands, FP32 accumulation, online softmax in base 2.  Checked against torch SDPA.

causal flops = 4 * H_q * D * sum_b L_b (L_b + 1) / 2.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from .common import online_softmax
from .launch import PrefillConfig


@triton.jit
def _fa_inner(acc, l_i, m_i, q, kbase, vbase, rows, lo, hi, L, D: tl.constexpr, BN: tl.constexpr, MASKED: tl.constexpr):
    d = tl.arange(0, D)
    for s0 in range(lo, hi, BN):
        tok = s0 + tl.arange(0, BN)
        kt = tl.load(kbase + tok[None, :] * D + d[:, None], mask=tok[None, :] < L, other=0.0)  # [D, BN]
        s = tl.dot(q, kt)
        if MASKED:
            s = tl.where((tok[None, :] <= rows[:, None]) & (tok[None, :] < L), s, float("-inf"))
        m_new, alpha, p = online_softmax(s, m_i)
        v = tl.load(vbase + tok[:, None] * D + d[None, :], mask=tok[:, None] < L, other=0.0)  # [BN, D]
        acc = tl.dot(p.to(tl.float16), v, acc * alpha[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        m_i = m_new
    return acc, l_i, m_i


@triton.jit
def _fa_prefill_kernel(
    Q, K, V, O, qk_scale, HQ, HKV, L, LMAX, G: tl.constexpr, D: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr
):
    # Q, O [B, HQ, L, D]; K, V [B, HKV, LMAX, D] fp16
    mblk = tl.program_id(0)
    bhq = tl.program_id(1)
    b = bhq // HQ
    hq = bhq % HQ
    rows = mblk * BM + tl.arange(0, BM)
    d = tl.arange(0, D)
    qoff = bhq.to(tl.int64) * L * D
    q = tl.load(Q + qoff + rows[:, None] * D + d[None, :], mask=rows[:, None] < L, other=0.0)
    q = (q.to(tl.float32) * qk_scale).to(tl.float16)
    kvoff = (b * HKV + hq // G).to(tl.int64) * LMAX * D
    m_i = tl.full([BM], float("-inf"), tl.float32)
    l_i = tl.zeros([BM], tl.float32)
    acc = tl.zeros([BM, D], tl.float32)
    lo_diag = mblk * BM
    acc, l_i, m_i = _fa_inner(acc, l_i, m_i, q, K + kvoff, V + kvoff, rows, 0, lo_diag, L, D, BN, False)
    acc, l_i, m_i = _fa_inner(
        acc, l_i, m_i, q, K + kvoff, V + kvoff, rows, lo_diag, tl.minimum(lo_diag + BM, L), L, D, BN, True
    )
    out = acc / l_i[:, None]
    tl.store(O + qoff + rows[:, None] * D + d[None, :], out.to(tl.float16), mask=rows[:, None] < L)


def fa_attn_prefill(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, config: PrefillConfig = PrefillConfig()
) -> torch.Tensor:
    """Causal attention. q [B, HQ, L, D], k, v [B, HKV, Lmax >= L, D] fp16 -> [B, HQ, L, D] fp16.
    Defaults: BM 128 query rows, BN 64 tokens, 8 warps, 3 stages."""
    block_m, block_n = config.block_m or 128, config.block_n
    b, hq, seq, d = q.shape
    hkv, lmax = k.shape[1], k.shape[2]
    if hq % hkv or k.shape[0] != b or lmax < seq or k.shape != v.shape or block_m % block_n:
        raise ValueError("shape mismatch")
    o = torch.empty_like(q)
    qk_scale = 1.0 / math.sqrt(d) * 1.4426950408889634
    _fa_prefill_kernel[(triton.cdiv(seq, block_m), b * hq)](
        q.contiguous(),
        k.contiguous(),
        v.contiguous(),
        o,
        qk_scale,
        hq,
        hkv,
        seq,
        lmax,
        G=hq // hkv,
        D=d,
        BM=block_m,
        BN=block_n,
        **config.options(8, 3),
    )
    return o


def prefill_flops(lens, q_heads: int, head_dim: int) -> float:
    """Causal attention FLOPs: 4 * H_q * D * sum L (L + 1) / 2 (the cost model's unit)."""
    return 4.0 * q_heads * head_dim * sum(n * (n + 1) / 2 for n in lens)


def attn_prefill_ref(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Causal float64 reference (CPU), GQA by repetition."""
    b, hq, seq, d = q.shape
    g = hq // k.shape[1]
    kk = k[:, :, :seq].double().cpu().repeat_interleave(g, 1)
    vv = v[:, :, :seq].double().cpu().repeat_interleave(g, 1)
    s = q.double().cpu() @ kk.transpose(-1, -2) / math.sqrt(d)
    s = s.masked_fill(torch.triu(torch.ones(seq, seq, dtype=torch.bool), 1), float("-inf"))
    return torch.softmax(s, -1) @ vv
