"""HTML reports and static figures from a finished run's files (never imports the simulator).

    from reports import build_report, export_static
    build_report("out/default")                  # -> out/default/report.html
    export_static("out/default")                 # -> out/default/figures/*.png, *.svg
"""
from .data import RunData, load_run
from .figures import make_figures
from .html import build_report, figures_from_html
from .static import export_static
from .tables import reductions_table


def report_figures(run_dir) -> dict:
    """The report's figures, name -> plotly Figure, for a run directory."""
    return make_figures(load_run(run_dir))


__all__ = ["RunData", "build_report", "figures_from_html", "export_static", "load_run", "make_figures", "reductions_table", "report_figures"]
