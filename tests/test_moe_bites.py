"""A MoE prefill priced term by term by hand (costmodel/phases.py, module docstring and `_moe_s`): Qwen3-30B-A3B
(catalog: 48 layers, hidden 2048, 32 query / 4 KV heads of 128, 128 experts of width 768, top 8, vocab 151,936)
on one A100 with the roofline profile, one 4096-token prompt, FP16 KV (baseline).

Only the profile's rates (matmul TFLOP/s, memory GB/s, launch overhead, the FP16 prefill-attention fit) are
read from the code; every shape, byte and FLOP count is written out here. A dropped term (an elementwise
kernel's bytes, a GEMM, the router) moves the prefill by 2 % or more: the comparison is to 1e-9."""

from __future__ import annotations

import pytest

from helpers import scenario
from simulator.resolve import resolve

TOKENS = 4096
LAYERS, H, HEADS, KV_HEADS, HEAD_DIM = 48, 2048, 32, 4, 128
EXPERTS, K, EI, VOCAB = 128, 8, 768, 151_936
Q_DIM, KV_DIM = HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM  # 4096, 512
FP16 = 2


@pytest.fixture(scope="module")
def cost():
    s = scenario(model="qwen3-30b-a3b", methods=["baseline"])
    pre, _ = resolve(s).costs(s.methods[0])
    assert pre.parallel.tensor == 1 and pre.profile.gemm is None and "elementwise" not in pre.profile.kernels
    assert pre.prefill_efficiency == 1.0 and pre.prefill_host_s(1) == 0.0  # the roofline, no engine terms
    return pre


def roofline(cost, flops, bytes_):
    p = cost.profile
    return p.launch_overhead_s + max(flops / (p.matmul_fp16_tflops * 1e12), bytes_ / (p.memory_gbps * 1e9))


def gemm(cost, m, n, k):
    """(m x k) @ (k x n): 2mnk FLOPs, every operand read or written once."""
    return roofline(cost, 2 * m * n * k, FP16 * (n * k + m * k + m * n))


def grouped_gemm(cost, rows, n, k, groups):
    """A fused MoE GEMM: `rows` rows over `groups` experts' (k x n) weights, each read once."""
    return roofline(cost, 2 * rows * n * k, FP16 * (groups * n * k + rows * k + rows * n))


def elementwise_bytes_per_token():
    """FP16 bytes read + written per token by the layer's unfused kernels: RMSNorm 2h twice, RoPE (multiply 2r,
    rotate 2r, multiply-add 3r over r = q + kv dims), SiLU 2i and the gate product 3i over i = k x 768 (the
    experts' width a token produces), two residual adds of 3h; MoE: the permutation of the k copies (read and
    write k h) and their weighted sum (read k h, write h)."""
    r, i = Q_DIM + KV_DIM, K * EI
    dense = 2 * 2 * H + (2 + 2 + 3) * r + (2 + 3) * i + 2 * 3 * H
    moe = 2 * K * H + (K + 1) * H
    return FP16 * (dense + moe)


def test_moe_elementwise_kernels_by_hand(cost):
    """Nine dense kernels and three MoE ones (routing softmax + top-k, permute, weighted sum), each a launch,
    plus the bytes at the memory rate: 166,912 dense + 102,400 MoE bytes per token."""
    assert elementwise_bytes_per_token() == 166_912 + 102_400
    p = cost.profile
    want = 12 * p.launch_overhead_s + TOKENS * elementwise_bytes_per_token() / (p.memory_gbps * 1e9)
    assert cost.elementwise_layer_s(TOKENS) == pytest.approx(want, rel=1e-12)


def test_moe_prefill_by_hand(cost):
    """Per layer: QKV and O GEMMs, the elementwise kernels, the router GEMM, the experts' two grouped GEMMs over
    the E(1 - (1 - k/E)^T) experts the prompt touches, FP16 causal attention over T(T+1)/2 query-key pairs
    (4 x 32 heads x 128 FLOPs each) by the profile's fit; no all-reduce at TP 1. Then the LM head on one row."""
    p = cost.profile
    touched = EXPERTS * (1 - (1 - K / EXPERTS) ** TOKENS)
    assert touched == pytest.approx(EXPERTS, rel=1e-12)  # a 4096-token prompt touches every expert
    rows = TOKENS * K
    moe = (
        gemm(cost, TOKENS, EXPERTS, H)  # router
        + grouped_gemm(cost, rows, 2 * EI, H, touched)  # gate and up
        + grouped_gemm(cost, rows, H, EI, touched)  # down
    )
    elementwise = 12 * p.launch_overhead_s + TOKENS * elementwise_bytes_per_token() / (p.memory_gbps * 1e9)
    dense = gemm(cost, TOKENS, Q_DIM + 2 * KV_DIM, H) + gemm(cost, TOKENS, H, Q_DIM) + elementwise + moe
    attention = p.kernels["prefill_attn.fp16"].time_s(4 * HEADS * HEAD_DIM * TOKENS * (TOKENS + 1) / 2)
    want = LAYERS * (dense + attention) + gemm(cost, 1, VOCAB, H)
    c = cost.prefill((TOKENS,))
    assert c.forms == ("fp16",) and c.encode_s == 0.0 and c.approximation_s == 0.0
    assert c.latency_s == pytest.approx(want, rel=1e-9)
    assert c.stage_s == pytest.approx(want, rel=1e-9)  # one pipeline stage
    # the MoE-specific elementwise bytes alone are worth more than 2 % of the prefill
    assert LAYERS * TOKENS * FP16 * (2 * K * H + (K + 1) * H) / (p.memory_gbps * 1e9) > 0.02 * want
