"""Static PNG/SVG images of the report's figures, made offline by kaleido driving a local Chromium.

kaleido >= 1 renders plotly figures in a Chrome/Chromium it finds through its ``choreographer``
dependency. We pass the browser explicitly, chosen in this order: the ``browser_path`` argument,
the ``BROWSER_PATH`` environment variable (the one choreographer itself reads), then ``chromium``,
``chromium-browser``, ``google-chrome`` or ``google-chrome-stable`` on PATH. We also give kaleido
plotly.py's own plotly.min.js and turn MathJax off, because kaleido would otherwise fetch MathJax
from a CDN, which an offline machine cannot reach.
"""

from __future__ import annotations

import importlib.metadata
import os
import shutil
from pathlib import Path

from .data import load_run
from .figures import make_figures

BROWSER_NAMES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
FORMATS = ("png", "svg", "pdf", "jpeg", "webp")
DEFAULT_WIDTH_PX = 1100


class StaticExportError(RuntimeError):
    """Static export cannot run here (no kaleido, no browser); the message says what to do."""


def find_browser(browser_path: str | os.PathLike | None = None) -> str:
    """The Chromium/Chrome executable to use, or StaticExportError naming where we looked."""
    explicit = browser_path or os.environ.get("BROWSER_PATH")
    if explicit:
        if Path(explicit).is_file() and os.access(explicit, os.X_OK):
            return str(explicit)
        raise StaticExportError(
            f"static export: browser {explicit!r} (from {'browser_path' if browser_path else 'BROWSER_PATH'}) "
            "is not an executable file"
        )
    for name in BROWSER_NAMES:
        found = shutil.which(name)
        if found:
            return found
    raise StaticExportError(
        "static export needs Chromium or Chrome: install it (Debian: apt-get install chromium) "
        "or set BROWSER_PATH=/path/to/chrome"
    )


def _kaleido():
    try:
        import kaleido

        version = importlib.metadata.version("kaleido")
    except ImportError:
        raise StaticExportError(
            "static export needs kaleido>=1: pip install 'kaleido>=1' (or the project's extra that includes it)"
        ) from None
    if int(version.split(".")[0]) < 1:
        raise StaticExportError(f"static export needs kaleido>=1 (found {version}): pip install -U 'kaleido>=1'")
    return kaleido


def export_static(
    run_dir: str | Path,
    formats=("png", "svg"),
    *,
    names=None,
    scale: float = 2.0,
    browser_path: str | os.PathLike | None = None,
) -> list[Path]:
    """Write ``run_dir/figures/<figure>.<format>`` for each report figure and format; return the paths.

    ``names`` limits the export to some figures (see ``reports.make_figures``); ``scale`` multiplies
    the pixel size of PNG/JPEG/WebP output (2 = sharp on slides).
    """
    formats = tuple(f.lower().lstrip(".") for f in ([formats] if isinstance(formats, str) else formats))
    bad = [f for f in formats if f not in FORMATS]
    if bad:
        raise ValueError(f"unknown image format(s) {bad}; choose from {FORMATS}")
    kaleido = _kaleido()
    browser = find_browser(browser_path)
    figures = make_figures(load_run(run_dir))
    if names is not None:
        figures = {k: v for k, v in figures.items() if k in set(names)}
    out_dir = Path(run_dir) / "figures"
    out_dir.mkdir(parents=True, exist_ok=True)
    import plotly

    plotly_js = Path(plotly.__file__).parent / "package_data" / "plotly.min.js"
    specs, paths = [], []
    for name, fig in figures.items():
        fig_dict = fig.to_plotly_json()
        width = fig.layout.width or DEFAULT_WIDTH_PX
        height = fig.layout.height or 450
        for fmt in formats:
            path = out_dir / f"{name}.{fmt}"
            specs.append(dict(fig=fig_dict, path=path, opts=dict(format=fmt, width=width, height=height, scale=scale)))
            paths.append(path)
    kopts = dict(path=browser, mathjax=False)
    if plotly_js.is_file():
        kopts["plotlyjs"] = str(plotly_js)
    # kaleido returns (not raises) a failed render's error, and leaves no file for it; a render can fail once on a
    # loaded machine (a browser tab's timeout or crash), so the figures left without a file are rendered once more
    errors: list = []
    for attempt in range(2):
        todo = [spec for spec in specs if not spec["path"].is_file()]
        if not todo:
            break
        try:
            errors = list(kaleido.write_fig_from_object_sync(todo, kopts=kopts) or ())
        except Exception as e:  # kaleido/choreographer errors are many and deep; say it in one line
            if attempt:
                raise StaticExportError(f"static export with {browser} failed: {_one_line(e)}") from e
            errors = [e]
    missing = [p for p in paths if not p.is_file()]
    if missing:
        why = f": {_one_line(errors[0])}" if errors else ""
        raise StaticExportError(f"static export wrote no file for {', '.join(p.name for p in missing)}{why}")
    return paths


def _one_line(e: BaseException) -> str:
    text = str(e)
    return f"{type(e).__name__}: {text.splitlines()[0] if text else ''}"
