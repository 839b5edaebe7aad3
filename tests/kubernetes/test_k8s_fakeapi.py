"""The emulated API server follows the documented behaviour the backend relies on (docs/kubernetes.md)."""

from __future__ import annotations

import threading

import pytest
from k8s_helpers import NS, wait_until

from autoscaler.act.kubernetes.client import Expired, KubeError


def cm(name: str, labels: dict | None = None) -> dict:
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name, "namespace": NS, "labels": labels or {}},
            "data": {"k": "v"}}


def watch_events(rest, rv: str, n: int, *, bookmark: bool = False, **kw) -> list[dict]:
    """Events of one watch until ``n`` changes (and, with ``bookmark``, a bookmark after them)."""
    out: list[dict] = []

    def run() -> None:
        try:
            for ev in rest.watch("v1", "ConfigMap", NS, rv, timeout_s=3, **kw):
                out.append(ev)
                if sum(e["type"] != "BOOKMARK" for e in out) >= n and (not bookmark or ev["type"] == "BOOKMARK"):
                    return
        except KubeError as exc:
            out.append({"type": "ERROR", "error": exc})

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return out, t


def test_watch_lists_then_streams_and_sends_bookmarks(fake, connect):
    rest = connect()
    rest.create(cm("a"))
    items, rv = rest.list_at("v1", "ConfigMap", NS)
    assert [i["metadata"]["name"] for i in items] == ["a"]
    out, t = watch_events(rest, rv, 2, bookmark=True)
    rest.create(cm("b"))
    rest.merge_patch("v1", "ConfigMap", NS, "b", {"data": {"k": "w"}})
    t.join(5)
    kinds = [e["type"] for e in out]
    changes = [e for e in out if e["type"] != "BOOKMARK"]
    assert [e["type"] for e in changes][:2] == ["ADDED", "MODIFIED"] and changes[0]["object"]["metadata"]["name"] == "b"
    assert "BOOKMARK" in kinds  # bookmarks every 0.1 s in these fixtures
    # the last bookmark comes after both changes (one sent before them, on a slow create, carries an older version)
    bm = [e for e in out if e["type"] == "BOOKMARK"][-1]["object"]
    assert set(bm["metadata"]) == {"resourceVersion"} and int(bm["metadata"]["resourceVersion"]) >= int(rv) + 2


def test_watch_from_a_version_the_server_no_longer_holds_is_410_expired(fake, connect):
    rest = connect()
    rest.create(cm("a"))
    _, rv = rest.list_at("v1", "ConfigMap", NS)
    rest.create(cm("b"))
    fake.expire_history("ConfigMap")  # compaction: the window now starts after b
    with pytest.raises(Expired) as exc:
        list(rest.watch("v1", "ConfigMap", NS, rv, timeout_s=2))
    assert exc.value.status == 410 and "too old resource version" in str(exc.value)


def test_a_watch_sees_objects_enter_and_leave_its_selector(fake, connect):
    rest = connect()
    rest.create(cm("a", {"team": "x"}))
    _, rv = rest.list_at("v1", "ConfigMap", NS, label_selector="team=x")
    out, t = watch_events(rest, rv, 2, label_selector="team=x")
    rest.merge_patch("v1", "ConfigMap", NS, "a", {"metadata": {"labels": {"team": "y"}}})
    rest.merge_patch("v1", "ConfigMap", NS, "a", {"metadata": {"labels": {"team": "x"}}})
    t.join(5)
    assert [e["type"] for e in out if e["type"] != "BOOKMARK"][:2] == ["DELETED", "ADDED"]


def test_status_subresource_and_generation(fake, connect):
    rest = connect()
    dep = {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "d", "namespace": NS},
           "spec": {"selector": {"matchLabels": {"a": "b"}},
                    "template": {"metadata": {"labels": {"a": "b"}}, "spec": {"containers": [{"name": "c", "image": "x:1"}]}}}}
    live = rest.create(dep)
    # defaulting: what the API server fills in before validation
    assert live["spec"]["replicas"] == 1 and live["spec"]["strategy"]["rollingUpdate"]["maxSurge"] == "25%"
    assert live["spec"]["template"]["spec"]["containers"][0]["imagePullPolicy"] == "IfNotPresent"
    assert live["metadata"]["generation"] == 1
    live["status"] = {"replicas": 9}
    live = rest.replace(live)
    assert "status" not in live or live["status"].get("replicas") != 9  # main resource: status ignored
    rest.request("PUT", "/apis/apps/v1/namespaces/default/deployments/d/status",
                 body={**live, "status": {"replicas": 3}, "spec": {**live["spec"], "replicas": 7}})
    got = rest.get("apps/v1", "Deployment", NS, "d")
    assert got["status"]["replicas"] == 3 and got["spec"]["replicas"] == 1  # status: nothing else changes
    assert got["metadata"]["generation"] == 1
    rest.patch_scale("apps/v1", "Deployment", NS, "d", 4)
    assert rest.get("apps/v1", "Deployment", NS, "d")["metadata"]["generation"] == 2  # spec changed


