"""Sweeps: expansion, path setting, error rows, reproducibility and resuming from the point cache."""

from __future__ import annotations

import copy

import pandas as pd
import pytest
from planning_helpers import TINY_BASE, write_sweep

import planning.executor as executor
from planning.executor import Executor, PlanningError
from planning.sweep import SweepSpec, build_raw, load_sweep, parse_slo, run_sweep

SMALL = {
    "axes": {"network.bandwidth_gbps": [10, 40], "workload.arrival.rate_rps": [0.5, 2.0]},
    "linked": [{"prefill.instance": ["g6e.12xlarge", "g6.12xlarge"], "prefill.tensor_parallel": [1, 2]}],
    "slo": {"ttft_p99_s": 5.0},
}


def sweep(tmp_path, spec=SMALL, backend="serial", cache=None, **kw):
    s, base = load_sweep(write_sweep(tmp_path, spec))
    with Executor(backend, cache_dir=cache, **kw) as ex:
        return run_sweep(s, base, ex)


def test_grid_expands_last_axis_fastest_with_linked_axes_zipped():
    spec = SweepSpec.model_validate({"base": "b.yaml", **SMALL})
    points = spec.expand()
    assert len(points) == 2 * 2 * 2
    assert points[0] == {
        "network.bandwidth_gbps": 10,
        "workload.arrival.rate_rps": 0.5,
        "prefill.instance": "g6e.12xlarge",
        "prefill.tensor_parallel": 1,
    }
    assert points[1]["prefill.instance"] == "g6.12xlarge" and points[1]["prefill.tensor_parallel"] == 2
    assert [p["workload.arrival.rate_rps"] for p in points[:4]] == [0.5, 0.5, 2.0, 2.0]
    listed = SweepSpec.model_validate({"base": "b.yaml", "mode": "list", "points": [{"a.b": 1}, {"c": 2}]})
    assert listed.expand() == [{"a.b": 1}, {"c": 2}] and listed.axis_paths() == ["a.b", "c"]


def test_paths_go_through_preset_names_and_replace_lists_before_editing_them():
    raw = build_raw(
        TINY_BASE, {"methods.0.label": "x", "methods": ["fp8", "hack"], "model.layers": 4, "methods.1.bits": 4}
    )
    assert raw["methods"] == [{"name": "fp8", "label": "x"}, {"name": "hack", "bits": 4}]
    assert raw["model"] == {"preset": "llama-3.1-8b", "layers": 4}
    assert TINY_BASE["methods"] == ["baseline", "hack"]  # the base is not mutated
    raw = build_raw(TINY_BASE, {"methods.1.partition": 32})
    assert raw["methods"][1] == {"name": "hack", "partition": 32}


@pytest.mark.parametrize(
    "spec, message",
    [
        ({"axes": {"a": [1]}, "oops": 1}, "oops: unknown field"),
        ({"linked": [{"a": [1, 2], "b": [1]}]}, "equal"),
        ({"mode": "list"}, "points"),
        ({"axes": {"a": []}}, "no values"),
        ({"axes": {"a": [1]}, "slo": {"ttft_p42_s": 1}}, "unknown metric"),
    ],
)
def test_bad_sweep_files_fail_with_one_line(tmp_path, base_file, spec, message):
    with pytest.raises(PlanningError) as e:
        load_sweep(write_sweep(tmp_path, spec))
    assert message in str(e.value) and "\n" not in str(e.value)


def test_parse_slo():
    assert parse_slo("ttft_p99_s=60, tpot_p99_s=0.5") == {"ttft_p99_s": 60.0, "tpot_p99_s": 0.5}
    for bad in ("ttft_p99_s", "ttft_p99_s=x", "latency=3", "jct_p90_s=-1", "jct_p90_s=inf", "jct_p90_s=nan"):
        with pytest.raises(PlanningError):
            parse_slo(bad)
    for bad in ({"ttft_p99_s": True}, {"ttft_p99_s": float("inf")}):  # a sweep file's slo mapping
        with pytest.raises(PlanningError):
            parse_slo(bad)


def test_table_has_one_row_per_point_and_method_with_flattened_metrics(tmp_path, base_file):
    r = sweep(tmp_path)
    df = r.table
    assert len(df) == r.points * 2 == 16
    assert list(df["method"][:2]) == ["baseline", "hack"]
    for col in (
        "network.bandwidth_gbps",
        "prefill.instance",
        "cost_usd_per_hour",
        "jct_mean_s",
        "jct_p90_s",
        "ttft_p99_s",
        "tpot_p99_s",
        "throughput_rps",
        "breakdown_transfer_s",
        "kv_wire_bytes_per_token",
        "peak_decode_memory_bytes",
        "meets_slo",
        "error",
    ):
        assert col in df.columns, col
    assert (df["error"] == "").all() and (df["completed"] == 30).all()
    g6e = df[df["prefill.instance"] == "g6e.12xlarge"]["cost_usd_per_hour"]
    assert g6e.eq(2 * 10.49264).all()  # one g6e.12xlarge per pool
    hack, base = df[df.method == "hack"], df[df.method == "baseline"]
    assert (hack["kv_wire_bytes_per_token"].to_numpy() < base["kv_wire_bytes_per_token"].to_numpy()).all()
    assert df["meets_slo"].equals(df["ttft_p99_s"] <= 5.0)


