"""python -m realrun.prefillcal --out FILE.csv: the harness's prefill alone, by prompt length, back to back and rested.

A recording's prefill runs slower than the kernel profiles price it (the fitted prefill.prefill_efficiency), and how
much may depend on what the prefill runs: the model's GEMMs and FP16 attention draw the most power, and the H200 sits
in its software power cap while they run (realrun.transient's clock logs). This runs one prefill at a time through
the harness's own path (its KV encoded for the wire and dropped: no transfer, no join, no decode), per method and
prompt length in --tokens: first one to warm (compiles, cuDNN plans), then --repeats back to back ("sustained": the
GPU kept busy, as a saturated pipeline's prefills) and --repeats each after --rest-s idle ("rested"). Columns: set
(model:layers), method, tokens, mode, rep, prefill_s (forward, start to end), total_s (to the KV encoded), unix_s
(the host's clock at its end: to line up with a GPU clock log). Nothing here reads a measured trace.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

from .probes import parse_sets, probe_device, write_rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m realrun.prefillcal", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--smoke", action="store_true", help="CPU plumbing check: tiny model, interpreter")
    ap.add_argument("--sets", default="llama-3.1-8b:32", help="model:layers;...")
    ap.add_argument("--methods", nargs="+", default=["baseline", "hack"])
    ap.add_argument("--tokens", nargs="+", type=int, default=[1024, 2048, 4096, 8192, 12288, 16384])
    ap.add_argument("--repeats", type=int, default=4)
    ap.add_argument("--rest-s", type=float, default=1.0)
    a = ap.parse_args(argv)
    dev = probe_device("prefillcal", a.smoke)
    if dev is None:
        return 2
    from .harness import GIB, Harness, RunConfig, _Req
    from .model import RandomLlama, model_shape
    from .workload import Request

    sets = parse_sets(a.sets)
    tokens, repeats, rest_s = a.tokens, a.repeats, a.rest_s
    if a.smoke:
        sets, tokens, repeats, rest_s = [("tiny", 1)], [40, 90], 1, 0.01
    rows: list[dict] = []
    a.out.parent.mkdir(parents=True, exist_ok=True)
    rid = 0
    for model_name, layers in sets:
        shape = model_shape(model_name, layers)
        model = RandomLlama(shape, dev, seed=1, max_positions=max(tokens) + 8)
        for method in a.methods:
            cfg = RunConfig(
                method=method,
                link_gbps=10000.0,
                kv_capacity_bytes=64 * GIB,
                max_decode_batch=1,
                max_total_tokens=max(tokens) + 8,
                seed=1,
            )
            h = Harness(model, cfg, role="prefill")
            h.t0 = time.perf_counter()
            try:
                for p in tokens:
                    for mode, n in (("warm", 1), ("sustained", repeats), ("rested", repeats)):
                        for rep in range(n):
                            if mode == "rested":
                                time.sleep(rest_s)
                            r = _Req(Request(rid, 0.0, p, 1))
                            rid += 1
                            h.prefill([r])
                            r.send = None
                            rows.append(
                                dict(
                                    set=f"{model_name}:{layers}",
                                    method=method,
                                    tokens=p,
                                    mode=mode,
                                    rep=rep,
                                    prefill_s=r.t["prefill_end_s"] - r.t["prefill_start_s"],
                                    total_s=r.t["quantize_end_s"] - r.t["prefill_start_s"],
                                    unix_s=time.time(),
                                )
                            )
                    mine = [x for x in rows if x["method"] == method and x["tokens"] == p]
                    sus = sorted(x["prefill_s"] for x in mine if x["mode"] == "sustained")
                    res = sorted(x["prefill_s"] for x in mine if x["mode"] == "rested")
                    print(
                        f"{model_name}:{layers} {method} {p}: sustained {sus[len(sus) // 2] * 1e3:.1f} ms, "
                        f"rested {res[len(res) // 2] * 1e3:.1f} ms",
                        flush=True,
                    )
                    write_rows(a.out, rows)
            finally:
                h.close()
        del model
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    write_rows(a.out, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
