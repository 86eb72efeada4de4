"""The discrete-event simulator of a disaggregated serving cluster.

Modules, bottom up (the import graph has no cycles: tests/test_imports.py):

* `config` (the scenario schema), `traces` (recorded workloads), `load` (a scenario file), `resolve` (a
  scenario's catalog facts, defaults, profiles and links, once), `workload` (the requests);
* `columns`: typed per-request columns, row logs, and `Records`, the one object a method's entities write
  what happens to each request into;
* the entities, one module each, each owning its state: `prefill.PrefillReplica`, `link.Link`,
  `decode.DecodeReplica` (with `admission.OnDemandBlocks`, its on-demand KV blocks, and
  `scheduler.StepScheduler`, vLLM's steps where it prefills: colocated prompts, preempted requests'
  recompute), `router.Router` (`colocated` for a placement without transfers), and the controllers
  `faults.FaultInjector` and `prefix_cache.PrefixCaching`;
* `compiled`: the hot modules as mypyc compiles them (`make compiled`), used when built and current;
* `run`: builds a method's entities, wires them to one another and to its `Records`, runs them, and turns
  the records into the summary and the output tables.

An entity gets its `Records` and its partners when it is built and talks to a partner through the
methods a small interface in its own module names (`prefill.PrefillListener`, `decode.DecodeListener`,
`decode.PrefillPartner`, ...), never through the partner's private fields and never by importing the
module that builds it. An interface the event loop calls on every request is a class the partner subclasses
(a mypyc trait where one partner has several: the router is `prefill.PrefillListener`, `decode.DecodeListener`
and `arrivals.ArrivalListener`), not a `Protocol`: compiled, a call through it is a direct call through the
class's method table, where a `Protocol`-typed call was a Python method call by name with its arguments boxed.

The event protocol on top of SimPy
----------------------------------
SimPy's `Environment` is the event loop, but no entity runs a SimPy process per request or per batch. Each
entity is a small state machine driven by **timers**: a `timers.Timer` subclass whose `fire()` calls the entity
(`link._Drained`, `decode._SegmentEnd`, ...), set on the environment's `timers.Loop` with
``loop.set_in(timer, delay_s)`` (``timers.call_in(env, delay_s, fn)`` for a plain function). The loop keeps the
timers on a heap of its own, merged with SimPy's queue in SimPy's order (time, priority, event id, the ids drawn
from one count), so a timer runs exactly where ``env.timeout(delay_s).callbacks.append(fn)`` would, without a
generator, a process object or a resume per event; an event costs a heap push, a pop and a direct call. There is
one event per change of a batch or of a link's flow set (the time in between has a closed form:
simulator/decode.py, simulator/link.py), none per token.

A timer cannot be taken back (as a SimPy timeout cannot), so a timer that a later decision can make wrong carries a
**version stamp**: the entity keeps a counter, a timer captures its value when scheduled, and the entity
bumps the counter whenever the plan changes (a decode segment cut short because a request joins, a link's
completions re-planned when a flow starts or ends, a replica taken down by a fault). A callback whose
stamp no longer matches returns without effect.

Events at the same instant run in the order they were scheduled (SimPy's FIFO on equal times); the
faults' timers are scheduled when a method's run is built, so a fault acts before anything else at its
instant (simulator/faults.py). Requests
arriving at one instant are handed to the router together (`arrivals.Arrivals`), so they can share a
prefill batch; a decode replica's joiners wait for the end of the iteration in progress.
"""

from .compiled import activate as _activate

COMPILED = _activate(__path__)  # the hot modules mypyc compiled, when built and current (simulator/compiled.py)
