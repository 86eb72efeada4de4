"""Faults as scenario events: exact single-request timelines per fault kind and policy, conservation
under random faults (hypothesis), the shipped scenario, summary and report."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from contract import invoke
from helpers import scenario
from simulator.config import ScenarioError
from simulator.load import load_scenario
from simulator.run import resolve, run_scenario

ROOT = Path(__file__).resolve().parent.parent
PARTS = [
    "prefill_queue_s",
    "prefill_s",
    "quantize_s",
    "transfer_queue_s",
    "transfer_s",
    "decode_queue_s",
    "decode_s",
    "dequantize_s",
    "approximation_s",
    "preemption_s",
]


@pytest.fixture(scope="module")
def lone():
    """One baseline request arriving at 0 on TINY (1 prefill, 1 decode replica, 10 Gbps, no latency): its
    prefill L, transfer T and decode D seconds, from the cost model (ttft_at decode: one iteration per output
    token, the first at the prompt's context)."""
    s = scenario(methods=["baseline"])
    res = resolve(s)
    pre, dec = res.costs(s.methods[0])
    L = pre.prefill((4096,)).latency_s
    T = pre.wire_bytes(4096) * 8 / 10e9
    it = dec.iteration(1)
    n = 32
    D = n * it.fixed_s + it.per_ctx_s * (n * 4096 + n * (n - 1) / 2)
    return L, T, D


def faulty(**changes):
    """TINY with faults, reserving each request's final KV at admission unless told otherwise."""
    return scenario(**{"decode.admission": "reserve", **changes})


def run_one(tmp_path, faults, policy=None, **changes):
    trace = tmp_path / "one.csv"
    trace.write_text("arrival_s,prompt_tokens,output_tokens\n0,4096,32\n")
    s = faulty(
        methods=["baseline"],
        faults=faults,
        **{
            "workload.trace_csv": str(trace),
            "workload.requests": 1,
            "workload.arrival": {"kind": "trace"},
            **({"fault_policy": policy} if policy else {}),
            **changes,
        },
    )
    result = run_scenario(s)
    return next(result.requests.itertuples()), result.summary["methods"]["baseline"]


def test_no_fault_is_the_closed_form(tmp_path, lone):
    L, T, D = lone
    row, m = run_one(tmp_path, [])
    assert (row.prefill_end_s, row.transfer_end_s, row.finish_s) == pytest.approx((L, L + T, L + T + D), rel=1e-12)
    assert (m["completed"], m["failed"], m["retried"], m["failure_reasons"]) == (1, 0, 0, {})


def test_link_degradation_slows_the_transfer(tmp_path, lone):
    """Half the rate over the transfer's second quarter: B/4 + B/8 by mid-transfer, 5/8 left -> 9T/8."""
    L, T, D = lone
    row, m = run_one(
        tmp_path,
        [{"kind": "link_degradation", "target": "p0", "start_s": L + T / 4, "end_s": L + T / 2, "factor": 0.5}],
    )
    assert row.transfer_end_s == pytest.approx(L + 9 * T / 8, rel=1e-12)
    assert row.finish_s == pytest.approx(L + 9 * T / 8 + D, rel=1e-12)
    assert m["retried"] == 0 and m["completed"] == 1


@pytest.mark.parametrize("policy", ["resend", "reprefill"])
def test_link_outage_resends_the_parked_kv(tmp_path, lone, policy):
    L, T, D = lone
    back = L + T / 2 + 5.0
    row, m = run_one(
        tmp_path, [{"kind": "link_outage", "target": "p0", "start_s": L + T / 2, "end_s": back}], {"on_loss": policy}
    )
    assert row.prefill_start_s == 0 and row.transfer_start_s == pytest.approx(back, rel=1e-12)
    assert row.transfer_end_s == pytest.approx(back + T, rel=1e-12)
    assert row.finish_s == pytest.approx(back + T + D, rel=1e-12)
    assert row.retries == 1 and m["retried"] == 1
    assert row.transfer_queue_s == pytest.approx(back - L, rel=1e-12)  # the lost attempt and the wait


def test_link_outage_fails_under_fail(tmp_path, lone):
    L, T, _ = lone
    row, m = run_one(
        tmp_path, [{"kind": "link_outage", "target": "p0", "start_s": L + T / 2, "end_s": L + T}], {"on_loss": "fail"}
    )
    assert m["completed"] == 0 and m["failed"] == 1 and m["failure_reasons"] == {"link_outage": 1}
    assert row.failure == "link_outage" and math.isnan(row.finish_s) and math.isnan(row.jct_s)


def test_prefill_down_reprefills_after_recovery(tmp_path, lone):
    L, T, D = lone
    row, m = run_one(tmp_path, [{"kind": "prefill_replica_down", "target": 0, "start_s": L / 2, "end_s": L / 2 + 3}])
    assert row.prefill_start_s == pytest.approx(L / 2 + 3, rel=1e-12)
    assert row.finish_s == pytest.approx(L / 2 + 3 + L + T + D, rel=1e-12)
    assert row.retries == 1 and m["completed"] == 1


def test_prefill_down_moves_to_another_replica(tmp_path, lone):
    L, T, D = lone
    row, _ = run_one(
        tmp_path,
        [{"kind": "prefill_replica_down", "target": 0, "start_s": L / 2, "end_s": 1e6}],
        **{"prefill.replicas": 2},
    )
    assert row.prefill_replica == 1 and row.prefill_start_s == pytest.approx(L / 2, rel=1e-12)
    assert row.finish_s == pytest.approx(L / 2 + L + T + D, rel=1e-12)


@pytest.mark.parametrize("admission", ["reserve", "on_demand"])
def test_decode_down_reprefill(tmp_path, lone, admission):
    """The KV left the prefill host when it arrived: prefill again at the fault, wait for the replica
    (a lone request: the same under either admission)."""
    L, T, D = lone
    hit, back = L + T + D / 2, L + T + D / 2 + 2 * L
    row, m = run_one(
        tmp_path,
        [{"kind": "decode_replica_down", "target": 0, "start_s": hit, "end_s": back}],
        **{"decode.admission": admission},
    )
    assert row.prefill_start_s == pytest.approx(hit, rel=1e-12)
    assert row.transfer_start_s == pytest.approx(back, rel=1e-12)  # KV ready at hit + L, replica back later
    assert row.finish_s == pytest.approx(back + T + D, rel=1e-12)
    assert row.retries == 1 and m["retried"] == 1
    np.testing.assert_allclose(sum(getattr(row, p) for p in PARTS), row.jct_s, rtol=1e-12)


def test_decode_down_resend_keeps_the_kv_on_the_prefill_host(tmp_path, lone):
    L, T, D = lone
    hit, back = L + T + D / 2, L + T + D / 2 + 2 * L
    row, _ = run_one(
        tmp_path, [{"kind": "decode_replica_down", "target": 0, "start_s": hit, "end_s": back}], {"on_loss": "resend"}
    )
    assert row.prefill_start_s == 0 and row.prefill_end_s == pytest.approx(L, rel=1e-12)
    assert row.transfer_start_s == pytest.approx(back, rel=1e-12)
    assert row.finish_s == pytest.approx(back + T + D, rel=1e-12)


def test_decode_down_fail_and_never_back(tmp_path, lone):
    L, T, D = lone
    _, m = run_one(
        tmp_path,
        [{"kind": "decode_replica_down", "target": 0, "start_s": L + T + D / 2, "end_s": 1e6}],
        {"on_loss": "fail"},
    )
    assert m["failure_reasons"] == {"decode_replica_down": 1}
    _, m = run_one(
        tmp_path, [{"kind": "decode_replica_down", "target": 0, "start_s": L + T + D / 2, "end_s": math.inf}]
    )
    assert m["failure_reasons"] == {"stranded": 1} and m["retried"] == 1
    _, m = run_one(
        tmp_path,
        [{"kind": "decode_replica_down", "target": 0, "start_s": L + T + D / 2, "end_s": 1e6}],
        {"on_loss": "reprefill", "max_retries": 0},
    )
    assert m["failure_reasons"] == {"retries_exhausted": 1} and m["retried"] == 0


def test_bad_faults_are_refused():
    for fault, message in [
        ({"kind": "link_outage", "target": "p7", "start_s": 0, "end_s": 1}, "no link 'p7'"),
        ({"kind": "decode_replica_down", "target": 3, "start_s": 0, "end_s": 1}, "no decode replica 3"),
        ({"kind": "link_degradation", "target": "p0", "start_s": 0, "end_s": 1}, "factor"),
        ({"kind": "link_outage", "target": "p0", "start_s": 2, "end_s": 1}, "after start_s"),
    ]:
        with pytest.raises(ScenarioError, match=message):
            faulty(faults=[fault])


# ---- conservation ----------------------------------------------------------------------------------
FAULT = st.one_of(
    st.builds(
        lambda k, t, s, d, f: {
            "kind": k,
            "target": f"p{t}",
            "start_s": s,
            "end_s": s + d,
            **({"factor": f} if k == "link_degradation" else {}),
        },
        st.sampled_from(["link_degradation", "link_outage"]),
        st.integers(0, 1),
        st.floats(0, 15),
        st.floats(0.01, 10),
        st.floats(0.05, 0.95),
    ),
    st.builds(
        lambda k, t, s, d: {"kind": k, "target": t, "start_s": s, "end_s": s + d},
        st.sampled_from(["prefill_replica_down", "decode_replica_down"]),
        st.integers(0, 1),
        st.floats(0, 15),
        st.one_of(st.floats(0.01, 10), st.just(math.inf)),
    ),
)


@settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    faults=st.lists(FAULT, min_size=1, max_size=6),
    policy=st.sampled_from(["resend", "reprefill", "fail"]),
    retries=st.integers(0, 3),
    stream=st.booleans(),
    admission=st.sampled_from([("reserve", "recompute"), ("on_demand", "recompute"), ("on_demand", "swap")]),
)
def test_every_request_is_accounted_for(faults, policy, retries, stream, admission):
    """Under memory pressure too: 2 GiB of decode KV holds a few requests, so on-demand admission preempts."""
    s = faulty(
        methods=["baseline", "hack"],
        faults=faults,
        fault_policy={"on_loss": policy, "max_retries": retries},
        **{"decode.admission": admission[0], "decode.preemption": admission[1], "decode.kv_capacity_gib": 2},
        **{
            "workload.requests": 30,
            "workload.arrival": {"kind": "poisson", "rate_rps": 2.0},
            "workload.output_tokens": {"kind": "uniform", "min_tokens": 1, "max_tokens": 400},
            "prefill.replicas": 2,
            "decode.replicas": 2,
            "prefill.max_batch_requests": 4,
            "network.stream_layers": stream,
            "workload.input_tokens": {"kind": "uniform", "min_tokens": 256, "max_tokens": 4096},
        },
    )
    result = run_scenario(s, keep_runs=True)
    for name, m in result.summary["methods"].items():
        assert m["completed"] + m["failed"] == 30
        assert sum(m["failure_reasons"].values()) == m["failed"]
        df = result.requests[result.requests["method"] == name]
        failed = df["failure"] != ""
        assert failed.sum() == m["failed"] and (df["retries"] > 0).sum() == m["retried"]
        assert df.loc[failed, "finish_s"].isna().all() and df.loc[~failed, "finish_s"].notna().all()
        ok = df[~failed]
        assert (ok["finish_s"] >= ok["arrival_s"]).all()
        np.testing.assert_allclose(ok[PARTS].sum(axis=1), ok["jct_s"], rtol=1e-9, atol=1e-9)
        assert (ok[PARTS] >= -1e-9).all().all()
        assert (df["retries"] <= retries).all()
        run = result.runs[name]
        for rep in run.decode_replicas:  # every request has ended: nothing is reserved anywhere
            assert abs(rep.reserved_bytes) <= 1e-9 * rep.capacity_bytes and rep.slots_used == 0
        assert max((u for (_, _, u) in run.records.memory_log), default=0) <= run.decode_replicas[0].capacity_bytes * (
            1 + 1e-12
        )
        for rep in run.prefill_replicas:
            assert rep.parked_bytes >= -1e-6


