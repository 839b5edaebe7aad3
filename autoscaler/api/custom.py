"""``custom.metrics.k8s.io`` v1beta1 and v1beta2: discovery, pods, objects, namespaces.

Part of the export step: the HPA's metrics client calls

    GET /apis/custom.metrics.k8s.io/v1beta2/namespaces/NS/pods/*/METRIC?labelSelector=SEL
    GET /apis/custom.metrics.k8s.io/v1beta2/namespaces/NS/deployments.apps/NAME/METRIC
    GET /apis/custom.metrics.k8s.io/v1beta2/namespaces/NS/metrics/METRIC

and reads a ``MetricValueList`` (v1beta1 items carry ``metricName``; v1beta2
items carry ``metric{name,selector}``). A list whose pods have no value is an
empty list; a single object without a value is 404 -- never a made-up 0.

The hot path (:func:`pods_list`) answers from the snapshot's cache: the HPA
asks for the same selector every sync period, so after the first call per
tick the answer is one dict lookup.
"""

from __future__ import annotations

import re
from typing import Any

from fastapi import APIRouter
from fastapi.responses import Response

from autoscaler.api import schemas
from autoscaler.api import signals as sig
from autoscaler.api.errors import ApiError, bad_request, not_found
from autoscaler.api.quantity import format_milli
from autoscaler.api.selectors import Selector, SelectorError, parse_selector
from autoscaler.api.state import (
    OBJECT_RESOURCES,
    RES_DEPLOYMENTS,
    RES_LWS,
    RES_PODS,
    ApiState,
    Snapshot,
    Value,
    dumps,
)
from autoscaler.api.views import rfc3339

GROUP = "custom.metrics.k8s.io"
VERSIONS = ("v1beta2", "v1beta1")  # preferred first (APIService versionPriority 200 vs 100)

_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$")
_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
_METRIC = re.compile(r"^[A-Za-z_:][A-Za-z0-9_:.-]{0,199}$")


def _check_namespace(ns: str) -> None:
    if not _DNS_LABEL.match(ns):
        raise bad_request(f"invalid namespace {ns!r}: must be a DNS-1123 label")


def _check_metric(metric: str) -> None:
    if not _METRIC.match(metric):
        raise bad_request(f"invalid metric name {metric!r}")


def _check_name(name: str) -> None:
    if not _DNS_SUBDOMAIN.match(name):
        raise bad_request(f"invalid object name {name!r}: must be a DNS-1123 subdomain")


def _selector(text: str | None, what: str) -> Selector:
    try:
        return parse_selector(text)
    except SelectorError as e:
        raise bad_request(f"unable to parse {what}: {e}") from None


def label_selector_json(sel: Selector) -> dict[str, Any] | None:
    """``metav1.LabelSelector`` for a parsed selector (``<``/``>`` have no LabelSelector form)."""
    if sel.empty:
        return None
    match_labels: dict[str, str] = {}
    exprs: list[dict[str, Any]] = []
    ops = {"in": "In", "notin": "NotIn", "!=": "NotIn", "exists": "Exists", "!": "DoesNotExist"}
    for r in sel.requirements:
        if r.op == "=":
            match_labels[r.key] = r.values[0]
        elif r.op in ops:
            e: dict[str, Any] = {"key": r.key, "operator": ops[r.op]}
            if r.values:
                e["values"] = list(r.values)
            exprs.append(e)
    out: dict[str, Any] = {}
    if match_labels:
        out["matchLabels"] = match_labels
    if exprs:
        out["matchExpressions"] = exprs
    return out or None


def _item(
    version: str,
    ns: str | None,
    kind: str,
    api_version: str,
    name: str,
    metric: str,
    value: Value,
    window_s: int | None,
    msel: dict[str, Any] | None,
) -> dict[str, Any]:
    obj: dict[str, Any] = {"kind": kind, "name": name, "apiVersion": api_version}
    if ns is not None:
        obj = {"kind": kind, "namespace": ns, "name": name, "apiVersion": api_version}
    if version == "v1beta2":
        item: dict[str, Any] = {
            "describedObject": obj,
            "metric": {"name": metric, "selector": msel},
            "timestamp": rfc3339(value[1]),
        }
        if window_s is not None:
            item["windowSeconds"] = window_s
        item["value"] = format_milli(value[0])
        return item
    item = {"describedObject": obj, "metricName": metric, "timestamp": rfc3339(value[1])}
    if window_s is not None:
        item["window"] = window_s
    item["value"] = format_milli(value[0])
    item["selector"] = msel
    return item


