"""The dense (non-attention) part of a decode step for n running requests, optionally as CUDA graphs.

A decode step is split at the attention calls into L + 1 segments (L layers):
  segment 0:      embed the n input tokens, RoPE tables for their positions, layer 0 norm + QKV + RoPE;
  segment l:      layer l-1 O projection + residual + MLP + residual, then layer l norm + QKV + RoPE;
  segment L:      layer L-1 O projection + MLP, final norm, LM head, argmax -> the next tokens.
Attention runs eagerly between segments (its kernels take ragged contexts and split counts chosen
per step).  Inputs and outputs live in static buffers per n, so each segment can be captured once
per batch size as a CUDA graph and replayed: a Python harness's decode step is otherwise bound by
per-op host overhead (~30 torch calls per layer) rather than by the GPU, which is not the system
the simulator models.  Graphs of every n share one memory pool; their temporaries die inside each
segment, and segments never run concurrently, which is what makes the sharing safe.
Without CUDA (CPU tests) or with graphs off the same segment functions run eagerly.
"""
from __future__ import annotations

import torch

from .model import RandomLlama


_PIN_OK = [True]


def pinned(t: torch.Tensor) -> torch.Tensor:
    """t in page-locked memory (async H2D), or t itself where pinning is refused (then the copy syncs)."""
    if _PIN_OK[0]:
        try:
            return t.pin_memory()
        except RuntimeError:
            _PIN_OK[0] = False
    return t


class _Bufs:
    def __init__(self, m: RandomLlama, n: int, dev):
        s = m.shape
        f16 = dict(dtype=torch.float16, device=dev)
        self.n = n
        self.longs = torch.zeros(2 * n, dtype=torch.int64, device=dev)   # rows (slot per row) | positions
        self.rows, self.pos = self.longs[:n], self.longs[n:]
        self.x = torch.zeros((n, s.hidden), **f16)
        self.cos = torch.zeros((n, 1, s.head_dim), **f16)
        self.sin = torch.zeros((n, 1, s.head_dim), **f16)
        self.q = torch.zeros((n, s.q_heads, s.head_dim), **f16)
        self.k = torch.zeros((n, s.kv_heads, s.head_dim), **f16)
        self.v = torch.zeros((n, s.kv_heads, s.head_dim), **f16)
        self.attn = torch.zeros((n, s.q_heads * s.head_dim), **f16)


class DenseSteps:
    def __init__(self, model: RandomLlama, max_n: int, use_graphs: bool | None = None):
        self.m = model
        self.dev = model.device
        self.max_n = max_n
        self.use_graphs = (self.dev.type == "cuda") if use_graphs is None else use_graphs
        self.tok_slots = torch.zeros(max_n, dtype=torch.int64, device=self.dev)   # next input token per slot
        self.bufs: dict[int, _Bufs] = {}
        self.graphs: dict[int, list] = {}
        self.pool = None
        self.graph_error: str | None = None

    def _seg(self, b: _Bufs, i: int) -> None:
        m, L = self.m, len(self.m.layers)
        if i == 0:
            b.x.copy_(m.embed[self.tok_slots[b.rows]])
            c, s = m.rope_tables(b.pos)
            b.cos.copy_(c)
            b.sin.copy_(s)
        else:
            b.x.copy_(m.finish_layer(m.layers[i - 1], b.x, b.attn))
        if i < L:
            q, k, v = m.qkv(m.layers[i], b.x, (b.cos, b.sin))
            b.q.copy_(q)
            b.k.copy_(k)
            b.v.copy_(v)
        else:
            self.tok_slots.index_copy_(0, b.rows, m.next_token(b.x))

    def prepare(self, n: int) -> None:
        """Static buffers for n rows and, with graphs on, the L + 1 captured segments."""
        if n in self.bufs and (n in self.graphs or not self.use_graphs):
            return
        b = self.bufs.setdefault(n, _Bufs(self.m, n, self.dev))
        if not self.use_graphs:
            return
        saved = self.tok_slots.clone()
        try:
            if self.pool is None:
                self.pool = torch.cuda.graph_pool_handle()
            side = torch.cuda.Stream(self.dev)
            side.wait_stream(torch.cuda.current_stream(self.dev))
            with torch.cuda.stream(side):       # warm-up outside capture (cuBLAS handles, workspaces)
                for i in range(len(self.m.layers) + 1):
                    self._seg(b, i)
            torch.cuda.current_stream(self.dev).wait_stream(side)
            torch.cuda.synchronize(self.dev)
            gs = []
            for i in range(len(self.m.layers) + 1):
                g = torch.cuda.CUDAGraph()
                with torch.cuda.graph(g, pool=self.pool):
                    self._seg(b, i)
                gs.append(g)
            self.graphs[n] = gs
        except Exception as e:   # never lose a run to capture: fall back to eager segments
            self.use_graphs = False
            self.graphs.clear()
            self.graph_error = f"{type(e).__name__}: {e}"
        finally:
            self.tok_slots.copy_(saved)
            if self.dev.type == "cuda":
                torch.cuda.synchronize(self.dev)

    def prepare_all(self) -> None:
        for n in range(self.max_n, 0, -1):   # largest first: the shared pool grows once
            self.prepare(n)

    def run_segment(self, b: _Bufs, i: int) -> None:
        if self.use_graphs and b.n in self.graphs:
            self.graphs[b.n][i].replay()
        else:
            self._seg(b, i)

    def begin(self, n: int, longs_host: torch.Tensor) -> _Bufs:
        """longs_host: (2n,) int64 CPU tensor [slot of each row | position of each row]."""
        self.prepare(n)
        b = self.bufs[n]
        if self.dev.type == "cuda":
            b.longs.copy_(pinned(longs_host), non_blocking=True)
        else:
            b.longs.copy_(longs_host)
        self.run_segment(b, 0)
        return b

    def after_attention(self, b: _Bufs, layer: int, o: torch.Tensor) -> None:
        b.attn.copy_(o.reshape(b.n, -1))
        self.run_segment(b, layer + 1)
