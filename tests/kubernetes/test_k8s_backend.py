"""The Kubernetes backend against the fake API server: apply, conflicts, ownership, scale, inventory."""

from __future__ import annotations

import pytest
from k8s_helpers import CFG, LLM, NS, RESNET, gpu_node, plan, pod

from autoscaler.act.kubernetes.client import KubeError
from autoscaler.act.kubernetes.backend import KubernetesBackend
from autoscaler.policy.types import Action, ActionKind, Reason, ReplicaState


def backend(connect, **kw) -> KubernetesBackend:
    return KubernetesBackend(connect(), [RESNET, LLM], CFG, **kw)


def test_apply_plan_creates_expected_objects(fake, connect):
    be = backend(connect)
    errors = be.apply_plan(plan({("resnet", "1g.10gb"): 2, ("resnet", "2g.20gb"): 1, ("llm", "whole"): 1}))
    assert errors == []
    d1 = fake.get("Deployment", "resnet-1g-10gb")
    assert d1["spec"]["replicas"] == 2
    limits = d1["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"]
    assert limits == {"nvidia.com/mig-1g.10gb": 1}
    assert fake.get("Deployment", "resnet-2g-20gb")["spec"]["replicas"] == 1
    hpa = fake.get("HorizontalPodAutoscaler", "resnet-1g-10gb")
    # dependents are owned by their Deployment, so deleting it garbage-collects them
    assert hpa["metadata"]["ownerReferences"][0]["uid"] == d1["metadata"]["uid"]
    assert hpa["spec"]["metrics"][0]["pods"]["metric"]["name"] == "migscale_replica_ratio"
    assert fake.get("PodDisruptionBudget", "resnet-2g-20gb") is not None
    assert fake.get("Service", "resnet")["spec"]["selector"]["migscale.io/model"] == "resnet"
    lws = fake.get("LeaderWorkerSet", "llm")
    assert lws["spec"]["replicas"] == 1 and lws["spec"]["leaderWorkerTemplate"]["size"] == 2
    lws_hpa = fake.get("HorizontalPodAutoscaler", "llm")
    assert lws_hpa["spec"]["scaleTargetRef"]["kind"] == "LeaderWorkerSet"
    assert fake.get("PodMonitor", "migscale-triton") is not None
    for obj in fake.objects.values():
        assert obj["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "migscale"


def test_reapply_writes_nothing_and_dropped_profile_is_deleted(fake, connect):
    be = backend(connect)
    be.apply_plan(plan({("resnet", "1g.10gb"): 2, ("resnet", "2g.20gb"): 1}))
    before = len(fake.writes())
    assert be.apply_plan(plan({("resnet", "1g.10gb"): 2, ("resnet", "2g.20gb"): 1})) == []
    assert len(fake.writes()) == before  # idempotent: nothing to change, nothing written
    assert be.apply_plan(plan({("resnet", "1g.10gb"): 2})) == []
    for kind in ("Deployment", "HorizontalPodAutoscaler", "PodDisruptionBudget"):
        assert fake.get(kind, "resnet-2g-20gb") is None
        assert fake.get(kind, "resnet-1g-10gb") is not None


def test_replace_retries_after_conflict(fake, connect):
    be = backend(connect)
    be.apply_plan(plan({("resnet", "1g.10gb"): 1}))
    fake.fail_next = [("PUT", "deployments/resnet-1g-10gb", 409), ("PUT", "deployments/resnet-1g-10gb", 409)]
    be.cfg = CFG.__class__(namespace=NS, image="nvcr.io/nvidia/tritonserver:25.01-py3")
    assert be.apply_plan(plan({("resnet", "1g.10gb"): 1})) == []
    puts = [
        r.status for r in fake.requests if r.method == "PUT" and r.path.endswith("deployments/resnet-1g-10gb")
    ]
    assert puts == [409, 409, 200]
    image = fake.get("Deployment", "resnet-1g-10gb")["spec"]["template"]["spec"]["containers"][0]["image"]
    assert image.endswith("25.01-py3")


def test_a_write_racing_between_read_and_update_is_retried(fake, connect):
    """A real stale resourceVersion: the HPA scales the Deployment after our GET, before our PUT."""
    be = backend(connect)
    be.apply_plan(plan({("resnet", "1g.10gb"): 1}))
    raced = []

    def hpa_scales_first(method, path):
        if method == "PUT" and path.endswith("deployments/resnet-1g-10gb") and not raced:
            live = fake.get("Deployment", "resnet-1g-10gb")
            live["spec"]["replicas"] = 4
            fake.put_object(live)  # bumps the resourceVersion our PUT carries
            raced.append(live["metadata"]["resourceVersion"])

    fake.before.append(hpa_scales_first)
    be.cfg = CFG.__class__(namespace=NS, image="nvcr.io/nvidia/tritonserver:25.01-py3")
    assert be.apply_plan(plan({("resnet", "1g.10gb"): 1})) == []
    puts = [
        r.status for r in fake.requests if r.method == "PUT" and r.path.endswith("deployments/resnet-1g-10gb")
    ]
    assert raced and puts == [409, 200]
    live = fake.get("Deployment", "resnet-1g-10gb")
    assert live["spec"]["template"]["spec"]["containers"][0]["image"].endswith("25.01-py3")
    assert live["spec"]["replicas"] == 4  # the retry re-read the object and kept the HPA's size


def test_conflict_that_never_clears_is_reported(fake, connect):
    be = backend(connect)
    be.apply_plan(plan({("resnet", "1g.10gb"): 1}))
    fake.fail_next = [("PUT", "deployments/resnet-1g-10gb", 409)] * 5
    be.cfg = CFG.__class__(namespace=NS, image="other:1")
    errors = be.apply_plan(plan({("resnet", "1g.10gb"): 1}))
    assert any("still conflicting" in e for e in errors)


def test_stale_resource_version_is_a_conflict(fake, connect):
    rest = connect()
    be = backend(connect)
    be.apply_plan(plan({("resnet", "1g.10gb"): 1}))
    old = rest.get("apps/v1", "Deployment", NS, "resnet-1g-10gb")
    rest.set_scale("apps/v1", "Deployment", NS, "resnet-1g-10gb", 2)  # someone else writes
    old["spec"]["replicas"] = 5
    with pytest.raises(KubeError) as exc:
        rest.replace(old)
    assert exc.value.status == 409


def test_objects_not_owned_are_left_alone(fake, connect):
    foreign = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "resnet-1g-10gb", "namespace": NS, "labels": {"team": "other"}},
        "spec": {
            "replicas": 7,
            "selector": {"matchLabels": {"a": "b"}},
            "template": {
                "metadata": {"labels": {"a": "b"}},
                "spec": {"containers": [{"name": "c", "image": "x"}]},
            },
        },
    }
    other_svc = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": "unrelated", "namespace": NS},
        "spec": {"ports": [{"port": 80}]},
    }
    fake.put_object(foreign)
    fake.put_object(other_svc)
    rv = fake.get("Deployment", "resnet-1g-10gb")["metadata"]["resourceVersion"]
    be = backend(connect)
    errors = be.apply_plan(plan({("resnet", "1g.10gb"): 1}))
    assert any("not managed by migscale" in e for e in errors)
    live = fake.get("Deployment", "resnet-1g-10gb")
    assert live["metadata"]["resourceVersion"] == rv and live["spec"]["replicas"] == 7
    assert fake.get("Service", "unrelated") is not None  # not garbage-collected
    # actions on a foreign Deployment are refused too
    errors = be.apply([Action(ActionKind.CREATE, Reason.SCALE_UP_DEMAND, model="resnet", profile="1g.10gb")])
    assert errors and fake.get("Deployment", "resnet-1g-10gb")["spec"]["replicas"] == 7


