"""Capacity planning: sweeps over scenario axes and the cheapest configuration meeting latency SLOs.

`sweep` expands a base scenario and axes into points and simulates each (`planning.sweep`);
`plan` searches prefill/decode configurations x methods for the cheapest one meeting SLOs at a
rate, and each candidate's goodput by bisection on the rate (`planning.plan`). Both run points
through `planning.executor` (disk cache by content hash; process pool or Ray) and are exposed on
the CLI by `planning.commands.register_commands`.
"""

from pathlib import Path

# The project's root: what a sweep point's cache key hashes (planning.executor) and a Ray job ships
# (planning.raycluster).
ROOT = Path(__file__).resolve().parent.parent


class PlanningError(ValueError):
    """Bad sweep/plan input or an unavailable backend; the message is one line."""
