"""Synthetic ticks for the API: a small demo cluster and a large benchmark one.

Not part of the control loop. Tests, ``benchmarks/metrics_api.py`` and the
browser tests feed an :class:`~autoscaler.api.state.ApiState` from here when
no real controller runs. Everything is built from the shared contract types,
so what the API serves is exactly what it would serve for a real tick.
"""

from __future__ import annotations

from autoscaler.mig.layout import Placement
from autoscaler.policy.types import (
    Action,
    ActionKind,
    Assignment,
    ClusterState,
    Cost,
    GpuState,
    ModelSignals,
    ModelSpec,
    Observation,
    Plan,
    Reason,
    Replica,
    ReplicaSignals,
    ReplicaState,
)

A100 = "A100-SXM4-80GB"


def demo_models() -> list[ModelSpec]:
    return [
        ModelSpec("resnet", {"1g.10gb": 120.0, "2g.20gb": 200.0, "3g.40gb": 290.0},
                  ("1g.10gb", "2g.20gb", "3g.40gb"), min_replicas=1, max_replicas=8),
        ModelSpec("bert", {"2g.20gb": 80.0, "3g.40gb": 130.0}, ("2g.20gb", "3g.40gb"),
                  min_replicas=1, max_replicas=6),
    ]


def demo_tick(
    t_s: float, *, extra_replica: bool = False, load: float = 1.0
) -> tuple[Observation, Plan, ClusterState]:
    """Two A100s, two models. ``extra_replica`` adds a resnet 1g.10gb on gpu 1 (a scale-up).

    ``load`` scales request rates and p99 (history for sparklines); 1.0 is the reference tick.
    """
    g0 = GpuState("node-a/0", "node-a", A100,
                  (Placement(0, "3g.40gb"), Placement(4, "2g.20gb"), Placement(6, "1g.10gb")))
    g1 = GpuState("node-a/1", "node-a", A100,
                  (Placement(0, "3g.40gb"), Placement(4, "3g.40gb")))
    replicas = [
        Replica("resnet-0", "resnet", "1g.10gb", "node-a/0", 6, ReplicaState.READY, t_s - 300),
        Replica("resnet-1", "resnet", "2g.20gb", "node-a/0", 4, ReplicaState.READY, t_s - 300),
        Replica("bert-0", "bert", "3g.40gb", "node-a/0", 0, ReplicaState.READY, t_s - 300),
        Replica("bert-1", "bert", "3g.40gb", "node-a/1", 0, ReplicaState.DRAINING, t_s - 5),
    ]
    planned_g1 = (Placement(0, "3g.40gb"), Placement(4, "2g.20gb"), Placement(6, "1g.10gb"))
    desired = {("resnet", "1g.10gb"): 2, ("resnet", "2g.20gb"): 1, ("bert", "3g.40gb"): 1}
    if extra_replica:
        g1 = GpuState(g1.id, g1.node, g1.product, planned_g1)
        replicas[3] = Replica("bert-1", "bert", "3g.40gb", "node-a/1", 0, ReplicaState.READY, t_s - 300)
        replicas.append(Replica("resnet-2", "resnet", "1g.10gb", "node-a/1", 6, ReplicaState.STARTING, t_s))
        desired = {("resnet", "1g.10gb"): 2, ("resnet", "2g.20gb"): 1, ("bert", "3g.40gb"): 2}
    cluster = ClusterState((g0, g1), tuple(replicas))
    obs = Observation(
        t_s,
        cluster,
        {
            "resnet": ModelSignals("resnet", t_s, request_rate=(310.0 if extra_replica else 240.0) * load,
                                   queue_compute_ratio=0.35, p99_ms=(41.0 if extra_replica else 28.0) * load,
                                   ready_replicas=2),
            "bert": ModelSignals("bert", t_s, request_rate=95.0 * load, queue_compute_ratio=1.8,
                                 p99_ms=182.0 * min(load, 1.0), ready_replicas=1),
        },
        {
            "resnet-0": ReplicaSignals("resnet-0", "resnet", t_s, busy_fraction=0.72),
            "resnet-1": ReplicaSignals("resnet-1", "resnet", t_s, busy_fraction=0.55, gr_engine_active=0.6),
            "bert-0": ReplicaSignals("bert-0", "bert", t_s, busy_fraction=0.93),
        },
    )
    plan = Plan(
        t_s=t_s,
        desired=desired,
        assignments=(
            Assignment("resnet", "1g.10gb", "node-a/0", 6, "resnet-0"),
            Assignment("resnet", "1g.10gb", "node-a/1", 6, "resnet-2" if extra_replica else None),
            Assignment("resnet", "2g.20gb", "node-a/0", 4, "resnet-1"),
            Assignment("bert", "3g.40gb", "node-a/0", 0, "bert-0"),
        ),
        layouts={"node-a/0": g0.layout, "node-a/1": planned_g1},
        actions=() if extra_replica else (
            Action(ActionKind.DRAIN, Reason.REPARTITION, gpu="node-a/1", model="bert", replica="bert-1"),
            Action(ActionKind.REPARTITION, Reason.REPARTITION, gpu="node-a/1", layout=planned_g1),
            Action(ActionKind.CREATE, Reason.SCALE_UP_DEMAND, gpu="node-a/1", model="resnet",
                   profile="1g.10gb", start=6),
        ),
        shortfall={"resnet": 0.0, "bert": 0.0},
        cost=Cost(gpus_used=2, slices_used=7, instances_created=1, gpus_repartitioned=1),
        reasons={"resnet": (Reason.SCALE_UP_DEMAND,), "bert": (Reason.REPARTITION, Reason.KEEP)},
        capacity_rps={"resnet": 440.0, "bert": 130.0},
        target_rps={"resnet": 288.0, "bert": 114.0},
    )
    return obs, plan, cluster


def large_tick(t_s: float, deployments: int = 1000, pods_per: int = 5) -> tuple[
    Observation, Plan, ClusterState, list[ModelSpec]
]:
    """``deployments`` (model, profile) pairs with ``pods_per`` pods each, on emulated 1g slices."""
    models: list[ModelSpec] = []
    replicas: list[Replica] = []
    gpus: list[GpuState] = []
    desired: dict[tuple[str, str], int] = {}
    signals: dict[str, ModelSignals] = {}
    slot = 0
    for i in range(deployments):
        name = f"m{i:04d}"
        models.append(ModelSpec(name, {"1g.10gb": 100.0}, ("1g.10gb",), max_replicas=64))
        for k in range(pods_per):
            if slot % 7 == 0:
                gid = f"node-{slot // 56}/{(slot // 7) % 8}"
                gpus.append(GpuState(gid, f"node-{slot // 56}", A100,
                                     tuple(Placement(s, "1g.10gb") for s in range(7))))
            replicas.append(Replica(f"{name}-{k}", name, "1g.10gb", gpus[-1].id, slot % 7, ReplicaState.READY))
            slot += 1
        desired[(name, "1g.10gb")] = pods_per + (i % 3) - 1
        signals[name] = ModelSignals(name, t_s, request_rate=50.0 * pods_per, queue_compute_ratio=0.5 + i % 5 / 10)
    cluster = ClusterState(tuple(gpus), tuple(replicas))
    obs = Observation(t_s, cluster, signals)
    plan = Plan(t_s, desired, (), {}, (), {}, Cost(), {m.name: (Reason.KEEP,) for m in models})
    return obs, plan, cluster, models
