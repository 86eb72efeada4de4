"""What the host's speed alone moves a run's mean JCT by, before any recording of it.

A run priced with every host time term (engine.HOST_TIMES: the loop gap, issue, join and leave times, the prefill's
and the quantize step's floors) x HOST_STEP and / HOST_STEP (engine.on_host) gives the elasticity of its mean JCT in
the host's time (`host_sensitivity`); that times the host's run-to-run speed spread (`host_spread`: a repeats index's own host-bound
step, else HOST_SPEED_SPREAD_PCT) is the spread the host alone gives its mean JCT, the host's share of the floor an
error is held to (simulator/noise.py; `validate` and `validate --cv` print it; docs/calibration.md, the noise floor).
`simulate --host-spread` gives each method of a scenario the same figure before any run (method_host_sensitivities).
A scenario whose engine prices no host time gets none (prices_host_time).
"""

from __future__ import annotations

import math
from collections.abc import Callable

HOST_GAUGE = "quantize_mean"  # the recordings' host-bound step (simulator/noise.py)
# The host's speed from one recording to the next, where no repeats index says it: the run-to-run spread of the
# host-bound step's mean (HOST_GAUGE) pooled over realrun/traces/h200_repeats/index_sessions.csv, every H200
# configuration recorded in two to four device sessions (tests/test_noise.py recomputes it; the H100 sessions'
# index_h100_sessions.csv gives 20.8 %, one H200 session's back-to-back repeats 9.3 %).
HOST_SPEED_SPREAD_PCT = 18.1
NO_HOST_TIME = "the scenario prices no host time (every host time term of its engine is 0)"
HOST_STEP = 1.25  # host_sensitivity prices a run with every host time term x HOST_STEP and / HOST_STEP


def host_sensitivity(jct_fast_s: float, jct_slow_s: float, step: float = HOST_STEP) -> float:
    """The elasticity of a run's mean JCT in its host's speed: d ln JCT / d ln (host time), from the run priced with
    every host time term / step (`jct_fast_s`) and x step (`jct_slow_s`)."""
    return math.log(jct_slow_s / jct_fast_s) / (2.0 * math.log(step))


def prices_host_time(s) -> bool:
    """Whether the scenario's engine prices any host time (engine.host_times): else the host's speed moves nothing
    and a host figure would be a bare 0, so there is none."""
    from .engine import host_times

    return bool(host_times(s))


def method_host_sensitivities(
    s, source: str, methods: list[str] | None = None, progress: Callable[[str], None] | None = None
) -> dict[str, float | None]:
    """Each method's mean JCT elasticity in the host's speed (host_sensitivity), the scenario simulated again with
    every host time term x and / HOST_STEP: `simulate --host-spread`. Empty where the scenario prices no host time."""
    from .engine import on_host
    from .run import run_scenario

    if not prices_host_time(s):
        return {}
    fast, slow = (
        run_scenario(on_host(s, f), source=source, methods=methods, progress=progress).summary["methods"]
        for f in (1.0 / HOST_STEP, HOST_STEP)
    )
    out = {}
    for n in fast:
        a, b = fast[n]["jct_s"]["mean"], slow[n]["jct_s"]["mean"]  # None or NaN where no request completed
        ok = all(isinstance(x, (int, float)) and math.isfinite(x) and x > 0 for x in (a, b))
        out[n] = round(host_sensitivity(a, b), 4) if ok else None
    return out


def host_spread(noise: dict | None) -> dict:
    """The host's run-to-run speed spread a prediction is held to: the repeats index's own (its host-bound step's
    pooled spread) where it times that step, else HOST_SPEED_SPREAD_PCT."""
    own = (noise or {}).get("spread_pct", {}).get(HOST_GAUGE)
    if noise and own is not None:
        return {"spread_pct": own, "from": f"{noise['index']}: its recordings' {HOST_GAUGE.replace('_', ' ')}"}
    return {
        "spread_pct": HOST_SPEED_SPREAD_PCT,
        "from": "H200 device sessions' quantize step (host_speed.HOST_SPEED_SPREAD_PCT)",
    }


def add_method_spreads(summary: dict, sensitivities: dict[str, float | None]) -> dict:
    """`simulate --host-spread`: each method of `summary` (summary.json's) gets its `host_sensitivity` and
    `host_spread_jct_mean_pct` (it times HOST_SPEED_SPREAD_PCT), the summary `host_speed` (what they were computed
    from). Returns that."""
    host = {**host_spread(None), "step": HOST_STEP, "priced": bool(sensitivities)}
    for name, m in summary["methods"].items():
        x = sensitivities.get(name)
        m["host_sensitivity"] = x
        m["host_spread_jct_mean_pct"] = None if x is None else round(x * host["spread_pct"], 2)
    host["line"] = planning_host_line(host)
    summary["host_speed"] = host
    return host


def planning_host_line(host: dict) -> str:
    """Under `simulate --host-spread`'s table: what its `± host` column is."""
    if not host["priced"]:
        return f"± host: n/a, {NO_HOST_TIME}"
    return (
        f"± host: what the host's run-to-run speed spread (±{host['spread_pct']:.1f} %, {host['from']}) alone moves "
        f"each method's mean JCT by, every host time term x{host['step']:g} and /{host['step']:g} "
        "(simulator/host_speed.py), one sd: a recording's mean JCT within about twice it of the simulated one is "
        "inside what the host's speed alone moves it by"
    )


def host_speed_line(host: dict, whose: str) -> str:
    """What a `host speed alone` figure is, under a table of them: `host` is host_spread's, `whose` what it moves."""
    return (
        f"host speed alone: what the host's run-to-run speed spread (±{host['spread_pct']:.1f} %, {host['from']}) "
        f"moves {whose} mean JCT by, simulated at its scenario's values with every host term x{HOST_STEP:g} and "
        f"/{HOST_STEP:g} (simulator/host_speed.py): the host's share of the floor an error is held to"
    )
