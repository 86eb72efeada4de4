"""One kernel launch for every KV move of a decode-iteration boundary: joins (received wire buffer ->
the request's batch slot) and compactions (the last running slot -> a slot a finished request left).

A move is a list of *segments*; a segment is one part of the KV format (K codes, V min, the FP16 V
tail, ...) laid out [layers, kv_heads, rows, cols], copied as layers x kv_heads contiguous runs of
``run_bytes`` bytes between two strided places:

    src + l * src_layer_stride + h * src_head_stride  ->  dst + l * dst_layer_stride + h * dst_head_stride

The descriptor table holds absolute addresses (int64), so one launch serves segments of any tensors
(each receive buffer, each pool part).  Grid: (segments x layers x kv_heads, chunks of BLOCK bytes
of the longest run); programs past their run's end return at once.  Bytes are copied as bytes:
runs of the wire format start at any byte (a 2-bit K-sum part of an odd prompt length), so no
wider alignment can be assumed.

Work: bytes = 2 x sum of run_bytes (read + write).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

DESC_COLS = 8  # src, dst, run_bytes, src_layer, src_head, dst_layer, dst_head, (pad)
BLOCK = 8192  # bytes per program


@triton.jit
def _kvcopy_kernel(DESC, LH, KVH, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    chunk = tl.program_id(1)
    seg = pid // LH
    lh = pid % LH
    layer = lh // KVH
    head = lh % KVH
    row = DESC + seg * 8
    n = tl.load(row + 2)
    start = chunk.to(tl.int64) * BLOCK
    if start < n:
        src = tl.load(row + 0) + layer * tl.load(row + 3) + head * tl.load(row + 4)
        dst = tl.load(row + 1) + layer * tl.load(row + 5) + head * tl.load(row + 6)
        o = start + tl.arange(0, BLOCK)
        m = o < n
        x = tl.load((src + o).to(tl.pointer_type(tl.uint8)), mask=m)
        tl.store((dst + o).to(tl.pointer_type(tl.uint8)), x, mask=m)


def segment(src: torch.Tensor, dst: torch.Tensor, rows: int) -> tuple[int, ...] | None:
    """The descriptor of copying rows [0, rows) of src [layers, kv_heads, >=rows, cols] into dst of the
    same layout (each (layer, head) block's rows contiguous); None when there is nothing to copy."""
    if rows == 0:
        return None
    if src.shape[:2] != dst.shape[:2] or src.shape[3] != dst.shape[3] or src.dtype != dst.dtype:
        raise ValueError(f"segment shapes differ: {tuple(src.shape)} {src.dtype} vs {tuple(dst.shape)} {dst.dtype}")
    if rows > src.shape[2] or rows > dst.shape[2]:
        raise ValueError(f"{rows} rows exceed {src.shape[2]} / {dst.shape[2]}")
    es = src.element_size()
    for t in (src, dst):
        if t.stride(3) != 1 or t.stride(2) != t.shape[3]:
            raise ValueError("a segment's rows must be contiguous")
    return (
        src.data_ptr(),
        dst.data_ptr(),
        rows * src.shape[3] * es,
        src.stride(0) * es,
        src.stride(1) * es,
        dst.stride(0) * es,
        dst.stride(1) * es,
        0,
    )


def kvcopy(segments: list[tuple[int, ...]], layers: int, kv_heads: int, device: torch.device) -> int:
    """Run every segment's copies in one launch; returns the bytes moved (one way).  The caller keeps
    the tensors behind the addresses alive until the copy has run (stream order)."""
    segs = [s for s in segments if s is not None]
    if not segs:
        return 0
    desc = torch.tensor(segs, dtype=torch.int64)
    if device.type == "cuda":
        desc = desc.pin_memory().to(device, non_blocking=True)
    longest = max(s[2] for s in segs)
    _kvcopy_kernel[(len(segs) * layers * kv_heads, triton.cdiv(longest, BLOCK))](
        desc, layers * kv_heads, kv_heads, BLOCK=BLOCK, num_warps=4
    )
    return sum(s[2] for s in segs) * layers * kv_heads


def kvcopy_ref(pairs: list[tuple[torch.Tensor, torch.Tensor, int]]) -> None:
    """The same moves by one torch copy per segment: (src, dst, rows)."""
    for src, dst, rows in pairs:
        if rows:
            dst[:, :, :rows].copy_(src[:, :, :rows])
