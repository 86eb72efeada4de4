"""python -m realrun --method {baseline,kvquant,hack}[...] --model M --layers N --rate R[...] --link-gbps G
--requests N --seed S --kv-capacity-gib C --out DIR [--device cpu|cuda]

With one method and one rate the trace folder is --out itself.  Several methods and rates may be
given: they run one after another in this process on the same model (weights built once), one
trace folder each under --out, named <label>_<method>_r<rate> (label: <model>-L<layers>_<G>gbps).
"""

from __future__ import annotations

import argparse
import os
import sys


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m realrun", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--method", nargs="+", required=True, choices=["baseline", "kvquant", "hack"])
    ap.add_argument("--model", default="llama-3.1-8b", choices=["llama-3.1-8b", "llama-3.1-70b", "tiny"])
    ap.add_argument("--layers", type=int, default=None, help="layers (default: the preset's)")
    ap.add_argument("--rate", type=float, nargs="+", required=True, help="Poisson arrival rate(s), requests/s")
    ap.add_argument("--link-gbps", type=float, required=True)
    ap.add_argument("--requests", type=int, default=40)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--kv-capacity-gib", type=float, default=16.0, help="decode KV capacity (admission)")
    ap.add_argument("--out", required=True)
    ap.add_argument("--device", default=None, choices=["cpu", "cuda"])
    ap.add_argument("--prompt-range", type=int, nargs=2, default=[1024, 8192], metavar=("MIN", "MAX"))
    ap.add_argument("--output-range", type=int, nargs=2, default=[16, 128], metavar=("MIN", "MAX"))
    ap.add_argument("--prefill-max-batch-requests", type=int, default=1)
    ap.add_argument("--prefill-max-batch-tokens", type=int, default=16384)
    ap.add_argument("--max-decode-batch", type=int, default=32)
    ap.add_argument("--hack-prefill", default="kernel", choices=["kernel", "sdpa"])
    ap.add_argument("--chunk-mib", type=float, default=4.0, help="link chunk size")
    ap.add_argument("--no-warmup", action="store_true")
    ap.add_argument("--time-limit-s", type=float, default=600.0, help="abort a run that does not drain")
    ap.add_argument("--keep-going", action="store_true", help="log a method's error and go on with the next")
    ap.add_argument(
        "--decode-mode",
        default="graphs",
        choices=["graphs", "eager"],
        help="graphs: the whole decode step replayed as a CUDA graph per (batch, context) bucket; "
        "eager: launch by launch",
    )
    ap.add_argument(
        "--prefill-host-memory-gib",
        type=float,
        default=64.0,
        help="prefill back-pressure: KV prefilled and not yet transferred may hold this much",
    )
    ap.add_argument("--label", default=None, help="trace folder prefix (default <model>-L<layers>_<link>gbps)")
    ap.add_argument(
        "--placement",
        default="shared_gpu",
        choices=["shared_gpu", "separate"],
        help="shared_gpu: prefill and decode take turns on one GPU in one process; separate: a "
        "prefill process and a decode process on --devices, KV over a paced TCP socket",
    )
    ap.add_argument(
        "--devices",
        nargs=2,
        default=["cuda:0", "cuda:1"],
        metavar=("PREFILL", "DECODE"),
        help="separate: the prefill and the decode device (the same one twice: a one-GPU dry run)",
    )
    ap.add_argument("--stream-layers", action="store_true", help="separate: send each layer's KV as it is made")
    ap.add_argument(
        "--repeats",
        type=int,
        default=1,
        help="shared_gpu: record each (method, rate) this many times back to back, same workload and seed "
        "(folders <label>_<method>_r<rate>_rep<k>): the run-to-run spread",
    )
    ap.add_argument(
        "--pin-threads",
        action="store_true",
        help="shared_gpu: the loop and the link thread each on a CPU of its own (the last two this process may "
        "use) for every run; default: wherever the OS puts them",
    )
    ap.add_argument(
        "--step-times",
        action="store_true",
        help="shared_gpu: time each decode iteration's parts (host issue; KV placement and the step graph on the GPU "
        "by CUDA events) into steps.csv beside the trace",
    )
    a = ap.parse_args(argv)
    if a.repeats < 1:
        ap.error("--repeats must be >= 1")
    if a.repeats > 1 and a.placement == "separate":
        ap.error("--repeats is for --placement shared_gpu")
    if a.pin_threads and a.placement == "separate":
        ap.error("--pin-threads is for --placement shared_gpu")
    if a.pin_threads and len(os.sched_getaffinity(0)) < 2:
        ap.error(f"--pin-threads needs two CPUs; this process may use {len(os.sched_getaffinity(0))}")
    import torch  # after argparse: --help stays fast

    device = a.device or ("cuda" if torch.cuda.is_available() else "cpu")
    if a.step_times and (device == "cpu" or a.placement == "separate"):
        ap.error("--step-times times the GPU by CUDA events: placement shared_gpu on a CUDA device")
    if device == "cpu":
        os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton is imported
    if a.placement == "separate":
        from pathlib import Path

        from .separate import run_separate

        devices = tuple("cpu" if device == "cpu" else d for d in a.devices)
        label = a.label or f"{a.model}-L{a.layers or ''}_{a.link_gbps:g}gbps_separate"
        for method in a.method:
            for rate in a.rate:
                out = Path(a.out) if len(a.method) * len(a.rate) == 1 else Path(a.out) / f"{label}_{method}_r{rate:g}"
                run_separate(
                    a.model,
                    a.layers,
                    method,
                    rate,
                    a.link_gbps,
                    a.requests,
                    a.seed,
                    a.kv_capacity_gib,
                    out,
                    devices=devices,
                    prompt_range=tuple(a.prompt_range),
                    output_range=tuple(a.output_range),
                    prefill_max_batch_requests=a.prefill_max_batch_requests,
                    prefill_max_batch_tokens=a.prefill_max_batch_tokens,
                    max_decode_batch=a.max_decode_batch,
                    decode_mode=a.decode_mode,
                    prefill_host_memory_gib=a.prefill_host_memory_gib,
                    stream_layers=a.stream_layers,
                    chunk_bytes=int(a.chunk_mib * (1 << 20)),
                    time_limit_s=a.time_limit_s,
                    warmup=not a.no_warmup and device == "cuda",
                    log=lambda s: print(s, flush=True),
                )
        return 0
    from .runner import run_set

    written = run_set(
        a.model,
        a.layers,
        a.method,
        a.rate,
        a.link_gbps,
        a.requests,
        a.seed,
        a.kv_capacity_gib,
        a.out,
        device=device,
        prefill_max_batch_requests=a.prefill_max_batch_requests,
        prefill_max_batch_tokens=a.prefill_max_batch_tokens,
        max_decode_batch=a.max_decode_batch,
        prompt_range=tuple(a.prompt_range),
        output_range=tuple(a.output_range),
        hack_prefill=a.hack_prefill,
        do_warmup=not a.no_warmup and device == "cuda",
        chunk_bytes=int(a.chunk_mib * (1 << 20)),
        time_limit_s=a.time_limit_s,
        keep_going=a.keep_going,
        decode_mode=a.decode_mode,
        prefill_host_memory_gib=a.prefill_host_memory_gib,
        label=a.label,
        log=lambda s: print(s, flush=True),
        repeats=a.repeats,
        step_times=a.step_times,
        pin_threads=a.pin_threads,
    )
    return 0 if len(written) == len(a.method) * len(a.rate) * a.repeats else 1


if __name__ == "__main__":
    sys.exit(main())
