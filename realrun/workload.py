"""Seeded Poisson workload: the same requests for every method at a given (seed, rate).

Draw order (fixed, so a seed always gives the same bytes): n exponential inter-arrival gaps of
mean 1/rate, then n prompt lengths uniform on [prompt_min, prompt_max], then n output lengths
uniform on [output_min, output_max] (integers, both ends included).  Prompt token ids are drawn
per request from (seed, request_id) when the request is prefilled.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Request:
    request_id: int
    arrival_s: float
    prompt_tokens: int
    output_tokens: int


def poisson_workload(
    n: int,
    rate_rps: float,
    seed: int,
    prompt_range: tuple[int, int] = (1024, 8192),
    output_range: tuple[int, int] = (16, 128),
) -> list[Request]:
    if n < 1 or rate_rps <= 0:
        raise ValueError("need n >= 1 requests and rate > 0")
    if output_range[0] < 2:
        raise ValueError("outputs must be >= 2 tokens (prefill emits the first, decode the rest)")
    rng = np.random.default_rng(seed)
    arrivals = np.cumsum(rng.exponential(1.0 / rate_rps, n))
    prompts = rng.integers(prompt_range[0], prompt_range[1], n, endpoint=True)
    outputs = rng.integers(output_range[0], output_range[1], n, endpoint=True)
    return [Request(i, float(a), int(p), int(o)) for i, (a, p, o) in enumerate(zip(arrivals, prompts, outputs))]
