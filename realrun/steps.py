"""python -m realrun.steps TRACE...: where a recording's decode iterations spend their time (no GPU).

A recording made with `python -m realrun ... --step-times` carries steps.csv beside its trace (realrun/runner.py,
STEP_COLUMNS): per decode iteration the host's issue (from the iteration's start to the step graph's launch: slot
bookkeeping, the KV placement's launch, the input copy; with the four CUDA events' own few microseconds) and, by
those events, the KV placement's and the step graph's time on the GPU. With the trace's own rows that splits every
iteration into

  host serial   the loop's time between the previous iteration's end and this one's start (reading the tokens
                back, bookkeeping, arrivals, admission) plus this iteration's issue: the GPU idles through both;
  KV placement  the joins' and compactions' copies (one launch);
  step graph    the whole model step (the part the kernels' prices describe).

`iteration_parts` gives them per iteration with the iteration's kind: *join* (a request joins in it), *compaction*
(a request left before it: the last running one's KV moves into its slot), *link busy* (a transfer in flight
between its start and the next one's), else *steady*; a loop gap holding a prefill is left out (`parts_of` does the
same from frames already read: `validate` passes the trace it loaded). `summarise` gives per kind the means and
medians, and for the steady ones the host serial's growth per running request (least squares over the batch sizes the
run went through). Nothing here is fitted to a trace's
request times.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

KINDS = ("steady", "join", "compaction", "link busy")
# steps.csv (realrun/runner.py writes it with --step-times): per decode iteration the host's issue (its start to the
# graph launch), the KV placement's and the step graph's GPU time (CUDA events around each launch), the joins and
# compactions, the bucket it ran at
STEP_COLUMNS = [
    "iteration",
    "host_issue_s",
    "place_gpu_s",
    "step_gpu_s",
    "joins",
    "compactions",
    "batch_bucket",
    "context_bucket",
]


def iteration_parts(trace: str | Path):
    """Per decode iteration of a trace folder with steps.csv: parts_of its iterations.csv, requests.csv and
    steps.csv."""
    import pandas as pd

    from simulator.measured import iterations_file  # plain, or gzipped as the committed traces keep it

    trace = Path(trace)
    its = iterations_file(trace) or trace / "iterations.csv"
    return parts_of(*(pd.read_csv(f) for f in (its, trace / "requests.csv", trace / "steps.csv")))


def parts_of(iterations, requests, steps):
    """Per decode iteration (the iteration column's order): batch_size, host_issue_s, place_gpu_s, step_gpu_s,
    loop_gap_s (its end to the next start; NaN for the last and where a prefill ran between), host_serial_s (the loop
    gap before it plus its issue; NaN where that gap held a prefill), kind (module doc). ValueError names a bad
    steps row or a count that does not match the iterations."""
    import numpy as np
    import pandas as pd

    it = iterations.sort_values("iteration").reset_index(drop=True)
    rq, st = requests, steps
    missing = [c for c in STEP_COLUMNS if c not in st.columns]
    if missing:
        raise ValueError(f"missing columns {', '.join(missing)}")
    for col in STEP_COLUMNS:
        v = pd.to_numeric(st[col], errors="coerce").to_numpy(float)
        bad = ~np.isfinite(v) | (v < 0)
        if bad.any():
            k = int(np.argmax(bad))
            raise ValueError(f"line {k + 2}: {col} {st[col].iloc[k]!r} is not a finite number >= 0")
    st = st.sort_values("iteration").reset_index(drop=True)
    if len(st) != len(it):
        raise ValueError(f"{len(st)} rows where iterations.csv has {len(it)}")
    start, end = it.start_s.to_numpy(float), it.end_s.to_numpy(float)
    nxt = np.r_[start[1:], np.nan]
    pre = np.sort(rq.prefill_start_s.dropna().to_numpy(float))
    prefill_after = (np.searchsorted(pre, nxt) - np.searchsorted(pre, end)) > 0
    gap = np.where(prefill_after | np.isnan(nxt), np.nan, nxt - end)
    issue = st.host_issue_s.to_numpy(float)
    serial = np.r_[np.nan, gap[:-1]] + issue
    ts = rq.transfer_start_s.to_numpy(float)
    te = rq.transfer_end_s.to_numpy(float)
    until = np.where(np.isnan(nxt), end, nxt)
    busy = np.array([bool(((ts < u) & (te > s)).any()) for s, u in zip(start, until)])
    joins, moves = st.joins.to_numpy(int), st.compactions.to_numpy(int)
    kind = np.where(joins > 0, "join", np.where(moves > 0, "compaction", np.where(busy, "link busy", "steady")))
    return pd.DataFrame(
        {
            "batch_size": it.batch_size.to_numpy(int),
            "host_issue_s": issue,
            "place_gpu_s": st.place_gpu_s.to_numpy(float),
            "step_gpu_s": st.step_gpu_s.to_numpy(float),
            "loop_gap_s": gap,
            "host_serial_s": serial,
            "kind": kind,
        }
    )


def summarise(trace: str | Path) -> dict:
    """One trace: per kind the iterations, mean batch and the parts' means (ms) and medians; for the steady
    iterations the host serial = a + b x running requests by least squares (b in µs per request)."""
    import numpy as np

    p = iteration_parts(trace)
    out: dict = {"trace": Path(trace).name, "iterations": len(p), "kinds": {}}
    for k in KINDS:
        g = p[p.kind == k]
        if g.empty:
            continue
        row = {"n": len(g), "batch": float(g.batch_size.mean())}
        for col in ("host_issue_s", "loop_gap_s", "host_serial_s", "place_gpu_s", "step_gpu_s"):
            v = g[col].dropna()
            name = col.removesuffix("_s")
            row[f"{name}_ms"] = float(v.mean() * 1e3) if len(v) else float("nan")
            row[f"{name}_median_ms"] = float(v.median() * 1e3) if len(v) else float("nan")
        out["kinds"][k] = row
    s = p[(p.kind == "steady") & p.host_serial_s.notna()]
    if s.batch_size.nunique() >= 2:
        slope, level = np.polyfit(s.batch_size.to_numpy(float), s.host_serial_s.to_numpy(float), 1)
        out["host_serial_ms_at_0"] = float(level * 1e3)
        out["host_serial_us_per_request"] = float(slope * 1e6)
    return out


def format_summary(rows: list[dict]) -> str:
    lines = [
        f"{'trace':34s} {'kind':10s} {'n':>5s} {'batch':>6s} {'issue':>7s} {'gap':>7s} {'serial':>7s} "
        f"{'(median)':>8s} {'place':>7s} {'step':>7s}   (ms, GPU parts by CUDA events)"
    ]
    for r in rows:
        for k, v in r["kinds"].items():
            lines.append(
                f"{r['trace'][:34]:34s} {k:10s} {v['n']:5d} {v['batch']:6.1f} {v['host_issue_ms']:7.3f} "
                f"{v['loop_gap_ms']:7.3f} {v['host_serial_ms']:7.3f} {v['host_serial_median_ms']:8.3f} "
                f"{v['place_gpu_ms']:7.3f} {v['step_gpu_ms']:7.3f}"
            )
        if "host_serial_us_per_request" in r:
            lines.append(
                f"{'':34s} steady host serial = {r['host_serial_ms_at_0']:.3f} ms + "
                f"{r['host_serial_us_per_request']:.1f} µs x running requests"
            )
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m realrun.steps", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("traces", nargs="+", type=Path, help="trace folders recorded with --step-times")
    a = ap.parse_args(argv)
    missing = [t for t in a.traces if not (t / "steps.csv").is_file()]
    if missing:
        print(f"{missing[0]}: no steps.csv (record with python -m realrun ... --step-times)", file=sys.stderr)
        return 2
    rows = []
    for t in a.traces:
        try:
            rows.append(summarise(t))
        except (KeyError, ValueError) as e:
            print(f"{t / 'steps.csv'}: {e}", file=sys.stderr)
            return 2
    print(format_summary(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
