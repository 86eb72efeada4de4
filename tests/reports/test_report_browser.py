"""report.html in a real headless Chromium: every figure draws, the console stays silent, the page is not blank."""
from __future__ import annotations

import os
import re
import shutil
import subprocess

import numpy as np
import pytest

from report_fake_run import write_fake_run
from report_png import read_png
from reports import build_report

BROWSER = os.environ.get("BROWSER_PATH") or shutil.which("chromium") or shutil.which("chromium-browser")
pytestmark = pytest.mark.skipif(
    BROWSER is None, reason="no Chromium: install Debian's chromium (scripts/install_test_system_deps.sh) or set BROWSER_PATH")

N_FIGURES = 7
HACK_RED = (220, 38, 38)


def chromium(page, tmp_path, *action: str) -> subprocess.CompletedProcess:
    """Headless Chromium on a file:// page, offline-friendly, console messages logged to stderr."""
    profile = tmp_path / "profile"
    profile.mkdir(exist_ok=True)
    cmd = [BROWSER, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
           "--disable-background-networking", "--disable-component-update", "--disable-sync", "--hide-scrollbars",
           f"--user-data-dir={profile}", "--enable-logging=stderr", "--v=0", "--virtual-time-budget=5000",
           *action, page.as_uri()]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=90)


def console_lines(stderr: str) -> list[str]:
    # Chromium logs every console message (log, warning, error, uncaught exception) as INFO:CONSOLE.
    return [line for line in stderr.splitlines() if ":CONSOLE" in line or "Uncaught" in line]


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    return build_report(write_fake_run(tmp_path_factory.mktemp("run"), n_requests=40))


def test_every_figure_draws_without_console_messages(report, tmp_path):
    res = chromium(report, tmp_path, "--dump-dom")
    assert res.returncode == 0, res.stderr[-2000:]
    assert console_lines(res.stderr) == []
    assert f'data-figures-drawn="{N_FIGURES}"' in res.stdout
    drawn = set(re.findall(r'id="fig-([a-z_]+)"[^>]*class="[^"]*js-plotly-plot', res.stdout)) | set(
        re.findall(r'class="[^"]*js-plotly-plot[^"]*"[^>]*id="fig-([a-z_]+)"', res.stdout))
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
    assert img[20, 20].max() < 80                                  # the dark header: CSS applied
    assert np.all(img == HACK_RED, axis=-1).sum() > 50             # HACK red: swatches and figure lines
