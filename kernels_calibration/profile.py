"""Profiling harness: sweep shapes for every kernel and the GEMMs, fit the cost model's profile.

    python -m kernels_calibration.profile --out DIR [--quick]      # on a GPU: measure, then fit
    python -m kernels_calibration.profile --fit-only DIR/rows.csv --out DIR   # refit, no GPU
    python -m kernels_calibration.profile --only score --out DIR   # on a GPU: the scoring kernels only
    python -m kernels_calibration.profile --only hack,dequant --out DIR   # (or some kernels only), then
    python -m kernels_calibration.profile --fit-only kernels_calibration/profiles/h200/profile_rows.csv \
        DIR/rows.csv --out DIR2      # refit the committed rows with the new ones in their place (DIR2/rows.csv)

A full run also measures the layer's GEMMs and elementwise kernels (dense_bench.py) into
DIR/dense_rows.csv and writes their fit as the profile's `gemm` and `kernels.elementwise`; --fit-only
picks up a dense_rows.csv (and stepprof_*.csv: python -m realrun.stepprof, a decode step replayed as a CUDA graph,
kernel by kernel) lying beside a rows file it is given.

Writes DIR/rows.csv (one tidy row per kernel and shape: median time, achieved GB/s and TFLOP/s,
floors, the launch config, provenance) and DIR/profile.json in the contract of
costmodel/calibration.py: for each kernel key, time_s = overhead_s + s_per_unit * units, fitted by
least squares on relative error over the training shapes; heldout_median_error_pct is the median
|predicted - measured| / measured over shapes kept out of the fit.

Units (fixed by the contract): decode_attn.*: sum_b ctx_b * H_kv * D * 2 KV elements (GQA group 8; rows at
another group g fit decode_attn.<key>_gqa<g>, see GQA4_SHAPES);
prefill_attn.*: 4 * H_q * D * sum_b L_b (L_b + 1) / 2 FLOPs; quantize.kv / dequantize.kv: K and V
elements.  decode_attn.fp16 and prefill_attn.fp16 take, per shape, the faster of torch SDPA and the
Triton FP16 kernel.  Sweeps cover batch, context length, heads (H_q/H_kv = 8 throughout, plus a
32/4 check), PI for HACK decode (extra keys decode_attn.hack_pi32/_pi128); head_dim is 128 (the
HACK kernels need D % 128 == 0) and bits 2 (the HACK format).

Scoring kernels (issue 7; kernels/pq_score.py, kernels/qk_score.py), phase "score", 64 query / 8 KV
heads, head_dim 128, every request at ctx tokens:
  score.pq                    PQCache centroid scoring (LUT + code gather), M = 2 sub-spaces, 8-bit
                              codes (the cost model's defaults); unit = scored tokens x KV heads,
                              sum_b ctx_b * H_kv.  score.pq_m8: the same at M = 8 (fewer shapes).
  score.quantized_keys        HCAttention q . dequant(k) over 4-bit keys, PI = 64; unit = key elements
                              scored, sum_b ctx_b * H_kv * D.  score.quantized_keys_2bit: 2-bit keys.
  select.topk                 torch.topk over the FP32 scores [B, H_q, ctx] with k = ctx / 5 (PQCache's
                              default top-k fraction); unit = scores, sum_b ctx_b * H_q.
Rows record partition = channels per PQ sub-space (D / M) for pq_score and PI for qk_score.
"""

from __future__ import annotations

import argparse
import csv
import hashlib
import json
import sys
from pathlib import Path

import numpy as np

from costmodel.methods import PQCache, kernel_keys

DECODE_KEYS = {
    "hack": "hack",
    "hack_no_se": "hack_no_se",
    "hack_no_rqe": "hack_no_rqe",
    "fp8": "fp8",
    "dequant_fused": "dequant_fused",
    "dequant_unfused": "dequant_unfused",
    # the Triton fused-dequant kernel on its own (it runs where the Gluon kernel does not: sm < 90,
    # GQA other than 8, PI 32): what derive.py scales for GPUs before Hopper
    "dequant_fused_triton": "dequant_fused_triton",
    # the row-packed Triton HACK kernel's decode steps (PI 64; the Gluon kernel is the default above
    # 2K tokens on Hopper): what derive.py scales for GPUs before Hopper
    "hack_triton": "hack_triton",
    "hack_no_se_triton": "hack_no_se_triton",
    "hack_no_rqe_triton": "hack_no_rqe_triton",
}

