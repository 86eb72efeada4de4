"""An engine calibration's domain (simulator/domain.py): the settings of the runs it was fitted on, and where a
scenario or a held-out configuration lies outside them."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from simulator.domain import domain_of, merge_domains, outside
from test_cli import cli

ROOT = Path(__file__).resolve().parents[1]


def _engine_file(folder: Path, domain: dict) -> Path:
    """An engine calibration that fits nothing and says its runs' `domain`."""
    path = folder / "engine.json"
    doc = {"kind": "hacksim-engine-calibration", "schema_version": 1, "engine": "test", "parameters": {}}
    path.write_text(json.dumps({**doc, "domain": domain}))
    return path


def _setting(**kw):
    s = {
        "gpu": "h200",
        "placement": "shared_gpu",
        "model": "llama-3.1-8b (32 layers)",
        "methods": ["baseline"],
        "prompt_tokens": [1000, 3000],
        "output_tokens": [40, 150],
        "link_gbps": 10.0,
        "prefill_batch_requests": 1,
    }
    return {**s, **kw}


def test_a_setting_inside_every_range_is_not_outside_and_each_way_out_is_named():
    dom = domain_of([_setting(), _setting(link_gbps=40.0, methods=["hack"], prompt_tokens=[500, 2000])])
    assert dom["link_gbps"] == [10.0, 40.0]
    assert dom["models"]["llama-3.1-8b (32 layers)"]["prompt_tokens"] == [500, 3000]
    assert outside(dom, _setting(link_gbps=25.0, methods=["hack", "baseline"])) == []
    # a run's 5th-95th percentile moves by a few percent between draws: within 10 % of the edge is inside
    assert outside(dom, _setting(prompt_tokens=[460, 3250])) == []
    lines = outside(
        dom,
        _setting(
            gpu="h100",
            placement="separate",
            methods=["pqcache"],
            link_gbps=1.0,
            prefill_batch_requests=4,
            prompt_tokens=[8000, 16000],
        ),
    )
    assert [line.split(" ")[0] for line in lines] == ["GPU", "placement", "method", "link", "a", "llama-3.1-8b"]
    assert "link 1 Gbps (the runs': 10-40 Gbps)" in lines
    assert "prompts of 8000-16000 tokens (the runs': 500-3000 tokens)" in lines[-1]
    other = outside(dom, _setting(model="llama-3.1-70b (8 layers)"))
    assert other == ["model llama-3.1-70b (8 layers) (the runs': llama-3.1-8b (32 layers))"]
    assert outside({}, _setting()) == []  # a file from before domains: nothing to say


def test_a_refit_s_domain_is_its_runs_and_its_base_s():
    base = domain_of([_setting(link_gbps=2.5)])
    runs = domain_of([_setting(gpu="h100", model="llama-3.1-70b (8 layers)", link_gbps=40.0)])
    both = merge_domains(runs, base)
    assert both["gpus"] == ["h100", "h200"] and both["link_gbps"] == [2.5, 40.0]
    assert set(both["models"]) == {"llama-3.1-8b (32 layers)", "llama-3.1-70b (8 layers)"}
    assert merge_domains(runs, None) is runs


@pytest.fixture(scope="module")
def graphs():
    from simulator.calibrate import load_index

    return load_index(ROOT / "realrun/traces/h200_graphs/index.csv")


def test_each_run_records_its_setting_from_its_scenario_and_requests(graphs):
    td = next(t for t in graphs if t.name.endswith("h200g_8b_mem_hack_r7.5"))
    s = td.setting
    assert (s["gpu"], s["placement"], s["model"], s["methods"]) == (
        "h200",
        "shared_gpu",
        "llama-3.1-8b (32 layers)",
        ["hack"],
    )
    assert s["link_gbps"] == 50.0 and s["prefill_batch_requests"] == 1
    # realrun drew its prompts uniform in [1024, 3072] and outputs in [192, 448]: the 5th-95th percentiles inside
    assert 1024 <= s["prompt_tokens"][0] < 1300 and 2800 < s["prompt_tokens"][1] <= 3072
    assert 192 <= s["output_tokens"][0] < 240 and 400 < s["output_tokens"][1] <= 448


def test_the_held_out_configurations_a_fit_predicts_worse_than_none_lie_outside_its_runs(graphs):
    """h200_graphs held out by configuration: the three the fit predicts worse than no fit (docs/calibration.md) are
    each outside the others' runs (the only 1 Gbps link; the only short prompts on the 32-layer 8B; the only 50 Gbps
    link); the two inside every range are predicted better."""
    from simulator.crossval import outside_runs

    said = {}
    for c in sorted({t.configuration for t in graphs}):
        said[c] = outside_runs([t for t in graphs if t.configuration != c], [t for t in graphs if t.configuration == c])
    assert said["h200g_70b8l_2.5gbps"] == [] and said["h200g_8b_sat"] == []
    assert said["h200g_70b8l_1gbps"][0] == "link 1 Gbps (the runs': 2.5-50 Gbps)"
    assert any("llama-3.1-8b (32 layers) prompts of" in line for line in said["h200g_8b_2.5gbps"])
    assert said["h200g_8b_mem"][0] == "link 50 Gbps (the runs': 1-40 Gbps)"
    assert all(len(set(lines)) == len(lines) for lines in said.values())  # each way out said once


