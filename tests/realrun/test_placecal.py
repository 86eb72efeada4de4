"""realrun.placecal: the KV placement probe's rows (CPU smoke: the tiny model) and its fit (a made-up file)."""

from __future__ import annotations

import csv

import pandas as pd
import pytest

from realrun import placecal


def test_smoke_rows_carry_the_bytes_the_format_moves(tmp_path):
    """The tiny model (1 layer, 1 KV head, head_dim 128) in FP16 holds 512 B per token (K and V, 2 B each): a join
    of 40 prompt tokens moves 20,480 B; a move copies whole blocks of the open V (64 tokens): 32,768 B. Two
    segments each (K, V); a launch row per repeat."""
    out = tmp_path / "placecal.csv"
    assert placecal.main(["--smoke", "--methods", "baseline", "--out", str(out)]) == 0
    d = pd.read_csv(out)
    assert set(d.kind) == {"join", "move", "launch"}
    join = d[(d.kind == "join") & (d.tokens == 40)]
    move = d[(d.kind == "move") & (d.tokens == 40)]
    assert set(join.bytes) == {512 * 40} and set(join.segments) == {2}
    assert set(move.bytes) == {512 * 64}
    assert len(join) == 2 and len(d[d.kind == "launch"]) == 2  # the smoke's two repeats
    assert (d.host_s > 0).all()


def test_fit_recovers_a_known_rate_and_launch(tmp_path):
    """Copies made up as 10 us + bytes over 500 GB/s: the fit returns both, per set and method and over all; the
    launch's median CPU time per set."""
    rows = []
    for method in ("baseline", "hack"):
        for kind in ("join", "move"):
            for tokens, nbytes in ((256, 8e6), (2048, 64e6), (16384, 512e6)):
                for rep in range(3):
                    gpu = 10e-6 + nbytes / 500e9
                    rows.append(
                        dict(
                            kind=kind,
                            set="m:8",
                            method=method,
                            layers=8,
                            tokens=tokens,
                            bytes=nbytes,
                            segments=2,
                            host_s=3e-4,
                            gpu_s=gpu,
                            idle_gpu_s=gpu + 2e-4,
                            rep=rep,
                        )
                    )
        for rep, host in enumerate((40e-6, 50e-6, 60e-6)):
            rows.append(
                dict(
                    kind="launch",
                    set="m:8",
                    method=method,
                    layers=8,
                    tokens=2048,
                    bytes=0,
                    segments=0,
                    host_s=host,
                    gpu_s=float("nan"),
                    idle_gpu_s=float("nan"),
                    rep=rep,
                )
            )
    path = tmp_path / "made_up.csv"
    with path.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    fit = placecal.fit([path])
    assert fit["gb_per_s"] == pytest.approx(500, rel=1e-9)
    assert fit["fixed_s"] == pytest.approx(10e-6, rel=1e-6)
    assert fit["per"][("m:8", "hack")]["gb_per_s"] == pytest.approx(500, rel=1e-9)
    assert fit["launch_s"]["m:8"] == pytest.approx(50e-6)
    assert "500 GB/s" in placecal.format_fit(fit)


def test_fit_refuses_a_file_that_is_not_a_probes(tmp_path, capsys):
    bad = tmp_path / "x.csv"
    bad.write_text("a,b\n1,2\n")
    assert placecal.main(["--fit", str(bad)]) == 2
    err = capsys.readouterr().err
    assert "x.csv" in err and "no column 'kind'" in err  # one line naming the file and what it lacks
    assert len(err.strip().splitlines()) == 1
