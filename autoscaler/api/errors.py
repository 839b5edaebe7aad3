"""Kubernetes ``Status`` error bodies and the handlers that guarantee them.

Part of the export step. The HPA and ``kubectl get --raw`` expect the API
machinery's error shape; every error this app returns -- unknown metric,
unknown route, malformed selector, a path parameter FastAPI rejects -- is a
``Status`` with the matching HTTP code. Client input never yields a 5xx: the
only 500 left is a bug in this package, and it is still a Status.
"""

from __future__ import annotations

import logging
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import Response
from starlette.exceptions import HTTPException as StarletteHTTPException

log = logging.getLogger("migscale.api")

_REASONS = {
    400: "BadRequest",
    401: "Unauthorized",
    403: "Forbidden",
    404: "NotFound",
    405: "MethodNotAllowed",
    406: "NotAcceptable",
    500: "InternalError",
    503: "ServiceUnavailable",
}


class ApiError(Exception):
    """Raised by handlers; rendered as a Kubernetes Status."""

    def __init__(self, code: int, message: str, reason: str | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.reason = reason or _REASONS.get(code, "Unknown")


def not_found(message: str) -> ApiError:
    return ApiError(404, message, "NotFound")


def bad_request(message: str) -> ApiError:
    return ApiError(400, message, "BadRequest")


def status_body(code: int, message: str, reason: str | None = None) -> dict[str, Any]:
    return {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason or _REASONS.get(code, "Unknown"),
        "code": code,
    }


def status_response(code: int, message: str, reason: str | None = None) -> Response:
    from autoscaler.api.state import dumps

    return Response(dumps(status_body(code, message, reason)), status_code=code, media_type="application/json")


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(ApiError)
    async def _api_error(_: Request, exc: ApiError) -> Response:
        return status_response(exc.code, exc.message, exc.reason)

    @app.exception_handler(RequestValidationError)
    async def _validation(_: Request, exc: RequestValidationError) -> Response:
        problems = []
        for e in exc.errors():
            where = ".".join(str(p) for p in e.get("loc", ()))
            problems.append(f"{where}: {e.get('msg', 'invalid')}")
        return status_response(400, "; ".join(problems) or "invalid request", "BadRequest")

    @app.exception_handler(StarletteHTTPException)
    async def _http(_: Request, exc: StarletteHTTPException) -> Response:
        code = exc.status_code
        if code == 404:
            msg = "the server could not find the requested resource"
        elif code == 405:
            msg = "the server does not allow this method on the requested resource"
        else:
            msg = str(exc.detail)
        resp = status_response(code, msg)
        if exc.headers:
            resp.headers.update(exc.headers)
        return resp

    @app.exception_handler(Exception)
    async def _bug(_: Request, exc: Exception) -> Response:  # pragma: no cover - only on a bug
        log.exception("internal error")
        return status_response(500, f"internal error: {type(exc).__name__}", "InternalError")
