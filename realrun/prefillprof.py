"""python -m realrun.prefillprof --out FILE.csv: a prefill's time split into the GPU's work and the host's exposed part.

realrun issues a prefill eagerly, op by op from Python (harness.py, Harness.prefill), and the cost model prices it as
the longer of the GPU's work and the CPU's issue floor (costmodel/phases.py, `_prefill`: max(GPU, host)), which
holds where the CPU, once ahead, stays ahead. This measures how far that holds, per prompt length: the same forward
(embedding, RoPE tables, every layer's projections, FP16 attention and MLP, the LM head and the greedy token, as
Harness.prefill runs them for FP16 and KVQuant-style KV, without the encode) timed three ways, back to back on one
GPU: eager (sync to sync, as a recording times its prefill), the CPU's part of it (from the start to its last
launch, before the closing sync), and the same forward captured once as a CUDA graph and replayed (the GPU's work
with no host in between). eager - graph is the time the GPU waited on the CPU; where the CPU could run ahead it is
about max(0, issue - graph). Columns: set (model:layers), tokens, rep, eager_s, issue_s, graph_s (the replay's
median over --replays, the same on every rep of a length). Random weights: timing only. Nothing here reads a
measured trace.

`python -m realrun.prefillprof --fit FILE.csv ...` (a column `run` tells runs of one file apart) fits the prefill
pool's host_exposed_s_per_iteration and host_exposed_s_per_layer (`fit_exposed`).

`--first-seen N`: what a prompt length the process has not run before costs. realrun's prompts are drawn from a
range, so nearly every prefill of a recording has a length no earlier one had; realrun builds the attention's cuDNN
plan of every length before the run (runner.prime_prefill_attention), nothing else. This draws N lengths from each
set's range (--first-seen-range, seeded), builds their attention plans the same way, then runs the eager forward
once at each (first) and once more at each (again). Columns: set, seen (first / again), tokens, eager_s, issue_s.
`first_seen_summary` gives per set the medians and first - again; `--first-seen-fit` (`fit_first_seen`) their median
over sets, the prefill pool's host_first_seen_s_per_iteration; `--first-seen-fade-fit` (`fit_first_seen_fade`) how that
time hides behind a forward whose GPU work is the longer, host_first_seen_fade_s.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

from .probes import parse_sets, print_fit, probe_device, write_rows


def forward(model, ids: torch.Tensor, rot) -> torch.Tensor:
    """Harness.prefill's forward for one request and FP16 prefill attention (the encode left out)."""
    x = model.embed[ids]
    for lw in model.layers:
        q, k, v = model.qkv(lw, x, rot)
        qi = q.transpose(0, 1)[None].contiguous()
        ki = k.transpose(0, 1)[None].contiguous()
        vi = v.transpose(0, 1)[None].contiguous()
        o = _sdpa(qi, ki, vi)
        x = model.finish_layer(lw, x, o[0].transpose(0, 1).reshape(ids.numel(), -1))
    return model.next_token(x[-1:])  # Harness.prefill indexes by a list: a slice is the same row, graph-capturable


# A length enters the fit where its prefill is GPU-bound (the replay at least this many times the CPU's part: the
# CPU runs ahead) and short enough that the replays and the eager repeats, run one after the other, meet the same
# clocks (a prefill of tens of milliseconds holds the GPU in its power cap, realrun.prefillcal)
GPU_BOUND_RATIO = 1.2
MAX_GRAPH_S = 0.030


