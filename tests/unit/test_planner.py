"""Unit cases for the MIG planner (autoscaler.policy.planner.core) and its MILP reference."""

from __future__ import annotations

import dataclasses
import json

import pytest

from autoscaler.mig import Placement, check_layout, get_product
from autoscaler.policy.milp import solve
from autoscaler.policy.planner import apply_plan_to_cluster, group_of, plan
from autoscaler.policy.planner.sizing import ProfileOption, cover
from autoscaler.policy.types import (
    ActionKind,
    ClusterState,
    GpuState,
    ModelSpec,
    Plan,
    Reason,
    Replica,
    ReplicaState,
)

A100 = "A100-SXM4-80GB"
ALL = ("1g.10gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb")
# ResNet-50 batch-1 shape (docs/profile-throughput.md): small slices are far more efficient.
LIGHT = {"1g.10gb": 127, "2g.20gb": 171, "3g.40gb": 191, "4g.40gb": 192, "7g.80gb": 192}
# Throughput about linear in slices (large batch).
LINEAR = {"1g.10gb": 60, "2g.20gb": 120, "3g.40gb": 180, "4g.40gb": 240, "7g.80gb": 420}


def gpus(n: int, product: str = A100, node: str = "node", **kw) -> tuple[GpuState, ...]:
    return tuple(GpuState(f"{node}/{i}", node, product, **kw) for i in range(n))


def spec(name: str, caps=LIGHT, **kw) -> ModelSpec:
    kw.setdefault("allowed_profiles", tuple(caps))
    return ModelSpec(name=name, capacity=dict(caps), **kw)


def churn(p: Plan) -> int:
    return sum(1 for a in p.actions if a.kind in (ActionKind.CREATE, ActionKind.DELETE))


def kinds(p: Plan) -> list[str]:
    return [a.kind.value for a in p.actions]


def check_valid(cluster: ClusterState, p: Plan) -> None:
    """Layouts valid, every assignment on an instance of its GPU's layout, no instance shared."""
    by_id = {g.id: g for g in cluster.gpus}
    seen = set()
    for a in p.assignments:
        if a.profile == "whole":
            assert p.layouts[a.gpu] == ()
            continue
        assert Placement(a.start, a.profile) in p.layouts[a.gpu]
        assert (a.gpu, a.start) not in seen
        seen.add((a.gpu, a.start))
    for gid, layout in p.layouts.items():
        assert check_layout(get_product(by_id[gid].product), layout) == []


# ---------------------------------------------------------------- sizing


def test_cover_prefers_efficient_small_profiles_for_a_light_model():
    opts = [ProfileOption(n, c, get_product(A100).profiles[n].compute, 1) for n, c in LIGHT.items()]
    # 400 req/s: 4 x 1g (4 slices, 508 req/s); a 7g (7 slices) gives only 192.
    assert cover(400, sorted(opts, key=lambda o: -o.efficiency)) == {"1g.10gb": 4}


def test_cover_respects_max_replicas_by_choosing_bigger_profiles():
    opts = sorted((ProfileOption(n, c, get_product(A100).profiles[n].compute, 1) for n, c in LINEAR.items()),
                  key=lambda o: -o.efficiency)
    mix = cover(600, opts, 0, 2)
    assert sum(mix.values()) <= 2
    assert sum(LINEAR[p] * n for p, n in mix.items()) >= 600


def test_cover_with_a_replica_ceiling_is_exact():
    import itertools
    import random

    rng = random.Random(3)
    for _ in range(150):
        opts = [ProfileOption(n, round(rng.uniform(10, 100) * c ** rng.uniform(0.2, 1.1), 1), c, c)
                for n, c in (("1g", 1), ("2g", 2), ("3g", 3), ("4g", 4), ("7g", 7)) if rng.random() < 0.8]
        if not opts:
            continue
        opts.sort(key=lambda o: -o.efficiency)
        ceiling, demand = rng.randint(1, 5), rng.uniform(0, 500)
        got = cover(demand, opts, 0, ceiling)
        assert sum(got.values()) <= ceiling
        cap = sum(o.cap * got.get(o.name, 0) for o in opts)
        slices = sum(o.compute * got.get(o.name, 0) for o in opts)
        best = None
        for combo in itertools.product(range(ceiling + 1), repeat=len(opts)):
            if sum(combo) > ceiling:
                continue
            c = sum(o.cap * k for o, k in zip(opts, combo))
            s = sum(o.compute * k for o, k in zip(opts, combo))
            key = (0, s) if c >= demand - 1e-9 else (1, -c)
            best = key if best is None else min(best, key)
        if best[0] == 0:
            assert cap >= demand - 1e-9 and slices == best[1]
        else:
            assert cap == pytest.approx(-best[1])


def test_cover_meets_a_floor_with_the_fewest_slices():
    opts = sorted([ProfileOption("1g", 49.3, 1, 1), ProfileOption("3g", 157.4, 3, 4),
                   ProfileOption("7g", 405.5, 7, 8)], key=lambda o: -o.efficiency)
    # 124 req/s alone: one 3g (3 slices). With a floor of 2: 3 x 1g (3 slices),
    # not 3g padded with a 1g (4 slices).
    assert cover(124, opts) == {"3g": 1}
    assert cover(124, opts, 2, 7) == {"1g": 3}
    ha = sorted([ProfileOption("3g", 201.4, 3, 4), ProfileOption("4g", 294.9, 4, 4)], key=lambda o: -o.efficiency)
    assert cover(272.3, ha, 2, 8) == {"3g": 2}


def test_invalid_demand_holds_and_says_why():
    cl = ClusterState(gpus=gpus(1))
    for bad in (float("nan"), float("inf")):
        p = plan([spec("a")], {"a": bad}, cl)
        assert Reason.INVALID_METRIC in p.reasons["a"]
        assert Reason.HOLD_MISSING_METRICS in p.reasons["a"]
        assert len(p.assignments) == 1  # min_replicas only: never scaled on a bad number


