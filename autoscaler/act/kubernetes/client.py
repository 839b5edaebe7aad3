"""A thin dict-in, dict-out layer over the official ``kubernetes`` client.

Part of the Kubernetes backend's "act" edge: the backend, the informers, the
repartition state machine and the lease elector talk to the API server only
through ``KubeRest``. It keeps the client's configuration, auth and TLS
handling (kubeconfig or in-cluster service account) but sends and returns
plain dicts, so the objects built by ``render`` go out exactly as rendered and
CRD kinds (LeaderWorkerSet, PodMonitor) need no generated models.

Two rules live here because every write passes through here:

- **fencing**: ``guard(method, path)`` runs before every request that is not a
  read or a Lease call; the backend points it at the elector, which raises
  ``Fenced`` once this replica cannot prove it still holds the lease. No
  write leaves the process after a lost renewal, whichever code path asks;
- **counting**: ``counts`` tallies requests by verb (a watch counts once,
  when it is opened), which the scale benchmark reports per tick.

``watch`` streams one watch request's events (the informers use it);
``apply_object`` is create-or-replace with optimistic concurrency: it reads
the live object, refuses to touch one that migscale does not own, and retries
when the API server answers 409 because someone wrote in between.
"""

from __future__ import annotations

import copy
import json
import threading
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import urllib3
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from autoscaler.act.kubernetes.render import MANAGED_BY, MANAGER

Obj = dict[str, Any]

# (apiVersion, kind) -> (plural, namespaced)
KINDS: dict[tuple[str, str], tuple[str, bool]] = {
    ("v1", "Node"): ("nodes", False),
    ("v1", "Namespace"): ("namespaces", False),
    ("v1", "Pod"): ("pods", True),
    ("v1", "Service"): ("services", True),
    ("v1", "ConfigMap"): ("configmaps", True),
    ("events.k8s.io/v1", "Event"): ("events", True),
    ("apps/v1", "ReplicaSet"): ("replicasets", True),
    ("apps/v1", "Deployment"): ("deployments", True),
    ("policy/v1", "PodDisruptionBudget"): ("poddisruptionbudgets", True),
    ("autoscaling/v2", "HorizontalPodAutoscaler"): ("horizontalpodautoscalers", True),
    ("coordination.k8s.io/v1", "Lease"): ("leases", True),
    ("monitoring.coreos.com/v1", "PodMonitor"): ("podmonitors", True),
    ("leaderworkerset.x-k8s.io/v1", "LeaderWorkerSet"): ("leaderworkersets", True),
    ("migscale.io/v1alpha1", "MigModel"): ("migmodels", True),
}


class KubeError(Exception):
    """An API call failed; ``status`` is the HTTP code (0 when no answer came)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


class NotOwned(KubeError):
    """The object exists but is not labelled ``app.kubernetes.io/managed-by: migscale``."""


class Fenced(KubeError):
    """A write refused before it was sent: this replica no longer holds the lease."""


class Expired(KubeError):
    """A watch's resourceVersion is older than the server keeps (410): list again."""


def is_write(method: str, path: str) -> bool:
    """Writes that need the lease: everything but reads and the Lease itself."""
    return method != "GET" and "/leases/" not in path and not path.endswith("/leases")


def path_for(
    api_version: str, kind: str, namespace: str | None, name: str | None = None, sub: str | None = None
) -> str:
    try:
        plural, namespaced = KINDS[(api_version, kind)]
    except KeyError:
        raise KubeError(0, f"kind {api_version}/{kind} is not known to migscale's client") from None
    base = f"/api/{api_version}" if "/" not in api_version else f"/apis/{api_version}"
    if namespaced and namespace is not None:
        base += f"/namespaces/{namespace}"
    base += f"/{plural}"
    if name is not None:
        base += f"/{name}"
    if sub is not None:
        base += f"/{sub}"
    return base


def owned(obj: Obj | None) -> bool:
    return bool(obj) and ((obj.get("metadata") or {}).get("labels") or {}).get(MANAGED_BY) == MANAGER


def is_subset(want: Any, have: Any) -> bool:
    """True when every field of ``want`` is present and equal in ``have``.

    The live object carries server defaults (clusterIP, imagePullPolicy, ...),
    so equality would always fail; a subset check finds "nothing to do".
    """
    if isinstance(want, dict):
        return isinstance(have, dict) and all(is_subset(v, have.get(k)) for k, v in want.items())
    if isinstance(want, list):
        return (
            isinstance(have, list)
            and len(want) == len(have)
            and all(is_subset(a, b) for a, b in zip(want, have))
        )
    if (
        isinstance(want, (int, float))
        and isinstance(have, str)
        or isinstance(want, str)
        and isinstance(have, (int, float))
    ):
        return str(want) == str(have)  # quantities come back as strings
    return want == have


