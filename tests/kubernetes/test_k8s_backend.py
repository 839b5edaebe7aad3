"""The Kubernetes backend: what it creates, what it leaves alone, how it scales, what it costs in requests."""

from __future__ import annotations

import pytest
from controllers import DisruptionController, set_status
from k8s_helpers import CFG, NS, RESNET, act, caught_up, gpu_node, pod, wait_until

from autoscaler.act.kubernetes.client import KubeError
from autoscaler.act.kubernetes.render import RenderConfig
from autoscaler.policy.types import ReplicaState


def deployment_replicas(fake, name: str) -> int | None:
    d = fake.get("Deployment", name)
    return None if d is None else d["spec"]["replicas"]


def test_first_create_makes_workload_budget_service_and_no_hpa(fake, backends):
    be = backends()
    assert be.apply([act("create", "resnet"), act("create", "resnet"), act("create", "resnet", "2g.20gb"),
                     act("create", "llm", "whole", gpu="rdma-0/0", replica="llm-g0-0"),
                     act("create", "llm", "whole", gpu="rdma-1/0", replica="llm-g0-1")]) == []
    d1 = fake.get("Deployment", "resnet-1g-10gb")
    assert d1["spec"]["replicas"] == 2  # two CREATEs in a row are one write
    assert d1["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"] == {"nvidia.com/mig-1g.10gb": 1}
    pdb = fake.get("PodDisruptionBudget", "resnet-1g-10gb")
    # the budget is owned by its Deployment: deleting the Deployment garbage-collects it
    assert pdb["metadata"]["ownerReferences"][0]["uid"] == d1["metadata"]["uid"]
    assert fake.get("Deployment", "resnet-2g-20gb")["spec"]["replicas"] == 1
    assert fake.get("Service", "resnet")["spec"]["selector"]["migscale.io/model"] == "resnet"
    lws = fake.get("LeaderWorkerSet", "llm")
    assert lws["spec"]["replicas"] == 1 and lws["spec"]["leaderWorkerTemplate"]["size"] == 2  # one group of two
    assert fake.get("PodMonitor", "migscale-triton") is not None
    assert fake.list("HorizontalPodAutoscaler") == []  # migscale owns replicas: no HPA on its workloads
    for obj in fake.objects.values():
        if obj["kind"] != "Event":
            assert obj["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "migscale"


def test_sizes_move_through_the_scale_subresource_and_a_workload_retires_when_empty(cluster, backends):
    fake = cluster.fake
    cluster.add_nodes(2, {"1g.10gb": 7})
    be = backends([RESNET])
    caught_up(be, fake)
    assert be.apply([act("create", "resnet")] * 3) == []
    wait_until(lambda: len([r for r in be.snapshot().replicas if r.state is ReplicaState.READY]) == 3, what="3 ready")
    writes = [r for r in fake.requests if r.path.endswith("/deployments/resnet-1g-10gb/scale")]
    assert be.apply([act("create", "resnet")]) == []
    scale = [r for r in fake.requests if r.path.endswith("/deployments/resnet-1g-10gb/scale")]
    assert len(scale) == len(writes) + 1 and scale[-1].method == "PATCH"  # one request, on the subresource
    assert deployment_replicas(fake, "resnet-1g-10gb") == 4
    wait_until(lambda: sum(r.state is ReplicaState.READY for r in be.snapshot().replicas) == 4, what="4 ready")
    pods = sorted(r.id for r in be.snapshot().replicas)
    assert be.apply([act("drain", "resnet", replica=p) for p in pods] + [act("delete", "resnet", replica=p) for p in pods]) == []
    # Ready pods go only as far as the budget (maxUnavailable 1) allows: one per tick, never all at once
    assert deployment_replicas(fake, "resnet-1g-10gb") == 3
    sizes = [3]

    def size() -> int:
        # A workload retired in the same step that took it to 0 has no size left: it counts as 0
        got = deployment_replicas(fake, "resnet-1g-10gb")
        if got is None:
            assert not [p for p in fake.list("Pod") if p["metadata"]["labels"].get("migscale.io/model") == "resnet"], \
                "retired while its pods were still there"
        return got or 0

    while size():
        wait_until(lambda: (be.advance() or True) and size() < sizes[-1], what="next step")
        sizes.append(size())
    assert sizes == [3, 2, 1, 0]
    wait_until(lambda: (be.advance() or True) and size() == 0 and fake.get("Deployment", "resnet-1g-10gb") is None,
               what="retired")
    wait_until(lambda: fake.get("PodDisruptionBudget", "resnet-1g-10gb") is None, what="its budget collected")
    assert be.recorder.flush()
    events = [e for e in fake.list("Event") if e["regarding"]["name"] == "resnet-1g-10gb"]
    assert {"SuccessfulRescale", "Retired"} <= {e["reason"] for e in events}
    assert any("New size: 4; reason: scale_up_demand" == e["note"] for e in events)


def three_ready(cluster, backends, *, budget_lags: bool = False):
    """Three Ready resnet replicas on three nodes. ``budget_lags``: the budget's status then
    stands as the disruption controller wrote it while only two were Ready (2 healthy of 3
    expected, no disruption allowed), and that controller stays stopped."""
    fake = cluster.fake
    cluster.add_nodes(3, {"1g.10gb": 7})
    be = backends([RESNET])
    caught_up(be, fake)
    be.apply([act("create", "resnet")] * 3)
    wait_until(lambda: sum(r.state is ReplicaState.READY for r in be.snapshot().replicas) == 3, what="3 ready")
    if budget_lags:
        cluster.plane.stop()  # no step of it in flight while the status is set
        cluster.plane.held.add(DisruptionController)
        pdb = fake.get("PodDisruptionBudget", "resnet-1g-10gb")
        status = {**pdb["status"], "currentHealthy": 2, "disruptionsAllowed": 0,
                  "conditions": [{**pdb["status"]["conditions"][0], "status": "False", "reason": "InsufficientPods"}]}
        set_status(fake, pdb, status, DisruptionController.manager)
        cluster.plane.start()
    return fake, be


def test_drain_marks_the_chosen_pod_so_the_replicaset_removes_that_one(cluster, backends):
    fake, be = three_ready(cluster, backends)
    names = sorted(r.id for r in be.snapshot().replicas)
    victim = names[1]
    assert be.apply([act("drain", "resnet", replica=victim), act("delete", "resnet", replica=victim)]) == []
    # as the loop does, every tick advances what is under way (the budget may not yet count the third Ready pod)
    wait_until(lambda: not be.advance() and fake.get("Pod", victim) is None, what="the chosen pod to go")
    assert sorted(p["metadata"]["name"] for p in fake.list("Pod")
                  if not p["metadata"].get("deletionTimestamp")) == [names[0], names[2]]


def test_a_scale_down_waits_for_a_budget_that_does_not_yet_count_the_newest_ready_pod(cluster, backends):
    # The disruption controller updates a budget's status after the kubelet marks a pod Ready: in
    # between, the budget allows no disruption, and a Ready pod's removal waits for a later tick.
    fake, be = three_ready(cluster, backends, budget_lags=True)
    caught_up(be, fake)
    assert fake.get("PodDisruptionBudget", "resnet-1g-10gb")["status"]["disruptionsAllowed"] == 0
    victim = sorted(r.id for r in be.snapshot().replicas)[1]
    assert be.apply([act("drain", "resnet", replica=victim), act("delete", "resnet", replica=victim)]) == []
    assert [c.why for c in be.rollout.chains] == ["the disruption budget of resnet-1g-10gb allows no disruption now"]
    assert "resnet" in be.in_flight()[1]
    for _ in range(5):
        assert be.advance() == []
    assert deployment_replicas(fake, "resnet-1g-10gb") == 3 and fake.get("Pod", victim) is not None
    cluster.plane.held.clear()
    wait_until(lambda: not be.advance() and fake.get("Pod", victim) is None, what="the chosen pod to go")
    assert deployment_replicas(fake, "resnet-1g-10gb") == 2 and not be.rollout.chains


def test_steady_ticks_send_no_request(cluster, backends):
    cluster.add_nodes(20, {"1g.10gb": 7})
    be = backends([RESNET])
    be.apply([act("create", "resnet")] * 2)
    wait_until(lambda: sum(r.state is ReplicaState.READY for r in be.snapshot().replicas) == 2, what="2 ready")
    wait_until(lambda: not be.advance() and not be.rollout.chains, what="nothing under way")
    before = be.rest.total_requests()
    for _ in range(20):  # the loop's read path of a tick, and the backend's per-tick step
        be.snapshot()
        be.in_flight()
        assert be.advance() == []
        be.conditions(None)
    assert be.rest.total_requests() == before


def test_objects_not_owned_are_left_alone(fake, backends):
    fake.put_object({
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": "resnet-1g-10gb", "namespace": NS, "labels": {"team": "other"}},
        "spec": {"replicas": 7, "selector": {"matchLabels": {"a": "b"}},
                 "template": {"metadata": {"labels": {"a": "b"}}, "spec": {"containers": [{"name": "c", "image": "x"}]}}},
    })
    rv = fake.get("Deployment", "resnet-1g-10gb")["metadata"]["resourceVersion"]
    be = backends()
    errors = be.apply([act("create", "resnet")])
    assert len(errors) == 1 and "not managed by migscale" in errors[0]
    live = fake.get("Deployment", "resnet-1g-10gb")
    assert live["metadata"]["resourceVersion"] == rv and live["spec"]["replicas"] == 7


def test_an_hpa_on_a_migscale_workload_makes_migscale_stand_back(fake, backends):
    be = backends([RESNET])
    be.apply([act("create", "resnet")])
    fake.create_obj({"apiVersion": "autoscaling/v2", "kind": "HorizontalPodAutoscaler",
                     "metadata": {"name": "someones-hpa", "namespace": NS},
                     "spec": {"scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": "resnet-1g-10gb"},
                              "maxReplicas": 5, "metrics": [{"type": "Resource", "resource": {
                                  "name": "cpu", "target": {"type": "Utilization", "averageUtilization": 50}}}]}})
    caught_up(be, fake)
    errors = be.apply([act("create", "resnet")])
    assert len(errors) == 1 and "someones-hpa owns its replicas" in errors[0]
    assert deployment_replicas(fake, "resnet-1g-10gb") == 1  # not written
    assert be.recorder.flush()
    warn = [e for e in fake.list("Event") if e["reason"] == "ScaledByOtherController"]
    assert len(warn) == 1 and warn[0]["type"] == "Warning" and "someones-hpa" in warn[0]["note"]
    assert fake.field_writers.get(("Deployment", NS, "resnet-1g-10gb"), {}).get("spec.replicas", set()) == set()
    cond = be.conditions(_plan({("resnet", "1g.10gb"): 2}))["resnet"]
    assert cond["status"] == "False" and cond["reason"] == "ScaledByOtherController"


