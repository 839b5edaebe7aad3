"""Where new pods of migscale's Deployments go: the placement gate, the pins and the unpins.

Place in the loop: the rollout (``rollout.py``) records where the planner put
each new pod (``place``) just before it raises the workload's size
(``Workloads.scale``); the backend lifts the gate of each new pod as the Pod
watch shows it (``ungate``) and, every tick, recreates pods pinned to a node
that can no longer take them (``unpin``). This module writes only to pods:
their scheduling gate, their required node affinity, and their deletion.

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
"""

from __future__ import annotations

import copy
import threading
from collections import OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from autoscaler.act.kubernetes.client import KubeError, KubeRest, owned
from autoscaler.act.kubernetes.informer import Informer
from autoscaler.act.kubernetes.inventory import node_of, pod_profile
from autoscaler.act.kubernetes.render import (
    HOSTNAME_LABEL,
    MODEL_LABEL,
    PLACEMENT_GATE,
    mig_resource,
    workload_name,
)
from autoscaler.act.kubernetes.workloads import WRITE_FRESH_S
from autoscaler.clock import Clock

Obj = dict[str, Any]
# an ungate patch answered 409 is made again from the live pod this many times (client-go: 5 steps)
CONFLICT_RETRIES = 4
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
class PodPlacer:
    rest: KubeRest
    namespace: str  # the controller's own: a pod object without one is there
    clock: Clock
    pods: Informer
    nodes: Informer
    event: Callable[..., None]  # EventRecorder.event(regarding, type, reason, note)
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
            todo = self._ungate(self.pods.items() if pods is None else pods)  # place() never waits on HTTP
        errors: list[str] = []
        for pod, wl, placement, node in todo:
            name = pod["metadata"]["name"]
            try:
                self._lift(pod, node)
            except KubeError as exc:
                with self._gate_lock:
                    self._ungated.pop(name, None)
                    self._pinned.pop(name, None)
                    if placement is not None:  # first in line again: for this pod next pass, or its replacement
                        self._placements.setdefault(wl, deque(maxlen=1000)).appendleft(placement)
                if exc.status not in (404, 409):  # gone, or changed since the cache: next pass
                    errors.append(f"ungate pod {name}: {exc}")
        return errors

    def _lift(self, pod: Obj, node: str) -> None:
        """Lift ``pod``'s gate; on 409 (it changed since the cache read it -- the scheduler marks a
        gated pod right after its creation) again from the live pod, as client-go's
        RetryOnConflict does, a few times."""
        ns, name = pod["metadata"].get("namespace", self.namespace), pod["metadata"]["name"]
        for attempt in range(CONFLICT_RETRIES + 1):
            try:
                self.rest.merge_patch("v1", "Pod", ns, name, _ungate_patch(pod, node))
                return
            except KubeError as exc:
                if exc.status != 409 or attempt == CONFLICT_RETRIES:
                    raise
            pod = self.rest.get("v1", "Pod", ns, name)
            if pod is None:
                raise KubeError(404, f"pod {name} is gone")
            if not _gated(pod):
                return  # lifted by another writer meanwhile: nothing left to do

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
        for p in self.pods.items():
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
                self.rest.delete("v1", "Pod", meta.get("namespace", self.namespace), meta["name"],
                                 resource_version=meta.get("resourceVersion"))
                self._stuck.pop(meta["name"], None)
                self.event(p, "Normal", "Replaced",
                           f"pinned to a node with no free instance for {UNPIN_AFTER_S:.0f}s; "
                           "its ReplicaSet places a new pod")
            except KubeError as exc:
                if exc.status not in (404, 409):  # gone, or changed since we read it: look again next pass
                    errors.append(f"replace unschedulable pod {meta['name']}: {exc}")
        return errors

    def _ungate(self, candidates: list[Obj]) -> list[tuple[Obj, str, tuple[str, tuple[str, int] | None, float] | None, str]]:
        """The gated pods to lift, recorded as done (undone by ``ungate`` on failure): each with its
        workload, the placement it used (put back if the patch fails) and its node ("" for none)."""
        todo: list[tuple[Obj, str, tuple[str, tuple[str, int] | None, float] | None, str]] = []
        now = self.clock.now()
        self._ungated = {k: t for k, t in self._ungated.items() if now - t < WRITE_FRESH_S}
        self._unplaced = {k: t for k, t in self._unplaced.items() if now - t < 2 * PLACEMENT_TTL_S}
        self._refused = {k: t for k, t in self._refused.items() if now - t < PLACEMENT_TTL_S}
        gated = [p for p in candidates if p["metadata"]["name"] not in self._ungated
                 and not p["metadata"].get("deletionTimestamp")
                 and _gated(p)]
        if not gated:
            return todo
        # instances of each profile taken on each node: bound pods, and pods pinned there not yet bound;
        # of the bound ones, those on their way out (their instance frees within their grace period)
        taken: dict[tuple[str, str], int] = {}
        leaving: dict[tuple[str, str], int] = {}
        pinned_now = {name for name, (_n, _p, t) in self._pinned.items() if now - t < WRITE_FRESH_S}
        for p in self.pods.items():
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
            live = self.nodes.get(n) if n else None
            alloc = int(((live or {}).get("status") or {}).get("allocatable", {}).get(mig_resource(profile), 0) or 0)
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
            todo.append((pod, wl, (node, spot, placed_at) if planned else None, node))
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


def _gated(pod: Obj) -> bool:
    """``pod`` still carries migscale's placement gate."""
    return any(g.get("name") == PLACEMENT_GATE for g in (pod.get("spec") or {}).get("schedulingGates") or [])


def _ungate_patch(pod: Obj, node: str) -> Obj:
    """The merge patch that lifts migscale's gate from ``pod`` (and pins it to ``node`` if one is given).

    A merge patch replaces the whole gate list, computed from ``pod``: it carries ``pod``'s
    resourceVersion, so a pod changed since (another controller lifted its own gate, which this
    list would put back -- a gate cannot be added after creation) answers 409 instead."""
    spec = pod.get("spec") or {}
    patch: Obj = {"metadata": {"resourceVersion": pod["metadata"].get("resourceVersion")},
                  "spec": {"schedulingGates": [g for g in spec.get("schedulingGates") or []
                                               if g.get("name") != PLACEMENT_GATE] or None}}
    if node:
        patch["spec"]["affinity"] = with_hostname(spec.get("affinity") or {}, node)
    return patch


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
