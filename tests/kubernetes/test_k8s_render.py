"""Rendered objects: schema-valid, and carrying what the backend promises (resources, probes, HPA, LWS, mig-parted)."""

from __future__ import annotations

from pathlib import Path

import kubernetes_validate
import pytest
import yaml
from crdschema import validate_any
from typer.testing import CliRunner

from autoscaler.act.kubernetes.config import mig_configs, render_config
from autoscaler.act.kubernetes.migparted import mig_config_entry, mig_config_name, mig_parted_configmap
from autoscaler.act.kubernetes.render import (
    OwnerRef,
    RenderConfig,
    render_all,
)
from autoscaler.cli import app
from autoscaler.commands.k8s import planned_desired
from autoscaler.config import load_cluster, load_models, model_specs
from autoscaler.mig.layout import Placement

EX = Path(__file__).resolve().parents[2] / "examples"


@pytest.fixture(scope="module")
def example():
    models, cluster = load_models(EX / "models.yaml"), load_cluster(EX / "cluster.yaml")
    specs = model_specs(models, cluster)
    desired = planned_desired(specs, {"resnet": 250, "bert": 150, "rnn": 120, "llm": 3}, cluster)
    cfg = render_config(cluster)
    objs = render_all(specs, desired, cfg) + [mig_parted_configmap(mig_configs(cluster), cfg)]
    return cluster, specs, desired, cfg, objs


def by(objs, kind):
    return [o for o in objs if o["kind"] == kind]


def test_every_rendered_object_validates(example):
    *_, objs = example
    kinds = {o["kind"] for o in objs}
    assert {
        "Deployment",
        "Service",
        "PodDisruptionBudget",
        "PodMonitor",
        "LeaderWorkerSet",
        "ConfigMap",
    } <= kinds
    for o in objs:
        assert validate_any(o) == []
        try:
            kubernetes_validate.validate(o, kubernetes_validate.latest_version(), strict=True)
        except kubernetes_validate.SchemaNotFoundError:
            pass
        labels = o["metadata"]["labels"]
        assert labels["app.kubernetes.io/managed-by"] == "migscale"


def test_deployment_requests_one_mig_slice_and_drains(example):
    _cluster, _specs, desired, cfg, objs = example
    deps = by(objs, "Deployment")
    assert {d["metadata"]["name"] for d in deps} == {
        f"{m}-{p.replace('.', '-')}" for (m, p), n in desired.items() if n > 0 and m != "llm"
    }
    d = deps[0]
    model, profile = (
        d["metadata"]["labels"]["migscale.io/model"],
        d["metadata"]["labels"]["migscale.io/profile"],
    )
    assert d["spec"]["replicas"] == desired[(model, profile)]
    pod = d["spec"]["template"]["spec"]
    c = pod["containers"][0]
    assert c["resources"]["limits"] == {f"nvidia.com/mig-{profile}": 1}
    assert c["image"] == "nvcr.io/nvidia/tritonserver:24.10-py3"
    for arg in (
        "--model-control-mode=explicit",
        f"--load-model={model}",
        "--metrics-port=8002",
        "--metrics-config=summary_latencies=true",
    ):
        assert arg in c["args"]
    assert any(a.startswith("--model-repository=") for a in c["args"])
    assert c["readinessProbe"]["httpGet"]["path"] == "/v2/health/ready"
    assert "sleep" in " ".join(c["lifecycle"]["preStop"]["exec"]["command"])
    assert pod["terminationGracePeriodSeconds"] > cfg.drain_sleep_s
    term = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"
    ][0]
    expr = term["matchExpressions"][0]
    assert expr["key"] == "nvidia.com/gpu.product" and "NVIDIA-A100-SXM4-80GB" in expr["values"]
    # only MIG products of cluster.yaml; the RDMA pool's whole H100s are not MIG nodes
    assert "NVIDIA-H100-80GB-HBM3" not in expr["values"]
    pdb = next(p for p in by(objs, "PodDisruptionBudget") if p["metadata"]["name"] == d["metadata"]["name"])
    assert pdb["spec"]["selector"]["matchLabels"]["migscale.io/model"] == model


