"""Decode memory as vLLM computes it (costmodel/memory.py): a worked example per GPU class against vLLM's
formula, the published H100 measurements, and KV allocated in whole blocks."""

from __future__ import annotations

import dataclasses
import math

import pytest

import catalog
from costmodel.memory import (
    SAMPLER_LOGIT_COPIES,
    activation_peak_bytes,
    kv_blocks,
    memory_budget,
    non_torch_bytes,
)
from costmodel.methods import HACK, Baseline
from costmodel.specs import GIB, GPUSpec, ModelSpec, Parallelism
from helpers import scenario
from simulator.resolve import resolve
from simulator.run import run_scenario

MIB = 2**20


def model(key: str) -> ModelSpec:
    e = catalog.entry("models", key)
    return ModelSpec(
        key=key,
        name=e["name"],
        layers=e["layers"],
        hidden_size=e["hidden_size"],
        heads=e["heads"],
        kv_heads=e["kv_heads"],
        head_dim=e["head_dim"],
        intermediate_size=e["intermediate_size"],
        vocab_size=e["vocab_size"],
        mlp=e["mlp"],
    )


def gpu(key: str, memory_bytes: float | None = None) -> GPUSpec:
    g = GPUSpec.from_fields(key, catalog.entry("gpus", key))
    return g if memory_bytes is None else dataclasses.replace(g, memory_bytes=memory_bytes)


def vllm_available_kv(total, utilization, weights, peak_activation, non_torch, cuda_graphs=0.0):
    """vLLM's worker (gpu_worker.determine_available_memory): requested - non-KV - CUDA-graph estimate, with
    non-KV = weights + the profile run's torch peak + non-torch memory."""
    return total * utilization - (weights + peak_activation + non_torch) - cuda_graphs


# The FP16 KV of one token of Llama-3.1 on every layer: 2 (K, V) x 8 KV heads x 128 x 2 B.
KV_TOKEN_8B = 32 * 2 * 8 * 128 * 2
KV_TOKEN_70B = 80 * 2 * 8 * 128 * 2
PARAMS_8B = 32 * (4096 * (4096 + 2 * 1024) + 4096 * 4096 + 3 * 4096 * 14336) + 2 * 128256 * 4096
PARAMS_70B = 80 * (8192 * (8192 + 2 * 1024) + 8192 * 8192 + 3 * 8192 * 28672) + 2 * 128256 * 8192

