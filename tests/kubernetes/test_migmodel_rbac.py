"""Who may touch MigModels: teams edit specs through the built-in roles, only the controller writes status."""

from __future__ import annotations

from pathlib import Path

import yaml

BASE = Path(__file__).resolve().parents[2] / "k8s" / "base"
GROUP = "migscale.io"


def _roles() -> dict[str, dict]:
    out = {}
    for path in sorted(BASE.glob("*.yaml")):
        for d in yaml.safe_load_all(path.read_text()):
            if d and d["kind"] in ("ClusterRole", "Role"):
                out[d["metadata"]["name"]] = d
    return out


def _grants(role: dict) -> set[tuple[str, str]]:
    """(resource, verb) pairs a role grants in migscale.io."""
    return {
        (res, verb)
        for r in role["rules"]
        if GROUP in r["apiGroups"]
        for res in r["resources"]
        for verb in r["verbs"]
    }


def test_controller_reads_specs_and_writes_only_status():
    grants = _grants(_roles()["migscale-controller"])
    assert grants == {
        ("migmodels", "get"),
        ("migmodels", "list"),
        ("migmodels", "watch"),
        ("migmodels/status", "update"),
        ("migmodels/status", "patch"),
    }


def test_editors_manage_migmodels_through_the_built_in_edit_role():
    role = _roles()["migscale-migmodel-edit"]
    assert role["metadata"]["labels"]["rbac.authorization.k8s.io/aggregate-to-edit"] == "true"
    grants = _grants(role)
    for verb in ("get", "list", "watch", "create", "update", "patch", "delete", "deletecollection"):
        assert ("migmodels", verb) in grants
    assert not any(res == "migmodels/status" for res, _ in grants)  # status has one writer


def test_viewers_read_migmodels_and_their_status():
    role = _roles()["migscale-migmodel-view"]
    assert role["metadata"]["labels"]["rbac.authorization.k8s.io/aggregate-to-view"] == "true"
    assert _grants(role) == {(res, v) for res in ("migmodels", "migmodels/status") for v in ("get", "list", "watch")}


def test_nobody_but_the_controller_writes_status():
    for name, role in _roles().items():
        writes = {v for res, v in _grants(role) if res == "migmodels/status" and v not in ("get", "list", "watch")}
        assert not writes or name == "migscale-controller", name


def test_roles_are_in_the_kustomization():
    resources = yaml.safe_load((BASE / "kustomization.yaml").read_text())["resources"]
    assert "rbac-migmodel.yaml" in resources and "migmodel-crd.yaml" in resources
