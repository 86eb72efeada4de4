"""KV-cache methods: one frozen object per method describing its KV format and which kernels it runs.

A method answers, for a model: how many bytes one token's KV takes on the wire and in decode
memory (codes, FP16 mins and scales, stored sums, outliers, the FP16 V tail), which attention
kernel prefill and decode run (a key into the calibration profile), what it does after prefill
(quantize, entropy-encode) and on arrival (entropy-decode, dequantize once), and how many extra
ALU operations the homomorphic correction costs. `phases.py` turns that into seconds; adding a
method means adding one class here.

Sources: `../shared/docs/hack_method.md` (HACK's format, SE/RQE, correction-cost formulas); the
KVQuant paper (arXiv 2401.18079: 1% dense-and-sparse outliers stored as FP16 value + index);
CacheGen (arXiv 2310.07240: quantize, then arithmetic-code the symbols for the wire); PQCache
(arXiv 2407.12820) and HCAttention (Neurocomputing 2026) as described in hack_method.md.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache
from typing import ClassVar
from statistics import NormalDist

from .specs import FP16_BYTES, ModelSpec

FP16_META_BYTES = 2 * FP16_BYTES       # one min and one scale per partition, FP16 each
KVQUANT_OUTLIER_BYTES = 6.0            # FP16 value + 32-bit column index (CSR), per outlier
KVQUANT_META_BYTES_PER_VECTOR = 4.0    # FP16 scale + zero point per token (V) or channel (K)


def code_bytes(bits: int) -> float:
    return bits / 8.0


def sum_bytes(bits: int, partition: int) -> int:
    """Bytes of one stored code sum: bits + ceil(log2 partition) bits, in uint8 or int16."""
    return 1 if bits + math.ceil(math.log2(partition)) <= 8 else 2


@lru_cache(maxsize=None)
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


def _fit_or(profile, key: str, roofline_s_per_unit: float) -> float:
    """A kernel's measured seconds per unit where the profile has it, else the roofline estimate."""
    fit = profile.kernels.get(key)
    return roofline_s_per_unit if fit is None else fit.s_per_unit


@dataclass(frozen=True)
class DecodeEnv:
    """What a method needs to price one decode layer on one GPU of a replica."""

    profile: object                 # CalibrationProfile
    model: ModelSpec
    kv_units_per_token: int         # K and V elements per context token on this GPU (profile units)
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


def gluon_decode_applies(model: ModelSpec, bits: int = 2) -> bool:
    """Whether the Gluon decode kernels take this model's attention shape (the method's own
    partition checks aside)."""
    return (bits == 2 and model.head_dim == GLUON_DECODE_HEAD_DIM
            and model.heads == GLUON_DECODE_GROUP * model.kv_heads)


def decode_fit(profile, key: str, model: ModelSpec | None, gluon_ok: bool = True):
    """The profile's decode_attn.<key> fit, or its Triton twin (<key>_triton) where the profile has one
    and the Gluon kernel does not run for this model (gluon_ok False, or the shape it does not take)."""
    twin = profile.kernels.get(f"decode_attn.{key}_triton")
    if twin is not None and model is not None and not (gluon_ok and gluon_decode_applies(model)):
        return twin
    return profile.kernel(f"decode_attn.{key}")


