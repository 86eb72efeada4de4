"""Measured runs made by the simulator at known engine parameters, for the calibration tests: realrun traces
(requests.csv, iterations.csv, meta.json) and the benchmark files of vLLM, SGLang and AIPerf, written in each
format's documented fields (simulator/engine_logs.py) from the simulated requests and their decode iterations."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import numpy as np
import pandas as pd
import yaml

from realrun.trace import REQUEST_COLUMNS
from simulator.config import parse_scenario
from simulator.decode import iteration_rows
from simulator.engine import apply_values
from simulator.run import MethodRun, resolve
from simulator.workload import make_requests

ROOT = Path(__file__).resolve().parent.parent
BASE = ROOT / "scenarios" / "measured" / "h200g_8b_sat.yaml"

# what the "engine" really does: every value differs from the scenario file's (BASE)
TRUE = {
    "decode.host_serial_s_per_iteration": 0.0004,
    "decode.join_s_per_request": 0.001,
    "decode.leave_s_per_request": 0.0006,
    "prefill.prefill_efficiency": 0.8,
    "prefill.host_issue_s_per_iteration": 0.0025,
    "prefill.host_serial_s_per_iteration": 0.0007,
    "network.efficiency": 0.7,
    "network.latency_s": 0.002,
    "methods.baseline.quantize_issue_s_per_layer": 4e-5,
    "methods.kvquant.quantize_issue_s_per_layer": 3e-4,
    "methods.kvquant.dequantize": 1.5,
    "methods.kvquant.prefill_issue_s_per_layer": 1e-4,
    "methods.hack.quantize_issue_s_per_layer": 2e-4,
    "methods.hack.approximation": 1.3,
    "methods.hack.prefill_issue_s_per_layer": 4e-4,
    "methods.hack.decode_kernels_per_layer": 4.0,
}


def raw_system(
    seed: int = 3,
    layers: int | None = None,
    gbps: float = 10,
    rate_rps: float = 6.0,
    n: int = 80,
    link_busy: bool = True,
    clock: bool = False,
) -> dict:
    """BASE's system (one shared H200, realrun's harness) with a small workload of its own; link_busy False: without
    its host level while the link moves KV (network.link_busy_host_factor: an engine's benchmark file has no
    transfer times, so a fit from one cannot see that level) and without the decode slowdown after a prefill
    (decode.after_prefill_slowdown_fraction: nor has it the prefills' times). Without the prefills' clock slowdown
    (decode.after_prefill_clock_fraction) unless `clock`: the simulator prices its fade per segment, a trace's items
    exactly, so they agree to about 1 % of its seconds, not to rounding (test_after_prefill)."""
    raw = yaml.safe_load(BASE.read_text())
    if not clock:
        raw["decode"] = {k: v for k, v in raw["decode"].items() if not k.startswith("after_prefill_clock")}
    if not link_busy:
        raw["network"] = {k: v for k, v in raw["network"].items() if not k.startswith("link_busy")}
        # nor a prefill's own times, which the decode slowdown after it is counted from
        raw["decode"] = {k: v for k, v in raw["decode"].items() if not k.startswith("after_prefill")}
    raw["workload"] = {
        "input_tokens": {"kind": "uniform", "min_tokens": 64, "max_tokens": 4096},
        "output_tokens": {"kind": "uniform", "min_tokens": 16, "max_tokens": 96},
        "arrival": {"kind": "poisson", "rate_rps": rate_rps},
        "requests": n,
        "seed": seed,
    }
    raw["network"]["bandwidth_gbps"] = gbps
    # the fluid link: a fit finds the link's efficiency and latency exactly there; on BASE's round robin of 1 MiB
    # chunks the chunks' order jumps as the rate moves, which leaves the fit's efficiency within about 1 % and its
    # latency within about half a millisecond (tests/test_link_round_robin.py checks that link on its own)
    raw["network"]["round_robin_chunk_bytes"] = 0
    if layers is not None:
        raw["model"] = {"preset": "llama-3.1-8b", "layers": layers}
    return raw


def simulate(
    raw: dict, truth: dict[str, float], methods: list[str] | None = None
) -> list[tuple[str, pd.DataFrame, pd.DataFrame]]:
    """The system of `raw` run with the engine parameters `truth`: per method, its requests and its decode
    iterations (start, end, batch size, context)."""
    raw = copy.deepcopy(raw)
    if methods is not None:
        raw["methods"] = [m for m in raw["methods"] if (m if isinstance(m, str) else m["name"]) in methods]
    s = apply_values(parse_scenario(raw, "test"), truth)
    res, reqs = resolve(s, "test"), make_requests(s)
    out = []
    for cfg in s.methods:
        run = MethodRun(res, cfg, reqs, "test")
        run.records.iteration_log = []
        run.simulate()
        it = pd.DataFrame(
            iteration_rows(run.records.iteration_log), columns=["start_s", "end_s", "batch_size", "context_tokens"]
        )
        out.append((cfg.output_name, run.requests_frame(), it))
    return out


def write_realrun(folder: Path, method: str, df: pd.DataFrame, it: pd.DataFrame) -> Path:
    folder.mkdir(parents=True)
    df[REQUEST_COLUMNS].to_csv(folder / "requests.csv", index=False)
    it.to_csv(folder / "iterations.csv", index=False)
    (folder / "meta.json").write_text(json.dumps({"method": method, "decode_mode": "graphs"}))
    return folder


def token_times(df: pd.DataFrame, it: pd.DataFrame, serial_s: float) -> list[np.ndarray]:
    """Per request, when each output token came out: the first at first_token_s (the prefill's, ttft_at prefill),
    then one at the end of each decode iteration it ran in (from its decode start to its finish), the CPU work
    after it included (iterations.csv rows end before it: simulator/decode.iteration_rows)."""
    start, end = it["start_s"].to_numpy(), it["end_s"].to_numpy() + serial_s
    out = []
    for first, join, finish, n in zip(df["first_token_s"], df["decode_start_s"], df["finish_s"], df["output_tokens"]):
        ends = end[(start >= join - 1e-12) & (end <= finish + 1e-9)]
        t = np.concatenate([[first], ends])
        assert len(t) == n, (len(t), n)  # one token per iteration: the log and the requests agree
        out.append(t)
    return out


def bench_lists(
    df: pd.DataFrame, it: pd.DataFrame | None, noise: float = 0.0, seed: int = 0, serial_s: float | None = None
) -> dict:
    """The per-request lists vLLM's and SGLang's benchmarks save (seconds), from a simulated run; each gap times
    lognormal noise of `noise` (the client's clock and the network), the latency their sum. Without the run's
    iterations (`it` None: a run of several replicas), no gaps: every request one chunk after its first token.
    `serial_s`: the loop gap the run was made with (TRUE's unless given)."""
    rng = np.random.default_rng(seed)
    ttft = (df["first_token_s"] - df["arrival_s"]).to_numpy()
    if it is None:
        return {
            "input_lens": df["prompt_tokens"].astype(int).tolist(),
            "output_lens": df["output_tokens"].astype(int).tolist(),
            "ttfts": ttft.tolist(),
            "itls": [[] for _ in range(len(df))],
            "latencies": (df["finish_s"] - df["arrival_s"]).tolist(),
            "errors": [""] * len(df),
        }
    times = token_times(df, it, TRUE["decode.host_serial_s_per_iteration"] if serial_s is None else serial_s)
    itls = []
    for t in times:
        g = np.diff(t)
        itls.append((g * rng.lognormal(0.0, noise, len(g)) if noise else g).tolist())
    latency = [float(f + sum(g)) for f, g in zip(ttft, itls)]
    return {
        "input_lens": df["prompt_tokens"].astype(int).tolist(),
        "output_lens": df["output_tokens"].astype(int).tolist(),
        "ttfts": ttft.tolist(),
        "itls": itls,
        "latencies": latency,
        "errors": [""] * len(df),
    }


def write_vllm(
    path: Path,
    df: pd.DataFrame,
    it: pd.DataFrame | None,
    rate: float,
    noise: float = 0.0,
    serial_s: float | None = None,
) -> Path:
    """`vllm bench serve --save-result --save-detailed`'s JSON (vllm/benchmarks/serve.py): start_times on the
    client's perf_counter clock (an arbitrary origin)."""
    doc = {"backend": "vllm", "model_id": "meta-llama/Llama-3.1-8B-Instruct", "request_rate": rate, "burstiness": 1.0}
    doc["max_concurrency"] = None
    doc.update(bench_lists(df, it, noise, serial_s=serial_s))
    doc["start_times"] = (df["arrival_s"].to_numpy() + 1234.5).tolist()
    path.write_text(json.dumps(doc))
    return path


def write_sglang(path: Path, df: pd.DataFrame, it: pd.DataFrame, noise: float = 0.0) -> Path:
    """`python -m sglang.bench_serving --output-details`'s JSONL line (python/sglang/bench_serving.py): no send
    times and no latencies; request_rate inf (every request sent at once: the run must arrive all at 0)."""
    assert (df["arrival_s"] == 0).all()
    doc = {"backend": "sglang", "dataset_name": "random", "request_rate": float("inf"), "max_concurrency": None}
    lists = bench_lists(df, it, noise)
    lists.pop("latencies")
    doc.update(lists)
    path.write_text(
        '{"backend": "sglang", "note": "an earlier run", "input_lens": [1], "output_lens": [1], '
        '"ttfts": [1.0], "itls": [[]], "errors": [""]}\n' + json.dumps(doc) + "\n"
    )
    return path


def write_aiperf(
    path: Path, df: pd.DataFrame, it: pd.DataFrame, noise: float = 0.0, serial_s: float | None = None
) -> Path:
    """AIPerf's profile_export.jsonl (docs/tutorials/working-with-profile-exports.md): one record per request,
    times in ms, the start in epoch ns; records in completion order, as the record processors write them."""
    lists = bench_lists(df, it, noise, serial_s=serial_s)
    recs = []
    for i in range(len(df)):
        start_ns = 1_759_813_207_000_000_000 + int(round(df["arrival_s"].iloc[i] * 1e9))
        recs.append(
            (
                lists["latencies"][i] + df["arrival_s"].iloc[i],
                {
                    "metadata": {"session_num": i, "request_start_ns": start_ns, "benchmark_phase": "profiling"},
                    "metrics": {
                        "input_sequence_length": {"value": lists["input_lens"][i], "unit": "tokens"},
                        "time_to_first_token": {"value": lists["ttfts"][i] * 1e3, "unit": "ms"},
                        "request_latency": {"value": lists["latencies"][i] * 1e3, "unit": "ms"},
                        "output_sequence_length": {"value": lists["output_lens"][i], "unit": "tokens"},
                        "inter_chunk_latency": {"value": [g * 1e3 for g in lists["itls"][i]], "unit": "ms"},
                    },
                    "error": None,
                },
            )
        )
    recs.sort(key=lambda r: r[0])
    path.write_text("".join(json.dumps(r) + "\n" for _, r in recs))
    return path