# (batch, ctx, q_heads, kv_heads, held_out)
DECODE_SHAPES = [
    (1, 2048, 64, 8, False),
    (1, 8192, 64, 8, True),
    (1, 32768, 64, 8, False),
    (4, 1024, 64, 8, False),
    (4, 4096, 64, 8, True),
    (4, 16384, 64, 8, False),
    (8, 512, 64, 8, False),
    (8, 2048, 64, 8, True),
    (8, 8192, 64, 8, False),
    (8, 32768, 64, 8, True),
    (16, 1024, 64, 8, True),
    (16, 4096, 64, 8, False),
    (32, 2048, 64, 8, True),
    (16, 16384, 64, 8, False),
    (8, 4096, 32, 4, True),
]
DECODE_SHAPES_QUICK = [s for i, s in enumerate(DECODE_SHAPES) if i % 2 == 0 or s[4]][:8]
# HACK decode at 4 query heads per KV head (Llama-3.1-8B: 32 / 8), where the Gluon kernel does not run and the
# row-packed kernel packs 4 copies of the head group: fitted as decode_attn.hack_gqa4 (group "gqa4")
GQA4_HEADS = (32, 8)
GQA4_SHAPES = [(b, ctx, *GQA4_HEADS, held) for b, ctx, _, _, held in DECODE_SHAPES[:-1]] + [
    (48, 2048, *GQA4_HEADS, False),
    (64, 3072, *GQA4_HEADS, True),
]
# An engine's HACK decode attention as it runs in a CUDA-graph bucket (measure.measure_append_attend: the append,
# then attention sized by the bucket's max_len over ragged lengths, or equal ones): evidence rows beside the fits
# (phases decode_ragged / decode_append), not fitted; (batch, max_len, q_heads, kv_heads, ragged)
APPEND_ATTEND_SHAPES = [
    (8, 2304, 32, 8, True),
    (24, 2816, 32, 8, True),
    (40, 3328, 32, 8, True),
    (40, 3328, 32, 8, False),
    (64, 3584, 32, 8, True),
    (32, 2048, 32, 8, True),
    (24, 4608, 64, 8, True),
    (24, 4608, 64, 8, False),
]
PI_SHAPES = [(1, 8192, False), (8, 2048, True), (8, 32768, False), (4, 16384, True)]
PREFILL_SHAPES = [
    (1, 1024, False),
    (1, 2048, True),
    (1, 4096, False),
    (1, 8192, True),
    (1, 12288, False),
    (2, 4096, True),
    (4, 2048, False),
]
QUANT_SHAPES = [
    (1, 4096, False),
    (4, 4096, True),
    (8, 8192, False),
    (8, 32768, True),
    (2, 16384, False),
    (16, 2048, True),
    (32, 512, False),
]


# Scoring kernels: (batch, ctx, held_out); the token axis is the only one that matters to them
SCORE_SHAPES = [
    (1, 4096, False),
    (1, 32768, True),
    (4, 8192, False),
    (8, 1024, False),
    (8, 2048, True),
    (8, 8192, False),
    (8, 32768, False),
    (16, 4096, True),
    (16, 16384, False),
    (32, 2048, False),
    (32, 8192, True),
]
SCORE_SHAPES_QUICK = [s for i, s in enumerate(SCORE_SHAPES) if i % 2 == 0 or s[2]][:7]
SCORE_VARIANT_SHAPES = [(1, 8192, False), (8, 4096, True), (8, 32768, False), (16, 16384, True), (32, 2048, False)]
# narrow per-shape tuning of the scoring kernels: token block and warps (the fastest is kept)
SCORE_CONFIGS = {
    "pq_score": [{"block_t": 128, "num_warps": 4}, {"block_t": 256, "num_warps": 4}, {"block_t": 128, "num_warps": 2}],
    "qk_score": [{"block_t": 64, "num_warps": 4}, {"block_t": 128, "num_warps": 4}, {"block_t": 64, "num_warps": 2}],
}
TOPK_FRACTION = PQCache.model_fields["top_k_fraction"].default  # the method's default top-k fraction

