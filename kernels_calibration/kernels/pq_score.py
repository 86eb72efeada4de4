"""PQCache decode scoring: approximate q.k for every context token from product-quantization codes.

Modelled (PQCache, arXiv 2407.12820, decode step): each layer's keys of one request and KV head are
split into M sub-spaces of DS = D / M channels and clustered with K-Means into C = 2^bits centroids
per sub-space; a token's key is stored as M codes (uint8, bits <= 8).  Per decode iteration and
query head h (GQA: the G = H_q / H_kv query heads of a KV head share its codes and centroids)

    LUT[h, s, c] = q_h[s*DS:(s+1)*DS] . centroid[s, c] / sqrt(D)        (M x C table per head)
    score[h, t]  = sum_s LUT[h, s, code[t, s]]                          (M gathers + adds per token)

which equals q_h . k_hat_t / sqrt(D) for the PQ reconstruction k_hat_t.  The top-k tokens of these
scores are the ones PQCache fetches; the wrapper can return them (torch.topk, not a Triton kernel).

Two launches: _pq_lut_kernel builds the tables into a small FP32 scratch (B, H_q, M, C) (it is
G * M * C * 4 bytes per (request, KV head): 16 KB at G = 8, M = 2, C = 256, so it stays in L1/L2
while the second kernel gathers from it), _pq_score_kernel streams the codes and gathers.  The
tables are rebuilt every iteration because q changes; their cost (G * D * C multiply-adds per
request and KV head) does not grow with the context.

Layouts (B batch, H_kv KV heads, L_max padded context, M sub-spaces, C = 2^bits):
  q          fp16  [B, H_q, D]
  centroids  fp16  [B, H_kv, M, C, DS]     per request (K-Means runs on each request's keys)
  codes      uint8 [B, H_kv, L_max, M]     one byte per code (bits <= 8), M bytes per token
  lens       int32 [B]                     tokens at or past lens[b] score -inf
  scores     fp32  [B, H_q, L_max]

Work per scored token and KV head (the profile's unit, key ``score.pq``), M sub-spaces, group G:
  bytes = M (codes) + 4 * G (FP32 scores written)             [LUT traffic is on-chip / L2]
  ops   = G * M gathers + G * M adds (FP32)
plus, per request and KV head (not per unit), the LUT: C * D * 2 bytes of centroids read,
G * M * C * 4 bytes of table written and re-read (from L2), G * D * C FP32 multiply-adds.
"""

from __future__ import annotations

import functools
import math

import torch
import triton
import triton.language as tl

from . import common  # noqa: F401  (patches the CPU interpreter's run-time loop bounds)
from .launch import ScoreConfig


@triton.jit
def _pq_lut_kernel(
    Q,
    CENT,
    LUT,
    sm_scale,
    G: tl.constexpr,
    G_PAD: tl.constexpr,
    M: tl.constexpr,
    C: tl.constexpr,
    DS: tl.constexpr,
    DS_PAD: tl.constexpr,
    BC: tl.constexpr,
):
    # one program per (request, KV head, sub-space): LUT[b, h*G + g, s, :] for the group's G heads
    bh = tl.program_id(0)
    s = tl.program_id(1)
    g = tl.arange(0, G_PAD)
    gmask = g < G
    j = tl.arange(0, DS_PAD)
    jmask = j < DS
    D: tl.constexpr = M * DS
    qrow = bh * G + g  # = b * H_q + h * G + g
    q = tl.load(Q + qrow[:, None] * D + s * DS + j[None, :], mask=gmask[:, None] & jmask[None, :], other=0.0).to(
        tl.float32
    )  # [G_PAD, DS_PAD]
    cbase = (bh * M + s).to(tl.int64) * C * DS
    lbase = qrow.to(tl.int64) * M * C + s * C  # [G_PAD]
    for c0 in range(0, C, BC):
        c = c0 + tl.arange(0, BC)
        cmask = c < C
        cent = tl.load(CENT + cbase + c[:, None] * DS + j[None, :], mask=cmask[:, None] & jmask[None, :], other=0.0).to(
            tl.float32
        )  # [BC, DS_PAD]
        lut = tl.sum(q[:, None, :] * cent[None, :, :], axis=2) * sm_scale  # [G_PAD, BC]
        tl.store(LUT + lbase[:, None] + c[None, :], lut, mask=gmask[:, None] & cmask[None, :])


