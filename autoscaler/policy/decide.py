"""``decide(observation, state, config, now_s) -> (plan, state)``: the pure core of one tick.

Per model: observed demand -> short/long windows and panic mode -> required
capacity at the SLO (headroom, learned correction) -> replica-equivalents
through the HPA stages (tolerance, missing-pod rules, several metrics,
stabilization, behavior, min/max) -> req/s asked of the planner, which packs
it onto MIG slices. The returned ``PolicyState`` carries everything the next
tick needs; nothing is remembered anywhere else, so the live loop, the
simulator and a replay all make the same decisions.

Replica-equivalents: a model with 3 replicas worth 150 req/s counts 50 req/s
per replica; HPA's arithmetic runs on those counts and the result is turned
back into req/s (4 replicas -> 200 req/s) for the planner, which may meet it
with a different mix of profiles.

Missing data: a model without a request rate holds its current capacity
(never scales down on a partial picture) but may still grow toward its last
known recommendation, within the behavior limits. So does a model with a live
replica that reports nothing yet; the count HPA's missing-pod rule holds for it
is not kept as a recommendation (``_Step.recorded``).

The steps live apart, each pure: ``seen.py`` observes one model (windows,
panic, correction, forecaster, headroom); this module predicts the req/s
required (floor, burst, hold, rise), runs the HPA stages and asks the planner;
``peaks.py`` keeps the right-size window's peaks; ``replan.py`` says
whether the planner runs this tick; ``state.py`` holds the config, the state
and the diagnostics; ``capacity.py`` reads what runs. The forecaster
(``forecast.py``), the burst layer (``burst.py``), the HPA arithmetic
(``hpa.py``) and the planner (``planner/``) are their own modules.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass, field

from autoscaler.policy import burst as bu
from autoscaler.policy import demand as dm
from autoscaler.policy import forecast as fc
from autoscaler.policy import hpa
from autoscaler.policy import spares as sp
from autoscaler.policy.capacity import best_replica_capacity, by_model
from autoscaler.policy.peaks import held_rps, record_peak
from autoscaler.policy.replan import Memo, PlannerFn, Replan, replan, room
from autoscaler.policy.seen import Seen, observe_model, valid_rate
from autoscaler.policy.state import ModelDiagnostics, PolicyConfig, PolicyState, Stage
from autoscaler.policy.types import ClusterState, ModelSpec, Observation, Plan, Reason, RepartitionScope


def _default_planner() -> PlannerFn:
    from autoscaler.policy.planner import plan  # written alongside; imported lazily

    return plan


@dataclass
class _Step:
    """One model's working values inside ``decide`` (mutable scratch, never returned)."""

    n: int  # live replicas now
    cap: float  # their req/s
    per_replica: float | None  # req/s of one replica-equivalent
    required: float | None  # req/s needed (None: blind)
    stages: list[Stage] = field(default_factory=list)
    why: list[Reason] = field(default_factory=list)
    demand_driven: bool = True  # the demand metric (not queue:compute) set the proposal
    partial: bool = False  # some live replica reports no metrics (starting, or its scrape missing)
    # On a partial picture: the proposal had every live replica reported its share
    # (``_propose``); what the stabilization window keeps instead of the held count.
    recorded: int | None = None


