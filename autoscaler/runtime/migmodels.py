"""MigModels as the Kubernetes controller's model source: watched, admitted against the fleet, status written back.

Place in the loop: ``KubernetesController.before_tick`` asks ``current()``
for the model set (models may come and go between ticks) and
``after_tick`` hands the tick to ``after_tick(ctl, result)``, which writes
each MigModel's ``status``. Everything here reads informers (list+watch
with resourceVersion, relist on 410: ``act/kubernetes/informer.py``), so a
steady tick sends no request and writes only the statuses that changed.

**Watching.** One informer over all namespaces, or one per namespace of a
configured list. The MigModel CRD must be installed: a 404 on the first list
fails start-up with the command that installs it, rather than starting with
no models and retiring every workload on the cluster.

**Identity.** A MigModel is known by ``namespace/name``; the model it serves
is named by ``metadata.name``, and that name must be unique across the
cluster. The loop keys demand, decisions and the metrics API by model name,
Triton's metrics carry it as their ``model`` label (the queries group ``by
(model)``, observe/queries.py), and workload and pod names embed it: two
teams' ``resnet`` would be one demand signal and one set of pods. So the
first MigModel to hold a name with a valid spec (oldest
``creationTimestamp``, then namespace) serves it; a later one gets
``ConfigValid=False`` naming the holder and nothing of it is deployed. It
takes over by itself when the holder is deleted.

**Admission.** The API server has already applied the CRD's schema and CEL
rules. What needs the fleet is checked here with the checks ``migscale
validate`` runs on models.yaml + cluster.yaml (``validate_pair``): a profile
no GPU in the fleet has, memory no slice has, no req/s figure for a usable
profile, a multinode group the RDMA pool cannot hold. A spec that fails gets
``ConfigValid=False`` with the problems, each as ``spec.<field>: ..., got
<value>``; the model keeps its last admitted spec (or, if it never had one,
nothing is deployed), and no other model is touched. A spec is admitted
once per ``metadata.generation``.

**Ownership.** Each model's workloads go into the MigModel's namespace with
an ownerReference to it, so deleting the MigModel garbage-collects them. Its
``status`` is written only by the replica holding the lease, only through
the status subresource, and only when it differs from what is stored.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from autoscaler.act.kubernetes.client import KubeError, KubeRest, path_for
from autoscaler.act.kubernetes.crd import API_VERSION, KIND
from autoscaler.act.kubernetes.informer import Informer, obj_key, wait_all_synced
from autoscaler.act.kubernetes.migmodel import ModelReport, from_migmodel, migmodel_status
from autoscaler.act.kubernetes.render import WHOLE, OwnerRef
from autoscaler.config import ConfigError, ModelsConfig, model_specs, validate_pair
from autoscaler.config.schema import ClusterConfig, ModelConfig
from autoscaler.policy.types import ModelSpec, Plan
from autoscaler.runtime.kubernetes import ModelSet

Obj = dict[str, Any]
log = logging.getLogger("migscale.migmodels")
# Measured numbers (req/s, p99, and the condition messages that quote them) move every tick; a status
# that differs only in them is rewritten at most this often. At 1,000 MigModels and a 5 s tick that is
# 33 writes/s instead of 200; a change of replicas, a condition's status or reason, or a generation is
# written at once.
NUMBERS_EVERY_S = 30.0
INSTALL_HINT = "install the MigModel CRD: kubectl apply -k k8s/base (or: migscale crd | kubectl apply -f -)"


@dataclass
class _Entry:
    """What the controller holds for one MigModel (by namespace/name)."""

    uid: str
    generation: int = -1  # the generation last admitted (or refused)
    good: ModelConfig | None = None  # the last admitted spec: the one in force
    spec: ModelSpec | None = None
    problems: tuple[str, ...] = ()  # why the current generation was refused
    conflict: str | None = None  # why the name is not ours to serve
    serving: bool = False


def _gist(status: Mapping[str, Any]) -> Any:
    """A status without what measurements move each tick: req/s, p99, and the conditions' messages."""
    conds = [(c.get("type"), c.get("status"), c.get("reason"), c.get("observedGeneration"))
             for c in status.get("conditions") or () if isinstance(c, Mapping)]
    return ({k: v for k, v in status.items() if k not in ("servedRps", "p99Ms", "conditions")}, conds)


