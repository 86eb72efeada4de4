"""Token-major decode attention in Gluon (explicit layouts): fused dequantize-then-attend and HACK.

The Triton kernels (hack_core.py, hack_decode_rp.py) give the 8 query heads of a KV head a 16-row
mma.sync tile: half of every softmax step runs on padding rows (or a second copy of the group), and
operands pass through shared memory where Triton converts layouts.  Here the token axis is the
product's M and the 8 heads are its N = 8, so nothing is padded.  Three kernels, measured on the H200
at batch 8, 64/8 heads, head_dim 128, 32K context, PI 64 (NOTES.md, session 5, runs 29-39):

* ``_dequant_mma_kernel`` (kernel="mma", the default for fused dequant on Hopper): ONE warp per
  program on mma.sync m16n8k16; S^T = K Q^T with K looked up into the A operand layout in registers
  (common.dequant_lut's table, one table per row pair: _lut_pairs), O^T = V^T P^T per channel group
  with V^T looked up the same way, P^T converted to the B layout.  The code bytes of an A-operand
  register (rows r, r + 8 x two consecutive K elements) come from two 16-bit inline-PTX loads
  (_ld_pack; V^T rows are permuted so rows r and r + 8 are adjacent bytes).  118.6 us against torch
  SDPA's 253.6 us (2.14x, run 37); the Triton kernel took 149-152 us.
* ``_hack_mma_kernel`` (hack_attn_decode(..., gluon=True)): the same layout for HACK: INT8 mma.sync
  m16n8k32, Q rounded per query head, the score terms applied in the accumulator layout, P'' by the
  magic-number FMA, P'' row sums and (without SE) code sums on the tensor cores, O and l x255, the
  FP16 tail (RQE) as the row-packed kernel does.  With one wave of programs (wave_splits, from the
  compiled kernel's registers), an L1 prefetch of the next tile, a 168-register cap (session 6), V
  planes 1-2 unshifted and the V metadata by channel pairs (session 7): 83.5 us against SDPA's 253.3
  (3.03x, run 58; the row-packed kernel 137.8 in run 48).  The default HACK kernel above 2K tokens on
  Hopper at PI 64 and GQA 8 (hack_attn_decode.gluon_hack_default).
* ``_dequant_decode_kernel`` (kernel="wgmma"): one warpgroup, wgmma m64n8k16 with K and V^T
  dequantized into shared memory.  198-214 us: slower than the Triton kernel.  Timing with parts
  switched off (DIAG, run 34) put ~136 us in the dequantization and its shared-memory stores (load
  latency in the open, shared-memory traffic) and ~45 us in the wgmma chain, whose N = 8 products
  cost nearly as much as wide ones.  A two-slot shared-memory ring for the next tile's loads
  (prefetch=True) was slower (more instructions, 128 registers).  Kept as the measured negative result.

Gluon has no interpreter: the kernels are checked against the references on the GPU
(tests/kernels/test_gluon_decode.py, experiments stages 11-16) and compiled for sm_90 offline in CI
(tests/kernels/test_sass.py).
"""
from __future__ import annotations

import math

import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import async_copy, mma_v2
from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, warpgroup_mma, warpgroup_mma_wait

from .common import _LUT2_S0, _LUT2_S2, _LUT2_S4, _LUT2_S6, LUT2_ASM, TABLE_ASM, UNPACK2_ASM
from .kv_cache import QuantKVCache

NUM_WARPS = 4
LAST_KERNEL: dict = {}   # the last launched compiled kernel per variant (registers and spills, for experiments)


