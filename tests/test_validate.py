"""`validate` replays a trace's workload through a scenario and scores the simulator."""

from __future__ import annotations

import copy
import json
import subprocess
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml

from helpers import TINY
from simulator.config import ScenarioError, parse_scenario
from simulator.run import run_scenario
from simulator.validate import validate

ROOT = Path(__file__).resolve().parent.parent


def here(*args) -> subprocess.CompletedProcess:
    """The CLI in this process (typer's CliRunner), as subprocess.run returns it: a fresh interpreter costs a
    second of imports. An exception the CLI did not turn into an exit code is raised, as a traceback fails."""
    from typer.testing import CliRunner

    import cli

    r = CliRunner().invoke(cli.app, [str(a) for a in args])
    if r.exception is not None and not isinstance(r.exception, SystemExit):
        raise r.exception
    return subprocess.CompletedProcess(list(args), r.exit_code, r.stdout, r.stderr)


def _setup(tmp_path, scale_decode: float = 1.0):
    raw = copy.deepcopy(TINY)
    raw["workload"].update(
        requests=40,
        arrival={"kind": "poisson", "rate_rps": 3.0},
        input_tokens={"kind": "uniform", "min_tokens": 256, "max_tokens": 4096},
        output_tokens={"kind": "uniform", "min_tokens": 2, "max_tokens": 64},
    )
    raw["prefill"]["replicas"] = 2
    raw["methods"] = ["hack"]
    scen = tmp_path / "scenario.yaml"
    scen.write_text(yaml.safe_dump(raw))
    df = run_scenario(parse_scenario(raw, "t")).requests
    # A "measured" trace: the simulator's own timestamps, decode stretched by `scale_decode`.
    df["finish_s"] = df["decode_start_s"] + (df["finish_s"] - df["decode_start_s"]) * scale_decode
    trace = tmp_path / "trace"
    trace.mkdir()
    cols = [
        "request_id",
        "method",
        "arrival_s",
        "prompt_tokens",
        "output_tokens",
        "prefill_start_s",
        "prefill_end_s",
        "quantize_end_s",
        "transfer_start_s",
        "transfer_end_s",
        "decode_start_s",
        "first_token_s",
        "finish_s",
    ]
    df[cols].to_csv(trace / "requests.csv", index=False)
    (trace / "meta.json").write_text(json.dumps({"method": "hack"}))
    return trace, scen


def test_validate_against_own_trace_is_exact(tmp_path):
    trace, scen = _setup(tmp_path)
    v = validate(trace, scen)
    for key, value in v.items():
        if key.endswith("_error_pct") and value is not None:
            assert abs(value) < 1e-6, key


def test_validate_sees_a_slower_decode(tmp_path):
    trace, scen = _setup(tmp_path, scale_decode=1.25)
    v = validate(trace, scen)
    assert v["decode_mean_error_pct"] == pytest.approx(100 * (1 / 1.25 - 1), rel=1e-6)
    assert v["jct_mean_error_pct"] < 0
    assert abs(v["ttft_mean_error_pct"]) < 1e-6


def test_validate_cli_writes_json_and_figure(tmp_path):
    trace, scen = _setup(tmp_path)
    out = tmp_path / "val"
    r = here("validate", str(trace), "--scenario", str(scen), "--out", str(out))
    assert r.returncode == 0, r.stderr
    assert "jct mean" in r.stdout
    as_json = here("validate", str(trace), "--scenario", str(scen), "--json")
    v = json.loads(as_json.stdout)
    assert "jct_mean_error_pct" in v and "ttft_p50_error_pct" in v and "tpot_p99_error_pct" in v
    assert v == json.loads((out / "validation.json").read_text())
    assert "Plotly.newPlot" in (out / "validation.html").read_text()
    bad = here("validate", str(tmp_path), "--scenario", str(scen))
    assert bad.returncode == 2 and "requests.csv" in bad.stderr and "Traceback" not in bad.stderr


def test_validate_index_table_json_figure_and_bad_index(tmp_path):
    """An index.csv validates every listed trace: one table with the mean/max rows, JSON rows, the
    per-trace error figure; a malformed index is one line naming it, exit 2, nothing written."""
    trace, scen = _setup(tmp_path)
    idx = tmp_path / "index.csv"
    idx.write_text(f"trace,scenario\n{trace.name},{scen.name}\n{trace},{scen}\n")  # relative and absolute
    out = tmp_path / "val"
    r = here("validate", str(idx), "--out", str(out))
    assert r.returncode == 0, r.stderr
    assert "mean |error|" in r.stdout and "max |error|" in r.stdout
    quiet = here("validate", str(idx), "--json", "--quiet")
    rows = json.loads(quiet.stdout)
    assert quiet.stderr == "" and rows == json.loads((out / "validation.json").read_text())
    assert len(rows) == 2 and all(abs(row["jct_mean_error_pct"]) < 1e-6 for row in rows)  # its own trace
    assert "Plotly.newPlot" in (out / "validation.html").read_text()
    bad = tmp_path / "bad.csv"
    bad.write_text("path,scen\nx,y\n")
    r = here("validate", str(bad), "--out", str(tmp_path / "none"))
    assert r.returncode == 2 and "bad.csv" in r.stderr and "trace" in r.stderr and "Traceback" not in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and not (tmp_path / "none").exists()