# Every kernel some method prices with (the method registry), measured or not.
REQUIRED_KEYS = list(kernel_keys())
# narrow per-shape autotune of the quantized decode kernels: warps for the row-packed HACK kernel (its
# default picks 2 warps above 2K tokens, 4 below); fused dequant: the Gluon kernel (default on Hopper) or the
# Triton one, whichever is faster
HACK_DECODE_KINDS = ("hack", "hack_no_se", "hack_no_rqe")
# HACK: the decode step's default (above 2K tokens at PI 64 on Hopper the Gluon kernel) and the row-packed
# kernel with its own defaults (the same below 2K, where the fused row-packed step runs)
QUANT_DECODE_CONFIGS = {k: [{}, {"kernel": "row_packed"}] for k in HACK_DECODE_KINDS}
QUANT_DECODE_CONFIGS["dequant_fused"] = [{}, {"kernel": "triton"}]


def fit(points: list[tuple[float, float, bool]]) -> dict | None:
    """points: (units, time_s, held_out).  Relative-error least squares; overhead clamped >= 0.
    None when there are no points (the kernel was not measured)."""
    if not points:
        return None
    train = [(u, t) for u, t, h in points if not h]
    test = [(u, t) for u, t, h in points if h]
    if len(train) < 2:
        train = [(u, t) for u, t, _ in points]
    a = np.array([[1.0 / t, u / t] for u, t in train])
    coef, *_ = np.linalg.lstsq(a, np.ones(len(train)), rcond=None)
    ovh, spu = float(coef[0]), float(coef[1])
    if ovh < 0 or spu <= 0:
        ovh = 0.0
        spu = float(np.median([t / u for u, t in train]))
    err = [abs(ovh + spu * u - t) / t * 100 for u, t in (test or train)]
    return {
        "overhead_s": ovh,
        "s_per_unit": spu,
        "heldout_median_error_pct": round(float(np.median(err)), 2),
        "n_fit": len(train),
        "n_heldout": len(test),
    }