@gluon.jit
def _split_range(LENS, HKV, TPS, G: gl.constexpr, PI: gl.constexpr, HAS_TAIL: gl.constexpr):
    """A split-K decode program's (request, KV head) bh, split, cache length L, LV = the tokens with
    quantized V (whole PI blocks when the last partial block is the FP16 tail), its token range
    [start, end) and the first query row of the KV head's group."""
    bh = gl.program_id(0)
    split = gl.program_id(1)
    b = bh // HKV
    L = gl.load(LENS + b)
    if HAS_TAIL:
        LV = (L // PI) * PI
    else:
        LV = L
    start = split * TPS
    end = gl.minimum(start + TPS, LV)
    return bh, split, L, LV, start, end, (b * HKV + bh % HKV) * G


@gluon.jit
def _cache_bases(KC, KMN, KSC, KSM, VC, VT, bh, LMAX, NBLK, D: gl.constexpr, PI: gl.constexpr):
    """The cache arrays of (request, KV head) bh: codes and K metadata at token 0, the V metadata's
    offset of block 0, and the FP16 tail."""
    W: gl.constexpr = D // 4
    NP: gl.constexpr = D // PI
    tok0 = bh.to(gl.int64) * LMAX
    return (KC + tok0 * W, KMN + tok0 * NP, KSC + tok0 * NP, KSM + tok0 * NP, VC + tok0 * W,
            bh.to(gl.int64) * NBLK * D, VT + bh.to(gl.int64) * PI * D)


@gluon.jit
def _store_lse(LSEP, qrow0, split, NSPLIT, l_i, m_i, G: gl.constexpr):
    """Store a split's log2-sum-exp per head (-inf where it saw no token); returns the partial rows
    and 1 / l as a [1, G] row, for combine_splits_kernel."""
    has = l_i > 0
    lse = gl.where(has, m_i + gl.log2(gl.where(has, l_i, 1.0)), float("-inf"))
    h = gl.arange(0, G, layout=m_i.type.layout)
    prow = (qrow0 + h).to(gl.int64) * NSPLIT + split
    gl.store(LSEP + prow, lse)
    return prow, gl.expand_dims(1.0 / gl.where(has, l_i, 1.0), 0)


@gluon.jit
def _store_o4(OP, prow, inv_l, o0, o1, o2, o3, D: gl.constexpr, PERM: gl.constexpr):
    """The four O^T channel groups [D / 4, G] divided by l; PERM: rows in _perm's channel order."""
    W: gl.constexpr = D // 4
    r = gl.arange(0, W, layout=gl.SliceLayout(1, o0.type.layout))
    if PERM:
        r = _perm(r)
    op = OP + gl.expand_dims(prow, 0) * D + gl.expand_dims(r, 1)
    gl.store(op, o0 * inv_l)
    gl.store(op + W, o1 * inv_l)
    gl.store(op + 2 * W, o2 * inv_l)
    gl.store(op + 3 * W, o3 * inv_l)


# In an mma A-operand layout a 32-bit register of four codes holds two rows (r, r + 8) of two
# consecutive K elements: the pairs lookup takes the second pair's table from its own row.
_LUT2P_ASM = LUT2_ASM.replace("prmt.b32 $1, $3, $7, w", "prmt.b32 $1, $5, $9, w")
assert _LUT2P_ASM != LUT2_ASM
_LUT2P_S0 = gl.constexpr(_LUT2P_ASM.replace("SHIFT", "0"))
_LUT2P_S2 = gl.constexpr(_LUT2P_ASM.replace("SHIFT", "2"))
_LUT2P_S4 = gl.constexpr(_LUT2P_ASM.replace("SHIFT", "4"))
_LUT2P_S6 = gl.constexpr(_LUT2P_ASM.replace("SHIFT", "6"))


@gluon.jit
def _mask_tokens(s, s0, end):
    """Score tile s [tokens, heads] of the tokens from s0 with those >= end set to -inf."""
    srow = s0 + gl.arange(0, s.shape[0], layout=gl.SliceLayout(1, s.type.layout))
    return gl.where(gl.expand_dims(srow < end, 1), s, float("-inf"))


@gluon.jit
def _softmax_step(s, s0, end, m_i):
    """Online-softmax step over a score tile s [tokens, heads] (log2 domain) of the tokens from s0,
    those >= end masked: (m_new, alpha = exp2(m_i - m_new), p) (common.online_softmax's Gluon twin)."""
    s = _mask_tokens(s, s0, end)
    m_new = gl.maximum(m_i, gl.max(s, 0))
    return m_new, gl.exp2(m_i - m_new), gl.exp2(s - gl.expand_dims(m_new, 0))


@gluon.jit
def _softmax_scaled(x, aq, s0, end, m_i, MASKED: gl.constexpr):
    """_softmax_step over the scores x * aq (aq > 0 per head) without forming them: the tile maximum is
    aq * max x, and x * aq - m is one FMA inside the exp2; MASKED: tokens >= end masked (full tiles
    skip the select)."""
    if MASKED:
        x = _mask_tokens(x, s0, end)
    m_new = gl.maximum(m_i, gl.max(x, 0) * aq)
    return m_new, gl.exp2(m_i - m_new), gl.exp2(x * gl.expand_dims(aq, 0) - gl.expand_dims(m_new, 0))


@gluon.jit
def _lut(packed, SHIFT: gl.constexpr, lo, hi, PAIRS: gl.constexpr = False):
    """uint8 codes (bit plane SHIFT) -> FP16 by the 4-entry tables lo/hi (int32 tensors of packed's
    shape and layout): the four codes of each 32-bit register share the table of the first, or with
    PAIRS each pair of codes (one mma A-operand row) the table of its first."""
    if SHIFT == 0:
        asm: gl.constexpr = _LUT2P_S0 if PAIRS else _LUT2_S0
    elif SHIFT == 2:
        asm: gl.constexpr = _LUT2P_S2 if PAIRS else _LUT2_S2
    elif SHIFT == 4:
        asm: gl.constexpr = _LUT2P_S4 if PAIRS else _LUT2_S4
    else:
        asm: gl.constexpr = _LUT2P_S6 if PAIRS else _LUT2_S6
    return gl.inline_asm_elementwise(asm, "=r,=r,r,r,r,r,r,r,r,r,r", [packed, lo, hi], dtype=gl.float16,
                                     is_pure=True, pack=4)


_TABLE_G = gl.constexpr(TABLE_ASM)


@gluon.jit
def _table(scale, mn):
    """(lo, hi): FP16 values of codes 0,1 | 2,3 for FP16 scale and min (fma.rn.f16x2, one rounding)."""
    return gl.inline_asm_elementwise(_TABLE_G, "=r,=r,h,h", [scale, mn], dtype=(gl.int32, gl.int32), is_pure=True,
                                     pack=1)


@gluon.jit
def _k_plane(kb, c: gl.constexpr, sk0, mk0, sk1, mk1, k_smem, PI: gl.constexpr):
    """Plane c of the K codes [BN, 32] -> FP16 into k_smem[c] (channels 32c .. 32c + 31)."""
    if (32 * c) // PI == 0:
        lo, hi = _table(sk0, mk0)
    else:
        lo, hi = _table(sk1, mk1)
    lo = gl.broadcast(gl.expand_dims(lo, 1), kb)[0]
    hi = gl.broadcast(gl.expand_dims(hi, 1), kb)[0]
    k_smem.index(c).store(_lut(kb, 2 * c, lo, hi))


@gluon.jit
def _v_plane(vb, c: gl.constexpr, sv, mv, v_smem):
    """Plane c of the V codes [BN, 32] (one V block; sv, mv its [32] scales and mins) -> FP16, stored
    transposed into rows 32c .. 32c + 31 of V^T."""
    lo, hi = _table(sv, mv)
    lo = gl.broadcast(gl.expand_dims(lo, 0), vb)[0]
    hi = gl.broadcast(gl.expand_dims(hi, 0), vb)[0]
    v = _lut(vb, 2 * c, lo, hi)
    v_smem.slice(32 * c, 32, dim=0).store(gl.permute(v, [1, 0]))


@gluon.jit
def _k_codes(s0, end, kc, kmn, ksc, BN: gl.constexpr, D: gl.constexpr, PI: gl.constexpr):
    """The K code bytes [BN, D / 4] of the tile at s0, 16 bytes of a token per thread, and the tokens'
    scales and mins per partition (tokens >= end read as 0)."""
    W: gl.constexpr = D // 4
    NP: gl.constexpr = D // PI
    k_l: gl.constexpr = gl.BlockedLayout([1, 16], [16, 2], [4, 1], [1, 0])
    tk = s0 + gl.arange(0, BN, layout=gl.SliceLayout(1, k_l))
    kj = gl.arange(0, W, layout=gl.SliceLayout(0, k_l))
    kmask = tk < end
    kb = gl.load(kc + tk[:, None] * W + kj[None, :], mask=kmask[:, None], other=0)
    sk0 = gl.load(ksc + tk * NP, mask=kmask, other=0.0)
    mk0 = gl.load(kmn + tk * NP, mask=kmask, other=0.0)
    sk1 = sk0
    mk1 = mk0
    if NP > 1:
        sk1 = gl.load(ksc + tk * NP + 1, mask=kmask, other=0.0)
        mk1 = gl.load(kmn + tk * NP + 1, mask=kmask, other=0.0)
    return kb, sk0, mk0, sk1, mk1


@gluon.jit
def _tile(s0, end, LV, m_i, l_acc, o, kc, kmn, ksc, vc, VMN, VSC, vt_ptr, mbase, q_smem, k_smem, v_smem, p_smem,
          BN: gl.constexpr, D: gl.constexpr, PI: gl.constexpr, G: gl.constexpr, TAIL: gl.constexpr,
          VLAY: gl.constexpr = 0, DIAG: gl.constexpr = 0):
    """One tile of BN tokens from s0 (tokens >= end masked).  TAIL: the tokens' V is the FP16 tail
    (row t - LV of vt_ptr) instead of codes.  Returns the online-softmax state (m_i, l_acc, o)."""
    W: gl.constexpr = D // 4
    acc_l: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, 8, 16])
    if VLAY == 0:
        vld_l: gl.constexpr = gl.BlockedLayout([4, 4], [4, 8], [4, 1], [1, 0])   # 4 tokens x 4 bytes (LDG.32)
        v_l: gl.constexpr = gl.BlockedLayout([4, 4], [4, 8], [4, 1], [0, 1])     # same elements, tokens packed
    else:
        # 4 tokens of bytes lane % 8 + 8 k (byte loads): a warp's V^T stores cover 8 consecutive
        # channel rows, which the 128-byte swizzle spreads over the banks (the [4, 4] tile puts its
        # rows 4 apart: 4-way bank conflicts)
        vld_l: gl.constexpr = gl.BlockedLayout([4, 1], [4, 8], [4, 1], [0, 1])
        v_l: gl.constexpr = gl.BlockedLayout([4, 1], [4, 8], [4, 1], [0, 1])
    # ---- K codes -> FP16 tiles in shared memory
    kb, sk0, mk0, sk1, mk1 = _k_codes(s0, end, kc, kmn, ksc, BN, D, PI)
    # DIAG (timing only, wrong results), bit flags: 1 skips the V dequantization, 2 the K one, 4 the
    # S^T product, 8 the O^T product, 16 the fences and barriers
    if (DIAG // 2) % 2 == 0:
        _k_plane(kb, 0, sk0, mk0, sk1, mk1, k_smem, PI)
        _k_plane(kb, 1, sk0, mk0, sk1, mk1, k_smem, PI)
        _k_plane(kb, 2, sk0, mk0, sk1, mk1, k_smem, PI)
        _k_plane(kb, 3, sk0, mk0, sk1, mk1, k_smem, PI)
    # ---- V -> FP16 V^T [D, BN] in shared memory, 64 tokens (one V block: PI >= 64) at a time
    vj = gl.arange(0, W, layout=gl.SliceLayout(0, vld_l))
    chan = gl.arange(0, W, layout=gl.SliceLayout(0, v_l))
    for h in gl.static_range(BN // 64):
        vh = v_smem.slice(64 * h, 64, dim=1)
        if TAIL:
            tt = s0 + 64 * h + gl.arange(0, 64, layout=gl.SliceLayout(1, v_l))
            for c in gl.static_range(4):
                vv = gl.load(vt_ptr + (tt - LV)[:, None] * D + 32 * c + chan[None, :], mask=(tt < end)[:, None],
                             other=0.0)
                vh.slice(32 * c, 32, dim=0).store(gl.permute(vv, [1, 0]))
        else:
            tv = s0 + 64 * h + gl.arange(0, 64, layout=gl.SliceLayout(1, vld_l))
            vb = gl.load(vc + tv[:, None] * W + vj[None, :], mask=(tv < end)[:, None], other=0)
            if VLAY == 0:
                vb = gl.convert_layout(vb, v_l)
            moff = mbase + ((s0 + 64 * h) // PI) * D + chan
            if DIAG % 2 == 0:
                for c in gl.static_range(4):
                    _v_plane(vb, c, gl.load(VSC + moff + 32 * c), gl.load(VMN + moff + 32 * c), vh)
    if (DIAG // 16) % 2 == 0:
        fence_async_shared()
        gl.thread_barrier()
    # ---- S^T = K Q^T [BN, G] (log2 domain)
    s = gl.zeros([BN, G], gl.float32, layout=acc_l)
    if (DIAG // 4) % 2 == 0:
        s = warpgroup_mma(k_smem.index(0), q_smem.index(0).permute([1, 0]), s, use_acc=False)
        s = warpgroup_mma(k_smem.index(1), q_smem.index(1).permute([1, 0]), s)
        s = warpgroup_mma(k_smem.index(2), q_smem.index(2).permute([1, 0]), s)
        s = warpgroup_mma(k_smem.index(3), q_smem.index(3).permute([1, 0]), s)
    m_new, alpha, p = _softmax_step(s, s0, end, m_i)
    # the denominator stays per thread ([BN, G] partial sums of the thread's own tokens): one
    # reduction at the end instead of one per tile
    l_acc = l_acc * gl.expand_dims(alpha, 0) + p
    p_smem.store(p.to(gl.float16))
    if (DIAG // 16) % 2 == 0:
        fence_async_shared()
        gl.thread_barrier()
    # ---- O^T = alpha O^T + V^T P^T [D, G]
    o = o * gl.expand_dims(alpha, 0)
    if (DIAG // 8) % 2 == 0:
        o = warpgroup_mma(v_smem, p_smem, o)
    if (DIAG // 16) % 2 == 0:
        gl.thread_barrier()   # the next tile overwrites the operands
    return m_new, l_acc, o


@gluon.jit
def _load_codes(s0, end, kc, kmn, ksc, vc, VMN, VSC, mbase, D: gl.constexpr, PI: gl.constexpr):
    """The global loads of the 64-token tile at s0 (issued one tile ahead of their use): K code bytes
    [64, 32] and per-token scales/mins, V code bytes [64, 32] and the V block's per-channel scales/mins."""
    W: gl.constexpr = D // 4
    vld_l: gl.constexpr = gl.BlockedLayout([4, 4], [4, 8], [4, 1], [1, 0])
    v_l: gl.constexpr = gl.BlockedLayout([4, 4], [4, 8], [4, 1], [0, 1])
    kb, sk0, mk0, sk1, mk1 = _k_codes(s0, end, kc, kmn, ksc, 64, D, PI)
    tv = s0 + gl.arange(0, 64, layout=gl.SliceLayout(1, vld_l))
    vj = gl.arange(0, W, layout=gl.SliceLayout(0, vld_l))
    vb = gl.load(vc + tv[:, None] * W + vj[None, :], mask=(tv < end)[:, None], other=0)
    chan = gl.arange(0, W, layout=gl.SliceLayout(0, v_l))
    moff = mbase + (s0 // PI) * D + chan
    ok = s0 < end
    sv0 = gl.load(VSC + moff, mask=ok, other=0.0)
    sv1 = gl.load(VSC + moff + W, mask=ok, other=0.0)
    sv2 = gl.load(VSC + moff + 2 * W, mask=ok, other=0.0)
    sv3 = gl.load(VSC + moff + 3 * W, mask=ok, other=0.0)
    mv0 = gl.load(VMN + moff, mask=ok, other=0.0)
    mv1 = gl.load(VMN + moff + W, mask=ok, other=0.0)
    mv2 = gl.load(VMN + moff + 2 * W, mask=ok, other=0.0)
    mv3 = gl.load(VMN + moff + 3 * W, mask=ok, other=0.0)
    return kb, sk0, mk0, sk1, mk1, vb, sv0, sv1, sv2, sv3, mv0, mv1, mv2, mv3


@gluon.jit
def _stage(buf, kb, sk0, mk0, sk1, mk1, vb, sv0, sv1, sv2, sv3, mv0, mv1, mv2, mv3,
           kraw, vraw, kmeta, vmeta):
    """Store a tile's loaded bytes and metadata into slot buf of the shared-memory ring."""
    kraw.index(buf).store(kb)
    vraw.index(buf).store(vb)
    kmeta.index(4 * buf).store(sk0)
    kmeta.index(4 * buf + 1).store(mk0)
    kmeta.index(4 * buf + 2).store(sk1)
    kmeta.index(4 * buf + 3).store(mk1)
    vmeta.index(8 * buf).store(sv0)
    vmeta.index(8 * buf + 1).store(sv1)
    vmeta.index(8 * buf + 2).store(sv2)
    vmeta.index(8 * buf + 3).store(sv3)
    vmeta.index(8 * buf + 4).store(mv0)
    vmeta.index(8 * buf + 5).store(mv1)
    vmeta.index(8 * buf + 6).store(mv2)
    vmeta.index(8 * buf + 7).store(mv3)


@gluon.jit
def _tile_pipe(s0, end, m_i, l_acc, o, buf, kraw, vraw, kmeta, vmeta,
               q_smem, k_smem, v_smem, p_smem, D: gl.constexpr, PI: gl.constexpr, G: gl.constexpr):
    """One 64-token tile from the shared-memory ring (slot buf, filled a tile ahead): K planes to the
    wgmma tiles, S^T = K Q^T issued asynchronously, the V planes dequantized while it runs, then
    softmax and O^T += V^T P^T."""
    acc_l: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, 8, 16])
    k_l: gl.constexpr = gl.BlockedLayout([1, 16], [16, 2], [4, 1], [1, 0])
    v_l: gl.constexpr = gl.BlockedLayout([4, 4], [4, 8], [4, 1], [0, 1])
    tok_l: gl.constexpr = gl.SliceLayout(1, k_l)
    ch_l: gl.constexpr = gl.SliceLayout(0, v_l)
    kb = kraw.index(buf).load(k_l)
    sk0 = kmeta.index(4 * buf).load(tok_l)
    mk0 = kmeta.index(4 * buf + 1).load(tok_l)
    sk1 = kmeta.index(4 * buf + 2).load(tok_l)
    mk1 = kmeta.index(4 * buf + 3).load(tok_l)
    _k_plane(kb, 0, sk0, mk0, sk1, mk1, k_smem, PI)
    _k_plane(kb, 1, sk0, mk0, sk1, mk1, k_smem, PI)
    _k_plane(kb, 2, sk0, mk0, sk1, mk1, k_smem, PI)
    _k_plane(kb, 3, sk0, mk0, sk1, mk1, k_smem, PI)
    fence_async_shared()
    gl.thread_barrier()
    s = gl.zeros([64, G], gl.float32, layout=acc_l)
    s = warpgroup_mma(k_smem.index(0), q_smem.index(0).permute([1, 0]), s, use_acc=False, is_async=True)
    s = warpgroup_mma(k_smem.index(1), q_smem.index(1).permute([1, 0]), s, is_async=True)
    s = warpgroup_mma(k_smem.index(2), q_smem.index(2).permute([1, 0]), s, is_async=True)
    s = warpgroup_mma(k_smem.index(3), q_smem.index(3).permute([1, 0]), s, is_async=True)
    vb = vraw.index(buf).load(v_l)
    for c in gl.static_range(4):
        _v_plane(vb, c, vmeta.index(8 * buf + c).load(ch_l), vmeta.index(8 * buf + 4 + c).load(ch_l), v_smem)
    s = warpgroup_mma_wait(num_outstanding=0, deps=[s])
    m_new, alpha, p = _softmax_step(s, s0, end, m_i)
    l_acc = l_acc * gl.expand_dims(alpha, 0) + p
    p_smem.store(p.to(gl.float16))
    fence_async_shared()
    gl.thread_barrier()
    o = warpgroup_mma(v_smem, p_smem, o * gl.expand_dims(alpha, 0))
    return m_new, l_acc, o


@gluon.jit
def _dequant_decode_kernel(Q, KC, KMN, KSC, VC, VMN, VSC, VT, LENS, OP, LSEP,
                           qk_scale, HKV, LMAX, NBLK, TPS, NSPLIT,
                           G: gl.constexpr, D: gl.constexpr, PI: gl.constexpr, HAS_TAIL: gl.constexpr,
                           BN: gl.constexpr, PIPE: gl.constexpr, VLAY: gl.constexpr, DIAG: gl.constexpr):
    W: gl.constexpr = D // 4
    NP: gl.constexpr = D // PI
    gl.static_assert(D == 128)
    gl.static_assert(G == 8)
    gl.static_assert(PI >= 64)
    gl.static_assert(NP <= 2)
    acc_l: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, 8, 16])
    col_l: gl.constexpr = gl.SliceLayout(0, acc_l)     # [G] per-head vectors
    q_l: gl.constexpr = gl.BlockedLayout([1, 8], [8, 4], [4, 1], [1, 0])
    kt_sl: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BN, 32], gl.float16)
    q_sl: gl.constexpr = gl.NVMMASharedLayout.get_default_for([G, 32], gl.float16)
    vt_sl: gl.constexpr = gl.NVMMASharedLayout.get_default_for([D, BN], gl.float16)
    p_sl: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BN, G], gl.float16)

    bh, split, L, LV, start, end, qrow0 = _split_range(LENS, HKV, TPS, G, PI, HAS_TAIL)

    # ---- Q (times qk_scale, FP16) -> shared memory, one [G, 32] tile per channel group
    q_smem = gl.allocate_shared_memory(gl.float16, [4, G, 32], q_sl)
    qh = gl.arange(0, G, layout=gl.SliceLayout(1, q_l))
    qj = gl.arange(0, 32, layout=gl.SliceLayout(0, q_l))
    for c in gl.static_range(4):
        qv = gl.load(Q + (qrow0 + qh)[:, None] * D + 32 * c + qj[None, :]).to(gl.float32) * qk_scale
        q_smem.index(c).store(qv.to(gl.float16))
    k_smem = gl.allocate_shared_memory(gl.float16, [4, BN, 32], kt_sl)
    v_smem = gl.allocate_shared_memory(gl.float16, [D, BN], vt_sl)
    p_smem = gl.allocate_shared_memory(gl.float16, [BN, G], p_sl)

    kc, kmn, ksc, ksm, vc, mbase, vt_ptr = _cache_bases(KC, KMN, KSC, KSC, VC, VT, bh, LMAX, NBLK, D, PI)

    m_i = gl.full([G], float("-inf"), gl.float32, layout=col_l)
    l_acc = gl.zeros([BN, G], gl.float32, layout=acc_l)
    o = gl.zeros([D, G], gl.float32, layout=acc_l)
    fence_async_shared()
    gl.thread_barrier()
    if PIPE:
        # a ring of two slots in shared memory: the loads of tile i + 1 are issued at the start of
        # tile i and stored into the other slot at its end, so their latency hides behind tile i
        raw_sl: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, order=[1, 0])
        vec_sl: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, order=[0])
        kraw = gl.allocate_shared_memory(gl.uint8, [2, BN, W], raw_sl)
        vraw = gl.allocate_shared_memory(gl.uint8, [2, BN, W], raw_sl)
        kmeta = gl.allocate_shared_memory(gl.float16, [2 * 4, BN], vec_sl)   # slot * 4 + (sk0, mk0, sk1, mk1)
        vmeta = gl.allocate_shared_memory(gl.float16, [2 * 8, W], vec_sl)    # slot * 8 + (sv0..3, mv0..3)
        kb, sk0, mk0, sk1, mk1, vb, sv0, sv1, sv2, sv3, mv0, mv1, mv2, mv3 = _load_codes(
            start, end, kc, kmn, ksc, vc, VMN, VSC, mbase, D, PI)
        _stage(0, kb, sk0, mk0, sk1, mk1, vb, sv0, sv1, sv2, sv3, mv0, mv1, mv2, mv3, kraw, vraw, kmeta, vmeta)
        gl.thread_barrier()
        buf = 0
        for s0 in range(start, end, BN):
            kb, sk0, mk0, sk1, mk1, vb, sv0, sv1, sv2, sv3, mv0, mv1, mv2, mv3 = _load_codes(
                s0 + BN, end, kc, kmn, ksc, vc, VMN, VSC, mbase, D, PI)
            m_i, l_acc, o = _tile_pipe(s0, end, m_i, l_acc, o, buf, kraw, vraw, kmeta, vmeta,
                                       q_smem, k_smem, v_smem, p_smem, D, PI, G)
            buf = 1 - buf
            _stage(buf, kb, sk0, mk0, sk1, mk1, vb, sv0, sv1, sv2, sv3, mv0, mv1, mv2, mv3,
                   kraw, vraw, kmeta, vmeta)
            gl.thread_barrier()   # the next tile overwrites the operands and reads the slot just filled
    else:
        for s0 in range(start, end, BN):
            m_i, l_acc, o = _tile(s0, end, LV, m_i, l_acc, o, kc, kmn, ksc, vc, VMN, VSC, vt_ptr, mbase,
                                  q_smem, k_smem, v_smem, p_smem, BN, D, PI, G, False, VLAY, DIAG)
    if HAS_TAIL:
        # RQE: the last < PI tokens have quantized K and FP16 V; the last split takes them
        if (split == NSPLIT - 1) & (L > LV):
            for s0 in range(LV, L, BN):
                m_i, l_acc, o = _tile(s0, L, LV, m_i, l_acc, o, kc, kmn, ksc, vc, VMN, VSC, vt_ptr, mbase,
                                      q_smem, k_smem, v_smem, p_smem, BN, D, PI, G, True, VLAY)
    # ---- partials: O / l and log2-sum-exp per head
    prow, inv_l = _store_lse(LSEP, qrow0, split, NSPLIT, gl.sum(l_acc, 0), m_i, G)
    d = gl.arange(0, D, layout=gl.SliceLayout(1, acc_l))
    gl.store(OP + gl.expand_dims(prow, 0) * D + gl.expand_dims(d, 1), o * inv_l)


