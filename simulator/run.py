"""Run a scenario: build the cost models and entities per method, simulate, and collect records.

`run_scenario(scenario)` is the one entry point the CLI, sweeps and tests use. Each method gets a
fresh SimPy environment over the same requests. Records are typed columns during the run (one
machine number per value, simulator/columns.py); the summary is computed from them, and the
per-request tables are built as pandas DataFrames a chunk of rows at a time for whoever writes them
(`sink`), so a run of a million requests never holds a whole table; what the report draws of a run
(`FigureColumns`: three latency columns and the memory and link logs' own arrays) is handed over beside
them, so the report need not read the written files back. Nothing is printed or written here.
"""

from __future__ import annotations

import gc
import math
import os
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import simpy

import catalog
from costmodel import collectives, expert_parallel
from costmodel.calibration import CalibrationProfile, compare_to_measured
from costmodel.methods import KVMethod
from costmodel.phases import ModelDoesNotFit, ReplicaCostModel
from costmodel.specs import GIB

from . import colocated, columns, data_parallel
from .admission import OnDemandBlocks
from .arrivals import Arrivals
from .config import Scenario, ScenarioError
from .connectors import P2P_BUFFER_BYTES, P2P_POOL_GIB, P2PPush
from .decode import DecodeReplica
from .faults import STRANDED, FaultInjector
from .link import EndpointHost, Link, RoundRobinLink
from .overload import is_stable, utilisation
from .prefill import PrefillReplica
from .prefix_cache import PrefixCaching
from .resolve import PROFILES_DIR, REPO_ROOT, Resolved, link_busy_host_factor, link_busy_prefill_host_factor, resolve
from .router import Router
from .scheduler import StepScheduler
from .timers import run as drive_queue
from .workload import Requests, make_requests

CHUNK_ROWS = 100_000  # rows of an output table built and written at a time
BREAKDOWN_PARTS = (
    "prefill_queue",
    "prefill",
    "quantize",
    "transfer_queue",
    "transfer",
    "decode_queue",
    "decode",
    "dequantize",
    "approximation",
    "preemption",
)