def test_validation_page_is_figures_then_a_collapsible_scenario(tmp_path):
    """The validation page uses the report template: the figure, a table of every metric, the resolved
    scenario folded into <details>; no screen of raw JSON."""
    from reports.validation import write_validation_report

    trace, scen = _setup(tmp_path)
    v = validate(trace, scen)
    page = write_validation_report(v, tmp_path / "validation.html").read_text()
    assert page.index('id="fig-validation"') < page.index('id="table-validation"') < page.index('id="scenario"')
    assert "<nav>" in page and 'class="glance"' in page
    body = page[page.index("<main>") : page.index("</main>")]
    assert body.count("<pre>") == body.count("<details>") > 0 and '"jct_mean_error_pct"' not in body


def test_tpot_counts_the_tokens_after_the_first(tmp_path):
    """TPOT is the time from the first token to the last over the output tokens after the first: a request of
    5 tokens whose first comes at 1.0 s and last at 2.0 s has TPOT (2.0 − 1.0) / (5 − 1) = 0.25 s, one of 3
    tokens from 0.5 to 0.7 s 0.1 s; one of 1 token has none."""
    from simulator.validate import measured_parts

    df = pd.DataFrame(
        {
            "arrival_s": [0.0, 0.0, 0.0],
            "prompt_tokens": [10, 10, 10],
            "output_tokens": [5, 3, 1],
            "first_token_s": [1.0, 0.5, 0.3],
            "finish_s": [2.0, 0.7, 0.3],
        }
    )
    tpot = measured_parts(df)["tpot"]
    assert tpot.iloc[0] == pytest.approx(0.25) and tpot.iloc[1] == pytest.approx(0.1) and np.isnan(tpot.iloc[2])


def test_a_measured_requests_breakdown_by_hand():
    """The parts of a request with every phase timestamp, by the simulator's definitions. Request 0: arrival 0,
    prefill 1-3, quantize to 3.5, transfer 4-6, decode 6.5-10: queue 1, prefill 2, quantize 0.5, transfer queue
    0.5, transfer 2, decode queue 0.5, decode 3.5. Request 1 streams its KV during the prefill (transfer 2-3.2,
    before its quantize ends at 3.5): the transfer counts from the quantize's end, none of it queued, 0 s long,
    and decode waits from 3.5 to 4."""
    from simulator.validate import measured_parts

    df = pd.DataFrame(
        {
            "arrival_s": [0.0, 0.0],
            "prefill_start_s": [1.0, 1.0],
            "prefill_end_s": [3.0, 3.0],
            "quantize_end_s": [3.5, 3.5],
            "transfer_start_s": [4.0, 2.0],
            "transfer_end_s": [6.0, 3.2],
            "decode_start_s": [6.5, 4.0],
            "finish_s": [10.0, 6.0],
            "output_tokens": [5, 5],
        }
    )
    parts = measured_parts(df)
    cols = ["prefill_queue", "prefill", "quantize", "transfer_queue", "transfer", "decode_queue", "decode"]
    np.testing.assert_allclose(parts[cols].iloc[0], [1.0, 2.0, 0.5, 0.5, 2.0, 0.5, 3.5], rtol=1e-12)
    np.testing.assert_allclose(parts[cols].iloc[1], [1.0, 2.0, 0.5, 0.0, 0.0, 0.5, 2.0], rtol=1e-12)
    np.testing.assert_allclose(parts[cols].sum(axis=1), parts["jct"], rtol=1e-12)
    np.testing.assert_allclose(parts["ttft"], [3.0, 3.0], rtol=1e-12)  # no first_token_s: the prefill's end


