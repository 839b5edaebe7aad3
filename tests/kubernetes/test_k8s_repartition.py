"""The repartition state machine on the emulated cluster: steps across ticks, surge, failover, rollbacks."""

from __future__ import annotations

import json
from collections import Counter

import yaml
from gpu_operator import gpu_node
from k8s_helpers import CFG, caught_up, wait_until

from autoscaler.act.kubernetes.render import MIG_CONFIG_LABEL, MIG_STATE_LABEL
from autoscaler.act.kubernetes.repartition import ANNOTATION, state_of
from autoscaler.clock import VirtualClock
from autoscaler.mig.layout import Placement
from autoscaler.policy.types import Action, ActionKind, ModelSpec, Reason, ReplicaState

MODEL = ModelSpec("resnet", {"3g.40gb": 160, "1g.10gb": 58}, ("3g.40gb", "1g.10gb"), min_replicas=1, max_replicas=8)
TARGET = (Placement(0, "2g.20gb"), Placement(2, "2g.20gb"), Placement(4, "2g.20gb"), Placement(6, "1g.10gb"))
REPART = Action(ActionKind.REPARTITION, Reason.REPARTITION, gpu="node-a/0", layout=TARGET)


def ready(fake) -> int:
    return sum(1 for p in fake.list("Pod") if not p["metadata"].get("deletionTimestamp") and any(
        c["type"] == "Ready" and c["status"] == "True" for c in p["status"].get("conditions", [])))


def evictions(fake) -> Counter:
    return Counter(r.path.split("/")[-2] for r in fake.requests if r.path.endswith("/eviction") and r.status == 201)


def setup(cluster, backends, *, spare: dict[str, int] | None = None, **kw):
    """Two resnet 3g pods on node-a; node-b (added after they are placed) offers ``spare`` room."""
    fake = cluster.fake
    fake.put_object(gpu_node("node-a", {"3g.40gb": 2}, config="all-3g"))
    be = backends([MODEL], **kw)
    caught_up(be, fake)
    be.apply([Action(ActionKind.CREATE, Reason.SCALE_UP_DEMAND, gpu="node-a/0", model="resnet", profile="3g.40gb")] * 2)
    wait_until(lambda: ready(fake) == 2, what="two pods Ready on node-a")
    fake.put_object(gpu_node("node-b", spare if spare is not None else {"3g.40gb": 2}, config="all-3g"))
    caught_up(be, fake)
    be.snapshot()
    return fake, be


def phase(fake) -> str | None:
    st = state_of(fake.get("Node", "node-a", None))
    return st["phase"] if st else None


def run(be, fake, until, samples=None, timeout_s=15.0):
    def tick():
        be.snapshot()
        errors = be.advance()
        if samples is not None:
            samples.append(ready(fake))
        return errors or until()

    return wait_until(tick, timeout_s, "the repartition to move on")


def test_a_repartition_moves_one_step_per_tick_and_never_empties_the_model(cluster, backends):
    fake, be = setup(cluster, backends)
    samples = [ready(fake)]
    assert be.apply([REPART]) == []  # returns at once: the state lives on the node
    node = fake.get("Node", "node-a", None)
    st = json.loads(node["metadata"]["annotations"][ANNOTATION])
    assert st["phase"] == "draining" and node["spec"]["unschedulable"] and st["cordoned"] is True
    assert be.in_flight()[0] >= {"node-a/0"} and "resnet" in be.in_flight()[1]
    desired = []  # what the model's status calls desired, each tick

    def done() -> bool:
        desired.append(be.committed("resnet", ("3g.40gb",)))
        return phase(fake) is None

    assert run(be, fake, done, samples) is True
    node = fake.get("Node", "node-a", None)
    name = node["metadata"]["labels"][MIG_CONFIG_LABEL]
    cm = fake.get("ConfigMap", CFG.mig_parted_configmap, CFG.mig_parted_namespace)
    assert yaml.safe_load(cm["data"]["config.yaml"])["mig-configs"][name] == [
        {"devices": [0], "mig-enabled": True, "mig-devices": {"1g.10gb": 1, "2g.20gb": 3}}]
    assert node["metadata"]["labels"][MIG_STATE_LABEL] == "success" and not node["spec"].get("unschedulable")
    assert ANNOTATION not in node["metadata"].get("annotations", {})
    assert node["status"]["allocatable"]["nvidia.com/mig-2g.20gb"] == "3"
    # make before break: both node-a pods were replaced on node-b (a surge first) and 2 stayed Ready throughout
    assert min(samples) >= 2, samples
    assert sorted(evictions(fake).values()) == [1, 1]
    assert fake.get("Deployment", "resnet-3g-40gb")["spec"]["replicas"] == 2  # the surge is undone
    steps = [s.split()[0] for s in be.repartitioner.log]
    assert steps[:3] == ["config", "cordon", "surge"] and steps[-2:] == ["unsurge", "uncordon"], steps
    assert desired and all(d == {"3g.40gb": 2} for d in desired), desired  # the surge is no decision
    assert be.snapshot().gpu("node-a/0").layout == TARGET
    assert be.inventory.configs[name] == be.repartitioner.configs[name]  # the inventory reads what was written
    assert be.inventory.starts["node-a"] == (name, (TARGET,))  # and the starts the planner asked for
    assert be.recorder.flush()
    node_events = [e for e in fake.list("Event") if e["regarding"]["kind"] == "Node"]
    assert [e["reason"] for e in node_events] == ["RepartitionStarted", "RepartitionSucceeded"]
    # a Node has no namespace: the API server takes its Events only in default or kube-system
    assert {e["metadata"]["namespace"] for e in node_events} == {"default"}


