"""ControlLoop safety with a virtual clock and the recording fakes."""

from __future__ import annotations

import json
import threading

from autoscaler.clock import VirtualClock
from autoscaler.driver import Driver
from autoscaler.fakes import (
    FakeInventory,
    FakeMetricsSource,
    RecordingActuator,
    single_gpu_cluster,
    stub_planner,
)
from autoscaler.loop import ControlLoop
from autoscaler.policy.state import PolicyConfig
from autoscaler.policy.types import ActionKind, ModelSignals, ModelSpec, Reason, Replica, ReplicaState

PROFILE = "1g.10gb"


def spec(name):
    return ModelSpec(
        name, capacity={PROFILE: 50.0}, allowed_profiles=(PROFILE,), min_replicas=1, max_replicas=12
    )


def make_loop(a=1, b=1, log=None, **cfg):
    reps = [Replica(f"a-{i}", "a", PROFILE, "node-a/0", i, ReplicaState.READY) for i in range(a)]
    reps += [Replica(f"b-{i}", "b", PROFILE, "node-a/0", i, ReplicaState.READY) for i in range(b)]
    inv = FakeInventory(single_gpu_cluster(replicas=reps))
    act = RecordingActuator(inv, geometry=False)  # stub_planner: no MIG geometry
    src = FakeMetricsSource()
    clock = VirtualClock(0.0)
    config = PolicyConfig(models=(spec("a"), spec("b")), churn_budget=None, **cfg)
    loop = ControlLoop(src, inv, act, config, clock, decision_log=log, planner=stub_planner)
    return loop, src, inv, act, clock


def count(inv, model):
    return sum(1 for r in inv.cluster.replicas if r.model == model and r.state == ReplicaState.READY)


def run_for(loop, clock, seconds, before_tick=None):
    results = []
    end = clock.now() + seconds
    while clock.now() < end:
        if before_tick:
            before_tick(clock.now())
        r = loop.tick()
        results.append(r)
        clock.advance(r.next_delay_s)
    return results


def scale_downs(act, since=0):
    return sum(
        1 for call in act.apply_calls[since:] for x in call if x.kind in (ActionKind.DRAIN, ActionKind.DELETE)
    )


def creates(act, since=0):
    return sum(1 for call in act.apply_calls[since:] for x in call if x.kind == ActionKind.CREATE)


def test_prometheus_outage_5_minutes():
    loop, src, inv, act, clock = make_loop(a=1, b=6)
    ref, rsrc, rinv, _ract, rclock = make_loop(a=1, b=6)
    # t=0: a needs 10 replicas (400 req/s), behavior lets it reach 5; b is idle (wants 1)
    for s in (src, rsrc):
        s.set_rate("a", 400)
        s.set_rate("b", 5)
    loop.tick(), ref.tick()
    assert count(inv, "a") == 5
    clock.advance(5), rclock.advance(5)
    # outage for 5 minutes; the reference loop keeps seeing the same signals
    src.outage = True
    mark = len(act.apply_calls)
    results = run_for(loop, clock, 300)
    run_for(ref, rclock, 300)
    assert all(not r.source_ok for r in results)
    assert scale_downs(act, mark) == 0  # zero scale-downs while blind
    assert count(inv, "b") == 6
    assert creates(act, mark) == 5 and count(inv, "a") == 10  # scale-up from what was known
    assert all(Reason.HOLD_MISSING_METRICS in r.reasons["b"] for r in results)
    assert all(r.next_delay_s == loop.config.tick_s for r in results)  # an outage is not a tick error
    # recovery: one tick later the loop behaves like one that never lost its metrics
    src.outage = False
    loop.tick(), ref.tick()
    assert count(inv, "b") == count(rinv, "b") == 1
    assert count(inv, "a") == count(rinv, "a") == 10


def test_one_model_missing_holds_others_proceed():
    loop, src, inv, act, clock = make_loop(a=4, b=4)
    src.set_rate("a", None)  # a's series are absent
    src.set_rate("b", 10)
    results = run_for(loop, clock, 400)
    assert count(inv, "a") == 4
    assert count(inv, "b") == 1  # b went down after its 300 s stabilization
    assert not any(x.model == "a" for call in act.apply_calls for x in call)
    assert all(Reason.HOLD_MISSING_METRICS in r.reasons["a"] for r in results)


