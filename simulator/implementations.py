"""Implementation profiles (catalog/data/implementations.yaml) priced for a pool's GPU, and the kernel costs a
method is priced with.

A method's costs come from its pool's calibration profile, then the implementation profile it names
(`implementation:`), then its own `kernels:` entries, each replacing the one before for the kernels it
gives.  An implementation part measured on one GPU is moved to another the way kernels_calibration/derive.py
moves the calibration profile: its seconds per unit split by the unit that spends them (the part's bytes,
tensor work and exponentials at the measuring GPU's rates, the CUDA-core ALU the rest:
costmodel/kernel_work.split) and each share repriced at the target's rate for its unit; the launch overhead
stays the measured one.  A part given as an instruction count (no measurement) is priced at the target's
issue rate plus its bytes at the copy bandwidth, one roofline launch per layer.
"""

from __future__ import annotations

import json
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


def part_fit(entry: dict, part: dict, gpu: GPUSpec) -> KernelFit:
    """One part of an implementation's kernel role, priced on `gpu`."""
    target = _rates(gpu)
    work = _work(part)
    if "fit" not in part:
        s = work.hbm_bytes / target.hbm + part["alu_instr"] / target.alu
        return KernelFit(ROOFLINE_LAUNCH_OVERHEAD_S, s)
    impl, kernel = part["fit"].split(".", 1)
    fit = measured_fits(entry["measurement"])[impl][kernel]
    source = _rates(GPUSpec.from_fields(entry["measured_on"], catalog.entry("gpus", entry["measured_on"])))
    parts = reprice(split(work, fit["s_per_unit"], source), source, target)
    return KernelFit(fit["overhead_s"], sum(parts.values()))


def implementation_costs(key: str, gpu: GPUSpec) -> dict[str, KernelFit]:
    """Each kernel role of implementation `key` on `gpu`: its parts' costs added up."""
    entry = catalog.entry("implementations", key)
    out = {}
    for role, parts in entry["kernels"].items():
        fits = [part_fit(entry, p, gpu) for p in parts]
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


def priced_profile(profile: CalibrationProfile, method: KVMethod, gpu: GPUSpec) -> CalibrationProfile:
    """The profile `method` is priced with on `gpu`: the pool's, then its implementation's, then its own costs."""
    costs: dict[str, KernelFit] = {}
    if method.implementation is not None:
        costs.update(implementation_costs(method.implementation, gpu))
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
