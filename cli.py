"""hacksim command line: thin wrappers that load a scenario, call the library, and write outputs.

    python cli.py simulate scenarios/a10g_10gbps.yaml --out out/a10g
    python cli.py schema
    python cli.py report out/a10g
    python cli.py calibrate --out profiles/mygpu
    python cli.py calibrate --derive rtx4090 --out profiles/rtx4090
    python cli.py calibrate --traces realrun/traces/h200_graphs/index.csv --out engine.json
    python cli.py validate TRACE --scenario S
    python cli.py validate realrun/traces/h200_graphs/index.csv --cv
    python cli.py sweep scenarios/sweeps/a10g_bandwidth_methods.yaml --out out/sweep
    python cli.py plan scenarios/a10g_10gbps.yaml --rate 0.2 --slo ttft_p99_s=60,tpot_p99_s=0.5,jct_p90_s=60

Bad input exits with code 2 and one line on stderr naming the file and the field; nothing is
written. The same scenario and seed give byte-identical outputs.
"""

from __future__ import annotations

import gc
import json
import math
import os
import shutil
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import NoReturn

import typer
from typer.core import TyperGroup

from reports.terminal import (
    JSON_HELP,
    PLOTLYJS_HELP,
    QUIET_HELP,
    ProgressBar,
    Say,
    errors_as_json,
    plotlyjs_refusal,
    print_error,
    to_json,
)
from scenarios import resolve as resolve_example
from simulator.process_pool import usable_cores

try:  # typer 0.2x carries its own copy of click, whose exceptions its commands raise
    from typer._click.exceptions import UsageError
except ImportError:  # older typer runs on click itself
    from click.exceptions import UsageError

__version__ = "0.1.0"


class _Commands(TyperGroup):
    """The commands, with usage errors (a missing or misspelt option, a value of the wrong type) answered in JSON
    on stdout too when the command line asks for --json: click reports them before the command runs, so the
    command's own `errors_as_json` never comes into play and a pipeline reading stdout saw nothing."""

    def parse_args(self, ctx: typer.Context, args: list[str]) -> list[str]:
        ctx.meta["hacksim.argv"] = list(args)
        return super().parse_args(ctx, args)

    def invoke(self, ctx: typer.Context):
        try:
            return super().invoke(ctx)
        except UsageError as e:
            argv = ctx.meta.get("hacksim.argv", [])
            if "--json" in argv[: argv.index("--") if "--" in argv else None]:
                print(to_json({"error": e.format_message()}), flush=True)
            raise


app = typer.Typer(
    cls=_Commands,
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    # Help text as written: rich markup would eat `.[images]` as a style tag, and its option table cuts a
    # long word at the terminal's edge (`--slo`'s example at 80 columns).
    rich_markup_mode=None,
    help="Simulate disaggregated LLM inference with compressed KV caches (HACK and baselines).",
)

EXIT_BAD_INPUT = 2


def _print_version(value: bool) -> None:
    if value:
        typer.echo(f"hacksim {__version__}")
        raise typer.Exit()


@app.callback()
def main(
    version: bool = typer.Option(
        False, "--version", callback=_print_version, is_eager=True, help="print the version and exit"
    ),
) -> None:
    """Simulate disaggregated LLM inference with compressed KV caches (HACK and baselines)."""
    errors_as_json(False)  # a command with --json turns it on


def fail(message: str) -> NoReturn:
    """One `error:` line on stderr (and a JSON error object on stdout with --json), exit 2."""
    print_error(message)
    raise typer.Exit(EXIT_BAD_INPUT)


class RunOutputs:
    """`simulate --out DIR`: each method's tables are appended to CSV files in a temporary folder inside
    DIR as soon as it has run (so a long run never holds them all); the JSON files and the report follow
    at the end, built in the same folder, then every file moves into DIR together, with Ctrl-C and
    SIGTERM held off for the moment the moves take. `discard()` leaves DIR as it was (removed if this
    made it). The temporary folder's name carries this machine's name and process id, so a later run
    removes one that a killed run (SIGKILL, a power cut) left behind. With `report`, what the report draws
    of each method (simulator.run.FigureColumns: its latencies and its memory and link logs) is kept and
    handed to it, so it never reads back the files just written (a million requests' 620 MB of CSV)."""

    TABLES = ("requests.csv", "memory.csv", "links.csv")

    def __init__(self, out: Path, quote_text: bool = False, report: bool = False):
        from simulator.files import CsvAppender, remove_stale_temps, temp_prefix

        self.out, self.made, self.done = out, not out.exists(), False
        out.mkdir(parents=True, exist_ok=True)
        remove_stale_temps(out)
        self.tmp = Path(tempfile.mkdtemp(prefix=temp_prefix(), dir=out))
        self.tables = [CsvAppender(self.tmp / name, quote_text) for name in self.TABLES]
        self.held: list | None = [] if report else None

    def add(self, _method: str, requests, memory, links, figure_columns: Callable | None = None) -> None:
        """One method's requests, memory and links tables, each an iterable of frames written as they come;
        `figure_columns()`: what the report draws of it (simulator.run.FigureColumns), kept for the report."""
        for out, chunks in zip(self.tables, (requests, memory, links)):
            for chunk in chunks:
                out.write(chunk)
        if self.held is not None and figure_columns is not None:
            self.held.append(figure_columns())

    def report_tables(self) -> dict:
        """The report's tables from the kept columns, as it would read them back from the files written (a file
        never opened, such as requests.csv without requests, is left out: the report finds no file)."""
        from simulator.run import figure_tables

        held, self.held = self.held, None
        if not held:
            return {}
        return {name: df for name, df in figure_tables(held).items() if (self.tmp / name).exists()}

    def finish(self, result, report: bool = False, plotlyjs: str | None = None) -> list[str]:
        """Write the JSON files (and report.html) beside the tables, then move them all into DIR; returns
        the names moved. Without a report, a report.html of an earlier run in DIR is removed: it would
        describe other tables."""
        from simulator.files import held_signals, strict_json

        try:
            for table in self.tables:
                table.close()
            (self.tmp / "summary.json").write_text(strict_json(result.summary) + "\n")
            (self.tmp / "scenario.json").write_text(strict_json(result.scenario.model_dump(mode="json")) + "\n")
            (self.tmp / "profiles.json").write_text(strict_json(result.profiles()) + "\n")
            if report:
                # The runs are gone but not yet freed: a run's entities refer to each other (cycles), and the collector
                # was off while it ran. Freeing them first gives the report the memory back (a million requests:
                # 0.6 GB resident before, 0.18 GB after).
                gc.collect()
                _build_report(self.tmp, plotlyjs, final_dir=self.out, tables=self.report_tables())
            names = sorted(f.name for f in self.tmp.iterdir())
            with held_signals():
                for name in names:
                    os.replace(self.tmp / name, self.out / name)
                if "report.html" not in names:
                    (self.out / "report.html").unlink(missing_ok=True)
                self.done = True
            return names
        finally:
            shutil.rmtree(self.tmp, ignore_errors=True)

    def discard(self) -> None:
        """Remove what this run wrote, unless every file is already in place."""
        if self.done:
            return
        for table in self.tables:
            try:
                table.abandon()
            except OSError:  # a full disk: the folder goes anyway
                pass
        shutil.rmtree(self.tmp, ignore_errors=True)
        if self.made:
            shutil.rmtree(self.out, ignore_errors=True)


