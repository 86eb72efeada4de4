"""FP4 KV (NVFP4-style e2m1 with an FP8 scale per 16 elements): 0.5 + 1/16 = 0.5625 bytes per element.

Native on GPUs with FP4 tensor cores (Blackwell): decode reads the codes and converts them in
hardware. Elsewhere `emulate: true` prices software dequantization in registers (unpack, convert,
scale, like the fused 2-bit path) as `dequantize`; `emulate: false` refuses such a GPU.
"""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field

from ..roofline import DEQUANT_INSTR_PER_ELEMENT, FP8_CONVERT_INSTR_PER_ELEMENT
from .base import DecodeEnv, KVMethod


class FP4(KVMethod):
    """FP4 KV, native on FP4 tensor cores, else emulated or refused (module doc)."""

    name: Literal["fp4"] = Field("fp4", description="FP4 (e2m1, FP8 scale per 16) KV")
    emulate: bool = Field(
        True, description="on GPUs without FP4 tensor cores, price software dequantization (false: refuse such GPUs)"
    )

    display_label: ClassVar[str] = "FP4"
    colour: ClassVar[str] = "#14b8a6"
    encode: ClassVar[str | None] = "cast"

    def wire_bytes_per_element(self) -> float:
        return 0.5 + 1.0 / 16

    memory_bytes_per_element = wire_bytes_per_element

    def check_decode_gpu(self, gpu) -> str | None:
        if gpu.fp4_tensor_tflops is None and not self.emulate:
            return (
                f"fp4 needs FP4 tensor cores (Blackwell); {gpu.key} has none: set emulate: true to price "
                f"software dequantization"
            )
        return None

    def decode_layer_terms(self, env: DecodeEnv) -> tuple[dict[str, float], dict[str, float]]:
        u = env.kv_units_per_token
        read = self.memory_bytes_per_element() / env.memory_bytes_per_s
        native = max(read, FP8_CONVERT_INSTR_PER_ELEMENT / env.alu_instr_per_s)
        if env.has_fp4:
            return {}, {"decode": native * u}
        emulated = max(read, DEQUANT_INSTR_PER_ELEMENT / env.alu_instr_per_s)
        return {}, {"decode": native * u, "dequantize": (emulated - native) * u}
