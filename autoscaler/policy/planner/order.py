"""Planner step 3b: the order of one call's actions, and each GPU's final layout.

Pure; used by ``actions.finish`` on the selection the churn budget made
(``budget.py``). ``order`` returns the actions in waves, or what could not be
ordered (which ``finish`` then defers and asks again).

Action order (make-before-break), in waves until everything is emitted:
REPARTITION of GPUs whose removed instances are empty by now -> CREATE ->
DRAIN + DELETE of replicas of models with no new replica pending; only when
nothing else can go, WAIT_READY of the pending new replicas, which lets their
models' own removals follow (a WAIT_READY holds back the rest of its chain, so
it comes no earlier than something needs it). A serving replica is drained
only while its model keeps at least min(capacity before, capacity after,
demand) req/s from ready replicas (a replica still STARTING counts after,
never before: a drain that waits for it is deferred with
``Reason.HOLD_CONVERGING`` until a later tick finds it ready); a REPARTITION
waits for the DELETE of every replica on an instance it destroys; a CREATE
on a new or occupied instance waits for its GPU's REPARTITION or the DELETE
of the replica there. What can never become ready (a model's new replica
needs the space its own old replica still serves from, and dropping that one
first would break the floor) is deferred with ``Reason.CHURN_BUDGET`` rather
than dropping capacity.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from functools import lru_cache
from typing import TYPE_CHECKING

from autoscaler.mig.layout import Placement, check_layout
from autoscaler.mig.products import Product
from autoscaler.policy.planner.budget import Create, overlap
from autoscaler.policy.planner.multinode import WHOLE
from autoscaler.policy.planner.work import HEALTHY
from autoscaler.policy.types import Action, ActionKind, ClusterState, Reason, Replica, ReplicaState

if TYPE_CHECKING:  # pragma: no cover
    from autoscaler.policy.planner.packing import GpuWork


def final_layout(g: GpuWork) -> tuple[Placement, ...]:
    """Occupied instances, plus every current instance that still fits beside them."""
    if g.whole is not None:
        return ()
    occupied = tuple(sorted(Placement(s, v[1]) for s, v in g.hard.items())) if g.hard else ()
    return _fill_layout(g.product, occupied, g.current)


@lru_cache(maxsize=8192)
def _fill_layout(product: Product, occupied: tuple[Placement, ...], current: tuple[Placement, ...]
                 ) -> tuple[Placement, ...]:
    """``final_layout``'s work, cached: a fleet repeats the same few GPU states tick after tick."""
    layout = list(occupied)
    for p in sorted(current, key=lambda p: (-product.profiles[p.profile].compute, p.start)):
        if p in layout:
            continue
        if not check_layout(product, layout + [p]):
            layout.append(p)
    return tuple(sorted(layout))


