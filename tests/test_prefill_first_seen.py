"""A prefill batch of a token count its process has not run before costs the CPU more (cuBLAS chooses the GEMMs'
kernels per new row count and loads them: python -m realrun.prefillprof --first-seen): the prefill replica remembers
the counts it has run and prices a new one at max(GPU + its shown share, host floor +
prefill.host_first_seen_s_per_iteration), the share exp(-GPU / prefill.host_first_seen_fade_s) (simulator/prefill.py;
the choices stall the CPU while the GPU has little queued: realrun.prefillprof --first-seen-fade-fit); calibrate flags a recording's first-seen batches in order, none where its process had run
the same prompts before (measured.earlier_run), and prices them the same way."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml

from helpers import scenario
from simulator.config import ScenarioError
from simulator.fit_items import first_seen_batches
from simulator.measured import earlier_run
from simulator.run import run_scenario

ROOT = Path(__file__).resolve().parent.parent
FIRST_S = 0.004
FLOOR_S = 0.030  # above the A100's GPU time for these short prompts: host-bound


def _run(tmp_path, prompts, **changes):
    trace = tmp_path / "w.csv"
    trace.write_text("arrival_s,prompt_tokens,output_tokens\n" + "".join(f"{i},{p},4\n" for i, p in enumerate(prompts)))
    s = scenario(
        **{
            "workload": {"trace_csv": str(trace), "arrival": {"kind": "trace"}, "requests": len(prompts)},
            "prefill.host_issue_s_per_iteration": FLOOR_S,
            "methods": ["baseline"],
            **changes,
        }
    )
    df = run_scenario(s).requests.sort_values("request_id")
    return (df["prefill_end_s"] - df["prefill_start_s"]).to_numpy()


def test_the_first_batch_of_each_token_count_pays_on_its_host_floor(tmp_path):
    """One request a second (the replica idle at each): 200, 200, 300, 200, 300 tokens. Host-bound, the first 200
    and the first 300 take the floor + the first-seen time, the repeats the floor; without the field all take the
    floor."""
    prompts = (200, 200, 300, 200, 300)
    plain = _run(tmp_path, prompts)
    assert plain == pytest.approx(np.full(5, FLOOR_S), rel=1e-9)
    first = _run(tmp_path, prompts, **{"prefill.host_first_seen_s_per_iteration": FIRST_S})
    assert first - plain == pytest.approx([FIRST_S, 0, FIRST_S, 0, 0], abs=1e-12)


def test_a_gpu_bound_batch_hides_the_first_seen_time_behind_its_gpu_work(tmp_path):
    """16K-token prompts on the A100 take far longer on the GPU than floor + first-seen: no change (realrun's
    first runs of 1-4K-token prompts are no slower than its repeats); a floor just below the GPU time is lifted
    only by what floor + first-seen exceeds it."""
    long = (16000, 16000)
    plain = _run(tmp_path, long, **{"prefill.host_issue_s_per_iteration": 0.0})
    assert plain[0] > 0.5
    same = _run(
        tmp_path,
        long,
        **{"prefill.host_issue_s_per_iteration": 0.0, "prefill.host_first_seen_s_per_iteration": FIRST_S},
    )
    assert same == pytest.approx(plain, rel=1e-12)
    near = plain[0] - FIRST_S / 2
    lifted = _run(
        tmp_path,
        long,
        **{"prefill.host_issue_s_per_iteration": near, "prefill.host_first_seen_s_per_iteration": FIRST_S},
    )
    assert lifted - plain == pytest.approx([FIRST_S / 2, 0.0], abs=1e-9)


def test_a_gpu_bound_batch_shows_the_first_seen_time_by_its_fade(tmp_path):
    """With a fade the first 16K-token batch (GPU-bound, T s) takes T + first-seen x exp(-T / fade), its repeat T;
    a short GPU-bound batch shows nearly all of it, and a host-bound one still takes floor + first-seen (the
    fade only ever adds on the GPU's side)."""
    fade_s = 0.2
    long = (16000, 16000)
    gpu = {"prefill.host_issue_s_per_iteration": 0.0}
    plain = _run(tmp_path, long, **gpu)
    shown = _run(
        tmp_path,
        long,
        **gpu,
        **{"prefill.host_first_seen_s_per_iteration": FIRST_S, "prefill.host_first_seen_fade_s": fade_s},
    )
    assert shown - plain == pytest.approx([FIRST_S * np.exp(-plain[0] / fade_s), 0.0], rel=1e-9, abs=1e-12)
    short = (300, 300)
    plain = _run(tmp_path, short, **gpu)
    assert plain[0] < 0.03
    shown = _run(
        tmp_path,
        short,
        **gpu,
        **{"prefill.host_first_seen_s_per_iteration": FIRST_S, "prefill.host_first_seen_fade_s": fade_s},
    )
    assert shown[0] - plain[0] == pytest.approx(FIRST_S * np.exp(-plain[0] / fade_s), rel=1e-9)
    assert shown[0] - plain[0] > 0.85 * FIRST_S and shown[1] == pytest.approx(plain[1], rel=1e-12)
    host = _run(
        tmp_path,
        (200, 200),
        **{"prefill.host_first_seen_s_per_iteration": FIRST_S, "prefill.host_first_seen_fade_s": fade_s},
    )
    assert host == pytest.approx([FLOOR_S + FIRST_S, FLOOR_S], rel=1e-9)


def test_first_seen_on_the_decode_pool_is_refused():
    with pytest.raises(ScenarioError, match="decode.host_first_seen_s_per_iteration: a prefill replica's"):
        scenario(**{"decode.host_first_seen_s_per_iteration": 1e-3})
    with pytest.raises(ScenarioError, match="decode.host_first_seen_fade_s: a prefill replica's"):
        scenario(**{"decode.host_first_seen_fade_s": 0.05})


def test_a_recording_whose_process_ran_its_prompts_before_is_known_from_its_command():
    """realrun's runner: methods in turn, rates in turn, repeats, one seed: only the first method's first rate's
    first repeat meets each length first."""
    cmd = "python -m realrun --method baseline kvquant hack --rate 7.5 8.5 --requests 150 --seed 1 --repeats 3"
    meta = {"command": cmd, "method": "baseline", "rate_rps": 7.5}
    assert earlier_run(meta, "x_baseline_r7.5_rep1") is None
    assert earlier_run(meta, "x_baseline_r7.5_rep2") == "x_baseline_r7.5_rep1"
    assert (
        earlier_run({**meta, "rate_rps": 8.5}, "x_baseline_r8.5_rep1")
        == "baseline at 7.5 req/s, the process's first rate"
    )
    assert earlier_run({**meta, "method": "hack"}, "x_hack_r7.5_rep1") == "baseline, the process's first method"
    assert earlier_run({"command": "realrun.runner.run_set (library call)", "method": "hack"}, "t") is None
    assert earlier_run({}, "t") is None
    assert list(first_seen_batches([5, 7, 5, 9, 7])) == [1, 1, 0, 1, 0]
    assert not first_seen_batches([5, 7], seen_before=True).any()


def test_calibrate_flags_a_recordings_first_seen_batches_and_prices_them_on_the_floor():
    """70b8l_1gbps (128-640-token prompts, 8 layers): FP16 ran first in its process, every batch's count new but
    repeats; KVQuant-style after it, none. Where the floor + first-seen passes the GPU's time the batch takes it
    (host), else exp(-GPU / fade) of it adds to the GPU's time; without the fade a GPU-bound batch does not change; the
    derivatives match central differences."""
    from simulator.calibrate import FIRST_SEEN, predict
    from simulator.fit_items import load_trace_data

    scen = ROOT / "scenarios/measured/h200g_70b8l_1gbps.yaml"
    traces = ROOT / "realrun/traces/h200_graphs"
    base = load_trace_data(traces / "h200g_70b8l_1gbps_baseline_r8", scen)
    after = load_trace_data(traces / "h200g_70b8l_1gbps_kvquant_r8", scen)
    flags = base.blocks["prefill"]["first_seen"]
    assert 0.8 * len(flags) < flags.sum() < len(flags)  # lengths of a 512-token range, 150 prompts: a few repeats
    assert not after.blocks["prefill"]["first_seen"].any()
    v = dict(base.values0)
    assert v[FIRST_SEEN] == 0.00163  # the scenario's, from the probe
    on, off = predict(base, "prefill", v), predict(base, "prefill", {**v, FIRST_SEEN: 0.0})
    assert (on >= off).all() and (on[flags == 0] == off[flags == 0]).all()
    assert 0 < (on > off).sum() and (on - off).max() <= v[FIRST_SEEN] * 1.5 + 1e-12  # 1.5: a busy link's level
    _, d = predict(base, "prefill", v, (FIRST_SEEN,))
    h = 1e-6
    fd = (
        predict(base, "prefill", {**v, FIRST_SEEN: v[FIRST_SEEN] + h})
        - predict(base, "prefill", {**v, FIRST_SEEN: v[FIRST_SEEN] - h})
    ) / (2 * h)
    assert d[FIRST_SEEN] == pytest.approx(fd, rel=1e-5, abs=1e-9)
    blk = base.blocks["prefill"]
    assert blk["first_seen_fade_s"] == 0.046  # the scenario's, from the probe
    # the GPU-bound first-seen batches: about 0.8 of the first-seen time shows (their GPU time is about 10 ms)
    shown = (on - off)[(flags == 1) & (off > 1.02 * predict(base, "prefill", {**v, FIRST_SEEN: 0.0}).min())]
    assert len(shown) and 0.7 * v[FIRST_SEEN] < np.median(shown) < v[FIRST_SEEN]
    base.blocks["prefill"] = {**blk, "first_seen_fade_s": 0.0}
    no_fade = predict(base, "prefill", v)
    assert (no_fade <= on).all() and (no_fade < on).sum() > 0.5 * flags.sum()
    base.blocks["prefill"] = blk
    eff, exp_it = "prefill.prefill_efficiency", "prefill.host_exposed_s_per_iteration"
    _, d = predict(base, "prefill", v, (eff, exp_it, FIRST_SEEN))
    for name, h in ((eff, 1e-6), (exp_it, 1e-7)):
        fd = (
            predict(base, "prefill", {**v, name: v[name] + h}) - predict(base, "prefill", {**v, name: v[name] - h})
        ) / (2 * h)
        assert d[name] == pytest.approx(fd, rel=1e-4, abs=1e-8)


def test_the_scenarios_carry_the_probe_figure_and_the_fit_cli_prints_it(tmp_path):
    from realrun.prefillprof import fit_first_seen

    committed = ROOT / "kernels_calibration/profiles/h100/prefillprof_firstseen.csv"
    fit = fit_first_seen([committed])
    assert fit["sets"] == 14 and 5e-4 < fit["min_s"] < fit["host_first_seen_s_per_iteration"] < fit["max_s"] < 6e-3
    carried = 0
    for path in sorted((ROOT / "scenarios/measured").glob("*.yaml")):
        pre = yaml.safe_load(path.read_text())["prefill"]
        if "host_exposed_s_per_iteration" in pre:  # the realrun scenarios with the eager prefill's host model
            assert pre["host_first_seen_s_per_iteration"] == pytest.approx(
                fit["host_first_seen_s_per_iteration"], rel=0.01
            )
            carried += 1
    assert carried == 30
    r = subprocess.run(
        [sys.executable, "-m", "realrun.prefillprof", "--first-seen-fit", str(committed)],
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["host_first_seen_s_per_iteration"] == fit["host_first_seen_s_per_iteration"]


def test_the_fade_is_recovered_from_synthetic_lengths_and_the_scenarios_carry_the_probes(tmp_path):
    """Synthetic --first-seen rows, three sets of GPU-bound forwards 5-120 ms long whose first sight costs the CPU
    1-3 ms and shows exp(-T / 30 ms) of it, with 0.3 ms of noise and a host-bound set that must be left out: the fit
    finds 30 ms within its bootstrap range. The committed probes give the 30 realrun scenarios' 46 ms, and the CLI
    prints the same fit."""
    import pandas as pd

    from realrun.prefillprof import fit_first_seen_fade

    rng = np.random.default_rng(5)
    rows = []
    for k, (lo, hi) in enumerate(((0.005, 0.03), (0.02, 0.07), (0.05, 0.12))):
        for i in range(60):
            t = rng.uniform(lo, hi)
            cpu = rng.uniform(0.001, 0.003)
            shown = cpu * np.exp(-t / 0.030) + rng.normal(0, 3e-4)
            rows += [
                dict(run="syn", set=f"m:{k}", seen="first", tokens=i, eager_s=t + shown, issue_s=0.002 + cpu),
                dict(run="syn", set=f"m:{k}", seen="again", tokens=i, eager_s=t, issue_s=0.002),
            ]
    for i in range(30):  # host-bound: the forward is its CPU part, every bit of the extra shows
        rows += [
            dict(run="syn", set="m:host", seen="first", tokens=i, eager_s=0.012, issue_s=0.012),
            dict(run="syn", set="m:host", seen="again", tokens=i, eager_s=0.010, issue_s=0.010),
        ]
    f = tmp_path / "fs.csv"
    pd.DataFrame(rows).to_csv(f, index=False)
    fit = fit_first_seen_fade([f], boot=50)
    assert fit["sets"] == 3 and fit["lengths"] == 180
    assert fit["range_s"][0] <= fit["host_first_seen_fade_s"] <= fit["range_s"][1]
    assert fit["host_first_seen_fade_s"] == pytest.approx(0.030, rel=0.15)
    h100 = ROOT / "kernels_calibration/profiles/h100"
    probes = [h100 / "prefillprof_firstseen.csv", h100 / "prefillprof_firstseen_lengths.csv"]
    assert len(list(h100.glob("prefillprof_firstseen*.csv"))) == 3  # and the eighth host's replicate
    committed = fit_first_seen_fade(probes)
    assert committed["sets"] == 22 and committed["range_s"][0] < 0.046 < committed["range_s"][1]
    replicate = fit_first_seen_fade(
        [h100 / "prefillprof_firstseen_host8.csv"], boot=50
    )  # alone, agrees within its range
    assert (
        replicate["sets"] == 6
        and replicate["range_s"][0] < committed["host_first_seen_fade_s"] < replicate["range_s"][1]
    )
    pooled = fit_first_seen_fade([*probes, h100 / "prefillprof_firstseen_host8.csv"], boot=20)
    assert pooled["host_first_seen_fade_s"] == pytest.approx(committed["host_first_seen_fade_s"], rel=0.05)
    shares = [b["shown_share"] for b in committed["by_forward_time"].values()]
    assert shares[0] > 0.8 and shares[0] > shares[1] > shares[2]  # the shown share falls with the forward's time
    carried = 0
    for path in sorted((ROOT / "scenarios/measured").glob("*.yaml")):
        pre = yaml.safe_load(path.read_text())["prefill"]
        if "host_first_seen_s_per_iteration" in pre:
            assert pre["host_first_seen_fade_s"] == pytest.approx(committed["host_first_seen_fade_s"], abs=5e-4)
            carried += 1
    assert carried == 30
    r = subprocess.run(
        [sys.executable, "-m", "realrun.prefillprof", "--first-seen-fade-fit", *map(str, probes)],
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["host_first_seen_fade_s"] == committed["host_first_seen_fade_s"]
