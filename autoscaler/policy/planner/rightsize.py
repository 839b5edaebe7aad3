"""Planner step 1b: right-size a model whose replicas are bigger than its demand needs.

Pure; used by ``planner._size_model`` after scale-down. Scale-down removes
whole replicas, so a model's last replica (or one whose removal would leave too
little) kept its burst-time profile for good: a 7g replica serving 150 req/s
that a 2g serves. ``decide`` asks for the highest req/s required over
``rightsize_window_s`` while the replica count holds; here one oversized
replica per tick is swapped for the smallest profile that still covers that,
on an empty MIG instance that exists now (no repartition: the swap costs a pod
start, make-before-break).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from autoscaler.mig.layout import Placement
from autoscaler.policy.planner.multinode import WHOLE
from autoscaler.policy.planner.packing import GpuWork, overlaps
from autoscaler.policy.planner.sizing import EPS
from autoscaler.policy.types import ClusterState, Reason, Replica, ReplicaState

if TYPE_CHECKING:  # pragma: no cover
    from autoscaler.policy.planner.work import ModelWork


def free_profiles(cluster: ClusterState, by_id: dict[str, GpuWork]) -> frozenset[str]:
    """Profiles with at least one empty MIG instance, as cut now, on a GPU open to new work."""
    taken: dict[str, list[Placement]] = {}
    for r in cluster.replicas:
        if r.profile != WHOLE:
            taken.setdefault(r.gpu, []).append(Placement(r.start, r.profile))
    out: set[str] = set()
    every = {name for product in {g.product for g in by_id.values()} for name in product.profiles}
    for g in by_id.values():
        if g.frozen or g.rdma:
            continue
        if len(out) == len(every):
            break  # every profile there is has an empty instance: no GPU can add one
        if g.id not in taken:  # nothing running: every instance as cut is empty
            out.update(p.profile for p in g.current if p.profile in g.product.profiles)
            continue
        for p in g.current:
            if p.profile in g.product.profiles and not any(
                    o.profile in g.product.profiles and overlaps(g.product, p, o) for o in taken.get(g.id, ())):
                out.add(p.profile)
    return frozenset(out)


# A replica is swapped for a smaller one only when that frees at least this many
# compute slices: 1 slice is within the noise of the next burst, 2+ is a real saving.
DOWNSIZE_MIN_SLICES = 2


def downsize(m: ModelWork, keep: list[Replica], cap: float, demand: float,
              removed: dict[str, Reason], free_now: frozenset[str] | None = None) -> dict[str, int]:
    """Right-size after a burst: swap an oversized READY replica for the smallest profile that
    still covers demand and has an empty instance now (make-before-break: the new one is
    created first; no repartition, so the swap costs a start delay, not minutes).

    Scale-down removes whole replicas, so a model's last replica (or one whose
    removal would leave too little) keeps its burst-time profile forever: a
    7g replica serving 150 req/s that a 2g would serve. One swap per tick, the
    biggest saving first; the wholesale rebalance below still handles mixes.
    """
    comp = {o.name: o.compute for o in m.options}
    best: tuple[int, Replica, str] | None = None
    for r in keep:
        if r.state is not ReplicaState.READY or r.profile not in comp:
            continue
        rest = cap - m.cap[r.profile]
        fits = [o for o in m.options if rest + o.cap >= demand - EPS and o.compute <= comp[r.profile] - DOWNSIZE_MIN_SLICES
                and (free_now is None or o.name in free_now)]
        if not fits:
            continue
        q = min(fits, key=lambda o: (o.compute, -o.cap))
        saving = comp[r.profile] - q.compute
        if best is None or saving > best[0]:
            best = (saving, r, q.name)
    if best is None:
        return {}
    _, r, prof = best
    keep.remove(r)
    removed[r.id] = Reason.PROFILE_EFFICIENCY
    m.why(Reason.PROFILE_EFFICIENCY)
    m.create_reason = Reason.PROFILE_EFFICIENCY
    return {prof: 1}
