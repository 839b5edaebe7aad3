"""A small in-memory Kubernetes API server for the backend tests.

No real API server can be installed on these machines (docs/kubernetes-api.md), so this
speaks the REST protocol the official ``kubernetes`` client uses, on
127.0.0.1 and a free port, with the semantics migscale relies on:

- objects keyed by (group, plural, namespace, name), a global resourceVersion;
- create -> 409 AlreadyExists; get/replace/patch/delete of a missing object -> 404;
- replace (PUT) or patch carrying a stale ``metadata.resourceVersion`` -> 409
  Conflict (optimistic concurrency, which Lease-based leader election needs);
- create/replace of an invalid object -> 422 Invalid (built-in kinds checked
  with kubernetes-validate, CRD kinds with the stored CRD schemas);
- JSON merge patch (``application/merge-patch+json``; strategic merge patch
  is treated the same, which is enough for labels and ``spec.unschedulable``);
- list with ``labelSelector`` (equality and set-based) and ``fieldSelector``
  (``spec.nodeName``, ``metadata.name``);
- the ``scale`` subresource of Deployments and LeaderWorkerSets;
- ``pods/<name>/eviction`` (deletes the pod; 429 while the test blocks it).

Tests observe it through ``requests`` (method, path, user agent) and change
it through ``objects`` / ``put_object``; ``hooks`` run after every write,
e.g. to play the GPU Operator's mig-manager.
"""

from __future__ import annotations

import copy
import json
import re
import threading
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlparse

import kubernetes_validate

Obj = dict[str, Any]

# (group, plural) -> (kind, namespaced)
RESOURCES: dict[tuple[str, str], tuple[str, bool]] = {
    ("", "nodes"): ("Node", False),
    ("", "namespaces"): ("Namespace", False),
    ("", "pods"): ("Pod", True),
    ("", "services"): ("Service", True),
    ("", "configmaps"): ("ConfigMap", True),
    ("apps", "deployments"): ("Deployment", True),
    ("policy", "poddisruptionbudgets"): ("PodDisruptionBudget", True),
    ("autoscaling", "horizontalpodautoscalers"): ("HorizontalPodAutoscaler", True),
    ("coordination.k8s.io", "leases"): ("Lease", True),
    ("monitoring.coreos.com", "podmonitors"): ("PodMonitor", True),
    ("leaderworkerset.x-k8s.io", "leaderworkersets"): ("LeaderWorkerSet", True),
}
SCALABLE = {("apps", "deployments"), ("leaderworkerset.x-k8s.io", "leaderworkersets")}

_PATH = re.compile(
    r"^/(?:api/(?P<cv>v1)|apis/(?P<g>[^/]+)/(?P<v>[^/]+))"
    r"(?:/namespaces/(?P<ns>[^/]+))?/(?P<plural>[^/]+)(?:/(?P<name>[^/]+))?(?:/(?P<sub>[^/]+))?$"
)


def _now() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def status(code: int, reason: str, message: str) -> Obj:
    return {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure" if code >= 400 else "Success",
        "message": message,
        "reason": reason,
        "code": code,
    }


class ApiError(Exception):
    def __init__(self, code: int, reason: str, message: str) -> None:
        super().__init__(message)
        self.body = status(code, reason, message)
        self.code = code


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    out = copy.deepcopy(target) if isinstance(target, dict) else {}
    for k, v in patch.items():
        if v is None:
            out.pop(k, None)
        else:
            out[k] = merge_patch(out.get(k), v)
    return out


def _selector_matches(selector: str, lbls: dict[str, str]) -> bool:
    # split on commas outside parentheses
    parts, depth, cur = [], 0, ""
    for ch in selector:
        depth += ch == "("
        depth -= ch == ")"
        if ch == "," and depth == 0:
            parts.append(cur)
            cur = ""
        else:
            cur += ch
    parts.append(cur)
    for raw in (p.strip() for p in parts):
        if not raw:
            continue
        m = re.match(r"^(\S+)\s+(in|notin)\s+\((.*)\)$", raw)
        if m:
            key, op, vals = m.group(1), m.group(2), {v.strip() for v in m.group(3).split(",")}
            if (op == "in") != (lbls.get(key) in vals):
                return False
        elif "!=" in raw:
            key, val = raw.split("!=", 1)
            if lbls.get(key.strip()) == val.strip():
                return False
        elif "=" in raw:
            key, val = raw.replace("==", "=").split("=", 1)
            if lbls.get(key.strip()) != val.strip():
                return False
        elif raw.startswith("!"):
            if raw[1:] in lbls:
                return False
        elif raw not in lbls:
            return False
    return True


