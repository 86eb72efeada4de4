"""python -m realrun.hostcal --out FILE.csv: the harness's CPU cost of issuing a decode iteration.

In eager mode a Python harness issues every decode iteration from the CPU: per layer the attention
wrapper calls (argument checks, allocations, Triton launches) and the dense torch calls, and the
iteration's bookkeeping.  When that issue time exceeds the GPU time the GPU waits: the iteration
lasts as long as the CPU takes.  With the decode step replayed as CUDA graphs (--decode-mode
graphs, the default) the issue is one input copy and one graph launch, and what remains is the
loop's own time between iterations (sync, reading the tokens, bookkeeping).  The simulator models this as a per-engine host cost (scenario
fields decode.host_issue_s_per_iteration and decode.host_issue_s_per_layer, iteration =
max(GPU time, host time)).  This microbenchmark measures those two numbers for the realrun
harness, per method, on its own: short models (2 and 6 layers of Llama-3.1-8B shapes; 2 layers of
70B shapes), 24 requests all arriving at once with short prompts, a link far faster than the GPU,
and the host issue time of every decode iteration (harness.host_issue: from the iteration's start
to the last launch, before the synchronising clock read).  Nothing here reads a measured trace.

The same runs record each prefill's duration, in method order baseline, kvquant, hack, baseline:
a method-order effect on prefill would show as the two baseline passes disagreeing.
Columns: kind (decode | prefill), method, model, layers, decode_mode, pass, batch_size, tokens, host_issue_s, wall_s,
start_s, end_s (the gaps between consecutive decode iterations with no prefill between them are the
harness loop's own time, during which the GPU idles).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

from .probes import write_rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m realrun.hostcal", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--requests", type=int, default=24)
    ap.add_argument("--smoke", action="store_true", help="CPU plumbing check: tiny model, interpreter")
    ap.add_argument(
        "--sets",
        default="llama-3.1-8b:2,6;llama-3.1-70b:2",
        help="model:layers,layers;... (each runs baseline, kvquant, hack; the first also baseline again)",
    )
    ap.add_argument("--decode-mode", default="graphs", choices=["graphs", "eager"])
    ap.add_argument(
        "--link-load-gbps",
        type=float,
        nargs="+",
        default=[0.0],
        help="run every set once per value with a paced link kept busy at that rate meanwhile (0: idle link), "
        "to see how the link thread's activity moves the host time",
    )
    ap.add_argument(
        "--prompt-ranges",
        nargs="+",
        default=["512-1024"],
        help="prompt lengths LO-HI (tokens) of the 24 requests; every set runs once per range (column prompt_range)",
    )
    ap.add_argument(
        "--load-chunk-bytes",
        type=int,
        default=1 << 20,
        help="chunk size of the busy link (default 1 MiB, the chunk of every committed recording: "
        "realrun/device_run.sh passes --chunk-mib 1)",
    )
    ap.add_argument(
        "--profile-first",
        type=Path,
        default=None,
        help="torch.profiler table of the first set's first method run (CPU and CUDA time) here",
    )
    a = ap.parse_args(argv)
    if a.smoke:
        import os

        os.environ.setdefault("TRITON_INTERPRET", "1")
    from .harness import GIB, Harness, RunConfig
    from .model import RandomLlama, model_shape
    from .runner import warmup
    from .workload import Request

    if not torch.cuda.is_available() and not a.smoke:
        print("hostcal needs a CUDA GPU (it measures the harness's host cost beside a real GPU)", file=sys.stderr)
        return 2
    rows = []
    a.out.parent.mkdir(parents=True, exist_ok=True)
    try:
        ranges = [tuple(int(x) for x in r.split("-")) for r in a.prompt_ranges]
        if any(len(r) != 2 or not 0 < r[0] < r[1] for r in ranges):
            raise ValueError
    except ValueError:
        print(f"--prompt-ranges: expected LO-HI with 0 < LO < HI, got {a.prompt_ranges}", file=sys.stderr)
        return 2
    if a.smoke:
        ranges = [(40, 90)]
    chunk_bytes = a.load_chunk_bytes
    dev = torch.device("cpu" if a.smoke else "cuda")
    sets = []
    for part in a.sets.split(";"):
        name, layer_list = part.split(":")
        for layers in map(int, layer_list.split(",")):
            sets.append((name, layers, ("baseline", "kvquant", "hack") + (("baseline",) if not sets else ())))
    if a.smoke:
        sets = [("tiny", 1, ("baseline", "hack", "baseline"))]
    runs = [(pr, g, st) for pr in ranges for g in a.link_load_gbps for st in sets]
    for prompt_range, load_gbps, (model_name, layers, methods) in runs:
        work = [
            Request(i, 0.0, prompt_range[0] + (37 * i) % (prompt_range[1] - prompt_range[0]), 40 if not a.smoke else 3)
            for i in range(a.requests)
        ]
        shape = model_shape(model_name, layers)
        model = RandomLlama(shape, dev, seed=1, max_positions=max(1200, prompt_range[1] + 1100))
        seen: dict[str, int] = {}
        print(f"-- prompts {prompt_range[0]}-{prompt_range[1]}, link load {load_gbps:g} Gbps", flush=True)
        for method in methods:
            seen[method] = seen.get(method, 0) + 1
            cfg = RunConfig(
                method=method,
                link_gbps=10000.0,
                kv_capacity_bytes=16 * GIB,
                max_decode_batch=a.requests,
                max_total_tokens=prompt_range[1] + 64,
                seed=1,
                decode_mode=a.decode_mode,
            )
            h = Harness(model, cfg)
            try:
                warmup(h, prompt_range, (3, 40))
                h.host_issue.clear()
                load = LinkLoad(load_gbps, dev, chunk_bytes) if load_gbps > 0 else None
                if (
                    a.profile_first is not None
                    and (model_name, layers, method) == sets[0][:2] + (methods[0],)
                    and seen[method] == 1
                ):
                    from torch.profiler import ProfilerActivity, profile

                    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])
                    with profile(activities=acts) as prof:
                        req_rows, iters, _ = h.run(work)
                    a.profile_first.write_text(
                        prof.key_averages().table(sort_by="cpu_time_total", row_limit=40)
                        + "\n\n"
                        + prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=40)
                    )
                else:
                    req_rows, iters, _ = h.run(work)
                if load is not None:
                    load.close()
                for (issue, wall), it in zip(h.host_issue, iters):
                    rows.append(
                        dict(
                            kind="decode",
                            method=method,
                            model=model_name,
                            layers=layers,
                            decode_mode=a.decode_mode,
                            link_load_gbps=load_gbps,
                            prompt_range=f"{prompt_range[0]}-{prompt_range[1]}",
                            **{"pass": seen[method]},
                            batch_size=it[3],
                            tokens=it[4],
                            host_issue_s=issue,
                            wall_s=wall,
                            start_s=it[1],
                            end_s=it[2],
                            quantize_s="",
                        )
                    )
                for r in req_rows:  # prefill_start_s, prefill_end_s are columns 5 and 6
                    rows.append(
                        dict(
                            kind="prefill",
                            method=method,
                            model=model_name,
                            layers=layers,
                            decode_mode=a.decode_mode,
                            link_load_gbps=load_gbps,
                            prompt_range=f"{prompt_range[0]}-{prompt_range[1]}",
                            **{"pass": seen[method]},
                            batch_size=1,
                            tokens=r[3],
                            host_issue_s="",
                            wall_s=r[6] - r[5],
                            start_s=r[5],
                            end_s=r[6],
                            quantize_s=r[7] - r[6],
                        )
                    )
            finally:
                h.close()
            dec = [
                r
                for r in rows
                if r["kind"] == "decode"
                and r["method"] == method
                and r["layers"] == layers
                and r["model"] == model_name
                and r["pass"] == seen[method]
                and r["prompt_range"] == f"{prompt_range[0]}-{prompt_range[1]}"
                and r["link_load_gbps"] == load_gbps
            ]
            pre = [
                r
                for r in rows
                if r["kind"] == "prefill"
                and r["method"] == method
                and r["layers"] == layers
                and r["model"] == model_name
                and r["pass"] == seen[method]
                and r["prompt_range"] == f"{prompt_range[0]}-{prompt_range[1]}"
                and r["link_load_gbps"] == load_gbps
            ]
            write_rows(a.out, rows)  # after every run: a run cut off by a time limit keeps what finished
            print(
                f"{model_name} L{layers} {method} pass {seen[method]}: {len(dec)} iterations, host issue "
                f"{sum(r['host_issue_s'] for r in dec) / len(dec) * 1e3:.3f} ms, wall "
                f"{sum(r['wall_s'] for r in dec) / len(dec) * 1e3:.3f} ms; prefill mean "
                f"{sum(r['wall_s'] for r in pre) / len(pre) * 1e3:.2f} ms",
                flush=True,
            )
        del model
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    write_rows(a.out, rows)
    if 0.0 in a.link_load_gbps:  # the scenario fields come from the runs with the link idle
        print("scenario fields:", fit_host([a.out]), flush=True)
        if any(g > 0 for g in a.link_load_gbps):  # and the busy level from the same runs idle and busy
            print("busy-link host level:", fit_link_host([a.out]), flush=True)
    for row in gap_distribution([a.out]):
        print("host time per iteration:", row, flush=True)
    return 0


class LinkLoad:
    """A paced link (realrun/link.py) kept busy at `gbps` while a run goes on: one transfer of a quarter second's
    bytes after another, GPU -> pinned host -> GPU on the link's own stream and thread, as the harness's own link
    moves KV.  The harness's decode loop then shares the CPU and the copy engines with it."""

    def __init__(self, gbps: float, device, chunk_bytes: int):
        import threading
        import time

        from .link import Link, Transfer

        self._transfer = Transfer
        self.link = Link(gbps, time.perf_counter, device, chunk_bytes)
        n = max(1 << 20, int(gbps * 1e9 / 8 * 0.25))
        self.src = torch.zeros(n, dtype=torch.uint8, device=device)
        self.dst = torch.empty_like(self.src)
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._feed, name="link-load", daemon=True)
        self.thread.start()

    def _feed(self) -> None:
        import queue

        while not self.stop.is_set():
            self.link.submit(self._transfer(0, self.src, self.dst))
            while not self.stop.is_set():
                try:
                    self.link.done.get(timeout=0.05)
                    break
                except queue.Empty:
                    pass

    def close(self) -> None:
        self.stop.set()
        self.thread.join(timeout=10)
        self.link.close()


