"""python -m realrun.placecal --out FILE.csv: what the harness's KV placement and graph launch cost, alone.

Every iteration a request joins, realrun copies its received KV from the receive buffer into its batch slot, and
after a request leaves it moves the last running request's KV into the slot it left (harness.place: one
realrun.kvcopy launch for all of an iteration's moves, on the decode stream, before the step's graph).  This
measures that copy on its own, per model shape and KV format, against the bytes it moves, and the CPU time of one
graph replay (the launch of the whole decode step, which the GPU waits for between iterations):

  join    a received buffer of P prompt tokens placed into slot 0 (method.join_segments), P in --tokens;
  move    a request of P stored tokens moved from slot 1 to slot 0 (method.move_segments);
  launch  one replay of the step's CUDA graph at batch --launch-batch and the context bucket of 2,048 tokens.

Each is timed --repeats times after two to warm. Columns: kind, set (model:layers), method, layers, tokens, bytes
(one way: the copy reads and writes each), segments, host_s (the CPU time of building the segments and the kvcopy
call, or of the replay call), gpu_s (CUDA events around the kvcopy call with the GPU kept busy while the CPU
issues it, so the events hold the descriptor upload and the copy alone), idle_gpu_s (the same events with the
GPU idle before, as in the harness: the CPU's issue then shows between them), rep.

`--fit FILE...` (no GPU) prints, per set and method, the copy's GPU seconds as a fixed part plus bytes over a rate
(least squares over joins and moves), the rate over every file's rows, and the launch's CPU time per set.
Nothing here reads a measured trace.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
import torch

from .probes import parse_sets, print_fit, probe_device, write_rows

SETS = "llama-3.1-8b:32;llama-3.1-8b:8;llama-3.1-70b:8"
BUSY_CYCLES = 2_000_000  # torch.cuda._sleep before the timed call: about 1 ms of GPU time at the H200's clocks


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m realrun.placecal", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--out", type=Path)
    ap.add_argument("--fit", nargs="+", type=Path, help="fit the copy's rate from these files; runs nothing")
    ap.add_argument("--smoke", action="store_true", help="CPU plumbing check: tiny model, interpreter")
    ap.add_argument("--sets", default=SETS, help="model:layers;...")
    ap.add_argument("--methods", nargs="+", default=["baseline", "kvquant", "hack"])
    ap.add_argument("--tokens", nargs="+", type=int, default=[256, 1024, 2048, 4096, 8192, 16384])
    ap.add_argument("--repeats", type=int, default=10)
    ap.add_argument("--launch-batch", type=int, default=4)
    a = ap.parse_args(argv)
    if a.fit:
        return print_fit("placecal", lambda: format_fit(fit(a.fit)))
    if a.out is None:
        ap.error("--out is required (or --fit)")
    dev = probe_device("placecal", a.smoke)
    if dev is None:
        return 2
    sets = parse_sets(a.sets)
    tokens, repeats = a.tokens, a.repeats
    if a.smoke:
        sets, tokens, repeats = [("tiny", 1)], [40, 90], 2
    rows: list[dict] = []
    a.out.parent.mkdir(parents=True, exist_ok=True)
    for model_name, layers in sets:
        for method in a.methods:
            _measure(model_name, layers, method, tokens, repeats, a.launch_batch, dev, rows)
            write_rows(a.out, rows)
            mine = [r for r in rows if r["method"] == method and r["set"] == f"{model_name}:{layers}"]
            print(f"{model_name}:{layers} {method}: {_summary(mine)}", flush=True)
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    write_rows(a.out, rows)
    return 0


def _measure(model_name, layers, method, tokens, repeats, launch_batch, dev, rows) -> None:
    from . import kvcopy
    from .harness import GIB, Harness, RunConfig
    from .model import RandomLlama, model_shape

    shape = model_shape(model_name, layers)
    cap = max(tokens) + 64
    model = RandomLlama(shape, dev, seed=1, max_positions=cap + 8)
    cfg = RunConfig(
        method=method,
        link_gbps=10000.0,
        kv_capacity_bytes=64 * GIB,
        max_decode_batch=max(2, launch_batch),
        max_total_tokens=cap,
        seed=1,
    )
    h = Harness(model, cfg)
    cuda = dev.type == "cuda"
    meth = h.method
    set_name = f"{model_name}:{layers}"
    try:
        for p in tokens:
            recv = torch.randint(0, 256, (meth.wire_bytes(p),), dtype=torch.uint8, device=dev)
            for kind in ("join", "move"):

                def segments(kind=kind, p=p, recv=recv):
                    if kind == "join":
                        return meth.join_segments(0, recv, p)
                    return meth.move_segments(1, 0, p)

                segs = [s for s in segments() if s is not None]
                moved = sum(s[2] for s in segs) * shape.layers * shape.kv_heads
                for rep in range(repeats + 2):
                    t = _time_copy(segments, kvcopy, shape, dev, cuda)
                    if rep >= 2:
                        rows.append(
                            dict(
                                kind=kind,
                                set=set_name,
                                method=method,
                                layers=layers,
                                tokens=p,
                                bytes=moved,
                                segments=len(segs),
                                **t,
                                rep=rep - 2,
                            )
                        )
            del recv
        # the launch: the step at launch_batch requests of 2,048 tokens (its graph captured by the first call)
        n = launch_batch
        ctx = min(2048, cap - 8)
        h.step.set_inputs([1] * n, [ctx] * n)
        for rep in range(repeats + 2):
            h._sync()
            t0 = time.perf_counter()
            h.step.run(n, ctx + 1)
            host = time.perf_counter() - t0
            h._sync()
            if rep >= 2:
                rows.append(
                    dict(
                        kind="launch",
                        set=set_name,
                        method=method,
                        layers=layers,
                        tokens=ctx,
                        bytes=0,
                        segments=0,
                        host_s=host,
                        gpu_s=float("nan"),
                        idle_gpu_s=float("nan"),
                        rep=rep - 2,
                    )
                )
    finally:
        h.close()
        del h, model


def _time_copy(segments, kvcopy, shape, dev, cuda) -> dict:
    """One placement timed twice: with the GPU busy while the CPU builds and issues it (the events then hold the
    copy alone) and with it idle (as in the harness)."""
    out = {}
    for busy in (True, False):
        if cuda:
            torch.cuda.synchronize(dev)
            e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            if busy:
                torch.cuda._sleep(BUSY_CYCLES)
        t0 = time.perf_counter()
        segs = segments()
        if cuda:
            e0.record()
        kvcopy.kvcopy(segs, shape.layers, shape.kv_heads, dev)
        if cuda:
            e1.record()
        host = time.perf_counter() - t0
        if cuda:
            torch.cuda.synchronize(dev)
            gpu = e0.elapsed_time(e1) / 1e3
        else:
            gpu = float("nan")
        if busy:
            out["host_s"], out["gpu_s"] = host, gpu
        else:
            out["idle_gpu_s"] = gpu
    return out


def _summary(rows: list[dict]) -> str:
    parts = []
    for kind in ("join", "move"):
        mine = [r for r in rows if r["kind"] == kind]
        if mine:
            big = max(r["tokens"] for r in mine)
            sel = [r for r in mine if r["tokens"] == big]
            gpu = np.median([r["gpu_s"] for r in sel])
            mb = sel[0]["bytes"] / 1e6
            parts.append(f"{kind} {big} tok {mb:.0f} MB {gpu * 1e3:.3f} ms GPU")
    launch = [r["host_s"] for r in rows if r["kind"] == "launch"]
    if launch:
        parts.append(f"launch {np.median(launch) * 1e6:.0f} us CPU")
    return "; ".join(parts)


def fit(paths) -> dict:
    """Per (set, method): the copy's GPU seconds = fixed + bytes / rate over the joins and moves (medians per size);
    over every row: one rate; per set: the launch's median CPU seconds."""
    import pandas as pd

    d = pd.concat([pd.read_csv(p) for p in paths], ignore_index=True)
    for col in ("kind", "set", "method", "tokens", "bytes", "host_s", "gpu_s"):
        if col not in d.columns:
            raise KeyError(f"{paths[0]}: no column {col!r} (not a placecal file)")
    copies = (
        d[d.kind.isin(["join", "move"])]
        .groupby(["set", "method", "kind", "tokens"], as_index=False)
        .median(numeric_only=True)
    )
    out: dict = {"per": {}, "launch_s": {}}
    for (s, m), g in copies.groupby(["set", "method"]):
        fixed, per_byte = _line(g["bytes"].to_numpy(float), g["gpu_s"].to_numpy(float))
        out["per"][(s, m)] = {"fixed_s": fixed, "gb_per_s": 1e-9 / per_byte if per_byte > 0 else float("inf")}
    fixed, per_byte = _line(copies["bytes"].to_numpy(float), copies["gpu_s"].to_numpy(float))
    out["fixed_s"], out["gb_per_s"] = fixed, (1e-9 / per_byte if per_byte > 0 else float("inf"))
    big = copies[copies.bytes >= 0.5 * copies.bytes.max()]
    out["large_gb_per_s"] = float((big.bytes / big.gpu_s).median() / 1e9)
    for s, g in d[d.kind == "launch"].groupby("set"):
        out["launch_s"][s] = float(g.host_s.median())
    return out


def _line(x: np.ndarray, y: np.ndarray) -> tuple[float, float]:
    a = np.c_[np.ones_like(x), x]
    c = np.linalg.lstsq(a, y, rcond=None)[0]
    return float(c[0]), float(c[1])


def format_fit(f: dict) -> str:
    lines = ["KV placement (realrun.kvcopy): GPU seconds = fixed + bytes / rate"]
    for (s, m), v in sorted(f["per"].items()):
        lines.append(f"  {s:18s} {m:9s} fixed {v['fixed_s'] * 1e3:.3f} ms, {v['gb_per_s']:.0f} GB/s")
    lines.append(
        f"  all: fixed {f['fixed_s'] * 1e3:.3f} ms, {f['gb_per_s']:.0f} GB/s "
        f"(the largest copies alone: {f['large_gb_per_s']:.0f} GB/s)"
    )
    for s, v in sorted(f["launch_s"].items()):
        lines.append(f"graph launch CPU time {s}: {v * 1e6:.0f} us")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
