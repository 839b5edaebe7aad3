"""ScrapeSource: Triton exposition parsing, rates, counter resets, invalid values."""

from __future__ import annotations

import http.server
import threading

import pytest

from autoscaler.observe.queries import SUMMARY_WINDOW_S
from autoscaler.observe.scrape import (
    ModelWindow,
    ReplicaWindow,
    Scrape,
    ScrapeSource,
    counter_increase,
    parse_exposition,
)


def expo(
    model="resnet",
    success=0,
    failure=None,
    queue_us=0,
    infer_us=0,
    in_us=0,
    out_us=0,
    req_us=0,
    count=None,
    execs=None,
    pending=0,
    quantiles=None,
    other_model_success=999,
):
    lines = [
        "# HELP nv_inference_request_success Number of successful inference requests",
        "# TYPE nv_inference_request_success counter",
        f'nv_inference_request_success{{model="{model}",version="1"}} {success}',
        f'nv_inference_request_success{{model="other",version="1"}} {other_model_success}',
    ]
    if failure is not None:
        lines += [
            "# TYPE nv_inference_request_failure counter",
            f'nv_inference_request_failure{{model="{model}",reason="REJECTED",version="1"}} {failure[0]}',
            f'nv_inference_request_failure{{model="{model}",reason="BACKEND",version="1"}} {failure[1]}',
        ]
    for name, v in (
        ("nv_inference_queue_duration_us", queue_us),
        ("nv_inference_compute_infer_duration_us", infer_us),
        ("nv_inference_compute_input_duration_us", in_us),
        ("nv_inference_compute_output_duration_us", out_us),
        ("nv_inference_request_duration_us", req_us),
        ("nv_inference_count", success if count is None else count),
        ("nv_inference_exec_count", success if execs is None else execs),
    ):
        lines += [f"# TYPE {name} counter", f'{name}{{model="{model}",version="1"}} {v}']
    lines += [
        "# TYPE nv_inference_pending_request_count gauge",
        f'nv_inference_pending_request_count{{model="{model}",version="1"}} {pending}',
    ]
    if quantiles:
        lines += ["# TYPE nv_inference_request_summary_us summary"]
        for q, v in quantiles.items():
            lines.append(f'nv_inference_request_summary_us{{model="{model}",version="1",quantile="{q}"}} {v}')
        lines += [
            f'nv_inference_request_summary_us_count{{model="{model}",version="1"}} {success}',
            f'nv_inference_request_summary_us_sum{{model="{model}",version="1"}} {req_us}',
        ]
    return "\n".join(lines) + "\n"


class Scripted:
    """fetch(url) returns the text set for that url (an Exception is raised)."""

    def __init__(self):
        self.texts: dict[str, object] = {}
        self.calls: list[str] = []

    def __call__(self, url, timeout_s):
        self.calls.append(url)
        t = self.texts[url]
        if isinstance(t, Exception):
            raise t
        return t


def source(targets, **kw):
    fetch = Scripted()
    src = ScrapeSource(lambda: targets, window_s=kw.pop("window_s", 10), fetch=fetch, **kw)
    return src, fetch


def test_parse_filters_model_and_sums_failure_reasons():
    sc = parse_exposition(
        expo(success=10, failure=(2, 3), pending=4, quantiles={0.99: 2500, 0.5: 800}), "resnet", 7
    )
    assert sc.t_s == 7
    assert sc.counters["nv_inference_request_success"] == 10
    assert sc.counters["nv_inference_request_failure"] == 5
    assert sc.pending == 4
    assert sc.quantiles == {0.99: 2500, 0.5: 800}


def test_counter_increase_handles_resets():
    assert counter_increase([100, 150, 20, 60]) == 110
    assert counter_increase([5, 5, 5]) == 0
    assert counter_increase([7]) == 0


def test_rates_and_averages_over_the_window():
    src, fetch = source({"r1": ("resnet", "u1")})
    fetch.texts["u1"] = expo(success=0)
    models, _ = src.read(["resnet"], ["r1"], 0.0)
    assert models["resnet"] is None  # one scrape: no rate yet, never a zero
    assert any("no replica with two scrapes" in n for n in src.last_notes)
    # 10 s later: 500 requests, 1 s of queue, 2 s of infer, 3 s end to end
    fetch.texts["u1"] = expo(
        success=500,
        failure=(5, 5),
        queue_us=1_000_000,
        infer_us=2_000_000,
        in_us=100_000,
        out_us=100_000,
        req_us=3_000_000,
        count=2000,
        execs=250,
        pending=7,
    )
    models, reps = src.read(["resnet"], ["r1"], 10.0)
    s = models["resnet"]
    assert s.t_s == 10.0
    assert s.success_rate == 50 and s.failure_rate == 1 and s.request_rate == 51
    assert s.avg_queue_ms == pytest.approx(2.0)  # 1e6 us / 500 requests
    assert s.avg_compute_ms == pytest.approx(4.4)
    assert s.queue_compute_ratio == pytest.approx(0.5)
    assert s.avg_batch == 8
    assert s.pending == 7
    assert s.p99_ms == pytest.approx(6.0) and s.latency_is_average  # no summaries: the mean, flagged
    assert s.latency_window_s is None
    assert s.ready_replicas == 1
    assert reps["r1"].busy_fraction == pytest.approx(0.2)  # 2 s of compute in 10 s