def test_a_new_leader_finishes_the_repartition_with_no_double_eviction(cluster, backends):
    fake, a = setup(cluster, backends, user_agent="migscale/a")
    assert a.apply([REPART]) == []
    run(a, fake, lambda: phase(fake) == "configuring")
    a.close()  # the leader dies mid-repartition: nothing released, nothing undone
    b = backends([MODEL], user_agent="migscale/b")
    caught_up(b, fake)
    before = evictions(fake)
    run(b, fake, lambda: phase(fake) is None)
    assert evictions(fake) == before and max(before.values()) == 1  # b evicted nothing again
    node = fake.get("Node", "node-a", None)
    assert not node["spec"].get("unschedulable") and node["metadata"]["labels"][MIG_STATE_LABEL] == "success"
    assert fake.get("Deployment", "resnet-3g-40gb")["spec"]["replicas"] == 2  # b undid a's surge, once
    uncordons = [r for r in fake.writes("migscale/b") if r.path.endswith("/nodes/node-a")]
    assert uncordons and not [r for r in fake.writes("migscale/b") if r.path.endswith("/eviction")]


def test_a_failed_config_rolls_back_and_the_node_cools_off(cluster, backends):
    fake, be = setup(cluster, backends)
    cluster.mig._entry = lambda name: None  # mig-manager cannot find the config: state=failed
    be.apply([REPART])
    errors = wait_until(lambda: (be.snapshot() and be.advance()) or None, 15, "the failure")
    assert len(errors) == 1 and "failed" in errors[0] and "rolled back to 'all-3g'" in errors[0]
    node = fake.get("Node", "node-a", None)
    assert node["metadata"]["labels"][MIG_CONFIG_LABEL] == "all-3g" and not node["spec"].get("unschedulable")
    assert ANNOTATION not in node["metadata"].get("annotations", {})
    assert fake.get("Deployment", "resnet-3g-40gb")["spec"]["replicas"] == 2  # surge undone on the way back
    assert be.recorder.flush()
    warn = [e for e in fake.list("Event") if e["reason"] == "RepartitionFailed"]
    assert warn and warn[0]["type"] == "Warning"
    assert "node-a/0" in be.in_flight()[0]  # cooling: the planner leaves the node alone meanwhile
    again = be.apply([REPART])
    assert len(again) == 1 and "left alone" in again[0]


def test_a_model_that_cannot_be_moved_is_not_emptied(cluster, backends):
    fake, be = setup(cluster, backends, spare={"1g.10gb": 7})  # no 3g elsewhere for a replacement
    be.apply([REPART])
    errors = wait_until(lambda: (be.snapshot() and be.advance()) or None, 10, "the refusal")
    assert "no free 3g.40gb instance elsewhere" in errors[0]
    assert ready(fake) == 2 and not evictions(fake)
    node = fake.get("Node", "node-a", None)
    assert not node["spec"].get("unschedulable") and node["metadata"]["labels"][MIG_CONFIG_LABEL] == "all-3g"


