"""``python -m reports RUN_DIR [--plotlyjs PATH_OR_URL] [--static png svg]``: rebuild report.html (and static images) from a run folder."""

from __future__ import annotations

import argparse
import sys

from . import build_report, export_static
from .static import StaticExportError


def main(argv=None) -> int:
    description = __doc__.split(":", 1)[1].strip() if __doc__ else None  # None under python -OO
    ap = argparse.ArgumentParser(prog="python -m reports", description=description)
    ap.add_argument("run_dir", help="a folder written by `cli.py simulate --out`")
    ap.add_argument("--plotlyjs", default=None, help="load plotly.js from this path or URL instead of embedding it")
    ap.add_argument(
        "--static",
        nargs="*",
        metavar="FORMAT",
        help="also write RUN_DIR/figures/*.FORMAT (default png svg); needs kaleido and Chromium",
    )
    args = ap.parse_args(argv)
    try:
        print(f"wrote {build_report(args.run_dir, plotlyjs=args.plotlyjs)}")
        if args.static is not None:
            paths = export_static(args.run_dir, tuple(args.static) or ("png", "svg"))
            print(f"wrote {len(paths)} image(s) under {paths[0].parent if paths else args.run_dir}")
    except (FileNotFoundError, StaticExportError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
