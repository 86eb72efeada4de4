"""A one-prompt batch's price filled for a block of prompt lengths at once (ReplicaCostModel._one_prompt_block,
numpy) is the scalar price (`_prefill`) bit for bit: every method, with the engine's factors and floors, pipeline
stages, and HACK's auto form switching inside a block."""

from __future__ import annotations

import dataclasses
import random
import struct

import pytest

from costmodel.calibration import KernelFit
from costmodel.methods import HACK, REGISTRY, make_method
from costmodel.phases import ONE_PROMPT_BLOCK, ReplicaCostModel
from helpers import scenario
from simulator.resolve import resolve

# what a replica can change about a one-prompt price: the engine's factors and floors, the host issue floor, PQCache's
# host CPUs, pipeline stages (the hop, the stage share of the LM head)
SETTINGS = {
    "plain": {"host_vcpus": 8},
    "engine": {
        "prefill_efficiency": 0.7,
        "approximation_factor": 1.3,
        "quantize_factor": 1.7,
        "method_quantize_issue_s_per_layer": 2e-5,
        "method_prefill_issue_s_per_layer": 3e-5,
        "host_issue_s_per_layer": 1e-5,
        "host_issue_s_per_iteration": 0.05,  # the floor holds short prompts (a few thousand tokens)
        "host_vcpus": 4,
    },
    "pipeline": {"pipeline": 2, "host_vcpus": 2},
}


def replica(method, settings: dict, profile=None) -> ReplicaCostModel:
    s = scenario()
    pre, _ = resolve(s).costs(s.methods[0])
    settings = dict(settings)
    if "pipeline" in settings:
        settings["parallel"] = dataclasses.replace(pre.parallel, pipeline=settings.pop("pipeline"))
    return dataclasses.replace(pre, method=method, profile=profile or pre.profile, **settings)


def bits(cost) -> tuple:
    return (*(struct.pack("<d", x) for x in cost[:4]), cost.forms)


def lengths(seed: int) -> list[int]:
    rng = random.Random(seed)
    edges = [1, 2, ONE_PROMPT_BLOCK - 1, ONE_PROMPT_BLOCK, ONE_PROMPT_BLOCK + 1, 8191, 8192, 32768]
    return edges + [rng.randrange(1, 1 << 17) for _ in range(150)]


@pytest.mark.parametrize("setting", sorted(SETTINGS))
@pytest.mark.parametrize("name", sorted(REGISTRY))
def test_a_block_of_lengths_is_priced_as_each_length_alone(name, setting):
    bulk = replica(make_method(name), SETTINGS[setting])
    scalar = dataclasses.replace(bulk)  # its own memo: nothing priced yet
    for n in lengths(sum(map(ord, name + setting))):
        assert bits(bulk.prefill((n,))) == bits(scalar._prefill((n,), None)), n
    assert bulk.method.has_bulk_prefill_form()


def test_hack_auto_switches_form_inside_a_block_as_the_scalar_does():
    """A profile whose homomorphic kernel has no launch cost and twice the per-FLOP cost of FP16's: prompts below
    the break-even run homomorphic, the rest FP16, with the break-even inside the block priced."""
    base = replica(HACK(), {})
    prof = base.profile
    fpp = 4.0 * base.q_heads_per_gpu * base.model.head_dim
    even_tokens = 3000  # break-even pairs L(L+1)/2 at this length: overhead / (2r - r) FLOPs
    fp16 = KernelFit(overhead_s=fpp * even_tokens * (even_tokens + 1) / 2 * 1e-15, s_per_unit=1e-15)
    hom = KernelFit(overhead_s=0.0, s_per_unit=2e-15)
    toy = dataclasses.replace(prof, kernels={**prof.kernels, "prefill_attn.fp16": fp16, "prefill_attn.hack": hom})
    bulk = replica(HACK(), SETTINGS["engine"], profile=toy)
    scalar = dataclasses.replace(bulk)
    forms = set()
    for n in range(2900, 3100):
        got = bulk.prefill((n,))
        assert bits(got) == bits(scalar._prefill((n,), None)), n
        forms.add(got.forms[0])
    assert forms == {"fp16", "homomorphic"}
    assert bulk.prefill((2999,)).forms == ("homomorphic",) and bulk.prefill((3001,)).forms == ("fp16",)


def test_a_method_whose_form_has_no_bulk_twin_is_priced_length_by_length():
    """A subclass overriding prefill_form alone: the bulk path would not know its choice, so each length is priced
    by the scalar path (and still the scalar's price)."""

    class Odd(HACK):
        def prefill_form(self, profile, attn_flops: float) -> str:
            return "homomorphic" if int(attn_flops) % 3 else "fp16"

    method = Odd()
    assert not method.has_bulk_prefill_form() and HACK().has_bulk_prefill_form()
    bulk = replica(method, {})
    assert bulk._one_prompt_block(0, ONE_PROMPT_BLOCK) is None
    scalar = dataclasses.replace(bulk)
    for n in lengths(7)[:40]:
        assert bits(bulk.prefill((n,))) == bits(scalar._prefill((n,), None)), n
