"""``migscale up | down | status``: the local backend on one machine, no Kubernetes.

``up`` takes the run directory's lock (one controller per run directory:
``flock``, atomic, released by the kernel however the controller dies),
stops whatever a previous controller left there, runs the preflight (exit 2
naming a missing dependency with its install command) and the port checks
(exit 2 naming the port and its holder), then starts the front door (nginx),
Prometheus (or the direct-scrape fallback), ``min_replicas`` of each model,
and supervises until Ctrl-C or SIGTERM; then it stops everything it started,
in order. ``run_controller`` (runtime/local.py) is that main body, with the
control loop and the metrics API wired in (a ``LocalController``). Its log, with the traceback of any failed tick, is
``run_dir/controller.log`` (size-capped, one rotated part).

``down`` stops the running controller and then every process started from the
run directory (``pids.sweep``: our process groups and the run-dir mark every
child carries), whatever happened before. ``status`` reads the
``status.json`` the running controller rewrites every second.
"""

from __future__ import annotations

import json
import logging
import logging.handlers
import os
import signal
import threading
import time
from pathlib import Path
from typing import Annotated

import typer

from autoscaler.act.local.pids import (
    ProcRecord,
    RunDirLock,
    is_run_dir,
    load_records,
    mark_run_dir,
    run_dir_problem,
    sweep,
    write_json_atomic,
)
from autoscaler.act.local.ports import PortInUse, check_bindable
from autoscaler.act.local.preflight import preflight
from autoscaler.act.local.triton import remove_run_dir_shm
from autoscaler.commands._common import fail, load_or_exit
from autoscaler.runtime.live_models import LiveModels
from autoscaler.runtime.local import LocalController, run_controller
from autoscaler.runtime.local_setup import SetupError, cluster_from_config
from autoscaler.status import render_table

EXIT_NOT_RUNNING = 1
# status.json is rewritten every second; one older than this comes from a controller that is hung
STATUS_STALE_S = 15.0
# controller.log: 5 MB and one rotated part (a traceback every 5 s tick is ~2 KB: hours of it).
LOG_MAX_BYTES = 5 * 1024 * 1024


def _say(msg: str) -> None:
    typer.echo(msg)


# ---------------------------------------------------------------- run dir bookkeeping


def _controller(run_dir: Path) -> tuple[ProcRecord | None, dict]:
    """The controller recorded in ``controller.json`` (None, {} without one)."""
    try:
        data = json.loads((run_dir / "controller.json").read_text())
        return ProcRecord(**data["process"]), data
    except (OSError, ValueError, KeyError, TypeError):
        return None, {}


def _live_controller(run_dir: Path) -> ProcRecord | None:
    """The recorded controller while it runs: it holds the run dir's lock (``migscale apply``)."""
    rec, _ = _controller(run_dir)
    return rec if rec is not None and RunDirLock(run_dir).held_by_other() and rec.matches() else None


def _clean_stale(run_dir: Path) -> list[int]:
    """Stop everything a controller that is gone left behind; forget its records.
    The caller holds the run dir's lock, so nothing found here is a live controller's."""
    stopped = sweep(run_dir, load_records(run_dir))
    for f in ("controller.json", "status.json", "pids.json"):
        (run_dir / f).unlink(missing_ok=True)
    remove_run_dir_shm(run_dir)  # what its killed servers left in /dev/shm (RAM)
    return stopped


def _controller_log(run_dir: Path) -> logging.Handler:
    """Everything the controller logs (``migscale.*``: supervisor, tick failures with their
    traceback) goes to ``run_dir/controller.log``, rotated at ``LOG_MAX_BYTES``."""
    h = logging.handlers.RotatingFileHandler(run_dir / "controller.log", maxBytes=LOG_MAX_BYTES, backupCount=1)
    h.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger("migscale")
    root.addHandler(h)
    root.setLevel(logging.INFO)
    return h


# ---------------------------------------------------------------- commands


