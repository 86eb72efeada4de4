"""Step-by-step speed experiments (launch configs and kernel variants) at the headline shapes.

    python -m kernels_calibration.experiments --out DIR

Each row: what was varied, the time, and a correctness check of that very configuration against
FP32 attention over the dequantized cache (rel_err; HACK's own Q/P rounding gives ~1e-2).
The findings and the predictions made before each run are in NOTES.md.
"""
from __future__ import annotations

import argparse
import csv
import itertools
import sys
from pathlib import Path

import torch

from .kernels.dequant_attn_decode import dequantize_cache
from .measure import measure_decode, measure_prefill

B, HQ, HKV, D = 8, 64, 8, 128


def _check(ctx: int, pi: int, cfgs: list[dict], mode: str = "hack", use_se: bool = True,
           rqe: bool = True) -> list[float]:
    from .kernels.hack_attn_decode import hack_attn_decode
    from .kernels.kv_cache import build_cache

    gen = torch.Generator(device="cuda").manual_seed(5)
    k = torch.randn(B, HKV, ctx, D, device="cuda", generator=gen, dtype=torch.float16)
    v = torch.randn(B, HKV, ctx, D, device="cuda", generator=gen, dtype=torch.float16)
    q = torch.randn(B, HQ, D, device="cuda", generator=gen, dtype=torch.float16)
    lens = torch.full((B,), ctx - 7, dtype=torch.int32, device="cuda")
    cache = build_cache(k, v, lens, pi, 2, rqe=rqe)
    kd, vd = dequantize_cache(cache)
    n = ctx - 7
    ref = torch.nn.functional.scaled_dot_product_attention(
        q[:, :, None].float(), kd[:, :, :n].float(), vd[:, :, :n].float(), enable_gqa=True)[:, :, 0]
    errs = []
    for cfg in cfgs:
        try:
            out = hack_attn_decode(q, cache, use_se=use_se, mode=mode, **cfg).float()
            errs.append(float((out - ref).norm() / ref.norm()))
        except Exception as exc:  # a config that does not compile is reported, not fatal
            print(f"    check {cfg} failed: {type(exc).__name__}: {str(exc)[:300]}", flush=True)
            errs.append(float("nan"))
    return errs


def _print_registers() -> None:
    """Registers and spills of the Gluon kernels launched so far (gluon_decode.LAST_KERNEL)."""
    from .kernels import gluon_decode as gd

    for key, k in gd.LAST_KERNEL.items():
        print(f"registers {key}: n_regs {k.n_regs}, n_spills {k.n_spills}", flush=True)


