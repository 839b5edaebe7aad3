"""Response schemas, for the OpenAPI document only.

Handlers return pre-encoded bytes (the hot path never builds pydantic
objects); these models describe those bytes exactly so the OpenAPI document
is accurate and schemathesis can check every response against it. Field
names and optionality follow ``k8s.io/metrics`` (custom_metrics v1beta1 and
v1beta2, external_metrics v1beta1) and ``metav1.Status``.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field


class _M(BaseModel):
    model_config = ConfigDict(populate_by_name=True, extra="forbid")


class StatusModel(_M):
    kind: Literal["Status"]
    apiVersion: Literal["v1"]
    metadata: dict[str, Any]
    status: Literal["Failure"]
    message: str
    reason: str
    code: int


class ObjectReference(_M):
    kind: str
    namespace: str | None = None
    name: str
    apiVersion: str


class LabelSelectorRequirement(_M):
    key: str
    operator: Literal["In", "NotIn", "Exists", "DoesNotExist"]
    values: list[str] | None = None


class LabelSelector(_M):
    matchLabels: dict[str, str] | None = None
    matchExpressions: list[LabelSelectorRequirement] | None = None


class MetricIdentifier(_M):
    name: str
    selector: LabelSelector | None


class MetricValueV1beta2(_M):
    describedObject: ObjectReference
    metric: MetricIdentifier
    timestamp: str = Field(description="RFC 3339, UTC")
    windowSeconds: int | None = None
    value: str = Field(description="Kubernetes Quantity, e.g. 1500m")


class MetricValueV1beta1(_M):
    describedObject: ObjectReference
    metricName: str
    timestamp: str
    window: int | None = None
    value: str
    selector: LabelSelector | None


class ListMeta(_M):
    pass


class MetricValueListV1beta2(_M):
    kind: Literal["MetricValueList"]
    apiVersion: Literal["custom.metrics.k8s.io/v1beta2"]
    metadata: ListMeta
    items: list[MetricValueV1beta2]


class MetricValueListV1beta1(_M):
    kind: Literal["MetricValueList"]
    apiVersion: Literal["custom.metrics.k8s.io/v1beta1"]
    metadata: ListMeta
    items: list[MetricValueV1beta1]


class ExternalMetricValue(_M):
    metricName: str
    metricLabels: dict[str, str]
    timestamp: str
    window: int | None = None
    value: str


class ExternalMetricValueList(_M):
    kind: Literal["ExternalMetricValueList"]
    apiVersion: Literal["external.metrics.k8s.io/v1beta1"]
    metadata: ListMeta
    items: list[ExternalMetricValue]


class APIResource(_M):
    name: str
    singularName: str
    namespaced: bool
    kind: str
    verbs: list[str]


class APIResourceList(_M):
    kind: Literal["APIResourceList"]
    apiVersion: Literal["v1"]
    groupVersion: str
    resources: list[APIResource]


class GroupVersionForDiscovery(_M):
    groupVersion: str
    version: str


class APIGroup(_M):
    kind: Literal["APIGroup"] | None = None
    apiVersion: Literal["v1"] | None = None
    name: str
    versions: list[GroupVersionForDiscovery]
    preferredVersion: GroupVersionForDiscovery


class APIGroupList(_M):
    kind: Literal["APIGroupList"]
    apiVersion: Literal["v1"]
    groups: list[APIGroup]


class Health(_M):
    status: Literal["ok"]


class Placement(_M):
    profile: str
    start: int


class PlanBody(_M):
    """``/v1/plan``: the last plan with its reasons, and the cluster it was made against."""

    model_config = ConfigDict(extra="allow")
    t_s: float | None
    plan: dict[str, Any] | None
    cluster: dict[str, Any]
    models: list[dict[str, Any]]


class HistoryModel(_M):
    slo_p99_ms: float | None
    points: list[list[float | None]] = Field(description="[t_s, requests/s, p99 ms]; null = unknown")


class HistoryBody(_M):
    window_s: float
    models: dict[str, HistoryModel]


ERRORS: dict[int | str, dict[str, Any]] = {
    400: {"model": StatusModel, "description": "malformed path, selector or parameter"},
    404: {"model": StatusModel, "description": "unknown metric or object, or value absent"},
}