def test_a_template_change_is_applied_with_conflict_retries_and_keeps_the_size(fake, backends):
    be = backends([RESNET])
    be.apply([act("create", "resnet")] * 2)
    caught_up(be, fake)
    raced = []

    def someone_writes_first(method, path):
        if method == "PUT" and path.endswith("deployments/resnet-1g-10gb") and not raced:
            live = fake.get("Deployment", "resnet-1g-10gb")
            live["metadata"]["annotations"] = {"note": "someone"}
            fake.put_object(live)  # bumps the resourceVersion our PUT carries
            raced.append(1)

    fake.before.append(someone_writes_first)
    be.cfg = be.workloads.cfg = RenderConfig(namespace=NS, image="nvcr.io/nvidia/tritonserver:25.01-py3")
    assert be.workloads.reconcile_templates() == []
    puts = [r.status for r in fake.requests if r.method == "PUT" and r.path.endswith("deployments/resnet-1g-10gb")]
    assert raced and puts == [409, 200]
    live = fake.get("Deployment", "resnet-1g-10gb")
    assert live["spec"]["template"]["spec"]["containers"][0]["image"].endswith("25.01-py3")
    assert live["spec"]["replicas"] == 2
    fake.fail_next = [("PUT", "deployments/resnet-1g-10gb", 409)] * 5
    be.workloads.cfg = RenderConfig(namespace=NS, image="other:1")
    assert any("still conflicting" in e for e in be.workloads.reconcile_templates())


