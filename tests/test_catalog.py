"""The catalog's GPU facts hold together: clocks, SM counts and peaks agree, and every published
measurement names a quantity the reports can compare and a source."""

import pytest

import catalog
from costmodel.calibration import MEASURED_QUANTITY_FIELD

GPUS = catalog.load("gpus")


@pytest.mark.parametrize("key", sorted(GPUS))
def test_fp32_peak_is_sms_times_lanes_times_boost_clock(key):
    """fp32_tflops = 2 x sms x FP32 lanes per SM x boost clock, lanes 64 (Volta, Turing, GA100) or 128
    (GA10x, Ada, Hopper): the SM count and clock the issue rates use are the ones the peak was built from."""
    g = GPUS[key]
    lanes = g["fp32_tflops"] * 1e12 / (2 * g["sms"] * g["boost_clock_ghz"] * 1e9)
    assert min(abs(lanes - 64), abs(lanes - 128)) / lanes < 0.015, (key, lanes)
    if g.get("sustained_clock_ghz") is not None:
        assert g["sustained_clock_ghz"] < g["boost_clock_ghz"]


@pytest.mark.parametrize("key", sorted(GPUS))
def test_measured_figures_name_a_comparable_quantity_and_a_source(key):
    for m in GPUS[key].get("measured", []):
        assert m["quantity"] in MEASURED_QUANTITY_FIELD, m
        assert m["value"] > 0 and m["how"] and m["source"], m


INSTANCES = catalog.load("instances")
GEFORCE = {"rtx4090"}  # FP16 tensor rate with FP32 accumulate halved: INT8 is 4x it, not 2x


def test_the_gpus_a_user_asks_for_are_in_the_catalog():
    assert {"rtx4090", "rtx6000_ada", "rtx_pro_6000", "h20", "b200"} <= set(GPUS)


@pytest.mark.parametrize("key", sorted(GPUS))
def test_memory_is_what_the_driver_reports_with_its_source(key):
    """memory_bytes is the CUDA driver's total in bytes (below the marketing GB of a card, or its GiB), and the
    first source line says where the figure was read."""
    g = GPUS[key]
    assert "memory_gb" not in g and isinstance(g["memory_bytes"], int), key
    assert g["sources"][0].startswith("memory_bytes: "), key
    assert g["memory_bytes"] % 10**9 and g["memory_bytes"] % 2**30, key  # not a marketing figure


def test_driver_memory_sits_below_the_marketing_size():
    marketing_gb = {"t4": 16, "v100": 16, "a10g": 24, "l4": 24, "a6000": 48, "a100_40gb": 40, "a100_80gb": 80,
                    "h100": 80, "h200": 141, "l40s": 48, "rtx4090": 24, "rtx6000_ada": 48, "rtx_pro_6000": 96,
                    "h20": 96, "b200": 192}  # fmt: skip
    assert set(marketing_gb) == set(GPUS)
    for key, gb in marketing_gb.items():
        assert 0.88 * gb * 2**30 < GPUS[key]["memory_bytes"] < gb * 1e9 * 1.07, key  # an 80 GB HBM part: 85.0e9 B


@pytest.mark.parametrize("key", sorted(GPUS))
def test_every_gpu_says_whether_it_has_peer_access_over_pcie(key):
    assert isinstance(GPUS[key]["pcie_peer_access"], bool)
    assert GPUS[key]["pcie_peer_access"] is (key not in ("rtx4090", "rtx6000_ada")), key


def test_every_instance_says_whether_its_gpus_have_peer_access():
    for key, inst in INSTANCES.items():
        assert isinstance(inst["peer_access"], bool), key
        if inst["gpu_interconnect"] in ("nvlink", "nvswitch"):
            assert inst["peer_access"], key
    assert INSTANCES["rtx4090x2"]["peer_access"] is False and INSTANCES["g5.12xlarge"]["peer_access"] is True


@pytest.mark.parametrize("key", sorted(k for k, g in GPUS.items() if g["int8_tensor_tops"]))
def test_int8_is_twice_fp16_the_rule_a_short_spec_uses(key):
    """costmodel/specs.py derives int8_tensor_tops = 2 x fp16 for a GPU that does not say; the catalog's parts
    follow it, but GeForce parts, whose FP16-with-FP32-accumulate rate is halved, are 4x."""
    g = GPUS[key]
    ratio = g["int8_tensor_tops"] / g["fp16_tensor_tflops"]
    assert ratio == pytest.approx(4.0 if key in GEFORCE else 2.0, rel=0.025), key
