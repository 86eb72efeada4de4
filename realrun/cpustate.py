"""python -m realrun.cpustate --seconds S --out CSV [--tag T]: does the host's CPU run at one speed?

The recordings' host-bound steps (the 2-bit formats' quantize step, the decode loop's gap) switch between two speeds
in stretches of seconds, within a run and from one run to the next (realrun/DESIGN.md, "The host's run-to-run
spread"). This probe times, step after step for S seconds on the thread the OS gives it, two fixed pieces of work:

- `py_s`: a pure-Python loop (20,000 multiply-adds), no GPU, no library: the CPU's own speed;
- `quant_s` (where CUDA is available): the KVQuant-style quantize step of a 2,048-token prompt over the 32 layers of
  Llama-3.1-8B (realrun.kvformats, the recordings' own Triton launches from Python), synchronised.

Per step it also writes the CPU the thread ran on at the start and the end (`/proc/self/stat`), and the machine's
steal ticks over the step (`/proc/stat`: time the hypervisor gave another guest). Rows are appended to CSV (columns
tag, t_s, wall_s, py_s, quant_s, cpu, cpu_end, steal_ticks; wall_s the step's start by the wall clock, to set beside
a recording's `wall_start_s` and `wall_end_s` in its meta.json), so several processes' runs share one file; SIGTERM
ends a run after its step and still writes it (device_run.sh HOSTPROBE=1: the probe in the background of a part). `summarise(paths)`
(no GPU) gives per tag the two speeds' medians, the share of steps at the slow one, and the correlation of the two
timings step by step. Run on the H200 host by device part `cpustate`.
"""

from __future__ import annotations

import argparse
import csv
import signal
import sys
import time
from pathlib import Path

PY_LOOP = 20_000  # the pure-Python loop's multiply-adds: about 2 ms on the device hosts' CPUs


def py_work() -> float:
    s = 0
    for i in range(PY_LOOP):
        s += i * i
    return float(s)


def _cpu_now() -> int:
    with open("/proc/self/stat") as f:
        return int(f.read().rsplit(")", 1)[1].split()[36])


def _steal_ticks() -> int:
    with open("/proc/stat") as f:
        fields = f.readline().split()
    return int(fields[8]) if len(fields) > 8 else 0


def _quantize_step():
    """A callable running the quantize step of one 2,048-token prompt over 32 layers (synchronised), or None
    without CUDA."""
    import torch

    if not torch.cuda.is_available():
        return None
    from .kvformats import KVQuant
    from .model import model_shape

    dev = torch.device("cuda")
    shape = model_shape("llama-3.1-8b", 32)
    method = KVQuant(shape, dev, slots=1, cap_tokens=4096)
    k = torch.randn(shape.kv_heads, 2048, shape.head_dim, device=dev, dtype=torch.float16)
    v = torch.randn_like(k)

    def step() -> None:
        for _ in range(shape.layers):
            method.quantize_layer(k, v)
        torch.cuda.synchronize()

    for _ in range(3):  # compile and warm the kernels
        step()
    return step


def measure(seconds: float, tag: str, gpu: bool = True, stop=lambda: False) -> list[dict]:
    """Steps for `seconds` or until `stop()` (at least one, however loaded the machine: the file always gets a
    row)."""
    step = _quantize_step() if gpu else None
    rows, end = [], time.perf_counter() + seconds
    while not rows or (time.perf_counter() < end and not stop()):
        cpu, steal = _cpu_now(), _steal_ticks()
        wall = time.time()
        t0 = time.perf_counter()
        if step is not None:
            step()
        t1 = time.perf_counter()
        py_work()
        t2 = time.perf_counter()
        rows.append(
            dict(
                tag=tag,
                t_s=t0,
                wall_s=wall,
                py_s=t2 - t1,
                quant_s=(t1 - t0) if step is not None else float("nan"),
                cpu=cpu,
                cpu_end=_cpu_now(),
                steal_ticks=_steal_ticks() - steal,
            )
        )
        time.sleep(0.005)
    return rows


def _slow_cut(x):
    """The timing above which a step is at the slow speed: the midpoint of the timings' 5th and 95th percentiles."""
    import numpy as np

    lo, hi = np.percentile(x, [5, 95])
    return (lo + hi) / 2


