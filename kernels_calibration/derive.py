"""Derived calibration profiles: each kernel's measured H200 time split by the unit that spends it, each
part repriced at the target GPU's rate for that unit.

    python -m kernels_calibration.derive [--src kernels_calibration/profiles/h200/profile.json]
    python -m kernels_calibration.derive --gpu rtx4090 --out /tmp/profiles   # one GPU
    python -m kernels_calibration.derive --table      # the README's HACK/FP16 table, nothing written
    python cli.py calibrate --derive GPU --out DIR    # any catalog GPU, or a YAML file with a GPU's spec

Writes <out>/<key>/profile.json (source "derived", derived_from "h200") for every catalog GPU but the
measured ones (``TARGETS``: not the H200, the source, nor the H100, measured since), or for the GPUs named;
``derive_for`` takes any GPU's full field set (a short spec completed by costmodel/specs.py), so a GPU outside
the catalog is derived the same way.

How each number is derived (also written into provenance.notes):
* every GPU figure comes from catalog/data/gpus.yaml (``catalog_peaks``, recorded under "catalog"; a test
  fails when they differ from the catalog's).
* memory_gbps, matmul_*: the H200's measured fraction of its datasheet peak (copy 4220 of 4800 GB/s, FP16
  GEMM ~693 of 989 TFLOP/s, also for INT8: kernel_work.unit_rates says why; FP8 ~1271 of 1979) times the
  target's peak; tensor rates at the sustained clock of a power-capped part (T4).  V100 has no INT8
  tensor cores: matmul_int8_tops is null.
* gemm (efficiencies at real layer shapes, dense_bench.py) is kept as fractions of the derived peaks.
* every kernel (costmodel/kernel_work.py): the H200 fit's s_per_unit is split into seconds per unit on
  HBM, FP16 tensor, INT8 tensor, SFU and CUDA-core ALU: the bytes, tensor and SFU work come from the
  kernel's formula (kernel_work.WORK) at the H200's unit rates, the ALU gets the rest (its instruction
  count per unit is recorded).  Each part is multiplied by the ratio of the H200's rate to the target's
  for its unit: HBM by copy bandwidth, tensor parts by the achieved GEMM rates (INT8 work on the FP16
  tensor cores where the target has no INT8 ones: exact, see kernel_work), SFU by SMs x 16 x clock, ALU
  by the issue rate SMs x 4 schedulers x 32 x clock.  overhead_s (launch) is the H200's.  The parts,
  the work and the dominant unit are written per kernel ("parts_s_per_unit", "work_per_unit", "bound_by").
* the Gluon decode kernels run on Hopper only: for sm < 90 the Triton kernels' H200 fits
  (decode_attn.<key>_triton) are the ones split and repriced into <key>.
* tensor work is priced on tensor cores everywhere: a deployment on T4 or V100 runs a kernel that uses
  them (as torch SDPA does for FP16 there), not Triton 3.x's FMA fallback for sm < 80.
* FP8 KV without FP8 hardware (before Ada/Hopper) converts in software: kernel_work's extra instructions.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import catalog
from costmodel.kernel_work import (
    FP8_SOFTWARE_CONVERT_EXTRA_INSTR,
    UNITS,
    WORK,
    alu_instructions,
    reprice,
    split,
    unit_rates,
)
from costmodel.specs import GPUSpec

HERE = Path(__file__).resolve().parent / "profiles"

# Every GPU fact comes from catalog/data/gpus.yaml (with its sources); a derived profile records the
# catalog figures it used under "catalog" (tests/kernels/test_profiles.py checks them against the catalog).
PEAK_FIELDS = (
    "memory_bandwidth_gb_per_s",
    "fp16_tensor_tflops",
    "int8_tensor_tops",
    "fp8_tensor_tflops",
    "fp32_tflops",
    "compute_capability",
    "sms",
    "warp_schedulers_per_sm",
    "sfu_ops_per_clock_per_sm",
    "boost_clock_ghz",
    "sustained_clock_ghz",
)
SOURCE = "h200"
# GPUs whose profile was measured on the GPU itself (profiles/<key>/profile.json, source "measured"): not derived.
# derive(src, key) still computes one for them, which tests/kernels/test_derive_h100.py checks against the H100's
# measured rows.
MEASURED = (SOURCE, "h100")
TARGETS = tuple(k for k in catalog.load("gpus") if k not in MEASURED)  # every catalog GPU but the measured ones
GLUON_MIN_SM = 90  # the Gluon kernels (gluon_decode.py) run on Hopper and later
# profile keys measured on a Gluon kernel at the H200, each with a "<key>_triton" fit of its Triton twin
GLUON_KERNELS = ("decode_attn.dequant_fused", "decode_attn.hack", "decode_attn.hack_no_se", "decode_attn.hack_no_rqe")


def peaks_of(fields: dict) -> dict:
    """The figures a derivation uses, from a GPU's full field set."""
    return {f: fields.get(f) for f in PEAK_FIELDS}


