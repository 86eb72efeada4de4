"""Expected values worked out by hand from catalog facts and the documented formulas, never by asking the
cost-model objects under test: bytes per element of every method, an all-reduce at TP 2, a link sharing its
capacity between a capped and an uncapped flow, and every breakdown part of single requests.

The arithmetic is written out in the comments; where a product of many terms is tedious the test writes the
formula once here (its own copy, from the docstrings of costmodel/phases.py and costmodel/collectives.py) on
a synthetic calibration profile of round numbers, so the expected value depends on nothing the simulator
computes.
"""

from __future__ import annotations

import json
import math

import pytest
import simpy
from scipy.stats import norm

from costmodel.methods import REGISTRY, make_method
from helpers import scenario
from simulator.columns import RowLog
from simulator.link import Link
from simulator.run import run_scenario

# ---- Llama-3.1-8B (catalog/data/models.yaml) -----------------------------------------------------------
L, H, HEADS, KV_HEADS, D, I, VOCAB = 32, 4096, 32, 8, 128, 14336, 128256
KV_ELEMENTS_PER_TOKEN = 2 * KV_HEADS * D * L  # K and V, every layer: 2 * 8 * 128 * 32 = 65,536
FP16_TOKEN_BYTES = 2 * KV_ELEMENTS_PER_TOKEN  # 131,072 B (the catalog's note: "FP16 KV 131072 B/token")


# ---- bytes per element, every method in the registry ----------------------------------------------------
def _cachegen_gaussian_bits(bits: int, partition: int) -> float:
    """Entropy of b-bit min/max codes of a Gaussian partition, derived here for b = 2: the range is +-m with
    m = Phi^-1((n - 0.375) / (n + 0.25)) (Blom), 4 levels at -m, -m/3, m/3, m, so the rounding edges are
    -2m/3, 0, 2m/3 and the two outer codes each take Phi(-2m/3), the two inner ones 1/2 - Phi(-2m/3)."""
    assert bits == 2
    m = norm.ppf((partition - 0.375) / (partition + 0.25))
    outer = norm.cdf(-2 * m / 3)
    inner = 0.5 - outer
    return -2 * (outer * math.log2(outer) + inner * math.log2(inner))


# (method, parameters) -> (wire bytes per element, decode-memory bytes per element)
BYTES_PER_ELEMENT = {
    ("baseline", ()): (2.0, 2.0),  # FP16
    ("fp8", ()): (1.0, 1.0),  # e4m3, one per-tensor scale
    ("fp4", ()): (0.5 + 1 / 16, 0.5 + 1 / 16),  # 4 bits + an FP8 scale per 16: 0.5625
    # 2-bit codes 0.25 + 1 % outliers x (FP16 value + int32 index = 6 B) + FP16 scale and zero per 128
    # elements (4 / 128): 0.25 + 0.06 + 0.03125 = 0.34125
    ("kvquant", ()): (0.34125, 0.34125),
    ("kvquant", (("bits", 4), ("outlier_fraction", 0.0))): (0.5 + 4 / 128, 0.5 + 4 / 128),  # 0.53125
    # entropy-coded 2-bit codes + FP16 min and scale per 64 (4 / 64 = 0.0625); FP16 in memory (decoded once)
    ("cachegen", (("entropy_ratio", 0.5),)): (0.25 * 0.5 + 0.0625, 2.0),
    ("cachegen", (("entropy_ratio", 0.5), ("decode_mode", "dequantize_per_iteration"))): (0.1875, 0.25 + 0.0625),
    ("cachegen", (("bits", 4), ("partition", 128), ("entropy_ratio", 1.0))): (0.5 + 4 / 128, 2.0),
    # HACK, Pi = 64: 2-bit codes + (FP16 min + FP16 scale + a uint8 code sum: 2 + log2 64 = 8 bits) per 64:
    # 0.25 + 5 / 64 = 0.328125
    ("hack", ()): (0.328125, 0.328125),
    # Pi = 128: the sum needs 2 + 7 = 9 bits, stored as int16: 0.25 + (4 + 2) / 128 = 0.296875
    ("hack", (("partition", 128),)): (0.296875, 0.296875),
    # 4-bit codes, Pi = 16: 4 + 4 = 8 bits fit a uint8: 0.5 + 5 / 16 = 0.8125; Pi = 32: 9 bits, int16: 0.6875
    ("hack", (("bits", 4), ("partition", 16))): (0.8125, 0.8125),
    ("hack", (("bits", 4), ("partition", 32))): (0.6875, 0.6875),
    ("hack_no_se", ()): (0.25 + 4 / 64, 0.25 + 4 / 64),  # no stored sums: 0.3125
    ("hack_no_rqe", ()): (0.328125, 0.328125),  # the format of HACK (no FP16 tail reserve)
    # HCAttention: keys 4-bit + FP16 min and scale per 64 (0.5625 B); values FP16 on the wire (2 B), a
    # quarter of them on the GPU; per element the mean of K and V:
    # wire (0.5625 + 2) / 2 = 1.28125, memory (0.5625 + 0.25 * 2) / 2 = 0.53125
    ("hcattention", ()): (1.28125, 0.53125),
    ("hcattention", (("key_bits", 2), ("partition", 32), ("gpu_kv_budget", 1.0))): (
        (0.25 + 4 / 32 + 2) / 2,
        (0.25 + 4 / 32 + 2) / 2,
    ),
    # PQCache moves and keeps FP16 K and V (its per-token codes and centroids: below)
    ("pqcache", ()): (2.0, 2.0),
}


