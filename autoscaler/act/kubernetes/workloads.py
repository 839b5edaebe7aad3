"""migscale's workloads on a cluster: the caches that describe them and the few writes that change them.

Place in the loop: under the backend's rollout (``rollout.py``), which decides
*when*; this module knows *how*. One owner per field (docs/kubernetes.md):

- ``spec.replicas`` of every migscale Deployment / LeaderWorkerSet is written
  only here, only through the scale subresource (``scale``), never by
  re-applying a template (``apply_object(keep_replicas=True)``). If a
  HorizontalPodAutoscaler targets one of them, migscale stops scaling it and
  says so (``foreign_scaler``: a Warning Event and the model's condition):
  two writers of one number is a bug, and the HPA's presence is the user's
  statement of who should own it;
- the template, the PodDisruptionBudget and the Service are created and
  updated here; their status belongs to their controllers;
- a workload the plan no longer wants is scaled to 0 and deleted only once
  its last pod is gone (``sweep``): deleting a Deployment with pods would
  remove them all at once, past any budget;
- ``prefer_removal`` sets ``controller.kubernetes.io/pod-deletion-cost`` on a
  pod the planner chose to drain, so the ReplicaSet removes that one on the
  next scale-down (the ReplicaSet ranks lower cost first among equally ready
  pods);
- ``ungate`` puts a new pod where the planner placed it: every Deployment pod
  is created with the scheduling gate ``migscale.io/placement``
  (Pod Scheduling Readiness: the scheduler leaves a gated pod alone); once it
  exists, migscale adds ``kubernetes.io/hostname In [node]`` to its required
  node affinity -- the one change the API server allows on a gated pod's
  affinity -- and lifts the gate. If that node's free instance is held only
  by a pod on its way out, the pod stays gated until that one is gone. A pod
  nobody placed (the ReplicaSet replacing an evicted or crashed one), or whose
  node has no free instance by now, is pinned the same way to a free instance
  of the last snapshot (``KubeInventory.take_free``), and the inventory shows
  it there. Each waits gated for at most ``PLACEMENT_TTL_S``; after that the
  scheduler chooses. Without this the planner's packing and the scheduler's
  choice would pull against each other tick after tick: a bin-packing
  scheduler sends a pod it places to the fullest node, often onto the
  instance the planner has just given to another new pod;
- ``unpin`` recreates a pod pinned that way whose node filled up before the
  scheduler bound it (its affinity is frozen once ungated, so it would stay
  Unschedulable for good): after ``UNPIN_AFTER_S`` it is deleted and the
  ReplicaSet's replacement is placed afresh.

Reads come from informers (``Caches``), so a steady tick sends nothing. A
scale written a moment ago may not be in the cache yet; ``size`` uses the
value we wrote until the cache shows it (or 10 s have passed).
"""

from __future__ import annotations

import copy
import threading
from collections import OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from autoscaler.act.kubernetes.client import KubeError, KubeRest, NotOwned, apply_object, owned
from autoscaler.act.kubernetes.informer import Informer
from autoscaler.act.kubernetes.inventory import is_ready, node_of, pod_profile
from autoscaler.act.kubernetes.render import (
    HOSTNAME_LABEL,
    LWS_WORKER_INDEX,
    MANAGED_BY,
    MANAGER,
    MODEL_LABEL,
    PLACEMENT_GATE,
    PROFILE_LABEL,
    WHOLE,
    OwnerRef,
    RenderConfig,
    deployment,
    leader_worker_set,
    pod_disruption_budget,
    pod_monitor,
    service,
    workload_name,
)
from autoscaler.clock import Clock
from autoscaler.policy.types import ModelSpec