def _field(obj: Obj, path: str) -> Any:
    cur: Any = obj
    for part in path.split("."):
        cur = cur.get(part) if isinstance(cur, dict) else None
    return cur


@dataclass
class Request:
    method: str
    path: str
    user_agent: str
    status: int = 0


class FakeKube:
    """The store and the semantics; ``serve()`` puts it on a port."""

    def __init__(
        self, version: str = "1.30", crd_validator: Callable[[Obj], list[str]] | None = None
    ) -> None:
        self.version = version
        self.crd_validator = crd_validator
        self.objects: dict[tuple[str, str, str | None, str], Obj] = {}
        self.requests: list[Request] = []
        self.hooks: list[Callable[[FakeKube, str, Obj], None]] = []
        self.blocked_evictions: set[str] = set()
        self.fail_next: list[tuple[str, str, int]] = []  # (method, path-substring, code) injected once
        # called with (method, path) before a request is handled: lets a test
        # slip in a competing write between a client's read and its update
        self.before: list[Callable[[str, str], None]] = []
        self._rv = 0
        self.lock = threading.RLock()
        self._server: ThreadingHTTPServer | None = None

    # ------------------------------------------------------------ store

    def _next_rv(self) -> str:
        self._rv += 1
        return str(self._rv)

    def validate(self, obj: Obj) -> None:
        try:
            kubernetes_validate.validate(obj, self.version, strict=True)
        except kubernetes_validate.SchemaNotFoundError:
            problems = self.crd_validator(obj) if self.crd_validator else []
            if problems:
                raise ApiError(422, "Invalid", "; ".join(problems))
        except kubernetes_validate.ValidationError as exc:
            raise ApiError(
                422, "Invalid", f"{obj.get('kind')} {obj.get('metadata', {}).get('name')}: {exc.message}"
            )

    def put_object(self, obj: Obj) -> Obj:
        """Seed an object directly (no validation), as another controller would."""
        with self.lock:
            group = obj["apiVersion"].rpartition("/")[0]
            plural = next(p for (g, p), (k, _) in RESOURCES.items() if g == group and k == obj["kind"])
            namespaced = RESOURCES[(group, plural)][1]
            meta = obj.setdefault("metadata", {})
            ns = meta.get("namespace", "default") if namespaced else None
            if namespaced:
                meta["namespace"] = ns
            meta.setdefault("uid", str(uuid.uuid4()))
            meta.setdefault("creationTimestamp", _now())
            meta["resourceVersion"] = self._next_rv()
            self.objects[(group, plural, ns, meta["name"])] = copy.deepcopy(obj)
            return obj

    def get(self, kind: str, name: str, namespace: str | None = "default") -> Obj | None:
        with self.lock:
            for (g, p, ns, n), obj in self.objects.items():
                if obj["kind"] == kind and n == name and (ns == namespace or not RESOURCES[(g, p)][1]):
                    return copy.deepcopy(obj)
        return None

    def list(self, kind: str) -> list[Obj]:
        with self.lock:
            return [copy.deepcopy(o) for o in self.objects.values() if o["kind"] == kind]

    def writes(self, user_agent: str | None = None) -> list[Request]:
        return [
            r
            for r in self.requests
            if r.method in ("POST", "PUT", "PATCH", "DELETE")
            and (user_agent is None or r.user_agent == user_agent)
        ]

    # ------------------------------------------------------------ REST

    def handle(self, method: str, raw_path: str, body: bytes, content_type: str) -> tuple[int, Obj]:
        url = urlparse(raw_path)
        q = {k: v[0] for k, v in parse_qs(url.query).items()}
        for hook in list(self.before):
            hook(method, url.path)
        for i, (m, frag, code) in enumerate(self.fail_next):
            if m == method and frag in url.path:
                del self.fail_next[i]
                reason = {409: "Conflict", 500: "InternalError", 503: "ServiceUnavailable"}.get(
                    code, "Unknown"
                )
                return code, status(code, reason, f"injected {code} for {method} {url.path}")
        m = _PATH.match(url.path)
        if not m:
            return 404, status(
                404, "NotFound", f"the server could not find the requested resource {url.path}"
            )
        group = m.group("g") or ""
        version = m.group("cv") or m.group("v")
        plural, name, sub, ns = m.group("plural"), m.group("name"), m.group("sub"), m.group("ns")
        if (group, plural) not in RESOURCES:
            return 404, status(
                404, "NotFound", f"the server could not find the requested resource ({plural}.{group})"
            )
        kind, namespaced = RESOURCES[(group, plural)]
        if not namespaced:
            ns = None
        api_version = f"{group}/{version}" if group else version
        try:
            payload = json.loads(body) if body else None
        except ValueError:
            return 400, status(400, "BadRequest", "body is not JSON")
        with self.lock:
            try:
                return self._dispatch(
                    method, group, plural, kind, api_version, ns, name, sub, q, payload, content_type
                )
            except ApiError as exc:
                return exc.code, exc.body

    def _dispatch(self, method, group, plural, kind, api_version, ns, name, sub, q, payload, content_type):
        key = (group, plural, ns, name)
        if name is None:
            if method == "GET":
                return 200, self._list(group, plural, kind, api_version, ns, q)
            if method == "POST":
                return 201, self._create(group, plural, kind, ns, payload)
            raise ApiError(405, "MethodNotAllowed", f"{method} on a collection")
        if sub == "eviction" and method == "POST":
            return 201, self._evict(key)
        current = self.objects.get(key)
        if current is None:
            raise ApiError(404, "NotFound", f'{plural}.{group or "core"} "{name}" not found')
        if sub == "scale":
            return self._scale(method, key, current, payload)
        if sub not in (None, "status"):
            raise ApiError(404, "NotFound", f"subresource {sub} not found")
        if method == "GET":
            return 200, copy.deepcopy(current)
        if method == "DELETE":
            del self.objects[key]
            self._fire("DELETE", current)
            return 200, status(200, "", f"{name} deleted") | {"status": "Success"}
        if method == "PUT":
            return 200, self._replace(key, current, payload)
        if method == "PATCH":
            if "json-patch" in content_type:
                raise ApiError(415, "UnsupportedMediaType", "JSON patch is not supported by the fake")
            patch = payload or {}
            rv = (patch.get("metadata") or {}).get("resourceVersion")
            if rv is not None and rv != current["metadata"]["resourceVersion"]:
                raise self._conflict(plural, name)
            merged = merge_patch(current, patch)
            return 200, self._replace(key, current, merged, check_rv=False)
        raise ApiError(405, "MethodNotAllowed", method)

    def _conflict(self, plural: str, name: str) -> ApiError:
        return ApiError(
            409,
            "Conflict",
            f'Operation cannot be fulfilled on {plural} "{name}": the object has been modified; '
            "please apply your changes to the latest version and try again",
        )

    def _list(self, group, plural, kind, api_version, ns, q) -> Obj:
        items = []
        for (g, p, n_s, _n), obj in sorted(self.objects.items(), key=lambda kv: str(kv[0])):
            if (g, p) != (group, plural) or (ns is not None and n_s != ns):
                continue
            if "labelSelector" in q and not _selector_matches(
                q["labelSelector"], obj["metadata"].get("labels") or {}
            ):
                continue
            ok = True
            for cond in filter(None, q.get("fieldSelector", "").split(",")):
                fld, _, val = cond.partition("=")
                ok &= (
                    str(_field(obj, fld.rstrip("!")) or "") == val
                    if not fld.endswith("!")
                    else str(_field(obj, fld[:-1]) or "") != val
                )
            if ok:
                items.append(copy.deepcopy(obj))
        return {
            "apiVersion": api_version,
            "kind": f"{kind}List",
            "metadata": {"resourceVersion": str(self._rv)},
            "items": items,
        }

    def _create(self, group, plural, kind, ns, obj) -> Obj:
        if not isinstance(obj, dict):
            raise ApiError(400, "BadRequest", "body must be an object")
        meta = obj.setdefault("metadata", {})
        if not meta.get("name") and meta.get("generateName"):
            meta["name"] = meta["generateName"] + uuid.uuid4().hex[:5]
        if not meta.get("name"):
            raise ApiError(422, "Invalid", "metadata.name: Required value")
        if obj.get("kind") != kind:
            raise ApiError(400, "BadRequest", f"kind {obj.get('kind')!r} does not match {kind}")
        if ns is not None:
            if meta.get("namespace", ns) != ns:
                raise ApiError(400, "BadRequest", "the namespace of the object does not match the request")
            meta["namespace"] = ns
        key = (group, plural, ns, meta["name"])
        if key in self.objects:
            raise ApiError(
                409, "AlreadyExists", f'{plural}.{group or "core"} "{meta["name"]}" already exists'
            )
        if meta.get("resourceVersion"):
            raise ApiError(422, "Invalid", "metadata.resourceVersion: must not be set on create")
        self.validate(obj)
        meta["uid"] = str(uuid.uuid4())
        meta["creationTimestamp"] = _now()
        meta["resourceVersion"] = self._next_rv()
        meta.setdefault("generation", 1)
        self.objects[key] = copy.deepcopy(obj)
        self._fire("POST", obj)
        return obj

    def _replace(self, key, current, obj, check_rv: bool = True) -> Obj:
        if not isinstance(obj, dict):
            raise ApiError(400, "BadRequest", "body must be an object")
        meta = obj.setdefault("metadata", {})
        if meta.get("name") != key[3]:
            raise ApiError(400, "BadRequest", "the name of the object does not match the name in the URL")
        rv = meta.get("resourceVersion")
        if check_rv and rv and rv != current["metadata"]["resourceVersion"]:
            raise self._conflict(key[1], key[3])
        if key[2] is not None:
            meta["namespace"] = key[2]
        self.validate(obj)
        meta["uid"] = current["metadata"]["uid"]
        meta["creationTimestamp"] = current["metadata"]["creationTimestamp"]
        meta["resourceVersion"] = self._next_rv()
        if obj.get("spec") != current.get("spec"):
            meta["generation"] = current["metadata"].get("generation", 1) + 1
        self.objects[key] = copy.deepcopy(obj)
        self._fire("PUT", obj)
        return obj

    def _scale(self, method, key, current, payload) -> tuple[int, Obj]:
        if key[:2] not in SCALABLE:
            raise ApiError(404, "NotFound", "scale subresource not found")
        if method == "PUT":
            rv = ((payload or {}).get("metadata") or {}).get("resourceVersion")
            if rv and rv != current["metadata"]["resourceVersion"]:
                raise self._conflict(key[1], key[3])
            replicas = ((payload or {}).get("spec") or {}).get("replicas")
            if not isinstance(replicas, int) or replicas < 0:
                raise ApiError(422, "Invalid", f"spec.replicas: Invalid value: {replicas!r}")
            new = copy.deepcopy(current)
            new["spec"]["replicas"] = replicas
            self._replace(key, current, new, check_rv=False)
            current = self.objects[key]
        elif method != "GET":
            raise ApiError(405, "MethodNotAllowed", method)
        sel = (current["spec"].get("selector") or {}).get("matchLabels") or {}
        return 200, {
            "apiVersion": "autoscaling/v1",
            "kind": "Scale",
            "metadata": {
                "name": key[3],
                "namespace": key[2],
                "resourceVersion": current["metadata"]["resourceVersion"],
                "uid": current["metadata"]["uid"],
            },
            "spec": {"replicas": current["spec"].get("replicas", 1)},
            "status": {
                "replicas": (current.get("status") or {}).get("replicas", 0),
                "selector": ",".join(f"{k}={v}" for k, v in sorted(sel.items())),
            },
        }

    def _evict(self, key) -> Obj:
        group, plural, _ns, name = key
        if (group, plural) != ("", "pods"):
            raise ApiError(404, "NotFound", "eviction applies to pods")
        pod = self.objects.get(key)
        if pod is None:
            raise ApiError(404, "NotFound", f'pods "{name}" not found')
        if name in self.blocked_evictions:
            raise ApiError(
                429, "TooManyRequests", "Cannot evict pod as it would violate the pod's disruption budget."
            )
        del self.objects[key]
        self._fire("DELETE", pod)
        return status(201, "", f"pod {name} evicted") | {"status": "Success"}

    def _fire(self, verb: str, obj: Obj) -> None:
        for hook in list(self.hooks):
            hook(self, verb, copy.deepcopy(obj))

    # ------------------------------------------------------------ server

    def serve(self) -> str:
        fake = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def _do(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else b""
                code, payload = fake.handle(
                    self.command, self.path, body, self.headers.get("Content-Type") or ""
                )
                with fake.lock:
                    fake.requests.append(
                        Request(self.command, self.path, self.headers.get("User-Agent") or "", code)
                    )
                data = json.dumps(payload).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = _do

            def log_message(self, *args: Any) -> None:  # quiet
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    def close(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
