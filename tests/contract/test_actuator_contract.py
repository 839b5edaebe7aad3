"""The actuator contract (``autoscaler/protocols.py``), one suite for every backend.

Each test runs once per harness in ``conftest.HARNESSES`` (the simulator, the
recording fake, the local cluster on fake processes, the Kubernetes backend on
the emulated control plane); the ``make`` fixture builds the backend on the
world the test describes. The assertions read only what the contract
promises: ``apply``'s and ``take_errors``' lines, the snapshot, ``groups()``,
``in_flight()``. Where the contract lets a backend whose scheduler places
replicas do otherwise (``protocols.py``), the test asserts that alternative
for it (``h.scheduler_places``) -- never nothing.
"""

from __future__ import annotations

import time
from collections import Counter

from autoscaler.mig import Placement
from autoscaler.policy.types import Action, ActionKind, GpuState, Reason, Replica, ReplicaState

R = Reason.SCALE_UP_DEMAND
P1, P2, P3 = "1g.10gb", "2g.20gb", "3g.40gb"
LAYOUT = (Placement(0, P1), Placement(1, P1), Placement(2, P2), Placement(4, P3))


def gpus(layout0=LAYOUT, layout1=()):
    return [GpuState("g0", "node", "A100-SXM4-80GB", layout=tuple(layout0)),
            GpuState("g1", "node", "A100-SXM4-80GB", layout=tuple(layout1))]


def ready(rid, model, profile, gpu, start):
    return Replica(rid, model, profile, gpu, start, ReplicaState.READY, 0.0)


def create(rid, model, profile, gpu, start):
    return Action(ActionKind.CREATE, R, gpu=gpu, model=model, profile=profile, start=start, replica=rid)


def wait(rid, model, gpu, start, profile=P1):
    return Action(ActionKind.WAIT_READY, R, gpu=gpu, model=model, profile=profile, start=start, replica=rid)


def drain(rid, model, gpu):
    return Action(ActionKind.DRAIN, Reason.SCALE_DOWN_DEMAND, gpu=gpu, model=model, replica=rid)


def delete(rid, model, gpu):
    return Action(ActionKind.DELETE, Reason.SCALE_DOWN_DEMAND, gpu=gpu, model=model, replica=rid)


def repartition(gpu, layout):
    return Action(ActionKind.REPARTITION, Reason.REPARTITION, gpu=gpu, layout=tuple(layout))


def until_shown(h, rid, timeout_s=10.0):
    """Snapshots until one shows ``rid`` (a created replica's pod reaches the cache in ms on Kubernetes)."""
    deadline = time.monotonic() + timeout_s
    while not any(r.id == rid for r in h.snapshot().replicas):
        assert time.monotonic() < deadline, f"{rid} never shown"
        time.sleep(0.02)


def same_layout(h, gpu, target):
    """The GPU's layout is ``target``: exactly, or (scheduler_places) the same instances per profile."""
    if h.scheduler_places:
        return Counter(p.profile for p in h.layout(gpu)) == Counter(p.profile for p in target)
    return h.layout(gpu) == tuple(sorted(target))


# ---------------------------------------------------------------- CREATE


def test_create_starts_a_replica_on_a_carved_instance(make):
    h = make(gpus())
    assert h.apply([create("m-0", "m", P2, "g0", 2), wait("m-0", "m", "g0", 2, P2)]) == []
    h.settle()
    r = h.replica("m-0")
    assert r is not None and (r.gpu, r.start, r.profile, r.state) == ("g0", 2, P2, ReplicaState.READY)
    assert h.late_errors() == []


def test_create_on_an_uncarved_slot_is_an_error_and_changes_nothing(make):
    h = make(gpus())  # g1 has no instance at all
    errs = h.apply([create("m-0", "m", P1, "g1", 0)])
    assert len(errs) == 1 and "create" in errs[0]
    h.settle()
    assert h.replica("m-0") is None and h.layout("g1") == ()


def test_create_on_a_serving_instance_is_an_error(make):
    h = make(gpus(), [ready("n-0", "n", P3, "g0", 4)])  # g0's only 3g instance serves n
    errs = h.apply([create("m-0", "m", P3, "g0", 4), wait("m-0", "m", "g0", 4, P3)])
    h.settle()
    late = h.late_errors()
    if h.scheduler_places:
        # the CREATE is accepted; its replica finds no free 3g instance and its WAIT_READY fails
        assert errs == [] and any("wait_ready" in e for e in late), late
        m = h.replica("m-0")
        assert m is None or m.state is not ReplicaState.READY
    else:
        assert len(errs) == 2 and "create" in errs[0] and "skipped" in errs[1]  # the WAIT_READY depended on it
        assert h.replica("m-0") is None
    n = h.replica("n-0")
    assert (n.state, n.gpu, n.profile) == (ReplicaState.READY, "g0", P3)  # never its instance taken


