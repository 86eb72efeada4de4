"""KV methods of the real run: their wire/memory format, prefill attention, quantize (encode) step,
decode-side storage and decode attention.  One class per method; kernels from
kernels_calibration/kernels (imported, never edited).

Formats (per layer, per KV head; P prompt tokens, Π = 64, W = D/4 packed bytes, NP = D/Π,
LV = ⌊P/Π⌋·Π tokens in full V blocks):
* ``baseline``: K, V FP16 [P, D] each.  2 B per element on the wire and in memory.
* ``kvquant``: 2-bit asymmetric codes, stochastic rounding, K per token in Π-channel partitions,
  V per channel in Π-token blocks (the layout quantize.py writes): K codes [P, W], K min/scale
  FP16 [P, NP], V codes [LV, W], V min/scale FP16 [LV/Π, D], and the last partial V block
  (P - LV < Π tokens) in FP16 (the KIVI-style residual window: new tokens' V stay FP16 until a
  block of Π fills, then the block is quantized; new K tokens are quantized on append).  No code
  sums.  0.25 + 4/Π = 0.3125 B per element plus the FP16 tail.
* ``hack``: as kvquant plus the stored code sums (uint8 [P, NP] for K, [LV/Π, D] for V: summation
  elimination) and the same FP16 V tail (requantization elimination).  0.25 + 5/Π = 0.328 B per
  element plus the tail.
Wire = exactly those tensors packed back to back (16-byte aligned) in one flat GPU buffer.
Memory footprint reserved at admission (final T = prompt + output tokens): the same parts sized for
T tokens with a full Π-token FP16 V tail reserved (what the simulator's HACK memory reserve
assumes).

Decode attention:
* baseline: ``fp_attn_decode`` (Triton split-K flash-decoding over ragged FP16 contexts, no padding;
  within ~10 % of torch SDPA on equal lengths in the kernel benchmark, while SDPA would have to pad
  every request to the longest context); the new token's K/V written with index_put.
* kvquant: ``append_token`` (2-bit K, FP16 V tail), then ``dequantize_cache`` writes the whole
  cache of every running request back to FP16 (unfused: what the HACK paper compared against),
  then ``fp_attn_decode`` on the FP16 copy.  Every iteration.
* hack: ``append_token`` then ``hack_attn_decode`` (INT8 homomorphic dots, SE, RQE).
Prefill attention: torch SDPA causal (flash) for baseline and kvquant; for hack the HACK prefill
kernel (``hack_attn_prefill``: 8-bit Q against the 2-bit K/V codes) by default — the prompt's KV
is quantized inside the forward, per layer, because the kernel reads codes — or SDPA with
``hack_prefill="sdpa"``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from . import kvcopy
from .model import ModelShape

PARTITION = 64  # HACK's default Π
BITS = 2
ALIGN = 16  # bytes; keeps every part of the flat wire buffer aligned for fp16 views


def _k():  # kernels are imported lazily so TRITON_INTERPRET can be set first on CPU
    from kernels_calibration.kernels import (
        attn_decode,
        dequant_attn_decode,
        hack_attn_decode,
        hack_attn_prefill,
        kv_cache,
        quantize,
    )

    return attn_decode, dequant_attn_decode, hack_attn_decode, hack_attn_prefill, kv_cache, quantize


class WireLayout:
    """Parts (name, dtype, rows, cols) per layer per KV head, packed as [layers, HKV, rows, cols]."""

    def __init__(self, parts: list[tuple[str, torch.dtype, int, int]], layers: int, kv_heads: int):
        self.parts = parts
        self.offsets = []
        off = 0
        for _, dt, rows, cols in parts:
            self.offsets.append(off)
            nb = layers * kv_heads * rows * cols * torch.empty((), dtype=dt).element_size()
            off += -(-nb // ALIGN) * ALIGN
        self.nbytes = off
        self.layers, self.kv_heads = layers, kv_heads

    def layer_ranges(self, layer: int) -> list[tuple[int, int]]:
        """(byte offset, bytes) of one layer's KV in the flat buffer: one contiguous range per part."""
        out = []
        for (_, dt, rows, cols), off in zip(self.parts, self.offsets):
            n = self.kv_heads * rows * cols * torch.empty((), dtype=dt).element_size()
            if n:
                out.append((off + layer * n, n))
        return out

    def views(self, flat: torch.Tensor) -> dict[str, torch.Tensor]:
        out = {}
        for (name, dt, rows, cols), off in zip(self.parts, self.offsets):
            es = torch.empty((), dtype=dt).element_size()
            n = self.layers * self.kv_heads * rows * cols
            out[name] = flat[off : off + n * es].view(dt).view(self.layers, self.kv_heads, rows, cols)
        return out


