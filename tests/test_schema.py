"""scenarios/schema.json describes what the loader accepts: every shipped scenario validates against it
(shorthand included), it refuses what the loader refuses, it is the `schema` command's output, and each
scenario file points editors at it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import jsonschema
import pytest
import yaml

from simulator.config import ScenarioError, parse_scenario

ROOT = Path(__file__).resolve().parent.parent
SCHEMA_FILE = ROOT / "scenarios" / "schema.json"
SCENARIOS = sorted((ROOT / "scenarios").glob("*.yaml")) + sorted((ROOT / "scenarios" / "measured").glob("*.yaml"))
REGENERATE = "regenerate it: python cli.py schema > scenarios/schema.json"


@pytest.fixture(scope="module")
def validator():
    schema = json.loads(SCHEMA_FILE.read_text())
    jsonschema.Draft202012Validator.check_schema(schema)
    return jsonschema.Draft202012Validator(schema)


def test_the_shipped_schema_is_the_commands_output():
    r = subprocess.run([sys.executable, str(ROOT / "cli.py"), "schema"], capture_output=True, text=True, cwd=ROOT)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout) == json.loads(SCHEMA_FILE.read_text()), f"scenarios/schema.json is stale: {REGENERATE}"


@pytest.mark.parametrize("path", SCENARIOS, ids=lambda p: p.relative_to(ROOT / "scenarios").as_posix())
def test_every_shipped_scenario_validates_and_points_at_the_schema(validator, path):
    errors = [f"{list(e.path)}: {e.message}" for e in validator.iter_errors(yaml.safe_load(path.read_text()))]
    assert errors == []
    first = path.read_text().splitlines()[0]
    target = (path.parent / first.split("$schema=", 1)[1]).resolve()
    assert first.startswith("# yaml-language-server: $schema=") and target == SCHEMA_FILE


BASE = yaml.safe_load((ROOT / "scenarios" / "a10g_10gbps.yaml").read_text())


@pytest.mark.parametrize(
    "change",
    [
        {"methods": ["baseline", "hack_turbo"]},  # no such method
        {"methods": [{"name": "hack", "partition": 0}]},  # out of bounds
        {"methods": [{"name": "hack", "partition": 100}]},  # not a multiple of 16
        {"methods": [{"partition": 64}]},  # which method?
        {"model": "llama-9"},  # no such preset
        {"model": {"preset": "llama-3.1-8b", "layerz": 8}},  # unknown override
        {"prefill": {**BASE["prefill"], "instance": "g99.large"}},  # no such instance
        {"network": {"bandwidth_gbps": -1}},
        {"workload": {**BASE["workload"], "colour": "red"}},
    ],
)
def test_the_schema_refuses_what_the_loader_refuses(validator, change):
    raw = {**BASE, **change}
    assert list(validator.iter_errors(raw)), change
    with pytest.raises(ScenarioError):
        parse_scenario(raw, "t")


@pytest.mark.parametrize(
    "change",
    [
        {"methods": ["hack_no_se", {"name": "hack", "partition": 128, "label": "hack_pi128"}]},
        {"model": {"preset": "llama-3.1-70b", "layers": 8}},
        {"workload": {"trace": {"format": "burstgpt", "path": "b.csv", "models": ["ChatGPT"]}}},
    ],
)
def test_the_schema_accepts_the_shorthand(validator, change):
    assert [e.message for e in validator.iter_errors({**BASE, **change})] == []
