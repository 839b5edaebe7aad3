"""loadtests/resend.py against a keep-alive server that closes a connection unanswered.

The server speaks just enough HTTP/1.1 for ``tritonclient.http``: it answers
inference with a JSON body and keeps the connection open, except for the
requests listed in ``close_on``, on which it reads the request and closes the
connection without a byte of response -- what a reloading front door does to
a request that arrives on an idle keep-alive connection it is closing.
"""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import numpy as np
import pytest
import tritonclient.http as th
from geventhttpclient.response import HTTPConnectionClosed

from loadtests import resend

ANSWER = {"model_name": "m", "outputs": [{"name": "Y", "datatype": "FP32", "shape": [1], "data": [2.0]}]}


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, as the front door

    def do_POST(self) -> None:
        srv: ClosingServer = self.server.owner  # type: ignore[attr-defined]
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        if srv.count_request() in srv.close_on:
            self.close_connection = True  # the request read, nothing answered
            return
        body = json.dumps(ANSWER if srv.status == 200 else {"error": "boom"}).encode()
        self.send_response(srv.status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args) -> None:
        pass


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def process_request(self, request, client_address) -> None:
        with self.owner._lock:
            self.owner.connections += 1
        super().process_request(request, client_address)


class ClosingServer:
    def __init__(self, close_on: set[int], status: int = 200) -> None:
        self.close_on = close_on
        self.status = status
        self.requests = 0
        self.connections = 0
        self._lock = threading.Lock()
        self.httpd = _Server(("127.0.0.1", 0), _Handler)
        self.httpd.owner = self  # type: ignore[attr-defined]
        self.port = self.httpd.server_address[1]
        self._thread = threading.Thread(target=self.httpd.serve_forever, args=(0.05,), daemon=True)
        self._thread.start()

    def count_request(self) -> int:
        with self._lock:
            self.requests += 1
            return self.requests

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        self._thread.join(5)


@pytest.fixture
def server_factory():
    made: list[ClosingServer] = []

    def make(close_on: set[int], status: int = 200) -> ClosingServer:
        s = ClosingServer(close_on, status)
        made.append(s)
        return s

    yield make
    for s in made:
        s.close()


def _inputs() -> list:
    i = th.InferInput("X", [1], "FP32")
    i.set_data_from_numpy(np.ones(1, dtype=np.float32))
    return [i]


def _client(port: int) -> th.InferenceServerClient:
    return th.InferenceServerClient(f"127.0.0.1:{port}", concurrency=1, network_timeout=10)


def test_the_client_alone_does_not_resend_an_unanswered_post(server_factory):
    s = server_factory({2})
    client = _client(s.port)
    try:
        assert client.infer("m", _inputs()).as_numpy("Y").tolist() == [2.0]
        with pytest.raises(HTTPConnectionClosed):
            client.infer("m", _inputs())
        assert s.requests == 2
    finally:
        client.close()


def test_an_unanswered_close_is_sent_once_more_on_a_new_connection(server_factory):
    s = server_factory({2})
    client = _client(s.port)
    try:
        assert resend.infer(client, "m", _inputs()).as_numpy("Y").tolist() == [2.0]
        assert resend.infer(client, "m", _inputs()).as_numpy("Y").tolist() == [2.0]
        # request 2 was closed unanswered; request 3 is its resend, on a second connection
        assert (s.requests, s.connections) == (3, 2)
    finally:
        client.close()


def test_a_second_close_is_the_callers_failure(server_factory):
    s = server_factory({1, 2, 3})
    client = _client(s.port)
    try:
        with pytest.raises(HTTPConnectionClosed):
            resend.infer(client, "m", _inputs())
        assert s.requests == 2  # one resend, never more
    finally:
        client.close()


def test_an_answered_error_is_not_resent(server_factory):
    s = server_factory(set(), status=500)
    client = _client(s.port)
    try:
        with pytest.raises(Exception, match="boom"):
            resend.infer(client, "m", _inputs())
        assert s.requests == 1
    finally:
        client.close()