def test_a_replica_that_joined_inside_the_window_adds_its_requests_over_the_models_span():
    # r1 serves 50 req/s, read every 5 s over a 10 s window from 5 s on; r2 joins at
    # 10 s and has served 100 requests by 15 s: the model completed 500 + 100 over the
    # last 10 s, 60 req/s, not 50 + 100 / 5 = 70. Each replica's own busy fraction is
    # its own span's.
    targets = {"r1": ("resnet", "u1")}
    src, fetch = source(targets)
    fetch.texts["u1"] = expo(success=250, infer_us=2.5e6)
    src.read(["resnet"], [], 5.0)
    targets["r2"] = ("resnet", "u2")
    fetch.texts = {"u1": expo(success=500, infer_us=5e6), "u2": expo(success=0)}
    src.read(["resnet"], [], 10.0)
    fetch.texts = {"u1": expo(success=750, infer_us=7.5e6), "u2": expo(success=100, infer_us=2e6)}
    models, reps = src.read(["resnet"], [], 15.0)
    assert models["resnet"].success_rate == pytest.approx((500 + 100) / 10)
    assert reps["r1"].busy_fraction == pytest.approx(0.5) and reps["r2"].busy_fraction == pytest.approx(0.4)


def test_a_models_rate_sums_its_replicas_over_its_span_and_a_series_none_has_is_absent():
    first, last = Scrape(0.0, {}), Scrape(10.0, {})
    mw = ModelWindow(10.0, (ReplicaWindow("r1", {"success": 30.0}, first, last),
                            ReplicaWindow("r2", {"success": 10.0, "queue": 4.0}, first, last)))
    assert mw.total_rate("success") == pytest.approx(4.0)
    assert mw.total_rate("queue") == pytest.approx(0.4)  # one replica has it: that one's, over the span
    assert mw.total_rate("compute") is None  # no replica has it: missing, never 0


def test_counter_reset_between_scrapes_counts_from_zero():
    src, fetch = source({"r1": ("resnet", "u1")}, window_s=30)
    for t, n in ((0, 1000), (10, 1100), (20, 40), (30, 140)):  # restart between 10 and 20
        fetch.texts["u1"] = expo(success=n)
        models, _ = src.read(["resnet"], ["r1"], float(t))
    # increases: 100, 40 (from 0 after the reset), 100 -> 240 over 30 s
    assert models["resnet"].success_rate == pytest.approx(8.0)
    assert models["resnet"].success_rate > 0


def test_summary_quantiles_preferred():
    src, fetch = source({"r1": ("resnet", "u1"), "r2": ("resnet", "u2")})
    fetch.texts["u1"] = expo(success=0, quantiles={0.5: float("nan"), 0.99: float("nan")})
    fetch.texts["u2"] = expo(success=0)
    src.read(["resnet"], [], 0.0)
    fetch.texts["u1"] = expo(success=100, req_us=100_000, quantiles={0.5: 900, 0.95: 2000, 0.99: 4000})
    fetch.texts["u2"] = expo(success=100, req_us=100_000, quantiles={0.5: 1000, 0.95: 1500, 0.99: 5000})
    models, _ = src.read(["resnet"], [], 10.0)
    s = models["resnet"]
    assert (s.p50_ms, s.p95_ms, s.p99_ms) == (1.0, 2.0, 5.0)  # worst replica
    assert not s.latency_is_average and s.latency_window_s == SUMMARY_WINDOW_S
    assert s.request_rate == 20 and s.ready_replicas == 2


def test_invalid_values_dropped_with_reason():
    src, fetch = source({"r1": ("resnet", "u1")})
    fetch.texts["u1"] = expo(success=0, pending=-3)
    src.read(["resnet"], [], 0.0)
    # counter jumps by 1e12 in 10 s: 1e11 req/s is not a measurement; the gauge is negative
    fetch.texts["u1"] = expo(success=1e12, pending=-3, count=10, execs=0)
    models, _ = src.read(["resnet"], [], 10.0)
    s = models["resnet"]
    assert s.request_rate is None and s.success_rate is None
    assert s.pending is None
    assert s.avg_batch is None  # exec_count did not move: no batch figure, not a division by zero
    notes = " ".join(src.last_notes)
    assert "invalid_metric: success_rate above" in notes
    assert "invalid_metric: pending is negative" in notes


