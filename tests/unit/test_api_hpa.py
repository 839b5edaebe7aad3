"""The served replica ratio makes the HPA land on the planner's count.

The HPA math is the control loop's own (``autoscaler.policy.hpa``); the value
goes through the real API as a Quantity string, is parsed back the way the
HPA reads it (milli-units) and fed to the HPA's Pods-metric calculation with
the shipped target ``averageValue: 1``.
"""

from __future__ import annotations

import math

from fastapi.testclient import TestClient

from autoscaler.api import ApiState, create_app
from autoscaler.api.quantity import format_milli, parse_quantity
from autoscaler.api.signals import replica_ratio_milli
from autoscaler.mig.layout import Placement
from autoscaler.policy.hpa import DEFAULT_TOLERANCE, pods_metric_replicas, within_tolerance
from autoscaler.policy.types import ClusterState, Cost, GpuState, ModelSpec, Plan, Replica, ReplicaState

TARGET = 1.0  # the shipped HPA target: type Pods, AverageValue "1"


def in_band(d: int, c: int) -> bool:
    """|d/c - 1| <= tolerance in exact arithmetic (10 * |d - c| <= c for 0.1).

    Inside the band no served value can make the HPA move to d: it needs a
    ratio outside [0.9, 1.1], and ceil(c * ratio) then overshoots d.
    """
    assert DEFAULT_TOLERANCE == 0.1
    return 10 * abs(d - c) <= c


def hpa_reads(quantity: str) -> float:
    """What the HPA sees: ``MilliValue()`` of the Quantity, as milli / 1000."""
    milli = int(parse_quantity(quantity) * 1000)
    return milli / 1000


def hpa_desired(current: int, quantity: str) -> int:
    desired, _reason = pods_metric_replicas(current, [hpa_reads(quantity)] * current, TARGET)
    return desired


def test_equivalence_for_every_small_pair():
    """For c <= 64 pods and d <= 128 planned: HPA -> d, or d is inside the HPA tolerance of c."""
    inside_tolerance = 0
    for c in range(1, 65):
        for d in range(129):
            q = format_milli(replica_ratio_milli(d, c))
            got = hpa_desired(c, q)
            if got != d:
                # only inside the tolerance band: the HPA holds at c, and
                # migscale's own rollout applies such a change (signals.py)
                assert in_band(d, c) and got == c, (c, d, q, got)
                inside_tolerance += 1
    # the caveat is real but small: it only bites from 10 pods up
    assert inside_tolerance > 0
    assert all(not in_band(d, c) for c in range(1, 10) for d in range(129) if d != c)
    assert within_tolerance(1.05) and not within_tolerance(1.2)


def test_naive_rounding_would_be_wrong():
    # 2 of 3: serving round(2/3) = 667m makes the HPA ask for 3 -- the reason for floor
    assert math.ceil(3 * 0.667) == 3
    assert hpa_desired(3, "667m") == 3
    assert hpa_desired(3, format_milli(replica_ratio_milli(2, 3))) == 2


def test_values_stay_just_below_the_integer():
    assert format_milli(replica_ratio_milli(2, 1)) == "1999m"
    assert format_milli(replica_ratio_milli(6, 4)) == "1499m"
    assert format_milli(replica_ratio_milli(7, 10)) == "699m"  # 10 x 0.7 summed in floats is 7.000000000000001
    assert format_milli(replica_ratio_milli(4, 4)) == "1"  # no change: the plain target
    assert format_milli(replica_ratio_milli(0, 4)) == "0"
    assert replica_ratio_milli(3, 0) is None  # no pod to carry the value


def test_through_the_api_for_many_deployments():
    """End to end: one Deployment per (c, d) pair, values read over HTTP."""
    pairs = [(c, d) for c in (1, 2, 3, 5, 7, 9) for d in (0, 1, 2, 4, 5, 8, 13, 21)]
    models, replicas, gpus, desired = [], [], [], {}
    for i, (c, d) in enumerate(pairs):
        name = f"m{i}"
        models.append(ModelSpec(name, {"1g.10gb": 10.0}, ("1g.10gb",), max_replicas=64))
        desired[(name, "1g.10gb")] = d
        for k in range(c):
            gid = f"n/{len(gpus)}"
            gpus.append(GpuState(gid, "n", "A100-SXM4-80GB", (Placement(0, "1g.10gb"),)))
            replicas.append(Replica(f"{name}-{k}", name, "1g.10gb", gid, 0,
                                    ReplicaState.STARTING if k % 2 else ReplicaState.READY))
    s = ApiState()
    s.update(None, Plan(1e9, desired, (), {}, (), {}, Cost(), {}), ClusterState(tuple(gpus), tuple(replicas)),
             models, t_s=1e9)
    client = TestClient(create_app(s))
    for i, (c, d) in enumerate(pairs):
        body = client.get(
            "/apis/custom.metrics.k8s.io/v1beta2/namespaces/default/pods/*/migscale_replica_ratio",
            params={"labelSelector": f"migscale.io/deployment=m{i}-1g-10gb"},
        ).json()
        values = [it["value"] for it in body["items"]]
        assert len(values) == c  # every pod the HPA counts carries the value
        got, _ = pods_metric_replicas(c, [hpa_reads(v) for v in values], TARGET)
        assert got == d or (got == c and in_band(d, c)), (c, d, values)
        # the Object metric gives the count itself: ceil(d / 1) with target averageValue 1
        obj = client.get(
            f"/apis/custom.metrics.k8s.io/v1beta2/namespaces/default/deployments.apps/m{i}-1g-10gb/"
            "migscale_desired_replicas"
        ).json()
        assert math.ceil(hpa_reads(obj["items"][0]["value"]) / TARGET) == d


def test_a_pods_metric_query_with_the_rendered_deployments_selector_finds_its_pods():
    """This API and the rendered Deployment agree on the pod selector an HPA-style Pods query sends."""
    from autoscaler.act.kubernetes.render import RenderConfig, deployment
    from autoscaler.api.synthetic import demo_models, demo_tick

    spec = demo_models()[0]  # resnet
    dep = deployment(spec, "1g.10gb", 1, RenderConfig())
    name = "migscale_replica_ratio"
    assert dep["metadata"]["name"] == "resnet-1g-10gb"
    # what the HPA controller sends: the Deployment's spec.selector as a string
    selector = ",".join(f"{k}={v}" for k, v in sorted(dep["spec"]["selector"]["matchLabels"].items()))
    s = ApiState()
    obs, plan, cluster = demo_tick(1e9)
    s.update(obs, plan, cluster, demo_models())
    body = TestClient(create_app(s)).get(
        f"/apis/custom.metrics.k8s.io/v1beta2/namespaces/default/pods/*/{name}", params={"labelSelector": selector}
    ).json()
    assert [i["describedObject"]["name"] for i in body["items"]] == ["resnet-0"]
    c = len(body["items"])
    got, _ = pods_metric_replicas(c, [hpa_reads(i["value"]) for i in body["items"]], float(parse_quantity("1")))
    assert got == plan.desired[("resnet", "1g.10gb")] == 2
