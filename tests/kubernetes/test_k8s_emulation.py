"""The emulated controllers behave as upstream documents: Deployments, scheduling, devices, mig-manager, the HPA."""

from __future__ import annotations

import time

from controllers import ReplicaSetController
from gpu_operator import gpu_node
from k8s_helpers import NS, wait_until

from autoscaler.api.app import create_app
from autoscaler.api.server import serve_in_thread
from autoscaler.api.state import ApiState
from autoscaler.api.synthetic import demo_models, demo_tick


def deployment(name: str, replicas: int, limits: dict | None = None) -> dict:
    return {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": name, "namespace": NS},
            "spec": {"replicas": replicas, "selector": {"matchLabels": {"app": name}},
                     "template": {"metadata": {"labels": {"app": name}},
                                  "spec": {"containers": [{"name": "c", "image": "x:1",
                                                           "resources": {"limits": limits or {}}}]}}}}


def pods(fake, app: str, *, live: bool = True) -> list[dict]:
    return [p for p in fake.list("Pod") if p["metadata"]["labels"].get("app") == app
            and not (live and p["metadata"].get("deletionTimestamp"))]


def is_ready(p: dict) -> bool:
    return any(c["type"] == "Ready" and c["status"] == "True" for c in p.get("status", {}).get("conditions", []))


def test_a_deployments_pods_are_ready_after_the_delay_and_its_status_counts_them(cluster):
    fake = cluster.fake
    cluster.add_nodes(1, {"1g.10gb": 7})
    t0 = time.monotonic()
    fake.create_obj(deployment("web", 3))
    d = wait_until(lambda: (x := fake.get("Deployment", "web")).get("status", {}).get("readyReplicas") == 3 and x, 10)
    assert time.monotonic() - t0 >= cluster.kubelet.ready_delay_s
    assert d["status"]["observedGeneration"] == 1 and d["status"]["availableReplicas"] == 3
    rs = fake.list("ReplicaSet")
    assert len(rs) == 1 and rs[0]["metadata"]["ownerReferences"][0]["kind"] == "Deployment"
    assert all(p["metadata"]["ownerReferences"][0]["uid"] == rs[0]["metadata"]["uid"] for p in pods(fake, "web"))


def test_scale_down_removes_the_pod_with_the_lowest_deletion_cost(cluster):
    fake = cluster.fake
    cluster.add_nodes(1, {"1g.10gb": 7})
    fake.create_obj(deployment("web", 3))
    wait_until(lambda: sum(is_ready(p) for p in pods(fake, "web")) == 3, 10)
    victim = sorted(p["metadata"]["name"] for p in pods(fake, "web"))[1]
    p = fake.get("Pod", victim)
    p["metadata"]["annotations"] = {"controller.kubernetes.io/pod-deletion-cost": "-100"}
    fake.update_obj(p, "migscale", check_rv=False)
    d = fake.get("Deployment", "web")
    d["spec"]["replicas"] = 2
    fake.update_obj(d, "migscale", check_rv=False)
    wait_until(lambda: fake.get("Pod", victim) is None, 5, "the marked pod to go")
    assert len(pods(fake, "web")) == 2
    # ranking: unassigned before assigned, pending before running, not ready before ready, then cost, then newest
    rank = ReplicaSetController._deletion_rank
    base = {"metadata": {"creationTimestamp": "2026-01-01T00:00:00Z"}, "spec": {"nodeName": "n"},
            "status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}}
    unassigned = {**base, "spec": {}}
    notready = {**base, "status": {"phase": "Running", "conditions": []}}
    assert rank(unassigned) < rank(notready) < rank(base)


def test_a_pod_with_no_free_instance_is_unschedulable_and_a_cordoned_node_is_skipped(cluster):
    fake = cluster.fake
    fake.put_object(gpu_node("free", {"1g.10gb": 1}))
    node = gpu_node("cordoned", {"1g.10gb": 7})
    node["spec"]["unschedulable"] = True
    fake.put_object(node)
    fake.create_obj(deployment("gpu", 2, {"nvidia.com/mig-1g.10gb": 1}))
    wait_until(lambda: sum(is_ready(p) for p in pods(fake, "gpu")) == 1, 10)
    pending = wait_until(lambda: [p for p in pods(fake, "gpu") if p.get("status", {}).get("conditions", [{}])[0].get("reason") == "Unschedulable"], 5)
    assert "Insufficient nvidia.com/mig-1g.10gb" in pending[0]["status"]["conditions"][0]["message"]
    assert all(p["spec"].get("nodeName") != "cordoned" for p in pods(fake, "gpu"))


def test_the_device_plugin_refuses_a_pod_bound_where_no_device_is_left(cluster):
    fake = cluster.fake
    fake.put_object(gpu_node("n", {"1g.10gb": 1}))
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "late", "namespace": NS},
           "spec": {"nodeName": "n", "containers": [{"name": "c", "image": "x:1",
                                                     "resources": {"limits": {"nvidia.com/mig-1g.10gb": 1}}}]}}
    fake.create_obj(deployment("first", 1, {"nvidia.com/mig-1g.10gb": 1}))
    wait_until(lambda: any(is_ready(p) for p in pods(fake, "first")), 10)
    fake.create_obj(pod)  # bound by hand past the scheduler: the one device is taken
    st = wait_until(lambda: (p := fake.get("Pod", "late")) and p.get("status", {}).get("phase") == "Failed" and p["status"], 5)
    assert st["reason"] == "UnexpectedAdmissionError"