def programs_per_sm(n_regs: int, num_warps: int = 1) -> int:
    """Resident programs per SM (sm_80/sm_90) for a kernel of n_regs registers per thread: registers are
    allocated 8 per thread at a time, and a warp's come from one of the SM's four 16K-register
    partitions (run 41: at 182 registers the SM's 64K would fit 11 warps, the partitions fit 8; 22
    splits took 157 us, 16 took 115); at most 64 warps and 32 programs."""
    regs_per_warp = -(-max(n_regs, 1) // 8) * 8 * 32
    warps_per_sm = 4 * (16384 // regs_per_warp)
    return max(1, min(32, 64 // num_warps, warps_per_sm // num_warps))


def one_wave_splits(batch: int, kv_heads: int, max_len: int, n_sm: int, per_sm: int, tile: int = 64) -> int:
    """Splits per (request, KV head) that make one wave of programs on n_sm SMs (run 40: the HACK kernel
    at 168 registers fits 12 one-warp programs per SM, and 24 splits at batch 8 x 8 KV heads, 1,536
    programs, took 103 us where 33 splits, 1.33 waves, took 133); at least two tiles per split and at
    most 128 splits."""
    splits = max(1, (n_sm * per_sm) // (batch * kv_heads))
    return max(1, min(splits, 128, triton.cdiv(max_len, 2 * tile)))


_PER_SM: dict = {}


def wave_splits(batch: int, kv_heads: int, max_len: int, kernel_fn, make_args, constexprs: dict,
                num_warps: int = 1, tile: int = 64, options: dict | None = None) -> int:
    """one_wave_splits for a Gluon kernel, its registers read from the compiled kernel (warmup with the
    launch's compile options, e.g. maxnreg; make_args() gives representative launch arguments).  The
    programs per SM are cached per kernel variant and device, so a decode step pays this once."""
    dev = torch.cuda.current_device()
    key = (kernel_fn, tuple(sorted(constexprs.items())), tuple(sorted((options or {}).items())), num_warps, dev)
    if key not in _PER_SM:
        k = kernel_fn.warmup(*make_args(), **constexprs, **(options or {}), num_warps=num_warps, grid=(1,))
        k._init_handles()   # loads the module: n_regs comes from the driver
        _PER_SM[key] = (torch.cuda.get_device_properties(dev).multi_processor_count,
                        programs_per_sm(k.n_regs, num_warps))
    n_sm, per_sm = _PER_SM[key]
    return one_wave_splits(batch, kv_heads, max_len, n_sm, per_sm, tile)


def gluon_supported(q: torch.Tensor, cache: QuantKVCache) -> bool:
    """The shapes the Gluon kernel takes: 2-bit codes, head_dim 128, PI 64/128, 8 query heads per KV head."""
    b, hkv, _, d = cache.shape
    return (cache.bits == 2 and d == 128 and cache.partition in (64, 128) and q.dim() == 3
            and q.shape[1] == 8 * hkv)


def dequant_attn_decode_gluon(q: torch.Tensor, cache: QuantKVCache, splits: int | None = None,
                              max_len: int | None = None, block_n: int = 64, pipe: bool = False,
                              vlay: int = 0, diag: int = 0, kernel: str = "wgmma", ldasm: bool = True,
                              maxnreg: int | None = None) -> torch.Tensor:
    """Fused dequantize-then-attend decode, token-major.  q [B, HQ, D] fp16 (the new token's query,
    already appended) -> [B, HQ, D] fp16.  kernel "wgmma": one warpgroup per program, 64-token tiles
    (block_n), operands through shared memory; "mma": one warp per program, mma.sync, operands in
    registers, block_n 32 or 64 tokens per tile; ldasm: code bytes in 16-bit inline-PTX loads (two per
    four codes) instead of the compiler's byte loads; maxnreg: the mma kernel's register cap (uncapped it
    takes 255 with the FP16 tail: 8 programs per SM, run 52).  splits: default_splits of 4 tiles."""
    from .hack_attn_decode import default_splits, run_split_decode

    b, hkv, lmax, d = cache.shape
    g = cache.query_group(q)
    if not gluon_supported(q, cache):
        raise ValueError("the Gluon decode kernel takes 2-bit codes, head_dim 128, PI 64/128 and 8 query heads "
                         "per KV head")
    if kernel == "wgmma" and block_n != 64:
        raise ValueError(f"block_n {block_n}: the wgmma kernel takes 64-token tiles (128 gave wrong results on "
                         "the H200, run 29)")
    if kernel == "mma" and block_n not in (32, 64):
        raise ValueError(f"block_n {block_n} must be 32 or 64 for the mma kernel")
    if kernel not in ("wgmma", "mma"):
        raise ValueError(f"kernel {kernel!r} must be 'wgmma' or 'mma'")
    pi = cache.partition
    max_len = lmax if max_len is None else max_len
    splits = splits or default_splits(b, hkv, max_len, 4 * block_n, q.device)
    tps = triton.cdiv(triton.cdiv(max_len, splits), block_n) * block_n
    splits = triton.cdiv(max_len, tps)
    qk_scale = 1.0 / math.sqrt(d) * 1.4426950408889634
    q = q.contiguous()

    def launch(op, lsep):
        args = (q, cache.k_codes, cache.k_min, cache.k_scale, cache.v_codes, cache.v_min, cache.v_scale,
                cache.v_tail, cache.lens, op, lsep, qk_scale, hkv, lmax, cache.v_min.shape[2], tps, splits)
        if kernel == "mma":
            _dequant_mma_kernel[(b * hkv, splits)](*args, G=g, D=d, PI=pi, HAS_TAIL=cache.rqe, BT=block_n,
                                                   LDASM=ldasm, num_warps=1, **({"maxnreg": maxnreg} if maxnreg else {}))
        else:
            _dequant_decode_kernel[(b * hkv, splits)](*args, G=g, D=d, PI=pi, HAS_TAIL=cache.rqe, BN=block_n,
                                                      PIPE=pipe, VLAY=vlay, DIAG=diag, num_warps=NUM_WARPS)

    return run_split_decode(launch, q, splits)


# ----------------------------------------------------------------------------- one warp, mma.sync
# The same attention with mma.sync (m16n8k16) in one warp per program: S^T = K Q^T has the tokens
# on M and the 8 heads on N = 8, exactly mma.sync's n8 (no padding rows, no wgmma with a tiny N);
# O^T = V^T P^T per channel group, V^T on M.  Every operand stays in registers: the code bytes are
# loaded straight into the A operand layout and looked up there (_lut with PAIRS), Q^T and P^T are
# B operands.
# Four code bytes of an A-operand pack (rows r, r + 8 x two consecutive K elements) in two 16-bit
# loads and one byte permute.  The compiler's loads follow the operand layout's register order, whose
# neighbours are 32 bytes apart in memory (one byte each); these take the pair that is contiguous.
# Operands: $1 the pack's first byte offset from $5 (the 64-bit base); the other offsets are unused.
_LDPACK_ASM = ("{ .reg .u64 a; .reg .b32 x, y; cvt.u64.u32 a, $1; add.u64 a, a, $5;"
               " ld.global.nc.u16 x, [a]; ld.global.nc.u16 y, [a+DELTA]; prmt.b32 $0, x, y, SEL; }")
_LDPACK_K = gl.constexpr(_LDPACK_ASM.replace("DELTA", "256").replace("SEL", "0x5410"))  # (t, j..j+1), (t+8, ..)
_LDPACK_V = gl.constexpr(_LDPACK_ASM.replace("DELTA", "32").replace("SEL", "0x5140"))   # (t, b..b+1), (t+1, ..)


@gluon.jit
def _pairs_pv(o, al, vb, SHIFT: gl.constexpr, VSC, VMN, moff, pt):
    """o <- al o + V^T_c P^T for the V^T code bytes vb in an A-operand layout (bit plane SHIFT, the
    channels moff of one V block: their tables looked up per row pair)."""
    lo, hi = _table(gl.load(VSC + moff), gl.load(VMN + moff))
    lo = gl.broadcast(gl.expand_dims(lo, 1), vb)[0]
    hi = gl.broadcast(gl.expand_dims(hi, 1), vb)[0]
    return mma_v2(_lut(vb, SHIFT, lo, hi, True), pt, o * al)


@gluon.jit
def _ld_pack(off, base, ASM: gl.constexpr):
    return gl.inline_asm_elementwise(ASM, "=r,r,r,r,r,l,l,l,l", [off, base], dtype=gl.uint8, is_pure=True, pack=4)


@gluon.jit
def _mma_tile(s0, end, LV, m_i, l_acc, o0, o1, o2, o3, qt0, qt1, qt2, qt3, kc, kmn, ksc, vc, VMN, VSC, vt_ptr,
              mbase, BT: gl.constexpr, D: gl.constexpr, PI: gl.constexpr, TAIL: gl.constexpr,
              LDASM: gl.constexpr = False):
    W: gl.constexpr = D // 4
    NP: gl.constexpr = D // PI
    mma: gl.constexpr = gl.NVMMADistributedLayout(version=[2, 0], warps_per_cta=[1, 1], instr_shape=[16, 8])
    a_l: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=mma, k_width=2)
    b_l: gl.constexpr = gl.DotOperandLayout(operand_index=1, parent=mma, k_width=2)
    row_a: gl.constexpr = gl.SliceLayout(1, a_l)
    col_a: gl.constexpr = gl.SliceLayout(0, a_l)
    # ---- S^T [BT, 8] = K Q^T, K looked up in the A layout (tokens on M)
    tk = s0 + gl.arange(0, BT, layout=row_a)
    kj = gl.arange(0, W, layout=col_a)
    kmask = tk < end
    if LDASM:
        # tokens past `end` are read unmasked (inside the cache's capacity, a multiple of BT); their
        # scores are -inf below and their V rows meet P = 0
        r0 = gl.arange(0, BT, layout=row_a)
        koff = (r0 - (r0 % 16) // 8 * 8)[:, None] * W + (kj - kj % 2)[None, :]
        kb = _ld_pack(koff, gl.full([BT, W], 0, gl.int64, layout=a_l) + (kc + s0 * W).to(gl.int64, bitcast=True),
                      _LDPACK_K)
    else:
        kb = gl.load(kc + tk[:, None] * W + kj[None, :], mask=kmask[:, None], other=0)
    sk0 = gl.load(ksc + tk * NP, mask=kmask, other=0.0)
    mk0 = gl.load(kmn + tk * NP, mask=kmask, other=0.0)
    lo0, hi0 = _table(sk0, mk0)
    lo0 = gl.broadcast(gl.expand_dims(lo0, 1), kb)[0]
    hi0 = gl.broadcast(gl.expand_dims(hi0, 1), kb)[0]
    lo1 = lo0
    hi1 = hi0
    if NP > 1:
        sk1 = gl.load(ksc + tk * NP + 1, mask=kmask, other=0.0)
        mk1 = gl.load(kmn + tk * NP + 1, mask=kmask, other=0.0)
        lo1, hi1 = _table(sk1, mk1)
        lo1 = gl.broadcast(gl.expand_dims(lo1, 1), kb)[0]
        hi1 = gl.broadcast(gl.expand_dims(hi1, 1), kb)[0]
    s = gl.zeros([BT, 8], gl.float32, layout=mma)
    s = mma_v2(_lut(kb, 0, lo0, hi0, True), qt0, s)     # planes 0, 1: partition 0; 2, 3: the last
    s = mma_v2(_lut(kb, 2, lo0, hi0, True), qt1, s)     # (lo1 is lo0 when PI = 128)
    s = mma_v2(_lut(kb, 4, lo1, hi1, True), qt2, s)
    s = mma_v2(_lut(kb, 6, lo1, hi1, True), qt3, s)
    m_new, alpha, p = _softmax_step(s, s0, end, m_i)
    l_acc = l_acc * gl.expand_dims(alpha, 0) + p
    pt = gl.convert_layout(p.to(gl.float16), b_l)     # P^T [BT tokens (K), 8 heads (N)]
    al = gl.expand_dims(alpha, 0)
    # ---- O^T_c [32, 8] += V^T_c P^T per channel group c (V^T looked up in the A layout)
    tv = s0 + gl.arange(0, BT, layout=col_a)
    vr = gl.arange(0, W, layout=row_a)
    vmask = (tv < end)[None, :]
    if LDASM:
        vr = _perm(vr)   # the row -> channel order of the output
    if TAIL:
        vp = vt_ptr + (tv - LV)[None, :] * D + vr[:, None]
        o0 = mma_v2(gl.load(vp, mask=vmask, other=0.0), pt, o0 * al)
        o1 = mma_v2(gl.load(vp + W, mask=vmask, other=0.0), pt, o1 * al)
        o2 = mma_v2(gl.load(vp + 2 * W, mask=vmask, other=0.0), pt, o2 * al)
        o3 = mma_v2(gl.load(vp + 3 * W, mask=vmask, other=0.0), pt, o3 * al)
    else:
        if LDASM:
            # row r of V^T holds byte PERM(r) = 16 (r // 16) + 2 (r % 8) + (r % 16) // 8: rows r, r + 8
            # are adjacent bytes, one 16-bit load per token
            t0 = gl.arange(0, BT, layout=col_a)
            voff = (t0 - t0 % 2)[None, :] * W + (vr - vr % 2)[:, None]
            vb = _ld_pack(voff, gl.full([W, BT], 0, gl.int64, layout=a_l) + (vc + s0 * W).to(gl.int64, bitcast=True),
                          _LDPACK_V)
        else:
            vb = gl.load(vc + tv[None, :] * W + vr[:, None], mask=vmask, other=0)   # [32 bytes, BT tokens]
        moff = mbase + (s0 // PI) * D + vr
        o0 = _pairs_pv(o0, al, vb, 0, VSC, VMN, moff, pt)
        o1 = _pairs_pv(o1, al, vb, 2, VSC, VMN, moff + W, pt)
        o2 = _pairs_pv(o2, al, vb, 4, VSC, VMN, moff + 2 * W, pt)
        o3 = _pairs_pv(o3, al, vb, 6, VSC, VMN, moff + 3 * W, pt)
    return m_new, l_acc, o0, o1, o2, o3


@gluon.jit
def _dequant_mma_kernel(Q, KC, KMN, KSC, VC, VMN, VSC, VT, LENS, OP, LSEP,
                        qk_scale, HKV, LMAX, NBLK, TPS, NSPLIT,
                        G: gl.constexpr, D: gl.constexpr, PI: gl.constexpr, HAS_TAIL: gl.constexpr,
                        BT: gl.constexpr, LDASM: gl.constexpr = False):
    W: gl.constexpr = D // 4
    gl.static_assert(D == 128)
    gl.static_assert(G == 8)
    gl.static_assert(PI >= BT)
    mma: gl.constexpr = gl.NVMMADistributedLayout(version=[2, 0], warps_per_cta=[1, 1], instr_shape=[16, 8])
    b_l: gl.constexpr = gl.DotOperandLayout(operand_index=1, parent=mma, k_width=2)
    col_l: gl.constexpr = gl.SliceLayout(0, mma)
    bh, split, L, LV, start, end, qrow0 = _split_range(LENS, HKV, TPS, G, PI, HAS_TAIL)
    # Q^T per channel group [32, G] (B operand, times qk_scale, FP16)
    qk = gl.arange(0, W, layout=gl.SliceLayout(1, b_l))
    qh = gl.arange(0, G, layout=gl.SliceLayout(0, b_l))
    qp = Q + (qrow0 + qh)[None, :] * D + qk[:, None]
    qt0 = (gl.load(qp).to(gl.float32) * qk_scale).to(gl.float16)
    qt1 = (gl.load(qp + W).to(gl.float32) * qk_scale).to(gl.float16)
    qt2 = (gl.load(qp + 2 * W).to(gl.float32) * qk_scale).to(gl.float16)
    qt3 = (gl.load(qp + 3 * W).to(gl.float32) * qk_scale).to(gl.float16)
    kc, kmn, ksc, ksm, vc, mbase, vt_ptr = _cache_bases(KC, KMN, KSC, KSC, VC, VT, bh, LMAX, NBLK, D, PI)
    m_i = gl.full([G], float("-inf"), gl.float32, layout=col_l)
    l_acc = gl.zeros([BT, G], gl.float32, layout=mma)
    o0 = gl.zeros([W, G], gl.float32, layout=mma)
    o1 = gl.zeros([W, G], gl.float32, layout=mma)
    o2 = gl.zeros([W, G], gl.float32, layout=mma)
    o3 = gl.zeros([W, G], gl.float32, layout=mma)
    for s0 in range(start, end, BT):
        m_i, l_acc, o0, o1, o2, o3 = _mma_tile(s0, end, LV, m_i, l_acc, o0, o1, o2, o3, qt0, qt1, qt2, qt3,
                                               kc, kmn, ksc, vc, VMN, VSC, vt_ptr, mbase, BT, D, PI, False, LDASM)
    if HAS_TAIL:
        if (split == NSPLIT - 1) & (L > LV):
            for s0 in range(LV, L, BT):
                m_i, l_acc, o0, o1, o2, o3 = _mma_tile(s0, L, LV, m_i, l_acc, o0, o1, o2, o3, qt0, qt1, qt2, qt3,
                                                       kc, kmn, ksc, vc, VMN, VSC, vt_ptr, mbase, BT, D, PI, True, LDASM)
    prow, inv_l = _store_lse(LSEP, qrow0, split, NSPLIT, gl.sum(l_acc, 0), m_i, G)
    _store_o4(OP, prow, inv_l, o0, o1, o2, o3, D, LDASM)


# ----------------------------------------------------------------------------- HACK on one warp, mma.sync
# HACK attention (homomorphic INT8 products, as the row-packed kernel computes it: Q rounded to 8 bits
# per query head, P to multiples of 1/255, O and l kept x255) on the one-warp token-major layout:
# S^T = K'' Q''^T on INT8 mma (m16n8k32, tokens on M, the 8 heads on N = 8), the per-token score terms
# applied in the accumulator layout, O^T_c = V''^T_c P''^T per channel group with the per-channel
# block terms.  PI = 64: a 64-token tile is one V block.  Every operand stays in registers.
_UNPACK2_S0 = gl.constexpr(UNPACK2_ASM[0])
_UNPACK2_S2 = gl.constexpr(UNPACK2_ASM[1])
_UNPACK2_S4 = gl.constexpr(UNPACK2_ASM[2])
_UNPACK2_S6 = gl.constexpr(UNPACK2_ASM[3])
# eight code bytes of a k_width = 4 A-operand pair of packs (rows r, r + 8 x tokens t .. t + 3) in four
# 16-bit loads (rows r, r + 8 are adjacent bytes, see PERM) and four byte permutes
_LDV8_ASM = gl.constexpr(
    "{ .reg .u64 a; .reg .b32 w0, w1, w2, w3, t0, t1; cvt.u64.u32 a, $2; add.u64 a, a, $10;"
    " ld.global.nc.u16 w0, [a]; ld.global.nc.u16 w1, [a+32]; ld.global.nc.u16 w2, [a+64];"
    " ld.global.nc.u16 w3, [a+96]; prmt.b32 t0, w0, w1, 0x5140; prmt.b32 t1, w2, w3, 0x5140;"
    " prmt.b32 $0, t0, t1, 0x5410; prmt.b32 $1, t0, t1, 0x7632; }")


@gluon.jit
def _unpack2(packed, SHIFT: gl.constexpr):
    """uint8 tile -> int8 codes of bit plane SHIFT (0..3), 4 per register: shift and mask."""
    if SHIFT == 0:
        asm: gl.constexpr = _UNPACK2_S0
    elif SHIFT == 2:
        asm: gl.constexpr = _UNPACK2_S2
    elif SHIFT == 4:
        asm: gl.constexpr = _UNPACK2_S4
    else:
        asm: gl.constexpr = _UNPACK2_S6
    return gl.inline_asm_elementwise(asm, "=r,r", [packed], dtype=gl.int8, is_pure=True, pack=4)


@gluon.jit
def _perm(r):
    """Row r of a [32, .] V^T operand holds code byte 16 (r // 16) + 2 (r % 8) + (r % 16) // 8 (rows r and
    r + 8 adjacent bytes)."""
    return 16 * (r // 16) + 2 * (r % 8) + (r % 16) // 8


@gluon.jit
def _hack_kcodes(s0, end, kc, D: gl.constexpr, MASKED: gl.constexpr):
    """K code bytes [64, 32] of the 64-token tile from s0, tokens on M; MASKED: tokens >= end read as 0."""
    BT: gl.constexpr = 64
    W: gl.constexpr = D // 4
    mma: gl.constexpr = gl.NVMMADistributedLayout(version=[2, 0], warps_per_cta=[1, 1], instr_shape=[16, 8])
    a4: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=mma, k_width=4)
    tk = s0 + gl.arange(0, BT, layout=gl.SliceLayout(1, a4))
    kj = gl.arange(0, W, layout=gl.SliceLayout(0, a4))
    if MASKED:
        kb = gl.load(kc + tk[:, None] * W + kj[None, :], mask=(tk < end)[:, None], other=0)
    else:
        kb = gl.load(kc + tk[:, None] * W + kj[None, :])
    return kb


@gluon.jit
def _hack_vcodes(s0, end, vc, D: gl.constexpr, MASKED: gl.constexpr):
    """V^T code bytes [32, 64] of the tile from s0 (rows in _perm order); MASKED: tokens >= end read as 0."""
    BT: gl.constexpr = 64
    W: gl.constexpr = D // 4
    mma: gl.constexpr = gl.NVMMADistributedLayout(version=[2, 0], warps_per_cta=[1, 1], instr_shape=[16, 8])
    a4: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=mma, k_width=4)
    ch = _perm(gl.arange(0, W, layout=gl.SliceLayout(1, a4)))
    tv = gl.arange(0, BT, layout=gl.SliceLayout(0, a4))
    if MASKED:
        vb = gl.load(vc + (s0 + tv)[None, :] * W + ch[:, None], mask=(s0 + tv < end)[None, :], other=0)
    else:
        voff = (tv - tv % 4)[None, :] * W + (ch - ch % 2)[:, None]
        vb = gl.inline_asm_elementwise(_LDV8_ASM, "=r,=r,r,r,r,r,r,r,r,r,l,l,l,l,l,l,l,l",
                                       [voff, gl.full([W, BT], 0, gl.int64, layout=a4)
                                        + (vc + s0 * W).to(gl.int64, bitcast=True)],
                                       dtype=gl.uint8, is_pure=True, pack=8)
    return vb


_PREFETCH_ASM = gl.constexpr("mov.u32 $0, 0; prefetch.global.L1 [$1];")


@gluon.jit
def _prefetch_tile(s0, kc, vc, kmn, ksc, ksm, VMN, VSC, VSM, mbase, D: gl.constexpr, PI: gl.constexpr,
                   META: gl.constexpr):
    """L1 prefetch of the 64-token tile from s0: its K and V code bytes (2 KB each, one 128-byte line
    per lane) and, META, its K and V metadata (one line per lane for lanes 0..11).  One instruction per
    lane instead of carrying the next tile's bytes in registers (a loop-carried uint8 tile takes a
    register per byte: 254 registers, run-free offline compile)."""
    W: gl.constexpr = D // 4
    NP: gl.constexpr = D // PI
    lane_l: gl.constexpr = gl.BlockedLayout([1], [32], [1], [0])
    ln = gl.arange(0, 32, layout=lane_l)
    line = (ln % 16).to(gl.int64) * 128
    kadr = (kc + s0 * W).to(gl.int64, bitcast=True)
    vadr = (vc + s0 * W).to(gl.int64, bitcast=True)
    adr = gl.where(ln < 16, kadr, vadr) + line
    gl.inline_asm_elementwise(_PREFETCH_ASM, "=r,l", [adr], dtype=gl.int32, is_pure=False, pack=1)
    if META:
        half = (ln % 2).to(gl.int64) * 128
        moff = mbase + (s0 // PI) * D
        a0 = gl.where(ln < 2, (kmn + s0 * NP).to(gl.int64, bitcast=True),
                      gl.where(ln < 4, (ksc + s0 * NP).to(gl.int64, bitcast=True),
                               gl.where(ln < 6, (VMN + moff).to(gl.int64, bitcast=True),
                                        (VSC + moff).to(gl.int64, bitcast=True))))
        a1 = gl.where(ln < 10, a0 + half, gl.where(ln < 11, (ksm + s0 * NP).to(gl.int64, bitcast=True),
                                                   (VSM + moff).to(gl.int64, bitcast=True)))
        gl.inline_asm_elementwise(_PREFETCH_ASM, "=r,l", [gl.where(ln < 12, a1, adr)], dtype=gl.int32,
                                  is_pure=False, pack=1)


@gluon.jit
def _kring_copy(kring, slot, s0, lim, kc, D: gl.constexpr):
    """cp.async (LDGSTS, 16 bytes per lane and copy) of the K code bytes [64, 32] of the tile from s0
    into slot `slot` of the shared-memory ring, as one commit group; a tile at or past lim is not read
    (its copies are masked off), so every iteration commits one group."""
    W: gl.constexpr = D // 4
    cp_l: gl.constexpr = gl.BlockedLayout([1, 16], [16, 2], [1, 1], [1, 0])
    t = s0 + gl.arange(0, 64, layout=gl.SliceLayout(1, cp_l))
    j = gl.arange(0, W, layout=gl.SliceLayout(0, cp_l))
    async_copy.async_copy_global_to_shared(kring.index(slot), kc + t[:, None] * W + j[None, :],
                                           mask=(t < lim)[:, None])
    async_copy.commit_group()


@gluon.jit
def _hack_tile(s0, end, LV, m_i, l_i, o0, o1, o2, o3, qi0, qi1, qi2, qi3, aq, beta, gm0, gm1,
               kb, vb, kmn, ksc, ksm, vc, VMN, VSC, VSM, vt_ptr, mbase,
               D: gl.constexpr, PI: gl.constexpr, USE_SE: gl.constexpr, MASKED: gl.constexpr,
               TAIL: gl.constexpr, VIN: gl.constexpr, VUN: gl.constexpr = False, VPAIR: gl.constexpr = False,
               SFOLD: gl.constexpr = False):
    """One 64-token tile (one V block) from s0 with its K code bytes kb (_hack_kcodes); tokens >= end
    masked (MASKED: also their V code bytes read as 0, for the stored-sum identities); VIN: the V code
    bytes loaded here, after the softmax (program order, which ptxas keeps: fewer live registers), else
    vb (_hack_vcodes, loaded ahead); TAIL: V is the FP16 tail (rows t - LV of vt_ptr) and P stays FP32
    x255, as the row-packed kernel does; VUN: V planes 1 and 2 unshifted (x4, x16; the factor comes off
    the V scale, _hack_v); VPAIR: the V block's metadata by pairs of channels (_vmeta); SFOLD: the
    softmax over x * aq without forming it, and no mask on full tiles (_softmax_scaled)."""
    BT: gl.constexpr = 64
    W: gl.constexpr = D // 4
    NP: gl.constexpr = D // PI
    mma: gl.constexpr = gl.NVMMADistributedLayout(version=[2, 0], warps_per_cta=[1, 1], instr_shape=[16, 8])
    a4: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=mma, k_width=4)
    b4: gl.constexpr = gl.DotOperandLayout(operand_index=1, parent=mma, k_width=4)
    a2: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=mma, k_width=2)
    b2: gl.constexpr = gl.DotOperandLayout(operand_index=1, parent=mma, k_width=2)
    tok_c: gl.constexpr = gl.SliceLayout(1, mma)
    # ---- K'' [64, 32] per channel group, tokens on M
    k0 = _unpack2(kb, 0)
    k1 = _unpack2(kb, 2)
    k2 = _unpack2(kb, 4)
    k3 = _unpack2(kb, 6)
    zi = gl.zeros([BT, 8], gl.int32, layout=mma)
    i0 = mma_v2(k1, qi1, mma_v2(k0, qi0, zi))
    i1 = mma_v2(k3, qi3, mma_v2(k2, qi2, zi))
    # per-token (partition 0, partition 1) metadata pairs in one load each: a [64, 2] tile whose rows
    # sit where the accumulator's rows do (PAIR_L), split into the two partitions
    pair_l: gl.constexpr = gl.DistributedLinearLayout(
        reg_bases=[[0, 1], [8, 0], [16, 0], [32, 0]], lane_bases=[[0, 0], [0, 0], [1, 0], [2, 0], [4, 0]],
        warp_bases=[], block_bases=[], shape=[BT, 2])
    prow_ = s0 + gl.arange(0, BT, layout=gl.SliceLayout(1, pair_l))
    pcol = gl.arange(0, 2, layout=gl.SliceLayout(0, pair_l))
    poff = prow_[:, None] * NP + pcol[None, :]
    sk0, sk1 = gl.split(gl.load(ksc + poff).to(gl.float32))
    mk0, mk1 = gl.split(gl.load(kmn + poff).to(gl.float32))
    sk0 = gl.convert_layout(sk0, tok_c)
    sk1 = gl.convert_layout(sk1, tok_c)
    mk0 = gl.convert_layout(mk0, tok_c)
    mk1 = gl.convert_layout(mk1, tok_c)
    if USE_SE:
        ks0, ks1 = gl.split(gl.load(ksm + poff).to(gl.float32))
        ks0 = gl.expand_dims(gl.convert_layout(ks0, tok_c), 1)
        ks1 = gl.expand_dims(gl.convert_layout(ks1, tok_c), 1)
    else:   # code sums of each token's partitions on the tensor cores (ones as B)
        ones = gl.full([W, 8], 1, gl.int8, layout=b4)
        ks0 = mma_v2(k1, ones, mma_v2(k0, ones, zi)).to(gl.float32)
        ks1 = mma_v2(k3, ones, mma_v2(k2, ones, zi)).to(gl.float32)
    bt = gl.expand_dims(beta, 0)
    x = gl.expand_dims(sk0, 1) * (i0.to(gl.float32) + bt * ks0) + gl.expand_dims(gm0, 0) * gl.expand_dims(mk0, 1)
    x = x + gl.expand_dims(sk1, 1) * (i1.to(gl.float32) + bt * ks1) + gl.expand_dims(gm1, 0) * gl.expand_dims(mk1, 1)
    if SFOLD:
        m_new, alpha, p = _softmax_scaled(x, aq, s0, end, m_i, MASKED or TAIL)
    else:
        m_new, alpha, p = _softmax_step(x * gl.expand_dims(aq, 0), s0, end, m_i)
    al = gl.expand_dims(alpha, 0)
    vr = gl.arange(0, W, layout=gl.SliceLayout(1, a4))
    ch = _perm(vr)
    if TAIL:
        # the FP16 tail (RQE): P unrounded x255 in FP16, V^T_c [32, 64] FP16
        pf = p * 255.0
        l_i = l_i * al + gl.expand_dims(gl.sum(pf, 0), 0)
        pt = gl.convert_layout(pf.to(gl.float16), b2)
        tv = s0 + gl.arange(0, BT, layout=gl.SliceLayout(0, a2))
        vrow = gl.arange(0, W, layout=gl.SliceLayout(1, a2))
        vp = vt_ptr + (tv - LV)[None, :] * D + _perm(vrow)[:, None]
        vm = (tv < end)[None, :]
        o0 = mma_v2(gl.load(vp, mask=vm, other=0.0), pt, o0 * al)
        o1 = mma_v2(gl.load(vp + W, mask=vm, other=0.0), pt, o1 * al)
        o2 = mma_v2(gl.load(vp + 2 * W, mask=vm, other=0.0), pt, o2 * al)
        o3 = mma_v2(gl.load(vp + 3 * W, mask=vm, other=0.0), pt, o3 * al)
    else:
        # P'' = round(255 p) - 128 (INT8, one FMA: the low byte of the float), u = P'' + 128
        bits = (p * 255.0 + 12583040.0).to(gl.int32, bitcast=True)
        p8 = bits.to(gl.int8)
        pt = gl.convert_layout(p8, b4)
        # sum over the tile's tokens of u = P'' + 128 on the tensor cores (ones as A): [32, 8], every row
        us = (mma_v2(gl.full([W, BT], 1, gl.int8, layout=a4), pt, gl.zeros([W, 8], gl.int32, layout=mma))
              + 128 * BT).to(gl.float32)
        l_i = l_i * al + us
        if VIN:
            vb = _hack_vcodes(s0, end, vc, D, MASKED)
        moff = mbase + (s0 // PI) * D + gl.convert_layout(ch, tok_c)
        o0 = _hack_v(o0, al, us, _unpack2(vb, 0), pt, VMN, VSC, VSM, moff, USE_SE, 1, VPAIR)
        if VUN:
            o1 = _hack_v(o1, al, us, _mask2(vb, 2), pt, VMN, VSC, VSM, moff + W, USE_SE, 4, VPAIR)
            o2 = _hack_v(o2, al, us, _mask2(vb, 4), pt, VMN, VSC, VSM, moff + 2 * W, USE_SE, 16, VPAIR)
        else:
            o1 = _hack_v(o1, al, us, _unpack2(vb, 2), pt, VMN, VSC, VSM, moff + W, USE_SE, 1, VPAIR)
            o2 = _hack_v(o2, al, us, _unpack2(vb, 4), pt, VMN, VSC, VSM, moff + 2 * W, USE_SE, 1, VPAIR)
        o3 = _hack_v(o3, al, us, _unpack2(vb, 6), pt, VMN, VSC, VSM, moff + 3 * W, USE_SE, 1, VPAIR)
    return m_new, l_i, o0, o1, o2, o3


_MASK2_S2 = gl.constexpr("and.b32 $0, $1, 0x0C0C0C0C;")
_MASK2_S4 = gl.constexpr("and.b32 $0, $1, 0x30303030;")


@gluon.jit
def _mask2(packed, SHIFT: gl.constexpr):
    """uint8 tile -> int8 codes of bit plane SHIFT (2 or 4) left in place: 4 or 16 times the code, one AND."""
    if SHIFT == 2:
        asm: gl.constexpr = _MASK2_S2
    else:
        asm: gl.constexpr = _MASK2_S4
    return gl.inline_asm_elementwise(asm, "=r,r", [packed], dtype=gl.int8, is_pure=True, pack=4)


_LD2H_ASM = gl.constexpr("ld.global.nc.b32 $0, [$1];")
_LD2B_ASM = gl.constexpr("ld.global.nc.u16 $0, [$1];")


@gluon.jit
def _vmeta(ptr, HALF: gl.constexpr, VPAIR: gl.constexpr):
    """gl.load(ptr) of the V block's metadata for the V operand's rows (SliceLayout(1, mma)); VPAIR: a
    lane's registers hold rows r, r + 8, whose channels are adjacent (_perm), so one 32-bit load per FP16
    pair (HALF) or 16-bit per uint8 pair instead of one load per value."""
    if not VPAIR:
        return gl.load(ptr)
    a = ptr.to(gl.int64, bitcast=True)
    if HALF:
        return gl.inline_asm_elementwise(_LD2H_ASM, "=r,l,l", [a], dtype=gl.float16, is_pure=True, pack=2)
    else:
        return gl.inline_asm_elementwise(_LD2B_ASM, "=h,l,l", [a], dtype=gl.uint8, is_pure=True, pack=2)


@gluon.jit
def _hack_v(o, al, us, vq, pt, VMN, VSC, VSM, moff, USE_SE: gl.constexpr, F: gl.constexpr = 1,
            VPAIR: gl.constexpr = False):
    """o <- alpha o + sv (P''V'' + 128 sum v'') + mv sum u for one channel group (rows = channels moff);
    vq holds F times the codes (F = 4, 16: planes left unshifted), so sv / F scales the product."""
    mma: gl.constexpr = gl.NVMMADistributedLayout(version=[2, 0], warps_per_cta=[1, 1], instr_shape=[16, 8])
    b4: gl.constexpr = gl.DotOperandLayout(operand_index=1, parent=mma, k_width=4)
    zi = gl.zeros([vq.shape[0], 8], gl.int32, layout=mma)
    acc = mma_v2(vq, pt, zi)
    if USE_SE:
        vs = gl.expand_dims(_vmeta(VSM + moff, False, VPAIR).to(gl.int32), 1) * (128 * F)
    else:   # the code sums of vq, F times the codes' already
        vs = mma_v2(vq, gl.full([vq.shape[1], 8], 1, gl.int8, layout=b4), zi) * 128
    sv = _vmeta(VSC + moff, True, VPAIR).to(gl.float32)
    mv = _vmeta(VMN + moff, True, VPAIR).to(gl.float32)
    if F != 1:
        sv = sv * (1.0 / F)
    return o * al + gl.expand_dims(sv, 1) * (acc + vs).to(gl.float32) + gl.expand_dims(mv, 1) * us


@gluon.jit
def _hack_mma_kernel(Q, KC, KMN, KSC, KSM, VC, VMN, VSC, VSM, VT, LENS, OP, LSEP,
                     qk_scale, HKV, LMAX, NBLK, TPS, NSPLIT,
                     G: gl.constexpr, D: gl.constexpr, PI: gl.constexpr, HAS_TAIL: gl.constexpr,
                     USE_SE: gl.constexpr, UNROLL: gl.constexpr = 1, PREFETCH: gl.constexpr = 0,
                     RING: gl.constexpr = 0, VUN: gl.constexpr = False, VPAIR: gl.constexpr = False,
                     SFOLD: gl.constexpr = False):
    BT: gl.constexpr = 64
    W: gl.constexpr = D // 4
    gl.static_assert(D == 128)
    gl.static_assert(G == 8)
    gl.static_assert(PI == 64)
    mma: gl.constexpr = gl.NVMMADistributedLayout(version=[2, 0], warps_per_cta=[1, 1], instr_shape=[16, 8])
    b4: gl.constexpr = gl.DotOperandLayout(operand_index=1, parent=mma, k_width=4)
    col_l: gl.constexpr = gl.SliceLayout(0, mma)
    hq_l: gl.constexpr = gl.SliceLayout(0, b4)
    bh, split, L, LV, start, end, qrow0 = _split_range(LENS, HKV, TPS, G, PI, HAS_TAIL)
    # ---- Q rounded to 8 bits per query head (q'' = code - 128), as q_round_rows in hack_decode_rp.py
    qk = gl.arange(0, W, layout=gl.SliceLayout(1, b4))
    qh = gl.arange(0, G, layout=hq_l)
    qp = Q + (qrow0 + qh)[None, :] * D + qk[:, None]
    q0 = gl.load(qp).to(gl.float32)
    q1 = gl.load(qp + W).to(gl.float32)
    q2 = gl.load(qp + 2 * W).to(gl.float32)
    q3 = gl.load(qp + 3 * W).to(gl.float32)
    mn = gl.minimum(gl.minimum(gl.min(q0, 0), gl.min(q1, 0)), gl.minimum(gl.min(q2, 0), gl.min(q3, 0)))
    mx = gl.maximum(gl.maximum(gl.max(q0, 0), gl.max(q1, 0)), gl.maximum(gl.max(q2, 0), gl.max(q3, 0)))
    sq = (mx - mn) / 255.0
    sq = gl.where(sq > 0, sq, 1.0)
    inv = gl.expand_dims(1.0 / sq, 0)
    mn2 = gl.expand_dims(mn, 0)
    c0 = gl.minimum(gl.maximum(gl.floor((q0 - mn2) * inv + 0.5), 0.0), 255.0) - 128.0
    c1 = gl.minimum(gl.maximum(gl.floor((q1 - mn2) * inv + 0.5), 0.0), 255.0) - 128.0
    c2 = gl.minimum(gl.maximum(gl.floor((q2 - mn2) * inv + 0.5), 0.0), 255.0) - 128.0
    c3 = gl.minimum(gl.maximum(gl.floor((q3 - mn2) * inv + 0.5), 0.0), 255.0) - 128.0
    beta_q = mn / sq + 128.0
    gm0 = gl.convert_layout(gl.sum(c0, 0) + gl.sum(c1, 0) + PI * beta_q, col_l)
    gm1 = gl.convert_layout(gl.sum(c2, 0) + gl.sum(c3, 0) + PI * beta_q, col_l)
    beta = gl.convert_layout(beta_q, col_l)
    aq = gl.convert_layout(sq * qk_scale, col_l)
    qi0 = c0.to(gl.int8)
    qi1 = c1.to(gl.int8)
    qi2 = c2.to(gl.int8)
    qi3 = c3.to(gl.int8)
    kc, kmn, ksc, ksm, vc, mbase, vt_ptr = _cache_bases(KC, KMN, KSC, KSM, VC, VT, bh, LMAX, NBLK, D, PI)
    m_i = gl.full([G], float("-inf"), gl.float32, layout=col_l)
    l_i = gl.zeros([W, G], gl.float32, layout=mma)   # the denominator x255, every row the same
    o0 = gl.zeros([W, G], gl.float32, layout=mma)
    o1 = gl.zeros([W, G], gl.float32, layout=mma)
    o2 = gl.zeros([W, G], gl.float32, layout=mma)
    o3 = gl.zeros([W, G], gl.float32, layout=mma)
    end_full = start + gl.maximum(end - start, 0) // BT * BT
    if UNROLL == 2:   # two tiles per iteration in one basic block (both tiles' code bytes loaded first)
        end_two = start + (end_full - start) // (2 * BT) * (2 * BT)
        for s0 in range(start, end_two, 2 * BT):
            ka = _hack_kcodes(s0, end, kc, D, False)
            va = _hack_vcodes(s0, end, vc, D, False)
            kb = _hack_kcodes(s0 + BT, end, kc, D, False)
            vb = _hack_vcodes(s0 + BT, end, vc, D, False)
            m_i, l_i, o0, o1, o2, o3 = _hack_tile(s0, end, LV, m_i, l_i, o0, o1, o2, o3, qi0, qi1, qi2, qi3, aq,
                                                  beta, gm0, gm1, ka, va, kmn, ksc, ksm, vc, VMN, VSC, VSM, vt_ptr,
                                                  mbase, D, PI, USE_SE, False, False, False, VUN, VPAIR, SFOLD)
            m_i, l_i, o0, o1, o2, o3 = _hack_tile(s0 + BT, end, LV, m_i, l_i, o0, o1, o2, o3, qi0, qi1, qi2, qi3,
                                                  aq, beta, gm0, gm1, kb, vb, kmn, ksc, ksm, vc, VMN, VSC, VSM,
                                                  vt_ptr, mbase, D, PI, USE_SE, False, False, False, VUN, VPAIR, SFOLD)
        start = end_two
    if RING > 0:   # K code bytes through a RING-slot shared-memory ring by cp.async, RING - 1 tiles ahead
        a4: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=mma, k_width=4)
        kring = gl.allocate_shared_memory(gl.uint8, [RING, BT, W], gl.SwizzledSharedLayout(1, 1, 1, order=[1, 0]))
        for i in gl.static_range(RING - 1):
            _kring_copy(kring, i, start + i * BT, end_full, kc, D)
    last = gl.maximum(end_full - BT, start)
    it = 0
    for s0 in range(start, end_full, BT):
        if RING > 0:
            _kring_copy(kring, (it + RING - 1) % RING, s0 + (RING - 1) * BT, end_full, kc, D)
        if PREFETCH > 0:   # an L1 prefetch of the next tile (the last one's clamped to itself): its code bytes
            # (with the ring, the V ones) and, PREFETCH 2, its metadata
            _prefetch_tile(gl.minimum(s0 + BT, last), kc, vc, kmn, ksc, ksm, VMN, VSC, VSM, mbase, D, PI,
                           PREFETCH == 2)
        if RING > 0:
            async_copy.wait_group(RING - 1)
            kb = kring.index(it % RING).load(a4)
        else:
            kb = _hack_kcodes(s0, end, kc, D, False)
        m_i, l_i, o0, o1, o2, o3 = _hack_tile(s0, end, LV, m_i, l_i, o0, o1, o2, o3, qi0, qi1, qi2, qi3, aq, beta,
                                              gm0, gm1, kb, 0, kmn, ksc, ksm, vc, VMN, VSC, VSM, vt_ptr, mbase, D, PI,
                                              USE_SE, False, False, True, VUN, VPAIR, SFOLD)
        it += 1
    if RING > 0:
        async_copy.wait_group(0)
    if end_full < end:   # the last partial block of a cache without the FP16 tail
        m_i, l_i, o0, o1, o2, o3 = _hack_tile(end_full, end, LV, m_i, l_i, o0, o1, o2, o3, qi0, qi1, qi2, qi3, aq,
                                              beta, gm0, gm1, _hack_kcodes(end_full, end, kc, D, True), 0, kmn, ksc,
                                              ksm, vc, VMN, VSC, VSM, vt_ptr, mbase, D, PI, USE_SE, True, False, True, VUN, VPAIR, SFOLD)
    if HAS_TAIL:
        if (split == NSPLIT - 1) & (L > LV):
            m_i, l_i, o0, o1, o2, o3 = _hack_tile(LV, L, LV, m_i, l_i, o0, o1, o2, o3, qi0, qi1, qi2, qi3, aq, beta,
                                                  gm0, gm1, _hack_kcodes(LV, L, kc, D, True), 0, kmn, ksc, ksm, vc,
                                                  VMN, VSC, VSM, vt_ptr, mbase, D, PI, USE_SE, True, True, True, VUN, VPAIR, SFOLD)
    prow, inv_l = _store_lse(LSEP, qrow0, split, NSPLIT, gl.max(l_i, 0), m_i, G)
    _store_o4(OP, prow, inv_l, o0, o1, o2, o3, D, True)


# the HACK kernel's launch defaults (runs 44-45, 32K, batch 8): the next tile's code bytes prefetched into L1
# and registers capped at 168 (12 one-warp programs per SM): 87.6 / 91.7 us with stored sums, 90.5 without,
# 112.3 without the FP16 tail; uncapped 107.8 / 114.8 / 124.4 (168 / 182 / 167 registers); a cap of 128
# (16 programs per SM) 90.6-90.9 / 89.8-90.9 / 115.3; the prefetch without a cap 128.1 (180 registers: 8
# programs per SM); 96 registers (20 per SM, 72+ bytes spilled) 107.5-116.0
HACK_MAXNREG = 168
HACK_PREFETCH = 1
# V planes 1-2 unshifted and the V metadata by channel pairs (run 57: -39 loop instructions of 1,151 offline;
# 32K: 84.7 / 81.9 us against 90.2 / 86.9 in the same call, no SE 85.9 vs 90.4, 8K 32.2 vs 33.6)
HACK_VUN = True
HACK_VPAIR = True
HACK_SFOLD = False


def hack_supported_gluon(q: torch.Tensor, cache: QuantKVCache) -> bool:
    """The shapes the Gluon HACK kernel takes: 2-bit codes, head_dim 128, PI 64, 8 query heads per KV head."""
    return gluon_supported(q, cache) and cache.partition == 64


def hack_attn_decode_gluon(q: torch.Tensor, cache: QuantKVCache, use_se: bool = True, splits: int | None = None,
                           max_len: int | None = None, maxnreg: int | None = None, unroll: int = 1,
                           prefetch: int = HACK_PREFETCH, ring: int = 0, vun: bool = HACK_VUN,
                           vpair: bool = HACK_VPAIR, sfold: bool = HACK_SFOLD) -> torch.Tensor:
    """HACK decode attention on the one-warp mma.sync kernel; q [B, HQ, D] fp16 (already appended).
    maxnreg: a register cap (None: HACK_MAXNREG; 0: none).  unroll 2: two tiles per loop iteration;
    prefetch: an L1 prefetch of the next tile's code bytes (1) and metadata (2) before each tile;
    ring: the K code bytes through a shared-memory ring of that many slots by cp.async (0: off);
    vun: V planes 1-2 used unshifted (x4, x16, the factor taken off the V scale); vpair: the V block's
    metadata loaded by pairs of channels; sfold: the softmax without the score scaling pass and without
    the mask on full tiles.
    splits default: one wave (wave_splits)."""
    from .hack_attn_decode import run_split_decode

    b, hkv, lmax, d = cache.shape
    g = cache.query_group(q)
    if not hack_supported_gluon(q, cache):
        raise ValueError("the Gluon HACK kernel takes 2-bit codes, head_dim 128, PI 64 and 8 query heads per KV head")
    max_len = lmax if max_len is None else max_len
    qk_scale = 1.0 / math.sqrt(d) * 1.4426950408889634
    q = q.contiguous()
    if unroll not in (1, 2) or prefetch not in (0, 1, 2) or ring not in (0, 2, 3, 4) or (ring and unroll == 2):
        raise ValueError(f"unroll {unroll} (1 or 2), prefetch {prefetch} (0, 1 or 2), ring {ring} (0, 2-4; "
                         "not with unroll 2)")
    consts = dict(G=g, D=d, PI=cache.partition, HAS_TAIL=cache.rqe, USE_SE=use_se, UNROLL=unroll, PREFETCH=prefetch,
                  RING=ring, VUN=bool(vun), VPAIR=bool(vpair), SFOLD=bool(sfold))
    maxnreg = HACK_MAXNREG if maxnreg is None else maxnreg
    opts = {"maxnreg": maxnreg} if maxnreg else {}

    def args(op, lsep, tps, n):
        return (q, cache.k_codes, cache.k_min, cache.k_scale, cache.k_sum, cache.v_codes, cache.v_min,
                cache.v_scale, cache.v_sum, cache.v_tail, cache.lens, op, lsep, qk_scale, hkv, lmax,
                cache.v_min.shape[2], tps, n)

    if splits is None:   # one wave of programs (wave_splits), from the compiled kernel's registers
        def probe_args():
            probe = torch.empty(1, dtype=torch.float32, device=q.device)
            return args(probe, probe, 64 * 3, 3)

        splits = wave_splits(b, hkv, max_len, _hack_mma_kernel, probe_args, consts, options=opts)
    tps = triton.cdiv(triton.cdiv(max_len, splits), 64) * 64
    splits = triton.cdiv(max_len, tps)

    def launch(op, lsep):
        LAST_KERNEL["hack", use_se, cache.rqe, unroll, prefetch, maxnreg, ring, bool(vun), bool(vpair),
                    bool(sfold)] = _hack_mma_kernel[(b * hkv, splits)](
            *args(op, lsep, tps, splits), **consts, **opts, num_warps=1)

    return run_split_decode(launch, q, splits)
