"""Chromium (and kaleido) for the browser and static-export tests: skipped on a developer's machine that lacks
them, a failure where they must be there. `make test` installs Chromium (scripts/install_test_system_deps.sh)
and kaleido (the test extra) and sets HACKSIM_REQUIRE_BROWSER=1; CI sets CI. A skip there would hide a report
that no longer renders."""

from __future__ import annotations

import importlib.util
import os
import shutil

import pytest

BROWSER = os.environ.get("BROWSER_PATH") or shutil.which("chromium") or shutil.which("chromium-browser")
HAVE_KALEIDO = importlib.util.find_spec("kaleido") is not None


def required() -> bool:
    """True under `make test` or in CI (CI set to anything but empty, 0 or false)."""
    ci = os.environ.get("CI", "").strip().lower()
    return os.environ.get("HACKSIM_REQUIRE_BROWSER") == "1" or ci not in ("", "0", "false")


def require(present: bool, what: str) -> None:
    """Go on if `what` is present; else fail where it is required, skip elsewhere."""
    if present:
        return
    if required():
        pytest.fail(f"{what} is missing, and make test / CI needs it (the test would otherwise skip)", pytrace=False)
    pytest.skip(f"{what} is missing")


def require_browser() -> None:
    require(
        BROWSER is not None,
        "Chromium (install Debian's chromium: scripts/install_test_system_deps.sh, or set BROWSER_PATH)",
    )


def require_kaleido() -> None:
    require(HAVE_KALEIDO, "kaleido (pip install 'kaleido>=1', in the test extra)")