def test_a_drain_the_budget_never_allows_times_out_and_leaves_the_label(cluster, backends):
    clock = VirtualClock(1_800_000_000.0)
    fake, be = setup(cluster, backends, clock=clock, drain_timeout_s=60)
    for p in fake.list("Pod"):
        fake.blocked_evictions.add(p["metadata"]["name"])  # their budget never lets them go
    be.apply([REPART])
    run(be, fake, lambda: "surge" in " ".join(be.repartitioner.log) and ready(fake) >= 3)
    assert be.advance() == []
    clock.advance(61)
    errors = wait_until(lambda: be.advance() or None, 5, "the rollback")
    assert len(errors) == 1 and "drain timed out after 60s" in errors[0]
    node = wait_until(lambda: (n := fake.get("Node", "node-a", None)) and not n["spec"].get("unschedulable") and n)
    assert node["metadata"]["labels"][MIG_CONFIG_LABEL] == "all-3g"  # never relabelled
    assert fake.get("Deployment", "resnet-3g-40gb")["spec"]["replicas"] == 2


def test_mig_manager_that_never_answers_times_out_and_rolls_back(cluster, backends):
    clock = VirtualClock(1_800_000_000.0)
    cluster.mig.delay_s = 1e9
    fake, be = setup(cluster, backends, spare={"3g.40gb": 3}, clock=clock, config_timeout_s=600)
    be.apply([REPART])
    run(be, fake, lambda: phase(fake) == "configuring")
    wait_until(lambda: fake.get("Node", "node-a", None)["metadata"]["labels"][MIG_STATE_LABEL] == "pending")
    caught_up(be, fake)
    assert be.advance() == []
    clock.advance(601)
    errors = wait_until(lambda: be.advance() or None, 5, "the rollback")  # a patch that lost a race is retried
    assert len(errors) == 1 and "still 'pending' after 600s" in errors[0] and "rolled back" in errors[0]


def test_refuses_when_gpu_pods_it_does_not_own_run_there(cluster, backends):
    fake, be = setup(cluster, backends)
    fake.put_object({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "someone-elses", "namespace": "other"},
                     "spec": {"nodeName": "node-a", "containers": [{"name": "c", "image": "x", "resources": {
                         "limits": {"nvidia.com/mig-3g.40gb": "1"}}}]}, "status": {"phase": "Running"}})
    errors = be.apply([REPART])
    assert len(errors) == 1 and "someone-elses" in errors[0] and "refused" in errors[0]
    assert not fake.get("Node", "node-a", None)["spec"].get("unschedulable")
    assert fake.get("ConfigMap", CFG.mig_parted_configmap, CFG.mig_parted_namespace) is None


def test_a_stale_success_with_the_same_counts_waits_for_mig_manager(fake, backends):
    """Same instance counts, another arrangement: only a ``pending`` seen since the label counts as an answer."""
    fake.put_object(gpu_node("node-a", {"3g.40gb": 2}, config="all-3g", gpus=2))
    be = backends([MODEL])
    caught_up(be, fake)
    layout = (Placement(0, "3g.40gb"),)
    assert be.apply([Action(ActionKind.REPARTITION, Reason.REPARTITION, gpu="node-a/0", layout=layout),
                     Action(ActionKind.REPARTITION, Reason.REPARTITION, gpu="node-a/1", layout=layout)]) == []
    for _ in range(3):
        caught_up(be, fake)
        be.advance()
    assert phase(fake) == "configuring"  # labelled; state still says the old "success"
    node = fake.get("Node", "node-a", None)
    node["metadata"]["labels"][MIG_STATE_LABEL] = "pending"
    fake.put_object(node)  # mig-manager starts
    caught_up(be, fake)
    be.advance()
    assert json.loads(fake.get("Node", "node-a", None)["metadata"]["annotations"][ANNOTATION])["pendingSeen"] is True
    node = fake.get("Node", "node-a", None)
    node["metadata"]["labels"][MIG_STATE_LABEL] = "success"
    fake.put_object(node)
    caught_up(be, fake)
    be.advance()
    assert phase(fake) is None


def test_pods_being_evicted_are_reported_draining(cluster, backends):
    fake, be = setup(cluster, backends)
    be.apply([REPART])
    run(be, fake, lambda: any(r.state is ReplicaState.DRAINING for r in be.snapshot().replicas))
    assert any(r.gpu.startswith("node-a") for r in be.snapshot().replicas if r.state is ReplicaState.DRAINING)


def test_a_follower_holds_only_the_gpus_the_leader_repartitions_and_writes_nothing(cluster, backends):
    from autoscaler.runtime.kubernetes import LeaderGate

    fake, a = setup(cluster, backends, user_agent="migscale/a")
    assert a.apply([REPART]) == []
    follower = backends([MODEL], user_agent="migscale/b")
    gate = LeaderGate(follower)  # not leading: the loop's actuator is a shadow
    caught_up(follower, fake)
    follower.snapshot()
    gpus, _models = gate.in_flight()
    assert "node-a/0" in gpus and "node-b/0" not in gpus  # per GPU, read from node-a's annotation
    create = Action(ActionKind.CREATE, Reason.SCALE_UP_DEMAND, gpu="node-b/0", model="resnet", profile="3g.40gb")
    assert gate.apply([create]) == [] and fake.writes("migscale/b") == []
    run(a, fake, lambda: phase(fake) is None)
    caught_up(follower, fake)
    follower.snapshot()
    assert "node-a/0" not in gate.in_flight()[0]


