"""The command line: every scenario runs, bad input fails cleanly, outputs are reproducible."""

from __future__ import annotations

import ast
import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from simulator.load import load_scenario
from simulator.run import run_scenario

ROOT = Path(__file__).resolve().parent.parent
SCENARIOS = sorted((ROOT / "scenarios").glob("*.yaml")) + sorted((ROOT / "scenarios" / "measured").glob("*.yaml"))


def cli(*args, cwd=ROOT):
    """The CLI in a fresh process: for what only a process shows (byte-identical runs across hash seeds,
    signals, resource limits, the interpreter's own exit)."""
    return subprocess.run(
        [sys.executable, str(ROOT / "cli.py"), *map(str, args)], capture_output=True, text=True, cwd=cwd
    )


def here(*args, cwd=ROOT) -> subprocess.CompletedProcess:
    """The CLI in this process (typer's CliRunner, from `cwd`), as `cli` returns it: a fresh interpreter
    costs about a second of CPU in imports. An exception the CLI did not turn into an exit code is raised
    here, so a traceback fails the test as it would print in a process."""
    import os

    from typer.testing import CliRunner

    import cli as cli_module

    before = os.getcwd()
    os.chdir(cwd)
    try:
        r = CliRunner().invoke(cli_module.app, [str(a) for a in args])
    finally:
        os.chdir(before)
    if r.exception is not None and not isinstance(r.exception, SystemExit):
        raise r.exception
    return subprocess.CompletedProcess(list(args), r.exit_code, r.stdout, r.stderr)


@pytest.mark.parametrize("path", SCENARIOS, ids=lambda p: p.stem)
def test_every_scenario_runs_at_reduced_size(path):
    s = load_scenario(path, ["workload.requests=25"])
    result = run_scenario(s, source=str(path))
    for name, m in result.summary["methods"].items():
        assert m["completed"] == 25, name
        assert m["jct_s"]["mean"] > 0
        assert sum(m["breakdown_s"].values()) == pytest.approx(m["jct_s"]["mean"], rel=1e-9)


def test_simulate_writes_outputs_and_is_byte_reproducible(tmp_path):
    outs = []
    for i in range(2):
        out = tmp_path / f"run{i}"
        r = cli(
            "simulate",
            "scenarios/a10g_10gbps.yaml",
            "--requests",
            "30",
            "--out",
            out,
            "--no-report",
            "--set",
            "network.bandwidth_gbps=25",
        )
        assert r.returncode == 0, r.stderr
        assert "hack" in r.stdout and "baseline" in r.stdout
        outs.append(out)
    names = ["summary.json", "requests.csv", "memory.csv", "links.csv", "scenario.json", "profiles.json"]
    for name in names:
        assert (outs[0] / name).read_bytes() == (outs[1] / name).read_bytes(), name
    summary = json.loads((outs[0] / "summary.json").read_text())
    assert set(summary["methods"]) == {"baseline", "cachegen", "kvquant", "fp8", "hack"}
    m = summary["methods"]["hack"]
    assert set(m) >= {
        "completed",
        "jct_s",
        "ttft_s",
        "tpot_s",
        "breakdown_s",
        "peak_decode_memory_bytes",
        "kv_bytes_per_token",
        "throughput_rps",
    }
    assert set(m["jct_s"]) == {"mean", "p50", "p90", "p99"}
    assert set(m["breakdown_s"]) == {
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
    }
    assert json.loads((outs[0] / "scenario.json").read_text())["network"]["bandwidth_gbps"] == 25


def test_methods_option_selects_and_rejects(tmp_path):
    r = here("simulate", "scenarios/a10g_10gbps.yaml", "--requests", "10", "--methods", "baseline,hack")
    assert r.returncode == 0, r.stderr
    assert "kvquant" not in r.stdout
    r = here("simulate", "scenarios/a10g_10gbps.yaml", "--requests", "10", "--methods", "pqcache")
    assert r.returncode == 2 and "pqcache" in r.stderr


def _bad(tmp_path, mutate):
    raw = yaml.safe_load((ROOT / "scenarios" / "a10g_10gbps.yaml").read_text())
    mutate(raw)
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


