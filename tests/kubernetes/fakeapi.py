"""An emulated Kubernetes API server: what the backend tests, the end-to-end test and the benchmark talk to.

No real API server can be installed on these machines, so this one speaks the
REST protocol the official ``kubernetes`` client uses, on 127.0.0.1 and a free
port, with the semantics migscale relies on (sources in docs/kubernetes.md).
It is longer than the usual module because the REST verbs, the watch stream
and the write path share one store and one lock; splitting them would spread
one invariant (every change gets one resourceVersion and one watch event)
over several files.

- **Store**: objects keyed by (group, plural, namespace, name); one global
  resourceVersion; ``generation`` bumped on spec changes; server-side
  defaulting before validation (``fakesem``); built-in kinds validated with
  kubernetes-validate (422 Invalid), CRD kinds with the stored CRD schemas;
  kinds given in ``crds`` (migscale's MigModel) are admitted as the API
  server admits a custom resource: pruned, defaulted, structural schema and
  CEL rules (``crdvalidate.py``), 422 Invalid with one ``details.causes``
  entry per field, unknown fields 400 under ``fieldValidation=Strict``.
- **Views**: ``views`` answer what the REST verbs do not (discovery, the
  OpenAPI document and Tables the real ``kubectl`` asks for: ``kubectl_views.py``).
- **Verbs**: create (409 AlreadyExists), get/replace/patch/delete of a
  missing object (404), replace or patch with a stale
  ``metadata.resourceVersion`` (409 Conflict), JSON merge patch (strategic
  merge patch is treated as a merge patch, which is exact for the maps
  migscale patches: labels, annotations, ``spec.unschedulable``).
- **Subresources**: ``status`` (a main-resource update keeps the stored
  status; a status update changes nothing else), ``scale`` (Deployment,
  ReplicaSet, LeaderWorkerSet), ``pods/<name>/eviction`` checked against the
  PodDisruptionBudget's status as the API server does
  (pkg/registry/core/pod/storage/eviction.go): a pending, finished or
  terminating pod goes at once; a pod that is not Ready goes uncharged under
  ``unhealthyPodEvictionPolicy: AlwaysAllow``, or while the budget is met and
  wants at least one healthy pod; otherwise 429 while ``disruptionsAllowed``
  is 0 or the budget is not yet observed, 500 for a pod under two budgets;
  each charged eviction decrements the budget and records the pod in
  ``disruptedPods``.
- **Updates** are validated against the stored object as the API server's
  strategies do (``fakesem.update_errors``; 422 Invalid, one cause per
  field): a Pod's spec changes only where ValidatePodUpdate allows it
  (images, activeDeadlineSeconds, added tolerations, removed scheduling
  gates, and a gated pod's nodeSelector/node affinity narrowed), a
  Deployment's or ReplicaSet's selector and a Service's cluster IPs are
  immutable (a replace without ``clusterIP`` keeps it), ``metadata.uid``
  too; a body or patch naming another object than the URL is 400. Events
  are checked as pkg/apis/core/validation/events.go does (an Event about a
  Node only in "default" or "kube-system"), a budget's
  ``unhealthyPodEvictionPolicy`` against its two values.
- **Field selectors** accept only the labels each kind registers (400
  BadRequest otherwise) and compare the strings the API server derives
  (booleans "true"/"false", a missing one "false"): ``fakesem.FIELD_LABELS``.
- **Watch**: ``?watch=1`` streams newline-delimited events over chunked HTTP
  from a per-resource history window. ``resourceVersion`` unset or "0" sends
  synthetic ADDED events first; an older version than the window holds gets
  an ERROR event carrying a 410 Expired Status and the stream ends;
  ``allowWatchBookmarks`` adds BOOKMARK events (an object carrying only
  ``metadata.resourceVersion``) every ``bookmark_s`` and before the stream
  closes at ``timeoutSeconds``. An object that stops (starts) matching a
  watch's selector is sent as DELETED (ADDED), as the watch cache does.
- **Deletion**: a Pod bound to a node is deleted gracefully when
  ``graceful_pods`` (``deletionTimestamp`` set; the emulated kubelet removes
  it); everything else goes at once. Owner references are garbage-collected
  in the background policy (dependents go once no owner is left) or orphaned
  (``propagationPolicy: Orphan``).

Tests observe it through ``requests``, ``field_writers`` and ``get``/``list``,
and change it through ``put_object`` (no validation: another controller's
write) or the write methods emulated controllers use (``create_obj``,
``update_obj``, ``delete_obj``, ``remove_now``). ``hooks`` run after every
write; ``fail_next``/``before``/``blocked_evictions`` inject faults.
"""

from __future__ import annotations

import bisect
import json
import re
import threading
import time
import uuid
from collections import Counter, deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import datetime, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlparse

import kubernetes_validate
from fakesem import (
    FieldError,
    apply_defaults,
    changed_fields,
    check_field_selector,
    copy_obj,
    event_errors,
    event_update_errors,
    fields_match,
    manager_of,
    match_labels_selector,
    pdb_errors,
    selector_matches,
    service_allocated,
    update_errors,
)

Obj = dict[str, Any]
Key = tuple[str, str, "str | None", str]


@dataclass(frozen=True)
class Res:
    kind: str
    namespaced: bool
    status: bool = False  # has a status subresource
    scale: bool = False  # has a scale subresource


