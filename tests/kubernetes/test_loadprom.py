"""The emulated Triton exposition that a real Prometheus scrapes in benchmarks/k8s_scale.py."""

from __future__ import annotations

import pytest
from fakeapi import FakeKube
from loadprom import LoadPrometheus
from prometheus_client.parser import text_string_to_metric_families


def _pod(name: str, profile: str, ready: bool = True) -> dict:
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": "default",
                         "labels": {"migscale.io/model": "m", "migscale.io/profile": profile}},
            "status": {"conditions": [{"type": "Ready", "status": "True" if ready else "False"}]}}


def _samples(text: str) -> dict[tuple[str, str], float]:
    return {(s.name, s.labels.get("pod", "")): s.value for fam in text_string_to_metric_families(text)
            for s in fam.samples if "quantile" not in s.labels}


@pytest.fixture
def prom():
    fake = FakeKube()
    for name, profile in (("m-small", "1g.10gb"), ("m-big", "3g.40gb")):
        fake.put_object(_pod(name, profile))
    fake.put_object(_pod("m-starting", "1g.10gb", ready=False))
    p = LoadPrometheus(fake, {"m": {"1g.10gb": 50.0, "3g.40gb": 150.0}}, lambda t: {"m": 100.0}, window_s=30)
    try:
        yield fake, p
    finally:
        p.close()


def test_each_ready_pod_serves_its_capacity_share_and_counters_grow_with_time(prom):
    fake, p = prom
    first = _samples(p.exposition())
    assert first[("nv_inference_request_success", "m-big")] == 0  # a counter starts at 0 at its first scrape
    assert not any(pod == "m-starting" for _n, pod in first)  # not Ready: no Triton serving yet
    p._scraped_at -= 10.0  # ten seconds pass between scrapes
    p._cached = None
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
