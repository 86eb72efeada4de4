"""The scenario: a strict, frozen pydantic v2 description of one cluster, workload and method set.

A scenario is YAML. Hardware, models and workloads are catalog presets referenced by key
(``model: llama-3.1-70b``) or a mapping with ``preset:`` plus fields that override it inline.
Methods are a list of names or mappings, discriminated by ``name``. Every field has a
description and bounds; unknown fields are errors. `parse_scenario` (and `simulator.load.load_scenario`,
from a file) turns any problem into a `ScenarioError` whose message is one line naming the file and the field.
"""

from __future__ import annotations

import copy
import math
import re
from pathlib import Path
from typing import Annotated, Any, Literal, get_args

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, ValidationError, field_validator, model_validator

import catalog
from costmodel.methods import REFERENCE, MethodConfig
from costmodel.methods import REGISTRY as METHOD_REGISTRY

from . import files


class ScenarioError(ValueError):
    """A scenario that cannot be run; the message is one line, naming file and field."""


# network.link_busy_host_factor_chunk_share's and _max_chunks_per_s's defaults: the H200 host's (realrun.transient
# fit_xfer_chunks on realrun/traces/h200_xferwide)
CHUNK_SHARE = 0.766
MAX_CHUNKS_PER_S = 4644.0
MAX_REQUESTS = 10**8  # a sanity bound; what fits this machine's memory is checked before a run


class _Strict(BaseModel):
    # Numbers must be finite unless a field says otherwise (`Unlimited`); JSON spells infinity "Infinity".
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, allow_inf_nan=False, ser_json_inf_nan="strings")


def _read_infinity(v: Any) -> Any:
    """YAML's .inf arrives as a float; strict JSON (scenario.json, a sweep point) spells it "Infinity"."""
    if isinstance(v, str) and v.strip().lower().lstrip("+") in ("inf", "infinity", ".inf"):
        return math.inf
    return v


# A rate > 0 where infinity means "no limit" (an infinitely fast link moves KV in no time).
Unlimited = Annotated[float, Field(gt=0, allow_inf_nan=True), BeforeValidator(_read_infinity)]


def _catalog_entry(kind: str, key: Any) -> dict:
    """catalog.entry, with its error as a ValueError so pydantic reports the field's location."""
    if not isinstance(key, str):
        raise ValueError(f"expected a {kind} preset name, got a {type(key).__name__}")
    try:
        return catalog.entry(kind, str(key))
    except KeyError as e:
        raise ValueError(e.args[0]) from None


def _with_preset(kind: str, value: Any, *, drop: tuple[str, ...] = ("key", "sources", "notes")) -> Any:
    """`key` or `{preset: key, **overrides}` -> the catalog entry merged with the overrides."""
    if isinstance(value, str):
        value = {"preset": value}
    if isinstance(value, dict) and "preset" in value:
        base = _catalog_entry(kind, value["preset"])
        merged = {k: v for k, v in base.items() if k not in drop}
        merged.update(value)
        return merged
    return value


# ---- model ------------------------------------------------------------------------------
class ModelConfig(_Strict):
    preset: str | None = Field(None, description="catalog/data/models.yaml key the fields came from")
    name: str = Field(description="display name")
    layers: int = Field(gt=0, le=4096, description="transformer layers")
    hidden_size: int = Field(gt=0, le=2**20, description="model width")
    heads: int = Field(gt=0, le=2**14, description="query heads")
    kv_heads: int = Field(gt=0, le=2**14, description="KV heads (GQA)")
    head_dim: int = Field(gt=0, le=2**14, description="dimension per head")
    intermediate_size: int = Field(gt=0, le=2**22, description="MLP inner width")
    vocab_size: int = Field(gt=0, le=2**24, description="vocabulary size (LM head width)")
    mlp: Literal["gated", "plain"] = Field("gated", description="gated: SwiGLU, 3 matrices; plain: 2 matrices")
    parallel_attention: bool = Field(False, description="attention and MLP in parallel (Falcon)")
    qkv_bias: bool = Field(False, description="Q, K and V projections have a bias vector (counted in the weights)")
    tied_embeddings: bool = Field(
        False, description="the LM head shares the embedding matrix (its weights are stored once)"
    )
    max_context_tokens: int = Field(gt=0, le=2**30, description="longest prompt + output the model supports")
    experts: int = Field(
        0,
        ge=0,
        le=2**16,
        description="mixture of experts: routed experts per layer, whose "
        "gated MLPs replace the dense one (intermediate_size is then unused); 0: a dense model",
    )
    active_experts: int = Field(
        0, ge=0, le=2**16, description="mixture of experts: experts each token is routed to (top-k)"
    )
    expert_intermediate_size: int = Field(
        0, ge=0, le=2**22, description="mixture of experts: inner width of one expert's gated MLP"
    )

    @model_validator(mode="before")
    @classmethod
    def _preset(cls, v: Any) -> Any:
        return _with_preset("models", v)

    @model_validator(mode="after")
    def _heads(self) -> ModelConfig:
        if self.heads % self.kv_heads:
            raise ValueError(f"heads ({self.heads}) must be a multiple of kv_heads ({self.kv_heads})")
        if self.experts or self.active_experts or self.expert_intermediate_size:
            if not (self.experts >= 2 and 1 <= self.active_experts <= self.experts and self.expert_intermediate_size):
                raise ValueError(
                    f"a mixture of experts needs experts >= 2, 1 <= active_experts <= experts and "
                    f"expert_intermediate_size > 0 (got {self.experts}, {self.active_experts}, "
                    f"{self.expert_intermediate_size})"
                )
            if self.mlp != "gated":
                raise ValueError("a mixture of experts has gated (SwiGLU) experts: mlp must be gated")
        return self


# ---- hardware pools ---------------------------------------------------------------------
class GPUConfig(_Strict):
    """A GPU: a catalog preset (catalog/data/gpus.yaml), a preset with fields overridden, or a GPU of one's own.
    One's own needs only the short spec (memory, memory bandwidth, FP16 tensor rate, SMs, clock); every other
    field is derived by costmodel/specs.py's rules, printed and recorded in profiles.json."""

    preset: str | None = Field(None, description="catalog/data/gpus.yaml key the fields came from")
    name: str | None = Field(None, max_length=200, description="display name; default: 'custom GPU'")
    arch: str | None = Field(None, max_length=100, description="architecture (ampere, ada, hopper, ...); informational")
    compute_capability: str | None = Field(
        None,
        pattern=r"^[0-9]{1,2}\.[0-9]$",
        description="e.g. '8.9'; decides the Gluon decode kernels (9.0 and later) and FP8 tensor cores (8.9 and "
        "later); default: 8.0",
    )
    memory_bytes: float | None = Field(
        None,
        gt=0,
        le=1e15,
        description="GPU memory as the CUDA driver reports it (deviceQuery's 'Total amount of global memory', "
        "torch.cuda.get_device_properties().total_memory), bytes; give this or memory_gib",
    )
    memory_gib: float | None = Field(
        None, gt=0, le=1e6, description="the same in GiB (2^30 bytes), as torch reports it; give this or memory_bytes"
    )
    memory_bandwidth_gb_per_s: float = Field(gt=0, le=1e6, description="datasheet memory bandwidth, GB/s")
    fp16_tensor_tflops: float = Field(gt=0, le=1e6, description="dense FP16 tensor rate, FP32 accumulate")
    int8_tensor_tops: float | None = Field(
        None, gt=0, le=1e6, description="dense INT8 tensor rate; null: none; left out: 2 x fp16_tensor_tflops"
    )
    fp8_tensor_tflops: float | None = Field(
        None,
        gt=0,
        le=1e6,
        description="dense FP8 tensor rate; null: none; left out: 2 x fp16_tensor_tflops from compute capability "
        "8.9, else none",
    )
    fp4_tensor_tflops: float | None = Field(None, gt=0, le=1e6, description="dense FP4 tensor rate; null: none")
    fp32_tflops: float | None = Field(
        None, gt=0, le=1e6, description="FP32 CUDA-core peak; left out: 2 x sms x 128 x boost_clock_ghz"
    )
    sms: int = Field(
        gt=0, le=2**20, description="streaming multiprocessors (CUDA-core, SFU and tensor issue rates scale with them)"
    )
    warp_schedulers_per_sm: int | None = Field(
        None, gt=0, le=64, description="warp instructions issued per SM per clock; left out: 4"
    )
    sfu_ops_per_clock_per_sm: int | None = Field(
        None, gt=0, le=4096, description="special-function (exp2, rcp) results per SM per clock; left out: 16"
    )
    boost_clock_ghz: float = Field(gt=0, le=100, description="SM clock the FP32 peak is quoted at")
    sustained_clock_ghz: float | None = Field(
        None,
        gt=0,
        le=100,
        description="SM clock held under load where a power cap keeps it below boost; null: the boost clock",
    )
    pcie_gb_per_s: float | None = Field(
        None, gt=0, le=1e5, description="achievable host<->device per direction; left out: 24 (Gen4 x16)"
    )
    nvlink_gb_per_s: float | None = Field(None, gt=0, le=1e5, description="NVLink per GPU per direction; null: none")
    pcie_peer_access: bool | None = Field(
        None,
        description="whether two of these GPUs may reach each other's memory over PCIe (cudaDeviceCanAccessPeer; "
        "GeForce: no); left out: no",
    )

    @model_validator(mode="before")
    @classmethod
    def _preset(cls, v: Any) -> Any:
        # `measured` holds published measurements with their sources: provenance, compared in profiles.json
        merged = _with_preset("gpus", v, drop=("key", "sources", "notes", "measured"))
        if isinstance(v, dict) and "memory_gib" in v and "memory_bytes" not in v and isinstance(merged, dict):
            merged.pop("memory_bytes", None)  # the override replaces the preset's figure
        return merged

    @model_validator(mode="after")
    def _memory(self) -> GPUConfig:
        if (self.memory_bytes is None) == (self.memory_gib is None):
            raise ValueError("give the GPU's memory as memory_bytes or memory_gib (one of them)")
        return self

    @property
    def total_memory_bytes(self) -> float:
        if self.memory_bytes is not None:
            return self.memory_bytes
        assert self.memory_gib is not None  # _memory requires one of them
        return self.memory_gib * 2**30


