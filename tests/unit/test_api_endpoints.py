"""Every endpoint's JSON shape, the Kubernetes Status errors, and missing-is-absent."""

from __future__ import annotations

import re

import pytest
from fastapi.testclient import TestClient

from autoscaler.api import ApiState, create_app
from autoscaler.api.quantity import parse_quantity
from autoscaler.api.synthetic import demo_models, demo_tick
from autoscaler.policy.types import ModelSignals, Observation

T0 = 1_800_000_000.0
CM2 = "/apis/custom.metrics.k8s.io/v1beta2"
CM1 = "/apis/custom.metrics.k8s.io/v1beta1"
EXT = "/apis/external.metrics.k8s.io/v1beta1"
TS_RE = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ$")


@pytest.fixture()
def state() -> ApiState:
    return ApiState()


@pytest.fixture()
def client(state: ApiState) -> TestClient:
    c = TestClient(create_app(state))  # the app (and its /metrics counters) exists before the first tick
    obs, plan, cluster = demo_tick(T0)
    state.update(obs, plan, cluster, demo_models(),
                 status={"models": [{"name": "resnet", "slo": {"p99_ms": 50}}]})
    return c


def assert_status(resp, code: int, reason: str) -> dict:
    assert resp.status_code == code
    body = resp.json()
    assert body["kind"] == "Status" and body["apiVersion"] == "v1"
    assert body["status"] == "Failure" and body["code"] == code and body["reason"] == reason
    assert isinstance(body["message"], str) and body["message"]
    return body


# ---------------------------------------------------------------- discovery


def test_api_group_list(client):
    body = client.get("/apis").json()
    assert body["kind"] == "APIGroupList"
    groups = {g["name"]: g for g in body["groups"]}
    assert groups["custom.metrics.k8s.io"]["preferredVersion"]["version"] == "v1beta2"
    assert [v["version"] for v in groups["custom.metrics.k8s.io"]["versions"]] == ["v1beta2", "v1beta1"]
    assert groups["external.metrics.k8s.io"]["versions"][0]["groupVersion"] == "external.metrics.k8s.io/v1beta1"
    assert client.get("/apis/custom.metrics.k8s.io").json()["kind"] == "APIGroup"


@pytest.mark.parametrize("version", ["v1beta1", "v1beta2"])
def test_custom_discovery(client, version):
    body = client.get(f"/apis/custom.metrics.k8s.io/{version}").json()
    assert body["kind"] == "APIResourceList" and body["groupVersion"] == f"custom.metrics.k8s.io/{version}"
    names = {r["name"]: r for r in body["resources"]}
    assert names["pods/migscale_replica_ratio"] == {
        "name": "pods/migscale_replica_ratio", "singularName": "", "namespaced": True,
        "kind": "MetricValueList", "verbs": ["get"],
    }
    assert "deployments.apps/migscale_desired_replicas" in names
    assert "leaderworkersets.leaderworkerset.x-k8s.io/migscale_desired_replicas" in names
    assert names["namespaces/migscale_gpus_in_use"]["namespaced"] is False


def test_external_discovery(client):
    body = client.get(EXT).json()
    assert body["groupVersion"] == "external.metrics.k8s.io/v1beta1"
    assert all(r["kind"] == "ExternalMetricValueList" for r in body["resources"])
    assert "migscale_model_p99_seconds" in {r["name"] for r in body["resources"]}


# ---------------------------------------------------------------- custom metrics


def test_pods_list_v1beta2_shape(client):
    r = client.get(f"{CM2}/namespaces/default/pods/*/migscale_replica_ratio",
                   params={"labelSelector": "migscale.io/deployment=resnet-1g-10gb"})
    assert r.status_code == 200 and r.headers["content-type"] == "application/json"
    body = r.json()
    assert body["kind"] == "MetricValueList" and body["apiVersion"] == "custom.metrics.k8s.io/v1beta2"
    assert body["metadata"] == {}
    [item] = body["items"]
    assert set(item) == {"describedObject", "metric", "timestamp", "value"}
    assert item["describedObject"] == {"kind": "Pod", "namespace": "default", "name": "resnet-0", "apiVersion": "/v1"}
    assert item["metric"] == {"name": "migscale_replica_ratio", "selector": None}
    assert TS_RE.match(item["timestamp"])
    # plan wants 2 resnet 1g.10gb, 1 exists: 2/1, served just below the integer
    assert item["value"] == "1999m"


def test_pods_list_v1beta1_shape(client):
    body = client.get(f"{CM1}/namespaces/default/pods/*/migscale_slice_utilization_ratio").json()
    assert body["apiVersion"] == "custom.metrics.k8s.io/v1beta1"
    items = {i["describedObject"]["name"]: i for i in body["items"]}
    assert set(items["bert-0"]) == {"describedObject", "metricName", "timestamp", "value", "selector"}
    assert items["bert-0"]["metricName"] == "migscale_slice_utilization_ratio"
    assert items["bert-0"]["value"] == "930m"
    assert items["resnet-1"]["value"] == "600m"  # DCGM GR_ENGINE_ACTIVE preferred over Triton busy fraction
    assert "bert-1" not in items  # draining: a terminating pod the HPA does not count


