"""Property tests (hypothesis) for the MIG planner.

Every target layout is valid; capacity is met whenever the exact MILP says
it can be; no replica lands on a disallowed or too-small profile; planning
again on the plan's own result yields no actions; the churn budget holds; and
replaying the actions never repartitions under a replica nor drops a model's
serving capacity below min(before, after).
"""

from __future__ import annotations

import os

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from test_planner import assert_actions_are_safe, check_valid

from autoscaler.mig import Placement, get_product
from autoscaler.policy.milp import solve
from autoscaler.policy.planner import apply_plan_to_cluster, group_of, plan
from autoscaler.policy.planner.sizing import EPS
from autoscaler.policy.planner.work import HEALTHY
from autoscaler.policy.types import (
    ActionKind,
    ClusterState,
    GpuState,
    ModelSpec,
    Reason,
    Replica,
    ReplicaState,
)

PRODUCTS = ("A100-SXM4-80GB", "H100-SXM5-80GB", "A100-SXM4-40GB")
# PLANNER_EXAMPLES=10000 (`make props-deep`) for a deep run; the default keeps this file fast.
EXAMPLES = int(os.environ.get("PLANNER_EXAMPLES", "40"))
# print_blob: a failure prints the @reproduce_failure line that replays its example exactly
# (hypothesis cannot print these composite instances back as code).
FAST = settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow], print_blob=True)


@st.composite
def model_specs(draw, product: str, i: int) -> ModelSpec:
    prod = get_product(product)
    std = prod.standard_profiles()
    base = draw(st.floats(10, 300))
    shape = draw(st.sampled_from(("light", "linear")))
    caps = {}
    for p in std:
        gain = 1 + 0.25 * (p.compute - 1) if shape == "light" else p.compute * draw(st.floats(0.8, 1.0))
        if draw(st.integers(0, 9)) == 0:
            continue  # missing from the table: unusable
        caps[p.name] = round(base * gain, 1)
    names = [p.name for p in std]
    allowed = draw(st.lists(st.sampled_from(names), min_size=1, max_size=len(names), unique=True))
    memory = draw(st.sampled_from((None, None, None, 0.2 * prod.memory_gb, 0.45 * prod.memory_gb)))
    lo = draw(st.integers(0, 2))
    return ModelSpec(
        name=f"m{i}",
        capacity=caps,
        allowed_profiles=tuple(allowed),
        min_replicas=lo,
        max_replicas=draw(st.integers(max(lo, 1), 8)),
        high_availability=draw(st.booleans()),
        priority=draw(st.integers(0, 2)),
        memory_gb=memory,
    )


@st.composite
def instances(draw, max_gpus: int = 6, max_models: int = 4, multinode: bool = True):
    product = draw(st.sampled_from(PRODUCTS))
    n = draw(st.integers(1, max_gpus))
    models = [draw(model_specs(product, i)) for i in range(draw(st.integers(1, max_models)))]
    demand = {m.name: draw(st.floats(0, 200 * n)) for m in models}
    gpus = [GpuState(f"node/{i}", "node", product) for i in range(n)]
    if multinode and draw(st.booleans()):
        # An RDMA pool of whole GPUs (some still MIG-cut) and a model served by groups of 2.
        for i in range(draw(st.integers(1, 4))):
            cut = draw(st.booleans())
            gpus.append(GpuState(f"rdma-{i}/0", f"rdma-{i}", "H100-SXM5-80GB", mig_enabled=cut,
                                 layout=(Placement(0, "7g.80gb"),) if cut else (), rdma=True,
                                 fabric=draw(st.sampled_from(("ib-a", "ib-b")))))
        models.append(ModelSpec("llm", {}, (), min_replicas=draw(st.integers(0, 1)), max_replicas=3,
                                backend="multinode", nodes_per_group=2, gpus_per_node=1, group_capacity_rps=10.0))
        demand["llm"] = draw(st.floats(0, 40))
    return models, demand, ClusterState(gpus=tuple(gpus))


