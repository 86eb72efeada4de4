"""Per-phase costs of one model replica: prefill of a batch, one decode iteration, transfer, memory.

What is modelled (per GPU of a replica laid out as TP × PP):
* GEMMs (QKV, O, MLP, LM head) as a roofline: max(FLOPs / achieved matmul rate, bytes / achieved
  memory bandwidth) plus one launch overhead; weights are read once per GEMM.  With a measured
  ``gemm`` fit the rates are the ones reached at real layer shapes (weight streaming at decode's
  few rows, large tiles at prefill's thousands).
* The elementwise kernels of an unfused (PyTorch-style) Llama layer: two RMSNorms, RoPE (multiply,
  rotate, multiply-add), SiLU, the gate product and two residual adds: memory-bound, priced per
  kernel by the profile's ``elementwise`` fit (launch + bytes).
* Host issue (decode): an engine that issues each iteration from the CPU (a Python loop, eager
  launches) keeps the GPU waiting when issuing takes longer than the GPU work; an iteration then
  takes ``max(GPU time, host time)`` with host time = per iteration + per layer + per request,
  the scenario's decode.host_issue_s_* (0 for an engine that replays CUDA graphs); CPU work between
  iterations that the GPU waits for (an engine that synchronises on each iteration's tokens and then
  schedules the next) adds decode.host_serial_s_per_iteration to every iteration.
* What an engine adds to the kernels' prices (an engine calibration fitted from its measured runs,
  simulator/engine.py): its prefill reaches ``prefill_efficiency`` of the priced GPU speed on the model's work
  (dense layers, FP16 attention, LM head, the quantize inside a homomorphic forward: the kernels that hold the
  H200 in its power cap) while HACK's homomorphic attention runs at its profiled price (realrun.prefillcal:
  realrun/traces/h200_transient/prefillcal.csv) and, issued
  from the CPU, lasts at least the prefill pool's host_issue_s_* time; its quantize, dequantize and
  homomorphic-correction steps take ``*_factor`` times the profile's price, its own prefill launches add
  ``method_prefill_issue_s_per_layer`` per layer and request to the prefill host floor (and a batch issued eagerly
  exposes ``host_exposed_s_per_iteration`` + ``host_exposed_s_per_layer`` per layer of CPU time even where its GPU
  work is the longer: ``max(GPU + exposed, host)``), its quantize step lasts at
  least ``method_quantize_issue_s_per_layer`` per layer and request (launches issued one by one, for each request's
  attention and KV: realrun/harness.py, Harness.prefill, loops over the batch's requests in every layer and over
  them again to encode each one's KV into its send buffer); the iteration a request joins
  takes ``join_s_per_request`` longer per joining request (the simulator adds it: decode.py).
* Attention by the calibration profile's kernel fits, in the profile's canonical units; prefill attention
  in the form the method picks for each prompt (FP16 FlashAttention, or HACK's homomorphic kernel).
* Mixture of experts (MoE models): a layer's MLP is a router and E experts of which each token uses k;
  a batch of T tokens reads the weights of the E·(1 − (1 − k/E)^T) experts it touches in expectation
  under uniform routing (all E at prefill's thousands of tokens, k at batch 1), in one grouped GEMM per
  projection; the experts are tensor-parallel slices (all-reduce after) or, with expert parallelism,
  whole experts spread over the TP GPUs with an all-to-all dispatch and combine (`_moe_s`), or over the
  GPUs of a data-parallel group of engines that step in lock-step, padded to the largest engine's batch
  (costmodel/expert_parallel.py, `lockstep_iteration`).
* Tensor-parallel all-reduce after attention and after the MLP, by the algorithm an engine uses for
  that size on that interconnect (one-shot, two-shot or NCCL's ring: costmodel/collectives.py), each
  a latency plus bytes over a bandwidth with constants fitted to cited measurements.
* Pipeline parallelism: a batch visits every stage in turn, the activations crossing to the next
  stage's instance by a send/recv over the network (collectives.sendrecv_s); a replica accepts the
  next prefill batch after the bottleneck stage (`stage_s`), the batch is done after `latency_s`.
* Decode iteration GPU time for a batch of size B with total context S is exactly
  ``fixed(B) + per_ctx * S``: weights and per-launch overheads do not depend on context, and
  every attention kernel is linear in the KV it visits; with host issue the iteration is
  ``max(fixed(B) + per_ctx * S, host(B))``. The simulator relies on this to advance many
  iterations in closed form.
* The HACK correction ("approximation") is priced from its op count (hack_method.md) at the
  CUDA-core rate and split out of the attention kernel's measured time, never added on top.
* Memory as vLLM sizes its KV pool (costmodel/memory.py): gpu_memory_utilization × memory − weights −
  the activation peak of the profile run at max_batch_tokens − non-torch memory − CUDA graphs, in whole
  blocks of block_tokens tokens; a request holds whole blocks of its prompt + output tokens.
"""

from __future__ import annotations

import math
from array import array
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import NamedTuple, overload

import numpy as np

from . import collectives, expert_parallel
from .calibration import CalibrationProfile, KernelFit
from .memory import DEFAULT_BLOCK_TOKENS, MemoryBudget, kv_blocks, memory_budget
from .methods import PREFILL_KERNELS, DecodeEnv, KVMethod
from .roofline import alu_instr_per_s
from .specs import FP16_BYTES, GIB, GPUSpec, ModelSpec, Parallelism

CPU_FLOPS_PER_VCPU = 20e9  # K-Means distance FLOPs per vCPU-second: AVX2 FMA peak ≈ 40 GFLOP/s per
# vCPU at 2.5 GHz (2 vCPUs per core), half of it sustained (an assumption)
PREFILL_MEMO_ENTRIES = 4096  # prefill costs remembered per replica model (batches repeat in short runs)
CHUNKS_MEMO_ENTRIES = 1 << 15  # mixed steps' chunk attention remembered per replica model (~200 bytes each)
ONE_PROMPT_TABLE_TOKENS = 1 << 17  # one-prompt batches priced from a table by length below this (5 MB at most)
_ONE_PROMPT_FIELDS = 5  # ReplicaCostModel._one_prompt_prefill: stage_s, latency_s, approximation_s, encode_s, form
ONE_PROMPT_BLOCK = 1024  # one-prompt batches priced this many lengths at a time (_one_prompt_block)
_FORMS = tuple(PREFILL_KERNELS)  # the prefill forms by code (KVMethod.prefill_form_codes)
_HOMOMORPHIC = _FORMS.index("homomorphic")
_ONE_FORM = tuple((form,) for form in PREFILL_KERNELS)  # a one-prompt batch's forms, by code
_FORM_CODES = {form: float(i) for i, form in enumerate(PREFILL_KERNELS)}
ENTROPY_CODING_INSTR_PER_ELEMENT = 60.0  # arithmetic (de)coding per 2-bit symbol on CUDA cores (CDF lookup,
# range update, renormalise, bit I/O); an assumption, stated as such


def kv_heads_per_gpu(model: ModelSpec, parallel: Parallelism) -> int:
    """KV heads each GPU of a tensor-parallel group holds (whole heads: replicated when TP exceeds them)."""
    return math.ceil(model.kv_heads / parallel.tensor)


class ModelDoesNotFit(ValueError):
    """The model's weights leave no room for KV on this pool's GPUs."""


class PrefillCost(NamedTuple):  # a tuple: built once per prefill batch, so built cheaply
    stage_s: float  # the replica is busy this long before it can take the next batch
    latency_s: float  # first token of the batch is ready this long after the batch starts
    approximation_s: float  # part of latency_s spent on the homomorphic correction
    encode_s: float  # quantize / entropy-encode after the forward pass (replica busy too)
    forms: tuple[str, ...] = ()  # the prefill attention form each prompt of the batch ran (PREFILL_KERNELS)


@dataclass(frozen=True)
class _PrefillTerms:
    """The parts of a prefill batch's price that do not depend on the batch (ReplicaCostModel._prefill_terms)."""

    flops_per_pair: float  # attention FLOPs per (query, key) pair on one GPU, one layer
    form_of: Callable[[float], str]  # the method's prefill form for a prompt of that many attention FLOPs
    fits: dict[str, KernelFit]  # the profile's kernel of each prefill form it has
    q_heads_per_gpu: float
    approx_ops_per_pair: float  # the homomorphic form's correction
    alu_instr_per_s: float
    layers_per_stage: int
    batch: dict[int, tuple[float, float]]  # requests -> (LM head s after efficiency, host floor s), as asked


