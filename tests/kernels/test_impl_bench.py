"""The implementation benchmark's reference paths compute what their formats define, at tiny shapes."""

import json

import torch

from kernels_calibration import impl_bench as ib


def test_kvquant_reference_path_matches_its_definition():
    cache = ib.make_kvquant(2, 2, 37, 128, 0.02, seed=3, device="cpu")
    ref = ib.KVQuantReference(cache)
    poison = torch.full_like(ref.k, float("nan"))
    ref.k.copy_(poison)
    ref.v.copy_(poison)
    ref.lut_dequant()
    ref.outliers_csr()
    k64, v64 = ib.kvquant_ref64(cache)
    # fp16 tables and scales: the torch path rounds once per product (V) and never for K
    assert torch.equal(ref.k.double(), k64.half().double())
    assert float((ref.v.double() - v64).abs().max()) <= 2e-3 * float(v64.abs().max())
    q = torch.randn((2, 8, 128)).half()
    out = ref.sdpa(q).double()
    kk = k64.repeat_interleave(4, 1)
    vv = v64.repeat_interleave(4, 1)
    p = torch.softmax(torch.einsum("bhd,bhtd->bht", q.double(), kk) / 128**0.5, -1)
    want = torch.einsum("bht,bhtd->bhd", p, vv)
    assert float((out - want).norm() / want.norm()) < 5e-3


def test_outliers_are_the_requested_fraction_in_csr():
    cache = ib.make_kvquant(1, 2, 50, 128, 0.01, seed=1, device="cpu")
    rows = 1 * 2 * 50
    for n in ("k", "v"):
        crow, col = cache[f"{n}_crow"], cache[f"{n}_col"]
        assert crow[0] == 0 and int(crow[-1]) == cache[f"{n}_nnz"] == round(0.01 * rows * 128)
        assert bool((crow.diff() >= 0).all()) and int(col.max()) < 128 and len(crow) == rows + 1


def test_fit_recovers_a_two_coefficient_line():
    rows = [{"implementation": "x", "kernel": "k", "units": u, "time_s": 3e-6 + 2e-12 * u} for u in (1e6, 4e6, 16e6)]
    f = ib.fit(rows)["x"]["k"]
    assert abs(f["overhead_s"] - 3e-6) < 1e-9 and abs(f["s_per_unit"] - 2e-12) < 1e-16


def test_smoke_writes_rows_fits_and_provenance(tmp_path):
    out = tmp_path / "impl.json"
    assert ib.main(["--out", str(out), "--smoke", "--reps", "10"]) == 0
    doc = json.loads(out.read_text())
    assert set(doc["fits"]) == {"kvquant_reference", "no_rqe_requantize"}
    assert set(doc["fits"]["kvquant_reference"]) == {"lut_dequant", "outliers_csr", "sdpa_fp16", "total"}
    assert set(doc["fits"]["no_rqe_requantize"]) == {"requantize_block", "append_rqe", "append_no_rqe"}
    assert {"gpu_name", "driver", "torch", "triton", "git_rev", "date", "command"} <= set(doc["provenance"])
    assert all(r["time_s"] > 0 for r in doc["rows"])
