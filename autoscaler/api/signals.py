"""Which metrics the API serves, and the value that steers the HPA.

Part of the export step. The HPA (docs/hpa.md) computes, for a ``type: Pods``
metric with an ``AverageValue`` target ``t``::

    ratio   = avg(pod values) / t                 (milli-precision integers)
    desired = current              if |1 - ratio| <= tolerance (0.1)
              ceil(ratio * current) otherwise

To make the HPA land on the planner's replica count ``d`` for a Deployment
that has ``c`` pods, every pod of that Deployment serves the same value
``migscale_replica_ratio = d / c * t``. **Shipped target** (``k8s/``):

    metrics:
    - type: Pods
      pods:
        metric: {name: migscale_replica_ratio}
        target: {type: AverageValue, averageValue: "1"}

Three details make the equivalence exact, not approximate:

* milli rounding: the HPA reads ``MilliValue()``. ``2/3`` served as ``667m``
  gives ``ceil(3 * 0.667) = ceil(2.001) = 3`` -- one pod too many. We serve
  ``floor((1000*d*t - 1) / c)`` milli-units instead, even when ``d/c`` is
  exact (``d=2, c=1`` -> ``1999m``): strictly below ``d/c*t``
  (so float noise can never push ``ratio * c`` past the integer ``d``) and
  within ``(c+1)/1000`` of it (so the ceiling still reaches ``d`` for
  ``c < 999``). Worked: d=2, c=3 -> 666m, 3 * 0.666 = 1.998 -> ceil 2.
* ``d = 0`` (the planner retires this profile): we serve ``0``; the HPA then
  clamps to ``minReplicas`` and migscale's actuator deletes the Deployment.
* tolerance: when ``|d/c - 1| <= 0.1`` (``10*|d - c| <= c``) the HPA holds at ``c``. No served value
  can fix that -- with ``c >= 10`` and ``d = c + 1`` any value above the
  tolerance band (> 1.1) also gives ``ceil(c * ratio) >= c + 2``. So a change of
  at most 10% is applied by migscale's own churn-limited rollout (the
  actuator scales the Deployment itself; the HPA, seeing the new ``c = d``,
  then reads ratio 1 and agrees). On Kubernetes >= 1.33 with the
  ``HPAConfigurableTolerance`` feature gate, set
  ``behavior.scaleUp.tolerance: 0`` / ``scaleDown.tolerance: 0`` and the HPA
  applies those too. ``tests/unit/test_api_hpa.py`` proves both halves
  against the control loop's HPA math for every ``c <= 64, d <= 128``.

The Object metric ``migscale_desired_replicas`` on a Deployment (or
LeaderWorkerSet) is the planned count itself; with ``type: Object`` and
``target: {type: AverageValue, averageValue: "1"}`` the HPA computes
``ceil(d / 1) = d`` independent of how many pods it counts (same tolerance
caveat). It also works from zero pods, where a Pods metric has no pod to
report on.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = [
    "CUSTOM_OBJECT_METRICS",
    "CUSTOM_POD_METRICS",
    "EXTERNAL_METRICS",
    "NAMESPACE_METRICS",
    "MetricInfo",
    "replica_ratio_milli",
]


@dataclass(frozen=True)
class MetricInfo:
    name: str
    unit: str
    help: str


REPLICA_RATIO = "migscale_replica_ratio"
DESIRED_REPLICAS = "migscale_desired_replicas"
QUEUE_COMPUTE_RATIO = "migscale_queue_compute_ratio"
REPLICA_RPS = "migscale_replica_requests_per_second"
SLICE_UTILIZATION = "migscale_slice_utilization_ratio"

CUSTOM_POD_METRICS: dict[str, MetricInfo] = {
    m.name: m
    for m in (
        MetricInfo(REPLICA_RATIO, "ratio", "desired/current replicas of the pod's Deployment (HPA target 1)"),
        MetricInfo(QUEUE_COMPUTE_RATIO, "ratio", "queue time / compute time of the pod's model"),
        MetricInfo(REPLICA_RPS, "requests/s", "the model's request rate divided by its ready replicas"),
        MetricInfo(SLICE_UTILIZATION, "ratio", "busy fraction of the pod's MIG slice (DCGM or Triton)"),
    )
}

CUSTOM_OBJECT_METRICS: dict[str, MetricInfo] = {
    m.name: m
    for m in (
        MetricInfo(DESIRED_REPLICAS, "replicas", "the planner's replica count for this Deployment"),
        MetricInfo(REPLICA_RATIO, "ratio", "desired/current replicas (Object target type Value 1)"),
        MetricInfo(QUEUE_COMPUTE_RATIO, "ratio", "queue time / compute time of the model"),
        MetricInfo(REPLICA_RPS, "requests/s", "the model's request rate divided by its ready replicas"),
        MetricInfo(SLICE_UTILIZATION, "ratio", "mean busy fraction of the Deployment's slices"),
    )
}

NAMESPACE_METRICS: dict[str, MetricInfo] = {
    m.name: m
    for m in (
        MetricInfo("migscale_gpus_in_use", "GPUs", "GPUs with at least one replica"),
        MetricInfo("migscale_slices_in_use", "slices", "compute slices held by replicas"),
        MetricInfo("migscale_replicas", "replicas", "replicas in state starting or ready"),
        MetricInfo("migscale_shortfall_requests_per_second", "requests/s", "demand the cluster cannot serve"),
    )
}

EXTERNAL_METRICS: dict[str, MetricInfo] = {
    m.name: m
    for m in (
        MetricInfo(DESIRED_REPLICAS, "replicas", "planned replicas, labels model/profile/deployment"),
        MetricInfo("migscale_model_requests_per_second", "requests/s", "request rate, label model"),
        MetricInfo("migscale_model_queue_compute_ratio", "ratio", "queue:compute ratio, label model"),
        MetricInfo("migscale_model_p99_seconds", "seconds", "p99 latency, label model"),
        MetricInfo(
            "migscale_model_shortfall_requests_per_second", "requests/s", "unservable demand, label model"
        ),
    )
}


def replica_ratio_milli(desired: int, current: int, target_milli: int = 1000) -> int | None:
    """Per-pod value (milli-units) that makes the HPA compute ``desired`` from ``current`` pods.

    None when ``current`` is 0: there is no pod to carry a Pods metric (the
    Object metric ``migscale_desired_replicas`` covers that case).
    See the module docstring for why this is ``floor((desired*t - 1)/current)``.
    """
    if desired < 0 or current < 0 or target_milli <= 0:
        raise ValueError(f"desired={desired}, current={current}, target_milli={target_milli}")
    if current == 0:
        return None
    if desired == 0:
        return 0
    if desired == current:
        # inside the tolerance band whatever the arithmetic; serve the plain
        # target so `kubectl get --raw` shows "1" for "no change"
        return target_milli
    # Not the exact d/c even when it is representable: 7 of 10 served as 700m
    # is summed in floats by some HPA implementations (10 x 0.7 = 7.000000000000001
    # -> ceil 8). 699m keeps a 0.001-per-pod margin below the integer.
    return (desired * target_milli - 1) // current