def summarise(paths) -> dict:
    """Per tag: steps, CPUs, migrations and steal; the pure-Python loop's two speeds (the medians of the steps below
    and above the midpoint of its 5th and 95th percentiles) and the share of steps at the slow one; the same for the
    quantize step where timed, and the step-by-step correlation of the two timings."""
    import numpy as np
    import pandas as pd

    d = pd.concat([pd.read_csv(p) for p in paths], ignore_index=True)
    out = {}
    for tag, g in d.groupby("tag", sort=True):
        row: dict = {
            "steps": len(g),
            "cpus": sorted(int(c) for c in g["cpu"].unique()),
            "migrations": int((g["cpu"] != g["cpu_end"]).sum()),
            "steal_ticks": int(g["steal_ticks"].sum()),
        }
        for col in ("py_s", "quant_s"):
            x = g[col].to_numpy(dtype=float)
            if np.isnan(x).all():
                continue
            cut = _slow_cut(x)
            row[col] = {
                "fast_ms": round(float(np.median(x[x <= cut])) * 1e3, 3),
                "slow_ms": round(float(np.median(x[x > cut])) * 1e3, 3) if (x > cut).any() else None,
                "slow_share": round(float((x > cut).mean()), 3),
            }
        if "quant_s" in row:
            row["correlation"] = round(float(np.corrcoef(g["py_s"], g["quant_s"])[0, 1]), 3)
        out[str(tag)] = row
    return out


def beside_runs(probe_csv, trace_dirs) -> list[dict]:
    """Per recording (a realrun trace directory whose meta.json has wall_start_s and wall_end_s), the probe's steps
    within its span: how many, the pure-Python loop's median (ms) and the share of steps at the slow speed (above the
    midpoint of the whole file's 5th and 95th percentiles, `_slow_cut`, as `summarise`)."""
    import json

    import numpy as np
    import pandas as pd

    d = pd.read_csv(probe_csv)
    py = d["py_s"].to_numpy(dtype=float)
    cut = _slow_cut(py)
    wall = d["wall_s"].to_numpy(dtype=float)
    out = []
    for tdir in trace_dirs:
        meta = json.loads((Path(tdir) / "meta.json").read_text())
        if "wall_start_s" not in meta:
            continue
        inside = (wall >= meta["wall_start_s"]) & (wall <= meta["wall_end_s"])
        x = py[inside]
        out.append(
            {
                "trace": Path(tdir).name,
                "steps": int(inside.sum()),
                "py_median_ms": round(float(np.median(x)) * 1e3, 3) if len(x) else float("nan"),
                "slow_share": round(float((x > cut).mean()), 3) if len(x) else float("nan"),
            }
        )
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=30.0)
    ap.add_argument("--out", type=Path, help="the CSV to append the steps to")
    ap.add_argument("--tag", default="run")
    ap.add_argument("--no-gpu", action="store_true", help="time the pure-Python loop alone")
    ap.add_argument("--summarise", nargs="+", type=Path, help="print the summary of these files; runs nothing")
    ap.add_argument(
        "--beside",
        nargs="+",
        type=Path,
        metavar="PATH",
        help="PROBE.csv TRACE_DIR...: the probe's steps within each recording's wall-clock span; runs nothing",
    )
    a = ap.parse_args(argv)
    if a.beside:
        for row in beside_runs(a.beside[0], a.beside[1:]):
            print(row)
        return 0
    if a.summarise:
        for tag, row in summarise(a.summarise).items():
            print(tag, row)
        return 0
    if a.out is None:
        ap.error("--out is required (or --summarise)")
    stopped = []  # SIGTERM (a background probe's end, device part HOSTPROBE=1): finish the step, write the rows
    signal.signal(signal.SIGTERM, lambda *_: stopped.append(True))
    rows = measure(a.seconds, a.tag, gpu=not a.no_gpu, stop=lambda: bool(stopped))
    new = not a.out.exists()
    with open(a.out, "a", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        if new:
            w.writeheader()
        w.writerows(rows)
    print(a.tag, summarise([a.out])[a.tag], flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
