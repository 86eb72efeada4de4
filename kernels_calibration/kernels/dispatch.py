"""Which kernel runs a quantized decode step: the one place that decides, from the device, the shape
and the LaunchConfig.  The family entry points (hack_attn_decode.py, dequant_attn_decode.py) ask here
and launch what they are told; the kernel modules know only the shapes they take.

HACK decode (HackDecodeConfig.kernel "auto"):
  * the Gluon one-warp kernel (gluon_decode.py) on Hopper or newer, PI 64, 8 query heads per KV head,
    head_dim 128, above FUSED_STEP_MAX_LEN tokens, and no Triton option (num_warps) given: 83.5 us at
    32K / batch 8 on the H200 against the row-packed kernel's 137.8;
  * else the row-packed Triton kernel (hack_decode_rp.py) where it takes the shape (head_dim 128,
    PI 32/64/128, 4-16 query heads per KV head);
  * else the head-major Triton kernel (head_major.py).
  decode_step fuses the append into the row-packed launch up to FUSED_STEP_MAX_LEN tokens (one launch
  fewer: 16.3 vs 17.3 us at 1K); beyond, the appending split is the slowest program (45.2 vs 36.5 us
  at 4K), so the step appends separately.  At 2K the Gluon and fused row-packed steps are even.
Dequantize-then-attend (DequantDecodeConfig.kernel "auto"): the Gluon one-warp kernel on Hopper where
  it takes the shape (PI 64/128, GQA 8, head_dim 128) and no Triton option (num_warps, maxnreg) is
  given, else the head-major Triton kernel in its dequant mode.
"""

from __future__ import annotations

from typing import Literal

import torch

from .common import interpreting
from .gluon_decode import gluon_supported, hack_supported_gluon
from .hack_decode_rp import row_packed_supported
from .kv_cache import QuantKVCache
from .launch import DequantDecodeConfig, HackDecodeConfig

FUSED_STEP_MAX_LEN = 2048  # longest context (tokens after the append) of the fused decode step

_HOPPER: dict[int, bool] = {}


def gluon_device(q: torch.Tensor) -> bool:
    """The Gluon kernels run on q's device: a CUDA GPU of compute capability 9 or newer, not the
    interpreter.  Cached per device (it is on every decode call's host path)."""
    if not q.is_cuda or interpreting():
        return False
    idx = q.device.index if q.device.index is not None else torch.cuda.current_device()
    if idx not in _HOPPER:
        _HOPPER[idx] = torch.cuda.get_device_capability(idx)[0] >= 9
    return _HOPPER[idx]


def hack_kernel(
    q: torch.Tensor, cache: QuantKVCache, max_len: int | None, config: HackDecodeConfig
) -> Literal["gluon", "row_packed", "head_major"]:
    """The HACK decode kernel for q over cache (max_len: the longest context, default the capacity)."""
    if config.kernel != "auto":
        return config.kernel
    ml = cache.shape[2] if max_len is None else max_len
    if config.num_warps is None and ml > FUSED_STEP_MAX_LEN and gluon_device(q) and hack_supported_gluon(q, cache):
        return "gluon"
    return "row_packed" if row_packed_supported(q, cache) else "head_major"


def fused_step(q: torch.Tensor, cache: QuantKVCache, max_len: int | None, config: HackDecodeConfig) -> bool:
    """Whether decode_step appends inside the row-packed attention launch."""
    if config.fused is not None:
        return config.fused
    ml = cache.shape[2] if max_len is None else max_len
    return (
        ml <= FUSED_STEP_MAX_LEN
        and cache.rqe
        and config.kernel in ("auto", "row_packed")
        and row_packed_supported(q, cache)
    )


def dequant_kernel(
    q: torch.Tensor, cache: QuantKVCache, config: DequantDecodeConfig
) -> Literal["gluon", "triton", "unfused"]:
    """The dequantize-then-attend kernel for q over cache."""
    if config.kernel != "auto":
        return config.kernel
    if config.num_warps is None and config.maxnreg is None and gluon_device(q) and gluon_supported(q, cache):
        return "gluon"
    return "triton"
