"""Measured runs from engines' own benchmarks (simulator/engine_logs.py): each format read from a small file made
here by hand; a simulated run written in each format validates to zero error against the system that made it;
fits from per-request timings with noise recover the engine parameters the runs identify; what a format lacks is
said, not made up."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml

from simulated_runs import TRUE, raw_system, simulate, write_aiperf, write_sglang, write_vllm
from simulator.calibrate import fit_engine, load_index
from simulator.config import ScenarioError, parse_scenario
from simulator.engine import FACTOR_PRIOR_WIDTH, PARAMETERS, apply_values
from simulator.engine_logs import read_engine_log
from simulator.fit_items import Timeline, joined_at, token_times
from simulator.validate import validate

KVQUANT = {"name": "kvquant", "outlier_fraction": 0.0052083, "dequant_kernel": "unfused"}


# ---- the readers, on files written by hand ------------------------------------------------------------
VLLM = {
    "backend": "vllm",
    "model_id": "meta-llama/Llama-3.1-8B-Instruct",
    "request_rate": 2.0,
    "max_concurrency": None,
    "input_lens": [100, 200, 300],
    "output_lens": [3, 0, 4],
    "ttfts": [0.1, 0.0, 0.2],
    "itls": [[0.01, 0.02], [], [0.01, 0.01, 0.03]],
    "latencies": [0.13, 0.0, 0.25],
    "errors": ["", "TimeoutError", ""],
    "start_times": [1005.0, 1005.1, 1004.5],
}


def test_vllm_detailed_result_in_send_order_failed_requests_left_out(tmp_path):
    path = tmp_path / "vllm.json"
    path.write_text(json.dumps(VLLM))
    log = read_engine_log(path)
    assert log.format == "vllm" and log.sends_known
    # request 3 was sent first (perf_counter 1004.5): send order, from the first send; the failed one is gone
    assert log.send_s.tolist() == [0.0, 0.5]
    assert log.prompt_tokens.tolist() == [300, 100] and log.output_tokens.tolist() == [4, 3]
    assert log.ttft_s.tolist() == [0.2, 0.1] and log.latency_s.tolist() == [0.25, 0.13]
    assert [g.tolist() for g in log.itl_s] == [[0.01, 0.01, 0.03], [0.01, 0.02]]
    assert log.per_token().tolist() == [True, True]
    f = log.frame()
    assert f["first_token_s"].tolist() == pytest.approx([0.2, 0.6]) and f["finish_s"].tolist() == pytest.approx(
        [0.25, 0.63]
    )


def test_derived_benchmarks_e2els_and_failures_kept_apart(tmp_path):
    """A benchmark derived from vLLM's that writes the latencies as `e2els` and lists only the served requests, with the
    failures' messages apart in a shorter `errors`: the same requests as the served two of VLLM, and notes saying so."""
    keep = [0, 2]
    doc = {k: [VLLM[k][i] for i in keep] for k in ("input_lens", "output_lens", "ttfts", "itls", "start_times")}
    doc |= {"model_id": "m", "request_rate": 2.0, "e2els": [VLLM["latencies"][i] for i in keep], "errors": ["Timeout"]}
    path = tmp_path / "derived.json"
    path.write_text(json.dumps(doc))
    log = read_engine_log(path)
    ref = tmp_path / "vllm.json"
    ref.write_text(json.dumps(VLLM))
    want = read_engine_log(ref)
    assert log.format == "vllm" and log.prompt_tokens.tolist() == want.prompt_tokens.tolist()
    assert log.latency_s.tolist() == want.latency_s.tolist() and log.send_s.tolist() == want.send_s.tolist()
    assert any("e2els" in n for n in log.notes) and any("1 failed requests apart" in n for n in log.notes)


# one SGLang run of two requests at request_rate inf (every request sent at once), as bench_serving writes it
SGLANG = {
    "backend": "sglang",
    "request_rate": float("inf"),
    "max_concurrency": None,
    "input_lens": [50, 60],
    "output_lens": [3, 2],
    "ttfts": [0.05, 0.07],
    "itls": [[0.01, 0.02], [0.04]],
    "errors": ["", ""],
}


