"""Stand-ins for driving one DecodeReplica by hand in a SimPy environment: a cost model whose every iteration costs
the same, a listener that holds nothing, and the Records of n identical requests."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np

from costmodel.phases import IterationCost
from simulator.columns import Records


class FixedCost:
    """A decode replica's cost model reduced to what the replica asks: every iteration costs `fixed_s`."""

    def __init__(self, fixed_s: float, serial_s: float = 0.0):
        self.kv_capacity_bytes = 1e12
        self.method = SimpleNamespace(dequantize_on_arrival=False)
        self.join_s_per_request = 0.0
        self.leave_s_per_request = 0.0
        self.kv_placement_bytes_per_s = 0.0
        self.placement_s_per_token = 0.0  # what placement_s charges per context token (with a rate set)
        self.host_serial_s_per_iteration = serial_s
        self.attention_padding_share = 0.0  # decode priced by the total context
        self._it = IterationCost(fixed_s, 0.0, 0.0, 0.0, 0.0)

    def placement_s(self, context_tokens: float) -> float:
        return self.placement_s_per_token * context_tokens

    def iteration(self, batch_size: int) -> IterationCost:
        return self._it


class Listener:
    hold_kv = False

    def release_kv(self, rid: int) -> None:
        pass

    def on_memory_freed(self) -> None:
        pass


def records(n: int, iterations: int | list[int] = 10) -> Records:
    """n requests of 100 prompt tokens and `iterations` decode iterations each (or one count per request), all
    arrived at 0."""
    one = np.ones(n)
    iterations = np.asarray(iterations, dtype=np.float64) * one
    return Records(
        prompt=one * 100,
        output=one * (iterations + 1),
        arrival_s=one * 0,
        wire_bytes=one,
        kv_bytes=one,
        admit_bytes=None,
        host_kv_bytes=one * 0,
        decode_iterations=one * iterations,
        join_context=one * 100,
        ttft_at_decode=False,
    )
