"""Warm spare slices: learning how many to keep, and the planner carving them."""

from __future__ import annotations

import pytest

from autoscaler.mig import Placement, check_layout, get_product
from autoscaler.policy import spares as sp
from autoscaler.policy.planner import plan
from autoscaler.policy.planner.spare import keep_spares
from autoscaler.policy.types import (
    Action,
    ActionKind,
    ClusterState,
    GpuState,
    ModelSpec,
    Reason,
    RepartitionScope,
    Replica,
    ReplicaState,
)

A100 = "A100-SXM4-80GB"
H = 210.0  # reaction horizon: 180 s repartition + 30 s start


def create(gpu: str, profile: str, reason: Reason = Reason.SCALE_UP_DEMAND) -> Action:
    return Action(ActionKind.CREATE, reason, gpu=gpu, model="m", profile=profile, start=0)


def test_cold_creates_are_growth_creates_behind_a_repartition_of_their_gpu():
    acts = [Action(ActionKind.REPARTITION, Reason.REPARTITION, gpu="g0", layout=()),
            create("g0", "1g.10gb"), create("g0", "1g.10gb"), create("g0", "3g.40gb"),
            create("g1", "1g.10gb"),  # its GPU is not repartitioned: warm already
            create("g0", "2g.20gb", Reason.REPLACE_FAILED)]  # a replacement is not growth
    assert sp.cold_creates(acts) == {"1g.10gb": 2, "3g.40gb": 1}


def test_no_spares_until_enough_cold_creates_were_seen():
    s = sp.record(sp.SpareState(), 0.0, {"1g.10gb": 2})
    assert sp.wanted(s, 10.0, H) == {}  # 2 < min_events 3
    s = sp.record(s, 1000.0, {"1g.10gb": 1})
    assert sp.wanted(s, 1000.0, H) == {"1g.10gb": 2}  # buckets [2, 1]: 0.9 quantile 1.9 -> 2


def test_spares_follow_the_quantile_of_cold_creates_per_horizon_and_are_bounded():
    s = sp.SpareState()
    # five horizons with 1, 1, 1, 1, 1 cold creates of 2g and one with 6 of 1g
    for k in range(5):
        s = sp.record(s, k * 1000.0, {"2g.20gb": 1})
    assert sp.wanted(s, 4000.0, H) == {"2g.20gb": 1}
    s = sp.record(s, 5000.0, {"1g.10gb": 6})
    assert sp.wanted(s, 5000.0, H) == {"1g.10gb": 4}  # quantile 3.5 of [1,1,1,1,1,6] -> 4
    assert sp.wanted(s, 5000.0, H, sp.SpareConfig(max_spares=2)) == {"1g.10gb": 2}  # bounded
    assert sp.wanted(s, 5000.0, H, sp.SpareConfig(max_spares=0)) == {}


def test_old_cold_creates_leave_the_window():
    cfg = sp.SpareConfig(window_s=3600.0)
    s = sp.record(sp.SpareState(), 0.0, {"1g.10gb": 3}, cfg)
    assert sp.wanted(s, 100.0, H, cfg) == {"1g.10gb": 3}
    s = sp.record(s, 4000.0, {}, cfg)
    assert s.events == () and sp.wanted(s, 4000.0, H, cfg) == {}


def test_spare_config_rejects_nonsense():
    with pytest.raises(ValueError, match="max_spares"):
        sp.SpareConfig(max_spares=-1)
    with pytest.raises(ValueError, match="quantile"):
        sp.SpareConfig(quantile=0.0)


def _calm_cluster() -> tuple[ClusterState, ModelSpec]:
    # g0 holds one 3g replica and nothing else; g1 is empty
    g0 = GpuState("g0", "n", A100, layout=(Placement(0, "3g.40gb"),))
    g1 = GpuState("g1", "n", A100)
    rep = Replica("r0", "m", "3g.40gb", "g0", 0, ReplicaState.READY, 0.0)
    spec = ModelSpec(name="m", capacity={"1g.10gb": 60, "3g.40gb": 180}, allowed_profiles=("1g.10gb", "3g.40gb"),
                     min_replicas=1, max_replicas=8)
    return ClusterState((g0, g1), (rep,)), spec


def test_the_planner_carves_a_spare_on_a_gpu_in_use_on_a_calm_tick():
    cl, spec = _calm_cluster()
    p = plan([spec], {"m": 150}, cl, spares={"1g.10gb": 1})
    carve = [a for a in p.actions if a.reason is Reason.WARM_SPARE]
    assert len(carve) == 1 and carve[0].kind is ActionKind.REPARTITION and carve[0].gpu == "g0"
    new = set(carve[0].layout) - set(cl.gpus[0].layout)
    assert [pl.profile for pl in new] == ["1g.10gb"]
    assert set(cl.gpus[0].layout) <= set(carve[0].layout)  # nothing running is touched
    assert not check_layout(get_product(A100), list(carve[0].layout))
    assert not p.layouts.get("g1")  # never an empty GPU
    assert not any(a.kind is ActionKind.CREATE for a in p.actions)


def test_no_spare_is_carved_when_one_exists_or_the_tick_is_not_calm():
    cl, spec = _calm_cluster()
    g0 = GpuState("g0", "n", A100, layout=(Placement(0, "3g.40gb"), Placement(6, "1g.10gb")))
    have = ClusterState((g0, cl.gpus[1]), cl.replicas)
    assert not any(a.reason is Reason.WARM_SPARE for a in plan([spec], {"m": 150}, have,
                                                                spares={"1g.10gb": 1}).actions)
    # demand beyond the replica: the plan creates, so no spare this tick
    busy = plan([spec], {"m": 400}, cl, spares={"1g.10gb": 1})
    assert any(a.kind is ActionKind.CREATE for a in busy.actions)
    assert not any(a.reason is Reason.WARM_SPARE for a in busy.actions)
    # a GPU with work in flight is left alone
    frozen = ClusterState((GpuState("g0", "n", A100, layout=cl.gpus[0].layout, busy=True), cl.gpus[1]),
                          cl.replicas)
    assert keep_spares(plan([spec], {"m": 150}, frozen), frozen, {"1g.10gb": 1}).actions == \
        plan([spec], {"m": 150}, frozen).actions


def test_where_a_repartition_drains_the_node_no_spare_is_carved():
    cl, spec = _calm_cluster()
    node = RepartitionScope.NODE
    # calm tick: a spare of its own would evict the node's replicas
    assert plan([spec], {"m": 150}, cl, spares={"1g.10gb": 1}, repartition_scope=node).actions == ()
    assert any(a.reason is Reason.WARM_SPARE for a in plan([spec], {"m": 150}, cl, spares={"1g.10gb": 1}).actions)
    # a cut the plan makes anyway is left exactly as planned
    assert plan([spec], {"m": 250}, cl, spares={"1g.10gb": 1}, repartition_scope=node) == plan([spec], {"m": 250}, cl)