def _propose(
    step: _Step,
    spec: ModelSpec,
    sig,
    panic: dm.PanicState,
    last_rec: int | None,
    obs: Observation,
    config: PolicyConfig,
) -> tuple[int, int | None]:
    """Stages 1+2: (desired, proposal for stabilization or None to skip it)."""
    n, required, per_replica = step.n, step.required, step.per_replica
    if n < spec.min_replicas or (n > spec.max_replicas and n > 0):
        desired, r = hpa.clamp(n, spec.min_replicas, spec.max_replicas)  # HPA: before any metric
        step.stages.append(Stage("clamp_current", desired, r))
        return desired, None
    if required is None:
        # Blind: hold, but keep growing toward the last known recommendation.
        desired = max(n, last_rec if last_rec is not None else n)
        if not valid_rate(obs.models.get(spec.name)):
            step.why.append(Reason.INVALID_METRIC)
        step.why.append(Reason.HOLD_MISSING_METRICS)
        step.stages.append(Stage("missing_metrics", desired, Reason.HOLD_MISSING_METRICS))
        return desired, desired
    if n == 0 or not per_replica:
        # Nothing running (HPA is disabled at 0): size from the best profile directly.
        desired = math.ceil(required / per_replica) if per_replica else spec.min_replicas
        step.stages.append(
            Stage("from_zero", desired, Reason.SCALE_UP_DEMAND if desired > n else Reason.KEEP)
        )
        return desired, desired
    # HPA type: Pods -- each reporting replica carries required / k; the rest are missing
    k = n if sig.ready_replicas is None else max(0, min(n, sig.ready_replicas))
    step.partial = k < n
    values: list[float | None] = [required / k] * k + [None] * (n - k) if k else [None] * n
    # The tolerance damps scale-downs only: a rise the floor or the burst layer asks
    # for is what the learned headroom says the SLO needs, and HPA's 10% band would
    # hold a model 9% short of it.
    tol = 0.0 if required > step.cap * (1 + 1e-9) else config.tolerance
    proposals = [hpa.pods_metric_replicas(n, values, per_replica, tol)]
    if config.queue_compute_target is not None:
        qcr = sig.queue_compute_ratio
        proposals.append(
            None if qcr is None else hpa.replica_ratio(n, qcr, config.queue_compute_target, config.tolerance)
        )
    desired, r = hpa.combine_metrics(n, proposals)
    step.demand_driven = proposals[0] is not None and desired == proposals[0][0]
    step.stages.append(Stage("metrics", desired, r))
    if panic.panicking and desired < n:
        desired = n  # Knative: never scale down while panicking
        step.stages.append(Stage("panic", desired, Reason.HOLD_PANIC))
    if step.partial:
        # The missing-pod rule holds this tick's count while replicas start, but the
        # held count is no recommendation: a make-before-break move's copies would
        # otherwise sit in the scale-down window as demand for its whole 300 s.
        full = hpa.combine_metrics(n, [hpa.pods_metric_replicas(n, [required / n] * n, per_replica, tol)]
                                   + proposals[1:])[0]
        step.recorded = max(full, n) if panic.panicking else full
    return desired, desired


def _target_rps(step: _Step, desired: int, held_rps: float | None = None) -> float:
    """Replica-equivalents back to req/s for the planner.

    ``held_rps``: when the count holds, the highest req/s required over the
    right-size window (``rightsize_window_s``, 30 min by default; None: some of
    it was blind, or right-sizing is off). Asking the planner for that instead
    of the running capacity lets it right-size profiles -- swap a 7g replica
    left over from a burst for a 2g once demand has stayed low for the window;
    the planner only does so when it frees whole slices on an instance that
    exists now. Measured on the 24 h benchmark (4 seeds): 6% fewer GPU-hours
    for 0.1 points of SLO attainment; with the 300 s scale-down window instead
    of 30 min it cost 0.5 points (the oversized replica's slack was absorbing
    bursts).

    Blind, or on a partial picture (a live replica without metrics: starting,
    or its scrape missing), a holding count holds what runs, whole: right-sizing
    then would remove capacity the policy cannot see yet, as a scale-down would.
    """
    n, cap, per_replica = step.n, step.cap, step.per_replica
    if desired == n and n > 0 and cap > 0:
        if held_rps is not None and step.required is not None and not step.partial:
            return min(cap, held_rps)
        return cap  # hold exactly what runs now
    if not per_replica:
        return 0.0
    tgt = per_replica * desired
    if desired > n and step.required is not None and step.demand_driven:
        # up to the rate limit, but no more than needed: the planner may meet
        # 130 req/s with cheaper profiles than 3 x 50
        tgt = max(min(step.required, tgt), cap)
    return tgt