def test_a_decode_replica_down_loses_its_preempted_requests_too(tmp_path):
    """Two requests outgrow 40 KV blocks on demand (tests/test_admission.py): the second is preempted at
    iteration 65 and waits for the first to finish. The replica goes down while it waits: both are lost,
    re-sent when it is back, and run again from their own KV; memory and the breakdown stay whole."""
    trace = tmp_path / "two.csv"
    trace.write_text("arrival_s,prompt_tokens,output_tokens\n0,256,100\n0,256,100\n")
    base = {
        "workload": {"trace_csv": str(trace), "arrival": {"kind": "trace"}, "requests": 2},
        "prefill.max_batch_requests": 2,
        "decode.kv_capacity_gib": 40 * 2 / 1024,
        "methods": ["baseline"],
        "decode.admission": "on_demand",
    }
    calm = run_scenario(scenario(**base)).requests.sort_values("request_id")
    a, b = calm.iloc[0], calm.iloc[1]
    assert calm["preemptions"].tolist() == [0, 1]
    step = (a.finish_s - a.decode_start_s) / 100
    hit = a.finish_s - 10 * step  # iteration ~90: A runs, B waits preempted
    s = scenario(
        **base,
        faults=[{"kind": "decode_replica_down", "target": 0, "start_s": hit, "end_s": hit + 1}],
        fault_policy={"on_loss": "resend", "max_retries": 3},
    )
    result = run_scenario(s, keep_runs=True)
    m, df = result.summary["methods"]["baseline"], result.requests.sort_values("request_id")
    assert (m["completed"], m["failed"], m["retried"]) == (2, 0, 2)
    assert (df["transfer_start_s"] >= hit + 1).all() and (df["finish_s"] > b.finish_s).all()
    np.testing.assert_allclose(df[PARTS].sum(axis=1), df["jct_s"], rtol=1e-9)
    run = result.runs["baseline"]
    assert run.decode_replicas[0].reserved_bytes == pytest.approx(0.0, abs=1e-6)
    assert max(u for (_, _, u) in run.records.memory_log) <= run.decode_replicas[0].capacity_bytes * (1 + 1e-12)


