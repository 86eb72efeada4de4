"""The README's worked example, generated from one fresh run of the default scenario, and its two short
examples (one engine on one GPU, a DP x EP MoE model), each from a fresh run of its scenario.

    python -m scripts.readme_example           # rewrite the README's example blocks (make readme-example)
    python -m scripts.readme_example --check   # exit 1 if a block is not what a fresh run gives

The block (between the README's `[start:example]` and `[end:example]` markers, which the manual's home page
includes too) is `make run`'s table for scenarios/a10g_10gbps.yaml and the text under it; every figure in that text
comes from the same run, and the scenario's description from the scenario itself. So whoever changes pricing
refreshes it with one command, and tests/test_readme_example.py fails while it is stale.

The short examples (between `[start:one-gpu]` / `[end:one-gpu]` and `[start:moe]` / `[end:moe]`) are a command,
what it prints and one sentence, its figures from the same run and its claims checked the same way.

The text also makes claims that are not figures (the setting is prefill-bound, the transfer is nearly all of
the compressed formats' lead, dequantization costs little). `claims_failing` checks each against the run before
anything is written: when one stops holding, the command stops and names it, and the prose needs rewriting, not
regenerating.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import math
import re
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from simulator.config import Scenario

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
SCENARIO = "scenarios/a10g_10gbps.yaml"  # the Makefile's default SCENARIO, what `make run` simulates
OUT = "out/default"  # where `make run` writes
START = "<!-- --8<-- [start:example] -->"  # the worked example's markers
END = "<!-- --8<-- [end:example] -->"
TWO_BIT = ("cachegen", "kvquant", "hack")  # the formats the text calls 2-bit, against FP16 (baseline) and FP8
WIDTH = 112  # the README's prose lines
U = "\x1f"  # joins a figure to its unit while the text is wrapped
NUMBERS = {1: "one", 2: "two", 3: "three", 4: "four", 5: "five", 6: "six", 7: "seven", 8: "eight"}


@dataclass
class Run:
    scenario: Scenario  # presets resolved
    summary: dict  # summary.json's content
    table: str  # what `make run` prints
    prompt_tokens_mean: float
    output_tokens_mean: float


def run_default() -> Run:
    """The default scenario, simulated as `make run` simulates it."""
    import cli
    from simulator.load import load_scenario
    from simulator.run import run_scenario

    cfg = load_scenario(ROOT / SCENARIO)
    result = run_scenario(cfg, source=SCENARIO)
    with contextlib.redirect_stdout(io.StringIO()):  # the table as printed to a pipe: plain, fixed width
        table = cli.format_table(result.summary)
    first = result.requests[result.requests["method"] == next(iter(result.summary["methods"]))]
    return Run(cfg, result.summary, table, float(first["prompt_tokens"].mean()), float(first["output_tokens"].mean()))


def span(values, fmt: str) -> str:
    """The range of `values` as the text quotes it: `lo–hi`, or one figure when both ends print alike."""
    lo, hi = format(min(values), fmt), format(max(values), fmt)
    return lo if lo == hi else f"{lo}–{hi}"


def percent_span(fractions) -> str:
    """Busy fractions as whole percent, rounded outwards, so the quoted range holds every value."""
    return span([math.floor(100 * min(fractions)), math.ceil(100 * max(fractions))], "d")


def claims_failing(summary: dict) -> list[str]:
    """The text's claims that the run does not bear out (none, while the text is right)."""
    ms = summary["methods"]
    base = ms.get("baseline")
    failing = []
    if base is None or any(name not in ms for name in (*TWO_BIT, "fp8")):
        return [f"the text compares baseline, fp8 and {', '.join(TWO_BIT)}; the run has {', '.join(ms)}"]
    for name, m in ms.items():
        u = m["utilisation"]
        if not u["prefill"] > max(u["network"], u["decode"]):
            failing.append(f"prefill-bound: {name}'s busiest pool is not prefill ({u})")
        if m["ttft_s"]["mean"] < 0.9 * m["jct_s"]["mean"]:
            failing.append(f"TTFT nearly all of the JCT: {name}'s TTFT is under 90 % of its JCT")
        b = m["breakdown_s"]
        if b["dequantize"] + b["approximation"] > 0.01 * m["jct_s"]["mean"]:
            failing.append(f"dequantization and approximation cost little: over 1 % of {name}'s JCT")
        if name == "baseline":
            continue
        lead_s = base["jct_s"]["mean"] - m["jct_s"]["mean"]
        saved_s = base["breakdown_s"]["transfer"] - b["transfer"]
        if not (lead_s > 0 and 0.8 * lead_s <= saved_s <= 1.25 * lead_s):
            failing.append(
                f"the transfer is nearly all of the lead: {name} leads FP16 by {lead_s:.2f} s of JCT, "
                f"saves {saved_s:.2f} s of transfer"
            )
    return failing