def test_invalid_values_are_missing_with_a_reason():
    for bad in (float("nan"), float("inf"), -3.0):
        loop, src, inv, _act, clock = make_loop(a=4, b=1)
        src.signals["a"] = ModelSignals("a", None, request_rate=bad)
        src.set_rate("b", 10)
        results = run_for(loop, clock, 400)
        assert count(inv, "a") == 4, bad
        assert Reason.INVALID_METRIC in results[-1].reasons["a"]


def test_tick_errors_are_caught_and_backed_off():
    loop, src, inv, act, _clock = make_loop()
    src.set_rate("a", 10), src.set_rate("b", 10)
    inv.next_error = RuntimeError("inventory down")
    r1 = loop.tick()
    assert not r1.ok and "inventory down" in r1.errors[0] and r1.next_delay_s == 10
    inv.next_error = RuntimeError("again")
    r2 = loop.tick()
    assert r2.next_delay_s == 20  # exponential
    r3 = loop.tick()
    assert r3.ok and r3.next_delay_s == 5  # back to normal
    # actuator raising and actuator reporting errors
    src.set_rate("a", 400)
    act.next_error = RuntimeError("boom")
    r4 = loop.tick()
    assert not r4.ok and "boom" in r4.errors[0] and r4.next_delay_s == 10
    act.next_error = "create a-9: no free slice"
    r5 = loop.tick()
    assert not r5.ok and r5.errors == ("create a-9: no free slice",) and r5.next_delay_s == 20


def test_backoff_is_capped():
    loop, _src, inv, _act, _clock = make_loop()
    loop.max_backoff_s = 60
    delays = []
    for _ in range(8):
        inv.next_error = RuntimeError("x")
        delays.append(loop.tick().next_delay_s)
    assert delays == [10, 20, 40, 60, 60, 60, 60, 60]


def test_decision_log_lines(tmp_path):
    log = tmp_path / "run" / "decisions.jsonl"
    loop, src, _inv, _act, clock = make_loop(log=log)
    src.set_rate("a", 400), src.set_rate("b", None)
    loop.tick()
    clock.advance(5)
    src.outage = True
    loop.tick()
    lines = [json.loads(x) for x in log.read_text().splitlines()]
    assert len(lines) == 2
    first = lines[0]
    assert "scale_up_demand" in first["reasons"]["a"]
    assert "panic_scale_up" in first["reasons"]["a"]  # 400 req/s >= 2 x 50
    assert "hold_missing_metrics" in first["reasons"]["b"]
    assert first["models"]["a"]["observed_rps"] == 400
    assert first["models"]["a"]["stages"][0]["name"] == "required_rps"
    assert any(x["kind"] == "create" and x["model"] == "a" for x in first["actions"])
    assert first["replan"] == "first"  # the first tick calls the planner, and says why
    assert lines[1]["source_ok"] is False
    assert any("metrics source failed" in n for n in lines[1]["notes"])


def test_run_until_stopped_with_virtual_clock():
    stop = threading.Event()
    seen = []

    def on_tick(r):
        seen.append(r.t_s)
        if len(seen) == 4:
            stop.set()

    loop, src, _inv, _act, clock = make_loop()
    loop.on_tick = on_tick
    src.set_rate("a", 10), src.set_rate("b", 10)
    Driver(loop, clock, tick_s=loop.config.tick_s).run(stop)
    assert seen == [0, 5, 10, 15]


def test_broken_on_tick_does_not_stop_the_loop():
    loop, src, _inv, _act, _clock = make_loop()
    loop.on_tick = lambda r: 1 / 0
    src.set_rate("a", 10), src.set_rate("b", 10)
    assert loop.tick().ok


