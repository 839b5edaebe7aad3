"""Leader election: expiry by this process's own observation, renewal on its own thread, fencing of writes."""

from __future__ import annotations

import time

import pytest
from k8s_helpers import NS, RESNET, act

from autoscaler.act.kubernetes.client import Fenced
from autoscaler.act.kubernetes.leader import LeaseElector, check_timings, micro_time
from autoscaler.clock import VirtualClock, WallClock

T0 = 1_800_000_000.0


def elector(connect, identity: str, clock, **kw) -> LeaseElector:
    rest = connect(user_agent=f"migscale/{identity}")
    kw.setdefault("lease_duration_s", 15)
    e = LeaseElector(rest, namespace=NS, identity=identity, clock=clock, **kw)
    rest.guard = e.check_write
    return e


def test_expiry_is_measured_from_when_this_process_saw_the_lease_change(fake, connect):
    clock_a, clock_b = VirtualClock(T0), VirtualClock(T0 + 3600)  # b's clock is an hour ahead of a's
    a, b = elector(connect, "a", clock_a), elector(connect, "b", clock_b)
    assert a.step().leader
    # an hour of skew: comparing a's renewTime with b's clock would call the lease long expired
    st = b.step()
    assert not st.leader and st.holder == "a"
    for _ in range(3):  # a keeps renewing: every renewal is a change b sees, so b keeps following
        clock_a.advance(5)
        clock_b.advance(5)
        assert a.step().leader and not b.step().leader
    clock_b.advance(14)  # a stops; 14 s of b's own clock since it saw the last change: not yet
    assert not b.step().leader
    clock_b.advance(2)
    st = b.step()
    assert st.leader and "took over from a" in st.reason
    lease = fake.get("Lease", "migscale-controller")
    assert lease["spec"]["holderIdentity"] == "b" and lease["spec"]["leaseTransitions"] == 1


def test_a_leader_that_cannot_renew_stops_writing_before_anyone_else_may_start(fake, connect):
    clock = VirtualClock(T0)
    a = elector(connect, "a", clock, renew_deadline_s=10, retry_period_s=2)
    assert a.step().leader and a.holds()
    a.rest.create({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "ok", "namespace": NS}})
    fake.fail_next = [("GET", "/leases/migscale-controller", 503)] * 10  # the API server stops answering us
    clock.advance(6)
    assert a.step().leader  # one failed renewal: still within the renew deadline
    clock.advance(4.5)
    st = a.step()
    assert not st.leader and "lost the lease" in st.reason and not a.holds()
    before = len(fake.writes("migscale/a"))
    with pytest.raises(Fenced):
        a.rest.create({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "late", "namespace": NS}})
    assert len(fake.writes("migscale/a")) == before  # the write never left the process
    assert fake.get("ConfigMap", "late") is None
    # 10.5 s after a's last renewal, a follower that saw that renewal still has 4.5 s to wait: no overlap


def test_the_fence_counts_from_when_the_renewal_was_sent_not_from_its_late_reply(fake, connect):
    clock = VirtualClock(T0)
    a = elector(connect, "a", clock, renew_deadline_s=10, retry_period_s=2)
    assert a.step().leader
    clock.advance(2)
    # the renewal commits at once, but its reply takes 6 s to come back
    fake.before.append(lambda method, path: clock.advance(6) if method == "PUT" and "/leases/" in path else None)
    assert a.step().leader
    fake.before.clear()
    clock.advance(3)
    assert a.holds()  # 9 s since the renewal was sent
    clock.advance(1.5)
    # 10.5 s since it was sent: a follower that saw it commit may start 4.5 s from now; stop writing
    assert not a.holds()
    with pytest.raises(Fenced):
        a.rest.create({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "late", "namespace": NS}})


