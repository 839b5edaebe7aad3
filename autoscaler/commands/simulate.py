"""CLI: ``migscale simulate MODELS CLUSTER TRACE --policy NAME`` -- replay a trace against a policy.

Runs the production control loop (or a baseline) against the simulated
cluster on a virtual clock and prints the score: SLO attainment, GPU-hours,
reconfigurations, recovery time. Bad input exits 2, never a traceback.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Annotated

import typer

from autoscaler.commands._common import fail, load_cluster_or_exit, load_models_or_exit
from autoscaler.config import ConfigError

MAX_STEP_S = 60.0
MAX_STEPS = 1_000_000  # a month's trace at 2.7 s; the default 5 s step takes a month in 536,000


def plot_problem(plot: str) -> str | None:
    """Why ``--plot`` names no PNG file that can be written, or None; checked before simulating."""
    p = Path(plot)
    if p.is_dir():
        return f"--plot: is a directory, expected a .png file path, got {plot!r}"
    if p.suffix.lower() != ".png":  # matplotlib would add .png, or write another format
        return f"--plot: must name a .png file, got {plot!r}"
    if not p.parent.is_dir():  # rather than create folders a mistyped path names
        return f"--plot: no such directory {str(p.parent)!r}, got {plot!r}"
    if p.exists() and not p.is_file():
        return f"--plot: exists and is not a regular file, got {plot!r}"
    return None


def simulate(
    models: Annotated[str, typer.Argument(metavar="MODELS", help="models.yaml (with capacity tables)")],
    cluster: Annotated[str, typer.Argument(metavar="CLUSTER", help="cluster.yaml (GPUs, initial layouts, policy)")],
    trace: Annotated[str, typer.Argument(metavar="TRACE", help="trace CSV t_s,model,rps (see `migscale trace generate`)")],
    policy: Annotated[str, typer.Option(
        "--policy", help="migscale | hpa-queue | hpa-util | static-peak | oracle | all; windowed-max (analysis)")]
    = "migscale",
    as_json: Annotated[bool, typer.Option("--json", help="print one JSON object")] = False,
    plot: Annotated[str | None, typer.Option(
        "--plot", help="write a PNG (a .png path in an existing folder): demand vs capacity, GPUs, p99/SLO")] = None,
    step_s: Annotated[float, typer.Option("--step-s", help="fluid integration step, seconds (at most 60)")] = 5.0,
    start_delay_s: Annotated[float, typer.Option("--start-delay-s", help="replica start time (30 k8s, 2 local)")]
    = 30.0,
    repartition_delay_s: Annotated[float, typer.Option("--repartition-delay-s")] = 180.0,
    scrape_delay_s: Annotated[float, typer.Option("--scrape-delay-s")] = 15.0,
    warmup_s: Annotated[float, typer.Option("--warmup-s", help="unscored warm-up at the first rate")] = 1800.0,
    backend: Annotated[str, typer.Option(
        "--backend", help="sim: every path the simulator has; kubernetes: as that backend runs it "
        "(mig-manager drains the node for a cut, so no warm spares); kubernetes-no-fast: that, and "
        "without the pods' 1 s direct scrape the burst layer reads (--no-fast-scrape)")] = "sim",
) -> None:
    """Simulate TRACE on CLUSTER with POLICY and print SLO attainment and GPU-hours."""
    from autoscaler.sim import report
    from autoscaler.sim.cluster import SimConfig
    from autoscaler.sim.run import ANALYSIS_POLICIES, BACKENDS, POLICIES, SimError, backend_world
    from autoscaler.sim.run import simulate as run
    from autoscaler.sim.traces import Trace, TraceError, read_csv

    names = list(POLICIES) if policy == "all" else [policy]
    if any(n not in POLICIES + ANALYSIS_POLICIES for n in names):
        fail([f"--policy: must be one of {', '.join(POLICIES + ANALYSIS_POLICIES)} or all, got {policy!r}"])
    if backend not in BACKENDS:
        fail([f"--backend: must be one of {', '.join(BACKENDS)}, got {backend!r}"])
    if plot is not None and (bad := plot_problem(plot)):
        fail([bad])
    models_cfg = load_models_or_exit(models)
    cluster_cfg = load_cluster_or_exit(cluster)
    try:
        tr = read_csv(trace)
    except TraceError as exc:
        fail(exc.problems)
    # A step longer than a minute skips replica starts and decisions (nonsense figures); one so
    # short that the run takes millions of steps would run for hours: both are typing errors.
    bounds = []
    if not (math.isfinite(step_s) and 0 < step_s <= MAX_STEP_S):
        bounds.append(f"--step-s: must be > 0 and at most {MAX_STEP_S:g} s, got {step_s!r}")
    elif (warmup_s + tr.duration_s) / step_s > MAX_STEPS:
        bounds.append(f"--step-s: {warmup_s + tr.duration_s:g} s of warm-up and trace in steps of {step_s:g} s "
                      f"is over {MAX_STEPS} steps; a step of at least {(warmup_s + tr.duration_s) / MAX_STEPS:.3g} s, "
                      f"got {step_s!r}")
    if not (math.isfinite(warmup_s) and warmup_s >= 0):
        bounds.append(f"--warmup-s: must be >= 0, got {warmup_s!r}")
    if bounds:
        fail(bounds)
    # one models.yaml serves the cluster and the simulator: a trace recorded on it may hold
    # multinode models, whose groups the simulator does not model; leave them out, and say so
    unmodelled = [m.name for m in models_cfg.models if m.backend != "mig" and m.name in tr.models]
    if unmodelled:
        keep = [i for i, m in enumerate(tr.models) if m not in unmodelled]
        if not keep:
            fail([(f"{trace}: every model in it ({', '.join(unmodelled)}) runs on the multinode backend, "
                   "which the simulator does not model (MIG replicas only)")])
        tr = Trace(tr.t_s, tuple(tr.models[i] for i in keep), tr.rps[keep], tr.duration_s)
        typer.echo(f"note: not simulated: {', '.join(unmodelled)} (multinode backend; the simulator models "
                   "MIG replicas only); their rows of the trace are left out", err=True)
    try:
        sim, world = backend_world(backend, SimConfig(step_s=step_s, start_delay_s=start_delay_s,
                                                      repartition_delay_s=repartition_delay_s,
                                                      scrape_delay_s=scrape_delay_s))
        # the world's policy settings are migscale's; a baseline reads neither path
        results = [run(models_cfg, cluster_cfg, tr, n, step_s, sim=sim, warmup_s=warmup_s,
                       policy_overrides=world if n == "migscale" else None) for n in names]
    except ConfigError as exc:
        fail(exc.problems)
    except (SimError, ValueError) as exc:
        fail([str(exc)])
    if plot:
        try:
            report.plot(results, plot, title=f"{trace}")
        except OSError as exc:
            fail([f"--plot: cannot write {plot}: {exc.strerror or exc}"])
    if as_json:
        skipped = {"not_simulated": unmodelled} if unmodelled else {}
        if len(results) == 1:
            typer.echo(json.dumps({**results[0].to_json(), **skipped}))
        else:
            typer.echo(json.dumps({"policies": {r.policy: r.to_json() for r in results}, **skipped}))
        return
    typer.echo(report.table(results))
    for r in results:
        if r.errors:
            typer.echo(f"{r.policy}: {len(r.errors)} actuator errors, first: {r.errors[0]}", err=True)


def register(app: typer.Typer) -> None:
    app.command(
        "simulate",
        epilog="Example:\n\n  migscale simulate examples/models.yaml examples/cluster.yaml trace.csv \\\n"
        "      --policy migscale --json --plot sim.png",
    )(simulate)
