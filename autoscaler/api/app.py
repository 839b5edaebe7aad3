"""The migscale HTTP app: metrics APIs for the HPA, /metrics, health, plan, status, UI.

Part of the loop's export step (README, "Architecture"): the controller publishes each
tick into an :class:`~autoscaler.api.state.ApiState`; this app serves it. The
same app runs embedded in the local controller (``serve_in_thread``) and
standalone in Kubernetes (``migscale api``), behind the TLS and client-auth
settings of :mod:`autoscaler.api.tls`.

Routes:

* ``/apis``, ``/apis/custom.metrics.k8s.io[/v1beta1|/v1beta2]``,
  ``/apis/external.metrics.k8s.io[/v1beta1]`` -- discovery, as the aggregator expects;
* custom and external metric values (:mod:`custom`, :mod:`external`);
* ``/metrics`` (:mod:`promexport`), ``/healthz``, ``/readyz`` (503 before the first tick, and
  while the run loop has stopped, died, or published nothing for longer than its bound);
* ``/v1/plan``, ``/v1/status``, ``/v1/history`` -- JSON for people and the web view;
* ``/ui`` -- the web view (:mod:`ui`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from fastapi.responses import Response

from autoscaler.api import custom, external, schemas, ui
from autoscaler.api.errors import install_error_handlers, status_response
from autoscaler.api.fastpath import FastPathMiddleware
from autoscaler.api.promexport import CONTENT_TYPE, PromExport
from autoscaler.api.state import ApiState, dumps

__all__ = ["ApiSettings", "create_app"]


@dataclass(frozen=True)
class ApiSettings:
    """Knobs of the app itself (TLS lives in :class:`autoscaler.api.tls.TlsSettings`)."""

    title: str = "migscale"
    ui: bool = True  # serve the web view at /ui


def _json(body: bytes, code: int = 200) -> Response:
    return Response(body, status_code=code, media_type="application/json")


def _api_groups() -> dict[str, Any]:
    def group(name: str, versions: tuple[str, ...]) -> dict[str, Any]:
        vs = [{"groupVersion": f"{name}/{v}", "version": v} for v in versions]
        return {"name": name, "versions": vs, "preferredVersion": vs[0]}

    return {
        "kind": "APIGroupList",
        "apiVersion": "v1",
        "groups": [group(custom.GROUP, custom.VERSIONS), group(external.GROUP, (external.VERSION,))],
    }


def create_app(state: ApiState, settings: ApiSettings | None = None) -> FastAPI:
    settings = settings or ApiSettings()
    app = FastAPI(
        title=settings.title,
        version="0.1.0",
        description="migscale metrics API (custom.metrics.k8s.io, external.metrics.k8s.io), "
        "Prometheus /metrics, plan, status and the web view.",
        docs_url=None,
        redoc_url=None,
    )
    app.state.api_state = state
    app.state.settings = settings
    install_error_handlers(app)
    prom = PromExport(state)
    app.state.prom = prom

    groups = _api_groups()
    groups_body = dumps(groups)
    group_bodies = {g["name"]: dumps({"kind": "APIGroup", "apiVersion": "v1", **g}) for g in groups["groups"]}

    @app.get("/apis", response_model=schemas.APIGroupList, tags=["discovery"], operation_id="api_groups",
             responses=schemas.ERRORS)
    def _apis() -> Response:
        return _json(groups_body)

    @app.get(f"/apis/{custom.GROUP}", response_model=schemas.APIGroup, tags=["discovery"],
             operation_id="custom_group", responses=schemas.ERRORS)
    def _custom_group() -> Response:
        return _json(group_bodies[custom.GROUP])

    @app.get(f"/apis/{external.GROUP}", response_model=schemas.APIGroup, tags=["discovery"],
             operation_id="external_group", responses=schemas.ERRORS)
    def _external_group() -> Response:
        return _json(group_bodies[external.GROUP])

    app.include_router(custom.router(state))
    app.include_router(external.router(state))

    ok = b'{"status":"ok"}'

    @app.get("/healthz", response_model=schemas.Health, tags=["health"], operation_id="healthz")
    def _healthz() -> Response:
        return _json(ok)

    @app.get("/readyz", response_model=schemas.Health, tags=["health"], operation_id="readyz",
             responses={503: {"model": schemas.StatusModel,
                              "description": "no current picture: no tick yet, the loop stopped, or it is stale"}})
    def _readyz() -> Response:
        ready, why = state.readiness()
        if not ready:
            return status_response(503, why, "ServiceUnavailable")
        return _json(ok)

    @app.get("/metrics", tags=["metrics"], operation_id="metrics",
             responses={200: {"content": {CONTENT_TYPE: {"schema": {"type": "string"}}},
                              "description": "Prometheus text exposition"}})
    def _metrics() -> Response:
        return Response(prom.render(), media_type=CONTENT_TYPE)

    @app.get("/v1/plan", response_model=schemas.PlanBody, tags=["migscale"], operation_id="plan")
    def _plan() -> Response:
        return _json(state.snapshot.plan_body)

    @app.get("/v1/status", tags=["migscale"], operation_id="status",
             responses={200: {"description": "the controller's status (same JSON as `migscale status --json`),"
                              " null before the first tick, and always under `migscale api` (it runs no replicas)",
                              "content": {"application/json": {"schema": {}}}}})
    def _status() -> Response:
        return _json(state.snapshot.status_body)

    @app.get("/v1/history", response_model=schemas.HistoryBody, tags=["migscale"], operation_id="history")
    def _history() -> Response:
        return _json(state.snapshot.history_body)

    if settings.ui:
        ui.mount(app)
    # outermost user middleware: repeated metric queries never reach the router
    app.add_middleware(FastPathMiddleware, state=state)

    def openapi() -> dict[str, Any]:
        if app.openapi_schema:
            return app.openapi_schema
        spec = get_openapi(title=app.title, version=app.version, description=app.description, routes=app.routes)
        # validation errors are answered 400 with a Status (errors.py), never 422
        for path in spec.get("paths", {}).values():
            for op in path.values():
                op.get("responses", {}).pop("422", None)
        for name in ("HTTPValidationError", "ValidationError"):
            spec.get("components", {}).get("schemas", {}).pop(name, None)
        app.openapi_schema = spec
        return spec

    app.openapi = openapi  # type: ignore[method-assign]
    return app
