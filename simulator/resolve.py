"""Resolve a scenario once into typed, unit-named values: catalog entries, defaults, profiles, links, pool layouts.

`resolve(scenario)` is the one place a validated `Scenario` meets the catalog and the calibration
profiles; everything downstream (cost models, the simulator's entities, planning's cost columns)
reads the frozen `Resolved` it returns. The defaults it fills in:

* link bandwidth: `network.bandwidth_gbps`, else the prefill instance's line rate;
* a pool's GPU: the catalog preset, with overrides, or one's own short spec; the fields it leaves out are
  derived (costmodel/specs.py complete_gpu_fields) and listed in `PoolLayout.gpu_derived`;
* a pool's TP interconnect: `interconnect`, else the instance's `gpu_interconnect`, else PCIe; its
  bandwidth per GPU and direction: `intra_node_gb_per_s`, else the instance's, else the GPU's NVLink
  (nvlink, nvswitch) or PCIe rate; peer access between its GPUs: `peer_access`, else the instance's, else
  true over NVLink, else the GPU's `pcie_peer_access`; its collective constants from
  catalog/data/interconnects.yaml: the interconnect's entry, or `pcie_host` without peer access (NCCL
  through host memory, no custom all-reduce: costmodel/collectives.py);
  the pipeline hop between stages: the instance's network (Ethernet constants), else the link's;
* the host a replica runs on: host memory per replica (KV parked on prefill, offloaded on decode):
  `host.memory_gib` or `host_memory_gib`, else half the memory of the replica's instances, else 64 GiB;
  vCPUs per replica: `host.vcpus`, else the instances' (0 without); each GPU's link to host memory: the
  GPU's PCIe rate, capped by `host.pcie_gb_per_s` and by `host.memory_bandwidth_gb_per_s` shared among
  the GPUs of one host (the pool's GPUSpec carries the result as its pcie_gb_per_s);
* price per instance: the pool's `price_usd_per_hour`, else the catalog's (None: unknown);
* calibration profile per pool: `auto` (the committed profile for the GPU key, else the roofline),
  `roofline`, or a path to a profile.json; per method, its implementation profile's kernel costs
  (catalog/data/implementations.yaml, repriced for the pool's GPU) and then its own `kernels:` replace
  the profile's (simulator/implementations.py);
* warnings (`Resolved.warnings`, printed by the CLI and written to profiles.json): a pool priced by the
  roofline (no profile for its GPU), a profile measured or derived for another GPU than the pool's, and the
  GPU fields a pool's spec left to be derived;
* links: `network.links`, else one link per prefill replica reaching every decode replica; each
  link carries `bandwidth_gbps x efficiency` (the first link listed joins a pair of replicas);
  `per_flow_gbps` caps one transfer.

The engine's host costs: on the decode pool every term (`host_issue_s_*`, `host_serial_s_per_iteration`,
`extra_kernels_per_layer`); on the prefill pool the issue terms (`host_issue_s_*`, 0 by default: a prefill batch
lasts at least the CPU time to issue it, for an engine that launches prefill eagerly) and the serial time per batch
(`host_serial_s_per_iteration`: the CPU's work between a batch's KV encoded and the next step while the GPU waits,
simulator/prefill.py).
What an engine calibration fits (simulator/engine.py; `calibration.engine` applies its file when the
scenario is loaded) arrives here as scenario values: `decode.join_s_per_request`,
`prefill.prefill_efficiency`, and per method `calibration.implementation_factors` (all neutral by default).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from functools import cache
from pathlib import Path

import catalog
from costmodel import collectives
from costmodel.calibration import CalibrationProfile, load_profile
from costmodel.methods import KVMethod
from costmodel.phases import ReplicaCostModel, kv_heads_per_gpu
from costmodel.roofline import roofline_profile
from costmodel.specs import GIB, GPUSpec, ModelSpec, Parallelism, complete_gpu_fields

from .config import GPUConfig, ImplementationFactors, ModelConfig, PoolConfig, Scenario, ScenarioError
from .implementations import priced_profile

REPO_ROOT = Path(__file__).resolve().parent.parent
PROFILES_DIR = REPO_ROOT / "kernels_calibration" / "profiles"
DEFAULT_HOST_MEMORY_BYTES = 64 * GIB  # a pool given by GPU only: no instance to take host memory from


@dataclass(frozen=True)
class InstanceSpec:
    """A catalog instance (catalog/data/instances.yaml)."""

    key: str
    gpus: int
    vcpus: int
    host_memory_gib: float
    network_gbps: float
    gpu_interconnect: str
    intra_node_gb_per_s: float
    price_usd_per_hour: float | None
    peer_access: bool = True


@dataclass(frozen=True)
class HostCosts:
    """The engine's CPU work per decode iteration or prefill batch (all 0: an engine that replays CUDA
    graphs; on the prefill pool serial time and extra kernels stay 0)."""

    issue_s_per_iteration: float = 0.0
    issue_s_per_layer: float = 0.0
    issue_s_per_request: float = 0.0
    serial_s_per_iteration: float = 0.0
    exposed_s_per_iteration: float = 0.0  # a prefill's CPU time the GPU cannot overlap (pool.host_exposed_s_*)
    exposed_s_per_layer: float = 0.0
    first_seen_s_per_iteration: float = 0.0  # a prefill batch of a token count not run before (pool.host_first_seen_*)
    first_seen_fade_s: float = 0.0  # the GPU time over which that extra hides (pool.host_first_seen_fade_s)
    extra_kernels_per_layer: int = 0
    decode_graphs: bool = False  # decode iterations replayed as CUDA graphs (pool.cuda_graphs)


@dataclass(frozen=True)
class PoolLayout:
    """One pool (prefill or decode) resolved: its hardware, layout, limits and profile."""

    name: str  # "prefill" or "decode"
    gpu: GPUSpec
    parallel: Parallelism
    profile: CalibrationProfile
    replicas: int
    instance: InstanceSpec | None
    instances_per_replica: int
    max_batch_requests: int
    max_batch_tokens: int
    gpu_memory_utilization: float
    host_memory_bytes: float  # per replica
    host_vcpus: int  # per replica
    kv_capacity_override_bytes: float | None
    price_usd_per_hour: float | None  # per instance
    host: HostCosts
    block_tokens: int  # KV tokens per block (costmodel/memory.py)
    cuda_graph_bytes: float  # per GPU
    non_torch_override_bytes: float | None  # per GPU: replaces the non-torch estimate
    join_s_per_request: float = 0.0  # decode: the engine's extra time in the iteration a request joins
    leave_s_per_request: float = 0.0  # decode: ... and in the iteration after a request leaves
    kv_placement_bytes_per_s: float = 0.0  # decode: the engine's KV copies at a batch change (0: none)
    prefill_efficiency: float = 1.0  # prefill: the fraction of the priced GPU speed the engine reaches
    gpu_derived: tuple[tuple[str, object, str], ...] = ()  # (field, value, rule) the GPU's spec left out
    warnings: tuple[str, ...] = ()  # roofline pricing, a profile for another GPU, derived GPU fields

    def cost_model(
        self, model: ModelSpec, method: KVMethod, impl: ImplementationFactors | None = None
    ) -> ReplicaCostModel:
        """The cost model of one replica of this pool running `method` (priced as its implementation runs),
        with the engine's implementation factors for it (an engine calibration), if any."""
        h = self.host
        engine = (
            {}
            if impl is None
            else {
                "quantize_factor": impl.quantize,
                "dequantize_factor": impl.dequantize,
                "approximation_factor": impl.approximation,
                "method_prefill_issue_s_per_layer": impl.prefill_issue_s_per_layer if self.name == "prefill" else 0.0,
                "method_quantize_issue_s_per_layer": impl.quantize_issue_s_per_layer,  # colocated: the chunks' encode
                "method_decode_kernels_per_layer": impl.decode_kernels_per_layer,
                "attention_padding_share": impl.attention_padding_share,
            }
        )
        return ReplicaCostModel(
            model=model,
            gpu=self.gpu,
            parallel=self.parallel,
            method=method,
            profile=priced_profile(
                self.profile, method, self.gpu, kv_heads_per_gpu(model, self.parallel) * model.head_dim
            ),
            gpu_memory_utilization=self.gpu_memory_utilization,
            max_batch_tokens=self.max_batch_tokens,
            host_vcpus=self.host_vcpus,
            kv_capacity_override_bytes=self.kv_capacity_override_bytes,
            host_issue_s_per_iteration=h.issue_s_per_iteration,
            host_issue_s_per_layer=h.issue_s_per_layer,
            host_issue_s_per_request=h.issue_s_per_request,
            host_serial_s_per_iteration=h.serial_s_per_iteration,
            host_exposed_s_per_iteration=h.exposed_s_per_iteration,
            host_exposed_s_per_layer=h.exposed_s_per_layer,
            host_first_seen_s_per_iteration=h.first_seen_s_per_iteration,
            host_first_seen_fade_s=h.first_seen_fade_s,
            extra_kernels_per_layer=h.extra_kernels_per_layer,
            decode_graphs=h.decode_graphs,
            max_batch_requests=self.max_batch_requests,
            block_tokens=self.block_tokens,
            cuda_graph_bytes=self.cuda_graph_bytes,
            non_torch_override_bytes=self.non_torch_override_bytes,
            join_s_per_request=self.join_s_per_request,
            leave_s_per_request=self.leave_s_per_request,
            kv_placement_bytes_per_s=self.kv_placement_bytes_per_s,
            prefill_efficiency=self.prefill_efficiency,
            **engine,
        )


