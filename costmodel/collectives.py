"""Collectives between the GPUs of a replica: the tensor-parallel all-reduce and the pipeline send/recv.

Each algorithm costs a latency plus the bytes it moves over a bandwidth (catalog/data/interconnects.yaml
gives the constants, fitted to cited measurements of isolated collectives, and the formulas):

* one-shot (engines' custom all-reduce): every rank reads every peer's buffer, (p − 1)·n bytes;
* two-shot: reduce-scatter then all-gather through peer memory, 2(p − 1)/p · n bytes;
* ring (NCCL): 2(p − 1) steps of a per-step latency and 2(p − 1)/p · n bytes at the bus bandwidth;
* send/recv (pipeline stages on different instances): a latency and n bytes over the network;
* all-to-all (MoE expert parallelism: tokens dispatched to their experts' GPUs and combined back): every
  rank sends (p − 1)/p of its n-byte buffer to its peers at once, one step of latency and that share of
  the bytes at the bus bandwidth (nccl-tests' alltoall busbw = algbw · (p − 1)/p).

Which one a message uses follows vLLM's custom all-reduce (csrc/custom_all_reduce.cuh,
device_communicators/custom_all_reduce.py): the custom kernels need peer-to-peer access between every pair
of GPUs over NVLink (any p) or exactly two GPUs on PCIe, and messages of at most 8 MiB; one-shot for two
GPUs, below 512 KiB on up to four and below 256 KiB on up to eight; two-shot above that; NCCL's ring
otherwise.  Times work on numpy arrays of message sizes (the dense-layer tables).

Peer access.  ``CustomAllreduce.__init__`` returns disabled when ``_can_p2p`` (``gpu_p2p_access_check``:
cudaDeviceCanAccessPeer plus a transfer test) fails, logging "your platform lacks GPU P2P capability"; and
NCCL, without peer access, moves every ring step through pinned host memory (its SHM transport: the sender
writes over its PCIe link into host memory, the receiver reads it over its own).  GeForce GPUs have no peer
access with the stock driver (NCCL maintainer, NVIDIA/nccl-tests#287), nor do GPUs a hypervisor keeps apart.
Such a pool resolves to the ``pcie_host`` interconnect (``Interconnect.peer_access`` False): no one-/two-shot
kernels for any p, and NCCL's ring with that entry's per-step latency and bus efficiency, fitted to a 2-GPU
RTX 4090 alltoall with P2P disabled (tinygrad/open-gpu-kernel-modules#17: 11.7 us for 8-64 B) and the
host-staged copy rate between two RTX 3090s with peer access off (noonghunna/club-3090 docs/PCIE_P2P.md:
16.77 GB/s both ways on Gen4 x16), cross-checked against NCCL's SHM all-reduce on one channel
(NVIDIA/nccl#384: 3.9 GB/s bus bandwidth on Gen3 x16).  ``path`` names which of these a pool takes.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

KIB = 1024
MIB = 1024 * 1024
CUSTOM_ALLREDUCE_MAX_BYTES = 8 * MIB  # vLLM CustomAllreduce(max_size=8192 * 1024)
ONE_SHOT_MAX_BYTES = ((2, float("inf")), (4, 512 * KIB), (8, 256 * KIB))  # (up to p GPUs, below this size)
CUSTOM_ALLREDUCE_WORLD_SIZES = (2, 4, 6, 8)


@dataclass(frozen=True)
class AlgorithmFit:
    latency_s: float
    link_fraction: float = 0.0  # one-/two-shot: achieved bandwidth / link bandwidth
    step_latency_s: float = 0.0  # ring: per step, 2(p - 1) steps
    bus_efficiency: float = 0.0  # ring / send-recv: bus bandwidth / link bandwidth


@dataclass(frozen=True)
class Interconnect:
    """One interconnect's collective constants (catalog/data/interconnects.yaml)."""

    key: str
    custom_allreduce: bool  # every GPU pair peer-to-peer: engines' one-/two-shot kernels for any p
    peer_access: bool = True  # GPUs reach each other's memory (else NCCL through host memory, no custom kernels)
    one_shot: AlgorithmFit | None = None
    two_shot: AlgorithmFit | None = None
    ring: AlgorithmFit | None = None
    sendrecv: AlgorithmFit | None = None
    alltoall: AlgorithmFit | None = None


def _fit(ic: Interconnect | None, algorithm: str) -> AlgorithmFit:
    """The interconnect's constants for one algorithm; a clear error where the catalog gives none."""
    fit = getattr(ic, algorithm, None)
    if fit is None:
        where = "no interconnect" if ic is None else f"interconnect {ic.key}"
        raise ValueError(f"{where}: no {algorithm} constants (catalog/data/interconnects.yaml)")
    return fit


def _custom_ok(ic: Interconnect | None, p: int) -> bool:
    return (
        ic is not None
        and ic.peer_access
        and ic.one_shot is not None
        and p in CUSTOM_ALLREDUCE_WORLD_SIZES
        and (ic.custom_allreduce or p == 2)
    )


def _one_shot_max_bytes(p: int) -> float:
    return next(limit for up_to, limit in ONE_SHOT_MAX_BYTES if p <= up_to)


def allreduce_algorithm(n_bytes: float, p: int, ic: Interconnect | None) -> str:
    """'one_shot', 'two_shot' or 'ring' for an all-reduce of n_bytes per rank over p GPUs ('none' for p = 1)."""
    if p == 1:
        return "none"
    if _custom_ok(ic, p) and n_bytes <= CUSTOM_ALLREDUCE_MAX_BYTES:
        return "one_shot" if n_bytes < _one_shot_max_bytes(p) else "two_shot"
    return "ring"


