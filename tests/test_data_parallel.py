"""Data-parallel attention with expert parallelism (decode.data_parallel): vLLM's DP load-balancing rule by hand,
the dispatch all-to-all's bytes and time, the MoE block and the weights and KV pool per GPU by hand, the
lock-step padding, the scenario's refusals, and conservation under hypothesis."""

from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import catalog
from costmodel import expert_parallel
from costmodel.memory import NON_TORCH_BYTES_TPN, SAMPLER_LOGIT_COPIES
from costmodel.phases import ReplicaCostModel
from costmodel.specs import FP16_BYTES, GIB, Parallelism
from helpers import scenario
from simulator.config import ScenarioError
from simulator.data_parallel import DataParallelRouter
from simulator.load import load_scenario
from simulator.resolve import resolve
from simulator.run import MethodRun, run_scenario
from simulator.workload import make_requests

QWEN = catalog.entry("models", "qwen3-30b-a3b")
H, E, K, EI, L, V = (QWEN[f] for f in ("hidden_size", "experts", "active_experts", "expert_intermediate_size",
                                        "layers", "vocab_size"))  # fmt: skip


def dp_scenario(dp: int = 4, tp: int = 1, **changes):
    """Qwen3-30B-A3B decoded by `dp` engines of `tp` A100s each (no instance: the roofline profiles)."""
    base = {
        "model": "qwen3-30b-a3b",
        "prefill.tensor_parallel": 2,
        "prefill.gpu": "a100_80gb",
        "prefill.max_batch_requests": 8,
        "decode.gpu": "a100_80gb",
        "decode.interconnect": "nvswitch",
        "decode.intra_node_gb_per_s": 300,
        "decode.tensor_parallel": tp,
        "decode.data_parallel": dp,
        "decode.expert_parallel": True,
        "methods": ["baseline"],
    }
    return scenario(**{**base, **changes})


# ---- routing: vLLM's DPLBAsyncMPClient rule -----------------------------------------------------------------
def _router(engines: list[tuple[int, int, int]]) -> DataParallelRouter:
    """A router over stub engines given as (running batch, admitted requests, queued for room)."""
    decode = [SimpleNamespace(index=i, batch=b, slots_used=s) for i, (b, s, _) in enumerate(engines)]
    r = DataParallelRouter(
        SimpleNamespace(),
        None,
        [SimpleNamespace()],
        decode,  # pyright: ignore[reportArgumentType]
        {(0, i): SimpleNamespace() for i in range(len(engines))},  # pyright: ignore[reportArgumentType]
        math.inf,
        False,
        1,
        groups=[],
    )
    for q, (_, _, queued) in zip(r.queues, engines):
        q.extend(range(queued))
    return r


def test_load_balancer_scores_waiting_four_times_running_by_hand():
    """score = 4 * waiting + running, waiting = queued + admitted but not running (KV moving, not yet joined,
    preempted); the lowest score wins, the lowest rank on a tie (PR #47420's description of the rule)."""
    r = _router([(3, 3, 0), (1, 2, 0), (0, 0, 1), (2, 2, 0)])
    assert [r.score(e) for e in r.decode] == [3, 4 * 1 + 1, 4 * 1 + 0, 2]
    assert r.pick_engine(0).index == 3
    r = _router([(3, 3, 0), (1, 2, 0), (0, 0, 1), (3, 3, 0)])  # engines 0 and 3 tie at 3
    assert r.pick_engine(0).index == 0
    # a running request weighs less than a waiting one: 3 running beat 1 waiting (4 * 1 > 3)
    r = _router([(0, 1, 0), (3, 3, 0)])
    assert r.pick_engine(0).index == 1


def test_a_burst_is_spread_round_robin_and_stays_on_its_engine():
    """Eight prompts prefilled in one batch are ready at once: each routed request waits on its engine (score 4)
    until the next is routed, so the rule deals them out 0, 1, 2, 3, 0, 1, 2, 3; none moves afterwards."""
    s = dp_scenario(**{"workload.requests": 8, "workload.input_tokens": {"kind": "fixed", "tokens": 512}})
    reqs = make_requests(s)
    reqs.arrival_s[:] = 0.0  # all at once: one prefill batch of 8 x 512 tokens
    run = MethodRun(resolve(s), s.methods[0], reqs, "test")
    run.simulate()
    df = run.requests_frame()
    assert len(set(df["prefill_end_s"])) == 1
    assert list(df["decode_replica"]) == [0, 1, 2, 3, 0, 1, 2, 3]
    assert run.records.completed == 8
    assert set(run.memory_frame()["replica"]) == {0, 1, 2, 3}  # each engine its own KV pool


