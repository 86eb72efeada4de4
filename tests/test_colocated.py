"""vLLM's step scheduler in colocated placement and chunked prefill: step compositions worked by hand from the
scheduler's rules (simulator/scheduler.py), step prices from the cost model's parts, queueing, direction."""

from __future__ import annotations

import dataclasses
import struct

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from costmodel.phases import IterationCost
from helpers import scenario
from simulator.config import ScenarioError
from simulator.decode import segment_sum_s, segment_time_s
from simulator.load import load_scenario
from simulator.run import BREAKDOWN_PARTS, resolve, run_scenario
from simulator.step_price import CHUNK_BLOCK, CHUNK_BLOCK_AFTER, StepPrices, iteration_of


def colo(tmp_path, rows, methods=("baseline",), **changes):
    """One colocated engine (the prefill pool left out) serving the trace `rows` of (arrival_s, prompt, output)."""
    path = tmp_path / "t.csv"
    path.write_text("arrival_s,prompt_tokens,output_tokens\n" + "".join(f"{a},{p},{o}\n" for a, p, o in rows))
    s = scenario(
        placement="colocated",
        methods=list(methods),
        **{
            "prefill": None,
            "workload": {"trace_csv": str(path), "arrival": {"kind": "trace"}, "requests": len(rows)},
            **changes,
        },
    )
    return s, run_scenario(s, keep_runs=True)


def step_s(dec, b: int, chunks, samples: int) -> float:
    """A step's fixed time from the cost model's parts: b decode rows' iteration (its fixed part), the dense
    layers over the chunks' rows added to the rows' (one pass: the weights are read once), the LM head over the
    rows and the chunks that end a prompt, each chunk's attention to its earlier tokens and itself, and the
    chunks' new KV encoded in the method's memory format (CacheGen's is FP16)."""
    L = dec.model.layers
    n = sum(c for c, _ in chunks)
    attn, _, _ = dec.prefill_attention_s(tuple(p + c for c, p in chunks), tuple(p for _, p in chunks))
    encode = 0.0 if dec.method.dequantize_on_arrival else L * dec._encode_layer_s(n)
    if b == 0:
        head = dec._lm_head_s(samples) if samples else 0.0
        return L * dec._dense_layer_s(n) + head + L * attn + encode
    dense = L * (dec._dense_layer_s(b + n) - dec._dense_layer_s(b))
    head = dec._lm_head_s(b + samples) - dec._lm_head_s(b)
    return dec.iteration(b).fixed_s + dense + head + L * attn + encode


@pytest.mark.parametrize("method", ["baseline", "hack", "cachegen"])
def test_a_mixed_step_is_priced_from_its_parts_whatever_was_priced_before(method):
    """mixed_step keeps each chunk set's attention and each token count's encoding apart from the decode rows:
    the same chunks beside other decode rows, or ending a prompt or not, price from step_s's parts every time;
    the step's per-context and non-decode parts are the rows' plain iteration's."""
    s = scenario(methods=[method], placement="colocated")
    _, dec = resolve(s).costs(s.methods[0])
    for chunks, b, samples in (
        (((1536, 0),), 8, 0),
        (((1536, 3072),), 0, 1),  # the same new tokens after earlier ones
        (((1536, 3072),), 8, 0),
        (((1536, 3072),), 8, 1),
        (((1536, 3072),), 40, 1),
        (((1536, 0),), 0, 1),
    ):
        it, share = dec.mixed_step(b, chunks, samples)
        assert it.fixed_s == pytest.approx(step_s(dec, b, chunks, samples), rel=1e-12)
        base = dec.iteration(b) if b else None
        assert it.per_ctx_s == (base.per_ctx_s if base else 0.0)
        assert (it.dequant_fixed_s, it.approx_fixed_s, it.host_s) == (
            (base.dequant_fixed_s, base.approx_fixed_s, base.host_s) if base else (0.0, 0.0, 0.0)
        )
        assert share.latency_s == pytest.approx(it.fixed_s - (base.fixed_s if base else 0.0), rel=1e-9)
    two = ((512, 0), (1000, 2048))
    assert dec.mixed_step(4, two, 1)[0].fixed_s == pytest.approx(step_s(dec, 4, two, 1), rel=1e-12)


