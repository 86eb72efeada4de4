"""HACK decode attention (the family's entry point): one new token per request over a ragged 2-bit
quantized KV cache, computed homomorphically (HACK, arXiv 2502.03589): 8-bit Q and P meet the 2-bit
codes in INT8 tensor-core products, and per-partition correction terms with the stored code sums (SE)
and the FP16 V tail (RQE) give the attention without dequantizing the cache.

    out = hack_attn_decode(q, cache, use_se=True, max_len=None, config=HackDecodeConfig())
    out, cache = decode_step(q, cache, k_new, v_new, ...)      # append, then attend
    ref = hack_attn_decode_ref(q, cache)                         # float64, what HACK computes

Three kernels compute it; dispatch.hack_kernel chooses (config.kernel pins one):
  gluon_decode._hack_mma_kernel   one warp per program, tokens on the product's M (Hopper, PI 64, GQA 8);
  hack_decode_rp._rp_decode_kernel the head group's copies fill the 16-row dots' padding rows (Triton);
  head_major._quant_decode_kernel  the general Triton kernel (any head_dim multiple of 128, any GQA).
They agree with hack_attn_decode_ref within its own error against exact attention over the cache;
the Gluon and row-packed kernels round Q per query head (hack_attn_decode_ref(..., q_per_head=True)).

Work of one decode step (attn_decode.decode_flops): flops = 4 * G * sum(lens) * H_kv * D;
bytes = cache.nbytes_visited() + Q and O.
"""

from __future__ import annotations

import math
from dataclasses import replace

import torch

from . import dispatch
from .attn_decode import attn_decode_ref
from .gluon_decode import hack_attn_decode_gluon
from .hack_decode_rp import hack_attn_decode_rp, hack_decode_step
from .head_major import quant_attn_decode_hm
from .kv_cache import QuantKVCache, append_token, dequantize_cache_ref
from .launch import HackDecodeConfig

__all__ = ["HackDecodeConfig", "attn_decode_ref", "decode_step", "hack_attn_decode", "hack_attn_decode_ref"]

# The fused step's warps when the config gives none: at 1K, 2 warps take 16.3 us, 4 take 17.7.
FUSED_STEP_WARPS = 2


def hack_attn_decode(
    q: torch.Tensor,
    cache: QuantKVCache,
    use_se: bool = True,
    max_len: int | None = None,
    config: HackDecodeConfig = HackDecodeConfig(),
) -> torch.Tensor:
    """q [B, HQ, D] fp16 (the new token's query, already appended to the cache) -> [B, HQ, D] fp16.
    use_se: read the stored code sums (summation elimination), else the kernel sums the codes.
    max_len: an upper bound of lens (defaults to the capacity) that sizes the splits."""
    kernel = dispatch.hack_kernel(q, cache, max_len, config)
    if kernel == "gluon":
        return hack_attn_decode_gluon(q, cache, use_se=use_se, max_len=max_len, config=config)
    if kernel == "row_packed":
        return hack_attn_decode_rp(q, cache, use_se=use_se, max_len=max_len, config=config)
    return quant_attn_decode_hm(q, cache, mode="hack", use_se=use_se, max_len=max_len, config=config)


def decode_step(
    q: torch.Tensor,
    cache: QuantKVCache,
    k_new: torch.Tensor,
    v_new: torch.Tensor,
    use_se: bool = True,
    stochastic: bool = True,
    seed: int = 0,
    max_len: int | None = None,
    config: HackDecodeConfig = HackDecodeConfig(),
) -> tuple[torch.Tensor, QuantKVCache]:
    """One HACK decode step: append (k_new, v_new [B, H_kv, D]) to the cache, then attend with q.
    dispatch.fused_step decides whether the append runs inside the row-packed attention launch
    (hack_decode_rp.hack_decode_step) or as append_token before hack_attn_decode.  max_len: an upper
    bound of the lengths after the append.  Returns (output [B, H_q, D], the cache with lens + 1)."""
    if dispatch.fused_step(q, cache, max_len, config):
        if config.num_warps is None:
            config = replace(config, num_warps=FUSED_STEP_WARPS)
        return hack_decode_step(
            q, cache, k_new, v_new, stochastic=stochastic, seed=seed, use_se=use_se, max_len=max_len, config=config
        )
    c = append_token(cache, k_new, v_new, stochastic=stochastic, seed=seed)
    return hack_attn_decode(q, c, use_se=use_se, max_len=max_len, config=config), c


def hack_attn_decode_ref(q: torch.Tensor, cache: QuantKVCache, q_per_head: bool = False) -> torch.Tensor:
    """What HACK computes, in float64: Q rounded to 8 bits per partition (per query head with
    q_per_head, as the row-packed kernel does), the cache's K and V (dequantized; FP16 tail where
    RQE), P rounded to multiples of 1/255 of the row max."""
    k, v = dequantize_cache_ref(cache)
    pi = q.shape[-1] if q_per_head else cache.partition
    qf = q.double().cpu()
    qp = qf.reshape(*qf.shape[:-1], -1, pi)
    mn, mx = qp.amin(-1, keepdim=True), qp.amax(-1, keepdim=True)
    s = (mx - mn) / 255
    code = torch.where(s > 0, torch.floor((qp - mn) / torch.where(s > 0, s, 1) + 0.5), 0 * qp).clamp(0, 255)
    qd = (code * s + mn).reshape(qf.shape)
    b, hq, d = q.shape
    hkv = k.shape[1]
    out = torch.empty((b, hq, d), dtype=torch.float64)
    lens = cache.lens.cpu()
    for i in range(b):
        n = int(lens[i])
        kk = k[i, :, :n].double().repeat_interleave(hq // hkv, 0)
        vv = v[i, :, :n].double().repeat_interleave(hq // hkv, 0)
        sc = torch.einsum("hd,hnd->hn", qd[i], kk) / math.sqrt(d)
        p = torch.exp(sc - sc.amax(-1, keepdim=True))
        p = torch.floor(p * 255 + 0.5) / 255
        out[i] = torch.einsum("hn,hnd->hd", p, vv) / p.sum(-1, keepdim=True)
    return out
