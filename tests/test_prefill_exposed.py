"""An eagerly issued prefill exposes CPU time even where its GPU work is the longer: the batch lasts
max(GPU + per batch + layers x per layer, host floor) (prefill.host_exposed_s_*; costmodel/phases.py, `_prefill`),
the two terms measured by realrun.prefillprof (the eager forward against its CUDA-graph replay), carried by the
realrun scenarios, priced the same way by calibrate.predict, and refused where nothing would use them."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml

from helpers import scenario
from realrun.prefillprof import fit_exposed
from simulator.config import ScenarioError
from simulator.resolve import resolve

ROOT = Path(__file__).resolve().parent.parent
PROFILE = ROOT / "kernels_calibration/profiles/h100/prefillprof.csv"


def replica(**settings):
    s = scenario()
    pre, _ = resolve(s).costs(s.methods[0])
    return dataclasses.replace(pre, **settings)


def test_a_gpu_bound_prefill_takes_its_exposed_time_on_top_a_host_bound_one_its_floor():
    a, b = 4e-4, 1.7e-5
    plain = replica()
    layers = plain.model.layers
    gpu = plain.prefill((4096,)).latency_s
    exposed = replica(host_exposed_s_per_iteration=a, host_exposed_s_per_layer=b)
    assert exposed.prefill((4096,)).latency_s == pytest.approx(gpu + a + layers * b, rel=1e-12)
    # a floor above GPU + exposed holds the batch at the floor, as before
    floor = gpu + a + layers * b + 0.010
    both = replica(host_exposed_s_per_iteration=a, host_exposed_s_per_layer=b, host_issue_s_per_iteration=floor)
    assert both.prefill((4096,)).latency_s == pytest.approx(floor, rel=1e-12)
    # the host's level scales them as every prefill-floor term (a busy link endpoint, a machine factor)
    slow = exposed.with_host_factor(1.0, prefill_floor_factor=2.0)
    assert slow.prefill((4096,)).latency_s == pytest.approx(gpu + 2 * (a + layers * b), rel=1e-12)


def _trace():
    from simulator.fit_items import load_trace_data

    return load_trace_data(
        ROOT / "realrun/traces/h200_graphs/h200g_8b_mem_baseline_r7.5", ROOT / "scenarios/measured/h200g_8b_mem.yaml"
    )


def test_calibrate_prices_the_exposed_time_as_the_cost_model_and_its_derivatives_hold():
    """On a recorded run with GPU-bound prefills (8b_mem, 1-3K-token prompts, 32 layers), every prefill item is
    priced (a + 32 b) x its floor level longer than with the terms at 0 (the first-seen time, whose shown share
    falls as the batch lengthens, at 0); the derivatives, with it, match central differences."""
    from simulator.calibrate import FIRST_SEEN, predict

    td = _trace()
    v = dict(td.values0)
    a, b = v["prefill.host_exposed_s_per_iteration"], v["prefill.host_exposed_s_per_layer"]
    assert (a, b) == (0.00049, 0.0000145)  # the scenario's
    plain = {**v, FIRST_SEEN: 0.0}
    off = predict(
        td, "prefill", {**plain, "prefill.host_exposed_s_per_iteration": 0.0, "prefill.host_exposed_s_per_layer": 0.0}
    )
    on = predict(td, "prefill", plain)
    idle = td.blocks["prefill"]["busy_left_s"] == 0  # a transfer in flight scales host terms (test_link_host)
    assert idle.sum() > 20
    assert on[idle] - off[idle] == pytest.approx(np.full(idle.sum(), a + 32 * b), rel=1e-9)
    names = ("prefill.host_exposed_s_per_iteration", "prefill.host_exposed_s_per_layer")
    _, d = predict(td, "prefill", v, names)
    for n, h in zip(names, (1e-5, 1e-7)):
        fd = (predict(td, "prefill", {**v, n: v[n] + h}) - predict(td, "prefill", {**v, n: v[n] - h})) / (2 * h)
        assert d[n] == pytest.approx(fd, rel=1e-5, abs=1e-9), n


def _rows(a: float, b: float, seed: int, run: str) -> pd.DataFrame:
    """prefillprof rows of a host whose eager prefills expose a + b x layers over the replay (noise 30 us), GPU-bound
    at every length but the shortest on the 8B at 32 layers (host-bound: left out of the fit)."""
    rng = np.random.default_rng(seed)
    rows = []
    for st, layers, per_token_s in (("70b:4", 4, 5e-6), ("70b:8", 8, 1e-5), ("8b:16", 16, 7e-6), ("8b:32", 32, 1.4e-5)):
        for tokens in (128, 512, 1024, 2048, 4096):
            graph = 2e-3 + per_token_s * tokens
            issue = 0.28e-3 * layers
            for rep in range(5):
                eager = max(graph + a + b * layers, issue + 0.3e-3) + rng.normal(0, 3e-5)
                rows.append(dict(run=run, set=st, tokens=tokens, rep=rep, eager_s=eager, issue_s=issue, graph_s=graph))
    return pd.DataFrame(rows)


def test_the_fit_recovers_the_exposed_terms_and_keeps_out_what_it_cannot_use(tmp_path):
    f = tmp_path / "pp.csv"
    pd.concat([_rows(4e-4, 1.5e-5, 1, "h1"), _rows(5e-4, 2e-5, 2, "h2")]).to_csv(f, index=False)
    fit = fit_exposed([f])
    assert fit["host_exposed_s_per_iteration"] == pytest.approx(4.5e-4, abs=3 * fit["stderr_per_iteration_s"] + 2e-5)
    assert fit["host_exposed_s_per_layer"] == pytest.approx(1.75e-5, abs=3 * fit["stderr_per_layer_s"] + 1e-6)
    assert set(fit["runs"]) == {"0:h1", "0:h2"}
    assert fit["runs"]["0:h1"]["per_iteration_s"] < fit["runs"]["0:h2"]["per_iteration_s"]
    # host-bound lengths (the replay under 1.2 x the CPU's part) and long ones (over 30 ms) stay out
    d = pd.read_csv(f)
    kept = d[(d.graph_s >= 1.2 * d.issue_s) & (d.graph_s <= 0.030)].groupby(["run", "set", "tokens"]).ngroups
    assert fit["rows"] == kept < d.groupby(["run", "set", "tokens"]).ngroups
    # one layer count cannot split the two terms
    one = tmp_path / "one.csv"
    d[d["set"] == "70b:8"].to_csv(one, index=False)
    with pytest.raises(ValueError, match="two layer counts"):
        fit_exposed([one])


def test_the_realrun_scenarios_carry_the_committed_probes_fit():
    """Not a trace fit: every realrun scenario with the prefill host floor takes the exposed terms fitted to
    kernels_calibration/profiles/h100/prefillprof.csv (three H100 hosts, 73 GPU-bound lengths)."""
    fit = fit_exposed([PROFILE])
    assert fit["rows"] == 73 and len(fit["runs"]) == 4  # the second host recorded twice
    assert 4e-4 < fit["host_exposed_s_per_iteration"] < 6e-4 and 1e-5 < fit["host_exposed_s_per_layer"] < 2e-5
    carried = 0
    for path in sorted((ROOT / "scenarios/measured").glob("*.yaml")):
        pre = yaml.safe_load(path.read_text())["prefill"]
        if "host_issue_s_per_layer" not in pre:  # the first realrun pipeline's scenarios: no prefill host model
            assert "host_exposed_s_per_iteration" not in pre, path.name
            continue
        carried += 1
        assert pre["host_exposed_s_per_iteration"] == pytest.approx(fit["host_exposed_s_per_iteration"], rel=0.02)
        assert pre["host_exposed_s_per_layer"] == pytest.approx(fit["host_exposed_s_per_layer"], rel=0.02)
    assert carried == 30


def test_the_fit_cli_prints_it_and_refuses_a_bad_file_in_one_line(tmp_path):
    r = subprocess.run(
        [sys.executable, "-m", "realrun.prefillprof", "--fit", str(PROFILE)], capture_output=True, text=True, cwd=ROOT
    )
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["rows"] == 73
    bad = tmp_path / "bad.csv"
    bad.write_text("set,tokens\n70b:8,128\n")
    r = subprocess.run(
        [sys.executable, "-m", "realrun.prefillprof", "--fit", str(bad)], capture_output=True, text=True, cwd=ROOT
    )
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and "prefillprof --fit" in r.stderr


def test_the_probe_runs_end_to_end_on_the_cpu(tmp_path):
    out = tmp_path / "pp.csv"
    r = subprocess.run(
        [sys.executable, "-m", "realrun.prefillprof", "--smoke", "--out", str(out)],
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    assert r.returncode == 0, r.stderr
    d = pd.read_csv(out)
    assert list(d.columns) == ["set", "tokens", "rep", "eager_s", "issue_s", "graph_s"]
    assert len(d) == 4 and (d.eager_s >= d.issue_s).all()


def test_exposed_time_on_a_decode_pool_is_refused_unless_it_runs_prefills():
    with pytest.raises(ScenarioError, match="decode.host_exposed_s_per_iteration: a prefill's exposed CPU time"):
        scenario(**{"decode.host_exposed_s_per_iteration": 4e-4})
    assert scenario(**{"prefill.host_exposed_s_per_iteration": 4e-4}).prefill.host_exposed_s_per_iteration == 4e-4


def test_first_seen_lengths_are_summarised_per_set(tmp_path):
    """--first-seen rows: per set the medians at first sight and again and their difference (synthetic: 2 ms more
    eager and 1.5 ms more CPU the first time); the committed run shows every set slower at first sight."""
    from realrun.prefillprof import first_seen_summary

    rows = [
        dict(
            set="70b:8",
            seen=seen,
            tokens=t,
            eager_s=0.010 + (0.002 if seen == "first" else 0) + 1e-6 * t,
            issue_s=0.003 + (0.0015 if seen == "first" else 0),
        )
        for seen in ("first", "again")
        for t in (150, 300, 450)
    ]
    f = tmp_path / "fs.csv"
    pd.DataFrame(rows).to_csv(f, index=False)
    (s,) = first_seen_summary([f]).values()
    assert s["lengths"] == 3
    assert s["extra_eager_s"] == pytest.approx(0.002) and s["extra_issue_s"] == pytest.approx(0.0015)
    committed = first_seen_summary([ROOT / "kernels_calibration/profiles/h100/prefillprof_firstseen.csv"])
    assert len(committed) == 14 and all(s["lengths"] == 60 for s in committed.values())  # three hosts
    assert all(s["extra_eager_s"] > 5e-4 and s["extra_issue_s"] > 5e-4 for s in committed.values())


def test_the_first_seen_probe_runs_on_the_cpu(tmp_path):
    out = tmp_path / "fs.csv"
    r = subprocess.run(
        [sys.executable, "-m", "realrun.prefillprof", "--smoke", "--first-seen", "3", "--out", str(out)],
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    assert r.returncode == 0, r.stderr
    d = pd.read_csv(out)
    assert list(d.columns) == ["set", "seen", "tokens", "eager_s", "issue_s"]
    assert (d.seen == "first").sum() == (d.seen == "again").sum() == 3