STEPS = st.tuples(
    st.integers(0, 96),  # decode rows
    st.lists(st.tuples(st.integers(1, 4096), st.sampled_from([0, 512, 2048, 4096, 6000])), min_size=1, max_size=3),
    st.integers(0, 3),  # chunks that end their prompt
)


ITERATION_FIELDS = [f.name for f in dataclasses.fields(IterationCost)]  # the computed sums too


def bits(x: float) -> bytes:
    return struct.pack("<d", x)


def share_of(pc) -> tuple:
    """A step's chunk share (the cost model's `PrefillCost` or the tables' `Prefill`): its four times bit for bit, and
    its forms."""
    return (*(bits(x) for x in (pc.stage_s, pc.latency_s, pc.approximation_s, pc.encode_s)), pc.forms)


@pytest.mark.parametrize("method", ["baseline", "hack", "cachegen"])
@pytest.mark.parametrize(
    "changes",
    [{}, {"prefill.pipeline_parallel": 2, "decode.pipeline_parallel": 2, "decode.host_serial_s_per_iteration": 3e-4}],
)
@settings(max_examples=40, deadline=None)
@given(steps=st.lists(STEPS, min_size=1, max_size=6))
def test_a_step_priced_from_the_typed_tables_is_the_cost_models_step_bit_for_bit(method, changes, steps):
    """simulator/step_price.py (the colocated hot path) gives ReplicaCostModel.mixed_step's every double,
    bit for bit, for random steps (decode rows or none, one to three chunks, pipeline stages and a host's serial
    time or not), each priced against a fresh cost model; a repeated step is the same answer."""
    s = scenario(methods=[method], placement="colocated", **changes)
    res = resolve(s)
    prices = StepPrices(res.costs(s.methods[0])[1])
    for b, chunks, samples in steps + steps[:1]:
        chunks = tuple(chunks)
        samples = min(samples, len(chunks))
        want_it, want_share = res.costs(s.methods[0])[1].mixed_step(b, chunks, samples)
        it, share = prices.price(b, chunks, samples)
        assert [bits(getattr(it, f)) for f in ITERATION_FIELDS] == [bits(getattr(want_it, f)) for f in ITERATION_FIELDS]
        assert share_of(share) == share_of(want_share)


@pytest.mark.parametrize("method", ["baseline", "hack", "kvquant"])
def test_chunks_after_the_same_earlier_tokens_come_from_a_table_bit_for_bit(method):
    """Once CHUNK_BLOCK_AFTER lengths after the same earlier tokens were priced one by one, the rest come from a
    table the cost model fills a block at a time: every step is still mixed_step's, bit for bit, and a length
    priced both ways is the same double."""
    s = scenario(methods=[method], placement="colocated")
    res = resolve(s)
    prices = StepPrices(res.costs(s.methods[0])[1])
    rng = np.random.default_rng(5)
    lengths = [int(n) for n in rng.integers(1, 3 * CHUNK_BLOCK, 60)] + [1, CHUNK_BLOCK - 1, CHUNK_BLOCK]
    for past in (0, 2048, 5000):
        for n in lengths + lengths[:CHUNK_BLOCK_AFTER]:  # the first lengths again, from the table
            b = int(rng.integers(0, 40))
            want_it, want_share = res.costs(s.methods[0])[1].mixed_step(b, ((n, past),), 1)
            it, share = prices.price(b, ((n, past),), 1)
            assert [bits(getattr(it, f)) for f in ITERATION_FIELDS] == [
                bits(getattr(want_it, f)) for f in ITERATION_FIELDS
            ]
            assert share_of(share) == share_of(want_share)
        assert past in prices.chunk_tables


