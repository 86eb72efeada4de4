"""The compiled hot modules (mypyc: simulator/compiled.py, scripts/build_compiled.py) against the Python ones.

The tests run the simulator as Python (tests/conftest.py sets HACKSIM_PURE_PYTHON): it is the model. Here a
child process runs random small scenarios, drawn from the property tests' engine settings (every placement,
on-demand and reserve admission, recompute and swap preemption, chunked prefill, prefix caching in the pool
or a region), once with the compiled modules and once as Python, and every output must be the same bytes.
Without a build the test skips, unless HACKSIM_REQUIRE_COMPILED is set (`make test` builds first and sets it).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from simulator.compiled import MODULES, current
from test_properties import cluster, engine_changes, engines

CHILD = Path(__file__).resolve().parent / "compiled_child.py"


def _cluster_changes(changes: dict) -> dict:
    changes = dict(changes)
    if changes["placement"] == "shared_gpu":
        changes["decode.replicas"] = changes["prefill.replicas"]
    return changes


def _run(cases: list[dict], pure: bool, librt: bool = True) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("HACKSIM_PURE_PYTHON", "HACKSIM_CHILD_NO_LIBRT")}
    if pure:
        env["HACKSIM_PURE_PYTHON"] = "1"
    if not librt:
        env["HACKSIM_CHILD_NO_LIBRT"] = "1"
    proc = subprocess.run(
        [sys.executable, str(CHILD)], input=json.dumps(cases), capture_output=True, text=True, env=env, check=False
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout)


def _require_build() -> None:
    if not current():
        if os.environ.get("HACKSIM_REQUIRE_COMPILED"):
            pytest.fail("the compiled modules are not built or not current: make compiled")
        pytest.skip("the compiled modules are not built (make compiled)")


SCENARIOS = st.lists(st.one_of(engines.map(engine_changes), cluster.map(_cluster_changes)), min_size=10, max_size=10)


@settings(max_examples=3, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(SCENARIOS)
def test_compiled_modules_give_the_python_modules_outputs_byte_for_byte(cases):
    _require_build()
    compiled, pure = _run(cases, pure=False), _run(cases, pure=True)
    assert (compiled["columns"], pure["columns"]) == ("vec[float]", "array")  # simulator/columns.py
    assert compiled["compiled"] == list(MODULES) and pure["compiled"] == []
    assert compiled["digests"] == pure["digests"]


@settings(max_examples=2, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(SCENARIOS)
def test_as_python_librt_is_not_needed(cases):
    """As Python the columns are arrays (simulator/vec_fallback.py) and librt, which comes with mypy, is not imported:
    a Python without it runs every scenario to the same bytes. Bites: librt imported as Python (the child fails);
    with the build, the test above compares these arrays' outputs with the compiled vecs' (bites: a fallback
    column of another type or width, such as an int column made of floats)."""
    with_librt, without = _run(cases, pure=True), _run(cases, pure=True, librt=False)
    assert (with_librt["columns"], without["columns"]) == ("array", "array")
    assert without["digests"] == with_librt["digests"]


def test_an_edited_module_runs_as_python(tmp_path, monkeypatch):
    """A source that no longer matches the build's manifest turns the build off (as does HACKSIM_PURE_PYTHON)."""
    import simulator.compiled as c

    _require_build()
    pkg = tmp_path / "simulator"
    pkg.mkdir()
    for m in MODULES:
        (pkg / f"{m}.py").write_bytes((c.PACKAGE_DIR / f"{m}.py").read_bytes())
    monkeypatch.setattr(c, "PACKAGE_DIR", pkg)
    monkeypatch.delenv("HACKSIM_PURE_PYTHON", raising=False)
    path: list[str] = []
    assert c.activate(path) == MODULES and path == [str(c.BUILD_DIR / "simulator")]
    (pkg / "decode.py").write_text((pkg / "decode.py").read_text() + "\n# edited\n")
    path = []
    assert c.activate(path) == () and path == []
    monkeypatch.setenv("HACKSIM_PURE_PYTHON", "1")
    (pkg / "decode.py").write_bytes((c.PACKAGE_DIR / "decode.py").read_bytes())
    assert c.activate(path) == () and path == []


_BUSY = {
    "methods": ["baseline", "hack"],
    "network.bandwidth_gbps": 2.0,
    "decode.host_serial_s_per_iteration": 6e-4,
    "decode.join_s_per_request": 6e-4,
    "prefill.host_issue_s_per_iteration": 0.01,
    "workload.requests": 24,
    "workload.arrival": {"kind": "poisson", "rate_rps": 4.0},
    "workload.input_tokens": {"kind": "fixed", "tokens": 512},
}
_LEVEL = {"network.link_busy_host_factor": 1.4, "network.link_busy_host_factor_per_gbps": 0.02}
BUSY_LINK_CASES = [
    {**_BUSY, **_LEVEL, "placement": "shared_gpu"},
    {**_BUSY, **_LEVEL, "prefill.replicas": 2, "decode.replicas": 2},
    {**_BUSY, "placement": "shared_gpu"},
]


def test_compiled_modules_price_the_busy_link_host_level_as_python():
    """network.link_busy_host_factor (simulator/link.py EndpointHost, the decode segment cut where the link's state
    changes): the compiled modules give the Python modules' outputs, byte for byte, shared_gpu and separate; the level
    is on (the shared_gpu run without it differs)."""
    _require_build()
    compiled, pure = _run(BUSY_LINK_CASES, pure=False), _run(BUSY_LINK_CASES, pure=True)
    assert compiled["compiled"] == list(MODULES)
    assert compiled["digests"] == pure["digests"]
    assert pure["digests"][0] != pure["digests"][2]
