"""Collectives priced from cited measurements (catalog/data/interconnects.yaml): the model reproduces every
figure it cites, picks the algorithm the engines pick, and every instance names its interconnect."""

import dataclasses

import numpy as np
import pytest

import catalog
from costmodel import collectives as co
from simulator.config import ScenarioError
from tests.helpers import scenario

ICS = catalog.load("interconnects")
NVLINK_GB_PER_S = {g: e["nvlink_gb_per_s"] for g, e in catalog.load("gpus").items()}
TOLERANCE = {"one_shot": 0.10, "two_shot": 0.10, "ring": 0.25}


def _points(m):
    """(p, bytes, seconds) of one cited measurement row (bytes or p may be the list)."""
    n = len(m["time_us"])
    ps = m["p"] if isinstance(m["p"], list) else [m["p"]] * n
    bs = m["bytes"] if isinstance(m["bytes"], list) else [m["bytes"]] * n
    return [(p, b, t * 1e-6) for p, b, t in zip(ps, bs, m["time_us"])]


@pytest.mark.parametrize("key", ["nvswitch", "pcie"])
def test_model_reproduces_the_cited_allreduce_times(key):
    ic = co.from_catalog(ICS[key])
    rows = [m for m in ICS[key]["measured"] if m["what"] == "allreduce"]
    assert rows
    for m in rows:
        link = m.get("link_gb_per_s") or NVLINK_GB_PER_S[m["gpu"]]
        price = {"one_shot": co.one_shot_s, "two_shot": co.two_shot_s, "ring": co.ring_s}[m["algorithm"]]
        fit = getattr(ic, m["algorithm"])
        for p, n, t in _points(m):
            assert price(n, p, fit, link) == pytest.approx(t, rel=TOLERANCE[m["algorithm"]]), (m["source"], p, n)


def test_ring_bus_bandwidth_matches_the_cited_large_message_figures():
    ring = co.from_catalog(ICS["nvswitch"]).ring
    tolerance = {"h100": 0.01, "h200": 0.02, "a100_80gb": 0.25}  # the A100 figure: ~200 of 300 GB/s, one report
    for m in ICS["nvswitch"]["measured"]:
        if m["what"] == "ring_bus_gb_per_s":
            assert ring.bus_efficiency * NVLINK_GB_PER_S[m["gpu"]] == pytest.approx(m["value"], rel=tolerance[m["gpu"]])


def test_ethernet_sendrecv_uses_the_cited_latency_and_efficiency():
    e = co.from_catalog(ICS["ethernet"])
    cited = {m["what"]: m["value"] for m in ICS["ethernet"]["measured"]}
    assert co.sendrecv_s(0, e, 5.0) == pytest.approx(cited["sendrecv_latency_s"])
    assert co.sendrecv_s(1e9, e, 5.0) - co.sendrecv_s(0, e, 5.0) == pytest.approx(
        1 / (5.0 * cited["sendrecv_bus_efficiency"])
    )


def test_algorithm_follows_the_engines_thresholds():
    nvs, pcie, nvl = (co.from_catalog(ICS[k]) for k in ("nvswitch", "pcie", "nvlink"))
    kib = 1024
    assert co.allreduce_algorithm(16 * kib, 8, nvs) == "one_shot"
    assert co.allreduce_algorithm(255 * kib, 8, nvs) == "one_shot"
    assert co.allreduce_algorithm(256 * kib, 8, nvs) == "two_shot"
    assert co.allreduce_algorithm(8 * 1024 * kib, 8, nvs) == "two_shot"
    assert co.allreduce_algorithm(8 * 1024 * kib + 1, 8, nvs) == "ring"
    assert co.allreduce_algorithm(500 * kib, 4, nvl) == "one_shot"
    assert co.allreduce_algorithm(512 * kib, 4, nvl) == "two_shot"
    assert co.allreduce_algorithm(16 * kib, 4, pcie) == "ring"  # no custom all-reduce on > 2 PCIe GPUs
    assert co.allreduce_algorithm(4 * 1024 * kib, 2, pcie) == "one_shot"
    assert co.allreduce_algorithm(16 * kib, 3, nvs) == "ring"  # vLLM's custom kernels take 2, 4, 6, 8 GPUs
    # the vectorised form (dense-layer tables) agrees with the scalar one, algorithm by algorithm
    sizes = np.array([16 * kib, 300 * kib, 9 * 1024 * kib], dtype=float)
    assert np.allclose(co.allreduce_s(sizes, 8, nvs, 300), [co.allreduce_s(float(s), 8, nvs, 300) for s in sizes])
    assert co.allreduce_s(sizes[2], 8, nvs, 300) == pytest.approx(co.ring_s(sizes[2], 8, nvs.ring, 300))


