"""The HTML report from a small run: every figure is there, readable back, with units; tables are right."""

from __future__ import annotations

import ast
import json
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from report_fake_run import write_fake_run

from reports import build_report, changes_table, figures_from_html, load_run, make_figures
from reports.data import BREAKDOWN_PARTS, order_methods
from reports.figures import MAX_POINTS, ecdf, thin_step, window_mean_step
from reports.style import method_label

ALL_FIGURES = [
    "jct_breakdown",
    "cdf_jct",
    "cdf_ttft",
    "cdf_tpot",
    "decode_memory",
    "link_utilisation",
    "accuracy_tradeoff",
]
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    return write_fake_run(tmp_path_factory.mktemp("run"), n_requests=40)


@pytest.fixture(scope="module")
def report(run_dir):
    return build_report(run_dir)


def test_report_holds_every_figure_with_its_div(report):
    html = report.read_text()
    figs = figures_from_html(report)
    assert list(figs) == ALL_FIGURES
    for name in ALL_FIGURES:
        assert f'id="fig-{name}"' in html
        assert figs[name]["data"], name
        assert figs[name]["layout"]["title"]["text"]


def test_embedded_figures_match_the_figures_dict(run_dir, report):
    live = make_figures(load_run(run_dir))
    embedded = figures_from_html(report)
    assert list(live) == list(embedded)
    for name, fig in live.items():
        assert [t.name for t in fig.data] == [t.get("name") for t in embedded[name]["data"]]


def test_report_is_self_contained_and_offline(report):
    html = report.read_text()
    assert html.count("<script") == 3  # plotly.js, figure JSON, render script
    assert 'src="http' not in html and "<link" not in html
    assert html.count("Plotly.newPlot(el") == 1


def test_breakdown_has_nine_parts_per_method_in_order(report):
    fig = figures_from_html(report)["jct_breakdown"]
    bars = [t for t in fig["data"] if t["type"] == "bar"]
    assert len(bars) == len(BREAKDOWN_PARTS)
    expected = [
        method_label(m) for m in order_methods(json.loads((report.parent / "summary.json").read_text())["methods"])
    ]
    assert list(bars[0]["x"]) == expected and expected[0] == method_label("baseline")
    assert all(" s" in t["hovertemplate"] for t in bars)
    assert "(s)" in fig["layout"]["yaxis"]["title"]["text"]


def test_cdfs_have_one_trace_per_method_and_units(run_dir, report):
    figs = figures_from_html(report)
    methods = load_run(run_dir).methods
    for name, unit in (("cdf_jct", "(s)"), ("cdf_ttft", "(s)"), ("cdf_tpot", "(ms)")):
        f = figs[name]
        assert [t["name"] for t in f["data"]] == [method_label(m) for m in methods]
        assert unit in f["layout"]["xaxis"]["title"]["text"]
        for t in f["data"]:
            y = np.asarray(t["y"])
            assert np.all(np.diff(y) > 0) and math.isclose(y[-1], 1.0)


def test_same_method_same_colour_everywhere(report):
    figs = figures_from_html(report)
    colours: dict[str, set] = {}
    for name in ("cdf_jct", "cdf_ttft", "cdf_tpot", "decode_memory", "link_utilisation"):
        for t in figs[name]["data"]:
            if t.get("name") != "capacity":
                colours.setdefault(t["name"], set()).add(t["line"]["color"])
    assert all(len(c) == 1 for c in colours.values()), colours
    assert len({next(iter(c)) for c in colours.values()}) == len(colours)


def test_memory_and_links_draw_capacity(report):
    figs = figures_from_html(report)
    mem = figs["decode_memory"]
    caps = [t for t in mem["data"] if t["name"] == "capacity"]
    assert len(caps) == 2 and math.isclose(float(caps[0]["y"][0]), 22.0)  # GiB, one per replica
    assert "GiB" in mem["data"][0]["hovertemplate"]
    links = figs["link_utilisation"]
    lcaps = [t for t in links["data"] if t["name"] == "capacity"]
    assert len(lcaps) == 4 and float(lcaps[0]["y"][0]) == 10.0  # from scenario.network
    assert all("Gbps" in t["hovertemplate"] for t in links["data"])
    peak = max(float(np.max(t["y"])) for t in links["data"] if t["name"] != "capacity")
    assert 0 < peak <= 10.0


