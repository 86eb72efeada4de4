"""HTML reports, static figures and terminal tables from a finished run's files (never imports the simulator).

    from reports import build_report, export_static
    build_report("out/default")                  # -> out/default/report.html
    export_static("out/default")                 # -> out/default/figures/*.png, *.svg

Names load on first use, so `reports.terminal` (rich only) does not pull in plotly.
"""

from importlib import import_module
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # what __getattr__ loads, named for type checkers
    from .data import RunData, load_run
    from .figures import make_figures
    from .html import build_report, figures_from_html
    from .static import export_static
    from .tables import changes_table

_WHERE = {
    "RunData": "data",
    "load_run": "data",
    "make_figures": "figures",
    "build_report": "html",
    "figures_from_html": "html",
    "export_static": "static",
    "changes_table": "tables",
}


def __getattr__(name: str):
    if name in _WHERE:
        return getattr(import_module(f".{_WHERE[name]}", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def report_figures(run_dir) -> dict:
    """The report's figures, name -> plotly Figure, for a run directory."""
    from .data import load_run
    from .figures import make_figures

    return make_figures(load_run(run_dir))


__all__ = [
    "RunData",
    "build_report",
    "figures_from_html",
    "export_static",
    "load_run",
    "make_figures",
    "changes_table",
    "report_figures",
]
