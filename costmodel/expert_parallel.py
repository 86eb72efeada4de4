"""Data-parallel attention with expert parallelism for mixture-of-experts models: where the experts live, what
the dispatch and combine all-to-alls move, and what a GPU holds.

What is modelled, following vLLM (`vllm serve --data-parallel-size N --tensor-parallel-size T
--enable-expert-parallel`; docs/serving/data_parallel_deployment.md and docs/serving/expert_parallel_deployment.md
in vllm-project/vllm at 01e4fce / 0170256):

* N engines ("DP ranks"), each of T GPUs with its own scheduler, KV cache and requests. Attention, the QKV and O
  projections, the router (gate), the embeddings and the LM head are replicated per engine and tensor-parallel
  inside it; the experts of every MoE layer are spread whole over all N·T GPUs (``EP_SIZE = TP_SIZE ×
  DP_SIZE``; "each EP rank has NUM_TOTAL_EXPERTS ÷ NUM_EP_RANKS experts"), so E must divide by N·T.
* Per GPU weights: (everything but the experts) / T + (the experts) / (N·T) (`weights_bytes_per_gpu`); the KV
  pool of an engine follows from them as for any replica (costmodel/memory.py), one pool per engine.
* The MoE block of a step: each engine's B tokens are split over its T GPUs after attention (B/T each, as the
  expert-parallel layout of one replica already assumes: costmodel/phases.py `_moe_s`); every GPU sends each of
  its tokens' k expert copies to the GPU holding that expert (dispatch) and gets them back weighted (combine):
  two all-to-alls over the N·T GPUs of the instance's interconnect, each rank's buffer B/T · k · hidden ·
  2 bytes (BF16), (p − 1)/p of it crossing to peers (costmodel/collectives.py `alltoall_s`). k copies, not
  one per destination GPU: the decode backend vLLM recommends for disaggregated decode, DeepEP's low-latency
  kernels (expert_parallel_deployment.md, "Decode Instance: Uses deepep_low_latency"), lays its receive
  buffer out per local expert, one row per (token, expert); FP8 dispatch is not modelled.
* Lock-step (vllm/v1/engine/core.py `DPEngineCoreProc.run_busy_loop`): while any engine has work every engine
  steps, an engine with nothing scheduled running a dummy batch (`execute_dummy_batch`), because every MoE
  layer is a collective over all N·T GPUs. With CUDA graphs every rank is padded to the largest token count
  across the DP ranks (vllm/v1/worker/dp_utils.py at 0074614, `_post_process_dp_padding`: "all ranks will
  be padded out so that they run with the same number of tokens"), dummy batches included. So a step of an
  engine holding b requests, in a group whose largest engine holds g ≥ b, runs its dense layers (QKV, O,
  norms, the all-reduces, the router, the dispatch buffers) at g rows, its attention over its own b requests'
  KV, its LM head over its b rows, and the experts see N·g tokens: each GPU runs N·g·k/(N·T) = g·k/T expert
  rows over its share, E·(1 − (1 − k/E)^(N·g))/(N·T), of the experts the group's tokens touch
  (ReplicaCostModel.lockstep_iteration). An idle engine's dummy steps thus cost the others their g padded
  tokens in the experts and nothing else.
* Not modelled: the wait for the engine whose attention is longest (each engine's step is priced with its own
  attention; the all-to-all is a barrier in every layer, so the real step is the slowest engine's), routing
  imbalance across experts (EPLB, redundant experts), the every-32-steps all-reduce that ends a wave, and an
  EP group spanning instances (the scenario refuses N·T above one instance's GPUs).
"""

from __future__ import annotations

from . import collectives
from .specs import FP16_BYTES, ModelSpec, Parallelism


def expert_params(model: ModelSpec) -> int:
    """Parameters of every routed expert of every layer (the router stays with the attention weights)."""
    return model.layers * model.experts * model.expert_params if model.is_moe else 0


def weights_bytes_per_gpu(model: ModelSpec, par: Parallelism) -> float:
    """FP16 weights one GPU of an engine holds: the experts over the EP group (N·T GPUs under data-parallel
    expert parallelism), everything else over the engine's T·PP GPUs. Without data parallelism both are the
    replica's GPUs: params × 2 / (T·PP), sliced or whole experts alike."""
    experts = expert_params(model)
    return FP16_BYTES * ((model.params - experts) / par.gpus + experts / (par.expert_gpus * par.pipeline))


def dispatch_bytes_per_gpu(tokens_per_engine, model: ModelSpec, par: Parallelism):
    """One rank's all-to-all buffer for one MoE layer (dispatch; combine moves the same): its share of the
    engine's tokens (tokens / T), each copied to its k experts, hidden × 2 bytes each. Works on numpy arrays."""
    return tokens_per_engine / par.tensor * model.active_experts * model.hidden_size * FP16_BYTES


def alltoall_s(tokens_per_engine, model: ModelSpec, par: Parallelism):
    """One all-to-all (dispatch or combine) of one MoE layer over the EP group's GPUs; 0 on one GPU."""
    return collectives.alltoall_s(
        dispatch_bytes_per_gpu(tokens_per_engine, model, par),
        par.expert_gpus,
        par.interconnect,
        par.intra_node_gb_per_s,
    )


def alltoall_rows(model: ModelSpec, par: Parallelism, tokens: list[int]) -> list[dict]:
    """The dispatch all-to-all per engine token count, for profiles.json: each rank's buffer, the bytes that
    cross to its peers, ((p − 1)/p of the buffer), and the time."""
    p = par.expert_gpus
    rows = []
    for t in tokens:
        n = float(dispatch_bytes_per_gpu(t, model, par))
        rows.append(
            {
                "tokens_per_engine": t,
                "gpus": p,
                "bytes": n,
                "crossing_bytes": n * (p - 1) / p,
                "time_s": float(alltoall_s(t, model, par)),
            }
        )
    return rows
