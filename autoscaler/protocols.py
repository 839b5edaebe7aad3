"""The contracts at the edges of the loop: read metrics, read inventory, act.

Place in the loop: ``loop.py`` reads a ``MetricsSource`` and an ``Inventory``
and hands the plan's actions to an ``Actuator``. Each protocol has one
implementation per backend (local processes, Kubernetes, the simulator) plus a
recording fake (``autoscaler.fakes``); ``tests/contract/`` is the one suite
every actuator passes. The pure core never imports this module.

The actuator contract
=====================

An ``Action`` is a command the planner derived from a snapshot; the actuator
carries it out against the world as it is *now*. Every rule below is chosen
from how the real systems behave, and the reason stands beside it.

Chains, and never blocking
--------------------------
``apply(actions)`` splits the actions into independent **chains**: actions
linked by a shared GPU or a shared model (transitively, ``action_groups``)
form one chain and keep their order; an action that names neither links to
everything. Each chain runs until one of its actions has to wait for the
world (a replica to become ready, a drain to finish, a repartition to
complete); the rest of that chain is **queued inside the backend** and
``apply`` returns. ``apply`` never waits for convergence: it costs the
backend's own API calls, not the minutes a start or a repartition takes, so a
tick is never frozen by one slow replica (Kubernetes' controllers work the
same way: a write is accepted at once, controllers converge on their own).
Queued chains move on by themselves (the local supervisor, the simulator's
timers, a Kubernetes backend's next read) and on every later call.
Independent chains never wait for each other: one GPU's 180 s repartition does
not hold up a scale-up on another. ``groups(actions)`` answers, without acting,
how ``apply`` would split them; the loop's gate holds whole chains by it
(``loop.hold_in_flight``), so it links exactly what the backend links -- no
more (a gate that links more than the backend holds models nothing couples)
and no less (it would split a make-before-break).

What each action kind means
---------------------------
CREATE (gpu, model, profile, start[, replica])
    Start one replica on the MIG instance ``Placement(start, profile)`` of
    ``gpu`` (a multinode member: profile ``"whole"`` on a GPU with MIG off).
    **The instance must exist**: it is in the GPU's layout, or in the target
    layout of a REPARTITION of that GPU still in progress (the replica then
    starts once the repartition completes). A CREATE on an uncarved slot is an
    error and changes nothing -- NVML and the GPU Operator's mig-manager only
    let a process use a GPU instance that has been created, so carving is a
    REPARTITION, never a side effect of starting a replica
    (``docs/mig-geometry.md``). An instance still held by a replica that is
    draining or being deleted makes the CREATE wait until it is free; one held
    by a serving replica that nothing removes is an error. The new replica is
    STARTING until it passes its readiness check, then READY.
WAIT_READY (replica, or gpu/model/start filters)
    A barrier inside its chain: the actions after it wait -- inside the
    backend, across ticks -- until the named replica (without a name: every
    replica its chain created before it) is READY. If the replica fails for
    good, disappears, or is not READY within the backend's timeout
    (``wait_ready_timeout_s``), the WAIT_READY fails and **the rest of its
    chain is dropped**, each dropped action reported: a DRAIN of the replica
    being replaced never runs before its replacement serves (never break
    before make), as a Deployment's rolling update only scales the old
    ReplicaSet down once new pods are available (``docs/kubernetes-api.md``).
    A WAIT_READY on a replica that is already READY is done at once, and so
    is one on a replica that a later DRAIN or DELETE of this backend removed
    (**superseded**): a newer plan decided that replica goes, so its chain
    has nothing left to wait for and nothing failed. The Deployment
    controller does the same after a newer scale: it waits for no more pods
    than the workload now has. What the chain still holds goes on, as on a
    Kubernetes backend; the loop never supersedes a wait with make-before-break
    work behind it, because that work keeps the replica's model or GPU in
    flight and the gate holds every action on them (``in_flight()`` below).
DRAIN (replica)
    Stop routing new requests to the replica and let it finish what it holds.
    It is listed DRAINING until it goes; a backend may retire it once it is
    idle (a terminating pod leaves on its own; the local backend stops the
    drained process; the simulator keeps it until the DELETE), and a replica
    still STARTING holds no request and may go at once. Draining a replica
    that is already draining, or that no longer exists, is done (nothing left
    to route to it).
DELETE (replica)
    Remove the replica, draining it first if nobody did. The replica may go
    later (when its drain ends); the DELETE itself is done at once and the
    actions after it do not wait for it -- a CREATE on the same instance or a
    REPARTITION of it waits instead. **Deleting an unknown replica is done**,
    not an error: Kubernetes answers a delete of a missing object with 404 and
    clients that only want it gone treat that as success
    (``docs/kubernetes-api.md``); a replica that crashed away or was deleted
    by an earlier tick is already where the plan wants it.
REPARTITION (gpu, layout[, profile="whole", model])
    Set the GPU's MIG layout (``profile="whole"``: MIG off, the GPU reserved
    whole for a multinode ``model``). Instances the new layout keeps are left
    alone. An instance it removes must be empty: one whose replica is draining
    or whose DRAIN/DELETE is still queued makes the REPARTITION wait; one that
    still serves is an error and nothing changes (mig-manager destroys every
    instance it reconfigures, ``docs/gpu-operator.md``). A REPARTITION to the
    layout the GPU already has is done. While it runs the GPU is in flight.

Idempotency
-----------
Controllers are level-triggered (``docs/kubernetes-api.md``): every tick plans
from a fresh snapshot, so an action may be issued again after it took effect.
Re-applying such an action changes nothing and is not an error: a CREATE
whose replica id already exists on that very instance, a WAIT_READY on a
READY replica, a DRAIN of a draining or missing replica, a DELETE of a
missing one, a REPARTITION to the current layout.

What an error leaves behind
---------------------------
A failed action changes nothing. The actions after it **in its chain** are
skipped and each is reported (``"<kind> ...: skipped, <why>"``): they depended
on it. Independent chains go on. Nothing is retried by the backend; the next
tick re-plans from what then exists. ``apply`` returns one line per action of
*this call* that failed or was skipped before the call returned; a queued
action that fails later (a WAIT_READY timing out, a CREATE finding its
instance taken) is reported once by ``take_errors()``.

Backends whose scheduler places replicas
----------------------------------------
On Kubernetes the ReplicaSet names the pods, the scheduler and the device
plugin pick node and instance, and GPU feature discovery reports instances
per node as counts, not positions (``docs/kubernetes.md``). Such a backend
follows every rule above with these differences, and no others; the suite
checks them on it (``tests/contract/``, ``scheduler_places``):

- identity: a replica is known by the name its controller gave it (the pod),
  and the snapshot reports it under that name once the controller has made
  it (its pod appears in the watch, milliseconds after the scale write) --
  not under the CREATE's id. A CREATE is "one more replica of this model and
  profile on this GPU's node"; one whose id names a live replica of that
  workload is done (the re-applied CREATE). A DRAIN/DELETE names a replica by
  the snapshot's name and removes one replica of its workload, that one
  first (``controller.kubernetes.io/pod-deletion-cost``) among replicas as far
  along as it: the ReplicaSet removes an unscheduled, Pending or not-Ready
  pod before a Ready one whatever its cost, so a Ready replica named while
  another of its workload is still starting may stay, and the starting one
  goes instead (``docs/kubernetes.md``);
- instances: a CREATE's ``start`` is a hint. The CREATE is an error at once
  only when the node has no instance of the profile at all; when every such
  instance serves, the new replica cannot start and its WAIT_READY fails
  (reported by ``take_errors``), never taking the serving one's instance. A
  layout is reported with the right instances per profile at positions of
  the backend's own (``spread``), so layouts compare by profile counts;
- chains: actions are linked through a GPU only when the batch repartitions
  its node (elsewhere the scheduler, not the GPU, decides what a pod shares);
  actions of one model are linked as above;
- repartition: the backend drains the node itself (cordon, evict within the
  disruption budget, a surge replica elsewhere first for a model with no
  other Ready replica). A REPARTITION that would remove an instance still
  serving is not refused at once: it fails -- rolled back, reported by
  ``take_errors``, layout and serving replica unchanged -- when the serving
  replica has nowhere else to go.

``in_flight()``: per GPU and per model
--------------------------------------
``(gpus, models)`` with work under way that the snapshot cannot fully show,
which the loop must not act on again yet (``loop.hold_in_flight``):

- a GPU is in flight while it is being repartitioned, hosts a replica that is
  draining or being deleted, hosts a failed replica the backend will restart
  by itself, or is named by a queued action other than WAIT_READY;
- a model is in flight while it has a queued action other than WAIT_READY or
  a failed replica the backend will restart.

A replica that is merely STARTING is not in flight, and neither is a queued
WAIT_READY on it: it is capacity on its way, which the snapshot shows and the
policy counts. The actions queued behind a WAIT_READY (the DRAIN and DELETE
of the replica it replaces) are. Every backend answers: there is no global
"wait while anything converges" -- the loop holds only what is named here.
A Kubernetes controller that is not the leader answers from the cluster (the
Node annotations of repartitions, terminating pods) and applies nothing.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from autoscaler.policy.types import Action, ActionKind, ClusterState, ModelSignals, ReplicaSignals

InFlight = tuple[frozenset[str], frozenset[str]]  # (GPUs, models) with work under way


class MetricsSource(Protocol):
    def read(
        self, models: Sequence[str], replicas: Sequence[str], now_s: float
    ) -> tuple[Mapping[str, ModelSignals | None], Mapping[str, ReplicaSignals]]:
        """Signals per model and replica; raises on a total outage (the loop then holds)."""
        ...


class Inventory(Protocol):
    def snapshot(self) -> ClusterState: ...


class Actuator(Protocol):
    """Carries out a plan's actions under the contract in the module docstring."""

    def apply(self, actions: Sequence[Action]) -> list[str]:
        """Start the actions (chains run until they must wait); one line per action of this call
        that failed or was skipped. Never waits for convergence."""
        ...

    def in_flight(self) -> InFlight:
        """(GPUs, models) with work under way (see the module docstring)."""
        ...

    def groups(self, actions: Sequence[Action]) -> list[int]:
        """Chain index per action: how ``apply`` would link these actions (see "Chains")."""
        ...

    def take_errors(self) -> list[str]:
        """Errors of queued actions that failed or were dropped since the last call; each reported once."""
        ...