@pytest.mark.parametrize(
    "mutate,field",
    [
        (lambda r: r["network"].update(bandwidht_gbps=10), "network.bandwidht_gbps"),
        (lambda r: r["network"].update(bandwidth_gbps=-10), "network.bandwidth_gbps"),
        (lambda r: r["decode"].update(gpu="a99"), "decode.gpu"),
        (lambda r: r["prefill"].update(instance="g4dn.12xlarge", pipeline_parallel=1), "prefill"),
        (lambda r: r["workload"]["arrival"].update(kind="sometimes"), "workload.arrival"),
        (lambda r: r.update(methods=["baseline", {"name": "hack", "partition": 50}]), "methods.1.partition"),
    ],
    ids=["unknown-field", "negative-bandwidth", "unknown-gpu", "does-not-fit", "unknown-arrival", "bad-partition"],
)
def test_bad_scenarios_fail_with_one_line(tmp_path, mutate, field):
    path = _bad(tmp_path, mutate)
    out = tmp_path / "out"
    r = here("simulate", path, "--requests", "5", "--out", out)
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, r.stderr
    assert str(path) in lines[0] and field in lines[0], lines[0]
    assert "Traceback" not in r.stderr
    assert not out.exists()


def test_missing_file_and_bad_set(tmp_path):
    r = here("simulate", tmp_path / "nope.yaml")
    assert r.returncode == 2 and "no such file" in r.stderr
    r = here("simulate", "scenarios/a10g_10gbps.yaml", "--set", "network.bandwidth_gbps")
    assert r.returncode == 2 and "--set" in r.stderr


def test_schema_is_json_schema():
    r = here("schema")
    assert r.returncode == 0
    schema = json.loads(r.stdout)
    assert schema["additionalProperties"] is False
    assert {"model", "prefill", "decode", "network", "workload", "methods"} <= set(schema["properties"])


