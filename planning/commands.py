"""`sweep` and `plan` on the hacksim CLI: thin wrappers over planning.sweep / planning.plan.

    python cli.py sweep scenarios/sweeps/a10g_bandwidth_methods.yaml --out out/sweeps/bw
    python cli.py plan scenarios/a10g_10gbps.yaml --rate 0.2 --slo ttft_p99_s=60,tpot_p99_s=0.5,jct_p90_s=60

cli.py calls `register_commands(app)`. Bad input exits 2 with one `error:` line on stderr and
writes nothing; `--ray` without Ray installed is bad input too. Ctrl-C keeps every finished
point in the cache, so the same command resumes.
"""

from __future__ import annotations

import shlex
import signal
import sys
from pathlib import Path
from typing import NoReturn

import typer

from reports.terminal import JSON_HELP, PLOTLYJS_HELP, QUIET_HELP

EXIT_BAD_INPUT = 2


def _fail(message: str) -> NoReturn:
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(EXIT_BAD_INPUT)


def _backend(jobs: int | None, ray: bool, ray_address: str | None, ray_timeout_s: float) -> dict:
    if ray and ray_address:
        _fail("give --ray (start a local Ray) or --ray-address ADDR (join a cluster), not both")
    backend = "ray" if (ray or ray_address) else "pool"
    return {"backend": backend, "jobs": jobs, "ray_address": ray_address, "connect_timeout_s": ray_timeout_s}


RAY_ADDRESS_HELP = (
    "run on the Ray cluster at ADDR: HOST:PORT of the head (`ray start --head --port=PORT`), "
    "ray://HOST:10001 (Ray Client) or auto (the cluster started on this machine)"
)
RAY_TIMEOUT_HELP = "seconds to wait for the cluster at --ray-address before giving up"


def _interrupted(e: KeyboardInterrupt, ex, cache: Path | None) -> NoReturn:
    """Say what was kept and how to resume, then exit 128 + the signal (130 for Ctrl-C, 143 for SIGTERM)."""
    from .executor import Interrupted

    signum = e.signum if isinstance(e, Interrupted) else signal.SIGINT
    done = 0 if ex is None else ex.stats.simulated
    if cache is not None:
        msg = (
            f"interrupted by {signal.Signals(signum).name}: the {done} point(s) finished in this run are cached "
            f"in {cache}; run the same command to resume: {_command_line()}"
        )
    else:
        msg = f"interrupted by {signal.Signals(signum).name}; give --out DIR to keep finished points for a rerun"
    typer.echo(msg, err=True)
    raise typer.Exit(128 + int(signum))


def _command_line() -> str:
    argv = list(sys.argv)
    if argv and argv[0].endswith(".py"):
        argv.insert(0, "python")
    return shlex.join(argv)


