"""What the API serves: the current snapshot, its freshness and the history, per control tick.

Part of the export step: the controller calls :meth:`ApiState.update` at the
end of every tick with the tick's Observation, Plan and ClusterState. Update
builds an immutable :class:`Snapshot` (``snapshot.py``: every pod and object
the custom metrics API knows, each metric value as integer milli-units, an
index from ``(label key, value)`` to pod names) and swaps it in under a lock.
Request handlers read the current snapshot without locking (one attribute
read), so a request costs a dict lookup plus the pods of one Deployment, and
the usual HPA query (the same selector every 15 s) is answered from a
per-snapshot cache of encoded bytes.

Freshness: a snapshot older than ``max_age_s`` (the controller stopped, died,
or is stuck in a slow tick) is served as its *stale view*: the same pods and
objects with every value removed, so the HPA finds each metric absent and
holds its replica count (``docs/hpa.md``) instead of steering on a frozen
number. ``readiness()`` (``/readyz``) also asks the run loop's ``health``.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

from autoscaler.api.snapshot import (
    LABEL_DEPLOYMENT,
    LABEL_LWS_NAME,
    LABEL_MODEL,
    LABEL_PROFILE,
    OBJECT_RESOURCES,
    RES_DEPLOYMENTS,
    RES_LWS,
    RES_PODS,
    ExternalItem,
    ObjectEntry,
    PodEntry,
    Snapshot,
    Value,
    build_snapshot,
    dumps,
    stale_view,
)
from autoscaler.api.views import cluster_json, finite, models_json, plan_json, slo_from_status
from autoscaler.clock import Clock, WallClock
from autoscaler.policy.types import ClusterState, ModelSpec, Observation, Plan
from autoscaler.status import jsonable

# the snapshot's names, for the routes that read it (custom.py, external.py, promexport.py)
__all__ = [
    "LABEL_DEPLOYMENT", "LABEL_LWS_NAME", "LABEL_MODEL", "LABEL_PROFILE", "OBJECT_RESOURCES", "RES_DEPLOYMENTS",
    "RES_LWS", "RES_PODS", "ApiState", "ExternalItem", "LoopHealth", "ObjectEntry", "PodEntry", "Snapshot",
    "Value", "build_snapshot", "dumps", "stale_view",
]

HISTORY_S = 600.0  # the web view's sparklines span 10 minutes
_HISTORY_MAX_POINTS = 1200  # 10 min at a 0.5 s tick; bounds memory whatever the tick


class LoopHealth(Protocol):
    """What the API needs of the run loop's health (``driver.Health``)."""

    @property
    def ready(self) -> bool: ...

    @property
    def reason(self) -> str: ...

    @property
    def tick_errors(self) -> int: ...


