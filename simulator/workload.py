"""Requests of a run: arrival times and prompt/output lengths, drawn from one seeded generator.

Every method of a scenario sees the same requests (drawn once), so differences between methods
are the methods', not the sampler's. Lengths are truncated by resampling, not clipping, so a
truncated lognormal keeps its shape inside [min, max].
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd

from .config import (
    BurstyArrivals,
    FixedLength,
    LognormalLength,
    PoissonArrivals,
    Scenario,
    ScenarioError,
    UniformLength,
    WorkloadConfig,
)
from .trace_rows import WORKLOAD_TRACE, WORKLOAD_TRACE_TIMED, check_trace_rows, read_csv_table


@dataclass(frozen=True)
class Requests:
    arrival_s: np.ndarray  # (N,) float64, non-decreasing
    prompt_tokens: np.ndarray  # (N,) int64
    output_tokens: np.ndarray  # (N,) int64, >= 1
    block_hashes: tuple | SharedPrefixBlocks | None = None  # per request, its prompt's prefix-block hashes
    hash_block_tokens: int = 512  # tokens per hash block (Mooncake's hash_ids: 512)

    def __len__(self) -> int:
        return len(self.arrival_s)


class SharedPrefixBlocks:
    """The hash blocks of `workload.prefix_sharing`'s prompts, made on demand (a tuple per request would
    take ~40 bytes per block): request i's first min(prompt, shared_tokens) // block_tokens blocks are its
    group's, numbered group · shared_blocks + j; its other blocks are its own, numbered after every
    group's."""

    def __init__(
        self, group: np.ndarray, prompt_tokens: np.ndarray, shared_tokens: int, block_tokens: int, groups: int
    ):
        self.group = group.tolist()
        self.shared_blocks = shared_tokens // block_tokens
        self.block_tokens = block_tokens
        prompt = prompt_tokens.tolist()
        self.own_blocks = [0] * len(prompt)
        self.first_own = [0] * len(prompt)
        nxt = groups * self.shared_blocks
        for i, p in enumerate(prompt):
            shared = min(self.shared_blocks, p // block_tokens)
            own = -(-p // block_tokens) - shared
            self.first_own[i], self.own_blocks[i] = nxt, own
            nxt += own
        self._shared = [min(self.shared_blocks, p // block_tokens) for p in prompt]

    def __len__(self) -> int:
        return len(self.group)

    def __getitem__(self, i: int) -> list[int]:
        base = self.group[i] * self.shared_blocks
        first = self.first_own[i]
        return [*range(base, base + self._shared[i]), *range(first, first + self.own_blocks[i])]

    def reordered(self, order: np.ndarray) -> SharedPrefixBlocks:
        out = object.__new__(SharedPrefixBlocks)
        out.shared_blocks, out.block_tokens = self.shared_blocks, self.block_tokens
        for name in ("group", "own_blocks", "first_own", "_shared"):
            values = getattr(self, name)
            setattr(out, name, [values[i] for i in order])
        return out


def lognormal_mass(dist: LognormalLength) -> float:
    """Probability that a draw, rounded to a whole token count, lands in [min_tokens, max_tokens]."""
    sigma = math.sqrt(math.log1p(dist.cv**2))
    mu = math.log(dist.mean_tokens) - sigma**2 / 2
    cdf = lambda x: 0.5 * math.erfc(-(math.log(x) - mu) / (sigma * math.sqrt(2))) if x > 0 else 0.0  # noqa: E731
    return cdf(dist.max_tokens + 0.5) - cdf(dist.min_tokens - 0.5)


MIN_LOGNORMAL_MASS = 0.01  # below this, resampling would take ~n/mass draws: refuse instead


def sample_lengths(dist, n: int, rng: np.random.Generator, what: str = "workload") -> np.ndarray:
    if isinstance(dist, FixedLength):
        return np.full(n, dist.tokens, dtype=np.int64)
    if isinstance(dist, UniformLength):
        return rng.integers(dist.min_tokens, dist.max_tokens + 1, size=n, dtype=np.int64)
    if isinstance(dist, LognormalLength):
        mass = lognormal_mass(dist)
        if mass < MIN_LOGNORMAL_MASS:
            raise ScenarioError(
                f"{what}: only {mass:.2g} of the lognormal lies inside [min_tokens, max_tokens]; "
                f"widen them or move mean_tokens"
            )
        sigma2 = math.log1p(dist.cv**2)
        mu = math.log(dist.mean_tokens) - sigma2 / 2
        out = np.empty(n, dtype=np.int64)
        filled = 0
        for _ in range(1000):
            draw = np.rint(rng.lognormal(mu, math.sqrt(sigma2), size=2 * (n - filled) + 16)).astype(np.int64)
            keep = draw[(draw >= dist.min_tokens) & (draw <= dist.max_tokens)][: n - filled]
            out[filled : filled + len(keep)] = keep
            filled += len(keep)
            if filled == n:
                return out
        raise ScenarioError(f"{what}: the length distribution puts almost no mass inside [min_tokens, max_tokens]")
    raise TypeError(dist)


def sample_gaps(arrival, n: int, rng: np.random.Generator) -> np.ndarray:
    if isinstance(arrival, PoissonArrivals):
        return rng.exponential(1.0 / arrival.rate_rps, size=n)
    if isinstance(arrival, BurstyArrivals):
        shape = 1.0 / arrival.cv**2  # gamma gaps with the given mean and coefficient of variation
        return rng.gamma(shape, 1.0 / (arrival.rate_rps * shape), size=n)
    raise TypeError(arrival)


def read_trace(path: str, timed: bool) -> pd.DataFrame:
    """The trace's rows, checked (see simulator.trace_rows); `timed`: its arrival_s column is used."""
    df = read_csv_table(path, ScenarioError)
    return check_trace_rows(
        df, f"workload.trace_csv {path}", WORKLOAD_TRACE_TIMED if timed else WORKLOAD_TRACE, ScenarioError
    )


def make_requests(scenario: Scenario) -> Requests:
    wl: WorkloadConfig = scenario.workload
    n = wl.requests
    rng = np.random.default_rng(wl.seed)
    hashes = None
    if wl.trace is not None:
        from .traces import load_trace

        trace = load_trace(wl.trace)
        n = n or len(trace)
        idx = np.arange(n) % len(trace)
        prompt, output = trace.prompt_tokens[idx], trace.output_tokens[idx]
        arrival = trace.arrival_s[idx] + (np.arange(n) // len(trace)) * _period(trace.arrival_s)
        if trace.block_hashes is not None:
            hashes = tuple(trace.block_hashes[i] for i in idx)
    elif wl.trace_csv is not None:
        assert n is not None and wl.arrival is not None  # WorkloadConfig requires both without a trace
        df = read_trace(wl.trace_csv, timed=wl.arrival.kind == "trace")
        idx = np.arange(n) % len(df)
        prompt = df["prompt_tokens"].to_numpy(np.int64)[idx]
        output = df["output_tokens"].to_numpy(np.int64)[idx]
        if wl.arrival.kind == "trace":
            base = df["arrival_s"].to_numpy(np.float64)
            arrival = base[idx] + (np.arange(n) // len(df)) * _period(base)
        else:
            arrival = np.cumsum(sample_gaps(wl.arrival, n, rng))
    else:
        assert n is not None and wl.arrival is not None  # as above
        prompt = sample_lengths(wl.input_tokens, n, rng, "workload.input_tokens")
        output = sample_lengths(wl.output_tokens, n, rng, "workload.output_tokens")
        arrival = np.cumsum(sample_gaps(wl.arrival, n, rng))
    if (prompt < 1).any() or (output < 1).any():
        raise ScenarioError("workload: every request needs prompt_tokens >= 1 and output_tokens >= 1")
    too_long = prompt + output > scenario.model.max_context_tokens
    if too_long.any():
        i = int(np.argmax(too_long))
        raise ScenarioError(
            f"workload: request {i} needs {prompt[i] + output[i]} tokens of context, more than "
            f"model.max_context_tokens={scenario.model.max_context_tokens}"
        )
    order = np.argsort(arrival, kind="stable")
    block_tokens = 512
    if wl.prefix_sharing is not None:
        ps = wl.prefix_sharing
        group = rng.integers(0, ps.groups, size=n)  # drawn last: other workloads' draws are unchanged
        blocks = SharedPrefixBlocks(group, prompt, ps.shared_tokens, ps.block_tokens, ps.groups)
        return Requests(
            arrival_s=np.asarray(arrival, np.float64)[order],
            prompt_tokens=prompt[order],
            output_tokens=output[order],
            block_hashes=blocks.reordered(order),
            hash_block_tokens=ps.block_tokens,
        )
    return Requests(
        arrival_s=np.asarray(arrival, np.float64)[order],
        prompt_tokens=prompt[order],
        output_tokens=output[order],
        block_hashes=None if hashes is None else tuple(hashes[i] for i in order),
        hash_block_tokens=block_tokens,
    )


def _period(arrival_s: np.ndarray) -> float:
    """How far a cycled trace's next pass starts after its first: its span plus one mean gap."""
    span = arrival_s.max() - arrival_s.min() if len(arrival_s) > 1 else 0.0
    return span + span / max(len(arrival_s) - 1, 1)
