"""The actuator contract on Kubernetes: what the shared suite cannot see.

``tests/contract/`` runs the one suite over every backend, this one included
(on the emulated control plane, its names translated by
``tests/contract/kube_harness.py``). These tests check the same rules in the
identities Kubernetes has -- a workload's Deployment and its Ready pods, a
node's objects and resourceVersion -- where the suite's names would hide them:
the scale written, the error naming the missing instance, a repartition to
the current layout writing nothing at all.
"""

from __future__ import annotations

from gpu_operator import gpu_node
from k8s_helpers import act, caught_up, wait_until

from autoscaler.mig.layout import Placement
from autoscaler.policy.types import ModelSpec, Reason, ReplicaState

M = ModelSpec("m", {"1g.10gb": 50.0, "2g.20gb": 90.0, "3g.40gb": 120.0}, ("1g.10gb", "2g.20gb", "3g.40gb"),
              min_replicas=0)
N = ModelSpec("n", {"1g.10gb": 50.0, "3g.40gb": 120.0}, ("1g.10gb", "3g.40gb"), min_replicas=0)


def world(cluster, backends, counts=None):
    fake = cluster.fake
    fake.put_object(gpu_node("node", counts or {"1g.10gb": 2, "2g.20gb": 1, "3g.40gb": 1}))
    fake.put_object(gpu_node("bare", {"3g.40gb": 1}))
    be = backends([M, N])
    caught_up(be, fake)
    be.snapshot()
    return fake, be


def ready(be, model: str, profile: str | None = None) -> int:
    return sum(1 for r in be.snapshot().replicas if r.model == model and r.state is ReplicaState.READY
               and (profile is None or r.profile == profile))


def settle(be, fake) -> list[str]:
    late: list[str] = []

    def converged() -> bool:
        # the ReplicaSets have acted on the last scale write: each workload has exactly
        # spec.replicas pods, none of them still terminating
        pods = fake.list("Pod")
        for d in fake.list("Deployment"):
            sel = d["spec"]["selector"]["matchLabels"]
            mine = [p for p in pods if all((p["metadata"].get("labels") or {}).get(k) == v for k, v in sel.items())]
            if len(mine) != d["spec"].get("replicas", 1):
                return False
        return True

    def quiet() -> bool:
        be.snapshot()
        be.advance()
        late.extend(be.take_errors())
        if be.rollout.chains or not converged():
            return False
        # the server has converged; the caches must have seen it too, or a pod the watch has not
        # delivered yet would pass as "nothing starting"
        caught_up(be, fake)
        return not any(r.state is not ReplicaState.READY for r in be.snapshot().replicas)

    wait_until(quiet, 15, "nothing queued, starting or draining")
    caught_up(be, fake)  # the caches have seen what the server converged to
    return late


def test_create_starts_a_replica_and_wait_ready_is_done_once_it_serves(cluster, backends):
    fake, be = world(cluster, backends)
    assert be.apply([act("create", "m", "2g.20gb", gpu="node/0"), act("wait_ready", "m", "2g.20gb", gpu="node/0")]) == []
    assert settle(be, fake) == [] and ready(be, "m", "2g.20gb") == 1


def test_create_where_the_node_has_no_such_instance_is_an_error_and_changes_nothing(cluster, backends):
    fake, be = world(cluster, backends)
    errs = be.apply([act("create", "m", "2g.20gb", gpu="bare/0")])
    assert len(errs) == 1 and "create m" in errs[0] and "no 2g.20gb instance" in errs[0]
    assert fake.get("Deployment", "m-2g-20gb") is None


def test_an_error_skips_the_rest_of_its_chain_only_and_independent_chains_go_on(cluster, backends):
    fake, be = world(cluster, backends)
    errs = be.apply([act("create", "m", "2g.20gb", gpu="bare/0"),  # fails
                     act("create", "m", "1g.10gb", gpu="node/0"),  # same model: skipped
                     act("create", "n", "3g.40gb", gpu="bare/0"), act("wait_ready", "n", "3g.40gb", gpu="bare/0")])
    assert len(errs) == 2 and "skipped" in errs[1] and "m-1g-10gb" in errs[1]
    assert settle(be, fake) == []
    assert ready(be, "n") == 1 and ready(be, "m") == 0