def test_light_model_gets_many_1g_slices_on_one_gpu():
    cl = ClusterState(gpus=gpus(2))
    p = plan([spec("resnet", max_replicas=16)], {"resnet": 800}, cl)
    assert p.desired == {("resnet", "1g.10gb"): 7}
    assert p.cost.gpus_used == 1 and p.cost.slices_used == 7
    assert p.capacity_rps["resnet"] >= 800 and not p.shortfall
    assert Reason.SCALE_UP_DEMAND in p.reasons["resnet"]
    check_valid(cl, p)


def test_unusable_profiles_are_never_chosen():
    # 1g is missing from the capacity table (its latency breaks the SLO), 2g is
    # not allowed, and the model needs 30 GB so 1g/2g are too small anyway.
    caps = {"2g.20gb": 500, "3g.40gb": 150, "7g.80gb": 300}
    m = ModelSpec("big", caps, allowed_profiles=("1g.10gb", "3g.40gb", "7g.80gb"), memory_gb=30, max_replicas=8)
    tiny = ModelSpec("tiny", {"1g.10gb": 100, "2g.20gb": 400}, allowed_profiles=("1g.10gb", "2g.20gb"),
                     memory_gb=15, max_replicas=8)
    cl = ClusterState(gpus=gpus(4))
    p = plan([m, tiny], {"big": 400, "tiny": 700}, cl)
    assert {a.profile for a in p.assignments if a.model == "big"} <= {"3g.40gb", "7g.80gb"}
    assert {a.profile for a in p.assignments if a.model == "tiny"} == {"2g.20gb"}
    assert not p.shortfall
    check_valid(cl, p)


def test_model_without_any_usable_profile_is_a_shortfall_not_a_crash():
    m = ModelSpec("x", {"1g.10gb": 10}, allowed_profiles=("1g.10gb",), memory_gb=40)
    p = plan([m], {"x": 5}, ClusterState(gpus=gpus(1)))
    assert p.assignments == () and p.shortfall == {"x": 5}
    assert Reason.SHORTFALL in p.reasons["x"]


# ---------------------------------------------------------------- placement


def test_high_availability_puts_replicas_on_distinct_gpus():
    cl = ClusterState(gpus=gpus(3))
    p = plan([spec("a", high_availability=True)], {"a": 50}, cl)
    mine = [a for a in p.assignments if a.model == "a"]
    assert len(mine) == 2 and len({a.gpu for a in mine}) == 2
    check_valid(cl, p)


def test_high_availability_survives_scale_down():
    cl = ClusterState(gpus=gpus(3))
    m = spec("a", high_availability=True)
    cl = apply_plan_to_cluster(cl, plan([m], {"a": 1500}, cl))
    p = plan([m], {"a": 10}, cl)
    after = apply_plan_to_cluster(cl, p)
    assert len({r.gpu for r in after.replicas}) == 2 and len(after.replicas) == 2


def test_high_availability_fails_loudly_on_one_gpu():
    p = plan([spec("a", high_availability=True)], {"a": 50}, ClusterState(gpus=gpus(1)))
    # Two replicas still run (better than one), but the plan says HA is not met.
    assert len(p.assignments) == 2
    assert Reason.SHORTFALL in p.reasons["a"]


def test_high_availability_swaps_with_a_model_that_stays_spread():
    # Three GPUs hold exactly nine 2g and three 1g. The packing put both of m0's 2g on
    # node/0; the repair may swap one with a 2g of m1, which is HA too and already on
    # node/0: m1 keeps replicas on the other GPUs, so it stays spread. (Swaps only with a
    # model absent from node/0 found none, and m0 was left with one replica.)
    m0 = spec("m0", {"2g.20gb": 12.5}, allowed_profiles=("1g.10gb", "2g.20gb"), min_replicas=2, max_replicas=2,
              high_availability=True)
    m1 = spec("m1", {"2g.20gb": 12.5, "3g.40gb": 15.0}, min_replicas=0, max_replicas=7, high_availability=True,
              priority=1)
    m2 = spec("m2", {"1g.10gb": 10.0}, min_replicas=0, max_replicas=2, high_availability=True)
    cl = ClusterState(gpus=gpus(3))
    p = plan([m0, m1, m2], {"m0": 0.0, "m1": 81.0, "m2": 0.0}, cl)
    check_valid(cl, p)
    assert not any(Reason.SHORTFALL in rs for rs in p.reasons.values()), p.reasons
    for m in ("m0", "m1", "m2"):
        assert len({a.gpu for a in p.assignments if a.model == m}) >= 2, m
    assert p.capacity_rps["m1"] >= 81.0 and sum(1 for a in p.assignments if a.model == "m0") == 2


def test_existing_replicas_stay_where_they_are():
    cl = ClusterState(
        gpus=gpus(2, layout=(Placement(0, "3g.40gb"), Placement(4, "3g.40gb"))),
        replicas=(Replica("a-0", "a", "3g.40gb", "node/1", 4, ReplicaState.READY),),
    )
    # 3g is this model's only profile: 180 req/s per replica; 300 needs one more.
    m = spec("a", {"3g.40gb": 180}, max_replicas=4)
    p = plan([m], {"a": 300}, cl)
    assert any(a.replica == "a-0" and a.gpu == "node/1" and a.start == 4 for a in p.assignments)
    # The new one reuses the existing empty 3g instance beside it: no repartition.
    assert kinds(p) == ["create", "wait_ready"]
    assert p.actions[0].gpu == "node/1" and p.actions[0].start == 0
    assert p.cost.gpus_used == 1 and p.cost.gpus_repartitioned == 0


