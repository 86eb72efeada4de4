"""Attention kernels against float64 references, at sizes that do not divide the blocks.

Tolerances are relative to each kernel's own low-precision error: FP16 kernels against exact
attention (a few 1e-4 expected), FP8 against exact attention on the FP8-rounded K/V, HACK against
exact attention on the dequantized cache, bounded by 2x the error of the float64 HACK reference
(which rounds Q and P the way the kernel does) plus 2e-3.
"""
import pytest
import torch

from kernels_calibration.kernels.attn_decode import fp_attn_decode, sdpa_decode, to_fp8
from kernels_calibration.kernels.attn_prefill import attn_prefill_ref, fa_attn_prefill
from kernels_calibration.kernels.dequant_attn_decode import dequant_attn_decode
from kernels_calibration.kernels.hack_attn_decode import (attn_decode_ref, hack_attn_decode,
                                                          hack_attn_decode_ref)
from kernels_calibration.kernels.hack_attn_prefill import hack_attn_prefill, hack_attn_prefill_ref
from kernels_calibration.kernels.kv_cache import append_token, build_cache, dequantize_cache_ref

from kernel_test_helpers import DEVICE, randn, rel_err

B, HKV, G, D = 2, 2, 4, 128


def _kv(seq, lens):
    k, v = randn(B, HKV, seq, D), randn(B, HKV, seq, D)
    return k, v, torch.tensor(lens, dtype=torch.int32, device=DEVICE)


def test_fp16_decode_matches_exact_and_sdpa():
    torch.manual_seed(1)
    k, v, lens = _kv(150, [150, 150])
    q = randn(B, HKV * G, D)
    out = fp_attn_decode(q, k, v, lens, splits=3, block_n=32)
    assert rel_err(out, attn_decode_ref(q, k, v, lens)) < 2e-3
    if DEVICE == "cuda":
        assert rel_err(out, sdpa_decode(q, k, v)) < 2e-3


def test_fp16_decode_ragged():
    torch.manual_seed(2)
    k, v, lens = _kv(150, [150, 61])
    q = randn(B, HKV * G, D)
    assert rel_err(fp_attn_decode(q, k, v, lens, splits=2, block_n=32), attn_decode_ref(q, k, v, lens)) < 2e-3


def test_fp8_decode():
    torch.manual_seed(3)
    k, v, lens = _kv(130, [130, 77])
    q = randn(B, HKV * G, D)
    k8, ks = to_fp8(k)
    v8, vs = to_fp8(v)
    out = fp_attn_decode(q, k8, v8, lens, ks, vs, splits=2, block_n=32)
    ref = attn_decode_ref(q, k8.float() * ks, v8.float() * vs, lens)
    assert rel_err(out, ref) < 2e-3


@pytest.mark.parametrize("partition,rqe", [(32, True), (64, True), (128, True), (64, False)])
def test_hack_decode(partition, rqe):
    torch.manual_seed(partition + rqe)
    k, v, lens = _kv(200, [200 - 41, 197])  # ragged, tails of 31 / 5 (PI=32), partial blocks
    q = randn(B, HKV * G, D)
    cache = build_cache(k, v, lens, partition, 2, rqe=rqe, stochastic=True, seed=5)
    kd, vd = dequantize_cache_ref(cache)
    exact = attn_decode_ref(q, kd, vd, lens)
    ref_err = rel_err(hack_attn_decode_ref(q, cache), exact)
    for use_se, prefetch, block_n, v_split in ((True, False, None, True), (False, False, None, True),
                                               (True, True, None, True), (False, False, partition, True),
                                               (True, False, None, False), (False, False, None, False)):
        # v_split=False (masked P over the whole V tile) is the non-default P.V form
        out = hack_attn_decode(q, cache, use_se=use_se, splits=3, prefetch=prefetch, block_n=block_n,
                               v_split=v_split, row_packed=False)
        assert rel_err(out, exact) < 2 * ref_err + 2e-3
    # the fused dequantize baseline is FP16 arithmetic on the same cache
    assert rel_err(dequant_attn_decode(q, cache, fused=True, splits=3), exact) < 2e-3
    assert rel_err(dequant_attn_decode(q, cache, fused=True, splits=3, prefetch=True), exact) < 2e-3
    assert rel_err(dequant_attn_decode(q, cache, fused=True, splits=3, block_n=partition), exact) < 2e-3
    assert rel_err(dequant_attn_decode(q, cache, fused=True, splits=3, v_split=False), exact) < 2e-3
    assert rel_err(dequant_attn_decode(q, cache, fused=False, splits=2), exact) < 2e-3
    # and the quantized result is close to, but not equal to, FP16 attention
    assert rel_err(out, attn_decode_ref(q, k, v, lens)) > 10 * rel_err(out, exact)


