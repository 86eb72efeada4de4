"""The sweep report's goodput per configuration and Pareto front."""

from __future__ import annotations

import pandas as pd
import pytest

from planning.report import configurations, pareto_front, render, tie_groups


def _table():
    rows = []
    for inst, cost in (("a", 10.0), ("b", 20.0), ("c", 30.0), ("d", 15.0)):
        for rate, tput in ((1.0, 0.9), (2.0, 1.8)):
            # a meets the SLO only at rate 1; b and c at both; d never; c is dearer than b for the same goodput
            meets = {"a": rate == 1.0, "b": True, "c": True, "d": False}[inst]
            rows.append(
                {
                    "point": len(rows),
                    "prefill.instance": inst,
                    "workload.arrival.rate_rps": rate,
                    "method": "hack",
                    "cost_usd_per_hour": cost,
                    "throughput_rps": tput,
                    "meets_slo": meets,
                    "jct_p90_s": cost / rate,
                    "ttft_p99_s": 1.0,
                    "error": "",
                }
            )
    return pd.DataFrame(rows)


def test_goodput_is_the_best_throughput_within_the_slos_and_the_front_is_undominated():
    axes = ["prefill.instance", "workload.arrival.rate_rps"]
    conf = configurations(_table(), axes).set_index("config")
    assert conf["goodput_rps"].to_dict() == {
        f"prefill.instance={k}, hack": v for k, v in (("a", 0.9), ("b", 1.8), ("c", 1.8), ("d", 0.0))
    }
    front = pareto_front(conf.reset_index()).to_numpy()
    assert list(conf.index[front]) == ["prefill.instance=a, hack", "prefill.instance=b, hack"]


def test_render_is_deterministic_and_names_its_figures():
    kw = dict(
        name="t",
        description="",
        base="b.yaml",
        axis_paths=["prefill.instance", "workload.arrival.rate_rps"],
        slo={"jct_p90_s": 25.0},
    )
    a, b = render(_table(), **kw), render(_table(), **kw)
    assert a == b
    assert 'id="fig-cost-goodput"' in a and 'id="fig-heatmap-0"' in a and "Pareto front" in a


def _figure_order(page: str) -> list[str]:
    import re

    return re.findall(r'id="fig-([a-z0-9-]+)"', page)


def test_the_page_opens_on_its_most_informative_figure():
    """Costs that differ: the cost figure first. One cost for every configuration: the SLO heatmap first."""
    kw = dict(
        name="t",
        description="",
        base="b.yaml",
        axis_paths=["prefill.instance", "workload.arrival.rate_rps"],
        slo={"jct_p90_s": 25.0},
    )
    assert _figure_order(render(_table(), **kw)) == ["cost-goodput", "heatmap-0"]
    flat = _table().assign(cost_usd_per_hour=12.0)
    page = render(flat, **kw)
    assert _figure_order(page) == ["heatmap-0", "cost-goodput"] and "the cost figure has one column" in page


def test_methods_wear_the_colours_of_every_other_report():
    from costmodel.methods import colour
    from planning.report import cost_goodput_figure, line_figure
    from reports.style import method_label

    df = pd.concat([_table().assign(method=m) for m in ("baseline", "cachegen", "hack")], ignore_index=True)
    conf = configurations(df, ["prefill.instance", "workload.arrival.rate_rps"])
    for fig in (cost_goodput_figure(conf, True), line_figure(df, "prefill.instance", "jct_p90_s")):
        shown = {
            t.name: (t.marker.color if t.mode == "markers" else t.line.color)
            for t in fig.data
            if t.name != "Pareto front"
        }
        assert shown == {method_label(m): colour(m) for m in ("baseline", "cachegen", "hack")}


# ---- seeds, ties and readable heatmaps (issue 30) ----------------------------------------------------------
def _seeded(goodput: dict[str, tuple[float, list[float]]]) -> pd.DataFrame:
    """One row per (configuration, seed) at one rate, meeting the SLO, with the given throughput per seed."""
    rows = []
    for inst, (cost, per_seed) in goodput.items():
        for seed, tput in enumerate(per_seed):
            rows.append(
                {
                    "point": len(rows),
                    "prefill.instance": inst,
                    "workload.seed": seed,
                    "method": "hack",
                    "cost_usd_per_hour": cost,
                    "throughput_rps": tput,
                    "meets_slo": True,
                    "jct_p90_s": 1.0,
                    "error": "",
                }
            )
    return pd.DataFrame(rows)


