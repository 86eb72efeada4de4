"""The simulator's hot modules compiled by mypyc, used when built and current (scripts/build_compiled.py).

`MODULES` are compiled from their own source, unchanged: the compiled module and the Python one run the same
code on the same floats, so a run's outputs are byte for byte the same either way (tests/test_compiled.py).
`activate` puts build/mypyc/simulator ahead of this package's folder on its import path when the manifest there
holds every module's current source hash for this interpreter, so a module edited since the build (or a build
for another Python) is never used: it runs as Python. HACKSIM_PURE_PYTHON=1 turns the compiled modules off (the
tests do, and compare the two builds in a child process). Nothing here imports a compiled module.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import sysconfig
from collections.abc import MutableSequence
from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parent
BUILD_DIR = PACKAGE_DIR.parent / "build" / "mypyc"
# the event loop's modules (prefix_cache: a prefix-caching run's per-block work). A compiled class cannot be
# subclassed by a Python one, so the data-parallel router (dp_router) compiles with the router it extends.
MODULES = (
    "timers",
    "arrivals",
    "columns",
    "link",
    "admission",
    "step_price",
    "scheduler",
    "decode",
    "prefill",
    "router",
    "dp_router",
    "prefix_cache",
    "colocated",
)


def source_hashes() -> dict[str, str]:
    return {m: hashlib.sha256((PACKAGE_DIR / f"{m}.py").read_bytes()).hexdigest() for m in MODULES}


def current() -> bool:
    """The build holds every module, compiled for this interpreter from the sources as they are now."""
    try:
        manifest = json.loads((BUILD_DIR / "manifest.json").read_text())
    except (OSError, ValueError):
        return False
    suffix = sysconfig.get_config_var("EXT_SUFFIX")
    return (
        manifest.get("ext_suffix") == suffix
        and manifest.get("sources") == source_hashes()
        and all((BUILD_DIR / "simulator" / f"{m}{suffix}").is_file() for m in MODULES)
    )


def activate(package_path: MutableSequence[str]) -> tuple[str, ...]:
    """Put the compiled modules ahead of the Python ones on the package's path; returns those now compiled."""
    if os.environ.get("HACKSIM_PURE_PYTHON") or not current():
        return ()
    sys.path.append(str(BUILD_DIR))  # the modules' shared runtime library (hacksim_simulator__mypyc)
    package_path.insert(0, str(BUILD_DIR / "simulator"))
    return MODULES
