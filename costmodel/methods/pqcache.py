"""PQCache (arXiv 2407.12820): FP16 KV offloaded to decode host memory, product-quantized keys to score it.

Keys are product-quantized (m sub-spaces, 2^b centroids each) by K-Means on the prefill hosts'
CPUs, overlapped with the GPU prefill up to an adaptive iteration cap. Each decode iteration
scores every token from the codes on the GPU, fetches the top-k tokens' K and V over PCIe through
a GPU block cache (`cache_hit_rate`), and attends over them plus the initial and recent ("local")
tokens kept on the GPU. The wire carries the FP16 KV (the decode side needs all of it in host
memory), the codes and the centroids: PQCache saves decode GPU memory, not transfer bytes.
"""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field

from ..specs import FP16_BYTES, ModelSpec
from .base import DecodeEnv, KVMethod, fit_or


class PQCache(KVMethod):
    """PQCache: FP16 KV in decode host memory, PQ-scored top-k tokens fetched over PCIe (module doc)."""

    name: Literal["pqcache"] = Field(
        "pqcache", description="KV in decode host memory, PQ-scored top-k fetched over PCIe"
    )
    subspaces: int = Field(2, ge=1, le=1024, description="m: PQ sub-spaces per key")
    bits: int = Field(8, ge=1, le=12, description="b: 2^b centroids per sub-space")
    top_k_fraction: float = Field(0.2, gt=0, le=1, description="fraction of context tokens attended each iteration")
    local_tokens: int = Field(256, ge=0, le=2**30, description="initial + recent tokens kept on the GPU")
    cache_tokens: int = Field(2048, ge=0, le=2**30, description="GPU block cache per request, in tokens")
    cache_hit_rate: float = Field(0.5, ge=0, le=1, description="fraction of top-k tokens found in the GPU cache")
    kmeans_max_iterations: int = Field(100, ge=1, le=10**4, description="upper bound of the adaptive K-Means cap T_max")

    display_label: ClassVar[str] = "PQCache"
    colour: ClassVar[str] = "#16a34a"
    optional_kernel_keys: ClassVar[tuple[str, ...]] = ("score.pq", "select.topk")
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

    def kmeans_iteration_cap(self) -> int:
        return self.kmeans_max_iterations

    def decode_layer_terms(self, env: DecodeEnv) -> tuple[dict[str, float], dict[str, float]]:
        prof, u = env.profile, env.kv_units_per_token
        kv_heads = u / (2 * env.model.head_dim)
        group = env.q_heads_per_gpu / kv_heads
        fp16 = prof.kernel("decode_attn.fp16").s_per_unit
        # Scoring (kernels_calibration/kernels/pq_score.py), per token and KV head: read m b-bit codes and
        # write FP32 scores for each query head; G·m table gathers and adds. Then top-k over the scores
        # (read them, write k indices). Measured fits replace these where the profile has them.
        score_unit = fit_or(
            prof,
            "score.pq",
            max(
                (self.subspaces * self.bits / 8 + 4 * group) / env.memory_bytes_per_s,
                2 * group * self.subspaces / env.alu_instr_per_s,
            ),
        )
        topk_unit = fit_or(prof, "select.topk", (4 + 12 * self.top_k_fraction) / env.memory_bytes_per_s)
        score = kv_heads * score_unit + env.q_heads_per_gpu * topk_unit
        fetch = self.top_k_fraction * (1 - self.cache_hit_rate) * u * FP16_BYTES / env.pcie_bytes_per_s
        return (
            {"decode": fp16 * u * self.local_tokens},
            {"decode": fp16 * u * self.top_k_fraction + fetch, "approximation": score, "fetch": fetch},
        )
