"""Shared test set-up: the import path, and hypothesis profiles.

Hypothesis profiles (HYPOTHESIS_PROFILE picks one; `ci` by default, so `make test` and CI use it):
- ci: derandomised (each test draws the same examples on every run and machine: a failure in CI reproduces
  with the same command), no example database (nothing a previous run left changes what runs), no deadline
  and no too_slow health check (both are wall-clock measurements, which a loaded machine fails);
- random: fresh examples each run, failures saved in .hypothesis/ and replayed first next time, for looking
  beyond the fixed examples locally: `HYPOTHESIS_PROFILE=random .venv/bin/python -m pytest tests/test_properties.py`
  (a failure prints the @reproduce_failure line that replays it anywhere).
A test's own @settings override the profile only for what they name (max_examples, mostly).

The tests run the simulator as Python (HACKSIM_PURE_PYTHON=1, set here before anything imports it): the Python
modules are the model, and tests/test_compiled.py checks the mypyc-compiled ones against them in child
processes. `HACKSIM_PURE_PYTHON= pytest ...` (set, empty) runs the whole suite on the compiled modules instead
(tests that patch a method of an entity class, or hand it a stand-in of another type, then fail: a compiled class
cannot be patched and checks the declared types)."""

import os
import sys
from pathlib import Path

from hypothesis import HealthCheck, settings
from hypothesis.database import DirectoryBasedExampleDatabase

os.environ.setdefault("HACKSIM_PURE_PYTHON", "1")

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

_WALL_CLOCK_CHECKS = dict(deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("ci", derandomize=True, database=None, print_blob=True, **_WALL_CLOCK_CHECKS)
settings.register_profile(
    "random",
    derandomize=False,
    database=DirectoryBasedExampleDatabase(ROOT / ".hypothesis" / "examples"),
    print_blob=True,
    **_WALL_CLOCK_CHECKS,
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))
