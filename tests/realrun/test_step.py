"""The decode step's pieces: the one-launch KV copy, the buckets, dense slots under joins and
finishes, prefill back-pressure, and eager vs graphs (padded) runs giving the same tokens."""

import json

import pytest
import torch

from realrun import kvcopy
from realrun.harness import GIB, Harness, RunConfig, _Req
from realrun.model import RandomLlama, model_shape
from realrun.runner import run_set
from realrun.step import CTX_BUCKETS, batch_buckets, bucket, ctx_buckets
from realrun.workload import Request, poisson_workload


def _rand(shape, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    if dtype == torch.uint8:
        return torch.randint(0, 256, shape, dtype=dtype, generator=g)
    return torch.randn(shape, generator=g).to(dtype)


def test_kvcopy_one_launch_matches_per_segment_copies():
    # odd row counts (byte runs of any length and start), three dtypes, strided destinations in a
    # [layers, slots, heads, rows, cols] pool, two sources in one launch
    layers, heads, slots = 3, 2, 4
    parts = [(torch.uint8, 70, 5), (torch.float16, 70, 2), (torch.uint8, 3, 128), (torch.float16, 64, 128)]
    pools = [_rand((layers, slots, heads, rows, cols), dt, i) for i, (dt, rows, cols) in enumerate(parts)]
    expect = [p.clone() for p in pools]
    srcs, segs, pairs = [], [], []
    for j, (rows_used, slot) in enumerate([(37, 1), (61, 3)]):
        for i, (dt, rows, cols) in enumerate(parts):
            n = min(rows_used, rows)
            src = _rand((layers, heads, n, cols), dt, 100 + 10 * j + i)
            srcs.append(src)
            segs.append(kvcopy.segment(src, pools[i][:, slot], n))
            pairs.append((src, expect[i][:, slot], n))
    # and a move between two slots of the same pool (compaction)
    segs.append(kvcopy.segment(pools[0][:, 0], pools[0][:, 2], 11))
    pairs.append((expect[0][:, 0].clone(), expect[0][:, 2], 11))
    moved = kvcopy.kvcopy(segs, layers, heads, torch.device("cpu"))
    kvcopy.kvcopy_ref(pairs)
    for got, want in zip(pools, expect):
        assert torch.equal(got, want)
    assert moved == sum(s[2] for s in segs) * layers * heads


def test_kvcopy_refuses_mismatched_segments():
    a = torch.zeros((2, 2, 4, 8), dtype=torch.uint8)
    with pytest.raises(ValueError):
        kvcopy.segment(a, torch.zeros((2, 2, 4, 8), dtype=torch.float16), 2)
    with pytest.raises(ValueError):
        kvcopy.segment(a, torch.zeros((2, 2, 2, 8), dtype=torch.uint8), 3)
    assert kvcopy.segment(a, a.clone(), 0) is None


def test_buckets():
    assert batch_buckets(20) == [1, 2, 4, 8, 16, 20]
    assert batch_buckets(64)[-3:] == [48, 56, 64]
    assert bucket(batch_buckets(64), 33) == 40
    cs = ctx_buckets(5000)
    assert cs[-1] == 5000 and cs[:8] == [256, 512, 768, 1024, 1280, 1536, 1792, 2048]
    assert all(b > a for a, b in zip(CTX_BUCKETS, CTX_BUCKETS[1:]))
    # a context bucket's grid is at most ~12.5 % wider than the true longest context above 2K
    assert all(b / a <= 1.125 + 256 / a for a, b in zip(CTX_BUCKETS[7:], CTX_BUCKETS[8:]))
    with pytest.raises(ValueError):
        bucket(cs, 5001)


def test_slots_stay_dense_under_joins_and_finishes():
    shape = model_shape("tiny", 1)
    model = RandomLlama(shape, "cpu", seed=2, max_positions=256)
    h = Harness(
        model,
        RunConfig(
            method="baseline", link_gbps=1.0, kv_capacity_bytes=GIB, max_decode_batch=6, max_total_tokens=120, seed=2
        ),
    )
    h.t0 = 0.0
    outs = [2, 5, 3, 6, 2, 4]
    reqs = [_Req(Request(i, 0.0, 20 + 7 * i, o)) for i, o in enumerate(outs)]
    for r in reqs:
        h.prefill([r])
        r.recv = r.send
    pending = list(reqs)
    joins = [pending[:3], [], pending[3:5], [pending[5]], [], [], [], []]
    for join in joins:
        if not join and not any(h.slots):
            break
        row, finished = h.decode_iteration(join)
        n = row[2]
        batch = [r for r in h.slots if r is not None] + finished
        # the iteration ran slots 0..n-1, all occupied; finished requests leave holes until the next one
        assert sorted(r.slot for r in batch) == list(range(n)) and n == len(h.slots)
        assert row[3] == sum(r.stored for r in batch)
    moves = sum(m for _, m in h.moves)
    assert moves >= 1  # request 0 (2 tokens) finishes in slot 0 while later slots still run
    h.close()


def test_prefill_waits_while_parked_kv_would_exceed_its_budget(tmp_path):
    # a slow link and a budget under two requests' KV (tiny, 1 layer: 512 B per token): a prefill starts
    # only once nothing is parked
    prompts, outputs = (90, 100), (2, 3)
    (path,) = run_set(
        "tiny",
        1,
        ["baseline"],
        [500.0],
        link_gbps=0.05,
        n_requests=4,
        seed=4,
        kv_capacity_gib=1.0,
        out=tmp_path,
        device="cpu",
        prompt_range=prompts,
        output_range=outputs,
        do_warmup=False,
        chunk_bytes=1 << 14,
        prefill_host_memory_gib=1.5 * 100 * 512 / GIB,
        log=lambda s: None,
    )
    import csv

    rows = sorted(csv.DictReader(open(path / "requests.csv")), key=lambda r: float(r["prefill_start_s"]))
    for prev, nxt in zip(rows, rows[1:]):
        assert float(nxt["prefill_start_s"]) >= float(prev["transfer_end_s"])
    meta = json.loads((path / "meta.json").read_text())
    assert meta["prefill_host_memory_bytes"] == int(1.5 * 100 * 512)


@pytest.mark.parametrize("method", ["baseline", "hack"])
def test_eager_and_padded_graph_mode_give_the_same_tokens(tmp_path, method):
    """On the CPU the graphs mode runs the padded (batch, context) bucket eagerly: padding rows and
    the bucket's max_len must not change any request's tokens or the trace's shape."""
    work = poisson_workload(5, 50.0, 6, (20, 90), (2, 5))
    out = {}
    for mode in ("eager", "graphs"):
        cfg = RunConfig(
            method=method,
            link_gbps=100.0,
            kv_capacity_bytes=GIB,
            max_decode_batch=5,
            max_total_tokens=95,
            seed=6,
            decode_mode=mode,
        )
        h = Harness(RandomLlama(model_shape("tiny", 1), "cpu", seed=6, max_positions=160), cfg)
        toks = []
        orig = h.decode_iteration

        def spy(joining, orig=orig, toks=toks, h=h):
            row, fin = orig(joining)
            toks.append(sorted((r.req.request_id, r.tok) for r in h.slots if r is not None))
            return row, fin

        h.decode_iteration = spy
        rows, iters, complete = h.run(work)
        assert complete
        out[mode] = toks
        h.close()

    # iteration timing differs run to run (arrivals are wall-clock), so compare each request's tokens
    def per_request(seq):
        d = {}
        for it in seq:
            for rid, tok in it:
                d.setdefault(rid, []).append(tok)
        return d

    e, g = per_request(out["eager"]), per_request(out["graphs"])
    for rid in e:
        n = min(len(e[rid]), len(g[rid]))
        assert e[rid][:n] == g[rid][:n]


@pytest.mark.parametrize("method,stream", [("baseline", False), ("kvquant", True)])
def test_separate_placement_two_processes(tmp_path, method, stream):
    """Two processes on the CPU (a TCP socket on 127.0.0.1): every request finishes once, its times
    in order, the decode side admits by FIFO within capacity, and the trace says where it ran. What the
    protocol orders is checked, not what the two processes' speeds decide: a streamed request is announced
    at its prefill's start, so it is admitted after that (whether its bytes start to leave before the prefill
    ends depends on how fast the decode process answers, which a loaded machine changes: that assert failed
    under load); an unstreamed one is announced once its KV is encoded."""
    import csv
    import math

    from realrun.separate import run_separate

    path = run_separate(
        "tiny",
        1,
        method,
        40.0,
        1.0,
        4,
        3,
        1.0,
        tmp_path / "t",
        devices=("cpu", "cpu"),
        prompt_range=(20, 60),
        output_range=(2, 3),
        max_decode_batch=4,
        chunk_bytes=1 << 12,
        time_limit_s=600,  # a hang guard: the run takes 20 s of wall time at load 14
        warmup=False,
        stream_layers=stream,
        log=lambda s: None,
    )
    rows = list(csv.DictReader(open(path / "requests.csv")))
    assert sorted(int(r["request_id"]) for r in rows) == [0, 1, 2, 3]
    order = ["arrival_s", "prefill_start_s", "prefill_end_s", "decode_start_s", "finish_s"]
    for r in rows:
        t = [float(r[c]) for c in order]
        assert all(math.isfinite(x) for x in t) and t == sorted(t)
        assert float(r["transfer_start_s"]) <= float(r["transfer_end_s"]) <= float(r["decode_start_s"])
        if stream:
            # announced when its prefill batch is formed, before the forward stamps prefill_start_s
            # (realrun/separate.py): the decode process may admit it and stamp transfer_start_s in between, so
            # the protocol orders the transfer after the arrival only (prefill_start_s before it failed 1 run in
            # ~10 under load: 0.003494 > 0.003335 s)
            assert float(r["arrival_s"]) <= float(r["transfer_start_s"])
        else:
            assert float(r["transfer_start_s"]) >= float(r["quantize_end_s"])
    its = list(csv.DictReader(open(path / "iterations.csv")))
    assert sum(int(i["batch_size"]) for i in its) == sum(int(r["output_tokens"]) - 1 for r in rows)
    meta = json.loads((path / "meta.json").read_text())
    assert meta["placement"] == "separate" and "complete=True" in meta["notes"]
