"""Run a scenario: build the cost models and entities per method, simulate, and collect records.

`run_scenario(scenario)` is the one entry point the CLI, sweeps and tests use. Each method gets a
fresh SimPy environment over the same requests. Records are plain lists during the run and become
pandas DataFrames at the end; nothing is printed or written here.
"""
from __future__ import annotations

import math
import os
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np
import pandas as pd
import simpy

import catalog
from costmodel import collectives
from costmodel.calibration import CalibrationProfile, compare_to_measured
from costmodel.methods import KVMethod
from costmodel.phases import ModelDoesNotFit
from costmodel.specs import GIB

from . import colocated
from .config import Scenario, ScenarioError
from .decode import DecodeReplica
from .faults import STRANDED, FaultInjector
from .link import Link
from .overload import is_stable, utilisation
from .prefill import PrefillReplica
from .prefix_cache import PrefixCaching
from .resolve import PROFILES_DIR, REPO_ROOT, Resolved, resolve
from .router import Router
from .workload import Requests, make_requests

BREAKDOWN_PARTS = ("prefill_queue", "prefill", "quantize", "transfer_queue", "transfer", "decode_queue",
                   "decode", "dequantize", "approximation", "preemption")


# ---- one method's run ---------------------------------------------------------------------------
class MethodRun:
    """Per-request records of one method (lists indexed by request id) and the entities."""

    def __init__(self, res: Resolved, method: KVMethod, reqs: Requests, source: str):
        self.method = method
        self.env = env = simpy.Environment()
        n = len(reqs)
        self.n = n
        self.prompt = reqs.prompt_tokens.tolist()
        self.output = reqs.output_tokens.tolist()
        self.arrival = reqs.arrival_s.tolist()
        pre_cost, dec_cost = res.costs(method)
        for pool, rc in (("prefill", pre_cost), ("decode", dec_cost)):
            try:
                rc.check_fits(pool)
            except ModelDoesNotFit as e:
                raise ScenarioError(f"{source}: {pool}: {e}") from None
        if method.encode == "pq" and pre_cost.host_vcpus <= 0:
            raise ScenarioError(f"{source}: prefill.instance: {method.output_name} clusters keys on the prefill hosts' CPUs; "
                                f"name an instance so their vCPUs are known")
        refusal = method.check_decode_gpu(res.decode.gpu)
        if refusal:
            raise ScenarioError(f"{source}: methods.{method.output_name}: {refusal}")
        self.pre_cost, self.dec_cost = pre_cost, dec_cost
        self.wire_bytes = [pre_cost.wire_bytes(p) for p in self.prompt]
        # Decode iterations per request and its context in the first one (simulator/decode.py).  ttft_at decode:
        # the decode instance yields every output token, the first from recomputing the last prompt position
        # (context = the prompt); prefill: the prefill's token is the first, decode runs the other output - 1.
        sc = res.scenario
        # placement colocated: the last prefill chunk's token is the first (simulator/colocated.py)
        from_decode = sc.ttft_at == "decode" and sc.placement != "colocated"
        self.chunk_tokens = sc.prefill.chunk_tokens
        self.ttft_at_decode = from_decode
        self.decode_iterations = [o if from_decode else max(0, o - 1) for o in self.output]
        self.join_context = [p if from_decode else p + 1 for p in self.prompt]
        self.kv_bytes = [dec_cost.kv_memory_bytes(p + o) for p, o in zip(self.prompt, self.output)]
        # decode admission (simulator/admission.py): on_demand takes the blocks of the first decode iteration's
        # context, reserve the final KV
        self.on_demand = sc.decode.admission == "on_demand"
        self.preempt_by_swap = sc.decode.preemption == "swap"
        self.admit_bytes = ([dec_cost.kv_memory_bytes(c) for c in self.join_context] if self.on_demand
                            else self.kv_bytes)
        self.preemptions = [0] * n
        self.preempt_s = [0.0] * n
        self.host_kv_bytes = [dec_cost.host_kv_bytes(p + o) for p, o in zip(self.prompt, self.output)]
        decode_host = res.decode.host_memory_bytes
        if max(self.host_kv_bytes) > decode_host:
            raise ScenarioError(f"{source}: decode.host_memory_gib: one request's offloaded KV "
                                f"({max(self.host_kv_bytes) / GIB:.2f} GiB) exceeds the decode host memory "
                                f"({decode_host / GIB:.2f} GiB)")
        caching = res.scenario.prefill.prefix_caching or res.scenario.decode.prefix_caching
        self.prefix = PrefixCaching(self, reqs, pre_cost, dec_cost, res.scenario, source) if caching else None
        too_big = max(self.kv_bytes)
        if too_big > dec_cost.kv_capacity_bytes - (self.prefix.decode_region_bytes if self.prefix else 0.0):
            i = self.kv_bytes.index(too_big)
            raise ScenarioError(
                f"{source}: decode: request {i} needs {too_big / GIB:.2f} GiB of KV ({method.output_name}), more than a "
                f"decode replica's KV capacity of {dec_cost.kv_capacity_bytes / GIB:.2f} GiB")
        nan = math.nan
        for name in ("prefill_start", "prefill_end", "encode_end", "transfer_start", "transfer_end", "decode_join",
                     "first_token", "finish", "approx_prefill", "decode_s", "dequant_s", "approx_decode", "fetch_s",
                     "snap_decode", "snap_dequant", "snap_approx", "snap_fetch", "snap_preempt"):
            setattr(self, name, [nan] * n)
        self.prefill_replica = [-1] * n
        self.prefill_form = [""] * n            # the prefill attention form each request ran (fp16 / homomorphic)
        self.decode_replica = [-1] * n
        self.kv_held = [False] * n           # the KV counts in its prefill replica's host memory
        self.retries = [0] * n
        self.failure = [""] * n              # why a request failed (simulator/faults.py); "" if it did not
        self.completed = 0
        self.failed = 0
        self.memory_log: list = []
        self.link_logs: dict[str, list] = {}
        self.link_capacity_gbps: dict[str, float] = {}

        pre_pool, dec_pool, net = res.prefill, res.decode, res.network
        host = pre_pool.host_memory_bytes
        together = sc.placement == "colocated"     # every GPU of both pools, configured as the decode pool
        self.prefill_replicas = [] if together else [
            PrefillReplica(env, i, pre_cost, pre_pool.max_batch_requests, pre_pool.max_batch_tokens, host, self)
            for i in range(pre_pool.replicas)]
        self.decode_replicas = [DecodeReplica(env, i, dec_cost, dec_pool.max_batch_requests, self, self.memory_log,
                                              decode_host)
                                for i in range(dec_pool.replicas + (pre_pool.replicas if together else 0))]
        if together:
            self.router = colocated.build(self, self.decode_replicas, sc.prefill.chunk_tokens or pre_pool.max_batch_tokens)
            return
        if res.shared_gpu:
            for pre, dec in zip(self.prefill_replicas, self.decode_replicas):
                pre.partner, dec.partner = dec, pre
        link_objs = []
        for spec in net.links:
            log: list = []
            link_objs.append(Link(env, spec.name, spec.capacity_bytes_per_s, spec.latency_s, log))
            self.link_logs[spec.name] = log
            self.link_capacity_gbps[spec.name] = spec.capacity_gbps
        links = {pair: link_objs[i] for pair, i in net.routes.items()}
        self.router = Router(self, self.prefill_replicas, self.decode_replicas, links, net.flow_cap_bytes_per_s,
                             net.stream_layers, res.model.layers)
        if max(self.wire_bytes) > host:
            raise ScenarioError(f"{source}: prefill.host_memory_gib: one request's KV ({max(self.wire_bytes) / GIB:.2f}"
                                f" GiB) exceeds the host memory for parked KV ({host / GIB:.2f} GiB)")
        self.faults = FaultInjector(self, s.faults, s.fault_policy) if s.faults else None

    def fail(self, rid: int, reason: str) -> None:
        """The request ends without finishing (simulator/faults.py says why)."""
        self.failure[rid] = reason
        self.finish[rid] = math.nan
        self.failed += 1

    def finish_without_decode(self, rid: int) -> None:
        t = self.encode_end[rid]
        self.transfer_start[rid] = self.transfer_end[rid] = self.decode_join[rid] = self.finish[rid] = t
        self.decode_s[rid] = self.dequant_s[rid] = self.approx_decode[rid] = self.fetch_s[rid] = 0.0
        self.completed += 1

    def _arrive(self, rid: int) -> None:
        """Route every request arriving now, then set a timer for the next arrival."""
        arrival, n = self.arrival, self.n
        now = arrival[rid]
        first = rid
        while rid < n and arrival[rid] <= now:
            rid += 1
        self.router.on_arrivals(list(range(first, rid)))
        if rid < n:
            self.env.timeout(arrival[rid] - now).callbacks.append(lambda _e, r=rid: self._arrive(r))

    def simulate(self) -> None:
        if self.n:
            self.env.timeout(self.arrival[0]).callbacks.append(lambda _e: self._arrive(0))
        self.env.run()
        if self.completed + self.failed != self.n:
            if self.faults is None:
                raise RuntimeError(f"{self.method.output_name}: {self.n - self.completed} requests never finished")
            for rid in range(self.n):    # waiting for a replica or a link that never came back
                if self.failure[rid] == "" and not self.finish[rid] >= 0:
                    self.fail(rid, STRANDED)

    # ---- results ----------------------------------------------------------------------------------
    def requests_frame(self) -> pd.DataFrame:
        a = lambda xs: np.asarray(xs, dtype=np.float64)  # noqa: E731
        arrival, pstart, pend, eend = a(self.arrival), a(self.prefill_start), a(self.prefill_end), a(self.encode_end)
        first = a(self.first_token) if self.ttft_at_decode else pend
        tstart, tend, join, finish = a(self.transfer_start), a(self.transfer_end), a(self.decode_join), a(self.finish)
        t_start_eff = np.maximum(tstart, eend)
        t_end_eff = np.maximum(tend, eend)
        approx_pre = a(self.approx_prefill)
        dequant, approx_dec = a(self.dequant_s), a(self.approx_decode)
        output = np.asarray(self.output, dtype=np.int64)
        df = pd.DataFrame({
            "method": self.method.output_name,
            "request_id": np.arange(self.n),
            "prompt_tokens": np.asarray(self.prompt, dtype=np.int64),
            "output_tokens": output,
            "prefill_replica": self.prefill_replica,
            "decode_replica": self.decode_replica,
            "prefill_attention": self.prefill_form,
            "arrival_s": arrival, "prefill_start_s": pstart, "prefill_end_s": pend, "quantize_end_s": eend,
            "transfer_start_s": tstart, "transfer_end_s": tend, "decode_start_s": join,
            "first_token_s": first, "finish_s": finish,
        })
        df["jct_s"] = finish - arrival
        df["ttft_s"] = first - arrival
        with np.errstate(invalid="ignore", divide="ignore"):
            df["tpot_s"] = np.where(output > 1, (finish - first) / (output - 1), np.nan)
        df["prefill_queue_s"] = pstart - arrival
        df["prefill_s"] = (pend - pstart) - approx_pre
        df["quantize_s"] = eend - pend
        df["transfer_queue_s"] = t_start_eff - eend
        df["transfer_s"] = t_end_eff - t_start_eff
        df["decode_queue_s"] = join - t_end_eff
        preempt = a(self.preempt_s)
        df["decode_s"] = (finish - join) - dequant - approx_dec - preempt
        df["dequantize_s"] = dequant
        df["approximation_s"] = approx_pre + approx_dec
        df["preemption_s"] = preempt          # out of the batch after a preemption, and recompute / swap stalls
        df["preemptions"] = np.asarray(self.preemptions, dtype=np.int64)
        df["offload_fetch_s"] = a(self.fetch_s)      # part of decode_s: host -> GPU fetches (PQCache, HCAttention)
        df["kv_wire_bytes"] = np.asarray(self.wire_bytes)
        df["kv_memory_bytes"] = np.asarray(self.kv_bytes)
        df["kv_host_bytes"] = np.asarray(self.host_kv_bytes)
        df["retries"] = np.asarray(self.retries, dtype=np.int64)
        df["failure"] = self.failure
        if self.prefix is not None:
            df["prefill_cached_tokens"] = np.asarray(self.prefix.prefill_cached, dtype=np.int64)
            df["decode_cached_tokens"] = np.asarray(self.prefix.decode_cached, dtype=np.int64)
        if self.failed:     # a failed request has no latency: its parts would describe a lost attempt
            lost = df["failure"].to_numpy() != ""
            df.loc[lost, ["jct_s", "ttft_s", "tpot_s", *(f"{p}_s" for p in BREAKDOWN_PARTS), "offload_fetch_s"]] = np.nan
        return df

    def memory_frame(self) -> pd.DataFrame:
        cap = self.dec_cost.kv_capacity_bytes
        rows = [(self.method.output_name, r, t, used, cap) for (t, r, used) in self.memory_log]
        return pd.DataFrame(rows, columns=["method", "replica", "time_s", "used_bytes", "capacity_bytes"])

    def links_frame(self) -> pd.DataFrame:
        rows = [(self.method.output_name, name, t, flows, rate * 8 / 1e9, self.link_capacity_gbps[name])
                for name, log in self.link_logs.items() for (t, flows, rate) in log]
        return pd.DataFrame(rows, columns=["method", "link", "time_s", "active_flows", "throughput_gbps",
                                           "capacity_gbps"])


