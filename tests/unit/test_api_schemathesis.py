"""Fuzz the app against its own OpenAPI document: no 5xx, no schema violations.

Schemathesis generates requests for every documented operation (valid and
invalid path parameters, selectors, query strings) and checks each response:
status code documented, content type documented, body valid against the
documented schema, and never a server error. At least 1,000 cases in total.
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
CASES: dict[str, int] = {}
STATUSES: dict[int, int] = {}


@schema.parametrize()
@settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
def test_no_5xx_and_responses_match_schema(case):
    response = case.call_and_validate(checks=CHECKS)
    assert response.status_code < 500
    key = f"{case.operation.method.upper()} {case.operation.path}"
    CASES[key] = CASES.get(key, 0) + 1
    STATUSES[response.status_code] = STATUSES.get(response.status_code, 0) + 1


def test_enough_cases_ran():
    """Runs after the fuzz test (file order); fails when fewer than 1,000 cases were generated."""
    if not CASES:
        pytest.fail("the schemathesis test did not run first (run the whole file)")
    assert sum(CASES.values()) >= 1000, CASES
    # the fuzzing reached the error paths too, not only the happy ones
    assert {200, 400, 404} <= set(STATUSES), STATUSES