def test_no_hpa_is_rendered_for_a_workload_migscale_scales(example):
    """One owner of spec.replicas: migscale, through the scale subresource; an HPA would be a second."""
    *_, objs = example
    assert by(objs, "HorizontalPodAutoscaler") == []
    assert {o["kind"] for o in objs} >= {"Deployment", "PodDisruptionBudget"}
    for pdb in by(objs, "PodDisruptionBudget"):
        assert pdb["spec"] == {"maxUnavailable": 1, "selector": pdb["spec"]["selector"],
                               "unhealthyPodEvictionPolicy": "AlwaysAllow"}


def test_leaderworkerset_for_the_multinode_model(example):
    cluster, *_, objs = example
    lws = by(objs, "LeaderWorkerSet")[0]
    spec = lws["spec"]
    assert spec["replicas"] >= 1 and spec["startupPolicy"] == "LeaderCreated"
    lwt = spec["leaderWorkerTemplate"]
    assert lwt["size"] == 2 and lwt["restartPolicy"] == "RecreateGroupOnPodRestart"
    nccl = cluster.rdma_pool.nccl
    for tmpl in (lwt["leaderTemplate"], lwt["workerTemplate"]):
        assert tmpl["metadata"]["annotations"]["k8s.v1.cni.cncf.io/networks"] == "rdma-net"
        c = tmpl["spec"]["containers"][0]
        assert c["resources"]["limits"] == {"nvidia.com/gpu": 1, "rdma/rdma_shared_device_a": 1}
        assert c["securityContext"]["capabilities"]["add"] == ["IPC_LOCK"]
        env = {e["name"]: e["value"] for e in c["env"]}
        assert env["NCCL_IB_HCA"] == nccl.ib_hca and env["NCCL_NET_GDR_LEVEL"] == nccl.net_gdr_level
        assert env["NCCL_SOCKET_IFNAME"] == nccl.socket_ifname and env["NCCL_IB_GID_INDEX"] == str(
            nccl.ib_gid_index
        )
        shm = next(v for v in tmpl["spec"]["volumes"] if v["name"] == "dshm")
        assert shm["emptyDir"]["medium"] == "Memory"
        aff = tmpl["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
        exprs = aff["nodeSelectorTerms"][0]["matchExpressions"]
        assert exprs[0] == {"key": "migscale.io/fabric", "operator": "In", "values": ["ib-a"]}
        assert exprs[1] == {
            "key": "nvidia.com/gpu.product",
            "operator": "In",
            "values": ["NVIDIA-H100-80GB-HBM3"],
        }
    leader = lwt["leaderTemplate"]["spec"]["containers"][0]
    worker = lwt["workerTemplate"]["spec"]["containers"][0]
    assert "readinessProbe" in leader and "--allow-http=false" not in leader["args"]
    assert "--allow-http=false" in worker["args"] and "ports" not in worker
    svc = next(s for s in by(objs, "Service") if s["metadata"]["name"] == "llm")
    assert svc["spec"]["selector"]["leaderworkerset.sigs.k8s.io/worker-index"] == "0"


def test_mig_parted_entries():
    layout = (Placement(0, "3g.40gb"), Placement(4, "2g.20gb"), Placement(6, "1g.10gb"))
    entry = mig_config_entry([layout, layout, None])
    assert entry == [
        {"devices": [0, 1], "mig-enabled": True, "mig-devices": {"1g.10gb": 1, "2g.20gb": 1, "3g.40gb": 1}},
        {"devices": [2], "mig-enabled": False},
    ]
    name = mig_config_name(entry)
    assert name == mig_config_name(mig_config_entry([layout, layout, None]))  # content-addressed
    assert name != mig_config_name(mig_config_entry([layout, None, layout]))
    assert len(name) <= 63 and name.replace("-", "").isalnum()


def test_example_cluster_configmap(example):
    *_, objs = example
    cm = by(objs, "ConfigMap")[0]
    assert cm["metadata"]["namespace"] == "gpu-operator"
    doc = yaml.safe_load(cm["data"]["config.yaml"])
    (entry,) = doc["mig-configs"].values()  # node-a: two differently cut GPUs in one entry
    assert entry == [
        {"devices": [0], "mig-enabled": True, "mig-devices": {"3g.40gb": 2}},
        {"devices": [1], "mig-enabled": True, "mig-devices": {"1g.10gb": 1, "2g.20gb": 3}},
    ]


def test_owner_references_never_cross_namespaces(example):
    _, specs, desired, _, _ = example
    same = RenderConfig(
        namespace="default", owner=OwnerRef("apps/v1", "Deployment", "migscale", "u-1", "default")
    )
    other = RenderConfig(
        namespace="default", owner=OwnerRef("apps/v1", "Deployment", "migscale", "u-1", "migscale-system")
    )
    cm = mig_parted_configmap({"x": [{"devices": [0], "mig-enabled": False}]}, same)
    for o in [*render_all(specs, desired, same), cm]:
        refs = o["metadata"].get("ownerReferences")
        assert (refs is not None) == (o["metadata"].get("namespace") == "default")
    assert all("ownerReferences" not in o["metadata"] for o in render_all(specs, desired, other))


def test_render_command_prints_all_objects():
    res = CliRunner().invoke(
        app,
        [
            "render",
            str(EX / "models.yaml"),
            str(EX / "cluster.yaml"),
            "--demand",
            str(EX / "demand.yaml"),
            "--image",
            "registry.local/triton:1",
        ],
    )
    assert res.exit_code == 0, res.output
    objs = [d for d in yaml.safe_load_all(res.stdout) if d]
    assert {"Deployment", "LeaderWorkerSet", "PodMonitor", "ConfigMap"} <= {o["kind"] for o in objs}
    dep = next(o for o in objs if o["kind"] == "Deployment")
    assert dep["spec"]["template"]["spec"]["containers"][0]["image"] == "registry.local/triton:1"
    for o in objs:
        assert validate_any(o) == []


def test_render_command_bad_demand_exits_2(tmp_path):
    bad = tmp_path / "demand.yaml"
    bad.write_text("resnet: -5\nnosuch: 3\n")
    res = CliRunner().invoke(
        app, ["render", str(EX / "models.yaml"), str(EX / "cluster.yaml"), "--demand", str(bad)]
    )
    assert res.exit_code == 2
    assert "resnet" in res.output and "-5" in res.output and "nosuch" in res.output
    assert "Traceback" not in res.output


@pytest.mark.parametrize("image, ok", [
    ("nvcr.io/nvidia/tritonserver:24.10-py3", True), ("localhost:5000/team/triton:v2", True),
    ("triton@sha256:" + "a" * 64, True), ("bad image", False), ("nvcr.io/nvidia/tritonserver:", False),
    ("nvcr.io/Nvidia/Triton:1", False), ("triton:" + "t" * 129, False),
])
def test_render_refuses_an_image_the_kubelet_would_refuse(image, ok):
    # the kubelet reports InvalidImageName only once the pods exist; render says so at once
    res = CliRunner().invoke(app, ["render", str(EX / "models.yaml"), str(EX / "cluster.yaml"), "--image", image])
    if ok:
        assert res.exit_code == 0 and f"image: {image}" in res.output, res.output[-500:]
    else:
        assert res.exit_code == 2 and "--image: not an image reference" in res.output and repr(image) in res.output


def test_a_media_extension_profile_is_requested_by_the_device_plugins_resource_name(example):
    """``+`` may not stand in a resource name: NVIDIA's device plugin advertises ``1g.10gb+me``
    as ``nvidia.com/mig-1g.10gb.me``, which is what the pod must request and the inventory read."""
    import re

    from k8s_helpers import gpu_node

    from autoscaler.act.kubernetes.inventory import mig_counts
    from autoscaler.policy.types import ModelSpec

    _cluster, _specs, _desired, cfg, _objs = example
    spec = ModelSpec("video", {"1g.10gb+me": 20.0}, ("1g.10gb+me",), min_replicas=1, max_replicas=2)
    (dep, *_rest) = by(render_all([spec], {("video", "1g.10gb+me"): 1}, cfg), "Deployment")
    limits = dep["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"]
    assert limits == {"nvidia.com/mig-1g.10gb.me": 1}
    qualified = re.compile(r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
                           r"[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$")
    assert all(qualified.match(k) for k in limits)
    node = gpu_node("n", {"1g.10gb+me": 1, "1g.10gb": 5})
    assert mig_counts(node) == {"1g.10gb+me": 1, "1g.10gb": 5}
    node["metadata"]["labels"] = {}  # allocatable alone (no GFD) says the same
    assert mig_counts(node) == {"1g.10gb+me": 1, "1g.10gb": 5}
