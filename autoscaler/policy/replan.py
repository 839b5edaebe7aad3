"""Whether a tick calls the planner (pure; zero I/O).

``decide`` runs the HPA stages for every model each tick, then asks ``replan``
whether the planner must run: the planner is pure, so equal inputs reuse the
last call's plan (``Memo``), and inputs that changed in nothing urgent wait up
to ``replan_s``. The answer is a ``Replan`` reason, kept in ``PolicyState.replan``
and written to every line of the decision log.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from enum import Enum
from typing import NamedTuple

from autoscaler.policy.capacity import failed_replicas
from autoscaler.policy.types import ClusterState, Plan

PlannerFn = Callable[..., Plan]


class Replan(str, Enum):
    """Whether a tick calls the planner, and why (``replan``; ``PolicyState.replan``)."""

    SAME = "same"  # no: the planner's inputs are those of the last call, so is its plan
    HOLD = "hold"  # no: nothing urgent, and the last call is under replan_s old
    FIRST = "first"  # yes: no earlier call
    PERIODIC = "periodic"  # yes: the last call is replan_s old
    SETTINGS = "settings"  # yes: the churn budget or the fast path changed
    GPUS = "gpus"  # yes: a different set of GPUs
    FAILED = "failed"  # yes: a replica failed or crash-loops
    MOVING = "moving"  # yes: the HPA stages changed a replica count
    MODELS = "models"  # yes: a model added to, removed from or changed in the configuration
    SHORT = "short"  # yes: a model short of a target (or on a cluster) the last call did not see


class Memo(NamedTuple):
    """The last planner call: equal inputs give an equal plan (the planner is pure)."""

    key: tuple  # (targets, cluster, churn budget, fast path, spares, model specs): the planner's inputs
    plan: Plan
    planner: PlannerFn | None
    t_s: float
    counts: Mapping[str, int]  # the HPA stages' replica count per model then
    room: tuple  # ``room`` of the cluster then


def room(cluster: ClusterState) -> tuple:
    """What decides where a replica can go: each GPU's cut, mode and gate, and which
    instances replicas hold -- not their readiness (a pod turning Ready opens no room)."""
    return (tuple((g.id, g.layout, g.mig_enabled, g.busy, g.reserved_by) for g in cluster.gpus),
            frozenset((r.gpu, r.start, r.profile) for r in cluster.replicas))


def replan(memo: Memo | None, key: tuple, target_rps: Mapping[str, float], caps: Mapping[str, float],
           moving: Mapping[str, int], now_s: float, every_s: float) -> Replan:
    """Does this tick call the planner? ``SAME``: no, its inputs are exactly those
    of the last call, so is its plan (the planner is pure); ``HOLD``: no, nothing
    is urgent and the last call is under ``every_s`` (``replan_s``) old; any
    other answer is yes, and says why.

    Urgent: a replica count the HPA stages changed since the last call
    (``moving``: model -> a count other than its current one), a model added
    to, removed from or changed in the configuration, a model whose live replicas fall
    short of its target (a rise, a burst) with a higher target than the last
    call saw or with room it did not see (``room``), a replica that failed
    since the last call, a different set of GPUs. A replica the last call
    already saw failed is not news: on Kubernetes a pod the device plugin
    refused stays Failed until it is collected, and re-planning for it would
    call the planner on every tick. What is not urgent -- a smaller profile,
    emptying a GPU, actions the loop's gate held back while their GPU was busy, a count
    the last call already acted on while its replicas start -- waits at most
    ``every_s``. Worked number: at a 15 s tick on 12 models and 16 GPUs a call
    costs ~10 ms, and a steady hour calls it about once a minute instead of
    four times; at 8,000 GPUs a call costs ~0.3 s, and a warm-up whose pods
    start over many ticks would otherwise call it every tick.
    """
    if memo is None:
        return Replan.FIRST
    if memo.key == key:
        return Replan.SAME
    _, cluster0, churn0, fast0, _spares0, models0 = memo.key
    _, cluster, churn, fast, _spares, models = key
    if now_s - memo.t_s >= every_s:
        return Replan.PERIODIC
    if (churn, fast) != (churn0, fast0):
        return Replan.SETTINGS
    if models != models0:
        return Replan.MODELS  # a live config change (replica bounds, profiles, capacity): act on it now
    if tuple(g.id for g in cluster.gpus) != tuple(g.id for g in cluster0.gpus):
        return Replan.GPUS
    if failed_replicas(cluster) - failed_replicas(cluster0):
        return Replan.FAILED
    roomier: bool | None = None  # the cluster's room differs from the last call's (computed once, if asked)

    def room_changed() -> bool:
        nonlocal roomier
        if roomier is None:
            roomier = cluster != cluster0 and room(cluster) != memo.room
        return roomier

    # A count the HPA stages changed since the last call: act on it now; one it
    # already acted on, again once the room changed (held actions may go now).
    if moving and (any(memo.counts.get(name) != n for name, n in moving.items()) or room_changed()):
        return Replan.MOVING
    targets0 = dict(memo.key[0])
    if set(target_rps) != set(targets0):
        return Replan.MODELS  # a live config change: start or drain it now
    # Short of its target: urgent, unless the last call already saw this much room
    # and no lower a target (a full fleet, actions the gate holds until a GPU
    # frees, replicas still starting): the planner would only say the same again.
    short = [name for name, tgt in target_rps.items() if tgt > caps.get(name, 0.0) * (1 + 1e-9)]
    if any(target_rps[name] > targets0.get(name, 0.0) for name in short) or (short and room_changed()):
        return Replan.SHORT
    return Replan.HOLD
