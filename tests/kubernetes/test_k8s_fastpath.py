"""The burst layer's 1 s scrape on Kubernetes: each Ready Triton pod read at its IP, beside Prometheus.

Unit: which pods are targets and at what URL. End to end, in process: the
controller on the emulated cluster (``emulated.py``) with the emulated
Prometheus, whose pod network (``loadprom.py``, an HTTP proxy) answers each pod
IP with that pod's own Triton exposition; a step in load wakes a tick between
two ticks of the cadence, and that tick scales the model up.
"""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
from emulated import EmulatedCluster
from gpu_operator import gpu_node
from loadprom import LoadPrometheus

from autoscaler.act.kubernetes.config import build_backend
from autoscaler.act.kubernetes.inventory import KubeInventory, metrics_url
from autoscaler.act.kubernetes.render import RenderConfig
from autoscaler.clock import WallClock
from autoscaler.config import load_cluster, load_models, model_specs
from autoscaler.observe.fast import FastScrape
from autoscaler.observe.prometheus import PrometheusSource
from autoscaler.observe.queries import Queries
from autoscaler.policy.types import ActionKind
from autoscaler.runtime.kubernetes import KubernetesController


def pod(name: str, *, ip: str | None = "10.244.0.5", ready: bool = True, model: str | None = "resnet",
        ports: tuple[tuple[str, int], ...] = (("http", 8000), ("metrics", 8002)), worker: str | None = None,
        deleting: bool = False) -> dict:
    labels = {"app.kubernetes.io/managed-by": "migscale"}
    if model:
        labels["migscale.io/model"] = model
    if worker is not None:
        labels["leaderworkerset.sigs.k8s.io/worker-index"] = worker
    meta: dict = {"name": name, "namespace": "default", "labels": labels}
    if deleting:
        meta["deletionTimestamp"] = "2026-12-06T00:00:00Z"
    status: dict = {"phase": "Running", "conditions": [{"type": "Ready", "status": "True" if ready else "False"}]}
    if ip:
        status["podIP"] = ip
    return {"metadata": meta, "spec": {"containers": [{"name": "triton", "ports": [
        {"name": n, "containerPort": p} for n, p in ports]}]}, "status": status}


class Items:
    def __init__(self, objs: list[dict]) -> None:
        self.objs = objs

    def items(self) -> list[dict]:
        return list(self.objs)


def test_the_url_is_the_pods_ip_and_its_port_named_metrics():
    assert metrics_url(pod("a")) == "http://10.244.0.5:8002/metrics"
    assert metrics_url(pod("a", ports=(("metrics", 9102),))) == "http://10.244.0.5:9102/metrics"
    assert metrics_url(pod("a", ip="fd00:10:244::5")) == "http://[fd00:10:244::5]:8002/metrics"
    assert metrics_url(pod("a", ip=None)) is None  # no sandbox yet: nothing to reach
    assert metrics_url(pod("a", ports=(("http", 8000),))) is None  # no port named metrics


def test_targets_are_the_ready_live_pods_and_a_groups_leader_only():
    from autoscaler.act.kubernetes.render import LWS_WORKER_INDEX

    assert LWS_WORKER_INDEX == "leaderworkerset.sigs.k8s.io/worker-index"
    pods = [pod("r-1", ip="10.244.0.5"), pod("r-2", ip="10.244.0.6", ready=False),
            pod("r-3", ip="10.244.0.7", deleting=True), pod("r-4", ip=None),
            pod("llm-0", ip="10.244.1.2", model="llm", worker="0"),
            pod("llm-0-1", ip="10.244.1.3", model="llm", worker="1"),
            pod("other", ip="10.244.2.2", model=None)]
    inv = KubeInventory(RenderConfig(), Items([]), Items(pods))
    assert inv.metrics_targets() == {"r-1": ("resnet", "http://10.244.0.5:8002/metrics"),
                                     "llm-0": ("llm", "http://10.244.1.2:8002/metrics")}