def test_stale_resource_version_is_a_conflict(fake, connect):
    rest = connect()
    fake.create_obj({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "x", "namespace": NS}, "data": {}})
    old = rest.get("v1", "ConfigMap", NS, "x")
    rest.merge_patch("v1", "ConfigMap", NS, "x", {"data": {"a": "1"}})
    old["data"] = {"b": "2"}
    with pytest.raises(KubeError) as exc:
        rest.replace(old)
    assert exc.value.status == 409


def test_an_object_the_cache_lacks_is_created_without_a_read_and_a_stale_cache_falls_back(fake, connect):
    from autoscaler.act.kubernetes.client import apply_object

    rest = connect()
    cm = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "x", "namespace": NS,
          "labels": {"app.kubernetes.io/managed-by": "migscale"}}, "data": {"a": "1"}}
    before = rest.total_requests()
    assert apply_object(rest, cm, absent=True)[0] == "created"
    assert rest.total_requests() - before == 1  # one POST, no GET
    changed = {**cm, "data": {"a": "2"}}
    assert apply_object(rest, changed, absent=True)[0] == "updated"  # the cache lagged: 409, then read and replace
    assert fake.get("ConfigMap", "x")["data"] == {"a": "2"}


def test_a_replace_keeps_what_other_writers_set_in_metadata(fake, connect):
    """A template reconcile replaces the object: the garbage collector's finalizer, the
    Deployment controller's annotation and an operator's label must survive it."""
    from autoscaler.act.kubernetes.client import apply_object

    rest = connect()
    mine = {"app.kubernetes.io/managed-by": "migscale", "migscale.io/model": "resnet"}
    cm = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "x", "namespace": NS,
          "labels": {**mine, "migscale.io/profile": "1g.10gb"}}, "data": {"a": "1"}}
    assert apply_object(rest, cm)[0] == "created"
    rest.merge_patch("v1", "ConfigMap", NS, "x", {"metadata": {
        "finalizers": ["orphan"], "annotations": {"deployment.kubernetes.io/revision": "3"},
        "labels": {"team": "vision"}}})
    # the render changes its data and no longer sets its profile label
    changed = {**cm, "metadata": {**cm["metadata"], "labels": dict(mine)}, "data": {"a": "2"}}
    assert apply_object(rest, changed)[0] == "updated"
    live = fake.get("ConfigMap", "x")
    assert live["data"] == {"a": "2"}
    assert live["metadata"]["finalizers"] == ["orphan"]
    assert live["metadata"]["annotations"] == {"deployment.kubernetes.io/revision": "3"}
    assert live["metadata"]["labels"] == {**mine, "team": "vision"}  # migscale's dropped label is gone
    assert apply_object(rest, changed)[0] == "unchanged"


