"""Baseline: uncompressed FP16 KV, moved and attended as is (the vLLM-style disaggregated baseline).

The format and costs are `KVMethod`'s defaults: 2 bytes per K or V element on the wire and in
decode memory, FP16 prefill and decode attention kernels, no work after prefill.
"""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field

from .base import KVMethod


class Baseline(KVMethod):
    """Uncompressed FP16 KV."""

    name: Literal["baseline"] = Field(default="baseline", description="uncompressed FP16 KV")

    display_label: ClassVar[str] = "Baseline (FP16)"
    colour: ClassVar[str] = "#6b7280"