def gap_distribution(paths) -> list[dict]:
    """The host time between decode iterations as a distribution, per link load (column link_load_gbps; 0 where
    the file has none) and decode mode: quantiles of the loop gap (end of one iteration to the start of the next,
    with no prefill between) and of the host issue before the launch, over every method and pass."""
    import numpy as np
    import pandas as pd

    out = []
    frames = [pd.read_csv(p) for p in paths]
    d = pd.concat(frames, ignore_index=True)
    if "link_load_gbps" not in d.columns:
        d["link_load_gbps"] = 0.0
    for (load, mode), g in d.groupby(["link_load_gbps", "decode_mode"], sort=True):
        gaps, issue = [], []
        for _, run in g.groupby(["method", "model", "layers", "pass"], sort=False):
            dec = run[run.kind == "decode"].sort_values("start_s")
            pf = run[run.kind == "prefill"][["start_s", "end_s"]].to_numpy(dtype=float)
            ends, starts = dec.end_s.to_numpy(dtype=float)[:-1], dec.start_s.to_numpy(dtype=float)[1:]
            for e, s in zip(ends, starts):
                if not ((pf[:, 0] < s) & (pf[:, 1] > e)).any():
                    gaps.append(s - e)
            issue += list(dec.host_issue_s.to_numpy(dtype=float))
        q = lambda x: {f"p{p}": round(float(np.percentile(x, p)) * 1e3, 4) for p in (10, 50, 90, 99)}  # noqa: E731
        out.append(
            {
                "link_load_gbps": float(load),
                "decode_mode": mode,
                "iterations": len(issue),
                "gap_ms": q(gaps) | {"mean": round(float(np.mean(gaps)) * 1e3, 4)},
                "issue_ms": q(issue) | {"mean": round(float(np.mean(issue)) * 1e3, 4)},
            }
        )
    return out


