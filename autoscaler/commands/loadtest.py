"""``migscale loadtest``: run the locust suite against the local cluster or any Triton endpoint.

Outside the loop: it generates the demand and grades the result. The command
is a thin, documented wrapper: it builds one ``locust ... --headless`` line,
prints it (so it can be re-run by hand or in CI without migscale), runs it, and
exits with locust's exit code (1 = an SLO missed, see ``loadtests/slo.py``).
"""

from __future__ import annotations

import shlex
import subprocess
import sys
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
) -> None:
    """Drive Triton with a load shape and judge each model against its SLO.

    Example:

        migscale loadtest examples/models.yaml --shape spike --duration 120s \\
            --base-rps 20 --peak-rps 80 --results results/spike

    Prints and runs the equivalent `locust -f loadtests/locustfile.py
    --headless ...` line, writes results/locust_stats.csv, results/report.html
    and results/slo.json, and exits 0 when every SLO held, 1 when one was
    missed, 2 on bad input.
    """
    problems = []
    try:
        duration_s = parse_duration(duration, "--duration")
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
    if not models_yaml.is_file():
        problems.append(f"MODELS: no such file, got {str(models_yaml)!r}")
    else:
        load_models_or_exit(models_yaml)  # exits 2 with one line per problem in models.yaml
    if duration_s > 0:
        from loadtests.shapes import ShapeError, parse_shape_args, shape_from_spec

        try:  # the same check locust does, before spending a locust start-up on it
            shape_from_spec(shape, duration_s, base_rps, peak_rps, **parse_shape_args(shape_args))
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
    results.mkdir(parents=True, exist_ok=True)
    cmd = build_command(
        models_yaml=str(models_yaml), host=host, results=results, duration_s=duration_s, shape=shape,
        shape_args=shape_args, base_rps=base_rps, peak_rps=peak_rps, protocol=protocol, models=models,
        users_max=users_max, user_rps=user_rps, slo=slo, slo_models=slo_models, warmup_s=warmup_s,
        slo_ignore=slo_ignore,
    )
    typer.echo("+ " + shlex.join(cmd), err=True)
    try:
        # locust's own hard stop is --run-time; the extra minute covers start-up and --stop-timeout
        # tied to this process: a killed `migscale loadtest` takes its locust with it
        rc = subprocess.call(tied_command(cmd), timeout=duration_s + 60)
    except subprocess.TimeoutExpired:
        typer.echo(f"migscale loadtest: locust did not exit within {duration_s + 60:.0f}s", err=True)
        rc = 1
    except KeyboardInterrupt:
        rc = 130
    except FileNotFoundError:
        fail([f"locust: not found next to {sys.executable} or on PATH (pip install locust)"])
    raise typer.Exit(rc)


def register(app: typer.Typer) -> None:
    app.command("loadtest")(loadtest)
