"""Token-major decode attention in Gluon (explicit layouts): fused dequantize-then-attend and HACK.

The Triton kernels (head_major.py, hack_decode_rp.py) give the 8 query heads of a KV head a 16-row
mma.sync tile: half of every softmax step runs on padding rows (or a second copy of the group), and
operands pass through shared memory where Triton converts layouts.  Here the token axis is the
product's M and the 8 heads are its N = 8, so nothing is padded, and each program is ONE warp whose
operands stay in registers.  Two kernels (H200 figures at batch 8, 64/8 heads, head_dim 128, 32K
context, PI 64; DESIGN.md):

* ``_dequant_mma_kernel`` (fused dequant, the default on Hopper): mma.sync m16n8k16; S^T = K Q^T with
  K looked up into the A operand layout in registers (common.dequant_lut's table, one table per row
  pair: _lut), O^T = V^T P^T per channel group with V^T looked up the same way, P^T converted to the
  B layout.  The code bytes of an A-operand register (rows r, r + 8 x two consecutive K elements) come
  from two 16-bit inline-PTX loads (_ld_pack; V^T rows are permuted so rows r and r + 8 are adjacent
  bytes).  118.6 us against torch SDPA's 253.6 us (2.14x); the Triton kernel takes 149 us.
* ``_hack_mma_kernel`` (HACK, the default above 2K tokens on Hopper at PI 64 and GQA 8): the same
  layout with INT8 mma.sync m16n8k32, Q rounded per query head, the score terms applied in the
  accumulator layout, P'' by the magic-number FMA, P'' row sums and (without SE) code sums on the
  tensor cores, O and l x255, the FP16 tail (RQE) as the row-packed kernel does.  One wave of programs
  (wave_splits, from the compiled kernel's registers), an L1 prefetch of the next tile's code bytes,
  a 168-register cap, V planes 1-2 unshifted and the V metadata loaded by channel pairs: 83.5 us
  against SDPA's 253.3 (3.03x; the row-packed kernel 137.8).

Gluon has no interpreter: the kernels are checked against the references on a Hopper GPU
(tests/kernels/test_gluon_decode.py) and compiled for sm_90 offline in CI (tests/kernels/test_sass.py).
"""

from __future__ import annotations

import math

import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import mma_v2

from .common import LUT2_ASM, TABLE_ASM, UNPACK2_ASM
from .kv_cache import QuantKVCache
from .launch import DecodeConfig
from .split_k import default_splits, run_split_decode, tokens_per_split


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
    return (
        KC + tok0 * W,
        KMN + tok0 * NP,
        KSC + tok0 * NP,
        KSM + tok0 * NP,
        VC + tok0 * W,
        bh.to(gl.int64) * NBLK * D,
        VT + bh.to(gl.int64) * PI * D,
    )


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
def _store_o4(OP, prow, inv_l, o0, o1, o2, o3, D: gl.constexpr):
    """The four O^T channel groups [D / 4, G] divided by l, rows in _perm's channel order."""
    W: gl.constexpr = D // 4
    r = _perm(gl.arange(0, W, layout=gl.SliceLayout(1, o0.type.layout)))
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
def _lut(packed, SHIFT: gl.constexpr, lo, hi):
    """uint8 codes (bit plane SHIFT) in an mma A-operand layout -> FP16 by the 4-entry tables lo/hi
    (int32 tensors of packed's shape and layout): each pair of codes (one operand row) takes the table
    of its first."""
    if SHIFT == 0:
        asm: gl.constexpr = _LUT2P_S0
    elif SHIFT == 2:
        asm: gl.constexpr = _LUT2P_S2
    elif SHIFT == 4:
        asm: gl.constexpr = _LUT2P_S4
    else:
        asm: gl.constexpr = _LUT2P_S6
    return gl.inline_asm_elementwise(
        asm, "=r,=r,r,r,r,r,r,r,r,r,r", [packed, lo, hi], dtype=gl.float16, is_pure=True, pack=4
    )


_TABLE_G = gl.constexpr(TABLE_ASM)


@gluon.jit
def _table(scale, mn):
    """(lo, hi): FP16 values of codes 0,1 | 2,3 for FP16 scale and min (fma.rn.f16x2, one rounding)."""
    return gl.inline_asm_elementwise(
        _TABLE_G, "=r,=r,h,h", [scale, mn], dtype=(gl.int32, gl.int32), is_pure=True, pack=1
    )