def test_costmodel_imports_no_simpy():
    """costmodel/ is pure: no SimPy, no YAML, no random numbers (pydantic validates method parameters)."""
    code = (
        "import sys, costmodel.phases, costmodel.methods, costmodel.roofline, costmodel.transfer; "
        "bad = [m for m in ('simpy', 'yaml', 'simulator') if m in sys.modules]; assert not bad, bad"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert r.returncode == 0, r.stderr
    for path in (ROOT / "costmodel").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = (
                [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else ([node.module or ""] if isinstance(node, ast.ImportFrom) and node.level == 0 else [])
            )
            for name in names:
                assert name.split(".")[0] not in {"simpy", "yaml", "random", "simulator", "catalog"}, (path, name)
                assert not name.startswith("numpy.random"), (path, name)
            if isinstance(node, ast.Attribute) and node.attr == "random":
                raise AssertionError(f"{path}: uses .random")


def test_calibrate_refits_measured_rows_and_costmodel_reads_it(tmp_path):
    from costmodel.calibration import load_profile
    from costmodel.methods import kernel_keys

    r = cli(
        "calibrate",
        "--out",
        tmp_path / "cal",
        "--fit-only",
        "kernels_calibration/profiles/h200/profile_rows.csv",
        "--gpu",
        "h200",
    )
    assert r.returncode == 0, r.stderr
    prof = load_profile(tmp_path / "cal" / "profile.json")
    keys = kernel_keys()  # every kernel a method prices with, the measured-only scoring fits included
    assert {
        "decode_attn.fp16",
        "decode_attn.fp8",
        "decode_attn.dequant_fused",
        "decode_attn.dequant_unfused",
        "decode_attn.hack",
        "decode_attn.hack_no_se",
        "decode_attn.hack_no_rqe",
        "prefill_attn.fp16",
        "prefill_attn.hack",
    } <= set(keys)
    for k in keys:
        assert prof.kernel(k).s_per_unit > 0, k
    committed = load_profile(ROOT / "kernels_calibration" / "profiles" / "h200" / "profile.json")
    assert prof.kernel("decode_attn.hack").s_per_unit == pytest.approx(committed.kernel("decode_attn.hack").s_per_unit)


def test_calibrate_without_gpu_fails_cleanly(tmp_path):
    r = cli("calibrate", "--out", tmp_path / "cal")
    assert r.returncode == 2 and "CUDA GPU" in r.stderr and "Traceback" not in r.stderr


def test_simulate_profile_option_uses_the_given_profile(tmp_path):
    out = tmp_path / "o"
    r = here(
        "simulate",
        "scenarios/a10g_10gbps.yaml",
        "--requests",
        "10",
        "--no-report",
        "--out",
        out,
        "--profile",
        "kernels_calibration/profiles/h200/profile.json",
    )
    assert r.returncode == 0, r.stderr
    profiles = json.loads((out / "profiles.json").read_text())
    assert profiles["prefill"]["source"] == "measured" and profiles["prefill"]["gpu"] == "h200"
    # the profile's rates against the catalog's published measurements of its GPU (the H200's own copy and GEMM)
    rows = {r["quantity"]: r for r in profiles["prefill"]["vs_measured"]}
    assert rows["copy_gb_per_s"]["profile"] == pytest.approx(4220.4) and abs(rows["copy_gb_per_s"]["error_pct"]) < 0.1
    assert rows["bf16_gemm_tflops"]["error_pct"] == pytest.approx(100 * (693.4 - 794.5) / 794.5, abs=0.1)


def test_version_matches_the_package_metadata():
    import tomllib

    import cli as cli_module

    r = here("--version")
    assert r.returncode == 0 and r.stdout == f"hacksim {cli_module.__version__}\n"
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert project["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "cli.__version__"}
    assert project["project"]["scripts"]["hacksim"] == "cli:app"


def test_json_is_the_summary_and_quiet_prints_nothing(tmp_path):
    """--json: stdout is summary.json's content, the other lines go to stderr; --quiet: stdout is empty.
    A shipped example is found by name from any folder."""
    r = here(
        "simulate",
        "a10g_10gbps",
        "--requests",
        "12",
        "--methods",
        "baseline,hack",
        "--json",
        "--out",
        tmp_path / "o",
        "--no-report",
        cwd=tmp_path,
    )
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout) == json.loads((tmp_path / "o" / "summary.json").read_text())
    assert "wrote" in r.stderr
    q = here(
        "simulate",
        "scenarios/a10g_10gbps.yaml",
        "--requests",
        "12",
        "--methods",
        "hack",
        "--quiet",
        "--out",
        tmp_path / "q",
        "--no-report",
        cwd=tmp_path,
    )
    assert q.returncode == 0 and q.stdout == "" and q.stderr == "" and (tmp_path / "q" / "summary.json").is_file()


def test_the_table_says_less_time_with_a_minus():
    r = here("simulate", "scenarios/a10g_10gbps.yaml", "--requests", "12", "--methods", "baseline,hack")
    hack = next(line for line in r.stdout.splitlines() if line.startswith("hack"))
    summary = json.loads(
        here(
            "simulate", "scenarios/a10g_10gbps.yaml", "--requests", "12", "--methods", "baseline,hack", "--json"
        ).stdout
    )["methods"]
    change = 100 * (summary["hack"]["jct_s"]["mean"] / summary["baseline"]["jct_s"]["mean"] - 1)
    assert change < 0 and hack.split()[-1] == f"{change:+.1f}%"


def test_scenarios_lists_every_shipped_example():
    r = here("scenarios")
    assert r.returncode == 0
    shipped = sorted(
        p.relative_to(ROOT / "scenarios").with_suffix("").as_posix() for p in (ROOT / "scenarios").rglob("*.yaml")
    )
    assert [line.split()[0] for line in r.stdout.splitlines()[3:]] == shipped


def test_a_method_with_no_completed_request_shows_dashes_not_nan(tmp_path):
    """Both decode replicas down for good and fail on loss: no request completes, so every mean is over none.
    The table said `nans` and `+nan%`; it shows `–` there and keeps the figures that exist (KV bytes per token,
    peak memory). summary.json, read back, holds null for those means: the same table."""
    from cli import format_table

    raw = yaml.safe_load((ROOT / "scenarios" / "faults_decode_loss.yaml").read_text())
    raw["fault_policy"] = {"on_loss": "fail"}
    raw["faults"] = [
        {"kind": "decode_replica_down", "target": i, "start_s": 0, "end_s": float("inf")} for i in range(2)
    ]
    path = tmp_path / "all_fail.yaml"
    path.write_text(yaml.safe_dump(raw))
    r = here("simulate", path, "--requests", "12", "--out", tmp_path / "o", "--no-report")
    assert r.returncode == 0, r.stderr
    rows = {line.split()[0]: line.split() for line in r.stdout.splitlines() if line.split()[0] in ("baseline", "hack")}
    assert rows["baseline"][1:9] == ["0"] + ["–"] * 7 and rows["baseline"][9] == "327680"
    assert rows["hack"][1:9] == ["0"] + ["–"] * 7 and rows["hack"][-1] == "–"
    assert "nan" not in r.stdout
    summary = json.loads((tmp_path / "o" / "summary.json").read_text())
    assert summary["methods"]["hack"]["jct_s"]["mean"] is None
    assert format_table(summary).splitlines()[:5] == r.stdout.splitlines()[:5]


def test_every_listed_name_runs_as_its_file():
    """`measured/h200g_70b8l_2.5gbps` once failed: the `.5gbps` was taken for a file extension."""
    from scenarios import EXAMPLES_DIR
    from scenarios import resolve as resolve_example

    names = [line.split()[0] for line in here("scenarios").stdout.splitlines()[3:]]
    assert "measured/h200g_70b8l_2.5gbps" in names
    for name in names:
        assert resolve_example(name) == EXAMPLES_DIR / f"{name}.yaml", name
    r = here("simulate", "measured/h200g_70b8l_2.5gbps", "--requests", "3", "--methods", "baseline", cwd="/")
    assert r.returncode == 0, r.stderr


def test_help_is_printed_as_written():
    """Rich markup read `.[images]` as a style tag ("(needs '.')"); its table cut --slo's example at 80 columns."""
    env = {"COLUMNS": "80", "PATH": "/usr/bin:/bin"}
    r = subprocess.run(
        [sys.executable, str(ROOT / "cli.py"), "report", "--help"], capture_output=True, text=True, env=env
    )
    assert "(needs '.[images]')" in r.stdout
    r = subprocess.run(
        [sys.executable, str(ROOT / "cli.py"), "plan", "--help"], capture_output=True, text=True, env=env
    )
    assert "ttft_p99_s=60,tpot_p99_s=0.5" in r.stdout and "…" not in r.stdout
    assert max(len(line) for line in r.stdout.splitlines()) <= 80


def test_a_name_from_a_file_prints_on_one_line_and_as_written():
    from cli import format_table

    summary = json.loads(
        here("simulate", "scenarios/a10g_10gbps.yaml", "--requests", "4", "--methods", "baseline,hack", "--json").stdout
    )
    summary["scenario"] = "two\nlines [bold]x[/]"
    summary["methods"]["hack[pi32]"] = summary["methods"].pop("hack")
    text = format_table(summary)
    lines = text.splitlines()
    assert lines[0] == "scenario two\\nlines [bold]x[/]: 4 requests, seed 0"
    assert lines[1].split()[0] == "method" and any(line.startswith("hack[pi32] ") for line in lines)


POOL_PARTS_ALL = (
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


def _summary(util: dict[str, dict], breakdown: dict[str, dict], jct: dict[str, float]) -> dict:
    return {
        "scenario": "s",
        "requests": 10,
        "seed": 0,
        "methods": {m: {"utilisation": util[m], "breakdown_s": breakdown[m], "jct_s": {"mean": jct[m]}} for m in util},
    }


def test_under_the_table_each_pools_utilisation_and_the_bottleneck():
    """Hand-worked: prefill 81.5 % and 82.4 % busy, network 43 % and 5.5 %, decode 0.84 % and 0.14 %; prefill
    is the busiest pool for both methods. Waiting for and running in prefill (queue + prefill + quantize):
    13.14 + 16.76 + 0 = 29.90 s of 36.64 s (82 %) and 13.25 + 16.76 + 0.01 = 30.02 s of 31.72 s (95 %)."""
    from cli import utilisation_lines

    parts = dict.fromkeys(
        ("prefill_queue", "prefill", "quantize", "transfer_queue", "transfer", "decode_queue", "decode"), 0.0
    )
    summary = _summary(
        {
            "baseline": {"prefill": 0.815, "network": 0.43, "decode": 0.0084},
            "hack": {"prefill": 0.824, "network": 0.055, "decode": 0.0014},
        },
        {
            "baseline": {**parts, "prefill_queue": 13.14, "prefill": 16.76, "transfer": 5.66},
            "hack": {**parts, "prefill_queue": 13.25, "prefill": 16.76, "quantize": 0.01, "transfer": 0.75},
        },
        {"baseline": 36.64, "hack": 31.72},
    )
    assert utilisation_lines(summary) == [
        "utilisation while requests arrive: prefill 82 %, network 5.5-43 %, decode 0.1-0.8 %",
        "bottleneck: prefill for every method (82 % busy): waiting for and running in prefill is 29.9-30.0 s of "
        "the 31.7-36.6 s mean JCT (82-95 %)",
    ]
    summary["methods"]["hack"]["utilisation"]["network"] = 1.7  # a slow link for hack alone
    assert utilisation_lines(summary)[1] == "bottleneck: prefill (baseline); network (hack)"
    assert utilisation_lines(_summary({"a": {"prefill": math.nan}}, {"a": parts}, {"a": 1.0})) == []


def test_with_both_phases_in_one_engine_the_mean_jct_is_split_between_them():
    """A colocated engine has no pool to call the bottleneck (prefill 60 % busy while the JCT is nearly all
    decode was called "bottleneck: prefill"). Hand-worked: prefill 60.5 % and 61 % of the GPUs' time; JCT
    0.1 + 0.2 = 0.3 s of 6.0 s in prefill (5 %), 5.7 s decoding (95 %); 0.12 + 0.24 = 0.36 s of 12.0 s (3 %),
    11.64 s (97 %); the network, 0 s, left out."""
    from cli import utilisation_lines

    parts = dict.fromkeys(
        ("prefill_queue", "prefill", "quantize", "transfer_queue", "transfer", "decode_queue", "decode"), 0.0
    )
    summary = _summary(
        {
            "baseline": {"prefill": 0.605, "network": 0.0, "decode": 0.047},
            "fp8": {"prefill": 0.61, "network": 0.0, "decode": 0.17},
        },
        {
            "baseline": {**parts, "prefill_queue": 0.1, "prefill": 0.2, "decode": 5.7},
            "fp8": {**parts, "prefill_queue": 0.12, "prefill": 0.24, "decode": 11.64},
        },
        {"baseline": 6.0, "fp8": 12.0},
    )
    assert utilisation_lines(summary, "colocated") == [
        "utilisation while requests arrive: prefill 60-61 %, network 0.0 %, decode 4.7-17 %",
        "each engine serves both phases (placement colocated): prefill chunks take 60-61 % of its GPUs' time and "
        "decode steps share the rest; the mean JCT is prefill 3-5 %, decode 95-97 %",
    ]
    assert utilisation_lines(summary)[1].startswith("bottleneck: prefill for every method")  # as if separate


def test_with_prefill_and_decode_on_the_same_gpus_the_bottleneck_is_those_gpus():
    """placement shared_gpu: the busier of prefill and decode is the GPUs both run on, not one pool (the line
    said "bottleneck: prefill"). Hand-worked: prefill 20 % and 15 % busy, decode 12 % and 11 %, network 2 % and
    12 %; prefill is the busiest pool for both methods, so the shared GPUs are the bottleneck. Waiting for and
    running in either phase: 0.01 + 0.03 + 0.02 (transfer_queue) + 1.34 = 1.40 s of 1.42 s (99 %, the 0.02 s
    transfer apart) and 0.04 + 0.01 (quantize) + 0.10 (decode_queue) + 1.42 + 0.001 (approximation) = 1.571 s
    of 1.58 s (99 %). With the link busiest for one method, the line names the GPUs and the link."""
    from cli import utilisation_lines

    zero = dict.fromkeys(POOL_PARTS_ALL, 0.0)
    summary = _summary(
        {
            "baseline": {"prefill": 0.20, "network": 0.02, "decode": 0.12},
            "hack": {"prefill": 0.15, "network": 0.12, "decode": 0.11},
        },
        {
            "baseline": {
                **zero,
                "prefill_queue": 0.01,
                "prefill": 0.03,
                "transfer_queue": 0.02,
                "decode": 1.34,
                "transfer": 0.02,
            },
            "hack": {
                **zero,
                "prefill": 0.04,
                "quantize": 0.01,
                "decode_queue": 0.10,
                "decode": 1.42,
                "approximation": 0.001,
                "transfer": 0.009,
            },
        },
        {"baseline": 1.42, "hack": 1.58},
    )
    assert utilisation_lines(summary, "shared_gpu") == [
        "utilisation while requests arrive: prefill 15-20 %, network 2.0-12 %, decode 11-12 %",
        "bottleneck: the shared GPUs (both pools) for every method (prefill 15-20 %, decode 11-12 % busy): waiting "
        "for and running in prefill or decode is 1.4-1.6 s of the 1.4-1.6 s mean JCT (99 %)",
    ]
    assert utilisation_lines(summary)[1].startswith("bottleneck: prefill for every method (15-20 % busy)")
    summary["methods"]["hack"]["utilisation"]["decode"] = 0.5  # decode busiest for hack: still the same GPUs
    assert utilisation_lines(summary, "shared_gpu")[1].startswith("bottleneck: the shared GPUs (both pools) for")
    assert utilisation_lines(summary)[1] == "bottleneck: prefill (baseline); decode (hack)"
    summary["methods"]["hack"]["utilisation"]["network"] = 1.7  # a slow link for hack alone
    assert utilisation_lines(summary, "shared_gpu")[1] == "bottleneck: the shared GPUs (baseline); network (hack)"


def test_the_default_scenario_says_where_its_time_goes():
    """The first run's TTFT is most of its JCT: the table says prefill is the bottleneck; one engine on one GPU
    (colocated) splits its JCT between the phases instead."""
    r = here("simulate", "a10g_10gbps", "--requests", "40", cwd="/")
    tail = r.stdout.splitlines()[-2:]
    assert tail[0].startswith("utilisation while requests arrive: prefill ")
    assert tail[1].startswith("bottleneck: prefill for every method")
    r = here("simulate", "one_gpu_vllm", "--requests", "40", cwd="/")
    assert r.stdout.splitlines()[-1].startswith("each engine serves both phases (placement colocated): prefill chunks")


# ---- outputs: all of a run or none of it --------------------------------------------------------------
def _files(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}


def test_ctrl_c_while_the_report_is_built_leaves_the_previous_run(tmp_path, monkeypatch):
    """The report is built beside the new tables in the temporary folder, and all move in together."""
    from typer.testing import CliRunner

    import cli as cli_module

    out = tmp_path / "o"
    args = ["simulate", "scenarios/a10g_10gbps.yaml", "--methods", "baseline", "--out", str(out), "--plotlyjs", "p.js"]
    assert CliRunner().invoke(cli_module.app, [*args, "--requests", "4"]).exit_code == 0
    before = _files(out)
    assert "report.html" in before

    def interrupt(*_a, **_k):
        raise KeyboardInterrupt

    monkeypatch.setattr(cli_module, "_build_report", interrupt)
    r = CliRunner().invoke(cli_module.app, [*args, "--requests", "5"])
    assert r.exit_code == 130 and r.stderr == f"interrupted by SIGINT; {out} is as it was\n"
    assert _files(out) == before


def test_without_a_report_an_old_report_goes(tmp_path):
    out = tmp_path / "o"
    assert (
        here("simulate", "scenarios/a10g_10gbps.yaml", "--requests", "4", "--out", out, "--plotlyjs", "p.js").returncode
        == 0
    )
    assert (out / "report.html").is_file()
    r = here("simulate", "scenarios/a10g_10gbps.yaml", "--requests", "5", "--out", out, "--no-report")
    assert r.returncode == 0 and not (out / "report.html").exists()


def test_sigterm_leaves_no_temporary_folder_and_a_later_run_clears_a_killed_ones(tmp_path):
    import os
    import signal
    import socket
    import time

    out = tmp_path / "o"
    proc = subprocess.Popen(
        [sys.executable, str(ROOT / "cli.py"), "simulate", "a10g_10gbps", "--requests", "300000", "--out", str(out)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        for _ in range(600):  # the run's temporary folder appears once the scenario is loaded
            if list(out.glob(".hacksim-*")) or proc.poll() is not None:
                break
            time.sleep(0.1)
        assert proc.poll() is None and list(out.glob(".hacksim-*"))
        proc.send_signal(signal.SIGTERM)
        _, stderr = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 143 and stderr == f"interrupted by SIGTERM; {out} is as it was\n", stderr
    assert not out.exists()
    # a run killed outright (SIGKILL) cannot clean up: the next run into the folder does, and leaves a live one
    out.mkdir()
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    host = socket.gethostname()
    (out / f".hacksim-{host}-{int(dead.stdout)}-abc").mkdir()
    (out / f".hacksim-{host}-{os.getpid()}-def").mkdir()
    assert here("simulate", "a10g_10gbps", "--requests", "4", "--out", out, "--no-report").returncode == 0
    assert sorted(p.name for p in out.glob(".hacksim-*")) == [f".hacksim-{host}-{os.getpid()}-def"]


def _limited(max_bytes: int):
    """Run a child with writes past `max_bytes` failing as on a full disk (EFBIG: Python ignores SIGXFSZ)."""
    import resource

    return lambda: resource.setrlimit(resource.RLIMIT_FSIZE, (max_bytes, max_bytes))


@pytest.mark.parametrize("limit_bytes", [100_000, 1_000_000], ids=["tables", "report"])
def test_a_full_disk_is_one_line_and_leaves_the_folder_as_it_was(tmp_path, limit_bytes):
    out = tmp_path / "o"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    r = subprocess.run(
        # 80 requests: requests.csv alone is about 160 kB (over the tables' limit), every table under 1 MB
        [sys.executable, str(ROOT / "cli.py"), "simulate", "a10g_10gbps", "--requests", "80", "--out", str(out)],
        capture_output=True,
        text=True,
        preexec_fn=_limited(limit_bytes),
    )
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "Traceback" not in r.stderr, r.stderr[-2000:]
    assert r.stderr.startswith(f"error: --out {out}: cannot write the outputs: File too large")
    assert sorted(p.name for p in out.iterdir()) == ["keep.txt"]  # no tables, no .report.html.tmp*, no .hacksim-*
    # rebuilding the report of a finished run into a full disk: one line, no temporary file left
    run = tmp_path / "run"
    assert here("simulate", "a10g_10gbps", "--requests", "20", "--out", run, "--no-report").returncode == 0
    r = subprocess.run(
        [sys.executable, str(ROOT / "cli.py"), "report", str(run)],
        capture_output=True,
        text=True,
        preexec_fn=_limited(1_000_000),
    )
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "File too large" in r.stderr, r.stderr[-2000:]
    assert not list(run.glob(".report.html.tmp*")) and not (run / "report.html").exists()


def test_validate_into_a_full_disk_is_one_line_and_writes_nothing(tmp_path):
    """validate --out writes validation.json and validation.html together (a temporary folder moved in), so a
    full disk neither leaves the new JSON beside no page (or an earlier run's) nor ends in a traceback; the
    result is printed only once the files are in place."""
    trace = ROOT / "realrun/traces/h200_graphs/h200g_70b8l_1gbps_baseline_r8"
    scenario = ROOT / "scenarios/measured/h200g_70b8l_1gbps.yaml"
    args = [sys.executable, str(ROOT / "cli.py"), "validate", str(trace), "--scenario", str(scenario)]
    out = tmp_path / "o"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    for folder in (out, tmp_path / "new"):
        r = subprocess.run([*args, "--out", str(folder)], capture_output=True, text=True, preexec_fn=_limited(20_000))
        assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr[-2000:]
        assert r.stderr == (
            f"error: --out {folder}: cannot write validation.json, validation.html: File too large; nothing was "
            "written\n"
        )
        assert r.stdout == ""
    assert sorted(p.name for p in out.iterdir()) == ["keep.txt"]
    assert not (tmp_path / "new").exists()
    r = here(*args[2:], "--out", "o", "--plotlyjs", "js/p.js", "-q", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert sorted(p.name for p in out.iterdir()) == ["keep.txt", "validation.html", "validation.json"]
    assert 'src="../js/p.js"' in (out / "validation.html").read_text()  # relative to the page, not the temp folder
