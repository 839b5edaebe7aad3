"""The metrics API at the wire: requests the HTTP layer refuses before the app sees them.

A real uvicorn server on 127.0.0.1 (a free port) and raw sockets, because
an HTTP client library will not send a malformed request. Each refusal must
still be a Kubernetes Status (the HPA and kubectl parse it), and the request
head must be capped before it is buffered.
"""

from __future__ import annotations

import json
import socket

import pytest

from autoscaler.api import ApiState, create_app, serve_in_thread
from autoscaler.api.server import MAX_HEAD_BYTES


@pytest.fixture(scope="module")
def server():
    handle = serve_in_thread(create_app(ApiState()), "127.0.0.1", 0)
    try:
        yield handle
    finally:
        handle.stop()


def _exchange(handle, *chunks: bytes, responses: int = 1, timeout_s: float = 10.0) -> bytes:
    """Send ``chunks``; read until ``responses`` complete responses came back or the server closed."""
    with socket.create_connection(("127.0.0.1", handle.port), timeout=timeout_s) as s:
        try:
            for c in chunks:
                s.sendall(c)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the server answered and closed before reading everything: the answer is what counts
        out = b""
        while _complete(out) < responses:
            try:
                got = s.recv(65536)
            except ConnectionResetError:
                break
            if not got:
                break
            out += got
        return out


def _complete(raw: bytes) -> int:
    n, rest = 0, raw
    while b"\r\n\r\n" in rest:
        head, rest = rest.split(b"\r\n\r\n", 1)
        length = next(int(line.split(b":")[1]) for line in head.split(b"\r\n")
                      if line.lower().startswith(b"content-length:"))
        if len(rest) < length:
            break
        rest, n = rest[length:], n + 1
    return n


def _parse(raw: bytes) -> tuple[int, dict[str, str], object]:
    head, body = raw.split(b"\r\n\r\n", 1)
    lines = head.decode("latin-1").split("\r\n")
    code = int(lines[0].split()[1])
    headers = {k.strip().lower(): v.strip() for k, v in (ln.split(":", 1) for ln in lines[1:])}
    return code, headers, json.loads(body[: int(headers["content-length"])])


def _get(path: str, extra: bytes = b"") -> bytes:
    return b"GET " + path.encode() + b" HTTP/1.1\r\nHost: 127.0.0.1\r\n" + extra + b"\r\n"


def test_a_request_the_parser_refuses_gets_a_400_status(server):
    for raw in (b"GARBAGE\r\n\r\n",
                b"GET /healthz HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n"):
        code, headers, body = _parse(_exchange(server, raw))
        assert code == 400
        assert headers["content-type"] == "application/json"
        assert headers["connection"] == "close"
        assert body["kind"] == "Status" and body["reason"] == "BadRequest" and body["code"] == 400
        assert "not a valid HTTP/1.1 request" in body["message"]


def test_a_request_head_over_the_cap_gets_431_and_the_server_goes_on(server):
    huge = b"X-Pad: " + b"a" * (2 * MAX_HEAD_BYTES) + b"\r\n"
    code, headers, body = _parse(_exchange(server, _get("/healthz", huge)))
    assert code == 431
    assert body["kind"] == "Status" and body["code"] == 431
    assert body["reason"] == "RequestHeaderFieldsTooLarge"
    assert str(MAX_HEAD_BYTES) in body["message"]
    assert headers["connection"] == "close"
    code, _, body = _parse(_exchange(server, _get("/healthz")))
    assert (code, body) == (200, {"status": "ok"})


def test_a_large_head_under_the_cap_is_served(server):
    pad = b"X-Pad: " + b"a" * (MAX_HEAD_BYTES // 2) + b"\r\n"
    code, _, body = _parse(_exchange(server, _get("/healthz", pad)))
    assert (code, body) == (200, {"status": "ok"})


def test_the_cap_is_per_request_not_per_connection(server):
    # four heads of 40% of the cap each on one kept-alive connection: 160% in all, each one under
    pad = b"X-Pad: " + b"a" * (MAX_HEAD_BYTES * 2 // 5) + b"\r\n"
    raw = _exchange(server, *[_get("/healthz", pad)] * 4, responses=4)
    assert raw.count(b"HTTP/1.1 200 OK") == 4
    assert b"431" not in raw


def test_an_upgrade_header_is_plain_http(server):
    # no endpoint speaks WebSocket: the request is served as the HTTP request it also is
    up = b"Connection: Upgrade\r\nUpgrade: websocket\r\nSec-WebSocket-Version: 13\r\n"
    code, _, body = _parse(_exchange(server, _get("/healthz", up)))
    assert (code, body) == (200, {"status": "ok"})
    code, _, body = _parse(_exchange(server, _get("/apis/custom.metrics.k8s.io/v1beta2/nope", up)))
    assert code == 404 and body["kind"] == "Status"
