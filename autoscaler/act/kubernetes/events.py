"""Kubernetes Events for migscale's decisions: what an operator reads in ``kubectl describe``.

Place in the loop: the last step of "act". Every scale, profile swap and
repartition the backend carries out is recorded as an ``events.k8s.io/v1``
Event on the object it changed (the Deployment, LeaderWorkerSet or Node),
in the HPA's manner: ``SuccessfulRescale`` with the new size and the
decision's reason (``New size: 3; reason: scale_up_demand``),
``FailedRescale`` when the write failed, and the repartition and swap
reasons named in docs/kubernetes.md.

Bounded, like client-go's recorder: the same (object, reason, note) within
``series_window_s`` is one Event whose ``series.count`` grows, patched at most
once per ``series_flush_s``; at most ``per_tick`` new Events are sent per
tick (the rest are counted in ``dropped``); the dedupe table keeps
``max_keys`` entries. An Event that cannot be written is dropped and counted:
losing an Event must never fail an action.
"""

from __future__ import annotations

import uuid
from collections import OrderedDict
from datetime import datetime, timezone
from typing import Any

from autoscaler.act.kubernetes.client import KubeError, KubeRest
from autoscaler.clock import Clock

Obj = dict[str, Any]
CONTROLLER = "migscale.io/controller"


def micro(t: float) -> str:
    return datetime.fromtimestamp(t, timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class EventRecorder:
    def __init__(
        self,
        rest: KubeRest,
        clock: Clock,
        *,
        instance: str,
        namespace: str,
        per_tick: int = 20,
        series_window_s: float = 360.0,
        series_flush_s: float = 30.0,
        max_keys: int = 1000,
    ) -> None:
        self.rest = rest
        self.clock = clock
        self.instance = instance
        self.namespace = namespace  # where Events about cluster-scoped objects (Nodes) go
        self.per_tick = per_tick
        self.series_window_s = series_window_s
        self.series_flush_s = series_flush_s
        self.max_keys = max_keys
        self.sent = 0
        self.dropped = 0
        self.failed = 0
        self._budget = per_tick
        # key -> [event name, namespace, first time, last time, count, count at last flush, last flush]
        self._series: OrderedDict[tuple[str, str, str], list[Any]] = OrderedDict()

    def new_tick(self) -> None:
        self._budget = self.per_tick

    def event(self, regarding: Obj, kind: str, reason: str, note: str, action: str = "Scale") -> None:
        meta = regarding.get("metadata") or {}
        ns = meta.get("namespace") or self.namespace
        key = (str(meta.get("uid") or meta.get("name")), reason, note)
        now = self.clock.now()
        hit = self._series.get(key)
        if hit is not None and now - hit[3] <= self.series_window_s:
            hit[3], hit[4] = now, hit[4] + 1
            self._series.move_to_end(key)
            if now - hit[6] >= self.series_flush_s:
                self._flush(key, hit)
            return
        if self._budget <= 0:
            self.dropped += 1
            return
        self._budget -= 1
        name = f"{meta.get('name', 'object')}.{uuid.uuid4().hex[:10]}"[:253]
        body = {
            "apiVersion": "events.k8s.io/v1",
            "kind": "Event",
            "metadata": {"name": name, "namespace": ns},
            "eventTime": micro(now),
            "reportingController": CONTROLLER,
            "reportingInstance": self.instance[:128],
            "action": action,
            "reason": reason,
            "note": note[:1024],
            "type": kind,
            "regarding": {k: v for k, v in (("apiVersion", regarding.get("apiVersion")),
                                            ("kind", regarding.get("kind")), ("name", meta.get("name")),
                                            ("namespace", meta.get("namespace")), ("uid", meta.get("uid")))
                          if v},
        }
        try:
            self.rest.create(body)
            self.sent += 1
        except KubeError:
            self.failed += 1
            return
        self._series[key] = [name, ns, now, now, 1, 1, now]
        while len(self._series) > self.max_keys:
            self._series.popitem(last=False)

    def _flush(self, key: tuple[str, str, str], hit: list[Any]) -> None:
        name, ns, _first, last, count, flushed, _ = hit
        if count == flushed:
            return
        hit[5], hit[6] = count, self.clock.now()
        patch = {"series": {"count": count, "lastObservedTime": micro(last)}}
        try:
            self.rest.merge_patch("events.k8s.io/v1", "Event", ns, name, patch)
        except KubeError:
            self.failed += 1

    def stats(self) -> dict[str, int]:
        return {"sent": self.sent, "dropped": self.dropped, "failed": self.failed, "series": len(self._series)}