def test_invalid_points_become_error_rows(tmp_path, base_file):
    spec = {"axes": {"prefill.tensor_parallel": [1, 16], "methods.1.partition": [64, 24]}}
    df = sweep(tmp_path, spec).table
    assert len(df) == 2 + 1 + 1 + 1  # (1, 64) runs both methods; the other three points fail whole
    ok = df[df["error"] == ""]
    assert list(ok["point"]) == [0, 0]
    bad = df.set_index("point")["error"]
    assert "partition must be a multiple of 16" in bad[1]
    assert "tensor_parallel=16 exceeds the 4 GPUs" in bad[2]


def test_a_method_that_does_not_fit_is_its_own_error_row(tmp_path, base_file):
    # 64k-token prompts: FP16 KV outgrows the decode replica's memory, HACK's 2-bit KV does not.
    spec = {
        "set": {
            "workload.input_tokens.tokens": 60000,
            "model.max_context_tokens": 131072,
            "decode.gpu_memory_utilization": 0.5,
            "workload.requests": 3,
        },
        "axes": {"workload.seed": [0]},
    }
    df = sweep(tmp_path, spec).table
    errors = dict(zip(df["method"], df["error"]))
    assert "KV capacity" in errors["baseline"] and errors["hack"] == ""


def test_same_seed_same_table_and_seed_matters(tmp_path, base_file):
    a = sweep(tmp_path).table
    b = sweep(tmp_path).table
    pd.testing.assert_frame_equal(a, b)
    assert a.to_csv(index=False) == b.to_csv(index=False)
    other = copy.deepcopy(SMALL)
    other["set"] = {"workload.seed": 1}
    c = sweep(tmp_path, other).table
    assert not a["jct_mean_s"].equals(c["jct_mean_s"])


def test_pool_gives_the_serial_table(tmp_path, base_file):
    pd.testing.assert_frame_equal(sweep(tmp_path).table, sweep(tmp_path, backend="pool", jobs=2).table)


def test_a_resumed_sweep_recomputes_nothing(tmp_path, base_file, monkeypatch):
    calls = []
    real = executor.simulate_point
    monkeypatch.setattr(executor, "simulate_point", lambda js: calls.append(1) or real(js))
    cache = tmp_path / "out" / ".cache"
    first = sweep(tmp_path, cache=cache)
    assert first.stats.simulated == len(calls) == 8 and first.stats.cached == 0
    again = sweep(tmp_path, cache=cache)
    assert again.stats.simulated == 0 and again.stats.cached == 8 and len(calls) == 8
    pd.testing.assert_frame_equal(first.table, again.table)
    # an interrupted sweep: three finished points lost -> exactly those three run again
    files = sorted(cache.rglob("*.json"))
    for f in files[:3]:
        f.unlink()
    resumed = sweep(tmp_path, cache=cache)
    assert resumed.stats.simulated == 3 and resumed.stats.cached == 5 and len(calls) == 11
    pd.testing.assert_frame_equal(first.table, resumed.table)


def test_points_that_resolve_to_the_same_scenario_run_once(tmp_path, base_file, monkeypatch):
    calls = []
    real = executor.simulate_point
    monkeypatch.setattr(executor, "simulate_point", lambda js: calls.append(1) or real(js))
    r = sweep(
        tmp_path,
        {
            "mode": "list",
            "points": [
                {"network.bandwidth_gbps": 10},
                {"network.bandwidth_gbps": 10.0},
                {"network.bandwidth_gbps": 25},
            ],
        },
    )
    assert len(calls) == 2 and r.table["point"].nunique() == 3


def test_the_cache_key_changes_with_the_scenario_not_with_dict_order():
    from simulator.config import parse_scenario

    a = parse_scenario(copy.deepcopy(TINY_BASE), "a")
    reordered = dict(reversed(list(copy.deepcopy(TINY_BASE).items())))
    assert executor.Task.of(a).key == executor.Task.of(parse_scenario(reordered, "b")).key
    c = parse_scenario(build_raw(TINY_BASE, {"workload.seed": 3}), "c")
    assert executor.Task.of(a).key != executor.Task.of(c).key


def test_the_cache_key_hashes_the_profiles_a_point_uses_and_no_others(tmp_path):
    """A point's key covers the calibration profile files its pools are priced with: changing the file a
    point uses changes its key; a file added beside it, or another GPU's profile, does not (the code salt
    hashes no profile)."""
    import shutil

    from simulator.config import parse_scenario
    from simulator.resolve import PROFILES_DIR

    assert not any("profiles" in g for g in executor.SALT_GLOBS)
    auto = parse_scenario(
        build_raw(TINY_BASE, {"calibration.prefill_profile": "auto", "calibration.decode_profile": "auto"}), "auto"
    )
    gpus = {auto.prefill.gpu.preset, auto.decode.gpu.preset}  # g6e.12xlarge: L40S
    assert executor.profile_files(auto) == sorted(PROFILES_DIR / g / "profile.json" for g in gpus) != []
    assert executor.profile_files(parse_scenario(copy.deepcopy(TINY_BASE), "roofline")) == []
    mine = tmp_path / "profile.json"
    shutil.copy(PROFILES_DIR / "h200" / "profile.json", mine)
    s = parse_scenario(build_raw(TINY_BASE, {"calibration.decode_profile": str(mine)}), "mine")
    key = executor.Task.of(s).key
    (tmp_path / "rows.csv").write_text("a new log beside the profile\n")
    assert executor.Task.of(s).key == key
    mine.write_text(mine.read_text().replace('"gpu": "h200"', '"gpu": "h200" '))
    assert executor.Task.of(s).key != key
