"""What the local controller keeps in memory stays bounded, and a tick that raises is
logged with its traceback and counted once, in ``migscale_tick_errors_total``.
No server is started here."""

from __future__ import annotations

import logging
from pathlib import Path

from fastapi.testclient import TestClient

from autoscaler.act.local.cluster import LocalCluster
from autoscaler.act.local.replicas import ModelRuntime
from autoscaler.api.app import create_app
from autoscaler.api.state import ApiState
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
from autoscaler.policy.types import Action, ActionKind, ModelSpec, Reason
from autoscaler.protocols import ActionQueue

REPO = Path(__file__).resolve().parents[2] / "triton_models"


def _cluster(tmp_path: Path) -> LocalCluster:
    return LocalCluster(tmp_path / "run", {"m": ModelRuntime("m", REPO / "resnet", "resnet")}, [],
                        prometheus="off")


def test_the_event_log_keeps_the_last_200_and_hands_out_only_new_ones(tmp_path):
    c = _cluster(tmp_path)
    for i in range(150):
        c.log(f"event {i}")
    new, seen = c.events_since(0)
    assert len(new) == 150 and seen == 150 and new[-1].endswith("event 149")
    for i in range(150, 1000):
        c.log(f"event {i}")
    assert len(c.events) == 200 and c.events_total == 1000
    new, seen = c.events_since(seen)
    # 850 logged since, only the last 200 kept: those, oldest first, never an old one again
    assert len(new) == 200 and new[0].endswith("event 800") and new[-1].endswith("event 999")
    c.log("event 1000")
    new, seen = c.events_since(seen)
    assert [e.split(" ", 1)[1] for e in new] == ["event 1000"] and seen == 1001
    assert c.events_since(seen) == ([], 1001)


def test_the_queue_remembers_removed_replicas_up_to_its_cap_and_forgets_one_made_again():
    q = ActionQueue()
    n = q.MAX_REMOVED + 10

    def step(a, chain, now):
        return None

    q.submit([Action(ActionKind.DELETE, Reason.SCALE_DOWN_DEMAND, replica=f"r-{i}") for i in range(n)],
             lambda rid: None)
    q.run(step, 0.0)
    assert not q.superseded("r-0") and not q.superseded("r-9")  # the oldest went past the cap
    assert q.superseded("r-10") and q.superseded(f"r-{n - 1}")
    assert len(q._removed) == q.MAX_REMOVED
    q.submit([Action(ActionKind.CREATE, Reason.SCALE_UP_DEMAND, gpu="g", model="m", profile="1g.10gb",
                     start=0, replica="r-10")], lambda rid: None)
    q.run(step, 0.0)
    assert not q.superseded("r-10")  # the id names a new replica: a wait on it waits again


def test_supervisor_keeps_the_last_20_errors(tmp_path):
    c = _cluster(tmp_path)
    sup = c.supervisor
    sup.tick = lambda: (_ for _ in ()).throw(RuntimeError("pass failed"))
    sup.interval_s = 0.0
    calls = iter(range(50))
    sup._stop.is_set = lambda: next(calls, None) is None  # 50 passes, then stop
    sup._run()
    assert sup.error_count == 50 and len(sup.errors) == 20
    assert any("pass failed" in e and "Traceback" in e for e in c.events)  # the traceback, in the log


def test_a_tick_that_raises_is_logged_with_its_traceback_and_counted_once(caplog):
    spec = ModelSpec("a", capacity={"1g.10gb": 50.0}, allowed_profiles=("1g.10gb",), min_replicas=1)
    inv = FakeInventory(single_gpu_cluster())
    clock = VirtualClock(0.0)
    loop = ControlLoop(FakeMetricsSource(), inv, RecordingActuator(inv, geometry=False),
                       PolicyConfig(models=(spec,), churn_budget=None), clock, planner=stub_planner)
    driver = Driver(loop, clock, tick_s=5.0)
    state = ApiState(clock=clock, health=driver.health)
    inv.next_error = RuntimeError("inventory down")
    with caplog.at_level(logging.ERROR, logger="migscale.loop"):
        driver.step()
    rec = next(r for r in caplog.records if r.name == "migscale.loop")
    assert rec.exc_info is not None and "inventory down" in str(rec.exc_info[1])
    driver.step()  # a good tick: the count stays
    assert driver.health().tick_errors == 1
    body = TestClient(create_app(state)).get("/metrics").text
    samples = [ln for ln in body.splitlines() if "tick_errors" in ln and not ln.startswith("#")]
    assert samples == ["migscale_tick_errors_total 1.0"]  # one metric, one series