# ---------------------------------------------------------------- chains


def action_groups(
    actions: Sequence[Action], owner: Callable[[str], tuple[str, str] | None]
) -> list[int]:
    """Group index per action: actions sharing a GPU or a model are linked (transitively).

    ``owner(replica_id)`` gives (gpu, model) of a replica an action names
    without saying where it is. An action that names nothing links to every
    other (one group), so an unknown dependency is never cut.
    """
    parent: dict[str, str] = {}

    def find(x: str) -> str:
        while parent.setdefault(x, x) != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    keys: list[list[str]] = []
    for a in actions:
        gpu, model = action_keys(a, owner)
        keys.append([k for k in (gpu and f"g:{gpu}", model and f"m:{model}") if k] or ["*"])
    if any(k == ["*"] for k in keys):
        return [0] * len(actions)
    for k in keys:
        for other in k[1:]:
            parent[find(other)] = find(k[0])
    ids: dict[str, int] = {}
    return [ids.setdefault(find(k[0]), len(ids)) for k in keys]


def action_keys(a: Action, owner: Callable[[str], tuple[str, str] | None]) -> tuple[str | None, str | None]:
    """(gpu, model) an action touches: its own fields, else those of the replica it names."""
    where = owner(a.replica) if a.replica is not None else None
    gpu = a.gpu if a.gpu is not None else (where[0] if where else None)
    model = a.model if a.model is not None else (where[1] if where else None)
    return gpu, model