def test_consolidation_frees_a_whole_gpu():
    # Two GPUs, each with one small replica: both fit on one GPU.
    lay = (Placement(0, "1g.10gb"), Placement(1, "1g.10gb"))
    cl = ClusterState(
        gpus=gpus(2, layout=lay),
        replicas=(
            Replica("a-0", "a", "1g.10gb", "node/0", 0, ReplicaState.READY),
            Replica("a-1", "a", "1g.10gb", "node/1", 0, ReplicaState.READY),
        ),
    )
    p = plan([spec("a")], {"a": 200}, cl)
    assert p.cost.gpus_used == 1
    assert Reason.CONSOLIDATE in p.reasons["a"]
    assert [a.kind for a in p.actions] == [ActionKind.CREATE, ActionKind.WAIT_READY, ActionKind.DRAIN,
                                           ActionKind.DELETE]
    # make-before-break: the moved replica's copy is created on node/0 before node/1's drains
    assert p.actions[0].gpu == "node/0" and p.actions[2].gpu == "node/1"
    after = apply_plan_to_cluster(cl, p)
    assert {r.gpu for r in after.replicas} == {"node/0"}
    assert plan([spec("a")], {"a": 200}, after).actions == ()


def test_consolidation_recuts_a_gpu_only_where_a_repartition_touches_that_gpu_alone():
    # node/1's one replica fits on node/0 only if node/0's empty 1g instances at 2 and 3 become
    # a 2g: a re-cut of node/0. Where that drains one GPU it is worth a GPU freed; where it
    # drains the whole node (mig-manager on Kubernetes) it evicts every pod there, so it waits.
    from autoscaler.policy.types import RepartitionScope

    lay0 = (Placement(0, "2g.20gb"), Placement(2, "1g.10gb"), Placement(3, "1g.10gb"))
    cl = ClusterState(
        gpus=(GpuState("node/0", "node", A100, lay0), GpuState("node/1", "node", A100, (Placement(0, "2g.20gb"),))),
        replicas=(
            Replica("a-0", "a", "2g.20gb", "node/0", 0, ReplicaState.READY),
            Replica("a-1", "a", "2g.20gb", "node/1", 0, ReplicaState.READY),
        ),
    )
    a = spec("a", LINEAR, allowed_profiles=("2g.20gb",), min_replicas=2)
    per_gpu = plan([a], {"a": 200}, cl)
    assert Reason.CONSOLIDATE in per_gpu.reasons["a"] and per_gpu.cost.gpus_used == 1
    assert any(x.kind is ActionKind.REPARTITION and x.gpu == "node/0" for x in per_gpu.actions)
    per_node = plan([a], {"a": 200}, cl, repartition_scope=RepartitionScope.NODE)
    assert per_node.actions == () and per_node.cost.gpus_used == 2


def test_consolidation_leaves_replicas_a_growing_model_has_outgrown_where_they_are():
    # m1 runs two 2g (40 req/s) for 62 and grows by a 7g on the empty GPU c. Until the 7g
    # serves, the 2g pair stays; then the 7g alone covers 62 and the next plan scales the
    # pair down. Emptying a into b's and d's free 2g slots would make two copies only to
    # delete them one tick later.
    h100 = "H100-SXM5-80GB"
    ready = ReplicaState.READY
    m1 = ModelSpec("m1", {"2g.20gb": 20.0, "7g.80gb": 70.0}, ("2g.20gb", "7g.80gb"), min_replicas=0, max_replicas=3)
    x = ModelSpec("x", {"4g.40gb": 40.0, "1g.10gb": 10.0}, ("4g.40gb", "1g.10gb"), min_replicas=0, max_replicas=4)
    part = (Placement(0, "4g.40gb"), Placement(6, "1g.10gb"))
    cl = ClusterState(
        gpus=(GpuState("a", "n", h100, (Placement(0, "2g.20gb"), Placement(2, "2g.20gb"))),
              GpuState("b", "n", h100, part), GpuState("d", "n", h100, part), GpuState("c", "n", h100, ())),
        replicas=(Replica("m1-a0", "m1", "2g.20gb", "a", 0, ready), Replica("m1-a2", "m1", "2g.20gb", "a", 2, ready),
                  Replica("x-b", "x", "4g.40gb", "b", 0, ready), Replica("x-b6", "x", "1g.10gb", "b", 6, ready),
                  Replica("x-d", "x", "4g.40gb", "d", 0, ready), Replica("x-d6", "x", "1g.10gb", "d", 6, ready)),
    )
    demand = {"m1": 62.0, "x": 95.0}
    p = plan([m1, x], demand, cl)
    made = [(a.profile, a.gpu, a.reason) for a in p.actions if a.kind is ActionKind.CREATE]
    assert made == [("7g.80gb", "c", Reason.SCALE_UP_DEMAND)], made
    assert not any(a.kind is ActionKind.DELETE for a in p.actions)
    after = apply_plan_to_cluster(cl, p)
    p2 = plan([m1, x], demand, after)
    gone = sorted(a.replica for a in p2.actions if a.kind is ActionKind.DELETE)
    assert gone == ["m1-a0", "m1-a2"] and all(a.kind is not ActionKind.CREATE for a in p2.actions)
    # A model that has not outgrown them (the 7g alone falls short) still has its pair moved
    # when that frees a GPU: the growing model's own replicas are not pinned as such.
    p3 = plan([m1, x], {"m1": 95.0, "x": 95.0}, cl)
    assert any(a.reason is Reason.CONSOLIDATE for a in p3.actions if a.kind is ActionKind.CREATE), \
        [(a.kind.value, a.replica, a.gpu, a.reason.value) for a in p3.actions]


