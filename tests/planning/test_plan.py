"""plan: the goodput search, and answers known by construction."""

from __future__ import annotations

import math

import pytest

from planning.executor import Executor, PlanningError, Task, simulate_point
from planning.plan import CandidatesSpec, RateSearch, format_plan, run_plan
from planning.sweep import build_raw, read_base, resolve_scenario

SLOW_FAST = [
    {"instance": "g4dn.12xlarge", "tensor_parallel": 4, "replicas": 1},  # 4x T4, $3.91/h
    {"instance": "g6e.12xlarge", "tensor_parallel": 1, "replicas": 1},
]  # 1x L40S, $10.49/h
DECODE = [{"instance": "g6e.12xlarge", "tensor_parallel": 1, "replicas": 1}]


def plan(base_file, rate, slo, steps=4, **cands):
    with Executor("serial") as ex:
        return run_plan(base_file, rate, slo, CandidatesSpec.model_validate(cands), ex, steps=steps)


@pytest.mark.parametrize("threshold, start", [(0.37, 0.2), (0.37, 1.0), (3.0, 0.2), (0.01, 1.0)])
def test_rate_search_brackets_the_threshold_in_bounded_steps(threshold, start):
    s = RateSearch(start, steps=8, rel_tol=0.05)
    while (r := s.next_rate()) is not None:
        s.record(r, r <= threshold)
    assert len(s.probes) <= 8
    assert s.lo <= threshold < s.hi
    if s.lo > 0 and len(s.probes) < 8:
        assert s.hi / s.lo <= 1.05


def test_rate_search_stops_when_nothing_passes():
    s = RateSearch(1.0, steps=5)
    while (r := s.next_rate()) is not None:
        s.record(r, False)
    assert s.lo == 0.0 and s.hi == 1.0 / 16 and len(s.probes) == 5


def _ttft_p99(base_file, prefill: dict) -> float:
    raw = build_raw(read_base(base_file), {"prefill": {**prefill, "max_batch_requests": 1}, "methods": ["baseline"]})
    result = simulate_point(Task.of(resolve_scenario(raw, base_file, "t")).scenario_json)
    return result["methods"]["baseline"]["summary"]["ttft_s"]["p99"]


def test_only_the_dearer_faster_prefill_meets_the_ttft_slo(base_file):
    slow, fast = (_ttft_p99(base_file, {k: v for k, v in c.items() if k != "replicas"}) for c in SLOW_FAST)
    assert fast < slow
    limit = math.sqrt(slow * fast)  # between the two: only the L40S prefill meets it
    p = plan(base_file, 1.0, {"ttft_p99_s": limit}, prefill=SLOW_FAST, decode=DECODE, methods=["baseline"])
    assert p.answer["prefill"].startswith("1x g6e.12xlarge")
    assert p.answer["cost_usd_per_hour"] == pytest.approx(2 * 10.49264)
    cheap = p.table.iloc[0]
    assert cheap["prefill"].startswith("1x g4dn.12xlarge") and not cheap["meets_slo"]
    assert "ttft_p99_s" in cheap["misses"]
    assert p.answer["goodput_rps"] >= 1.0 > cheap["goodput_rps"]
    text = format_plan(p)
    assert "answer: $20.99/h  prefill 1x g6e.12xlarge TP1 PP1" in text
    assert "misses at 1 req/s: ttft_p99_s" in text


def test_equal_performance_the_cheaper_price_wins(base_file):
    dear, cheap = ({**SLOW_FAST[1], "price_usd_per_hour": p} for p in (20.0, 10.0))
    p = plan(base_file, 1.0, {"ttft_p99_s": 1e3}, steps=2, prefill=[dear, cheap], decode=DECODE, methods=["baseline"])
    assert p.answer["prefill"].endswith("@$10") and p.answer["cost_usd_per_hour"] == pytest.approx(10 + 10.49264)
    loser = p.table.iloc[1].to_dict()
    assert loser["meets_slo"] and loser["goodput_rps"] == p.answer["goodput_rps"]
    assert "costs $10.00/h more" in format_plan(p)


def test_default_candidates_come_from_the_catalog(base_file):
    p = plan(
        base_file,
        1.0,
        {"ttft_p99_s": 5},
        steps=1,
        prefill_replicas=[1],
        decode_replicas=[1],
        methods=["hack"],
        max_instances_per_replica=1,
    )
    assert set(p.table["prefill_instance"]) == {
        "g4dn.12xlarge",
        "g5.12xlarge",
        "g6.12xlarge",
        "g6e.12xlarge",
        "p3.8xlarge",
        "p4d.24xlarge",
        "p4de.24xlarge",
        "p5.48xlarge",
    }
    assert any("left out a6000x4, h200x1, rtx4090x2 (no price" in n for n in p.notes)
    assert (
        p.table["prefill_tensor_parallel"]
        == p.table["prefill_instance"].map({"p4d.24xlarge": 8, "p4de.24xlarge": 8, "p5.48xlarge": 8}).fillna(4)
    ).all()
    assert p.table["cost_usd_per_hour"].is_monotonic_increasing


def test_no_candidate_meets_an_impossible_slo(base_file):
    p = plan(base_file, 1.0, {"ttft_p99_s": 1e-6}, steps=2, prefill=SLOW_FAST[1:], decode=DECODE, methods=["baseline"])
    assert p.answer is None and "no candidate meets the SLOs" in format_plan(p)


def test_trace_arrivals_cannot_be_planned(tmp_path, base_file):
    text = base_file.read_text().replace("kind: poisson\n    rate_rps: 1.0", "kind: trace")
    assert text != base_file.read_text()
    base_file.write_text(text)
    with pytest.raises(PlanningError):
        plan(base_file, 1.0, {"ttft_p99_s": 1})


def test_the_scenarios_own_pools_are_reported(base_file):
    p = plan(base_file, 1.0, {"ttft_p99_s": 1e3}, steps=1, prefill=SLOW_FAST, decode=DECODE, methods=["baseline"])
    assert (
        "the scenario's own pools (prefill 1x g6e.12xlarge TP1 PP1, decode 1x g6e.12xlarge TP1 PP1) cost "
        "$20.99/h; meet the SLOs with baseline" in format_plan(p)
    )


def test_shared_gpu_placement_pays_for_the_instances_once(base_file):
    base_file.write_text(base_file.read_text() + "placement: shared_gpu\n")
    p = plan(
        base_file, 1.0, {"ttft_p99_s": 1e3}, steps=1, prefill=SLOW_FAST[1:], decode=SLOW_FAST[:1], methods=["baseline"]
    )
    assert len(p.table) == 1 and p.answer["decode"] == p.answer["prefill"]
    assert p.answer["cost_usd_per_hour"] == pytest.approx(10.49264)
    assert any("shared_gpu" in n for n in p.notes)
