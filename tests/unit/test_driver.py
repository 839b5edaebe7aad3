"""The one run loop (``autoscaler.driver``): cadence, back-off, hooks, stopping, health."""

from __future__ import annotations

import threading
from dataclasses import dataclass

import pytest

from autoscaler.clock import VirtualClock
from autoscaler.driver import Driver, Hooks
from autoscaler.fakes import FakeInventory, FakeMetricsSource, RecordingActuator, stub_planner
from autoscaler.loop import ControlLoop
from autoscaler.policy.state import PolicyConfig
from autoscaler.policy.types import ModelSpec


@dataclass(frozen=True)
class Outcome:
    ok: bool
    next_delay_s: float


class Scripted:
    """A tickable whose ticks succeed, fail or raise as scripted; records the clock at each tick."""

    def __init__(self, clock: VirtualClock, script: list[str], delay_s: float = 5.0, takes_s: float = 0.0) -> None:
        self.clock = clock
        self.script = list(script)
        self.delay_s = delay_s
        self.takes_s = takes_s
        self.at: list[float] = []

    def tick(self) -> Outcome:
        self.at.append(self.clock.now())
        self.clock.advance(self.takes_s)
        what = self.script.pop(0) if self.script else "ok"
        if what == "raise":
            raise RuntimeError("boom")
        return Outcome(ok=what == "ok", next_delay_s=self.delay_s if what == "ok" else 2 * self.delay_s)


def test_ticks_on_the_cadence_the_loop_asks_for() -> None:
    clock = VirtualClock()
    loop = Scripted(clock, ["ok", "fail", "ok"])
    d = Driver(loop, clock, tick_s=5.0)
    d.run(lambda: clock.now() >= 30.0)
    # ok -> 5 s, fail -> 10 s (the loop's back-off), then 5 s steps
    assert loop.at == [0.0, 5.0, 15.0, 20.0, 25.0]
    assert d.ticks == 5 and d.consecutive_failures == 0


def test_healthy_ticks_start_at_a_fixed_rate_whatever_they_take() -> None:
    clock = VirtualClock()
    loop = Scripted(clock, ["ok", "ok", "fail", "ok"], takes_s=3.0)
    d = Driver(loop, clock, tick_s=5.0, slice_s=1.0)
    d.run(lambda: len(loop.at) >= 5)
    # ok ticks start 5 s apart though each takes 3 s; the failed one (at 10, ends 13) waits its full 10 s
    assert loop.at == [0.0, 5.0, 10.0, 23.0, 28.0]


def test_a_tick_longer_than_the_cadence_leaves_one_slice_for_the_idle_hook() -> None:
    clock = VirtualClock()
    loop = Scripted(clock, [], takes_s=7.0)
    idles: list[float] = []
    d = Driver(loop, clock, tick_s=5.0, slice_s=1.0, hooks=Hooks(idle=lambda: idles.append(clock.now())))
    d.run(lambda: len(loop.at) >= 3)
    assert loop.at == [0.0, 8.0, 16.0]
    assert idles[:2] == [8.0, 16.0]


def test_the_idle_hook_knows_how_long_it_has_before_the_next_tick() -> None:
    """Ticks of 3 s on a 5 s cadence in 1 s slices: each idle call is told the seconds left
    of the wait (1, then 0: the tick is due), and nothing outside a wait."""
    clock = VirtualClock()
    loop = Scripted(clock, [], takes_s=3.0)
    told: list[float | None] = []
    d = Driver(loop, clock, tick_s=5.0, slice_s=1.0, hooks=Hooks(idle=lambda: told.append(d.time_to_tick_s)))
    d.run(lambda: len(loop.at) >= 3)
    assert told == [1.0, 0.0, 1.0, 0.0]
    assert d.time_to_tick_s is None


def test_a_raising_tick_is_counted_logged_and_backed_off(caplog: pytest.LogCaptureFixture) -> None:
    clock = VirtualClock()
    loop = Scripted(clock, ["raise", "raise", "raise", "ok"])
    d = Driver(loop, clock, tick_s=5.0, max_backoff_s=30.0)
    with caplog.at_level("ERROR", logger="migscale.driver"):
        d.run(lambda: len(loop.at) >= 5)
    # 10, 20, then capped at 30
    assert loop.at == [0.0, 10.0, 30.0, 60.0, 65.0]
    assert d.tick_errors == 3
    assert "RuntimeError: boom" in (d.last_error or "")
    assert any("Traceback" in r.exc_text for r in caplog.records if r.exc_text)


def test_hooks_run_in_order_and_a_broken_hook_is_not_fatal() -> None:
    clock = VirtualClock()
    loop = Scripted(clock, [], delay_s=2.0)
    calls: list[str] = []

    def before() -> None:
        calls.append(f"before@{clock.now():g}")

    def after(result: object) -> None:
        calls.append("after")
        raise ValueError("observer bug")

    def idle() -> None:
        calls.append(f"idle@{clock.now():g}")

    d = Driver(loop, clock, tick_s=2.0, slice_s=1.0, hooks=Hooks(before, after, idle))
    d.run(lambda: clock.now() >= 4.0)
    assert calls == ["before@0", "after", "idle@1", "idle@2", "before@2", "after", "idle@3", "idle@4"]
    assert d.hook_errors == 2 and d.tick_errors == 0