def test_one_token_allreduce_on_eight_a100s_costs_microseconds_not_a_hundred():
    """The issue's example: Llama-3.1-70B decode at TP 8 on p4de (NVSwitch): one token's activations
    (8192 x 2 B) were priced 2(p-1) x 8 us = 112 us; the one-shot kernel takes ~5 us, NCCL's ring ~33 us."""
    s = scenario(**{"model": "llama-3.1-70b", "decode": {"instance": "p4de.24xlarge", "tensor_parallel": 8}})
    from simulator.resolve import resolve

    res = resolve(s, "test")
    _, dec = res.costs(s.methods[0])
    assert res.decode.parallel.interconnect.key == "nvswitch" and res.decode.parallel.intra_node_gb_per_s == 300
    assert 4e-6 < dec.allreduce_s(1) < 7e-6
    assert co.ring_s(16384, 8, res.decode.parallel.interconnect.ring, 300) == pytest.approx(33.7e-6, rel=0.1)


def test_every_instance_names_a_catalog_interconnect():
    for key, inst in catalog.load("instances").items():
        assert inst["gpu_interconnect"] in ICS, key
        assert ICS[inst["gpu_interconnect"]]["key"] != "ethernet", key


def test_pool_interconnect_defaults_and_overrides():
    s = scenario(**{"decode": {"gpu": "a100_80gb", "tensor_parallel": 8, "interconnect": "nvswitch"}})
    from simulator.resolve import resolve

    par = resolve(s, "test").decode.parallel
    assert par.interconnect.key == "nvswitch" and par.intra_node_gb_per_s == 300  # the GPU's NVLink
    par = resolve(scenario(), "test").decode.parallel
    assert par.interconnect.key == "pcie" and par.intra_node_gb_per_s == 24
    with pytest.raises(ScenarioError, match="interconnect nvlink: l4 has no NVLink"):
        scenario(**{"decode": {"gpu": "l4", "interconnect": "nvlink"}})


# ---- peer access (issue 27 item 4) -------------------------------------------------------------------------------
HOST = co.from_catalog(ICS["pcie_host"])
GEN4_GB_PER_S = 24.0  # gpus.yaml convention: PCIe Gen4 x16, achievable per direction
GEN3_GB_PER_S = 11.5


def test_host_memory_path_reproduces_its_cited_figures():
    """NCCL without peer access (SHM transport): the 2-GPU alltoall latency of RTX 4090s with P2P disabled
    (tinygrad/open-gpu-kernel-modules#17), the host-staged copy rate of two RTX 3090s with peer access off
    (club-3090: 16.77 GB/s both ways on Gen4 x16, so 8.39 per direction), and at least the one-channel SHM
    all-reduce's 3.9 GB/s on Gen3 x16 (NVIDIA/nccl#384: the default's two channels do no worse)."""
    rows = {m["what"]: m for m in ICS["pcie_host"]["measured"]}
    a2a = rows["alltoall"]
    for n, t_us in zip(a2a["bytes"], a2a["time_us"]):
        assert co.alltoall_s(float(n), 2, HOST, GEN4_GB_PER_S) == pytest.approx(t_us * 1e-6, rel=0.05), n
    staged = rows["host_staged_bidirectional_gb_per_s"]
    per_direction = staged["value"] / 2
    assert HOST.ring.bus_efficiency * staged["link_gb_per_s"] == pytest.approx(per_direction, rel=0.01)
    # a 1 GiB all-reduce on 2 GPUs moves n bytes each way: its bus bandwidth is the per-direction rate
    n = 2.0**30
    bus_gb_per_s = n / co.ring_s(n, 2, HOST.ring, GEN4_GB_PER_S) / 1e9
    assert bus_gb_per_s == pytest.approx(8.385, rel=0.01)
    one_channel = rows["allreduce_bus_gb_per_s_one_channel"]
    gen3_bus = n / co.ring_s(n, 2, HOST.ring, one_channel["link_gb_per_s"]) / 1e9
    assert one_channel["value"] <= gen3_bus <= 1.1 * one_channel["value"]
    # the small-message all-reduce: base + 2 steps = 5.56 + 2 x 6.15 us
    assert co.allreduce_s(128.0, 2, HOST, GEN4_GB_PER_S) == pytest.approx(17.86e-6 + 128 / (0.349 * 24e9), rel=1e-9)


def test_no_custom_allreduce_without_peer_access():
    """vLLM's CustomAllreduce returns disabled when _can_p2p fails: the ring for every size and GPU count,
    where the same GPUs with peer access take the one-shot kernel."""
    pcie, nvs = co.from_catalog(ICS["pcie"]), co.from_catalog(ICS["nvswitch"])
    mib = 1024 * 1024
    assert co.allreduce_algorithm(4 * mib, 2, pcie) == "one_shot"
    assert co.allreduce_algorithm(4 * mib, 2, HOST) == "ring"
    for p in (2, 4, 8):
        assert co.allreduce_algorithm(1024, p, dataclasses.replace(nvs, peer_access=False)) == "ring"
    blocked = dataclasses.replace(pcie, peer_access=False)  # one-shot constants present, peer access refused
    assert co.allreduce_s(4.0 * mib, 2, blocked, 24) == pytest.approx(co.ring_s(4.0 * mib, 2, blocked.ring, 24))
    assert "host memory" in co.path(HOST, 2) and "custom all-reduce" in co.path(pcie, 2)
    assert "no custom all-reduce: more than two GPUs on PCIe" in co.path(pcie, 4)