@st.composite
def running(draw):
    """A cluster already running an earlier plan, some replicas failed, and a new demand."""
    models, demand, cluster = draw(instances())
    first = plan(models, demand, cluster)
    cl = apply_plan_to_cluster(cluster, first)
    reps = []
    for r in cl.replicas:
        state = draw(st.sampled_from((ReplicaState.READY,) * 6 + (ReplicaState.FAILED, ReplicaState.STARTING)))
        reps.append(Replica(r.id, r.model, r.profile, r.gpu, r.start, state))
    cl = ClusterState(gpus=cl.gpus, replicas=tuple(reps))
    new = {k: v * draw(st.floats(0, 2)) for k, v in demand.items()}
    return models, new, cl


def usable(m: ModelSpec, product: str, profile: str) -> bool:
    prof = get_product(product).profiles[profile]
    return (profile in m.allowed_profiles and m.capacity.get(profile, 0) > 0
            and (m.memory_gb is None or prof.memory_gb >= m.memory_gb))


@FAST
@given(instances())
def test_layouts_valid_and_profiles_usable(inst):
    models, demand, cluster = inst
    p = plan(models, demand, cluster)
    check_valid(cluster, p)
    specs = {m.name: m for m in models}
    for a in p.assignments:
        if specs[a.model].backend == "multinode":
            assert a.profile == "whole" and cluster.gpu(a.gpu).rdma
            continue
        assert usable(specs[a.model], cluster.gpu(a.gpu).product, a.profile), a
    # a whole GPU held by a group hosts nothing else
    whole = {a.gpu for a in p.assignments if a.profile == "whole"}
    assert not any(a.gpu in whole for a in p.assignments if a.profile != "whole")
    # groups are all or nothing: every group has both members
    groups: dict[str, int] = {}
    for a in p.actions:
        if a.kind is ActionKind.CREATE and a.profile == "whole":
            groups[group_of(a.replica)] = groups.get(group_of(a.replica), 0) + 1
    assert all(n == 2 for n in groups.values())
    for m in models:
        mine = [a for a in p.assignments if a.model == m.name]
        assert len(mine) <= m.max_replicas * (2 if m.backend == "multinode" else 1)
        if m.high_availability and len(mine) >= 2:
            # distinct GPUs, or the plan says it could not (e.g. a one-GPU cluster)
            assert len({a.gpu for a in mine}) >= 2 or Reason.SHORTFALL in p.reasons[m.name]


