"""Inventory on Kubernetes: the Node and Pod caches -> ``ClusterState`` (the "observe" half of the backend).

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

Pods labelled ``app.kubernetes.io/managed-by: migscale`` become replicas; a
multinode group is one replica (its leader, worker-index 0). A pod bound to
a node keeps the instance it was given in an earlier snapshot, as long as
the node still has it; a new one takes the instance the planner chose for
it (``hints``, recorded when its placement gate is lifted) if that is free,
else the first free instance of its profile there. Positions must be stable:
given afresh each snapshot, one new pod whose name sorts first moved every
other pod of its node, and the planner, seeing replicas move between GPUs,
kept consolidating GPUs that were only emptied on paper. A pod not yet
bound takes a free instance wherever one is left -- the scheduler will put
it on one -- and is STARTING; if no instance of its profile is free
anywhere it can never start, and it is FAILED, so the planner replaces it
(typically after a repartition) instead of waiting for it forever.

Both caches are informers (``informer.py``): a snapshot reads memory only.
The GPUs of a node are rebuilt only when the node's resourceVersion changes,
which keeps a 1,000-node snapshot cheap.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from typing import Any

from autoscaler.act.kubernetes.informer import Informer
from autoscaler.act.kubernetes.render import (
    GFD_TO_PRODUCT,
    GPU_PRODUCT_LABEL,
    LWS_WORKER_INDEX,
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


def _int(v: Any, default: int) -> int:
    try:
        return int(v)
    except (TypeError, ValueError):
        return default


def allocatable_mig(node: Obj) -> Counter[str]:
    """MIG instances per profile the device plugin advertises (``status.allocatable``)."""
    alloc = (node.get("status") or {}).get("allocatable") or {}
    out: Counter[str] = Counter()
    for k, v in alloc.items():
        if k.startswith(MIG_PREFIX) and _int(v, 0) > 0:
            out[k[len(MIG_PREFIX):]] += _int(v, 0)
    return out


def mig_counts(node: Obj) -> Counter[str]:
    """Instances per profile on the node: GFD labels, else allocatable resources."""
    lbls = node["metadata"].get("labels") or {}
    out: Counter[str] = Counter()
    for k, v in lbls.items():
        if k.startswith(MIG_PREFIX) and k.endswith(".count"):
            out[k[len(MIG_PREFIX):-len(".count")]] += _int(v, 0)
    out = Counter({k: n for k, n in out.items() if n > 0})
    return out or allocatable_mig(node)


def pod_uses_gpu(pod: Obj) -> bool:
    for c in (pod.get("spec") or {}).get("containers") or []:
        res = c.get("resources") or {}
        for k in {**(res.get("limits") or {}), **(res.get("requests") or {})}:
            if k == "nvidia.com/gpu" or k.startswith(MIG_PREFIX):
                return True
    return False


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
    mig_enabled = bool(counts) or (
        lbls.get("nvidia.com/mig.strategy") in ("mixed", "single") and _int(alloc.get("nvidia.com/gpu"), 0) == 0
    )
    layouts = spread(product, counts, count) if counts else [()] * count
    return [
        GpuState(id=f"{meta['name']}/{i}", node=meta["name"], product=product.name,
                 layout=layouts[i] if mig_enabled else (), mig_enabled=mig_enabled, rdma=rdma,
                 fabric=fabric, emulated=False)
        for i in range(count)
    ]


def is_ready(pod: Obj) -> bool:
    return any(c.get("type") == "Ready" and c.get("status") == "True"
               for c in (pod.get("status") or {}).get("conditions") or [])


def unschedulable(pod: Obj) -> bool:
    return any(c.get("type") == "PodScheduled" and c.get("status") == "False" and c.get("reason") == "Unschedulable"
               for c in (pod.get("status") or {}).get("conditions") or [])


def pod_state(pod: Obj) -> ReplicaState:
    meta, st = pod["metadata"], pod.get("status") or {}
    if meta.get("deletionTimestamp"):
        return ReplicaState.DRAINING
    if st.get("phase") in ("Failed", "Unknown", "Succeeded"):
        return ReplicaState.FAILED
    for cs in st.get("containerStatuses") or []:
        waiting = (cs.get("state") or {}).get("waiting") or {}
        if waiting.get("reason") in ("CrashLoopBackOff", "ErrImagePull", "ImagePullBackOff"):
            return ReplicaState.FAILED
    return ReplicaState.READY if is_ready(pod) else ReplicaState.STARTING


def _holds(by_id: dict[str, GpuState], node: str, spot: tuple[str, int], profile: str) -> bool:
    """Whether GPU ``spot[0]`` is on ``node`` and has an instance of ``profile`` at start ``spot[1]``."""
    g = by_id.get(spot[0])
    return g is not None and g.node == node and any(p.start == spot[1] and p.profile == profile for p in g.layout)


def pod_profile(pod: Obj) -> str:
    return ((pod["metadata"].get("labels") or {}).get(PROFILE_LABEL) or "").replace("_", "+")


class KubeInventory:
    """``Inventory.snapshot()`` for a cluster with the GPU Operator (MIG mixed strategy), from informers."""

    def __init__(self, cfg: RenderConfig, nodes: Informer, pods: Informer,
                 hints: Mapping[str, tuple[str, int]] | None = None) -> None:
        self.cfg = cfg
        self.nodes = nodes
        self.pods = pods
        self.hints = hints if hints is not None else {}  # pod -> (gpu, start) the planner chose for it
        self._gpus: dict[str, tuple[str, list[GpuState]]] = {}  # node -> (resourceVersion, its GPUs)
        self._spots: dict[str, tuple[str, int]] = {}  # bound pod -> the instance the last snapshot gave it

    def gpus(self) -> list[GpuState]:
        out: list[GpuState] = []
        seen = set()
        for node in self.nodes.items():
            name, rv = node["metadata"]["name"], node["metadata"].get("resourceVersion", "")
            seen.add(name)
            hit = self._gpus.get(name)
            if hit is None or hit[0] != rv:
                hit = (rv, node_gpus(node, self.cfg))
                self._gpus[name] = hit
            out.extend(hit[1])
        for gone in set(self._gpus) - seen:
            del self._gpus[gone]
        return out

    def snapshot(self) -> ClusterState:
        gpus = self.gpus()
        by_node: dict[str, list[GpuState]] = {}
        for g in gpus:
            by_node.setdefault(g.node, []).append(g)
        taken: set[tuple[str, int]] = set()
        replicas: list[Replica] = []
        reserved: dict[str, str] = {}
        unbound: list[Obj] = []
        pods = sorted(self.pods.items(), key=lambda p: p["metadata"]["name"])
        by_id = {g.id: g for g in gpus}
        spots: dict[str, tuple[str, int]] = {}
        # first the pods that keep their instance, so a new pod never takes one from them
        for pod in pods:
            name, node = pod["metadata"]["name"], (pod.get("spec") or {}).get("nodeName") or ""
            old = self._spots.get(name)
            if node and old is not None and old not in taken and _holds(by_id, node, old, pod_profile(pod)):
                taken.add(old)
                spots[name] = old
        for pod in pods:
            meta = pod["metadata"]
            lbls = meta.get("labels") or {}
            model = lbls.get(MODEL_LABEL) or ""
            profile = pod_profile(pod)
            node = (pod.get("spec") or {}).get("nodeName") or ""
            if LWS_WORKER_INDEX in lbls or profile == WHOLE:
                for g in by_node.get(node, []):
                    reserved[g.id] = model
                if lbls.get(LWS_WORKER_INDEX, "0") != "0":
                    continue  # a group counts once, at its leader
                replicas.append(Replica(meta["name"], model, WHOLE, f"{node}/0" if node else "", 0, pod_state(pod)))
                continue
            if not node:
                unbound.append(pod)
                continue
            spot = spots.get(meta["name"])
            if spot is None:
                spot = self._new_spot(meta["name"], node, profile, by_node, by_id, taken)
                if spot is not None:
                    taken.add(spot)
                    spots[meta["name"]] = spot
            gpu, start = spot if spot is not None else (f"{node}/0", -1)
            replicas.append(Replica(meta["name"], model, profile, gpu, start, pod_state(pod)))
        for pod in unbound:
            meta = pod["metadata"]
            profile = pod_profile(pod)
            spot = next(((g.id, p.start) for g in gpus for p in g.layout
                         if p.profile == profile and (g.id, p.start) not in taken), None)
            state = pod_state(pod)
            if spot is None:
                if state is not ReplicaState.DRAINING:
                    state = ReplicaState.FAILED  # no instance of its profile anywhere: it cannot start
                spot = ("", -1)
            else:
                taken.add(spot)
            replicas.append(Replica(meta["name"], (meta.get("labels") or {}).get(MODEL_LABEL) or "", profile,
                                    spot[0], spot[1], state))
        self._spots = spots  # the pods gone (or unbound) are forgotten with it
        if reserved:
            gpus = [GpuState(**{**g.__dict__, "reserved_by": reserved[g.id]}) if g.id in reserved else g for g in gpus]
        return ClusterState(gpus=tuple(gpus), replicas=tuple(replicas))

    def _new_spot(self, pod: str, node: str, profile: str, by_node: dict[str, list[GpuState]],
                  by_id: dict[str, GpuState], taken: set[tuple[str, int]]) -> tuple[str, int] | None:
        """A newly seen bound pod's instance: the planner's choice if free on its node, else the first free one."""
        hint = self.hints.get(pod)
        if hint is not None and hint not in taken and _holds(by_id, node, hint, profile):
            return hint
        for g in by_node.get(node, []):
            hit = next((p for p in g.layout if p.profile == profile and (g.id, p.start) not in taken), None)
            if hit is not None:
                return (g.id, hit.start)
        return None
