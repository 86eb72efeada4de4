"""Colours, labels and unit formatting shared by every figure and table of the report.

A method keeps one colour in every figure and every page (simulate, sweep), so a reader learns it
once; each method's colour and label live in its module (`costmodel/methods`), read here through
the registry (HACK and its ablations are shades of one red; the baseline is grey). Phases have
colours of their own, none near a method's.
"""

from __future__ import annotations

import math

from costmodel import methods as registry

from .data import BREAKDOWN_PARTS

# For methods the registry does not know (or a labelled variant whose kind's colour is taken), in order
# of appearance.
FALLBACK_COLOURS = ("#a16207", "#0f766e", "#7c3aed", "#db2777", "#4d7c0f", "#1e40af", "#9a3412", "#475569")

# Phases in related hues of their own, away from every method colour (a bar's phase is never mistaken
# for a method): prefill browns, transfer olives, decode steel blues, the two overheads the tool
# exists to predict darkest (dequantize plum, approximation black), preemption a deep decode blue.
PART_COLOURS = {
    "prefill_queue": "#ddd0bd",
    "prefill": "#a0845c",
    "quantize": "#5c4430",
    "transfer_queue": "#dde5bf",
    "transfer": "#8c9a3c",
    "decode_queue": "#d6e0ee",
    "decode": "#7a9cc6",
    "dequantize": "#3b1f4a",
    "approximation": "#111111",
    "preemption": "#0b2545",
}
PART_LABELS = {p: p.replace("_", " ").capitalize() for p in BREAKDOWN_PARTS}

FONT = "Inter, -apple-system, 'Segoe UI', Roboto, Helvetica, Arial, sans-serif"


def method_colours(methods: list[str], kinds: dict[str, str] | None = None) -> dict[str, str]:
    """A colour per method: its own, else its kind's (a labelled variant) if still free, else a spare."""
    kinds = kinds or {}
    out, spare = {}, iter(FALLBACK_COLOURS * (1 + len(methods) // len(FALLBACK_COLOURS)))
    taken = {c for c in map(registry.colour, methods) if c is not None}
    for m in methods:
        colour = registry.colour(m)
        if colour is None:
            colour = registry.colour(kinds.get(m, ""))
            if colour is None or colour in taken:
                colour = next(spare)
            taken.add(colour)
        out[m] = colour
    return out


def method_label(method: str) -> str:
    return registry.display_label(method) or method


def fmt_seconds(x: float | None) -> str:
    """Seconds with a unit that keeps three significant digits readable."""
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "–"
    ax = abs(x)
    if ax >= 100:
        return f"{x:,.0f} s"
    if ax >= 1:
        return f"{x:.3g} s"
    if ax >= 1e-3:
        return f"{x * 1e3:.3g} ms"
    if ax == 0:
        return "0 s"
    return f"{x * 1e6:.3g} µs"


def fmt_bytes(x: float | None) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "–"
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(x) >= scale:
            return f"{x / scale:.3g} {unit}"
    return f"{x:.4g} B"


def fmt_pct(x: float | None, signed: bool = True) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "–"
    if signed and abs(x) < 0.05:
        return "0.0%"
    return f"{x:+.1f}%" if signed else f"{x:.1f}%"


def base_layout(title: str, **kw) -> dict:
    """Layout every figure starts from: white template, same font, title left."""
    layout = dict(
        template="plotly_white",
        title=dict(text=title, x=0.01, xanchor="left", font=dict(size=17)),
        font=dict(family=FONT, size=13, color="#1f2937"),
        margin=dict(l=70, r=30, t=70, b=60),
        hoverlabel=dict(font=dict(family=FONT, size=12)),
        # Right of the plot, top-aligned: never collides with the title or subplot titles.
        legend=dict(
            orientation="v", yanchor="top", y=1, xanchor="left", x=1.01, title=None, bgcolor="rgba(255,255,255,0.85)"
        ),
    )
    layout.update(kw)
    return layout