def test_sglang_reads_the_last_run_and_derives_what_it_lacks(tmp_path):
    """SGLang appends one JSON line per run and saves no latencies and no send times: the last run is read,
    each latency is its TTFT plus its gaps, and at request_rate inf with no max_concurrency every request was
    sent at once (0); with a finite rate the send times are unknown, and the notes say so."""
    first = {"input_lens": [7], "output_lens": [2], "ttfts": [1.0], "itls": [[1.0]], "errors": [""]}
    run = dict(SGLANG)
    path = tmp_path / "sglang.jsonl"
    path.write_text(json.dumps(first) + "\n" + json.dumps(run) + "\n")
    log = read_engine_log(path)
    assert log.format == "sglang" and log.sends_known and log.send_s.tolist() == [0.0, 0.0]
    assert log.latency_s.tolist() == pytest.approx([0.08, 0.11])
    assert any("read the last (line 2)" in n for n in log.notes)
    assert any("no latencies" in n for n in log.notes)
    run["request_rate"] = 4.0
    path.write_text(json.dumps(run) + "\n")
    log = read_engine_log(path)
    assert not log.sends_known and np.isnan(log.send_s).all()
    assert any("no per-request send times (request_rate 4 req/s)" in n for n in log.notes)


@pytest.mark.parametrize(
    "change, why",
    [
        (
            {"request_rate": "trace", "dataset_name": "mooncake"},
            "request_rate trace; replayed at the trace's timestamps",
        ),
        ({"dataset_name": "mooncake"}, "request_rate inf; replayed at the trace's timestamps"),
        ({"backend": "sglang-oai-chat"}, "request_rate inf; backend sglang-oai-chat sends a multi-turn conversation"),
    ],
)
def test_sglang_paced_runs_have_no_send_times(tmp_path, change, why):
    """SGLang's newer benchmark (python/sglang/benchmark/serving.py) writes request_rate "trace" for a trace replay,
    replays the mooncake dataset at its timestamps whatever the rate, and on its chat backends sends each round of
    a multi-turn conversation after the previous reply: at request_rate inf none of these was sent all at once."""
    run = {**SGLANG, "dataset_name": "random", "generated_texts": ["abc", "de"]}
    path = tmp_path / "sglang.jsonl"
    path.write_text(json.dumps({**run, **change}) + "\n")
    log = read_engine_log(path)
    assert log.format == "sglang" and not log.sends_known and np.isnan(log.send_s).all()
    assert log.latency_s.tolist() == pytest.approx([0.08, 0.11])
    assert any(f"no per-request send times ({why}" in n for n in log.notes), log.notes


def test_vllm_appended_runs_are_vllm(tmp_path):
    """`vllm bench serve --append-result` appends one JSON line per run, as SGLang does: the last run is read, and
    its keys (latencies, start_times, model_id) say it is vLLM's."""
    earlier = {k: v for k, v in VLLM.items() if k not in ("input_lens", "output_lens", "ttfts", "itls", "errors")}
    path = tmp_path / "vllm.json"
    path.write_text(json.dumps(earlier) + "\n" + json.dumps(VLLM))
    log = read_engine_log(path)
    assert log.format == "vllm" and log.sends_known and log.send_s.tolist() == [0.0, 0.5]
    assert any("read the last (line 2)" in n for n in log.notes)


def test_aiperf_default_export_without_per_chunk_data(tmp_path):
    """AIPerf's newer exporter leaves out list-valued metrics (inter_chunk_latency) unless --export-per-chunk-data,
    and omits defaults (a served record's error and was_cancelled); warmup and cancelled records are left out."""

    def rec(start_ns, phase="profiling", **meta):
        metrics = {
            "input_sequence_length": {"value": 20, "unit": "tokens"},
            "time_to_first_token": {"value": 12.5, "unit": "ms"},
            "request_latency": {"value": 40.0, "unit": "ms"},
            "output_sequence_length": {"value": 3, "unit": "tokens"},
            "inter_token_latency": {"value": 13.75, "unit": "ms"},
        }
        return {
            "metadata": {"session_num": 0, "request_start_ns": start_ns, "benchmark_phase": phase, **meta},
            "metrics": metrics,
        }

    cancelled = rec(1_200_000_000, was_cancelled=True)
    cancelled |= {"metrics": {"error_isl": {"value": 20, "unit": "tokens"}}, "error": {"code": 499, "message": "x"}}
    lines = [rec(1_000_000_000, phase="warmup"), rec(2_000_000_000), cancelled, rec(1_500_000_000)]
    path = tmp_path / "profile_export.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in lines))
    log = read_engine_log(path)
    assert log.format == "aiperf" and log.send_s.tolist() == pytest.approx([0.0, 0.5])
    assert log.ttft_s.tolist() == pytest.approx([0.0125, 0.0125]) and all(len(g) == 0 for g in log.itl_s)
    assert any("--export-per-chunk-data" in n for n in log.notes)