@pytest.mark.parametrize("method", ["baseline", "hack", "kvquant", "cachegen", "fp8"])
def test_lone_colocated_request_runs_its_chunks_then_decodes_in_closed_form(tmp_path, method):
    """One engine, a 4096-token prompt in chunks of 1536 (chunk_tokens; budget 16384): steps of 1536, 1536 and
    1024 tokens on an otherwise idle engine, the last yielding the first token; then 31 decode iterations from
    context 4097. The compressed formats encode each chunk's KV (KVQuant, HACK, FP8), CacheGen does not."""
    s, r = colo(tmp_path, [(0, 4096, 32)], [method], **{"decode.chunk_tokens": 1536})
    row = next(r.requests.itertuples())
    _, dec = resolve(s).costs(s.methods[0])
    steps = [((1536, 0),), ((1536, 1536),), ((1024, 3072),)]
    prefill_s = sum(step_s(dec, 0, c, int(i == 2)) for i, c in enumerate(steps))
    assert row.prefill_end_s - row.prefill_start_s == pytest.approx(prefill_s, rel=1e-12)
    # each step's price holds its KV encode (KVQuant, HACK, FP8); CacheGen's memory format is FP16
    charged = 0.0 if dec.method.dequantize_on_arrival else dec._encode_layer_s(1536)
    assert (charged > 0) == (method in ("hack", "kvquant", "fp8"))
    assert row.prefill_start_s == row.arrival_s and row.first_token_s == row.prefill_end_s
    assert row.transfer_s == 0 and row.kv_wire_bytes > 0 and row.quantize_s == 0
    it = iteration_of(dec.iteration(1))
    decode_s = segment_time_s(it, 31, 4097 - 3, 1, 3)
    assert row.finish_s - row.decode_start_s == pytest.approx(decode_s, rel=1e-12)
    assert row.decode_start_s == row.prefill_end_s
    _, _, forms = dec.prefill_attention_s((4096,), (3072,))
    approx = sum(dec.model.layers * dec.prefill_attention_s((p + c,), (p,))[1] for ((c, p),) in steps) + segment_sum_s(
        it.approx_fixed_s, it.approx_per_ctx_s, 31, 4094, 1, 3
    )
    assert row.approximation_s == pytest.approx(approx, rel=1e-12, abs=1e-15)
    assert (row.approximation_s > 0) == (method == "hack") and row.prefill_attention == forms[0]
    assert sum(getattr(row, f"{p}_s") for p in BREAKDOWN_PARTS) == pytest.approx(row.jct_s, rel=1e-12)


def test_a_step_takes_running_chunks_first_then_waiting_prompts_within_the_budget(tmp_path):
    """budget 3000 (max_batch_tokens), chunk_tokens 2048, prompts of 4096, 1000 and 500 tokens at 0 (4 output
    tokens each). Step 0: P0 min(4096, 2048, 3000) = 2048, P1 min(1000, 2048, 952) = 952, budget spent, P2
    waits. Step 1: the running first: P0 2048 (done), P1 48 (done), then P2 500 (done): three first tokens.
    Steps 2-4: three decode rows from contexts 4097, 1001, 501."""
    s, r = colo(
        tmp_path,
        [(0, 4096, 4), (0, 1000, 4), (0, 500, 4)],
        **{"decode.max_batch_tokens": 3000, "decode.chunk_tokens": 2048},
    )
    df = r.requests.sort_values("request_id")
    _, dec = resolve(s).costs(s.methods[0])
    t1 = step_s(dec, 0, ((2048, 0), (952, 0)), 0)
    t2 = t1 + step_s(dec, 0, ((2048, 2048), (48, 952), (500, 0)), 3)
    t3 = t2 + segment_time_s(iteration_of(dec.iteration(3)), 3, (4097 - 2) + (1001 - 2) + (501 - 2), 3, 2)
    assert df["prefill_start_s"].tolist() == pytest.approx([0, 0, t1], rel=1e-12)
    assert df["prefill_end_s"].tolist() == pytest.approx([t2, t2, t2], rel=1e-12)
    assert df["first_token_s"].tolist() == pytest.approx([t2, t2, t2], rel=1e-12)
    assert df["finish_s"].tolist() == pytest.approx([t3, t3, t3], rel=1e-12)