class PoolHostConfig(_Strict):
    """The host machine one replica runs on, where the catalog instance does not describe it (or there is none):
    what offload methods use (PQCache's K-Means on its CPUs, KV in its memory, fetched over PCIe)."""

    vcpus: int | None = Field(
        None,
        gt=0,
        le=2**16,
        description="CPU hardware threads the engine may use (nproc; a core with SMT counts twice): PQCache's "
        "K-Means runs on them; default: the instance's vCPUs",
    )
    memory_gib: float | None = Field(
        None,
        gt=0,
        le=2**30,
        description="host memory for KV (parked on prefill, offloaded on decode), per replica; default: the pool's "
        "host_memory_gib, else half the instances' memory",
    )
    memory_bandwidth_gb_per_s: float | None = Field(
        None,
        gt=0,
        le=1e6,
        description="host DRAM bandwidth; the replica's GPUs share it for transfers to and from host memory "
        "(offload fetches, swaps); default: not a limit",
    )
    pcie_gb_per_s: float | None = Field(
        None,
        gt=0,
        le=1e5,
        description="achievable host<->GPU rate per GPU and direction of the host's slots (Gen4 x16: 24, Gen5 "
        "x16: 50); the slower of it and the GPU's own link is used; default: the GPU's",
    )


class PoolConfig(_Strict):
    instance: str | None = Field(
        None,
        description="catalog/data/instances.yaml key; sets the GPU, GPUs per "
        "instance, network, host memory, intra-node bandwidth and price",
    )
    gpu: GPUConfig | None = Field(None, description="GPU preset key or mapping; defaults to the instance's GPU")
    tensor_parallel: int = Field(1, ge=1, le=1024, description="GPUs per pipeline stage (within one instance)")
    pipeline_parallel: int = Field(1, ge=1, le=1024, description="pipeline stages per replica (may span instances)")
    replicas: int = Field(
        1,
        ge=0,
        le=4096,
        description="model replicas in the pool (0: only a prefill pool under placement colocated, whose "
        "engines are then the decode pool's replicas alone)",
    )
    max_batch_requests: int = Field(
        256,
        ge=1,
        le=2**20,
        description="most requests running at once on a replica (vLLM's max_num_seqs: a step takes a "
        "waiting request only while fewer run); also sizes the sampler's share of the activation peak",
    )
    max_batch_tokens: int = Field(
        16384,
        ge=1,
        le=2**30,
        description="most tokens one step (forward pass) computes (vLLM's max_num_batched_tokens): a "
        "decode row counts one, a prompt or its chunk its tokens (without chunk_tokens a longer prompt "
        "runs alone); also the profile run's tokens, which size the activation peak",
    )
    gpu_memory_utilization: float = Field(
        0.9,
        gt=0,
        le=1,
        description="fraction of each GPU's memory that "
        "weights, activations and KV may use (vLLM's gpu_memory_utilization)",
    )
    block_tokens: int = Field(
        16,
        ge=1,
        le=2**20,
        description="KV tokens per block (vLLM's --block-size): the pool "
        "is whole blocks and a request holds whole blocks of its prompt + output tokens",
    )
    cuda_graph_gib: float = Field(
        0.0,
        ge=0,
        le=2**20,
        description="per GPU, CUDA-graph memory subtracted from the "
        "KV pool (vLLM subtracts its estimate only with "
        "VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS; llm-d measured -0.45 to +1.03 GiB)",
    )
    non_torch_gib: float | None = Field(
        None,
        ge=0,
        le=2**20,
        description="per GPU, memory outside torch's "
        "allocator (CUDA context, NCCL, workspaces); default: 0.13 GiB on one GPU, "
        "0.55 GiB per GPU under tensor parallelism (costmodel/memory.py)",
    )
    host_memory_gib: float | None = Field(
        None,
        gt=0,
        le=2**30,
        description="host memory per replica for KV: on prefill, KV "
        "parked while no decode replica has room; on decode, KV offloaded by "
        "PQCache/HCAttention; default: half the replica's instances' memory",
    )
    interconnect: Literal["pcie", "nvlink", "nvswitch"] | None = Field(
        None,
        description="how the GPUs of a tensor-parallel group reach each other (catalog/data/interconnects.yaml "
        "gives each one's collective constants); default: the instance's gpu_interconnect, else pcie",
    )
    peer_access: bool | None = Field(
        None,
        description="whether the GPUs of a tensor-parallel group reach each other's memory directly (NVLink, or "
        "PCIe P2P the driver grants): without it vLLM's custom all-reduce is off and NCCL goes through host "
        "memory (interconnects.yaml pcie_host); default: the instance's peer_access, else true over NVLink, "
        "else the GPU's pcie_peer_access",
    )
    host: PoolHostConfig | None = Field(
        None,
        description="the host one replica runs on (CPU threads, memory, memory bandwidth, PCIe), where the "
        "instance does not say or there is none",
    )
    intra_node_gb_per_s: float | None = Field(
        None,
        gt=0,
        le=1e6,
        description="per-GPU bandwidth per direction of "
        "the TP interconnect; default: the instance's, else the GPU's NVLink "
        "(nvlink, nvswitch) or PCIe bandwidth",
    )
    price_usd_per_hour: float | None = Field(None, ge=0, le=1e6, description="per instance; default: the instance's")
    kv_capacity_gib: float | None = Field(
        None,
        gt=0,
        le=2**30,
        description="KV memory per replica, replacing the capacity "
        "computed from GPU memory (to describe a system that pre-allocates a "
        "fixed KV pool, as realrun does)",
    )
    host_issue_s_per_iteration: float = Field(
        0.0,
        ge=0,
        le=3600,
        description="CPU time the engine spends issuing one "
        "decode iteration (or one prefill batch on the prefill pool), fixed "
        "part: it lasts max(GPU time, host time); 0 for an engine that replays "
        "CUDA graphs",
    )
    host_issue_s_per_layer: float = Field(
        0.0,
        ge=0,
        le=3600,
        description="CPU issue time per layer per decode iteration (or prefill batch): eager launches, graph replays",
    )
    host_issue_s_per_request: float = Field(
        0.0, ge=0, le=3600, description="CPU issue time per request of a decode iteration (or prefill batch)"
    )
    host_exposed_s_per_iteration: float = Field(
        0.0,
        ge=0,
        le=3600,
        description="prefill issued eagerly (launch by launch from the CPU): CPU time of a prefill batch the GPU "
        "cannot overlap even where its own work is the longer (the first launches before any GPU work is queued, "
        "the closing sync): the batch lasts max(GPU time + this + host_exposed_s_per_layer x layers, host floor) "
        "(python -m realrun.prefillprof: the eager forward against the same forward replayed as a CUDA graph); "
        "on the decode pool, the prefills a colocated replica runs",
    )
    host_exposed_s_per_layer: float = Field(
        0.0,
        ge=0,
        le=3600,
        description="prefill issued eagerly: per layer, the GPU's time between eagerly issued kernels that a "
        "graph replay does not have (see host_exposed_s_per_iteration)",
    )
    host_first_seen_s_per_iteration: float = Field(
        0.0,
        ge=0,
        le=3600,
        description="prefill pool: CPU time a prefill batch adds when its process has not run a batch of that many "
        "tokens before (cuBLAS's kernel choice for a new GEMM row count, kept per shape for "
        "the process's life); each replica remembers the counts it has run, from its start (python -m "
        "realrun.prefillprof --first-seen)",
    )
    host_first_seen_fade_s: float = Field(
        0.0,
        ge=0,
        le=3600,
        description="prefill pool: where a first-seen batch's GPU work is the longer, the share of "
        "host_first_seen_s_per_iteration it still adds, exp(-its time / this): the kernel choices stall the CPU between "
        "launches while the GPU has little queued, hidden more as the batch's kernels grow (python -m "
        "realrun.prefillprof --first-seen-fade-fit); 0: none (the CPU's extra time counts on the host floor only)",
    )
    host_serial_s_per_iteration: float = Field(
        0.0,
        ge=0,
        le=3600,
        description="decode: CPU time between iterations during "
        "which the GPU idles (sync on the sampled tokens, scheduling); prefill: CPU time per prefill batch "
        "during which the GPU idles, after its KV is encoded (handing the KV on, preparing the next step's "
        "inputs); under placement shared_gpu the decode waits for it too",
    )
    after_prefill_slowdown_fraction: float = Field(
        0.0,
        ge=0,
        le=1,
        description="decode, placement shared_gpu: the decode iterations right after a prefill on the shared GPU "
        "run longer, in all by this fraction of the prefill's time, that time saturating at "
        "after_prefill_saturation_s (a transient after the prefill's GEMMs; python -m realrun.transient "
        "measures it: 0.0163 on the H200, realrun/traces/h200_transient); a later prefill restarts it",
    )
    after_prefill_saturation_s: float = Field(
        0.0,
        ge=0,
        le=3600,
        description="decode, placement shared_gpu: the prefill time at which after_prefill_slowdown_fraction's "
        "extra time saturates: a prefill of P seconds leaves fraction x S x (1 - exp(-P / S)) behind (0: fraction "
        "x P, no saturation); realrun.transient: 0.086 s on the H200 (after 0.2-0.9 s prefills the iterations run "
        "about as much longer as after 0.07-0.1 s ones)",
    )
    after_prefill_decay_per_iteration: float = Field(
        0.719,
        ge=0,
        lt=1,
        description="decode, placement shared_gpu: the share of after_prefill_slowdown_fraction's extra time "
        "still ahead after each iteration (the k-th iteration after the prefill takes fraction x prefill time "
        "x (1 - decay) x decay^(k-1)); realrun.transient: 0.719 on the H200",
    )
    after_prefill_clock_fraction: float = Field(
        0.0,
        ge=0,
        le=1,
        description="decode, placement shared_gpu: the GPU's power limit lowers its clocks after the prefills' "
        "GEMMs, so the decode iterations run slower by a fraction that a prefill of P seconds raises by this x "
        "(1 - exp(-P / after_prefill_clock_time_constant_s)) (a lag toward this level while the prefill runs) and "
        "that fades with that time constant; the prefills' shares add. Measured by python -m realrun.transient "
        "--fit: 0.0161 on the H200 (realrun/traces/h200_transient)",
    )
    after_prefill_clock_time_constant_s: float = Field(
        0.116,
        gt=0,
        le=60,
        description="decode, placement shared_gpu: how fast the clock slowdown after a prefill fades "
        "(after_prefill_clock_fraction); the H200's SM clock recovers with 0.116 s after the last prefill "
        "(realrun.transient.clock_time_constant on the clock logs in realrun/traces/h200_transient)",
    )
    cuda_graphs: bool = Field(
        True,
        description="decode: iterations replayed as CUDA graphs, as vLLM (without --enforce-eager) and SGLang do, "
        "so the small kernels inside cost the profile's measured in-graph overhead, not a launch each; false for "
        "an engine that launches its decode kernels one by one",
    )
    expert_parallel: bool = Field(
        False,
        description="mixture of experts: spread whole experts over the "
        "tensor-parallel GPUs (tokens dispatched to them and combined back by two "
        "all-to-alls per layer) instead of slicing every expert across them",
    )
    data_parallel: int = Field(
        1,
        ge=1,
        le=1024,
        description="decode, mixture of experts with expert_parallel: attention engines per replica "
        "(vLLM's --data-parallel-size with --enable-expert-parallel), each of tensor_parallel GPUs with its own "
        "scheduler, KV pool and requests (routed by vLLM's DP load balancer), stepping in lock-step while the "
        "experts are spread over all data_parallel x tensor_parallel GPUs (simulator/data_parallel.py)",
    )
    extra_kernels_per_layer: int = Field(
        0,
        ge=0,
        le=10**4,
        description="decode: small kernels per layer the engine runs "
        "beyond the model's own (copies into static buffers, gathers), each "
        "priced as one launch-bound kernel",
    )
    chunk_tokens: int | None = Field(
        None,
        ge=1,
        le=2**30,
        description="chunked prefill (vLLM's enable_chunked_prefill, with long_prefill_token_threshold = "
        "chunk_tokens): a prompt, or a preempted request's recompute, is split into chunks of at most this many "
        "tokens per step, several requests' chunks sharing a step's max_batch_tokens, each chunk attending "
        "to the earlier ones (give max_batch_tokens or more for vLLM's default, chunks limited by the "
        "step's budget alone); null: never split, a step takes whole prompts while they fit its "
        "max_batch_tokens and a longer one runs alone (simulator/scheduler.py)",
    )
    admission: Literal["reserve", "on_demand"] = Field(
        "on_demand",
        description="decode: on_demand (vLLM, SGLang) allocates KV blocks as a request's context "
        "grows and preempts the newest running request when a block is not free; reserve admits a request only "
        "with its final KV free and never preempts (simulator/admission.py)",
    )
    batch_slot_at: Literal["admission", "join"] = Field(
        "admission",
        description="decode, admission reserve: when a request takes one of the max_batch_requests batch slots: "
        "at admission, with its memory, before its transfer (admission), or when it joins the batch (join: "
        "realrun/harness.py admits by memory alone before the transfer, so the KV moves and waits at the join "
        "for a slot, holding its memory); placement colocated moves no KV, so both are its scheduler's rule",
    )
    preemption: Literal["recompute", "swap"] = Field(
        "recompute",
        description="decode, on_demand: a preempted request's KV is dropped and its prompt + "
        "generated tokens prefilled again (recompute), or copied to host memory over PCIe and back (swap)",
    )
    prefix_caching: bool = Field(
        False,
        description="keep prompts' KV by prefix block (the workload's hash blocks) "
        "and skip what is cached: on prefill its compute, on decode its transfer, and a preempted request "
        "recomputes only its blocks evicted meanwhile (vLLM's automatic prefix caching; "
        "simulator/prefix_cache.py)",
    )
    prefix_cache_gib: float | None = Field(
        None,
        gt=0,
        le=2**30,
        description="with prefix_caching: a separate region of this many GiB per replica, taken out of "
        "the KV pool, holding prompts' prefix blocks only; null (default): the cache is the KV pool's free "
        "blocks, as in vLLM (a freed block keeps its hash until an allocation needs it); both count in "
        "the method's KV bytes (a compressed format caches more prefix)",
    )
    join_s_per_request: float = Field(
        0.0,
        ge=0,
        le=3600,
        description="decode: how much longer the iteration a request "
        "joins takes, per joining request (placing its received KV in the batch, the "
        "engine's bookkeeping)",
    )
    leave_s_per_request: float = Field(
        0.0,
        ge=0,
        le=3600,
        description="decode: how much longer the iteration after a request leaves the batch takes, per leaving "
        "request (realrun keeps its batch slots dense: the last running request's KV moves into the slot a "
        "finished one left, in the next iteration; an engine's own bookkeeping of a finish)",
    )
    kv_placement_gb_per_s: float = Field(
        0.0,
        ge=0,
        le=1e6,
        description="decode: the rate (GB/s, one way) at which the engine copies KV inside the decode GPU at a "
        "batch change: each joining request's received KV into its batch slot, and after requests leave the "
        "last running ones' KV into the slots they left (realrun keeps its slots dense: realrun/kvcopy.py); "
        "that iteration takes the bytes over this rate longer (GPU time, beside join_s_per_request and "
        "leave_s_per_request, the host's part). 0 (default): no such copy (the KV lands in its paged blocks, "
        "as through vLLM's KV connectors)",
    )
    prefill_efficiency: float = Field(
        1.0,
        gt=0,
        le=1,
        description="prefill: the fraction of the profile-priced GPU "
        "speed the engine's prefill reaches on the model's work (dense layers, FP16 attention, LM head: its time "
        "is the priced time over this); HACK's homomorphic attention kernel runs at its profiled price",
    )

    @model_validator(mode="before")
    @classmethod
    def _instance_gpu(cls, v: Any) -> Any:
        if isinstance(v, dict) and v.get("instance") is not None and v.get("gpu") is None:
            v = dict(v)
            v["gpu"] = _catalog_entry("instances", v["instance"])["gpu"]
        return v

    @field_validator("instance")
    @classmethod
    def _known_instance(cls, v: str | None) -> str | None:
        if v is not None:
            _catalog_entry("instances", v)
        return v

    @model_validator(mode="after")
    def _layout(self) -> PoolConfig:
        if self.gpu is None:
            raise ValueError("give an instance or a gpu")
        if self.max_batch_tokens < self.max_batch_requests:  # vLLM's SchedulerConfig refuses it too
            raise ValueError(
                f"max_batch_tokens ({self.max_batch_tokens}) must be at least max_batch_requests "
                f"({self.max_batch_requests}): every running request's decode row fits one step"
            )
        if self.instance is not None:
            per = catalog.entry("instances", self.instance)["gpus"]
            if self.tensor_parallel > per:
                raise ValueError(
                    f"tensor_parallel={self.tensor_parallel} exceeds the {per} GPUs of one {self.instance}"
                )
            if self.tensor_parallel * self.data_parallel > per:
                raise ValueError(
                    f"data_parallel={self.data_parallel} x tensor_parallel={self.tensor_parallel} GPUs exceed the "
                    f"{per} GPUs of one {self.instance} (an expert-parallel group spanning instances is not modelled)"
                )
        if self.peer_access is False:
            kind = self.interconnect or (
                catalog.entry("instances", self.instance)["gpu_interconnect"] if self.instance else None
            )
            if kind in ("nvlink", "nvswitch"):
                raise ValueError(f"peer_access false contradicts interconnect {kind} (NVLink is peer access)")
        if self.host is not None and self.host.memory_gib is not None and self.host_memory_gib is not None:
            raise ValueError("give host memory once: host.memory_gib or host_memory_gib")
        # Every catalog instance states its interconnect's bandwidth; a pool given by GPU that names NVLink
        # needs the GPU's NVLink rate or an explicit one (the defaults themselves: simulator/resolve.py).
        if (
            self.instance is None
            and self.interconnect in ("nvlink", "nvswitch")
            and self.gpu.nvlink_gb_per_s is None
            and self.intra_node_gb_per_s is None
        ):
            raise ValueError(
                f"interconnect {self.interconnect}: {self.gpu.preset or self.gpu.name or 'the GPU'} has no NVLink "
                f"(nvlink_gb_per_s null): give intra_node_gb_per_s"
            )
        return self

    @property
    def gpus_per_replica(self) -> int:
        """A replica's GPUs: all its data-parallel engines'."""
        return self.tensor_parallel * self.pipeline_parallel * self.data_parallel


