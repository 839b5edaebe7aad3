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


def test_rbac_has_no_wildcards_and_lets_migscale_only_read_hpas():
    every = [d for p in MANIFESTS for d in docs(p) if d.get("kind") in ("ClusterRole", "Role")]
    for r in (r for d in every for r in d.get("rules", [])):
        for key in ("apiGroups", "resources", "verbs", "resourceNames", "nonResourceURLs"):
            assert not any("*" in item for item in r.get(key, [])), r
    rules = [r for d in _base() if d["kind"] in ("ClusterRole", "Role") for r in d["rules"]]
    granted = {(g, res, v) for r in rules for g in r["apiGroups"] for res in r["resources"] for v in r["verbs"]}
    assert {v for g, res, v in granted if res == "horizontalpodautoscalers"} == {"get", "list", "watch"}
    assert ("", "secrets", "get") not in granted


def _allowed(method: str, path: str, query: str) -> tuple[str, str, str, str | None, str | None]:
    """(apiGroup, resource[/sub], verb, namespace, name) of one request, as RBAC sees it."""
    from fakeapi import _PATH

    m = _PATH.match(path)
    assert m, path
    res = m.group("plural") + (f"/{m.group('sub')}" if m.group("sub") else "")
    verb = {"POST": "create", "PUT": "update", "PATCH": "patch", "DELETE": "delete"}.get(method)
    if verb is None:
        verb = "get" if m.group("name") else ("watch" if "watch=true" in query else "list")
    return m.group("g") or "", res, verb, m.group("ns"), m.group("name")


def test_rbac_allows_every_request_the_backend_sends(cluster, connect, backends):
    """Replay: lease, informers, creates, scale, drain, retire, repartition, Events -- each request is granted."""
    from gpu_operator import gpu_node
    from k8s_helpers import act, caught_up, wait_until

    from autoscaler.act.kubernetes.leader import LeaseElector
    from autoscaler.clock import WallClock
    from autoscaler.mig.layout import Placement
    from autoscaler.policy.types import ModelSpec, Reason, ReplicaState

    fake = cluster.fake
    fake.put_object(gpu_node("node-a", {"3g.40gb": 2}, config="c0"))
    fake.put_object(gpu_node("node-b", {"3g.40gb": 2, "1g.10gb": 1}, config="c0"))
    model = ModelSpec("resnet", {"3g.40gb": 160, "1g.10gb": 58}, ("3g.40gb", "1g.10gb"))
    rest = connect("migscale/ctl")
    # no renew thread here: a lease long enough that a slow run never loses it half-way
    elector = LeaseElector(rest, namespace="migscale-system", identity="ctl", clock=WallClock(),
                           lease_duration_s=600, renew_deadline_s=500.0)
    be = backends([model], user_agent="migscale/ctl", elector=elector)
    be.rest.guard = elector.check_write
    assert elector.step().leader
    caught_up(be, fake)
    be.apply([act("create", "resnet", "3g.40gb", gpu="node-a/0")] * 2)
    wait_until(lambda: sum(r.state is ReplicaState.READY for r in be.snapshot().replicas) == 2)
    victim = be.snapshot().replicas[0].id
    be.apply([act("drain", "resnet", "3g.40gb", replica=victim), act("delete", "resnet", "3g.40gb", replica=victim)])
    layout = (Placement(0, "3g.40gb"), Placement(4, "1g.10gb"))
    be.apply([act("repartition", gpu="node-a/0", profile=None, layout=layout, reason=Reason.REPARTITION)])
    wait_until(lambda: (be.snapshot() and not be.advance()) and not be.repartitioner.in_progress(), 15)
    left = [r.id for r in be.snapshot().replicas]
    be.apply([act("delete", "resnet", "3g.40gb", replica=r) for r in left])
    def gone() -> bool:
        be.snapshot()
        errors = be.advance()
        assert not errors, errors
        return fake.get("Deployment", "resnet-3g-40gb") is None

    wait_until(gone, 15, "the workload to retire")
    elector.release()
    sent = {_allowed(r.method, r.path, r.query) for r in fake.requests if r.user_agent == "migscale/ctl"}
    assert {v for _g, _r, v, _n, _nm in sent} >= {"get", "list", "watch", "create", "update", "patch", "delete"}
    assert not_granted(fake, "migscale/ctl") == []


