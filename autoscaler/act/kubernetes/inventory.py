"""Inventory on Kubernetes: Nodes and Triton pods -> ``ClusterState`` (the "observe" half of the backend).

GPU feature discovery and the MIG manager describe each node in labels:
``nvidia.com/gpu.product`` (``NVIDIA-A100-SXM4-80GB``), ``nvidia.com/gpu.count``,
``nvidia.com/mig.strategy``, ``nvidia.com/mig-<profile>.count`` and
``nvidia.com/mig.config(.state)``; the device plugin publishes allocatable
``nvidia.com/mig-<profile>``. None of them says *where* on a GPU an instance
sits or which GPU of a multi-GPU node holds it, so the layout is
reconstructed: counts per node are spread over its GPUs largest profile first,
each at the start ``best_start`` would pick: {3g.40gb: 1, 2g.20gb: 1,
1g.10gb: 2} on one A100 becomes 1g@0, 1g@1, 2g@2, 3g@4. The planner needs
*a* valid layout with the right counts to decide what still fits; the real
starts do not matter on Kubernetes, where the device plugin picks the instance.

Pods labelled ``app.kubernetes.io/managed-by: migscale`` become replicas;
a multinode group is one replica (its leader, worker-index 0).
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from autoscaler.act.kubernetes.client import KubeRest
from autoscaler.act.kubernetes.render import (
    GFD_TO_PRODUCT,
    GPU_PRODUCT_LABEL,
    LWS_WORKER_INDEX,
    MANAGED_BY,
    MANAGER,
    MODEL_LABEL,
    PROFILE_LABEL,
    WHOLE,
    RenderConfig,
)
from autoscaler.mig.layout import Placement, best_start
from autoscaler.mig.products import PRODUCTS, Product
from autoscaler.policy.types import ClusterState, GpuState, Replica, ReplicaState

Obj = dict[str, Any]
MIG_PREFIX = "nvidia.com/mig-"


def product_of(label: str | None) -> Product | None:
    """``NVIDIA-A100-SXM4-80GB`` (or, single strategy, ``...-MIG-1g.10gb``) -> Product."""
    if not label:
        return None
    base = label.split("-MIG-")[0]
    key = GFD_TO_PRODUCT.get(base) or (base if base in PRODUCTS else None)
    return PRODUCTS.get(key) if key else None


def mig_counts(node: Obj) -> Counter[str]:
    """Instances per profile on the node: GFD labels, else allocatable resources."""
    lbls = node["metadata"].get("labels") or {}
    out: Counter[str] = Counter()
    for k, v in lbls.items():
        if k.startswith(MIG_PREFIX) and k.endswith(".count"):
            try:
                out[k[len(MIG_PREFIX) : -len(".count")]] += int(v)
            except ValueError:
                continue
    if not out:
        alloc = (node.get("status") or {}).get("allocatable") or {}
        for k, v in alloc.items():
            if k.startswith(MIG_PREFIX):
                try:
                    out[k[len(MIG_PREFIX) :]] += int(v)
                except ValueError:
                    continue
    return Counter({k: n for k, n in out.items() if n > 0})


def spread(product: Product, counts: Counter[str], gpus: int) -> list[tuple[Placement, ...]]:
    """Place ``counts`` on ``gpus`` GPUs, biggest first; what cannot be placed is dropped."""
    layouts: list[list[Placement]] = [[] for _ in range(max(1, gpus))]
    order = sorted(
        (p for p in counts if p in product.profiles),
        key=lambda p: (-product.profiles[p].mem_slots, -product.profiles[p].compute, p),
    )
    for prof in order:
        for _ in range(counts[prof]):
            for lay in layouts:
                start = best_start(product, lay, prof)
                if start is not None:
                    lay.append(Placement(start, prof))
                    break
    return [tuple(sorted(lay)) for lay in layouts]


def _int(v: Any, default: int) -> int:
    try:
        return int(v)
    except (TypeError, ValueError):
        return default


def node_gpus(node: Obj, cfg: RenderConfig) -> list[GpuState]:
    meta = node["metadata"]
    lbls = meta.get("labels") or {}
    product = product_of(lbls.get(GPU_PRODUCT_LABEL))
    if product is None:
        return []
    alloc = (node.get("status") or {}).get("allocatable") or {}
    count = _int(lbls.get("nvidia.com/gpu.count"), 1)
    counts = mig_counts(node)
    fabric = lbls.get(cfg.fabric_label)
    rdma = fabric is not None or _int(alloc.get(cfg.rdma_resource), 0) > 0
    mig_enabled = (
        bool(counts)
        or lbls.get("nvidia.com/mig.strategy") in ("mixed", "single")
        and _int(alloc.get("nvidia.com/gpu"), 0) == 0
    )
    layouts = spread(product, counts, count) if counts else [()] * count
    return [
        GpuState(
            id=f"{meta['name']}/{i}",
            node=meta["name"],
            product=product.name,
            layout=layouts[i] if mig_enabled else (),
            mig_enabled=mig_enabled,
            rdma=rdma,
            fabric=fabric,
            emulated=False,
        )
        for i in range(count)
    ]


def pod_state(pod: Obj) -> ReplicaState:
    meta, st = pod["metadata"], pod.get("status") or {}
    if meta.get("deletionTimestamp"):
        return ReplicaState.DRAINING
    if st.get("phase") in ("Failed", "Unknown"):
        return ReplicaState.FAILED
    for cs in st.get("containerStatuses") or []:
        waiting = (cs.get("state") or {}).get("waiting") or {}
        if waiting.get("reason") in ("CrashLoopBackOff", "ErrImagePull", "ImagePullBackOff"):
            return ReplicaState.FAILED
    for cond in st.get("conditions") or []:
        if cond.get("type") == "Ready" and cond.get("status") == "True":
            return ReplicaState.READY
    return ReplicaState.STARTING


class KubeInventory:
    """``Inventory.snapshot()`` for a cluster with the GPU Operator (MIG mixed strategy)."""

    def __init__(self, rest: KubeRest, cfg: RenderConfig) -> None:
        self.rest = rest
        self.cfg = cfg

    def nodes(self) -> list[Obj]:
        return self.rest.list("v1", "Node", None)

    def pods(self, node: str | None = None) -> list[Obj]:
        return self.rest.list(
            "v1",
            "Pod",
            self.cfg.namespace,
            label_selector=f"{MANAGED_BY}={MANAGER},{MODEL_LABEL}",
            field_selector=f"spec.nodeName={node}" if node else None,
        )

    def snapshot(self) -> ClusterState:
        gpus: list[GpuState] = []
        for node in self.nodes():
            gpus.extend(node_gpus(node, self.cfg))
        by_node: dict[str, list[GpuState]] = {}
        for g in gpus:
            by_node.setdefault(g.node, []).append(g)
        taken: set[tuple[str, int]] = set()
        replicas: list[Replica] = []
        reserved: dict[str, str] = {}
        for pod in sorted(self.pods(), key=lambda p: p["metadata"]["name"]):
            meta = pod["metadata"]
            lbls = meta.get("labels") or {}
            model = lbls.get(MODEL_LABEL)
            profile = (lbls.get(PROFILE_LABEL) or "").replace("_", "+")
            node = (pod.get("spec") or {}).get("nodeName") or ""
            if LWS_WORKER_INDEX in lbls or profile == WHOLE:
                for g in by_node.get(node, []):
                    reserved[g.id] = model or ""
                if lbls.get(LWS_WORKER_INDEX, "0") != "0":
                    continue  # a group counts once, at its leader
                gpu, start, profile = (f"{node}/0" if node else ""), 0, WHOLE
            else:
                gpu, start = "", -1
                for g in by_node.get(node, []):  # the first free instance of this profile
                    hit = next(
                        (p for p in g.layout if p.profile == profile and (g.id, p.start) not in taken), None
                    )
                    if hit is not None:
                        taken.add((g.id, hit.start))
                        gpu, start = g.id, hit.start
                        break
            replicas.append(
                Replica(
                    id=meta["name"],
                    model=model or "",
                    profile=profile,
                    gpu=gpu,
                    start=start,
                    state=pod_state(pod),
                )
            )
        if reserved:
            gpus = [
                GpuState(**{**g.__dict__, "reserved_by": reserved[g.id]}) if g.id in reserved else g
                for g in gpus
            ]
        return ClusterState(gpus=tuple(gpus), replicas=tuple(replicas))