# ---- one method's run ---------------------------------------------------------------------------
class MethodRun:
    """One method's entities, wired together, and the `Records` they write (simulator/columns.py)."""

    def __init__(self, res: Resolved, method: KVMethod, reqs: Requests, source: str):
        s = res.scenario
        self.method = method
        self.env = env = simpy.Environment()
        self.n = len(reqs)
        pre_cost, dec_cost = res.costs(method)
        for pool, rc in (("prefill", pre_cost), ("decode", dec_cost)):
            try:
                rc.check_fits(pool)
            except ModelDoesNotFit as e:
                raise ScenarioError(f"{source}: {pool}: {e}") from None
        if method.encode == "pq" and pre_cost.host_vcpus <= 0:
            raise ScenarioError(
                f"{source}: prefill.host.vcpus: {method.output_name} clusters keys on the prefill hosts' CPUs; "
                f"give the host's CPU threads (prefill.host.vcpus) or name an instance"
            )
        refusal = method.check_decode_gpu(res.decode.gpu)
        if refusal:
            raise ScenarioError(f"{source}: methods.{method.output_name}: {refusal}")
        self.pre_cost, self.dec_cost = pre_cost, dec_cost
        prompt, context = reqs.prompt_tokens, reqs.prompt_tokens + reqs.output_tokens
        # Decode iterations per request and its context in the first one (simulator/decode.py).  ttft_at decode:
        # the decode instance yields every output token, the first from recomputing the last prompt position
        # (context = the prompt); prefill: the prefill's token is the first, decode runs the other output - 1.
        # placement colocated: the last prefill chunk's token is the first (simulator/colocated.py)
        from_decode = s.ttft_at == "decode" and s.placement != "colocated"
        output = np.asarray(reqs.output_tokens, dtype=np.int64)
        join_context = np.asarray(prompt, dtype=np.int64) + (0 if from_decode else 1)
        # decode admission (simulator/admission.py): on_demand takes the blocks of the first decode iteration's
        # context, reserve the final KV
        on_demand = s.decode.admission == "on_demand"
        # per request, one typed column per value (simulator/columns.py): a million requests in ~200 MB
        self.records = rec = columns.Records(
            prompt=reqs.prompt_tokens,
            output=reqs.output_tokens,
            arrival_s=reqs.arrival_s,
            wire_bytes=_per_value(pre_cost.wire_bytes, prompt),
            kv_bytes=_per_value(dec_cost.kv_memory_bytes, context),
            admit_bytes=_per_value(dec_cost.kv_memory_bytes, join_context) if on_demand else None,
            host_kv_bytes=_per_value(dec_cost.host_kv_bytes, context),
            decode_iterations=output if from_decode else np.maximum(0, output - 1),
            join_context=join_context,
            ttft_at_decode=from_decode,
        )
        decode_host = res.decode.host_memory_bytes / res.decode.parallel.data_parallel  # per engine (data_parallel.py)
        if columns.view(rec.host_kv_bytes).max() > decode_host:
            raise ScenarioError(
                f"{source}: decode.host_memory_gib: one request's offloaded KV "
                f"({columns.view(rec.host_kv_bytes).max() / GIB:.2f} GiB) exceeds the decode host memory "
                f"({decode_host / GIB:.2f} GiB)"
            )
        together = s.placement == "colocated"  # every engine serves both phases, configured as the decode pool
        engines = s.engines if together else res.decode.replicas
        caching = s.decode.prefix_caching or (s.prefill.prefix_caching and not together)
        self.prefix = (
            PrefixCaching(
                rec,
                method.output_name,
                reqs,
                pre_cost,
                dec_cost,
                s,
                source,
                prefill_replicas=0 if together else res.prefill.replicas,
                decode_replicas=engines,
            )
            if caching
            else None
        )
        region_bytes = self.prefix.decode_region_bytes if self.prefix else 0.0
        connector = s.network.kv_connector  # where the KV waits for its decode replica (simulator/connectors.py)
        buffer_bytes = 0.0
        if connector == "p2p_push":  # the decode GPU's receive buffer comes out of its KV pool
            net_cfg = s.network
            buffer_bytes = net_cfg.kv_buffer_gib * GIB if net_cfg.kv_buffer_gib is not None else P2P_BUFFER_BYTES
            region_bytes += buffer_bytes
        too_big = float(columns.view(rec.kv_bytes).max())
        if too_big > dec_cost.kv_capacity_bytes - region_bytes:
            i = int(np.argmax(columns.view(rec.kv_bytes)))
            raise ScenarioError(
                f"{source}: decode: request {i} needs {too_big / GIB:.2f} GiB of KV ({method.output_name}), more than a "
                f"decode replica's KV capacity of {dec_cost.kv_capacity_bytes / GIB:.2f} GiB"
            )
        self.link_capacity_gbps: dict[str, float] = {}

        pre_pool, dec_pool, net = res.prefill, res.decode, res.network
        host = pre_pool.host_memory_bytes
        held = None  # host_parked: each request holds its wire bytes in prefill host memory
        if connector == "nixl_pull":  # its prompt's blocks in the prefill GPU's KV pool
            held = columns.floats(_per_value(pre_cost.kv_memory_bytes, prompt))
            host = pre_cost.kv_capacity_bytes
        self.prefill_replicas = (
            []
            if together
            else [
                PrefillReplica(
                    env,
                    i,
                    pre_cost,
                    pre_pool.max_batch_requests,
                    pre_pool.max_batch_tokens,
                    host,
                    rec,
                    self.prefix,
                    s.prefill.chunk_tokens,
                    held,
                    kv_in_pool=connector == "nixl_pull",
                    wait_for_push=connector == "p2p_push",
                )
                for i in range(pre_pool.replicas)
            ]
        )
        swap = s.decode.preemption == "swap"
        dp = dec_pool.parallel.data_parallel  # engines per decode replica (simulator/data_parallel.py)

        def decode_replica(i: int, cost: ReplicaCostModel) -> DecodeReplica:
            return DecodeReplica(
                env,
                i,
                cost,
                dec_pool.max_batch_requests,
                rec,
                decode_host,
                region_bytes,
                blocks=OnDemandBlocks if on_demand else None,
            )

        self.dp_groups: list[data_parallel.LockstepGroup] = []
        if dp > 1:
            self.dp_groups, self.decode_replicas = data_parallel.build_engines(
                env, dec_cost, dec_pool.replicas, dp, decode_replica
            )
        else:
            self.decode_replicas = [decode_replica(i, dec_cost) for i in range(engines)]
        if s.decode.batch_slot_at == "join" and not together:  # realrun's rule: slots at the join, not at admission
            for rep in self.decode_replicas:
                rep.slots_at_join, rep.admit_slots = True, math.inf
        # vLLM's step scheduler (simulator/scheduler.py) where a replica prefills: colocated prompts, and the
        # recompute of requests preempted under on-demand admission
        scheds = []
        for rep in self.decode_replicas:
            cache = self.prefix.engine(rep.index) if self.prefix is not None else None
            rep.cache = cache
            if together or on_demand:
                sched = StepScheduler(
                    rep, rec, dec_pool.max_batch_tokens, dec_pool.max_batch_requests, s.decode.chunk_tokens, swap, cache
                )
                rep.sched = sched
                scheds.append(sched)
        self.faults = None
        self.router: Router | colocated.ColocatedRouter
        if together:
            self.router = router = colocated.ColocatedRouter(self.decode_replicas, scheds)
            for rep in self.decode_replicas:
                rep.listener = router
                rep.on_arrival = False  # the KV is written here in the memory format: nothing arrives to decode
            self.faults = FaultInjector(rec, env, self.router, s.faults, s.fault_policy) if s.faults else None
            return
        if res.shared_gpu:
            for pre, dec in zip(self.prefill_replicas, self.decode_replicas):
                pre.partner, dec.partner = dec, pre
                dec.after_prefill_fraction = s.decode.after_prefill_slowdown_fraction
                dec.after_prefill_decay = s.decode.after_prefill_decay_per_iteration
                dec.after_prefill_sat_s = s.decode.after_prefill_saturation_s
                dec.clock_fraction = s.decode.after_prefill_clock_fraction
                dec.clock_tau_s = s.decode.after_prefill_clock_time_constant_s
        link_objs = []
        for spec in net.links:
            log = columns.RowLog(3)  # (time_s, active_flows, throughput_bytes_per_s)
            if net.round_robin_chunk_bytes:
                link: Link = RoundRobinLink(
                    env, spec.name, spec.capacity_bytes_per_s, spec.latency_s, net.round_robin_chunk_bytes, log
                )
            else:
                link = Link(env, spec.name, spec.capacity_bytes_per_s, spec.latency_s, log)
            link_objs.append(link)
            rec.link_logs[spec.name] = log
            self.link_capacity_gbps[spec.name] = spec.capacity_gbps
        # an engine of a data-parallel decode replica reaches prefill over its replica's links
        links = {(p, d * dp + r): link_objs[i] for (p, d), i in net.routes.items() for r in range(dp)}
        args = (
            rec,
            self.prefix,
            self.prefill_replicas,
            self.decode_replicas,
            links,
            net.flow_cap_bytes_per_s,
            net.stream_layers,
            res.model.layers,
        )
        self.router = router = (
            data_parallel.DataParallelRouter(*args, groups=self.dp_groups) if dp > 1 else Router(*args)
        )
        factor, prefill_factor = link_busy_host_factor(s), link_busy_prefill_host_factor(s)
        if factor != 1.0:  # each process's host terms follow its link endpoint's state (simulator/link.py)
            self._link_busy_host(router, factor, prefill_factor, res.shared_gpu)
        if connector == "p2p_push":
            pool_gib = s.network.p2p_pool_gib if s.network.p2p_pool_gib is not None else P2P_POOL_GIB
            router.push = P2PPush(router, buffer_bytes, pool_gib * GIB, source)
        elif connector == "nixl_pull":
            if held is not None and columns.view(held).max() > host:
                raise ScenarioError(
                    f"{source}: network.kv_connector: nixl_pull holds a prompt's KV in the prefill KV pool; one "
                    f"request's prompt needs {columns.view(held).max() / GIB:.2f} GiB, more than the pool's "
                    f"{host / GIB:.2f} GiB"
                )
        elif columns.view(rec.wire_bytes).max() > host:
            raise ScenarioError(
                f"{source}: prefill.host_memory_gib: one request's KV "
                f"({columns.view(rec.wire_bytes).max() / GIB:.2f}"
                f" GiB) exceeds the host memory for parked KV ({host / GIB:.2f} GiB)"
            )
        self.faults = FaultInjector(rec, env, router, s.faults, s.fault_policy) if s.faults else None

    def _link_busy_host(self, router: Router, factor: float, prefill_factor: float, shared_gpu: bool) -> None:
        """network.link_busy_host_factor: each replica gets its idle and busy cost models (a prefill replica's floor
        takes link_busy_prefill_host_factor's), and the router the process of each replica (under shared_gpu, prefill
        replica i and decode replica i are one process)."""
        for rep in self.prefill_replicas:
            rep.host_levels = (rep.cost, rep.cost.with_host_factor(factor, prefill_floor_factor=prefill_factor))
        for drep in self.decode_replicas:
            drep.host_levels = (drep.cost, drep.cost.with_host_factor(factor))
        if shared_gpu:
            pairs = [EndpointHost([p, d]) for p, d in zip(self.prefill_replicas, self.decode_replicas)]
            router.prefill_hosts = router.decode_hosts = pairs
        else:
            router.prefill_hosts = [EndpointHost([p]) for p in self.prefill_replicas]
            router.decode_hosts = [EndpointHost([d]) for d in self.decode_replicas]
        for rep, host in zip(self.prefill_replicas, router.prefill_hosts):
            rep.endpoint = host

    def simulate(self, drive: Callable[[simpy.Environment], object] = drive_queue) -> None:
        """Run every request through (`drive`: SimPy's own `Environment.run` gives the same run, slower)."""
        Arrivals(self.env, self.records.arrival, self.router).start()
        # The cyclic garbage collector is off while the loop runs: its collections found nothing to free there (the
        # loop makes no reference cycles: none left after the default, colocated, prefix-caching, swap and fault
        # runs, tests/test_scale.py) and rescanned everything built before it (the scenario, the cost models and
        # their tables): 0.24 s of a 1.4 s colocated run of 30,000 requests. Reference counting frees as before.
        gc.disable()
        try:
            drive(self.env)
        finally:
            gc.enable()
        if self.records.completed + self.records.failed != self.n:
            if self.faults is None:
                raise RuntimeError(
                    f"{self.method.output_name}: {self.n - self.records.completed} requests never finished"
                )
            for rid in range(self.n):  # waiting for a replica or a link that never came back
                if self.records.failure[rid] == "" and not self.records.finish[rid] >= 0:
                    self.records.fail(rid, STRANDED)

    # ---- results ----------------------------------------------------------------------------------
    def latencies(self, lo: int = 0, hi: int | None = None) -> dict[str, np.ndarray]:
        """Rows lo:hi of every derived column: jct_s, ttft_s, tpot_s, the breakdown parts (`*_s`) and
        offload_fetch_s; NaN for a failed request (its numbers would describe a lost attempt)."""
        sl = slice(lo, self.n if hi is None else hi)
        a = lambda col: columns.view(col)[sl]  # noqa: E731
        arrival, pstart, pend, eend = (
            a(self.records.arrival),
            a(self.records.prefill_start),
            a(self.records.prefill_end),
            a(self.records.encode_end),
        )
        first = a(self.records.first_token) if self.records.ttft_at_decode else pend
        tstart, tend, join, finish = (
            a(self.records.transfer_start),
            a(self.records.transfer_end),
            a(self.records.decode_join),
            a(self.records.finish),
        )
        t_start_eff = np.maximum(tstart, eend)
        t_end_eff = np.maximum(tend, eend)
        approx_pre = a(self.records.approx_prefill)
        dequant, approx_dec = a(self.records.dequant_s), a(self.records.approx_decode)
        preempt = a(self.records.preempt_s)
        output = columns.view(self.records.output, np.int64)[sl]
        with np.errstate(invalid="ignore", divide="ignore"):
            tpot = np.where(output > 1, (finish - first) / (output - 1), np.nan)
        out = {
            "jct_s": finish - arrival,
            "ttft_s": first - arrival,
            "tpot_s": tpot,
            "prefill_queue_s": pstart - arrival,
            "prefill_s": (pend - pstart) - approx_pre,
            "quantize_s": eend - pend,
            "transfer_queue_s": t_start_eff - eend,
            "transfer_s": t_end_eff - t_start_eff,
            "decode_queue_s": join - t_end_eff,
            "decode_s": (finish - join) - dequant - approx_dec - preempt,
            "dequantize_s": dequant.copy(),
            "approximation_s": approx_pre + approx_dec,
            "preemption_s": preempt.copy(),  # out of the batch after a preemption, and recompute / swap stalls
            "offload_fetch_s": a(self.records.fetch_s).copy(),  # part of decode_s: host -> GPU fetches
        }
        if self.records.failed:
            lost = np.array([f != "" for f in self.records.failure[sl]], dtype=bool)
            for x in out.values():
                x[lost] = np.nan
        return out

    def requests_frame(self, lo: int = 0, hi: int | None = None) -> pd.DataFrame:
        """Rows lo:hi of requests.csv (all rows by default)."""
        hi = self.n if hi is None else hi
        sl = slice(lo, hi)
        a = lambda col: columns.view(col)[sl].copy()  # noqa: E731
        i = lambda col: columns.view(col, np.int64)[sl].copy()  # noqa: E731
        lat = self.latencies(lo, hi)
        fetch = lat.pop("offload_fetch_s")
        df = pd.DataFrame(
            {
                "method": self.method.output_name,
                "request_id": np.arange(lo, hi),
                "prompt_tokens": i(self.records.prompt),
                "output_tokens": i(self.records.output),
                "prefill_replica": i(self.records.prefill_replica),
                "decode_replica": i(self.records.decode_replica),
                "prefill_attention": self.records.prefill_form[sl],
                "arrival_s": a(self.records.arrival),
                "prefill_start_s": a(self.records.prefill_start),
                "prefill_end_s": a(self.records.prefill_end),
                "quantize_end_s": a(self.records.encode_end),
                "transfer_start_s": a(self.records.transfer_start),
                "transfer_end_s": a(self.records.transfer_end),
                "decode_start_s": a(self.records.decode_join),
                "first_token_s": a(self.records.first_token)
                if self.records.ttft_at_decode
                else a(self.records.prefill_end),
                "finish_s": a(self.records.finish),
                **lat,
                "preemptions": i(self.records.preemptions),
                "offload_fetch_s": fetch,  # part of decode_s: host -> GPU fetches (PQCache, HCAttention)
                "kv_wire_bytes": a(self.records.wire_bytes),
                "kv_memory_bytes": a(self.records.kv_bytes),
                "kv_host_bytes": a(self.records.host_kv_bytes),
                "retries": i(self.records.retries),
                "failure": self.records.failure[sl],
            }
        )
        if self.prefix is not None:
            df["prefill_cached_tokens"] = np.asarray(self.prefix.prefill_cached[sl], dtype=np.int64)
            df["decode_cached_tokens"] = np.asarray(self.prefix.decode_cached[sl], dtype=np.int64)
        return df

    def request_chunks(self, rows: int = CHUNK_ROWS):
        """requests.csv's rows, a frame of `rows` requests at a time."""
        for lo in range(0, self.n, rows):
            yield self.requests_frame(lo, min(self.n, lo + rows))

    def memory_frame(self, lo: int = 0, hi: int | None = None) -> pd.DataFrame:
        """Rows lo:hi of memory.csv (all by default)."""
        return memory_table(
            self.method.output_name, self.records.memory_log.table()[lo:hi], float(self.dec_cost.kv_capacity_bytes)
        )

    def links_frame(self) -> pd.DataFrame:
        return _concat(list(self.link_chunks(rows=None)))

    def memory_chunks(self, rows: int = CHUNK_ROWS):
        for lo in range(0, max(len(self.records.memory_log), 1), rows):
            yield self.memory_frame(lo, lo + rows)

    def link_chunks(self, rows: int | None = CHUNK_ROWS):
        """links.csv's rows, link by link, at most `rows` at a time (None: a link at a time)."""
        for name, log in self.records.link_logs.items():
            t = log.table()
            step = rows or max(len(t), 1)
            for lo in range(0, max(len(t), 1), step):
                yield link_table(self.method.output_name, name, t[lo : lo + step], self.link_capacity_gbps[name])

    def figure_columns(self) -> FigureColumns:
        """What the report draws of this run, without building its tables (`figure_tables`)."""
        parts: dict[str, list[np.ndarray]] = {c: [np.zeros(0)] for c in FIGURE_LATENCIES}
        for lo in range(0, self.n, CHUNK_ROWS):  # a chunk at a time: 3 of the 14 columns are kept
            lat = self.latencies(lo, lo + CHUNK_ROWS)
            for c in FIGURE_LATENCIES:
                parts[c].append(lat[c])
        return FigureColumns(
            self.method.output_name,
            {c: np.concatenate(p) for c, p in parts.items()},
            self.records.memory_log.table(),
            float(self.dec_cost.kv_capacity_bytes),
            {name: (log.table(), float(self.link_capacity_gbps[name])) for name, log in self.records.link_logs.items()},
        )