def test_decode_rows_take_their_tokens_first_and_share_a_step_with_a_chunk(tmp_path):
    """budget 2048, chunk_tokens 2048: A (1000 tokens, 3 outputs) and B (3100, 2 outputs) at 0. Step 0: A 1000
    (its first token), B 1048. Step 1: A's decode row (context 1001) takes 1 token, so B's chunk is min(2052,
    2048, 2047) = 2047, in one pass with the row: the row's iteration plus what the chunk adds. Step 2: A's row
    and B's last 5 tokens (B's first token; A's last). Step 3: B's row (context 3101), its last token."""
    s, r = colo(
        tmp_path,
        [(0, 1000, 3), (0, 3100, 2)],
        **{"decode.max_batch_tokens": 2048, "decode.chunk_tokens": 2048},
    )
    a, b = (row for _, row in r.requests.sort_values("request_id").iterrows())
    _, dec = resolve(s).costs(s.methods[0])
    per_ctx = dec.iteration(1).per_ctx_s
    t1 = step_s(dec, 0, ((1000, 0), (1048, 0)), 1)
    t2 = t1 + step_s(dec, 1, ((2047, 1048),), 0) + per_ctx * 1001
    t3 = t2 + step_s(dec, 1, ((5, 3095),), 1) + per_ctx * 1002
    t4 = t3 + segment_time_s(iteration_of(dec.iteration(1)), 1, 3101 - 3, 1, 3)
    assert (a.prefill_end_s, b.prefill_end_s) == (pytest.approx(t1, rel=1e-12), pytest.approx(t3, rel=1e-12))
    assert a.finish_s == pytest.approx(t3, rel=1e-12) and b.finish_s == pytest.approx(t4, rel=1e-12)
    assert a.decode_s == pytest.approx(t3 - t1, rel=1e-12)  # the chunks' share of its steps is A's decode time too
    assert r.summary["methods"]["baseline"]["utilisation"]["prefill"] > 0


def test_running_requests_are_capped_by_max_batch_requests(tmp_path):
    """max_batch_requests 2: three prompts of 500 at 0, 3 output tokens each. Step 0 takes P0 and P1 (budget left
    but two run), P2 waits until one finishes: both finish at the end of step 2, P2 starts at step 3."""
    s, r = colo(tmp_path, [(0, 500, 3)] * 3, **{"decode.max_batch_requests": 2, "decode.chunk_tokens": 2048})
    df = r.requests.sort_values("request_id")
    _, dec = resolve(s).costs(s.methods[0])
    t1 = step_s(dec, 0, ((500, 0), (500, 0)), 2)
    t3 = t1 + segment_time_s(iteration_of(dec.iteration(2)), 2, 2 * (501 - 1), 2, 1)
    t4 = t3 + step_s(dec, 0, ((500, 0),), 1)
    assert df["prefill_start_s"].tolist() == pytest.approx([0, 0, t3], rel=1e-12)
    assert df["prefill_end_s"].tolist() == pytest.approx([t1, t1, t4], rel=1e-12)


