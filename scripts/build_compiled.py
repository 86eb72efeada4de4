"""Compile the simulator's hot modules with mypyc, from the same source (optional: `make compiled`).

    python -m scripts.build_compiled [--check]

mypyc (mypy's compiler, https://mypyc.readthedocs.io) turns each typed module into a C extension whose classes
keep their attributes in C structs and whose calls between compiled functions skip the interpreter. The modules
are the event loop's (`simulator.compiled.MODULES`); the rest of the package, and everything the compiled
code calls outside it (SimPy's queue, the cost model, numpy), stays Python. The extensions go to build/mypyc/
with a manifest of the sources' SHA-256; `simulator/__init__.py` loads them only while every source still
matches its hash, so an edited module runs as Python until the next build, and HACKSIM_PURE_PYTHON=1 runs
everything as Python. Without mypy or a C compiler the build is skipped and the package runs as Python, with
the same results (tests/test_compiled.py runs random scenarios both ways and compares every output column).

--check: exit 1 unless the compiled modules are built and current (what `make test` asks before its tests).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from simulator.compiled import BUILD_DIR, MODULES, current  # noqa: E402

MYPY_ARGS = ["--ignore-missing-imports", "--follow-imports=silent"]  # the rest of the tree is imported, not compiled


def build() -> bool:
    try:
        import mypyc  # noqa: F401  (comes with mypy)
    except ImportError:
        print("build_compiled: mypy is not installed: the simulator runs as Python", file=sys.stderr)
        return False
    paths = [f"simulator/{m}.py" for m in MODULES]
    with tempfile.TemporaryDirectory(prefix="hacksim-mypyc-") as tmp:
        out = Path(tmp) / "lib"
        # setup() in a child process: mypyc writes its C files under the working directory's build/
        code = (
            "from setuptools import setup\n"
            "from mypyc.build import mypycify\n"
            f"setup(name='hacksim-compiled', ext_modules=mypycify({MYPY_ARGS + paths!r}, opt_level='3', "
            f"group_name='hacksim_simulator', target_dir={str(Path(tmp) / 'c')!r}),\n"
            f"      script_args=['build_ext', '--build-lib', {str(out)!r}, '--build-temp', {str(Path(tmp) / 'o')!r}])\n"
        )
        proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
        if proc.returncode != 0:
            print(proc.stdout[-4000:], proc.stderr[-4000:], sep="\n", file=sys.stderr)
            print("build_compiled: mypyc failed: the simulator runs as Python", file=sys.stderr)
            return False
        if BUILD_DIR.exists():
            shutil.rmtree(BUILD_DIR)
        shutil.copytree(out, BUILD_DIR)
    from simulator.compiled import source_hashes

    manifest = {
        "ext_suffix": sysconfig.get_config_var("EXT_SUFFIX"),
        "sources": source_hashes(),
        "mypy": _version("mypy"),
    }
    (BUILD_DIR / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
    return True


def _version(pkg: str) -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(pkg)
    except PackageNotFoundError:
        return None


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--check", action="store_true")
    args = ap.parse_args()
    if args.check:
        sys.exit(0 if current() else 1)
    if os.environ.get("HACKSIM_PURE_PYTHON"):
        print("build_compiled: HACKSIM_PURE_PYTHON is set: nothing to build", file=sys.stderr)
        return
    if current():
        return
    build()  # a failed build is not an error: the modules run as Python


if __name__ == "__main__":
    main()
