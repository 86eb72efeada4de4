"""Timing of every kernel at one shape, shared by the benchmark (bench.py) and the sweep (profile.py).

Method (the device notes' METHOD.md): warm up (compiles, autotune), then time. Decode steps are
captured in a CUDA graph that runs the step over `n_rot` independent input sets (so the data read
per replay is >= 256 MB, well over the 60 MB L2, as in a real model where each layer reads its own
cache) and the median replay time is divided by n_rot.  Prefill and GEMMs are long launches timed
with triton.testing.do_bench (median).  Inputs are random normal, never zeros.

A decode step for the quantized variants (hack*, dequant_*) includes appending the new token to
the 2-bit cache because that is part of what HACK's attn_decode does (HACK: decode_step, which fuses
the append into the attention launch up to 2K tokens; dequant_*: append_token, then attention); the
FP16/FP8 rows time attention only (their append is a plain copy of 2 * H_kv * D values).
"""

from __future__ import annotations

import datetime
import math
import os
import statistics
import subprocess
from dataclasses import dataclass, field

import torch
import triton

from .kernels import dispatch
from .kernels.attn_decode import fp_attn_decode, sdpa_decode, to_fp8
from .kernels.attn_prefill import fa_attn_prefill, prefill_flops
from .kernels.dequant_attn_decode import dequant_attn_decode, dequantize_bytes, dequantize_cache
from .kernels.hack_attn_decode import decode_step, hack_attn_decode
from .kernels.hack_attn_prefill import hack_attn_prefill
from .kernels.kv_cache import append_token, build_cache
from .kernels.launch import DequantDecodeConfig, FpDecodeConfig, HackDecodeConfig, PrefillConfig
from .kernels.quantize import quantize_bytes, quantize_k, quantize_v
from .kernels.split_k import default_splits

DECODE_KERNELS = (
    "hack",
    "hack_no_se",
    "hack_no_rqe",
    "fp16_triton",
    "torch_sdpa_fp16",
    "dequant_fused",
    "dequant_unfused",
    "fp8",
)
# The Triton twins of the Hopper defaults (the row-packed HACK step, the Triton fused-dequant kernel):
# the rows derive.py scales for GPUs where the Gluon kernels do not run.  Each is its base kernel with
# the Triton kernel pinned.
TRITON_TWINS = {
    "hack_triton": ("hack", "row_packed"),
    "hack_no_se_triton": ("hack_no_se", "row_packed"),
    "hack_no_rqe_triton": ("hack_no_rqe", "row_packed"),
    "dequant_fused_triton": ("dequant_fused", "triton"),
}
PREFILL_KERNELS = ("hack", "fp16_triton", "torch_sdpa_fp16")
ROT_BYTES = 256 * 2**20


def provenance() -> dict:
    info = {
        "torch": torch.__version__,
        "triton": triton.__version__,
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    }
    if torch.cuda.is_available():
        info["gpu_name"] = torch.cuda.get_device_name()
        try:
            info["driver"] = subprocess.run(
                ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                capture_output=True,
                text=True,
                timeout=20,
            ).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            info["driver"] = "unknown"
    rev = os.environ.get("HACKSIM_GIT_REV")
    if not rev:
        try:
            rev = subprocess.run(
                ["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10
            ).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            rev = ""
    info["git_rev"] = rev or "unknown"
    info["cpu"] = cpu_name()
    return info


def cpu_name() -> str:
    """The host CPU's model and logical CPU count ("unknown" where /proc/cpuinfo is not there): host-bound phases
    (a Python engine loop, launch-bound prefills) move with it from one machine to the next."""
    try:
        text = open("/proc/cpuinfo").read()
    except OSError:
        return "unknown"
    models = [ln.split(":", 1)[1].strip() for ln in text.splitlines() if ln.startswith("model name")]
    return f"{models[0]} x {len(models)}" if models else "unknown"


def time_events_s(fn, reps: int, warmup: int = 2) -> float:
    """Median seconds of fn() called `reps` times one after another from Python, CUDA events around each
    call (the host's launches included where they outlast the GPU work), after `warmup` calls."""
    for _ in range(warmup):
        fn()
    ev = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(reps)]
    for a, b in ev:
        a.record()
        fn()
        b.record()
    torch.cuda.synchronize()
    return statistics.median(a.elapsed_time(b) for a, b in ev) / 1e3