# ---- network ----------------------------------------------------------------------------
class LinkConfig(_Strict):
    name: str = Field(description="label in outputs")
    prefill_replicas: list[int] = Field(
        min_length=1, max_length=4096, description="prefill replicas whose transfers use this link"
    )
    decode_replicas: list[int] = Field(min_length=1, max_length=4096, description="decode replicas this link reaches")
    bandwidth_gbps: Unlimited | None = Field(
        None, description="line rate (.inf: KV moves in no time); default: network.bandwidth_gbps"
    )


class NetworkConfig(_Strict):
    bandwidth_gbps: Unlimited | None = Field(
        default=None,
        description="line rate of each prefill replica's link, "
        "gigabits/s (.inf: KV moves in no time); default: the prefill "
        "instance's network",
    )
    latency_s: float = Field(default=1e-4, ge=0, le=3600, description="one-way latency added to each transfer")
    efficiency: float = Field(
        default=0.9,
        gt=0,
        le=1,
        description="achievable fraction of line rate for bulk transfers "
        "(multi-stream TCP on tuned 10-100 GbE: 0.8-0.95, reference_specs.yaml)",
    )
    per_flow_gbps: Unlimited | None = Field(
        default=None, description="cap on one transfer (AWS: 5 Gbps per TCP flow outside a placement group, 10 inside)"
    )
    round_robin_chunk_bytes: int = Field(
        default=0,
        ge=0,
        le=2**40,
        description="send the transfers in flight one chunk of this many bytes at a time, round robin, each chunk at "
        "the line rate (realrun's link thread, realrun/link.py: --chunk-mib); with several in flight they finish "
        "nearer to first come, first served than fair sharing gives. 0 (the default): fluid fair sharing",
    )
    stream_layers: bool = Field(
        default=False,
        description="send each layer's KV as soon as it is prefilled, so the transfer overlaps the rest of prefill",
    )
    links: list[LinkConfig] | None = Field(
        default=None,
        max_length=4096,
        description="explicit topology; default: one link per prefill replica reaching every decode replica",
    )
    kv_connector: Literal["host_parked", "nixl_pull", "p2p_push"] = Field(
        default="host_parked",
        description="where a prefilled request's KV waits for its decode replica (simulator/connectors.py): "
        "host_parked: in the prefill host's memory (prefill.host_memory_gib), the decode admits it before the "
        "transfer; nixl_pull (vLLM NixlConnector): in the prefill GPU's KV pool until the decode has read it, "
        "new prompts wait for pool room; p2p_push (vLLM P2pNcclConnector, PUT_ASYNC): pushed at once to a "
        "decode replica (round robin) into its GPU buffer (kv_buffer_gib, then its host pool, p2p_pool_gib), "
        "where it waits for decode memory; the prefill's next step waits for the push",
    )
    kv_buffer_gib: float | None = Field(
        default=None,
        gt=0,
        le=4096,
        description="kv_connector p2p_push: each decode replica's GPU receive buffer (vLLM kv_buffer_size), taken "
        "out of its KV pool; default vLLM's 1e9 bytes",
    )
    p2p_pool_gib: float | None = Field(
        default=None,
        gt=0,
        le=2**20,
        description="kv_connector p2p_push: pinned host memory on each decode replica for pushed KV the buffer "
        "cannot take (vLLM mem_pool_size_gb); default vLLM's 32",
    )
    link_busy_host_factor: float = Field(
        default=1.0,
        ge=1.0,
        le=10.0,
        description="where each replica's host work shares its process with the link's endpoint (realrun: the link "
        "is a Python thread beside the engine loop): while a transfer to or from the process is in flight, its host "
        "terms (decode loop gap, issue and join; prefill floor; quantize floor) take this factor plus "
        "link_busy_host_factor_per_gbps x the link's line rate (bandwidth_gbps); measured by realrun.hostcal "
        "--link-load-gbps, fitted by realrun.hostcal.fit_link_host. 1 and 0 (the defaults): off",
    )
    link_busy_host_factor_per_gbps: float = Field(
        default=0.0,
        ge=0.0,
        le=0.2,
        description="how the host factor while the link is busy grows with the link's rate, per Gbps (its chunks "
        "come that much more often); see link_busy_host_factor",
    )
    link_busy_host_factor_chunk_bytes: int = Field(
        default=0,
        ge=0,
        le=2**40,
        description="the round-robin chunk the per-Gbps growths (link_busy_host_factor_per_gbps, "
        "link_busy_prefill_host_factor_per_gbps) were measured with; where round_robin_chunk_bytes sends another "
        "chunk, link_busy_host_factor_chunk_share of each growth scales by this / round_robin_chunk_bytes (the link "
        "thread's host work goes mostly with chunks per second, not bytes: realrun.transient fit_xfer_chunks), up to "
        "link_busy_host_factor_max_chunks_per_s (a fluid link counts as sending this chunk). 0 (the default): the "
        "growths hold as given at any rate and chunk",
    )
    link_busy_host_factor_chunk_share: float = Field(
        default=CHUNK_SHARE,
        ge=0.0,
        le=1.0,
        description="the share of the per-Gbps growths that goes with the link's chunks per second, the rest with "
        "its bytes (see link_busy_host_factor_chunk_bytes); the default is the H200 host's, realrun.transient "
        "fit_xfer_chunks on realrun/traces/h200_xferwide",
    )
    link_busy_host_factor_max_chunks_per_s: Unlimited = Field(
        default=MAX_CHUNKS_PER_S,
        description="the chunk rate past which the chunk share of the growths stops growing (the link thread's host "
        "work per second levels off; the bytes' share goes on), with link_busy_host_factor_chunk_bytes set; "
        "the default is the H200 host's, realrun.transient fit_xfer_chunks on realrun/traces/h200_xferwide; "
        ".inf: no ceiling",
    )
    link_busy_prefill_host_factor: float | None = Field(
        default=None,
        ge=1.0,
        le=10.0,
        description="the prefill floor's own factor while the link is busy (its launches wait on the GIL less often "
        "than the decode loop's Python does: realrun.hostcal.fit_link_host measures both), plus "
        "link_busy_prefill_host_factor_per_gbps x the line rate; default: link_busy_host_factor's",
    )
    link_busy_prefill_host_factor_per_gbps: float | None = Field(
        default=None,
        ge=0.0,
        le=0.2,
        description="how the prefill floor's factor grows with the link's rate, per Gbps; default: "
        "link_busy_host_factor_per_gbps",
    )

    @model_validator(mode="after")
    def _connector_fields(self) -> NetworkConfig:
        if self.kv_connector != "p2p_push":
            for name in ("kv_buffer_gib", "p2p_pool_gib"):
                if getattr(self, name) is not None:
                    raise ValueError(f"{name}: only with kv_connector p2p_push, not {self.kv_connector}")
        return self