@dataclass(frozen=True)
class KVMethod:
    """Base: uncompressed FP16 KV (the vLLM-style disaggregated baseline)."""

    name: str = "baseline"

    # Work after prefill on the prefill GPU: None, "quantize" (profile kernel quantize.kv: b-bit
    # codes, metadata, sums) or "cast" (an elementwise FP16 -> FP8 pass, memory-bound).
    encode: ClassVar[str | None] = None
    entropy_coded: ClassVar[bool] = False

    @property
    def prefill_attention(self) -> str:
        """Profile kernel key under prefill_attn.*."""
        return "fp16"

    @property
    def decode_attention(self) -> str:
        """Profile kernel key under decode_attn.*."""
        return "fp16"

    @property
    def dequantize_on_arrival(self) -> bool:
        """Decoded (entropy decode + dequantize to FP16) once when the KV reaches the decode GPU."""
        return False

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

    def host_bytes_per_token(self, model: ModelSpec) -> float:
        """Decode-side host (CPU) memory one token's KV occupies, for methods that offload."""
        return 0.0

    def check_decode_gpu(self, gpu) -> str | None:
        """Why this method cannot run on the decode GPU, or None."""
        return None

    def decode_kernel(self, profile, model: ModelSpec | None = None):
        """The profile's fit for this method's decode attention kernel (for `model`'s shape: decode_fit)."""
        return decode_fit(profile, self.decode_attention, model)

    @property
    def decode_kernel_includes_append(self) -> bool:
        """The quantized decode kernels were profiled with the new token's append (quantize K, write the
        V tail) in the timed step; FP16/FP8 attention was timed without the KV write."""
        return self.decode_attention.startswith(("hack", "dequant"))

    def decode_layer_terms(self, env: "DecodeEnv") -> tuple[dict[str, float], dict[str, float]]:
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
        return ({"approximation": env.q_heads_per_gpu * fixed_ops / env.alu_instr_per_s},
                {"decode": attn_per_ctx - dequant - approx, "dequantize": dequant, "approximation": approx})

    # Homomorphic correction: extra ALU ops per query head per decode iteration: fixed + per ctx token.
    def approximation_ops(self, model: ModelSpec) -> tuple[float, float]:
        return (0.0, 0.0)

    def prefill_approximation_ops_per_pair(self) -> float:
        """Extra ALU ops per (query, key) pair per head in prefill attention (homomorphic correction)."""
        return 0.0

    @property
    def per_iteration_dequant(self) -> bool:
        return self.decode_attention.startswith("dequant")


@dataclass(frozen=True)
class FP8(KVMethod):
    """FP8 (e4m3) KV: 1 byte per element, one per-tensor scale (negligible); cast after prefill."""

    name: str = "fp8"
    encode: ClassVar[str | None] = "cast"

    @property
    def decode_attention(self) -> str:
        return "fp8"

    def wire_bytes_per_element(self) -> float:
        return 1.0

    def memory_bytes_per_element(self) -> float:
        return 1.0


@dataclass(frozen=True)
class KVQuant(KVMethod):
    """KVQuant-style 2-bit KV (per-channel K, per-token V) with a fraction of FP16 outliers;
    attention runs in FP16, so every decode iteration dequantizes the whole stored KV."""

    name: str = "kvquant"
    bits: int = 2
    outlier_fraction: float = 0.01
    dequant_kernel: str = "unfused"
    encode: ClassVar[str | None] = "quantize"

    @property
    def decode_attention(self) -> str:
        return f"dequant_{self.dequant_kernel}"

    def wire_bytes_per_element(self) -> float:
        return (
            code_bytes(self.bits)
            + self.outlier_fraction * KVQUANT_OUTLIER_BYTES
            + KVQUANT_META_BYTES_PER_VECTOR / 128.0   # one scale+zero per 128-element vector
        )

    memory_bytes_per_element = wire_bytes_per_element


@dataclass(frozen=True)
class CacheGen(KVMethod):
    """CacheGen: b-bit quantized KV, arithmetic-coded on the wire (encode after prefill, decode on
    arrival). decode_mode='decompress_once' restores FP16 on arrival (FP16 memory and attention);
    'dequantize_per_iteration' keeps b-bit codes in memory and dequantizes every iteration."""

    name: str = "cachegen"
    bits: int = 2
    partition: int = 64
    decode_mode: str = "decompress_once"
    dequant_kernel: str = "unfused"
    entropy_ratio: float | None = None    # coded bits / raw code bits; None: Gaussian-entropy derivation
    encode: ClassVar[str | None] = "quantize"
    entropy_coded: ClassVar[bool] = True

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