AXES = ["prefill.instance", "workload.seed"]


def test_goodput_is_the_mean_over_seeds_with_its_range():
    conf = configurations(_seeded({"a": (10.0, [1.0, 1.2, 1.1])}), AXES).set_index("config")
    r = conf.loc["prefill.instance=a, hack"]
    assert (r["goodput_rps"], r["goodput_min_rps"], r["goodput_max_rps"], r["seeds"]) == pytest.approx(
        (1.1, 1.0, 1.2, 3)
    )


def test_a_difference_inside_the_seeds_spread_is_a_tie():
    """At one cost: a (1.000 mean) and b (0.998) overlap, so both stand, tied; c is clearly lower. A cheaper
    tie dominates a dearer one: d costs more than a for no clear gain."""
    table = _seeded(
        {
            "a": (10.0, [0.98, 1.00, 1.02]),
            "b": (10.0, [0.97, 1.00, 1.024]),
            "c": (10.0, [0.90, 0.91, 0.92]),
            "d": (12.0, [1.00, 1.01, 1.03]),
            "e": (12.0, [1.10, 1.11, 1.12]),
        }
    )
    conf = configurations(table, AXES)
    front = pareto_front(conf)
    on = set(conf.loc[front, "config"])
    assert on == {"prefill.instance=a, hack", "prefill.instance=b, hack", "prefill.instance=e, hack"}
    groups = {conf.at[i, "config"]: g for i, g in tie_groups(conf, front).items()}
    assert groups == {"prefill.instance=a, hack": 1, "prefill.instance=b, hack": 1}  # e stands alone
    page = render(table, name="t", description="", base="b.yaml", axis_paths=AXES, slo={"jct_p90_s": 2.0})
    assert "over 3 seeds" in page and "goodput_range_rps" in page and page.count("tie 1 (2 configurations)") == 2


def test_one_seed_says_that_noise_is_not_shown():
    page = render(
        _seeded({"a": (10.0, [1.0]), "b": (10.0, [0.998])}),
        name="t",
        description="",
        base="b.yaml",
        axis_paths=AXES,
        slo={"jct_p90_s": 2.0},
    )
    assert "ran with one workload seed" in page and "add a workload.seed axis" in page


@pytest.mark.parametrize(
    "column, words",
    [
        ("jct_p90_s", "JCT p90 (s)"),
        ("network.bandwidth_gbps", "network bandwidth (Gbit/s)"),
        ("workload.arrival.rate_rps", "workload arrival rate (requests/s)"),
        ("methods.0.partition", "methods[0] partition"),
        ("peak_decode_memory_bytes", "peak decode memory (bytes)"),
        ("kv_wire_bytes_per_token", "KV wire (bytes/token)"),
        ("cost_usd_per_hour", "cost (USD/h)"),
        ("prefill.replicas", "prefill replicas"),
    ],
)
def test_columns_read_as_words_with_units(column, words):
    from planning.report import readable

    assert readable(column) == words


def test_heatmap_cells_that_meet_the_slos_are_marked():
    """Rate 1: both instances meet the SLO; rate 2: only b; so three cells of four carry the mark."""
    from planning.report import heatmap_figure

    table = _table()
    fig = heatmap_figure(table, "prefill.instance", "workload.arrival.rate_rps", "jct_p90_s", [])
    trace = fig.data[0]
    marks = {(x, y): text.endswith("✓") for y, row in zip(trace.y, trace.text) for x, text in zip(trace.x, row) if text}
    assert marks == {
        ("a", "1.0"): True,
        ("b", "1.0"): True,
        ("c", "1.0"): True,
        ("d", "1.0"): False,
        ("a", "2.0"): False,
        ("b", "2.0"): True,
        ("c", "2.0"): True,
        ("d", "2.0"): False,
    }
    assert fig.layout.xaxis.title.text == "prefill instance"
    assert fig.layout.yaxis.title.text == "workload arrival rate (requests/s)"
    assert fig.layout.coloraxis.colorbar.title.text == "JCT p90 (s)"
