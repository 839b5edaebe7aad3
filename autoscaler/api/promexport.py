"""``/metrics``: the controller's own metrics in Prometheus exposition format.

Part of the export step, and the second way to feed an HPA: a
prometheus-adapter can turn ``migscale_replica_ratio{namespace,pod}`` into the
same custom metric this app serves directly. Every name carries the
``migscale_`` prefix and a base unit (seconds, requests per second, ratio).
The registry is our own ``CollectorRegistry`` -- never the process-global
default -- so two apps in one process (tests, the local controller) do not
collide.

Counters and histograms are updated by :meth:`ApiState.update` through a
listener; gauges are read from the current snapshot at scrape time, so a
model that disappears stops being exported instead of freezing at its last
value, and a stale snapshot (``ApiState.max_age_s``) exports none of its
values. ``migscale_tick_errors_total`` comes from the run loop's health: ticks
that raised (each logged with its traceback and backed off).
"""

from __future__ import annotations

from collections.abc import Iterable

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from autoscaler.api import signals as sig
from autoscaler.api.state import ApiState, Snapshot
from autoscaler.policy.types import Plan

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

# tick and plan durations: the planner aims at well under 100 ms for a tick;
# buckets from 1 ms to 10 s so a pathological tick is still resolved
_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


class _SnapshotCollector(Collector):
    def __init__(self, state: ApiState) -> None:
        self.state = state

    def collect(self) -> Iterable[Metric]:
        snap: Snapshot = self.state.snapshot
        reps = GaugeMetricFamily(
            "migscale_replicas", "Replicas by model, profile and state", labels=["model", "profile", "state"]
        )
        for (m, p, s), n in sorted(snap.replica_counts.items()):
            reps.add_metric([m, p, s], n)
        yield reps
        desired = GaugeMetricFamily(
            "migscale_desired_replicas", "Planned replicas by model and profile", labels=["model", "profile"]
        )
        for (m, p), n in sorted(snap.desired.items()):
            desired.add_metric([m, p], n)
        yield desired
        yield GaugeMetricFamily("migscale_gpus", "GPUs in the inventory", value=snap.gpus_total)
        yield GaugeMetricFamily("migscale_gpus_in_use", "GPUs with a starting or ready replica",
                                value=snap.gpus_in_use)
        yield GaugeMetricFamily("migscale_slices_in_use", "MIG compute slices held by replicas",
                                value=snap.slices_in_use)
        yield GaugeMetricFamily("migscale_ready", "1 while a current picture is published (see /readyz)",
                                value=1 if self.state.ready else 0)
        if self.state.health is not None:
            yield CounterMetricFamily("migscale_tick_errors", "Control ticks that raised (traceback in the controller log)",
                                      value=self.state.health().tick_errors)
        if snap.t_s is not None:
            yield GaugeMetricFamily("migscale_last_tick_timestamp_seconds", "Time of the last published tick",
                                    value=snap.t_s)
        for key, help_, name in (
            ("requests_per_second", "Request rate per model", "migscale_model_requests_per_second"),
            ("p99_seconds", "p99 latency per model", "migscale_model_p99_seconds"),
            ("queue_compute_ratio", "Queue time / compute time per model", "migscale_model_queue_compute_ratio"),
        ):
            fam = GaugeMetricFamily(name, help_, labels=["model"])
            for model, vals in sorted(snap.model_signals.items()):
                if key in vals:  # absent stays absent: no sample rather than 0
                    fam.add_metric([model], vals[key])
            yield fam
        ratio = GaugeMetricFamily(
            sig.REPLICA_RATIO,
            "Per pod: desired/current replicas of its Deployment (HPA averageValue target 1)",
            labels=["namespace", "pod", "deployment", "model", "profile"],
        )
        for name, pod in sorted(snap.pods.items()):
            v = pod.values.get(sig.REPLICA_RATIO)
            if v is not None:
                ratio.add_metric([snap.namespace, name, pod.owner, pod.model, pod.profile], v[0] / 1000)
        yield ratio


class PromExport:
    """Owns the registry; :meth:`render` is the ``/metrics`` body."""

    def __init__(self, state: ApiState) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.decisions = Counter(
            "migscale_decisions_total",
            "Per-model decisions by reason (one per model and reason each tick)",
            ["model", "reason"],
            registry=self.registry,
        )
        self.actions = Counter(
            "migscale_actions_total", "Planned actions by kind and reason", ["kind", "reason"],
            registry=self.registry,
        )
        self.plan_seconds = Histogram(
            "migscale_plan_duration_seconds", "Time to compute one plan", buckets=_BUCKETS,
            registry=self.registry,
        )
        self.tick_seconds = Histogram(
            "migscale_tick_duration_seconds", "Time of one observe-decide-act tick", buckets=_BUCKETS,
            registry=self.registry,
        )
        self.ticks = Counter("migscale_ticks_total", "Published control ticks", registry=self.registry)
        self.registry.register(_SnapshotCollector(state))
        state.add_listener(self.on_update)

    def on_update(
        self, snap: Snapshot, plan: Plan | None, tick_s: float | None, plan_s: float | None
    ) -> None:
        self.ticks.inc()
        if plan is not None:
            for model, reasons in plan.reasons.items():
                for r in reasons:
                    self.decisions.labels(model, r.value).inc()
            for a in plan.actions:
                self.actions.labels(a.kind.value, a.reason.value).inc()
        if tick_s is not None and tick_s >= 0:
            self.tick_seconds.observe(tick_s)
        if plan_s is not None and plan_s >= 0:
            self.plan_seconds.observe(plan_s)

    def render(self) -> bytes:
        return generate_latest(self.registry)
