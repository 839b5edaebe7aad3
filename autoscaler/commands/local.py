"""``migscale up | down | status``: the local backend on one machine, no Kubernetes.

``up`` starts the front door (nginx), Prometheus (or the direct-scrape
fallback), ``min_replicas`` of each MIG model, and supervises until Ctrl-C or
SIGTERM; then it stops everything it started, in order. ``run_controller``
is that main body, one function, so the control loop and the metrics API can
be wired into it (a ``LocalController``). ``down`` stops a running controller (and any
orphan it left) by recorded PID; ``status`` reads the ``status.json`` the
running controller rewrites every second.
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from pathlib import Path

import typer

from autoscaler.act.local.pids import ProcRecord, load_records, stop_recorded, write_json_atomic
from autoscaler.commands._common import fail, load_or_exit
from autoscaler.runtime.live_models import LiveModels
from autoscaler.runtime.local import LocalController, run_controller
from autoscaler.runtime.local_setup import SetupError, cluster_from_config
from autoscaler.status import render_table

EXIT_NOT_RUNNING = 1


def _say(msg: str) -> None:
    typer.echo(msg)


# ---------------------------------------------------------------- run dir bookkeeping


def _controller(run_dir: Path) -> tuple[ProcRecord | None, dict]:
    """The recorded controller and whether it still runs."""
    try:
        data = json.loads((run_dir / "controller.json").read_text())
        rec = ProcRecord(**data["process"])
        return rec, data
    except (OSError, ValueError, KeyError, TypeError):
        return None, {}


def _live_controller(run_dir: Path) -> ProcRecord | None:
    rec, _ = _controller(run_dir)
    return rec if rec is not None and rec.matches() else None


def _clean_stale(run_dir: Path) -> list[int]:
    """Stop orphans of a controller that died without cleaning up; forget its records."""
    stopped = stop_recorded(load_records(run_dir))
    for f in ("controller.json", "status.json", "pids.json"):
        (run_dir / f).unlink(missing_ok=True)
    return stopped


# ---------------------------------------------------------------- commands


def register(app: typer.Typer) -> None:
    @app.command("up")
    def up(
        models: Path = typer.Argument(..., help="models.yaml"),
        cluster: Path = typer.Argument(..., help="cluster.yaml"),
        run_dir: Path | None = typer.Option(None, "--run-dir", help="state dir (default: local.run_dir)"),
        control: bool = typer.Option(
            True, "--control/--no-control",
            help="run the control loop and metrics API (--no-control: only supervise min_replicas)",
        ),
    ) -> None:
        """Run the local stack (nginx front door, Prometheus, Triton replicas, control loop, metrics API) until Ctrl-C.

        Example: migscale up examples/models.yaml examples/cluster.yaml --run-dir .migscale
        """
        models_cfg, cluster_cfg = load_or_exit(models, cluster)
        rd = (run_dir or Path(cluster_cfg.local.run_dir)).resolve()
        rd.mkdir(parents=True, exist_ok=True)
        live = _live_controller(rd)
        if live is not None and live.pid != os.getpid():
            msg = (
                f"--run-dir {rd}: a controller is already running there (pid {live.pid}); "
                f"run `migscale down --run-dir {rd}` first"
            )
            fail([msg])
        stale = _clean_stale(rd)
        if stale:
            _say(f"cleaned up {len(stale)} orphan process(es) of a previous controller: {stale}")
        try:
            lc = cluster_from_config(models_cfg, cluster_cfg, rd)
        except SetupError as e:
            fail([f"{cluster}: {e}"])
        me = ProcRecord.of(os.getpid(), "controller")
        write_json_atomic(
            rd / "controller.json",
            {
                "process": me.__dict__,
                "frontdoor": lc.frontdoor_url,
                "metrics_api": lc.metrics_api_url,
                "prometheus": lc.prometheus_url,
                "run_dir": str(rd),
                "cluster_config": str(cluster.resolve()),  # what `migscale apply` validates against
            },
        )
        stop = threading.Event()

        def _stop(signum, frame):
            stop.set()

        old = {s: signal.signal(s, _stop) for s in (signal.SIGINT, signal.SIGTERM)}
        # The control loop (observe -> decide -> act) and the metrics API / web view.
        ctl = LocalController(lc, models_cfg, cluster_cfg)
        live = LiveModels(ctl, lc, say=_say) if control else None  # `migscale apply` without a restart
        try:
            if control:
                api = ctl.start_api()
                _say(f"web view:    {api.url}/ui")
            run_controller(lc, models_cfg, cluster_cfg, stop, ctl if control else None, say=_say, live=live)
        except Exception as e:
            _say(f"error: {type(e).__name__}: {e}")
            raise typer.Exit(1)
        finally:
            ctl.stop()
            for s, h in old.items():
                signal.signal(s, h)
            (rd / "controller.json").unlink(missing_ok=True)
        _say("stopped")

    @app.command("down")
    def down(
        run_dir: Path = typer.Option(Path(".migscale"), "--run-dir", help="state dir of the controller"),
        timeout_s: float = typer.Option(60.0, "--timeout-s", help="wait this long for a clean stop"),
    ) -> None:
        """Stop the controller running in RUN_DIR and every process it started.

        Example: migscale down --run-dir .migscale
        """
        rd = run_dir.resolve()
        live = _live_controller(rd)
        if live is not None:
            os.kill(live.pid, signal.SIGTERM)
            deadline = time.monotonic() + timeout_s
            while time.monotonic() < deadline and live.matches():
                time.sleep(0.1)
            if live.matches():
                _say(f"controller {live.pid} did not stop within {timeout_s:.0f}s; killing its children")
        leftovers = _clean_stale(rd)
        if live is None and not leftovers:
            _say(f"no controller running in {rd}")
            return
        msg = f"stopped controller {live.pid}" if live else "no controller was running"
        _say(msg + (f"; stopped orphans {leftovers}" if leftovers else ""))

    @app.command("status")
    def status(
        run_dir: Path = typer.Option(Path(".migscale"), "--run-dir", help="state dir of the controller"),
        as_json: bool = typer.Option(False, "--json", help="print the status document as JSON"),
    ) -> None:
        """Show the replicas of the running controller: model, profile, GPU/slot, port, state, req/s, p99.

        Example: migscale status --json --run-dir .migscale
        """
        rd = run_dir.resolve()
        if _live_controller(rd) is None:
            typer.echo(
                f"no controller running in {rd} (start one with `migscale up MODELS CLUSTER`)", err=True
            )
            raise typer.Exit(EXIT_NOT_RUNNING)
        try:
            doc = json.loads((rd / "status.json").read_text())
        except (OSError, ValueError):
            typer.echo(f"the controller in {rd} has not written status.json yet; try again", err=True)
            raise typer.Exit(EXIT_NOT_RUNNING)
        typer.echo(json.dumps(doc, indent=2) if as_json else render_table(doc))