def fit_host(paths) -> dict:
    """The scenario fields from hostcal CSVs (several machines pooled): iterations without a joining
    request (the batch did not grow), per (run, method, model, layers) the mean host issue time, then
    host = fixed + per_layer * layers over the Llama-3.1-8B rows by least squares; the loop gap is
    the mean over groups of the gaps between consecutive decode iterations with no prefill between
    (files with start_s/end_s columns only).  The first baseline pass of a file's first set is left
    out when a second one exists (it ran under the profiler / cold).
    Files of --decode-mode graphs: the CPU work before the one graph launch does not overlap the GPU
    (the previous iteration ended with a sync), so it adds to the loop gap: host_serial = gap + mean
    issue, and the issue terms are 0; an iteration that a request joins issues more (the joins' KV placement
    and slot bookkeeping): join_s_per_request = the mean, over groups, of (issue of an iteration with joins -
    the group's mean issue without) / joins; and the iteration after requests left (the batch shrank: the last
    running request's KV moves into a freed slot) likewise: leave_s_per_request = the mean, over groups, of (issue
    of such an iteration - the group's mean issue of iterations whose batch neither grew nor shrank) / leavers.
    Rows with a busy link (link_load_gbps > 0) are left out."""
    import numpy as np
    import pandas as pd

    means, gaps, joins, leaves = [], [], [], []
    graphs = False
    for path in paths:
        d = pd.read_csv(path)
        if "link_load_gbps" in d.columns:  # the scenario fields come from runs with the link idle
            d = d[d.link_load_gbps == 0]
        graphs |= "decode_mode" in d.columns and bool((d.decode_mode == "graphs").any())
        for key, g in d[d.kind == "decode"].groupby(["method", "model", "layers", "pass"], sort=False):
            if (
                key[0] == "baseline"
                and key[3] == 1
                and ((d.method == "baseline") & (d.model == key[1]) & (d.layers == key[2]) & (d["pass"] == 2)).any()
            ):
                continue
            b = g.batch_size.to_numpy()
            joined = np.r_[b[0], np.maximum(0, np.diff(b))]
            grew = joined > 0
            issue = g.host_issue_s.to_numpy()
            means.append((key[1], key[2], float(issue[~grew].mean())))
            if grew.any() and (~grew).any():  # the host time a joining request adds to its first iteration
                joins.append(float(((issue[grew] - issue[~grew].mean()) / joined[grew]).mean()))
            left = np.r_[0, np.maximum(0, -np.diff(b))]
            shrank = (left > 0) & ~grew
            steady = (left == 0) & ~grew
            if shrank.any() and steady.any():  # ... and a leaving one to the iteration after it
                leaves.append(float(((issue[shrank] - issue[steady].mean()) / left[shrank]).mean()))
        if "start_s" in d.columns:
            for _, g in d.groupby(["method", "model", "layers", "pass"], sort=False):
                dec = g[g.kind == "decode"].sort_values("start_s")
                pf = g[g.kind == "prefill"][["start_s", "end_s"]].to_numpy()
                gg = [
                    b - a
                    for a, b in zip(dec.end_s.to_numpy()[:-1], dec.start_s.to_numpy()[1:])
                    if not ((pf[:, 0] < b) & (pf[:, 1] > a)).any()
                ]
                if gg:
                    gaps.append(float(np.mean(gg)))
    if graphs:
        issue = float(np.mean([h for _, _, h in means]))
        gap = float(np.mean(gaps)) if gaps else 0.0
        return {
            "host_issue_s_per_iteration": 0.0,
            "host_issue_s_per_layer": 0.0,
            "host_serial_s_per_iteration": gap + issue,
            "join_s_per_request": float(np.mean(joins)) if joins else 0.0,
            "leave_s_per_request": float(np.mean(leaves)) if leaves else 0.0,
            "issue_s": issue,
            "gap_s": gap,
            "groups": len(means),
        }
    rows = [(layers, h) for model, layers, h in means if model == "llama-3.1-8b"]
    a = np.array([[1.0, L] for L, _ in rows])
    coef, *_ = np.linalg.lstsq(a, np.array([h for _, h in rows]), rcond=None)
    return {
        "host_issue_s_per_iteration": float(coef[0]),
        "host_issue_s_per_layer": float(coef[1]),
        "host_serial_s_per_iteration": float(np.mean(gaps)) if gaps else None,
        "groups": len(means),
    }