def test_every_registered_method_has_hand_worked_bytes():
    assert {name for name, _ in BYTES_PER_ELEMENT} == set(REGISTRY)


@pytest.mark.parametrize("key", sorted(BYTES_PER_ELEMENT, key=repr), ids=lambda k: f"{k[0]}{dict(k[1]) or ''}")
def test_bytes_per_element(key):
    name, params = key
    wire, memory = BYTES_PER_ELEMENT[key]
    m = make_method(name, **dict(params))
    assert m.wire_bytes_per_element() == pytest.approx(wire, rel=1e-15)
    assert m.memory_bytes_per_element() == pytest.approx(memory, rel=1e-15)


def _model():
    from catalog import load
    from costmodel.specs import ModelSpec

    e = load("models")["llama-3.1-8b"]
    fields = {k: e[k] for k in ModelSpec.__dataclass_fields__ if k in e and k != "key"}
    return ModelSpec(key="llama-3.1-8b", **fields)


def test_registry_labels_colours_and_order():
    from costmodel.methods import colour, display_label, display_rank

    assert display_label("hack") == "HACK" and display_label("baseline") == "Baseline (FP16)"
    assert colour("hack") == "#dc2626" and colour("baseline") == "#6b7280"
    assert display_label("nope") is None and colour("nope") is None
    # the registry's order; a name it does not know comes after every method
    assert [display_rank(n) for n in REGISTRY] == list(range(len(REGISTRY)))
    assert display_rank("nope") == len(REGISTRY) == 10


def test_cachegen_default_wire_bytes_follow_the_gaussian_code_entropy():
    # m = Phi^-1(63.625 / 64.25) = 2.33669; outer codes Phi(-1.55779) = 0.059641 each, inner 0.440359 each;
    # H = -2 (0.059641 log2 0.059641 + 0.440359 log2 0.440359) = 1.52729 bits of 2: ratio 0.763647
    bits = _cachegen_gaussian_bits(2, 64)
    assert bits == pytest.approx(1.52729, abs=1e-5)
    assert make_method("cachegen").wire_bytes_per_element() == pytest.approx(0.25 * bits / 2 + 0.0625, rel=1e-12)


def test_bytes_per_token_and_per_request_on_llama_8b():
    model = _model()
    assert model.kv_elements_per_token_per_layer * model.layers == KV_ELEMENTS_PER_TOKEN
    # per token: the per-element figures times 65,536 elements
    assert make_method("baseline").wire_bytes_per_token(model) == 131072
    assert make_method("hack").wire_bytes_per_token(model) == 0.328125 * 65536 == 21504
    assert make_method("kvquant").memory_bytes_per_token(model) == pytest.approx(0.34125 * 65536)  # 22,364.16
    # HACK's RQE tail: up to Pi = 64 V tokens per layer in FP16 instead of codes:
    # 64 x 1024 (kv_dim) x 32 layers x (2 - 0.328125) = 2,097,152 x 1.671875 = 3,506,176 B
    assert make_method("hack").memory_reserve_bytes_per_request(model) == 3506176
    assert make_method("hack_no_rqe").memory_reserve_bytes_per_request(model) == 0
    # PQCache: FP16 K and V on the wire plus the codes, 32 layers x 8 KV heads x 2 sub-spaces x 8 bits = 512 B
    # per token; once per request the centroids, 32 x 8 x 2^8 x 128 dims x 2 B = 16,777,216 B.  Decode GPU
    # memory keeps the codes per token and a reserve of (256 local + 2048 cached) FP16 tokens + centroids:
    # 2304 x 131,072 + 16,777,216 = 318,767,104 B; host memory the FP16 KV
    pq = make_method("pqcache")
    assert pq.wire_bytes_per_token(model) == 131072 + 512
    assert pq.wire_fixed_bytes(model) == 16777216
    assert pq.memory_bytes_per_token(model) == 512
    assert pq.memory_reserve_bytes_per_request(model) == 318767104
    assert pq.host_bytes_per_token(model) == 131072
    # HCAttention: the FP16 values, half the KV, in host memory: 65,536 B per token
    assert make_method("hcattention").host_bytes_per_token(model) == 65536


def test_the_open_v_block_crosses_the_wire_in_fp16():
    # HACK with RQE quantizes V per channel in blocks of Pi = 64 tokens and keeps the open block in FP16
    # (hack_method.md): a 259-token prompt sends 259 tokens of codes for K, 256 for V, and 3 V tokens in FP16:
    # 259 x 21,504 + 3 x 1024 (kv_dim) x 32 layers x (2 - 0.328125) = 5,569,536 + 164,352 = 5,733,888 B,
    # what realrun's HACK wire buffer holds (realrun/kvformats.py; its meta.json: 22,138.6 B per token at 259
    # tokens = 5,733,897 B with its 16-byte alignment)
    model = _model()
    hack = make_method("hack")
    assert hack.wire_bytes(model, 259) == 5733888
    assert hack.wire_bytes(model, 256) == 256 * 21504  # no open block
    assert hack.wire_bytes(model, 319) == 319 * 21504 + 63 * 32768 * 1.671875
    assert make_method("hack_no_rqe").wire_bytes(model, 259) == 259 * 21504  # the open block is quantized
    # realrun's KVQuant-style format: 0.3125 B per element (20,480 B per token), V in 64-token blocks:
    # 259 x 20,480 + 3 x 32,768 x (2 - 0.3125) = 5,304,320 + 165,888 = 5,470,208 B (realrun: 5,470,210 B);
    # decode memory reserves a whole FP16 block: 64 x 32,768 x 1.6875 = 3,538,944 B
    kvq = make_method("kvquant", outlier_fraction=0.0052083, v_block_tokens=64)
    assert kvq.wire_bytes(model, 259) == pytest.approx(5470208, rel=1e-6)
    assert kvq.memory_reserve_bytes_per_request(model) == pytest.approx(3538944, rel=1e-6)
    # KVQuant as published quantizes V per token: nothing stays in FP16
    assert make_method("kvquant").wire_bytes(model, 259) == pytest.approx(259 * 0.34125 * 65536)
    assert make_method("kvquant").memory_reserve_bytes_per_request(model) == 0


