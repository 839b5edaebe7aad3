"""Scale-up fast path (``planner_urgent.place_urgent``): a running model short of
its demand first takes empty MIG instances as they are cut now -- a replica there
serves after a start delay, one behind a repartition minutes later."""

from __future__ import annotations

from autoscaler.mig import Placement
from autoscaler.policy.planner import plan
from autoscaler.policy.types import (
    ActionKind,
    ClusterState,
    GpuState,
    ModelSpec,
    Reason,
    Replica,
    ReplicaState,
)

PRODUCT = "A100-SXM4-80GB"
# 1g is the most efficient profile: the fewest-slices mix for more capacity is
# all 1g, which no GPU below is cut for.
CAPS = {"1g.10gb": 100.0, "3g.40gb": 250.0, "4g.40gb": 300.0, "7g.80gb": 500.0}
SPEC = ModelSpec("m", CAPS, tuple(CAPS), min_replicas=1, max_replicas=32)
RUNNING = Replica("m-0", "m", "7g.80gb", "g0", 0, ReplicaState.READY)


def gpu(gid: str, *layout: Placement) -> GpuState:
    return GpuState(gid, "n", PRODUCT, layout=tuple(layout))


def reparts(p) -> set[str]:
    return {a.gpu for a in p.actions if a.kind is ActionKind.REPARTITION}


def creates(p) -> list[tuple[str, str, int]]:
    return sorted((a.gpu, a.profile, a.start) for a in p.actions if a.kind is ActionKind.CREATE)


def test_short_model_takes_free_instances_of_an_idle_gpu_without_repartition():
    # g1 is idle and cut 4g + 3g; the model needs 500 req/s more. Fewest slices
    # would be 5 x 1g (a repartition of g1); the fast path takes 3g + 4g as they are.
    cl = ClusterState((gpu("g0", Placement(0, "7g.80gb")), gpu("g1", Placement(0, "4g.40gb"), Placement(4, "3g.40gb"))),
                      (RUNNING,))
    p = plan([SPEC], {"m": 1000.0}, cl)
    assert not reparts(p)
    assert creates(p) == [("g1", "3g.40gb", 4), ("g1", "4g.40gb", 0)]
    assert p.capacity_rps["m"] >= 1000.0
    assert not p.shortfall


def test_a_gpu_with_a_fast_path_replica_keeps_its_layout_the_rest_goes_elsewhere():
    # g1 has one free 4g and uncut space beside it; the model needs 800 more:
    # 4g (300) now, the other 500 as 5 x 1g. Cutting them beside the 4g would
    # hold the 4g replica's start for the repartition, so they go to g2.
    cl = ClusterState((gpu("g0", Placement(0, "7g.80gb")), gpu("g1", Placement(0, "4g.40gb")), gpu("g2")), (RUNNING,))
    p = plan([SPEC], {"m": 1300.0}, cl)
    assert ("g1", "4g.40gb", 0) in creates(p)
    assert reparts(p) == {"g2"}
    assert p.capacity_rps["m"] >= 1300.0


def test_a_churn_budget_does_not_spread_a_scale_up_that_stops_nothing():
    # g1 uncut, g2 cut with one free 4g: the create on the free 4g (ready in a start
    # delay) and those behind g1's cut (which destroys no serving instance) all go in
    # one call, even with room for one churn action: none of them stops what runs.
    cl = ClusterState((gpu("g0", Placement(0, "7g.80gb")), gpu("g1"), gpu("g2", Placement(0, "4g.40gb"))), (RUNNING,))
    p = plan([SPEC], {"m": 1300.0}, cl, churn_budget=1)
    assert ("g2", "4g.40gb", 0) in creates(p)
    assert reparts(p) == {"g1"}
    assert p.capacity_rps["m"] >= 1300.0 and Reason.CHURN_BUDGET not in p.reasons["m"]


def test_first_deployment_is_not_a_fast_path_it_packs_by_fewest_slices():
    # Nothing runs yet: not urgent; 5 x 1g (5 slices) rather than 3g + 4g (7).
    cl = ClusterState((gpu("g0", Placement(0, "7g.80gb")), gpu("g1", Placement(0, "4g.40gb"), Placement(4, "3g.40gb"))))
    p = plan([SPEC], {"m": 500.0}, cl)
    assert p.desired == {("m", "1g.10gb"): 5}


