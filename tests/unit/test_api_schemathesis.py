"""Fuzz the app against its own OpenAPI document: no 5xx, no schema violations.

Schemathesis generates requests for every documented operation (valid and
invalid path parameters, selectors, query strings) and checks each response:
status code documented, content type documented, body valid against the
documented schema, and never a server error. Each operation's cases are
counted as its own test ends (pytest-xdist may run operations on different
workers): at least 100 for an operation with parameters, which must reach an
error path (400 or 404), and a 200 from each operation without.
"""

from __future__ import annotations

import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from autoscaler.api import ApiState, create_app
from autoscaler.api.synthetic import demo_models, demo_tick

_state = ApiState()
_app = create_app(_state)
_obs, _plan, _cluster = demo_tick(1_800_000_000.0)
_state.update(_obs, _plan, _cluster, demo_models(), status={"models": [{"name": "resnet", "slo": {"p99_ms": 50}}]})

schema = schemathesis.openapi.from_asgi("/openapi.json", _app)
CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance, response_schema_conformance]
SEEN: dict[str, list[int]] = {}  # this test item's operation: the status of each case


@pytest.fixture
def per_operation():
    SEEN.clear()
    yield
    assert len(SEEN) == 1, SEEN
    (key, statuses), = SEEN.items()
    if "{" in key:
        assert len(statuses) >= 100, (key, len(statuses))
        assert {400, 404} & set(statuses), (key, sorted(set(statuses)))
    else:
        assert 200 in statuses, (key, sorted(set(statuses)))


@schema.parametrize()
@settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
@pytest.mark.usefixtures("per_operation")
def test_no_5xx_and_responses_match_schema(case):
    response = case.call_and_validate(checks=CHECKS)
    assert response.status_code < 500
    SEEN.setdefault(f"{case.operation.method.upper()} {case.operation.path}", []).append(response.status_code)
