"""``migscale apply MODELS``: change the models of a running ``migscale up`` without a restart.

Validates MODELS as ``up`` does (against the running controller's
cluster.yaml, model directories included), hands the validated document to
the controller through its run directory (``runtime/live_models.py``: an
atomic write with the next generation number) and waits until the
controller reports that generation in force. An invalid file exits 2 with
one line per problem (file, field and value) and nothing is handed over:
the running cluster keeps its config. Exit 1: no controller running, or it
did not take the change within ``--wait-s``.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Annotated

import typer

from autoscaler.commands._common import fail, load_cluster_or_exit

EXIT_NOT_APPLIED = 1


def _status(run_dir: Path) -> dict:
    try:
        return json.loads((run_dir / "status.json").read_text())
    except (OSError, ValueError):
        return {}


def register(app: typer.Typer) -> None:
    @app.command("apply")
    def apply(
        models: Annotated[Path, typer.Argument(metavar="MODELS", help="the new models.yaml")],
        run_dir: Annotated[Path, typer.Option("--run-dir", help="state dir of the running controller")] = Path(
            ".migscale"
        ),
        wait_s: Annotated[
            float, typer.Option("--wait-s", min=0.0, help="wait this long for the controller to take it (0: not)")
        ] = 30.0,
    ) -> None:
        """Validate MODELS and hand it to the running `migscale up`.

        New models start, removed ones drain, and a changed SLO counts from the next tick.

        Example: migscale apply examples/models.yaml --run-dir .migscale
        """
        from autoscaler.commands.local import _controller, _live_controller
        from autoscaler.config import ConfigError
        from autoscaler.runtime.live_models import submit

        rd = run_dir.resolve()
        if _live_controller(rd) is None:
            typer.echo(f"no controller running in {rd} (start one with `migscale up MODELS CLUSTER`)", err=True)
            raise typer.Exit(EXIT_NOT_APPLIED)
        _rec, info = _controller(rd)
        if "config" not in _status(rd) or not info.get("cluster_config"):
            typer.echo(f"the controller in {rd} takes no live changes (started with --no-control, or still "
                       "starting); try again or restart it", err=True)
            raise typer.Exit(EXIT_NOT_APPLIED)
        cluster = load_cluster_or_exit(info["cluster_config"])
        try:
            generation = submit(rd, models, cluster)
        except ConfigError as exc:
            fail([*exc.problems, f"{models}: not applied; the running cluster keeps its config"])
        typer.echo(f"handed over {models} as config generation {generation}")
        deadline = time.monotonic() + wait_s
        while wait_s > 0:
            cfg = _status(rd).get("config") or {}
            if int(cfg.get("generation") or 0) >= generation:
                typer.echo(f"in force: {cfg.get('change') or cfg['generation']}; models: {', '.join(cfg.get('models') or [])}")
                return
            if cfg.get("refused_generation") == generation:
                fail([f"{models}: refused by the controller: {cfg.get('error')}"])
            if time.monotonic() > deadline:
                typer.echo(f"the controller has not taken generation {generation} within {wait_s:g}s "
                           "(it will at its next idle second)", err=True)
                raise typer.Exit(EXIT_NOT_APPLIED)
            time.sleep(0.2)
