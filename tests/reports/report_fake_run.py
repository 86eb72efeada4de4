"""Writes a run directory that follows the ``simulate --out DIR`` file contract, without the simulator.

The numbers are plausible, not simulated: each method scales the phases of a shared request
stream by fixed factors, memory and link series are the step functions implied by those intervals.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd

GIB = 2**30
PARTS = (
    "prefill_queue",
    "prefill",
    "quantize",
    "transfer_queue",
    "transfer",
    "decode_queue",
    "decode",
    "dequantize",
    "approximation",
)
# method: (wire bytes factor, memory bytes factor, quantize s/1k tok, dequantize s/token, decode factor)
METHODS = {
    "baseline": (1.0, 1.0, 0.0, 0.0, 1.0),
    "cachegen": (0.18, 1.0, 0.020, 0.0, 1.0),
    "kvquant": (0.14, 0.14, 0.012, 0.0016, 1.08),
    "fp8": (0.5, 0.5, 0.002, 0.0, 0.8),
    "hack": (0.14, 0.14, 0.010, 0.0, 0.62),
    "hack_no_se": (0.14, 0.14, 0.010, 0.0, 0.81),
    "hack_no_rqe": (0.14, 0.14, 0.010, 0.0, 0.70),
}
KV_BYTES_PER_TOKEN = 128 * 1024  # Llama-3.1-8B, FP16: 32 layers * 2 * 8 heads * 128 * 2 B
WEIGHTS_BYTES = 15 * GIB
CAPACITY_BYTES = 22 * GIB
LINK_GBPS = 10.0


def write_fake_run(
    out: str | Path,
    n_requests: int = 40,
    methods=tuple(METHODS),
    seed: int = 0,
    accuracy: bool = True,
    links_capacity_column: bool = False,
) -> Path:
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    arrival = np.cumsum(rng.exponential(0.5, n_requests))
    prompt = rng.integers(800, 6000, n_requests)
    output = rng.integers(1, 400, n_requests)
    qnoise = rng.exponential(1.0, (3, n_requests))
    batch = rng.uniform(0.8, 1.3, n_requests)  # decode batch size varies the time per token
    reqs, mem_rows, link_rows, summary = [], [], [], {}
    for method in methods:
        wire_f, mem_f, q_s, dq_s, dec_f = METHODS.get(method, (0.3, 0.3, 0.005, 0.0, 0.9))
        kv_wire = prompt * KV_BYTES_PER_TOKEN * wire_f
        kv_mem = (prompt + output) * KV_BYTES_PER_TOKEN * mem_f
        t = {
            "prefill_queue_s": 0.05 * qnoise[0],
            "prefill_s": prompt * 1.1e-4,
            "quantize_s": prompt / 1000 * q_s,
            "transfer_queue_s": 0.3 * wire_f * qnoise[1],
            "transfer_s": kv_wire * 8 / (LINK_GBPS * 1e9 * 0.94),
            "decode_queue_s": 0.1 * qnoise[2] * dec_f,
            "decode_s": output * 0.028 * dec_f * batch,
            "dequantize_s": output * dq_s,
            "approximation_s": np.zeros(n_requests),
        }
        p_rep, d_rep = np.arange(n_requests) % 2, (np.arange(n_requests) // 2) % 2
        prefill_start = arrival + t["prefill_queue_s"]
        prefill_end = prefill_start + t["prefill_s"] + t["quantize_s"]
        transfer_start = prefill_end + t["transfer_queue_s"]
        transfer_end = transfer_start + t["transfer_s"]
        decode_start = transfer_end + t["decode_queue_s"]
        first_token = decode_start + 0.028 * dec_f
        finish = decode_start + t["decode_s"] + t["dequantize_s"]
        jct = finish - arrival
        tpot = np.where(output > 1, (finish - first_token) / np.maximum(output - 1, 1), np.nan)
        df = pd.DataFrame(
            {
                "method": method,
                "request_id": np.arange(n_requests),
                "prompt_tokens": prompt,
                "output_tokens": output,
                "arrival_s": arrival,
                "prefill_start_s": prefill_start,
                "prefill_end_s": prefill_end,
                "transfer_start_s": transfer_start,
                "transfer_end_s": transfer_end,
                "decode_start_s": decode_start,
                "first_token_s": first_token,
                "finish_s": finish,
                "jct_s": jct,
                "ttft_s": first_token - arrival,
                "tpot_s": tpot,
                **t,
                "prefill_replica": p_rep,
                "decode_replica": d_rep,
                "kv_wire_bytes": kv_wire,
                "kv_memory_bytes": kv_mem,
                "an_extra_column": 1,
            }
        )
        reqs.append(df)
        for r in (0, 1):
            sel = d_rep == r
            ev = sorted(
                [(0.0, 0.0)]
                + [(s, b) for s, b in zip(transfer_start[sel], kv_mem[sel])]
                + [(f, -b) for f, b in zip(finish[sel], kv_mem[sel])]
            )
            used = WEIGHTS_BYTES + np.cumsum([b for _, b in ev])
            mem_rows += [(method, r, tt, int(u), CAPACITY_BYTES) for (tt, _), u in zip(ev, used)]
        for p in (0, 1):
            for d in (0, 1):
                sel = (p_rep == p) & (d_rep == d)
                ev = sorted([(0.0, 0)] + [(s, 1) for s in transfer_start[sel]] + [(e, -1) for e in transfer_end[sel]])
                flows = np.cumsum([x for _, x in ev])
                row = [
                    (method, f"p{p}->d{d}", tt, int(n), LINK_GBPS * 0.94 if n > 0 else 0.0)
                    for (tt, _), n in zip(ev, flows)
                ]
                link_rows += [r + ((LINK_GBPS,) if links_capacity_column else ()) for r in row]

        def stats(x):
            x = x[np.isfinite(x)]
            return {
                "mean": float(x.mean()),
                "p50": float(np.percentile(x, 50)),
                "p90": float(np.percentile(x, 90)),
                "p99": float(np.percentile(x, 99)),
            }

        summary[method] = {
            "completed": n_requests,
            "jct_s": stats(jct),
            "ttft_s": stats(first_token - arrival),
            "tpot_s": stats(tpot),
            "breakdown_s": {p: float(t[f"{p}_s"].mean()) for p in PARTS},
            "peak_decode_memory_bytes": int(max(r[3] for r in mem_rows if r[0] == method)),
            "kv_bytes_per_token": {"wire": KV_BYTES_PER_TOKEN * wire_f, "memory": KV_BYTES_PER_TOKEN * mem_f},
            "throughput_rps": float(n_requests / finish.max()),
        }
    pd.concat(reqs).to_csv(out / "requests.csv", index=False)
    pd.DataFrame(mem_rows, columns=["method", "replica", "time_s", "used_bytes", "capacity_bytes"]).to_csv(
        out / "memory.csv", index=False
    )
    cols = ["method", "link", "time_s", "active_flows", "throughput_gbps"] + (
        ["capacity_gbps"] if links_capacity_column else []
    )
    pd.DataFrame(link_rows, columns=cols).to_csv(out / "links.csv", index=False)
    (out / "summary.json").write_text(
        json.dumps({"scenario": "a10g_10gbps", "seed": seed, "methods": summary}, indent=2)
    )
    scenario = {
        "name": "a10g_10gbps",
        "seed": seed,
        "model": {"name": "llama-3.1-8b", "layers": 32, "kv_heads": 8, "head_dim": 128, "dtype": "fp16"},
        "prefill": {"gpu": "a10g", "replicas": 2, "max_batch_tokens": 8192},
        "decode": {"gpu": "a10g", "replicas": 2, "max_batch_requests": 64},
        "network": {"topology": "full_bipartite", "link_bandwidth_gbps": LINK_GBPS},
        "workload": {"dataset": "synthetic", "arrival": {"kind": "poisson", "rate_rps": 2.0}, "requests": n_requests},
        "methods": [{"name": m, **({"partition": 64} if m.startswith("hack") else {})} for m in methods],
    }
    (out / "scenario.json").write_text(json.dumps(scenario, indent=2))
    prof = {
        "gpu": "a10g",
        "source": "derived",
        "derived_from": "h200",
        "path": "kernels_calibration/profiles/a10g/profile.json",
    }
    profiles = {"prefill": prof, "decode": dict(prof)}
    if accuracy:
        profiles["accuracy"] = [
            {
                "kernel": k,
                "partition": p,
                "bits": 2,
                "rounding": "stochastic",
                "inputs": "gaussian",
                "rel_error": e * (p / 64) ** 0.5,
            }
            for k, e in (("hack", 0.021), ("hack_no_se", 0.021), ("hack_no_rqe", 0.017))
            for p in (32, 64, 128)
        ] + [
            {
                "kernel": "kvquant",
                "partition": 64,
                "bits": 2,
                "rounding": "nearest",
                "inputs": "gaussian",
                "rel_error": 0.035,
            }
        ]
    (out / "profiles.json").write_text(json.dumps(profiles, indent=2))
    return out