# ---- decode-layer costs of the methods that price their own (FP4, PQCache, HCAttention) ----------------
def _env(kernels: dict, has_fp4: bool = False):
    """One decode layer of Llama-3.1-8B on one GPU: 8 KV heads x 128 x (K, V) = 2048 KV elements per context
    token, 32 query heads; round rates: 1e12 B/s memory, 1e13 ALU ops/s, 24e9 B/s PCIe."""
    from costmodel.calibration import CalibrationProfile, KernelFit
    from costmodel.methods import DecodeEnv

    prof = CalibrationProfile(
        gpu="x",
        source="measured",
        memory_gbps=1000.0,
        matmul_fp16_tflops=100.0,
        matmul_int8_tops=None,
        matmul_fp8_tflops=None,
        launch_overhead_s=5e-6,
        kernels={k: KernelFit(o, s) for k, (o, s) in kernels.items()},
    )
    return DecodeEnv(
        profile=prof,
        model=_model(),
        kv_units_per_token=2048,
        q_heads_per_gpu=32.0,
        alu_instr_per_s=1e13,
        pcie_bytes_per_s=24e9,
        memory_bytes_per_s=1e12,
        has_fp4=has_fp4,
    )


def _close(a: dict, b: dict):
    assert set(a) == set(b) and all(a[k] == pytest.approx(b[k], rel=1e-12, abs=0) for k in b), (a, b)


def test_fp4_decode_layer_by_hand():
    # reading 0.5625 B at 1e12 B/s: 5.625e-13 s per element; converting in hardware, 2 instructions at 1e13:
    # 2e-13; native FP4 takes the larger, 5.625e-13 x 2048 = 1.152e-9 s per context token
    per_req, per_ctx = make_method("fp4").decode_layer_terms(_env({}, has_fp4=True))
    assert per_req == {} and per_ctx == {"decode": pytest.approx(1.152e-9, rel=1e-12, abs=0)}
    # emulated: software dequantization at 2.95e-13 x 33.5e12 = 9.8825 instructions per element at 1e13:
    # 9.8825e-13 s, the excess over the native 5.625e-13 is dequantization: 4.2575e-13 x 2048 = 8.71936e-10
    per_req, per_ctx = make_method("fp4").decode_layer_terms(_env({}))
    _close(per_ctx, {"decode": 1.152e-9, "dequantize": (9.8825e-13 - 5.625e-13) * 2048})
    assert per_ctx["dequantize"] == pytest.approx(8.71936e-10, rel=1e-12)


def test_hack_and_kvquant_decode_layers_by_hand():
    kernels = {
        "decode_attn.fp16": (1e-5, 1e-12),
        "decode_attn.hack": (1.2e-5, 4e-13),
        "decode_attn.hack_no_se": (1.2e-5, 6e-13),
        "decode_attn.dequant_unfused": (2e-5, 2.5e-12),
    }
    # HACK (GQA 4 here, no group-4 fit: the group-8 one): 4e-13 x 2048 = 8.192e-10 s per context token, of which
    # the correction is 32 heads x 10 ops / 1e13 = 3.2e-11; per request 32 x 10 x 128 ops / 1e13 = 4.096e-9
    per_req, per_ctx = make_method("hack").decode_layer_terms(_env(kernels))
    _close(per_req, {"approximation": 4.096e-9})
    _close(per_ctx, {"decode": 8.192e-10 - 3.2e-11, "dequantize": 0.0, "approximation": 3.2e-11})
    # without SE the sums are recomputed: 10 + 2 x 128 = 266 ops per token and head: 32 x 266 / 1e13 = 8.512e-10
    # of the kernel's 6e-13 x 2048 = 1.2288e-9
    _, per_ctx = make_method("hack_no_se").decode_layer_terms(_env(kernels))
    _close(per_ctx, {"decode": 1.2288e-9 - 8.512e-10, "dequantize": 0.0, "approximation": 8.512e-10})
    # on a slow ALU (1e12) the correction, 8.512e-9, would exceed the kernel's time: it is capped at it
    env = _env(kernels)
    _, per_ctx = make_method("hack_no_se").decode_layer_terms(type(env)(**{**env.__dict__, "alu_instr_per_s": 1e12}))
    _close(per_ctx, {"decode": 0.0, "dequantize": 0.0, "approximation": 1.2288e-9})
    # KVQuant, unfused: 2.5e-12 x 2048 = 5.12e-9, of which the FP16 attention's 2.048e-9 is decode, the rest
    # (3.072e-9) dequantization
    per_req, per_ctx = make_method("kvquant").decode_layer_terms(_env(kernels))
    _close(per_req, {"approximation": 0.0})
    _close(per_ctx, {"decode": 2.048e-9, "dequantize": 3.072e-9, "approximation": 0.0})


