"""Calibration profiles: the measured (or derived, or roofline) costs the cost model prices kernels with.

A profile is one JSON file per GPU, ``kernels_calibration/profiles/<gpu_key>/profile.json``,
written by ``python -m kernels_calibration.profile`` (measured) or by the derivation script
(derived from a measured profile plus catalog peaks). When no profile exists for a GPU, the cost
model builds a *roofline* profile from catalog peaks and the named efficiency factors below.

Every kernel is priced by a two-coefficient fit over one canonical work unit::

    time_s = overhead_s + s_per_unit * units

The units are fixed here, so profiles from any GPU and any harness mean the same thing:

=========================  ====================================================================
kernel key                 unit (counted per launch; one launch = one layer on one GPU)
=========================  ====================================================================
``decode_attn.<variant>``  KV elements visited: sum over the batch of ctx_len * kv_heads * head_dim * 2
                           (K and V). Query heads per KV head (the GQA group) as profiled (8);
                           ``decode_attn.<variant>_gqa<g>`` is the same kernel measured at group g.
``prefill_attn.<variant>`` causal attention FLOPs: 4 * q_heads * head_dim * sum_b L_b (L_b + 1) / 2
``quantize.kv``            K and V elements quantized (2-bit HACK/KVQuant-style, sums included)
``dequantize.kv``          K and V elements dequantized to FP16 in memory
=========================  ====================================================================

Decode variants: ``fp16``, ``fp8``, ``dequant_fused``, ``dequant_unfused``, ``hack``,
``hack_no_se``, ``hack_no_rqe``. Prefill variants: ``fp16``, ``hack``. (Each method lists the keys it
prices with, ``kernel_keys``; ``costmodel.methods.kernel_keys()`` is their union.) A profile measured where the
Gluon decode kernels run (Hopper) also has ``<variant>_triton`` for ``dequant_fused`` and the ``hack``
variants: the Triton kernel that runs for the shapes the Gluon kernel does not take (methods.decode_fit).

Dense projections and MLPs (GEMMs) are priced by a roofline over the profile's achieved
``memory_gbps`` and ``matmul_*`` rates, scaled by the ``gemm`` efficiencies measured at real layer
shapes when the profile has them (``dense_bench.py``), plus an overhead per GEMM.  The
memory-bound elementwise kernels of a layer (norms, RoPE, SiLU and the gate product, residual
adds) are priced by the ``elementwise`` kernel (unit: bytes read + written) when measured, else
at the copy bandwidth plus ``launch_overhead_s`` each.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Literal, overload

if TYPE_CHECKING:
    import numpy as np

SCHEMA_VERSION = 1

# Named efficiency factors of the roofline fallback. Each is the fraction of a datasheet peak that
# well-written code reaches; the values are measured on the lent H200 (DEVELOPERS.md facts), not
# fitted to any paper's result, and apply to any GPU until a measured or derived profile exists.
ROOFLINE_MEMORY_EFFICIENCY = 4220.4 / 4800.0  # 1 GiB D2D copy / HBM datasheet bandwidth (H200 profile peaks)
ROOFLINE_MATMUL_EFFICIENCY = 693.4 / 989.4  # 8192^3 GEMM / dense tensor peak (H200 profile peaks); also INT8:
# kernel_work.unit_rates says why
ROOFLINE_LAUNCH_OVERHEAD_S = 5e-6  # one kernel launch, CUDA-graph-free
# Per-element ALU work (integer unpack, convert, scale) runs on CUDA cores, not tensor cores.
# Ops per KV element: 2-bit unpack (shift, mask), convert to FP16, one FMA with scale and min.
DEQUANT_OPS_PER_ELEMENT = 4.0
HACK_UNPACK_OPS_PER_ELEMENT = 2.0  # unpack to INT8 only: no convert, no FMA (homomorphic)
QUANTIZE_OPS_PER_ELEMENT = 8.0  # min/max reduce, scale, round (stochastic: + RNG), pack, sum


@dataclass(frozen=True)
class KernelFit:
    """time_s = overhead_s + s_per_unit * units for one kernel launch."""

    overhead_s: float
    s_per_unit: float
    heldout_median_error_pct: float | None = None
    # the fixed cost inside a captured CUDA graph, kernels back to back (no launch): measured for the elementwise
    # kernels (kernels_calibration/dense_bench.py, elementwise_in_graph rows); None where not measured
    in_graph_overhead_s: float | None = None

    @overload
    def time_s(self, units: float) -> float: ...
    @overload
    def time_s(self, units: np.ndarray) -> np.ndarray: ...
    def time_s(self, units):
        """units may be a numpy array (the cost model prices blocks of prompt lengths at once)."""
        return self.overhead_s + self.s_per_unit * units


@dataclass(frozen=True)
class GemmFit:
    """Dense GEMMs at real layer shapes (kernels_calibration/dense_bench.py):
    time = overhead_s + max(flops / (matmul_fp16 * compute_efficiency), bytes / (memory * memory_efficiency))."""

    overhead_s: float
    compute_efficiency: float
    memory_efficiency: float
    heldout_median_error_pct: float | None = None


@dataclass(frozen=True, eq=False)  # hashed by identity: profiles key the cost caches
class CalibrationProfile:
    gpu: str
    source: Literal["measured", "derived", "roofline"]
    memory_gbps: float
    matmul_fp16_tflops: float
    matmul_int8_tops: float | None
    matmul_fp8_tflops: float | None
    launch_overhead_s: float
    kernels: dict[str, KernelFit]
    derived_from: str | None = None
    provenance: dict = field(default_factory=dict)
    path: str | None = None
    gemm: GemmFit | None = None  # None: GEMMs at the peak rates plus launch_overhead_s (roofline)

    def kernel(self, key: str) -> KernelFit:
        try:
            return self.kernels[key]
        except KeyError:
            raise KeyError(f"calibration profile for {self.gpu} ({self.source}) has no kernel {key!r}") from None

    @property
    def label(self) -> str:
        where = f" from {self.derived_from}" if self.derived_from else ""
        return f"{self.gpu} ({self.source}{where})"


# A catalog measurement (catalog/data/gpus.yaml `measured`) and the profile rate it is compared with.
MEASURED_QUANTITY_FIELD = {
    "fp16_gemm_tflops": "matmul_fp16_tflops",
    "bf16_gemm_tflops": "matmul_fp16_tflops",
    "int8_gemm_tops": "matmul_int8_tops",
    "copy_gb_per_s": "memory_gbps",
}


def compare_to_measured(profile: CalibrationProfile, measured: list[dict]) -> list[dict]:
    """How far the profile's rates sit from published measurements of its GPU: one row per measurement,
    error_pct = (profile - measured) / measured (positive: the profile is faster than the measurement)."""
    rows = []
    for m in measured:
        field_name = MEASURED_QUANTITY_FIELD.get(m["quantity"])
        value = None if field_name is None else getattr(profile, field_name)
        rows.append(
            {
                "quantity": m["quantity"],
                "measured": m["value"],
                "profile_field": field_name,
                "profile": value,
                "error_pct": None if value is None else round(100 * (value - m["value"]) / m["value"], 1),
                "how": m.get("how"),
                "source": m.get("source"),
            }
        )
    return rows


def load_profile(path: str | Path) -> CalibrationProfile:
    """Read a profile JSON; a missing kernel key is an error at use, not at load."""
    path = Path(path)
    raw = json.loads(path.read_text())
    if raw.get("schema_version") != SCHEMA_VERSION:
        raise ValueError(f"{path}: schema_version must be {SCHEMA_VERSION}, got {raw.get('schema_version')!r}")
    kernels = {
        key: KernelFit(
            overhead_s=float(fit["overhead_s"]),
            s_per_unit=float(fit["s_per_unit"]),
            heldout_median_error_pct=fit.get("heldout_median_error_pct"),
            in_graph_overhead_s=None if fit.get("in_graph_overhead_s") is None else float(fit["in_graph_overhead_s"]),
        )
        for key, fit in raw["kernels"].items()
    }
    return CalibrationProfile(
        gpu=raw["gpu"],
        source=raw["source"],
        memory_gbps=float(raw["memory_gbps"]),
        matmul_fp16_tflops=float(raw["matmul_fp16_tflops"]),
        matmul_int8_tops=None if raw.get("matmul_int8_tops") is None else float(raw["matmul_int8_tops"]),
        matmul_fp8_tflops=None if raw.get("matmul_fp8_tflops") is None else float(raw["matmul_fp8_tflops"]),
        launch_overhead_s=float(raw.get("launch_overhead_s", ROOFLINE_LAUNCH_OVERHEAD_S)),
        kernels=kernels,
        derived_from=raw.get("derived_from"),
        provenance=dict(raw.get("provenance", {})),
        path=str(path),
        gemm=None
        if raw.get("gemm") is None
        else GemmFit(
            overhead_s=float(raw["gemm"]["overhead_s"]),
            compute_efficiency=float(raw["gemm"]["compute_efficiency"]),
            memory_efficiency=float(raw["gemm"]["memory_efficiency"]),
            heldout_median_error_pct=raw["gemm"].get("heldout_median_error_pct"),
        ),
    )
