"""decide(): demand -> capacity -> HPA stages -> planner, with a stand-in planner."""

from __future__ import annotations

import dataclasses

import pytest

from autoscaler.config import policy_config
from autoscaler.fakes import RecordingActuator, single_gpu_cluster, stub_planner
from autoscaler.mig import Placement
from autoscaler.policy.decide import decide
from autoscaler.policy.forecast import ForecastConfig
from autoscaler.policy.hpa import DEFAULT_SCALE_UP, ScalingRules, SelectPolicy
from autoscaler.policy.state import PolicyConfig, PolicyState
from autoscaler.policy.types import (
    ActionKind,
    ClusterState,
    FastSignals,
    GpuState,
    ModelSignals,
    ModelSpec,
    Observation,
    Reason,
    Replica,
    ReplicaState,
)

PROFILE = "1g.10gb"


def spec(name, lo=1, hi=10):
    return ModelSpec(
        name, capacity={PROFILE: 50.0}, allowed_profiles=(PROFILE,), min_replicas=lo, max_replicas=hi
    )


def config(**kw):
    base = {
        "models": (spec("a"), spec("b")),
        "slo_p99_ms": {"a": 50.0, "b": 50.0},
        "short_window_s": 10,
        "long_window_s": 10,  # one-sample windows at 5 s ticks keep the arithmetic visible
        "churn_budget": None,
    }
    base.update(kw)
    return PolicyConfig(**base)


def cluster(a=2, b=2):
    reps = [Replica(f"a-{i}", "a", PROFILE, "node-a/0", i, ReplicaState.READY) for i in range(a)]
    reps += [Replica(f"b-{i}", "b", PROFILE, "node-a/0", i, ReplicaState.READY) for i in range(b)]
    return single_gpu_cluster(replicas=reps)


def sig(model, rps, t, **kw):
    return ModelSignals(model, t, request_rate=rps, **kw)


class Harness:
    """decide + a minimal cluster update between ticks."""

    def __init__(self, cfg, cl):
        self.cfg, self.cluster, self.state = cfg, cl, PolicyState()
        self.act = RecordingActuator()

    def step(self, t, signals, source_ok=True):
        obs = Observation(t, self.cluster, models=signals, source_ok=source_ok)
        plan, self.state = decide(obs, self.state, self.cfg, t, planner=stub_planner)
        self.cluster = self.act.apply_to(self.cluster, plan.actions)
        return plan

    def count(self, model):
        return sum(1 for r in self.cluster.replicas if r.model == model)


def test_scale_up_worked_example():
    h = Harness(config(), cluster())
    # a: 200 req/s on 2 x 50 -> required 240 -> 2.4 x 2 = ceil(4.8) = 5 replicas; b: 83 req/s -> 100 = hold
    plan = h.step(0, {"a": sig("a", 200, 0), "b": sig("b", 100 / 1.2, 0)})
    assert h.count("a") == 5 and h.count("b") == 2
    assert Reason.SCALE_UP_DEMAND in plan.reasons["a"]
    assert Reason.HOLD_WITHIN_TOLERANCE in plan.reasons["b"]
    assert plan.target_rps["a"] == pytest.approx(240)
    assert plan.target_rps["b"] == 100  # hold = exactly what runs
    d = h.state.diagnostics["a"]
    assert d.required_rps == pytest.approx(240) and d.current_replicas == 2 and d.desired_replicas == 5
    assert [s.name for s in d.stages] == ["required_rps", "metrics", "stabilize", "behavior"]


def test_scale_up_is_rate_limited_by_behavior():
    h = Harness(config(), cluster(a=1))
    # 1000 req/s on 1 replica wants 24; default behavior allows max(2, 1 + 4) = 5
    plan = h.step(0, {"a": sig("a", 1000, 0), "b": sig("b", 100 / 1.2, 0)})
    assert h.count("a") == 5
    assert Reason.RATE_LIMITED in plan.reasons["a"]
    # 5 s later, same 15 s period: still counted from the period start (1) -> stays 5
    h.step(5, {"a": sig("a", 1000, 5), "b": sig("b", 100 / 1.2, 5)})
    assert h.count("a") == 5
    # next period: from 5, max(10, 9) = 10 (max_replicas 10)
    h.step(15, {"a": sig("a", 1000, 15), "b": sig("b", 100 / 1.2, 15)})
    assert h.count("a") == 10


def test_scale_down_waits_for_stabilization_window():
    # a 5 s level (half the default's, which is the long window) keeps the arithmetic short
    h = Harness(
        config(scale_down=ScalingRules(30, SelectPolicy.MAX, DEFAULT_SCALE_UP.policies[:1]),
               forecast=ForecastConfig(level_tau_s=5.0)), cluster(a=4)
    )
    steady = {"b": sig("b", 100 / 1.2, 0)}
    h.step(0, {"a": sig("a", 4 * 50 / 1.2, 0), **steady})  # floor 200 -> recommendation 4
    recs = []
    for t in (5, 10, 15, 20, 25):
        plan = h.step(t, {"a": sig("a", 40, t), **steady})  # demand fell to 40
        assert h.count("a") == 4
        assert Reason.HOLD_STABILIZATION in plan.reasons["a"]
        recs.append(h.state.last_recommendation["a"])
    # the forecast's level falls with a 5 s time constant:
    # floor 104 at t=5 (3 replicas), 68 at t=10 (2), then toward 40 x 1.2 = 48 (1)
    assert recs == [3, 2, 2, 2, 1]
    assert h.state.diagnostics["a"].floor_rps == pytest.approx(48, rel=0.02)
    # each count holds until the highest recommendation of the last 30 s ages out
    for t, want in ((30, 3), (35, 2), (45, 2), (50, 1)):
        h.step(t, {"a": sig("a", 40, t), **steady})
        assert h.count("a") == want, t


