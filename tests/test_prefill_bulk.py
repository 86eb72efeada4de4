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
from costmodel.methods.base import PREFILL_KERNELS
from costmodel.phases import ONE_PROMPT_BLOCK, ONE_PROMPT_TABLE_TOKENS, PrefillCost, ReplicaCostModel
from helpers import scenario
from simulator.resolve import resolve
from simulator.step_price import Prefill, PrefillPrices

FORMS = tuple(PREFILL_KERNELS)  # a form's code is its index

# what a replica can change about a one-prompt price: the engine's factors and floors, the host issue floor and the
# exposed host time, PQCache's host CPUs, pipeline stages (the hop, the stage share of the LM head)
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
        "host_exposed_s_per_iteration": 4e-4,  # an eager batch's exposed CPU time, beside the GPU's
        "host_exposed_s_per_layer": 1.7e-5,
        "host_vcpus": 4,
    },
    "pipeline": {
        "pipeline": 2,
        "host_vcpus": 2,
        "host_exposed_s_per_iteration": 4e-4,
        "host_exposed_s_per_layer": 1.7e-5,
    },
}


def replica(method, settings: dict, profile=None) -> ReplicaCostModel:
    s = scenario()
    pre, _ = resolve(s).costs(s.methods[0])
    settings = dict(settings)
    if "pipeline" in settings:
        settings["parallel"] = dataclasses.replace(pre.parallel, pipeline=settings.pop("pipeline"))
    return dataclasses.replace(pre, method=method, profile=profile or pre.profile, **settings)


def double(x: float) -> bytes:
    return struct.pack("<d", x)


def bits(cost: PrefillCost | Prefill) -> tuple:
    """A price's four times, bit for bit, and its forms (the cost model's `PrefillCost` or a replica's `Prefill`)."""
    return (
        *(double(x) for x in (cost.stage_s, cost.latency_s, cost.approximation_s, cost.encode_s)),
        cost.forms,
    )


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


@pytest.mark.parametrize("setting", sorted(SETTINGS))
@pytest.mark.parametrize("name", sorted(REGISTRY))
def test_a_block_of_chunk_lengths_after_the_same_earlier_tokens_is_each_chunks_attention(name, setting):
    """one_chunk_attention_block(past, lo, hi): prefill_attention_s((past + n,), (past,)) for each n, bit for bit
    (a colocated step's chunk: its earlier tokens restored to FP16 where the form attends in FP16)."""
    cost = replica(make_method(name), SETTINGS[setting])
    rng = random.Random(sum(map(ord, name + setting)))
    for past in (0, 1, 2048, 6000, rng.randrange(1, 1 << 16)):
        lo = rng.randrange(0, 4) * ONE_PROMPT_BLOCK
        block = cost.one_chunk_attention_block(past, lo, lo + ONE_PROMPT_BLOCK)
        assert block is not None and block.shape == (ONE_PROMPT_BLOCK, 3)
        for n in [max(lo, 1), lo + ONE_PROMPT_BLOCK - 1] + [
            rng.randrange(max(lo, 1), lo + ONE_PROMPT_BLOCK) for _ in range(30)
        ]:
            t, approx, forms = dataclasses.replace(cost).prefill_attention_s((past + n,), (past,))
            got = block[n - lo]
            assert (double(got[0]), double(got[1]), FORMS[int(got[2])]) == (double(t), double(approx), forms[0]), n


@pytest.mark.parametrize("setting", sorted(SETTINGS))
@pytest.mark.parametrize("name", sorted(REGISTRY))
def test_a_block_of_token_counts_encodes_and_runs_the_dense_layers_as_each_count_alone(name, setting):
    """chunks_encode_block and dense_layer_block (a colocated step's tables): _chunks_encode_s and _dense_layer_s of
    each count, bit for bit."""
    cost = replica(make_method(name), SETTINGS[setting])
    for lo in (0, 3 * ONE_PROMPT_BLOCK):
        encode, dense = (
            cost.chunks_encode_block(lo, lo + ONE_PROMPT_BLOCK),
            cost.dense_layer_block(lo, lo + ONE_PROMPT_BLOCK),
        )
        scalar = dataclasses.replace(cost)
        for t in range(lo, lo + ONE_PROMPT_BLOCK, 7):
            assert double(encode[t - lo]) == double(scalar._chunks_encode_s(t)), t
            assert double(dense[t - lo]) == double(scalar._dense_layer_s(t)), t


def test_a_prefill_replica_reads_a_priced_length_from_the_cost_models_table():
    """simulator/step_price.PrefillPrices: the cost model's one-prompt price per length; a length priced before is
    read from the cost model's table without asking it again (its prefill then raises), the same doubles and form;
    lengths past the table are the cost model's answer."""
    cost = replica(HACK(), SETTINGS["engine"])
    prices = PrefillPrices(cost)
    scalar = dataclasses.replace(cost)
    asked = lengths(3)[:60] + [ONE_PROMPT_TABLE_TOKENS + 5]
    for n in asked:
        assert bits(prices.one_prompt(n)) == bits(scalar._prefill((n,), None)), n

    def no_more(*_args):
        raise AssertionError("priced again")

    object.__setattr__(cost, "prefill", no_more)
    for n in asked[:-1]:
        assert bits(prices.one_prompt(n)) == bits(scalar._prefill((n,), None)), n
