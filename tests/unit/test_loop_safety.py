"""ControlLoop safety with a virtual clock and the recording fakes."""

from __future__ import annotations

import json
import threading

from autoscaler.clock import VirtualClock
from autoscaler.fakes import (
    FakeInventory,
    FakeMetricsSource,
    RecordingActuator,
    single_gpu_cluster,
    stub_planner,
)
from autoscaler.loop import ControlLoop
from autoscaler.policy.decide import PolicyConfig
from autoscaler.policy.types import ActionKind, ModelSignals, ModelSpec, Reason, Replica, ReplicaState

PROFILE = "1g.10gb"


def spec(name):
    return ModelSpec(
        name, capacity={PROFILE: 50.0}, allowed_profiles=(PROFILE,), min_replicas=1, max_replicas=12
    )


def make_loop(a=1, b=1, log=None, converge_calls=0, **cfg):
    reps = [Replica(f"a-{i}", "a", PROFILE, "node-a/0", i, ReplicaState.READY) for i in range(a)]
    reps += [Replica(f"b-{i}", "b", PROFILE, "node-a/0", i, ReplicaState.READY) for i in range(b)]
    inv = FakeInventory(single_gpu_cluster(replicas=reps))
    act = RecordingActuator(inv, converge_calls=converge_calls)
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
    assert all(Reason.HOLD_MISSING_METRICS in r.reasons["b"] for r in results if not r.gated)
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


def test_converging_gate_only_observes():
    loop, src, _inv, act, _clock = make_loop(converge_calls=2)
    src.set_rate("a", 400), src.set_rate("b", 40)
    r = loop.tick()
    assert not r.gated and len(act.apply_calls) == 1
    g1, g2 = loop.tick(), loop.tick()
    assert g1.gated and g2.gated and len(act.apply_calls) == 1
    assert g1.reasons["a"] == (Reason.HOLD_CONVERGING,)
    assert len(loop.state.demand["a"]) == 3  # windows kept current while gated
    r = loop.tick()
    assert not r.gated


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
    assert lines[1]["source_ok"] is False
    assert any("metrics source failed" in n for n in lines[1]["notes"])


def test_run_until_stopped_with_virtual_clock():
    stop = threading.Event()
    seen = []

    def on_tick(r):
        seen.append(r.t_s)
        if len(seen) == 4:
            stop.set()

    loop, src, _inv, _act, _clock = make_loop()
    loop.on_tick = on_tick
    src.set_rate("a", 10), src.set_rate("b", 10)
    loop.run(stop)
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