@dataclass(frozen=True)
class LinkLayout:
    """One network link: its capacity after efficiency and the replicas it joins."""

    name: str
    capacity_gbps: float  # line rate x efficiency
    latency_s: float
    prefill_replicas: tuple[int, ...]
    decode_replicas: tuple[int, ...]

    @property
    def capacity_bytes_per_s(self) -> float:
        return self.capacity_gbps * 1e9 / 8


@dataclass(frozen=True)
class NetworkLayout:
    bandwidth_gbps: float  # the default line rate of a link
    links: tuple[LinkLayout, ...]
    routes: dict[tuple[int, int], int]  # (prefill replica, decode replica) -> index into links
    flow_cap_bytes_per_s: float  # one transfer's cap (math.inf: none)
    stream_layers: bool
    round_robin_chunk_bytes: int = 0  # network.round_robin_chunk_bytes: 0, fluid fair sharing


@dataclass(frozen=True)
class Resolved:
    """Everything a method run needs, resolved once per scenario."""

    scenario: Scenario
    source: str
    model: ModelSpec
    prefill: PoolLayout
    decode: PoolLayout
    network: NetworkLayout
    shared_gpu: bool  # placement shared_gpu: prefill replica i and decode replica i share GPUs

    @property
    def warnings(self) -> tuple[str, ...]:
        """What a user should know about how the pools are priced (one line each; the CLI prints them)."""
        return self.prefill.warnings + self.decode.warnings

    def costs(self, method: KVMethod) -> tuple[ReplicaCostModel, ReplicaCostModel]:
        """(prefill, decode) cost models of one replica each, with the engine's implementation factors for
        the method (calibration.implementation_factors, by its registry name)."""
        impl = self.scenario.calibration.implementation_factors.get(method.name)
        return self.prefill.cost_model(self.model, method, impl), self.decode.cost_model(self.model, method, impl)


