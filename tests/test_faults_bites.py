"""Overlapping faults on one link compose (simulator/faults.py): the link runs at the product of its active
factors, so a fault that ends leaves the others in force. Each timeline is worked by hand for one baseline
request on TINY (Llama-3.1-8B, FP16 KV, one 10 Gbps link p0 with no latency).

The transfer: 4096 tokens x 2 (K, V) x 32 layers x 8 KV heads x 128 dims x 2 bytes = 536,870,912 bytes, at
10 Gbps T = 0.4294967296 s. Faults are placed around the prefill's end L (the cost model's price, used only to
place them); a link_degradation at 0.5 from before L keeps the transfer at half rate from its start."""

from __future__ import annotations

import pytest

from helpers import scenario
from simulator.resolve import resolve
from simulator.run import run_scenario

KV_BYTES = 4096 * 2 * 32 * 8 * 128 * 2
T = KV_BYTES * 8 / 10e9


@pytest.fixture(scope="module")
def prefill_end_s() -> float:
    s = scenario(methods=["baseline"])
    pre, _ = resolve(s).costs(s.methods[0])
    return pre.prefill((4096,)).latency_s


def run_one(tmp_path, faults, on_loss="reprefill"):
    trace = tmp_path / "one.csv"
    trace.write_text("arrival_s,prompt_tokens,output_tokens\n0,4096,32\n")
    s = scenario(
        methods=["baseline"],
        faults=faults,
        fault_policy={"on_loss": on_loss},
        **{
            "decode.admission": "reserve",
            "workload.trace_csv": str(trace),
            "workload.requests": 1,
            "workload.arrival": {"kind": "trace"},
        },
    )
    result = run_scenario(s)
    return next(result.requests.itertuples()), result.summary["methods"]["baseline"]


def degradation(start_s, end_s, factor=0.5):
    return {"kind": "link_degradation", "target": "p0", "start_s": start_s, "end_s": end_s, "factor": factor}


def outage(start_s, end_s):
    return {"kind": "link_outage", "target": "p0", "start_s": start_s, "end_s": end_s}


def test_the_transfer_without_faults_takes_bytes_over_rate(tmp_path, prefill_end_s):
    row, _ = run_one(tmp_path, [])
    assert row.transfer_start_s == pytest.approx(prefill_end_s, rel=1e-12)
    assert row.transfer_end_s - row.transfer_start_s == pytest.approx(T, rel=1e-12)


def test_two_degradations_multiply_and_the_longer_one_outlives_the_shorter(tmp_path, prefill_end_s):
    """0.5 on [L/2, L + T) and 0.5 on [L/2, L + T/8): a quarter rate to L + T/8 (T/32 sent), half rate to L + T
    (7T/16 more: 15T/32), full rate for the last 17T/32: the transfer ends at L + 49T/32. Had the shorter fault's
    end restored full speed, it would end at L + T/8 + 31T/32 = L + 35T/32."""
    L = prefill_end_s
    row, m = run_one(tmp_path, [degradation(L / 2, L + T), degradation(L / 2, L + T / 8)])
    assert row.transfer_start_s == pytest.approx(L, rel=1e-12)
    assert row.transfer_end_s == pytest.approx(L + 49 * T / 32, rel=1e-12)
    assert m["completed"] == 1 and m["retried"] == 0


def test_a_degradation_outlives_an_outage_inside_it(tmp_path, prefill_end_s):
    """0.5 from L/2 on (never ends); an outage on [L + T/4, L + T/4 + 1) cuts the transfer; the KV parked on the
    prefill host is sent again when the link is back, still at half rate: 2T. (Full speed after the outage: T.)"""
    L = prefill_end_s
    back = L + T / 4 + 1.0
    row, m = run_one(tmp_path, [degradation(L / 2, float("inf")), outage(L + T / 4, back)], on_loss="resend")
    assert row.retries == 1 and m["retried"] == 1
    assert row.transfer_start_s == pytest.approx(back, rel=1e-12)
    assert row.transfer_end_s == pytest.approx(back + 2 * T, rel=1e-12)


def test_a_link_stays_out_until_its_last_outage_ends(tmp_path, prefill_end_s):
    """Outages on [L + T/4, L + T/4 + 1) and [L + T/4 + 0.5, L + T/4 + 3): the transfer, cut once at L + T/4,
    is sent again when the second ends (not when the first does) and takes T."""
    L = prefill_end_s
    cut = L + T / 4
    row, m = run_one(tmp_path, [outage(cut, cut + 1.0), outage(cut + 0.5, cut + 3.0)], on_loss="resend")
    assert row.retries == 1 and m["retried"] == 1
    assert row.transfer_start_s == pytest.approx(cut + 3.0, rel=1e-12)
    assert row.transfer_end_s == pytest.approx(cut + 3.0 + T, rel=1e-12)


def test_a_degradation_that_ends_during_an_outage_leaves_it_out(tmp_path, prefill_end_s):
    """An outage on [L + T/4, L + T/4 + 2) and 0.5 on [L/2, L + T/4 + 1): the degradation ends while the link is
    out, which must not bring the link back; the KV is sent again at full rate when the outage ends."""
    L = prefill_end_s
    cut = L + T / 4
    row, _ = run_one(tmp_path, [degradation(L / 2, cut + 1.0), outage(cut, cut + 2.0)], on_loss="resend")
    assert row.transfer_start_s == pytest.approx(cut + 2.0, rel=1e-12)
    assert row.transfer_end_s == pytest.approx(cut + 2.0 + T, rel=1e-12)