def memory_table(method: str | pd.Categorical, log: np.ndarray, capacity_bytes: float) -> pd.DataFrame:
    """memory.csv's rows from memory-log rows (time_s, replica, used_bytes); `method`: a name, or one per row."""
    return pd.DataFrame(
        {
            "method": method,
            "replica": log[:, 1].astype(np.int64),
            "time_s": log[:, 0].copy(),
            "used_bytes": log[:, 2].copy(),
            "capacity_bytes": np.full(len(log), capacity_bytes),
        }
    )


def link_table(
    method: str | pd.Categorical, link: str | pd.Categorical, log: np.ndarray, capacity_gbps: float
) -> pd.DataFrame:
    """links.csv's rows of one link from its log rows (time_s, active_flows, bytes_per_s); the names: one, or one
    per row."""
    return pd.DataFrame(
        {
            "method": method,
            "link": link,
            "time_s": log[:, 0].copy(),
            "active_flows": log[:, 1].astype(np.int64),
            "throughput_gbps": log[:, 2] * 8 / 1e9,
            "capacity_gbps": np.full(len(log), float(capacity_gbps)),
        }
    )


FIGURE_LATENCIES = ("jct_s", "ttft_s", "tpot_s")  # the requests.csv columns the report draws


@dataclass(frozen=True)
class FigureColumns:
    """One method's columns the report draws: its latencies and its memory and link logs (the logs' own arrays,
    shared, not copied: held after the run is gone, they cost what the run already held)."""

    method: str
    latencies: dict[str, np.ndarray]
    memory_log: np.ndarray  # (rows, 3): time_s, replica, used_bytes
    kv_capacity_bytes: float
    link_logs: dict[str, tuple[np.ndarray, float]]  # link -> (rows, 3) time_s, active_flows, bytes_per_s; Gbps


