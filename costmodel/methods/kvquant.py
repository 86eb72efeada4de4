"""KVQuant-style low-bit KV: per-channel K, per-token V, and a fraction of dense-and-sparse FP16 outliers.

Attention runs in FP16, so every decode iteration dequantizes the whole stored KV: unfused (to
FP16 memory, then attend: what HACK compared against) or fused in registers. Source: the KVQuant
paper (arXiv 2401.18079): 1 % outliers stored as FP16 value + index (CSR), one FP16 scale and zero
point per 128-element vector.  `v_block_tokens` describes a variant that quantizes V per channel in blocks of
tokens and keeps the open, not yet full block in FP16 (KIVI's full-precision residual of recent tokens, arXiv
2402.02750; realrun's KVQuant-style format, realrun/kvformats.py, with HACK's Π = 64 blocks): the prompt's last
partial block crosses the wire in FP16 and decode memory reserves one FP16 block per request.
"""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field

from ..calibration import CalibrationProfile, KernelFit
from ..specs import ModelSpec
from .base import DEQUANTIZE_ROLE, KVMethod, code_bytes, dequantize_role_fits, open_v_block_excess_bytes

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
    v_block_tokens: int = Field(
        0,
        ge=0,
        le=256,
        description="V quantized per channel in blocks of this many tokens, the open (not yet full) block kept in "
        "FP16: on the wire (the prompt's last partial block) and in decode memory (one block reserved per "
        "request); 0: every V token quantized as it comes (KVQuant's per-token V)",
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

    def memory_reserve_bytes_per_request(self, model: ModelSpec) -> float:
        return open_v_block_excess_bytes(model, self.v_block_tokens, self.wire_bytes_per_element())

    def wire_partial_block_bytes(self, model: ModelSpec, prompt_tokens: int) -> float:
        if not self.v_block_tokens:
            return 0.0
        return open_v_block_excess_bytes(model, prompt_tokens % self.v_block_tokens, self.wire_bytes_per_element())
