"""Split-K decode (flash-decoding): the partial-output buffers, the launch of a split kernel, and the
kernel that merges the splits.

A decode kernel's grid is (B * H_kv, splits): each program attends over one slice of the context and
writes its normalized partial output O / l [rows, D] and log2-sum-exp lse; combine_splits_kernel
merges them per query row, out = sum_s 2^(lse_s - max) O_s / sum_s 2^(lse_s - max).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import torch
import triton
import triton.language as tl

if TYPE_CHECKING:
    from .kv_cache import QuantKVCache
    from .launch import DecodeConfig

LOG2E = 1.4426950408889634  # the kernels take exp2: scores scaled by log2(e)


@triton.jit
def combine_splits_kernel(OP, LSEP, OUT, NSPLIT, D: tl.constexpr, S_PAD: tl.constexpr):
    # OP [R, NSPLIT, D] fp32 normalized partial outputs, LSEP [R, NSPLIT] log2-sum-exp; OUT [R, D]
    r = tl.program_id(0).to(tl.int64)
    s = tl.arange(0, S_PAD)
    smask = s < NSPLIT
    lse = tl.load(LSEP + r * NSPLIT + s, mask=smask, other=float("-inf"))
    mx = tl.max(lse, 0)
    mx = tl.where(mx == float("-inf"), 0.0, mx)
    w = tl.where(smask, tl.exp2(lse - mx), 0.0)
    d = tl.arange(0, D)
    o = tl.load(OP + (r * NSPLIT + s)[:, None] * D + d[None, :], mask=smask[:, None], other=0.0)
    out = tl.sum(w[:, None] * o, 0) / tl.maximum(tl.sum(w, 0), 1e-30)
    tl.store(OUT + r * D + d, out.to(OUT.dtype.element_ty))


_N_SM: dict[int, int] = {}


def default_splits(batch: int, kv_heads: int, max_len: int, block: int, device: torch.device) -> int:
    """~16 programs per SM (the best measured split count of the Triton decode kernels at 32K on the
    H200), but at least 2 tiles of `block` tokens per split, and at most 64 splits (beyond, the
    combine costs more than it saves)."""
    if device.type == "cuda":
        idx = device.index or 0
        if idx not in _N_SM:
            _N_SM[idx] = torch.cuda.get_device_properties(idx).multi_processor_count
        n_sm = _N_SM[idx]
    else:
        n_sm = 4
    want = min(triton.cdiv(16 * n_sm, batch * kv_heads), 64)
    return max(1, min(want, triton.cdiv(max_len, 2 * block)))


def tokens_per_split(max_len: int, splits: int, block: int) -> tuple[int, int]:
    """(tokens per split, a whole number of `block`-token tiles; the splits that cover max_len)."""
    tps = triton.cdiv(triton.cdiv(max_len, splits), block) * block
    return tps, triton.cdiv(max_len, tps)


def run_split_decode(kernel_launch, q: torch.Tensor, splits: int) -> torch.Tensor:
    """Allocate the partials, launch (kernel_launch(op, lsep)), combine.  q [B, HQ, D] -> [B, HQ, D]."""
    b, hq, d = q.shape
    op = torch.empty((b * hq, splits, d), dtype=torch.float32, device=q.device)
    lsep = torch.empty((b * hq, splits), dtype=torch.float32, device=q.device)
    kernel_launch(op, lsep)
    out = torch.empty((b, hq, d), dtype=q.dtype, device=q.device)
    combine_splits_kernel[(b * hq,)](op, lsep, out, splits, D=d, S_PAD=triton.next_power_of_2(splits), num_warps=4)
    return out


def run_quant_split_decode(
    kernel,
    q: torch.Tensor,
    cache: QuantKVCache,
    max_len: int,
    block: int,
    config: DecodeConfig,
    *extra,
    partials_per_row: int = 1,
    **meta,
) -> torch.Tensor:
    """A split-K decode kernel over a quantized cache, launched and combined: q [B, HQ, D] -> [B, HQ, D].

    The kernel's grid is (B * H_kv, splits) of `block`-token tiles sized for max_len (config.splits, else
    default_splits); its arguments are q, the cache's K and V codes, minima, scales and sums, the V tail
    and lens, the partials (op, lsep), the log2-scaled 1/sqrt(D), H_kv, the capacity, V's metadata blocks,
    tokens per split and splits, then `extra` and the constexprs `meta`.  partials_per_row: partials each split
    writes per query row (row-packed kernels)."""
    b, hkv, lmax, d = cache.shape
    tps, splits = tokens_per_split(max_len, config.splits or default_splits(b, hkv, max_len, block, q.device), block)
    qk_scale = 1.0 / math.sqrt(d) * LOG2E
    q = q.contiguous()

    def launch(op, lsep):
        kernel[(b * hkv, splits)](
            q,
            cache.k_codes,
            cache.k_min,
            cache.k_scale,
            cache.k_sum,
            cache.v_codes,
            cache.v_min,
            cache.v_scale,
            cache.v_sum,
            cache.v_tail,
            cache.lens,
            op,
            lsep,
            qk_scale,
            hkv,
            lmax,
            cache.v_min.shape[2],
            tps,
            splits,
            *extra,
            **meta,
        )

    return run_split_decode(launch, q, splits * partials_per_row)