def measure_scoring(
    kernels,
    batch: int,
    ctx: int,
    q_heads: int = 64,
    kv_heads: int = 8,
    d: int = 128,
    subspaces: int = 2,
    pq_bits: int = 8,
    key_bits: int = 4,
    partition: int = 64,
    configs: dict | None = None,
    seed: int = 0,
    device: str = "cuda",
) -> list:
    """Time the scoring kernels ("pq_score", "qk_score", "topk") at one shape, as measure.py times
    decode steps: CUDA-graph replays over n_rot input sets (>= 256 MB per replay), median / n_rot.
    Codes and key metadata are random (uniform codes, positive scales): the kernels' time does not
    depend on the values.  configs: kernel -> list of wrapper kwargs; the fastest is kept."""
    import torch

    from .kernels.launch import ScoreConfig
    from .kernels.pq_score import pq_score, pq_score_work
    from .kernels.qk_score import qk_score, qk_score_work
    from .measure import Measurement, _n_rot, time_graph

    configs = configs or {}
    dev = device
    gen = torch.Generator(device=dev).manual_seed(seed)
    g = q_heads // kv_heads
    lens = torch.full((batch,), ctx, dtype=torch.int32, device=dev)
    q = torch.randn(batch, q_heads, d, device=dev, generator=gen, dtype=torch.float16)
    shape = dict(phase="score", batch=batch, context_len=ctx, q_heads=q_heads, kv_heads=kv_heads, head_dim=d)
    toks = batch * ctx
    out = []
    for name in kernels:
        if name == "pq_score":
            c = 2**pq_bits
            bm, ops = pq_score_work(toks, kv_heads, subspaces, g)
            n = _n_rot(bm)
            sets = [
                (
                    torch.randn(
                        batch, kv_heads, subspaces, c, d // subspaces, device=dev, generator=gen, dtype=torch.float16
                    ),
                    torch.randint(
                        0, c, (batch, kv_heads, ctx, subspaces), device=dev, generator=gen, dtype=torch.uint8
                    ),
                )
                for _ in range(n)
            ]

            def step(i, cfg, sets=sets):
                pq_score(q, *sets[i % len(sets)], lens, config=ScoreConfig(**cfg))

            meta = dict(
                partition=d // subspaces,
                bits=pq_bits,
                bytes_moved=bm,
                flops=ops,
                units=float(toks * kv_heads),
                extra={"subspaces": subspaces},
            )
        elif name == "qk_score":
            w, npart = d * key_bits // 8, d // partition
            bm, flops = qk_score_work(toks * kv_heads * d, key_bits, partition, g, d)
            n = _n_rot(bm)
            sets = [
                (
                    torch.randint(0, 256, (batch, kv_heads, ctx, w), device=dev, generator=gen, dtype=torch.uint8),
                    torch.randn(batch, kv_heads, ctx, npart, device=dev, generator=gen, dtype=torch.float16),
                    torch.rand(batch, kv_heads, ctx, npart, device=dev, generator=gen, dtype=torch.float16) + 0.01,
                )
                for _ in range(n)
            ]

            def step(i, cfg, sets=sets):
                qk_score(q, *sets[i % len(sets)], lens, partition, key_bits, config=ScoreConfig(**cfg))

            meta = dict(
                partition=partition, bits=key_bits, bytes_moved=bm, flops=flops, units=float(toks * kv_heads * d)
            )
        elif name == "topk":
            k = max(1, int(TOPK_FRACTION * ctx))
            units = toks * q_heads
            bm = 4.0 * units + 12.0 * batch * q_heads * k  # read FP32 scores, write values + int64 indices
            n = _n_rot(bm, 16)
            sets = [torch.randn(batch, q_heads, ctx, device=dev, generator=gen) for _ in range(n)]

            def step(i, cfg, sets=sets, k=k):
                torch.topk(sets[i % len(sets)], k, dim=-1)

            meta = dict(partition=0, bits=32, bytes_moved=bm, flops=0.0, units=float(units), extra={"top_k": k})
        else:
            raise ValueError(f"unknown scoring kernel {name!r}")
        best = None
        for cfg in configs.get(name, [{}]):
            try:
                t = time_graph(lambda i, cfg=cfg: step(i, cfg), len(sets))
            except Exception as exc:  # a config that fails to compile or launch is skipped, and said so
                print(f"    config {name} {cfg} failed: {type(exc).__name__}: {str(exc)[:200]}", flush=True)
                continue
            if best is None or t < best[0]:
                best = (t, cfg)
        if best is not None:
            out.append(Measurement(name, **shape, time_s=best[0], config=str(best[1]), **meta))
        del sets
    if dev == "cuda":
        torch.cuda.empty_cache()
    return out