# ---- workload ---------------------------------------------------------------------------
class FixedLength(_Strict):
    kind: Literal["fixed"]
    tokens: int = Field(ge=1, le=2**30)


class UniformLength(_Strict):
    kind: Literal["uniform"]
    min_tokens: int = Field(ge=1, le=2**30)
    max_tokens: int = Field(ge=1, le=2**30)

    @model_validator(mode="after")
    def _order(self) -> UniformLength:
        if self.max_tokens < self.min_tokens:
            raise ValueError("max_tokens must be >= min_tokens")
        return self


class LognormalLength(_Strict):
    kind: Literal["lognormal"]
    mean_tokens: float = Field(gt=0, le=2**30, description="mean before truncation")
    cv: float = Field(gt=0, le=100, description="coefficient of variation before truncation")
    min_tokens: int = Field(ge=1, le=2**30)
    max_tokens: int = Field(ge=1, le=2**30)

    @model_validator(mode="after")
    def _order(self) -> LognormalLength:
        if self.max_tokens < self.min_tokens:
            raise ValueError("max_tokens must be >= min_tokens")
        return self


LengthDist = Annotated[FixedLength | UniformLength | LognormalLength, Field(discriminator="kind")]


class PoissonArrivals(_Strict):
    kind: Literal["poisson"]
    rate_rps: float = Field(ge=1e-6, le=1e6, description="mean requests per second")