# ---- the whole scenario ------------------------------------------------------------------------
def _quantiles(x: np.ndarray) -> dict[str, float]:
    x = x[~np.isnan(x)]
    if len(x) == 0:
        return {"mean": math.nan, "p50": math.nan, "p90": math.nan, "p99": math.nan}
    p50, p90, p99 = np.percentile(x, [50, 90, 99])
    return {"mean": float(x.mean()), "p50": float(p50), "p90": float(p90), "p99": float(p99)}


def summarize(run: MethodRun, df: pd.DataFrame) -> dict:
    method, model = run.method, run.dec_cost.model
    span = float(df["finish_s"].max() - df["arrival_s"].min())
    peak_kv = max((used for (_, _, used) in run.memory_log), default=0.0)
    failures = Counter(r for r in run.failure if r)
    return {
        "completed": int(run.completed),
        "failed": int(run.failed),
        "failure_reasons": dict(sorted(failures.items())),
        "retried": int(sum(1 for r in run.retries if r)),
        "jct_s": _quantiles(df["jct_s"].to_numpy()),
        "ttft_s": _quantiles(df["ttft_s"].to_numpy()),
        "tpot_s": _quantiles(df["tpot_s"].to_numpy()),
        "breakdown_s": {part: float(df[f"{part}_s"].mean()) for part in BREAKDOWN_PARTS},
        "preemptions": int(df["preemptions"].sum()),
        "prefill_attention": {form: int(n) for form, n in sorted(df["prefill_attention"].value_counts().items())},
        "offload_fetch_s": float(df["offload_fetch_s"].mean()),
        "peak_decode_memory_bytes": float(run.dec_cost.memory_bytes_per_replica(peak_kv)),
        "peak_decode_kv_bytes": float(peak_kv),
        "decode_kv_capacity_bytes": float(run.dec_cost.kv_capacity_bytes),
        "decode_memory": run.dec_cost.memory.as_dict(),
        "kv_bytes_per_token": {"wire": float(method.wire_bytes_per_token(model)),
                               "memory": float(method.memory_bytes_per_token(model)),
                               "host": float(method.host_bytes_per_token(model))},
        "throughput_rps": float(run.completed / span) if span > 0 else math.nan,
        **_load(run, df),
        **({"prefix_cache": run.prefix.summary()} if run.prefix is not None else {}),
    }


