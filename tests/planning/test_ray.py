"""The same sweep on a local Ray started here gives the process pool's table."""
from __future__ import annotations

import os
import sys

import pandas as pd
import pytest
from planning_helpers import write_sweep

from planning.executor import ROOT, Executor
from planning.sweep import load_sweep, run_sweep

SPEC = {"axes": {"network.bandwidth_gbps": [10, 40], "workload.arrival.rate_rps": [0.5, 2.0]},
        "set": {"workload.requests": 20}}


def test_ray_table_equals_pool_table(tmp_path, base_file):
    ray = pytest.importorskip("ray", reason="ray is not installed (pip install 'hacksim[ray]')")
    spec, base = load_sweep(write_sweep(tmp_path, SPEC))
    with Executor("pool", jobs=2) as ex:
        pool = run_sweep(spec, base, ex).table
    path = os.pathsep.join([str(ROOT), *sys.path])
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False,
             runtime_env={"env_vars": {"PYTHONPATH": path}})
    try:
        with Executor("ray", jobs=2) as ex:
            result = run_sweep(spec, base, ex)
        assert result.stats.backend == "ray" and result.stats.simulated == 4
        pd.testing.assert_frame_equal(pool, result.table)
    finally:
        ray.shutdown()
