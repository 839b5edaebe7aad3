"""Readiness and staleness: /readyz follows the run loop, old values are absent, tick errors counted.

A picture the controller no longer refreshes must not steer the HPA: once the
published snapshot is older than ``max_age_s`` every metric value is absent
(404 Status or an empty list, never 5xx, never a frozen number), so the HPA
holds; ``/readyz`` fails while the driver has stopped, died or fallen behind.
"""

from __future__ import annotations

import threading

import pytest
from fastapi.testclient import TestClient

from autoscaler.api import ApiState, create_app
from autoscaler.api.synthetic import demo_models, demo_tick
from autoscaler.clock import VirtualClock
from autoscaler.driver import Driver

T0 = 1_800_000_000.0
CM2 = "/apis/custom.metrics.k8s.io/v1beta2"
EXT = "/apis/external.metrics.k8s.io/v1beta1"
PODS = f"{CM2}/namespaces/default/pods/*/migscale_replica_ratio"
SEL = {"labelSelector": "migscale.io/deployment=resnet-1g-10gb"}
OBJ = f"{CM2}/namespaces/default/deployments.apps/resnet-1g-10gb/migscale_desired_replicas"
NS = f"{CM2}/namespaces/default/metrics/migscale_gpus_in_use"


class _Result:
    ok = True
    next_delay_s = 5.0


class _Ticks:
    """A tickable that publishes a tick to the API each time (or raises, when told to)."""

    def __init__(self, state: ApiState, clock: VirtualClock) -> None:
        self.state, self.clock, self.fail = state, clock, False

    def tick(self) -> _Result:
        if self.fail:
            raise RuntimeError("a bug in the tick")
        obs, plan, cluster = demo_tick(self.clock.now())
        self.state.update(obs, plan, cluster, demo_models())
        return _Result()


@pytest.fixture()
def world():
    clock = VirtualClock(T0)
    state = ApiState(max_age_s=15.0, clock=clock)
    ticks = _Ticks(state, clock)
    driver = Driver(ticks, clock, tick_s=5.0, max_snapshot_age_s=15.0)
    state.health = driver.health
    return clock, state, ticks, driver, TestClient(create_app(state))


def _values_served(c: TestClient) -> dict[str, object]:
    return {
        "pods": len(c.get(PODS, params=SEL).json()["items"]),
        "object": c.get(OBJ).status_code,
        "namespace": c.get(NS).status_code,
        "external": len(c.get(f"{EXT}/namespaces/default/migscale_model_requests_per_second").json()["items"]),
    }


def test_readyz_follows_the_first_tick_the_loop_and_the_age_of_the_picture(world):
    clock, _state, _ticks, driver, c = world
    r = c.get("/readyz")
    assert r.status_code == 503 and r.json()["message"] == "no control tick published yet"
    driver.step()
    assert c.get("/readyz").status_code == 200
    clock.advance(20.0)  # no tick for 20 s > 15 s: the loop is stuck or asleep
    r = c.get("/readyz")
    assert r.status_code == 503 and r.json()["kind"] == "Status" and "old" in r.json()["message"]
    driver.step()
    assert c.get("/readyz").status_code == 200
    driver.run(lambda: True)  # returns at once: the driver has now stopped
    r = c.get("/readyz")
    assert r.status_code == 503 and r.json()["message"] == "the control loop has stopped"


def test_a_stale_picture_serves_no_values_and_a_fresh_tick_restores_them(world):
    clock, _state, _ticks, driver, c = world
    driver.step()
    assert _values_served(c) == {"pods": 1, "object": 200, "namespace": 200, "external": 2}
    assert b"migscale_desired_replicas{" in c.get("/metrics").content
    clock.advance(16.0)
    # absent everywhere: an empty list for lists, 404 Status for single values; never 5xx, never 0
    assert _values_served(c) == {"pods": 0, "object": 404, "namespace": 404, "external": 0}
    assert c.get(OBJ).json()["kind"] == "Status"
    body = c.get("/metrics").content
    assert b"migscale_desired_replicas{" not in body and b"migscale_replica_ratio{" not in body
    assert b"migscale_ready 0.0" in body
    clock.advance(1.0)
    driver.step()  # the loop comes back: values are served again, from the new tick
    assert _values_served(c) == {"pods": 1, "object": 200, "namespace": 200, "external": 2}


