"""The Kubernetes controller at scale against the emulated control plane: 1,000 nodes, 8,000 GPUs, 200 models.

Prints ONE JSON object (and writes ``benchmarks/results/k8s_scale.json``):

- ``tick_s``: seconds per control tick (driver hooks + observe + decide + act +
  publish), p50/p99/max, in steady state and during a scale-up (goal: p99 < 1 s),
  the CPU seconds this process spent in each tick's 2 s period (``steady_cpu``,
  ``scale_up_cpu``: every thread, the informers' too -- the controller's own
  cost, without the waits for the emulation sharing its cores), the median of
  each part, and the three slowest steady ticks part by part (``steady_slowest``);
- ``requests_per_tick``: API requests the controller sends per tick's period, mean and
  max, in steady state and during the scale-up, split into the lease's own
  renewals (a write every ``retry_period_s``, independent of cluster size) and
  everything else (goal: a few per steady tick);
- ``baseline_list_per_tick``: what re-listing Nodes and Pods every tick costs
  (two requests and their time, on the same cluster) -- the informers' work
  side by side with the polling they replace;
- ``memory_mb``: resident size of this process before the backend is built
  and after the scale-up, and the objects its caches hold;
- ``gc_pauses``: full garbage collections in each process over each phase
  (count, total, longest), and in the slowest ticks the seconds each process
  spent stopped in one. The controller runs them between ticks
  (``runtime/gcpacing.py``, as ``migscale controller`` does; ``--gc-in-ticks``
  leaves them where the interpreter starts them). The emulation freezes what
  it has built and runs none after the cluster is up: it stands for a Go API
  server, whose collector does not stop it for a fifth of a second
  (``--no-gc-freeze`` keeps CPython's pauses).

The emulated API server and its controllers (and the load-driven Prometheus)
run in a child process so they do not share this process's interpreter lock;
on a 2-core machine each side gets a core. Delays are shortened (pods Ready in
1 s, mig-manager 5 s) and the policy's churn budget raised to 1,000 so the
warm-up of ~1,000 pods takes a few ticks instead of hundreds (the warm-up also
writes without the rollout's per-pass time budget; the measured phases keep
it); the tick is 2 s. The scale-down stabilization window is 30 s, not the
HPA's 300 s: the warm-up overshoots (its first counts are read from a fleet
still starting), and with 300 s the scale-downs that undo the overshoot came
150 ticks in -- inside the steady phase when the warm-up took longer than ~120
ticks, after it otherwise -- so the "steady" figures depended on how long the
warm-up happened to take. This benchmark measures the controller's cost at
scale, not the HPA's wait.
The controller is built as ``migscale controller`` builds it, with the pods'
direct scrape on (``build_fast_scrape``: 16 fetches side by side, rounds at most
a quarter of the time); the emulated Prometheus is also the pod network, an
HTTP proxy that answers each Ready pod's IP with that pod's own Triton page.
``fast_scrape`` reports each phase's rounds (wall time, the gap the duty bound
put after them, targets, failed fetches) and the ticks a burst woke early; the
tick parts ``fast_round`` and ``fast_signals`` are the scrape between ticks and
the signals read in the tick and the half-second wake checks. Their CPU is in
``steady_cpu`` / ``scale_up_cpu``. ``--no-fast-scrape`` builds it without
(``k8s_scale-no-fast.json``): Prometheus alone, the cost side by side.
With ``--prometheus real`` the measured phases query a real Prometheus (the
Debian binary, scraping every 2 s the emulation's per-pod Triton series at
``/metrics``) instead of the emulation's own answers; it is a third process on
the same two cores, and its JSON goes to ``k8s_scale-prometheus.json``.
The seed fixes the models and the load; the figures are timings on this
machine and vary by a few percent between runs.

Run: ``flock /tmp/migscale-heavy.lock nice -n 10 .venv/bin/python benchmarks/k8s_scale.py [--nodes 1000] [--models 200]``
"""

from __future__ import annotations

import argparse
import gc
import json
import multiprocessing as mp
import random
import resource
import shutil
import statistics
import sys
import tempfile
import threading
import time
from collections import Counter, deque
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))
EMULATION = ROOT / "tests" / "kubernetes"
NODE_COUNTS = {"1g.10gb": 30, "2g.20gb": 6, "3g.40gb": 4}  # 4 GPUs 7x1g, 2 GPUs 3x2g+1g, 2 GPUs 2x3g


