"""The local controller: one process that wires the whole loop on one machine.

``migscale up`` and ``migscale demo`` both run this. It composes the pieces
each capability ships, and nothing else:

    LocalCluster (act/)  -- Inventory + Actuator: tritonserver replicas, nginx, Prometheus
    PrometheusSource / ScrapeSource (observe/) -- MetricsSource
    ControlLoop (loop.py) -- observe -> decide (policy/) -> act, every policy.tick_s
    ApiState + create_app (api/) -- custom/external metrics, /metrics, /v1/plan, /v1/status, /ui

The loop runs on the supervision thread's ``on_tick`` hook, so the 1 s status
refresh and the tick share one clock and never race on the same replica.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path

from autoscaler.act.local.cluster import LocalCluster
from autoscaler.act.local.pids import write_json_atomic
from autoscaler.act.local.prometheus import SCRAPE_INTERVAL_S, HoldWhileWarming
from autoscaler.api.app import create_app
from autoscaler.api.server import ServerHandle, serve_in_thread
from autoscaler.api.state import ApiState
from autoscaler.clock import WallClock
from autoscaler.config import ClusterConfig, ModelsConfig, model_specs, policy_config
from autoscaler.loop import ControlLoop, TickResult
from autoscaler.observe.prometheus import PrometheusSource
from autoscaler.observe.scrape import ScrapeSource
from autoscaler.policy.types import ReplicaState
from autoscaler.runtime.local_setup import initial_actions

STATUS_EVERY_S = 1.0
log = logging.getLogger("migscale.local")

# The local backend's emulated repartition takes no time (see act/local/cluster.py).
LOCAL_REPARTITION_S = 0.0


class LocalController:
    """Owns the loop and the metrics API around a started-or-not LocalCluster."""

    def __init__(
        self,
        cluster: LocalCluster,
        models_cfg: ModelsConfig,
        cluster_cfg: ClusterConfig,
        *,
        on_result: Callable[[TickResult], None] | None = None,
        window_s: float | None = None,
    ) -> None:
        self.cluster = cluster
        self.models_cfg = models_cfg
        self.cluster_cfg = cluster_cfg
        self.specs = model_specs(models_cfg, cluster_cfg)
        # Emulated MIG: a repartition rewrites a declared layout at once, so the
        # planner may cut the most efficient slices even in a burst (no fast path).
        self.policy = policy_config(models_cfg, cluster_cfg, repartition_s=LOCAL_REPARTITION_S)
        self.slo_p99_ms = {m.name: float(m.slo.p99_ms) for m in models_cfg.models}
        self.api_state = ApiState(cluster_cfg.namespace)
        self.api: ServerHandle | None = None
        self.loop: ControlLoop | None = None
        self.on_result = on_result
        # Rates over a window of ~3 ticks: long enough for two Prometheus
        # samples at a 2 s scrape, short enough to see a spike within a tick or two.
        self.window_s = window_s or max(10.0, 3 * float(cluster_cfg.policy.tick_s))
        self._tick_lock = threading.Lock()
        self._tick_s: float | None = None  # last tick's duration, for /metrics
        self.raised = 0  # ticks that raised out of the loop (the loop counts those it caught)

    # ------------------------------------------------------------ wiring
    def _source(self):
        c = self.cluster
        stale = float(self.cluster_cfg.policy.metrics_stale_s)
        if c.prometheus_url:
            # After a Prometheus restart its windows are partial: hold until it has scraped a
            # whole long window (act/local/prometheus.py says what happened without this).
            c.prom.warm_s = max(self.window_s, float(self.cluster_cfg.policy.long_window_s)) + 2 * SCRAPE_INTERVAL_S
            return HoldWhileWarming(
                PrometheusSource(c.prometheus_url, window_s=self.window_s, metrics_stale_s=stale), c.prom)

        def targets() -> dict[str, tuple[str, str]]:
            return {
                r.id: (r.model, r.process.url_metrics)
                for r in c.replicas()
                if r.state is ReplicaState.READY
            }

        return ScrapeSource(targets, window_s=self.window_s, long_window_s=2 * self.window_s,
                            metrics_stale_s=stale)

    def start_api(self) -> ServerHandle:
        app = create_app(self.api_state)
        self.api = serve_in_thread(app, "127.0.0.1", self.cluster.api_port)
        return self.api

    def build_loop(self) -> ControlLoop:
        self.loop = ControlLoop(
            self._source(),
            self.cluster,
            self.cluster,
            self.policy,
            WallClock(),
            decision_log=self.cluster.run_dir / "decisions.jsonl",
            on_tick=self._published,
        )
        return self.loop

    def _published(self, result: TickResult) -> None:
        self.publish(result)
        if self.on_result is not None:
            self.on_result(result)

    def publish(self, result: TickResult | None = None) -> None:
        """Push the latest picture to the metrics API (and so to /ui and HPA readers)."""
        obs = self.loop.last_observation if self.loop else None
        plan = result.plan if result is not None else None
        self.api_state.tick_errors = self.raised + (self.loop.tick_errors if self.loop else 0)
        status = self.cluster.status(controller_pid=os.getpid())
        self.api_state.update(
            obs,
            plan,
            self.cluster.snapshot(),
            self.specs,
            status=status,
            slo_p99_ms=self.slo_p99_ms,
            t_s=time.time(),
            tick_duration_s=self._tick_s,
            plan_duration_s=self.loop.last_decide_s if self.loop else None,
        )

    # ------------------------------------------------------------ the hook
    def on_tick(self, cluster: LocalCluster) -> None:
        """Called by run_controller every policy.tick_s on the supervision thread."""
        if self.loop is None:
            self.build_loop()
        with self._tick_lock:
            t0 = time.perf_counter()
            try:
                self.loop.tick()
            except Exception:
                self.raised += 1
                raise
            self._tick_s = time.perf_counter() - t0

    def stop(self) -> None:
        if self.api is not None:
            self.api.stop()
            self.api = None


def decision_log_path(run_dir: str | Path) -> Path:
    return Path(run_dir) / "decisions.jsonl"


def run_controller(
    cluster: LocalCluster,
    models_cfg: ModelsConfig,
    cluster_cfg: ClusterConfig,
    stop: threading.Event,
    on_tick: Callable[[LocalCluster], None] | None = None,
    *,
    say: Callable[[str], None] = print,
) -> None:
    """Start the stack, place min_replicas, supervise until ``stop`` is set, stop everything.

    Every second: scrape replica loads, rewrite ``run_dir/status.json``
    atomically. Every ``policy.tick_s``: call ``on_tick(cluster)`` (the control
    loop's hook; an exception there is printed, never fatal).
    """
    status_path = cluster.run_dir / "status.json"
    try:
        if not cluster.started:
            cluster.start()
        say(f"front door:  {cluster.frontdoor_url}")
        say(f"metrics API: {cluster.metrics_api_url}")
        say(cluster.prom.banner())
        _write_status(cluster, status_path)
        for err in cluster.apply(initial_actions(models_cfg, cluster_cfg, cluster.snapshot())):
            say(f"warning: {err}")
        for r in cluster.replicas():
            say(f"replica {r.id}: {r.model} on {r.profile} {r.gpu}@{r.start} port {r.port} {r.state.value}")
        tick_s = float(cluster_cfg.policy.tick_s)
        next_tick = time.monotonic() + tick_s
        seen_events = cluster.events_total
        while not stop.is_set():
            cluster.refresh_loads()
            _write_status(cluster, status_path)
            new, seen_events = cluster.events_since(seen_events)
            for e in new:
                say(e)
            if on_tick is not None and time.monotonic() >= next_tick:
                next_tick = time.monotonic() + tick_s
                try:
                    on_tick(cluster)
                except Exception as e:  # the loop holds; supervision goes on
                    log.exception("tick raised")  # with its traceback, in run_dir/controller.log
                    say(f"tick failed: {type(e).__name__}: {e}")
            stop.wait(STATUS_EVERY_S)
    finally:
        say("stopping: front door, replicas, prometheus")
        cluster.stop()
        status_path.unlink(missing_ok=True)


def _write_status(cluster: LocalCluster, path: Path) -> None:
    try:
        write_json_atomic(path, cluster.status(controller_pid=os.getpid()))
        _status_errors.clear()
    except OSError as e:
        # Disk full: `migscale status` reads a stale file for a while; the stack keeps serving.
        if not _status_errors:
            log.warning("cannot write %s: %s (retrying every second)", path, e)
        _status_errors.append(str(e))
        del _status_errors[:-1]


_status_errors: list[str] = []  # non-empty while status.json cannot be written
