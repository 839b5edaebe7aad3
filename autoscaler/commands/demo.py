"""``migscale demo``: run the main job end to end on this machine and write a report."""

from __future__ import annotations

import signal
from pathlib import Path
from typing import Annotated

import typer

from autoscaler.commands._common import fail, load_or_exit


def register(app: typer.Typer) -> None:
    @app.command("demo")
    def demo(
        models: Annotated[Path, typer.Argument(metavar="MODELS", help="models.yaml")],
        cluster: Annotated[Path, typer.Argument(metavar="CLUSTER", help="cluster.yaml")],
        results: Annotated[Path, typer.Option("--results", help="report folder: new, empty or an earlier report (replaced)")] = Path("demo-results"),
        live: Annotated[bool, typer.Option("--live/--no-live", help="redraw the live terminal view")] = True,
        reaction_s: Annotated[float, typer.Option("--reaction-s", min=0,
                                                  help="seconds after each load rise that are not judged")] = 25.0,
    ) -> None:
        """Start the local cluster, drive a locust spike through it, show the scaling live, write a report.

        Exit code 0 only if every model met its SLO outside the reaction windows.

        Example:

          migscale demo examples/models.yaml examples/cluster.yaml \\
              --results demo-results
        """
        from autoscaler.act.local.preflight import preflight
        from autoscaler.runtime.demo import results_problem, run_demo

        models_cfg, cluster_cfg = load_or_exit(models, cluster)
        problem = results_problem(results.resolve())
        if problem:
            fail([problem])
        problems = preflight(models_cfg, cluster_cfg)
        if problems:
            fail([f"{models}: {p}" if p.startswith("models[") else f"{cluster}: {p}" for p in problems])

        def _terminate(signum: int, _frame: object) -> None:
            # SIGTERM (a CI timeout, `kill`) unwinds like Ctrl-C: everything started is stopped
            raise SystemExit(128 + signum)

        previous = signal.signal(signal.SIGTERM, _terminate)
        try:
            rc = run_demo(models, models_cfg, cluster_cfg, results, live=live, reaction_s=reaction_s)
        finally:
            signal.signal(signal.SIGTERM, previous)
        raise typer.Exit(rc)
