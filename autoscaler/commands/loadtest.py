"""``migscale loadtest``: run the locust suite against the local cluster or any Triton endpoint.

Outside the loop: it generates the demand and grades the result. The command
is a thin, documented wrapper: it builds one ``locust ... --headless`` line,
prints it (so it can be re-run by hand or in CI without migscale), runs it, and
exits with locust's exit code: 0 every SLO held, 1 one was missed or nothing
was judged (``loadtests/slo.py``), 2 bad input (checked here first, by
``loadtests/checks.py``, before the results folder is touched), 124 locust did
not exit in time, 130/143 interrupted by SIGINT/SIGTERM (locust is stopped in
order and writes the verdict of the part that ran, marked interrupted).
"""

from __future__ import annotations

import contextlib
import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Annotated

import typer

from autoscaler.act.local.procs import tied_command
from autoscaler.commands._common import fail, load_models_or_exit
from autoscaler.config.duration import parse_duration
from autoscaler.runtime.loadtest import build_command, frontdoor_from_run_dir, host_problem


def loadtest(
    models_yaml: Annotated[Path, typer.Argument(metavar="MODELS", help="models.yaml: the models to load and their SLOs")],
    shape: Annotated[str, typer.Option(help="constant | step | ramp | spike | diurnal | trace")] = "constant",
    duration: Annotated[str, typer.Option(help="run time: 120s, 2m, 1m30s")] = "60s",
    host: Annotated[str | None, typer.Option(help="Triton endpoint (default: the local cluster's front door)")] = None,
    results: Annotated[Path, typer.Option(help="folder for CSV, HTML and slo.json")] = Path("loadtest-results"),
    protocol: Annotated[str, typer.Option(help="http | grpc")] = "http",
    models: Annotated[str, typer.Option(help="weights, e.g. resnet:3,bert:1 (default: every model, equally)")] = "",
    base_rps: Annotated[float, typer.Option(help="base / trough request rate, req/s")] = 10.0,
    peak_rps: Annotated[float | None, typer.Option(help="peak rate, req/s (default 4x base)")] = None,
    shape_args: Annotated[str, typer.Option(help="e.g. spike_at_s=30,spike_s=20 or path=trace.csv")] = "",
    users_max: Annotated[int, typer.Option(help="upper bound on concurrent locust users")] = 500,
    user_rps: Annotated[float, typer.Option(help="requests/s per user before another user is added")] = 10.0,
    slo: Annotated[str, typer.Option(help="override SLO targets: resnet:p99_ms=50;bert:p99_ms=80")] = "",
    slo_models: Annotated[str, typer.Option(help="judge only these models (comma list)")] = "",
    warmup: Annotated[str, typer.Option(help="ignore requests sent in the first WARMUP of the run")] = "0s",
    slo_ignore: Annotated[str, typer.Option(help="also ignore windows START-END,... seconds since start")] = "",
    run_dir: Annotated[Path, typer.Option(help="local cluster run dir (for the default host)")] = Path(".migscale"),
    force: Annotated[
        bool, typer.Option("--force", help="also replace a report.html, slo.json or locust CSV that loadtest did not write")
    ] = False,
) -> None:
    """Drive Triton with a load shape and judge each model against its SLO.

    Example:

        migscale loadtest examples/models.yaml --shape spike --duration 120s \\
            --base-rps 20 --peak-rps 80 --results results/spike

    Prints and runs the equivalent `locust -f loadtests/locustfile.py
    --headless ...` line, writes results/locust_stats.csv, results/report.html
    and results/slo.json, and exits 0 when every SLO held, 1 when one was
    missed, 2 on bad input, 124 when locust did not exit in time, and 130 or
    143 when interrupted (the verdict of the part that ran is marked so).
    """
    problems = []
    try:
        duration_s = parse_duration(duration, "--duration", max_s=MAX_DURATION_S)
    except ValueError as e:
        problems.append(str(e))
        duration_s = 0.0
    warmup_s = 0.0
    try:
        warmup_s = parse_duration(warmup, "--warmup", allow_zero=True)
    except ValueError as e:
        problems.append(str(e))
    if protocol not in ("http", "grpc"):
        problems.append(f"--protocol: must be http or grpc, got {protocol!r}")
    known: set[str] | None = None
    if not models_yaml.is_file():
        problems.append(f"MODELS: no such file, got {str(models_yaml)!r}")
    else:
        # exits 2 with one line per problem in models.yaml
        known = {m.name for m in load_models_or_exit(models_yaml).models}
    trace_models: set[str] | None = None
    if duration_s > 0:
        from loadtests.shapes import ShapeError, TraceReplay, parse_shape_args, shape_from_spec

        try:  # the same check locust does, before spending a locust start-up on it
            built = shape_from_spec(shape, duration_s, base_rps, peak_rps, **parse_shape_args(shape_args))
            if isinstance(built, TraceReplay):
                trace_models = set(built.points)
        except ShapeError as e:
            msg = str(e)
            for field, opt in (("shape-args", "--shape-args"), ("shape:", "--shape:"), ("base_rps", "--base-rps"),
                               ("peak_rps", "--peak-rps"), ("trace", "--shape-args path")):
                if msg.startswith(field):
                    msg = opt + msg[len(field):]
                    break
            problems.append(msg)
    if users_max < 1:
        problems.append(f"--users-max: must be >= 1, got {users_max}")
    from loadtests.checks import option_problems

    problems += option_problems(known, models=models, slo=slo, slo_models=slo_models, slo_ignore=slo_ignore,
                                user_rps=user_rps, warmup_s=warmup_s, duration_s=duration_s or None,
                                trace_models=trace_models)
    problems += _results_problems(results, force)
    if host is None:
        host = frontdoor_from_run_dir(run_dir)
        if host is None:
            problems.append(f"--host: not given and no running local cluster in {run_dir}/controller.json "
                            "(start one with `migscale up`, or pass --host http://HOST:PORT)")
        elif protocol == "grpc":
            problems.append("--host: the local front door speaks HTTP; pass --host HOST:GRPCPORT for gRPC")
    if host is not None and not problems and (why := host_problem(host)) is not None:
        problems.append(f"--host: {why}, got {host!r}")
    if problems:
        fail(problems)
    try:
        results.mkdir(parents=True, exist_ok=True)
        (results / RESULTS_MARK).write_text("written by migscale loadtest: its files here may be replaced\n")
        # a verdict left from an earlier run must never stand for this one, which may end without one
        (results / "slo.json").unlink(missing_ok=True)
    except OSError as e:
        fail([f"--results: {e.strerror or e}, got {str(results)!r}"])
    cmd = build_command(
        models_yaml=str(models_yaml), host=host, results=results, duration_s=duration_s, shape=shape,
        shape_args=shape_args, base_rps=base_rps, peak_rps=peak_rps, protocol=protocol, models=models,
        users_max=users_max, user_rps=user_rps, slo=slo, slo_models=slo_models, warmup_s=warmup_s,
        slo_ignore=slo_ignore,
    )
    typer.echo("+ " + shlex.join(cmd), err=True)
    raise typer.Exit(_run_locust(cmd, duration_s))


