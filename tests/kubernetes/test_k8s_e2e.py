"""The real ``migscale controller`` process against the emulated cluster, under a load trace.

Everything in the cluster is emulated (``emulated.py``: API server, Deployment/
ReplicaSet/disruption controllers, scheduler, kubelet, device plugin,
mig-manager, an HPA controller reading migscale's metrics API over HTTP, and a
Prometheus whose Triton series follow the load); the controllers are the
shipped command, started as processes. Delays are scaled down (pods Ready in
0.5 s, mig-manager 3 s, HPA sync 1 s, tick 1 s, lease 3 s) so the two runs take
well under a minute together.

Each controller also scrapes every Ready pod at its IP each second (the burst
layer's path), through the emulated pod network (``loadprom.py``).

1. Replicas follow the load, a profile swap is make-before-break (the model
   never has fewer Ready pods than before the swap), an HPA on a workload the
   team owns follows migscale's external metric, and every field has one
   writer (the API server's field audit).
2. Two controllers; the leader is killed (SIGKILL: no lease release) in the
   middle of a repartition. The follower takes over, finishes it from the
   Node's annotation, and the cluster ends with one consistent layout: the
   node's config label, mig-manager's state, the device plugin's allocatable
   and the mig-parted entry agree; no pod was evicted twice; no node is left
   cordoned.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import httpx
import pytest
import yaml
from emulated import EmulatedCluster
from gpu_operator import entry_counts, gpu_node
from loadprom import LoadPrometheus

ROOT = Path(__file__).resolve().parents[2]
POLICY = """
policy:
  tick_s: 1
  replan_s: 5
  short_window_s: 2
  long_window_s: 4
  metrics_stale_s: 10
  rightsize_window_s: 4
  churn_budget: 6
  scale_up: {stabilization_window_s: 0, policies: [{type: Percent, value: 100, period_s: 1}, {type: Pods, value: 4, period_s: 1}]}
  scale_down: {stabilization_window_s: 3, policies: [{type: Percent, value: 100, period_s: 1}]}
