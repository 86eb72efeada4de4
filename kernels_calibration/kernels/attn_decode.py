"""FP16 (and FP8-KV) decode attention baseline, FlashAttention-2 / flash-decoding style.

Split-K over the sequence, grid (B * H_kv, splits); the G = H_q / H_kv query heads of a KV head are
one [G_PAD >= 16, D] tile so each K/V byte is read once per KV head (GQA).  FP8: K and V stored as
float8 e4m3 with one scale per tensor, converted to FP16 in registers (FP16 dots, FP32 accumulate).
Checked against torch SDPA (tests and the device check).

Work: flops = 4 * G * sum(lens) * H_kv * D; bytes = 2 * sum(lens) * H_kv * D * elem_bytes + Q + O.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from .common import online_softmax
from .launch import FpDecodeConfig
from .split_k import default_splits, run_split_decode, tokens_per_split


@triton.jit
def _fp_decode_kernel(
    Q,
    K,
    V,
    LENS,
    OP,
    LSEP,
    qk_scale,
    v_scale,
    HKV,
    LMAX,
    TPS,
    NSPLIT,
    G: tl.constexpr,
    G_PAD: tl.constexpr,
    D: tl.constexpr,
    BN: tl.constexpr,
):
    # Q [B, HQ, D] fp16; K, V [B, HKV, LMAX, D] fp16 or fp8e4m3 (then qk_scale includes k's scale)
    bh = tl.program_id(0)
    split = tl.program_id(1)
    b = bh // HKV
    h = bh % HKV
    L = tl.load(LENS + b)
    start = split * TPS
    end = tl.minimum(start + TPS, L)
    g = tl.arange(0, G_PAD)
    gmask = g < G
    d = tl.arange(0, D)
    qrow = (b * HKV + h) * G + g
    q = tl.load(Q + qrow[:, None] * D + d[None, :], mask=gmask[:, None], other=0.0)
    q = (q.to(tl.float32) * qk_scale).to(tl.float16)  # [G_PAD, D]
    base = bh.to(tl.int64) * LMAX * D
    m_i = tl.full([G_PAD], float("-inf"), tl.float32)
    l_i = tl.zeros([G_PAD], tl.float32)
    o = tl.zeros([G_PAD, D], tl.float32)
    for s0 in range(start, end, BN):
        tok = s0 + tl.arange(0, BN)
        tmask = tok < end
        kt = tl.load(K + base + tok[None, :] * D + d[:, None], mask=tmask[None, :], other=0.0)  # [D, BN]
        s = tl.dot(q, kt.to(tl.float16))
        s = tl.where(tmask[None, :], s, float("-inf"))
        m_new, alpha, p = online_softmax(s, m_i)
        v = tl.load(V + base + tok[:, None] * D + d[None, :], mask=tmask[:, None], other=0.0)  # [BN, D]
        o = tl.dot(p.to(tl.float16), v.to(tl.float16), o * alpha[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        m_i = m_new
    has = l_i > 0
    l_safe = tl.where(has, l_i, 1.0)
    prow = qrow.to(tl.int64) * NSPLIT + split
    tl.store(LSEP + prow, tl.where(has, m_i + tl.log2(l_safe), float("-inf")), mask=gmask)
    tl.store(OP + prow[:, None] * D + d[None, :], o * (v_scale / l_safe)[:, None], mask=gmask[:, None])


def fp_attn_decode(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    lens: torch.Tensor,
    k_scale: float = 1.0,
    v_scale: float = 1.0,
    max_len: int | None = None,
    config: FpDecodeConfig = FpDecodeConfig(),
) -> torch.Tensor:
    """q [B, HQ, D] fp16; k, v [B, HKV, Lmax, D] fp16 or float8_e4m3fn (value = stored * scale).
    max_len: an upper bound of lens (defaults to Lmax) that sizes the splits.  -> [B, HQ, D] fp16."""
    b, hkv, lmax, d = k.shape
    if q.shape[0] != b or q.shape[2] != d or q.shape[1] % hkv or v.shape != k.shape:
        raise ValueError("shape mismatch between q, k, v")
    g = q.shape[1] // hkv
    max_len = lmax if max_len is None else max_len
    block_n = config.block_n
    tps, splits = tokens_per_split(
        max_len, config.splits or default_splits(b, hkv, max_len, block_n, q.device), block_n
    )
    qk_scale = k_scale / math.sqrt(d) * 1.4426950408889634
    q = q.contiguous()
    opts = config.options(4, 3)

    def launch(op, lsep):
        _fp_decode_kernel[(b * hkv, splits)](
            q,
            k,
            v,
            lens,
            op,
            lsep,
            qk_scale,
            v_scale,
            hkv,
            lmax,
            tps,
            splits,
            G=g,
            G_PAD=max(16, triton.next_power_of_2(g)),
            D=d,
            BN=block_n,
            **opts,
        )

    return run_split_decode(launch, q, splits)


def to_fp8(x: torch.Tensor) -> tuple[torch.Tensor, float]:
    """Per-tensor scaled float8 e4m3 (max 448)."""
    scale = float(x.abs().amax().float().clamp(min=1e-6)) / 448.0
    return (x.float() / scale).to(torch.float8_e4m3fn), scale


def sdpa_decode(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """torch SDPA baseline (equal lengths): q [B, HQ, D], k, v [B, HKV, L, D] -> [B, HQ, D]."""
    out = torch.nn.functional.scaled_dot_product_attention(q[:, :, None, :], k, v, enable_gqa=True)
    return out[:, :, 0, :]


def decode_bytes(batch_tokens: int, kv_heads: int, head_dim: int, elem_bytes: float, q_heads: int, batch: int) -> float:
    return 2.0 * batch_tokens * kv_heads * head_dim * elem_bytes + 4.0 * batch * q_heads * head_dim


def decode_flops(batch_tokens: int, q_heads: int, head_dim: int) -> float:
    """Q.K and P.V multiply-adds for every query head over every visited token."""
    return 4.0 * batch_tokens * q_heads * head_dim


# ----------------------------------------------------------------------------- reference
def attn_decode_ref(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, lens) -> torch.Tensor:
    """Exact float64 attention of q [B, HQ, D] over k, v [B, HKV, L, D] (first lens[b] tokens)."""
    b, hq, d = q.shape
    hkv = k.shape[1]
    out = torch.empty((b, hq, d), dtype=torch.float64)
    for i in range(b):
        n = int(lens[i])
        kk = k[i, :, :n].double().cpu().repeat_interleave(hq // hkv, 0)  # (HQ, n, D)
        vv = v[i, :, :n].double().cpu().repeat_interleave(hq // hkv, 0)
        s = torch.einsum("hd,hnd->hn", q[i].double().cpu(), kk) / math.sqrt(d)
        out[i] = torch.einsum("hn,hnd->hd", torch.softmax(s, -1), vv)
    return out