def test_owner_references_are_garbage_collected_or_orphaned(fake, connect):
    rest = connect()
    owner = rest.create(cm("owner"))
    ref = {"apiVersion": "v1", "kind": "ConfigMap", "name": "owner", "uid": owner["metadata"]["uid"]}
    for n in ("dep-1", "dep-2"):
        rest.create({**cm(n), "metadata": {**cm(n)["metadata"], "ownerReferences": [ref]}})
    other = rest.create(cm("other-owner"))
    both = [ref, {"apiVersion": "v1", "kind": "ConfigMap", "name": "other-owner", "uid": other["metadata"]["uid"]}]
    rest.create({**cm("dep-3"), "metadata": {**cm("dep-3")["metadata"], "ownerReferences": both}})
    rest.delete("v1", "ConfigMap", NS, "owner")
    assert fake.get("ConfigMap", "dep-1") is None and fake.get("ConfigMap", "dep-2") is None
    kept = fake.get("ConfigMap", "dep-3")  # another owner is still there: kept, the dead reference dropped
    assert [r["name"] for r in kept["metadata"]["ownerReferences"]] == ["other-owner"]
    rest.request("DELETE", "/api/v1/namespaces/default/configmaps/other-owner",
                 body={"kind": "DeleteOptions", "apiVersion": "v1", "propagationPolicy": "Orphan"})
    assert fake.get("ConfigMap", "dep-3")["metadata"]["ownerReferences"] == []


def test_eviction_is_checked_against_the_disruption_budget(cluster, connect):
    fake = cluster.fake
    cluster.add_nodes(1, {"1g.10gb": 7})
    rest = connect()
    labels = {"app": "x"}
    rest.create({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "x", "namespace": NS},
                 "spec": {"replicas": 2, "selector": {"matchLabels": labels},
                          "template": {"metadata": {"labels": labels}, "spec": {"containers": [{"name": "c", "image": "x:1"}]}}}})
    rest.create({"apiVersion": "policy/v1", "kind": "PodDisruptionBudget", "metadata": {"name": "x", "namespace": NS},
                 "spec": {"maxUnavailable": 1, "selector": {"matchLabels": labels}}})
    pdb = wait_until(lambda: (p := fake.get("PodDisruptionBudget", "x")) and p.get("status", {}).get("currentHealthy") == 2 and p)
    assert pdb["status"]["disruptionsAllowed"] == 1 and pdb["status"]["expectedPods"] == 2
    first, second = sorted(p["metadata"]["name"] for p in fake.list("Pod"))
    rest.evict(NS, first)
    with pytest.raises(KubeError) as exc:
        rest.evict(NS, second)  # the replacement is not Ready yet: the budget allows no second one
    assert exc.value.status == 429
    assert fake.get("Pod", first)["metadata"].get("deletionTimestamp") or fake.get("Pod", first) is None
    rest.create({"apiVersion": "policy/v1", "kind": "PodDisruptionBudget", "metadata": {"name": "y", "namespace": NS},
                 "spec": {"minAvailable": 0, "selector": {"matchLabels": labels}}})
    wait_until(lambda: fake.get("PodDisruptionBudget", "y").get("status"))
    with pytest.raises(KubeError) as exc:
        rest.evict(NS, second)
    assert exc.value.status == 500  # two budgets for one pod: the eviction API refuses


def test_field_audit_names_the_manager_of_each_change(fake, connect):
    a, b = connect("migscale/ctl-1"), connect("someone/2.0")
    a.create(cm("x"))
    a.merge_patch("v1", "ConfigMap", NS, "x", {"metadata": {"labels": {"l": "1"}}})
    b.merge_patch("v1", "ConfigMap", NS, "x", {"metadata": {"annotations": {"n": "1"}}})
    audit = fake.field_writers[("ConfigMap", NS, "x")]
    assert audit["metadata.labels.l"] == {"migscale"} and audit["metadata.annotations.n"] == {"someone"}