# ---- the shipped scenario, CLI and report ---------------------------------------------------------------
def test_shipped_fault_scenario(tmp_path):
    path = ROOT / "scenarios" / "faults_decode_loss.yaml"
    out = tmp_path / "out"
    r = invoke("simulate", path, "--requests", "300", "--out", out)
    assert r.exit_code == 0, r.stderr
    summary = json.loads((out / "summary.json").read_text())
    for m in summary["methods"].values():
        assert m["completed"] + m["failed"] == 300 and m["retried"] > 0
    page = (out / "report.html").read_text()
    assert "decode d0 down" in page  # the fault window, marked on the time series
    s = load_scenario(path)
    assert s.faults and yaml.safe_load(path.read_text())["faults"]


def test_streamed_request_cut_by_an_outage_then_lost_with_its_prefill_ends_once():
    # At one instant a link outage cuts a streamed transfer whose prefill batch is still running, and the
    # prefill replica goes down with that batch: the request is hit twice and must fail once.
    faults = [{"kind": "link_degradation", "target": "p0", "start_s": 0.0, "end_s": 1.0, "factor": 0.5}] * 2 + [
        {"kind": "link_outage", "target": "p0", "start_s": 1.0, "end_s": 2.0},
        {"kind": "prefill_replica_down", "target": 0, "start_s": 1.0, "end_s": math.inf},
    ]
    s = faulty(
        methods=["baseline"],
        faults=faults,
        fault_policy={"on_loss": "resend", "max_retries": 0},
        **{
            "decode.admission": "reserve",
            "decode.kv_capacity_gib": 2,
            "network.stream_layers": True,
            "workload.requests": 30,
            "workload.arrival": {"kind": "poisson", "rate_rps": 2.0},
            "workload.output_tokens": {"kind": "uniform", "min_tokens": 1, "max_tokens": 400},
            "workload.input_tokens": {"kind": "uniform", "min_tokens": 256, "max_tokens": 4096},
            "prefill.replicas": 2,
            "decode.replicas": 2,
            "prefill.max_batch_requests": 4,
        },
    )
    m = run_scenario(s).summary["methods"]["baseline"]
    assert m["failed"] >= 1
    assert m["completed"] + m["failed"] == 30


