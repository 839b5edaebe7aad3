"""``external.metrics.k8s.io/v1beta1``: model-level series selected by label.

Part of the export step. An HPA ``type: External`` metric names a series and
a ``selector`` on its labels; the HPA calls

    GET /apis/external.metrics.k8s.io/v1beta1/namespaces/NS/METRIC?labelSelector=model=resnet

and sums the values of the returned ``ExternalMetricValueList``. Labels are
plain ``model``, ``profile`` and ``deployment`` (the Prometheus-style names an
external metric usually carries). Series live in the configured namespace;
other namespaces see an empty list, and an unknown metric is 404.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter
from fastapi.responses import Response

from autoscaler.api import schemas
from autoscaler.api import signals as sig
from autoscaler.api.custom import _check_metric, _check_namespace, _selector
from autoscaler.api.errors import not_found
from autoscaler.api.quantity import format_milli
from autoscaler.api.state import ApiState, Snapshot, dumps
from autoscaler.api.views import rfc3339

GROUP = "external.metrics.k8s.io"
VERSION = "v1beta1"


def external_list(snap: Snapshot, ns: str, metric: str, selector: str | None) -> tuple[int, bytes]:
    key = ("ext", ns, metric, selector)
    hit = snap.cached(key)
    if hit is not None:
        return hit
    _check_namespace(ns)
    _check_metric(metric)
    if metric not in sig.EXTERNAL_METRICS:
        raise not_found(f'the server could not find the external metric "{metric}"')
    sel = _selector(selector, "labelSelector")
    items: list[dict[str, Any]] = []
    if ns == snap.namespace:
        for it in snap.external.get(metric, []):
            if sel.matches(it.labels):
                item: dict[str, Any] = {
                    "metricName": metric,
                    "metricLabels": it.labels,
                    "timestamp": rfc3339(it.value[1]),
                }
                if snap.window_s is not None:
                    item["window"] = snap.window_s
                item["value"] = format_milli(it.value[0])
                items.append(item)
    body = dumps(
        {"kind": "ExternalMetricValueList", "apiVersion": f"{GROUP}/{VERSION}", "metadata": {}, "items": items}
    )
    return snap.remember(key, (200, body))


def discovery() -> dict[str, Any]:
    return {
        "kind": "APIResourceList",
        "apiVersion": "v1",
        "groupVersion": f"{GROUP}/{VERSION}",
        "resources": [
            {"name": m, "singularName": "", "namespaced": True, "kind": "ExternalMetricValueList",
             "verbs": ["get"]}
            for m in sorted(sig.EXTERNAL_METRICS)
        ],
    }


def router(state: ApiState) -> APIRouter:
    r = APIRouter(tags=[GROUP])
    base = f"/apis/{GROUP}/{VERSION}"
    disc = dumps(discovery())

    @r.get(base, response_model=schemas.APIResourceList, operation_id="external_discovery",
           responses=schemas.ERRORS, summary="discovery")
    def _discovery() -> Response:
        return Response(disc, media_type="application/json")

    @r.get(base + "/namespaces/{namespace}/{metric}", response_model=schemas.ExternalMetricValueList,
           responses={200: {"model": schemas.ExternalMetricValueList}, **schemas.ERRORS},
           operation_id="external_list", summary="external metric values matching labelSelector")
    def _list(namespace: str, metric: str, labelSelector: str | None = None) -> Response:
        status, body = external_list(state.snapshot, namespace, metric, labelSelector)
        return Response(body, status_code=status, media_type="application/json")

    return r
