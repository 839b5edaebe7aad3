"""Repartitioning a node through the GPU Operator's mig-manager, as a state machine that lives on the Node.

Place in the loop: the slowest action of the Kubernetes "act" edge. A
REPARTITION never blocks a tick: ``start`` writes the first step and returns,
``advance`` (once per leader tick) moves each node at most one step, and the
state is an annotation on the Node (``migscale.io/repartition``, JSON), so a
new leader reads it from its node cache and carries on where the old one
stopped. mig-manager reconfigures every GPU of a node at once and needs them
idle (docs/kubernetes.md), so the unit is the node:

1. ``start``: refuse if GPU pods migscale does not own run there (one list of
   the node's pods); write the node's new config into the mig-parted
   ConfigMap under a content-addressed name; then one patch cordons the node
   (remembering whether it was cordoned already) and writes the annotation,
   phase ``draining``;
2. ``draining``: evict migscale's pods on the node through the eviction API
   (the PodDisruptionBudget answers 429 while a replacement is not yet
   ready elsewhere: try again next tick). The whole node is drained, not
   just the GPU the plan cuts: mig-manager needs every GPU of the node idle
   and the device plugin does not say which GPU a pod holds. A workload whose
   every Ready pod is on the node is first given one more replica (a surge,
   recorded in the annotation as ``[size before, size after]``) and evicted
   only once that replica is Ready elsewhere -- make before break; with no
   free instance of its profile anywhere else the repartition is rolled back
   at once rather than emptying the model. A pod already terminating is
   never evicted again, and one evicted by this process is not retried for
   ``evict_retry_s``, so a slow watch cannot cause a double eviction. Once
   none is left, one patch sets ``nvidia.com/mig.config`` and the phase
   ``configuring``;
3. ``configuring``: wait for ``nvidia.com/mig.config.state=success`` *and*
   the device plugin's new allocatable ``nvidia.com/mig-*`` counts. When the
   new config has the same counts as the old one, success counts only after
   ``pending`` was seen (recorded in the annotation, so it survives a
   failover): a stale ``success`` of the previous config is not an answer;
4. finish: surged workloads go back to their size before (only if still at
   the surged size: the planner may have changed it since, and then it
   stands), then one patch uncordons (only if migscale cordoned) and removes
   the annotation.

A drain past ``drain_timeout_s``, a config past ``config_timeout_s``,
``failed`` from mig-manager, or someone else changing the config label roll
back: surges are undone, the label returns to its previous value (or is
removed), the node is uncordoned if we cordoned it, the annotation goes. A
node whose repartition failed is left alone for ``retry_after_s`` (``cooling``;
the backend reports its GPUs busy meanwhile, so the planner places elsewhere
instead of trying the same cut every tick). Every node
patch carries the resourceVersion read from the cache, so a concurrent
writer makes it fail with 409 and the step is retried next tick. Timeouts
compare wall-clock times written by possibly another replica; seconds of
skew do not matter against 300 s and 600 s.
"""

from __future__ import annotations

import json
import uuid
from collections import Counter, deque
from collections.abc import Callable, Sequence
from typing import Any

from autoscaler.act.kubernetes.client import KubeError, KubeRest, owned
from autoscaler.act.kubernetes.informer import Informer
from autoscaler.act.kubernetes.inventory import allocatable_mig, is_ready, pod_profile, pod_uses_gpu
from autoscaler.act.kubernetes.migparted import mig_config_entry, mig_config_name, mig_parted_configmap
from autoscaler.act.kubernetes.render import (
    MIG_CONFIG_LABEL,
    MIG_STATE_LABEL,
    MODEL_LABEL,
    RenderConfig,
    workload_name,
)
from autoscaler.act.kubernetes.workloads import Workloads
from autoscaler.clock import Clock
from autoscaler.config.io import ConfigError, parse_documents
from autoscaler.mig.layout import Placement

Obj = dict[str, Any]
ANNOTATION = "migscale.io/repartition"
CORDONED_BY = "migscale.io/cordoned"
MAX_CONFIGS = 10_000  # mig-parted configs remembered (oldest dropped); one per distinct node layout
DRAINING, CONFIGURING = "draining", "configuring"


def state_of(node: Obj | None) -> dict[str, Any] | None:
    """The repartition recorded on a node, or None (absent or unreadable)."""
    raw = ((node or {}).get("metadata") or {}).get("annotations", {}).get(ANNOTATION)
    if not raw:
        return None
    try:
        st = json.loads(raw)
    except ValueError:
        return None
    return st if isinstance(st, dict) and st.get("phase") in (DRAINING, CONFIGURING) else None