Obj = dict[str, Any]
DEPLOY = ("apps/v1", "Deployment")
LWS = ("leaderworkerset.x-k8s.io/v1", "LeaderWorkerSet")
DELETION_COST = "controller.kubernetes.io/pod-deletion-cost"
LOWEST_COST = "-2147483648"  # int32 minimum: removed before any pod without the annotation
WRITE_FRESH_S = 10.0
# A pod pinned to a node that has stayed Unschedulable this long is recreated: its
# required node affinity can no longer change (it was ungated), and the instance it
# was pinned to went to another pod meanwhile (a ReplicaSet replacement the
# scheduler placed, or a re-cut). 30 s covers a pod on that node still terminating
# within the default grace period, whose instance frees by itself.
UNPIN_AFTER_S = 30.0
UNPIN_PER_PASS = 20  # deletes per pass: a burst of them is a burst of ReplicaSet creates
PLACEMENT_TTL_S = 60.0  # a placement no pod claimed within a minute is stale (the ReplicaSet acts in seconds)
# free instances of the last snapshot tried for one unplaced pod per pass (those on nodes filled since are skipped)
MAX_FREE_TRIES = 64
MAX_SPOT_HINTS = 10_000  # instance hints kept (oldest dropped): a few per pod the fleet creates in a minute


@dataclass
class Caches:
    """The informers the backend reads; started and stopped together."""

    nodes: Informer
    pods: Informer
    deployments: Informer
    lws: Informer
    pdbs: Informer
    hpas: Informer
    services: Informer

    def all(self) -> list[Informer]:
        return [self.nodes, self.pods, self.deployments, self.lws, self.pdbs, self.hpas, self.services]

    def start(self) -> None:
        for i in self.all():
            i.start()

    def stop(self) -> None:
        for i in self.all():
            i.stop()

    def synced(self) -> bool:
        return all(i.synced for i in self.all())


def make_caches(rest: KubeRest, cfg: RenderConfig, *, watch_timeout_s: float = 300.0,
                all_namespaces: bool = False) -> Caches:
    """``all_namespaces``: models live in their own namespaces (MigModels), so every cache but the
    nodes' watches the whole cluster, narrowed by migscale's label."""
    ns, mine = (None if all_namespaces else cfg.namespace), f"{MANAGED_BY}={MANAGER}"

    def inf(api: str, kind: str, namespace: str | None, sel: str | None = None, optional: bool = False) -> Informer:
        return Informer(rest, api, kind, namespace, label_selector=sel, watch_timeout_s=watch_timeout_s,
                        optional=optional)

    return Caches(
        nodes=inf("v1", "Node", None),
        pods=inf("v1", "Pod", ns, f"{mine},{MODEL_LABEL}"),
        deployments=inf(*DEPLOY, ns, mine),
        lws=inf(*LWS, ns, mine, optional=True),
        pdbs=inf("policy/v1", "PodDisruptionBudget", ns, mine),
        hpas=inf("autoscaling/v2", "HorizontalPodAutoscaler", ns),  # all of them: who else scales our workloads?
        services=inf("v1", "Service", ns, mine),
    )