def fit_exposed(paths) -> dict:
    """The prefill pool's exposed host time from prefillprof CSVs: per (file, run, set, tokens) the medians of
    eager_s and issue_s and the replay's graph_s; where GPU-bound (graph_s >= GPU_BOUND_RATIO x issue_s, graph_s <=
    MAX_GRAPH_S), eager - graph = per batch + layers x per layer, by least squares over the lengths of every run
    pooled. Returns the two terms, their standard errors, the rows used and each run's own pair."""
    import numpy as np
    import pandas as pd

    frames = []
    for i, path in enumerate(paths):
        d = pd.read_csv(path)
        d["run"] = f"{i}:" + (d["run"].astype(str) if "run" in d.columns else "")
        frames.append(d)
    d = pd.concat(frames, ignore_index=True)
    m = (
        d.groupby(["run", "set", "tokens"])
        .agg(eager=("eager_s", "median"), issue=("issue_s", "median"), graph=("graph_s", "median"))
        .reset_index()
    )
    m["layers"] = m["set"].str.split(":").str[1].astype(float)
    m = m[(m.graph >= GPU_BOUND_RATIO * m.issue) & (m.graph <= MAX_GRAPH_S)]
    if len(m) < 3 or m["layers"].nunique() < 2:
        raise ValueError("fit_exposed needs GPU-bound prefills at two layer counts or more")

    def lstsq(g):
        a = np.c_[np.ones(len(g)), g["layers"].to_numpy()]
        y = (g["eager"] - g["graph"]).to_numpy()
        coef, *_ = np.linalg.lstsq(a, y, rcond=None)
        r = y - a @ coef
        dof = max(len(y) - 2, 1)
        cov = np.linalg.inv(a.T @ a) * float(r @ r) / dof
        return coef, np.sqrt(np.diag(cov))

    coef, se = lstsq(m)
    runs = {}
    for run, g in m.groupby("run"):
        if g["layers"].nunique() >= 2:
            c, _ = lstsq(g)
            runs[run] = {"per_iteration_s": float(c[0]), "per_layer_s": float(c[1]), "rows": len(g)}
    return {
        "host_exposed_s_per_iteration": float(coef[0]),
        "host_exposed_s_per_layer": float(coef[1]),
        "stderr_per_iteration_s": float(se[0]),
        "stderr_per_layer_s": float(se[1]),
        "rows": len(m),
        "runs": runs,
    }


def _sdpa(q, k, v):
    """The forward's FP16 prefill attention (kvformats.Method.prefill_attention)."""
    return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)


def _eager(model, ids: torch.Tensor, pos: torch.Tensor, dev) -> tuple[float, float]:
    """One eager forward, sync to sync as a recording times its prefill: (its seconds, its CPU part's: the start to
    the last launch)."""
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)
    t0 = time.perf_counter()
    forward(model, ids, model.rope_tables(pos))
    t1 = time.perf_counter()
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)
    return time.perf_counter() - t0, t1 - t0


