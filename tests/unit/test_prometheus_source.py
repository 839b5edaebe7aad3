"""PrometheusSource against a tiny fake Prometheus HTTP API on 127.0.0.1."""

from __future__ import annotations

import http.server
import json
import socket
import threading
import time
import urllib.parse

import pytest

from autoscaler.observe.prometheus import PREFETCH_MAX_AGE_S, PrometheusSource, PrometheusUnavailable
from autoscaler.observe.queries import SUMMARY_WINDOW_S, Queries, promql_duration

NOW = 1_700_000_000.0
W = 30.0
Q = Queries()


class FakePrometheus:
    """Answers /api/v1/query from ``answers``: rendered query -> result list, or an int HTTP status."""

    def __init__(self):
        self.answers: dict[str, object] = {}
        self.default: object = []
        self.queries: list[str] = []
        owner = self

        class H(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                u = urllib.parse.urlparse(self.path)
                if u.path != "/api/v1/query":
                    self.send_error(404)
                    return
                q = urllib.parse.parse_qs(u.query).get("query", [""])[0]
                owner.queries.append(q)
                ans = owner.answers.get(q, owner.default)
                if isinstance(ans, int):
                    body = json.dumps({"status": "error", "error": "boom"}).encode()
                    self.send_response(ans)
                else:
                    body = json.dumps(
                        {"status": "success", "data": {"resultType": "vector", "result": ans}}
                    ).encode()
                    self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *a):
                pass

        self.srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.url = f"http://127.0.0.1:{self.srv.server_address[1]}"
        self.th = threading.Thread(target=self.srv.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)

    def set(self, name, rows):
        """rows: [(labels, value)] evaluated at NOW."""
        self.answers[Q.render(name, W)] = [{"metric": lab, "value": [NOW, str(v)]} for lab, v in rows]


@pytest.fixture
def prom():
    p = FakePrometheus()
    p.th.start()
    try:
        yield p
    finally:
        p.srv.shutdown()
        p.srv.server_close()
        p.th.join(5)


def healthy(p, model="resnet", t=NOW - 3):
    m = {"model": model}
    p.set("request_rate", [(m, 120.5)])
    p.set("success_rate", [(m, 120.0)])
    p.set("failure_rate", [(m, 0.5)])
    p.set("avg_queue_ms", [(m, 2.5)])
    p.set("avg_compute_ms", [(m, 4.0)])
    p.set("queue_compute_ratio", [(m, 0.6)])
    p.set("p50_ms", [(m, 5.0)])
    p.set("p95_ms", [(m, 9.0)])
    p.set("p99_ms", [(m, 12.0)])
    p.set("avg_request_ms", [(m, 6.0)])
    p.set("pending", [(m, 3)])
    p.set("avg_batch", [(m, 4.0)])
    p.set("ready_replicas", [(m, 2)])
    p.set("sample_time", [(m, t)])
    p.set(
        "busy_fraction",
        [({"model": model, "replica": "resnet-1"}, 0.45), ({"model": model, "replica": "resnet-2"}, 0.55)],
    )
    p.set(
        "replica_sample_time",
        [({"model": model, "replica": "resnet-1"}, t), ({"model": model, "replica": "resnet-2"}, t)],
    )
    p.set("gr_engine_active", [({"pod": "resnet-1"}, 0.4), ({"pod": "unrelated"}, 0.9)])


def src(p, **kw):
    return PrometheusSource(p.url, window_s=W, metrics_stale_s=60, timeout_s=2, **kw)


def test_reads_every_signal_with_sample_time(prom):
    healthy(prom)
    models, reps = src(prom).read(["resnet"], ["resnet-1", "resnet-2"], NOW)
    s = models["resnet"]
    assert s.t_s == NOW - 3
    assert (s.request_rate, s.success_rate, s.failure_rate) == (120.5, 120.0, 0.5)
    assert (s.avg_queue_ms, s.avg_compute_ms, s.queue_compute_ratio) == (2.5, 4.0, 0.6)
    assert (s.p50_ms, s.p95_ms, s.p99_ms, s.latency_is_average) == (5.0, 9.0, 12.0, False)
    assert s.latency_window_s == SUMMARY_WINDOW_S  # a summary's quantiles reach a minute back
    assert (s.pending, s.avg_batch, s.ready_replicas) == (3, 4.0, 2)
    assert reps["resnet-1"].busy_fraction == 0.45 and reps["resnet-1"].gr_engine_active == 0.4
    assert reps["resnet-2"].gr_engine_active is None  # no DCGM series for its pod
    assert reps["resnet-1"].t_s == NOW - 3
    assert "unrelated" not in reps
    # the PromQL really went over the wire, with the window rendered in
    assert Q.render("request_rate", W) in prom.queries
    assert f"[{promql_duration(W)}]" in Q.render("request_rate", W)


def test_falls_back_to_average_latency_without_summaries(prom):
    healthy(prom)
    for n in ("p50_ms", "p95_ms", "p99_ms"):
        prom.answers[Q.render(n, W)] = []
    s = src(prom).read(["resnet"], [], NOW)[0]["resnet"]
    assert s.p99_ms == 6.0 and s.latency_is_average and s.latency_window_s is None  # the rate window


