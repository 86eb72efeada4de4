"""What `pip install` ships: a wheel built from this tree holds the `hacksim` command, the example
scenarios and the data the simulator reads, and no tests."""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SKIP = shutil.ignore_patterns(
    ".git",
    ".venv",
    "out",
    "build",
    "*.egg-info",
    "__pycache__",
    ".pytest_cache",
    ".hypothesis",
    "runs",
    "traces",
    "tests",
)


def test_the_wheel_has_the_command_and_the_examples(tmp_path):
    src = tmp_path / "src"
    shutil.copytree(ROOT, src, ignore=SKIP)  # a copy: building writes build/ and *.egg-info beside the sources
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "-w",
            str(tmp_path / "dist"),
            str(src),
        ],
        capture_output=True,
        text=True,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    (wheel,) = (tmp_path / "dist").glob("hacksim-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    shipped = {p.relative_to(ROOT).as_posix() for p in (ROOT / "scenarios").rglob("*.yaml")}
    assert shipped and shipped <= names, sorted(shipped - names)
    assert {
        "cli.py",
        "scenarios/__init__.py",
        "scenarios/schema.json",
        "catalog/data/models.yaml",
        "reports/templates/page.html.j2",
        "reports/templates/page.css",
        "kernels_calibration/profiles/h200/profile.json",
    } <= names
    assert not any(n.startswith("tests/") for n in names)
    entry_points = zipfile.ZipFile(wheel).read(next(n for n in names if n.endswith("entry_points.txt"))).decode()
    assert "hacksim = cli:app" in entry_points