def write_together(out: Path, files: dict[str, Callable[[Path], object]]) -> list[str]:
    """Each `files[name](path)` writes one output into a temporary folder inside `out`; then all move into
    `out` together with signals held (simulator.files.move_into). A full disk or an interrupt leaves `out` as
    it was (removed if this made it): a failed write is one `error:` line, exit 2."""
    from simulator.files import move_into, remove_stale_temps, temp_prefix

    made = not out.exists()
    tmp = None
    try:
        out.mkdir(parents=True, exist_ok=True)
        remove_stale_temps(out)
        tmp = Path(tempfile.mkdtemp(prefix=temp_prefix(), dir=out))
        for name, write in files.items():
            write(tmp / name)
        return move_into(tmp, out)
    except BaseException as e:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
            tmp = None
        if made:
            shutil.rmtree(out, ignore_errors=True)
        if isinstance(e, OSError):
            fail(f"--out {out}: cannot write {', '.join(files)}: {e.strerror or e}; nothing was written")
        raise
    finally:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)


def write_outputs(result, out: Path) -> None:
    """Every output of a finished ScenarioResult (one that kept its tables) into `out`."""
    from simulator.files import needs_quotes

    writer = RunOutputs(out, needs_quotes(result.requests) or needs_quotes(result.links))
    writer.add("", [result.requests], [result.memory], [result.links])
    writer.finish(result)


def format_table(summary: dict, placement: str = "separate") -> str:
    """The comparison, one row per method; `JCT vs base` is negative where a method takes less time."""
    from costmodel.methods import REFERENCE
    from reports.terminal import render, table

    methods = summary["methods"]
    base = methods.get(REFERENCE)
    host = summary.get("host_speed")  # simulate --host-spread (simulator/host_speed.py)
    rows = []
    for name, m in methods.items():
        b = m["breakdown_s"]
        vs = ""
        if base is not None and name != REFERENCE:
            vs = _cell(100 * (_number(m["jct_s"]["mean"]) / _number(base["jct_s"]["mean"]) - 1), "+.1f", "%")
        rows.append(
            [
                name,
                f"{m['completed']}",
                _cell(m["jct_s"]["mean"], ".2f", "s"),
                *([_cell(m["host_spread_jct_mean_pct"], ".1f", "%", "±")] if host else []),
                _cell(m["jct_s"]["p90"], ".2f", "s"),
                _cell(m["ttft_s"]["mean"], ".2f", "s"),
                _cell(1e3 * _number(m["tpot_s"]["mean"]), ".1f"),
                _cell(b["transfer"], ".2f", "s"),
                _cell(b["dequantize"], ".3f", "s"),
                _cell(b["approximation"], ".3f", "s"),
                _cell(m["kv_bytes_per_token"]["wire"], ".0f"),
                _cell(_number(m["peak_decode_memory_bytes"]) / 2**30, ".1f"),
                vs,
            ]
        )
    heads = [
        "method",
        "done",
        "JCT mean",
        *(["± host"] if host else []),
        "p90",
        "TTFT",
        "TPOT ms",
        "transfer",
        "dequant",
        "approx",
        "KV B/tok",
        "peak GiB",
        "JCT vs base",
    ]
    title = f"scenario {summary['scenario']}: {summary['requests']} requests, seed {summary['seed']}"
    lines = [render(table(heads, rows, title=title)), *utilisation_lines(summary, placement)]
    if host:
        lines.append(host["line"])
    return "\n".join(lines)


# Each pool's share of a request's time: the breakdown parts spent waiting for it or in it. The KV waits
# in prefill host memory (transfer_queue) for room on a decode replica, so that wait is decode's.
POOL_PARTS = {
    "prefill": ("prefill_queue", "prefill", "quantize"),
    "network": ("transfer",),
    "decode": ("transfer_queue", "decode_queue", "decode", "dequantize", "approximation", "preemption"),
}


