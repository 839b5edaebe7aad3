"""Make-before-break on Kubernetes: WAIT_READY is state across ticks, the old goes only after the new is Ready."""

from __future__ import annotations

from dataclasses import replace

from gpu_operator import gpu_node
from k8s_helpers import act, caught_up, wait_until

from autoscaler.clock import VirtualClock
from autoscaler.mig.layout import Placement
from autoscaler.policy.types import ModelSpec, Reason, ReplicaState

MODEL = ModelSpec("resnet", {"1g.10gb": 58, "2g.20gb": 113}, ("1g.10gb", "2g.20gb"), min_replicas=1, max_replicas=8)
OTHER = ModelSpec("bert", {"2g.20gb": 98}, ("2g.20gb",), min_replicas=1, max_replicas=4)
SWAP = Reason.PROFILE_EFFICIENCY


def capacity(be, model: str = "resnet", spec: ModelSpec = MODEL) -> float:
    return sum(spec.capacity[r.profile] for r in be.snapshot().replicas if r.model == model and r.state is ReplicaState.READY)


def running_2g(cluster, backends, **kw):
    fake = cluster.fake
    cluster.add_nodes(2, {"1g.10gb": 4, "2g.20gb": 1})
    be = backends([MODEL, OTHER], **kw)
    caught_up(be, fake)
    be.apply([act("create", "resnet", "2g.20gb")] * 2)
    wait_until(lambda: capacity(be) == 226, what="two 2g replicas Ready")
    return fake, be


def swap_actions(be) -> list:
    old = sorted(r.id for r in be.snapshot().replicas if r.profile == "2g.20gb")
    return ([act("create", "resnet", reason=SWAP)] * 2 + [act("wait_ready", "resnet", reason=SWAP)] * 2
            + [act("drain", "resnet", "2g.20gb", replica=r, reason=SWAP) for r in old]
            + [act("delete", "resnet", "2g.20gb", replica=r, reason=SWAP) for r in old])


def test_a_profile_swap_scales_the_old_down_only_after_the_new_is_ready(cluster, backends):
    fake, be = running_2g(cluster, backends)
    assert be.apply(swap_actions(be)) == []
    assert fake.get("Deployment", "resnet-1g-10gb")["spec"]["replicas"] == 2
    assert fake.get("Deployment", "resnet-2g-20gb")["spec"]["replicas"] == 2  # nothing broken before the make
    assert "resnet" in be.in_flight()[1]  # the queued scale-down keeps the model busy
    assert be.conditions(None)["resnet"]["status"] == "Unknown"
    samples = []

    def tick() -> bool:
        reps = be.snapshot().replicas
        samples.append(tuple(sum(r.profile == p and r.state is ReplicaState.READY for r in reps)
                             for p in ("1g.10gb", "2g.20gb")))
        assert be.advance() == []
        return fake.get("Deployment", "resnet-2g-20gb") is None and not be.rollout.chains

    wait_until(tick, 15, "the swap to finish and the old workload to retire")
    # the old replicas went only once both new ones were Ready: never below min(before, after) = 2 x 1g
    assert all(new == 2 for new, old in samples if old < 2), samples
    assert (0, 2) in samples
    assert capacity(be) == 116 and all(r.profile == "1g.10gb" for r in be.snapshot().replicas)
    assert be.recorder.flush()
    notes = {(e["regarding"]["name"], e["note"]) for e in fake.list("Event") if e["reason"] == "SuccessfulRescale"}
    assert ("resnet-1g-10gb", "New size: 2; reason: profile_efficiency") in notes
    assert ("resnet-2g-20gb", "New size: 0; reason: profile_efficiency") in notes  # the budget paced it: 2 -> 1 -> 0
    assert ("resnet-2g-20gb", "New size: 1; reason: profile_efficiency") in notes