def test_selector_narrows_and_metric_selector_echoes(client):
    body = client.get(f"{CM2}/namespaces/default/pods/*/migscale_queue_compute_ratio",
                      params={"labelSelector": "migscale.io/model=resnet,migscale.io/profile in (2g.20gb)",
                              "metricLabelSelector": "!shard"}).json()
    assert [i["describedObject"]["name"] for i in body["items"]] == ["resnet-1"]
    assert body["items"][0]["value"] == "350m"
    assert body["items"][0]["metric"]["selector"] == {
        "matchExpressions": [{"key": "shard", "operator": "DoesNotExist"}]
    }


def test_named_pod_and_objects(client):
    r = client.get(f"{CM2}/namespaces/default/pods/resnet-0/migscale_replica_requests_per_second").json()
    # 240 req/s over 2 ready resnet replicas
    assert r["items"][0]["value"] == "120"
    d = client.get(f"{CM2}/namespaces/default/deployments.apps/bert-3g-40gb/migscale_desired_replicas").json()
    assert d["items"][0]["describedObject"] == {
        "kind": "Deployment", "namespace": "default", "name": "bert-3g-40gb", "apiVersion": "apps/v1"}
    assert d["items"][0]["value"] == "1"
    allobj = client.get(f"{CM1}/namespaces/default/deployments.apps/*/migscale_desired_replicas").json()
    values = {i["describedObject"]["name"]: i["value"] for i in allobj["items"]}
    assert values == {"bert-3g-40gb": "1", "resnet-1g-10gb": "2", "resnet-2g-20gb": "1",
                      "bert-2g-20gb": "0", "resnet-3g-40gb": "0"}


def test_namespace_metric(client):
    body = client.get(f"{CM2}/namespaces/default/metrics/migscale_slices_in_use").json()
    [item] = body["items"]
    assert item["describedObject"] == {"kind": "Namespace", "name": "default", "apiVersion": "/v1"}
    assert item["value"] == "6"  # 1g + 2g + 3g ready on gpu 0; the draining 3g is not counted


def test_external(client):
    body = client.get(f"{EXT}/namespaces/default/migscale_desired_replicas",
                      params={"labelSelector": "model=resnet"}).json()
    assert body["kind"] == "ExternalMetricValueList"
    assert body["apiVersion"] == "external.metrics.k8s.io/v1beta1"
    item = body["items"][0]
    assert set(item) == {"metricName", "metricLabels", "timestamp", "value"}
    got = {i["metricLabels"]["profile"]: i["value"] for i in body["items"]}
    # the plan covers resnet and wants no 3g.40gb: a planned 0, not a missing value
    assert got == {"1g.10gb": "2", "2g.20gb": "1", "3g.40gb": "0"}
    p99 = client.get(f"{EXT}/namespaces/default/migscale_model_p99_seconds").json()
    assert {i["metricLabels"]["model"]: parse_quantity(i["value"]) for i in p99["items"]} == {
        "bert": parse_quantity("182m"), "resnet": parse_quantity("28m")}
    other = client.get(f"{EXT}/namespaces/other/migscale_desired_replicas").json()
    assert other["items"] == []


# ---------------------------------------------------------------- errors


@pytest.mark.parametrize(
    "path",
    [
        f"{CM2}/namespaces/default/pods/*/no_such_metric",
        f"{CM2}/namespaces/default/pods/no-such-pod/migscale_replica_ratio",
        f"{CM2}/namespaces/default/deployments.apps/no-such/migscale_desired_replicas",
        f"{CM2}/namespaces/default/statefulsets.apps/x/migscale_desired_replicas",
        f"{CM2}/namespaces/default/metrics/no_such_metric",
        f"{CM2}/namespaces/other/deployments.apps/resnet-1g-10gb/migscale_desired_replicas",
        f"{EXT}/namespaces/default/no_such_metric",
        "/apis/custom.metrics.k8s.io/v1beta3/namespaces/default/pods/*/migscale_replica_ratio",
        "/no/such/route",
    ],
)
def test_not_found_is_status(client, path):
    assert_status(client.get(path), 404, "NotFound")