@pytest.mark.parametrize(
    "pool, key",
    [
        ({"gpu": "rtx4090", "tensor_parallel": 2}, "pcie_host"),  # GeForce: the driver refuses peer access
        ({"gpu": "rtx4090", "tensor_parallel": 2, "peer_access": True}, "pcie"),  # a patched driver grants it
        ({"gpu": "a10g", "tensor_parallel": 2}, "pcie"),  # a data-centre part
        ({"gpu": "a10g", "tensor_parallel": 2, "peer_access": False}, "pcie_host"),  # e.g. a VM that refuses it
        ({"instance": "rtx4090x2", "tensor_parallel": 2}, "pcie_host"),
        ({"instance": "g5.12xlarge", "tensor_parallel": 4}, "pcie"),
        ({"instance": "p4de.24xlarge", "tensor_parallel": 8}, "nvswitch"),
        ({"gpu": "rtx_pro_6000", "tensor_parallel": 2}, "pcie"),
        ({"gpu": "rtx6000_ada", "tensor_parallel": 2}, "pcie_host"),
    ],
)
def test_peer_access_picks_the_collectives(pool, key):
    from simulator.resolve import resolve

    s = scenario(**{"decode": pool, "network.bandwidth_gbps": 10})
    par = resolve(s, "test").decode.parallel
    assert par.interconnect.key == key and par.interconnect.peer_access == (key != "pcie_host")


def test_peer_access_false_on_nvlink_is_refused():
    with pytest.raises(ScenarioError, match="peer_access false contradicts interconnect nvswitch"):
        scenario(**{"decode": {"instance": "p4de.24xlarge", "tensor_parallel": 8, "peer_access": False}})


def test_tp2_without_peer_access_hand_worked():
    """Llama-3.1-8B decode at TP 2 on two RTX 4090s (PCIe Gen4, 24 GB/s per direction), batch 32: each of a
    layer's two all-reduces carries 32 x 4096 x 2 B = 256 KiB.  Without peer access: NCCL's ring through host
    memory, 5.56 + 2 x 6.15 us + 262144 B / (0.349 x 24 GB/s) = 49.16 us.  With it (a patched driver): vLLM's
    one-shot kernel, 4.86 us + 262144 / (0.713 x 24 GB/s) = 20.18 us.  The iteration differs by 32 layers x 2
    all-reduces x 28.98 us = 1.855 ms; a 4096-token prompt's 32 MiB all-reduce exceeds the custom kernel's 8 MiB
    and takes NCCL's ring either way: 10.06 + 1947.2 us over P2P, 17.86 + 4006.0 us through host memory."""
    from simulator.resolve import resolve

    off = scenario(**{"decode": {"gpu": "rtx4090", "tensor_parallel": 2, "max_batch_requests": 64}})
    on = scenario(**{"decode": {"gpu": "rtx4090", "tensor_parallel": 2, "max_batch_requests": 64, "peer_access": True}})
    _, d_off = resolve(off, "test").costs(off.methods[0])
    _, d_on = resolve(on, "test").costs(on.methods[0])
    msg = 32 * 4096 * 2
    host_s = 5.56e-6 + 2 * 6.15e-6 + msg / (0.349 * 24e9)
    p2p_s = 4.86e-6 + msg / (0.713 * 24e9)
    assert host_s == pytest.approx(49.16e-6, abs=0.01e-6) and p2p_s == pytest.approx(20.18e-6, abs=0.01e-6)
    assert d_off.allreduce_s(32) == pytest.approx(host_s, rel=1e-9)
    assert d_on.allreduce_s(32) == pytest.approx(p2p_s, rel=1e-9)
    assert d_off.iteration(32).fixed_s - d_on.iteration(32).fixed_s == pytest.approx(
        32 * 2 * (host_s - p2p_s), rel=1e-9
    )
    assert 32 * 2 * (host_s - p2p_s) == pytest.approx(1.855e-3, rel=1e-3)
    big = 4096 * 4096 * 2
    assert d_on.allreduce_s(4096) == pytest.approx(5.56e-6 + 2 * 2.25e-6 + big / (0.718 * 24e9), rel=1e-9)
    assert d_off.allreduce_s(4096) == pytest.approx(17.86e-6 + big / (0.349 * 24e9), rel=1e-9)


def test_profiles_json_names_the_collective_path():
    from simulator.run import run_scenario

    s = scenario(methods=["baseline"], **{"decode": {"gpu": "rtx4090", "tensor_parallel": 2}})
    coll = run_scenario(s, source="test").profiles()["collectives"]["decode"]
    assert coll["interconnect"] == "pcie_host" and coll["peer_access"] is False
    assert "host memory" in coll["path"] and {r["algorithm"] for r in coll["allreduce"]} == {"ring"}