def test_new_pods_that_can_never_start_abort_the_swap_and_keep_the_old(cluster, backends):
    fake, be = running_2g(cluster, backends)
    swap = swap_actions(be)  # planned while both nodes still have their 1g instances
    for name in ("node-0", "node-1"):  # then someone re-cuts both nodes: no 1g instance left anywhere
        fake.put_object(gpu_node(name, {"2g.20gb": 1}, config="other"))
    caught_up(be, fake)
    be.apply(swap)
    errors = wait_until(lambda: (be.snapshot() and be.advance()) or None, 10, "the abort")
    assert "cannot start" in errors[0] and "the old replicas stay" in errors[0]
    skipped = [e for e in errors[1:] if "skipped" in e]  # every action after the failed one, each once
    old = [e for e in skipped if "resnet-2g-20gb" in e]  # the DRAINs and DELETEs of the old replicas
    assert len(old) == 4 and len(skipped) == 5 and skipped[0].startswith("wait_ready")  # and the 2nd WAIT_READY
    assert fake.get("Deployment", "resnet-2g-20gb")["spec"]["replicas"] == 2 and capacity(be) >= 226
    assert not be.rollout.chains


def test_waiting_is_bounded_by_the_ready_timeout(cluster, backends):
    clock = VirtualClock(1_800_000_000.0)
    cluster.kubelet.ready_delay_s = 1e9  # the new pods run but never turn Ready
    cluster.add_nodes(2, {"1g.10gb": 4, "2g.20gb": 1})
    be = backends([MODEL], clock=clock, ready_timeout_s=600)
    fake = cluster.fake
    caught_up(be, fake)
    be.apply([act("create", "resnet", reason=SWAP), act("wait_ready", "resnet", reason=SWAP),
              act("delete", "resnet", "2g.20gb", replica="x", reason=SWAP)])
    wait_until(lambda: any(p.get("status", {}).get("phase") == "Running" for p in fake.list("Pod")), 5)
    be.snapshot()
    assert be.advance() == [] and "waiting for 1 more Ready pod" in be.rollout.waiting()["resnet"]
    clock.advance(601)
    errors = be.advance()
    assert "0/1 ready after 600s" in errors[0]
    assert errors[1:] == [f"delete x [delete resnet-2g-20gb]: skipped, an earlier action of its change failed ({errors[0]})"]


def test_one_model_waiting_does_not_hold_up_another(cluster, backends):
    fake, be = running_2g(cluster, backends)
    cluster.kubelet.ready_delay_s = 1e9
    be.apply(swap_actions(be) + [act("create", "bert", "2g.20gb", gpu="node-1/0")])
    assert fake.get("Deployment", "bert-2g-20gb")["spec"]["replicas"] == 1  # written in the same tick
    _busy_gpus, busy_models = be.in_flight()
    assert busy_models == {"resnet"}


def test_creates_behind_a_repartition_wait_for_it(cluster, backends):
    fake = cluster.fake
    fake.put_object(gpu_node("node-0", {"7g.80gb": 1}, config="whole"))
    be = backends([MODEL])
    caught_up(be, fake)
    layout = tuple(Placement(i, "1g.10gb") for i in range(7))
    assert be.apply([act("repartition", gpu="node-0/0", profile=None, layout=layout, reason=Reason.REPARTITION),
                     act("create", "resnet"), act("wait_ready", "resnet")]) == []
    assert fake.get("Deployment", "resnet-1g-10gb") is None  # not before the node is cut
    assert "node-0/0" in be.in_flight()[0]
    wait_until(lambda: (be.snapshot() and not be.advance()) and fake.get("Deployment", "resnet-1g-10gb"), 10)
    wait_until(lambda: capacity(be) == 58, 10, "the new replica Ready on the new slice")
    node = fake.get("Node", "node-0", None)
    assert node["status"]["allocatable"]["nvidia.com/mig-1g.10gb"] == "7"


