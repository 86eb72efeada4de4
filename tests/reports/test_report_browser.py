"""Every page hacksim writes, in a real headless Chromium: the simulate report, the sweep report and
both validation pages draw every figure, the console stays silent, no legend scrolls (a clipped
legend), a page that loads plotly.js from a path draws too, and the simulate page is not blank."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from browser_required import BROWSER, require_browser
from report_fake_run import write_fake_run
from report_png import read_png

from reports import build_report


@pytest.fixture(autouse=True, scope="module")
def _chromium_present():
    require_browser()  # skipped without Chromium, failed under make test or CI (browser_required.py)


N_FIGURES = 7
HACK_RED = (220, 38, 38)


def chromium(page, tmp_path, *action: str) -> subprocess.CompletedProcess:
    """Headless Chromium on a file:// page, offline-friendly, console messages logged to stderr."""
    profile = tmp_path / "profile"
    profile.mkdir(exist_ok=True)
    cmd = [
        BROWSER,
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--hide-scrollbars",
        f"--user-data-dir={profile}",
        "--enable-logging=stderr",
        "--v=0",
        "--virtual-time-budget=5000",
        *action,
        page.as_uri(),
    ]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=90)


def console_lines(stderr: str) -> list[str]:
    # Chromium logs every console message (log, warning, error, uncaught exception) as INFO:CONSOLE.
    return [line for line in stderr.splitlines() if ":CONSOLE" in line or "Uncaught" in line]


REPO = Path(__file__).resolve().parents[2]
TRACES = REPO / "realrun" / "traces" / "h200"


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    return build_report(write_fake_run(tmp_path_factory.mktemp("run"), n_requests=40))


def sweep_report(folder: Path) -> Path:
    sys.path.insert(0, str(REPO / "tests" / "planning"))
    import yaml
    from planning_helpers import TINY_BASE, write_sweep

    from planning.executor import Executor
    from planning.report import write_report
    from planning.sweep import load_sweep, run_sweep

    (folder / "base.yaml").write_text(yaml.safe_dump(TINY_BASE, sort_keys=False))
    spec, base = load_sweep(
        write_sweep(
            folder,
            {
                "axes": {"network.bandwidth_gbps": [10, 40], "workload.arrival.rate_rps": [0.5, 2.0]},
                "set": {"workload.requests": 12},
                "slo": {"ttft_p99_s": 5},
            },
        )
    )
    with Executor("serial") as ex:
        df = run_sweep(spec, base, ex).table
    return write_report(
        df,
        folder,
        name=spec.name,
        description="browser test",
        base=str(base),
        axis_paths=spec.axis_paths(),
        slo=spec.slo,
        heatmaps=None,
    )


def validation_reports(folder: Path) -> tuple[Path, Path]:
    from reports.validation import write_validation_index_report, write_validation_report
    from simulator.validate import validate, validate_index

    scenario = REPO / "scenarios" / "measured" / "h200_8b_10gbps.yaml"
    traces = sorted(p for p in TRACES.iterdir() if p.is_dir() and "8b-L32_10gbps" in p.name)[:2]
    one = write_validation_report(validate(traces[0], scenario), folder / "validation.html")
    index = folder / "index.csv"
    index.write_text("trace,scenario\n" + "".join(f"{t},{scenario}\n" for t in traces))
    many = write_validation_index_report(validate_index(index), folder / "validation_index.html")
    return one, many


@pytest.fixture(scope="module")
def pages(tmp_path_factory, report) -> dict[str, tuple[Path, int]]:
    """name -> (page, figures it must draw)."""
    folder = tmp_path_factory.mktemp("pages")
    one, many = validation_reports(folder)
    with_path = folder / "by_path"
    with_path.mkdir()
    from plotly.offline import get_plotlyjs

    (folder / "plotly.min.js").write_text(get_plotlyjs())
    shutil.copytree(report.parent, with_path, dirs_exist_ok=True)
    by_path = build_report(with_path, plotlyjs=str(folder / "plotly.min.js"))
    return {
        "simulate": (report, N_FIGURES),
        "sweep": (sweep_report(folder), 2),
        "validation": (one, 1),
        "validation_index": (many, 1),
        "plotlyjs_by_path": (by_path, N_FIGURES),
    }


@pytest.mark.parametrize("name", ["simulate", "sweep", "validation", "validation_index", "plotlyjs_by_path"])
def test_each_page_draws_its_figures_silently_with_whole_legends(pages, name, tmp_path):
    page, expected = pages[name]
    res = chromium(page, tmp_path, "--dump-dom")
    assert res.returncode == 0, res.stderr[-2000:]
    assert console_lines(res.stderr) == []
    assert f'data-figures-drawn="{expected}"' in res.stdout
    assert len(re.findall(r'<div class="figure[^"]*js-plotly-plot', res.stdout)) == expected
    assert res.stdout.count('class="main-svg"') >= 2 * expected
    scrolling = [h for h in re.findall(r'<rect class="scrollbar"[^>]*height="([0-9.]+)"', res.stdout) if float(h) > 0]
    assert scrolling == [], f"{name}: a legend scrolls (clipped)"
    if name == "plotlyjs_by_path":
        assert 'src="../plotly.min.js"' in page.read_text() and page.stat().st_size < 1_000_000


def test_every_figure_draws_without_console_messages(report, tmp_path):
    res = chromium(report, tmp_path, "--dump-dom")
    assert res.returncode == 0, res.stderr[-2000:]
    assert console_lines(res.stderr) == []
    assert f'data-figures-drawn="{N_FIGURES}"' in res.stdout
    drawn = set(re.findall(r'id="fig-([a-z_]+)"[^>]*class="[^"]*js-plotly-plot', res.stdout)) | set(
        re.findall(r'class="[^"]*js-plotly-plot[^"]*"[^>]*id="fig-([a-z_]+)"', res.stdout)
    )
    assert len(drawn) == N_FIGURES, drawn
    assert res.stdout.count('class="main-svg"') >= 2 * N_FIGURES


def test_a_broken_page_is_caught(report, tmp_path):
    """The console check is live: an uncaught error in the page shows up."""
    bad = tmp_path / "bad.html"
    bad.write_text(report.read_text().replace("</body>", "<script>throw new Error('boom');</script></body>"))
    res = chromium(bad, tmp_path, "--dump-dom")
    assert any("boom" in line for line in console_lines(res.stderr))


def test_screenshot_is_not_blank(report, tmp_path):
    png = tmp_path / "report.png"
    res = chromium(report, tmp_path, f"--screenshot={png}", "--window-size=1400,2600")
    assert png.is_file(), res.stderr[-2000:]
    img = read_png(png)[..., :3]
    assert img.shape[:2] == (2600, 1400)
    non_white = np.any(img < 245, axis=-1).mean()
    packed = (img[..., 0].astype(np.uint32) << 16) | (img[..., 1].astype(np.uint32) << 8) | img[..., 2]
    colours = len(np.unique(packed))
    assert non_white > 0.1 and colours > 200, (non_white, colours)
    assert img[20, 20].max() < 80  # the dark header: CSS applied
    assert np.all(img == HACK_RED, axis=-1).sum() > 50  # HACK red: swatches and figure lines