@pytest.mark.parametrize("bad", ["NaN", "+Inf", "-Inf", "-1", "1e30"])
def test_invalid_values_become_none_with_reason(prom, bad):
    healthy(prom)
    prom.answers[Q.render("request_rate", W)] = [{"metric": {"model": "resnet"}, "value": [NOW, bad]}]
    prom.answers[Q.render("p99_ms", W)] = [{"metric": {"model": "resnet"}, "value": [NOW, bad]}]
    source = src(prom)
    s = source.read(["resnet"], [], NOW)[0]["resnet"]
    assert s.request_rate is None
    assert s.p99_ms == 6.0 and s.latency_is_average  # invalid quantile -> the counter average
    assert s.avg_queue_ms == 2.5  # other signals unaffected
    assert sum("invalid_metric" in n and "request_rate" in n for n in source.last_notes) == 1


def test_stale_model_is_none(prom):
    healthy(prom, t=NOW - 120)
    source = src(prom)
    models, reps = source.read(["resnet"], ["resnet-1"], NOW)
    assert models["resnet"] is None
    assert any("stale" in n for n in source.last_notes)
    assert reps["resnet-1"].busy_fraction is None


def test_absent_model_is_none_others_present(prom):
    healthy(prom, model="bert")
    models, _ = src(prom).read(["resnet", "bert"], [], NOW)
    assert models["resnet"] is None
    assert models["bert"].request_rate == 120.5


def test_one_query_failing_is_a_missing_signal(prom):
    healthy(prom)
    prom.answers[Q.render("pending", W)] = 500
    source = src(prom)
    s = source.read(["resnet"], [], NOW)[0]["resnet"]
    assert s.pending is None and s.request_rate == 120.5
    assert any("query pending failed" in n for n in source.last_notes)


def test_total_outage_raises(prom):
    prom.default = 503
    with pytest.raises(PrometheusUnavailable):
        src(prom).read(["resnet"], [], NOW)


def test_unreachable_prometheus_raises():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    # nothing listens on the port any more: connection refused on every query
    source = PrometheusSource(f"http://127.0.0.1:{port}", timeout_s=1)
    with pytest.raises(PrometheusUnavailable):
        source.read(["resnet"], [], NOW)


def test_queries_render_selectors_and_labels():
    q = Queries(sel='job="triton"', replica_label="pod")
    text = q.render("p99_ms", 60)
    assert text == 'max by (model) (nv_inference_request_summary_us{quantile="0.99",job="triton"}) / 1000'
    assert 'nv_inference_request_success{job="triton"}[1m]' not in q.render("success_rate", 60)
    assert 'nv_inference_request_success{job="triton"}[60s]' in q.render("success_rate", 60)
    assert "by (model, pod)" in q.render("busy_fraction", 10)
    assert "clamp_min(sum by (model) (rate(nv_inference_compute_infer_duration_us" in q.render(
        "queue_compute_ratio", 60
    )
    with pytest.raises(KeyError):
        q.render("sel")
    assert set(q.all_rendered(15)) == set(Queries.MODEL_SIGNALS + Queries.REPLICA_SIGNALS)


def test_a_prefetch_is_answered_once_by_the_next_read_and_an_old_one_is_sent_again():
    rate = {"now": 120.0}
    sent: list[str] = []
    lock = threading.Lock()

    def query(q: str) -> list:
        with lock:
            sent.append(q)
        if q == Q.render("request_rate", W):
            return [{"metric": {"model": "resnet"}, "value": [NOW, str(rate["now"])]}]
        if q == Q.render("sample_time", W):
            return [{"metric": {"model": "resnet"}, "value": [NOW, str(NOW - 3)]}]
        return []

    source = PrometheusSource("http://127.0.0.1:1", window_s=W, metrics_stale_s=60, query_fn=query)
    n = len(PrometheusSource.NAMES)
    source.prefetch(NOW)
    assert source.read(["resnet"], [], NOW + 0.4)[0]["resnet"].request_rate == 120.0
    assert len(sent) == n and source.prefetched_reads == 1  # the read sent nothing of its own
    source.read(["resnet"], [], NOW + 1)  # nothing prefetched: it asks
    assert len(sent) == 2 * n and source.prefetched_reads == 1
    # answers sent for a tick that never read them are too old for a later one: it asks afresh
    source.prefetch(NOW)
    deadline = time.monotonic() + 30
    while len(sent) < 3 * n and time.monotonic() < deadline:  # the prefetch's answers are in
        time.sleep(0.01)
    rate["now"] = 7.0
    got = source.read(["resnet"], [], NOW + PREFETCH_MAX_AGE_S + 1)[0]["resnet"]
    assert got.request_rate == 7.0 and source.prefetched_reads == 1 and len(sent) == 4 * n


def test_a_prefetch_that_failed_is_a_failed_read(prom):
    prom.default = 503
    source = src(prom)
    source.prefetch(NOW)
    with pytest.raises(PrometheusUnavailable):
        source.read(["resnet"], [], NOW)