def test_a_failed_start_drops_the_make_before_break_chain_and_keeps_the_old(cluster, backends):
    fake, be = world(cluster, backends, {"1g.10gb": 1, "3g.40gb": 1})
    be.apply([act("create", "m", "3g.40gb", gpu="node/0")])
    settle(be, fake)
    old = [r.id for r in be.snapshot().replicas]
    n = fake.get("Node", "node", None)  # the 1g instance vanishes after the plan was made from a snapshot
    n["metadata"]["labels"].pop("nvidia.com/mig-1g.10gb.count")
    n["status"]["allocatable"]["nvidia.com/mig-1g.10gb"] = "0"
    fake.put_object(n)
    caught_up(be, fake)
    swap = [act("create", "m", "1g.10gb", gpu="node/0", reason=Reason.PROFILE_EFFICIENCY),
            act("wait_ready", "m", "1g.10gb", gpu="node/0"),
            act("drain", "m", "3g.40gb", gpu="node/0", replica=old[0]),
            act("delete", "m", "3g.40gb", gpu="node/0", replica=old[0])]
    assert be.apply(swap) == []  # planned from the snapshot in which the node still had its 1g
    errs = wait_until(lambda: (be.snapshot() and be.advance()) and be.take_errors(), 10, "the WAIT_READY to fail")
    assert any("cannot start" in e for e in errs) and sum("skipped" in e for e in errs) == 2
    assert ready(be, "m", "3g.40gb") == 1  # never break before make
    assert "m" not in be.in_flight()[1]  # nothing of m is queued any more


def test_a_replica_only_starting_is_not_in_flight_but_its_replacements_old_is(cluster, backends):
    fake, be = world(cluster, backends)
    be.apply([act("create", "m", "1g.10gb", gpu="node/0"), act("wait_ready", "m", "1g.10gb", gpu="node/0")])
    assert be.in_flight() == (frozenset(), frozenset())  # capacity on its way, not work in flight
    settle(be, fake)
    old = [r.id for r in be.snapshot().replicas]
    cluster.kubelet.ready_delay_s = 1e9
    be.apply([act("create", "m", "2g.20gb", gpu="node/0"), act("wait_ready", "m", "2g.20gb", gpu="node/0"),
              act("drain", "m", "1g.10gb", gpu="node/0", replica=old[0]),
              act("delete", "m", "1g.10gb", gpu="node/0", replica=old[0])])
    gpus, models = be.in_flight()
    assert "m" in models and "node/0" in gpus


def test_drain_and_delete_of_a_replica_already_gone_are_done_and_remove_nothing_else(cluster, backends):
    fake, be = world(cluster, backends)
    be.apply([act("create", "m", "1g.10gb", gpu="node/0")] * 2)
    settle(be, fake)
    assert be.apply([act("drain", "m", "1g.10gb", replica="ghost"), act("delete", "m", "1g.10gb", replica="ghost")]) == []
    assert fake.get("Deployment", "m-1g-10gb")["spec"]["replicas"] == 2 and settle(be, fake) == []
    victim = min(r.id for r in be.snapshot().replicas)
    delete = [act("drain", "m", "1g.10gb", replica=victim), act("delete", "m", "1g.10gb", replica=victim)]
    assert be.apply(delete) == []
    settle(be, fake)
    assert be.apply(delete) == []  # the same DELETE again: done, the other replica stays
    assert settle(be, fake) == [] and ready(be, "m") == 1


def test_a_scale_down_not_yet_carried_out_keeps_the_model_in_flight(cluster, backends):
    # The ReplicaSet's "expectations": until the pod the scale-down removes is going, a plan
    # from the cache would count it as serving and could scale down its replacement too.
    fake, be = world(cluster, backends)
    be.apply([act("create", "m", "1g.10gb", gpu="node/0")] * 2)
    settle(be, fake)
    assert be.in_flight() == (frozenset(), frozenset())
    victim = min(r.id for r in be.snapshot().replicas)
    cluster.plane.stop()  # the ReplicaSet controller does not act for now
    assert be.apply([act("drain", "m", "1g.10gb", replica=victim), act("delete", "m", "1g.10gb", replica=victim)]) == []
    assert not be.rollout.chains and fake.get("Deployment", "m-1g-10gb")["spec"]["replicas"] == 1
    assert ready(be, "m") == 2 and "m" in be.in_flight()[1]  # two live pods for a size of 1: held
    cluster.plane.start()
    assert settle(be, fake) == []
    assert ready(be, "m") == 1 and "m" not in be.in_flight()[1]


def test_repartition_to_the_layout_a_node_has_is_done_at_once(cluster, backends):
    fake, be = world(cluster, backends, {"3g.40gb": 2})
    layout = (Placement(0, "3g.40gb"), Placement(4, "3g.40gb"))
    before = fake.get("Node", "node", None)["metadata"]["resourceVersion"]
    assert be.apply([act("repartition", gpu="node/0", profile=None, layout=layout, reason=Reason.REPARTITION)]) == []
    assert settle(be, fake) == [] and not be.repartitioner.in_progress()
    assert fake.get("Node", "node", None)["metadata"]["resourceVersion"] == before  # not touched: no cordon, no label
