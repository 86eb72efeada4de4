"""Derived calibration profiles: the measured H200 profile's efficiencies x catalog peaks.

    python -m kernels_calibration.derive [--src kernels_calibration/profiles/h200/profile.json]

Writes kernels_calibration/profiles/<key>/profile.json (source "derived", derived_from "h200") for
t4, v100, a10g, l4, a6000, a100_40gb, a100_80gb, h100, l40s.

How each number is derived (also written into provenance.notes):
* memory_gbps, matmul_*: the H200's measured fraction of its datasheet peak (copy 4220 of 4800 GB/s,
  FP16 GEMM ~693 of 989 TFLOP/s, INT8 ~939 of 1979 TOPS, FP8 ~1271 of 1979) times the target's
  peak.  T4 is power-capped (70 W): the catalog records cuBLASLt INT8 at 32% of peak, so its
  tensor rates use 32% instead.  V100 has no INT8 tensor cores: matmul_int8_tops is null.
* gemm (efficiencies at real layer shapes, dense_bench.py) is kept as fractions of the derived peaks;
  the elementwise kernel scales by bandwidth like the memory-bound kernels.
* every kernel keeps the H200's overhead_s (launch and pipeline latency) and scales s_per_unit by
  the resource that bounds it on the H200 (measured achieved bytes vs the copy bandwidth):
  - memory-bound (FP16/FP8 decode, unfused dequant, dequantize.kv): x H200 GB/s / target GB/s;
  - CUDA-core bound (HACK decode variants, fused dequant, HACK prefill, quantize.kv: their
    H200 rates sit far below both the copy bandwidth and the tensor peak; the unpack, correction
    and softmax arithmetic dominates): x H200 issue rate / target issue rate (SMs x boost clock;
    T4 at 70% of boost), but never faster than the target's byte floor;
  - tensor-bound (FP16 prefill): x H200 FP16 GEMM rate / target FP16 GEMM rate.
  - the scoring kernels (score.pq*, score.quantized_keys*, select.topk; issue 7) are classified by
    their own H200 fit rather than by a fixed list, because they were added before being measured:
    bytes per unit (SCORE_BYTES_PER_UNIT, the kernels' formulas at the profiled shapes) / s_per_unit
    is the H200's achieved GB/s; at >= 60% of the copy bandwidth the kernel is memory-bound and
    scales by bandwidth, below that it is CUDA-core bound (PQ: the LUT gathers and adds, which run
    in the SMs' load/store and ALU pipes; quantized keys: unpack, convert and the per-partition
    scale/min FMAs) and scales by issue rate, floored at the target's byte time. The quantized-key
    scoring uses tl.dot (G_PAD = 16 MACs per key element), so on sm < 80 it adds the FMA fallback.
* fused dequant and the HACK decode step (PI 64): the H200 profile prices the Gluon one-warp mma
  kernels (gluon_decode.py; HACK above 2K tokens), which run on Hopper only; for sm < 90 the Triton
  kernels' H200 fits (decode_attn.<key>_triton, GLUON_KERNELS) are the ones scaled into <key>.
* sm < 80 (T4, V100): Triton lowers tl.dot to FMA on CUDA cores there (no MMA path for these
  architectures in Triton 3.x; catalog: "Triton int8 tl.dot failed on sm70/75", "falls back to FMA
  for compute capability < 80"), so the Triton kernels that use dots (HACK, fused dequant, Triton
  FP16) pay, per KV element, G_PAD = 16 multiply-adds at the FP32 FMA rate (INT8 does not use DP4A
  in that path) on top of their scaled CUDA-core work; FP16 attention there is torch SDPA
  (tensor cores on T4, memory-bound on V100 in decode).
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent / "profiles"

# Peaks from /work/shared/data/reference_specs.yaml (dense, no sparsity); A6000 is not in the catalog:
# GA102, 768 GB/s, 154.8 TFLOPS FP16 tensor with FP16 accumulate / 77.4 with FP32 accumulate (GEMMs
# in inference accumulate in FP32), 309.7 INT8 TOPS, 38.7 FP32 TFLOPS (NVIDIA RTX A6000 datasheet).
PEAKS = {
    #            mem GB/s  fp16    int8    fp8     fp32   sm  SMs  boost GHz  note
    "h200":      (4800.0, 989.4, 1978.9, 1978.9, 66.9, 90, 132, 1.98, ""),
    "h100":      (3350.0, 989.4, 1978.9, 1978.9, 66.9, 90, 132, 1.98, "H100 SXM5"),
    "a100_40gb": (1555.0, 312.0, 624.0, None, 19.5, 80, 108, 1.41, "A100 40GB SXM4"),
    "a100_80gb": (2039.0, 312.0, 624.0, None, 19.5, 80, 108, 1.41, "A100 80GB SXM4"),
    "a10g":      (600.0, 70.0, 140.0, None, 35.0, 86, 80, 1.71,
                  "A10G: INT8 140, FP32 ~35 and 80 SMs UNVERIFIED in catalog; boost 1.71 GHz assumed"),
    "l4":        (300.0, 121.0, 242.5, 242.5, 30.3, 89, 58, 2.04, "L4"),
    "l40s":      (864.0, 362.05, 733.0, 733.0, 91.6, 89, 142, 2.52, "L40S"),
    "a6000":     (768.0, 77.4, 309.7, None, 38.7, 86, 84, 1.80,
                  "RTX A6000 not in catalog: GA102, 768 GB/s, 154.8 FP16 TFLOPS (FP16 acc) / 77.4 (FP32 acc, used), "
                  "309.7 INT8 TOPS, 38.7 FP32 TFLOPS, 84 SMs at 1.80 GHz, 48 GB (NVIDIA datasheet)"),
    "t4":        (320.0, 65.0, 130.0, None, 8.1, 75, 40, 1.59, "T4, 70 W cap"),
    "v100":      (900.0, 125.0, None, None, 15.7, 70, 80, 1.53, "V100 SXM2: no INT8 tensor cores"),
}
TARGETS = ("t4", "v100", "a10g", "l4", "a6000", "a100_40gb", "a100_80gb", "h100", "l40s")
T4_TENSOR_FRACTION = 0.32      # catalog: cuBLASLt INT8 GEMM 42 of 130 TOPS on T4 (power cap)
G_PAD = 16                      # query rows per KV head in the decode dots (GQA 8 padded to 16)
GLUON_MIN_SM = 90               # the Gluon kernels (gluon_decode.py) run on Hopper and later
# profile keys measured on a Gluon kernel at the H200, each with a "<key>_triton" fit of its Triton twin
GLUON_KERNELS = ("decode_attn.dequant_fused", "decode_attn.hack", "decode_attn.hack_no_se", "decode_attn.hack_no_rqe")

MEMORY_BOUND = {"decode_attn.fp16", "decode_attn.fp8", "decode_attn.dequant_unfused", "dequantize.kv", "elementwise"}
TENSOR_BOUND = {"prefill_attn.fp16"}
# bytes of device memory per unit, for the byte floor of CUDA-core-bound kernels
BYTES_PER_UNIT = {"decode_attn.hack": 0.33, "decode_attn.hack_no_se": 0.31, "decode_attn.hack_no_rqe": 0.33,
                  "decode_attn.dequant_fused": 0.33,
                  "decode_attn.hack_pi32": 0.41, "decode_attn.hack_pi128": 0.30,
                  "quantize.kv": 2.33, "prefill_attn.hack": 0.0}
# Scoring kernels: bytes per unit at the profiled shapes (GQA 8, head_dim 128): PQ M + 4 G (codes,
# FP32 scores) at M = 2 / 8; quantized keys bits/8 + 4/PI + 4 G / D at 4 / 2 bits, PI = 64;
# top-k: read 4 B per score, write k = ctx / 5 values (4 B) + indices (8 B) per row.
SCORE_BYTES_PER_UNIT = {"score.pq": 34.0, "score.pq_m8": 40.0, "score.quantized_keys": 0.8125,
                        "score.quantized_keys_2bit": 0.5625, "select.topk": 6.4}
SCORE_MEMORY_BOUND_FRACTION = 0.6   # H200 achieved / copy bandwidth at or above which bandwidth bounds
USES_TRITON_DOT = {"decode_attn.hack", "decode_attn.hack_no_se", "decode_attn.hack_no_rqe",
                   "decode_attn.dequant_fused", "decode_attn.hack_pi32", "decode_attn.hack_pi128",
                   "prefill_attn.hack"}
BYTES_PER_UNIT.update({f"{k}_triton": BYTES_PER_UNIT[k] for k in GLUON_KERNELS})
USES_TRITON_DOT |= {f"{k}_triton" for k in GLUON_KERNELS}


def derive(src: dict, key: str) -> dict:
    mem, fp16, int8, fp8, fp32, sm, n_sm, ghz, note = PEAKS[key]
    h_mem, h_fp16, h_int8, h_fp8, h_fp32, _, h_sm, h_ghz, _ = PEAKS["h200"]
    # CUDA-core instruction issue rate (4 warp-instructions per SM per clock on Volta..Hopper); the
    # HACK kernels mix INT32 unpack, FP32 corrections and conversions, so FP32 peak (doubled on
    # GA10x/Ada) would flatter the GA10x/Ada parts.  T4 sustains ~70% of boost under its 70 W cap.
    issue_ratio = (h_sm * h_ghz) / (n_sm * ghz * (0.7 if key == "t4" else 1.0))
    eff_mem = src["memory_gbps"] / h_mem
    eff_fp16 = src["matmul_fp16_tflops"] / h_fp16
    eff_int8 = (src["matmul_int8_tops"] or 0.0) / h_int8
    eff_fp8 = (src["matmul_fp8_tflops"] or 0.0) / h_fp8
    tensor_frac16 = T4_TENSOR_FRACTION if key == "t4" else eff_fp16
    tensor_frac8 = T4_TENSOR_FRACTION if key == "t4" else eff_int8
    out_mem = eff_mem * mem
    out = {
        "schema_version": 1, "gpu": key, "source": "derived", "derived_from": "h200",
        "memory_gbps": round(out_mem, 1),
        "matmul_fp16_tflops": round(tensor_frac16 * fp16, 1),
        "matmul_int8_tops": None if int8 is None else round(tensor_frac8 * int8, 1),
        "matmul_fp8_tflops": None if fp8 is None else round(eff_fp8 * fp8, 1),
        "launch_overhead_s": src["launch_overhead_s"],
        "kernels": {},
    }
    if src.get("gemm"):   # efficiencies at real layer shapes are fractions of the (derived) peaks: kept
        out["gemm"] = {**src["gemm"], "note": "H200 efficiencies at Llama layer shapes, applied to this GPU's "
                                              "derived peaks (unvalidated)"}
    fma_rate = fp32 * 1e12 / 2  # multiply-adds per second on CUDA cores
    kernels = dict(src["kernels"])
    for name in GLUON_KERNELS:
        if sm < GLUON_MIN_SM and f"{name}_triton" in kernels:
            # the Gluon kernels run on Hopper only (hack_attn_decode.gluon_applies): before it, fused
            # dequant and the HACK decode step are the Triton kernels, so their H200 fits are the ones scaled
            kernels[name] = {**kernels[f"{name}_triton"], "from": f"{name}_triton"}
    for name, fit in kernels.items():
        spu = fit["s_per_unit"]
        if name in MEMORY_BOUND:
            new = spu * src["memory_gbps"] / out_mem
            how = "memory"
        elif name in SCORE_BYTES_PER_UNIT:
            bpu = SCORE_BYTES_PER_UNIT[name]
            frac = bpu / spu / (src["memory_gbps"] * 1e9)
            if frac >= SCORE_MEMORY_BOUND_FRACTION:
                new = spu * src["memory_gbps"] / out_mem
                how = f"memory (H200 at {frac:.0%} of copy bandwidth)"
            else:
                new = max(spu * issue_ratio, bpu / (out_mem * 1e9))
                how = f"cuda cores (H200 at {frac:.0%} of copy bandwidth)"
            if sm < 80 and name.startswith("score.quantized_keys"):
                new += G_PAD / fma_rate
                how += " + FMA-fallback dots"
        elif name in TENSOR_BOUND:
            new = spu * src["matmul_fp16_tflops"] / out["matmul_fp16_tflops"]
            how = "fp16 tensor"
        else:
            new = max(spu * issue_ratio, BYTES_PER_UNIT.get(name, 0.0) / (out_mem * 1e9))
            how = "cuda cores"
            if sm < 80 and name in USES_TRITON_DOT:
                # Triton's dot falls back to FMA: decode G_PAD MACs per KV element; prefill 1/2 MAC per FLOP unit
                macs = 0.5 if name.startswith("prefill") else G_PAD
                new += macs / fma_rate
                how += " + FMA-fallback dots"
        out["kernels"][name] = {"overhead_s": fit["overhead_s"], "s_per_unit": new,
                                "heldout_median_error_pct": fit.get("heldout_median_error_pct"),
                                "scaled_by": how + (f" (from the H200 {fit['from']})" if "from" in fit else "")}
    prov = src.get("provenance", {})
    out["provenance"] = {
        "gpu_name": note or key, "driver": None, "torch": prov.get("torch"), "triton": prov.get("triton"),
        "git_rev": prov.get("git_rev"), "date": prov.get("date"),
        "notes": ("Derived by kernels_calibration/derive.py from the measured H200 profile "
                  f"(git {prov.get('git_rev')}): H200 efficiency x catalog peak for memory/GEMM rates "
                  f"(memory {eff_mem:.3f}, fp16 {tensor_frac16:.3f}, int8 {tensor_frac8:.3f}); each kernel keeps the "
                  "H200 overhead_s and scales s_per_unit by its bounding resource (key 'scaled_by': memory "
                  "bandwidth, FP16 tensor rate, or CUDA-core issue rate = SMs x boost clock, floored at the byte "
                  f"time; issue-rate ratio H200/target = {issue_ratio:.2f}). "
                  + ("sm < 80: Triton's tl.dot runs as FMA on CUDA cores (no DP4A, no tensor cores), so HACK and "
                     "fused-dequant dots add 16 multiply-adds per KV element (decode) or 0.5 per FLOP (prefill) at "
                     "the FP32 FMA rate; FP16 attention is torch SDPA. " if sm < 80 else "")
                  + ("No INT8 tensor cores: matmul_int8_tops is null. " if int8 is None else "")
                  + ("T4 tensor rates use the catalog's measured 32% of peak (70 W cap). " if key == "t4" else "")
                  + ("Peaks: " + note + ". " if note else "")
                  + "Heldout errors are the H200 fit's; the derivation itself is unvalidated (no such GPU here)."),
    }
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="Derive calibration profiles for other GPUs from the H200 one")
    ap.add_argument("--src", type=Path, default=HERE / "h200" / "profile.json")
    ap.add_argument("--out", type=Path, default=HERE)
    args = ap.parse_args(argv)
    src = json.loads(args.src.read_text())
    for key in TARGETS:
        prof = derive(src, key)
        (args.out / key).mkdir(parents=True, exist_ok=True)
        (args.out / key / "profile.json").write_text(json.dumps(prof, indent=1) + "\n")
        h = prof["kernels"]
        print(f"{key:10s} mem {prof['memory_gbps']:7.0f} GB/s fp16 {prof['matmul_fp16_tflops']:6.1f} "
              f"decode 32K b8: fp16 {(h['decode_attn.fp16']['overhead_s'] + h['decode_attn.fp16']['s_per_unit'] * 5.4e8) * 1e6:8.0f} us"
              f" hack {(h['decode_attn.hack']['overhead_s'] + h['decode_attn.hack']['s_per_unit'] * 5.4e8) * 1e6:8.0f} us")
    return 0


if __name__ == "__main__":
    sys.exit(main())
