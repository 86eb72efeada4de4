"""Deployed implementations as data: time what a shipped implementation runs, part by part.

Two implementation profiles, measured at decode shapes (batch 8, 64 query / 8 KV heads, head_dim 128,
contexts 1K..32K unless told otherwise):

* ``kvquant_reference``: KVQuant's reference dequantize-then-attend path (Hooper et al., "KVQuant:
  Towards 10 Million Context Length LLM Inference with KV Cache Quantization", 2024): 2-bit
  *non-uniform* codes dequantized through lookup tables, keys per channel (a 4-entry table per KV
  head and channel, the channel's scaling folded in) and values per token (one 4-entry table per
  layer, scaled and offset per token), then a dense-and-sparse pass writing the ~1 % FP16 outliers
  kept in CSR form (row pointers over the [batch x heads x tokens, head_dim] matrix, column indices,
  values) over the dequantized buffer, then FP16 attention (torch SDPA) on that buffer.  Each part is
  timed on its own (``lut_dequant``, ``outliers_csr``, ``sdpa_fp16``) and the whole path (``total``),
  as PyTorch ops: the reference path of the public implementation, not its fused CUDA kernels.
* ``no_rqe_requantize``: without requantization elimination an implementation requantizes the open
  V block at every token: our quantize kernel (kernels/quantize.quantize_v, stochastic rounding) on
  one PI-token block per request per layer per iteration (``requantize_block``, over batch sizes);
  beside it the append kernel with and without RQE (kernels/kv_cache.append_token), whose difference
  is the same work inside the append.

Every kernel is fitted as ``time_s = overhead_s + s_per_unit * units`` (costmodel/calibration.py):
units are K and V elements (sum over the batch of tokens x kv_heads x head_dim x 2) for the KVQuant
parts, and V elements requantized (batch x kv_heads x PI x head_dim) for the open-block requantize.
Timing (METHOD.md): warm-up first; ``time_s`` is the median CUDA-graph replay of ten calls over
rotating input sets (each pass reads past the L2), divided by ten: the GPU's own time, which an
engine replaying graphs pays; ``eager_time_s`` is the median of CUDA events around single calls
from Python (a reference implementation run as is: small kernels there are launch-bound).  The fits
use time_s.

``python -m kernels_calibration.impl_bench --out FILE.json`` (GPU); ``--smoke`` runs the same code at
tiny shapes on the CPU (no timing meaning) and checks each path against its float64 reference.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

CONTEXTS = (1024, 2048, 4096, 8192, 16384, 32768)
BATCH, Q_HEADS, KV_HEADS, HEAD_DIM = 8, 64, 8, 128
OUTLIER_FRACTION = 0.01
PARTITION = 64
REQUANT_BATCHES = (1, 2, 4, 8, 16, 32, 64)
L2_BYTES = 60 << 20


# ---- the KVQuant reference format ------------------------------------------------------------
def pack2(codes: torch.Tensor) -> torch.Tensor:
    """int codes 0..3 [..., D] -> uint8 [..., D/4]; channel d in byte d // 4, bits 2 * (d % 4)."""
    c = codes.to(torch.uint8).reshape(*codes.shape[:-1], -1, 4)
    return c[..., 0] | (c[..., 1] << 2) | (c[..., 2] << 4) | (c[..., 3] << 6)


