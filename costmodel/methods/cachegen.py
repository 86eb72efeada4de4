"""CacheGen: b-bit quantized KV, arithmetic-coded on the wire (arXiv 2310.07240).

Prefill quantizes and entropy-encodes its KV; the decode side decodes it on arrival.
`decode_mode: decompress_once` restores FP16 on arrival (FP16 memory and attention);
`dequantize_per_iteration` keeps the b-bit codes in memory and dequantizes every iteration. The
coded size is `entropy_ratio` of the raw codes, by default the entropy of Gaussian b-bit codes
(`gaussian_code_entropy_bits`): a derivation, not a fit.
"""

from __future__ import annotations

import math
from functools import cache
from statistics import NormalDist
from typing import ClassVar, Literal

from pydantic import Field

from ..calibration import CalibrationProfile, KernelFit
from ..specs import FP16_BYTES
from .base import DEQUANTIZE_ROLE, FP16_META_BYTES, KVMethod, code_bytes, dequantize_role_fits


@cache
def gaussian_code_entropy_bits(bits: int, partition: int) -> float:
    """Entropy (bits/symbol) of b-bit min/max codes of a Gaussian partition of `partition` values.

    The partition's range is set by its expected extreme (Blom's approximation to the expected
    maximum of n normals); codes are nearest-rounded onto 2**bits evenly spaced levels. This is the
    best an ideal arithmetic coder does on such codes, and the wire-size assumption for CacheGen
    when its `entropy_ratio` is not given (real KV is heavier-tailed; delta coding across tokens
    could do better): a derivation, not a fit.
    """
    nd = NormalDist()
    m = nd.inv_cdf((partition - 0.375) / (partition + 0.25))
    levels = 2**bits
    step = 2 * m / (levels - 1)
    edges = [-math.inf] + [-m + (k + 0.5) * step for k in range(levels - 1)] + [math.inf]
    probs = [nd.cdf(b) - nd.cdf(a) for a, b in zip(edges[:-1], edges[1:])]
    return -sum(p * math.log2(p) for p in probs if p > 0)


class CacheGen(KVMethod):
    """CacheGen: b-bit quantized, entropy-coded KV on the wire; FP16 or codes in decode memory (module doc)."""

    name: Literal["cachegen"] = Field("cachegen", description="quantized, entropy-coded KV on the wire")
    bits: Literal[2, 3, 4] = Field(2, description="code width")
    partition: int = Field(64, ge=16, le=4096, description="elements per min/scale group")
    decode_mode: Literal["decompress_once", "dequantize_per_iteration"] = Field(
        "decompress_once", description="restore FP16 on arrival, or keep codes and dequantize every iteration"
    )
    dequant_kernel: Literal["unfused", "fused"] = Field(
        "unfused",
        description="with dequantize_per_iteration: unfused (to FP16 memory, then attend) or fused (in registers)",
    )
    entropy_ratio: float | None = Field(
        None, gt=0, le=1, description="coded bits / raw code bits; null: derived from the entropy of Gaussian codes"
    )

    # As deployed: LMCache decodes CacheGen's bitstream with the public CUDA kernel, measured on the H200
    # (catalog/data/implementations.yaml). `implementation: null` prices the coder from an instruction count
    # instead, a lower bound 14x faster than that kernel.
    implementation: str | None = Field(
        "cachegen_reference_decoder",
        description="a shipped implementation profile (catalog/data/implementations.yaml) whose kernel costs "
        "replace the calibration profile's, repriced for each pool's GPU; default: CacheGen's public GPU "
        "decoder as measured; null: the arithmetic coder priced from an instruction count (a lower bound)",
    )

    display_label: ClassVar[str] = "CacheGen"
    colour: ClassVar[str] = "#f59e0b"
    kernel_keys: ClassVar[tuple[str, ...]] = (
        "prefill_attn.fp16",
        "quantize.kv",
        "dequantize.kv",
        "decode_attn.fp16",
        "decode_attn.dequant_unfused",
        "decode_attn.dequant_fused",
    )
    encode: ClassVar[str | None] = "quantize"
    entropy_coded: ClassVar[bool] = True
    # The arithmetic coder's costs, where a scenario or an implementation profile gives them (profile keys
    # entropy_encode.kv / entropy_decode.kv; the decoder's by default, above); else priced from an instruction count
    # at the CUDA-core rate (costmodel/phases.py, ENTROPY_CODING_INSTR_PER_ELEMENT) (the encoder, unless `kernels:` prices it).
    kernel_roles: ClassVar[dict[str, str]] = {
        "dequantize": DEQUANTIZE_ROLE + " (decompress_once: the on-arrival dequantize.kv)",
        "entropy_decode": "arithmetic decoding on arrival, unit: K and V elements (symbols) decoded",
        "entropy_encode": "arithmetic encoding after prefill, unit: K and V elements (symbols) encoded",
    }

    def role_fits(self, profile: CalibrationProfile, role: str, fit: KernelFit) -> dict[str, KernelFit]:
        if role == "dequantize":
            if self.dequantize_on_arrival:
                return {"dequantize.kv": fit}
            return dequantize_role_fits(profile, self.decode_attention, fit)
        return {f"{role}.kv": fit}

    @property
    def coded_ratio(self) -> float:
        if self.entropy_ratio is not None:
            return self.entropy_ratio
        return gaussian_code_entropy_bits(self.bits, self.partition) / self.bits

    @property
    def decode_attention(self) -> str:
        return "fp16" if self.decode_mode == "decompress_once" else f"dequant_{self.dequant_kernel}"

    @property
    def dequantize_on_arrival(self) -> bool:
        return self.decode_mode == "decompress_once"

    def _quantized_bytes_per_element(self) -> float:
        return code_bytes(self.bits) + FP16_META_BYTES / self.partition

    def wire_bytes_per_element(self) -> float:
        return code_bytes(self.bits) * self.coded_ratio + FP16_META_BYTES / self.partition

    def memory_bytes_per_element(self) -> float:
        if self.decode_mode == "decompress_once":
            return FP16_BYTES
        return self._quantized_bytes_per_element()