def test_the_forecast_level_moves_with_the_long_window():
    # the level's time constant is the long window unless a forecast config is given
    for w in (10, 60, 120):
        assert config(long_window_s=w).forecasting.level_tau_s == w
    assert config(forecast=ForecastConfig(level_tau_s=7.0)).forecasting.level_tau_s == 7.0
    # so after a drop the floor falls more slowly with a longer window
    floors = {}
    for w in (10, 40):
        h = Harness(config(long_window_s=w), cluster(a=4))
        steady = {"b": sig("b", 100 / 1.2, 0)}
        h.step(0, {"a": sig("a", 4 * 50 / 1.2, 0), **steady})
        h.step(5, {"a": sig("a", 40, 5), **steady})
        floors[w] = h.state.diagnostics["a"].floor_rps
    assert floors[10] < floors[40] < 200


def test_missing_model_holds_while_others_proceed():
    cfg = config(scale_down=ScalingRules(0, SelectPolicy.MAX, DEFAULT_SCALE_UP.policies[:1]))
    h = Harness(cfg, cluster(a=4, b=4))
    plan = h.step(0, {"a": None, "b": sig("b", 40, 0)})
    assert h.count("a") == 4  # blind: holds
    assert h.count("b") == 1  # b scales down normally
    assert Reason.HOLD_MISSING_METRICS in plan.reasons["a"]
    assert plan.target_rps["a"] == 200
    assert not any(a.model == "a" for a in plan.actions)
    assert h.state.diagnostics["a"].metrics_ok is False


def test_stale_signals_are_missing():
    cfg = config(
        scale_down=ScalingRules(0, SelectPolicy.MAX, DEFAULT_SCALE_UP.policies[:1]), metrics_stale_s=60
    )
    h = Harness(cfg, cluster(a=4, b=1))
    plan = h.step(100, {"a": sig("a", 1, 30), "b": sig("b", 30, 100)})  # a sampled 70 s ago
    assert h.count("a") == 4
    assert Reason.HOLD_MISSING_METRICS in plan.reasons["a"]


def test_blind_model_still_grows_toward_last_recommendation():
    h = Harness(config(), cluster(a=1))
    h.step(0, {"a": sig("a", 400, 0), "b": sig("b", 100 / 1.2, 0)})  # wants ceil(9.6)=10, allowed 5
    assert h.count("a") == 5
    plan = h.step(15, {"a": None, "b": sig("b", 100 / 1.2, 15)})
    assert h.count("a") == 10  # grows from what was known, within behavior limits
    assert Reason.HOLD_MISSING_METRICS in plan.reasons["a"]


def test_partial_replica_reports_never_scale_down():
    cfg = config(scale_down=ScalingRules(0, SelectPolicy.MAX, DEFAULT_SCALE_UP.policies[:1]))
    h = Harness(cfg, cluster(a=4))
    # 2 of 4 replicas report 60 req/s in total: per reporter 36 vs 50 says "down";
    # missing ones count as 100% -> (72 + 100) / 200 = 0.86 -> ceil(3.44) = 4: hold
    h.step(0, {"a": sig("a", 60, 0, ready_replicas=2), "b": sig("b", 100 / 1.2, 0)})
    assert h.count("a") == 4


def test_panic_scales_up_on_short_window_and_blocks_scale_down():
    cfg = config(
        long_window_s=60,
        short_window_s=10,
        scale_down=ScalingRules(0, SelectPolicy.MAX, DEFAULT_SCALE_UP.policies[:1]),
    )
    h = Harness(cfg, cluster(a=2))
    b = {"b": sig("b", 100 / 1.2, 0)}
    for t in (0, 5, 10, 15, 20):
        h.step(t, {"a": sig("a", 80, t), **b})
    assert h.count("a") == 2
    # burst: 240 req/s >= 2 x 100 capacity -> panic, size from the short window
    plan = h.step(25, {"a": sig("a", 400, 25), **b})
    assert h.state.panic["a"].panicking
    assert Reason.PANIC_SCALE_UP in plan.reasons["a"]
    grown = h.count("a")
    assert grown > 2
    # the burst ends; while panicking nothing is removed even though demand is low
    for t in (30, 35, 40, 60, 80):
        plan = h.step(t, {"a": sig("a", 20, t), **b})
        assert h.count("a") >= grown
    # 60 s (the stable window) after the last trigger at t=25 the panic ends and scale-down resumes
    for t in (85, 90, 95, 150):
        h.step(t, {"a": sig("a", 20, t), **b})
    assert not h.state.panic["a"].panicking
    assert h.count("a") < grown