def test_pqcache_decode_layer_by_hand():
    env = _env({"decode_attn.fp16": (1e-5, 1e-12)})
    per_req, per_ctx = make_method("pqcache").decode_layer_terms(env)
    # per request: FP16 attention over the 256 local tokens, 1e-12 x 2048 x 256 = 5.24288e-7 s
    # per context token: attention over the top 20 %, 1e-12 x 2048 x 0.2 = 4.096e-10, plus fetching the half
    # of those that miss the GPU cache: 0.2 x 0.5 x 2048 x 2 B / 24e9 B/s = 1.706667e-8 s;
    # scoring (no measured fit): per KV head max((2 x 8 bits / 8 + 4 B x group 4) / 1e12, 2 x 4 x 2 / 1e13)
    # = 1.8e-11, 8 KV heads: 1.44e-10; top-k per query head (4 + 12 x 0.2) / 1e12 = 6.4e-12, 32 heads: 2.048e-10
    fetch = 0.2 * 0.5 * 2048 * 2 / 24e9
    _close(per_req, {"decode": 5.24288e-7})
    _close(per_ctx, {"decode": 4.096e-10 + fetch, "approximation": 1.44e-10 + 2.048e-10, "fetch": fetch})
    # measured scoring and top-k fits replace the estimates: 8 x 3e-11 + 32 x 2e-11 = 8.8e-10
    env = _env({"decode_attn.fp16": (1e-5, 1e-12), "score.pq": (0.0, 3e-11), "select.topk": (0.0, 2e-11)})
    _, per_ctx = make_method("pqcache", top_k_fraction=0.5, cache_hit_rate=0.0, local_tokens=0).decode_layer_terms(env)
    fetch = 0.5 * 2048 * 2 / 24e9
    _close(per_ctx, {"decode": 1e-12 * 2048 * 0.5 + fetch, "approximation": 8.8e-10, "fetch": fetch})
    # ALU-bound scoring: 64 sub-spaces of 4 bits at 1e11 ops/s: max((32 + 16) / 1e12, 2 x 4 x 64 / 1e11) = 5.12e-9
    # per KV head, 8 heads: 4.096e-8; top-k (4 + 2.4) / 1e12 x 32 = 2.048e-10
    env = _env({"decode_attn.fp16": (1e-5, 1e-12)})
    env = type(env)(**{**env.__dict__, "alu_instr_per_s": 1e11})
    _, per_ctx = make_method("pqcache", subspaces=64, bits=4).decode_layer_terms(env)
    assert per_ctx["approximation"] == pytest.approx(4.096e-8 + 2.048e-10, rel=1e-12, abs=0)
    # K-Means: every key against 2^8 centroids, 2 FLOPs per multiply-add: 2 x 32 x 8 x 256 x 128 = 16,777,216
    assert make_method("pqcache").kmeans_flops_per_token_iteration(_model()) == 16777216


def test_hcattention_decode_layer_by_hand():
    env = _env({"decode_attn.fp16": (1e-5, 1e-12)})
    per_req, per_ctx = make_method("hcattention").decode_layer_terms(env)
    # group 2 x 32 x 128 / 2048 = 4 query heads per KV head.  Scoring every key element (1024 per token):
    # its 0.5625 B + 4 B x 4 heads / 128 = 0.6875 B at 1e12, against 3.5 ALU ops at 1e13: 6.875e-13 x 1024
    # = 7.04e-10.  Values: FP16 attention over 10 % of the 1024 V elements, 1.024e-10, plus the 20 % of those
    # not on the GPU over PCIe: 0.1 x 0.2 x 1024 x 2 B / 24e9 = 1.706667e-9
    fetch = 0.1 * 0.2 * 1024 * 2 / 24e9
    assert per_req == {}
    _close(per_ctx, {"decode": 1.024e-10 + fetch, "approximation": 7.04e-10, "fetch": fetch})
    # ALU-bound scoring (2-bit keys, 1e11 ops/s): 3.5 / 1e11 = 3.5e-11 per element; a measured fit replaces it
    env = _env({"decode_attn.fp16": (1e-5, 1e-12)})
    env = type(env)(**{**env.__dict__, "alu_instr_per_s": 1e11})
    _, per_ctx = make_method("hcattention", key_bits=2, fetch_fraction=1.0, value_hit_rate=1.0).decode_layer_terms(env)
    _close(per_ctx, {"decode": 1e-12 * 1024, "approximation": 3.5e-11 * 1024, "fetch": 0.0})
    env = _env({"decode_attn.fp16": (1e-5, 1e-12), "score.quantized_keys": (0.0, 2e-12)})
    _, per_ctx = make_method("hcattention").decode_layer_terms(env)
    assert per_ctx["approximation"] == pytest.approx(2e-12 * 1024, rel=1e-12, abs=0)