def utilisation_lines(summary: dict, placement: str = "separate") -> list[str]:
    """Under the table: each pool's utilisation (summary.json's, simulator/overload.py: the work a pool was
    asked for over what it can deliver while requests arrive), the busiest pool, and how much of the mean
    JCT goes to waiting for it and running in it; the range over methods where they differ.

    With both phases in one engine (placement colocated) there is no pool to call the bottleneck: prefill's
    utilisation is the share of the GPUs' time its chunks take (simulator/run.py), and the decode steps run in
    the rest, stretched by the chunks beside them (the engine's TPOT); the second line says that and splits
    the mean JCT between the phases instead.

    With prefill and decode replicas on the same GPUs (placement shared_gpu) the busier of the two pools is
    those GPUs, not one pool: the line names the shared GPUs, gives both pools' utilisation and counts the time
    spent waiting for and running in either phase."""
    methods = {n: m for n, m in summary["methods"].items() if isinstance(m.get("utilisation"), dict)}
    util = {n: {p: _number(m["utilisation"].get(p)) for p in POOL_PARTS} for n, m in methods.items()}
    util = {n: u for n, u in util.items() if any(math.isfinite(v) for v in u.values())}
    if not util:
        return []
    pools = ", ".join(f"{p} {_span([u[p] for u in util.values()], _pct)}" for p in POOL_PARTS)
    lines = [f"utilisation while requests arrive: {pools}"]
    if placement == "colocated":
        shares = {
            pool: [
                100
                * sum(_number(methods[n]["breakdown_s"].get(k, 0.0)) for k in parts)
                / _number(methods[n]["jct_s"]["mean"])
                for n in util
                if _number(methods[n]["jct_s"]["mean"]) > 0
            ]
            for pool, parts in POOL_PARTS.items()
        }
        split = ", ".join(
            f"{pool} {_span(v, lambda x: f'{x:.0f} %')}" for pool, v in shares.items() if v and max(v) >= 0.5
        )
        return lines + [
            f"each engine serves both phases (placement colocated): prefill chunks take "
            f"{_span([u['prefill'] for u in util.values()], _pct)} of its GPUs' time and decode steps share the "
            f"rest; the mean JCT is {split or '–'}"
        ]
    # placement shared_gpu: prefill replica i and decode replica i run on the same GPUs, so whichever of the two
    # pools is busier, the bottleneck is those GPUs, and the time a request spends on them is both phases'
    shared = placement == "shared_gpu"
    gpus = "the shared GPUs"
    parts = {**POOL_PARTS, gpus: POOL_PARTS["prefill"] + POOL_PARTS["decode"]}

    def group(pool: str) -> str:
        return gpus if shared and pool != "network" else pool

    busiest = {n: group(max(POOL_PARTS, key=lambda p: u[p] if math.isfinite(u[p]) else -1.0)) for n, u in util.items()}
    kinds = list(dict.fromkeys(busiest.values()))
    if len(kinds) > 1:
        return lines + [
            "bottleneck: " + "; ".join(f"{p} ({', '.join(n for n in util if busiest[n] == p)})" for p in kinds)
        ]
    pool = kinds[0]
    spent = [sum(_number(methods[n]["breakdown_s"].get(k)) for k in parts[pool]) for n in util]
    jct = [_number(methods[n]["jct_s"]["mean"]) for n in util]
    share = [s / j for s, j in zip(spent, jct) if j > 0]
    every = "every method" if len(util) > 1 else next(iter(util))
    if pool == gpus:
        busy = ", ".join(f"{p} {_span([u[p] for u in util.values()], _pct)}" for p in ("prefill", "decode"))
        line, where = f"bottleneck: {gpus} (both pools) for {every} ({busy} busy)", "prefill or decode"
    else:
        line, where = f"bottleneck: {pool} for {every} ({_span([u[pool] for u in util.values()], _pct)} busy)", pool
    if share:
        line += (
            f": waiting for and running in {where} is {_span(spent, _secs)} of the {_span(jct, _secs)} mean JCT "
            f"({_span([100 * x for x in share], lambda v: f'{v:.0f}')} %)"
        )
    return lines + [line]


def _cell(v, spec: str, unit: str = "", sign: str = "") -> str:
    """A table cell: `v` formatted, or `–` where there is no figure (no request completed: a mean over none is
    NaN in memory and null in summary.json)."""
    x = _number(v)
    return f"{sign}{x:{spec}}{unit}" if math.isfinite(x) else "–"


def _number(v) -> float:
    if v == "Infinity":
        return math.inf
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else math.nan


def _pct(u: float) -> str:
    if math.isinf(u):
        return "unbounded"
    return f"{100 * u:.0f} %" if 100 * u >= 9.5 else f"{100 * u:.1f} %"


def _secs(v: float) -> str:
    return f"{v:.1f} s"


def _span(values: list[float], fmt) -> str:
    """`lo-hi` over the finite values (one value where they print alike), `–` for none."""
    finite = sorted(v for v in values if not math.isnan(v))
    if not finite:
        return "–"
    lo, hi = fmt(finite[0]), fmt(finite[-1])
    if lo == hi:
        return lo
    unit = next((u for u in (" %", " s") if lo.endswith(u) and hi.endswith(u)), "")
    return f"{lo.removesuffix(unit)}-{hi}"


