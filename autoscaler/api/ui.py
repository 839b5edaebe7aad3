"""``/ui``: the live web view, plain HTML + CSS + JS shipped in the package.

Part of the export step, for people: the page polls ``/v1/status``,
``/v1/plan`` and ``/v1/history`` every 1.5 s and redraws GPUs (7 compute
slices, 8 memory slots, MIG instances and the replica on each, a pending
layout in outline) and per-model SLO status. No build step, no CDN: the
three files in ``autoscaler/api/static/`` are read once at startup and served
from memory, so the page works offline and behind the same TLS/client-auth
as the API. It shows nothing that ``/v1/plan`` and ``/v1/status`` do not.
"""

from __future__ import annotations

from importlib import resources

from fastapi import FastAPI
from fastapi.responses import RedirectResponse, Response

_FILES = {
    "index.html": "text/html; charset=utf-8",
    "ui.js": "text/javascript; charset=utf-8",
    "ui.css": "text/css; charset=utf-8",
}


def _load() -> dict[str, bytes]:
    root = resources.files("autoscaler.api") / "static"
    return {name: (root / name).read_bytes() for name in _FILES}


def mount(app: FastAPI) -> None:
    files = _load()
    # the page must not be framed or load anything from elsewhere
    headers = {
        "Content-Security-Policy": "default-src 'self'; img-src 'self' data:; frame-ancestors 'none'",
        "X-Content-Type-Options": "nosniff",
        "Cache-Control": "no-cache",
    }

    @app.get("/ui", include_in_schema=False)
    def _index() -> Response:
        return Response(files["index.html"], media_type=_FILES["index.html"], headers=headers)

    @app.get("/", include_in_schema=False)
    def _root() -> Response:
        return RedirectResponse("/ui")

    @app.get("/ui/{name}", include_in_schema=False)
    def _static(name: str) -> Response:
        if name not in files:
            from autoscaler.api.errors import not_found

            raise not_found(f"no such file {name!r}")
        return Response(files[name], media_type=_FILES[name], headers=headers)
