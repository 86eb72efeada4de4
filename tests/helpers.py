"""Small scenarios for tests: a tiny dense model on one GPU per pool, fixed lengths, roofline costs."""

from __future__ import annotations

import copy

from simulator.config import parse_scenario

TINY = {
    "name": "tiny",
    "model": {"preset": "llama-3.1-8b"},
    "prefill": {
        "gpu": "a100_80gb",
        "tensor_parallel": 1,
        "replicas": 1,
        "max_batch_requests": 1,
        "max_batch_tokens": 8192,
    },
    "decode": {"gpu": "a100_80gb", "tensor_parallel": 1, "replicas": 1, "max_batch_requests": 64},
    "network": {"bandwidth_gbps": 10, "latency_s": 0.0, "efficiency": 1.0},
    "workload": {
        "input_tokens": {"kind": "fixed", "tokens": 4096},
        "output_tokens": {"kind": "fixed", "tokens": 32},
        "arrival": {"kind": "poisson", "rate_rps": 0.01},
        "requests": 1,
        "seed": 0,
    },
    "methods": ["baseline", "kvquant", "cachegen", "fp8", "hack", "hack_no_se", "hack_no_rqe"],
    "calibration": {"prefill_profile": "roofline", "decode_profile": "roofline"},
}


def scenario(**changes):
    """TINY with dotted-path changes: scenario(**{"network.bandwidth_gbps": 25})."""
    raw = copy.deepcopy(TINY)
    for path, value in changes.items():
        node = raw
        keys = path.split(".")
        for k in keys[:-1]:
            node = node.setdefault(k, {})
        node[keys[-1]] = copy.deepcopy(value)
    return parse_scenario(raw, "test")
