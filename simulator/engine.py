"""Engine calibration files: what an engine adds to the kernels' prices, fitted from its measured runs.

A kernel profile prices each kernel as the GPU runs it alone. A serving engine adds time that no kernel
timing sees: the CPU work between decode iterations while the GPU waits (the loop gap), CPU issue time
where it launches kernels one by one, its own small kernels per layer, the work of placing a joining
request's KV in the batch, how close its prefill comes to the priced GPU speed, its implementation of a
method's quantize, dequantize and correction steps, and how much of a link's line rate its transfers
reach. `cli.py calibrate --traces INDEX.csv --out FILE` fits these named parameters to measured runs
(simulator/calibrate.py) and writes them here; a scenario names the file with
``calibration: {engine: FILE}`` (relative to the scenario file), and every parameter the file *fitted*
replaces the scenario's value. Parameters the traces could not resolve are recorded with the reason and
left as the scenario says. Kernel profiles stay what they are.

The file (JSON, strict)::

    {"schema_version": 1, "kind": "hacksim-engine-calibration",
     "parameters": {NAME: {"value", "stderr", "fitted", "unit", "bounds", "note"}, ...},
     "fit": {...}, "provenance": {...}}

NAME is one of ``PARAMETERS`` below (a scenario path; ``methods.<method>.<step>`` for the implementation
factors, ``methods.<method>.quantize_issue_s_per_layer``, ``methods.<method>.prefill_issue_s_per_layer`` and
``methods.<method>.decode_kernels_per_layer``);
``stderr`` is the fit's posterior standard deviation (null when held); ``scope`` says whether the parameter is
machine-specific host time (``host``: this CPU and engine build) or GPU or link work (``gpu``, ``link``: they
carry to another run of the same kernels and link); ``shape`` what it scales with; ``prior`` the centre and width
the fit pulled it toward (simulator/calibrate.py).

A fitted parameter applies wherever a scenario names the file, or the scenario is refused: placement colocated
runs prefill as chunks of decode iterations with the decode pool's settings and has no link, so a file that
fitted a prefill-pool or link parameter is refused there, naming it (`not_applied`).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from costmodel.methods import REFERENCE
from costmodel.methods import REGISTRY as METHOD_REGISTRY

from . import files
from .config import first_error

SCHEMA_VERSION = 1
KIND = "hacksim-engine-calibration"
FACTOR_STEPS = ("quantize", "dequantize", "approximation")


@dataclass(frozen=True)
class Parameter:
    """One engine parameter: where it lives in a scenario, its physical bounds, what it scales with, and the
    prior the fit pulls it toward (simulator/calibrate.py: centred on the scenario's value where the traces'
    scenarios agree, else on `neutral`)."""

    name: str
    bounds: tuple[float, float]
    unit: str
    meaning: str
    scope: Literal["host", "gpu", "link"]  # host: machine-specific (this CPU, this engine's Python loop)
    shape: str  # what it scales with: per decode step, per layer, per request, per token, ...
    prior_width: float  # one standard deviation of the prior, in `unit`; of ln(value) for a factor (log_prior)
    integer: bool = False
    neutral: float = 0.0  # the value that adds nothing (a factor's 1)
    log_prior: bool = False  # a factor: the prior is on ln(value), symmetric in "x times faster or slower"


# Bounds are physical: times are >= 0 and below what would make an engine absurd; efficiencies in (0, 1];
# a factor is the engine's time over the profile's, 1 when they agree. Prior widths are set from what each term
# is, before any fit: a Python engine loop's host time per step is a fraction of a millisecond to a few (realrun's
# hostcal measured 0.63 ms), per layer or per request tens of microseconds; an efficiency is within 10 % of the
# profile that priced the kernels on the same GPU; an engine's kernel for a step within a factor 2 of the profiled
# one (FACTOR_PRIOR_WIDTH). Host terms (scope "host") belong to the machine and engine build that was measured;
# GPU and link terms carry to another run of the same kernels on the same GPU and link.
FACTOR_PRIOR_WIDTH = math.log(2.0)
# A method's step factor where the runs executed the very kernels the pool's measured profile priced (realrun runs
# kernels_calibration/kernels as they are, on the GPU the profile was measured on): its prefill with HACK's
# homomorphic attention ran at the profiled price within 1-4 % rested and back to back (realrun.prefillcal), and the
# decode step within 1.2-3.5 % on average of its per-kernel price, its parts within about 10 % (realrun.stepprof;
# docs/calibration.md, "A factor on the kernels the profile measured"). One sd is 10 %: what is left to a factor there
# is the clock and the cache state, not another implementation (calibrate.prior_widths applies it).
PROFILED_FACTOR_PRIOR_WIDTH = math.log(1.1)
PARAMETERS: dict[str, Parameter] = {
    p.name: p
    for p in (
        Parameter(
            "decode.host_serial_s_per_iteration",
            (0.0, 0.02),
            "s",
            "CPU time between decode iterations while the GPU waits (the loop gap)",
            scope="host",
            shape="per decode step",
            prior_width=5e-4,
        ),
        Parameter(
            "decode.host_issue_s_per_iteration",
            (0.0, 0.05),
            "s",
            "CPU issue time of a decode iteration, fixed part (overlaps the GPU: counts where it is longer)",
            scope="host",
            shape="per decode step (a floor)",
            prior_width=1e-3,
        ),
        Parameter(
            "decode.host_issue_s_per_layer",
            (0.0, 0.005),
            "s",
            "CPU issue time per layer of a decode iteration",
            scope="host",
            shape="per layer per decode step (a floor)",
            prior_width=1e-4,
        ),
        Parameter(
            "decode.host_issue_s_per_request",
            (0.0, 0.005),
            "s",
            "CPU issue time per running request",
            scope="host",
            shape="per running request per decode step (a floor)",
            prior_width=5e-5,
        ),
        Parameter(
            "decode.extra_kernels_per_layer",
            (0.0, 32.0),
            "kernels",
            "the engine's own small kernels per decode layer (copies, gathers)",
            scope="gpu",
            shape="per layer per decode step",
            prior_width=4.0,
            integer=True,
        ),
        Parameter(
            "decode.join_s_per_request",
            (0.0, 0.02),
            "s",
            "extra time of the iteration a request joins, per joining request (KV placement, bookkeeping)",
            scope="host",
            shape="per joining request",
            prior_width=1e-3,
        ),
        Parameter(
            "decode.leave_s_per_request",
            (0.0, 0.02),
            "s",
            "extra time of the iteration after a request leaves the batch, per leaving request (a KV move to keep "
            "the slots dense, bookkeeping)",
            scope="host",
            shape="per leaving request",
            prior_width=1e-3,
        ),
        Parameter(
            "decode.after_prefill_slowdown_fraction",
            (0.0, 0.5),
            "fraction",
            "placement shared_gpu: how much longer the decode iterations after a prefill on the same GPU run, in all, "
            "as a fraction of the prefill's time (spread over them by decode.after_prefill_decay_per_iteration)",
            scope="gpu",
            shape="per second of prefill, over the decode iterations after it",
            prior_width=0.011,  # the spread of realrun.transient's 16 per-setting fits (model, method, batch, kind): sd 0.011
        ),
        Parameter(
            "prefill.prefill_efficiency",
            (0.05, 1.0),
            "fraction",
            "the fraction of the profile-priced GPU speed the engine's prefill reaches on the model's work (HACK's "
            "homomorphic attention runs at its profiled price)",
            scope="gpu",
            shape="per token (divides the priced GPU work of the model)",
            prior_width=0.1,
            neutral=1.0,
        ),
        Parameter(
            "prefill.host_issue_s_per_iteration",
            (0.0, 0.05),
            "s",
            "CPU issue time of a prefill batch, fixed part",
            scope="host",
            shape="per prefill batch (a floor)",
            # twice realrun.hostcal.fit_prefill_host's standard error (0.16 ms): the spread of a host term between
            # machines and builds beside the measurement's own (as network.link_busy_host_factor's width)
            prior_width=3.2e-4,
        ),
        Parameter(
            "prefill.host_issue_s_per_layer",
            (0.0, 0.005),
            "s",
            "CPU issue time per layer of a prefill batch (eager launches)",
            scope="host",
            shape="per layer per prefill batch (a floor)",
            prior_width=2e-4,  # twice fit_prefill_host's standard error (0.097 ms)
        ),
        Parameter(
            "prefill.host_issue_s_per_request",
            (0.0, 0.005),
            "s",
            "CPU issue time per request of a prefill batch",
            scope="host",
            shape="per request per prefill batch (a floor)",
            prior_width=5e-4,
        ),
        Parameter(
            "prefill.host_serial_s_per_iteration",
            (0.0, 0.02),
            "s",
            "CPU time per prefill batch while the GPU waits, after its KV is encoded (handing the KV on, the next "
            "step's inputs); on a shared GPU the decode waits for it too",
            scope="host",
            shape="per prefill batch",
            prior_width=5e-4,  # as the decode loop's gap: a Python loop's bookkeeping, a fraction of a millisecond
        ),
        Parameter(
            "prefill.host_exposed_s_per_iteration",
            (0.0, 0.02),
            "s",
            "CPU time of an eagerly issued prefill batch the GPU cannot overlap even where its work is the longer "
            "(the first launches before any GPU work is queued, the closing sync)",
            scope="host",
            shape="per prefill batch (adds to its GPU time)",
            # python -m realrun.prefillprof on three H100 hosts: 0.29-0.78 ms by run; the spread between hosts
            prior_width=2e-4,
        ),
        Parameter(
            "prefill.host_exposed_s_per_layer",
            (0.0, 0.001),
            "s",
            "per layer of an eagerly issued prefill batch, the GPU's time between kernels a graph replay does not have",
            scope="host",
            shape="per layer per prefill batch (adds to its GPU time)",
            prior_width=1e-5,  # realrun.prefillprof: 0.006-0.028 ms by run
        ),
        Parameter(
            "prefill.host_first_seen_s_per_iteration",
            (0.0, 0.02),
            "s",
            "CPU time a prefill batch adds to its host floor when its process has not run a batch of that many tokens "
            "before (cuBLAS's kernel choice for a new GEMM row count)",
            scope="host",
            shape="per prefill batch of a token count not run before (on its host floor)",
            # python -m realrun.prefillprof --first-seen: 0.6-4.7 ms by set and host (medians)
            prior_width=1e-3,
        ),
        Parameter(
            "network.efficiency",
            (0.05, 1.0),
            "fraction",
            "the fraction of the line rate transfers reach",
            scope="link",
            shape="per byte (divides the line rate)",
            prior_width=0.1,
            neutral=1.0,
        ),
        Parameter(
            "network.latency_s",
            (0.0, 0.1),
            "s",
            "one-way latency added to each transfer",
            scope="link",
            shape="per transfer",
            prior_width=1e-3,
        ),
        Parameter(
            "network.link_busy_host_factor",
            (1.0, 10.0),
            "factor",
            "where the host shares its process with the link's endpoint: every host term's factor while a transfer "
            "to or from the process is in flight, at a link rate near 0 (realrun: its link thread takes the GIL)",
            scope="host",
            shape="multiplies the host terms while the link moves KV",
            prior_width=0.1,  # realrun.hostcal.fit_link_host's standard error (0.098)
            neutral=1.0,
        ),
        Parameter(
            "network.link_busy_host_factor_per_gbps",
            (0.0, 0.2),
            "1/Gbps",
            "how that factor grows with the link's rate (its chunks come that much more often)",
            scope="host",
            shape="per Gbps of the link, while it moves KV",
            prior_width=0.003,  # realrun.hostcal.fit_link_host's standard error (0.0032)
        ),
        Parameter(
            "network.link_busy_prefill_host_factor",
            (1.0, 10.0),
            "factor",
            "the prefill floor's own factor while a transfer is in flight, at a link rate near 0 (its launches meet the "
            "link thread's GIL less often than the decode loop's Python does)",
            scope="host",
            shape="multiplies the prefill floor while the link moves KV",
            prior_width=0.22,  # realrun.hostcal.fit_link_host's standard error on the prefill ratios (0.22)
            neutral=1.0,
        ),
        Parameter(
            "network.link_busy_prefill_host_factor_per_gbps",
            (0.0, 0.2),
            "1/Gbps",
            "how the prefill floor's factor grows with the link's rate",
            scope="host",
            shape="per Gbps of the link, while it moves KV",
            prior_width=0.007,  # realrun.hostcal.fit_link_host's standard error on the prefill ratios (0.007)
        ),
    )
}
for _m in METHOD_REGISTRY:
    for _step, _shape in zip(FACTOR_STEPS, ("per prompt token", "per context token", "per context token or pair")):
        PARAMETERS[f"methods.{_m}.{_step}"] = Parameter(
            f"methods.{_m}.{_step}",
            (0.05, 50.0),
            "factor",
            f"the engine's {_step} time for {_m} over the profile's price",
            scope="gpu",
            shape=f"{_shape} (multiplies the profiled kernel)",
            prior_width=FACTOR_PRIOR_WIDTH,
            neutral=1.0,
            log_prior=True,
        )
    PARAMETERS[f"methods.{_m}.quantize_issue_s_per_layer"] = Parameter(
        f"methods.{_m}.quantize_issue_s_per_layer",
        (0.0, 0.005),
        "s",
        f"CPU time per layer and request to issue {_m}'s quantize and pack launches after prefill, where the engine issues "
        f"them from the CPU (the quantize step lasts at least this)",
        scope="host",
        shape="per layer and request of a prefill batch (a floor on the quantize step)",
        prior_width=5e-4,
    )
    if _m != REFERENCE:  # the reference's own launches are the pool's prefill.host_issue_s_per_layer
        PARAMETERS[f"methods.{_m}.prefill_issue_s_per_layer"] = Parameter(
            f"methods.{_m}.prefill_issue_s_per_layer",
            (0.0, 0.005),
            "s",
            f"CPU time per layer and request to issue {_m}'s own prefill kernels beyond the FP16 model's, where the engine "
            f"issues prefill from the CPU (adds to the prefill host floor)",
            scope="host",
            shape="per layer and request of a prefill batch (adds to the prefill floor)",
            prior_width=2e-4,  # twice fit_prefill_host's standard error of HACK's (0.093 ms)
        )
        PARAMETERS[f"methods.{_m}.decode_kernels_per_layer"] = Parameter(
            f"methods.{_m}.decode_kernels_per_layer",
            (0.0, 50.0),
            "kernels",
            f"small kernels per layer {_m}'s decode step runs beyond its profiled kernel and the FP16 model's "
            f"(its new token's quantize and pack apart, say), each at the small-kernel time",
            scope="gpu",
            shape="per layer per decode step (beyond decode.extra_kernels_per_layer)",
            prior_width=4.0,  # as decode.extra_kernels_per_layer's
        )
METHOD_STEPS = (
    *FACTOR_STEPS,
    "quantize_issue_s_per_layer",
    "prefill_issue_s_per_layer",
    "decode_kernels_per_layer",
)


class ParameterRecord(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    value: float = Field(description="the fitted value, or the value it was held at")
    stderr: float | None = Field(None, ge=0, description="standard error from the fit's Jacobian; null when fixed")
    fitted: bool = Field(description="true: the traces resolve it and it was fitted; false: held, see note")
    unit: str = ""
    bounds: tuple[float, float] | None = None
    scope: Literal["host", "gpu", "link", ""] = Field("", description="host: machine-specific; gpu, link")
    shape: str = Field("", description="what it scales with")
    prior: dict[str, Any] | None = Field(None, description="the fit's prior: centre, width, of value or ln(value)")
    note: str = ""
    support: dict[str, float] | None = Field(
        None,
        description="a fitted parameter's configurations by their share of the runs' information about it (its squared "
        "data Jacobian entries; those of at least 5 %): what pins it down",
    )


class Domain(BaseModel):
    """The settings of the runs a calibration was fitted on (simulator/domain.py), checked where a file is read."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    gpus: list[str] = Field(default_factory=list)
    placements: list[str] = Field(default_factory=list)
    methods: list[str] = Field(default_factory=list)
    link_gbps: tuple[float, float] | None = None
    prefill_batch_requests: tuple[int, int] | None = None
    models: dict[str, dict[Literal["prompt_tokens", "output_tokens"], tuple[int, int]]] = Field(default_factory=dict)