@dataclass(frozen=True)
class IterationCost:
    """One decode iteration costs fixed_s + per_ctx_s * (sum of the batch's context tokens),
    split into decode, dequantize and approximation parts with the same linear form."""

    decode_fixed_s: float
    decode_per_ctx_s: float
    dequant_per_ctx_s: float
    approx_fixed_s: float
    approx_per_ctx_s: float
    dequant_fixed_s: float = 0.0  # per iteration whatever the context (e.g. requantizing each open V block)
    fetch_fixed_s: float = 0.0  # host -> GPU fetches (offload methods): included in decode_*, kept
    fetch_per_ctx_s: float = 0.0  # apart so reports can show them
    host_s: float = 0.0  # CPU time to issue the iteration: the iteration lasts at least this
    fixed_s: float = field(init=False)  # decode + dequantize + approximation: summed once (the simulator's hot path)
    per_ctx_s: float = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "fixed_s", self.decode_fixed_s + self.dequant_fixed_s + self.approx_fixed_s)
        object.__setattr__(self, "per_ctx_s", self.decode_per_ctx_s + self.dequant_per_ctx_s + self.approx_per_ctx_s)

    def time_s(self, total_ctx_tokens: float) -> float:
        return max(self.fixed_s + self.per_ctx_s * total_ctx_tokens, self.host_s)

    def with_decode_fixed_added(self, added_s: float) -> IterationCost:
        """This iteration with `added_s` more fixed decode time (a mixed step's chunks): what
        `dataclasses.replace(self, decode_fixed_s=self.decode_fixed_s + added_s)` builds, the same sums in the
        same order, without the frozen dataclass's __init__ (a colocated run builds one for most of its steps)."""
        fields = dict(self.__dict__)
        decode_fixed_s = fields["decode_fixed_s"] = self.decode_fixed_s + added_s
        fields["fixed_s"] = decode_fixed_s + self.dequant_fixed_s + self.approx_fixed_s
        out = object.__new__(IterationCost)
        object.__setattr__(out, "__dict__", fields)
        return out


_NO_ITERATION = IterationCost(0.0, 0.0, 0.0, 0.0, 0.0, host_s=0.0)  # a mixed step without decode rows