MAX_DURATION_S = 30 * 86400.0
EXIT_TIMEOUT = 124  # locust did not exit in time (as timeout(1)): no verdict, distinct from 1 (an SLO missed)
STOP_GRACE_S = 15.0  # an interrupted locust's own stop: its users end, then the verdict of what ran is written


RESULTS_MARK = ".migscale-loadtest"
RESULTS_FILES = ("report.html", "slo.json", "locust_stats.csv", "locust_stats_history.csv", "locust_failures.csv",
                 "locust_exceptions.csv")


def _results_problems(results: Path, force: bool) -> list[str]:
    if results.exists() and not results.is_dir():
        return [f"--results: not a folder, got {str(results)!r}"]
    theirs = [f for f in RESULTS_FILES if (results / f).exists()] if results.is_dir() else []
    if theirs and not force and not (results / RESULTS_MARK).exists():
        why = f"holds {', '.join(theirs)}, which migscale loadtest did not write; give another folder or --force"
        return [f"--results: {why}, got {str(results)!r}"]
    parent = next((p for p in (results, *results.parents) if p.exists()), Path("."))
    if not os.access(parent, os.W_OK | os.X_OK):
        return [f"--results: cannot write in {str(parent)!r}, got {str(results)!r}"]
    return []


def _run_locust(cmd: list[str], duration_s: float) -> int:
    """locust's exit code. Ctrl-C or SIGTERM here is passed on as SIGINT, locust's own stop, and it
    gets ``STOP_GRACE_S`` to write the verdict of what ran (marked interrupted); then it is killed.
    Tied to this process: a ``migscale loadtest`` killed outright takes its locust with it."""
    try:
        # its own process group: a terminal's Ctrl-C reaches this process only, which passes on
        # exactly one SIGINT (a second one would cut locust's own stop short)
        proc = subprocess.Popen(tied_command(cmd), process_group=0)
    except FileNotFoundError:
        fail([f"locust: not found next to {sys.executable} or on PATH (pip install locust)"])
    stopping: list[int] = []

    def stop(signum: int, _frame: object) -> None:
        stopping.append(signum)
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(signal.SIGINT)

    old = {sig: signal.signal(sig, stop) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        # locust's own hard stop is --run-time; the extra minute covers start-up and --stop-timeout
        deadline = time.monotonic() + duration_s + 60
        while proc.poll() is None:
            now = time.monotonic()
            if stopping and deadline > now + STOP_GRACE_S:
                deadline = now + STOP_GRACE_S  # its own stop, and no longer
            if now >= deadline:
                typer.echo("migscale loadtest: locust " + ("did not stop" if stopping else
                           f"did not exit within {duration_s + 60:.0f}s") + "; killed, no verdict", err=True)
                proc.kill()
                proc.wait()
                return 128 + stopping[0] if stopping else EXIT_TIMEOUT
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=min(deadline - now, 0.2))
    finally:
        for sig, handler in old.items():
            signal.signal(sig, handler)
    # interrupted: the signal's code whatever the verdict of the part that ran (slo.json says which part)
    return 128 + stopping[0] if stopping else proc.returncode


def register(app: typer.Typer) -> None:
    app.command("loadtest")(loadtest)
