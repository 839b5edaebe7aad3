"""Emulated kube-controller-manager, scheduler and kubelet for the emulated API server.

Each class is one control loop from upstream's documented behaviour (sources
in docs/kubernetes.md), level-triggered: ``step(now)`` reads the whole store
and writes what differs, through the same write path as REST clients (new
resourceVersion, watch event, field audit under the controller's own manager
name). Times are passed in, so a test can drive them with a VirtualClock or
``ControlPlane`` can run them on the wall clock, scaled down.

- ``DeploymentController``: one ReplicaSet per pod-template hash (owned by the
  Deployment); rolling update within ``maxSurge``/``maxUnavailable``; status
  (replicas, updated, ready, available, observedGeneration, conditions).
- ``ReplicaSetController``: creates or deletes pods to match
  ``spec.replicas`` (pods owned by the ReplicaSet); on scale-down it deletes
  first unassigned, then Pending, then not-Ready pods, then the lowest
  ``controller.kubernetes.io/pod-deletion-cost``, then the newest.
  Terminating and terminal pods are not active.
- ``Kubelet`` (with the scheduler and the device plugin): binds a pending pod
  to a schedulable node (not cordoned, node affinity matched, enough free
  extended resources such as ``nvidia.com/mig-1g.10gb``; among those the
  fullest, as kube-scheduler's MostAllocated scoring bin-packs, ties to the
  last name) or marks it ``PodScheduled=False/Unschedulable``; a pod with
  scheduling gates waits (``SchedulingGated``) until they are removed; admits a bound pod only if the device
  plugin still has a free device (else ``Failed/UnexpectedAdmissionError``);
  a running pod has an IP (``status.podIP``, from 10.244.0.0/16) and is Ready ``ready_delay_s`` later, unless ``crashing`` says its
  container exits at start (then it reports ``CrashLoopBackOff`` and is never
  Ready, as the kubelet's restart back-off does); a deleted pod is removed
  ``stop_s`` later (its preStop sleep and shutdown, never past its grace).
- ``DisruptionController``: a PodDisruptionBudget's expected pods (the
  controllers' scale for ``maxUnavailable``), healthy pods (Ready, not
  terminating, not recently evicted), ``disruptionsAllowed``.
"""

from __future__ import annotations

import hashlib
import json
import math
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from datetime import datetime, timezone
from typing import Any

from fakeapi import ApiError, FakeKube, iso
from fakesem import copy_obj, match_labels_selector, selector_matches

Obj = dict[str, Any]
HASH = "pod-template-hash"
COST = "controller.kubernetes.io/pod-deletion-cost"


def owned_by(obj: Obj, uid: str) -> bool:
    return any(r.get("uid") == uid for r in obj["metadata"].get("ownerReferences") or [])


def ready(pod: Obj) -> bool:
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in (pod.get("status") or {}).get("conditions") or [])


def active(pod: Obj) -> bool:
    return not pod["metadata"].get("deletionTimestamp") and (pod.get("status") or {}).get("phase") not in ("Succeeded", "Failed")


def scaled(value: Any, total: int, round_up: bool) -> int:
    if isinstance(value, str) and value.endswith("%"):
        x = total * float(value[:-1]) / 100
        return math.ceil(x) if round_up else math.floor(x)
    return int(value or 0)


def set_status(fake: FakeKube, obj: Obj, status: Obj, manager: str) -> None:
    if obj.get("status") != status:
        new = copy_obj(obj)
        new["status"] = status
        try:
            fake.update_obj(new, manager, sub="status", check_rv=False, validate=False)
        except ApiError:
            pass  # deleted meanwhile