def test_create_waits_for_an_instance_being_freed(make):
    h = make(gpus(), [ready("n-0", "n", P1, "g0", 0)])
    acts = [drain("n-0", "n", "g0"), delete("n-0", "n", "g0"), create("m-0", "m", P1, "g0", 0)]
    assert h.apply(acts) == []
    h.settle()
    assert h.replica("n-0") is None
    assert h.replica("m-0").state is ReplicaState.READY and h.late_errors() == []


# ---------------------------------------------------------------- WAIT_READY: never break before make


def test_wait_ready_holds_the_rest_of_its_chain_until_the_replacement_serves(make):
    h = make(gpus(), [ready("m-old", "m", P1, "g0", 0)])
    swap = [create("m-new", "m", P2, "g0", 2), wait("m-new", "m", "g0", 2, P2),
            drain("m-old", "m", "g0"), delete("m-old", "m", "g0")]
    assert h.apply(swap) == []  # returns at once: nothing blocks inside apply
    new, old = h.replica("m-new"), h.replica("m-old")
    assert new is not None or h.scheduler_places  # a controller-named replica shows once its controller made it
    if new is None or new.state is not ReplicaState.READY:
        # the WAIT_READY is state carried across ticks: the old replica still
        # serves, and the queued DRAIN/DELETE make their GPU and model busy
        assert old is not None and old.state is ReplicaState.READY
        gpus_busy, models_busy = h.act.in_flight()
        assert "m" in models_busy and "g0" in gpus_busy
    h.settle()
    assert h.replica("m-new").state is ReplicaState.READY
    assert h.replica("m-old") is None
    assert h.late_errors() == []
    assert h.act.in_flight() == (frozenset(), frozenset())


def test_a_failed_start_drops_the_rest_of_the_chain_and_reports_it(make):
    h = make(gpus(), [ready("m-old", "m", P1, "g0", 0)])
    h.fail_starts("m-new")
    swap = [create("m-new", "m", P2, "g0", 2), wait("m-new", "m", "g0", 2, P2),
            drain("m-old", "m", "g0"), delete("m-old", "m", "g0")]
    h.apply(swap)
    h.settle()
    h.late_errors()
    old = h.replica("m-old")
    assert old is not None and old.state is ReplicaState.READY  # never break before make
    assert any("wait_ready" in e for e in h.errors_seen)
    skipped = [e for e in h.errors_seen if "skipped" in e]
    assert len(skipped) == 2 and all("m-old" in e for e in skipped)  # the DRAIN and the DELETE
    assert h.act.in_flight()[1] == frozenset()  # nothing of m is queued any more


def test_a_wait_on_a_replica_a_later_plan_removed_is_done(make):
    # The first batch's chain waits for m-1, then m-0, then removes n-0; before it
    # gets there a later batch removes m-0. Its WAIT_READY is superseded, not
    # failed: no error, and the rest of its chain goes on.
    h = make(gpus(), [ready("n-0", "n", P3, "g0", 4)])
    first = [create("m-0", "m", P1, "g0", 0), create("m-1", "m", P1, "g0", 1),
             wait("m-1", "m", "g0", 1), wait("m-0", "m", "g0", 0),
             drain("n-0", "n", "g0"), delete("n-0", "n", "g0")]
    assert h.apply(first) == []
    # the later plan is made from a snapshot that shows m-0 (a plan names only replicas it saw)
    until_shown(h, "m-0")
    assert h.apply([drain("m-0", "m", "g0"), delete("m-0", "m", "g0")]) == []
    h.settle()
    h.late_errors()
    assert h.errors_seen == []
    left = [(r.id, r.state) for r in h.snapshot().replicas]
    if h.scheduler_places:
        # the ReplicaSet removes a pod still Pending or not Ready before the named one, which
        # may have become Ready first (the contract): one replica of m stays, and it serves
        assert len(left) == 1 and left[0][0] in ("m-0", "m-1") and left[0][1] is ReplicaState.READY, left
    else:
        assert left == [("m-1", ReplicaState.READY)]


def test_a_replica_only_starting_is_not_in_flight(make):
    h = make(gpus())
    h.apply([create("m-0", "m", P1, "g0", 1), wait("m-0", "m", "g0", 1)])
    assert h.act.in_flight() == (frozenset(), frozenset())  # capacity on its way, not work in flight
    h.settle()