@pytest.mark.parametrize(
    "path, params",
    [
        (f"{CM2}/namespaces/default/pods/*/migscale_replica_ratio", {"labelSelector": "a in ("}),
        (f"{CM2}/namespaces/default/pods/*/migscale_replica_ratio", {"labelSelector": "a=b=c"}),
        (f"{CM2}/namespaces/default/pods/*/migscale_replica_ratio", {"metricLabelSelector": "!"}),
        (f"{CM2}/namespaces/Bad_NS/pods/*/migscale_replica_ratio", {}),
        (f"{CM2}/namespaces/default/pods/Bad_Name!/migscale_replica_ratio", {}),
        (f"{CM2}/namespaces/default/pods/*/bad%20metric", {}),
        (f"{EXT}/namespaces/default/migscale_desired_replicas", {"labelSelector": "model in (a"}),
    ],
)
def test_malformed_is_400_status(client, path, params):
    body = assert_status(client.get(path, params=params), 400, "BadRequest")
    assert "500" not in str(body["code"])


def test_method_not_allowed_is_status(client):
    assert_status(client.post("/healthz"), 405, "MethodNotAllowed")


# ---------------------------------------------------------------- missing is absent, never 0


def test_no_tick_yet_serves_nothing():
    c = TestClient(create_app(ApiState()))
    assert_status(c.get("/readyz"), 503, "ServiceUnavailable")
    assert c.get("/healthz").json() == {"status": "ok"}
    body = c.get(f"{CM2}/namespaces/default/pods/*/migscale_replica_ratio").json()
    assert body["items"] == []
    assert c.get("/v1/plan").json()["plan"] is None
    assert c.get("/v1/status").json() is None


def test_absent_signals_are_absent_not_zero():
    s = ApiState()
    obs, _plan, cluster = demo_tick(T0)
    # resnet's signals went stale: the observation carries None for every field
    blind = Observation(obs.t_s, cluster, {"resnet": ModelSignals("resnet", None), "bert": obs.models["bert"]})
    s.update(blind, None, cluster, demo_models())
    c = TestClient(create_app(s))
    q = c.get(f"{CM2}/namespaces/default/pods/*/migscale_queue_compute_ratio").json()
    assert {i["describedObject"]["name"] for i in q["items"]} == {"bert-0"}
    # no plan: no desired count and no replica ratio anywhere
    assert c.get(f"{CM2}/namespaces/default/pods/*/migscale_replica_ratio").json()["items"] == []
    assert_status(c.get(f"{CM2}/namespaces/default/deployments.apps/resnet-1g-10gb/migscale_desired_replicas"),
                  404, "NotFound")
    ext = c.get(f"{EXT}/namespaces/default/migscale_model_requests_per_second").json()
    assert [i["metricLabels"]["model"] for i in ext["items"]] == ["bert"]
    prom = c.get("/metrics").text
    assert 'migscale_model_requests_per_second{model="bert"}' in prom
    assert 'migscale_model_requests_per_second{model="resnet"}' not in prom


# ---------------------------------------------------------------- migscale endpoints


def test_plan_json(client):
    body = client.get("/v1/plan").json()
    plan = body["plan"]
    assert plan["reasons"] == {"bert": ["repartition", "keep"], "resnet": ["scale_up_demand"]}
    assert {"model": "resnet", "profile": "1g.10gb", "deployment": "resnet-1g-10gb", "replicas": 2} in plan["desired"]
    assert [a["kind"] for a in plan["actions"]] == ["drain", "repartition", "create"]
    gpus = {g["id"]: g for g in body["cluster"]["gpus"]}
    assert gpus["node-a/1"]["repartition_pending"] is True
    assert gpus["node-a/0"]["repartition_pending"] is False
    assert gpus["node-a/1"]["planned_layout"][-1] == {"profile": "1g.10gb", "start": 6}
    models = {m["name"]: m for m in body["models"]}
    assert models["resnet"]["slo_p99_ms"] == 50  # taken from the status dict
    assert models["bert"]["replicas"]["3g.40gb"]["draining"] == 1


def test_status_passthrough_and_history(state, client):
    assert client.get("/v1/status").json() == {"models": [{"name": "resnet", "slo": {"p99_ms": 50}}]}
    obs, plan, cluster = demo_tick(T0 + 5, extra_replica=True)
    state.update(obs, plan, cluster, demo_models(), status={"x": float("nan"), "t": (1, 2)})
    assert client.get("/v1/status").json() == {"x": None, "t": [1, 2]}
    hist = client.get("/v1/history").json()
    assert hist["window_s"] == 600.0
    assert hist["models"]["resnet"]["points"] == [[T0, 240.0, 28.0], [T0 + 5, 310.0, 41.0]]
    # points older than 10 minutes fall out
    obs, plan, cluster = demo_tick(T0 + 700, extra_replica=True)
    state.update(obs, plan, cluster, demo_models())
    assert [p[0] for p in client.get("/v1/history").json()["models"]["resnet"]["points"]] == [T0 + 700]


