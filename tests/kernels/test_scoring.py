"""Scoring kernels (PQCache centroid scoring, HCAttention quantized-key scoring) against their
PyTorch references: ragged lengths that do not divide the token block, GQA groups (including a
group that is not a power of two), -inf exactly past each length, top-k agreement, and the
profile fit picking up the new keys.

Tolerances are the floating-point bound of the reference's own FP32 arithmetic: both compute an
n-term FP32 sum of products of FP16 inputs, so |out - exact| <= n * 2^-24 * sum |terms| per score
(terms: q_j * k_hat_j, split into scale and min parts for the quantized keys); the exact value is
taken from a float64 reference.  A wrong code, channel, partition or head is off by O(|score|).
"""

import math

import pytest
import torch
from kernel_test_helpers import DEVICE, randn

from kernels_calibration.kernels.launch import ScoreConfig
from kernels_calibration.kernels.pq_score import pq_reconstruct_ref, pq_score, pq_score_ref, pq_score_work
from kernels_calibration.kernels.qk_score import qk_score, qk_score_ref, qk_score_work
from kernels_calibration.kernels.quantize import dequantize_k_ref, quantize_k, unpack_ref
from kernels_calibration.profile import build_profile

EPS32 = 2.0**-24
# quantize_k computes 1 / scale on masked-out rows too (scale 0 there); the interpreter warns
pytestmark = pytest.mark.filterwarnings("ignore:divide by zero:RuntimeWarning")


def _check_scores(out, ref64, bound, n_terms):
    """-inf pattern equal; finite scores within the FP32 summation bound of the exact value."""
    out, ref64, bound = out.cpu().double(), ref64.cpu(), bound.cpu()
    fin = torch.isfinite(ref64)
    assert torch.equal(torch.isfinite(out), fin)
    assert (out[~fin] == float("-inf")).all()
    err = (out[fin] - ref64[fin]).abs()
    tol = 2 * n_terms * EPS32 * bound[fin] + 1e-30
    assert (err <= tol).all(), f"max err/tol {float((err / tol).max()):.2f}"


