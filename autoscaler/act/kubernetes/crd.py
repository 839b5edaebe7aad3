"""The MigModel CustomResourceDefinition, generated from the pydantic models of ``models.yaml``.

Part of the "act" edge's pure half (no I/O): a serving team declares a model
as a namespaced ``MigModel`` (``migscale.io/v1alpha1``) whose ``spec`` is one
``models.yaml`` entry and whose ``status`` the controller writes. The CRD's
OpenAPI v3 schema is not written by hand: ``structural()`` turns the JSON
Schema pydantic emits for ``ModelConfig`` (the same model ``migscale
validate`` runs) into a Kubernetes *structural* schema, and the status schema
comes from ``MigModelStatus`` below the same way. So a field added to
``models.yaml`` reaches the API server's validation with the next
``migscale crd``, and a test fails until ``k8s/base/migmodel-crd.yaml`` is
regenerated.

What the conversion does (Kubernetes CRD docs, "Specifying a structural
schema" and "Validation"): ``$ref`` is inlined; ``Optional[X]`` (pydantic's
``anyOf: [X, null]``) becomes X with ``nullable: true``; JSON Schema 2020's
numeric ``exclusiveMinimum: 0`` becomes OpenAPI 3.0's ``minimum: 0,
exclusiveMinimum: true``; ``additionalProperties: false`` is dropped (the CRD
API forbids it; unknown fields are pruned, or refused under
``kubectl --validate=strict``); ``uniqueItems`` (forbidden in CRDs) becomes
``x-kubernetes-list-type: set``; ``propertyNames.enum`` (not in the CRD
schema language) becomes a CEL rule; ``x-kubernetes-*`` extensions pass
through (the CEL twins of the cross-field checks live beside them in
``config/schema.py``). Anything else the converter does not know is an error,
not a silent drop.
"""

from __future__ import annotations

import copy
import json
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from autoscaler.config.io import dump_yaml
from autoscaler.config.schema import ModelConfig

GROUP = "migscale.io"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"
KIND = "MigModel"
PLURAL = "migmodels"
SINGULAR = "migmodel"
SHORT_NAMES = ("mm",)
CRD_NAME = f"{PLURAL}.{GROUP}"

Obj = dict[str, Any]


class SchemaError(ValueError):
    """A construct of the pydantic JSON Schema that has no structural-schema equivalent."""


# ---------------------------------------------------------------- status types


class _Wire(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


# metav1.Condition, with the validation its generated CRD schemas carry (k8s.io/apimachinery).
_CONDITION_TYPE = (
    r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
    r"(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])$"
)
_CONDITION_REASON = r"^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$"
_DATE_TIME = {"format": "date-time"}


class Condition(_Wire):
    """One condition in the standard metav1.Condition shape."""

    type: str = Field(
        max_length=316, pattern=_CONDITION_TYPE, description="Ready, ScalingLimited, SLOMet, ConfigValid"
    )
    status: Literal["True", "False", "Unknown"]
    observedGeneration: int | None = Field(default=None, ge=0, description="spec generation this was set for")
    lastTransitionTime: str = Field(json_schema_extra=_DATE_TIME, description="when status last changed")
    reason: str = Field(
        min_length=1, max_length=1024, pattern=_CONDITION_REASON, description="CamelCase cause"
    )
    message: str = Field(max_length=32768, description="for people")


class ProfileReplicas(_Wire):
    profile: str = Field(max_length=32, description="MIG profile, or 'whole' for a multinode group")
    ready: int = Field(ge=0)
    desired: int = Field(ge=0)


class LastDecision(_Wire):
    time: str = Field(json_schema_extra=_DATE_TIME)
    desiredReplicas: int = Field(ge=0, description="replicas the controller decided on")
    reason: str = Field(
        min_length=1, max_length=1024, pattern=_CONDITION_REASON, description="the main cause"
    )
    message: str = Field(max_length=32768, description="every cause, and the change")


class MigModelStatus(_Wire):
    """What the controller reports; a number it does not know is absent, never 0."""

    observedGeneration: int | None = Field(default=None, ge=0, description="spec generation last acted on")
    readyReplicas: int | None = Field(default=None, ge=0)
    desiredReplicas: int | None = Field(default=None, ge=0)
    replicas: list[ProfileReplicas] | None = Field(
        default=None,
        max_length=64,
        description="ready and desired replicas by MIG profile",
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["profile"]},
    )
    profiles: str | None = Field(default=None, max_length=1024, description="e.g. '1g.10gb 2/2, 3g.40gb 0/1'")
    servedRps: float | None = Field(default=None, ge=0, description="requests/s served")
    p99Ms: float | None = Field(
        default=None, ge=0, description="measured p99 latency, ms (SLO: spec.slo.p99_ms)"
    )
    lastDecision: LastDecision | None = None
    conditions: list[Condition] | None = Field(
        default=None,
        max_length=16,
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["type"]},
    )