def test_one_replica_failing_and_all_failing():
    src, fetch = source({"r1": ("resnet", "u1"), "r2": ("resnet", "u2")})
    fetch.texts = {"u1": expo(success=0), "u2": expo(success=0)}
    src.read(["resnet"], [], 0.0)
    fetch.texts = {"u1": expo(success=100), "u2": ConnectionError("refused")}
    models, _ = src.read(["resnet"], [], 10.0)
    # r2's last scrape is from t=0, still inside the window: it has only one scrape, so r1 alone counts
    assert models["resnet"].request_rate == 10 and models["resnet"].ready_replicas == 1
    assert any("r2: scrape of u2 failed" in n for n in src.last_notes)
    fetch.texts = {"u1": ConnectionError("refused"), "u2": ConnectionError("refused")}
    with pytest.raises(ConnectionError):
        src.read(["resnet"], [], 20.0)


def test_stale_replica_and_removed_target_are_forgotten():
    targets = {"r1": ("resnet", "u1")}
    src, fetch = source(targets, metrics_stale_s=30)
    fetch.texts["u1"] = expo(success=0)
    src.read(["resnet"], [], 0.0)
    fetch.texts["u1"] = expo(success=10)
    assert src.read(["resnet"], [], 10.0)[0]["resnet"] is not None
    fetch.texts["u1"] = ConnectionError("gone")
    targets["r0"] = ("resnet", "u0")
    fetch.texts["u0"] = expo(success=0)
    # 50 s later r1's newest scrape is 40 s old (> 30 s stale): no rate from it
    assert src.read(["resnet"], [], 50.0)[0]["resnet"] is None
    del targets["r1"]
    src.read(["resnet"], [], 55.0)
    assert "r1" not in src.history


def test_garbage_exposition_is_a_failed_scrape():
    src, fetch = source({"r1": ("resnet", "u1")})
    fetch.texts["u1"] = "this is { not prometheus"
    with pytest.raises(ConnectionError):
        src.read(["resnet"], [], 0.0)
    assert any("unparseable" in n for n in src.last_notes)


def test_real_http_scrape_on_loopback():
    body = {"text": expo(success=0)}

    class H(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            data = body["text"].encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *a):
            pass

    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
    th = threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    th.start()
    try:
        url = f"http://127.0.0.1:{srv.server_address[1]}/metrics"
        src = ScrapeSource(lambda: {"r1": ("resnet", url)}, window_s=10)
        src.read(["resnet"], [], 0.0)
        body["text"] = expo(success=30)
        models, _ = src.read(["resnet"], [], 10.0)
        assert models["resnet"].request_rate == 3
    finally:
        srv.shutdown()
        srv.server_close()
        th.join(5)


def test_an_idle_window_has_a_zero_rate_but_no_latency():
    """No request in the window: 0 req/s is a measurement, a latency average is not."""
    src, fetch = source({"r1": ("resnet", "u1")})
    fetch.texts["u1"] = expo(success=100, queue_us=5000, infer_us=9000, req_us=20000)
    src.read(["resnet"], ["r1"], 0.0)
    models, _ = src.read(["resnet"], ["r1"], 10.0)  # same counters: nothing happened
    s = models["resnet"]
    assert s.request_rate == 0 and s.success_rate == 0
    assert s.avg_queue_ms is None and s.avg_compute_ms is None
    assert s.p99_ms is None and s.avg_batch is None


def test_families_the_scrape_does_not_read_are_not_parsed_or_judged():
    """Triton's GPU, CPU and memory families go unread: a malformed line among them does not
    fail the scrape (only the request families are parsed, which is most of a scrape's cost)."""
    from autoscaler.observe.scrape import parse_exposition

    text = expo(success=120) + 'nv_gpu_utilization{gpu_uuid="GPU-0"} this-is-no-number\n'
    sc = parse_exposition(text, "resnet", 5.0)
    assert sc.counters["nv_inference_request_success"] == 120
    with pytest.raises(Exception, match="unparseable"):
        parse_exposition('nv_gpu_utilization{gpu_uuid="GPU-0"} this-is-no-number\n', "resnet", 5.0)