def test_without_chunk_tokens_prompts_are_never_split(tmp_path):
    """Chunked prefill off, budget 3000: P0 (4096 tokens) runs whole, alone in step 0. Step 1: P0's row, P1
    (2000) whole, P2 (1500) does not fit the 999 left and waits. Step 2: P0's and P1's rows and P2 whole."""
    s, r = colo(tmp_path, [(0, 4096, 4), (0, 2000, 2), (0, 1500, 2)], **{"decode.max_batch_tokens": 3000})
    p0, p1, p2 = (row for _, row in r.requests.sort_values("request_id").iterrows())
    _, dec = resolve(s).costs(s.methods[0])
    per_ctx = dec.iteration(1).per_ctx_s
    t1 = step_s(dec, 0, ((4096, 0),), 1)
    t2 = t1 + step_s(dec, 1, ((2000, 0),), 1) + per_ctx * 4097
    t3 = t2 + step_s(dec, 2, ((1500, 0),), 1) + per_ctx * (4098 + 2001)
    t4 = t3 + segment_time_s(iteration_of(dec.iteration(2)), 1, (4097 - 1) + (1501 - 3), 2, 3)
    assert [p0.prefill_end_s, p1.prefill_end_s, p2.prefill_end_s] == pytest.approx([t1, t2, t3], rel=1e-12)
    assert [p1.prefill_start_s, p2.prefill_start_s] == pytest.approx([t1, t2], rel=1e-12)
    assert [p0.finish_s, p1.finish_s, p2.finish_s] == pytest.approx([t4, t3, t4], rel=1e-12)


def test_finished_prompts_leave_the_engines_routing_count(tmp_path):
    """Two engines, prompts 100 s apart (each done long before the next): every one finds both engines idle and
    goes to the lowest index."""
    s, r = colo(tmp_path, [(100 * i, 2048, 4) for i in range(6)], prefill={"gpu": "a100_80gb", "replicas": 1})
    assert r.requests["decode_replica"].tolist() == [0] * 6


def test_prompts_arriving_together_spread_over_the_engines_and_start_at_once(tmp_path):
    """Two engines, two 4096-token prompts at 0: the first goes to engine 0 (both idle: the lowest index), the
    second to engine 1 (fewer prompt tokens queued); both engines start at 0, each with its prompt alone (one
    step of 4096 tokens, no chunk_tokens), so both first tokens come at the lone step's price."""
    s, r = colo(tmp_path, [(0, 4096, 8), (0, 4096, 8)], **{"decode.replicas": 2})
    df = r.requests.sort_values("request_id")
    _, dec = resolve(s).costs(s.methods[0])
    assert df["decode_replica"].tolist() == [0, 1] and df["prefill_start_s"].tolist() == [0.0, 0.0]
    np.testing.assert_allclose(df["prefill_end_s"], step_s(dec, 0, ((4096, 0),), 1), rtol=1e-12)


def test_md1_queueing_delay_at_a_chunked_prefill():
    """Poisson arrivals, one prefill server, every prompt run as the same chunks (one prompt at a time:
    max_batch_requests 1): mean wait = ρD / (2(1-ρ))."""
    fixed = {
        "workload.output_tokens": {"kind": "fixed", "tokens": 2},
        "network.bandwidth_gbps": 400,
        "prefill.chunk_tokens": 1024,
        "methods": ["baseline"],
    }
    base = scenario(**fixed)
    pre, _ = resolve(base).costs(base.methods[0])
    parts = [pre.prefill((past + 1024,), (past,)) for past in (0, 1024, 2048, 3072)]
    service_s = sum(p.stage_s + p.encode_s for p in parts)
    rho = 0.5
    s = scenario(
        **fixed, **{"workload.requests": 20000, "workload.arrival": {"kind": "poisson", "rate_rps": rho / service_s}}
    )
    df = run_scenario(s).requests
    assert df["prefill_queue_s"].mean() == pytest.approx(rho * service_s / (2 * (1 - rho)), rel=0.07)


