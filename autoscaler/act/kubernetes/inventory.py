"""Inventory on Kubernetes: the Node and Pod caches -> ``ClusterState`` (the "observe" half of the backend).

GPU feature discovery and the MIG manager describe each node in labels:
``nvidia.com/gpu.product`` (``NVIDIA-A100-SXM4-80GB``), ``nvidia.com/gpu.count``,
``nvidia.com/mig.strategy``, ``nvidia.com/mig-<profile>.count`` and
``nvidia.com/mig.config(.state)``; the device plugin publishes allocatable
``nvidia.com/mig-<profile>``. None of them says *where* on a GPU an instance
sits or which GPU of a multi-GPU node holds it. Which GPU holds what is read
from the mig-parted config the node's ``mig.config`` label names -- migscale
wrote it (``repartition.py``), per device index -- once mig-manager reports
it applied and its totals match the node's. Otherwise, and for a node cut by
someone else's config, counts per node are spread over its GPUs largest
profile first. Within a GPU each instance sits where the planner asked
for it when migscale cut the node (``Repartitioner.starts``), else at the
start ``best_start`` would pick: {3g.40gb: 1, 2g.20gb: 1, 1g.10gb: 2} on one A100 becomes 1g@0,
1g@1, 2g@2, 3g@4. The planner needs *a* valid layout with the right counts to
decide what still fits; the real starts do not matter on Kubernetes, where
the device plugin picks the instance. Which GPU holds what does matter:
spread from the node's totals, a repartition of one GPU reshuffled the layouts of its neighbours,
every pod on them was shown elsewhere, and the planner consolidated again.

Pods labelled ``app.kubernetes.io/managed-by: migscale`` become replicas; a
multinode group is one replica (its leader, worker-index 0). A pod bound to
a node keeps the instance it was given in an earlier snapshot, as long as
the node still has it; a new one takes the instance the planner chose for
it (``hints``, recorded when its placement gate is lifted) if no live pod
holds it -- a pod on its way out yields it, since which physical instance
each holds is not known and the planner's move freed it on purpose -- else
the first free instance of its profile there. Positions must be stable:
given afresh each snapshot, one new pod whose name sorts first moved every
other pod of its node, and the planner, seeing replicas move between GPUs,
kept consolidating GPUs that were only emptied on paper. A pod not yet
bound takes a free instance wherever one is left -- the scheduler will put
it on one -- and is STARTING; if no instance of its profile is free
anywhere it can never start, and it is FAILED, so the planner replaces it
(typically after a repartition) instead of waiting for it forever.

Both caches are informers (``informer.py``): a snapshot reads memory only.
The GPUs of a node are rebuilt only when the node's resourceVersion changes
(or its config becomes known), which keeps a 1,000-node snapshot cheap.
"""

from __future__ import annotations

from collections import Counter, deque
from collections.abc import Mapping, Sequence
from typing import Any

from autoscaler.act.kubernetes.informer import Informer
from autoscaler.act.kubernetes.render import (
    GFD_TO_PRODUCT,
    GPU_PRODUCT_LABEL,
    LWS_WORKER_INDEX,
    MIG_CONFIG_LABEL,
    MIG_RESOURCE_PREFIX,
    MIG_STATE_LABEL,
    MODEL_LABEL,
    PROFILE_LABEL,
    WHOLE,
    RenderConfig,
    profile_of_mig_name,
)
from autoscaler.mig.layout import Placement, best_start
from autoscaler.mig.products import PRODUCTS, Product
from autoscaler.policy.types import ClusterState, GpuState, Replica, ReplicaState

Obj = dict[str, Any]


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
        if k.startswith(MIG_RESOURCE_PREFIX) and _int(v, 0) > 0:
            out[profile_of_mig_name(k[len(MIG_RESOURCE_PREFIX):])] += _int(v, 0)
    return out


def mig_counts(node: Obj) -> Counter[str]:
    """Instances per profile on the node: GFD labels, else allocatable resources."""
    lbls = node["metadata"].get("labels") or {}
    out: Counter[str] = Counter()
    for k, v in lbls.items():
        if k.startswith(MIG_RESOURCE_PREFIX) and k.endswith(".count"):
            out[profile_of_mig_name(k[len(MIG_RESOURCE_PREFIX):-len(".count")])] += _int(v, 0)
    out = Counter({k: n for k, n in out.items() if n > 0})
    return out or allocatable_mig(node)