# ---- replica faults that overlap (the module doc: "a replica is down while any of its faults is active") ----
def test_a_replica_stays_down_until_its_last_fault_ends(tmp_path, lone):
    """Two prefill_replica_down on replica 0, [L/2, L/2 + 3) and [L/2 + 1, L/2 + 5): the prompt lost at L/2
    prefills again when the later one ends, L/2 + 5 (not at L/2 + 3, where the first ends), and is hit once."""
    L, T, D = lone
    down = {"kind": "prefill_replica_down", "target": 0}
    row, m = run_one(
        tmp_path, [{**down, "start_s": L / 2, "end_s": L / 2 + 3}, {**down, "start_s": L / 2 + 1, "end_s": L / 2 + 5}]
    )
    assert row.prefill_start_s == pytest.approx(L / 2 + 5, rel=1e-12)
    assert row.finish_s == pytest.approx(L / 2 + 5 + L + T + D, rel=1e-12)
    assert row.retries == 1 and m["retried"] == 1 and m["completed"] == 1


def test_a_decode_replica_back_does_not_bring_back_the_prefill_replica_of_its_index(tmp_path, lone):
    """decode replica 0 down on [L/4, L/2 + 2), prefill replica 0 (the only one) down on [L/2, L/2 + 5): the
    prompt lost at L/2 waits for its prefill replica, back at L/2 + 5, not at L/2 + 2 when decode 0 is."""
    L, T, D = lone
    row, m = run_one(
        tmp_path,
        [
            {"kind": "prefill_replica_down", "target": 0, "start_s": L / 2, "end_s": L / 2 + 5},
            {"kind": "decode_replica_down", "target": 0, "start_s": L / 4, "end_s": L / 2 + 2},
        ],
    )
    assert row.prefill_start_s == pytest.approx(L / 2 + 5, rel=1e-12)
    assert row.finish_s == pytest.approx(L / 2 + 5 + L + T + D, rel=1e-12)
    assert row.retries == 1 and m["completed"] == 1


