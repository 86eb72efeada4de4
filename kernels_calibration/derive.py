"""Derived calibration profiles: the measured H200 profile's efficiencies x catalog peaks.

    python -m kernels_calibration.derive [--src kernels_calibration/profiles/h200/profile.json]

Writes kernels_calibration/profiles/<key>/profile.json (source "derived", derived_from "h200") for
t4, v100, a10g, l4, a6000, a100_40gb, a100_80gb, h100, l40s.

How each number is derived (also written into provenance.notes):
* every GPU figure comes from catalog/data/gpus.yaml (catalog_peaks; recorded in the profile under
  "catalog").  memory_gbps, matmul_*: the H200's measured fraction of its datasheet peak (copy 4220
  of 4800 GB/s, FP16 GEMM ~693 of 989 TFLOP/s, INT8 ~939 of 1979 TOPS, FP8 ~1271 of 1979) times the
  target's peak.  A power-capped part (T4, 70 W) runs its clock-bound rates at the catalog's
  sustained clock over its boost clock.  V100 has no INT8 tensor cores: matmul_int8_tops is null.
* gemm (efficiencies at real layer shapes, dense_bench.py) is kept as fractions of the derived peaks;
  the elementwise kernel scales by bandwidth like the memory-bound kernels.
* every kernel keeps the H200's overhead_s (launch and pipeline latency) and scales s_per_unit by
  the resource that bounds it on the H200 (measured achieved bytes vs the copy bandwidth):
  - memory-bound (FP16/FP8 decode, unfused dequant, dequantize.kv): x H200 GB/s / target GB/s;
  - CUDA-core bound (HACK decode variants, fused dequant, HACK prefill, quantize.kv: their
    H200 rates sit far below both the copy bandwidth and the tensor peak; the unpack, correction
    and softmax arithmetic dominates): x H200 issue rate / target issue rate (SMs x boost clock;
    at the sustained clock where the catalog gives one), but never faster than the target's byte floor;
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

import catalog

HERE = Path(__file__).resolve().parent / "profiles"

# Every GPU fact comes from catalog/data/gpus.yaml (with its sources); a derived profile records the
# catalog figures it used under "catalog" (tests/kernels/test_profiles.py checks them against the catalog).
PEAK_FIELDS = ("memory_bandwidth_gb_per_s", "fp16_tensor_tflops", "int8_tensor_tops", "fp8_tensor_tflops",
               "fp32_tflops", "compute_capability", "sms", "boost_clock_ghz", "sustained_clock_ghz")


def catalog_peaks(key: str) -> dict:
    """The catalog figures a derivation uses for one GPU."""
    e = catalog.entry("gpus", key)
    return {f: e.get(f) for f in PEAK_FIELDS}


TARGETS = ("t4", "v100", "a10g", "l4", "a6000", "a100_40gb", "a100_80gb", "h100", "l40s")
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


def derive(src: dict, key: str, src_key: str = "h200") -> dict:
    tgt, h = catalog_peaks(key), catalog_peaks(src_key)
    mem, fp16, int8, fp8 = (tgt[f] for f in ("memory_bandwidth_gb_per_s", "fp16_tensor_tflops", "int8_tensor_tops",
                                              "fp8_tensor_tflops"))
    fp32, n_sm = tgt["fp32_tflops"], tgt["sms"]
    sm = int(float(tgt["compute_capability"]) * 10)
    # A power-capped part (T4 at 70 W) holds a lower SM clock under load than its boost: every clock-bound
    # rate (tensor cores, CUDA cores) scales by sustained / boost; memory bandwidth does not.
    clock = tgt["sustained_clock_ghz"] or tgt["boost_clock_ghz"]
    clock_frac = clock / tgt["boost_clock_ghz"]
    # CUDA-core instruction issue rate (4 warp-instructions per SM per clock on Volta..Hopper); the
    # HACK kernels mix INT32 unpack, FP32 corrections and conversions, so FP32 peak (doubled on
    # GA10x/Ada) would flatter the GA10x/Ada parts.
    issue_ratio = (h["sms"] * h["boost_clock_ghz"]) / (n_sm * clock)
    eff_mem = src["memory_gbps"] / h["memory_bandwidth_gb_per_s"]
    eff_fp16 = src["matmul_fp16_tflops"] / h["fp16_tensor_tflops"]
    eff_int8 = (src["matmul_int8_tops"] or 0.0) / h["int8_tensor_tops"]
    eff_fp8 = (src["matmul_fp8_tflops"] or 0.0) / h["fp8_tensor_tflops"]
    tensor_frac16, tensor_frac8 = eff_fp16 * clock_frac, eff_int8 * clock_frac
    out_mem = eff_mem * mem
    note = catalog.entry("gpus", key)["name"]
    out = {
        "schema_version": 1, "gpu": key, "source": "derived", "derived_from": src_key,
        "catalog": {"gpu": tgt, "source_gpu": h},
        "memory_gbps": round(out_mem, 1),
        "matmul_fp16_tflops": round(tensor_frac16 * fp16, 1),
        "matmul_int8_tops": None if int8 is None else round(tensor_frac8 * int8, 1),
        "matmul_fp8_tflops": None if fp8 is None else round(eff_fp8 * clock_frac * fp8, 1),
        "launch_overhead_s": src["launch_overhead_s"],
        "kernels": {},
    }
    if src.get("gemm"):   # efficiencies at real layer shapes are fractions of the (derived) peaks: kept
        out["gemm"] = {**src["gemm"], "note": "H200 efficiencies at Llama layer shapes, applied to this GPU's "
                                              "derived peaks (unvalidated)"}
    fma_rate = fp32 * 1e12 / 2 * clock_frac  # multiply-adds per second on CUDA cores
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
                  + (f"Power cap: clock-bound rates at the catalog's sustained {clock} GHz of {tgt['boost_clock_ghz']} "
                     "GHz boost. " if clock_frac < 1 else "")
                  + "Peaks: catalog/data/gpus.yaml (recorded under 'catalog'). "
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
