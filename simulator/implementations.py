"""Implementation profiles (catalog/data/implementations.yaml) priced for a pool's GPU, and the kernel costs a
method is priced with.

A method's costs come from its pool's calibration profile, then the implementation profile it names
(`implementation:`), then its own `kernels:` entries, each replacing the one before for the kernels it
gives.  An implementation part measured on one GPU is moved to another the way kernels_calibration/derive.py
moves the calibration profile: its seconds per unit split by the unit that spends them (the part's bytes,
tensor work and exponentials at the measuring GPU's rates, the CUDA-core ALU the rest:
costmodel/kernel_work.split) and each share repriced at the target's rate for its unit; the launch overhead
stays the measured one.  A fit measured on the whole model's KV and on tensor-parallel shares of it carries
`gpu_fill`: per channel count on one GPU (KV heads per GPU x head_dim), how much slower per unit a share runs
(a kernel that launches one thread block per 128 channels does not fill the GPU with a small share); a pool's
share is priced with it, interpolated in log2 of the channels and held at the ends.  A part given as an
instruction count (no measurement) is priced at the target's
issue rate plus its bytes at the copy bandwidth, one roofline launch per layer.
"""

from __future__ import annotations

import json
import math
from functools import cache
from pathlib import Path

import catalog
from costmodel.calibration import (
    ROOFLINE_LAUNCH_OVERHEAD_S,
    ROOFLINE_MATMUL_EFFICIENCY,
    ROOFLINE_MEMORY_EFFICIENCY,
    CalibrationProfile,
    KernelFit,
)
from costmodel.kernel_work import KernelWork, UnitRates, reprice, split, unit_rates
from costmodel.methods import KVMethod
from costmodel.specs import GPUSpec

REPO_ROOT = Path(__file__).resolve().parent.parent


def _rates(gpu: GPUSpec) -> UnitRates:
    """A GPU's unit rates at the H200's measured fractions of its peaks (what derived profiles use)."""
    return unit_rates(gpu, ROOFLINE_MEMORY_EFFICIENCY, ROOFLINE_MATMUL_EFFICIENCY)


@cache
def measured_fits(path: str) -> dict:
    """The `fits` of an implementation measurement file (kernels_calibration/impl_bench.py's output)."""
    return json.loads((REPO_ROOT / path).read_text())["fits"]


def _work(part: dict) -> KernelWork:
    return KernelWork(
        hbm_bytes=part.get("hbm_bytes", 0.0),
        fp16_tensor_flops=part.get("fp16_tensor_flops", 0.0),
        int8_tensor_ops=part.get("int8_tensor_ops", 0.0),
        sfu_ops=part.get("sfu_ops", 0.0),
        formula=part.get("formula", ""),
    )


def fill_factor(fill: dict | None, kv_channels_per_gpu: int | None) -> float:
    """The measured slowdown per unit (`gpu_fill`) at `kv_channels_per_gpu`: 1 without either; piecewise linear
    in log2 of the channels between the measured counts, held at the ends."""
    if not fill or kv_channels_per_gpu is None:
        return 1.0
    xs = [math.log2(c) for c in fill["channels_per_gpu"]]
    ys = fill["time_factor"]
    x = math.log2(kv_channels_per_gpu)
    if x <= xs[0]:
        return ys[0]
    for x0, x1, y0, y1 in zip(xs, xs[1:], ys, ys[1:]):
        if x <= x1:
            return y0 + (y1 - y0) * (x - x0) / (x1 - x0)
    return ys[-1]


def part_fit(entry: dict, part: dict, gpu: GPUSpec, kv_channels_per_gpu: int | None = None) -> KernelFit:
    """One part of an implementation's kernel role, priced on `gpu` for a share of `kv_channels_per_gpu` KV
    channels per GPU (None: the share the fit was measured on)."""
    target = _rates(gpu)
    work = _work(part)
    if "fit" not in part:
        s = work.hbm_bytes / target.hbm + part["alu_instr"] / target.alu
        return KernelFit(ROOFLINE_LAUNCH_OVERHEAD_S, s)
    impl, kernel = part["fit"].split(".", 1)
    fit = measured_fits(entry["measurement"])[impl][kernel]
    source = _rates(GPUSpec.from_fields(entry["measured_on"], catalog.entry("gpus", entry["measured_on"])))
    parts = reprice(split(work, fit["s_per_unit"], source), source, target)
    return KernelFit(fit["overhead_s"], sum(parts.values()) * fill_factor(fit.get("gpu_fill"), kv_channels_per_gpu))


def implementation_costs(key: str, gpu: GPUSpec, kv_channels_per_gpu: int | None = None) -> dict[str, KernelFit]:
    """Each kernel role of implementation `key` on `gpu` (for `kv_channels_per_gpu`): its parts' costs added up."""
    entry = catalog.entry("implementations", key)
    out = {}
    for role, parts in entry["kernels"].items():
        fits = [part_fit(entry, p, gpu, kv_channels_per_gpu) for p in parts]
        out[role] = KernelFit(sum(f.overhead_s for f in fits), sum(f.s_per_unit for f in fits))
    return out


def implementation_refusal(method: KVMethod) -> str | None:
    """Why the method cannot take the implementation it names (None: it can, or it names none)."""
    key = method.implementation
    if key is None:
        return None
    entries = catalog.load("implementations")
    if key not in entries:
        return f"unknown implementation {key!r}; known: {', '.join(sorted(entries))}"
    entry = entries[key]
    if method.name not in entry["methods"]:
        return f"implementation {key} is one of {', '.join(entry['methods'])}, not of {method.name}"
    for role in entry["kernels"]:
        why = method.kernel_refusal(role)
        if why:
            return f"implementation {key}: {why}"
    return None


def priced_profile(
    profile: CalibrationProfile, method: KVMethod, gpu: GPUSpec, kv_channels_per_gpu: int | None = None
) -> CalibrationProfile:
    """The profile `method` is priced with on `gpu` (a GPU holding `kv_channels_per_gpu` KV channels): the
    pool's, then its implementation's, then its own costs."""
    costs: dict[str, KernelFit] = {}
    if method.implementation is not None:
        costs.update(implementation_costs(method.implementation, gpu, kv_channels_per_gpu))
    for key, cost in (method.kernels or {}).items():
        costs[key] = cost.fit()
    return method.priced_profile(profile, costs)


def measurement_files(methods) -> list[Path]:
    """The measurement files the methods' implementation profiles read (a sweep point's cache key hashes them)."""
    entries = catalog.load("implementations")
    paths = {
        entries[m.implementation].get("measurement")
        for m in methods
        if m.implementation is not None and m.implementation in entries
    }
    return sorted(REPO_ROOT / p for p in paths if p)
