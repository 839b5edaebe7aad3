"""Planner step 6: keep warm spare instances carved (pure).

Place in the loop: after ``plan`` has chosen its best candidate, ``keep_spares``
adds empty instances of the profiles ``decide`` asks for (``policy/spares.py``
learns how many) to GPUs that already host a replica. Each is one
REPARTITION that keeps every existing instance (make-before-break holds: no
instance goes, so no replica is touched) and adds the empty one in free space.

Only on a calm tick: the plan creates nothing and nothing is short, and the
GPU's layout is not changing and nothing is in flight on it -- a spare is
carved while nobody waits, never in front of an urgent action. Never on an
empty GPU: a spare must not hold a GPU that would otherwise be free, so it adds
slices, not GPU-hours. Worked number: a GPU cut 3g+2g+1g (6 of 7 slices) for
its replicas, asked for one 1g spare, gets 1g@6 carved: the next scale-up of a
model with a 1g profile starts there in a replica start (30 s), not after a
180 s repartition.

That holds where a repartition touches one GPU's free space
(``RepartitionScope.GPU``). Where it drains the whole node
(``RepartitionScope.NODE``: mig-manager on Kubernetes) a spare of its own
would evict every replica of the node, so none is carved there. (Adding
spares to the cuts the plan makes anyway was tried: in the 8,000-GPU
Kubernetes benchmark the warm-up then settled in one run of two, the run
without in 90 ticks; no benefit of spares was measured on Kubernetes.)
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

from autoscaler.mig.layout import Placement
from autoscaler.mig.products import PRODUCTS
from autoscaler.policy.planner.packing import fit
from autoscaler.policy.types import Action, ActionKind, ClusterState, Plan, Reason, RepartitionScope


def keep_spares(plan: Plan, cluster: ClusterState, spares: Mapping[str, int],
                scope: RepartitionScope = RepartitionScope.GPU) -> Plan:
    """``plan`` plus the REPARTITIONs that carve the missing spares (``plan`` itself when
    nothing is missing, the tick is not calm, or a repartition drains the node)."""
    want = {p: n for p, n in spares.items() if n > 0}
    if scope is not RepartitionScope.GPU or not want or plan.shortfall \
            or any(a.kind is ActionKind.CREATE for a in plan.actions):
        return plan
    used = {a.gpu for a in plan.assignments}
    hosted = {(a.gpu, a.start) for a in plan.assignments}
    repart = {a.gpu for a in plan.actions if a.kind is ActionKind.REPARTITION}
    have: dict[str, int] = {}
    for gid, layout in plan.layouts.items():
        if gid in used:
            for pl in layout:
                if (gid, pl.start) not in hosted:
                    have[pl.profile] = have.get(pl.profile, 0) + 1
    layouts = dict(plan.layouts)
    added: list[Action] = []
    for g in cluster.gpus:  # fullest first would pack tighter; cluster order keeps it stable
        if g.id not in used or g.id in repart or g.busy or not g.mig_enabled or g.reserved_by:
            continue
        product = PRODUCTS.get(g.product)
        layout = tuple(sorted(layouts.get(g.id, ())))
        if product is None or layout != tuple(sorted(g.layout)):
            continue
        changed = False
        for profile in sorted(want):
            while have.get(profile, 0) < want[profile]:
                spot = fit(product, layout, (), profile)
                if spot is None or spot[1]:
                    break
                layout = tuple(sorted((*layout, Placement(spot[0], profile))))
                have[profile] = have.get(profile, 0) + 1
                changed = True
        if changed:
            layouts[g.id] = layout
            added.append(Action(ActionKind.REPARTITION, Reason.WARM_SPARE, gpu=g.id, layout=layout))
        if all(have.get(p, 0) >= n for p, n in want.items()):
            break
    if not added:
        return plan
    return dataclasses.replace(plan, layouts=layouts, actions=(*plan.actions, *added))