@app.command()
def simulate(
    scenario: Path = typer.Argument(..., help="scenario YAML"),
    out: str | None = typer.Option(
        None,
        "--out",
        help="write summary.json, requests.csv, memory.csv, links.csv, "
        "scenario.json, profiles.json and report.html here",
    ),
    methods: str | None = typer.Option(None, "--methods", help="comma-separated subset of the scenario's methods"),
    requests: int | None = typer.Option(None, "--requests", help="override workload.requests"),
    seed: int | None = typer.Option(None, "--seed", help="override workload.seed"),
    set_: list[str] = typer.Option(
        [], "--set", help="path.to.field=value (repeatable), e.g. network.bandwidth_gbps=25"
    ),
    profile: Path | None = typer.Option(
        None, "--profile", help="calibration profile.json for both pools (default: the scenario's calibration settings)"
    ),
    report: bool = typer.Option(True, "--report/--no-report", help="also write report.html with --out"),
    plotlyjs: str | None = typer.Option(None, "--plotlyjs", help=PLOTLYJS_HELP),
    as_json: bool = typer.Option(False, "--json", help=JSON_HELP + ": summary.json's content"),
    quiet: bool = typer.Option(False, "--quiet", "-q", help=QUIET_HELP),
    host_spread: bool = typer.Option(
        False,
        "--host-spread",
        help="also simulate every method on a host 1.25x faster and 1.25x slower: what the host's run-to-run speed "
        "alone moves each mean JCT by (simulator/host_speed.py); three simulations instead of one",
    ),
) -> None:
    """Simulate every KV method of SCENARIO and print the comparison."""
    errors_as_json(as_json)
    from planning.executor import Interrupted, stop_on_signals
    from simulator.config import ScenarioError
    from simulator.faults import faults_line
    from simulator.files import check_out_dir
    from simulator.load import load_scenario
    from simulator.overload import overload_line
    from simulator.run import run_scenario

    overrides = list(set_)
    if requests is not None:
        overrides.append(f"workload.requests={requests}")
    if seed is not None:
        overrides.append(f"workload.seed={seed}")
    if profile is not None:
        overrides += [f"calibration.prefill_profile={profile}", f"calibration.decode_profile={profile}"]
    chosen = None if methods is None else [m.strip() for m in methods.split(",") if m.strip()]
    if chosen == []:
        fail(f"--methods {methods!r}: no method names (give e.g. --methods baseline,hack)")
    names = chosen or []
    twice = next((m for i, m in enumerate(names) if m in names[:i]), None)
    if twice is not None:
        fail(f"--methods {methods!r}: {twice} given twice; give each method once")
    if plotlyjs_refusal(plotlyjs):
        fail(str(plotlyjs_refusal(plotlyjs)))
    say = Say(as_json, quiet)
    scenario = resolve_example(scenario)
    out_dir = None if out is None else Path(out)
    writer = None
    with stop_on_signals():
        try:
            if out is not None:
                check_out_dir(out, ScenarioError)
            cfg = load_scenario(scenario, overrides)
            if out_dir is not None:
                names = [m.output_name for m in cfg.methods] + [link.name for link in cfg.network.links or []]
                writer = RunOutputs(out_dir, quote_text=any(ch in n for n in names for ch in ',"\r\n'), report=report)
            runs = (len(chosen) if chosen else len(cfg.methods)) * (3 if host_spread else 1)
            with ProgressBar(0 if quiet else runs, "simulating", "methods") as bar:
                result = run_scenario(
                    cfg,
                    source=str(scenario),
                    methods=chosen,
                    progress=lambda _name: bar.advance(),
                    sink=None if writer is None else writer.add,
                )
                if host_spread:  # before the outputs are written: summary.json carries them
                    from simulator.host_speed import add_method_spreads, method_host_sensitivities

                    x = method_host_sensitivities(cfg, str(scenario), chosen, lambda _name: bar.advance())
                    add_method_spreads(result.summary, x)
            moved = [] if writer is None else writer.finish(result, report, plotlyjs)
        except BaseException as e:
            if writer is not None:
                writer.discard()
            if isinstance(e, ScenarioError):
                fail(str(e))
            if isinstance(e, OSError) and out_dir is not None:
                fail(f"--out {out_dir}: cannot write the outputs: {e.strerror or e}; nothing was written")
            if isinstance(e, KeyboardInterrupt):
                name = e.name if isinstance(e, Interrupted) else "SIGINT"
                kept = writer is not None and writer.done
                where = "" if out_dir is None else f"; {out_dir} " + ("holds the run" if kept else "is as it was")
                print_error(f"interrupted by {name}{where}", prefix="")
                raise typer.Exit(128 + (e.signum if isinstance(e, Interrupted) else 2)) from None
            raise
    say.result(format_table(result.summary, cfg.placement), result.summary)
    if not quiet:  # how the pools are priced: roofline, a profile for another GPU, derived GPU fields
        for line in result.resolved.warnings:
            typer.echo(f"warning: {line}", err=True)
        if result.engine_outside:  # the engine calibration's fit is extrapolated here
            typer.echo(
                f"note: calibration.engine {Path(str(cfg.calibration.engine)).name}: this scenario lies outside the runs "
                "it was fitted on (its prediction extrapolates the fit): " + "; ".join(result.engine_outside),
                err=True,
            )
    warning = overload_line(result.summary)
    if warning and not quiet:
        typer.echo(warning, err=True)
    if cfg.faults and not quiet:
        say(faults_line(result.summary))
    if out_dir is not None:
        shown = [n for n in ("summary.json", "requests.csv", "memory.csv", "links.csv", "report.html") if n in moved]
        say(f"wrote {out_dir}/{shown[0]}, " + ", ".join(shown[1:]))


def _build_report(
    out: Path, plotlyjs: str | None = None, final_dir: Path | None = None, tables: dict | None = None
) -> Path | None:
    try:
        from reports import build_report
    except ImportError:
        return None
    return build_report(out, plotlyjs=plotlyjs, final_dir=final_dir, tables=tables)


@app.command("scenarios")
def list_scenarios() -> None:
    """List the example scenarios and sweeps shipped with hacksim; any command takes their names."""
    import yaml

    from reports.terminal import render, table
    from scenarios import EXAMPLES_DIR, examples

    rows = []
    for path in examples():
        try:
            doc = yaml.safe_load(path.read_text()) or {}
        except yaml.YAMLError:
            doc = {}
        about = doc.get("description", "") if isinstance(doc, dict) else ""
        rows.append([path.relative_to(EXAMPLES_DIR).with_suffix("").as_posix(), str(about)])
    typer.echo(render(table(["name", "description"], rows, title=f"examples in {EXAMPLES_DIR}", left=2)))


SCHEMA_KINDS = ("scenario", "sweep", "candidates")


@app.command()
def schema(
    kind: str = typer.Argument(
        "scenario",
        help="scenario (shipped as scenarios/schema.json), sweep (scenarios/sweeps/sweep.schema.json) or "
        "candidates (plan --candidates; scenarios/sweeps/candidates.schema.json)",
    ),
) -> None:
    """Print the JSON Schema of a scenario (shorthand included), sweep or candidates file."""
    if kind == "scenario":
        from simulator.schema import input_schema

        doc = input_schema()
    elif kind in SCHEMA_KINDS:
        from planning.schema import candidates_schema, sweep_schema

        doc = sweep_schema() if kind == "sweep" else candidates_schema()
    else:
        fail(f"schema {kind!r}: choose from {', '.join(SCHEMA_KINDS)}")
    typer.echo(json.dumps(doc, indent=2))


