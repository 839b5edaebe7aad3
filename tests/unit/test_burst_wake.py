"""Ticking at once when a burst begins: ``burst.outruns`` (pure) and the local controller's
edge-triggered wake hook, on injected scrapes and a virtual clock."""

from __future__ import annotations

from dataclasses import dataclass

from test_fast_source import Pages, expo

from autoscaler.clock import VirtualClock
from autoscaler.config import load_cluster, load_models
from autoscaler.observe.fast import FastScrape
from autoscaler.policy import burst
from autoscaler.policy.types import FastSignals, ReplicaState
from autoscaler.runtime.local import LocalController


def sig(arrival: float, done: float, pending: float = 0.0) -> FastSignals:
    return FastSignals(t_s=10.0, window_s=3.0, arrival_rps=arrival, completed_rps=done, pending=pending)


def test_outruns_when_arrivals_exceed_the_capacity_serving():
    assert burst.outruns(sig(arrival=130.0, done=100.0), 10.0, capacity_rps=116.0)
    assert not burst.outruns(sig(arrival=90.0, done=90.0), 10.0, capacity_rps=116.0)
    # a backlog counts: 90 arriving + 300 queued to drain in 10 s = 120 > 116
    assert burst.outruns(sig(arrival=90.0, done=90.0, pending=300.0), 10.0, capacity_rps=116.0)


def test_nothing_known_hurries_nothing():
    assert not burst.outruns(None, 10.0, capacity_rps=116.0)  # no fast signals
    assert not burst.outruns(sig(arrival=500.0, done=100.0), 10.0, capacity_rps=None)  # no capacity figure
    assert not burst.outruns(sig(arrival=500.0, done=100.0), 30.0, capacity_rps=116.0)  # stale (20 s old)


@dataclass
class Rep:
    id: str
    model: str
    profile: str
    state: ReplicaState


class StubCluster:
    def __init__(self) -> None:
        self.reps = [Rep("r1", "resnet", "1g.10gb", ReplicaState.READY),
                     Rep("r2", "resnet", "1g.10gb", ReplicaState.STARTING)]

    def replicas(self):
        return list(self.reps)


def _seconds(tmp_path, *, tick_on_wake: bool):
    """A controller with one ready 1g resnet (58 req/s) and a starting one, on a virtual
    clock, and a function that serves one second at a given rate and asks the wake hook;
    with ``tick_on_wake`` a wake is followed by a tick at once, as the driver does."""
    (tmp_path / "m.yaml").write_text(
        "models:\n  - {name: resnet, model_dir: " + str(tmp_path) + ", slo: {p99_ms: 150},"
        " profiles: [1g.10gb], capacity: {1g.10gb: 58}}\n")
    (tmp_path / "c.yaml").write_text("gpus:\n  - {node: n0, product: A100-SXM4-80GB, count: 1, emulated: true}\n"
                                     "policy: {tick_s: 5}\n")
    clock = VirtualClock(100.0)
    ctl = LocalController(StubCluster(), load_models(tmp_path / "m.yaml"), load_cluster(tmp_path / "c.yaml"),
                          clock=clock)
    pages = Pages()
    ctl.fast = FastScrape(lambda: {"r1": ("resnet", "u1")}, window_s=3.0, fetch=pages.fetch)
    served = 0.0

    def second(rps: float) -> bool:
        nonlocal served
        served += rps
        pages.text = {"u1": expo(served, 0, 0, 0)}
        ctl.fast.sample(clock.now())
        woke = ctl.burst_began()
        if woke and tick_on_wake:
            ctl._mark_tick()
        clock.advance(1.0)
        return woke

    return second


def test_the_wake_hook_fires_once_when_a_model_starts_to_outrun_its_ready_replicas(tmp_path):
    second = _seconds(tmp_path, tick_on_wake=False)
    # 40 req/s on one ready 1g (58 req/s; the starting replica does not count): calm
    assert [second(40.0) for _ in range(4)] == [False] * 4
    # 70 req/s completed: over the 58 the ready replica is rated for; one wake, not one a second
    # (no tick follows here, so nothing re-arms it)
    assert [second(70.0) for _ in range(5)] == [False, False, True, False, False]
    # calm again, then a second burst wakes again
    assert [second(30.0) for _ in range(4)] == [False] * 4
    assert [second(90.0) for _ in range(4)] == [False, True, False, False]


def test_a_burst_the_woken_tick_left_short_wakes_again_after_half_a_tick(tmp_path):
    """The early tick can read the fast signals just under the capacity and add nothing;
    while the model keeps outrunning its replicas, the hook wakes again once half a tick
    (here 2.5 s) has passed since that tick, and no more often."""
    second = _seconds(tmp_path, tick_on_wake=True)
    assert [second(40.0) for _ in range(4)] == [False] * 4
    # the onset wakes; the burst goes on, so 3 s after that tick (the first check past
    # 2.5 s) it wakes again, and again 3 s after that: twice the 5 s cadence at most
    assert [second(70.0) for _ in range(9)] == [False, False, True, False, False, True, False, False, True]
    # calm: no wake however long since the last tick
    assert [second(30.0) for _ in range(6)] == [False] * 6


def test_wake_rule_at_the_onset_and_every_half_tick_while_short():
    """``WakeOnBurst`` alone (pure): what both controllers' wake hooks run."""
    w = burst.WakeOnBurst(tick_s=10.0)
    w.ticked(0.0)
    assert not w.began(set(), 1.0)
    assert w.began({"resnet"}, 2.0)  # onset
    assert not w.began({"resnet"}, 3.0)  # still short, only 3 s since the tick
    assert w.began({"resnet"}, 5.0)  # half a tick since the last tick
    w.ticked(5.0)
    assert not w.began({"resnet"}, 6.0)
    assert w.began({"resnet", "bert"}, 7.0)  # a second model's onset wakes at once
    assert not w.began(set(), 20.0)  # calm: never, however long since the tick


def test_ready_capacity_counts_ready_replicas_and_a_group_once():
    from autoscaler.policy.capacity import ready_capacity
    from autoscaler.policy.types import ModelSpec

    resnet = ModelSpec(name="resnet", allowed_profiles=("1g.10gb", "3g.40gb"),
                       capacity={"1g.10gb": 58.0, "3g.40gb": 160.0})
    llm = ModelSpec(name="llm", allowed_profiles=(), capacity={}, backend="multinode", group_capacity_rps=9.0)
    reps = [Rep("r1", "resnet", "1g.10gb", ReplicaState.READY), Rep("r2", "resnet", "3g.40gb", ReplicaState.READY),
            Rep("r3", "resnet", "1g.10gb", ReplicaState.STARTING),
            Rep("llm-g0-0", "llm", "7g.80gb", ReplicaState.READY), Rep("llm-g0-1", "llm", "7g.80gb", ReplicaState.READY),
            Rep("bert-1", "bert", "1g.10gb", ReplicaState.READY)]  # no spec: not counted
    assert ready_capacity([resnet, llm], reps) == {"resnet": 218.0, "llm": 9.0}