class BurstyArrivals(_Strict):
    kind: Literal["bursty"]
    rate_rps: float = Field(ge=1e-6, le=1e6, description="mean requests per second")
    cv: float = Field(2.0, gt=1, le=100, description="coefficient of variation of gaps (gamma); 1 would be Poisson")


class TraceArrivals(_Strict):
    kind: Literal["trace"]


Arrivals = Annotated[PoissonArrivals | BurstyArrivals | TraceArrivals, Field(discriminator="kind")]


TRACE_FORMATS = ("azure", "burstgpt", "mooncake", "vllm_bench", "csv")


class TraceConfig(_Strict):
    """A recorded workload (simulator/traces.py reads each format): its arrivals and lengths replace the
    arrival process and the length distributions."""

    format: Literal["azure", "burstgpt", "mooncake", "vllm_bench", "csv"] = Field(
        description="azure: Azure LLM inference trace CSV (TIMESTAMP, ContextTokens, GeneratedTokens); burstgpt: "
        "BurstGPT CSV (Timestamp, Model, Request tokens, Response tokens, Total tokens, Log Type); mooncake: "
        "Mooncake JSONL (timestamp ms, input_length, output_length, hash_ids); vllm_bench: a vLLM benchmark result "
        "JSON (input_lens, output_lens; start_times, else request_rate); csv: arrival_s, prompt_tokens, output_tokens"
    )
    path: str = Field(description="the trace file, relative to the scenario file")
    rate_scale: float = Field(1.0, gt=0, le=1e6, description="replay this many times faster: gaps divided by it")
    start_s: float = Field(
        0.0,
        ge=0,
        le=1e12,
        description="skip requests arriving earlier than this, in seconds after the "
        "trace's first request (before rate_scale)",
    )
    duration_s: float | None = Field(
        None,
        gt=0,
        le=1e12,
        description="keep requests arriving within this many seconds "
        "after start_s (before rate_scale); default: to the end",
    )
    models: list[str] | None = Field(
        None, min_length=1, description="burstgpt: keep rows of these Model values (e.g. ChatGPT, GPT-4)"
    )
    log_types: list[str] | None = Field(
        None, min_length=1, description="burstgpt: keep rows of these Log Type values (Conversation log, API log)"
    )

    @model_validator(mode="after")
    def _filters(self) -> TraceConfig:
        if self.format != "burstgpt" and (self.models is not None or self.log_types is not None):
            raise ValueError(f"models and log_types filter BurstGPT traces only, not format {self.format}")
        return self


class PrefixSharing(_Strict):
    """Synthetic shared prefixes: each request belongs to one of `groups` (drawn uniformly from the run's
    generator) whose first `shared_tokens` prompt tokens it shares with the rest of its group (a system
    prompt, a document, an agent's context), identified by hash blocks as a Mooncake trace's are."""

    groups: int = Field(ge=1, le=2**31, description="how many distinct shared prefixes")
    shared_tokens: int = Field(
        ge=1,
        le=2**30,
        description="prompt tokens every request of a group shares (a shorter prompt shares its whole length)",
    )
    block_tokens: int = Field(
        512,
        ge=1,
        le=2**20,
        description="tokens per hash block; only whole blocks are shared (512: the Mooncake traces' hash_ids)",
    )


class WorkloadConfig(_Strict):
    dataset: str | None = Field(None, description="catalog/data/workloads.yaml key for the length distributions")
    input_tokens: LengthDist | None = Field(None, description="prompt length distribution (overrides dataset)")
    output_tokens: LengthDist | None = Field(None, description="output length distribution (overrides dataset)")
    trace_csv: str | None = Field(
        None,
        description="CSV with prompt_tokens, output_tokens and (for trace "
        "arrivals) arrival_s columns, relative to the scenario file",
    )
    trace: TraceConfig | None = Field(
        None,
        description="a recorded trace whose arrivals and lengths replace "
        "arrival, dataset, input_tokens and output_tokens",
    )
    arrival: Arrivals | None = Field(None, description="arrival process (not with trace)")
    requests: int | None = Field(
        None,
        ge=1,
        le=MAX_REQUESTS,
        description="requests to simulate (a trace is cycled "
        "or cut to this; with trace, default: the trace's requests)",
    )
    seed: int = Field(0, ge=0, le=2**63 - 1, description="seed of the one random generator of the run")
    prefix_sharing: PrefixSharing | None = Field(
        None,
        description="synthetic shared prompt prefixes for prefix caching (a Mooncake trace carries its own hash_ids)",
    )

    @model_validator(mode="before")
    @classmethod
    def _dataset(cls, v: Any) -> Any:
        if isinstance(v, dict) and v.get("dataset") is not None:
            e = _catalog_entry("workloads", v["dataset"])
            v = dict(v)
            v.setdefault("input_tokens", e["input_tokens"])
            v.setdefault("output_tokens", e["output_tokens"])
        return v

    @model_validator(mode="after")
    def _source(self) -> WorkloadConfig:
        if self.prefix_sharing is not None and self.trace is not None and self.trace.format == "mooncake":
            raise ValueError("prefix_sharing: a Mooncake trace carries its own prefix blocks (hash_ids)")
        if self.trace is not None:
            given = [
                k
                for k in ("dataset", "input_tokens", "output_tokens", "trace_csv", "arrival")
                if getattr(self, k) is not None
            ]
            if given:
                raise ValueError(f"trace replaces arrivals and lengths: drop {', '.join(given)}")
            return self
        if self.arrival is None:
            raise ValueError("give an arrival process (or a trace)")
        if self.requests is None:
            raise ValueError("give requests (only a trace has a default)")
        if self.trace_csv is None and (self.input_tokens is None or self.output_tokens is None):
            raise ValueError("give a dataset, input_tokens and output_tokens, a trace_csv, or a trace")
        if self.arrival.kind == "trace" and self.trace_csv is None:
            raise ValueError("trace arrivals need a trace_csv")
        return self