def _relocate(problem: str) -> str:
    """``models[0].profiles[1]: ...`` (validate_pair on a one-model file) -> ``spec.profiles[1]: ...``."""
    return "spec." + problem[len("models[0].") :] if problem.startswith("models[0].") else problem


class MigModelSource:
    """A ``ModelSource`` (runtime/kubernetes.py) over the MigModels of the cluster."""

    def __init__(
        self,
        rest: KubeRest,
        cluster: ClusterConfig,
        *,
        namespaces: Sequence[str] | None = None,
        watch_timeout_s: float = 300.0,
        sync_timeout_s: float = 30.0,
        start: bool = True,
    ) -> None:
        self.rest = rest
        self.cluster = cluster
        self.namespaces = tuple(namespaces) if namespaces else None  # None: all namespaces
        self.sync_timeout_s = sync_timeout_s
        self.informers = [
            Informer(rest, API_VERSION, KIND, ns, watch_timeout_s=watch_timeout_s)
            for ns in (self.namespaces or (None,))
        ]
        self._entries: dict[str, _Entry] = {}
        self._written: dict[str, Obj] = {}  # key -> the status we last wrote (the cache may lag behind it)
        self._written_at: dict[str, float] = {}
        self.numbers_every_s = NUMBERS_EVERY_S
        self._plan: Plan | None = None
        self.status_writes = 0
        self.errors: deque[str] = deque(maxlen=100)
        if start:
            self.start()

    # ------------------------------------------------------------ lifecycle

    def start(self) -> None:
        """Start the watches and wait for their first list; raise if it does not come (CRD missing, no RBAC)."""
        for i in self.informers:
            i.start()
        if not wait_all_synced(self.informers, self.sync_timeout_s):
            errors = "; ".join(f"{i.namespace or 'all namespaces'}: {i.last_error}" for i in self.informers
                               if not i.synced)
            self.close()
            raise KubeError(0, f"cannot list MigModels ({errors}); {INSTALL_HINT}")

    def close(self) -> None:
        for i in self.informers:
            i.stop()

    def objects(self) -> list[Obj]:
        """Every MigModel watched, oldest first (the order that decides who holds a name)."""
        objs = [o for i in self.informers for o in i.items()]
        return sorted(objs, key=lambda o: (o["metadata"].get("creationTimestamp") or "", obj_key(o)))

    # ------------------------------------------------------------ admission

    def admit(self, obj: Obj) -> tuple[ModelConfig | None, ModelSpec | None, list[str]]:
        """The spec as the controller can honour it on this fleet, or the problems (``spec.<field>: ...``)."""
        model, problems = from_migmodel(obj)
        if model is None:
            return None, None, problems
        models = ModelsConfig(models=[model])
        problems = [_relocate(p) for p in validate_pair(models, self.cluster, check_dirs=False)]
        if problems:
            return None, None, problems
        try:
            spec = model_specs(models, self.cluster)[0]
        except ConfigError as exc:
            return None, None, [_relocate(p) for p in exc.problems]
        return model, spec, []

    def current(self) -> ModelSet:
        specs: list[ModelSpec] = []
        slo: dict[str, float] = {}
        spaces: dict[str, str] = {}
        owners: dict[str, OwnerRef] = {}
        holders: dict[str, str] = {}  # model name -> the MigModel serving it
        seen: set[str] = set()
        for obj in self.objects():
            meta = obj["metadata"]
            key, name, ns = obj_key(obj), meta["name"], meta.get("namespace") or ""
            seen.add(key)
            e = self._entries.get(key)
            if e is None or e.uid != meta.get("uid", ""):  # new, or deleted and created again
                e = self._entries[key] = _Entry(meta.get("uid", ""))
            generation = int(meta.get("generation") or 0)
            if e.generation != generation:
                model, spec, problems = self.admit(obj)
                e.generation, e.problems = generation, tuple(problems)
                if spec is not None:
                    e.good, e.spec = model, spec
                elif e.good is not None:
                    log.warning("MigModel %s generation %d refused, generation in force kept: %s",
                                key, generation, "; ".join(problems))
            e.conflict, e.serving = None, False
            if name in holders:
                e.conflict = (f"metadata.name: model {name!r} is already served from MigModel {holders[name]}; "
                              f"model names are unique across namespaces (metrics, decisions and pods are keyed "
                              f"by them), got {name!r}")
                continue
            if e.spec is None or e.good is None:
                continue
            holders[name] = key
            e.serving = True
            specs.append(e.spec)
            slo[name] = float(e.good.slo.p99_ms)
            spaces[name] = ns
            owners[name] = OwnerRef(API_VERSION, KIND, name, e.uid, ns)
        for gone in set(self._entries) - seen:
            del self._entries[gone]
            self._written.pop(gone, None)
            self._written_at.pop(gone, None)
        return ModelSet(tuple(specs), slo, spaces, owners)

    # ------------------------------------------------------------ status

    def report(self, obj: Obj, backend: Any, observation: Any) -> ModelReport:
        """One MigModel's numbers for ``migmodel_status``; a model not served shows no replicas."""
        meta = obj["metadata"]
        e = self._entries.get(obj_key(obj)) or _Entry(meta.get("uid", ""))
        problems = (*e.problems, *((e.conflict,) if e.conflict else ()))
        good = e.good
        slo_ms = (good.slo.p99_ms if good else ((obj.get("spec") or {}).get("slo") or {}).get("p99_ms")) or 0
        base: dict[str, Any] = {"generation": meta.get("generation"), "slo_p99_ms": float(slo_ms),
                                "min_replicas": good.min_replicas if good else 0, "config_problems": problems,
                                "in_force": good is not None and e.serving}
        if not e.serving or e.spec is None:
            return ModelReport(ready={}, desired={}, **base)
        name, plan = e.spec.name, self._plan
        profiles = (WHOLE,) if e.spec.backend == "multinode" else e.spec.allowed_profiles
        desired = backend.committed(name, profiles)
        ready = {p: n for p in profiles if (n := backend.workloads.ready(name, p)) > 0}
        sig = (observation.models.get(name) if observation is not None else None)
        return ModelReport(
            ready=ready, desired=desired,
            served_rps=sig.request_rate if sig is not None else None,
            p99_ms=sig.p99_ms if sig is not None else None,
            reasons=tuple(plan.reasons.get(name, ())) if plan else (),
            shortfall_rps=float((plan.shortfall.get(name) or 0.0) if plan else 0.0),
            **base,
        )

    def after_tick(self, ctl: Any, result: Any) -> None:
        """Write each MigModel's status when it changed; only the lease holder writes (one owner)."""
        if getattr(result, "plan", None) is not None:
            self._plan = result.plan
        if not ctl.role.leader:
            return
        now = ctl.clock.now()
        observation = ctl.loop.last_observation
        for obj in self.objects():
            key = obj_key(obj)
            stored = obj.get("status") or None
            prev = self._written.get(key) or stored
            status = migmodel_status(self.report(obj, ctl.backend, observation), prev, now)
            if status == stored or status == self._written.get(key):
                continue
            recent = now - self._written_at.get(key, float("-inf")) < self.numbers_every_s
            if recent and prev is not None and _gist(status) == _gist(prev):
                continue  # only the measured numbers moved: they wait for the next refresh
            if self.write_status(obj, status):
                self._written_at[key] = now

    def write_status(self, obj: Obj, status: Mapping[str, Any]) -> bool:
        meta = obj["metadata"]
        key = obj_key(obj)
        body = {"apiVersion": API_VERSION, "kind": KIND, "metadata": {
            "name": meta["name"], "namespace": meta.get("namespace"), "resourceVersion": meta.get("resourceVersion")},
            "spec": obj.get("spec"), "status": dict(status)}
        try:
            self.rest.request("PUT", path_for(API_VERSION, KIND, meta.get("namespace"), meta["name"], "status"),
                              body=body)
        except KubeError as exc:
            if exc.status not in (404, 409):  # gone, or changed since the cache saw it: the next tick looks again
                self.errors.append(f"status of MigModel {key}: {exc}")
            return False
        self._written[key] = dict(status)
        self.status_writes += 1
        return True

    def stats(self) -> dict[str, Any]:
        return {
            "informers": [i.stats() for i in self.informers],
            "status_writes": self.status_writes,
            "invalid": sorted(k for k, e in self._entries.items() if e.problems or e.conflict),
            "errors": list(self.errors)[-10:],
        }