def test_link_capacity_column_wins(tmp_path):
    d = write_fake_run(tmp_path, n_requests=10, links_capacity_column=True)
    sc = json.loads((d / "scenario.json").read_text())
    sc["network"] = {"topology": "full_bipartite"}  # no rate in the scenario at all
    (d / "scenario.json").write_text(json.dumps(sc))
    fig = make_figures(load_run(d))["link_utilisation"]
    assert [float(t.y[0]) for t in fig.data if t.name == "capacity"] == [10.0] * 4


def test_changes_table_against_summary(run_dir):
    """Negative is less, as the terminal prints: (method - baseline) / baseline for every row."""
    run = load_run(run_dir)
    red = changes_table(run)
    s = run.summary["methods"]
    b, h = s["baseline"]["jct_s"]["mean"], s["hack"]["jct_s"]["mean"]
    assert math.isclose(red.at["JCT mean", "hack"], (h - b) / b * 100)
    assert math.isclose(red.at["KV bytes/token on the wire", "hack"], -86.0)
    assert "baseline" not in red.columns
    b, h = s["baseline"]["throughput_rps"], s["hack"]["throughput_rps"]
    assert math.isclose(red.at["Throughput", "hack"], (h - b) / b * 100)


def test_report_shows_tables_profile_and_scenario(report):
    html = report.read_text()
    for needle in (
        'id="table-changes"',
        'id="table-glance"',
        'id="table-methods"',
        'id="table-profiles"',
        'class="badge derived"',
        "a10g_10gbps",
        "llama-3.1-8b",
        "<details",
        "Calibration profile",
    ):
        assert needle in html, needle


def test_accuracy_tradeoff_pairs_hack_partition_with_speed(run_dir, report):
    fig = figures_from_html(report)["accuracy_tradeoff"]
    right = [t for t in fig["data"] if t.get("xaxis") == "x2"]
    by_name = {t["name"]: t for t in right}
    assert set(by_name) == {"HACK", "HACK w/o SE", "HACK w/o RQE", "KVQuant"}
    # The scenario gives HACK Π=64, so exactly its Π=64 row is paired with its mean JCT.
    hack = by_name["HACK"]
    assert len(hack["x"]) == 1 and math.isclose(float(hack["x"][0]), 0.021)
    summary = json.loads((run_dir / "summary.json").read_text())
    assert math.isclose(float(hack["y"][0]), summary["methods"]["hack"]["jct_s"]["mean"])


def test_no_accuracy_rows_says_so(tmp_path):
    d = write_fake_run(tmp_path, n_requests=8, accuracy=False)
    html = build_report(d).read_text()
    assert "accuracy_tradeoff" not in figures_from_html(d / "report.html")
    assert "no accuracy rows" in html


def test_minimal_run_without_baseline_or_tables(tmp_path):
    d = write_fake_run(tmp_path, n_requests=8, methods=("hack", "fp8", "newmethod"))
    for name in ("requests.csv", "memory.csv", "links.csv", "scenario.json", "profiles.json"):
        (d / name).unlink()
    html = build_report(d).read_text()
    assert list(figures_from_html(d / "report.html")) == ["jct_breakdown"]
    assert "no <code>baseline</code> method" in html and "requests.csv not found" in html
    assert list(load_run(d).methods) == ["fp8", "hack", "newmethod"]


def test_missing_summary_is_a_clear_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="summary.json"):
        build_report(tmp_path)


def test_same_run_same_bytes_and_progress(run_dir, report):
    calls = []
    again = build_report(run_dir, progress=lambda done, total, label: calls.append((done, total)))
    assert again.read_bytes() == report.read_bytes()
    assert calls == [(1, 3), (2, 3), (3, 3)]


def test_method_order_baseline_first_unknown_last():
    assert order_methods(["zeta", "hack", "hcattention", "baseline", "hack_no_rqe", "alpha", "cachegen", "fp8"]) == [
        "baseline",
        "cachegen",
        "fp8",
        "hack",
        "hack_no_rqe",
        "hcattention",
        "alpha",
        "zeta",
    ]