class _Pages:
    """A loopback Triton stand-in for ``HttpFetch``: answers ``/metrics`` with keep-alive,
    records each request's client port, answers other paths 404 and ``/hang`` never."""

    def __init__(self) -> None:
        pages = self
        self.ports: list[int] = []
        self.release = threading.Event()

        class H(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            disable_nagle_algorithm = True

            def do_GET(self):
                pages.ports.append(self.client_address[1])
                if self.path == "/hang":
                    pages.release.wait(10)
                    return
                if self.path != "/metrics":
                    self.send_error(404)
                    return
                data = expo(success=7).encode()
                self.send_response(200)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *a):
                pass

        self.srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.srv.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.srv.server_address[1]}"
        self.th = threading.Thread(target=self.srv.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self.th.start()

    def close(self) -> None:
        self.release.set()
        self.srv.shutdown()
        self.srv.server_close()
        self.th.join(5)


@pytest.fixture
def pages():
    p = _Pages()
    yield p
    p.close()


def test_a_replica_is_fetched_again_over_the_connection_its_last_scrape_left_open(pages):
    from autoscaler.observe.scrape import HttpFetch

    fetch = HttpFetch()
    try:
        for _ in range(3):
            assert parse_exposition(fetch(pages.url + "/metrics", 2.0), "resnet", 0.0).counters[
                "nv_inference_request_success"] == 7
    finally:
        fetch.close()
    assert len(pages.ports) == 3 and len(set(pages.ports)) == 1


def test_a_page_other_than_200_is_a_failed_scrape_with_its_status(pages):
    from autoscaler.observe.scrape import FetchError, HttpFetch

    src = ScrapeSource(lambda: {"r1": ("resnet", pages.url + "/nothing")}, window_s=10, fetch=HttpFetch())
    with pytest.raises(ConnectionError, match="every Triton /metrics scrape failed"):
        src.read(["resnet"], [], 0.0)
    assert any("r1: scrape of" in n and "FetchError: HTTP 404" in n for n in src.last_notes)
    with pytest.raises(FetchError, match="HTTP 404"):
        HttpFetch()(pages.url + "/nothing", 2.0)


def test_a_replica_that_never_answers_ends_the_fetch_at_its_timeout(pages):
    import urllib3

    from autoscaler.observe.scrape import HttpFetch

    with pytest.raises(urllib3.exceptions.TimeoutError):
        HttpFetch()(pages.url + "/hang", 0.2)


def test_the_environments_proxy_is_not_used(pages, monkeypatch):
    """Pods reach pods directly: a proxy named in the environment (here one nothing listens
    on) is not in the way."""
    from autoscaler.observe.scrape import HttpFetch

    for var in ("HTTP_PROXY", "http_proxy", "ALL_PROXY"):
        monkeypatch.setenv(var, "http://127.0.0.1:9")
    monkeypatch.delenv("NO_PROXY", raising=False)
    monkeypatch.delenv("no_proxy", raising=False)
    assert "nv_inference_request_success" in HttpFetch()(pages.url + "/metrics", 2.0)


def test_the_connections_kept_are_bounded_by_the_file_descriptor_limit(monkeypatch):
    import resource

    from autoscaler.observe.scrape import HttpFetch

    monkeypatch.setattr(resource, "getrlimit", lambda _what: (1024, 4096))
    assert HttpFetch().hosts == 256
    monkeypatch.setattr(resource, "getrlimit", lambda _what: (1 << 20, 1 << 20))
    assert HttpFetch().hosts == 4096
    assert HttpFetch(hosts=100).hosts == 100


def test_a_host_not_fetched_for_the_idle_time_has_its_connection_closed(pages):
    """A pod that left the targets gives its socket back after ``idle_s``, not only when the
    bound on hosts pushes it out; the next fetch of it opens a new connection."""
    from autoscaler.observe.scrape import HttpFetch

    other = _Pages()
    now = [0.0]
    fetch = HttpFetch(idle_s=90.0, clock=lambda: now[0])
    try:
        fetch(pages.url + "/metrics", 2.0)
        now[0] = 60.0
        fetch(other.url + "/metrics", 2.0)
        fetch(pages.url + "/metrics", 2.0)  # 60 s idle: the same connection
        assert fetch.kept_hosts == 2 and len(set(pages.ports)) == 1
        now[0] = 160.0
        fetch(other.url + "/metrics", 2.0)  # the first host idled 100 s: closed
        assert fetch.kept_hosts == 1
        fetch(pages.url + "/metrics", 2.0)
        assert len(pages.ports) == 3 and len(set(pages.ports)) == 2
        assert len(set(other.ports)) == 1
    finally:
        fetch.close()
        other.close()
    assert fetch.kept_hosts == 0


def test_past_the_bound_the_least_recently_fetched_host_goes_first(pages):
    from autoscaler.observe.scrape import HttpFetch

    other = _Pages()
    fetch = HttpFetch()
    fetch.hosts = 1
    try:
        fetch(pages.url + "/metrics", 2.0)
        fetch(other.url + "/metrics", 2.0)
        assert fetch.kept_hosts == 1
        fetch(other.url + "/metrics", 2.0)  # kept: reused
        fetch(pages.url + "/metrics", 2.0)  # pushed out: a new connection
        assert len(set(other.ports)) == 1 and len(set(pages.ports)) == 2
    finally:
        fetch.close()
        other.close()
