"""Run the app with uvicorn: in a background thread (local controller, tests) or in the foreground.

Part of the export step's edge. :func:`serve_in_thread` binds the socket
itself before starting uvicorn, so ``port=0`` works and ``handle.url`` is
known the moment it returns; ``handle.stop()`` asks uvicorn to exit and
joins the thread. With :class:`~autoscaler.api.tls.TlsSettings` it serves
HTTPS and (with a client CA) requires client certificates.

Requests that never reach the app are answered here, as a Kubernetes Status
too (:class:`ApiProtocol`): a request the HTTP parser refuses gets 400, and
a request head (request line and headers) over :data:`MAX_HEAD_BYTES` gets
431 before more of it is buffered -- the parser sets no limit of its own, and
``/healthz`` and ``/readyz`` answer clients without a certificate. WebSocket
upgrades are not served (no endpoint speaks it): such a request is plain HTTP.
"""

from __future__ import annotations

import asyncio
import socket
import threading
from dataclasses import dataclass
from http import HTTPStatus
from typing import Any

import uvicorn

from autoscaler.api.errors import status_body
from autoscaler.api.tls import HTTP_IMPL, ClientAuthMiddleware, PeerCertProtocol, TlsSettings

try:
    import uvloop  # noqa: F401

    LOOP = "uvloop"
except ImportError:  # pragma: no cover - only without uvloop
    LOOP = "asyncio"


# Go's net/http default (http.DefaultMaxHeaderBytes), which the Kubernetes API server keeps
MAX_HEAD_BYTES = 1 << 20


class ApiProtocol(PeerCertProtocol):  # type: ignore[misc, valid-type]
    """uvicorn's HTTP protocol with a capped request head and Status bodies for its own errors."""

    def connection_made(self, transport: Any) -> None:  # type: ignore[override]
        super().connection_made(transport)
        # bytes of the current request head so far; None once it is complete. Only httptools
        # calls the head/message callbacks below; h11 caps a head itself (16 KiB)
        self._head_bytes: int | None = 0 if HTTP_IMPL == "httptools" else None

    def data_received(self, data: bytes) -> None:
        if self._head_bytes is not None:
            # counted before parsing, a whole read at a time: a head is refused within one read of the cap
            self._head_bytes += len(data)
            if self._head_bytes > MAX_HEAD_BYTES:
                self._head_bytes = None
                self._refuse(431, "RequestHeaderFieldsTooLarge",
                             f"the request line and headers exceed {MAX_HEAD_BYTES} bytes")
                return
        super().data_received(data)

    def on_headers_complete(self) -> None:
        self._head_bytes = None
        super().on_headers_complete()

    def on_message_complete(self) -> None:
        super().on_message_complete()
        self._head_bytes = 0  # the next request on this connection starts its own head

    def _unsupported_upgrade_warning(self) -> None:
        """Silent: an ``Upgrade`` header is ignored by design (``ws="none"``), not a fault to log per request."""

    def send_400_response(self, msg: str) -> None:
        self._refuse(400, "BadRequest", f"not a valid HTTP/1.1 request: {msg.rstrip('.')}")

    def _refuse(self, code: int, reason: str, message: str) -> None:
        from autoscaler.api.state import dumps

        body = dumps(status_body(code, message, reason))
        head = (f"HTTP/1.1 {code} {HTTPStatus(code).phrase}\r\ncontent-type: application/json\r\n"
                f"content-length: {len(body)}\r\nconnection: close\r\n\r\n")
        self.transport.write(head.encode("ascii") + body)
        self.transport.close()


def uvicorn_config(app: Any, *, tls: TlsSettings | None = None, log_level: str = "warning",
                   **kw: Any) -> uvicorn.Config:
    """uvicorn Config with our protocol (peer CN), the fastest loop available and TLS when given."""
    asgi = app
    if tls is not None and tls.verifies_clients:
        asgi = ClientAuthMiddleware(app, tls)
    extra = tls.uvicorn_kwargs() if tls is not None else {}
    return uvicorn.Config(
        asgi,
        http=ApiProtocol,
        ws="none",
        loop=LOOP,
        lifespan="off",
        log_level=log_level,
        access_log=False,
        server_header=False,
        date_header=False,
        timeout_keep_alive=30,
        **extra,
        **kw,
    )


@dataclass
class ServerHandle:
    url: str
    host: str
    port: int
    server: uvicorn.Server
    thread: threading.Thread

    def stop(self, timeout_s: float = 10.0) -> None:
        self.server.should_exit = True
        self.thread.join(timeout_s)


def bind(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.set_inheritable(True)
    return sock


def serve_in_thread(
    app: Any,
    host: str = "127.0.0.1",
    port: int = 0,
    tls: TlsSettings | None = None,
    *,
    log_level: str = "warning",
    start_timeout_s: float = 15.0,
) -> ServerHandle:
    """Start serving ``app`` in a daemon thread; returns once the socket accepts connections."""
    sock = bind(host, port)
    real_port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn_config(app, tls=tls, log_level=log_level))
    errors: list[BaseException] = []

    def run() -> None:
        try:
            # uvicorn installs signal handlers only on the main thread, so the
            # embedding process keeps its own
            if LOOP == "uvloop":
                _run_uvloop(server, sock)
            else:
                asyncio.run(server.serve(sockets=[sock]))
        except BaseException as e:  # noqa: BLE001 - reported to the caller below  # pragma: no cover
            errors.append(e)
        finally:
            sock.close()

    thread = threading.Thread(target=run, name=f"migscale-api:{real_port}", daemon=True)
    thread.start()
    deadline = start_timeout_s
    step = 0.01
    while not server.started and thread.is_alive() and deadline > 0:
        threading.Event().wait(step)
        deadline -= step
    if not server.started:
        server.should_exit = True
        thread.join(2)
        raise RuntimeError(f"API server did not start on {host}:{real_port}: {errors[0] if errors else 'timeout'}")
    scheme = "https" if tls is not None else "http"
    shown = f"[{host}]" if ":" in host else host
    return ServerHandle(f"{scheme}://{shown}:{real_port}", host, real_port, server, thread)


def _run_uvloop(server: uvicorn.Server, sock: socket.socket) -> None:
    import uvloop

    uvloop.run(server.serve(sockets=[sock]))


def serve_forever(app: Any, host: str, port: int, tls: TlsSettings | None = None, *,
                  log_level: str = "warning") -> None:
    """Serve in the foreground until SIGINT/SIGTERM (``migscale api``). Raises OSError if the port is taken."""
    sock = bind(host, port)
    server = uvicorn.Server(uvicorn_config(app, tls=tls, log_level=log_level))
    try:
        if LOOP == "uvloop":
            _run_uvloop(server, sock)
        else:
            asyncio.run(server.serve(sockets=[sock]))
    finally:
        sock.close()