def test_thin_step_keeps_extremes_and_size():
    rng = np.random.default_rng(0)
    t = np.cumsum(rng.exponential(1.0, 100_000))
    y = rng.normal(size=100_000).cumsum()
    tt, yy = thin_step(t, y)
    assert len(tt) <= MAX_POINTS + 1 and np.all(np.diff(tt) > 0)
    assert yy.max() == y.max() and yy.min() == y.min() and tt[0] == t[0] and tt[-1] == t[-1]
    assert thin_step(t[:10], y[:10])[0].tolist() == t[:10].tolist()


def test_ecdf_thins_on_the_curve():
    x = np.random.default_rng(1).exponential(size=50_000)
    xs, ys = ecdf(x, max_points=1000)
    assert len(xs) <= 1000 and ys[-1] == 1.0 and xs[-1] == x.max() and xs[0] == x.min()
    s = np.sort(x)
    assert np.allclose(ys, (np.searchsorted(s, xs, side="right")) / len(x))


def test_window_mean_of_a_step():
    # 0 until t=1, then 10 Gbps until t=3, then 0: windows [0,2) and [2,4) each average 5.
    got = window_mean_step([0.0, 1.0, 3.0], [0.0, 10.0, 0.0], [0.0, 2.0, 4.0])
    assert got.tolist() == [5.0, 5.0]


def test_large_series_are_thinned_in_the_page(tmp_path):
    d = write_fake_run(tmp_path, n_requests=10)
    n = 30_000
    t = np.arange(n, dtype=float) * 0.01
    big = pd.DataFrame(
        {
            "method": "baseline",
            "replica": 0,
            "time_s": t,
            "used_bytes": (15 + np.sin(t)) * 2**30,
            "capacity_bytes": 22 * 2**30,
        }
    )
    big.to_csv(d / "memory.csv", index=False)
    build_report(d)
    mem = figures_from_html(d / "report.html")["decode_memory"]
    assert max(len(tr["x"]) for tr in mem["data"]) <= MAX_POINTS + 2
    assert (d / "report.html").stat().st_size < 6_000_000