def fit_prefill_host(paths) -> dict:
    """The prefill pool's host floor from hostcal CSVs (several machines pooled), in the cost model's shape
    (costmodel/phases.py, prefill_host_s): a prefill batch issued launch by launch from the CPU lasts at least
    per batch + layers x (per layer + the method's own per layer).  Each (file, method, model, layers, pass) group
    of prefill rows (link idle; the first baseline pass left out where a second exists, as in fit_host) gives its
    median wall.  Only groups whose prefill waits on the host enter: the 2-layer Llama-3.1-8B runs of every method
    (512-1024-token prompts run 1.2-2.1 ms on the GPU, their walls are 2-4 ms) and HACK's at every layer count (at
    32 layers its wall does not grow with the prompt: its own launches, build_cache and hack_attn_prefill per
    layer, keep the GPU waiting); the FP16 and KVQuant-style 32-layer prefills of these prompts are GPU-bound and
    say nothing of the floor.  The per-layer terms need two layer counts (hostcal --sets llama-3.1-8b:2,32).  Least squares of wall = per batch + L x per layer + [HACK] x L x HACK's own per layer over those
    groups (the per-batch work, the ids, embedding, RoPE tables and first token, is the same code for every
    method: realrun/harness.py, Harness.prefill)."""
    import numpy as np
    import pandas as pd

    rows, walls = [], []
    for path in paths:
        d = pd.read_csv(path)
        if "link_load_gbps" in d.columns:
            d = d[d.link_load_gbps == 0]
        d = d[(d.kind == "prefill") & (d.model == "llama-3.1-8b")]
        for (method, layers, pass_), g in d.groupby(["method", "layers", "pass"], sort=True):
            if (
                method == "baseline"
                and pass_ == 1
                and ((d.method == method) & (d.layers == layers) & (d["pass"] == 2)).any()
            ):
                continue
            if layers == 2 or method == "hack":
                rows.append([1.0, float(layers), float(layers) * (method == "hack")])
                walls.append(float(g.wall_s.median()))
    coef, *_ = np.linalg.lstsq(np.array(rows), np.array(walls), rcond=None)
    return {
        "host_issue_s_per_iteration": float(coef[0]),
        "host_issue_s_per_layer": float(coef[1]),
        "hack_prefill_issue_s_per_layer": float(coef[2]),
        "groups": len(rows),
    }