def pod_uses_gpu(pod: Obj) -> bool:
    for c in (pod.get("spec") or {}).get("containers") or []:
        res = c.get("resources") or {}
        for k in {**(res.get("limits") or {}), **(res.get("requests") or {})}:
            if k == "nvidia.com/gpu" or k.startswith(MIG_RESOURCE_PREFIX):
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


def applied_layouts(node: Obj, product: Product, count: int, counts: Counter[str],
                    configs: Mapping[str, Any], starts: tuple[str, Sequence[Any]] | None = None,
                    ) -> list[tuple[Placement, ...]] | None:
    """Per-GPU layouts from the mig-parted config the node's label names, once mig-manager has
    applied it (``mig.config.state=success``) and its totals match the node's: the config says
    which GPU holds which instances, where the node's counts alone do not (None: not known)."""
    lbls = node["metadata"].get("labels") or {}
    entry = configs.get(lbls.get(MIG_CONFIG_LABEL) or "")
    if not entry or lbls.get(MIG_STATE_LABEL) != "success":
        return None
    per: list[Counter[str] | None] = [None] * count
    try:
        for group in entry:
            for idx in group.get("devices") or []:
                if not 0 <= int(idx) < count:
                    return None
                per[int(idx)] = Counter(group.get("mig-devices") or {}) if group.get("mig-enabled") else Counter()
    except (AttributeError, TypeError, ValueError):
        return None
    if any(c is None for c in per) or sum((c for c in per if c), Counter()) != counts:
        return None
    if starts is not None and starts[0] == lbls.get(MIG_CONFIG_LABEL) and len(starts[1]) == count and all(
            Counter(p.profile for p in (lay or ())) == c for lay, c in zip(starts[1], per)):
        # the starts the planner asked for, where they match what was applied: shown at canonical
        # starts instead, 3g@0 + 1g@4,5,6 becomes 1g@1,2,3 + 3g@4 -- room for one more 1g the real cut
        # does not have, which the planner then cut again
        return [tuple(sorted(lay)) if lay else () for lay in starts[1]]
    return [spread(product, c, 1)[0] if c else () for c in per]


def node_gpus(node: Obj, cfg: RenderConfig, configs: Mapping[str, Any] | None = None,
              starts: tuple[str, Sequence[Any]] | None = None) -> list[GpuState]:
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
    if counts:
        layouts = applied_layouts(node, product, count, counts, configs or {}, starts) or spread(product, counts, count)
    else:
        layouts = [()] * count
    return [
        GpuState(id=f"{meta['name']}/{i}", node=meta["name"], product=product.name,
                 layout=layouts[i] if mig_enabled else (), mig_enabled=mig_enabled, rdma=rdma,
                 fabric=fabric, emulated=False)
        for i in range(count)
    ]


def node_of(gpu: str | None) -> str | None:
    """The node of a GPU id (``node/index``, as ``node_gpus`` names them)."""
    return gpu.rpartition("/")[0] if gpu else None


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


def metrics_url(pod: Obj) -> str | None:
    """``http://<pod IP>:<port>/metrics`` for a pod's container port named ``metrics``
    (Triton's, 8002 in the rendered Deployments); None while it has no IP or no such port."""
    ip = (pod.get("status") or {}).get("podIP")
    if not ip:
        return None
    for c in (pod.get("spec") or {}).get("containers") or []:
        for port in c.get("ports") or []:
            if port.get("name") == "metrics" and port.get("containerPort"):
                host = f"[{ip}]" if ":" in ip else ip  # an IPv6 pod IP goes in brackets
                return f"http://{host}:{int(port['containerPort'])}/metrics"
    return None


def _holds(by_id: dict[str, GpuState], node: str, spot: tuple[str, int], profile: str) -> bool:
    """Whether GPU ``spot[0]`` is on ``node`` and has an instance of ``profile`` at start ``spot[1]``."""
    g = by_id.get(spot[0])
    return g is not None and g.node == node and any(p.start == spot[1] and p.profile == profile for p in g.layout)


