"""HACK: 2-bit asymmetric partitioned KV, attention computed homomorphically on the codes.

Format (`../shared/docs/hack_method.md`): b-bit codes with one FP16 min and scale per partition of
Π elements; SE (summation elimination) also stores each partition's code sum in b + ⌈log₂Π⌉ bits
(uint8, or int16 when that exceeds 8); RQE (requantization elimination) keeps the last, partly
filled V block (< Π tokens) in FP16 and reserves room for it per request. Prefill and decode
attention run on INT8 dot products; the homomorphic correction is priced from its op count at the
CUDA-core rate and split out of the measured kernel time as `approximation`, never added on top.

Prefill attention (`prefill_attention`) runs either as FlashAttention in FP16 followed by the quantize
kernel, as HACK's public implementation does by default, or as the homomorphic kernel on the quantized
Q/K/V; `auto` takes, per prompt, whichever the pool's calibration profile prices faster (a deployment
uses the homomorphic form only where it wins). On a GPU without INT8 tensor cores the homomorphic
products run on the FP16 tensor cores, which is exact (costmodel/kernel_work.py says why).

The ablations are the same method with one elimination off: `hack_no_se` (sums recomputed every
iteration, + 2·d_h·L correction ops) and `hack_no_rqe` (no FP16 tail; the last block is
requantized).
"""

from __future__ import annotations

from typing import ClassVar, Literal

import numpy as np
from pydantic import Field, field_validator

from ..calibration import CalibrationProfile, KernelFit
from ..specs import ModelSpec
from .base import (
    FP16_META_BYTES,
    PREFILL_FORM_CODES,
    PREFILL_KERNELS,
    DecodeEnv,
    KVMethod,
    code_bytes,
    decode_fit,
    open_v_block_excess_bytes,
    sum_bytes,
)


