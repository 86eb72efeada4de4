"""A Llama-architecture decoder with random (seeded) FP16 weights, at real shapes.

Modelled: token embedding, per layer RMSNorm -> fused QKV projection -> RoPE (theta 500000, no
Llama-3.1 long-context frequency scaling: timing does not depend on it) -> GQA attention (supplied
by the KV method, see kvformats.py) -> O projection -> residual -> RMSNorm -> SwiGLU MLP (fused
gate/up projection) -> residual; final RMSNorm, LM head, greedy argmax.  Weights are N(0, 1/fan_in)
so activations stay O(1) in FP16 over 32 layers; values are meaningless, shapes and work are real.
The KV of prompt/decode tokens is handed to a callback, the attention itself is a callback too, so
the same forward serves every KV method.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch
import torch.nn.functional as F


@dataclass(frozen=True)
class ModelShape:
    name: str
    layers: int
    hidden: int
    q_heads: int
    kv_heads: int
    head_dim: int
    mlp: int
    vocab: int
    rope_theta: float = 500000.0
    norm_eps: float = 1e-5

    @property
    def kv_dim(self) -> int:
        return self.kv_heads * self.head_dim

    def params(self) -> int:
        h, d = self.hidden, self.head_dim
        per_layer = h * (self.q_heads + 2 * self.kv_heads) * d + self.q_heads * d * h + 3 * h * self.mlp + 2 * h
        return self.layers * per_layer + 2 * self.vocab * h + h


PRESETS = {
    "llama-3.1-8b": ModelShape("llama-3.1-8b", 32, 4096, 32, 8, 128, 14336, 128256),
    "llama-3.1-70b": ModelShape("llama-3.1-70b", 80, 8192, 64, 8, 128, 28672, 128256),
    # CPU tests: head_dim 128 because the HACK kernels require it; everything else tiny.
    "tiny": ModelShape("tiny", 2, 256, 2, 1, 128, 512, 512),
}


def model_shape(name: str, layers: int | None = None) -> ModelShape:
    shape = PRESETS[name]
    return replace(shape, layers=layers) if layers else shape


class RandomLlama:
    """Weights on `device` in FP16; layer l's tensors in self.layers[l]."""

    def __init__(self, shape: ModelShape, device: str | torch.device, seed: int = 0, max_positions: int = 16384):
        self.shape = shape
        self.device = torch.device(device)
        g = torch.Generator(device=self.device)
        g.manual_seed(seed)
        s, dt = shape, torch.float16

        def w(out_f: int, in_f: int) -> torch.Tensor:  # (out, in) as F.linear takes it
            t = torch.randn((out_f, in_f), generator=g, device=self.device, dtype=dt)
            return t.mul_(in_f**-0.5)

        self.embed = torch.randn((s.vocab, s.hidden), generator=g, device=self.device, dtype=dt)
        self.layers = []
        for _ in range(s.layers):
            self.layers.append(
                {
                    "attn_norm": torch.ones(s.hidden, device=self.device, dtype=dt),
                    "wqkv": w((s.q_heads + 2 * s.kv_heads) * s.head_dim, s.hidden),
                    "wo": w(s.hidden, s.q_heads * s.head_dim),
                    "mlp_norm": torch.ones(s.hidden, device=self.device, dtype=dt),
                    "w_gate_up": w(2 * s.mlp, s.hidden),
                    "w_down": w(s.hidden, s.mlp),
                }
            )
        self.final_norm = torch.ones(s.hidden, device=self.device, dtype=dt)
        self.lm_head = w(s.vocab, s.hidden)
        inv = 1.0 / (s.rope_theta ** (torch.arange(0, s.head_dim, 2, dtype=torch.float32) / s.head_dim))
        ang = torch.arange(max_positions, dtype=torch.float32)[:, None] * inv[None, :]  # (P, D/2)
        self.cos = ang.cos().to(self.device)
        self.sin = ang.sin().to(self.device)

    # ---- pieces ----------------------------------------------------------------------------
    # Few, fused torch calls: the decode step of a Python harness is bound by per-op host overhead.
    def rmsnorm(self, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return F.rms_norm(x, (x.shape[-1],), w, self.shape.norm_eps)

    def rope_tables(self, pos: torch.Tensor):
        """pos (T,) int64 -> (cos, sin) (T, 1, D) fp16 for rotate-half RoPE; computed once per step."""
        c, s = self.cos[pos], self.sin[pos]
        return (torch.cat([c, c], -1)[:, None].half(), torch.cat([-s, s], -1)[:, None].half())

    def qkv(self, layer: dict, x: torch.Tensor, rot):
        """x (T, hidden) -> q (T, HQ, D), k, v (T, HKV, D) (views, not contiguous), RoPE on q and k."""
        s = self.shape
        h = F.linear(self.rmsnorm(x, layer["attn_norm"]), layer["wqkv"])
        nq = s.q_heads + s.kv_heads
        qk = h[:, : nq * s.head_dim].view(-1, nq, s.head_dim)
        x1, x2 = qk.chunk(2, -1)
        qk = torch.addcmul(qk * rot[0], torch.cat([x2, x1], -1), rot[1])  # sin table carries the sign
        v = h[:, nq * s.head_dim :].view(-1, s.kv_heads, s.head_dim)
        return qk[:, : s.q_heads], qk[:, s.q_heads :], v

    def finish_layer(self, layer: dict, x: torch.Tensor, attn: torch.Tensor) -> torch.Tensor:
        """attn (T, HQ*D) -> x after the O projection, the MLP and both residuals."""
        x = x + F.linear(attn, layer["wo"])
        gu = F.linear(self.rmsnorm(x, layer["mlp_norm"]), layer["w_gate_up"])
        g, u = gu.chunk(2, -1)
        return x + F.linear(F.silu(g) * u, layer["w_down"])

    def next_token(self, x_last: torch.Tensor) -> torch.Tensor:
        """x_last (N, hidden) -> greedy next token ids (N,) int64."""
        return F.linear(self.rmsnorm(x_last, self.final_norm), self.lm_head).argmax(-1)

    def logits(self, x_last: torch.Tensor) -> torch.Tensor:
        return F.linear(self.rmsnorm(x_last, self.final_norm), self.lm_head)


def reference_logits(model: RandomLlama, tokens: torch.Tensor) -> torch.Tensor:
    """Float32 full-sequence forward (causal, exact FP attention) -> logits of the last position.
    The correctness check compares a decode step with this."""
    s = model.shape
    x = model.embed[tokens].float()
    pos = torch.arange(tokens.numel(), device=tokens.device)
    for lw in model.layers:
        f = {k: v.float() for k, v in lw.items()}
        xn = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + s.norm_eps) * f["attn_norm"]
        h = xn @ f["wqkv"].T
        q, k, v = h.split([s.q_heads * s.head_dim, s.kv_dim, s.kv_dim], -1)
        q = _rope_f32(model, q.reshape(-1, s.q_heads, s.head_dim), pos)
        k = _rope_f32(model, k.reshape(-1, s.kv_heads, s.head_dim), pos)
        v = v.reshape(-1, s.kv_heads, s.head_dim)
        o = F.scaled_dot_product_attention(
            q.transpose(0, 1)[None], k.transpose(0, 1)[None], v.transpose(0, 1)[None], is_causal=True, enable_gqa=True
        )
        x = x + o[0].transpose(0, 1).reshape(len(tokens), -1) @ f["wo"].T
        xn = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + s.norm_eps) * f["mlp_norm"]
        g, u = (xn @ f["w_gate_up"].T).chunk(2, -1)
        x = x + (F.silu(g) * u) @ f["w_down"].T
    xl = x[-1:]
    xl = xl * torch.rsqrt(xl.pow(2).mean(-1, keepdim=True) + s.norm_eps) * model.final_norm.float()
    return (xl @ model.lm_head.float().T)[0]


def _rope_f32(model: RandomLlama, x: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
    c = model.cos[pos][:, None, :]
    s = model.sin[pos][:, None, :]
    x1, x2 = x.chunk(2, -1)
    return torch.cat([x1 * c - x2 * s, x2 * c + x1 * s], -1)
