"""The Kubernetes HPA's replica algorithm, reproduced stage by stage (pure).

``decide`` expresses each model's required capacity as replica-equivalents and
runs it through these stages, in the HPA controller's order:

1. ``replica_ratio`` / ``pods_metric_replicas``: ``desired = ceil(current * value / target)``,
   skipped ``within_tolerance`` (|ratio - 1| <= 0.1 by default), with the
   missing-pod rules (on a scale-down missing pods count as 100% of target, on
   a scale-up as 0%; if that flips the direction or lands in tolerance: hold);
2. ``combine_metrics``: several metrics -> the max; if any metric failed and
   the rest say "down", do not scale;
3. ``stabilize``: scale-up takes the MIN of recommendations inside the up
   window, scale-down the MAX inside the down window (default 0 s / 300 s);
4. ``apply_behavior``: Pods/Percent policies over ``period_s`` measured
   against the replica count at the start of the period (from the scale-event
   history), ``select_policy`` Max/Min/Disabled, then minReplicas/maxReplicas.

Each stage returns ``(value, Reason)`` so ``migscale explain`` can say which
stage set the number. No I/O; time arrives as ``now_s``.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from enum import Enum

from autoscaler.policy.types import Reason

DEFAULT_TOLERANCE = 0.1


class PolicyType(str, Enum):
    PODS = "Pods"
    PERCENT = "Percent"


class SelectPolicy(str, Enum):
    MAX = "Max"  # the policy that allows the largest change
    MIN = "Min"  # the policy that allows the smallest change
    DISABLED = "Disabled"  # no scaling in this direction


@dataclass(frozen=True)
class ScalingPolicy:
    type: PolicyType
    value: int
    period_s: float


@dataclass(frozen=True)
class ScalingRules:
    stabilization_window_s: float
    select_policy: SelectPolicy
    policies: tuple[ScalingPolicy, ...]


# Kubernetes defaults (docs/hpa.md): up doubles or adds 4 per 15 s, whichever is
# more, with no stabilization; down may drop everything per 15 s but only to
# the highest recommendation of the last 300 s.
DEFAULT_SCALE_UP = ScalingRules(
    0.0,
    SelectPolicy.MAX,
    (ScalingPolicy(PolicyType.PERCENT, 100, 15.0), ScalingPolicy(PolicyType.PODS, 4, 15.0)),
)
DEFAULT_SCALE_DOWN = ScalingRules(300.0, SelectPolicy.MAX, (ScalingPolicy(PolicyType.PERCENT, 100, 15.0),))


@dataclass(frozen=True)
class Recommendation:
    t_s: float
    replicas: int
    # req/s behind the count (None: blind or not demand-driven). HPA keeps counts
    # only; migscale also right-sizes profiles, which needs the rate stabilized too.
    required_rps: float | None = None


@dataclass(frozen=True)
class ScaleEvent:
    """A replica change the controller made: ``change`` > 0 up, < 0 down."""

    t_s: float
    change: int


# ------------------------------------------------------------------ stage 1


def within_tolerance(ratio: float, tolerance: float = DEFAULT_TOLERANCE) -> bool:
    """HPA skips scaling when the usage ratio is close to 1: 1.05 with 0.1 -> True."""
    return abs(1.0 - ratio) <= tolerance


def replica_ratio(
    current: int, value: float, target: float, tolerance: float = DEFAULT_TOLERANCE
) -> tuple[int, Reason]:
    """``ceil(current * value / target)``; 200m vs 100m on 3 replicas -> 6.

    ``value`` and ``target`` are per-replica averages (HPA ``type: Pods``).
    """
    if target <= 0:
        raise ValueError(f"target must be > 0, got {target}")
    ratio = value / target
    if within_tolerance(ratio, tolerance):
        return current, Reason.HOLD_WITHIN_TOLERANCE
    desired = math.ceil(current * ratio)
    if desired > current:
        return desired, Reason.SCALE_UP_DEMAND
    if desired < current:
        return desired, Reason.SCALE_DOWN_DEMAND
    return current, Reason.KEEP


def pods_metric_replicas(
    current: int,
    pod_values: Sequence[float | None],
    target: float,
    tolerance: float = DEFAULT_TOLERANCE,
) -> tuple[int, Reason]:
    """HPA's plain-metric replica calculation with its missing-pod rules.

    ``pod_values`` holds one entry per pod, None for a pod without a metric.
    Worked example (HPA docs): 4 pods, target 100; three report 150 and one is
    missing. Known ratio 1.5 says "up", so the missing pod counts as 0:
    (450 + 0) / 4 / 100 = 1.125 -> ceil(1.125 * 4) = 5. Had the known pods said
    "down" (three at 50), the missing one counts as 100: (150 + 100)/400 = 0.625.
    """
    if target <= 0:
        raise ValueError(f"target must be > 0, got {target}")
    known = [v for v in pod_values if v is not None]
    missing = len(pod_values) - len(known)
    if not known:
        return current, Reason.HOLD_MISSING_METRICS
    usage_ratio = sum(known) / len(known) / target
    if missing == 0:
        if within_tolerance(usage_ratio, tolerance):
            return current, Reason.HOLD_WITHIN_TOLERANCE
        desired = math.ceil(usage_ratio * len(known))
        return desired, _direction_reason(current, desired)
    if usage_ratio < 1.0:
        filled = sum(known) + missing * target  # scale-down: missing pods at 100% of target
    elif usage_ratio > 1.0:
        filled = sum(known)  # scale-up: missing pods at 0%
    else:
        return current, Reason.HOLD_WITHIN_TOLERANCE
    n = len(pod_values)
    new_ratio = filled / n / target
    if (
        within_tolerance(new_ratio, tolerance)
        or (usage_ratio < 1.0 and new_ratio > 1.0)
        or (usage_ratio > 1.0 and new_ratio < 1.0)
    ):
        return current, Reason.HOLD_MISSING_METRICS
    desired = math.ceil(new_ratio * n)
    if (new_ratio < 1.0 and desired > current) or (new_ratio > 1.0 and desired < current):
        return current, Reason.HOLD_MISSING_METRICS
    return desired, _direction_reason(current, desired)


def _direction_reason(current: int, desired: int) -> Reason:
    if desired > current:
        return Reason.SCALE_UP_DEMAND
    if desired < current:
        return Reason.SCALE_DOWN_DEMAND
    return Reason.KEEP


# ------------------------------------------------------------------ stage 2


def combine_metrics(current: int, proposals: Sequence[tuple[int, Reason] | None]) -> tuple[int, Reason]:
    """Several metrics: the largest proposal wins; None marks a metric that failed.

    All failed -> hold. Some failed and the valid ones say "down" -> hold
    (HPA: never scale down on a partial picture). Some failed but the valid
    ones say "up" -> scale up from what is known.
    """
    valid = [p for p in proposals if p is not None]
    if not valid:
        return current, Reason.HOLD_MISSING_METRICS
    best = max(valid, key=lambda p: p[0])
    if len(valid) < len(proposals) and best[0] < current:
        return current, Reason.HOLD_MISSING_METRICS
    return best


# ------------------------------------------------------------------ stage 3


def record_recommendation(
    history: Iterable[Recommendation], rec: Recommendation, keep_s: float
) -> tuple[Recommendation, ...]:
    """Append ``rec`` and drop entries older than the longest window (``keep_s``)."""
    cutoff = rec.t_s - keep_s
    return tuple(r for r in history if r.t_s > cutoff) + (rec,)


def stabilize(
    current: int,
    desired: int,
    history: Iterable[Recommendation],
    now_s: float,
    up_window_s: float,
    down_window_s: float,
) -> tuple[int, Reason]:
    """HPA's stabilization: clamp ``current`` between the up and down recommendations.

    ``history`` are earlier recommendations (this tick's ``desired`` is added
    here). Scale-up uses the MIN over the up window (a burst must persist for
    the whole window), scale-down the MAX over the down window. Example (HPA
    docs, 300 s): recommendations 10, 8, 6 during the last five minutes and now
    5 -> stays at 10 until the 10 ages out.
    """
    up_rec = desired
    down_rec = desired
    for r in history:
        if r.t_s > now_s - up_window_s:
            up_rec = min(up_rec, r.replicas)
        if r.t_s > now_s - down_window_s:
            down_rec = max(down_rec, r.replicas)
    out = current
    out = max(out, up_rec)
    out = min(out, down_rec)
    if out != desired:
        return out, Reason.HOLD_STABILIZATION
    return out, _direction_reason(current, out)


# ------------------------------------------------------------------ stage 4


def period_change(events: Iterable[ScaleEvent], period_s: float, now_s: float, up: bool) -> int:
    """Replicas added (``up``) or removed in the last ``period_s`` seconds."""
    total = 0
    for e in events:
        if e.t_s > now_s - period_s:
            if up and e.change > 0:
                total += e.change
            elif not up and e.change < 0:
                total -= e.change
    return total


def scale_up_limit(current: int, events: Sequence[ScaleEvent], rules: ScalingRules, now_s: float) -> int:
    """Highest replica count the scale-up policies allow now.

    Each policy counts from the replica count at the start of its period:
    with 5 replicas of which 3 were added 10 s ago, ``Pods 4 / 15 s`` allows
    2 + 4 = 6, ``Percent 100 / 15 s`` allows ceil(2 * 2) = 4; Max -> 6.
    """
    if rules.select_policy == SelectPolicy.DISABLED:
        return current
    pick = min if rules.select_policy == SelectPolicy.MIN else max
    result: int | None = None
    for p in rules.policies:
        added = period_change(events, p.period_s, now_s, up=True)
        removed = period_change(events, p.period_s, now_s, up=False)
        start = current - added + removed
        if p.type == PolicyType.PODS:
            proposed = start + p.value
        else:
            # rounded up so a small replica count can still grow (1 * 1.1 -> 2)
            proposed = math.ceil(start * (1 + p.value / 100))
        result = proposed if result is None else pick(result, proposed)
    return current if result is None else result


def scale_down_limit(current: int, events: Sequence[ScaleEvent], rules: ScalingRules, now_s: float) -> int:
    """Lowest replica count the scale-down policies allow now.

    ``Percent 10 / 60 s`` from 80 -> int(80 * 0.9) = 72; from 72 the next
    minute -> int(64.8) = 64 (the change, 7.2, is rounded up to 8).
    Select Max picks the policy allowing the MOST change (lowest count).
    """
    if rules.select_policy == SelectPolicy.DISABLED:
        return current
    # "Max" change on the way down is the smallest replica count
    pick = max if rules.select_policy == SelectPolicy.MIN else min
    result: int | None = None
    for p in rules.policies:
        added = period_change(events, p.period_s, now_s, up=True)
        removed = period_change(events, p.period_s, now_s, up=False)
        start = current - added + removed
        if p.type == PolicyType.PODS:
            proposed = start - p.value
        else:
            proposed = int(start * (1 - p.value / 100))
        result = proposed if result is None else pick(result, proposed)
    return current if result is None else result


def apply_behavior(
    current: int,
    desired: int,
    min_replicas: int,
    max_replicas: int,
    events: Sequence[ScaleEvent],
    up: ScalingRules,
    down: ScalingRules,
    now_s: float,
) -> tuple[int, Reason]:
    """Rate-limit ``desired`` by the behavior policies, then clamp to min/max."""
    if desired > current:
        limit = max(scale_up_limit(current, events, up, now_s), current)
        if max_replicas > limit:
            allowed, why = limit, Reason.RATE_LIMITED
        else:
            allowed, why = max_replicas, Reason.MAX_REPLICAS
        if desired > allowed:
            return allowed, why
        return desired, Reason.SCALE_UP_DEMAND
    if desired < current:
        limit = min(scale_down_limit(current, events, down, now_s), current)
        if min_replicas < limit:
            allowed, why = limit, Reason.RATE_LIMITED
        else:
            allowed, why = min_replicas, Reason.MIN_REPLICAS
        if desired < allowed:
            return allowed, why
        return desired, Reason.SCALE_DOWN_DEMAND
    return desired, Reason.KEEP


def clamp(replicas: int, min_replicas: int, max_replicas: int) -> tuple[int, Reason]:
    """minReplicas/maxReplicas bounds; HPA applies them before any metric when
    the current count is already outside."""
    if replicas < min_replicas:
        return min_replicas, Reason.MIN_REPLICAS
    if replicas > max_replicas:
        return max_replicas, Reason.MAX_REPLICAS
    return replicas, Reason.KEEP


def record_scale_event(
    events: Iterable[ScaleEvent], now_s: float, before: int, after: int, keep_s: float
) -> tuple[ScaleEvent, ...]:
    """Remember a replica change for the behavior periods; drop events older than ``keep_s``."""
    kept = tuple(e for e in events if e.t_s > now_s - keep_s)
    if after != before:
        kept += (ScaleEvent(now_s, after - before),)
    return kept


def longest_period_s(*rules: ScalingRules) -> float:
    return max((p.period_s for r in rules for p in r.policies), default=0.0)
