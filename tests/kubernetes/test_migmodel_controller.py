"""The controller serving MigModels from two teams' namespaces on the emulated cluster.

The API server, its Deployment/ReplicaSet controllers, scheduler and kubelet
are emulated (``emulated.py``: no Kubernetes can run here); the controller,
its backend and the MigModel source are the shipped code. MigModels are
created over HTTP as ``kubectl apply`` would, so the API server's schema and
CEL rules apply to them.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from emulated import EmulatedCluster
from gpu_operator import gpu_node

from autoscaler.act.kubernetes.config import build_backend
from autoscaler.act.kubernetes.crd import API_VERSION
from autoscaler.act.kubernetes.render import MODEL_LABEL
from autoscaler.clock import VirtualClock
from autoscaler.config import load_cluster
from autoscaler.fakes import FakeMetricsSource
from autoscaler.runtime.kubernetes import KubernetesController
from autoscaler.runtime.migmodels import MigModelSource

T0 = 1_800_000_000.0
CLUSTER = """
namespace: migscale-system
gpus:
  - {node: node-0, product: A100-SXM4-80GB, count: 1, emulated: false}
  - {node: node-1, product: A100-SXM4-80GB, count: 1, emulated: false}
policy: {tick_s: 5}
"""


def migmodel(ns: str, name: str, **spec) -> dict:
    body = {"model_dir": name, "slo": {"p99_ms": 150}, "profiles": ["1g.10gb"], "capacity": {"1g.10gb": 58}}
    body.update(spec)
    return {"apiVersion": API_VERSION, "kind": "MigModel", "metadata": {"name": name, "namespace": ns}, "spec": body}


class Kubectl:
    """``kubectl apply`` / ``delete`` of MigModels over HTTP (strict field validation, as kubectl sends)."""

    def __init__(self, url: str) -> None:
        self.url = url

    def path(self, ns: str, name: str = "") -> str:
        return f"{self.url}/apis/migscale.io/v1alpha1/namespaces/{ns}/migmodels" + (f"/{name}" if name else "")

    def apply(self, obj: dict) -> httpx.Response:
        ns, name = obj["metadata"]["namespace"], obj["metadata"]["name"]
        live = httpx.get(self.path(ns, name), timeout=10)
        if live.status_code == 404:
            return httpx.post(self.path(ns) + "?fieldValidation=Strict", json=obj, timeout=10)
        body = copy.deepcopy(obj)
        body["metadata"]["resourceVersion"] = live.json()["metadata"]["resourceVersion"]
        return httpx.put(self.path(ns, name) + "?fieldValidation=Strict", json=body, timeout=10)

    def delete(self, ns: str, name: str) -> httpx.Response:
        return httpx.delete(self.path(ns, name), timeout=10)


@pytest.fixture
def world(tmp_path: Path) -> Iterator[tuple]:
    c = EmulatedCluster(ready_delay_s=0.2, stop_s=0.1, mig_delay_s=0.5, bookmark_s=0.1).start()
    for name in ("node-0", "node-1"):
        c.fake.put_object(gpu_node(name, {"1g.10gb": 7}, config="all-1g.10gb"), manager="kubelet")
    for ns in ("team-a", "team-b", "migscale-system"):
        c.namespace(ns)
    (tmp_path / "cluster.yaml").write_text(CLUSTER)
    cluster_cfg = load_cluster(tmp_path / "cluster.yaml")
    made: list = []

    def controller(rates: dict[str, float]) -> KubernetesController:
        be = build_backend([], cluster_cfg, host=c.url, identity="ctl", lease_namespace="migscale-system",
                           clock=VirtualClock(T0), backend_options={"all_namespaces": True, "watch_timeout_s": 5})
        source = MigModelSource(be.rest, cluster_cfg, watch_timeout_s=5)
        metrics = FakeMetricsSource()
        for m, r in rates.items():
            metrics.set_rate(m, r, p99_ms=90.0)
        ctl = KubernetesController(be, metrics, None, cluster_cfg, clock=be.clock, model_source=source)
        made.append((ctl, source))
        return ctl

    try:
        yield c, Kubectl(c.url), controller
    finally:
        for ctl, _source in made:
            ctl.close()  # stops the MigModel informers too
        c.stop()


def tick(ctl: KubernetesController, n: int = 1) -> None:
    for _ in range(n):
        ctl.check_lease()
        ctl.tick()
        ctl.clock.advance(5)


def cond(obj: dict, kind: str) -> dict:
    return next(c for c in obj["status"]["conditions"] if c["type"] == kind)


def settle(c: EmulatedCluster, ctl: KubernetesController, what, timeout_s: float = 20.0):
    """Tick until ``what()`` holds (pods become Ready on the emulated kubelet's wall clock)."""
    def step():
        tick(ctl)
        return what()
    return c.wait(step, timeout_s, "the controller to converge")


def test_two_teams_status_invalid_spec_isolated_and_deleted_migmodel_collected(world):
    c, kubectl, controller = world
    assert kubectl.apply(migmodel("team-a", "resnet")).status_code == 201
    assert kubectl.apply(migmodel("team-b", "bert", capacity={"1g.10gb": 40}, slo={"p99_ms": 200})).status_code == 201
    # the API server refuses what the CRD's rules refuse: nothing reaches the controller
    r = kubectl.apply(migmodel("team-b", "broken", min_replicas=3, max_replicas=2))
    assert r.status_code == 422 and r.json()["details"]["causes"][0]["field"] == "spec.min_replicas"
    # admitted by the API server, but no GPU in the fleet has 1g.5gb (an A100-40GB profile)
    assert kubectl.apply(migmodel("team-b", "nofit", profiles=["1g.5gb"], capacity={"1g.5gb": 20})).status_code == 201
    # a second team's "resnet": the name is taken
    assert kubectl.apply(migmodel("team-b", "resnet")).status_code == 201
    ctl = controller({"resnet": 100.0, "bert": 60.0, "nofit": 10.0})

    def ready() -> bool:
        a = c.fake.get("MigModel", "resnet", "team-a")
        b = c.fake.get("MigModel", "bert", "team-b")
        return all(o.get("status", {}).get("readyReplicas", 0) >= 2 for o in (a, b))

    settle(c, ctl, ready)
    a, b = c.fake.get("MigModel", "resnet", "team-a"), c.fake.get("MigModel", "bert", "team-b")
    # each model's workloads in its own namespace, owned by its MigModel
    dep_a = c.fake.get("Deployment", "resnet-1g-10gb", "team-a")
    dep_b = c.fake.get("Deployment", "bert-1g-10gb", "team-b")
    assert dep_a["metadata"]["ownerReferences"][0]["uid"] == a["metadata"]["uid"]
    assert dep_b["metadata"]["ownerReferences"][0]["uid"] == b["metadata"]["uid"]
    assert c.fake.get("Service", "bert", "team-b")["metadata"]["ownerReferences"][0]["kind"] == "MigModel"
    assert c.fake.get("Deployment", "resnet-1g-10gb", "migscale-system") is None
    # status: generation, replicas by profile, req/s and p99 against the SLO, conditions
    st = a["status"]
    assert st["observedGeneration"] == 1 and st["servedRps"] == 100.0 and st["p99Ms"] == 90.0
    assert st["replicas"][0]["profile"] == "1g.10gb" and st["replicas"][0]["ready"] >= 2
    assert cond(a, "Ready")["status"] == "True" and cond(a, "SLOMet")["status"] == "True"
    assert cond(a, "ConfigValid")["status"] == "True" and cond(b, "ConfigValid")["status"] == "True"
    assert a["status"]["lastDecision"]["desiredReplicas"] >= 2
    # the spec the fleet cannot honour: ConfigValid=False with the field and value, nothing deployed
    nofit = c.fake.get("MigModel", "nofit", "team-b")
    bad = cond(nofit, "ConfigValid")
    assert bad["status"] == "False" and bad["reason"] == "InvalidSpec"
    assert "spec.profiles[0]" in bad["message"] and "'1g.5gb'" in bad["message"]
    assert not [d for d in c.fake.list("Deployment") if (d["metadata"].get("labels") or {}).get(MODEL_LABEL) == "nofit"]
    # the second "resnet" is refused, naming the holder; the first is untouched
    twin = c.fake.get("MigModel", "resnet", "team-b")
    assert cond(twin, "ConfigValid")["status"] == "False" and "team-a/resnet" in cond(twin, "ConfigValid")["message"]
    assert c.fake.get("Deployment", "resnet-1g-10gb", "team-b") is None

    # a steady tick writes no status (written only when it changes)
    tick(ctl)
    before = [r for r in c.fake.writes() if r.path.endswith("/status") and "migmodels" in r.path]
    tick(ctl, 2)
    after = [r for r in c.fake.writes() if r.path.endswith("/status") and "migmodels" in r.path]
    assert len(after) == len(before)
    # nobody but the controller wrote a MigModel's status
    for (kind, _ns, _name), fields in c.fake.field_writers.items():
        if kind == "MigModel":
            assert {m for p, ms in fields.items() if p.startswith("status") for m in ms} <= {"migscale"}, fields

    # team-a changes its spec to one the fleet cannot honour: refused, the last good spec stays in force
    replicas_a = c.fake.get("Deployment", "resnet-1g-10gb", "team-a")["spec"]["replicas"]
    assert kubectl.apply(migmodel("team-a", "resnet", profiles=["1g.5gb"], capacity={"1g.5gb": 30})).status_code == 200
    settle(c, ctl, lambda: c.fake.get("MigModel", "resnet", "team-a")["status"]["observedGeneration"] == 2)
    a = c.fake.get("MigModel", "resnet", "team-a")
    assert cond(a, "ConfigValid")["status"] == "False" and "stays in force" in cond(a, "ConfigValid")["message"]
    assert cond(a, "Ready")["status"] == "True"
    assert c.fake.get("Deployment", "resnet-1g-10gb", "team-a")["spec"]["replicas"] == replicas_a
    assert cond(c.fake.get("MigModel", "bert", "team-b"), "ConfigValid")["status"] == "True"
    # ... and a valid change (a tighter SLO) takes effect and clears the condition
    assert kubectl.apply(migmodel("team-a", "resnet", slo={"p99_ms": 80})).status_code == 200
    settle(c, ctl, lambda: cond(c.fake.get("MigModel", "resnet", "team-a"), "ConfigValid")["status"] == "True")
    assert ctl.slo_p99_ms["resnet"] == 80.0
    assert cond(c.fake.get("MigModel", "resnet", "team-a"), "SLOMet")["status"] == "False"  # p99 90 > 80

    # team-b deletes bert: the garbage collector removes its workloads; team-a keeps serving
    assert kubectl.delete("team-b", "bert").status_code == 200
    c.wait(lambda: c.fake.get("Deployment", "bert-1g-10gb", "team-b") is None
           and c.fake.get("Service", "bert", "team-b") is None
           and c.fake.get("PodDisruptionBudget", "bert-1g-10gb", "team-b") is None, what="bert's workloads collected")
    c.wait(lambda: not [p for p in c.fake.list("Pod", "team-b")
                        if (p["metadata"].get("labels") or {}).get(MODEL_LABEL) == "bert"], what="bert's pods gone")
    tick(ctl)
    assert "bert" not in ctl.backend.models and "resnet" in ctl.backend.models
    assert c.fake.get("Deployment", "resnet-1g-10gb", "team-a")["spec"]["replicas"] >= 2

    # every request the controller sent is one k8s/base's RBAC grants
    from test_k8s_manifests import not_granted

    assert not_granted(c.fake, "migscale/ctl") == []

    # the holder of "resnet" is deleted: team-b's resnet takes the name over
    assert kubectl.delete("team-a", "resnet").status_code == 200
    settle(c, ctl, lambda: (cond(c.fake.get("MigModel", "resnet", "team-b"), "ConfigValid")["status"] == "True"
                            and c.fake.get("Deployment", "resnet-1g-10gb", "team-b") is not None))


def test_measured_numbers_alone_are_rewritten_at_most_every_30_s(world):
    c, kubectl, controller = world
    assert kubectl.apply(migmodel("team-a", "resnet")).status_code == 201
    ctl = controller({"resnet": 100.0})
    settle(c, ctl, lambda: (c.fake.get("MigModel", "resnet", "team-a").get("status") or {}).get("readyReplicas", 0) >= 2)
    tick(ctl, 2)

    def writes() -> int:
        return sum(1 for r in c.fake.writes() if r.path.endswith("/status") and "migmodels" in r.path)

    before = writes()
    for rps in (101.0, 103.0, 99.0):  # inside the policy's tolerance: no replica changes, only the numbers
        ctl.source.set_rate("resnet", rps, p99_ms=90.0 + rps / 10)
        tick(ctl)
    assert writes() == before
    ctl.clock.advance(30)
    tick(ctl)
    assert writes() == before + 1
    st = c.fake.get("MigModel", "resnet", "team-a")["status"]
    assert st["servedRps"] == 99.0 and st["p99Ms"] == 99.9


def test_status_desired_counts_replicas_queued_behind_a_repartition(world):
    """Replicas waiting for their node's re-cut are desired all along: the status never drops them
    to 0 while the repartition runs (a plan made then cannot place them), nor shows 1/0 once one is up."""
    c, kubectl, controller = world
    # one replica on each node (high availability), each node re-cut in turn
    assert kubectl.apply(migmodel("team-a", "resnet", profiles=["2g.20gb", "3g.40gb"],
                                  capacity={"2g.20gb": 113, "3g.40gb": 160}, high_availability=True)).status_code == 201
    ctl = controller({"resnet": 140.0})
    seen: list[tuple[int, int, str]] = []

    def ready() -> bool:
        st = c.fake.get("MigModel", "resnet", "team-a").get("status") or {}
        if "desiredReplicas" in st:
            seen.append((st["readyReplicas"], st["desiredReplicas"], st["profiles"]))
        return st.get("readyReplicas", 0) >= 2 and not ctl.backend.repartitioner.in_progress()

    settle(c, ctl, ready, timeout_s=30)
    assert sum(x.startswith("uncordon") for x in ctl.backend.repartitioner.log) == 2, "both nodes re-cut"
    assert seen and all(desired == 2 for _ready, desired, _text in seen), seen
    assert seen[-1][:2] == (2, 2)


# ---------------------------------------------------------------- the command


def test_cli_once_serves_migmodels_of_the_listed_namespaces(fake, tmp_path):
    from typer.testing import CliRunner

    from autoscaler.cli import app

    (tmp_path / "cluster.yaml").write_text(CLUSTER)
    fake.put_object(gpu_node("node-0", {"1g.10gb": 7}, config="all-1g.10gb"), manager="kubelet")
    kubectl = Kubectl(fake.url)
    assert kubectl.apply(migmodel("team-a", "resnet")).status_code == 201
    assert kubectl.apply(migmodel("team-c", "bert")).status_code == 201  # not a watched namespace
    args = ["controller", "-", str(tmp_path / "cluster.yaml"), "--migmodels", "team-a,team-b", "--once",
            "--kube-host", fake.url, "--no-leader-elect"]
    out = CliRunner().invoke(app, args)
    assert out.exit_code in (0, 1), out.output  # no Prometheus: a blind tick
    report = __import__("json").loads(out.stdout)
    assert [m["name"] for m in report["models"]] == ["resnet"]
    st = fake.get("MigModel", "resnet", "team-a")["status"]  # status written even on a blind tick
    assert cond({"status": st}, "ConfigValid")["status"] == "True"
    assert cond({"status": st}, "SLOMet")["reason"] == "MetricsUnavailable"  # missing data is not zero
    assert "servedRps" not in st
    assert "status" not in fake.get("MigModel", "bert", "team-c")


@pytest.mark.parametrize(("models", "option", "says"), [
    ("models.yaml", "all", "MODELS: with --migmodels"),
    ("-", None, "give --migmodels too"),
    ("-", "Team_A", "--migmodels: 'all' or comma-separated"),
])
def test_cli_migmodels_bad_input_exits_2_naming_it(tmp_path, models, option, says):
    from typer.testing import CliRunner

    from autoscaler.cli import app

    (tmp_path / "cluster.yaml").write_text(CLUSTER)
    args = ["controller", models, str(tmp_path / "cluster.yaml"), "--once", "--kube-host", "http://127.0.0.1:9"]
    out = CliRunner().invoke(app, [*args, *(["--migmodels", option] if option else [])])
    assert out.exit_code == 2 and says in out.output, out.output


# ---------------------------------------------------------------- the source alone


def test_source_relists_after_410_and_a_missing_crd_fails_start_up_naming_the_fix(fake, connect, tmp_path):
    from autoscaler.act.kubernetes.client import KubeError
    from autoscaler.config import parse_cluster

    cluster_cfg = parse_cluster({"gpus": [{"node": "node-0", "product": "A100-SXM4-80GB", "count": 1}]})
    # no CRD: the list answers 404, and start-up says how to install it
    fake.fail_next = [("GET", "/migmodels", 404)] * 20
    with pytest.raises(KubeError, match="kubectl apply -k k8s/base"):
        MigModelSource(connect(), cluster_cfg, sync_timeout_s=1)
    fake.fail_next = []
    kubectl = Kubectl(fake.url)
    assert kubectl.apply(migmodel("team-a", "resnet")).status_code == 201
    source = MigModelSource(connect(), cluster_cfg, namespaces=["team-a"], watch_timeout_s=5, start=False)
    inf = source.informers[0]
    inf.relist()  # listed, not yet watching
    assert [s.name for s in source.current().specs] == ["resnet"]
    # meanwhile bert comes and the history is compacted away: the watch from the list's version gets 410
    assert kubectl.apply(migmodel("team-a", "bert")).status_code == 201
    fake.expire_history("MigModel", "migscale.io")
    source.start()
    try:
        from k8s_helpers import wait_until

        wait_until(lambda: len(source.current().specs) == 2, 10, "the relist")
        assert inf.expired >= 1 and inf.lists >= 2
        assert source.current().namespaces == {"resnet": "team-a", "bert": "team-a"}
    finally:
        source.close()
