"""Attention kernels against float64 references, at sizes that do not divide the blocks.

Tolerances are relative to each kernel's own low-precision error: FP16 kernels against exact
attention (a few 1e-4 expected), FP8 against exact attention on the FP8-rounded K/V, HACK against
exact attention on the dequantized cache, bounded by 2x the error of the float64 HACK reference
(which rounds Q and P the way the kernel does) plus 2e-3.
"""

import pytest
import torch
from kernel_test_helpers import DEVICE, randn, rel_err

from kernels_calibration.kernels.attn_decode import attn_decode_ref, fp_attn_decode, sdpa_decode, to_fp8
from kernels_calibration.kernels.attn_prefill import attn_prefill_ref, fa_attn_prefill
from kernels_calibration.kernels.dequant_attn_decode import dequant_attn_decode, dequant_attn_decode_ref
from kernels_calibration.kernels.hack_attn_decode import hack_attn_decode, hack_attn_decode_ref
from kernels_calibration.kernels.hack_attn_prefill import hack_attn_prefill, hack_attn_prefill_ref
from kernels_calibration.kernels.kv_cache import append_token, build_cache, dequantize_cache_ref
from kernels_calibration.kernels.launch import DequantDecodeConfig, FpDecodeConfig, HackDecodeConfig, PrefillConfig

B, HKV, G, D = 2, 2, 4, 128


def _kv(seq, lens):
    k, v = randn(B, HKV, seq, D), randn(B, HKV, seq, D)
    return k, v, torch.tensor(lens, dtype=torch.int32, device=DEVICE)


def test_fp16_decode_matches_exact_and_sdpa():
    torch.manual_seed(1)
    k, v, lens = _kv(150, [150, 150])
    q = randn(B, HKV * G, D)
    out = fp_attn_decode(q, k, v, lens, config=FpDecodeConfig(splits=3, block_n=32))
    assert rel_err(out, attn_decode_ref(q, k, v, lens)) < 2e-3
    if DEVICE == "cuda":
        assert rel_err(out, sdpa_decode(q, k, v)) < 2e-3


def test_fp16_decode_ragged():
    torch.manual_seed(2)
    k, v, lens = _kv(150, [150, 61])
    q = randn(B, HKV * G, D)
    out = fp_attn_decode(q, k, v, lens, config=FpDecodeConfig(splits=2, block_n=32))
    assert rel_err(out, attn_decode_ref(q, k, v, lens)) < 2e-3


def test_fp8_decode():
    torch.manual_seed(3)
    k, v, lens = _kv(130, [130, 77])
    q = randn(B, HKV * G, D)
    k8, ks = to_fp8(k)
    v8, vs = to_fp8(v)
    out = fp_attn_decode(q, k8, v8, lens, ks, vs, config=FpDecodeConfig(splits=2, block_n=32))
    ref = attn_decode_ref(q, k8.float() * ks, v8.float() * vs, lens)
    assert rel_err(out, ref) < 2e-3


@pytest.mark.parametrize("partition,rqe", [(32, True), (64, True), (128, True), (64, False)])
def test_hack_decode(partition, rqe):
    """The head-major kernel (HACK and fused-dequant modes; tiles of 4, 2 and 1 V blocks at PI 32, 64,
    128) and the unfused dequantize-then-attend path, against exact attention over the cache."""
    torch.manual_seed(partition + rqe)
    k, v, lens = _kv(200, [200 - 41, 197])  # ragged, tails of 31 / 5 (PI=32), partial blocks
    q = randn(B, HKV * G, D)
    cache = build_cache(k, v, lens, partition, 2, rqe=rqe, stochastic=True, seed=5)
    kd, vd = dequantize_cache_ref(cache)
    exact = attn_decode_ref(q, kd, vd, lens)
    ref_err = rel_err(hack_attn_decode_ref(q, cache), exact)
    for use_se in (True, False):
        out = hack_attn_decode(q, cache, use_se=use_se, config=HackDecodeConfig(kernel="head_major", splits=3))
        assert rel_err(out, exact) < 2 * ref_err + 2e-3
    # the dequantize baselines are FP16 arithmetic on the same cache
    assert torch.equal(dequant_attn_decode_ref(q, cache), exact)
    for kernel, splits in (("auto", 3), ("triton", 3), ("unfused", 2)):
        got = dequant_attn_decode(q, cache, config=DequantDecodeConfig(kernel=kernel, splits=splits))
        assert rel_err(got, exact) < 2e-3, kernel
    # and the quantized result is close to, but not equal to, FP16 attention
    assert rel_err(out, attn_decode_ref(q, k, v, lens)) > 10 * rel_err(out, exact)


