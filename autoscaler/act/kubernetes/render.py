"""Kubernetes objects for a plan, as plain dicts: the "act" edge's pure half.

``act/kubernetes/backend.py`` applies what this module builds and ``migscale render``
prints it; neither adds fields of its own, so what you review in the rendered
YAML is exactly what the backend sends. Nothing here does I/O.

Per (model, MIG profile): a Deployment of Triton pods that each request one
``nvidia.com/mig-<profile>`` (one process sees one MIG device, docs/gpu-operator.md)
and a PodDisruptionBudget. Per model: a Service. Once: a PodMonitor for Triton
and the mig-parted ConfigMap that the GPU Operator's mig-manager reads. A
``backend: multinode`` model becomes a LeaderWorkerSet (one group =
``nodes_per_group`` pods on RDMA nodes) and a leader-only Service.

One owner per field: migscale owns ``spec.replicas`` of every workload it
renders and writes it only through the scale subresource, so nothing here
renders a HorizontalPodAutoscaler for them -- an HPA on the same workload
would be a second writer of the same number (docs/kubernetes.md,
"Who owns what"). ``spec.replicas`` appears only in the object that creates
the workload; the backend keeps the live value on every later update.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from autoscaler.mig.products import NVML_NAME_ALIASES, PRODUCTS
from autoscaler.policy.types import ModelSpec

Obj = dict[str, Any]

MANAGED_BY = "app.kubernetes.io/managed-by"
MANAGER = "migscale"
MODEL_LABEL = "migscale.io/model"
PROFILE_LABEL = "migscale.io/profile"
COMPONENT_LABEL = "app.kubernetes.io/component"
NAME_LABEL = "app.kubernetes.io/name"
LWS_WORKER_INDEX = "leaderworkerset.sigs.k8s.io/worker-index"
GPU_PRODUCT_LABEL = "nvidia.com/gpu.product"
MIG_CONFIG_LABEL = "nvidia.com/mig.config"
MIG_STATE_LABEL = "nvidia.com/mig.config.state"
MULTUS_ANNOTATION = "k8s.v1.cni.cncf.io/networks"
WHOLE = "whole"  # profile key of a multinode group in Plan.desired
PLACEMENT_GATE = "migscale.io/placement"  # a Deployment pod's scheduling gate (placer.py lifts it)
HOSTNAME_LABEL = "kubernetes.io/hostname"

# GPU feature discovery writes the NVML name with spaces turned into dashes
# ("NVIDIA A100-SXM4-80GB" -> "NVIDIA-A100-SXM4-80GB").
GFD_PRODUCTS: dict[str, tuple[str, ...]] = {}
for _nvml, _key in NVML_NAME_ALIASES.items():
    GFD_PRODUCTS.setdefault(_key, ())
    GFD_PRODUCTS[_key] += (_nvml.replace(" ", "-"),)
GFD_TO_PRODUCT: dict[str, str] = {v: k for k, vs in GFD_PRODUCTS.items() for v in vs}


@dataclass(frozen=True)
class Nccl:
    ib_hca: str = "mlx5_0:1"
    net_gdr_level: str = "PHB"
    socket_ifname: str = "eth0"
    ib_gid_index: int = 3


@dataclass(frozen=True)
class OwnerRef:
    """An object that owns what migscale creates (e.g. the controller Deployment).

    Owner references may not cross namespaces (the garbage collector would
    treat the owner as gone and delete the dependent), so it is attached only
    to objects in ``namespace``.
    """

    api_version: str
    kind: str
    name: str
    uid: str
    namespace: str | None = None

    def to_dict(self, controller: bool = False) -> Obj:
        out: Obj = {"apiVersion": self.api_version, "kind": self.kind, "name": self.name, "uid": self.uid}
        if controller:
            out["controller"] = True
        out["blockOwnerDeletion"] = False
        return out


# A container image reference as the registry's reference grammar has it
# (github.com/distribution/reference: [domain[:port]/]path[:tag][@digest], the path lowercase);
# the kubelet refuses anything else with InvalidImageName, long after the objects were applied.
_IMAGE = re.compile(
    r"^(?:(?:[a-zA-Z0-9]|[a-zA-Z0-9][a-zA-Z0-9-]*[a-zA-Z0-9])(?:\.(?:[a-zA-Z0-9]|[a-zA-Z0-9][a-zA-Z0-9-]*[a-zA-Z0-9]))*"
    r"(?::[0-9]+)?/)?"
    r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*(?:/[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*)*"
    r"(?::[\w][\w.-]{0,127})?"
    r"(?:@[A-Za-z][A-Za-z0-9]*(?:[-_+.][A-Za-z][A-Za-z0-9]*)*:[0-9a-fA-F]{32,})?$"
)


def image_problem(ref: str) -> str | None:
    """Why ``ref`` is not a container image reference, or None."""
    if len(ref) > 255 or not _IMAGE.match(ref):
        return (f"not an image reference ([registry/]name[:tag][@digest], the name in lowercase), "
                f"got {ref!r}")
    return None


@dataclass(frozen=True)
class RenderConfig:
    namespace: str = "default"
    image: str = "nvcr.io/nvidia/tritonserver:24.10-py3"
    model_repository: str = "/models"
    model_repository_volume: Mapping[str, Any] = field(
        default_factory=lambda: {"persistentVolumeClaim": {"claimName": "triton-models", "readOnly": True}}
    )
    # preStop: 10 s lets kube-proxy / endpoint slices drop the pod before
    # Triton gets SIGTERM; Triton then finishes in-flight requests. The grace
    # period must cover both: 10 s + up to 50 s of draining = 60 s.
    drain_sleep_s: int = 10
    termination_grace_s: int = 60
    products: tuple[str, ...] = tuple(PRODUCTS)  # product keys of the MIG GPUs in the cluster
    rdma_products: tuple[str, ...] = ()  # product keys of the RDMA pool (whole GPUs); () = any
    rdma_resource: str = "rdma/rdma_shared_device_a"
    rdma_network: str = "rdma-net"  # NetworkAttachmentDefinition for Multus
    fabric_label: str = "migscale.io/fabric"
    nccl: Nccl = Nccl()
    shm_size: str = "16Gi"
    mig_parted_namespace: str = "gpu-operator"
    mig_parted_configmap: str = "migscale-mig-parted-config"
    owner: OwnerRef | None = None


def slug(text: str) -> str:
    """``1g.10gb+me`` -> ``1g-10gb-me``: a DNS-1123 label fragment."""
    out = "".join(c if c.isalnum() else "-" for c in text.lower())
    while "--" in out:
        out = out.replace("--", "-")
    return out.strip("-")


def label_value(text: str) -> str:
    """Label values allow ``[A-Za-z0-9._-]``; ``+`` (as in ``1g.10gb+me``) becomes ``_``."""
    return "".join(c if c.isalnum() or c in "._-" else "_" for c in text)[:63]


def workload_name(model: str, profile: str) -> str:
    return model if profile == WHOLE else f"{model}-{slug(profile)}"


def labels(model: str | None = None, profile: str | None = None, component: str = "triton") -> dict[str, str]:
    out = {MANAGED_BY: MANAGER, NAME_LABEL: "migscale", COMPONENT_LABEL: component}
    if model is not None:
        out[MODEL_LABEL] = model
    if profile is not None:
        out[PROFILE_LABEL] = label_value(profile)
    return out


def _meta(name: str, cfg: RenderConfig, lbls: Mapping[str, str], namespace: str | None = "") -> Obj:
    ns = cfg.namespace if namespace == "" else namespace
    meta: Obj = {"name": name, "labels": dict(lbls)}
    if ns is not None:
        meta["namespace"] = ns
    if cfg.owner is not None and cfg.owner.namespace is not None and cfg.owner.namespace == ns:
        meta["ownerReferences"] = [cfg.owner.to_dict()]
    return meta


MIG_RESOURCE_PREFIX = "nvidia.com/mig-"


def mig_name(profile: str) -> str:
    """``1g.10gb+me`` -> ``1g.10gb.me``: a profile as the device plugin and GFD name it (mixed strategy).

    ``+`` is not allowed in a resource name or a label key, so NVIDIA's plugin writes it as ``.``:
    the resource ``nvidia.com/mig-1g.10gb.me`` and the label ``nvidia.com/mig-1g.10gb.me.count``."""
    return profile.replace("+", ".")


def profile_of_mig_name(name: str) -> str:
    """``1g.10gb.me`` -> ``1g.10gb+me``: the inverse of :func:`mig_name` (``<g>g.<mem>gb`` then attributes)."""
    parts = name.split(".")
    return ".".join(parts[:2]) + "".join(f"+{a}" for a in parts[2:])


def mig_resource(profile: str) -> str:
    """The extended resource a pod requests for one instance of ``profile``."""
    return MIG_RESOURCE_PREFIX + mig_name(profile)


def products_with_profile(profile: str, products: Iterable[str]) -> list[str]:
    """GFD product label values of every product (present) that offers ``profile``."""
    out: list[str] = []
    for key in products:
        p = PRODUCTS.get(key)
        if p is not None and profile in p.profiles:
            out.extend(GFD_PRODUCTS.get(key, (key,)))
    return sorted(set(out))


def triton_args(cfg: RenderConfig, model: str, *, serve: bool = True) -> list[str]:
    args = [
        f"--model-repository={cfg.model_repository}",
        "--model-control-mode=explicit",
        f"--load-model={model}",
        "--metrics-port=8002",
        "--metrics-config=summary_latencies=true",
    ]
    if not serve:  # a multinode worker rank: only the leader serves HTTP/gRPC/metrics
        args += ["--allow-http=false", "--allow-grpc=false", "--allow-metrics=false"]
    return args


def _triton_container(cfg: RenderConfig, model: str, resources: Obj, *, serve: bool = True) -> Obj:
    c: Obj = {
        "name": "triton",
        "image": cfg.image,
        "command": ["tritonserver"],
        "args": triton_args(cfg, model, serve=serve),
        "resources": resources,
        "volumeMounts": [{"name": "models", "mountPath": cfg.model_repository, "readOnly": True}],
        "lifecycle": {
            # Sleep first so the endpoint is removed while Triton still serves;
            # on SIGTERM Triton stops accepting and finishes what is in flight.
            "preStop": {"exec": {"command": ["/bin/sh", "-c", f"sleep {cfg.drain_sleep_s}"]}}
        },
    }
    if serve:
        c["ports"] = [
            {"name": "http", "containerPort": 8000, "protocol": "TCP"},
            {"name": "grpc", "containerPort": 8001, "protocol": "TCP"},
            {"name": "metrics", "containerPort": 8002, "protocol": "TCP"},
        ]
        c["readinessProbe"] = {
            "httpGet": {"path": "/v2/health/ready", "port": "http"},
            "periodSeconds": 5,
            "failureThreshold": 3,
        }
        c["livenessProbe"] = {
            "httpGet": {"path": "/v2/health/live", "port": "http"},
            "periodSeconds": 10,
            "failureThreshold": 6,
        }
        # Model loading can take minutes; the startup probe holds liveness off until then.
        c["startupProbe"] = {
            "httpGet": {"path": "/v2/health/live", "port": "http"},
            "periodSeconds": 5,
            "failureThreshold": 120,
        }
    return c


def deployment(spec: ModelSpec, profile: str, replicas: int, cfg: RenderConfig) -> Obj:
    lbls = labels(spec.name, profile)
    resource = mig_resource(profile)
    products = products_with_profile(profile, cfg.products)
    affinity = {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [
                    {
                        "matchExpressions": [
                            {"key": GPU_PRODUCT_LABEL, "operator": "In", "values": products or ["none"]}
                        ]
                    }
                ]
            }
        }
    }
    pod_spec: Obj = {
        "affinity": affinity,
        "terminationGracePeriodSeconds": cfg.termination_grace_s,
        "containers": [_triton_container(cfg, spec.name, {"limits": {resource: 1}})],
        "volumes": [{"name": "models", **dict(cfg.model_repository_volume)}],
        # held back from the scheduler until migscale names the node the planner chose
        # (it adds a hostname requirement and removes the gate: Pod Scheduling Readiness)
        "schedulingGates": [{"name": PLACEMENT_GATE}],
    }
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": _meta(workload_name(spec.name, profile), cfg, lbls),
        "spec": {
            "replicas": replicas,
            "selector": {
                "matchLabels": {
                    MODEL_LABEL: spec.name,
                    PROFILE_LABEL: lbls[PROFILE_LABEL],
                    MANAGED_BY: MANAGER,
                }
            },
            # make-before-break: a new pod is ready before an old one goes
            "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}},
            "template": {"metadata": {"labels": lbls}, "spec": pod_spec},
        },
    }


def pod_disruption_budget(spec: ModelSpec, profile: str, cfg: RenderConfig) -> Obj:
    lbls = labels(spec.name, profile)
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": _meta(workload_name(spec.name, profile), cfg, lbls),
        # one pod at a time, so a drain for repartitioning never empties a model at once. A pod
        # that is not Ready (loading, crash-looping) serves nothing and may always go: under the
        # default policy the API server refuses its eviction (429) whenever the budget wants no
        # unhealthy pod -- always at one replica, where desiredHealthy is 0 -- and a drain
        # would wait out its timeout on a pod that protects nobody
        "spec": {
            "maxUnavailable": 1,
            "selector": {"matchLabels": {MODEL_LABEL: spec.name, PROFILE_LABEL: lbls[PROFILE_LABEL]}},
            "unhealthyPodEvictionPolicy": "AlwaysAllow",
        },
    }


def service(spec: ModelSpec, cfg: RenderConfig) -> Obj:
    selector = {MODEL_LABEL: spec.name, MANAGED_BY: MANAGER}
    if spec.backend == "multinode":
        selector[LWS_WORKER_INDEX] = "0"  # only the leader (rank 0) serves
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _meta(spec.name, cfg, labels(spec.name)),
        "spec": {
            "selector": selector,
            "ports": [
                {"name": "http", "port": 8000, "targetPort": "http", "protocol": "TCP"},
                {"name": "grpc", "port": 8001, "targetPort": "grpc", "protocol": "TCP"},
                {"name": "metrics", "port": 8002, "targetPort": "metrics", "protocol": "TCP"},
            ],
        },
    }


def pod_monitor(cfg: RenderConfig) -> Obj:
    return {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PodMonitor",
        "metadata": _meta("migscale-triton", cfg, labels()),
        "spec": {
            "selector": {"matchLabels": {MANAGED_BY: MANAGER, COMPONENT_LABEL: "triton"}},
            "podMetricsEndpoints": [{"port": "metrics", "path": "/metrics", "interval": "15s"}],
        },
    }


def leader_worker_set(spec: ModelSpec, groups: int, cfg: RenderConfig) -> Obj:
    size = max(1, spec.nodes_per_group)
    lbls = labels(spec.name, WHOLE)
    resources = {"limits": {"nvidia.com/gpu": spec.gpus_per_node, cfg.rdma_resource: 1}}
    env = [
        {"name": "NCCL_IB_HCA", "value": cfg.nccl.ib_hca},
        {"name": "NCCL_NET_GDR_LEVEL", "value": cfg.nccl.net_gdr_level},
        {"name": "NCCL_SOCKET_IFNAME", "value": cfg.nccl.socket_ifname},
        {"name": "NCCL_IB_GID_INDEX", "value": str(cfg.nccl.ib_gid_index)},
        # LWS injects LWS_LEADER_ADDRESS / LWS_GROUP_SIZE / LWS_WORKER_INDEX;
        # the model's collective (torch.distributed) reads the usual names.
        {"name": "MASTER_ADDR", "value": "$(LWS_LEADER_ADDRESS)"},
        {"name": "MASTER_PORT", "value": "29500"},
        {"name": "WORLD_SIZE", "value": "$(LWS_GROUP_SIZE)"},
        {"name": "RANK", "value": "$(LWS_WORKER_INDEX)"},
    ]
    terms = [{"key": cfg.fabric_label, "operator": "Exists"}]
    if spec.fabric:
        terms = [{"key": cfg.fabric_label, "operator": "In", "values": [spec.fabric]}]
    gfd = sorted({v for key in cfg.rdma_products for v in GFD_PRODUCTS.get(key, (key,))})
    if gfd:
        terms = terms + [{"key": GPU_PRODUCT_LABEL, "operator": "In", "values": gfd}]

    def template(serve: bool) -> Obj:
        c = _triton_container(cfg, spec.name, resources, serve=serve)
        c["env"] = env
        c["securityContext"] = {"capabilities": {"add": ["IPC_LOCK"]}}
        c["volumeMounts"] = c["volumeMounts"] + [{"name": "dshm", "mountPath": "/dev/shm"}]
        return {
            "metadata": {"labels": lbls, "annotations": {MULTUS_ANNOTATION: cfg.rdma_network}},
            "spec": {
                "affinity": {
                    "nodeAffinity": {
                        "requiredDuringSchedulingIgnoredDuringExecution": {
                            "nodeSelectorTerms": [{"matchExpressions": terms}]
                        }
                    }
                },
                "terminationGracePeriodSeconds": cfg.termination_grace_s,
                "containers": [c],
                "volumes": [
                    {"name": "models", **dict(cfg.model_repository_volume)},
                    # NCCL's shared-memory transport needs more than the 64 MiB default /dev/shm
                    {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": cfg.shm_size}},
                ],
            },
        }

    return {
        "apiVersion": "leaderworkerset.x-k8s.io/v1",
        "kind": "LeaderWorkerSet",
        "metadata": _meta(spec.name, cfg, lbls),
        "spec": {
            "replicas": groups,
            "startupPolicy": "LeaderCreated",
            "leaderWorkerTemplate": {
                "size": size,
                "restartPolicy": "RecreateGroupOnPodRestart",
                "leaderTemplate": template(serve=True),
                "workerTemplate": template(serve=False),
            },
        },
    }


# ---------------------------------------------------------------- everything


def model_objects(spec: ModelSpec, desired: Mapping[tuple[str, str], int], cfg: RenderConfig) -> list[Obj]:
    """Every object one model needs, for the replica counts in ``desired``.

    A (model, profile) with 0 replicas gets no Deployment: the backend scales
    one it had there to 0 and deletes it once its pods are gone.
    """
    out: list[Obj] = [service(spec, cfg)]
    if spec.backend == "multinode":
        groups = sum(n for (m, _p), n in desired.items() if m == spec.name)
        if groups > 0:
            out.append(leader_worker_set(spec, groups, cfg))
        return out
    for (m, profile), n in sorted(desired.items()):
        if m != spec.name or n <= 0:
            continue
        out += [deployment(spec, profile, n, cfg), pod_disruption_budget(spec, profile, cfg)]
    return out


def render_all(
    models: Sequence[ModelSpec], desired: Mapping[tuple[str, str], int], cfg: RenderConfig
) -> list[Obj]:
    """Every workload object for ``desired`` (the mig-parted ConfigMap: ``k8s_migparted``)."""
    out: list[Obj] = []
    for spec in models:
        out += model_objects(spec, desired, cfg)
    out.append(pod_monitor(cfg))
    return out

