"""The planner leaves a busy GPU (``GpuState.busy``: work still in flight there) exactly as it is."""

from __future__ import annotations

from autoscaler.mig import Placement
from autoscaler.policy.planner import plan
from autoscaler.policy.types import ActionKind, ClusterState, GpuState, ModelSpec, Replica, ReplicaState

SPEC = ModelSpec("m", {"1g.10gb": 100.0, "3g.40gb": 300.0}, ("1g.10gb", "3g.40gb"), min_replicas=1,
                 max_replicas=16)
PRODUCT = "A100-SXM4-80GB"
SEVEN_1G = tuple(Placement(i, "1g.10gb") for i in range(7))


def cluster(busy: bool) -> ClusterState:
    # g0 already hosts one replica and has six free 1g instances: the cheapest
    # place for more (no repartition) -- unless a repartition is running there
    g0 = GpuState("g0", "n", PRODUCT, layout=SEVEN_1G, busy=busy)
    g1 = GpuState("g1", "n", PRODUCT, layout=SEVEN_1G)
    return ClusterState((g0, g1), (Replica("m-0", "m", "1g.10gb", "g0", 0, ReplicaState.READY),))


def touched(p) -> set[str]:
    return {a.gpu for a in p.actions if a.kind in (ActionKind.CREATE, ActionKind.REPARTITION)}


def test_free_gpu_is_used_when_not_busy():
    p = plan([SPEC], {"m": 300.0}, cluster(busy=False))
    assert "g0" in touched(p)


def test_busy_gpu_gets_no_new_replica_and_no_layout_change():
    p = plan([SPEC], {"m": 300.0}, cluster(busy=True))
    assert p.actions, "the demand is still met elsewhere"
    assert "g0" not in touched(p)
    assert tuple(sorted(p.layouts["g0"])) == SEVEN_1G
    assert sum(p.capacity_rps.values()) >= 300.0
    # the replica that runs there is kept
    assert any(a.replica == "m-0" for a in p.assignments)