def test_hack_decode_head_major_without_a_padding_row():
    """16 query heads per KV head fill the 16-row dot: without SE the head-major kernel sums the codes
    itself (no padding row of ones to take the sums on the tensor cores); head_dim 256 (two channel
    groups per bit plane) runs on it by default."""
    torch.manual_seed(12)
    k, v, lens = _kv(150, [150 - 23, 97])
    cache = build_cache(k, v, lens, 64, 2, rqe=True, stochastic=True, seed=2)
    kd, vd = dequantize_cache_ref(cache)
    q16 = randn(B, HKV * 16, D)
    exact = attn_decode_ref(q16, kd, vd, lens)
    ref_err = rel_err(hack_attn_decode_ref(q16, cache), exact)
    for use_se in (True, False):
        out = hack_attn_decode(q16, cache, use_se=use_se, config=HackDecodeConfig(kernel="head_major", splits=2))
        assert rel_err(out, exact) < 2 * ref_err + 2e-3, use_se
    k2, v2 = randn(B, HKV, 150, 256), randn(B, HKV, 150, 256)
    c2 = build_cache(k2, v2, lens, 64, 2, rqe=True, stochastic=True, seed=3)
    q2 = randn(B, HKV * G, 256)
    exact2 = attn_decode_ref(q2, *dequantize_cache_ref(c2), lens)
    out2 = hack_attn_decode(q2, c2, config=HackDecodeConfig(splits=2))
    assert rel_err(out2, exact2) < 2 * rel_err(hack_attn_decode_ref(q2, c2), exact2) + 2e-3


@pytest.mark.parametrize("g,partition,rqe", [(8, 64, True), (8, 128, False), (8, 32, True), (4, 64, True)])
def test_hack_decode_row_packed(g, partition, rqe):
    """The row-packed kernel (copies of the head group in the padding rows, one P.V product per
    tile for all its V blocks, Q rounded per query head): against exact attention over the cache
    within the HACK reference's own error, and closer to the per-head-Q reference than that error;
    ragged lengths ending mid-tile and mid-block, SE and no-SE, one and three splits."""
    torch.manual_seed(100 * g + partition + rqe)
    k, v, lens = _kv(300, [300 - 41, 283])
    q = randn(B, HKV * g, D)
    cache = build_cache(k, v, lens, partition, 2, rqe=rqe, stochastic=True, seed=3)
    kd, vd = dequantize_cache_ref(cache)
    exact = attn_decode_ref(q, kd, vd, lens)
    ref_head = hack_attn_decode_ref(q, cache, q_per_head=True)
    ref_err = rel_err(ref_head, exact)
    for use_se in (True, False):
        for splits in (1, 3):
            out = hack_attn_decode(q, cache, use_se=use_se, config=HackDecodeConfig(kernel="row_packed", splits=splits))
            assert rel_err(out, exact) < 2 * ref_err + 2e-3, (use_se, splits)
            assert rel_err(out, ref_head) < ref_err, (use_se, splits)


def test_hack_decode_step_fused_append():
    """hack_decode_step (append + attention in one launch): the cache equals append_token's, bit for
    bit; the output equals append_token + hack_attn_decode except at a step that fills a V block, where
    that block is attended in FP16 (checked against exact attention with that block's FP16 V)."""
    import dataclasses

    from kernels_calibration.kernels.hack_decode_rp import hack_decode_step
    from kernels_calibration.kernels.launch import DecodeConfig

    torch.manual_seed(21)
    k, v, _ = _kv(200, [1, 1])
    lens = torch.tensor([62, 126], dtype=torch.int32, device=DEVICE)  # both fill a block at the second step
    c1 = build_cache(k, v, lens, 64, 2, rqe=True, seed=4)
    c2 = dataclasses.replace(
        c1,
        **{
            f.name: getattr(c1, f.name).clone()
            for f in dataclasses.fields(c1)
            if isinstance(getattr(c1, f.name), torch.Tensor)
        },
    )
    fields = ("k_codes", "k_min", "k_scale", "k_sum", "v_codes", "v_min", "v_scale", "v_sum", "v_tail", "lens")
    for step in range(3):
        q, kn, vn = randn(B, HKV * 8, D), randn(B, HKV, D), randn(B, HKV, D)
        c1 = append_token(c1, kn, vn, seed=7)
        o1 = hack_attn_decode(q, c1, config=HackDecodeConfig(splits=2))
        o2, c2 = hack_decode_step(q, c2, kn, vn, seed=7, config=DecodeConfig(splits=2))
        assert all(torch.equal(getattr(c1, f), getattr(c2, f)) for f in fields), step
        if step != 1:
            assert torch.equal(o1, o2), step
        else:
            kd, vd = dequantize_cache_ref(c2)
            for i in range(B):
                n = int(c2.lens[i])
                vd[i, :, n - 64 : n] = c2.v_tail[i, :, :64].float().cpu()
            exact = attn_decode_ref(q, kd, vd, c2.lens)
            ref_err = rel_err(
                hack_attn_decode_ref(q, c1, q_per_head=True), attn_decode_ref(q, *dequantize_cache_ref(c1), c1.lens)
            )
            assert rel_err(o2, exact) < 2 * ref_err + 2e-3
    with pytest.raises(ValueError, match="RQE"):
        hack_decode_step(q, build_cache(k, v, lens, 64, 2, rqe=False), kn, vn)


