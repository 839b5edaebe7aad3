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
  pods).

Where each new pod goes (its placement gate and node pin) is ``placer.py``'s.

Reads come from informers (``Caches``), so a steady tick sends nothing. A
scale written a moment ago may not be in the cache yet; ``size`` uses the
value we wrote until the cache shows it (or 10 s have passed).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from autoscaler.act.kubernetes.client import KubeError, KubeRest, NotOwned, apply_object, owned
from autoscaler.act.kubernetes.informer import Informer
from autoscaler.act.kubernetes.inventory import is_ready, pod_profile
from autoscaler.act.kubernetes.render import (
    LWS_WORKER_INDEX,
    MANAGED_BY,
    MANAGER,
    MODEL_LABEL,
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
# A write this recent may not be in the informer's cache yet (``size``, and the placer's gates).
WRITE_FRESH_S = 10.0


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


def owner_ref(live: Obj) -> Obj:
    return {"apiVersion": live["apiVersion"], "kind": live["kind"], "name": live["metadata"]["name"],
            "uid": live["metadata"]["uid"], "controller": True, "blockOwnerDeletion": False}