def test_aiperf_records_in_completion_order_units_and_failures(tmp_path):
    def rec(start_ns, isl, osl, ttft_ms, lat_ms, icl, error=None, phase="profiling"):
        return {
            "metadata": {"request_start_ns": start_ns, "benchmark_phase": phase},
            "metrics": {
                "input_sequence_length": {"value": isl, "unit": "tokens"},
                "output_sequence_length": {"value": osl, "unit": "tokens"},
                "time_to_first_token": {"value": ttft_ms, "unit": "ms"},
                "request_latency": {"value": lat_ms, "unit": "ms"},
                "inter_chunk_latency": {"value": icl, "unit": "ms"},
            },
            "error": error,
        }

    lines = [
        rec(2_000_000_000, 20, 3, 12.5, 40.0, [10.0, 17.5]),
        rec(1_500_000_000, 10, 2, 8.0, 20.0, [12.0]),
        rec(1_600_000_000, 10, 2, 8.0, 20.0, [12.0], error={"code": 500, "type": "X", "message": "boom"}),
        rec(1_000_000_000, 5, 2, 1.0, 2.0, [1.0], phase="warmup"),
    ]
    path = tmp_path / "profile_export.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in lines))
    log = read_engine_log(path)
    assert log.format == "aiperf" and log.sends_known
    assert log.send_s.tolist() == pytest.approx([0.0, 0.5])  # send order; the failed and the warmup one left out
    assert log.prompt_tokens.tolist() == [10, 20] and log.output_tokens.tolist() == [2, 3]
    assert log.ttft_s.tolist() == pytest.approx([0.008, 0.0125]) and log.latency_s.tolist() == pytest.approx(
        [0.02, 0.04]
    )
    assert [g.tolist() for g in log.itl_s] == [pytest.approx([0.012]), pytest.approx([0.010, 0.0175])]


@pytest.mark.parametrize(
    "change, message",
    [
        ({"input_lens": 3}, "input_lens: expected a list"),
        ({"errors": 3}, "errors: expected a list"),
        ({"start_times": {"a": 1}}, "start_times: expected a list"),
        ({"ttfts": [[0.1], [0.2], [0.3]]}, "ttfts: '[0.1]' is not a number"),
        ({"itls": [[0.01, "x"], [], []]}, "'x' is not a number"),
        ({"output_lens": [1, 2]}, "output_lens has 2 entries for 3 requests"),
        ({"request_rate": -2, "start_times": None}, "request_rate: -2 is not a rate > 0"),
        ({"latencies": [0.05, 0.0, 0.25]}, "request 1: its latency (0.05 s) is shorter than its time to first token"),
    ],
)
def test_a_malformed_benchmark_file_is_one_line(tmp_path, change, message):
    path = tmp_path / "vllm.json"
    path.write_text(json.dumps({**VLLM, **change}))
    with pytest.raises(ScenarioError) as e:
        read_engine_log(path)
    assert message in str(e.value) and str(path) in str(e.value) and "\n" not in str(e.value)