# ---- an all-reduce at TP 2 (catalog/data/interconnects.yaml, nvswitch) -------------------------------
def test_allreduce_at_tp2_by_hand():
    import catalog
    from costmodel import collectives as co

    nvs = co.from_catalog(catalog.load("interconnects")["nvswitch"])
    link = 300.0  # p4de.24xlarge: 300 GB/s per GPU per direction (catalog/data/instances.yaml)
    # one token of Llama-3.1-8B's activations: 4096 x 2 B = 8192 B; two GPUs take vLLM's one-shot kernel up to
    # 8 MiB: 4.86 us + (2 - 1) x 8192 / (0.713 x 300e9) = 4.86e-6 + 3.8298e-8 = 4.89830e-6 s
    assert co.allreduce_algorithm(8192, 2, nvs) == "one_shot"
    assert co.allreduce_s(8192.0, 2, nvs, link) == pytest.approx(4.86e-6 + 8192 / (0.713 * 300e9), rel=1e-12)
    assert co.allreduce_s(8192.0, 2, nvs, link) == pytest.approx(4.89830e-6, rel=1e-5)
    # a 4096-token prefill batch: 4096 x 8192 = 32 MiB > 8 MiB, NCCL's ring: 5.56 us + 2(2 - 1) x 1.98 us +
    # 2(2 - 1)/2 x 33,554,432 / (0.822 x 300e9) = 9.52e-6 + 1.360684e-4 = 1.455884e-4 s
    n = 4096 * 8192
    assert co.allreduce_algorithm(n, 2, nvs) == "ring"
    assert co.allreduce_s(float(n), 2, nvs, link) == pytest.approx(
        5.56e-6 + 2 * 1.98e-6 + n / (0.822 * 300e9), rel=1e-12
    )
    assert co.allreduce_s(float(n), 2, nvs, link) == pytest.approx(1.455884e-4, rel=1e-6)
    # at eight GPUs a 1 MiB message takes the two-shot kernel: 11.45 us + 2 x 7/8 x 1 MiB / (0.624 x 300e9)
    assert co.allreduce_s(float(2**20), 8, nvs, link) == pytest.approx(
        11.45e-6 + 2 * 7 / 8 * 2**20 / (0.624 * 300e9), rel=1e-12, abs=0
    )
    # the edges: one-shot below 256 KiB at eight GPUs, two-shot from it; custom kernels up to 8 MiB inclusive
    kib = 1024
    below, at, top = 256 * kib - 1, 256 * kib, 8 * 1024 * kib
    assert co.allreduce_s(float(below), 8, nvs, link) == pytest.approx(
        4.86e-6 + 7 * below / (0.713 * 300e9), rel=1e-12, abs=0
    )
    assert co.allreduce_s(float(at), 8, nvs, link) == pytest.approx(
        11.45e-6 + 1.75 * at / (0.624 * 300e9), rel=1e-12, abs=0
    )
    assert co.allreduce_s(float(top), 8, nvs, link) == pytest.approx(
        11.45e-6 + 1.75 * top / (0.624 * 300e9), rel=1e-12, abs=0
    )
    assert type(co.allreduce_s(8192.0, 2, nvs, link)) is float
    # one GPU: nothing to reduce
    assert co.allreduce_algorithm(8192, 1, nvs) == "none" and co.allreduce_s(8192.0, 1, nvs, link) == 0.0
    # send/recv over 100 Gbps Ethernet (12.5 GB/s): 42 us + n / (0.8 x 12.5e9); all-to-all at TP 4:
    # 7.54 us + 3/4 x n / (0.822 x 300e9)
    eth = co.from_catalog(catalog.load("interconnects")["ethernet"])
    assert co.sendrecv_s(1e6, eth, 12.5) == pytest.approx(42e-6 + 1e6 / (0.8 * 12.5e9), rel=1e-12, abs=0)
    assert co.alltoall_s(1e6, 4, nvs, link) == pytest.approx(7.54e-6 + 0.75 * 1e6 / (0.822 * 300e9), rel=1e-12, abs=0)
    assert co.alltoall_s(1e6, 1, nvs, link) == 0.0


def test_collectives_report_for_the_outputs():
    """profiles.json's collectives entry: per token count the all-reduce's bytes, algorithm and time, the
    pipeline hop, and under expert parallelism the dispatch all-to-all, worked by hand."""
    import catalog
    from costmodel import collectives as co
    from costmodel.specs import Parallelism

    ics = catalog.load("interconnects")
    nvs, eth = co.from_catalog(ics["nvswitch"]), co.from_catalog(ics["ethernet"])
    par = Parallelism(
        tensor=2,
        pipeline=2,
        intra_node_gb_per_s=300.0,
        inter_stage_gbps=100.0,
        interconnect=nvs,
        network=eth,
        expert_parallel=True,
    )
    r = co.report(par, hidden_size=4096, tokens=[1, 4096], active_experts=8)
    assert r["interconnect"] == "nvswitch" and r["tensor_parallel"] == 2 and r["link_gb_per_s"] == 300.0
    one, big = r["allreduce"]
    # one token: 4096 x 2 B = 8192 B, one-shot; 4096 tokens: 32 MiB, the ring (test_allreduce_at_tp2_by_hand)
    assert one == {
        "tokens": 1,
        "bytes": 8192,
        "algorithm": "one_shot",
        "time_s": pytest.approx(4.86e-6 + 8192 / (0.713 * 300e9), rel=1e-12, abs=0),
    }
    assert big == {
        "tokens": 4096,
        "bytes": 33554432,
        "algorithm": "ring",
        "time_s": pytest.approx(9.52e-6 + 33554432 / (0.822 * 300e9), rel=1e-12, abs=0),
    }
    # the hop between stages: the same activations over 100 Gbps = 12.5 GB/s at 0.8: 42 us + n / 1e10
    assert r["pipeline_sendrecv"] == [
        {
            "tokens": t,
            "bytes": t * 8192,
            "network_gbps": 100.0,
            "time_s": pytest.approx(42e-6 + t * 8192 / 1e10, rel=1e-12, abs=0),
        }
        for t in (1, 4096)
    ]
    # dispatch: each rank's t/2 tokens, 8 copies each of 8192 B: t x 32,768 B, half of it to the peer
    assert r["alltoall"] == [
        {
            "tokens": t,
            "bytes": t * 32768,
            "time_s": pytest.approx(7.54e-6 + 0.5 * t * 32768 / (0.822 * 300e9), rel=1e-12, abs=0),
        }
        for t in (1, 4096)
    ]
    # no pipeline, no expert parallelism: neither entry; expert parallelism on one GPU, or for a dense model (no
    # active experts), sends nothing either
    base = {"interconnect", "peer_access", "path", "tensor_parallel", "link_gb_per_s", "allreduce"}
    flat = co.report(Parallelism(tensor=2, intra_node_gb_per_s=300.0, interconnect=nvs, network=eth), 4096, [1])
    assert set(flat) == base
    ep = dict(intra_node_gb_per_s=300.0, interconnect=nvs, network=eth, expert_parallel=True)
    assert set(co.report(Parallelism(tensor=2, **ep), 4096, [1])) == base
    assert set(co.report(Parallelism(tensor=1, **ep), 4096, [1], active_experts=8)) == base


