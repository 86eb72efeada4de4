"""HACK decode attention: one new token per request over a ragged 2-bit quantized KV cache.

Split-K (flash-decoding): grid (B * H_kv, splits); each program takes the G = H_q / H_kv query heads
of one KV head (GQA, padded to 16 rows for the tensor-core dots) over `tokens_per_split` tokens and
writes a partial (O, log2-sum-exp); a small combine kernel merges the splits.  The split owning the
end of the cache also multiplies the FP16 V tail (RQE).  mode "hack": homomorphic INT8 dots with
correction terms (hack_core.py); mode "dequant": the same loop with codes dequantized to FP16 in
registers meeting FP16 Q and P (KIVI-style fused dequantize-then-attend baseline; the FP16 values
come from a per-partition lookup table, common.dequant_lut, with no integer-to-float conversion).

The default HACK kernel is now the row-packed one (hack_decode_rp.py: the head group's copies fill
the padding rows; 135.5 vs 194 us at 32K on the H200, NOTES.md sessions 3-4); this file's head-major
kernel runs for mode "dequant", for shapes the row-packed kernel does not take, and on request
(row_packed=False).  Its loop forms (all tested; NOTES.md):
  * plain: tiles of block_n = max(PI, 128) tokens; K needs no token blocking (its partitions lie
    along head_dim); P is split into PI-column chunks, one P.V product per V block (v_split=True),
    or masked per block against the whole V tile (v_split=False);
  * prefetch=True: one V block per iteration, next block's bytes and metadata loaded into registers
    ahead (slower on the H200: 255 registers).
Without SE (use_se=False) the K and V code sums come from the tensor cores: a padding query row
(and P row) of ones makes its dot row the code sum.

Work of one decode step (per KV element visited: Q.K and P.V for G query heads):
  flops = 4 * G * sum(lens) * H_kv * D;  bytes = cache.nbytes_visited() + Q and O.
"""
from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from .common import interpreting, online_softmax, use_asm
from .hack_core import (cache_ptrs, dequant_pv, dequant_pv_t, dequant_pv_tile, dequant_scores, dequant_scores_t,
                        flash_state, hack_pv_block, hack_pv_t, hack_pv_tile, hack_scores, hack_scores_t, load_block,
                        load_q_groups, q_quantize, quantize_p, split_cols, split_prologue, store_partials, tail_pv)
from .hack_decode_rp import hack_attn_decode_rp, hack_decode_step, launch_defaults, row_packed_supported
from .kv_cache import QuantKVCache, append_token, dequantize_cache_ref


# Longest context (tokens after the append) at which decode_step fuses the append into the attention
# launch: at 1K the fused step saves a launch (16.3 vs 17.3 us, run 22); at 4K and 32K its last
# split, which appends, is the slowest program (45.2 vs 36.5 us, 164.1 vs 137.3 us).
FUSED_STEP_MAX_LEN = 2048
FUSED_STEP_WARPS = 2      # run 22 at 1K: 16.3 us with 2 warps, 17.7 with 4
# Fused dequant above DEQUANT_LONG tokens: 2 warps, and at PI <= 64 a cap of 168 registers (6
# programs per SM; runs 22-23: PI 64 160.6 vs 174.1 us, PI 32 178.2 vs 195.3; PI 128: none, 143.0
# vs 157.4 us with the cap)
DEQUANT_LONG = 2048
DEQUANT_MAXNREG = 168