def one_shot_s(n_bytes, p: int, fit: AlgorithmFit, link_gb_per_s: float):
    return fit.latency_s + (p - 1) * n_bytes / (fit.link_fraction * link_gb_per_s * 1e9)


def two_shot_s(n_bytes, p: int, fit: AlgorithmFit, link_gb_per_s: float):
    return fit.latency_s + 2 * (p - 1) / p * n_bytes / (fit.link_fraction * link_gb_per_s * 1e9)


def ring_s(n_bytes, p: int, fit: AlgorithmFit, link_gb_per_s: float):
    return (
        fit.latency_s
        + 2 * (p - 1) * fit.step_latency_s
        + 2 * (p - 1) / p * n_bytes / (fit.bus_efficiency * link_gb_per_s * 1e9)
    )


def allreduce_s(n_bytes, p: int, ic: Interconnect | None, link_gb_per_s: float):
    """Seconds of one all-reduce of n_bytes per rank over p GPUs; n_bytes may be a numpy array."""
    if p == 1:
        return n_bytes * 0.0
    ring = ring_s(n_bytes, p, _fit(ic, "ring"), link_gb_per_s)
    if not _custom_ok(ic, p):
        return ring
    one = one_shot_s(n_bytes, p, _fit(ic, "one_shot"), link_gb_per_s)
    two = two_shot_s(n_bytes, p, _fit(ic, "two_shot"), link_gb_per_s)
    custom = np.where(n_bytes < _one_shot_max_bytes(p), one, two)
    out = np.where(n_bytes <= CUSTOM_ALLREDUCE_MAX_BYTES, custom, ring)
    return float(out) if np.ndim(out) == 0 else out


def sendrecv_s(n_bytes, ic: Interconnect | None, link_gb_per_s: float):
    """Seconds of one point-to-point transfer of n_bytes (link in GB/s)."""
    fit = _fit(ic, "sendrecv")
    return fit.latency_s + n_bytes / (fit.bus_efficiency * link_gb_per_s * 1e9)


def alltoall_s(n_bytes, p: int, ic: Interconnect | None, link_gb_per_s: float):
    """Seconds of one all-to-all in which each of p ranks holds an n_bytes buffer, (p − 1)/p of it bound
    for its peers; n_bytes may be a numpy array."""
    if p == 1:
        return n_bytes * 0.0
    fit = _fit(ic, "alltoall")
    return fit.latency_s + (p - 1) / p * n_bytes / (fit.bus_efficiency * link_gb_per_s * 1e9)


def from_catalog(entry: dict) -> Interconnect:
    """An Interconnect from its catalog/data/interconnects.yaml entry (a plain dict)."""

    def fit(name):
        f = entry.get(name)
        return None if f is None else AlgorithmFit(**f)

    return Interconnect(
        key=entry["key"],
        custom_allreduce=bool(entry.get("custom_allreduce")),
        peer_access=bool(entry.get("peer_access", True)),
        one_shot=fit("one_shot"),
        two_shot=fit("two_shot"),
        ring=fit("ring"),
        sendrecv=fit("sendrecv"),
        alltoall=fit("alltoall"),
    )


def path(ic: Interconnect | None, p: int) -> str:
    """In words, how a tensor-parallel group of p GPUs all-reduces on this interconnect."""
    if p == 1:
        return "none: one GPU per stage"
    if ic is None:
        return "none"
    if not ic.peer_access:
        return f"NCCL ring through host memory ({ic.key}): no peer access, so no custom all-reduce"
    if _custom_ok(ic, p):
        return (
            f"custom all-reduce (one-/two-shot over peer access, {ic.key}) up to "
            f"{CUSTOM_ALLREDUCE_MAX_BYTES // MIB} MiB, NCCL ring above"
        )
    why = "more than two GPUs on PCIe" if not ic.custom_allreduce else f"{p} GPUs (custom kernels take 2, 4, 6, 8)"
    return f"NCCL ring over peer access ({ic.key}); no custom all-reduce: {why}"


def report(par, hidden_size: int, tokens: list[int], active_experts: int = 0, fp16_bytes: int = 2) -> dict:
    """What a replica's collectives cost, for the outputs: its interconnect, and for each token count the
    all-reduce's message size, the algorithm that size takes and its time (plus the pipeline send/recv, and
    the MoE dispatch all-to-all under expert parallelism: each rank's tokens/p tokens, k copies each)."""
    ic, p = par.interconnect, par.tensor
    rows = []
    for t in tokens:
        n = t * hidden_size * fp16_bytes
        rows.append(
            {
                "tokens": t,
                "bytes": n,
                "algorithm": allreduce_algorithm(n, p, ic),
                "time_s": float(allreduce_s(n, p, ic, par.intra_node_gb_per_s)),
            }
        )
    out = {
        "interconnect": ic.key,
        "peer_access": ic.peer_access,
        "path": path(ic, p),
        "tensor_parallel": p,
        "link_gb_per_s": par.intra_node_gb_per_s,
        "allreduce": rows,
    }
    if getattr(par, "expert_parallel", False) and p > 1 and active_experts:
        out["alltoall"] = [
            {
                "tokens": t,
                "bytes": t / p * active_experts * hidden_size * fp16_bytes,
                "time_s": float(
                    alltoall_s(t / p * active_experts * hidden_size * fp16_bytes, p, ic, par.intra_node_gb_per_s)
                ),
            }
            for t in tokens
        ]
    if par.pipeline > 1:
        out["pipeline_sendrecv"] = [
            {
                "tokens": t,
                "bytes": t * hidden_size * fp16_bytes,
                "network_gbps": par.inter_stage_gbps,
                "time_s": float(sendrecv_s(t * hidden_size * fp16_bytes, par.network, par.inter_stage_gbps / 8)),
            }
            for t in tokens
        ]
    return out