def _median(xs) -> float:
    xs = sorted(xs)
    return xs[len(xs) // 2]


def first_seen(model, dev, lengths: list[int]) -> list[dict]:
    """The eager forward at each length for the first time (its attention plan already built), then again."""
    from .runner import prime_attention

    prime_attention(model.shape, dev, _sdpa, lengths)
    rows = []
    for seen in ("first", "again"):
        for p in lengths:
            ids = torch.randint(0, model.shape.vocab, (p,), generator=torch.Generator().manual_seed(p)).to(dev)
            eager_s, issue_s = _eager(model, ids, torch.arange(p, device=dev), dev)
            rows.append(dict(seen=seen, tokens=p, eager_s=eager_s, issue_s=issue_s))
    return rows


def first_seen_summary(paths) -> dict:
    """Per (file, run, set) of --first-seen rows: the medians of eager_s and issue_s at first sight and again, and
    first - again."""
    import pandas as pd

    out = {}
    for i, path in enumerate(paths):
        d = pd.read_csv(path)
        keys = ["run", "set"] if "run" in d.columns else ["set"]
        for key, g in d.groupby(keys):
            med = g.groupby("seen")[["eager_s", "issue_s"]].median()
            name = f"{i}:" + ":".join(str(k) for k in (key if isinstance(key, tuple) else (key,)))
            out[name] = {
                "lengths": int((g.seen == "first").sum()),
                "first_eager_s": float(med.loc["first", "eager_s"]),
                "again_eager_s": float(med.loc["again", "eager_s"]),
                "first_issue_s": float(med.loc["first", "issue_s"]),
                "again_issue_s": float(med.loc["again", "issue_s"]),
                "extra_eager_s": float(med.loc["first", "eager_s"] - med.loc["again", "eager_s"]),
                "extra_issue_s": float(med.loc["first", "issue_s"] - med.loc["again", "issue_s"]),
            }
    return out


def fit_first_seen(paths) -> dict:
    """The prefill pool's host_first_seen_s_per_iteration: the median over sets (first_seen_summary) of a first-seen
    length's extra eager time, one figure per batch (the sets' extras do not follow their layers closely: 0.6-4.7 ms
    by set and host on the H100s), with its range."""
    per_set = first_seen_summary(paths)
    extra = sorted(s["extra_eager_s"] for s in per_set.values())
    if not extra:
        raise ValueError("no --first-seen rows")
    return {
        "host_first_seen_s_per_iteration": statistics.median(extra),
        "sets": len(extra),
        "min_s": extra[0],
        "max_s": extra[-1],
        "per_set": per_set,
    }


FADE_GRID_S = tuple(0.005 * 1.02**i for i in range(200))  # 5 ms to 0.26 s


def _first_seen_pairs(paths):
    """Per (file, run, set, length) of --first-seen rows: the eager forward's and its CPU part's extra at first
    sight (first - again) and the eager time again; a column `group` names the set."""
    import pandas as pd

    frames = []
    for i, path in enumerate(paths):
        d = pd.read_csv(path)
        if "run" not in d.columns:
            d = d.assign(run="")
        d = d.assign(group=[f"{i}:{r}:{s}" for r, s in zip(d["run"], d["set"])])
        cols = ["group", "tokens", "eager_s", "issue_s"]
        first, again = d[d.seen == "first"][cols], d[d.seen == "again"][cols]
        frames.append(first.merge(again, on=["group", "tokens"], suffixes=("_first", "_again")))
    j = pd.concat(frames, ignore_index=True)
    return j.assign(
        extra_eager_s=j.eager_s_first - j.eager_s_again,
        extra_issue_s=j.issue_s_first - j.issue_s_again,
    )


def fit_first_seen_fade(paths, boot: int = 200, seed: int = 0) -> dict:
    """The prefill pool's host_first_seen_fade_s: where the forward is GPU-bound (again, its eager time at least 1.2
    times its CPU part, as fit_exposed), the share of the CPU's first-seen extra that lengthens it falls with the
    forward's time T as exp(-T / fade): the fade minimising the summed absolute residual of extra eager - extra CPU
    x exp(-T / fade) over the lengths (robust: one length's hiccup of a few ms is common), on a grid of 2 % steps;
    with the 2.5-97.5 % range of a bootstrap over the sets (lengths of one set are not independent)."""
    import numpy as np

    j = _first_seen_pairs(paths)
    j = j[j.eager_s_again >= 1.2 * j.issue_s_again]
    if j.empty:
        raise ValueError("no GPU-bound --first-seen lengths")
    grid = np.array(FADE_GRID_S)
    groups = sorted(j.group.unique())
    by = {g: j[j.group == g] for g in groups}

    def best(parts) -> float:
        de = np.concatenate([p.extra_eager_s.to_numpy() for p in parts])
        di = np.concatenate([p.extra_issue_s.to_numpy() for p in parts])
        t = np.concatenate([p.eager_s_again.to_numpy() for p in parts])
        l1 = np.abs(de[None, :] - di[None, :] * np.exp(-t[None, :] / grid[:, None])).sum(axis=1)
        return float(grid[int(np.argmin(l1))])

    rng = np.random.default_rng(seed)
    draws = [best([by[g] for g in rng.choice(groups, len(groups))]) for _ in range(boot)]
    lo, hi = np.percentile(draws, [2.5, 97.5])
    bins = [0.0, 0.012, 0.02, 0.04, 0.08, float("inf")]
    t = j.eager_s_again.to_numpy()
    shares = {}
    for a, b in zip(bins, bins[1:]):
        sel = j[(t >= a) & (t < b)]
        if len(sel):  # the summed extra eager time over the summed extra CPU time, by the forward's time
            shares[f"{a * 1e3:g}-{b * 1e3:g} ms"] = {
                "lengths": len(sel),
                "shown_share": float(sel.extra_eager_s.sum() / sel.extra_issue_s.sum()),
            }
    return {
        "host_first_seen_fade_s": best([by[g] for g in groups]),
        "range_s": [float(lo), float(hi)],
        "lengths": len(j),
        "sets": len(groups),
        "by_forward_time": shares,
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m realrun.prefillprof", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--out", type=Path)
    ap.add_argument("--fit", nargs="+", type=Path, help="fit the exposed host terms to these CSVs and print them")
    ap.add_argument("--smoke", action="store_true", help="CPU plumbing check: tiny model, no graphs")
    ap.add_argument("--sets", default="llama-3.1-70b:8;llama-3.1-8b:32;llama-3.1-8b:8", help="model:layers;...")
    ap.add_argument("--tokens", nargs="+", type=int, default=[128, 192, 256, 384, 512, 768, 1024, 2048])
    ap.add_argument("--repeats", type=int, default=8)
    ap.add_argument("--replays", type=int, default=10)
    ap.add_argument(
        "--first-seen", type=int, default=0, metavar="N", help="time N lengths never run before, then again"
    )
    ap.add_argument(
        "--first-seen-range", nargs=2, type=int, default=[128, 640], metavar=("LO", "HI"), help="their lengths' range"
    )
    ap.add_argument(
        "--first-seen-fit", nargs="+", type=Path, help="fit the first-seen time to these --first-seen CSVs and print it"
    )
    ap.add_argument(
        "--first-seen-fade-fit",
        nargs="+",
        type=Path,
        help="fit how the first-seen time hides behind a GPU-bound forward to these --first-seen CSVs and print it",
    )
    a = ap.parse_args(argv)
    if a.first_seen_fade_fit:
        return print_fit("prefillprof", lambda: json.dumps(fit_first_seen_fade(a.first_seen_fade_fit), indent=1))
    if a.first_seen_fit:
        return print_fit("prefillprof", lambda: json.dumps(fit_first_seen(a.first_seen_fit), indent=1))
    if a.fit:
        return print_fit("prefillprof", lambda: json.dumps(fit_exposed(a.fit), indent=1))
    if a.out is None:
        ap.error("--out is required (or --fit, --first-seen-fit)")
    if a.first_seen and not 0 < a.first_seen_range[0] < a.first_seen_range[1]:
        ap.error("--first-seen-range: LO and HI with 0 < LO < HI")
    dev = probe_device("prefillprof", a.smoke)
    if dev is None:
        return 2
    from .model import RandomLlama, model_shape

    sets, tokens, repeats = parse_sets(a.sets), a.tokens, a.repeats
    if a.smoke:
        sets, tokens, repeats = [("tiny", 1)], [40, 90], 2
    cuda = dev.type == "cuda"

    def sync() -> None:
        if cuda:
            torch.cuda.synchronize(dev)

    rows: list[dict] = []
    a.out.parent.mkdir(parents=True, exist_ok=True)
    if a.first_seen:
        import random

        lo, hi = (20, 100) if a.smoke else a.first_seen_range
        n = min(a.first_seen, hi - lo)
        for model_name, layers in sets:
            model = RandomLlama(model_shape(model_name, layers), dev, seed=1, max_positions=hi + 8)
            for p in (lo, hi):  # warm: the kernels and plans of the range's ends
                forward(
                    model, torch.zeros(p, dtype=torch.int64, device=dev), model.rope_tables(torch.arange(p, device=dev))
                )
            lengths = random.Random(layers).sample(range(lo + 1, hi), n)
            mine = [dict(set=f"{model_name}:{layers}", **r) for r in first_seen(model, dev, lengths)]
            rows += mine
            for seen in ("first", "again"):
                e = _median(r["eager_s"] for r in mine if r["seen"] == seen)
                i = _median(r["issue_s"] for r in mine if r["seen"] == seen)
                print(f"{model_name}:{layers} {seen}: eager {e * 1e3:.2f} ms, issue {i * 1e3:.2f} ms")
            write_rows(a.out, rows)
            del model
            if cuda:
                torch.cuda.empty_cache()
        return 0
    for model_name, layers in sets:
        model = RandomLlama(model_shape(model_name, layers), dev, seed=1, max_positions=max(tokens) + 8)
        for p in tokens:
            ids = torch.randint(0, model.shape.vocab, (p,), generator=torch.Generator().manual_seed(p)).to(dev)
            pos = torch.arange(p, device=dev)
            forward(model, ids, model.rope_tables(pos))  # warm: cuBLAS and SDPA plans
            sync()
            graph_s = float("nan")
            if cuda:
                stream = torch.cuda.Stream(dev)
                stream.wait_stream(torch.cuda.current_stream(dev))
                with torch.cuda.stream(stream):
                    forward(model, ids, model.rope_tables(pos))
                torch.cuda.current_stream(dev).wait_stream(stream)
                g = torch.cuda.CUDAGraph()
                with torch.cuda.graph(g):
                    forward(model, ids, model.rope_tables(pos))
                times = []
                for _ in range(a.replays):
                    ev = (torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
                    ev[0].record()
                    g.replay()
                    ev[1].record()
                    sync()
                    times.append(ev[0].elapsed_time(ev[1]) / 1e3)
                graph_s = _median(times)
                del g
            mine = []
            for rep in range(repeats):
                eager_s, issue_s = _eager(model, ids, pos, dev)
                mine.append(
                    dict(
                        set=f"{model_name}:{layers}",
                        tokens=p,
                        rep=rep,
                        eager_s=eager_s,
                        issue_s=issue_s,
                        graph_s=graph_s,
                    )
                )
            rows += mine
            print(
                f"{model_name}:{layers} {p}: eager {_median(r['eager_s'] for r in mine) * 1e3:.2f} ms, issue "
                f"{_median(r['issue_s'] for r in mine) * 1e3:.2f} ms, graph {graph_s * 1e3:.2f} ms",
                flush=True,
            )
            write_rows(a.out, rows)
        del model
        if cuda:
            torch.cuda.empty_cache()
    write_rows(a.out, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
