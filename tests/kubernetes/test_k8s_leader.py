"""Leader election on a Lease: two controllers, only one acts; takeover after expiry."""

from __future__ import annotations

from k8s_helpers import CFG, NS, RESNET, plan

from autoscaler.act.kubernetes.leader import LeaseElector
from autoscaler.act.kubernetes.backend import KubernetesBackend
from autoscaler.clock import VirtualClock


def controller(connect, identity: str, clock: VirtualClock) -> KubernetesBackend:
    rest = connect(user_agent=f"migscale/{identity}")
    elector = LeaseElector(rest, namespace=NS, identity=identity, clock=clock, lease_duration_s=15)
    return KubernetesBackend(rest, [RESNET], CFG, clock=clock, elector=elector)


def deployment_writes(fake, identity: str) -> int:
    return sum(1 for r in fake.writes(f"migscale/{identity}") if "/leases" not in r.path)


def test_two_controllers_only_one_acts_and_takeover_after_expiry(fake, connect):
    clock = VirtualClock(1_800_000_000.0)
    a, b = controller(connect, "a", clock), controller(connect, "b", clock)
    p = plan({("resnet", "1g.10gb"): 1})
    assert a.apply_plan(p) == []
    assert deployment_writes(fake, "a") > 0
    out = b.apply_plan(plan({("resnet", "1g.10gb"): 3}))
    assert len(out) == 1 and "not the leader" in out[0] and "held by a" in out[0]
    assert deployment_writes(fake, "b") == 0
    assert fake.get("Deployment", "resnet-1g-10gb")["spec"]["replicas"] == 1

    clock.advance(10)  # a renews within its 15 s lease: b still follows
    assert a.elector.ensure().leader
    clock.advance(10)
    assert not b.elector.ensure().leader

    clock.advance(16)  # a went silent for 16 s > 15 s: b takes over
    st = b.elector.ensure()
    assert st.leader and "took over from a" in st.reason
    lease = fake.get("Lease", "migscale-controller")
    assert lease["spec"]["holderIdentity"] == "b" and lease["spec"]["leaseTransitions"] == 1
    writes_a = deployment_writes(fake, "a")
    assert a.apply([]) and deployment_writes(fake, "a") == writes_a  # the old leader stands down
    assert not a.elector.last.leader


def test_lost_race_on_the_lease_means_follow(fake, connect):
    clock = VirtualClock(1_800_000_000.0)
    a = controller(connect, "a", clock)
    assert a.elector.ensure().leader
    fake.fail_next = [("PUT", "/leases/migscale-controller", 409)]
    st = a.elector.ensure()  # renewal raced with another writer: do not assume we still lead
    assert not st.leader and "409" in st.reason
    assert a.elector.ensure().leader  # next tick: our lease is still the live one


def test_release_lets_a_follower_in_without_waiting(fake, connect):
    clock = VirtualClock(1_800_000_000.0)
    a, b = controller(connect, "a", clock), controller(connect, "b", clock)
    assert a.elector.ensure().leader
    assert not b.elector.ensure().leader
    a.elector.release()
    assert b.elector.ensure().leader


def test_build_backend_from_cluster_yaml_is_leader_elected(fake):
    from pathlib import Path

    from autoscaler.act.kubernetes.config import build_backend
    from autoscaler.config import load_cluster, load_models, model_specs

    ex = Path(__file__).resolve().parents[2] / "examples"
    models, cluster = load_models(ex / "models.yaml"), load_cluster(ex / "cluster.yaml")
    clock = VirtualClock(1_800_000_000.0)
    be = build_backend(
        model_specs(models, cluster),
        cluster,
        host=fake.url,
        identity="ctl-1",
        lease_namespace="migscale-system",
        clock=clock,
    )
    try:
        assert be.apply_plan(plan({("resnet", "3g.40gb"): 2})) == []
        lease = fake.get("Lease", "migscale-controller", "migscale-system")
        assert lease["spec"]["holderIdentity"] == "ctl-1"
        assert fake.get("Deployment", "resnet-3g-40gb", cluster.namespace)["spec"]["replicas"] == 2
        hpa = fake.get("HorizontalPodAutoscaler", "resnet-3g-40gb", cluster.namespace)
        assert hpa["spec"]["behavior"]["scaleDown"]["stabilizationWindowSeconds"] == 30  # from cluster.yaml
        assert all(r.user_agent == "migscale/ctl-1" for r in fake.writes())
    finally:
        be.rest.close()
