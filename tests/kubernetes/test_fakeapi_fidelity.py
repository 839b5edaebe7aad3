"""The emulated API server answers as kube-apiserver does where migscale could tell the difference.

Each test sends the request over HTTP, as any client would, and reads the
Status the server answers. The upstream rule each one follows is named in
the test (paths in kubernetes/kubernetes).
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import Any

from k8s_helpers import NS

MERGE = "application/merge-patch+json"


def call(fake, method: str, path: str, body: Any = None, ctype: str = "application/json") -> tuple[int, dict]:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(fake.url + path, data=data, method=method,
                                 headers={"Content-Type": ctype, "Accept": "application/json",
                                          "User-Agent": "fidelity-test/1"})
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.status, json.loads(resp.read() or b"{}")
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"{}")


def causes(st: dict) -> list[tuple[str, str]]:
    return [(c.get("reason"), c.get("field")) for c in (st.get("details") or {}).get("causes") or []]


# ---------------------------------------------------------------- 1. eviction against a budget
# pkg/registry/core/pod/storage/eviction.go


def running_pod(name: str, *, ready: bool, phase: str = "Running", labels: dict | None = None) -> dict:
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": NS, "labels": labels or {"app": "x"}},
            "spec": {"nodeName": "n1", "containers": [{"name": "c", "image": "x:1"}]},
            "status": {"phase": phase, "conditions": [{"type": "Ready", "status": "True" if ready else "False"}]}}


def budget(name: str = "x", *, policy: str | None = None, desired: int, current: int, allowed: int,
           observed: int = 1, selector: dict | None = None) -> dict:
    spec: dict = {"maxUnavailable": 1, "selector": selector if selector is not None else {"matchLabels": {"app": "x"}}}
    if policy:
        spec["unhealthyPodEvictionPolicy"] = policy
    return {"apiVersion": "policy/v1", "kind": "PodDisruptionBudget", "metadata": {"name": name, "namespace": NS},
            "spec": spec,
            "status": {"observedGeneration": observed, "desiredHealthy": desired, "currentHealthy": current,
                       "disruptionsAllowed": allowed, "expectedPods": 2}}


def evict(fake, pod: str) -> tuple[int, dict]:
    return call(fake, "POST", f"/api/v1/namespaces/{NS}/pods/{pod}/eviction",
                {"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": pod, "namespace": NS}})


def test_an_unready_pod_is_charged_to_a_budget_that_wants_no_healthy_pod(fake):
    # IfHealthyBudget (the default) lets an unready pod go uncharged only while desiredHealthy > 0;
    # with desiredHealthy 0 it falls to checkAndDecrement, and disruptionsAllowed 0 is 429
    fake.put_object(running_pod("p", ready=False))
    fake.put_object(budget(desired=0, current=0, allowed=0))
    code, st = evict(fake, "p")
    assert code == 429 and st["reason"] == "TooManyRequests"
    assert "needs 0 healthy pods and has 0 currently" in st["details"]["causes"][0]["message"]
    assert fake.get("Pod", "p") is not None


def test_always_allow_evicts_an_unready_pod_without_charging_the_budget(fake):
    fake.put_object(running_pod("p", ready=False))
    fake.put_object(running_pod("q", ready=True))
    # the budget is not met (1 of 2 healthy) and its status is not yet observed: only AlwaysAllow lets p go
    fake.put_object(budget(policy="AlwaysAllow", desired=2, current=1, allowed=0, observed=0))
    code, _ = evict(fake, "p")
    assert code == 201 and fake.get("Pod", "p") is None
    st = fake.get("PodDisruptionBudget", "x")["status"]
    assert st["disruptionsAllowed"] == 0 and "disruptedPods" not in st  # not charged
    code, st = evict(fake, "q")  # a Ready pod is guarded whatever the policy
    assert code == 429 and "still being processed" in st["details"]["causes"][0]["message"]


def test_if_healthy_budget_lets_an_unready_pod_go_only_while_the_budget_is_met(fake):
    fake.put_object(running_pod("p", ready=False))
    fake.put_object(budget(policy="IfHealthyBudget", desired=2, current=1, allowed=0))
    assert evict(fake, "p")[0] == 429  # not met
    fake.put_object(budget(policy="IfHealthyBudget", desired=2, current=2, allowed=0))
    assert evict(fake, "p")[0] == 201  # met: goes, uncharged
    assert "disruptedPods" not in fake.get("PodDisruptionBudget", "x")["status"]


def test_a_pending_pod_goes_without_looking_at_its_budgets(fake):
    # canIgnorePDB comes before the budgets are listed: two budgets (500 otherwise) do not matter
    fake.put_object(running_pod("p", ready=False, phase="Pending"))
    fake.put_object(budget("a", desired=1, current=0, allowed=0))
    fake.put_object(budget("b", desired=1, current=0, allowed=0))
    assert evict(fake, "p")[0] == 201 and fake.get("Pod", "p") is None


def test_the_unhealthy_pod_eviction_policy_is_validated(fake):
    body = budget(policy="AlwaysAllow", desired=0, current=0, allowed=0)
    body.pop("status")
    assert call(fake, "POST", f"/apis/policy/v1/namespaces/{NS}/poddisruptionbudgets", body)[0] == 201
    body["metadata"]["name"] = "bad"
    body["spec"]["unhealthyPodEvictionPolicy"] = "Sometimes"
    code, st = call(fake, "POST", f"/apis/policy/v1/namespaces/{NS}/poddisruptionbudgets", body)
    assert code == 422 and causes(st) == [("FieldValueNotSupported", "spec.unhealthyPodEvictionPolicy")]


# ---------------------------------------------------------------- 2. what an update may change
# pkg/apis/core/validation/validation.go (ValidatePodUpdate, validateUpgradeDowngradeClusterIPs),
# pkg/registry/apps/deployment/strategy.go, staging/.../apiserver/pkg/endpoints/handlers/rest.go (checkName)

POD = f"/api/v1/namespaces/{NS}/pods"


def gated_pod() -> dict:
    term = {"matchExpressions": [{"key": "nvidia.com/gpu.product", "operator": "In", "values": ["A100"]}]}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "g", "namespace": NS},
            "spec": {"schedulingGates": [{"name": "migscale.io/placement"}], "nodeSelector": {"a": "b"},
                     "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
                         "nodeSelectorTerms": [term]}}},
                     "containers": [{"name": "c", "image": "x:1"}]}}


def hostname_affinity(*exprs: dict) -> dict:
    first = {"key": "nvidia.com/gpu.product", "operator": "In", "values": ["A100"]}
    return {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": [{"matchExpressions": [first, *exprs]}]}}}


def test_a_pod_update_may_change_only_what_upstream_allows(fake):
    assert call(fake, "POST", POD, gated_pod())[0] == 201
    host = {"key": "kubernetes.io/hostname", "operator": "In", "values": ["n1"]}
    # while gated: a gate may not be added, node affinity only narrowed, nodeSelector only extended
    code, st = call(fake, "PATCH", f"{POD}/g", {"spec": {"schedulingGates": [
        {"name": "migscale.io/placement"}, {"name": "other"}]}}, MERGE)
    assert code == 422 and causes(st) == [("FieldValueForbidden", "spec.schedulingGates[1].name")]
    assert st["reason"] == "Invalid" and st["details"]["kind"] == "Pod" and st["message"].startswith('Pod "g" is invalid')
    code, st = call(fake, "PATCH", f"{POD}/g", {"spec": {"affinity": {"nodeAffinity": {
        "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [{"matchExpressions": [host]}]}}}}},
        MERGE)  # the old requirement replaced, not kept
    assert code == 422 and causes(st) == [
        ("FieldValueInvalid", "spec.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms[0]")]
    code, st = call(fake, "PATCH", f"{POD}/g", {"spec": {"nodeSelector": {"a": "c"}}}, MERGE)
    assert code == 422 and causes(st) == [("FieldValueInvalid", "spec.nodeSelector")]
    # migscale's placement: the gate lifted and the node added to every required term, in one patch
    code, got = call(fake, "PATCH", f"{POD}/g", {"spec": {"schedulingGates": None, "affinity": hostname_affinity(host),
                                                          "nodeSelector": {"a": "b", "extra": "y"}}}, MERGE)
    assert code == 200 and "schedulingGates" not in got["spec"], got
    # no longer gated: the scheduling directives are fixed; an image and activeDeadlineSeconds still change
    code, st = call(fake, "PATCH", f"{POD}/g", {"spec": {"nodeSelector": {"more": "z"}}}, MERGE)
    assert code == 422 and causes(st) == [("FieldValueForbidden", "spec")]
    assert "pod updates may not change fields other than" in st["message"]
    code, st = call(fake, "PATCH", f"{POD}/g", {"spec": {"schedulingGates": [{"name": "back"}]}}, MERGE)
    assert code == 422 and ("FieldValueForbidden", "spec.schedulingGates[0].name") in causes(st)
    code, _ = call(fake, "PATCH", f"{POD}/g", {"spec": {"containers": [{"name": "c", "image": "x:2"}],
                                                       "activeDeadlineSeconds": 600}}, MERGE)
    assert code == 200
    code, st = call(fake, "PATCH", f"{POD}/g", {"spec": {"activeDeadlineSeconds": 900}}, MERGE)
    assert code == 422 and causes(st) == [("FieldValueInvalid", "spec.activeDeadlineSeconds")]
    code, st = call(fake, "PATCH", f"{POD}/g", {"spec": {"containers": [
        {"name": "c", "image": "x:2"}, {"name": "d", "image": "y:1"}]}}, MERGE)
    assert code == 422 and causes(st) == [("FieldValueForbidden", "spec.containers")]


def test_identity_fields_cannot_change(fake):
    assert call(fake, "POST", POD, gated_pod())[0] == 201
    live = fake.get("Pod", "g")
    code, st = call(fake, "PUT", f"{POD}/g", {**live, "metadata": {**live["metadata"], "uid": "another"}})
    assert code == 422 and causes(st) == [("FieldValueInvalid", "metadata.uid")]
    code, st = call(fake, "PATCH", f"{POD}/g", {"metadata": {"name": "h"}}, MERGE)
    assert code == 400 and "does not match the name on the URL" in st["message"]
    code, st = call(fake, "PUT", f"{POD}/g", {**live, "metadata": {**live["metadata"], "namespace": "other"}})
    assert code == 400 and "does not match the namespace on the request" in st["message"]
    no_uid = {**live, "metadata": {k: v for k, v in live["metadata"].items() if k != "uid"}}
    assert call(fake, "PUT", f"{POD}/g", no_uid)[0] == 200  # an unset uid is the stored one
    assert fake.get("Pod", "g")["metadata"]["uid"] == live["metadata"]["uid"]


def test_a_deployment_selector_is_immutable(fake):
    labels = {"app": "d"}
    dep = {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "d", "namespace": NS},
           "spec": {"selector": {"matchLabels": labels},
                    "template": {"metadata": {"labels": labels}, "spec": {"containers": [{"name": "c", "image": "x:1"}]}}}}
    path = f"/apis/apps/v1/namespaces/{NS}/deployments"
    assert call(fake, "POST", path, dep)[0] == 201
    code, st = call(fake, "PATCH", f"{path}/d", {"spec": {"selector": {"matchLabels": {"app": "d", "v": "2"}},
                                                          "template": {"metadata": {"labels": {"app": "d", "v": "2"}}}}},
                    MERGE)
    assert code == 422 and causes(st) == [("FieldValueInvalid", "spec.selector")]
    assert st["message"].startswith('Deployment.apps "d" is invalid: spec.selector: Invalid value: ')
    assert st["message"].endswith("field is immutable") and st["details"]["group"] == "apps"
    assert call(fake, "PATCH", f"{path}/d", {"spec": {"template": {"metadata": {"labels": {"app": "d", "v": "2"}}}}},
                MERGE)[0] == 200  # the template may change


def test_a_service_keeps_its_cluster_ip(fake):
    path = f"/api/v1/namespaces/{NS}/services"
    svc = {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "s", "namespace": NS},
           "spec": {"selector": {"app": "s"}, "ports": [{"port": 80}]}}
    code, created = call(fake, "POST", path, svc)
    assert code == 201 and created["spec"]["clusterIP"]
    # a replace that leaves the address out keeps it (the Service storage fills it in before validating)
    code, replaced = call(fake, "PUT", f"{path}/s", {**svc, "metadata": {**svc["metadata"],
                                                                      "resourceVersion": created["metadata"]["resourceVersion"]},
                                                    "spec": {**svc["spec"], "ports": [{"port": 81}]}})
    assert code == 200 and replaced["spec"]["clusterIP"] == created["spec"]["clusterIP"]
    assert replaced["spec"]["clusterIPs"] == created["spec"]["clusterIPs"]
    code, st = call(fake, "PATCH", f"{path}/s", {"spec": {"clusterIP": "10.96.99.99", "clusterIPs": ["10.96.99.99"]}}, MERGE)
    assert code == 422 and causes(st) == [("FieldValueInvalid", "spec.clusterIPs[0]")]


# ---------------------------------------------------------------- 3. field selectors
# pkg/apis/core/v1/conversion.go (the labels each kind supports), pkg/registry/core/*/strategy.go
# (ToSelectableFields), staging/.../apimachinery/pkg/runtime/conversion.go (DefaultMetaV1FieldSelectorConversion)


def names(fake, path: str) -> list[str]:
    code, body = call(fake, "GET", path)
    assert code == 200, body
    return sorted(i["metadata"]["name"] for i in body["items"])


def test_a_field_label_a_resource_does_not_support_is_400(fake):
    for path, msg in ((f"{POD}?fieldSelector=spec.priority%3D1", "field label not supported: spec.priority"),
                      ("/api/v1/nodes?fieldSelector=metadata.namespace%3Ddefault",
                       "field label not supported: metadata.namespace"),
                      (f"/api/v1/namespaces/{NS}/configmaps?fieldSelector=data.k%3Dv",
                       '"data.k" is not a known field selector: only "metadata.name", "metadata.namespace"'),
                      (f"/apis/migscale.io/v1alpha1/namespaces/{NS}/migmodels?fieldSelector=spec.model%3Dx",
                       '"spec.model" is not a known field selector'),
                      (f"{POD}?watch=1&fieldSelector=spec.priority%3D1", "field label not supported: spec.priority")):
        code, st = call(fake, "GET", path)
        assert code == 400 and st["reason"] == "BadRequest" and msg in st["message"], (path, code, st)
    assert names(fake, f"{POD}?fieldSelector=spec.nodeName%3Dn1,status.phase!%3DFailed") == []


def test_a_boolean_field_is_compared_as_true_or_false_and_missing_is_false(fake):
    fake.put_object({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "plain"}, "spec": {}})
    fake.put_object({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "open"}, "spec": {"unschedulable": False}})
    fake.put_object({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "cordoned"}, "spec": {"unschedulable": True}})
    assert names(fake, "/api/v1/nodes?fieldSelector=spec.unschedulable%3Dfalse") == ["open", "plain"]
    assert names(fake, "/api/v1/nodes?fieldSelector=spec.unschedulable%3Dtrue") == ["cordoned"]
    assert names(fake, "/api/v1/nodes?fieldSelector=spec.unschedulable!%3Dtrue") == ["open", "plain"]
    assert names(fake, "/api/v1/nodes?fieldSelector=spec.unschedulable%3DTrue") == []  # compared as text
    fake.put_object(running_pod("p", ready=True))
    assert names(fake, f"{POD}?fieldSelector=spec.hostNetwork%3Dfalse") == ["p"]
    assert names(fake, f"{POD}?fieldSelector=spec.nodeName%3Dn1") == ["p"]


# ---------------------------------------------------------------- 4. Events
# pkg/apis/core/validation/events.go (legacyValidateEvent, ValidateEventCreate)

EVENTS = "/apis/events.k8s.io/v1/namespaces/{ns}/events"


def v1_event(name: str, ns: str, regarding: dict, **over: Any) -> dict:
    body = {"apiVersion": "events.k8s.io/v1", "kind": "Event", "metadata": {"name": name, "namespace": ns},
            "eventTime": "2026-01-01T00:00:00.000000Z", "reportingController": "migscale.io/controller",
            "reportingInstance": "ctl-1", "action": "Repartition", "reason": "Repartitioned", "note": "n",
            "type": "Normal", "regarding": regarding}
    body.update(over)
    return {k: v for k, v in body.items() if v is not None}


NODE = {"apiVersion": "v1", "kind": "Node", "name": "n1", "uid": "u1"}


def test_an_event_about_a_node_goes_to_default_or_kube_system(fake):
    for ns in ("default", "kube-system"):
        assert call(fake, "POST", EVENTS.format(ns=ns), v1_event("n1.a", ns, NODE))[0] == 201
    code, st = call(fake, "POST", EVENTS.format(ns="migscale"), v1_event("n1.b", "migscale", NODE))
    assert code == 422 and causes(st) == [("FieldValueInvalid", "involvedObject.namespace")]
    assert st["message"].startswith('Event.events.k8s.io "n1.b" is invalid: involvedObject.namespace')


def test_an_event_needs_its_reporting_controller_and_instance(fake):
    for missing, fld in (("reportingController", "reportingController"), ("reportingInstance", "reportingInstance"),
                         ("action", "action")):
        code, st = call(fake, "POST", EVENTS.format(ns=NS), v1_event(f"e-{missing.lower()}", NS, NODE, **{missing: None}))
        assert code == 422 and ("FieldValueRequired", fld) in causes(st), (missing, st)
    code, st = call(fake, "POST", EVENTS.format(ns=NS), v1_event("e-ctl", NS, NODE, reportingController="Not Qualified!"))
    assert code == 422 and ("FieldValueInvalid", "reportingController") in causes(st)


def test_the_namespace_match_is_checked_only_for_a_legacy_event(fake):
    pod_ref = {"apiVersion": "v1", "kind": "Pod", "name": "p", "namespace": "team-a"}
    # eventTime set: upstream checks only the cluster-scoped case, so another namespace is accepted
    assert call(fake, "POST", EVENTS.format(ns=NS), v1_event("p.a", NS, pod_ref))[0] == 201
    legacy = {"apiVersion": "v1", "kind": "Event", "metadata": {"name": "p.b", "namespace": NS},
              "involvedObject": {**pod_ref}, "reason": "R", "message": "m", "type": "Normal"}
    code, st = call(fake, "POST", f"/api/v1/namespaces/{NS}/events", legacy)
    assert code == 422 and causes(st) == [("FieldValueInvalid", "involvedObject.namespace")]
    legacy["metadata"]["namespace"] = "team-a"
    assert call(fake, "POST", "/api/v1/namespaces/team-a/events", legacy)[0] == 201


def test_an_event_series_is_validated_and_the_rest_is_immutable(fake):
    assert call(fake, "POST", EVENTS.format(ns=NS), v1_event("s", NS, NODE))[0] == 201
    path = EVENTS.format(ns=NS) + "/s"
    assert call(fake, "PATCH", path, {"series": {"count": 2, "lastObservedTime": "2026-01-01T00:01:00.000000Z"}},
                MERGE)[0] == 200
    code, st = call(fake, "PATCH", path, {"series": {"count": 1, "lastObservedTime": "2026-01-01T00:02:00.000000Z"}}, MERGE)
    assert code == 422 and causes(st) == [("FieldValueInvalid", "series.count")]
    code, st = call(fake, "PATCH", path, {"note": "changed"}, MERGE)
    assert code == 422 and causes(st) == [("FieldValueInvalid", "message")]