# ---- a capped two-flow link -----------------------------------------------------------------------------
def _finishes(capacity: float, flows: list[tuple[float, float, float]], latency_s: float = 0.0):
    """Run flows (start_s, bytes, cap_bytes_per_s) on one Link; their arrival times and the link's log."""
    env, log, done = simpy.Environment(), RowLog(3), {}
    link = Link(env, "l", capacity, latency_s, log)

    def starter(rid, start, size, cap):
        yield env.timeout(start)
        link.start(rid, size, cap, lambda r, t: done.__setitem__(r, t))

    for rid, (start, size, cap) in enumerate(flows):
        env.process(starter(rid, start, size, cap))
    env.run()
    return done, list(log)


def test_capped_flow_leaves_its_unused_share_to_the_uncapped_one():
    # 1000 B/s shared by flow 0 capped at 200 B/s and flow 1 uncapped, 1000 B each, both from t = 0.
    # Water-filling: flow 0 keeps its cap (200 < the fair 500), flow 1 takes the other 800 B/s:
    # flow 1 done at 1000 / 800 = 1.25 s; flow 0 has 1000 - 250 = 750 B left at its cap: 1.25 + 3.75 = 5.0 s.
    # (Dropping the leftover would give flow 1 only 500 B/s: done at 2.0 s.)  Latency 0.5 s on top.
    done, log = _finishes(1000.0, [(0.0, 1000.0, 200.0), (0.0, 1000.0, math.inf)], latency_s=0.5)
    assert done[1] == pytest.approx(1.25 + 0.5, rel=1e-12)
    assert done[0] == pytest.approx(5.0 + 0.5, rel=1e-12)
    # the link runs full while both flow, then at the cap: (time, flows, throughput)
    assert log[-3][1:] == (2, pytest.approx(1000.0)) and log[-2] == (pytest.approx(1.25), 1, pytest.approx(200.0))


def test_three_flows_with_two_caps():
    # 900 B/s; caps 100 and 500 B/s and one uncapped, 900 B each.  Fair share 300: flow 0 keeps 100, then
    # (900 - 100) / 2 = 400 < 500, so flows 1 and 2 take 400 each.  Flows 1, 2 done at 900 / 400 = 2.25 s
    # (flow 0 sent 225); flow 0 alone at its cap: 675 / 100 = 6.75 s more -> 9.0 s.
    done, _ = _finishes(900.0, [(0.0, 900.0, 100.0), (0.0, 900.0, 500.0), (0.0, 900.0, math.inf)])
    assert done[1] == pytest.approx(2.25) and done[2] == pytest.approx(2.25) and done[0] == pytest.approx(9.0)
    # a late uncapped flow next to a capped one: 1000 B/s, flow 0 capped at 600 from 0 (alone: 600 B/s),
    # flow 1 uncapped from 1 s with 800 B: fair 500 < 600, both 500 B/s; flow 0 had 600 of 2400 B at 1 s, so
    # 1800 B left; flow 1 done at 1 + 800/500 = 2.6 s (flow 0: 1000 left), flow 0 at its cap: 2.6 + 1000/600
    done, _ = _finishes(1000.0, [(0.0, 2400.0, 600.0), (1.0, 800.0, math.inf)])
    assert done[1] == pytest.approx(2.6) and done[0] == pytest.approx(2.6 + 1000 / 600)


# ---- each breakdown part of single requests, on a profile of round numbers -------------------------------
MEM_B_PER_S, MATMUL_FLOP_PER_S, LAUNCH_S = 1000e9, 100e12, 5e-6
KERNELS = {  # time = overhead_s + s_per_unit * units (units: costmodel/calibration.py)
    "prefill_attn.fp16": (1e-5, 1e-14),  # per causal-attention FLOP: 100 TFLOP/s
    "prefill_attn.hack": (2e-5, 2e-14),  # slower, so `auto` runs FP16
    "quantize.kv": (4e-6, 2e-12),  # per element quantized
    "dequantize.kv": (4e-6, 3e-12),
    "decode_attn.fp16": (1e-5, 1e-12),  # per KV element visited
    "decode_attn.fp8": (1e-5, 5e-13),
    "decode_attn.hack": (1.2e-5, 4e-13),
    "decode_attn.hack_no_se": (1.2e-5, 6e-13),
    "decode_attn.hack_no_rqe": (1.2e-5, 4.5e-13),
    "decode_attn.dequant_unfused": (2e-5, 2.5e-12),
    "decode_attn.dequant_fused": (1.5e-5, 1.2e-12),
}
A100_ALU_OPS_PER_S = 19.5e12 / 2  # a100_80gb fp32_tflops 19.5, an FMA counted as two operations