# ---------------------------------------------------------------- JSON Schema -> structural schema

_PLAIN = {
    "type", "description", "enum", "pattern", "format", "minimum", "maximum",
    "minLength", "maxLength", "minItems", "maxItems", "minProperties", "maxProperties", "required",
}  # fmt: skip
_DROP = {"title", "$defs"}


def structural(schema: Obj) -> Obj:
    """A Kubernetes structural schema equal in meaning to a pydantic JSON Schema (see module doc)."""
    return _convert(schema, schema.get("$defs", {}))


def _convert(node: Obj, defs: Obj) -> Obj:
    out = _convert_node(node, defs)
    return {k: out[k] for k in sorted(out, key=_reading_order)}


def _convert_node(node: Obj, defs: Obj) -> Obj:
    node = dict(node)
    if "$ref" in node:
        ref = node.pop("$ref")
        base = _convert(defs[ref.rsplit("/", 1)[-1]], defs)
        return {**base, **_convert(node, defs)} if node else base
    if "allOf" in node:  # pydantic wraps a $ref that has siblings in a one-element allOf
        (only,) = node.pop("allOf")
        return {**_convert(only, defs), **_convert(node, defs)}
    if "anyOf" in node:
        branches = node.pop("anyOf")
        others = [b for b in branches if b != {"type": "null"}]
        if len(others) != 1:
            raise SchemaError(
                f"anyOf other than Optional[X] has no structural form: {json.dumps(branches)[:200]}"
            )
        out = _convert(others[0], defs)
        if len(others) < len(branches):
            out["nullable"] = True
        rest = _convert(node, defs)
        for key in ("x-kubernetes-validations",):  # rules of both levels apply
            if key in out and key in rest:
                rest[key] = out[key] + rest[key]
        return {**out, **rest}
    out: Obj = {}
    for key, value in node.items():
        if key in _DROP:
            continue
        if key in _PLAIN:
            out[key] = copy.deepcopy(value)
        elif key == "const":
            out["enum"] = [value]
        elif key == "default":
            if value is not None:  # a null default is "absent", which needs no default
                out["default"] = copy.deepcopy(value)
        elif key in ("exclusiveMinimum", "exclusiveMaximum"):
            bound = "minimum" if key == "exclusiveMinimum" else "maximum"
            out[bound] = value
            out[key] = True
        elif key == "properties":
            out["properties"] = {k: _convert(v, defs) for k, v in value.items()}
        elif key == "items":
            out["items"] = _convert(value, defs)
        elif key == "additionalProperties":
            if isinstance(value, dict):
                out["additionalProperties"] = _convert(value, defs)
            # false: the CRD API forbids it; pruning / strict field validation does its job
        elif key == "uniqueItems":
            if value:
                out["x-kubernetes-list-type"] = "set"
        elif key == "propertyNames":
            out.setdefault("x-kubernetes-validations", []).append(_key_rule(value))
        elif key.startswith("x-kubernetes-"):
            out[key] = copy.deepcopy(value) + out.get(key, []) if isinstance(value, list) else value
        else:
            raise SchemaError(f"JSON Schema keyword {key!r} has no structural-schema equivalent")
    return out


_FIRST = ("type", "nullable", "description", "default", "enum")


def _reading_order(key: str) -> tuple[int, str]:
    """type and description first, nested schemas and rules last: the generated YAML is read by people."""
    if key in _FIRST:
        return (_FIRST.index(key), "")
    return (
        len(_FIRST)
        + (key in ("properties", "items", "additionalProperties", "required"))
        + 2 * key.startswith("x-"),
        key,
    )


