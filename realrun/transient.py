"""python -m realrun.transient --out FILE.csv: decode iterations by their distance from a prefill on a shared GPU.

Under placement shared_gpu a prefill (a burst of large GEMMs) and the decode iterations (memory-bound) take
turns on one GPU.  This measures whether the decode iterations right after a prefill run longer than the ones
further from it, with the link idle and the batch fixed: B requests of `--context` tokens decode without end
while, every `--gap` iterations, one event happens at an iteration boundary:

  prefill-L   a prefill of L prompt tokens through the harness's own path (forward, encode); its KV is dropped
              (no transfer, no join), so the iterations after it differ from the ones before only in what the
              GPU just did;
  sleep       the GPU idles as long as the last 1,024-token prefill took (a pause with no work: separates
              "after a burst of compute" from "after a pause");
  none        nothing (the reference: the same counting with no event).

Then a dense block: `--dense` prefills of 1,024 tokens, each followed by two iterations (the pattern of a
saturated pipeline, where transients may add up).  Columns: set (model:layers), method, batch_size, cycle,
event, event_tokens, event_s (the prefill's or sleep's wall time), k (1 = the first iteration after the event),
max_context, wall_s, unix_s (the host's clock after the iteration: to line up with a GPU clock log; files from
before it have none).  Nothing here reads a measured trace.

`--duty` measures instead what a sustained share of prefill does (duty.csv): blocks of `--block-s` seconds, each
holding the prefills' share of the GPU's time at a target (0, 0.5, 0, 0.25, 0, 0.5, 0 by default: a prefill of
`--duty-prompt` tokens whenever the block's share so far is below its target), the batch fixed, the link idle.
Columns: set, method, batch_size, block, duty (the target), t_s (from the run's start), unix_s (the host's clock
after the iteration: to line up with a GPU clock log), k (iterations since the last prefill; 0 where none yet in the
block), event_s (the last prefill's time), max_context, wall_s.

`--xfer-gbps RATE...` measures instead what a transfer on the harness's own link does to the loop (xfer.csv): per
rate and cycle, a short transfer (10 ms of wire) then 16 iterations, a long one (300 ms) then 48, and 16 with
none; the batch fixed, no prefill.  Columns: set, method, batch_size, link_gbps, cycle, event, k, since_start_s
(the iteration's start from the transfer's), busy (a transfer in flight at the start), gap_s (from the previous
iteration's end to this one's start: the loop's own time), max_context, wall_s, prompt_tokens (0), forward_s (0),
chunk_bytes (the link's chunk, `--xfer-chunk-mib`), transfer_s (the window's transfer from submit to its end on the
link's clock; -1 where none; files before them have neither: 1 MiB chunks). With `--xfer-prefill TOKENS...` each
rate's cycle also times a prefill of each length (start to KV encoded, its KV dropped, as the transient probe's)
with the link idle and, right after, with a long transfer 10 ms into its wire time (event prefill, busy 0 / 1,
prompt_tokens the length, wall_s the prefill's seconds with its quantize step, forward_s without it; busy stays 1
only where the transfer was still in flight when the prefill ended): what the link thread does to a prefill's
launches, the prefill floor's level while the link moves KV (fit_xfer_prefill; files without forward_s, the first
two H100 runs', are timed by wall_s).

`--mix` measures instead whether a batch's spread of contexts costs more than its total (mix.csv): per batch size,
B requests of `--context` tokens each and B spread evenly over 0.5-1.5 x that (the same total), 64 iterations each
after 8 to warm, link idle, no prefill. Columns: set, method, batch_size, kind (uniform, spread), k, max_context,
context_tokens, wall_s.

`--fit FILE...` (no GPU) prints the scenario fields decode.after_prefill_slowdown_fraction and
decode.after_prefill_decay_per_iteration from the transient and duty files (fit_transient); given a GPU clock log
(smi.csv, the device part dutylong's), also decode.after_prefill_clock_time_constant_s from it (clock_time_constant)
and decode.after_prefill_clock_fraction; from the files that time iterations on the host's clock (duty, translong) the
CPU's time a pass through a prefill adds, prefill.host_serial_s_per_iteration (prefill_pass_s);
network.link_busy_host_factor and _per_gbps from the xfer files (fit_xfer), and network.link_busy_prefill_host_factor
and _per_gbps from their prefill rows (fit_xfer_prefill); and from the mix files the spread batches' excess
(mix_excess).
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path

import torch

from .probes import parse_sets, probe_device, write_rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m realrun.transient", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--out", type=Path)
    ap.add_argument("--fit", nargs="+", type=Path, help="fit the scenario fields from these files; runs nothing")
    ap.add_argument("--smoke", action="store_true", help="CPU plumbing check: tiny model, interpreter")
    ap.add_argument("--sets", default="llama-3.1-8b:32", help="model:layers;...")
    ap.add_argument("--methods", nargs="+", default=["baseline", "kvquant", "hack"])
    ap.add_argument("--batches", nargs="+", type=int, default=[8, 32])
    ap.add_argument("--prompts", nargs="+", type=int, default=[256, 1024, 3072])
    ap.add_argument("--context", type=int, default=2048)
    ap.add_argument("--gap", type=int, default=16)
    ap.add_argument("--cycles", type=int, default=5)
    ap.add_argument("--dense", type=int, default=10)
    ap.add_argument("--time-limit-s", type=float, default=1e9, help="stop starting new (set, method, batch) runs")
    ap.add_argument("--duty", nargs="*", type=float, default=None, help="duty blocks' targets (module doc)")
    ap.add_argument("--block-s", type=float, default=2.0)
    ap.add_argument("--duty-prompt", type=int, default=2048)
    ap.add_argument("--xfer-gbps", nargs="+", type=float, default=None, help="transfer windows at these rates")
    ap.add_argument(
        "--xfer-prefill",
        nargs="+",
        type=int,
        default=[],
        help="with --xfer-gbps: also time prefills of these lengths with the link idle and busy (module doc)",
    )
    ap.add_argument(
        "--xfer-chunk-mib",
        type=float,
        default=1.0,
        help="with --xfer-gbps: the link's chunk in MiB (the h200g recordings' --chunk-mib 1; realrun's default is 4)",
    )
    ap.add_argument("--mix", action="store_true", help="uniform against spread contexts at the same sum (module doc)")
    a = ap.parse_args(argv)
    if a.fit:
        import pandas as pd

        first = {p: pd.read_csv(p, nrows=1, skipinitialspace=True) for p in a.fit}  # each file's first row
        heads = {p: f.columns for p, f in first.items()}
        smi = [p for p in a.fit if "timestamp" in heads[p]]
        probes = [p for p in a.fit if p not in smi and {"max_context", "wall_s"} <= set(heads[p])]
        for p in a.fit:  # another tool's file in the folder (realrun.prefillcal, realrun.placecal): not these fits'
            if p not in smi and p not in probes:
                print(f"skipped {p}: not a realrun.transient file", file=sys.stderr)
        xfer = [p for p in probes if "link_gbps" in heads[p]]
        mix = [p for p in probes if "kind" in heads[p]]
        rest = [p for p in probes if p not in xfer and p not in mix]
        if mix:
            print(mix_excess(mix))
            here = Path(__file__).resolve().parent.parent / "scenarios" / "measured"
            print(padding_share(mix, scenario_per_ctx_s(here.glob("h200g_*.yaml"))))
        tau = None
        if smi:  # the clock's fade, from the log and the duty runs beside it (their unix_s)
            clocked = [p for p in rest if "unix_s" in heads[p] and "block" in heads[p]]
            fade = clock_time_constant(smi, clocked)
            print(fade)
            tau = fade["after_prefill_clock_time_constant_s"]
        duty = [p for p in rest if "block" in heads[p]]
        if duty:
            print(duty_excess(duty))
        if rest:
            print(fit_transient(rest, tau))
            timed = [p for p in rest if "unix_s" in heads[p] or "t_s" in heads[p]]
            try:
                print(prefill_pass_s(timed))
            except ValueError:  # no file times a pass through a prefill against a plain one
                pass
        by_chunk: dict[int, list] = {}  # the busy factor's fits take one chunk's files at a time (_read_runs)
        for p in xfer:  # a file of one run: one chunk (1 MiB in files before the column)
            f = first[p]
            by_chunk.setdefault(int(f["chunk_bytes"].iloc[0]) if "chunk_bytes" in f else 1 << 20, []).append(p)
        for c, files in sorted(by_chunk.items()):
            for fit in (fit_xfer, fit_xfer_prefill):
                try:
                    got = fit(files)
                    print(f"{c / (1 << 20):g} MiB chunks: {got}" if len(by_chunk) > 1 else got)
                except ValueError as e:  # the files have no such rows (fit_xfer_prefill: --xfer-prefill not given)
                    print(f"{fit.__name__}: {e}", file=sys.stderr)
        if len(by_chunk) > 1:
            print(fit_xfer_chunks(xfer))
        return 0
    if a.out is None:
        ap.error("--out is required (or --fit)")
    dev = probe_device("transient", a.smoke)
    if dev is None:
        return 2
    from .harness import GIB, Harness, RunConfig
    from .model import RandomLlama, model_shape

    sets = parse_sets(a.sets)
    prompts, context, gap, cycles, batches = a.prompts, a.context, a.gap, a.cycles, a.batches
    if a.smoke:
        sets, prompts, context, gap, cycles, batches = [("tiny", 1)], [40, 90], 64, 3, 1, [2]
        a.dense = 2
    duties = None
    if a.duty is not None:
        duties = a.duty or [0.0, 0.5, 0.0, 0.25, 0.0, 0.5, 0.0]
        prompts = [a.duty_prompt] if not a.smoke else [90]
    events = [("prefill", p) for p in prompts] + [("sleep", 0), ("none", 0)]
    per_cycle = len(events) * gap + 2 * a.dense
    total_iters = cycles * per_cycle + 4 * len(prompts) + 8  # the warm-up's iterations too
    if a.xfer_gbps:
        total_iters = len(a.xfer_gbps) * cycles * (16 + 48 + 16) + 16
        if a.smoke and a.xfer_prefill:
            a.xfer_prefill = [40]
    elif a.mix:  # the spread batch's longest request starts at 1.5 x the context
        total_iters = MIX_ITERATIONS + context // 2 + 8
    elif duties is not None:  # at most an iteration per 4 ms
        total_iters = int(len(duties) * a.block_s / 0.004) + 4 * len(prompts) + 8 if not a.smoke else 200
    rows: list[dict] = []
    t_begin = time.perf_counter()
    a.out.parent.mkdir(parents=True, exist_ok=True)
    for model_name, layers in sets:
        shape = model_shape(model_name, layers)
        max_tokens = context + total_iters + 8
        model = RandomLlama(shape, dev, seed=1, max_positions=max(max_tokens, max(prompts)) + 8)
        for method in a.methods:
            for b in batches:
                if time.perf_counter() - t_begin > a.time_limit_s:
                    print("time limit: stopping", flush=True)
                    break
                cfg = RunConfig(
                    method=method,
                    link_gbps=10000.0,
                    kv_capacity_bytes=64 * GIB,
                    max_decode_batch=b,
                    max_total_tokens=max_tokens,
                    seed=1,
                )
                if a.mix:  # a harness per kind: its requests never finish
                    _measure_mix(model, cfg, f"{model_name}:{layers}", method, b, context, a.smoke, rows)
                    write_rows(a.out, rows)
                    print(f"{model_name}:{layers} {method} B{b}: {_mix_summary(_mine(rows, method, b))}", flush=True)
                    continue
                h = Harness(model, cfg)
                try:
                    if a.xfer_gbps:
                        _measure_xfer(h, f"{model_name}:{layers}", method, b, context, a.xfer_gbps, cycles, a, rows)
                    elif duties is not None:
                        _measure_duty(h, f"{model_name}:{layers}", method, b, prompts[0], context, duties, a, rows)
                    else:
                        _measure(
                            h,
                            f"{model_name}:{layers}",
                            method,
                            b,
                            a.smoke,
                            prompts,
                            context,
                            gap,
                            cycles,
                            a.dense,
                            rows,
                        )
                finally:
                    h.close()
                write_rows(a.out, rows)
                mine = _mine(rows, method, b)
                if a.xfer_gbps:
                    summary = _xfer_summary(mine)
                else:
                    summary = _duty_summary(mine) if duties is not None else _summary(mine, gap)
                print(f"{model_name}:{layers} {method} B{b}: {summary}", flush=True)
        del model
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    write_rows(a.out, rows)
    return 0


def _fixed_batch(h, b: int, context: int, primed, contexts: list[int] | None = None) -> list:
    """Capture every decode graph up to the pool's capacity, prime prefill attention at the `primed` lengths, then
    place B requests of `context` tokens (or of `contexts`, one each) that never finish (prefilled, joined in one
    iteration); returns them."""
    from .harness import _Req
    from .runner import prime_prefill_attention
    from .workload import Request

    assert h.step is not None
    lengths = contexts or [context] * b
    h.step.capture_all(min_ctx=max(lengths) + 1, max_ctx=h.cfg.max_total_tokens - 2)
    prime_prefill_attention(h, sorted(set(primed)))
    h.t0 = time.perf_counter()
    run = [_Req(Request(i, 0.0, n, 10**9)) for i, n in enumerate(lengths)]
    for r in run:
        h.prefill([r])
        r.recv, r.send = r.send, None
    h.decode_iteration(run)
    return run


MIX_ITERATIONS = 64


def _mine(rows: list[dict], method: str, b: int) -> list[dict]:
    return [r for r in rows if r["method"] == method and r["batch_size"] == b]


def _mix_contexts(b: int, context: int) -> dict[str, list[int]]:
    """B contexts summing to B x context: all equal, and spread evenly over 0.5-1.5 x context (a recording's batch:
    prompts of 1-3K tokens at different points of their decode)."""
    spread = [int(round(context * (0.5 + i / max(b - 1, 1)))) for i in range(b)]
    spread[-1] += b * context - sum(spread)
    return {"uniform": [context] * b, "spread": spread}


def _measure_mix(model, cfg, set_name: str, method: str, b: int, context: int, smoke: bool, rows) -> None:
    """One (set, method, batch): the same total context as B equal requests and as B spread ones, each in a harness
    of its own, 8 iterations to warm, then MIX_ITERATIONS timed (link idle, no prefill)."""
    from .harness import Harness

    count = 4 if smoke else MIX_ITERATIONS
    for kind, contexts in _mix_contexts(b, context).items():
        h = Harness(model, cfg)
        try:
            run = _fixed_batch(h, b, context, [], contexts)
            for k in range(-8, count):
                (t0, t1, n, total, _), _ = h.decode_iteration([])
                if k >= 0:
                    rows.append(
                        dict(
                            set=set_name,
                            method=method,
                            batch_size=n,
                            kind=kind,
                            k=k,
                            max_context=max(r.stored for r in run),
                            context_tokens=total,
                            wall_s=t1 - t0,
                        )
                    )
        finally:
            h.close()


def _mix_means(d):
    """Per set, method and batch of --mix rows (a DataFrame): the mean iteration (s) of each kind, and the spread
    batch's excess over the uniform one's (%, column `excess_pct`)."""
    mean = d.groupby(["set", "method", "batch_size", "kind"])["wall_s"].mean().unstack("kind")
    return mean.assign(excess_pct=(mean["spread"] / mean["uniform"] - 1.0) * 100.0)


def _mix_summary(rows: list[dict]) -> str:
    """The spread batch's mean iteration against the uniform one's (ms, and the spread one's excess in %)."""
    import pandas as pd

    m = _mix_means(pd.DataFrame(rows)).iloc[0]
    return f"uniform {m['uniform'] * 1e3:.3f} ms, spread {m['spread'] * 1e3:.3f} ms ({m['excess_pct']:+.2f} %)"


def mix_excess(paths) -> dict[str, float]:
    """From --mix runs: per set, method and batch, the spread batch's mean iteration over the uniform one's, in %."""
    import pandas as pd

    pct = _mix_means(pd.concat([pd.read_csv(p) for p in paths], ignore_index=True))["excess_pct"]
    return {f"{k[0]} {k[1]} B{k[2]}": round(float(v), 2) for k, v in pct.items()}


def padding_share(paths, per_ctx_s) -> dict[str, dict]:
    """calibration.implementation_factors.M.attention_padding_share from --mix runs: per set and method, the share of
    the padding to the batch's longest context (B x longest - total context) that an iteration pays for at the
    attention's price per context token, `per_ctx_s(set, method, batch)` (the cost model's IterationCost.per_ctx_s).
    Per batch size x = that price x (the spread batch's mean padding - the uniform one's) and y = the spread batch's
    mean iteration - the uniform one's (the same total context: only the padding differs); the share is the least
    squares slope of y on x through the origin over the batch sizes, its standard error from their scatter about it.
    `value` is what a scenario carries: the share, bounded to [0, 1], where it exceeds twice its standard error, else 0
    (the probe does not resolve it from the kernel's price by the total context). A set `per_ctx_s` has no price for
    (KeyError) gets a note instead."""
    import numpy as np
    import pandas as pd

    d = pd.concat([pd.read_csv(p) for p in paths], ignore_index=True)
    d = d.assign(padding=d["batch_size"] * d["max_context"] - d["context_tokens"])
    mean = d.groupby(["set", "method", "batch_size", "kind"])[["wall_s", "padding"]].mean().unstack("kind")
    out = {}
    for (set_name, method), g in mean.groupby(level=["set", "method"], sort=True):
        batches = g.index.get_level_values("batch_size")
        try:
            price = np.array([per_ctx_s(set_name, method, int(b)) for b in batches])
        except KeyError as e:  # no price for this set: nothing to scale the padding by
            out[f"{set_name} {method}"] = {"share": None, "note": str(e.args[0])}
            continue
        x = price * (g[("padding", "spread")] - g[("padding", "uniform")]).to_numpy()
        y = (g[("wall_s", "spread")] - g[("wall_s", "uniform")]).to_numpy()
        share = float(x @ y / (x @ x))
        resid = y - share * x
        se = float(np.sqrt(resid @ resid / max(len(x) - 1, 1) / (x @ x))) if len(x) > 1 else float("inf")
        out[f"{set_name} {method}"] = {
            "share": round(share, 3),
            "se": round(se, 3),
            "per_batch": {int(b): round(float(yy / xx), 3) for b, xx, yy in zip(batches, x, y)},
            "value": round(min(max(share, 0.0), 1.0), 2) if share > 2 * se else 0.0,
        }
    return out


def scenario_per_ctx_s(scenarios):
    """per_ctx_s for padding_share from scenario files (the committed scenarios/measured/h200g_*.yaml): for a set
    "model:layers", the first scenario of that model and layer count; the decode iteration's price per context token
    (decode, dequantization and correction) for the method of that name."""
    from simulator.measured import load_scenario
    from simulator.resolve import resolve

    found: dict[str, tuple] = {}
    paths = sorted(scenarios)

    def price(set_name: str, method: str, batch: int) -> float:
        if set_name not in found:
            model, layers = set_name.split(":")
            for path in paths:
                s = load_scenario(path, [])
                if s.model.name.lower() == model and s.model.layers == int(layers):
                    found[set_name] = (s, resolve(s))
                    break
            else:
                raise KeyError(f"no scenario of {set_name} among {len(paths)}")
        s, res = found[set_name]
        cfg = next(m for m in s.methods if m.name == method)
        return res.costs(cfg)[1].iteration(batch).per_ctx_s

    return price


def _dropped_prefill(h, rid: int, tokens: int, parts: list[float] | None = None) -> float:
    """A prefill of `tokens` through the harness's own path, its KV dropped (no transfer, no join): its seconds
    from start to KV encoded; `parts` (if given) gets the forward's seconds alone, start to prefill end."""
    from .harness import _Req
    from .workload import Request

    r = _Req(Request(rid, 0.0, tokens, 1))
    h.prefill([r])
    r.send = None
    if parts is not None:
        parts.append(r.t["prefill_end_s"] - r.t["prefill_start_s"])
    return r.t["quantize_end_s"] - r.t["prefill_start_s"]


def _measure(h, set_name: str, method: str, b: int, smoke: bool, prompts, context, gap, cycles, dense, rows) -> None:
    """One (set, method, batch): B requests of `context` tokens placed, then the cycles of events (module doc)."""
    events = [("prefill", p) for p in prompts] + [("sleep", 0), ("none", 0)]
    run = _fixed_batch(h, b, context, prompts)
    next_id = b
    timed = 1024 if not smoke else prompts[-1]  # the sleep lasts as long as the last prefill of this length

    def iterate(cycle: int, event: str, tokens: int, event_s: float, count: int) -> None:
        for k in range(1, count + 1):
            (t0, t1, n, _, _), _ = h.decode_iteration([])
            rows.append(
                dict(
                    set=set_name,
                    method=method,
                    batch_size=n,
                    cycle=cycle,
                    event=event,
                    event_tokens=tokens,
                    event_s=event_s,
                    k=k,
                    max_context=max(r.stored for r in run),
                    wall_s=t1 - t0,
                    unix_s=time.time(),
                )
            )

    for n in prompts:  # warm: every prefill length once, and iterations after
        _dropped_prefill(h, next_id, n)
        next_id += 1
        for _ in range(4):
            h.decode_iteration([])
    sleep_s = _dropped_prefill(h, next_id, timed)
    next_id += 1
    for cycle in range(cycles):
        for event, tokens in events:
            if event == "prefill":
                event_s = _dropped_prefill(h, next_id, tokens)
                next_id += 1
                if tokens == timed:
                    sleep_s = event_s
            elif event == "sleep":
                t = h.now()
                time.sleep(sleep_s)
                event_s = h.now() - t
            else:
                event_s = 0.0
            iterate(cycle, event, tokens, event_s, gap)
        for _ in range(dense):
            event_s = _dropped_prefill(h, next_id, timed)
            next_id += 1
            iterate(cycle, "dense", timed, event_s, 2)


def _measure_xfer(h, set_name: str, method: str, b: int, context: int, rates, cycles: int, a, rows) -> None:
    """One (set, method, batch): B requests of `context` tokens decoding while transfers run on a paced link."""
    import torch

    from .harness import SWITCH_INTERVAL_S
    from .link import Link, Transfer

    run = _fixed_batch(h, b, context, [])
    for _ in range(8):
        h.decode_iteration([])
    next_id = b
    for tokens in a.xfer_prefill:  # warm each prefill length (Triton compiles, allocator)
        _dropped_prefill(h, next_id, tokens)
        next_id += 1
    last_end = [h.now()]
    old_switch = sys.getswitchinterval()
    sys.setswitchinterval(SWITCH_INTERVAL_S)  # as Harness.run: the link thread gets the GIL back within ~0.5 ms

    for gbps in rates:
        bytes_per_s = gbps * 1e9 / 8
        chunk = int(a.xfer_chunk_mib * (1 << 20))
        link = Link(gbps, lambda: time.perf_counter() - h.t0, h.device, chunk)
        try:
            sizes = {"short": max(1 << 20, int(bytes_per_s * 0.010)), "long": int(bytes_per_s * 0.300)}
            if a.smoke:
                sizes = {"short": 1 << 16, "long": 1 << 18}
            buf = torch.zeros(max(sizes.values()), dtype=torch.uint8, device=h.device)
            dst = torch.empty_like(buf)
            for cycle in range(cycles):
                for event, count in (("short", 16), ("long", 48), ("none", 16)):
                    start = None
                    in_flight = False
                    first = len(rows)
                    if event != "none":
                        n = sizes[event]
                        tr = Transfer(event, buf[:n], dst[:n])
                        link.submit(tr)
                        start, in_flight = tr.start_s, True
                    for k in range(1, count + 1):
                        if in_flight:
                            try:
                                link.done.get_nowait()
                                in_flight = False
                            except Exception:
                                pass
                        (s0, s1, n_run, _, _), _ = h.decode_iteration([])
                        rows.append(
                            dict(
                                set=set_name,
                                method=method,
                                batch_size=n_run,
                                link_gbps=gbps,
                                cycle=cycle,
                                event=event,
                                k=k,
                                since_start_s=(s0 - start) if start is not None else -1.0,
                                busy=int(in_flight),
                                gap_s=s0 - last_end[0],
                                max_context=max(r.stored for r in run),
                                wall_s=s1 - s0,
                                prompt_tokens=0,
                                forward_s=0.0,
                                chunk_bytes=chunk,
                                transfer_s=-1.0,
                            )
                        )
                        last_end[0] = s1
                    while in_flight:  # the rest of a long transfer before the next window
                        link.done.get(timeout=5.0)
                        in_flight = False
                    if event != "none":  # the window's transfer, start to end on the link's clock
                        for row in rows[first:]:
                            row["transfer_s"] = tr.end_s - tr.start_s
                    last_end[0] = h.now()
                for tokens in a.xfer_prefill:  # a prefill with the link idle, then one 10 ms into a long transfer
                    for busy in (False, True):
                        start = None
                        if busy:
                            n = sizes["long"]
                            tr = Transfer("prefill", buf[:n], dst[:n])
                            link.submit(tr)
                            start = tr.start_s
                            time.sleep(0.010)  # past the start's burst
                        s0 = h.now()
                        forward: list[float] = []
                        took = _dropped_prefill(h, next_id, tokens, forward)
                        next_id += 1
                        still = busy and link.done.empty()
                        rows.append(
                            dict(
                                set=set_name,
                                method=method,
                                batch_size=len(run),
                                link_gbps=gbps,
                                cycle=cycle,
                                event="prefill",
                                k=0,
                                since_start_s=(s0 - start) if start is not None else -1.0,
                                busy=int(still),
                                gap_s=0.0,
                                max_context=max(r.stored for r in run),
                                wall_s=took,
                                prompt_tokens=tokens,
                                forward_s=forward[0],
                                chunk_bytes=chunk,
                                transfer_s=-1.0,
                            )
                        )
                        if busy:
                            link.done.get(timeout=5.0)
                    last_end[0] = h.now()
        finally:
            link.close()
    sys.setswitchinterval(old_switch)


def _xfer_summary(rows: list[dict]) -> str:
    """Per rate: the median loop gap (ms) with no transfer, busy in the first 10 ms of one, busy later; and with
    prefill rows the median prefill idle and busy."""
    import statistics

    out = []
    for g in sorted({r["link_gbps"] for r in rows}):
        pre = [r for r in rows if r["link_gbps"] == g and r["event"] == "prefill"]
        if pre:
            idle = [r["wall_s"] for r in pre if r["since_start_s"] < 0]
            busy = [r["wall_s"] for r in pre if r["since_start_s"] >= 0 and r["busy"]]
            med = [statistics.median(x) * 1e3 if x else float("nan") for x in (idle, busy)]
            out.append(f"{g:g} Gbps prefill idle {med[0]:.2f} / busy {med[1]:.2f} ms")
        w = [r for r in rows if r["link_gbps"] == g and r["k"] > 1 and r["event"] != "prefill"]
        idle = [r["gap_s"] for r in w if not r["busy"]]
        first = [r["gap_s"] for r in w if r["busy"] and 0 <= r["since_start_s"] < 0.010]
        later = [r["gap_s"] for r in w if r["busy"] and r["since_start_s"] >= 0.010]
        med = [statistics.median(x) * 1e3 if x else float("nan") for x in (idle, first, later)]
        out.append(f"{g:g} Gbps gap idle {med[0]:.3f} / first 10 ms {med[1]:.3f} / later {med[2]:.3f} ms")
    return "; ".join(out)


def _measure_duty(h, set_name: str, method: str, b: int, prompt: int, context: int, duties, a, rows) -> None:
    """One (set, method, batch): B requests of `context` tokens decoding through blocks of target prefill shares."""
    block_s = a.block_s if not a.smoke else 0.3
    run = _fixed_batch(h, b, context, [prompt])
    next_id = b

    def prefill() -> float:
        nonlocal next_id
        next_id += 1
        return _dropped_prefill(h, next_id - 1, prompt)

    for _ in range(3):  # warm
        prefill()
        for _ in range(4):
            h.decode_iteration([])
    cap = h.cfg.max_total_tokens - 4
    for block, duty in enumerate(duties):
        t0 = h.now()
        pre_s, k, last_s = 0.0, 0, 0.0
        while h.now() - t0 < block_s and max(r.stored for r in run) < cap:
            if duty > 0 and pre_s < duty * (h.now() - t0):
                last_s = prefill()
                pre_s += last_s
                k = 0
            (s0, s1, n, _, _), _ = h.decode_iteration([])
            k += 1 if (k or pre_s) else 0
            rows.append(
                dict(
                    set=set_name,
                    method=method,
                    batch_size=n,
                    block=block,
                    duty=duty,
                    t_s=s0,
                    unix_s=time.time(),
                    k=k,
                    event_s=last_s,
                    max_context=max(r.stored for r in run),
                    wall_s=s1 - s0,
                )
            )


def _duty_summary(rows: list[dict]) -> str:
    """Per block: its target and the mean iteration (ms) at k = 0 or k > 4, with the block's iteration count."""
    import statistics

    out = []
    for blk in sorted({r["block"] for r in rows}):
        w = [r for r in rows if r["block"] == blk]
        far = [r["wall_s"] for r in w if r["k"] == 0 or r["k"] > 4] or [r["wall_s"] for r in w]
        out.append(f"{w[0]['duty']:g}: {statistics.mean(far) * 1e3:.3f} ms ({len(w)})")
    return "; ".join(out)


def duty_excess(paths) -> dict[str, list[float]]:
    """Per (file, set, method, batch) of duty files (--duty): each block's median iteration over the zero-duty blocks'
    line in the context (%; the context grows a token per iteration, so a later block's iterations are longer with
    no prefill at all), the iterations right after a prefill (k = 1-8) of a zero block left out of the line. Whether
    a sustained share keeps slowing the decode (part dutysat: it does not)."""
    import numpy as np
    import pandas as pd

    out: dict[str, list[float]] = {}
    for path in paths:
        d = pd.read_csv(path)
        for (name, method, b), g in d.groupby(["set", "method", "batch_size"], sort=True):
            quiet = g[(g["duty"] == 0) & ((g["k"] == 0) | (g["k"] > 8))]
            if quiet["max_context"].nunique() < 2:  # no zero-duty block to draw the line through
                continue
            line = np.polyfit(quiet["max_context"], quiet["wall_s"], 1)
            blocks = g.groupby("block", sort=True)
            out[f"{Path(path).stem} {name} {method} B{b}"] = [
                round(100.0 * float((gb["wall_s"] / np.polyval(line, gb["max_context"]) - 1.0).median()), 1)
                for _, gb in blocks
            ]
    return out


LOOP_GAP_S = 0.0006  # the loop's own time between iterations (realrun.hostcal: 0.63 ms), where a file has no clock


def _timeline(g, duty: bool):
    """Per iteration of one (set, method, batch) run: its start (s) and the prefills before it as (end, seconds) arrays.
    A duty file carries the starts (t_s; a prefill ends as the first iteration after it starts); a transient file's
    are rebuilt from the rows' order: each event's time, then each iteration's wall time and the loop's gap."""
    import numpy as np

    w, k, p = g["wall_s"].to_numpy(), g["k"].to_numpy(), g["event_s"].to_numpy()
    if duty:
        t = g["t_s"].to_numpy()
        first = k == 1
        return t, t[first], p[first]
    ev = g["event"].to_numpy()
    t, ends, held, now = np.zeros(len(g)), [], [], 0.0
    for i in range(len(g)):
        if k[i] == 1 and ev[i] != "none":
            now += p[i]
            if ev[i] != "sleep":
                ends.append(now)
                held.append(p[i])
        t[i] = now
        now += w[i] + LOOP_GAP_S
    return t, np.array(ends), np.array(held)


def fit_transient(paths, clock_tau_s: float | None = None) -> dict:
    """decode.after_prefill_slowdown_fraction, decode.after_prefill_decay_per_iteration and
    decode.after_prefill_saturation_s from transient runs and duty runs (--duty), with clock_tau_s also
    decode.after_prefill_clock_fraction (the prefills' clock slowdown, fading with that time constant:
    clock_time_constant).

    Per (file, set, method, batch) an iteration's time without any prefill is one level per graph context bucket
    plus one slope in the context (the context grows by one token per iteration through a run). After a prefill of
    P seconds the k-th iteration runs fraction x S (1 - exp(-P / S)) x (1 - decay) x decay^(k-1) longer (S the
    saturation; fraction x P for P << S), a later prefill restarting it; and, with clock_tau_s, every iteration's
    time is (1 + s) times its level, s = clock x sum over the prefills before it of (1 - exp(-P / tau)) x
    exp(-(its start - the prefill's end) / tau) (a first-order lag toward the clock level while each prefill runs,
    fading after it). All are fitted at once (least squares of the relative residual, the levels solved for at each
    step, so a slow fade does not leak into the reference) to every iteration: the windows after lone prefills, the
    dense prefills two iterations apart, the duty blocks and the quiet ones. Returns the values, their standard
    errors (from the Jacobian) and the counts of prefills and iterations."""
    import numpy as np
    import pandas as pd
    from scipy.optimize import least_squares

    from .step import bucket, ctx_buckets

    runs = []
    prefills = 0
    for path in paths:
        d = pd.read_csv(path)
        duty = "block" in d.columns
        cs = ctx_buckets(int(d["max_context"].max()) + 2)
        d["bucket"] = [bucket(cs, int(c) + 1) for c in d["max_context"]]
        for _, g in d.groupby(["set", "method", "batch_size"], sort=False):
            g = g.reset_index(drop=True)
            after = ((g["duty"] > 0) & (g["k"] > 0)) if duty else g["event"].isin(["prefill", "dense"])
            t, ends, held = _timeline(g, duty)
            slow = np.zeros(len(g))
            if clock_tau_s:
                for e, p in zip(ends, held):
                    on = t >= e - 1e-9
                    slow[on] += -np.expm1(-p / clock_tau_s) * np.exp(-(t[on] - e) / clock_tau_s)
            cols = [g["max_context"].to_numpy(np.float64)]
            cols += [(g["bucket"] == c).to_numpy(np.float64) for c in sorted(g["bucket"].unique())]
            runs.append(
                dict(
                    levels=np.column_stack(cols),
                    wall=g["wall_s"].to_numpy(np.float64),
                    k=g["k"].to_numpy(np.float64),
                    held=np.where(after, g["event_s"].to_numpy(np.float64), 0.0),
                    slow=slow,
                )
            )
            prefills += int((after & (g["k"] == 1)).sum())
    if not prefills:
        raise ValueError("no iterations after a prefill in the files")

    def residuals(x: np.ndarray) -> np.ndarray:
        frac, decay, clock, sat = x
        out = []
        for r in runs:
            amp = -sat * np.expm1(-r["held"] / sat)
            fast = frac * amp * (1.0 - decay) * decay ** np.maximum(r["k"] - 1.0, 0.0)
            a = r["levels"] * (1.0 + clock * r["slow"])[:, None]
            coef, *_ = np.linalg.lstsq(a, r["wall"] - fast, rcond=None)
            base = a @ coef
            out.append((r["wall"] - fast - base) / base)
        return np.concatenate(out)

    hi = 1.0 if clock_tau_s else 1e-12  # without a time constant the clock term stays out
    x0, lo, top = [0.01, 0.8, 0.0, 0.1], [0.0, 0.0, 0.0, 1e-3], [1.0, 0.999, hi, 60.0]
    fit = least_squares(residuals, x0, bounds=(lo, top))
    cov = np.linalg.pinv(fit.jac.T @ fit.jac) * float(np.mean(fit.fun**2))
    out = {
        "after_prefill_slowdown_fraction": round(float(fit.x[0]), 4),
        "after_prefill_decay_per_iteration": round(float(fit.x[1]), 3),
        "after_prefill_saturation_s": round(float(fit.x[3]), 4),
        "fraction_se": round(float(np.sqrt(cov[0, 0])), 4),
        "decay_se": round(float(np.sqrt(cov[1, 1])), 3),
        "saturation_se": round(float(np.sqrt(cov[3, 3])), 4),
    }
    if clock_tau_s:
        out["after_prefill_clock_fraction"] = round(float(fit.x[2]), 4)
        out["clock_fraction_se"] = round(float(np.sqrt(cov[2, 2])), 4)
        out["after_prefill_clock_time_constant_s"] = clock_tau_s
    out["residual_rms_pct"] = round(100 * float(np.sqrt(np.mean(fit.fun**2))), 3)
    out["prefills"] = prefills
    out["iterations"] = len(fit.fun)
    return out


def clock_time_constant(smi_paths, duty_paths) -> dict:
    """decode.after_prefill_clock_time_constant_s from GPU clock logs (nvidia-smi every 100 ms: the device parts
    dutylong's smi.csv, dutysat's smi_dutysat.csv; one path or several) and the duty runs they were taken beside (their
    unix_s): after the last prefill of every block with prefills that a block at 0 follows, the SM clock's deficit
    below its top, by 0.1-s bins 0.1-0.5 s after the prefill's end (the first 0.1 s still holds the prefill's own
    drop); tau from a straight line through the log of the bins' means. `blocks`: the blocks a log covers."""
    import numpy as np
    import pandas as pd

    logs = []
    for path in [smi_paths] if isinstance(smi_paths, (str, Path)) else smi_paths:
        smi = pd.read_csv(path, skipinitialspace=True)
        smi.columns = [c.strip() for c in smi.columns]
        clock = next(c for c in smi.columns if c.startswith("clocks.current.sm") or c.startswith("clocks.sm"))
        when = pd.to_datetime(smi["timestamp"], format="%Y/%m/%d %H:%M:%S.%f").astype("datetime64[ns]")
        logs.append((when.astype("int64").to_numpy() / 1e9, smi[clock].to_numpy(np.float64)))
    unix = np.concatenate([t for t, _ in logs])
    deficit = max(float(c.max()) for _, c in logs) - np.concatenate([c for _, c in logs])
    dts, defs = [], []
    for path in duty_paths:
        d = pd.read_csv(path)
        for _, g in d.groupby(["set", "method", "batch_size"]):
            blocks = g.groupby("block")["duty"].first()
            for blk, duty in blocks.items():
                if duty <= 0 or blocks.get(blk + 1, 1.0) != 0:
                    continue
                first = g[(g["block"] == blk) & (g["k"] == 1)]
                end = float((first["unix_s"] - first["wall_s"]).max())
                near = (unix > end) & (unix < end + 0.6)
                if not near.any():  # no log beside this run
                    continue
                dts.append(unix[near] - end)
                defs.append(deficit[near])
    if not dts:
        raise ValueError("no block with prefills followed by one at 0 in the duty files")
    dt, df = np.concatenate(dts), np.concatenate(defs)
    bins = np.arange(0.1, 0.55, 0.1)
    means = np.array([df[(dt >= b - 0.05) & (dt < b + 0.05)].mean() for b in bins])
    ok = means > 0
    slope, _ = np.polyfit(bins[ok], np.log(means[ok]), 1)
    return {
        "after_prefill_clock_time_constant_s": round(float(-1.0 / slope), 3),
        "sm_clock_deficit_mhz": {f"{b:.1f}": round(float(m), 1) for b, m in zip(bins, means)},
        "blocks": len(dts),
    }


def prefill_pass_s(paths) -> dict:
    """What a pass of the loop through a prefill costs the CPU beyond a plain pass (prefill.host_serial_s_per_iteration:
    the simulator holds the shared GPU that long after a prefill batch's KV is encoded), from files that time the
    iterations on the host's clock: a duty file's t_s (each iteration's start: the CPU's time before iteration i is
    t_s[i] - t_s[i - 1] - wall_s[i - 1]) or a transient file's unix_s (after each iteration: unix_s[i] - unix_s[i - 1]
    - wall_s[i]). Per (file, set, method, batch): the mean of that time before the first iteration after a prefill, less
    the prefill's own (event_s), against its mean before the other iterations; the value is the mean over them, with
    its standard error. The probes' pass has the harness's prefill (the prompt's upload, the forward, the encode, the
    tokens read back) but not the live loop's admission and the link's submit, so it is the live loop's lower
    bound."""
    import numpy as np
    import pandas as pd

    extra = []
    for path in paths:
        d = pd.read_csv(path)
        for _, g in d.groupby(["set", "method", "batch_size"], sort=False):
            w, k, ev = g["wall_s"].to_numpy(), g["k"].to_numpy(), g["event_s"].to_numpy()
            if "block" in g:  # a duty file: t_s is the iteration's start, k counts from the last prefill
                t = g["t_s"].to_numpy()
                host = t[1:] - t[:-1] - w[:-1]
                same = g["block"].to_numpy()[1:] == g["block"].to_numpy()[:-1]
                after = same & (k[1:] == 1)
                plain = same & (k[1:] != 1)
            else:  # a transient file: unix_s after each iteration, k = 1 the first after the event
                host = np.diff(g["unix_s"].to_numpy()) - w[1:]
                after = (k[1:] == 1) & (g["event"].to_numpy()[1:] == "prefill")
                plain = k[1:] != 1
            if after.any() and plain.any():
                extra.append(float(np.mean(host[after] - ev[1:][after]) - np.mean(host[plain])))
    if not extra:
        raise ValueError("no file times its iterations on the host's clock with prefills between them")
    x = np.array(extra)
    sd = float(x.std(ddof=1) / np.sqrt(len(x))) if len(x) > 1 else float("nan")
    return {"prefill.host_serial_s_per_iteration": float(x.mean()), "stderr": sd, "settings": len(x)}


HOST_BOUND = ("baseline",)  # fit_xfer_prefill: the method whose prefill rows time the host floor alone (module doc)


def fit_xfer(paths, host_serial_s: float = 0.00063) -> dict:
    """network.link_busy_host_factor (a) and link_busy_host_factor_per_gbps (b) from xfer runs: per (set, method,
    rate, cycle) the mean cadence (an iteration's wall time and the loop gap before it) of the iterations that start
    10 ms or more into a long transfer, less that of the same cycle's iterations with no transfer (the start's
    burst left out), is the extra host time per iteration; least squares of extra = c0 + c1 x rate; a = 1 + c0 /
    host_serial_s, b = c1 / host_serial_s (the simulator multiplies the host terms, the h200g scenarios' 0.63 ms
    per iteration, by a + b x rate while the link moves KV). With standard errors; a below 1 is reported as
    estimated (the scenario field is bounded at 1)."""
    import numpy as np

    windows = _xfer_windows(_read_runs(paths), drop_hiccups=False)
    rates, extra = [w[0] for w in windows], [w[2] for w in windows]
    if len(set(rates)) < 2:
        raise ValueError("xfer runs at two rates or more are needed")
    y = np.array(extra)
    coef, se = _line(np.array(rates), y)
    return {
        "link_busy_host_factor": round(1.0 + float(coef[0]) / host_serial_s, 3),
        "link_busy_host_factor_per_gbps": round(float(coef[1]) / host_serial_s, 4),
        "stderr": [round(float(se[0]) / host_serial_s, 3), round(float(se[1]) / host_serial_s, 4)],
        "extra_s_per_iteration": [round(float(coef[0]), 6), round(float(coef[1]), 7)],
        "windows": len(y),
    }


def _xfer_windows(d, drop_hiccups: bool) -> list[tuple[float, int, float]]:
    """Per (run, set, method, rate, cycle, chunk) of xfer rows: the rate, the chunk and the extra host time per
    iteration, the mean cadence (an iteration's wall time and the loop gap before it) of the iterations that start
    10 ms or more into a long transfer less that of the cycle's iterations with no transfer (the start's burst left
    out; windows with fewer than 5 such iterations dropped). `drop_hiccups`: iterations over twice their window's
    median cadence (one of 60 ms among 9 ms ones) left out first."""
    d = d[(d["k"] > 1) & (d["event"] != "prefill")].assign(cadence_s=lambda x: x["wall_s"] + x["gap_s"])
    out = []
    for (_, _, _, rate, _, chunk), x in d.groupby(["run", "set", "method", "link_gbps", "cycle", "chunk_bytes"]):
        if drop_hiccups:
            x = x[x["cadence_s"] <= 2.0 * x["cadence_s"].median()]
        quiet = x[x["event"] == "none"]["cadence_s"]
        busy = x[(x["busy"] == 1) & (x["since_start_s"] >= 0.010)]["cadence_s"]
        if len(quiet) and len(busy) >= 5:
            out.append((float(rate), int(chunk), float(busy.mean() - quiet.mean())))
    return out


def fit_xfer_chunks(paths, ref_chunk_bytes: int = 1 << 20, max_gbps: float | None = None) -> dict:
    """network.link_busy_host_factor_chunk_share and link_busy_host_factor_max_chunks_per_s from xfer runs at two
    link chunks or more (--xfer-chunk-mib): each window's extra host time per iteration (fit_xfer's) by least
    squares of extra = c0 + c_bytes x rate (Gbps) + c_chunks x min(chunks per second, K) (thousands), K chosen on a
    grid by the least squared residual (`ceiling_interval_kchunks_s`: the grid's K within 4 residual variances of the
    best, about two standard errors; inf where that holds no ceiling at all). The share of the per-Gbps growth at
    `ref_chunk_bytes` (the chunk the scenarios' growths were measured with) that goes with chunks per second, below
    the ceiling, is c_chunks x its kchunks/s per Gbps over the whole growth there. Windows at rates above `max_gbps`
    left out where given, and iterations over twice their window's median (a host hiccup). With standard errors
    (at the chosen K), each chunk's own line (fit_xfer's, extra per Gbps in ms) and the residual rms."""
    import numpy as np

    d = _read_runs(paths, one_chunk=False)
    if max_gbps is not None:
        d = d[d["link_gbps"] <= max_gbps]
    windows = _xfer_windows(d, drop_hiccups=True)
    if len({w[1] for w in windows}) < 2:
        raise ValueError("xfer runs at two link chunks or more are needed (--xfer-chunk-mib)")
    rate, chunk, extra = (np.array(c, dtype=float) for c in zip(*windows))
    kcps = rate * 1e9 / 8 / chunk / 1e3

    def solve(ceiling: float):
        a = np.c_[np.ones(len(rate)), rate, np.minimum(kcps, ceiling)]
        coef, *_ = np.linalg.lstsq(a, extra, rcond=None)
        return a, coef, float(np.sum((extra - a @ coef) ** 2))

    grid = [float(k) for k in np.round(np.geomspace(0.5, 20.0, 49), 3)] + [math.inf]
    sse = {k: solve(k)[2] for k in grid}
    best = min(grid, key=lambda k: (sse[k], -k))
    var = sse[best] / max(len(extra) - 4, 1)
    near = [k for k in grid if sse[k] - sse[best] <= 4 * var]
    if math.inf in near:  # no ceiling fits as well, within about two standard errors: none
        best = math.inf
    a, coef, best_sse = solve(best)
    cov = var * np.linalg.inv(a.T @ a)
    per_gbps = 1e9 / 8 / ref_chunk_bytes / 1e3  # kchunks/s per Gbps at the reference chunk
    growth = coef[1] + coef[2] * per_gbps
    grad = np.array([0.0, -coef[2] * per_gbps, coef[1] * per_gbps]) / growth**2  # d share / d coef
    lines = {}
    for c in sorted(set(chunk.tolist())):
        m = chunk == c
        if len(set(rate[m].tolist())) >= 2:
            lc, lse = _line(rate[m], extra[m])
            lines[f"{c / (1 << 20):g} MiB"] = {
                "ms_per_gbps": round(float(lc[1]) * 1e3, 5),
                "se": round(float(lse[1]) * 1e3, 5),
            }
    return {
        "link_busy_host_factor_chunk_share": round(float(coef[2] * per_gbps / growth), 3),
        "stderr": round(float(np.sqrt(grad @ cov @ grad)), 3),
        "link_busy_host_factor_max_chunks_per_s": best * 1e3,
        "ceiling_interval_kchunks_s": [min(near), max(near)],
        "ref_chunk_bytes": ref_chunk_bytes,
        "extra_ms": {
            "intercept": round(float(coef[0]) * 1e3, 4),
            "per_gbps": round(float(coef[1]) * 1e3, 5),
            "per_kchunk_s": round(float(coef[2]) * 1e3, 5),
            "stderr": [round(float(x) * 1e3, 5) for x in np.sqrt(np.diag(cov))],
        },
        "lines": lines,
        "rms_ms": round(float(np.sqrt(best_sse / len(extra))) * 1e3, 4),
        "windows": len(extra),
    }


def _read_runs(paths, one_chunk: bool = True):
    """The rows of every file, each file a run of its own (column run: its place in `paths`; the fits pair rows
    within a run's cycles, never one run's idle rows with another's busy ones), and each row's time to pair (column
    timed_s: the forward alone, forward_s, where the file has it, else wall_s; column timing says which). The files
    must share one link chunk (column chunk_bytes; 1 MiB in files without it), else ValueError: the link thread does
    its work a chunk at a time, so the busy factor's slope per Gbps may differ by chunk, and a fit over two sizes
    would mix what may be two lines."""
    import pandas as pd

    frames = []
    for i, p in enumerate(paths):
        f = pd.read_csv(p)
        col = "forward_s" if "forward_s" in f.columns else "wall_s"
        if "chunk_bytes" not in f.columns:  # the files before --xfer-chunk-mib: 1 MiB chunks
            f = f.assign(chunk_bytes=1 << 20)
        frames.append(f.assign(run=i, timed_s=f[col], timing=col))
    d = pd.concat(frames, ignore_index=True)
    chunks = sorted(set(d["chunk_bytes"].astype(int)))
    if one_chunk and len(chunks) > 1:
        raise ValueError(f"xfer runs with several link chunks ({chunks} B): fit each chunk's files apart")
    return d


def _line(x, y):
    """Least squares of y = c0 + c1 x: the coefficients and their standard errors (from the scatter about it)."""
    import numpy as np

    a = np.c_[np.ones(len(x)), x]
    coef, *_ = np.linalg.lstsq(a, y, rcond=None)
    cov = float(np.sum((y - a @ coef) ** 2)) / max(len(y) - 2, 1) * np.linalg.inv(a.T @ a)
    return coef, np.sqrt(np.diag(cov))


def fit_xfer_prefill(paths) -> dict:
    """network.link_busy_prefill_host_factor (a) and its _per_gbps (b) from the xfer files' prefill rows: per (set,
    method, prompt length, rate, cycle) the prefill's time with a long transfer in flight over the same cycle's with
    the link idle (pairs whose transfer ended before the prefill did left out), and a least-squares line ratio =
    a + b x rate through each (set, method, prompt length)'s pairs (`lines`). The simulator multiplies the prefill's
    host floor by a + b x rate, not its GPU time nor its quantize step (that takes the general pair), so the value is
    the line of the pairs that time the floor alone (`HOST_BOUND`: the set with the most layers, FP16, the shortest
    prompt: its 32 layers wait on the host's launches, and FP16's quantize step is the packing of its KV, a millisecond
    or so; the 2-bit formats' steps and the 8-layer 70B's GPU time are in the others' timings). The forward's own
    seconds (forward_s) where a file has them, else the prefill's with its quantize step (wall_s): `timing` says
    which. Each file is a run of its own: its pairs are its own cycles' (_read_runs). With standard errors, the mean
    ratio per rate, and the pairs."""
    import numpy as np

    d = _read_runs(paths)
    if "prompt_tokens" not in d.columns:
        raise ValueError("no prefill rows (python -m realrun.transient --xfer-prefill)")
    d = d[d["event"] == "prefill"]
    pairs: dict[tuple, list[tuple[float, float]]] = {}
    for (_, set_name, method, tokens, rate, _), x in d.groupby(
        ["run", "set", "method", "prompt_tokens", "link_gbps", "cycle"]
    ):
        idle, busy = x[x["since_start_s"] < 0]["timed_s"], x[(x["since_start_s"] >= 0) & (x["busy"] == 1)]["timed_s"]
        if len(idle) and len(busy):
            pairs.setdefault((set_name, method, int(tokens)), []).append(
                (float(rate), float(busy.mean() / idle.mean()))
            )
    lines = {}
    for key, xy in sorted(pairs.items()):
        x, y = np.array(xy).T
        if len(set(x)) < 2:
            continue
        coef, se = _line(x, y)
        lines[" ".join(map(str, key))] = {
            "a": round(float(coef[0]), 3),
            "b": round(float(coef[1]), 4),
            "stderr": [round(float(se[0]), 3), round(float(se[1]), 4)],
            "mean_ratio_by_gbps": {f"{g:g}": round(float(y[x == g].mean()), 3) for g in sorted(set(x))},
            "pairs": len(y),
        }
    if not lines:
        raise ValueError("prefill pairs at two rates or more are needed")
    layers = max(int(k[0].rsplit(":", 1)[1]) for k in pairs)
    bound = [k for k in pairs if int(k[0].rsplit(":", 1)[1]) == layers and k[1] == HOST_BOUND[0]]
    if not bound:
        raise ValueError(f"no {HOST_BOUND[0]} prefill rows in the set with the most layers ({layers})")
    key = min(bound, key=lambda k: k[2])
    v = lines[" ".join(map(str, key))]
    return {
        "link_busy_prefill_host_factor": v["a"],
        "link_busy_prefill_host_factor_per_gbps": v["b"],
        "stderr": v["stderr"],
        "from": " ".join(map(str, key)),
        "timing": "+".join(sorted(set(d["timing"]))),
        "lines": lines,
    }


def _summary(rows: list[dict], gap: int) -> str:
    """Per event: the mean of k = 1..4 against the same window's last half, in %."""
    import statistics

    out = []
    for ev in sorted({(r["event"], r["event_tokens"]) for r in rows if r["event"] != "dense"}):
        dev = {k: [] for k in range(1, 5)}
        for cyc in sorted({r["cycle"] for r in rows}):
            w = [r for r in rows if (r["event"], r["event_tokens"]) == ev and r["cycle"] == cyc]
            ref = statistics.median([r["wall_s"] for r in w if r["k"] > gap // 2] or [float("nan")])
            for r in w:
                if r["k"] in dev:
                    dev[r["k"]].append(r["wall_s"] / ref - 1)
        out.append(f"{ev[0]}{ev[1] or ''} " + "/".join(f"{statistics.mean(v) * 100:+.1f}" for v in dev.values() if v))
    return "; ".join(out)


if __name__ == "__main__":
    sys.exit(main())