class ApiState:
    """Thread-safe holder of the current :class:`Snapshot` plus the history ring buffers.

    ``max_age_s``: a published snapshot older than this (on ``clock``) is served
    without values (see the module docstring); None: never stale. ``health``:
    the run loop's health (``Driver.health``), for ``/readyz`` and ``/metrics``.
    """

    def __init__(
        self,
        namespace: str = "default",
        *,
        window_s: int | None = None,
        cache: bool = True,
        max_age_s: float | None = None,
        clock: Clock | None = None,
        health: Callable[[], LoopHealth] | None = None,
    ) -> None:
        self.namespace = namespace
        self.window_s = window_s
        self.cache = cache
        self.max_age_s = max_age_s
        self.clock: Clock = clock or WallClock()
        self.health = health
        self._lock = threading.Lock()
        self._snap = Snapshot(namespace=namespace, window_s=window_s)
        self._published_s: float | None = None  # clock time of the last update
        self._stale: tuple[Snapshot, Snapshot] | None = None  # (snapshot, its stale view)
        self._history: dict[str, deque[tuple[float, float | None, float | None]]] = {}
        self._last_plan: Plan | None = None
        self._listeners: list[Any] = []  # callables(snapshot, plan, tick_s, plan_s) -- /metrics

    # ------------------------------------------------------------- reading
    @property
    def snapshot(self) -> Snapshot:
        """The current snapshot, or its stale view once it is older than ``max_age_s``."""
        snap = self._snap
        if self.max_age_s is None or self._published_s is None:
            return snap
        if self.clock.now() - self._published_s <= self.max_age_s:
            return snap
        stale = self._stale
        if stale is None or stale[0] is not snap:
            stale = (snap, stale_view(snap))
            self._stale = stale
        return stale[1]

    @property
    def ready(self) -> bool:
        return self.readiness()[0]

    def age_s(self) -> float | None:
        """Seconds since the last publication (None before the first)."""
        return None if self._published_s is None else max(0.0, self.clock.now() - self._published_s)

    def readiness(self) -> tuple[bool, str]:
        """(ready, why not): a tick was published, the run loop is healthy, the picture is fresh."""
        if not self._snap.ready:
            return False, "no control tick published yet"
        if self.health is not None:
            h = self.health()
            if not h.ready:
                return False, h.reason
        age = self.age_s()
        if self.max_age_s is not None and age is not None and age > self.max_age_s:
            return False, f"the published picture is {age:.0f}s old (limit {self.max_age_s:.0f}s)"
        return True, "ok"

    def add_listener(self, fn: Any) -> None:
        self._listeners.append(fn)

    # ------------------------------------------------------------- writing
    def update(
        self,
        observation: Observation | None,
        plan: Plan | None,
        cluster: ClusterState,
        models: Sequence[ModelSpec],
        status: dict | None = None,
        hpa_target: float = 1.0,
        *,
        tick_duration_s: float | None = None,
        plan_duration_s: float | None = None,
        slo_p99_ms: Mapping[str, float] | None = None,
        t_s: float | None = None,
        keep_last_plan: bool = True,
    ) -> None:
        """Publish one tick. Called by the controller; cheap enough for every tick.

        ``plan=None`` on a tick that made no plan (the loop only observed while
        the actuator converges) keeps serving the last plan -- its replica
        counts still stand, against the pods that exist now -- unless
        ``keep_last_plan=False``. Counters in /metrics count each plan once.
        """
        with self._lock:
            fresh_plan = plan
            if plan is None and keep_last_plan:
                plan = self._last_plan
            self._last_plan = plan
            now = t_s if t_s is not None else (
                observation.t_s if observation is not None else plan.t_s if plan is not None else None
            )
            slos = dict(slo_from_status(status))
            slos.update(slo_p99_ms or {})
            snap = build_snapshot(
                self.namespace, observation, plan, cluster, models, hpa_target, now, self.window_s
            )
            snap.ready = True
            snap.cache_enabled = self.cache
            self._record_history(observation, models)
            # The inputs are immutable (or copied here), so each body renders later, on
            # first read, exactly as it would have now.
            models = tuple(models)
            history = {m: tuple(pts) for m, pts in self._history.items()}
            status_doc = jsonable(status)  # a copy: the caller's dict may share live objects
            snap.bodies = {
                "plan": lambda: dumps({
                    "t_s": now,
                    "plan": plan_json(plan),
                    "cluster": cluster_json(cluster, plan),
                    "models": models_json(models, observation, plan, cluster, slos),
                }),
                "status": lambda: dumps(status_doc),
                "history": lambda: dumps({
                    "window_s": HISTORY_S,
                    "models": {
                        m: {"slo_p99_ms": finite(slos.get(m)), "points": [list(p) for p in pts]}
                        for m, pts in sorted(history.items())
                    },
                }),
            }
            self._snap = snap
            self._published_s = self.clock.now()
            for fn in self._listeners:
                fn(snap, fresh_plan, tick_duration_s, plan_duration_s)

    def _record_history(self, observation: Observation | None, models: Sequence[ModelSpec]) -> None:
        names = {m.name for m in models}
        for gone in set(self._history) - names:
            del self._history[gone]
        if observation is None:
            return
        t = observation.t_s
        for name in names:
            buf = self._history.setdefault(name, deque(maxlen=_HISTORY_MAX_POINTS))
            s = observation.models.get(name)
            buf.append((t, finite(s.request_rate) if s else None, finite(s.p99_ms) if s else None))
            while buf and buf[0][0] < t - HISTORY_S:
                buf.popleft()


