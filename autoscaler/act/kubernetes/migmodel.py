"""MigModel objects <-> models.yaml entries, and the status the controller writes on them.

The pure half of the MigModel resource (no I/O; ``crd.py`` defines the
resource). ``to_migmodel`` turns a validated ``ModelConfig`` into the object a
team applies (``migscale render --migmodels``); ``from_migmodel`` turns an
object read back (``kubectl get migmodels -o yaml``, or a watch event) into a
``ModelConfig`` plus problems, each naming the field as it sits in the
object (``spec.slo.p99_ms``, ``metadata.name``) and its value, as ``migscale
validate`` names fields of models.yaml; ``models_from_migmodels`` does it for
a list and adds the checks a list needs (one name, one namespace).

``migmodel_status`` builds ``status`` from one model's numbers: ready and
desired replicas by profile, req/s served, p99, the last decision and the
four conditions in the metav1.Condition shape. A condition keeps its
``lastTransitionTime`` while its status holds, and the last decision keeps
its time while the desired count holds, so two ticks that saw the same thing
write the same body (a caller can skip the write).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from enum import Enum
from typing import Any

from pydantic import ValidationError

from autoscaler.act.kubernetes.crd import API_VERSION, KIND, Condition, LastDecision, MigModelStatus
from autoscaler.config.io import format_errors, short
from autoscaler.config.schema import ModelConfig
from autoscaler.policy.types import Reason

Obj = dict[str, Any]

# ---------------------------------------------------------------- models.yaml entry -> MigModel


def spec_of(model: ModelConfig, capacity: Mapping[str, float] | None = None) -> Obj:
    """The ``spec`` of ``model``: the fields its file set, ``name`` left to metadata.

    ``capacity``: the model's full req/s table (``capacity_file`` merged with
    ``capacity``) to carry inline instead of the file, which the controller
    in the cluster cannot read from the author's disk.
    """
    spec = model.model_dump(mode="json", exclude_unset=True, exclude_none=True)
    spec.pop("name", None)
    if capacity is not None:
        spec.pop("capacity_file", None)
        spec["capacity"] = dict(capacity)
    return plain_numbers(spec)


def plain_numbers(value: Any) -> Any:
    """Whole floats as ints (``150.0`` -> ``150``), so the YAML reads as people write it.

    pydantic stores a ``float`` field's ``150`` as ``150.0``; both mean the
    same to the CRD schema (``type: number``) and to ``ModelConfig``.
    """
    if isinstance(value, dict):
        return {k: plain_numbers(v) for k, v in value.items()}
    if isinstance(value, list):
        return [plain_numbers(v) for v in value]
    if isinstance(value, float) and value.is_integer() and abs(value) < 2**53:
        return int(value)
    return value


def to_migmodel(
    model: ModelConfig,
    namespace: str,
    capacity: Mapping[str, float] | None = None,
    labels: Mapping[str, str] | None = None,
) -> Obj:
    meta: Obj = {"name": model.name, "namespace": namespace}
    if labels:
        meta["labels"] = dict(labels)
    return {"apiVersion": API_VERSION, "kind": KIND, "metadata": meta, "spec": spec_of(model, capacity)}


# ---------------------------------------------------------------- MigModel -> models.yaml entry


def _relocate(loc: list) -> list:
    """A location inside ModelConfig -> the same field inside the MigModel object."""
    if loc[:1] == ["name"]:
        return ["metadata", "name", *loc[1:]]
    return ["spec", *loc]


def from_migmodel(obj: Any) -> tuple[ModelConfig | None, list[str]]:
    """The ``ModelConfig`` a MigModel object declares, or None and one line per problem.

    Lines read ``spec.min_replicas: must be <= max_replicas (2), got 5``. What
    Kubernetes adds (``metadata.uid``, ``status``, annotations) is ignored.
    """
    if not isinstance(obj, dict):
        return None, [f"(object): must be a mapping, got {short(obj, 40)}"]
    problems: list[str] = []
    if obj.get("apiVersion") != API_VERSION or obj.get("kind") != KIND:
        problems.append(
            f"apiVersion/kind: must be {API_VERSION} {KIND}, "
            f"got {short(obj.get('apiVersion'))} {short(obj.get('kind'))}"
        )
    meta = obj.get("metadata")
    name = meta.get("name") if isinstance(meta, dict) else None
    spec = obj.get("spec")
    if name is None:
        problems.append(f"metadata.name: required field is missing, got {short(meta, 40)}")
    if not isinstance(spec, dict):
        problems.append(
            f"spec: {'required field is missing' if spec is None else 'must be a mapping'}, "
            f"got {short(spec, 40)}"
        )
    elif "name" in spec:
        problems.append(
            f"spec.name: unknown key (the model's name is metadata.name), got {short(spec['name'])}"
        )
    if problems:
        return None, problems
    try:
        return ModelConfig.model_validate({"name": name, **spec}), []
    except ValidationError as exc:
        return None, format_errors(exc, ModelConfig, relocate=_relocate)
    except RecursionError:
        return None, ["spec: structure too deeply nested"]


def list_items(doc: Any) -> list[Any] | None:
    """The objects of a ``kind: List`` / ``MigModelList`` (what ``kubectl get -o yaml`` prints),
    ``[doc]`` for a single object, None when ``doc`` is neither."""
    if (
        isinstance(doc, dict)
        and isinstance(doc.get("items"), list)
        and str(doc.get("kind", "")).endswith("List")
    ):
        return list(doc["items"])
    if isinstance(doc, dict) and "kind" in doc:
        return [doc]
    return None


def _namespace(obj: Any) -> str | None:
    meta = obj.get("metadata") if isinstance(obj, dict) else None
    ns = meta.get("namespace") if isinstance(meta, dict) else None
    return str(ns) if ns else None


def models_from_migmodels(objs: Sequence[Any], namespace: str | None = None) -> tuple[Obj | None, list[str]]:
    """A models.yaml document (``{"models": [...]}``) from MigModel objects, or None and problems.

    Problems are prefixed with the object's place, ``items[3].spec.slo.p99_ms:
    ...``. ``namespace`` keeps only that namespace's objects; without it the
    objects must share one (models.yaml has a single namespace: cluster.yaml's).
    Entries leave out what equals the default, so the file stays short.
    """
    problems: list[str] = []
    chosen = [(i, obj) for i, obj in enumerate(objs) if namespace is None or _namespace(obj) == namespace]
    if not chosen:
        where = f" in namespace {namespace!r}" if namespace else ""
        return None, [f"items: no MigModel{where}, got {len(objs)} object(s)"]
    spaces = sorted({ns for _, obj in chosen if (ns := _namespace(obj))})
    if namespace is None and len(spaces) > 1:
        many = f"items: objects from {len(spaces)} namespaces ({', '.join(spaces)}); models.yaml has one"
        return None, [f"{many}, pick it with --namespace, got {spaces!r}"]
    entries: list[Obj] = []
    seen: dict[str, int] = {}
    for i, obj in chosen:
        model, errs = from_migmodel(obj)
        problems += [f"items[{i}].{e}" if not e.startswith("(") else f"items[{i}]: {e}" for e in errs]
        if model is None:
            continue
        if model.name in seen:
            problems.append(
                f"items[{i}].metadata.name: duplicate model name (also items[{seen[model.name]}]), "
                f"got {model.name!r}"
            )
            continue
        seen[model.name] = i
        entries.append(plain_numbers(model.model_dump(mode="json", exclude_defaults=True)))
    if problems:
        return None, problems
    return {"models": entries}, []


# ---------------------------------------------------------------- status


class ConditionType(str, Enum):
    READY = "Ready"
    SCALING_LIMITED = "ScalingLimited"
    SLO_MET = "SLOMet"
    CONFIG_VALID = "ConfigValid"


class ConditionReason(str, Enum):
    MINIMUM_REPLICAS_READY = "MinimumReplicasReady"
    MINIMUM_REPLICAS_UNAVAILABLE = "MinimumReplicasUnavailable"
    SCALED_TO_ZERO = "ScaledToZero"
    WITHIN_SLO = "WithinSLO"
    SLO_VIOLATED = "SLOViolated"
    METRICS_UNAVAILABLE = "MetricsUnavailable"
    INSUFFICIENT_CAPACITY = "InsufficientCapacity"
    TOO_MANY_REPLICAS = "TooManyReplicas"
    TOO_FEW_REPLICAS = "TooFewReplicas"
    RATE_LIMITED = "RateLimited"
    CHURN_BUDGET = "ChurnBudget"
    DESIRED_WITHIN_RANGE = "DesiredWithinRange"
    SPEC_ACCEPTED = "SpecAccepted"
    INVALID_SPEC = "InvalidSpec"


# The policy's reasons that mean "the count is not what demand alone asks for",
# in the order one is reported when several hold (HPA's ScalingLimited reasons, plus ours).
_LIMITS: tuple[tuple[Reason, ConditionReason, str], ...] = (
    (
        Reason.SHORTFALL,
        ConditionReason.INSUFFICIENT_CAPACITY,
        "the cluster cannot place the replicas demand needs",
    ),
    (Reason.MAX_REPLICAS, ConditionReason.TOO_MANY_REPLICAS, "demand asks for more than max_replicas"),
    (Reason.MIN_REPLICAS, ConditionReason.TOO_FEW_REPLICAS, "demand asks for fewer than min_replicas"),
    (Reason.RATE_LIMITED, ConditionReason.RATE_LIMITED, "the scale_up/scale_down policies capped the change"),
    (
        Reason.CHURN_BUDGET,
        ConditionReason.CHURN_BUDGET,
        "the change waits for the churn budget of a later tick",
    ),
)


@dataclass(frozen=True)
class ModelReport:
    """One model's numbers from one tick, as the controller knows them; None = not known."""

    generation: int | None
    slo_p99_ms: float
    min_replicas: int
    ready: Mapping[str, int]  # profile -> ready replicas ("whole" for a multinode group)
    desired: Mapping[str, int]  # profile -> replicas the plan wants
    served_rps: float | None = None
    p99_ms: float | None = None
    reasons: tuple[Reason, ...] = ()
    shortfall_rps: float = 0.0
    config_problems: tuple[str, ...] = ()
    in_force: bool = True  # some spec of this object is deployed (False: refused from its first generation)


def rfc3339(t_s: float) -> str:
    return datetime.fromtimestamp(t_s, timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def camel(reason: Reason) -> str:
    """``scale_up_demand`` -> ``ScaleUpDemand`` (condition and decision reasons are CamelCase)."""
    return "".join(part.capitalize() for part in reason.value.split("_"))


def _condition(kind: ConditionType, ok: bool | None, reason: ConditionReason, message: str) -> tuple:
    status = "Unknown" if ok is None else ("True" if ok else "False")
    return kind.value, status, reason.value, message[:32768]


def _conditions(r: ModelReport) -> list[tuple]:
    ready, desired = sum(r.ready.values()), sum(r.desired.values())
    need = max(1, r.min_replicas)
    counts = f"{ready}/{desired} replicas ready (min_replicas {r.min_replicas})"
    if desired == 0 and ready == 0:
        ready_c = _condition(ConditionType.READY, False, ConditionReason.SCALED_TO_ZERO, counts)
    elif ready >= need:
        ready_c = _condition(ConditionType.READY, True, ConditionReason.MINIMUM_REPLICAS_READY, counts)
    else:
        ready_c = _condition(ConditionType.READY, False, ConditionReason.MINIMUM_REPLICAS_UNAVAILABLE, counts)
    limited = [(why, text) for reason, why, text in _LIMITS if reason in r.reasons]
    if r.shortfall_rps > 0 and not any(why is ConditionReason.INSUFFICIENT_CAPACITY for why, _ in limited):
        limited.insert(
            0, (ConditionReason.INSUFFICIENT_CAPACITY, "the cluster cannot place the replicas demand needs")
        )
    if r.shortfall_rps > 0:
        limited = [
            (
                w,
                f"{t} ({r.shortfall_rps:.1f} req/s unserved)"
                if w is ConditionReason.INSUFFICIENT_CAPACITY
                else t,
            )
            for w, t in limited
        ]
    if limited:
        scaling = _condition(
            ConditionType.SCALING_LIMITED, True, limited[0][0], "; ".join(t for _, t in limited)
        )
    else:
        scaling = _condition(
            ConditionType.SCALING_LIMITED,
            False,
            ConditionReason.DESIRED_WITHIN_RANGE,
            "the replica count follows demand",
        )
    if r.p99_ms is None:
        slo = _condition(
            ConditionType.SLO_MET,
            None,
            ConditionReason.METRICS_UNAVAILABLE,
            f"no p99 measurement (SLO {r.slo_p99_ms:g} ms)",
        )
    elif r.p99_ms <= r.slo_p99_ms:
        slo = _condition(
            ConditionType.SLO_MET,
            True,
            ConditionReason.WITHIN_SLO,
            f"p99 {r.p99_ms:.0f} ms <= SLO {r.slo_p99_ms:g} ms",
        )
    else:
        slo = _condition(
            ConditionType.SLO_MET,
            False,
            ConditionReason.SLO_VIOLATED,
            f"p99 {r.p99_ms:.0f} ms > SLO {r.slo_p99_ms:g} ms",
        )
    if r.config_problems:
        valid = _condition(
            ConditionType.CONFIG_VALID,
            False,
            ConditionReason.INVALID_SPEC,
            "; ".join(r.config_problems)
            + (" (the last valid spec stays in force)" if r.in_force else " (no spec of it is in force)"),
        )
    else:
        valid = _condition(
            ConditionType.CONFIG_VALID, True, ConditionReason.SPEC_ACCEPTED, "the spec is in force"
        )
    return [ready_c, scaling, slo, valid]


def _profiles_text(ready: Mapping[str, int], desired: Mapping[str, int]) -> str:
    names = sorted(set(ready) | set(desired))
    return ", ".join(f"{p} {ready.get(p, 0)}/{desired.get(p, 0)}" for p in names)[:1024]


def _valid_decision(value: Any) -> LastDecision | None:
    try:
        return LastDecision.model_validate(value) if isinstance(value, Mapping) else None
    except ValidationError:  # a hand-edited status: start a fresh record rather than fail the write
        return None


def migmodel_status(report: ModelReport, previous: Mapping[str, Any] | None, now_s: float) -> Obj:
    """The ``status`` of a MigModel for ``report``, carrying over what did not change from ``previous``."""
    prev = previous or {}
    before = {c.get("type"): c for c in prev.get("conditions") or () if isinstance(c, Mapping)}
    now = rfc3339(now_s)
    conditions = []
    for kind, status, reason, message in _conditions(report):
        old = before.get(kind)
        since = old.get("lastTransitionTime") if old and old.get("status") == status else None
        conditions.append(
            Condition(
                type=kind,
                status=status,
                observedGeneration=report.generation,
                lastTransitionTime=since or now,
                reason=reason,
                message=message,
            )
        )
    ready, desired = sum(report.ready.values()), sum(report.desired.values())
    decision = _valid_decision(prev.get("lastDecision"))
    if decision is None or decision.desiredReplicas != desired:
        causes = [camel(x) for x in report.reasons if x is not Reason.KEEP] or [camel(Reason.KEEP)]
        was = prev.get("desiredReplicas")
        change = f"{was} -> {desired} replicas" if isinstance(was, int) else f"{desired} replicas"
        decision = LastDecision(
            time=now, desiredReplicas=desired, reason=causes[0], message=f"{change}: {', '.join(causes)}"
        )
    status = MigModelStatus(
        observedGeneration=report.generation,
        readyReplicas=ready,
        desiredReplicas=desired,
        replicas=[
            {"profile": p, "ready": report.ready.get(p, 0), "desired": report.desired.get(p, 0)}
            for p in sorted(set(report.ready) | set(report.desired))
        ],
        profiles=_profiles_text(report.ready, report.desired),
        servedRps=None if report.served_rps is None else round(report.served_rps, 1),
        p99Ms=None if report.p99_ms is None else round(report.p99_ms, 1),
        lastDecision=decision,
        conditions=conditions,
    )
    return status.model_dump(mode="json", exclude_none=True)
