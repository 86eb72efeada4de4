"""One page template for every hacksim report (simulate, sweep, validation): `templates/page.html.j2`.

A page is a header (heading, description, subtitle lines, a summary block), a navigation bar and
sections (lead text, notes, figures, then any HTML body), rendered by jinja2 with one stylesheet
(`templates/page.css`). Figures travel as one JSON object in `<script type="application/json"
id="hacksim-figures">` (name -> plotly figure JSON) and a few lines of script draw each into
`<div id="fig-NAME">`, setting `data-figures-drawn` on the body; tests read the figures back from
the HTML. plotly.js is embedded by default, so a page works offline from a file:// URL;
`plotlyjs=` a path or URL loads it from there instead (a path is written relative to the page).
No timestamp: the same inputs give the same bytes.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

import plotly.io as pio
from jinja2 import Environment, FileSystemLoader, select_autoescape
from markupsafe import Markup

FIGURES_SCRIPT_ID = "hacksim-figures"
DEFAULT_FIGURE_HEIGHT = 450
FOOTER = "Made by hacksim from the run's files."
_ENV = Environment(
    loader=FileSystemLoader(Path(__file__).resolve().parent / "templates"),
    autoescape=select_autoescape(["html", "j2"]),
    keep_trailing_newline=True,
)


@dataclass
class Section:
    anchor: str
    heading: str
    lead: str = ""
    figures: tuple[str, ...] = ()  # names in Page.figures, drawn in this order
    body_html: str = ""  # trusted HTML, after the figures
    notes: tuple[str, ...] = ()


@dataclass
class Page:
    title: str
    heading: str
    description: str = ""
    subtitles: tuple[str, ...] = ()
    summary_html: str = ""  # trusted HTML under the heading: the first screen's numbers
    sections: list[Section] = field(default_factory=list)
    figures: dict = field(default_factory=dict)  # name -> plotly Figure
    footer: str = FOOTER


def _figure_json(fig) -> str:
    # "</" inside a <script> would end it; "<\/" is the same JSON string.
    text = pio.to_json(fig, validate=False, pretty=False)
    assert text is not None  # plotly returns the JSON text when it is given no file
    return text.replace("</", "<\\/")


def plotly_script(plotlyjs: str | None, page_path: Path | None) -> str:
    """The <script> that loads plotly.js: embedded when `plotlyjs` is None, else from the URL, or from the
    path written relative to the page's folder (so the two can move together)."""
    if plotlyjs is None:
        from plotly.offline import get_plotlyjs

        return f'<script type="text/javascript">{get_plotlyjs()}</script>'
    src = plotlyjs
    if "://" not in plotlyjs and page_path is not None:
        src = os.path.relpath(Path(plotlyjs).resolve(), Path(page_path).resolve().parent)
    return f'<script type="text/javascript" src="{Markup.escape(Path(src).as_posix() if "://" not in src else src)}"></script>'


def render_page(page: Page, *, plotlyjs: str | None = None, page_path: Path | None = None) -> str:
    names = [n for s in page.sections for n in s.figures if n in page.figures]
    blob = "{" + ",".join(f'"{n}":{_figure_json(page.figures[n])}' for n in names) + "}"
    heights = {n: int(page.figures[n].layout.height or DEFAULT_FIGURE_HEIGHT) for n in names}
    sections = [
        Section(
            s.anchor, s.heading, s.lead, tuple(n for n in s.figures if n in page.figures), Markup(s.body_html), s.notes
        )
        for s in page.sections
    ]
    view = Page(
        page.title,
        page.heading,
        page.description,
        page.subtitles,
        Markup(page.summary_html),
        sections,
        page.figures,
        page.footer,
    )
    return _ENV.get_template("page.html.j2").render(
        page=view,
        heights=heights,
        figures_id=FIGURES_SCRIPT_ID,
        figures_json=Markup(blob),
        plotly_script=Markup(plotly_script(plotlyjs, page_path)),
    )


def write_page(page: Page, path: str | Path, *, plotlyjs: str | None = None, page_path: Path | None = None) -> Path:
    """Render `page` to `path` atomically (a temporary file, then a rename; a failed write, a full disk
    say, removes the temporary file); returns `path`. `page_path`: where the page will be read from,
    when it is written elsewhere first (a relative `plotlyjs` path is written relative to it)."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    text = render_page(page, plotlyjs=plotlyjs, page_path=path if page_path is None else page_path)
    try:
        tmp.write_text(text, encoding="utf-8")
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return path
