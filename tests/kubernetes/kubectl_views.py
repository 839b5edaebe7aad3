"""What the emulated API server answers so that the real ``kubectl get`` works against it: discovery and Tables.

``kubectl get migmodels`` resolves the name through discovery, then asks for
the list as a ``meta.k8s.io/v1`` Table (``Accept: application/json;as=Table``)
and prints the server's columns. This serves, as an API server does:

- legacy discovery: ``/api`` (APIVersions), ``/apis`` (APIGroupList, one
  group per stored CRD) and ``/apis/<group>/<version>`` (APIResourceList);
  aggregated discovery is not offered, so kubectl falls back to these (it
  does so for any server that answers plain JSON);
- a Table for a CRD's list or object: a ``Name`` column, then the CRD's
  ``additionalPrinterColumns`` evaluated with their JSONPath on each object
  (a ``date`` column as an age, "5m", the way the apiextensions server's
  table convertor writes it; a missing value as an empty cell, which kubectl
  prints as ``<none>``); ``priority`` is passed on, so ``-o wide`` shows the
  rest.

Only the JSONPath forms CRDs here use are evaluated: ``.a.b`` and a
``[?(@.key=="value")]`` filter.
"""

from __future__ import annotations

import re
import time
from datetime import datetime, timezone
from typing import Any

Obj = dict[str, Any]
_STEP = re.compile(r'\.([A-Za-z0-9_]+)|\[\?\(@\.([A-Za-z0-9_]+)=="([^"]*)"\)\]')


def jsonpath(obj: Any, path: str) -> Any:
    values = [obj]
    for m in _STEP.finditer(path):
        field, key, want = m.groups()
        nxt = []
        for v in values:
            if field and isinstance(v, dict) and field in v:
                nxt.append(v[field])
            elif key and isinstance(v, list):
                nxt.extend(x for x in v if isinstance(x, dict) and str(x.get(key)) == want)
        values = nxt
    return values[0] if values else None


def age(ts: str, now: float) -> str:
    """``translateTimestampSince``: 45s, 5m, 3h, 2d (the largest unit, as kubectl's AGE)."""
    then = datetime.strptime(ts, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=timezone.utc).timestamp()
    s = max(0, int(now - then))
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if s >= 2 * size or (unit == "m" and s >= size):
            return f"{s // size}{unit}"
    return f"{s}s"