def test_prometheus_metrics(state, client):
    text = client.get("/metrics").text
    assert client.get("/metrics").headers["content-type"].startswith("text/plain")
    assert 'migscale_replicas{model="bert",profile="3g.40gb",state="draining"} 1.0' in text
    assert 'migscale_decisions_total{model="resnet",reason="scale_up_demand"} 1.0' in text
    assert "migscale_slices_in_use 6.0" in text
    assert 'migscale_replica_ratio{deployment="resnet-1g-10gb"' in text
    obs, plan, cluster = demo_tick(T0 + 5, extra_replica=True)
    state.update(obs, plan, cluster, demo_models(), tick_duration_s=0.25, plan_duration_s=0.004)
    text = client.get("/metrics").text
    assert "migscale_tick_duration_seconds_count 1.0" in text
    assert 'migscale_plan_duration_seconds_bucket{le="0.005"} 1.0' in text
    assert 'migscale_replicas{model="bert",profile="3g.40gb",state="draining"}' not in text
    for line in text.splitlines():
        if line and not line.startswith("#"):
            assert line.startswith("migscale_"), line


def test_multinode_model_is_a_leaderworkerset():
    from autoscaler.policy.types import ClusterState, Cost, GpuState, ModelSpec, Plan, Replica, ReplicaState

    spec = ModelSpec("llama", {}, (), backend="multinode", nodes_per_group=2, group_capacity_rps=40)
    cluster = ClusterState((GpuState("rdma-0/0", "rdma-0", "H100-SXM5-80GB", (), mig_enabled=False),),
                           (Replica("llama-g0", "llama", "whole", "rdma-0/0", 0, ReplicaState.READY),))
    plan = Plan(T0, {("llama", "whole"): 2}, (), {}, (), {}, Cost(), {})
    s = ApiState()
    s.update(None, plan, cluster, [spec], t_s=T0)
    c = TestClient(create_app(s))
    lws = "leaderworkersets.leaderworkerset.x-k8s.io"
    item = c.get(f"{CM2}/namespaces/default/{lws}/llama/migscale_desired_replicas").json()["items"][0]
    assert item["describedObject"]["kind"] == "LeaderWorkerSet"
    assert item["describedObject"]["apiVersion"] == "leaderworkerset.x-k8s.io/v1"
    assert item["value"] == "2"
    pods = c.get(f"{CM2}/namespaces/default/pods/*/migscale_replica_ratio",
                 params={"labelSelector": "leaderworkerset.sigs.k8s.io/name=llama"}).json()
    assert [(i["describedObject"]["name"], i["value"]) for i in pods["items"]] == [("llama-g0", "1999m")]


def test_fast_path_answers_exactly_like_the_route(state, client):
    """The middleware's answer (computed or cached) is byte-identical to FastAPI's route."""
    from autoscaler.api.custom import pods_list

    path = f"{CM2}/namespaces/default/pods/*/migscale_replica_ratio"
    q = {"labelSelector": "migscale.io/model=resnet"}
    first = client.get(path, params=q)  # computed in the middleware
    again = client.get(path, params=q)  # served from the per-tick cache
    direct = pods_list(state.snapshot, "v1beta2", "default", "migscale_replica_ratio", q["labelSelector"], None)
    assert first.content == again.content == direct[1]
    # an extra parameter goes through FastAPI: same body
    assert client.get(path, params={**q, "extra": "1"}).content == first.content
    # errors still come from the route, as Status
    assert_status(client.get(path, params={"labelSelector": "a in ("}), 400, "BadRequest")
    # a new tick drops the cache: the value follows the new plan
    obs, plan, cluster = demo_tick(T0 + 5, extra_replica=True)
    state.update(obs, plan, cluster, demo_models())
    after = client.get(path, params={"labelSelector": "migscale.io/deployment=resnet-1g-10gb"}).json()
    assert {i["describedObject"]["name"]: i["value"] for i in after["items"]} == {
        "resnet-0": "1", "resnet-2": "1"}  # 2 planned, 2 running


def test_a_tick_without_a_plan_keeps_the_last_plan(state, client):
    obs, _plan, cluster = demo_tick(T0 + 5)
    state.update(obs, None, cluster, demo_models())  # a tick with no plan: observed only
    body = client.get(f"{CM2}/namespaces/default/deployments.apps/resnet-1g-10gb/migscale_desired_replicas").json()
    assert body["items"][0]["value"] == "2"
    assert client.get("/v1/plan").json()["plan"]["reasons"]["resnet"] == ["scale_up_demand"]
    # counted once, not once per tick
    assert 'migscale_decisions_total{model="resnet",reason="scale_up_demand"} 1.0' in client.get("/metrics").text
    state.update(obs, None, cluster, demo_models(), keep_last_plan=False)
    assert_status(client.get(f"{CM2}/namespaces/default/deployments.apps/resnet-1g-10gb/migscale_desired_replicas"),
                  404, "NotFound")
