"""HCAttention decode scoring: q . k / sqrt(D) for every context token over b-bit quantized keys.

Modelled (HCAttention, Neurocomputing 2026): keys stay on the GPU quantized (4-bit by default,
2-bit also) and every token is scored each decode iteration; the scores pick which values to
fetch from host memory.  The keys use quantize.py's K layout unchanged (asymmetric, one FP16
min m_p and scale s_p per partition p of PI channels along head_dim, channel-interleaved bit
planes), so ``quantize_k(k, partition, bits)`` produces this kernel's input; the stored code
sums are not needed (q is not quantized here).  Per partition

    q . k_hat = sum_p ( s_p * sum_{j in p} q_j c_j  +  m_p * sum_{j in p} q_j )

The first sum is an FP16 x code dot with FP32 accumulation (codes <= 255 are exact in FP16),
computed transposed, [BT tokens, chunk] x [chunk, G_PAD heads], so the token axis is the dot's
M (>= 64) and the G query heads of a KV head (GQA) share every loaded key byte.  The 1/sqrt(D)
is applied to the FP32 result, so q is not rounded twice.

Layouts (B batch, H_kv KV heads, L_max padded context, W = D * bits / 8, NP = D / PI):
  q        fp16  [B, H_q, D]
  codes    uint8 [B, H_kv, L_max, W]      (quantize_k)
  k_min    fp16  [B, H_kv, L_max, NP]     k_scale fp16, same shape
  lens     int32 [B]                       tokens at or past lens[b] score -inf
  scores   fp32  [B, H_q, L_max]

Work per key element scored (the profile's unit, key ``score.quantized_keys``: sum_b ctx_b *
H_kv * D), group G:
  bytes = bits / 8 (codes) + 4 / PI (FP16 min + scale) + 4 * G / D (FP32 scores written)
  ops   = 2 * G (tensor-core multiply-add, FP16 x code) on the tensor cores, plus on CUDA cores
          ~3 per element (unpack shift+mask, convert) and 2 * G FMAs per partition per token for
          the scale and min terms
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from .common import codes_per_byte, unpack_codes, use_asm
from .launch import ScoreConfig
from .pq_score import tiles_per_program
from .quantize import dequantize_k_ref


@triton.jit
def _qk_score_kernel(
    Q,
    CODES,
    KMIN,
    KSCALE,
    LENS,
    OUT,
    sm_scale,
    HKV,
    LMAX,
    TPP,
    G: tl.constexpr,
    G_PAD: tl.constexpr,
    D: tl.constexpr,
    PI: tl.constexpr,
    BITS: tl.constexpr,
    BT: tl.constexpr,
    USE_ASM: tl.constexpr,
):
    # one program per (request, KV head, TPP-token slice of [0, L_max)); writes -inf past lens[b]
    CPB: tl.constexpr = 8 // BITS
    W: tl.constexpr = D // CPB
    NP: tl.constexpr = D // PI
    CW: tl.constexpr = W if W < PI else PI  # channels per chunk: one plane, or one partition
    NCH: tl.constexpr = W // CW  # chunks per plane (byte-column blocks)
    bh = tl.program_id(0)
    start = tl.program_id(1) * TPP
    b = bh // HKV
    L = tl.load(LENS + b)
    g = tl.arange(0, G_PAD)
    gmask = g < G
    qrow = (bh * G + g).to(tl.int64)
    cw = tl.arange(0, CW)
    cbase = bh.to(tl.int64) * LMAX * W
    mbase = bh.to(tl.int64) * LMAX * NP
    end = tl.minimum(start + TPP, LMAX)
    for t0 in range(start, end, BT):
        tok = t0 + tl.arange(0, BT)
        valid = tok < L
        acc = tl.zeros([BT, G_PAD], tl.float32)
        for jc in tl.static_range(NCH):
            packed = tl.load(
                CODES + cbase + tok[:, None] * W + (jc * CW + cw)[None, :], mask=valid[:, None], other=0
            )  # [BT, CW] uint8
            for i in tl.static_range(CPB):
                ch0 = i * W + jc * CW  # first channel
                p = ch0 // PI  # its partition
                qc = tl.load(
                    Q + qrow[None, :] * D + (ch0 + cw)[:, None], mask=gmask[None, :], other=0.0
                )  # [CW, G_PAD] fp16
                if BITS == 8:
                    c = packed.to(tl.float16)  # [BT, CW]
                else:
                    c = unpack_codes(packed, i * BITS, BITS, USE_ASM).to(tl.float16)
                sc = tl.load(KSCALE + mbase + tok * NP + p, mask=valid, other=0.0).to(tl.float32)
                mn = tl.load(KMIN + mbase + tok * NP + p, mask=valid, other=0.0).to(tl.float32)
                qs = tl.sum(qc.to(tl.float32), axis=0)  # [G_PAD]
                acc += tl.dot(c, qc) * sc[:, None] + mn[:, None] * qs[None, :]
        acc = tl.where(valid[:, None], acc * sm_scale, float("-inf"))
        tl.store(OUT + qrow[None, :] * LMAX + tok[:, None], acc, mask=gmask[None, :] & (tok < end)[:, None])


def qk_score(
    q: torch.Tensor,
    codes: torch.Tensor,
    k_min: torch.Tensor,
    k_scale: torch.Tensor,
    lens: torch.Tensor,
    partition: int = 64,
    bits: int = 4,
    sm_scale: float | None = None,
    top_k: int | None = None,
    config: ScoreConfig = ScoreConfig(),
):
    """Scores of every context token for every query head over quantize_k-format keys.

    q [B, H_q, D] fp16; codes [B, H_kv, L_max, D * bits / 8] uint8; k_min, k_scale
    [B, H_kv, L_max, D / partition] fp16; lens [B] int32.  Returns scores fp32 [B, H_q, L_max] =
    q . dequant(k) / sqrt(D) (sm_scale overrides 1/sqrt(D)), -inf at t >= lens[b]; with top_k also
    the indices [B, H_q, top_k] (int64) from torch.topk (a separate torch kernel, not fused).
    """
    cpb = codes_per_byte(bits)
    b, hq, d = q.shape
    if codes.dim() != 4 or codes.shape[0] != b or hq % codes.shape[1] or codes.shape[3] * cpb != d:
        raise ValueError(
            f"codes {tuple(codes.shape)} must be [B, H_kv, L_max, {d // cpb}] for q {tuple(q.shape)} at {bits} bits"
        )
    if d & (d - 1) or partition not in (16, 32, 64, 128) or d % partition:
        raise ValueError(f"head_dim {d} must be a power of two and partition {partition} in 16..128 divide it")
    hkv, lmax = codes.shape[1], codes.shape[2]
    meta_shape = (b, hkv, lmax, d // partition)
    if k_min.shape != meta_shape or k_scale.shape != meta_shape:
        raise ValueError(f"k_min / k_scale must be {meta_shape}, got {tuple(k_min.shape)} / {tuple(k_scale.shape)}")
    if (
        q.dtype != torch.float16
        or k_min.dtype != torch.float16
        or k_scale.dtype != torch.float16
        or codes.dtype != torch.uint8
    ):
        raise TypeError("q, k_min, k_scale must be fp16, codes uint8")
    if min(d * bits // 8, partition) < 16:
        raise ValueError("each dot chunk (one bit plane or one partition) needs >= 16 channels")
    if lens.shape != (b,):
        raise ValueError("lens must be [B]")
    g = hq // hkv
    sm_scale = 1.0 / math.sqrt(d) if sm_scale is None else sm_scale
    q, codes, k_min, k_scale = q.contiguous(), codes.contiguous(), k_min.contiguous(), k_scale.contiguous()
    scores = torch.empty((b, hq, lmax), dtype=torch.float32, device=q.device)
    if lmax:
        block_t = config.block_t or 64
        tpp = (config.tiles or tiles_per_program(b * hkv, lmax, block_t, q.device)) * block_t
        _qk_score_kernel[(b * hkv, triton.cdiv(lmax, tpp))](
            q,
            codes,
            k_min,
            k_scale,
            lens.to(torch.int32),
            scores,
            sm_scale,
            hkv,
            lmax,
            tpp,
            G=g,
            G_PAD=max(16, triton.next_power_of_2(g)),
            D=d,
            PI=partition,
            BITS=bits,
            BT=block_t,
            USE_ASM=use_asm(codes) and bits in (2, 4),
            **config.options(4, 3),
        )
    if top_k is None:
        return scores
    return scores, torch.topk(scores, top_k, dim=-1).indices


# ----------------------------------------------------------------------------- reference
def qk_score_ref(
    q: torch.Tensor,
    codes: torch.Tensor,
    k_min: torch.Tensor,
    k_scale: torch.Tensor,
    lens: torch.Tensor,
    partition: int = 64,
    bits: int = 4,
    sm_scale: float | None = None,
    dtype: torch.dtype = torch.float32,
) -> torch.Tensor:
    """q . dequantize_k_ref(k) * sm_scale (GQA by repeating KV heads), -inf past lens."""
    b, hq, d = q.shape
    hkv = codes.shape[1]
    sm_scale = 1.0 / math.sqrt(d) if sm_scale is None else sm_scale
    k = dequantize_k_ref(codes, k_min, k_scale, partition, bits).to(dtype).repeat_interleave(hq // hkv, dim=1)
    s = torch.einsum("bhd,bhld->bhl", q.to(dtype), k) * sm_scale
    tok = torch.arange(codes.shape[2], device=q.device)
    return s.masked_fill(tok[None, None, :] >= lens.to(q.device).long()[:, None, None], float("-inf"))


def qk_score_work(key_elements: int, bits: int, partition: int, group: int, head_dim: int) -> tuple[float, float]:
    """(bytes, tensor-core FLOPs) of one launch; key_elements = sum_b ctx_b * H_kv * D."""
    return (key_elements * (bits / 8 + 4.0 / partition + 4.0 * group / head_dim), key_elements * 2.0 * group)