def test_the_rebuilt_timeline_counts_the_batch_and_its_context_by_hand():
    """Two requests: A (prompt 100) streams tokens at 1.0, 1.1, 1.2; B (prompt 50) at 1.05, 1.15. At 1.12 both
    are in decode: batch 2, context 100 + 2 (A's tokens so far: 1.0, 1.1) + 50 + 1 (B's: 1.05) = 153, the longest
    102; at 1.17 B is done: batch 1, context 100 + 2."""
    from simulator.engine_logs import RequestLog

    log = RequestLog(
        path="x",
        format="vllm",
        prompt_tokens=np.array([100, 50]),
        output_tokens=np.array([3, 2]),
        ttft_s=np.array([0.5, 0.45]),
        latency_s=np.array([0.7, 0.55]),
        send_s=np.array([0.5, 0.6]),
        sends_known=True,
        itl_s=[np.array([0.1, 0.1]), np.array([0.1])],
    )
    times = token_times(log)
    assert times[0].tolist() == pytest.approx([1.0, 1.1, 1.2]) and times[1].tolist() == pytest.approx([1.05, 1.15])
    line = Timeline(log, times)
    assert line.batch(np.array([1.12, 1.17])).tolist() == [2, 1]
    assert line.context(np.array([1.12, 1.17])).tolist() == [153, 102]
    # the longest context in decode (an attention padding share prices it): A alone at 1.02 (100 + 1), then A's
    # 100 + 2 over B's 50 + 1; any shape (a TPOT item's samples)
    assert line.longest(np.array([1.02, 1.12, 1.17])).tolist() == [101, 102, 102]
    assert line.longest(np.array([[1.12, 1.02]])).tolist() == [[102, 101]]
    assert line.joins(np.array([1.0]), np.array([1.06])).tolist() == [1]
    # ttft_at prefill: A joins one gap before its second token (1.1 - 0.1 = 1.0), B (two tokens, one gap) one
    # gap before its second (1.15 - 0.1 = 1.05); had B joined only at 1.14, then at 1.12 it would be waiting
    # with its first token out: batch 1, context 100 + 2 (A) and not B's 50 + 1
    assert joined_at(times, "prefill").tolist() == pytest.approx([1.0, 1.05])
    late = Timeline(log, times, np.array([1.0, 1.14]))
    assert late.batch(np.array([1.12])).tolist() == [1] and late.context(np.array([1.12])).tolist() == [102]


# ---- simulated runs in each format ---------------------------------------------------------------------
SYSTEMS = (("big", None, 10), ("small", 8, 2.5))


def _truth_scenario(folder: Path, raw: dict) -> Path:
    """The system at TRUE written as a scenario file: what the runs validate against with zero error."""
    s = apply_values(parse_scenario(raw, "t"), TRUE)
    path = folder / "truth.yaml"
    path.write_text(yaml.safe_dump(s.model_dump(mode="json", exclude_none=True)))
    return path


@pytest.mark.parametrize("fmt", ["vllm", "aiperf"])
def test_a_run_validates_to_zero_error_against_the_system_that_made_it(tmp_path, fmt):
    raw = raw_system(seed=3, rate_rps=6.0, link_busy=False)
    raw["methods"] = [KVQUANT]
    ((method, df, it),) = simulate(raw, TRUE)
    path = write_vllm(tmp_path / "v.json", df, it, 6.0) if fmt == "vllm" else write_aiperf(tmp_path / "p.jsonl", df, it)
    v = validate(path, _truth_scenario(tmp_path, raw))
    assert v["method"] == "kvquant" and v["source"] == fmt and v["requests"] == 80
    for metric in ("jct", "ttft", "tpot"):
        for q in ("mean", "p50", "p90", "p99"):
            assert abs(v[f"{metric}_{q}_error_pct"]) < 1e-6, (metric, q)
    assert v["breakdown_s"] == {} and v["prefill_mean_error_pct"] is None
    assert any("only JCT, TTFT and TPOT" in n for n in v["notes"])


def test_a_run_without_send_times_arrives_by_the_scenario(tmp_path):
    """SGLang at a finite rate records no send times: the requests (their lengths) arrive by the scenario's
    arrival process, only distributions compare, and the result says so."""
    raw = raw_system(seed=3, rate_rps=6.0, link_busy=False)
    raw["methods"] = [KVQUANT]
    ((_, df, it),) = simulate(raw, TRUE)
    lists = {"backend": "sglang", "request_rate": 6.0, "max_concurrency": None}
    from simulated_runs import bench_lists

    lists.update({k: v for k, v in bench_lists(df, it).items() if k != "latencies"})
    path = tmp_path / "sglang.jsonl"
    path.write_text(json.dumps(lists) + "\n")
    v = validate(path, _truth_scenario(tmp_path, raw))
    assert any("the scenario's workload.arrival (poisson at 6 req/s, seed 3)" in n for n in v["notes"])
    assert v["requests"] == 80 and all(v[f"{m}_p50_error_pct"] is not None for m in ("jct", "ttft", "tpot"))
    # the run's own lengths were replayed: its measured lengths are the simulated run's
    assert v["metrics"]["tpot_s"]["measured"]["mean"] == pytest.approx(
        float(((df["finish_s"] - df["first_token_s"]) / (df["output_tokens"] - 1)).mean()), rel=1e-9
    )


