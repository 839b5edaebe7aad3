"""How much a model runs now, read off the cluster snapshot (pure; zero I/O).

Each tick ``decide`` turns the live replicas of a model into a count and the req/s
they serve at the SLO, against the model's capacity table; the simulator's
windowed baselines and its driver read the same numbers; ``failed_replicas``
names the replicas the planner must replace.
"""

from __future__ import annotations

from collections.abc import Container, Iterable, Sequence
from typing import Any

from autoscaler.policy.planner.multinode import group_of
from autoscaler.policy.types import LIVE, ClusterState, ModelSpec, ReplicaState


def replica_capacity(spec: ModelSpec, profile: str) -> float | None:
    """req/s one replica of ``spec`` sustains on ``profile`` at the SLO (None: unknown)."""
    if profile in spec.capacity:
        return float(spec.capacity[profile])
    if spec.backend == "multinode" and spec.group_capacity_rps:
        return float(spec.group_capacity_rps)
    return None


def best_replica_capacity(spec: ModelSpec) -> float | None:
    caps = [c for p in spec.allowed_profiles if (c := replica_capacity(spec, p))]
    if spec.backend == "multinode" and spec.group_capacity_rps:
        caps.append(float(spec.group_capacity_rps))
    return max(caps) if caps else None


def current_capacity(spec: ModelSpec, cluster: ClusterState) -> tuple[int, float, bool]:
    """(live replicas, their req/s, every replica's capacity known?).

    A multinode model counts groups, not members: the snapshot lists one
    replica per member GPU (``llm-g0-0``, ``llm-g0-1``), but the group of two
    is one replica of ``group_capacity_rps`` -- counting members would read
    2 replicas against max_replicas 1 and ask to scale down every tick.
    """
    return _counted(spec, cluster.replicas, LIVE)


def _counted(spec: ModelSpec, replicas: Iterable[Any], states: Container[ReplicaState]) -> tuple[int, float, bool]:
    n, cap, known = 0, 0.0, True
    seen_groups: set[str] = set()
    for r in replicas:
        if r.model == spec.name and r.state in states:
            if spec.backend == "multinode":
                group = group_of(r.id)
                if group in seen_groups:
                    continue
                seen_groups.add(group)
            n += 1
            c = replica_capacity(spec, r.profile)
            if c is None:
                known = False
            else:
                cap += c
    return n, cap, known


def ready_capacity(specs: Iterable[ModelSpec], replicas: Sequence[Any]) -> dict[str, float]:
    """Per model, the req/s its READY replicas serve at the SLO (starting ones serve
    nothing yet): what the run loop's burst check compares arrivals with between
    ticks. ``replicas``: anything with ``id``, ``model``, ``profile`` and ``state``
    (the snapshot's, or the local cluster's own records). Models with none are absent."""
    ready: dict[str, list[Any]] = {}  # one pass over the replicas, not one per model
    for r in replicas:
        if r.state is ReplicaState.READY:
            ready.setdefault(r.model, []).append(r)
    out: dict[str, float] = {}
    for spec in specs:
        if spec.name in ready:
            out[spec.name] = _counted(spec, ready[spec.name], (ReplicaState.READY,))[1]
    return out


def by_model(cluster: ClusterState) -> dict[str, ClusterState]:
    """Each model's replicas as a cluster of their own (one pass per tick, not one per model)."""
    out: dict[str, list] = {}
    for r in cluster.replicas:
        out.setdefault(r.model, []).append(r)
    return {m: ClusterState(cluster.gpus, tuple(rs)) for m, rs in out.items()}


def failed_replicas(cluster: ClusterState) -> frozenset[str]:
    """Replicas neither starting, ready nor draining: failed, the planner's to replace."""
    return frozenset(r.id for r in cluster.replicas if r.state not in LIVE and r.state is not ReplicaState.DRAINING)