class KubectlViews:
    """Install with ``fake.views.append(KubectlViews(crds))``; ``crds``: the CustomResourceDefinitions served."""

    def __init__(self, crds: list[Obj], now: Any = time.time) -> None:
        self.crds = crds
        self.now = now

    def __call__(self, fake: Any, method: str, path: str, accept: str) -> tuple[int, Obj] | None:
        if method != "GET":
            return None
        bare = path.split("?", 1)[0].rstrip("/")
        if bare == "/api":
            return 200, {"kind": "APIVersions", "versions": ["v1"], "serverAddressByClientCIDRs": []}
        if bare == "/apis":
            groups = [{"name": c["spec"]["group"], "versions": [{"groupVersion": f"{c['spec']['group']}/{v['name']}",
                                                               "version": v["name"]} for v in c["spec"]["versions"]],
                       "preferredVersion": {"groupVersion": f"{c['spec']['group']}/{c['spec']['versions'][0]['name']}",
                                            "version": c["spec"]["versions"][0]["name"]}} for c in self.crds]
            return 200, {"kind": "APIGroupList", "apiVersion": "v1", "groups": groups}
        if bare == "/openapi/v3":
            return 200, {"paths": {f"apis/{c['spec']['group']}/{v['name']}": {
                "serverRelativeURL": f"/openapi/v3/apis/{c['spec']['group']}/{v['name']}"}
                for c in self.crds for v in c["spec"]["versions"]}}
        if bare.startswith("/openapi/v3/apis/"):
            return self._openapi(bare.removeprefix("/openapi/v3/apis/"))
        if bare == "/api/v1":
            return 200, {"kind": "APIResourceList", "groupVersion": "v1", "resources": [
                {"name": "namespaces", "singularName": "namespace", "namespaced": False, "kind": "Namespace",
                 "verbs": ["get", "list"]}]}
        for crd in self.crds:
            spec = crd["spec"]
            for v in spec["versions"]:
                base = f"/apis/{spec['group']}/{v['name']}"
                if bare == base:
                    return 200, self._resources(spec, v)
                if "as=Table" in accept and bare.startswith(base) and f"/{spec['names']['plural']}" in bare:
                    return self._table(fake, path, v)
        return None

    def _openapi(self, group_version: str) -> tuple[int, Obj]:
        """The group-version's OpenAPI v3 document, as far as ``kubectl apply`` reads it: the PATCH operation
        of each kind, tagged with its group/version/kind and offering ``fieldValidation`` (so kubectl leaves
        validation to the server and sends ``fieldValidation=Strict``), and the kind's schema."""
        for crd in self.crds:
            spec = crd["spec"]
            for v in spec["versions"]:
                if f"{spec['group']}/{v['name']}" != group_version:
                    continue
                gvk = {"group": spec["group"], "version": v["name"], "kind": spec["names"]["kind"]}
                op = {"x-kubernetes-group-version-kind": gvk, "parameters": [
                    {"name": "fieldValidation", "in": "query", "schema": {"type": "string", "uniqueItems": True}}]}
                path = f"/apis/{group_version}/namespaces/{{namespace}}/{spec['names']['plural']}/{{name}}"
                schema = {**v["schema"]["openAPIV3Schema"], "x-kubernetes-group-version-kind": [gvk]}
                name = ".".join(reversed(spec["group"].split("."))) + f".{v['name']}.{spec['names']['kind']}"
                return 200, {"openapi": "3.0.0", "info": {"title": "Kubernetes", "version": "emulated"},
                             "paths": {path: {"patch": op}}, "components": {"schemas": {name: schema}}}
        return 404, {"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "NotFound", "code": 404,
                     "message": f"no OpenAPI document for {group_version}"}

    @staticmethod
    def _resources(spec: Obj, version: Obj) -> Obj:
        names = spec["names"]
        res = [{"name": names["plural"], "singularName": names.get("singular", ""),
                "namespaced": spec["scope"] == "Namespaced", "kind": names["kind"],
                "verbs": ["delete", "deletecollection", "get", "list", "patch", "create", "update", "watch"],
                "shortNames": names.get("shortNames", []), "categories": names.get("categories", [])}]
        if "status" in (version.get("subresources") or {}):
            res.append({"name": f"{names['plural']}/status", "singularName": "", "namespaced": True,
                        "kind": names["kind"], "verbs": ["get", "patch", "update"]})
        return {"kind": "APIResourceList", "apiVersion": "v1",
                "groupVersion": f"{spec['group']}/{version['name']}", "resources": res}

    def _table(self, fake: Any, path: str, version: Obj) -> tuple[int, Obj]:
        code, got = fake.handle("GET", path, b"", "", "kubectl")
        if code != 200:
            return code, got
        objs = got.get("items", [got])
        cols = [{"name": "Name", "type": "string", "format": "name", "priority": 0,
                 "description": "Name must be unique within a namespace."}]
        cols += [{"name": c["name"], "type": c["type"], "format": c.get("format", ""), "priority": c.get("priority", 0),
                  "description": c.get("description", "")} for c in version.get("additionalPrinterColumns", [])]
        now = self.now()
        rows = []
        for o in objs:
            cells: list[Any] = [o["metadata"]["name"]]
            for c in version.get("additionalPrinterColumns", []):
                v = jsonpath(o, c["jsonPath"])
                cells.append(age(v, now) if c["type"] == "date" and isinstance(v, str) else v)
            meta = {k: o["metadata"][k] for k in ("name", "namespace", "uid", "resourceVersion", "creationTimestamp")
                    if k in o["metadata"]}
            rows.append({"cells": cells, "object": {"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1",
                                                    "metadata": meta}})
        meta = {"resourceVersion": (got.get("metadata") or {}).get("resourceVersion", "")}
        return 200, {"kind": "Table", "apiVersion": "meta.k8s.io/v1", "metadata": meta, "columnDefinitions": cols,
                     "rows": rows}
