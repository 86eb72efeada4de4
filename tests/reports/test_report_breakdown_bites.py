"""The report's JCT breakdown adds up to the JCT: its bars are the ten parts of a request's time (preemption
included), their heights the means written by hand below, and their stack the mean JCT, whether summary.json
carries the breakdown or the report averages it from requests.csv (a run whose summary has none).

The run folder is written here, by hand: four requests of each of two methods, every part in round seconds."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from reports import build_report, figures_from_html, load_run, make_figures
from reports.style import method_label

PARTS = [  # in the order a request lives them
    "prefill_queue",
    "prefill",
    "quantize",
    "transfer_queue",
    "transfer",
    "decode_queue",
    "decode",
    "dequantize",
    "approximation",
    "preemption",
]
# per method, per part: the four requests' seconds
REQUESTS = {
    "baseline": {
        "prefill_queue": [0.0, 0.1, 0.2, 0.3],
        "prefill": [1.0, 1.0, 1.0, 1.0],
        "quantize": [0.0, 0.0, 0.0, 0.0],
        "transfer_queue": [0.0, 0.0, 0.0, 0.4],
        "transfer": [0.5, 0.5, 0.5, 0.5],
        "decode_queue": [0.0, 0.5, 0.5, 0.0],
        "decode": [2.0, 3.0, 4.0, 5.0],
        "dequantize": [0.0, 0.0, 0.0, 0.0],
        "approximation": [0.0, 0.0, 0.0, 0.0],
        "preemption": [0.0, 0.0, 1.0, 3.0],
    },
    "hack": {
        "prefill_queue": [0.0, 0.0, 0.0, 0.0],
        "prefill": [1.0, 1.0, 1.0, 1.0],
        "quantize": [0.25, 0.25, 0.25, 0.25],
        "transfer_queue": [0.0, 0.0, 0.0, 0.0],
        "transfer": [0.125, 0.125, 0.125, 0.125],
        "decode_queue": [0.0, 0.0, 0.0, 0.0],
        "decode": [1.5, 2.5, 2.5, 1.5],
        "dequantize": [0.0, 0.0, 0.0, 0.0],
        "approximation": [0.5, 0.5, 0.5, 0.5],
        "preemption": [0.0, 0.0, 0.0, 2.0],
    },
}
# the means, by hand
MEANS = {
    "baseline": {
        "prefill_queue": 0.15,
        "prefill": 1.0,
        "quantize": 0.0,
        "transfer_queue": 0.1,
        "transfer": 0.5,
        "decode_queue": 0.25,
        "decode": 3.5,
        "dequantize": 0.0,
        "approximation": 0.0,
        "preemption": 1.0,
    },
    "hack": {
        "prefill_queue": 0.0,
        "prefill": 1.0,
        "quantize": 0.25,
        "transfer_queue": 0.0,
        "transfer": 0.125,
        "decode_queue": 0.0,
        "decode": 2.0,
        "dequantize": 0.0,
        "approximation": 0.5,
        "preemption": 0.5,
    },
}
MEAN_JCT_S = {"baseline": 6.5, "hack": 4.375}


def write_run(folder, with_breakdown: bool):
    folder.mkdir()
    rows, summary = [], {}
    for method, parts in REQUESTS.items():
        jct = np.sum([parts[p] for p in PARTS], axis=0)
        for i in range(4):
            rows.append(
                {
                    "method": method,
                    "request_id": i,
                    "jct_s": jct[i],
                    "ttft_s": jct[i] / 2,
                    "tpot_s": 0.01,
                    **{f"{p}_s": parts[p][i] for p in PARTS},
                }
            )
        stats = {
            "mean": float(jct.mean()),
            "p50": float(np.median(jct)),
            "p90": float(jct.max()),
            "p99": float(jct.max()),
        }
        summary[method] = {"completed": 4, "jct_s": stats, "ttft_s": stats, "tpot_s": stats}
        if with_breakdown:
            summary[method]["breakdown_s"] = MEANS[method]
    pd.DataFrame(rows).to_csv(folder / "requests.csv", index=False)
    (folder / "summary.json").write_text(json.dumps({"scenario": "by-hand", "methods": summary}))
    return folder


def bars(fig):
    return [t for t in fig["data"] if t["type"] == "bar"]


def check_breakdown(fig):
    """Ten bars in order, each the hand means per method, stacked to the mean JCT (and labelled so)."""
    bs = bars(fig)
    assert [b["name"] for b in bs] == [p.replace("_", " ").capitalize() for p in PARTS]
    labels = [method_label(m) for m in ("baseline", "hack")]
    for part, b in zip(PARTS, bs):
        assert list(b["x"]) == labels
        assert list(b["y"]) == pytest.approx([MEANS[m][part] for m in ("baseline", "hack")], rel=1e-12, abs=1e-15), part
    stack = np.sum([b["y"] for b in bs], axis=0)
    assert stack == pytest.approx([MEAN_JCT_S["baseline"], MEAN_JCT_S["hack"]], rel=1e-12)
    totals = [t for t in fig["data"] if t["type"] == "scatter"]
    assert [list(t["text"]) for t in totals] == [["6.5 s", "4.38 s"]]


def test_the_hand_means_add_up_to_the_mean_jct():
    for m in ("baseline", "hack"):
        assert sum(MEANS[m].values()) == pytest.approx(MEAN_JCT_S[m], rel=1e-12)
        for p in PARTS:
            assert np.mean(REQUESTS[m][p]) == pytest.approx(MEANS[m][p], rel=1e-12, abs=1e-15)


@pytest.mark.parametrize("with_breakdown", [True, False], ids=["summary_breakdown", "from_requests_csv"])
def test_breakdown_bars_stack_to_the_mean_jct(tmp_path, with_breakdown):
    run_dir = write_run(tmp_path / "run", with_breakdown)
    live = make_figures(load_run(run_dir))["jct_breakdown"]
    check_breakdown({"data": [{"type": t.type, "name": t.name, "x": t.x, "y": t.y, "text": t.text} for t in live.data]})
    check_breakdown(figures_from_html(build_report(run_dir))["jct_breakdown"])  # as the page embeds it
