"""Frozen hardware and model descriptions the cost model computes with.

These are plain frozen dataclasses (the scenario's pydantic models are resolved into them once), so
the cost model computes with fixed numbers and no YAML or I/O; `catalog/` holds the data files and
the scenario may override any field.

A GPU a user brings may be given by a short spec: memory, memory bandwidth, the dense FP16 tensor rate with
FP32 accumulate, SMs and clock (``SHORT_SPEC_FIELDS``).  ``complete_gpu_fields`` derives the rest by the rules
in ``DERIVED_RULES`` and returns what it derived, so the outputs can say so:

* fp32_tflops = 2 × SMs × 128 FP32 lanes × clock (GA10x, Ada, Hopper, Blackwell; the catalog test checks every
  entry against 2 × SMs × lanes × clock with 64 or 128 lanes);
* int8_tensor_tops = 2 × fp16_tensor_tflops (the ratio on every catalog GPU with INT8 tensor cores);
* fp8_tensor_tflops = 2 × fp16_tensor_tflops from compute capability 8.9 (Ada, Hopper and later have FP8
  tensor cores), else none;
* four warp schedulers and 16 SFU results per SM per clock (CUDA C++ Programming Guide, compute capability
  7.x-9.0, "Arithmetic Instructions");
* compute capability 8.0 (the oldest Triton 3 targets), PCIe 24 GB/s per direction (Gen4 x16 achievable), and
  no peer access over PCIe (the GeForce case; a data-centre or professional part says pcie_peer_access: true).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .collectives import Interconnect

GB = 1e9
GIB = 2**30
FP16_BYTES = 2


SHORT_SPEC_FIELDS = ("memory_bytes", "memory_bandwidth_gb_per_s", "fp16_tensor_tflops", "sms", "boost_clock_ghz")
FP32_LANES_PER_SM = 128  # GA10x, Ada, Hopper, Blackwell (64 on Volta, Turing and GA100)
INT8_OPS_PER_FP16_FLOP = 2.0
FP8_MIN_COMPUTE_CAPABILITY = 8.9
DEFAULT_COMPUTE_CAPABILITY = "8.0"
DEFAULT_PCIE_GB_PER_S = 24.0  # Gen4 x16, achievable per direction (gpus.yaml convention)
WARP_SCHEDULERS_PER_SM = 4
SFU_OPS_PER_CLOCK_PER_SM = 16


def _fp8(f: dict) -> float | None:
    return 2.0 * f["fp16_tensor_tflops"] if float(f["compute_capability"]) >= FP8_MIN_COMPUTE_CAPABILITY else None


# field -> (rule, value from the fields so far); applied in this order to the fields a GPU leaves out
DERIVED_RULES: dict[str, tuple[str, Callable[[dict], Any]]] = {
    "name": ("not given", lambda f: "custom GPU"),
    "arch": ("not given", lambda f: "unknown"),
    "compute_capability": (
        f"not given: {DEFAULT_COMPUTE_CAPABILITY} (Gluon kernels and FP8 tensor cores then count as absent)",
        lambda f: DEFAULT_COMPUTE_CAPABILITY,
    ),
    "fp32_tflops": (
        f"2 x sms x {FP32_LANES_PER_SM} FP32 lanes x boost_clock_ghz",
        lambda f: 2 * f["sms"] * FP32_LANES_PER_SM * f["boost_clock_ghz"] / 1e3,
    ),
    "int8_tensor_tops": (
        f"{INT8_OPS_PER_FP16_FLOP:g} x fp16_tensor_tflops",
        lambda f: INT8_OPS_PER_FP16_FLOP * f["fp16_tensor_tflops"],
    ),
    "fp8_tensor_tflops": (
        f"2 x fp16_tensor_tflops from compute capability {FP8_MIN_COMPUTE_CAPABILITY}, else none",
        _fp8,
    ),
    "warp_schedulers_per_sm": ("compute capability 7.0-9.0: 4", lambda f: WARP_SCHEDULERS_PER_SM),
    "sfu_ops_per_clock_per_sm": ("compute capability 7.0-9.0: 16", lambda f: SFU_OPS_PER_CLOCK_PER_SM),
    "pcie_gb_per_s": (
        f"not given: PCIe Gen4 x16, {DEFAULT_PCIE_GB_PER_S:g} GB/s achievable",
        lambda f: DEFAULT_PCIE_GB_PER_S,
    ),
    "pcie_peer_access": (
        "not given: no peer access over PCIe (GeForce); say true for a data-centre or professional part",
        lambda f: False,
    ),
}
OPTIONAL_FIELDS = ("fp4_tensor_tflops", "sustained_clock_ghz", "nvlink_gb_per_s")  # absent: none, nothing derived


def complete_gpu_fields(given: dict) -> tuple[dict, dict[str, dict]]:
    """A GPU's full field set from the fields given (a catalog entry, or a short spec with any of the others):
    every field of DERIVED_RULES that is absent is derived, in order, and reported as {field: {value, rule}}.
    A field given as None stays None (a GPU without INT8 tensor cores says int8_tensor_tops: null)."""
    missing = [k for k in SHORT_SPEC_FIELDS if given.get(k) is None]
    if missing:
        raise ValueError(f"a GPU needs {', '.join(SHORT_SPEC_FIELDS)}; missing {', '.join(missing)}")
    full = {k: given.get(k) for k in OPTIONAL_FIELDS} | dict(given)
    derived: dict[str, dict] = {}
    for name, (rule, value) in DERIVED_RULES.items():
        if name not in given:
            full[name] = value(full)
            derived[name] = {"value": full[name], "rule": rule}
    return full, derived


@dataclass(frozen=True)
class GPUSpec:
    key: str
    name: str
    arch: str
    memory_bytes: float
    memory_bandwidth_gb_per_s: float
    fp16_tensor_tflops: float
    int8_tensor_tops: float | None  # None: no INT8 tensor cores (V100)
    fp8_tensor_tflops: float | None  # None: no FP8 tensor cores (before Ada/Hopper)
    fp4_tensor_tflops: float | None
    fp32_tflops: float
    pcie_gb_per_s: float
    sms: int  # streaming multiprocessors
    warp_schedulers_per_sm: int  # warp instructions issued per SM per clock
    sfu_ops_per_clock_per_sm: int  # special-function results per SM per clock
    boost_clock_ghz: float  # SM clock the FP32 peak is quoted at
    sustained_clock_ghz: float | None  # SM clock a power-capped part holds under load; None: the boost clock
    nvlink_gb_per_s: float | None  # per GPU per direction; None: no NVLink
    compute_capability: str = "8.0"
    pcie_peer_access: bool = True  # two of these GPUs may reach each other's memory over PCIe (not GeForce)

    @property
    def has_int8_tensor_cores(self) -> bool:
        return self.int8_tensor_tops is not None

    @property
    def clock_ghz(self) -> float:
        """The SM clock clock-bound units run at under load."""
        return self.sustained_clock_ghz or self.boost_clock_ghz

    @classmethod
    def from_fields(cls, key: str, f: dict) -> GPUSpec:
        """From catalog/data/gpus.yaml field names (a complete set: complete_gpu_fields fills a short spec)."""
        return cls(
            key=key,
            name=f["name"],
            arch=f["arch"],
            memory_bytes=float(f["memory_bytes"]),
            memory_bandwidth_gb_per_s=f["memory_bandwidth_gb_per_s"],
            fp16_tensor_tflops=f["fp16_tensor_tflops"],
            int8_tensor_tops=f.get("int8_tensor_tops"),
            fp8_tensor_tflops=f.get("fp8_tensor_tflops"),
            fp4_tensor_tflops=f.get("fp4_tensor_tflops"),
            fp32_tflops=f["fp32_tflops"],
            pcie_gb_per_s=f["pcie_gb_per_s"],
            sms=f["sms"],
            warp_schedulers_per_sm=f["warp_schedulers_per_sm"],
            sfu_ops_per_clock_per_sm=f["sfu_ops_per_clock_per_sm"],
            boost_clock_ghz=f["boost_clock_ghz"],
            sustained_clock_ghz=f.get("sustained_clock_ghz"),
            nvlink_gb_per_s=f.get("nvlink_gb_per_s"),
            compute_capability=str(f["compute_capability"]),
            pcie_peer_access=bool(f.get("pcie_peer_access", True)),
        )


@dataclass(frozen=True)
class ModelSpec:
    key: str
    name: str
    layers: int
    hidden_size: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    mlp: str = "gated"  # gated: 3 matrices (SwiGLU); plain: 2 (GELU)
    parallel_attention: bool = False
    max_context_tokens: int = 131072
    qkv_bias: bool = False  # Q, K and V projections carry a bias vector (Qwen2): weights only
    tied_embeddings: bool = False  # the LM head is the embedding matrix: stored once
    experts: int = 0  # routed experts per layer (mixture of experts); 0: a dense MLP
    active_experts: int = 0  # experts each token is routed to (top-k)
    expert_intermediate_size: int = 0  # inner width of one expert's gated MLP

    @property
    def is_moe(self) -> bool:
        return self.experts > 0

    @property
    def mlp_width_per_token(self) -> int:
        """MLP inner activations one token produces: the dense width, or its experts' widths (MoE)."""
        return self.active_experts * self.expert_intermediate_size if self.is_moe else self.intermediate_size

    def distinct_experts(self, tokens):
        """Expected number of distinct experts `tokens` tokens are routed to, per layer, under uniform
        routing without replacement of k of E experts per token: E·(1 − (1 − k/E)^T) (each expert is
        missed by one token with probability 1 − k/E, independently across tokens).  tokens may be a
        numpy array; 0 for a dense model."""
        if not self.is_moe:
            return tokens * 0.0
        return self.experts * (1.0 - (1.0 - self.active_experts / self.experts) ** tokens)

    @property
    def kv_elements_per_token_per_layer(self) -> int:
        """K and V elements one token adds to one layer's cache: 2 * kv_heads * head_dim."""
        return 2 * self.kv_heads * self.head_dim

    @property
    def q_dim(self) -> int:
        return self.heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        return self.kv_heads * self.head_dim

    @property
    def layer_weight_params(self) -> int:
        attn = self.hidden_size * (self.q_dim + 2 * self.kv_dim) + self.q_dim * self.hidden_size
        bias = self.q_dim + 2 * self.kv_dim if self.qkv_bias else 0
        return attn + bias + self.mlp_weight_params

    @property
    def expert_params(self) -> int:
        """One expert's gated MLP (gate, up, down)."""
        return 3 * self.hidden_size * self.expert_intermediate_size

    @property
    def mlp_weight_params(self) -> int:
        """One layer's MLP: the dense matrices, or every expert plus the router (hidden x experts)."""
        if self.is_moe:
            return self.experts * self.expert_params + self.hidden_size * self.experts
        return (3 if self.mlp == "gated" else 2) * self.hidden_size * self.intermediate_size

    @property
    def embedding_params(self) -> int:
        """Input embedding and LM head: two matrices, or one when they are tied. (The LM head GEMM
        runs either way; tying saves memory, not time.)"""
        return (1 if self.tied_embeddings else 2) * self.vocab_size * self.hidden_size

    @property
    def params(self) -> int:
        return self.layers * self.layer_weight_params + self.embedding_params

    @property
    def active_params(self) -> int:
        """Parameters one token's forward pass reads: all but the experts it is not routed to."""
        idle = (self.experts - self.active_experts) * self.expert_params if self.is_moe else 0
        return self.params - self.layers * idle


