"""What every KV method is: the base model, the decode-pricing context and the shared format arithmetic.

`KVMethod` is a frozen, strict pydantic model: its fields are the method's scenario parameters
(with description, default and bounds), its ClassVars the registry metadata (display label,
report colour, profile kernel keys, post-prefill work), and its methods the KV format and the
per-phase costs that `costmodel/phases.py` turns into seconds. The defaults here are uncompressed
FP16 KV; each method module overrides what its format changes. pydantic validates, it does no
I/O: like the rest of `costmodel/`, nothing here touches SimPy, random numbers, files or YAML.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import ClassVar

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, model_validator

from ..calibration import CalibrationProfile, KernelFit
from ..specs import FP16_BYTES, ModelSpec

FP16_META_BYTES = 2 * FP16_BYTES  # one min and one scale per partition, FP16 each

# The forms prefill attention can take and the profile kernel that prices each: FlashAttention in FP16
# (every method; a quantizing method quantizes its KV after it), or the homomorphic kernel on INT8 codes.
PREFILL_KERNELS = {"fp16": "prefill_attn.fp16", "homomorphic": "prefill_attn.hack"}
PREFILL_FORM_CODES = {form: i for i, form in enumerate(PREFILL_KERNELS)}  # a form's index (prefill_form_codes)


def code_bytes(bits: int) -> float:
    return bits / 8.0


def sum_bytes(bits: int, partition: int) -> int:
    """Bytes of one stored code sum: bits + ceil(log2 partition) bits, in uint8 or int16."""
    return 1 if bits + math.ceil(math.log2(partition)) <= 8 else 2


def open_v_block_excess_bytes(model: ModelSpec, tokens: int, bytes_per_element: float) -> float:
    """FP16 bytes beyond `bytes_per_element` of `tokens` V tokens held in FP16, every layer: the open (not yet
    full) block of a format that quantizes V per channel in blocks of tokens."""
    return tokens * model.kv_dim * model.layers * (FP16_BYTES - bytes_per_element)


def fit_or(profile: CalibrationProfile, key: str, roofline_s_per_unit: float) -> float:
    """A kernel's measured seconds per unit where the profile has it, else the roofline estimate."""
    fit = profile.kernels.get(key)
    return roofline_s_per_unit if fit is None else fit.s_per_unit


@dataclass(frozen=True)
class DecodeEnv:
    """What a method needs to price one decode layer on one GPU of a replica."""

    profile: CalibrationProfile
    model: ModelSpec
    kv_units_per_token: int  # K and V elements per context token on this GPU (profile units)
    q_heads_per_gpu: float
    alu_instr_per_s: float
    pcie_bytes_per_s: float
    memory_bytes_per_s: float
    has_fp4: bool


# The Gluon decode kernels (kernels_calibration/kernels/gluon_decode.py: gluon_supported and
# hack_supported_gluon) take 2-bit codes, GQA group 8 and head_dim 128 only; a profile measured where
# they run (Hopper) prices them under decode_attn.<variant> and keeps the Triton twin that runs
# everywhere else as decode_attn.<variant>_triton.
GLUON_DECODE_GROUP = 8
GLUON_DECODE_HEAD_DIM = 128


DEQUANTIZE_ROLE = (
    "per-iteration dequantization to FP16 before FP16 attention, unit: K and V elements visited; "
    "its cost is added to the profile's FP16 decode attention"
)


def dequantize_role_fits(profile: CalibrationProfile, decode_key: str, fit: KernelFit) -> dict[str, KernelFit]:
    """The `dequantize` role: the method's decode kernel becomes FP16 attention plus this dequantization."""
    fp16 = profile.kernel("decode_attn.fp16")
    return {f"decode_attn.{decode_key}": KernelFit(fp16.overhead_s + fit.overhead_s, fp16.s_per_unit + fit.s_per_unit)}


def gluon_decode_applies(model: ModelSpec, bits: int = 2) -> bool:
    """Whether the Gluon decode kernels take this model's attention shape (the method's own
    partition checks aside)."""
    return bits == 2 and model.head_dim == GLUON_DECODE_HEAD_DIM and model.heads == GLUON_DECODE_GROUP * model.kv_heads


