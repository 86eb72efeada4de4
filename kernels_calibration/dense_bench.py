"""python -m kernels_calibration.dense_bench --out DIR: the dense (non-attention) work of a layer.

The cost model prices a layer's projections and MLP as GEMMs and, until this benchmark, priced
them at the 8192^3 GEMM rate and the copy bandwidth.  Real layer shapes are not 8192^3: decode
GEMMs have 1-64 rows (weight streaming, GEMV-like), prefill GEMMs a few thousand.  This measures
torch F.linear (cuBLAS, FP16) at the Llama-3.1-8B and -70B layer shapes over row counts 1..16384,
and the memory-bound elementwise kernels a PyTorch layer runs besides (RMSNorm, the RoPE
multiply/concat/addcmul, SiLU, the gate*up product, residual adds, copies), each timed as CUDA
graph replays (the way the harness runs its decode steps) with rotating weight copies so no
weight is served from L2.  Writes DIR/dense_rows.csv (kind, op, m, n, k, bytes, flops, time_s and the
provenance columns gpu_name, driver, torch, triton, git_rev, date) and
DIR/dense_fit.json; `fit_dense` (numpy only, no GPU) turns rows into the profile's fields:
  gemm: time = overhead_s + max(flops / (matmul_fp16 * compute_eff), bytes / (memory * memory_eff))
  elementwise: time = overhead_s + bytes / (memory * elementwise_eff)
with held-out errors (every third row m is held out).
A lone elementwise kernel per replay pays a graph launch (~9 µs on the H200); inside a captured decode step the
kernels run back to back.  Rows of `python -m realrun.stepprof` (a real decode step's graph replay, kernel by
kernel) given to the fit add `in_graph_overhead_s`: what a small kernel costs inside a captured step
(`small_kernel_in_graph_s`), charged per small kernel of a decode step replayed as a CUDA graph.
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
from pathlib import Path

import numpy as np

# (name, hidden, q_dim, kv_dim, mlp, vocab): Llama-3.1 8B and 70B layer shapes
MODELS = (("8b", 4096, 4096, 1024, 14336, 128256), ("70b", 8192, 8192, 1024, 28672, 128256))
ROWS = (1, 2, 4, 8, 16, 24, 32, 64, 128, 512, 1024, 2048, 4096, 8192, 16384)


def measure(out: Path) -> list[dict]:
    import torch
    import torch.nn.functional as F

    from .measure import _n_rot, provenance, time_graph  # graph replays over n_rot input sets (>= 256 MB)

    dev = "cuda"
    rows: list[dict] = []
    prov = {k: provenance().get(k, "") for k in ("gpu_name", "driver", "torch", "triton", "git_rev", "date")}

    def add(kind, op, m, n, k, bytes_, flops, t):
        rows.append(dict(kind=kind, op=op, m=m, n=n, k=k, bytes=bytes_, flops=flops, time_s=t, **prov))
        print(
            f"{kind:11s} {op:14s} m={m:6d} n={n:6d} k={k:6d} {t * 1e6:10.2f} us "
            f"{bytes_ / t / 1e9:8.0f} GB/s {flops / t / 1e12:7.1f} TFLOP/s",
            flush=True,
        )

    for name, h, qd, kvd, mlp, vocab in MODELS:
        shapes = (
            ("qkv", qd + 2 * kvd, h),
            ("o", h, qd),
            ("gate_up", 2 * mlp, h),
            ("down", h, mlp),
            ("lm_head", vocab, h),
        )
        for op, n, k in shapes:
            wbytes = 2 * n * k
            n_rot = _n_rot(wbytes, cap=8)
            ws = [torch.randn(n, k, device=dev, dtype=torch.float16) * k**-0.5 for _ in range(n_rot)]
            for m in ROWS:
                if op == "lm_head" and m > 64:
                    continue
                x = torch.randn(m, k, device=dev, dtype=torch.float16)
                y = torch.empty(m, n, device=dev, dtype=torch.float16)
                t = time_graph(lambda i: torch.matmul(x, ws[i].t(), out=y), n_rot, replays=20)
                add("gemm", f"{name}.{op}", m, n, k, 2 * (n * k + m * k + m * n), 2.0 * m * n * k, t)
                del x, y
            del ws
            torch.cuda.empty_cache()
        # elementwise kernels of one PyTorch layer, at the row counts of decode and prefill
        for m in ROWS:
            xs = torch.randn(m, h, device=dev, dtype=torch.float16)
            w = torch.ones(h, device=dev, dtype=torch.float16)
            gu = torch.randn(m, 2 * mlp, device=dev, dtype=torch.float16)
            g, u = gu.chunk(2, -1)
            qk = torch.randn(m, (qd + kvd) // 128, 128, device=dev, dtype=torch.float16)
            rot = torch.randn(m, 1, 128, device=dev, dtype=torch.float16)
            ys = torch.empty_like(xs)
            ops = (
                ("rms_norm", lambda i: F.rms_norm(xs, (h,), w, 1e-5), 4 * m * h),
                ("residual_add", lambda i: torch.add(xs, ys, out=ys), 6 * m * h),
                ("copy", lambda i: ys.copy_(xs), 4 * m * h),
                ("silu", lambda i: F.silu(g), 4 * m * mlp),
                ("mul", lambda i: g * u, 6 * m * mlp),
                ("rope_mul", lambda i: qk * rot, 4 * qk.numel()),
                ("rope_cat", lambda i: torch.cat(qk.chunk(2, -1)[::-1], -1), 4 * qk.numel()),
            )
            for op, fn, nbytes in ops:
                t = time_graph(fn, 1)
                add("elementwise", f"{name}.{op}", m, h, 0, nbytes, 0.0, t)
            del xs, gu, g, u, qk, rot, ys
            torch.cuda.empty_cache()
    return rows


def small_kernel_in_graph_s(rows: list[dict]) -> list[tuple[dict, float]]:
    """Per profiled decode step (realrun.stepprof rows: one `step` row and its `kernel` rows): what one small
    kernel of a layer costs inside the captured step, its mean duration plus the step's mean gap between kernels.
    Small kernels: PyTorch's own (at::native: norms, RoPE products and concatenations, SiLU, products, residual
    adds, index writes, copies) that run once or more per layer (count >= layers); the GEMMs (cuBLAS) and the
    attention kernels (Triton) are priced by their own fits, which were timed inside graphs too."""
    out = []
    for s in (r for r in rows if r["kind"] == "step"):
        key = (s["method"], s["model"], s["layers"], s["batch"])
        layers = float(s["layers"])
        small = [
            r
            for r in rows
            if r["kind"] == "kernel"
            and (r["method"], r["model"], r["layers"], r["batch"]) == key
            and ("at::native" in r["name"] or r["name"].startswith("Memcpy"))
            and float(r["count"]) >= layers
        ]
        n = sum(float(r["count"]) for r in small)
        if n == 0:
            continue
        busy = sum(float(r["count"]) * float(r["mean_s"]) for r in small)
        out.append((s, busy / n + float(s["gap_s"]) / float(s["kernels"])))
    return out


def in_graph_fit(rows: list[dict]) -> dict:
    """`in_graph_overhead_s`: the median over profiled steps of small_kernel_in_graph_s ({} without stepprof
    rows).  At the profiled batches (1-16 rows) a small kernel's bytes take < 0.1 µs: the cost is its fixed part."""
    per = small_kernel_in_graph_s(rows)
    if not per:
        return {}
    vals = sorted(v for _, v in per)
    return {"in_graph_overhead_s": vals[len(vals) // 2], "in_graph_steps": len(vals)}


def fit_dense(rows: list[dict], memory_gbps: float, fp16_tflops: float, launch_overhead_s: float | None = None) -> dict:
    """Profile fields from measured rows (see the module doc).  Efficiencies by a grid search that
    minimises the median relative error on the training rows; the overheads by least squares.
    Each elementwise row is one kernel per graph replay, so its intercept is a graph launch plus a
    kernel (~9 µs on the H200), not a kernel's cost inside a layer: with launch_overhead_s given
    (the profile's back-to-back launch time) that is the per-kernel overhead written, and the
    intercept is kept as graph_replay_intercept_s."""

    def split(rs):
        ms = sorted({int(r["m"]) for r in rs})
        held = set(ms[1::3])
        return [r for r in rs if int(r["m"]) not in held], [r for r in rs if int(r["m"]) in held]

    out: dict = {}
    steps = [r for r in rows if r["kind"] in ("step", "kernel")]  # realrun.stepprof rows
    g = [r for r in rows if r["kind"] == "gemm"]
    if g:
        train, test = split(g)
        fl = np.array([float(r["flops"]) for r in train])
        by = np.array([float(r["bytes"]) for r in train])
        t = np.array([float(r["time_s"]) for r in train])
        best = None
        for ce in np.linspace(0.3, 1.0, 71):
            for me in np.linspace(0.3, 1.0, 71):
                base = np.maximum(fl / (fp16_tflops * 1e12 * ce), by / (memory_gbps * 1e9 * me))
                ov = max(0.0, float(np.median(t - base)))
                err = float(np.median(np.abs(ov + base - t) / t))
                if best is None or err < best[0]:
                    best = (err, ce, me, ov)
        _, ce, me, ov = best

        def pred(r):
            return ov + max(float(r["flops"]) / (fp16_tflops * 1e12 * ce), float(r["bytes"]) / (memory_gbps * 1e9 * me))

        errs = [abs(pred(r) - float(r["time_s"])) / float(r["time_s"]) for r in test]
        out["gemm"] = {
            "overhead_s": ov,
            "compute_efficiency": round(float(ce), 4),
            "memory_efficiency": round(float(me), 4),
            "heldout_median_error_pct": round(100 * float(np.median(errs)), 2),
            "heldout_max_error_pct": round(100 * float(np.max(errs)), 2),
            "rows": len(g),
        }
    e = [r for r in rows if r["kind"] == "elementwise"]
    if e:
        train, test = split(e)
        a = np.array([[1.0, float(r["bytes"])] for r in train])
        t = np.array([float(r["time_s"]) for r in train])
        w = 1.0 / t
        coef, *_ = np.linalg.lstsq(a * w[:, None], t * w, rcond=None)
        ov, spb = max(0.0, float(coef[0])), float(coef[1])
        errs = [abs(ov + spb * float(r["bytes"]) - float(r["time_s"])) / float(r["time_s"]) for r in test]
        out["elementwise"] = {
            "overhead_s": ov if launch_overhead_s is None else launch_overhead_s,
            "graph_replay_intercept_s": ov,
            **in_graph_fit(steps),
            "s_per_unit": spb,
            "unit": "bytes read + written",
            "efficiency_vs_copy": round(1.0 / (spb * memory_gbps * 1e9), 4),
            "heldout_median_error_pct": round(100 * float(np.median(errs)), 2),
            "rows": len(e),
        }
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument(
        "--fit-only", type=Path, nargs="+", default=None, help="refit from these dense_rows.csv files (no GPU)"
    )
    ap.add_argument("--peaks", type=Path, default=Path(__file__).parent / "profiles/h200/peaks.json")
    ap.add_argument(
        "--merge", type=Path, default=None, help="write the fit into this profile.json (gemm and kernels.elementwise)"
    )
    a = ap.parse_args(argv)
    a.out.mkdir(parents=True, exist_ok=True)
    if a.fit_only:
        rows = []
        for path in a.fit_only:
            with path.open() as f:
                rows += list(csv.DictReader(f))
    else:
        rows = measure(a.out)
        with (a.out / "dense_rows.csv").open("w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=list(rows[0]))
            w.writeheader()
            w.writerows(rows)
    peaks = json.loads(a.peaks.read_text())["peaks"]
    fit = fit_dense(rows, peaks["memory_gbps"], peaks["fp16_tflops"], peaks.get("launch_overhead_s"))
    (a.out / "dense_fit.json").write_text(json.dumps(fit, indent=1) + "\n")
    print(json.dumps(fit, indent=1))
    if a.merge:
        merge_into_profile(a.merge, fit)
    return 0


def apply_dense_fit(prof: dict, fit: dict) -> dict:
    """Put a fit_dense result into a profile dict: `gemm` and `kernels.elementwise`."""
    if "gemm" in fit:
        prof["gemm"] = fit["gemm"]
    if "elementwise" in fit:
        prof["kernels"]["elementwise"] = fit["elementwise"]
    return prof


def merge_into_profile(path: Path, fit: dict) -> None:
    path.write_text(json.dumps(apply_dense_fit(json.loads(path.read_text()), fit), indent=1) + "\n")


if __name__ == "__main__":
    sys.exit(main())