# One worked example per GPU class: (GPU, model, TP, utilization, max_batch_tokens, max_batch_requests), with
# each term written out by hand: the profile run's peak is the larger of the forward pass (residual + normed
# rows, 2h, plus the MLP's gate-and-up 2i/tp and activation i/tp) and the sampler run (the T final hidden rows
# plus 9.566 FP32 logits copies of min(seqs, T) rows over the vocabulary).
WORKED = {
    # Hopper: H200 141 GB, Llama-3.1-70B at TP 8, vLLM's H100-class serve defaults (8192 tokens, 1024 seqs)
    "hopper": (
        "h200",
        "llama-3.1-70b",
        8,
        0.9,
        8192,
        1024,
        {
            "weights": PARAMS_70B * 2 / 8,
            "activation": max(8192 * 2 * (2 * 8192 + 3 * 28672 / 8), 8192 * 8192 * 2 + 9.566 * 1024 * 128256 * 4),
            "non_torch": 0.55 * GIB,
            "requested": 0.9 * 143156 * MIB,  # H200: torch total_memory=143156MB (catalog source)
            "kv_token": KV_TOKEN_70B,
        },
    ),
    # Ampere datacenter: A100 80 GB, Llama-3.1-70B at TP 8, 16384 tokens, 128 seqs (the default scenario's decode)
    "ampere": (
        "a100_80gb",
        "llama-3.1-70b",
        8,
        0.9,
        16384,
        128,
        {
            "weights": PARAMS_70B * 2 / 8,
            "activation": max(16384 * 2 * (2 * 8192 + 3 * 28672 / 8), 16384 * 8192 * 2 + 9.566 * 128 * 128256 * 4),
            "non_torch": 0.55 * GIB,
            "requested": 0.9 * 85_100_068_864,  # deviceQuery of an A100-SXM4-80GB (catalog source)
            "kv_token": KV_TOKEN_70B,
        },
    ),
    # Ampere GA10x: A10G 24 GB, Llama-3.1-8B on one GPU, vLLM's defaults below 70 GiB (2048 tokens, 256 seqs)
    "ampere_ga10x": (
        "a10g",
        "llama-3.1-8b",
        1,
        0.9,
        2048,
        256,
        {
            "weights": PARAMS_8B * 2,
            "activation": max(2048 * 2 * (2 * 4096 + 3 * 14336), 2048 * 4096 * 2 + 9.566 * 256 * 128256 * 4),
            "non_torch": 0.13 * GIB,
            "requested": 0.9 * 22587 * MIB,  # A10G: torch total_memory=22587MB (catalog source)
            "kv_token": KV_TOKEN_8B,
        },
    ),
    # Ada: L4 24 GB, Llama-3.1-8B on one GPU at 0.95, 2048 tokens, 64 seqs (long_context_memory_limited's decode)
    "ada": (
        "l4",
        "llama-3.1-8b",
        1,
        0.95,
        2048,
        64,
        {
            "weights": PARAMS_8B * 2,
            "activation": max(2048 * 2 * (2 * 4096 + 3 * 14336), 2048 * 4096 * 2 + 9.566 * 64 * 128256 * 4),
            "non_torch": 0.13 * GIB,
            "requested": 0.95 * 23_570_219_008,  # deviceQuery of an L4 (catalog source)
            "kv_token": KV_TOKEN_8B,
        },
    ),
    # Turing: T4 16 GB, Llama-3.1-8B at TP 2 (it does not fit one T4), 2048 tokens, 256 seqs
    "turing": (
        "t4",
        "llama-3.1-8b",
        2,
        0.9,
        2048,
        256,
        {
            "weights": PARAMS_8B * 2 / 2,
            "activation": max(2048 * 2 * (2 * 4096 + 3 * 14336 / 2), 2048 * 4096 * 2 + 9.566 * 256 * 128256 * 4),
            "non_torch": 0.55 * GIB,
            "requested": 0.9 * 15_642_329_088,  # deviceQuery of a Tesla T4, CUDA 12.5 driver (catalog source)
            "kv_token": KV_TOKEN_8B,
        },
    ),
    # Volta: V100 16 GB, Llama-3.1-8B at TP 2, 4096 tokens, 128 seqs
    "volta": (
        "v100",
        "llama-3.1-8b",
        2,
        0.95,
        4096,
        128,
        {
            "weights": PARAMS_8B * 2 / 2,
            "activation": max(4096 * 2 * (2 * 4096 + 3 * 14336 / 2), 4096 * 4096 * 2 + 9.566 * 128 * 128256 * 4),
            "non_torch": 0.55 * GIB,
            "requested": 0.95 * 16160 * MIB,  # V100-SXM2-16GB: torch total_memory=16160MB (catalog source)
            "kv_token": KV_TOKEN_8B,
        },
    ),
}


@pytest.mark.parametrize("cls", sorted(WORKED))
def test_worked_example_per_gpu_class(cls):
    gkey, mkey, tp, util, tokens, seqs, want = WORKED[cls]
    m, g = model(mkey), gpu(gkey)
    par = Parallelism(tensor=tp, pipeline=1)
    block_bytes = 16 * want["kv_token"]  # FP16, one block of 16 tokens across the TP group
    b = memory_budget(
        g,
        m,
        par,
        gpu_memory_utilization=util,
        max_batch_tokens=tokens,
        max_batch_requests=seqs,
        block_tokens=16,
        block_bytes=block_bytes,
    )
    assert b.requested_bytes == pytest.approx(want["requested"], rel=1e-12)
    assert b.weights_bytes == pytest.approx(want["weights"], rel=1e-12)
    assert b.activation_peak_bytes == pytest.approx(want["activation"], rel=1e-12)
    assert b.non_torch_bytes == pytest.approx(want["non_torch"], rel=1e-12)
    kv_per_gpu = vllm_available_kv(g.memory_bytes, util, want["weights"], want["activation"], want["non_torch"])
    assert kv_per_gpu > 0
    assert b.kv_pool_bytes_per_gpu == pytest.approx(kv_per_gpu, rel=1e-12)
    # vLLM floors the pool to whole pages (kv_cache_utils.get_num_blocks): blocks of the whole group
    blocks = math.floor(kv_per_gpu * tp / block_bytes)
    assert b.blocks == blocks
    assert b.kv_capacity_bytes == blocks * block_bytes <= kv_per_gpu * tp