def test_correction_factor_raises_capacity_when_p99_exceeds_slo():
    h = Harness(config(), cluster(a=2))
    for t in range(0, 50, 5):
        h.step(t, {"a": sig("a", 70, t, p99_ms=100.0), "b": sig("b", 100 / 1.2, t)})
    d = h.state.diagnostics["a"]
    assert 1.0 < d.correction <= 2.0
    assert d.required_rps == pytest.approx(70 * d.correction * 1.2)
    assert h.count("a") >= 3  # 84 req/s fits in 2 replicas without the correction


def test_overload_latency_does_not_inflate_the_correction():
    # 300 req/s on 100 req/s of capacity: p99 is high because of the backlog,
    # which demand already fixes; learning from it would over-provision later
    h = Harness(config(), cluster(a=2))
    h.step(0, {"a": sig("a", 300, 0, p99_ms=400.0), "b": sig("b", 100 / 1.2, 0)})
    assert h.state.diagnostics["a"].correction == 1.0


def test_a_shedding_model_with_an_optimistic_correction_is_not_stranded():
    # A flash crowd left a at factor 0.5 (replicas serving twice their table). Now
    # 150 req/s arrive at 2 x 50: completions saturate at 100, the queue sheds the
    # rest (pending stays low) and p99 is 6x the SLO. Corrected, 150 counts as 75:
    # it fits, so neither the floor nor the burst layer adds a replica, and the
    # saturation guess (queue 10x compute -> 4 x 100 served) puts utilization at 2,
    # where a miss reads as overload. Only the miss itself can undo the factor.
    h = Harness(config(), cluster(a=2))
    h.state = PolicyState(correction={"a": 0.5})
    for t in range(0, 25, 5):
        fast = FastSignals(t_s=t, window_s=3.0, arrival_rps=150.0, completed_rps=100.0, pending=2.0,
                           avg_queue_ms=300.0, avg_compute_ms=30.0)
        a = sig("a", 100, t, p99_ms=300.0, avg_queue_ms=300.0, avg_compute_ms=30.0, fast=fast)
        h.step(t, {"a": a, "b": sig("b", 100 / 1.2, t)})
    # relaxed to 1 within five ticks (once replicas are added, a miss below full
    # utilization may raise it further, as any optimistic table's would)
    assert h.state.diagnostics["a"].correction >= 0.95
    assert h.count("a") >= 4  # 150 x ~1 x 1.2 = 180 req/s: four replicas of 50


def test_total_outage_holds_everything():
    cfg = config(scale_down=ScalingRules(0, SelectPolicy.MAX, DEFAULT_SCALE_UP.policies[:1]))
    h = Harness(cfg, cluster(a=3, b=3))
    plan = h.step(0, {"a": sig("a", 1, 0), "b": sig("b", 1, 0)}, source_ok=False)
    assert plan.actions == ()
    assert all(Reason.HOLD_MISSING_METRICS in plan.reasons[m] for m in "ab")


def test_from_zero_replicas_sizes_from_best_profile():
    cfg = config(models=(spec("a", lo=0), spec("b")))
    h = Harness(cfg, cluster(a=0, b=1))
    h.step(0, {"a": sig("a", 100, 0), "b": sig("b", 100 / 1.2 / 2, 0)})
    assert h.count("a") == 3  # 120 / 50 -> 3


def test_below_min_replicas_is_clamped_first():
    h = Harness(config(models=(spec("a", lo=2), spec("b"))), cluster(a=0, b=1))
    plan = h.step(0, {"a": None, "b": sig("b", 100 / 1.2 / 2, 0)})
    assert h.count("a") == 2
    assert Reason.MIN_REPLICAS in plan.reasons["a"]


def test_queue_compute_ratio_as_second_metric():
    cfg = config(queue_compute_target=1.0)
    h = Harness(cfg, cluster(a=2))
    # demand says hold (in tolerance) but queue:compute 2.0 says double -> max wins
    h.step(0, {"a": sig("a", 100 / 1.2, 0, queue_compute_ratio=2.0), "b": sig("b", 100 / 1.2, 0)})
    assert h.count("a") == 4
    # the ratio failed and demand says down -> do not scale down
    cfg2 = dataclasses.replace(
        cfg, scale_down=ScalingRules(0, SelectPolicy.MAX, DEFAULT_SCALE_UP.policies[:1])
    )
    h2 = Harness(cfg2, cluster(a=4))
    h2.step(0, {"a": sig("a", 10, 0), "b": sig("b", 100 / 1.2, 0)})
    assert h2.count("a") == 4


def test_every_model_gets_reasons_and_planner_reasons_merge():
    h = Harness(config(), cluster())
    plan = h.step(0, {"a": sig("a", 200, 0), "b": None})
    assert set(plan.reasons) == {"a", "b"}
    assert all(plan.reasons[m] for m in "ab")
    assert h.act.count(ActionKind.CREATE) == 0  # apply_to does not record; the plan does
    assert sum(1 for a in plan.actions if a.kind == ActionKind.CREATE) == 3


