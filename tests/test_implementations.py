"""Implementations as data: a method's kernel costs from a shipped implementation profile
(catalog/data/implementations.yaml) or its own `kernels:`, priced for each pool's GPU."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

import catalog
from costmodel.calibration import load_profile
from costmodel.kernel_work import split
from costmodel.methods import REGISTRY, make_method
from costmodel.specs import GPUSpec
from helpers import scenario
from simulator.config import ScenarioError
from simulator.implementations import (
    _rates,
    _work,
    fill_factor,
    implementation_costs,
    measured_fits,
    priced_profile,
)
from simulator.resolve import resolve
from simulator.run import run_scenario

ROOT = Path(__file__).resolve().parent.parent
IMPLS = catalog.load("implementations")
H200 = {
    "calibration": {"prefill_profile": "auto", "decode_profile": "auto"},
    "prefill.gpu": "h200",
    "decode.gpu": "h200",
}
MEASURED = json.loads((ROOT / "kernels_calibration/profiles/h200/implementations.json").read_text())["fits"]


def gpu(key):
    return GPUSpec.from_fields(key, catalog.entry("gpus", key))


@pytest.mark.parametrize("key", sorted(IMPLS))
def test_every_implementation_profile_is_complete_and_sourced(key):
    e = IMPLS[key]
    assert e["sources"] and e["name"] and e["kernels"]
    for name in e["methods"]:
        method = make_method(name, requantization_elimination=False) if name.startswith("hack") else make_method(name)
        for role in e["kernels"]:
            assert method.kernel_refusal(role) is None, (name, role)
    for parts in e["kernels"].values():
        for part in parts:
            assert part.get("formula"), part
            if "fit" in part:
                impl, kern = part["fit"].split(".")
                fit = measured_fits(e["measurement"])[impl][kern]
                # the part's known work never takes more than the measured time on the measuring GPU
                parts = split(_work(part), fit["s_per_unit"], _rates(gpu(e["measured_on"])))
                assert parts["alu"] >= 0 and sum(parts.values()) == pytest.approx(fit["s_per_unit"], rel=1e-12)
            else:
                assert part["alu_instr"] > 0
    for g in catalog.load("gpus"):
        for fit in implementation_costs(key, gpu(g)).values():
            assert fit.s_per_unit > 0 and fit.overhead_s > 0


def test_on_the_measuring_gpu_the_parts_are_the_measured_fits():
    dq = implementation_costs("kvquant_reference", gpu("h200"))["dequantize"]
    lut, csr = MEASURED["kvquant_reference"]["lut_dequant"], MEASURED["kvquant_reference"]["outliers_csr"]
    assert dq.s_per_unit == pytest.approx(lut["s_per_unit"] + csr["s_per_unit"], rel=1e-12)
    assert dq.overhead_s == pytest.approx(lut["overhead_s"] + csr["overhead_s"], rel=1e-12)
    rq = implementation_costs("no_rqe_requantize", gpu("h200"))["requantize"]
    assert rq.s_per_unit == pytest.approx(MEASURED["no_rqe_requantize"]["requantize_block"]["s_per_unit"], rel=1e-12)


def test_cachegen_decoder_fit_refits_the_committed_rows():
    """kernels_calibration/profiles/h200/cachegen_decoder.json: its fit is the bench's fit of its own rows, each
    row's per-layer unit and time follow from the prompt it timed, and on the H200 the profile prices the fit."""
    from kernels_calibration.cachegen_decoder_bench import fit

    doc = json.loads((ROOT / IMPLS["cachegen_reference_decoder"]["measurement"]).read_text())
    assert doc["provenance"]["gpu_name"] == "NVIDIA H200"
    refit = fit(doc["rows"])["cachegen_reference_decoder"]["decode"]
    stored = doc["fits"]["cachegen_reference_decoder"]["decode"]
    assert refit["n"] == stored["n"] == sum(r["kernel"] == "decode" for r in doc["rows"]) >= 6
    for key in ("overhead_s", "s_per_unit", "max_abs_error_pct"):
        assert refit[key] == pytest.approx(stored[key], rel=1e-9), key
    for r in doc["rows"]:
        assert r["units"] == r["tokens"] * r["kv_heads"] * r["head_dim"] * 2
        assert r["symbols"] == r["layers"] * r["units"]
        assert r["time_s"] == pytest.approx(r["prompt_time_s"] / r["layers"], rel=1e-12)
        assert r["chunks"] == -(-r["tokens"] // 256)
        if r["symbols_kind"] == "gaussian_2bit":  # 2-bit codes coded below 2 bits; CacheGen's bins take more
            assert r["bitstream_bytes"] < r["symbols"] / 4
    dec = implementation_costs("cachegen_reference_decoder", gpu("h200"))["entropy_decode"]
    assert dec.s_per_unit == pytest.approx(stored["s_per_unit"], rel=1e-12)
    assert dec.overhead_s == pytest.approx(stored["overhead_s"], rel=1e-12)
    # the tensor-parallel shares: each factor is its rows' time per symbol over the whole 70B's at the same length
    assert refit["gpu_fill"] == stored["gpu_fill"]
    fill = stored["gpu_fill"]
    per_symbol = {
        (r["model"], r["tokens"]): r["prompt_time_s"] / r["symbols"]
        for r in doc["rows"]
        if r["kernel"] != "decode_cachegen_bins"
    }
    for heads, tp in ((4, "tp2"), (2, "tp4"), (1, "tp8")):
        ratios = sorted(
            per_symbol[(f"llama-3.1-70b/{tp}", t)] / per_symbol[("llama-3.1-70b", t)] for t in (4096, 16384)
        )
        assert fill["time_factor"][fill["channels_per_gpu"].index(heads * 128)] == pytest.approx(sum(ratios) / 2)
    assert fill["time_factor"][fill["channels_per_gpu"].index(1024)] == 1.0
    assert fill["time_factor"] == sorted(fill["time_factor"], reverse=True)  # fewer channels, slower per symbol


def test_gpu_fill_factor_interpolates_in_log_channels_and_holds_at_the_ends():
    fill = {"channels_per_gpu": [128, 256, 1024], "time_factor": [3.0, 2.0, 1.0]}
    assert fill_factor(fill, 128) == 3.0 and fill_factor(fill, 64) == 3.0  # held below the smallest share
    assert fill_factor(fill, 1024) == 1.0 and fill_factor(fill, 8192) == 1.0  # and above the whole model
    assert fill_factor(fill, 512) == pytest.approx(1.5)  # log2 512 is halfway from 256 to 1024
    assert fill_factor(fill, 181) == pytest.approx(3.0 - (7.5 - 7) / 1 * 1.0, abs=0.01)
    assert fill_factor(None, 128) == 1.0 and fill_factor(fill, None) == 1.0


def test_cachegen_decoder_priced_for_a_tensor_parallel_share():
    """Llama-3.1-70B on 8 GPUs of tensor parallelism: each GPU decodes one KV head's symbols, 1/8 of them, at the
    measured TP8 share's slowdown per symbol, so the arrival is 8 / 2.55 = 3.1x faster, not 8x."""
    tp1 = scenario(
        **{"model.preset": "llama-3.1-70b", "decode.gpu": "h200", "prefill.gpu": "h200", "methods": ["cachegen"]}
    )
    tp8 = scenario(
        **{
            "model.preset": "llama-3.1-70b",
            "decode.gpu": "h200",
            "prefill.gpu": "h200",
            "decode.tensor_parallel": 8,
            "methods": ["cachegen"],
        }
    )
    fill = json.loads((ROOT / IMPLS["cachegen_reference_decoder"]["measurement"]).read_text())["fits"][
        "cachegen_reference_decoder"
    ]["decode"]["gpu_fill"]
    slow = fill["time_factor"][fill["channels_per_gpu"].index(128)]
    h200 = gpu("h200")
    whole = implementation_costs("cachegen_reference_decoder", h200)["entropy_decode"]
    share = implementation_costs("cachegen_reference_decoder", h200, 128)["entropy_decode"]
    assert share.s_per_unit == pytest.approx(slow * whole.s_per_unit, rel=1e-12)
    assert share.overhead_s == whole.overhead_s
    for s, fit in ((tp1, whole), (tp8, share)):
        res = resolve(s)
        cost = res.costs(s.methods[0])[1]
        m, elements = res.model, 4096 * 2 * cost.kv_heads_per_gpu * res.model.head_dim
        dq = res.decode.profile.kernel("dequantize.kv").time_s(elements)
        assert cost.on_arrival_s(4096) == pytest.approx(m.layers * (dq + fit.time_s(elements)), rel=1e-12)
    assert res.costs(tp8.methods[0])[1].kv_heads_per_gpu == 1


def test_cachegen_decoder_bench_pure_parts_run_on_the_cpu():
    """The bench's codes, CDF layout and stream collection (its --smoke: no GPU); without --out it refuses."""
    from kernels_calibration.cachegen_decoder_bench import cdf_reference, main

    assert main(["--smoke"]) == 0
    codes = torch.tensor([[[0, 3], [1, 3], [1, 3], [2, 0]]], dtype=torch.int8)  # [1 layer, 4 tokens, 2 channels]
    cdf = cdf_reference(codes, 4).to(torch.int32) & 0xFFFF
    # channel 0: counts 1, 2, 1, 0 of 4; channel 1: 1, 0, 0, 3; scaled to 0xFFFB, plus the bin index
    assert cdf[0, 0].tolist() == [0, 0xFFFB // 4 + 1, 3 * 0xFFFB // 4 + 2, 0xFFFB + 3, 0xFFFF]
    assert cdf[0, 1].tolist() == [0, 0xFFFB // 4 + 1, 0xFFFB // 4 + 2, 0xFFFB // 4 + 3, 0xFFFF]
    assert main([]) == 2


def test_other_gpus_reprice_by_unit():
    """On an A100 80 GB (2039 vs 4800 GB/s, 19.5 vs 33.5 T instructions/s) the bytes share grows 2.35x and the ALU
    share 1.72x: the whole between the two; the launch overhead stays the H200's."""
    h, a = (
        implementation_costs("kvquant_reference", gpu("h200")),
        implementation_costs("kvquant_reference", gpu("a100_80gb")),
    )
    hr, ar = _rates(gpu("h200")), _rates(gpu("a100_80gb"))
    ratio = a["dequantize"].s_per_unit / h["dequantize"].s_per_unit
    assert hr.alu / ar.alu < ratio < hr.hbm / ar.hbm
    assert a["dequantize"].overhead_s == h["dequantize"].overhead_s


def test_kvquant_reference_path_prices_decode_as_fp16_attention_plus_the_reference_dequantize():
    """With the implementation the decode kernel is the profile's FP16 attention plus LUT dequantize and CSR
    outliers; on the H200 that comes within 5 % of the measured whole path (which timed SDPA itself)."""
    s = scenario(methods=[{"name": "kvquant", "implementation": "kvquant_reference"}], **H200)
    res = resolve(s)
    _, dec = res.costs(s.methods[0])
    prof = load_profile(ROOT / "kernels_calibration/profiles/h200/profile.json")
    fp16 = prof.kernel("decode_attn.fp16")
    lut, csr = MEASURED["kvquant_reference"]["lut_dequant"], MEASURED["kvquant_reference"]["outliers_csr"]
    fit = dec.method.decode_kernel(dec.profile, dec.model)
    assert fit.s_per_unit == pytest.approx(fp16.s_per_unit + lut["s_per_unit"] + csr["s_per_unit"], rel=1e-12)
    total = MEASURED["kvquant_reference"]["total"]
    assert fit.s_per_unit == pytest.approx(total["s_per_unit"], rel=0.05)
    # per iteration: layers x (K/V elements per context token on the GPU) x (that per-element cost); the
    # dequantize share is the reference dequantization's
    m = res.model
    units = 2 * m.kv_heads * m.head_dim
    it = dec.iteration(1)
    assert it.per_ctx_s == pytest.approx(m.layers * units * fit.s_per_unit, rel=1e-12)
    assert it.dequant_per_ctx_s == pytest.approx(m.layers * units * (lut["s_per_unit"] + csr["s_per_unit"]), rel=1e-12)
    plain = resolve(scenario(methods=["kvquant"], **H200))
    assert it.per_ctx_s > 5 * plain.costs(plain.scenario.methods[0])[1].iteration(1).per_ctx_s


def test_kernels_override_a_role_or_a_profile_key_and_win_over_the_implementation():
    s = scenario(
        methods=[
            {
                "name": "kvquant",
                "label": "kvquant_ref",
                "kernels": {"dequantize": {"overhead_s": 1e-4, "s_per_unit": 1e-11}},
            },
            {
                "name": "kvquant",
                "label": "kvquant_key",
                "kernels": {"decode_attn.dequant_unfused": {"overhead_s": 2e-5, "s_per_unit": 3e-12}},
            },
            {
                "name": "kvquant",
                "label": "kvquant_both",
                "implementation": "kvquant_reference",
                "kernels": {"dequantize": {"overhead_s": 0.0, "s_per_unit": 2e-12}},
            },
        ]
    )
    res = resolve(s)
    fp16 = res.decode.profile.kernel("decode_attn.fp16")
    ref, key, both = (res.costs(m)[1] for m in s.methods)
    f = ref.method.decode_kernel(ref.profile, ref.model)
    assert (f.overhead_s, f.s_per_unit) == pytest.approx((fp16.overhead_s + 1e-4, fp16.s_per_unit + 1e-11), rel=1e-12)
    f = key.method.decode_kernel(key.profile, key.model)
    assert (f.overhead_s, f.s_per_unit) == (2e-5, 3e-12)
    f = both.method.decode_kernel(both.profile, both.model)
    assert f.s_per_unit == pytest.approx(fp16.s_per_unit + 2e-12, rel=1e-12)
    result = run_scenario(s)
    over = result.profiles()["method_kernels"]
    assert over["kvquant_ref"]["decode"]["dequantize"] == {"overhead_s": 1e-4, "s_per_unit": 1e-11}
    assert over["kvquant_both"]["implementation"] == "kvquant_reference"
    assert "kvquant" not in over


def test_no_rqe_requantize_prices_the_open_block_per_request_per_iteration():
    s = scenario(
        methods=[
            {"name": "hack_no_rqe", "label": "no_rqe_ref", "implementation": "no_rqe_requantize"},
            "hack_no_rqe",
            "hack",
        ],
        **H200,
    )
    res = resolve(s)
    impl, plain, rqe = (res.costs(m)[1] for m in s.methods)
    rq = implementation_costs("no_rqe_requantize", res.decode.gpu)["requantize"]
    m = res.model
    # the attention is HACK's RQE kernel; the per-context cost is the same as HACK with RQE
    assert impl.method.decode_kernel(impl.profile, m) is rqe.method.decode_kernel(rqe.profile, m)
    for b in (1, 8):
        it, it_rqe = impl.iteration(b), rqe.iteration(b)
        v_block = m.kv_heads * 64 * m.head_dim  # kv_heads x Π x head_dim per request per layer
        assert it.dequant_fixed_s == pytest.approx(m.layers * (b * rq.s_per_unit * v_block + rq.overhead_s), rel=1e-12)
        assert it.per_ctx_s == pytest.approx(it_rqe.per_ctx_s, rel=1e-12)
    assert plain.iteration(8).dequant_fixed_s == 0
    df = run_scenario(s).requests
    assert df[df.method == "hack_no_rqe"].dequantize_s.iloc[0] == 0  # the measured no-RQE kernel: decode
    assert (df.dequantize_s > 0).sum() == 1


def test_cachegen_reference_decoder_prices_decoding_on_arrival():
    """Plain `cachegen` is priced as deployed, with the measured decoder; `implementation: null` is the
    instruction-count lower bound, which is faster."""
    s = scenario(methods=["cachegen", {"name": "cachegen", "label": "cg_bound", "implementation": None}])
    res = resolve(s)
    assert s.methods[0].implementation == "cachegen_reference_decoder"
    ref, bound = (res.costs(m)[1] for m in s.methods)
    fit = implementation_costs("cachegen_reference_decoder", res.decode.gpu)["entropy_decode"]
    m = res.model
    elements = 4096 * 2 * m.kv_heads * m.head_dim
    dq = res.decode.profile.kernel("dequantize.kv").time_s(elements)
    assert ref.on_arrival_s(4096) == pytest.approx(m.layers * (dq + fit.time_s(elements)), rel=1e-12)
    assert ref.on_arrival_s(4096) > bound.on_arrival_s(4096)


@pytest.mark.parametrize(
    "method, why",
    [
        ({"name": "hack", "implementation": "no_rqe_requantize"}, "without requantization elimination"),
        ({"name": "kvquant", "implementation": "cachegen_reference_decoder"}, "not of kvquant"),
        ({"name": "kvquant", "implementation": "nonesuch"}, "unknown implementation"),
    ],
)
def test_an_implementation_the_method_cannot_take_is_refused(method, why):
    with pytest.raises(ScenarioError, match=why):
        scenario(methods=[method])


@pytest.mark.parametrize(
    "kernels, why",
    [
        ({"decode_attn.hack": {"overhead_s": 0, "s_per_unit": 1e-12}}, "prices no kernel"),
        ({"dequantize": {"overhead_s": -1, "s_per_unit": 1e-12}}, "greater than or equal"),
        ({"dequantize": {"overhead_s": 0}}, "s_per_unit"),
    ],
)
def test_bad_kernel_costs_are_refused(kernels, why):
    with pytest.raises(ScenarioError, match=why):
        scenario(methods=[{"name": "kvquant", "kernels": kernels}])


def test_requantize_role_needs_rqe_off():
    with pytest.raises(ScenarioError, match="without requantization elimination"):
        scenario(methods=[{"name": "hack", "kernels": {"requantize": {"overhead_s": 0, "s_per_unit": 1e-12}}}])
    s = scenario(
        methods=[
            {
                "name": "hack",
                "requantization_elimination": False,
                "kernels": {"requantize": {"overhead_s": 1e-5, "s_per_unit": 1e-12}},
            }
        ]
    )
    assert resolve(s).costs(s.methods[0])[1].iteration(4).dequant_fixed_s > 0


def test_every_method_accepts_its_own_profile_keys():
    for name, cls in REGISTRY.items():
        method = cls()
        for key in cls.kernel_keys:
            assert method.kernel_refusal(key) is None
            priced = priced_profile(
                resolve(scenario(methods=[name])).decode.profile,
                cls(kernels={key: {"overhead_s": 1e-6, "s_per_unit": 2e-13}}),
                gpu("a100_80gb"),
            )
            assert priced.kernel(key).s_per_unit == 2e-13