def _gpu(pool) -> str:
    return pool.gpu.name.removeprefix("NVIDIA ")


def _instances_per_replica(pool) -> int:
    import catalog

    per_instance = catalog.load("instances")[pool.instance]["gpus"]
    return math.ceil(pool.tensor_parallel * pool.pipeline_parallel / per_instance)


def _count(n: int) -> str:
    return NUMBERS.get(n, str(n))


def _wrap(text: str) -> str:
    """One paragraph, wrapped at WIDTH; a figure stays on the line of its unit (joined by U until wrapped)."""
    text = textwrap.fill(re.sub(r"[ \n]+", " ", text.strip()), WIDTH, break_long_words=False, break_on_hyphens=False)
    return text.replace(U, " ")


def example_block(run: Run) -> str:
    """The README's example block (between its markers) for `run`."""
    import catalog
    from simulator.config import PoissonArrivals

    s, ms = run.scenario, run.summary["methods"]
    p, d, w = s.prefill, s.decode, s.workload
    arrival = w.arrival
    if not isinstance(arrival, PoissonArrivals) or w.dataset is None:
        raise ValueError(f"{SCENARIO}: the text describes Poisson arrivals of a catalog dataset's lengths")
    dataset = catalog.load("workloads")[w.dataset]["name"].split(" (")[0]
    bandwidth = f"{s.network.bandwidth_gbps:g}{U}Gbps"
    prefill_gpus, decode_gpus = p.tensor_parallel * p.pipeline_parallel, d.tensor_parallel * d.pipeline_parallel
    each, base, hack = list(ms.values()), ms["baseline"], ms["hack"]
    leads = [100 * (1 - m["jct_s"]["mean"] / base["jct_s"]["mean"]) for n, m in ms.items() if n != "baseline"]
    setting = f"""
        `make run` simulates `{SCENARIO}`, HACK's main setting: {s.model.name}, {_count(p.replicas)} prefill
        replicas of {_count(_instances_per_replica(p))} {p.instance} each ({prefill_gpus}×{_gpu(p)},
        TP{p.tensor_parallel}×PP{p.pipeline_parallel}), decode on {_count(d.replicas)} {d.instance}
        ({decode_gpus}×{_gpu(d)} each), {bandwidth} between them, {w.requests} {dataset}-length prompts
        ({run.prompt_tokens_mean / 1000:.1f}K tokens on average, {run.output_tokens_mean:.0f} output tokens)
        arriving as a Poisson process at {arrival.rate_rps:g}{U}req/s. It prints one row per method (times are
        means over the requests; `transfer`, `dequant` and `approx` are per-request means of those breakdown
        parts; `KV B/tok` is the KV on the wire per token; `peak GiB` the decode KV memory at its peak):"""
    shows = f"""
        What it shows: this setting is prefill-bound. A prompt takes
        {span([m["breakdown_s"]["prefill"] for m in each], ".1f")}{U}s to prefill on the {_gpu(p)} pool after
        {span([m["breakdown_s"]["prefill_queue"] for m in each], ".1f")}{U}s in the prefill queue on average
        (`summary.json`, `breakdown_s`); the prefill pool is
        {percent_span([m["utilisation"]["prefill"] for m in each])}{U}% busy while the
        {d.replicas * decode_gpus} GPUs of the decode pool are at most
        {math.ceil(100 * max(m["utilisation"]["decode"] for m in each))}{U}% busy (the two lines under the
        table, from `utilisation`), so TTFT is nearly all of the JCT. What a compressed KV cache changes here is the transfer over the {bandwidth}
        link: {base["breakdown_s"]["transfer"]:.2f}{U}s in FP16,
        {span([ms[n]["breakdown_s"]["transfer"] for n in TWO_BIT], ".2f")}{U}s in the 2-bit formats (CacheGen,
        KVQuant, HACK), {ms["fp8"]["breakdown_s"]["transfer"]:.2f}{U}s in FP8; that is nearly all of their
        {span(leads, ".1f")}{U}% lead (HACK against FP16:
        {base["jct_s"]["mean"] - hack["jct_s"]["mean"]:.1f}{U}s of JCT,
        {base["breakdown_s"]["transfer"] - hack["breakdown_s"]["transfer"]:.1f}{U}s of transfer). Decode is short
        ({run.output_tokens_mean:.0f}{U}tokens at {span([1e3 * m["tpot_s"]["mean"] for m in each], ".1f")}{U}ms
        each), so dequantization and HACK's approximation cost little. `{OUT}/report.html` shows the same run
        as figures: the JCT breakdown per method, latency CDFs, decode memory and link throughput over time."""
    output = f"{run.table.rstrip()}\nwrote {OUT}/summary.json, requests.csv, memory.csv, links.csv, report.html"
    return f"{_wrap(setting)}\n\n```text\n{output}\n```\n\n{_wrap(shows)}\n"