def test_a_pass_over_many_nodes_stops_at_its_budget_and_the_next_starts_where_it_stopped():
    from autoscaler.act.kubernetes.repartition import DRAINING, Repartitioner

    clock = VirtualClock(1_800_000_000.0)
    names = [f"node-{i}" for i in range(6)]

    class Nodes:  # the informer's read side: every node exists
        def get(self, name):
            return {"metadata": {"name": name}}

    r = Repartitioner(None, CFG, clock, Nodes(), None, pass_budget_s=0.25)
    r.in_progress = lambda: {n: {"phase": DRAINING, "id": n} for n in names}
    seen: list[str] = []

    def drain(node, st):  # each node's drain writes for 0.1 s
        seen.append(node["metadata"]["name"])
        clock.advance(0.1)

    r._drain = drain
    assert r.advance() == []
    first = list(seen)
    assert first == names[:3] and r.deferred == 1  # 0.3 s > 0.25 s: the 4th waits
    seen.clear()
    r.advance()
    assert seen == names[3:]  # the next pass starts with the first node not reached...
    seen.clear()
    r.pass_budget_s = None
    r.advance()
    assert seen == names  # ...and without a budget every node is taken, in order


def test_each_gpu_shows_the_layout_its_applied_config_gives_it():
    from autoscaler.act.kubernetes.inventory import applied_layouts
    from autoscaler.act.kubernetes.migparted import mig_config_entry, mig_config_name
    from autoscaler.mig.products import get_product

    a100 = get_product("A100-SXM4-80GB")
    # GPU 0 stays 3g+3g, GPU 1 is cut to 7 x 1g: the node's totals alone would be spread
    # biggest first (3g, 3g, then 1g ... from GPU 0 on), moving instances between GPUs
    lay0 = (Placement(0, "3g.40gb"), Placement(4, "3g.40gb"))
    lay1 = tuple(Placement(i, "1g.10gb") for i in range(7))
    entry = mig_config_entry([lay0, lay1])
    name = mig_config_name(entry)
    node = gpu_node("node-a", {"3g.40gb": 2, "1g.10gb": 7}, gpus=2, config=name)
    counts = Counter({"3g.40gb": 2, "1g.10gb": 7})
    got = applied_layouts(node, a100, 2, counts, {name: entry})
    assert [sorted(p.profile for p in lay) for lay in got] == [["3g.40gb", "3g.40gb"], ["1g.10gb"] * 7]
    # the starts the planner asked for are kept where they match what was applied: 3g@0 + 1g@4,5,6
    # at canonical starts would be 1g@1,2,3 + 3g@4, with room for a 1g at 0 the real cut has not
    lay2 = (Placement(0, "3g.40gb"), Placement(4, "1g.10gb"), Placement(5, "1g.10gb"), Placement(6, "1g.10gb"))
    entry2 = mig_config_entry([lay0, lay2])
    node2 = gpu_node("node-b", {"3g.40gb": 3, "1g.10gb": 3}, gpus=2, config=mig_config_name(entry2))
    counts2 = Counter({"3g.40gb": 3, "1g.10gb": 3})
    cfgs = {mig_config_name(entry2): entry2}
    assert applied_layouts(node2, a100, 2, counts2, cfgs)[1] != lay2  # counts only: canonical starts
    assert applied_layouts(node2, a100, 2, counts2, cfgs, (mig_config_name(entry2), (lay0, lay2))) == [lay0, lay2]
    # starts recorded for another config than the node's label names are not used
    assert applied_layouts(node2, a100, 2, counts2, cfgs, (name, (lay0, lay1)))[1] != lay2
    # not applied yet, or not ours, or not matching what the node reports: not used
    node["metadata"]["labels"][MIG_STATE_LABEL] = "pending"
    assert applied_layouts(node, a100, 2, counts, {name: entry}) is None
    node["metadata"]["labels"][MIG_STATE_LABEL] = "success"
    assert applied_layouts(node, a100, 2, counts, {}) is None
    assert applied_layouts(node, a100, 2, Counter({"3g.40gb": 2, "1g.10gb": 6}), {name: entry}) is None