def test_from_config_reads_policy_section():
    from autoscaler.config import parse_cluster, parse_models

    models = parse_models(
        {
            "models": [
                {
                    "name": "resnet",
                    "model_dir": "triton_models/resnet",
                    "slo": {"p99_ms": 40},
                    "profiles": ["1g.10gb"],
                    "capacity": {"1g.10gb": 120},
                    "max_replicas": 6,
                }
            ]
        }
    )
    cl = parse_cluster(
        {
            "gpus": [{"node": "n", "product": "A100-SXM4-80GB"}],
            "policy": {
                "tick_s": 2,
                "headroom": 0.5,
                "short_window_s": 4,
                "scale_down": {
                    "stabilization_window_s": 20,
                    "select_policy": "Min",
                    "policies": [{"type": "Pods", "value": 1, "period_s": 10}],
                },
            },
        }
    )
    cfg = policy_config(models, cl)
    assert cfg.tick_s == 2 and cfg.headroom == 0.5 and cfg.short_window_s == 4
    assert cfg.slo_p99_ms == {"resnet": 40}
    assert cfg.spec("resnet").capacity == {"1g.10gb": 120}
    assert cfg.scale_down.stabilization_window_s == 20
    assert cfg.scale_down.select_policy == SelectPolicy.MIN
    assert cfg.scale_down.policies[0].value == 1


def test_with_the_real_planner_on_an_a100():
    """decide's default planner: capacity goes up with demand, a blind model keeps its replicas."""
    from autoscaler.policy.types import ClusterState, GpuState

    cap = {"1g.10gb": 40.0, "2g.20gb": 70.0, "3g.40gb": 100.0}
    specs = (ModelSpec("a", cap, tuple(cap), 1, 8), ModelSpec("b", cap, tuple(cap), 1, 8))
    cl = ClusterState(gpus=(GpuState("n/0", "n", "A100-SXM4-80GB"), GpuState("n/1", "n", "A100-SXM4-80GB")))
    cfg = PolicyConfig(models=specs, churn_budget=None, short_window_s=5, long_window_s=5)
    act, st = RecordingActuator(), PolicyState()

    def tick(t, ra, rb):
        nonlocal cl, st
        sigs = {"a": None if ra is None else sig("a", ra, t), "b": None if rb is None else sig("b", rb, t)}
        plan, st = decide(Observation(t, cl, sigs), st, cfg, t)  # no planner=: the real one
        cl = act.apply_to(cl, plan.actions)
        return plan

    def capacity(m):
        return sum(cap[r.profile] for r in cl.replicas if r.model == m)

    tick(0, 10, 10)
    assert capacity("a") >= 12 and capacity("b") >= 12
    plan = tick(5, 200, 10)
    assert capacity("a") > 100
    assert plan.target_rps["a"] > 100
    before_b = sorted(r.id for r in cl.replicas if r.model == "b")
    plan = tick(10, 200, None)
    assert Reason.HOLD_MISSING_METRICS in plan.reasons["b"]
    assert sorted(r.id for r in cl.replicas if r.model == "b") == before_b


def test_a_multinode_group_counts_as_one_replica():
    """Members are listed per GPU; the policy sees groups (else 2 members > max_replicas 1 every tick)."""
    from autoscaler.policy.capacity import current_capacity
    from autoscaler.policy.types import ClusterState, GpuState, ModelSpec, Replica

    spec = ModelSpec("llm", {}, (), min_replicas=1, max_replicas=1, backend="multinode", nodes_per_group=2,
                     group_capacity_rps=4.0)
    gpus = tuple(GpuState(f"r{i}/0", f"r{i}", "H100-SXM5-80GB", mig_enabled=False, rdma=True) for i in range(4))
    members = [Replica("llm-g0-0", "llm", "whole", "r0/0", 0, ReplicaState.READY),
               Replica("llm-g0-1", "llm", "whole", "r1/0", 0, ReplicaState.READY)]
    assert current_capacity(spec, ClusterState(gpus, tuple(members))) == (1, 4.0, True)
    second = [Replica("llm-g1-0", "llm", "whole", "r2/0", 0, ReplicaState.STARTING),
              Replica("llm-g1-1", "llm", "whole", "r3/0", 0, ReplicaState.STARTING)]
    assert current_capacity(spec, ClusterState(gpus, tuple(members + second))) == (2, 8.0, True)


def test_correction_learns_nothing_while_capacity_is_still_starting():
    # Right after a scale-up the latency window still holds the backlog while
    # capacity already counts the starting replica: not evidence about the table.
    reps = (Replica("a-0", "a", PROFILE, "node-a/0", 0, ReplicaState.READY),
            Replica("a-1", "a", PROFILE, "node-a/0", 1, ReplicaState.STARTING),
            Replica("b-0", "b", PROFILE, "node-a/0", 2, ReplicaState.READY),
            Replica("b-1", "b", PROFILE, "node-a/0", 3, ReplicaState.READY))
    h = Harness(config(), single_gpu_cluster(replicas=reps))
    h.step(0, {"a": sig("a", 70, 0, p99_ms=100.0), "b": sig("b", 100 / 1.2, 0)})
    assert h.state.diagnostics["a"].correction == 1.0


