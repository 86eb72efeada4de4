"""HACK's prefill attention forms: fp16 (FlashAttention in FP16, then the quantize kernel), homomorphic (the
homomorphic kernel on the codes) and auto (per prompt, the faster on the pool's GPU by its profile)."""

from __future__ import annotations

import dataclasses
import json

import pytest

from costmodel.calibration import KernelFit
from costmodel.methods import HACK
from helpers import scenario
from simulator.resolve import resolve
from simulator.run import run_scenario

PROMPT = 4096


def lone_prefill_closed_form(s, form: str) -> tuple[float, float]:
    """(prefill latency, quantize) of the scenario's one prompt written out from the kernels: every layer runs the
    dense GEMMs and the chosen attention kernel on 4·H·d·L(L+1)/2 FLOPs; the FP16 form then runs the quantize kernel
    on its K/V after the forward, the homomorphic form runs it inside each layer, before its attention reads the
    codes, and nothing is left after the forward (no pack floor in this scenario)."""
    res = resolve(s)
    pre, _ = res.costs(s.methods[0])
    m, prof = res.model, res.prefill.profile
    flops = 4.0 * m.heads * m.head_dim * PROMPT * (PROMPT + 1) / 2
    attn = prof.kernel({"fp16": "prefill_attn.fp16", "homomorphic": "prefill_attn.hack"}[form]).time_s(flops)
    quantize_layer = prof.kernel("quantize.kv").time_s(PROMPT * 2 * m.kv_heads * m.head_dim)
    layer = pre._dense_layer_s(PROMPT) + attn
    if form == "homomorphic":
        return m.layers * (layer + quantize_layer) + pre._lm_head_s(1), 0.0
    return m.layers * layer + pre._lm_head_s(1), m.layers * quantize_layer


@pytest.mark.parametrize("form", ["fp16", "homomorphic"])
def test_single_request_prefill_timeline_per_form(form):
    s = scenario(methods=[{"name": "hack", "prefill_attention": form}])
    row = next(run_scenario(s).requests.itertuples())
    prefill_s, quantize_s = lone_prefill_closed_form(s, form)
    assert row.prefill_attention == form
    assert row.prefill_end_s - row.prefill_start_s == pytest.approx(prefill_s, rel=1e-12)
    assert row.quantize_end_s - row.prefill_end_s == pytest.approx(quantize_s, rel=1e-12)
    # the homomorphic correction is split out of the homomorphic kernel's time; the FP16 form has none
    # (approximation_s also holds decode's correction: prefill's share is what prefill_s leaves out)
    if form == "fp16":
        assert row.prefill_s == pytest.approx(prefill_s, rel=1e-12)
    else:
        assert 0 < prefill_s - row.prefill_s < row.approximation_s


def test_forms_differ_by_the_attention_kernels_only():
    rows = {
        f: next(run_scenario(scenario(methods=[{"name": "hack", "prefill_attention": f}])).requests.itertuples())
        for f in ("fp16", "homomorphic")
    }
    s = scenario(methods=["hack"])
    res = resolve(s)
    m, prof = res.model, res.prefill.profile
    flops = 4.0 * m.heads * m.head_dim * PROMPT * (PROMPT + 1) / 2
    quantize = m.layers * prof.kernel("quantize.kv").time_s(PROMPT * 2 * m.kv_heads * m.head_dim)
    gap = m.layers * (prof.kernel("prefill_attn.hack").time_s(flops) - prof.kernel("prefill_attn.fp16").time_s(flops))
    gap += quantize  # the homomorphic form quantizes inside its forward
    got = (rows["homomorphic"].prefill_end_s - rows["homomorphic"].prefill_start_s) - (
        rows["fp16"].prefill_end_s - rows["fp16"].prefill_start_s
    )
    assert got == pytest.approx(gap, rel=1e-9)
    # the same KV leaves either way; the homomorphic form's quantize kernel ran in its forward, the FP16 form's after
    assert rows["fp16"].kv_wire_bytes == rows["homomorphic"].kv_wire_bytes
    assert rows["fp16"].quantize_s == pytest.approx(quantize, rel=1e-12)
    assert rows["homomorphic"].quantize_s == 0.0


def test_auto_takes_the_faster_form_per_prompt():
    """A profile whose homomorphic kernel has no launch cost but twice the per-FLOP cost: short prompts run
    homomorphic, long ones FP16, each decided by its own length, in the same batch."""
    s = scenario(methods=["hack"])
    prof = resolve(s).prefill.profile
    fp16 = KernelFit(overhead_s=1e-3, s_per_unit=1e-15)
    hom = KernelFit(overhead_s=0.0, s_per_unit=2e-15)
    kernels = dict(prof.kernels, **{"prefill_attn.fp16": fp16, "prefill_attn.hack": hom})
    toy = dataclasses.replace(prof, kernels=kernels)
    method = HACK()
    # break-even at 1e-3 / 1e-15 = 1e12 FLOPs
    assert method.prefill_form(toy, 0.5e12) == "homomorphic"
    assert method.prefill_form(toy, 2e12) == "fp16"
    assert HACK(prefill_attention="homomorphic").prefill_form(toy, 2e12) == "homomorphic"
    assert HACK(prefill_attention="fp16").prefill_form(toy, 0.5e12) == "fp16"


