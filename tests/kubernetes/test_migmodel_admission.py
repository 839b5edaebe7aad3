"""The emulated API server admits MigModels as a real one does: schema, defaults, CEL rules, 422 with causes."""

from __future__ import annotations

import copy

import httpx
import yaml

from autoscaler.act.kubernetes.crd import API_VERSION

BASE = "/apis/migscale.io/v1alpha1/namespaces/team-a/migmodels"
GOOD = {
    "apiVersion": API_VERSION,
    "kind": "MigModel",
    "metadata": {"name": "resnet", "namespace": "team-a"},
    "spec": {"model_dir": "resnet", "slo": {"p99_ms": 150}, "profiles": ["1g.10gb"], "capacity": {"1g.10gb": 58}},
}


def _post(fake, obj, query: str = "") -> httpx.Response:
    return httpx.post(f"{fake.url}{BASE}{query}", json=obj, timeout=10)


def test_valid_migmodel_is_stored_with_schema_defaults(fake):
    r = _post(fake, GOOD)
    assert r.status_code == 201, r.text
    spec = r.json()["spec"]
    assert spec["min_replicas"] == 1 and spec["max_replicas"] == 8 and spec["backend"] == "mig"
    assert fake.get("MigModel", "resnet", "team-a")["metadata"]["generation"] == 1


def test_cel_rule_refusal_is_422_invalid_with_field_causes(fake):
    bad = copy.deepcopy(GOOD)
    bad["spec"].update(min_replicas=5, max_replicas=2)
    r = _post(fake, bad)
    assert r.status_code == 422
    body = r.json()
    assert body["kind"] == "Status" and body["reason"] == "Invalid" and body["code"] == 422
    assert body["details"]["kind"] == "MigModel" and body["details"]["name"] == "resnet"
    causes = body["details"]["causes"]
    assert causes == [{"reason": "FieldValueInvalid", "field": "spec.min_replicas",
                       "message": "must be <= max_replicas (2), got 5"}]
    assert 'MigModel.migscale.io "resnet" is invalid' in body["message"]
    assert fake.get("MigModel", "resnet", "team-a") is None  # nothing stored


def test_schema_refusal_names_the_field_and_value(fake):
    bad = copy.deepcopy(GOOD)
    bad["spec"]["slo"]["p99_ms"] = -1
    r = _post(fake, bad)
    assert r.status_code == 422
    assert [c["field"] for c in r.json()["details"]["causes"]] == ["spec.slo.p99_ms"]
    assert "-1" in r.json()["message"]


def test_unknown_field_fails_only_under_strict_field_validation(fake):
    extra = copy.deepcopy(GOOD)
    extra["spec"]["replicas"] = 3
    r = _post(fake, extra, "?fieldValidation=Strict")  # what kubectl apply sends
    assert r.status_code == 400 and "spec.replicas" in r.json()["message"]
    r = _post(fake, extra)  # the server's default (Warn): pruned
    assert r.status_code == 201 and "replicas" not in r.json()["spec"]


def test_update_is_validated_and_bumps_generation_but_status_writes_do_not(fake):
    created = _post(fake, GOOD).json()
    url = f"{fake.url}{BASE}/resnet"
    bad = copy.deepcopy(created)
    bad["spec"]["max_replicas"] = 0
    r = httpx.put(url, json=bad, timeout=10)
    assert r.status_code == 422 and r.json()["details"]["causes"][0]["field"] == "spec.max_replicas"
    changed = copy.deepcopy(created)
    changed["spec"]["slo"]["p99_ms"] = 100
    r = httpx.put(url, json=changed, timeout=10)
    assert r.status_code == 200 and r.json()["metadata"]["generation"] == 2
    with_status = r.json() | {"status": {"observedGeneration": 2, "readyReplicas": 0}}
    r = httpx.put(f"{url}/status", json=with_status, timeout=10)
    assert r.status_code == 200
    stored = fake.get("MigModel", "resnet", "team-a")
    assert stored["metadata"]["generation"] == 2 and stored["status"]["observedGeneration"] == 2
    assert stored["spec"]["slo"]["p99_ms"] == 100
    # a status that breaks the status schema is refused too
    r = httpx.put(f"{url}/status", json=stored | {"status": {"readyReplicas": -1}}, timeout=10)
    assert r.status_code == 422


def test_every_example_migmodel_is_admitted(fake):
    from pathlib import Path

    for path in sorted((Path(__file__).resolve().parents[2] / "k8s" / "examples").glob("migmodel-*.yaml")):
        obj = yaml.safe_load(path.read_text())
        obj["metadata"]["namespace"] = "team-a"
        r = _post(fake, obj, "?fieldValidation=Strict")
        assert r.status_code == 201, (path.name, r.text)
