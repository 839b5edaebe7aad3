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
would evict every replica of the node, so spares are carved only into the
free space of a GPU the plan repartitions anyway, on any tick: the node is
drained for that cut whatever the spare does.
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
    """``plan`` plus the spares still missing (``plan`` itself when none is missing or none
    can be carved): new REPARTITIONs on a calm tick (GPU scope), or a larger layout for the
    plan's own REPARTITIONs (node scope)."""
    want = {p: n for p, n in spares.items() if n > 0}
    in_place = scope is RepartitionScope.GPU
    if not want or (in_place and (plan.shortfall or any(a.kind is ActionKind.CREATE for a in plan.actions))):
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
    grown: dict[str, tuple[Placement, ...]] = {}
    for g in cluster.gpus:  # fullest first would pack tighter; cluster order keeps it stable
        if all(have.get(p, 0) >= n for p, n in want.items()):
            break
        if g.id not in used or g.busy or not g.mig_enabled or g.reserved_by:
            continue
        if (g.id in repart) is in_place:  # GPU scope: GPUs left as they are; node scope: those cut anyway
            continue
        product = PRODUCTS.get(g.product)
        layout = tuple(sorted(layouts.get(g.id, ())))
        if product is None or (in_place and layout != tuple(sorted(g.layout))):
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
            layouts[g.id] = grown[g.id] = layout
    if not grown:
        return plan
    if in_place:
        actions = (*plan.actions, *(Action(ActionKind.REPARTITION, Reason.WARM_SPARE, gpu=gid, layout=layout)
                                    for gid, layout in grown.items()))
    else:
        actions = tuple(dataclasses.replace(a, layout=grown[a.gpu])
                        if a.kind is ActionKind.REPARTITION and a.gpu in grown else a for a in plan.actions)
    return dataclasses.replace(plan, layouts=layouts, actions=actions)
