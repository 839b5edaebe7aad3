"""The Kubernetes backend: the "act" (and inventory) edge of the loop on a real cluster.

``KubernetesBackend`` implements the ``Inventory`` and ``Actuator`` protocols
with the official ``kubernetes`` client, composed of:

- ``Caches`` (``workloads.py``): list+watch informers of Nodes, migscale's
  Pods, Deployments, LeaderWorkerSets, PodDisruptionBudgets, Services and
  every HPA of the namespace; ``snapshot()`` reads them (``inventory.py``),
  so a steady tick sends no request;
- ``Rollout`` (``rollout.py``): ``apply(actions)`` queues the tick's actions
  as make-before-break chains and starts them; ``advance()`` (once per
  leader tick, from the controller's ``before_tick``) moves them on, and what
  fails later is reported once by ``take_errors()`` (the actuator contract,
  ``autoscaler/protocols.py``);
- ``PodPlacer`` (``placer.py``): lifts each new pod's placement gate with
  the node the planner chose for it, as the Pod watch shows the pod, and
  recreates pods pinned to a node that filled up (``unpin``, each tick);
- ``Repartitioner`` (``repartition.py``): the per-node state machine whose
  state is an annotation on the Node;
- ``EventRecorder`` (``events.py``): an Event for each scale, swap step and
  repartition.

``in_flight()`` answers per GPU and per model -- GPUs of nodes under
repartition (read from the Node annotations, so a follower sees the
leader's), GPUs of terminating pods, and whatever queued steps touch -- so
the loop holds only those and decides for everything else. ``conditions``
says, per model, why it is short of the plan's target.

Writes: only while this replica holds the lease (``KubeRest.guard``
refuses any other), and only to objects labelled
``app.kubernetes.io/managed-by: migscale``; ``spec.replicas`` only through
the scale subresource (docs/kubernetes.md, "Who owns what").
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping, Sequence
from typing import Any

from autoscaler.act.kubernetes.client import KubeError, KubeRest
from autoscaler.act.kubernetes.events import EventRecorder
from autoscaler.act.kubernetes.informer import wait_all_synced
from autoscaler.act.kubernetes.inventory import KubeInventory, is_ready, pod_profile, unschedulable
from autoscaler.act.kubernetes.leader import LeaseElector
from autoscaler.act.kubernetes.leader import micro_time as rfc3339
from autoscaler.act.kubernetes.placer import PodPlacer
from autoscaler.act.kubernetes.render import MODEL_LABEL, WHOLE, OwnerRef, RenderConfig, workload_name
from autoscaler.act.kubernetes.repartition import Repartitioner
from autoscaler.act.kubernetes.rollout import Rollout, chain_groups
from autoscaler.act.kubernetes.workloads import Caches, Workloads, make_caches
from autoscaler.clock import Clock, WallClock
from autoscaler.policy.types import Action, ClusterState, ModelSpec, Plan, ReplicaState

Obj = dict[str, Any]


class KubernetesBackend:
    def __init__(
        self,
        rest: KubeRest,
        models: Sequence[ModelSpec],
        cfg: RenderConfig,
        *,
        clock: Clock | None = None,
        elector: LeaseElector | None = None,
        identity: str = "migscale",
        caches: Caches | None = None,
        ready_timeout_s: float = 600.0,
        pass_budget_s: float | None = 0.25,
        drain_timeout_s: float = 300.0,
        config_timeout_s: float = 600.0,
        retry_after_s: float = 120.0,
        sync_timeout_s: float = 30.0,
        watch_timeout_s: float = 300.0,
        all_namespaces: bool = False,
        start: bool = True,
    ) -> None:
        self.rest = rest
        self.cfg = cfg
        self.clock = clock or WallClock()
        self.elector = elector
        self.identity = identity
        self.sync_timeout_s = sync_timeout_s
        self.caches = caches or make_caches(rest, cfg, watch_timeout_s=watch_timeout_s, all_namespaces=all_namespaces)
        self.recorder = EventRecorder(rest, self.clock, instance=identity)
        self.workloads = Workloads(rest, cfg, self.clock, self.caches, self._event)
        self.placer = PodPlacer(rest, cfg.namespace, self.clock, self.caches.pods, self.caches.nodes, self._event)
        self.repartitioner = Repartitioner(
            rest, cfg, self.clock, self.caches.nodes, self.caches.pods, workloads=self.workloads,
            free_elsewhere=self._free_elsewhere, identity=identity, event=self._event,
            drain_timeout_s=drain_timeout_s, config_timeout_s=config_timeout_s, retry_after_s=retry_after_s,
            pass_budget_s=pass_budget_s,
        )
        self.inventory = KubeInventory(cfg, self.caches.nodes, self.caches.pods, self.placer.spot_hints,
                                      self.repartitioner.configs, self.repartitioner.starts)
        self.placer.free_spot = self.inventory.take_free
        self.rollout = Rollout(self.workloads, self.placer, self.repartitioner, self.clock, cannot_start=self._cannot_start,
                               ready_timeout_s=ready_timeout_s, pass_budget_s=pass_budget_s)
        self.apply_calls: deque[str] = deque(maxlen=500)  # what was written, newest last
        self._late: deque[str] = deque(maxlen=200)  # errors of queued work, until take_errors() reads them
        self._last: ClusterState | None = None
        self._transitions: dict[str, tuple[str, str, float]] = {}  # model -> (status, reason, since)
        self.set_models(models)
        # a new pod is placed the moment the watch shows it, not a tick later
        self.caches.pods.handlers.append(self._on_pod)
        if start:
            self.start()

    # ------------------------------------------------------------ lifecycle

    def start(self) -> None:
        self.caches.start()
        wait_all_synced(self.caches.all(), self.sync_timeout_s)
        self._load_configs()

    def close(self) -> None:
        self.recorder.close()
        self.caches.stop()

    @property
    def models(self) -> dict[str, ModelSpec]:
        return self.workloads.models

    def set_models(self, models: Sequence[ModelSpec], namespaces: Mapping[str, str] | None = None,
                   owners: Mapping[str, OwnerRef] | None = None) -> None:
        """The model set may change at run time (the model source is asked every tick).

        ``namespaces``/``owners``: where each model's workloads go and what owns them (its MigModel).
        """
        self.workloads.models = {m.name: m for m in models}
        self.workloads.namespaces.update(namespaces or {})
        for name in set(self.workloads.owners) - set(self.workloads.models):
            del self.workloads.owners[name]
        self.workloads.owners.update(owners or {})

    def _on_pod(self, kind: str, pod: Obj) -> None:
        # MODIFIED too: an ungate patch carries the cached resourceVersion, so one sent just before a
        # change (the scheduler marking the pod SchedulingGated) answers 409 and goes again from here
        if kind in ("ADDED", "MODIFIED") and self.leading() and (pod.get("spec") or {}).get("schedulingGates"):
            self._late.extend(self.placer.ungate([pod]))

    def leading(self) -> bool:
        return self.elector is None or self.elector.holds()

    def _event(self, regarding: Obj, kind: str, reason: str, note: str) -> None:
        self.recorder.event(regarding, kind, reason, note)
        self.apply_calls.append(f"{reason} {regarding.get('kind')}/{(regarding.get('metadata') or {}).get('name')}: {note}")

    # ------------------------------------------------------------ Inventory

    def snapshot(self) -> ClusterState:
        if not self.caches.synced():
            lagging = [i.kind for i in self.caches.all() if not i.synced]
            raise KubeError(0, f"caches not synced yet: {', '.join(lagging)} ({self.caches.nodes.last_error or 'listing'})")
        self._last = self.inventory.snapshot()
        return self._last

    # ------------------------------------------------------------ Actuator

    def apply(self, actions: Sequence[Action]) -> list[str]:
        """Queue the actions as make-before-break chains and take every step that can be taken now."""
        if not self.leading():
            reason = self.elector.last.reason if self.elector is not None else ""
            return [f"skipped {len(actions)} actions: not the leader ({reason})"]
        self.recorder.new_tick()
        cluster = self._last if self._last is not None else self.snapshot()
        try:
            return self.rollout.submit(actions, cluster)
        finally:
            self.rollout.end_tick()  # the tick's write budget, shared with ``advance``, is spent

    def advance(self) -> list[str]:
        """One step of everything under way (repartitions, waiting chains, retirements); leader only."""
        if not self.leading():
            return []
        self.recorder.new_tick()
        self.rollout.begin_tick()
        errors = self.placer.ungate()
        errors += self.placer.unpin()
        errors += self.repartitioner.advance()
        errors += self.rollout.advance()
        errors += self.workloads.sweep(self.rollout.workload_names())
        self._late.extend(errors)
        return errors

    def take_errors(self) -> list[str]:
        """Errors of queued work (rollouts, repartitions, retirements) since the last call, each once."""
        out = list(self._late)
        self._late.clear()
        return out

    def start_leading(self) -> None:
        """Bring live workloads to the current templates (an upgrade, a changed image), and read the configs
        the last leader wrote since this replica started; errors reported late."""
        self._late.extend(self.workloads.reconcile_templates())
        self._load_configs()

    def _load_configs(self) -> None:
        """The mig-parted configs written so far: which GPU holds which instances (``inventory.py``)."""
        err = self.repartitioner.load_configs()
        if err:
            self._late.append(err)

    def stop_leading(self) -> None:
        self.rollout.reset()

    def groups(self, actions: Sequence[Action]) -> list[int]:
        return chain_groups(actions, self._last or ClusterState())

    def in_flight(self) -> tuple[frozenset[str], frozenset[str]]:
        gpus, models = self.rollout.busy()
        models |= self.repartitioner.draining_models()
        last = self._last or ClusterState()
        under_way = set(self.repartitioner.in_progress())
        for g in last.gpus:
            if g.node in under_way or self.repartitioner.cooling(g.node):
                gpus.add(g.id)
        for r in last.replicas:
            if r.state is ReplicaState.DRAINING and r.gpu:
                gpus.add(r.gpu)
        models |= self.scaling_down()
        return frozenset(gpus), frozenset(models)

    def committed(self, model: str, profiles: Sequence[str]) -> dict[str, int]:
        """Replicas of ``model`` per profile that migscale has set or queued: each workload's
        ``spec.replicas`` (our own latest write) plus what queued steps will add or remove. It is what
        a MigModel's status calls desired: a plan made while nodes are repartitioned cannot place
        the replicas waiting for them, and the planner's counts would show those as 0. A workload
        at the size a repartition's surge gave it counts at its size before."""
        queued = self.rollout.queued(model) if self.leading() else {}
        # a repartition's surge is a stand-in while a node drains, not a decision: counted at its size before
        surged = {w: sizes for st in self.repartitioner.in_progress().values()
                  for w, sizes in (st.get("surge") or {}).items()}
        out = {}
        for p in {*profiles, *queued}:
            size = self.workloads.size(model, p)
            before, after = surged.get(workload_name(model, p), (size, size))
            out[p] = max(0, (before if size == after else size) + queued.get(p, 0))
        return {p: n for p, n in out.items() if n > 0}

    def scaling_down(self) -> set[str]:
        """Models with a workload that has more live pods than its size: a scale-down written
        but not yet carried out (the ReplicaSet has not deleted the pod, or the cache has not
        heard). The ReplicaSet controller keeps such "expectations" for the same reason: until
        they are met, a plan made from the cache counts the pod on its way out as serving,
        and may scale down its replacement too -- leaving the model with none."""
        live: dict[tuple[str, str], int] = {}
        for p in self.caches.pods.items():
            meta = p["metadata"]
            lbls = meta.get("labels") or {}
            model = lbls.get(MODEL_LABEL)
            if (model not in self.workloads.models or meta.get("deletionTimestamp")
                    or (p.get("status") or {}).get("phase") in ("Succeeded", "Failed")):
                continue
            key = (model, pod_profile(p))
            live[key] = live.get(key, 0) + 1
        return {m for (m, prof), n in live.items() if prof != WHOLE and n > self.workloads.size(m, prof)}

    def _free_elsewhere(self, profile: str, node: str) -> int:
        """Free instances of ``profile`` on schedulable nodes other than ``node``, by the last snapshot."""
        last = self._last or ClusterState()
        taken = {(r.gpu, r.start) for r in last.replicas if r.state is not ReplicaState.FAILED}
        ok = {n["metadata"]["name"] for n in self.caches.nodes.items() if not (n.get("spec") or {}).get("unschedulable")}
        return sum(1 for g in last.gpus if g.node != node and g.node in ok
                   for p in g.layout if p.profile == profile and (g.id, p.start) not in taken)

    def _cannot_start(self, model: str, profile: str) -> str | None:
        """Why new pods of a workload can never become Ready, from the last snapshot (None: they may)."""
        if profile == WHOLE or self._last is None:
            return None
        names = {p["metadata"]["name"] for p in self.workloads.pods_of(model, profile)}
        failed = [r for r in self._last.replicas if r.id in names and r.state is ReplicaState.FAILED]
        if not failed:
            return None
        return f"{len(failed)} pod(s) cannot start (failed, or no free {profile} instance on any node)"

    # ------------------------------------------------------------ conditions

    def conditions(self, plan: Plan | None) -> dict[str, dict[str, Any]]:
        """Per model, an ``AtTarget`` condition (HPA style) saying why it is short of the plan's target."""
        now = self.clock.now()
        waiting = self.rollout.waiting()
        by_model: dict[str, list[Obj]] = {}
        for p in self.caches.pods.items():
            by_model.setdefault((p["metadata"].get("labels") or {}).get(MODEL_LABEL, ""), []).append(p)
        wanted: dict[str, int] = {}
        planned: dict[str, set[str]] = {}
        for (m, p), n in (plan.desired.items() if plan else ()):
            wanted[m] = wanted.get(m, 0) + n
            planned.setdefault(m, set()).add(p)
        out: dict[str, dict[str, Any]] = {}
        for name, spec in sorted(self.models.items()):
            profiles = planned.get(name, set())
            want = wanted.get(name, 0) if plan else None
            pods = by_model.get(name, [])
            ready = sum(1 for p in pods if is_ready(p) and not p["metadata"].get("deletionTimestamp"))
            if spec.backend == "multinode":
                ready = self.workloads.ready(name, WHOLE)
            foreign = [h for p in profiles | set(spec.allowed_profiles) if (h := self.workloads.foreign_scaler(name, p))]
            why = waiting.get(name, "")
            stuck = [p for p in pods if unschedulable(p)]
            if want is None:
                status, reason, msg = "Unknown", "NoPlan", "no plan yet"
            elif ready >= want:
                status, reason, msg = "True", "AtTarget", f"{ready}/{want} replicas ready"
            elif foreign:
                status, reason, msg = "False", "ScaledByOtherController", f"HorizontalPodAutoscaler {foreign[0]} owns a workload's replicas"
            elif "repartitioning" in why:
                status, reason, msg = "False", "Repartitioning", why
            elif "disruption budget" in why:
                status, reason, msg = "False", "DisruptionBudget", why
            elif stuck:
                cond = next(c for c in stuck[0]["status"]["conditions"] if c.get("type") == "PodScheduled")
                status, reason, msg = "False", "Unschedulable", f"{len(stuck)} pod(s) pending: {cond.get('message', '')}"
            elif plan is not None and (plan.shortfall.get(name) or 0) > 0:
                status, reason, msg = "False", "Shortfall", f"the cluster cannot hold the target: {plan.shortfall[name]:.0f} req/s unserved"
            elif why or len(pods) > ready:
                status, reason, msg = "False", "WaitingForPods", why or f"{ready}/{want} ready, {len(pods) - ready} starting or terminating"
            else:
                status, reason, msg = "False", "Deferred", f"{ready}/{want} ready; the rest waits for the churn budget or a busy GPU"
            prev = self._transitions.get(name)
            since = prev[2] if prev is not None and prev[:2] == (status, reason) else now
            self._transitions[name] = (status, reason, since)
            out[name] = {"type": "AtTarget", "status": status, "reason": reason, "message": msg,
                         "lastTransitionTime": rfc3339(since), "ready": ready, "desired": want}
        for gone in set(self._transitions) - set(self.models):
            del self._transitions[gone]
        return out

    def stats(self) -> dict[str, Any]:
        return {
            "informers": [i.stats() for i in self.caches.all()],
            "events": self.recorder.stats(),
            "chains": len(self.rollout.chains),
            "repartitions": sorted(self.repartitioner.in_progress()),
            "requests": dict(self.rest.counts),
        }