def register_commands(app: typer.Typer) -> None:
    """Add `sweep` and `plan` to the hacksim typer app."""

    @app.command()
    def sweep(
        sweep_file: Path = typer.Argument(..., help="sweep YAML: a base scenario plus axes (see scenarios/sweeps/)"),
        out: Path | None = typer.Option(
            None,
            "--out",
            help="write results.csv, results.parquet, report.html and "
            "the point cache (.cache/) here; default out/sweeps/<sweep name>",
        ),
        jobs: int | None = typer.Option(None, "--jobs", help="worker processes (default: one per core)"),
        ray: bool = typer.Option(False, "--ray", help="run points as Ray tasks on a local Ray started here"),
        ray_address: str | None = typer.Option(None, "--ray-address", help=RAY_ADDRESS_HELP),
        ray_timeout: float = typer.Option(30.0, "--ray-timeout", help=RAY_TIMEOUT_HELP),
        report: bool = typer.Option(True, "--report/--no-report", help="also write report.html"),
        plotlyjs: str | None = typer.Option(None, "--plotlyjs", help=PLOTLYJS_HELP),
    ) -> None:
        """Simulate every point of SWEEP_FILE and write one tidy table (CSV and Parquet) plus a report."""
        from scenarios import resolve as resolve_example
        from simulator.files import check_out_dir, strict_json

        from .executor import Executor, PlanningError, stop_on_signals
        from .report import write_report
        from .sweep import load_sweep, run_sweep, write_table

        sweep_file = resolve_example(sweep_file)
        ex, out_dir = None, None
        with stop_on_signals():
            try:
                spec, base = load_sweep(sweep_file)
                assert spec.name is not None  # load_sweep names a sweep after its file
                out_dir = out if out is not None else Path("out") / "sweeps" / spec.name
                check_out_dir(out_dir, PlanningError)
                ex = Executor(
                    cache_dir=out_dir / ".cache",
                    label=f"sweep {spec.name}",
                    **_backend(jobs, ray, ray_address, ray_timeout),
                )
                with ex:
                    result = run_sweep(spec, base, ex, source=str(sweep_file))
            except PlanningError as e:
                _fail(str(e))
            except KeyboardInterrupt as e:
                _interrupted(e, ex, None if out_dir is None else out_dir / ".cache")
        df, st = result.table, result.stats
        written, note = write_table(df, out_dir)
        if note:
            typer.echo(note, err=True)
        errors = int((df["error"] != "").sum())
        stats_line = (
            f"{st.simulated} points simulated, {st.cached} from the cache, {st.wall_s:.1f} s on "
            f"{st.workers} {st.backend} worker(s)"
        )
        if report:
            written.append(
                write_report(
                    df,
                    out_dir,
                    name=spec.name,
                    description=spec.description,
                    base=str(base),
                    axis_paths=spec.axis_paths(),
                    slo=spec.slo,
                    heatmaps=spec.report.heatmaps,
                    stats_line=stats_line,
                    plotlyjs=plotlyjs,
                )
            )
        (out_dir / "sweep.json").write_text(
            strict_json(
                {
                    "sweep": str(sweep_file),
                    "base": str(base),
                    "spec": spec.model_dump(),
                    "points": result.points,
                    "rows": len(df),
                    "errors": errors,
                }
            )
            + "\n"
        )
        typer.echo(
            f"sweep {spec.name}: {result.points} points x methods = {len(df)} rows ({errors} with errors); {stats_line}"
        )
        if errors:
            first = df.loc[df["error"] != ""].iloc[0]
            typer.echo(f"  first error (point {first['point']}): {first['error']}")
        typer.echo("wrote " + ", ".join(str(p) for p in written))

    @app.command()
    def plan(
        scenario: Path = typer.Argument(..., help="base scenario YAML (model, workload, network, batching)"),
        rate: float = typer.Option(..., "--rate", help="target arrival rate, requests/s"),
        slo: str = typer.Option(
            ..., "--slo", help="targets in seconds, e.g. ttft_p99_s=60,tpot_p99_s=0.5,jct_p90_s=60"
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
        out: Path | None = typer.Option(
            None, "--out", help="write plan.csv (every candidate) and cache points here, so a rerun is instant"
        ),
        show: int = typer.Option(12, "--show", help="runners-up to print"),
        jobs: int | None = typer.Option(None, "--jobs", help="worker processes (default: one per core)"),
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
        from simulator.files import check_out_dir, parse_yaml

        from .executor import Executor, PlanningError, stop_on_signals
        from .plan import format_plan, load_candidates, plan_json, run_plan
        from .sweep import parse_slo

        scenario = resolve_example(scenario)
        candidates = None if candidates is None else resolve_example(candidates)
        ex = None
        with stop_on_signals():
            try:
                if out is not None:
                    check_out_dir(out, PlanningError)
                targets = parse_slo(slo)
                spec = load_candidates(candidates)
                overrides = {}
                for item in set_:
                    if "=" not in item:
                        raise PlanningError(f"--set {item!r}: expected path.to.field=value")
                    k, v = item.split("=", 1)
                    overrides[k.strip()] = parse_yaml(v, f"--set {item!r}", PlanningError)
                ex = Executor(
                    cache_dir=None if out is None else out / ".cache",
                    label="plan",
                    progress=not quiet,
                    **_backend(jobs, ray, ray_address, ray_timeout),
                )
                with ex:
                    result = run_plan(
                        scenario, rate, targets, spec, ex, requests=requests, steps=steps, overrides=overrides
                    )
            except PlanningError as e:
                _fail(str(e))
            except KeyboardInterrupt as e:
                _interrupted(e, ex, None if out is None else out / ".cache")
        say = Say(as_json, quiet)
        say.result(format_plan(result, show=show), plan_json(result))
        if out is not None:
            out.mkdir(parents=True, exist_ok=True)
            result.table.to_csv(out / "plan.csv", index=False)
            say(f"wrote {out / 'plan.csv'}")
        if result.answer is None:
            raise typer.Exit(1)


def main() -> None:  # pragma: no cover - a stand-in until cli.py registers the commands
    app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False)
    register_commands(app)
    app()


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
