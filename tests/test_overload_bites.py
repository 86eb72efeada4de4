"""The overload check's two limits that no test saw bind (simulator/overload.py): the network, whose capacity is
bytes per second (10 Gbps = 1.25e9 B/s), and offloaded KV in decode host memory (PQCache keeps the full FP16
KV on the host). Each is checked by hand, in `utilisation` and through a run whose only overloaded pool it is.

Bytes by hand, Llama-3.1-8B: FP16 KV = 2 (K, V) x 32 layers x 8 KV heads x 128 dims x 2 bytes = 131,072 bytes
per token; PQCache holds that on the host for every prompt and output token."""

from __future__ import annotations

import numpy as np
import pytest

from helpers import scenario
from simulator.overload import utilisation
from simulator.run import run_scenario

KV_BYTES_PER_TOKEN = 2 * 32 * 8 * 128 * 2


def window_s(arrival_s) -> float:
    """The arrival window of n arrivals: their span x n / (n - 1)."""
    a = np.asarray(arrival_s, float)
    return float(a.max() - a.min()) * len(a) / (len(a) - 1)


def test_hand_worked_host_memory_limit():
    """Two arrivals 10 s apart: window 20 s. One decode replica of 100 GB GPU memory, 8 slots and 2 GB of host
    memory; two requests held 10 s each with 1 GB on the GPU and 3 GB on the host: GPU memory 20/(100 x 20) =
    0.01, slots 20/(8 x 20) = 0.125, host 60/(2 x 20) = 1.5: the decode pool is over capacity."""
    u = utilisation(
        arrival_s=np.array([0.0, 10.0]),
        prefill_busy_s=1.0,
        prefill_replicas=1,
        link_bytes={"p0": 1e9},
        link_capacity_bytes_per_s={"p0": 1e9},
        held_s=np.array([10.0, 10.0]),
        held_kv_bytes=np.array([1e9, 1e9]),
        held_host_bytes=np.array([3e9, 3e9]),
        decode_replicas=1,
        decode_kv_capacity_bytes=100e9,
        decode_host_capacity_bytes=2e9,
        decode_max_batch=8,
    )
    assert u == pytest.approx({"prefill": 1 / 20, "network": 1 / 20, "decode": 1.5}, rel=1e-12)


def test_an_overloaded_link_is_flagged_at_its_byte_rate(tmp_path):
    """40 FP16 requests of 4096 prompt tokens (536,870,912 bytes each) over one 1 Gbps link (1.25e8 B/s, 4.3 s
    each) at 0.4 requests/s: 1.7 times what the link carries on offer (1.47 over this seed's arrival window); prefill
    (0.11) and decode (0.28) are far from their limits. Utilisation = 40 x 536,870,912 / (1.25e8 x window)."""
    s = scenario(
        methods=["baseline"],
        **{
            "network.bandwidth_gbps": 1,
            "workload.requests": 40,
            "workload.arrival": {"kind": "poisson", "rate_rps": 0.4},
        },
    )
    result = run_scenario(s)
    m = result.summary["methods"]["baseline"]
    want = 40 * 4096 * KV_BYTES_PER_TOKEN / (1e9 / 8 * window_s(result.requests["arrival_s"]))
    assert m["completed"] == 40
    assert m["utilisation"]["network"] == pytest.approx(want, rel=1e-9)
    assert m["utilisation"]["network"] > 1.3 and m["utilisation"]["prefill"] < 0.5 and m["utilisation"]["decode"] < 0.5
    assert m["stable"] is False


def test_pqcache_over_its_host_memory_is_unstable():
    """PQCache with 0.25 GiB of decode host memory: each request (512 + 512 tokens) offloads 134,217,728 bytes, so
    two fit; each holds them for its 512-token decode (about 5 s), and one arrives a second: host memory is about
    2.5 times over, while GPU memory (512 bytes per token of codes), slots, prefill and the link are far from
    their limits. The decode utilisation is the host's: sum of host bytes x seconds held (admission to finish)
    / (0.25 GiB x window)."""
    s = scenario(
        methods=["pqcache"],
        **{
            "prefill.instance": "p4de.24xlarge",  # PQCache clusters keys on the prefill host's vCPUs
            "decode.host_memory_gib": 0.25,
            "workload.input_tokens": {"kind": "fixed", "tokens": 512},
            "workload.output_tokens": {"kind": "fixed", "tokens": 512},
            "workload.requests": 40,
            "workload.arrival": {"kind": "poisson", "rate_rps": 1.0},
        },
    )
    result = run_scenario(s)
    m = result.summary["methods"]["pqcache"]
    df = result.requests
    host_bytes = (512 + 512) * KV_BYTES_PER_TOKEN
    assert (df["kv_host_bytes"] == host_bytes).all()
    held_s = (df["finish_s"] - df["transfer_start_s"]).to_numpy()
    want = host_bytes * held_s.sum() / (0.25 * 2**30 * window_s(df["arrival_s"]))
    assert m["completed"] == 40
    assert m["utilisation"]["decode"] == pytest.approx(want, rel=1e-9)
    assert m["utilisation"]["decode"] > 2
    assert m["utilisation"]["prefill"] < 0.2 and m["utilisation"]["network"] < 0.2
    assert m["stable"] is False


def test_hand_worked_short_window_and_too_few_requests():
    """Two arrivals 0.25 s apart: window 0.5 s, less than a second of capacity per pool. Prefill busy 0.2 s on
    one replica: 0.4; 0.3e9 bytes on a 1e9 B/s link: 0.6; decode slots 0.5 s held of 2 slots x 0.5 s: 0.5 (memory
    0.1e9 B x 0.5 s / (1e9 B x 0.5 s) = 0.1). One arrival has no window: every pool NaN."""
    args = {
        "prefill_busy_s": 0.2,
        "prefill_replicas": 1,
        "link_bytes": {"p0": 0.3e9},
        "link_capacity_bytes_per_s": {"p0": 1e9},
        "held_s": np.array([0.25, 0.25]),
        "held_kv_bytes": np.array([0.1e9, 0.1e9]),
        "held_host_bytes": np.zeros(2),
        "decode_replicas": 1,
        "decode_kv_capacity_bytes": 1e9,
        "decode_host_capacity_bytes": 0.0,
        "decode_max_batch": 2,
    }
    u = utilisation(arrival_s=np.array([0.0, 0.25]), **args)
    assert u == pytest.approx({"prefill": 0.4, "network": 0.6, "decode": 0.5}, rel=1e-12)
    none = utilisation(arrival_s=np.array([3.0]), **args)
    assert list(none) == ["prefill", "network", "decode"] and all(np.isnan(v) for v in none.values())