@pytest.mark.parametrize("partition,rqe", [(64, True), (128, True), (64, False)])
def test_hack_decode_token_major(partition, rqe):
    """The transposed (token-major) kernel: both modes, SE and no-SE, one split (direct write),
    fused split combine (last program merges) and the separate combine kernel; lengths that end
    mid-block and mid-tile."""
    torch.manual_seed(10 * partition + rqe)
    k, v, lens = _kv(300, [300 - 41, 297])
    q = randn(B, HKV * G, D)
    cache = build_cache(k, v, lens, partition, 2, rqe=rqe, stochastic=True, seed=7)
    kd, vd = dequantize_cache_ref(cache)
    exact = attn_decode_ref(q, kd, vd, lens)
    ref_err = rel_err(hack_attn_decode_ref(q, cache), exact)
    for use_se in (True, False):
        for splits, fused in ((1, True), (3, True), (2, False)):
            out = hack_attn_decode(q, cache, use_se=use_se, splits=splits, transposed=True, fused_combine=fused)
            assert rel_err(out, exact) < 2 * ref_err + 2e-3, (use_se, splits, fused)
    assert rel_err(dequant_attn_decode(q, cache, fused=True, splits=3, transposed=True), exact) < 2e-3
    assert rel_err(dequant_attn_decode(q, cache, fused=True, splits=1, transposed=True), exact) < 2e-3
    # the fused combine leaves its counters at zero: a second call gives the same output
    a = hack_attn_decode(q, cache, splits=3, transposed=True, fused_combine=True)
    assert torch.equal(a, hack_attn_decode(q, cache, splits=3, transposed=True, fused_combine=True))
    # P.V token-major as well (v_side 0); with 8 heads per KV head and no padding head (8-wide
    # dots) the no-SE code sums come from the codes themselves
    q8 = randn(B, HKV * 8, D)
    exact8 = attn_decode_ref(q8, kd, vd, lens)
    err8 = rel_err(hack_attn_decode_ref(q8, cache), exact8)
    for use_se in (True, False):
        out = hack_attn_decode(q, cache, use_se=use_se, splits=2, transposed=True, v_side=0)
        assert rel_err(out, exact) < 2 * ref_err + 2e-3
        out = hack_attn_decode(q8, cache, use_se=use_se, splits=2, transposed=True, v_side=0, pad_heads_to=8)
        assert rel_err(out, exact8) < 2 * err8 + 2e-3
    with pytest.raises(ValueError, match="partition"):
        hack_attn_decode(q, build_cache(k, v, lens, 32, 2), transposed=True)


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
            out = hack_attn_decode(q, cache, use_se=use_se, splits=splits, row_packed=True)
            assert rel_err(out, exact) < 2 * ref_err + 2e-3, (use_se, splits)
            assert rel_err(out, ref_head) < ref_err, (use_se, splits)
    with pytest.raises(ValueError, match="row-packed"):
        hack_attn_decode(q, cache, mode="dequant", row_packed=True)