def test_inventory_from_gfd_labels_and_pods(fake, backends):
    fake.put_object(gpu_node("node-a", {"3g.40gb": 2, "1g.10gb": 1}, gpus=2))
    fake.put_object({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "cpu-only", "labels": {}}})
    fake.put_object(pod("resnet-a", "node-a", profile="3g.40gb"))
    fake.put_object(pod("resnet-b", "node-a", profile="3g.40gb", ready=False))
    fake.put_object(pod("stranger", "node-a", owned=False))
    be = backends()
    caught_up(be, fake)
    state = be.snapshot()
    assert [g.id for g in state.gpus] == ["node-a/0", "node-a/1"]
    assert sorted(p.profile for g in state.gpus for p in g.layout) == ["1g.10gb", "3g.40gb", "3g.40gb"]
    reps = {r.id: r for r in state.replicas}
    assert set(reps) == {"resnet-a", "resnet-b"}  # the unowned pod is not ours
    assert reps["resnet-a"].state is ReplicaState.READY and reps["resnet-b"].state is ReplicaState.STARTING
    assert len({(r.gpu, r.start) for r in reps.values()}) == 2  # two 3g replicas on two distinct 3g instances


def test_a_pending_pod_is_starting_where_an_instance_is_free_and_failed_where_none_is(fake, backends):
    fake.put_object(gpu_node("node-a", {"1g.10gb": 1}))
    for name in ("p1", "p2"):
        p = pod(name, "", profile="1g.10gb", ready=False)
        p["spec"].pop("nodeName")
        p["status"] = {"phase": "Pending"}
        fake.put_object(p)
    be = backends()
    caught_up(be, fake)
    states = sorted(r.state.value for r in be.snapshot().replicas)
    assert states == ["failed", "starting"]  # one fits the free 1g; for the other there is none anywhere


