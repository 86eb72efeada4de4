"""GPU memory of a replica as a serving engine computes it, and KV allocated in whole blocks.

What is modelled: vLLM's worker sizes its KV pool once, at start-up (vllm/v1/worker/gpu_worker.py,
``determine_available_memory``; vllm/utils/mem_utils.py documents the terms):

    requested   = total memory × gpu_memory_utilization
    non-KV      = weights + peak activation of the profile run + non-torch memory
    KV pool     = requested − non-KV − CUDA-graph estimate

The *profile run* (vllm/v1/worker/gpu_model_runner.py, ``profile_run``) is one forward pass over
``max_num_batched_tokens`` tokens spread over ``min(max_num_seqs, tokens)`` requests, followed by a dummy
sampler run over those requests' logits; its torch peak is the activation term.  Non-torch memory is
the CUDA context, NCCL and attention-backend workspaces.  The CUDA-graph estimate is subtracted only
when ``VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS`` is set (llm-d measured −0.45 to +1.03 GiB on H100s
and found the KV pool equal to requested − weights − activation − non-torch without it), so it is a
scenario term that defaults to 0.  The pool is cut into blocks of ``block_tokens`` tokens
(``--block-size``, default 16; vllm/v1/core/kv_cache_utils.py ``get_num_blocks`` floors the pool to
whole pages) and a request holds whole blocks (``kv_blocks``, the one place the rounding is done).

How each term is priced, per GPU of a replica laid out as TP × PP, in FP16:

* weights: parameters × 2 B / (tp·pp); an engine of a data-parallel MoE group holds its experts' share over
  the group's dp·tp GPUs instead (costmodel/expert_parallel.py).
* activation peak: the larger of the forward pass and the sampler run.  Forward: at T tokens, the live
  activations of a layer's larger half: the residual stream and its normalised copy (2h) plus either the
  attention projections (q + 2·kv, then the attention output q, per TP rank) or the MLP's
  (gate-and-up 2i, then the activation i, per rank; i and i for a plain MLP; for a mixture of experts i
  is the k routed experts' widths).  Sampler: the forward's
  final hidden states (T·h) plus ``SAMPLER_LOGIT_COPIES`` FP32 copies of the logits of
  min(max_batch_requests, T) rows over the full vocabulary (vLLM gathers the logits to every TP rank).
* non-torch: ``NON_TORCH_BYTES_TP1`` on one GPU, ``NON_TORCH_BYTES_TPN`` per GPU under tensor
  parallelism (NCCL and custom all-reduce buffers) or in a data-parallel expert group (its all-to-all buffers).

Constants and their sources (llm-d/llm-d-benchmark, config_explorer/empirical-vllm-memory-results.md:
vLLM on one H100 at gpu_memory_utilization 0.9, ``vllm serve`` defaults there, max_num_batched_tokens
8192 and max_num_seqs 1024 for a GPU of ≥ 70 GiB, vllm/engine/arg_utils.py ``get_batch_defaults``):

* ``SAMPLER_LOGIT_COPIES`` = 9.566: Qwen3-0.6B's peak activation, 5.56 GiB, less its 8192 × 1024 FP16
  hidden states, over 1024 rows × 151,936 vocabulary × 4 B.  The same count then gives Llama-3.1-8B
  4.74 GiB (measured 4.76), Qwen3-32B 5.62 (5.64), Llama-3.3-70B at TP 2 4.81 (4.84) and gpt-oss-20b
  7.38 (7.38): the sampler run's logits, not the forward pass, set the peak at these settings
  (tests/test_memory.py checks each).
* non-torch: 0.13 GiB at TP 1 (Llama-3.1-8B, Qwen3-0.6B, gpt-oss-20b), 0.55 GiB per GPU at TP 2
  (Llama-3.3-70B-FP8); no published figure at larger TP (llm-d's planner assumes 2.10 GiB there; the
  measured 0.55 is used).

Assumed: FP16 activations; PP stages hold equal shares of the weights and the last stage runs the
sampler (the pool per GPU is the smallest over the replica's GPUs, as vLLM takes the minimum over its
workers, so the sampler's stage sets it).  costmodel stays pure: no I/O.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from .expert_parallel import weights_bytes_per_gpu
from .specs import FP16_BYTES, GIB, GPUSpec, ModelSpec, Parallelism

FP32_BYTES = 4
SAMPLER_LOGIT_COPIES = 9.566
NON_TORCH_BYTES_TP1 = 0.13 * GIB
NON_TORCH_BYTES_TPN = 0.55 * GIB
DEFAULT_BLOCK_TOKENS = 16


def kv_blocks(tokens: float, block_tokens: int) -> int:
    """Blocks a request of `tokens` KV tokens holds: a paged KV cache hands out whole blocks of
    `block_tokens` tokens (vLLM's ``cdiv(num_tokens, block_size)``).  The one place block rounding is done:
    a request's footprint and the pool's capacity are counted in these blocks."""
    return -(-int(math.ceil(tokens)) // block_tokens)


def forward_activation_bytes(model: ModelSpec, tp: int, tokens: int) -> float:
    """Peak live FP16 activations of one GPU in a forward pass over `tokens` tokens (the module doc)."""
    h = model.hidden_size
    attention = (model.q_dim + 2 * model.kv_dim) / tp + model.q_dim / tp
    i = model.mlp_width_per_token / tp  # MoE: the k experts' widths each token is routed to
    mlp = 3 * i if model.mlp == "gated" else 2 * i
    return tokens * FP16_BYTES * (2 * h + max(attention, mlp))


def sampler_activation_bytes(model: ModelSpec, tokens: int, max_requests: int) -> float:
    """The sampler run's peak: the forward's final hidden states plus SAMPLER_LOGIT_COPIES FP32 logits of
    min(max_requests, tokens) rows over the full vocabulary."""
    rows = min(max_requests, tokens)
    return tokens * model.hidden_size * FP16_BYTES + SAMPLER_LOGIT_COPIES * rows * model.vocab_size * FP32_BYTES


def activation_peak_bytes(model: ModelSpec, tp: int, max_batch_tokens: int, max_batch_requests: int) -> float:
    """The profile run's torch peak on one GPU: the larger of the forward pass and the sampler run."""
    return max(
        forward_activation_bytes(model, tp, max_batch_tokens),
        sampler_activation_bytes(model, max_batch_tokens, max_batch_requests),
    )


def non_torch_bytes(tp: int) -> float:
    return NON_TORCH_BYTES_TP1 if tp == 1 else NON_TORCH_BYTES_TPN


@dataclass(frozen=True)
class MemoryBudget:
    """One GPU's memory as the engine divides it (bytes per GPU), and the replica's KV pool in blocks."""

    gpu_memory_bytes: float
    gpu_memory_utilization: float
    weights_bytes: float
    activation_peak_bytes: float
    non_torch_bytes: float
    cuda_graph_bytes: float
    gpus: int
    block_tokens: int
    block_bytes: float  # one block of the method's KV across the replica's GPUs and layers
    kv_override_bytes: float | None = None  # a fixed pool per replica (kv_capacity_gib) replacing the formula

    @property
    def requested_bytes(self) -> float:
        return self.gpu_memory_bytes * self.gpu_memory_utilization

    @property
    def non_kv_bytes(self) -> float:
        """Per GPU: what the engine holds besides KV (weights, activation peak, non-torch, CUDA graphs)."""
        return self.weights_bytes + self.activation_peak_bytes + self.non_torch_bytes + self.cuda_graph_bytes

    @property
    def kv_pool_bytes_per_gpu(self) -> float:
        return self.requested_bytes - self.non_kv_bytes

    @property
    def kv_pool_bytes(self) -> float:
        """The replica's KV pool before block rounding: the formula's, or the fixed pool."""
        if self.kv_override_bytes is not None:
            return self.kv_override_bytes
        return self.kv_pool_bytes_per_gpu * self.gpus

    @property
    def blocks(self) -> int:
        """Whole blocks the pool holds (0 when the weights and reserves leave no room)."""
        if self.block_bytes <= 0:
            return 0
        return max(0, math.floor(self.kv_pool_bytes / self.block_bytes))

    @property
    def kv_capacity_bytes(self) -> float:
        """KV bytes the replica can hold: whole blocks (the pool itself for a method with no paged KV)."""
        if self.block_bytes <= 0:
            return max(0.0, self.kv_pool_bytes)
        return self.blocks * self.block_bytes

    def as_dict(self) -> dict:
        """The terms, for summary.json (bytes per GPU unless named per replica)."""
        return {
            "gpu_memory_bytes": self.gpu_memory_bytes,
            "gpu_memory_utilization": self.gpu_memory_utilization,
            "requested_bytes": self.requested_bytes,
            "weights_bytes": self.weights_bytes,
            "activation_peak_bytes": self.activation_peak_bytes,
            "non_torch_bytes": self.non_torch_bytes,
            "cuda_graph_bytes": self.cuda_graph_bytes,
            "kv_pool_bytes_per_gpu": self.kv_pool_bytes_per_gpu,
            "gpus": self.gpus,
            "fixed_pool_bytes": self.kv_override_bytes,
            "block_tokens": self.block_tokens,
            "block_bytes": self.block_bytes,
            "blocks": self.blocks,
            "kv_capacity_bytes": self.kv_capacity_bytes,
        }


def memory_budget(
    gpu: GPUSpec,
    model: ModelSpec,
    parallel: Parallelism,
    *,
    gpu_memory_utilization: float,
    max_batch_tokens: int,
    max_batch_requests: int,
    block_tokens: int,
    block_bytes: float,
    cuda_graph_bytes: float = 0.0,
    non_torch_override_bytes: float | None = None,
    kv_override_bytes: float | None = None,
) -> MemoryBudget:
    tp = parallel.tensor
    return MemoryBudget(
        gpu_memory_bytes=gpu.memory_bytes,
        gpu_memory_utilization=gpu_memory_utilization,
        weights_bytes=weights_bytes_per_gpu(model, parallel),
        activation_peak_bytes=activation_peak_bytes(model, tp, max_batch_tokens, max_batch_requests),
        # an engine of a data-parallel group holds the EP group's communicator buffers as a TP group's GPU does
        non_torch_bytes=non_torch_bytes(parallel.expert_gpus)
        if non_torch_override_bytes is None
        else non_torch_override_bytes,
        cuda_graph_bytes=cuda_graph_bytes,
        gpus=parallel.gpus,
        block_tokens=block_tokens,
        block_bytes=block_bytes,
        kv_override_bytes=kv_override_bytes,
    )
