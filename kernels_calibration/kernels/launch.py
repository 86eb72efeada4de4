"""Launch configurations of the kernel families: what a caller may choose about how a kernel runs,
never what it computes.  A field left at None takes the family's measured default (the kernel
module that owns the default says where it was measured: DESIGN.md).

Every family takes one of these instead of loose keywords; the tuning lists of bench.py and
profile.py are dicts of these fields (`HackDecodeConfig(**cfg)`), so a CSV row's `config` column
names exactly the fields that were set.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal


@dataclass(frozen=True)
class LaunchConfig:
    """Triton/Gluon launch options shared by every family.  num_warps, num_stages: Triton's (a
    compiled variant per value); maxnreg: a register cap per thread (more programs per SM, ptxas
    spills beyond it); 0 means no cap where the family's default has one."""

    num_warps: int | None = None
    num_stages: int | None = None
    maxnreg: int | None = None

    def options(self, num_warps: int, num_stages: int, maxnreg: int | None = None) -> dict:
        """Launch keywords: this config's fields over the family defaults given (maxnreg 0 or None: no cap)."""
        cap = maxnreg if self.maxnreg is None else self.maxnreg
        return {
            "num_warps": self.num_warps or num_warps,
            "num_stages": self.num_stages or num_stages,
            **({"maxnreg": cap} if cap else {}),
        }


@dataclass(frozen=True)
class DecodeConfig(LaunchConfig):
    """Split-K decode attention (flash-decoding): splits = programs per (request, KV head) over the
    context (None: split_k.default_splits, or the Gluon kernels' one-wave count)."""

    splits: int | None = None


@dataclass(frozen=True)
class FpDecodeConfig(DecodeConfig):
    """FP16 / FP8 decode attention (attn_decode.py): block_n tokens per tile."""

    block_n: int = 64


@dataclass(frozen=True)
class HackDecodeConfig(DecodeConfig):
    """HACK decode attention (hack_attn_decode.py).  kernel: "auto" lets dispatch.py choose (the Gluon
    kernel on Hopper above FUSED_STEP_MAX_LEN tokens at PI 64 / GQA 8, else the row-packed Triton kernel
    where it takes the shape, else the head-major one); "gluon", "row_packed", "head_major" pin one.
    A num_warps (a Triton option) keeps "auto" on the Triton kernels.  fused (decode_step only): append
    the new token inside the row-packed attention launch; None: up to FUSED_STEP_MAX_LEN tokens."""

    kernel: Literal["auto", "gluon", "row_packed", "head_major"] = "auto"
    fused: bool | None = None


@dataclass(frozen=True)
class DequantDecodeConfig(DecodeConfig):
    """Dequantize-then-attend decode (dequant_attn_decode.py).  kernel: "auto" lets dispatch.py choose
    (the Gluon kernel on Hopper where it takes the shape and no Triton option is set, else the Triton
    kernel); "gluon", "triton" pin one; "unfused" writes the cache back to FP16 in device memory and
    runs the FP16 kernel on it (the HACK paper's baseline)."""

    kernel: Literal["auto", "gluon", "triton", "unfused"] = "auto"


@dataclass(frozen=True)
class PrefillConfig(LaunchConfig):
    """Causal prefill attention: block_m query rows per program (None: the kernel's default);
    block_n tokens per K/V tile of the FP16 kernel (the HACK kernel tiles by its partition)."""

    block_m: int | None = None
    block_n: int = 64


@dataclass(frozen=True)
class QuantizeConfig(LaunchConfig):
    """Quantize / dequantize: block_r K rows per program (quantize_k); block_t tokens per program of
    the dequantize-to-FP16 kernel."""

    block_r: int = 16
    block_t: int = 64


@dataclass(frozen=True)
class ScoreConfig(LaunchConfig):
    """Token scoring (pq_score.py, qk_score.py): block_t tokens per tile (None: 128 for PQ, 64 for
    quantized keys); tiles per program (None: enough programs for ~8 per SM, at most 8 tiles each)."""

    block_t: int | None = None
    tiles: int | None = None
