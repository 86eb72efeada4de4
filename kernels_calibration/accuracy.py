"""Accuracy of HACK attention against FP16 attention (and of the other compressed baselines).

    python -m kernels_calibration.accuracy --out DIR      # GPU; writes DIR/accuracy.csv

For PI in {32, 64, 128}, stochastic vs nearest rounding, and two input families:
  random   Q, K, V ~ N(0, 1) iid;
  outlier  as real keys: K gets a per-channel offset ~ N(0, 2) and 4 of 128 channels scaled x10
           (K outlier channels, KVQuant/KIVI observations), V stays N(0, 1);
a prefilled context of 4096 tokens per request (batch 4, 64/8 heads, head_dim 128) is quantized,
then 37 decode steps append tokens (exercising the RQE tail / requantization), and the decode
output for a fresh query is compared with exact attention (float32) over the FP16 K/V:
rel_error = ||out - ref|| / ||ref||.  Prefill: causal HACK prefill over 2048 tokens likewise.
"""

from __future__ import annotations

import argparse
import csv
import sys
from pathlib import Path

import torch

from .kernels.attn_decode import fp_attn_decode, to_fp8
from .kernels.dequant_attn_decode import dequant_attn_decode
from .kernels.hack_attn_decode import hack_attn_decode
from .kernels.hack_attn_prefill import hack_attn_prefill
from .kernels.kv_cache import append_token, build_cache

B, HQ, HKV, D, CTX, STEPS = 4, 64, 8, 128, 4096, 37


def _inputs(kind: str, n: int, gen, dev="cuda"):
    k = torch.randn(B, HKV, n, D, device=dev, generator=gen)
    v = torch.randn(B, HKV, n, D, device=dev, generator=gen)
    if kind == "outlier":
        k = k + 2.0 * torch.randn(1, HKV, 1, D, device=dev, generator=gen)
        idx = torch.randperm(D, device=dev, generator=gen)[:4]
        k[..., idx] *= 10.0
    return k.half(), v.half()


def _exact_decode(q, k, v, n):
    kk = k[:, :, :n].float().repeat_interleave(HQ // HKV, 1)
    vv = v[:, :, :n].float().repeat_interleave(HQ // HKV, 1)
    s = torch.einsum("bhd,bhnd->bhn", q.float(), kk) / D**0.5
    return torch.einsum("bhn,bhnd->bhd", torch.softmax(s, -1), vv)


def rel(a, b) -> float:
    return float((a.float() - b.float()).norm() / b.float().norm())


def run(out: Path) -> list[dict]:
    rows = []
    gen = torch.Generator(device="cuda").manual_seed(1234)
    for kind in ("random", "outlier"):
        k, v = _inputs(kind, CTX + STEPS + 128, gen)
        q = torch.randn(B, HQ, D, device="cuda", generator=gen).half()
        n = CTX + STEPS
        lens0 = torch.full((B,), CTX, dtype=torch.int32, device="cuda")
        ref = _exact_decode(q, k, v, n)
        k8, ks = to_fp8(k)
        v8, vs = to_fp8(v)
        lens_n = torch.full((B,), n, dtype=torch.int32, device="cuda")
        rows.append(
            dict(
                kernel="fp8",
                partition=0,
                bits=8,
                rounding="nearest",
                inputs=kind,
                phase="decode",
                rel_error=rel(fp_attn_decode(q, k8, v8, lens_n, ks, vs), ref),
            )
        )
        for pi in (32, 64, 128):
            for rounding in ("stochastic", "nearest"):
                st = rounding == "stochastic"
                for variant, rqe in (("hack", True), ("hack_no_rqe", False)):
                    c = build_cache(k, v, lens0, pi, 2, rqe=rqe, stochastic=st, seed=7, capacity=k.shape[2])
                    for i in range(STEPS):
                        c = append_token(
                            c, k[:, :, CTX + i].contiguous(), v[:, :, CTX + i].contiguous(), stochastic=st, seed=100 + i
                        )
                    rows.append(
                        dict(
                            kernel=variant,
                            partition=pi,
                            bits=2,
                            rounding=rounding,
                            inputs=kind,
                            phase="decode",
                            rel_error=rel(hack_attn_decode(q, c), ref),
                        )
                    )
                    if rqe:
                        rows.append(
                            dict(
                                kernel="dequant_fused",
                                partition=pi,
                                bits=2,
                                rounding=rounding,
                                inputs=kind,
                                phase="decode",
                                rel_error=rel(dequant_attn_decode(q, c), ref),
                            )
                        )
        # prefill, 2048 tokens, batch 1
        seq = 2048
        kp, vp = k[:1, :, :seq].contiguous(), v[:1, :, :seq].contiguous()
        qp = torch.randn(1, HQ, seq, D, device="cuda", generator=gen).half()
        refp = torch.nn.functional.scaled_dot_product_attention(
            qp.float(), kp.float(), vp.float(), is_causal=True, enable_gqa=True
        )
        for pi in (32, 64, 128):
            for rounding in ("stochastic", "nearest"):
                c = build_cache(
                    kp,
                    vp,
                    torch.tensor([seq], device="cuda"),
                    pi,
                    2,
                    rqe=False,
                    stochastic=rounding == "stochastic",
                    seed=3,
                )
                rows.append(
                    dict(
                        kernel="hack",
                        partition=pi,
                        bits=2,
                        rounding=rounding,
                        inputs=kind,
                        phase="prefill",
                        rel_error=rel(hack_attn_prefill(qp, c), refp),
                    )
                )
    for r in rows:
        r["rel_error"] = round(r["rel_error"], 5)
        print(r, flush=True)
    out.mkdir(parents=True, exist_ok=True)
    with (out / "accuracy.csv").open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=["kernel", "partition", "bits", "rounding", "inputs", "rel_error", "phase"])
        w.writeheader()
        w.writerows(rows)
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="HACK accuracy vs FP16 attention")
    ap.add_argument("--out", type=Path, required=True)
    run(ap.parse_args(argv).out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