def time_graph(step, n_rot: int, replays: int = 30) -> float:
    """Median seconds of one step; step(i) runs on input set i."""
    for i in range(n_rot):  # compile + warm
        step(i)
    torch.cuda.synchronize()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for i in range(n_rot):
            step(i)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for i in range(n_rot):
            step(i)
    for _ in range(3):
        graph.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(replays):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        graph.replay()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) * 1e-3)
    times.sort()
    return times[len(times) // 2] / n_rot


def time_bench(fn, warmup_ms: int = 25, rep_ms: int = 100) -> float:
    return triton.testing.do_bench(fn, warmup=warmup_ms, rep=rep_ms, return_mode="median") * 1e-3


@dataclass
class Measurement:
    kernel: str
    phase: str
    batch: int
    context_len: int
    q_heads: int
    kv_heads: int
    head_dim: int
    partition: int
    bits: int
    time_s: float
    bytes_moved: float
    flops: float
    units: float
    config: str = ""
    extra: dict = field(default_factory=dict)

    def row(self, peaks: dict) -> dict:
        t = self.time_s
        int_ops = self.kernel.startswith("hack")
        rate = peaks["int8_tops"] if int_ops else peaks["fp16_tflops"]
        return {
            "kernel": self.kernel,
            "phase": self.phase,
            "batch": self.batch,
            "context_len": self.context_len,
            "q_heads": self.q_heads,
            "kv_heads": self.kv_heads,
            "head_dim": self.head_dim,
            "partition": self.partition,
            "bits": self.bits,
            "time_us": round(t * 1e6, 3),
            "achieved_gbps": round(self.bytes_moved / t / 1e9, 1),
            "achieved_tflops": round(self.flops / t / 1e12, 2),
            "byte_floor_us": round(self.bytes_moved / (peaks["memory_gbps"] * 1e9) * 1e6, 3),
            "compute_floor_us": round(self.flops / (rate * 1e12) * 1e6, 3),
            "units": self.units,
            "config": self.config,
            **self.extra,
        }


def _n_rot(bytes_per_set: float, cap: int = 64) -> int:
    return int(max(1, min(cap, math.ceil(ROT_BYTES / max(bytes_per_set, 1)))))


def hack_cache_bytes(batch: int, ctx: int, kv_heads: int, d: int, pi: int) -> float:
    sb = 1 if 3 * pi <= 255 else 2
    per_tok = 2 * d * 2 / 8 + (d / pi) * (4 + sb) + d * (4 + sb) / pi
    return batch * kv_heads * ctx * per_tok


def measure_decode(
    kernels,
    batch: int,
    ctx: int,
    q_heads: int = 64,
    kv_heads: int = 8,
    d: int = 128,
    pi: int = 64,
    configs: dict | None = None,
    seed: int = 0,
    return_all: bool = False,
    device: str = "cuda",
) -> list[Measurement]:
    """Time the named decode kernels at one shape (every request holds ctx tokens before the step).
    configs: kernel -> a dict of the kernel family's LaunchConfig fields (kernels/launch.py), or a list
    of them (the fastest is kept, or all with return_all)."""
    configs = configs or {}
    dev = device
    gen = torch.Generator(device=dev).manual_seed(seed)
    cap = triton.cdiv(ctx + 1, pi) * pi
    fp16_set = 2 * batch * kv_heads * cap * d * 2
    n16 = _n_rot(fp16_set, 16)
    nq = _n_rot(hack_cache_bytes(batch, cap, kv_heads, d, pi), 64)
    kvs = [
        (
            torch.randn(batch, kv_heads, cap, d, device=dev, generator=gen, dtype=torch.float16),
            torch.randn(batch, kv_heads, cap, d, device=dev, generator=gen, dtype=torch.float16),
        )
        for _ in range(n16)
    ]
    lens = torch.full((batch,), ctx, dtype=torch.int32, device=dev)
    lens1 = lens + 1
    q = torch.randn(batch, q_heads, d, device=dev, generator=gen, dtype=torch.float16)
    kn = torch.randn(batch, kv_heads, d, device=dev, generator=gen, dtype=torch.float16)
    vn = torch.randn_like(kn)
    flops = 4.0 * batch * (ctx + 1) * q_heads * d
    units = float(batch * (ctx + 1) * kv_heads * d * 2)
    qo_bytes = 4.0 * batch * q_heads * d
    shape = dict(phase="decode", batch=batch, context_len=ctx, q_heads=q_heads, kv_heads=kv_heads, head_dim=d)
    out: list[Measurement] = []
    caches: dict[bool, list] = {}

    def get_caches(rqe: bool):
        if rqe not in caches:
            lst = []
            for i in range(nq):
                k, v = kvs[i % n16]
                lst.append(build_cache(k, v, lens, pi, 2, rqe=rqe, stochastic=True, seed=seed + i))
            caches[rqe] = lst
        return caches[rqe]

    def _decode_one(name, cfg):
        if name == "torch_sdpa_fp16":
            ks = [(k[:, :, : ctx + 1], v[:, :, : ctx + 1]) for k, v in kvs]
            t = time_graph(lambda i: sdpa_decode(q, *ks[i % n16]), n16)
            return Measurement(
                name,
                **shape,
                partition=0,
                bits=16,
                time_s=t,
                bytes_moved=2 * units + qo_bytes,
                flops=flops,
                units=units,
                config="sdpa",
            )
        elif name in ("fp16_triton", "fp8"):
            if name == "fp8":
                sets = [(*to_fp8(k), *to_fp8(v)) for k, v in kvs]
                sets = [(a, c, s1, s2) for a, s1, c, s2 in sets]
                eb = 1
            else:
                sets = [(k, v, 1.0, 1.0) for k, v in kvs]
                eb = 2
            cfg.setdefault("splits", default_splits(batch, kv_heads, ctx + 1, cfg.get("block_n", 64), q.device))
            fcfg = FpDecodeConfig(**cfg)

            def step(i, sets=sets, fcfg=fcfg):
                k, v, ks_, vs_ = sets[i % n16]
                fp_attn_decode(q, k, v, lens1, ks_, vs_, max_len=ctx + 1, config=fcfg)

            t = time_graph(step, n16)
            return Measurement(
                name,
                **shape,
                partition=0,
                bits=8 * eb,
                time_s=t,
                bytes_moved=eb * units + qo_bytes,
                flops=flops,
                units=units,
                config=str(cfg),
            )
        else:
            base, pinned = TRITON_TWINS.get(name, (name, None))
            if pinned:
                cfg["kernel"] = pinned
            rqe = base != "hack_no_rqe"
            cs = get_caches(rqe)
            use_se = base != "hack_no_se"
            cb = hack_cache_bytes(batch, ctx + 1, kv_heads, d, pi)
            if base.startswith("dequant"):
                if base == "dequant_unfused":
                    cfg["kernel"] = "unfused"
                    scratch = (
                        torch.empty(batch, kv_heads, cap, d, device=dev, dtype=torch.float16),
                        torch.empty(batch, kv_heads, cap, d, device=dev, dtype=torch.float16),
                    )
                else:
                    scratch = None
                if cfg.get("kernel") != "gluon":  # the split count recorded in the row's config
                    cfg.setdefault("splits", default_splits(batch, kv_heads, ctx + 1, max(pi, 128), q.device))
                dcfg = DequantDecodeConfig(**cfg)

                def step(i, cs=cs, dcfg=dcfg, scratch=scratch):
                    c = append_token(cs[i % nq], kn, vn)
                    dequant_attn_decode(q, c, max_len=ctx + 1, config=dcfg, scratch=scratch)

                t = time_graph(step, nq)
                bm = (
                    dequantize_bytes(int(units), pi) + 2 * units + qo_bytes
                    if base == "dequant_unfused"
                    else cb + qo_bytes
                )
            else:  # the HACK decode step: append fused into the attention launch up to 2K tokens
                if dispatch.hack_kernel(q, cs[0], ctx + 1, HackDecodeConfig(**cfg)) != "gluon":
                    # the Gluon kernel keeps its one-wave default; the Triton ones record the heuristic's
                    cfg.setdefault("splits", default_splits(batch, kv_heads, ctx + 1, max(pi, 128), q.device))
                hcfg = HackDecodeConfig(**cfg)

                def step(i, cs=cs, hcfg=hcfg, use_se=use_se):
                    decode_step(q, cs[i % nq], kn, vn, use_se=use_se, max_len=ctx + 1, config=hcfg)

                t = time_graph(step, nq)
                bm = cb + qo_bytes
            return Measurement(
                name, **shape, partition=pi, bits=2, time_s=t, bytes_moved=bm, flops=flops, units=units, config=str(cfg)
            )

    for name in kernels:
        tried = configs.get(name, [{}])
        tried = tried if isinstance(tried, list) else [tried]
        best = None
        for cfg in tried:
            try:
                m = _decode_one(name, dict(cfg))
            except Exception as exc:  # a config that fails to compile or launch is skipped, and said so
                print(f"    config {name} {cfg} failed: {type(exc).__name__}: {str(exc)[:200]}", flush=True)
                continue
            if return_all:
                out.append(m)
            if best is None or m.time_s < best.time_s:
                best = m
            if len(tried) > 1:
                print(f"    tune {name} ctx={ctx} {m.config}: {m.time_s * 1e6:.1f} us", flush=True)
        if not return_all and best is not None:
            out.append(best)
    del kvs, caches
    if dev == "cuda":
        torch.cuda.empty_cache()
    return out


def measure_prefill(
    kernels,
    batch: int,
    seq: int,
    q_heads: int = 64,
    kv_heads: int = 8,
    d: int = 128,
    pi: int = 64,
    configs: dict | None = None,
    seed: int = 0,
) -> list[Measurement]:
    configs = configs or {}
    dev = "cuda"
    gen = torch.Generator(device=dev).manual_seed(seed)
    q = torch.randn(batch, q_heads, seq, d, device=dev, generator=gen, dtype=torch.float16)
    k = torch.randn(batch, kv_heads, seq, d, device=dev, generator=gen, dtype=torch.float16)
    v = torch.randn(batch, kv_heads, seq, d, device=dev, generator=gen, dtype=torch.float16)
    flops = prefill_flops([seq] * batch, q_heads, d)
    shape = dict(phase="prefill", batch=batch, context_len=seq, q_heads=q_heads, kv_heads=kv_heads, head_dim=d)
    out = []
    for name in kernels:
        cfg = dict(configs.get(name, {}))
        if name == "torch_sdpa_fp16":
            t = time_bench(
                lambda: torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
            )
            bm = 2.0 * (2 * q.numel() + 2 * k.numel())
            out.append(
                Measurement(
                    name,
                    **shape,
                    partition=0,
                    bits=16,
                    time_s=t,
                    bytes_moved=bm,
                    flops=flops,
                    units=flops,
                    config="sdpa",
                )
            )
        elif name == "fp16_triton":
            t = time_bench(lambda: fa_attn_prefill(q, k, v, config=PrefillConfig(**cfg)))
            bm = 2.0 * (2 * q.numel() + 2 * k.numel())
            out.append(
                Measurement(
                    name,
                    **shape,
                    partition=0,
                    bits=16,
                    time_s=t,
                    bytes_moved=bm,
                    flops=flops,
                    units=flops,
                    config=str(cfg),
                )
            )
        elif name in ("hack", "hack_no_se"):
            cache = build_cache(
                k,
                v,
                torch.full((batch,), seq, dtype=torch.int32, device=dev),
                pi,
                2,
                rqe=False,
                stochastic=True,
                seed=seed,
            )
            t = time_bench(lambda: hack_attn_prefill(q, cache, use_se=name == "hack", config=PrefillConfig(**cfg)))
            bm = 2.0 * 2 * q.numel() + hack_cache_bytes(batch, seq, kv_heads, d, pi)
            out.append(
                Measurement(
                    name,
                    **shape,
                    partition=pi,
                    bits=2,
                    time_s=t,
                    bytes_moved=bm,
                    flops=flops,
                    units=flops,
                    config=str(cfg),
                )
            )
    return out


def measure_quant(batch: int, seq: int, kv_heads: int = 8, d: int = 128, pi: int = 64) -> list[Measurement]:
    """quantize.kv (K rows + V blocks, stochastic) and dequantize.kv (cache -> FP16 in memory)."""
    dev = "cuda"
    k = torch.randn(batch, kv_heads, seq, d, device=dev, dtype=torch.float16)
    v = torch.randn_like(k)
    lens = torch.full((batch,), seq, dtype=torch.int32, device=dev)
    n = 2 * k.numel()
    shape = dict(batch=batch, context_len=seq, q_heads=0, kv_heads=kv_heads, head_dim=d, partition=pi, bits=2)
    tq = time_bench(lambda: (quantize_k(k, pi, 2, True, 1), quantize_v(v, lens, pi, 2, True, 2)))
    cache = build_cache(k, v, lens, pi, 2, rqe=True, stochastic=True)
    scratch = (torch.empty_like(k), torch.empty_like(v))
    td = time_bench(lambda: dequantize_cache(cache, scratch))
    return [
        Measurement(
            "quantize",
            phase="quantize",
            **shape,
            time_s=tq,
            bytes_moved=quantize_bytes(n, pi),
            flops=0.0,
            units=float(n),
        ),
        Measurement(
            "dequantize",
            phase="dequantize",
            **shape,
            time_s=td,
            bytes_moved=dequantize_bytes(n, pi),
            flops=0.0,
            units=float(n),
        ),
    ]


def measure_peaks() -> dict:
    """Device copy GB/s (read + write), FP16/INT8/FP8 GEMM rates at 8192^3, launch overhead."""
    dev = "cuda"
    n = 8192
    src = torch.randn(2**28, device=dev, dtype=torch.float32)  # 1 GiB
    dst = torch.empty_like(src)
    t_copy = time_bench(lambda: dst.copy_(src))
    mem_gbps = 2 * src.numel() * 4 / t_copy / 1e9
    del src, dst
    a = torch.randn(n, n, device=dev, dtype=torch.float16)
    b = torch.randn(n, n, device=dev, dtype=torch.float16)
    t16 = time_bench(lambda: a @ b)
    ai = torch.randint(-128, 127, (n, n), device=dev, dtype=torch.int8)
    bi = torch.randint(-128, 127, (n, n), device=dev, dtype=torch.int8)
    int8 = None
    for bb in (bi, bi.t().contiguous().t()):  # row-major and column-major B (cuBLASLt IMMA wants the latter)
        try:
            t8 = time_bench(lambda: torch._int_mm(ai, bb))
            int8 = max(int8 or 0.0, 2 * n**3 / t8 / 1e12)
        except RuntimeError:
            pass
    try:
        a8 = a.to(torch.float8_e4m3fn)
        b8 = b.to(torch.float8_e4m3fn).t().contiguous().t()
        one = torch.ones((), device=dev)
        tf8 = time_bench(lambda: torch._scaled_mm(a8, b8, scale_a=one, scale_b=one, out_dtype=torch.float16))
        fp8 = 2 * n**3 / tf8 / 1e12
    except (RuntimeError, TypeError):
        fp8 = None
    x = torch.zeros(1, device=dev)
    t_launch = time_bench(lambda: x.add_(1.0), warmup_ms=10, rep_ms=50)
    return {
        "memory_gbps": mem_gbps,
        "fp16_tflops": 2 * n**3 / t16 / 1e12,
        "int8_tops": int8,
        "fp8_tflops": fp8,
        "launch_overhead_s": t_launch,
    }


def ragged_lens(batch: int, max_len: int) -> list[int]:
    """Lengths spread evenly over [max_len / 4, max_len - 1] (the new token makes the longest max_len): a
    continuous batch's contexts under one CUDA-graph bucket whose kernels are sized by max_len."""
    lo = max(1, max_len // 4)
    if batch == 1:
        return [max_len - 1]
    return [int(round(lo + (max_len - 1 - lo) * i / (batch - 1))) for i in range(batch)]


def measure_append_attend(
    batch: int,
    max_len: int,
    q_heads: int,
    kv_heads: int,
    d: int = 128,
    pi: int = 64,
    ragged: bool = True,
    seed: int = 0,
    device: str = "cuda",
) -> Measurement:
    """A real engine's HACK decode attention (realrun/kvformats.Hack.decode_attention): append_token,
    then hack_attn_decode at max_len (the graph bucket: it sizes the split-K grid) over a cache of
    max_len tokens' capacity, the lengths `ragged_lens` (ragged) or all max_len - 1.  Timed as measure_decode
    times decode steps; units are the KV elements attended, sum_b (len_b + 1) * H_kv * D * 2, as
    decode_attn.* counts them.  Row kernel "hack_append_attend", phase "decode_ragged" (ragged) or
    "decode_append" (equal lengths): evidence beside the profile's fits, not fitted."""
    dev = device
    gen = torch.Generator(device=dev).manual_seed(seed)
    lens_list = ragged_lens(batch, max_len) if ragged else [max_len - 1] * batch
    cap = triton.cdiv(max_len, pi) * pi
    lens = torch.tensor(lens_list, dtype=torch.int32, device=dev)
    nq = _n_rot(hack_cache_bytes(batch, cap, kv_heads, d, pi), 64)
    caches = []
    for i in range(nq):
        k = torch.randn(batch, kv_heads, cap, d, device=dev, generator=gen, dtype=torch.float16)
        caches.append(build_cache(k, torch.randn_like(k), lens, pi, 2, rqe=True, stochastic=True, seed=seed + i))
        del k
    q = torch.randn(batch, q_heads, d, device=dev, generator=gen, dtype=torch.float16)
    kn = torch.randn(batch, kv_heads, d, device=dev, generator=gen, dtype=torch.float16)
    vn = torch.randn_like(kn)

    def step(i):
        c = append_token(caches[i % nq], kn, vn, stochastic=True, seed=seed + 2)
        hack_attn_decode(q, c, max_len=max_len)

    t = time_graph(step, nq)
    attended = sum(n + 1 for n in lens_list)
    units = float(attended * kv_heads * d * 2)
    del caches
    if dev == "cuda":
        torch.cuda.empty_cache()
    return Measurement(
        "hack_append_attend",
        phase="decode_ragged" if ragged else "decode_append",
        batch=batch,
        context_len=max_len,
        q_heads=q_heads,
        kv_heads=kv_heads,
        head_dim=d,
        partition=pi,
        bits=2,
        time_s=t,
        bytes_moved=hack_cache_bytes(batch, attended / batch, kv_heads, d, pi),
        flops=4.0 * attended * q_heads * d,
        units=units,
        extra={"mean_len": round(attended / batch - 1, 1)},
    )