def test_resend_keeps_the_kv_held_on_a_prefill_host_that_stays_up(tmp_path, lone):
    """on_loss resend, two prefill replicas (a link each), one decode replica, two prompts at 0 (one per prefill
    replica, both decoding by L + T). Prefill replica 0 goes down at 5 s: the copy of request 0's KV on its host
    dies, request 1's on replica 1 does not. Decode replica 0 down on [6, 8): request 1 is sent again from
    replica 1's host when it is back (its prefill stays [0, L)), request 0 prefills again on replica 1 at 6;
    both KVs then share replica 1's link from 8: 2T."""
    L, T, _ = lone
    trace = tmp_path / "two.csv"
    trace.write_text("arrival_s,prompt_tokens,output_tokens\n0,4096,1000\n0,4096,1000\n")
    s = faulty(
        methods=["baseline"],
        faults=[
            {"kind": "prefill_replica_down", "target": 0, "start_s": 5.0, "end_s": 50.0},
            {"kind": "decode_replica_down", "target": 0, "start_s": 6.0, "end_s": 8.0},
        ],
        fault_policy={"on_loss": "resend"},
        **{
            "prefill.replicas": 2,
            "workload.trace_csv": str(trace),
            "workload.requests": 2,
            "workload.arrival": {"kind": "trace"},
        },
    )
    rows = run_scenario(s).requests
    r0, r1 = rows.iloc[0], rows.iloc[1]
    assert (r1.prefill_replica, r1.prefill_start_s, r1.retries) == (1, 0.0, 1)
    assert r1.prefill_end_s == pytest.approx(L, rel=1e-12)
    assert (r0.prefill_replica, r0.prefill_start_s, r0.retries) == (1, 6.0, 1)
    assert r0.prefill_end_s == pytest.approx(6.0 + L, rel=1e-12)
    for r in (r0, r1):
        assert r.transfer_start_s == 8.0 and r.transfer_end_s == pytest.approx(8.0 + 2 * T, rel=1e-12)


def test_the_faults_line_counts_failures_by_reason_and_retries():
    """Hand-worked: one line, per method, failed (by reason, in the summary's order) and retried."""
    from simulator.faults import faults_line

    summary = {
        "methods": {
            "baseline": {"failed": 2, "failure_reasons": {"link_outage": 1, "stranded": 1}, "retried": 3},
            "hack": {"failed": 0, "failure_reasons": {}, "retried": 0},
        }
    }
    assert (
        faults_line(summary)
        == "faults: baseline 2 failed (1 link_outage, 1 stranded), 3 retried; hack 0 failed, 0 retried"
    )
