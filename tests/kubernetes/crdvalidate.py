"""Validate a custom resource the way the API server does, as far as Python can: schema, defaults, CEL.

The emulation stands in for a kube-apiserver, which cannot run on this
machine. It follows the documented order for a create (Kubernetes docs,
"Extend the Kubernetes API with CustomResourceDefinitions"): unknown fields
are reported (``kubectl --validate=strict``, the default since 1.27), null
values of non-nullable fields are pruned, ``default``s are applied, the
OpenAPI v3 schema is checked (``nullable``, OpenAPI 3.0's boolean
``exclusiveMinimum``, ``x-kubernetes-list-type: set``/``map`` uniqueness),
and then, unless a value had the wrong type (the API server's "blocking"
errors), every ``x-kubernetes-validations`` rule is evaluated with
cel-python on values typed by the schema (``number`` is a CEL double even
when written ``150``; a null field is absent), its ``messageExpression`` or
``message`` reported at the rule's ``fieldPath``.

Not emulated: CEL cost estimation and type-checking at CRD creation (the
tests check instead that every rule compiles and every fieldPath names a
field), ``format`` checks, ratcheting on update. Problems read
``spec.min_replicas: <message>, got <value>`` -- field paths as ``migscale
validate`` writes them, which is how a user compares the two.

``structural_problems`` checks the rules of a structural schema.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from typing import Any

import celpy
import jsonschema
from celpy import celtypes

Obj = dict[str, Any]


def _join(path: str, part: str | int) -> str:
    if isinstance(part, int):
        return f"{path}[{part}]"
    return f"{path}.{part}" if path else str(part)


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


# ---------------------------------------------------------------- walking the object along the schema


def _children(schema: Obj, value: Any) -> Iterator[tuple[str | int, Obj, Any]]:
    if isinstance(value, dict):
        props = schema.get("properties")
        if props is not None:
            for k, sub in props.items():
                if k in value:
                    yield k, sub, value[k]
        elif isinstance(schema.get("additionalProperties"), dict):
            for k, v in value.items():
                yield k, schema["additionalProperties"], v
    elif isinstance(value, list) and isinstance(schema.get("items"), dict):
        for i, v in enumerate(value):
            yield i, schema["items"], v


def _unknown_fields(schema: Obj, value: Any, path: str, out: list[str]) -> None:
    if isinstance(value, dict) and "properties" in schema and not schema.get("x-kubernetes-preserve-unknown-fields"):
        for k in value:
            if k not in schema["properties"] and not (path == "" and k in ("apiVersion", "kind", "metadata")):
                if path == "metadata":
                    continue  # ObjectMeta: the API server checks it itself
                out.append(f"{_join(path, k)}: unknown field, got {_short(value[k])}")
    for k, sub, v in _children(schema, value):
        _unknown_fields(sub, v, _join(path, k), out)


def _prune_and_default(schema: Obj, value: Any) -> None:
    if isinstance(value, dict) and "properties" in schema:
        for k, sub in schema["properties"].items():
            if k in value and value[k] is None and not sub.get("nullable"):
                del value[k]  # "null values for fields that are not nullable are pruned before defaulting"
            if k not in value and "default" in sub:
                value[k] = copy.deepcopy(sub["default"])
        for k in [k for k in value if k not in schema["properties"]]:
            if not schema.get("x-kubernetes-preserve-unknown-fields") and k not in ("apiVersion", "kind", "metadata"):
                del value[k]  # pruning (reported already as an unknown field)
    for _, sub, v in _children(schema, value):
        _prune_and_default(sub, v)


def default(schema: Obj, obj: Obj) -> Obj:
    """A copy of ``obj`` pruned and defaulted as the API server stores it."""
    out = copy.deepcopy(obj)
    _prune_and_default(schema, out)
    return out


# ---------------------------------------------------------------- OpenAPI v3 -> JSON Schema draft 4


def _draft4(schema: Any) -> Any:
    """nullable -> a "null" type; list-type set/map uniqueness is checked separately."""
    if isinstance(schema, list):
        return [_draft4(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: _draft4(v) for k, v in schema.items() if not k.startswith("x-kubernetes-")}
    for key in ("properties",):
        if key in schema:
            out[key] = {k: _draft4(v) for k, v in schema[key].items()}
    if schema.get("nullable") and "type" in out:
        out["type"] = [out["type"], "null"]
        if "enum" in out:
            out["enum"] = [*out["enum"], None]
    out.pop("nullable", None)
    return out


def _list_problems(schema: Obj, value: Any, path: str, out: list[str]) -> None:
    kind = schema.get("x-kubernetes-list-type")
    if isinstance(value, list) and kind in ("set", "map"):
        keys = schema.get("x-kubernetes-list-map-keys", [])
        seen: list[Any] = []
        for i, item in enumerate(value):
            key = item if kind == "set" else tuple(item.get(k) for k in keys) if isinstance(item, dict) else item
            if key in seen:
                out.append(f"{_join(path, i)}: duplicate value, got {_short(item if kind == 'set' else key)}")
            seen.append(key)
    for k, sub, v in _children(schema, value):
        _list_problems(sub, v, _join(path, k), out)


def _schema_problems(schema: Obj, obj: Obj) -> tuple[list[str], bool]:
    """Problems, and whether one is a type error (which stops CEL, as in the API server)."""
    out: list[str] = []
    blocking = False
    for err in sorted(jsonschema.Draft4Validator(_draft4(schema)).iter_errors(obj), key=lambda e: list(map(str, e.absolute_path))):
        path = ""
        for part in err.absolute_path:
            path = _join(path, part)
        if err.validator == "additionalProperties":
            continue  # reported as unknown fields
        blocking |= err.validator == "type"
        rule = f"enum of {len(err.validator_value)}" if err.validator == "enum" else f"{err.validator} {err.validator_value!r}"
        out.append(f"{path or '(object)'}: {rule}, got {_short(err.instance)}")
    _list_problems(schema, obj, "", out)
    return out, blocking


# ---------------------------------------------------------------- CEL


def to_cel(schema: Obj, value: Any) -> Any:
    """A JSON value as CEL sees it: typed by the schema; null fields absent."""
    t = schema.get("type")
    if value is None:
        return None
    if t == "number":
        return celtypes.DoubleType(float(value))
    if t == "integer":
        return celtypes.IntType(int(value))
    if t == "string":
        return celtypes.StringType(value)
    if t == "boolean":
        return celtypes.BoolType(value)
    if t == "array":
        return celtypes.ListType([to_cel(schema.get("items", {}), v) for v in value])
    if t == "object":
        out = {}
        for k, sub, v in _children(schema, value):
            if v is not None:
                out[celtypes.StringType(k)] = to_cel(sub, v)
        return celtypes.MapType(out)
    return celpy.json_to_cel(value)


_ENV = celpy.Environment()
_PROGRAMS: dict[str, Any] = {}


def compile_rule(expr: str) -> Any:
    if expr not in _PROGRAMS:
        _PROGRAMS[expr] = _ENV.program(_ENV.compile(expr))
    return _PROGRAMS[expr]


def rules(schema: Obj, path: str = "") -> Iterator[tuple[str, Obj, Obj]]:
    """Every (schema path, node schema, rule) in ``schema``."""
    for rule in schema.get("x-kubernetes-validations", []):
        yield path, schema, rule
    for k, sub in (schema.get("properties") or {}).items():
        yield from rules(sub, _join(path, k))
    if isinstance(schema.get("items"), dict):
        yield from rules(schema["items"], _join(path, 0))
    if isinstance(schema.get("additionalProperties"), dict):
        yield from rules(schema["additionalProperties"], _join(path, "*"))


def _cel_problems(schema: Obj, value: Any, path: str, out: list[str], fired: list[str]) -> None:
    if value is None:
        return
    for rule in schema.get("x-kubernetes-validations", []):
        self_ = to_cel(schema, value)
        where = path + rule.get("fieldPath", "") if rule.get("fieldPath") else path
        try:
            ok = compile_rule(rule["rule"]).evaluate({"self": self_})
        except celpy.CELEvalError as exc:
            out.append(f"{where}: rule {rule['rule']!r} failed to evaluate: {exc.args[0]}")
            continue
        if ok:
            continue
        fired.append(rule["rule"])
        if "messageExpression" in rule:
            message = str(compile_rule(rule["messageExpression"]).evaluate({"self": self_}))
        else:
            message = rule.get("message") or f"failed rule: {rule['rule']}"
        out.append(f"{where}: {message}")
    for k, sub, v in _children(schema, value):
        _cel_problems(sub, v, _join(path, k), out, fired)


class CrdValidator:
    """Create-time validation of objects of one CRD version (see module doc)."""

    def __init__(self, crd: Obj, version: str | None = None):
        versions = crd["spec"]["versions"]
        v = next(v for v in versions if version in (None, v["name"]))
        self.schema: Obj = v["schema"]["openAPIV3Schema"]
        self.fired: list[str] = []  # every rule that rejected something, for coverage checks

    def default(self, obj: Obj) -> Obj:
        return default(self.schema, obj)

    def validate(self, obj: Obj) -> list[str]:
        out: list[str] = []
        _unknown_fields(self.schema, obj, "", out)
        stored = self.default(obj)
        problems, blocking = _schema_problems(self.schema, stored)
        out += problems
        if not blocking:
            _cel_problems(self.schema, stored, "", out, self.fired)
        return out


# ---------------------------------------------------------------- structural schema rules

_JUNCTORS = ("allOf", "anyOf", "oneOf", "not")
_FORBIDDEN = ("$ref", "definitions", "dependencies", "deprecated", "discriminator", "id", "patternProperties",
              "readOnly", "writeOnly", "xml")  # fmt: skip
_SCALARS = ("string", "integer", "number", "boolean")


def structural_problems(schema: Obj, path: str = "", root: bool = True) -> list[str]:
    """Violations of the structural-schema and CRD-schema rules (Kubernetes docs, "Specifying a
    structural schema" and "Validation"), with the default of each node checked against it."""
    out: list[str] = []
    here = path or "(root)"
    free = schema.get("x-kubernetes-preserve-unknown-fields") or schema.get("x-kubernetes-int-or-string")
    if "type" not in schema and not free:
        out.append(f"{here}: no type")
    for key in _FORBIDDEN:
        if key in schema:
            out.append(f"{here}: {key} is not allowed")
    for key in _JUNCTORS:
        if key in schema:
            out.append(f"{here}: {key} (this generator emits none; its structural rules are not checked here)")
    if schema.get("uniqueItems"):
        out.append(f"{here}: uniqueItems: true is not allowed")
    if schema.get("additionalProperties") is False:
        out.append(f"{here}: additionalProperties: false is not allowed")
    if "additionalProperties" in schema and "properties" in schema:
        out.append(f"{here}: properties and additionalProperties together")
    if schema.get("x-kubernetes-list-type") == "set" and schema.get("items", {}).get("type") not in _SCALARS:
        out.append(f"{here}: list-type set needs scalar items")
    if schema.get("x-kubernetes-list-type") == "map":
        items = schema.get("items", {})
        for key in schema.get("x-kubernetes-list-map-keys", []):
            if key not in items.get("required", []) and "default" not in items.get("properties", {}).get(key, {}):
                out.append(f"{here}: list map key {key!r} must be required or defaulted")
    if "default" in schema:
        if schema["default"] is None:
            out.append(f"{here}: default null")
        else:
            for err in jsonschema.Draft4Validator(_draft4(schema)).iter_errors(schema["default"]):
                out.append(f"{here}: default {schema['default']!r} is invalid: {err.message}")
    for rule in schema.get("x-kubernetes-validations", []):
        for key in ("rule", "messageExpression"):
            if key in rule:
                try:
                    compile_rule(rule[key])
                except celpy.CELParseError as exc:
                    out.append(f"{here}: {key} {rule[key]!r} does not compile: {exc}")
        field = rule.get("fieldPath", "")
        if field and field.lstrip(".") not in (schema.get("properties") or {}):
            out.append(f"{here}: fieldPath {field!r} names no field")
    if root and "metadata" in schema.get("properties", {}):
        extra = set(schema["properties"]["metadata"].get("properties", {})) - {"name", "generateName"}
        if extra:
            out.append(f"metadata: only name and generateName may be restricted, got {sorted(extra)}")
    for k, sub in (schema.get("properties") or {}).items():
        out += structural_problems(sub, _join(path, k), root=False)
    for key in ("items", "additionalProperties"):
        if isinstance(schema.get(key), dict):
            out += structural_problems(schema[key], _join(path, "[]" if key == "items" else "*"), root=False)
    return out
