"""realrun.steps: a step-timed recording's iterations split into host serial, KV placement and step graph.

A hand-made trace of six iterations whose every part is known: the kinds (steady, join, compaction, link busy, and
the unclassed ones next to a join or before a prefill), the loop gap (none where a prefill ran in it), the host
serial (the gap before an iteration plus its issue) and its growth per running request."""

from __future__ import annotations

import math

import pandas as pd
import pytest

from realrun.steps import iteration_parts, main, summarise

NAN = float("nan")


def _write(tmp_path, steps=True):
    # iterations: 10 ms each; the gap before each 0.5 + 0.01 x its batch ms (iteration 3's also holds a prefill)
    batch = [2, 4, 6, 6, 5, 5]
    start, t = [], 0.0
    for i, b in enumerate(batch):
        if i:
            t += 0.0005 + 0.00001 * b + (0.020 if i == 3 else 0.0)
        start.append(t)
        t += 0.010
    it = pd.DataFrame(
        {
            "iteration": range(6),
            "start_s": start,
            "end_s": [s + 0.010 for s in start],
            "batch_size": batch,
            "context_tokens": [100 * b for b in batch],
            "peak_memory_bytes": 0,
        }
    )
    it.to_csv(tmp_path / "iterations.csv", index=False)
    # one request prefilled between iterations 2 and 3; one transfer in flight across iteration 5
    pre = start[2] + 0.010 + 0.0001
    rq = pd.DataFrame(
        {
            "request_id": [0, 1],
            "prefill_start_s": [-1.0, pre],
            "transfer_start_s": [-0.5, start[5] + 0.001],
            "transfer_end_s": [-0.4, start[5] + 0.002],
        }
    )
    rq.to_csv(tmp_path / "requests.csv", index=False)
    if steps:
        pd.DataFrame(
            {
                "iteration": range(6),
                "host_issue_s": [0.0003 + 0.00001 * b for b in batch],
                "place_gpu_s": [0.0002, 0.0002, 0.0, 0.0, 0.0001, 0.0],
                "step_gpu_s": 0.009,
                "joins": [1, 1, 0, 0, 0, 0],
                "compactions": [0, 0, 0, 0, 1, 0],
                "batch_bucket": batch,
                "context_bucket": 1024,
            }
        ).to_csv(tmp_path / "steps.csv", index=False)
    return start


def test_kinds_gaps_and_serial(tmp_path):
    _write(tmp_path)
    p = iteration_parts(tmp_path)
    assert list(p.kind) == ["join", "join", "steady", "steady", "compaction", "link busy"]
    # the gap after iteration 2 held the prefill: no loop gap there, no host serial for iteration 3
    assert math.isnan(p.loop_gap_s[2]) and math.isnan(p.host_serial_s[3]) and math.isnan(p.loop_gap_s[5])
    assert p.loop_gap_s[0] == pytest.approx(0.0005 + 0.00004)
    # iteration 4 (batch 5): the gap before it plus its issue
    assert p.host_serial_s[4] == pytest.approx(0.0005 + 0.00005 + 0.0003 + 0.00005)
    assert math.isnan(p.host_serial_s[0])


def test_summary_slope(tmp_path):
    _write(tmp_path)
    # the steady iterations with a host serial: only iteration 2 (3's gap held the prefill): no slope from one batch
    s = summarise(tmp_path)
    assert s["kinds"]["steady"]["n"] == 2 and "host_serial_us_per_request" not in s
    assert s["kinds"]["steady"]["host_serial_ms"] == pytest.approx(0.8 + 0.02 * 6)
    st = pd.read_csv(tmp_path / "steps.csv")
    st.loc[4, ["compactions", "place_gpu_s"]] = [0, 0.0]  # iteration 4 becomes steady
    st.to_csv(tmp_path / "steps.csv", index=False)
    s = summarise(tmp_path)
    # host serial 0.8 ms + 20 µs per running request at batches 6 and 5
    assert s["kinds"]["steady"]["n"] == 3
    assert s["host_serial_us_per_request"] == pytest.approx(20.0, rel=1e-6)
    assert s["host_serial_ms_at_0"] == pytest.approx(0.8, rel=1e-6)


def test_mismatch_and_cli(tmp_path, capsys):
    _write(tmp_path, steps=False)
    assert main([str(tmp_path)]) == 2
    assert "no steps.csv" in capsys.readouterr().err
    _write(tmp_path)
    pd.read_csv(tmp_path / "steps.csv").head(5).to_csv(tmp_path / "steps.csv", index=False)
    with pytest.raises(ValueError, match="5 rows"):
        iteration_parts(tmp_path)
    assert main([str(tmp_path)]) == 2
    assert "steps.csv: 5 rows where iterations.csv has 6" in capsys.readouterr().err
    for col, value in (("step_gpu_s", "x"), ("host_issue_s", -1.0), ("joins", float("nan"))):
        _write(tmp_path)
        st = pd.read_csv(tmp_path / "steps.csv")
        st[col] = st[col].astype(object)
        st.loc[3, col] = value
        st.to_csv(tmp_path / "steps.csv", index=False)
        assert main([str(tmp_path)]) == 2
        assert f"steps.csv: line 5: {col}" in capsys.readouterr().err
    _write(tmp_path)
    assert main([str(tmp_path)]) == 0
    assert "join" in capsys.readouterr().out


def test_step_times_refused_without_cuda(tmp_path, capsys):
    from realrun.__main__ import main as realrun_main

    args = ["--method", "hack", "--model", "tiny", "--layers", "1", "--rate", "1", "--requests", "2"]
    args += ["--link-gbps", "10", "--kv-capacity-gib", "1", "--out", str(tmp_path), "--device", "cpu", "--step-times"]
    with pytest.raises(SystemExit) as e:
        realrun_main(args)
    assert e.value.code == 2 and "CUDA events" in capsys.readouterr().err
    assert not any(tmp_path.iterdir())
