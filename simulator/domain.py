"""What runs an engine calibration was fitted on, and where a scenario or a held-out configuration lies outside them.

A fit carries to the regimes its runs include (docs/calibration.md, "Where a prediction extrapolates the fit"): held
out by configuration on one H200 session (realrun/traces/h200_graphs), the configurations a fit on the others predicts
worse than no fit are each the only one of the set with some setting (the only 1 Gbps link, the 8B's only short
prompts, the only 50 Gbps link). Each run's *setting* is what the fit's parameters are the slopes of: the GPU, the
placement, the model (name and layers), the method, the link's line rate, the prefill batch's request limit, and the
prompt and output lengths the run served (its 5th to 95th percentile). The calibration's *domain* is their union (the
categories seen; each number's range, the lengths per model); `outside` names each way a setting leaves it. Outside
is not wrong: it says the prediction extrapolates the fit, where a fit can be worse than the kernels alone, and often
is not (the H100's long prompts, outside every H100 fit, come out better with one).
"""

from __future__ import annotations

from typing import Any

import numpy as np

# A length range is outside where it reaches this much past the domain's (a run's 5th-95th percentile of a uniform
# draw moves by a few percent between seeds; a setting is another regime, not another sample)
LENGTH_SLACK = 0.10
LENGTH_PERCENTILES = (5.0, 95.0)


def model_key(model) -> str:
    return f"{model.preset or model.name} ({model.layers} layers)"


def setting_of(scenario, prompt_tokens, output_tokens, methods: list[str]) -> dict[str, Any]:
    """One run's (or a scenario's) setting: `methods` the registry names (family) it ran, the lengths its requests
    had."""
    from .resolve import network_bandwidth_gbps

    gpus = sorted({pool.gpu.preset or pool.gpu.name for pool in (scenario.prefill, scenario.decode)})
    out: dict[str, Any] = {
        "gpu": "+".join(gpus),
        "placement": scenario.placement,
        "model": model_key(scenario.model),
        "methods": sorted(set(methods)),
        "prompt_tokens": _span(prompt_tokens),
        "output_tokens": _span(output_tokens),
    }
    if scenario.placement != "colocated":  # a colocated replica moves no KV and runs prefill as decode's chunks
        rate = network_bandwidth_gbps(scenario)
        out["link_gbps"] = float(rate) if np.isfinite(rate) else None
        out["prefill_batch_requests"] = int(scenario.prefill.max_batch_requests)
    return out


def _span(tokens) -> list[int]:
    a = np.asarray(tokens, dtype=float)
    a = a[np.isfinite(a)]
    if not len(a):
        return []
    lo, hi = np.percentile(a, LENGTH_PERCENTILES)
    return [int(round(lo)), int(round(hi))]


def domain_of(settings: list[dict[str, Any]]) -> dict[str, Any]:
    """The union of runs' settings: each category's values seen, each number's range, the lengths per model."""
    out: dict[str, Any] = {"gpus": [], "placements": [], "methods": [], "models": {}}
    for one in settings:
        out = merge_domains(out, _domain_of_one(one))
    return out