"""


class Controller:
    """One ``migscale controller`` process; stderr is drained on a thread (never blocks the process)."""

    def __init__(self, cfg: tuple[Path, Path], kube: str, prom: str, identity: str) -> None:
        self.decisions = cfg[0].parent / f"{identity}.jsonl"
        cmd = [sys.executable, "-m", "autoscaler", "controller", str(cfg[0]), str(cfg[1]), "--kube-host", kube,
               "--decision-log", str(self.decisions),
               "--prometheus", prom, "--rate-window", "1", "--identity", identity, "--lease-namespace", "default",
               "--insecure-http", "--port", "0", "--lease-duration", "3", "--renew-deadline", "2",
               "--retry-period", "0.5"]
        # the pods' IPs (the burst layer's 1 s scrape) are reached through the emulated pod
        # network, an HTTP proxy
        cmd += ["--fast-scrape-proxy", prom]
        env = {**os.environ, "PYTHONUNBUFFERED": "1", "PYTHONPATH": str(ROOT)}
        self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env)
        self.lines: list[str] = []
        self.url: str | None = None
        threading.Thread(target=self._drain, daemon=True).start()

    def _drain(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.lines.append(line.rstrip())
            # "migscale controller <identity>: serving <url> (...)"; the log's own lines are timestamped
            if self.url is None and line.startswith("migscale controller ") and " serving " in line:
                self.url = line.split(" serving ", 1)[1].split(" ", 1)[0]

    def wait_url(self, timeout_s: float = 30) -> str:
        deadline = time.monotonic() + timeout_s
        while self.url is None and time.monotonic() < deadline and self.proc.poll() is None:
            time.sleep(0.05)
        assert self.url, "\n".join(self.lines[-20:])
        return self.url

    def decided(self) -> str:
        """The actions of every tick that acted, one line each: what a failing assertion shows."""
        out = []
        for line in self.decisions.read_text().splitlines() if self.decisions.exists() else []:
            d = json.loads(line)
            acts = [f"{a['kind']} {a.get('model', '')} {a.get('profile', '')} {a.get('gpu', '')}" for a in d["actions"]]
            if acts or d["errors"]:
                out.append(f"{d['t_s'] % 1000:7.1f} held={d['held']} {acts} {d['errors'][:2]}")
        return "\n".join(out)

    def stop(self, sig: int = signal.SIGTERM) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def write_configs(tmp: Path, models: str, nodes: list[str]) -> tuple[Path, Path]:
    (tmp / "models.yaml").write_text(models)
    gpus = "".join(f"  - {{node: {n}, product: A100-SXM4-80GB, count: 1, emulated: false}}\n" for n in nodes)
    (tmp / "cluster.yaml").write_text(f"namespace: default\ngpus:\n{gpus}{POLICY}")
    return tmp / "models.yaml", tmp / "cluster.yaml"


def capacities(models_yaml: str) -> dict[str, dict[str, float]]:
    return {m["name"]: m["capacity"] for m in yaml.safe_load(models_yaml)["models"]}


@pytest.fixture
def world():
    made: dict = {"controllers": []}
    cluster = EmulatedCluster(ready_delay_s=0.5, stop_s=0.3, mig_delay_s=3.0).start()
    made["cluster"] = cluster
    try:
        yield made
    finally:
        for c in made["controllers"]:
            c.stop(signal.SIGKILL)
        if "prom" in made:
            made["prom"].close()
        cluster.stop()


def timeline(samples: list[tuple]) -> str:
    """The samples where something changed, one per line: what a failing assertion shows."""
    out, prev = [], None
    for s in samples:
        if s[1:] != prev:
            out.append(f"{s[0]:5.1f}s {s[1:]}")
            prev = s[1:]
    return "\n".join(out)


def ready_pods(fake, model: str) -> list[dict]:
    return [p for p in fake.view("Pod") if (p["metadata"].get("labels") or {}).get("migscale.io/model") == model
            and not p["metadata"].get("deletionTimestamp")
            and any(c.get("type") == "Ready" and c.get("status") == "True" for c in (p.get("status") or {}).get("conditions") or [])]


MODELS_1 = """
models:
  - {name: resnet, model_dir: /models/resnet, slo: {p99_ms: 150}, profiles: [1g.10gb, 3g.40gb], min_replicas: 1,
     max_replicas: 8, capacity: {1g.10gb: 58, 3g.40gb: 160}}
  - {name: rnn, model_dir: /models/rnn, slo: {p99_ms: 150}, profiles: [1g.10gb, 7g.80gb], min_replicas: 1,
     max_replicas: 4, capacity: {1g.10gb: 122, 7g.80gb: 188}}