def test_caches_not_synced_is_an_error_not_an_empty_cluster(connect):
    from autoscaler.act.kubernetes.backend import KubernetesBackend

    be = KubernetesBackend(connect(), [RESNET], CFG, sync_timeout_s=0.01, start=False)
    with pytest.raises(KubeError, match="caches not synced"):
        be.snapshot()


def _plan(desired):
    from k8s_helpers import plan

    return plan(desired)


def test_a_pod_keeps_its_instance_and_a_new_pod_takes_the_planners_if_free(fake, backends):
    # two A100s of 7 x 1g each; no API says which instance a pod got, so the inventory places it
    fake.put_object(gpu_node("node-a", {"1g.10gb": 14}, gpus=2))
    fake.put_object(pod("resnet-m", "node-a", profile="1g.10gb"))
    be = backends()
    caught_up(be, fake)
    where = {r.id: (r.gpu, r.start) for r in be.snapshot().replicas}
    assert where == {"resnet-m": ("node-a/0", 0)}
    # a new pod whose name sorts first does not move the old one (given afresh, it would take
    # node-a/0@0 and push resnet-m along: the planner would see a replica move)
    fake.put_object(pod("resnet-a", "node-a", profile="1g.10gb"))
    caught_up(be, fake)
    where = {r.id: (r.gpu, r.start) for r in be.snapshot().replicas}
    assert where["resnet-m"] == ("node-a/0", 0) and where["resnet-a"] == ("node-a/0", 1)
    # the planner meant the next one for node-a/1@3: free there, so that is where it is shown
    be.placer.spot_hints["resnet-z"] = ("node-a/1", 3)
    fake.put_object(pod("resnet-z", "node-a", profile="1g.10gb"))
    caught_up(be, fake)
    where = {r.id: (r.gpu, r.start) for r in be.snapshot().replicas}
    assert where["resnet-z"] == ("node-a/1", 3)
    # a hint for an instance already taken falls back to the first free one
    be.placer.spot_hints["resnet-b"] = ("node-a/0", 0)
    fake.put_object(pod("resnet-b", "node-a", profile="1g.10gb"))
    caught_up(be, fake)
    where = {r.id: (r.gpu, r.start) for r in be.snapshot().replicas}
    assert where["resnet-b"] == ("node-a/0", 2) and where["resnet-m"] == ("node-a/0", 0)
    # a pod that goes frees its instance; the others stay where they were
    fake.remove_now(fake.key_of(fake.get("Pod", "resnet-m")))
    fake.put_object(pod("resnet-c", "node-a", profile="1g.10gb"))
    caught_up(be, fake)
    after = {r.id: (r.gpu, r.start) for r in be.snapshot().replicas}
    assert after["resnet-c"] == ("node-a/0", 0)
    assert all(after[k] == where[k] for k in ("resnet-a", "resnet-b", "resnet-z"))


