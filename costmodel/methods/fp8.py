"""FP8 (e4m3) KV: 1 byte per element and one per-tensor scale (negligible).

Prefill casts its KV to FP8 (an elementwise, memory-bound pass); decode attends over FP8 with the
profile's ``decode_attn.fp8`` kernel (hardware conversion on GPUs with FP8 support, a software
conversion before Ada/Hopper: costmodel/roofline.py).
"""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field

from .base import KVMethod


class FP8(KVMethod):
    """FP8 (e4m3) KV: 1 byte per element, one per-tensor scale (negligible); cast after prefill."""

    name: Literal["fp8"] = Field("fp8", description="FP8 e4m3 KV")

    display_label: ClassVar[str] = "FP8"
    colour: ClassVar[str] = "#0ea5e9"
    kernel_keys: ClassVar[tuple[str, ...]] = ("prefill_attn.fp16", "decode_attn.fp8")
    encode: ClassVar[str | None] = "cast"

    @property
    def decode_attention(self) -> str:
        return "fp8"

    def wire_bytes_per_element(self) -> float:
        return 1.0

    def memory_bytes_per_element(self) -> float:
        return 1.0
