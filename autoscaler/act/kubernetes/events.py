"""Kubernetes Events for migscale's decisions: what an operator reads in ``kubectl describe``.

Place in the loop: the last step of "act". Every scale, profile swap and
repartition the backend carries out is recorded as an ``events.k8s.io/v1``
Event on the object it changed (the Deployment, LeaderWorkerSet or Node),
in the HPA's manner: ``SuccessfulRescale`` with the new size and the
decision's reason (``New size: 3; reason: scale_up_demand``),
``FailedRescale`` when the write failed, and the repartition and swap
reasons named in docs/kubernetes.md.

Asynchronous and bounded, like client-go's recorder: ``event`` only decides
what to write and queues it; one daemon thread writes the queue, so a tick
never waits for an Event's round trip. The same (object, reason, note)
within ``series_window_s`` is one Event whose ``series.count`` grows, patched
at most once per ``series_flush_s``; at most ``per_tick`` new Events are
queued per tick, the queue holds ``queue_size`` writes, and whatever does
not fit is counted in ``dropped``; the dedupe table keeps ``max_keys``
entries. An Event that cannot be written is dropped and counted: losing an
Event must never fail or delay an action. Writes still pass the client's
fencing guard, so a replica that lost the lease writes no Event either.
"""

from __future__ import annotations

import queue
import threading
import time
import uuid
from collections import OrderedDict
from collections.abc import Callable
from datetime import datetime, timezone
from typing import Any

from autoscaler.act.kubernetes.client import KubeError, KubeRest
from autoscaler.clock import Clock

Obj = dict[str, Any]
CONTROLLER = "migscale.io/controller"
# Where an Event about a cluster-scoped object (a Node) goes. The API server accepts such an
# Event (eventTime set) only in "default" or "kube-system" and answers 422 elsewhere
# (pkg/apis/core/validation/events.go); client-go's recorder uses "default" too.
CLUSTER_SCOPED_EVENT_NAMESPACE = "default"


def micro(t: float) -> str:
    return datetime.fromtimestamp(t, timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class EventRecorder:
    def __init__(
        self,
        rest: KubeRest,
        clock: Clock,
        *,
        instance: str,
        per_tick: int = 20,
        series_window_s: float = 360.0,
        series_flush_s: float = 30.0,
        max_keys: int = 1000,
        queue_size: int = 1000,
    ) -> None:
        self.rest = rest
        self.clock = clock
        self.instance = instance
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
        self._lock = threading.Lock()  # _series and the counters: the writer thread touches both
        self._queue: queue.Queue[Callable[[], None] | None] = queue.Queue(maxsize=queue_size)
        self._writer: threading.Thread | None = None
        self._closed = False

    def new_tick(self) -> None:
        self._budget = self.per_tick

    def event(self, regarding: Obj, kind: str, reason: str, note: str, action: str = "Scale") -> None:
        meta = regarding.get("metadata") or {}
        ns = meta.get("namespace") or CLUSTER_SCOPED_EVENT_NAMESPACE
        key = (str(meta.get("uid") or meta.get("name")), reason, note)
        now = self.clock.now()
        with self._lock:
            hit = self._series.get(key)
            if hit is not None and now - hit[3] <= self.series_window_s:
                hit[3], hit[4] = now, hit[4] + 1
                self._series.move_to_end(key)
                if now - hit[6] >= self.series_flush_s and hit[4] != hit[5]:
                    hit[5], hit[6] = hit[4], now
                    patch = {"series": {"count": hit[4], "lastObservedTime": micro(now)}}
                    self._submit(lambda n=hit[0], s=hit[1]: self._patch(s, n, patch))
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
        with self._lock:
            if not self._submit(lambda: self._create(key, body)):
                return
            self._series[key] = [name, ns, now, now, 1, 1, now]
            while len(self._series) > self.max_keys:
                self._series.popitem(last=False)

    # ------------------------------------------------------------ the writer thread

    def _submit(self, write: Callable[[], None]) -> bool:
        """Queue one write (caller holds ``_lock``); False, counted as dropped, when the queue is full."""
        if self._closed:
            self.dropped += 1
            return False
        try:
            self._queue.put_nowait(write)
        except queue.Full:
            self.dropped += 1
            return False
        if self._writer is None:
            self._writer = threading.Thread(target=self._write_loop, name="migscale-events", daemon=True)
            self._writer.start()
        return True

    def _write_loop(self) -> None:
        while True:
            write = self._queue.get()
            try:
                if write is None:
                    return
                write()
            finally:
                self._queue.task_done()

    def _create(self, key: tuple[str, str, str], body: Obj) -> None:
        try:
            self.rest.create(body)
        except KubeError:
            with self._lock:
                self.failed += 1
                # the Event does not exist: the next occurrence creates it instead of patching nothing
                if (hit := self._series.get(key)) is not None and hit[0] == body["metadata"]["name"]:
                    del self._series[key]
            return
        with self._lock:
            self.sent += 1

    def _patch(self, ns: str, name: str, patch: Obj) -> None:
        try:
            self.rest.merge_patch("events.k8s.io/v1", "Event", ns, name, patch)
        except KubeError:
            with self._lock:
                self.failed += 1

    def flush(self, timeout_s: float = 10.0) -> bool:
        """Wait until every queued write is done (tests and shutdown); False if ``timeout_s`` ran out."""
        deadline = time.monotonic() + timeout_s
        with self._queue.all_tasks_done:
            while self._queue.unfinished_tasks:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._queue.all_tasks_done.wait(left)
        return True

    def close(self, timeout_s: float = 2.0) -> None:
        """Write what is queued (for at most ``timeout_s``), then stop the writer thread."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            writer = self._writer
        if writer is None:
            return
        self.flush(timeout_s)
        try:
            self._queue.put(None, timeout=timeout_s)
        except queue.Full:
            return  # the daemon writer dies with the process
        writer.join(timeout_s)

    def stats(self) -> dict[str, int]:
        with self._lock:
            return {"sent": self.sent, "dropped": self.dropped, "failed": self.failed,
                    "queued": self._queue.qsize(), "series": len(self._series)}
