"""The local backend end to end: real tritonserver replicas, nginx front door, Prometheus.

Everything listens on 127.0.0.1 on free ports and is stopped in ``finally``;
after each cluster stops, every PID it ever recorded is checked to be gone.
Deadlines bound the polling; the assertions are about outcomes (zero failed
requests, replaced and serving, targets up), never about durations.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Self

import numpy as np
import pytest
import tritonclient.http as th
from _support import live_status, wait_until

from autoscaler.act.local.cluster import LocalCluster
from autoscaler.act.local.pids import load_records, proc_alive, proc_command, started_from
from autoscaler.act.local.replicas import ModelRuntime
from autoscaler.mig.layout import Placement
from autoscaler.policy.types import Action, ActionKind, GpuState, Reason, ReplicaState
from loadtests import resend

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2] / "triton_models"
GPU = "node-a/0"
R = Reason.SCALE_UP_DEMAND


def _descendants(pid: int) -> set[int]:
    """Children and grandchildren (the Python backend stubs of a tritonserver)."""
    out, frontier = set(), {pid}
    while frontier:
        nxt = set()
        for d in os.listdir("/proc"):
            if d.isdigit():
                try:
                    with open(f"/proc/{d}/stat") as f:
                        if int(f.read().rsplit(")", 1)[1].split()[1]) in frontier:
                            nxt.add(int(d))
                except (OSError, ValueError, IndexError):
                    pass
        nxt -= out
        out |= nxt
        frontier = nxt
    return out


class PidWatch:
    """Every PID the cluster records, plus the descendants of each, while the test runs."""

    def __init__(self, cluster: LocalCluster) -> None:
        self.seen: set[int] = set()
        orig = cluster.pids.add

        def add(pid, kind, name="", **kw):
            orig(pid, kind, name, **kw)
            if pid:
                self.seen.add(pid)

        cluster.pids.add = add  # type: ignore[method-assign]
        self.cluster = cluster

    def sweep(self) -> None:
        for pid in list(self.seen):
            self.seen |= _descendants(pid)


def _infer_input(model: str) -> tuple[str, list]:
    if model == "resnet":
        i = th.InferInput("INPUT", [1, 3, 32, 32], "FP32")
        i.set_data_from_numpy(np.random.default_rng(0).random((1, 3, 32, 32), dtype=np.float32))
        return "PROBS", [i]
    i = th.InferInput("SEQUENCE", [1, 20, 8], "FP32")
    i.set_data_from_numpy(np.random.default_rng(0).random((1, 20, 8), dtype=np.float32))
    return "OUTPUT", [i]


class Load:
    """Steady closed-loop tritonclient load through the front door (bounded count and time)."""

    def __init__(
        self, url: str, model: str, threads: int = 3, max_requests: int = 20000, max_s: float = 120
    ) -> None:
        self.url, self.model = url.removeprefix("http://"), model
        self.ok = 0
        self.failures: list[str] = []
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._max_requests, self._deadline = max_requests, time.monotonic() + max_s
        self._threads = [threading.Thread(target=self._run, daemon=True) for _ in range(threads)]

    def _run(self) -> None:
        client = th.InferenceServerClient(self.url, network_timeout=30)
        out, inputs = _infer_input(self.model)
        while not self._stop.is_set() and time.monotonic() < self._deadline and self.ok < self._max_requests:
            try:
                # resends once what a reloading front door closed unanswered (loadtests/resend.py)
                r = resend.infer(client, self.model, inputs)
                assert r.as_numpy(out).shape[0] == 1
                with self._lock:
                    self.ok += 1
            except Exception as e:  # noqa: BLE001 -- every failure is recorded, the test asserts none
                with self._lock:
                    self.failures.append(f"{type(e).__name__}: {e}")
        client.close()

    def __enter__(self) -> Self:
        for t in self._threads:
            t.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(60)


def _success_count(replica) -> float:
    with urllib.request.urlopen(replica.process.url_metrics, timeout=2) as r:
        text = r.read().decode()
    return sum(
        float(ln.rsplit(" ", 1)[1])
        for ln in text.splitlines()
        if ln.startswith("nv_inference_request_success{")
    )


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("local-cluster")
    models = {m: ModelRuntime(m, REPO, m) for m in ("resnet", "rnn")}
    # the instances the tests use are carved up front: a CREATE needs its instance (protocols.py)
    layout = (Placement(0, "2g.20gb"), Placement(2, "2g.20gb"), Placement(5, "1g.10gb"), Placement(6, "1g.10gb"))
    c = LocalCluster(run_dir, models, [GpuState(GPU, "node-a", "A100-SXM4-80GB", layout=layout)])
    watch = PidWatch(c)
    try:
        c.start()
        errs = c.apply_and_wait(
            [
                Action(ActionKind.CREATE, R, gpu=GPU, model="resnet", profile="1g.10gb", start=6),
                Action(ActionKind.CREATE, R, gpu=GPU, model="rnn", profile="1g.10gb", start=5),
                Action(ActionKind.WAIT_READY, R),
            ]
        )
        assert errs == []
        c.pid_watch = watch  # type: ignore[attr-defined]
        yield c
    finally:
        watch.sweep()
        c.stop()
        left = sorted(p for p in watch.seen if proc_alive(p))
        assert left == [], f"processes started by the test still running: {left}"
        assert json.loads((run_dir / "pids.json").read_text())["children"] == []


def _by_model(c: LocalCluster, model: str):
    return [r for r in c.replicas() if r.model == model]


def test_front_door_routes_health_metadata_and_both_models(cluster):
    client = th.InferenceServerClient(cluster.frontdoor_url.removeprefix("http://"))
    assert client.is_server_live() and client.is_server_ready()
    assert client.get_server_metadata()["name"] == "triton"
    for model in ("resnet", "rnn"):
        assert client.is_model_ready(model)
        out, inputs = _infer_input(model)
        assert client.infer(model, inputs).as_numpy(out).shape == ((1, 10) if model == "resnet" else (1, 8))
    with pytest.raises(Exception, match="404"):
        client.get_model_metadata("nope")


def test_scale_1_3_1_under_load_loses_no_request(cluster):
    assert len(_by_model(cluster, "resnet")) == 1
    with Load(cluster.frontdoor_url, "resnet") as load:
        wait_until(lambda: load.ok > 20, 30, "load to start")
        errs = cluster.apply_and_wait(
            [
                Action(ActionKind.CREATE, R, gpu=GPU, model="resnet", profile="2g.20gb", start=0),
                Action(ActionKind.CREATE, R, gpu=GPU, model="resnet", profile="2g.20gb", start=2),
                Action(ActionKind.WAIT_READY, R),
            ]
        )
        assert errs == []
        new = [r for r in _by_model(cluster, "resnet") if r.profile == "2g.20gb"]
        assert len(new) == 3 - 1 and all(r.state is ReplicaState.READY for r in new)
        # least_conn spreads the load: every new replica answers requests
        for r in new:
            wait_until(lambda r=r: _success_count(r) > 0, 30, f"traffic on {r.id}")
        new_pids = [r.process.pid for r in new]
        errs = cluster.apply_and_wait(
            [Action(ActionKind.DRAIN, R, replica=r.id) for r in new]
            + [Action(ActionKind.DELETE, R, replica=r.id) for r in new]
        )
        assert errs == []
        ok_after_drain = load.ok
        wait_until(lambda: load.ok > ok_after_drain + 20, 30, "load to continue on the remaining replica")
    remaining = _by_model(cluster, "resnet")
    assert [(r.profile, r.start, r.state) for r in remaining] == [("1g.10gb", 6, ReplicaState.READY)]
    assert not any(proc_alive(p) for p in new_pids)
    assert load.failures == []
    assert load.ok > 40
    # the emulated instances stay in the layout (MIG instances outlive replicas)
    assert Placement(0, "2g.20gb") in cluster.snapshot().gpu(GPU).layout


def test_killed_replica_is_replaced_and_serves_within_10s(cluster):
    (victim,) = _by_model(cluster, "rnn")
    before = victim.restarts  # a server that lost a port it chose at start was restarted already
    old_pid = victim.process.pid
    os.kill(old_pid, signal.SIGKILL)
    client = th.InferenceServerClient(cluster.frontdoor_url.removeprefix("http://"))
    out, inputs = _infer_input("rnn")

    def serving_again():
        r = cluster.replica(victim.id)
        if r is None or r.state is not ReplicaState.READY or r.process.pid == old_pid:
            return False
        try:
            return client.infer("rnn", inputs).as_numpy(out).shape == (1, 8)
        except Exception:  # noqa: BLE001 -- any failure means "not serving yet"; wait_until retries
            return False

    wait_until(serving_again, 30.0, "replacement of the killed replica")
    r = cluster.replica(victim.id)
    assert (r.gpu, r.start, r.profile) == (victim.gpu, victim.start, victim.profile)  # same instance
    assert r.restarts == before + 1
    assert not proc_alive(old_pid)


def test_prometheus_scrapes_every_replica(cluster):
    assert cluster.prometheus_url is not None, cluster.prom.banner()

    def all_up():
        with urllib.request.urlopen(f"{cluster.prometheus_url}/api/v1/targets", timeout=5) as r:
            active = json.load(r)["data"]["activeTargets"]
        want = {(r.id, f"127.0.0.1:{r.process.ports.metrics}") for r in cluster.replicas()}
        got = {(t["labels"].get("replica"), t["labels"]["instance"]) for t in active if t["health"] == "up"}
        return want if want and got == want else None

    got = wait_until(all_up, 30, "every replica to be an up target", interval_s=0.5)
    assert len(got) == len(cluster.replicas())
    # the target labels reach the series, and Triton's own model label survives
    q = urllib.parse.quote('nv_inference_request_success{model="resnet"}')

    def series():
        with urllib.request.urlopen(f"{cluster.prometheus_url}/api/v1/query?query={q}", timeout=5) as r:
            return json.load(r)["data"]["result"]

    res = wait_until(series, 30, "resnet series in Prometheus", interval_s=0.5)
    assert {s["metric"]["profile"] for s in res} >= {"1g.10gb"}
    assert all(s["metric"]["gpu"] == GPU for s in res)


def test_repartition_refuses_busy_instances_and_rewrites_free_ones(cluster):
    layout = cluster.snapshot().gpu(GPU).layout
    errs = cluster.apply(
        [Action(ActionKind.REPARTITION, Reason.REPARTITION, gpu=GPU, layout=(Placement(0, "7g.80gb"),))]
    )
    assert len(errs) == 1 and "still host" in errs[0]
    assert cluster.snapshot().gpu(GPU).layout == layout
    busy = tuple(Placement(r.start, r.profile) for r in cluster.replicas())
    target = tuple(sorted(busy + (Placement(0, "3g.40gb"),)))
    assert cluster.apply([Action(ActionKind.REPARTITION, Reason.REPARTITION, gpu=GPU, layout=target)]) == []
    assert cluster.snapshot().gpu(GPU).layout == target


# ---------------------------------------------------------------- CLI: up / status / down


def _write_configs(tmp_path: Path) -> tuple[Path, Path, Path]:
    run_dir = tmp_path / "run"
    models = tmp_path / "models.yaml"
    models.write_text(
        "models:\n"
        f"  - {{name: resnet, model_dir: {REPO / 'resnet'}, slo: {{p99_ms: 150}}, profiles: [1g.10gb],"
        " min_replicas: 1, max_replicas: 4, capacity: {1g.10gb: 58}}\n"
        f"  - {{name: rnn, model_dir: {REPO / 'rnn'}, slo: {{p99_ms: 150}}, profiles: [1g.10gb],"
        " min_replicas: 1, max_replicas: 4, capacity: {1g.10gb: 100}}\n"
    )
    cluster = tmp_path / "cluster.yaml"
    cluster.write_text(
        "gpus:\n  - {node: node-a, product: A100-SXM4-80GB, count: 1, emulated: true}\n"
        "local: {frontdoor_port: 0, api_port: 0}\n"
    )
    return models, cluster, run_dir


def _cli(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "autoscaler", *args], capture_output=True, text=True, timeout=timeout, check=False
    )


def _status_ready(run_dir: Path):
    doc = live_status(run_dir)  # the CLI itself is checked once per test
    if doc is None:
        return None
    reps = doc["replicas"]
    return doc if len(reps) == 2 and all(x["state"] == "ready" for x in reps) else None


def _wait_ready(run_dir: Path, log: Path, what: str):
    """``_status_ready`` within 90 s; a timeout names the replicas' states and the end of ``up``'s
    output, which a bare ``None`` would hide."""
    try:
        return wait_until(lambda: _status_ready(run_dir), 90, what, interval_s=0.5)
    except AssertionError as exc:
        doc = live_status(run_dir)
        states = None if doc is None else [(r.get("model"), r.get("state")) for r in doc["replicas"]]
        tail = log.read_text(errors="replace")[-2000:] if log.exists() else ""
        raise AssertionError(f"{exc}; replicas: {states}; `up` printed, last: {tail!r}") from None


def _recorded(run_dir: Path) -> set[int]:
    pids = {c["pid"] for c in json.loads((run_dir / "pids.json").read_text())["children"]}
    for p in list(pids):
        pids |= _descendants(p)
    return pids


@pytest.mark.parametrize("stop_with", ["down", "sigint", "removed"])
def test_cli_up_status_down_leaves_no_orphans(tmp_path, stop_with):
    models, cluster, run_dir = _write_configs(tmp_path)
    up = subprocess.Popen(
        [sys.executable, "-m", "autoscaler", "up", str(models), str(cluster), "--run-dir", str(run_dir)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    pids: set[int] = set()
    try:
        wait_until(lambda: _status_ready(run_dir), 90, "both replicas ready", interval_s=0.5)
        shown = _cli("status", "--json", "--run-dir", str(run_dir), timeout=30)
        assert shown.returncode == 0, shown.stderr
        doc = json.loads(shown.stdout)
        assert set(doc) >= {"frontdoor", "metrics_api", "prometheus", "replicas"}
        assert doc["controller_pid"] == up.pid
        assert {r["model"] for r in doc["replicas"]} == {"resnet", "rnn"}
        for r in doc["replicas"]:
            assert set(r) >= {"model", "profile", "gpu", "start", "port", "state"} and r["gpu"] == GPU
        with urllib.request.urlopen(doc["frontdoor"] + "/v2/health/ready", timeout=5) as resp:
            assert resp.status == 200
        pids = _recorded(run_dir) | {up.pid}
        assert len(pids) >= 4  # nginx, prometheus, 2 tritonservers (+ their stubs)
        # a second `up` on the same run dir refuses and names the live controller
        again = _cli("up", str(models), str(cluster), "--run-dir", str(run_dir))
        assert again.returncode == 2 and str(up.pid) in again.stderr
        table = _cli("status", "--run-dir", str(run_dir))
        assert table.returncode == 0 and "resnet" in table.stdout and "ready" in table.stdout

        if stop_with == "down":
            d = _cli("down", "--run-dir", str(run_dir))
            assert d.returncode == 0, d.stdout + d.stderr
            assert f"stopped controller {up.pid}" in d.stdout
        elif stop_with == "removed":
            # the run directory deleted under a running controller: `down` could no longer find
            # it, and it restarted what the sweep stopped; it must notice and stop everything
            shutil.rmtree(run_dir, ignore_errors=True)
        else:
            os.kill(up.pid, signal.SIGINT)
        out, _ = up.communicate(timeout=60)
        assert up.returncode == 0, out
        if stop_with == "removed":
            assert "was removed: stopping" in out
        assert "front door:" in out and "metrics API:" in out
        assert [p for p in pids if proc_alive(p)] == []
        gone = _cli("status", "--run-dir", str(run_dir))
        assert gone.returncode == 1 and "no controller running" in gone.stderr
    finally:
        if up.poll() is None:
            os.killpg(up.pid, signal.SIGTERM)
            up.wait(60)
        _cli("down", "--run-dir", str(run_dir))  # reaps anything a failed assertion left behind


def test_cli_up_after_a_crashed_controller_cleans_its_orphans(tmp_path):
    """kill -9 of the controller: its children die with it (parent-death signal); `up`
    again brings the same replicas back and nothing of the old stack runs beside them."""
    models, cluster, run_dir = _write_configs(tmp_path)
    up_log = tmp_path / "up.log"
    with up_log.open("w") as out:
        up = subprocess.Popen(
            [sys.executable, "-m", "autoscaler", "up", str(models), str(cluster), "--run-dir", str(run_dir)],
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    up2 = None
    try:
        _wait_ready(run_dir, up_log, "both replicas ready")
        before = json.loads((run_dir / "status.json").read_text())["replicas"]
        orphans = _recorded(run_dir)
        os.kill(up.pid, signal.SIGKILL)  # the controller dies without cleaning up
        up.wait(10)
        wait_until(lambda: not [p for p in orphans if proc_alive(p)], 15, "the dead controller's children to exit")
        up2 = subprocess.Popen(
            [sys.executable, "-m", "autoscaler", "up", str(models), str(cluster), "--run-dir", str(run_dir)],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
        wait_until(lambda: _status_ready(run_dir), 90, "the new controller's replicas ready", interval_s=0.5)
        after = json.loads((run_dir / "status.json").read_text())["replicas"]
        assert sorted(r["model"] for r in after) == sorted(r["model"] for r in before)
        tritons = [p for p in started_from(run_dir, load_records(run_dir)) if "tritonserver" in proc_command(p)]
        assert len(tritons) == len(after)  # no duplicate tritonserver of the old stack
        os.kill(up2.pid, signal.SIGTERM)
        out, _ = up2.communicate(timeout=60)
        assert "stopped" in out
        assert started_from(run_dir, []) == {}, out
    finally:
        for p in (up, up2):
            if p is not None and p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait(10)
        _cli("down", "--run-dir", str(run_dir))