@dataclass
class Workloads:
    rest: KubeRest
    cfg: RenderConfig
    clock: Clock
    caches: Caches
    event: Callable[..., None]  # EventRecorder.event(regarding, type, reason, note)
    models: dict[str, ModelSpec] = field(default_factory=dict)
    # model -> its namespace and the object that owns its workloads (a MigModel: deleting it collects them);
    # a model absent here lives in cfg.namespace. Kept after a model goes, so its workloads can be retired.
    namespaces: dict[str, str] = field(default_factory=dict)
    owners: dict[str, OwnerRef] = field(default_factory=dict)
    _written: dict[str, tuple[int, float]] = field(default_factory=dict)
    _warned: set[str] = field(default_factory=set)
    _monitor_done: bool = False
    # workload -> (node, the planner's instance there or None, when)
    _placements: dict[str, deque[tuple[str, tuple[str, int] | None, float]]] = field(default_factory=dict)
    # pod -> the instance the planner meant for it ((gpu, start)): where the inventory puts it while that
    # instance is free, since no API says which instance the device plugin gave it (``inventory.py``)
    spot_hints: OrderedDict[str, tuple[str, int]] = field(default_factory=OrderedDict)
    _ungated: dict[str, float] = field(default_factory=dict)  # pod -> when its gate was lifted (cache lag)
    _gate_lock: threading.Lock = field(default_factory=threading.Lock)  # the tick and the pod watch both ungate
    _pinned: dict[str, tuple[str, str, float]] = field(default_factory=dict)  # pod -> (node, profile, when)
    _stuck: dict[str, float] = field(default_factory=dict)  # pinned pod -> first seen Unschedulable
    _unplaced: dict[str, float] = field(default_factory=dict)  # gated pod nobody placed -> first seen so
    _refused: dict[tuple[str, str], float] = field(default_factory=dict)  # (node, profile) -> a pin there failed
    # a free instance of a profile as the last snapshot showed it, taken (``KubeInventory.take_free``)
    free_spot: Callable[[str, str], tuple[str, int] | None] | None = None
    # gated pods kept waiting for their planned node (its instance still held by a pod on its way out),
    # and pods whose planned node could not take them (sent where pods nobody placed go)
    placement_waits: int = 0
    placement_fallbacks: int = 0
    # the last few of those: (pod, planned node, profile, its allocatable, taken there, leaving there)
    fallback_log: deque[tuple[str, str, str, int, int, int]] = field(default_factory=lambda: deque(maxlen=50))

    # ------------------------------------------------------------ reading

    def ns(self, model: str) -> str:
        return self.namespaces.get(model, self.cfg.namespace)

    def cfg_for(self, model: str) -> RenderConfig:
        """The render settings of one model: its namespace, and its owner when it has one."""
        ns, owner = self.ns(model), self.owners.get(model)
        if ns == self.cfg.namespace and owner is None:
            return self.cfg
        return replace(self.cfg, namespace=ns, owner=owner or self.cfg.owner)

    def _pod(self, name: str) -> Obj | None:
        """A pod by name: workload names embed the model name, which is unique cluster-wide."""
        live = self.caches.pods.get(name, self.cfg.namespace)
        if live is None and self.namespaces:
            live = next((p for p in self.caches.pods.items() if p["metadata"]["name"] == name), None)
        return live

    def kind_of(self, profile: str) -> tuple[str, str]:
        return LWS if profile == WHOLE else DEPLOY

    def live(self, model: str, profile: str) -> Obj | None:
        cache = self.caches.lws if profile == WHOLE else self.caches.deployments
        return cache.get(workload_name(model, profile), self.ns(model))

    def size(self, model: str, profile: str) -> int:
        name = workload_name(model, profile)
        live = self.live(model, profile)
        have = int(((live or {}).get("spec") or {}).get("replicas") or 0)
        w = self._written.get(name)
        if w is not None:
            if have == w[0] or self.clock.now() - w[1] > WRITE_FRESH_S:
                del self._written[name]
            else:
                return w[0]  # our own write, not in the cache yet
        return have

    def pods_of(self, model: str, profile: str) -> list[Obj]:
        out = []
        by_model = self.caches.pods.grouped(MODEL_LABEL, lambda p: (p["metadata"].get("labels") or {}).get(MODEL_LABEL))
        for p in by_model.get(model, ()):
            lbls = p["metadata"].get("labels") or {}
            if profile == WHOLE:
                if lbls.get(LWS_WORKER_INDEX, "0") == "0" and (LWS_WORKER_INDEX in lbls or pod_profile(p) == WHOLE):
                    out.append(p)
            elif pod_profile(p) == profile:
                out.append(p)
        return out

    def ready(self, model: str, profile: str) -> int:
        if profile == WHOLE:
            live = self.live(model, profile)
            st = (live or {}).get("status") or {}
            if "readyReplicas" in st:
                return int(st["readyReplicas"] or 0)
        return sum(1 for p in self.pods_of(model, profile) if is_ready(p) and not p["metadata"].get("deletionTimestamp"))

    def foreign_scaler(self, model: str, profile: str) -> str | None:
        """The HPA (not ours) whose scaleTargetRef is this workload, if any."""
        kind = self.kind_of(profile)[1]
        name = workload_name(model, profile)
        for h in self.caches.hpas.items():
            ref = (h.get("spec") or {}).get("scaleTargetRef") or {}
            if ref.get("kind") == kind and ref.get("name") == name and h["metadata"].get("namespace") == self.ns(model):
                return str(h["metadata"]["name"])
        return None

    def disruptions_allowed(self, model: str, profile: str) -> int | None:
        """The workload's PodDisruptionBudget ``disruptionsAllowed``; None when it has none or it is not computed yet."""
        pdb = self.caches.pdbs.get(workload_name(model, profile), self.ns(model))
        if pdb is None or profile == WHOLE:
            return None
        st = pdb.get("status") or {}
        if st.get("observedGeneration", 0) < pdb["metadata"].get("generation", 1):
            return None
        return max(0, int(st.get("disruptionsAllowed") or 0))

    # ------------------------------------------------------------ writing

    def _regarding(self, model: str, profile: str) -> Obj:
        live = self.live(model, profile)
        if live is not None:
            return live
        api, kind = self.kind_of(profile)
        return {"apiVersion": api, "kind": kind, "metadata": {"name": workload_name(model, profile),
                                                               "namespace": self.ns(model)}}

    def ensure(self, spec: ModelSpec, profile: str, replicas: int) -> None:
        """Create the workload (with its first size), its budget, the model's Service and the PodMonitor."""
        cfg = self.cfg_for(spec.name)
        if self.caches.services.get(spec.name, cfg.namespace) is None:
            apply_object(self.rest, service(spec, cfg))
        if not self._monitor_done:
            monitor = pod_monitor(self.cfg)
            if self.namespaces:  # models in their teams' namespaces: one monitor scrapes them all
                monitor["spec"]["namespaceSelector"] = {"any": True}
            try:
                apply_object(self.rest, monitor)
            except KubeError as exc:
                if exc.status != 404:  # no Prometheus operator: nothing to monitor with
                    raise
            self._monitor_done = True
        obj = leader_worker_set(spec, replicas, cfg) if profile == WHOLE else deployment(spec, profile, replicas, cfg)
        _verb, live = apply_object(self.rest, obj, keep_replicas=True, absent=self.live(spec.name, profile) is None)
        self._written[workload_name(spec.name, profile)] = (replicas, self.clock.now())
        if profile != WHOLE:
            pdb = pod_disruption_budget(spec, profile, cfg)
            pdb["metadata"]["ownerReferences"] = [owner_ref(live)]
            apply_object(self.rest, pdb, absent=self.caches.pdbs.get(pdb["metadata"]["name"], cfg.namespace) is None)

    def scale(self, spec: ModelSpec, profile: str, new: int, why: str) -> int:
        """Set the workload's size to ``new`` (creating it if needed); returns the size before."""
        name = workload_name(spec.name, profile)
        live = self.live(spec.name, profile)
        if live is not None and not owned(live):
            raise NotOwned(409, f"{live['kind']}/{name} exists and is not managed by migscale; left alone")
        hpa = self.foreign_scaler(spec.name, profile)
        if hpa is not None:
            if name not in self._warned:
                self._warned.add(name)
                self.event(self._regarding(spec.name, profile), "Warning", "ScaledByOtherController",
                           f"HorizontalPodAutoscaler {hpa} targets this workload; migscale leaves spec.replicas to it")
            raise KubeError(409, f"{name}: HorizontalPodAutoscaler {hpa} owns its replicas; not scaled")
        self._warned.discard(name)
        old = self.size(spec.name, profile)
        if old == new:
            return old
        api, kind = self.kind_of(profile)
        try:
            if live is None:
                self.ensure(spec, profile, new)
            else:
                self.rest.patch_scale(api, kind, self.ns(spec.name), name, new)
                self._written[name] = (new, self.clock.now())
        except KubeError as exc:
            self.event(self._regarding(spec.name, profile), "Warning", "FailedRescale",
                       f"New size: {new}; reason: {why}; error: {exc}")
            raise
        self.event(self._regarding(spec.name, profile), "Normal", "SuccessfulRescale", f"New size: {new}; reason: {why}")
        return old

    def prefer_removal(self, pod: str) -> bool:
        """Mark a pod to go first on the next scale-down of its ReplicaSet; False if it is gone."""
        live = self._pod(pod)
        if live is None or live["metadata"].get("deletionTimestamp"):
            return False
        if (live["metadata"].get("annotations") or {}).get(DELETION_COST) == LOWEST_COST:
            return True
        patch = {"metadata": {"annotations": {DELETION_COST: LOWEST_COST}}}
        try:
            self.rest.merge_patch("v1", "Pod", live["metadata"].get("namespace", self.cfg.namespace), pod, patch)
        except KubeError as exc:
            if exc.status == 404:
                return False
            raise
        return True

    def place(self, model: str, profile: str, nodes: list[str | None],
              spots: list[tuple[str, int] | None] | None = None) -> None:
        """Where the next pods of a workload go (one node per pod, in creation order), and on each node
        the instance the planner chose (``spots``, (gpu, start); a hint for the inventory only)."""
        now = self.clock.now()
        spots = spots or []
        with self._gate_lock:
            q = self._placements.setdefault(workload_name(model, profile), deque(maxlen=1000))
            q.extend((n or "", spots[i] if i < len(spots) else None, now) for i, n in enumerate(nodes))

    def unclaimed(self, model: str, profile: str) -> int:
        """Placements made for a workload that no pod has taken yet (its ReplicaSet has not created the
        pods, or the cache has not heard): until then the snapshot does not show them."""
        now = self.clock.now()
        with self._gate_lock:
            q = self._placements.get(workload_name(model, profile))
            return sum(1 for _n, _s, t in q or () if now - t <= PLACEMENT_TTL_S)

    def unplace(self, model: str, profile: str, n: int) -> None:
        """Take back the last ``n`` placements (the scale write that would have made their pods failed)."""
        with self._gate_lock:
            q = self._placements.get(workload_name(model, profile))
            for _ in range(min(n, len(q or ()))):
                q.pop()  # type: ignore[union-attr]

    def ungate(self, pods: list[Obj] | None = None) -> list[str]:
        """Lift the placement gate of new pods (``pods``, or every gated one in the cache), each with the
        node the planner chose for it if any."""
        with self._gate_lock:  # decided and recorded under the lock, written outside it: a tick's
            todo = self._ungate(self.caches.pods.items() if pods is None else pods)  # place() never waits on HTTP
        errors: list[str] = []
        for ns, name, patch in todo:
            try:
                self.rest.merge_patch("v1", "Pod", ns, name, patch)
            except KubeError as exc:
                with self._gate_lock:
                    self._ungated.pop(name, None)
                    self._pinned.pop(name, None)
                if exc.status != 404:
                    errors.append(f"ungate pod {name}: {exc}")
        return errors

    def unpin(self) -> list[str]:
        """Recreate pods pinned to a node that cannot take them any more.

        ``ungate`` pins a new pod to the planner's node through its required node
        affinity, which the API server freezes once the gate is lifted. If that
        node's instance is taken meanwhile, the kube-scheduler keeps the pod
        Pending (Unschedulable) for good. After ``UNPIN_AFTER_S`` such a pod is
        deleted; its ReplicaSet creates a gated replacement that is placed afresh
        (or let go to the scheduler). A Pending pod serves nothing, so this
        disrupts nothing; pods pinned by someone else are left alone.
        """
        now = self.clock.now()
        stuck: dict[str, float] = {}
        todo: list[Obj] = []
        for p in self.caches.pods.items():
            spec, st = p.get("spec") or {}, p.get("status") or {}
            if spec.get("nodeName") or p["metadata"].get("deletionTimestamp") or not owned(p) or not _pinned_by_us(p):
                continue
            if not any(c.get("type") == "PodScheduled" and c.get("reason") == "Unschedulable"
                       for c in st.get("conditions") or []):
                continue
            name = p["metadata"]["name"]
            stuck[name] = since = self._stuck.get(name, now)
            if now - since >= UNPIN_AFTER_S and len(todo) < UNPIN_PER_PASS:
                todo.append(p)
        self._stuck = stuck
        errors: list[str] = []
        for p in todo:
            meta = p["metadata"]
            # it has no free instance there that this controller can see (a pod it does not own holds
            # one): no pod nobody placed is sent there for a while. Marked before the delete, under the
            # lock ``_ungate`` reads it with: the replacement may be ungated on the Pod watch's thread
            # before the delete call returns.
            with self._gate_lock:
                self._refused[(_pinned_node(p) or "", pod_profile(p))] = now
            try:
                self.rest.delete("v1", "Pod", meta.get("namespace", self.cfg.namespace), meta["name"],
                                 resource_version=meta.get("resourceVersion"))
                self._stuck.pop(meta["name"], None)
                self.event(p, "Normal", "Replaced",
                           f"pinned to a node with no free instance for {UNPIN_AFTER_S:.0f}s; "
                           "its ReplicaSet places a new pod")
            except KubeError as exc:
                if exc.status not in (404, 409):  # gone, or changed since we read it: look again next pass
                    errors.append(f"replace unschedulable pod {meta['name']}: {exc}")
        return errors

    def _ungate(self, candidates: list[Obj]) -> list[tuple[str, str, Obj]]:
        """The patches that lift the gate of new pods, recorded as done (undone by ``ungate`` on failure)."""
        todo: list[tuple[str, str, Obj]] = []  # (namespace, pod, patch)
        now = self.clock.now()
        self._ungated = {k: t for k, t in self._ungated.items() if now - t < WRITE_FRESH_S}
        self._unplaced = {k: t for k, t in self._unplaced.items() if now - t < 2 * PLACEMENT_TTL_S}
        self._refused = {k: t for k, t in self._refused.items() if now - t < PLACEMENT_TTL_S}
        gated = [p for p in candidates if p["metadata"]["name"] not in self._ungated
                 and not p["metadata"].get("deletionTimestamp")
                 and any(g.get("name") == PLACEMENT_GATE for g in (p.get("spec") or {}).get("schedulingGates") or [])]
        if not gated:
            return todo
        # instances of each profile taken on each node: bound pods, and pods pinned there not yet bound;
        # of the bound ones, those on their way out (their instance frees within their grace period)
        taken: dict[tuple[str, str], int] = {}
        leaving: dict[tuple[str, str], int] = {}
        pinned_now = {name for name, (_n, _p, t) in self._pinned.items() if now - t < WRITE_FRESH_S}
        for p in self.caches.pods.items():
            node = (p.get("spec") or {}).get("nodeName")
            if (p.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
                continue
            if node:
                key = (node, pod_profile(p))
                taken[key] = taken.get(key, 0) + 1
                if p["metadata"].get("deletionTimestamp"):
                    leaving[key] = leaving.get(key, 0) + 1
            elif p["metadata"]["name"] in pinned_now:
                n, prof, _t = self._pinned[p["metadata"]["name"]]
                taken[(n, prof)] = taken.get((n, prof), 0) + 1
        self._pinned = {k: v for k, v in self._pinned.items() if k in pinned_now}
        held: dict[str, list[tuple[str, tuple[str, int] | None, float]]] = {}  # workload -> placements kept

        def room(n: str, profile: str) -> tuple[bool, int]:
            """(node usable, instances of the profile free on it now)."""
            live = self.caches.nodes.get(n) if n else None
            alloc = int(((live or {}).get("status") or {}).get("allocatable", {}).get(f"nvidia.com/mig-{profile}", 0) or 0)
            usable = live is not None and not (live.get("spec") or {}).get("unschedulable")
            return usable, alloc - taken.get((n, profile), 0)

        def fits(n: str, profile: str) -> bool:
            """Can a pod nobody placed go there now (and no pin there failed lately)?"""
            usable, free = room(n, profile)
            return usable and free >= 1 and now - self._refused.get((n, profile), -1e18) >= PLACEMENT_TTL_S

        for pod in sorted(gated, key=lambda p: (p["metadata"].get("creationTimestamp", ""), p["metadata"]["name"])):
            lbls = pod["metadata"].get("labels") or {}
            wl = workload_name(lbls.get(MODEL_LABEL, ""), pod_profile(pod))
            q = self._placements.get(wl)
            while q and now - q[0][2] > PLACEMENT_TTL_S:
                q.popleft()  # a placement no pod came for (the size went down again meanwhile)
            name, profile = pod["metadata"]["name"], pod_profile(pod)
            node, spot, placed_at = q.popleft() if q else ("", None, now)
            planned = bool(node)
            usable, free = room(node, profile)
            if planned and usable and free < 1 and free + leaving.get((node, profile), 0) >= 1:
                # The planned instance is still held by a pod on its way out (the planner counts a
                # leaving pod's instance as free: ``inventory.py``): it stays gated until that pod
                # is gone (retried each pass), for as long as the placement lives.
                held.setdefault(wl, []).append((node, spot, placed_at))
                self._hint(name, spot)  # the inventory shows it there meanwhile
                self.placement_waits += 1
                continue
            if planned and (not usable or free < 1):
                self.placement_fallbacks += 1
                self.fallback_log.append((name, node, profile, free + taken.get((node, profile), 0),
                                          taken.get((node, profile), 0), leaving.get((node, profile), 0)))
                planned = False  # gone, cordoned, or no free instance there any more
            if not planned:
                node, spot = self._unplaced_spot(name, profile, fits)
            if not node and now - self._unplaced.setdefault(name, now) < PLACEMENT_TTL_S:
                # Let go now, the scheduler would put it on the fullest node with a free instance --
                # often one the planner has just given to another new pod, which then lands elsewhere
                # in turn: replicas the planner did not place, which its next plans move again. It
                # stays gated until a free instance is known (the next pass, after the next
                # snapshot) and goes there. After ``PLACEMENT_TTL_S`` it is let go to the scheduler.
                continue
            self._unplaced.pop(name, None)
            spec = pod.get("spec") or {}
            patch: Obj = {"spec": {"schedulingGates": [g for g in spec.get("schedulingGates") or []
                                                       if g.get("name") != PLACEMENT_GATE] or None}}
            if node:
                patch["spec"]["affinity"] = with_hostname(spec.get("affinity") or {}, node)
            todo.append((pod["metadata"].get("namespace", self.cfg.namespace), pod["metadata"]["name"], patch))
            self._ungated[pod["metadata"]["name"]] = now
            if node:
                self._pinned[pod["metadata"]["name"]] = (node, profile, now)
                taken[(node, profile)] = taken.get((node, profile), 0) + 1
                self._hint(pod["metadata"]["name"], spot)
        for wl, kept in held.items():  # first in line again, in their order, for the next pass
            self._placements[wl].extendleft(reversed(kept))
        return todo

    def _unplaced_spot(self, pod: str, profile: str,
                       fits: Callable[[str, str], bool]) -> tuple[str, tuple[str, int] | None]:
        """(node, instance) for a pod nobody placed (a ReplicaSet's replacement, a size set without
        placements, a plan whose node filled up): the instance it was last sent to or shown on, else
        a free one of the last snapshot, on a node that ``fits`` it now; recorded, so that it is shown
        there from now on (``inventory.py``). ("", None) when none is known."""
        spot = self.spot_hints.pop(pod, None)
        for _ in range(MAX_FREE_TRIES):
            node = (node_of(spot[0]) or "") if spot is not None else ""
            if spot is not None and fits(node, profile):
                self._hint(pod, spot)
                return node, spot
            spot = self.free_spot(pod, profile) if self.free_spot else None
            if spot is None:
                break
        return "", None

    def _hint(self, pod: str, spot: tuple[str, int] | None) -> None:
        if spot is not None:
            self.spot_hints[pod] = spot
            while len(self.spot_hints) > MAX_SPOT_HINTS:
                self.spot_hints.popitem(last=False)  # the oldest: its pod is long placed, or gone

    def sweep(self, busy: set[str]) -> list[str]:
        """Retire workloads: those of models no longer configured go to 0; those at 0 with no pod left are
        deleted (``busy``: names a rollout still uses)."""
        errors = []
        for obj in self.caches.deployments.items() + self.caches.lws.items():
            meta = obj["metadata"]
            name = meta["name"]
            lbls = meta.get("labels") or {}
            model = lbls.get(MODEL_LABEL) or ""
            profile = WHOLE if obj["kind"] == LWS[1] else (lbls.get(PROFILE_LABEL) or "").replace("_", "+")
            if not owned(obj) or name in busy or workload_name(model, profile) != name:
                continue
            api, kind = self.kind_of(profile)
            try:
                if model not in self.models and self.size(model, profile) > 0:
                    self.rest.patch_scale(api, kind, meta.get("namespace", self.cfg.namespace), name, 0)
                    self._written[name] = (0, self.clock.now())
                    self.event(obj, "Normal", "SuccessfulRescale", "New size: 0; reason: model removed from the configuration")
                elif (self.size(model, profile) == 0 and not self.pods_of(model, profile)
                      and self.rest.delete(api, kind, meta.get("namespace", self.cfg.namespace), name,
                                           resource_version=meta["resourceVersion"])):
                    self.event(obj, "Normal", "Retired", f"0 replicas and no pods left: {kind} deleted (its budget with it)")
            except KubeError as exc:
                if exc.status != 409:  # changed since we read it: look again next tick
                    errors.append(f"retire {kind}/{name}: {exc}")
        return errors

    def reconcile_templates(self) -> list[str]:
        """Bring live workloads of known models to the current template; sizes are left as they are."""
        errors = []
        for obj in self.caches.deployments.items():
            model = (obj["metadata"].get("labels") or {}).get(MODEL_LABEL)
            spec = self.models.get(model or "")
            if spec is None or not owned(obj):
                continue
            profile = next((p for p in spec.allowed_profiles if workload_name(spec.name, p) == obj["metadata"]["name"]), None)
            if profile is None:
                continue
            try:
                cfg = self.cfg_for(spec.name)
                want = deployment(spec, profile, int(obj["spec"].get("replicas") or 0), cfg)
                _verb, live = apply_object(self.rest, want, keep_replicas=True)
                pdb = pod_disruption_budget(spec, profile, cfg)
                pdb["metadata"]["ownerReferences"] = [owner_ref(live)]
                apply_object(self.rest, pdb)
            except KubeError as exc:
                errors.append(f"{obj['metadata']['name']}: {exc}")
        return errors


def _pinned_by_us(pod: Obj) -> bool:
    """Does the pod's required node affinity carry the hostname term ``with_hostname`` adds?"""
    return _pinned_node(pod) is not None


def _pinned_node(pod: Obj) -> str | None:
    """The node the hostname term ``with_hostname`` adds names, if any."""
    req = ((((pod.get("spec") or {}).get("affinity") or {}).get("nodeAffinity") or {})
           .get("requiredDuringSchedulingIgnoredDuringExecution") or {})
    for t in req.get("nodeSelectorTerms") or []:
        for e in t.get("matchExpressions") or []:
            if e.get("key") == HOSTNAME_LABEL and e.get("operator") == "In" and e.get("values"):
                return str(e["values"][0])
    return None


def with_hostname(affinity: Obj, node: str) -> Obj:
    """The pod's affinity with ``kubernetes.io/hostname In [node]`` added to every required term.

    Terms are ORed and expressions within a term ANDed, so the requirement goes
    into each term (or one new term): the pod keeps every constraint it had and
    gains only the node.
    """
    out = copy.deepcopy(affinity)
    req = out.setdefault("nodeAffinity", {}).setdefault("requiredDuringSchedulingIgnoredDuringExecution", {})
    terms = req.setdefault("nodeSelectorTerms", []) or [{}]
    for t in terms:
        t.setdefault("matchExpressions", []).append({"key": HOSTNAME_LABEL, "operator": "In", "values": [node]})
    req["nodeSelectorTerms"] = terms
    return out


def owner_ref(live: Obj) -> Obj:
    return {"apiVersion": live["apiVersion"], "kind": live["kind"], "name": live["metadata"]["name"],
            "uid": live["metadata"]["uid"], "controller": True, "blockOwnerDeletion": False}
