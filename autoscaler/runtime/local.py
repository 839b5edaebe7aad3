"""The local controller: one process that wires the whole loop on one machine.

``migscale up`` and ``migscale demo`` both run this. It composes the pieces
each capability ships, and nothing else:

    LocalCluster (act/)  -- Inventory + Actuator: tritonserver replicas, nginx, Prometheus
    PrometheusSource / ScrapeSource (observe/) -- MetricsSource
    ControlLoop (loop.py) -- observe -> decide (policy/) -> act, one tick
    Driver (driver.py) -- the run loop: a tick every policy.tick_s (the loop's
        back-off honoured), the 1 s status refresh as its idle hook
    ApiState + create_app (api/) -- custom/external metrics, /metrics, /v1/plan, /v1/status, /ui

The tick and the status refresh run on the driver's one thread, so they never
race on the same replica; the metrics API serves the picture only while the
driver's health says it is current (``/readyz``, stale values absent).
"""

from __future__ import annotations

import errno
import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from autoscaler.act.local.cluster import LocalCluster
from autoscaler.act.local.pids import RUN_DIR_MARKER, write_json_atomic
from autoscaler.act.local.prometheus import SCRAPE_INTERVAL_S, HoldWhileWarming
from autoscaler.api.app import create_app
from autoscaler.api.server import ServerHandle, serve_in_thread
from autoscaler.api.state import ApiState
from autoscaler.clock import Clock, WallClock
from autoscaler.config import ClusterConfig, ModelsConfig, model_specs, policy_config
from autoscaler.driver import Driver, Hooks
from autoscaler.loop import ControlLoop, TickResult
from autoscaler.observe.fast import FastScrape, WithFast
from autoscaler.observe.prometheus import PrometheusSource
from autoscaler.observe.scrape import ScrapeSource
from autoscaler.policy import burst
from autoscaler.policy.capacity import ready_capacity
from autoscaler.policy.types import ReplicaState
from autoscaler.runtime.local_setup import initial_actions

STATUS_EVERY_S = 1.0
log = logging.getLogger("migscale.local")