def _list(version: str, items: list[dict[str, Any]]) -> bytes:
    return dumps(
        {"kind": "MetricValueList", "apiVersion": f"{GROUP}/{version}", "metadata": {}, "items": items}
    )


def _metric_selector(snap: Snapshot, text: str | None) -> tuple[bool, dict[str, Any] | None]:
    """(does the metric match, selector JSON). Our series carry no metric labels."""
    msel = _selector(text, "metricLabelSelector")
    return msel.matches({}), label_selector_json(msel)


def pods_list(snap: Snapshot, version: str, ns: str, metric: str, selector: str | None, msel: str | None):
    """``pods/*/METRIC?labelSelector=``: (status, body). Cached per snapshot."""
    key = ("pods", version, ns, metric, selector, msel)
    hit = snap.cached(key)
    if hit is not None:
        return hit
    _check_namespace(ns)
    _check_metric(metric)
    if metric not in sig.CUSTOM_POD_METRICS:
        raise not_found(f'the server could not find the metric "{metric}" for pods')
    sel = _selector(selector, "labelSelector")
    ok, msel_json = _metric_selector(snap, msel)
    items: list[dict[str, Any]] = []
    if ns == snap.namespace and ok:
        eq = sel.equalities()
        candidates: list[str] | None = None
        for kv in eq.items():  # smallest index bucket wins; absent bucket = no pods
            bucket = snap.index.get(kv, [])
            if candidates is None or len(bucket) < len(candidates):
                candidates = bucket
        names = candidates if candidates is not None else sorted(snap.pods)
        for name in names:
            pod = snap.pods[name]
            if not sel.matches(pod.labels):
                continue
            v = pod.values.get(metric)
            if v is not None:
                items.append(_item(version, ns, "Pod", "/v1", name, metric, v, snap.window_s, msel_json))
    return snap.remember(key, (200, _list(version, items)))


def named_get(snap: Snapshot, version: str, ns: str, resource: str, name: str, metric: str, msel: str | None):
    """``RESOURCE/NAME/METRIC``: one item, or 404 when the object or its value is absent."""
    key = ("get", version, ns, resource, name, metric, msel)
    hit = snap.cached(key)
    if hit is not None:
        return hit
    _check_namespace(ns)
    _check_metric(metric)
    if resource != RES_PODS and resource not in OBJECT_RESOURCES:
        raise not_found(f"the server could not find the requested resource {resource!r}")
    catalog = sig.CUSTOM_POD_METRICS if resource == RES_PODS else sig.CUSTOM_OBJECT_METRICS
    if metric not in catalog:
        raise not_found(f'the server could not find the metric "{metric}" for {resource}')
    ok, msel_json = _metric_selector(snap, msel)
    if name == "*":
        if resource == RES_PODS:  # pragma: no cover - routed to pods_list
            return pods_list(snap, version, ns, metric, None, msel)
        items = []
        if ns == snap.namespace and ok:
            kind, av = OBJECT_RESOURCES[resource]
            for (res, oname), obj in sorted(snap.objects.items()):
                if res == resource and (v := obj.values.get(metric)) is not None:
                    items.append(_item(version, ns, kind, av, oname, metric, v, snap.window_s, msel_json))
        return snap.remember(key, (200, _list(version, items)))
    _check_name(name)
    if ns != snap.namespace:
        raise not_found(f'{resource} "{name}" not found in namespace "{ns}"')
    if resource == RES_PODS:
        pod = snap.pods.get(name)
        if pod is None:
            raise not_found(f'pods "{name}" not found')
        v = pod.values.get(metric)
        kind, av = "Pod", "/v1"
    else:
        obj = snap.objects.get((resource, name))
        if obj is None:
            raise not_found(f'{resource} "{name}" not found')
        v = obj.values.get(metric)
        kind, av = OBJECT_RESOURCES[resource]
    if v is None or not ok:
        raise not_found(f'the server could not find the metric "{metric}" for {resource} "{name}" (no value)')
    return snap.remember(
        key, (200, _list(version, [_item(version, ns, kind, av, name, metric, v, snap.window_s, msel_json)]))
    )


