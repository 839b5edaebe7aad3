"""Run the app with uvicorn: in a background thread (local controller, tests) or in the foreground.

Part of the export step's edge. :func:`serve_in_thread` binds the socket
itself before starting uvicorn, so ``port=0`` works and ``handle.url`` is
known the moment it returns; ``handle.stop()`` asks uvicorn to exit and
joins the thread. With :class:`~autoscaler.api.tls.TlsSettings` it serves
HTTPS and (with a client CA) requires client certificates.
"""

from __future__ import annotations

import asyncio
import socket
import threading
from dataclasses import dataclass
from typing import Any

import uvicorn

from autoscaler.api.tls import ClientAuthMiddleware, PeerCertProtocol, TlsSettings

try:
    import uvloop  # noqa: F401

    LOOP = "uvloop"
except ImportError:  # pragma: no cover - only without uvloop
    LOOP = "asyncio"


def uvicorn_config(app: Any, *, tls: TlsSettings | None = None, log_level: str = "warning",
                   **kw: Any) -> uvicorn.Config:
    """uvicorn Config with our protocol (peer CN), the fastest loop available and TLS when given."""
    asgi = app
    if tls is not None and tls.verifies_clients:
        asgi = ClientAuthMiddleware(app, tls)
    extra = tls.uvicorn_kwargs() if tls is not None else {}
    return uvicorn.Config(
        asgi,
        http=PeerCertProtocol,
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
