"""realrun.prefillcal: the prefill probe's rows (CPU smoke: the tiny model) and its refusal without a GPU."""

from __future__ import annotations

import pandas as pd
import pytest
import torch

from realrun import prefillcal


def test_smoke_rows_per_method_length_and_mode(tmp_path):
    out = tmp_path / "prefillcal.csv"
    assert prefillcal.main(["--smoke", "--methods", "baseline", "--out", str(out)]) == 0
    d = pd.read_csv(out)
    # per length (the smoke's 40 and 90 tokens): one to warm, then one back to back and one rested
    assert list(d.tokens) == [40, 40, 40, 90, 90, 90]
    assert list(d["mode"]) == ["warm", "sustained", "rested"] * 2
    assert (d.prefill_s > 0).all() and (d.total_s >= d.prefill_s).all()
    assert d.unix_s.is_monotonic_increasing


@pytest.mark.skipif(torch.cuda.is_available(), reason="the refusal is for a machine without CUDA")
def test_refused_without_a_gpu(tmp_path, capsys):
    assert prefillcal.main(["--out", str(tmp_path / "x.csv")]) == 2
    assert capsys.readouterr().err.strip() == "prefillcal needs a CUDA GPU"
    assert not (tmp_path / "x.csv").exists()
