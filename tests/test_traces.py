"""Public traces as workloads: each format read from a small file made here, replayed with its own
arrivals and lengths; filters, window and rate_scale; bad rows refused in one line naming file and row."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import yaml

from contract import invoke
from simulator.config import ScenarioError, TraceConfig
from simulator.load import load_scenario
from simulator.run import run_scenario
from simulator.traces import load_trace
from simulator.workload import make_requests

ROOT = Path(__file__).resolve().parent.parent
BASE = {
    "name": "replay",
    "model": "llama-3.1-8b",
    "prefill": {"instance": "g6e.12xlarge", "tensor_parallel": 1, "replicas": 1},
    "decode": {"instance": "g6e.12xlarge", "tensor_parallel": 1, "replicas": 1},
    "network": {"bandwidth_gbps": 10},
    "methods": ["baseline", "hack"],
    "calibration": {"prefill_profile": "roofline", "decode_profile": "roofline"},
}

AZURE = (
    "TIMESTAMP,ContextTokens,GeneratedTokens\n"
    "2023-11-16 18:15:46.6805900,374,44\n"
    "2023-11-16 18:15:50.9951690,396,109\n"
    "2023-11-16 18:15:51.1206000,879,34\n"
    "2023-11-16 18:16:01.6805900,91,12\n"
)
AZURE_2024 = (
    "TIMESTAMP,ContextTokens,GeneratedTokens\n"
    "2024-05-10 00:00:00.009930+00:00,2162,5\n"
    "2024-05-10 00:00:01.509930+00:00,1000,20\n"
)
BURSTGPT = (
    "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n"
    "5,ChatGPT,472,18,490,Conversation log\n"
    "45,ChatGPT,1087,0,1087,Conversation log\n"  # failed: no response
    "118,GPT-4,417,276,693,API log\n"
    "130,ChatGPT,1360,105,1465,API log\n"
    "200,GPT-4,200,50,250,Conversation log\n"
)
MOONCAKE = [
    {"timestamp": 0, "input_length": 6955, "output_length": 52, "hash_ids": [46, 47, 48]},
    {"timestamp": 2500, "input_length": 6472, "output_length": 26, "hash_ids": [46, 52]},
    {"timestamp": 4000, "input_length": 700, "output_length": 3, "hash_ids": [60]},
]


def write(folder: Path, name: str, text: str) -> Path:
    path = folder / name
    path.write_text(text)
    return path


def trace(path: Path, fmt: str, **kw) -> TraceConfig:
    return TraceConfig(format=fmt, path=str(path), **kw)


def test_azure_wall_clock_becomes_seconds_from_the_first_request(tmp_path):
    t = load_trace(trace(write(tmp_path, "a.csv", AZURE), "azure"))
    assert t.arrival_s == pytest.approx([0.0, 4.314579, 4.44001, 15.0])
    assert t.prompt_tokens.tolist() == [374, 396, 879, 91] and t.output_tokens.tolist() == [44, 109, 34, 12]
    t24 = load_trace(trace(write(tmp_path, "b.csv", AZURE_2024), "azure"))
    assert t24.arrival_s == pytest.approx([0.0, 1.5])


def test_burstgpt_filters_and_drops_failed_requests(tmp_path):
    path = write(tmp_path, "burst.csv", BURSTGPT)
    everything = load_trace(trace(path, "burstgpt"))
    assert everything.prompt_tokens.tolist() == [472, 417, 1360, 200]  # the 0-response row is not served
    assert everything.arrival_s.tolist() == [0.0, 113.0, 125.0, 195.0]
    chat_api = load_trace(trace(path, "burstgpt", models=["ChatGPT"], log_types=["API log"]))
    assert chat_api.prompt_tokens.tolist() == [1360] and chat_api.arrival_s.tolist() == [0.0]
    gpt4 = load_trace(trace(path, "burstgpt", models=["GPT-4"]))
    assert gpt4.output_tokens.tolist() == [276, 50] and gpt4.arrival_s.tolist() == [0.0, 82.0]
    with pytest.raises(ScenarioError, match="no row has Model 'GPT-5'"):
        load_trace(trace(path, "burstgpt", models=["GPT-5"]))


def test_mooncake_keeps_block_hashes_through_the_simulation_requests(tmp_path):
    path = write(tmp_path, "m.jsonl", "".join(json.dumps(r) + "\n" for r in MOONCAKE))
    t = load_trace(trace(path, "mooncake"))
    assert t.arrival_s.tolist() == [0.0, 2.5, 4.0] and t.output_tokens.tolist() == [52, 26, 3]
    assert t.block_hashes == ((46, 47, 48), (46, 52), (60,))
    s = scenario_with(tmp_path, {"format": "mooncake", "path": "m.jsonl"})
    reqs = make_requests(s)
    assert reqs.block_hashes == t.block_hashes and reqs.prompt_tokens.tolist() == [6955, 6472, 700]


def test_vllm_bench_start_times_or_its_request_rate(tmp_path):
    detailed = {
        "request_rate": 2.0,
        "input_lens": [100, 200, 300, 400],
        "output_lens": [10, 0, 30, 40],
        "errors": ["", "timeout", "", ""],
        "start_times": [10.0, 10.5, 11.0, 12.25],
    }
    t = load_trace(trace(write(tmp_path, "v.json", json.dumps(detailed)), "vllm_bench"))
    assert t.prompt_tokens.tolist() == [100, 300, 400] and t.arrival_s.tolist() == [0.0, 1.0, 2.25]
    no_times = {k: v for k, v in detailed.items() if k != "start_times"}
    t = load_trace(trace(write(tmp_path, "w.json", json.dumps(no_times)), "vllm_bench"))
    assert len(t) == 3 and t.arrival_s[0] == 0 and np.all(np.diff(t.arrival_s) > 0)  # Poisson at 2 req/s, seed 0
    burst = load_trace(trace(write(tmp_path, "x.json", json.dumps({**no_times, "request_rate": "inf"})), "vllm_bench"))
    assert burst.arrival_s.tolist() == [0.0, 0.0, 0.0]
    with pytest.raises(ScenarioError, match="--save-result"):
        load_trace(trace(write(tmp_path, "y.json", json.dumps({"duration": 3})), "vllm_bench"))


def test_window_and_rate_scale(tmp_path):
    path = write(tmp_path, "a.csv", AZURE)
    t = load_trace(trace(path, "azure", start_s=4.0, duration_s=1.0, rate_scale=2.0))
    assert t.prompt_tokens.tolist() == [396, 879] and t.arrival_s == pytest.approx([0.0, (4.44001 - 4.314579) / 2])
    with pytest.raises(ScenarioError, match=r"no request left \(window \[20, 21\) s of a 15 s trace"):
        load_trace(trace(path, "azure", start_s=20.0, duration_s=1.0))


def scenario_with(folder: Path, trace_entry: dict, **workload) -> object:
    path = folder / "scenario.yaml"
    path.write_text(yaml.safe_dump({**BASE, "workload": {"trace": trace_entry, **workload}}, sort_keys=False))
    return load_scenario(path)


def test_a_scenario_built_in_code_runs_a_trace_without_requests(tmp_path):
    # load_scenario fills workload.requests from the trace; a Scenario built directly leaves it None, and
    # run_scenario's memory check then reads the trace's own count (it multiplied None and crashed)
    from simulator.config import Scenario

    path = write(tmp_path, "a.csv", AZURE)
    s = Scenario.model_validate({**BASE, "workload": {"trace": {"format": "azure", "path": str(path)}}})
    assert s.workload.requests is None
    result = run_scenario(s, source="t")
    assert {m: v["completed"] for m, v in result.summary["methods"].items()} == {"baseline": 4, "hack": 4}


def test_requests_default_to_the_trace_and_a_larger_count_cycles_it(tmp_path):
    write(tmp_path, "a.csv", AZURE)
    s = scenario_with(tmp_path, {"format": "azure", "path": "a.csv"})
    assert s.workload.requests == 4 and Path(s.workload.trace.path).is_absolute()
    result = run_scenario(s, source="t")
    assert {m: v["completed"] for m, v in result.summary["methods"].items()} == {"baseline": 4, "hack": 4}
    first = result.requests[result.requests["method"] == "baseline"].sort_values("arrival_s")
    assert first["arrival_s"].to_numpy() == pytest.approx([0.0, 4.314579, 4.44001, 15.0])
    cycled = make_requests(scenario_with(tmp_path, {"format": "azure", "path": "a.csv"}, requests=6))
    assert cycled.prompt_tokens.tolist() == [374, 396, 879, 91, 374, 396]
    assert cycled.arrival_s[4] == pytest.approx(15.0 + 5.0)  # the next pass, one mean gap after the last


def test_trace_replaces_arrivals_and_lengths(tmp_path):
    write(tmp_path, "a.csv", AZURE)
    with pytest.raises(ScenarioError, match="trace replaces arrivals and lengths: drop arrival"):
        scenario_with(tmp_path, {"format": "azure", "path": "a.csv"}, arrival={"kind": "poisson", "rate_rps": 1})
    with pytest.raises(ScenarioError, match="models and log_types filter BurstGPT traces only"):
        scenario_with(tmp_path, {"format": "azure", "path": "a.csv", "models": ["x"]})


@pytest.mark.parametrize(
    "fmt, name, text, message",
    [
        (
            "csv",
            "c.csv",
            "arrival_s,prompt_tokens,output_tokens\n0,10,5\n1,nan,5\n",
            "line 3: prompt_tokens: empty or NaN",
        ),
        (
            "csv",
            "c.csv",
            "arrival_s,prompt_tokens,output_tokens\n0,10,5\ninf,10,5\n",
            "line 3: arrival_s: inf is not a finite time",
        ),
        (
            "csv",
            "c.csv",
            "arrival_s,prompt_tokens,output_tokens\n0,10,-5\n",
            "line 2: output_tokens: -5 is not a whole number in [0,",
        ),
        (
            "csv",
            "c.csv",
            "arrival_s,prompt_tokens,output_tokens\n2,10,5\n1,10,5\n",
            "line 3: arrival_s 1 is earlier than the row above (2)",
        ),
        (
            "csv",
            "c.csv",
            "request_id,arrival_s,prompt_tokens,output_tokens\n7,0,10,5\n7,1,10,5\n",
            "line 3: request_id 7 repeats line 2",
        ),
        (
            "azure",
            "a.csv",
            "TIMESTAMP,ContextTokens,GeneratedTokens\nyesterday,10,5\n",
            "line 2: TIMESTAMP 'yesterday'",
        ),
        ("burstgpt", "b.csv", "Timestamp,Model,Request tokens\n1,ChatGPT,3\n", "no column 'Response tokens'"),
        (
            "mooncake",
            "m.jsonl",
            '{"timestamp": 0, "input_length": 5, "output_length": 1}\n{"timestamp": 1}\n',
            "line 2: no 'input_length'",
        ),
        ("azure", "missing.csv", None, "no such file"),
    ],
)
def test_a_bad_trace_is_one_line_naming_file_and_row(tmp_path, fmt, name, text, message):
    if text is not None:
        write(tmp_path, name, text)
    scen = tmp_path / "scenario.yaml"
    scen.write_text(yaml.safe_dump({**BASE, "workload": {"trace": {"format": fmt, "path": name}}}, sort_keys=False))
    r = invoke("simulate", scen, "--out", tmp_path / "o")  # in this process: a fresh one costs a second of imports
    assert r.exception is None or isinstance(r.exception, SystemExit), r.exception
    assert r.exit_code == 2 and r.stderr.count("\n") == 1, r.stderr
    assert r.stderr.startswith("error: ") and str(tmp_path / name) in r.stderr and message in r.stderr
    assert not (tmp_path / "o").exists()


def test_a_sweep_over_a_trace_scenario(tmp_path):
    from planning.executor import Executor
    from planning.sweep import load_sweep, run_sweep

    write(tmp_path, "burst.csv", BURSTGPT)
    (tmp_path / "base.yaml").write_text(
        yaml.safe_dump({**BASE, "workload": {"trace": {"format": "burstgpt", "path": "burst.csv", "rate_scale": 10}}})
    )
    (tmp_path / "sweep.yaml").write_text(
        yaml.safe_dump({"base": "base.yaml", "axes": {"workload.trace.rate_scale": [10, 100]}})
    )
    spec, base = load_sweep(tmp_path / "sweep.yaml")
    with Executor("serial") as ex:
        table = run_sweep(spec, base, ex).table
    assert len(table) == 4 and (table["error"] == "").all() and (table["completed"] == 4).all()


def test_a_window_ends_before_its_end_so_adjacent_windows_partition_the_trace(tmp_path):
    """[start_s, start_s + duration_s): a request arriving exactly at the end belongs to the next window, never
    to both: windows [0, 2) and [2, 4) of arrivals 0, 1, 2, 3, 4 hold 0, 1 and 2, 3."""
    path = write(tmp_path, "t.csv", "arrival_s,prompt_tokens,output_tokens\n0,10,1\n1,11,1\n2,12,1\n3,13,1\n4,14,1\n")
    first = load_trace(trace(path, "csv", start_s=0.0, duration_s=2.0))
    second = load_trace(trace(path, "csv", start_s=2.0, duration_s=2.0))
    assert first.prompt_tokens.tolist() == [10, 11] and second.prompt_tokens.tolist() == [12, 13]
    assert second.arrival_s.tolist() == [0.0, 1.0]


def test_mooncake_without_a_trailing_newline_keeps_its_last_row(tmp_path):
    path = write(tmp_path, "m.jsonl", "\n".join(json.dumps(r) for r in MOONCAKE))  # no newline after the last
    t = load_trace(trace(path, "mooncake"))
    assert t.prompt_tokens.tolist() == [6955, 6472, 700] and t.arrival_s.tolist() == [0.0, 2.5, 4.0]


@pytest.mark.parametrize(
    "doc, message",
    [
        ({"input_lens": 3, "output_lens": [1]}, "input_lens: expected a list"),
        ({"input_lens": [1, 2], "output_lens": [1, 1], "errors": 3}, "errors: expected a list"),
        ({"input_lens": [1, 2], "output_lens": [1, 1], "start_times": 0.5}, "start_times: expected a list"),
        ({"input_lens": [1, 2], "output_lens": None}, "output_lens: expected a list"),
        ({"input_lens": [[1], [2]], "output_lens": [1, 1]}, "input_lens: '[1]' is not a number"),
        ({"input_lens": [1, 2], "output_lens": [1, 1], "request_rate": "fast"}, "request_rate: 'fast' is not a rate"),
        (
            {"duration": 3, "output_lens": [1]},
            (
                ": no input_lens and output_lens: save the benchmark with --save-result (and --save-detailed on newer "
                "vLLM)"
            ),
        ),
        # rows are the requests' positions in the lists, from 1
        (
            {"input_lens": [10, 20, 30], "output_lens": [5, 5, 5], "start_times": [0.0, 2.0, 1.0]},
            "request 3: arrival_s 1 is earlier than the row above (2)",
        ),
    ],
)
def test_malformed_vllm_benchmark_json_is_one_line(tmp_path, doc, message):
    path = write(tmp_path, "v.json", json.dumps(doc))
    with pytest.raises(ScenarioError) as e:
        load_trace(trace(path, "vllm_bench"))
    assert message in str(e.value) and "v.json" in str(e.value) and "\n" not in str(e.value)


def test_a_negative_vllm_request_rate_is_refused_not_replayed_at_zero(tmp_path):
    doc = {"request_rate": -2, "input_lens": [100, 200], "output_lens": [10, 20]}
    with pytest.raises(ScenarioError, match=r"request_rate: '-2' is not a rate > 0"):
        load_trace(trace(write(tmp_path, "v.json", json.dumps(doc)), "vllm_bench"))


def test_a_mooncake_block_hash_that_is_not_an_integer_is_one_line(tmp_path):
    row = {"timestamp": 0, "input_length": 700, "output_length": 3, "hash_ids": [60, {"a": 1}]}
    path = write(tmp_path, "m.jsonl", json.dumps(row) + "\n")
    with pytest.raises(ScenarioError, match=r"line 1: hash_ids: .* is not a block hash"):
        load_trace(trace(path, "mooncake"))