class KVMethodBase:
    name = ""
    quantized = False
    send_sums = False

    def __init__(
        self,
        shape: ModelShape,
        device: torch.device,
        slots: int,
        cap_tokens: int,
        seed: int = 0,
        hack_prefill: str = "kernel",
    ):
        self.shape, self.device, self.slots, self.seed = shape, device, slots, seed
        self.pi = PARTITION
        self.cap = -(-cap_tokens // self.pi) * self.pi  # per-slot token capacity (multiple of Π)
        self.hack_prefill = hack_prefill
        self.pool: dict[str, torch.Tensor] = {}
        self._views: dict = {}

    # ---- format ------------------------------------------------------------------------------
    def parts(self, tokens: int, tail_rows: int | None = None) -> list[tuple[str, torch.dtype, int, int]]:
        raise NotImplementedError

    def wire_layout(self, prompt_tokens: int) -> WireLayout:
        return WireLayout(self.parts(prompt_tokens), self.shape.layers, self.shape.kv_heads)

    def wire_bytes(self, prompt_tokens: int) -> int:
        return self.wire_layout(prompt_tokens).nbytes

    def footprint_bytes(self, total_tokens: int) -> int:
        """Decode memory reserved for a request that will hold total_tokens tokens."""
        return WireLayout(self.parts(total_tokens, tail_rows=self.pi), self.shape.layers, self.shape.kv_heads).nbytes

    # ---- prefill side ----------------------------------------------------------------------
    def prefill_attention(self, q, k, v):
        """q (1, HQ, P, D), k, v (1, HKV, P, D) fp16 -> (o (1, HQ, P, D), state for encode)."""
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True), None

    def encode_layer(self, views: dict, layer: int, k, v, state) -> None:
        """Write one layer's KV (k, v (HKV, P, D) fp16) in the wire format into views[...][layer]."""
        raise NotImplementedError

    # ---- decode side -----------------------------------------------------------------------
    def alloc_pool(self) -> None:
        s = self.shape
        for name, dt, rows, cols in self.parts(self.cap, tail_rows=self.pi, pool=True):
            self.pool[name] = torch.zeros((s.layers, self.slots, s.kv_heads, rows, cols), dtype=dt, device=self.device)

    def pool_bytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.pool.values())

    def join_segments(self, slot: int, recv: torch.Tensor, prompt_tokens: int) -> list:
        """kvcopy segments placing a received flat buffer into the slot's region of the pool."""
        out = []
        for name, view in self.wire_layout(prompt_tokens).views(recv).items():
            out.append(kvcopy.segment(view, self.pool[name][:, slot], view.shape[2]))
        return out

    def move_segments(self, src_slot: int, dst_slot: int, stored: int) -> list:
        """kvcopy segments moving a running request's KV (stored tokens, its FP16 V tail whole) from
        one slot to another."""
        rounded = -(-stored // self.pi) * self.pi
        out = []
        for name, _, rows, _ in self.parts(rounded, tail_rows=self.pi, pool=True):
            out.append(kvcopy.segment(self.pool[name][:, src_slot], self.pool[name][:, dst_slot], rows))
        return out

    def decode_attention(self, layer: int, q, k_new, v_new, lens_prev, lens_attn, b: int, max_len: int):
        """q (b, HQ, D), k_new/v_new (b, HKV, D) for slots 0..b-1 (rows past the running requests are
        padding with both lengths 0); lens_prev: tokens stored before this step, lens_attn: after
        (int32 device).  Appends the new token at lens_prev, returns the attention (b, HQ, D).
        max_len bounds lens_attn and sizes the kernels' split-K grids (the kernels' own heuristics:
        what the kernel profiles measured)."""
        raise NotImplementedError

    # reference for the correctness check: float64 attention over the stored KV of slots 0..hi-1
    def reference_attention(self, layer: int, q, lens_attn, hi: int):
        raise NotImplementedError


class Baseline(KVMethodBase):
    name = "baseline"

    def parts(self, tokens, tail_rows=None, pool=False):
        d = self.shape.head_dim
        return [("k", torch.float16, tokens, d), ("v", torch.float16, tokens, d)]

    def encode_layer(self, views, layer, k, v, state):
        views["k"][layer].copy_(k)
        views["v"][layer].copy_(v)

    def alloc_pool(self):
        super().alloc_pool()
        self.rows = torch.arange(self.slots, device=self.device)

    def decode_attention(self, layer, q, k_new, v_new, lens_prev, lens_attn, b, max_len):
        kp = self.pool["k"][layer, :b]  # (b, HKV, cap, D)
        vp = self.pool["v"][layer, :b]
        rows, pos = self.rows[:b], lens_prev.long()
        kp[rows, :, pos] = k_new
        vp[rows, :, pos] = v_new
        return _k()[0].fp_attn_decode(q, kp, vp, lens_attn, max_len=max_len)

    def reference_attention(self, layer, q, lens_attn, hi):
        ref = _k()[2].attn_decode_ref
        return ref(q, self.pool["k"][layer, :hi], self.pool["v"][layer, :hi], lens_attn.clamp(min=1).cpu())


class _Quantized(KVMethodBase):
    quantized = True

    def parts(self, tokens, tail_rows=None, pool=False):
        d, pi = self.shape.head_dim, self.pi
        w, npart = d * BITS // 8, d // pi
        lv = tokens // pi * pi
        tail = tokens - lv if tail_rows is None else tail_rows
        sums = self.send_sums or pool  # the pool always has sums: append_token writes them
        p = [
            ("k_codes", torch.uint8, tokens, w),
            ("k_min", torch.float16, tokens, npart),
            ("k_scale", torch.float16, tokens, npart),
        ]
        if sums:
            p.append(("k_sum", torch.uint8, tokens, npart))
        p += [
            ("v_codes", torch.uint8, lv if not pool else tokens, w),
            ("v_min", torch.float16, lv // pi if not pool else tokens // pi, d),
            ("v_scale", torch.float16, lv // pi if not pool else tokens // pi, d),
        ]
        if sums:
            p.append(("v_sum", torch.uint8, lv // pi if not pool else tokens // pi, d))
        p.append(("v_tail", torch.float16, tail, d))
        return p

    def quantize_layer(self, k, v):
        """k, v (HKV, P, D) -> dict of the layer's parts (quantize kernels, stochastic rounding)."""
        quantize = _k()[5]
        p = k.shape[1]
        lv = p // self.pi * self.pi
        kc, kmn, ksc, ksm = quantize.quantize_k(k.contiguous(), self.pi, BITS, True, self.seed)
        out = {"k_codes": kc, "k_min": kmn, "k_scale": ksc, "k_sum": ksm}
        if lv:
            lens = torch.full((1,), lv, dtype=torch.int32, device=k.device)
            vc, vmn, vsc, vsm = quantize.quantize_v(
                v[None, :, :lv].contiguous(), lens, self.pi, BITS, True, self.seed + 1
            )
            out.update(v_codes=vc[0], v_min=vmn[0], v_scale=vsc[0], v_sum=vsm[0])
        out["v_tail"] = v[:, lv:]
        return out

    def encode_layer(self, views, layer, k, v, state):
        parts = state if state is not None else self.quantize_layer(k, v)
        for name, view in views.items():
            if view.shape[2]:
                view[layer].copy_(parts[name][:, : view.shape[2]])

    def cache_view(self, layer: int, hi: int, lens):
        kv_cache = _k()[4]
        key = (layer, hi)
        pl = self._views.get(key)
        if pl is None:  # slicing 9 tensors costs host time every layer; batch sizes repeat
            pl = self._views[key] = {n: t[layer, :hi] for n, t in self.pool.items()}
        return kv_cache.QuantKVCache(**pl, lens=lens, partition=self.pi, bits=BITS, rqe=True)

    def append(self, layer, k_new, v_new, lens_prev, hi):
        _k()[4].append_token(self.cache_view(layer, hi, lens_prev), k_new, v_new, stochastic=True, seed=self.seed + 2)

    def exact_attention(self, layer, q, lens_attn, hi):
        """float64 attention over the dequantized cache (inactive slots: one garbage token, ignored)."""
        lens = lens_attn.clamp(min=1)
        k, v = _k()[4].dequantize_cache_ref(self.cache_view(layer, hi, lens))
        return _k()[2].attn_decode_ref(q, k, v, lens.cpu())


class KVQuant(_Quantized):
    name = "kvquant"
    send_sums = False

    def alloc_pool(self):
        super().alloc_pool()
        s = self.shape
        self.scratch = tuple(
            torch.empty((self.slots, s.kv_heads, self.cap, s.head_dim), dtype=torch.float16, device=self.device)
            for _ in range(2)
        )

    def pool_bytes(self):
        return super().pool_bytes() + sum(t.numel() * 2 for t in self.scratch)

    def decode_attention(self, layer, q, k_new, v_new, lens_prev, lens_attn, b, max_len):
        attn_decode, dequant, *_ = _k()
        self.append(layer, k_new, v_new, lens_prev, b)
        ko, vo = dequant.dequantize_cache(
            self.cache_view(layer, b, lens_attn), out=(self.scratch[0][:b], self.scratch[1][:b]), max_len=max_len
        )
        return attn_decode.fp_attn_decode(q, ko, vo, lens_attn, max_len=max_len)

    def reference_attention(self, layer, q, lens_attn, hi):
        return self.exact_attention(layer, q, lens_attn, hi)


class Hack(_Quantized):
    name = "hack"
    send_sums = True

    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.quantize_events: list = []  # (start, end) CUDA events around build_cache in the forward

    def prefill_attention(self, q, k, v):
        if self.hack_prefill == "sdpa":
            return super().prefill_attention(q, k, v)
        _, _, _, hack_prefill, kv_cache, _ = _k()
        p = q.shape[2]
        lens = torch.full((1,), p, dtype=torch.int32, device=q.device)
        if q.is_cuda:  # the quantize kernels' share of the forward, for the log (events: no sync here)
            ev = (torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
            ev[0].record()
        cache = kv_cache.build_cache(k, v, lens, self.pi, BITS, rqe=False, stochastic=True, seed=self.seed)
        if q.is_cuda:
            ev[1].record()
            self.quantize_events.append(ev)
        o = hack_prefill.hack_attn_prefill(q, cache)
        lv = p // self.pi * self.pi
        state = {
            "k_codes": cache.k_codes[0],
            "k_min": cache.k_min[0],
            "k_scale": cache.k_scale[0],
            "k_sum": cache.k_sum[0],
            "v_codes": cache.v_codes[0],
            "v_min": cache.v_min[0],
            "v_scale": cache.v_scale[0],
            "v_sum": cache.v_sum[0],
            "v_tail": v[0, :, lv:],
        }
        return o, state

    def decode_attention(self, layer, q, k_new, v_new, lens_prev, lens_attn, b, max_len):
        hack = _k()[2]
        self.append(layer, k_new, v_new, lens_prev, b)
        return hack.hack_attn_decode(q, self.cache_view(layer, b, lens_attn), max_len=max_len)

    def reference_attention(self, layer, q, lens_attn, hi):
        return _k()[2].hack_attn_decode_ref(q, self.cache_view(layer, hi, lens_attn.clamp(min=1)))


METHODS = {"baseline": Baseline, "kvquant": KVQuant, "hack": Hack}