# ---- costs by hand ---------------------------------------------------------------------------------------------
def test_dispatch_alltoall_bytes_and_time_by_hand():
    """DP 8 x TP 1 on a p5.48xlarge (NVSwitch, 450 GB/s per direction; alltoall: 7.54 us, bus efficiency
    0.822): 32 tokens per engine, each of its 8 expert copies 2048 BF16 values: 32 * 8 * 2048 * 2 = 1 MiB per
    rank, 7/8 of it crossing; TP 2 halves each rank's share of the engine's tokens."""
    s = load_scenario("scenarios/moe_dp_ep.yaml")
    res = resolve(s)
    m, par = res.model, res.decode.parallel
    (row,) = expert_parallel.alltoall_rows(m, par, [32])
    assert row["gpus"] == 8 and row["bytes"] == 32 * 8 * 2048 * 2 == 1048576
    assert row["crossing_bytes"] == 1048576 * 7 / 8
    assert row["time_s"] == pytest.approx(7.54e-6 + 1048576 * 7 / 8 / (0.822 * 450e9), rel=1e-12)
    s2 = load_scenario("scenarios/moe_dp_ep.yaml", ["decode.data_parallel=4", "decode.tensor_parallel=2"])
    (row2,) = expert_parallel.alltoall_rows(m, resolve(s2).decode.parallel, [32])
    assert row2["gpus"] == 8 and row2["bytes"] == 16 * 8 * 2048 * 2


def _grouped_gemm_by_hand(prof, rows, n, kd, groups):
    """One fused-MoE GEMM at the roofline: FLOPs or bytes (each touched expert's weights once), one launch."""
    return prof.launch_overhead_s + max(
        2 * rows * n * kd / (prof.matmul_fp16_tflops * 1e12),
        FP16_BYTES * (groups * n * kd + rows * kd + rows * n) / (prof.memory_gbps * 1e9),
    )


@pytest.mark.parametrize("tokens", [1, 32])
def test_moe_block_of_a_data_parallel_engine_by_hand(tokens):
    """DP 4 x TP 2 (8 GPUs, 16 experts each): an engine's `tokens` are padded on every engine alike, so the
    experts see 4 * tokens; each GPU runs 4*tokens*8/8 expert rows over 1/8 of the distinct experts
    128*(1-(1-8/128)^(4*tokens)) those touch, its router runs on tokens/2 rows, and two all-to-alls of
    tokens/2 * 8 * 2048 * 2 bytes per rank cross 7/8 of it (a lone request: its engine's dummy-padded peers
    add 3 more tokens to the experts)."""
    s = dp_scenario(dp=4, tp=2)
    _, dec = resolve(s).costs(s.methods[0])
    prof = dec.profile
    group = 4 * tokens
    rows, groups = group * K / 8, E * (1 - (1 - K / E) ** group) / 8
    router = _grouped_gemm_by_hand(prof, tokens / 2, E, H, 1)  # a plain GEMM reads its one weight matrix once
    experts = _grouped_gemm_by_hand(prof, rows, 2 * EI, H, groups) + _grouped_gemm_by_hand(prof, rows, H, EI, groups)
    a2a = 7.54e-6 + 7 / 8 * (tokens / 2 * K * H * 2) / (0.822 * 300e9)
    assert dec._moe_s(tokens) == pytest.approx(router + experts + 2 * a2a, rel=1e-12)


def test_weights_and_kv_pool_per_gpu_by_hand():
    """Qwen3-30B-A3B, DP 8 x TP 1 on H100s (85.05e9 bytes, deviceQuery) at 0.9: each GPU holds the attention, router and embedding
    weights whole and 16 of every layer's 128 experts; the KV pool is the rest after the sampler-run peak
    and the EP group's non-torch memory, one pool per engine, no KV head replicated."""
    s = load_scenario("scenarios/moe_dp_ep.yaml")
    _, dec = resolve(s).costs(s.methods[0])
    attn = H * (32 * 128 + 2 * 4 * 128) + 32 * 128 * H
    router = H * E
    expert_params = L * E * 3 * H * EI
    other = L * (attn + router) + 2 * V * H
    weights = 2 * other + 2 * expert_params / 8
    assert dec.memory.weights_bytes == pytest.approx(weights, rel=1e-12)
    assert weights / GIB == pytest.approx(9.62, abs=0.01)
    sampler = 16384 * H * 2 + SAMPLER_LOGIT_COPIES * 256 * V * 4
    pool = 0.9 * 85_045_477_376 - weights - sampler - NON_TORCH_BYTES_TPN  # an H100 as the driver reports it
    assert dec.memory.kv_pool_bytes_per_gpu == pytest.approx(pool, rel=1e-12)
    block = 16 * L * 2 * 4 * 128 * 2  # 16 tokens, K and V of 4 KV heads, FP16: nothing replicated at TP 1
    assert dec.block_bytes == block and dec.kv_capacity_bytes == math.floor(pool / block) * block
    # the same 8 GPUs as one TP 8 engine: 4 KV heads over 8 GPUs are held twice
    s8 = load_scenario("scenarios/moe_dp_ep.yaml", ["decode.data_parallel=1", "decode.tensor_parallel=8"])
    _, tp8 = resolve(s8).costs(s8.methods[0])
    assert tp8.block_bytes == 2 * block
    assert tp8.memory.weights_bytes == pytest.approx((2 * other + 2 * expert_params) / 8, rel=1e-12)