# A repartition shorter than this costs about what a replica start does: then the
# most efficient profiles are worth cutting for, even in a burst.
FAST_PATH_MIN_REPARTITION_S = 30.0


@dataclass(frozen=True)
class _Prediction:
    floor: float | None
    burst: float | None
    hold: float | None
    rise: float | None
    headroom: float
    required: float | None


def _predict(seen: Seen, cfg: PolicyConfig, now_s: float) -> _Prediction:
    """required = max(floor, burst, hold, rise).

    floor: the forecaster's envelope over the reaction horizon. burst: what the
    fast signals show arriving now plus the backlog (``burst.demand``); without
    fast signals, the metrics window's demand, saturation guess included, plays
    that part. Neither feeds back into the forecaster, so a burst never ratchets
    the floor. hold: the long window's demand x correction x (1 + headroom), capped
    at the capacity that runs, so it can keep replicas but never add one. rise:
    while the short window's demand leads the long window's (a rise both have
    seen) and that demand lies above the floor and within capacity, the short
    window's demand x correction x (1 + headroom)."""
    hroom = fc.current(seen.headroom, cfg.headroom_learning)
    floor = seen.envelope * seen.corr * (1.0 + hroom) if seen.envelope is not None else None
    fast = seen.sig.fast if seen.sig is not None else None
    bdem = bu.demand(fast, now_s, seen.cap if seen.cap > 0 else None, cfg.burst)
    if bdem is None:
        bdem = seen.observed
    # Only once arrivals outrun what runs: below that the floor decides, and a noisy
    # 5 s sample above the floor is no reason for a replica. No headroom on top: the
    # layer asks for what arrives now, and the floor catches up behind it.
    burst = bdem * seen.corr if bdem is not None and bdem > seen.cap else None
    # The demand the long window measured may keep what runs, never add to it: the
    # level lags a rise by its time constant, and a floor still below what already
    # arrives would take the headroom away while the load holds. On make demo's
    # 40 -> 174 req/s rise the floor asked for 3 of resnet's 4 replicas for 25 s and
    # only the scale-down window kept the fourth (one run lost it at 63 s and made it
    # again at 68 s). Adding, it stays the floor's and the burst layer's job.
    # Only from measured rates: a saturation guess in the window would hold what it
    # asked for, as a guess fed to the forecaster would ratchet the floor.
    est = seen.est
    hold = None
    measured_only = not any(x.guess for x in seen.hist if x.t_s > now_s - cfg.long_window_s)
    if est is not None and est.long_rps is not None and measured_only and seen.cap > 0:
        hold = min(est.long_rps * seen.corr * (1.0 + hroom), seen.cap)
    # A rise that settles between capacity / (1 + headroom) and capacity is left
    # without headroom by the other three: the burst layer waits for arrivals
    # above capacity, the hold may not add, and the floor's level trails by its
    # time constant. On make demo's 40 -> 174 req/s step (three resnet replicas
    # serve exactly 174) three replicas ran at 94% of their capacity for 25 s
    # while the floor caught up. The short window leading the long one confirms
    # the rise; from measured rates only, for the hold's reason. It adds only in
    # that gap: demand the floor already covers is noise its envelope priced in
    # (the floor carries the headroom), and demand above capacity is the burst
    # layer's, which asks for what arrives and no more.
    rise = None
    if est is not None and est.short_rps is not None and est.long_rps is not None and measured_only \
            and est.short_rps > est.long_rps:
        now_rps = est.short_rps * seen.corr
        if (floor is None or now_rps > floor) and now_rps <= seen.cap:
            rise = now_rps * (1.0 + hroom)
    vals = [v for v in (floor, burst, hold, rise) if v is not None]
    return _Prediction(floor, burst, hold, rise, hroom, max(vals) if vals else None)