def test_consolidation_leaves_a_replica_outgrown_by_a_fast_path_replica_where_it_is():
    # m1 runs one 3g (207.4 req/s) for 208. The scale-up fast path gives it node/2's empty 7g
    # (553): the 3g is outgrown. Moving it into node/1's 3g (freed by m0's scale-down) would
    # empty node/0, but the next plan scales the copy down: the 3g stays until it goes.
    m0 = ModelSpec("m0", {"2g.20gb": 31.5, "3g.40gb": 47.2}, ("3g.40gb", "2g.20gb"), min_replicas=1, max_replicas=5,
                   priority=2)
    m1 = ModelSpec("m1", {"3g.40gb": 207.4, "7g.80gb": 553.0}, ("3g.40gb", "7g.80gb"), min_replicas=0, max_replicas=2)
    ready = ReplicaState.READY
    threes = (Placement(0, "3g.40gb"), Placement(4, "3g.40gb"))
    cl = ClusterState(
        gpus=(GpuState("node/0", "node", A100, threes), GpuState("node/1", "node", A100, (Placement(2, "2g.20gb"), Placement(4, "3g.40gb"))),
              GpuState("node/2", "node", A100, (Placement(0, "7g.80gb"),))),
        replicas=(Replica("m0-0", "m0", "3g.40gb", "node/0", 0, ready), Replica("m1-0", "m1", "3g.40gb", "node/0", 4, ready),
                  Replica("m0-1", "m0", "2g.20gb", "node/1", 2, ready), Replica("m0-2", "m0", "3g.40gb", "node/1", 4, ready)),
    )
    demand = {"m0": 0.0, "m1": 208.0}
    p = plan([m0, m1], demand, cl)
    made = [(a.profile, a.gpu, a.reason) for a in p.actions if a.kind is ActionKind.CREATE]
    assert ("7g.80gb", "node/2", Reason.SCALE_UP_DEMAND) in made, made
    assert not any(a.model == "m1" and a.kind is ActionKind.DELETE for a in p.actions)
    created = {a.replica for a in p.actions if a.kind is ActionKind.CREATE}
    after = apply_plan_to_cluster(cl, p)
    p2 = plan([m0, m1], demand, after)
    assert [a.replica for a in p2.actions if a.kind is ActionKind.DELETE] == ["m1-0"]
    assert not created & {a.replica for a in p2.actions if a.kind is ActionKind.DELETE}


def test_repartition_only_after_the_affected_instances_are_empty():
    # node/0 runs a 7g replica of "a"; demand drops and "b" needs 1g slices.
    cl = ClusterState(
        gpus=gpus(1, layout=(Placement(0, "7g.80gb"),)),
        replicas=(Replica("a-0", "a", "7g.80gb", "node/0", 0, ReplicaState.READY),),
    )
    a = spec("a", LINEAR, min_replicas=0)
    b = spec("b", LIGHT)
    p = plan([a, b], {"a": 0, "b": 300}, cl)
    order = kinds(p)
    assert order.index("delete") < order.index("repartition") < order.index("create")
    check_valid(cl, p)
    assert_actions_are_safe(cl, p, [a, b])


def test_repartition_never_evicts_a_serving_replica_of_the_same_model():
    # Two GPUs, "a" runs on a 7g on each (300 req/s); its optimum for 280 is
    # 3 x 1g (3 slices instead of 14) but those need the 7g's space, and
    # dropping either 7g first would leave 150 < 280: the switch is deferred.
    cl = ClusterState(
        gpus=gpus(2, layout=(Placement(0, "7g.80gb"),)),
        replicas=(Replica("a-0", "a", "7g.80gb", "node/0", 0, ReplicaState.READY),
                  Replica("a-1", "a", "7g.80gb", "node/1", 0, ReplicaState.READY)),
    )
    m = spec("a", {"1g.10gb": 100, "7g.80gb": 150}, max_replicas=8)
    p = plan([m], {"a": 280}, cl)
    assert_actions_are_safe(cl, p, [m])
    assert not any(a.kind is ActionKind.DELETE for a in p.actions)
    assert Reason.CHURN_BUDGET in p.reasons["a"]


def test_a_scale_down_waits_until_the_replica_it_keeps_is_ready():
    # Demand fell while a 7g was still starting: the 7g alone covers it, so the two
    # ready 3g replicas go -- but not before the 7g serves, or the model has nothing
    # ready in between. The drain is held (converging) and happens once it is ready.
    caps = {"3g.40gb": 364.0, "7g.80gb": 844.0}
    m = spec("vit", caps, max_replicas=8)
    layouts = ((Placement(0, "7g.80gb"),), (Placement(0, "3g.40gb"), Placement(4, "3g.40gb")))

    def cluster(state: ReplicaState) -> ClusterState:
        return ClusterState(
            gpus=tuple(GpuState(f"node/{i}", "node", A100, lay) for i, lay in enumerate(layouts)),
            replicas=(
                Replica("vit-0", "vit", "3g.40gb", "node/1", 0, ReplicaState.READY),
                Replica("vit-1", "vit", "3g.40gb", "node/1", 4, ReplicaState.READY),
                Replica("vit-2", "vit", "7g.80gb", "node/0", 0, state),
            ),
        )

    waiting = plan([m], {"vit": 780.0}, cluster(ReplicaState.STARTING))
    assert not [a for a in waiting.actions if a.kind in (ActionKind.DRAIN, ActionKind.DELETE)]
    assert Reason.HOLD_CONVERGING in waiting.reasons["vit"]
    assert_actions_are_safe(cluster(ReplicaState.STARTING), waiting, [m])
    ready = plan([m], {"vit": 780.0}, cluster(ReplicaState.READY))
    assert {a.replica for a in ready.actions if a.kind is ActionKind.DRAIN} == {"vit-0", "vit-1"}
    assert Reason.HOLD_CONVERGING not in ready.reasons["vit"]


def _two_sevens_and_an_empty_gpu() -> ClusterState:
    """Model ``m`` on a 7g replica on each of two GPUs, and a third GPU empty."""
    seven = (Placement(0, "7g.80gb"),)
    return ClusterState(
        gpus=(GpuState("node/0", "node", A100, seven), GpuState("node/1", "node", A100, seven),
              GpuState("node/2", "node", A100)),
        replicas=(Replica("m-0", "m", "7g.80gb", "node/0", 0, ReplicaState.READY),
                  Replica("m-1", "m", "7g.80gb", "node/1", 0, ReplicaState.READY)),
    )