def register(app: typer.Typer) -> None:
    @app.command("up")
    def up(
        models: Annotated[Path, typer.Argument(metavar="MODELS", help="models.yaml")],
        cluster: Annotated[Path, typer.Argument(metavar="CLUSTER", help="cluster.yaml")],
        run_dir: Annotated[Path | None, typer.Option("--run-dir", help="state dir (default: local.run_dir)")] = None,
        control: Annotated[bool, typer.Option(
            "--control/--no-control",
            help="run the control loop and metrics API (--no-control: only supervise min_replicas)",
        )] = True,
    ) -> None:
        """Run the local stack (nginx front door, Prometheus, Triton replicas, control loop, metrics API) until Ctrl-C.

        Example:

          migscale up examples/models.yaml examples/cluster.yaml --run-dir .migscale
        """
        models_cfg, cluster_cfg = load_or_exit(models, cluster)
        rd = (run_dir or Path(cluster_cfg.local.run_dir)).resolve()
        problem = run_dir_problem(rd)
        if problem:
            fail([problem])
        rd.mkdir(parents=True, exist_ok=True)
        mark_run_dir(rd)
        lock = RunDirLock(rd)
        if not lock.acquire():
            holder = lock.holder()
            who = f" (pid {holder})" if holder is not None else ""
            fail([(f"--run-dir {rd}: a controller is already running there{who}; "
                   f"run `migscale down --run-dir {rd}` first")])
        try:
            _up(models, cluster, models_cfg, cluster_cfg, rd, control)
        finally:
            lock.release()

    def _up(models, cluster, models_cfg, cluster_cfg, rd: Path, control: bool) -> None:
        stale = _clean_stale(rd)
        if stale:
            _say(f"cleaned up {len(stale)} orphan process(es) of a previous controller: {stale}")
        problems = preflight(models_cfg, cluster_cfg)
        if problems:
            fail([f"{models}: {p}" if p.startswith("models[") else f"{cluster}: {p}" for p in problems])
        local = cluster_cfg.local
        try:
            check_bindable(local.frontdoor_port, "local.frontdoor_port (front door)")
            if control:
                check_bindable(local.api_port, "local.api_port (metrics API)")
        except PortInUse as e:
            fail([f"{cluster}: {e}"])
        try:
            lc = cluster_from_config(models_cfg, cluster_cfg, rd)
        except SetupError as e:
            fail([f"{cluster}: {e}"])
        handler = _controller_log(rd)
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
            logging.getLogger("migscale.up").exception("the controller failed")
            _say(f"error: {type(e).__name__}: {e}")
            raise typer.Exit(1)
        finally:
            ctl.stop()
            for s, h in old.items():
                signal.signal(s, h)
            (rd / "controller.json").unlink(missing_ok=True)
            logging.getLogger("migscale").removeHandler(handler)
            handler.close()
        _say("stopped")

    @app.command("down")
    def down(
        run_dir: Annotated[Path, typer.Option("--run-dir", help="state dir of the controller")] = Path(".migscale"),
        timeout_s: Annotated[float, typer.Option("--timeout-s", help="wait this long for a clean stop",
                                                 min=0.0, max=3600.0)] = 60.0,
    ) -> None:
        """Stop the controller running in RUN_DIR and every process started from it.

        Example: migscale down --run-dir .migscale
        """
        rd = run_dir.resolve()
        if not rd.is_dir() or not is_run_dir(rd):
            # nothing of ours to read or delete there; processes still marked with it are stopped
            orphans = sweep(rd, [])
            what = "no folder" if not rd.exists() else "not a migscale run directory, nothing in it touched"
            _say(f"no controller running in {rd} ({what})" + (f"; stopped orphans {orphans}" if orphans else ""))
            return
        lock = RunDirLock(rd)
        live = lock.holder() if lock.held_by_other() else None
        if live is not None:
            os.kill(live, signal.SIGTERM)
            if not lock.wait_free(timeout_s):
                _say(f"controller {live} did not stop within {timeout_s:.0f}s; killing it")
                os.kill(live, signal.SIGKILL)
                lock.wait_free(10.0)
        # Hold the lock while sweeping: no `up` may start in the middle of it.
        if not lock.acquire():
            fail([f"--run-dir {rd}: the controller holding {lock.path} did not stop"], code=EXIT_NOT_RUNNING)
        try:
            leftovers = _clean_stale(rd)
        finally:
            lock.release()
        if live is None and not leftovers:
            _say(f"no controller running in {rd}")
            return
        msg = f"stopped controller {live}" if live else "no controller was running"
        _say(msg + (f"; stopped orphans {leftovers}" if leftovers else ""))

    @app.command("status")
    def status(
        run_dir: Annotated[Path, typer.Option("--run-dir", help="state dir of the controller")] = Path(".migscale"),
        as_json: Annotated[bool, typer.Option("--json", help="print the status document as JSON")] = False,
    ) -> None:
        """Show the replicas of the running controller: model, profile, GPU/slot, port, state, restarts, req/s, p99.

        A crash-looping replica shows `crashloop` with its restart count and last error lines.

        Example: migscale status --json --run-dir .migscale
        """
        rd = run_dir.resolve()
        if not RunDirLock(rd).held_by_other():
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
        age = time.time() - doc["t_s"] if isinstance(doc.get("t_s"), (int, float)) else None
        if age is not None and age > STATUS_STALE_S:
            # the controller rewrites it every second: this old, it is hung (stopped, stuck), and
            # what the table says is how things were then, not now
            typer.echo(f"status.json in {rd} is {age:.0f}s old: the controller (pid {doc.get('controller_pid')}) "
                       "is not updating it; the table above may no longer be true", err=True)
            raise typer.Exit(EXIT_NOT_RUNNING)