def make_kvquant(
    batch: int, kv_heads: int, tokens: int, head_dim: int, outlier_fraction: float, seed: int, device
) -> dict:
    """A random cache in the KVQuant reference format (codes, tables, per-token scale/zero, CSR outliers),
    drawn on `device` (a 32K-token batch has 268M elements per tensor)."""
    dev = torch.device(device)
    g = torch.Generator(device=dev).manual_seed(seed)
    shape = (batch, kv_heads, tokens, head_dim)
    kc = torch.randint(0, 4, shape, generator=g, device=dev, dtype=torch.uint8)
    vc = torch.randint(0, 4, shape, generator=g, device=dev, dtype=torch.uint8)
    # non-uniform tables: sorted signposts (not evenly spaced), per KV head and channel for K
    k_lut = torch.sort(torch.randn((kv_heads, head_dim, 4), generator=g, device=dev), -1).values.half()
    v_lut = torch.tensor([-1.0, -0.3, 0.25, 1.0], device=dev).half()  # one per layer, normalized
    v_scale = (torch.rand((batch, kv_heads, tokens), generator=g, device=dev) + 0.5).half()
    v_zero = (torch.randn((batch, kv_heads, tokens), generator=g, device=dev) * 0.1).half()
    rows = batch * kv_heads * tokens
    out = {
        "k_codes": pack2(kc),
        "v_codes": pack2(vc),
        "k_lut": k_lut,
        "v_lut": v_lut,
        "v_scale": v_scale,
        "v_zero": v_zero,
        "shape": shape,
    }
    del kc, vc
    for name in ("k", "v"):
        nnz = max(1, int(round(outlier_fraction * rows * head_dim)))
        flat = torch.randperm(rows * head_dim, generator=g, device=dev)[:nnz].sort().values
        r, c = flat // head_dim, flat % head_dim
        crow = torch.zeros(rows + 1, dtype=torch.int64, device=dev)
        crow[1:] = torch.bincount(r, minlength=rows).cumsum(0)
        out[f"{name}_crow"], out[f"{name}_col"] = crow, c.to(torch.int32)
        out[f"{name}_val"] = (torch.randn(nnz, generator=g, device=dev) * 8).half()  # outliers: large values
        out[f"{name}_nnz"] = nnz
    return out


class KVQuantReference:
    """The reference path's three parts over preallocated FP16 buffers (what a decode step runs)."""

    def __init__(self, cache: dict):
        self.c = cache
        b, h, t, d = cache["shape"]
        dev = cache["k_codes"].device
        self.k = torch.empty(cache["shape"], dtype=torch.float16, device=dev)
        self.v = torch.empty_like(self.k)
        self.shifts = torch.tensor([0, 2, 4, 6], dtype=torch.uint8, device=dev)
        # flat-table offset of each (head, channel): K entry = k_lut[h, d, code]
        self.k_base = (torch.arange(h * d, device=dev) * 4).view(1, h, 1, d)

    def _codes(self, packed: torch.Tensor) -> torch.Tensor:
        """uint8 [..., D/4] -> int64 codes [..., D]."""
        c = (packed[..., None] >> self.shifts) & 3
        return c.reshape(*packed.shape[:-1], -1).long()

    def lut_dequant(self) -> None:
        c = self.c
        kc = self._codes(c["k_codes"])
        torch.index_select(c["k_lut"].view(-1), 0, (kc + self.k_base).view(-1), out=self.k.view(-1))
        vc = self._codes(c["v_codes"])
        torch.addcmul(c["v_zero"][..., None], c["v_lut"][vc], c["v_scale"][..., None], out=self.v)

    def outliers_csr(self) -> None:
        """The CSR row pointers expanded to each outlier's row (output size known: no host sync), then
        one scatter per tensor over the dense buffer.  The expansion runs on every call: the sparse
        matrix grows with every appended token."""
        c, d = self.c, self.c["shape"][3]
        b, h, t, _ = c["shape"]
        for name, buf in (("k", self.k), ("v", self.v)):
            rows = torch.repeat_interleave(
                torch.arange(b * h * t, device=buf.device), c[f"{name}_crow"].diff(), output_size=c[f"{name}_nnz"]
            )
            buf.view(-1).index_put_((rows * d + c[f"{name}_col"].long(),), c[f"{name}_val"])

    def sdpa(self, q: torch.Tensor) -> torch.Tensor:
        """q [B, HQ, D] -> [B, HQ, D] over the dequantized buffers."""
        return F.scaled_dot_product_attention(q[:, :, None], self.k, self.v, enable_gqa=True)[:, :, 0]

    def total(self, q: torch.Tensor) -> torch.Tensor:
        self.lut_dequant()
        self.outliers_csr()
        return self.sdpa(q)


