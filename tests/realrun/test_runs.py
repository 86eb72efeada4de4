"""End-to-end runs of the tiny model on the CPU: trace files, every request finishes once, ordered
timestamps, FIFO memory admission within capacity, reproducible workload, decode-step correctness."""

import csv
import json
import math
import os

import pytest

from realrun.check import check
from realrun.kvformats import METHODS
from realrun.model import model_shape
from realrun.runner import run_set
from realrun.trace import ITERATION_COLUMNS, META_KEYS, OPTIONAL_META_KEYS, REQUEST_COLUMNS
from realrun.workload import poisson_workload

N = 5
PROMPTS = (20, 100)
OUTPUTS = (2, 4)
ORDER = [
    "arrival_s",
    "prefill_start_s",
    "prefill_end_s",
    "quantize_end_s",
    "transfer_start_s",
    "transfer_end_s",
    "decode_start_s",
    "finish_s",
]


def _read(path):
    with open(path) as f:
        rows = list(csv.reader(f))
    return rows[0], [dict(zip(rows[0], r)) for r in rows[1:]]


@pytest.fixture(scope="module")
def traces(tmp_path_factory):
    out = tmp_path_factory.mktemp("runs")
    paths = run_set(
        "tiny",
        2,
        ["baseline", "kvquant", "hack"],
        [30.0],
        link_gbps=0.5,
        n_requests=N,
        seed=3,
        kv_capacity_gib=1.0,
        out=out,
        device="cpu",
        prompt_range=PROMPTS,
        output_range=OUTPUTS,
        do_warmup=False,
        chunk_bytes=1 << 14,
        log=lambda s: None,
    )
    return {p.name.split("_")[2]: p for p in paths}


def test_trace_files_have_the_exact_columns(traces):
    for method, path in traces.items():
        assert sorted(p.name for p in path.iterdir()) == ["iterations.csv", "meta.json", "requests.csv"]
        assert _read(path / "requests.csv")[0] == REQUEST_COLUMNS
        assert _read(path / "iterations.csv")[0] == ITERATION_COLUMNS
        meta = json.loads((path / "meta.json").read_text())
        assert list(meta) == META_KEYS + OPTIONAL_META_KEYS
        assert 0 < meta["wall_end_s"] - meta["wall_start_s"] < 600  # the run's span by the wall clock
        assert meta["method"] == method and meta["requests"] == N and meta["layers"] == 2
        assert "complete=True" in meta["notes"]


def test_every_request_finishes_once_with_ordered_times(traces):
    work = poisson_workload(N, 30.0, 3, PROMPTS, OUTPUTS)
    for path in traces.values():
        _, rows = _read(path / "requests.csv")
        assert sorted(int(r["request_id"]) for r in rows) == list(range(N))
        for r, w in zip(sorted(rows, key=lambda r: int(r["request_id"])), work):
            t = [float(r[c]) for c in ORDER]
            assert all(math.isfinite(x) for x in t)
            assert t == sorted(t), r
            assert float(r["first_token_s"]) == float(r["prefill_end_s"])
            assert (int(r["prompt_tokens"]), int(r["output_tokens"])) == (w.prompt_tokens, w.output_tokens)
            assert float(r["arrival_s"]) == pytest.approx(w.arrival_s)


def test_iterations_account_for_every_token(traces):
    for path in traces.values():
        _, reqs = _read(path / "requests.csv")
        _, its = _read(path / "iterations.csv")
        # one decode iteration per generated token after the first (prefill emits it)
        assert sum(int(i["batch_size"]) for i in its) == sum(int(r["output_tokens"]) - 1 for r in reqs)
        starts = [float(i["start_s"]) for i in its]
        ends = [float(i["end_s"]) for i in its]
        assert all(s < e for s, e in zip(starts, ends))
        assert all(e <= s2 for e, s2 in zip(ends, starts[1:]))
        # context: prompt + tokens so far, summed over the batch; bounded by the requests' totals
        assert max(int(i["context_tokens"]) for i in its) <= sum(
            int(r["prompt_tokens"]) + int(r["output_tokens"]) for r in reqs
        )


def test_prefill_and_decode_take_turns(traces):
    """One process, one GPU: no prefill overlaps a decode iteration."""
    for path in traces.values():
        _, reqs = _read(path / "requests.csv")
        _, its = _read(path / "iterations.csv")
        for r in reqs:
            a, b = float(r["prefill_start_s"]), float(r["quantize_end_s"])
            for i in its:
                assert float(i["end_s"]) <= a or float(i["start_s"]) >= b


