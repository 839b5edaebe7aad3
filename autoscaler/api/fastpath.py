"""Answer repeated metric queries from the current snapshot without routing.

Part of the export step, for speed. An HPA asks the same question every
sync period (the same path and the same ``labelSelector``), and the answer
only changes when the controller publishes a new tick. So the first time a
``GET /apis/...`` is answered 200, its exact bytes are kept in the current
snapshot's cache under the raw ``(path, query string)``; the next identical
request is answered from there by this ASGI middleware, skipping FastAPI's
routing, parameter parsing and response objects. A new tick publishes a new
snapshot with an empty cache, so nothing stale is ever served. Errors are
never cached.

The HPA's own call (``pods/*/METRIC?labelSelector=``) is also *computed*
here on a miss, with the same function the FastAPI route uses
(:func:`autoscaler.api.custom.pods_list`): FastAPI's per-request overhead is
about 3x the work of the answer itself. Anything unusual (unknown query
parameters, duplicates, any error) falls through to the FastAPI route, so
errors keep one rendering.

``/healthz`` is answered here too: it is the benchmark's baseline, the bare
cost of the HTTP server.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any
from urllib.parse import parse_qsl

from autoscaler.api.custom import pods_list
from autoscaler.api.errors import ApiError
from autoscaler.api.state import ApiState

_JSON_HEADERS = [(b"content-type", b"application/json")]
_HEALTHZ = b'{"status":"ok"}'
# the HPA's call; everything else (and every error) goes through FastAPI
_PODS_LIST = re.compile(r"^/apis/custom\.metrics\.k8s\.io/(v1beta1|v1beta2)/namespaces/([^/]+)/pods/\*/([^/]+)$")
_PARAMS = frozenset(("labelSelector", "metricLabelSelector"))


class FastPathMiddleware:
    def __init__(self, app: Callable, state: ApiState) -> None:
        self.app = app
        self.state = state

    async def __call__(self, scope: dict, receive: Callable, send: Callable) -> None:
        if scope["type"] != "http" or scope["method"] != "GET":
            await self.app(scope, receive, send)
            return
        path: str = scope["path"]
        if path == "/healthz":
            await _send(send, 200, _HEALTHZ)
            return
        if not path.startswith("/apis/"):
            await self.app(scope, receive, send)
            return
        snap = self.state.snapshot
        key = ("raw", path, scope.get("query_string", b""))
        hit = snap.cache.get(key)
        if hit is not None:
            await _send(send, hit[0], hit[1])
            return
        m = _PODS_LIST.match(path)
        if m is not None:
            result = _pods_list(snap, m, key[2])
            if result is not None:
                snap.remember(key, result)
                await _send(send, result[0], result[1])
                return
        status: list[int] = []
        chunks: list[bytes] = []

        async def capture(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start":
                status.append(message["status"])
            elif message["type"] == "http.response.body":
                chunks.append(message.get("body", b""))
            await send(message)

        await self.app(scope, receive, capture)
        if status == [200]:
            snap.remember(key, (200, b"".join(chunks)))


def _pods_list(snap: Any, m: re.Match, query: bytes) -> tuple[int, bytes] | None:
    """The list call without FastAPI; None (-> FastAPI) for anything unusual or any error."""
    try:
        pairs = parse_qsl(query.decode("latin-1"), keep_blank_values=True, strict_parsing=False,
                          encoding="utf-8", errors="strict")
    except (UnicodeDecodeError, ValueError):
        return None
    params = dict(pairs)
    if len(params) != len(pairs) or not params.keys() <= _PARAMS:
        return None  # duplicates or unknown parameters: let FastAPI apply its own rules
    try:
        return pods_list(snap, m[1], m[2], m[3], params.get("labelSelector"), params.get("metricLabelSelector"))
    except ApiError:
        return None  # errors are rendered (identically) by the FastAPI route


async def _send(send: Callable, status: int, body: bytes) -> None:
    await send({"type": "http.response.start", "status": status,
                "headers": [*_JSON_HEADERS, (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})