def test_launch_config_fields_reach_the_launch():
    """A LaunchConfig field set by the caller wins over the family default; the defaults are the
    measured ones (row-packed: 2 warps and 128 registers above 2K tokens at PI 64, 4 warps below)."""
    from kernels_calibration.kernels.hack_decode_rp import launch_options
    from kernels_calibration.kernels.launch import DecodeConfig

    k, v, lens = _kv(64, [64, 64])
    c64 = build_cache(k, v, lens, 64, 2)
    assert launch_options(c64, 4096, DecodeConfig()) == {"num_warps": 2, "num_stages": 3, "maxnreg": 128}
    assert launch_options(c64, 1024, DecodeConfig()) == {"num_warps": 4, "num_stages": 3}
    assert launch_options(c64, 4096, DecodeConfig(maxnreg=0, num_warps=4)) == {"num_warps": 4, "num_stages": 3}
    c128 = build_cache(k, v, lens, 128, 2)
    assert launch_options(c128, 4096, DecodeConfig())["num_warps"] == 4


def test_decode_step_dispatch(monkeypatch):
    """decode_step fuses the append into the attention launch up to FUSED_STEP_MAX_LEN tokens and runs
    append_token + hack_attn_decode beyond; checked at a step that fills a V block, where the two paths'
    outputs differ (the fused one attends that block in FP16), and at the next step, where they agree."""
    import dataclasses

    from kernels_calibration.kernels import dispatch
    from kernels_calibration.kernels.hack_attn_decode import decode_step
    from kernels_calibration.kernels.hack_decode_rp import hack_decode_step
    from kernels_calibration.kernels.launch import DecodeConfig

    torch.manual_seed(23)
    # the Triton kernels on every device: on Hopper the unfused path above FUSED_STEP_MAX_LEN would take the
    # Gluon kernel, whose outputs agree with the row-packed kernel's but not bit for bit (its dispatch is
    # test_gluon_decode.py's test_hack_decode_step_runs_the_gluon_kernel_above_2k_tokens)
    monkeypatch.setattr(dispatch, "gluon_device", lambda q: False)
    k, v, _ = _kv(200, [1, 1])
    lens = torch.tensor([63, 127], dtype=torch.int32, device=DEVICE)  # the first append fills a block

    built = build_cache(k, v, lens, 64, 2, rqe=True, seed=4)  # quantized once (the interpreter's costliest part)

    def fresh():
        """A copy of the cache every step may append to."""
        return dataclasses.replace(
            built,
            **{
                f.name: getattr(built, f.name).clone()
                for f in dataclasses.fields(built)
                if isinstance(getattr(built, f.name), torch.Tensor)
            },
        )

    two = HackDecodeConfig(splits=2)
    q, kn, vn = randn(B, HKV * 8, D), randn(B, HKV, D), randn(B, HKV, D)
    o_fused, c_fused = hack_decode_step(q, fresh(), kn, vn, seed=7, config=DecodeConfig(splits=2))
    c_sep = append_token(fresh(), kn, vn, seed=7)
    o_sep = hack_attn_decode(q, c_sep, config=two)
    assert not torch.equal(o_fused, o_sep)
    assert dispatch.fused_step(q, fresh(), None, two)  # capacity 200 <= 2048: fused
    o, c = decode_step(q, fresh(), kn, vn, seed=7, config=two)
    assert torch.equal(o, o_fused) and torch.equal(c.lens, c_fused.lens)
    o, c = decode_step(q, fresh(), kn, vn, seed=7, config=HackDecodeConfig(splits=2, fused=False))
    assert torch.equal(o, o_sep) and torch.equal(c.v_codes, c_sep.v_codes)
    monkeypatch.setattr(dispatch, "FUSED_STEP_MAX_LEN", 100)
    assert not dispatch.fused_step(q, fresh(), None, two)
    o, _ = decode_step(q, fresh(), kn, vn, seed=7, config=two)
    assert torch.equal(o, o_sep)
    q2 = randn(B, HKV * 8, D)  # next step: no block fills, both paths give the same output
    o1, _ = decode_step(q2, c_fused, kn, vn, seed=8, config=HackDecodeConfig(splits=2, fused=True))
    o2, _ = decode_step(q2, c_sep, kn, vn, seed=8, config=HackDecodeConfig(splits=2, fused=False))
    assert torch.equal(o1, o2)


