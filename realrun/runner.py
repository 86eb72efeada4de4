"""Run a set of (method, rate) combinations on one model in one process and write their traces.

Before each method's measured runs a warm-up compiles every Triton variant the run can hit (the
kernels specialise integer arguments on ==1 and %16, and the split-K combine on the split count),
so no compilation lands inside a measured run: with decode graphs, every (batch, context) bucket
the run can reach is captured (which runs each once); then a short unrecorded run over prompts of
assorted lengths; in eager mode also one decode attention call for every context length in steps
of 64 (split counts are the kernels' own choice, a function of the longest context and the batch).
"""

from __future__ import annotations

import csv
import os
import platform
import shlex
import sys
import time
import traceback
from dataclasses import replace
from pathlib import Path

import torch

from .harness import GIB, Harness, RunConfig
from .model import RandomLlama, model_shape
from .steps import STEP_COLUMNS
from .trace import write_trace
from .workload import Request, poisson_workload


def environment() -> dict:
    """GPU, driver, versions, date, git revision (kernels_calibration.measure.provenance) and the command."""
    from kernels_calibration.measure import provenance

    info = provenance()
    cmd = (
        " ".join(shlex.quote(a) for a in ["python", "-m", "realrun"] + sys.argv[1:])
        if sys.argv[0].endswith("__main__.py")
        else "realrun.runner.run_set (library call)"
    )
    return {
        "gpu": info.get("gpu_name", "cpu"),
        "driver": info.get("driver", ""),
        "torch": info["torch"],
        "triton": info["triton"],
        "python": platform.python_version(),
        "date": info["date"],
        "git_rev": info["git_rev"],
        "cpu": info.get("cpu", "unknown"),
        "command": cmd,
    }