@dataclass(frozen=True)
class HACK(KVMethod):
    """HACK: 2-bit asymmetric partitioned KV, attention computed homomorphically on INT8 codes.

    SE stores each partition's code sum (b + ceil(log2 Π) bits); RQE keeps the last, partly
    filled V block (< Π tokens) in FP16 and reserves room for it per request."""

    name: str = "hack"
    bits: int = 2
    partition: int = 64
    stochastic_rounding: bool = True
    summation_elimination: bool = True
    requantization_elimination: bool = True
    encode: ClassVar[str | None] = "quantize"

    @property
    def prefill_attention(self) -> str:
        return "hack"

    @property
    def decode_attention(self) -> str:
        if not self.summation_elimination:
            return "hack_no_se"
        if not self.requantization_elimination:
            return "hack_no_rqe"
        return "hack"

    def decode_kernel(self, profile, model: ModelSpec | None = None):
        """A partition-specific fit (`decode_attn.hack_pi128`) where the profile measured one, else Π=64's
        (the Gluon kernel's at PI 64 where it runs, else the row-packed Triton kernel's: decode_fit)."""
        if self.partition != 64 and self.summation_elimination and self.requantization_elimination:
            fit = profile.kernels.get(f"decode_attn.hack_pi{self.partition}")
            if fit is not None:
                return fit
        return decode_fit(profile, self.decode_attention, model, gluon_ok=self.partition == 64 and self.bits == 2)

    def _bytes_per_element(self) -> float:
        sums = sum_bytes(self.bits, self.partition) if self.summation_elimination else 0
        return code_bytes(self.bits) + (FP16_META_BYTES + sums) / self.partition

    wire_bytes_per_element = _bytes_per_element
    memory_bytes_per_element = _bytes_per_element

    def memory_reserve_bytes_per_request(self, model: ModelSpec) -> float:
        if not self.requantization_elimination:
            return 0.0
        # Up to Π V tokens per layer held in FP16 instead of codes.
        v_elements = self.partition * model.kv_dim * model.layers
        return v_elements * (FP16_BYTES - self._bytes_per_element())

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


@dataclass(frozen=True)
class FP4(KVMethod):
    """FP4 (NVFP4-style e2m1 with an FP8 scale per 16 elements) KV: 0.5625 bytes per element.

    Native on GPUs with FP4 tensor cores (Blackwell). Elsewhere `emulate=True` prices software
    dequantization in registers (unpack + convert + scale, like the fused 2-bit path) as
    `dequantize`; `emulate=False` refuses such a GPU."""

    name: str = "fp4"
    emulate: bool = True
    encode: ClassVar[str | None] = "cast"

    def wire_bytes_per_element(self) -> float:
        return 0.5 + 1.0 / 16

    memory_bytes_per_element = wire_bytes_per_element

    def check_decode_gpu(self, gpu) -> str | None:
        if gpu.fp4_tensor_tflops is None and not self.emulate:
            return (f"fp4 needs FP4 tensor cores (Blackwell); {gpu.key} has none: set emulate: true to price "
                    f"software dequantization")
        return None

    def decode_layer_terms(self, env: DecodeEnv) -> tuple[dict[str, float], dict[str, float]]:
        from .roofline import DEQUANT_INSTR_PER_ELEMENT, FP8_CONVERT_INSTR_PER_ELEMENT
        u = env.kv_units_per_token
        read = self.memory_bytes_per_element() / env.memory_bytes_per_s
        native = max(read, FP8_CONVERT_INSTR_PER_ELEMENT / env.alu_instr_per_s)
        if env.has_fp4:
            return {}, {"decode": native * u}
        emulated = max(read, DEQUANT_INSTR_PER_ELEMENT / env.alu_instr_per_s)
        return {}, {"decode": native * u, "dequantize": (emulated - native) * u}