def test_dispatch_picks_the_measured_kernel(monkeypatch):
    """dispatch.py, the one place that chooses: on a Hopper GPU (simulated here) the Gluon HACK kernel
    above FUSED_STEP_MAX_LEN tokens at PI 64 and GQA 8 unless a Triton option is set or a kernel is
    pinned, the row-packed kernel where it takes the shape, the head-major one elsewhere; fused dequant
    on the Gluon kernel where it takes the shape and no Triton option is set."""
    from kernels_calibration.kernels import dispatch

    k, v, lens = _kv(64, [64, 64])
    c64, c32 = build_cache(k, v, lens, 64, 2), build_cache(k, v, lens, 32, 2)
    q8, q2 = randn(B, HKV * 8, D), randn(B, HKV * 2, D)
    auto = HackDecodeConfig()
    monkeypatch.setattr(dispatch, "gluon_device", lambda q: True)
    assert dispatch.hack_kernel(q8, c64, 4096, auto) == "gluon"
    assert dispatch.hack_kernel(q8, c64, dispatch.FUSED_STEP_MAX_LEN, auto) == "row_packed"
    assert dispatch.hack_kernel(q8, c64, 4096, HackDecodeConfig(num_warps=4)) == "row_packed"
    assert dispatch.hack_kernel(q8, c32, 4096, auto) == "row_packed"  # the Gluon HACK kernel takes PI 64 only
    assert dispatch.hack_kernel(q2, c64, 4096, auto) == "head_major"  # 2 query heads per KV head
    assert dispatch.hack_kernel(q2, c64, 4096, HackDecodeConfig(kernel="gluon")) == "gluon"  # pinned: its refusal
    assert not dispatch.fused_step(q8, c64, 1024, HackDecodeConfig(kernel="gluon"))
    assert dispatch.dequant_kernel(q8, c64, DequantDecodeConfig()) == "gluon"
    assert dispatch.dequant_kernel(q8, c32, DequantDecodeConfig()) == "triton"
    assert dispatch.dequant_kernel(q8, c64, DequantDecodeConfig(num_warps=2)) == "triton"
    monkeypatch.setattr(dispatch, "gluon_device", lambda q: False)
    assert dispatch.hack_kernel(q8, c64, 4096, auto) == "row_packed"
    assert dispatch.dequant_kernel(q8, c64, DequantDecodeConfig()) == "triton"


def test_hack_decode_after_append_crosses_block():
    torch.manual_seed(9)
    k, v, lens = _kv(128, [62, 30])
    q = randn(B, HKV * G, D)
    cache = build_cache(k, v, lens, 32, 2, rqe=True, stochastic=False)
    for _ in range(3):
        cache = append_token(cache, randn(B, HKV, D), randn(B, HKV, D), stochastic=False)
    kd, vd = dequantize_cache_ref(cache)
    exact = attn_decode_ref(q, kd, vd, cache.lens)
    out = hack_attn_decode(q, cache, config=HackDecodeConfig(kernel="head_major", splits=2))
    assert rel_err(out, exact) < 2 * rel_err(hack_attn_decode_ref(q, cache), exact) + 2e-3
    out = hack_attn_decode(q, cache, config=HackDecodeConfig(splits=2))  # the row-packed kernel (default)
    assert rel_err(out, exact) < 2 * rel_err(hack_attn_decode_ref(q, cache, q_per_head=True), exact) + 2e-3


def test_fa_prefill():
    torch.manual_seed(4)
    q, k, v = randn(1, 4, 100, D), randn(1, 2, 100, D), randn(1, 2, 100, D)
    out = fa_attn_prefill(q, k, v, config=PrefillConfig(block_m=32, block_n=16, num_warps=4))
    assert rel_err(out, attn_prefill_ref(q, k, v)) < 2e-3


@pytest.mark.parametrize("partition", [32, 64])
def test_hack_prefill(partition):
    """The prefill kernel rounds Q per row: against its own reference, within that reference's error of
    exact attention over the cache."""
    torch.manual_seed(partition + 5)
    seq = 100
    q, k, v = randn(1, 4, seq, D), randn(1, 2, seq, D), randn(1, 2, seq, D)
    cache = build_cache(k, v, torch.tensor([seq]), partition, 2, rqe=False, stochastic=True, seed=1)
    kd, vd = dequantize_cache_ref(cache)
    exact = attn_prefill_ref(q, kd, vd)
    ref_row = hack_attn_prefill_ref(q, cache, q_per_row=True)
    row_err = rel_err(ref_row, exact)
    for use_se in (True, False):
        out = hack_attn_prefill(q, cache, use_se=use_se, config=PrefillConfig(block_m=64, num_warps=4))
        assert rel_err(out, exact) < 2 * row_err + 2e-3
        assert rel_err(out, ref_row) < row_err