@app.command()
def report(
    run_dir: Path = typer.Argument(..., help="a folder written by simulate --out"),
    plotlyjs: str | None = typer.Option(None, "--plotlyjs", help=PLOTLYJS_HELP),
    static: str | None = typer.Option(
        None,
        "--static",
        help="also write the main figures as images under RUN_DIR/figures/: png, svg or png,svg (needs '.[images]')",
    ),
) -> None:
    """Rebuild RUN_DIR/report.html from the saved tables."""
    from simulator.config import ScenarioError
    from simulator.files import check_out_dir

    if plotlyjs_refusal(plotlyjs):
        fail(str(plotlyjs_refusal(plotlyjs)))
    if not (run_dir / "summary.json").is_file():
        fail(f"{run_dir}: no summary.json (run simulate --out {run_dir} first)")
    formats = ()
    if static is not None:
        from reports.static import FORMATS

        formats = tuple(f.strip().lower() for f in static.split(",") if f.strip())
        bad = [f for f in formats if f not in FORMATS]
        if bad or not formats:
            fail(
                f"--static {static!r}: {'unknown image format ' + repr(bad[0]) if bad else 'no format'}; "
                f"choose from {', '.join(FORMATS)}"
            )
    try:
        check_out_dir(run_dir, ScenarioError, "report")
    except ScenarioError as e:
        fail(str(e))
    from reports.data import RunDataError

    try:
        path = _build_report(run_dir, plotlyjs)
    except RunDataError as e:
        fail(str(e))
    except OSError as e:  # a full disk: write_page removed its temporary file
        fail(f"{run_dir}: cannot write report.html: {e.strerror or e}")
    if path is None:
        fail("reports package unavailable")
    typer.echo(f"wrote {path}")
    if formats:
        from reports import export_static
        from reports.static import StaticExportError

        try:
            paths = export_static(run_dir, formats=formats)
        except StaticExportError as e:
            fail(str(e))
        except OSError as e:
            fail(f"{run_dir / 'figures'}: cannot write the images: {e.strerror or e}")
        typer.echo(f"wrote {len(paths)} images under {run_dir / 'figures'}")


PRIOR_SCALE_HELP = (
    "every prior width times this (a positive number; 1: the widths as stated), or auto: the scale of "
    "0.25, 0.5, 1 whose fits without each configuration predict its runs best (one cross-validation: a fit per "
    "configuration and scale)"
)


def _workers_option(what: str):
    """`--workers N`: the processes a command spreads `what` over; None (the default) is one per core (usable_cores),
    resolved where the command starts."""
    return typer.Option(
        None,
        "--workers",
        min=1,
        max=64,
        help=f"{what}, in this many processes (default: one per core; the results are the same at any count)",
    )


# validate --cv --folds: the held-out fits each value asks for (simulator/crossval.py FOLDS)
CV_FOLDS = {"both": ("trace", "configuration"), "configuration": ("configuration",), "trace": ("trace",)}


@app.command()
def validate(
    trace: Path = typer.Argument(
        ...,
        help="a trace folder (requests.csv, iterations.csv, meta.json) or its "
        "requests.csv; a vLLM, SGLang or AIPerf benchmark file (.json, .jsonl); or an index.csv "
        "(columns trace, scenario, optional method: paths relative to the "
        "repository or the index) to validate many runs and print one table",
    ),
    scenario: Path | None = typer.Option(
        None, "--scenario", help="the scenario describing the measured system (required for one trace)"
    ),
    method: str | None = typer.Option(
        None,
        "--method",
        help="the run's method (default: a realrun trace's meta.json; for a benchmark file, the scenario's only method)",
    ),
    out: Path | None = typer.Option(None, "--out", help="write validation.json and validation.html (figure) here"),
    set_: list[str] = typer.Option([], "--set", help="path.to.field=value overrides of the scenario"),
    plotlyjs: str | None = typer.Option(None, "--plotlyjs", help=PLOTLYJS_HELP),
    as_json: bool = typer.Option(False, "--json", help=JSON_HELP + ": validation.json's content"),
    quiet: bool = typer.Option(False, "--quiet", "-q", help=QUIET_HELP),
    cv: bool = typer.Option(
        False,
        "--cv",
        help="with an index: cross-validate an engine calibration (calibrate "
        "--traces): each trace predicted by a fit without it, and by a fit without its "
        "configuration, beside the in-sample fit; the held-out errors are the ones to quote (an index naming each "
        "run's machine: a held-out run on a machine the fit has other runs of is priced with that machine's host "
        "factor)",
    ),
    workers: int | None = _workers_option("with an index: validate its runs, and with --cv fit the folds"),
    folds: str = typer.Option(
        "both",
        "--folds",
        help="with --cv: the held-out fits, by trace and by configuration (both), or one of them: configuration "
        "(the headline: one fit per configuration, none per run) or trace",
    ),
    base: Path | None = typer.Option(
        None,
        "--base",
        help="with --cv: an engine calibration fitted elsewhere (calibrate --traces): each configuration predicted "
        "by it with one machine factor on its host terms fitted to the other configurations of the same machine "
        "(the index's optional column machine; without it, one machine), beside it alone, its kernel and link "
        "terms alone (calibration.engine_scopes [gpu, link]) and no fit",
    ),
    noise: Path | None = typer.Option(
        None,
        "--noise",
        help="a repeats index (columns trace, scenario, config; rows sharing config are recordings of one "
        "configuration and seed): print each metric's run-to-run spread beside its error",
    ),
    prior_scale: str | None = typer.Option(
        None,
        "--prior-scale",
        help="with --cv: the fits' prior scale as calibrate --prior-scale takes it; auto is chosen nested, for each "
        "held-out configuration from the others alone (default 1)",
    ),
) -> None:
    """Simulate the configuration of a measured run (a realrun TRACE, or a vLLM, SGLang or AIPerf benchmark
    file) and report the simulator's errors."""
    errors_as_json(as_json)
    from planning.executor import Interrupted, stop_on_signals
    from simulator.comparison import index_comparison
    from simulator.config import ScenarioError
    from simulator.files import check_out_dir, jsonable, strict_json
    from simulator.noise import noise_summary, run_to_run_spread
    from simulator.validate import add_host_spread, format_validation, format_validation_table, validate_index
    from simulator.validate import validate as run_validate

    if plotlyjs_refusal(plotlyjs):
        fail(str(plotlyjs_refusal(plotlyjs)))
    many = trace.suffix == ".csv" and trace.name != "requests.csv"
    spread = None
    if noise is not None:
        try:
            spread = run_to_run_spread(noise)
        except ScenarioError as e:
            fail(f"--noise: {e}")
    if base is not None and not cv:
        fail("--base cross-validates a machine refit: give --cv with it")
    by = CV_FOLDS.get(folds)
    if by is None:
        fail(f"--folds: {folds}: one of {', '.join(CV_FOLDS)}")
    if folds != "both" and not cv:
        fail("--folds chooses validate --cv's held-out fits: give --cv with it")
    if folds != "both" and base is not None:
        fail("--folds: --cv --base fits one machine factor per configuration and machine, no folds to choose")
    if prior_scale is not None and not cv:
        fail("--prior-scale sets validate --cv's fits: give --cv with it")
    if prior_scale is not None and base is not None:
        fail("--prior-scale: --cv --base fits one machine factor, on its own prior; the scale has nothing to set")
    scale = 1.0 if prior_scale is None else _prior_scale(prior_scale)
    workers = workers or usable_cores()
    if cv:
        _validate_cv(
            trace,
            many,
            scenario,
            set_,
            out,
            as_json,
            quiet,
            workers,
            spread,
            base,
            by,
            scale,
            plotlyjs,
        )
        return
    scenario = None if scenario is None else resolve_example(scenario)
    if not many and scenario is None:
        fail(f"{trace}: --scenario is required to validate one trace")
    try:
        if out is not None:
            check_out_dir(out, ScenarioError)
        if many:
            with stop_on_signals():  # SIGTERM, SIGINT, SIGHUP: the workers end with us (process_pool.map_in_processes)
                result: list[dict] | dict = validate_index(trace, list(set_), workers, _progress(quiet))
        else:
            assert scenario is not None  # refused above
            result = run_validate(trace, scenario, list(set_), method)
    except ScenarioError as e:
        fail(str(e))
    except Interrupted as e:
        _interrupted("validate", e)
    host = add_host_spread(result, spread)  # each run's host speed alone, in % of its mean JCT
    if host is not None and isinstance(result, dict):
        result["host_speed"] = host
    doc: list[dict] | dict = result
    if spread is not None:
        noise_doc = noise_summary(spread, ("index", "spread_pct", "range_pct", "host_gauge"))
        doc = {"traces": result, "noise": noise_doc} if isinstance(result, list) else {**result, "noise": noise_doc}
    text = strict_json(doc) + "\n"
    if out is not None:  # written before the result is printed: a failed write prints no result
        from reports.validation import write_validation_index_report, write_validation_report  # plotly: only here

        def page(path: Path) -> None:
            if many:
                rows = jsonable(result)
                write_validation_index_report(
                    rows,
                    path,
                    plotlyjs=plotlyjs,
                    noise=spread,
                    page_path=out / path.name,
                    comparison=index_comparison(rows, spread),
                    host_speed=host,
                )
            else:
                write_validation_report(jsonable(doc), path, plotlyjs=plotlyjs, page_path=out / path.name)

        write_together(out, {"validation.json": lambda path: path.write_text(text), "validation.html": page})
    say = Say(as_json, quiet)
    if isinstance(result, list):
        say.result(format_validation_table(result, spread), doc)
    else:
        say.result(format_validation(doc if isinstance(doc, dict) else result), doc)
    if out is not None:
        say(f"wrote {out}/validation.json, validation.html")