def test_decision_log_rotates_one_generation(tmp_path):
    log = tmp_path / "decisions.jsonl"
    loop, src, _inv, _act, clock = make_loop(log=log)
    loop.max_log_bytes = 1  # every line starts a new file
    src.set_rate("a", 10), src.set_rate("b", 10)
    for _ in range(3):
        loop.tick()
        clock.advance(5)
    assert len(log.read_text().splitlines()) == 1
    assert json.loads(log.read_text())["t_s"] == 10
    assert json.loads((tmp_path / "decisions.jsonl.1").read_text())["t_s"] == 5


# ---------------------------------------------------------------- per-GPU / per-model gate
#
# An actuator that can say what is in flight (``in_flight() -> (gpus, models)``)
# gets the narrower gate: the loop decides every tick, the planner sees busy
# GPUs flagged (``GpuState.busy``), and only the actions linked to a busy GPU
# or model are held back -- a 180 s repartition of one GPU no longer freezes
# every model. Actuators without the hook keep the global gate tested above.


class InFlightActuator(RecordingActuator):
    def __init__(self, inventory):
        super().__init__(inventory, geometry=False)
        self.busy_gpus: set[str] = set()
        self.busy_models: set[str] = set()

    def converging(self) -> bool:  # the global answer must not matter any more
        return bool(self.busy_gpus or self.busy_models)

    def in_flight(self):
        return frozenset(self.busy_gpus), frozenset(self.busy_models)


def two_gpu_loop(home: dict[str, str] | None = None, actuator: type[InFlightActuator] | None = None):
    from autoscaler.policy.types import ClusterState, GpuState

    gpus = (GpuState("g0", "n", "A100-SXM4-80GB"), GpuState("g1", "n", "A100-SXM4-80GB"))
    reps = (Replica("a-0", "a", PROFILE, "g0", 0, ReplicaState.READY),
            Replica("b-0", "b", PROFILE, "g1", 0, ReplicaState.READY))
    inv = FakeInventory(ClusterState(gpus, reps))
    act = (actuator or InFlightActuator)(inv)
    seen = []
    home = home or {"a": "g0", "b": "g1"}  # by default each model grows on its own GPU

    def planner(models, demand, cluster, *, churn_budget=None, now_s=0.0, fast_path=True):
        seen.append(cluster)
        plan = stub_planner(models, demand, cluster, churn_budget=churn_budget, now_s=now_s)
        from dataclasses import replace as _r

        return _r(plan, actions=tuple(_r(x, gpu=home[x.model]) if x.gpu is not None and x.model else x
                                      for x in plan.actions))

    src = FakeMetricsSource()
    clock = VirtualClock(0.0)
    config = PolicyConfig(models=(spec("a"), spec("b")), churn_budget=None)
    loop = ControlLoop(src, inv, act, config, clock, planner=planner)
    return loop, src, inv, act, clock, seen


def test_busy_gpu_holds_only_the_models_on_it():
    loop, src, inv, act, clock, seen = two_gpu_loop()
    src.set_rate("a", 200), src.set_rate("b", 200)  # both want 5 replicas (200 * 1.2 / 50)
    act.busy_gpus = {"g0"}  # g0 is being repartitioned
    r = loop.tick()
    assert r.ok
    assert r.held == ("a",)
    assert r.reasons["a"][0] is Reason.HOLD_CONVERGING
    touched = {x.gpu for call in act.apply_calls for x in call}
    assert touched == {"g1"}  # b scaled on its own GPU; nothing went to the busy one
    assert count(inv, "b") > 1 and count(inv, "a") == 1
    # the planner was told which GPU is busy
    assert {g.id: g.busy for g in seen[-1].gpus} == {"g0": True, "g1": False}
    # a's scale-up did not happen, so it must not use up a's behavior budget
    assert not any(e.change for e in loop.state.scale_events.get("a", ()))
    assert any(e.change > 0 for e in loop.state.scale_events["b"])
    clock.advance(r.next_delay_s)
    act.busy_gpus = set()  # the repartition finished: a scales at the next tick
    r2 = loop.tick()
    assert r2.held == () and count(inv, "a") > 1


def test_busy_model_is_held_even_on_a_free_gpu():
    loop, src, inv, act, _clock, _ = two_gpu_loop()
    src.set_rate("a", 200), src.set_rate("b", 200)
    act.busy_models = {"b"}  # b still has queued actions the snapshot cannot show
    r = loop.tick()
    assert r.held == ("b",)
    assert count(inv, "b") == 1 and count(inv, "a") > 1