def _runs(folder: Path, fmt: str, noise: float) -> Path:
    """Four runs (two systems, two seeds) of KVQuant at TRUE, at 2 req/s (many requests find the engine idle),
    in one benchmark format with lognormal noise on every streamed gap; the index names the method. Prompts from 16
    tokens: with the eager prefill's exposed host time on the GPU's side (prefill.host_exposed_s_*) the 32-layer
    system's prefills of 64 tokens and more were host-bound in 3 of 36 idle requests, too few to tell the prefill floor's
    per-batch term from its per-layer one (the fit held the first at its prior and moved the second)."""
    rows = []
    for label, layers, gbps in SYSTEMS:
        for seed in (3, 4):
            raw = raw_system(seed=seed, layers=layers, gbps=gbps, rate_rps=2.0, n=60, link_busy=False)
            raw["workload"]["input_tokens"]["min_tokens"] = 16  # host-bound prefills at both layer counts (above)
            scen = folder / f"{label}.yaml"
            scen.write_text(yaml.safe_dump(raw))
            burst = copy.deepcopy(raw)
            if fmt == "sglang":  # SGLang's send times are known only for a burst (request_rate inf)
                burst["workload"]["arrival"] = {"kind": "poisson", "rate_rps": 1e6}
            ((_, df, it),) = simulate(burst, TRUE, methods=["kvquant"])
            name = f"{label}{seed}"
            if fmt == "vllm":
                write_vllm(folder / f"{name}.json", df, it, 2.0, noise)
                trace = f"{name}.json"
            elif fmt == "aiperf":
                write_aiperf(folder / f"{name}.jsonl", df, it, noise)
                trace = f"{name}.jsonl"
            else:
                df = df.assign(arrival_s=0.0)  # sent at once; the simulated 1e6 req/s arrivals are µs apart
                write_sglang(folder / f"{name}.jsonl", df, it, noise)
                trace = f"{name}.jsonl"
            rows.append((trace, scen.name, "kvquant"))
    pd.DataFrame(rows, columns=["trace", "scenario", "method"]).to_csv(folder / "index.csv", index=False)
    return folder / "index.csv"


@pytest.mark.parametrize("fmt", ["vllm", "sglang", "aiperf"])
def test_a_fit_from_per_request_timings_recovers_the_engine(tmp_path, fmt):
    """Decode from the inter-token latencies, prefill from the first-token times of requests that found the
    engine idle, with 3 % noise on every gap: each parameter the runs identify is within three posterior
    deviations of the truth, the loop gap among them; the rest stay at the prior's centre, with the reason; the
    link and quantize parameters have no item in such a file."""
    traces = load_index(_runs(tmp_path, fmt, noise=0.03))
    assert all(td.source == fmt for td in traces) and all("iteration" in td.blocks for td in traces)
    assert not any(td.kernels_profiled for td in traces)  # another engine's kernels: the stated factor widths
    fit = fit_engine(traces)
    assert fit.widths["methods.kvquant.dequantize"] == FACTOR_PRIOR_WIDTH
    assert "decode.host_serial_s_per_iteration" in fit.fitted, fit.held
    for name, value in fit.fitted.items():
        true = TRUE.get(name, traces[0].values0[name])
        if PARAMETERS[name].integer:
            assert value == true, name
        else:
            assert abs(value - true) <= 3 * fit.stderr[name], (name, value, true, fit.stderr[name])
    assert "no residual of these traces depends on it" in fit.held["network.efficiency"]
    assert "no residual of these traces depends on it" in fit.held["methods.kvquant.quantize"]
    if fmt != "sglang":  # a burst leaves no request alone; spaced arrivals leave many
        assert "prefill.prefill_efficiency" in fit.fitted
        assert all("prefill" in td.blocks and len(td.blocks["prefill"]["meas"]) >= 5 for td in traces)


def test_a_run_without_send_times_is_left_out_of_a_fit_saying_why(tmp_path):
    raw = raw_system(seed=3, rate_rps=6.0, link_busy=False)
    ((_, df, it),) = simulate(raw, TRUE, methods=["kvquant"])
    from simulated_runs import bench_lists

    doc = {"request_rate": 6.0, **{k: v for k, v in bench_lists(df, it).items() if k != "latencies"}}
    (tmp_path / "s.jsonl").write_text(json.dumps(doc) + "\n")
    (tmp_path / "sys.yaml").write_text(yaml.safe_dump(raw))
    (tmp_path / "index.csv").write_text("trace,scenario,method\ns.jsonl,sys.yaml,kvquant\n")
    (td,) = load_index(tmp_path / "index.csv")
    assert td.blocks == {}
    assert any("left out of the fit: without send times" in n for n in td.notes)