"""


def test_replicas_follow_load_swap_is_make_before_break_and_each_field_has_one_writer(world, tmp_path):
    cluster = world["cluster"]
    fake = cluster.fake
    fake.put_object(gpu_node("node-0", {"1g.10gb": 7}), manager="kubelet")
    fake.put_object(gpu_node("node-1", {"7g.80gb": 1}), manager="kubelet")
    cfg = write_configs(tmp_path, MODELS_1, ["node-0", "node-1"])
    # rnn runs on a whole 7g slice from an earlier life; its load fits a 1g: the controller right-sizes it
    from autoscaler.act.kubernetes.config import render_config
    from autoscaler.act.kubernetes.render import deployment, pod_disruption_budget
    from autoscaler.config import load_cluster, load_models, model_specs

    specs = {s.name: s for s in model_specs(load_models(cfg[0]), load_cluster(cfg[1]))}
    rcfg = render_config(load_cluster(cfg[1]))
    fake.create_obj(deployment(specs["rnn"], "7g.80gb", 1, rcfg), manager="migscale")
    fake.create_obj(pod_disruption_budget(specs["rnn"], "7g.80gb", rcfg), manager="migscale")
    gated = cluster.wait(lambda: fake.list("Pod"), 10, "the old rnn pod")[0]
    fake.update_obj({**gated, "spec": {**gated["spec"], "schedulingGates": []}}, manager="migscale")  # an earlier leader's
    cluster.wait(lambda: ready_pods(fake, "rnn"), 10, "the old rnn pod Ready")

    # a team's own front end (not migscale's), scaled by an HPA on migscale's external metric
    fake.create_obj({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "frontend", "namespace": "default"},
                     "spec": {"replicas": 1, "selector": {"matchLabels": {"app": "frontend"}},
                              "template": {"metadata": {"labels": {"app": "frontend"}},
                                           "spec": {"containers": [{"name": "web", "image": "nginx:1.27"}]}}}})
    fake.create_obj({"apiVersion": "autoscaling/v2", "kind": "HorizontalPodAutoscaler",
                     "metadata": {"name": "frontend", "namespace": "default"},
                     "spec": {"scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": "frontend"},
                              "minReplicas": 1, "maxReplicas": 6,
                              "metrics": [{"type": "External", "external": {
                                  "metric": {"name": "migscale_model_requests_per_second",
                                             "selector": {"matchLabels": {"model": "resnet"}}},
                                  "target": {"type": "AverageValue", "averageValue": "100"}}}],
                              "behavior": {"scaleDown": {"stabilizationWindowSeconds": 2,
                                                         "policies": [{"type": "Percent", "value": 100, "periodSeconds": 1}]}}}})

    def load(t: float) -> dict[str, float]:
        return {"resnet": 300.0 if 8 <= t < 20 else 30.0, "rnn": 40.0}

    prom = world["prom"] = LoadPrometheus(fake, capacities(MODELS_1), load)
    ctl = Controller(cfg, cluster.url, prom.url, "ctl-a")
    world["controllers"].append(ctl)
    cluster.add_hpa_controller(ctl.wait_url(), sync_s=1.0)

    samples: list[tuple[float, int, int, int, int]] = []  # t, resnet ready, rnn ready, rnn 7g ready, frontend
    deadline = time.monotonic() + 34
    while time.monotonic() < deadline:
        t = time.time() - prom.start
        rnn = ready_pods(fake, "rnn")
        front = fake.get("Deployment", "frontend")
        samples.append((t, len(ready_pods(fake, "resnet")), len(rnn),
                        sum(1 for p in rnn if p["metadata"]["labels"]["migscale.io/profile"] == "7g.80gb"),
                        int(front["spec"]["replicas"])))
        if t > 30 and samples[-1][1] <= 2 and samples[-1][3] == 0 and samples[-1][4] <= 2:
            break
        time.sleep(0.1)
    assert ctl.proc.poll() is None, "\n".join(ctl.lines[-30:])
    tl = "t, (resnet ready, rnn ready, rnn 7g ready, frontend replicas)\n" + timeline(samples) + "\n" + ctl.decided()
    base = [s for s in samples if s[0] < 8] or samples[:1]  # before the burst (a slow start may leave none)
    burst = [s for s in samples if 10 <= s[0] < 20]
    after = samples[-1]
    # replicas follow the load: up for the burst, back down after it
    assert max(s[1] for s in burst) >= max(s[1] for s in base) + 2, tl
    assert after[1] < max(s[1] for s in burst), tl
    # make-before-break: rnn was swapped off its 7g slice and never had no Ready pod on the way
    assert after[3] == 0 and after[2] >= 1, tl
    assert min(s[2] for s in samples) >= 1, tl
    # the team's HPA followed migscale's external metric up and down
    assert max(s[4] for s in burst) >= 3 and after[4] < max(s[4] for s in burst), tl

    # one writer per field: replicas of migscale's workloads by migscale only, of the front end by its HPA only
    audit = {k: v for k, v in fake.field_writers.items() if k[0] == "Deployment"}
    for (_kind, _ns, name), fields in audit.items():
        writers = fields.get("spec.replicas", set())
        assert writers <= ({"horizontal-pod-autoscaler"} if name == "frontend" else {"migscale"}), (name, writers)
    assert audit[("Deployment", "default", "frontend")]["spec.replicas"] == {"horizontal-pod-autoscaler"}
    assert any("spec.replicas" in f for (_k, _ns, n), f in audit.items() if n.startswith("resnet-"))
    for (kind, _ns, name), fields in fake.field_writers.items():
        if kind == "Node":
            assert fields.get("spec.unschedulable", set()) <= {"migscale"}, (name, fields)
    assert not [h for h in fake.list("HorizontalPodAutoscaler") if h["metadata"]["name"] != "frontend"]

    # Events for the scales with the decision's reason, and each model's condition in /v1/status
    notes = [e["note"] for e in fake.list("Event") if e.get("reportingController") == "migscale.io/controller"
             and e["regarding"]["name"].startswith("resnet-") and e["reason"] == "SuccessfulRescale"]
    assert any("scale_up_demand" in n for n in notes) and any("scale_down_demand" in n for n in notes), (notes, tl)
    status = httpx.get(f"{ctl.url}/v1/status", timeout=5).json()
    assert status["leader"] is True and set(status["conditions"]) == {"resnet", "rnn"}
    # the pods are scraped at their IPs each second, every one answering. /v1/status shows the
    # last round: on a busy machine one pod may miss a round's 0.5 s timeout, so wait for a
    # round with none missed (a scrape that never reaches a pod never shows one)
    rounds: list[dict] = []

    def clean_round() -> bool:
        rounds.append(httpx.get(f"{ctl.url}/v1/status", timeout=5).json()["fast_scrape"])
        return rounds[-1]["targets"] >= 2 and rounds[-1]["failures"] == 0

    try:
        cluster.wait(clean_round, 15, "a fast-scrape round with every pod answering")
    except AssertionError as exc:
        raise AssertionError(f"{exc}; the last rounds: {rounds[-3:]}") from None
    assert all(c["type"] == "AtTarget" and c["status"] in ("True", "False") for c in status["conditions"].values())
    assert not cluster.plane.errors and not (cluster.hpa and cluster.hpa.errors)


MODELS_2 = """
models:
  - {name: bert, model_dir: /models/bert, slo: {p99_ms: 200}, profiles: [4g.40gb], min_replicas: 1, max_replicas: 2,
     capacity: {4g.40gb: 117}}
  - {name: rnn, model_dir: /models/rnn, slo: {p99_ms: 150}, profiles: [1g.10gb], min_replicas: 1, max_replicas: 12,
     capacity: {1g.10gb: 122}}