def figure_tables(runs: list[FigureColumns]) -> dict[str, pd.DataFrame]:
    """The report's tables for these methods' runs, by file name: what the report would read back from
    requests.csv (the latencies), memory.csv and links.csv, with the same rows and values, the methods' and links'
    names as categories (made from codes: a million requests' memory log is three million rows). A file with no
    rows at all (links.csv without links) is left out, as it is not written."""
    methods = sorted({r.method for r in runs})
    links = sorted({name for r in runs for name in r.link_logs})

    def label(value: str, rows: int, names: list[str]) -> pd.Categorical:
        return pd.Categorical.from_codes(np.full(rows, names.index(value), dtype=np.int16), categories=names)

    out = {
        "requests.csv": _concat(
            [pd.DataFrame({"method": label(r.method, len(r.latencies["jct_s"]), methods), **r.latencies}) for r in runs]
        ),
        "memory.csv": _concat(
            [memory_table(label(r.method, len(r.memory_log), methods), r.memory_log, r.kv_capacity_bytes) for r in runs]
        ),
    }
    if links:
        out["links.csv"] = _concat(
            [
                link_table(label(r.method, len(log), methods), label(name, len(log), links), log, cap)
                for r in runs
                for name, (log, cap) in r.link_logs.items()
            ]
        )
    return out


