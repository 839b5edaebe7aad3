"""Send an inference again, once, when the front door closed its connection unanswered.

Place: outside the control loop, on the load side. The local backend's front
door is nginx, and every replica change is a graceful reload: the old workers
finish the requests they hold (answering ``Connection: close``) and close their
*idle* keep-alive connections at once. A client that sends its next request on
such a connection in the instant between its pool's liveness check and the
close sees the connection closed with no response. That race belongs to
HTTP/1.1 persistent connections, not to nginx: any proxy that closes an idle
connection has it, and RFC 9112 section 9.3.1 leaves the retry to the client.

geventhttpclient (under ``tritonclient.http``) retries it only for idempotent
methods, and an inference is a POST. Triton inference on a stateless model has
no effect but its answer, so sending it again is safe, and the front door
already retries it upstream for the same reason (``proxy_next_upstream ...
non_idempotent``). ``infer`` below sends once more on a new connection, only
for a connection closed or reset before any response; every other error, and a
second close, is the caller's failure. gRPC clients need none of this: HTTP/2
tells them with GOAWAY which streams the server never processed.
"""

from __future__ import annotations

from typing import Any

try:  # tritonclient.http's transport; absent in a gRPC-only install
    from geventhttpclient.response import HTTPConnectionClosed
except ImportError:  # pragma: no cover - the HTTP client is then not used either
    HTTPConnectionClosed = ConnectionResetError  # type: ignore[misc,assignment]

# Closed before any response byte: EOF on a reused connection, or RST/EPIPE while sending.
UNANSWERED_CLOSE: tuple[type[BaseException], ...] = (HTTPConnectionClosed, ConnectionResetError, BrokenPipeError)


def infer(client: Any, model: str, inputs: list, outputs: list | None = None) -> Any:
    """``client.infer``, sent once more if the connection was closed unanswered."""
    try:
        return client.infer(model, inputs, outputs=outputs)
    except UNANSWERED_CLOSE:
        return client.infer(model, inputs, outputs=outputs)