def test_hack_decode_step_fused_append():
    """hack_decode_step (append + attention in one launch): the cache equals append_token's, bit for
    bit; the output equals append_token + hack_attn_decode except at a step that fills a V block, where
    that block is attended in FP16 (checked against exact attention with that block's FP16 V)."""
    import dataclasses

    from kernels_calibration.kernels.hack_decode_rp import hack_decode_step

    torch.manual_seed(21)
    k, v, _ = _kv(200, [1, 1])
    lens = torch.tensor([62, 126], dtype=torch.int32, device=DEVICE)  # both fill a block at the second step
    c1 = build_cache(k, v, lens, 64, 2, rqe=True, seed=4)
    c2 = dataclasses.replace(c1, **{f.name: getattr(c1, f.name).clone() for f in dataclasses.fields(c1)
                                    if isinstance(getattr(c1, f.name), torch.Tensor)})
    fields = ("k_codes", "k_min", "k_scale", "k_sum", "v_codes", "v_min", "v_scale", "v_sum", "v_tail", "lens")
    for step in range(3):
        q, kn, vn = randn(B, HKV * 8, D), randn(B, HKV, D), randn(B, HKV, D)
        c1 = append_token(c1, kn, vn, seed=7)
        o1 = hack_attn_decode(q, c1, splits=2)
        o2, c2 = hack_decode_step(q, c2, kn, vn, seed=7, splits=2)
        assert all(torch.equal(getattr(c1, f), getattr(c2, f)) for f in fields), step
        if step != 1:
            assert torch.equal(o1, o2), step
        else:
            kd, vd = dequantize_cache_ref(c2)
            for i in range(B):
                n = int(c2.lens[i])
                vd[i, :, n - 64:n] = c2.v_tail[i, :, :64].float().cpu()
            exact = attn_decode_ref(q, kd, vd, c2.lens)
            ref_err = rel_err(hack_attn_decode_ref(q, c1, q_per_head=True), attn_decode_ref(q, *dequantize_cache_ref(c1),
                                                                                           c1.lens))
            assert rel_err(o2, exact) < 2 * ref_err + 2e-3
    with pytest.raises(ValueError, match="RQE"):
        hack_decode_step(q, build_cache(k, v, lens, 64, 2, rqe=False), kn, vn)


def test_decode_step_dispatch(monkeypatch):
    """decode_step fuses the append into the attention launch up to FUSED_STEP_MAX_LEN tokens and runs
    append_token + hack_attn_decode beyond; checked at a step that fills a V block, where the two paths'
    outputs differ (the fused one attends that block in FP16), and at the next step, where they agree."""
    import dataclasses

    from kernels_calibration.kernels import hack_attn_decode as had
    from kernels_calibration.kernels.hack_decode_rp import hack_decode_step

    torch.manual_seed(23)
    # the Triton kernels on every device: on Hopper the unfused path above FUSED_STEP_MAX_LEN would take the
    # Gluon kernel, whose outputs agree with the row-packed kernel's but not bit for bit (its dispatch is
    # test_gluon_decode.py's test_hack_decode_step_runs_the_gluon_kernel_above_2k_tokens)
    monkeypatch.setattr(had, "gluon_hack_applies", lambda *a, **kw: False)
    k, v, _ = _kv(200, [1, 1])
    lens = torch.tensor([63, 127], dtype=torch.int32, device=DEVICE)   # the first append fills a block

    def fresh():
        c = build_cache(k, v, lens, 64, 2, rqe=True, seed=4)
        return dataclasses.replace(c, **{f.name: getattr(c, f.name).clone() for f in dataclasses.fields(c)
                                         if isinstance(getattr(c, f.name), torch.Tensor)})

    q, kn, vn = randn(B, HKV * 8, D), randn(B, HKV, D), randn(B, HKV, D)
    o_fused, c_fused = hack_decode_step(q, fresh(), kn, vn, seed=7, splits=2)
    c_sep = append_token(fresh(), kn, vn, seed=7)
    o_sep = hack_attn_decode(q, c_sep, splits=2)
    assert not torch.equal(o_fused, o_sep)
    o, c = had.decode_step(q, fresh(), kn, vn, seed=7, splits=2)              # capacity 200 <= 2048: fused
    assert torch.equal(o, o_fused) and torch.equal(c.lens, c_fused.lens)
    o, c = had.decode_step(q, fresh(), kn, vn, seed=7, splits=2, fused=False)
    assert torch.equal(o, o_sep) and torch.equal(c.v_codes, c_sep.v_codes)
    monkeypatch.setattr(had, "FUSED_STEP_MAX_LEN", 100)
    o, _ = had.decode_step(q, fresh(), kn, vn, seed=7, splits=2)
    assert torch.equal(o, o_sep)
    q2 = randn(B, HKV * 8, D)   # next step: no block fills, both paths give the same output
    o1, _ = had.decode_step(q2, c_fused, kn, vn, seed=8, splits=2, fused=True)
    o2, _ = had.decode_step(q2, c_sep, kn, vn, seed=8, splits=2, fused=False)
    assert torch.equal(o1, o2)