def _per_value(fn: Callable[[int], float], tokens: np.ndarray) -> np.ndarray:
    """fn over each request's token count, called once per distinct count (a pure cost-model function)."""
    values, where = np.unique(tokens, return_inverse=True)
    return np.array([fn(int(v)) for v in values], dtype=np.float64)[where]


# ---- the whole scenario ------------------------------------------------------------------------
def _quantiles(x: np.ndarray) -> dict[str, float]:
    x = x[~np.isnan(x)]
    if len(x) == 0:
        return {"mean": math.nan, "p50": math.nan, "p90": math.nan, "p99": math.nan}
    p50, p90, p99 = np.percentile(x, [50, 90, 99])
    return {"mean": float(x.mean()), "p50": float(p50), "p90": float(p90), "p99": float(p99)}


def _nanmean(x: np.ndarray) -> float:
    """Mean of the non-NaN values, summed as pandas' Series.mean does (the same float, bit for bit)."""
    ok = ~np.isnan(x)
    count = int(ok.sum())
    return float(np.where(ok, x, 0.0).sum() / count) if count else math.nan


def summarize(run: MethodRun) -> dict:
    """One method's summary.json entry, from the run's columns (no per-request table needed)."""
    method, model, rec = run.method, run.dec_cost.model, run.records
    lat = run.latencies()
    finish, arrival = columns.view(rec.finish), columns.view(rec.arrival)
    span = float(np.nanmax(finish) - arrival.min()) if rec.completed else math.nan
    used = rec.memory_log.column(2)
    peak_kv = float(used.max()) if len(used) else 0.0
    failures = Counter(r for r in rec.failure if r)
    return {
        "completed": int(rec.completed),
        "failed": int(rec.failed),
        "failure_reasons": dict(sorted(failures.items())),
        "retried": int(np.count_nonzero(columns.view(rec.retries, np.int64))),
        "jct_s": _quantiles(lat["jct_s"]),
        "ttft_s": _quantiles(lat["ttft_s"]),
        "tpot_s": _quantiles(lat["tpot_s"]),
        "breakdown_s": {part: _nanmean(lat[f"{part}_s"]) for part in BREAKDOWN_PARTS},
        "preemptions": int(columns.view(rec.preemptions, np.int64).sum()),
        "prefill_attention": {form: int(n) for form, n in sorted(Counter(rec.prefill_form).items())},
        "offload_fetch_s": _nanmean(lat["offload_fetch_s"]),
        "peak_decode_memory_bytes": float(run.dec_cost.memory_bytes_per_replica(peak_kv)),
        "peak_decode_kv_bytes": float(peak_kv),
        "decode_kv_capacity_bytes": float(run.dec_cost.kv_capacity_bytes),
        "decode_memory": run.dec_cost.memory.as_dict(),
        "kv_bytes_per_token": {
            "wire": float(method.wire_bytes_per_token(model)),
            "memory": float(method.memory_bytes_per_token(model)),
            "host": float(method.host_bytes_per_token(model)),
        },
        "throughput_rps": float(rec.completed / span) if span > 0 else math.nan,
        **_load(run),
        **({"prefix_cache": run.prefix.summary()} if run.prefix is not None else {}),
    }


