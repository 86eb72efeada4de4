"""The Gluon decode kernels (kernels/gluon_decode.py).  Gluon has no interpreter, so the numerical
checks run only on a Hopper GPU (tests/kernels on the device); CI compiles them for sm_90 offline
(test_sass.py) and checks the split-count arithmetic here."""
import pytest
import torch

from kernels_calibration.kernels.hack_attn_decode import attn_decode_ref
from kernels_calibration.kernels.kv_cache import build_cache, dequantize_cache_ref

from kernel_test_helpers import DEVICE, randn, rel_err

needs_hopper = pytest.mark.skipif(not (torch.cuda.is_available() and torch.cuda.get_device_capability()[0] >= 9),
                                  reason="Gluon kernels need a Hopper GPU (no interpreter)")

B, HKV, G, D = 3, 2, 8, 128


@needs_hopper
@pytest.mark.parametrize("partition,rqe", [(64, True), (128, True), (64, False)])
def test_gluon_dequant_decode_matches_exact_attention(partition, rqe):
    from kernels_calibration.kernels.gluon_decode import dequant_attn_decode_gluon

    torch.manual_seed(partition + rqe)
    lmax = 700
    lens = torch.tensor([700 - 41, 197, 64], dtype=torch.int32)   # ragged: FP16 tails, one block exactly
    k, v = randn(B, HKV, lmax, D), randn(B, HKV, lmax, D)
    q = randn(B, HKV * G, D)
    cache = build_cache(k, v, lens.to(DEVICE), partition, 2, rqe=rqe, stochastic=True, seed=5)
    kd, vd = dequantize_cache_ref(cache)
    exact = attn_decode_ref(q, kd, vd, lens)
    for splits in (1, 3, 7):   # splits whose ranges end inside a tile, and empty splits
        for kw in (dict(vlay=0), dict(vlay=1), dict(pipe=True), dict(kernel="mma", block_n=32),
                   dict(kernel="mma", block_n=64)):
            out = dequant_attn_decode_gluon(q, cache, splits=splits, **kw)
            assert rel_err(out, exact) < 2e-3, (splits, kw)


def test_gluon_rejects_shapes_it_does_not_take():
    from kernels_calibration.kernels.gluon_decode import dequant_attn_decode_gluon
    from kernels_calibration.kernels.hack_attn_decode import gluon_hack_applies

    k, v = randn(1, 2, 64, D), randn(1, 2, 64, D)
    cache = build_cache(k, v, torch.tensor([64], dtype=torch.int32, device=DEVICE), 32, 2)
    with pytest.raises(ValueError, match="PI 64/128"):
        dequant_attn_decode_gluon(randn(1, 16, D), cache)
    # the HACK default never picks it at PI 32, nor below 2K tokens, nor off the GPU
    assert not gluon_hack_applies(randn(1, 16, D), cache, 4096)
    c64 = build_cache(k, v, torch.tensor([64], dtype=torch.int32, device=DEVICE), 64, 2)
    assert not gluon_hack_applies(randn(1, 16, D), c64, 2048)
    if not torch.cuda.is_available():
        assert not gluon_hack_applies(randn(1, 16, D), c64, 4096)
    # launch options it does not have are refused before any launch (the ring and two-tile loop do not combine)
    from kernels_calibration.kernels.gluon_decode import hack_attn_decode_gluon

    for kw in (dict(ring=1), dict(ring=5), dict(ring=2, unroll=2), dict(prefetch=3), dict(unroll=3)):
        with pytest.raises(ValueError, match="ring"):
            hack_attn_decode_gluon(randn(1, 16, D), c64, **kw)