def test_the_renew_thread_keeps_the_lease_through_a_long_tick(fake, connect):
    a = elector(connect, "a", WallClock(), lease_duration_s=3, renew_deadline_s=2.5, retry_period_s=0.2)
    b = elector(connect, "b", WallClock(), lease_duration_s=3, renew_deadline_s=2.5, retry_period_s=0.2)
    a.start()
    try:
        deadline = time.monotonic() + 5
        while not a.holds() and time.monotonic() < deadline:
            time.sleep(0.02)
        assert a.holds()
        time.sleep(4)  # a tick longer than the lease, with no call from the tick
        assert a.holds() and not b.step().leader
    finally:
        a.stop()
    renewals = [r for r in fake.writes("migscale/a") if r.method == "PUT" and "/leases/" in r.path]
    assert len(renewals) >= 4  # one each 0.2 s when idle; a loaded machine slows each round trip


def test_lost_race_on_the_lease_means_follow(fake, connect):
    a = elector(connect, "a", VirtualClock(T0))
    assert a.step().leader
    fake.fail_next = [("PUT", "/leases/migscale-controller", 409)]
    clock = a.clock
    clock.advance(2)
    st = a.step()  # the renewal raced with another writer; within the deadline a still leads
    assert st.leader and "409" in st.reason
    clock.advance(2)
    assert a.step().leader


def test_release_lets_a_follower_in_without_waiting(fake, connect):
    clock = VirtualClock(T0)
    a, b = elector(connect, "a", clock), elector(connect, "b", clock)
    assert a.step().leader and not b.step().leader
    assert a.release() is True and not a.holds()
    assert b.step().leader
    with pytest.raises(Fenced):
        a.check_write("POST", "/api/v1/namespaces/default/configmaps")


def test_timings_are_checked_as_client_go_does():
    assert check_timings(15, 10, 2) == []
    assert any("--lease-duration" in p for p in check_timings(10, 10, 2))
    assert any("--renew-deadline" in p for p in check_timings(15, 2, 2))
    assert any("--retry-period" in p for p in check_timings(15, 10, 0))
    with pytest.raises(ValueError, match="renew-deadline"):
        LeaseElector(None, namespace=NS, identity="x", clock=VirtualClock(T0), renew_deadline_s=1, retry_period_s=1)


def test_a_follower_backend_writes_nothing(fake, connect, backends):
    clock = VirtualClock(T0)
    holder = elector(connect, "a", clock)
    assert holder.step().leader
    rest_b = connect(user_agent="migscale/b")
    be = backends([RESNET], user_agent="migscale/b", elector=LeaseElector(rest_b, namespace=NS, identity="b", clock=clock))
    be.rest.guard = be.elector.check_write
    be.elector.step()
    out = be.apply([act("create", "resnet")])
    assert len(out) == 1 and "not the leader" in out[0]
    assert fake.writes("migscale/b") == []


def test_build_backend_from_cluster_yaml_is_leader_elected_and_fenced(fake):
    from pathlib import Path

    from autoscaler.act.kubernetes.config import build_backend
    from autoscaler.config import load_cluster, load_models, model_specs

    ex = Path(__file__).resolve().parents[2] / "examples"
    models, cluster = load_models(ex / "models.yaml"), load_cluster(ex / "cluster.yaml")
    be = build_backend(model_specs(models, cluster), cluster, host=fake.url, identity="ctl-1",
                       lease_namespace="migscale-system", clock=VirtualClock(T0))
    try:
        with pytest.raises(Fenced):  # before it holds the lease, no write leaves
            be.rest.create({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "x", "namespace": "default"}})
        assert be.elector.step().leader
        assert be.apply([act("create", "resnet", "3g.40gb", gpu="node-a/0")]) == []
        assert fake.get("Lease", "migscale-controller", "migscale-system")["spec"]["holderIdentity"] == "ctl-1"
        assert fake.get("Deployment", "resnet-3g-40gb", cluster.namespace)["spec"]["replicas"] == 1
        assert all(r.user_agent == "migscale/ctl-1" for r in fake.writes())
    finally:
        be.close()
        be.rest.close()


def test_micro_time_is_rfc3339_with_microseconds():
    assert micro_time(T0) == "2027-01-15T08:00:00.000000Z"
