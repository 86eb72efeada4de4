"""`sweep` and `plan` on the hacksim CLI: thin wrappers over planning.sweep / planning.plan.

    python cli.py sweep scenarios/sweeps/a10g_bandwidth_methods.yaml --out out/sweeps/bw
    python cli.py plan scenarios/a10g_10gbps.yaml --rate 0.2 --slo ttft_p99_s=60,tpot_p99_s=0.5,jct_p90_s=60

cli.py calls `register_commands(app)`. Bad input exits 2 with one `error:` line on stderr and
writes nothing; `--ray` without Ray installed is bad input too. Ctrl-C keeps every finished
point in the cache, so the same command resumes.
"""

from __future__ import annotations

import math
import signal
import sys
from pathlib import Path
from typing import NoReturn

import typer

from reports.terminal import JSON_HELP, PLOTLYJS_HELP, QUIET_HELP, errors_as_json, print_error

EXIT_BAD_INPUT = 2


def _fail(message: str) -> NoReturn:
    print_error(message)
    raise typer.Exit(EXIT_BAD_INPUT)


# More worker processes than this per core only wait for a core (and fork a process each up front).
JOBS_PER_CORE = 4
MAX_RAY_TIMEOUT_S = 3600.0


def _backend(jobs: int | None, ray: bool, ray_address: str | None, ray_timeout_s: float) -> dict:
    from .executor import PlanningError, usable_cores

    if ray and ray_address:
        raise PlanningError("give --ray (start a local Ray) or --ray-address ADDR (join a cluster), not both")
    if jobs is not None:
        if jobs < 1:
            raise PlanningError(f"--jobs must be >= 1, got {jobs}")
        limit = JOBS_PER_CORE * usable_cores()
        if jobs > limit:
            raise PlanningError(
                f"--jobs {jobs}: at most {limit} on this machine ({JOBS_PER_CORE} per core; more processes only "
                "wait for a core)"
            )
    if not (math.isfinite(ray_timeout_s) and 0 < ray_timeout_s <= MAX_RAY_TIMEOUT_S):
        raise PlanningError(
            f"--ray-timeout {ray_timeout_s:g}: give seconds, more than 0 and at most {MAX_RAY_TIMEOUT_S:g}"
        )
    backend = "ray" if (ray or ray_address) else "pool"
    return {"backend": backend, "jobs": jobs, "ray_address": ray_address, "connect_timeout_s": ray_timeout_s}


RAY_ADDRESS_HELP = (
    "run on the Ray cluster at ADDR: HOST:PORT of the head (`ray start --head --port=PORT`), "
    "ray://HOST:10001 (Ray Client) or auto (the cluster started on this machine)"
)
RAY_TIMEOUT_HELP = (
    "seconds to wait for the cluster at --ray-address before giving up, and for a head that stops answering "
    "during the run"
)
JOBS_HELP = f"worker processes (default: one per core; at most {JOBS_PER_CORE} per core)"


def _interrupted(e: KeyboardInterrupt, ex, cache: Path | None) -> NoReturn:
    """Say what was kept and how to resume, then exit 128 + the signal (130 for Ctrl-C, 143 for SIGTERM)."""
    from .executor import Interrupted, command_line

    signum = e.signum if isinstance(e, Interrupted) else signal.SIGINT
    done = 0 if ex is None else ex.stats.simulated
    if cache is not None and not cache.is_dir():  # no point had finished, nor in an earlier run: none cached
        msg = f"interrupted by {signal.Signals(signum).name} before any point finished; nothing was written"
    elif cache is not None:
        msg = (
            f"interrupted by {signal.Signals(signum).name}: the {done} point(s) finished in this run are cached "
            f"in {cache}; run the same command to resume: {command_line()}"
        )
    else:
        msg = f"interrupted by {signal.Signals(signum).name}; give --out DIR to keep finished points for a rerun"
    print_error(msg, prefix="")
    raise typer.Exit(128 + int(signum))


def _write_failed(out: Path, e: OSError, cache: Path | None) -> NoReturn:
    kept = f"; the finished points are cached in {cache}, so a rerun only writes" if cache is not None else ""
    _fail(f"--out {out}: cannot write the outputs: {e.strerror or e}{kept}")