# ---- catalog facts ----------------------------------------------------------------------------------
@cache
def instance_spec(key: str | None) -> InstanceSpec | None:
    if key is None:
        return None
    e = catalog.entry("instances", key)
    # numbers as the catalog writes them (an int stays an int in the outputs)
    return InstanceSpec(
        key=key,
        gpus=e["gpus"],
        vcpus=e["vcpus"],
        host_memory_gib=e["host_memory_gib"],
        network_gbps=e["network_gbps"],
        gpu_interconnect=e["gpu_interconnect"],
        intra_node_gb_per_s=e["intra_node_gb_per_s"],
        price_usd_per_hour=e.get("price_usd_per_hour"),
        peer_access=bool(e.get("peer_access", True)),
    )


def instances_per_replica(pool: PoolConfig) -> int:
    inst = instance_spec(pool.instance)
    return 1 if inst is None else math.ceil(pool.gpus_per_replica / inst.gpus)


def price_usd_per_hour(pool: PoolConfig) -> float | None:
    """Per instance: the pool's own price, else the catalog's; None when neither is known."""
    if pool.price_usd_per_hour is not None:
        return pool.price_usd_per_hour
    inst = instance_spec(pool.instance)
    return None if inst is None else inst.price_usd_per_hour


def network_bandwidth_gbps(s: Scenario) -> float:
    """The default link line rate: the scenario's, else the prefill instance's."""
    if s.network.bandwidth_gbps is not None:
        return s.network.bandwidth_gbps
    inst = instance_spec(s.prefill.instance)
    if inst is None:  # Scenario refuses a missing bandwidth without a prefill instance where a network is used
        assert not s.needs_network
        return math.inf
    return float(inst.network_gbps)