def measure_all(out: Path, quick: bool, only: str = "all") -> list[dict]:
    import torch  # noqa: F401  (GPU only from here on)

    from .measure import DECODE_KERNELS, measure_decode, measure_peaks, measure_prefill, measure_quant, provenance

    peaks = measure_peaks()
    prov = provenance()
    print("peaks", json.dumps(peaks), flush=True)
    (out / "peaks.json").write_text(json.dumps({"peaks": peaks, "provenance": prov}, indent=1))
    rows: list[dict] = []

    def add(ms, held, **extra):
        for m in ms:
            r = m.row({**peaks, "int8_tops": peaks["int8_tops"] or peaks["fp16_tflops"]})
            r.update(
                held_out=held,
                **extra,
                **{k: prov.get(k, "") for k in ("gpu_name", "driver", "torch", "triton", "git_rev", "date")},
            )
            rows.append(r)
            print(
                f"{r['phase']:10s} {r['kernel']:16s} b={r['batch']:3d} ctx={r['context_len']:6d} "
                f"hq={r['q_heads']} pi={r['partition']:3d} {r['time_us']:10.1f} us {r['achieved_gbps']:8.0f} GB/s",
                flush=True,
            )
        write_rows(rows, out / "rows.csv")

    def score_sweep():
        for b, ctx, held in SCORE_SHAPES_QUICK if quick else SCORE_SHAPES:
            add(measure_scoring(("pq_score", "qk_score", "topk"), b, ctx, configs=SCORE_CONFIGS), held)
        for b, ctx, held in SCORE_VARIANT_SHAPES[:3] if quick else SCORE_VARIANT_SHAPES:
            add(measure_scoring(("pq_score",), b, ctx, subspaces=8, configs=SCORE_CONFIGS), held)
            add(measure_scoring(("qk_score",), b, ctx, key_bits=2, configs=SCORE_CONFIGS), held)

    groups = set(only.split(",")) if only != "all" else {"decode", "hack", "gqa4", "prefill", "quant", "score"}
    kinds = (
        DECODE_KERNELS
        if "decode" in groups
        else ((HACK_DECODE_KINDS if "hack" in groups else ()) + (("dequant_fused",) if "dequant" in groups else ()))
    )
    if kinds:
        for b, ctx, hq, hkv, held in DECODE_SHAPES_QUICK if quick else DECODE_SHAPES:
            add(measure_decode(kinds, b, ctx, hq, hkv, 128, 64, configs=QUANT_DECODE_CONFIGS), held)
    if "hack" in groups or "decode" in groups:
        for pi in (32, 128):
            for b, ctx, held in PI_SHAPES[:2] + PI_SHAPES[2:3] if quick else PI_SHAPES:
                add(measure_decode(("hack",), b, ctx, 64, 8, 128, pi, configs={"hack": [{}, {"num_warps": 4}]}), held)
    if "gqa4" in groups:
        for b, ctx, hq, hkv, held in GQA4_SHAPES[::2] if quick else GQA4_SHAPES:
            add(measure_decode(("hack",), b, ctx, hq, hkv, 128, 64), held)
        from .measure import measure_append_attend

        for b, max_len, hq, hkv, ragged in APPEND_ATTEND_SHAPES[:2] if quick else APPEND_ATTEND_SHAPES:
            add([measure_append_attend(b, max_len, hq, hkv, ragged=ragged)], True)
    if "prefill" in groups:
        refs = ("fp16_triton", "torch_sdpa_fp16") if only == "all" else ()
        for b, seq, held in PREFILL_SHAPES[:4] if quick else PREFILL_SHAPES:
            add(measure_prefill(("hack",) + refs, b, seq, 64, 8, 128, 64), held)
    if "quant" in groups:
        for b, seq, held in QUANT_SHAPES[:4] if quick else QUANT_SHAPES:
            add(measure_quant(b, seq, 8, 128, 64), held)
    if "score" in groups:
        score_sweep()
    return rows


ROW_KEY = ("phase", "kernel", "batch", "context_len", "q_heads", "kv_heads", "head_dim", "partition", "bits")


def merge_rows(row_sets: list[list[dict]]) -> list[dict]:
    """Rows of several rows.csv files, a later file's row replacing an earlier one of the same
    phase, kernel and shape (ROW_KEY; rows that also differ in other columns, such as the scoring
    kernels' variants, are told apart by those: every column but the measured ones; an empty value
    and a missing column are the same)."""
    measured = {
        "time_us",
        "achieved_gbps",
        "achieved_tflops",
        "byte_floor_us",
        "compute_floor_us",
        "config",
        "held_out",
        "gpu_name",
        "driver",
        "torch",
        "triton",
        "git_rev",
        "date",
        "units",
        "bytes_moved",
        "flops",
    }
    out: dict = {}
    for rows in row_sets:
        for r in rows:
            k = tuple(str(r.get(c, "")) for c in ROW_KEY) + tuple(
                sorted((c, str(v)) for c, v in r.items() if c not in measured and c not in ROW_KEY and str(v) != "")
            )
            out.pop(k, None)
            out[k] = r
    return list(out.values())


def write_rows(rows: list[dict], path: Path) -> None:
    keys: list[str] = []
    for r in rows:
        keys += [k for k in r if k not in keys]
    with path.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=keys)
        w.writeheader()
        w.writerows(rows)


def read_rows(path: Path) -> list[dict]:
    with path.open() as f:
        return list(csv.DictReader(f))


ROOT = Path(__file__).resolve().parents[1]


def file_record(path: Path, rows: int | None = None) -> dict:
    """sha256 (and the row count) of a file the profile was fitted from."""
    rec: dict = {"sha256": hashlib.sha256(path.read_bytes()).hexdigest()}
    if rows is not None:
        rec["rows"] = rows
    return rec


def command_line(argv: list[str]) -> str:
    """The profile command with its paths relative to the repository (--out left out: where the
    profile is written does not change it)."""
    out, skip = [], False
    for a in argv:
        if skip:
            skip = False
            continue
        if a == "--out":
            skip = True
            continue
        p = Path(a)
        if p.exists():
            try:
                a = str(p.resolve().relative_to(ROOT))
            except ValueError:
                pass
        out.append(a)
    return " ".join(["python -m kernels_calibration.profile", *out])