def not_granted(fake, user_agent: str) -> list[str]:
    """Every request ``user_agent`` sent that k8s/base's Roles and ClusterRoles do not grant."""
    rules = []
    for d in _base():
        if d["kind"] in ("ClusterRole", "Role"):
            ns = d["metadata"].get("namespace") if d["kind"] == "Role" else None
            rules += [(ns, r) for r in d["rules"]]
    sent = {_allowed(r.method, r.path, r.query) for r in fake.requests if r.user_agent == user_agent}
    return [f"{verb} {group}/{res} in {ns} ({name})" for group, res, verb, ns, name in sorted(sent, key=str)
            if not any((rns is None or rns == ns) and group in r["apiGroups"] and res in r["resources"]
                       and verb in r["verbs"] and (not r.get("resourceNames") or name in r["resourceNames"])
                       for rns, r in rules)]


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
    assert hpa["spec"]["metrics"][0]["external"]["metric"]["name"] in signals.EXTERNAL_METRICS
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


def test_no_autoscaler_in_k8s_targets_a_workload_migscale_manages():
    """One owner of replicas: the shipped HPAs and ScaledObjects point at workloads a team runs itself."""
    from autoscaler.act.kubernetes.config import render_config
    from autoscaler.act.kubernetes.render import render_all
    from autoscaler.commands.k8s import planned_desired
    from autoscaler.config import load_cluster, load_models, model_specs

    ex = ROOT.parent / "examples"
    models, cluster = load_models(ex / "models.yaml"), load_cluster(ex / "cluster.yaml")
    specs = model_specs(models, cluster)
    everything = {p: n for s in specs for p in (*s.allowed_profiles, "whole")
                  for n in [1]}  # every profile a model may run on
    desired = {(s.name, p): 1 for s in specs for p in everything if p in s.allowed_profiles}
    ours = {o["metadata"]["name"] for o in render_all(specs, desired, render_config(cluster))
            if o["kind"] in ("Deployment", "LeaderWorkerSet")}
    ours |= {o["metadata"]["name"] for o in render_all(specs, planned_desired(specs, None, cluster), render_config(cluster))
             if o["kind"] in ("Deployment", "LeaderWorkerSet")}
    targets = [d["spec"]["scaleTargetRef"]["name"] for p in MANIFESTS for d in docs(p)
               if d.get("kind") in ("HorizontalPodAutoscaler", "ScaledObject")]
    assert targets and not set(targets) & ours, set(targets) & ours


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


def test_the_fast_scrape_policy_admits_the_controller_to_the_pods_migscale_renders():
    """Its selectors match the labels migscale renders on Triton pods and the controller
    Deployment's pods, on the port the pods name ``metrics``; and ``apply -k`` of the examples
    leaves it out (applied to a namespace without a policy it would isolate those pods)."""
    from autoscaler.act.kubernetes.render import labels

    pol = docs(ROOT / "examples/networkpolicy-fast-scrape.yaml")[0]
    triton = labels("resnet", "1g.10gb")
    assert pol["spec"]["podSelector"]["matchLabels"].items() <= triton.items()
    (rule,) = pol["spec"]["ingress"]
    (peer,) = rule["from"]
    ns = docs(ROOT / "base/namespace.yaml")[0]["metadata"]["name"]
    assert peer["namespaceSelector"]["matchLabels"] == {"kubernetes.io/metadata.name": ns}
    deploy = next(d for d in docs(ROOT / "base/deployment.yaml") if d["kind"] == "Deployment")
    assert peer["podSelector"]["matchLabels"].items() <= deploy["spec"]["template"]["metadata"]["labels"].items()
    assert rule["ports"] == [{"port": "metrics", "protocol": "TCP"}]
    assert "networkpolicy-fast-scrape.yaml" not in yaml.safe_load((ROOT / "examples/kustomization.yaml").read_text())["resources"]