def scaled_up_at_50():
    """Model a with a-0 ready since 0 and a-1 since 50 s; 20 s short and 60 s long windows."""
    cfg = config(short_window_s=20, long_window_s=60)
    reps = (Replica("a-0", "a", PROFILE, "node-a/0", 0, ReplicaState.READY, since_s=0.0),
            Replica("a-1", "a", PROFILE, "node-a/0", 1, ReplicaState.READY, since_s=50.0),
            Replica("b-0", "b", PROFILE, "node-a/0", 2, ReplicaState.READY),
            Replica("b-1", "b", PROFILE, "node-a/0", 3, ReplicaState.READY))
    return Harness(cfg, single_gpu_cluster(replicas=reps))


def test_correction_learns_nothing_from_a_replica_ready_less_than_a_window_ago():
    h = scaled_up_at_50()
    h.step(60, {"a": sig("a", 70, 60, p99_ms=100.0), "b": sig("b", 100 / 1.2, 60)})
    assert h.state.diagnostics["a"].correction == 1.0  # a-1 ready for 10 s < the 20 s short window
    h.step(75, {"a": sig("a", 70, 75, p99_ms=100.0), "b": sig("b", 100 / 1.2, 75)})
    assert h.state.diagnostics["a"].correction > 1.0  # steady for a short window: it learns


def test_a_summary_p99_waits_its_own_window_after_a_scale_up():
    # Triton's summaries keep a minute of quantiles: 25 s after a-1 became ready the p99
    # still holds the one-replica overload before it, so the short window is not enough.
    h = scaled_up_at_50()
    for t in (75, 90, 105):
        h.step(t, {"a": sig("a", 70, t, p99_ms=100.0, latency_window_s=60.0), "b": sig("b", 100 / 1.2, t)})
        assert h.state.diagnostics["a"].correction == 1.0, t
    h.step(115, {"a": sig("a", 70, 115, p99_ms=100.0, latency_window_s=60.0), "b": sig("b", 100 / 1.2, 115)})
    assert h.state.diagnostics["a"].correction > 1.0  # steady for the summary's minute: it learns


@pytest.mark.parametrize("window", [None, 60.0])
def test_a_summary_p99_is_judged_against_the_load_of_its_whole_window(window):
    # Capacity steady at 100 req/s; 150 req/s 30 s ago, 70 now, p99 still over the SLO.
    # A p99 over the metrics window describes the 70 (an optimistic table); one over a
    # minute still holds the overload, which says nothing about the table.
    h = Harness(config(models=(spec("a", hi=2), spec("b")), short_window_s=10, long_window_s=60), cluster(a=2))
    h.step(0, {"a": sig("a", 150, 0, latency_window_s=window), "b": sig("b", 100 / 1.2, 0)})
    for t in (30, 35):
        h.step(t, {"a": sig("a", 70, t, p99_ms=100.0, latency_window_s=window), "b": sig("b", 100 / 1.2, t)})
    learned = h.state.diagnostics["a"].correction > 1.0
    assert learned is (window is None)


@pytest.mark.parametrize("later_rps, learns", [(70, False), (96, True)])
def test_a_fast_summary_p99_shows_a_pessimistic_table_only_if_busy_all_its_window(later_rps, learns):
    # Capacity steady at 100 req/s. At t=0 the model saturates: 99 req/s served and 400
    # queued, a saturation guess far above what arrives. Then `later_rps` arrive and the
    # minute-long p99 is fast (10 ms, a fifth of the SLO). The overload's guess does not
    # make the minute a busy one: only a load busy throughout (96 of 100) shows the
    # table pessimistic and lowers the factor.
    cfg = config(models=(spec("a", hi=2), spec("b")), short_window_s=10, long_window_s=60)
    h = Harness(cfg, cluster(a=2))
    h.step(0, {"a": sig("a", 99, 0, pending=400.0, p99_ms=10.0, latency_window_s=60.0),
               "b": sig("b", 100 / 1.2, 0)})
    for t in (30, 35, 40):
        h.step(t, {"a": sig("a", later_rps, t, p99_ms=10.0, latency_window_s=60.0), "b": sig("b", 100 / 1.2, t)})
    assert (h.state.diagnostics["a"].correction < 1.0) is learns