# The local backend's emulated repartition takes no time (see act/local/cluster.py).
LOCAL_REPARTITION_S = 0.0
# A local tritonserver replica serves ~1.5-2 s after it is started (benchmarks/local_cluster.py).
LOCAL_REPLICA_START_S = 2.0
# The burst layer's window over the 1 s direct scrapes: three samples, so one
# slow scrape does not blank it, and a step shows fully within 3 s.
FAST_WINDOW_S = 3.0


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
        clock: Clock | None = None,
    ) -> None:
        self.cluster = cluster
        self.clock = clock or WallClock()
        self.models_cfg = models_cfg
        self.cluster_cfg = cluster_cfg
        self.specs = model_specs(models_cfg, cluster_cfg)
        # Emulated MIG: a repartition rewrites a declared layout at once, so the
        # planner may cut the most efficient slices even in a burst (no fast path).
        self.policy = policy_config(models_cfg, cluster_cfg, repartition_s=LOCAL_REPARTITION_S,
                                    replica_start_s=LOCAL_REPLICA_START_S)
        self.slo_p99_ms = {m.name: float(m.slo.p99_ms) for m in models_cfg.models}
        self.tick_s = float(cluster_cfg.policy.tick_s)
        # Three missed ticks (15 s at a 5 s tick): one slow or failed tick is still
        # current; a loop stopped or stuck for longer is not (Driver.health).
        self.max_age_s = 3.0 * self.tick_s
        self.api_state = ApiState(cluster_cfg.namespace, max_age_s=self.max_age_s, clock=self.clock)
        self.api: ServerHandle | None = None
        self.loop: ControlLoop | None = None
        self.driver: Driver | None = None
        self.on_result = on_result
        # Rates over a window of ~3 ticks: long enough for two Prometheus
        # samples at a 2 s scrape, short enough to see a spike within a tick or two.
        self.window_s = window_s or max(10.0, 3 * float(cluster_cfg.policy.tick_s))
        self._tick_lock = threading.Lock()
        self.fast = FastScrape(self._targets, window_s=FAST_WINDOW_S)
        self._tick_s: float | None = None  # last tick's duration, for /metrics
        self.wake = burst.WakeOnBurst(self.tick_s)

    # ------------------------------------------------------------ wiring
    def _targets(self) -> dict[str, tuple[str, str]]:
        return {
            r.id: (r.model, r.process.url_metrics)
            for r in self.cluster.replicas()
            if r.state is ReplicaState.READY
        }

    def _source(self):
        c = self.cluster
        stale = float(self.cluster_cfg.policy.metrics_stale_s)
        if c.prometheus_url:
            # After a Prometheus restart (or a full disk) its windows are partial: hold until it
            # has scraped a whole long window (act/local/prometheus.py says what happened without this).
            c.prom.warm_s = max(self.window_s, float(self.cluster_cfg.policy.long_window_s)) + 2 * SCRAPE_INTERVAL_S
            main = HoldWhileWarming(
                PrometheusSource(c.prometheus_url, window_s=self.window_s, metrics_stale_s=stale), c.prom)
        else:
            main = ScrapeSource(self._targets, window_s=self.window_s, long_window_s=2 * self.window_s,
                                metrics_stale_s=stale)
        # The burst layer's signals: every replica scraped each second (the idle
        # hook), rates over the last 3 s -- a rise shows within 1-3 s.
        return WithFast(main, self.fast)

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
            self.clock,
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
        status = self.cluster.status(controller_pid=os.getpid())
        self.api_state.update(
            obs,
            plan,
            self.cluster.snapshot(),
            self.specs,
            status=status,
            slo_p99_ms=self.slo_p99_ms,
            t_s=self.clock.now(),
            tick_duration_s=self._tick_s,
            plan_duration_s=self.loop.last_decide_s if self.loop else None,
        )

    # ------------------------------------------------------------ the run loop
    def tick(self) -> TickResult:
        """One control tick (the driver's ``Tickable``), timed for /metrics."""
        loop = self.loop or self.build_loop()
        with self._tick_lock:
            self._mark_tick()
            t0 = time.perf_counter()
            result = loop.tick()
            self._tick_s = time.perf_counter() - t0
        return result

    @property
    def tick_errors(self) -> int:
        """Ticks whose exception the loop caught and logged (the driver adds those that escaped)."""
        return self.loop.tick_errors if self.loop is not None else 0

    def outrun_models(self) -> set[str]:
        """Models whose burst demand (the last 1 s scrapes) exceeds what their ready replicas serve."""
        now = self.clock.now()
        return burst.outrun_models(self.fast.round_signals(), now, ready_capacity(self.specs, self.cluster.replicas()))

    def _mark_tick(self) -> None:
        self.wake.ticked(self.clock.now())

    def burst_began(self) -> bool:
        """The driver's wake hook (``burst.WakeOnBurst``: at a burst's onset, and again
        every half tick while it outruns the ready replicas)."""
        return self.wake.began(self.outrun_models(), self.clock.now())

    def build_driver(self, idle: Callable[[], None] | None = None) -> Driver:
        """The run loop around ``tick``; the metrics API follows its health."""
        def every_second() -> None:
            self.fast.sample(self.clock.now())
            if idle is not None:
                idle()

        self.driver = Driver(self, self.clock, tick_s=self.tick_s, max_snapshot_age_s=self.max_age_s,
                             slice_s=STATUS_EVERY_S, hooks=Hooks(idle=every_second, wake=self.burst_began))
        self.api_state.health = self.driver.health
        return self.driver

    def stop(self) -> None:
        if self.api is not None:
            self.api.stop()
            self.api = None
        self.fast.close()  # its kept connections to the replicas


def decision_log_path(run_dir: str | Path) -> Path:
    return Path(run_dir) / "decisions.jsonl"