def order(gpus: list[GpuWork], by_id: dict[str, GpuWork], creates: list[Create], sel_c: set[int],
          removed: dict[str, Reason], sel_d: set[str], replicas: dict[str, Replica], cluster: ClusterState,
          caps: Mapping[str, Mapping[str, float]], keep_rps: Mapping[str, float]
          ) -> tuple[list[Action], tuple[list[Create], list[str]] | None]:
    """The selected actions in make-before-break waves (see the module docstring), and
    None; or, when some cannot go (they wait on something deferred), those creates and
    deletes, for ``finish`` to defer before it asks again."""
    mig_on = {g.id: g.mig_enabled for g in cluster.gpus}
    # REPARTITION per GPU whose layout or mode changes.
    repart: dict[str, Action] = {}
    rep_deps: dict[str, set[str]] = {}
    for g in gpus:
        final = final_layout(g)
        whole = g.whole is not None
        was_whole = not mig_on.get(g.id, True)
        if whole == was_whole and (whole or final == g.current):
            continue
        if was_whole and not whole and not final:
            continue  # a freed whole GPU stays as it is until something needs MIG on it
        if whole:
            act = Action(ActionKind.REPARTITION, Reason.REPARTITION, gpu=g.id, model=g.whole, profile=WHOLE, layout=())
        else:
            act = Action(ActionKind.REPARTITION, Reason.REPARTITION, gpu=g.id, layout=final)
        repart[g.id] = act
        fs = set(final)
        rep_deps[g.id] = {
            rid for rid in sel_d
            if replicas[rid].gpu == g.id
            and (whole or was_whole or Placement(replicas[rid].start, replicas[rid].profile) not in fs
                 or replicas[rid].state not in HEALTHY)
        }
    c_deps: dict[int, set[str]] = {}
    c_rep: dict[int, str | None] = {}
    for c in creates:
        if c.order not in sel_c:
            continue
        g = by_id[c.gpu]
        pl = Placement(c.start, c.profile)
        if c.gpu in repart and (c.group is not None or pl not in g.current or not mig_on.get(c.gpu, True)):
            c_rep[c.order] = c.gpu
            c_deps[c.order] = set()
        else:
            c_rep[c.order] = None
            c_deps[c.order] = {rid for rid in sel_d if replicas[rid].gpu == c.gpu and overlap(g, c, replicas[rid])}
    # Make-before-break by capacity: a serving replica is drained only while
    # its model keeps at least min(capacity before, capacity after, demand)
    # req/s from replicas that are ready (``keep_rps``). Worked number: 2 x 7g
    # (279 req/s) becoming 2 x 1g (112) for a demand of 106: after one new 1g is ready
    # (335), one 7g may go (195 >= 106); the second waits for the second 1g.
    def rps(model: str, profile: str) -> float:
        return float(caps.get(model, {}).get(profile, 0.0))

    # A replica still STARTING serves nothing yet: it counts toward the capacity
    # after the plan, never toward what serves while the plan runs, so a ready
    # replica it is to replace stays until a later tick finds it ready.
    serving: dict[str, float] = {}
    after: dict[str, float] = {}
    for r in replicas.values():
        if r.profile == WHOLE:
            continue
        if r.state is ReplicaState.READY:
            serving[r.model] = serving.get(r.model, 0.0) + rps(r.model, r.profile)
        if r.state in HEALTHY and r.id not in sel_d:
            after[r.model] = after.get(r.model, 0.0) + rps(r.model, r.profile)
    for c in creates:
        if c.order in sel_c and c.profile != WHOLE:
            after[c.model] = after.get(c.model, 0.0) + rps(c.model, c.profile)
    floor = {m: min(serving.get(m, 0.0), after.get(m, 0.0), keep_rps.get(m, 0.0)) for m in set(serving) | set(after)}
    d_deps: dict[str, set[int]] = {rid: set() for rid in sel_d}
    done_c: set[int] = set()
    done_d: set[str] = set()
    done_r: set[str] = set()
    actions: list[Action] = []
    cs = {c.order: c for c in creates}
    # A WAIT_READY holds back everything after it in its chain, and a chain links
    # every action of a model and of a GPU. So each WAIT_READY is emitted only once
    # nothing else can go without it: a model's own removals wait for its new
    # replicas (make-before-break), but another model's scale-down, and a create
    # on the instance it frees, are not queued behind a start -- or behind a
    # repartition, when the new replica's GPU is re-cut. Worked case: a model adds
    # a 3g on a GPU being re-cut (180 s) and a 3g where another model scales down;
    # the second no longer waits the 180 s, and the model is not held busy (no new
    # plan for it) all that time.
    unwaited: list[int] = []

    def wait_ready(orders: list[int]) -> None:
        for o in orders:
            c = cs[o]
            actions.append(Action(ActionKind.WAIT_READY, c.reason, gpu=c.gpu, model=c.model, profile=c.profile,
                                  start=c.start, replica=str(o)))
            if c.profile != WHOLE:
                serving[c.model] = serving.get(c.model, 0.0) + rps(c.model, c.profile)

    while True:
        progress = False
        for gid in sorted(repart):
            if gid not in done_r and rep_deps[gid] <= done_d:
                actions.append(repart[gid])
                done_r.add(gid)
                progress = True
        wave = [o for o in sorted(c_deps) if o not in done_c and c_deps[o] <= done_d
                and (c_rep[o] is None or c_rep[o] in done_r)]
        for o in wave:
            c = cs[o]
            actions.append(Action(ActionKind.CREATE, c.reason, gpu=c.gpu, model=c.model, profile=c.profile,
                                  start=c.start, replica=str(o)))
            done_c.add(o)
            unwaited.append(o)
            progress = True
        dw = []
        pending_models = {cs[o].model for o in unwaited}  # a new replica created, not yet waited for
        for rid in sorted(d_deps):
            if rid in done_d:
                continue
            r = replicas[rid]
            if r.model in pending_models:
                continue  # make-before-break: a model's own removals wait for its new replicas
            c = rps(r.model, r.profile) if r.state is ReplicaState.READY and r.profile != WHOLE else 0.0
            if c and serving.get(r.model, 0.0) - c < floor.get(r.model, 0.0) - 1e-9:
                continue
            serving[r.model] = serving.get(r.model, 0.0) - c
            dw.append(rid)
        for rid in dw:
            r = replicas[rid]
            if r.state in HEALTHY:
                actions.append(Action(ActionKind.DRAIN, removed[rid], gpu=r.gpu, model=r.model, profile=r.profile,
                                      start=r.start, replica=rid))
        for rid in dw:
            r = replicas[rid]
            actions.append(Action(ActionKind.DELETE, removed[rid], gpu=r.gpu, model=r.model, profile=r.profile,
                                  start=r.start, replica=rid))
            done_d.add(rid)
            progress = True
        if len(done_c) == len(c_deps) and len(done_d) == len(d_deps) and len(done_r) == len(repart):
            wait_ready(unwaited)
            return actions, None
        if not progress and unwaited:
            wait_ready(unwaited)  # what is left needs the new replicas serving
            unwaited, progress = [], True
        if not progress:
            stuck_c = [cs[o] for o in c_deps if o not in done_c]
            stuck_d = [rid for rid in d_deps if rid not in done_d]
            return actions, (stuck_c, stuck_d)


def finalize_actions(actions: list[Action], creates: list[Create]) -> list[Action]:
    """Replace the provisional create keys with the new replica ids."""
    cs = {str(c.order): c for c in creates}
    out = []
    for a in actions:
        if a.kind in (ActionKind.CREATE, ActionKind.WAIT_READY) and a.replica in cs:
            a = replace(a, replica=cs[a.replica].rid)
        out.append(a)
    return out