def test_reports_never_imports_the_simulator():
    """Reports read files; of the product they import only the method registry (labels, colours, order)."""
    for path in (REPO / "reports").glob("*.py"):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            names = (
                [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else ([node.module or ""] if isinstance(node, ast.ImportFrom) and node.level == 0 else [])
            )
            if isinstance(node, ast.ImportFrom) and node.module == "costmodel":
                names = [f"costmodel.{a.name}" for a in node.names]
            for name in names:
                assert name.split(".")[0] not in {"simulator", "cli", "simpy", "planning"}, (path, name)
                assert name.split(".")[0] != "costmodel" or name == "costmodel.methods", (path, name)
    code = (
        "import sys, reports; bad = [m for m in ('simulator', 'simpy', 'costmodel.phases') if m in sys.modules]; "
        "assert not bad, bad"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=REPO)


def _edit_json(path, fn):
    data = json.loads(path.read_text())
    fn(data)
    path.write_text(json.dumps(data))


def test_labelled_variants_pair_with_their_partition(tmp_path):
    """Two HACK variants told apart by label: each pairs with its own Π's accuracy row, and each keeps one colour."""
    d = write_fake_run(tmp_path, n_requests=10, methods=("baseline", "hack"))

    def add_variant(summary):
        summary["methods"]["hack_pi32"] = dict(
            summary["methods"]["hack"], jct_s={"mean": 1.5, "p50": 1, "p90": 2, "p99": 3}
        )

    _edit_json(d / "summary.json", add_variant)
    _edit_json(
        d / "scenario.json",
        lambda sc: sc.update(
            methods=[
                {"name": "baseline", "label": None},
                {"name": "hack", "label": None, "partition": 64},
                {"name": "hack", "label": "hack_pi32", "partition": 32},
            ]
        ),
    )
    _edit_json(
        d / "profiles.json",
        lambda p: p.update(
            accuracy=[
                {
                    "kernel": "decode_attn.hack",
                    "partition": q,
                    "bits": 2,
                    "rounding": "stochastic",
                    "inputs": "gaussian",
                    "rel_error": e,
                }
                for q, e in ((32, 0.01), (64, 0.02), (128, 0.04))
            ]
        ),
    )
    run = load_run(d)
    assert run.methods == ["baseline", "hack", "hack_pi32"] and run.kinds["hack_pi32"] == "hack"
    fig = make_figures(run)["accuracy_tradeoff"]
    right = {t.name: t for t in fig.data if t.xaxis == "x2"}
    assert list(right["HACK"].x) == [0.02] and list(right["hack_pi32"].x) == [0.01]
    assert list(right["hack_pi32"].y) == [1.5]
    assert right["HACK"].marker.color == "#dc2626" and right["hack_pi32"].marker.color not in ("#dc2626", "#6b7280")


def test_far_capacity_is_stated_not_drawn(tmp_path):
    d = write_fake_run(tmp_path, n_requests=10)
    mem = pd.read_csv(d / "memory.csv")
    mem["used_bytes"] -= 15 * 2**30 - 2**30  # KV only: ~1-3 GiB
    mem["capacity_bytes"] = 375 * 2**30
    mem.to_csv(d / "memory.csv", index=False)
    fig = make_figures(load_run(d))["decode_memory"]
    assert not [t for t in fig.data if t.name == "capacity"]
    titles = [a.text for a in fig.layout.annotations]
    assert all("off scale" in t and "375 GiB" in t for t in titles), titles
    peak = mem["used_bytes"].max() / 2**30
    assert fig.layout.yaxis.range[1] == pytest.approx(peak * 1.12)


def test_long_tail_cdf_goes_log_and_peak_kv_row_is_optional(tmp_path):
    d = write_fake_run(tmp_path, n_requests=40)
    assert "Peak decode KV cache" not in changes_table(load_run(d)).index
    req = pd.read_csv(d / "requests.csv")
    req.loc[req["request_id"] == 0, "tpot_s"] = 5.0  # one request 100x slower per token
    req.to_csv(d / "requests.csv", index=False)

    def add_kv(summary):
        for i, s in enumerate(summary["methods"].values()):
            s["peak_decode_kv_bytes"] = 2**30 * (4 - i * 0.5)

    _edit_json(d / "summary.json", add_kv)
    run = load_run(d)
    figs = make_figures(run)
    assert figs["cdf_tpot"].layout.xaxis.type == "log" and figs["cdf_jct"].layout.xaxis.type != "log"
    assert changes_table(run).at["Peak decode KV cache", "cachegen"] == pytest.approx(-12.5)


def test_module_entry_point(tmp_path, capsys):
    from reports.__main__ import main

    d = write_fake_run(tmp_path / "run", n_requests=5)
    assert main([str(d)]) == 0 and (d / "report.html").is_file()
    assert main([str(tmp_path / "nowhere")]) == 1
    assert "summary.json not found" in capsys.readouterr().err


def test_degenerate_series_still_draw(tmp_path):
    d = write_fake_run(tmp_path, n_requests=6)
    pd.DataFrame(
        {"method": ["baseline"], "replica": [0], "time_s": [0.0], "used_bytes": [0], "capacity_bytes": [2**30]}
    ).to_csv(d / "memory.csv", index=False)
    pd.DataFrame(
        {"method": ["baseline"], "link": ["p0"], "time_s": [0.0], "active_flows": [0], "throughput_gbps": [0.0]}
    ).to_csv(d / "links.csv", index=False)
    figs = make_figures(load_run(d))
    assert figs["decode_memory"].layout.yaxis.range[1] > 0
    assert [float(v) for v in figs["link_utilisation"].data[0].y] == [0.0] * len(figs["link_utilisation"].data[0].y)
    build_report(d)


def test_phase_colours_stay_away_from_method_colours():
    from costmodel.methods import METHODS
    from reports.style import FALLBACK_COLOURS, PART_COLOURS

    def rgb(h):
        return np.array([int(h[i : i + 2], 16) for i in (1, 3, 5)], dtype=float)

    methods = [*(cls.colour for cls in METHODS), *FALLBACK_COLOURS]
    for part, colour in PART_COLOURS.items():
        nearest = min(np.linalg.norm(rgb(colour) - rgb(m)) for m in methods)
        assert nearest > 60, (part, colour, nearest)


def test_first_screen_gives_each_method_jct_memory_and_overhead(run_dir, report):
    """The header's table: per method mean JCT, peak decode memory and dequantize + approximation, with
    changes against the baseline signed as the terminal prints them (negative = less)."""
    import re

    from reports.style import fmt_bytes, fmt_pct, fmt_seconds

    page = report.read_text()
    header = page[page.index("<header>") : page.index("</header>")]
    rows = {
        re.sub(r"<[^>]+>", "", r.split("</td>")[0]): re.findall(r"<td[^>]*>(.*?)</td>", r)
        for r in re.findall(r"<tr><td>(.*?)</tr>", header)
    }
    s = json.loads((run_dir / "summary.json").read_text())["methods"]
    for m, stats in s.items():
        cells = rows[method_label(m)]
        over = stats["breakdown_s"]["dequantize"] + stats["breakdown_s"]["approximation"]
        assert cells[0] == fmt_seconds(stats["jct_s"]["mean"]) and cells[2] == fmt_bytes(
            stats["peak_decode_memory_bytes"]
        )
        assert cells[4] == fmt_seconds(over)
    b, h = s["baseline"]["jct_s"]["mean"], s["hack"]["jct_s"]["mean"]
    assert rows["HACK"][1] == fmt_pct((h - b) / b * 100) and (h < b) == rows["HACK"][1].startswith("-")


# ---- rough edges (issue 30) -------------------------------------------------------------------------------
def test_the_breakdown_names_as_many_phases_as_it_draws(report):
    """It said "nine phases" over ten series: prefill_queue, prefill, quantize, transfer_queue, transfer,
    decode_queue, decode, dequantize, approximation, preemption."""
    fig = figures_from_html(report)["jct_breakdown"]
    assert len([t for t in fig["data"] if t["type"] == "bar"]) == 10
    assert fig["layout"]["title"]["text"].endswith("mean JCT in ten parts")
    html = report.read_text()
    assert "each of the ten phases" in html and "nine" not in html.split('id="breakdown"')[1].split("</section>")[0]


def _with_faults(tmp_path: Path, n: int) -> Path:
    run = write_fake_run(tmp_path / f"faults{n}", n_requests=40, methods=("baseline", "hack"))
    scenario = json.loads((run / "scenario.json").read_text())
    # inside both time series, so every window is drawn on both figures
    t_end = min(float(pd.read_csv(run / f)["time_s"].max()) for f in ("memory.csv", "links.csv"))
    step = t_end / (n + 1)
    scenario["faults"] = [
        {"kind": "decode_replica_down", "target": i % 2, "start_s": i * step, "end_s": i * step + step / 2}
        if i % 2
        else {
            "kind": "link_degradation",
            "target": "p0",
            "start_s": i * step,
            "end_s": i * step + step / 2,
            "factor": 0.5,
        }
        for i in range(n)
    ]
    (run / "scenario.json").write_text(json.dumps(scenario))
    return run


def test_fault_windows_are_one_shape_each_and_every_label_has_text(tmp_path):
    """Each window was an add_vrect per panel (100 windows: minutes; 500: more than 5), and every panel but
    the top one got an annotation without text, which plotly.js draws as "new text"."""
    figs = make_figures(load_run(_with_faults(tmp_path, 3)))
    for name in ("decode_memory", "link_utilisation"):
        layout = figs[name].layout
        assert len(layout.shapes) == 3 and all(s.yref == "paper" for s in layout.shapes)
        labels = [a.text for a in layout.annotations if a.text and ("down" in a.text or "degraded" in a.text)]
        assert labels == ["link p0 degraded x0.5", "decode d1 down", "link p0 degraded x0.5"]
        assert all(a.text for a in layout.annotations)


def test_five_hundred_fault_windows_take_seconds_not_minutes(tmp_path):
    import time

    run = load_run(_with_faults(tmp_path, 500))
    cpu = time.process_time()
    figs = make_figures(run)
    cpu = time.process_time() - cpu
    assert cpu < 30, cpu  # 0.5-1 s here; the shapes added one by one took minutes of CPU at 100 windows
    for name in ("decode_memory", "link_utilisation"):
        layout = figs[name].layout
        assert len(layout.shapes) == 500 and all(a.text for a in layout.annotations)
        assert "500 fault windows shaded" in layout.title.text


def test_the_header_counts_the_requests_a_fault_failed(tmp_path):
    """All 40 requests failed: the header said "0 requests per method" and nothing of the failures."""
    run = write_fake_run(tmp_path / "failed", n_requests=40, methods=("baseline", "hack"))
    summary = json.loads((run / "summary.json").read_text())
    summary["requests"] = 40
    summary["methods"]["baseline"].update(completed=0, failed=40, failure_reasons={"stranded": 40}, retried=3)
    summary["methods"]["hack"].update(completed=38, failed=2, failure_reasons={"retries_exhausted": 2}, retried=5)
    (run / "summary.json").write_text(json.dumps(summary))
    html = build_report(run).read_text()
    assert "40 requests per method" in html
    assert "Baseline (FP16): 0 completed, 40 failed (40 stranded), 3 retried" in html
    assert "HACK: 38 completed, 2 failed (2 retries_exhausted), 5 retried" in html


def test_validation_header_and_table_colour_an_error_alike():
    """Mean JCT −6.8 % was red in the header (5 % goal) and green in the table (10 % for every row)."""
    import re

    from reports.validation import validation_page

    quantiles = {q: 1.0 for q in ("mean", "p50", "p90", "p99")}
    v = {
        "trace": "t",
        "scenario": "s.yaml",
        "method": "hack",
        "requests": 10,
        "metrics": {f"{m}_s": {"measured": quantiles, "simulated": quantiles} for m in ("jct", "ttft", "tpot")},
        "breakdown_s": {},
        "jct_mean_error_pct": -6.8,
        "ttft_p50_error_pct": -8.0,
        "tpot_p50_error_pct": 12.0,
    }
    page = validation_page(v)
    header = [cls for cls, _ in re.findall(r'<td class="(\w*)">([^<]*)</td>', page.summary_html)]
    table = page.sections[1].body_html
    row = dict(re.findall(r'<tr><td>([^<]+)</td><td>[^<]*</td><td>[^<]*</td><td class="(\w+)">', table))
    assert header == [row["JCT mean"], row["TTFT p50"], row["TPOT p50"]] == ["worse", "better", "worse"]


def test_a_run_folder_with_only_a_summary_loads_and_says_what_is_missing(tmp_path):
    """Only summary.json is required: a summary without methods loads as none, and every table or file the
    folder lacks is one note (its figure is left out); a summary that is not UTF-8 is one line naming the file
    and why."""
    from reports.data import RunDataError

    (tmp_path / "summary.json").write_text('{"scenario": "s"}')
    run = load_run(tmp_path)
    assert run.summary["methods"] == {} and run.requests is None and run.scenario is None
    assert run.notes == (
        "requests.csv not found: its figure is left out.",
        "memory.csv not found: its figure is left out.",
        "links.csv not found: its figure is left out.",
        "scenario.json not found.",
        "profiles.json not found.",
    )
    (tmp_path / "summary.json").write_bytes(b'{"scenario": "\xff"}')
    with pytest.raises(RunDataError, match=r"summary.json: cannot read \(UnicodeDecodeError\)$"):
        load_run(tmp_path)


def test_requests_csv_is_read_for_the_latencies_alone_when_the_summary_has_the_breakdown(tmp_path):
    """A long run's requests.csv has a few dozen columns per request: the report reads the four its latency
    figures need, and the breakdown parts only when summary.json lacks a method's breakdown."""
    d = write_fake_run(tmp_path / "run", methods=("baseline", "hack"))
    assert set(load_run(d).requests.columns) == {"method", "jct_s", "ttft_s", "tpot_s"}
    summary = json.loads((d / "summary.json").read_text())
    del summary["methods"]["hack"]["breakdown_s"]
    (d / "summary.json").write_text(json.dumps(summary))
    parts = {f"{p}_s" for p in BREAKDOWN_PARTS} & set(pd.read_csv(d / "requests.csv", nrows=0).columns)
    assert len(parts) >= 9  # the fake run's (no preemption column)
    assert set(load_run(d).requests.columns) == {"method", "jct_s", "ttft_s", "tpot_s"} | parts