RESOURCES: dict[tuple[str, str], Res] = {
    ("", "nodes"): Res("Node", False, status=True),
    ("", "namespaces"): Res("Namespace", False, status=True),
    ("", "pods"): Res("Pod", True, status=True),
    ("", "services"): Res("Service", True, status=True),
    ("", "configmaps"): Res("ConfigMap", True),
    ("", "events"): Res("Event", True),
    ("apps", "deployments"): Res("Deployment", True, status=True, scale=True),
    ("apps", "replicasets"): Res("ReplicaSet", True, status=True, scale=True),
    ("policy", "poddisruptionbudgets"): Res("PodDisruptionBudget", True, status=True),
    ("autoscaling", "horizontalpodautoscalers"): Res("HorizontalPodAutoscaler", True, status=True),
    ("coordination.k8s.io", "leases"): Res("Lease", True),
    ("events.k8s.io", "events"): Res("Event", True),
    ("monitoring.coreos.com", "podmonitors"): Res("PodMonitor", True),
    ("leaderworkerset.x-k8s.io", "leaderworkersets"): Res("LeaderWorkerSet", True, status=True, scale=True),
    ("migscale.io", "migmodels"): Res("MigModel", True, status=True),
}
KIND_TO_RES = {(g, r.kind): (g, p) for (g, p), r in RESOURCES.items() if not (g == "" and r.kind == "Event")}

_PATH = re.compile(
    r"^/(?:api/(?P<cv>v1)|apis/(?P<g>[^/]+)/(?P<v>[^/]+))"
    r"(?:/namespaces/(?P<ns>[^/]+))?/(?P<plural>[^/]+)(?:/(?P<name>[^/]+))?(?:/(?P<sub>[^/]+))?$"
)
REASONS = {400: "BadRequest", 404: "NotFound", 405: "MethodNotAllowed", 409: "Conflict", 410: "Expired",
           415: "UnsupportedMediaType", 422: "Invalid", 429: "TooManyRequests", 500: "InternalError",
           503: "ServiceUnavailable"}


