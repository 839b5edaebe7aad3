"""Action order and consolidation around replicas still starting (planner steps 2b and 3).

A chain (``protocols.action_groups``) links every action of a model and of a GPU,
and a WAIT_READY holds back all that follows it in its chain: these cases pin
down that work which does not need a new replica serving is not queued behind
its start, and that a replica still starting is not moved."""

from __future__ import annotations

from autoscaler.mig import Placement, get_product
from autoscaler.policy.planner import apply_plan_to_cluster, plan
from autoscaler.policy.planner.budget import REPLACING
from autoscaler.policy.types import ActionKind, ClusterState, GpuState, ModelSpec, Reason, Replica
from autoscaler.policy.types import ReplicaState as State
from autoscaler.protocols import action_groups

A100 = "A100-SXM4-80GB"
SEVEN_1G = tuple(Placement(i, "1g.10gb") for i in range(7))
LIGHT = {"1g.10gb": 127.0, "2g.20gb": 171.0, "3g.40gb": 191.0, "7g.80gb": 192.0}


def spec(name: str, **kw) -> ModelSpec:
    return ModelSpec(name, dict(LIGHT), tuple(LIGHT), **kw)


def assert_replacements_whole(p, models) -> None:
    """A copy never goes without the delete it pairs with, nor a delete without its copy."""
    for m in models:
        mine = [a for a in p.actions if a.model == m.name and a.reason in REPLACING]
        assert any(a.kind is ActionKind.CREATE for a in mine) == any(a.kind is ActionKind.DELETE for a in mine), \
            [(a.kind.value, a.replica, a.reason.value) for a in mine]


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


def test_a_create_that_needs_the_room_of_a_deferred_delete_is_deferred_with_it():
    # The full target: m2 swaps each 7g for a 3g at slices 4-6 (24.5 req/s, spread over two
    # GPUs), and the three 1g models move from node/2 into slices 1-3 beside them. node/1's
    # swap cannot be ordered (its 7g drains only after its copy serves, and the copy's
    # instance is cut only after the 7g is gone), so it waits, and with it the rest of m2's
    # replacement: node/0's 7g stays. The 1g copies placed in that 7g's room cannot go
    # either, nor what they pair with: no layout may hold a replica that stays and one that
    # comes in the same slices.
    from test_planner import assert_actions_are_safe, check_valid

    one = {"1g.10gb": 10.0}
    m0 = ModelSpec("m0", one, ("1g.10gb",), min_replicas=0, max_replicas=2, high_availability=True)
    m1 = ModelSpec("m1", one, ("1g.10gb",), min_replicas=1, max_replicas=1)
    m3 = ModelSpec("m3", one, ("1g.10gb",), min_replicas=0, max_replicas=1, high_availability=True)
    m2 = ModelSpec("m2", {"3g.40gb": 24.4, "7g.80gb": 70.0}, ("3g.40gb", "7g.80gb"), min_replicas=0,
                   max_replicas=2, high_availability=True)
    ready = State.READY
    seven = (Placement(0, "7g.80gb"),)
    cl = ClusterState(
        gpus=(GpuState("node/0", "node", A100, seven), GpuState("node/1", "node", A100, seven),
              GpuState("node/2", "node", A100, tuple(Placement(i, "1g.10gb") for i in range(3, 7)))),
        replicas=(Replica("m2-0", "m2", "7g.80gb", "node/0", 0, ready), Replica("m2-1", "m2", "7g.80gb", "node/1", 0, ready),
                  Replica("m0-0", "m0", "1g.10gb", "node/2", 3, ready), Replica("m1-0", "m1", "1g.10gb", "node/2", 4, ready),
                  Replica("m3-0", "m3", "1g.10gb", "node/2", 5, ready), Replica("m0-1", "m0", "1g.10gb", "node/2", 6, ready)),
    )
    models = [m0, m1, m2, m3]
    p = plan(models, {"m0": 0.0, "m1": 0.0, "m2": 24.5, "m3": 0.0}, cl)
    check_valid(cl, p)
    assert_actions_are_safe(cl, p, models)
    # nothing that stays shares a slice with something new
    after = apply_plan_to_cluster(cl, p)
    for g in after.gpus:
        slots = [s for r in after.replicas if r.gpu == g.id
                 for s in range(r.start, r.start + get_product(A100).profiles[r.profile].mem_slots)]
        assert len(slots) == len(set(slots)), (g.id, sorted((r.id, r.start, r.profile) for r in after.replicas if r.gpu == g.id))
    assert_replacements_whole(p, models)


