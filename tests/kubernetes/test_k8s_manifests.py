"""Every static manifest under k8s/ validates (Kubernetes schemas, strict; CRD kinds against stored CRDs)."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import kubernetes_validate
import pytest
import yaml
from crdschema import validate_any, validate_crd_object

from autoscaler.api import signals

ROOT = Path(__file__).resolve().parents[2] / "k8s"
MANIFESTS = sorted(p for p in ROOT.rglob("*.yaml") if p.name != "kustomization.yaml")
KUSTOMIZATIONS = sorted(ROOT.rglob("kustomization.yaml"))
LATEST = kubernetes_validate.latest_version()


def docs(path: Path) -> list[dict]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def test_there_are_manifests():
    names = {p.relative_to(ROOT).as_posix() for p in MANIFESTS}
    for must in (
        "base/rbac.yaml",
        "base/apiservice.yaml",
        "base/deployment.yaml",
        "examples/keda-scaledobject.yaml",
        "examples/prometheus-adapter.yaml",
        "examples/leaderworkerset.yaml",
        "components/cert-manager/certificates.yaml",
    ):
        assert must in names


@pytest.mark.parametrize("path", MANIFESTS, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_manifest_validates(path: Path):
    if path.name == "apiservice-ca.yaml":  # a kustomize patch, not a whole object
        return
    for doc in docs(path):
        assert validate_any(doc) == [], path
        try:  # built-in kinds also against the newest schema the validator ships
            kubernetes_validate.validate(doc, LATEST, strict=True)
        except kubernetes_validate.SchemaNotFoundError:
            pass


@pytest.mark.parametrize("path", KUSTOMIZATIONS, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_kustomization_references_exist(path: Path):
    k = yaml.safe_load(path.read_text())
    refs = list(k.get("resources", [])) + list(k.get("components", []))
    refs += [p["path"] for p in k.get("patches", []) if "path" in p]
    refs += [f for g in k.get("configMapGenerator", []) for f in g.get("files", [])]
    assert refs
    for ref in refs:
        assert (path.parent / ref).exists(), f"{path}: {ref} does not exist"


@pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl (with built-in kustomize) not installed")
@pytest.mark.parametrize("target", ["base", "overlays/cert-manager", "examples"])
def test_kustomize_build_validates(target: str):
    out = subprocess.run(
        ["kubectl", "kustomize", str(ROOT / target)], capture_output=True, text=True, timeout=60, check=True
    )
    built = [d for d in yaml.safe_load_all(out.stdout) if d]
    assert built
    for doc in built:
        assert validate_any(doc) == []
    if target == "overlays/cert-manager":
        apisvcs = [d for d in built if d["kind"] == "APIService"]
        assert len(apisvcs) == 3
        for a in apisvcs:
            assert (
                a["metadata"]["annotations"]["cert-manager.io/inject-ca-from"]
                == "migscale-system/migscale-api"
            )
            assert a["spec"]["insecureSkipTLSVerify"] is False


def _base() -> list[dict]:
    return [
        d for p in sorted((ROOT / "base").glob("*.yaml")) if p.name != "kustomization.yaml" for d in docs(p)
    ]


def test_rbac_has_no_wildcards_and_covers_the_backend():
    every = [d for p in MANIFESTS for d in docs(p) if d.get("kind") in ("ClusterRole", "Role")]
    for r in (r for d in every for r in d.get("rules", [])):
        for key in ("apiGroups", "resources", "verbs", "resourceNames", "nonResourceURLs"):
            assert not any("*" in item for item in r.get(key, [])), r
    rules = [r for d in _base() if d["kind"] in ("ClusterRole", "Role") for r in d["rules"]]
    granted = {
        (g, res, v) for r in rules for g in r["apiGroups"] for res in r["resources"] for v in r["verbs"]
    }
    for need in [
        ("", "nodes", "patch"),
        ("", "pods/eviction", "create"),
        ("apps", "deployments/scale", "update"),
        ("coordination.k8s.io", "leases", "update"),
        ("leaderworkerset.x-k8s.io", "leaderworkersets/scale", "update"),
        ("autoscaling", "horizontalpodautoscalers", "create"),
        ("", "configmaps", "update"),
    ]:
        assert need in granted, need
    assert ("", "secrets", "get") not in granted


def test_aggregated_api_wiring():
    base = _base()
    by = {(d["kind"], d["metadata"]["name"]): d for d in base}
    apis = {d["metadata"]["name"]: d["spec"] for d in base if d["kind"] == "APIService"}
    assert apis["v1beta2.custom.metrics.k8s.io"]["versionPriority"] == 200
    assert apis["v1beta1.custom.metrics.k8s.io"]["versionPriority"] == 100
    assert "v1beta1.external.metrics.k8s.io" in apis
    svc = by[("Service", "migscale-api")]
    for spec in apis.values():
        assert spec["groupPriorityMinimum"] == 100
        assert spec["service"] == {
            "name": "migscale-api",
            "namespace": "migscale-system",
            "port": svc["spec"]["ports"][0]["port"],
        }
    binds = [d for d in base if d["kind"] in ("ClusterRoleBinding", "RoleBinding")]
    assert any(b["roleRef"]["name"] == "system:auth-delegator" for b in binds)
    reader = next(b for b in binds if b["roleRef"]["name"] == "extension-apiserver-authentication-reader")
    assert reader["metadata"]["namespace"] == "kube-system"
    dep = by[("Deployment", "migscale")]
    pod = dep["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == by[("ServiceAccount", "migscale")]["metadata"]["name"]
    api = next(c for c in pod["containers"] if c["name"] == "api")
    assert any(a.startswith("--tls-cert=") for a in api["args"])
    secret = next(v for v in pod["volumes"] if v["name"] == "serving-cert")["secret"]["secretName"]
    certs = docs(ROOT / "components/cert-manager/certificates.yaml")
    serving = next(c for c in certs if c["kind"] == "Certificate" and c["metadata"]["name"] == "migscale-api")
    assert serving["spec"]["secretName"] == secret
    assert "migscale-api.migscale-system.svc" in serving["spec"]["dnsNames"]


def test_examples_use_the_metric_names_that_exist():
    hpa = docs(ROOT / "examples/hpa-migscale.yaml")[0]
    assert hpa["spec"]["metrics"][0]["pods"]["metric"]["name"] == signals.REPLICA_RATIO
    rule = docs(ROOT / "examples/prometheus-adapter.yaml")[0]
    assert rule["spec"]["groups"][0]["rules"][0]["record"] == "triton:queue_compute:ratio"
    dash = json.loads((ROOT / "examples/grafana-dashboard.json").read_text())
    exprs = " ".join(t["expr"] for p in dash["panels"] for t in p["targets"])
    for name in (
        "nv_inference_request_success",
        "DCGM_FI_PROF_GR_ENGINE_ACTIVE",
        "triton:queue_compute:ratio",
        signals.DESIRED_REPLICAS,
    ):
        assert name in exprs
    cm = docs(ROOT / "examples/mig-parted-configmap.yaml")[0]
    parted = yaml.safe_load(cm["data"]["config.yaml"])
    assert parted["version"] == "v1"
    assert parted["mig-configs"]["custom-a"][0]["mig-devices"] == {"1g.10gb": 1, "2g.20gb": 1, "3g.40gb": 1}


def test_crd_validation_can_fail():
    """The stored schemas reject what a real API server would (so the passes above mean something)."""
    lws = docs(ROOT / "examples/leaderworkerset.yaml")[0]
    assert validate_crd_object(lws) == []
    bad = json.loads(json.dumps(lws))
    bad["spec"]["leaderWorkerTemplate"]["restartPolicy"] = "RecreateSometimes"
    assert any("RecreateSometimes" in p for p in validate_crd_object(bad))
    bad = json.loads(json.dumps(lws))
    bad["spec"]["leaderWorkerTemplate"]["leaderTemplate"]["spec"]["containers"][0]["bogus"] = 1
    assert any("bogus" in p for p in validate_crd_object(bad))
    so = docs(ROOT / "examples/keda-scaledobject.yaml")[0]
    del so["spec"]["scaleTargetRef"]["name"]
    assert validate_crd_object(so)
    pm = docs(ROOT / "examples/monitors.yaml")[0]
    pm["spec"]["podMetricsEndpoints"][0]["interval"] = "15 seconds"
    assert validate_crd_object(pm)
