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
    inf = nodes(fake, connect, watch_timeout_s=1)  # the server closes each watch after 1 s, without an event
    try:
        wait_until(lambda: inf.watches >= 3, 15, "several watches")
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


def test_a_watch_refused_with_an_error_lists_again_and_a_429_only_waits(fake, connect):
    """client-go's reflector: a watch from a version keeps going only after a lost connection or
    a 429; any other error means the version is not known to be good, so it lists again."""
    fake.put_object(gpu_node("n1", {"1g.10gb": 7}))
    inf = nodes(fake, connect, watch_timeout_s=1)
    try:
        opened = inf.watches
        fake.fail_next = [("GET", "/nodes", 429)]
        wait_until(lambda: not fake.fail_next and inf.watches >= opened + 2, 15, "the 429, then a watch again")
        assert inf.lists == 1 and "429" in inf.last_error
        fake.fail_next = [("GET", "/nodes", 500)]
        wait_until(lambda: inf.lists == 2, 15, "a list after the 500")
        assert "500" in inf.last_error and inf.expired == 0
    finally:
        inf.stop()


def test_a_watch_the_server_ends_at_once_with_nothing_is_a_failure_not_a_timeout(fake, connect):
    """A watch that ends within a second without an event did not time out: back off, list again."""

    class EmptyWatches:
        def __init__(self, rest):
            self.rest, self.list_calls = rest, 0

        def list_at(self, *a, **kw):
            self.list_calls += 1
            return self.rest.list_at(*a, **kw)

        def watch(self, *a, **kw):
            return iter(())  # the server closed the stream at once

    stub = EmptyWatches(connect())
    inf = Informer(stub, "v1", "Node", None, watch_timeout_s=300).start()
    try:
        wait_until(lambda: stub.list_calls >= 2, 10, "a list after the empty watch")
        assert "no event" in inf.last_error
        # each empty watch costs a backoff: not a busy loop of watches
        assert inf.watches <= stub.list_calls + 1
    finally:
        inf.stop()