def programs_per_sm(n_regs: int, num_warps: int = 1) -> int:
    """Resident programs per SM (sm_80/sm_90) for a kernel of n_regs registers per thread: registers are
    allocated 8 per thread at a time, and a warp's come from one of the SM's four 16K-register
    partitions (at 182 registers the SM's 64K would fit 11 warps, the partitions fit 8: on the H200 22
    splits took 157 us, 16 took 115); at most 64 warps and 32 programs."""
    regs_per_warp = -(-max(n_regs, 1) // 8) * 8 * 32
    warps_per_sm = 4 * (16384 // regs_per_warp)
    return max(1, min(32, 64 // num_warps, warps_per_sm // num_warps))


def one_wave_splits(batch: int, kv_heads: int, max_len: int, n_sm: int, per_sm: int, tile: int = 64) -> int:
    """Splits per (request, KV head) that make one wave of programs on n_sm SMs (on the H200 the HACK kernel
    at 168 registers fits 12 one-warp programs per SM, and 24 splits at batch 8 x 8 KV heads, 1,536
    programs, took 103 us where 33 splits, 1.33 waves, took 133); at least two tiles per split and at
    most 128 splits."""
    splits = max(1, (n_sm * per_sm) // (batch * kv_heads))
    return max(1, min(splits, 128, triton.cdiv(max_len, 2 * tile)))


_PER_SM: dict = {}


def wave_splits(
    batch: int,
    kv_heads: int,
    max_len: int,
    kernel_fn,
    make_args,
    constexprs: dict,
    num_warps: int = 1,
    tile: int = 64,
    options: dict | None = None,
) -> int:
    """one_wave_splits for a Gluon kernel, its registers read from the compiled kernel (warmup with the
    launch's compile options, e.g. maxnreg; make_args() gives representative launch arguments).  The
    programs per SM are cached per kernel variant and device, so a decode step pays this once."""
    dev = torch.cuda.current_device()
    key = (kernel_fn, tuple(sorted(constexprs.items())), tuple(sorted((options or {}).items())), num_warps, dev)
    if key not in _PER_SM:
        k = kernel_fn.warmup(*make_args(), **constexprs, **(options or {}), num_warps=num_warps, grid=(1,))
        k._init_handles()  # loads the module: n_regs comes from the driver
        _PER_SM[key] = (
            torch.cuda.get_device_properties(dev).multi_processor_count,
            programs_per_sm(k.n_regs, num_warps),
        )
    n_sm, per_sm = _PER_SM[key]
    return one_wave_splits(batch, kv_heads, max_len, n_sm, per_sm, tile)


def gluon_supported(q: torch.Tensor, cache: QuantKVCache) -> bool:
    """The shapes the Gluon kernel takes: 2-bit codes, head_dim 128, PI 64/128, 8 query heads per KV head."""
    b, hkv, _, d = cache.shape
    return cache.bits == 2 and d == 128 and cache.partition in (64, 128) and q.dim() == 3 and q.shape[1] == 8 * hkv


def _one_warp(config: DecodeConfig) -> None:
    if config.num_warps not in (None, 1):
        raise ValueError(f"num_warps {config.num_warps}: the Gluon decode kernels run one warp per program")


def dequant_attn_decode_gluon(
    q: torch.Tensor, cache: QuantKVCache, max_len: int | None = None, config: DecodeConfig = DecodeConfig()
) -> torch.Tensor:
    """Fused dequantize-then-attend decode on the one-warp mma.sync kernel, 64-token tiles.  q [B, HQ, D]
    fp16 (the new token's query, already appended) -> [B, HQ, D] fp16.  config.maxnreg: a register cap
    (none by default: 255 registers with the FP16 tail, 8 programs per SM); splits default: default_splits
    of 256 tokens."""
    b, hkv, lmax, d = cache.shape
    g = cache.query_group(q)
    if not gluon_supported(q, cache):
        raise ValueError(
            "the Gluon decode kernel takes 2-bit codes, head_dim 128, PI 64/128 and 8 query heads per KV head"
        )
    _one_warp(config)
    max_len = lmax if max_len is None else max_len
    tps, splits = tokens_per_split(max_len, config.splits or default_splits(b, hkv, max_len, 4 * 64, q.device), 64)
    qk_scale = 1.0 / math.sqrt(d) * 1.4426950408889634
    q = q.contiguous()

    def launch(op, lsep):
        _dequant_mma_kernel[(b * hkv, splits)](
            q,
            cache.k_codes,
            cache.k_min,
            cache.k_scale,
            cache.v_codes,
            cache.v_min,
            cache.v_scale,
            cache.v_tail,
            cache.lens,
            op,
            lsep,
            qk_scale,
            hkv,
            lmax,
            cache.v_min.shape[2],
            tps,
            splits,
            G=g,
            D=d,
            PI=cache.partition,
            HAS_TAIL=cache.rqe,
            num_warps=1,
            **({"maxnreg": config.maxnreg} if config.maxnreg else {}),
        )

    return run_split_decode(launch, q, splits)


# ----------------------------------------------------------------------------- one warp, mma.sync
# The same attention with mma.sync (m16n8k16) in one warp per program: S^T = K Q^T has the tokens
# on M and the 8 heads on N = 8, exactly mma.sync's n8 (no padding rows, no wgmma with a tiny N);
# O^T = V^T P^T per channel group, V^T on M.  Every operand stays in registers: the code bytes are
# loaded straight into the A operand layout and looked up there (_lut), Q^T and P^T are
# B operands.
# Four code bytes of an A-operand pack (rows r, r + 8 x two consecutive K elements) in two 16-bit
# loads and one byte permute.  The compiler's loads follow the operand layout's register order, whose
# neighbours are 32 bytes apart in memory (one byte each); these take the pair that is contiguous.
# Operands: $1 the pack's first byte offset from $5 (the 64-bit base); the other offsets are unused.
_LDPACK_ASM = (
    "{ .reg .u64 a; .reg .b32 x, y; cvt.u64.u32 a, $1; add.u64 a, a, $5;"
    " ld.global.nc.u16 x, [a]; ld.global.nc.u16 y, [a+DELTA]; prmt.b32 $0, x, y, SEL; }"
)
_LDPACK_K = gl.constexpr(_LDPACK_ASM.replace("DELTA", "256").replace("SEL", "0x5410"))  # (t, j..j+1), (t+8, ..)
_LDPACK_V = gl.constexpr(_LDPACK_ASM.replace("DELTA", "32").replace("SEL", "0x5140"))  # (t, b..b+1), (t+1, ..)


@gluon.jit
def _pairs_pv(o, al, vb, SHIFT: gl.constexpr, VSC, VMN, moff, pt):
    """o <- al o + V^T_c P^T for the V^T code bytes vb in an A-operand layout (bit plane SHIFT, the
    channels moff of one V block: their tables looked up per row pair)."""
    lo, hi = _table(gl.load(VSC + moff), gl.load(VMN + moff))
    lo = gl.broadcast(gl.expand_dims(lo, 1), vb)[0]
    hi = gl.broadcast(gl.expand_dims(hi, 1), vb)[0]
    return mma_v2(_lut(vb, SHIFT, lo, hi), pt, o * al)


@gluon.jit
def _ld_pack(off, base, ASM: gl.constexpr):
    return gl.inline_asm_elementwise(ASM, "=r,r,r,r,r,l,l,l,l", [off, base], dtype=gl.uint8, is_pure=True, pack=4)


@gluon.jit
def _mma_tile(
    s0,
    end,
    LV,
    m_i,
    l_acc,
    o0,
    o1,
    o2,
    o3,
    qt0,
    qt1,
    qt2,
    qt3,
    kc,
    kmn,
    ksc,
    vc,
    VMN,
    VSC,
    vt_ptr,
    mbase,
    BT: gl.constexpr,
    D: gl.constexpr,
    PI: gl.constexpr,
    TAIL: gl.constexpr,
):
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
    # tokens past `end` are read unmasked (inside the cache's capacity, a multiple of BT); their
    # scores are -inf below and their V rows meet P = 0
    r0 = gl.arange(0, BT, layout=row_a)
    koff = (r0 - (r0 % 16) // 8 * 8)[:, None] * W + (kj - kj % 2)[None, :]
    kb = _ld_pack(koff, gl.full([BT, W], 0, gl.int64, layout=a_l) + (kc + s0 * W).to(gl.int64, bitcast=True), _LDPACK_K)
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
    s = mma_v2(_lut(kb, 0, lo0, hi0), qt0, s)  # planes 0, 1: partition 0; 2, 3: the last
    s = mma_v2(_lut(kb, 2, lo0, hi0), qt1, s)  # (lo1 is lo0 when PI = 128)
    s = mma_v2(_lut(kb, 4, lo1, hi1), qt2, s)
    s = mma_v2(_lut(kb, 6, lo1, hi1), qt3, s)
    m_new, alpha, p = _softmax_step(s, s0, end, m_i)
    l_acc = l_acc * gl.expand_dims(alpha, 0) + p
    pt = gl.convert_layout(p.to(gl.float16), b_l)  # P^T [BT tokens (K), 8 heads (N)]
    al = gl.expand_dims(alpha, 0)
    # ---- O^T_c [32, 8] += V^T_c P^T per channel group c (V^T looked up in the A layout)
    tv = s0 + gl.arange(0, BT, layout=col_a)
    vr = gl.arange(0, W, layout=row_a)
    vmask = (tv < end)[None, :]
    vr = _perm(vr)  # the row -> channel order of the output
    if TAIL:
        vp = vt_ptr + (tv - LV)[None, :] * D + vr[:, None]
        o0 = mma_v2(gl.load(vp, mask=vmask, other=0.0), pt, o0 * al)
        o1 = mma_v2(gl.load(vp + W, mask=vmask, other=0.0), pt, o1 * al)
        o2 = mma_v2(gl.load(vp + 2 * W, mask=vmask, other=0.0), pt, o2 * al)
        o3 = mma_v2(gl.load(vp + 3 * W, mask=vmask, other=0.0), pt, o3 * al)
    else:
        # row r of V^T holds byte PERM(r) = 16 (r // 16) + 2 (r % 8) + (r % 16) // 8: rows r, r + 8
        # are adjacent bytes, one 16-bit load per token
        t0 = gl.arange(0, BT, layout=col_a)
        voff = (t0 - t0 % 2)[None, :] * W + (vr - vr % 2)[:, None]
        vb = _ld_pack(
            voff, gl.full([W, BT], 0, gl.int64, layout=a_l) + (vc + s0 * W).to(gl.int64, bitcast=True), _LDPACK_V
        )
        moff = mbase + (s0 // PI) * D + vr
        o0 = _pairs_pv(o0, al, vb, 0, VSC, VMN, moff, pt)
        o1 = _pairs_pv(o1, al, vb, 2, VSC, VMN, moff + W, pt)
        o2 = _pairs_pv(o2, al, vb, 4, VSC, VMN, moff + 2 * W, pt)
        o3 = _pairs_pv(o3, al, vb, 6, VSC, VMN, moff + 3 * W, pt)
    return m_new, l_acc, o0, o1, o2, o3


@gluon.jit
def _dequant_mma_kernel(
    Q,
    KC,
    KMN,
    KSC,
    VC,
    VMN,
    VSC,
    VT,
    LENS,
    OP,
    LSEP,
    qk_scale,
    HKV,
    LMAX,
    NBLK,
    TPS,
    NSPLIT,
    G: gl.constexpr,
    D: gl.constexpr,
    PI: gl.constexpr,
    HAS_TAIL: gl.constexpr,
):
    BT: gl.constexpr = 64
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
        m_i, l_acc, o0, o1, o2, o3 = _mma_tile(
            s0,
            end,
            LV,
            m_i,
            l_acc,
            o0,
            o1,
            o2,
            o3,
            qt0,
            qt1,
            qt2,
            qt3,
            kc,
            kmn,
            ksc,
            vc,
            VMN,
            VSC,
            vt_ptr,
            mbase,
            BT,
            D,
            PI,
            False,
        )
    if HAS_TAIL:
        if (split == NSPLIT - 1) & (L > LV):
            for s0 in range(LV, L, BT):
                m_i, l_acc, o0, o1, o2, o3 = _mma_tile(
                    s0,
                    L,
                    LV,
                    m_i,
                    l_acc,
                    o0,
                    o1,
                    o2,
                    o3,
                    qt0,
                    qt1,
                    qt2,
                    qt3,
                    kc,
                    kmn,
                    ksc,
                    vc,
                    VMN,
                    VSC,
                    vt_ptr,
                    mbase,
                    BT,
                    D,
                    PI,
                    True,
                )
    prow, inv_l = _store_lse(LSEP, qrow0, split, NSPLIT, gl.sum(l_acc, 0), m_i, G)
    _store_o4(OP, prow, inv_l, o0, o1, o2, o3, D)


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
    " prmt.b32 $0, t0, t1, 0x5410; prmt.b32 $1, t0, t1, 0x7632; }"
)


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
        vb = gl.inline_asm_elementwise(
            _LDV8_ASM,
            "=r,=r,r,r,r,r,r,r,r,r,l,l,l,l,l,l,l,l",
            [voff, gl.full([W, BT], 0, gl.int64, layout=a4) + (vc + s0 * W).to(gl.int64, bitcast=True)],
            dtype=gl.uint8,
            is_pure=True,
            pack=8,
        )
    return vb


_PREFETCH_ASM = gl.constexpr("mov.u32 $0, 0; prefetch.global.L1 [$1];")


@gluon.jit
def _prefetch_tile(s0, kc, vc, D: gl.constexpr):
    """L1 prefetch of the K and V code bytes (2 KB each, one 128-byte line per lane) of the 64-token
    tile from s0: one instruction per lane instead of carrying the next tile's bytes in registers (a
    loop-carried uint8 tile takes a register per byte: 254 registers)."""
    W: gl.constexpr = D // 4
    lane_l: gl.constexpr = gl.BlockedLayout([1], [32], [1], [0])
    ln = gl.arange(0, 32, layout=lane_l)
    line = (ln % 16).to(gl.int64) * 128
    kadr = (kc + s0 * W).to(gl.int64, bitcast=True)
    vadr = (vc + s0 * W).to(gl.int64, bitcast=True)
    adr = gl.where(ln < 16, kadr, vadr) + line
    gl.inline_asm_elementwise(_PREFETCH_ASM, "=r,l", [adr], dtype=gl.int32, is_pure=False, pack=1)


@gluon.jit
def _hack_tile(
    s0,
    end,
    LV,
    m_i,
    l_i,
    o0,
    o1,
    o2,
    o3,
    qi0,
    qi1,
    qi2,
    qi3,
    aq,
    beta,
    gm0,
    gm1,
    kb,
    kmn,
    ksc,
    ksm,
    vc,
    VMN,
    VSC,
    VSM,
    vt_ptr,
    mbase,
    D: gl.constexpr,
    PI: gl.constexpr,
    USE_SE: gl.constexpr,
    MASKED: gl.constexpr,
    TAIL: gl.constexpr,
):
    """One 64-token tile (one V block) from s0 with its K code bytes kb (_hack_kcodes); tokens >= end
    masked (MASKED: also their V code bytes read as 0, for the stored-sum identities).  The V code bytes
    are loaded after the softmax (program order, which ptxas keeps: fewer live registers); V planes 1
    and 2 are used unshifted (x4, x16; the factor comes off the V scale, _hack_v) and the V block's
    metadata is loaded by pairs of channels (_vmeta).  TAIL: V is the FP16 tail (rows t - LV of vt_ptr)
    and P stays FP32 x255, as the row-packed kernel does."""
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
        reg_bases=[[0, 1], [8, 0], [16, 0], [32, 0]],
        lane_bases=[[0, 0], [0, 0], [1, 0], [2, 0], [4, 0]],
        warp_bases=[],
        block_bases=[],
        shape=[BT, 2],
    )
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
    else:  # code sums of each token's partitions on the tensor cores (ones as B)
        ones = gl.full([W, 8], 1, gl.int8, layout=b4)
        ks0 = mma_v2(k1, ones, mma_v2(k0, ones, zi)).to(gl.float32)
        ks1 = mma_v2(k3, ones, mma_v2(k2, ones, zi)).to(gl.float32)
    bt = gl.expand_dims(beta, 0)
    x = gl.expand_dims(sk0, 1) * (i0.to(gl.float32) + bt * ks0) + gl.expand_dims(gm0, 0) * gl.expand_dims(mk0, 1)
    x = x + gl.expand_dims(sk1, 1) * (i1.to(gl.float32) + bt * ks1) + gl.expand_dims(gm1, 0) * gl.expand_dims(mk1, 1)
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
        us = (
            mma_v2(gl.full([W, BT], 1, gl.int8, layout=a4), pt, gl.zeros([W, 8], gl.int32, layout=mma)) + 128 * BT
        ).to(gl.float32)
        l_i = l_i * al + us
        vb = _hack_vcodes(s0, end, vc, D, MASKED)
        moff = mbase + (s0 // PI) * D + gl.convert_layout(ch, tok_c)
        o0 = _hack_v(o0, al, us, _unpack2(vb, 0), pt, VMN, VSC, VSM, moff, USE_SE, 1)
        o1 = _hack_v(o1, al, us, _mask2(vb, 2), pt, VMN, VSC, VSM, moff + W, USE_SE, 4)
        o2 = _hack_v(o2, al, us, _mask2(vb, 4), pt, VMN, VSC, VSM, moff + 2 * W, USE_SE, 16)
        o3 = _hack_v(o3, al, us, _unpack2(vb, 6), pt, VMN, VSC, VSM, moff + 3 * W, USE_SE, 1)
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
def _vmeta(ptr, HALF: gl.constexpr):
    """The V block's metadata at ptr for the V operand's rows (SliceLayout(1, mma)): a lane's registers
    hold rows r, r + 8, whose channels are adjacent (_perm), so one 32-bit load per FP16 pair (HALF) or
    16-bit per uint8 pair instead of one load per value."""
    a = ptr.to(gl.int64, bitcast=True)
    if HALF:
        return gl.inline_asm_elementwise(_LD2H_ASM, "=r,l,l", [a], dtype=gl.float16, is_pure=True, pack=2)
    else:
        return gl.inline_asm_elementwise(_LD2B_ASM, "=h,l,l", [a], dtype=gl.uint8, is_pure=True, pack=2)


@gluon.jit
def _hack_v(o, al, us, vq, pt, VMN, VSC, VSM, moff, USE_SE: gl.constexpr, F: gl.constexpr):
    """o <- alpha o + sv (P''V'' + 128 sum v'') + mv sum u for one channel group (rows = channels moff);
    vq holds F times the codes (F = 4, 16: planes left unshifted), so sv / F scales the product."""
    mma: gl.constexpr = gl.NVMMADistributedLayout(version=[2, 0], warps_per_cta=[1, 1], instr_shape=[16, 8])
    b4: gl.constexpr = gl.DotOperandLayout(operand_index=1, parent=mma, k_width=4)
    zi = gl.zeros([vq.shape[0], 8], gl.int32, layout=mma)
    acc = mma_v2(vq, pt, zi)
    if USE_SE:
        vs = gl.expand_dims(_vmeta(VSM + moff, False).to(gl.int32), 1) * (128 * F)
    else:  # the code sums of vq, F times the codes' already
        vs = mma_v2(vq, gl.full([vq.shape[1], 8], 1, gl.int8, layout=b4), zi) * 128
    sv = _vmeta(VSC + moff, True).to(gl.float32)
    mv = _vmeta(VMN + moff, True).to(gl.float32)
    if F != 1:
        sv = sv * (1.0 / F)
    return o * al + gl.expand_dims(sv, 1) * (acc + vs).to(gl.float32) + gl.expand_dims(mv, 1) * us


@gluon.jit
def _hack_mma_kernel(
    Q,
    KC,
    KMN,
    KSC,
    KSM,
    VC,
    VMN,
    VSC,
    VSM,
    VT,
    LENS,
    OP,
    LSEP,
    qk_scale,
    HKV,
    LMAX,
    NBLK,
    TPS,
    NSPLIT,
    G: gl.constexpr,
    D: gl.constexpr,
    PI: gl.constexpr,
    HAS_TAIL: gl.constexpr,
    USE_SE: gl.constexpr,
):
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
    l_i = gl.zeros([W, G], gl.float32, layout=mma)  # the denominator x255, every row the same
    o0 = gl.zeros([W, G], gl.float32, layout=mma)
    o1 = gl.zeros([W, G], gl.float32, layout=mma)
    o2 = gl.zeros([W, G], gl.float32, layout=mma)
    o3 = gl.zeros([W, G], gl.float32, layout=mma)
    end_full = start + gl.maximum(end - start, 0) // BT * BT
    last = gl.maximum(end_full - BT, start)
    for s0 in range(start, end_full, BT):
        # an L1 prefetch of the next tile's code bytes (the last tile's clamped to itself)
        _prefetch_tile(gl.minimum(s0 + BT, last), kc, vc, D)
        kb = _hack_kcodes(s0, end, kc, D, False)
        m_i, l_i, o0, o1, o2, o3 = _hack_tile(
            s0,
            end,
            LV,
            m_i,
            l_i,
            o0,
            o1,
            o2,
            o3,
            qi0,
            qi1,
            qi2,
            qi3,
            aq,
            beta,
            gm0,
            gm1,
            kb,
            kmn,
            ksc,
            ksm,
            vc,
            VMN,
            VSC,
            VSM,
            vt_ptr,
            mbase,
            D,
            PI,
            USE_SE,
            False,
            False,
        )
    if end_full < end:  # the last partial block of a cache without the FP16 tail
        m_i, l_i, o0, o1, o2, o3 = _hack_tile(
            end_full,
            end,
            LV,
            m_i,
            l_i,
            o0,
            o1,
            o2,
            o3,
            qi0,
            qi1,
            qi2,
            qi3,
            aq,
            beta,
            gm0,
            gm1,
            _hack_kcodes(end_full, end, kc, D, True),
            kmn,
            ksc,
            ksm,
            vc,
            VMN,
            VSC,
            VSM,
            vt_ptr,
            mbase,
            D,
            PI,
            USE_SE,
            True,
            False,
        )
    if HAS_TAIL:
        if (split == NSPLIT - 1) & (L > LV):
            m_i, l_i, o0, o1, o2, o3 = _hack_tile(
                LV,
                L,
                LV,
                m_i,
                l_i,
                o0,
                o1,
                o2,
                o3,
                qi0,
                qi1,
                qi2,
                qi3,
                aq,
                beta,
                gm0,
                gm1,
                _hack_kcodes(LV, L, kc, D, True),
                kmn,
                ksc,
                ksm,
                vc,
                VMN,
                VSC,
                VSM,
                vt_ptr,
                mbase,
                D,
                PI,
                USE_SE,
                True,
                True,
            )
    prow, inv_l = _store_lse(LSEP, qrow0, split, NSPLIT, gl.max(l_i, 0), m_i, G)
    _store_o4(OP, prow, inv_l, o0, o1, o2, o3, D)


# Registers per thread of the HACK kernel: 168 lets 12 one-warp programs share an SM (see DESIGN.md).
HACK_MAXNREG = 168


def hack_supported_gluon(q: torch.Tensor, cache: QuantKVCache) -> bool:
    """The shapes the Gluon HACK kernel takes: 2-bit codes, head_dim 128, PI 64, 8 query heads per KV head."""
    return gluon_supported(q, cache) and cache.partition == 64


def hack_attn_decode_gluon(
    q: torch.Tensor,
    cache: QuantKVCache,
    use_se: bool = True,
    max_len: int | None = None,
    config: DecodeConfig = DecodeConfig(),
) -> torch.Tensor:
    """HACK decode attention on the one-warp mma.sync kernel; q [B, HQ, D] fp16 (already appended) ->
    [B, HQ, D] fp16.  config.maxnreg: a register cap (None: HACK_MAXNREG; 0: none); splits default: one
    wave of programs (wave_splits)."""
    b, hkv, lmax, d = cache.shape
    g = cache.query_group(q)
    if not hack_supported_gluon(q, cache):
        raise ValueError("the Gluon HACK kernel takes 2-bit codes, head_dim 128, PI 64 and 8 query heads per KV head")
    _one_warp(config)
    max_len = lmax if max_len is None else max_len
    qk_scale = 1.0 / math.sqrt(d) * 1.4426950408889634
    q = q.contiguous()
    consts = dict(G=g, D=d, PI=cache.partition, HAS_TAIL=cache.rqe, USE_SE=use_se)
    maxnreg = HACK_MAXNREG if config.maxnreg is None else config.maxnreg
    opts = {"maxnreg": maxnreg} if maxnreg else {}

    def args(op, lsep, tps, n):
        return (
            q,
            cache.k_codes,
            cache.k_min,
            cache.k_scale,
            cache.k_sum,
            cache.v_codes,
            cache.v_min,
            cache.v_scale,
            cache.v_sum,
            cache.v_tail,
            cache.lens,
            op,
            lsep,
            qk_scale,
            hkv,
            lmax,
            cache.v_min.shape[2],
            tps,
            n,
        )

    splits = config.splits
    if splits is None:  # one wave of programs (wave_splits), from the compiled kernel's registers

        def probe_args():
            probe = torch.empty(1, dtype=torch.float32, device=q.device)
            return args(probe, probe, 64 * 3, 3)

        splits = wave_splits(b, hkv, max_len, _hack_mma_kernel, probe_args, consts, options=opts)
    tps, splits = tokens_per_split(max_len, splits, 64)

    def launch(op, lsep):
        _hack_mma_kernel[(b * hkv, splits)](*args(op, lsep, tps, splits), **consts, **opts, num_warps=1)

    return run_split_decode(launch, q, splits)
