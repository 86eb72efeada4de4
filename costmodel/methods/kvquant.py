"""KVQuant-style low-bit KV: per-channel K, per-token V, and a fraction of dense-and-sparse FP16 outliers.

Attention runs in FP16, so every decode iteration dequantizes the whole stored KV: unfused (to
FP16 memory, then attend: what HACK compared against) or fused in registers. Source: the KVQuant
paper (arXiv 2401.18079): 1 % outliers stored as FP16 value + index (CSR), one FP16 scale and zero
point per 128-element vector.
"""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field

from ..calibration import CalibrationProfile, KernelFit
from .base import DEQUANTIZE_ROLE, KVMethod, code_bytes, dequantize_role_fits

KVQUANT_OUTLIER_BYTES = 6.0  # FP16 value + 32-bit column index (CSR), per outlier
KVQUANT_META_BYTES_PER_VECTOR = 4.0  # FP16 scale + zero point per token (V) or channel (K)


class KVQuant(KVMethod):
    """KVQuant-style low-bit KV with FP16 outliers, dequantized every decode iteration (module doc)."""

    name: Literal["kvquant"] = Field("kvquant", description="2-bit KV with FP16 outliers; dequantize every iteration")
    bits: Literal[2, 3, 4] = Field(2, description="code width")
    outlier_fraction: float = Field(0.01, ge=0, lt=1, description="dense-and-sparse FP16 outliers")
    dequant_kernel: Literal["unfused", "fused"] = Field(
        "unfused",
        description="unfused: dequantize to FP16 memory then attend (what HACK compared); fused: in registers",
    )

    display_label: ClassVar[str] = "KVQuant"
    colour: ClassVar[str] = "#8b5cf6"
    kernel_keys: ClassVar[tuple[str, ...]] = (
        "prefill_attn.fp16",
        "quantize.kv",
        "decode_attn.fp16",
        "decode_attn.dequant_unfused",
        "decode_attn.dequant_fused",
    )
    encode: ClassVar[str | None] = "quantize"
    kernel_roles: ClassVar[dict[str, str]] = {"dequantize": DEQUANTIZE_ROLE}

    @property
    def decode_attention(self) -> str:
        return f"dequant_{self.dequant_kernel}"

    def role_fits(self, profile: CalibrationProfile, role: str, fit: KernelFit) -> dict[str, KernelFit]:
        return dequantize_role_fits(profile, self.decode_attention, fit)

    def wire_bytes_per_element(self) -> float:
        return (
            code_bytes(self.bits)
            + self.outlier_fraction * KVQUANT_OUTLIER_BYTES
            + KVQUANT_META_BYTES_PER_VECTOR / 128.0  # one scale+zero per 128-element vector
        )

    memory_bytes_per_element = wire_bytes_per_element
