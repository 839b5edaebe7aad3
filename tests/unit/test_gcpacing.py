"""The controller's full garbage collections run between ticks (``runtime/gcpacing.py``)."""

from __future__ import annotations

import gc
import threading
import weakref
from collections.abc import Iterator

import pytest

from autoscaler.runtime.gcpacing import INCREMENTAL, IdleCollector

# These follow CPython's generational collector; the incremental one of 3.14.0-3.14.4
# is left alone by the module.
pytestmark = pytest.mark.skipif(INCREMENTAL, reason="CPython 3.14.0-3.14.4 collects the old generation incrementally")


class Node:  # an object that can sit in a reference cycle and be watched by a weakref
    def __init__(self) -> None:
        self.me = self


@pytest.fixture
def full_collections() -> Iterator[list[str]]:
    """Every full collection's start, as "start" entries, while the test runs."""
    seen: list[str] = []

    def cb(phase: str, info: dict) -> None:
        if phase == "start" and info["generation"] == 2:
            seen.append(phase)

    saved = gc.get_threshold()
    gc.callbacks.append(cb)
    try:
        yield seen
    finally:
        gc.callbacks.remove(cb)
        gc.set_threshold(*saved)
        gc.unfreeze()


@pytest.fixture
def collector() -> Iterator[IdleCollector]:
    c = IdleCollector()
    try:
        yield c
    finally:
        c.uninstall()


def grow_the_heap() -> list[list[int]]:
    """Allocate (and keep) more containers than the process already tracks: under the
    interpreter's own rule that is enough for it to start a full collection."""
    return [[i] for i in range(max(len(gc.get_objects()), 100_000) + 50_000)]


def test_without_it_the_interpreter_starts_full_collections_while_the_heap_grows(full_collections):
    kept = grow_the_heap()
    assert full_collections, "the control case: the interpreter collects the oldest generation on its own"
    del kept


def test_installed_the_interpreter_never_starts_one_and_idle_runs_it(full_collections, collector):
    collector.install()
    full_collections.clear()  # install's own collection
    kept = grow_the_heap()
    assert full_collections == []
    assert collector.due()
    assert collector.idle() is True
    assert full_collections == ["start"]
    assert collector.stats.collections == 1 and collector.stats.last_pause_s is not None
    assert not collector.due() and collector.idle() is False  # the count starts again
    del kept


class Finalizer:  # a cycle whose finalizer waits (GIL released) while its collection is in progress
    def __init__(self, entered: threading.Event, release: threading.Event) -> None:
        self.me = self
        self.entered, self.release = entered, release

    def __del__(self) -> None:
        self.entered.set()
        self.release.wait(30)


def test_a_collection_refused_while_another_thread_collects_is_not_counted_and_stays_due(
    full_collections, collector
):
    collector.install()
    kept = grow_the_heap()
    assert collector.due()
    entered, release = threading.Event(), threading.Event()

    def other_thread() -> None:  # a young collection that runs a finalizer, as a client library's would
        gc.disable()  # so that no automatic collection, in any thread, finds the cycle before this one
        try:
            Finalizer(entered, release)
            gc.collect(0)
        finally:
            gc.enable()

    t = threading.Thread(target=other_thread)
    t.start()
    try:
        assert entered.wait(30)
        full_collections.clear()
        assert collector.idle() is False  # CPython refused: one collection at a time
        assert full_collections == []
        assert collector.stats.collections == 0 and collector.stats.busy == 1
        assert collector.stats.last_pause_s is None
        assert collector.due()
    finally:
        release.set()
        t.join(30)
    assert collector.idle() is True  # the next slice runs it
    assert full_collections == ["start"]
    assert collector.stats.collections == 1 and collector.stats.busy == 1
    assert not collector.due()
    del kept


def test_a_cycle_made_after_install_is_freed_by_the_next_due_collection(full_collections, collector):
    collector.install()
    node = Node()
    ref = weakref.ref(node)
    kept = grow_the_heap()  # the cycle is old enough to sit in the oldest generation
    del node  # garbage now; only a full collection finds it
    kept.extend(grow_the_heap())
    assert ref() is not None
    assert collector.idle() is True
    assert ref() is None
    del kept


def test_a_cycle_frozen_at_install_is_freed_at_the_next_thaw(full_collections):
    node = Node()
    ref = weakref.ref(node)
    collector = IdleCollector(thaw_every=2)
    collector.install()
    try:
        assert collector.stats.frozen > 0
        del node  # now garbage, but frozen: a plain full collection does not walk it
        kept = grow_the_heap()
        assert collector.idle() is True
        assert ref() is not None and collector.stats.thaws == 0
        kept.extend(grow_the_heap())
        assert collector.idle() is True
        assert collector.stats.thaws == 1
        assert ref() is None
        del kept
    finally:
        collector.uninstall()


def test_uninstall_gives_the_interpreter_its_settings_back(full_collections):
    before = gc.get_threshold()
    collector = IdleCollector()
    collector.install()
    assert gc.get_freeze_count() > 0
    collector.uninstall()
    assert gc.get_threshold() == before
    assert gc.get_freeze_count() == 0
    assert not collector.due() and collector.idle() is False  # not installed: never collects


@pytest.mark.parametrize("kw", [{"threshold": 0}, {"thaw_every": 0}])
def test_bad_settings_are_refused(kw):
    with pytest.raises(ValueError, match=next(iter(kw))):
        IdleCollector(**kw)
