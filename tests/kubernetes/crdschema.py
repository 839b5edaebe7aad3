"""Validate custom resources against the CRD schemas stored in ``crds/``.

Each file there is a published CustomResourceDefinition (source noted at its
top), trimmed where the original is huge. Objects are validated strictly: an
object schema that lists ``properties`` and does not say
``x-kubernetes-preserve-unknown-fields`` rejects unknown fields, as
``kubectl apply --validate=strict`` does. Embedded pod templates (the
LeaderWorkerSet's) are checked with kubernetes-validate's PodTemplate schema.
"""

from __future__ import annotations

import copy
from functools import lru_cache
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import yaml

CRD_DIR = Path(__file__).parent / "crds"
K8S_VERSION = "1.30"


def _strict(schema: Any) -> Any:
    if isinstance(schema, dict):
        out = {k: _strict(v) for k, v in schema.items()}
        if (
            "properties" in out
            and not out.get("x-kubernetes-preserve-unknown-fields")
            and "additionalProperties" not in out
        ):
            out["additionalProperties"] = False
        if out.get("x-kubernetes-int-or-string"):
            out.setdefault("anyOf", [{"type": "integer"}, {"type": "string"}])
        return out
    if isinstance(schema, list):
        return [_strict(v) for v in schema]
    return schema


@lru_cache(maxsize=1)
def schemas() -> dict[tuple[str, str], dict]:
    """(apiVersion, kind) -> strict JSON schema, from every CRD in crds/."""
    out: dict[tuple[str, str], dict] = {}
    for path in sorted(CRD_DIR.glob("*.yaml")):
        for crd in yaml.safe_load_all(path.read_text()):
            if not crd or crd.get("kind") != "CustomResourceDefinition":
                continue
            spec = crd["spec"]
            for v in spec["versions"]:
                schema = _strict(copy.deepcopy(v["schema"]["openAPIV3Schema"]))
                out[(f"{spec['group']}/{v['name']}", spec["names"]["kind"])] = schema
    return out


def _pod_templates(obj: dict) -> list[dict]:
    if obj.get("kind") != "LeaderWorkerSet":
        return []
    lwt = (obj.get("spec") or {}).get("leaderWorkerTemplate") or {}
    return [t for t in (lwt.get("leaderTemplate"), lwt.get("workerTemplate")) if t]


def validate_crd_object(obj: dict) -> list[str]:
    """Problems with a custom resource (empty when valid); unknown kinds are a problem too."""
    key = (obj.get("apiVersion", ""), obj.get("kind", ""))
    schema = schemas().get(key)
    if schema is None:
        return [f"no schema for {key[0]}/{key[1]} (neither built-in nor in tests/kubernetes/crds)"]
    problems = [
        f"{key[1]} {obj.get('metadata', {}).get('name')}: {'.'.join(map(str, e.absolute_path))}: {e.message}"
        for e in jsonschema.Draft7Validator(schema).iter_errors(obj)
    ]
    for tmpl in _pod_templates(obj):
        pt = {"apiVersion": "v1", "kind": "PodTemplate", "metadata": {"name": "t"}, "template": tmpl}
        try:
            kubernetes_validate.validate(pt, K8S_VERSION, strict=True)
        except kubernetes_validate.ValidationError as exc:
            problems.append(f"LeaderWorkerSet pod template: {exc.message}")
    return problems


def validate_any(obj: dict) -> list[str]:
    """Built-in kinds via kubernetes-validate (strict), CRD kinds via the stored CRDs."""
    try:
        kubernetes_validate.validate(obj, K8S_VERSION, strict=True)
        return []
    except kubernetes_validate.SchemaNotFoundError:
        return validate_crd_object(obj)
    except kubernetes_validate.ValidationError as exc:
        return [f"{obj.get('kind')} {obj.get('metadata', {}).get('name')}: {exc.message}"]