def link_busy_gbps(s: Scenario) -> float:
    """What the busy link's per-Gbps growths multiply: the line rate (the rate realrun paces its chunks at), less
    where network.link_busy_host_factor_chunk_bytes says which chunk the growths were measured with: their chunk
    share then takes the rate at that chunk which sends as many chunks per second as the link does
    (round_robin_chunk_bytes; a fluid link: the measured chunk), up to link_busy_host_factor_max_chunks_per_s, and
    their bytes' share the line rate."""
    n, gbps = s.network, network_bandwidth_gbps(s)
    ref = n.link_busy_host_factor_chunk_bytes
    if not ref or not math.isfinite(gbps):
        return gbps
    sent = n.round_robin_chunk_bytes or ref
    ceiling_gbps = n.link_busy_host_factor_max_chunks_per_s * ref * 8 / 1e9
    if sent == ref and gbps <= ceiling_gbps:  # as measured: the line rate itself
        return gbps
    share = n.link_busy_host_factor_chunk_share
    return gbps * (1.0 - share) + share * min(gbps * ref / sent, ceiling_gbps)


def link_busy_host_factor(s: Scenario) -> float:
    """The factor on the host terms of a process while a transfer to or from it is in flight (simulator/link.py,
    EndpointHost): network.link_busy_host_factor + link_busy_host_factor_per_gbps x the link's line rate (Gbps: the
    rate realrun paces its chunks at; scaled by chunk where the growth was measured at another, link_busy_gbps);
    1: the host does not share its process with the link (the default)."""
    n = s.network
    if n.link_busy_host_factor == 1.0 and n.link_busy_host_factor_per_gbps == 0.0:
        return 1.0
    return n.link_busy_host_factor + n.link_busy_host_factor_per_gbps * link_busy_gbps(s)


def link_busy_prefill_factors(n) -> tuple[float, float]:
    """network.link_busy_prefill_host_factor and its per-Gbps growth, each the general one's where not given."""
    a = n.link_busy_host_factor if n.link_busy_prefill_host_factor is None else n.link_busy_prefill_host_factor
    b = n.link_busy_prefill_host_factor_per_gbps
    return a, n.link_busy_host_factor_per_gbps if b is None else b


def link_busy_prefill_host_factor(s: Scenario) -> float:
    """The factor on a prefill replica's prefill floor (per batch, layer, request and the method's own per layer)
    while a transfer to or from its process is in flight: network.link_busy_prefill_host_factor + its per-Gbps
    growth x the line rate, each the general factor's where not given."""
    a, b = link_busy_prefill_factors(s.network)
    if a == 1.0 and b == 0.0:
        return 1.0
    return a + b * link_busy_gbps(s)


def interconnect_kind(pool: PoolConfig) -> str:
    """The TP interconnect: the pool's, else its instance's, else PCIe."""
    inst = instance_spec(pool.instance)
    return pool.interconnect or (inst.gpu_interconnect if inst else None) or "pcie"


