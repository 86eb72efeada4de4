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
