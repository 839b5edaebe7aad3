"""``SimCluster``: a simulated cluster that is the Inventory, Actuator and MetricsSource of the loop.

Place in the loop: the simulator's stand-in for everything outside the pure
core. The production ``ControlLoop`` reads ``snapshot()`` and ``read()`` and
calls ``apply()`` exactly as it does against the local or Kubernetes backend;
between ticks ``advance()`` moves the world forward one integration step.
No policy code lives here: the cluster only does what it is told, with
realistic delays, and reports what happened with a realistic lag.

What it models (defaults in ``SimConfig``):

- **Replicas.** One replica = one MIG instance. CREATE starts a replica that is
  READY ``start_delay_s`` later (30 s default: a Kubernetes pod with a cached
  Triton image loading a small model; a local ``tritonserver`` is ~2 s, see
  docs/triton-local.md, pass ``start_delay_s=2`` for that). DRAIN stops routing
  at once and finishes in-flight work in ``drain_s``; DELETE of a draining
  replica takes it away once the drain ends.
- **Repartition.** REPARTITION needs the affected instances empty (a replica
  still on them that is being drained makes it wait; one that nobody drains
  is an error), then holds the GPU for ``repartition_delay_s`` (180 s, the
  mig-manager figure of docs/gpu-operator.md). Replicas created on it meanwhile start
  when it finishes.
- **Actions.** The actuator contract of ``autoscaler/protocols.py``, carried
  out by ``SimActions`` (``actions.py``): independent chains, a WAIT_READY or
  a wait for a drain holding up only the rest of its chain, ``in_flight()``
  for the loop's per-GPU gate. Queued chains move on in ``_timers`` as
  simulated time passes.
- **Service.** Each READY replica is a fluid M/M/1 queue (``queueing.py``), served
  at one rate or, where Poisson points were measured, at the rate its
  occupancy calls for (``queueing.ServiceCurve``);
  requests queued beyond ``queue_timeout_s`` (or, with ``shed_at_slo``, beyond
  their model's SLO) are dropped (misses).
  The router splits a model's traffic in proportion to replica service rate
  (least-connections behaves so; a plain round-robin would overload small
  slices). Requests of a model with no READY replica fail.
- **Metrics.** ``read(now)`` reports window averages over
  ``[now - scrape_delay_s - metrics_window_s, now - scrape_delay_s]``: what a
  Prometheus ``rate(...[30s])`` evaluated on 15 s-old samples would say.
  ``request_rate`` is the completed rate, which saturates at capacity, plus the
  requests a replica's queue dropped (Triton counts both: success + failure),
  and ``pending`` the queued requests, as Triton reports them. Compute time
  per request is the whole batch's, as Triton counts it (``max_batch``). A request that
  arrives while its model has no READY replica fails (it counts against the
  SLO) but no replica's counters hold it, so no metric counts it either; a
  model with no READY replica in the whole window reads as missing (None), as
  a Prometheus query over no series does, never as a measured 0.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np
from scipy.special import gammainc

from autoscaler.clock import VirtualClock
from autoscaler.mig import get_product
from autoscaler.policy.types import Action, ClusterState, GpuState, ModelSpec, Replica, ReplicaState
from autoscaler.protocols import ActionQueue
from autoscaler.sim import queueing as q
from autoscaler.sim.actions import SimActions
from autoscaler.sim.metrics import SimMetrics
from autoscaler.sim.records import Repartition, SimConfig, SimReplica

__all__ = ["SimCluster", "SimConfig"]


class SimCluster(SimActions, SimMetrics):
    """The world the loop acts on. ``advance()`` is called every ``step_s`` by ``sim.run``."""

    def __init__(
        self,
        specs: Sequence[ModelSpec],
        slo_ms: Mapping[str, float],
        initial: ClusterState,
        clock: VirtualClock,
        config: SimConfig | None = None,
        *,
        service_rps: Mapping[str, Mapping[str, float]] | None = None,
        service_curves: Mapping[str, Mapping[str, q.ServiceCurve]] | None = None,
        max_batch: Mapping[str, int] | None = None,
        record_sojourns: bool = False,
    ) -> None:
        """``service_rps``: the world's true service rate per model and profile,
        when it has been measured (a replica's saturation throughput, e.g. by
        ``benchmarks/fidelity.py``). Without it the rate is derived from the
        capacity table, which is then both the policy's belief and the world's
        truth; with it the two can differ, as they do when a table is an
        estimate. ``service_curves``: per model and profile, the measured p99 at
        several Poisson rates (``queueing.ServiceCurve``); such a replica's queue is
        served at its curve's rate, while ``service_rps`` still splits the traffic.
        ``max_batch``: per model, the largest batch its dynamic batcher forms
        (the model's ``config.pbtxt``); models not named take ``config.max_batch``.
        ``record_sojourns`` keeps each step's per-replica sojourn
        distribution so ``sojourn_quantile`` can give the exact quantile over a
        phase (costs memory; the fidelity comparison uses it, the 24 h
        benchmark does not)."""
        self.config = config or SimConfig()
        self.service_rps = {m: dict(v) for m, v in (service_rps or {}).items()}
        self.service_curves = {m: dict(v) for m, v in (service_curves or {}).items()}
        bad = {m: b for m, b in (max_batch or {}).items() if not (isinstance(b, int) and b >= 1)}
        if bad:
            raise ValueError(f"max_batch: must be integers >= 1, got {bad}")
        # per step: model index -> (arrivals, sojourn scale, sojourn shape), per replica
        self._sojourns: list[dict[int, tuple[np.ndarray, np.ndarray, np.ndarray]]] | None = [] if record_sojourns else None
        self.clock = clock
        self.specs = {s.name: s for s in specs}
        self.models = [s.name for s in specs]
        self.midx = {m: i for i, m in enumerate(self.models)}
        missing = [m for m in self.models if m not in slo_ms]
        if missing:
            raise ValueError(f"slo_ms: no p99 target for models {missing}")
        self.slo_s = np.array([slo_ms[m] / 1000.0 for m in self.models])
        self.max_batch = np.array([float((max_batch or {}).get(m, self.config.max_batch)) for m in self.models])
        self.gpus: dict[str, GpuState] = {g.id: g for g in initial.gpus}
        self._reps: dict[str, SimReplica] = {}
        self._repart: dict[str, Repartition] = {}
        self.queue = ActionQueue()  # action chains still waiting
        self.fail_starts: set[str] = set()  # replica ids or models whose start fails (faults, see actions.py)
        self._seq = 0
        self.late_errors: list[str] = []  # queued actions that failed later (all of them, for the score)
        self.reconfigurations = 0
        self.creates = 0
        self.deletes = 0
        self.apply_calls: list[tuple[float, tuple[Action, ...]]] = []
        # per-step history (index k covers [t[k], t[k] + step_s))
        self.t: list[float] = []
        n = len(self.models)
        self._cum = {k: [np.zeros(n)] for k in ("arr", "ok", "done", "wait", "comp", "p99w", "fail", "drop", "lost")}
        self.pending: list[np.ndarray] = []  # queued requests per model at the end of each step
        self.capacity: list[np.ndarray] = []  # req/s at SLO of READY replicas per model
        self.p99_s: list[np.ndarray] = []  # worst replica p99 per model (nan: no traffic)
        self.gpus_in_use: list[int] = []
        self.slices_in_use: list[int] = []
        self.ready_count: list[np.ndarray] = []
        for r in initial.replicas:  # pre-existing replicas: ready at once
            self._add(r.model, r.profile, r.gpu, r.start, ready_at=None, rid=r.id, state=ReplicaState.READY)

    # ------------------------------------------------------------ Inventory

    def snapshot(self) -> ClusterState:
        self._timers(self.clock.now())
        reps = tuple(
            Replica(r.id, r.model, r.profile, r.gpu, r.start, r.state, r.since_s)
            for r in sorted(self._reps.values(), key=lambda r: r.id)
        )
        return ClusterState(tuple(self.gpus.values()), reps)

    def _add(
        self, model: str, profile: str, gpu: str, start: int, *, ready_at: float | None, rid: str | None = None,
        state: ReplicaState = ReplicaState.STARTING,
    ) -> str:
        self._seq += 1
        rid = rid or f"{model}-{self._seq}"
        spec = self.specs[model]
        cap = float(spec.capacity[profile])
        mu = self.service_rps.get(model, {}).get(profile) or q.service_rate(cap, float(self.slo_s[self.midx[model]] * 1000.0))
        compute = get_product(self.gpus[gpu].product).profile(profile).compute
        now = self.clock.now()
        self._reps[rid] = SimReplica(rid, model, profile, gpu, start, mu, cap, compute, state, now, ready_at,
                               first_step=len(self.t),
                               curve=self.service_curves.get(model, {}).get(profile))
        return rid

    def _remove(self, r: SimReplica) -> None:
        self._reps.pop(r.id, None)
        self.deletes += 1

    # ------------------------------------------------------------ the world moves

    def advance(self, rates_rps: np.ndarray, dt: float | None = None) -> None:
        """Integrate one step of ``dt`` (default ``step_s``) at per-model arrival rates, then move the clock."""
        dt = self.config.step_s if dt is None else dt
        now = self.clock.now()
        self._timers(now)
        self._integrate(np.asarray(rates_rps, dtype=float), dt, now)
        self.clock.advance(dt)

    def _timers(self, now: float) -> None:
        """Due repartitions, starts and drains, then the blocked actions that can now proceed."""
        for gid, rp in list(self._repart.items()):
            if rp.done_at <= now:
                del self._repart[gid]
                for r in self._reps.values():
                    if r.gpu == gid and r.ready_at is None and r.state == ReplicaState.STARTING:
                        r.ready_at = now + self.config.start_delay_s
        for r in list(self._reps.values()):
            if r.delete_when_drained and r.drained_at is not None and r.drained_at <= now:
                self._remove(r)
                continue
            if r.state == ReplicaState.STARTING and r.ready_at is not None and r.ready_at <= now:
                failed = r.id in self.fail_starts or r.model in self.fail_starts
                r.state, r.since_s = (ReplicaState.FAILED if failed else ReplicaState.READY), r.ready_at
        if self.queue:
            self._run_queue(now)

    def _integrate(self, lam_m: np.ndarray, dt: float, now: float) -> None:
        n = len(self.models)
        ready = [r for r in self._reps.values() if r.state == ReplicaState.READY]
        draining = [r for r in self._reps.values() if r.state == ReplicaState.DRAINING]
        arr = lam_m * dt
        ok = np.zeros(n)
        done = np.zeros(n)
        wait = np.zeros(n)
        comp = np.zeros(n)
        p99w = np.zeros(n)
        cap = np.zeros(n)
        pend = np.zeros(n)
        worst = np.full(n, np.nan)
        nready = np.zeros(n)
        if ready:
            mi = np.array([self.midx[r.model] for r in ready])
            mu = np.array([r.mu for r in ready])
            x0 = np.array([r.x for r in ready])
            mu_tot = np.bincount(mi, weights=mu, minlength=n)
            share = mu / mu_tot[mi]
            lam = lam_m[mi] * share
            slo = self.slo_s[mi]
            shape = None
            if self.service_curves:
                curves = [r.curve for r in ready]
                mu, shape = q.curve_rates(curves, mu, x0, lam, dt), q.curve_shapes(curves)
            x_raw, x1, within = q.step(x0, lam, mu, dt, slo,
                                       slo if self.config.shed_at_slo else self.config.queue_timeout_s, shape)
            xm = 0.5 * (x0 + x1)
            a_i = lam * dt
            b = q.busy(xm)
            ok = np.bincount(mi, weights=a_i * within, minlength=n)
            done = np.bincount(mi, weights=np.maximum(a_i - (x_raw - x0), 0.0), minlength=n)
            dropped = np.bincount(mi, weights=x_raw - x1, minlength=n)
            wait = np.bincount(mi, weights=a_i * xm / mu, minlength=n)
            batch = q.mean_batch(xm, self.max_batch[mi])
            comp = np.bincount(mi, weights=a_i * batch / mu, minlength=n)
            p99 = q.quantile_s(xm, mu, 0.99, shape)
            p99w = np.bincount(mi, weights=a_i * p99, minlength=n)
            cap = np.bincount(mi, weights=np.array([r.capacity for r in ready]), minlength=n)
            pend = np.bincount(mi, weights=np.maximum(x1 - q.busy(x1), 0.0), minlength=n)
            nready = np.bincount(mi, minlength=n).astype(float)
            np.fmax.at(worst, mi, np.where(lam > 0, p99, np.nan))
            if self._sojourns is not None:  # an arrival finding xm: a gamma sojourn (shape 1: M/M/1's)
                scale = q.sojourn_scale(xm, mu, shape)
                k = np.ones(len(ready)) if shape is None else shape
                self._sojourns.append({int(j): (a_i[mi == j], scale[mi == j], k[mi == j]) for j in set(mi.tolist())})
            for i, r in enumerate(ready):
                r.x = float(x1[i])
                prev = r.cum_busy[-1] if r.cum_busy else 0.0
                r.cum_busy.append(prev + float(b[i]) * dt)
        for r in draining:  # finishes what it holds; no new arrivals
            mu_r = np.array([r.mu])
            if r.curve is not None:
                mu_r = q.curve_rates([r.curve], mu_r, np.array([r.x]), np.zeros(1), dt)
            x1 = q.step_x(np.array([r.x]), np.zeros(1), mu_r, dt)
            prev = r.cum_busy[-1] if r.cum_busy else 0.0
            r.cum_busy.append(prev + float(q.busy(0.5 * (r.x + x1[0]))) * dt)
            r.x = float(x1[0])
        for r in self._reps.values():
            if r.state == ReplicaState.STARTING:  # keeps the per-step index aligned
                r.cum_busy.append(r.cum_busy[-1] if r.cum_busy else 0.0)
        if self._sojourns is not None and not ready:
            self._sojourns.append({})
        drop = dropped if ready else np.zeros(n)  # Triton's own failures: counted in its metrics
        lost = np.where(nready == 0, arr, 0.0)  # no replica to take them: no Triton counts them
        fail = lost + drop
        c = self._cum
        for key, val in (("arr", arr), ("ok", ok), ("done", done), ("wait", wait), ("comp", comp),
                         ("p99w", p99w), ("fail", fail), ("drop", drop), ("lost", lost)):
            c[key].append(c[key][-1] + val)
        self.t.append(now)
        self.pending.append(pend)
        self.capacity.append(cap)
        self.p99_s.append(worst)
        self.ready_count.append(nready)
        used_gpus = {r.gpu for r in self._reps.values()} | set(self._repart)
        self.gpus_in_use.append(len(used_gpus))
        self.slices_in_use.append(sum(r.compute for r in self._reps.values()))

    def sojourn_quantile(self, model: str, t0_s: float, t1_s: float, q_: float) -> float | None:
        """The ``q_`` quantile (seconds) of the sojourn of ``model``'s requests arriving in
        ``[t0_s, t1_s)``, failed and dropped ones counted as never finishing (inf),
        as a load generator counts them. Needs ``record_sojourns=True``; None: no requests."""
        if self._sojourns is None:
            raise ValueError("sojourn_quantile: the cluster was built without record_sojourns=True")
        j = self.midx[model]
        fail = self.per_step("fail")[:, j]
        ws, scales, shapes, failed = [], [], [], 0.0
        for k, (t, per) in enumerate(zip(self.t, self._sojourns)):
            if t0_s <= t < t1_s:
                failed += float(fail[k])
                if j in per:
                    ws.append(per[j][0])
                    scales.append(per[j][1])
                    shapes.append(per[j][2])
        w = np.concatenate(ws) if ws else np.zeros(0)
        theta = np.concatenate(scales) if scales else np.zeros(0)
        shape = np.concatenate(shapes) if shapes else np.zeros(0)
        keep = w > 0
        w, theta, shape = w[keep], theta[keep], shape[keep]
        total = float(w.sum()) + failed
        if total <= 0:
            return None
        if float(w.sum()) < q_ * total:
            return math.inf

        def share(t: float) -> float:
            return float((w * gammainc(shape, t / theta)).sum()) / total

        lo, hi = 0.0, 1.0
        while share(hi) < q_:
            hi *= 2.0
        for _ in range(60):  # bisection to ~1e-18 of the bracket
            mid = 0.5 * (lo + hi)
            lo, hi = (mid, hi) if share(mid) < q_ else (lo, mid)
        return hi

    def per_step(self, key: str) -> np.ndarray:
        """Per-step totals of a history counter as (steps, models): "arr" arrivals, "ok" within SLO,
        "done" completed, "fail" failed or dropped, "drop" dropped by a replica's queue, "lost"
        arrived while the model had no READY replica."""
        return np.diff(np.array(self._cum[key]), axis=0)