def test_actions_move_sizes_through_the_scale_subresource(fake, connect):
    be = backend(connect)
    up = Action(
        ActionKind.CREATE, Reason.SCALE_UP_DEMAND, gpu="n/0", model="resnet", profile="1g.10gb", start=0
    )
    down = Action(ActionKind.DELETE, Reason.SCALE_DOWN_DEMAND, model="resnet", profile="1g.10gb", replica="x")
    assert be.apply([up]) == []  # from nothing: the Deployment and its dependents are created
    assert fake.get("Deployment", "resnet-1g-10gb")["spec"]["replicas"] == 1
    assert fake.get("HorizontalPodAutoscaler", "resnet-1g-10gb") is not None
    assert be.apply([up, up, Action(ActionKind.WAIT_READY, Reason.SCALE_UP_DEMAND, model="resnet")]) == []
    assert fake.get("Deployment", "resnet-1g-10gb")["spec"]["replicas"] == 3
    assert any(r.method == "PUT" and r.path.endswith("/scale") for r in fake.requests)
    assert be.apply([down, down, down]) == []
    assert fake.get("Deployment", "resnet-1g-10gb") is None
    assert fake.get("HorizontalPodAutoscaler", "resnet-1g-10gb") is None
    # a multinode model scales by whole groups on its LeaderWorkerSet
    grp = Action(ActionKind.CREATE, Reason.SCALE_UP_DEMAND, model="llm", profile="whole")
    assert be.apply([grp]) == [] and be.apply([grp]) == []
    assert fake.get("LeaderWorkerSet", "llm")["spec"]["replicas"] == 2


