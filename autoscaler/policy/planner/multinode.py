"""Planner step 1b: multinode models on whole RDMA GPUs, all or nothing per group.

Pure; used by ``planner.plan`` before new MIG replicas are placed. A group of
``nodes_per_group * gpus_per_node`` GPUs (``gpus_per_node`` on each of
``nodes_per_group`` distinct nodes, one fabric preferred) is one replica of
the model and serves ``group_capacity_rps``. Each member GPU carries a
``Replica`` / assignment with profile ``"whole"`` and start 0; member ids are
``"<group>-<i>"`` with group id ``"<model>-g<k>"`` (``group_of`` recovers it).
A GPU is switched to whole-GPU mode by ``REPARTITION`` with
``profile="whole"`` and ``layout=()``. Groups scale by whole groups:
``ceil(demand / group_capacity_rps)``, within min/max replicas.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from autoscaler.mig.layout import Placement
from autoscaler.policy.planner.work import HEALTHY
from autoscaler.policy.types import ClusterState, ModelSpec, Reason, Replica, ReplicaState

if TYPE_CHECKING:  # pragma: no cover
    from autoscaler.policy.planner.packing import GpuWork

WHOLE = "whole"


def group_of(replica_id: str) -> str:
    """The group id of a multinode member replica (``"llm-g0-1"`` -> ``"llm-g0"``)."""
    return replica_id.rsplit("-", 1)[0]


class Groups:
    def __init__(self) -> None:
        self.kept: dict[str, list[str]] = {}  # model -> group ids
        self.new: list[tuple[str, str, list[str]]] = []  # (model, group id, member gpu ids)
        self.reasons: dict[str, list[Reason]] = {}
        self.target: dict[str, int] = {}  # model -> groups wanted
        self.gcap: dict[str, float] = {}


def plan_multinode(models: Sequence[ModelSpec], demand_rps: Mapping[str, float], cluster: ClusterState,
                   gpus: list[GpuWork], by_id: dict[str, GpuWork], removed: dict[str, Reason]) -> Groups:
    out = Groups()
    used_ids = {r.id for r in cluster.replicas}
    for spec in sorted(models, key=lambda s: (-s.priority, s.name)):
        why = out.reasons.setdefault(spec.name, [])
        size = max(1, spec.nodes_per_group) * max(1, spec.gpus_per_node)
        gcap = float(spec.group_capacity_rps or 0.0)
        out.gcap[spec.name] = gcap
        members: dict[str, list[Replica]] = {}
        for r in cluster.replicas:
            if r.model == spec.name:
                members.setdefault(group_of(r.id), []).append(r)
        healthy: list[str] = []
        for gid, reps in sorted(members.items()):
            ok = len(reps) == size and all(r.state in HEALTHY and r.gpu in by_id for r in reps)
            if ok:
                healthy.append(gid)
            else:
                for r in reps:
                    removed[r.id] = Reason.REPLACE_FAILED
                why.append(Reason.REPLACE_FAILED)
        d = demand_rps.get(spec.name)
        floor = min(max(spec.min_replicas, 2 if spec.high_availability else 0), spec.max_replicas)
        if d is None:
            want = max(len(healthy), floor)
            why.append(Reason.HOLD_MISSING_METRICS)
        elif gcap <= 0:
            want = floor
        else:
            want = max(floor, math.ceil(max(0.0, float(d)) / gcap - 1e-9))
        if want > spec.max_replicas:
            want = spec.max_replicas
            why.append(Reason.MAX_REPLICAS)
        out.target[spec.name] = want
        # READY groups first, then ids: scale-down removes the newest.
        healthy.sort(key=lambda gid: (not all(r.state is ReplicaState.READY for r in members[gid]), gid))
        keep, drop = healthy[:want], healthy[want:]
        for gid in drop:
            for r in members[gid]:
                removed[r.id] = Reason.SCALE_DOWN_DEMAND
            why.append(Reason.SCALE_DOWN_DEMAND)
        out.kept[spec.name] = keep
        for gid in keep:
            for r in members[gid]:
                w = by_id[r.gpu]
                w.whole = spec.name
                w.hard = {}
                w.soft = set()
        for gid, reps in members.items():
            if gid in keep:
                continue
            for r in reps:
                w = by_id.get(r.gpu)
                if w is not None and w.whole is None:
                    # Still serving until deleted: nothing new may use it yet.
                    w.block(Placement(0, w.product.full.name))
        k = 0
        for _ in range(want - len(keep)):
            chosen = _pick_group(spec, gpus)
            if chosen is None:
                why.append(Reason.SHORTFALL)
                break
            while f"{spec.name}-g{k}-0" in used_ids or any(f"{spec.name}-g{k}" == g for g in members):
                k += 1
            gid = f"{spec.name}-g{k}"
            k += 1
            for w in chosen:
                w.whole = spec.name
                w.soft = set()
            out.new.append((spec.name, gid, [w.id for w in chosen]))
            if Reason.SCALE_UP_DEMAND not in why:
                why.append(Reason.SCALE_UP_DEMAND)
    return out


def _pick_group(spec: ModelSpec, gpus: list[GpuWork]) -> list[GpuWork] | None:
    """nodes_per_group distinct nodes x gpus_per_node free RDMA GPUs, one fabric if possible."""
    free = [w for w in gpus if w.rdma and not w.hard and not w.blocked and w.whole is None]
    npg, gpn = max(1, spec.nodes_per_group), max(1, spec.gpus_per_node)
    fabrics: dict[str | None, int] = {}
    for w in free:
        fabrics[w.fabric] = fabrics.get(w.fabric, 0) + 1
    order = sorted(fabrics, key=lambda f: (f != spec.fabric, -fabrics[f], str(f)))
    for fab in [*order, "*any*"]:
        pool = [w for w in free if fab == "*any*" or w.fabric == fab]
        by_node: dict[str, list[GpuWork]] = {}
        for w in pool:
            by_node.setdefault(w.node, []).append(w)
        # Fullest-fit nodes first keeps whole nodes free for bigger groups.
        nodes = sorted((n for n, ws in by_node.items() if len(ws) >= gpn), key=lambda n: (len(by_node[n]), n))
        if len(nodes) >= npg:
            return [w for n in nodes[:npg] for w in sorted(by_node[n], key=lambda w: w.order)[:gpn]]
    return None
