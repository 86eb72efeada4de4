"""Small, fast bases for planning tests: Llama-3.1-8B on one GPU per pool, fixed lengths, roofline costs."""

from __future__ import annotations

from pathlib import Path

import yaml

TINY_BASE = {
    "name": "tiny-plan",
    "model": "llama-3.1-8b",
    "prefill": {"instance": "g6e.12xlarge", "tensor_parallel": 1, "replicas": 1, "max_batch_requests": 1},
    "decode": {"instance": "g6e.12xlarge", "tensor_parallel": 1, "replicas": 1, "max_batch_requests": 64},
    "network": {"bandwidth_gbps": 10, "latency_s": 0.0, "efficiency": 1.0},
    "workload": {
        "input_tokens": {"kind": "fixed", "tokens": 2048},
        "output_tokens": {"kind": "fixed", "tokens": 16},
        "arrival": {"kind": "poisson", "rate_rps": 1.0},
        "requests": 30,
        "seed": 0,
    },
    "methods": ["baseline", "hack"],
    "calibration": {"prefill_profile": "roofline", "decode_profile": "roofline"},
}


def write_sweep(folder: Path, spec: dict) -> Path:
    path = folder / "sweep.yaml"
    path.write_text(yaml.safe_dump({"base": "base.yaml", **spec}, sort_keys=False))
    return path