@triton.jit
def _pq_score_kernel(
    CODES,
    LUT,
    LENS,
    OUT,
    HKV,
    LMAX,
    TPP,
    G: tl.constexpr,
    G_PAD: tl.constexpr,
    M: tl.constexpr,
    C: tl.constexpr,
    BT: tl.constexpr,
):
    # one program per (request, KV head, TPP-token slice of [0, L_max)); writes -inf past lens[b]
    bh = tl.program_id(0)
    start = tl.program_id(1) * TPP
    b = bh // HKV
    L = tl.load(LENS + b)
    g = tl.arange(0, G_PAD)
    gmask = g < G
    qrow = (bh * G + g).to(tl.int64)
    lrow = qrow[:, None] * (M * C)  # [G_PAD, 1]
    cbase = bh.to(tl.int64) * LMAX * M
    end = tl.minimum(start + TPP, LMAX)
    for t0 in range(start, end, BT):
        tok = t0 + tl.arange(0, BT)
        valid = tok < L
        acc = tl.zeros([G_PAD, BT], tl.float32)
        for s in tl.static_range(M):
            code = tl.load(CODES + cbase + tok * M + s, mask=valid, other=0).to(tl.int32)  # [BT]
            acc += tl.load(LUT + lrow + s * C + code[None, :], mask=gmask[:, None] & valid[None, :], other=0.0)
        acc = tl.where(valid[None, :], acc, float("-inf"))
        tl.store(OUT + qrow[:, None] * LMAX + tok[None, :], acc, mask=gmask[:, None] & (tok < end)[None, :])


@functools.cache
def _n_sm(device: torch.device) -> int:
    return torch.cuda.get_device_properties(device).multi_processor_count if device.type == "cuda" else 4