def test_weights_per_gpu_of_a_replica_in_pipeline_stages_by_hand():
    """Without data parallelism every weight, experts included, is spread over the replica's T x PP GPUs: Qwen3-
    30B-A3B at TP 2 x PP 2 holds params x 2 / 4 bytes per GPU, sliced or whole experts alike; at DP 2 x TP 2 x
    PP 2 the experts of a stage go over its 4 GPUs of the EP group (the stage's half of them over DP x TP), the
    rest over the engine's 4."""
    s = load_scenario("scenarios/moe_dp_ep.yaml")
    model = resolve(s).costs(s.methods[0])[1].model
    experts = L * E * 3 * H * EI
    for ep in (False, True):
        par = Parallelism(tensor=2, pipeline=2, expert_parallel=ep)
        assert expert_parallel.weights_bytes_per_gpu(model, par) == pytest.approx(2 * model.params / 4, rel=1e-12)
    par = Parallelism(tensor=2, pipeline=2, expert_parallel=True, data_parallel=2)
    want = 2 * ((model.params - experts) / 4 + experts / (2 * 2 * 2))
    assert expert_parallel.weights_bytes_per_gpu(model, par) == pytest.approx(want, rel=1e-12)


# ---- lock-step ---------------------------------------------------------------------------------------------------
def _two_engines(out0: int, out1: int):
    """DP 2, reserve admission: requests 0-2 (prompt 256, out0 tokens) join engine 0 and request 3 (prompt 256,
    out1 tokens) engine 1, all at t = 0, each engine starting its batch whole; driven without the router."""
    s = dp_scenario(
        dp=2,
        **{
            "decode.admission": "reserve",
            "workload.requests": 4,
            "workload.input_tokens": {"kind": "fixed", "tokens": 256},
        },
    )
    reqs = make_requests(s)
    reqs.output_tokens[:] = [out0, out0, out0, out1]
    run = MethodRun(resolve(s), s.methods[0], reqs, "test")
    e0, e1 = run.decode_replicas
    rec = run.records
    for rep, rids in ((e0, [0, 1, 2]), (e1, [3])):
        for rid in rids:
            rep.reserve(rec.admit_bytes[rid], 0.0)
        rep.joining.extend(rids)
        rep.wake()
    run.env.run()
    return run, rec


def _steps_s(cost, n: int, ctx: int, b: int, first: int = 0) -> list[float]:
    """Iteration times j = first .. n-1 of a batch of b requests that joined with ctx tokens each."""
    return [cost.fixed_s + cost.per_ctx_s * b * (ctx + j) for j in range(first, n)]


def test_an_engine_steps_padded_to_the_groups_largest_batch():
    """Engine 1's lone request while engine 0 holds 3: every step runs its dense layers and experts at 3 padded
    rows (vLLM's DP padding), its attention and LM head at 1: its 400 iterations take exactly the sum of
    lockstep_iteration(1, 3)'s, which exceed batch 1's by 48 layers of the dense layer at 3 rows against 1."""
    run, rec = _two_engines(out0=1000, out1=400)
    cost = run.decode_replicas[1].cost
    padded = cost.lockstep_iteration(1, 3)
    base = ReplicaCostModel.iteration(cost, 1)  # the engine's iteration as a lone replica's
    assert padded.fixed_s - base.fixed_s == pytest.approx(
        L * (cost._dense_layer_s(3) - cost._dense_layer_s(1)), rel=1e-12
    )
    assert padded.per_ctx_s == base.per_ctx_s
    assert rec.finish[3] - rec.decode_join[3] == pytest.approx(sum(_steps_s(padded, 400, 256, 1)), rel=1e-12)
    assert sum(_steps_s(padded, 400, 256, 1)) > sum(_steps_s(base, 400, 256, 1)) * 1.05


