"""The whole decode step of a dense batch, replayed as CUDA graphs per (batch, context) bucket.

One decode step for the n running requests, which always sit in batch slots 0..n-1 (the harness
keeps the slots dense: a join takes the lowest free slot, and a slot a finished request leaves is
refilled by moving the last running request into it):

    embed the n input tokens -> RoPE tables at their positions -> per layer: norm, QKV projection,
    RoPE, the KV method's append of the new token and its decode attention (kvformats.py), O
    projection, MLP -> final norm, LM head, argmax -> the next input token of each slot.

``graphs`` mode (what vLLM and SGLang do): the step is captured once per bucket (B, C) as one CUDA
graph and replayed; B is the batch rounded up to a bucket size (rows n..B-1 are padding: context 0,
their attention reads nothing, their outputs are dropped), C is the longest context rounded up to a
context bucket and is the ``max_len`` the attention kernels size their split-K grids by (each
request's own length comes from the device lens tensor, so a graph serves every batch inside its
bucket).  An iteration then costs the host one small host-to-device copy of the lengths and one
graph launch, so the GPU sets the pace.  ``eager`` mode runs the same step function launch by launch
at B = n and C = the true longest context (a Python engine's decode: host-bound at 32 layers).

Static buffers: the input/next token per slot, the lengths before and after the step per slot (one
int32 tensor, uploaded per iteration), the last layer's output (for the correctness check).  Graphs
of every bucket share one memory pool: each graph's temporaries die inside it, and graphs never run
concurrently, which is what makes the sharing safe.  Without CUDA the graphs mode runs the padded
step eagerly (the CPU tests exercise the bucketing; capture itself needs a GPU).
"""

from __future__ import annotations

import bisect

import torch

from .model import RandomLlama