def _domain_of_one(setting: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {
        "gpus": [setting["gpu"]],
        "placements": [setting["placement"]],
        "methods": list(setting["methods"]),
        "models": {
            setting["model"]: {k: list(setting[k]) for k in ("prompt_tokens", "output_tokens") if setting.get(k)}
        },
    }
    for key in ("link_gbps", "prefill_batch_requests"):
        if setting.get(key) is not None:
            out[key] = [setting[key], setting[key]]
    return out


def outside(domain: dict[str, Any], setting: dict[str, Any]) -> list[str]:
    """Each way `setting` lies outside `domain`, in words (empty: inside every range the runs spanned)."""
    if not domain:
        return []
    out = []
    for key, what in (("gpu", "GPU"), ("placement", "placement")):
        seen = domain.get(key + "s") or []
        if setting[key] not in seen:
            out.append(f"{what} {setting[key]} (the runs': {', '.join(seen)})")
    new = [m for m in setting["methods"] if m not in (domain.get("methods") or [])]
    if new:
        out.append(f"method {', '.join(new)} (the runs': {', '.join(domain.get('methods') or [])})")
    rate, span = setting.get("link_gbps"), domain.get("link_gbps")
    if rate is not None and span and not span[0] * (1 - 1e-9) <= rate <= span[1] * (1 + 1e-9):
        out.append(f"link {rate:g} Gbps (the runs': {_range(span, ' Gbps')})")
    batch, span = setting.get("prefill_batch_requests"), domain.get("prefill_batch_requests")
    if batch is not None and span and not span[0] <= batch <= span[1]:
        out.append(f"a prefill batch limit of {_requests([batch, batch])} (the runs': {_requests(span)})")
    models = domain.get("models") or {}
    if setting["model"] not in models:
        out.append(f"model {setting['model']} (the runs': {', '.join(models)})")
        return out
    for key, what in (("prompt_tokens", "prompts"), ("output_tokens", "outputs")):
        have, span = setting.get(key), models[setting["model"]].get(key)
        if have and span and (have[0] < span[0] * (1 - LENGTH_SLACK) or have[1] > span[1] * (1 + LENGTH_SLACK)):
            out.append(f"{setting['model']} {what} of {_range(have, ' tokens')} (the runs': {_range(span, ' tokens')})")
    return out


def outside_any(domain: dict[str, Any], settings: list[dict[str, Any]]) -> list[str]:
    """Each way any of `settings` (a configuration's runs) lies outside `domain` (outside), each said once."""
    return list(dict.fromkeys(line for one in settings for line in outside(domain, one)))


def _range(span, unit: str = "") -> str:
    lo, hi = span
    return f"{lo:g}{unit}" if lo == hi else f"{lo:g}-{hi:g}{unit}"


def merge_domains(a: dict[str, Any], b: dict[str, Any] | None) -> dict[str, Any]:
    """The union of two domains (a refit's runs and its base calibration's)."""
    if not b:
        return a
    out: dict[str, Any] = {k: sorted(set(a.get(k, [])) | set(b.get(k, []))) for k in ("gpus", "placements", "methods")}
    out["models"] = {}
    for key in ("link_gbps", "prefill_batch_requests"):
        spans = [d[key] for d in (a, b) if d.get(key)]
        if spans:
            out[key] = [min(s[0] for s in spans), max(s[1] for s in spans)]
    for d in (a, b):
        for model, lengths in (d.get("models") or {}).items():
            m = out["models"].setdefault(model, {})
            for key, (lo, hi) in lengths.items():
                have = m.get(key, [lo, hi])
                m[key] = [min(have[0], lo), max(have[1], hi)]
    out["models"] = dict(sorted(out["models"].items()))
    return out


def describe(domain: dict[str, Any]) -> list[str]:
    """The domain for people, a line per part."""
    if not domain:
        return []
    out = [
        f"GPU {', '.join(domain.get('gpus', []))}; placement {', '.join(domain.get('placements', []))}; methods "
        + ", ".join(domain.get("methods", []))
    ]
    links = [f"link {_range(domain['link_gbps'], ' Gbps')}"] if domain.get("link_gbps") else []
    if domain.get("prefill_batch_requests"):
        links.append(f"prefill batch limit {_requests(domain['prefill_batch_requests'])}")
    if links:
        out.append("; ".join(links))
    for model, lengths in (domain.get("models") or {}).items():
        parts = [
            f"{what} {_range(lengths[key], ' tokens')}"
            for key, what in (("prompt_tokens", "prompts"), ("output_tokens", "outputs"))
            if lengths.get(key)
        ]
        out.append(f"{model}: {', '.join(parts)}")
    return out


def _requests(span) -> str:
    return f"{_range(span)} request" + ("s" if span[1] > 1 else "")


def scenario_outside(scenario, requests, methods: list[str]) -> list[str]:
    """Where a scenario naming an engine calibration (calibration.engine, already applied: an absolute path) lies
    outside the runs the calibration was fitted on; `requests` its workload's (prompt_tokens, output_tokens), `methods`
    the registry names of the methods run."""
    from .engine import read_engine_file

    if scenario.calibration.engine is None:
        return []
    domain = read_engine_file(scenario.calibration.engine, ValueError).domain_dict()
    return outside(domain, setting_of(scenario, requests["prompt_tokens"], requests["output_tokens"], methods))
