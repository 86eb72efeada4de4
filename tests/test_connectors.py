"""Where a prefilled request's KV waits, per `network.kv_connector` (simulator/connectors.py), worked out by
hand from the connectors' rules, and the default keeping every output.

The timelines: three requests arrive at t = 0 on one prefill and one decode replica (FP16, 1024-token
prompts, 32 output tokens). The decode KV pool (0.2 GiB) holds one request's final KV (1056 x 131,072 B =
0.129 GiB), not two, so each request waits for the one before it to finish. The prices are the cost model's
(not under test): P, a prompt's prefill; T, its transfer (wire bytes over 10 Gbps at efficiency 1); what is
under test is who waits where and what the wait blocks:

* host_parked: the KV waits in prefill host memory (large), so the prefill runs on: the prompts start at
  0, P, 2P; request i's transfer starts when request i-1 has finished (decode memory).
* nixl_pull, with a prefill KV pool (0.2 GiB) that holds one prompt's blocks (0.125 GiB), not two: a
  prompt's blocks stay in the pool until the decode has read them, so prompt i+1 starts only when request
  i's transfer has ended, which is only after request i-1 has finished.
* p2p_push: the KV is pushed at once (transfer start = KV ready: no wait before the transfer), and the
  prefill's next step waits for the push: prompt i+1 starts at the end of push i; the pushed KV waits in the
  decode GPU's buffer (or, when it is full, in its host pool and is copied back over PCIe when admitted) until
  request i-1 has finished.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from helpers import scenario
from simulator.config import ScenarioError
from simulator.resolve import resolve
from simulator.run import run_scenario

PROMPT, OUT = 1024, 32
LINK_B_PER_S = 10e9 / 8  # 10 Gbps, efficiency 1
FP16_TOKEN_BYTES = 131072  # Llama-3.1-8B: 2 x 8 KV heads x 128 x 32 layers x 2 B


def _scenario(tmp_path, n=3, **changes):
    trace = tmp_path / "trace.csv"
    trace.write_text("arrival_s,prompt_tokens,output_tokens\n" + f"0.0,{PROMPT},{OUT}\n" * n)
    return scenario(
        methods=["baseline"],
        **{
            "workload.trace_csv": str(trace),
            "workload.arrival": {"kind": "trace"},
            "workload.requests": n,
            "decode.kv_capacity_gib": 0.2,
            "decode.admission": "reserve",
            **changes,
        },
    )


def _run(s):
    return run_scenario(s).requests.sort_values("request_id").reset_index(drop=True)


def _prices(s):
    pre, dec = resolve(s, "test").costs(s.methods[0])
    p = pre.prefill((PROMPT,), None)
    assert p.encode_s == 0.0 and p.stage_s == p.latency_s  # FP16: no quantize step, one pipeline stage
    wire = pre.wire_bytes(PROMPT)
    assert wire == PROMPT * FP16_TOKEN_BYTES
    return p.latency_s, wire / LINK_B_PER_S, wire, dec


def test_host_parked_the_prefill_runs_on_and_the_kv_waits_for_decode_memory(tmp_path):
    s = _scenario(tmp_path)
    P, T, _, _ = _prices(s)
    df = _run(s)
    assert list(df.prefill_start_s) == pytest.approx([0.0, P, 2 * P])
    # request 0 is admitted at once; 1 and 2 when the one before has finished
    assert list(df.transfer_start_s) == pytest.approx([P, df.finish_s[0], df.finish_s[1]])
    assert list(df.transfer_end_s - df.transfer_start_s) == pytest.approx([T] * 3)
    kv_wait = df.transfer_start_s - df.prefill_end_s
    assert list(kv_wait) == pytest.approx([0.0, df.finish_s[0] - 2 * P, df.finish_s[1] - 3 * P])
    assert df.finish_s[0] > 3 * P  # the waits are real: the prefill ran ahead of the decode


def test_nixl_pull_holds_the_blocks_in_the_prefill_pool_and_blocks_new_prompts(tmp_path):
    s = _scenario(tmp_path, **{"network.kv_connector": "nixl_pull", "prefill.kv_capacity_gib": 0.2})
    P, T, _, _ = _prices(s)
    df = _run(s)
    # prompt 1 waits for request 0's read (transfer end); prompt 2 for request 1's, which starts only when
    # request 0 has finished (decode memory)
    assert df.prefill_start_s[0] == 0.0
    assert df.prefill_start_s[1] == pytest.approx(P + T)
    assert df.transfer_start_s[1] == pytest.approx(df.finish_s[0])
    assert df.prefill_start_s[2] == pytest.approx(df.finish_s[0] + T)
    assert df.transfer_start_s[2] == pytest.approx(df.finish_s[1])
    assert list(df.transfer_end_s - df.transfer_start_s) == pytest.approx([T] * 3)
    # the wait moved to the prefill queue: prompt 2 queued far longer than under host_parked (2P)
    assert df.prefill_queue_s[2] > 2 * P + T


def test_nixl_pull_refuses_a_prompt_larger_than_the_prefill_pool(tmp_path):
    s = _scenario(tmp_path, **{"network.kv_connector": "nixl_pull", "prefill.kv_capacity_gib": 0.1})
    with pytest.raises(ScenarioError, match="network.kv_connector: nixl_pull"):
        run_scenario(s)


@pytest.mark.parametrize("buffer", ["gpu", "pool"])
def test_p2p_push_pushes_at_once_and_the_kv_waits_on_the_decode_side(tmp_path, buffer):
    # a 1 GiB buffer holds every pushed KV (0.125 GiB each); a 0.1 GiB one none, so they go to the host pool
    # and are copied back over PCIe when admitted (the buffer comes out of the decode pool: give it room)
    gib = 1.0 if buffer == "gpu" else 0.1
    s = _scenario(
        tmp_path,
        **{"network.kv_connector": "p2p_push", "network.kv_buffer_gib": gib, "decode.kv_capacity_gib": 0.2 + gib},
    )
    P, T, wire, dec = _prices(s)
    load = 0.0 if buffer == "gpu" else wire / (dec.gpu.pcie_gb_per_s * 1e9)  # one GPU's PCIe copy
    df = _run(s)
    # the prefill's next step waits for the push of the last one: prompt i starts at i (P + T)
    assert list(df.prefill_start_s) == pytest.approx([0.0, P + T, 2 * (P + T)])
    assert list(df.transfer_start_s) == pytest.approx(list(df.prefill_end_s))  # no wait before the transfer
    assert list(df.transfer_end_s - df.transfer_start_s) == pytest.approx([T] * 3)
    # request 0 joins at once; 1 and 2 once the one before has finished (+ the pool's copy back)
    assert df.decode_start_s[0] == pytest.approx(P + T + load)
    assert df.decode_start_s[1] == pytest.approx(df.finish_s[0] + load)
    assert df.decode_start_s[2] == pytest.approx(df.finish_s[1] + load)
    assert df.decode_queue_s[2] > P  # the wait is on the decode side


def test_p2p_push_fills_the_gpu_buffer_then_the_host_pool_to_the_byte(tmp_path):
    """A 0.3 GiB buffer, KV of 0.125 GiB each, decode memory for one request at a time: pushes land every P + T
    while requests leave every decode, so the waiting KV piles up. When request 5 lands (1.09 s), requests 3 and
    4 wait in the buffer (0.25 GiB): 0.375 GiB would not fit, so its KV goes to the host pool, here exactly its
    0.125 GiB (a pool may be filled to the byte), and it joins only after the PCIe copy back; every request
    before it joins the moment the one before finishes."""
    s = _scenario(
        tmp_path,
        n=6,
        **{
            "network.kv_connector": "p2p_push",
            "network.kv_buffer_gib": 0.3,
            "network.p2p_pool_gib": 0.125,
            "decode.kv_capacity_gib": 0.5,
        },
    )
    P, T, wire, dec = _prices(s)
    assert wire == 0.125 * 2**30
    load = wire / (dec.gpu.pcie_gb_per_s * 1e9)
    df = _run(s)
    assert df.transfer_end_s[3] < df.transfer_end_s[5] < df.decode_start_s[3]  # 3 and 4 still wait when 5 lands
    joins = list(df.decode_start_s[1:] - df.finish_s[:-1].to_numpy())
    assert joins == pytest.approx([0.0, 0.0, 0.0, 0.0, load], abs=1e-12)


def test_p2p_push_pool_overflow_stops_with_the_field(tmp_path):
    # pushes land every P + T (0.18 s) while requests leave every decode (0.35 s): request 3 lands while 2
    # still waits in the pool, which holds one
    s = _scenario(
        tmp_path,
        n=5,
        **{
            "network.kv_connector": "p2p_push",
            "network.kv_buffer_gib": 0.1,
            "network.p2p_pool_gib": 0.2,  # one pushed KV, not two
            "decode.kv_capacity_gib": 0.3,
        },
    )
    with pytest.raises(ScenarioError, match="network.p2p_pool_gib") as e:
        run_scenario(s, source="pool.yaml")  # the error names the file, as every refusal does
    assert str(e.value).startswith("pool.yaml: network.p2p_pool_gib: KV pushed to decode replica 0 overflows")


@pytest.mark.parametrize(
    "changes, field",
    [
        ({"network.kv_buffer_gib": 1.0}, "kv_buffer_gib: only with kv_connector p2p_push"),
        ({"network.kv_connector": "nixl_pull", "network.p2p_pool_gib": 1.0}, "p2p_pool_gib: only with"),
        ({"network.kv_connector": "p2p_push", "decode.prefix_caching": True}, "p2p_push is not modelled with prefix"),
        ({"network.kv_connector": "nixl_pull", "placement": "colocated"}, "colocated transfers no KV"),
        ({"network.kv_connector": "p2p_push", "prefill.pipeline_parallel": 2}, "p2p_push is not modelled with prefill"),
        ({"decode.batch_slot_at": "join", "decode.admission": "on_demand"}, "decode.batch_slot_at"),
        ({"prefill.batch_slot_at": "join"}, "prefill.batch_slot_at"),
    ],
)
def test_connector_fields_refused_where_not_modelled(tmp_path, changes, field):
    with pytest.raises(ValueError, match=field):
        _scenario(tmp_path, **changes)


def test_default_connector_keeps_the_outputs(tmp_path):
    """Left out, the connector is host_parked, the model before connectors existed (the shipped scenarios'
    outputs were checked byte for byte against it when this landed): the same requests, byte for byte, as
    host_parked given; and the timeline here is one where the setting matters (nixl_pull moves it)."""
    pool = {"prefill.kv_capacity_gib": 0.2}  # a prefill KV pool that would bind, were the KV held there
    left_out = _run(_scenario(tmp_path, **pool)).to_csv(index=False)
    given_ = _run(_scenario(tmp_path, **pool, **{"network.kv_connector": "host_parked"})).to_csv(index=False)
    nixl = _run(_scenario(tmp_path, **pool, **{"network.kv_connector": "nixl_pull"}))
    assert left_out == given_
    assert nixl.to_csv(index=False) != left_out


def test_batch_slot_at_join_moves_the_slot_wait_after_the_transfer(tmp_path):
    """realrun/harness.py: admitted by memory alone before the transfer, a batch slot taken at the join. With
    one batch slot and room for every KV, request 1's transfer starts at its KV's readiness and it joins when
    request 0 finishes; with slots at admission its transfer waits for that finish instead."""
    changes = {"decode.max_batch_requests": 1, "decode.kv_capacity_gib": 2.0}
    at_admission = _run(_scenario(tmp_path, n=2, **changes))
    at_join = _run(_scenario(tmp_path, n=2, **changes, **{"decode.batch_slot_at": "join"}))
    P, T, _, _ = _prices(_scenario(tmp_path, n=2, **changes))
    assert at_admission.transfer_start_s[1] == pytest.approx(at_admission.finish_s[0])
    assert at_join.transfer_start_s[1] == pytest.approx(2 * P)  # its KV is ready: no wait before the transfer
    assert at_join.decode_start_s[1] == pytest.approx(at_join.finish_s[0])  # ... and it joins when 0 finishes
    # (request 0 finishes later with slots at the join: request 1's transfer now shares the link with its own)
    assert at_join.transfer_end_s[0] > at_admission.transfer_end_s[0] == pytest.approx(P + T)
    assert at_join.finish_s[0] > 2 * P + T  # the slot is the binding wait


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    connector=st.sampled_from(["host_parked", "nixl_pull", "p2p_push"]),
    n=st.integers(1, 12),
    gaps=st.lists(st.floats(0.0, 0.3), min_size=12, max_size=12),
    prompts=st.lists(st.integers(64, 2048), min_size=12, max_size=12),
    outputs=st.lists(st.integers(1, 24), min_size=12, max_size=12),
    chunk=st.sampled_from([None, 512]),
)
def test_conservation_under_each_connector(tmp_path, connector, n, gaps, prompts, outputs, chunk):
    """Every request finishes once, its phases in order, nothing held when the run ends, whatever the connector."""
    trace = tmp_path / "trace.csv"
    arrivals = np.cumsum(gaps[:n])
    trace.write_text(
        "arrival_s,prompt_tokens,output_tokens\n"
        + "".join(f"{a},{p},{o}\n" for a, p, o in zip(arrivals, prompts[:n], outputs[:n]))
    )
    changes = {
        "workload.trace_csv": str(trace),
        "workload.arrival": {"kind": "trace"},
        "workload.requests": n,
        "methods": ["baseline", "hack"],
        "network.kv_connector": connector,
        "decode.kv_capacity_gib": 1.5,
        "prefill.max_batch_requests": 4,
        "prefill.chunk_tokens": chunk,
    }
    if connector == "nixl_pull":
        changes["prefill.kv_capacity_gib"] = 1.0
    if connector == "p2p_push":
        changes["network.kv_buffer_gib"] = 0.25
    result = run_scenario(scenario(**changes), keep_runs=True)
    df = result.requests
    assert len(df) == 2 * n and df.finish_s.notna().all()
    for run in result.runs.values():  # nothing held anywhere once every request has finished
        assert run.records.completed == n
        for pre in run.prefill_replicas:
            assert abs(pre.parked_bytes) < 1e-3 and pre.pushing == 0
        for rep in run.decode_replicas:
            used = [u for (_, r, u) in run.records.memory_log if r == rep.index]
            assert max(used, default=0.0) <= rep.capacity_bytes * (1 + 1e-12)
            assert abs(rep.reserved_bytes) < 1e-3 and rep.slots_used == 0
        push = run.router.push
        if push is not None:
            assert not any(push.waiting) and not push.in_pool
            assert max(map(abs, push.buffer_used + push.pool_used)) < 1e-3
    for col in ("prefill_start_s", "prefill_end_s", "transfer_start_s", "transfer_end_s", "decode_start_s", "finish_s"):
        assert df[col].notna().all(), col
    eps = 1e-9
    assert (df.prefill_start_s >= df.arrival_s - eps).all()
    assert (df.prefill_end_s >= df.prefill_start_s).all()
    assert (df.transfer_start_s >= df.prefill_end_s - eps).all()
    assert (df.transfer_end_s >= df.transfer_start_s).all()
    assert (df.decode_start_s >= df.transfer_end_s - eps).all()
    assert (df.finish_s >= df.decode_start_s).all()
    parts = [f"{p}_s" for p in _PARTS]
    assert np.allclose(df[parts].sum(axis=1), df.jct_s, rtol=1e-9, atol=1e-9)
    assert not math.isnan(df.jct_s.mean())


_PARTS = (
    "prefill_queue",
    "prefill",
    "quantize",
    "transfer_queue",
    "transfer",
    "decode_queue",
    "decode",
    "dequantize",
    "approximation",
    "preemption",
)