def test_a_new_pod_takes_its_planned_instance_from_a_pod_on_its_way_out(fake, backends):
    # a move on Kubernetes creates the new pod before the old one goes: the planner's instance
    # for the new pod is still held by the leaving one, and which one holds what is not known
    fake.put_object(gpu_node("node-a", {"1g.10gb": 7}))
    fake.put_object(pod("resnet-old", "node-a", profile="1g.10gb"))
    be = backends()
    caught_up(be, fake)
    assert {r.id: (r.gpu, r.start) for r in be.snapshot().replicas} == {"resnet-old": ("node-a/0", 0)}
    leaving = fake.get("Pod", "resnet-old")
    leaving["metadata"]["deletionTimestamp"] = "2026-12-02T10:00:00Z"
    fake.put_object(leaving)
    be.placer.spot_hints["resnet-new"] = ("node-a/0", 0)
    fake.put_object(pod("resnet-new", "node-a", profile="1g.10gb"))
    caught_up(be, fake)
    reps = {r.id: r for r in be.snapshot().replicas}
    assert (reps["resnet-new"].gpu, reps["resnet-new"].start) == ("node-a/0", 0)
    assert reps["resnet-old"].state is ReplicaState.DRAINING and reps["resnet-old"].start != 0


def test_a_pod_not_bound_yet_is_shown_on_the_instance_the_planner_chose(fake, backends):
    # pinned to its node (or kept gated for it) and not bound yet: shown anywhere else, its planned
    # instance would look free and the next plan would put a second replica on it
    fake.put_object(gpu_node("node-a", {"1g.10gb": 7}))
    fake.put_object(gpu_node("node-b", {"1g.10gb": 7}))
    fake.put_object(pod("resnet-old", "node-b", profile="1g.10gb"))
    be = backends()
    caught_up(be, fake)
    leaving = fake.get("Pod", "resnet-old")
    leaving["metadata"]["deletionTimestamp"] = "2026-12-02T10:00:00Z"
    fake.put_object(leaving)
    for name, spot in (("resnet-pinned", ("node-b/0", 4)), ("resnet-held", ("node-b/0", 0))):
        be.placer.spot_hints[name] = spot
        unbound = pod(name, "", profile="1g.10gb", ready=False)
        del unbound["spec"]["nodeName"]
        unbound["status"] = {"phase": "Pending"}
        fake.put_object(unbound)
    fake.put_object(pod("resnet-stray", "", profile="1g.10gb", ready=False))  # nobody placed it
    caught_up(be, fake)
    reps = {r.id: r for r in be.snapshot().replicas}
    assert (reps["resnet-pinned"].gpu, reps["resnet-pinned"].start) == ("node-b/0", 4)
    # the instance a leaving pod still holds goes to the pod planned there, as for a bound one
    assert (reps["resnet-held"].gpu, reps["resnet-held"].start) == ("node-b/0", 0)
    assert reps["resnet-old"].gpu == "node-b/0" and reps["resnet-old"].start not in (0, 4)
    assert reps["resnet-pinned"].state is ReplicaState.STARTING
    assert (reps["resnet-stray"].gpu, reps["resnet-stray"].start) not in {("node-b/0", 0), ("node-b/0", 4)}


def test_the_standalone_api_reads_the_cluster_from_informers(fake, connect):
    from autoscaler.commands.api import kube_snapshot

    fake.put_object(gpu_node("node-a", {"1g.10gb": 7}))
    fake.put_object(pod("resnet-a", "node-a", profile="1g.10gb"))
    snapshot, close = kube_snapshot(connect(), NS)
    try:
        def seen() -> bool:
            try:
                return [r.id for r in snapshot().replicas] == ["resnet-a"]
            except KubeError as exc:
                assert "not synced" in str(exc)  # before the first list: an error, never an empty cluster
                return False

        wait_until(seen, what="the pod in the api's snapshot")
        assert [g.id for g in snapshot().gpus] == ["node-a/0"]
        fake.put_object(pod("resnet-b", "node-a", profile="1g.10gb"))
        wait_until(lambda: len(snapshot().replicas) == 2, what="the watch brings the new pod")
    finally:
        close()