def test_memory_admission_never_exceeds_capacity(tmp_path):
    shape = model_shape("tiny", 2)
    meth = METHODS["baseline"](shape, "cpu", 1, 256)
    prompts = (90, 100)  # similar sizes: the capacity below holds one request, never two
    work = poisson_workload(5, 200.0, 5, prompts, OUTPUTS)
    foot = {w.request_id: meth.footprint_bytes(w.prompt_tokens + w.output_tokens) for w in work}
    cap = 1.5 * max(foot.values())
    assert 2 * min(foot.values()) > cap
    (path,) = run_set(
        "tiny",
        2,
        ["baseline"],
        [200.0],
        link_gbps=0.05,
        n_requests=5,
        seed=5,
        kv_capacity_gib=cap / (1 << 30),
        out=tmp_path,
        device="cpu",
        prompt_range=prompts,
        output_range=OUTPUTS,
        do_warmup=False,
        chunk_bytes=1 << 14,
        log=lambda s: None,
    )
    _, rows = _read(path / "requests.csv")
    meta = json.loads((path / "meta.json").read_text())
    assert meta["kv_capacity_bytes"] == int(cap)
    events = []
    for r in rows:
        events.append((float(r["transfer_start_s"]), 1, int(r["request_id"])))
        events.append((float(r["finish_s"]), 0, int(r["request_id"])))  # releases sort first at a tie
    held = 0
    for _, kind, rid in sorted(events):
        held += foot[rid] if kind else -foot[rid]
        assert held <= meta["kv_capacity_bytes"]
    # FIFO, one at a time: each transfer starts once the previous request has finished
    order = sorted(rows, key=lambda r: float(r["prefill_start_s"]))
    for prev, nxt in zip(order, order[1:]):
        assert float(nxt["transfer_start_s"]) >= float(prev["finish_s"])


def test_workload_is_reproducible_and_method_independent():
    a = poisson_workload(20, 2.0, 7)
    assert a == poisson_workload(20, 2.0, 7)
    assert a != poisson_workload(20, 2.0, 8)
    assert all(1024 <= w.prompt_tokens <= 8192 and 16 <= w.output_tokens <= 128 for w in a)
    with pytest.raises(ValueError):
        poisson_workload(3, 1.0, 0, output_range=(1, 4))


def test_wire_and_footprint_bytes():
    s = model_shape("llama-3.1-8b")
    per_elem_tokens = 2 * s.layers * s.kv_dim  # K and V elements per token
    base = METHODS["baseline"](s, "cpu", 1, 64)
    hack = METHODS["hack"](s, "cpu", 1, 64)
    kvq = METHODS["kvquant"](s, "cpu", 1, 64)
    assert base.wire_bytes(4096) == 2 * 4096 * per_elem_tokens
    # 2-bit codes + fp16 min/scale per 64 (+ uint8 sums for HACK), no tail at a multiple of 64
    assert kvq.wire_bytes(4096) == pytest.approx(4096 * per_elem_tokens * (0.25 + 4 / 64), rel=1e-3)
    assert hack.wire_bytes(4096) == pytest.approx(4096 * per_elem_tokens * (0.25 + 5 / 64), rel=1e-3)
    # footprint reserves a full 64-token FP16 V tail
    tail = 64 * s.layers * s.kv_dim * 2
    assert hack.footprint_bytes(4096) == pytest.approx(hack.wire_bytes(4096) + tail, rel=1e-3)


def test_one_decode_step_matches_references():
    assert check("tiny", 2, [40, 97, 130], "cpu", log=lambda s: None)


def test_cli_single_run_writes_the_trace_into_out(tmp_path):
    from realrun.__main__ import main

    out = tmp_path / "trace"
    assert (
        main(
            [
                "--method",
                "baseline",
                "--model",
                "tiny",
                "--layers",
                "1",
                "--rate",
                "50",
                "--link-gbps",
                "1",
                "--requests",
                "2",
                "--seed",
                "0",
                "--kv-capacity-gib",
                "0.5",
                "--out",
                str(out),
                "--device",
                "cpu",
                "--prompt-range",
                "20",
                "40",
                "--output-range",
                "2",
                "3",
            ]
        )
        == 0
    )
    meta = json.loads((out / "meta.json").read_text())
    assert (meta["method"], meta["model"], meta["layers"], meta["requests"]) == ("baseline", "tiny", 1, 2)
    assert meta["kv_capacity_bytes"] == (1 << 29)
    assert len(_read(out / "requests.csv")[1]) == 2


CAN_PIN = hasattr(os, "sched_setaffinity") and len(os.sched_getaffinity(0)) >= 2


@pytest.mark.skipif(not CAN_PIN, reason="needs os.sched_setaffinity and two CPUs")
def test_a_pinned_run_says_where_its_threads_ran_and_gives_the_cpus_back(tmp_path):
    """--pin-threads: the loop and the link thread each on one CPU of its own for the run (the last two this process
    may use), said in meta.json's notes; the loop's CPUs are what they were afterwards."""
    from realrun.__main__ import main

    before = os.sched_getaffinity(0)
    first, second = sorted(before)[-2:]
    out = tmp_path / "trace"
    args = ["--method", "baseline", "--model", "tiny", "--layers", "1", "--rate", "50", "--link-gbps", "1"]
    args += ["--requests", "2", "--seed", "0", "--kv-capacity-gib", "0.5", "--out", str(out), "--device", "cpu"]
    assert main([*args, "--prompt-range", "20", "40", "--output-range", "2", "3", "--pin-threads"]) == 0
    notes = json.loads((out / "meta.json").read_text())["notes"]
    assert f"threads: the loop on CPU {first}, the link thread on CPU {second} (--pin-threads)" in notes
    assert os.sched_getaffinity(0) == before
    with pytest.raises(SystemExit):
        main([*args, "--pin-threads", "--placement", "separate"])
