"""SLO planning: the cheapest prefill/decode configuration and method meeting latency targets at a rate.

A candidate is (prefill pool, decode pool, one KV method): an instance type, its tensor/pipeline
layout and a replica count per pool. Everything else (model, workload lengths, batching knobs,
network) comes from the base scenario. The candidate space is a small candidates file or, by
default, every catalog instance with a price on which the model's weights fit within
`max_instances_per_replica` instances (tensor parallel over the whole instance, the fewest pipeline
stages that fit), times replica counts, times the scenario's methods.

Cost per hour = Σ pools replicas x instances per replica x price per instance (on-demand catalog
price unless the candidate gives one). Instances without a price cannot be ranked and are left out
with a note.

Each candidate is simulated at the target rate R; it meets the SLOs when every target metric
(`ttft_p99_s`, `tpot_p99_s`, `jct_p90_s`, ...) is at most its bound and every request finished.
Its goodput, the highest Poisson rate within the SLOs, is found by `RateSearch`: R first, then
doubling (or halving) to bracket the threshold, then geometric bisection, `steps` simulations at
most. Same seed at every rate: the arrival gaps of a rate are those of another scaled, so the
search sees one workload at different speeds. All candidates advance one probe per round, so a
round is one parallel batch on the pool or Ray.

The answer is the cheapest candidate meeting the SLOs at R; at equal cost the one with the higher
goodput, then the one with the most headroom at R (the smallest worst metric/limit ratio).
"""

from __future__ import annotations

import copy
import math
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd
from pydantic import BaseModel, ConfigDict, Field, ValidationError

import catalog
from costmodel.methods import REFERENCE, reference_method
from costmodel.phases import ModelDoesNotFit
from simulator.config import ScenarioError, first_error, read_yaml

from .executor import Executor, PlanningError, Task
from .sweep import build_raw, config_columns, cost_usd_per_hour, metric_columns, read_base, resolve_scenario, slo_misses

# Pool keys that describe one instance type (a fixed KV pool is sized for its GPUs); dropped when a
# candidate names another instance.
INSTANCE_SPECIFIC = (
    "gpu",
    "price_usd_per_hour",
    "interconnect",
    "intra_node_gb_per_s",
    "host_memory_gib",
    "kv_capacity_gib",
)


# ---- the candidates file ----------------------------------------------------------------------------
class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class PoolOption(_Strict):
    instance: str = Field(description="catalog/data/instances.yaml key")
    tensor_parallel: int | list[int] | None = Field(default=None, description="default: the instance's GPU count")
    pipeline_parallel: int | list[int] | None = Field(default=None, description="default: the fewest stages that fit")
    replicas: int | list[int] | None = Field(default=None, description="default: the pool's default replica counts")
    price_usd_per_hour: float | None = Field(default=None, ge=0, description="per instance; default: the catalog's")


class CandidatesSpec(_Strict):
    prefill: list[PoolOption] | None = Field(default=None, description="default: every priced instance that fits")
    decode: list[PoolOption] | None = Field(default=None, description="default: every priced instance that fits")
    prefill_replicas: list[int] = Field(default=[1, 2, 3], min_length=1, description="replica counts tried by default")
    decode_replicas: list[int] = Field(
        default=[1, 2],
        min_length=1,
        description="replica counts tried by default; a decode replica batches many requests, so fewer are needed",
    )
    methods: list[Any] | None = Field(default=None, description="method names or mappings; default: the scenario's")
    max_instances_per_replica: int = Field(
        default=2,
        ge=1,
        description="automatic layouts span at most this many instances (more pipeline stages rarely pay off)",
    )


def load_candidates(path: str | Path | None) -> CandidatesSpec:
    if path is None:
        return CandidatesSpec()
    path = Path(path)
    raw = read_yaml(path, PlanningError, "candidates file") or {}
    if not isinstance(raw, dict):
        raise PlanningError(f"{path}: expected a mapping at the top level")
    try:
        return CandidatesSpec.model_validate(raw)
    except ValidationError as e:
        raise PlanningError(first_error(str(path), e, "file")) from None