def run(out: Path, stage: int = 3) -> None:
    out.mkdir(parents=True, exist_ok=True)
    rows = []

    def add(r):
        rows.append(r)
        print(r, flush=True)

    def flush():
        with (out / "steps.csv").open("w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=list(rows[0]))
            w.writeheader()
            w.writerows(rows)

    def rec(tag, ms, errs=None):
        for i, m in enumerate(ms):
            if isinstance(errs, dict):   # keyed by the config's str (failed configs drop out of ms)
                e = errs.get(m.config, "")
            else:
                e = "" if errs is None else errs[i]
            add({"tag": tag, "kernel": m.kernel, "phase": m.phase, "context_len": m.context_len,
                 "partition": m.partition, "time_us": round(m.time_s * 1e6, 2), "config": m.config,
                 "rel_err": e if e == "" else round(e, 5)})
        flush()

    if stage == 11:  # fused dequant on the token-major Gluon kernel (gluon_decode.py; wgmma, no padding rows):
        # correctness at ragged lengths with the FP16 tail, then splits x tile size against the Triton kernel
        for ctx, pi in ((32768, 64), (32768, 128), (4096, 64), (1024, 64), (300, 64)):
            grid = [dict(gluon=True, prefetch=True)]
            for cfg, e in zip(grid, _check(ctx, pi, grid, mode="dequant")):
                add({"tag": "r31_gluon_check", "kernel": "dequant_fused", "phase": "decode", "context_len": ctx,
                     "partition": pi, "time_us": "", "config": str(cfg), "rel_err": round(e, 5)})
        flush()
        for ctx, pi in ((32768, 64), (32768, 128), (4096, 64), (1024, 64)):
            grid = [dict(gluon=True, prefetch=pf, splits=s) for s in (8, 16, 33, 44, 64) for pf in (True, False)]
            grid += [{}]
            rec(f"r31_gluon_pi{pi}", measure_decode(("dequant_fused",), B, ctx, HQ, HKV, D, pi,
                                                    configs={"dequant_fused": grid}, return_all=True))
            if pi == 64:
                rec("r31_ref", measure_decode(("torch_sdpa_fp16",), B, ctx, HQ, HKV, D, 64))
        return
    if stage == 25:  # fused dequant on the Gluon mma kernel with a register cap (run 52: 255 registers, 8
        # programs per SM; offline at 168: +4 % loop instructions, 12 per SM; at 128: +10 %, 16 per SM)
        grid = [dict(gluon=True), dict(gluon=True, maxnreg=168), dict(gluon=True, maxnreg=168, splits=24),
                dict(gluon=True, maxnreg=128), dict(gluon=True, maxnreg=128, splits=16)]
        for cfg, e in zip(grid, _check(32768, 64, grid, mode="dequant")):
            add({"tag": "r53_check", "kernel": "dequant_fused", "phase": "decode", "context_len": 32768,
                 "partition": 64, "time_us": "", "config": str(cfg), "rel_err": round(e, 5)})
        flush()
        for ctx in (32768, 8192):
            rec("r53_dequant_cap", measure_decode(("dequant_fused",), B, ctx, HQ, HKV, D, 64,
                                                  configs={"dequant_fused": grid}, return_all=True))
        rec("r53_ref", measure_decode(("torch_sdpa_fp16",), B, 32768, HQ, HKV, D, 64))
        return
    if stage == 24:  # launches for Nsight Compute (no timing): 3 HACK decode steps on the Gluon default at
        # 32K, batch 8, then 3 fused-dequant calls; ncu picks one launch by name (see NOTES, session 6)
        from .kernels.hack_attn_decode import hack_attn_decode
        from .kernels.kv_cache import build_cache

        gen = torch.Generator(device="cuda").manual_seed(3)
        k = torch.randn(B, HKV, 32768 + 64, D, device="cuda", generator=gen, dtype=torch.float16)
        cache = build_cache(k, k, torch.full((B,), 32768, dtype=torch.int32, device="cuda"), 64, 2, rqe=True)
        q = torch.randn(B, HQ, D, device="cuda", generator=gen, dtype=torch.float16)
        for mode in ("hack", "dequant"):
            for _ in range(3):
                hack_attn_decode(q, cache, mode=mode, max_len=32769)
            torch.cuda.synchronize()
        print("stage 24 done", flush=True)
        return
    if stage == 23:  # where the Gluon path's extra host time goes (run 49: +49 us per call at batch 4, 4K)
        import time

        from .kernels import gluon_decode as gd
        from .kernels import hack_attn_decode as had
        from .kernels.kv_cache import build_cache

        b, hq, ctx = 4, 64, 4096
        gen = torch.Generator(device="cuda").manual_seed(3)
        k = torch.randn(b, HKV, ctx + 64, D, device="cuda", generator=gen, dtype=torch.float16)
        cache = build_cache(k, k, torch.full((b,), ctx, dtype=torch.int32, device="cuda"), 64, 2, rqe=True)
        q = torch.randn(b, hq, D, device="cuda", generator=gen, dtype=torch.float16)
        op = torch.empty((b * hq, 24, D), dtype=torch.float32, device="cuda")
        lsep = torch.empty((b * hq, 24), dtype=torch.float32, device="cuda")
        consts = dict(G=8, D=D, PI=64, HAS_TAIL=True, USE_SE=True, UNROLL=1, PREFETCH=1)
        a = (q, cache.k_codes, cache.k_min, cache.k_scale, cache.k_sum, cache.v_codes, cache.v_min, cache.v_scale,
             cache.v_sum, cache.v_tail, cache.lens, op, lsep, 0.1, HKV, cache.shape[2], cache.v_min.shape[2], 192, 22)
        pa = lambda: a  # noqa: E731
        cases = {
            "full default (gluon)": lambda: had.hack_attn_decode(q, cache, max_len=ctx + 1),
            "full gluon=False": lambda: had.hack_attn_decode(q, cache, max_len=ctx + 1, gluon=False),
            "gluon fn, splits given": lambda: gd.hack_attn_decode_gluon(q, cache, splits=22, max_len=ctx + 1),
            "raw gluon launch": lambda: gd._hack_mma_kernel[(b * HKV, 22)](*a, **consts, maxnreg=168, num_warps=1),
            "raw gluon launch, no maxnreg": lambda: gd._hack_mma_kernel[(b * HKV, 22)](*a, **consts, num_warps=1),
            "run_split_decode, no kernel": lambda: had.run_split_decode(lambda o, l_: None, q, 22),
            "wave_splits": lambda: gd.wave_splits(b, HKV, ctx + 1, gd._hack_mma_kernel, pa, consts,
                                                  options={"maxnreg": 168}),
            "gluon_hack_applies": lambda: had.gluon_hack_applies(q, cache, ctx + 1),
            "torch.empty x3": lambda: (torch.empty((b * hq, 22, D), dtype=torch.float32, device="cuda"),
                                       torch.empty((b * hq, 22), dtype=torch.float32, device="cuda"),
                                       torch.empty((b, hq, D), dtype=q.dtype, device="cuda")),
        }
        for name, fn in cases.items():
            for _ in range(5):
                fn()
            torch.cuda.synchronize()
            best = []
            for rep in range(5):
                t0 = time.perf_counter()
                for _ in range(100):
                    fn()
                best.append((time.perf_counter() - t0) / 100)
                torch.cuda.synchronize()
            add({"tag": "r50_host_parts", "kernel": name, "phase": "decode", "context_len": ctx, "partition": 64,
                 "time_us": round(min(best) * 1e6, 2), "config": "", "rel_err": f"median {sorted(best)[2] * 1e6:.1f}"})
        flush()
        return
    if stage == 22:  # host cost per decode call (the realrun harness is host-bound at 32 layers): launch-side
        # microseconds of append_token + hack_attn_decode, the Gluon default against the row-packed kernel
        import time

        from .kernels.hack_attn_decode import hack_attn_decode
        from .kernels.kv_cache import append_token, build_cache

        for b, hq, ctx in ((4, 64, 4096), (4, 32, 4096), (8, 64, 32768)):
            gen = torch.Generator(device="cuda").manual_seed(3)
            k = torch.randn(b, HKV, ctx + 64, D, device="cuda", generator=gen, dtype=torch.float16)
            lens = torch.full((b,), ctx, dtype=torch.int32, device="cuda")
            cache = build_cache(k, k, lens, 64, 2, rqe=True)
            q = torch.randn(b, hq, D, device="cuda", generator=gen, dtype=torch.float16)
            kn = torch.randn(b, HKV, D, device="cuda", generator=gen, dtype=torch.float16)
            for cfg in ({}, {"gluon": False}):
                for _ in range(3):
                    hack_attn_decode(q, append_token(cache, kn, kn), max_len=ctx + 1, **cfg)
                torch.cuda.synchronize()
                n = 200
                t0 = time.perf_counter()
                for _ in range(n):
                    hack_attn_decode(q, append_token(cache, kn, kn), max_len=ctx + 1, **cfg)
                host = (time.perf_counter() - t0) / n
                torch.cuda.synchronize()
                wall = (time.perf_counter() - t0) / n
                add({"tag": "r49_host", "kernel": f"hack b{b} hq{hq}", "phase": "decode", "context_len": ctx,
                     "partition": 64, "time_us": round(wall * 1e6, 2), "config": str(cfg),
                     "rel_err": f"host {host * 1e6:.1f} us per call"})
        flush()
        return
    def hack_check(tag, ctx, cfgs, se, rqe=None):
        """Rows tagged {tag}_check_se{se}[_rqe{rqe}]: each HACK config's error against the reference
        (rqe None: the cache with the FP16 tail, no suffix)."""
        for cfg, e in zip(cfgs, _check(ctx, 64, cfgs, mode="hack", use_se=se, rqe=rqe is not False)):
            add({"tag": f"{tag}_check_se{int(se)}" + ("" if rqe is None else f"_rqe{int(rqe)}"), "kernel": "hack",
                 "phase": "decode", "context_len": ctx, "partition": 64, "time_us": "", "config": str(cfg),
                 "rel_err": round(e, 5)})

    def hack_check_tail_se(tag, cfgs):
        """Stages 27 and 29: hack_check without SE and without the FP16 tail (the paths a V change touches
        that gluon_hack_sweep's checks do not)."""
        for ctx, se, rqe in ((32768, False, True), (1000, False, False), (1000, True, False), (32768, True, False)):
            hack_check(tag, ctx, cfgs, se, rqe)

    def gluon(**kw):
        return dict(gluon=True, **kw)

    def gluon_hack_sweep(tag, grid, few, ctx_grid, rp):
        """Stages 20-21: the Gluon HACK kernel's launch variants, checked against the reference (32K and
        ragged lengths, with and without SE), then timed at 32K (all three HACK kernels) and at 2K-8K;
        rp: the row-packed step ({}) timed beside them."""
        ref = [{}] if rp else []
        for ctx, se, cfgs in ((32768, True, grid), (300, True, grid), (32768, False, few), (1000, False, few)):
            hack_check(tag, ctx, cfgs, se)
        flush()
        rec(f"{tag}_hack_32k", measure_decode(("hack", "hack_no_se", "hack_no_rqe"), B, 32768, HQ, HKV, D, 64,
                                              configs={"hack": grid + ref, "hack_no_se": few + ref,
                                                       "hack_no_rqe": few + ref}, return_all=True))
        rec(f"{tag}_ref", measure_decode(("torch_sdpa_fp16",), B, 32768, HQ, HKV, D, 64))
        for ctx in (8192, 4096, 2048):
            rec(f"{tag}_hack_ctx", measure_decode(("hack",), B, ctx, HQ, HKV, D, 64, configs={"hack": ctx_grid},
                                                  return_all=True))
        _print_registers()

    if stage == 29:  # the softmax without the score-scaling pass and without the mask on full tiles (sfold:
        # offline 1,112 -> 1,072 loop instructions)
        g = gluon
        fold = g(sfold=True)
        hack_check_tail_se("r61", [g(), fold])
        gluon_hack_sweep("r61", [g(), fold], [g(), fold], [g(), fold], rp=False)
        rec("r61_hack_32k_again", measure_decode(("hack", "hack_no_se", "hack_no_rqe"), B, 32768, HQ, HKV, D, 64,
                                                 configs={k: [fold, g()] for k in ("hack", "hack_no_se", "hack_no_rqe")},
                                                 return_all=True))
        return
    if stage == 28:  # register caps again with the shorter V path (offline: 1,112 loop instructions at 168
        # registers / 12 programs per SM; 1,138 at 128 / 16 per SM; 1,191 at 96 / 20 per SM)
        g = gluon
        gluon_hack_sweep("r60", [g(), g(maxnreg=128), g(maxnreg=128, ring=3), g(maxnreg=96), g(maxnreg=96, ring=3)],
                         [g(), g(maxnreg=128)], [g(), g(maxnreg=128), g(maxnreg=128, ring=3)], rp=False)
        rec("r60_hack_32k_again", measure_decode(("hack",), B, 32768, HQ, HKV, D, 64,
                                                 configs={"hack": [g(maxnreg=128), g()]}, return_all=True))
        return
    if stage == 27:  # fewer V instructions in the Gluon HACK kernel: planes 1-2 unshifted (vun, -24 loop
        # instructions offline) and the V metadata by channel pairs (vpair, -15); both -39 of 1,151
        g = gluon
        both = g(vun=True, vpair=True)
        hack_check_tail_se("r57", [g(), both])
        gluon_hack_sweep("r57", [g(), g(vun=True), g(vpair=True), both, g(vun=True, vpair=True, ring=3)],
                         [g(), both], [g(), both, g(vun=True, vpair=True, ring=3)], rp=False)
        rec("r57_hack_32k_again", measure_decode(("hack",), B, 32768, HQ, HKV, D, 64,
                                                 configs={"hack": [both, g()]}, return_all=True))
        return
    if stage == 26:  # the K code bytes through a shared-memory ring by cp.async (run 54's stall sampling:
        # 26 % of the samples wait on the first use of the tile's code loads despite the L1 prefetch)
        def g(ring, p=1, r=168):
            return dict(gluon=True, ring=ring, prefetch=p, maxnreg=r)

        gluon_hack_sweep("r55", [dict(gluon=True), g(2), g(3), g(4), g(3, 0), g(3, 2), g(3, 1, 128), g(2, 1, 128)],
                         [dict(gluon=True), g(2), g(3)], [dict(gluon=True), g(2), g(3), g(3, 1, 128)], rp=False)
        return
    if stage == 21:  # run 44's best (prefetch 1, 168 registers: 87.6 us) against deeper caps (96: 20 programs
        # per SM, offline +10 % loop instructions) and the metadata prefetch under a cap
        def g(p, r):
            return dict(gluon=True, prefetch=p, maxnreg=r)

        gluon_hack_sweep("r45", [g(1, 168), g(2, 168), g(1, 160), g(2, 128), g(1, 96), g(0, 96), g(0, 128)],
                         [g(1, 168), g(1, 128), g(1, 96), g(0, 128)],
                         [g(1, 168), g(0, 128), g(1, 96), dict(gluon=True)], rp=False)
        return
    if stage == 20:  # the Gluon HACK kernel: register caps, an L1 prefetch of the next tile, two tiles per
        # iteration (offline: 168/180/182 registers, +0.4 % instructions for the prefetch); crossover with the
        # row-packed step ({}) at 2K-8K
        few = [dict(gluon=True), dict(gluon=True, prefetch=1), dict(gluon=True, maxnreg=128)]
        gluon_hack_sweep("r44", [dict(gluon=True), dict(gluon=True, prefetch=1), dict(gluon=True, prefetch=2),
                                 dict(gluon=True, unroll=2), dict(gluon=True, maxnreg=128),
                                 dict(gluon=True, maxnreg=160), dict(gluon=True, prefetch=1, maxnreg=168),
                                 dict(gluon=True, prefetch=1, maxnreg=128)], few, few + [{}], rp=True)
        return
    if stage in (18, 19):  # the Gluon HACK kernel with one wave of programs by default (wave_splits); 19: 32K only
        quick_check = stage == 19

        for ctx, se in (((32768, False),) if quick_check else ((32768, True), (32768, False), (300, True))):
            for cfg, e in zip([dict(gluon=True)], _check(ctx, 64, [dict(gluon=True)], mode="hack", use_se=se)):
                add({"tag": f"r41_hack_check_se{int(se)}", "kernel": "hack", "phase": "decode", "context_len": ctx,
                     "partition": 64, "time_us": "", "config": str(cfg), "rel_err": round(e, 5)})
        flush()
        for ctx in ((32768,) if quick_check else (32768, 8192)):
            rec("r41_hack_gluon_wave", measure_decode(("hack", "hack_no_se", "hack_no_rqe"), B, ctx, HQ, HKV, D, 64,
                                                      configs={k: [dict(gluon=True), {}] for k in
                                                               ("hack", "hack_no_se", "hack_no_rqe")},
                                                      return_all=True))
        rec("r41_ref", measure_decode(("torch_sdpa_fp16",), B, 32768, HQ, HKV, D, 64))
        _print_registers()
        return
    if stage == 17:  # the Gluon HACK kernel's split counts (waves of one-warp programs) at 32K and 8K
        for ctx in (32768, 8192):
            grid = [dict(gluon=True, splits=s) for s in (8, 12, 16, 24, 33, 48, 64, 96)]
            rec("r40_hack_gluon_splits", measure_decode(("hack", "hack_no_se"), B, ctx, HQ, HKV, D, 64,
                                                        configs={"hack": grid, "hack_no_se": grid},
                                                        return_all=True))
        _print_registers()
        return
    if stage == 16:  # HACK decode on the one-warp Gluon mma kernel vs the row-packed Triton kernel
        for ctx, pi in ((32768, 64), (1024, 64), (300, 64)):
            for se in (True, False):
                grid = [dict(gluon=True), {}]
                for cfg, e in zip(grid, _check(ctx, pi, grid, mode="hack", use_se=se)):
                    add({"tag": f"r39_hack_check_se{int(se)}", "kernel": "hack", "phase": "decode", "context_len": ctx,
                         "partition": pi, "time_us": "", "config": str(cfg), "rel_err": round(e, 5)})
        flush()
        for ctx in (32768, 16384, 4096, 1024):
            grid = [dict(gluon=True, splits=s) for s in (16, 33, 64)] + [{}]
            rec("r39_hack_gluon", measure_decode(("hack", "hack_no_se", "hack_no_rqe"), B, ctx, HQ, HKV, D, 64,
                                                 configs={k: grid for k in ("hack", "hack_no_se", "hack_no_rqe")},
                                                 return_all=True))
            rec("r39_ref", measure_decode(("torch_sdpa_fp16",), B, ctx, HQ, HKV, D, 64))
        return
    if stage == 15:  # Gluon fused dequant, one warp per program on mma.sync (operands in registers)
        grid = [dict(gluon=True, kernel="mma", block_n=64, ldasm=True), dict(gluon=True, kernel="mma", block_n=32)]
        for ctx, pi in ((32768, 64), (32768, 128), (1024, 64), (300, 64), (300, 128)):
            for cfg, e in zip(grid, _check(ctx, pi, grid, mode="dequant")):
                add({"tag": "r36_mma_check", "kernel": "dequant_fused", "phase": "decode", "context_len": ctx,
                     "partition": pi, "time_us": "", "config": str(cfg), "rel_err": round(e, 5)})
        flush()
        for ctx, pi in ((32768, 64), (32768, 128), (4096, 64), (1024, 64)):
            grid = [dict(gluon=True, kernel="mma", block_n=64, ldasm=la, splits=s) for la in (True, False)
                    for s in (16, 33)]
            rec(f"r36_mma_pi{pi}", measure_decode(("dequant_fused",), B, ctx, HQ, HKV, D, pi,
                                                  configs={"dequant_fused": grid + [{}]}, return_all=True))
            if pi == 64:
                rec("r36_ref", measure_decode(("torch_sdpa_fp16",), B, ctx, HQ, HKV, D, 64))
        return
    if stage == 14:  # Gluon fused dequant: where the time goes (DIAG bit flags, wrong results, timing only)
        grid = [dict(gluon=True, splits=33, diag=d) for d in (0, 3, 4, 8, 12, 15, 16, 19, 31)] + [{}]
        rec("r34_gluon_diag", measure_decode(("dequant_fused",), B, 32768, HQ, HKV, D, 64,
                                            configs={"dequant_fused": grid}, return_all=True))
        return
    if stage == 13:  # row-packed HACK decode step: split counts around the default (33 at 32K, B 8)
        for ctx, pi in ((32768, 64), (32768, 128), (16384, 64)):
            grid = [dict(splits=s) for s in (20, 24, 28, 33, 37, 44, 52)]
            rec(f"r33_hack_splits_pi{pi}", measure_decode(("hack",), B, ctx, HQ, HKV, D, pi,
                                                          configs={"hack": grid}, return_all=True))
        return
    if stage == 12:  # Gluon fused dequant: V tile layout (bank conflicts of the V^T stores) and where the time goes
        grid = [dict(gluon=True, vlay=v) for v in (0, 1)]
        for ctx, pi in ((32768, 64), (300, 64)):
            for cfg, e in zip(grid, _check(ctx, pi, grid, mode="dequant")):
                add({"tag": "r32_gluon_check", "kernel": "dequant_fused", "phase": "decode", "context_len": ctx,
                     "partition": pi, "time_us": "", "config": str(cfg), "rel_err": round(e, 5)})
        flush()
        grid = [dict(gluon=True, vlay=v, splits=s) for v in (0, 1) for s in (8, 33, 64)]
        grid += [dict(gluon=True, vlay=1, splits=33, diag=d) for d in (1, 2, 3)] + [{}]
        rec("r32_gluon_pi64", measure_decode(("dequant_fused",), B, 32768, HQ, HKV, D, 64,
                                            configs={"dequant_fused": grid}, return_all=True))
        return
    if stage == 10:  # correctness of every fused-dequant config the bench tunes over (table-lookup dequant)
        from .bench import tuned_configs

        for ctx, pi in ((32768, 64), (32768, 32), (32768, 128), (4096, 64), (1024, 64)):
            grid = tuned_configs(ctx, pi)["dequant_fused"]
            for cfg, e in zip(grid, _check(ctx, pi, grid, mode="dequant")):
                add({"tag": "r26_dequant_check", "kernel": "dequant_fused", "phase": "decode", "context_len": ctx,
                     "partition": pi, "time_us": "", "config": str(cfg), "rel_err": round(e, 5)})
        flush()
        return
    if stage == 9:  # fused dequant with codes -> FP16 by the 1024 magic number (no I2F; offline -27 to -32 %
        # instructions per tile): warps x P.V form x register cap x splits, checked per config
        from .kernels.hack_attn_decode import default_splits

        dev = torch.device("cuda")
        for ctx, pi in ((32768, 64), (32768, 128), (32768, 32), (1024, 64)):
            s0 = default_splits(B, HKV, ctx + 1, max(pi, 128), dev)
            if (ctx, pi) == (32768, 64):
                grid = [dict(num_warps=w, v_split=vs, maxnreg=mr, splits=s) for w, vs, mr, s in (
                    (2, False, None, s0), (2, True, None, s0), (4, False, None, s0), (4, True, None, s0),
                    (4, True, 128, s0), (2, True, 168, s0), (4, False, 168, s0), (4, True, None, 2 * s0),
                    (2, True, None, 2 * s0), (4, True, 128, 2 * s0))]
                grid += [dict(num_warps=w, prefetch=True, splits=s0) for w in (2, 4)]
            else:
                grid = [dict(num_warps=w, v_split=vs, splits=s0) for w, vs in ((2, True), (4, True), (4, False))]
            errs = dict(zip(map(str, grid), _check(ctx, pi, grid, mode="dequant"))) if ctx == 32768 else None
            rec(f"r22_dequant_pi{pi}", measure_decode(("dequant_fused",), B, ctx, HQ, HKV, D, pi,
                                                      configs={"dequant_fused": grid}, return_all=True), errs)
            if pi == 64:
                rec("r22_ref", measure_decode(("torch_sdpa_fp16", "fp16_triton"), B, ctx, HQ, HKV, D, 64))
        return
    if stage == 8:  # row-scaled HACK prefill (offline: -17 % instructions at PI 64, -28 % at PI 128) vs the old one;
        # then the fused decode step
        for pi, bm, w in ((64, 64, 4), (128, 128, 8)):
            for rs in (False, True):
                rec(f"r_next_prefill_pi{pi}", measure_prefill(("hack",), 1, 16384, HQ, HKV, D, pi,
                                                              configs={"hack": dict(block_m=bm, num_warps=w,
                                                                                    row_scaled=rs)}))
        rec("r_next_fa", measure_prefill(("fp16_triton", "torch_sdpa_fp16"), 1, 16384, HQ, HKV, D, 64,
                                         configs={"fp16_triton": dict(block_m=128, block_n=64, num_warps=8,
                                                                      num_stages=2)}))
        # the fused decode step (append + attention in one launch, hack_decode_step) vs append_token + attention
        from .kernels.hack_attn_decode import default_splits

        for ctx in (1024, 4096, 32768):
            s0 = default_splits(B, HKV, ctx + 1, 128, torch.device("cuda"))
            grid = [dict(splits=s0, fused=False), dict(splits=s0, fused=True)]   # run 22: fused_append = fused
            if ctx <= 2048:
                grid += [dict(splits=s0, num_warps=2, fused=False), dict(splits=s0, num_warps=2, fused=True)]
            rec("r_next_fused_step", measure_decode(("hack", "torch_sdpa_fp16"), B, ctx, HQ, HKV, D, 64,
                                                    configs={"hack": grid}, return_all=True))
        return
    if stage == 7:  # row-packed kernel: register cap (occupancy) x warps x splits
        from .kernels.hack_attn_decode import default_splits

        dev = torch.device("cuda")
        for ctx, pi in ((32768, 64), (1024, 64), (32768, 128)):
            s0 = default_splits(B, HKV, ctx + 1, 2 * pi, dev)
            grid = [dict(row_packed=True, num_warps=w, maxnreg=mr, splits=s) for w, mr, s in
                    ((2, None, s0), (2, 168, s0), (2, 128, s0), (4, None, s0), (4, 128, s0), (4, 128, 2 * s0),
                     (4, 96, s0))]
            if ctx == 1024:
                grid = [g for g in grid if g["splits"] == s0] + [dict(row_packed=True, num_warps=4, maxnreg=128,
                                                                      splits=max(1, s0 // 2))]
            if pi == 128:
                grid = grid[:1] + grid[3:6]
            kinds = ("hack", "hack_no_se") if pi == 64 else ("hack",)
            for kind in kinds:
                errs = (dict(zip(map(str, grid), _check(ctx, pi, grid, use_se=kind == "hack")))
                        if ctx == 32768 else None)
                rec(f"r20_{kind}_pi{pi}", measure_decode((kind,), B, ctx, HQ, HKV, D, pi, configs={kind: grid},
                                                         return_all=True), errs)
            if pi == 64:
                rec("r20_ref", measure_decode(("torch_sdpa_fp16",), B, ctx, HQ, HKV, D, 64))
        return
    if stage == 6:  # row-packed kernel (hack_decode_rp.py): copies of the head group fill the padding rows
        from .kernels.hack_attn_decode import default_splits

        dev = torch.device("cuda")
        for ctx in (32768, 16384, 4096, 1024):
            for pi in ((64, 128, 32) if ctx == 32768 else (64,)):
                s_old = default_splits(B, HKV, ctx + 1, max(pi, 128), dev)
                s0 = default_splits(B, HKV, ctx + 1, 2 * pi, dev)
                base = [dict(num_warps=2 if pi >= 64 else 4, v_split=True, splits=s_old, row_packed=False)]
                ss = sorted({max(1, s0 // 2), s0, min(2 * s0, 128)})
                sts = (2, 3) if (ctx, pi) == (32768, 64) else (2,)
                ss = ss if pi == 64 else [s0]
                grid = base + [dict(row_packed=True, num_warps=w, num_stages=st, splits=s)
                               for w, st, s in itertools.product((2, 4), sts, ss)]
                errs = dict(zip(map(str, grid), _check(ctx, pi, grid))) if ctx >= 4096 else None
                rec(f"r16_hack_rp_pi{pi}", measure_decode(("hack",), B, ctx, HQ, HKV, D, pi, configs={"hack": grid},
                                                          return_all=True), errs)
                if pi == 64 and ctx in (32768, 1024):
                    gn = [dict(num_warps=2, v_split=True, splits=s_old, row_packed=False)] + [
                        dict(row_packed=True, num_warps=w, splits=s0) for w in (2, 4)]
                    rec("r16_hack_no_se_rp", measure_decode(("hack_no_se",), B, ctx, HQ, HKV, D, pi,
                                                            configs={"hack_no_se": gn}, return_all=True),
                        dict(zip(map(str, gn), _check(ctx, pi, gn, use_se=False))) if ctx == 32768 else None)
            rec("r16_ref", measure_decode(("torch_sdpa_fp16",), B, ctx, HQ, HKV, D, 64))
        return
    if stage == 5:  # token-major (transposed) kernel: wgmma + streamed loads; fused split combine
        from .kernels.hack_attn_decode import default_splits

        for ctx in (32768, 16384, 4096, 1024):
            for pi in ((64, 128) if ctx == 32768 else (64,)):
                s0 = default_splits(B, HKV, ctx + 1, pi, torch.device("cuda"))
                base = [dict(num_warps=2, v_split=True, row_packed=False,
                             splits=default_splits(B, HKV, ctx + 1, 128, torch.device("cuda")))]
                if ctx == 32768:
                    grid = base + [dict(transposed=True, num_warps=w, num_stages=st, splits=s)
                                   for w, st, s in itertools.product((4, 8), (2, 3), sorted({s0, 2 * s0}))]
                    # P.V token-major too (V^T rows read bytes d mod W), with and without the padding head
                    grid += [dict(transposed=True, v_side=0, splits=s0),
                             dict(transposed=True, v_side=0, pad_heads_to=8, splits=s0),
                             dict(transposed=True, v_side=0, pad_heads_to=8, num_warps=2, splits=s0)]
                else:
                    grid = base + [dict(transposed=True, splits=s) for s in sorted({max(1, s0 // 2), s0, 2 * s0})]
                grid.append(dict(transposed=True, splits=s0, fused_combine=False))
                errs = dict(zip(map(str, grid), _check(ctx, pi, grid))) if ctx >= 4096 else None
                rec(f"r9_hack_t_pi{pi}", measure_decode(("hack",), B, ctx, HQ, HKV, D, pi, configs={"hack": grid},
                                                         return_all=True), errs)
                if pi == 64 and ctx in (32768, 1024):
                    g = [dict(num_warps=4, v_split=True, row_packed=False)] + [dict(transposed=True, num_warps=w, splits=s)
                                                            for w in (4, 8) for s in sorted({s0, 2 * s0})]
                    rec("r9_dequant_t", measure_decode(("dequant_fused",), B, ctx, HQ, HKV, D, pi,
                                                       configs={"dequant_fused": g}, return_all=True),
                        dict(zip(map(str, g), _check(ctx, pi, g, mode="dequant"))) if ctx == 32768 else None)
                    gn = [dict(transposed=True, num_warps=4, splits=s0)]
                    rec("r9_hack_no_se_t", measure_decode(("hack_no_se",), B, ctx, HQ, HKV, D, pi,
                                                          configs={"hack_no_se": gn}, return_all=True),
                        dict(zip(map(str, gn), _check(ctx, pi, gn, use_se=False))) if ctx == 32768 else None)
            rec("r9_ref", measure_decode(("torch_sdpa_fp16",), B, ctx, HQ, HKV, D, 64))
        return
    if stage == 4:  # tiles of 128 tokens over PI = 64 / 32 blocks (split P per V block)
        for pi in (64, 32):
            grid = [dict(num_warps=w, splits=s, block_n=bn) for bn in (pi, 128) for w in (2, 4) for s in (33, 66)]
            rec(f"r4_hack_pi{pi}", measure_decode(("hack",), B, 32768, HQ, HKV, D, pi, configs={"hack": grid},
                                                  return_all=True), _check(32768, pi, grid))
        return
    if stage == 3:
        for pi in (64, 128):
            grid = [dict(num_warps=w, prefetch=pf, splits=s, block_n=pi) for pf, w, s in
                    itertools.product((True, False), (2, 4, 8), (36, 72))]
            rec(f"r3_hack_pi{pi}", measure_decode(("hack",), B, 32768, HQ, HKV, D, pi, configs={"hack": grid},
                                                  return_all=True), _check(32768, pi, grid))
        grid = [dict(num_warps=w, prefetch=pf, splits=s, block_n=64) for pf, w, s in
                itertools.product((True, False), (2, 4), (36, 72))]
        rec("r3_dequant_fused", measure_decode(("dequant_fused",), B, 32768, HQ, HKV, D, 64,
                                               configs={"dequant_fused": grid}, return_all=True),
            _check(32768, 64, grid, mode="dequant"))
        grid = [dict(num_warps=w, prefetch=pf, splits=s, block_n=64) for pf, w, s in
                itertools.product((True, False), (2, 4), (10, 20))]
        rec("r3_hack_1k", measure_decode(("hack",), B, 1024, HQ, HKV, D, 64, configs={"hack": grid},
                                         return_all=True))
        return
    # run 2 also varied blocks_per_iter (1, 2: an unrolled two-block loop, since removed; NOTES.md)
    grid = [dict(num_warps=w, splits=s, num_stages=3, block_n=64)
            for w, s in itertools.product((1, 2, 4), (18, 36))]
    rec("hack_pi64_grid", measure_decode(("hack",), B, 32768, HQ, HKV, D, 64, configs={"hack": grid},
                                         return_all=True), _check(32768, 64, grid))
    for pi in (128, 32):
        g2 = [dict(num_warps=w, splits=s, block_n=pi) for w, s in itertools.product((2, 4), (18, 36))]
        rec(f"hack_pi{pi}_grid", measure_decode(("hack",), B, 32768, HQ, HKV, D, pi, configs={"hack": g2},
                                                return_all=True), _check(32768, pi, g2))
    g3 = [dict(num_warps=w, splits=s, block_n=64) for w, s in itertools.product((2, 4), (18, 36))]
    rec("hack_no_se_sumrow", measure_decode(("hack_no_se",), B, 32768, HQ, HKV, D, 64, configs={"hack_no_se": g3},
                                            return_all=True), _check(32768, 64, g3, use_se=False))
    g4 = [dict(num_warps=w, splits=s, block_n=64) for w, s in itertools.product((2, 4, 8), (18, 36))]
    rec("dequant_fused_grid", measure_decode(("dequant_fused",), B, 32768, HQ, HKV, D, 64,
                                             configs={"dequant_fused": g4}, return_all=True),
        _check(32768, 64, g4, mode="dequant"))
    g5 = [dict(num_warps=w, splits=s, row_packed=False) for w, s in itertools.product((1, 2, 4), (5, 10, 16))]
    rec("hack_1k", measure_decode(("hack", "hack_no_se"), B, 1024, HQ, HKV, D, 64,
                                  configs={"hack": g5, "hack_no_se": g5[:3]}, return_all=True))
    rec("sdpa_1k", measure_decode(("torch_sdpa_fp16", "fp16_triton"), B, 1024, HQ, HKV, D, 64))
    rec("fp16_32k", measure_decode(("fp16_triton",), B, 32768, HQ, HKV, D, 64,
                                   configs={"fp16_triton": [dict(splits=s, num_warps=w) for s in (18, 36)
                                                            for w in (4, 8)]}, return_all=True))
    for pi in (64, 128):
        for bm, w in ((128, 8), (128, 4)) if pi == 128 else ((128, 8), (64, 4), (128, 4)):
            rec("hack_prefill", measure_prefill(("hack",), 1, 16384, HQ, HKV, D, pi,
                                                configs={"hack": dict(block_m=bm, num_warps=w)}))
    for cfg in (dict(block_m=128, block_n=64, num_warps=8, num_stages=2),
                dict(block_m=128, block_n=128, num_warps=8, num_stages=2),
                dict(block_m=128, block_n=64, num_warps=4, num_stages=3)):
        rec("fa_prefill", measure_prefill(("fp16_triton",), 1, 16384, HQ, HKV, D, 64, configs={"fp16_triton": cfg}))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--stage", type=int, default=3, help="2: launch-config grid (run 2); 3: prefetch (run 3); 4: 128-token tiles; "
                    "5: token-major kernel (run 9); 6: row-packed kernel (run 16); 7: its register cap (run 20); 8: row-scaled prefill and the fused decode step; 9: fused dequant without I2F; 10: every bench config of fused dequant checked; "
                    "Gluon kernels (gluon_decode.py, session 5): 11 warpgroup fused dequant; 12 its V layouts; 13 HACK split counts "
                    "(row-packed); 14 where the warpgroup kernel's time goes; 15 one-warp mma fused dequant; 16 one-warp HACK; "
                    "17 its split counts; 18/19 its one-wave default")
    args = ap.parse_args(argv)
    run(args.out, args.stage)
    return 0


if __name__ == "__main__":
    sys.exit(main())