class KubeRest:
    def __init__(self, api_client: k8s.ApiClient) -> None:
        self.api = api_client
        self.guard: Callable[[str, str], None] | None = None  # raises Fenced to refuse a write
        self.counts: Counter[str] = Counter()  # requests by verb ("WATCH" for a watch opened)
        self.by_resource: Counter[tuple[str, str]] = Counter()  # (verb, resource) -> requests
        self._count_lock = threading.Lock()

    def _count(self, verb: str, path: str = "") -> None:
        parts = [p for p in path.split("/") if p]
        # /api/v1/namespaces/ns/pods/name/eviction -> "pods/eviction"; /apis/g/v/nodes -> "nodes"
        rest = parts[2:] if parts[:1] == ["api"] else parts[3:]
        if rest[:1] == ["namespaces"] and len(rest) > 2:
            rest = rest[2:]
        resource = rest[0] if rest else "?"
        if len(rest) > 2:
            resource += "/" + rest[2]
        with self._count_lock:
            self.counts[verb] += 1
            self.by_resource[(verb, resource)] += 1

    def total_requests(self) -> int:
        with self._count_lock:
            return sum(self.counts.values())

    @classmethod
    def connect(cls, host: str | None = None, user_agent: str | None = None) -> KubeRest:
        """``host`` for a plain endpoint (tests); else in-cluster config, then kubeconfig."""
        if host is not None:
            conf = k8s.Configuration()
            conf.host = host
        else:
            from kubernetes import config as k8s_config

            conf = k8s.Configuration()
            try:
                k8s_config.load_incluster_config(client_configuration=conf)
            except k8s_config.ConfigException:
                k8s_config.load_kube_config(client_configuration=conf)
        api = k8s.ApiClient(conf)
        if user_agent:
            api.user_agent = user_agent
        return cls(api)

    def close(self) -> None:
        self.api.close()

    # ------------------------------------------------------------ raw

    def request(
        self,
        method: str,
        path: str,
        *,
        query: Iterable[tuple[str, str]] = (),
        body: Obj | None = None,
        content_type: str = "application/json",
    ) -> Obj:
        if self.guard is not None and is_write(method, path):
            self.guard(method, path)
        self._count(method, path)
        headers = {"Accept": "application/json"}
        if body is not None:
            headers["Content-Type"] = content_type
        m, url, hdrs, b, _ = self.api.param_serialize(
            method=method,
            resource_path=path,
            query_params=list(query),
            header_params=headers,
            body=body,
            auth_settings=["BearerToken"],
        )
        try:
            resp = self.api.call_api(m, url, header_params=hdrs, body=b, _request_timeout=30)
            resp.read()
        except ApiException as exc:
            raise KubeError(exc.status or 0, f"{method} {path}: {exc.reason}") from None
        except (urllib3.exceptions.HTTPError, OSError) as exc:  # no answer at all
            raise KubeError(0, f"{method} {path}: {exc}") from None
        data = resp.data or b""
        payload = json.loads(data) if data else {}
        if not 200 <= resp.status < 300:
            msg = payload.get("message") if isinstance(payload, dict) else None
            raise KubeError(resp.status, f"{method} {path}: {resp.status} {msg or resp.reason}")
        return payload

    # ------------------------------------------------------------ verbs

    def get(self, api_version: str, kind: str, namespace: str | None, name: str) -> Obj | None:
        try:
            return self.request("GET", path_for(api_version, kind, namespace, name))
        except KubeError as exc:
            if exc.status == 404:
                return None
            raise

    def list(
        self,
        api_version: str,
        kind: str,
        namespace: str | None,
        *,
        label_selector: str | None = None,
        field_selector: str | None = None,
    ) -> list[Obj]:
        return self.list_at(
            api_version, kind, namespace, label_selector=label_selector, field_selector=field_selector
        )[0]

    def list_at(
        self,
        api_version: str,
        kind: str,
        namespace: str | None,
        *,
        label_selector: str | None = None,
        field_selector: str | None = None,
    ) -> tuple[list[Obj], str]:
        """(items, the list's resourceVersion): where a watch of the same selection starts."""
        q = []
        if label_selector:
            q.append(("labelSelector", label_selector))
        if field_selector:
            q.append(("fieldSelector", field_selector))
        out = self.request("GET", path_for(api_version, kind, namespace), query=q)
        return list(out.get("items") or []), str((out.get("metadata") or {}).get("resourceVersion") or "")

    def watch(
        self,
        api_version: str,
        kind: str,
        namespace: str | None,
        resource_version: str,
        *,
        label_selector: str | None = None,
        field_selector: str | None = None,
        timeout_s: int = 300,
        on_open: Callable[[Any], None] | None = None,
    ) -> Iterator[Obj]:
        """Events of one watch request, as dicts ``{type, object}``; ends when the server closes it.

        Raises ``Expired`` for a 410 (as an ERROR event or an HTTP status) and
        ``KubeError`` for any other failure. ``on_open(response)`` hands the
        open response to the caller, whose ``shutdown()`` interrupts the read.
        """
        q = [("watch", "true"), ("allowWatchBookmarks", "true"), ("timeoutSeconds", str(int(timeout_s)))]
        if resource_version:
            q.append(("resourceVersion", resource_version))
        if label_selector:
            q.append(("labelSelector", label_selector))
        if field_selector:
            q.append(("fieldSelector", field_selector))
        path = path_for(api_version, kind, namespace)
        self._count("WATCH", path)
        m, url, hdrs, _body, _ = self.api.param_serialize(
            method="GET",
            resource_path=path,
            query_params=q,
            header_params={"Accept": "application/json"},
            auth_settings=["BearerToken"],
        )
        try:
            # no read timeout beyond the watch's own: a quiet watch is not a dead one
            resp = self.api.call_api(m, url, header_params=hdrs, _request_timeout=(10, timeout_s + 30))
        except ApiException as exc:
            raise (Expired if exc.status == 410 else KubeError)(exc.status or 0, f"watch {path}: {exc.reason}") from None
        except (urllib3.exceptions.HTTPError, OSError) as exc:
            raise KubeError(0, f"watch {path}: {exc}") from None
        raw = resp.response
        if resp.status != 200:
            data = raw.data or b""
            raw.release_conn()
            cls = Expired if resp.status == 410 else KubeError
            raise cls(resp.status, f"watch {path}: {resp.status} {data[:200]!r}")
        if on_open is not None:
            on_open(raw)
        buf = b""
        try:
            for chunk in raw.stream(65536, decode_content=True):
                buf += chunk
                while b"\n" in buf:
                    line, buf = buf.split(b"\n", 1)
                    if not line.strip():
                        continue
                    event = json.loads(line)
                    if event.get("type") == "ERROR":
                        st = event.get("object") or {}
                        code = int(st.get("code") or 0)
                        cls = Expired if code == 410 else KubeError
                        raise cls(code, f"watch {path}: {st.get('reason')}: {st.get('message')}")
                    yield event
        except (urllib3.exceptions.HTTPError, OSError, ValueError) as exc:
            raise KubeError(0, f"watch {path}: stream ended: {type(exc).__name__}: {exc}") from None
        finally:
            raw.release_conn()

    def create(self, obj: Obj) -> Obj:
        meta = obj["metadata"]
        return self.request("POST", path_for(obj["apiVersion"], obj["kind"], meta.get("namespace")), body=obj)

    def replace(self, obj: Obj) -> Obj:
        meta = obj["metadata"]
        return self.request(
            "PUT", path_for(obj["apiVersion"], obj["kind"], meta.get("namespace"), meta["name"]), body=obj
        )

    def merge_patch(self, api_version: str, kind: str, namespace: str | None, name: str, patch: Obj) -> Obj:
        return self.request(
            "PATCH",
            path_for(api_version, kind, namespace, name),
            body=patch,
            content_type="application/merge-patch+json",
        )

    def delete(
        self, api_version: str, kind: str, namespace: str | None, name: str, *, resource_version: str | None = None
    ) -> bool:
        """Delete; with ``resource_version`` only that version (409 if it changed since we read it)."""
        body = None
        if resource_version:
            body = {"kind": "DeleteOptions", "apiVersion": "v1", "preconditions": {"resourceVersion": resource_version}}
        try:
            self.request("DELETE", path_for(api_version, kind, namespace, name), body=body)
            return True
        except KubeError as exc:
            if exc.status == 404:
                return False
            raise

    def get_scale(self, api_version: str, kind: str, namespace: str, name: str) -> Obj:
        return self.request("GET", path_for(api_version, kind, namespace, name, "scale"))

    def set_scale(
        self, api_version: str, kind: str, namespace: str, name: str, replicas: int, retries: int = 5
    ) -> Obj:
        """Write ``spec.replicas`` through the scale subresource, retrying 409s."""
        for _ in range(retries):
            scale = self.get_scale(api_version, kind, namespace, name)
            scale["spec"] = {"replicas": replicas}
            try:
                return self.request("PUT", path_for(api_version, kind, namespace, name, "scale"), body=scale)
            except KubeError as exc:
                if exc.status != 409:
                    raise
        raise KubeError(409, f"scale {kind}/{name}: still conflicting after {retries} tries")

    def patch_scale(
        self, api_version: str, kind: str, namespace: str, name: str, replicas: int, resource_version: str = ""
    ) -> Obj:
        """One request: ``spec.replicas`` through the scale subresource (409 if ``resource_version`` is stale)."""
        body: Obj = {"spec": {"replicas": replicas}}
        if resource_version:
            body["metadata"] = {"resourceVersion": resource_version}
        return self.request(
            "PATCH",
            path_for(api_version, kind, namespace, name, "scale"),
            body=body,
            content_type="application/merge-patch+json",
        )

    def evict(self, namespace: str, pod: str) -> None:
        body = {
            "apiVersion": "policy/v1",
            "kind": "Eviction",
            "metadata": {"name": pod, "namespace": namespace},
        }
        self.request("POST", path_for("v1", "Pod", namespace, pod, "eviction"), body=body)


