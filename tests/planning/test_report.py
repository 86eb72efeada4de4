"""The sweep report's goodput per configuration and Pareto front."""

from __future__ import annotations

import pandas as pd

from planning.report import configurations, pareto_front, render


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
