"""The emulated Triton exposition that a real Prometheus scrapes in benchmarks/k8s_scale.py."""

from __future__ import annotations

import time
import types

import loadprom
import pytest
from fakeapi import FakeKube
from loadprom import LoadPrometheus
from prometheus_client.parser import text_string_to_metric_families


def _pod(name: str, profile: str, ready: bool = True, ip: str | None = None) -> dict:
    status: dict = {"conditions": [{"type": "Ready", "status": "True" if ready else "False"}]}
    if ip:
        status["podIP"] = ip
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": "default",
                         "labels": {"migscale.io/model": "m", "migscale.io/profile": profile}},
            "status": status}


def _samples(text: str) -> dict[tuple[str, str], float]:
    return {(s.name, s.labels.get("pod", "")): s.value for fam in text_string_to_metric_families(text)
            for s in fam.samples if "quantile" not in s.labels}


def _ten_seconds_pass(p: LoadPrometheus) -> None:
    """The last evaluation was ten seconds ago: the next one moves the counters on by its rates."""
    p._cached = (p._cached[0] - 10.0, *p._cached[1:])


@pytest.fixture
def prom(monkeypatch):
    # the exposition's counters move on with wall time; frozen here, time passes only where a test
    # says so (``_ten_seconds_pass``), so a slow read on a loaded machine moves no expected value
    frozen = time.time()
    monkeypatch.setattr(loadprom, "time", types.SimpleNamespace(time=lambda: frozen))
    fake = FakeKube()
    for name, profile, ip in (("m-small", "1g.10gb", "10.244.0.2"), ("m-big", "3g.40gb", "10.244.0.3")):
        fake.put_object(_pod(name, profile, ip=ip))
    fake.put_object(_pod("m-starting", "1g.10gb", ready=False, ip="10.244.0.4"))
    p = LoadPrometheus(fake, {"m": {"1g.10gb": 50.0, "3g.40gb": 150.0}}, lambda t: {"m": 100.0}, window_s=30)
    try:
        yield fake, p
    finally:
        p.close()


def test_each_ready_pod_serves_its_capacity_share_and_counters_grow_with_time(prom):
    fake, p = prom
    first = _samples(p.exposition())
    assert first[("nv_inference_request_success", "m-big")] == 0  # a counter starts from 0
    assert not any(pod == "m-starting" for _n, pod in first)  # not Ready: no Triton serving yet
    _ten_seconds_pass(p)
    after = _samples(p.exposition())
    # 100 req/s offered, capacity 200: all served, 3/4 by the 3g pod and 1/4 by the 1g pod
    assert after[("nv_inference_request_success", "m-big")] == pytest.approx(750.0, rel=0.02)
    assert after[("nv_inference_request_success", "m-small")] == pytest.approx(250.0, rel=0.02)
    assert after[("nv_inference_request_failure", "m-big")] == 0
    assert after[("DCGM_FI_PROF_GR_ENGINE_ACTIVE", "m-big")] == pytest.approx(0.5)
    # a pod that is gone takes its series with it
    fake.delete_obj(fake.key_of(_pod("m-small", "1g.10gb")))
    p._cached = None
    gone = _samples(p.exposition())
    assert not any(pod == "m-small" for _n, pod in gone) and ("nv_inference_request_success", "m-big") in gone


def _p99(p: LoadPrometheus) -> float:
    q = next(k for k, n in p.names.items() if n == "p99_ms")
    rows = p.answer(q)
    return float(rows[0]["value"][1])