def test_mig_manager_fails_while_a_gpu_is_in_use_and_applies_when_idle(cluster):
    fake = cluster.fake
    fake.put_object(gpu_node("n", {"1g.10gb": 7}, config="all-1g"))
    fake.create_obj({"apiVersion": "v1", "kind": "ConfigMap",
                     "metadata": {"name": "migscale-mig-parted-config", "namespace": "gpu-operator"},
                     "data": {"config.yaml": "version: v1\nmig-configs:\n  two-3g:\n    - devices: [0]\n"
                                             "      mig-enabled: true\n      mig-devices: {3g.40gb: 2}\n"}})
    fake.create_obj(deployment("busy", 1, {"nvidia.com/mig-1g.10gb": 1}))
    wait_until(lambda: any(is_ready(p) for p in pods(fake, "busy")), 10)

    def relabel(config: str) -> None:
        n = fake.get("Node", "n", None)
        n["metadata"]["labels"]["nvidia.com/mig.config"] = config
        fake.update_obj(n, "migscale", check_rv=False)

    relabel("two-3g")
    states = []
    wait_until(lambda: states.append(fake.get("Node", "n", None)["metadata"]["labels"]["nvidia.com/mig.config.state"])
               or states[-1] == "failed", 10, "mig-manager to fail")  # a pod still holds a MIG device
    assert "pending" in states
    assert fake.get("Node", "n", None)["status"]["allocatable"]["nvidia.com/mig-1g.10gb"] == "7"
    d = fake.get("Deployment", "busy")
    d["spec"]["replicas"] = 0
    fake.update_obj(d, "test", check_rv=False)
    wait_until(lambda: not pods(fake, "busy", live=False), 5)
    relabel("all-1g")  # back to the applied config: success at once, then the new one again
    relabel("two-3g")
    node = wait_until(lambda: (n := fake.get("Node", "n", None))["metadata"]["labels"]["nvidia.com/mig.config.state"]
                      == "success" and n["metadata"]["labels"].get("nvidia.com/mig-3g.40gb.count") and n, 10)
    assert node["status"]["allocatable"]["nvidia.com/mig-3g.40gb"] == "2"
    assert "nvidia.com/mig-1g.10gb" not in node["status"]["allocatable"]
    assert "nvidia.com/mig-1g.10gb.count" not in node["metadata"]["labels"]


def test_mig_manager_writes_its_labels_as_changes_and_never_puts_back_a_config_label():
    """A step that read the node before someone relabelled it changes only its own keys."""
    from fakeapi import FakeKube
    from gpu_operator import MigManager

    fake = FakeKube()
    fake.put_object(gpu_node("n", {"1g.10gb": 7}, config="all-1g"))
    stale = fake.get("Node", "n", None)
    fresh = fake.get("Node", "n", None)
    fresh["metadata"]["labels"].update({"nvidia.com/mig.config": "two-3g", "team": "a"})
    fake.update_obj(fresh, "migscale", check_rv=False)
    lbls = stale["metadata"]["labels"]
    MigManager(fake)._write(stale, {**lbls, "nvidia.com/mig.config.state": "pending"}, None)
    now = fake.get("Node", "n", None)["metadata"]["labels"]
    assert now["nvidia.com/mig.config"] == "two-3g" and now["team"] == "a"
    assert now["nvidia.com/mig.config.state"] == "pending"


def test_the_hpa_reads_migscales_external_metric_over_http_and_scales_its_target(cluster):
    fake = cluster.fake
    cluster.add_nodes(1, {"1g.10gb": 7})
    state = ApiState("default")
    obs, plan, cl = demo_tick(time.time())  # resnet at 240 req/s
    state.update(obs, plan, cl, demo_models())
    api = serve_in_thread(create_app(state), "127.0.0.1", 0, None)
    try:
        hpa = cluster.add_hpa_controller(api.url, sync_s=0.2)
        fake.create_obj(deployment("frontend", 1))
        fake.create_obj({"apiVersion": "autoscaling/v2", "kind": "HorizontalPodAutoscaler",
                         "metadata": {"name": "frontend", "namespace": NS},
                         "spec": {"scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": "frontend"},
                                  "minReplicas": 1, "maxReplicas": 10,
                                  "metrics": [{"type": "External", "external": {
                                      "metric": {"name": "migscale_model_requests_per_second",
                                                 "selector": {"matchLabels": {"model": "resnet"}}},
                                      "target": {"type": "AverageValue", "averageValue": "50"}}}]}})
        wait_until(lambda: fake.get("Deployment", "frontend")["spec"]["replicas"] == 5, 10, "240/50 -> 5 replicas")
        assert fake.field_writers[("Deployment", NS, "frontend")]["spec.replicas"] == {"horizontal-pod-autoscaler"}
        h = wait_until(lambda: (x := fake.get("HorizontalPodAutoscaler", "frontend")).get("status") and x)
        assert h["status"]["desiredReplicas"] == 5
        assert any(e["reason"] == "SuccessfulRescale" and e["regarding"]["name"] == "frontend" for e in fake.list("Event"))
        assert not hpa.errors
    finally:
        api.stop()