PROFILED_GROUP = 8  # query heads per KV head of the contract's decode units (costmodel/calibration.py)


def gqa_group(row: dict) -> int:
    """Query heads per KV head of a row (0 for the kernels without query heads: quantize, dequantize); a row
    that does not say is at the contract's group."""
    if not str(row.get("kv_heads") or "").strip() or not str(row.get("q_heads") or "").strip():
        return PROFILED_GROUP
    return int(row["q_heads"]) // max(int(row["kv_heads"]), 1)


def kernel_points(rows: list[dict]) -> dict[str, list[tuple[float, float, bool]]]:
    """Per profile kernel key, the (units, seconds, held out) points of `rows` its fit is made from (the fastest
    row per shape where several kernels or configurations ran it; empty where none did)."""

    def pts(
        phase, kernels, pi=None, key_of=lambda r: (r["batch"], r["context_len"], r["q_heads"]), bits=None, group=None
    ):
        best: dict = {}
        for r in rows:
            if r["phase"] != phase or r["kernel"] not in kernels:
                continue
            if group is not None and gqa_group(r) != group:
                continue
            if pi is not None and int(r["partition"]) != pi:
                continue
            if bits is not None and int(r["bits"]) != bits:
                continue
            k = key_of(r)
            if k not in best or float(r["time_us"]) < float(best[k]["time_us"]):
                best[k] = r
        return [
            (float(r["units"]), float(r["time_us"]) * 1e-6, str(r["held_out"]) in ("True", "1", "true"))
            for r in best.values()
        ]

    out: dict[str, list[tuple[float, float, bool]]] = {}
    # the contract's decode units are at GQA group 8; rows at another group g fit decode_attn.<key>_gqa<g>
    other_groups = sorted({gqa_group(r) for r in rows if r["phase"] == "decode"} - {PROFILED_GROUP})
    for name, key in DECODE_KEYS.items():
        pi = 64 if name not in ("fp8",) else None
        out[f"decode_attn.{key}"] = pts("decode", {name}, pi, group=PROFILED_GROUP)
        for g in other_groups:
            out[f"decode_attn.{key}_gqa{g}"] = pts("decode", {name}, pi, group=g)
    out["decode_attn.fp16"] = pts("decode", {"fp16_triton", "torch_sdpa_fp16"}, group=PROFILED_GROUP)
    for pi in (32, 128):
        out[f"decode_attn.hack_pi{pi}"] = pts("decode", {"hack"}, pi)
    out["prefill_attn.fp16"] = pts("prefill", {"fp16_triton", "torch_sdpa_fp16"})
    out["prefill_attn.hack"] = pts("prefill", {"hack"}, 64)
    out["quantize.kv"] = pts("quantize", {"quantize"})
    out["dequantize.kv"] = pts("dequantize", {"dequantize"})
    # scoring (head_dim 128): pq_score's partition column is D / M channels per sub-space
    out["score.pq"] = pts("score", {"pq_score"}, 64)
    out["score.pq_m8"] = pts("score", {"pq_score"}, 16)
    out["score.quantized_keys"] = pts("score", {"qk_score"}, 64, bits=4)
    out["score.quantized_keys_2bit"] = pts("score", {"qk_score"}, 64, bits=2)
    out["select.topk"] = pts("score", {"topk"})
    return out