def fit_quantize_host(paths) -> dict:
    """Each method's quantize step as a CPU floor per layer (costmodel/phases.py, _encode_s: at least layers x
    quantize_issue_s_per_layer), from hostcal CSVs with the link idle: the step after the forward (packing the KV
    into the flat send buffer, and for KVQuant its quantize kernels) is launched layer by layer from Python and
    lasts about the same whatever the prompt (hostcal_link_long/short: 1-3K and 128-384-token prompts within a
    factor 1.3-1.8 of each other at 32 layers, against 5-10x more KV). Per method: least squares through the origin
    of the median quantize step of each (file, prompt range, model, layers, pass) group on its layer count (groups
    of 32 layers weigh the most; the first baseline pass left out where a second exists, as fit_host)."""
    import numpy as np
    import pandas as pd

    xs: dict[str, list[float]] = {}
    ys: dict[str, list[float]] = {}
    for path in paths:
        d = pd.read_csv(path)
        if "quantize_s" not in d.columns:
            continue
        if "link_load_gbps" in d.columns:
            d = d[d.link_load_gbps == 0]
        if "prompt_range" not in d.columns:
            d["prompt_range"] = "512-1024"
        d = d[(d.kind == "prefill") & d.quantize_s.notna()]
        for (pr, model, layers, method, pass_), g in d.groupby(
            ["prompt_range", "model", "layers", "method", "pass"], sort=True
        ):
            if _baseline_pass_superseded(d, pr, model, layers, method, pass_):
                continue
            xs.setdefault(method, []).append(float(layers))
            ys.setdefault(method, []).append(float(g.quantize_s.median()))
    out = {}
    for method in sorted(xs):
        x, y = np.array(xs[method]), np.array(ys[method])
        out[method] = {"quantize_issue_s_per_layer": float(x @ y / (x @ x)), "groups": len(x)}
    return out