def _interrupted(command: str, e) -> NoReturn:
    """A command whose process pool a signal stopped (planning.executor.stop_on_signals): one line, exit 128 + the
    signal."""
    typer.echo(f"{command}: interrupted by {e.name}; nothing written", err=True)
    sys.stdout.flush()
    sys.stderr.flush()
    # the workers are ended (process_pool.map_in_processes); exit without the interpreter's exit hooks, which join
    # the process pool's manager thread with no bound: a signal landing while the pool starts can leave it waiting
    # for ever (seen once in 18 runs of tests/test_crossval.py's SIGTERM test on a loaded machine: no exit in 120 s)
    os._exit(128 + e.signum)


def _progress(quiet: bool):
    """The progress display of a command's process pool (process_pool.map_in_processes): a bar per step on stderr
    where it is a terminal, none with --quiet."""
    return lambda total, label, unit: ProgressBar(0 if quiet else total, label, unit)


def _validate_cv(
    index: Path,
    many: bool,
    scenario: Path | None,
    set_: list[str],
    out: Path | None,
    as_json: bool,
    quiet: bool,
    workers: int,
    noise: dict | None,
    base: Path | None,
    by: tuple[str, ...],
    prior_scale: float | str = 1.0,
    plotlyjs: str | None = None,
) -> None:
    from planning.executor import Interrupted, stop_on_signals
    from simulator.config import ScenarioError
    from simulator.crossval import cross_validate, cross_validate_machine, format_cv, format_cv_machine
    from simulator.engine import read_engine_file
    from simulator.files import check_out_dir, strict_json

    if not many:
        fail(f"{index}: --cv needs an index.csv of traces (columns trace, scenario)")
    if scenario is not None or set_:
        fail("--cv takes the scenarios from the index; --scenario and --set do not apply")
    try:
        if out is not None:
            check_out_dir(out, ScenarioError)
        engine = None if base is None else read_engine_file(base, ScenarioError)
        with stop_on_signals():  # SIGTERM, SIGINT, SIGHUP: the workers end with us (process_pool.map_in_processes)
            if engine is not None:
                result = cross_validate_machine(
                    index,
                    engine.fitted_with_stderr(),
                    str(base),
                    workers=workers,
                    noise=noise,
                    base_domain=engine.domain_dict(),
                    progress=_progress(quiet),
                )
            else:
                result = cross_validate(
                    index, workers=workers, noise=noise, by=by, prior_scale=prior_scale, progress=_progress(quiet)
                )
    except ScenarioError as e:
        fail(str(e))
    except Interrupted as e:
        _interrupted("validate --cv", e)
    if out is not None:  # written before the result is printed: a failed write prints no result
        from reports.validation import write_crossval_report  # plotly: only here
        from simulator import crossval

        text = strict_json(result) + "\n"
        if base is not None:
            schemes, headline, notes = crossval.MACHINE_HEADS, "machine_refit", crossval.cv_machine_notes(result)
        else:
            schemes = {k: crossval.HEADS[k] for k in crossval.SCHEMES if k in result}
            headline, notes = "held_out_configuration", crossval.cv_notes(result)

        def page(path: Path) -> None:
            write_crossval_report(
                json.loads(text),
                path,
                schemes=schemes,
                headline=headline if headline in schemes else list(schemes)[-1],
                notes=notes,
                flags=headline in schemes,  # held out by configuration (or the machine refit): what the flag is on
                plotlyjs=plotlyjs,
                page_path=out / path.name,
            )

        write_together(out, {"validation.json": lambda path: path.write_text(text), "validation.html": page})
    say = Say(as_json, quiet)
    say.result(format_cv_machine(result) if base is not None else format_cv(result), result)
    if out is not None:
        say(f"wrote {out}/validation.json, validation.html")


