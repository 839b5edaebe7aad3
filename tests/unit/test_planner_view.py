"""The planner's view of a large fleet gives the whole fleet's plan (``planner/view.py``).

On random fleets of 65-140 GPUs (few kinds of empty GPU, so the view thins
them), the plan made through the view equals ``plan_whole`` on every GPU --
settled, after a demand change, with busy GPUs and an RDMA pool -- and a view
that runs out of a kind is detected and the call repeated.
"""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_planner_props import model_specs

from autoscaler.mig import Placement, get_product
from autoscaler.mig.layout import maximal_layouts
from autoscaler.policy.planner import apply_plan_to_cluster, plan
from autoscaler.policy.planner.core import plan_through_view, plan_whole
from autoscaler.policy.planner.view import MIN_FLEET_GPUS, view
from autoscaler.policy.types import ClusterState, GpuState, ModelSpec

VIEW = settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@st.composite
def fleets(draw):
    product = draw(st.sampled_from(("A100-SXM4-80GB", "H100-SXM5-80GB")))
    cuts = list(maximal_layouts(get_product(product)))
    kinds = [draw(st.sampled_from(cuts)) for _ in range(draw(st.integers(1, 3)))]
    n = draw(st.integers(MIN_FLEET_GPUS + 1, 140))
    # at least 2 GPUs of each kind (so k=1 thins), the rest at random
    gpus = []
    for i in range(n):
        k = i % len(kinds) if i < 2 * len(kinds) else draw(st.integers(0, len(kinds)))  # len(kinds): uncut
        gpus.append(GpuState(f"node-{i // 8}/{i % 8}", f"node-{i // 8}", product,
                             layout=kinds[k] if k < len(kinds) else (),
                             busy=i >= 2 * len(kinds) and draw(st.integers(0, 19)) == 0))
    models = [draw(model_specs(product, i)) for i in range(draw(st.integers(1, 5)))]
    if draw(st.booleans()):
        for i in range(draw(st.integers(2, 6))):
            gpus.append(GpuState(f"rdma-{i}/0", f"rdma-{i}", "H100-SXM5-80GB", mig_enabled=False, rdma=True,
                                 fabric="ib-a"))
        models.append(ModelSpec("llm", {}, (), min_replicas=1, max_replicas=2, backend="multinode",
                                nodes_per_group=2, gpus_per_node=1, group_capacity_rps=10.0))
    demand = {m.name: draw(st.floats(0, 6 * max(m.capacity.values(), default=1.0))) for m in models}
    return models, demand, ClusterState(tuple(gpus))


@VIEW
@given(fleets(), st.lists(st.floats(0.3, 3.0), min_size=2, max_size=2), st.sampled_from((1, 3)))
def test_the_view_plans_what_the_whole_fleet_plans(fleet, moves, k):
    # k: empty GPUs kept per kind to start with -- small, so the view is thin and
    # must often grow; ``plan`` itself starts from its estimate of new replicas.
    models, demand, cluster = fleet
    multinode = any(m.backend == "multinode" for m in models)
    assert (view(models, cluster, k) is None) == multinode  # thinned, unless a multinode model is served
    for factor in [1.0, *moves]:
        d = {m: v * factor for m, v in demand.items()}
        whole = plan_whole(models, d, cluster, churn_budget=None, now_s=1.0)
        assert plan_through_view(models, d, cluster, k, churn_budget=None, now_s=1.0) == whole
        assert plan(models, d, cluster, churn_budget=None, now_s=1.0) == whole
        cluster = apply_plan_to_cluster(cluster, whole)


def test_a_view_that_runs_out_of_a_kind_is_not_taken():
    # 100 empty A100s cut 7 x 1g; one model needs 10 whole-GPU (7g) replicas
    prod = "A100-SXM4-80GB"
    cut = tuple(Placement(s, "1g.10gb") for s in range(7))
    cluster = ClusterState(tuple(GpuState(f"n{i}/0", f"n{i}", prod, layout=cut) for i in range(100)))
    big = ModelSpec("big", {"7g.80gb": 100.0}, ("7g.80gb",), min_replicas=1, max_replicas=20)
    d = {"big": 1000.0}
    small = view([big], cluster, 4)  # 4 of the 100 kept: too few for 10 replicas
    assert small is not None and len(small.cluster.gpus) == 4
    on_view = plan_whole([big], d, small.cluster, fleet_gpus=100)
    assert not small.holds(on_view)  # it fell short: not the fleet's plan
    enough = view([big], cluster, 16)
    assert enough is not None and enough.holds(plan_whole([big], d, enough.cluster, fleet_gpus=100))
    got = plan([big], d, cluster)
    assert got == plan_whole([big], d, cluster)
    assert sum(n for (m, _p), n in got.desired.items() if m == "big") == 10
    assert len(got.layouts) == 100  # every GPU of the fleet has its target layout


def test_small_fleets_and_fleets_in_use_are_planned_whole():
    prod = "A100-SXM4-80GB"
    small = ClusterState(tuple(GpuState(f"n{i}/0", f"n{i}", prod) for i in range(MIN_FLEET_GPUS)))
    m = ModelSpec("a", {"1g.10gb": 10.0}, ("1g.10gb",))
    assert view([m], small, 1) is None
    big = ClusterState(tuple(GpuState(f"n{i}/0", f"n{i}", prod, layout=(Placement(0, "7g.80gb"),))
                             for i in range(MIN_FLEET_GPUS + 1)))
    assert view([m], big, MIN_FLEET_GPUS + 1) is None  # k covers every GPU of the one kind
    v = view([m], big, 3)
    assert v is not None and [g.id for g in v.cluster.gpus] == ["n0/0", "n1/0", "n2/0"]
