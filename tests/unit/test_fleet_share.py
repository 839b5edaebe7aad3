"""Full-fleet sharing: when demand exceeds the fleet, no model is starved to zero."""

from __future__ import annotations

from autoscaler.policy.planner import plan
from autoscaler.policy.types import ClusterState, GpuState, ModelSpec, Reason

A100 = "A100-SXM4-80GB"
LINEAR = {"1g.10gb": 60, "2g.20gb": 120, "3g.40gb": 180, "4g.40gb": 240, "7g.80gb": 420}


def gpus(n: int) -> tuple[GpuState, ...]:
    return tuple(GpuState(id=f"g{i}", node="node", product=A100) for i in range(n))


def spec(name: str, **kw) -> ModelSpec:
    kw.setdefault("allowed_profiles", tuple(LINEAR))
    return ModelSpec(name=name, capacity=dict(LINEAR), **kw)


def count(p, model: str) -> int:
    return sum(1 for a in p.assignments if a.model == model)


def test_a_full_fleet_keeps_one_replica_for_a_low_priority_model_and_says_so():
    # One GPU (7 slices, 420 req/s) against 1,000 req/s of a priority-5 model: its
    # extra capacity alone would take every slice, leaving the priority-0 model
    # (no min_replicas floor) with nothing while it has 40 req/s to serve.
    hi = spec("hi", priority=5, min_replicas=0, max_replicas=16)
    lo = spec("lo", priority=0, min_replicas=0, max_replicas=16)
    p = plan([hi, lo], {"hi": 1000, "lo": 40}, ClusterState(gpus=gpus(1)))
    assert count(p, "lo") == 1
    assert Reason.FLEET_SHARE_MIN in p.reasons["lo"]
    assert count(p, "hi") >= 1 and Reason.SHORTFALL in p.reasons["hi"]
    # the rest of the GPU still goes to the higher priority
    slices = {a.model: 0 for a in p.assignments}
    for a in p.assignments:
        slices[a.model] += int(a.profile[0])
    assert slices["hi"] == 6 and slices["lo"] == 1


def test_a_model_without_demand_or_floor_is_not_given_a_share():
    hi = spec("hi", priority=5, min_replicas=0, max_replicas=16)
    idle = spec("idle", priority=0, min_replicas=0, max_replicas=16)
    p = plan([hi, idle], {"hi": 1000, "idle": 0}, ClusterState(gpus=gpus(1)))
    assert count(p, "idle") == 0
    assert Reason.FLEET_SHARE_MIN not in p.reasons["idle"]


def test_a_fleet_that_fits_everything_says_nothing_about_sharing():
    a = spec("a", priority=5, min_replicas=0, max_replicas=16)
    b = spec("b", priority=0, min_replicas=0, max_replicas=16)
    p = plan([a, b], {"a": 200, "b": 40}, ClusterState(gpus=gpus(2)))
    assert not p.shortfall
    assert all(Reason.FLEET_SHARE_MIN not in rs for rs in p.reasons.values())
