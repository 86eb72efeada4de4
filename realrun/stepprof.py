"""python -m realrun.stepprof --out FILE.csv: where one decode step's GPU time goes, kernel by kernel.

The harness replays each decode step as one CUDA graph (step.py).  This times that replay alone (CUDA events
around graph.replay(), no host loop) at a few batch sizes and one context per request, and lists the kernels the
replay runs with their durations (torch.profiler / CUPTI, which reports kernels inside graph replays): how many
kernels a step launches, how long they run, and the time between them (replay time less the kernels' sum), the
in-graph cost the cost model charges per small kernel (costmodel/phases.py, `_small_kernel_s(in_graph=True)`).

Rows (kind step): method, model, layers, batch (running requests), bucket (the graph's batch bucket), context,
replay_s (median of the replays), kernels (per replay), kernel_sum_s (their durations, per replay), gap_s
(replay_s - kernel_sum_s).  Rows (kind kernel): the same keys plus name, count per replay and mean duration.
Random weights, KV pool contents left as allocated: timing only (realrun.check checks the numbers).
"""

from __future__ import annotations

import argparse
import csv
import sys
from pathlib import Path


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m realrun.stepprof", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--model", default="llama-3.1-8b", choices=["llama-3.1-8b", "llama-3.1-70b", "tiny"])
    ap.add_argument("--layers", type=int, default=None)
    ap.add_argument("--method", nargs="+", default=["baseline", "kvquant", "hack"])
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 2, 3, 4, 5, 8, 16])
    ap.add_argument("--context", type=int, default=1024, help="tokens per request before the step")
    ap.add_argument("--replays", type=int, default=50)
    a = ap.parse_args(argv)
    import torch

    from .harness import GIB, Harness, RunConfig
    from .model import RandomLlama, model_shape

    if not torch.cuda.is_available():
        print("stepprof needs a CUDA GPU", file=sys.stderr)
        return 2
    shape = model_shape(a.model, a.layers)
    model = RandomLlama(shape, "cuda", seed=1, max_positions=a.context + 64)
    rows: list[dict] = []
    for method in a.method:
        cfg = RunConfig(
            method=method,
            link_gbps=10000.0,
            kv_capacity_bytes=16 * GIB,
            max_decode_batch=max(a.batch),
            max_total_tokens=a.context + 64,
            seed=1,
        )
        h = Harness(model, cfg)
        try:
            step = h.step
            assert step is not None
            for n in a.batch:
                step.set_inputs([1] * n, [a.context] * n)
                b, c = step.run(n, a.context + 1)  # captures the bucket's graph (and warms it)
                g = step.graphs[(b, c)]
                for _ in range(5):
                    g.replay()
                torch.cuda.synchronize()
                times = []
                for _ in range(a.replays):
                    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                    e0.record()
                    g.replay()
                    e1.record()
                    e1.synchronize()
                    times.append(e0.elapsed_time(e1) * 1e-3)
                times.sort()
                replay_s = times[len(times) // 2]
                prof_replays = 5
                kernels: dict[str, list[float]] = {}
                try:
                    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
                        for _ in range(prof_replays):
                            g.replay()
                        torch.cuda.synchronize()
                    for ev in prof.events():
                        t_us = getattr(ev, "device_time", None) or getattr(ev, "cuda_time", 0.0)
                        if ev.device_type == torch.autograd.DeviceType.CUDA and t_us > 0:
                            kernels.setdefault(ev.name, []).append(t_us * 1e-6)
                except Exception as e:  # the timing row still counts
                    print(f"profiler: {e!r}", flush=True)
                count = sum(len(v) for v in kernels.values()) / prof_replays
                ksum = sum(sum(v) for v in kernels.values()) / prof_replays
                key = dict(method=method, model=shape.name, layers=shape.layers, batch=n, bucket=b, context=a.context)
                rows.append(
                    dict(kind="step", **key, replay_s=replay_s, kernels=count, kernel_sum_s=ksum, gap_s=replay_s - ksum)
                )
                print(
                    f"{method:8s} batch {n:3d} (bucket {b:3d}, ctx {a.context}): replay {replay_s * 1e3:.3f} ms, "
                    f"{count:.0f} kernels ({count / shape.layers:.1f} per layer) running {ksum * 1e3:.3f} ms, "
                    f"between them {(replay_s - ksum) * 1e3:.3f} ms ({(replay_s - ksum) / max(count, 1) * 1e6:.2f} us "
                    f"per kernel)",
                    flush=True,
                )
                for name, d in sorted(kernels.items(), key=lambda kv: -sum(kv[1])):
                    rows.append(
                        dict(
                            kind="kernel",
                            **key,
                            name=name[:120],
                            count=len(d) / prof_replays,
                            mean_s=sum(d) / len(d),
                        )
                    )
        finally:
            h.close()
        torch.cuda.empty_cache()
    a.out.parent.mkdir(parents=True, exist_ok=True)
    fields = sorted({k for r in rows for k in r}, key=lambda k: list(rows[0]).index(k) if k in rows[0] else 99)
    with a.out.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=fields)
        w.writeheader()
        w.writerows(rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