@app.command(context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def calibrate(
    ctx: typer.Context,
    traces: Path | None = typer.Option(
        None,
        "--traces",
        help="an index.csv of measured runs (columns trace, scenario; optional method): realrun traces or "
        "benchmark files; fit an engine calibration to them (no GPU needed)",
    ),
    out: Path | None = typer.Option(
        None,
        "--out",
        help="with --traces: the engine calibration file to write; with --derive: the folder for profile.json; "
        "otherwise: the profile folder (passed to the kernel profiler)",
    ),
    derive: str | None = typer.Option(
        None,
        "--derive",
        help="derive a calibration profile for a GPU without one (no GPU needed): a catalog key "
        "(catalog/data/gpus.yaml) or a YAML file holding one GPU's fields (the short spec: memory_bytes or "
        "memory_gib, memory_bandwidth_gb_per_s, fp16_tensor_tflops, sms, boost_clock_ghz)",
    ),
    base: Path | None = typer.Option(
        None,
        "--base",
        help="with --traces: an engine calibration file to start from (its fitted values become the runs' "
        "scenarios' own: where the fit starts and the priors' centres); what the refit does not fit is carried "
        "through to --out",
    ),
    refit: str | None = typer.Option(
        None,
        "--refit",
        help="with --traces: what to fit: all (every parameter; the default without --base), host (the machine's "
        "host-scope terms, GPU and link ones held), machine (one factor on every host time term: a CPU faster or "
        "slower than the base's; the default with --base, identifiable from a single run)",
    ),
    prior_scale: str | None = typer.Option(None, "--prior-scale", help="with --traces: " + PRIOR_SCALE_HELP),
    workers: int | None = _workers_option(
        "with --traces: read the runs, and with --prior-scale auto fit its cross-validation"
    ),
    as_json: bool = typer.Option(False, "--json", help=JSON_HELP + ": the engine calibration file's content"),
    quiet: bool = typer.Option(False, "--quiet", "-q", help=QUIET_HELP),
) -> None:
    """Profile the kernels on this machine's GPU and write a calibration profile (needs torch, Triton, a GPU);
    or, with --traces INDEX.csv --out FILE, fit an engine calibration to measured runs.

    Kernel profiling: other arguments are passed to `python -m kernels_calibration.profile` (e.g. --out DIR,
    --quick).  Engine calibration: fits what kernel profiles cannot see (decode loop gap and host issue time,
    extra kernels, join time, prefill efficiency and host time, link efficiency and latency, per-method
    implementation factors and launch floors) to realrun traces or vLLM, SGLang and AIPerf benchmark files, a
    MAP fit toward the kernels' prices with stated priors: what the runs do not constrain stays where the kernels
    put it; a scenario uses the file through `calibration: {engine: FILE}`. With --base FILE a calibration moves to
    another machine: by default one factor on every host time term, fitted to the runs given (one is enough), the
    GPU and link terms kept. An index naming each run's machine (column machine) is fitted with one such factor per
    machine beside the shared terms, which are then the machines' typical CPU.

    Derived profile (--derive GPU --out DIR): the measured H200 kernels split by the unit that spends their
    time and repriced at the GPU's rates (kernels_calibration/derive.py); use it with --profile DIR/profile.json."""
    errors_as_json(as_json)
    if traces is not None and derive is not None:
        fail("calibrate: --traces and --derive are separate jobs; give one")
    if traces is None and (base is not None or refit is not None or prior_scale is not None):
        given = "--base" if base is not None else "--refit" if refit is not None else "--prior-scale"
        fail(f"calibrate: {given} sets an engine calibration's fit: give --traces")
    if traces is not None:
        scale = 1.0 if prior_scale is None else _prior_scale(prior_scale)
        _calibrate_engine(traces, out, list(ctx.args), as_json, quiet, base, refit, scale, workers or usable_cores())
        return
    if derive is not None:
        _derive_profile(derive, out, list(ctx.args), quiet)
        return
    try:
        import torch

        from kernels_calibration.profile import main as profile_main
    except ImportError as e:
        fail(f"calibrate needs the kernel extras (pip install -e '.[kernels]'): {e}")
    args = list(ctx.args) + ([] if out is None else ["--out", str(out)])
    if not torch.cuda.is_available() and not any(a in ("-h", "--help") or a.startswith("--fit-only") for a in args):
        fail(
            "calibrate profiles kernels on a CUDA GPU and this machine has none (torch.cuda.is_available() is "
            "False); --fit-only ROWS.csv refits a profile from measured rows without one"
        )
    raise typer.Exit(profile_main(args))


def _derive_profile(gpu: str, out: Path | None, extra: list[str], quiet: bool) -> None:
    """calibrate --derive: a derived profile for a catalog GPU or a GPU spec file."""
    import catalog
    from kernels_calibration.derive import HERE, MEASURED, SOURCE, derive_for, peaks_of, write_profile
    from simulator.config import GPUConfig, ScenarioError, first_error, read_yaml
    from simulator.resolve import gpu_fields

    if extra:
        fail(f"calibrate --derive: unexpected argument {extra[0]!r}")
    if out is None:
        fail("calibrate --derive: --out DIR (the folder to write profile.json into) is required")
    if out.exists() and not out.is_dir():
        fail(f"{out}: --out must be a folder (profile.json is written into it)")
    from pydantic import ValidationError

    source = gpu
    try:
        if gpu in catalog.load("gpus"):
            raw = gpu
        elif Path(gpu).suffix in (".yaml", ".yml", ".json") or Path(gpu).is_file():
            raw = read_yaml(Path(gpu), ScenarioError, "GPU spec file")
            if not isinstance(raw, dict):
                raise ScenarioError(f"{gpu}: expected a mapping of GPU fields")
        else:
            raise ScenarioError(
                f"--derive {gpu!r}: not a catalog GPU ({', '.join(sorted(catalog.load('gpus')))}) nor a YAML file"
            )
        try:
            cfg = GPUConfig.model_validate(raw)
        except ValidationError as e:
            raise ScenarioError(first_error(source, e, "gpu")) from None
        fields, derived = gpu_fields(cfg)
    except (ScenarioError, ValueError) as e:
        fail(str(e))
    from costmodel.specs import GPUSpec

    key = cfg.preset or cfg.name or Path(gpu).stem
    if key == SOURCE:
        fail(f"--derive {key}: the {SOURCE} profile is measured, not derived")
    spec = GPUSpec.from_fields(key, fields)
    src = json.loads((HERE / SOURCE / "profile.json").read_text())
    profile = derive_for(src, spec, peaks_of(fields), fields["name"])
    if derived:
        profile["gpu_derived"] = derived
    try:
        path = write_profile(profile, out)
    except OSError as e:
        fail(f"{out}: cannot write the profile: {e.strerror or e}")
    if not quiet:
        for name, d in derived.items():
            typer.echo(f"derived {name} = {d['value']} ({d['rule']})", err=True)
        if key in MEASURED:
            typer.echo(
                f"note: {key} has a measured profile ({(HERE / key / 'profile.json').relative_to(HERE.parents[1])}), "
                "which its pools use; this is what derive.py gives it",
                err=True,
            )
        typer.echo(f"wrote {path} (use it with --profile {path} or calibration.decode_profile)")


def _prior_scale(text: str) -> float | str:
    """--prior-scale: auto, or a positive number (refused in one line otherwise)."""
    if text == "auto":
        return text
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (value > 0 and math.isfinite(value)):
        fail(f"--prior-scale: {text!r}: a positive number or auto")
    return value


def _calibrate_engine(
    index: Path,
    out: Path | None,
    extra: list[str],
    as_json: bool,
    quiet: bool,
    base_path: Path | None = None,
    refit: str | None = None,
    prior_scale: float | str = 1.0,
    workers: int = 1,
) -> None:
    from planning.executor import Interrupted, stop_on_signals
    from simulator.calibrate import REFITS, base_mismatch, engine_file, fit_engine, format_fit, load_index
    from simulator.config import ScenarioError
    from simulator.engine import EngineFile, read_engine_file
    from simulator.files import strict_json

    if extra:
        fail(f"calibrate --traces: unexpected argument {extra[0]!r}")
    if out is None:
        fail("calibrate --traces: --out FILE (the engine calibration file to write) is required")
    if out.exists() and out.is_dir():
        fail(f"{out}: --out is a folder; give the engine calibration file's path")
    if refit is None:
        refit = "all" if base_path is None else "machine"
    if refit not in REFITS:
        fail(f"calibrate --refit: {refit!r} is not one of {', '.join(REFITS)}")
    if prior_scale != 1.0 and refit == "machine":
        fail("calibrate --prior-scale: --refit machine fits one factor on its own prior; the scale has nothing to set")
    if prior_scale == "auto" and base_path is not None:
        fail("calibrate --prior-scale auto: its cross-validation fits the scenarios' values; give a number with --base")
    base = None
    if base_path is not None:
        try:
            engine = read_engine_file(base_path, ScenarioError)
        except ScenarioError as e:
            fail(f"calibrate --base: {e}")
        base = engine.fitted_with_stderr()
    _check_writable(out)  # before the fit: a fit of minutes must not end in a permission error
    choice = None
    try:
        with stop_on_signals():  # SIGTERM, SIGINT, SIGHUP: the workers end with us (process_pool.map_in_processes)
            traces = load_index(index, workers, _progress(quiet))
            if prior_scale == "auto":
                from simulator.crossval import choose_prior_scale

                choice = choose_prior_scale(index, traces, workers, progress=_progress(quiet))
                prior_scale = float(choice.pop("value"))
        assert not isinstance(prior_scale, str)
        fit = fit_engine(traces, refit, base, None if base_path is None else str(base_path), prior_scale)
    except ScenarioError as e:
        fail(str(e))
    except Interrupted as e:
        _interrupted("calibrate", e)
    command = f"calibrate --traces {index} --out {out}"
    if base_path is not None:
        command += f" --base {base_path}"
    if refit != ("all" if base_path is None else "machine"):
        command += f" --refit {refit}"
    if choice is not None:
        command += " --prior-scale auto"
    elif prior_scale != 1.0:
        command += f" --prior-scale {prior_scale:g}"
    doc = engine_file(
        fit, traces, str(index), command, __version__, choice, None if base_path is None else engine.domain_dict()
    )
    mismatch = None if base_path is None else base_mismatch(engine.engine, traces)
    if mismatch:
        doc["fit"]["warnings"] = [mismatch]
    EngineFile.model_validate(doc)  # what a scenario will read back
    text = strict_json(doc) + "\n"
    tmp = out.with_name(f".{out.name}.tmp")
    try:
        tmp.write_text(text)
        os.replace(tmp, out)
    except OSError as e:
        tmp.unlink(missing_ok=True)
        fail(f"{out}: cannot write the engine calibration file: {e.strerror or e}")
    say = Say(as_json, quiet)
    say.result(format_fit(doc), doc)
    if mismatch and not quiet:
        typer.echo(f"warning: {mismatch}", err=True)
    say(f"wrote {out}")


def _check_writable(out: Path) -> None:
    """Refuse, before any work, an output file whose folder cannot be made or written: create the folder and a
    probe file in it (removed at once)."""
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        fail(f"{out}: cannot create its folder {out.parent}: {e.strerror or e}")
    probe = out.with_name(f".{out.name}.probe-{os.getpid()}")
    try:
        probe.write_text("")
    except OSError as e:
        fail(f"{out}: cannot write in {out.parent}: {e.strerror or e}")
    probe.unlink(missing_ok=True)


from planning.commands import register_commands  # noqa: E402  (cheap: heavy modules load inside the commands)

register_commands(app)  # sweep, plan

if __name__ == "__main__":
    app()