def test_a_replacement_is_one_unit_under_the_budget_whatever_names_its_parts():
    # m2 (high availability, no demand) swaps its 3g on node/1 for a 1g. Consolidation places
    # that copy on node/2, so the copy is named a move while the 3g's delete is a profile
    # swap. Paired by name, the copy went alone within a budget of 3 (beside m0's move, 2),
    # the next plan scaled it down as surplus, the one after made it again: a loop, with
    # m0 moving between node/1 and node/2 on every turn.
    from test_planner import check_valid

    m0 = ModelSpec("m0", {"2g.20gb": 48.8, "3g.40gb": 58.5, "7g.80gb": 97.5},
                   ("1g.10gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb"), min_replicas=0, max_replicas=7,
                   high_availability=True)
    m1 = ModelSpec("m1", {"1g.10gb": 10.0, "2g.20gb": 12.5}, ("1g.10gb", "2g.20gb"), min_replicas=1, max_replicas=1)
    m2 = ModelSpec("m2", {"1g.10gb": 8.8, "3g.40gb": 30.0}, ("3g.40gb", "1g.10gb"), min_replicas=0, max_replicas=3,
                   high_availability=True)
    m3 = ModelSpec("m3", {"2g.20gb": 20.0}, ("2g.20gb",), min_replicas=0, max_replicas=2, high_availability=True)
    models = [m0, m1, m2, m3]
    demand = dict.fromkeys(("m0", "m1", "m2", "m3"), 0.0)
    twos = (Placement(0, "2g.20gb"), Placement(2, "2g.20gb"))
    ready = State.READY
    cl = ClusterState(
        gpus=(GpuState("node/0", "node", A100, (*twos, Placement(4, "2g.20gb"), Placement(6, "1g.10gb"))),
              GpuState("node/1", "node", A100, (*twos, Placement(4, "3g.40gb"))),
              GpuState("node/2", "node", A100, (*twos, Placement(6, "1g.10gb"))),
              GpuState("node/3", "node", A100, (Placement(0, "7g.80gb"),))),
        replicas=(Replica("m3-0", "m3", "2g.20gb", "node/0", 0, ready), Replica("m1-1", "m1", "2g.20gb", "node/0", 2, ready),
                  Replica("m0-0", "m0", "2g.20gb", "node/0", 4, ready), Replica("m2-2", "m2", "1g.10gb", "node/0", 6, ready),
                  Replica("m2-0", "m2", "3g.40gb", "node/1", 4, ready), Replica("m0-2", "m0", "2g.20gb", "node/1", 0, ready),
                  Replica("m3-2", "m3", "2g.20gb", "node/2", 0, ready)),
    )
    for _ in range(8):
        p = plan(models, demand, cl, churn_budget=3)
        check_valid(cl, p)
        assert_replacements_whole(p, models)
        if not p.actions:
            break
        created = {a.replica for a in p.actions if a.kind is ActionKind.CREATE}
        cl = apply_plan_to_cluster(cl, p)
        again = plan(models, demand, cl, churn_budget=3)
        assert not created & {a.replica for a in again.actions
                              if a.kind is ActionKind.DELETE and a.reason is Reason.SCALE_DOWN_DEMAND}
    else:
        raise AssertionError("no fixpoint in 8 plans")