def _group_heads(x, hq):
    return x.repeat_interleave(hq // x.shape[1], dim=1)


# ----------------------------------------------------------------------------- PQ scoring
def _pq_inputs(b, hq, hkv, d, m, bits, lmax, lens, seed):
    gen = torch.Generator().manual_seed(seed)
    c = 2**bits
    q = randn(b, hq, d, gen=gen)
    cent = randn(b, hkv, m, c, d // m, gen=gen)
    codes = torch.randint(0, c, (b, hkv, lmax, m), generator=gen, dtype=torch.uint8).to(DEVICE)
    return q, cent, codes, torch.tensor(lens, dtype=torch.int32, device=DEVICE)


@pytest.mark.parametrize(
    "hq,hkv,d,m,bits,lens,block_t",
    [
        (8, 2, 128, 2, 8, [300, 77, 1], 64),  # PQCache default m = 2, b = 8; GQA 4
        (6, 2, 128, 4, 4, [150, 0, 149], 32),  # group of 3 (padded to 4); an empty request
        (4, 4, 64, 16, 8, [90, 33], 64),  # no GQA; 4 channels per sub-space (padded LUT dot)
        (8, 1, 96, 3, 2, [200], 128),  # head_dim 96 = 3 x 32 sub-spaces; 4 centroids
    ],
)
def test_pq_score_matches_ref(hq, hkv, d, m, bits, lens, block_t):
    lmax = max(lens) + 5  # padding past the longest request too
    q, cent, codes, lens_t = _pq_inputs(len(lens), hq, hkv, d, m, bits, lmax, lens, seed=hq * 100 + m)
    out = pq_score(q, cent, codes, lens_t, config=ScoreConfig(block_t=block_t, tiles=2))
    assert out.shape == (len(lens), hq, lmax) and out.dtype == torch.float32
    ref64 = pq_score_ref(q.cpu(), cent.cpu(), codes.cpu(), lens_t.cpu(), dtype=torch.float64)
    khat = _group_heads(pq_reconstruct_ref(cent.cpu(), codes.cpu()).double(), hq)
    bound = torch.einsum("bhd,bhld->bhl", q.cpu().double().abs(), khat.abs()) / math.sqrt(d)
    _check_scores(out, ref64, bound, d // m + m)


def test_pq_score_topk_agrees():
    lens = [257, 100]
    q, cent, codes, lens_t = _pq_inputs(2, 8, 2, 128, 4, 8, 257, lens, seed=11)  # 256^4 code words: no ties
    k = 16
    out, idx = pq_score(q, cent, codes, lens_t, top_k=k, config=ScoreConfig(block_t=64))
    ref = pq_score_ref(q.cpu(), cent.cpu(), codes.cpu(), lens_t.cpu(), dtype=torch.float64)
    ref_val, ref_idx = torch.topk(ref, k, dim=-1)
    assert idx.shape == (2, 8, k) and bool((idx.cpu() < lens_t.cpu().long()[:, None, None]).all())
    overlap = [len(set(a.tolist()) & set(r.tolist())) for a, r in zip(idx.cpu().reshape(-1, k), ref_idx.reshape(-1, k))]
    assert min(overlap) >= k - 1 and sum(overlap) >= 0.99 * k * len(overlap)
    got = torch.gather(ref, 2, idx.cpu()).sort(-1, descending=True).values
    assert torch.allclose(got, ref_val, rtol=0, atol=1e-5)


def test_pq_score_rejects_bad_shapes():
    q, cent, codes, lens_t = _pq_inputs(2, 4, 2, 64, 2, 4, 10, [10, 3], seed=0)
    with pytest.raises(ValueError):
        pq_score(q, cent, codes[..., :1], lens_t)
    with pytest.raises(ValueError):
        pq_score(q[:, :3], cent, codes, lens_t)
    with pytest.raises(TypeError):
        pq_score(q, cent, codes.to(torch.int32), lens_t)


# ----------------------------------------------------------------------------- quantized keys
@pytest.mark.parametrize(
    "hq,hkv,d,bits,partition,lens,block_t",
    [
        (8, 2, 128, 4, 64, [150, 77, 1], 64),  # HCAttention default: 4-bit, one plane = one partition
        (6, 2, 128, 2, 64, [130, 0], 64),  # 2-bit: a partition spans two planes; group of 3
        (4, 4, 128, 4, 32, [99], 32),  # a plane holds two partitions; no GQA
        (16, 2, 64, 8, 32, [70, 45], 64),  # 8-bit (one plane), group 8
        (8, 2, 128, 2, 128, [65, 200], 128),  # one partition per token
    ],
)
def test_qk_score_matches_ref(hq, hkv, d, bits, partition, lens, block_t):
    b, lmax = len(lens), max(lens) + 3
    gen = torch.Generator().manual_seed(hq * 1000 + bits * 10 + partition)
    q, k = randn(b, hq, d, gen=gen), randn(b, hkv, lmax, d, gen=gen)
    k[:, :, :, :8] += 3.0  # an offset channel group: min and scale terms both matter
    codes, kmin, kscale, _ = quantize_k(k, partition, bits, stochastic=False)
    lens_t = torch.tensor(lens, dtype=torch.int32, device=DEVICE)
    out = qk_score(q, codes, kmin, kscale, lens_t, partition, bits, config=ScoreConfig(block_t=block_t, tiles=2))
    assert out.shape == (b, hq, lmax) and out.dtype == torch.float32
    qc, cc, mc, sc = q.cpu(), codes.cpu(), kmin.cpu(), kscale.cpu()
    ref64 = qk_score_ref(qc, cc, mc, sc, lens_t.cpu(), partition, bits, dtype=torch.float64)
    # bound: sum_j |q_j| (|s_p c_j| + |m_p|)
    y = unpack_ref(cc, bits).double()
    scale = sc.double().repeat_interleave(partition, -1)
    mins = mc.double().repeat_interleave(partition, -1)
    parts = _group_heads(y * scale.abs() + mins.abs(), hq)
    bound = torch.einsum("bhd,bhld->bhl", qc.double().abs(), parts) / math.sqrt(d)
    _check_scores(out, ref64, bound, d + 2 * d // min(d * bits // 8, partition))
    # and the scores are those of the original keys up to the quantization error: half a step with
    # nearest rounding, plus the FP16 rounding of the stored scale (x levels at the top code) and min
    exact = torch.einsum("bhd,bhld->bhl", qc.double(), _group_heads(k.cpu().double(), hq)) / math.sqrt(d)
    kerr = _group_heads(0.5 * scale * (1 + (2**bits - 1) * 2.0**-10) + 2.0**-10 * mins.abs(), hq)
    qerr = torch.einsum("bhd,bhld->bhl", qc.double().abs(), kerr) / math.sqrt(d)
    fin = torch.isfinite(ref64)
    assert ((out.cpu().double() - exact).abs()[fin] <= qerr[fin] + 1e-4).all()


def test_qk_score_topk_agrees_and_matches_dequantized_attention_logits():
    lens = [300, 129]
    gen = torch.Generator().manual_seed(5)
    q, k = randn(2, 8, 128, gen=gen), randn(2, 2, 300, 128, gen=gen)
    codes, kmin, kscale, _ = quantize_k(k, 64, 4, stochastic=False)
    lens_t = torch.tensor(lens, dtype=torch.int32, device=DEVICE)
    out, idx = qk_score(q, codes, kmin, kscale, lens_t, 64, 4, top_k=12)
    khat = dequantize_k_ref(codes.cpu(), kmin.cpu(), kscale.cpu(), 64, 4)
    ref = torch.einsum("bhd,bhld->bhl", q.cpu().float(), _group_heads(khat, 8)) / math.sqrt(128)
    ref[1, :, 129:] = float("-inf")
    ref_idx = torch.topk(ref, 12, dim=-1).indices
    overlap = [
        len(set(a.tolist()) & set(r.tolist())) for a, r in zip(idx.cpu().reshape(-1, 12), ref_idx.reshape(-1, 12))
    ]
    assert min(overlap) >= 11 and sum(overlap) >= 0.99 * 12 * len(overlap)
    assert bool((idx.cpu()[1] < 129).all())


def test_qk_score_rejects_bad_shapes():
    q = randn(1, 4, 128)
    codes, kmin, kscale, _ = quantize_k(randn(1, 2, 10, 128), 64, 4, stochastic=False)
    lens = torch.tensor([10], dtype=torch.int32, device=DEVICE)
    with pytest.raises(ValueError):
        qk_score(q, codes, kmin, kscale, lens, 64, 2)  # 4-bit codes read as 2-bit
    with pytest.raises(ValueError):
        qk_score(q, codes, kmin, kscale, lens, 32, 4)  # metadata of PI = 64 read as 32
    with pytest.raises(ValueError):
        qk_score(q[:, :3], codes, kmin, kscale, lens, 64, 4)  # 3 query heads over 2 KV heads


# ----------------------------------------------------------------------------- work and profile
def test_work_formulas_per_unit():
    # PQ, m = 2, group 8: 2 code bytes + 8 FP32 scores per token and KV head; 32 gathers+adds
    assert pq_score_work(1, 1, 2, 8) == (34.0, 32.0)
    # 4-bit keys, PI = 64, group 8, D = 128: 0.5 + 4/64 + 32/128 bytes, 16 FLOPs per key element
    assert qk_score_work(1, 4, 64, 8, 128) == (0.8125, 16.0)


def test_build_profile_fits_scoring_keys():
    rows = []
    for kernel, part, bits, per_unit in (
        ("pq_score", 64, 8, 1e-11),
        ("pq_score", 16, 8, 2e-11),
        ("qk_score", 64, 4, 3e-13),
        ("qk_score", 64, 2, 2e-13),
        ("topk", 0, 32, 5e-12),
    ):
        for i, (bsz, ctx) in enumerate(((1, 4096), (8, 4096), (8, 32768), (16, 16384))):
            units = bsz * ctx * 8 * (128 if kernel == "qk_score" else 8 if kernel == "topk" else 1)
            rows.append(
                {
                    "phase": "score",
                    "kernel": kernel,
                    "batch": str(bsz),
                    "context_len": str(ctx),
                    "q_heads": "64",
                    "partition": str(part),
                    "bits": str(bits),
                    "units": str(units),
                    "time_us": str((4e-6 + per_unit * units) * 1e6),
                    "held_out": str(i == 1),
                }
            )
    prof = build_profile(
        rows,
        {
            "memory_gbps": 4000.0,
            "fp16_tflops": 700.0,
            "int8_tops": 900.0,
            "fp8_tflops": None,
            "launch_overhead_s": 5e-6,
        },
        {"git_rev": "x"},
    )
    want = {
        "score.pq": 1e-11,
        "score.pq_m8": 2e-11,
        "score.quantized_keys": 3e-13,
        "score.quantized_keys_2bit": 2e-13,
        "select.topk": 5e-12,
    }
    for key, spu in want.items():
        assert prof["kernels"][key]["s_per_unit"] == pytest.approx(spu, rel=1e-6)
        assert prof["kernels"][key]["overhead_s"] == pytest.approx(4e-6, rel=1e-6)


def test_derive_scales_scoring_keys_by_their_h200_units():
    """Scoring kernels are split like every kernel: their bytes at the copy bandwidth (PQ near it, quantized
    keys far below it), the quantized keys' tl.dot on the tensor cores, the rest on the CUDA cores."""
    from costmodel.kernel_work import WORK
    from kernels_calibration.derive import derive

    src = {
        "memory_gbps": 4220.4,
        "matmul_fp16_tflops": 693.4,
        "matmul_int8_tops": 940.0,
        "matmul_fp8_tflops": 1270.0,
        "launch_overhead_s": 5e-6,
        "provenance": {},
        "kernels": {
            # PQ at 90% of the copy bandwidth (memory-bound); quantized keys at 20% (CUDA-core bound)
            "score.pq": {"overhead_s": 4e-6, "s_per_unit": 34.0 / (0.9 * 4220.4e9)},
            "score.quantized_keys": {"overhead_s": 4e-6, "s_per_unit": 0.8125 / (0.2 * 4220.4e9)},
        },
    }
    assert WORK["score.pq"].hbm_bytes == 34.0 and WORK["score.quantized_keys"].hbm_bytes == 0.8125
    a100 = derive(src, "a100_40gb")
    pq, qk = a100["kernels"]["score.pq"], a100["kernels"]["score.quantized_keys"]
    assert pq["bound_by"] == "hbm" and pq["parts_s_per_unit"]["hbm"] / pq["s_per_unit"] > 0.7
    assert pq["parts_s_per_unit"]["hbm"] == pytest.approx(34.0 / (1555 * 4220.4 / 4800 * 1e9), rel=1e-6)
    assert qk["bound_by"] == "alu" and qk["parts_s_per_unit"]["fp16_tensor"] > 0
    assert qk["parts_s_per_unit"]["alu"] == pytest.approx(
        qk["source_parts_s_per_unit"]["alu"] * (132 * 1.98) / (108 * 1.41), rel=1e-9
    )


def test_profile_harness_scoring_rows_and_merged_refit(tmp_path, monkeypatch):
    """The sweep's code path (inputs, wrapper calls, rows) without a GPU: time_graph replaced by one
    call of each step; then --fit-only over the committed H200 rows plus the new rows keeps every
    old key and adds the scoring keys."""
    import csv
    from pathlib import Path

    import kernels_calibration.measure as measure
    from kernels_calibration.profile import main, measure_scoring

    calls = []

    def fake_time_graph(step, n_rot, replays=30):
        step(0)
        calls.append(n_rot)
        return 1e-5

    monkeypatch.setattr(measure, "time_graph", fake_time_graph)
    ms = measure_scoring(
        ("pq_score", "qk_score", "topk"),
        1,
        70,
        q_heads=16,
        kv_heads=2,
        device=DEVICE,
        configs={"pq_score": [{"block_t": 32}], "qk_score": [{"block_t": 32}, {"block_t": 64}]},
    )
    assert [m.kernel for m in ms] == ["pq_score", "qk_score", "topk"] and len(calls) == 4
    peaks = {"memory_gbps": 4220.0, "fp16_tflops": 690.0, "int8_tops": 940.0, "fp8_tflops": None}
    rows = [m.row(peaks) for m in ms]
    assert rows[0]["units"] == 70 * 2 and rows[1]["units"] == 70 * 2 * 128 and rows[2]["units"] == 70 * 16
    assert rows[0]["partition"] == 64 and rows[1]["bits"] == 4 and rows[2]["top_k"] == 14
    # a fake sweep: the same rows at four sizes (units and time scaled), two held out
    new = tmp_path / "rows.csv"
    with new.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]) + ["top_k", "subspaces", "held_out"])
        w.writeheader()
        for i, scale in enumerate((1, 4, 16, 64)):
            for r in rows:
                w.writerow(
                    {
                        **r,
                        "batch": scale,
                        "units": r["units"] * scale,
                        "time_us": 4.0 + r["units"] * scale * 1e-4,
                        "held_out": i == 2,
                    }
                )
    # the committed H200 rows without their own scoring rows (measured since), so the fake sweep alone
    # sets the scoring fits; peaks.json must sit beside the first file
    h200 = Path(__file__).resolve().parents[2] / "kernels_calibration" / "profiles" / "h200"
    old_dir = tmp_path / "committed"
    old_dir.mkdir()
    (old_dir / "peaks.json").write_text((h200 / "peaks.json").read_text())
    with (h200 / "profile_rows.csv").open() as f:
        reader = csv.DictReader(f)
        kept = [r for r in reader if r["phase"] != "score"]
        fields = reader.fieldnames
    assert kept and len(kept) < sum(1 for _ in (h200 / "profile_rows.csv").open()) - 1
    committed = old_dir / "profile_rows.csv"
    with committed.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=fields)
        w.writeheader()
        w.writerows(kept)
    assert main(["--fit-only", str(committed), str(new), "--out", str(tmp_path / "fit")]) == 0
    prof = __import__("json").loads((tmp_path / "fit" / "profile.json").read_text())
    for key in (
        "decode_attn.hack",
        "prefill_attn.fp16",
        "quantize.kv",
        "score.pq",
        "score.quantized_keys",
        "select.topk",
    ):
        assert key in prof["kernels"], key
    assert prof["kernels"]["score.pq"]["s_per_unit"] == pytest.approx(1e-10, rel=1e-6)
