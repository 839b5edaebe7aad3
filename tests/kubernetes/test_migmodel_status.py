"""The status a MigModel gets from one model's numbers: conditions, last decision, no invented zeros."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import yaml
from crdvalidate import CrdValidator

from autoscaler.act.kubernetes.crd import build_crd
from autoscaler.act.kubernetes.migmodel import ModelReport, migmodel_status
from autoscaler.policy.types import Reason

EXAMPLE = yaml.safe_load((Path(__file__).resolve().parents[2] / "k8s/examples/migmodel-resnet.yaml").read_text())
T0 = 1_767_225_600.0  # 2026-01-01T00:00:00Z

BASE = ModelReport(
    generation=3,
    slo_p99_ms=150,
    min_replicas=1,
    ready={"1g.10gb": 2, "3g.40gb": 1},
    desired={"1g.10gb": 2, "3g.40gb": 1},
    served_rps=120.04,
    p99_ms=97.26,
    reasons=(Reason.SCALE_UP_DEMAND, Reason.PROFILE_EFFICIENCY),
)


def conditions(status: dict) -> dict[str, dict]:
    return {c["type"]: c for c in status["conditions"]}


@pytest.fixture(scope="module")
def validator() -> CrdValidator:
    return CrdValidator(build_crd())


def test_status_fills_every_field_and_fits_the_crd(validator: CrdValidator):
    status = migmodel_status(BASE, None, T0)
    assert validator.validate({**EXAMPLE, "status": status}) == []
    assert status["observedGeneration"] == 3
    assert (status["readyReplicas"], status["desiredReplicas"]) == (3, 3)
    assert status["replicas"] == [{"profile": "1g.10gb", "ready": 2, "desired": 2},
                                  {"profile": "3g.40gb", "ready": 1, "desired": 1}]
    assert status["profiles"] == "1g.10gb 2/2, 3g.40gb 1/1"
    assert (status["servedRps"], status["p99Ms"]) == (120.0, 97.3)
    assert status["lastDecision"] == {"time": "2026-01-01T00:00:00Z", "desiredReplicas": 3,
                                      "reason": "ScaleUpDemand",
                                      "message": "3 replicas: ScaleUpDemand, ProfileEfficiency"}
    c = conditions(status)
    assert list(c) == ["Ready", "ScalingLimited", "SLOMet", "ConfigValid"]
    assert (c["Ready"]["status"], c["Ready"]["reason"]) == ("True", "MinimumReplicasReady")
    assert (c["ScalingLimited"]["status"], c["ScalingLimited"]["reason"]) == ("False", "DesiredWithinRange")
    assert (c["SLOMet"]["status"], c["SLOMet"]["reason"]) == ("True", "WithinSLO")
    assert (c["ConfigValid"]["status"], c["ConfigValid"]["reason"]) == ("True", "SpecAccepted")
    assert all(x["observedGeneration"] == 3 and x["lastTransitionTime"] == "2026-01-01T00:00:00Z" for x in c.values())


def test_missing_numbers_stay_missing(validator: CrdValidator):
    status = migmodel_status(dataclasses.replace(BASE, served_rps=None, p99_ms=None), None, T0)
    assert "servedRps" not in status and "p99Ms" not in status  # absent, never 0
    slo = conditions(status)["SLOMet"]
    assert (slo["status"], slo["reason"]) == ("Unknown", "MetricsUnavailable")
    assert validator.validate({**EXAMPLE, "status": status}) == []


@pytest.mark.parametrize(
    ("change", "kind", "status", "reason"),
    [
        ({"p99_ms": 212.0}, "SLOMet", "False", "SLOViolated"),
        ({"ready": {"1g.10gb": 0}}, "Ready", "False", "MinimumReplicasUnavailable"),
        ({"ready": {}, "desired": {}, "min_replicas": 0}, "Ready", "False", "ScaledToZero"),
        ({"min_replicas": 4}, "Ready", "False", "MinimumReplicasUnavailable"),
        ({"reasons": (Reason.MAX_REPLICAS,)}, "ScalingLimited", "True", "TooManyReplicas"),
        ({"reasons": (Reason.MIN_REPLICAS,)}, "ScalingLimited", "True", "TooFewReplicas"),
        ({"reasons": (Reason.RATE_LIMITED, Reason.CHURN_BUDGET)}, "ScalingLimited", "True", "RateLimited"),
        ({"shortfall_rps": 35.0, "reasons": (Reason.MAX_REPLICAS,)}, "ScalingLimited", "True", "InsufficientCapacity"),
        ({"config_problems": ("spec.profiles[0]: not valid for any GPU product in the cluster, got '1g.5gb'",)},
         "ConfigValid", "False", "InvalidSpec"),
    ],
)
def test_conditions(validator: CrdValidator, change: dict, kind: str, status: str, reason: str):
    body = migmodel_status(dataclasses.replace(BASE, **change), None, T0)
    c = conditions(body)[kind]
    assert (c["status"], c["reason"]) == (status, reason), c
    assert validator.validate({**EXAMPLE, "status": body}) == []
    if reason == "InsufficientCapacity":
        assert "35.0 req/s unserved" in c["message"] and "max_replicas" in c["message"]
    if reason == "InvalidSpec":
        assert "'1g.5gb'" in c["message"] and "last valid spec stays" in c["message"]


def test_times_move_only_when_something_changes():
    first = migmodel_status(BASE, None, T0)
    again = migmodel_status(BASE, first, T0 + 30)
    assert again == first  # same numbers, same body: the caller may skip the write
    worse = migmodel_status(dataclasses.replace(BASE, p99_ms=300.0), again, T0 + 60)
    c = conditions(worse)
    assert c["SLOMet"]["lastTransitionTime"] == "2026-01-01T00:01:00Z"
    assert c["Ready"]["lastTransitionTime"] == "2026-01-01T00:00:00Z"
    assert worse["lastDecision"] == first["lastDecision"]  # the count did not change
    up = migmodel_status(dataclasses.replace(BASE, desired={"1g.10gb": 4, "3g.40gb": 1}), worse, T0 + 90)
    assert up["lastDecision"]["time"] == "2026-01-01T00:01:30Z"
    assert up["lastDecision"]["message"].startswith("3 -> 5 replicas")


def test_a_hand_edited_status_does_not_break_the_next_write(validator: CrdValidator):
    broken = {"lastDecision": {"desiredReplicas": "many"}, "conditions": ["nonsense", {"type": "Ready"}]}
    body = migmodel_status(BASE, broken, T0)
    assert validator.validate({**EXAMPLE, "status": body}) == []
    assert body["lastDecision"]["desiredReplicas"] == 3
