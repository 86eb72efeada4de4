"""The method registry: one module per method, the scenario schema generated from it, no name written twice."""

from __future__ import annotations

import ast
import re
from pathlib import Path
from typing import get_args

import pytest

from costmodel import methods as registry
from costmodel.methods import HACK, METHODS, REFERENCE, REGISTRY, KVMethod, make_method
from costmodel.roofline import roofline_profile
from costmodel.specs import ModelSpec
from helpers import scenario
from simulator.config import Scenario, ScenarioError, parse_scenario
from simulator.resolve import gpu_spec, resolve
from simulator.run import run_scenario

ROOT = Path(__file__).resolve().parent.parent


def test_registry_lists_every_method_module_once_with_its_metadata():
    modules = {p.stem for p in (ROOT / "costmodel" / "methods").glob("*.py")} - {"__init__", "base"}
    assert {cls.__module__.rsplit(".", 1)[-1] for cls in METHODS} == modules
    assert list(REGISTRY) == [registry.method_name(cls) for cls in METHODS]
    assert METHODS[0] is REGISTRY[REFERENCE] and registry.display_rank(REFERENCE) == 0
    colours = [cls.colour for cls in METHODS]
    assert len(set(colours)) == len(colours) and all(re.fullmatch(r"#[0-9a-f]{6}", c) for c in colours)
    assert len({cls.display_label for cls in METHODS}) == len(METHODS)
    for name, cls in REGISTRY.items():
        assert issubclass(cls, KVMethod) and cls.model_config["frozen"] and cls.model_config["extra"] == "forbid"
        assert get_args(cls.model_fields["name"].annotation) == (name,)
        m = make_method(name)
        assert m.name == name and m.output_name == name and make_method(name, label="x").output_name == "x"
        for field, info in cls.model_fields.items():
            assert info.description, (name, field)


@pytest.mark.parametrize("gpu", ["a100_80gb", "v100", "h100", "l4"])
def test_every_kernel_a_method_prices_with_is_in_the_roofline_profile(gpu):
    prof = roofline_profile(gpu_spec(scenario(**{"decode.gpu": gpu}).decode.gpu))
    for cls in METHODS:
        for key in cls.kernel_keys:
            assert prof.kernel(key).s_per_unit > 0, (cls, key)
    assert set(registry.kernel_keys(optional=False)) <= set(prof.kernels)
    assert {"score.pq", "select.topk", "score.quantized_keys"} <= set(registry.kernel_keys())


def test_scenario_methods_union_is_the_registry():
    (entry,) = get_args(Scenario.model_fields["methods"].annotation)
    assert get_args(get_args(entry)[0]) == METHODS


def test_scenario_method_syntax_bare_mapping_and_label():
    s = scenario(
        methods=[
            "baseline",
            {"name": "hack", "partition": 128, "label": "hack_pi128"},
            "hack_no_se",
            {"name": "hack_no_rqe", "summation_elimination": False},
            {"name": "kvquant", "bits": 4},
        ]
    )
    base, pi128, no_se, no_rqe, kvq = s.methods
    assert type(base) is REGISTRY["baseline"] and base.output_name == "baseline"
    assert isinstance(pi128, HACK) and pi128.partition == 128 and pi128.output_name == "hack_pi128"
    assert no_se.summation_elimination is False and no_se.requantization_elimination is True
    assert no_se.decode_attention == "hack_no_se"
    assert no_rqe.requantization_elimination is False and no_rqe.decode_attention == "hack_no_se"
    assert kvq.bits == 4 and kvq.decode_attention == "dequant_unfused"
    # the dump keeps the field order the outputs (scenario.json) have always had: label, name, parameters
    assert list(pi128.model_dump()) == [
        "label",
        "name",
        "implementation",
        "kernels",
        "bits",
        "partition",
        "stochastic_rounding",
        "summation_elimination",
        "requantization_elimination",
        "prefill_attention",
    ]
    assert no_se.model_dump()["summation_elimination"] is False


@pytest.mark.parametrize(
    "methods, message",
    [
        ([{"name": "hack", "partition": 100}], "test: methods.0.partition: partition must be a multiple of 16"),
        ([{"name": "hack", "partition": 512}], "test: methods.0.partition: Input should be less than or equal to 256"),
        ([{"name": "kvquant", "speed": 2}], "test: methods.0.speed: unknown field"),
        (["zip"], "test: methods.0: Input tag 'zip' found using 'name' does not match any of the expected tags"),
        ([{"name": "pqcache", "top_k_fraction": 0}], "test: methods.0.top_k_fraction: Input should be greater than 0"),
    ],
)
def test_bad_method_entries_fail_with_one_line(methods, message):
    raw = scenario().model_dump(mode="json")
    raw["methods"] = methods
    with pytest.raises(ScenarioError) as e:
        parse_scenario(raw, "test")
    assert str(e.value).startswith(message) and "\n" not in str(e.value)