@dataclass(frozen=True)
class PQCache(KVMethod):
    """PQCache: full FP16 KV in decode host memory; keys product-quantized (m sub-spaces, 2^b
    centroids each, K-Means on the prefill host's CPUs, overlapped with GPU prefill up to an
    iteration cap). Each decode iteration scores all tokens from the codes on the GPU, fetches
    the top-k tokens' K and V over PCIe through a GPU block cache (`cache_hit_rate`), and attends
    over them plus the initial and recent ("local") tokens kept on the GPU.

    The wire carries the FP16 KV (the decode side needs all of it in host memory), the codes and
    the centroids: PQCache saves decode GPU memory, not transfer bytes."""

    name: str = "pqcache"
    subspaces: int = 2
    bits: int = 8
    top_k_fraction: float = 0.2
    local_tokens: int = 256
    cache_tokens: int = 2048
    cache_hit_rate: float = 0.5
    kmeans_max_iterations: int = 100
    encode: ClassVar[str | None] = "pq"

    def code_bytes_per_token(self, model: ModelSpec) -> float:
        return model.layers * model.kv_heads * self.subspaces * self.bits / 8

    def wire_bytes_per_token(self, model: ModelSpec) -> float:
        return FP16_BYTES * model.kv_elements_per_token_per_layer * model.layers + self.code_bytes_per_token(model)

    def wire_fixed_bytes(self, model: ModelSpec) -> float:
        # Centroids: per layer and KV head, 2^b centroids of d_h/m dims in each of m sub-spaces.
        return model.layers * model.kv_heads * 2**self.bits * model.head_dim * FP16_BYTES

    def memory_bytes_per_token(self, model: ModelSpec) -> float:
        return self.code_bytes_per_token(model)

    def memory_reserve_bytes_per_request(self, model: ModelSpec) -> float:
        fp16_token = FP16_BYTES * model.kv_elements_per_token_per_layer * model.layers
        return (self.local_tokens + self.cache_tokens) * fp16_token + self.wire_fixed_bytes(model)

    def host_bytes_per_token(self, model: ModelSpec) -> float:
        return FP16_BYTES * model.kv_elements_per_token_per_layer * model.layers

    def kmeans_flops_per_token_iteration(self, model: ModelSpec) -> float:
        """One K-Means iteration: every key against every centroid of its sub-space (2 FLOPs/MAC)."""
        return 2.0 * model.layers * model.kv_heads * 2**self.bits * model.head_dim

    def decode_layer_terms(self, env: DecodeEnv) -> tuple[dict[str, float], dict[str, float]]:
        prof, u = env.profile, env.kv_units_per_token
        kv_heads = u / (2 * env.model.head_dim)
        group = env.q_heads_per_gpu / kv_heads
        fp16 = prof.kernel("decode_attn.fp16").s_per_unit
        # Scoring (kernels_calibration/kernels/pq_score.py), per token and KV head: read m b-bit codes and
        # write FP32 scores for each query head; G·m table gathers and adds. Then top-k over the scores
        # (read them, write k indices). Measured fits replace these where the profile has them.
        score_unit = _fit_or(prof, "score.pq", max((self.subspaces * self.bits / 8 + 4 * group) / env.memory_bytes_per_s,
                                                    2 * group * self.subspaces / env.alu_instr_per_s))
        topk_unit = _fit_or(prof, "select.topk", (4 + 12 * self.top_k_fraction) / env.memory_bytes_per_s)
        score = kv_heads * score_unit + env.q_heads_per_gpu * topk_unit
        fetch = self.top_k_fraction * (1 - self.cache_hit_rate) * u * FP16_BYTES / env.pcie_bytes_per_s
        return ({"decode": fp16 * u * self.local_tokens},
                {"decode": fp16 * u * self.top_k_fraction + fetch, "approximation": score, "fetch": fetch})


@dataclass(frozen=True)
class HCAttention(KVMethod):
    """HCAttention: keys quantized (key_bits, one min/scale per `partition`) and kept on the GPU to
    score every token; values in decode host memory, a `gpu_kv_budget` fraction of them (the most
    important) also on the GPU. Each iteration the values of `fetch_fraction` of the tokens are
    needed; `value_hit_rate` of those are already on the GPU, the rest cross PCIe.

    The prefill side quantizes the keys, so the wire carries quantized K and FP16 V."""

    name: str = "hcattention"
    key_bits: int = 4
    partition: int = 64
    gpu_kv_budget: float = 0.25
    fetch_fraction: float = 0.1
    value_hit_rate: float = 0.8
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
        score = (u / 2) * _fit_or(prof, "score.quantized_keys", max(key_bytes / env.memory_bytes_per_s,
                                                                    3.5 / env.alu_instr_per_s))
        pv = prof.kernel("decode_attn.fp16").s_per_unit * u / 2 * self.fetch_fraction
        fetch = self.fetch_fraction * (1 - self.value_hit_rate) * (u / 2) * FP16_BYTES / env.pcie_bytes_per_s
        return {}, {"decode": pv + fetch, "approximation": score, "fetch": fetch}


def make_method(name: str, **params) -> KVMethod:
    """Build a method object from its scenario name and parameters."""
    classes = {"baseline": KVMethod, "fp8": FP8, "fp4": FP4, "kvquant": KVQuant, "cachegen": CacheGen, "hack": HACK,
               "pqcache": PQCache, "hcattention": HCAttention}
    if name == "hack_no_se":
        params.setdefault("summation_elimination", False)
        return HACK(name=params.pop("label", name), **params)
    if name == "hack_no_rqe":
        params.setdefault("requantization_elimination", False)
        return HACK(name=params.pop("label", name), **params)
    cls = classes[name]
    return cls(name=params.pop("label", name), **params)
