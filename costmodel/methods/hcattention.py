"""HCAttention (Neurocomputing 2026, as described in hack_method.md): quantized keys on the GPU, values offloaded.

Keys are quantized (`key_bits`, one FP16 min and scale per `partition`) and kept on the GPU to
score every token; values live in decode host memory, a `gpu_kv_budget` fraction of them (the most
important) also on the GPU. Each iteration needs the values of `fetch_fraction` of the tokens;
`value_hit_rate` of those are already on the GPU, the rest cross PCIe. The prefill side quantizes
the keys, so the wire carries quantized K and FP16 V.
"""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field

from ..specs import FP16_BYTES, ModelSpec
from .base import FP16_META_BYTES, DecodeEnv, KVMethod, code_bytes, fit_or


class HCAttention(KVMethod):
    """HCAttention: quantized keys on the GPU score every token; values offloaded, partly cached (module doc)."""

    name: Literal["hcattention"] = Field("hcattention", description="quantized keys on GPU, values in host memory")
    key_bits: Literal[2, 4, 8] = Field(4, description="key code width")
    partition: int = Field(64, ge=16, le=4096, description="key elements per min/scale group")
    gpu_kv_budget: float = Field(0.25, gt=0, le=1, description="fraction of values also kept on the GPU")
    fetch_fraction: float = Field(0.1, gt=0, le=1, description="fraction of tokens whose values each iteration needs")
    value_hit_rate: float = Field(0.8, ge=0, le=1, description="fraction of needed values already on the GPU")

    display_label: ClassVar[str] = "HCAttention"
    colour: ClassVar[str] = "#2563eb"
    kernel_keys: ClassVar[tuple[str, ...]] = ("prefill_attn.fp16", "quantize.kv", "decode_attn.fp16")
    optional_kernel_keys: ClassVar[tuple[str, ...]] = ("score.quantized_keys",)
    encode: ClassVar[str | None] = "quantize_keys"

    def _key_bytes_per_element(self) -> float:
        return code_bytes(self.key_bits) + FP16_META_BYTES / self.partition

    def wire_bytes_per_element(self) -> float:
        return (self._key_bytes_per_element() + FP16_BYTES) / 2

    def memory_bytes_per_element(self) -> float:
        return (self._key_bytes_per_element() + self.gpu_kv_budget * FP16_BYTES) / 2

    def host_bytes_per_token(self, model: ModelSpec) -> float:
        return FP16_BYTES * model.kv_elements_per_token_per_layer * model.layers / 2

    def decode_layer_terms(self, env: DecodeEnv) -> tuple[dict[str, float], dict[str, float]]:
        prof, u = env.profile, env.kv_units_per_token
        group = 2 * env.q_heads_per_gpu * env.model.head_dim / u
        # Quantized-key scoring (kernels_calibration/kernels/qk_score.py), per key element: its code and
        # share of min/scale, FP32 scores per query head; unpack + convert + scale on CUDA cores.
        key_bytes = self._key_bytes_per_element() + 4 * group / env.model.head_dim
        score = (u / 2) * fit_or(
            prof, "score.quantized_keys", max(key_bytes / env.memory_bytes_per_s, 3.5 / env.alu_instr_per_s)
        )
        pv = prof.kernel("decode_attn.fp16").s_per_unit * u / 2 * self.fetch_fraction
        fetch = self.fetch_fraction * (1 - self.value_hit_rate) * (u / 2) * FP16_BYTES / env.pcie_bytes_per_s
        return {}, {"decode": pv + fetch, "approximation": score, "fetch": fetch}