def models(n: int, rng: random.Random) -> tuple[str, dict[str, dict[str, float]], dict[str, float]]:
    lines, caps, load = ["models:"], {}, {}
    for i in range(n):
        c = round(rng.uniform(40, 120))
        caps[f"m{i}"] = {"1g.10gb": c, "2g.20gb": round(1.9 * c), "3g.40gb": round(2.7 * c)}
        load[f"m{i}"] = round(rng.uniform(0.5, 4.0) * c)
        lines.append(f"  - {{name: m{i}, model_dir: /models/m{i}, slo: {{p99_ms: 200}}, "
                     f"profiles: [1g.10gb, 2g.20gb, 3g.40gb], min_replicas: 1, max_replicas: 32, "
                     f"capacity: {json.dumps(caps[f'm{i}'])}}}")
    return "\n".join(lines) + "\n", caps, load


CLUSTER = """namespace: default
gpus: [{node: node-0, product: A100-SXM4-80GB, count: 8, emulated: false}]
policy: {tick_s: 2, churn_budget: 1000, short_window_s: 4, long_window_s: 10, rightsize_window_s: 0,
         scale_down: {stabilization_window_s: 30}}
"""


class GcPauses:
    """This process's collections of the oldest generation, timed: (start, seconds) on the
    monotonic clock, which both processes share. A full collection stops every thread of
    its process; over a heap of ~10^6 objects it takes tens of milliseconds."""

    def __init__(self) -> None:
        self.log: deque[tuple[float, float]] = deque(maxlen=100_000)
        self._t: float | None = None
        gc.callbacks.append(self._seen)

    def _seen(self, phase: str, info: dict) -> None:
        if info["generation"] != 2:
            return
        if phase == "start":
            self._t = time.perf_counter()
        elif self._t is not None:
            self.log.append((self._t, time.perf_counter() - self._t))
            self._t = None


def overlap(log, t0: float, t1: float) -> float:
    """Seconds of [t0, t1) spent in a pause."""
    return sum(max(0.0, min(t + d, t1) - max(t, t0)) for t, d in log)


def pauses(log, t0: float, t1: float) -> dict[str, float]:
    """Count, total and longest of the pauses that started in [t0, t1)."""
    xs = [d for t, d in log if t0 <= t < t1]
    return {"count": len(xs), "total_s": round(sum(xs), 3), "max_s": round(max(xs, default=0.0), 3)}


