"""quantize / pack / append: exact agreement with the PyTorch references (nearest rounding), range
and unbiasedness of stochastic rounding, append semantics with and without RQE."""

import pytest
import torch
from kernel_test_helpers import DEVICE, randn

from kernels_calibration.kernels.kv_cache import append_token, build_cache, dequantize_cache_ref
from kernels_calibration.kernels.quantize import (
    dequantize_k_ref,
    pack_ref,
    quantize_k,
    quantize_k_ref,
    quantize_v,
    quantize_v_ref,
    unpack_ref,
)


def test_pack_roundtrip():
    codes = torch.randint(0, 4, (5, 128))
    assert torch.equal(unpack_ref(pack_ref(codes, 2), 2), codes)
    # byte j holds channels j, j+32, j+64, j+96 at bit offsets 0, 2, 4, 6
    packed = pack_ref(codes, 2)
    assert int(packed[0, 3]) == int(codes[0, 3] | codes[0, 35] << 2 | codes[0, 67] << 4 | codes[0, 99] << 6)


@pytest.mark.parametrize("bits,partition", [(2, 32), (2, 64), (2, 128), (4, 64), (8, 32)])
def test_quantize_k_matches_ref(bits, partition):
    torch.manual_seed(bits * 1000 + partition)
    k = randn(3, 2, 37, 128)  # 37 tokens: not a multiple of the 16-row block
    c, mn, sc, sm = quantize_k(k, partition, bits, stochastic=False)
    cr, mnr, scr, smr = quantize_k_ref(k.cpu(), partition, bits)
    assert torch.equal(mn.cpu(), mnr) and torch.equal(sc.cpu(), scr)
    # codes may differ only where y + 0.5 lands within float rounding of an integer
    diff = (unpack_ref(c.cpu(), bits) - unpack_ref(cr, bits)).abs()
    assert diff.max() <= 1 and (diff > 0).float().mean() < 1e-3
    assert sm.dtype == smr.dtype
    assert torch.equal(sm.cpu().long(), unpack_ref(c.cpu(), bits).reshape(3, 2, 37, -1, partition).sum(-1))
    deq = dequantize_k_ref(c.cpu(), mn.cpu(), sc.cpu(), partition, bits)
    step = sc.cpu().float().repeat_interleave(partition, -1)
    assert ((deq - k.cpu().float()).abs() <= 0.5 * step + 1e-3).all()


@pytest.mark.parametrize("partition", [32, 64, 128])
def test_quantize_v_matches_ref(partition):
    torch.manual_seed(partition)
    v = randn(2, 3, 150, 128)
    lens = torch.tensor([150, 77], dtype=torch.int32, device=DEVICE)
    c, mn, sc, sm = quantize_v(v, lens, partition, 2, stochastic=False)
    cr, mnr, scr, smr = quantize_v_ref(v.cpu(), lens.cpu(), partition, 2)
    assert torch.equal(mn.cpu(), mnr) and torch.equal(sc.cpu(), scr)
    diff = (unpack_ref(c.cpu(), 2) - unpack_ref(cr, 2)).abs()
    assert diff.max() <= 1 and (diff > 0).float().mean() < 1e-3
    assert (sm.cpu().long() - smr.long()).abs().max() <= 2


def test_stochastic_rounding_unbiased_and_bracketing():
    torch.manual_seed(7)
    k = randn(1, 128)
    n = 400
    deq = []
    _, mn, sc, _ = quantize_k(k, 64, 2, stochastic=False)
    lo_step = sc.cpu().float().repeat_interleave(64, -1)
    for seed in range(n):
        c, mn_s, sc_s, _ = quantize_k(k, 64, 2, stochastic=True, seed=seed)
        assert torch.equal(mn_s, mn) and torch.equal(sc_s, sc)
        deq.append(dequantize_k_ref(c.cpu(), mn_s.cpu(), sc_s.cpu(), 64, 2))
    deq = torch.stack(deq)  # (n, 1, 128)
    x = k.cpu().float()
    # every draw is one of the two grid points around x
    assert ((deq - x).abs() <= lo_step + 1e-3).all()
    # the mean converges to x: |bias| within 4 standard errors (variance <= step^2 / 4)
    bias = (deq.mean(0) - x).abs()
    assert (bias <= 4 * lo_step / 2 / n**0.5 + 1e-3).all()
    # and nearest rounding is biased on the same inputs (the test can fail)
    cn, _, _, _ = quantize_k(k, 64, 2, stochastic=False)
    near = dequantize_k_ref(cn.cpu(), mn.cpu(), sc.cpu(), 64, 2)
    assert (near - x).abs().mean() > 4 * bias.mean()


@pytest.mark.parametrize("rqe", [True, False])
def test_append_token(rqe):
    torch.manual_seed(11 + rqe)
    b, h, d, pi = 2, 2, 128, 32
    cap = 96
    k = randn(b, h, cap, d)
    v = randn(b, h, cap, d)
    lens = torch.tensor([29, 60], dtype=torch.int32, device=DEVICE)
    cache = build_cache(k, v, lens, pi, 2, rqe=rqe, stochastic=False, capacity=cap)
    k_ref, v_ref = k.clone(), v.clone()
    n0 = lens.cpu().clone()
    for step in range(6):  # request 0 crosses a block boundary (29 -> 35)
        kn, vn = randn(b, h, d), randn(b, h, d)
        for i in range(b):
            k_ref[i, :, n0[i] + step] = kn[i]
            v_ref[i, :, n0[i] + step] = vn[i]
        cache = append_token(cache, kn, vn, stochastic=False)
    assert torch.equal(cache.lens.cpu(), (n0 + 6).int())
    kd, vd = dequantize_cache_ref(cache)
    for i in range(b):
        n = int(n0[i]) + 6
        ke = (kd[i, :, :n] - k_ref[i, :, :n].cpu().float()).abs()
        ve = (vd[i, :, :n] - v_ref[i, :, :n].cpu().float()).abs()
        kstep = (cache.k_scale[i, :, :n].cpu().float()).repeat_interleave(d // pi * 0 + pi, -1)
        assert (ke <= 0.5 * kstep + 1e-3).all()
        lv = n // pi * pi
        if rqe:
            # the tail is exact FP16; quantized blocks are within half a step
            assert torch.equal(vd[i, :, lv:n], v_ref[i, :, lv:n].cpu().float())
            vs = cache.v_scale[i, :, : n // pi].cpu().float().repeat_interleave(pi, 1)
            assert (ve[:, :lv] <= 0.5 * vs + 1e-3).all()
        else:
            # requantized partial blocks carry more error, but every token is quantized
            assert ve.max() < 3.0
            assert not torch.equal(vd[i, :, lv:n], v_ref[i, :, lv:n].cpu().float())