def catalog_peaks(key: str) -> dict:
    """The catalog figures a derivation uses for one GPU."""
    return peaks_of(catalog.entry("gpus", key))


def gpu(key: str) -> GPUSpec:
    return GPUSpec.from_fields(key, catalog.entry("gpus", key))


def efficiencies(src: dict, src_key: str = SOURCE) -> tuple[float, float]:
    """The measuring GPU's achieved fractions of its catalog peaks: copy, and FP16 GEMM for every tensor rate
    (kernel_work.unit_rates says why INT8 takes the FP16 GEMM's fraction)."""
    h = catalog_peaks(src_key)
    return src["memory_gbps"] / h["memory_bandwidth_gb_per_s"], src["matmul_fp16_tflops"] / h["fp16_tensor_tflops"]


def _rates_json(r) -> dict:
    return {
        "hbm_gb_per_s": round(r.hbm / 1e9, 1),
        "fp16_tensor_tflops": round(r.fp16_tensor / 1e12, 1),
        "int8_tensor_tops": None if r.int8_tensor is None else round(r.int8_tensor / 1e12, 1),
        "sfu_tops": round(r.sfu / 1e12, 3),
        "alu_tinstr_per_s": round(r.alu / 1e12, 2),
    }


def source_fits(src: dict, target_sm: int) -> dict[str, dict]:
    """The H200 fits that price each kernel on the target (Gluon kernels' Triton twins before Hopper)."""
    kernels = dict(src["kernels"])
    for name in GLUON_KERNELS:
        if target_sm < GLUON_MIN_SM and f"{name}_triton" in kernels:
            # the Gluon kernels run on Hopper only (kernels/dispatch.py): before it, fused
            # dequant and the HACK decode step are the Triton kernels, so their H200 fits are the ones scaled
            kernels[name] = {**kernels[f"{name}_triton"], "from": f"{name}_triton"}
    return kernels


def derive(src: dict, key: str, src_key: str = SOURCE) -> dict:
    """The derived profile of a catalog GPU."""
    e = catalog.entry("gpus", key)
    return derive_for(src, gpu(key), peaks_of(e), e["name"], src_key)


