"""Asymmetric b-bit KV quantization (HACK / KIVI style), packed, with FP16 metadata and code sums.

Modelled (HACK, arXiv 2502.03589, section "homomorphic quantization"):
  x ~= s * x' + m per partition of PI elements, m = min, s = (max - min) / (2^bits - 1), both
  stored in FP16; x' in [0, 2^bits - 1] by stochastic (floor(y + u), u ~ U[0, 1)) or nearest
  rounding; the code sum sum(x') per partition is stored (uint8, or int16 when it needs more than
  8 bits: 2-bit PI = 128, 4-bit, 8-bit), which is what summation elimination (SE) reads.
  K is partitioned along head_dim (one token's K row holds D / PI partitions), V along the sequence
  (one channel of PI consecutive tokens is a partition).

Layouts (B batch, H kv heads, L tokens, D head_dim, W = D * bits / 8 packed bytes, NP = D / PI):
  codes   uint8 [..., L, W]       channel-interleaved bit planes (see common.py)
  K meta  fp16  [..., L, NP]      k_min, k_scale;  k_sum [..., L, NP]
  V meta  fp16  [..., L / PI, D]  v_min, v_scale;  v_sum [..., L / PI, D]
The stored FP16 min and scale are the ones the codes were computed with, so dequantization with the
stored values is consistent (codes are clamped to the range after the FP16 rounding).

Bytes moved per quantized element: 2 bytes read, bits / 8 written, plus metadata per partition.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .common import codes_per_byte, sum_dtype
from .launch import QuantizeConfig


@triton.jit
def _quant_codes(x, mn, mx, offs, seed, BITS: tl.constexpr, STOCHASTIC: tl.constexpr):
    """x: fp32 tile; mn, mx broadcastable fp32.  Returns (codes fp32 exact ints, mn16, sc16)."""
    LEVELS: tl.constexpr = (1 << BITS) - 1
    mn16 = mn.to(tl.float16).to(tl.float32)
    sc16 = ((mx - mn16) / LEVELS).to(tl.float16).to(tl.float32)
    inv = tl.where(sc16 > 0, 1.0 / sc16, 0.0)
    y = (x - mn16) * inv
    if STOCHASTIC:
        y = tl.floor(y + tl.rand(seed, offs))
    else:
        y = tl.floor(y + 0.5)
    y = tl.minimum(tl.maximum(y, 0.0), LEVELS * 1.0)
    return y, mn16, sc16


@triton.jit
def _pack_rows(codes2d, R: tl.constexpr, D: tl.constexpr, BITS: tl.constexpr):
    """codes2d [R, D] fp32 -> packed [R, W] int32 (channel c*W + j at bits c*BITS of byte j)."""
    CPB: tl.constexpr = 8 // BITS
    W: tl.constexpr = D // CPB
    ci = codes2d.to(tl.int32)
    if CPB == 1:
        packed = ci
    else:
        c3 = tl.reshape(ci, (R, CPB, W))
        sh = (tl.arange(0, CPB) * BITS)[None, :, None]
        packed = tl.sum(c3 << sh, axis=1)
    return packed


@triton.jit
def _quantize_rows_kernel(
    X,
    C,
    MN,
    SC,
    SM,
    R,
    seed,
    D: tl.constexpr,
    PI: tl.constexpr,
    BITS: tl.constexpr,
    BLOCK_R: tl.constexpr,
    STOCHASTIC: tl.constexpr,
):
    # X [R, D] fp16 rows (K tokens); C [R, W] uint8; MN, SC [R, NP] fp16; SM [R, NP]
    NP: tl.constexpr = D // PI
    W: tl.constexpr = D * BITS // 8
    pid = tl.program_id(0)
    rows = pid * BLOCK_R + tl.arange(0, BLOCK_R)
    rmask = rows < R
    cols = tl.arange(0, D)
    x = tl.load(X + rows[:, None].to(tl.int64) * D + cols[None, :], mask=rmask[:, None], other=0.0).to(tl.float32)
    x3 = tl.reshape(x, (BLOCK_R, NP, PI))
    mn = tl.min(x3, axis=2)
    mx = tl.max(x3, axis=2)
    offs = rows[:, None] * D + cols[None, :]
    offs3 = tl.reshape(offs, (BLOCK_R, NP, PI))
    y, mn16, sc16 = _quant_codes(x3, mn[:, :, None], mx[:, :, None], offs3, seed, BITS, STOCHASTIC)
    sums = tl.sum(y, axis=2)  # [BLOCK_R, NP]
    packed = _pack_rows(tl.reshape(y, (BLOCK_R, D)), BLOCK_R, D, BITS)
    wc = tl.arange(0, W)
    tl.store(C + rows[:, None].to(tl.int64) * W + wc[None, :], packed.to(tl.uint8), mask=rmask[:, None])
    pc = tl.arange(0, NP)
    mptr = rows[:, None] * NP + pc[None, :]
    tl.store(MN + mptr, tl.reshape(mn16, (BLOCK_R, NP)).to(tl.float16), mask=rmask[:, None])
    tl.store(SC + mptr, tl.reshape(sc16, (BLOCK_R, NP)).to(tl.float16), mask=rmask[:, None])
    tl.store(SM + mptr, sums.to(SM.dtype.element_ty), mask=rmask[:, None])


@triton.jit
def _quantize_blocks_kernel(
    X,
    LENS,
    C,
    MN,
    SC,
    SM,
    H,
    L,
    NBLK,
    seed,
    D: tl.constexpr,
    PI: tl.constexpr,
    BITS: tl.constexpr,
    STOCHASTIC: tl.constexpr,
):
    # X [BH, L, D] fp16 (V); LENS [B] valid tokens; C [BH, L, W]; MN, SC, SM [BH, NBLK, D]
    W: tl.constexpr = D * BITS // 8
    bh = tl.program_id(0)
    blk = tl.program_id(1)
    n = tl.load(LENS + bh // H)
    cnt = tl.minimum(n - blk * PI, PI)
    if cnt > 0:
        t = tl.arange(0, PI)
        tmask = t < cnt
        d = tl.arange(0, D)
        rows = bh.to(tl.int64) * L + blk * PI + t
        x = tl.load(X + rows[:, None] * D + d[None, :], mask=tmask[:, None], other=0.0).to(tl.float32)
        mn = tl.min(tl.where(tmask[:, None], x, float("inf")), axis=0)
        mx = tl.max(tl.where(tmask[:, None], x, float("-inf")), axis=0)
        offs = (rows[:, None] * D + d[None, :]).to(tl.int32)
        y, mn16, sc16 = _quant_codes(x, mn[None, :], mx[None, :], offs, seed, BITS, STOCHASTIC)
        y = tl.where(tmask[:, None], y, 0.0)
        packed = _pack_rows(y, PI, D, BITS)
        wc = tl.arange(0, W)
        tl.store(C + rows[:, None] * W + wc[None, :], packed.to(tl.uint8), mask=tmask[:, None])
        mptr = (bh.to(tl.int64) * NBLK + blk) * D + d
        tl.store(MN + mptr, tl.reshape(mn16, (D,)).to(tl.float16))
        tl.store(SC + mptr, tl.reshape(sc16, (D,)).to(tl.float16))
        tl.store(SM + mptr, tl.sum(y, axis=0).to(SM.dtype.element_ty))


def _check(x: torch.Tensor, partition: int, bits: int) -> None:
    codes_per_byte(bits)
    d = x.shape[-1]
    if x.dtype != torch.float16:
        raise TypeError("quantize expects fp16 input")
    if partition not in (16, 32, 64, 128) or d % partition:
        raise ValueError(f"partition {partition} must be 16..128 and divide head_dim {d}")
    if d & (d - 1):
        raise ValueError("head_dim must be a power of two")


def quantize_k(
    k: torch.Tensor,
    partition: int = 64,
    bits: int = 2,
    stochastic: bool = True,
    seed: int = 0,
    config: QuantizeConfig = QuantizeConfig(),
):
    """Quantize K rows ([..., D] fp16) with partitions of `partition` channels along head_dim
    (config.block_r rows per program).

    Returns (codes uint8 [..., W], k_min fp16 [..., NP], k_scale fp16 [..., NP], k_sum [..., NP]).
    """
    _check(k, partition, bits)
    d = k.shape[-1]
    lead = k.shape[:-1]
    x = k.reshape(-1, d).contiguous()
    r = x.shape[0]
    npart, w = d // partition, d * bits // 8
    codes = torch.empty((r, w), dtype=torch.uint8, device=k.device)
    mn = torch.empty((r, npart), dtype=torch.float16, device=k.device)
    sc = torch.empty_like(mn)
    sm = torch.empty((r, npart), dtype=sum_dtype(bits, partition), device=k.device)
    block_r = config.block_r
    _quantize_rows_kernel[(triton.cdiv(r, block_r),)](
        x,
        codes,
        mn,
        sc,
        sm,
        r,
        seed,
        D=d,
        PI=partition,
        BITS=bits,
        BLOCK_R=block_r,
        STOCHASTIC=stochastic,
        **config.options(4, 3),
    )
    return (codes.reshape(*lead, w), mn.reshape(*lead, npart), sc.reshape(*lead, npart), sm.reshape(*lead, npart))


def quantize_v(
    v: torch.Tensor,
    lens: torch.Tensor | None = None,
    partition: int = 64,
    bits: int = 2,
    stochastic: bool = True,
    seed: int = 0,
    config: QuantizeConfig = QuantizeConfig(),
):
    """Quantize V ([B, H, L, D] fp16) in blocks of `partition` tokens per channel.

    Tokens at or past lens[b] are ignored (their codes are left unwritten, zeros where allocated
    here); the last block of a request holds min(PI, lens - start) tokens.
    Returns (codes uint8 [B, H, L, W], v_min, v_scale fp16 [B, H, NBLK, D], v_sum [B, H, NBLK, D]).
    """
    _check(v, partition, bits)
    b, h, seq, d = v.shape
    if lens is None:
        lens = torch.full((b,), seq, dtype=torch.int32, device=v.device)
    nblk = triton.cdiv(seq, partition)
    w = d * bits // 8
    codes = torch.zeros((b, h, seq, w), dtype=torch.uint8, device=v.device)
    mn = torch.zeros((b, h, nblk, d), dtype=torch.float16, device=v.device)
    sc = torch.zeros_like(mn)
    sm = torch.zeros((b, h, nblk, d), dtype=sum_dtype(bits, partition), device=v.device)
    _quantize_blocks_kernel[(b * h, nblk)](
        v.contiguous(),
        lens.to(torch.int32),
        codes,
        mn,
        sc,
        sm,
        h,
        seq,
        nblk,
        seed,
        D=d,
        PI=partition,
        BITS=bits,
        STOCHASTIC=stochastic,
        **config.options(4, 3),
    )
    return codes, mn, sc, sm


# ----------------------------------------------------------------------------- references
def unpack_ref(codes: torch.Tensor, bits: int) -> torch.Tensor:
    """uint8 [..., W] -> int64 [..., D] codes in channel order."""
    cpb = codes_per_byte(bits)
    c = codes.to(torch.int64)
    planes = [(c >> (i * bits)) & ((1 << bits) - 1) for i in range(cpb)]
    return torch.cat(planes, dim=-1)


def pack_ref(codes: torch.Tensor, bits: int) -> torch.Tensor:
    """int [..., D] codes -> uint8 [..., W] (inverse of unpack_ref)."""
    cpb = codes_per_byte(bits)
    w = codes.shape[-1] // cpb
    out = torch.zeros(codes.shape[:-1] + (w,), dtype=torch.int64, device=codes.device)
    for i in range(cpb):
        out |= codes[..., i * w : (i + 1) * w].to(torch.int64) << (i * bits)
    return out.to(torch.uint8)


def _quant_ref(x: torch.Tensor, mn: torch.Tensor, mx: torch.Tensor, bits: int, noise: torch.Tensor | None):
    levels = 2**bits - 1
    mn16 = mn.half().float()
    sc16 = ((mx - mn16) / levels).half().float()
    inv = torch.where(sc16 > 0, 1.0 / sc16, torch.zeros_like(sc16))
    y = (x - mn16) * inv
    y = torch.floor(y + (0.5 if noise is None else noise))
    return y.clamp(0, levels), mn16, sc16


def quantize_k_ref(k: torch.Tensor, partition: int = 64, bits: int = 2, noise: torch.Tensor | None = None):
    """Same outputs as quantize_k; nearest rounding, or floor(y + noise) when noise is given."""
    d = k.shape[-1]
    x = k.float().reshape(*k.shape[:-1], d // partition, partition)
    y, mn16, sc16 = _quant_ref(
        x, x.amin(-1, keepdim=True), x.amax(-1, keepdim=True), bits, None if noise is None else noise.reshape(x.shape)
    )
    codes = pack_ref(y.reshape(k.shape).long(), bits)
    return (codes, mn16.squeeze(-1).half(), sc16.squeeze(-1).half(), y.sum(-1).to(sum_dtype(bits, partition)))


def quantize_v_ref(v: torch.Tensor, lens: torch.Tensor | None = None, partition: int = 64, bits: int = 2):
    """Nearest-rounding reference of quantize_v (loops over requests and blocks; small shapes)."""
    b, h, seq, d = v.shape
    lens = [seq] * b if lens is None else [int(n) for n in lens]
    nblk = -(-seq // partition)
    w = d * bits // 8
    codes = torch.zeros((b, h, seq, w), dtype=torch.uint8)
    mn = torch.zeros((b, h, nblk, d), dtype=torch.float16)
    sc = torch.zeros_like(mn)
    sm = torch.zeros((b, h, nblk, d), dtype=sum_dtype(bits, partition))
    for bi in range(b):
        for blk in range(nblk):
            lo, hi = blk * partition, min((blk + 1) * partition, lens[bi])
            if hi <= lo:
                continue
            x = v[bi, :, lo:hi].float().cpu()  # (H, T, D)
            y, m16, s16 = _quant_ref(x, x.amin(1, keepdim=True), x.amax(1, keepdim=True), bits, None)
            codes[bi, :, lo:hi] = pack_ref(y.long(), bits)
            mn[bi, :, blk], sc[bi, :, blk] = m16[:, 0].half(), s16[:, 0].half()
            sm[bi, :, blk] = y.sum(1).to(sm.dtype)
    return codes, mn, sc, sm


def dequantize_k_ref(codes, k_min, k_scale, partition: int, bits: int = 2) -> torch.Tensor:
    y = unpack_ref(codes, bits).float()
    d = y.shape[-1]
    y = y.reshape(*y.shape[:-1], d // partition, partition)
    return (y * k_scale.float()[..., None] + k_min.float()[..., None]).reshape(*codes.shape[:-1], d)


def dequantize_v_ref(codes, v_min, v_scale, partition: int, bits: int = 2) -> torch.Tensor:
    y = unpack_ref(codes, bits).float()  # (B, H, L, D)
    seq = y.shape[-2]
    s = v_scale.float().repeat_interleave(partition, dim=-2)[..., :seq, :]
    m = v_min.float().repeat_interleave(partition, dim=-2)[..., :seq, :]
    return y * s + m


def quantize_bytes(n_elements: int, partition: int, bits: int = 2) -> int:
    """Bytes moved by quantizing n fp16 elements: read 2 B each, write codes + min/scale/sum."""
    meta = 4 + (1 if (2**bits - 1) * partition <= 255 else 2)
    return 2 * n_elements + n_elements * bits // 8 + (n_elements // partition) * meta