def kvquant_ref64(cache: dict) -> tuple[torch.Tensor, torch.Tensor]:
    """float64 K, V of the format, written element by element from its definition (the test's oracle)."""
    b, h, t, d = cache["shape"]
    k = torch.empty((b, h, t, d), dtype=torch.float64)
    v = torch.empty_like(k)
    kp, vp = cache["k_codes"].cpu().long(), cache["v_codes"].cpu().long()
    k_lut, v_lut = cache["k_lut"].cpu().double(), cache["v_lut"].cpu().double()
    vs, vz = cache["v_scale"].cpu().double(), cache["v_zero"].cpu().double()
    for ch in range(d):
        kcode = (kp[..., ch // 4] >> (2 * (ch % 4))) & 3
        vcode = (vp[..., ch // 4] >> (2 * (ch % 4))) & 3
        k[..., ch] = k_lut[:, ch][torch.arange(h)[None, :, None], kcode]
        v[..., ch] = v_lut[vcode] * vs + vz
    for name, x in (("k", k), ("v", v)):
        crow, col, val = (cache[f"{name}_crow"].cpu(), cache[f"{name}_col"].cpu(), cache[f"{name}_val"].cpu())
        flat = x.view(-1, d)
        for row in range(flat.shape[0]):
            for j in range(int(crow[row]), int(crow[row + 1])):
                flat[row, int(col[j])] = float(val[j])
    return k, v


def check(device) -> float:
    """The reference path on `device` at a small shape against kvquant_ref64 (poisoned buffers first);
    returns the relative error of the attention output (ValueError if any part is wrong)."""
    cache = make_kvquant(2, 2, 37, 128, 0.02, seed=3, device=device)
    ref = KVQuantReference(cache)
    ref.k.fill_(float("nan"))
    ref.v.fill_(float("nan"))
    ref.lut_dequant()
    ref.outliers_csr()
    k64, v64 = kvquant_ref64(cache)
    if not torch.equal(ref.k.double().cpu(), k64.half().double()):
        raise ValueError("LUT dequantization of K differs from its definition")
    if float((ref.v.double().cpu() - v64).abs().max()) > 2e-3 * float(v64.abs().max()):
        raise ValueError("LUT dequantization of V differs from its definition")
    q = torch.randn((2, 8, 128), device=device).half()
    out = ref.sdpa(q).double().cpu()
    p = torch.softmax(torch.einsum("bhd,bhtd->bht", q.double().cpu(), k64.repeat_interleave(4, 1)) / 128**0.5, -1)
    want = torch.einsum("bht,bhtd->bhd", p, v64.repeat_interleave(4, 1))
    err = float((out - want).norm() / want.norm())
    if not err < 5e-3:
        raise ValueError(f"SDPA over the dequantized buffers: rel err {err:.2e}")
    return err


# ---- timing -------------------------------------------------------------------------------------
def time_s(fn, reps: int = 30, warmup: int = 3, per_graph: int = 10) -> tuple[float, float]:
    """(graph_s, eager_s): median seconds of one fn() call as a CUDA-graph replay of per_graph calls
    (the GPU's own time: what an engine replaying graphs pays) and called one after another from
    Python with CUDA events around each (a reference implementation's cost, the host's launches
    included where they outlast the GPU work).  On the CPU both are the host clock of fn()."""
    for _ in range(warmup):
        fn()
    if not torch.cuda.is_available():
        ts = []
        for _ in range(max(1, reps // 10)):
            t = time.perf_counter()
            fn()
            ts.append(time.perf_counter() - t)
        return statistics.median(ts), statistics.median(ts)
    from .measure import time_events_s

    eager = time_events_s(fn, reps, warmup=0)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        fn()
    torch.cuda.current_stream().wait_stream(side)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(per_graph):
            fn()
    graph = time_events_s(g.replay, reps, warmup=1) / per_graph
    del g
    return graph, eager


def _sets(nbytes: int) -> int:
    """Input sets to rotate so that one pass over them reads at least 4x the L2."""
    return max(1, min(8, math.ceil(4 * L2_BYTES / max(nbytes, 1))))


def bench_kvquant(
    device,
    contexts=CONTEXTS,
    batch=BATCH,
    q_heads=Q_HEADS,
    kv_heads=KV_HEADS,
    head_dim=HEAD_DIM,
    outlier_fraction=OUTLIER_FRACTION,
    reps=30,
    log=print,
) -> list[dict]:
    rows = []
    for ctx in contexts:
        units = batch * ctx * kv_heads * head_dim * 2
        n = _sets(units * 2)
        refs = [
            KVQuantReference(make_kvquant(batch, kv_heads, ctx, head_dim, outlier_fraction, 100 + i, device))
            for i in range(n)
        ]
        qs = [torch.randn((batch, q_heads, head_dim), device=device).half() for _ in range(n)]
        it = {"i": 0}

        def nxt():
            it["i"] = (it["i"] + 1) % n
            return refs[it["i"]], qs[it["i"]]

        parts = {
            "lut_dequant": lambda: nxt()[0].lut_dequant(),
            "outliers_csr": lambda: nxt()[0].outliers_csr(),
            "sdpa_fp16": lambda: (lambda r, q: r.sdpa(q))(*nxt()),
            "total": lambda: (lambda r, q: r.total(q))(*nxt()),
        }
        for part, fn in parts.items():
            t, te = time_s(fn, reps)
            rows.append(
                {
                    "implementation": "kvquant_reference",
                    "kernel": part,
                    "batch": batch,
                    "q_heads": q_heads,
                    "kv_heads": kv_heads,
                    "head_dim": head_dim,
                    "context_tokens": ctx,
                    "outlier_fraction": outlier_fraction,
                    "units": units,
                    "time_s": t,
                    "eager_time_s": te,
                }
            )
        log(
            f"kvquant_reference ctx {ctx}: "
            + ", ".join(
                f"{r['kernel']} {r['time_s'] * 1e6:.1f} us (eager {r['eager_time_s'] * 1e6:.1f})"
                for r in rows[-len(parts) :]
            )
        )
        refs.clear()
        qs.clear()
    return rows


def bench_requantize(
    device,
    batches=REQUANT_BATCHES,
    kv_heads=KV_HEADS,
    head_dim=HEAD_DIM,
    partition=PARTITION,
    append_context=8192,
    reps=30,
    log=print,
) -> list[dict]:
    from .kernels.kv_cache import append_token, build_cache
    from .kernels.quantize import quantize_v

    rows = []
    for b in batches:
        units = b * kv_heads * partition * head_dim
        n = _sets(units * 2)
        blocks = [torch.randn((b, kv_heads, partition, head_dim), device=device).half() for _ in range(n)]
        it = {"i": 0}

        def req():
            it["i"] = (it["i"] + 1) % n
            quantize_v(blocks[it["i"]], None, partition, 2, True, 7)

        t, te = time_s(req, reps)
        rows.append(
            {
                "implementation": "no_rqe_requantize",
                "kernel": "requantize_block",
                "batch": b,
                "kv_heads": kv_heads,
                "head_dim": head_dim,
                "partition": partition,
                "units": units,
                "time_s": t,
                "eager_time_s": te,
            }
        )
        # the append with and without RQE at an open block half full (no RQE: dequantize the block's
        # 32 tokens, add the new one, requantize)
        ctx = append_context
        lens = torch.full((b,), ctx - partition // 2, dtype=torch.int32, device=device)
        k = torch.randn((b, kv_heads, ctx, head_dim), device=device).half()
        kn = torch.randn((b, kv_heads, head_dim), device=device).half()
        for rqe in (True, False):
            cache = build_cache(k, k, lens, partition, 2, rqe=rqe, stochastic=True, seed=3, capacity=ctx)
            t, te = time_s(lambda c=cache: append_token(c, kn, kn, stochastic=True, seed=5), reps)
            rows.append(
                {
                    "implementation": "no_rqe_requantize",
                    "kernel": "append_rqe" if rqe else "append_no_rqe",
                    "batch": b,
                    "kv_heads": kv_heads,
                    "head_dim": head_dim,
                    "partition": partition,
                    "context_tokens": ctx,
                    "units": units,
                    "time_s": t,
                    "eager_time_s": te,
                }
            )
        del k, cache
        log(
            f"no_rqe_requantize batch {b}: "
            + ", ".join(
                f"{r['kernel']} {r['time_s'] * 1e6:.1f} us (eager {r['eager_time_s'] * 1e6:.1f})" for r in rows[-3:]
            )
        )
    return rows


def fit(rows: list[dict]) -> dict:
    """Per (implementation, kernel): least squares time_s = overhead_s + s_per_unit * units (both >= 0),
    and the largest relative residual."""
    import numpy as np
    from scipy.optimize import lsq_linear

    out: dict = {}
    keys = sorted({(r["implementation"], r["kernel"]) for r in rows})
    for impl, kern in keys:
        rs = [r for r in rows if (r["implementation"], r["kernel"]) == (impl, kern)]
        x = np.array([r["units"] for r in rs], dtype=float)
        y = np.array([r["time_s"] for r in rs], dtype=float)
        # relative least squares: every shape counts, not only the largest
        a = np.stack([np.ones_like(x), x], 1) / y[:, None]
        sol = lsq_linear(a, np.ones_like(y), bounds=([0, 0], [np.inf, np.inf]))
        o, s = (float(v) for v in sol.x)
        pred = o + s * x
        out.setdefault(impl, {})[kern] = {
            "overhead_s": o,
            "s_per_unit": s,
            "n": len(rs),
            "max_abs_error_pct": float(np.max(np.abs(pred - y) / y) * 100),
            "unit": (
                "K and V elements (batch x tokens x kv_heads x head_dim x 2)"
                if impl == "kvquant_reference"
                else "V elements of the open blocks requantized (batch x kv_heads x PI x head_dim)"
            ),
        }
    return out


def provenance(argv) -> dict:
    from .measure import provenance as base

    return {
        "gpu_name": "cpu",
        "driver": "",
        **base(),
        "command": "python -m kernels_calibration.impl_bench " + " ".join(argv),
    }


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    ap = argparse.ArgumentParser(
        prog="python -m kernels_calibration.impl_bench",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--smoke", action="store_true", help="tiny shapes on the CPU: plumbing and correctness only")
    ap.add_argument("--reps", type=int, default=30)
    a = ap.parse_args(argv)
    if a.smoke:
        os.environ.setdefault("TRITON_INTERPRET", "1")
        dev = torch.device("cpu")
        kq = dict(contexts=(64, 128), batch=2, q_heads=4, kv_heads=2, head_dim=128)
        rq = dict(batches=(1, 2), kv_heads=2, append_context=128)
    else:
        if not torch.cuda.is_available():
            print("impl_bench needs a CUDA GPU (or --smoke)", file=sys.stderr)
            return 2
        dev = torch.device("cuda")
        kq, rq = {}, {}
    print(
        f"check: the KVQuant reference path on {dev.type} matches its float64 definition "
        f"(attention rel err {check(dev):.2e})",
        flush=True,
    )
    rows = bench_kvquant(dev, reps=a.reps, log=lambda s: print(s, flush=True), **kq)
    rows += bench_requantize(dev, reps=a.reps, log=lambda s: print(s, flush=True), **rq)
    doc = {"provenance": provenance(argv), "fits": fit(rows), "rows": rows}
    a.out.parent.mkdir(parents=True, exist_ok=True)
    tmp = a.out.with_suffix(".tmp")
    tmp.write_text(json.dumps(doc, indent=1) + "\n")
    tmp.replace(a.out)
    for impl, kerns in doc["fits"].items():
        for k, f in kerns.items():
            print(
                f"{impl}.{k}: {f['overhead_s'] * 1e6:.2f} us + {f['s_per_unit'] * 1e12:.3f} ps/unit "
                f"(max error {f['max_abs_error_pct']:.1f} %, {f['n']} shapes)"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