def _load(run: MethodRun) -> dict:
    """Each pool's utilisation and whether the run is stable (simulator/overload.py)."""
    rec = run.records
    p = columns.view(rec.prefill_replica, np.int64)
    d = columns.view(rec.decode_replica, np.int64)
    moved = d >= 0
    link_bytes: dict[str, float] = {}
    capacity: dict[str, float] = {}
    wire = columns.view(rec.wire_bytes)
    for (pi, di), link in run.router.links.items():
        capacity[link.name] = link.base_capacity
        link_bytes[link.name] = link_bytes.get(link.name, 0.0) + float(wire[moved & (p == pi) & (d == di)].sum())
    held_s = columns.view(rec.finish) - columns.view(rec.transfer_start)
    moved &= np.isfinite(held_s)  # completed (a failed request's hold is not known)
    held_s = held_s[moved]
    dec = run.decode_replicas[0]
    util = utilisation(
        arrival_s=columns.view(rec.arrival),
        # colocated: the prefill chunks' share of every replica's time
        prefill_busy_s=sum(r.busy_s for r in run.prefill_replicas)
        + sum(c.busy_s for c in (run.router.prefills if isinstance(run.router, colocated.ColocatedRouter) else ())),
        prefill_replicas=len(run.prefill_replicas) or len(run.decode_replicas),
        link_bytes=link_bytes,
        link_capacity_bytes_per_s=capacity,
        held_s=held_s,
        held_kv_bytes=columns.view(rec.kv_bytes)[moved],
        held_host_bytes=columns.view(rec.host_kv_bytes)[moved],
        decode_replicas=len(run.decode_replicas),
        decode_kv_capacity_bytes=dec.capacity_bytes,
        decode_host_capacity_bytes=dec.host_capacity_bytes,
        decode_max_batch=dec.max_batch_requests,
    )
    return {"utilisation": util, "stable": is_stable(util)}