class DeploymentController:
    manager = "deployment-controller"

    def __init__(self, fake: FakeKube) -> None:
        self.fake = fake

    def step(self, now: float) -> None:
        by_owner: dict[str, list[Obj]] = {}
        for r in self.fake.view("ReplicaSet", "apps"):
            for ref in r["metadata"].get("ownerReferences") or []:
                by_owner.setdefault(ref.get("uid"), []).append(r)
        for d in self.fake.view("Deployment", "apps"):
            if d["metadata"].get("deletionTimestamp"):
                continue
            uid, spec = d["metadata"]["uid"], d["spec"]
            want = int(spec.get("replicas", 1))
            tpl = spec.get("template") or {}
            h = hashlib.sha256(json.dumps(tpl, sort_keys=True).encode()).hexdigest()[:10]
            mine = by_owner.get(uid, [])
            new = next((r for r in mine if (r["metadata"].get("labels") or {}).get(HASH) == h), None)
            olds = [r for r in mine if r is not new]
            if new is None:
                new = self._create_rs(d, h, 0 if any(r["spec"].get("replicas") for r in olds) else want)
                if new is None:
                    continue
            ru = (spec.get("strategy") or {}).get("rollingUpdate") or {}
            surge = scaled(ru.get("maxSurge", "25%"), want, True)
            unavail = scaled(ru.get("maxUnavailable", "25%"), want, False)
            if surge == 0 and unavail == 0:
                unavail = 1
            old_total = sum(int(r["spec"].get("replicas", 0)) for r in olds)
            if not old_total:
                self._scale_rs(new, want)
            else:
                room = want + surge - old_total
                self._scale_rs(new, max(min(want, room), min(int(new["spec"].get("replicas", 0)), want)))
                available = sum(int((r.get("status") or {}).get("availableReplicas", 0)) for r in mine)
                spare = max(0, available - (want - unavail))
                for r in sorted(olds, key=lambda r: r["metadata"]["creationTimestamp"]):
                    n = int(r["spec"].get("replicas", 0))
                    unready = n - int((r.get("status") or {}).get("availableReplicas", 0))
                    cut = min(n, unready + spare)
                    spare -= max(0, cut - unready)
                    if cut:
                        self._scale_rs(r, n - cut)
            sts = [r.get("status") or {} for r in mine]
            total = sum(int(s.get("replicas", 0)) for s in sts)
            avail = sum(int(s.get("availableReplicas", 0)) for s in sts)
            status = {
                "observedGeneration": d["metadata"].get("generation", 1),
                "replicas": total,
                "updatedReplicas": int((new.get("status") or {}).get("replicas", 0)),
                "readyReplicas": sum(int(s.get("readyReplicas", 0)) for s in sts),
                "availableReplicas": avail,
                "unavailableReplicas": max(0, want - avail),
                "conditions": [{"type": "Available", "status": "True" if avail >= want - unavail else "False",
                                "reason": "MinimumReplicasAvailable" if avail >= want - unavail else "MinimumReplicasUnavailable"}],
            }
            set_status(self.fake, d, status, self.manager)

    def _create_rs(self, d: Obj, h: str, replicas: int) -> Obj | None:
        tpl = copy_obj(d["spec"].get("template") or {})
        tpl.setdefault("metadata", {}).setdefault("labels", {})[HASH] = h
        sel = copy_obj(d["spec"].get("selector") or {})
        sel.setdefault("matchLabels", {})[HASH] = h
        rs = {
            "apiVersion": "apps/v1", "kind": "ReplicaSet",
            "metadata": {"name": f"{d['metadata']['name']}-{h}", "namespace": d["metadata"]["namespace"],
                         "labels": dict(tpl["metadata"]["labels"]),
                         "ownerReferences": [{"apiVersion": "apps/v1", "kind": "Deployment", "name": d["metadata"]["name"],
                                              "uid": d["metadata"]["uid"], "controller": True, "blockOwnerDeletion": True}]},
            "spec": {"replicas": replicas, "selector": sel, "template": tpl},
        }
        try:
            return self.fake.create_obj(rs, self.manager, validate=False)
        except ApiError:
            return None

    def _scale_rs(self, rs: Obj, n: int) -> None:
        if int(rs["spec"].get("replicas", 0)) != n:
            new = copy_obj(rs)
            new["spec"]["replicas"] = n
            try:
                self.fake.update_obj(new, self.manager, check_rv=False, validate=False)
            except ApiError:
                pass


