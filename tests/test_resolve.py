"""simulator/resolve.py: a scenario becomes typed, unit-named values once; the defaults, worked by hand."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from helpers import scenario
from simulator.config import ScenarioError
from simulator.load import load_scenario
from simulator.resolve import PROFILES_DIR, resolve

ROOT = Path(__file__).resolve().parent.parent
GIB = 2**30


def test_the_main_setting_resolves_to_hand_worked_values():
    res = resolve(load_scenario(ROOT / "scenarios" / "a10g_10gbps.yaml"), "a10g")
    pre, dec, net = res.prefill, res.decode, res.network
    # prefill: g5.12xlarge (4 A10G, 48 vCPUs, 192 GiB, 40 Gbps, PCIe at 24 GB/s), TP 4 x PP 2 = two instances a replica
    assert (pre.gpu.key, pre.parallel.tensor, pre.parallel.pipeline, pre.instances_per_replica) == ("a10g", 4, 2, 2)
    assert pre.host_memory_bytes == 192 / 2 * GIB * 2 and pre.host_vcpus == 48 * 2
    assert pre.parallel.interconnect.key == "pcie" and pre.parallel.intra_node_gb_per_s == 24
    assert pre.parallel.inter_stage_gbps == 40 and pre.price_usd_per_hour == 5.672
    assert pre.profile.path == str(PROFILES_DIR / "a10g" / "profile.json")
    # decode: p4de.24xlarge (8 A100 80 GB on NVSwitch at 300 GB/s, 96 vCPUs, 1152 GiB), one instance a replica
    assert (dec.gpu.key, dec.instances_per_replica, dec.host_vcpus) == ("a100_80gb", 1, 96)
    assert dec.host_memory_bytes == 1152 / 2 * GIB and dec.parallel.interconnect.key == "nvswitch"
    assert dec.parallel.intra_node_gb_per_s == 300 and dec.max_batch_requests == 128
    # the network: one link per prefill replica to every decode replica, 10 Gbps x 0.9
    assert [(k.name, k.prefill_replicas, k.decode_replicas) for k in net.links] == [
        ("p0", (0,), (0, 1)),
        ("p1", (1,), (0, 1)),
    ]
    assert all(k.capacity_gbps == 9.0 and k.capacity_bytes_per_s == 9e9 / 8 and k.latency_s == 1e-4 for k in net.links)
    assert net.routes == {(0, 0): 0, (0, 1): 0, (1, 0): 1, (1, 1): 1}
    assert net.flow_cap_bytes_per_s == math.inf and not net.stream_layers and not res.shared_gpu
    # the decode engine's host costs stay on the decode pool
    assert pre.host.issue_s_per_layer == 0 and dec.host.issue_s_per_layer == 0


def test_pools_given_by_gpu_take_the_documented_defaults():
    s = scenario(
        **{
            "network.per_flow_gbps": 5,
            "decode.host_issue_s_per_layer": 0.001,
            "prefill.host_issue_s_per_layer": 0.5,
            "decode.kv_capacity_gib": 10.0,
        }
    )
    res = resolve(s, "t")
    for pool in (res.prefill, res.decode):
        assert pool.instance is None and pool.instances_per_replica == 1 and pool.host_vcpus == 0
        assert pool.host_memory_bytes == 64 * GIB and pool.price_usd_per_hour is None
        assert pool.parallel.interconnect.key == "pcie" and pool.parallel.intra_node_gb_per_s == 24  # A100 PCIe
        assert pool.profile.source == "roofline"
    assert res.network.flow_cap_bytes_per_s == 5e9 / 8
    assert res.decode.kv_capacity_override_bytes == 10 * GIB and res.prefill.kv_capacity_override_bytes is None
    # issue time on each pool (a prefill batch lasts at least its CPU issue time); serial time on decode only
    assert res.decode.host.issue_s_per_layer == 0.001 and res.prefill.host.issue_s_per_layer == 0.5
    pre, dec = res.costs(s.methods[0])
    assert dec.host_issue_s_per_layer == 0.001 and pre.host_issue_s_per_layer == 0.5
    assert pre.prefill((64,)).latency_s == pytest.approx(s.model.layers * 0.5)
    assert dec.kv_capacity_bytes == 10 * GIB and dec.method is s.methods[0]


def test_explicit_links_route_first_listed_and_refuse_an_unreachable_replica():
    two = {"prefill.replicas": 2, "decode.replicas": 2}
    links = [
        {"name": "a", "prefill_replicas": [0, 1], "decode_replicas": [0], "bandwidth_gbps": 25},
        {"name": "b", "prefill_replicas": [0], "decode_replicas": [0, 1]},
    ]
    net = resolve(scenario(**two, **{"network.links": links}), "t").network
    assert net.routes == {(0, 0): 0, (1, 0): 0, (0, 1): 1}
    assert [k.capacity_gbps for k in net.links] == [25.0, 10.0]  # efficiency 1 in the test scenario
    lonely = [{"name": "a", "prefill_replicas": [0], "decode_replicas": [0, 1]}]
    with pytest.raises(ScenarioError, match="^t: network.links: prefill replica 1 reaches no decode replica$"):
        resolve(scenario(**two, **{"network.links": lonely}), "t")


def test_an_unreadable_profile_is_one_line_naming_the_field(tmp_path):
    bad = tmp_path / "p.json"
    bad.write_text("{}")
    with pytest.raises(ScenarioError, match=r"^t: calibration.decode_profile: cannot read profile .*p.json"):
        resolve(scenario(**{"calibration.decode_profile": str(bad)}), "t")