def test_an_engine_is_priced_again_when_the_largest_batch_leaves():
    """Engine 0's three requests finish after 100 iterations; engine 1 then ends the iteration in progress at
    3 padded rows and runs the rest of its request's 400 at its own batch of 1."""
    run, rec = _two_engines(out0=100, out1=400)
    e0, e1 = run.decode_replicas
    three = e0.cost.iteration(3)
    t0 = sum(_steps_s(three, 100, 256, 3))
    assert rec.finish[0] == pytest.approx(t0, rel=1e-12)
    base = ReplicaCostModel.iteration(e1.cost, 1)
    padded = e1.cost.lockstep_iteration(1, 3)
    steps = _steps_s(padded, 400, 256, 1)
    m = int(np.searchsorted(np.cumsum(steps), t0, side="right")) + 1  # the iteration in progress at t0 ends padded
    expected = sum(steps[:m]) + sum(_steps_s(base, 400, 256, 1, first=m))
    assert 0 < m < 400
    assert rec.finish[3] == pytest.approx(expected, rel=1e-12)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.fixed_dictionaries(
        {
            "workload.requests": st.integers(1, 30),
            "workload.seed": st.integers(0, 10_000),
            "workload.arrival": st.fixed_dictionaries(
                {"kind": st.sampled_from(["poisson", "bursty"]), "rate_rps": st.floats(0.5, 50.0)}
            ),
            "workload.input_tokens": st.fixed_dictionaries(
                {"kind": st.just("uniform"), "min_tokens": st.integers(1, 500), "max_tokens": st.integers(500, 6000)}
            ),
            "workload.output_tokens": st.fixed_dictionaries(
                {"kind": st.just("uniform"), "min_tokens": st.integers(1, 4), "max_tokens": st.integers(4, 200)}
            ),
            "prefill.replicas": st.integers(1, 2),
            "decode.replicas": st.integers(1, 2),
            "decode.max_batch_requests": st.integers(1, 16),
            "decode.gpu_memory_utilization": st.floats(0.45, 0.9),  # DP 2 x TP 1 holds 32 GB of weights per GPU
            "decode.admission": st.sampled_from(["on_demand", "reserve"]),
            "network.bandwidth_gbps": st.floats(1.0, 400.0),
            "methods": st.lists(st.sampled_from(["baseline", "hack", "kvquant"]), min_size=1, max_size=2, unique=True),
        }
    ),
    st.sampled_from([(2, 1), (4, 1), (2, 2), (8, 1)]),
)
def test_every_request_finishes_once_with_data_parallel_engines(changes, layout):
    dp, tp = layout
    s = dp_scenario(dp=dp, tp=tp, **changes)
    result = run_scenario(s, keep_runs=True)
    n = s.workload.requests
    for name, run in result.runs.items():
        rows = result.requests[result.requests["method"] == name]
        assert run.records.completed == n
        assert sorted(rows["request_id"]) == list(range(n))
        assert rows["finish_s"].notna().all() and (rows["finish_s"] >= rows["arrival_s"]).all()
        assert len(run.decode_replicas) == dp * s.decode.replicas
        for rep in run.decode_replicas:
            used = [u for (_, r, u) in run.records.memory_log if r == rep.index]
            assert max(used, default=0.0) <= rep.capacity_bytes * (1 + 1e-12)
            assert abs(rep.reserved_bytes) < 1e-3
        moved = rows[rows["decode_replica"] >= 0]
        assert (moved["decode_replica"] < dp * s.decode.replicas).all()
        assert np.isfinite(moved["jct_s"]).all()


# ---- refusals ----------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "changes, message",
    [
        ({"prefill.data_parallel": 2}, "prefill.data_parallel"),
        ({"decode.expert_parallel": False}, "decode.expert_parallel: true"),
        ({"model": "llama-3.1-8b", "decode.expert_parallel": False}, "mixture of experts"),
        ({"decode.data_parallel": 3}, "do not spread evenly"),
        ({"placement": "shared_gpu"}, "placement separate"),
        ({"decode.pipeline_parallel": 2}, "pipeline_parallel: 1"),
        ({"decode.instance": "p4de.24xlarge", "decode.data_parallel": 4, "decode.tensor_parallel": 4}, "exceed"),
    ],
)
def test_what_data_parallel_engines_refuse(changes, message):
    with pytest.raises(ScenarioError, match=message):
        dp_scenario(**changes)
