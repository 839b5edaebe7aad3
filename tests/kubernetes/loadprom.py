"""An emulated Prometheus for the emulated cluster: Triton's series computed from a load trace.

There are no Triton pods in the emulated cluster, so nothing to scrape. This
answers ``/api/v1/query`` for exactly the PromQL migscale sends
(``observe.queries.Queries``), from an offered load per model (a function of
the seconds since ``start``) and the Ready pods of each model in the emulated
store, each serving its profile's capacity from models.yaml:

- requests/s = offered load, split into successes (up to the Ready pods'
  capacity) and failures (the excess, as rejected requests count in Triton);
- per request ``compute`` ms, and a queue that grows with utilisation
  rho = offered / capacity: queue/compute = rho^2 / (1 - rho), capped at 20
  (an M/M/1-like shape, enough for the policy's saturation signal); at each
  moment p50 / p95 / p99 = 1 / 2 / 3 x (queue + compute), and the latency
  quantiles reported are those of every request served over the last
  ``SUMMARY_WINDOW_S`` (60 s), as Triton's summaries keep theirs over a sliding
  window of about a minute: an overload stays in the p99 for that long after a
  scale-up ended it (each moment's requests taken as exponentially distributed,
  scaled to that moment's quantile, weighted by what was served);
- ``pending`` = the excess over five seconds (0 with no Ready pod: no Triton
  to queue in); each Ready pod's busy fraction
  = min(1, rho); sample time = now.

A model with no Ready pod has no latency series (absent, not zero).

``/metrics`` serves the same picture as Triton's own exposition, one set of
series per Ready pod (labels ``model``, ``version``, ``pod``; counters
integrated from one evaluation to the next at the rates the first saw, each pod's
share in proportion to its profile's capacity), so that a real Prometheus can scrape it and answer the very same
queries from its TSDB (``benchmarks/k8s_scale.py --prometheus real``). A
model with no Ready pod has no series there at all: no Triton, no metrics.

It is also the pod network, as an HTTP proxy: ``GET http://<pod IP>:8002/metrics``
in absolute form (what a client sends to a proxy, ``HTTP_PROXY``) answers with
that Ready pod's own exposition (Triton's labels, no ``pod``), and 502 where no
Ready pod has the IP. A controller process pointed at it scrapes pod IPs with
its real HTTP client, with nothing leaving loopback.
"""

from __future__ import annotations

import json
import threading
import time
import urllib.parse
from collections import deque
from collections.abc import Callable, Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import numpy as np
from fakeapi import FakeKube

from autoscaler.observe.queries import SUMMARY_WINDOW_S, Queries
from autoscaler.sim.queueing import mixture_quantiles

QUANTILES = ((0.5, 1.0), (0.95, 2.0), (0.99, 3.0))  # (quantile, multiple of queue + compute)


