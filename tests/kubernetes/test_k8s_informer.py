"""Informers: list once, watch from the list's version, follow bookmarks, list again only after 410."""

from __future__ import annotations

from k8s_helpers import NS, gpu_node, wait_until

from autoscaler.act.kubernetes.informer import Informer


def nodes(fake, connect, **kw) -> Informer:
    inf = Informer(connect(), "v1", "Node", None, **kw).start()
    assert inf.wait_synced(5)
    return inf


def test_list_once_then_watch_changes_and_deletions(fake, connect):
    fake.put_object(gpu_node("n1", {"1g.10gb": 7}))
    inf = nodes(fake, connect)
    try:
        assert [n["metadata"]["name"] for n in inf.items()] == ["n1"]
        fake.put_object(gpu_node("n2", {"1g.10gb": 7}))
        wait_until(lambda: inf.get("n2") is not None, 5, "n2 in the cache")
        node = fake.get("Node", "n1", None)
        node["spec"]["unschedulable"] = True
        fake.put_object(node)
        wait_until(lambda: inf.get("n1")["spec"].get("unschedulable"), 5, "the change")
        fake.remove_now(("", "nodes", None, "n2"))
        wait_until(lambda: inf.get("n2") is None, 5, "the deletion")
        assert inf.lists == 1 and inf.expired == 0
        assert inf.rest.counts["GET"] == 1  # one list; everything since came over the watch
    finally:
        inf.stop()


def test_bookmarks_move_the_version_without_objects(fake, connect):
    inf = nodes(fake, connect)
    try:
        fake.put_object({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "x", "namespace": NS}})
        target = fake.resource_version  # a change of another kind: only a bookmark can carry it
        wait_until(lambda: int(inf.resource_version or 0) >= target and inf.bookmarks > 0, 5, "a bookmark")
        assert len(inf) == 0
    finally:
        inf.stop()


def test_a_watch_that_ends_restarts_from_its_version_without_listing(fake, connect):
    fake.put_object(gpu_node("n1", {"1g.10gb": 7}))
    inf = nodes(fake, connect, watch_timeout_s=0.3)  # the server closes each watch after 0.3-0.6 s
    try:
        wait_until(lambda: inf.watches >= 3, 10, "several watches")
        fake.put_object(gpu_node("n2", {"1g.10gb": 7}))
        wait_until(lambda: inf.get("n2") is not None, 5, "n2")
        assert inf.lists == 1
    finally:
        inf.stop()


def test_410_expired_means_list_again_and_replace_the_store(fake, connect):
    fake.put_object(gpu_node("n1", {"1g.10gb": 7}))
    inf = Informer(connect(), "v1", "Node", None, watch_timeout_s=60)
    inf.relist()
    assert inf.lists == 1 and inf.get("n1") is not None
    # while this informer is not watching, n1 goes, n2 comes, and the history is compacted away
    fake.remove_now(("", "nodes", None, "n1"))
    fake.put_object(gpu_node("n2", {"1g.10gb": 7}))
    fake.expire_history("Node")
    seen = []
    inf.handlers.append(lambda kind, obj: seen.append((kind, obj["metadata"]["name"])))
    inf.start()
    try:
        wait_until(lambda: inf.get("n2") is not None, 10, "the relist")
        assert inf.expired == 1 and inf.lists == 2 and inf.get("n1") is None
        assert ("DELETED", "n1") in seen and ("ADDED", "n2") in seen
    finally:
        inf.stop()


def test_a_missing_crd_is_an_empty_synced_cache(fake, connect):
    inf = Informer(connect(), "leaderworkerset.x-k8s.io/v1", "LeaderWorkerSet", NS, optional=True)
    fake_404 = ("GET", "/leaderworkersets", 404)
    fake.fail_next = [fake_404]
    inf.relist()
    assert inf.synced and inf.absent and len(inf) == 0