# Peak memory of a run grows with its requests: per request while one method runs (0.98-1.11 GB peak for 1M
# requests with every output: benchmarks/results/scale_1m.json), plus its rows in the result tables per
# method when they are held rather than written in chunks.
RUN_BYTES_PER_REQUEST = 1200
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
        raise ScenarioError(
            f"{source}: workload.requests: {requests} requests x {methods} method(s) need about "
            f"{need / GIB:.1f} GiB of memory; this machine has {have / GIB:.1f} GiB"
        )


@dataclass
class ScenarioResult:
    scenario: Scenario
    resolved: Resolved
    summary: dict
    requests: pd.DataFrame
    memory: pd.DataFrame
    links: pd.DataFrame
    runs: dict[str, MethodRun] = field(default_factory=dict, repr=False)
    # where the scenario lies outside the runs its engine calibration was fitted on (simulator/domain.py)
    engine_outside: list[str] = field(default_factory=list)

    def profiles(self) -> dict:
        def one(p: CalibrationProfile) -> dict:
            path = p.path
            if path is not None and Path(path).resolve().is_relative_to(REPO_ROOT):
                path = str(Path(path).resolve().relative_to(REPO_ROOT))  # outputs stay the same across checkouts
            measured = catalog.load("gpus").get(p.gpu, {}).get("measured", [])
            return {
                "gpu": p.gpu,
                "source": p.source,
                "derived_from": p.derived_from,
                "path": path,
                "vs_measured": compare_to_measured(p, measured),
            }

        out: dict[str, Any] = {
            "prefill": one(self.resolved.prefill.profile),
            "decode": one(self.resolved.decode.profile),
            # roofline pricing, a profile for another GPU, derived GPU fields (the CLI prints them on stderr)
            "warnings": list(self.resolved.warnings),
        }
        for pool in (self.resolved.prefill, self.resolved.decode):
            if pool.gpu_derived:  # the fields a GPU's short spec left out, as costmodel/specs.py derived them
                out[pool.name]["gpu_derived"] = {k: {"value": v, "rule": r} for k, v, r in pool.gpu_derived}
        # the TP all-reduce (and PP send/recv) per pool: which algorithm each message size takes, and its time
        res = self.resolved
        out["collectives"] = {
            "prefill": collectives.report(
                res.prefill.parallel,
                res.model.hidden_size,
                sorted({1024, res.prefill.max_batch_tokens}),
                res.model.active_experts,
            ),
            "decode": collectives.report(
                res.decode.parallel,
                res.model.hidden_size,
                sorted(
                    {b for b in (1, 8, 32, 128) if b <= res.decode.max_batch_requests} | {res.decode.max_batch_requests}
                ),
                res.model.active_experts,
            ),
        }
        if res.decode.parallel.data_parallel > 1:  # the dispatch all-to-all spans the data-parallel group
            out["collectives"]["decode"]["alltoall"] = expert_parallel.alltoall_rows(
                res.model,
                res.decode.parallel,
                sorted(
                    {b for b in (1, 8, 32, 128) if b <= res.decode.max_batch_requests} | {res.decode.max_batch_requests}
                ),
            )
        # Kernel costs a method's implementation profile or `kernels:` put in place of the pools' profiles
        priced = {}
        for m in self.scenario.methods:
            if m.implementation is None and not m.kernels:
                continue
            pre, dec = res.costs(m)
            priced[m.output_name] = {
                "implementation": m.implementation,
                **{
                    role: {
                        k: {"overhead_s": f[0], "s_per_unit": f[1]}
                        for k, f in c.profile.provenance.get("kernel_overrides", {}).items()
                    }
                    for role, c in (("prefill", pre), ("decode", dec))
                },
            }
        if priced:
            out["method_kernels"] = priced
        if self.scenario.calibration.engine is not None:  # the engine calibration file the scenario applied
            from .engine import engine_summary

            eng = engine_summary(self.scenario.calibration.engine, self.scenario.calibration.engine_scopes)
            eng["outside"] = self.engine_outside
            if Path(eng["path"]).resolve().is_relative_to(REPO_ROOT):
                eng["path"] = str(Path(eng["path"]).resolve().relative_to(REPO_ROOT))
            out["engine"] = eng
        # Accuracy is a property of the arithmetic, not the GPU: a derived profile uses its source's.
        prof = self.resolved.decode.profile
        for gpu in (prof.gpu, prof.derived_from):
            acc = PROFILES_DIR / str(gpu) / "accuracy.csv"
            if prof.source != "roofline" and acc.exists():
                out["accuracy"] = pd.read_csv(acc).to_dict(orient="records")
                out["accuracy_source"] = str(acc.relative_to(REPO_ROOT))
                break
        return out


