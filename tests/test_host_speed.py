"""`simulate --host-spread`: what the host's run-to-run speed alone moves each method's mean JCT by, in the terminal
table, summary.json and report.html (simulator/host_speed.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from simulator.engine import on_host
from simulator.host_speed import HOST_SPEED_SPREAD_PCT, HOST_STEP, host_sensitivity
from simulator.load import load_scenario
from simulator.run import run_scenario
from tests.test_cli import here

ROOT = Path(__file__).resolve().parents[1]
HOST_BOUND = ROOT / "scenarios/measured/h200g_8b_mem.yaml"  # the 32-layer 8B's short steps: host time matters


def test_simulate_prices_each_method_on_a_faster_and_a_slower_host(tmp_path):
    """Each method's figure is its mean JCT's elasticity in the host's time, from the scenario at every host time
    term x and / 1.25 (recomputed here by hand), times the host's speed spread; summary.json and the report carry it,
    and a run without the flag is as it was."""
    out = tmp_path / "run"
    r = here("simulate", HOST_BOUND, "--requests", "60", "--host-spread", "--out", out, "--json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc == json.loads((out / "summary.json").read_text())
    assert doc["host_speed"]["spread_pct"] == HOST_SPEED_SPREAD_PCT and doc["host_speed"]["priced"]

    s = load_scenario(HOST_BOUND, ["workload.requests=60"])
    fast, slow = (run_scenario(on_host(s, f)).summary["methods"] for f in (1 / HOST_STEP, HOST_STEP))
    for name, m in doc["methods"].items():
        x = host_sensitivity(fast[name]["jct_s"]["mean"], slow[name]["jct_s"]["mean"])
        assert m["host_sensitivity"] == pytest.approx(x, abs=1e-4) and 0.05 < x < 1, name
        assert m["host_spread_jct_mean_pct"] == pytest.approx(x * HOST_SPEED_SPREAD_PCT, abs=0.01)
        assert slow[name]["jct_s"]["mean"] > m["jct_s"]["mean"] > fast[name]["jct_s"]["mean"]
    page = (out / "report.html").read_text()
    assert "<th>± host</th>" in page and f"±{doc['methods']['hack']['host_spread_jct_mean_pct']:.1f}%" in page

    plain = here("simulate", HOST_BOUND, "--requests", "60", "--json")
    assert plain.returncode == 0 and "host_speed" not in json.loads(plain.stdout)
    base = json.loads(plain.stdout)["methods"]["hack"]
    assert base["jct_s"] == doc["methods"]["hack"]["jct_s"] and "host_sensitivity" not in base


def test_a_scenario_without_host_time_says_so():
    """The default scenario prices no host time: nothing for the host's speed to move, said in one line, no figure."""
    r = here("simulate", "a10g_10gbps", "--requests", "30", "--methods", "baseline,hack", "--host-spread")
    assert r.returncode == 0, r.stderr
    head, *rows = [x for x in r.stdout.splitlines() if x.startswith(("method", "baseline", "hack"))]
    assert "± host" in head and all(x.split()[3] == "–" for x in rows)
    assert "± host: n/a, the scenario prices no host time" in r.stdout


def test_validate_gives_no_host_figure_where_the_scenario_prices_no_host_time(tmp_path):
    """A vLLM benchmark file validated against a scenario whose engine prices no host time: no elasticity (a bare 0
    would read as 'the host moves nothing'), a note that says why, nothing on the page; against the system that made
    it, a figure."""
    import yaml

    from reports.validation import validation_page
    from simulator.host_speed import prices_host_time
    from simulator.validate import add_host_spread, format_validation, validate
    from tests.simulated_runs import TRUE, raw_system, simulate, write_vllm

    raw = raw_system(n=30)
    (_, df, it), *_ = simulate(raw, TRUE, ["baseline"])
    bench = write_vllm(tmp_path / "bench.json", df, it, 6.0)
    own = tmp_path / "system.yaml"
    own.write_text(yaml.safe_dump({**raw, "methods": ["baseline"]}))
    assert not prices_host_time(load_scenario(ROOT / "scenarios/a10g_10gbps.yaml"))
    assert prices_host_time(load_scenario(own))

    v = validate(bench, ROOT / "scenarios/a10g_10gbps.yaml", ["methods=[baseline]"])
    assert v["host_sensitivity"] is None and add_host_spread(v, None) is None
    assert "host speed alone: n/a, the scenario prices no host time" in "\n".join(v["notes"])
    assert "host speed alone (mean JCT)" not in format_validation(v)
    assert "±" not in validation_page(v).summary_html
    mine = validate(bench, own)
    assert mine["host_sensitivity"] > 0 and add_host_spread(mine, None) is not None


def test_a_scenario_on_a_slower_host_prices_its_host_time_terms_slower():
    """calibration.host_speed_factor: every host time term its placement applies priced times the factor, nothing
    else moved; the scenario keeps its terms and the factor (read again, the same), a round trip through
    scenario_values and apply_values is exact; it prices what simulate --host-spread prices; a scenario with no
    host time is the same on any host."""
    from simulator.config import parse_scenario
    from simulator.engine import HOST_TIMES, apply_values, host_times, priced
    from simulator.fit_items import scenario_values
    from simulator.load import resolve_workload_files

    plain = load_scenario(HOST_BOUND, ["workload.requests=40"])
    slow = load_scenario(HOST_BOUND, ["workload.requests=40", "calibration.host_speed_factor=1.25"])
    assert host_times(plain) and host_times(slow) == pytest.approx({n: 1.25 * v for n, v in host_times(plain).items()})
    others = {n: v for n, v in scenario_values(plain).items() if n not in HOST_TIMES}
    assert {n: v for n, v in scenario_values(slow).items() if n not in HOST_TIMES} == others
    assert slow.calibration.host_speed_factor == 1.25 and slow.decode == plain.decode  # stored as given
    assert priced(slow).calibration.host_speed_factor == 1.0 and host_times(priced(slow)) == host_times(slow)
    assert scenario_values(apply_values(slow, scenario_values(slow))) == pytest.approx(scenario_values(slow), rel=1e-12)
    again = resolve_workload_files(parse_scenario(slow.model_dump(mode="json"), "again"), HOST_BOUND.parent, "again")
    assert again == slow
    jct = {
        name: [run_scenario(s).summary["methods"][m]["jct_s"]["mean"] for m in ("baseline", "kvquant", "hack")]
        for name, s in (("plain", plain), ("slow", slow), ("by hand", on_host(plain, 1.25)))
    }
    assert jct["slow"] == pytest.approx(jct["by hand"], rel=1e-12) and all(
        a > b for a, b in zip(jct["slow"], jct["plain"])
    )
    a10g = ROOT / "scenarios/a10g_10gbps.yaml"
    fast = load_scenario(a10g, ["workload.requests=20", "calibration.host_speed_factor=0.5"])
    assert not host_times(fast) and priced(fast) == load_scenario(a10g, ["workload.requests=20"])


def test_a_bad_host_speed_factor_is_one_line_naming_it():
    for bad, why in (("0", "greater than 0"), ("-1", "greater than 0"), ("fast", "a valid number")):
        r = here("simulate", HOST_BOUND, "--set", f"calibration.host_speed_factor={bad}")
        assert r.returncode == 2 and r.stdout == ""
        assert r.stderr.strip() == f"error: {HOST_BOUND}: calibration.host_speed_factor: Input should be {why}"