@pytest.mark.parametrize("method", ["baseline", "hack"])
def test_separate_prefill_in_chunks_is_the_sum_of_its_steps(method):
    """A lone 4096-token prompt with chunk_tokens 1000 on a prefill instance: five steps (1000 x 4, then 96), each
    a forward pass over its chunk attending to the earlier ones, its KV encoded before the next."""
    s = scenario(methods=[method], **{"prefill.chunk_tokens": 1000})
    row = next(run_scenario(s).requests.itertuples())
    pre, _ = resolve(s).costs(s.methods[0])
    parts = [
        pre.prefill((past + n,), (past,))
        for past, n in ((0, 1000), (1000, 1000), (2000, 1000), (3000, 1000), (4000, 96))
    ]
    ahead = sum(p.stage_s + p.encode_s for p in parts[:-1])
    assert row.prefill_end_s - row.prefill_start_s == pytest.approx(ahead + parts[-1].latency_s, rel=1e-12)
    assert row.quantize_end_s - row.prefill_end_s == pytest.approx(parts[-1].encode_s, rel=1e-12)
    # chunks re-read the earlier chunks' KV and launch more kernels: never faster than one pass
    assert row.prefill_end_s - row.prefill_start_s >= pre.prefill((4096,)).latency_s


def test_a_prefill_instance_packs_several_prompts_chunks_into_its_budget(tmp_path):
    """budget 3000, chunk_tokens 2048, prompts of 4096 and 1000 at 0 on one prefill instance (max_batch_requests
    4): step 0 is P0's 2048 and P1's 952, step 1 P0's 2048 and P1's 48: both complete in it."""
    path = tmp_path / "t.csv"
    path.write_text("arrival_s,prompt_tokens,output_tokens\n0,4096,2\n0,1000,2\n")
    s = scenario(
        methods=["baseline"],
        **{
            "workload": {"trace_csv": str(path), "arrival": {"kind": "trace"}, "requests": 2},
            "prefill.max_batch_tokens": 3000,
            "prefill.max_batch_requests": 4,
            "prefill.chunk_tokens": 2048,
        },
    )
    df = run_scenario(s).requests.sort_values("request_id")
    pre, _ = resolve(s).costs(s.methods[0])
    s0 = pre.prefill((2048, 952), (0, 0))
    s1 = pre.prefill((4096, 1000), (2048, 952))
    end = s0.stage_s + s0.encode_s + s1.latency_s
    assert df["prefill_start_s"].tolist() == [0, 0]
    assert df["prefill_end_s"].tolist() == pytest.approx([end, end], rel=1e-12)


def test_colocated_prefill_queueing_lies_between_a_pooled_and_a_split_queue():
    """One-token requests (prefill only) on two colocated engines, each running one prompt at a time
    (max_batch_requests 1) in the same chunks: the router sends each arrival to the engine with fewer prompt
    tokens queued, so the wait is below two independent M/D/1 queues at half the rate each, and both serve."""
    fixed = {
        "workload.output_tokens": {"kind": "fixed", "tokens": 1},
        "prefill.chunk_tokens": 2048,
        "decode.chunk_tokens": 2048,
        "decode.max_batch_requests": 1,
        "placement": "colocated",
        "methods": ["baseline"],
    }
    base = scenario(**fixed)
    _, dec = resolve(base).costs(base.methods[0])
    service_s = step_s(dec, 0, ((2048, 0),), 0) + step_s(dec, 0, ((2048, 2048),), 1)
    rho = 0.6
    s = scenario(
        **fixed,
        **{"workload.requests": 20000, "workload.arrival": {"kind": "poisson", "rate_rps": 2 * rho / service_s}},
    )
    r = run_scenario(s)
    df = r.requests
    wait = df["prefill_queue_s"].mean()
    assert 0 < wait < rho * service_s / (2 * (1 - rho))
    assert np.allclose(df["prefill_end_s"] - df["prefill_start_s"], service_s, rtol=1e-12)
    assert r.summary["methods"]["baseline"]["utilisation"]["prefill"] == pytest.approx(rho, rel=0.05)
    assert 0.5 <= (df["decode_replica"] == 0).mean() < 0.65  # ties (both idle) go to replica 0