MODELS = """
models:
  - {name: resnet, model_dir: /models/resnet, slo: {p99_ms: 150}, profiles: [1g.10gb], min_replicas: 1,
     max_replicas: 7, capacity: {1g.10gb: 58}}
"""
TICK_S = 6.0
CLUSTER = f"""
namespace: default
gpus:
  - {{node: node-0, product: A100-SXM4-80GB, count: 1, emulated: false}}
policy:
  tick_s: {TICK_S:g}
  short_window_s: 2
  long_window_s: 4
  metrics_stale_s: 10
"""


@pytest.mark.integration
@pytest.mark.alone  # its verdict is an interval on the wall clock: the wake came before the cadence's tick
def test_a_step_in_load_wakes_a_tick_before_the_cadence_and_it_scales_up(tmp_path: Path):
    (tmp_path / "models.yaml").write_text(MODELS)
    (tmp_path / "cluster.yaml").write_text(CLUSTER)
    models_cfg, cluster_cfg = load_models(tmp_path / "models.yaml"), load_cluster(tmp_path / "cluster.yaml")
    level = {"rps": 20.0}
    cluster = EmulatedCluster(ready_delay_s=0.2, stop_s=0.1, mig_delay_s=0.5).start()
    cluster.fake.put_object(gpu_node("node-0", {"1g.10gb": 7}, config="all-1g.10gb"), manager="kubelet")
    prom = LoadPrometheus(cluster.fake, {"resnet": {"1g.10gb": 58.0}}, lambda t: {"resnet": level["rps"]})

    clock = WallClock()
    be = build_backend(model_specs(models_cfg, cluster_cfg), cluster_cfg, host=cluster.url, identity="ctl",
                       lease_namespace="default", clock=clock)
    # the controller's own client, reaching each pod's IP through the emulated pod network (the proxy)
    fast = FastScrape(be.inventory.metrics_targets, workers=4, max_duty=0.25, proxy=prom.url)
    ticks: list[tuple[float, bool, int]] = []  # (began, woken early, resnet creates)
    early_before = [0]

    def on_result(result) -> None:
        woke = ctl.driver.early_ticks > early_before[0]
        early_before[0] = ctl.driver.early_ticks
        made = sum(1 for a in result.actions if a.kind is ActionKind.CREATE and a.model == "resnet")
        ticks.append((result.t_s, woke, made))

    source = PrometheusSource(prom.url, Queries(replica_label="pod"), window_s=1.0, metrics_stale_s=10.0)
    ctl = KubernetesController(be, source, models_cfg, cluster_cfg, clock=clock, on_result=on_result, fast=fast)
    stop = threading.Event()
    runner = threading.Thread(target=ctl.run, args=(stop,), daemon=True)
    try:
        runner.start()
        # calm: one Ready pod, scraped straight from its IP
        cluster.wait(lambda: fast.last["targets"] == 1 and fast.last["failures"] == 0 and len(ticks) >= 2,
                     30, "a Ready resnet pod in the fast scrape")
        n = len(ticks)
        cluster.wait(lambda: len(ticks) > n, 2 * TICK_S, "a tick of the cadence")
        stepped_at = clock.now()
        level["rps"] = 250.0  # four 1g pods' worth: the one Ready pod is outrun at once
        cluster.wait(lambda: any(made for _t, _w, made in ticks[n + 1:]), 3 * TICK_S, "a scale-up")
        first = next(t for t in ticks[n + 1:] if t[2])
        shown = f"step at {stepped_at:.1f}; ticks (began, woken, creates): {ticks}"
        # it came from the wake, between two ticks of the cadence, and scaled up there
        assert first[1] and first[0] - stepped_at < TICK_S, shown
        obs = ctl.loop.last_observation
        assert obs is not None and obs.models["resnet"] is not None and obs.models["resnet"].fast is not None
        assert ctl.status(None)["fast_scrape"]["targets"] >= 1
    finally:
        stop.set()
        runner.join(timeout=30)
        ctl.close()
        prom.close()
        cluster.stop()
    assert not runner.is_alive()
    # nothing left running: the pool was shut down with the controller
    assert fast._pool is not None and fast._pool._shutdown