def iso(t: float) -> str:
    return datetime.fromtimestamp(t, timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def status(code: int, reason: str, message: str, details: Obj | None = None) -> Obj:
    out = {"kind": "Status", "apiVersion": "v1", "metadata": {},
           "status": "Failure" if code >= 400 else "Success", "message": message, "reason": reason, "code": code}
    if details:
        out["details"] = details
    return out


class ApiError(Exception):
    def __init__(self, code: int, reason: str, message: str, details: Obj | None = None) -> None:
        super().__init__(message)
        self.body = status(code, reason, message, details)
        self.code = code


def invalid(obj: Obj, errs: list[FieldError]) -> ApiError:
    """422 Invalid as apierrors.NewInvalid writes it: one ``details.causes`` entry per field error,
    the message ``<Kind>[.<group>] "<name>" is invalid: <errors>``."""
    group = obj.get("apiVersion", "").rpartition("/")[0]
    name = (obj.get("metadata") or {}).get("name")
    texts = [f"{path}: {body}" for _reason, path, body in errs]
    what = f'{obj.get("kind")}{"." + group if group else ""} "{name}" is invalid'
    return ApiError(422, "Invalid", f"{what}: {texts[0] if len(texts) == 1 else '[' + ', '.join(texts) + ']'}",
                    {"name": name, "group": group, "kind": obj.get("kind"),
                     "causes": [{"reason": r, "message": b, "field": f} for r, f, b in errs]})


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch."""
    if not isinstance(patch, dict):
        return copy_obj(patch) if isinstance(patch, (dict, list)) else patch
    out = copy_obj(target) if isinstance(target, dict) else {}
    for k, v in patch.items():
        if v is None:
            out.pop(k, None)
        else:
            out[k] = merge_patch(out.get(k), v)
    return out


@dataclass
class Request:
    method: str
    path: str
    user_agent: str
    status: int = 0
    query: str = ""


@dataclass
class _Event:
    rv: int
    type: str  # ADDED | MODIFIED | DELETED
    obj: Obj
    prev: Obj | None


class FakeKube:
    """The store and the semantics; ``serve()`` puts it on a port."""

    def __init__(
        self,
        version: str = "1.30",
        crd_validator: Callable[[Obj], list[str]] | None = None,
        *,
        crds: dict[tuple[str, str], Any] | None = None,
        history: int = 2000,
        bookmark_s: float = 60.0,
        graceful_pods: bool = False,
        now: Callable[[], float] = time.time,
    ) -> None:
        self.version = version
        self.crd_validator = crd_validator
        # (apiVersion, kind) -> a crdvalidate.CrdValidator: structural schema, defaults and CEL rules
        self.crds = dict(crds or {})
        self.history = history
        self.bookmark_s = bookmark_s
        self.graceful_pods = graceful_pods
        self.now = now
        self.objects: dict[Key, Obj] = {}
        self._by_type: dict[tuple[str, str], dict[Key, Obj]] = {}
        self._owners: dict[str, set[Key]] = {}  # owner uid -> dependents
        self._uids: dict[str, Key] = {}
        self._events: dict[tuple[str, str], list[_Event]] = {}
        self._dropped: dict[tuple[str, str], int] = {}  # highest rv no longer in the window
        self.requests: deque[Request] = deque(maxlen=200_000)
        self.request_counts: Counter[tuple[str, str]] = Counter()  # (manager, method) -> n
        self.field_writers: dict[tuple[str, str | None, str], dict[str, set[str]]] = {}
        self.hooks: list[Callable[[FakeKube, str, Obj], None]] = []
        self.blocked_evictions: set[str] = set()
        self.fail_next: list[tuple[str, str, int]] = []  # (method, path-substring, code), each once
        self.before: list[Callable[[str, str], None]] = []  # called before a request is handled
        # (server, method, path, Accept) -> (code, body) or None: answers beyond the REST verbs
        # (discovery, Tables for kubectl: kubectl_views.py)
        self.views: list[Callable[[FakeKube, str, str, str], tuple[int, Obj] | None]] = []
        self._rv = 0
        self._ips = [0]
        self.lock = threading.RLock()
        self.cond = threading.Condition(self.lock)
        self.closed = False
        self._server: ThreadingHTTPServer | None = None

    # ------------------------------------------------------------ store

    @property
    def resource_version(self) -> int:
        return self._rv

    def _res_of(self, obj: Obj) -> tuple[str, str]:
        group = obj["apiVersion"].rpartition("/")[0]
        if obj["kind"] == "Event":
            return (group, "events")
        return KIND_TO_RES[(group, obj["kind"])]

    def key_of(self, obj: Obj) -> Key:
        g, p = self._res_of(obj)
        meta = obj["metadata"]
        return (g, p, meta.get("namespace", "default") if RESOURCES[(g, p)].namespaced else None, meta["name"])

    def admit_custom(self, obj: Obj, field_validation: str = "Strict") -> Obj:
        """A custom resource as the API server stores it: pruned and defaulted, or 422 Invalid.

        Unknown fields fail the request only under ``fieldValidation=Strict``
        (what kubectl sends; 400 BadRequest), else they are pruned. Any other
        problem is 422 Invalid with one cause per field, as the API server's
        Status ``details.causes`` lists them.
        """
        v = self.crds.get((obj.get("apiVersion", ""), obj.get("kind", "")))
        if v is None:
            return obj
        problems = v.validate(obj)
        unknown = [p for p in problems if ": unknown field, got " in p]
        name = (obj.get("metadata") or {}).get("name")
        what = f'{obj["kind"]}.{obj["apiVersion"].partition("/")[0]} "{name}"'
        if unknown and field_validation == "Strict":
            raise ApiError(400, "BadRequest", f"strict decoding error: {'; '.join(unknown)}")
        rest = [p for p in problems if p not in unknown]
        if rest:
            causes = [{"reason": "FieldValueInvalid", "field": p.partition(": ")[0], "message": p.partition(": ")[2]}
                      for p in rest]
            details = {"name": name, "group": obj["apiVersion"].partition("/")[0], "kind": obj["kind"],
                       "causes": causes}
            raise ApiError(422, "Invalid", f"{what} is invalid: {'; '.join(rest)}", details)
        stored = v.default(obj)
        stored["metadata"] = obj["metadata"]  # ObjectMeta is the API server's own, never pruned by a CRD schema
        return stored

    def validate(self, obj: Obj) -> None:
        if (obj.get("apiVersion", ""), obj.get("kind", "")) in self.crds:
            return  # admitted by admit_custom (schema, defaults, CEL)
        try:
            kubernetes_validate.validate(obj, self.version, strict=True)
        except kubernetes_validate.SchemaNotFoundError:
            problems = self.crd_validator(obj) if self.crd_validator else []
            if problems:
                raise ApiError(422, "Invalid", "; ".join(problems)) from None
        except kubernetes_validate.ValidationError as exc:
            name = obj.get("metadata", {}).get("name")
            raise ApiError(422, "Invalid", f"{obj.get('kind')} {name}: {exc.message}") from None

    def _commit(self, key: Key, obj: Obj | None, verb: str, manager: str) -> Obj | None:
        """The one write path: new resourceVersion, store, owner index, field audit, watch event, hooks."""
        with self.lock:
            prev = self.objects.get(key)
            self._rv += 1
            res = key[:2]
            typed = self._by_type.setdefault(res, {})
            if prev is not None:
                for ref in prev["metadata"].get("ownerReferences") or []:
                    self._owners.get(ref.get("uid"), set()).discard(key)
            if prev is not None:
                self._uids.pop(prev["metadata"].get("uid", ""), None)
            if obj is None:
                self.objects.pop(key, None)
                typed.pop(key, None)
                last = copy_obj(prev) if prev is not None else None
                if last is not None:
                    last["metadata"]["resourceVersion"] = str(self._rv)
                event = _Event(self._rv, "DELETED", last, prev) if last is not None else None
            else:
                obj["metadata"]["resourceVersion"] = str(self._rv)
                stored = copy_obj(obj)
                self.objects[key] = stored
                typed[key] = stored
                self._uids[stored["metadata"].get("uid", "")] = key
                for ref in stored["metadata"].get("ownerReferences") or []:
                    self._owners.setdefault(ref.get("uid"), set()).add(key)
                event = _Event(self._rv, "ADDED" if prev is None else "MODIFIED", stored, prev)
            if prev is not None:
                ident = (event.obj["kind"] if event else prev["kind"], key[2], key[3])
                changed = changed_fields(prev, obj)
                if changed:
                    audit = self.field_writers.setdefault(ident, {})
                    for path in changed:
                        audit.setdefault(path, set()).add(manager)
            if event is not None:
                log = self._events.setdefault(res, [])
                log.append(event)
                if len(log) > 2 * self.history:
                    cut = len(log) - self.history
                    self._dropped[res] = log[cut - 1].rv
                    del log[:cut]
            self.cond.notify_all()
        if event is not None:
            for hook in list(self.hooks):
                hook(self, verb, copy_obj(event.obj))
        return obj

    def expire_history(self, kind: str, group: str = "") -> None:
        """Drop the watch window of one resource (etcd compaction): older watches get 410."""
        res = KIND_TO_RES[(group, kind)]
        with self.lock:
            self._events[res] = []
            self._dropped[res] = self._rv
            self.cond.notify_all()

    def put_object(self, obj: Obj, manager: str = "test") -> Obj:
        """Seed or overwrite an object directly (no defaulting, no validation), as another controller would."""
        with self.lock:
            obj = copy_obj(obj)
            key = self.key_of(obj)
            meta = obj.setdefault("metadata", {})
            if key[2] is not None:
                meta["namespace"] = key[2]
            prev = self.objects.get(key)
            meta.setdefault("uid", prev["metadata"]["uid"] if prev else str(uuid.uuid4()))
            meta.setdefault("creationTimestamp", prev["metadata"]["creationTimestamp"] if prev else iso(self.now()))
            meta.setdefault("generation", 1)
            self._commit(key, obj, "PUT" if prev else "POST", manager)
            return copy_obj(obj)

    def get(self, kind: str, name: str, namespace: str | None = "default") -> Obj | None:
        with self.lock:
            for (g, p), r in RESOURCES.items():
                if r.kind == kind:
                    obj = self.objects.get((g, p, namespace if r.namespaced else None, name))
                    if obj is not None:
                        return copy_obj(obj)
        return None

    def list(self, kind: str, namespace: str | None = None) -> list[Obj]:
        with self.lock:
            return [copy_obj(o) for (g, p), typed in self._by_type.items() if RESOURCES[(g, p)].kind == kind
                    for k, o in typed.items() if namespace is None or k[2] == namespace]

    def view(self, kind: str, group: str = "") -> list[Obj]:
        """The stored objects of one kind, not copied: for emulated controllers, read-only."""
        with self.lock:
            return list(self._by_type.get(KIND_TO_RES[(group, kind)], {}).values())

    def writes(self, user_agent: str | None = None) -> list[Request]:
        return [r for r in list(self.requests) if r.method in ("POST", "PUT", "PATCH", "DELETE")
                and (user_agent is None or r.user_agent == user_agent)]

    # ------------------------------------------------------------ writes (REST and controllers)

    def create_obj(self, obj: Obj, manager: str = "test", *, validate: bool = True,
                   field_validation: str = "Strict") -> Obj:
        with self.lock:
            meta = obj.setdefault("metadata", {})
            if not meta.get("name") and meta.get("generateName"):
                meta["name"] = meta["generateName"] + uuid.uuid4().hex[:5]
            if not meta.get("name"):
                raise ApiError(422, "Invalid", "metadata.name: Required value")
            key = self.key_of(obj)
            if key[2] is not None:
                meta["namespace"] = key[2]
            if key in self.objects:
                raise ApiError(409, "AlreadyExists", f'{key[1]}.{key[0] or "core"} "{key[3]}" already exists')
            if meta.get("resourceVersion"):
                raise ApiError(422, "Invalid", "metadata.resourceVersion: must not be set on create")
            apply_defaults(obj, self._ips)
            if validate:
                obj = self.admit_custom(obj, field_validation)
                meta = obj["metadata"]
                self.validate(obj)
                errs = self._kind_errors(key, obj, None)
                if errs:
                    raise invalid(obj, errs)
            meta["uid"] = str(uuid.uuid4())
            meta["creationTimestamp"] = iso(self.now())
            meta["generation"] = 1
            if obj["kind"] == "Pod":
                obj.setdefault("status", {"phase": "Pending"})
            self._commit(key, obj, "POST", manager)
            return copy_obj(obj)

    def update_obj(self, obj: Obj, manager: str = "test", *, sub: str | None = None, check_rv: bool = True,
                   validate: bool = True, field_validation: str = "Strict") -> Obj:
        """PUT semantics: main resource (status kept) or ``sub='status'`` (only status changes)."""
        with self.lock:
            key = self.key_of(obj)
            current = self.objects.get(key)
            if current is None:
                raise ApiError(404, "NotFound", f'{key[1]}.{key[0] or "core"} "{key[3]}" not found')
            rv = obj.get("metadata", {}).get("resourceVersion")
            if check_rv and rv and rv != current["metadata"]["resourceVersion"]:
                raise self._conflict(key)
            res = RESOURCES[key[:2]]
            if sub == "status":
                new = copy_obj(current)
                new["status"] = copy_obj(obj.get("status") or {})
                if validate:
                    new = self.admit_custom(new, field_validation)
            else:
                new = copy_obj(obj)
                meta = new.setdefault("metadata", {})
                # rest.BeforeUpdate: an empty uid is the stored one (a different one is refused below);
                # the timestamps are the stored ones whatever the client sent
                if not meta.get("uid") or not validate:
                    meta["uid"] = current["metadata"].get("uid")
                for k in ("creationTimestamp", "deletionTimestamp", "deletionGracePeriodSeconds"):
                    if k in current["metadata"]:
                        meta[k] = current["metadata"][k]
                if key[2] is not None:
                    meta["namespace"] = key[2]
                if res.status:
                    if "status" in current:
                        new["status"] = copy_obj(current["status"])
                    else:
                        new.pop("status", None)
                if new["kind"] == "Service":
                    service_allocated(new, current)
                apply_defaults(new, self._ips)
                if validate:
                    new = self.admit_custom(new, field_validation)
                    meta = new["metadata"]
                    self.validate(new)
                    # the stored object as the API server decodes it from etcd: defaulted (one
                    # seeded here by put_object, another controller's write, may not be)
                    stored = copy_obj(current)
                    apply_defaults(stored, [0])
                    errs = self._kind_errors(key, new, stored)
                    if errs:
                        raise invalid(new, errs)
                gen = current["metadata"].get("generation", 1)
                meta["generation"] = gen + 1 if new.get("spec") != current.get("spec") else gen
            self._commit(key, new, "PUT", manager)
            return copy_obj(new)

    @staticmethod
    def _kind_errors(key: Key, new: Obj, old: Obj | None) -> list[FieldError]:
        """The API server's own validation beyond the OpenAPI schema, for a create (``old`` None)
        or an update: immutable fields (fakesem.update_errors), Events, PodDisruptionBudgets."""
        group, plural = key[0], key[1]
        errs: list[FieldError] = [] if old is None else update_errors(group, new["kind"], new, old)
        if plural == "events":
            if old is None:
                errs += event_errors(new, events_api=group == "events.k8s.io")
            elif group == "events.k8s.io":
                errs += event_update_errors(new, old)
            else:
                errs += event_errors(new, events_api=False, create=False)
        elif plural == "poddisruptionbudgets":
            errs += pdb_errors(new)
        return errs

    def delete_obj(self, key: Key, manager: str = "test", *, grace_s: float | None = None,
                   policy: str | None = None) -> Obj:
        with self.lock:
            current = self.objects.get(key)
            if current is None:
                raise ApiError(404, "NotFound", f'{key[1]}.{key[0] or "core"} "{key[3]}" not found')
            if current["kind"] == "Pod" and self.graceful_pods:
                spec = current.get("spec") or {}
                grace = spec.get("terminationGracePeriodSeconds", 30) if grace_s is None else grace_s
                phase = (current.get("status") or {}).get("phase")
                if spec.get("nodeName") and grace > 0 and phase not in ("Succeeded", "Failed"):
                    if current["metadata"].get("deletionTimestamp"):
                        return copy_obj(current)  # already terminating: deleting again changes nothing
                    new = copy_obj(current)
                    new["metadata"]["deletionTimestamp"] = iso(self.now() + grace)
                    new["metadata"]["deletionGracePeriodSeconds"] = int(grace)
                    self._commit(key, new, "DELETE", manager)
                    return new
            return self.remove_now(key, manager, policy=policy)

    def remove_now(self, key: Key, manager: str = "test", *, policy: str | None = None) -> Obj:
        """Remove the object from the store (the kubelet's final delete of a terminated pod), then GC."""
        with self.lock:
            current = self.objects.get(key)
            if current is None:
                raise ApiError(404, "NotFound", f'{key[1]} "{key[3]}" not found')
            self._commit(key, None, "DELETE", manager)
            uid = current["metadata"].get("uid")
            for dep in sorted(self._owners.pop(uid, set()), key=str):
                obj = self.objects.get(dep)
                if obj is None:
                    continue
                refs = obj["metadata"].get("ownerReferences") or []
                rest = [r for r in refs if r.get("uid") != uid]
                alive = [r for r in rest if r.get("uid") in self._uids]
                if policy == "Orphan" or alive:
                    new = copy_obj(obj)
                    new["metadata"]["ownerReferences"] = rest
                    self._commit(dep, new, "PUT", "generic-garbage-collector")
                else:
                    self.delete_obj(dep, "generic-garbage-collector")
            return status(200, "", f"{key[3]} deleted") | {"status": "Success"}

    def _conflict(self, key: Key) -> ApiError:
        return ApiError(409, "Conflict", f'Operation cannot be fulfilled on {key[1]} "{key[3]}": the object has '
                        "been modified; please apply your changes to the latest version and try again")

    def evict(self, key: Key, manager: str) -> Obj:
        with self.lock:
            pod = self.objects.get(key)
            if pod is None:
                raise ApiError(404, "NotFound", f'pods "{key[3]}" not found')
            if key[3] in self.blocked_evictions:
                raise ApiError(429, "TooManyRequests",
                               "Cannot evict pod as it would violate the pod's disruption budget.")
            # canIgnorePDB: a terminating, pending or finished pod goes without looking at a budget
            phase = (pod.get("status") or {}).get("phase")
            if pod["metadata"].get("deletionTimestamp"):
                return status(201, "", f"pod {key[3]} is already terminating") | {"status": "Success"}
            if phase in ("Succeeded", "Failed", "Pending"):
                self.delete_obj(key, manager)
                return status(201, "", f"pod {key[3]} evicted") | {"status": "Success"}
            lbls = pod["metadata"].get("labels") or {}
            # a budget without a selector (nil) selects nothing; an empty one, every pod of its namespace
            pdbs = [p for (_g, _p, ns, _n), p in self._by_type.get(("policy", "poddisruptionbudgets"), {}).items()
                    if ns == key[2] and (p.get("spec") or {}).get("selector") is not None
                    and selector_matches(match_labels_selector(p["spec"]["selector"]), lbls)]
            if len(pdbs) > 1:
                raise ApiError(500, "InternalError", "This pod has more than one PodDisruptionBudget, "
                               "which the eviction subresource does not support.")
            if pdbs:
                self._charge_budget(pdbs[0], pod, manager)
            self.delete_obj(key, manager)
            return status(201, "", f"pod {key[3]} evicted") | {"status": "Success"}

    def _charge_budget(self, pdb: Obj, pod: Obj, manager: str) -> None:
        """The budget check of pkg/registry/core/pod/storage/eviction.go: a pod that is not Ready
        goes uncharged under ``unhealthyPodEvictionPolicy: AlwaysAllow``, or (unset or
        IfHealthyBudget) while the budget is met and wants at least one healthy pod; any
        other goes through checkAndDecrement."""
        st = pdb.get("status") or {}
        name = pdb["metadata"]["name"]
        ready = any(c.get("type") == "Ready" and c.get("status") == "True"
                    for c in (pod.get("status") or {}).get("conditions") or [])
        if not ready:
            if (pdb.get("spec") or {}).get("unhealthyPodEvictionPolicy") == "AlwaysAllow":
                return
            desired = st.get("desiredHealthy", 0)
            if st.get("currentHealthy", 0) >= desired > 0:
                return
        # checkAndDecrement
        if st.get("observedGeneration", 0) < pdb["metadata"].get("generation", 1):
            raise ApiError(429, "TooManyRequests", "Cannot evict pod as it would violate the pod's disruption budget.",
                           {"causes": [{"reason": "DisruptionBudget", "message": f"The disruption budget {name} is "
                                        "still being processed by the server."}], "retryAfterSeconds": 10})
        if st.get("disruptionsAllowed", 0) < 0:
            raise ApiError(403, "Forbidden", f'poddisruptionbudget.policy "{name}" is forbidden: '
                           "pdb disruptions allowed is negative")
        if len(st.get("disruptedPods") or {}) > 2000:
            raise ApiError(403, "Forbidden", f'poddisruptionbudget.policy "{name}" is forbidden: DisruptedPods map '
                           "too big - too many evictions not confirmed by PDB controller")
        if st.get("disruptionsAllowed", 0) == 0:
            raise ApiError(429, "TooManyRequests", "Cannot evict pod as it would violate the pod's disruption budget.",
                           {"causes": [{"reason": "DisruptionBudget", "message": f"The disruption budget {name} needs "
                                        f"{st.get('desiredHealthy', 0)} healthy pods and has "
                                        f"{st.get('currentHealthy', 0)} currently"}]})
        new = copy_obj(pdb)
        new["status"]["disruptionsAllowed"] = st["disruptionsAllowed"] - 1
        new["status"].setdefault("disruptedPods", {})[pod["metadata"]["name"]] = iso(self.now())
        self._commit(self.key_of(new), new, "PUT", manager)

    # ------------------------------------------------------------ REST

    def handle(self, method: str, raw_path: str, body: bytes, content_type: str,
               user_agent: str = "") -> tuple[int, Obj | Iterator[Obj]]:
        url = urlparse(raw_path)
        q = {k: v[0] for k, v in parse_qs(url.query).items()}
        for hook in list(self.before):
            hook(method, url.path)
        for i, (m, frag, code) in enumerate(self.fail_next):
            if m == method and frag in url.path:
                del self.fail_next[i]
                return code, status(code, REASONS.get(code, "Unknown"), f"injected {code} for {method} {url.path}")
        m = _PATH.match(url.path)
        if not m:
            return 404, status(404, "NotFound", f"the server could not find the requested resource {url.path}")
        group = m.group("g") or ""
        plural, name, sub, ns = m.group("plural"), m.group("name"), m.group("sub"), m.group("ns")
        if (group, plural) not in RESOURCES:
            return 404, status(404, "NotFound", f"the server could not find the requested resource ({plural}.{group})")
        res = RESOURCES[(group, plural)]
        ns = ns if res.namespaced else None
        try:
            payload = json.loads(body) if body else None
        except ValueError:
            return 400, status(400, "BadRequest", "body is not JSON")
        manager = manager_of(user_agent)
        if name is None and method == "GET" and q.get("fieldSelector"):
            try:
                check_field_selector((group, plural), q["fieldSelector"])
            except ValueError as exc:
                return 400, status(400, "BadRequest", str(exc))
        try:
            if name is None and method == "GET" and q.get("watch") in ("1", "true"):
                return 200, self._watch((group, plural), ns, q)
            with self.lock:
                return self._dispatch(method, (group, plural, ns, name), sub, q, payload, content_type, manager)
        except ApiError as exc:
            return exc.code, exc.body

    def _dispatch(self, method: str, key: Key, sub: str | None, q: dict, payload: Any, ctype: str,
                  manager: str) -> tuple[int, Obj]:
        group, plural, ns, name = key
        res = RESOURCES[(group, plural)]
        if name is None:
            if method == "GET":
                return 200, self._list((group, plural), ns, q)
            if method == "POST":
                if not isinstance(payload, dict) or payload.get("kind") != res.kind:
                    raise ApiError(400, "BadRequest", f"body must be a {res.kind}")
                if ns is not None and payload.setdefault("metadata", {}).get("namespace", ns) != ns:
                    raise ApiError(400, "BadRequest", "the namespace of the object does not match the request")
                payload.setdefault("metadata", {})["namespace"] = ns
                if not res.namespaced:
                    payload["metadata"].pop("namespace", None)
                return 201, self.create_obj(payload, manager, field_validation=q.get("fieldValidation", "Warn"))
            raise ApiError(405, "MethodNotAllowed", f"{method} on a collection")
        if sub == "eviction" and method == "POST" and plural == "pods":
            return 201, self.evict(key, manager)
        current = self.objects.get(key)
        if current is None:
            raise ApiError(404, "NotFound", f'{plural}.{group or "core"} "{name}" not found')
        if sub == "scale" and res.scale:
            return self._scale(method, key, current, payload, ctype, manager)
        if sub not in (None, "status") or (sub == "status" and not res.status):
            raise ApiError(404, "NotFound", f"subresource {sub} not found")
        if method == "GET":
            return 200, copy_obj(current)
        if method == "DELETE":
            opts = payload if isinstance(payload, dict) else {}
            pre = opts.get("preconditions") or {}
            if pre.get("resourceVersion") and pre["resourceVersion"] != current["metadata"]["resourceVersion"]:
                raise self._conflict(key)
            grace = opts.get("gracePeriodSeconds", q.get("gracePeriodSeconds"))
            policy = opts.get("propagationPolicy") or q.get("propagationPolicy")
            return 200, self.delete_obj(key, manager, grace_s=None if grace is None else float(grace), policy=policy)
        if method == "PUT":
            if not isinstance(payload, dict):
                raise ApiError(400, "BadRequest", "body must be an object")
            self._check_name(payload, name, ns)
            if ns is not None:
                payload["metadata"]["namespace"] = ns
            payload["apiVersion"], payload["kind"] = current["apiVersion"], current["kind"]
            return 200, self.update_obj(payload, manager, sub=sub, field_validation=q.get("fieldValidation", "Warn"))
        if method == "PATCH":
            if "json-patch" in ctype:
                raise ApiError(415, "UnsupportedMediaType", "JSON patch is not supported by the emulated server")
            patch = payload or {}
            rv = (patch.get("metadata") or {}).get("resourceVersion")
            if rv is not None and rv != current["metadata"]["resourceVersion"]:
                raise self._conflict(key)
            if sub == "status":
                patch = {"status": patch.get("status") or {}}
            merged = merge_patch(current, patch)
            self._check_name(merged, name, ns)
            merged["metadata"]["resourceVersion"] = current["metadata"]["resourceVersion"]
            return 200, self.update_obj(merged, manager, sub=sub, field_validation=q.get("fieldValidation", "Warn"))
        raise ApiError(405, "MethodNotAllowed", method)

    @staticmethod
    def _check_name(obj: Obj, name: str, ns: str | None) -> None:
        """checkName (apiserver handlers/rest.go), for a PUT body and a patched object: 400 when the
        object names another object than the URL; an unset namespace is the URL's."""
        meta = obj.get("metadata") or {}
        if meta.get("name") != name:
            raise ApiError(400, "BadRequest", f"the name of the object ({meta.get('name')}) does not match "
                           f"the name on the URL ({name})")
        if ns and meta.get("namespace") and meta["namespace"] != ns:
            raise ApiError(400, "BadRequest", f"the namespace of the object ({meta['namespace']}) does not match "
                           f"the namespace on the request ({ns})")

    def _matches(self, obj: Obj, ns: str | None, q: dict, res: tuple[str, str] | None = None) -> bool:
        meta = obj["metadata"]
        if ns is not None and meta.get("namespace") != ns:
            return False
        if q.get("labelSelector") and not selector_matches(q["labelSelector"], meta.get("labels") or {}):
            return False
        return not q.get("fieldSelector") or fields_match(q["fieldSelector"], obj, res)

    def _list(self, res: tuple[str, str], ns: str | None, q: dict) -> Obj:
        r = RESOURCES[res]
        items = [copy_obj(o) for k, o in sorted(self._by_type.get(res, {}).items(), key=lambda kv: (kv[0][2] or "", kv[0][3]))
                 if self._matches(o, ns, q, res)]
        api_version = next((o["apiVersion"] for o in items), None) or (f"{res[0]}/v1" if res[0] else "v1")
        return {"apiVersion": api_version, "kind": f"{r.kind}List",
                "metadata": {"resourceVersion": str(self._rv)}, "items": items}

    def _scale(self, method: str, key: Key, current: Obj, payload: Any, ctype: str, manager: str) -> tuple[int, Obj]:
        if method in ("PUT", "PATCH"):
            body = payload or {}
            rv = (body.get("metadata") or {}).get("resourceVersion")
            if rv and rv != current["metadata"]["resourceVersion"]:
                raise self._conflict(key)
            replicas = (body.get("spec") or {}).get("replicas")
            if not isinstance(replicas, int) or replicas < 0:
                raise ApiError(422, "Invalid", f"spec.replicas: Invalid value: {replicas!r}")
            new = copy_obj(current)
            new["spec"]["replicas"] = replicas
            self.update_obj(new, manager, check_rv=False, validate=False)
            current = self.objects[key]
        elif method != "GET":
            raise ApiError(405, "MethodNotAllowed", method)
        sel = current["spec"].get("selector") or {}
        return 200, {
            "apiVersion": "autoscaling/v1",
            "kind": "Scale",
            "metadata": {"name": key[3], "namespace": key[2], "uid": current["metadata"]["uid"],
                         "resourceVersion": current["metadata"]["resourceVersion"]},
            "spec": {"replicas": current["spec"].get("replicas", 1)},
            "status": {"replicas": (current.get("status") or {}).get("replicas", 0),
                       "selector": match_labels_selector(sel) if "matchLabels" in sel or "matchExpressions" in sel
                       else ",".join(f"{k}={v}" for k, v in sorted(sel.items()))},
        }

    # ------------------------------------------------------------ watch

    def _translate(self, ev: _Event, ns: str | None, q: dict, res: tuple[str, str] | None = None) -> Obj | None:
        now_in = self._matches(ev.obj, ns, q, res)
        if ev.type == "MODIFIED":
            was_in = ev.prev is not None and self._matches(ev.prev, ns, q, res)
            if was_in and not now_in:
                return {"type": "DELETED", "object": ev.obj}
            if now_in and not was_in:
                return {"type": "ADDED", "object": ev.obj}
        return {"type": ev.type, "object": ev.obj} if now_in else None

    def _watch(self, res: tuple[str, str], ns: str | None, q: dict) -> Iterator[Obj]:
        rv_text = q.get("resourceVersion") or ""
        bookmarks = q.get("allowWatchBookmarks") in ("true", "1")
        deadline = time.monotonic() + float(q.get("timeoutSeconds") or 1800)
        kind = RESOURCES[res].kind
        api_version = f"{res[0]}/v1" if res[0] else "v1"
        with self.lock:
            if rv_text in ("", "0"):
                initial = [{"type": "ADDED", "object": copy_obj(o)} for o in self._by_type.get(res, {}).values()
                           if self._matches(o, ns, q, res)]
                last = self._rv
            else:
                try:
                    last = int(rv_text)
                except ValueError:
                    raise ApiError(400, "BadRequest", f"invalid resourceVersion {rv_text!r}") from None
                initial = []
                if last < self._dropped.get(res, 0):
                    initial = [self._expired(last, res)]

        def stream() -> Iterator[Obj]:
            nonlocal last
            yield from initial
            if initial and initial[-1]["type"] == "ERROR":
                return
            next_bookmark = time.monotonic() + self.bookmark_s
            while not self.closed:
                out: list[Obj] = []
                with self.cond:
                    if last < self._dropped.get(res, 0):
                        expired = self._expired(last, res)  # this watcher fell out of the window
                    else:
                        expired = None
                        log = self._events.get(res, [])
                        i = bisect.bisect_right(log, last, key=lambda e: e.rv)
                        if i == len(log):
                            wait = min(deadline, next_bookmark) - time.monotonic()
                            if wait > 0:
                                self.cond.wait(timeout=wait)
                            log = self._events.get(res, [])
                            i = bisect.bisect_right(log, last, key=lambda e: e.rv)
                        for ev in log[i:]:
                            last = ev.rv
                            t = self._translate(ev, ns, q, res)
                            if t is not None:
                                out.append(t)
                        now = time.monotonic()
                        if bookmarks and (now >= next_bookmark or now >= deadline):
                            last = max(last, self._rv)
                            out.append({"type": "BOOKMARK", "object": {
                                "kind": kind, "apiVersion": api_version,
                                "metadata": {"resourceVersion": str(last)}}})
                            next_bookmark = now + self.bookmark_s
                if expired is not None:
                    yield expired
                    return
                yield from out
                if time.monotonic() >= deadline:
                    return

        return stream()

    def _expired(self, rv: int, res: tuple[str, str]) -> Obj:
        oldest = self._dropped.get(res, 0) + 1
        return {"type": "ERROR", "object": status(410, "Expired", f"too old resource version: {rv} ({oldest})")}

    # ------------------------------------------------------------ server

    def serve(self, nodelay: bool = False) -> str:
        """Serve on a loopback port. ``nodelay``: send with TCP_NODELAY, as the Go API server
        does. Headers and body go out as two writes on a kept-alive connection, so with
        Nagle on (the tests' default) each answer waits for the client's delayed ACK:
        ~40 ms a request instead of ~16 ms. ``benchmarks/k8s_scale.py`` runs without it.
        The tests keep the slower timing they were written against: at 16 ms the end-to-end
        swap test exposed a race, now fixed (``KubernetesBackend.scaling_down``), and the
        quickstart transcript's plan differs (it plans while nodes are being re-cut)."""
        fake = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            disable_nagle_algorithm = nodelay

            def _do(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else b""
                agent = self.headers.get("User-Agent") or ""
                viewed = next((v for view in list(fake.views)
                               if (v := view(fake, self.command, self.path, self.headers.get("Accept") or ""))), None)
                code, payload = viewed or fake.handle(self.command, self.path, body,
                                                      self.headers.get("Content-Type") or "", agent)
                url = urlparse(self.path)
                with fake.lock:
                    fake.requests.append(Request(self.command, url.path, agent, code, url.query))
                    fake.request_counts[(manager_of(agent), self.command)] += 1
                if isinstance(payload, dict):
                    data = json.dumps(payload).encode()
                    self.send_response(code)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                    return
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()
                try:
                    for event in payload:
                        line = json.dumps(event).encode() + b"\n"
                        self.wfile.write(f"{len(line):X}\r\n".encode() + line + b"\r\n")
                        self.wfile.flush()
                    self.wfile.write(b"0\r\n\r\n")
                    self.wfile.flush()
                except (BrokenPipeError, ConnectionResetError):
                    self.close_connection = True

            do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = _do

            def log_message(self, *args: Any) -> None:  # quiet
                pass

        class Server(ThreadingHTTPServer):
            daemon_threads = True
            request_queue_size = 256

        self._server = Server(("127.0.0.1", 0), Handler)
        threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.1}, daemon=True).start()
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    def close(self) -> None:
        with self.cond:
            self.closed = True
            self.cond.notify_all()
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