class EngineFile(BaseModel):
    """The file's content, checked: parameter names known, fitted values inside their physical bounds."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    schema_version: int
    kind: str
    engine: str = ""
    parameters: dict[str, ParameterRecord]
    fit: dict[str, Any] = Field(default_factory=dict)
    # the runs' settings (simulator/domain.py): where a scenario lies outside them its prediction extrapolates the fit
    domain: Domain | None = None
    provenance: dict[str, Any] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _known(self) -> EngineFile:
        if self.schema_version != SCHEMA_VERSION:
            raise ValueError(f"schema_version must be {SCHEMA_VERSION}, got {self.schema_version}")
        if self.kind != KIND:
            raise ValueError(f"kind must be {KIND!r}, got {self.kind!r}")
        for name, rec in self.parameters.items():
            p = PARAMETERS.get(name)
            if p is None:
                raise ValueError(f"parameters.{name}: unknown parameter")
            lo, hi = p.bounds
            if not lo <= rec.value <= hi:
                raise ValueError(f"parameters.{name}: {rec.value} outside its bounds [{lo}, {hi}]")
            if p.integer and rec.fitted and rec.value != int(rec.value):
                raise ValueError(f"parameters.{name}: a count must be a whole number, got {rec.value}")
        return self

    def domain_dict(self) -> dict[str, Any]:
        """The domain as simulator/domain.py takes it (empty: a file written before domains)."""
        return {} if self.domain is None else self.domain.model_dump(mode="json", exclude_none=True)

    def fitted(self) -> dict[str, float]:
        return {k: r.value for k, r in self.parameters.items() if r.fitted}

    def fitted_with_stderr(self) -> dict[str, tuple[float, float | None]]:
        """The fitted parameters as a refit's base (calibrate.fit_engine's `base`): name -> (value, stderr)."""
        return {k: (r.value, r.stderr) for k, r in self.parameters.items() if r.fitted}


def read_engine_file(path: str | Path, error: type[Exception]) -> EngineFile:
    """The checked file; a missing, unreadable or malformed one raises `error` in one line naming it."""
    path = Path(path)
    text = files.read_text(path, error, "engine calibration file")
    try:
        raw = json.loads(text)
    except json.JSONDecodeError as e:
        raise error(f"{path}: line {e.lineno}: not valid JSON ({e.msg})") from None
    if not isinstance(raw, dict):
        raise error(f"{path}: expected a JSON object")
    try:
        return EngineFile.model_validate(raw)
    except ValidationError as e:
        raise error(first_error(str(path), e, "file")) from None


HOST_TIMES = frozenset(n for n, p in PARAMETERS.items() if p.scope == "host" and p.unit == "s")  # a host's speed scales


def apply_values(scenario, values: dict[str, float]):
    """The scenario with these engine parameters (PARAMETERS names) set so that it prices them at `values`: a new,
    frozen Scenario. A host time term (HOST_TIMES) is stored over the scenario's calibration.host_speed_factor,
    which `priced` multiplies back (scenario_values and host_times give the priced values: a round trip holds to
    rounding)."""
    f = scenario.calibration.host_speed_factor
    if f != 1.0:
        values = {n: v / f if n in HOST_TIMES else v for n, v in values.items()}
    return write_values(scenario, values)


def write_values(scenario, values: dict[str, float]):
    """The scenario with these engine parameters stored as given (a file's or the scenario's own values, before
    the host's speed: apply_engine_file); apply_values is what a fit's or a repricing's values go through."""
    from .config import ImplementationFactors

    pools: dict[str, dict] = {"decode": {}, "prefill": {}}
    network: dict = {}
    factors = {m: f.model_dump() for m, f in scenario.calibration.implementation_factors.items()}
    for name, value in values.items():
        p = PARAMETERS[name]
        head, *rest = name.split(".")
        if head == "methods":
            factors.setdefault(rest[0], {})[rest[1]] = float(value)
        elif head == "network":
            network[rest[0]] = float(value)
        else:
            pools[head][rest[0]] = round(value) if p.integer else float(value)
    update: dict = {}
    for pool, changes in pools.items():
        if changes:
            update[pool] = getattr(scenario, pool).model_copy(update=changes)
    if network:
        update["network"] = scenario.network.model_copy(update=network)
    if factors != {m: f.model_dump() for m, f in scenario.calibration.implementation_factors.items()}:
        update["calibration"] = scenario.calibration.model_copy(
            update={"implementation_factors": {m: ImplementationFactors(**f) for m, f in factors.items()}}
        )
    return scenario.model_copy(update=update) if update else scenario


def priced(scenario):
    """The scenario as it prices: every host time term times calibration.host_speed_factor, the factor 1 (what
    resolve prices; the scenario itself, and scenario.json, keep the terms as given and the factor)."""
    f = scenario.calibration.host_speed_factor
    if f == 1.0:
        return scenario
    out = write_values(scenario, {n: v * f for n, v in _stored_host_times(scenario).items()})
    return out.model_copy(update={"calibration": out.calibration.model_copy(update={"host_speed_factor": 1.0})})


def host_times(scenario) -> dict[str, float]:
    """The scenario's host time terms (HOST_TIMES: the loop gap, launches and issue times, join and leave, the
    prefill's and the quantize step's floors) its placement applies and that are not 0, as it prices them (times
    calibration.host_speed_factor): what a host's speed moves."""
    f = scenario.calibration.host_speed_factor
    return {n: v * f for n, v in _stored_host_times(scenario).items()}


def stored_value(scenario, name: str) -> float:
    """An engine parameter's value as the scenario stores it (a method without implementation factors: its neutral
    value); fit_items.scenario_values gives them as priced."""
    head, *rest = name.split(".")
    if head == "methods":
        f = scenario.calibration.implementation_factors.get(rest[0])
        return PARAMETERS[name].neutral if f is None else float(getattr(f, rest[1]))
    return float(getattr(getattr(scenario, head), rest[0]))


def _stored_host_times(scenario) -> dict[str, float]:
    out = {n: v for n in sorted(HOST_TIMES) if (v := stored_value(scenario, n))}
    return {n: v for n, v in out.items() if n not in not_applied(scenario, out)}


def on_host(scenario, factor: float):
    """The scenario on a host `factor` x slower: every host time term (host_times) times `factor`."""
    if factor == 1.0:
        return scenario
    return apply_values(scenario, {n: v * factor for n, v in host_times(scenario).items()})


def not_applied_in(placement: str) -> set[str]:
    """The parameters a placement has no use for: with `colocated` every replica runs both phases configured as
    the decode pool (simulator/colocated.py), so the prefill pool's settings, a method's prefill launches on it
    and the link (no KV moves) do not enter any time; only `shared_gpu` runs a prefill on a decode replica's GPU
    between its iterations (decode.after_prefill_slowdown_fraction)."""
    out = set() if placement == "shared_gpu" else {"decode.after_prefill_slowdown_fraction"}
    if placement != "colocated":
        return out
    return out | {
        n for n in PARAMETERS if n.startswith(("prefill.", "network.")) or n.endswith(".prefill_issue_s_per_layer")
    }


def not_applied(scenario, values: dict[str, float]) -> set[str]:
    """Of `values`, those the scenario's placement would not apply (a non-neutral value would change nothing)."""
    return {n for n in not_applied_in(scenario.placement) if n in values and values[n] != PARAMETERS[n].neutral}


def apply_engine_file(scenario, folder: Path, source: str):
    """Apply the scenario's calibration.engine file (a path relative to `folder`, the scenario file's):
    its fitted parameters replace the scenario's; the path becomes absolute so a re-resolved copy finds it.
    A fitted parameter the scenario's placement does not use is refused in one line naming it and the
    placement: a calibration never changes nothing silently."""
    from .config import ScenarioError

    path = Path(scenario.calibration.engine)
    if not path.is_absolute():
        path = (folder / path).resolve()
    try:
        engine = read_engine_file(path, ScenarioError)
    except ScenarioError as e:
        raise ScenarioError(f"{source}: calibration.engine: {e}") from None
    scopes = scenario.calibration.engine_scopes
    values = in_scopes(engine.fitted(), scopes)
    skip = sorted(not_applied(scenario, values), key=list(PARAMETERS).index)
    if skip:
        why = (
            "only shared_gpu runs a prefill on a decode replica's GPU between its iterations"
            if skip[0] == "decode.after_prefill_slowdown_fraction"
            else "its replicas run prefill as chunks of decode iterations with the decode pool's settings and move "
            "no KV"
        )
        raise ScenarioError(
            f"{source}: calibration.engine: {path.name} fitted {skip[0]}, which placement {scenario.placement} "
            f"does not use ({why}); fit the engine on runs of this placement"
        )
    out = write_values(scenario, values)  # the file's machine: the scenario's host_speed_factor scales it as priced
    return out.model_copy(update={"calibration": out.calibration.model_copy(update={"engine": str(path)})})


def in_scopes(values: dict, scopes) -> dict:
    """The entries of `values` (keyed by engine.PARAMETERS name) whose parameter's scope is one of `scopes`: what
    calibration.engine_scopes applies of an engine file."""
    return {n: v for n, v in values.items() if PARAMETERS[n].scope in scopes}


def engine_summary(path: str, scopes=("host", "gpu", "link")) -> dict:
    """What profiles.json and the report say about the engine file a run used: what it fitted that the run applied
    (calibration.engine_scopes), what it fitted that the run left at the scenario's (`not_applied`), what it held."""
    engine = read_engine_file(path, ValueError)
    fitted = {k: r for k, r in engine.parameters.items() if r.fitted}
    applied = in_scopes(fitted, scopes)
    return {
        "path": str(path),
        "engine": engine.engine,
        "scopes": list(scopes),
        "fitted": {k: {"value": r.value, "stderr": r.stderr, "unit": r.unit} for k, r in applied.items()},
        "not_applied": sorted(k for k in fitted if k not in applied),
        "held": sorted(k for k, r in engine.parameters.items() if not r.fitted),
    }