@dataclass(frozen=True, eq=False, kw_only=True)
class ReplicaCostModel:
    """All costs of one replica (model × GPU × parallelism × KV method × profile).

    Results are memoised per instance (prefill by batch, iterations by batch size, dense layers by
    token count): the simulator asks the same questions many times. Identity-hashed on purpose.
    """

    model: ModelSpec
    gpu: GPUSpec
    parallel: Parallelism
    method: KVMethod
    profile: CalibrationProfile
    gpu_memory_utilization: float = 0.9
    max_batch_tokens: int = 16384
    host_vcpus: int = 0  # CPUs of the replica's hosts (PQCache's K-Means runs there)
    kv_capacity_override_bytes: float | None = None  # a fixed, pre-allocated KV pool per replica
    host_issue_s_per_iteration: float = 0.0  # CPU issue time of a decode iteration (see the module doc)
    host_issue_s_per_layer: float = 0.0
    host_issue_s_per_request: float = 0.0
    host_serial_s_per_iteration: float = 0.0  # CPU work between iterations while the GPU idles
    # prefill, issued eagerly: CPU time the GPU cannot overlap even where its work is the longer (the batch's first
    # launches before any GPU work is queued, the closing sync; per layer, the gaps between eagerly issued kernels)
    host_exposed_s_per_iteration: float = 0.0
    host_exposed_s_per_layer: float = 0.0
    # prefill: CPU time a batch of a token count the replica's process has not run before adds to its host floor
    # (cuBLAS's kernel choice for a new GEMM row count); the replica (simulator/prefill.py) charges it
    host_first_seen_s_per_iteration: float = 0.0
    # where the batch's GPU work (T s) is the longer, exp(-T / this) of that time still adds to it (0: none)
    host_first_seen_fade_s: float = 0.0
    extra_kernels_per_layer: int = 0  # engine-specific small kernels per decode layer (copies, gathers)
    # decode iterations replayed as CUDA graphs (vLLM without --enforce-eager, SGLang): small kernels cost the
    # in-graph overhead (_small_kernel_s); False prices every kernel as launched
    decode_graphs: bool = False
    max_batch_requests: int = 256  # most requests per batch (vLLM's max_num_seqs): sizes the sampler run
    block_tokens: int = DEFAULT_BLOCK_TOKENS  # KV tokens per block (vLLM's --block-size)
    cuda_graph_bytes: float = 0.0  # per GPU, subtracted from the KV pool (costmodel/memory.py)
    non_torch_override_bytes: float | None = None  # per GPU: replaces the non-torch estimate
    # What the engine adds to the kernels' prices (an engine calibration, simulator/engine.py; see the module doc)
    join_s_per_request: float = 0.0  # decode: extra time of the iteration a request joins, per request
    leave_s_per_request: float = 0.0  # decode: extra time of the iteration after a request leaves, per request
    # decode: the engine's KV copies inside the GPU at a batch change (a join's KV into its slot, a leaver's slot
    # refilled), bytes per second one way; 0: none (placement_s)
    kv_placement_bytes_per_s: float = 0.0
    prefill_efficiency: float = 1.0  # prefill: fraction of the priced GPU speed reached
    quantize_factor: float = 1.0  # the engine's quantize / dequantize / correction time over the
    dequantize_factor: float = 1.0  # profile's price
    approximation_factor: float = 1.0
    method_prefill_issue_s_per_layer: float = 0.0  # CPU time per layer and request of the method's own prefill launches
    method_quantize_issue_s_per_layer: float = 0.0  # CPU time per layer and request to issue its quantize and pack
    method_decode_kernels_per_layer: float = 0.0  # small kernels per decode layer the method runs beyond its fit
    # decode: the share of the padding to the batch's longest context its attention pays for (priced_context)
    attention_padding_share: float = 0.0

    # per-instance cost caches (prefill by batch, iterations by batch size, dense layers by token count)
    _memo: dict = field(default_factory=lambda: {"prefill": {}, "iteration": {}, "dense": {}}, init=False, repr=False)

    # ---- layout -------------------------------------------------------------------------
    @property
    def kv_heads_per_gpu(self) -> int:
        return kv_heads_per_gpu(self.model, self.parallel)

    @property
    def q_heads_per_gpu(self) -> float:
        return self.model.heads / self.parallel.tensor

    @property
    def kv_replication(self) -> float:
        """KV copies across TP ranks: >1 when tp exceeds the KV heads."""
        return self.kv_heads_per_gpu * self.parallel.tensor / self.model.kv_heads

    # ---- building blocks ----------------------------------------------------------------
    def gemm_s(self, m, n: float, k: float, dtype_bytes: float = FP16_BYTES):
        """Roofline time of an (m × k) @ (k × n) GEMM; m may be a numpy array of row counts."""
        return self._matmul_s(2.0 * m * n * k, dtype_bytes * (n * k + m * k + m * n))

    def _matmul_s(self, flops, bytes_):
        """One matmul launch doing `flops` and moving `bytes_` (numpy arrays allowed), at the profile's
        GEMM rates: the larger of the two times plus the launch overhead."""
        p, g = self.profile, self.profile.gemm
        ce, me, ov = (
            (1.0, 1.0, p.launch_overhead_s) if g is None else (g.compute_efficiency, g.memory_efficiency, g.overhead_s)
        )
        compute_s = flops / (p.matmul_fp16_tflops * 1e12 * ce)
        memory_s = bytes_ / (p.memory_gbps * 1e9 * me)
        if isinstance(compute_s, float) and isinstance(memory_s, float):
            return ov + max(compute_s, memory_s)
        return ov + np.maximum(compute_s, memory_s)

    def elementwise_layer_s(self, tokens):
        """The layer's memory-bound elementwise kernels on one GPU (tokens may be a numpy array).
        Bytes read + written per token, FP16: RMSNorm 2h (x2), RoPE on the q and k heads: multiply
        2r, rotate 2r, multiply-add 3r (r = q + kv dims per GPU), SiLU 2i, gate product 3i, residual
        add 3h (x2); h hidden, i intermediate per GPU.  Nine kernels."""
        m, tp, p = self.model, self.parallel.tensor, self.profile
        h, r = m.hidden_size, (m.q_dim + m.kv_dim) / tp
        i = m.mlp_width_per_token / tp if m.mlp == "gated" else 0.0
        bytes_per_token = FP16_BYTES * (2 * 2 * h + 7 * r + (2 * i + 3 * i) + 2 * 3 * h)
        if m.is_moe:
            # routing (softmax + top-k), the permutation of each token's k copies into expert order and the
            # weighted sum back: three more kernels; permute reads and writes k hidden rows, the sum reads
            # k and writes one
            k = m.active_experts
            bytes_per_token += FP16_BYTES * (2 * k * h + (k + 1) * h)
        fit = p.kernels.get("elementwise")
        s_per_byte = 1.0 / (p.memory_gbps * 1e9) if fit is None else fit.s_per_unit
        return self._elementwise_kernels() * self._small_kernel_s() + s_per_byte * tokens * bytes_per_token

    def _elementwise_kernels(self) -> int:
        """The layer's elementwise kernels (elementwise_layer_s): nine (seven with a plain MLP), three more for MoE."""
        m = self.model
        return (9 if m.mlp == "gated" else 7) + (3 if m.is_moe else 0)

    def _small_kernel_s(self, in_graph: bool = False) -> float:
        """One tiny memory-bound kernel (a copy or a gather of a few rows): its launch-bound cost, or with
        in_graph its cost inside a captured CUDA graph, where kernels run back to back (the profile's measured
        in_graph_overhead_s; the launch cost where the profile has none)."""
        fit = self.profile.kernels.get("elementwise")
        if fit is None:
            return self.profile.launch_overhead_s
        if in_graph and fit.in_graph_overhead_s is not None:
            return fit.in_graph_overhead_s
        return fit.overhead_s

    def _graph_saving_s_per_layer(self) -> float:
        """What a decode layer saves when the step is replayed as a CUDA graph (decode_graphs): its elementwise
        kernels cost the in-graph overhead instead of a launch each (the GEMM and attention fits were timed
        inside graphs already)."""
        if not self.decode_graphs:
            return 0.0
        return self._elementwise_kernels() * (self._small_kernel_s() - self._small_kernel_s(in_graph=True))

    def host_issue_s(self, batch_size: int) -> float:
        """The shortest an iteration can take when the CPU issues it: the issue time, then the GPU
        work issued last (the LM head), which cannot start before it is issued.  0: no host model."""
        issue = (
            self.host_issue_s_per_iteration
            + self.model.layers / self.parallel.pipeline * self.host_issue_s_per_layer
            + batch_size * self.host_issue_s_per_request
        )
        return issue + self._lm_head_s(batch_size) if issue > 0 else 0.0

    def allreduce_s(self, tokens):
        """One all-reduce of `tokens` rows of activations (tokens may be a numpy array)."""
        par = self.parallel
        if par.tensor == 1:
            return tokens * 0.0
        bytes_ = tokens * self.model.hidden_size * FP16_BYTES
        return collectives.allreduce_s(bytes_, par.tensor, par.interconnect, par.intra_node_gb_per_s)

    def _dense_layer_s(self, tokens: int) -> float:
        """QKV, O, MLP GEMMs and the two all-reduces of one layer on one GPU.

        Looked up in a table over token counts, built with numpy in doublings as needed."""
        table = self._memo["dense"].get("table")
        if table is None or tokens >= len(table):
            size = max(1024, 1 << int(tokens).bit_length())
            table = self._memo["dense"]["table"] = self._dense_layer_table(size)
        return float(table[tokens])

    def _dense_layer_table(self, size: int):
        return self._dense_layer_uncached_s(np.arange(size, dtype=np.float64))

    def _dense_layer_uncached_s(self, tokens):
        """Works on a scalar or a numpy array of token counts."""
        m, tp = self.model, self.parallel.tensor
        t = self.gemm_s(tokens, (m.q_dim + 2 * m.kv_dim) / tp, m.hidden_size)
        t += self.gemm_s(tokens, m.hidden_size, m.q_dim / tp)
        if m.is_moe:
            return t + self.elementwise_layer_s(tokens) + self.allreduce_s(tokens) + self._moe_s(tokens)
        if m.mlp == "gated":
            t += self.gemm_s(tokens, 2 * m.intermediate_size / tp, m.hidden_size)
        else:
            t += self.gemm_s(tokens, m.intermediate_size / tp, m.hidden_size)
        t += self.gemm_s(tokens, m.hidden_size, m.intermediate_size / tp)
        return t + self.elementwise_layer_s(tokens) + 2 * self.allreduce_s(tokens)

    def grouped_gemm_s(self, rows, n: float, k: float, groups, dtype_bytes: float = FP16_BYTES):
        """One grouped GEMM (a fused MoE kernel): `rows` (m × k) rows in all, spread over `groups` weight
        matrices (k × n) that are each read once; one launch.  rows and groups may be numpy arrays."""
        return self._matmul_s(2.0 * rows * n * k, dtype_bytes * (groups * n * k + rows * k + rows * n))

    def _moe_s(self, tokens):
        """The MoE block of one layer on one GPU for `tokens` rows: router, experts, and the collective
        that brings the experts' outputs back.

        Each token goes to k of E experts; under uniform routing the batch touches
        E·(1 − (1 − k/E)^T) distinct experts (ModelSpec.distinct_experts), and only their weights are
        read.  Tensor-parallel experts (default): every GPU holds a 1/tp slice of every expert's inner
        dimension, runs all T·k rows on the touched experts' slices, and the output is all-reduced.
        Expert parallelism: every GPU holds E/tp whole experts; the T tokens, split T/tp per GPU after
        attention (a reduce-scatter and an all-gather around the block, priced as the attention all-reduce
        already counted), go to their experts' GPUs by an all-to-all and come back by a second one, each
        rank's buffer its T/tp tokens' k copies of hidden FP16 values.  Per GPU that is, in expectation,
        T·k/tp rows on the touched experts' 1/tp share: the same weight bytes and FLOPs as the
        tensor-parallel layout, at full width, traded against the two all-to-alls for the all-reduce.
        With data parallelism (dp engines, costmodel/expert_parallel.py) the experts are spread over the
        dp·tp GPUs of the group and every engine runs the step padded to the same T tokens, so the experts see
        dp·T tokens: per GPU dp·T·k/(dp·tp) rows on 1/(dp·tp) of the experts dp·T tokens touch, and the
        all-to-alls span the dp·tp GPUs.
        Assumed: balanced routing (the busiest GPU's extra experts are not modelled), no token dropping."""
        m, par = self.model, self.parallel
        tp, h, ei, k = par.tensor, m.hidden_size, m.expert_intermediate_size, m.active_experts
        ep = par.expert_gpus
        if par.expert_parallel and ep > 1:
            group_tokens = tokens * par.data_parallel  # every engine padded to this engine's tokens
            rows, width, groups = group_tokens * k / ep, ei, m.distinct_experts(group_tokens) / ep
            router = self.gemm_s(tokens / tp, m.experts, h)
            comm = 2 * expert_parallel.alltoall_s(tokens, m, par)
        else:
            rows, width, groups = tokens * k, ei / tp, m.distinct_experts(tokens)
            router = self.gemm_s(tokens, m.experts, h)
            comm = self.allreduce_s(tokens)
        experts = self.grouped_gemm_s(rows, 2 * width, h, groups) + self.grouped_gemm_s(rows, h, width, groups)
        out = router + experts + comm
        return float(out) if np.ndim(out) == 0 else out

    def _lm_head_s(self, rows: int) -> float:
        return self.gemm_s(rows, self.model.vocab_size / self.parallel.tensor, self.model.hidden_size)

    @overload
    def _stage_hop_s(self, tokens: int) -> float: ...
    @overload
    def _stage_hop_s(self, tokens: np.ndarray) -> np.ndarray: ...
    def _stage_hop_s(self, tokens):
        """The activations of `tokens` rows sent to the next pipeline stage over the network (tokens may be a numpy
        array)."""
        par = self.parallel
        if par.pipeline == 1:
            return 0.0
        return collectives.sendrecv_s(
            tokens * self.model.hidden_size * FP16_BYTES, par.network, par.inter_stage_gbps / 8
        )

    def _kv_elements_per_token_per_gpu_layer(self) -> int:
        n = self._memo.get("kv_elements")
        if n is None:  # looked up once: every new prompt length's encoding asks for it
            n = self._memo["kv_elements"] = 2 * self.kv_heads_per_gpu * self.model.head_dim
        return n

    # ---- prefill ------------------------------------------------------------------------
    def prefill(self, prompt_tokens: tuple[int, ...], cached_tokens: tuple[int, ...] | None = None) -> PrefillCost:
        """A prefill batch; `cached_tokens[i]` of prompt i's leading tokens already have KV (a prefix-cache
        hit, or the chunks of the prompt already run): only the rest is computed, attending to them."""
        if cached_tokens is None and len(prompt_tokens) == 1 and prompt_tokens[0] < ONE_PROMPT_TABLE_TOKENS:
            return self._one_prompt_prefill(prompt_tokens[0])
        memo = self._memo["prefill"]
        key = prompt_tokens if cached_tokens is None else (prompt_tokens, cached_tokens)
        c = memo.get(key)
        if c is None:
            if len(memo) >= PREFILL_MEMO_ENTRIES:  # distinct batches are many in a long run: bound the memo
                memo.clear()
            c = memo[key] = self._prefill(prompt_tokens, cached_tokens)
        return c

    def _one_prompt_prefill(self, prompt_tokens: int) -> PrefillCost:
        """A batch of one prompt without a cached prefix (most batches at moderate load), priced from a table by
        length of the four times and the form (NaN: not yet priced), filled ONE_PROMPT_BLOCK lengths at a time
        by `_one_prompt_block` (numpy: the same doubles as `_prefill`) and grown in doublings.  40 bytes per
        length up to the longest prompt (1.3 MB for 32k tokens) whatever the run's length, where a memo of cost
        objects by batch grows with the run and a bounded one prices most batches again."""
        table = self._memo.get("one_prompt")
        i = prompt_tokens * _ONE_PROMPT_FIELDS
        if table is None or i >= len(table):
            size = max(1024, 1 << int(prompt_tokens).bit_length())
            grown = array("d", [math.nan]) * (size * _ONE_PROMPT_FIELDS)
            if table is not None:
                grown[: len(table)] = table
            table = self._memo["one_prompt"] = grown
        stage_s = table[i]
        if stage_s != stage_s:  # NaN: not priced yet
            lo = prompt_tokens - prompt_tokens % ONE_PROMPT_BLOCK
            block = self._one_prompt_block(lo, lo + ONE_PROMPT_BLOCK)
            if block is None:  # a form without a bulk twin: this length alone, by the scalar path
                c = self._prefill((prompt_tokens,), None)
                table[i : i + _ONE_PROMPT_FIELDS] = array(
                    "d", (c.stage_s, c.latency_s, c.approximation_s, c.encode_s, _FORM_CODES[c.forms[0]])
                )
                return c
            rows = array("d")
            rows.frombytes(block.tobytes())
            table[lo * _ONE_PROMPT_FIELDS : (lo + ONE_PROMPT_BLOCK) * _ONE_PROMPT_FIELDS] = rows
            stage_s = table[i]
        return PrefillCost(stage_s, table[i + 1], table[i + 2], table[i + 3], _ONE_FORM[int(table[i + 4])])

    def _one_prompt_block(self, lo: int, hi: int) -> np.ndarray | None:
        """`_prefill((L,), None)` for every length lo <= L < hi at once: a (hi - lo) x 5 float64 array of
        stage_s, latency_s, approximation_s, encode_s and the form's code, each column the same doubles as the
        scalar path (the same operations in the same order, elementwise: numpy's float64 add, multiply,
        divide, minimum and maximum round as Python's floats do, and nothing is fused).  None where the method's
        prefill form has no bulk twin (KVMethod.has_bulk_prefill_form)."""
        if not self.method.has_bulk_prefill_form():
            return None
        m, k, method = self.model, self._prefill_terms(), self.method
        L = np.arange(lo, hi, dtype=np.float64)
        attn_s, approx_s, codes = self._attention_block(0, L)
        # _prefill
        attn_s = attn_s + (self.approximation_factor - 1.0) * approx_s
        approx_s = approx_s * self.approximation_factor
        dense_s = self.dense_layer_block(lo, hi)
        own_s = np.where(codes == _HOMOMORPHIC, attn_s, 0.0)  # the homomorphic kernel: at its profiled price
        in_forward = (codes == _HOMOMORPHIC) & (L > 0)  # quantized inside the forward (_prefill)
        any_in_forward = bool(in_forward.any()) and method.encode is not None
        model_s = dense_s + (attn_s - own_s)
        if any_in_forward:
            forward_encode_s = self._encode_layer_s(L) * self.quantize_factor
            model_s = np.where(in_forward, model_s + forward_encode_s, model_s)
        layer_s = model_s / self.prefill_efficiency + own_s
        per_batch = k.batch.get(1)
        if per_batch is None:
            per_batch = k.batch[1] = (self._lm_head_s(1) / self.prefill_efficiency, self.prefill_host_s(1))
        lm_head_s, host_s = per_batch
        stages = self.parallel.pipeline
        exposed = self.host_exposed_s_per_iteration
        stage_s = k.layers_per_stage * (layer_s + self.host_exposed_s_per_layer) + lm_head_s / stages + exposed
        latency_s = m.layers * (layer_s + self.host_exposed_s_per_layer) + lm_head_s + exposed
        if stages > 1:
            latency_s = latency_s + (stages - 1) * self._stage_hop_s(L)
        stage_s, latency_s = np.maximum(stage_s, host_s / stages), np.maximum(latency_s, host_s)
        encode_s = self._encode_s(m.layers / stages, L)
        if any_in_forward:  # the pack alone where the forward quantized
            packs = self._encode_s(m.layers / stages, 0, packs_only=True)
            encode_s = np.where(in_forward, packs, encode_s)
        if method.encode == "pq":
            with np.errstate(divide="ignore"):  # length 0 clusters nothing (its scalar price divides by zero)
                encode_s = self._pq_construction_excess_s(L, latency_s)
        out = np.empty((len(L), _ONE_PROMPT_FIELDS))
        out[:, 0], out[:, 1], out[:, 2], out[:, 3], out[:, 4] = stage_s, latency_s, m.layers * approx_s, encode_s, codes
        return out

    def one_chunk_attention_block(self, past: int, lo: int, hi: int) -> np.ndarray | None:
        """`prefill_attention_s((past + n,), (past,))` for every lo <= n < hi at once (a chunk of n new tokens
        after `past` computed ones, as a colocated step prices it): a (hi - lo) x 3 float64 array of the seconds,
        the homomorphic correction and the form's code, the same doubles as the scalar path.  None where the
        method's prefill form has no bulk twin."""
        if not self.method.has_bulk_prefill_form():
            return None
        attn_s, approx_s, codes = self._attention_block(past, np.arange(lo, hi, dtype=np.float64))
        out = np.empty((hi - lo, 3))
        out[:, 0], out[:, 1], out[:, 2] = attn_s, approx_s, codes
        return out

    def _attention_block(self, past: int, new: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """prefill_attention_s of one prompt of past + n tokens whose first `past` have KV (0: none cached), for
        each n of `new` (float64, whole numbers): the one-prompt branch's operations elementwise, in its order."""
        k, p = self._prefill_terms(), self.profile
        if past:
            L = past + new
            n = (L - past) * past + (L - past) * (L - past + 1) / 2
        else:
            n = new * (new + 1) / 2
        flops = k.flops_per_pair * n
        codes = self.method.prefill_form_codes(p, flops)
        first = int(codes[0])
        one_form = bool((codes == first).all())  # most blocks: one form throughout
        attn_s = approx_s = np.zeros(len(new))
        for code in (first,) if one_form else range(len(_FORMS)):
            form = _FORMS[code]
            at = codes == code
            if not one_form and not at.any():
                continue
            fit = k.fits.get(form) or p.kernel(PREFILL_KERNELS[form])
            t = fit.time_s(flops)
            if form == "homomorphic":
                correction_s = np.minimum(t, k.q_heads_per_gpu * n * k.approx_ops_per_pair / k.alu_instr_per_s)
                approx_s = correction_s if one_form else np.where(at, correction_s, approx_s)
            if past and form == "fp16":
                t = t + self._cached_to_fp16_s(past)
            attn_s = t if one_form else np.where(at, t, attn_s)
        return attn_s, approx_s, codes

    def prefill_attention_s(
        self, prompt_tokens: tuple[int, ...], cached_tokens: tuple[int, ...] | None = None
    ) -> tuple[float, float, tuple[str, ...]]:
        """One layer's prefill attention on one GPU for a batch: (seconds, of which homomorphic correction,
        the form each prompt ran).  Each prompt takes the method's form for its length; the prompts of one
        form share one launch of that form's kernel.  A prompt of L tokens of which c have KV already
        computes L − c query rows against c + their own causal keys: (L − c)·c + (L − c)(L − c + 1)/2
        query-key pairs; a prefix kept in a compressed format is first restored to FP16 where the form
        attends in FP16 (`_cached_to_fp16_s`)."""
        k = self._prefill_terms()
        fpp, form_of = k.flops_per_pair, k.form_of
        if len(prompt_tokens) == 1:  # one prompt (most batches, most chunks): the loop below, without its lists
            L = prompt_tokens[0]
            c = 0 if cached_tokens is None else cached_tokens[0]
            n = L * (L + 1) / 2 if cached_tokens is None else (L - c) * c + (L - c) * (L - c + 1) / 2
            form = form_of(fpp * n)
            t = (k.fits.get(form) or self.profile.kernel(PREFILL_KERNELS[form])).time_s(fpp * n)
            approx = 0.0
            if form == "homomorphic":
                approx = min(t, k.q_heads_per_gpu * n * k.approx_ops_per_pair / k.alu_instr_per_s)
            if c and form == "fp16":
                t += self._cached_to_fp16_s(c)
            return t, approx, (form,)
        if cached_tokens is None:
            pairs = [L * (L + 1) / 2 for L in prompt_tokens]
        else:
            pairs = [(L - c) * c + (L - c) * (L - c + 1) / 2 for L, c in zip(prompt_tokens, cached_tokens)]
        forms = tuple([form_of(fpp * n) for n in pairs])
        attn_s = approx_s = 0.0
        first = forms[0] if forms else ""
        one_form = all(f == first for f in forms)
        for form in (first,) if one_form else dict.fromkeys(forms):
            form_pairs = sum(pairs) if one_form else sum(n for n, f in zip(pairs, forms) if f == form)
            t = (k.fits.get(form) or self.profile.kernel(PREFILL_KERNELS[form])).time_s(fpp * form_pairs)
            attn_s += t
            if form == "homomorphic":
                approx_s += min(t, k.q_heads_per_gpu * form_pairs * k.approx_ops_per_pair / k.alu_instr_per_s)
        if cached_tokens is not None:
            restored = sum(c for c, f in zip(cached_tokens, forms) if f == "fp16")
            if restored:
                attn_s += self._cached_to_fp16_s(restored)
        return attn_s, approx_s, forms

    def _homomorphic_attention_s(
        self,
        prompt_tokens: tuple[int, ...],
        cached_tokens: tuple[int, ...] | None,
        forms: tuple[str, ...],
        attn_s: float,
    ) -> float:
        """Of one layer's prefill attention `attn_s` (the correction factor applied), the homomorphic form's kernel:
        all of it where every prompt took that form, else that form's launch over its prompts alone."""
        if all(f == "homomorphic" for f in forms):
            return attn_s
        keep = [i for i, f in enumerate(forms) if f == "homomorphic"]
        t, approx, _ = self.prefill_attention_s(
            tuple(prompt_tokens[i] for i in keep),
            None if cached_tokens is None else tuple(cached_tokens[i] for i in keep),
        )
        return t + (self.approximation_factor - 1.0) * approx

    def _prefill_terms(self) -> _PrefillTerms:
        """What pricing a prefill batch needs that does not depend on the batch, looked up once."""
        k = self._memo.get("prefill_terms")
        if k is None:
            p, method = self.profile, self.method
            k = self._memo["prefill_terms"] = _PrefillTerms(
                flops_per_pair=4.0 * self.q_heads_per_gpu * self.model.head_dim,
                form_of=lambda attn_flops: method.prefill_form(p, attn_flops),
                fits={f: p.kernels[key] for f, key in PREFILL_KERNELS.items() if key in p.kernels},
                q_heads_per_gpu=self.q_heads_per_gpu,
                approx_ops_per_pair=method.prefill_approximation_ops_per_pair(),
                alu_instr_per_s=alu_instr_per_s(self.gpu),
                layers_per_stage=math.ceil(self.model.layers / self.parallel.pipeline),
                batch={},
            )
        return k

    def _cached_to_fp16_s(self, tokens: int) -> float:
        """One layer's cached KV of `tokens` tokens restored to FP16 on one GPU for FP16 attention: nothing
        for FP16 KV, a cast for FP8 / FP4, the dequantize kernel for quantized formats (entropy decoding
        included where the format is entropy-coded).  PQCache keeps full KV: nothing.  Memoised by the token
        count: a colocated chunk's earlier tokens and a prefix hit come back at the same counts."""
        memo = self._memo.setdefault("cached_to_fp16", {})
        t = memo.get(tokens)
        if t is None:
            if len(memo) >= CHUNKS_MEMO_ENTRIES:
                memo.clear()
            t = memo[tokens] = self._cached_to_fp16_uncached_s(tokens)
        return t

    def _cached_to_fp16_uncached_s(self, tokens: int) -> float:
        enc = self.method.encode
        if enc is None or enc == "pq" or self.method.dequantize_on_arrival:  # kept in FP16 (CacheGen decodes once)
            return 0.0
        elements = tokens * self._kv_elements_per_token_per_gpu_layer()
        p = self.profile
        if enc == "cast":  # read FP8 / FP4, write FP16
            return p.launch_overhead_s + elements * 3.0 / (p.memory_gbps * 1e9)
        if enc == "quantize_keys":
            return p.kernel("dequantize.kv").time_s(elements / 2)
        t = p.kernel("dequantize.kv").time_s(elements)
        if self.method.entropy_coded:
            t += elements * ENTROPY_CODING_INSTR_PER_ELEMENT / alu_instr_per_s(self.gpu)
        return t

    def _prefill(self, prompt_tokens: tuple[int, ...], cached_tokens: tuple[int, ...] | None) -> PrefillCost:
        m, k = self.model, self._prefill_terms()
        tokens = sum(prompt_tokens) if cached_tokens is None else sum(prompt_tokens) - sum(cached_tokens)
        attn_s, approx_s, forms = self.prefill_attention_s(prompt_tokens, cached_tokens)
        # the engine: its correction against the profile's, its GPU speed against the priced one on the model's work;
        # the homomorphic attention kernel (its correction included) at its profiled price (module doc)
        attn_s += (self.approximation_factor - 1.0) * approx_s
        approx_s *= self.approximation_factor
        own_s = 0.0
        # a homomorphic prompt's KV is quantized inside the forward, layer by layer, before its attention reads the
        # codes; the step after the forward only packs them (`_encode_s`)
        in_forward = 0
        if "homomorphic" in forms:
            own_s = self._homomorphic_attention_s(prompt_tokens, cached_tokens, forms, attn_s)
            news = prompt_tokens if cached_tokens is None else [L - c for L, c in zip(prompt_tokens, cached_tokens)]
            in_forward = sum(n for n, f in zip(news, forms) if f == "homomorphic")
        model_s = self._dense_layer_s(tokens) + (attn_s - own_s)
        if in_forward:
            model_s += self._encode_layer_s(in_forward) * self.quantize_factor
        layer_s = model_s / self.prefill_efficiency + own_s
        n = len(prompt_tokens)
        per_batch = k.batch.get(n)
        if per_batch is None:
            # the LM head, and an engine that issues the batch's launches from the CPU (prefill_host_s)
            per_batch = k.batch[n] = (self._lm_head_s(n) / self.prefill_efficiency, self.prefill_host_s(n))
        lm_head_s, host_s = per_batch
        stages = self.parallel.pipeline
        exposed = self.host_exposed_s_per_iteration
        stage_s = k.layers_per_stage * (layer_s + self.host_exposed_s_per_layer) + lm_head_s / stages + exposed
        latency_s = m.layers * (layer_s + self.host_exposed_s_per_layer) + lm_head_s + exposed
        if stages > 1:
            latency_s += (stages - 1) * self._stage_hop_s(tokens)
        stage_s, latency_s = max(stage_s, host_s / stages), max(latency_s, host_s)
        encode_s = self._encode_s(
            m.layers / stages, tokens - in_forward, packs_only=in_forward > 0 and in_forward == tokens, requests=n
        )
        if self.method.encode == "pq":
            encode_s = self._pq_construction_excess_s(tokens, latency_s)
        return PrefillCost(
            stage_s=stage_s, latency_s=latency_s, approximation_s=m.layers * approx_s, encode_s=encode_s, forms=forms
        )

    def prefill_host_s(self, batch_requests: int) -> float:
        """The shortest a prefill batch can take when the CPU issues its launches one by one (the prefill
        pool's host_issue_s_*: per batch, per layer, per request; the method's own launches per layer and request,
        each request's attention being issued apart); 0: no host model."""
        if not (
            self.host_issue_s_per_iteration
            or self.host_issue_s_per_layer
            or self.host_issue_s_per_request
            or self.method_prefill_issue_s_per_layer
        ):
            return 0.0
        return (
            self.host_issue_s_per_iteration
            + self.model.layers * (self.host_issue_s_per_layer + batch_requests * self.method_prefill_issue_s_per_layer)
            + batch_requests * self.host_issue_s_per_request
        )

    @overload
    def _encode_s(
        self, layers: float, tokens: int, wire: bool = True, packs_only: bool = False, requests: int = 1
    ) -> float: ...
    @overload
    def _encode_s(
        self, layers: float, tokens: np.ndarray, wire: bool = True, packs_only: bool = False, requests: int = 1
    ) -> np.ndarray | float: ...
    def _encode_s(self, layers, tokens, wire=True, packs_only=False, requests=1):
        """The quantize step of `tokens` new tokens over `layers` layers as the engine runs it: the profile's
        kernel times the quantize factor, and at least the CPU time to issue its launches where the engine
        issues them one by one (method_quantize_issue_s_per_layer; 0: no floor). A method with no quantize
        kernel (FP16) has a step only where the engine packs its KV for the wire layer by layer (`wire`, and a
        nonzero issue time: realrun copies each layer's K and V into a flat send buffer, realrun/kvformats.py
        Baseline.encode_layer); its copies' GPU time, a few microseconds a layer, is under that floor.  tokens
        may be a numpy array of token counts (_one_prompt_block; a method without a quantize kernel then gets
        the one number for every count).  `packs_only`: the KV was quantized inside the forward (a homomorphic
        prefill's attention reads the codes), so the step is the pack alone, as for a method without a quantize
        kernel.  `requests`: the batch's requests, whose KV the engine encodes one by one (the floor is per layer and
        request; the kernels' price is by the tokens)."""
        issue_s = requests * layers * self.method_quantize_issue_s_per_layer
        if self.method.encode is None or packs_only:
            return issue_s if wire else 0.0
        gpu_s = layers * self._encode_layer_s(tokens) * self.quantize_factor
        if isinstance(gpu_s, np.ndarray):
            return np.where(gpu_s <= 0.0, 0.0, np.maximum(gpu_s, issue_s))
        if gpu_s <= 0.0:  # no quantize step: nothing to issue
            return 0.0
        return max(gpu_s, issue_s)

    def _encode_layer_s(self, tokens):
        """Quantize (and entropy-code) one layer's new KV on one GPU after prefill (tokens may be a numpy array)."""
        enc = self.method.encode
        if enc is None:
            return tokens * 0.0  # 0.0, or zeros
        elements = tokens * self._kv_elements_per_token_per_gpu_layer()
        p = self.profile
        if enc == "cast":  # read FP16, write FP8 / FP4
            return p.launch_overhead_s + elements * 3.0 / (p.memory_gbps * 1e9)
        if enc == "quantize_keys":
            return p.kernel("quantize.kv").time_s(elements / 2)
        t = p.kernel("quantize.kv").time_s(elements)
        if self.method.entropy_coded:
            t += self._entropy_coding_s("entropy_encode.kv", elements)
        return t

    @overload
    def _entropy_coding_s(self, key: str, elements: float) -> float: ...
    @overload
    def _entropy_coding_s(self, key: str, elements: np.ndarray) -> np.ndarray: ...
    def _entropy_coding_s(self, key, elements):
        """Arithmetic (de)coding of `elements` symbols on one GPU: the profile's fit where a scenario or an
        implementation profile gave one, else ENTROPY_CODING_INSTR_PER_ELEMENT at the CUDA-core rate."""
        fit = self.profile.kernels.get(key)
        if fit is not None:
            return fit.time_s(elements)
        return elements * ENTROPY_CODING_INSTR_PER_ELEMENT / alu_instr_per_s(self.gpu)

    def kmeans_iteration_s(self, tokens):
        """One K-Means iteration over the batch's keys on the replica's host CPUs (tokens may be a numpy array)."""
        if self.host_vcpus <= 0:
            raise ModelDoesNotFit(
                f"{self.method.output_name} clusters keys on the host CPUs, but the pool has no vCPUs "
                f"(give it an instance)"
            )
        return (
            tokens * self.method.kmeans_flops_per_token_iteration(self.model) / (self.host_vcpus * CPU_FLOPS_PER_VCPU)
        )

    @overload
    def pq_iterations(self, tokens: int, gpu_latency_s: float) -> int: ...
    @overload
    def pq_iterations(self, tokens: np.ndarray, gpu_latency_s: np.ndarray) -> np.ndarray: ...
    def pq_iterations(self, tokens, gpu_latency_s):
        """PQCache's adaptive cap: as many iterations as fit in the GPU prefill time, at least one (numpy arrays of
        tokens and times: the same counts as floats)."""
        if isinstance(gpu_latency_s, np.ndarray):
            fit = np.trunc(gpu_latency_s / self.kmeans_iteration_s(tokens))
            return np.maximum(1.0, np.minimum(float(self.method.kmeans_iteration_cap()), fit))
        return max(1, min(self.method.kmeans_iteration_cap(), int(gpu_latency_s / self.kmeans_iteration_s(tokens))))

    @overload
    def _pq_construction_excess_s(self, tokens: int, gpu_latency_s: float) -> float: ...
    @overload
    def _pq_construction_excess_s(self, tokens: np.ndarray, gpu_latency_s: np.ndarray) -> np.ndarray: ...
    def _pq_construction_excess_s(self, tokens, gpu_latency_s):
        """K-Means runs beside the GPU prefill; only what outlasts it delays the request (numpy arrays allowed)."""
        total = self.pq_iterations(tokens, gpu_latency_s) * self.kmeans_iteration_s(tokens)
        if isinstance(total, np.ndarray):
            return np.maximum(0.0, total - gpu_latency_s)
        return max(0.0, total - gpu_latency_s)

    # ---- arrival at decode ----------------------------------------------------------------
    def on_arrival_s(self, prompt_tokens: int) -> float:
        """Work on the decode GPU when a request's KV arrives (CacheGen: decode to FP16 once)."""
        if not self.method.dequantize_on_arrival:
            return 0.0
        elements = prompt_tokens * self._kv_elements_per_token_per_gpu_layer()
        t = self.profile.kernel("dequantize.kv").time_s(elements)
        t += self._entropy_coding_s("entropy_decode.kv", elements)
        return self.model.layers / self.parallel.pipeline * t * self.dequantize_factor

    # ---- the host's level -------------------------------------------------------------------
    def with_host_factor(self, factor: float, prefill_floor_factor: float | None = None) -> ReplicaCostModel:
        """The same replica with every host term `factor` times longer: the decode issue terms and loop gap, the
        join, the prefill floor (per batch, layer, request, and the method's own per layer; its exposed and first-seen
        time) and the quantize step's floor. Where the host shares its interpreter with a link endpoint that is
        moving KV (realrun's link thread takes the GIL for every chunk), the same CPU work takes longer
        (simulator/link.py, EndpointHost).
        `prefill_floor_factor` (a prefill replica's, where given): the prefill floor's own factor instead (its
        terms are host_issue_s_* and the method's prefill issue there). The GPU terms are the same. Itself when
        the factors are 1 or it has no host terms."""
        floor = factor if prefill_floor_factor is None else prefill_floor_factor
        terms = (
            self.host_issue_s_per_iteration,
            self.host_issue_s_per_layer,
            self.host_issue_s_per_request,
            self.host_serial_s_per_iteration,
            self.host_exposed_s_per_iteration,
            self.host_exposed_s_per_layer,
            self.host_first_seen_s_per_iteration,
            self.join_s_per_request,
            self.leave_s_per_request,
            self.method_prefill_issue_s_per_layer,
            self.method_quantize_issue_s_per_layer,
        )
        if (factor == 1.0 and floor == 1.0) or not any(terms):
            return self
        return replace(
            self,
            host_issue_s_per_iteration=self.host_issue_s_per_iteration * floor,
            host_issue_s_per_layer=self.host_issue_s_per_layer * floor,
            host_issue_s_per_request=self.host_issue_s_per_request * floor,
            host_serial_s_per_iteration=self.host_serial_s_per_iteration * factor,
            host_exposed_s_per_iteration=self.host_exposed_s_per_iteration * floor,
            host_exposed_s_per_layer=self.host_exposed_s_per_layer * floor,
            host_first_seen_s_per_iteration=self.host_first_seen_s_per_iteration * floor,
            join_s_per_request=self.join_s_per_request * factor,
            leave_s_per_request=self.leave_s_per_request * factor,
            method_prefill_issue_s_per_layer=self.method_prefill_issue_s_per_layer * floor,
            method_quantize_issue_s_per_layer=self.method_quantize_issue_s_per_layer * factor,
        )

    # ---- decode ---------------------------------------------------------------------------
    def priced_context(self, total_ctx_tokens, batch_size, longest_ctx_tokens):
        """The context an iteration is priced at (IterationCost.time_s): its total S, plus, where the method's decode
        attention sizes its split grid by the batch's longest context L (attention_padding_share > 0), that share of
        the padding B x L - S (scalars or numpy arrays alike)."""
        share = self.attention_padding_share
        if not share:
            return total_ctx_tokens
        return total_ctx_tokens + share * (batch_size * longest_ctx_tokens - total_ctx_tokens)

    def iteration(self, batch_size: int) -> IterationCost:
        memo = self._memo["iteration"]
        c = memo.get(batch_size)
        if c is None:
            c = memo[batch_size] = self._iteration(batch_size, batch_size)
        return c

    def lockstep_iteration(self, batch_size: int, group_batch: int) -> IterationCost:
        """One step of an engine of a data-parallel group (costmodel/expert_parallel.py) holding `batch_size`
        requests while the group's largest engine holds `group_batch`: every engine is padded to that many
        rows, so the dense layers (and with them the experts' dp·group_batch tokens) run at group_batch rows;
        the attention, the per-request kernels and the LM head stay the engine's own.  The plain iteration
        when this engine is the largest."""
        rows = max(batch_size, group_batch)
        memo = self._memo["iteration"]
        key = batch_size if rows == batch_size else (batch_size, rows)  # the plain iteration's entry
        c = memo.get(key)
        if c is None:
            c = memo[key] = self._iteration(batch_size, rows)
        return c

    def decode_env(self) -> DecodeEnv:
        g, p = self.gpu, self.profile
        return DecodeEnv(
            profile=p,
            model=self.model,
            kv_units_per_token=self._kv_elements_per_token_per_gpu_layer(),
            q_heads_per_gpu=self.q_heads_per_gpu,
            alu_instr_per_s=alu_instr_per_s(g),
            pcie_bytes_per_s=g.pcie_gb_per_s * 1e9,
            memory_bytes_per_s=p.memory_gbps * 1e9,
            has_fp4=g.fp4_tensor_tflops is not None,
        )

    def _iteration(self, batch_size: int, rows: int) -> IterationCost:
        """`batch_size` requests whose dense layers run at `rows` ≥ batch_size rows (padding: lockstep_iteration)."""
        p, L = self.profile, self.model.layers
        env = self.decode_env()
        per_req, per_ctx = self.method.decode_layer_terms(env)
        per_iter = self.method.decode_layer_fixed_s(env)
        launch_s = self.method.decode_kernel(p, self.model).overhead_s
        # small kernels besides the attention fit: the new token's KV write where the profiled kernel does
        # not include it (the quantized kernels were timed with their append), and the engine's own
        small = (0 if self.method.decode_kernel_includes_append else 1) + self.extra_kernels_per_layer
        if self.method_decode_kernels_per_layer:  # (a float only where set: the default's sum stays an int's)
            small += self.method_decode_kernels_per_layer
        launch_s += small * self._small_kernel_s(in_graph=self.decode_graphs)
        dense_s = self._dense_layer_s(rows) - self._graph_saving_s_per_layer()
        decode_fixed = (
            L * (dense_s + launch_s + batch_size * per_req.get("decode", 0.0))
            + self._lm_head_s(batch_size)
            + (self.parallel.pipeline - 1) * self._stage_hop_s(batch_size)
        )
        host = self.host_issue_s(batch_size)
        serial = self.host_serial_s_per_iteration  # GPU idle: adds to both the GPU-bound and the host-bound time
        return IterationCost(
            decode_fixed_s=decode_fixed + serial,
            decode_per_ctx_s=L * per_ctx.get("decode", 0.0),
            dequant_fixed_s=L
            * (batch_size * per_req.get("dequantize", 0.0) + per_iter.get("dequantize", 0.0))
            * self.dequantize_factor,
            dequant_per_ctx_s=L * per_ctx.get("dequantize", 0.0) * self.dequantize_factor,
            approx_fixed_s=L * batch_size * per_req.get("approximation", 0.0) * self.approximation_factor,
            approx_per_ctx_s=L * per_ctx.get("approximation", 0.0) * self.approximation_factor,
            fetch_fixed_s=L * batch_size * per_req.get("fetch", 0.0),
            fetch_per_ctx_s=L * per_ctx.get("fetch", 0.0),
            host_s=host + serial if host > 0 else 0.0,
        )

    def mixed_step(
        self, batch_size: int, chunks: tuple[tuple[int, int], ...], samples: int
    ) -> tuple[IterationCost, PrefillCost]:
        """One step of an engine that runs prefill chunks beside its decode rows (vLLM v1's scheduler:
        simulator/scheduler.py): `batch_size` decode rows and, per chunk, (new tokens, earlier tokens of the same
        request whose KV is there), in one forward pass: the dense layers see B + Σ new rows and read the
        weights once; each chunk attends to its earlier tokens (read in the memory format, restored to FP16
        where the attention form needs it) and to itself, causally; the chunks' new KV is written in the
        method's memory format (CacheGen's is FP16: nothing to encode); the LM head runs for the decode rows
        and the `samples` chunks that end their request's prefill (each yields a token); with pipeline stages
        the activations of every row cross to the next stage.

        Returns the step (still fixed + per_ctx · S over the decode rows' context: the chunks add to the fixed
        part) and the chunks' share of it (latency_s: what they add to the decode rows' iteration;
        approximation_s: their homomorphic correction; encode_s: their KV encoding, inside latency_s)."""
        key = (batch_size, chunks, samples)
        memo = self._memo.setdefault("mixed", {})
        hit = memo.get(key)
        if hit is not None:
            return hit
        L, stages = self.model.layers, self.parallel.pipeline
        new = sum(n for n, _ in chunks)
        attn_s, approx_s, forms = self._chunks_attention(chunks)
        if batch_size:
            base = self.iteration(batch_size)
            added = (
                L * (self._dense_layer_s(batch_size + new) - self._dense_layer_s(batch_size))
                + self._lm_head_rows_s(batch_size + samples)
                - self._lm_head_rows_s(batch_size)
                + (stages - 1) * (self._stage_hop_s(batch_size + new) - self._stage_hop_s(batch_size))
            )
        else:
            base = _NO_ITERATION
            added = (
                L * self._dense_layer_s(new)
                + (self._lm_head_rows_s(samples) if samples else 0.0)
                + (stages - 1) * self._stage_hop_s(new)
                + self.host_serial_s_per_iteration
            )
        added += L * attn_s + self._chunks_encode_s(new)
        out = (
            base.with_decode_fixed_added(added),
            PrefillCost(
                stage_s=added,
                latency_s=added,
                approximation_s=L * approx_s,
                encode_s=self._chunks_encode_s(new),
                forms=forms,
            ),
        )
        if len(memo) >= PREFILL_MEMO_ENTRIES:
            memo.clear()
        memo[key] = out
        return out

    def _chunks_attention(self, chunks: tuple[tuple[int, int], ...]) -> tuple[float, float, tuple[str, ...]]:
        """prefill_attention_s of a mixed step's chunks ((new tokens, earlier tokens) each), memoised by the
        chunks alone: a step's price changes with its decode rows, its chunks' attention does not (a long
        prompt's chunks come back at the same offsets, step after step and prompt after prompt)."""
        memo = self._memo.setdefault("chunks_attention", {})
        c = memo.get(chunks)
        if c is None:
            if len(memo) >= CHUNKS_MEMO_ENTRIES:
                memo.clear()
            c = memo[chunks] = self.prefill_attention_s(
                tuple(past + n for n, past in chunks), tuple(past for _, past in chunks)
            )
        return c

    def _chunks_encode_s(self, tokens: int) -> float:
        """The KV of a mixed step's `tokens` new tokens written in the replica's memory format (CacheGen's is
        FP16: nothing to encode), memoised by the token count (at most max_batch_tokens of them)."""
        memo = self._memo.setdefault("chunks_encode", {})
        c = memo.get(tokens)
        if c is None:
            L, stages = self.model.layers, self.parallel.pipeline
            c = memo[tokens] = 0.0 if self.method.dequantize_on_arrival else self._encode_s(L / stages, tokens, False)
        return c

    def chunks_encode_block(self, lo: int, hi: int) -> np.ndarray:
        """`_chunks_encode_s(t)` for every lo <= t < hi at once (numpy, the same doubles: `_encode_s` elementwise)."""
        if self.method.dequantize_on_arrival:
            return np.zeros(hi - lo)
        L, stages = self.model.layers, self.parallel.pipeline
        encode_s = self._encode_s(L / stages, np.arange(lo, hi, dtype=np.float64), False)
        return encode_s if isinstance(encode_s, np.ndarray) else np.full(hi - lo, encode_s)  # no kernel: one number

    def dense_layer_block(self, lo: int, hi: int) -> np.ndarray:
        """`_dense_layer_s(t)` for every lo <= t < hi: a slice of its table."""
        self._dense_layer_s(hi - 1)  # the table covers the block
        return self._memo["dense"]["table"][lo:hi]

    def _lm_head_rows_s(self, rows: int) -> float:
        """_lm_head_s(rows), memoised by the row count (a step has at most max_batch_tokens rows)."""
        memo = self._memo.setdefault("lm_head", {})
        c = memo.get(rows)
        if c is None:
            c = memo[rows] = self._lm_head_s(rows)
        return c

    # ---- transfer and memory --------------------------------------------------------------
    def wire_bytes(self, prompt_tokens: int) -> float:
        return self.method.wire_bytes(self.model, prompt_tokens)

    def swap_s(self, kv_bytes: float) -> float:
        """KV of one request copied between the replica's GPUs and host memory (preemption by swapping), each
        GPU its share over its own PCIe link, all at once."""
        return kv_bytes / (self.parallel.gpus * self.gpu.pcie_gb_per_s * 1e9)

    def host_kv_bytes(self, context_tokens: int) -> float:
        """Decode host memory one request holds (offload methods)."""
        return context_tokens * self.method.host_bytes_per_token(self.model)

    def kv_memory_bytes(self, context_tokens: int) -> float:
        """Decode memory one request holds at `context_tokens` (across the replica's GPUs): whole KV blocks
        (costmodel/memory.kv_blocks) plus the method's fixed per-request buffer (HACK's FP16 V tail)."""
        terms = self._memo.get("kv_memory")
        if terms is None:  # the two terms that do not depend on the tokens, looked up once
            reserve = self.kv_replication * self.method.memory_reserve_bytes_per_request(self.model)
            terms = self._memo["kv_memory"] = (reserve, self.block_bytes)
        reserve, block = terms
        if block <= 0:
            return reserve
        return kv_blocks(context_tokens, self.block_tokens) * block + reserve

    def placement_s(self, context_tokens: float) -> float:
        """GPU seconds the engine spends copying one request's KV of `context_tokens` tokens within the decode GPU
        at a batch change (kv_placement_bytes_per_s; 0 where the engine makes no such copy): its decode memory
        over the copy's rate (realrun.placecal measures the rate)."""
        rate = self.kv_placement_bytes_per_s
        if rate <= 0:
            return 0.0
        return self.kv_memory_bytes(max(1, int(round(context_tokens)))) / rate

    @property
    def block_bytes(self) -> float:
        """One block of this method's KV: block_tokens tokens, every layer, across the replica's GPUs."""
        return self.block_tokens * self.method.memory_bytes_per_token(self.model) * self.kv_replication

    @property
    def weight_bytes_per_gpu(self) -> float:
        return self.memory.weights_bytes

    @property
    def memory(self) -> MemoryBudget:
        """The replica's GPU memory as the engine divides it (costmodel/memory.py)."""
        b = self._memo.get("memory")
        if b is None:
            b = self._memo["memory"] = memory_budget(
                self.gpu,
                self.model,
                self.parallel,
                gpu_memory_utilization=self.gpu_memory_utilization,
                max_batch_tokens=self.max_batch_tokens,
                max_batch_requests=self.max_batch_requests,
                block_tokens=self.block_tokens,
                block_bytes=self.block_bytes,
                cuda_graph_bytes=self.cuda_graph_bytes,
                non_torch_override_bytes=self.non_torch_override_bytes,
                kv_override_bytes=self.kv_capacity_override_bytes,
            )
        return b

    @property
    def kv_capacity_bytes(self) -> float:
        """KV bytes the whole replica can hold (all its GPUs), in whole blocks, in `kv_memory_bytes` terms (kept:
        a prefill replica asks for it with every prompt)."""
        c = self._memo.get("kv_capacity")
        if c is None:
            c = self._memo["kv_capacity"] = self.memory.kv_capacity_bytes
        return c

    def check_fits(self, pool: str) -> None:
        mem = self.memory
        gib = lambda b: f"{b / GIB:.2f}"  # noqa: E731
        if self.kv_capacity_override_bytes is not None:
            free = (mem.requested_bytes - mem.weights_bytes) * self.parallel.gpus
            if free < self.kv_capacity_override_bytes:
                raise ModelDoesNotFit(
                    f"{pool} kv_capacity_gib={gib(self.kv_capacity_override_bytes)} does not fit "
                    f"beside the weights ({gib(free)} GiB free)"
                )
        if mem.kv_pool_bytes <= 0 or (mem.block_bytes > 0 and mem.blocks <= 0):
            raise ModelDoesNotFit(
                f"{self.model.key} does not fit the {pool} pool: {self.gpu.key} offers {gib(mem.requested_bytes)} GiB "
                f"per GPU at gpu_memory_utilization={self.gpu_memory_utilization}; weights take {gib(mem.weights_bytes)}, "
                f"the activation peak at max_batch_tokens={self.max_batch_tokens} {gib(mem.activation_peak_bytes)}, "
                f"non-torch and CUDA graphs {gib(mem.non_torch_bytes + mem.cuda_graph_bytes)}, leaving no whole KV block "
                f"(tensor={self.parallel.tensor}, pipeline={self.parallel.pipeline})"
            )

    def memory_bytes_per_replica(self, kv_bytes: float) -> float:
        """Total GPU memory in use on the replica with `kv_bytes` of KV resident."""
        return self.memory.non_kv_bytes * self.parallel.gpus + kv_bytes