# llm-d/llm-d-benchmark config_explorer/empirical-vllm-memory-results.md: vLLM on one H100 (79.18 GiB), utilization
# 0.9, max_model_len 16000, serve defaults for a >= 70 GiB GPU (8192 batched tokens, 1024 seqs).
H100_TOTAL = 79.18 * GIB
PUBLISHED = {  # model: (hidden, intermediate, vocab, TP, peak activation GiB, non-torch GiB)
    "qwen3-0.6b": (1024, 3072, 151936, 1, 5.56, 0.13),  # the sampler copies are fitted here
    "llama-3.1-8b": (4096, 14336, 128256, 1, 4.76, 0.13),
    "qwen3-32b": (5120, 25600, 151936, 1, 5.64, 0.14),
    "llama-3.3-70b-tp2": (8192, 28672, 128256, 2, 4.84, 0.55),
    "gpt-oss-20b": (2880, 2880, 201088, 1, 7.38, 0.13),  # MoE: its forward is small beside the sampler
}


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_activation_peak_and_non_torch_against_published_h100_measurements(name):
    h, i, vocab, tp, peak_gib, non_torch_gib = PUBLISHED[name]
    m = ModelSpec(
        key=name,
        name=name,
        layers=2,
        hidden_size=h,
        heads=h // 128,
        kv_heads=8,
        head_dim=128,
        intermediate_size=i,
        vocab_size=vocab,
    )
    got = activation_peak_bytes(m, tp, 8192, 1024) / GIB
    assert got == pytest.approx(peak_gib, rel=0.01)
    assert non_torch_bytes(tp) / GIB == pytest.approx(non_torch_gib, abs=0.011)


def test_sampler_copies_come_from_the_qwen_point():
    """SAMPLER_LOGIT_COPIES is Qwen3-0.6B's published peak less its hidden rows, over its FP32 logits."""
    assert SAMPLER_LOGIT_COPIES == pytest.approx((5.56 * GIB - 8192 * 1024 * 2) / (1024 * 151936 * 4), abs=5e-4)


def test_llama_8b_kv_pool_on_h100_matches_the_published_run():
    """Llama-3.1-8B on an H100: weights 14.99 GiB, peak activation 4.76, non-torch 0.13, KV 51.38 GiB measured
    (CUDA-graph memory -0.45 GiB reported, not subtracted); the model's terms within 1 %."""
    m = model("llama-3.1-8b")
    b = memory_budget(
        gpu("h100", H100_TOTAL),
        m,
        Parallelism(tensor=1, pipeline=1),
        gpu_memory_utilization=0.9,
        max_batch_tokens=8192,
        max_batch_requests=1024,
        block_tokens=16,
        block_bytes=16 * KV_TOKEN_8B,
    )
    assert b.requested_bytes / GIB == pytest.approx(71.26, abs=0.01)
    assert b.weights_bytes / GIB == pytest.approx(14.99, rel=0.01)
    assert b.kv_pool_bytes_per_gpu / GIB == pytest.approx(51.38, rel=0.01)
    assert b.kv_pool_bytes_per_gpu / GIB == pytest.approx(
        vllm_available_kv(H100_TOTAL, 0.9, b.weights_bytes, b.activation_peak_bytes, b.non_torch_bytes) / GIB, rel=1e-12
    )