def build_profile(
    rows: list[dict],
    peaks: dict,
    prov: dict,
    gpu: str = "h200",
    command: str | None = None,
    fitted_from: dict | None = None,
) -> dict:
    """The profile of `rows` (one per kernel and shape) and `peaks`; prov: the peaks measurement's
    provenance (GPU, driver, versions, git revision, date).  command and fitted_from (file name ->
    file_record: the rows, dense rows and peaks files, which lie beside a committed profile.json) make
    the profile's own provenance; every row carries its own revision, summarized in row_revisions."""

    kernels = {k: f for k, p in kernel_points(rows).items() if (f := fit(p)) is not None}
    faster = {}
    for phase in ("decode", "prefill"):
        wins = {"fp16_triton": 0, "torch_sdpa_fp16": 0}
        by: dict = {}
        for r in rows:
            if r["phase"] == phase and r["kernel"] in wins:
                by.setdefault((r["batch"], r["context_len"], r["q_heads"]), []).append(r)
        for rs in by.values():
            wins[min(rs, key=lambda r: float(r["time_us"]))["kernel"]] += 1
        faster[phase] = wins
    notes = (
        f"Measured with python -m kernels_calibration.profile. decode_attn.fp16 / prefill_attn.fp16 take the "
        f"faster of torch SDPA and the Triton FP16 kernel per shape (shapes won: {json.dumps(faster)}). "
        "Decode steps of the quantized variants include the append of the new token (HACK: "
        "hack_attn_decode.decode_step, which fuses it into the row-packed attention launch up to 2K tokens "
        "and above that runs the Gluon one-warp kernel at PI 64 (or the row-packed one, whichever is faster "
        "per shape); fused dequant: the faster per shape of the Gluon one-warp mma.sync kernel, "
        "gluon_decode.py, and the Triton kernel); decode_attn.hack*_triton and dequant_fused_triton: the "
        "Triton kernels alone (measure.TRITON_TWINS), which derive.py scales for GPUs before Hopper. They "
        "were timed as CUDA graph replays over rotating input sets (>= 256 MB read per replay). GQA group 8, "
        "head_dim 128, 2-bit, PI = 64 unless the key says otherwise. matmul_int8_tops is the faster of "
        "torch._int_mm layouts at 8192^3; memory_gbps is a 1 GiB device copy counting bytes read + written."
    )
    if any("_gqa" in k for k in kernels):
        notes += (
            " decode_attn.<key>_gqa<g>: the same decode step at g query heads per KV head (gqa4: 32 query / 8 "
            "KV heads, Llama-3.1-8B's attention, where the row-packed Triton kernel runs: the Gluon kernel "
            "takes group 8 only)."
        )
    if any(r["phase"] in ("decode_ragged", "decode_append") for r in rows):
        notes += (
            " Rows of phase decode_ragged / decode_append (kernel hack_append_attend, not fitted): an "
            "engine's HACK decode attention in a CUDA-graph bucket, append_token then hack_attn_decode sized "
            "by the bucket's max_len (context_len), over lengths spread from max_len / 4 to max_len "
            "(ragged) or all at max_len (append); units as decode_attn.*."
        )
    if any(k.startswith(("score.", "select.")) for k in kernels):
        notes += (
            " score.pq: PQ LUT build + code gather, M = 2 sub-spaces (score.pq_m8: M = 8), 8-bit codes, "
            "unit sum_b ctx_b * H_kv; score.quantized_keys: q . dequant(k) over 4-bit keys "
            "(_2bit: 2-bit), PI = 64, unit sum_b ctx_b * H_kv * D; both write FP32 scores for all 64 "
            "query heads (GQA 8). select.topk: torch.topk, k = ctx / 5, unit sum_b ctx_b * H_q. "
            "Timed as CUDA graph replays over rotating input sets, like decode."
        )
    return {
        "schema_version": 1,
        "gpu": gpu,
        "source": "measured",
        "derived_from": None,
        "provenance": {
            **{k: prov.get(k) for k in ("gpu_name", "driver", "torch", "triton", "git_rev", "date")},
            **({"command": command} if command else {}),
            **({"fitted_from": fitted_from} if fitted_from else {}),
            "row_revisions": row_revisions(rows),
            "notes": notes,
        },
        "memory_gbps": round(peaks["memory_gbps"], 1),
        "matmul_fp16_tflops": round(peaks["fp16_tflops"], 1),
        "matmul_int8_tops": None if peaks.get("int8_tops") is None else round(peaks["int8_tops"], 1),
        "matmul_fp8_tflops": None if peaks.get("fp8_tflops") is None else round(peaks["fp8_tflops"], 1),
        "launch_overhead_s": peaks["launch_overhead_s"],
        "kernels": kernels,
    }