@triton.jit
def _quant_decode_kernel(Q, KC, KMN, KSC, KSM, VC, VMN, VSC, VSM, VT, LENS, OP, LSEP,
                         qk_scale, HKV, LMAX, NBLK, TPS, NSPLIT,
                         G: tl.constexpr, G_PAD: tl.constexpr, D: tl.constexpr, PI: tl.constexpr,
                         USE_SE: tl.constexpr, HAS_TAIL: tl.constexpr, MODE: tl.constexpr,
                         USE_ASM: tl.constexpr, PREFETCH: tl.constexpr, SUMROW: tl.constexpr,
                         BN: tl.constexpr, VSPLIT: tl.constexpr):
    W: tl.constexpr = D // 4
    NP: tl.constexpr = D // PI
    GPP: tl.constexpr = PI // W
    bh, split, L, LV, start, end, g, gmask, qrow = split_prologue(LENS, HKV, TPS, G, G_PAD, PI, HAS_TAIL)
    q0, q1, q2, q3 = load_q_groups(Q, qrow, gmask, W, D)    # [G_PAD, W] each, channel group c = c*W..
    kc, kmn, ksc, ksm, vc, vmn, vsc, vsm = cache_ptrs(KC, KMN, KSC, KSM, VC, VMN, VSC, VSM, bh, LMAX, NBLK, W, NP, D)
    m_i, l_i, o0, o1, o2, o3 = flash_state(G_PAD, W)
    if MODE == 0:
        qi0, qi1, qi2, qi3, a0, a1, a2, a3, b0, b1, b2, b3, c0, c1, c2, c3 = q_quantize(
            q0, q1, q2, q3, qk_scale, PI, GPP)
        if not USE_SE:
            if SUMROW >= 0:  # a padding query row of ones: its dot row is the K code sum
                one = (g == SUMROW)[:, None]
                qi0 = tl.where(one, 1, qi0).to(tl.int8)
                qi1 = tl.where(one, 1, qi1).to(tl.int8)
                qi2 = tl.where(one, 1, qi2).to(tl.int8)
                qi3 = tl.where(one, 1, qi3).to(tl.int8)
    else:
        qh0 = (q0 * qk_scale).to(tl.float16)
        qh1 = (q1 * qk_scale).to(tl.float16)
        qh2 = (q2 * qk_scale).to(tl.float16)
        qh3 = (q3 * qk_scale).to(tl.float16)
    if PREFETCH:
        tok = start + tl.arange(0, PI)
        tmask = tok < end
        kb, vb, km, ks, vm, vs = load_block(
            kc, kmn, ksc, ksm, vc, vmn, vsc, vsm, tok, tmask, start // PI, start < end, W, D, NP, USE_SE)
        for s0 in range(start, end, PI):
            tokn = tok + PI
            tmaskn = tokn < end
            nkb, nvb, nkm, nks, nvm, nvs = load_block(
                kc, kmn, ksc, ksm, vc, vmn, vsc, vsm, tokn, tmaskn, s0 // PI + 1, s0 + PI < end, W, D, NP,
                USE_SE)
            if MODE == 0:
                s = hack_scores_t(qi0, qi1, qi2, qi3, a0, a1, a2, a3, b0, b1, b2, b3, c0, c1, c2, c3,
                                  kb, km, ks, GPP, USE_SE, USE_ASM, SUMROW)
            else:
                s = dequant_scores_t(qh0, qh1, qh2, qh3, kb, km, GPP, USE_ASM)
            s = tl.where(tmask[None, :], s, float("-inf"))
            m_new, alpha, p = online_softmax(s, m_i)
            if MODE == 0:
                o0, o1, o2, o3, lsum = hack_pv_t(o0, o1, o2, o3, p, alpha, vb, vm, vs, USE_SE, USE_ASM, SUMROW)
            else:
                o0, o1, o2, o3 = dequant_pv_t(o0, o1, o2, o3, p.to(tl.float16), alpha, vb, vm, USE_ASM)
                lsum = tl.sum(p, 1)
            l_i = l_i * alpha + lsum
            m_i = m_new
            kb, vb, km, ks, vm, vs = nkb, nvb, nkm, nks, nvm, nvs
            tok = tokn
            tmask = tmaskn
    else:
        # Tiles of BN tokens (BN = PI, 2 PI or 4 PI): K needs no token blocking (its partitions lie
        # along D); P is split into PI-column chunks, one P.V product per V block.
        ones = tl.full([G_PAD], 1.0, tl.float32)
        for s0 in range(start, end, BN):
            tok = s0 + tl.arange(0, BN)
            tmask = tok < end
            if MODE == 0:
                s = hack_scores(qi0, qi1, qi2, qi3, a0, a1, a2, a3, b0, b1, b2, b3, c0, c1, c2, c3,
                                kc, kmn, ksc, ksm, tok, tmask, W, NP, GPP, USE_SE, USE_ASM, SUMROW)
            else:
                s = dequant_scores(qh0, qh1, qh2, qh3, kc, kmn, ksc, tok, tmask, W, NP, GPP, USE_ASM)
            s = tl.where(tmask[None, :], s, float("-inf"))
            m_new, alpha, p = online_softmax(s, m_i)
            blk = s0 // PI
            t0 = s0 + tl.arange(0, PI)
            if MODE == 0 and not VSPLIT:
                p8, usum = quantize_p(p, USE_SE, SUMROW)
                lsum = usum * (1.0 / 255.0)
                o0, o1, o2, o3 = hack_pv_tile(o0, o1, o2, o3, p8, alpha, vc, vmn, vsc, vsm, tok, tmask, blk, end,
                                              W, D, PI, BN // PI, USE_SE, USE_ASM, SUMROW)
            elif MODE == 1 and not VSPLIT:
                lsum = tl.sum(p, 1)
                o0, o1, o2, o3 = dequant_pv_tile(o0, o1, o2, o3, p.to(tl.float16), alpha, vc, vmn, vsc, tok, tmask,
                                                 blk, end, W, D, PI, BN // PI, USE_ASM)
            elif MODE == 0:
                p8, usum = quantize_p(p, USE_SE, SUMROW)
                lsum = usum * (1.0 / 255.0)
                if BN == PI:
                    o0, o1, o2, o3 = hack_pv_block(o0, o1, o2, o3, p8, usum, alpha, vc, vmn, vsc, vsm, t0,
                                                   t0 < end, blk, True, W, D, USE_SE, USE_ASM, SUMROW)
                elif BN == 2 * PI:
                    pa, pb = split_cols(p8)
                    o0, o1, o2, o3 = hack_pv_block(o0, o1, o2, o3, pa, tl.sum(pa.to(tl.float32), 1) + 128.0 * PI,
                                                   alpha, vc, vmn, vsc, vsm, t0, t0 < end, blk, True,
                                                   W, D, USE_SE, USE_ASM, SUMROW)
                    o0, o1, o2, o3 = hack_pv_block(o0, o1, o2, o3, pb, tl.sum(pb.to(tl.float32), 1) + 128.0 * PI,
                                                   ones, vc, vmn, vsc, vsm, t0 + PI, t0 + PI < end, blk + 1,
                                                   s0 + PI < end, W, D, USE_SE, USE_ASM, SUMROW)
                else:
                    pl, pr = split_cols(p8)
                    pa, pb = split_cols(pl)
                    pc, pd = split_cols(pr)
                    o0, o1, o2, o3 = hack_pv_block(o0, o1, o2, o3, pa, tl.sum(pa.to(tl.float32), 1) + 128.0 * PI,
                                                   alpha, vc, vmn, vsc, vsm, t0, t0 < end, blk, True,
                                                   W, D, USE_SE, USE_ASM, SUMROW)
                    o0, o1, o2, o3 = hack_pv_block(o0, o1, o2, o3, pb, tl.sum(pb.to(tl.float32), 1) + 128.0 * PI,
                                                   ones, vc, vmn, vsc, vsm, t0 + PI, t0 + PI < end, blk + 1,
                                                   s0 + PI < end, W, D, USE_SE, USE_ASM, SUMROW)
                    o0, o1, o2, o3 = hack_pv_block(o0, o1, o2, o3, pc, tl.sum(pc.to(tl.float32), 1) + 128.0 * PI,
                                                   ones, vc, vmn, vsc, vsm, t0 + 2 * PI, t0 + 2 * PI < end,
                                                   blk + 2, s0 + 2 * PI < end, W, D, USE_SE, USE_ASM, SUMROW)
                    o0, o1, o2, o3 = hack_pv_block(o0, o1, o2, o3, pd, tl.sum(pd.to(tl.float32), 1) + 128.0 * PI,
                                                   ones, vc, vmn, vsc, vsm, t0 + 3 * PI, t0 + 3 * PI < end,
                                                   blk + 3, s0 + 3 * PI < end, W, D, USE_SE, USE_ASM, SUMROW)
            else:
                p16 = p.to(tl.float16)
                lsum = tl.sum(p, 1)
                if BN == PI:
                    o0, o1, o2, o3 = dequant_pv(o0, o1, o2, o3, p16, alpha, vc, vmn, vsc, t0, t0 < end, blk,
                                                W, D, USE_ASM)
                elif BN == 2 * PI:
                    pa, pb = split_cols(p16)
                    o0, o1, o2, o3 = dequant_pv(o0, o1, o2, o3, pa, alpha, vc, vmn, vsc, t0, t0 < end, blk,
                                                W, D, USE_ASM)
                    o0, o1, o2, o3 = dequant_pv(o0, o1, o2, o3, pb, ones, vc, vmn, vsc, t0 + PI, t0 + PI < end,
                                                blk + 1, W, D, USE_ASM, s0 + PI < end)
                else:
                    pl, pr = split_cols(p16)
                    pa, pb = split_cols(pl)
                    pc, pd = split_cols(pr)
                    o0, o1, o2, o3 = dequant_pv(o0, o1, o2, o3, pa, alpha, vc, vmn, vsc, t0, t0 < end, blk,
                                                W, D, USE_ASM)
                    o0, o1, o2, o3 = dequant_pv(o0, o1, o2, o3, pb, ones, vc, vmn, vsc, t0 + PI, t0 + PI < end,
                                                blk + 1, W, D, USE_ASM, s0 + PI < end)
                    o0, o1, o2, o3 = dequant_pv(o0, o1, o2, o3, pc, ones, vc, vmn, vsc, t0 + 2 * PI,
                                                t0 + 2 * PI < end, blk + 2, W, D, USE_ASM, s0 + 2 * PI < end)
                    o0, o1, o2, o3 = dequant_pv(o0, o1, o2, o3, pd, ones, vc, vmn, vsc, t0 + 3 * PI,
                                                t0 + 3 * PI < end, blk + 3, W, D, USE_ASM, s0 + 3 * PI < end)
            l_i = l_i * alpha + lsum
            m_i = m_new
    if HAS_TAIL:
        # RQE: the last < PI tokens have quantized K but FP16 V; the last split multiplies them.
        if (split == NSPLIT - 1) & (L > LV):
            tok = LV + tl.arange(0, PI)
            tmask = tok < L
            if MODE == 0:
                s = hack_scores(qi0, qi1, qi2, qi3, a0, a1, a2, a3, b0, b1, b2, b3, c0, c1, c2, c3,
                                kc, kmn, ksc, ksm, tok, tmask, W, NP, GPP, USE_SE, USE_ASM, SUMROW)
            else:
                s = dequant_scores(qh0, qh1, qh2, qh3, kc, kmn, ksc, tok, tmask, W, NP, GPP, USE_ASM)
            s = tl.where(tmask[None, :], s, float("-inf"))
            m_new, alpha, p = online_softmax(s, m_i)
            o0, o1, o2, o3 = tail_pv(o0, o1, o2, o3, p.to(tl.float16), alpha, VT, bh, L - LV, PI, D, W)
            l_i = l_i * alpha + tl.sum(p, 1)
            m_i = m_new
    store_partials(OP, LSEP, qrow.to(tl.int64) * NSPLIT + split, gmask, o0, o1, o2, o3, l_i, m_i, D, W)


@triton.jit
def combine_splits_kernel(OP, LSEP, OUT, NSPLIT, D: tl.constexpr, S_PAD: tl.constexpr):
    # OP [R, NSPLIT, D] fp32 normalized partial outputs, LSEP [R, NSPLIT] log2-sum-exp; OUT [R, D]
    r = tl.program_id(0).to(tl.int64)
    s = tl.arange(0, S_PAD)
    smask = s < NSPLIT
    lse = tl.load(LSEP + r * NSPLIT + s, mask=smask, other=float("-inf"))
    mx = tl.max(lse, 0)
    mx = tl.where(mx == float("-inf"), 0.0, mx)
    w = tl.where(smask, tl.exp2(lse - mx), 0.0)
    d = tl.arange(0, D)
    o = tl.load(OP + (r * NSPLIT + s)[:, None] * D + d[None, :], mask=smask[:, None], other=0.0)
    out = tl.sum(w[:, None] * o, 0) / tl.maximum(tl.sum(w, 0), 1e-30)
    tl.store(OUT + r * D + d, out.to(OUT.dtype.element_ty))


_N_SM: dict[int, int] = {}


def default_splits(batch: int, kv_heads: int, max_len: int, block: int, device: torch.device) -> int:
    """~16 programs per SM (measured best at 32K, NOTES.md), but at least 2 tiles of work per split."""
    if device.type == "cuda":
        idx = device.index or 0
        if idx not in _N_SM:
            _N_SM[idx] = torch.cuda.get_device_properties(idx).multi_processor_count
        n_sm = _N_SM[idx]
    else:
        n_sm = 4
    want = min(triton.cdiv(16 * n_sm, batch * kv_heads), 64)  # > 64 splits: the combine costs more than it saves
    return max(1, min(want, triton.cdiv(max_len, 2 * block)))


_GLUON_DEVICE: dict[int, bool] = {}


def gluon_applies(q: torch.Tensor, cache: QuantKVCache) -> bool:
    """The Gluon fused-dequant kernel runs here: a Hopper (or newer) GPU, not the interpreter, and a
    shape it takes (gluon_decode.gluon_supported).  The device check is cached per device (it is on
    every decode call's host path)."""
    if not q.is_cuda or interpreting():
        return False
    idx = q.device.index if q.device.index is not None else torch.cuda.current_device()
    ok = _GLUON_DEVICE.get(idx)
    if ok is None:
        ok = torch.cuda.get_device_capability(idx)[0] >= 9
        if ok:
            try:
                from . import gluon_decode  # noqa: F401
            except ImportError:   # a Triton without Gluon (the kernels extra pins 3.6, which has it)
                ok = False
        _GLUON_DEVICE[idx] = ok
    if not ok:
        return False
    from .gluon_decode import gluon_supported

    return gluon_supported(q, cache)


def gluon_hack_applies(q: torch.Tensor, cache: QuantKVCache, max_len: int | None = None) -> bool:
    """The Gluon HACK kernel is the default decode kernel here: where the Gluon kernels run
    (gluon_applies), PI 64, and above FUSED_STEP_MAX_LEN tokens (below, the fused row-packed step of
    decode_step saves a launch; at 2K the two kernels are even: run 45, 17.0 vs 17.4 us)."""
    ml = cache.shape[2] if max_len is None else max_len
    if ml <= FUSED_STEP_MAX_LEN or not gluon_applies(q, cache):
        return False
    from .gluon_decode import hack_supported_gluon

    return hack_supported_gluon(q, cache)


def gluon_hack_default(q: torch.Tensor, cache: QuantKVCache, max_len: int | None = None, **opts) -> bool:
    """Whether hack_attn_decode(mode="hack", gluon=None, **opts) takes the Gluon kernel: it applies
    (gluon_hack_applies) and no Triton-only option is given (transposed, row_packed=True, prefetch,
    block_n, num_warps)."""
    if opts.get("transposed") or opts.get("row_packed") or any(
            opts.get(k) is not None for k in ("prefetch", "block_n", "num_warps")):
        return False
    return gluon_hack_applies(q, cache, max_len)


def run_split_decode(kernel_launch, q: torch.Tensor, splits: int) -> torch.Tensor:
    """Allocate partials, launch (callable taking OP, LSEP), combine. q [B, HQ, D]."""
    b, hq, d = q.shape
    op = torch.empty((b * hq, splits, d), dtype=torch.float32, device=q.device)
    lsep = torch.empty((b * hq, splits), dtype=torch.float32, device=q.device)
    kernel_launch(op, lsep)
    out = torch.empty((b, hq, d), dtype=q.dtype, device=q.device)
    combine_splits_kernel[(b * hq,)](op, lsep, out, splits, D=d, S_PAD=triton.next_power_of_2(splits),
                                     num_warps=4)
    return out


def hack_attn_decode(q: torch.Tensor, cache: QuantKVCache, use_se: bool = True, mode: str = "hack",
                     splits: int | None = None, max_len: int | None = None, num_warps: int | None = None,
                     num_stages: int = 3, prefetch: bool | int | None = None, block_n: int | None = None,
                     v_split: bool = True, transposed: bool = False, fused_combine: bool = False,
                     v_side: int = 1, pad_heads_to: int = 16, row_packed: bool | None = None,
                     maxnreg: int | None = None, gluon: bool | None = None, **gluon_kw) -> torch.Tensor:
    """q [B, HQ, D] fp16 (the new token's query, already appended to the cache) -> [B, HQ, D] fp16.

    max_len: an upper bound of lens (defaults to the capacity) that sizes the splits.
    transposed: the token-major kernel of hack_decode_t.py (PI 64 or 128; prefetch, block_n and
    v_split do not apply there); fused_combine=True merges the splits inside it (measured slower);
    v_side and pad_heads_to choose its P.V form and head padding (see hack_decode_t.py).
    row_packed: the row-packed kernel of hack_decode_rp.py (mode "hack", PI 32/64/128, head_dim 128,
    4-16 query heads per KV head; Q rounded per query head; prefetch, block_n, v_split do not apply).
    None (default): row-packed wherever it applies and no head-major-only option (prefetch, block_n,
    transposed) is asked for: it is the faster kernel on the H200 (NOTES.md, run 16).
    maxnreg: register cap per thread (occupancy; NOTES.md); row-packed kernel: None = 128 above 2K
    tokens, none below; mode "dequant": None = DEQUANT_MAXNREG above DEQUANT_LONG tokens at PI <= 64
    (and 2 warps); 0 = no cap.
    gluon: mode "hack": the one-warp Gluon HACK kernel (gluon_decode.py, PI 64, GQA 8, a Hopper GPU;
    gluon_kw unroll; prefetch its L1 prefetch, 0-2; maxnreg its register cap); None (default): that
    kernel above FUSED_STEP_MAX_LEN tokens unless a Triton-only option is given (gluon_hack_default),
    else the row-packed kernel;
    mode "dequant" on a token-major Gluon kernel of gluon_decode.py (PI 64/128, GQA 8, head_dim
    128, a Hopper GPU): gluon_kw's kernel "mma" (default: one warp, mma.sync, operands in registers;
    2.06x SDPA at 32K, run 36) or "wgmma"; block_n tokens per tile (64); prefetch: the wgmma kernel's
    shared-memory ring; num_warps, v_split, maxnreg do not apply.  None (default): the mma kernel
    wherever it applies and no Triton-only option (prefetch, block_n, transposed, num_warps, maxnreg)
    is given; False: the Triton kernel."""
    if row_packed and mode != "hack":   # before any dispatch: the same refusal on every device
        raise ValueError("the row-packed kernel computes HACK attention only (mode 'hack')")
    if gluon is None:
        if mode == "hack":
            gluon = gluon_hack_default(q, cache, max_len, transposed=transposed, row_packed=row_packed,
                                       prefetch=prefetch, block_n=block_n, num_warps=num_warps)
        else:
            gluon = (not (prefetch or transposed) and block_n is None and num_warps is None
                     and maxnreg is None and not gluon_kw and gluon_applies(q, cache))
    if gluon and mode == "hack":
        from .gluon_decode import hack_attn_decode_gluon

        if prefetch is not None:
            gluon_kw["prefetch"] = int(prefetch)
        return hack_attn_decode_gluon(q, cache, use_se=use_se, splits=splits, max_len=max_len, maxnreg=maxnreg,
                                      **gluon_kw)
    if gluon:
        from .gluon_decode import dequant_attn_decode_gluon

        gluon_kw.setdefault("kernel", "mma")
        return dequant_attn_decode_gluon(q, cache, splits=splits, max_len=max_len, block_n=block_n or 64,
                                         pipe=bool(prefetch), maxnreg=maxnreg, **gluon_kw)
    prefetch = bool(prefetch)
    if row_packed is None:
        row_packed = (mode == "hack" and not transposed and not prefetch and block_n is None
                      and row_packed_supported(q, cache))
    if row_packed:
        num_warps, maxnreg = launch_defaults(cache, max_len, num_warps, maxnreg)
        return hack_attn_decode_rp(q, cache, use_se=use_se, splits=splits, max_len=max_len, num_warps=num_warps,
                                   num_stages=num_stages, maxnreg=maxnreg)
    if transposed:
        from .hack_decode_t import hack_attn_decode_t

        return hack_attn_decode_t(q, cache, use_se=use_se, mode=mode, splits=splits, max_len=max_len,
                                  num_warps=num_warps or 4, num_stages=num_stages, fused_combine=fused_combine,
                                  v_side=v_side, pad_heads_to=pad_heads_to)
    b, hkv, lmax, d = cache.shape
    g = cache.query_group(q)
    if cache.bits != 2 or d % 128:
        raise ValueError("HACK attention kernels take 2-bit codes and head_dim a multiple of 128")
    pi = cache.partition
    if pi % (d // 4):
        raise ValueError(f"partition {pi} must be a multiple of head_dim/4 = {d // 4}")
    block_n = pi if prefetch else (block_n or max(pi, 128))
    max_len = lmax if max_len is None else max_len
    if mode == "dequant" and max_len > DEQUANT_LONG and not prefetch:
        num_warps = num_warps or 2
        if maxnreg is None and pi <= 64:
            maxnreg = DEQUANT_MAXNREG
    num_warps = num_warps or (2 if block_n >= 128 and mode == "hack" else 4)
    if block_n not in (pi, 2 * pi, 4 * pi):
        raise ValueError(f"block_n {block_n} must be PI, 2 PI or 4 PI")
    splits = splits or default_splits(b, hkv, max_len, block_n, q.device)
    tps = triton.cdiv(triton.cdiv(max_len, splits), block_n) * block_n
    splits = triton.cdiv(max_len, tps)
    qk_scale = 1.0 / math.sqrt(d) * 1.4426950408889634
    q = q.contiguous()
    g_pad = max(16, triton.next_power_of_2(g))
    sumrow = g if g < g_pad else -1  # a padding row computes code sums on the tensor cores (no SE)

    def launch(op, lsep):
        _quant_decode_kernel[(b * hkv, splits)](
            q, cache.k_codes, cache.k_min, cache.k_scale, cache.k_sum,
            cache.v_codes, cache.v_min, cache.v_scale, cache.v_sum, cache.v_tail, cache.lens, op, lsep,
            qk_scale, hkv, lmax, cache.v_min.shape[2], tps, splits,
            G=g, G_PAD=g_pad, D=d, PI=pi, USE_SE=use_se,
            HAS_TAIL=cache.rqe, MODE=0 if mode == "hack" else 1, USE_ASM=use_asm(q), PREFETCH=prefetch,
            SUMROW=sumrow, BN=block_n, VSPLIT=v_split,
            num_warps=num_warps, num_stages=num_stages, **({"maxnreg": maxnreg} if maxnreg else {}))

    return run_split_decode(launch, q, splits)


def decode_step(q: torch.Tensor, cache: QuantKVCache, k_new: torch.Tensor, v_new: torch.Tensor,
                use_se: bool = True, fused: bool | None = None, stochastic: bool = True, seed: int = 0,
                max_len: int | None = None, **kw) -> tuple[torch.Tensor, QuantKVCache]:
    """One HACK decode step: append (k_new, v_new [B, H_kv, D]) to the cache, then attend with q.
    fused=None: one launch for both (hack_decode_rp.hack_decode_step) up to FUSED_STEP_MAX_LEN tokens
    where the row-packed kernel applies and the cache has the FP16 tail (RQE), else append_token +
    hack_attn_decode.  kw: launch options of the chosen path.  Returns (output [B, H_q, D], the cache
    with lens + 1)."""
    ml = cache.shape[2] if max_len is None else max_len
    if fused is None:
        fused = (ml <= FUSED_STEP_MAX_LEN and cache.rqe and row_packed_supported(q, cache)
                 and not kw.get("gluon"))
    if fused:
        kw = {k: v for k, v in kw.items() if k not in ("row_packed", "gluon")}
        kw.setdefault("num_warps", FUSED_STEP_WARPS)
        return hack_decode_step(q, cache, k_new, v_new, stochastic=stochastic, seed=seed, use_se=use_se,
                                max_len=max_len, **kw)
    c = append_token(cache, k_new, v_new, stochastic=stochastic, seed=seed)
    return hack_attn_decode(q, c, use_se=use_se, max_len=max_len, **kw), c


# ----------------------------------------------------------------------------- references
def attn_decode_ref(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, lens) -> torch.Tensor:
    """Exact float64 attention of q [B, HQ, D] over k, v [B, HKV, L, D] (first lens[b] tokens)."""
    b, hq, d = q.shape
    hkv = k.shape[1]
    out = torch.empty((b, hq, d), dtype=torch.float64)
    for i in range(b):
        n = int(lens[i])
        kk = k[i, :, :n].double().cpu().repeat_interleave(hq // hkv, 0)  # (HQ, n, D)
        vv = v[i, :, :n].double().cpu().repeat_interleave(hq // hkv, 0)
        s = torch.einsum("hd,hnd->hn", q[i].double().cpu(), kk) / math.sqrt(d)
        out[i] = torch.einsum("hn,hnd->hd", torch.softmax(s, -1), vv)
    return out


def hack_attn_decode_ref(q: torch.Tensor, cache: QuantKVCache, q_per_head: bool = False) -> torch.Tensor:
    """What HACK computes, in float64: Q rounded to 8 bits per partition (per query head with
    q_per_head, as the row-packed kernel does), the cache's K and V (dequantized; FP16 tail where
    RQE), P rounded to multiples of 1/255 of the row max."""
    k, v = dequantize_cache_ref(cache)
    pi = q.shape[-1] if q_per_head else cache.partition
    qf = q.double().cpu()
    qp = qf.reshape(*qf.shape[:-1], -1, pi)
    mn, mx = qp.amin(-1, keepdim=True), qp.amax(-1, keepdim=True)
    s = (mx - mn) / 255
    code = torch.where(s > 0, torch.floor((qp - mn) / torch.where(s > 0, s, 1) + 0.5), 0 * qp).clamp(0, 255)
    qd = (code * s + mn).reshape(qf.shape)
    b, hq, d = q.shape
    hkv = k.shape[1]
    out = torch.empty((b, hq, d), dtype=torch.float64)
    lens = cache.lens.cpu()
    for i in range(b):
        n = int(lens[i])
        kk = k[i, :, :n].double().repeat_interleave(hq // hkv, 0)
        vv = v[i, :, :n].double().repeat_interleave(hq // hkv, 0)
        sc = torch.einsum("hd,hnd->hn", qd[i], kk) / math.sqrt(d)
        p = torch.exp(sc - sc.amax(-1, keepdim=True))
        p = torch.floor(p * 255 + 0.5) / 255
        out[i] = torch.einsum("hn,hnd->hd", p, vv) / p.sum(-1, keepdim=True)
    return out


def decode_flops(batch_tokens: int, q_heads: int, head_dim: int) -> float:
    """Q.K and P.V multiply-adds for every query head over every visited token."""
    return 4.0 * batch_tokens * q_heads * head_dim