# ---- candidates -----------------------------------------------------------------------------------------
@dataclass(frozen=True)
class PoolChoice:
    instance: str
    tensor_parallel: int
    pipeline_parallel: int
    replicas: int
    price_usd_per_hour: float | None = None

    @property
    def label(self) -> str:
        price = "" if self.price_usd_per_hour is None else f" @${self.price_usd_per_hour:g}"
        return f"{self.replicas}x {self.instance} TP{self.tensor_parallel} PP{self.pipeline_parallel}{price}"

    def apply(self, raw: dict, pool: str) -> None:
        node = raw.get(pool)
        node = dict(node) if isinstance(node, dict) else {}
        if node.get("instance") != self.instance:
            for k in INSTANCE_SPECIFIC:
                node.pop(k, None)
        node.pop("gpu", None)
        node.update(
            instance=self.instance,
            tensor_parallel=self.tensor_parallel,
            pipeline_parallel=self.pipeline_parallel,
            replicas=self.replicas,
        )
        if self.price_usd_per_hour is not None:
            node["price_usd_per_hour"] = self.price_usd_per_hour
        raw[pool] = node


@dataclass
class Candidate:
    prefill: PoolChoice
    decode: PoolChoice
    method: Any  # the raw method entry (name or mapping)
    method_name: str
    raw: dict  # base scenario with this candidate's pools and method
    cost_usd_per_hour: float = math.nan

    @property
    def label(self) -> str:
        return f"prefill {self.prefill.label} | decode {self.decode.label} | {self.method_name}"


def _as_list(v, default: list[int]) -> list[int]:
    if v is None:
        return list(default)
    return [v] if isinstance(v, int) else list(v)


def _method_name(m: Any) -> str:
    if isinstance(m, str):
        return m
    return m.get("label") or m.get("name", "?")


def _fits(base_raw: dict, base_path: Path, pool: str, choice: PoolChoice) -> str | None:
    """None when the weights fit the pool in this layout, else why not (one line)."""
    from simulator.resolve import resolve

    raw = copy.deepcopy(base_raw)
    choice.apply(raw, pool)
    raw["methods"] = [REFERENCE]
    try:
        s = resolve_scenario(raw, base_path, "candidate")
        pre, dec = resolve(s, "candidate").costs(reference_method())
        (pre if pool == "prefill" else dec).check_fits(pool)
    except ScenarioError as e:
        return str(e).removeprefix("candidate: ")
    except ModelDoesNotFit as e:
        return str(e)
    return None