def namespace_get(snap: Snapshot, version: str, ns: str, metric: str, msel: str | None):
    key = ("ns", version, ns, metric, msel)
    hit = snap.cached(key)
    if hit is not None:
        return hit
    _check_namespace(ns)
    _check_metric(metric)
    if metric not in sig.NAMESPACE_METRICS:
        raise not_found(f'the server could not find the metric "{metric}" for namespaces')
    ok, msel_json = _metric_selector(snap, msel)
    v = snap.namespace_values.get(metric) if ns == snap.namespace else None
    if v is None or not ok:
        raise not_found(f'the server could not find the metric "{metric}" for namespaces "{ns}"')
    item = _item(version, None, "Namespace", "/v1", ns, metric, v, snap.window_s, msel_json)
    return snap.remember(key, (200, _list(version, [item])))


def discovery(version: str) -> dict[str, Any]:
    res = []
    for m in sorted(sig.CUSTOM_POD_METRICS):
        res.append({"name": f"pods/{m}", "singularName": "", "namespaced": True,
                    "kind": "MetricValueList", "verbs": ["get"]})
    for resource in (RES_DEPLOYMENTS, RES_LWS):
        for m in sorted(sig.CUSTOM_OBJECT_METRICS):
            res.append({"name": f"{resource}/{m}", "singularName": "", "namespaced": True,
                        "kind": "MetricValueList", "verbs": ["get"]})
    for m in sorted(sig.NAMESPACE_METRICS):
        res.append({"name": f"namespaces/{m}", "singularName": "", "namespaced": False,
                    "kind": "MetricValueList", "verbs": ["get"]})
    return {"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": f"{GROUP}/{version}",
            "resources": res}


def _respond(result: tuple[int, bytes]) -> Response:
    return Response(result[1], status_code=result[0], media_type="application/json")


def router(state: ApiState) -> APIRouter:
    r = APIRouter(tags=["custom.metrics.k8s.io"])

    def add(version: str) -> None:
        base = f"/apis/{GROUP}/{version}"
        list_model = schemas.MetricValueListV1beta2 if version == "v1beta2" else schemas.MetricValueListV1beta1
        responses = {200: {"model": list_model}, **schemas.ERRORS}
        disc = dumps(discovery(version))

        @r.get(base, response_model=schemas.APIResourceList, summary=f"discovery {version}",
               operation_id=f"custom_discovery_{version}", responses=schemas.ERRORS)
        def _discovery() -> Response:
            return Response(disc, media_type="application/json")

        @r.get(base + "/namespaces/{namespace}/metrics/{metric}", response_model=list_model,
               responses=responses, operation_id=f"custom_namespace_{version}",
               summary="namespace metric")
        def _namespace(namespace: str, metric: str, metricLabelSelector: str | None = None) -> Response:
            return _respond(namespace_get(state.snapshot, version, namespace, metric, metricLabelSelector))

        @r.get(base + "/namespaces/{namespace}/pods/{name}/{metric}", response_model=list_model,
               responses=responses, operation_id=f"custom_pods_{version}",
               summary="pod metrics: name '*' lists the pods matching labelSelector")
        def _pods(
            namespace: str,
            name: str,
            metric: str,
            labelSelector: str | None = None,
            metricLabelSelector: str | None = None,
        ) -> Response:
            snap = state.snapshot
            if name == "*":
                return _respond(pods_list(snap, version, namespace, metric, labelSelector, metricLabelSelector))
            _selector(labelSelector, "labelSelector")  # still validated on a named get
            return _respond(named_get(snap, version, namespace, RES_PODS, name, metric, metricLabelSelector))

        @r.get(base + "/namespaces/{namespace}/{resource}/{name}/{metric}", response_model=list_model,
               responses=responses, operation_id=f"custom_object_{version}",
               summary="object metric (deployments.apps, leaderworkersets.leaderworkerset.x-k8s.io)")
        def _object(
            namespace: str,
            resource: str,
            name: str,
            metric: str,
            labelSelector: str | None = None,
            metricLabelSelector: str | None = None,
        ) -> Response:
            _selector(labelSelector, "labelSelector")
            if resource == RES_PODS:  # pragma: no cover - matched by the pods route first
                raise ApiError(404, "use the pods route")
            return _respond(named_get(state.snapshot, version, namespace, resource, name, metric,
                                      metricLabelSelector))

    for v in VERSIONS:
        add(v)
    return r
