"""Banners at the top of a report: things the reader must see before trusting its numbers.

`overload_banner` says which methods ran with a pool at or above full utilisation (summary.json's
per-method ``utilisation`` and ``stable``, see simulator/overload.py): their queues grew for as long
as requests arrived, so their latencies depend on the run's length. Plain HTML with its own style,
so any page template can place it.
"""

from __future__ import annotations

import html
import math

STYLE = (
    "background:#fef2f2;border:1px solid #fca5a5;color:#991b1b;border-radius:8px;padding:10px 14px;"
    "margin:12px 0;font-weight:500"
)


def overload_banner(summary: dict) -> str:
    """An HTML banner naming every unstable method and its saturated pools, or "" when all are stable."""
    hits = []
    for name, m in (summary.get("methods") or {}).items():
        if not isinstance(m, dict) or m.get("stable", True) is not False:
            continue
        util = m.get("utilisation") or {}
        pools = [f"{pool} {_fmt(u)}" for pool, u in util.items() if _over(u)]
        hits.append(f"{name} ({', '.join(pools)})" if pools else name)
    if not hits:
        return ""
    text = (
        "Overloaded: offered load exceeds what a pool can serve, so queues grew for as long as requests "
        "arrived and these latencies depend on the run's length, not only on the system. Utilisation ≥ 1: "
        + "; ".join(hits)
        + "."
    )
    return f'<div class="banner-overload" role="alert" style="{STYLE}">{html.escape(text)}</div>'


def _over(u) -> bool:
    if u == "Infinity":
        return True
    return isinstance(u, (int, float)) and u >= 1.0


def _fmt(u) -> str:
    if u == "Infinity" or (isinstance(u, float) and math.isinf(u)):
        return "unbounded"
    return f"{u:.2f}"