@needs_hopper
@pytest.mark.parametrize("rqe,use_se", [(True, True), (True, False), (False, True), (False, False)])
def test_gluon_hack_decode_matches_hack_reference(rqe, use_se):
    """HACK on the one-warp kernel: within twice the float64 HACK reference's own error (Q per head)."""
    from kernels_calibration.kernels.gluon_decode import hack_attn_decode_gluon
    from kernels_calibration.kernels.hack_attn_decode import hack_attn_decode_ref

    torch.manual_seed(11 + rqe + 2 * use_se)
    lmax = 700
    lens = torch.tensor([700 - 41, 197, 64], dtype=torch.int32)
    k, v = randn(B, HKV, lmax, D), randn(B, HKV, lmax, D)
    q = randn(B, HKV * G, D)
    cache = build_cache(k, v, lens.to(DEVICE), 64, 2, rqe=rqe, stochastic=True, seed=5)
    kd, vd = dequantize_cache_ref(cache)
    exact = attn_decode_ref(q, kd, vd, lens)
    ref_err = rel_err(hack_attn_decode_ref(q, cache, q_per_head=True), exact)
    for splits in (1, 3, 7):
        out = hack_attn_decode_gluon(q, cache, use_se=use_se, splits=splits)
        assert rel_err(out, exact) < 2 * ref_err + 2e-3, splits


@needs_hopper
def test_hack_decode_step_runs_the_gluon_kernel_above_2k_tokens():
    """The default decode step: above FUSED_STEP_MAX_LEN tokens (PI 64, GQA 8, Hopper) append + the Gluon
    kernel with its launch defaults (prefetch 1, 168 registers, vun, vpair), below it the fused row-packed step; the
    Gluon kernel's other launch variants give the same attention."""
    from kernels_calibration.kernels import gluon_decode as gd
    from kernels_calibration.kernels.hack_attn_decode import FUSED_STEP_MAX_LEN, decode_step, hack_attn_decode_ref

    torch.manual_seed(21)
    lmax = FUSED_STEP_MAX_LEN + 550
    lens = torch.tensor([lmax - 100, FUSED_STEP_MAX_LEN - 5, 900], dtype=torch.int32)
    k, v = randn(B, HKV, lmax, D), randn(B, HKV, lmax, D)
    q, kn, vn = randn(B, HKV * G, D), randn(B, HKV, D), randn(B, HKV, D)
    cache = build_cache(k, v, lens.to(DEVICE), 64, 2, rqe=True, stochastic=True, seed=5)
    gd.LAST_KERNEL.clear()
    out, c2 = decode_step(q, cache, kn, vn, max_len=lmax)
    assert [key[0] for key in gd.LAST_KERNEL] == ["hack"]   # the Gluon HACK kernel ran, once
    kd, vd = dequantize_cache_ref(c2)
    exact = attn_decode_ref(q, kd, vd, c2.lens.cpu())
    bound = 2 * rel_err(hack_attn_decode_ref(q, c2, q_per_head=True), exact) + 2e-3
    assert rel_err(out, exact) < bound
    for kw in (dict(prefetch=0), dict(prefetch=2), dict(unroll=2), dict(maxnreg=128), dict(maxnreg=0), dict(ring=2),
               dict(ring=4, prefetch=0), dict(vun=False, vpair=False), dict(vun=False), dict(vpair=False)):
        assert rel_err(gd.hack_attn_decode_gluon(q, c2, max_len=lmax, **kw), exact) < bound, kw
    gd.LAST_KERNEL.clear()
    decode_step(q, cache, kn, vn, max_len=FUSED_STEP_MAX_LEN)   # a batch bound by 2K tokens: row-packed
    assert not gd.LAST_KERNEL


def test_one_wave_split_count():
    """The occupancy arithmetic behind the Gluon HACK kernel's default splits (runs 40-42, H200 132 SMs)."""
    from kernels_calibration.kernels.gluon_decode import one_wave_splits, programs_per_sm

    assert programs_per_sm(168) == 12     # 5,376 registers per warp: 3 per 16K partition
    assert programs_per_sm(182) == 8      # 5,888: 2 per partition, though the SM's 64K would hold 11
    assert programs_per_sm(255) == 8 and programs_per_sm(32) == 32 and programs_per_sm(94, num_warps=4) == 5
    assert one_wave_splits(8, 8, 32769, 132, 12) == 24    # 1,536 programs <= 1,584 slots
    assert one_wave_splits(8, 8, 32769, 132, 8) == 16
    assert one_wave_splits(1, 8, 32769, 132, 12) == 128   # capped
    assert one_wave_splits(8, 8, 200, 132, 12) == 2       # at least two 64-token tiles per split