def cluster_process(conn, nodes: int, caps: dict, load: dict, factor, freeze: bool) -> None:
    gcp = GcPauses()
    sys.path.insert(0, str(EMULATION))
    from emulated import EmulatedCluster
    from gpu_operator import gpu_node
    from loadprom import LoadPrometheus

    names = sorted(load)
    c = EmulatedCluster(ready_delay_s=1.0, stop_s=0.5, mig_delay_s=5.0, interval_s=0.5, bookmark_s=10.0).start(nodelay=True)
    for i in range(nodes):
        c.fake.put_object(gpu_node(f"node-{i:04d}", NODE_COUNTS, gpus=8), manager="kubelet")
    prom = LoadPrometheus(c.fake, caps, lambda t: {m: load[m] * factor[k] for k, m in enumerate(names)}, window_s=30,
                          nodelay=True)
    if freeze:
        # The emulated API server stands for a Go process, whose collector runs beside the
        # program instead of stopping it; CPython's full collections over this heap (8,000
        # GPUs' nodes, the pods, the watch histories, the request log) stop the server and
        # its controllers for up to 0.2 s, several times a tick. What is built by now lives
        # for the whole run (frozen), and no full collection runs after it: the young
        # generations are still collected, and a cycle that reaches the oldest one stays
        # until the process ends (its peak RSS is reported).
        gc.freeze()
        gc.set_threshold(*gc.get_threshold()[:2], 2**30)
    conn.send((c.url, prom.url))
    conn.recv()  # until the parent is done
    conn.send({"controller_errors": c.plane.errors[:5], "objects": len(c.fake.objects),
               # the emulation's one way to fail a pod: a device taken between placement and
               # the kubelet's admission (UnexpectedAdmissionError)
               "admission_failures": c.kubelet.admission_failures,
               "server_requests": len(c.fake.requests), "gc_pauses": list(gcp.log),
               "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)})
    prom.close()
    c.stop()


def _why_not_ready(pod: dict) -> str:
    """Phase, the PodScheduled condition's reason and whether a scheduling gate is left: why a pod waits."""
    st, spec = pod.get("status") or {}, pod.get("spec") or {}
    sched = next((c for c in st.get("conditions") or [] if c.get("type") == "PodScheduled"), {})
    gated = "gated" if spec.get("schedulingGates") else "ungated"
    return (f"{st.get('phase', '?')} {sched.get('reason', '') or sched.get('status', '')} {gated}"
            f"{' terminating' if pod['metadata'].get('deletionTimestamp') else ''}"
            f"{' on ' + 'node' if spec.get('nodeName') else ''}")


class _Switch:
    """The controller's metrics source, switched from the emulation's answers to a real
    Prometheus between the warm-up and the measured phases."""

    def __init__(self, inner) -> None:
        self.inner = inner

    def read(self, *a, **kw):
        return self.inner.read(*a, **kw)

    def prefetch(self, now_s: float) -> None:
        self.inner.prefetch(now_s)

    @property
    def last_notes(self):
        return getattr(self.inner, "last_notes", ())


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, round(q * (len(xs) - 1)))] if xs else float("nan")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--nodes", type=int, default=1000)
    ap.add_argument("--models", type=int, default=200)
    ap.add_argument("--steady-ticks", type=int, default=30, help="30 ticks of 2 s: one periodic re-plan (replan_s 60 s) falls in them")
    # The emulated Triton's p99 covers a minute, as a real one's does, and the policy learns
    # from it only once each model's capacity has been steady that long: from nothing, the
    # fleet settled at ticks 122 and 127 in two runs and was a few ticks short at 150 in a
    # third. The cap only bounds a run that never settles (a settled warm-up ends at once).
    ap.add_argument("--warmup-ticks", type=int, default=300, help="the warm-up ends here if not settled")
    ap.add_argument("--max-ticks", type=int, default=30, help="the scale-up ends here if not settled")
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--profile", type=Path, help="write cProfile stats of the steady ticks here, and of the scale-up's next to it (NAME-scale-up.SUFFIX)")
    ap.add_argument("--prometheus", choices=("emulated", "real"), default="emulated",
                    help="what the measured phases query: the emulation answering the queries itself (default), "
                         "or a real Prometheus scraping the emulation's per-pod Triton series (a third process "
                         "on the same cores; results in k8s_scale-prometheus.json)")
    ap.add_argument("--fast-scrape", action=argparse.BooleanOptionalAction, default=True,
                    help="the controller also scrapes every Ready pod's Triton directly, as `migscale controller` "
                         "does by default (16 fetches side by side, rounds at most a quarter of the time), through "
                         "the emulation's pod network; --no-fast-scrape: Prometheus alone (k8s_scale-no-fast.json)")
    ap.add_argument("--no-gc-freeze", action="store_true",
                    help="let the emulation's full garbage collections walk the whole cluster when they like "
                         "(pauses of up to 0.2 s a Go API server would not have)")
    ap.add_argument("--gc-in-ticks", action="store_true",
                    help="leave the controller's full garbage collections where the interpreter starts them, "
                         "inside ticks too, instead of between ticks (the product's setting, runtime/gcpacing.py)")
    ap.add_argument("--decision-log", type=Path,
                    help="write the controller's decision log (one JSON line a tick: actions and reasons) here")
    ap.add_argument("--dump-planner-input", type=Path,
                    help="pickle the last planner call's inputs of the steady phase here (to profile the planner alone)")
    args = ap.parse_args()
    from generalization import code_fingerprint

    code = code_fingerprint()  # of the source this process loads, read before it does
    gcp = GcPauses()
    rng = random.Random(args.seed)
    models_yaml, caps, load = models(args.models, rng)
    names = sorted(load)
    factor = mp.Array("d", [1.0] * len(names), lock=False)
    parent, child = mp.Pipe()
    proc = mp.get_context("fork").Process(target=cluster_process, args=(child, args.nodes, caps, load, factor, not args.no_gc_freeze),
                                          daemon=True)
    proc.start()
    kube, prom_url = parent.recv()
    tmp = Path(tempfile.mkdtemp(prefix="k8s-scale-"))
    (tmp / "models.yaml").write_text(models_yaml)
    (tmp / "cluster.yaml").write_text(CLUSTER)

    from autoscaler.act.kubernetes.config import LeaseTimings, build_backend
    from autoscaler.act.kubernetes.inventory import is_ready
    from autoscaler.commands.controller import build_fast_scrape
    from autoscaler.config import load_cluster, load_models, model_specs
    from autoscaler.observe.prometheus import PrometheusSource
    from autoscaler.observe.queries import Queries
    from autoscaler.policy.types import ActionKind
    from autoscaler.runtime.gcpacing import IdleCollector
    from autoscaler.runtime.kubernetes import KubernetesController

    me = psutil.Process()
    rss0 = me.memory_info().rss
    mc, cc = load_models(tmp / "models.yaml"), load_cluster(tmp / "cluster.yaml")
    t0 = time.perf_counter()
    be = build_backend(model_specs(mc, cc), cc, host=kube, identity="bench", lease_namespace="default",
                       lease=LeaseTimings(15, 10, 2), backend_options={"sync_timeout_s": 120})
    sync_s = time.perf_counter() - t0
    # The warm-up reads the emulation's own answers (it reports the offered load even for a
    # model with no pod yet, so the fleet can be built from nothing); the measured phases read
    # a real Prometheus that has scraped the emulation's per-pod Triton series all along.
    emulated_src = PrometheusSource(prom_url, Queries(replica_label="pod"), window_s=30, metrics_stale_s=60)
    prom_server = None
    if args.prometheus == "real":
        from autoscaler.act.local.prometheus import SCRAPE_INTERVAL_S, PrometheusServer, ScrapeTarget

        prom_server = PrometheusServer(tmp, "auto")
        if prom_server.binary is None:
            sys.exit("k8s_scale: no prometheus binary (apt-get install prometheus), or pass --prometheus emulated")
        prom_server.write_targets([ScrapeTarget(prom_url.split("//", 1)[1], "emulation", "emulation", "-", "-", 0)])
        prom_server.start()
        scrape_s = SCRAPE_INTERVAL_S
    else:
        scrape_s = None
    src = _Switch(emulated_src)
    collector = None if args.gc_in_ticks else IdleCollector()
    # built as `migscale controller` builds it; the emulated Prometheus is also the pod network's proxy
    fast = build_fast_scrape(be, prom_url) if args.fast_scrape else None
    ctl = KubernetesController(be, src, mc, cc, identity="bench", decision_log=args.decision_log,
                               collector=collector, fast=fast)
    assert be.elector is not None
    be.elector.start()
    while not be.elector.holds():
        time.sleep(0.1)
    if collector is not None:
        collector.install()  # as ``run`` does, once the caches have synced

    def lease() -> int:
        return sum(n for (_v, r), n in be.rest.by_resource.items() if r == "leases")

    spent: dict[str, float] = {}

    def timed(obj, name: str, label: str) -> None:
        fn = getattr(obj, name)

        def wrapper(*a, **kw):
            t = time.perf_counter()
            try:
                return fn(*a, **kw)
            finally:
                spent[label] = spent.get(label, 0.0) + time.perf_counter() - t

        setattr(obj, name, wrapper)

    timed(src, "read", "metrics")  # Prometheus queries (a real Prometheus in the measured phases, by default)
    timed(be, "snapshot", "snapshot")  # informer caches -> ClusterState
    timed(be, "apply", "apply")  # this tick's actions: API writes
    timed(be, "advance", "advance")  # rollouts and repartitions under way: API writes
    timed(ctl, "publish", "publish")  # the metrics API's snapshot
    # what ``advance`` spends, by writer (each nested in advance_s)
    timed(be.repartitioner, "advance", "advance_repartition")
    timed(be.rollout, "advance", "rollout_pass")  # in advance and in apply (submit's pass)
    timed(be.placer, "unpin", "advance_unpin")
    timed(be.workloads, "sweep", "advance_sweep")
    timed(be.placer, "ungate", "ungate")  # in advance, and per new pod in the Pod informer's thread
    phase = ["warm_up"]
    fast_rounds: list[dict] = []  # each round of the pods' direct scrape: its phase and ``FastScrape.last``
    if fast is not None:
        timed(fast, "signals", "fast_signals")  # in the tick's read and in each half-second wake check
        timed(fast, "sample", "fast_round")  # in the idle hook, between ticks
        counted = fast.sample

        def sample(now_s: float) -> None:
            counted(now_s)
            fast_rounds.append({"phase": phase[0], **fast.last})

        fast.sample = sample

    def thread_cpu() -> dict[str, float]:
        """CPU seconds so far by thread kind (the informers' threads, the lease's, the main loop...)."""
        names = {t.native_id: t.name.split(":")[0] for t in threading.enumerate()}
        out: dict[str, float] = {}
        for t in me.threads():
            k = names.get(t.id, "other")
            out[k] = out.get(k, 0.0) + t.user_time + t.system_time
        return out

    def cpu_since(before: dict[str, float]) -> dict[str, float]:
        now = thread_cpu()
        return {k: round(v - before.get(k, 0.0), 2) for k, v in sorted(now.items()) if v - before.get(k, 0.0) >= 0.01}

    def pending_down() -> int:
        """Models whose HPA proposal (before the scale-down window) is below their count:
        scale-downs the window still holds back, due within its 30 s."""
        n = 0
        for dg in ctl.loop.state.diagnostics.values():
            i = next((k for k, st in enumerate(dg.stages) if st.name == "stabilize"), 0)
            if i > 0 and dg.stages[i - 1].value is not None and dg.stages[i - 1].value < dg.current_replicas:
                n += 1
        return n

    error_samples: list[str] = []  # the first few failed actions' messages, whatever the phase

    def run(ticks: int, until=None) -> list[dict]:
        out = []
        for _ in range(ticks):
            total0, lease0 = be.rest.total_requests(), lease()
            by0 = Counter(be.rest.by_resource)
            spent.clear()
            start, cpu0 = time.perf_counter(), time.process_time()
            r = ctl.tick()
            end = time.perf_counter()
            for e in (*r.errors, *(f"late: {x}" for x in r.late_errors)):
                if len(error_samples) < 10:
                    error_samples.append(f"tick {len(out) + 1}: {e[:400]}")
            dt = end - start
            # the rest of the period as ``Driver.run`` spends it (its idle hook: a due full
            # garbage collection runs there)
            ctl.driver.wait(max(0.0, cc.policy.tick_s - dt), lambda: False)
            # how far past its cadence the next tick starts: a round in the idle hook that
            # overran the wait (a wake makes the period shorter, not late)
            late = max(0.0, time.perf_counter() - start - cc.policy.tick_s)
            # the period is over: its CPU and requests include the informers' work between ticks
            # (new pods ungated on the Pod watch's thread)
            cpu = time.process_time() - cpu0
            total, leased = be.rest.total_requests() - total0, lease() - lease0
            by = {f"{v} {res}": n for (v, res), n in (Counter(be.rest.by_resource) - by0).items() if res != "leases"}
            creates = sum(1 for a in r.actions if a.kind is ActionKind.CREATE)
            out.append({"tick_s": dt, "late_s": late, "cpu_s": cpu, "requests": total - leased, "lease": leased, "actions": len(r.actions),
                        "creates": creates, "by": by,
                        "errors": len(r.errors), "chains": len(be.rollout.chains), "held": len(r.held),
                        "pending_down": pending_down(),
                        "decide_s": ctl.loop.last_decide_s or 0.0, "t0": start, "t1": end,
                        "replan": getattr(ctl.loop.state.replan, "value", None), **{f"{k}_s": v for k, v in spent.items()}})
            print(f"tick {len(out)}: {out[-1]}", file=sys.stderr, flush=True)
            if until is not None and until(out):
                break
        return out

    def settled(out: list[dict]) -> bool:
        # Held models count: while chains wait, the gate holds every model with work queued, and
        # their decisions (the warm-up's scale-downs) go out only once the chains are done -- a
        # tick with no actions and no chains is not yet a steady fleet if models are held.
        # Pending scale-downs count too: two quiet ticks can fall in the middle of the descent
        # from the warm-up's overshoot, while the scale-down window holds back most models'
        # smaller counts (94 of 200 in one run); a steady fleet has a few (noise), not half.
        return len(out) >= 2 and all(o["actions"] == 0 and o["chains"] == 0 and o["held"] == 0
                                     and o["pending_down"] <= 0.05 * args.models for o in out[-2:])

    # The warm-up (~1,000 pods from nothing) is not measured: it writes without the
    # rollout's per-pass time budget so it takes a few ticks; the measured phases run
    # with the backend's default budget.
    budget = be.rollout.pass_budget_s
    be.rollout.pass_budget_s = be.repartitioner.pass_budget_s = None
    warm = run(args.warmup_ticks, settled)
    be.rollout.pass_budget_s = be.repartitioner.pass_budget_s = budget
    seen = None
    if prom_server is not None:
        src.inner = PrometheusSource(prom_server.url, Queries(replica_label="pod"), window_s=30, metrics_stale_s=60)
        got, _ = src.inner.read(names, [], time.time())
        seen = sum(1 for v in got.values() if v is not None and v.request_rate is not None)
    deferred0 = be.rollout.deferred + be.repartitioner.deferred
    if args.profile:
        import cProfile

        prof = cProfile.Profile()
        prof.enable()
    cpu0 = thread_cpu()
    falls = [be.placer.placement_fallbacks]
    phases = {"steady": [time.perf_counter()]}
    phase[0], early = "steady", {"warm_up": ctl.driver.early_ticks}
    steady = run(args.steady_ticks)
    early["steady"] = ctl.driver.early_ticks - early["warm_up"]
    phases["steady"].append(time.perf_counter())
    falls.append(be.placer.placement_fallbacks)
    steady_threads = cpu_since(cpu0)
    if args.profile:
        prof.disable()
        prof.dump_stats(str(args.profile))
    if args.dump_planner_input and ctl.loop.state.planner_memo is not None:
        import pickle

        targets, cluster, churn, fast, spares = ctl.loop.state.planner_memo.key
        with args.dump_planner_input.open("wb") as f:
            pickle.dump({"models": ctl.loop.config.models, "targets": dict(targets), "cluster": cluster,
                         "churn_budget": churn, "fast_path": fast, "spares": dict(spares)}, f)
    for k in range(0, len(names), 2):  # half the models: 2.5x their load
        factor[k] = 2.5
    if args.profile:
        prof = cProfile.Profile()
        prof.enable()
    cpu0 = thread_cpu()
    phases["scale_up"] = [time.perf_counter()]
    phase[0] = "scale_up"
    # Settled only once it has added replicas: with the pods' direct scrape the policy reads
    # arrivals from the last rounds, which show the step in full only a round or two later
    # (rounds are seconds apart at this size), while the emulated Prometheus answers the new
    # load at once; two quiet ticks, or a few unrelated actions, come before that.
    up = run(args.max_ticks, lambda out: any(o["creates"] for o in out) and settled(out))
    early["scale_up"] = ctl.driver.early_ticks - early["warm_up"] - early["steady"]
    phases["scale_up"].append(time.perf_counter())
    up_threads = cpu_since(cpu0)
    if args.profile:
        prof.disable()
        prof.dump_stats(str(args.profile.with_name(f"{args.profile.stem}-scale-up{args.profile.suffix}")))
    rss1 = me.memory_info().rss
    left = {"chains_waiting": dict(Counter(c.why[:100] for c in be.rollout.chains)),
            "repartitions": dict(Counter(st["phase"] for st in be.repartitioner.in_progress().values())),
            "repartition_log_tail": list(be.repartitioner.log)[-15:],
            "pods_not_ready": dict(Counter(_why_not_ready(p) for p in be.caches.pods.items() if not is_ready(p)))}
    pods = be.snapshot().replicas
    base = []
    for _ in range(5):  # the polling the informers replace: every Node and Pod, each tick
        t = time.perf_counter()
        be.rest.list("v1", "Node", None)
        be.rest.list("v1", "Pod", cc.namespace, label_selector="app.kubernetes.io/managed-by=migscale")
        base.append(time.perf_counter() - t)
    active = [o for o in up if o["actions"] or o["chains"]]

    def parts(ticks: list[dict]) -> dict[str, float]:
        keys = ("metrics_s", "snapshot_s", "decide_s", "apply_s", "advance_s", "publish_s", "advance_repartition_s",
                "rollout_pass_s", "advance_unpin_s", "advance_sweep_s", "ungate_s", "fast_round_s", "fast_signals_s")
        return {k[:-2]: round(statistics.median(o.get(k, 0.0) for o in ticks), 3) for k in keys}

    steady_req = [o["requests"] for o in steady]
    slowest = sorted(steady, key=lambda o: -o["tick_s"])[:3]
    result = {
        "code": code,  # the source hash the figures belong to
        "cluster": {"nodes": args.nodes, "gpus": args.nodes * 8, "models": args.models, "pods": len(pods),
                    "seed": args.seed},
        "metrics_source": {"measured_phases": args.prometheus, "models_with_a_request_rate": seen,
                           "scrape_interval_s": scrape_s},
        "cache_sync_s": round(sync_s, 2),
        "warmup_ticks": len(warm),
        "tick_s": {
            "steady": {"p50": round(pct([o["tick_s"] for o in steady], 0.5), 3),
                       "p99": round(pct([o["tick_s"] for o in steady], 0.99), 3),
                       "max": round(max(o["tick_s"] for o in steady), 3)},
            "scale_up": {"p50": round(pct([o["tick_s"] for o in up], 0.5), 3),
                         "p99": round(pct([o["tick_s"] for o in up], 0.99), 3),
                         "max": round(max(o["tick_s"] for o in up), 3), "ticks": len(up)},
            # CPU seconds this process spent in each tick's period (tick_s of wall time: the
            # tick, the informers' watch decoding and ungating between ticks, every thread).
            # On 2 cores shared with the emulated control plane (and Prometheus), wall time
            # also waits for them; this is the controller's own cost.
            # the next tick's start past its cadence (the idle hook's work overrunning the wait)
            "late_start": {ph: {"p50": round(pct([o["late_s"] for o in ts], 0.5), 3),
                                "p99": round(pct([o["late_s"] for o in ts], 0.99), 3)}
                           for ph, ts in (("steady", steady), ("scale_up", up))},
            "steady_cpu": {"p50": round(pct([o["cpu_s"] for o in steady], 0.5), 3),
                           "p99": round(pct([o["cpu_s"] for o in steady], 0.99), 3)},
            "scale_up_cpu": {"p50": round(pct([o["cpu_s"] for o in up], 0.5), 3),
                             "p99": round(pct([o["cpu_s"] for o in up], 0.99), 3)},
            "steady_median_parts": parts(steady),
            "scale_up_median_parts": parts(up),
            # the process's CPU seconds over each phase by thread (main: the loop; informer-*: watch
            # events; migscale-events: the Event writer; lease-elector; migscale-api: the metrics API)
            "cpu_by_thread": {"steady": steady_threads, "scale_up": up_threads},
        },
        # the pods' direct scrape (the burst layer's 1 s signals), each phase's rounds: their
        # wall time, the gap the duty bound put after them, targets and failed fetches; and
        # the ticks a burst woke early (``WakeOnBurst``)
        "fast_scrape": None if fast is None else {
            "workers": 16, "max_duty": fast.max_duty, "early_ticks": early, **{
                ph: {"rounds": len(rs), "round_s_p50": round(pct([r["round_s"] for r in rs], 0.5), 3),
                     "round_s_max": round(max(r["round_s"] for r in rs), 3),
                     "gap_s_p50": round(pct([r["next_in_s"] for r in rs], 0.5), 2),
                     "targets_max": max(r["targets"] for r in rs), "failures": sum(r["failures"] for r in rs),
                     "first_error": next((r["error"] for r in rs if r["error"]), None)}
                for ph in ("warm_up", "steady", "scale_up") if (rs := [r for r in fast_rounds if r["phase"] == ph])}},
        # seconds from the load step to the end of the first tick that added replicas (the
        # emulated Prometheus answers the new load at once; a real one's rate lags it by its
        # scrape interval and window, which the direct scrape's rounds do not)
        "scale_up_reaction_s": next((round(o["t1"] - phases["scale_up"][0], 2) for o in up if o["creates"]), None),
        "steady_actions": sum(o["actions"] for o in steady),
        # whether each tick called the planner, and why (same/hold: it did not)
        "replan": {"steady": dict(Counter(o["replan"] for o in steady)), "scale_up": dict(Counter(o["replan"] for o in up))},
        "requests_per_tick": {
            "steady": {"mean": round(statistics.mean(steady_req), 2), "max": max(steady_req),
                       "lease_mean": round(statistics.mean(o["lease"] for o in steady), 2),
                       "by_resource": dict(sum((Counter(o["by"]) for o in steady), Counter()))},
            "scale_up": {"mean": round(statistics.mean(o["requests"] for o in active), 1) if active else 0,
                         "max": max((o["requests"] for o in active), default=0), "ticks_acting": len(active),
                         "actions": sum(o["actions"] for o in up)},
        },
        "baseline_list_per_tick": {"requests": 2, "seconds_p50": round(statistics.median(base), 3),
                                   "vs_steady_tick_p50": round(statistics.median(base) /
                                                               max(1e-9, pct([o["tick_s"] for o in steady], 0.5)), 2)},
        "informers": {i.kind: {"objects": len(i), "lists": i.lists, "watches": i.watches, "expired": i.expired}
                      for i in be.caches.all()},
        "memory_mb": {"rss_before": round(rss0 / 2**20, 1), "rss_after": round(rss1 / 2**20, 1),
                      "delta": round((rss1 - rss0) / 2**20, 1)},
        "tick_errors": sum(o["errors"] for o in warm + steady + up),
        "tick_error_samples": error_samples,
        "warmup_settled": settled(warm),
        "scale_up_settled": settled(up),
        "in_flight_at_end": left,
        "rollout": {"pass_budget_s": budget, "passes_stopped_at_budget": be.rollout.deferred + be.repartitioner.deferred - deferred0,
                    # the whole run: new pods kept gated for their planned node (its instance held by a pod
                    # on its way out), and pods let go to the scheduler because their planned node was full
                    "placement_waits": be.placer.placement_waits,
                    "placement_fallbacks": {"warm_up": falls[0], "steady": falls[1] - falls[0],
                                            "scale_up": be.placer.placement_fallbacks - falls[1]},
                    "last_fallbacks": [list(f) for f in list(be.placer.fallback_log)[-10:]]},
    }
    ctl.close()
    if prom_server is not None:
        prom_server.stop()
    parent.send("done")
    result["emulation"] = parent.recv()
    emu_gc = result["emulation"].pop("gc_pauses")
    # full collections in each process over each phase, and (in the slowest ticks) the
    # seconds of each tick that one of the two processes spent stopped in one
    result["gc_pauses"] = {"emulation_frozen": not args.no_gc_freeze, "controller_between_ticks": collector is not None,
                           "collector": collector.to_json() if collector is not None else None, **{
        k: {"controller": pauses(gcp.log, *span), "emulation": pauses(emu_gc, *span)} for k, span in phases.items()}}

    def brief(o: dict) -> dict:
        out = {k: round(v, 3) if isinstance(v, float) else v for k, v in o.items() if k not in ("by", "t0", "t1")}
        out["gc_controller_s"] = round(overlap(gcp.log, o["t0"], o["t1"]), 3)
        out["gc_emulation_s"] = round(overlap(emu_gc, o["t0"], o["t1"]), 3)
        return out

    # the three slowest ticks of each phase, each split into its parts: what p99 is made of
    result["steady_slowest"] = [brief(o) for o in slowest]
    result["tick_s"]["scale_up_slowest"] = [brief(o) for o in sorted(up, key=lambda o: -o["tick_s"])[:3]]
    proc.join(timeout=30)
    text = json.dumps(result, indent=2)
    print(text)
    name = "k8s_scale-prometheus" if prom_server is not None else "k8s_scale" if fast is not None else "k8s_scale-no-fast"
    out = ROOT / "benchmarks" / "results" / f"{name}.json"
    if args.nodes == 1000 and args.models == 200:
        out.write_text(text + "\n")
    shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