def pool_choices(
    base_raw: dict,
    base_path: Path,
    pool: str,
    options: list[PoolOption] | None,
    default_replicas: list[int],
    max_instances: int,
    notes: list[str],
) -> list[PoolChoice]:
    """Every (instance, layout, replicas) to try for one pool, weights-fit checked once per layout."""
    auto = options is None
    if auto:
        options = [PoolOption(instance=k) for k in sorted(catalog.load("instances"))]
    unpriced, too_big = [], []
    out: list[PoolChoice] = []
    for opt in options:
        try:
            inst = catalog.entry("instances", opt.instance)
        except KeyError as e:
            raise PlanningError(f"candidates: {pool}: {e.args[0]}") from None
        if (opt.price_usd_per_hour if opt.price_usd_per_hour is not None else inst.get("price_usd_per_hour")) is None:
            unpriced.append(opt.instance)
            continue
        gpus = inst["gpus"]
        layouts = []
        for tp in _as_list(opt.tensor_parallel, [gpus]):
            if opt.pipeline_parallel is not None:
                pps = _as_list(opt.pipeline_parallel, [])
                for pp in pps:
                    why = _fits(base_raw, base_path, pool, PoolChoice(opt.instance, tp, pp, 1, opt.price_usd_per_hour))
                    if why is None:
                        layouts.append((tp, pp))
                    else:
                        notes.append(f"{pool} {opt.instance} TP{tp} PP{pp}: {why}")
                continue
            for pp in range(1, max(1, max_instances * gpus // tp) + 1):  # the fewest stages that fit
                if (
                    _fits(base_raw, base_path, pool, PoolChoice(opt.instance, tp, pp, 1, opt.price_usd_per_hour))
                    is None
                ):
                    layouts.append((tp, pp))
                    break
            else:
                too_big.append(f"{opt.instance} TP{tp}")
        for tp, pp in layouts:
            for r in _as_list(opt.replicas, default_replicas):
                out.append(PoolChoice(opt.instance, tp, pp, r, opt.price_usd_per_hour))
    if unpriced:
        notes.append(f"{pool}: left out {', '.join(unpriced)} (no price per hour in the catalog or candidates)")
    if too_big:
        notes.append(
            f"{pool}: left out {', '.join(too_big)} (the model's weights need more than "
            f"{max_instances} instance(s) per replica)"
        )
    return out


def build_candidates(base_raw: dict, base_path: Path, spec: CandidatesSpec, notes: list[str]) -> list[Candidate]:
    pre = pool_choices(
        base_raw, base_path, "prefill", spec.prefill, spec.prefill_replicas, spec.max_instances_per_replica, notes
    )
    dec = pool_choices(
        base_raw, base_path, "decode", spec.decode, spec.decode_replicas, spec.max_instances_per_replica, notes
    )
    methods = spec.methods if spec.methods is not None else base_raw.get("methods") or []
    if not pre or not dec or not methods:
        missing = "prefill" if not pre else "decode" if not dec else "method"
        raise PlanningError(f"no {missing} candidates left" + (f" ({notes[-1]})" if notes else ""))
    net = base_raw.get("network")
    if isinstance(net, dict) and net.get("links"):
        notes.append("network.links dropped: an explicit topology names replicas, which candidates change")
    pairs = [(p, d) for p in pre for d in dec]
    if base_raw.get("placement") == "shared_gpu":
        # prefill replica i and decode replica i share GPUs: one layout serves both pools
        pairs = [(p, p) for p in pre]
        notes.append(
            "placement shared_gpu: each candidate runs both pools on the prefill option's instances "
            "(decode options ignored)"
        )
    out = []
    for p, d in pairs:
        for m in methods:
            raw = copy.deepcopy(base_raw)
            p.apply(raw, "prefill")
            d.apply(raw, "decode")
            raw["methods"] = [copy.deepcopy(m)]
            if isinstance(raw.get("network"), dict):
                raw["network"].pop("links", None)
            out.append(Candidate(p, d, m, _method_name(m), raw))
    return out


# ---- goodput search -------------------------------------------------------------------------------------
@dataclass
class RateSearch:
    """Highest rate that passes: probe `start`, double (or halve) until the threshold is bracketed,
    then bisect geometrically until hi/lo <= 1 + rel_tol or `steps` probes are spent."""

    start: float
    steps: int = 8
    rel_tol: float = 0.05
    lo: float = 0.0  # highest rate seen passing
    hi: float = math.inf  # lowest rate seen failing
    probes: list[tuple[float, bool]] = field(default_factory=list)

    def next_rate(self) -> float | None:
        if len(self.probes) >= self.steps:
            return None
        if not self.probes:
            return self.start
        if self.hi == math.inf:
            return self.lo * 2
        if self.lo == 0.0:
            return self.hi / 2
        if self.hi / self.lo <= 1 + self.rel_tol:
            return None
        return math.sqrt(self.lo * self.hi)

    def record(self, rate: float, ok: bool) -> None:
        self.probes.append((rate, ok))
        if ok:
            self.lo = max(self.lo, rate)
        else:
            self.hi = min(self.hi, rate)


# ---- running the plan ---------------------------------------------------------------------------------------
@dataclass
class PlanResult:
    rate_rps: float
    slo: dict[str, float]
    table: pd.DataFrame  # one row per candidate, cheapest first
    answer: dict | None
    notes: list[str]
    stats: Any
    simulations: int
    scenario_name: str
    base_pools: dict[str, tuple] = field(default_factory=dict)  # pool -> (instance, TP, PP, replicas) as given


def _probe_task(c: Candidate, rate: float, base_path: Path) -> Task:
    raw = build_raw(c.raw, {"workload.arrival.rate_rps": rate})
    return Task.of(resolve_scenario(raw, base_path, "candidate"))


def _evaluate(result: dict, name: str, slo: dict[str, float]) -> tuple[dict, list, str]:
    r = result["methods"].get(name, {"error": "no result"})
    if "error" in r:
        return {}, [], r["error"]
    row = {**metric_columns(r["summary"]), "requests": result["requests"]}
    return row, slo_misses(row, slo), ""


def run_plan(
    base_path: Path,
    rate_rps: float,
    slo: dict[str, float],
    spec: CandidatesSpec,
    executor: Executor,
    *,
    requests: int | None = None,
    steps: int = 8,
    overrides: dict[str, Any] | None = None,
) -> PlanResult:
    if not (rate_rps > 0 and math.isfinite(rate_rps)):
        raise PlanningError(f"--rate must be > 0 requests/s and finite, got {rate_rps}")
    if not slo:
        raise PlanningError("--slo: give at least one target, e.g. ttft_p99_s=60,tpot_p99_s=0.5")
    if steps < 1:
        raise PlanningError(f"--steps must be >= 1, got {steps}")
    base_raw = read_base(base_path)
    values = dict(overrides or {})
    if requests is not None:
        values["workload.requests"] = requests
    values["workload.arrival.rate_rps"] = rate_rps
    try:
        base = resolve_scenario(build_raw(base_raw, values), base_path, str(base_path))
    except ScenarioError as e:
        raise PlanningError(str(e)) from None
    kind = "a trace" if base.workload.arrival is None else base.workload.arrival.kind
    if kind not in ("poisson", "bursty"):
        raise PlanningError(
            f"{base_path}: workload.arrival: plan varies the rate, so it needs poisson or bursty arrivals, not {kind}"
        )
    base_raw = build_raw(base_raw, values)
    notes: list[str] = []
    candidates = build_candidates(base_raw, base_path, spec, notes)

    tasks0: dict[int, Task] = {}
    for i, c in enumerate(candidates):
        try:
            t = _probe_task(c, rate_rps, base_path)
        except ScenarioError as e:
            notes.append(f"{c.label}: {str(e).removeprefix('candidate: ')}")
            continue
        tasks0[i] = t
        cost = cost_usd_per_hour(resolve_scenario(c.raw, base_path, "candidate"))
        c.cost_usd_per_hour = math.nan if cost is None else cost

    if not tasks0:
        raise PlanningError(f"no candidate is a valid scenario; {notes[-1] if notes else ''}".rstrip("; "))
    searches = {i: RateSearch(rate_rps, steps) for i in tasks0}
    at_rate: dict[int, tuple[dict, list, str]] = {}  # candidate -> (metrics, SLO misses, error) at R
    sims = 0
    pending = {i: (rate_rps, tasks0[i]) for i in tasks0}
    probe = 0
    while pending:
        probe += 1
        executor.label = f"plan probe {probe}/{steps}"
        results = executor.run([t for _, t in pending.values()])
        sims += len({t.key for _, t in pending.values()})
        nxt = {}
        for i, (rate, task) in pending.items():
            row, misses, err = _evaluate(results[task.key], candidates[i].method_name, slo)
            if rate == rate_rps and i not in at_rate:
                at_rate[i] = (row, misses, err)
            if err:  # does not run at any rate (fit errors do not depend on it)
                searches[i].probes.append((rate, False))
                continue
            searches[i].record(rate, not misses)
            r = searches[i].next_rate()
            if r is not None:
                nxt[i] = (r, _probe_task(candidates[i], r, base_path))
        pending = nxt

    rows = []
    for i in tasks0:
        c, (row, misses, err) = candidates[i], at_rate[i]
        s = searches[i]
        rows.append(
            {
                "candidate": i,
                "cost_usd_per_hour": c.cost_usd_per_hour,
                "method": c.method_name,
                "prefill": c.prefill.label,
                "decode": c.decode.label,
                **{
                    k: v
                    for k, v in config_columns(resolve_scenario(c.raw, base_path, "candidate")).items()
                    if k not in ("cost_usd_per_hour", "rate_rps")
                },
                "rate_rps": rate_rps,
                "meets_slo": not err and not misses,
                "misses": "; ".join(
                    f"{k} {v:.3g} > {lim:g}" if k != "completed" else f"{v}/{lim} requests finished"
                    for k, v, lim in misses
                ),
                "goodput_rps": s.lo,
                "goodput_bound_rps": s.hi,
                "probes": len(s.probes),
                "slo_fraction": max((row.get(k, math.nan) / lim for k, lim in slo.items()), default=math.nan)
                if row
                else math.nan,
                **{k: row.get(k, math.nan) for k in slo},
                **{
                    k: row.get(k, math.nan)
                    for k in ("ttft_p99_s", "tpot_p99_s", "jct_p90_s", "jct_mean_s", "throughput_rps")
                    if k not in slo
                },
                "error": err,
            }
        )
    table = pd.DataFrame(rows)
    if len(table):
        # cheapest first; at equal cost the higher goodput, then the most headroom at R
        table = table.sort_values(
            ["cost_usd_per_hour", "goodput_rps", "slo_fraction", "candidate"],
            ascending=[True, False, True, True],
            kind="stable",
        ).reset_index(drop=True)
    ok = table.loc[table["meets_slo"]] if len(table) else table
    answer = ok.iloc[0].to_dict() if len(ok) else None
    base_pools = {
        name: (pool.instance, pool.tensor_parallel, pool.pipeline_parallel, pool.replicas)
        for name, pool in (("prefill", base.prefill), ("decode", base.decode))
    }
    return PlanResult(rate_rps, slo, table, answer, notes, executor.stats, sims, base.name, base_pools)


def base_rows(p: PlanResult) -> pd.DataFrame:
    """The candidates with the scenario's own pools (one per method), if the search space has them."""
    t = p.table
    if not len(t) or not p.base_pools:
        return t.iloc[0:0]
    keep = pd.Series(True, index=t.index)
    for pool, (inst, tp, pp, rep) in p.base_pools.items():
        keep &= (
            (t[f"{pool}_instance"] == (inst or ""))
            & (t[f"{pool}_tensor_parallel"] == tp)
            & (t[f"{pool}_pipeline_parallel"] == pp)
            & (t[f"{pool}_replicas"] == rep)
        )
    return t.loc[keep]


# ---- the printed answer ------------------------------------------------------------------------------------
def plan_json(p: PlanResult) -> dict:
    """The plan as data (`plan --json`): the answer (None when nothing meets the SLOs), every candidate
    cheapest first with why it lost, and how the search ran."""
    rows = p.table.to_dict(orient="records")
    for r in rows:
        r["why_not"] = (
            ""
            if p.answer is not None and r["candidate"] == p.answer["candidate"]
            else why_lost(r, p.answer, p.rate_rps)
        )
    return {
        "scenario": p.scenario_name,
        "rate_rps": p.rate_rps,
        "slo": p.slo,
        "answer": p.answer,
        "candidates": rows,
        "notes": p.notes,
        "simulations": p.simulations,
    }


def why_lost(row: dict, answer: dict | None, rate: float) -> str:
    if row["error"]:
        return f"does not run: {row['error']}"
    if not row["meets_slo"]:
        return f"misses at {rate:g} req/s: {row['misses']}"
    if answer is None:
        return ""
    extra = row["cost_usd_per_hour"] - answer["cost_usd_per_hour"]
    if extra > 1e-9:
        return f"meets the SLOs, costs ${extra:.2f}/h more"
    if row["goodput_rps"] < answer["goodput_rps"]:
        return "meets the SLOs at the same cost, lower goodput"
    return (
        f"meets the SLOs at the same cost and goodput, less headroom at {rate:g} req/s (worst metric at "
        f"{100 * row['slo_fraction']:.0f}% of its limit, answer {100 * answer['slo_fraction']:.0f}%)"
    )


def _goodput(row: dict) -> str:
    if row["error"]:
        return "-"
    if row["goodput_rps"] == 0:
        return "none"  # no probed rate met the SLOs (the lowest tried is in plan.csv)
    return f"{row['goodput_rps']:.3g}"


def format_plan(p: PlanResult, show: int = 12) -> str:
    from reports.terminal import render, table

    slo = ", ".join(f"{k} <= {v:g} s" for k, v in p.slo.items())
    t = p.table
    lines = [
        f"plan for {p.scenario_name} at {p.rate_rps:g} req/s; SLOs: {slo}",
        f"{len(t)} candidates, {p.simulations} simulations ({p.stats.cached} of them from the cache) in "
        f"{p.stats.wall_s:.1f} s" + (f" on {p.stats.workers} {p.stats.backend} worker(s)" if p.stats.simulated else ""),
    ]
    for n in p.notes:
        lines.append(f"note: {n}")
    a = p.answer
    lines.append("")
    if a is None:
        best = t.loc[t["error"] == ""].sort_values("goodput_rps", ascending=False).head(1) if len(t) else t
        lines.append(f"no candidate meets the SLOs at {p.rate_rps:g} req/s")
        if len(best) and best.iloc[0]["goodput_rps"] > 0:
            b = best.iloc[0]
            lines.append(
                f"highest goodput: {b['goodput_rps']:.3g} req/s with prefill {b['prefill']}, decode "
                f"{b['decode']}, {b['method']} (${b['cost_usd_per_hour']:.2f}/h)"
            )
    else:
        metrics = ", ".join(f"{k} {a[k]:.3g} s" for k in p.slo)
        lines += [
            f"answer: ${a['cost_usd_per_hour']:.2f}/h  prefill {a['prefill']}  decode {a['decode']}  "
            f"method {a['method']}",
            f"        at {p.rate_rps:g} req/s: {metrics}; goodput {_goodput(a)} req/s within the SLOs",
        ]
    own = base_rows(p)
    if len(own):
        r0 = own.iloc[0]
        rows = own.to_dict(orient="records")
        ok = [f"{r['method']} (goodput {_goodput(r)} req/s)" for r in rows if r["meets_slo"]]
        bad = [r["method"] for r in rows if not r["meets_slo"]]
        lines.append(
            f"the scenario's own pools (prefill {r0['prefill']}, decode {r0['decode']}) cost "
            f"${r0['cost_usd_per_hour']:.2f}/h; "
            + (f"meet the SLOs with {', '.join(ok)}" if ok else "miss the SLOs with every method")
            + (f"; miss with {', '.join(bad)}" if ok and bad else "")
        )
    if len(t) > (a is not None):
        lines += ["", "runners-up (by cost per hour; goodput = highest rate within the SLOs, req/s):"]
        idx = 0 if a is None else int(t.index[t["candidate"] == a["candidate"]][0])
        # the cheaper candidates nearest the answer's cost explain why nothing cheaper works; the next
        # ones that meet the SLOs show what else would do, at what extra cost.
        cheaper = list(range(max(0, idx - show // 2), idx)) if a is not None else list(range(min(show, len(t))))
        dearer = (
            [j for j in range(idx + 1, len(t)) if t.iloc[j]["meets_slo"]][: show - len(cheaper)]
            if a is not None
            else []
        )
        rows = []
        for j in cheaper + dearer:
            r = t.iloc[j].to_dict()
            rows.append(
                [
                    f"{r['cost_usd_per_hour']:.2f}",
                    r["prefill"],
                    r["decode"],
                    r["method"],
                    _goodput(r),
                    why_lost(r, a, p.rate_rps),
                ]
            )
        lines.append(
            render(
                table(
                    ["$/h", "prefill", "decode", "method", "goodput", "why not"], rows, left=0, right=("$/h", "goodput")
                )
            )
        )
        n_cheaper = idx if a is not None else 0
        if a is not None and n_cheaper:
            counts = Counter(k.split(" ")[0] for m in t.iloc[:idx]["misses"] if m for k in m.split("; "))
            errs = int((t.iloc[:idx]["error"] != "").sum())
            why = ", ".join(f"{k} {n}x" for k, n in counts.most_common())
            lines.append(
                f"  all {n_cheaper} cheaper candidates miss an SLO at {p.rate_rps:g} req/s"
                + (f" ({why})" if why else "")
                + (f"; {errs} do not run" if errs else "")
            )
        rest = len(t) - len(cheaper) - len(dearer) - (a is not None)
        if rest > 0:
            lines.append(f"  ... {rest} more candidates not shown (all in plan.csv with --out)")
    return "\n".join(lines)