def test_new_pods_land_on_the_nodes_the_planner_chose(cluster, backends):
    fake = cluster.fake
    cluster.add_nodes(3, {"1g.10gb": 7})  # equal nodes: left alone, the scheduler would pick node-2
    be = backends([MODEL])
    caught_up(be, fake)
    be.apply([replace(act("create", "resnet", gpu="node-0/0"), start=5), replace(act("create", "resnet", gpu="node-0/0"), start=3),
              replace(act("create", "resnet", gpu="node-1/0"), start=6)])
    wait_until(lambda: capacity(be) == 3 * 58, 10, "three Ready pods")
    pods = fake.list("Pod")
    assert sorted(p["spec"]["nodeName"] for p in pods) == ["node-0", "node-0", "node-1"]
    terms = pods[0]["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    keys = [e["key"] for e in terms[0]["matchExpressions"]]
    assert keys == ["nvidia.com/gpu.product", "kubernetes.io/hostname"]  # the product rule kept, the node added
    assert all("schedulingGates" not in p["spec"] for p in pods)
    # no API says which instance a pod got: the snapshot shows each where the planner put it
    assert sorted((r.gpu, r.start) for r in be.snapshot().replicas) == [("node-0/0", 3), ("node-0/0", 5), ("node-1/0", 6)]
    # a pod nobody placed (the ReplicaSet replacing a deleted one) is pinned to a free instance of
    # the last snapshot, and shown where it went (so the next plan counts it there)
    snap = be.snapshot()
    used = {(r.gpu, r.start) for r in snap.replicas}
    free = next((g.id, p.start) for g in snap.gpus for p in g.layout if p.profile == "1g.10gb" and (g.id, p.start) not in used)
    fake.remove_now(fake.key_of(pods[0]))
    wait_until(lambda: capacity(be) == 3 * 58 and len(fake.list("Pod")) == 3, 10, "the replacement")
    new = next(p for p in fake.list("Pod") if p["metadata"]["name"] not in {q["metadata"]["name"] for q in pods})
    exprs = new["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"][0]["matchExpressions"]
    assert [e["key"] for e in exprs] == ["nvidia.com/gpu.product", "kubernetes.io/hostname"]
    assert new["spec"]["nodeName"] == free[0].split("/")[0]
    assert {r.id: (r.gpu, r.start) for r in be.snapshot().replicas}[new["metadata"]["name"]] == free


def test_a_new_pod_waits_for_its_planned_instance_while_a_pod_on_its_way_out_holds_it(cluster, backends):
    """The planner counts a leaving pod's instance as free (the inventory yields it), so it may
    place a new replica there. Let go at once, the pod would land wherever the scheduler finds a
    free instance -- a replica the planner did not place, which its next plan moves again. It
    stays gated until the leaving pod is gone, then goes where it was planned."""
    from k8s_helpers import pod

    fake = cluster.fake
    cluster.add_nodes(2, {"1g.10gb": 1})  # one instance each: node-1's is the only free one
    fake.put_object(pod("resnet-old", "node-0", profile="1g.10gb"), manager="kubelet")
    cluster.kubelet.stop_s = 3600.0  # it terminates for its whole grace period ...
    be = backends([MODEL])
    caught_up(be, fake)
    fake.delete_obj(fake.key_of(fake.get("Pod", "resnet-old")), grace_s=600)
    wait_until(lambda: any(r.state is ReplicaState.DRAINING for r in be.snapshot().replicas), 5, "the old pod leaving")
    be.apply([replace(act("create", "resnet", gpu="node-0/0"), start=0)])

    def new_pod() -> dict | None:
        return next((p for p in fake.list("Pod") if p["metadata"]["name"] != "resnet-old"), None)

    wait_until(lambda: new_pod() is not None, 5, "the new pod")
    for _ in range(3):
        assert be.advance() == []
        caught_up(be, fake)
    new = new_pod()
    assert new["spec"].get("schedulingGates") and not new["spec"].get("nodeName")  # kept for node-0
    assert be.placer.placement_waits >= 1 and be.placer.placement_fallbacks == 0
    fake.remove_now(fake.key_of(fake.get("Pod", "resnet-old")))  # ... and is gone now
    caught_up(be, fake)
    assert be.advance() == []
    wait_until(lambda: (new_pod() or {}).get("spec", {}).get("nodeName") == "node-0", 10, "the pod bound to node-0")


def test_a_gpu_and_model_stay_busy_until_the_pods_placed_on_it_exist(fake, backends):
    """Between a scale write and its pods reaching the cache, the snapshot shows their planned
    instances as free and the model a replica short: the GPU and the model are reported busy
    meanwhile, so no plan puts a second replica there or adds one elsewhere."""
    from k8s_helpers import pod

    fake.put_object(gpu_node("node-0", {"1g.10gb": 7}))
    be = backends([MODEL])
    caught_up(be, fake)
    assert be.apply([replace(act("create", "resnet", gpu="node-0/0"), start=2), act("wait_ready", "resnet", gpu="node-0/0")]) == []
    assert be.placer.unclaimed("resnet", "1g.10gb") == 1  # no ReplicaSet here: the pod never comes
    assert "node-0/0" in be.in_flight()[0] and "resnet" in be.in_flight()[1]
    new = pod("resnet-1g-10gb-abc-xyz1", "", profile="1g.10gb", ready=False)
    new["spec"]["schedulingGates"] = [{"name": "migscale.io/placement"}]
    new["status"] = {"phase": "Pending"}
    fake.put_object(new)
    caught_up(be, fake)
    be.advance()  # its gate lifted, the placement taken
    assert be.placer.unclaimed("resnet", "1g.10gb") == 0
    assert be.in_flight() == (frozenset(), frozenset())  # the snapshot shows the pod there now
    assert [(r.gpu, r.start) for r in be.snapshot().replicas] == [("node-0/0", 2)]


class _WritesTakeTime(VirtualClock):
    """Each reading is 0.1 s after the last: a pass's steps take time, as real writes do."""

    def now(self) -> float:
        self.advance(0.1)
        return super().now()


def _budgeted(cluster, backends, n: int):
    """``n`` one-profile models on a backend whose writes take time, with a 0.25 s write
    budget; and which of them have a Deployment yet, in model order."""
    models = [ModelSpec(f"m{i}", {"1g.10gb": 10}, ("1g.10gb",), max_replicas=4) for i in range(n)]
    cluster.add_nodes(2, {"1g.10gb": 7})
    be = backends(models, clock=_WritesTakeTime(1_800_000_000.0), pass_budget_s=0.25)
    fake = cluster.fake
    caught_up(be, fake)

    def created() -> list[str]:
        return [m.name for m in models if fake.get("Deployment", f"{m.name}-1g-10gb") is not None]

    return models, be, created


def test_a_pass_stops_at_its_time_budget_and_the_next_goes_on_from_there(cluster, backends):
    models, be, created = _budgeted(cluster, backends, 6)
    fake = cluster.fake

    assert be.apply([act("create", m.name) for m in models]) == []  # six independent chains
    first = created()
    assert 0 < len(first) < 6 and first == [m.name for m in models[:len(first)]]
    assert be.rollout.deferred == 1
    waiting = set(be.in_flight()[1])
    assert waiting == {m.name for m in models[len(first):]}  # the rest are in flight, not lost
    assert all("time for API writes is spent" in be.rollout.waiting()[m] for m in waiting)
    passes = 1
    while len(created()) < 6:
        assert be.advance() == []
        passes += 1
        assert passes < 10
    assert passes > 1 and not be.rollout.chains
    assert all(fake.get("Deployment", f"{m.name}-1g-10gb")["spec"]["replicas"] == 1 for m in models)


def test_the_passes_of_one_tick_share_its_write_budget(cluster, backends):
    models, be, created = _budgeted(cluster, backends, 8)
    assert be.apply([act("create", m.name) for m in models[:6]]) == []  # a pass of its own: some, not all
    before = created()
    assert 0 < len(before) < 6
    # next tick: the backend's advance spends the tick's budget on the queued chains ...
    assert be.advance() == []
    advanced = created()
    assert len(advanced) > len(before)
    # ... so the tick's own actions wait for the next tick instead of writing past it
    assert be.apply([act("create", m.name) for m in models[6:]]) == []
    assert created() == advanced and {"m6", "m7"} <= set(be.in_flight()[1])
    assert all("time for API writes is spent" in be.rollout.waiting()[m] for m in ("m6", "m7"))
    passes = 0
    while len(created()) < 8:  # and go out in the ticks after
        assert be.advance() == []
        passes += 1
        assert passes < 10


def test_without_a_budget_one_pass_takes_every_step(cluster, backends):
    models = [ModelSpec(f"m{i}", {"1g.10gb": 10}, ("1g.10gb",), max_replicas=4) for i in range(6)]
    cluster.add_nodes(2, {"1g.10gb": 7})
    be = backends(models, clock=_WritesTakeTime(1_800_000_000.0), pass_budget_s=None)
    caught_up(be, cluster.fake)
    assert be.apply([act("create", m.name) for m in models]) == []
    assert all(cluster.fake.get("Deployment", f"{m.name}-1g-10gb") is not None for m in models)
    assert be.rollout.deferred == 0 and not be.rollout.chains


def test_a_pod_pinned_to_a_node_that_filled_up_meanwhile_is_recreated_and_placed_elsewhere(cluster, backends):
    """Once ungated, a pod's node affinity is frozen: if its instance went to another pod
    (here one migscale does not own, so its cache does not count it), the scheduler keeps
    it Unschedulable for good. After UNPIN_AFTER_S it is deleted and its ReplicaSet's
    replacement is placed afresh."""
    from k8s_helpers import pod

    from autoscaler.act.kubernetes.placer import UNPIN_AFTER_S

    fake = cluster.fake
    cluster.add_nodes(2, {"1g.10gb": 1})
    fake.put_object(pod("squatter", "node-0", model=None, profile="1g.10gb", owned=False), manager="kubelet")
    clock = VirtualClock(1_000.0)
    be = backends([MODEL], clock=clock)
    caught_up(be, fake)
    be.apply([act("create", "resnet", gpu="node-0/0")])

    def ours() -> list[dict]:
        return [p for p in fake.list("Pod") if p["metadata"]["name"] != "squatter"]

    def unschedulable() -> bool:
        return any(c.get("reason") == "Unschedulable" for p in ours() for c in p["status"].get("conditions") or [])

    wait_until(unschedulable, 10, "the pinned pod Unschedulable")
    # the backend reads its Pod cache, not the server: on a busy machine the watch may not have
    # brought the condition yet, and a first pass that does not see it starts the clock later
    caught_up(be, fake)
    first = ours()[0]["metadata"]["name"]
    be.advance()  # seen stuck now: not yet replaced
    clock.advance(UNPIN_AFTER_S - 1)
    be.advance()
    assert [p["metadata"]["name"] for p in ours()] == [first]
    clock.advance(2)
    be.advance()
    wait_until(lambda: capacity(be) == 58, 10, "the replacement Ready")
    (new,) = ours()
    assert new["metadata"]["name"] != first and new["spec"]["nodeName"] == "node-1"
    assert be.recorder.flush()
    assert any(e["reason"] == "Replaced" for e in fake.list("Event"))


def test_chains_link_through_a_node_only_when_the_batch_repartitions_it():
    from autoscaler.act.kubernetes.rollout import chain_groups
    from autoscaler.policy.types import Action, ActionKind, ClusterState, Replica

    reps = (Replica("a-pod", "a", "1g.10gb", "n1/0", 0, ReplicaState.READY),)
    cluster = ClusterState((), reps)
    create_b = Action(ActionKind.CREATE, Reason.SCALE_UP_DEMAND, gpu="n1/0", model="b", profile="1g.10gb", start=1)
    create_c = Action(ActionKind.CREATE, Reason.CONSOLIDATE, gpu="n1/1", model="c", profile="1g.10gb", start=0)
    drain_a = Action(ActionKind.DRAIN, Reason.CONSOLIDATE, replica="a-pod")  # names only its pod
    create_a = Action(ActionKind.CREATE, Reason.CONSOLIDATE, gpu="n2/0", model="a", profile="1g.10gb", start=0)
    # a consolidation over one node: three models share n1's GPUs, but the scheduler places
    # the pods, so only a's own actions form one chain (its DRAIN through the pod's model)
    g = chain_groups([create_a, drain_a, create_b, create_c], cluster)
    assert g[0] == g[1] and len({g[0], g[2], g[3]}) == 3
    # once the batch repartitions n1, the CREATEs on n1 wait for it: one chain with the cut
    # (a's DRAIN names no GPU: the repartition evicts the pod itself)
    cut = Action(ActionKind.REPARTITION, Reason.CONSOLIDATE, gpu="n1/1", layout=(Placement(0, "1g.10gb"),))
    g = chain_groups([cut, create_a, drain_a, create_b, create_c], cluster)
    assert g[0] == g[3] == g[4] and g[1] == g[2] != g[0]


def test_a_pass_does_not_start_a_step_that_steps_of_its_kind_took_longer_than_what_is_left(cluster, backends):
    import threading

    models = [ModelSpec(f"m{i}", {"1g.10gb": 10}, ("1g.10gb",), max_replicas=4) for i in range(7)]
    cluster.add_nodes(2, {"1g.10gb": 7})
    clock = VirtualClock(1_800_000_000.0)
    be = backends(models, clock=clock, pass_budget_s=0.25)
    fake = cluster.fake
    caught_up(be, fake)
    request = be.rest.request
    main = threading.current_thread()

    def slow(*a, **kw):  # each request of the tick takes 0.05 s
        if threading.current_thread() is main:
            clock.advance(0.05)
        return request(*a, **kw)

    be.rest.request = slow

    def created() -> int:
        return sum(1 for m in models[:6] if fake.get("Deployment", f"{m.name}-1g-10gb") is not None)

    # each CREATE makes its workload (Service, Deployment, budget) and records an Event: 0.2 s; a
    # second one started at 0.2 s would run the pass to 0.4 s against its 0.25 s
    assert be.apply([act("create", m.name) for m in models[:6]]) == []
    counts = [created()]
    while be.rollout.chains:
        assert be.advance() == []
        counts.append(created())
        assert len(counts) < 10
    assert counts == [1, 2, 3, 4, 5, 6]  # one workload a pass, each pass within its budget but for that step
    assert all(fake.get("Deployment", f"{m.name}-1g-10gb")["spec"]["replicas"] == 1 for m in models[:6])
    # a tick's two passes share the rule: once its first pass has written (m0 one more replica, 0.1 s
    # with its Event), its second does not start a workload (0.2 s) with 0.15 s left; the next tick does
    be.rollout.begin_tick()
    assert be.rollout.submit([act("create", "m0")], be.snapshot()) == []
    assert be.rollout.submit([act("create", "m6")], be.snapshot()) == []
    be.rollout.end_tick()
    assert fake.get("Deployment", "m0-1g-10gb")["spec"]["replicas"] == 2
    assert fake.get("Deployment", "m6-1g-10gb") is None and be.rollout.chains
    assert be.advance() == []
    assert fake.get("Deployment", "m6-1g-10gb")["spec"]["replicas"] == 1


def test_lifting_the_gate_from_a_stale_cache_never_puts_back_a_gate_another_controller_lifted(fake, connect):
    """The ungate patch carries the cached resourceVersion: a pod changed since answers 409, and
    the patch is made again from the live pod instead of replacing its gates from the old copy."""
    from k8s_helpers import NS, pod

    from autoscaler.act.kubernetes.informer import Informer
    from autoscaler.act.kubernetes.placer import PodPlacer
    from autoscaler.act.kubernetes.render import PLACEMENT_GATE

    fake.put_object(gpu_node("node-0", {"1g.10gb": 7}))
    gated = pod("resnet-x", "", profile="1g.10gb")
    gated["spec"].pop("nodeName")
    gated["spec"]["schedulingGates"] = [{"name": PLACEMENT_GATE}, {"name": "example.com/quota"}]
    gated["status"] = {"phase": "Pending"}
    fake.put_object(gated)
    pods, nodes = Informer(connect(), "v1", "Pod", NS).start(), Informer(connect(), "v1", "Node", None).start()
    try:
        assert pods.wait_synced(5) and nodes.wait_synced(5)
        rest = connect()
        placer = PodPlacer(rest, NS, VirtualClock(1000.0), pods, nodes, lambda *a, **k: None)
        placer.place("resnet", "1g.10gb", ["node-0"])  # the planner's node for the next pod
        stale = pods.get(f"{NS}/resnet-x")
        live = fake.get("Pod", "resnet-x")
        live["spec"]["schedulingGates"] = [{"name": PLACEMENT_GATE}]  # the quota controller lifted its gate
        fake.put_object(live)
        patches = rest.counts["PATCH"]
        assert placer.ungate([stale]) == []
        assert rest.counts["PATCH"] - patches == 2  # the stale one (409), then one from the live pod
        spec = fake.get("Pod", "resnet-x")["spec"]
        assert "schedulingGates" not in spec  # and example.com/quota was not put back
        terms = spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
        assert {"key": "kubernetes.io/hostname", "operator": "In", "values": ["node-0"]} in terms[0]["matchExpressions"]
    finally:
        pods.stop()
        nodes.stop()