def register_commands(app: typer.Typer) -> None:
    """Add `sweep` and `plan` to the hacksim typer app."""

    @app.command()
    def sweep(
        sweep_file: Path = typer.Argument(..., help="sweep YAML: a base scenario plus axes (see scenarios/sweeps/)"),
        out: str | None = typer.Option(
            None,
            "--out",
            help="write results.csv, results.parquet, report.html, sweep.json and "
            "the point cache (.cache/) here; default out/sweeps/<sweep name>",
        ),
        jobs: int | None = typer.Option(None, "--jobs", help=JOBS_HELP),
        ray: bool = typer.Option(False, "--ray", help="run points as Ray tasks on a local Ray started here"),
        ray_address: str | None = typer.Option(None, "--ray-address", help=RAY_ADDRESS_HELP),
        ray_timeout: float = typer.Option(30.0, "--ray-timeout", help=RAY_TIMEOUT_HELP),
        report: bool = typer.Option(True, "--report/--no-report", help="also write report.html"),
        plotlyjs: str | None = typer.Option(None, "--plotlyjs", help=PLOTLYJS_HELP),
        as_json: bool = typer.Option(
            False, "--json", help=JSON_HELP + ": sweep.json's content, the files written and how the points ran"
        ),
        quiet: bool = typer.Option(False, "--quiet", "-q", help=QUIET_HELP),
    ) -> None:
        """Simulate every point of SWEEP_FILE and write one tidy table (CSV and Parquet) plus a report."""
        from reports.terminal import Say, plotlyjs_refusal
        from scenarios import resolve as resolve_example
        from simulator.files import check_out_dir

        from .executor import Executor, PlanningError, stop_on_signals
        from .sweep import WARN_SWEEP_POINTS, load_sweep, run_sweep, write_sweep_outputs

        errors_as_json(as_json)
        say = Say(as_json, quiet)
        if plotlyjs_refusal(plotlyjs):
            _fail(str(plotlyjs_refusal(plotlyjs)))
        sweep_file = resolve_example(sweep_file)
        ex, out_dir = None, None
        with stop_on_signals():
            try:
                backend = _backend(jobs, ray, ray_address, ray_timeout)
                spec, base = load_sweep(sweep_file)
                assert spec.name is not None  # load_sweep names a sweep after its file
                out_dir = Path(out) if out is not None else Path("out") / "sweeps" / spec.name
                check_out_dir(out if out is not None else out_dir, PlanningError)
                n = spec.point_count()
                if n > WARN_SWEEP_POINTS and not quiet:
                    typer.echo(
                        f"warning: sweep {spec.name} has {n:,} points, each a full simulation of every method; "
                        "Ctrl-C keeps the finished ones for a rerun",
                        err=True,
                    )
                ex = Executor(cache_dir=out_dir / ".cache", label=f"sweep {spec.name}", progress=not quiet, **backend)
                with ex:
                    result = run_sweep(spec, base, ex, source=str(sweep_file))
                st = result.stats
                stats_line = (
                    f"{st.simulated} points simulated, {st.cached} from the cache, {st.wall_s:.1f} s on "
                    f"{st.workers} {st.backend} worker(s)"
                )
                written, notes, doc = write_sweep_outputs(
                    result, out_dir, sweep_file, base, report=report, plotlyjs=plotlyjs, stats_line=stats_line
                )
            except PlanningError as e:
                _fail(str(e))
            except KeyboardInterrupt as e:
                _interrupted(e, ex, None if out_dir is None else out_dir / ".cache")
            except OSError as e:
                if out_dir is None:
                    raise
                _write_failed(out_dir, e, out_dir / ".cache")
        if not quiet:
            for note in notes:
                typer.echo(note, err=True)
        df = result.table
        errors = doc["errors"]
        first = doc["first_error"]
        text = [
            f"sweep {spec.name}: {result.points} points x methods = {len(df)} rows ({errors} with errors); {stats_line}"
        ]
        if first:
            text.append(f"  first error (point {first['point']}): {first['error']}")
        text.append("wrote " + ", ".join(str(p) for p in written))
        run = {"simulated": st.simulated, "cached": st.cached, "wall_s": st.wall_s, "workers": st.workers}
        say.result("\n".join(text), {**doc, "files": [str(p) for p in written], "run": {**run, "backend": st.backend}})

    @app.command()
    def plan(
        scenario: Path = typer.Argument(..., help="base scenario YAML (model, workload, network, batching)"),
        rate: float = typer.Option(..., "--rate", help="target arrival rate, requests/s"),
        slo: str = typer.Option(
            ...,
            "--slo",
            help="targets in seconds, comma-separated, each once: e.g. ttft_p99_s=60,tpot_p99_s=0.5 (metrics: ttft, "
            "tpot or jct, then mean, p50, p90 or p99, then _s)",
        ),
        candidates: Path | None = typer.Option(
            None,
            "--candidates",
            help="candidates YAML (see "
            "scenarios/sweeps/plan_candidates.yaml); default: every priced "
            "catalog instance the model fits, x replicas, x the scenario's "
            "methods",
        ),
        requests: int | None = typer.Option(
            None, "--requests", help="requests per simulation (default: the scenario's)"
        ),
        steps: int = typer.Option(8, "--steps", help="most simulations per candidate in the goodput search"),
        set_: list[str] = typer.Option([], "--set", help="path.to.field=value applied to the base (repeatable)"),
        out: str | None = typer.Option(
            None, "--out", help="write plan.csv (every candidate) and cache points here, so a rerun is instant"
        ),
        show: int = typer.Option(12, "--show", help="runners-up to print"),
        jobs: int | None = typer.Option(None, "--jobs", help=JOBS_HELP),
        ray: bool = typer.Option(False, "--ray", help="run simulations as Ray tasks on a local Ray started here"),
        ray_address: str | None = typer.Option(None, "--ray-address", help=RAY_ADDRESS_HELP),
        ray_timeout: float = typer.Option(30.0, "--ray-timeout", help=RAY_TIMEOUT_HELP),
        as_json: bool = typer.Option(False, "--json", help=JSON_HELP + ": the answer and every candidate"),
        quiet: bool = typer.Option(False, "--quiet", "-q", help=QUIET_HELP),
    ) -> None:
        """The cheapest prefill/decode configuration and method meeting the SLOs at RATE, and every candidate's
        goodput. Exit 1 when no candidate meets them."""
        from reports.terminal import Say
        from scenarios import resolve as resolve_example
        from simulator.files import check_out_dir, parse_override, write_atomically

        from .executor import Executor, PlanningError, stop_on_signals
        from .plan import format_plan, load_candidates, plan_json, run_plan
        from .sweep import parse_slo

        errors_as_json(as_json)
        scenario = resolve_example(scenario)
        candidates = None if candidates is None else resolve_example(candidates)
        out_dir = None if out is None else Path(out)
        ex = None
        with stop_on_signals():
            try:
                backend = _backend(jobs, ray, ray_address, ray_timeout)
                if out is not None:
                    check_out_dir(out, PlanningError)
                targets = parse_slo(slo)
                spec = load_candidates(candidates)
                overrides = dict(parse_override(item, PlanningError) for item in set_)
                ex = Executor(
                    cache_dir=None if out_dir is None else out_dir / ".cache",
                    label="plan",
                    progress=not quiet,
                    **backend,
                )
                with ex:
                    result = run_plan(
                        scenario, rate, targets, spec, ex, requests=requests, steps=steps, overrides=overrides
                    )
                if out_dir is not None:
                    out_dir.mkdir(parents=True, exist_ok=True)
                    write_atomically(out_dir / "plan.csv", lambda p: result.table.to_csv(p, index=False))
            except PlanningError as e:
                _fail(str(e))
            except KeyboardInterrupt as e:
                _interrupted(e, ex, None if out_dir is None else out_dir / ".cache")
            except OSError as e:
                if out_dir is None:
                    raise
                _write_failed(out_dir, e, out_dir / ".cache")
        say = Say(as_json, quiet)
        say.result(format_plan(result, show=show), plan_json(result))
        if out_dir is not None:
            say(f"wrote {out_dir / 'plan.csv'}")
        if result.answer is None:
            raise typer.Exit(1)


def main() -> None:  # pragma: no cover - a stand-in until cli.py registers the commands
    app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False)
    register_commands(app)
    app()


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