def test_a_replacement_larger_than_the_churn_budget_waits_whole():
    # Two 7g replicas swapped for two 1g ones (14 slices -> 2): 2 creates + 2 deletes.
    # Under a budget of 2, starting the creates alone would leave 7g + 7g + 1g + 1g,
    # which the next tick scales down -- a just-created 1g with it -- and the tick
    # after starts the swap over. All or nothing: it waits for a budget that fits it.
    m = spec("m", {"1g.10gb": 10.0, "7g.80gb": 25.0}, max_replicas=2, high_availability=True)
    cl = _two_sevens_and_an_empty_gpu()
    held = plan([m], {"m": 0.0}, cl, churn_budget=2)
    assert held.actions == ()
    assert {Reason.PROFILE_EFFICIENCY, Reason.CHURN_BUDGET} <= set(held.reasons["m"])
    whole = plan([m], {"m": 0.0}, cl, churn_budget=4)
    assert sorted((a.kind, a.profile) for a in whole.actions if a.kind in (ActionKind.CREATE, ActionKind.DELETE)) \
        == [(ActionKind.CREATE, "1g.10gb")] * 2 + [(ActionKind.DELETE, "7g.80gb")] * 2
    assert_actions_are_safe(cl, whole, [m])


def test_a_short_model_grows_while_its_replacement_waits_for_the_churn_budget():
    # Two 7g replicas serve 50 of the 80 req/s asked; the fresh mix is eight 1g (8 slices
    # against 14 + 3), so the planner rebalances: 8 creates + 2 deletes, which a budget of 4
    # never admits. The growth must not wait with it: the 1g creates that need no delete
    # (on the empty GPU) go until what runs covers the demand, and the swap waits.
    m = spec("m", {"1g.10gb": 10.0, "7g.80gb": 25.0}, max_replicas=10)
    cl = _two_sevens_and_an_empty_gpu()
    whole = plan([m], {"m": 80.0}, cl)
    assert Reason.PROFILE_EFFICIENCY in whole.reasons["m"]  # the rebalance this is about
    assert [a.profile for a in whole.actions if a.kind is ActionKind.DELETE] == ["7g.80gb"] * 2
    p = plan([m], {"m": 80.0}, cl, churn_budget=4)
    creates = [a for a in p.actions if a.kind is ActionKind.CREATE]
    assert [(a.profile, a.gpu, a.reason) for a in creates] == [("1g.10gb", "node/2", Reason.SCALE_UP_DEMAND)] * 3
    assert not [a for a in p.actions if a.kind in (ActionKind.DRAIN, ActionKind.DELETE)]
    assert 50.0 + 10.0 * len(creates) >= 80.0
    assert {Reason.PROFILE_EFFICIENCY, Reason.CHURN_BUDGET} <= set(p.reasons["m"])
    assert_actions_are_safe(cl, p, [m])


def assert_actions_are_safe(cluster: ClusterState, p: Plan, models: list[ModelSpec]) -> None:
    """Replay the actions: a REPARTITION keeps every instance that still holds a replica,
    a CREATE lands on a free instance of the current layout, and each model's serving
    req/s never drops below min(before, after, target) (make-before-break). Serving
    means READY: a replica still starting counts after the plan, not before it."""
    caps = {m.name: m.capacity for m in models}

    def rps(r: Replica) -> float:
        return float(caps.get(r.model, {}).get(r.profile, 0.0))

    present = {r.id: r for r in cluster.replicas}
    layouts = {g.id: set(g.layout) for g in cluster.gpus}
    serving: dict[str, float] = {}
    ready = {r.id for r in cluster.replicas if r.state is ReplicaState.READY}
    for r in cluster.replicas:
        if r.id in ready:
            serving[r.model] = serving.get(r.model, 0.0) + rps(r)
    before = dict(serving)
    after: dict[str, float] = {}
    for a in p.assignments:
        after[a.model] = after.get(a.model, 0.0) + float(caps.get(a.model, {}).get(a.profile, 0.0))
    for act in p.actions:
        if act.kind is ActionKind.REPARTITION:
            new = set(act.layout or ())
            for r in present.values():
                if r.gpu == act.gpu:
                    assert r.profile != "whole" and Placement(r.start, r.profile) in new, \
                        f"repartition of {act.gpu} evicts {r.id}"
            layouts[act.gpu] = new
        elif act.kind is ActionKind.CREATE:
            if act.profile != "whole":
                assert Placement(act.start, act.profile) in layouts[act.gpu], "create on a missing instance"
                prof = get_product(cluster.gpu(act.gpu).product).profiles[act.profile]
                for r in present.values():
                    if r.gpu == act.gpu and r.profile != "whole":
                        other = get_product(cluster.gpu(r.gpu).product).profiles[r.profile]
                        assert act.start + prof.mem_slots <= r.start or r.start + other.mem_slots <= act.start, \
                            f"create {act.replica} overlaps {r.id}"
            present[act.replica] = Replica(act.replica, act.model, act.profile, act.gpu, act.start)
        elif act.kind is ActionKind.WAIT_READY:
            r = present[act.replica]
            serving[r.model] = serving.get(r.model, 0.0) + rps(r)
            ready.add(r.id)
        elif act.kind is ActionKind.DRAIN:
            r = present[act.replica]
            if r.id not in ready:
                continue
            serving[r.model] -= rps(r)
            floor = min(before.get(r.model, 0.0), after.get(r.model, 0.0), p.target_rps.get(r.model, 0.0))
            assert serving[r.model] >= floor - 1e-6, f"{r.model} drops to {serving[r.model]} < {floor}"
        elif act.kind is ActionKind.DELETE:
            present.pop(act.replica)


def test_failed_and_draining_replicas_are_not_capacity():
    cl = ClusterState(
        gpus=gpus(1, layout=(Placement(0, "1g.10gb"), Placement(1, "1g.10gb"))),
        replicas=(
            Replica("a-0", "a", "1g.10gb", "node/0", 0, ReplicaState.FAILED),
            Replica("a-1", "a", "1g.10gb", "node/0", 1, ReplicaState.DRAINING),
        ),
    )
    p = plan([spec("a")], {"a": 100}, cl)
    assert {a.replica for a in p.actions if a.kind is ActionKind.DELETE} == {"a-0", "a-1"}
    assert sum(1 for a in p.actions if a.kind is ActionKind.CREATE) == 1
    assert Reason.REPLACE_FAILED in p.reasons["a"]
    assert p.capacity_rps["a"] == 127