@pytest.fixture(scope="module")
def profile_path(tmp_path_factory):
    path = tmp_path_factory.mktemp("profile") / "profile.json"
    path.write_text(
        json.dumps(
            {
                "schema_version": 1,
                "gpu": "a100_80gb",
                "source": "measured",
                "memory_gbps": MEM_B_PER_S / 1e9,
                "matmul_fp16_tflops": MATMUL_FLOP_PER_S / 1e12,
                "matmul_int8_tops": 200.0,
                "matmul_fp8_tflops": None,
                "launch_overhead_s": LAUNCH_S,
                "kernels": {k: {"overhead_s": o, "s_per_unit": s} for k, (o, s) in KERNELS.items()},
            }
        )
    )
    return str(path)


def kernel_s(key: str, units: float) -> float:
    overhead, per_unit = KERNELS[key]
    return overhead + per_unit * units


def gemm_s(m: float, n: float, k: float) -> float:
    """One FP16 GEMM: a launch + max(2mnk FLOPs at the matmul rate, 2(nk + mk + mn) bytes at the memory rate)."""
    return LAUNCH_S + max(2 * m * n * k / MATMUL_FLOP_PER_S, 2 * (n * k + m * k + m * n) / MEM_B_PER_S)


def dense_layer_s(tokens: int, tp: int, allreduce_s: float) -> float:
    """QKV, O, gate+up and down GEMMs, nine elementwise kernels and two all-reduces of one layer on one GPU."""
    q, kv = HEADS * D, KV_HEADS * D
    gemms = (
        gemm_s(tokens, (q + 2 * kv) / tp, H)
        + gemm_s(tokens, H, q / tp)
        + gemm_s(tokens, 2 * I / tp, H)
        + gemm_s(tokens, H, I / tp)
    )
    # bytes read + written per token: RMSNorm 2h twice, RoPE 7r (r = (q + kv) / tp), SiLU 2i + gate 3i
    # (i = I / tp), two residual adds 3h, x 2 B; at TP 1: 2 x (16384 + 35840 + 71680 + 24576) = 296,960
    r, i = (q + kv) / tp, I / tp
    elementwise = 9 * LAUNCH_S + tokens * 2 * (2 * 2 * H + 7 * r + 5 * i + 2 * 3 * H) / MEM_B_PER_S
    return gemms + elementwise + 2 * allreduce_s


def _run(tmp_path, profile_path, method, rows, **changes):
    trace = tmp_path / "trace.csv"
    trace.write_text("arrival_s,prompt_tokens,output_tokens\n" + "".join(f"{a},{p},{o}\n" for a, p, o in rows))
    s = scenario(
        methods=[method],
        **{
            "workload.trace_csv": str(trace),
            "workload.arrival": {"kind": "trace"},
            "workload.requests": len(rows),
            "calibration.prefill_profile": profile_path,
            "calibration.decode_profile": profile_path,
            **changes,
        },
    )
    return run_scenario(s).requests.sort_values("arrival_s").reset_index(drop=True)


P, OUT = 4096, 4  # prompt and output tokens
CTX_SUM = 4 * P + (0 + 1 + 2 + 3)  # ttft_at decode: four iterations at contexts 4096 .. 4099
ELEMENTS_PER_LAYER = P * 2 * KV_HEADS * D  # 4096 x 2048 = 8,388,608 K and V elements per layer
PAIRS = P * (P + 1) / 2  # causal (query, key) pairs: 8,390,656
ATTN_FLOPS = 4 * HEADS * D * PAIRS  # 16,384 per pair: 1.3747e11
LM_HEAD_1_S = gemm_s(1, VOCAB, H)  # one row of logits


def _prefill_s(attention_s: float) -> float:
    # 32 layers of the 4096-token dense layer and attention, then the LM head on the prompt's last row
    return L * (dense_layer_s(P, 1, 0.0) + attention_s) + LM_HEAD_1_S


def _check(row, expected: dict, arrival_s: float):
    assert row.arrival_s == arrival_s
    for part, value in expected.items():
        assert getattr(row, f"{part}_s") == pytest.approx(value, rel=1e-9, abs=1e-15), part
    assert row.jct_s == pytest.approx(sum(expected.values()), rel=1e-12)


