"""The README's worked example, generated from one fresh run of the default scenario.

    python -m scripts.readme_example           # rewrite the README's example block (make readme-example)
    python -m scripts.readme_example --check   # exit 1 if the README's block is not what a fresh run gives

The block (between the README's `[start:example]` and `[end:example]` markers, which the manual's home page
includes too) is `make run`'s table for scenarios/a10g_10gbps.yaml and the text under it; every figure in that text
comes from the same run, and the scenario's description from the scenario itself. So whoever changes pricing
refreshes it with one command, and tests/test_readme_example.py fails while it is stale.

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
START = "<!-- --8<-- [start:example] -->"
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


def readme_block(text: str) -> str:
    """The README's example block, between its markers."""
    m = re.search(re.escape(START) + r"\n(.*?)" + re.escape(END), text, flags=re.S)
    if m is None:
        raise ValueError(f"{README.name}: no block between {START} and {END}")
    return m.group(1)


def with_block(text: str, block: str) -> str:
    """`text` with `block` between its example markers."""
    return text[: text.index(START) + len(START)] + "\n" + block + text[text.index(END) :]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="the README's worked example, from a fresh run of the default scenario")
    ap.add_argument("--check", action="store_true", help="exit 1 if the README's block is stale; write nothing")
    args = ap.parse_args(argv)
    run = run_default()
    failing = claims_failing(run.summary)
    if failing:
        print("the README's text no longer holds; rewrite it (scripts/readme_example.py):", file=sys.stderr)
        for claim in failing:
            print(f"  {claim}", file=sys.stderr)
        return 1
    text = README.read_text()
    block = example_block(run)
    if readme_block(text) == block:
        print(f"{README.name}: the worked example matches a fresh run of {SCENARIO}")
        return 0
    if args.check:
        print(f"{README.name}: the worked example is stale; run `make readme-example`", file=sys.stderr)
        return 1
    README.write_text(with_block(text, block))
    print(f"{README.name}: rewrote the worked example from a fresh run of {SCENARIO}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