class ReplicaSetController:
    manager = "replicaset-controller"

    def __init__(self, fake: FakeKube) -> None:
        self.fake = fake

    def step(self, now: float) -> None:
        by_owner: dict[str, list[Obj]] = {}
        for p in self.fake.view("Pod"):
            for ref in p["metadata"].get("ownerReferences") or []:
                by_owner.setdefault(ref.get("uid"), []).append(p)
        for rs in self.fake.view("ReplicaSet", "apps"):
            mine = by_owner.get(rs["metadata"]["uid"], [])
            live = [p for p in mine if active(p)]
            diff = len(live) - int(rs["spec"].get("replicas", 0))
            if diff < 0:
                for _ in range(-diff):
                    self._create_pod(rs)
            elif diff > 0:
                for p in sorted(live, key=self._deletion_rank)[:diff]:
                    try:
                        self.fake.delete_obj(self.fake.key_of(p), self.manager)
                    except ApiError:
                        pass
            status = {"observedGeneration": rs["metadata"].get("generation", 1), "replicas": len(live),
                      "fullyLabeledReplicas": len(live), "readyReplicas": sum(1 for p in live if ready(p)),
                      "availableReplicas": sum(1 for p in live if ready(p))}
            set_status(self.fake, rs, status, self.manager)

    @staticmethod
    def _deletion_rank(p: Obj) -> tuple:
        st = p.get("status") or {}
        phase = {"Pending": 0, "Unknown": 1, "Running": 2}.get(st.get("phase", "Pending"), 0)
        try:
            cost = int((p["metadata"].get("annotations") or {}).get(COST, 0))
        except ValueError:
            cost = 0
        created = datetime.strptime(p["metadata"].get("creationTimestamp", "1970-01-01T00:00:00Z"),
                                    "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=timezone.utc).timestamp()
        # preferred for deletion first: unassigned, pending, not ready, low cost, newest
        return (1 if (p.get("spec") or {}).get("nodeName") else 0, phase, 1 if ready(p) else 0, cost, -created)

    def _create_pod(self, rs: Obj) -> None:
        tpl = rs["spec"]["template"]
        pod = {"apiVersion": "v1", "kind": "Pod",
               "metadata": {"name": f"{rs['metadata']['name']}-{uuid.uuid4().hex[:5]}",
                            "namespace": rs["metadata"]["namespace"],
                            "labels": dict((tpl.get("metadata") or {}).get("labels") or {}),
                            "annotations": dict((tpl.get("metadata") or {}).get("annotations") or {}),
                            "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": rs["metadata"]["name"],
                                                 "uid": rs["metadata"]["uid"], "controller": True, "blockOwnerDeletion": True}]},
               "spec": copy_obj(tpl.get("spec") or {})}
        self.fake.create_obj(pod, self.manager, validate=False)


def crash_looping(pod: Obj) -> bool:
    return any(((cs.get("state") or {}).get("waiting") or {}).get("reason") == "CrashLoopBackOff"
               for cs in (pod.get("status") or {}).get("containerStatuses") or [])


def requests_of(pod: Obj) -> dict[str, int]:
    out: dict[str, int] = {}
    for c in (pod.get("spec") or {}).get("containers") or []:
        res = c.get("resources") or {}
        for k, v in {**(res.get("requests") or {}), **(res.get("limits") or {})}.items():
            if "/" in k:  # extended resources: nvidia.com/*, rdma/*
                out[k] = out.get(k, 0) + int(v)
    return out