def _baseline_pass_superseded(d, prompt_range: str, model: str, layers, method: str, pass_) -> bool:
    """A first baseline pass of a (prompt range, model, layers) group whose rows `d` also hold a second pass: left out,
    as fit_host leaves it (the first FP16 pass of a run also warms its kernels up)."""
    return (
        method == "baseline"
        and pass_ == 1
        and bool(
            (
                (d.method == "baseline")
                & (d.model == model)
                & (d.layers == layers)
                & (d.prompt_range == prompt_range)
                & (d["pass"] == 2)
            ).any()
        )
    )


def _host_terms(g, prompt_range: str) -> dict:
    """One run's host terms (hostcal rows of one method, model, layers, pass, link load and prompt range): the
    serial host time per decode iteration (mean issue of the iterations no request joined + mean loop gap with
    no prefill between), the join per joining request (as fit_host), the median prefill wall where it waits on
    the host, and the median quantize step."""
    import numpy as np

    dec = g[g.kind == "decode"].sort_values("start_s")
    pre = g[g.kind == "prefill"]
    pf = pre[["start_s", "end_s"]].to_numpy(dtype=float)
    b = dec.batch_size.to_numpy()
    joined = np.r_[b[:1], np.maximum(0, np.diff(b))]
    grew = joined > 0
    issue = dec.host_issue_s.to_numpy(dtype=float)
    gaps = [
        s - e
        for e, s in zip(dec.end_s.to_numpy(dtype=float)[:-1], dec.start_s.to_numpy(dtype=float)[1:])
        if not ((pf[:, 0] < s) & (pf[:, 1] > e)).any()
    ]
    out = {}
    if (~grew).any() and gaps:
        out["serial"] = float(issue[~grew].mean() + np.mean(gaps))
    if grew.any() and (~grew).any():
        out["join"] = float(((issue[grew] - issue[~grew].mean()) / joined[grew]).mean())
    layers, method = int(g.layers.iloc[0]), str(g.method.iloc[0])
    short = int(prompt_range.split("-")[1]) <= 512
    if len(pre) and (layers == 2 or method == "hack" or short):
        out["prefill"] = float(pre.wall_s.median())
    if "quantize_s" in pre.columns and pre.quantize_s.notna().any():
        out["quantize"] = float(pre.quantize_s.median())
    return out