def warmup(h: Harness, prompt_range: tuple[int, int], output_range: tuple[int, int] = (2, 4), log=None) -> None:
    lo, hi = prompt_range
    h.step.capture_all(min_ctx=lo + 1, max_ctx=hi + output_range[1], log=log)
    # prompt lengths of every residue the kernels specialise on (%16, block counts ==1 / %16 / other)
    lens = sorted(
        {min(max(p, lo), hi) for p in (lo, lo + 1, lo + 65, 2 * lo, 2 * lo + 17, (lo + hi) // 2, hi - 1, hi, 1040)}
    )
    work = [Request(i, 0.0, p, 3) for i, p in enumerate(lens)]
    cfg = h.cfg
    h.cfg = replace(cfg, link_gbps=10000.0)  # compile, don't wait on the emulated link
    try:
        h.run(work)
    finally:
        h.cfg = cfg
    if h.step.mode == "graphs":
        h._sync()
        return
    # eager: every split count the kernels' split heuristics can pick: a lone request, every context
    # length in steps of 64 (a split count is a function of the longest context and the batch)
    meth, s = h.method, h.model.shape
    dev = h.device
    z = lambda *shape: torch.zeros(shape, dtype=torch.float16, device=dev)  # noqa: E731
    for ml in range(64, meth.cap, 64):
        lp = torch.tensor([ml - 1], dtype=torch.int32, device=dev)
        la = torch.tensor([ml], dtype=torch.int32, device=dev)
        meth.decode_attention(
            0, z(1, s.q_heads, s.head_dim), z(1, s.kv_heads, s.head_dim), z(1, s.kv_heads, s.head_dim), lp, la, 1, ml
        )
    h._sync()


def prime_prefill_attention(h: Harness, lengths: list[int]) -> None:
    """One prefill-attention call per prompt length the run will see, outside the measured run.
    torch SDPA dispatches to cuDNN's fused attention on this GPU, and cuDNN builds an execution
    plan on the CPU for every new sequence length (~30-60 ms each, cached afterwards): without
    this, the first method of a process (baseline, in run_set's order) paid one plan build per
    prefill and the methods after it ran on the cached plans (found with hostcal --profile-first:
    aten::_cudnn_attention_forward, 29 ms of CPU per call).  Priming gives every method the warm
    cache a serving engine has for the lengths it has seen."""
    prime_attention(h.model.shape, h.device, h.method.prefill_attention, lengths)
    h._sync()


def prime_attention(shape, dev, attention, lengths: list[int]) -> None:
    """prime_prefill_attention's calls: `attention(q, k, v)` once at each length, on zeros of the model's shape."""
    for p in lengths:
        q = torch.zeros((1, shape.q_heads, p, shape.head_dim), dtype=torch.float16, device=dev)
        kv = torch.zeros((1, shape.kv_heads, p, shape.head_dim), dtype=torch.float16, device=dev)
        attention(q, kv, kv)


PREFILL_ATTENTION = {
    "baseline": "torch SDPA causal (flash)",
    "kvquant": "torch SDPA causal (flash)",
    "hack": "hack_attn_prefill (8-bit Q on the 2-bit K/V codes; the prompt's KV is quantized "
    "inside the forward, per layer)",
}
QUANTIZE_STEP = {
    "baseline": "packing the FP16 KV into the flat send buffer",
    "kvquant": "quantize_k/quantize_v (2-bit, stochastic rounding) + packing",
    "hack": "packing the already quantized KV (codes, min/scale, sums, FP16 V tail)",
}
DECODE_ATTENTION = {
    "baseline": "fp_attn_decode over ragged FP16 contexts",
    "kvquant": "append_token, then dequantize_cache (unfused: the whole cache of every running "
    "request to FP16 memory, every iteration), then fp_attn_decode",
    "hack": "append_token + hack_attn_decode (INT8 homomorphic, SE, RQE)",
}


def _notes(h: Harness, complete: bool, prompt_range, output_range, work, prefill_max_batch_tokens: int) -> str:
    cfg, meth = h.cfg, h.method
    p_mean = round(sum(r.prompt_tokens for r in work) / len(work))
    hack_kernel = cfg.method == "hack" and cfg.hack_prefill == "kernel"
    prefill = PREFILL_ATTENTION["hack" if hack_kernel else "baseline"]
    quant = (
        QUANTIZE_STEP[cfg.method]
        if cfg.method != "hack" or hack_kernel
        else "quantize_k/quantize_v (2-bit, stochastic rounding, sums) + packing"
    )
    st = h.step
    if st.mode == "graphs":
        graphs = (
            f"the whole step (attention included) as one CUDA graph per (batch, context) bucket, "
            f"{len(st.graphs)} captured; batch buckets {st.b_sizes}; context buckets (the attention "
            f"kernels' max_len) {[c for c in st.c_sizes]}"
        )
        if not h.cuda:
            graphs += " (no CUDA: the padded step ran eagerly)"
    else:
        graphs = "eager: the step launch by launch at the true batch and longest context"
    return "; ".join(
        [
            f"complete={complete}",
            "one GPU, one process: prefill and decode take turns, one prefill batch (FCFS) at a decode-iteration "
            "boundary, see realrun/harness.py",
            f"prefill_max_batch_tokens={prefill_max_batch_tokens}; max_decode_batch={cfg.max_decode_batch}; "
            f"prefill parked-KV budget (prefill back-pressure) {cfg.prefill_host_memory_bytes / GIB:g} GiB",
            f"prompt_tokens uniform {list(prompt_range)}, output_tokens uniform {list(output_range)}, Poisson arrivals "
            "(numpy default_rng(seed): gaps, then prompts, then outputs)",
            f"link: pacer at link_gbps, round-robin {cfg.chunk_bytes} B chunks GPU->pinned host->GPU on its own "
            "CUDA stream, efficiency 1.0, no added latency",
            "threads: "
            + (
                "placed by the OS"
                if cfg.pin_cpus is None
                else f"the loop on CPU {cfg.pin_cpus[0]}, the link thread on CPU {cfg.pin_cpus[1]} (--pin-threads)"
            ),
            f"wire bytes per prompt token at the mean prompt ({p_mean}) = {meth.wire_bytes(p_mean) / p_mean:.1f}",
            "KV reserved at admission = final prompt+output tokens in the method's format"
            + (f" + a full {meth.pi}-token FP16 V tail" if meth.quantized else ""),
            f"prefill attention = {prefill}",
            f"quantize step (prefill_end_s -> quantize_end_s) = {quant}",
            f"decode attention = {DECODE_ATTENTION[cfg.method]}",
            f"decode step = {graphs} (realrun/step.py)",
            "batch slots kept dense: joins take the lowest free slots, the last running requests move into "
            "slots finished ones left; all of an iteration's KV placement in one kernel launch (realrun/kvcopy.py), "
            f"in the iteration; {sum(j for j, _ in h.moves)} joins, {sum(c for _, c in h.moves)} compactions",
            "peak_memory_bytes = torch.cuda.max_memory_allocated, reset at each iteration's start (weights, the "
            f"preallocated decode slot pool of {meth.pool_bytes()} B, in-flight send/receive buffers, the graphs' "
            "memory pool included)",
            "decode_start_s = start_s of the first iteration that includes the request (its KV is copied from the "
            "receive buffer into its batch slot inside that iteration)",
            "host_issue (mean per iteration, from its start to the graph launch or last launch) = "
            f"{_mean_issue(h) * 1e3:.3f} ms",
        ]
    )


def _mean_issue(h: Harness) -> float:
    return sum(x[0] for x in h.host_issue) / max(1, len(h.host_issue))


def _one_run(
    h: Harness,
    work,
    path: Path,
    name: str,
    env: dict,
    rate: float,
    n_requests: int,
    prompt_range,
    output_range,
    prefill_max_batch_requests: int,
    prefill_max_batch_tokens: int,
    log,
    pack=None,
) -> Path:
    shape, cfg = h.model.shape, h.cfg
    h.host_issue.clear()
    h.moves.clear()
    h.step_rows.clear()
    getattr(h.method, "quantize_events", []).clear()
    wall_start_s = time.time()
    rows, iters, complete = h.run(work)
    wall_end_s = time.time()
    meta = {
        "method": cfg.method,
        "model": shape.name,
        "layers": shape.layers,
        "rate_rps": rate,
        "link_gbps": cfg.link_gbps,
        "seed": cfg.seed,
        "requests": n_requests,
        "kv_capacity_bytes": cfg.kv_capacity_bytes,
        "prefill_max_batch_requests": prefill_max_batch_requests,
        "prefill_max_batch_tokens": prefill_max_batch_tokens,
        "prefill_host_memory_bytes": int(cfg.prefill_host_memory_bytes),
        "max_decode_batch": cfg.max_decode_batch,
        "prompt_tokens": list(prompt_range),
        "output_tokens": list(output_range),
        "decode_mode": cfg.decode_mode,
        "placement": "shared_gpu",
        **env,
        "wall_start_s": round(wall_start_s, 3),  # the run's span by the wall clock (beside a host probe's wall_s)
        "wall_end_s": round(wall_end_s, 3),
        "notes": _notes(h, complete, prompt_range, output_range, work, prefill_max_batch_tokens),
    }
    write_trace(path, rows, iters, meta)
    if h.step_rows:  # --step-times: beside the trace, one row per iteration (the iterations.csv order)
        with open(path / "steps.csv", "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(STEP_COLUMNS)
            w.writerows((i,) + tuple(r) for i, r in enumerate(h.step_rows))
    hi_ = h.host_issue or [(0.0, 0.0)]
    issue, wall = (sum(x[0] for x in hi_) / len(hi_), sum(x[1] for x in hi_) / len(hi_))
    fin = [r for r in rows if r[12] == r[12]]
    jct = sum(r[12] - r[2] for r in fin) / max(1, len(fin))
    span = max((r[12] for r in fin), default=0.0)
    qev = getattr(h.method, "quantize_events", [])
    if qev:
        q_s = sum(a.elapsed_time(b) for a, b in qev) / 1e3 / len(work)
        log(
            f"{name}: the quantize kernels inside the HACK prefill forward took {q_s * 1e3:.2f} ms per request "
            f"on average (included in prefill_end_s - prefill_start_s)"
        )
    batches = sorted(it[3] for it in iters) or [0]
    log(
        f"{name}: {len(fin)}/{n_requests} finished, mean JCT {jct:.3f} s, makespan {span:.1f} s, "
        f"{len(iters)} iterations (mean {wall * 1e3:.2f} ms, host issue {issue * 1e3:.2f} ms: "
        f"{'host-bound' if issue > 0.9 * wall else 'GPU-bound'}; batch median {batches[len(batches) // 2]}, "
        f"max {batches[-1]}) -> {path}"
    )
    if pack is not None:
        pack()
    return path


def pin_cpus() -> tuple[int, int]:
    """The CPUs a pinned run puts its loop and its link thread on: the last two this process may run on (the first
    ones are where Linux tends to take its interrupts and housekeeping)."""
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        raise ValueError(f"--pin-threads needs two CPUs; this process may use {len(cpus)}")
    return cpus[-2], cpus[-1]


def run_set(
    model_name: str,
    layers: int | None,
    methods: list[str],
    rates: list[float],
    link_gbps: float,
    n_requests: int,
    seed: int,
    kv_capacity_gib: float,
    out: Path,
    device: str = "cuda",
    prefill_max_batch_requests: int = 1,
    prefill_max_batch_tokens: int = 16384,
    max_decode_batch: int = 32,
    prompt_range: tuple[int, int] = (1024, 8192),
    output_range: tuple[int, int] = (16, 128),
    hack_prefill: str = "kernel",
    do_warmup: bool = True,
    chunk_bytes: int | None = None,
    time_limit_s: float = 600.0,
    keep_going: bool = False,
    decode_mode: str = "graphs",
    prefill_host_memory_gib: float = 64.0,
    label: str | None = None,
    pack=None,
    log=print,
    repeats: int = 1,
    step_times: bool = False,
    pin_threads: bool = False,
) -> list[Path]:
    """Each method in turn on one model (weights built once): its warm-up, then one run per rate, `repeats`
    times back to back (the same workload and seed; the spread between them is the run-to-run noise of one
    process's runs, not of separate processes or machines). Trace folders are named
    <label>_<method>_r<rate>[_rep<k>] (label: <model>-L<layers>_<link>gbps); with one method, one rate and one
    repeat the trace is `out` itself.  pack(): called after each trace is written.  pin_threads: each run's loop and
    link thread on two CPUs of their own (the last two this process may use; pin_cpus)."""
    shape = model_shape(model_name, layers)
    dev = torch.device(device)
    model = RandomLlama(shape, dev, seed=seed, max_positions=prompt_range[1] + output_range[1] + 64)
    env = environment()
    written = []
    label = label or f"{shape.name}-L{shape.layers}_{link_gbps:g}gbps"
    for method in methods:
        kw = {} if chunk_bytes is None else {"chunk_bytes": chunk_bytes}
        cfg = RunConfig(
            method=method,
            link_gbps=link_gbps,
            kv_capacity_bytes=int(kv_capacity_gib * GIB),
            prefill_max_batch_requests=prefill_max_batch_requests,
            prefill_max_batch_tokens=prefill_max_batch_tokens,
            max_decode_batch=max_decode_batch,
            max_total_tokens=prompt_range[1] + output_range[1],
            hack_prefill=hack_prefill,
            seed=seed,
            time_limit_s=time_limit_s,
            decode_mode=decode_mode,
            prefill_host_memory_bytes=prefill_host_memory_gib * GIB,
            step_times=step_times,
            pin_cpus=pin_cpus() if pin_threads else None,
            **kw,
        )
        h = None
        try:
            h = Harness(model, cfg)
            if do_warmup:
                warmup(h, prompt_range, output_range, log=log)
            for rate, rep in [(r, k) for r in rates for k in range(1, repeats + 1)]:
                work = poisson_workload(n_requests, rate, seed, prompt_range, output_range)
                if do_warmup and rep == 1:
                    prime_prefill_attention(h, sorted({r.prompt_tokens for r in work}))
                name = f"{label}_{method}_r{rate:g}" + (f"_rep{rep}" if repeats > 1 else "")
                path = Path(out) if len(methods) * len(rates) * repeats == 1 else Path(out) / name
                written.append(
                    _one_run(
                        h,
                        work,
                        path,
                        name,
                        env,
                        rate,
                        n_requests,
                        prompt_range,
                        output_range,
                        prefill_max_batch_requests,
                        prefill_max_batch_tokens,
                        log,
                        pack,
                    )
                )
        except Exception:
            if not keep_going:
                raise
            log(f"ERROR in {label} {method} (continuing with the next method):\n" + traceback.format_exc())
        finally:
            if h is not None:
                h.close()
            del h
            if dev.type == "cuda":
                torch.cuda.empty_cache()
    return written
