"""Trace files of a real run (the format docs/calibration.md documents, "Trace format"): requests.csv, iterations.csv, meta.json.
Times in seconds from the run's start (monotonic host clock read after torch.cuda.synchronize())."""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path

REQUEST_COLUMNS = [
    "request_id",
    "method",
    "arrival_s",
    "prompt_tokens",
    "output_tokens",
    "prefill_start_s",
    "prefill_end_s",
    "quantize_end_s",
    "transfer_start_s",
    "transfer_end_s",
    "decode_start_s",
    "first_token_s",
    "finish_s",
]
ITERATION_COLUMNS = ["iteration", "start_s", "end_s", "batch_size", "context_tokens", "peak_memory_bytes"]
META_KEYS = [
    "method",
    "model",
    "layers",
    "rate_rps",
    "link_gbps",
    "seed",
    "requests",
    "kv_capacity_bytes",
    "prefill_max_batch_requests",
    "prefill_max_batch_tokens",
    "prefill_host_memory_bytes",
    "max_decode_batch",
    "prompt_tokens",
    "output_tokens",
    "decode_mode",
    "placement",
    "gpu",
    "driver",
    "torch",
    "triton",
    "python",
    "date",
    "git_rev",
    "cpu",  # the host CPU (kernels_calibration.measure.cpu_name): host-bound phases move with it
    "command",
    "notes",
]
# written where the writer knows them: the run's span by the wall clock (realrun.runner; beside a host probe's wall_s,
# realrun.cpustate)
OPTIONAL_META_KEYS = ["wall_start_s", "wall_end_s"]


def _fmt(v):
    if isinstance(v, float):
        return "" if math.isnan(v) else repr(round(v, 9))
    return v


def write_trace(out: Path, requests: list[tuple], iterations: list[tuple], meta: dict) -> Path:
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    if sorted(k for k in meta if k not in OPTIONAL_META_KEYS) != sorted(META_KEYS):
        raise ValueError(f"meta keys {sorted(meta)} != {sorted(META_KEYS)} (+ optional {OPTIONAL_META_KEYS})")
    with open(out / "requests.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(REQUEST_COLUMNS)
        for row in sorted(requests, key=lambda r: r[0]):
            w.writerow([_fmt(v) for v in row])
    with open(out / "iterations.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(ITERATION_COLUMNS)
        for row in iterations:
            w.writerow([_fmt(v) for v in row])
    (out / "meta.json").write_text(
        json.dumps({k: meta[k] for k in META_KEYS + OPTIONAL_META_KEYS if k in meta}, indent=1) + "\n"
    )
    return out