class ModelLinkedActuator(InFlightActuator):
    """Links actions through their model only, as a backend whose scheduler places pods does."""

    def groups(self, actions):
        ids: dict[str, int] = {}
        return [ids.setdefault(a.model or "", len(ids)) for a in actions]


def test_the_gate_links_actions_as_the_actuator_does():
    # both models grow on g0 and b is busy: an actuator that links through GPUs
    # holds a's chain with b's; one that links through models only holds b alone
    for actuator, held in ((InFlightActuator, ("a", "b")), (ModelLinkedActuator, ("b",))):
        loop, src, inv, act, _clock, _ = two_gpu_loop(home={"a": "g0", "b": "g0"}, actuator=actuator)
        src.set_rate("a", 200), src.set_rate("b", 200)
        act.busy_models = {"b"}
        r = loop.tick()
        assert r.held == held, actuator.__name__
        assert count(inv, "b") == 1
        assert (count(inv, "a") > 1) is (held == ("b",))


def test_hold_in_flight_drops_whole_linked_groups_and_keeps_order():
    from autoscaler.loop import hold_in_flight
    from autoscaler.policy.types import Action, ClusterState

    reps = (Replica("a-old", "a", PROFILE, "g2", 0, ReplicaState.READY),)
    cluster = ClusterState((), reps)
    acts = (
        Action(ActionKind.CREATE, Reason.PROFILE_EFFICIENCY, gpu="g1", model="a", profile=PROFILE, start=0),
        Action(ActionKind.CREATE, Reason.SCALE_UP_DEMAND, gpu="g3", model="c", profile=PROFILE, start=0),
        Action(ActionKind.WAIT_READY, Reason.PROFILE_EFFICIENCY, gpu="g1", model="a", start=0),
        Action(ActionKind.DRAIN, Reason.PROFILE_EFFICIENCY, replica="a-old"),  # linked to a through the replica
    )
    # g2 (where a's old replica drains) is busy: a's whole replacement waits,
    # so the new replica on g1 is not created without the drain it belongs to
    kept, held = hold_in_flight(acts, cluster, {"g2"}, set())
    assert kept == (acts[1],) and held == {"a"}
    kept, held = hold_in_flight(acts, cluster, set(), set())
    assert kept == acts and held == frozenset()
    kept, held = hold_in_flight(acts, cluster, set(), {"c"})
    assert kept == (acts[0], acts[2], acts[3]) and held == {"c"}
    # the actuator's own chains, when given, replace the shared-GPU-or-model links
    kept, held = hold_in_flight(acts, cluster, {"g2"}, set(), groups=[0, 1, 2, 3])
    assert kept == acts[:3] and held == {"a"}


def test_late_errors_of_queued_actions_are_reported_without_failing_the_tick(tmp_path):
    from autoscaler.policy.types import Action

    log = tmp_path / "decisions.jsonl"
    loop, src, _inv, act, _clock = make_loop(log=log)
    act.instant, act.fail_starts = False, {"a-new"}
    src.set_rate("a", 10), src.set_rate("b", 10)
    # an earlier tick's swap still queued in the actuator: its replacement will fail to start
    act.apply([Action(ActionKind.CREATE, Reason.PROFILE_EFFICIENCY, gpu="node-a/0", model="a", profile=PROFILE,
                      start=5, replica="a-new"),
               Action(ActionKind.WAIT_READY, Reason.PROFILE_EFFICIENCY, replica="a-new"),
               Action(ActionKind.DRAIN, Reason.PROFILE_EFFICIENCY, replica="a-0")])
    act.settle()
    r = loop.tick()
    assert r.ok and r.errors == () and r.next_delay_s == loop.config.tick_s  # no back-off for old work
    assert any("a-new failed to start" in e for e in r.late_errors)
    assert any("skipped" in e and "a-0" in e for e in r.late_errors)
    assert json.loads(log.read_text().splitlines()[-1])["late_errors"] == list(r.late_errors)
    assert loop.tick().late_errors == ()  # each reported once
