"""A locust ``User`` that sends Triton inference requests over HTTP or gRPC.

Load generation sits outside the loop: these users create the demand the
autoscaler observes. Each user owns one client (HTTP with ``concurrency=1`` --
tritonclient.http runs on geventhttpclient, so it yields to locust's hub; gRPC
with its own channel, made gevent-cooperative by ``init_gevent()`` in the
locustfile) and sends one request at a time, paced by ``Pacer``: the load shape
sets a per-user rate every tick, and a user waits until ``1 / rate`` seconds
after its previous request started.

Each request is reported to locust's statistics as
``request_type="infer-http"|"infer-grpc"``, ``name=<model>``, so the stats
table, the CSV and the SLO verdict are per model.
"""

from __future__ import annotations

import contextlib
import random
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from locust import User, task

from loadtests import resend
from loadtests.inputs import ModelIO, build_inputs, fetch_model_io, requested_outputs, response_bytes
from loadtests.weights import parse_weights, weights_from_file  # noqa: F401  (re-exported)


def strip_scheme(host: str) -> str:
    """tritonclient wants ``HOST:PORT``; locust's ``--host`` is usually a URL."""
    for prefix in ("http://", "https://", "grpc://"):
        host = host.removeprefix(prefix)
    return host.rstrip("/")


@dataclass
class Pacer:
    """Shared between the load shape (writer, once a second) and the users (readers).

    ``per_user_rps``: each user's target rate; ``weights``: model -> share of requests.
    """

    per_user_rps: float = 0.0
    weights: dict[str, float] = field(default_factory=dict)

    def pick_model(self, rng: random.Random) -> str | None:
        names = [m for m, w in self.weights.items() if w > 0]
        if not names:
            return None
        return rng.choices(names, weights=[self.weights[m] for m in names], k=1)[0]


PACER = Pacer()

# Model metadata is fetched once per (protocol, host, model) per process, not per user:
# a shape that spawns 200 users must not send 400 metadata requests into a spike.
_IO_CACHE: dict[tuple[str, str, str], ModelIO] = {}
_IO_LOCK = threading.Lock()


def _client_module(protocol: str) -> Any:
    if protocol == "grpc":
        import tritonclient.grpc as mod
    elif protocol == "http":
        import tritonclient.http as mod
    else:
        raise ValueError(f"protocol: must be http or grpc, got {protocol!r}")
    return mod


def _make_client(mod: Any, protocol: str, url: str, timeout_s: float) -> Any:
    if protocol == "http":
        # concurrency=1: one connection per user; locust's concurrency is the number of users
        return mod.InferenceServerClient(url, concurrency=1, connection_timeout=timeout_s,
                                         network_timeout=timeout_s)
    return mod.InferenceServerClient(url)


class TritonUser(User):
    """Configure through class attributes (the locustfile sets them from the command line)."""

    abstract = True
    protocol: str = "http"
    batch: int = 1
    dynamic_dim: int = 16
    timeout_s: float = 30.0
    pacer: Pacer = PACER

    def __init__(self, environment: Any) -> None:
        super().__init__(environment)
        self.url = strip_scheme(self.host or "127.0.0.1:8000")
        self.mod = _client_module(self.protocol)
        self.client: Any = None
        self.request_type = f"infer-{self.protocol}"
        self.requests: dict[str, tuple[list, list | None]] = {}
        self.rng = random.Random()
        self._last_start: float | None = None

    # ---------------------------------------------------------------- pacing
    def wait_time(self) -> float:
        rate = self.pacer.per_user_rps
        if rate <= 0:
            # nothing to send this second (a trace gap); look again soon
            return 0.25
        now = time.perf_counter()
        if self._last_start is None:
            # spread new users over one interval so a spawn burst is not a request burst
            return self.rng.uniform(0, 1.0 / rate)
        return max(0.0, self._last_start + 1.0 / rate - now)

    # ---------------------------------------------------------------- lifecycle
    def on_start(self) -> None:
        self.client = _make_client(self.mod, self.protocol, self.url, self.timeout_s)

    def on_stop(self) -> None:
        if self.client is not None:
            with contextlib.suppress(Exception):  # closing a broken client is best effort
                self.client.close()
            self.client = None

    def _prepared(self, model: str) -> tuple[list, list | None]:
        req = self.requests.get(model)
        if req is None:
            key = (self.protocol, self.url, model)
            io = _IO_CACHE.get(key)
            if io is None:
                io = fetch_model_io(self.client, model)
                with _IO_LOCK:
                    _IO_CACHE[key] = io
            req = (build_inputs(self.mod, io, self.batch, self.dynamic_dim, seed=hash(model) & 0xFFFF),
                   requested_outputs(self.mod, io))
            self.requests[model] = req
        return req

    # ---------------------------------------------------------------- the task
    @task
    def infer(self) -> None:
        if self.pacer.per_user_rps <= 0:
            return  # a rate of 0 (a trace gap, --base-rps 0) sends nothing
        model = self.pacer.pick_model(self.rng)
        if model is None:
            return
        self._last_start = time.perf_counter()
        start = time.perf_counter()
        exc: BaseException | None = None
        length = 0
        try:
            # the client's own set-up (metadata, inputs) once per model, outside the request's latency
            inputs, outputs = self._prepared(model)
            start = time.perf_counter()
            # a front door's reload may close the connection unanswered: one resend (loadtests/resend.py)
            result = resend.infer(self.client, model, inputs, outputs)
            length = response_bytes(result)
        except Exception as e:  # noqa: BLE001 - every failure is a failed request in the stats
            exc = e
        ms = (time.perf_counter() - start) * 1000.0
        self.environment.events.request.fire(
            request_type=self.request_type,
            name=model,
            response_time=ms,
            response_length=length,
            exception=exc,
            context={},
        )