def decode_fit(profile: CalibrationProfile, key: str, model: ModelSpec | None, gluon_ok: bool = True) -> KernelFit:
    """The profile's decode_attn.<key> fit, measured at GQA group 8: the fit at the model's own group
    (<key>_gqa<g>) where the profile has one, else the Triton twin (<key>_triton) where the profile has
    one and the Gluon kernel does not run for this model (gluon_ok False, or the shape it does not take)."""
    if model is not None and model.heads != GLUON_DECODE_GROUP * model.kv_heads:
        own = profile.kernels.get(f"decode_attn.{key}_gqa{model.heads // model.kv_heads}")
        if own is not None:
            return own
    twin = profile.kernels.get(f"decode_attn.{key}_triton")
    if twin is not None and model is not None and not (gluon_ok and gluon_decode_applies(model)):
        return twin
    return profile.kernel(f"decode_attn.{key}")


class KernelCost(BaseModel):
    """One kernel's cost as a scenario writes it: time_s = overhead_s + s_per_unit × units (the units of its
    profile key, costmodel/calibration.py, or of the method's kernel role)."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, allow_inf_nan=False)

    overhead_s: float = Field(ge=0, le=3600, description="seconds per launch (one layer on one GPU)")
    s_per_unit: float = Field(ge=0, le=3600, description="seconds per unit of work")

    def fit(self) -> KernelFit:
        return KernelFit(overhead_s=self.overhead_s, s_per_unit=self.s_per_unit)


def _name_required(schema: dict, cls: type) -> None:
    """In the scenario schema a method entry must say which method it is: `name` is required there
    (its default only lets code write `HACK()`)."""
    schema.get("properties", {}).get("name", {}).pop("default", None)
    schema["required"] = ["name"] + [r for r in schema.get("required", []) if r != "name"]


class KVMethod(BaseModel):
    """The base of every method: uncompressed FP16 KV priced with the FP16 kernels.

    A subclass narrows `name` to its `Literal` (the scenario's discriminator), adds its
    parameters as fields and overrides the format and cost methods its KV changes.
    """

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, json_schema_extra=_name_required)

    label: str | None = Field(default=None, description="name in outputs (default: the method name)")
    name: str = Field(description="the method")
    implementation: str | None = Field(
        default=None,
        description="a shipped implementation profile "
        "(catalog/data/implementations.yaml) whose kernel costs replace the "
        "calibration profile's for this method, repriced for each pool's GPU",
    )
    kernels: dict[str, KernelCost] | None = Field(
        default=None,
        description="kernel costs that replace the calibration "
        "profile's (and the implementation's) for this method: a profile "
        "kernel key the method prices with, or one of its kernel roles",
    )

    # ---- registry metadata ------------------------------------------------------------------
    display_label: ClassVar[str]  # how reports name the method
    colour: ClassVar[str]  # its colour in every figure
    # Profile kernels its costs read with profile.kernel(key): a roofline profile has every one.
    kernel_keys: ClassVar[tuple[str, ...]] = ("prefill_attn.fp16", "decode_attn.fp16")
    # Measured fits that replace a roofline estimate when a profile has them (fit_or).
    optional_kernel_keys: ClassVar[tuple[str, ...]] = ()
    # Work after prefill on the prefill GPU: None, "quantize" (profile kernel quantize.kv: b-bit
    # codes, metadata, sums), "quantize_keys" (K only), "cast" (an elementwise FP16 -> FP8/FP4
    # pass, memory-bound) or "pq" (K-Means on the prefill hosts' CPUs).
    encode: ClassVar[str | None] = None
    entropy_coded: ClassVar[bool] = False
    # Kernel roles a scenario may price (`kernels:`, an implementation profile) beside the profile keys:
    # role -> what it is, its unit, and how it enters the profile (`role_fits`).
    kernel_roles: ClassVar[dict[str, str]] = {}

    @model_validator(mode="after")
    def _known_kernels(self) -> KVMethod:
        for key in self.kernels or {}:
            why = self.kernel_refusal(key)
            if why:
                raise ValueError(f"kernels.{key}: {why}")
        return self

    def kernel_refusal(self, key: str) -> str | None:
        """Why this method cannot take a cost for `key` (None: it can)."""
        keys = self.kernel_keys + self.optional_kernel_keys
        if key in keys or key in self.kernel_roles:
            return None
        return f"{self.name} prices no kernel {key!r}; it takes " + ", ".join(
            sorted(set(keys) | set(self.kernel_roles))
        )

    def role_fits(self, profile: CalibrationProfile, role: str, fit: KernelFit) -> dict[str, KernelFit]:
        """The profile entries a kernel role's cost becomes (a method with roles overrides this)."""
        return {role: fit}

    def priced_profile(self, profile: CalibrationProfile, costs: dict[str, KernelFit]) -> CalibrationProfile:
        """`profile` with `costs` (profile keys or this method's roles) in place of its own fits: the profile
        this method is priced with.  A decode key replaced here also drops its per-shape fits (<key>_triton,
        <key>_gqa<g>) so the given cost holds for every model shape."""
        if not costs:
            return profile
        kernels = dict(profile.kernels)

        def put(k: str, f: KernelFit) -> None:
            for shaped in [x for x in kernels if x.startswith((k + "_triton", k + "_gqa"))]:
                del kernels[shaped]
            kernels[k] = f

        for key, fit in costs.items():  # profile keys first: a role builds on them
            if key not in self.kernel_roles:
                put(key, fit)
        for key, fit in costs.items():
            if key in self.kernel_roles:
                for k, f in self.role_fits(replace(profile, kernels=dict(kernels)), key, fit).items():
                    put(k, f)
        return replace(
            profile,
            kernels=kernels,
            provenance={
                **profile.provenance,
                "kernel_overrides": {k: [f.overhead_s, f.s_per_unit] for k, f in costs.items()},
            },
        )

    @property
    def output_name(self) -> str:
        """The method's name in every output: its label, else its name."""
        return self.label or self.name

    # ---- kernels ----------------------------------------------------------------------------
    def prefill_form(self, profile: CalibrationProfile, attn_flops: float) -> str:
        """Which prefill attention runs for one prompt of `attn_flops` causal attention FLOPs (one launch
        per layer on one GPU): a key of PREFILL_KERNELS."""
        return "fp16"

    def prefill_form_codes(self, profile: CalibrationProfile, attn_flops: np.ndarray) -> np.ndarray:
        """`prefill_form` of many prompts at once (a numpy array of their attention FLOPs), each form as its
        index in PREFILL_KERNELS: the same choice from the same doubles (ReplicaCostModel prices a block of
        prompt lengths with it). A class that overrides `prefill_form` overrides this beside it; where it does
        not, the cost model prices each length by `prefill_form` (`has_bulk_prefill_form`)."""
        return np.full(len(attn_flops), PREFILL_FORM_CODES["fp16"], dtype=np.int64)

    def has_bulk_prefill_form(self) -> bool:
        """Whether `prefill_form_codes` is the bulk twin of this class's `prefill_form`: the class that defines
        the one first (in method resolution order) defines the other."""
        for cls in type(self).__mro__:
            if "prefill_form" in cls.__dict__:
                return "prefill_form_codes" in cls.__dict__
        return False

    @property
    def decode_attention(self) -> str:
        """Profile kernel key under decode_attn.*."""
        return "fp16"

    @property
    def dequantize_on_arrival(self) -> bool:
        """Decoded (entropy decode + dequantize to FP16) once when the KV reaches the decode GPU."""
        return False

    def decode_kernel(self, profile: CalibrationProfile, model: ModelSpec | None = None) -> KernelFit:
        """The profile's fit for this method's decode attention kernel (for `model`'s shape: decode_fit)."""
        return decode_fit(profile, self.decode_attention, model)

    @property
    def decode_kernel_includes_append(self) -> bool:
        """The quantized decode kernels were profiled with the new token's append (quantize K, write the
        V tail) in the timed step; FP16/FP8 attention was timed without the KV write."""
        return self.decode_attention.startswith(("hack", "dequant"))

    @property
    def per_iteration_dequant(self) -> bool:
        return self.decode_attention.startswith("dequant")

    # ---- KV format --------------------------------------------------------------------------
    def wire_bytes_per_element(self) -> float:
        return FP16_BYTES

    def memory_bytes_per_element(self) -> float:
        return FP16_BYTES

    def wire_bytes_per_token(self, model: ModelSpec) -> float:
        """KV bytes one prompt token sends prefill -> decode, all layers, K and V."""
        return self.wire_bytes_per_element() * model.kv_elements_per_token_per_layer * model.layers

    def memory_bytes_per_token(self, model: ModelSpec) -> float:
        return self.memory_bytes_per_element() * model.kv_elements_per_token_per_layer * model.layers

    def memory_reserve_bytes_per_request(self, model: ModelSpec) -> float:
        """Fixed per-request decode GPU memory beyond the per-token format (e.g. an FP16 tail block)."""
        return 0.0

    def wire_fixed_bytes(self, model: ModelSpec) -> float:
        """Bytes sent once per request besides the per-token KV (e.g. PQ centroids)."""
        return 0.0

    def wire_partial_block_bytes(self, model: ModelSpec, prompt_tokens: int) -> float:
        """Bytes a prompt of `prompt_tokens` sends beyond its tokens' format because its last, partly filled
        block of V goes in FP16 (a method that quantizes V in blocks of tokens and keeps the open one in FP16)."""
        return 0.0

    def wire_bytes(self, model: ModelSpec, prompt_tokens: int) -> float:
        """Bytes one prompt's KV sends prefill -> decode: its tokens in the wire format, the open V block's FP16
        excess, and the fixed part."""
        return (
            prompt_tokens * self.wire_bytes_per_token(model)
            + self.wire_partial_block_bytes(model, prompt_tokens)
            + self.wire_fixed_bytes(model)
        )

    def host_bytes_per_token(self, model: ModelSpec) -> float:
        """Decode-side host (CPU) memory one token's KV occupies, for methods that offload."""
        return 0.0

    def kmeans_flops_per_token_iteration(self, model: ModelSpec) -> float:
        """FLOPs of one K-Means iteration per key token, for a method that clusters keys on the prefill
        hosts' CPUs (encode "pq")."""
        raise NotImplementedError(f"{self.output_name} does not cluster keys")

    def kmeans_iteration_cap(self) -> int:
        """The most K-Means iterations a prefill batch runs (encode "pq")."""
        raise NotImplementedError(f"{self.output_name} does not cluster keys")

    def check_decode_gpu(self, gpu) -> str | None:
        """Why this method cannot run on the decode GPU, or None."""
        return None

    # ---- costs ------------------------------------------------------------------------------
    def decode_layer_terms(self, env: DecodeEnv) -> tuple[dict[str, float], dict[str, float]]:
        """Seconds of one decode layer on one GPU, split into breakdown parts, as
        (per request in the batch, per context token). Parts: decode, dequantize, approximation,
        and fetch (host -> GPU over PCIe; reported as a sub-part of decode)."""
        prof, u = env.profile, env.kv_units_per_token
        attn_per_ctx = self.decode_kernel(prof, env.model).s_per_unit * u
        dequant = 0.0
        if self.per_iteration_dequant:
            dequant = max(0.0, attn_per_ctx - prof.kernel("decode_attn.fp16").s_per_unit * u)
        fixed_ops, per_ctx_ops = self.approximation_ops(env.model)
        approx = min(attn_per_ctx - dequant, env.q_heads_per_gpu * per_ctx_ops / env.alu_instr_per_s)
        return (
            {"approximation": env.q_heads_per_gpu * fixed_ops / env.alu_instr_per_s},
            {"decode": attn_per_ctx - dequant - approx, "dequantize": dequant, "approximation": approx},
        )

    def decode_layer_fixed_s(self, env: DecodeEnv) -> dict[str, float]:
        """Seconds of one decode layer on one GPU per iteration, whatever the batch (extra launches), by
        breakdown part."""
        return {}

    def approximation_ops(self, model: ModelSpec) -> tuple[float, float]:
        """Homomorphic correction: extra ALU ops per query head per decode iteration, (fixed, per ctx token)."""
        return (0.0, 0.0)

    def prefill_approximation_ops_per_pair(self) -> float:
        """Extra ALU ops per (query, key) pair per head in the homomorphic prefill form (its correction)."""
        return 0.0