def test_crash_looping_replicas_are_replaced_at_once_whatever_the_churn_budget():
    # Three of seven replicas crash-loop on a full GPU. Deleting them stops nothing that
    # serves, and their replacements need only that room: none of it is churn, so a budget
    # of 1 replaces all three this call (it held two of the three deletes, and every create,
    # for later ticks).
    ones = tuple(Placement(i, "1g.10gb") for i in range(7))
    dead = {2, 4, 6}
    cl = ClusterState(gpus=gpus(1, layout=ones), replicas=tuple(
        Replica(f"a-{i}", "a", "1g.10gb", "node/0", i, ReplicaState.CRASHLOOP if i in dead else ReplicaState.READY)
        for i in range(7)))
    p = plan([spec("a", max_replicas=7)], {"a": 7 * 127 - 1}, cl, churn_budget=1)
    assert {x.replica for x in p.actions if x.kind is ActionKind.DELETE} == {f"a-{i}" for i in dead}
    assert sorted(x.start for x in p.actions if x.kind is ActionKind.CREATE) == sorted(dead)
    assert p.capacity_rps["a"] == 7 * 127 and Reason.CHURN_BUDGET not in p.reasons["a"]
    assert_actions_are_safe(cl, p, [spec("a", max_replicas=7)])


def test_the_instance_of_a_failed_replica_goes_to_one_new_replica_only():
    # b's only replica failed on node/0's 4g; a is short and could use that 4g too. The
    # fleet holds no second 4g, so the share rule gives it to b (one replica for every
    # model with demand before anyone's extra). The failed replica's instance must not
    # also count as empty: then b's replacement took it, opening the leaving replicas'
    # space listed it as empty again under b's, and a's top-up was placed over b's.
    ones = tuple(Placement(i, "1g.10gb") for i in range(7))
    cl = ClusterState(
        gpus=(GpuState("node/0", "node", A100, layout=(Placement(0, "4g.40gb"), Placement(4, "3g.40gb"))),
              GpuState("node/1", "node", A100, layout=ones)),
        replicas=(Replica("b-0", "b", "4g.40gb", "node/0", 0, ReplicaState.FAILED),
                  Replica("c-0", "c", "3g.40gb", "node/0", 4, ReplicaState.READY),
                  *(Replica(f"a-{i}", "a", "1g.10gb", "node/1", i, ReplicaState.READY) for i in range(7))),
    )
    a = spec("a", {"1g.10gb": 10.0, "4g.40gb": 40.0}, max_replicas=10)
    b = spec("b", {"4g.40gb": 40.0}, max_replicas=1)
    p = plan([a, b, spec("c", {"3g.40gb": 15.0})], {"a": 75.0, "b": 1.0, "c": 10.0}, cl)
    check_valid(cl, p)
    assert [x.model for x in p.assignments if (x.gpu, x.start) == ("node/0", 0)] == ["b"]
    assert p.capacity_rps["b"] == 40.0 and Reason.SHORTFALL not in p.reasons["b"]
    assert p.capacity_rps["a"] == 70.0 and Reason.SHORTFALL in p.reasons["a"]


def test_missing_demand_holds_current_replicas():
    cl = ClusterState(
        gpus=gpus(1, layout=(Placement(0, "1g.10gb"), Placement(1, "1g.10gb"))),
        replicas=(
            Replica("a-0", "a", "1g.10gb", "node/0", 0, ReplicaState.READY),
            Replica("a-1", "a", "1g.10gb", "node/0", 1, ReplicaState.READY),
        ),
    )
    p = plan([spec("a")], {}, cl)
    assert p.actions == ()
    assert Reason.HOLD_MISSING_METRICS in p.reasons["a"]


def test_removed_model_is_drained_and_deleted():
    cl = ClusterState(
        gpus=gpus(1, layout=(Placement(0, "1g.10gb"),)),
        replicas=(Replica("old-0", "old", "1g.10gb", "node/0", 0, ReplicaState.READY),),
    )
    p = plan([], {}, cl)
    assert kinds(p) == ["drain", "delete"]


# ---------------------------------------------------------------- churn budget