def test_the_p99_covers_the_summary_window_as_tritons_does(prom):
    """An overload ended by a scale-up stays in the p99 until the window has passed,
    in proportion to the requests it served; at a steady load it is the load's own."""
    _fake, p = prom
    load = {"m": 190.0}  # capacity 200: rho 0.95, a long queue
    p.load = lambda t: dict(load)
    p._cached = None
    overloaded = _p99(p)
    assert overloaded == pytest.approx(3 * (1 + 0.95**2 / 0.05) * p.compute_ms)  # the moment's own
    for model_hist in p._served.values():  # the overload was served for the last 20 s
        model_hist[-1] = (model_hist[-1][0] - 20.0, *model_hist[-1][1:])
    load["m"] = 100.0  # the scale-up's effect: rho 0.5
    p._cached = None
    after = _p99(p)
    steady = 3 * (1 + 0.5**2 / 0.5) * p.compute_ms
    assert steady < after < overloaded  # both moments' requests, the overload's 20 s weigh most
    for model_hist in p._served.values():  # the overload leaves the window
        model_hist[0] = (model_hist[0][0] - 60.0, *model_hist[0][1:])
    p._cached = None
    assert _p99(p) == pytest.approx(steady)
    p._cached = None
    text = p.exposition()
    got = {s.labels["quantile"]: s.value for fam in text_string_to_metric_families(text) for s in fam.samples
           if s.labels.get("pod") == "m-big" and "quantile" in s.labels}
    assert got["0.99"] == pytest.approx(steady * 1000.0, rel=1e-3)  # the exposition's summary: the same window
    assert got["0.5"] == pytest.approx(steady / 3 * 1000.0, rel=1e-3)


def test_the_pod_network_answers_each_ready_pod_at_its_ip_with_its_own_counters(prom):
    """A pod's own page (the fast path's scrape through the proxy) carries only its series,
    without the ``pod`` label Prometheus adds; its counters are the ones the full page shows,
    so reading a pod directly and through Prometheus never counts a request twice."""
    fake, p = prom
    assert p.pod_at("10.244.0.3") == "m-big"
    assert p.pod_at("10.244.0.4") is None  # not Ready: its Triton does not answer yet
    assert p.pod_at("10.244.9.9") is None
    p.exposition()  # every pod's counters start
    _ten_seconds_pass(p)
    own = [s for fam in text_string_to_metric_families(p.exposition("m-big")) for s in fam.samples]
    assert own and all("pod" not in s.labels for s in own)
    assert {s.name for s in own} >= {"nv_inference_request_success", "nv_inference_pending_request_count"}
    assert not any(s.name.startswith("DCGM") for s in own)  # DCGM's exporter is not the pod's Triton
    mine = next(s.value for s in own if s.name == "nv_inference_request_success")
    assert mine == pytest.approx(750.0, rel=0.02)  # its 3/4 of 100 req/s over 10 s
    full = _samples(p.exposition())
    assert full[("nv_inference_request_success", "m-big")] == mine  # not 1,500
    assert full[("nv_inference_request_success", "m-small")] == pytest.approx(250.0, rel=0.02)
    fake.delete_obj(fake.key_of(_pod("m-big", "3g.40gb")))
    p._cached = None
    assert p.pod_at("10.244.0.3") is None and p.exposition("m-big") == "\n"


def test_a_step_in_load_counts_from_the_evaluation_that_saw_it_however_seldom_a_pod_is_read(prom):
    """Counters move on at each evaluation by the rates of the one before: a pod read only
    every ten seconds (a slow round) shows the step from when it came, not as if it had
    held since that pod was last read."""
    _fake, p = prom
    load = {"m": 100.0}
    p.load = lambda t: dict(load)
    p._cached = None
    before = _samples(p.exposition())[("nv_inference_request_success", "m-big")]
    _ten_seconds_pass(p)
    p._evaluate()  # the Prometheus path reads: 10 s at 100 req/s (3/4 of it on m-big)
    load["m"] = 180.0  # the step
    _ten_seconds_pass(p)
    own = [s for fam in text_string_to_metric_families(p.exposition("m-big")) for s in fam.samples]
    mine = next(s.value for s in own if s.name == "nv_inference_request_success")
    # m-big serves 3/4: 20 s at 75 req/s until the evaluation that saw the step, then 135 req/s;
    # integrated at the read's own rate it would read 20 s at 135 req/s (2,700)
    assert mine - before == pytest.approx(1500.0, rel=0.02)