def test_the_long_window_demand_keeps_replicas_the_lagging_floor_would_remove():
    # 40 req/s for 5 minutes, then a rise to 150 (50 req/s per replica). The burst layer
    # adds the third replica; the level then lags the rise by its time constant, and a
    # floor of 96.7 req/s would take that replica away at once (no scale-down window
    # here) while 150 arrive. The long window's demand keeps it, and never adds one.
    cfg = config(short_window_s=10, long_window_s=30,
                 scale_down=ScalingRules(0, SelectPolicy.MAX, DEFAULT_SCALE_UP.policies[:1]))
    h = Harness(cfg, cluster(a=1))
    for t in range(0, 300, 5):
        h.step(t, {"a": sig("a", 40, t), "b": sig("b", 100 / 1.2, t)})
    h.step(300, {"a": sig("a", 100, 300), "b": sig("b", 100 / 1.2, 300)})
    counts = []
    for t in range(305, 360, 5):
        cap = 50.0 * h.count("a")
        h.step(t, {"a": sig("a", 150, t), "b": sig("b", 100 / 1.2, t)})
        d = h.state.diagnostics["a"]
        counts.append(h.count("a"))
        if d.hold_rps is not None:
            assert d.hold_rps == pytest.approx(min(d.demand_long_rps * 1.2, cap))  # at most what runs
            assert d.required_rps >= d.hold_rps
    assert counts[0] == 3
    assert counts == sorted(counts), counts  # never fewer while the load holds
    assert h.state.diagnostics["a"].floor_rps > 150  # the floor caught up and took over


def test_a_rise_settling_just_under_capacity_gets_headroom_from_the_short_window():
    # 40 req/s for 5 minutes, then 145: the burst layer adds up to 3 x 50 = 150 req/s,
    # and 145 arrive. Neither the burst layer (arrivals below capacity) nor the hold
    # (never above what runs) adds more, and the floor's level trails; the short
    # window leading the long one confirms the rise and asks 145 x 1.2 = 174.
    cfg = config(short_window_s=10, long_window_s=30)
    h = Harness(cfg, cluster(a=1))
    for t in range(0, 300, 5):
        h.step(t, {"a": sig("a", 40, t), "b": sig("b", 100 / 1.2, t)})
        assert h.state.diagnostics["a"].rise_rps is None  # steady: the windows agree
    counts, rises = [], []
    for t in range(300, 340, 5):
        h.step(t, {"a": sig("a", 145, t), "b": sig("b", 100 / 1.2, t)})
        d = h.state.diagnostics["a"]
        counts.append(h.count("a"))
        rises.append(d.rise_rps)
        if d.rise_rps is not None:
            assert d.demand_short_rps > d.demand_long_rps
            assert d.rise_rps == pytest.approx(d.demand_short_rps * 1.2)
            assert d.required_rps >= d.rise_rps
    assert counts[0] == 3  # the burst layer: what arrives, no headroom
    assert d.floor_rps < 150 and d.hold_rps <= 200  # neither would have asked for a fourth
    assert 4 in counts and counts == sorted(counts), (counts, rises)
    assert rises[0] is None or rises[0] <= 150  # the first tick's short window still holds the 40s
    assert any(r is not None and r > 150 for r in rises)
    # a fall is no rise: once the load drops, the short window trails the long one
    for t in range(340, 360, 5):
        h.step(t, {"a": sig("a", 60, t), "b": sig("b", 100 / 1.2, t)})
        assert h.state.diagnostics["a"].rise_rps is None