class HACK(KVMethod):
    """HACK: partitioned low-bit KV, attention computed homomorphically on INT8 codes (module doc)."""

    name: Literal["hack"] = Field("hack", description="HACK homomorphic attention on 2-bit partitioned KV")
    bits: Literal[2, 4, 8] = Field(2, description="code width")
    partition: int = Field(
        64,
        ge=16,
        le=256,
        description="Π: elements per partition, a multiple of 16",
        json_schema_extra={"multipleOf": 16},
    )
    stochastic_rounding: bool = Field(True, description="stochastic (else nearest) rounding of the codes")
    summation_elimination: bool = Field(True, description="store code sums (SE)")
    requantization_elimination: bool = Field(True, description="keep the last V block in FP16 (RQE)")
    prefill_attention: Literal["fp16", "homomorphic", "auto"] = Field(
        "auto",
        description="prefill attention: fp16 (FlashAttention in FP16, then the quantize kernel), homomorphic "
        "(the homomorphic kernel on the quantized Q/K/V), auto (per prompt, whichever the calibration profile "
        "prices faster on the pool's GPU)",
    )

    display_label: ClassVar[str] = "HACK"
    colour: ClassVar[str] = "#dc2626"
    kernel_keys: ClassVar[tuple[str, ...]] = (
        "prefill_attn.fp16",
        "prefill_attn.hack",
        "quantize.kv",
        "decode_attn.hack",
        "decode_attn.hack_no_se",
        "decode_attn.hack_no_rqe",
    )
    encode: ClassVar[str | None] = "quantize"
    # Without RQE an implementation may requantize the open V block every token (the `requantize` role, profile
    # key requantize.v_block, unit: V elements of the open blocks, kv_heads x Π x head_dim per request per
    # layer): then the attention is the RQE kernel's and the requantization is priced apart; else the measured
    # no-RQE kernel prices both.
    kernel_roles: ClassVar[dict[str, str]] = {
        "requantize": "without RQE, requantizing the open V block at every token, unit: V elements of the open "
        "blocks (kv_heads x partition x head_dim per request per layer)"
    }

    def kernel_refusal(self, key: str) -> str | None:
        if key == "requantize" and self.requantization_elimination:
            return "requantizing the open V block applies without requantization elimination only"
        return super().kernel_refusal(key)

    def role_fits(self, profile: CalibrationProfile, role: str, fit: KernelFit) -> dict[str, KernelFit]:
        return {"requantize.v_block": fit}

    def _requantize_fit(self, profile: CalibrationProfile) -> KernelFit | None:
        return None if self.requantization_elimination else profile.kernels.get("requantize.v_block")

    @field_validator("partition")
    @classmethod
    def _multiple_of_16(cls, v: int) -> int:
        if v % 16:
            raise ValueError("partition must be a multiple of 16")
        return v

    def prefill_form(self, profile: CalibrationProfile, attn_flops: float) -> str:
        """The configured form, or under auto the one whose kernel the profile prices faster for this prompt.
        Both forms quantize the KV (quantize.kv): the homomorphic kernel reads the codes, the FP16 one is
        followed by the quantize kernel, so the attention kernels alone decide."""
        if self.prefill_attention != "auto":
            return self.prefill_attention
        fp16 = profile.kernel(PREFILL_KERNELS["fp16"]).time_s(attn_flops)
        hom = profile.kernel(PREFILL_KERNELS["homomorphic"]).time_s(attn_flops)
        return "homomorphic" if hom < fp16 else "fp16"

    def prefill_form_codes(self, profile: CalibrationProfile, attn_flops: np.ndarray) -> np.ndarray:
        """`prefill_form` over an array of prompts' attention FLOPs: the same kernel times (overhead plus rate
        times FLOPs, elementwise) and the same comparison."""
        if self.prefill_attention != "auto":
            return np.full(len(attn_flops), PREFILL_FORM_CODES[self.prefill_attention], dtype=np.int64)
        fp16 = profile.kernel(PREFILL_KERNELS["fp16"]).time_s(attn_flops)
        hom = profile.kernel(PREFILL_KERNELS["homomorphic"]).time_s(attn_flops)
        return np.where(hom < fp16, PREFILL_FORM_CODES["homomorphic"], PREFILL_FORM_CODES["fp16"])

    @property
    def decode_attention(self) -> str:
        if not self.summation_elimination:
            return "hack_no_se"
        if not self.requantization_elimination:
            return "hack_no_rqe"
        return "hack"

    def decode_kernel(self, profile: CalibrationProfile, model: ModelSpec | None = None) -> KernelFit:
        """A partition-specific fit (`decode_attn.hack_pi128`) where the profile measured one, else Π=64's
        (the Gluon kernel's at PI 64 where it runs, else the row-packed Triton kernel's: decode_fit).  Without
        RQE and with the open block's requantization priced apart (requantize.v_block), the RQE kernel's."""
        if self.partition != 64 and self.summation_elimination and self.requantization_elimination:
            fit = profile.kernels.get(f"decode_attn.hack_pi{self.partition}")
            if fit is not None:
                return fit
        key = self.decode_attention
        if self._requantize_fit(profile) is not None:
            key = "hack" if self.summation_elimination else "hack_no_se"
        return decode_fit(profile, key, model, gluon_ok=self.partition == 64 and self.bits == 2)

    def decode_layer_terms(self, env: DecodeEnv) -> tuple[dict[str, float], dict[str, float]]:
        per_req, per_ctx = super().decode_layer_terms(env)
        fit = self._requantize_fit(env.profile)
        if fit is not None:  # each request's open V block: kv_heads x Π x head_dim elements per layer
            v_elements = env.kv_units_per_token // 2 * self.partition
            per_req = {**per_req, "dequantize": per_req.get("dequantize", 0.0) + fit.s_per_unit * v_elements}
        return per_req, per_ctx

    def decode_layer_fixed_s(self, env: DecodeEnv) -> dict[str, float]:
        fit = self._requantize_fit(env.profile)
        return {} if fit is None else {"dequantize": fit.overhead_s}

    def _bytes_per_element(self) -> float:
        sums = sum_bytes(self.bits, self.partition) if self.summation_elimination else 0
        return code_bytes(self.bits) + (FP16_META_BYTES + sums) / self.partition

    wire_bytes_per_element = _bytes_per_element
    memory_bytes_per_element = _bytes_per_element

    def memory_reserve_bytes_per_request(self, model: ModelSpec) -> float:
        if not self.requantization_elimination:
            return 0.0
        # Up to Π V tokens per layer held in FP16 instead of codes.
        return open_v_block_excess_bytes(model, self.partition, self._bytes_per_element())

    def wire_partial_block_bytes(self, model: ModelSpec, prompt_tokens: int) -> float:
        """With RQE the prompt's last, partly filled V block (prompt mod Π tokens) is not quantized: it is the
        FP16 tail the decode side keeps extending (hack_method.md, RQE), so it crosses the wire in FP16."""
        if not self.requantization_elimination:
            return 0.0
        return open_v_block_excess_bytes(model, prompt_tokens % self.partition, self._bytes_per_element())

    def approximation_ops(self, model: ModelSpec) -> tuple[float, float]:
        """Decode correction ops per query head per iteration, split (fixed, per context token).

        With SE ≈ 10(d_h + L); without SE the sums are recomputed: + 2·d_h·L (hack_method.md)."""
        d = model.head_dim
        per_token = 10.0 + (0.0 if self.summation_elimination else 2.0 * d)
        return (10.0 * d, per_token)

    def prefill_approximation_ops_per_pair(self) -> float:
        # For an M×Z by Z×N product the correction is ≈ 9MN + MZ + NZ; Q·Kᵀ and P·V each
        # contribute ≈ 10 ops per (query, key) pair when L ≫ d_h.
        return 20.0


class HACKNoSE(HACK):
    """HACK without summation elimination: no stored sums, recomputed every iteration."""

    name: Literal["hack_no_se"] = Field("hack_no_se", description="HACK without SE (ablation)")
    summation_elimination: bool = Field(False, description="store code sums (SE)")

    display_label: ClassVar[str] = "HACK w/o SE"
    colour: ClassVar[str] = "#f87171"


class HACKNoRQE(HACK):
    """HACK without requantization elimination: no FP16 V tail, the last block is requantized."""

    name: Literal["hack_no_rqe"] = Field("hack_no_rqe", description="HACK without RQE (ablation)")
    requantization_elimination: bool = Field(False, description="keep the last V block in FP16 (RQE)")

    display_label: ClassVar[str] = "HACK w/o RQE"
    colour: ClassVar[str] = "#991b1b"