def interconnect_gb_per_s(pool: PoolConfig, gpu: GPUSpec) -> float | None:
    """Per-GPU bandwidth per direction of the TP interconnect (None only for NVLink named on a GPU without
    it and no bandwidth given, which PoolConfig refuses)."""
    inst = instance_spec(pool.instance)
    if pool.intra_node_gb_per_s is not None:
        return pool.intra_node_gb_per_s
    if inst is not None:
        return inst.intra_node_gb_per_s
    if interconnect_kind(pool) == "pcie":
        return gpu.pcie_gb_per_s
    return gpu.nvlink_gb_per_s


def peer_access(pool: PoolConfig, gpu: GPUSpec) -> bool:
    """Whether the pool's GPUs reach each other's memory: the pool's word, else its instance's, else true over
    NVLink, else the GPU's pcie_peer_access (the driver refuses GeForce parts)."""
    if pool.peer_access is not None:
        return pool.peer_access
    inst = instance_spec(pool.instance)
    if inst is not None:
        return inst.peer_access
    return interconnect_kind(pool) != "pcie" or gpu.pcie_peer_access


def collective_constants(pool: PoolConfig, gpu: GPUSpec) -> collectives.Interconnect:
    """The TP all-reduce's constants: the interconnect's catalog entry, or pcie_host without peer access."""
    key = interconnect_kind(pool) if peer_access(pool, gpu) else "pcie_host"
    return collectives.from_catalog(catalog.entry("interconnects", key))


def model_spec(m: ModelConfig) -> ModelSpec:
    return ModelSpec(
        key=m.preset or m.name,
        name=m.name,
        layers=m.layers,
        hidden_size=m.hidden_size,
        heads=m.heads,
        kv_heads=m.kv_heads,
        head_dim=m.head_dim,
        intermediate_size=m.intermediate_size,
        vocab_size=m.vocab_size,
        mlp=m.mlp,
        parallel_attention=m.parallel_attention,
        max_context_tokens=m.max_context_tokens,
        qkv_bias=m.qkv_bias,
        tied_embeddings=m.tied_embeddings,
        experts=m.experts,
        active_experts=m.active_experts,
        expert_intermediate_size=m.expert_intermediate_size,
    )


def gpu_fields(g: GPUConfig) -> tuple[dict, dict[str, dict]]:
    """The GPU's full field set and what was derived for the fields it left out ({field: {value, rule}})."""
    given = g.model_dump(include=g.model_fields_set - {"preset", "memory_gib"})
    given["memory_bytes"] = g.total_memory_bytes
    return complete_gpu_fields(given)


def gpu_spec(g: GPUConfig) -> GPUSpec:
    full, _ = gpu_fields(g)
    return GPUSpec.from_fields(g.preset or g.name or "custom", full)


def host_vcpus(pool: PoolConfig) -> int:
    """CPU threads per replica: the pool's host's, else its instances' (0 without an instance)."""
    if pool.host is not None and pool.host.vcpus is not None:
        return pool.host.vcpus
    inst = instance_spec(pool.instance)
    return 0 if inst is None else inst.vcpus * instances_per_replica(pool)