def test_hack_decode_after_append_crosses_block():
    torch.manual_seed(9)
    k, v, lens = _kv(128, [62, 30])
    q = randn(B, HKV * G, D)
    cache = build_cache(k, v, lens, 32, 2, rqe=True, stochastic=False)
    for _ in range(3):
        cache = append_token(cache, randn(B, HKV, D), randn(B, HKV, D), stochastic=False)
    kd, vd = dequantize_cache_ref(cache)
    exact = attn_decode_ref(q, kd, vd, cache.lens)
    out = hack_attn_decode(q, cache, splits=2, row_packed=False)
    assert rel_err(out, exact) < 2 * rel_err(hack_attn_decode_ref(q, cache), exact) + 2e-3
    out = hack_attn_decode(q, cache, splits=2)  # the row-packed kernel (default)
    assert rel_err(out, exact) < 2 * rel_err(hack_attn_decode_ref(q, cache, q_per_head=True), exact) + 2e-3


def test_fa_prefill():
    torch.manual_seed(4)
    q, k, v = randn(1, 4, 100, D), randn(1, 2, 100, D), randn(1, 2, 100, D)
    out = fa_attn_prefill(q, k, v, block_m=32, block_n=16, num_warps=4)
    assert rel_err(out, attn_prefill_ref(q, k, v)) < 2e-3


@pytest.mark.parametrize("partition", [32, 64])
def test_hack_prefill(partition):
    torch.manual_seed(partition + 5)
    seq = 100
    q, k, v = randn(1, 4, seq, D), randn(1, 2, seq, D), randn(1, 2, seq, D)
    cache = build_cache(k, v, torch.tensor([seq]), partition, 2, rqe=False, stochastic=True, seed=1)
    kd, vd = dequantize_cache_ref(cache)
    exact = attn_prefill_ref(q, kd, vd)
    ref_err = rel_err(hack_attn_prefill_ref(q, cache), exact)
    for use_se in (True, False):
        out = hack_attn_prefill(q, cache, use_se=use_se, block_m=64, num_warps=4, row_scaled=False)
        assert rel_err(out, exact) < 2 * ref_err + 2e-3
    # the row-scaled kernel (the default; Q rounded per row): its own reference, within that reference's error
    ref_row = hack_attn_prefill_ref(q, cache, q_per_row=True)
    row_err = rel_err(ref_row, exact)
    for use_se in (True, False):
        out = hack_attn_prefill(q, cache, use_se=use_se, block_m=64, num_warps=4, row_scaled=True)
        assert rel_err(out, exact) < 2 * row_err + 2e-3
        assert rel_err(out, ref_row) < row_err
