"""Speed benchmark at the issue's shapes (batch 8, 64 query heads, 8 KV heads, head_dim 128).

    python -m kernels_calibration.bench --out DIR [--quick]

Writes DIR/bench_attention.csv (columns kernel, phase, batch, context_len, q_heads, kv_heads,
head_dim, partition, bits, time_us, achieved_gbps, achieved_tflops, then byte_floor_us,
compute_floor_us, units, config) and DIR/peaks.json.  The floors use this run's measured copy
bandwidth and GEMM rates (INT8 for hack rows, FP16 otherwise).  Targets (issue 3) are printed
beside the figures; nothing here asserts a time.

DIR/bench_scoring.csv (same columns): the issue-7 scoring kernels at the same heads and batch, per
context length: pq_score (PQCache, M = 2, 8-bit codes), qk_score (HCAttention, 4-bit keys, PI = 64)
and torch.topk over the scores with k = ctx / 5 (--no-scoring skips them).
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
from pathlib import Path

from .measure import DECODE_KERNELS, measure_decode, measure_peaks, measure_prefill, provenance

B, HQ, HKV, D = 8, 64, 8, 128
COLUMNS = [
    "kernel",
    "phase",
    "batch",
    "context_len",
    "q_heads",
    "kv_heads",
    "head_dim",
    "partition",
    "bits",
    "time_us",
    "achieved_gbps",
    "achieved_tflops",
    "byte_floor_us",
    "compute_floor_us",
    "units",
    "config",
]


def tuned_configs(ctx: int, pi: int = 64) -> dict:
    """Narrow tuning keyed on the shape, the fastest reported, all printed (dicts of the families'
    LaunchConfig fields, kernels/launch.py).  HACK: the decode step (append fused into the row-packed
    attention launch up to 2K tokens, else append + the Gluon kernel at PI 64 on Hopper, the row-packed
    one otherwise) with warps and the register cap, and the unfused step at short contexts; fused
    dequant: the Gluon kernel at two split counts and the Triton kernel; FP16/FP8: splits (x1, x2 the
    default heuristic)."""
    from .kernels.dispatch import FUSED_STEP_MAX_LEN
    from .kernels.split_k import default_splits

    s0 = default_splits(B, HKV, ctx + 1, max(pi, 128), _device())
    if ctx + 1 <= FUSED_STEP_MAX_LEN:
        h = [
            {"splits": s0},
            {"splits": s0, "num_warps": 4},
            {"splits": s0, "fused": False},
            {"splits": s0, "fused": False, "num_warps": 2},
        ]
    elif pi == 64 and _hopper():  # the Gluon HACK kernel (the default here), its 128-register variant and
        # the row-packed kernel's best
        h = [
            {},
            {"kernel": "gluon", "maxnreg": 128},
            {"kernel": "row_packed", "splits": s0, "num_warps": 2, "maxnreg": 128},
        ]
    else:
        h = [{"splits": s0, "num_warps": w, "maxnreg": mr} for w, mr in ((2, 128), (4, 128), (4, 0))]
    q = [{"splits": s0}, {"splits": max(1, s0 // 2)}, {"splits": s0, "kernel": "triton"}]
    f = [{"splits": s, "num_warps": 4} for s in (s0, 2 * s0)]
    return {
        "hack": h,
        "hack_no_se": h,
        "hack_no_rqe": h,
        "dequant_fused": q,
        "fp16_triton": f,
        "fp8": f,
        "dequant_unfused": [{"splits": s0}, {"splits": 2 * s0}],
    }


def _hopper() -> bool:
    """The Gluon kernels run here (sm_90 or newer)."""
    import torch

    return torch.cuda.get_device_capability(_device())[0] >= 9


def _device():
    import torch

    return torch.device("cuda", 0)


def write_csv(rows: list[dict], path: Path) -> None:
    with path.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=COLUMNS, extrasaction="ignore")
        w.writeheader()
        w.writerows(rows)


HACK_KINDS = ("hack", "hack_no_se", "hack_no_rqe")


ONLY_GROUPS = {"hack": HACK_KINDS, "hack_pi64": HACK_KINDS, "dequant": ("dequant_fused",), "prefill": ()}


def run_only(out: Path, merge: Path, groups: tuple[str, ...] = ("hack",)) -> list[dict]:
    """Re-measure some rows only and merge them into the table at `merge` (rows of the same kernel,
    phase, context and PI are replaced): a kernel change without re-running every baseline.
    groups: hack (the HACK decode rows; hack_pi64: those at PI 64), dequant (fused dequant decode), prefill (HACK prefill);
    the references the targets compare against (SDPA, and the Triton FP16 kernels) are re-measured
    in the same run."""
    out.mkdir(parents=True, exist_ok=True)
    peaks = measure_peaks()
    (out / "peaks.json").write_text(json.dumps({"peaks": peaks, "provenance": provenance()}, indent=1))
    kinds = tuple(k for g in groups for k in ONLY_GROUPS[g])
    refs = ("torch_sdpa_fp16",) + (("fp16_triton",) if "dequant" in groups else ())
    new = []
    if kinds:
        for ctx in (1024, 4096, 16384, 32768):
            new += [
                m.row(peaks) for m in measure_decode(kinds + refs, B, ctx, HQ, HKV, D, 64, configs=tuned_configs(ctx))
            ]
        for pi in (32, 128) if groups != ("hack_pi64",) else ():  # hack_pi64: the PI 64 rows only
            new += [
                m.row(peaks) for m in measure_decode(kinds, B, 32768, HQ, HKV, D, pi, configs=tuned_configs(32768, pi))
            ]
    if "prefill" in groups:
        for seq in (4096, 16384):
            ms = measure_prefill(("hack", "fp16_triton", "torch_sdpa_fp16"), 1, seq, HQ, HKV, D, 64)
            if seq == 16384:
                ms += measure_prefill(("hack",), 1, seq, HQ, HKV, D, 128)
            new += [m.row(peaks) for m in ms]
    for r in new:
        print(
            f"{r['phase']} ctx={r['context_len']:6d} pi={r['partition']:3d} {r['kernel']:16s} "
            f"{r['time_us']:9.1f} us  {r['config']}",
            flush=True,
        )
    rows = merge_rows(new, merge)
    write_csv(rows, out / "bench_attention.csv")
    summarize(rows)
    return rows


def merge_rows(new: list[dict], merge: Path) -> list[dict]:
    """The table at `merge` with each row of `new` in place of the row of the same kernel, phase,
    context and PI (rows the table lacks go at the end)."""
    key = lambda r: (r["kernel"], r["phase"], int(r["context_len"]), int(r["partition"]))  # noqa: E731
    fresh = {key(r): r for r in new}
    with merge.open() as f:
        old = list(csv.DictReader(f))
    seen = {key(r) for r in old}
    rows = [fresh.get(key(r), r) for r in old] + [r for r in new if key(r) not in seen]
    for r in rows:
        for k in ("time_us", "achieved_gbps", "achieved_tflops", "byte_floor_us", "compute_floor_us", "units"):
            r[k] = float(r[k])
        for k in ("batch", "context_len", "q_heads", "kv_heads", "head_dim", "partition", "bits"):
            r[k] = int(r[k])
    return rows


def run(out: Path, quick: bool = False, scoring: bool = True) -> list[dict]:
    out.mkdir(parents=True, exist_ok=True)
    peaks = measure_peaks()
    prov = provenance()
    (out / "peaks.json").write_text(json.dumps({"peaks": peaks, "provenance": prov}, indent=1))
    print("peaks", json.dumps(peaks), flush=True)
    rows = []
    ctxs = (1024, 32768) if quick else (1024, 4096, 16384, 32768)
    for ctx in ctxs:
        ms = measure_decode(DECODE_KERNELS, B, ctx, HQ, HKV, D, 64, configs=tuned_configs(ctx))
        rows += [m.row(peaks) for m in ms]
        for m in ms:
            print(f"decode ctx={ctx:6d} {m.kernel:16s} {m.time_s * 1e6:9.1f} us  {m.config}", flush=True)
        write_csv(rows, out / "bench_attention.csv")
    for pi in (32, 128):
        ms = measure_decode(
            ("hack", "hack_no_se", "hack_no_rqe", "dequant_fused"),
            B,
            32768,
            HQ,
            HKV,
            D,
            pi,
            configs=tuned_configs(32768, pi),
        )
        rows += [m.row(peaks) for m in ms]
        for m in ms:
            print(f"decode ctx=32768 pi={pi} {m.kernel:16s} {m.time_s * 1e6:9.1f} us", flush=True)
    write_csv(rows, out / "bench_attention.csv")
    for seq in (16384,) if quick else (4096, 16384):
        ms = measure_prefill(("hack", "fp16_triton", "torch_sdpa_fp16"), 1, seq, HQ, HKV, D, 64)
        if seq == 16384:
            ms += measure_prefill(("hack",), 1, seq, HQ, HKV, D, 128)
        rows += [m.row(peaks) for m in ms]
        for m in ms:
            print(
                f"prefill L={seq} {m.kernel:16s} {m.time_s * 1e6:9.1f} us {m.flops / m.time_s / 1e12:6.1f} TFLOP/s",
                flush=True,
            )
    write_csv(rows, out / "bench_attention.csv")
    summarize(rows)
    if scoring:
        run_scoring(out, peaks, ctxs)
    return rows


def run_scoring(out: Path, peaks: dict, ctxs) -> list[dict]:
    from .profile import SCORE_CONFIGS, measure_scoring

    rows = []
    for ctx in ctxs:
        ms = measure_scoring(("pq_score", "qk_score", "topk"), B, ctx, HQ, HKV, D, configs=SCORE_CONFIGS)
        rows += [m.row(peaks) for m in ms]
        for m in ms:
            gbps = m.bytes_moved / m.time_s / 1e9
            print(
                f"score ctx={ctx:6d} {m.kernel:10s} {m.time_s * 1e6:9.1f} us {gbps:7.0f} GB/s  {m.config}", flush=True
            )
        write_csv(rows, out / "bench_scoring.csv")
    return rows


def summarize(rows: list[dict]) -> None:
    def t(kernel, phase, ctx, pi=None):
        for r in rows:
            if (
                r["kernel"] == kernel
                and r["phase"] == phase
                and int(r["context_len"]) == ctx
                and (pi is None or int(r["partition"]) in (pi, 0))
            ):
                return float(r["time_us"])
        return float("nan")

    sd32, h32 = t("torch_sdpa_fp16", "decode", 32768), t("hack", "decode", 32768, 64)
    print(f"TARGET hack decode 32K >= 4x SDPA: sdpa {sd32:.1f} us, hack {h32:.1f} us -> {sd32 / h32:.2f}x")
    print(
        f"TARGET hack decode 1K <= SDPA: sdpa {t('torch_sdpa_fp16', 'decode', 1024):.1f} us, "
        f"hack {t('hack', 'decode', 1024, 64):.1f} us"
    )
    fa, hp = t("fp16_triton", "prefill", 16384), t("hack", "prefill", 16384, 64)
    print(f"TARGET hack prefill 16K >= 1.3x FP16 Triton FA: fa {fa:.0f} us, hack {hp:.0f} us -> {fa / hp:.2f}x")
    best16 = min(sd32, t("fp16_triton", "decode", 32768))
    df = t("dequant_fused", "decode", 32768, 64)
    print(f"TARGET fused dequant 32K >= 2x FP16: fp16 {best16:.1f} us, fused {df:.1f} us -> {best16 / df:.2f}x")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--no-scoring", action="store_true", help="skip the scoring kernels (bench_scoring.csv)")
    ap.add_argument(
        "--merge",
        type=Path,
        default=None,
        metavar="TABLE",
        help="re-measure only the rows of --only and merge them into TABLE",
    )
    ap.add_argument(
        "--only", default="hack", help=f"with --merge: comma-separated groups of {sorted(ONLY_GROUPS)} (default hack)"
    )
    ap.add_argument("--hack-only", type=Path, default=None, metavar="TABLE", help="= --merge TABLE --only hack")
    args = ap.parse_args(argv)
    if args.hack_only or args.merge:
        groups = tuple(g.strip() for g in args.only.split(",") if g.strip())
        bad = [g for g in groups if g not in ONLY_GROUPS]
        if bad:
            ap.error(f"--only: unknown group(s) {bad}; choose from {sorted(ONLY_GROUPS)}")
        run_only(args.out, args.merge or args.hack_only, groups if args.merge else ("hack",))
    else:
        run(args.out, args.quick, not args.no_scoring)
    return 0


if __name__ == "__main__":
    sys.exit(main())