def derive_for(src: dict, t_gpu: GPUSpec, tgt: dict, gpu_name: str, src_key: str = SOURCE) -> dict:
    """The derived profile of any GPU: its spec, the figures it was derived from (recorded under "catalog")
    and its display name."""
    key, h = t_gpu.key, catalog_peaks(src_key)
    sm = int(float(tgt["compute_capability"]) * 10)
    clock_frac = t_gpu.clock_ghz / t_gpu.boost_clock_ghz
    eff_mem, eff_tensor = efficiencies(src, src_key)
    eff_fp8 = (src["matmul_fp8_tflops"] or 0.0) / h["fp8_tensor_tflops"]
    r_src = unit_rates(gpu(src_key), eff_mem, eff_tensor)
    r_tgt = unit_rates(t_gpu, eff_mem, eff_tensor)
    out = {
        "schema_version": 1,
        "gpu": key,
        "source": "derived",
        "derived_from": src_key,
        "catalog": {"gpu": tgt, "source_gpu": h},
        "unit_rates": {"gpu": _rates_json(r_tgt), "source_gpu": _rates_json(r_src)},
        "memory_gbps": round(r_tgt.hbm / 1e9, 1),
        "matmul_fp16_tflops": round(r_tgt.fp16_tensor / 1e12, 1),
        "matmul_int8_tops": None if r_tgt.int8_tensor is None else round(r_tgt.int8_tensor / 1e12, 1),
        "matmul_fp8_tflops": None
        if tgt["fp8_tensor_tflops"] is None
        else round(eff_fp8 * clock_frac * tgt["fp8_tensor_tflops"], 1),
        "launch_overhead_s": src["launch_overhead_s"],
        "kernels": {},
    }
    if src.get("gemm"):  # efficiencies at real layer shapes are fractions of the (derived) peaks: kept
        out["gemm"] = {
            **src["gemm"],
            "note": "H200 efficiencies at Llama layer shapes, applied to this GPU's derived peaks (unvalidated)",
        }
    for name, fit in source_fits(src, sm).items():
        work = WORK[fit.get("from", name)]
        src_parts = split(work, fit["s_per_unit"], r_src)
        instr = alu_instructions(src_parts, r_src)
        if name == "decode_attn.fp8" and tgt["fp8_tensor_tflops"] is None:
            instr += FP8_SOFTWARE_CONVERT_EXTRA_INSTR
            src_parts = {**src_parts, "alu": instr / r_src.alu}
        parts = reprice(src_parts, r_src, r_tgt)
        out["kernels"][name] = {
            "overhead_s": fit["overhead_s"],
            **({"in_graph_overhead_s": fit["in_graph_overhead_s"]} if "in_graph_overhead_s" in fit else {}),
            "s_per_unit": sum(parts.values()),
            "heldout_median_error_pct": fit.get("heldout_median_error_pct"),
            "bound_by": max(parts, key=parts.get),
            "parts_s_per_unit": {u: parts[u] for u in UNITS},
            "source_parts_s_per_unit": {u: src_parts[u] for u in UNITS},
            "work_per_unit": {
                "hbm_bytes": work.hbm_bytes,
                "fp16_tensor_flops": work.fp16_tensor_flops,
                "int8_tensor_ops": work.int8_tensor_ops,
                "sfu_ops": work.sfu_ops,
                "alu_instr": round(instr, 4),
                "formula": work.formula,
            },
            **({"from": f"the H200 {fit['from']}"} if "from" in fit else {}),
        }
    prov = src.get("provenance", {})
    out["provenance"] = {
        "gpu_name": gpu_name,
        "driver": None,
        "torch": prov.get("torch"),
        "triton": prov.get("triton"),
        "git_rev": prov.get("git_rev"),
        "date": prov.get("date"),
        "notes": (
            "Derived by kernels_calibration/derive.py from the measured H200 profile "
            f"(git {prov.get('git_rev')}): each kernel's H200 s_per_unit split into HBM, FP16 tensor, INT8 "
            "tensor, SFU and CUDA-core ALU parts (bytes, tensor and SFU work from its formula in "
            "costmodel/kernel_work.py, the ALU the rest), each part repriced at this GPU's rate for its unit "
            f"('unit_rates'; H200 efficiencies: copy {eff_mem:.3f}, GEMM {eff_tensor:.3f} for FP16 and INT8 "
            "tensor work alike); overhead_s is the H200's. "
            + (
                "No INT8 tensor cores: the homomorphic products are priced on the FP16 tensor cores (exact for "
                "2-bit codes and INT8 values with FP32 accumulation); matmul_int8_tops is null. "
                if tgt["int8_tensor_tops"] is None
                else ""
            )
            + (
                f"Power cap: clock-bound rates at the catalog's sustained {t_gpu.clock_ghz} GHz of "
                f"{t_gpu.boost_clock_ghz} GHz boost. "
                if clock_frac < 1
                else ""
            )
            + (
                "Before Hopper the HACK and fused-dequant decode kernels are the Triton ones ('from'). "
                if sm < GLUON_MIN_SM
                else ""
            )
            + "Peaks: catalog/data/gpus.yaml (recorded under 'catalog'). "
            + "Heldout errors are the H200 fit's; the derivation itself is unvalidated (no such GPU here)."
        ),
    }
    return out


# The README table: HACK against FP16 attention at the profiled shapes (64 query / 8 KV heads, head_dim 128).
TABLE_CONTEXTS = (4096, 32768)
TABLE_DECODE_BATCH = 8


def _time_s(fit: dict, units: float) -> float:
    return fit["overhead_s"] + fit["s_per_unit"] * units


