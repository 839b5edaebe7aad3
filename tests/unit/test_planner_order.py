"""Action order and consolidation around replicas still starting (planner steps 2b and 3).

A chain (``protocols.action_groups``) links every action of a model and of a GPU,
and a WAIT_READY holds back all that follows it in its chain: these cases pin
down that work which does not need a new replica serving is not queued behind
its start, and that a replica still starting is not moved."""

from __future__ import annotations

from autoscaler.mig import Placement
from autoscaler.policy.planner import apply_plan_to_cluster, plan
from autoscaler.policy.types import ActionKind, ClusterState, GpuState, ModelSpec, Reason, Replica
from autoscaler.policy.types import ReplicaState as State
from autoscaler.protocols import action_groups

A100 = "A100-SXM4-80GB"
SEVEN_1G = tuple(Placement(i, "1g.10gb") for i in range(7))
LIGHT = {"1g.10gb": 127.0, "2g.20gb": 171.0, "3g.40gb": 191.0, "7g.80gb": 192.0}


def spec(name: str, **kw) -> ModelSpec:
    return ModelSpec(name, dict(LIGHT), tuple(LIGHT), **kw)


def owner_of(cluster: ClusterState):
    reps = {r.id: (r.gpu, r.model) for r in cluster.replicas}
    return reps.get


def test_a_scale_down_is_not_queued_behind_another_models_start():
    # One GPU: "a" shrinks from two replicas to one while "b" starts one on a
    # free instance. Both touch the GPU, so they form one chain; a's drain needs
    # nothing of b's replica and must not wait out its start.
    cl = ClusterState(
        gpus=(GpuState("node/0", "node", A100, SEVEN_1G),),
        replicas=(
            Replica("a-0", "a", "1g.10gb", "node/0", 0, State.READY),
            Replica("a-1", "a", "1g.10gb", "node/0", 1, State.READY),
        ),
    )
    p = plan([spec("a"), spec("b")], {"a": 100.0, "b": 100.0}, cl)
    kinds = [a.kind for a in p.actions]
    assert kinds.count(ActionKind.CREATE) == 1 and kinds.count(ActionKind.DRAIN) == 1
    groups = action_groups(p.actions, owner_of(cl))
    assert len(set(groups)) == 1, "one GPU: one chain"
    assert kinds.index(ActionKind.DRAIN) < kinds.index(ActionKind.WAIT_READY)
    assert kinds.index(ActionKind.DELETE) < kinds.index(ActionKind.WAIT_READY)
    assert kinds[-1] is ActionKind.WAIT_READY


def test_a_replacement_still_waits_for_its_copy():
    # make-before-break holds where the capacity depends on it: a consolidation
    # move drains the old replica only after its copy is ready
    lay = (Placement(0, "1g.10gb"), Placement(1, "1g.10gb"))
    cl = ClusterState(
        gpus=tuple(GpuState(f"node/{i}", "node", A100, lay) for i in range(2)),
        replicas=(
            Replica("a-0", "a", "1g.10gb", "node/0", 0, State.READY),
            Replica("a-1", "a", "1g.10gb", "node/1", 0, State.READY),
        ),
    )
    p = plan([spec("a")], {"a": 200.0}, cl)
    kinds = [a.kind for a in p.actions]
    assert Reason.CONSOLIDATE in p.reasons["a"]
    assert kinds.index(ActionKind.WAIT_READY) < kinds.index(ActionKind.DRAIN)


def test_consolidation_leaves_a_gpu_whose_replica_is_still_starting():
    lay = (Placement(0, "1g.10gb"), Placement(1, "1g.10gb"))

    def cluster(state: State) -> ClusterState:
        return ClusterState(
            gpus=tuple(GpuState(f"node/{i}", "node", A100, lay) for i in range(2)),
            replicas=(
                Replica("a-0", "a", "1g.10gb", "node/0", 0, State.READY),
                Replica("a-1", "a", "1g.10gb", "node/1", 0, state),
            ),
        )

    starting = plan([spec("a")], {"a": 200.0}, cluster(State.STARTING))
    assert starting.actions == () and starting.cost.gpus_used == 2
    assert Reason.CONSOLIDATE not in starting.reasons.get("a", ())
    # once it serves, its GPU is a candidate like any other
    ready = plan([spec("a")], {"a": 200.0}, cluster(State.READY))
    assert Reason.CONSOLIDATE in ready.reasons["a"] and ready.cost.gpus_used == 1
    assert {r.gpu for r in apply_plan_to_cluster(cluster(State.READY), ready).replicas} == {"node/0"}