# ---- the short examples: one engine on one GPU, a DP x EP MoE model --------------------------------------
@dataclass
class Short:
    """A short example: `hacksim simulate NAME`'s output and one sentence, from one run of scenarios/NAME.yaml."""

    name: str  # the scenario's name (scenarios/NAME.yaml), and the command's argument
    marker: str  # the README's markers: [start:MARKER] ... [end:MARKER]


ONE_GPU = Short("one_gpu_vllm", "one-gpu")
MOE = Short("moe_dp_ep", "moe")
SHORTS = (ONE_GPU, MOE)


def run_short(short: Short) -> tuple[Scenario, dict, str]:
    """(the scenario, summary.json's content, what `hacksim simulate NAME` prints) for one short example."""
    import cli
    from simulator.load import load_scenario
    from simulator.run import run_scenario

    path = f"scenarios/{short.name}.yaml"
    cfg = load_scenario(ROOT / path)
    result = run_scenario(cfg, source=path)
    with contextlib.redirect_stdout(io.StringIO()):
        table = cli.format_table(result.summary, cfg.placement)
    return cfg, result.summary, table


def _jct_share(m: dict, parts: tuple[str, ...]) -> float:
    return sum(m["breakdown_s"][k] for k in parts) / m["jct_s"]["mean"]


DECODE_PARTS = ("decode_queue", "decode", "dequantize", "approximation", "preemption")


def short_claims_failing(short: Short, summary: dict) -> list[str]:
    """The sentence's claims that the run does not bear out (none, while the sentence is right)."""
    ms = summary["methods"]
    base = ms.get("baseline")
    if base is None:
        return [f"{short.name}: the sentence compares with baseline; the run has {', '.join(ms)}"]
    failing = []
    if short is ONE_GPU:
        if any(name not in ms for name in ("fp8", "kvquant", "hack")):
            return [f"{short.name}: the sentence names fp8, kvquant and hack; the run has {', '.join(ms)}"]
        for name, m in ms.items():
            if _jct_share(m, DECODE_PARTS) < 0.8:
                failing.append(f"decode is most of the JCT: under 80 % of {name}'s")
            if m["breakdown_s"]["transfer"] != 0:
                failing.append(f"nothing crosses a network: {name} has a transfer")
        if not ms["fp8"]["jct_s"]["mean"] < base["jct_s"]["mean"]:
            failing.append("FP8 is faster than FP16: it is not")
        if 2 * ms["fp8"]["kv_bytes_per_token"]["memory"] != base["kv_bytes_per_token"]["memory"]:
            failing.append("FP8 KV reads half the bytes: its KV bytes per token are not half of FP16's")
        for name in ("kvquant", "hack"):
            if not ms[name]["tpot_s"]["mean"] > base["tpot_s"]["mean"]:
                failing.append(f"the 2-bit formats' decode steps cost more: {name}'s TPOT is not above FP16's")
    else:
        for name, m in ms.items():
            if name == "baseline":
                continue
            lead_s = base["jct_s"]["mean"] - m["jct_s"]["mean"]
            saved_s = base["breakdown_s"]["transfer"] - m["breakdown_s"]["transfer"]
            if not (lead_s > 0 and 0.8 * lead_s <= saved_s <= 1.25 * lead_s):
                failing.append(
                    f"the transfer is nearly all of the lead: {name} leads FP16 by {lead_s:.2f} s of JCT, "
                    f"saves {saved_s:.2f} s of transfer"
                )
    return failing