def test_colocated_saves_the_transfer_and_pays_in_decode_iterations():
    s = "scenarios/colocated_vs_disaggregated.yaml"
    sep = run_scenario(load_scenario(s, ["workload.requests=120", "methods=[baseline,hack]"]))
    col = run_scenario(load_scenario(s, ["workload.requests=120", "methods=[baseline,hack]", "placement=colocated"]))
    for m in ("baseline", "hack"):
        a, b = sep.summary["methods"][m], col.summary["methods"][m]
        assert b["breakdown_s"]["transfer"] == 0 < a["breakdown_s"]["transfer"]
        assert b["ttft_s"]["mean"] < a["ttft_s"]["mean"]
        assert b["tpot_s"]["mean"] > a["tpot_s"]["mean"]  # chunks share the decode iterations
        assert b["completed"] == 120 and b["utilisation"]["network"] == 0
    # the same four GPUs
    assert col.requests["decode_replica"].max() == 3 and sep.requests["decode_replica"].max() == 1


def test_one_engine_on_one_gpu_is_the_decode_pool_alone():
    """The shipped one-GPU scenario: placement colocated without a prefill pool is one engine."""
    s = load_scenario("scenarios/one_gpu_vllm.yaml", ["workload.requests=40"])
    assert s.prefill.replicas == 0 and s.engines == 1
    r = run_scenario(s)
    assert set(r.requests["decode_replica"]) == {0} and set(r.requests["prefill_replica"]) == {0}
    assert all(m["completed"] == 40 for m in r.summary["methods"].values())


@pytest.mark.parametrize(
    "changes, message",
    [
        ({"placement": "colocated", "prefill.gpu": "h100"}, "same gpu, tensor_parallel and pipeline_parallel"),
        ({"placement": "colocated", "prefill.chunk_tokens": 512}, "prefill.chunk_tokens: placement colocated"),
        ({"placement": "colocated", "decode.prefix_caching": True}, "prefill.prefix_caching: placement colocated"),
        ({"prefill.chunk_tokens": 0}, "prefill.chunk_tokens"),
        ({"prefill.replicas": 0}, "prefill.replicas: 0 prefill replicas only with placement colocated"),
        ({"prefill": None}, "prefill: required unless placement is colocated"),
        ({"decode.max_batch_requests": 512, "decode.max_batch_tokens": 256}, "must be at least max_batch_requests"),
    ],
)
def test_bad_colocated_settings_name_the_field(changes, message):
    with pytest.raises(ScenarioError, match=message):
        scenario(**changes)


def test_the_serving_docs_table_is_what_the_scenario_gives():
    """docs/serving.md's table for scenarios/colocated_vs_disaggregated.yaml (mean JCT / TTFT / TPOT, separate and
    colocated) is what fresh runs print: figures in a page no example test reads went stale once (the H100's profile
    changed under them)."""
    import re
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    page = (root / "docs" / "serving.md").read_text()
    label = {"FP16": "baseline", "CacheGen": "cachegen", "KVQuant": "kvquant", "FP8": "fp8", "FP4": "fp4",
             "HACK": "hack", "PQCache": "pqcache", "HCAttention": "hcattention"}  # fmt: skip
    num = r"([\d.]+) s / ([\d.]+) s / ([\d.]+) ms"
    rows = {m.group(1): m.groups()[1:] for m in re.finditer(rf"^\| (\w+) \| {num} \| {num} \|$", page, re.M)}
    assert set(rows) == set(label), sorted(rows)
    for i, sets in enumerate(([], ["placement=colocated"])):
        summary = run_scenario(load_scenario(root / "scenarios/colocated_vs_disaggregated.yaml", sets)).summary
        for name, key in label.items():
            m = summary["methods"][key]
            got = rows[name][3 * i : 3 * i + 3]
            want = (f"{m['jct_s']['mean']:.2f}", f"{m['ttft_s']['mean']:.2f}", f"{1e3 * m['tpot_s']['mean']:.1f}")
            assert tuple(got) == want, (name, sets, got, want)
