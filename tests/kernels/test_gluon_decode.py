"""The Gluon decode kernels (kernels/gluon_decode.py).  Gluon has no interpreter, so the numerical
checks run only on a Hopper GPU (tests/kernels on the device); CI compiles them for sm_90 offline
(test_sass.py) and checks the split-count arithmetic and the refusals here."""

import pytest
import torch
from kernel_test_helpers import DEVICE, randn, rel_err

from kernels_calibration.kernels.attn_decode import attn_decode_ref
from kernels_calibration.kernels.kv_cache import build_cache, dequantize_cache_ref
from kernels_calibration.kernels.launch import DecodeConfig

needs_hopper = pytest.mark.skipif(
    not (torch.cuda.is_available() and torch.cuda.get_device_capability()[0] >= 9),
    reason="Gluon kernels need a Hopper GPU (no interpreter)",
)

B, HKV, G, D = 3, 2, 8, 128


@needs_hopper
@pytest.mark.parametrize("partition,rqe", [(64, True), (128, True), (64, False)])
def test_gluon_dequant_decode_matches_exact_attention(partition, rqe):
    from kernels_calibration.kernels.gluon_decode import dequant_attn_decode_gluon

    torch.manual_seed(partition + rqe)
    lmax = 700
    lens = torch.tensor([700 - 41, 197, 64], dtype=torch.int32)  # ragged: FP16 tails, one block exactly
    k, v = randn(B, HKV, lmax, D), randn(B, HKV, lmax, D)
    q = randn(B, HKV * G, D)
    cache = build_cache(k, v, lens.to(DEVICE), partition, 2, rqe=rqe, stochastic=True, seed=5)
    kd, vd = dequantize_cache_ref(cache)
    exact = attn_decode_ref(q, kd, vd, lens)
    for splits in (1, 3, 7):  # splits whose ranges end inside a tile, and empty splits
        for maxnreg in (None, 168):
            out = dequant_attn_decode_gluon(q, cache, config=DecodeConfig(splits=splits, maxnreg=maxnreg))
            assert rel_err(out, exact) < 2e-3, (splits, maxnreg)


def test_gluon_rejects_shapes_it_does_not_take():
    from kernels_calibration.kernels import dispatch
    from kernels_calibration.kernels.gluon_decode import dequant_attn_decode_gluon, hack_attn_decode_gluon
    from kernels_calibration.kernels.launch import HackDecodeConfig

    k, v = randn(1, 2, 64, D), randn(1, 2, 64, D)
    cache = build_cache(k, v, torch.tensor([64], dtype=torch.int32, device=DEVICE), 32, 2)
    with pytest.raises(ValueError, match="PI 64/128"):
        dequant_attn_decode_gluon(randn(1, 16, D), cache)
    with pytest.raises(ValueError, match="PI 64 and 8"):
        hack_attn_decode_gluon(randn(1, 16, D), cache)
    # the HACK default never picks it at PI 32, nor below 2K tokens, nor off the GPU
    auto = HackDecodeConfig()
    assert dispatch.hack_kernel(randn(1, 16, D), cache, 4096, auto) != "gluon"
    c64 = build_cache(k, v, torch.tensor([64], dtype=torch.int32, device=DEVICE), 64, 2)
    assert dispatch.hack_kernel(randn(1, 16, D), c64, 2048, auto) != "gluon"
    if not torch.cuda.is_available():
        assert dispatch.hack_kernel(randn(1, 16, D), c64, 4096, auto) != "gluon"
    # one warp per program: a Triton warp count is refused before any launch
    with pytest.raises(ValueError, match="one warp"):
        hack_attn_decode_gluon(randn(1, 16, D), c64, config=DecodeConfig(num_warps=4))


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
        out = hack_attn_decode_gluon(q, cache, use_se=use_se, config=DecodeConfig(splits=splits))
        assert rel_err(out, exact) < 2 * ref_err + 2e-3, splits


@needs_hopper
def test_hack_decode_step_runs_the_gluon_kernel_above_2k_tokens():
    """The default decode step: above FUSED_STEP_MAX_LEN tokens (PI 64, GQA 8, Hopper) append + the Gluon
    kernel with its launch defaults (168 registers, one wave of splits), below it the fused row-packed
    step; the Gluon kernel's other register caps give the same attention."""
    from kernels_calibration.kernels import dispatch
    from kernels_calibration.kernels.gluon_decode import hack_attn_decode_gluon
    from kernels_calibration.kernels.hack_attn_decode import decode_step, hack_attn_decode_ref
    from kernels_calibration.kernels.launch import HackDecodeConfig

    torch.manual_seed(21)
    lmax = dispatch.FUSED_STEP_MAX_LEN + 550
    lens = torch.tensor([lmax - 100, dispatch.FUSED_STEP_MAX_LEN - 5, 900], dtype=torch.int32)
    k, v = randn(B, HKV, lmax, D), randn(B, HKV, lmax, D)
    q, kn, vn = randn(B, HKV * G, D), randn(B, HKV, D), randn(B, HKV, D)
    cache = build_cache(k, v, lens.to(DEVICE), 64, 2, rqe=True, stochastic=True, seed=5)
    auto = HackDecodeConfig()
    assert dispatch.hack_kernel(q, cache, lmax, auto) == "gluon" and not dispatch.fused_step(q, cache, lmax, auto)
    out, c2 = decode_step(q, cache, kn, vn, max_len=lmax)
    assert torch.equal(out, hack_attn_decode_gluon(q, c2, max_len=lmax))
    kd, vd = dequantize_cache_ref(c2)
    exact = attn_decode_ref(q, kd, vd, c2.lens.cpu())
    bound = 2 * rel_err(hack_attn_decode_ref(q, c2, q_per_head=True), exact) + 2e-3
    assert rel_err(out, exact) < bound
    for maxnreg in (128, 0):
        got = hack_attn_decode_gluon(q, c2, max_len=lmax, config=DecodeConfig(maxnreg=maxnreg))
        assert rel_err(got, exact) < bound, maxnreg
    # a batch bound by 2K tokens: the fused row-packed step
    assert dispatch.fused_step(q, cache, dispatch.FUSED_STEP_MAX_LEN, auto)


def test_one_wave_split_count():
    """The occupancy arithmetic behind the Gluon HACK kernel's default splits (H200: 132 SMs)."""
    from kernels_calibration.kernels.gluon_decode import one_wave_splits, programs_per_sm

    assert programs_per_sm(168) == 12  # 5,376 registers per warp: 3 per 16K partition
    assert programs_per_sm(182) == 8  # 5,888: 2 per partition, though the SM's 64K would hold 11
    assert programs_per_sm(255) == 8 and programs_per_sm(32) == 32 and programs_per_sm(94, num_warps=4) == 5
    assert one_wave_splits(8, 8, 32769, 132, 12) == 24  # 1,536 programs <= 1,584 slots
    assert one_wave_splits(8, 8, 32769, 132, 8) == 16
    assert one_wave_splits(1, 8, 32769, 132, 12) == 128  # capped
    assert one_wave_splits(8, 8, 200, 132, 12) == 2  # at least two 64-token tiles per split