@dataclass(frozen=True)
class Parallelism:
    """How one model replica is laid over GPUs: tensor parallel inside a stage, pipeline across stages."""

    tensor: int = 1
    pipeline: int = 1
    intra_node_gb_per_s: float = 24.0  # per-GPU bandwidth per direction of the TP interconnect
    inter_stage_gbps: float = 10.0  # link between pipeline stages (bits/s), for activations
    interconnect: Interconnect | None = None  # TP all-reduce constants (catalog/data/interconnects.yaml)
    network: Interconnect | None = None  # send/recv constants between pipeline stages
    expert_parallel: bool = False  # MoE: whole experts spread over the TP GPUs (else each sharded)
    data_parallel: int = 1  # MoE: attention engines of tensor GPUs each whose experts form one EP group of
    # data_parallel × tensor GPUs (costmodel/expert_parallel.py); one replica's parallelism is one engine's

    @property
    def gpus(self) -> int:
        """GPUs of one engine (a replica without data parallelism): tensor × pipeline."""
        return self.tensor * self.pipeline

    @property
    def expert_gpus(self) -> int:
        """GPUs one pipeline stage's experts are spread over: the MoE layers' group of DP × TP GPUs (vLLM: whole
        experts with expert parallelism, EP_SIZE = TP × DP; a 1/tp slice of every expert without, which the
        scenario allows for one engine only)."""
        return self.tensor * self.data_parallel