def _key_rule(names: Obj) -> Obj:
    """``propertyNames: {enum: [...]}`` as a CEL rule on the map; the message quotes one bad key."""
    if set(names) - {"enum", "description"} or "enum" not in names:
        raise SchemaError(f"propertyNames supports only an enum, got {names}")
    allowed = json.dumps(list(names["enum"]))
    stem = names.get("description", "not an allowed key")
    return {
        "rule": f"self.all(k, k in {allowed})",
        "messageExpression": (
            f'{json.dumps(stem + ", got ")} + "\'" + self.filter(k, !(k in {allowed}))[0] + "\'"'
        ),
    }


# ---------------------------------------------------------------- the CRD


def spec_schema() -> Obj:
    """``spec``: one models.yaml entry without ``name`` (the object's ``metadata.name``)."""
    out = structural(ModelConfig.model_json_schema())
    out["properties"].pop("name")
    out["required"] = [r for r in out.get("required", []) if r != "name"]
    out["description"] = "One models.yaml entry (the model's name is metadata.name)."
    return out


def name_schema() -> Obj:
    """``metadata.name``: the model name's rules (a DNS-1123 label); a CRD may restrict only it."""
    return structural(ModelConfig.model_json_schema()["properties"]["name"])


def status_schema() -> Obj:
    out = structural(MigModelStatus.model_json_schema())
    out["description"] = "Written by the migscale controller through the status subresource."
    return out


PRINTER_COLUMNS: tuple[Obj, ...] = (
    {"name": "Ready", "type": "string", "jsonPath": '.status.conditions[?(@.type=="Ready")].status'},
    {"name": "Profiles", "type": "string", "jsonPath": ".status.profiles",
     "description": "ready/desired replicas per MIG profile"},
    {"name": "Req/s", "type": "number", "jsonPath": ".status.servedRps", "description": "requests/s served"},
    {"name": "P99", "type": "number", "jsonPath": ".status.p99Ms", "description": "measured p99, ms"},
    {"name": "SLO", "type": "number", "jsonPath": ".spec.slo.p99_ms", "description": "p99 target, ms"},
    {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
    {"name": "Backend", "type": "string", "jsonPath": ".spec.backend", "priority": 1},
    {"name": "Decision", "type": "string", "jsonPath": ".status.lastDecision.reason", "priority": 1},
)  # fmt: skip


def build_crd() -> Obj:
    """The MigModel CustomResourceDefinition (apiextensions.k8s.io/v1) as a dict."""
    schema: Obj = {
        "type": "object",
        "description": "A model migscale serves on MIG slices (or multinode groups) in this namespace.",
        "required": ["spec"],
        "properties": {
            "apiVersion": {"type": "string"},
            "kind": {"type": "string"},
            "metadata": {"type": "object", "properties": {"name": name_schema()}},
            "spec": spec_schema(),
            "status": status_schema(),
        },
    }
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": CRD_NAME, "labels": {"app.kubernetes.io/name": "migscale"}},
        "spec": {
            "group": GROUP,
            "scope": "Namespaced",
            "names": {
                "kind": KIND,
                "listKind": f"{KIND}List",
                "plural": PLURAL,
                "singular": SINGULAR,
                "shortNames": list(SHORT_NAMES),
                "categories": ["migscale"],
            },
            "versions": [
                {
                    "name": VERSION,
                    "served": True,
                    "storage": True,
                    "subresources": {"status": {}},
                    "additionalPrinterColumns": [dict(c) for c in PRINTER_COLUMNS],
                    "schema": {"openAPIV3Schema": schema},
                }
            ],
        },
    }


CRD_HEADER = (
    "# The MigModel CustomResourceDefinition. GENERATED from the pydantic models of models.yaml\n"
    "# (autoscaler/act/kubernetes/crd.py); do not edit.\n"
    "# Regenerate: migscale crd > k8s/base/migmodel-crd.yaml\n"
)


def crd_yaml() -> str:
    return CRD_HEADER + dump_yaml(build_crd(), width=100)
