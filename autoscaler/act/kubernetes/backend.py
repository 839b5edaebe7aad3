"""The Kubernetes backend: the "act" (and inventory) edge of the loop on a real cluster.

``KubernetesBackend`` implements the ``Inventory`` and ``Actuator``
protocols with the official ``kubernetes`` client:

- ``snapshot()`` reads Nodes (GPU feature discovery labels) and Triton pods
  (``k8s_inventory``);
- ``apply_plan(plan)`` makes the cluster hold exactly the objects
  ``k8s_render`` builds for the plan's replica counts -- create or replace
  with resourceVersion retries, then delete migscale-owned objects the plan no
  longer wants; objects without the ``managed-by: migscale`` label are never
  touched;
- ``apply(actions)`` carries out a tick's ordered actions: CREATE/DELETE move a
  (model, profile) Deployment's size (or a LeaderWorkerSet's group count)
  through the scale subresource, REPARTITION runs the mig-manager flow
  (``k8s_repartition``), WAIT_READY/DRAIN need nothing (the readiness probe
  and the preStop drain do them);
- ``converging()`` is True while a workload has fewer ready than desired
  replicas or a node's ``nvidia.com/mig.config.state`` is not settled.

With an elector (``k8s_leader.LeaseElector``) every write is preceded by a
lease check; a follower returns one line saying why it did nothing.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from typing import Any

from autoscaler.act.kubernetes.client import KubeError, KubeRest, NotOwned, apply_object, owned
from autoscaler.act.kubernetes.inventory import KubeInventory
from autoscaler.act.kubernetes.leader import LeaseElector
from autoscaler.act.kubernetes.render import (
    MANAGED_BY,
    MANAGER,
    MIG_STATE_LABEL,
    WHOLE,
    RenderConfig,
    deployment,
    hpa,
    leader_worker_set,
    model_objects,
    pod_disruption_budget,
    pod_monitor,
    service,
    workload_name,
)
from autoscaler.act.kubernetes.repartition import Repartitioner
from autoscaler.clock import Clock, WallClock
from autoscaler.policy.types import Action, ActionKind, ClusterState, ModelSpec, Plan

Obj = dict[str, Any]
LWS = ("leaderworkerset.x-k8s.io/v1", "LeaderWorkerSet")
DEPLOY = ("apps/v1", "Deployment")
# Kinds the backend garbage-collects when a plan no longer wants them.
OWNED_KINDS = (
    ("autoscaling/v2", "HorizontalPodAutoscaler"),
    ("policy/v1", "PodDisruptionBudget"),
    DEPLOY,
    LWS,
    ("v1", "Service"),
)


class KubernetesBackend:
    def __init__(
        self,
        rest: KubeRest,
        models: Sequence[ModelSpec],
        cfg: RenderConfig,
        *,
        clock: Clock | None = None,
        elector: LeaseElector | None = None,
        repartitioner: Repartitioner | None = None,
        use_hpa: bool = True,
        manage_lws: bool = True,
    ) -> None:
        self.rest = rest
        self.models = {m.name: m for m in models}
        self.cfg = cfg
        self.clock = clock or WallClock()
        self.elector = elector
        self.repartitioner = repartitioner or Repartitioner(rest, cfg, self.clock)
        self.inventory = KubeInventory(rest, cfg)
        self.use_hpa = use_hpa
        self.manage_lws = manage_lws
        self.apply_calls: list[str] = []  # "created Deployment/x", ... in order, for status and tests

    # ------------------------------------------------------------ protocols

    def snapshot(self) -> ClusterState:
        return self.inventory.snapshot()

    def _follower_reason(self) -> str | None:
        if self.elector is None:
            return None
        st = self.elector.ensure()
        return None if st.leader else f"not the leader ({st.reason}); no action taken"

    def _put(self, obj: Obj, keep_replicas: bool = False) -> Obj:
        verb, live = apply_object(self.rest, obj, keep_replicas=keep_replicas)
        if verb != "unchanged":
            self.apply_calls.append(f"{verb} {obj['kind']}/{obj['metadata']['name']}")
        return live

    def _owner_ref(self, live: Obj) -> Obj:
        return {
            "apiVersion": live["apiVersion"],
            "kind": live["kind"],
            "name": live["metadata"]["name"],
            "uid": live["metadata"]["uid"],
            "controller": True,
            "blockOwnerDeletion": False,
        }

    def _apply_workload(self, spec: ModelSpec, profile: str, replicas: int) -> None:
        """Workload + its PDB/HPA, the dependents owned by the workload (GC deletes them with it)."""
        if profile == WHOLE:
            workload = leader_worker_set(spec, replicas, self.cfg)
            deps = [hpa(spec, WHOLE, self.cfg)] if self.use_hpa else []
        else:
            workload = deployment(spec, profile, replicas, self.cfg)
            deps = [pod_disruption_budget(spec, profile, self.cfg)]
            deps += [hpa(spec, profile, self.cfg)] if self.use_hpa else []
        # Once an HPA exists it owns the size; re-applying the template must not reset it.
        live = self._put(workload, keep_replicas=self.use_hpa)
        for dep in deps:
            dep["metadata"]["ownerReferences"] = [self._owner_ref(live)]
            self._put(dep)

    def apply_plan(self, plan: Plan) -> list[str]:
        """Converge the namespace to the plan's objects; returns one line per failure."""
        reason = self._follower_reason()
        if reason:
            return [reason]
        errors: list[str] = []
        wanted: set[tuple[str, str]] = set()
        for spec in self.models.values():
            for obj in model_objects(spec, plan.desired, self.cfg):
                wanted.add((obj["kind"], obj["metadata"]["name"]))
            try:
                self._put(service(spec, self.cfg))
                counts: dict[str, int] = defaultdict(int)
                for (m, profile), n in plan.desired.items():
                    if m == spec.name and n > 0:
                        counts[WHOLE if spec.backend == "multinode" else profile] += n
                if spec.backend == "multinode" and not counts:
                    counts[WHOLE] = max(0, spec.min_replicas)
                for profile, n in sorted(counts.items()):
                    if n > 0 and (profile != WHOLE or self.manage_lws):
                        self._apply_workload(spec, profile, n)
            except KubeError as exc:
                errors.append(f"{spec.name}: {exc}")
        try:
            wanted.add(("PodMonitor", "migscale-triton"))
            self._put(pod_monitor(self.cfg))
        except KubeError as exc:
            errors.append(f"PodMonitor: {exc}")
        errors += self._collect_garbage(wanted)
        return errors

    def _collect_garbage(self, wanted: set[tuple[str, str]]) -> list[str]:
        errors: list[str] = []
        for api_version, kind in OWNED_KINDS:
            try:
                items = self.rest.list(
                    api_version, kind, self.cfg.namespace, label_selector=f"{MANAGED_BY}={MANAGER}"
                )
            except KubeError as exc:
                if exc.status == 404:  # CRD not installed (e.g. no LWS): nothing of ours there
                    continue
                errors.append(f"list {kind}: {exc}")
                continue
            for obj in items:
                name = obj["metadata"]["name"]
                if (kind, name) in wanted or not owned(obj):
                    continue
                try:
                    if self.rest.delete(api_version, kind, self.cfg.namespace, name):
                        self.apply_calls.append(f"deleted {kind}/{name}")
                except KubeError as exc:
                    errors.append(f"delete {kind}/{name}: {exc}")
        return errors

    def _current_size(self, spec: ModelSpec, profile: str) -> int:
        api_version, kind = LWS if profile == WHOLE else DEPLOY
        live = self.rest.get(api_version, kind, self.cfg.namespace, workload_name(spec.name, profile))
        if live is None:
            return 0
        if not owned(live):
            raise NotOwned(409, f"{kind}/{live['metadata']['name']} is not managed by migscale; left alone")
        return int((live.get("spec") or {}).get("replicas") or 0)

    def _resize(self, spec: ModelSpec, profile: str, delta: int) -> None:
        current = self._current_size(spec, profile)
        target = max(0, current + delta)
        name = workload_name(spec.name, profile)
        api_version, kind = LWS if profile == WHOLE else DEPLOY
        if target == current:
            return
        if current == 0:
            self._put(service(spec, self.cfg))
            self._apply_workload(spec, profile, target)
        elif target == 0:
            # the HPA and PDB are owned by the workload; delete them too so a
            # cluster without the garbage collector (or a test) is left clean
            for av, k in (
                ("autoscaling/v2", "HorizontalPodAutoscaler"),
                ("policy/v1", "PodDisruptionBudget"),
                (api_version, kind),
            ):
                if self.rest.delete(av, k, self.cfg.namespace, name):
                    self.apply_calls.append(f"deleted {k}/{name}")
        else:
            self.rest.set_scale(api_version, kind, self.cfg.namespace, name, target)
            self.apply_calls.append(f"scaled {kind}/{name} {current}->{target}")

    def apply(self, actions: Sequence[Action]) -> list[str]:
        """Carry out actions in order; replica moves are batched up to each repartition."""
        reason = self._follower_reason()
        if reason:
            return [f"skipped {len(actions)} actions: {reason}"]
        errors: list[str] = []
        pending: dict[tuple[str, str], int] = defaultdict(int)

        def flush() -> None:
            for (model, profile), delta in sorted(pending.items()):
                spec = self.models.get(model)
                if spec is None:
                    errors.append(f"{model}: not in the models config; action skipped")
                    continue
                try:
                    self._resize(spec, WHOLE if spec.backend == "multinode" else profile, delta)
                except KubeError as exc:
                    errors.append(f"{workload_name(model, profile)}: {exc}")
            pending.clear()

        for a in actions:
            if a.kind in (ActionKind.CREATE, ActionKind.DELETE) and a.model and a.profile:
                pending[(a.model, a.profile)] += 1 if a.kind is ActionKind.CREATE else -1
            elif a.kind is ActionKind.REPARTITION and a.gpu is not None:
                flush()
                errors += self._repartition(a)
        flush()
        return errors

    def _repartition(self, a: Action) -> list[str]:
        node, _, idx = (a.gpu or "").rpartition("/")
        try:
            state = self.snapshot()
            gpus = sorted(
                (g for g in state.gpus if g.node == node), key=lambda g: int(g.id.rpartition("/")[2])
            )
            if not gpus:
                return [f"repartition {a.gpu}: node {node!r} has no GPUs in the inventory"]
            layouts = [
                (tuple(a.layout or ()) if g.id == a.gpu else (g.layout if g.mig_enabled else None))
                for g in gpus
            ]
            if not any(g.id == a.gpu for g in gpus):
                return [f"repartition {a.gpu}: GPU index {idx} not on node {node}"]
            errs = self.repartitioner.repartition(node, layouts)
            if not errs:
                self.apply_calls.append(f"repartitioned {a.gpu}")
            return errs
        except KubeError as exc:
            return [f"repartition {a.gpu}: {exc}"]

    def converging(self) -> bool:
        try:
            for api_version, kind in (DEPLOY, LWS):
                try:
                    items = self.rest.list(
                        api_version, kind, self.cfg.namespace, label_selector=f"{MANAGED_BY}={MANAGER}"
                    )
                except KubeError as exc:
                    if exc.status == 404:
                        continue
                    raise
                for obj in items:
                    want = int((obj.get("spec") or {}).get("replicas") or 0)
                    ready = int((obj.get("status") or {}).get("readyReplicas") or 0)
                    if ready < want:
                        return True
            for node in self.rest.list("v1", "Node", None):
                state = (node["metadata"].get("labels") or {}).get(MIG_STATE_LABEL)
                if state in ("pending", "rebooting"):
                    return True
        except KubeError:
            return True  # blind: assume in flight, so the loop holds rather than piles on
        return False