def _load(run: MethodRun, df: pd.DataFrame) -> dict:
    """Each pool's utilisation and whether the run is stable (simulator/overload.py)."""
    p = df["prefill_replica"].to_numpy()
    d = df["decode_replica"].to_numpy()
    moved = d >= 0
    link_bytes: dict[str, float] = {}
    capacity: dict[str, float] = {}
    wire = df["kv_wire_bytes"].to_numpy()
    for (pi, di), link in run.router.links.items():
        capacity[link.name] = link.base_capacity
        link_bytes[link.name] = link_bytes.get(link.name, 0.0) + float(wire[moved & (p == pi) & (d == di)].sum())
    held_s = df["finish_s"].to_numpy() - df["transfer_start_s"].to_numpy()
    moved &= np.isfinite(held_s)         # completed (a failed request's hold is not known)
    held_s = held_s[moved]
    dec = run.decode_replicas[0]
    util = utilisation(
        arrival_s=df["arrival_s"].to_numpy(),
        # colocated: the prefill chunks' share of every replica's time
        prefill_busy_s=sum(r.busy_s for r in run.prefill_replicas) + sum(
            r.colo.busy_s for r in run.decode_replicas if r.colo is not None),
        prefill_replicas=len(run.prefill_replicas) or len(run.decode_replicas), link_bytes=link_bytes,
        link_capacity_bytes_per_s=capacity,
        held_s=held_s, held_kv_bytes=df["kv_memory_bytes"].to_numpy()[moved],
        held_host_bytes=df["kv_host_bytes"].to_numpy()[moved], decode_replicas=len(run.decode_replicas),
        decode_kv_capacity_bytes=dec.capacity_bytes, decode_host_capacity_bytes=dec.host_capacity_bytes,
        decode_max_batch=dec.max_batch_requests)
    return {"utilisation": util, "stable": is_stable(util)}