class Repartitioner:
    def __init__(
        self,
        rest: KubeRest,
        cfg: RenderConfig,
        clock: Clock,
        nodes: Informer,
        pods: Informer,
        *,
        workloads: Workloads | None = None,
        free_elsewhere: Callable[[str, str], int] = lambda profile, node: 0,
        identity: str = "migscale",
        event: Callable[[Obj, str, str, str], None] | None = None,
        drain_timeout_s: float = 300.0,
        config_timeout_s: float = 600.0,
        evict_retry_s: float = 60.0,
        retry_after_s: float = 120.0,
        pass_budget_s: float | None = None,
    ) -> None:
        self.rest = rest
        self.pass_budget_s = pass_budget_s  # seconds one advance may spend (None: no limit)
        self.deferred = 0  # passes that stopped at the budget
        self._resume = ""  # the node the next pass starts with
        self.cfg = cfg
        self.clock = clock
        self.nodes = nodes
        self.pods = pods
        self.identity = identity
        self.event = event  # (regarding object, type, reason, note)
        self.drain_timeout_s = drain_timeout_s
        self.config_timeout_s = config_timeout_s
        self.evict_retry_s = evict_retry_s
        self.retry_after_s = retry_after_s
        self.workloads = workloads
        self.free_elsewhere = free_elsewhere  # (profile, node) -> free instances of it on other nodes
        self.failed_at: dict[str, float] = {}  # node -> when its last repartition failed
        self._surged: dict[str, set[str]] = {}  # repartition id -> workloads surged (the cache may lag our patch)
        self.log: deque[str] = deque(maxlen=500)  # steps taken, for status and tests
        self.results: dict[str, str] = {}  # repartition id -> "success" | error; bounded below
        # mig-parted configs by name, as the ConfigMap holds them: which GPU of a node has which
        # instances, which no label says (the inventory reads the node's applied config here)
        self.configs: dict[str, list[Obj]] = {}
        # node -> (config name, the per-GPU layouts the planner asked for): the config holds counts
        # only, and the inventory shows these starts while the node's label names that config
        self.starts: dict[str, tuple[str, tuple[tuple[Placement, ...] | None, ...]]] = {}
        self._evicted: dict[str, float] = {}  # pod -> when this process evicted it

    # ------------------------------------------------------------ reading

    def in_progress(self) -> dict[str, dict[str, Any]]:
        out = {}
        for n in self.nodes.items():
            st = state_of(n)
            if st is not None:
                out[n["metadata"]["name"]] = st
        return out

    def cooling(self, node: str) -> bool:
        t = self.failed_at.get(node)
        return t is not None and self.clock.now() - t < self.retry_after_s

    def draining_models(self) -> set[str]:
        """Models with pods on a node being drained (the planner must leave their sizes alone meanwhile)."""
        nodes = {n for n, st in self.in_progress().items() if st["phase"] == DRAINING}
        return {(p["metadata"].get("labels") or {}).get(MODEL_LABEL, "") for p in self.pods.items()
                if (p.get("spec") or {}).get("nodeName") in nodes} - {""}

    def _done(self, rid: str, result: str) -> None:
        self.results[rid] = result
        while len(self.results) > 1000:
            self.results.pop(next(iter(self.results)))

    # ------------------------------------------------------------ writes

    def load_configs(self) -> str | None:
        """Read the mig-parted ConfigMap's configs (those an earlier leader wrote); an error line, or None."""
        try:
            cm = self.rest.get("v1", "ConfigMap", self.cfg.mig_parted_namespace, self.cfg.mig_parted_configmap)
        except KubeError as exc:
            return f"mig-parted ConfigMap: {exc}"
        if cm is not None and owned(cm):
            self._remember(cm)
        return None

    def _remember(self, cm: Obj) -> dict[str, Any]:
        text = (cm.get("data") or {}).get("config.yaml") or ""
        try:
            docs = parse_documents(text, "mig-parted ConfigMap config.yaml") if text.strip() else []
        except ConfigError:
            return {}
        doc = docs[0] if docs else {}
        configs = doc.get("mig-configs") if isinstance(doc, dict) else None
        if not isinstance(configs, dict):
            return {}
        self.configs.update((k, v) for k, v in configs.items() if str(k).startswith("migscale-") and isinstance(v, list))
        while len(self.configs) > MAX_CONFIGS:
            self.configs.pop(next(iter(self.configs)))
        return configs

    def write_config(self, entry: list[Obj]) -> str:
        name = mig_config_name(entry)
        ns, cm_name = self.cfg.mig_parted_namespace, self.cfg.mig_parted_configmap
        for _ in range(5):
            cm = self.rest.get("v1", "ConfigMap", ns, cm_name)
            if cm is not None and not owned(cm):
                raise KubeError(409, f"ConfigMap {cm_name} is not managed by migscale")
            configs: dict[str, Any] = {}
            if cm is not None:
                configs = self._remember(cm)
            self.configs[name] = entry
            if configs.get(name) == entry:
                return name
            configs[name] = entry
            new = mig_parted_configmap(configs, self.cfg)
            try:
                if cm is None:
                    self.rest.create(new)
                else:
                    new["metadata"]["resourceVersion"] = cm["metadata"]["resourceVersion"]
                    self.rest.replace(new)
                return name
            except KubeError as exc:
                if exc.status != 409:
                    raise
        raise KubeError(409, "mig-parted ConfigMap: still conflicting after 5 tries")

    def _patch(self, node: Obj, patch: Obj) -> bool:
        """Merge-patch on the version we read; False on 409 (someone wrote meanwhile: retry next tick)."""
        name = node["metadata"]["name"]
        body = {**patch, "metadata": {**(patch.get("metadata") or {}),
                                      "resourceVersion": node["metadata"]["resourceVersion"]}}
        try:
            self.rest.merge_patch("v1", "Node", None, name, body)
            return True
        except KubeError as exc:
            if exc.status == 409:
                self.log.append(f"conflict {name}; retry next tick")
                return False
            raise

    def _emit(self, node: Obj, kind: str, reason: str, note: str) -> None:
        if self.event is not None:
            self.event(node, kind, reason, note)

    # ------------------------------------------------------------ start

    def start(self, node_name: str, gpu_layouts: Sequence[Sequence[Placement] | None]) -> tuple[str | None, str | None]:
        """Begin giving ``node_name`` these per-GPU layouts (None = MIG off): (repartition id, error)."""
        node = self.nodes.get(node_name)
        if node is None:
            return None, f"repartition {node_name}: node not found"
        current = state_of(node)
        if current is not None:
            return current.get("id"), None  # already under way: join it
        if self.cooling(node_name):
            return None, (f"repartition {node_name}: left alone for {self.retry_after_s:.0f}s after its last "
                          "repartition failed")
        pods = self.rest.list("v1", "Pod", None, field_selector=f"spec.nodeName={node_name}")
        foreign = sorted(p["metadata"]["name"] for p in pods if pod_uses_gpu(p) and not owned(p)
                         and (p.get("status") or {}).get("phase") not in ("Succeeded", "Failed"))
        if foreign:
            return None, f"repartition {node_name}: refused, GPU pods not managed by migscale run there: {', '.join(foreign)}"
        entry = mig_config_entry(gpu_layouts)
        target: Counter[str] = Counter()
        for lay in gpu_layouts:
            target.update(p.profile for p in lay or ())
        name = self.write_config(entry)
        self.log.append(f"config {name}")
        self.starts[node_name] = (name, tuple(tuple(lay) if lay is not None else None for lay in gpu_layouts))
        meta = node["metadata"]
        lbls = meta.get("labels") or {}
        before = allocatable_mig(node)
        if lbls.get(MIG_CONFIG_LABEL) == name and lbls.get(MIG_STATE_LABEL) == "success" and before == target:
            return None, None  # already cut this way
        now = self.clock.now()
        rid = uuid.uuid4().hex[:8]
        cordon = not (node.get("spec") or {}).get("unschedulable")
        st = {"id": rid, "config": name, "previous": lbls.get(MIG_CONFIG_LABEL), "phase": DRAINING,
              "cordoned": cordon, "since": now, "phaseSince": now, "target": dict(target),
              "before": dict(before), "pendingSeen": False, "holder": self.identity, "surge": {}}
        patch: Obj = {"metadata": {"annotations": {ANNOTATION: json.dumps(st, sort_keys=True)}}}
        if cordon:
            patch["spec"] = {"unschedulable": True}
            patch["metadata"]["annotations"][CORDONED_BY] = "true"
        if not self._patch(node, patch):
            return None, f"repartition {node_name}: the node changed while starting; retried next tick"
        self.log.append(f"cordon {node_name}" if cordon else f"start {node_name} (already cordoned)")
        self._emit(node, "Normal", "RepartitionStarted",
                   f"draining migscale's pods, then {MIG_CONFIG_LABEL}={name} ({_fmt(target)})")
        return rid, None

    # ------------------------------------------------------------ advance

    def advance(self) -> list[str]:
        """One step for every node under way; returns errors (failed or rolled-back repartitions).

        Like a rollout pass, it stops taking nodes once it has run ``pass_budget_s``
        (a drain evicts every pod of a node, ~50 writes at 8 GPUs); the next pass
        starts at the first node it did not reach."""
        errors: list[str] = []
        t0 = self.clock.now()
        todo = sorted(self.in_progress().items())
        k = next((i for i, (name, _st) in enumerate(todo) if name >= self._resume), 0)
        self._resume = ""
        for name, st in todo[k:] + todo[:k]:
            if self.pass_budget_s is not None and self.clock.now() - t0 > self.pass_budget_s:
                self._resume = name
                self.deferred += 1
                break
            node = self.nodes.get(name)
            if node is None:
                continue
            try:
                err = self._drain(node, st) if st["phase"] == DRAINING else self._configure(node, st)
            except KubeError as exc:
                err = f"repartition {name}: {exc}"
            if err:
                errors.append(err)
        return errors

    def _drain(self, node: Obj, st: dict[str, Any]) -> str | None:
        name = node["metadata"]["name"]
        now = self.clock.now()
        on_node = self.pods.grouped("nodeName", lambda p: (p.get("spec") or {}).get("nodeName"))
        here = [p for p in on_node.get(name, ())
                if pod_uses_gpu(p) and (p.get("status") or {}).get("phase") not in ("Succeeded", "Failed")]
        by_workload: dict[tuple[str, str], list[Obj]] = {}
        for p in here:
            model = (p["metadata"].get("labels") or {}).get(MODEL_LABEL) or ""
            by_workload.setdefault((model, pod_profile(p)), []).append(p)
        surge = dict(st.get("surge") or {})
        for (model, profile), pods in sorted(by_workload.items()):
            wname = workload_name(model, profile)
            ready_here = sum(1 for p in pods if is_ready(p) and not p["metadata"].get("deletionTimestamp"))
            if self.workloads is not None and ready_here and self.workloads.ready(model, profile) - ready_here < 1:
                if wname not in surge and wname not in self._surged.get(st["id"], set()):
                    err = self._surge(node, st, surge, model, profile)
                    if err:
                        return err
                continue  # evict once the surge replica is Ready elsewhere
            for p in pods:
                self._evict(p, now)
        self._evicted = {k: v for k, v in self._evicted.items() if now - v < self.evict_retry_s}
        if not here:
            patch = {"metadata": {"labels": {MIG_CONFIG_LABEL: st["config"]},
                                  "annotations": {ANNOTATION: _dump(st, phase=CONFIGURING, phaseSince=now)}}}
            if self._patch(node, patch):
                self.log.append(f"label {name} {MIG_CONFIG_LABEL}={st['config']}")
            return None
        if now - float(st.get("phaseSince", now)) > self.drain_timeout_s:
            left = ", ".join(sorted(p["metadata"]["name"] for p in here))
            return self._rollback(node, st, f"drain timed out after {self.drain_timeout_s:.0f}s; still running: {left}",
                                  relabel=False)
        return None

    def _evict(self, p: Obj, now: float) -> None:
        pod = p["metadata"]["name"]
        if p["metadata"].get("deletionTimestamp") or now - self._evicted.get(pod, -1e18) < self.evict_retry_s:
            return
        try:
            self.rest.evict(p["metadata"]["namespace"], pod)
            self._evicted[pod] = now
            self.log.append(f"evict {p['metadata']['namespace']}/{pod}")
        except KubeError as exc:
            if exc.status not in (404, 429):  # 429: its budget says not now; try again next tick
                raise

    def _surge(self, node: Obj, st: dict[str, Any], surge: dict[str, Any], model: str, profile: str) -> str | None:
        """One more replica of a workload whose every Ready pod is on the node, before any is evicted."""
        assert self.workloads is not None
        name = node["metadata"]["name"]
        wname = workload_name(model, profile)
        spec = self.workloads.models.get(model)
        if spec is None:
            return None  # not a model we serve any more: its pods are simply evicted
        if self.free_elsewhere(profile, name) < 1:
            return self._rollback(node, st, f"{wname} has no Ready pod off {name} and no free {profile} instance "
                                  "elsewhere for a replacement; the node is left as it is", relabel=False)
        size = self.workloads.size(model, profile)
        surge[wname] = [size, size + 1]
        # record first: a crash after the scale leaves the surge known to the next leader
        if not self._patch(node, {"metadata": {"annotations": {ANNOTATION: _dump(st, surge=surge)}}}):
            return None
        self._surged.setdefault(st["id"], set()).add(wname)
        self.workloads.scale(spec, profile, size + 1, f"surge: a replacement before draining {name}")
        self.log.append(f"surge {wname} {size}->{size + 1}")
        return None

    def _unsurge(self, st: dict[str, Any]) -> None:
        """Back to the sizes before the drain, where nobody changed them since (compare and set)."""
        if self.workloads is None:
            return
        for wname, (before, after) in sorted((st.get("surge") or {}).items()):
            for spec in self.workloads.models.values():
                profile = next((p for p in (*spec.allowed_profiles, "whole") if workload_name(spec.name, p) == wname), None)
                if profile is not None and self.workloads.size(spec.name, profile) == after:
                    self.workloads.scale(spec, profile, before, "surge over: the node is back")
                    self.log.append(f"unsurge {wname} {after}->{before}")

    def _configure(self, node: Obj, st: dict[str, Any]) -> str | None:
        name = node["metadata"]["name"]
        lbls = node["metadata"].get("labels") or {}
        now = self.clock.now()
        if lbls.get(MIG_CONFIG_LABEL) != st["config"]:
            return self._rollback(node, st, f"{MIG_CONFIG_LABEL} changed to {lbls.get(MIG_CONFIG_LABEL)!r} by someone else",
                                  relabel=False)
        state = lbls.get(MIG_STATE_LABEL)
        if state == "failed":
            return self._rollback(node, st, f"mig-manager reported {MIG_STATE_LABEL}=failed for {st['config']}")
        counts = allocatable_mig(node)
        target = Counter({k: int(v) for k, v in (st.get("target") or {}).items()})
        seen = bool(st.get("pendingSeen")) or state in ("pending", "rebooting")
        settled = state == "success" and counts == target and (seen or counts != Counter(st.get("before") or {}))
        if settled:
            self._unsurge(st)
            patch: Obj = {"metadata": {"annotations": {ANNOTATION: None, CORDONED_BY: None}}}
            if st.get("cordoned"):
                patch["spec"] = {"unschedulable": None}
            if self._patch(node, patch):
                self._done(st["id"], "success")
                self.log.append(f"uncordon {name}" if st.get("cordoned") else f"done {name}")
                self._emit(node, "Normal", "RepartitionSucceeded", f"{MIG_CONFIG_LABEL}={st['config']}: {_fmt(target)}")
            return None
        if seen and not st.get("pendingSeen"):
            self._patch(node, {"metadata": {"annotations": {ANNOTATION: _dump(st, pendingSeen=True)}}})
            return None
        if now - float(st.get("phaseSince", now)) > self.config_timeout_s:
            return self._rollback(node, st, f"{MIG_STATE_LABEL} still {state!r} after {self.config_timeout_s:.0f}s")
        return None

    def _rollback(self, node: Obj, st: dict[str, Any], why: str, *, relabel: bool = True) -> str | None:
        name = node["metadata"]["name"]
        self._unsurge(st)
        patch: Obj = {"metadata": {"annotations": {ANNOTATION: None, CORDONED_BY: None}}}
        if relabel:
            patch["metadata"]["labels"] = {MIG_CONFIG_LABEL: st.get("previous")}
        if st.get("cordoned"):
            patch["spec"] = {"unschedulable": None}
        if not self._patch(node, patch):
            return None  # retried next tick
        msg = f"repartition {name}: {why}"
        if relabel:
            msg += f"; {MIG_CONFIG_LABEL} rolled back to {st.get('previous')!r}"
            self.log.append(f"rollback {name} {MIG_CONFIG_LABEL}={st.get('previous')}")
        if st.get("cordoned"):
            self.log.append(f"uncordon {name}")
        self._done(st["id"], msg)
        self.failed_at[name] = self.clock.now()
        self._emit(node, "Warning", "RepartitionFailed", msg)
        return msg


def _dump(st: dict[str, Any], **changes: Any) -> str:
    return json.dumps({**st, **changes}, sort_keys=True)


def _fmt(counts: Counter[str] | dict[str, int]) -> str:
    return ", ".join(f"{n}x {p}" for p, n in sorted(counts.items())) or "MIG off"
