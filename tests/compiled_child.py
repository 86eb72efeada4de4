"""A child process of tests/test_compiled.py: runs the scenarios given on stdin (JSON: a list of tests/helpers.py
`scenario(**changes)` dicts) and prints, as JSON, which simulator modules ran compiled and a SHA-256 of each
run's outputs (every column of requests, memory and links, and the summary), with the type of a request's column.
With HACKSIM_CHILD_NO_LIBRT set, librt cannot be imported (as where mypy is not installed)."""

from __future__ import annotations

import hashlib
import json
import os
import sys
from pathlib import Path

if os.environ.get("HACKSIM_CHILD_NO_LIBRT"):
    sys.modules["librt"] = None  # type: ignore[assignment]  (its import raises ImportError)

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import simulator  # noqa: E402
from helpers import scenario  # noqa: E402
from simulator import columns  # noqa: E402
from simulator.run import run_scenario  # noqa: E402


def digest(changes: dict) -> str:
    result = run_scenario(scenario(**changes))
    h = hashlib.sha256()
    for frame in (result.requests, result.memory, result.links):
        h.update(frame.to_csv(index=False).encode())
    h.update(json.dumps(result.summary, sort_keys=True).encode())
    return h.hexdigest()


if __name__ == "__main__":
    cases = json.load(sys.stdin)
    print(
        json.dumps(
            {
                "compiled": list(simulator.COMPILED),
                "columns": type(columns.nans(1)).__name__,
                "digests": [digest(c) for c in cases],
            }
        )
    )
