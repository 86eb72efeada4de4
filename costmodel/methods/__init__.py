"""KV-cache methods: one module per method family, and the registry every other module looks them up in.

A method answers, for a model: how many bytes one token's KV takes on the wire and in decode
memory (codes, FP16 mins and scales, stored sums, outliers, the FP16 V tail), which attention
kernel prefill and decode run (a key into the calibration profile), what it does after prefill
(quantize, entropy-encode) and on arrival (entropy-decode, dequantize once), and how many extra
ALU operations the homomorphic correction costs. `costmodel/phases.py` turns that into seconds.

Shape of a method module (`baseline.py`, `fp8.py`, `fp4.py`, `kvquant.py`, `cachegen.py`,
`hack.py` with its ablations, `pqcache.py`, `hcattention.py`): one class per scenario name, a
frozen strict pydantic model deriving from `base.KVMethod`, with

* ``name: Literal["<name>"]``: the scenario's discriminator (a bare ``- hack`` in YAML, or a
  mapping ``{name: hack, partition: 128, label: hack_pi128}``);
* its parameters as fields, each with a description, a default and its bounds: the one place
  they are written (the scenario schema, ``cli.py schema``, is generated from them);
* ClassVars: ``display_label`` and ``colour`` (reports), ``kernel_keys`` (profile kernels its
  costs read; a roofline profile has each) and ``optional_kernel_keys`` (measured fits that
  replace a roofline estimate), ``encode`` and ``entropy_coded`` (work after prefill);
* the KV format and cost methods `base.KVMethod` defines (bytes per element / token, per-request
  reserve, host bytes, decode kernel, ``decode_layer_terms``, ``approximation_ops``, ...),
  overridden where the format differs from FP16.
* where it overrides ``prefill_form``, ``prefill_form_codes`` beside it: the same choice over a numpy
  array of prompts (the cost model prices a block of prompt lengths with it; without it, each length is
  priced alone).

Adding a method = one module here, one entry in `MethodConfig` below (the order is the display
order), and its tests. No other product module names a method: the scenario schema, reports,
planning and the calibration harness read this registry.
"""

from __future__ import annotations

from typing import Annotated, get_args

from pydantic import Field

from .base import PREFILL_KERNELS, DecodeEnv, KVMethod, decode_fit, gluon_decode_applies
from .baseline import Baseline
from .cachegen import CacheGen, gaussian_code_entropy_bits
from .fp4 import FP4
from .fp8 import FP8
from .hack import HACK, HACKNoRQE, HACKNoSE
from .hcattention import HCAttention
from .kvquant import KVQuant
from .pqcache import PQCache

# The scenario's `methods:` entries: discriminated by `name`, in the reports' display order.
MethodConfig = Annotated[
    Baseline | CacheGen | KVQuant | FP8 | FP4 | HACK | HACKNoSE | HACKNoRQE | PQCache | HCAttention,
    Field(discriminator="name"),
]
METHODS: tuple[type[KVMethod], ...] = get_args(get_args(MethodConfig)[0])


def method_name(cls: type[KVMethod]) -> str:
    """A method class's scenario name (its `name` Literal)."""
    return cls.model_fields["name"].default


REGISTRY: dict[str, type[KVMethod]] = {method_name(cls): cls for cls in METHODS}
REFERENCE = method_name(Baseline)  # what reductions are measured against, and what sizes a pool


def make_method(name: str, **params) -> KVMethod:
    """A method object from its scenario name and parameters (KeyError for an unknown name)."""
    return REGISTRY[name](**params)


def reference_method() -> KVMethod:
    return Baseline()  # REFERENCE's class


def display_label(name: str) -> str | None:
    """The display label of a method name, None for a name the registry does not know."""
    cls = REGISTRY.get(name)
    return None if cls is None else cls.display_label


def colour(name: str) -> str | None:
    """The report colour of a method name, None for a name the registry does not know."""
    cls = REGISTRY.get(name)
    return None if cls is None else cls.colour


_RANK = {name: i for i, name in enumerate(REGISTRY)}


def display_rank(name: str) -> int:
    """Position in the display order; names the registry does not know come after every method."""
    return _RANK.get(name, len(_RANK))


def kernel_keys(optional: bool = True) -> tuple[str, ...]:
    """Every profile kernel key some method prices with, in registry order (optional: with the measured
    fits that replace a roofline estimate)."""
    keys = [k for cls in METHODS for k in cls.kernel_keys + (cls.optional_kernel_keys if optional else ())]
    return tuple(dict.fromkeys(keys))


__all__ = [
    "FP4",
    "FP8",
    "HACK",
    "METHODS",
    "PREFILL_KERNELS",
    "REFERENCE",
    "REGISTRY",
    "Baseline",
    "CacheGen",
    "DecodeEnv",
    "HACKNoRQE",
    "HACKNoSE",
    "HCAttention",
    "KVMethod",
    "KVQuant",
    "MethodConfig",
    "PQCache",
    "colour",
    "decode_fit",
    "display_label",
    "display_rank",
    "gaussian_code_entropy_bits",
    "gluon_decode_applies",
    "kernel_keys",
    "make_method",
    "method_name",
    "reference_method",
]