def pod_profile(pod: Obj) -> str:
    return ((pod["metadata"].get("labels") or {}).get(PROFILE_LABEL) or "").replace("_", "+")


class FreeInstances:
    """The instances a snapshot left free, by profile, in GPU order, skipping cordoned nodes; listed
    on the first ``take`` (most snapshots hand none out), each handed out once. Its callers take
    turns: the snapshot that made it, then ``PodPlacer.ungate`` under its lock."""

    def __init__(self, gpus: Sequence[GpuState], taken: set[tuple[str, int]], cordoned: set[str]) -> None:
        self._src = (gpus, taken, cordoned)
        self._free: dict[str, deque[tuple[str, int]]] | None = None

    def take(self, profile: str) -> tuple[str, int] | None:
        if self._free is None:
            gpus, taken, cordoned = self._src
            self._free = {}
            for g in gpus:
                if g.node not in cordoned:
                    for p in g.layout:
                        if (g.id, p.start) not in taken:
                            self._free.setdefault(p.profile, deque()).append((g.id, p.start))
        spots = self._free.get(profile)
        return spots.popleft() if spots else None


class KubeInventory:
    """``Inventory.snapshot()`` for a cluster with the GPU Operator (MIG mixed strategy), from informers."""

    def __init__(self, cfg: RenderConfig, nodes: Informer, pods: Informer,
                 hints: Mapping[str, tuple[str, int]] | None = None, configs: Mapping[str, Any] | None = None,
                 starts: Mapping[str, tuple[str, Sequence[Any]]] | None = None) -> None:
        self.cfg = cfg
        self.nodes = nodes
        self.pods = pods
        self.hints = hints if hints is not None else {}  # pod -> (gpu, start) the planner chose for it
        self.configs = configs if configs is not None else {}  # mig-parted config name -> entry
        self.starts = starts if starts is not None else {}  # node -> (config name, the planner's layouts)
        # node -> ((resourceVersion, whether its config is known, the planner's starts), its GPUs)
        self._gpus: dict[str, tuple[tuple[Any, ...], list[GpuState]]] = {}
        self._spots: dict[str, tuple[str, int]] = {}  # bound pod -> the instance the last snapshot gave it
        self._free = FreeInstances((), set(), set())  # the last snapshot's free instances, for ``take_free``
        self._shown: dict[str, tuple[str, int]] = {}  # unbound pod nobody placed -> where the last snapshot showed it

    def gpus(self) -> list[GpuState]:
        out: list[GpuState] = []
        seen = set()
        for node in self.nodes.items():
            name, rv = node["metadata"]["name"], node["metadata"].get("resourceVersion", "")
            seen.add(name)
            starts = self.starts.get(name)
            key = (rv, (node["metadata"].get("labels") or {}).get(MIG_CONFIG_LABEL, "") in self.configs, starts)
            hit = self._gpus.get(name)
            if hit is None or hit[0] != key:
                hit = (key, node_gpus(node, self.cfg, self.configs, starts))
                self._gpus[name] = hit
            out.extend(hit[1])
        for gone in set(self._gpus) - seen:
            del self._gpus[gone]
        return out

    def metrics_targets(self) -> dict[str, tuple[str, str]]:
        """``{pod: (model, metrics URL)}`` for every Ready, not terminating pod migscale runs
        (a multinode group's leader only: its Triton serves the group): the fast scrape's
        targets. Named as the snapshot names replicas, so both read the same pods."""
        out: dict[str, tuple[str, str]] = {}
        for pod in self.pods.items():
            meta = pod["metadata"]
            lbls = meta.get("labels") or {}
            model = lbls.get(MODEL_LABEL)
            if not model or meta.get("deletionTimestamp") or lbls.get(LWS_WORKER_INDEX, "0") != "0":
                continue
            url = metrics_url(pod) if is_ready(pod) else None
            if url is not None:
                out[meta["name"]] = (model, url)
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
        spots = self._place_bound(pods, by_node, by_id, taken)
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
            if not node and meta["name"] not in spots:
                unbound.append(pod)
                continue
            spot = spots.get(meta["name"])
            gpu, start = spot if spot is not None else (f"{node}/0", -1)
            replicas.append(Replica(meta["name"], model, profile, gpu, start, pod_state(pod)))
        cordoned = {n["metadata"]["name"] for n in self.nodes.items() if (n.get("spec") or {}).get("unschedulable")}
        shown: dict[str, tuple[str, int]] = {}  # unbound pod nobody placed -> the instance shown for it
        # where the scheduler could bind one: the first free instance in GPU order, not on a cordoned
        # node (one being repartitioned); what the unbound pods leave is what ``take_free`` hands out
        free = FreeInstances(gpus, taken, cordoned)
        for pod in unbound:
            meta = pod["metadata"]
            profile = pod_profile(pod)
            spot = free.take(profile)
            state = pod_state(pod)
            if spot is None:
                if state is not ReplicaState.DRAINING:
                    state = ReplicaState.FAILED  # no instance of its profile anywhere: it cannot start
                spot = ("", -1)
            else:
                shown[meta["name"]] = spot
            replicas.append(Replica(meta["name"], (meta.get("labels") or {}).get(MODEL_LABEL) or "", profile,
                                    spot[0], spot[1], state))
        self._spots = spots  # the pods gone (or unbound) are forgotten with it
        self._free, self._shown = free, shown  # replaced whole: ``take_free`` may run on the Pod informer's thread
        if reserved:
            gpus = [GpuState(**{**g.__dict__, "reserved_by": reserved[g.id]}) if g.id in reserved else g for g in gpus]
        return ClusterState(gpus=tuple(gpus), replicas=tuple(replicas))

    def take_free(self, pod: str, profile: str) -> tuple[str, int] | None:
        """Where to send ``pod``, which nobody placed: the instance the last snapshot showed it on (the
        plans made since count it there), else a free one of its ``profile`` as that snapshot showed
        them (first in GPU order, not on a cordoned node), taken so that it is not handed out twice;
        None if none (or no snapshot yet)."""
        shown = self._shown.pop(pod, None)
        return shown if shown is not None else self._free.take(profile)

    def _place_bound(self, pods: list[Obj], by_node: dict[str, list[GpuState]], by_id: dict[str, GpuState],
                     taken: set[tuple[str, int]]) -> dict[str, tuple[str, int]]:
        """The instance of each bound single-instance pod, in passes so that what the planner sees
        stays what it planned: live pods keep theirs; new live pods take the planner's choice if free;
        pods on their way out keep theirs where no live pod took it (which physical instance each
        holds is not known, and the leaving one is gone soon); the rest take the first free one.

        A pod not bound yet that the planner placed (pinned to its node, or kept gated for it)
        counts as a new live pod on the planner's instance: shown anywhere else, that instance
        would look free and the next plan would put a second replica on it."""
        bound: list[tuple[str, str, str, bool]] = []  # (pod, node, profile, leaving)
        for pod in pods:
            meta, node = pod["metadata"], (pod.get("spec") or {}).get("nodeName") or ""
            lbls = meta.get("labels") or {}
            profile = pod_profile(pod)
            if LWS_WORKER_INDEX in lbls or profile == WHOLE:
                continue
            leaving = bool(meta.get("deletionTimestamp"))
            if node:
                bound.append((meta["name"], node, profile, leaving))
            elif not leaving and meta["name"] in self.hints:
                planned = by_id.get(self.hints[meta["name"]][0])
                if planned is not None:
                    bound.append((meta["name"], planned.node, profile, False))
        spots: dict[str, tuple[str, int]] = {}

        def claim(name: str, node: str, profile: str, spot: tuple[str, int] | None) -> None:
            if spot is not None and spot not in taken and _holds(by_id, node, spot, profile):
                taken.add(spot)
                spots[name] = spot

        live = [b for b in bound if not b[3]]
        leaving = [b for b in bound if b[3]]
        for name, node, profile, _ in live:
            claim(name, node, profile, self._spots.get(name))
        for name, node, profile, _ in live:
            if name not in spots:
                claim(name, node, profile, self.hints.get(name))
        for name, node, profile, _ in leaving:
            claim(name, node, profile, self._spots.get(name))
        for name, node, profile, _ in live + leaving:
            if name not in spots:
                for g in by_node.get(node, []):
                    hit = next((p for p in g.layout if p.profile == profile and (g.id, p.start) not in taken), None)
                    if hit is not None:
                        claim(name, node, profile, (g.id, hit.start))
                        break
        return spots
