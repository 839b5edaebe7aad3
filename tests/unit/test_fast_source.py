"""The burst layer's 1 s direct scrape: arrivals inferred from completions + queue growth."""

from __future__ import annotations

import pytest

from autoscaler.observe.fast import FastScrape, WithFast
from autoscaler.policy.types import ModelSignals


def expo(success: float, pending: float, queue_us: float, infer_us: float, failure: float = 0.0) -> str:
    return "\n".join([
        "# TYPE nv_inference_request_success counter",
        f'nv_inference_request_success{{model="resnet",version="1"}} {success}',
        "# TYPE nv_inference_request_failure counter",
        f'nv_inference_request_failure{{model="resnet",reason="REJECTED",version="1"}} {failure}',
        "# TYPE nv_inference_queue_duration_us counter",
        f'nv_inference_queue_duration_us{{model="resnet",version="1"}} {queue_us}',
        "# TYPE nv_inference_compute_infer_duration_us counter",
        f'nv_inference_compute_infer_duration_us{{model="resnet",version="1"}} {infer_us}',
        "# TYPE nv_inference_pending_request_count gauge",
        f'nv_inference_pending_request_count{{model="resnet",version="1"}} {pending}',
        "",
    ])


class Pages:
    def __init__(self) -> None:
        self.text: dict[str, str] = {}
        self.down: set[str] = set()

    def fetch(self, url: str, timeout_s: float) -> str:
        if url in self.down:
            raise ConnectionError(url)
        return self.text[url]


def test_arrivals_are_completions_plus_failures_plus_queue_growth():
    pages = Pages()
    fs = FastScrape(lambda: {"r1": ("resnet", "u1"), "r2": ("resnet", "u2")}, window_s=3.0, fetch=pages.fetch)
    pages.text = {"u1": expo(1000, 4, 0, 0), "u2": expo(500, 0, 0, 0)}
    fs.sample(100.0)
    # 3 s later: r1 completed 600 (200/s) with 1 failure and its queue grew 4 -> 154; r2 completed 150 (50/s)
    pages.text = {"u1": expo(1600, 154, 600 * 30_000, 600 * 20_000, failure=3),
                  "u2": expo(650, 0, 150 * 10_000, 150 * 20_000)}
    fs.sample(103.0)
    f = fs.signals(103.0)["resnet"]
    assert f.t_s == 103.0 and f.window_s == pytest.approx(3.0)
    assert f.completed_rps == pytest.approx(250.0)
    assert f.arrival_rps == pytest.approx(250.0 + 1.0 + 50.0)
    assert f.pending == 154
    assert f.avg_queue_ms == pytest.approx((600 * 30 + 150 * 10) / 750)
    assert f.avg_compute_ms == pytest.approx(20.0)


def test_a_replica_that_joined_inside_the_window_counts_over_the_models_span():
    # r1 serves 70 req/s, scraped every second; r2 becomes ready and is scraped at
    # 102.9 and, for the tick, at 103.0, having completed 6 requests between. Over its
    # own 0.1 s that is 60 req/s; over the model's 3 s it is 2 req/s.
    pages = Pages()
    targets = {"r1": ("resnet", "u1")}
    fs = FastScrape(lambda: targets, window_s=3.0, fetch=pages.fetch)
    for i, t in enumerate((100.0, 101.0, 102.0)):
        pages.text = {"u1": expo(70 * i, 0, 0, 0)}
        fs.sample(t)
    targets["r2"] = ("resnet", "u2")
    pages.text = {"u1": expo(70 * 2.9, 0, 0, 0), "u2": expo(10, 1, 0, 0)}
    fs.sample(102.9)
    pages.text = {"u1": expo(70 * 3, 0, 0, 0), "u2": expo(16, 0, 0, 0)}
    fs.sample(103.0)
    f = fs.signals(103.0)["resnet"]
    assert f.window_s == pytest.approx(3.0)
    assert f.completed_rps == pytest.approx(70.0 + 6 / 3.0)
    assert f.arrival_rps == pytest.approx(70.0 + 6 / 3.0 - 1 / 3.0)  # its queue fell by one
    # a model whose only scrapes are a moment apart has no rate yet, not a huge one
    solo = FastScrape(lambda: {"r2": ("resnet", "u2")}, window_s=3.0, fetch=pages.fetch)
    pages.text = {"u2": expo(10, 0, 0, 0)}
    solo.sample(200.0)
    pages.text = {"u2": expo(16, 0, 0, 0)}
    solo.sample(200.1)
    assert solo.signals(200.1) == {}


def test_no_fresh_pair_of_scrapes_means_no_fast_signals_not_zero():
    pages = Pages()
    fs = FastScrape(lambda: {"r1": ("resnet", "u1")}, window_s=3.0, stale_s=3.0, fetch=pages.fetch)
    pages.text = {"u1": expo(10, 0, 0, 0)}
    fs.sample(0.0)
    assert fs.signals(0.0) == {}  # one scrape: no rate yet
    fs.sample(1.0)
    assert "resnet" in fs.signals(1.0)
    pages.down.add("u1")
    fs.sample(2.0)
    fs.sample(9.0)
    assert fs.signals(9.0) == {}  # the replica stopped answering: stale, absent
    # idle replicas: no request in the window -> averages undefined
    pages.down.clear()
    fs.sample(10.0)
    fs.sample(11.0)
    f = fs.signals(11.0)["resnet"]
    assert f.arrival_rps == 0.0 and f.avg_queue_ms is None and f.avg_compute_ms is None


def test_with_fast_attaches_to_the_main_sources_signals_only():
    pages = Pages()
    fs = FastScrape(lambda: {"r1": ("resnet", "u1")}, window_s=3.0, fetch=pages.fetch)
    pages.text = {"u1": expo(0, 0, 0, 0)}
    fs.sample(0.0)
    pages.text = {"u1": expo(300, 0, 0, 0)}

    class Inner:
        last_notes = ("n",)

        def read(self, models, replicas, now_s):
            return {"resnet": ModelSignals(model="resnet", t_s=now_s, request_rate=80.0), "bert": None}, {}

    src = WithFast(Inner(), fs)
    sigs, _ = src.read(["resnet", "bert"], [], 2.0)
    assert sigs["bert"] is None  # blind stays blind
    assert sigs["resnet"].request_rate == 80.0
    assert sigs["resnet"].fast is not None and sigs["resnet"].fast.arrival_rps == pytest.approx(150.0)
    assert src.last_notes == ("n",)