def test_reapplying_keeps_the_hpa_chosen_size(fake, connect):
    be = backend(connect)
    be.apply_plan(plan({("resnet", "1g.10gb"): 2}))
    connect().set_scale("apps/v1", "Deployment", NS, "resnet-1g-10gb", 5)  # the HPA scaled it
    be.apply_plan(plan({("resnet", "1g.10gb"): 2}))
    assert fake.get("Deployment", "resnet-1g-10gb")["spec"]["replicas"] == 5


def test_converging_follows_ready_replicas(fake, connect):
    be = KubernetesBackend(connect(), [RESNET], CFG)
    be.apply_plan(plan({("resnet", "1g.10gb"): 2}))
    assert be.converging() is True  # 0 of 2 ready
    d = fake.get("Deployment", "resnet-1g-10gb")
    d["status"] = {"replicas": 2, "readyReplicas": 2}
    fake.put_object(d)
    assert be.converging() is False
    node = gpu_node("node-a", {"1g.10gb": 7})
    node["metadata"]["labels"]["nvidia.com/mig.config.state"] = "pending"
    fake.put_object(node)
    assert be.converging() is True


def test_inventory_from_gfd_labels_and_pods(fake, connect):
    fake.put_object(gpu_node("node-a", {"3g.40gb": 2, "1g.10gb": 1}, gpus=2))
    fake.put_object({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "cpu-only", "labels": {}}})
    fake.put_object(pod("resnet-a", "node-a", profile="3g.40gb"))
    fake.put_object(pod("resnet-b", "node-a", profile="3g.40gb", ready=False))
    fake.put_object(pod("stranger", "node-a", owned=False))
    state = backend(connect).snapshot()
    assert [g.id for g in state.gpus] == ["node-a/0", "node-a/1"]
    assert all(g.product == "A100-SXM4-80GB" and g.mig_enabled for g in state.gpus)
    profiles = sorted(p.profile for g in state.gpus for p in g.layout)
    assert profiles == ["1g.10gb", "3g.40gb", "3g.40gb"]
    reps = {r.id: r for r in state.replicas}
    assert set(reps) == {"resnet-a", "resnet-b"}  # the unowned pod is not ours
    assert reps["resnet-a"].state is ReplicaState.READY and reps["resnet-b"].state is ReplicaState.STARTING
    # two 3g replicas land on two distinct 3g instances
    assert len({(r.gpu, r.start) for r in reps.values()}) == 2