def _hand_log_run(tmp_path: Path, doc: dict) -> Path:
    path = tmp_path / "hand.json"
    path.write_text(
        json.dumps({"backend": "vllm", "request_rate": 1.0, "errors": [""] * len(doc["input_lens"]), **doc})
    )
    raw = raw_system(link_busy=False)
    raw["methods"] = [KVQUANT]
    (tmp_path / "sys.yaml").write_text(yaml.safe_dump(raw))
    (tmp_path / "index.csv").write_text("trace,scenario\nhand.json,sys.yaml\n")
    return tmp_path / "index.csv"


def test_items_of_a_hand_made_run(tmp_path):
    """Three requests on the shared-GPU system (ttft_at prefill): A sent at 0, first token 0.1, then gaps 0.5 (it
    waited to join), 0.01, 0.01; B sent at 0.2 while A is in flight; C sent at 2.0 when nothing is. Decode items:
    A's and C's gaps after the first (the first holds the wait), B's likewise, none 0.5 s; prefill items: the
    first-token times of A and C, the requests that found the engine idle (B did not)."""
    index = _hand_log_run(
        tmp_path,
        {
            "input_lens": [1000, 500, 2000],
            "output_lens": [4, 3, 3],
            "ttfts": [0.1, 0.15, 0.2],
            "itls": [[0.5, 0.01, 0.01], [0.02, 0.02], [0.03, 0.03]],
            "latencies": [0.62, 0.19, 0.26],
            "start_times": [0.0, 0.2, 2.0],
        },
    )
    (td,) = load_index(index)
    assert sorted(td.blocks["iteration"]["meas"].tolist()) == pytest.approx([0.01, 0.01, 0.02, 0.03])
    assert td.blocks["prefill"]["meas"].tolist() == pytest.approx([0.1, 0.2])
    assert td.blocks["prefill"]["requests"].tolist() == [1.0, 1.0]


def test_a_fit_on_colocated_runs_holds_what_colocated_does_not_use(tmp_path):
    """Placement colocated prices prefill chunks with the decode pool's settings and moves no KV: a fit on such
    runs holds the prefill pool's and the link's parameters, saying why, so its file applies to a colocated
    scenario (where a fitted prefill efficiency would be refused)."""
    from simulator.calibrate import engine_file
    from simulator.engine import not_applied_in
    from simulator.load import load_scenario

    raw = raw_system(seed=3, rate_rps=2.0, n=40, link_busy=False)
    raw["placement"] = "colocated"
    raw["methods"] = [KVQUANT]
    ((_, df, it),) = simulate(raw, TRUE)
    write_vllm(tmp_path / "c.json", df, None, 2.0)  # two replicas: no per-token gaps, TPOT items
    (tmp_path / "sys.yaml").write_text(yaml.safe_dump(raw))
    (tmp_path / "index.csv").write_text("trace,scenario\nc.json,sys.yaml\n")
    traces = load_index(tmp_path / "index.csv")
    assert "prefill" not in traces[0].blocks and any("placement colocated" in n for n in traces[0].notes)
    fit = fit_engine(traces)
    assert not set(fit.fitted) & not_applied_in("colocated")
    assert "placement colocated does not use it" in fit.held["prefill.prefill_efficiency"]
    (tmp_path / "engine.json").write_text(json.dumps(engine_file(fit, traces, "index.csv", "test", "0")))
    raw["calibration"] = {"engine": "engine.json"}
    (tmp_path / "calibrated.yaml").write_text(yaml.safe_dump(raw))
    assert load_scenario(tmp_path / "calibrated.yaml").placement == "colocated"
    # a machine refit on them from a base fitted on disaggregated runs (prefill and link terms, HACK's prefill
    # launches, a method they do not have) writes none of what colocated does not use: the file applies there
    base = {n: (v, None) for n, v in TRUE.items()}
    refit = fit_engine(traces, "machine", base, "base.json")
    assert refit.factor is not None and not set(refit.fitted) & not_applied_in("colocated")
    assert "methods.hack.prefill_issue_s_per_layer" not in refit.fitted
    assert "methods.hack.quantize_issue_s_per_layer" in refit.fitted  # HACK's, scaled: colocated quantizes too
    (tmp_path / "engine.json").write_text(json.dumps(engine_file(refit, traces, "index.csv", "test", "0")))
    assert load_scenario(tmp_path / "calibrated.yaml").placement == "colocated"