def host_link_gb_per_s(pool: PoolConfig, gpu: GPUSpec) -> float:
    """Each GPU's rate to and from host memory: its PCIe link, capped by the host's slots and by the host's
    memory bandwidth shared among the GPUs of one host."""
    host = pool.host
    rate = gpu.pcie_gb_per_s
    if host is None:
        return rate
    if host.pcie_gb_per_s is not None:
        rate = min(rate, host.pcie_gb_per_s)
    if host.memory_bandwidth_gb_per_s is not None:
        gpus_per_host = max(1, pool.gpus_per_replica // instances_per_replica(pool))
        rate = min(rate, host.memory_bandwidth_gb_per_s / gpus_per_host)
    return rate


def calibration_profile(choice: str, gpu: GPUSpec, source: str, field_name: str) -> CalibrationProfile:
    if choice == "roofline":
        return roofline_profile(gpu)
    if choice == "auto":
        path = PROFILES_DIR / gpu.key / "profile.json"
        return load_profile(path) if path.exists() else roofline_profile(gpu)
    try:
        return load_profile(choice)
    except (OSError, ValueError, KeyError) as e:
        raise ScenarioError(f"{source}: calibration.{field_name}: cannot read profile {choice}: {e}") from None


def pricing_warnings(name: str, gpu: GPUSpec, profile: CalibrationProfile, choice: str) -> list[str]:
    """What is uncertain about how a pool is priced: roofline pricing, or a profile made for another GPU."""
    out = []
    if profile.source == "roofline":
        why = (
            f"calibration.{name}_profile is roofline"
            if choice == "roofline"
            else f"no profile for {gpu.key} in kernels_calibration/profiles"
        )
        target = gpu.key if gpu.key in catalog.load("gpus") else "GPU.yaml (its fields)"
        out.append(
            f"{name} pool ({gpu.key}) is priced by roofline ({why}): datasheet peaks times the H200's "
            f"efficiencies; `python cli.py calibrate --derive {target} --out DIR` derives a profile"
        )
    elif profile.gpu != gpu.key:
        out.append(
            f"{name} pool runs {gpu.key} but its profile ({profile.path or choice}) is for {profile.gpu}: every "
            f"kernel is priced at {profile.gpu}'s speed"
        )
    return out


# ---- the scenario -----------------------------------------------------------------------------------
def _pool(name: str, pool: PoolConfig, profile_choice: str, network_gbps: float, source: str) -> PoolLayout:
    assert pool.gpu is not None  # PoolConfig fills it from the instance or refuses
    inst = instance_spec(pool.instance)
    per = instances_per_replica(pool)
    fields, derived = gpu_fields(pool.gpu)
    gpu = GPUSpec.from_fields(pool.gpu.preset or pool.gpu.name or "custom", fields)
    link_gb_per_s = interconnect_gb_per_s(pool, gpu)
    assert link_gb_per_s is not None  # PoolConfig refuses NVLink without a bandwidth
    parallel = Parallelism(
        tensor=pool.tensor_parallel,
        pipeline=pool.pipeline_parallel,
        intra_node_gb_per_s=link_gb_per_s,
        inter_stage_gbps=(inst.network_gbps if inst else None) or network_gbps,
        interconnect=collective_constants(pool, gpu),
        network=collectives.from_catalog(catalog.entry("interconnects", "ethernet")),
        expert_parallel=pool.expert_parallel,
        data_parallel=pool.data_parallel,
    )
    profile = calibration_profile(profile_choice, gpu, source, f"{name}_profile")
    warnings = pricing_warnings(name, gpu, profile, profile_choice)
    if derived:
        shown = ", ".join(f"{k}={v['value']}" for k, v in derived.items())
        warnings.append(f"{name} pool's GPU {gpu.key}: derived {shown} (costmodel/specs.py; profiles.json says how)")
    host_link = host_link_gb_per_s(pool, gpu)
    if host_link != gpu.pcie_gb_per_s:
        gpu = replace(gpu, pcie_gb_per_s=host_link)  # the link to host memory this deployment gives each GPU
    host_memory_gib = pool.host.memory_gib if pool.host is not None else None
    host_memory_gib = pool.host_memory_gib if host_memory_gib is None else host_memory_gib
    if host_memory_gib is not None:
        host_bytes = host_memory_gib * GIB
    elif inst is None:
        host_bytes = DEFAULT_HOST_MEMORY_BYTES
    else:
        host_bytes = inst.host_memory_gib / 2 * GIB * per
    decode = name != "prefill"  # extra kernels and graphs are decode's (0 on the prefill pool)
    host = HostCosts(
        issue_s_per_iteration=pool.host_issue_s_per_iteration,
        issue_s_per_layer=pool.host_issue_s_per_layer,
        issue_s_per_request=pool.host_issue_s_per_request,
        serial_s_per_iteration=pool.host_serial_s_per_iteration,
        exposed_s_per_iteration=pool.host_exposed_s_per_iteration,
        exposed_s_per_layer=pool.host_exposed_s_per_layer,
        first_seen_s_per_iteration=pool.host_first_seen_s_per_iteration,
        first_seen_fade_s=pool.host_first_seen_fade_s,
        extra_kernels_per_layer=pool.extra_kernels_per_layer if decode else 0,
        decode_graphs=pool.cuda_graphs and decode,
    )
    return PoolLayout(
        name=name,
        gpu=gpu,
        parallel=parallel,
        profile=profile,
        replicas=pool.replicas,
        instance=inst,
        instances_per_replica=per,
        max_batch_requests=pool.max_batch_requests,
        max_batch_tokens=pool.max_batch_tokens,
        gpu_memory_utilization=pool.gpu_memory_utilization,
        host_memory_bytes=host_bytes,
        host_vcpus=host_vcpus(pool),
        kv_capacity_override_bytes=None if pool.kv_capacity_gib is None else pool.kv_capacity_gib * GIB,
        price_usd_per_hour=price_usd_per_hour(pool),
        host=host,
        block_tokens=pool.block_tokens,
        cuda_graph_bytes=pool.cuda_graph_gib * GIB,
        non_torch_override_bytes=None if pool.non_torch_gib is None else pool.non_torch_gib * GIB,
        join_s_per_request=pool.join_s_per_request if name == "decode" else 0.0,
        leave_s_per_request=pool.leave_s_per_request if name == "decode" else 0.0,
        kv_placement_bytes_per_s=pool.kv_placement_gb_per_s * 1e9 if name == "decode" else 0.0,
        prefill_efficiency=pool.prefill_efficiency if name == "prefill" else 1.0,
        gpu_derived=tuple((k, v["value"], v["rule"]) for k, v in derived.items()),
        warnings=tuple(warnings),
    )


def _network(s: Scenario, bandwidth_gbps: float, source: str) -> NetworkLayout:
    net = s.network
    if net.links is not None:
        given = [(k.name, k.bandwidth_gbps, tuple(k.prefill_replicas), tuple(k.decode_replicas)) for k in net.links]
    else:
        given = [(f"p{p}", None, (p,), tuple(range(s.decode.replicas))) for p in range(s.prefill.replicas)]
    links, routes = [], {}
    for i, (name, bw, pre, dec) in enumerate(given):
        links.append(
            LinkLayout(
                name=name,
                capacity_gbps=(bw or bandwidth_gbps) * net.efficiency,
                latency_s=net.latency_s,
                prefill_replicas=pre,
                decode_replicas=dec,
            )
        )
        for p in pre:
            for d in dec:
                routes.setdefault((p, d), i)
    for p in range(s.prefill.replicas):
        if not any((p, d) in routes for d in range(s.decode.replicas)):
            raise ScenarioError(f"{source}: network.links: prefill replica {p} reaches no decode replica")
    return NetworkLayout(
        bandwidth_gbps=bandwidth_gbps,
        links=tuple(links),
        routes=routes,
        flow_cap_bytes_per_s=math.inf if net.per_flow_gbps is None else net.per_flow_gbps * 1e9 / 8,
        stream_layers=net.stream_layers,
        round_robin_chunk_bytes=net.round_robin_chunk_bytes,
    )


def resolve(s: Scenario, source: str = "scenario") -> Resolved:
    """The scenario as the simulator and the cost model use it; bad input raises ScenarioError. Its host time terms
    as priced: times calibration.host_speed_factor (engine.priced)."""
    from .engine import priced

    s = priced(s)
    bw = network_bandwidth_gbps(s)
    return Resolved(
        scenario=s,
        source=source,
        model=model_spec(s.model),
        prefill=_pool("prefill", s.prefill, s.calibration.prefill_profile, bw, source),
        decode=_pool("decode", s.decode, s.calibration.decode_profile, bw, source),
        network=_network(s, bw, source),
        shared_gpu=s.placement == "shared_gpu",
    )