def test_no_other_product_module_names_a_method():
    """Reports, planning, the simulator, the cost model's other modules and the CLI look methods up in the
    registry. (Kernel variants, e.g. decode_attn.hack_no_se, are kernels, not scenario methods: the modules
    that describe kernels (kernels_calibration, costmodel's calibration, roofline and kernel_work) and the
    measured harness in realrun with its own KV formats name them.)"""
    names = set(REGISTRY)
    kernel_modules = {"calibration.py", "roofline.py", "kernel_work.py"}
    files = [ROOT / "cli.py"] + [
        p
        for d in ("costmodel", "simulator", "reports", "planning", "catalog")
        for p in (ROOT / d).rglob("*.py")
        if "methods" not in p.relative_to(ROOT).parts and not (d == "costmodel" and p.name in kernel_modules)
    ]
    found = []
    for path in files:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in names:
                found.append(f"{path.relative_to(ROOT)}:{node.lineno}: {node.value!r}")
    assert not found, found


def _model(**kw) -> ModelSpec:
    return ModelSpec(
        key="m",
        name="m",
        layers=2,
        hidden_size=1024,
        heads=8,
        kv_heads=2,
        head_dim=128,
        intermediate_size=4096,
        vocab_size=32000,
        **kw,
    )


def test_tied_embeddings_store_the_lm_head_once_and_qkv_bias_counts_its_vectors():
    plain = _model()
    assert _model(tied_embeddings=True).params == plain.params - 32000 * 1024
    assert _model(qkv_bias=True).params == plain.params + 2 * (8 * 128 + 2 * 2 * 128)
    # through a scenario: tying frees exactly one FP16 vocab x hidden matrix of the replica's memory for KV
    kw = {"methods": ["baseline"], "prefill.tensor_parallel": 1, "decode.tensor_parallel": 1}
    untied = resolve(scenario(**kw)).costs(make_method("baseline"))[1]
    tied = resolve(scenario(**kw, **{"model": {"preset": "llama-3.1-8b", "tied_embeddings": True}})).costs(
        make_method("baseline")
    )[1]
    m = untied.model
    assert tied.memory.kv_pool_bytes - untied.memory.kv_pool_bytes == pytest.approx(m.vocab_size * m.hidden_size * 2)
    assert tied.memory.blocks > untied.memory.blocks  # whole blocks of it: capacity grows by blocks
    a = run_scenario(scenario(**kw, **{"model": {"preset": "llama-3.1-8b", "qkv_bias": True}})).summary
    b = run_scenario(scenario(**kw)).summary
    bias_bytes = m.layers * (m.q_dim + 2 * m.kv_dim) * 2
    pool = lambda r: r["methods"]["baseline"]["decode_memory"]["kv_pool_bytes_per_gpu"]  # noqa: E731 (one GPU)
    assert pool(b) - pool(a) == pytest.approx(bias_bytes)


def test_fp8s_cast_after_prefill_reads_fp16_and_writes_fp8_by_hand():
    """FP8's encode is a cast: per layer on one GPU, one launch and each new K and V element read in FP16 and
    written in FP8 (3 bytes) at the profile's memory bandwidth. TINY's prefill (Llama-3.1-8B at TP 1): 4096
    tokens x 2 x 8 KV heads x 128 dims = 8,388,608 elements, 25,165,824 bytes."""
    from helpers import scenario
    from simulator.resolve import resolve

    s = scenario(methods=["fp8"])
    pre, _ = resolve(s).costs(s.methods[0])
    p = pre.profile
    want = p.launch_overhead_s + 4096 * 2 * 8 * 128 * 3 / (p.memory_gbps * 1e9)
    assert pre._encode_layer_s(4096) == pytest.approx(want, rel=1e-12, abs=0)


def test_hack_prices_a_partition_by_its_own_measured_decode_fit():
    """HACK.decode_kernel: a partition the profile measured (the H200's decode_attn.hack_pi128) is priced by
    that fit, not by Π = 64's."""
    from costmodel.calibration import load_profile

    prof = load_profile(Path(__file__).resolve().parent.parent / "kernels_calibration/profiles/h200/profile.json")
    pi128 = make_method("hack", partition=128)
    assert pi128.decode_kernel(prof) is prof.kernels["decode_attn.hack_pi128"]
    assert make_method("hack").decode_kernel(prof) is not prof.kernels["decode_attn.hack_pi128"]