def decide(
    observation: Observation,
    state: PolicyState,
    config: PolicyConfig,
    now_s: float,
    *,
    planner: PlannerFn | None = None,
) -> tuple[Plan, PolicyState]:
    """One pure decision. ``planner`` defaults to ``autoscaler.policy.planner.core.plan``."""
    plan_fn = planner or _default_planner()
    demand, panic, corr = dict(state.demand), dict(state.panic), dict(state.correction)
    recs, events = dict(state.recommendations), dict(state.scale_events)
    last_rec, diags = dict(state.last_recommendation), {}
    target_rps: dict[str, float] = {}
    reasons: dict[str, tuple[Reason, ...]] = {}
    keep_recs = max(config.scale_up.stabilization_window_s, config.scale_down.stabilization_window_s)
    keep_peaks = max(config.scale_down.stabilization_window_s, config.rightsize_window_s or 0.0)
    peaks = dict(state.required_peaks)
    keep_events = hpa.longest_period_s(config.scale_up, config.scale_down)

    fcs, hrs = dict(state.forecast), dict(state.headroom)
    caps: dict[str, float] = {}  # live capacity per model, for replan
    moving: set[str] = set()  # models whose replica count the HPA stages changed
    counts: dict[str, int] = {}  # the HPA stages' replica count per model, for replan
    own = by_model(observation.cluster)
    none = ClusterState(observation.cluster.gpus, ())
    for spec in config.models:
        name = spec.name
        seen = observe_model(observation, state, config, spec, now_s, own.get(name, none))
        sig, observed, p, c, est, n, cap = seen.sig, seen.observed, seen.panic, seen.corr, seen.est, seen.n, seen.cap
        demand[name], corr[name], fcs[name], hrs[name] = seen.hist, c, seen.forecast, seen.headroom
        step = _Step(n, cap, cap / n if n and cap > 0 else best_replica_capacity(spec), None)
        caps[name] = cap
        pred = _predict(seen, config, now_s)
        if observed is not None:
            step.required = pred.required
            step.stages.append(Stage("required_rps", step.required, Reason.KEEP))
        panic[name] = p

        # ---- stages 1+2: metric proposals (replica-equivalents)
        desired, proposal = _propose(step, spec, sig, p, last_rec.get(name), observation, config)

        # ---- stages 3+4: stabilization, then behavior and min/max (HPA order)
        if proposal is not None:
            recorded = step.recorded if step.recorded is not None else proposal
            if step.required is not None:
                last_rec[name] = recorded
            if name not in recs:
                # HPA seeds the history with the current count when it first sees a
                # target, so a restarted controller does not scale down at once.
                recs[name] = (hpa.Recommendation(now_s, n),)
                peaks[name] = record_peak(peaks.get(name, ()), now_s, None, keep_peaks)
            stab, r = hpa.stabilize(
                n,
                proposal,
                recs[name],
                now_s,
                config.scale_up.stabilization_window_s,
                config.scale_down.stabilization_window_s,
            )
            step.stages.append(Stage("stabilize", stab, r))
            if step.required is not None:  # a blind guess is not a recommendation
                recs[name] = hpa.record_recommendation(
                    recs[name], hpa.Recommendation(now_s, recorded, step.required), keep_recs
                )
                peaks[name] = record_peak(peaks.get(name, ()), now_s, step.required, keep_peaks)
            desired, r = hpa.apply_behavior(
                n,
                stab,
                spec.min_replicas,
                spec.max_replicas,
                events.get(name, ()),
                config.scale_up,
                config.scale_down,
                now_s,
            )
            step.stages.append(Stage("behavior", desired, r))
        if (step.required is None or step.partial) and desired < n:
            desired = n  # never below current while blind, or on a partial picture
        events[name] = hpa.record_scale_event(events.get(name, ()), now_s, n, desired, keep_events)
        if desired != n:
            moving.add(name)
        counts[name] = desired
        target_rps[name] = tgt = _target_rps(step, desired, held_rps(
            peaks.get(name, ()), now_s, config.rightsize_window_s, config.scale_down.stabilization_window_s))

        why = step.why
        for st in step.stages:
            if st.reason is not Reason.KEEP and st.reason not in why:
                why.append(st.reason)
        if p.panicking and desired > n and Reason.PANIC_SCALE_UP not in why:
            why.insert(0, Reason.PANIC_SCALE_UP)
        reasons[name] = tuple(why) or (Reason.KEEP,)
        diags[name] = ModelDiagnostics(
            model=name,
            metrics_ok=step.required is not None,
            observed_rps=observed,
            demand_short_rps=est.short_rps if est else None,
            demand_long_rps=est.long_rps if est else None,
            demand_used_rps=est.used_rps if est else None,
            panicking=p.panicking,
            correction=c,
            current_replicas=n,
            current_capacity_rps=cap,
            required_rps=step.required,
            forecast_rps=seen.envelope,
            floor_rps=pred.floor,
            burst_rps=pred.burst,
            hold_rps=pred.hold,
            rise_rps=pred.rise,
            headroom=pred.headroom,
            headroom_learned=seen.headroom.value is not None,
            headroom_quantile=config.headroom_quantile,
            headroom_samples=len(seen.headroom.ratios),
            horizon_s=seen.horizon_s,
            cycle_s=fc.cycle(seen.forecast, config.forecasting),
            recurring_rps=seen.recurring,
            p99_ms=sig.p99_ms if sig else None,
            slo_p99_ms=config.slo_p99_ms.get(name),
            stages=tuple(step.stages),
            desired_replicas=desired,
            target_rps=tgt,
        )

    fast_path = config.repartition_s >= FAST_PATH_MIN_REPARTITION_S
    # Warm spares pay only where a new slice costs a repartition (the fast path's worlds).
    spare_horizon = config.repartition_s + config.replica_start_s
    spares = sp.wanted(state.spares, now_s, spare_horizon, config.spares) if fast_path else {}
    key = (tuple(sorted(target_rps.items())), observation.cluster, config.churn_budget, fast_path,
           tuple(sorted(spares.items())), tuple(config.models))
    memo = state.planner_memo if state.planner_memo is not None and state.planner_memo.planner is planner else None
    why = replan(memo, key, target_rps, caps, {n: counts[n] for n in moving}, now_s, config.replan_s)
    spare_state = state.spares
    if why is Replan.SAME:
        plan = dataclasses.replace(memo.plan, t_s=now_s)
    elif why is Replan.HOLD:
        plan = dataclasses.replace(memo.plan, t_s=now_s, actions=())
    else:
        plan = plan_fn(
            config.models, target_rps, observation.cluster, churn_budget=config.churn_budget, now_s=now_s,
            fast_path=fast_path,
            **({"spares": spares} if spares else {}),
            **({"repartition_scope": config.repartition_scope}
               if spares or config.repartition_scope is not RepartitionScope.GPU else {}),
        )
        memo = Memo(key, plan, planner, now_s, counts, room(observation.cluster))
        spare_state = sp.record(spare_state, now_s, sp.cold_creates(plan.actions), config.spares)
    plan = dataclasses.replace(plan, reasons=_merge_reasons(reasons, plan.reasons), target_rps=target_rps)
    new_state = PolicyState(
        forecast=fcs,
        headroom=hrs,
        demand=demand,
        recommendations=recs,
        required_peaks=peaks,
        scale_events=events,
        panic=panic,
        correction=corr,
        last_recommendation=last_rec,
        last_plan=plan,
        planner_memo=memo,
        diagnostics=diags,
        spares=spare_state,
        t_s=now_s,
        replan=why,
    )
    return plan, new_state


def _merge_reasons(
    ours: Mapping[str, tuple[Reason, ...]], planner: Mapping[str, tuple[Reason, ...]]
) -> dict[str, tuple[Reason, ...]]:
    """Policy reasons first, then the planner's; KEEP only when nothing else is said."""
    merged: dict[str, tuple[Reason, ...]] = {}
    for name in [*ours, *(m for m in planner if m not in ours)]:
        out = list(ours.get(name, ()))
        out += [r for r in planner.get(name, ()) if r not in out]
        if len(out) > 1 and Reason.KEEP in out:
            out.remove(Reason.KEEP)
        merged[name] = tuple(out)
    return merged