@dataclass(frozen=True)
class _Supervised:
    """What a run without the control loop ticks (``up --no-control``): nothing, every tick_s."""

    next_delay_s: float
    ok: bool = True

    def tick(self) -> _Supervised:
        return self


def run_controller(
    cluster: LocalCluster,
    models_cfg: ModelsConfig,
    cluster_cfg: ClusterConfig,
    stop: threading.Event,
    controller: LocalController | None = None,
    *,
    say: Callable[[str], None] = print,
    live: Any = None,
) -> None:
    """Start the stack, place min_replicas, run until ``stop`` is set, stop everything.

    One ``Driver`` runs it all: every second (its idle hook) scrape replica
    loads, rewrite ``run_dir/status.json`` atomically and print new lifecycle
    events; every ``policy.tick_s`` (longer while the loop backs off) a tick of
    ``controller``'s control loop. Without a controller only the supervision runs.
    ``live`` (``live_models.LiveModels``): each second, take a model set
    ``migscale apply`` handed over into force before the next tick.
    """
    status_path = cluster.run_dir / "status.json"
    try:
        if not cluster.started:
            cluster.start()
        say(f"front door:  {cluster.frontdoor_url}")
        say(f"metrics API: {cluster.metrics_api_url}")
        say(cluster.prom.banner())
        _write_status(cluster, status_path, live)
        first = initial_actions(models_cfg, cluster_cfg, cluster.snapshot(), now_s=cluster.clock.now())
        for err in cluster.apply(first):
            say(f"warning: {err}")
        for r in cluster.replicas():
            say(f"replica {r.id}: {r.model} on {r.profile} {r.gpu}@{r.start} port {r.port} {r.state.value}")
        seen = [cluster.events_total]

        def idle() -> None:
            if not (cluster.run_dir / RUN_DIR_MARKER).exists():
                # The run directory was deleted under us: no `down` or `status` can find this
                # controller any more, and a new `up` there would not see its lock. Stop everything.
                if not stop.is_set():
                    say(f"the run directory {cluster.run_dir} was removed: stopping")
                stop.set()
                return
            if live is not None:
                live.poll()
            cluster.refresh_loads()
            _write_status(cluster, status_path, live)
            new, seen[0] = cluster.events_since(seen[0])
            for e in new:
                say(e)
            if controller is None:  # with a loop, its ticks report these (TickResult.late_errors)
                for err in cluster.take_errors():
                    say(f"warning: {err}")

        if controller is not None:
            driver = controller.build_driver(idle)
        else:
            tick_s = float(cluster_cfg.policy.tick_s)
            driver = Driver(_Supervised(tick_s), cluster.clock, tick_s=tick_s, slice_s=STATUS_EVERY_S,
                            hooks=Hooks(idle=idle))
        # The first tick one tick_s after start, as every later one: the first
        # replicas get a tick to start before the loop looks at them.
        driver.wait(driver.tick_s, stop.is_set)
        driver.run(stop)
    finally:
        say("stopping: front door, replicas, prometheus")
        cluster.stop()
        status_path.unlink(missing_ok=True)


def _write_status(cluster: LocalCluster, path: Path, live: Any = None) -> None:
    doc = cluster.status(controller_pid=os.getpid())
    if live is not None:
        doc["config"] = live.describe()
    try:
        write_json_atomic(path, doc)
        _status_errors.clear()
    except OSError as e:
        # Disk full: `migscale status` reads a stale file for a while; the stack keeps serving.
        if e.errno in (errno.ENOSPC, errno.EDQUOT):
            cluster.prom.storage_failed()  # its TSDB is on the same disk: its windows have a gap
        if not _status_errors:
            log.warning("cannot write %s: %s (retrying every second)", path, e)
        _status_errors.append(str(e))
        del _status_errors[:-1]


_status_errors: list[str] = []  # non-empty while status.json cannot be written