WAIT = "wait"  # a step function's answer: the action must wait for the world


def describe(a: Action) -> str:
    """A short name for an action in error lines: ``create resnet node-a/0@3`` / ``drain resnet-1``."""
    if a.replica is not None and a.kind is not ActionKind.CREATE:
        return f"{a.kind.value} {a.replica}"
    where = f"{a.gpu}@{a.start}" if a.start is not None else (a.gpu or "")
    return " ".join(x for x in (a.kind.value, a.model or "", where, a.replica or "") if x)


@dataclass(eq=False)
class Chain:
    """Linked actions still to run, in order, and what the chain has done so far."""

    actions: list[Action]
    created: list[str] = field(default_factory=list)  # replicas its CREATEs made (a bare WAIT_READY's targets)
    head_since: float | None = None  # when the first action left began waiting (WAIT_READY timeouts)


Step = Callable[[Action, Chain, float], "str | None"]  # None: done; WAIT; else an error line


class ActionQueue:
    """The queued chains of one backend, run by the backend's own step function.

    ``step(action, chain, now)`` carries out one action against the backend's
    world and answers None (done), ``WAIT`` (the chain stops here and is
    retried on the next ``run``) or an error line (the action changed
    nothing; the rest of its chain is skipped and reported). The queue holds
    what is common to every backend: splitting into chains, order, the
    skip-after-error rule, when each head started waiting, which errors belong
    to the caller of ``apply`` and which to ``take_errors``, and the queued
    GPUs and models for ``in_flight``.
    """

    MAX_ERRORS = 200  # unread late errors kept; older ones are dropped (counted in ``dropped``)
    # Replicas this queue removed, remembered for superseded WAIT_READYs; capped
    # like every list. A wait on a removal already forgotten is reported as a
    # replica that disappeared: an error line, never a wait passed wrongly.
    MAX_REMOVED = 4096

    def __init__(self) -> None:
        self.chains: list[Chain] = []
        self._late: list[str] = []
        self.dropped = 0
        self.last_late: list[str] = []  # late errors of the last ``run`` (the simulator keeps them all)
        self._removed: dict[str, None] = {}  # insertion-ordered: the oldest go first

    def __bool__(self) -> bool:
        return bool(self.chains)

    def submit(self, actions: Sequence[Action], owner: Callable[[str], tuple[str, str] | None]) -> list[Chain]:
        """Split ``actions`` into chains and queue them behind the chains already waiting."""
        by_group: dict[int, list[Action]] = {}
        for a, g in zip(actions, action_groups(actions, owner)):
            by_group.setdefault(g, []).append(a)
        new = [Chain(list(acts)) for acts in by_group.values()]
        self.chains.extend(new)
        return new

    def run(self, step: Step, now: float, fresh: Sequence[Chain] = ()) -> list[str]:
        """Advance every chain as far as it goes, in queue order.

        Returns the errors of the ``fresh`` chains (those of the current
        ``apply``); errors of chains queued earlier are kept for
        ``take_errors`` (and are ``last_late`` until the next run).
        """
        mine = {id(c) for c in fresh}
        errors: list[str] = []
        late: list[str] = []
        for chain in list(self.chains):
            out = errors if id(chain) in mine else late
            while chain.actions:
                if chain.head_since is None:
                    chain.head_since = now
                a = chain.actions[0]
                res = step(a, chain, now)
                if res == WAIT:
                    break
                chain.actions.pop(0)
                chain.head_since = None
                if res is None and a.replica is not None:
                    self._done(a)
                if res is not None:
                    out.append(res)
                    out.extend(f"{describe(x)}: skipped, {describe(a)} failed" for x in chain.actions)
                    chain.actions.clear()
            if not chain.actions:
                self.chains.remove(chain)
        self._keep(late)
        self.last_late = late
        return errors

    def superseded(self, rid: str) -> bool:
        """A DRAIN or DELETE of this queue removed ``rid`` (and no CREATE made it again):
        a WAIT_READY on it is done (the contract's WAIT_READY)."""
        return rid in self._removed

    def _done(self, a: Action) -> None:
        rid = a.replica
        assert rid is not None
        if a.kind in (ActionKind.DRAIN, ActionKind.DELETE):
            self._removed.pop(rid, None)
            self._removed[rid] = None
            if len(self._removed) > self.MAX_REMOVED:
                del self._removed[next(iter(self._removed))]
        elif a.kind is ActionKind.CREATE:
            self._removed.pop(rid, None)  # the id names a new replica now

    def _keep(self, late: list[str]) -> None:
        self._late.extend(late)
        over = len(self._late) - self.MAX_ERRORS
        if over > 0:
            del self._late[:over]
            self.dropped += over

    def take_errors(self) -> list[str]:
        out, self._late = self._late, []
        return out

    def report(self, errors: Sequence[str]) -> None:
        """Keep errors found outside ``run`` (a backend's own checks) for ``take_errors``."""
        self._keep(list(errors))

    def busy(self, owner: Callable[[str], tuple[str, str] | None]) -> tuple[set[str], set[str]]:
        """GPUs and models named by queued actions other than WAIT_READY (see ``in_flight``)."""
        gpus: set[str] = set()
        models: set[str] = set()
        for chain in self.chains:
            for a in chain.actions:
                if a.kind is ActionKind.WAIT_READY:
                    continue
                g, m = action_keys(a, owner)
                if g is not None:
                    gpus.add(g)
                if m is not None:
                    models.add(m)
        return gpus, models