def test_hack_request_breakdown(tmp_path, profile_path):
    # Two requests of 4096 prompt and 4 output tokens, the second 1 ms after the first: it waits for the
    # prefill replica (busy through the first's quantize step), then nothing else overlaps (transfers
    # take 70 ms, prefill about 1 s).  HACK with the homomorphic prefill kernel.
    df = _run(
        tmp_path, profile_path, {"name": "hack", "prefill_attention": "homomorphic"}, [(0.0, P, OUT), (0.001, P, OUT)]
    )
    hom_s = kernel_s("prefill_attn.hack", ATTN_FLOPS)
    # its correction: 20 ALU ops per pair and query head, capped at the kernel time (it is split out of it)
    approx_pre = L * min(hom_s, HEADS * PAIRS * 20 / A100_ALU_OPS_PER_S)
    quantize = L * kernel_s("quantize.kv", ELEMENTS_PER_LAYER)
    # 4096 tokens x 65,536 elements x 0.328125 B = 88,080,384 B over 10 Gbps at efficiency 1 (1.25e9 B/s)
    transfer = P * 21504 / 1.25e9
    # Decode at batch 1, per layer: the kernel's launch (the append is in the timed kernel), per context
    # token 2048 elements at 4e-13 s of which the correction is 32 heads x 10 ops / ALU rate; per iteration
    # the correction's fixed 32 heads x 10 x 128 ops.
    approx_per_ctx = min(4e-13 * 2048, HEADS * 10 / A100_ALU_OPS_PER_S)
    approx_fixed = HEADS * 10 * D / A100_ALU_OPS_PER_S
    decode_fixed = L * (dense_layer_s(1, 1, 0.0) + KERNELS["decode_attn.hack"][0]) + LM_HEAD_1_S
    decode = OUT * decode_fixed + L * (4e-13 * 2048 - approx_per_ctx) * CTX_SUM
    approx_dec = L * (OUT * approx_fixed + approx_per_ctx * CTX_SUM)
    # the homomorphic kernel reads the codes: the KV is quantized inside the forward, before each layer's attention,
    # and nothing is left to do after it (no pack floor here)
    prefill = _prefill_s(hom_s) + quantize
    expected = {
        "prefill_queue": 0.0,
        "prefill": prefill - approx_pre,
        "quantize": 0.0,
        "transfer_queue": 0.0,
        "transfer": transfer,
        "decode_queue": 0.0,
        "decode": decode,
        "dequantize": 0.0,
        "approximation": approx_pre + approx_dec,
    }
    assert approx_pre > 0 and approx_dec > 0
    _check(df.iloc[0], expected, 0.0)
    second = dict(expected, prefill_queue=prefill - 0.001)
    _check(df.iloc[1], second, 0.001)
    # the auto form picks FP16 on this profile (its kernel is the faster): no prefill correction
    auto = _run(tmp_path, profile_path, "hack", [(0.0, P, OUT)]).iloc[0]
    assert auto.prefill_attention == "fp16"
    _check(
        auto,
        dict(
            expected,
            prefill=_prefill_s(kernel_s("prefill_attn.fp16", ATTN_FLOPS)),
            quantize=quantize,  # the FP16 form quantizes after its forward
            approximation=approx_dec,
        ),
        0.0,
    )


def test_kvquant_request_breakdown(tmp_path, profile_path):
    df = _run(tmp_path, profile_path, "kvquant", [(0.0, P, OUT)])
    # unfused dequantize-then-attend at 2.5e-12 s per element against FP16 attention's 1e-12: the
    # difference, 1.5e-12 x 2048 per context token and layer, is dequantization
    per_ctx, fp16_per_ctx = 2.5e-12 * 2048, 1e-12 * 2048
    decode_fixed = L * (dense_layer_s(1, 1, 0.0) + KERNELS["decode_attn.dequant_unfused"][0]) + LM_HEAD_1_S
    expected = {
        "prefill_queue": 0.0,
        "prefill": _prefill_s(kernel_s("prefill_attn.fp16", ATTN_FLOPS)),
        "quantize": L * kernel_s("quantize.kv", ELEMENTS_PER_LAYER),
        "transfer_queue": 0.0,
        # 4096 x 65,536 x 0.34125 B = 91,602,944 B at 1.25e9 B/s
        "transfer": P * 65536 * 0.34125 / 1.25e9,
        "decode_queue": 0.0,
        "decode": OUT * decode_fixed + L * fp16_per_ctx * CTX_SUM,
        "dequantize": L * (per_ctx - fp16_per_ctx) * CTX_SUM,
        "approximation": 0.0,
    }
    _check(df.iloc[0], expected, 0.0)


def test_baseline_request_breakdown_at_tp2(tmp_path, profile_path):
    # Decode on two of a p4de.24xlarge's A100s (NVSwitch, 300 GB/s): every layer's two all-reduces of one
    # token (8192 B) take the one-shot kernel, 4.86 us + 8192 / (0.713 x 300e9) each; the FP16 token write
    # is one small kernel (a launch) beside the attention kernel; 4 KV heads per GPU: 1024 elements/token.
    df = _run(
        tmp_path,
        profile_path,
        "baseline",
        [(0.0, P, OUT)],
        **{"decode": {"instance": "p4de.24xlarge", "tensor_parallel": 2, "replicas": 1}},
    )
    allreduce = 4.86e-6 + 8192 / (0.713 * 300e9)
    decode_fixed = L * (dense_layer_s(1, 2, allreduce) + KERNELS["decode_attn.fp16"][0] + LAUNCH_S) + gemm_s(
        1, VOCAB / 2, H
    )
    expected = {
        "prefill_queue": 0.0,
        "prefill": _prefill_s(kernel_s("prefill_attn.fp16", ATTN_FLOPS)),
        "quantize": 0.0,
        "transfer_queue": 0.0,
        "transfer": P * 131072 / 1.25e9,
        "decode_queue": 0.0,
        "decode": OUT * decode_fixed + L * 1e-12 * 1024 * CTX_SUM,
        "dequantize": 0.0,
        "approximation": 0.0,
    }
    _check(df.iloc[0], expected, 0.0)
