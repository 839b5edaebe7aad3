"""The planner's small-cluster search over new models' mixes (step 4 of ``planner.core``).

Place in the loop: inside ``plan``, after the first placement. On at most
``SEARCH_MAX_GPUS`` GPUs, when the plan is short or uses more GPUs than the
slice lower bound, the models that start from nothing try their alternative
mixes (``sizing.alternatives``) one at a time, then, while a shortfall
remains, two at a time; each candidate is a whole plan from the caller's
``attempt``, and ``plan_key`` orders them (shortfall, short models, GPUs,
slices, actions). Pure: no I/O.
"""

from __future__ import annotations

import math

from autoscaler.policy.planner.packing import GpuWork
from autoscaler.policy.planner.sizing import alternatives, mix_slices
from autoscaler.policy.planner.work import ModelWork
from autoscaler.policy.types import Plan, Reason

# Alternative mixes within this many slices of a model's cheapest: below the
# 7 slices a rebalance must save (``core.REBALANCE_MIN_SLICES``), so a plan never
# undoes its own choice next tick.
SEARCH_SLACK = 6

# The mix search runs only on small clusters, where a missed GPU is a big
# relative loss (1 of 4 = 25%) and a plan costs about a millisecond.
SEARCH_MAX_GPUS = 16
SEARCH_ROUNDS = 2
PAIR_ATTEMPTS = 128


def _lower_bound(work: dict[str, ModelWork], gpus: list[GpuWork]) -> int:
    per_gpu = max((g.product.compute_slices for g in gpus), default=7)
    by_id = {g.id: g for g in gpus}
    total = 0
    for m in work.values():
        total += mix_slices(m.add, m.options)
        total += sum(by_id[r.gpu].product.profiles[r.profile].compute for r in m.keep)
    return math.ceil(total / per_gpu)


def worth_searching(best: Plan, work: dict[str, ModelWork], gpus: list[GpuWork]) -> bool:
    if len(gpus) > SEARCH_MAX_GPUS or not any(m.add and not m.running for m in work.values()):
        return False
    if best.shortfall or any(Reason.SHORTFALL in rs for rs in best.reasons.values()):
        return True
    return best.cost.gpus_used > _lower_bound(work, gpus)


def search_mixes(best: Plan, work: dict[str, ModelWork], attempt, gpus: list[GpuWork]) -> Plan:
    """Coordinate descent over each model's alternative mixes (new replicas only)."""
    lb = _lower_bound(work, gpus)
    current = {n: dict(m.add) for n, m in work.items() if m.add and not m.running}
    alts: dict[str, list[dict[str, int]]] = {}
    for n, m in work.items():
        if not m.add or m.running:
            continue  # only models starting from nothing: a running one is not reshuffled
        have = sum(m.cap[r.profile] for r in m.keep)
        alts[n] = alternatives((m.demand or 0.0) - have, m.options, max(0, m.floor - len(m.keep)),
                               max(0, m.spec.max_replicas - len(m.keep)), slack=SEARCH_SLACK)
    best_key = plan_key(best)
    for _ in range(SEARCH_ROUNDS):
        improved = False
        for n in sorted(alts, key=lambda n: (-mix_slices(current[n], work[n].options), n)):
            for cand in alts[n]:
                if cand == current[n]:
                    continue
                trial = dict(current)
                trial[n] = cand
                p = attempt(trial)
                k = plan_key(p)
                if k < best_key:
                    best, best_key, current, improved = p, k, trial, True
                    if best_key[:2] == (0, 0) and best.cost.gpus_used <= lb:
                        return best
        if not improved:
            break
    if best_key[0] > 0:
        best = _search_pairs(best, work, current, alts, attempt)
    return best


def _search_pairs(best: Plan, work: dict[str, ModelWork], current: dict[str, dict[str, int]],
                  alts: dict[str, list[dict[str, int]]], attempt) -> Plan:
    """Two models' mixes changed at once, while the descent leaves a shortfall.

    The descent changes one model at a time, so it stops where no single change
    helps although a joint one does: a model short on its own mixes may fit only
    once another takes a mix that leaves it the right instances (one 2g traded
    for two 1g on GPUs where a 1g is all that is left), or once two others do
    (the short model has no other mix). The short models' pairs go first; at
    most ``PAIR_ATTEMPTS`` plans, so a fleet that is simply too small costs a
    bounded search per tick.
    """
    best_key = plan_key(best)
    short = set(best.shortfall)
    names = sorted(alts, key=lambda n: (n not in short, -mix_slices(current[n], work[n].options), n))
    # Pairs with a short model first; then the others, which may open room for a short
    # model that has no other mix of its own.
    pairs = [(a, b) for i, a in enumerate(names) for b in names[i + 1:]]
    pairs.sort(key=lambda ab: ab[0] not in short and ab[1] not in short)
    tries = 0
    for a, b in pairs:
        for ca in alts[a]:
            for cb in alts[b]:
                if ca == current[a] or cb == current[b]:
                    continue  # a single change: the descent has tried it
                if tries >= PAIR_ATTEMPTS:
                    return best
                tries += 1
                trial = {**current, a: ca, b: cb}
                p = attempt(trial)
                k = plan_key(p)
                if k < best_key:
                    best, best_key, current = p, k, trial
                    if k[0] == 0:
                        return best
    return best


def plan_key(p: Plan) -> tuple:
    unmet = sum(1 for rs in p.reasons.values() if Reason.SHORTFALL in rs)
    return (round(sum(p.shortfall.values()), 6), unmet, p.cost.gpus_used, p.cost.slices_used, len(p.actions))