def test_churn_budget_caps_and_the_next_call_continues():
    # 15 x 1g of "a" across 3 GPUs (900 req/s) and demand down to 120: 13 replicas
    # go, far more than 2 deletes a call.
    g = gpus(3, layout=tuple(Placement(i, "1g.10gb") for i in range(7)))
    reps = tuple(Replica(f"a-{k}", "a", "1g.10gb", g[k % 3].id, k // 3, ReplicaState.READY) for k in range(15))
    cl = ClusterState(gpus=g, replicas=reps)
    m = spec("a", LINEAR, max_replicas=16)
    first = plan([m], {"a": 120}, cl, churn_budget=2)
    assert churn(first) == 2 and Reason.CHURN_BUDGET in first.reasons["a"]
    ticks = 0
    p = first
    while p.actions:
        assert churn(p) <= 2
        cl = apply_plan_to_cluster(cl, p)
        p = plan([m], {"a": 120}, cl, churn_budget=2)
        ticks += 1
        assert ticks < 20
    assert ticks > 1
    assert Reason.CHURN_BUDGET not in p.reasons["a"]
    assert 120 <= p.capacity_rps["a"] < 900


def test_a_scale_up_that_deletes_nothing_is_not_held_by_the_churn_budget():
    # 900 req/s at 60 per slice on three empty GPUs: every create is new capacity that
    # stops nothing, so a budget of 2 does not spread it over several calls.
    cl = ClusterState(gpus=gpus(3))
    m = spec("a", LINEAR, max_replicas=16)
    p = plan([m], {"a": 900}, cl, churn_budget=2)
    assert churn(p) > 2 and Reason.CHURN_BUDGET not in p.reasons["a"]
    after = apply_plan_to_cluster(cl, p)
    assert sum(m.capacity[r.profile] for r in after.replicas) >= 900
    assert_actions_are_safe(cl, p, [m])


# ---------------------------------------------------------------- shortfall priority


def test_shortfall_goes_to_lower_priority_first():
    cl = ClusterState(gpus=gpus(1))
    hi = spec("hi", LINEAR, priority=5, max_replicas=16)
    lo = spec("lo", LINEAR, priority=0, max_replicas=16)
    p = plan([hi, lo], {"hi": 300, "lo": 300}, cl)
    # One GPU = 7 slices x 60 = 420 req/s: "hi" gets its 300, "lo" its floor and the rest.
    assert "hi" not in p.shortfall
    assert p.shortfall["lo"] > 0
    assert Reason.SHORTFALL in p.reasons["lo"]
    assert any(a.model == "lo" for a in p.assignments)  # min replicas before extra capacity


def test_shortfall_floors_before_extra_capacity_within_a_priority():
    cl = ClusterState(gpus=gpus(1))
    a = spec("a", {"7g.80gb": 100, "1g.10gb": 10}, max_replicas=4)
    b = spec("b", {"1g.10gb": 10, "7g.80gb": 100}, max_replicas=4)
    p = plan([a, b], {"a": 1000, "b": 1000}, cl)
    assert {x.model for x in p.assignments} == {"a", "b"}


def test_shortfall_is_proportional_within_a_priority():
    cl = ClusterState(gpus=gpus(1))
    a = spec("a", {"1g.10gb": 10}, max_replicas=16, min_replicas=0)
    b = spec("b", {"1g.10gb": 10}, max_replicas=16, min_replicas=0)
    p = plan([a, b], {"a": 100, "b": 40}, cl)
    na = sum(1 for x in p.assignments if x.model == "a")
    nb = sum(1 for x in p.assignments if x.model == "b")
    assert na + nb == 7
    # 7 slices for 10 + 4 wanted: a gets ~5, b ~2 (fractions met 0.5 / 0.5).
    assert (na, nb) == (5, 2)


# ---------------------------------------------------------------- multinode


def rdma_gpus(nodes: int, per_node: int = 1, fabric: str = "ib-a", start: int = 0) -> tuple[GpuState, ...]:
    return tuple(GpuState(f"rdma-{n}/{i}", f"rdma-{n}", "H100-SXM5-80GB", mig_enabled=False, rdma=True,
                          fabric=fabric) for n in range(start, start + nodes) for i in range(per_node))


def llm(**kw) -> ModelSpec:
    kw.setdefault("max_replicas", 4)
    return ModelSpec("llm", {}, (), backend="multinode", nodes_per_group=2, gpus_per_node=1,
                     group_capacity_rps=10.0, min_replicas=0, **kw)


def test_multinode_group_is_all_or_nothing():
    cl = ClusterState(gpus=rdma_gpus(3))
    p = plan([llm()], {"llm": 25}, cl)
    # 25 req/s wants 3 groups of 2 GPUs; 3 GPUs hold only one group: never half a group.
    members = [a for a in p.assignments if a.model == "llm"]
    assert len(members) == 2 and all(a.profile == "whole" for a in members)
    assert len({a.gpu.split("/")[0] for a in members}) == 2  # two distinct nodes
    creates = [a for a in p.actions if a.kind is ActionKind.CREATE]
    assert len({group_of(a.replica) for a in creates}) == 1
    assert p.shortfall["llm"] == pytest.approx(15.0)
    after = apply_plan_to_cluster(cl, p)
    assert plan([llm()], {"llm": 25}, after).actions == ()


def test_multinode_prefers_one_fabric():
    cl = ClusterState(gpus=rdma_gpus(1, fabric="ib-a") + rdma_gpus(2, fabric="ib-b", start=1))
    p = plan([llm()], {"llm": 5}, cl)
    gpus_used = {a.gpu for a in p.assignments}
    fabrics = {g.fabric for g in cl.gpus if g.id in gpus_used}
    assert fabrics == {"ib-b"}


def test_multinode_takes_a_mig_gpu_only_after_switching_it_to_whole_mode():
    cl = ClusterState(gpus=tuple(GpuState(f"r{n}/0", f"r{n}", "H100-SXM5-80GB", layout=(Placement(0, "7g.80gb"),),
                                          rdma=True, fabric="f") for n in range(2)))
    p = plan([llm()], {"llm": 5}, cl)
    order = kinds(p)
    assert order[:2] == ["repartition", "repartition"]
    assert all(a.profile == "whole" and a.layout == () for a in p.actions if a.kind is ActionKind.REPARTITION)
    after = apply_plan_to_cluster(cl, p)
    assert all(not g.mig_enabled and g.reserved_by == "llm" for g in after.gpus)


def test_multinode_scale_down_removes_whole_groups():
    cl = ClusterState(gpus=rdma_gpus(4))
    cl = apply_plan_to_cluster(cl, plan([llm()], {"llm": 20}, cl))
    assert len(cl.replicas) == 4
    p = plan([llm()], {"llm": 5}, cl)
    deleted = [a.replica for a in p.actions if a.kind is ActionKind.DELETE]
    assert len(deleted) == 2 and len({group_of(r) for r in deleted}) == 1


def test_a_group_whose_gpu_a_new_replica_needs_goes_whole_or_waits():
    # The llm group scales to zero while model a needs two 3g on rdma-0/0, the GPU of one
    # member. Under a churn budget of 2 the group's delete takes both member GPUs, and a's
    # creates wait a tick: taking only the member in a's way would leave half a group
    # holding rdma-1/0 and serving nothing.
    cut = (Placement(0, "3g.40gb"), Placement(4, "3g.40gb"))
    pool = (dataclasses.replace(rdma_gpus(1)[0], mig_enabled=True, layout=cut),) + rdma_gpus(1, start=1)
    cl = ClusterState(gpus=pool, replicas=(Replica("llm-g0-0", "llm", "whole", "rdma-0/0", 0, ReplicaState.READY),
                                           Replica("llm-g0-1", "llm", "whole", "rdma-1/0", 0, ReplicaState.READY)))
    a = spec("a", {"3g.40gb": 30.0}, max_replicas=4)
    for budget in (2, 3, None):
        p = plan([llm(max_replicas=1), a], {"llm": 0.0, "a": 50.0}, cl, churn_budget=budget)
        deleted = {x.replica for x in p.actions if x.kind is ActionKind.DELETE}
        assert deleted == {"llm-g0-0", "llm-g0-1"}, (budget, deleted)
        created = [x for x in p.actions if x.kind is ActionKind.CREATE]
        assert len(created) == (0 if budget == 2 else 2), (budget, created)


# ---------------------------------------------------------------- idempotence & MILP


def test_plan_is_idempotent_after_apply():
    cl = ClusterState(gpus=gpus(4))
    models = [spec("a", high_availability=True), spec("b", LINEAR), spec("c", {"3g.40gb": 90, "7g.80gb": 200},
                                                                        memory_gb=30)]
    demand = {"a": 500, "b": 700, "c": 250}
    p = plan(models, demand, cl)
    check_valid(cl, p)
    after = apply_plan_to_cluster(cl, p)
    assert plan(models, demand, after).actions == ()


def test_milp_reference_on_known_instances():
    # Seven light models of one 1g each fit one GPU exactly.
    models = [spec(f"m{i}", max_replicas=4) for i in range(6)]
    r = solve(models, {m.name: 100 for m in models}, [A100] * 3)
    assert r.feasible and r.gpus_used == 1 and r.slices_used == 6
    # A 4g-only model three times: 4g has one start (slot 0), so three GPUs.
    four = [spec(f"f{i}", {"4g.40gb": 100}) for i in range(3)]
    r = solve(four, {m.name: 50 for m in four}, [A100] * 4)
    assert r.feasible and r.gpus_used == 3
    # Infeasible: more than the cluster has.
    r = solve([spec("x", {"7g.80gb": 10}, max_replicas=8)], {"x": 50}, [A100] * 2)
    assert not r.feasible
    # High availability forces a second GPU.
    r = solve([spec("h", high_availability=True)], {"h": 10}, [A100] * 2)
    assert r.feasible and r.gpus_used == 2


def test_heuristic_matches_milp_on_a_packing_trap():
    # 3g x2 + 2g x4 = 14 slices: 3g+2g+2g twice (2 GPUs); biggest-first pairs the
    # two 3g (6/7) and needs a third GPU for the last 2g.
    m3 = spec("m3", {"3g.40gb": 100}, min_replicas=0, max_replicas=8)
    m2 = spec("m2", {"2g.20gb": 100}, min_replicas=0, max_replicas=8)
    demand = {"m3": 200, "m2": 400}
    ref = solve([m3, m2], demand, [A100] * 3)
    p = plan([m3, m2], demand, ClusterState(gpus=gpus(3)))
    assert ref.gpus_used == 2 and p.cost.gpus_used == 2


def test_plan_cli_json(tmp_path):
    from typer.testing import CliRunner

    from autoscaler.cli import app

    root = __import__("pathlib").Path(__file__).resolve().parents[2] / "examples"
    res = CliRunner().invoke(app, ["plan", str(root / "models.yaml"), str(root / "cluster.yaml"),
                                   "--demand", str(root / "demand.yaml"), "--json"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.output)
    assert set(out) >= {"assignments", "layouts", "actions", "shortfall", "cost", "reasons"}
    assert out["cost"]["gpus_used"] >= 1
    bad = tmp_path / "d.yaml"
    bad.write_text("resnet: -5\n")
    res = CliRunner().invoke(app, ["plan", str(root / "models.yaml"), str(root / "cluster.yaml"),
                                   "--demand", str(bad)])
    assert res.exit_code == 2 and "resnet" in res.output and "-5" in res.output
    bad.write_text("nosuch: 5\n")
    res = CliRunner().invoke(app, ["plan", str(root / "models.yaml"), str(root / "cluster.yaml"),
                                   "--demand", str(bad)])
    assert res.exit_code == 2 and "nosuch" in res.output
    bad.write_text("- 1\n- 2\n")
    res = CliRunner().invoke(app, ["plan", str(root / "models.yaml"), str(root / "cluster.yaml"),
                                   "--demand", str(bad)])
    assert res.exit_code == 2 and "mapping" in res.output


def test_plan_cli_on_an_80_column_terminal_shows_every_action_whole():
    from typer.testing import CliRunner

    from autoscaler.cli import app

    root = __import__("pathlib").Path(__file__).resolve().parents[2] / "examples"
    args = ["plan", str(root / "models.yaml"), str(root / "cluster.yaml"), "--demand", str(root / "demand.yaml")]
    actions = json.loads(CliRunner().invoke(app, [*args, "--json"]).output)["actions"]
    res = CliRunner().invoke(app, args, env={"COLUMNS": "80"})
    assert res.exit_code == 0, res.output
    assert "…" not in res.output and max(len(line) for line in res.output.splitlines()) <= 80
    text = " ".join(res.output.split())
    assert {"repartition", "create", "wait_ready"} <= {a["kind"] for a in actions}
    for i, a in enumerate(actions, 1):
        assert f"{i} kind: {a['kind']} · reason: {a['reason']}" in text


def test_mig_replicas_never_land_on_a_gpu_held_by_a_group():
    # One MIG GPU plus a 2-GPU RDMA pool that the llm group takes whole: the
    # HA model's second replica has nowhere distinct to go but the group's GPUs.
    cl = ClusterState(gpus=gpus(1) + rdma_gpus(2))
    p = plan([llm(), spec("a", high_availability=True)], {"llm": 5, "a": 50}, cl)
    held = {a.gpu for a in p.assignments if a.profile == "whole"}
    assert held == {"rdma-0/0", "rdma-1/0"}
    assert all(a.gpu == "node/0" for a in p.assignments if a.model == "a")
    assert Reason.SHORTFALL in p.reasons["a"]
    check_valid(cl, p)
