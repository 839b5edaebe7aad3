"""List+watch caches of Nodes, Pods and migscale's workloads: the backend's eyes on the cluster.

Place in the loop: the "observe" half of the Kubernetes backend. Each
``Informer`` keeps one resource (optionally narrowed by namespace and
selectors) in a local store, the way client-go's reflector does (behaviour
and sources in docs/kubernetes.md):

1. **list** once and remember the list's ``resourceVersion``;
2. **watch** from that version with ``allowWatchBookmarks``; every event
   moves the remembered version forward, a BOOKMARK event moves it without
   an object, so a watch that restarts after the server closed it (its
   ``timeoutSeconds``, randomised between ``watch_timeout_s`` and twice that
   so a fleet of controllers does not reconnect at once) asks only for what
   it has not seen;
3. on **410 Gone/Expired** (the server no longer holds that version) list
   again and replace the store. On any other failure wait (1 s doubling to
   ``max_backoff_s``), then, as client-go's reflector does, watch again from
   the same version only after a lost connection or a 429; after any other
   error (an ERROR event or an HTTP status: 500, 403, ...) and after a watch
   the server ended within a second without an event, list again: the
   version the watch asked for is then not known to be good.

A tick therefore reads memory, not the API server: at 1,000 nodes a steady
tick sends no list at all. Readers get a snapshot of the store
(``items()``); stored objects are replaced, never changed in place, so a
snapshot stays consistent while the watch moves on. ``version`` counts
changes, which lets the inventory skip rebuilding what did not change.
``managedFields`` are dropped on the way in (client-go's transform does the
same): they are large and nobody here reads them.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable, Hashable, Mapping
from typing import Any

from autoscaler.act.kubernetes.client import Expired, KubeError, KubeRest

Obj = dict[str, Any]
log = logging.getLogger("migscale.informer")


def obj_key(obj: Obj) -> str:
    meta = obj.get("metadata") or {}
    ns = meta.get("namespace")
    return f"{ns}/{meta.get('name')}" if ns else str(meta.get("name"))


def _slim(obj: Obj) -> Obj:
    meta = obj.get("metadata")
    if isinstance(meta, dict) and "managedFields" in meta:
        meta = dict(meta)
        meta.pop("managedFields")
        obj = {**obj, "metadata": meta}
    return obj


class _ShortWatch(KubeError):
    """The server ended a watch within a second and sent nothing: not a normal timeout."""


# a watch shorter than this, without an event, is a failure (client-go: "very short watch")
SHORT_WATCH_S = 1.0
# failures after which the informer keeps watching from its version: nothing was refused
_KEEP_VERSION = (0, 429)


class Informer:
    def __init__(
        self,
        rest: KubeRest,
        api_version: str,
        kind: str,
        namespace: str | None = None,
        *,
        label_selector: str | None = None,
        field_selector: str | None = None,
        watch_timeout_s: float = 300.0,
        max_backoff_s: float = 30.0,
        optional: bool = False,
    ) -> None:
        self.rest = rest
        self.api_version = api_version
        self.kind = kind
        self.namespace = namespace
        self.label_selector = label_selector
        self.field_selector = field_selector
        self.watch_timeout_s = watch_timeout_s
        self.max_backoff_s = max_backoff_s
        # optional: a CRD kind that may not be installed (404 on list): an empty, synced store
        self.optional = optional
        self.absent = False
        self.resource_version = ""
        self.version = 0  # bumped on every change of the store
        self.lists = 0
        self.watches = 0
        self.expired = 0
        self.bookmarks = 0
        self.last_error: str | None = None
        self.handlers: list[Callable[[str, Obj], None]] = []  # (event type, object), on the watch thread
        self._store: dict[str, Obj] = {}
        self._groups: dict[str, tuple[int, dict[Hashable, list[Obj]]]] = {}  # name -> (version, groups)
        self._lock = threading.Lock()
        self._synced = threading.Event()
        self._stop = threading.Event()
        self._response: Any = None
        self._thread: threading.Thread | None = None

    # ------------------------------------------------------------ reading

    @property
    def synced(self) -> bool:
        return self._synced.is_set()

    def wait_synced(self, timeout_s: float) -> bool:
        return self._synced.wait(timeout_s)

    def items(self) -> list[Obj]:
        with self._lock:
            return list(self._store.values())

    def grouped(self, name: str, key: Callable[[Obj], Hashable | None]) -> Mapping[Hashable, list[Obj]]:
        """The store grouped by ``key`` (client-go's indexers), named ``name``; rebuilt
        only when the store changed since the last call. Callers must not modify it.

        Why: the rollout and the repartitioner ask for one workload's or one node's
        pods dozens of times a tick; at 1,500 pods a scan each time was most of a tick."""
        with self._lock:
            got = self._groups.get(name)
            if got is not None and got[0] == self.version:
                return got[1]
            out: dict[Hashable, list[Obj]] = {}
            for obj in self._store.values():
                k = key(obj)
                if k is not None:
                    out.setdefault(k, []).append(obj)
            self._groups[name] = (self.version, out)
            return out

    def get(self, name: str, namespace: str | None = None) -> Obj | None:
        key = f"{namespace}/{name}" if namespace else name
        with self._lock:
            return self._store.get(key)

    def __len__(self) -> int:
        with self._lock:
            return len(self._store)

    # ------------------------------------------------------------ running

    def start(self) -> Informer:
        if self._thread is None:
            self._thread = threading.Thread(target=self.run, name=f"informer-{self.kind}", daemon=True)
            self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        resp = self._response
        if resp is not None:
            try:
                resp.shutdown()  # interrupts the blocked read of the watch stream
            except Exception as exc:  # noqa: BLE001 - already closed: nothing to interrupt
                log.debug("%s informer: shutdown: %s", self.kind, exc)
        if self._thread is not None:
            self._thread.join(timeout=5)

    def run(self) -> None:
        failures = 0
        while not self._stop.is_set():
            try:
                if not self.resource_version:
                    self.relist()
                    if self.absent:
                        self._stop.wait(self.max_backoff_s)  # the CRD may be installed later
                        self.resource_version = ""
                        continue
                self.watch_once()
                failures = 0
            except Expired as exc:
                self.expired += 1
                self.last_error = str(exc)
                self.resource_version = ""  # 410: this version is gone, list again
            except KubeError as exc:
                if self._stop.is_set():
                    break
                failures += 1
                self.last_error = str(exc)
                if isinstance(exc, _ShortWatch) or exc.status not in _KEEP_VERSION:
                    self.resource_version = ""  # list again after the wait
                delay = min(self.max_backoff_s, 2.0 ** (failures - 1)) * (0.5 + random.random() / 2)
                log.info("%s informer: %s; retrying in %.1fs", self.kind, exc, delay)
                self._stop.wait(delay)

    def relist(self) -> None:
        """List and replace the store (start, or after a 410)."""
        try:
            items, rv = self.rest.list_at(
                self.api_version,
                self.kind,
                self.namespace,
                label_selector=self.label_selector,
                field_selector=self.field_selector,
            )
        except KubeError as exc:
            if self.optional and exc.status == 404:
                with self._lock:
                    self._store = {}
                    self.version += 1
                self.absent = True
                self._synced.set()
                return
            raise
        self.lists += 1
        self.absent = False
        fresh = {obj_key(o): _slim(o) for o in items}
        with self._lock:
            old = self._store
            self._store = fresh
            self.version += 1
        self.resource_version = rv
        self._synced.set()
        for key, obj in old.items():
            if key not in fresh:
                self._notify("DELETED", obj)
        for obj in fresh.values():
            self._notify("ADDED", obj)

    def watch_once(self) -> None:
        """One watch request, applied to the store until the server ends it."""
        self.watches += 1
        timeout = self.watch_timeout_s * (1.0 + random.random())
        started, events = time.monotonic(), 0

        def opened(resp: Any) -> None:
            self._response = resp

        try:
            for event in self.rest.watch(
                self.api_version,
                self.kind,
                self.namespace,
                self.resource_version,
                label_selector=self.label_selector,
                field_selector=self.field_selector,
                timeout_s=int(timeout),
                on_open=opened,
            ):
                if self._stop.is_set():
                    return
                events += 1
                self.apply_event(event)
        finally:
            self._response = None
        # half the asked-for timeout bounds the threshold only for sub-second timeouts (tests)
        if events == 0 and time.monotonic() - started < min(SHORT_WATCH_S, timeout / 2) and not self._stop.is_set():
            raise _ShortWatch(0, f"{self.kind} watch ended after {time.monotonic() - started:.2f}s with no event")

    def apply_event(self, event: Obj) -> None:
        kind = event.get("type")
        obj = event.get("object") or {}
        rv = str((obj.get("metadata") or {}).get("resourceVersion") or "")
        if kind == "BOOKMARK":
            self.bookmarks += 1
        elif kind in ("ADDED", "MODIFIED", "DELETED"):
            obj = _slim(obj)
            key = obj_key(obj)
            with self._lock:
                if kind == "DELETED":
                    self._store.pop(key, None)
                else:
                    self._store[key] = obj
                self.version += 1
            self._notify(kind, obj)
        if rv:
            self.resource_version = rv

    def _notify(self, kind: str, obj: Obj) -> None:
        for fn in list(self.handlers):
            try:
                fn(kind, obj)
            except Exception:
                log.exception("%s informer handler raised", self.kind)

    def stats(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "objects": len(self),
            "synced": self.synced,
            "lists": self.lists,
            "watches": self.watches,
            "expired": self.expired,
            "bookmarks": self.bookmarks,
            "resource_version": self.resource_version,
            "last_error": self.last_error,
        }


def wait_all_synced(informers: list[Informer], timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    return all(i.wait_synced(max(0.0, deadline - time.monotonic())) for i in informers)