def run_scenario(
    s: Scenario,
    *,
    source: str = "scenario",
    methods: list[str] | None = None,
    progress: Callable[[str], None] | None = None,
    keep_runs: bool = False,
    sink: Callable[..., None] | None = None,
) -> ScenarioResult:
    """Simulate every method of the scenario over the same requests.

    With `sink`, each method's tables go to `sink(name, requests, memory, links, figure_columns)` as soon as
    it has run (the tables as iterables of frames; `figure_columns()` gives what the report draws, for a sink that
    keeps it) and the result keeps only the summary (its tables are empty): a long run holds one method's tables
    at a time. Without, the result holds every method's tables."""
    chosen = [m for m in s.methods if methods is None or m.output_name in methods]
    if methods is not None:
        unknown = sorted(set(methods) - {m.output_name for m in s.methods})
        if unknown or not chosen:
            raise ScenarioError(
                f"{source}: --methods: {', '.join(unknown) or 'no method'} not in the scenario's "
                f"methods ({', '.join(m.output_name for m in s.methods)})"
            )
    n = s.workload.requests  # None: a trace's own count (load_scenario fills it in; a Scenario built in code may not)
    if n is not None:
        check_memory(n, len(chosen), source)
    res = resolve(s, source)
    try:
        reqs = make_requests(s)
    except ScenarioError as e:
        raise ScenarioError(f"{source}: {e}") from None
    if n is None:
        check_memory(len(reqs), len(chosen), source)
    summaries, frames, mems, lks, runs = {}, [], [], [], {}
    for cfg in chosen:
        run = MethodRun(res, cfg, reqs, source)
        run.simulate()
        summaries[run.method.output_name] = summarize(run)
        if sink is not None:
            sink(
                run.method.output_name,
                run.request_chunks(),
                run.memory_chunks(),
                run.link_chunks(),
                run.figure_columns,
            )
        else:
            frames.append(run.requests_frame())
            mems.append(run.memory_frame())
            lks.append(run.links_frame())
        if keep_runs:
            runs[run.method.output_name] = run
        del run
        if sink is not None and cfg is not chosen[-1]:
            # A finished run's entities refer to each other and the collector was off while it ran: free it now,
            # before the next method's run is built beside it (simulate --out of 250,000 requests, two methods: peak RSS
            # 612 -> 535 MB). A sweep point runs one method: nothing to collect for.
            gc.collect()
        if progress is not None:
            progress(cfg.output_name)
    summary = {"scenario": s.name, "seed": s.workload.seed, "requests": len(reqs), "methods": summaries}
    beyond = []
    if s.calibration.engine is not None:
        from .domain import scenario_outside

        lengths = {"prompt_tokens": reqs.prompt_tokens, "output_tokens": reqs.output_tokens}
        beyond = scenario_outside(s, lengths, [m.name for m in chosen])
    return ScenarioResult(s, res, summary, _concat(frames), _concat(mems), _concat(lks), runs, beyond)


def _concat(frames: list[pd.DataFrame]) -> pd.DataFrame:
    if not frames:
        return pd.DataFrame()
    return frames[0] if len(frames) == 1 else pd.concat(frames, ignore_index=True)