def test_calibrate_writes_the_domain_and_simulate_names_where_a_scenario_leaves_it(tmp_path):
    from simulator.engine import read_engine_file

    domain = domain_of([_setting(link_gbps=40.0, methods=["baseline", "hack", "kvquant"])])
    engine = _engine_file(tmp_path, domain)
    assert read_engine_file(engine, ValueError).domain_dict() == domain
    out = tmp_path / "run"
    p = cli(
        "simulate",
        "scenarios/measured/h200g_8b_long.yaml",
        "--requests",
        20,
        "--set",
        f"calibration.engine={engine}",
        "--out",
        out,
        "--no-report",
    )
    assert p.returncode == 0, p.stderr
    note = next(line for line in p.stderr.splitlines() if line.startswith("note: calibration.engine"))
    assert "prompts of" in note and "(the runs': 1000-3000 tokens)" in note and "link" not in note
    beyond = json.loads((out / "profiles.json").read_text())["engine"]["outside"]
    assert len(beyond) == 2 and beyond[0].startswith("llama-3.1-8b (32 layers) prompts of")  # and its outputs
    assert "outputs of" in beyond[1]


def test_a_fitted_calibration_s_domain_spans_its_runs(graphs):
    from simulator.calibrate import engine_file, fit_engine

    runs = [t for t in graphs if t.configuration in ("h200g_8b_sat", "h200g_70b8l_1gbps")]
    doc = engine_file(fit_engine(runs), runs, "index.csv", "calibrate", "test")
    dom = doc["domain"]
    assert dom["link_gbps"] == [1.0, 40.0] and dom["methods"] == ["baseline", "hack", "kvquant"]
    lengths = np.array([t.setting["prompt_tokens"] for t in runs if t.setting["model"].startswith("llama-3.1-8b")])
    assert dom["models"]["llama-3.1-8b (32 layers)"]["prompt_tokens"] == [lengths[:, 0].min(), lengths[:, 1].max()]


def test_validate_notes_where_the_run_lies_outside_its_scenario_s_engine_calibration(tmp_path):
    from simulator.validate import validate

    engine = _engine_file(tmp_path, domain_of([_setting(link_gbps=40.0, methods=["baseline", "hack", "kvquant"])]))
    trace = ROOT / "realrun/traces/h200_graphs/h200g_70b8l_1gbps_hack_r8"
    v = validate(trace, ROOT / "scenarios/measured/h200g_70b8l_1gbps.yaml", [f"calibration.engine={engine}"])
    note = next(n for n in v["notes"] if n.startswith("calibration.engine engine.json"))
    assert "link 1 Gbps (the runs': 40 Gbps)" in note and "model llama-3.1-70b (8 layers)" in note


def test_validate_cv_with_a_base_names_where_each_configuration_leaves_the_base_s_runs():
    from simulator.crossval import cross_validate_machine, format_cv_machine

    dom = domain_of(
        [
            _setting(gpu="h100", link_gbps=40.0, methods=["baseline", "hack", "kvquant"]),
            _setting(gpu="h100", link_gbps=50.0, prompt_tokens=[100, 2000], output_tokens=[30, 300]),
        ]
    )
    r = cross_validate_machine(ROOT / "realrun/traces/h100_long/index.csv", {}, "base.json", base_domain=dom)
    said = {c["configuration"]: c["outside_base_runs"] for c in r["configurations"]}
    assert said["h100g_8b_small"] == []  # 50 Gbps, 0.4-1.9K-token prompts: inside
    assert said["h100g_70b8l_long"] == [
        "link 25 Gbps (the runs': 40-50 Gbps)",
        "model llama-3.1-70b (8 layers) (the runs': llama-3.1-8b (32 layers))",
    ]
    assert len(said["h100g_8b_long"]) == 1 and "prompts of" in said["h100g_8b_long"][0]
    text = format_cv_machine(r)
    assert (
        "lies outside the runs base.json was fitted on" in text
        and "h100g_8b_small on" not in text.split("lies outside the runs")[1].split("each method")[0]
    )


def test_a_malformed_domain_is_refused_in_one_line_naming_the_field_and_the_file(tmp_path):
    engine = _engine_file(tmp_path, {"link_gbps": "fast"})
    p = cli(
        "simulate", "scenarios/measured/h200g_8b_sat.yaml", "--requests", 5, "--set", f"calibration.engine={engine}"
    )
    assert p.returncode == 2 and "Traceback" not in p.stderr
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and "engine.json" in lines[0] and "domain.link_gbps" in lines[0], p.stderr
