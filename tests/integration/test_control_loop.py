"""The control loop end to end: real Prometheus, real tritonserver replicas, the real planner.

A ``LocalCluster`` (nginx, Prometheus with file SD, one emulated A100) runs
resnet on 1g slices; a ``ControlLoop`` with ``PrometheusSource`` ticks every
second on the wall clock. A load step through the front door must raise the
replica count; once the load ends the count must fall back to min_replicas,
and not before the (shortened, 20 s) scale-down stabilization window has
passed since the last recommendation that wanted more replicas -- read from
the decision log. Everything listens on 127.0.0.1 and is stopped in finally.
"""

from __future__ import annotations

import json
import subprocess
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as th
import yaml
from _support import wait_until

from autoscaler.act.local.cluster import LocalCluster
from autoscaler.act.local.replicas import ModelRuntime
from autoscaler.clock import WallClock
from autoscaler.driver import Driver
from autoscaler.loop import ControlLoop
from autoscaler.mig.layout import Placement
from autoscaler.observe.prometheus import PrometheusSource
from autoscaler.observe.queries import Queries
from autoscaler.observe.scrape import ScrapeSource
from autoscaler.policy.hpa import PolicyType, ScalingPolicy, ScalingRules, SelectPolicy
from autoscaler.policy.state import PolicyConfig
from autoscaler.policy.types import Action, ActionKind, GpuState, ModelSpec, Reason, ReplicaState

pytestmark = [pytest.mark.integration, pytest.mark.alone]

REPO = Path(__file__).resolve().parents[2] / "triton_models"
GPU = "node-a/0"
STABILIZATION_S = 20.0
# A deliberately small capacity figure (req/s per 1g replica) so that any
# real load from this 2-core machine asks for more replicas.
CAPACITY_RPS = 5.0


def _wait(pred, timeout_s: float, what: str, interval_s: float = 0.5):
    return wait_until(pred, timeout_s, what, interval_s)


class Load:
    """Closed-loop tritonclient load through the front door (bounded in time)."""

    def __init__(self, url: str, threads: int = 2, max_s: float = 180) -> None:
        self.url = url.removeprefix("http://")
        self.ok = 0
        self.failures: list[str] = []
        self._stop = threading.Event()
        self._deadline = time.monotonic() + max_s
        self._lock = threading.Lock()
        self._threads = [threading.Thread(target=self._run, daemon=True) for _ in range(threads)]

    def _run(self) -> None:
        client = th.InferenceServerClient(self.url, network_timeout=30)
        i = th.InferInput("INPUT", [1, 3, 32, 32], "FP32")
        i.set_data_from_numpy(np.random.default_rng(0).random((1, 3, 32, 32), dtype=np.float32))
        while not self._stop.is_set() and time.monotonic() < self._deadline:
            try:
                client.infer("resnet", [i])
                with self._lock:
                    self.ok += 1
            except Exception as e:  # noqa: BLE001 - recorded; the test asserts on them
                with self._lock:
                    self.failures.append(f"{type(e).__name__}: {e}")
                time.sleep(0.05)
        client.close()

    def start(self) -> Load:
        for t in self._threads:
            t.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(60)


def _live(c: LocalCluster) -> int:
    return sum(
        1
        for r in c.snapshot().replicas
        if r.model == "resnet" and r.state in (ReplicaState.STARTING, ReplicaState.READY)
    )


def _config() -> PolicyConfig:
    spec = ModelSpec("resnet", {"1g.10gb": CAPACITY_RPS}, ("1g.10gb",), min_replicas=1, max_replicas=3)
    return PolicyConfig(
        models=(spec,),
        slo_p99_ms={"resnet": 1000.0},
        tick_s=1.0,
        headroom=0.2,
        short_window_s=4.0,
        long_window_s=8.0,
        churn_budget=4,
        scale_down=ScalingRules(
            STABILIZATION_S, SelectPolicy.MAX, (ScalingPolicy(PolicyType.PERCENT, 100, 15.0),)
        ),
        metrics_stale_s=30.0,
    )