def affinity_ok(pod: Obj, node: Obj) -> bool:
    terms = ((((pod.get("spec") or {}).get("affinity") or {}).get("nodeAffinity") or {})
             .get("requiredDuringSchedulingIgnoredDuringExecution") or {}).get("nodeSelectorTerms") or []
    if not terms:
        return True
    lbls = node["metadata"].get("labels") or {}
    return any(selector_matches(match_labels_selector({"matchExpressions": t.get("matchExpressions") or []}), lbls)
               for t in terms)


class Kubelet:
    """The scheduler, the device plugin's admission and the kubelets of every node, in one loop."""

    def __init__(self, fake: FakeKube, *, ready_delay_s: float = 1.0, stop_s: float = 0.5) -> None:
        self.fake = fake
        self.ready_delay_s = ready_delay_s
        self.stop_s = stop_s
        self._started: dict[str, float] = {}
        self._stopping: dict[str, float] = {}
        self.admission_failures = 0
        # pods whose container exits at start: the kubelet restarts it with a back-off and reports
        # state.waiting.reason=CrashLoopBackOff; the pod stays Running and never Ready
        self.crashing: Callable[[Obj], bool] = lambda pod: False
        # the CNI's pod IPs (10.244.0.0/16, kind's and flannel's default pod CIDR): one per
        # pod from its sandbox's start, reported in status.podIP as the kubelet does
        self._ips: dict[str, str] = {}
        self._next_ip = 2

    def step(self, now: float) -> None:
        nodes = {n["metadata"]["name"]: n for n in self.fake.view("Node")}
        pods = sorted(self.fake.view("Pod"), key=lambda p: p["metadata"].get("creationTimestamp", ""))
        used: dict[str, dict[str, int]] = {n: {} for n in nodes}
        for p in pods:
            node = (p.get("spec") or {}).get("nodeName")
            if node in used and (p.get("status") or {}).get("phase") == "Running":
                for k, v in requests_of(p).items():
                    used[node][k] = used[node].get(k, 0) + v
        for p in pods:
            uid, spec, st = p["metadata"]["uid"], p.get("spec") or {}, p.get("status") or {}
            node = spec.get("nodeName")
            if p["metadata"].get("deletionTimestamp"):
                t0 = self._stopping.setdefault(uid, now)
                grace = float(p["metadata"].get("deletionGracePeriodSeconds", 30))
                if now - t0 >= min(self.stop_s, grace):
                    try:
                        self.fake.remove_now(self.fake.key_of(p), "kubelet")
                    except ApiError:
                        pass
                    self._stopping.pop(uid, None)
                    self._started.pop(uid, None)
                    self._ips.pop(uid, None)
                continue
            if st.get("phase") in ("Succeeded", "Failed"):
                continue
            if not node and spec.get("schedulingGates"):
                cond = {"type": "PodScheduled", "status": "False", "reason": "SchedulingGated",
                        "message": "Scheduling is blocked due to non-empty scheduling gates"}
                if (p.get("status") or {}).get("conditions") != [cond]:
                    set_status(self.fake, p, {"phase": "Pending", "conditions": [cond]}, "default-scheduler")
            elif not node:
                self._schedule(p, nodes, used)
            elif st.get("phase", "Pending") == "Pending":
                self._admit(p, nodes.get(node), used, now)
            elif not ready(p) and now - self._started.get(uid, now) >= self.ready_delay_s:
                if not self.crashing(p):
                    self._set_pod(p, "Running", ready_now=True)
                elif not crash_looping(p):
                    self._set_pod(p, "Running", ready_now=False, crashed=True)

    def _free(self, node: Obj, used: dict[str, int], res: str) -> int:
        alloc = (node.get("status") or {}).get("allocatable") or {}
        return int(alloc.get(res, 0)) - used.get(res, 0)

    def _schedule(self, p: Obj, nodes: dict[str, Obj], used: dict[str, dict[str, int]]) -> None:
        req = requests_of(p)
        fits = [n for name, n in nodes.items() if not (n.get("spec") or {}).get("unschedulable")
                and affinity_ok(p, n) and all(self._free(n, used[name], k) >= v for k, v in req.items())]
        if not fits:
            why = ", ".join(f"Insufficient {k}" for k in sorted(req)) or "node(s) didn't match"
            cond = {"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
                    "message": f"0/{len(nodes)} nodes are available: {why}."}
            if cond not in ((p.get("status") or {}).get("conditions") or []):
                set_status(self.fake, p, {**(p.get("status") or {}), "phase": "Pending", "conditions": [cond]}, "default-scheduler")
            return
        first = next(iter(req), None)

        def most_allocated(n: Obj) -> tuple[float, str]:
            # kube-scheduler's NodeResourcesFit with the MostAllocated strategy over the pod's extended
            # resource: the fullest node that fits wins (bin-packing, as GPU clusters are configured)
            if first is None:
                return (0.0, n["metadata"]["name"])
            alloc = int(((n.get("status") or {}).get("allocatable") or {}).get(first, 0))
            return ((alloc - self._free(n, used[n["metadata"]["name"]], first) + req[first]) / max(1, alloc),
                    n["metadata"]["name"])

        best = max(fits, key=most_allocated)
        name = best["metadata"]["name"]
        for k, v in req.items():
            used[name][k] = used[name].get(k, 0) + v
        new = copy_obj(p)
        new["spec"]["nodeName"] = name
        try:
            new = self.fake.update_obj(new, "default-scheduler", check_rv=False, validate=False)
            set_status(self.fake, new, {"phase": "Pending", "conditions": [{"type": "PodScheduled", "status": "True"}]},
                       "default-scheduler")
        except ApiError:
            pass

    def _admit(self, p: Obj, node: Obj | None, used: dict[str, dict[str, int]], now: float) -> None:
        if node is None:
            return
        name = node["metadata"]["name"]
        req = requests_of(p)
        short = [k for k, v in req.items() if self._free(node, used[name], k) < v]
        if short:
            self.admission_failures += 1
            set_status(self.fake, p, {"phase": "Failed", "reason": "UnexpectedAdmissionError",
                                      "message": f"Allocate failed due to requested number of devices unavailable for {short[0]}"},
                       "kubelet")
            return
        for k, v in req.items():
            used[name][k] = used[name].get(k, 0) + v
        self._started[p["metadata"]["uid"]] = now
        self._set_pod(p, "Running", ready_now=self.ready_delay_s <= 0)

    def pod_ip(self, uid: str) -> str:
        if uid not in self._ips:
            n = self._next_ip
            self._next_ip += 1
            self._ips[uid] = f"10.244.{n // 254 % 256}.{n % 254 + 1}"
        return self._ips[uid]

    def _set_pod(self, p: Obj, phase: str, *, ready_now: bool, crashed: bool = False) -> None:
        flag = "True" if ready_now else "False"
        ip = self.pod_ip(p["metadata"]["uid"])
        state = ({"waiting": {"reason": "CrashLoopBackOff", "message": "back-off restarting failed container"}}
                 if crashed else {"running": {"startedAt": iso(time.time())}})
        set_status(self.fake, p, {
            "phase": phase,
            "podIP": ip,
            "podIPs": [{"ip": ip}],
            "conditions": [{"type": "PodScheduled", "status": "True"}, {"type": "Initialized", "status": "True"},
                           {"type": "ContainersReady", "status": flag}, {"type": "Ready", "status": flag}],
            "containerStatuses": [{"name": c["name"], "ready": ready_now, "restartCount": 1 if crashed else 0,
                                   "image": c.get("image", ""), "imageID": "", "state": state}
                                  for c in (p.get("spec") or {}).get("containers") or []],
        }, "kubelet")