@settings(FAST, max_examples=max(10, EXAMPLES * 3 // 4))
@given(instances(max_gpus=4, max_models=3, multinode=False))
@example(([ModelSpec("m0", {}, ("1g.10gb",), min_replicas=0, max_replicas=1)], {"m0": 5e-7},
          ClusterState(gpus=(GpuState("g0", "n0", "A100-SXM4-80GB", layout=()),))))
# A demand below the MILP solver's feasibility tolerance (6e-8 req/s) still needs a replica:
# here its 1g takes the room of m2's sixth 3g, so the fleet cannot serve both.
@example(([ModelSpec("m1", {"1g.10gb": 10.0}, ("1g.10gb",), min_replicas=0, max_replicas=1),
           ModelSpec("m2", {"3g.40gb": 15.0}, ("1g.10gb", "2g.20gb", "3g.40gb"), min_replicas=0, max_replicas=6)],
          {"m1": 5.960464477539063e-08, "m2": 76.0},
          ClusterState(gpus=tuple(GpuState(f"node/{i}", "node", "A100-SXM4-80GB") for i in range(3)))))
# Only a joint change fits all three (3g+4g+4g for m0 with two of m1's 2g as 1g beside the 4g):
# changing one model's mix at a time stopped at m0 on four 3g, 12 req/s short.
@example(([ModelSpec("m0", {"3g.40gb": 33.0, "4g.40gb": 44.0}, ("1g.10gb", "3g.40gb", "4g.40gb"),
                     min_replicas=0, max_replicas=4),
           ModelSpec("m1", {"1g.10gb": 10.0, "2g.20gb": 20.0}, ("1g.10gb", "2g.20gb"), min_replicas=0, max_replicas=4),
           ModelSpec("m2", {"2g.20gb": 20.0}, ("1g.10gb", "2g.20gb"), min_replicas=0, max_replicas=2)],
          {"m0": 111.0, "m1": 51.0, "m2": 33.0},
          ClusterState(gpus=tuple(GpuState(f"node/{i}", "node", "A100-SXM4-80GB") for i in range(3)))))
# Here the short model (m2, four 1g) has no other mix: the two others must change together
# (m0 to three 4g, m1 to five 1g) to leave it the 1g beside each 4g.
@example(([ModelSpec("m0", {"3g.40gb": 36.0, "4g.40gb": 48.0}, ("3g.40gb", "4g.40gb"), min_replicas=0, max_replicas=4),
           ModelSpec("m1", {"1g.10gb": 10.0, "4g.40gb": 40.0}, ("1g.10gb", "2g.20gb", "3g.40gb", "4g.40gb"),
                     min_replicas=0, max_replicas=5),
           ModelSpec("m2", {"1g.10gb": 98.7}, ("1g.10gb",), min_replicas=0, max_replicas=4)],
          {"m0": 133.0, "m1": 41.0, "m2": 297.0},
          ClusterState(gpus=tuple(GpuState(f"node/{i}", "node", "A100-SXM4-80GB") for i in range(3)))))
def test_capacity_met_whenever_the_milp_is_feasible(inst):
    models, demand, cluster = inst
    ref = solve(models, demand, [g.product for g in cluster.gpus], time_limit_s=20)
    p = plan(models, demand, cluster)
    if ref.feasible:
        assert not p.shortfall, (p.shortfall, ref.counts)
        for m in models:
            assert p.capacity_rps[m.name] >= demand[m.name] - 1e-6
            assert sum(1 for a in p.assignments if a.model == m.name) >= min(m.max_replicas, m.min_replicas), \
                (models, demand, [g.product for g in cluster.gpus], p.assignments, ref.counts)
        assert p.cost.gpus_used <= ref.gpus_used + 1  # near-optimal; the benchmark measures the gap
    else:
        # The heuristic cannot beat the exact solver: it must report a shortfall or break a bound.
        # "met" with the planner's and the solver's own slack: a demand of 5e-7 req/s with no usable
        # profile is infeasible for both, yet within a looser 1e-6 of zero capacity
        ok = all(p.capacity_rps[m.name] >= demand[m.name] - EPS for m in models)
        ha_ok = all(len({a.gpu for a in p.assignments if a.model == m.name}) >= 2
                    for m in models if m.high_availability)
        floors = all(sum(1 for a in p.assignments if a.model == m.name) >= m.min_replicas for m in models)
        assert not (ok and ha_ok and floors)


@FAST
@given(instances())
def test_planning_again_after_apply_yields_no_actions(inst):
    models, demand, cluster = inst
    p = plan(models, demand, cluster)
    after = apply_plan_to_cluster(cluster, p)
    again = plan(models, demand, after)
    assert again.actions == (), [(a.kind.value, a.model, a.gpu, a.start) for a in again.actions]
    assert again.cost.gpus_used == p.cost.gpus_used


@FAST
@given(running(), st.one_of(st.none(), st.integers(0, 5)))
def test_churn_budget_and_safe_actions_on_a_running_cluster(inst, budget):
    models, demand, cluster = inst
    p = plan(models, demand, cluster, churn_budget=budget)
    check_valid(cluster, p)
    if budget is not None:
        # churn: what stops or moves a running replica (a scale-up that deletes nothing, or
        # only replicas that serve nothing, is free, and so is a failed replica's delete)
        moves = (Reason.PROFILE_EFFICIENCY, Reason.CONSOLIDATE, Reason.HIGH_AVAILABILITY)
        serving = {r.id for r in cluster.replicas if r.state in HEALTHY}
        churned = [a for a in p.actions if (a.kind is ActionKind.DELETE and a.replica in serving)
                   or (a.kind is ActionKind.CREATE and a.reason in moves)]
        assert len(churned) <= budget
    assert_actions_are_safe(cluster, p, models)
    after = apply_plan_to_cluster(cluster, p)
    # The plan's assignments and layouts are exactly what its actions leave behind.
    live = sorted((r.model, r.profile, r.gpu, r.start) for r in after.replicas
                  if r.state in HEALTHY)
    assert live == sorted((a.model, a.profile, a.gpu, a.start) for a in p.assignments)
    for g in after.gpus:
        assert tuple(sorted(g.layout)) == tuple(sorted(p.layouts[g.id]))
    p2 = plan(models, demand, after, churn_budget=budget)
    check_valid(after, p2)
    assert_actions_are_safe(after, p2, models)
    # At the same demand the next tick never scales down a replica this one created (a
    # replacement cut short by the budget would be, every tick). Moving it to space that
    # has since come free is another matter: consolidation and repair may.
    created = {a.replica for a in p.actions if a.kind is ActionKind.CREATE}
    undone = created & {a.replica for a in p2.actions
                        if a.kind is ActionKind.DELETE and a.reason is Reason.SCALE_DOWN_DEMAND}
    assert not undone, (undone, [(a.kind.value, a.replica, a.reason.value) for a in p.actions])


@FAST
@given(running())
def test_repeated_ticks_converge(inst):
    models, demand, cluster = inst
    cl = cluster
    for _ in range(12):
        p = plan(models, demand, cl, churn_budget=3)
        if not p.actions:
            break
        cl = apply_plan_to_cluster(cl, p)
    assert plan(models, demand, cl, churn_budget=3).actions == ()


CUTS = (tuple(Placement(i, "1g.10gb") for i in range(7)),
        (Placement(0, "2g.20gb"), Placement(2, "2g.20gb"), Placement(4, "2g.20gb"), Placement(6, "1g.10gb")),
        (Placement(0, "3g.40gb"), Placement(4, "3g.40gb")))


@st.composite
def precut(draw):
    """New models on idle GPUs already cut (as a GPU operator's default config leaves them)."""
    gpus = tuple(GpuState(f"node/{i}", "node", "A100-SXM4-80GB", layout=draw(st.sampled_from(CUTS)))
                 for i in range(draw(st.integers(1, 6))))
    models, demand = [], {}
    for i in range(draw(st.integers(1, 4))):
        c = draw(st.integers(40, 120))
        models.append(ModelSpec(f"m{i}", {"1g.10gb": c, "2g.20gb": round(1.9 * c), "3g.40gb": round(2.7 * c)},
                                ("1g.10gb", "2g.20gb", "3g.40gb"), min_replicas=1, max_replicas=32))
        demand[f"m{i}"] = draw(st.integers(0, 300))
    return models, demand, ClusterState(gpus=gpus)


def test_an_idle_gpu_cut_as_a_new_model_needs_it_is_used_without_a_repartition():
    # two idle GPUs cut 3x2g+1g and 2x3g: cutting fresh patterns would re-cut both; the variant that
    # fills the instances as they are re-cuts one
    cluster = ClusterState(gpus=(GpuState("node/0", "node", "A100-SXM4-80GB", layout=CUTS[1]),
                                 GpuState("node/1", "node", "A100-SXM4-80GB", layout=CUTS[2])))
    models = [ModelSpec(f"m{i}", {"1g.10gb": c, "2g.20gb": round(1.9 * c), "3g.40gb": round(2.7 * c)},
                        ("1g.10gb", "2g.20gb", "3g.40gb"), min_replicas=1, max_replicas=32)
              for i, c in enumerate((66, 65))]
    p = plan(models, {"m0": 224, "m1": 199}, cluster, fast_path=False, churn_budget=50)
    assert sum(a.kind is ActionKind.REPARTITION for a in p.actions) == 1
    assert not p.shortfall or not any(p.shortfall.values())


@FAST
@given(st.one_of(running(), instances(), precut()), st.booleans())
def test_skipping_the_reuse_variant_where_it_would_place_nothing_else_never_changes_the_plan(inst, fast):
    from unittest import mock

    from autoscaler.policy.planner import packing

    models, demand, cluster = inst
    got = plan(models, demand, cluster, churn_budget=4, fast_path=fast)
    # the variant tried on every plan with new replicas, as if each could reuse an idle GPU's cut
    with mock.patch.object(packing, "_reusable", lambda gpus, pools: True):
        always = plan(models, demand, cluster, churn_budget=4, fast_path=fast)
    assert (got.actions, got.desired, got.assignments) == (always.actions, always.desired, always.assignments)