def test_a_trace_whose_meta_contradicts_the_scenario_is_refused(tmp_path):
    """A 70B trace against an 8B scenario would be scored (+348 %) and fitted as the 8B's: refused in one line
    naming the field, by validate and by calibrate."""
    trace, scen = _setup(tmp_path)
    (trace / "meta.json").write_text(json.dumps({"method": "hack", "model": "llama-3.1-70b"}))
    with pytest.raises(ScenarioError) as e:
        validate(trace, scen)
    assert "meta.json: model 'llama-3.1-70b' contradicts" in str(e.value) and "model.preset" in str(e.value)
    (trace / "meta.json").write_text(json.dumps({"method": "hack", "model": "llama-3.1-8b", "link_gbps": 40}))
    with pytest.raises(ScenarioError, match="link_gbps 40 contradicts .*network.bandwidth_gbps 10"):
        validate(trace, scen)
    idx = tmp_path / "index.csv"
    idx.write_text(f"trace,scenario\n{trace},{scen}\n")
    p = here("calibrate", "--traces", str(idx), "--out", str(tmp_path / "e.json"))
    assert p.returncode == 2 and "link_gbps" in p.stderr and "Traceback" not in p.stderr
    (trace / "meta.json").write_text(json.dumps({"method": "hack", "model": "llama-3.1-8b", "link_gbps": 10}))
    assert validate(trace, scen)["requests"] == 40  # agreeing fields pass


def test_validate_reports_the_wait_for_kv_room(tmp_path):
    """The KV wait per request: transfer_start_s - quantize_end_s (its KV ready to its admission), averaged;
    in %, and in seconds for a measured wait of about 0."""
    from reports.validation import validation_page
    from simulator.validate import format_validation, format_validation_table

    trace, scen = _setup(tmp_path)
    own = pd.read_csv(trace / "requests.csv")
    sim_wait = float((np.maximum(own.transfer_start_s, own.quantize_end_s) - own.quantize_end_s).mean())
    # the "measured" run: every transfer starts 0.5 s after the KV is ready, the rest of its timeline shifted
    measured = own.copy()
    shift = measured["quantize_end_s"] + 0.5 - measured["transfer_start_s"]
    later = measured["first_token_s"] >= measured["transfer_start_s"]
    for col in ("transfer_start_s", "transfer_end_s", "decode_start_s", "finish_s"):
        measured[col] += shift
    measured.loc[later, "first_token_s"] += shift[later]
    measured.to_csv(trace / "requests.csv", index=False)
    v = validate(trace, scen)
    kv = v["kv_wait_s"]
    assert kv["measured"] == pytest.approx(0.5)
    assert kv["simulated"] == pytest.approx(sim_wait)
    assert v["kv_wait_error_s"] == pytest.approx(sim_wait - 0.5)
    assert v["kv_wait_mean_error_pct"] == pytest.approx(100 * (sim_wait - 0.5) / 0.5)
    text = format_validation(v)
    assert "kv wait mean (s)" in text and f"({sim_wait - 0.5:+.4f} s)" in text
    row = {"trace": "t", "scenario": "s", "method": "hack", "requests": 40}
    row |= {k: v.get(k) for k in ("jct_mean_error_pct", "kv_wait_mean_error_pct", "kv_wait_error_s")}
    table = format_validation_table([row | {k: None for k in _other_summary_keys()}])
    assert "kv wait (s)" in table and f"{sim_wait - 0.5:+.3f} s" in table
    page = validation_page(v)
    assert "KV wait error" in page.summary_html and f"{sim_wait - 0.5:+.3f} s" in page.summary_html


def _other_summary_keys():
    from simulator.validate import SUMMARY_KEYS

    return [k for k in SUMMARY_KEYS if k not in ("jct_mean_error_pct", "kv_wait_mean_error_pct", "kv_wait_error_s")]


def test_a_shipped_index_reads_from_any_folder(tmp_path, monkeypatch):
    """The shipped indexes name their scenarios as the repository has them (scenarios/measured/...): from
    another folder they were looked for beside the index and not found (`no such file`); hacksim's own folder
    is now the last place tried. A path found in the current folder or beside the index still wins."""
    from simulator.measured import read_index

    index = ROOT / "realrun" / "traces" / "h200_graphs" / "index.csv"
    monkeypatch.chdir(tmp_path)
    rows = read_index(index)
    assert rows[0].scenario == "scenarios/measured/h200g_70b8l_1gbps.yaml"
    assert rows[0].scenario_path == ROOT / "scenarios" / "measured" / "h200g_70b8l_1gbps.yaml"
    assert rows[0].trace_path == index.parent / rows[0].trace
    (tmp_path / "scenarios" / "measured").mkdir(parents=True)
    (tmp_path / "scenarios" / "measured" / "h200g_70b8l_1gbps.yaml").write_text("mine")
    assert read_index(index)[0].scenario_path == Path("scenarios/measured/h200g_70b8l_1gbps.yaml")