# what a replace writes of ``metadata`` besides name, namespace and resourceVersion
_CARRIED_METADATA = ("labels", "annotations", "finalizers", "ownerReferences")
# label keys migscale owns: one of these that the render no longer sets is removed
_OWN_LABEL_PREFIX = "migscale.io/"


def _keep_others_metadata(new: Obj, live: Obj) -> None:
    """Carry into ``new`` (migscale's render) the metadata other writers own on ``live``.

    A replace writes the whole ``metadata``, so without this it would strip
    what others set: the garbage collector's ``orphan``/``foregroundDeletion``
    finalizers (a deletion with ``--cascade=orphan`` would then delete the
    pods), the Deployment controller's ``deployment.kubernetes.io/revision``,
    an operator's labels and annotations. migscale renders labels and owner
    references only; its own labels win, and one under ``migscale.io/`` that the
    render dropped is dropped.
    """
    labels = {k: v for k, v in (live.get("labels") or {}).items() if not k.startswith(_OWN_LABEL_PREFIX)}
    labels.update(new.get("labels") or {})
    new["labels"] = labels
    for key in ("annotations", "finalizers"):
        if live.get(key):
            new[key] = copy.deepcopy(live[key])
    if "ownerReferences" not in new and live.get("ownerReferences"):
        new["ownerReferences"] = copy.deepcopy(live["ownerReferences"])