class LoadPrometheus:
    EVAL_S = 0.5

    def __init__(
        self,
        fake: FakeKube,
        capacity: Mapping[str, Mapping[str, float]],
        load: Callable[[float], Mapping[str, float]],
        *,
        window_s: float = 1.0,
        compute_ms: float = 10.0,
        nodelay: bool = False,
    ) -> None:
        self.fake = fake
        self.capacity = capacity
        self.load = load
        self.compute_ms = compute_ms
        q = Queries(replica_label="pod")
        self.names = {q.render(n, window_s): n for n in Queries.MODEL_SIGNALS + Queries.REPLICA_SIGNALS}
        self.start = time.time()
        self.queries = 0
        self.unknown: list[str] = []
        self._lock = threading.Lock()
        self._cached: tuple | None = None
        # per model: (time, served req/s, queue/compute ratio) at each evaluation over the
        # summary window; cleared while no Ready pod serves (a new Triton starts empty)
        self._served: dict[str, deque[tuple[float, float, float]]] = {}
        self._quantiles: dict[str, dict[float, float]] = {}  # per evaluation, filled when asked
        # (model, pod) -> counter totals at the last evaluation, and the rates that hold from
        # it to the next: each evaluation moves every pod's counters on by the rates of the
        # one before (those in effect meanwhile), so a step in load counts from when an
        # evaluation first saw it, whoever reads the counters and however seldom
        self._counters: dict[tuple[str, str], dict[str, float]] = {}
        self._rates: dict[tuple[str, str], dict[str, float]] = {}
        self._model_of: dict[str, str] = {}  # Ready pod -> model, per evaluation
        self._by_ip: dict[str, str] = {}  # pod IP -> Ready pod, per evaluation
        owner = self

        class Handler(BaseHTTPRequestHandler):
            disable_nagle_algorithm = nodelay  # as FakeKube.serve
            # keep-alive, as Triton's and Prometheus's servers: a controller's pool of 16
            # connections scraping a thousand pods reuses them instead of connecting a
            # thousand times a round
            protocol_version = "HTTP/1.1"

            def do_GET(self) -> None:
                url = urllib.parse.urlparse(self.path)
                if url.path == "/metrics":
                    pod = None
                    if url.hostname:
                        # a proxy's request (absolute URI) for a pod's own Triton: the pod network
                        pod = owner.pod_at(url.hostname)
                        if pod is None:  # no Ready pod there: what a proxy answers when the connect fails
                            self.send_error(502, f"no pod at {url.hostname}")
                            return
                    body = owner.exposition(pod).encode()
                    self.send_response(200)
                    self.send_header("Content-Type", "text/plain; version=0.0.4")
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body)
                    return
                query = urllib.parse.parse_qs(url.query).get("query", [""])[0]
                body = json.dumps({"status": "success", "data": {"resultType": "vector",
                                                                  "result": owner.answer(query)}}).encode()
                self.send_response(200 if url.path == "/api/v1/query" else 404)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            do_POST = do_GET

            def log_message(self, *a: Any) -> None:
                pass

        class Server(ThreadingHTTPServer):
            # a real server's listen backlog; the standard library's 5 drops the SYNs of a
            # pool that opens 16 connections at once, and each waits a second to retry
            request_queue_size = 128
            daemon_threads = True

        self.srv = Server(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.srv.server_address[1]}"
        threading.Thread(target=self.srv.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()

    def _ready_index(self) -> tuple[dict[str, list[tuple[str, str]]], dict[str, str], dict[str, str]]:
        """The Ready pods per model as (name, profile); the model of each by name; and each
        name by ``status.podIP``."""
        out: dict[str, list[tuple[str, str]]] = {}
        model_of: dict[str, str] = {}
        by_ip: dict[str, str] = {}
        for p in self.fake.view("Pod"):
            lbls = p["metadata"].get("labels") or {}
            model = lbls.get("migscale.io/model")
            st = p.get("status") or {}
            ok = any(c.get("type") == "Ready" and c.get("status") == "True" for c in st.get("conditions") or [])
            if model and ok and not p["metadata"].get("deletionTimestamp"):
                name, prof = p["metadata"]["name"], lbls.get("migscale.io/profile", "").replace("_", "+")
                out.setdefault(model, []).append((name, prof))
                model_of[name] = model
                if st.get("podIP"):
                    by_ip[st["podIP"]] = name
        return out, model_of, by_ip

    def _evaluate(self) -> tuple[float, dict[str, list[tuple[str, str]]], dict[str, dict[str, float]]]:
        """(time, Ready pods per model, per model: offered, capacity of the Ready pods,
        utilisation and queue/compute ratio), recomputed at most every ``EVAL_S``: the
        queries of one read see one picture, as Prometheus's data changes only per
        scrape (5-15 s) -- and 18 queries need not each walk every pod."""
        with self._lock:
            now = time.time()
            if self._cached is None or now - self._cached[0] > self.EVAL_S:
                if self._cached is not None:
                    dt = now - self._cached[0]
                    for key, rates in self._rates.items():
                        tot = self._counters[key]
                        for n in self.COUNTERS:
                            tot[n] += rates[n] * dt
                offered = self.load(now - self.start)
                ready, self._model_of, self._by_ip = self._ready_index()
                out = {}
                for model, lam in offered.items():
                    cap = sum(self.capacity.get(model, {}).get(prof, 0.0) for _, prof in ready.get(model, []))
                    rho = lam / cap if cap else float("inf")
                    out[model] = {"offered": lam, "capacity": cap, "rho": rho, "ratio": self._ratio(rho)}
                    self._record(model, now, min(lam, cap), out[model]["ratio"])
                # a pod gone takes its counters with it; a new one starts at 0
                self._rates = {(m, name): self._pod_rates(out.get(m), prof, m)
                               for m, pods in ready.items() for name, prof in pods}
                self._counters = {k: self._counters.get(k) or dict.fromkeys(self.COUNTERS, 0.0) for k in self._rates}
                self._cached = (now, ready, out)
                self._quantiles = {}
            return self._cached

    @staticmethod
    def _ratio(rho: float) -> float:
        return min(20.0, rho * rho / (1 - rho)) if rho < 1 else 20.0

    def _record(self, model: str, now: float, served: float, ratio: float) -> None:
        hist = self._served.setdefault(model, deque())
        if served <= 0:
            hist.clear()
            return
        hist.append((now, served, ratio))
        while hist and hist[0][0] < now - SUMMARY_WINDOW_S:
            hist.popleft()

    def latency_ms(self, model: str, ratio: float) -> dict[float, float]:
        """{quantile: ms} over the summary window, for a model that serves now at this
        queue/compute ratio (called with the lock held: answers and scrapes share it).
        The first call of an evaluation computes every serving model's."""
        if not self._quantiles:
            models = [m for m, h in self._served.items() if h]
            width = max((len(self._served[m]) for m in models), default=0)
            values, weights = np.ones((len(models), width)), np.zeros((len(models), width))
            for i, m in enumerate(models):
                t, served, ratios = (np.array(col) for col in zip(*self._served[m]))
                # each evaluation stands for the time until the next one (the newest: one EVAL_S)
                dt = np.maximum(np.append(np.diff(t), self.EVAL_S), 1e-3)
                values[i, : len(t)] = (1.0 + ratios) * self.compute_ms
                weights[i, : len(t)] = served * dt
            if models:
                per_q = {q: mixture_quantiles(q, k * values, weights) for q, k in QUANTILES}
                self._quantiles = {m: {q: float(v[i]) for q, v in per_q.items()} for i, m in enumerate(models)}
        got = self._quantiles.get(model)
        if got is None:  # no request served in the window yet: this moment's own
            got = {q: k * (1.0 + ratio) * self.compute_ms for q, k in QUANTILES}
        return got

    def answer(self, query: str) -> list[dict[str, Any]]:
        self.queries += 1
        name = self.names.get(query)
        if name is None:
            self.unknown.append(query)
            return []
        now, ready, state = self._evaluate()
        rows = []
        for model, st in state.items():
            lam, cap, rho, ratio = st["offered"], st["capacity"], st["rho"], st["ratio"]
            served = min(lam, cap)
            vals = {
                "request_rate": lam, "success_rate": served, "failure_rate": lam - served,
                # no Triton at all: requests fail at the door, nothing queues
                "pending": max(0.0, lam - cap) * 5 if cap else 0.0, "sample_time": now,
                "ready_replicas": len(ready.get(model, [])),
            }
            if cap > 0 and served > 0:
                vals.update({"avg_compute_ms": self.compute_ms, "avg_queue_ms": ratio * self.compute_ms,
                             "queue_compute_ratio": ratio, "avg_batch": 1.0,
                             "avg_request_ms": (1 + ratio) * self.compute_ms})
                if name in ("p50_ms", "p95_ms", "p99_ms"):
                    with self._lock:
                        lat = self.latency_ms(model, ratio)
                    vals.update({"p50_ms": lat[0.5], "p95_ms": lat[0.95], "p99_ms": lat[0.99]})
            if name in vals:
                rows.append({"metric": {"model": model}, "value": [now, str(vals[name])]})
            elif name in ("busy_fraction", "replica_sample_time"):
                for pod, _prof in ready.get(model, []):
                    v = now if name == "replica_sample_time" else min(1.0, rho)
                    rows.append({"metric": {"model": model, "pod": pod}, "value": [now, str(v)]})
        return rows

    COUNTERS = ("nv_inference_request_success", "nv_inference_request_failure", "nv_inference_count",
                "nv_inference_exec_count", "nv_inference_queue_duration_us", "nv_inference_compute_input_duration_us",
                "nv_inference_compute_infer_duration_us", "nv_inference_compute_output_duration_us",
                "nv_inference_request_duration_us")

    def pod_at(self, ip: str) -> str | None:
        """The Ready pod whose ``status.podIP`` is ``ip`` (None: nothing serves there), as of
        the last evaluation (at most ``EVAL_S`` old)."""
        self._evaluate()
        with self._lock:
            return self._by_ip.get(ip)

    def _pod_rates(self, st: Mapping[str, float] | None, prof: str, model: str) -> dict[str, float]:
        """Each counter's rate on one Ready pod: its profile's share of what its model serves."""
        if st is None or not st["capacity"]:
            return dict.fromkeys(self.COUNTERS, 0.0)
        lam, cap, ratio = st["offered"], st["capacity"], st["ratio"]
        served = min(lam, cap)
        share = self.capacity.get(model, {}).get(prof, 0.0) / cap
        ok, bad, us = served * share, (lam - served) * share, self.compute_ms * 1000.0
        return {"nv_inference_request_success": ok, "nv_inference_request_failure": bad,
                "nv_inference_count": ok, "nv_inference_exec_count": ok,
                "nv_inference_queue_duration_us": ok * ratio * us,
                "nv_inference_compute_input_duration_us": 0.0,
                "nv_inference_compute_infer_duration_us": ok * us,
                "nv_inference_compute_output_duration_us": 0.0,
                "nv_inference_request_duration_us": ok * (1 + ratio) * us}

    def exposition(self, pod: str | None = None) -> str:
        """Triton's series for every Ready pod (or only ``pod``'s, as its own Triton serves
        them), in the text format. The counters are the last evaluation's totals moved on by
        its rates to this moment: the same whoever reads them, and one pod's page costs one
        pod's work (a round over a thousand pods reads each once)."""
        self._evaluate()
        with self._lock:
            t_eval, ready, state = self._cached  # type: ignore[misc]  # as of the lock, not of a read before it
            since = max(0.0, time.time() - t_eval)  # the evaluation's rates hold until the next one
            lines: list[str] = []
            if pod is None:
                shown = sorted(ready.items())
            else:  # one pod's own Triton: only its model's series, only its own
                shown = [(m, [rp for rp in ready[m] if rp[0] == pod]) for m in (self._model_of.get(pod),) if m]
            for model, pods in shown:
                st = state.get(model)
                if st is None or not st["capacity"]:
                    continue
                lam, cap, rho, ratio = st["offered"], st["capacity"], st["rho"], st["ratio"]
                lat = None
                for name, prof in pods:
                    share = self.capacity.get(model, {}).get(prof, 0.0) / cap
                    rates, base = self._rates[(model, name)], self._counters[(model, name)]
                    tot = {n: base[n] + rates[n] * since for n in self.COUNTERS}
                    lat = lat or self.latency_ms(model, ratio)
                    # Triton's own labels; Prometheus adds ``pod`` from the PodMonitor's target
                    lbl = f'model="{model}",version="1"' + (f',pod="{name}"' if pod is None else "")
                    for n in self.COUNTERS:
                        extra = ',reason="REJECTED"' if n == "nv_inference_request_failure" else ""
                        lines.append(f"{n}{{{lbl}{extra}}} {tot[n]:.3f}")
                    lines.append(f"nv_inference_pending_request_count{{{lbl}}} {max(0.0, lam - cap) * 5 * share:.3f}")
                    for q, _k in QUANTILES:
                        lines.append(f'nv_inference_request_summary_us{{{lbl},quantile="{q}"}} {lat[q] * 1000.0:.1f}')
                    if pod is None:  # DCGM's exporter, not the pod's Triton
                        lines.append(f'DCGM_FI_PROF_GR_ENGINE_ACTIVE{{pod="{name}"}} {min(1.0, rho):.4f}')
        return "\n".join(lines) + "\n"

    def close(self) -> None:
        self.srv.shutdown()
        self.srv.server_close()