# ---- methods ----------------------------------------------------------------------------
# Each entry of `methods:` is a KV method model from costmodel/methods (one module per method; the
# union is the registry's), written as a bare name or a mapping with `name:`.


class ImplementationFactors(_Strict):
    """How long a method's steps take in the engine against what the kernel profile prices them at (factors),
    and the CPU time its own prefill launches add."""

    quantize: float = Field(1.0, gt=0, le=1000, description="the quantize / encode step after prefill")
    dequantize: float = Field(
        1.0, gt=0, le=1000, description="dequantization (every decode iteration, or once on arrival)"
    )
    approximation: float = Field(1.0, gt=0, le=1000, description="the homomorphic correction (prefill and decode)")
    prefill_issue_s_per_layer: float = Field(
        0.0,
        ge=0,
        le=3600,
        description="CPU time per layer and request to issue the "
        "method's own prefill kernels beyond the FP16 model's, where the engine "
        "issues prefill from the CPU, each request's attention apart (adds to the prefill pool's host floor)",
    )
    quantize_issue_s_per_layer: float = Field(
        0.0,
        ge=0,
        le=3600,
        description="CPU time per layer and request to issue the method's quantize and pack launches after prefill, "
        "where the engine issues them from the CPU for each request's KV: the quantize step lasts at least this per "
        "layer and request of its batch",
    )
    decode_kernels_per_layer: float = Field(
        0.0,
        ge=0,
        le=1000,
        description="small kernels per layer the method's decode step runs beyond its profiled kernel (e.g. its "
        "new token's quantize and pack run apart): each costs the decode pool's small-kernel time",
    )
    attention_padding_share: float = Field(
        0.0,
        ge=0,
        le=1,
        description="the share of the padding to the batch's longest context that the method's decode attention pays "
        "for, where its kernel sizes its split grid by the longest context: an iteration of B requests whose longest "
        "context is L and total S is priced at S + share x (B x L - S) context tokens (0: by the total alone, as the "
        "kernel profile times uniform batches); python -m realrun.transient --fit measures it from --mix runs",
    )


class CalibrationConfig(_Strict):
    prefill_profile: str = Field(
        default="auto",
        description="'auto' (the committed profile for the GPU, else roofline), "
        "'roofline', or a path to a profile.json",
    )
    decode_profile: str = Field(default="auto", description="as prefill_profile, for the decode pool")
    engine: str | None = Field(
        default=None,
        description="an engine calibration file (cli.py calibrate --traces), relative to "
        "the scenario file: the parameters it fitted replace the scenario's (decode host and "
        "loop-gap time, extra kernels, join time, prefill efficiency and host time, link "
        "efficiency and latency, implementation_factors); kernel profiles stay as they are",
    )
    engine_scopes: list[Literal["host", "gpu", "link"]] = Field(
        default_factory=lambda: ["host", "gpu", "link"],
        min_length=1,
        description="which of the engine file's fitted parameters apply, by scope: host (that machine's CPU "
        "time: loop gap, launches, floors, the busy link's levels), gpu (kernel factors, prefill efficiency, "
        "extra kernels) and link (efficiency, latency). On another machine with no runs of its own, ['gpu', "
        "'link'] carries what carries and keeps the scenario's host terms (measured there, e.g. realrun.hostcal); "
        "a machine refit (calibrate --base --refit machine) on runs there is better than either",
    )
    implementation_factors: dict[str, ImplementationFactors] = Field(
        default_factory=dict,
        description="per method name (baseline, kvquant, hack, ...): the engine's time for its "
        "quantize, dequantize and approximation steps over the profile's price",
    )
    host_speed_factor: float = Field(
        default=1.0,
        gt=0,
        le=100,
        description="this host's time for the engine's CPU work against the one the scenario's host terms (or "
        "calibration.engine's) were measured on: every host time term (the loop gap, launch and issue times, join "
        "and leave, the prefill's and the quantize step's floors) times this (1.25: a CPU 1.25x slower, 0.8: 1.25x "
        "faster; a machine refit's factor, calibrate --base --refit machine, is one). The terms stay as given "
        "(and calibration.engine's as fitted) in the scenario and scenario.json; the pricing multiplies them",
    )

    @field_validator("engine_scopes")
    @classmethod
    def _unique_scopes(cls, v: list) -> list:
        if len(set(v)) != len(v):
            raise ValueError(f"a scope named twice: {list(v)}")
        return v

    @field_validator("implementation_factors")
    @classmethod
    def _method_names(cls, v: dict) -> dict:
        unknown = sorted(set(v) - set(METHOD_REGISTRY))
        if unknown:
            raise ValueError(f"unknown method {unknown[0]!r} (methods: {', '.join(METHOD_REGISTRY)})")
        return v


# ---- faults -------------------------------------------------------------------------------
FAULT_KINDS = ("link_degradation", "link_outage", "prefill_replica_down", "decode_replica_down")


# The least a degraded link keeps: below it the run's times are not a slowdown but an outage that never ends
# (1e-300 of 10 Gbps "completed" with a mean JCT of 3e301 s); link_outage says that outright.
MIN_LINK_FACTOR = 1e-6


class FaultEvent(_Strict):
    """A timed fault: during [start_s, end_s) a link runs at `factor` of its capacity (link_degradation)
    or carries nothing (link_outage), or a replica is down (its work and the KV it holds are lost)."""

    kind: Literal["link_degradation", "link_outage", "prefill_replica_down", "decode_replica_down"] = Field(
        description="what fails"
    )
    target: str | int = Field(
        description="a link's name (p0, p1, ... by default, or network.links[].name) for "
        "the link kinds; a replica's index for the replica kinds (placement shared_gpu: either kind takes "
        "both phases of pair i down; colocated: either kind names a replica of both phases, 0 .. "
        "prefill.replicas + decode.replicas - 1)"
    )
    start_s: float = Field(ge=0, le=1e12, description="when the fault begins, simulated seconds")
    end_s: Unlimited = Field(description="when it ends (.inf: never)")
    factor: float | None = Field(
        None,
        ge=MIN_LINK_FACTOR,
        lt=1,
        description="link_degradation: the fraction of its capacity the link keeps, at least 1e-6 (a 10 Gbps "
        "link kept at 1e-6 moves a 1 GB KV in 9 days: anything less is an outage, link_outage)",
    )

    @model_validator(mode="after")
    def _shape(self) -> FaultEvent:
        if not self.end_s > self.start_s:
            raise ValueError(f"end_s ({self.end_s}) must be after start_s ({self.start_s})")
        if (self.factor is None) == (self.kind == "link_degradation"):
            raise ValueError("factor is required by link_degradation and taken by no other kind")
        link = self.kind.startswith("link")
        if link != isinstance(self.target, str):
            raise ValueError(f"{self.kind}: target must be " + ("a link's name" if link else "a replica's index"))
        return self


class FaultPolicy(_Strict):
    on_loss: Literal["resend", "reprefill", "fail"] = Field(
        default="reprefill",
        description="what happens to a request whose KV a fault destroys: resend (prefill hosts "
        "keep every request's KV until it finishes, so a lost decode replica or transfer is made good by sending "
        "it again; costs host memory), reprefill (the request's prefill runs again; prefill hosts drop the KV "
        "once it has arrived), fail (the request fails)",
    )
    max_retries: int = Field(default=3, ge=0, le=100, description="a request hit more often than this fails")


