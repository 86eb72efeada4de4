"""Fixtures for planning tests (the data lives in planning_helpers.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from planning_helpers import TINY_BASE


@pytest.fixture
def base_file(tmp_path: Path) -> Path:
    path = tmp_path / "base.yaml"
    path.write_text(yaml.safe_dump(TINY_BASE, sort_keys=False))
    return path