def test_load_step_scales_up_and_end_of_load_scales_down_after_stabilization(tmp_path):
    run_dir = tmp_path / "run"
    log = run_dir / "decisions.jsonl"
    c = LocalCluster(
        run_dir,
        {"resnet": ModelRuntime("resnet", REPO, "resnet")},
        [GpuState(GPU, "node-a", "A100-SXM4-80GB", layout=(Placement(6, "1g.10gb"),))],
        prometheus="auto",
    )
    stop = threading.Event()
    loop_thread: threading.Thread | None = None
    load: Load | None = None
    try:
        c.start()
        assert c.prometheus_url is not None, c.prom.banner()
        errs = c.apply_and_wait(
            [
                Action(
                    ActionKind.CREATE,
                    Reason.MIN_REPLICAS,
                    gpu=GPU,
                    model="resnet",
                    profile="1g.10gb",
                    start=6,
                ),
                Action(ActionKind.WAIT_READY, Reason.MIN_REPLICAS),
            ]
        )
        assert errs == []
        source = PrometheusSource(c.prometheus_url, window_s=6.0, metrics_stale_s=30.0, timeout_s=3.0)
        loop = ControlLoop(source, c, c, _config(), WallClock(), decision_log=log)
        driver = Driver(loop, WallClock(), tick_s=loop.config.tick_s)
        loop_thread = threading.Thread(target=driver.run, args=(stop,), daemon=True)
        loop_thread.start()
        # idle: one replica, nothing to do
        _wait(lambda: log.is_file() and len(log.read_text().splitlines()) >= 3, 60, "first decisions")
        assert _live(c) == 1

        load = Load(c.frontdoor_url).start()
        _wait(lambda: _live(c) >= 2, 120, "the load step to raise the replica count")
        # the loop saw the load through Prometheus: real rate, sample time, replica count
        seen = source.read(["resnet"], [r.id for r in c.snapshot().replicas], time.time())[0]["resnet"]
        assert seen is not None and seen.request_rate and seen.request_rate > 0
        assert seen.ready_replicas is not None and seen.ready_replicas >= 1
        assert time.time() - seen.t_s < 30
        assert seen.p99_ms is not None and not seen.latency_is_average  # summaries are on
        # the direct-scrape fallback reads the same replicas' /metrics and agrees on the basics
        scrape = ScrapeSource(
            lambda: {
                r.id: (r.model, r.process.url_metrics) for r in c.replicas() if r.state is ReplicaState.READY
            },
            window_s=10.0,
        )
        scrape.read(["resnet"], [], time.time())
        time.sleep(3.0)
        direct, reps = scrape.read(["resnet"], [], time.time())
        assert direct["resnet"] is not None and direct["resnet"].request_rate > 0
        assert direct["resnet"].p99_ms is not None and not direct["resnet"].latency_is_average
        assert direct["resnet"].avg_batch is not None and direct["resnet"].avg_batch >= 1
        assert any(s.busy_fraction for s in reps.values())
        load.stop()
        load_end = time.time()
        assert load.ok > 0

        _wait(lambda: _live(c) == 1, 180, "the end of the load to lower the replica count")
    finally:
        stop.set()
        if load is not None:
            load.stop()
        if loop_thread is not None:
            loop_thread.join(30)
        c.stop()

    lines = [json.loads(x) for x in log.read_text().splitlines() if x.strip()]
    decided = [d for d in lines if "resnet" in d["models"]]
    ups = [d for d in decided if any(a["kind"] == "create" for a in d["actions"])]
    downs = [d for d in decided if any(a["kind"] in ("drain", "delete") for a in d["actions"])]
    assert ups and downs
    assert "scale_up_demand" in ups[0]["reasons"]["resnet"]
    first_down = downs[0]["t_s"]
    assert first_down > load_end
    # HPA stabilization: a scale-down below N replicas needs every recommendation of
    # the last window to be below N. The last tick that still recommended at least
    # the count it had ...
    kept = [
        d["t_s"]
        for d in decided
        if d["t_s"] < first_down
        and any(
            s["name"] == "metrics"
            and s["value"] is not None
            and s["value"] >= d["models"]["resnet"]["current_replicas"]
            for s in d["models"]["resnet"]["stages"]
        )
    ]
    assert kept
    # ... is at least one stabilization window before the first scale-down
    assert first_down - max(kept) >= STABILIZATION_S
    held = [d for d in decided if max(kept) < d["t_s"] < first_down]
    assert any("hold_stabilization" in d["reasons"]["resnet"] for d in held)


def test_every_query_is_valid_promql(tmp_path):
    """promtool (shipped with the Debian prometheus package) parses every rendered query."""
    rules = [
        {"record": f"migscale{i}:{name}", "expr": expr}
        for i, q in enumerate((Queries(), Queries(sel='job="triton"')))
        for name, expr in q.all_rendered(30).items()
    ]
    path = tmp_path / "rules.yml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "migscale", "rules": rules}]}))
    out = subprocess.run(
        ["promtool", "check", "rules", str(path)], check=False, capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert f"{len(rules)} rules found" in out.stdout
