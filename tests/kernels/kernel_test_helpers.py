"""Shared helpers for the kernel tests: device choice and relative error."""

import torch

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def rel_err(out, ref) -> float:
    out = out.double().cpu()
    ref = ref.double().cpu()
    assert torch.isfinite(out).all(), "non-finite output"
    return float((out - ref).norm() / ref.norm())


def randn(*shape, scale=1.0, gen=None):
    return (torch.randn(*shape, generator=gen) * scale).half().to(DEVICE)