def ratio_rows(profiles: dict[str, dict]) -> list[dict]:
    """FP16 time / HACK time (> 1: HACK faster) for decode (batch 8) and prefill (one prompt) at 4K and 32K,
    with the unit that bounds each HACK kernel."""
    rows = []
    for key, p in profiles.items():
        k = p["kernels"]
        row = {"gpu": key}
        for ctx in TABLE_CONTEXTS:
            dec_units = TABLE_DECODE_BATCH * ctx * 8 * 128 * 2
            pre_units = 4.0 * 64 * 128 * ctx * (ctx + 1) / 2
            row[f"decode_{ctx}"] = _time_s(k["decode_attn.fp16"], dec_units) / _time_s(k["decode_attn.hack"], dec_units)
            row[f"prefill_{ctx}"] = _time_s(k["prefill_attn.fp16"], pre_units) / _time_s(
                k["prefill_attn.hack"], pre_units
            )
        for phase in ("decode", "prefill"):
            fit = k[f"{phase}_attn.hack"]
            parts = fit.get("parts_s_per_unit")
            if parts:
                total = sum(parts.values())
                row[f"{phase}_hack_parts"] = ", ".join(
                    f"{u} {parts[u] / total:.0%}" for u in UNITS if parts[u] / total >= 0.05
                )
        rows.append(row)
    return rows


def print_table(profiles: dict[str, dict]) -> None:
    print(
        "| GPU | decode 4K | decode 32K | prefill 4K | prefill 32K | HACK decode time by unit (32K) | HACK prefill time by unit |"
    )
    print("|---|---|---|---|---|---|---|")
    for r in ratio_rows(profiles):
        print(
            f"| {r['gpu']} | {r['decode_4096']:.2f}x | {r['decode_32768']:.2f}x | {r['prefill_4096']:.2f}x | "
            f"{r['prefill_32768']:.2f}x | {r.get('decode_hack_parts', 'measured')} | {r.get('prefill_hack_parts', 'measured')} |"
        )


def reference_parts(src: dict, src_key: str = SOURCE) -> tuple:
    """The measuring GPU's unit rates and every kernel's split (seconds per unit by unit): what
    costmodel/kernel_work.py keeps as REFERENCE_RATES / REFERENCE_PARTS for the roofline."""
    eff_mem, eff_tensor = efficiencies(src, src_key)
    rates = unit_rates(gpu(src_key), eff_mem, eff_tensor)
    parts = {name: split(WORK[name], fit["s_per_unit"], rates) for name, fit in src["kernels"].items()}
    return rates, parts


def print_reference(src: dict) -> None:
    rates, parts = reference_parts(src)
    print(
        f"REFERENCE_RATES = UnitRates(hbm={rates.hbm:.6e}, fp16_tensor={rates.fp16_tensor:.6e}, "
        f"int8_tensor={rates.int8_tensor:.6e}, sfu={rates.sfu:.6e}, alu={rates.alu:.6e})"
    )
    print("REFERENCE_PARTS: dict[str, dict[str, float]] = {")
    for name, p in parts.items():
        vals = [f'"{u}": {p[u]:.4e}' if p[u] else f'"{u}": 0.0' for u in UNITS]
        print(f'    "{name}": {{' + ", ".join(vals[:3]) + ",\n" + " " * (len(name) + 8) + ", ".join(vals[3:]) + "},")
    print("}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="Derive calibration profiles for other GPUs from the H200 one")
    ap.add_argument("--src", type=Path, default=HERE / "h200" / "profile.json")
    ap.add_argument("--out", type=Path, default=HERE)
    ap.add_argument("--table", action="store_true", help="print the README's HACK/FP16 table; write nothing")
    ap.add_argument(
        "--gpu", action="append", choices=TARGETS, help="derive only this catalog GPU (repeatable); default: all"
    )
    ap.add_argument(
        "--reference",
        action="store_true",
        help="print kernel_work.REFERENCE_RATES / REFERENCE_PARTS for the source profile; write nothing",
    )
    args = ap.parse_args(argv)
    src = json.loads(args.src.read_text())
    if args.reference:
        print_reference(src)
        return 0
    targets = tuple(args.gpu or TARGETS)
    # the H200 split by the same rule (its repricing is the identity) shows which units spend its time; the table
    # also shows what the derivation gives a measured GPU (the H100), next to its measured profile's figures
    shown = targets if args.gpu else tuple(k for k in catalog.load("gpus") if k != SOURCE)
    profiles = {key: derive(src, key) for key in (SOURCE,) + shown}
    if not args.table:
        for key in targets:
            write_profile(profiles[key], args.out / key)
    print_table(profiles)
    return 0


def write_profile(profile: dict, folder: Path) -> Path:
    """profile.json into folder (made if missing), written whole or not at all."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "profile.json"
    tmp = folder / ".profile.json.tmp"
    tmp.write_text(json.dumps(profile, indent=1) + "\n")
    tmp.replace(path)
    return path


if __name__ == "__main__":
    sys.exit(main())