def tiles_per_program(n_rows: int, lmax: int, block_t: int, device: torch.device) -> int:
    """Tiles of block_t tokens per program: enough programs for ~8 per SM, at most 8 tiles each
    (there is no cross-tile reduction, so more programs cost only the per-program setup)."""
    n_tiles = triton.cdiv(lmax, block_t)
    return max(1, min(8, (n_rows * n_tiles) // (8 * _n_sm(device))))


def pq_score(
    q: torch.Tensor,
    centroids: torch.Tensor,
    codes: torch.Tensor,
    lens: torch.Tensor,
    sm_scale: float | None = None,
    top_k: int | None = None,
    config: ScoreConfig = ScoreConfig(),
):
    """PQ scores of every context token for every query head.

    q [B, H_q, D] fp16; centroids [B, H_kv, M, C, D/M] fp16; codes [B, H_kv, L_max, M] uint8 (< C);
    lens [B] int32.  Returns scores fp32 [B, H_q, L_max] = q . k_hat / sqrt(D) (sm_scale overrides
    1/sqrt(D)), -inf at t >= lens[b]; with top_k also the indices [B, H_q, top_k] (int64) of the
    top_k scores per query head from torch.topk (a separate torch kernel, not fused; when
    top_k > lens[b] some indices point at -inf positions).
    """
    b, hq, d = q.shape
    cb, hkv, m, c, ds = centroids.shape
    if codes.dim() != 4 or codes.shape[0] != b or codes.shape[1] != hkv or codes.shape[3] != m:
        raise ValueError(f"codes {tuple(codes.shape)} must be [B, H_kv, L_max, M] = [{b}, {hkv}, L_max, {m}]")
    if cb != b or m * ds != d or hq % hkv:
        raise ValueError(f"centroids {tuple(centroids.shape)} do not fit q {tuple(q.shape)}")
    if c > 256 or c & (c - 1):
        raise ValueError(f"centroids per sub-space must be a power of two <= 256 (uint8 codes), got {c}")
    if q.dtype != torch.float16 or centroids.dtype != torch.float16 or codes.dtype != torch.uint8:
        raise TypeError("q and centroids must be fp16, codes uint8")
    if lens.shape != (b,):
        raise ValueError("lens must be [B]")
    lmax = codes.shape[2]
    g = hq // hkv
    g_pad = triton.next_power_of_2(g)
    ds_pad = triton.next_power_of_2(ds)
    sm_scale = 1.0 / math.sqrt(d) if sm_scale is None else sm_scale
    q, centroids, codes = q.contiguous(), centroids.contiguous(), codes.contiguous()
    lens = lens.to(torch.int32)
    lut = torch.empty((b, hq, m, c), dtype=torch.float32, device=q.device)
    bc = max(1, min(c, 8192 // (g_pad * ds_pad)))
    _pq_lut_kernel[(b * hkv, m)](
        q, centroids, lut, sm_scale, G=g, G_PAD=g_pad, M=m, C=c, DS=ds, DS_PAD=ds_pad, BC=bc, num_warps=4
    )
    scores = torch.empty((b, hq, lmax), dtype=torch.float32, device=q.device)
    if lmax:
        block_t = config.block_t or 128
        tpp = (config.tiles or tiles_per_program(b * hkv, lmax, block_t, q.device)) * block_t
        _pq_score_kernel[(b * hkv, triton.cdiv(lmax, tpp))](
            codes, lut, lens, scores, hkv, lmax, tpp, G=g, G_PAD=g_pad, M=m, C=c, BT=block_t, **config.options(4, 3)
        )
    if top_k is None:
        return scores
    return scores, torch.topk(scores, top_k, dim=-1).indices


# ----------------------------------------------------------------------------- reference
def pq_reconstruct_ref(centroids: torch.Tensor, codes: torch.Tensor) -> torch.Tensor:
    """k_hat [B, H_kv, L_max, D] (fp32) from centroids [B, H_kv, M, C, DS] and codes [B, H_kv, L, M]."""
    b, hkv, m, c, ds = centroids.shape
    idx = codes.long().permute(0, 1, 3, 2)  # [B, H_kv, M, L]
    k = torch.gather(centroids.float(), 3, idx[..., None].expand(-1, -1, -1, -1, ds))  # [B, H_kv, M, L, DS]
    return k.permute(0, 1, 3, 2, 4).reshape(b, hkv, codes.shape[2], m * ds)


def pq_score_ref(
    q: torch.Tensor,
    centroids: torch.Tensor,
    codes: torch.Tensor,
    lens: torch.Tensor,
    sm_scale: float | None = None,
    dtype: torch.dtype = torch.float32,
) -> torch.Tensor:
    """q . k_hat * sm_scale over the PQ reconstruction (GQA by repeating KV heads), -inf past lens."""
    b, hq, d = q.shape
    hkv = centroids.shape[1]
    sm_scale = 1.0 / math.sqrt(d) if sm_scale is None else sm_scale
    k = pq_reconstruct_ref(centroids, codes).to(dtype).repeat_interleave(hq // hkv, dim=1)  # [B, H_q, L, D]
    s = torch.einsum("bhd,bhld->bhl", q.to(dtype), k) * sm_scale
    tok = torch.arange(codes.shape[2], device=q.device)
    return s.masked_fill(tok[None, None, :] >= lens.to(q.device).long()[:, None, None], float("-inf"))


def pq_score_work(scored_tokens: int, kv_heads: int, subspaces: int, group: int) -> tuple[float, float]:
    """(bytes, ops) of one launch: scored_tokens = sum_b ctx_b; see the module docstring."""
    units = scored_tokens * kv_heads
    return units * (subspaces + 4.0 * group), units * 2.0 * group * subspaces