def test_auto_batch_groups_prompts_by_form_one_launch_each():
    s = scenario(methods=["hack"])
    res = resolve(s)
    pre, _ = res.costs(s.methods[0])
    m = res.model
    per_pair = 4.0 * m.heads * m.head_dim
    fp16 = KernelFit(overhead_s=1e-3, s_per_unit=1e-15)
    hom = KernelFit(overhead_s=0.0, s_per_unit=2e-15)
    toy = dataclasses.replace(
        pre.profile, kernels=dict(pre.profile.kernels, **{"prefill_attn.fp16": fp16, "prefill_attn.hack": hom})
    )
    cost = dataclasses.replace(pre, profile=toy)
    short, long_ = 1024, 16384
    assert per_pair * short * (short + 1) / 2 < 1e12 < per_pair * long_ * (long_ + 1) / 2
    attn_s, approx_s, forms = cost.prefill_attention_s((short, long_, short))
    assert forms == ("homomorphic", "fp16", "homomorphic")
    want = hom.time_s(per_pair * 2 * short * (short + 1) / 2) + fp16.time_s(per_pair * long_ * (long_ + 1) / 2)
    assert attn_s == pytest.approx(want, rel=1e-12)
    assert 0 < approx_s <= hom.time_s(per_pair * 2 * short * (short + 1) / 2)  # capped at the kernel time


def test_auto_runs_fp16_where_the_profiles_price_the_homomorphic_kernel_slower():
    """Every committed profile prices HACK's prefill kernel slower than FlashAttention (docs/methods.md, the table
    under "Derived profiles"): auto takes FP16 there, and the outputs say so."""
    s = scenario(
        methods=["hack", {"name": "hack", "label": "hack_hom", "prefill_attention": "homomorphic"}],
        **{"calibration": {"prefill_profile": "auto", "decode_profile": "auto"}, "prefill.gpu": "a10g"},
    )
    result = run_scenario(s)
    df = result.requests
    assert set(df[df.method == "hack"].prefill_attention) == {"fp16"}
    assert set(df[df.method == "hack_hom"].prefill_attention) == {"homomorphic"}
    assert result.summary["methods"]["hack"]["prefill_attention"] == {"fp16": 1}
    assert result.summary["methods"]["hack_hom"]["prefill_attention"] == {"homomorphic": 1}
    assert (df[df.method == "hack"].prefill_end_s - df[df.method == "hack"].prefill_start_s).iloc[0] < (
        df[df.method == "hack_hom"].prefill_end_s - df[df.method == "hack_hom"].prefill_start_s
    ).iloc[0]


def test_other_methods_run_fp16_prefill_and_outputs_carry_the_form(tmp_path):
    from typer.testing import CliRunner

    from cli import app

    s = scenario(methods=["baseline", "kvquant", "hack"])
    result = run_scenario(s)
    for m in ("baseline", "kvquant"):
        assert result.summary["methods"][m]["prefill_attention"] == {"fp16": 1}
    path = tmp_path / "s.json"
    path.write_text(json.dumps(s.model_dump(mode="json")))
    out = tmp_path / "out"
    r = CliRunner().invoke(app, ["simulate", str(path), "--out", str(out)])
    assert r.exit_code == 0, r.stderr
    assert "prefill_attention" in (out / "requests.csv").read_text().splitlines()[0].split(",")
    assert json.loads((out / "summary.json").read_text())["methods"]["hack"]["prefill_attention"] == {"fp16": 1}
    assert "prefill attention" in (out / "report.html").read_text()


def test_fp16_packs_for_the_wire_only_where_the_engine_issues_a_pack():
    """FP16 has no quantize kernel: its step after prefill is the engine's copy of each layer's K and V into a flat
    send buffer (realrun: Baseline.encode_layer), priced as its CPU issue time per layer where one is given
    (calibration.implementation_factors.baseline.quantize_issue_s_per_layer), none otherwise, and none for a
    colocated step's chunks, whose KV stays in the replica (nothing is sent)."""
    plain = scenario(methods=["baseline"])
    packed = scenario(
        methods=["baseline"],
        **{"calibration.implementation_factors": {"baseline": {"quantize_issue_s_per_layer": 4e-5}}},
    )
    layers = resolve(plain).model.layers
    assert resolve(plain).costs(plain.methods[0])[0].prefill((PROMPT,), None).encode_s == 0.0
    pre = resolve(packed).costs(packed.methods[0])[0]
    assert pre.prefill((PROMPT,), None).encode_s == pytest.approx(layers * 4e-5, rel=1e-12)
    assert pre._chunks_encode_s(PROMPT) == 0.0
    row = next(run_scenario(packed).requests.itertuples())
    assert row.quantize_end_s - row.prefill_end_s == pytest.approx(layers * 4e-5, rel=1e-9)