def apply_object(
    rest: KubeRest, obj: Obj, *, keep_replicas: bool = False, retries: int = 5, absent: bool = False
) -> tuple[str, Obj]:
    """Create ``obj`` or replace the live one; returns ("created"|"updated"|"unchanged", live).

    Raises ``NotOwned`` for an existing object migscale did not create, and
    ``KubeError(409)`` when every retry lost a race. ``keep_replicas`` leaves
    the live ``spec.replicas`` alone: once an HPA owns a Deployment's size,
    re-applying the template must not reset it. ``absent``: an informer's cache
    says it does not exist, so it is created without reading it first; a 409
    (the cache lagged) falls back to read-and-replace.
    """
    meta = obj["metadata"]
    if absent:
        try:
            return "created", rest.create(copy.deepcopy(obj))
        except KubeError as exc:
            if exc.status != 409:
                raise
    for _ in range(retries):
        live = rest.get(obj["apiVersion"], obj["kind"], meta.get("namespace"), meta["name"])
        if live is None:
            try:
                return "created", rest.create(copy.deepcopy(obj))
            except KubeError as exc:
                if exc.status == 409:  # created by someone else meanwhile: read it and retry
                    continue
                raise
        if not owned(live):
            raise NotOwned(
                409, f"{obj['kind']}/{meta['name']} exists and is not managed by migscale; left alone"
            )
        new = copy.deepcopy(obj)
        if keep_replicas and "replicas" in (live.get("spec") or {}):
            new["spec"]["replicas"] = live["spec"]["replicas"]
        _keep_others_metadata(new["metadata"], live["metadata"])
        if obj["kind"] == "Service":  # clusterIP is immutable once assigned
            for k in ("clusterIP", "clusterIPs"):
                if k in (live.get("spec") or {}):
                    new["spec"][k] = live["spec"][k]
        if (is_subset({k: v for k, v in new.items() if k != "metadata"}, live)
                and new["metadata"]["labels"] == (live["metadata"].get("labels") or {})
                and is_subset({k: new["metadata"][k] for k in _CARRIED_METADATA if new["metadata"].get(k)},
                              live["metadata"])):
            return "unchanged", live
        new["metadata"]["resourceVersion"] = live["metadata"]["resourceVersion"]
        try:
            return "updated", rest.replace(new)
        except KubeError as exc:
            if exc.status != 409:
                raise
    raise KubeError(409, f"{obj['kind']}/{meta['name']}: still conflicting after {retries} tries")