def test_blocks_round_up_per_request_and_down_for_the_pool():
    assert [kv_blocks(t, 16) for t in (0, 1, 15, 16, 17, 32, 33)] == [0, 1, 1, 1, 2, 2, 3]
    assert kv_blocks(4096 + 32, 16) == 258 and kv_blocks(5, 1) == 5
    s = scenario(methods=["baseline", "hack"], **{"workload.output_tokens": {"kind": "fixed", "tokens": 30}})
    res = resolve(s)
    for method in (Baseline(), HACK()):
        _, dec = res.costs(method)
        per_token = method.memory_bytes_per_token(res.model)
        reserve = method.memory_reserve_bytes_per_request(res.model)
        # 4096 + 30 = 4126 tokens: 258 blocks of 16, the last one 6 tokens full
        assert dec.kv_memory_bytes(4126) == pytest.approx(258 * 16 * per_token + reserve, rel=1e-12)
        assert dec.kv_capacity_bytes % dec.block_bytes == pytest.approx(0, abs=1e-3)
        assert dec.kv_capacity_bytes <= dec.memory.kv_pool_bytes < dec.kv_capacity_bytes + dec.block_bytes
    row = run_scenario(
        scenario(methods=["baseline"], **{"workload.output_tokens": {"kind": "fixed", "tokens": 30}})
    ).requests.iloc[0]
    assert row.kv_memory_bytes == 258 * 16 * KV_TOKEN_8B


def test_block_tokens_one_is_exact_bytes_and_sizes_change_capacity():
    s1 = scenario(methods=["baseline"], **{"decode.block_tokens": 1})
    s64 = scenario(methods=["baseline"], **{"decode.block_tokens": 64})
    _, d1 = resolve(s1).costs(s1.methods[0])
    _, d64 = resolve(s64).costs(s64.methods[0])
    assert d1.kv_memory_bytes(4127) == 4127 * KV_TOKEN_8B
    assert d64.kv_memory_bytes(4127) == 65 * 64 * KV_TOKEN_8B
    assert d1.memory.kv_pool_bytes == d64.memory.kv_pool_bytes
    assert d64.kv_capacity_bytes <= d1.kv_capacity_bytes


def test_fixed_pool_is_floored_to_blocks_and_reported():
    result = run_scenario(scenario(methods=["baseline"], **{"decode.kv_capacity_gib": 3.0}))
    mem = result.summary["methods"]["baseline"]["decode_memory"]
    block = 16 * KV_TOKEN_8B
    assert mem["fixed_pool_bytes"] == 3 * GIB
    assert mem["blocks"] == 3 * GIB // block and mem["kv_capacity_bytes"] == mem["blocks"] * block
    assert result.summary["methods"]["baseline"]["decode_kv_capacity_bytes"] == mem["kv_capacity_bytes"]


def test_summary_reports_every_term_and_they_add_up():
    result = run_scenario(scenario(methods=["baseline", "hack"]))
    for stats in result.summary["methods"].values():
        mem = stats["decode_memory"]
        non_kv = mem["weights_bytes"] + mem["activation_peak_bytes"] + mem["non_torch_bytes"] + mem["cuda_graph_bytes"]
        assert mem["kv_pool_bytes_per_gpu"] == pytest.approx(mem["requested_bytes"] - non_kv, rel=1e-12)
        assert mem["kv_capacity_bytes"] == mem["blocks"] * mem["block_bytes"]
        assert stats["decode_kv_capacity_bytes"] == mem["kv_capacity_bytes"]
        # one A100 80 GB as the driver reports it (deviceQuery, catalog source), default 0.9
        assert mem["requested_bytes"] == pytest.approx(0.9 * 85_100_068_864, rel=1e-12)
    # HACK's blocks are smaller: more of them in the same pool
    ms = result.summary["methods"]
    assert ms["hack"]["decode_memory"]["blocks"] > ms["baseline"]["decode_memory"]["blocks"]


def test_cuda_graph_and_non_torch_terms_come_off_the_pool():
    base = resolve(scenario(methods=["baseline"]))
    more = resolve(scenario(methods=["baseline"], **{"decode.cuda_graph_gib": 1.0, "decode.non_torch_gib": 2.0}))
    _, d0 = base.costs(Baseline())
    _, d1 = more.costs(Baseline())
    assert d0.memory.kv_pool_bytes_per_gpu - d1.memory.kv_pool_bytes_per_gpu == pytest.approx(
        1.0 * GIB + 2.0 * GIB - 0.13 * GIB, rel=1e-12
    )


def test_a_model_that_leaves_no_block_is_refused_naming_the_terms():
    with pytest.raises(Exception, match="activation peak"):
        run_scenario(scenario(methods=["baseline"], **{"decode.gpu": "t4"}))