"""


def test_leader_killed_mid_repartition_the_follower_finishes_one_consistent_layout(world, tmp_path):
    cluster = world["cluster"]
    fake = cluster.fake
    # bert's 4g pod runs on node-1 (placed there by an earlier leader); rnn outgrows node-2's seven
    # 1g slices, and the planner cuts the free 3g next to bert: node-1 is drained (bert first gets a
    # surge replica on node-0's free 4g, then its pod is evicted), relabelled, reconfigured, uncordoned
    fake.put_object(gpu_node("node-0", {"4g.40gb": 1}), manager="kubelet")
    fake.put_object(gpu_node("node-1", {"4g.40gb": 1, "3g.40gb": 1}), manager="kubelet")
    fake.put_object(gpu_node("node-2", {"1g.10gb": 7}), manager="kubelet")
    cfg = write_configs(tmp_path, MODELS_2, ["node-0", "node-1", "node-2"])
    from autoscaler.act.kubernetes.config import render_config
    from autoscaler.act.kubernetes.placer import with_hostname
    from autoscaler.act.kubernetes.render import deployment, pod_disruption_budget
    from autoscaler.config import load_cluster, load_models, model_specs

    bert = next(m for m in model_specs(load_models(cfg[0]), load_cluster(cfg[1])) if m.name == "bert")
    rcfg = render_config(load_cluster(cfg[1]))
    fake.create_obj(deployment(bert, "4g.40gb", 1, rcfg), manager="migscale")
    fake.create_obj(pod_disruption_budget(bert, "4g.40gb", rcfg), manager="migscale")
    gated = cluster.wait(lambda: fake.list("Pod"), 10, "bert's pod")[0]
    spec = {**gated["spec"], "schedulingGates": [], "affinity": with_hostname(gated["spec"]["affinity"], "node-1")}
    fake.update_obj({**gated, "spec": spec}, manager="migscale")
    cluster.wait(lambda: ready_pods(fake, "bert"), 10, "bert Ready on node-1")

    def load(t: float) -> dict[str, float]:
        return {"bert": 50.0, "rnn": 100.0 if t < 5 else 1000.0}

    prom = world["prom"] = LoadPrometheus(fake, capacities(MODELS_2), load)
    a = Controller(cfg, cluster.url, prom.url, "ctl-a")
    world["controllers"].append(a)
    a.wait_url()
    cluster.wait(lambda: (fake.get("Lease", "migscale-controller") or {}).get("spec", {}).get("holderIdentity") == "ctl-a",
                 10, "ctl-a to lead")
    b = Controller(cfg, cluster.url, prom.url, "ctl-b")
    world["controllers"].append(b)
    b.wait_url()

    def phase() -> str | None:
        ann = (fake.get("Node", "node-1", None)["metadata"].get("annotations") or {}).get("migscale.io/repartition")
        return json.loads(ann)["phase"] if ann else None

    cluster.wait(lambda: phase() == "configuring", 30, "node-1's repartition to reach mig-manager")
    a.stop(signal.SIGKILL)  # mid-repartition, lease not released
    cluster.wait(lambda: fake.get("Lease", "migscale-controller")["spec"].get("holderIdentity") == "ctl-b", 15,
                 "ctl-b to take over")
    cluster.wait(lambda: phase() is None, 20, "the repartition to finish")
    node = fake.get("Node", "node-1", None)
    lbls = node["metadata"]["labels"]
    assert lbls["nvidia.com/mig.config.state"] == "success" and not node["spec"].get("unschedulable")
    cm = fake.get("ConfigMap", "migscale-mig-parted-config", "gpu-operator")
    entry = yaml.safe_load(cm["data"]["config.yaml"])["mig-configs"][lbls["nvidia.com/mig.config"]]
    want = entry_counts(entry)
    assert want["4g.40gb"] == 1 and want["1g.10gb"] >= 1 and set(want) == {"4g.40gb", "1g.10gb"}, want  # cut for rnn
    alloc = {k[len("nvidia.com/mig-"):]: int(v) for k, v in node["status"]["allocatable"].items()
             if k.startswith("nvidia.com/mig-") and int(v)}
    assert alloc == dict(want)
    assert {k: int(v) for k, v in lbls.items() if k.startswith("nvidia.com/mig-") and k.endswith(".count")} == \
        {f"nvidia.com/mig-{p}.count": n for p, n in want.items()}
    for n in fake.list("Node"):  # no orphan cordon: a cordoned node is one the live leader is repartitioning
        ann = (n["metadata"].get("annotations") or {}).get("migscale.io/repartition")
        if n["spec"].get("unschedulable"):
            assert ann and json.loads(ann)["holder"] == "ctl-b", n["metadata"]["name"]
    evictions = Counter(r.path.split("/")[-2] for r in fake.requests if r.path.endswith("/eviction"))
    assert evictions and max(evictions.values()) == 1, evictions  # bert's pod left node-1, once
    bound = Counter(p["metadata"]["labels"]["migscale.io/profile"] for p in fake.view("Pod")
                    if p["spec"].get("nodeName") == "node-1" and not p["metadata"].get("deletionTimestamp"))
    assert all(bound[p] <= n for p, n in want.items()), bound
    # bert's only pod was on node-1: a surge replica came first elsewhere, and bert kept a Ready pod
    notes = [e["note"] for e in fake.list("Event") if e["regarding"].get("name") == "bert-4g-40gb"]
    assert any("surge: a replacement before draining node-1" in n for n in notes), notes
    assert ready_pods(fake, "bert")
    status = cluster.wait(lambda: (st := httpx.get(f"{b.url}/v1/status", timeout=5).json())["leader"] and st, 10,
                          "ctl-b's status to say it leads")
    assert status["identity"] == "ctl-b" and status["health"]["ready"]
    assert not cluster.plane.errors
