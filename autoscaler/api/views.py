"""JSON views of the controller's values for ``/v1/plan``, ``/v1/status`` and the UI.

Part of the export step: pure functions from the shared contract types
(``autoscaler.policy.types``) to plain JSON-able dicts. The web view and
``kubectl``-style clients read these; they never show more than the plan and
the cluster state the plan was made against.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from datetime import datetime, timezone
from functools import lru_cache
from typing import Any

from autoscaler.act.kubernetes.render import workload_name
from autoscaler.mig.layout import Placement
from autoscaler.mig.products import PRODUCTS
from autoscaler.policy.types import (
    ClusterState,
    ModelSpec,
    Observation,
    Plan,
    ReplicaState,
)


def deployment_name(model: str, profile: str) -> str:
    """Kubernetes name of the workload serving ``model`` on ``profile``.

    The Kubernetes backend's own rule (``act/k8s_render.workload_name``):
    ``resnet`` on ``1g.10gb`` -> ``resnet-1g-10gb``, ``+me`` -> ``-me``; a
    multinode model's LeaderWorkerSet is named after the model.
    """
    return workload_name(model, profile)


def rfc3339(t_s: float) -> str:
    """Kubernetes ``metav1.Time`` (seconds precision, UTC, ``Z``)."""
    return _rfc3339(int(t_s))


@lru_cache(maxsize=256)  # a tick's values share a handful of sample times
def _rfc3339(t: int) -> str:
    return datetime.fromtimestamp(t, tz=timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def finite(x: float | None) -> float | None:
    """``x`` when it is a finite number, else None (JSON has no NaN)."""
    if x is None or isinstance(x, bool):
        return None
    try:
        xf = float(x)
    except (TypeError, ValueError):
        return None
    return xf if math.isfinite(xf) else None


def _placements(layout: Sequence[Placement] | None) -> list[dict[str, Any]] | None:
    if layout is None:
        return None
    return [{"profile": p.profile, "start": p.start} for p in sorted(layout)]


def plan_json(plan: Plan | None) -> dict[str, Any] | None:
    if plan is None:
        return None
    return {
        "t_s": plan.t_s,
        "desired": [
            {"model": m, "profile": p, "deployment": deployment_name(m, p), "replicas": int(n)}
            for (m, p), n in sorted(plan.desired.items())
        ],
        "assignments": [
            {"model": a.model, "profile": a.profile, "gpu": a.gpu, "start": a.start, "replica": a.replica}
            for a in plan.assignments
        ],
        "layouts": {g: _placements(lay) for g, lay in sorted(plan.layouts.items())},
        "actions": [
            {
                "kind": a.kind.value,
                "reason": a.reason.value,
                "gpu": a.gpu,
                "model": a.model,
                "profile": a.profile,
                "start": a.start,
                "replica": a.replica,
                "layout": _placements(a.layout),
            }
            for a in plan.actions
        ],
        "shortfall": {m: finite(v) for m, v in sorted(plan.shortfall.items())},
        "cost": {
            "gpus_used": plan.cost.gpus_used,
            "slices_used": plan.cost.slices_used,
            "instances_created": plan.cost.instances_created,
            "instances_destroyed": plan.cost.instances_destroyed,
            "gpus_repartitioned": plan.cost.gpus_repartitioned,
        },
        "reasons": {m: [r.value for r in rs] for m, rs in sorted(plan.reasons.items())},
        "capacity_rps": {m: finite(v) for m, v in sorted(plan.capacity_rps.items())},
        "target_rps": {m: finite(v) for m, v in sorted(plan.target_rps.items())},
    }


def _instances(product: Any, layout: Sequence[Placement]) -> list[dict[str, Any]]:
    """Placements with their geometry (compute slices, memory slots) for drawing."""
    out = []
    for p in layout:
        prof = product.profiles.get(p.profile) if product is not None else None
        out.append({
            "profile": p.profile,
            "start": p.start,
            "compute": prof.compute if prof else None,
            "memory_slots": prof.mem_slots if prof else None,
        })
    return out


def cluster_json(cluster: ClusterState, plan: Plan | None) -> dict[str, Any]:
    """GPUs with their current layout, the planned one when it differs, and every replica."""
    gpus = []
    for g in cluster.gpus:
        current = sorted(g.layout)
        planned = sorted(plan.layouts[g.id]) if plan is not None and g.id in plan.layouts else None
        product = PRODUCTS.get(g.product)
        gpus.append(
            {
                "id": g.id,
                "node": g.node,
                "product": g.product,
                "compute_slices": product.compute_slices if product else 7,
                "memory_slots": product.mem_slots if product else 8,
                "mig_enabled": g.mig_enabled,
                "emulated": g.emulated,
                "reserved_by": g.reserved_by,
                "layout": _placements(current),
                "planned_layout": _placements(planned) if planned is not None else None,
                "repartition_pending": planned is not None and planned != current,
                "instances": _instances(product, current),
                "planned_instances": _instances(product, planned) if planned is not None else None,
            }
        )
    replicas = [
        {
            "id": r.id,
            "model": r.model,
            "profile": r.profile,
            "gpu": r.gpu,
            "start": r.start,
            "state": r.state.value,
            "since_s": r.since_s,
            "deployment": deployment_name(r.model, r.profile),
        }
        for r in cluster.replicas
    ]
    return {"gpus": gpus, "replicas": replicas}


def models_json(
    models: Sequence[ModelSpec],
    observation: Observation | None,
    plan: Plan | None,
    cluster: ClusterState,
    slo_p99_ms: Mapping[str, float],
) -> list[dict[str, Any]]:
    """Per model: signals, SLO, replicas by profile and state, last decision."""
    out = []
    # one pass over replicas and plan (not one per model): 1,000 models x 5,000 replicas stays cheap
    counts: dict[str, dict[str, dict[str, int]]] = {}
    for r in cluster.replicas:
        by_profile = counts.setdefault(r.model, {})
        by_profile.setdefault(r.profile, {s.value: 0 for s in ReplicaState})[r.state.value] += 1
    planned: dict[str, dict[str, int]] = {}
    if plan is not None:
        for (m, p), n in sorted(plan.desired.items()):
            planned.setdefault(m, {})[p] = int(n)
    for spec in models:
        sig = observation.models.get(spec.name) if observation is not None else None
        by_profile = counts.get(spec.name, {})
        desired = planned.get(spec.name, {}) if plan is not None else None
        out.append(
            {
                "name": spec.name,
                "backend": spec.backend,
                "min_replicas": spec.min_replicas,
                "max_replicas": spec.max_replicas,
                "slo_p99_ms": finite(slo_p99_ms.get(spec.name)),
                "request_rate": finite(sig.request_rate) if sig else None,
                "p99_ms": finite(sig.p99_ms) if sig else None,
                "queue_compute_ratio": finite(sig.queue_compute_ratio) if sig else None,
                "signals_t_s": sig.t_s if sig else None,
                "replicas": by_profile,
                "desired": desired,
                "reasons": [r.value for r in plan.reasons.get(spec.name, ())] if plan is not None else [],
                # a model the plan covers without a shortfall entry has none (0); no plan: unknown
                "shortfall_rps": finite(plan.shortfall.get(spec.name, 0.0))
                if plan is not None and spec.name in planned
                else None,
            }
        )
    return out


def slo_from_status(status: Mapping[str, Any] | None) -> dict[str, float]:
    """Best-effort p99 SLOs from a ``migscale status --json`` dict (``models[].slo.p99_ms``)."""
    out: dict[str, float] = {}
    if not isinstance(status, Mapping):
        return out
    models = status.get("models")
    if isinstance(models, Mapping):  # {name: {...}}
        items = [dict(v, name=k) if isinstance(v, Mapping) and "name" not in v else v for k, v in models.items()]
    elif isinstance(models, list):  # [{name: ..., ...}]
        items = models
    else:
        items = []
    for m in items:
        if not isinstance(m, Mapping) or not isinstance(m.get("name"), str):
            continue
        for key in ("slo_p99_ms", "p99_slo_ms"):
            v = finite(m.get(key))
            if v is not None:
                out[m["name"]] = v
        slo = m.get("slo")
        if isinstance(slo, Mapping) and finite(slo.get("p99_ms")) is not None:
            out[m["name"]] = float(slo["p99_ms"])
    return out
