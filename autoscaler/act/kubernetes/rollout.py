"""Make-before-break on Kubernetes: a tick's actions become chains that advance as the cluster catches up.

Place in the loop: the backend's ``apply`` hands the planner's actions here;
``advance`` runs once per leader tick. Nothing blocks: a step either
completes now, waits for the cluster (and is tried again next tick), or fails
and drops the rest of its chain, each dropped action reported as skipped --
never a break without its make. This is the actuator contract of
``autoscaler/protocols.py`` at the level Kubernetes offers: the ReplicaSet
names the pods and the scheduler and device plugin pick node and instance, so
a CREATE is "one more pod of this workload" (an error only when its node has
no instance of the profile at all; done when its id names a live pod of the
workload -- the same CREATE re-applied), a DRAIN/DELETE names a pod (its
workload read from the snapshot when the action gives no profile), and one of
a pod that is already gone is done without removing another. Every action
after a failed one in its chain -- including those merged into the failed
step -- is reported as skipped, by the planner's name for it.

Actions are split into independent chains: actions sharing a model are
linked, and so are actions on a node that this batch repartitions (the whole
node is drained for mig-manager). One chain waiting -- for new pods to be
Ready, for a repartition -- holds up only its own models. Within a chain,
consecutive CREATEs (DELETEs) of one workload are one scale write. What each
step waits for:

- CREATE: nothing; the workload's ``spec.replicas`` goes up through the
  scale subresource (the workload, its budget and the model's Service are
  created on first use). The chain remembers the size it set;
- WAIT_READY: that many Ready pods of the workload -- state carried across
  ticks, not a blocking wait. A swap's old pods are scaled down only after
  this passes. It fails after ``ready_timeout_s``, or at once when a new pod
  can never start (no free instance of its profile anywhere, or Failed),
  so the planner can re-plan instead of the model waiting for ten minutes;
- DRAIN: marks the chosen pod to go first (pod-deletion-cost);
- DELETE: scale down, but remove Ready pods only as far as the workload's
  PodDisruptionBudget allows (its ``disruptionsAllowed``; the ReplicaSet
  removes not-Ready pods first): a swap's old workload goes one budget's
  worth per tick, and not at all while another pod of it is being evicted;
- REPARTITION: starts the node's repartition (``repartition.py``) and
  waits for its outcome; a rollback fails the chain.

``busy()`` says which GPUs and models have work queued, for the loop's
per-GPU/per-model gate; ``waiting()`` says why, for the models' conditions.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

from autoscaler.act.kubernetes.client import KubeError
from autoscaler.act.kubernetes.inventory import is_ready, node_of
from autoscaler.act.kubernetes.placer import PodPlacer
from autoscaler.act.kubernetes.render import WHOLE, workload_name
from autoscaler.act.kubernetes.repartition import Repartitioner, state_of
from autoscaler.act.kubernetes.workloads import Workloads
from autoscaler.clock import Clock
from autoscaler.mig.layout import Placement
from autoscaler.policy.planner import group_of
from autoscaler.policy.types import Action, ActionKind, ClusterState, Reason
from autoscaler.protocols import action_groups, describe

DONE, WAIT = "done", "wait"
QUIET = "\x00"  # a failure already reported elsewhere (the repartition's own error): only the drop is news


@dataclass
class Step:
    kind: ActionKind
    reason: Reason
    model: str | None = None
    profile: str | None = None  # the workload's profile (WHOLE for a multinode model)
    replicas: tuple[str, ...] = ()
    gpus: tuple[str, ...] = ()
    node: str | None = None
    layouts: tuple[tuple[Placement, ...] | None, ...] = ()
    targets: dict[str, tuple[Placement, ...] | None] = field(default_factory=dict)  # REPARTITION: GPU -> layout
    rid: str | None = None
    carved_first: bool = False  # CREATE: a REPARTITION of its node runs before it in the chain
    removed: int = 0  # DELETE: pods already scaled away by this step (the budget paces it over ticks)
    acts: list[Action] = field(default_factory=list)  # the planner's actions merged into this step

    @property
    def actions(self) -> int:
        return max(1, len(self.acts))

    @property
    def n(self) -> int:
        if self.profile == WHOLE:
            return len({group_of(r) for r in self.replicas}) or 1
        return max(1, len(self.replicas))


@dataclass
class Chain:
    steps: list[Step]
    targets: dict[tuple[str, str], int] = field(default_factory=dict)
    head: int = -1  # id() of the step that is waiting
    since: float = 0.0
    why: str = ""


def _name(s: Step) -> str:
    what = workload_name(s.model, s.profile) if s.model and s.profile else (s.node or "")
    return f"{s.kind.value} {what}".strip()


class Rollout:
    def __init__(
        self,
        workloads: Workloads,
        placer: PodPlacer,
        repartitioner: Repartitioner,
        clock: Clock,
        *,
        cannot_start: Callable[[str, str], str | None] = lambda m, p: None,
        ready_timeout_s: float = 600.0,
        pass_budget_s: float | None = 0.25,
    ) -> None:
        self.workloads = workloads
        self.placer = placer
        # Seconds the passes of one tick may spend starting steps that write (None: no
        # limit). A tick's passes -- the backend's ``advance`` before the tick, then the
        # ``apply`` of its actions -- share it (``begin_tick``/``end_tick``); a pass outside
        # a tick has it to itself. Worked number: at ~10 ms a write, 0.25 s is ~25 writes a tick.
        self.pass_budget_s = pass_budget_s
        self._tick_left: float | None = None  # what this tick's passes may still spend
        self._tick_wrote = False  # a pass of this tick has started a step that writes
        self.deferred = 0  # passes that stopped at the budget
        self._resume = 0  # index of the chain the next pass starts with
        # Seconds a step of each kind took lately (an exponential average; a CREATE that makes
        # its workload -- three requests -- apart from one that scales it): once a pass has
        # written, it does not start a step that would likely run past its budget.
        self._step_s: dict[tuple[ActionKind, bool], float] = {}
        self.repartitioner = repartitioner
        self.clock = clock
        self.cannot_start = cannot_start  # (model, profile) -> why its new pods can never become Ready
        self.ready_timeout_s = ready_timeout_s
        self.chains: list[Chain] = []
        self.last: ClusterState | None = None  # the snapshot the current actions were planned from
        self._by_node: tuple[ClusterState | None, dict[str, list]] = (None, {})  # its GPUs by node, built on first use

    # ------------------------------------------------------------ building chains

    def _wprofile(self, model: str | None, profile: str | None) -> str | None:
        spec = self.workloads.models.get(model or "")
        return WHOLE if spec is not None and spec.backend == "multinode" else profile

    def _split(self, actions: Sequence[Action], cluster: ClusterState) -> list[list[Action]]:
        chains: dict[int, list[Action]] = {}
        for a, g in zip(actions, chain_groups(actions, cluster)):
            chains.setdefault(g, []).append(a)
        return list(chains.values())

    def _steps(self, actions: list[Action], cluster: ClusterState) -> list[Step]:
        steps: list[Step] = []
        repart: dict[str, Step] = {}
        profiles = {r.id: r.profile for r in cluster.replicas}
        for a in actions:
            named = profiles.get(a.replica or "") if a.kind in (ActionKind.DRAIN, ActionKind.DELETE) else None
            prof = self._wprofile(a.model, a.profile or named)  # a DRAIN/DELETE may name only its replica
            last = steps[-1] if steps else None
            gpus = (a.gpu,) if a.gpu else ()
            if a.kind is ActionKind.REPARTITION:
                node = node_of(a.gpu) or ""
                step = repart.get(node)
                if step is None:
                    step = repart[node] = Step(a.kind, a.reason, node=node, gpus=gpus)
                    steps.append(step)
                else:
                    step.gpus += gpus
                step.acts.append(a)
                # a GPU given to a multinode group is a whole GPU: MIG off (None) in mig-parted's terms
                step.targets[a.gpu or ""] = None if a.profile == WHOLE else tuple(a.layout or ())
                step.layouts = _node_layouts(cluster, node, step.targets)
                continue
            same = last is not None and last.kind is a.kind and last.model == a.model and last.profile == prof
            carved = any(n in repart for n in (node_of(g) for g in gpus))
            if same and a.kind is not ActionKind.WAIT_READY:
                last.replicas += (a.replica or "",)
                last.gpus += gpus
                last.carved_first = last.carved_first or carved
                last.acts.append(a)
            elif same:
                last.acts.append(a)
            else:
                steps.append(Step(a.kind, a.reason, model=a.model, profile=prof,
                                  replicas=(a.replica or "",), gpus=gpus, carved_first=carved, acts=[a]))
        return steps

    # ------------------------------------------------------------ running

    def submit(self, actions: Sequence[Action], cluster: ClusterState) -> list[str]:
        self.last = cluster
        for group in self._split(actions, cluster):
            steps = self._steps(group, cluster)
            if steps:
                self.chains.append(Chain(steps, since=self.clock.now()))
        return self.advance()

    def reset(self) -> None:
        """Forget queued work (this replica stopped leading; the next leader re-plans from the cluster)."""
        self.chains.clear()

    def begin_tick(self) -> None:
        """The passes from here to ``end_tick`` share one write budget."""
        self._tick_left = self.pass_budget_s
        self._tick_wrote = False

    def end_tick(self) -> None:
        self._tick_left = None

    def advance(self) -> list[str]:
        """One pass over the chains: each takes every step it can now. A pass stops
        starting steps that write once it has run ``pass_budget_s``, or, once it has
        written, before a step that steps of its kind lately took longer than what is
        left (a step is not cut in the middle: one that makes a workload is three
        requests); the chains not reached keep their place (still in flight) and go
        first in the next pass, so a scale-up of a thousand actions spreads over ticks
        instead of stalling one, and a pass always starts at least one step."""
        t0 = self.clock.now()
        budget = self.pass_budget_s if self._tick_left is None else self._tick_left
        try:
            return self._pass(t0, budget)
        finally:
            if self._tick_left is not None:
                self._tick_left = max(0.0, self._tick_left - (self.clock.now() - t0))

    def _pass(self, t0: float, budget: float | None) -> list[str]:
        errors: list[str] = []
        start = self._resume % len(self.chains) if self.chains else 0
        order = self.chains[start:] + self.chains[:start]
        self._resume = 0
        wrote = self._tick_wrote if self._tick_left is not None else False  # the tick's passes share it
        for chain in order:
            while chain.steps:
                step = chain.steps[0]
                writes = step.kind is not ActionKind.WAIT_READY
                # a WAIT_READY (most steps of a scale-up) is never timed: no cache read for its key
                key = (step.kind, writes and step.kind is ActionKind.CREATE and step.model is not None
                       and step.profile is not None and self.workloads.live(step.model, step.profile) is None)
                spent = self.clock.now() - t0
                if budget is not None and writes and (
                        spent > budget or (wrote and spent + self._step_s.get(key, 0.0) > budget)):
                    self.deferred += 1
                    self._resume = self.chains.index(chain)
                    for c in order[order.index(chain):]:
                        c.why = c.why or "queued: this tick's time for API writes is spent; next tick"
                    return errors
                if chain.head != id(step):
                    chain.head, chain.since, chain.why = id(step), self.clock.now(), ""
                t1 = self.clock.now()
                try:
                    res = self._try(chain, step)
                except KubeError as exc:
                    res = f"{step.kind.value} {workload_name(step.model, step.profile) if step.model else step.node}: {exc}"
                if writes:
                    took = self.clock.now() - t1
                    self._step_s[key] = took if key not in self._step_s else 0.7 * self._step_s[key] + 0.3 * took
                    wrote = self._tick_wrote = True
                if res == WAIT:
                    break
                chain.steps.pop(0)
                if res != DONE:
                    why = res.lstrip(QUIET)
                    if not res.startswith(QUIET):
                        errors.append(res)
                    # the step's own merged actions after its first failed with it
                    errors += [f"{describe(a)} [{_name(step)}]: skipped, {why}" for a in step.acts[1:]]
                    # each action that depended on it, reported (the actuator contract)
                    errors += [f"{describe(a)} [{_name(s)}]: skipped, an earlier action of its change failed ({why})"
                               for s in chain.steps for a in s.acts]
                    chain.steps.clear()
            if not chain.steps:
                self.chains.remove(chain)
        return errors

    def _try(self, chain: Chain, step: Step) -> str:
        k = step.kind
        if k is ActionKind.REPARTITION:
            return self._repartition(chain, step)
        spec = self.workloads.models.get(step.model or "")
        if spec is not None and step.profile is None and k in (ActionKind.DRAIN, ActionKind.DELETE):
            return DONE  # it names a replica the snapshot does not show: already gone (the contract)
        if spec is None or step.profile is None:
            return f"{step.model}: not in the models config; action skipped"
        key = (spec.name, step.profile)
        if k is ActionKind.CREATE:
            missing = self.uncarved(step)
            if missing:
                return f"{describe(step.acts[0]) if step.acts else 'create ' + spec.name}: {missing}; carve it first (REPARTITION)"
            old = self.workloads.size(*key)
            n = step.n
            if step.profile != WHOLE:
                # re-applied after it took effect: a replica id the snapshot shows as a live pod of this
                # workload is that CREATE's pod, so it adds nothing (level-triggered, protocols.py)
                live = {p["metadata"]["name"] for p in self.workloads.pods_of(*key)
                        if not p["metadata"].get("deletionTimestamp")}
                n = sum(1 for r in step.replicas if r not in live)
                if n == 0:
                    chain.targets[key] = old
                    return DONE
            nodes = [node_of(g) for g in step.gpus][:n] if step.profile != WHOLE else []
            spots = [(a.gpu, a.start) if a.gpu is not None and a.start is not None else None for a in step.acts][:n]
            self.placer.place(spec.name, step.profile, nodes, spots)  # before the pods exist: the watch may be quick
            try:
                self.workloads.scale(spec, step.profile, old + n, step.reason.value)
            except KubeError:
                self.placer.unplace(spec.name, step.profile, len(nodes))
                raise
            chain.targets[key] = old + n
            return DONE
        if k is ActionKind.WAIT_READY:
            # a later chain may have scaled the workload down meanwhile: never wait for more than it has
            size = self.workloads.size(*key)
            want = min(chain.targets.get(key, size), size)
            ready = self.workloads.ready(*key)
            if ready >= want:
                return DONE
            stuck = self.cannot_start(*key)
            if stuck:
                return f"wait_ready {workload_name(*key)}: {ready}/{want} ready and {stuck}; the old replicas stay"
            if self.clock.now() - chain.since > self.ready_timeout_s:
                return f"wait_ready {workload_name(*key)}: {ready}/{want} ready after {self.ready_timeout_s:.0f}s; the old replicas stay"
            chain.why = f"waiting for {want - ready} more Ready pod(s) of {workload_name(*key)}"
            return WAIT
        if k is ActionKind.DRAIN:
            if step.profile != WHOLE:
                for pod in step.replicas:
                    self.workloads.prefer_removal(pod)
            return DONE
        if k is ActionKind.DELETE:
            n = min(step.n - step.removed, self.workloads.size(*key))
            if step.profile != WHOLE:  # a replica already gone (or going) is done: removing another would not be
                live = {p["metadata"]["name"] for p in self.workloads.pods_of(*key)
                        if not p["metadata"].get("deletionTimestamp")}
                named = sum(1 for r in step.replicas if r in live)
                # pods beyond spec.replicas (a rolling update's surge) go without a scale-down: keep
                # what the plan keeps, live pods minus the named ones
                n = min(n, named, max(0, self.workloads.size(*key) - (len(live) - named)))
            if n <= 0:
                return DONE  # nothing left to remove (an earlier step or a failover already did)
            allowed = self.workloads.disruptions_allowed(*key)
            if allowed is not None and step.profile != WHOLE:
                # the ReplicaSet removes not-Ready pods first; Ready ones only as far as the budget allows
                unready = sum(1 for p in self.workloads.pods_of(*key)
                              if not is_ready(p) and not p["metadata"].get("deletionTimestamp"))
                n = min(n, unready + allowed)
            if n <= 0:
                if self.clock.now() - chain.since > self.ready_timeout_s:
                    return f"{workload_name(*key)}: its disruption budget allowed no scale-down for {self.ready_timeout_s:.0f}s"
                chain.why = f"the disruption budget of {workload_name(*key)} allows no disruption now"
                return WAIT
            old = self.workloads.size(*key)
            self.workloads.scale(spec, step.profile, max(0, old - n), step.reason.value)
            step.removed += n
            if step.removed < step.n:  # the rest next tick, once the budget has caught up
                chain.why = f"scaling {workload_name(*key)} down {n} at a time, as its disruption budget allows"
                return WAIT
            return DONE
        return f"{k.value}: not supported on Kubernetes"

    def _repartition(self, chain: Chain, step: Step) -> str:
        node = step.node or ""
        if step.rid is None:
            if self.last is not None and all(
                    tuple(sorted(lay or ())) == tuple(sorted(self.last.gpu(g).layout)) and
                    (lay is None) == (not self.last.gpu(g).mig_enabled)
                    for g, lay in step.targets.items() if any(x.id == g for x in self.last.gpus)):
                return DONE  # the layout it already has (as far as the node's labels tell): nothing to do
            rid, err = self.repartitioner.start(node, step.layouts)
            if err:
                return err
            if rid is None:
                return DONE  # the node is already cut this way
            step.rid = rid
        result = self.repartitioner.results.get(step.rid)
        if result == "success":
            return DONE
        if result is not None:
            return f"{QUIET}repartition {node} failed"
        st = state_of(self.repartitioner.nodes.get(node))
        if (st is None or st.get("id") != step.rid) and self.clock.now() - chain.since > self.ready_timeout_s:
            return f"repartition {node}: its state left the node without an outcome"
        # (a cache that has not caught up with our own start yet shows no state: wait for it)
        chain.why = f"repartitioning {node} ({(st or {}).get('phase', 'starting')})"
        return WAIT

    def uncarved(self, step: Step) -> str | None:
        """Why a CREATE cannot run: its node has no instance of the profile (None: it has, or a REPARTITION
        of the node ran first). Pods go wherever the scheduler puts them, so the check is per node."""
        if step.profile == WHOLE or step.carved_first or self.last is None:
            return None
        for node in sorted({n for n in (node_of(g) for g in step.gpus) if n}):
            gpus = self._node_gpus(node)
            if gpus and not any(p.profile == step.profile for g in gpus for p in g.layout):
                return f"node {node} has no {step.profile} instance"
        return None

    def _node_gpus(self, node: str) -> list:
        """The last snapshot's GPUs on ``node`` (an index per snapshot: a scale-up asks for
        dozens of nodes of an 8,000-GPU snapshot a tick)."""
        if self._by_node[0] is not self.last:
            index: dict[str, list] = {}
            for g in self.last.gpus if self.last is not None else ():
                index.setdefault(g.node, []).append(g)
            self._by_node = (self.last, index)
        return self._by_node[1].get(node, [])

    # ------------------------------------------------------------ what is under way

    def busy(self) -> tuple[set[str], set[str]]:
        gpus: set[str] = set()
        models: set[str] = set()
        for chain in self.chains:
            for s in chain.steps:
                if s.kind is ActionKind.WAIT_READY:
                    # the pods it waits for exist (the snapshot shows them on their instances) unless
                    # their placements are still unclaimed (the ReplicaSet's "expectations"). Until
                    # then those instances look free, and the model looks a replica short: a plan
                    # would put a second replica on them, or add one elsewhere. Both stay held; an
                    # unclaimed placement lapses after PLACEMENT_TTL_S, so the hold is bounded.
                    if s.model and s.profile and self.placer.unclaimed(s.model, s.profile):
                        gpus.update(s.gpus)
                        models.add(s.model)
                    continue
                gpus.update(s.gpus)
                if s.model:
                    models.add(s.model)
        return gpus, models

    def waiting(self) -> dict[str, str]:
        out: dict[str, str] = {}
        for chain in self.chains:
            if chain.why:
                for s in chain.steps:
                    if s.model:
                        out.setdefault(s.model, chain.why)
        return out

    def queued(self, model: str) -> dict[str, int]:
        """Replicas of ``model`` per profile that queued steps will still add (CREATE) or remove (DELETE):
        written once the repartition or the disruption budget they wait for allows."""
        out: dict[str, int] = {}
        for chain in self.chains:
            for s in chain.steps:
                if s.model != model or s.profile is None:
                    continue
                if s.kind is ActionKind.CREATE:
                    out[s.profile] = out.get(s.profile, 0) + s.n
                elif s.kind is ActionKind.DELETE:
                    out[s.profile] = out.get(s.profile, 0) - (s.n - s.removed)
        return out

    def workload_names(self) -> set[str]:
        return {workload_name(s.model, s.profile) for c in self.chains for s in c.steps if s.model and s.profile}


def chain_groups(actions: Sequence[Action], cluster: ClusterState) -> list[int]:
    """Chain index per action: as the contract links them (``protocols.action_groups``), with
    one Kubernetes twist -- actions are linked through a *node* only when this batch
    repartitions it (the whole node is drained for mig-manager); elsewhere the scheduler, not
    the planner's GPU, decides where a pod lands, so sharing a GPU links nothing. A DRAIN or
    DELETE that names only its pod links to the pod's model, read from ``cluster``."""
    repart_nodes = {node_of(a.gpu) for a in actions if a.kind is ActionKind.REPARTITION}
    models = {r.id: r.model for r in cluster.replicas}
    keyed = [replace(a, gpu=node_of(a.gpu) if node_of(a.gpu) in repart_nodes else None,
                     model=a.model if a.model is not None else models.get(a.replica or ""))
             for a in actions]
    return action_groups(keyed, lambda _rid: None)


def _node_layouts(
    cluster: ClusterState, node: str, targets: dict[str, tuple[Placement, ...] | None]
) -> tuple[tuple[Placement, ...] | None, ...]:
    gpus = sorted((g for g in cluster.gpus if g.node == node), key=lambda g: int(g.id.rpartition("/")[2]))
    return tuple(targets[g.id] if g.id in targets else (tuple(g.layout) if g.mig_enabled else None) for g in gpus)