class Scenario(_Strict):
    name: str = Field(description="scenario name, used in outputs")
    description: str = Field("", description="what this scenario represents")
    model: ModelConfig
    prefill: PoolConfig = Field(
        None,  # type: ignore[assignment]  # filled in before validation (_colocated_prefill) or refused
        description="the prefill pool; required unless placement is colocated, where it defaults to the "
        "decode pool's settings with 0 replicas (the engines are then the decode pool's replicas)",
    )
    decode: PoolConfig
    network: NetworkConfig = Field(default_factory=NetworkConfig)
    workload: WorkloadConfig
    methods: list[MethodConfig] = Field(min_length=1, max_length=64)
    calibration: CalibrationConfig = Field(default_factory=CalibrationConfig)
    ttft_at: Literal["decode", "prefill"] = Field(
        "decode",
        description="where the client's first token comes from. decode: from the decode instance, at the "
        "end of the first decode iteration the request takes part in after its KV has arrived (vLLM's "
        "disaggregated serving: the prefill instance's token is discarded and the decode instance recomputes the "
        "last prompt position, so it runs one iteration per output token); prefill: the prefill instance's token, "
        "at the end of prefill (decode then runs one iteration per output token after the first)",
    )
    faults: list[FaultEvent] = Field(
        default_factory=list, max_length=10_000, description="timed faults (see FaultEvent); none by default"
    )
    fault_policy: FaultPolicy = Field(
        default_factory=FaultPolicy, description="what happens to the requests a fault hits"
    )
    placement: Literal["separate", "shared_gpu", "colocated"] = Field(
        "separate",
        description="separate: prefill and decode on their own GPUs; shared_gpu: prefill replica i "
        "and decode replica i share the same GPUs in one process and take turns: a waiting prefill batch runs at "
        "the next decode iteration boundary, one batch per boundary (how realrun measures on one GPU); "
        "colocated: every replica of both pools (prefill.replicas + decode.replicas engines; the prefill pool "
        "may be left out, or given 0 replicas) serves both phases as one vLLM engine configured as the decode "
        "pool, each step its decode rows plus prompt chunks within max_batch_tokens, no KV transfer "
        "(simulator/colocated.py, simulator/scheduler.py)",
    )

    @model_validator(mode="before")
    @classmethod
    def _colocated_prefill(cls, v: Any) -> Any:
        """placement colocated without a prefill pool: the engines are the decode pool's replicas alone."""
        if isinstance(v, dict) and v.get("prefill") is None:
            if v.get("placement") != "colocated":
                raise ValueError("prefill: required unless placement is colocated")
            if isinstance(v.get("decode"), dict):
                v = {**v, "prefill": {**v["decode"], "replicas": 0}}
        return v

    @field_validator("methods", mode="before")
    @classmethod
    def _method_names(cls, v: Any) -> Any:
        if isinstance(v, list):
            return [{"name": m} if isinstance(m, str) else m for m in v]
        return v

    def _data_parallel_decode(self) -> None:
        """decode.data_parallel > 1: what simulator/data_parallel.py models (ValueError naming the field)."""
        d = self.decode
        if not (self.model.experts and d.expert_parallel):
            raise ValueError(
                "decode.data_parallel: data-parallel engines are modelled for a mixture of experts with "
                "decode.expert_parallel: true (a dense model's engines are independent: use decode.replicas)"
            )
        if d.pipeline_parallel > 1:
            raise ValueError("decode.data_parallel: engines of one pipeline stage only (pipeline_parallel: 1)")
        if self.placement != "separate":
            raise ValueError(f"decode.data_parallel: modelled with placement separate, not {self.placement}")
        if self.faults:
            raise ValueError("decode.data_parallel: faults are not modelled on data-parallel engines")
        if d.prefix_caching or self.prefill.prefix_caching:
            raise ValueError("decode.data_parallel: prefix caching is not modelled with data-parallel engines")

    def _link_busy_host(self) -> None:
        """network.link_busy_host_factor: what simulator/link.py (EndpointHost) models (ValueError naming the field)."""
        for why, bad in (
            ("placement colocated (no KV moves)", self.placement == "colocated"),
            ("network.links (one link rate per scenario)", self.network.links is not None),
            ("faults", bool(self.faults)),
            ("decode.data_parallel", self.decode.data_parallel > 1),
            ("network.bandwidth_gbps .inf", self.network.bandwidth_gbps == math.inf),
        ):
            if bad:
                raise ValueError(f"network.link_busy_host_factor: not modelled with {why}")

    def _connector(self) -> None:
        """network.kv_connector other than host_parked: what simulator/connectors.py models (ValueError)."""
        c = self.network.kv_connector
        if self.placement == "colocated":
            raise ValueError(f"network.kv_connector: {c}: placement colocated transfers no KV")
        if c == "p2p_push":
            for why, bad in (
                ("decode.data_parallel", self.decode.data_parallel > 1),
                ("faults", bool(self.faults)),
                ("prefix caching", self.decode.prefix_caching or self.prefill.prefix_caching),
                # each stage waits for its own layers' pushes (wait_for_save per worker): not the replica-wide wait
                ("prefill.pipeline_parallel > 1", self.prefill.pipeline_parallel > 1),
            ):
                if bad:
                    raise ValueError(f"network.kv_connector: p2p_push is not modelled with {why}")

    @model_validator(mode="after")
    def _consistent(self) -> Scenario:
        names = [m.output_name for m in self.methods]
        if len(set(names)) != len(names):
            raise ValueError(f"methods: duplicate output names {names}; give each a distinct label")
        for i, m in enumerate(self.methods):
            if m.output_name == REFERENCE and m.name != REFERENCE:
                raise ValueError(
                    f"methods.{i}.label: {REFERENCE!r} names the comparison base (FP16 KV), which every change is "
                    f"measured against; give this {m.name} another label"
                )
        from .implementations import implementation_refusal

        for i, m in enumerate(self.methods):
            why = implementation_refusal(m)
            if why:
                raise ValueError(f"methods.{i}.implementation: {why}")
        if self.network.links is not None:
            for link in self.network.links:
                for r in link.prefill_replicas:
                    if not 0 <= r < self.prefill.replicas:
                        raise ValueError(f"network.links[{link.name}]: prefill replica {r} does not exist")
                for r in link.decode_replicas:
                    if not 0 <= r < self.decode.replicas:
                        raise ValueError(f"network.links[{link.name}]: decode replica {r} does not exist")
        if self.decode.replicas < 1:
            raise ValueError("decode.replicas: a scenario needs at least one decode replica")
        if self.placement == "colocated":
            p, d = self.prefill, self.decode
            if (p.gpu, p.tensor_parallel, p.pipeline_parallel) != (d.gpu, d.tensor_parallel, d.pipeline_parallel):
                raise ValueError(
                    "placement colocated runs both phases on every replica of both pools: give them the "
                    "same gpu, tensor_parallel and pipeline_parallel"
                )
            for name in ("chunk_tokens", "prefix_caching", "prefix_cache_gib"):
                if getattr(p, name) != getattr(d, name):
                    raise ValueError(
                        f"prefill.{name}: placement colocated runs every engine as the decode pool is "
                        f"configured; give decode.{name} the same value (or leave the prefill pool out)"
                    )
        elif self.prefill.replicas < 1:
            raise ValueError("prefill.replicas: 0 prefill replicas only with placement colocated")
        if self.placement == "shared_gpu" and self.prefill.replicas != self.decode.replicas:
            raise ValueError(
                "placement shared_gpu pairs prefill and decode replicas: give both pools the same number of replicas"
            )
        if self.prefill.data_parallel > 1:
            raise ValueError("prefill.data_parallel: data-parallel engines are modelled on the decode pool only")
        for name in ("host_exposed_s_per_iteration", "host_exposed_s_per_layer"):
            if getattr(self.decode, name) and self.placement != "colocated":
                raise ValueError(
                    f"decode.{name}: a prefill's exposed CPU time; give it on the prefill pool (the decode pool's "
                    f"applies to the prefills of placement colocated only, not {self.placement})"
                )
        for name in ("host_first_seen_s_per_iteration", "host_first_seen_fade_s"):
            if getattr(self.decode, name):
                raise ValueError(
                    f"decode.{name}: a prefill replica's; give it on the prefill pool (a colocated replica's "
                    "prefills do not model it)"
                )
        slowdowns = ("after_prefill_slowdown_fraction", "after_prefill_saturation_s", "after_prefill_clock_fraction")
        for name in slowdowns:
            if getattr(self.prefill, name):
                raise ValueError(
                    f"prefill.{name}: it slows the decode iterations after a prefill; give it on the decode pool"
                )
        for name in slowdowns:
            if getattr(self.decode, name) and self.placement != "shared_gpu":
                raise ValueError(
                    f"decode.{name}: a decode slowdown after a prefill on the same GPU applies "
                    f"to placement shared_gpu only, not {self.placement}"
                )
        if self.decode.data_parallel > 1:
            self._data_parallel_decode()
        if self.network.kv_connector != "host_parked":
            self._connector()
        n = self.network
        if (
            n.link_busy_host_factor != 1.0
            or n.link_busy_host_factor_per_gbps != 0.0
            or n.link_busy_prefill_host_factor not in (None, 1.0)
            or n.link_busy_prefill_host_factor_per_gbps not in (None, 0.0)
        ):
            self._link_busy_host()
        if self.prefill.batch_slot_at != "admission":
            raise ValueError("prefill.batch_slot_at: a decode pool's setting (a prefill replica does not join a batch)")
        if self.decode.batch_slot_at == "join" and self.placement != "colocated":  # colocated: no transfer, the same
            if self.decode.admission != "reserve" or self.decode.data_parallel > 1:
                raise ValueError(
                    "decode.batch_slot_at: join is modelled with decode.admission reserve and one engine per decode "
                    "replica (realrun's rule)"
                )
        for pool_name in ("prefill", "decode"):
            pool = getattr(self, pool_name)
            if pool.expert_parallel:
                if not self.model.experts:
                    raise ValueError(f"{pool_name}.expert_parallel: {self.model.name} is not a mixture of experts")
                if self.model.experts % (pool.tensor_parallel * pool.data_parallel):
                    raise ValueError(
                        f"{pool_name}.expert_parallel: {self.model.experts} experts do not spread evenly "
                        f"over tensor_parallel={pool.tensor_parallel} x data_parallel={pool.data_parallel} GPUs"
                    )
        if self.network.bandwidth_gbps is None and self.prefill.instance is None and self.needs_network:
            raise ValueError("network.bandwidth_gbps is required when the prefill pool names no instance")
        links = (
            [link.name for link in self.network.links]
            if self.network.links is not None
            else [f"p{p}" for p in range(self.prefill.replicas)]
        )
        colocated_replicas = self.engines
        for i, f in enumerate(self.faults):
            if isinstance(f.target, str):  # a link kind (FaultEvent: link kinds name a link, replica kinds an index)
                if self.placement == "colocated":
                    raise ValueError(
                        f"faults.{i}.kind: {f.kind}: placement colocated has no link (no KV is transferred)"
                    )
                if f.target not in links:
                    raise ValueError(f"faults.{i}.target: no link {f.target!r} (links: {', '.join(links)})")
            elif self.placement == "colocated":  # either replica kind: a replica runs both phases
                if not 0 <= f.target < colocated_replicas:
                    raise ValueError(
                        f"faults.{i}.target: no colocated replica {f.target} (placement colocated has "
                        f"prefill.replicas + decode.replicas = {colocated_replicas})"
                    )
            else:
                pool = self.prefill if f.kind == "prefill_replica_down" else self.decode
                if not 0 <= f.target < pool.replicas:
                    raise ValueError(
                        f"faults.{i}.target: no {f.kind.split('_')[0]} replica {f.target} (the pool has {pool.replicas})"
                    )
        return self

    @property
    def engines(self) -> int:
        """placement colocated: the engines serving both phases (every replica of both pools)."""
        return self.prefill.replicas + self.decode.replicas

    @property
    def needs_network(self) -> bool:
        """Whether anything crosses the network: KV transfers, or a colocated engine's pipeline stages."""
        return self.placement != "colocated" or self.decode.pipeline_parallel > 1