MODES = ("graphs", "eager")
# vLLM's capture sizes: 1, 2, 4, then every multiple of 8
BATCH_BUCKETS = (1, 2, 4) + tuple(range(8, 1025, 8))
# context buckets: steps of 256 tokens to 2K, then about 1/8 apart (multiples of 256): a bucket's
# split-K grid is at most ~12 % wider than the true longest context's
_CTX = list(range(256, 2048, 256))
while _CTX[-1] < (1 << 20):
    _CTX.append(-(-int(_CTX[-1] * 1.125) // 256) * 256)
CTX_BUCKETS = tuple(_CTX)

_PIN_OK = [True]


def pinned(t: torch.Tensor) -> torch.Tensor:
    """t in page-locked memory (async H2D), or t itself where pinning is refused (then the copy syncs)."""
    if _PIN_OK[0]:
        try:
            return t.pin_memory()
        except RuntimeError:
            _PIN_OK[0] = False
    return t


def batch_buckets(max_batch: int) -> list[int]:
    return [b for b in BATCH_BUCKETS if b < max_batch] + [max_batch]


def ctx_buckets(max_ctx: int) -> list[int]:
    return [c for c in CTX_BUCKETS if c < max_ctx] + [max_ctx]


def bucket(sizes: list[int], x: int) -> int:
    i = bisect.bisect_left(sizes, x)
    if i == len(sizes):
        raise ValueError(f"{x} exceeds the largest bucket {sizes[-1]}")
    return sizes[i]


class DecodeStep:
    def __init__(self, model: RandomLlama, method, max_batch: int, mode: str = "graphs"):
        if mode not in MODES:
            raise ValueError(f"decode mode {mode!r}: one of {MODES}")
        self.m, self.meth = model, method
        self.dev = model.device
        self.cuda = self.dev.type == "cuda"
        self.mode = mode
        self.max_batch = max_batch
        self.b_sizes = batch_buckets(max_batch)
        self.c_sizes = ctx_buckets(method.cap)
        # inputs, one int32 tensor uploaded per iteration: input token | length before | after the step
        self.ins = torch.zeros(3 * max_batch, dtype=torch.int32, device=self.dev)
        host = torch.zeros(3 * max_batch, dtype=torch.int32)
        self.ins_host = pinned(host) if self.cuda else host
        self.tok_out = torch.zeros(max_batch, dtype=torch.int64, device=self.dev)  # the next token per slot
        self.x_out = torch.zeros((max_batch, model.shape.hidden), dtype=torch.float16, device=self.dev)
        self.graphs: dict[tuple[int, int], torch.cuda.CUDAGraph] = {}
        self.pool = None
        self.capture_layers: list | None = None  # check.py: (layer, q, out) per layer in eager runs

    # ---- the step ------------------------------------------------------------------------------
    def _body(self, b: int, c: int) -> None:
        m, meth = self.m, self.meth
        mb = self.max_batch
        tok, lens_prev, lens_attn = self.ins[:b], self.ins[mb : mb + b], self.ins[2 * mb : 2 * mb + b]
        pos = lens_prev.long()
        x = m.embed[tok.long()]  # (B, hidden)
        rot = m.rope_tables(pos)
        for layer, lw in enumerate(m.layers):
            q, k, v = m.qkv(lw, x, rot)  # (B, H, D) views
            o = meth.decode_attention(layer, q, k, v, lens_prev, lens_attn, b, c)
            if self.capture_layers is not None:
                self.capture_layers.append((layer, q.clone(), o.clone()))
            x = m.finish_layer(lw, x, o.reshape(b, -1))
        self.x_out[:b].copy_(x)
        self.tok_out[:b].copy_(m.next_token(x))

    def shape_of(self, n: int, max_len: int) -> tuple[int, int]:
        """The (B, C) an iteration of n requests whose longest context is max_len runs at."""
        if self.mode == "eager":
            return n, max_len
        return bucket(self.b_sizes, n), bucket(self.c_sizes, max_len)

    def set_inputs(self, tokens: list[int], prev: list[int]) -> None:
        """Input tokens and lengths before the step of the running slots 0..n-1 (the rest: padding,
        token 0, lengths 0)."""
        mb, n = self.max_batch, len(prev)
        h = self.ins_host
        h.zero_()
        h[:n] = torch.tensor(tokens, dtype=torch.int32)
        h[mb : mb + n] = torch.tensor(prev, dtype=torch.int32)
        h[2 * mb : 2 * mb + n] = h[mb : mb + n] + 1
        self.ins.copy_(h, non_blocking=self.cuda)

    def run(self, n: int, max_len: int) -> tuple[int, int]:
        """One step of slots 0..n-1 (lengths already set); returns the (B, C) it ran at."""
        b, c = self.shape_of(n, max_len)
        if self.mode == "graphs" and self.cuda:
            g = self.graphs.get((b, c))
            if g is None:
                g = self._capture(b, c)
            g.replay()
        else:
            self._body(b, c)
        return b, c

    # ---- capture -------------------------------------------------------------------------------
    def _capture(self, b: int, c: int) -> torch.cuda.CUDAGraph:
        """Warm up (Triton compiles, cuBLAS workspaces) on a side stream, then capture.  The warm-up
        runs the step once more on the current inputs: its writes to the pool are idempotent (the
        same tokens' KV at the same positions; the step never writes its input buffer), so a bucket
        captured in the middle of a run leaves the run's state as it was."""
        if self.pool is None:
            self.pool = torch.cuda.graph_pool_handle()
        side = torch.cuda.Stream(self.dev)
        side.wait_stream(torch.cuda.current_stream(self.dev))
        with torch.cuda.stream(side):
            self._body(b, c)
        torch.cuda.current_stream(self.dev).wait_stream(side)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g, pool=self.pool, capture_error_mode="thread_local"):
            self._body(b, c)
        torch.cuda.synchronize(self.dev)
        self.graphs[(b, c)] = g
        return g

    def capture_all(self, min_ctx: int = 1, max_ctx: int | None = None, log=None) -> int:
        """Capture every bucket an iteration whose longest context lies in [min_ctx, max_ctx] can hit
        (max_ctx default: the pool's capacity), largest batch first so the shared pool grows once.
        Returns the number of graphs."""
        if not (self.mode == "graphs" and self.cuda):
            return 0
        lo = bucket(self.c_sizes, max(1, min_ctx))
        hi = bucket(self.c_sizes, min(max_ctx or self.meth.cap, self.meth.cap))
        cs = [c for c in self.c_sizes if lo <= c <= hi]
        self.set_inputs([0] * self.max_batch, [1] * self.max_batch)
        for b in reversed(self.b_sizes):
            for c in reversed(cs):
                if (b, c) not in self.graphs:
                    self._capture(b, c)
        if log:
            log(
                f"{self.meth.name}: captured {len(self.graphs)} decode-step graphs ({len(self.b_sizes)} batch x "
                f"{len(cs)} context buckets, contexts {cs[0]}..{cs[-1]})"
            )
        return len(self.graphs)

    def close(self) -> None:
        self.graphs.clear()
        self.pool = None