def test_a_homomorphic_prefill_quantizes_in_its_forward_and_only_packs_after():
    """The homomorphic kernel reads the codes, so the KV is quantized inside the forward, layer by layer, before each
    layer's attention (realrun/kvformats.py Hack.prefill_attention: build_cache, then hack_attn_prefill); the step
    after the forward is the pack for the wire alone (its CPU floor per layer where one is given), however long the
    quantize kernel is. The FP16 form quantizes after its forward: that step is the kernel or the floor, whichever
    is longer."""
    floor_s = 1e-6  # per layer: far below the quantize kernel
    factors = {"calibration.implementation_factors": {"hack": {"quantize_issue_s_per_layer": floor_s}}}
    hom = scenario(methods=[{"name": "hack", "prefill_attention": "homomorphic"}], **factors)
    fp16 = scenario(methods=[{"name": "hack", "prefill_attention": "fp16"}], **factors)
    res = resolve(hom)
    m, prof = res.model, res.prefill.profile
    kernel_s = m.layers * prof.kernel("quantize.kv").time_s(PROMPT * 2 * m.kv_heads * m.head_dim)
    assert kernel_s > 10 * m.layers * floor_s
    pre_hom = res.costs(hom.methods[0])[0]
    pre_fp16 = resolve(fp16).costs(fp16.methods[0])[0]
    assert pre_hom.prefill((PROMPT,), None).encode_s == pytest.approx(m.layers * floor_s, rel=1e-12)
    assert pre_fp16.prefill((PROMPT,), None).encode_s == pytest.approx(kernel_s, rel=1e-12)
    # the kernel's time moved into the forward: the forms' prefills differ by their attention kernels and it
    flops = 4.0 * m.heads * m.head_dim * PROMPT * (PROMPT + 1) / 2
    attn_gap = m.layers * (
        prof.kernel("prefill_attn.hack").time_s(flops) - prof.kernel("prefill_attn.fp16").time_s(flops)
    )
    got = pre_hom.prefill((PROMPT,), None).latency_s - pre_fp16.prefill((PROMPT,), None).latency_s
    assert got == pytest.approx(attn_gap + kernel_s, rel=1e-9)
    # the bulk price of one prompt (simulator/step_price.PrefillPrices) says the same
    block = pre_hom._one_prompt_block(PROMPT, PROMPT + 1)
    assert block is not None and block[0, 3] == pre_hom.prefill((PROMPT,), None).encode_s


def test_prefill_efficiency_divides_the_models_work_not_the_homomorphic_kernel():
    """The engine's prefill efficiency (a power-cap slowdown, realrun.prefillcal) divides the model's work, and HACK's
    homomorphic attention stays at its profiled price: at half the speed an FP16 prefill takes twice as long, a HACK
    one twice its time less its homomorphic attention (layers x that kernel's price) plus that attention once. In a
    batch of mixed forms the homomorphic part is that form's launch over its prompts alone."""
    from dataclasses import replace

    from simulator.fit_items import neutral
    from simulator.load import load_scenario
    from simulator.run import resolve

    s = load_scenario("scenarios/measured/h200g_8b_sat.yaml")
    res = resolve(neutral(s), "x")
    for name in ("baseline", "hack"):
        pre, _ = res.costs(next(m for m in s.methods if m.name == name))
        half = replace(pre, prefill_efficiency=0.5)
        for prompt in (2048, 12288):
            full_s, slow_s = pre.prefill((prompt,)).latency_s, half.prefill((prompt,)).latency_s
            own_s = 0.0
            if name == "hack":
                attn_s, _, forms = pre.prefill_attention_s((prompt,))
                assert forms == ("homomorphic",)
                own_s = pre.model.layers * attn_s
                assert own_s > 0.3 * full_s if prompt == 12288 else own_s > 0
            assert slow_s == pytest.approx(2 * (full_s - own_s) + own_s, rel=1e-9), (name, prompt)
    pre, _ = res.costs(next(m for m in s.methods if m.name == "hack"))
    mixed = pre._homomorphic_attention_s((1024, 4096), None, ("fp16", "homomorphic"), 1.0)
    assert mixed == pytest.approx(pre.prefill_attention_s((4096,))[0], rel=1e-12)
