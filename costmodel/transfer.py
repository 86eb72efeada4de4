"""Prefill -> decode KV transfer over a network link.

A link of `bandwidth_gbps` delivers `efficiency` of line rate to bulk transfers (TCP/NCCL
framing, congestion control); `per_flow_gbps` caps one transfer (AWS caps a single TCP flow at
5 Gbps outside a cluster placement group, 10 inside: reference_specs.yaml, aws_network_rules).
Concurrent transfers share the link max-min fairly (see simulator/link.py); a lone transfer takes
``latency_s + bytes * 8 / rate``.
"""

from __future__ import annotations


def flow_rate_bytes_per_s(
    bandwidth_gbps: float, efficiency: float, per_flow_gbps: float | None, flows: int = 1
) -> float:
    """Rate of each of `flows` equal concurrent transfers on one link, in bytes/s."""
    link = bandwidth_gbps * efficiency * 1e9 / 8 / flows
    if per_flow_gbps is None:
        return link
    return min(link, per_flow_gbps * 1e9 / 8)


def transfer_s(
    bytes_: float, bandwidth_gbps: float, efficiency: float, per_flow_gbps: float | None, latency_s: float
) -> float:
    return latency_s + bytes_ / flow_rate_bytes_per_s(bandwidth_gbps, efficiency, per_flow_gbps)
