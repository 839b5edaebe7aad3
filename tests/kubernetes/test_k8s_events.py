"""The Event recorder writes from its own thread: a tick never waits for an Event, and a full queue drops."""

from __future__ import annotations

import threading

from autoscaler.act.kubernetes.client import Fenced
from autoscaler.act.kubernetes.events import EventRecorder
from autoscaler.clock import VirtualClock

NS = "serving"
DEPLOY = {"apiVersion": "apps/v1", "kind": "Deployment",
          "metadata": {"name": "resnet-1g-10gb", "namespace": NS, "uid": "u-1"}}


def events(fake) -> list[dict]:
    return [e for e in fake.list("Event") if e["regarding"].get("uid") == "u-1"]


def test_an_event_is_queued_not_waited_for_and_flush_writes_it(fake, connect):
    gate = threading.Event()
    fake.before.append(lambda method, path: gate.wait(10) if "/events" in path else None)
    rec = EventRecorder(connect(), VirtualClock(1000.0), instance="m-0")
    try:
        rec.event(DEPLOY, "Normal", "SuccessfulRescale", "New size: 3; reason: scale_up_demand")
        # the API server has not answered (it is held), yet event() has returned
        assert rec.stats()["sent"] == 0 and not rec.flush(0.2)
        gate.set()
        assert rec.flush(10)
        (ev,) = events(fake)
        assert ev["note"] == "New size: 3; reason: scale_up_demand" and ev["reportingInstance"] == "m-0"
        assert rec.stats() == {"sent": 1, "dropped": 0, "failed": 0, "queued": 0, "series": 1}
    finally:
        gate.set()
        rec.close()


def test_an_event_about_a_node_goes_to_default_and_one_about_a_namespaced_object_to_its_namespace(fake, connect):
    node = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "gpu-1", "uid": "u-node"}}
    rec = EventRecorder(connect(), VirtualClock(1000.0), instance="m-0")
    try:
        rec.event(node, "Normal", "RepartitionStarted", "gpu-1: all-1g.10gb -> all-3g.40gb", action="Repartition")
        rec.event(DEPLOY, "Normal", "SuccessfulRescale", "New size: 2; reason: scale_up_demand")
        assert rec.flush(10)
        where = {e["regarding"]["kind"]: e["metadata"]["namespace"] for e in fake.list("Event")}
        assert where == {"Node": "default", "Deployment": NS}
    finally:
        rec.close()


def test_repeats_become_one_series_patched_in_order_after_its_create(fake, connect):
    clock = VirtualClock(1000.0)
    rec = EventRecorder(connect(), clock, instance="m-0", series_flush_s=30.0)
    try:
        for _ in range(3):
            rec.event(DEPLOY, "Normal", "SuccessfulRescale", "New size: 2; reason: scale_down_idle")
            clock.advance(20.0)
        assert rec.flush(10)
        (ev,) = events(fake)
        # the third repeat came 40 s after the create: one patch carries the count so far
        assert ev["series"]["count"] == 3
    finally:
        rec.close()


def test_a_full_queue_drops_and_counts_and_the_tick_goes_on(fake, connect):
    gate = threading.Event()
    fake.before.append(lambda method, path: gate.wait(10) if "/events" in path else None)
    rec = EventRecorder(connect(), VirtualClock(1000.0), instance="m-0", queue_size=2, per_tick=50)
    try:
        for i in range(6):
            rec.event(DEPLOY, "Normal", "SuccessfulRescale", f"New size: {i}; reason: scale_up_demand")
        # one write is held in flight by the server, two wait in the queue, the rest are dropped
        dropped = rec.stats()["dropped"]
        assert 3 <= dropped <= 4, rec.stats()
        gate.set()
        assert rec.flush(10)
        assert len(events(fake)) == 6 - dropped == rec.stats()["sent"]
    finally:
        gate.set()
        rec.close()


def test_a_fenced_write_is_counted_as_failed_and_the_next_occurrence_creates_again(fake, connect):
    rest = connect()
    fenced = [True]

    def guard(method: str, path: str) -> None:
        if fenced[0]:
            raise Fenced(0, f"{method} {path}: not the leader")

    rest.guard = guard
    clock = VirtualClock(1000.0)
    rec = EventRecorder(rest, clock, instance="m-0")
    try:
        rec.event(DEPLOY, "Warning", "FailedRescale", "boom")
        assert rec.flush(10)
        assert events(fake) == [] and rec.stats()["failed"] == 1 and rec.stats()["series"] == 0
        fenced[0] = False
        clock.advance(1.0)
        rec.event(DEPLOY, "Warning", "FailedRescale", "boom")
        assert rec.flush(10)
        assert [e["reason"] for e in events(fake)] == ["FailedRescale"]
    finally:
        rec.close()


def test_close_writes_what_is_queued_then_refuses(fake, connect):
    rec = EventRecorder(connect(), VirtualClock(1000.0), instance="m-0")
    rec.event(DEPLOY, "Normal", "SuccessfulRescale", "New size: 1; reason: scale_up_demand")
    rec.close()
    assert len(events(fake)) == 1
    rec.event(DEPLOY, "Normal", "SuccessfulRescale", "New size: 2; reason: scale_up_demand")
    assert rec.stats()["dropped"] == 1 and len(events(fake)) == 1
    assert rec._writer is not None and not rec._writer.is_alive()  # the writer thread has ended