def row_revisions(rows: list[dict]) -> dict:
    """{git revision: the earliest date of a row measured at it} over the rows that carry one."""
    out: dict = {}
    for r in rows:
        rev, date = r.get("git_rev"), str(r.get("date") or "")
        if rev:
            out[rev] = min(out.get(rev, date), date)
    return dict(sorted(out.items(), key=lambda kv: kv[1]))


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    ap = argparse.ArgumentParser(description="Profile the kernels and fit a calibration profile")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--quick", action="store_true", help="fewer shapes (a couple of minutes)")
    ap.add_argument(
        "--fit-only",
        type=Path,
        nargs="+",
        default=None,
        help="refit from existing rows.csv files (concatenated; peaks.json beside the first)",
    )
    ap.add_argument(
        "--only",
        default="all",
        help="all, or comma-separated groups: decode (every decode kernel), hack (the HACK decode "
        "kernels), gqa4 (HACK decode at 4 query heads per KV head, and an engine's append + attend "
        "in a graph bucket), dequant (fused dequant decode), prefill (HACK prefill), quant, score; "
        "merge with older rows via --fit-only OLD NEW (NEW's rows replace OLD's)",
    )
    ap.add_argument("--gpu", default="h200", help="catalog key written into the profile")
    args = ap.parse_args(argv)
    groups = {"decode", "hack", "gqa4", "dequant", "prefill", "quant", "score"}
    bad = sorted(set(args.only.split(",")) - groups) if args.only != "all" else []
    if bad:
        ap.error(f"--only: unknown group(s) {bad}; choose 'all' or from {sorted(groups)}")
    args.out.mkdir(parents=True, exist_ok=True)
    from .dense_bench import apply_dense_fit, fit_dense

    if args.fit_only:
        rows = merge_rows([read_rows(path) for path in args.fit_only])
        rows_path = args.fit_only[0]
        if len(args.fit_only) > 1:
            rows_path = args.out / "rows.csv"
            write_rows(rows, rows_path)
        peaks_path = args.fit_only[0].parent / "peaks.json"
        meta = json.loads(peaks_path.read_text())
        dense_paths = [  # beside: dense_bench's rows (the layer's kernels), realrun.stepprof's (a decode step's graph)
            p.parent / name
            for p in args.fit_only
            for name in ("dense_rows.csv", "stepprof_8b.csv", "stepprof_70b8l.csv")
            if (p.parent / name).exists()
        ]
    else:
        rows = measure_all(args.out, args.quick, args.only)
        meta = json.loads((args.out / "peaks.json").read_text())
        rows_path, peaks_path = args.out / "rows.csv", args.out / "peaks.json"
        rows = read_rows(rows_path)
        dense_paths = []
        if args.only == "all":  # the GEMMs and elementwise kernels of a layer (dense_bench.py)
            from .dense_bench import measure as measure_dense

            dense = measure_dense(args.out)
            write_rows(dense, args.out / "dense_rows.csv")
            dense_paths = [args.out / "dense_rows.csv"]
    fitted_from = {
        rows_path.name: file_record(rows_path, len(rows)),
        **{p.name: file_record(p, len(read_rows(p))) for p in dense_paths},
        peaks_path.name: file_record(peaks_path),
    }
    prof = build_profile(rows, meta["peaks"], meta["provenance"], args.gpu, command_line(argv), fitted_from)
    if dense_paths:
        peaks = meta["peaks"]
        apply_dense_fit(
            prof,
            fit_dense(
                [r for p in dense_paths for r in read_rows(p)],
                peaks["memory_gbps"],
                peaks["fp16_tflops"],
                peaks.get("launch_overhead_s"),
            ),
        )
    missing = [k for k in REQUIRED_KEYS if k not in prof["kernels"]]
    if missing:
        print(f"WARNING: not measured, missing from the profile: {missing}", file=sys.stderr)
    (args.out / "profile.json").write_text(json.dumps(prof, indent=1) + "\n")
    for k, v in prof["kernels"].items():
        print(
            f"fit {k:28s} overhead {v['overhead_s'] * 1e6:7.2f} us  {v['s_per_unit']:.3e} s/unit  "
            f"held-out median error {v['heldout_median_error_pct']:5.1f}%"
        )
    if "gemm" in prof:
        g = prof["gemm"]
        print(
            f"fit gemm at layer shapes: {g['compute_efficiency']:.0%} of the GEMM rate, {g['memory_efficiency']:.0%} "
            f"of copy bandwidth, +{g['overhead_s'] * 1e6:.1f} us; held-out median error "
            f"{g['heldout_median_error_pct']:.1f}%"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