# Peak memory of a run grows with its requests: per request while one method runs, plus its rows in the
# result tables per method (measured: benchmarks/sim_speed.py and scale_1m.py).
RUN_BYTES_PER_REQUEST = 2200
RESULT_BYTES_PER_REQUEST_METHOD = 400


def machine_memory_bytes() -> float:
    """Physical memory, or the container's limit when it is lower."""
    try:
        total = float(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (AttributeError, OSError, ValueError):
        return math.inf
    try:
        limit = Path("/sys/fs/cgroup/memory.max").read_text().strip()
        if limit.isdigit():
            total = min(total, float(limit))
    except OSError:
        pass
    return total


def check_memory(requests: int, methods: int, source: str) -> None:
    """Refuse, before anything is allocated, a run that cannot fit in this machine's memory."""
    need = requests * (RUN_BYTES_PER_REQUEST + RESULT_BYTES_PER_REQUEST_METHOD * max(methods, 1))
    have = machine_memory_bytes()
    if need > 0.8 * have:
        raise ScenarioError(f"{source}: workload.requests: {requests} requests x {methods} method(s) need about "
                            f"{need / GIB:.1f} GiB of memory; this machine has {have / GIB:.1f} GiB")


@dataclass
class ScenarioResult:
    scenario: Scenario
    resolved: Resolved
    summary: dict
    requests: pd.DataFrame
    memory: pd.DataFrame
    links: pd.DataFrame
    runs: dict[str, MethodRun] = field(default_factory=dict, repr=False)

    def profiles(self) -> dict:
        def one(p: CalibrationProfile) -> dict:
            path = p.path
            if path is not None and Path(path).resolve().is_relative_to(REPO_ROOT):
                path = str(Path(path).resolve().relative_to(REPO_ROOT))   # outputs stay the same across checkouts
            measured = catalog.load("gpus").get(p.gpu, {}).get("measured", [])
            return {"gpu": p.gpu, "source": p.source, "derived_from": p.derived_from, "path": path,
                    "vs_measured": compare_to_measured(p, measured)}
        out = {"prefill": one(self.resolved.prefill.profile), "decode": one(self.resolved.decode.profile)}
        # the TP all-reduce (and PP send/recv) per pool: which algorithm each message size takes, and its time
        res = self.resolved
        out["collectives"] = {
            "prefill": collectives.report(res.prefill.parallel, res.model.hidden_size,
                                          sorted({1024, res.prefill.max_batch_tokens}), res.model.active_experts),
            "decode": collectives.report(res.decode.parallel, res.model.hidden_size,
                                         sorted({b for b in (1, 8, 32, 128) if b <= res.decode.max_batch_requests}
                                                | {res.decode.max_batch_requests}), res.model.active_experts)}
        # Kernel costs a method's implementation profile or `kernels:` put in place of the pools' profiles
        priced = {}
        for m in self.scenario.methods:
            if m.implementation is None and not m.kernels:
                continue
            pre, dec = res.costs(m)
            priced[m.output_name] = {
                "implementation": m.implementation,
                **{role: {k: {"overhead_s": f[0], "s_per_unit": f[1]}
                          for k, f in c.profile.provenance.get("kernel_overrides", {}).items()}
                   for role, c in (("prefill", pre), ("decode", dec))}}
        if priced:
            out["method_kernels"] = priced
        # Accuracy is a property of the arithmetic, not the GPU: a derived profile uses its source's.
        prof = self.resolved.decode.profile
        for gpu in (prof.gpu, prof.derived_from):
            acc = PROFILES_DIR / str(gpu) / "accuracy.csv"
            if prof.source != "roofline" and acc.exists():
                out["accuracy"] = pd.read_csv(acc).to_dict(orient="records")
                out["accuracy_source"] = str(acc.relative_to(REPO_ROOT))
                break
        return out


def run_scenario(s: Scenario, *, source: str = "scenario", methods: list[str] | None = None,
                 progress: Callable[[str], None] | None = None, keep_runs: bool = False) -> ScenarioResult:
    """Simulate every method of the scenario over the same requests."""
    chosen = [m for m in s.methods if methods is None or m.output_name in methods]
    if methods is not None:
        unknown = sorted(set(methods) - {m.output_name for m in s.methods})
        if unknown or not chosen:
            raise ScenarioError(f"{source}: --methods: {', '.join(unknown) or 'no method'} not in the scenario's "
                                f"methods ({', '.join(m.output_name for m in s.methods)})")
    check_memory(s.workload.requests, len(chosen), source)
    res = resolve(s, source)
    try:
        reqs = make_requests(s)
    except ScenarioError as e:
        raise ScenarioError(f"{source}: {e}") from None
    summaries, frames, mems, lks, runs = {}, [], [], [], {}
    for cfg in chosen:
        run = MethodRun(res, cfg, reqs, source)
        run.simulate()
        df = run.requests_frame()
        summaries[run.method.output_name] = summarize(run, df)
        frames.append(df)
        mems.append(run.memory_frame())
        lks.append(run.links_frame())
        if keep_runs:
            runs[run.method.output_name] = run
        if progress is not None:
            progress(run.method.output_name)
    summary = {"scenario": s.name, "seed": s.workload.seed, "requests": len(reqs), "methods": summaries}
    return ScenarioResult(s, res, summary, pd.concat(frames, ignore_index=True), pd.concat(mems, ignore_index=True),
                          pd.concat(lks, ignore_index=True), runs)