def test_the_stale_view_answers_repeated_queries_from_its_own_cache(world):
    clock, _state, _ticks, driver, c = world
    driver.step()
    assert c.get(PODS, params=SEL).json()["items"]  # cached in the fresh snapshot
    clock.advance(16.0)
    for _ in range(2):  # the second call is answered by the fast path's cache of the stale view
        assert c.get(PODS, params=SEL).json()["items"] == []


def test_tick_errors_are_counted_in_metrics(world):
    _clock, _state, ticks, driver, c = world
    driver.step()
    assert b"migscale_tick_errors_total 0.0" in c.get("/metrics").content
    ticks.fail = True
    driver.step()
    driver.step()
    assert b"migscale_tick_errors_total 2.0" in c.get("/metrics").content
    assert driver.health().tick_errors == 2


def test_without_a_bound_or_a_loop_the_api_behaves_as_before():
    state = ApiState()
    c = TestClient(create_app(state))
    obs, plan, cluster = demo_tick(T0)
    state.update(obs, plan, cluster, demo_models())
    assert c.get("/readyz").status_code == 200
    assert len(c.get(PODS, params=SEL).json()["items"]) == 1
    assert b"migscale_tick_errors_total" not in c.get("/metrics").content  # no loop: unknown, not 0


def test_local_controller_wires_the_driver_into_the_api(tmp_path):
    from pathlib import Path

    from autoscaler.act.local.cluster import LocalCluster
    from autoscaler.config import parse_cluster, parse_models
    from autoscaler.runtime.local import LocalController
    from autoscaler.runtime.local_setup import model_runtimes

    repo = Path(__file__).resolve().parents[2] / "triton_models"
    models = parse_models({"models": [{"name": "resnet", "model_dir": str(repo / "resnet"), "slo": {"p99_ms": 150},
                                       "profiles": ["1g.10gb"], "capacity": {"1g.10gb": 58}}]})
    cluster = parse_cluster({"gpus": [{"node": "n", "product": "A100-SXM4-80GB", "count": 1}],
                             "policy": {"tick_s": 5}, "local": {"prometheus": "off"}})
    clock = VirtualClock(T0)
    lc = LocalCluster(tmp_path, model_runtimes(models), [], prometheus="off", clock=clock)
    ctl = LocalController(lc, models, cluster, clock=clock)
    driver = ctl.build_driver()
    assert ctl.api_state.readiness() == (False, "no control tick published yet")
    driver.step()  # a real tick of the control loop, published to the API
    assert ctl.api_state.readiness() == (True, "ok")
    clock.advance(ctl.max_age_s + 1)
    assert ctl.api_state.readiness()[0] is False
    stop = threading.Event()
    stop.set()
    driver.run(stop)
    assert ctl.api_state.readiness() == (False, "the control loop has stopped")


def test_the_standalone_api_feeder_is_a_tick_of_the_one_driver():
    from autoscaler.commands.api import _Feeder
    from autoscaler.config import initial_cluster_state, parse_cluster, parse_models, policy_config
    from autoscaler.fakes import FakeMetricsSource

    models = parse_models({"models": [{"name": "resnet", "model_dir": ".", "slo": {"p99_ms": 150},
                                       "profiles": ["1g.10gb"], "capacity": {"1g.10gb": 58}}]})
    cluster = parse_cluster({"gpus": [{"node": "n", "product": "A100-SXM4-80GB", "count": 1}]})
    cfg = policy_config(models, cluster)
    src = FakeMetricsSource()
    src.set_rate("resnet", 10.0)
    down = [False]

    def snapshot():
        if down[0]:
            raise ConnectionError("API server unreachable")
        return initial_cluster_state(cluster)

    clock = VirtualClock(T0)
    state = ApiState(max_age_s=3 * cfg.tick_s, clock=clock)
    driver = Driver(_Feeder(state, cfg, src, snapshot), clock, tick_s=cfg.tick_s)
    state.health = driver.health
    driver.step()
    assert state.readiness() == (True, "ok") and driver.consecutive_failures == 0
    down[0] = True
    for _ in range(4):  # the inventory stays down: nothing new is published, the picture ages out
        clock.advance(driver.step())
    assert driver.consecutive_failures == 4 and state.readiness()[0] is False