# ---------------------------------------------------------------- errors and chains


def test_an_error_skips_the_rest_of_its_chain_only(make):
    h = make(gpus())
    acts = [create("m-0", "m", P1, "g1", 0),  # uncarved: fails
            create("m-1", "m", P1, "g0", 1),  # same model: same chain, skipped
            create("n-0", "n", P3, "g0", 4)]  # shares g0 with m-1: same chain too
    g = h.act.groups(acts)  # asked before acting: the split apply is about to make
    errs = h.apply(acts)
    h.settle()
    if h.scheduler_places:  # g0 is not repartitioned here: sharing it links nothing, n goes on
        assert len(errs) == 2 and "skipped" in errs[1] and "m-1" in errs[1]
        assert [r.id for r in h.snapshot().replicas] == ["n-0"]
        assert g[0] == g[1] != g[2]
        return
    assert len(errs) == 3 and sum("skipped" in e for e in errs) == 2
    assert g[0] == g[1] == g[2]
    assert [r.id for r in h.snapshot().replicas] == []


def test_independent_chains_go_on(make):
    h = make(gpus(layout1=(Placement(0, P3),)))
    acts = [create("m-0", "m", P1, "g1", 4),  # m on g1: no such instance
            create("n-0", "n", P3, "g0", 4), wait("n-0", "n", "g0", 4, P3)]  # n on g0: unrelated
    errs = h.apply(acts)
    assert len(errs) == 1 and "m" in errs[0]
    h.settle()
    assert h.replica("n-0").state is ReplicaState.READY and h.replica("m-0") is None


# ---------------------------------------------------------------- DRAIN / DELETE


def test_delete_and_drain_of_an_unknown_replica_are_done(make):
    h = make(gpus())
    assert h.apply([drain("ghost", "m", "g0"), delete("ghost", "m", "g0")]) == []
    h.settle()
    assert h.late_errors() == []


def test_drain_then_delete_removes_the_replica(make):
    h = make(gpus(), [ready("m-0", "m", P1, "g0", 0), ready("m-1", "m", P1, "g0", 1)])
    assert h.apply([drain("m-1", "m", "g0"), delete("m-1", "m", "g0")]) == []
    h.settle()
    assert [r.id for r in h.snapshot().replicas] == ["m-0"]
    assert Placement(1, P1) in h.layout("g0")  # the instance outlives its replica


# ---------------------------------------------------------------- REPARTITION


def test_repartition_refuses_an_instance_that_still_serves(make):
    h = make(gpus(), [ready("m-0", "m", P3, "g0", 4)])
    errs = h.apply([repartition("g0", (Placement(0, P1), Placement(4, P2)))])
    assert len(errs) == (0 if h.scheduler_places else 1)
    h.settle()
    errs += h.late_errors()  # a backend that drains the node itself fails it later: m-0 has nowhere to go
    assert len(errs) == 1 and "g0" in errs[0], errs
    assert h.layout("g0") == tuple(sorted(LAYOUT)) and h.replica("m-0").state is ReplicaState.READY


def test_repartition_waits_for_the_drain_of_the_instances_it_removes(make):
    h = make(gpus(), [ready("m-0", "m", P3, "g0", 4)])
    target = (Placement(0, P1), Placement(1, P1), Placement(2, P2), Placement(4, P2), Placement(6, P1))
    acts = [drain("m-0", "m", "g0"), delete("m-0", "m", "g0"), repartition("g0", target),
            create("m-1", "m", P2, "g0", 4), wait("m-1", "m", "g0", 4, P2)]
    assert h.apply(acts) == []
    h.settle()
    assert same_layout(h, "g0", target), h.layout("g0")
    assert h.replica("m-0") is None and h.replica("m-1").state is ReplicaState.READY
    assert h.late_errors() == []


# ---------------------------------------------------------------- idempotency


def test_reapplying_actions_that_took_effect_changes_nothing(make):
    h = make(gpus())
    acts = [create("m-0", "m", P1, "g0", 0), wait("m-0", "m", "g0", 0)]
    assert h.apply(acts) == []
    h.settle()
    assert h.apply(acts) == []  # the same CREATE again: its replica exists on that instance
    assert h.apply([repartition("g0", LAYOUT)]) == []  # the layout it already has
    h.settle()
    assert [r.id for r in h.snapshot().replicas] == ["m-0"] and h.late_errors() == []
    assert h.apply([drain("m-0", "m", "g0"), delete("m-0", "m", "g0")]) == []
    h.settle()
    assert h.apply([delete("m-0", "m", "g0")]) == []  # deleted twice
    assert h.snapshot().replicas == ()