def fit_link_host(paths) -> dict:
    """The host's level while the link moves KV, from hostcal CSVs with the link idle and kept busy
    (--link-load-gbps 0 R ...): realrun's link is a Python thread in the harness's process, and while it moves
    chunks the host terms slow. Per run (file, prompt range, model, layers, method, pass; the first baseline pass
    left out where a second exists, as fit_host) its host terms (_host_terms: the serial time per decode iteration,
    the join per request, the prefill wall where it waits on the host: 2-layer runs, HACK's, and prompts of at most
    512 tokens, and the quantize step) busy over the same run's idle; then the scenario fields
    network.link_busy_host_factor (a) and link_busy_host_factor_per_gbps (b) by least squares of ratio = a + b x load
    (Gbps) over every (run, term, load) but the prefill's, with their standard errors (b = 0 where the runs have one
    busy load), and under "prefill" the same fit of the prefill ratios alone (link_busy_prefill_host_factor and its
    _per_gbps: the prefill's launches, C++ dispatch mostly, meet the link thread's GIL less often than the decode
    loop's Python does). Also per load the mean ratio and the count."""
    import numpy as np
    import pandas as pd

    loads, ratios, prefill = [], [], []
    for path in paths:
        d = pd.read_csv(path)
        if "link_load_gbps" not in d.columns:
            continue
        if "prompt_range" not in d.columns:
            d["prompt_range"] = "512-1024"
        keys = ["prompt_range", "model", "layers", "method", "pass"]
        for key, g in d.groupby(keys, sort=True):
            pr, model, layers, method, pass_ = key
            if _baseline_pass_superseded(d, pr, model, layers, method, pass_):
                continue
            idle_rows = g[g.link_load_gbps == 0]
            if idle_rows.empty:
                continue
            idle = _host_terms(idle_rows, pr)
            for load, busy_rows in g[g.link_load_gbps > 0].groupby("link_load_gbps", sort=True):
                busy = _host_terms(busy_rows, pr)
                for term, v in busy.items():
                    if idle.get(term, 0.0) > 0:
                        loads.append(float(load))
                        ratios.append(v / idle[term])
                        prefill.append(term == "prefill")
    x, y, p = np.array(loads), np.array(ratios), np.array(prefill, dtype=bool)
    out = _busy_line(x[~p], y[~p], "link_busy_host_factor")
    out["prefill"] = _busy_line(x[p], y[p], "link_busy_prefill_host_factor")
    return out


def _busy_line(x, y, name: str) -> dict:
    """ratio = a + b x load by least squares, with standard errors (each item an observation); b = 0 with one load."""
    import numpy as np

    by_load = {float(v): {"mean": float(y[x == v].mean()), "items": int((x == v).sum())} for v in np.unique(x)}
    if len(np.unique(x)) < 2:  # one busy rate (or none): the factor alone, no slope
        n = len(y)
        return {
            name: float(y.mean()) if n else 1.0,
            f"{name}_per_gbps": 0.0,
            "stderr": [float(y.std(ddof=1) / np.sqrt(n)) if n > 1 else float("nan"), float("nan")],
            "by_load": by_load,
            "items": n,
        }
    a = np.c_[np.ones(len(x)), x]
    coef, *_ = np.linalg.lstsq(a, y, rcond=None)
    dof = max(len(y) - 2, 1)
    cov = float(np.sum((y - a @ coef) ** 2)) / dof * np.linalg.inv(a.T @ a)
    return {
        name: float(coef[0]),
        f"{name}_per_gbps": float(coef[1]),
        "stderr": [float(np.sqrt(cov[0, 0])), float(np.sqrt(cov[1, 1]))],
        "by_load": by_load,
        "items": len(y),
    }


if __name__ == "__main__":
    sys.exit(main())