# ---- loading ----------------------------------------------------------------------------
def set_path(tree: dict, dotted: str, value: Any) -> None:
    """Set `a.b.0.c` in a raw scenario tree; a preset name on the way becomes a mapping (a method
    name `{name: ...}`, any other `{preset: ...}`), so its fields can be overridden."""
    keys = dotted.split(".")
    if not all(k.strip() for k in keys):
        raise ScenarioError(f"{dotted!r}: empty field name in the path")
    node: Any = tree
    for depth, k in enumerate(keys[:-1]):
        node = _child(node, k, keys[depth - 1] if depth else None, dotted)
    last = keys[-1]
    if isinstance(node, list):
        node[_index(node, last, dotted)] = copy.deepcopy(value)
    elif isinstance(node, dict):
        node[last] = copy.deepcopy(value)
    else:
        raise ScenarioError(f"{dotted}: cannot set {last!r} in a {type(node).__name__}")


def _index(node: list, k: str, dotted: str) -> int:
    try:
        i = int(k)
        node[i]
    except (ValueError, IndexError):
        raise ScenarioError(f"{dotted}: no element {k} in a list of {len(node)}") from None
    return i


def _child(node: Any, k: str, parent_key: str | None, dotted: str) -> Any:
    if isinstance(node, list):
        i = _index(node, k, dotted)
        child = node[i]
        if isinstance(child, str):
            node[i] = child = {"name": child} if parent_key == "methods" else {"preset": child}
        return child
    if not isinstance(node, dict):
        raise ScenarioError(f"{dotted}: cannot go into {k!r} of a {type(node).__name__}")
    child = node.get(k)
    if child is None:
        node[k] = child = {}
    elif isinstance(child, str):
        node[k] = child = {"preset": child}
    elif not isinstance(child, (dict, list)):
        raise ScenarioError(f"{dotted}: {k} is a {type(child).__name__}, not a mapping or list")
    return child


def apply_overrides(raw: dict, overrides: list[str]) -> dict:
    """`path.to.field=value` pairs; values parsed as YAML (so `10`, `true`, `[a, b]` work)."""
    for item in overrides:
        path, parsed = files.parse_override(item, ScenarioError)
        try:
            set_path(raw, path, parsed)
        except ScenarioError as e:
            raise ScenarioError(f"--set {files.shown(item)}: {e}") from None
    return raw


def _tags(union: Any, field: str) -> set[str]:
    """The discriminator values of an Annotated discriminated union of models."""
    return {t for cls in get_args(get_args(union)[0]) for t in get_args(cls.model_fields[field].annotation)}


# Discriminator values pydantic puts into an error's location; the one-line message leaves them out.
_UNION_TAGS = _tags(LengthDist, "kind") | _tags(Arrivals, "kind") | set(METHOD_REGISTRY)


def parse_scenario(raw: Any, source: str) -> Scenario:
    if not isinstance(raw, dict):
        raise ScenarioError(f"{source}: scenario: expected a mapping at the top level")
    try:
        return Scenario.model_validate(raw)
    except ValidationError as e:
        raise ScenarioError(first_error(source, e)) from None
    except KeyError as e:  # an unknown preset key raised by a before-validator outside pydantic's wrapping
        raise ScenarioError(f"{source}: {e.args[0]}") from None


def read_yaml(path: Path, error: type[Exception] = ScenarioError, what: str = "scenario file") -> Any:
    """A YAML file's content; a missing, binary or malformed file, or an alias bomb, raises `error`
    with a one-line message (see simulator.files)."""
    return files.read_yaml(path, error, what)


def first_error(source: str, err: ValidationError, what: str = "scenario") -> str:
    """One line for a pydantic error: source, dotted field, message (and how many more)."""
    first = err.errors()[0]
    loc = ".".join(_cut(str(p)) for p in first["loc"] if not (isinstance(p, str) and p in _UNION_TAGS))
    msg = "unknown field" if first["type"] == "extra_forbidden" else first["msg"].removeprefix("Value error, ")
    msg = re.sub(r"'([^'\n]{81,})'", lambda m: files.shown(m.group(1)), msg)  # a quoted 5,000-character input
    more = len(err.errors()) - 1
    tail = f" (and {more} more)" if more else ""
    return f"{source}: {loc or what}: {msg}{tail}"


def _cut(name: str, limit: int = 80) -> str:
    """A field name for a one-line message: a long one (a key a fuzzer made) cut to its start and length."""
    return name if len(name) <= limit else f"{name[: limit // 2]}... ({len(name):,} characters)"