def test_a_rise_adds_nothing_for_noise_the_floor_already_covers():
    # 30 req/s with a 10 s swing of +-10%: the short window leads the long one every
    # other 10 s, but the floor's envelope (x 1.2) already covers what it reads,
    # so the rise stays out and the count stays at one.
    cfg = config(short_window_s=10, long_window_s=30)
    h = Harness(cfg, cluster(a=1))
    led = 0
    for t in range(0, 900, 5):
        rps = 27 if (t // 10) % 2 == 0 else 33
        h.step(t, {"a": sig("a", rps, t), "b": sig("b", 100 / 1.2, t)})
        d = h.state.diagnostics["a"]
        if t >= 300 and d.demand_short_rps > d.demand_long_rps:
            led += 1
            assert d.floor_rps >= d.demand_short_rps, (t, d)
            assert d.rise_rps is None, (t, d)
    assert led > 20  # the short window led often: the rule was asked, and declined
    assert h.count("a") == 1


def test_a_rise_above_capacity_is_the_burst_layers_and_gets_no_headroom():
    # 40 -> 300 req/s on 50 req/s replicas: while arrivals outrun what runs, the burst
    # layer asks for what arrives and no more; the rise adds its headroom only once
    # the demand is within capacity.
    cfg = config(short_window_s=10, long_window_s=30)
    h = Harness(cfg, cluster(a=1))
    for t in range(0, 300, 5):
        h.step(t, {"a": sig("a", 40, t), "b": sig("b", 100 / 1.2, t)})
    above, rises = 0, []
    for t in range(300, 360, 5):
        cap_before = 50.0 * h.count("a")
        h.step(t, {"a": sig("a", 300, t), "b": sig("b", 100 / 1.2, t)})
        d = h.state.diagnostics["a"]
        rises.append(d.rise_rps)
        if d.demand_short_rps > cap_before:
            above += 1
            assert d.rise_rps is None, (t, d)
    assert above >= 1
    assert any(r is not None and r == pytest.approx(300 * 1.2) for r in rises), rises  # then within capacity
    assert h.count("a") >= 8


def test_a_saturation_guess_scales_up_but_never_feeds_the_floor():
    # 100 req/s served on 100 req/s of capacity with 2000 queued: demand reads
    # 100 + 2000 / 10 s = 300, a guess. Without fast signals it plays the burst
    # layer's part: it scales up on it (no headroom on top), but the forecaster
    # learns nothing from it, so it never becomes a floor.
    h = Harness(config(), cluster(a=2))
    b = {"b": sig("b", 100 / 1.2, 0)}
    h.step(0, {"a": sig("a", 100, 0, pending=2000.0), **b})
    d = h.state.diagnostics["a"]
    assert d.burst_rps == pytest.approx(300.0) and d.required_rps == pytest.approx(300.0)
    assert d.floor_rps is None and h.state.forecast["a"].t_s is None
    assert h.count("a") == 6
    # measured 150 req/s: the floor is 150 x 1.2, the guess is gone
    h.step(5, {"a": sig("a", 150, 5), **b})
    d = h.state.diagnostics["a"]
    assert d.floor_rps == pytest.approx(180.0) and d.burst_rps is None
    assert d.required_rps == pytest.approx(180.0)


def test_a_model_added_or_removed_calls_the_planner_at_once():
    from autoscaler.policy.replan import Memo, Replan, replan, room

    cluster = single_gpu_cluster()

    def key(targets: dict[str, float]) -> tuple:
        return (tuple(sorted(targets.items())), cluster, 4, False, (), ())

    before = {"resnet": 50.0, "rnn": 20.0}
    memo = Memo(key(before), None, None, 100.0, {}, room(cluster))
    caps = {"resnet": 58.0, "rnn": 122.0}
    # 5 s after the last call, nothing urgent: the plan is held (replan_s 60)
    assert replan(memo, key({"resnet": 40.0, "rnn": 20.0}), {"resnet": 40.0, "rnn": 20.0}, caps, {}, 105.0,
                   60.0) is Replan.HOLD
    # rnn removed from the configuration: its replicas must drain now, not within the minute
    assert replan(memo, key({"resnet": 50.0}), {"resnet": 50.0}, caps, {}, 105.0, 60.0) is Replan.MODELS
    # bert added
    added = {**before, "bert": 10.0}
    assert replan(memo, key(added), added, caps, {}, 105.0, 60.0) is Replan.MODELS


def test_a_model_whose_spec_changed_calls_the_planner_at_once():
    """A live config change of replica bounds, profiles or capacities, with the same targets: the
    planner's inputs changed, so the last plan is not this one (it used to be reused: SAME)."""
    from autoscaler.policy.replan import Memo, Replan, replan, room

    cluster = single_gpu_cluster()
    spec = ModelSpec("resnet", {"1g.10gb": 58.0}, ("1g.10gb",), min_replicas=1, max_replicas=8)
    targets = {"resnet": 50.0}

    def key(models: tuple) -> tuple:
        return (tuple(sorted(targets.items())), cluster, 4, False, (), models)

    memo = Memo(key((spec,)), None, None, 100.0, {}, room(cluster))
    assert replan(memo, key((spec,)), targets, {"resnet": 58.0}, {}, 105.0, 60.0) is Replan.SAME
    for changed in (dataclasses.replace(spec, min_replicas=3), dataclasses.replace(spec, max_replicas=2),
                    dataclasses.replace(spec, allowed_profiles=("1g.10gb", "2g.20gb"), capacity={"1g.10gb": 58.0,
                                                                                         "2g.20gb": 113.0})):
        assert replan(memo, key((changed,)), targets, {"resnet": 58.0}, {}, 105.0, 60.0) is Replan.MODELS


def test_a_count_or_a_shortfall_the_last_call_saw_waits_until_the_room_changes():
    """The planner is called again for a new HPA count or a higher target at once;
    for the same count or target only once the room changed (a cut, a gate, a
    replica moved) -- a pod turning Ready opens none, and at 8,000 GPUs a call
    costs ~0.3 s."""
    from autoscaler.policy.replan import Memo, Replan, replan, room

    starting = Replica("resnet-0", "resnet", "1g.10gb", "node-a/0", 0, ReplicaState.STARTING)
    gpu = GpuState("node-a/0", "node-a", "A100-SXM4-80GB", layout=(Placement(0, "1g.10gb"), Placement(1, "1g.10gb")))
    c0 = ClusterState(gpus=(gpu,), replicas=(starting,))
    ready = ClusterState(gpus=(gpu,), replicas=(dataclasses.replace(starting, state=ReplicaState.READY),))
    busy = ClusterState(gpus=(dataclasses.replace(gpu, busy=True),), replicas=(starting,))

    def key(targets: dict[str, float], cluster: ClusterState) -> tuple:
        return (tuple(sorted(targets.items())), cluster, 4, True, (), ())

    targets = {"resnet": 100.0}
    caps = {"resnet": 58.0}  # short: one replica of a target that wants two
    memo = Memo(key(targets, c0), None, None, 100.0, {"resnet": 2}, room(c0))
    # same count, same target, the replica only turned Ready: held
    assert replan(memo, key(targets, ready), targets, caps, {"resnet": 2}, 105.0, 60.0) is Replan.HOLD
    # a new count from the HPA stages: at once
    assert replan(memo, key(targets, ready), targets, caps, {"resnet": 3}, 105.0, 60.0) is Replan.MOVING
    # the same count, but the GPU's gate changed: the held actions may go now
    assert replan(memo, key(targets, busy), targets, caps, {"resnet": 2}, 105.0, 60.0) is Replan.MOVING
    # not moving, still short: a higher target at once, the same one when the room changed
    assert replan(memo, key({"resnet": 110.0}, ready), {"resnet": 110.0}, caps, {}, 105.0, 60.0) is Replan.SHORT
    assert replan(memo, key(targets, ready), targets, caps, {}, 105.0, 60.0) is Replan.HOLD
    assert replan(memo, key(targets, busy), targets, caps, {}, 105.0, 60.0) is Replan.SHORT
    # and whatever happens, at most replan_s apart
    assert replan(memo, key(targets, ready), targets, caps, {"resnet": 2}, 160.0, 60.0) is Replan.PERIODIC


def test_a_replica_that_failed_since_the_last_call_is_urgent_one_it_saw_failed_is_not():
    """A Failed pod stays in the cluster until it is collected: the planner is called when a
    replica fails, not again on every tick while the failed one is still listed."""
    from autoscaler.policy.replan import Memo, Replan, replan, room

    gpu = GpuState("node-a/0", "node-a", "A100-SXM4-80GB", layout=(Placement(0, "1g.10gb"), Placement(1, "1g.10gb")))
    ok = Replica("resnet-0", "resnet", "1g.10gb", "node-a/0", 0, ReplicaState.STARTING)
    bad = Replica("resnet-1", "resnet", "1g.10gb", "node-a/0", 1, ReplicaState.FAILED)
    worse = Replica("resnet-2", "resnet", "1g.10gb", "node-a/0", 1, ReplicaState.FAILED)
    before = ClusterState(gpus=(gpu,), replicas=(ok,))
    failed = ClusterState(gpus=(gpu,), replicas=(ok, bad))

    def key(cluster: ClusterState) -> tuple:
        return ((("resnet", 50.0),), cluster, 4, True, (), ())

    targets, caps = {"resnet": 50.0}, {"resnet": 58.0}
    memo = Memo(key(before), None, None, 100.0, {}, room(before))
    assert replan(memo, key(failed), targets, caps, {}, 105.0, 60.0) is Replan.FAILED
    seen = Memo(key(failed), None, None, 105.0, {}, room(failed))
    # still listed, and only the other replica turned Ready: no call until replan_s
    now_ready = ClusterState(gpus=(gpu,), replicas=(dataclasses.replace(ok, state=ReplicaState.READY), bad))
    assert replan(seen, key(now_ready), targets, caps, {}, 110.0, 60.0) is Replan.HOLD
    assert replan(seen, key(now_ready), targets, caps, {}, 165.0, 60.0) is Replan.PERIODIC
    # another one fails: at once
    assert replan(seen, key(ClusterState(gpus=(gpu,), replicas=(ok, bad, worse))), targets, caps, {}, 110.0,
                   60.0) is Replan.FAILED


def test_a_partial_picture_never_scales_down_even_where_the_missing_pod_rule_would():
    cfg = config(scale_down=ScalingRules(0, SelectPolicy.MAX, DEFAULT_SCALE_UP.policies[:1]))
    h = Harness(cfg, cluster(a=4))
    # 2 of 4 replicas report 5 req/s in total: HPA counts the missing two at 100%,
    # (6 + 100) / 200 = 0.53 -> ceil(2.12) = 3, a scale-down on metrics the policy lacks
    h.step(0, {"a": sig("a", 5, 0, ready_replicas=2), "b": sig("b", 100 / 1.2, 0)})
    assert h.count("a") == 4
    # once every replica reports, the same demand scales down
    h.step(5, {"a": sig("a", 5, 5, ready_replicas=4), "b": sig("b", 100 / 1.2, 5)})
    assert h.count("a") < 4


def test_a_count_held_while_replicas_start_is_not_kept_as_a_recommendation():
    # default scale-down window: 300 s of the highest recommendation
    h = Harness(config(), cluster(a=2))
    b = {"b": sig("b", 100 / 1.2, 0)}
    for t in (0, 5, 10):
        h.step(t, {"a": sig("a", 80, t), **b})  # 96 req/s required: 2 x 50 holds
    assert h.count("a") == 2
    # two more replicas appear, still starting (a move's copies, or a profile mix the
    # planner chose): the missing-pod rule holds all four while they start...
    extra = [Replica(f"a-{i}", "a", PROFILE, "node-a/0", i, ReplicaState.STARTING) for i in (2, 3)]
    h.cluster = dataclasses.replace(h.cluster, replicas=h.cluster.replicas + tuple(extra))
    h.step(15, {"a": sig("a", 80, 15, ready_replicas=2), **b})
    assert h.count("a") == 4
    # ...but the held four are no demand: once all report, the window holds what was asked (2)
    ready = tuple(dataclasses.replace(r, state=ReplicaState.READY) for r in h.cluster.replicas)
    h.cluster = dataclasses.replace(h.cluster, replicas=ready)
    h.step(20, {"a": sig("a", 80, 20, ready_replicas=4), **b})
    assert h.count("a") == 2