def test_a_model_that_is_not_short_is_left_as_it_is():
    cl = ClusterState((gpu("g0", Placement(0, "7g.80gb")), gpu("g1", Placement(0, "4g.40gb"), Placement(4, "3g.40gb"))),
                      (RUNNING,))
    p = plan([SPEC], {"m": 500.0}, cl)
    assert not p.actions
    assert p.desired == {("m", "7g.80gb"): 1}


def test_without_the_fast_path_a_burst_is_met_with_the_fewest_slices():
    # The local emulation repartitions at once: there the efficient 1g slices are worth cutting.
    cl = ClusterState((gpu("g0", Placement(0, "7g.80gb")), gpu("g1", Placement(0, "4g.40gb"), Placement(4, "3g.40gb"))),
                      (RUNNING,))
    p = plan([SPEC], {"m": 1000.0}, cl, fast_path=False)
    assert reparts(p) == {"g1"}
    assert {prof for _, prof, _ in creates(p)} == {"1g.10gb"}
    assert p.capacity_rps["m"] >= 1000.0


def test_decide_turns_the_fast_path_on_only_for_slow_repartitions():
    from autoscaler.policy.decide import FAST_PATH_MIN_REPARTITION_S, decide
    from autoscaler.policy.state import PolicyConfig, PolicyState
    from autoscaler.policy.types import ModelSignals, Observation

    cl = ClusterState((gpu("g0", Placement(0, "7g.80gb")),), (RUNNING,))
    obs = Observation(t_s=0.0, cluster=cl, models={"m": ModelSignals(model="m", t_s=0.0, request_rate=100.0)})
    seen = []

    def spy(*a, **k):
        seen.append(k["fast_path"])
        return plan(*a, **k)

    for reparts_s in (180.0, FAST_PATH_MIN_REPARTITION_S, 0.0):
        cfg = PolicyConfig(models=(SPEC,), slo_p99_ms={"m": 100.0}, repartition_s=reparts_s)
        decide(obs, PolicyState(), cfg, 0.0, planner=spy)
    assert seen == [True, True, False]


def test_the_free_pool_lists_idle_gpus_lazily_and_still_answers_the_minimum_over_every_instance():
    """``_FreePool`` lists an idle GPU only when a class's head could come from it:
    its answers, take after take, equal ``min`` over a full list of the free instances."""
    import random

    from autoscaler.mig.products import get_product
    from autoscaler.policy.planner.packing import GpuWork, overlaps
    from autoscaler.policy.planner.urgent import _FreePool

    a100 = get_product("A100-SXM4-80GB")
    cuts = [tuple(Placement(i, "1g.10gb") for i in range(7)),
            (Placement(0, "3g.40gb"), Placement(4, "3g.40gb")),
            (Placement(0, "2g.20gb"), Placement(2, "2g.20gb"), Placement(4, "2g.20gb"), Placement(6, "1g.10gb")),
            (Placement(0, "4g.40gb"), Placement(4, "2g.20gb"), Placement(6, "1g.10gb"))]
    cap = {"1g.10gb": 10.0, "2g.20gb": 19.0, "3g.40gb": 26.0, "4g.40gb": 30.0}
    for seed in range(30):
        rng = random.Random(seed)
        gpus = []
        for i in range(40):
            cut = rng.choice(cuts)
            g = GpuWork(f"g{i}", f"n{i // 4}", a100, rng.random() < 0.2, None, cut, i)
            if rng.random() < 0.3:  # in use: one instance taken
                p = rng.choice(cut)
                g.place("x", p.profile, p.start, ())
            gpus.append(g)
        pool = _FreePool(list(gpus))

        def rank(gp, need, cap=cap):
            g, p = gp
            c, comp = cap[p.profile], g.product.profiles[p.profile].compute
            covers = c >= need
            return (not g.hard, not covers, comp if covers else -c / comp, -c, g.rdma, g.order, p.start)

        for _ in range(25):
            need = rng.choice([5.0, 15.0, 25.0, 60.0])
            full = [(g, p) for g in gpus for p in sorted(g.soft)
                    if not any(overlaps(a100, p, o) for o in g.occupied())]
            got = pool.best(cap, lambda gp, need=need: rank(gp, need))
            want = min(full, key=lambda gp, need=need: rank(gp, need), default=None)
            assert got == want
            assert pool.alive == len(full)
            if got is None:
                break
            g, p = got
            g.place("m", p.profile, p.start, ())
            pool.take(g, p)
