"""The immutable picture the metrics API serves: one ``Snapshot`` per control tick.

Part of the export step. ``build_snapshot`` turns a tick's Observation, Plan
and ClusterState into every pod and object the custom metrics API knows, each
metric value as integer milli-units, and an index from ``(label key, value)``
to pod names; ``ApiState`` (``state.py``) publishes it and serves it.

Object naming (what ``k8s/`` and the Kubernetes actuator use):

* Deployment per (model, profile): ``{model}-{profile}`` with ``.``/``+`` -> ``-``
  (``resnet`` on ``1g.10gb`` -> ``resnet-1g-10gb``);
* LeaderWorkerSet per multinode model: ``{model}``;
* pods are named by replica id and carry the labels the rendered workload
  gives its pods (``autoscaler.act.kubernetes.render.labels``: ``app.kubernetes.io/
  managed-by=migscale``, ``app.kubernetes.io/name=migscale``,
  ``app.kubernetes.io/component=triton``, ``migscale.io/model``,
  ``migscale.io/profile``) plus ``migscale.io/deployment=<workload name>``, so
  the HPA's selector (the workload's ``spec.selector``) selects the same pods.

Only replicas in state starting or ready are pods here: a draining replica is
a terminating pod and a failed one a failed pod, and the HPA counts neither --
serving them would make ``current`` disagree with the HPA's count.
A value that is unknown (no plan yet, metric absent or stale) is simply not in
the snapshot: the API answers 404 or an empty list, never 0. ``stale_view``
is a snapshot with every value removed (served once a snapshot is too old).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from autoscaler.act.kubernetes.render import LWS_WORKER_INDEX, MODEL_LABEL, PROFILE_LABEL
from autoscaler.act.kubernetes.render import labels as k8s_labels
from autoscaler.api import signals as sig
from autoscaler.api.quantity import to_milli
from autoscaler.api.views import deployment_name, finite
from autoscaler.mig.products import PRODUCTS
from autoscaler.policy.types import ClusterState, ModelSpec, Observation, Plan, ReplicaState

try:  # orjson is 5-10x faster; the stdlib is the fallback
    import orjson

    def dumps(obj: Any) -> bytes:
        return orjson.dumps(obj)

except ImportError:  # pragma: no cover - exercised only without orjson
    import json

    def dumps(obj: Any) -> bytes:
        return json.dumps(obj, separators=(",", ":"), allow_nan=False).encode()


_EMPTY_BODIES: dict[str, bytes | Callable[[], bytes]] = {
    "plan": b'{"t_s":null,"plan":null,"cluster":{"gpus":[],"replicas":[]},"models":[]}',
    "status": b"null",
    "history": b'{"window_s":600.0,"models":{}}',
}

LABEL_MODEL = MODEL_LABEL
LABEL_PROFILE = PROFILE_LABEL
LABEL_DEPLOYMENT = "migscale.io/deployment"
LABEL_LWS_NAME = "leaderworkerset.sigs.k8s.io/name"

RES_PODS = "pods"
RES_DEPLOYMENTS = "deployments.apps"
RES_LWS = "leaderworkersets.leaderworkerset.x-k8s.io"
OBJECT_RESOURCES = {
    RES_DEPLOYMENTS: ("Deployment", "apps/v1"),
    RES_LWS: ("LeaderWorkerSet", "leaderworkerset.x-k8s.io/v1"),
}

_CACHE_MAX = 20_000  # encoded responses kept per snapshot; cleared when full


Value = tuple[int, float]  # (milli-units, sample time epoch seconds)


@dataclass
class PodEntry:
    name: str
    resource: str  # resource of the owning object (deployments.apps | leaderworkersets...)
    owner: str
    model: str
    profile: str
    labels: dict[str, str]
    values: dict[str, Value] = field(default_factory=dict)


@dataclass
class ObjectEntry:
    resource: str
    name: str
    model: str
    profile: str
    pods: list[str] = field(default_factory=list)
    values: dict[str, Value] = field(default_factory=dict)


@dataclass
class ExternalItem:
    labels: dict[str, str]
    value: Value


@dataclass
class Snapshot:
    """Everything one request needs; never mutated after publication (except ``cache``)."""

    namespace: str
    t_s: float | None = None
    ready: bool = False
    window_s: int | None = None
    pods: dict[str, PodEntry] = field(default_factory=dict)
    index: dict[tuple[str, str], list[str]] = field(default_factory=dict)
    objects: dict[tuple[str, str], ObjectEntry] = field(default_factory=dict)
    namespace_values: dict[str, Value] = field(default_factory=dict)
    external: dict[str, list[ExternalItem]] = field(default_factory=dict)
    # /v1/plan, /v1/status and /v1/history: rendered on first read, not every tick -- at
    # 8,000 GPUs the plan's JSON alone costs ~0.5 s, and a tick is published whether or
    # not anyone looks. Each is bytes, or what renders them (from values frozen at publication).
    bodies: dict[str, bytes | Callable[[], bytes]] = field(default_factory=lambda: dict(_EMPTY_BODIES))
    _render_lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)
    # counts for /metrics: (model, profile, state) -> n, and cluster usage
    replica_counts: dict[tuple[str, str, str], int] = field(default_factory=dict)
    desired: dict[tuple[str, str], int] = field(default_factory=dict)
    gpus_total: int = 0
    gpus_in_use: int = 0
    slices_in_use: int = 0
    model_signals: dict[str, dict[str, float]] = field(default_factory=dict)
    cache: dict[Any, tuple[int, bytes]] = field(default_factory=dict)
    cache_enabled: bool = True  # off only to measure the uncached path (benchmarks/metrics_api.py)

    def body(self, name: str) -> bytes:
        """One of ``bodies`` as bytes, rendered once per snapshot (concurrent readers wait
        for the first)."""
        got = self.bodies[name]
        if isinstance(got, bytes):
            return got
        with self._render_lock:
            got = self.bodies[name]
            if not isinstance(got, bytes):
                got = self.bodies[name] = got()
        return got

    @property
    def plan_body(self) -> bytes:
        return self.body("plan")

    @property
    def status_body(self) -> bytes:
        return self.body("status")

    @property
    def history_body(self) -> bytes:
        return self.body("history")

    def cached(self, key: Any) -> tuple[int, bytes] | None:
        return self.cache.get(key)

    def remember(self, key: Any, result: tuple[int, bytes]) -> tuple[int, bytes]:
        if not self.cache_enabled:
            return result
        if len(self.cache) >= _CACHE_MAX:
            self.cache.clear()
        self.cache[key] = result
        return result


def stale_view(snap: Snapshot) -> Snapshot:
    """``snap`` with every metric value removed: pods and objects stay known (so a
    query still finds them), their values are absent -- 404 or an empty list."""
    pods = {n: replace(p, values={}) for n, p in snap.pods.items()}
    objects = {k: replace(o, values={}) for k, o in snap.objects.items()}
    return replace(
        snap,
        pods=pods,
        objects=objects,
        namespace_values={},
        external={k: [] for k in snap.external},
        replica_counts={},
        desired={},
        model_signals={},
        cache={},
    )


def _milli(x: float | None, rounding: str = "nearest") -> int | None:
    x = finite(x)
    if x is None:
        return None
    try:
        return to_milli(x, rounding=rounding)
    except ValueError:
        return None


def build_snapshot(
    namespace: str,
    observation: Observation | None,
    plan: Plan | None,
    cluster: ClusterState,
    models: Sequence[ModelSpec],
    hpa_target: float,
    now: float | None,
    window_s: int | None,
) -> Snapshot:
    snap = Snapshot(namespace=namespace, t_s=now, window_s=window_s)
    target_milli = max(1, to_milli(hpa_target, rounding="nearest"))
    specs = {m.name: m for m in models}
    obs_t = now if now is not None else 0.0
    plan_t = plan.t_s if plan is not None else obs_t

    # ---- objects: every (model, profile) known to config, plan or cluster
    obj_of: dict[tuple[str, str], tuple[str, str]] = {}  # (model, profile) -> (resource, name)

    def obj_key(model: str, profile: str) -> tuple[str, str]:
        key = obj_of.get((model, profile))
        if key is None:
            spec = specs.get(model)
            if spec is not None and spec.backend == "multinode":
                key = (RES_LWS, model)
            else:
                key = (RES_DEPLOYMENTS, deployment_name(model, profile))
            obj_of[(model, profile)] = key
            if key not in snap.objects:
                snap.objects[key] = ObjectEntry(key[0], key[1], model, profile)
        return key

    for spec in models:
        if spec.backend == "multinode":
            obj_key(spec.name, "whole")
        for p in spec.allowed_profiles:
            obj_key(spec.name, p)
    if plan is not None:
        for m, p in plan.desired:
            obj_key(m, p)

    # ---- pods: starting + ready replicas (what the HPA counts)
    ready_per_model: dict[str, int] = {}
    gpus_used: set[str] = set()
    products = {g.id: PRODUCTS.get(g.product) for g in cluster.gpus}
    pod_labels: dict[str, dict[str, str]] = {}
    for r in cluster.replicas:
        snap.replica_counts[(r.model, r.profile, r.state.value)] = (
            snap.replica_counts.get((r.model, r.profile, r.state.value), 0) + 1
        )
        if r.state not in (ReplicaState.STARTING, ReplicaState.READY):
            continue
        gpus_used.add(r.gpu)
        product = products.get(r.gpu)
        if product is not None and r.profile in product.profiles:
            snap.slices_in_use += product.profiles[r.profile].compute
        elif product is not None and r.profile == "whole":
            snap.slices_in_use += product.compute_slices
        if r.state is ReplicaState.READY:
            ready_per_model[r.model] = ready_per_model.get(r.model, 0) + 1
        resource, owner = obj_key(r.model, r.profile)
        # the same labels the rendered Deployment/LWS puts on its pods, so the
        # HPA's selector (the workload's spec.selector) matches here too
        labels = pod_labels.get(owner)
        if labels is None:  # shared by the pods of one workload (never mutated after this)
            labels = k8s_labels(r.model, r.profile)
            labels[LABEL_DEPLOYMENT] = owner
            if resource == RES_LWS:  # LWS's hpaPodSelector: the leader pod of each group
                labels[LABEL_LWS_NAME] = owner
                labels[LWS_WORKER_INDEX] = "0"
            pod_labels[owner] = labels
        snap.pods[r.id] = PodEntry(r.id, resource, owner, r.model, r.profile, labels)
        snap.objects[(resource, owner)].pods.append(r.id)
    snap.gpus_total = len(cluster.gpus)
    snap.gpus_in_use = len(gpus_used)
    for name in sorted(snap.pods):
        for kv in snap.pods[name].labels.items():
            snap.index.setdefault(kv, []).append(name)

    # ---- model-level signals
    model_vals: dict[str, dict[str, Value]] = {}
    for spec in models:
        s = observation.models.get(spec.name) if observation is not None else None
        vals: dict[str, Value] = {}
        t = s.t_s if s is not None and s.t_s is not None else obs_t
        if s is not None:
            if (q := _milli(s.queue_compute_ratio)) is not None:
                vals[sig.QUEUE_COMPUTE_RATIO] = (q, t)
            rate = finite(s.request_rate)
            ready = ready_per_model.get(spec.name, 0)
            if rate is not None and ready > 0 and (v := _milli(rate / ready)) is not None:
                vals[sig.REPLICA_RPS] = (v, t)
            snap.model_signals[spec.name] = {
                k: v
                for k, v in (
                    ("requests_per_second", finite(s.request_rate)),
                    ("p99_seconds", finite(s.p99_ms) / 1000 if finite(s.p99_ms) is not None else None),
                    ("queue_compute_ratio", finite(s.queue_compute_ratio)),
                )
                if v is not None
            }
        model_vals[spec.name] = vals

    # ---- per object and per pod values
    planned_models = {m for m, _ in plan.desired} if plan is not None else set()
    for (resource, name), obj in snap.objects.items():
        if obj.model in planned_models:
            desired = int(plan.desired.get((obj.model, obj.profile), 0))  # type: ignore[union-attr]
            snap.desired[(obj.model, obj.profile)] = desired
            obj.values[sig.DESIRED_REPLICAS] = (desired * 1000, plan_t)
            ratio = sig.replica_ratio_milli(desired, len(obj.pods), target_milli)
            if ratio is not None:
                obj.values[sig.REPLICA_RATIO] = (ratio, plan_t)
        obj.values.update(model_vals.get(obj.model, {}))
        utils: list[Value] = []
        for pod_name in obj.pods:
            pod = snap.pods[pod_name]
            if sig.REPLICA_RATIO in obj.values:
                pod.values[sig.REPLICA_RATIO] = obj.values[sig.REPLICA_RATIO]
            for k in (sig.QUEUE_COMPUTE_RATIO, sig.REPLICA_RPS):
                if k in obj.values:
                    pod.values[k] = obj.values[k]
            rs = observation.replicas.get(pod_name) if observation is not None else None
            if rs is not None:
                u = finite(rs.gr_engine_active)
                if u is None:
                    u = finite(rs.busy_fraction)
                if (um := _milli(u)) is not None:
                    v = (um, rs.t_s if rs.t_s is not None else obs_t)
                    pod.values[sig.SLICE_UTILIZATION] = v
                    utils.append(v)
        if utils:
            obj.values[sig.SLICE_UTILIZATION] = (
                sum(u[0] for u in utils) // len(utils),
                max(u[1] for u in utils),
            )

    # ---- namespace and external metrics
    snap.namespace_values["migscale_gpus_in_use"] = (snap.gpus_in_use * 1000, obs_t)
    snap.namespace_values["migscale_slices_in_use"] = (snap.slices_in_use * 1000, obs_t)
    snap.namespace_values["migscale_replicas"] = (len(snap.pods) * 1000, obs_t)
    if plan is not None:
        total = sum(v for v in (finite(x) for x in plan.shortfall.values()) if v is not None)
        if (ms := _milli(total)) is not None:
            snap.namespace_values["migscale_shortfall_requests_per_second"] = (ms, plan_t)
    ext: dict[str, list[ExternalItem]] = {k: [] for k in sig.EXTERNAL_METRICS}
    for (model, profile), n in sorted(snap.desired.items()):
        labels = {"model": model, "profile": profile, "deployment": obj_of[(model, profile)][1]}
        ext[sig.DESIRED_REPLICAS].append(ExternalItem(labels, (n * 1000, plan_t)))
    for spec in models:
        s = observation.models.get(spec.name) if observation is not None else None
        t = s.t_s if s is not None and s.t_s is not None else obs_t
        if s is not None:
            for metric, raw in (
                ("migscale_model_requests_per_second", s.request_rate),
                ("migscale_model_queue_compute_ratio", s.queue_compute_ratio),
                ("migscale_model_p99_seconds", finite(s.p99_ms) / 1000 if finite(s.p99_ms) is not None else None),
            ):
                if (v := _milli(raw)) is not None:
                    ext[metric].append(ExternalItem({"model": spec.name}, (v, t)))
        if (
            plan is not None
            and spec.name in planned_models
            and (v := _milli(plan.shortfall.get(spec.name, 0.0))) is not None
        ):
            ext["migscale_model_shortfall_requests_per_second"].append(ExternalItem({"model": spec.name}, (v, plan_t)))
    snap.external = ext
    return snap
