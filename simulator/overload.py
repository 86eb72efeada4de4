"""Is the offered load more than the cluster can serve? Each pool's utilisation, measured in the run.

Utilisation is the work a pool was asked for divided by what it can deliver while the requests
arrive, over the arrival window T = (last arrival − first arrival) · n / (n − 1) (the expected span
of n arrivals, so a run of n requests at rate λ has T ≈ n / λ):

- prefill: Σ busy seconds of its replicas (each batch occupies a replica for its bottleneck stage plus
  the encode, at the batching the run reached) / (replicas · T);
- network: per link, Σ bytes it carried / (its capacity · T); the pool's figure is the busiest link;
- decode: the busiest of its limits: KV memory (Σ bytes held × seconds held, from admission to finish,
  / (Σ capacity · T)), offloaded KV in host memory likewise, and batch slots (Σ seconds held /
  (replicas · max_batch_requests · T)).

By Little's law each is the offered load λ·E[service] over the pool's capacity, so utilisation ≥ 1
means the pool cannot keep up: its queue grows for as long as requests arrive and the run's
latencies say more about the run's length than about the system ("stable": false). Near 1 a finite
run is noisy. A run whose requests all arrive at once has T = 0: unbounded utilisation.
"""

from __future__ import annotations

import math

import numpy as np


def arrival_window_s(arrival_s: np.ndarray) -> float:
    n = len(arrival_s)
    if n < 2:
        return math.nan
    return float(arrival_s.max() - arrival_s.min()) * n / (n - 1)


def _ratio(demand: float, capacity: float) -> float:
    if demand <= 0:
        return 0.0
    if capacity <= 0:
        return math.inf
    return demand / capacity


def utilisation(
    *,
    arrival_s: np.ndarray,
    prefill_busy_s: float,
    prefill_replicas: int,
    link_bytes: dict[str, float],
    link_capacity_bytes_per_s: dict[str, float],
    held_s: np.ndarray,
    held_kv_bytes: np.ndarray,
    held_host_bytes: np.ndarray,
    decode_replicas: int,
    decode_kv_capacity_bytes: float,
    decode_host_capacity_bytes: float,
    decode_max_batch: int,
) -> dict[str, float]:
    """{"prefill", "network", "decode"} utilisations (NaN when fewer than two requests).

    `held_*`: per decoded request, the seconds its KV reservation was held on a decode replica
    (admission to finish) and the bytes it held in GPU and host memory."""
    t = arrival_window_s(arrival_s)
    if math.isnan(t):
        return {"prefill": math.nan, "network": math.nan, "decode": math.nan}
    links = [_ratio(b, link_capacity_bytes_per_s[name] * t) for name, b in link_bytes.items()]
    decode = max(
        _ratio(float(np.dot(held_kv_bytes, held_s)), decode_replicas * decode_kv_capacity_bytes * t),
        _ratio(float(np.dot(held_host_bytes, held_s)), decode_replicas * decode_host_capacity_bytes * t),
        _ratio(float(held_s.sum()), decode_replicas * decode_max_batch * t),
    )
    return {
        "prefill": _ratio(prefill_busy_s, prefill_replicas * t),
        "network": max(links, default=0.0),
        "decode": decode,
    }


def is_stable(util: dict[str, float]) -> bool:
    return all(not (u >= 1.0) for u in util.values())  # NaN (too few requests to tell) counts as stable


def overload_line(summary: dict) -> str | None:
    """One terminal line naming every method and pool whose utilisation is >= 1, or None."""
    hits = []
    for name, m in summary.get("methods", {}).items():
        if m.get("stable", True):
            continue
        pools = ", ".join(
            f"{pool} {_fmt(u)}"
            for pool, u in m.get("utilisation", {}).items()
            if isinstance(u, (int, float)) and u >= 1.0
        )
        hits.append(f"{name} ({pools})")
    if not hits:
        return None
    return (
        "warning: offered load exceeds capacity, queues grow for as long as requests arrive and latencies "
        "depend on the run's length: utilisation " + "; ".join(hits)
    )


def _fmt(u: float) -> str:
    return "unbounded" if math.isinf(u) else f"{u:.2f}"