class DisruptionController:
    manager = "disruption-controller"

    def __init__(self, fake: FakeKube, *, forget_s: float = 120.0) -> None:
        self.fake = fake
        self.forget_s = forget_s  # an evicted pod still not deleted after this is counted again (upstream: 2 min)

    def _expected(self, pods: list[Obj]) -> int:
        rss = {r["metadata"]["uid"]: r for r in self.fake.view("ReplicaSet", "apps")}
        deps = {d["metadata"]["uid"]: d for d in self.fake.view("Deployment", "apps")}
        seen: dict[str, int] = {}
        for p in pods:
            for ref in p["metadata"].get("ownerReferences") or []:
                rs = rss.get(ref.get("uid"))
                if rs is None:
                    continue
                top = next((deps[r["uid"]] for r in rs["metadata"].get("ownerReferences") or [] if r.get("uid") in deps), rs)
                seen[top["metadata"]["uid"]] = int(top["spec"].get("replicas", 0))
        return sum(seen.values())

    def step(self, now: float) -> None:
        by_ns: dict[str, list[Obj]] = {}
        for p in self.fake.view("Pod"):
            by_ns.setdefault(p["metadata"].get("namespace"), []).append(p)
        for pdb in self.fake.view("PodDisruptionBudget", "policy"):
            spec = pdb.get("spec") or {}
            want = (spec.get("selector") or {}).get("matchLabels") or {}
            sel = match_labels_selector(spec.get("selector"))
            mine = [p for p in by_ns.get(pdb["metadata"]["namespace"], [])
                    if all((p["metadata"].get("labels") or {}).get(k) == v for k, v in want.items())
                    and selector_matches(sel, p["metadata"].get("labels") or {})]
            st = pdb.get("status") or {}
            disrupted = {k: v for k, v in (st.get("disruptedPods") or {}).items()
                         if any(p["metadata"]["name"] == k and not p["metadata"].get("deletionTimestamp") for p in mine)}
            if "maxUnavailable" in spec:
                expected = self._expected(mine)
                desired = max(0, expected - scaled(spec["maxUnavailable"], expected, True))
            else:
                expected = len(mine)
                desired = scaled(spec.get("minAvailable", 0), expected, True)
            healthy = sum(1 for p in mine if ready(p) and not p["metadata"].get("deletionTimestamp")
                          and p["metadata"]["name"] not in disrupted)
            allowed = max(0, healthy - desired)
            status = {"observedGeneration": pdb["metadata"].get("generation", 1), "currentHealthy": healthy,
                      "desiredHealthy": desired, "expectedPods": expected, "disruptionsAllowed": allowed,
                      "conditions": [{"type": "DisruptionAllowed", "status": "True" if allowed else "False",
                                      "reason": "SufficientPods" if allowed else "InsufficientPods",
                                      "lastTransitionTime": iso(now), "message": "", "observedGeneration": 1}]}
            if disrupted:
                status["disruptedPods"] = disrupted
            old = {k: v for k, v in st.items() if k != "conditions"}
            if old != {k: v for k, v in status.items() if k != "conditions"}:
                set_status(self.fake, pdb, status, self.manager)


class ControlPlane:
    """Runs controllers' ``step(now)`` every ``interval_s`` on a thread (wall clock), or by hand."""

    def __init__(self, controllers: Sequence[Any], *, interval_s: float = 0.05,
                 now: Callable[[], float] = time.time) -> None:
        self.controllers = list(controllers)
        self.interval_s = interval_s
        self.now = now
        self.errors: list[str] = []
        self.held: set[type] = set()  # controller classes whose steps are skipped (one lagging controller)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def step(self) -> None:
        t = self.now()
        for c in self.controllers:
            if type(c) in self.held:
                continue
            try:
                c.step(t)
            except Exception as exc:  # noqa: BLE001 - an emulated controller's bug is a test failure, reported
                self.errors.append(f"{type(c).__name__}: {type(exc).__name__}: {exc}")

    def start(self) -> ControlPlane:
        self._stop.clear()  # a stopped plane may be started again (a test pauses the controllers)

        def loop() -> None:
            while not self._stop.is_set():
                self.step()
                self._stop.wait(self.interval_s)

        self._thread = threading.Thread(target=loop, name="control-plane", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