def short_block(short: Short, cfg: Scenario, summary: dict, table: str) -> str:
    """The README's block for a short example: the command, its output, one sentence."""
    ms = summary["methods"]
    each, base = list(ms.values()), ms["baseline"]
    d = cfg.decode
    if short is ONE_GPU:
        sentence = f"""
            One vLLM engine on one {_gpu(d)} serves both phases ({cfg.model.name}, `vllm serve`'s step limits:
            {d.max_batch_tokens}{U}tokens and {d.max_batch_requests}{U}requests a step, decode rows first, then
            chunks of waiting prompts). TTFT stays short
            ({span([m["ttft_s"]["mean"] for m in each], ".2f")}{U}s) and decode is
            {span([100 * _jct_share(m, DECODE_PARTS) for m in each], ".0f")}{U}% of the JCT, its steps stretched by the
            prefill chunks beside them; FP8 KV reads half the bytes and is
            {100 * (1 - ms["fp8"]["jct_s"]["mean"] / base["jct_s"]["mean"]):.1f}{U}% faster, while with no network
            to cross the 2-bit formats only add work to each step (TPOT
            {1e3 * ms["hack"]["tpot_s"]["mean"]:.1f}{U}ms with HACK, {1e3 * ms["kvquant"]["tpot_s"]["mean"]:.1f}{U}ms
            with KVQuant, against {1e3 * base["tpot_s"]["mean"]:.1f}{U}ms in FP16)."""
    else:
        p = cfg.prefill
        assert p is not None  # moe_dp_ep has a prefill pool
        leads = [100 * (1 - m["jct_s"]["mean"] / base["jct_s"]["mean"]) for n, m in ms.items() if n != "baseline"]
        others = [m["breakdown_s"]["transfer"] for n, m in ms.items() if n not in ("baseline", "fp8")]
        sentence = f"""
            {cfg.model.name} decoded by {d.data_parallel} engines of one {_gpu(d)} each (data-parallel attention,
            each with its own KV pool and requests) whose experts are spread over all {d.data_parallel} GPUs
            (expert parallelism: two all-to-alls per layer), fed by {_gpu(p)} prefill over
            {cfg.network.bandwidth_gbps:g}{U}Gbps: the compressed formats cut the FP16 transfer of
            {base["breakdown_s"]["transfer"]:.2f}{U}s to {span(others, ".2f")}{U}s (FP8:
            {ms["fp8"]["breakdown_s"]["transfer"]:.2f}{U}s), nearly all of their {span(leads, ".1f")}{U}% lead;
            `--set decode.data_parallel=1 --set decode.tensor_parallel=8` runs the same GPUs as one TP{U}8
            engine ([Serving policies](docs/serving.md) compares them)."""
    command = f"$ .venv/bin/hacksim simulate {short.name}"
    return f"```text\n{command}\n{table.rstrip()}\n```\n\n{_wrap(sentence)}\n"


def readme_block(text: str, marker: str = "example") -> str:
    """The README's block between the markers [start:MARKER] and [end:MARKER]."""
    start, end = _markers(marker)
    m = re.search(re.escape(start) + r"\n(.*?)" + re.escape(end), text, flags=re.S)
    if m is None:
        raise ValueError(f"{README.name}: no block between {start} and {end}")
    return m.group(1)


def with_block(text: str, block: str, marker: str = "example") -> str:
    """`text` with `block` between its MARKER markers."""
    start, end = _markers(marker)
    return text[: text.index(start) + len(start)] + "\n" + block + text[text.index(end) :]


def _markers(marker: str) -> tuple[str, str]:
    return f"<!-- --8<-- [start:{marker}] -->", f"<!-- --8<-- [end:{marker}] -->"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="the README's worked example, from a fresh run of the default scenario")
    ap.add_argument("--check", action="store_true", help="exit 1 if the README's block is stale; write nothing")
    args = ap.parse_args(argv)
    run = run_default()
    failing = claims_failing(run.summary)
    blocks = {"example": (SCENARIO, lambda: example_block(run))}
    for short in SHORTS:
        cfg, summary, table = run_short(short)
        failing += short_claims_failing(short, summary)
        blocks[short.marker] = (
            f"scenarios/{short.name}.yaml",
            lambda s=short, c=cfg, m=summary, t=table: short_block(s, c, m, t),
        )
    if failing:
        print("the README's text no longer holds; rewrite it (scripts/readme_example.py):", file=sys.stderr)
        for claim in failing:
            print(f"  {claim}", file=sys.stderr)
        return 1
    text = README.read_text()
    stale = []
    for marker, (source, make) in blocks.items():
        block = make()
        if readme_block(text, marker) != block:
            stale.append(source)
            text = with_block(text, block, marker)
    if not stale:
        print(f"{README.name}: the examples match fresh runs of {', '.join(s for s, _ in blocks.values())}")
        return 0
    if args.check:
        print(f"{README.name}: stale examples ({', '.join(stale)}); run `make readme-example`", file=sys.stderr)
        return 1
    README.write_text(text)
    print(f"{README.name}: rewrote the examples of {', '.join(stale)} from fresh runs")
    return 0


if __name__ == "__main__":
    sys.exit(main())