def test_stop_event_is_honoured_within_a_slice() -> None:
    clock = VirtualClock()
    loop = Scripted(clock, [], delay_s=60.0)
    stop = threading.Event()
    slept: list[float] = []

    def idle() -> None:
        slept.append(clock.now())
        if clock.now() >= 1.5:
            stop.set()

    d = Driver(loop, clock, tick_s=60.0, slice_s=0.5, hooks=Hooks(idle=idle))
    d.run(stop)
    assert slept == [0.5, 1.0, 1.5] and len(loop.at) == 1


def test_health_goes_stale_and_reports_a_stopped_loop() -> None:
    clock = VirtualClock()
    d = Driver(Scripted(clock, []), clock, tick_s=5.0, max_snapshot_age_s=12.0)
    h = d.health()
    assert not h.ready and h.reason == "no control tick completed yet"
    d.step()
    assert d.health().ready
    clock.advance(12.0)
    assert d.health().ready
    clock.advance(0.5)
    h = d.health()
    assert not h.ready and "12s old" in h.reason and h.age_s == pytest.approx(12.5)
    d.run(lambda: True)  # starts and stops at once
    h = d.health()
    assert not h.ready and h.reason == "the control loop has stopped"


def test_failed_ticks_keep_the_snapshot_age_growing() -> None:
    """A loop that only raises never refreshes its picture: it turns unready."""
    clock = VirtualClock()
    loop = Scripted(clock, ["ok"] + ["raise"] * 10)
    d = Driver(loop, clock, tick_s=5.0)  # limit 3 ticks = 15 s
    d.run(lambda: clock.now() >= 40.0)
    h = d.health()
    assert h.last_tick_s == 0.0 and not h.ready and h.consecutive_failures >= 2


def test_drives_the_production_control_loop_on_a_virtual_clock() -> None:
    clock = VirtualClock()
    src = FakeMetricsSource()
    src.set_rate("m", 30.0)
    inv = FakeInventory()
    act = RecordingActuator(inv, geometry=False)  # stub_planner places without MIG geometry
    spec = ModelSpec("m", {"1g.10gb": 10.0}, ("1g.10gb",), min_replicas=1, max_replicas=8)
    cfg = PolicyConfig(models=(spec,), slo_p99_ms={"m": 100.0}, tick_s=5.0)
    loop = ControlLoop(src, inv, act, cfg, clock, planner=stub_planner)
    d = Driver(loop, clock, tick_s=cfg.tick_s)
    d.run(lambda: clock.now() >= 60.0)
    assert d.ticks == 12 and d.tick_errors == 0 and d.health().last_tick_s == 55.0
    assert len([r for r in inv.cluster.replicas if r.model == "m"]) >= 3


def test_wake_ends_a_healthy_wait_but_never_a_back_off() -> None:
    clock = VirtualClock()
    loop = Scripted(clock, ["ok", "fail", "ok"], delay_s=5.0)
    asked: list[float] = []

    def wake() -> bool:
        asked.append(clock.now())
        return clock.now() in (2.0, 6.0, 8.0)  # a burst seen 2 s after the first tick; more during the back-off

    d = Driver(loop, clock, tick_s=5.0, slice_s=1.0, hooks=Hooks(wake=wake))
    d.run(lambda: len(loop.at) >= 4)
    # tick at 0, woken at 2 (fails), the 10 s back-off is not cut short at 6 or 8, then 5 s again
    assert loop.at == [0.0, 2.0, 12.0, 17.0]
    assert d.early_ticks == 1 and not {6.0, 8.0} & set(asked)  # not even asked while backing off


def test_a_raising_wake_hook_is_counted_and_the_cadence_kept() -> None:
    clock = VirtualClock()
    loop = Scripted(clock, [])

    def wake() -> bool:
        raise RuntimeError("scrape bug")

    d = Driver(loop, clock, tick_s=5.0, slice_s=1.0, hooks=Hooks(wake=wake))
    d.run(lambda: len(loop.at) >= 3)
    assert loop.at == [0.0, 5.0, 10.0]
    assert d.hook_errors == 10 and d.early_ticks == 0


def test_the_idle_hooks_time_counts_against_the_wait() -> None:
    """A round of 0.8 s in the idle hook of a 2 s cadence (ticks take 0.3 s) is absorbed by
    the wait: ticks still start every 2 s, not 2.8 s, and the hook is told what is left
    after the time it took."""
    clock = VirtualClock()
    loop = Scripted(clock, [], delay_s=2.0, takes_s=0.3)
    told: list[float] = []
    rounds: list[float] = []

    def idle() -> None:
        told.append(round(d.time_to_tick_s, 6))
        if not rounds or clock.now() - rounds[-1] >= 1.9:  # one round a period
            rounds.append(clock.now())
            clock.advance(0.8)

    d = Driver(loop, clock, tick_s=2.0, slice_s=0.5, hooks=Hooks(idle=idle))
    d.run(lambda: len(loop.at) >= 4)
    assert loop.at == pytest.approx([0.0, 2.0, 4.0, 6.0])
    # after the first slice 1.2 s were left; the round took 0.8 of them, and the wait's last
    # 0.4 s slice ends on the tick
    assert told[:3] == [1.2, 0.0, 1.2]
