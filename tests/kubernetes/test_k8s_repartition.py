"""Repartition through the mig-parted ConfigMap and the mig-manager labels: happy path and timeout."""

from __future__ import annotations

import yaml
from k8s_helpers import CFG, RESNET, gpu_node, pod

from autoscaler.act.kubernetes.render import MIG_CONFIG_LABEL, MIG_STATE_LABEL
from autoscaler.act.kubernetes.repartition import Repartitioner
from autoscaler.act.kubernetes.backend import KubernetesBackend
from autoscaler.clock import VirtualClock
from autoscaler.mig.layout import Placement
from autoscaler.policy.types import Action, ActionKind, Reason

TARGET = (Placement(0, "2g.20gb"), Placement(2, "2g.20gb"), Placement(4, "2g.20gb"), Placement(6, "1g.10gb"))


class MigManager:
    """Plays the GPU Operator's mig-manager: on a new config label, pending, then success after N polls."""

    def __init__(self, fake, polls_to_success: int | None) -> None:
        self.fake = fake
        self.polls = polls_to_success
        self.cordoned_when_labelled: bool | None = None
        self.pending: str | None = None
        self.applied: str | None = None
        self.left = 0

    def on_write(self, fake, verb, obj) -> None:
        if obj["kind"] != "Node" or verb == "DELETE":
            return
        want = obj["metadata"]["labels"].get(MIG_CONFIG_LABEL)
        if want and want.startswith("migscale-") and want not in (self.pending, self.applied):
            self.pending, self.left = want, self.polls
            self.cordoned_when_labelled = bool(obj["spec"].get("unschedulable"))
            node = fake.get("Node", obj["metadata"]["name"], None)
            node["metadata"]["labels"][MIG_STATE_LABEL] = "pending"
            fake.put_object(node)

    def tick(self) -> None:  # called on every clock sleep
        if self.pending is None or self.left is None:
            return
        self.left -= 1
        if self.left > 0:
            return
        node = self.fake.get("Node", "node-a", None)
        cm = self.fake.get("ConfigMap", CFG.mig_parted_configmap, CFG.mig_parted_namespace)
        entry = yaml.safe_load(cm["data"]["config.yaml"])["mig-configs"][self.pending]
        labels = {
            k: v for k, v in node["metadata"]["labels"].items() if not k.endswith(".count") or "mig-" not in k
        }
        for dev in entry:
            for prof, n in (dev.get("mig-devices") or {}).items():
                labels[f"nvidia.com/mig-{prof}.count"] = str(n)
        labels[MIG_STATE_LABEL] = "success"
        node["metadata"]["labels"] = labels
        self.fake.put_object(node)
        self.applied, self.pending = self.pending, None


class HookedClock(VirtualClock):
    def __init__(self, start: float, on_sleep) -> None:
        super().__init__(start)
        self.on_sleep = on_sleep
        self.sleeps = 0

    def sleep(self, seconds: float) -> None:
        self.sleeps += 1
        super().sleep(seconds)
        self.on_sleep()


def setup(fake, connect, polls_to_success):
    fake.put_object(gpu_node("node-a", {"3g.40gb": 2}, config="all-3g.40gb"))
    fake.put_object(pod("resnet-3g-a", "node-a"))
    fake.put_object(pod("resnet-3g-b", "node-a"))
    mgr = MigManager(fake, polls_to_success)
    fake.hooks.append(mgr.on_write)
    clock = HookedClock(1_800_000_000.0, mgr.tick)
    rest = connect()
    rep = Repartitioner(rest, CFG, clock, drain_timeout_s=60, config_timeout_s=300, poll_s=5)
    be = KubernetesBackend(rest, [RESNET], CFG, clock=clock, repartitioner=rep)
    action = Action(ActionKind.REPARTITION, Reason.REPARTITION, gpu="node-a/0", layout=TARGET)
    return be, rep, mgr, clock, action


def test_repartition_happy_path(fake, connect):
    be, rep, mgr, clock, action = setup(fake, connect, polls_to_success=3)
    assert be.apply([action]) == []
    node = fake.get("Node", "node-a", None)
    name = node["metadata"]["labels"][MIG_CONFIG_LABEL]
    assert name.startswith("migscale-") and node["metadata"]["labels"][MIG_STATE_LABEL] == "success"
    cm = fake.get("ConfigMap", CFG.mig_parted_configmap, CFG.mig_parted_namespace)
    doc = yaml.safe_load(cm["data"]["config.yaml"])
    assert doc["version"] == "v1"
    assert doc["mig-configs"][name] == [
        {"devices": [0], "mig-enabled": True, "mig-devices": {"1g.10gb": 1, "2g.20gb": 3}}
    ]
    assert not node["spec"].get("unschedulable")  # uncordoned at the end
    assert mgr.cordoned_when_labelled is True  # ... and cordoned while mig-manager worked
    assert fake.list("Pod") == []  # both GPU pods were evicted first
    steps = [s.split()[0] for s in rep.log]
    assert steps == ["config", "cordon", "evict", "evict", "label", "uncordon"]
    assert clock.sleeps >= 3  # it really waited for pending -> success
    assert "repartitioned node-a/0" in be.apply_calls
    assert be.snapshot().gpu("node-a/0").layout == TARGET  # the inventory now reads the new counts


def test_repartition_timeout_rolls_back_and_uncordons(fake, connect):
    be, rep, _mgr, clock, action = setup(fake, connect, polls_to_success=None)  # never succeeds
    t0 = clock.now()
    errors = be.apply([action])
    assert len(errors) == 1
    assert "still 'pending' after 300s" in errors[0] and "rolled back to 'all-3g.40gb'" in errors[0]
    node = fake.get("Node", "node-a", None)
    assert node["metadata"]["labels"][MIG_CONFIG_LABEL] == "all-3g.40gb"
    assert not node["spec"].get("unschedulable")
    assert clock.now() - t0 >= 300
    assert [s.split()[0] for s in rep.log][-2:] == ["rollback", "uncordon"]


def test_repartition_drain_timeout_leaves_label_alone(fake, connect):
    be, _rep, _mgr, _clock, action = setup(fake, connect, polls_to_success=1)
    fake.blocked_evictions.add("resnet-3g-b")  # its PDB never lets it go
    errors = be.apply([action])
    assert len(errors) == 1 and "drain of node-a timed out" in errors[0] and "resnet-3g-b" in errors[0]
    node = fake.get("Node", "node-a", None)
    assert node["metadata"]["labels"][MIG_CONFIG_LABEL] == "all-3g.40gb"
    assert not node["spec"].get("unschedulable")


def test_repartition_refuses_when_foreign_gpu_pods_run(fake, connect):
    be, rep, _mgr, _clock, action = setup(fake, connect, polls_to_success=1)
    fake.put_object(pod("someone-elses", "node-a", model=None, owned=False, ns="other"))
    errors = be.apply([action])
    assert len(errors) == 1 and "someone-elses" in errors[0] and "refused" in errors[0]
    assert rep.log == []
    assert fake.get("ConfigMap", CFG.mig_parted_configmap, CFG.mig_parted_namespace) is None
    assert len(fake.list("Pod")) == 3
    assert not fake.get("Node", "node-a", None)["spec"].get("unschedulable")
