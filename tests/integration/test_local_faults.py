"""The local backend under faults, with real processes: crash-loop back-off, nothing leaks,
nginx and Prometheus supervised.

Short back-off settings come from config (``BackoffPolicy``), the defaults stay
kubelet's. The failing model (``fault_models/broken``) raises in ``initialize``,
so tritonserver exits ~2 s into every start, as a missing dependency would.
Assertions are about outcomes: states, error text, process and byte counts.
"""

from __future__ import annotations

import itertools
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import pytest
from _support import wait_until

from autoscaler.act.local.backoff import BackoffPolicy
from autoscaler.act.local.cluster import LocalCluster
from autoscaler.act.local.nginx import NginxError, NginxFrontDoor, Route
from autoscaler.act.local.pids import proc_alive, proc_command, started_from
from autoscaler.act.local.ports import PortInUse
from autoscaler.act.local.replicas import LocalReplica, ModelRuntime
from autoscaler.act.local.triton import free_port, run_dir_shm_prefix
from autoscaler.mig.layout import Placement
from autoscaler.policy.types import Action, ActionKind, GpuState, Reason, ReplicaState

pytestmark = pytest.mark.integration

FAULTS = Path(__file__).resolve().parent / "fault_models"
TRITON = Path(__file__).resolve().parents[2] / "triton_models"
GPU = "node-a/0"
R = Reason.MIN_REPLICAS


def _stubs(run_dir: Path) -> list[int]:
    return [p for p in started_from(run_dir, []) if "triton_python_backend_stub" in proc_command(p)]


def _shm(run_dir: Path) -> list[str]:
    """The Python backend's shared-memory regions of the servers run from ``run_dir``."""
    return sorted(p.name for p in Path("/dev/shm").glob(run_dir_shm_prefix(run_dir) + "*"))


def _pgid(pid: int) -> int | None:
    try:
        return os.getpgid(pid)
    except ProcessLookupError:
        return None


def _bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


@pytest.fixture
def faulty(tmp_path):
    """tiny (healthy) + broken (never loads), real nginx and Prometheus, 1 s -> 4 s back-off."""
    c = LocalCluster(
        tmp_path / "run",
        {m: ModelRuntime(m, FAULTS, m) for m in ("tiny", "broken")},
        # the instances the tests use, carved (a CREATE needs one)
        [GpuState(GPU, "node-a", "A100-SXM4-80GB", layout=tuple(Placement(s, "1g.10gb") for s in (0, 1, 6)))],
        restart_backoff=BackoffPolicy(initial_s=1.0, max_s=4.0, reset_after_s=60.0),
        emulate=False,
        wait_ready_timeout_s=60,
    )
    c.start()
    try:
        yield c
    finally:
        c.stop()
        left = started_from(c.run_dir, [])
        assert left == {}, f"left behind: {[proc_command(p) for p in left]}"


@pytest.mark.alone  # counts restarts, and stubs' lifetimes, against the clock
def test_crash_loop_backs_off_reports_the_error_and_holds_the_model(faulty):
    c = faulty
    assert c.apply([Action(ActionKind.CREATE, R, gpu=GPU, model="tiny", profile="1g.10gb", start=6),
                    Action(ActionKind.CREATE, R, gpu=GPU, model="broken", profile="1g.10gb", start=0)]) == []
    broken = next(r for r in c.replicas() if r.model == "broken")
    wait_until(lambda: broken.state is ReplicaState.CRASHLOOP, 30, "the broken replica to crash-loop")
    # first exit restarted at once, the second waits out the back-off: CRASHLOOP, with why
    assert broken.restarts == 1
    assert any("cannot open weights" in ln for ln in broken.last_error)
    row = next(x for x in c.status()["replicas"] if x["id"] == broken.id)
    assert row["state"] == "crashloop" and row["restarts"] == 1 and row["next_restart_in_s"] is not None
    assert any("cannot open weights" in ln for ln in row["last_error"])
    # the policy's view: not capacity, not in flight -- it may place a replacement elsewhere
    snap = {r.id: r.state for r in c.snapshot().replicas}
    assert snap[broken.id] is ReplicaState.CRASHLOOP
    assert "broken" not in c.in_flight()[1]
    err = c.apply([Action(ActionKind.WAIT_READY, R, replica=broken.id)])
    assert err and "crash-looping" in err[0] and "cannot open weights" in err[0]

    # Restarts come further and further apart: 1 s, 2 s, 4 s, 4 s ...
    # No Python stub outlives its tritonserver by more than a moment (the supervisor's pass).
    restarts_at: list[float] = []
    seen = broken.restarts
    orphaned_since: dict[int, float] = {}
    deadline = time.monotonic() + 11
    while time.monotonic() < deadline:
        now = time.monotonic()
        if broken.restarts != seen:
            seen = broken.restarts
            restarts_at.append(now)
        servers = {r.process.pid for r in c.replicas() if r.process.alive()}
        for p in _stubs(c.run_dir):
            if _pgid(p) not in servers:
                orphaned_since.setdefault(p, now)
        late = {p: now - t for p, t in orphaned_since.items() if proc_alive(p) and now - t > 2.0}
        assert not late, f"stubs outlived their server: {late}"
        time.sleep(0.05)
    gaps = [b - a for a, b in itertools.pairwise(restarts_at)]
    assert 2 <= len(restarts_at) <= 4, restarts_at
    assert all(g >= 2.0 for g in gaps), gaps  # each gap: >= the back-off (2 s, 4 s) + a failed start

    # A replacement that crash-loops too: the fault is the model's; no more replacements.
    assert c.apply([Action(ActionKind.CREATE, R, gpu=GPU, model="broken", profile="1g.10gb", start=1)]) == []
    second = next(r for r in c.replicas() if r.model == "broken" and r.id != broken.id)
    wait_until(lambda: second.state is ReplicaState.CRASHLOOP, 30, "the replacement to crash-loop")
    assert "broken" in c.in_flight()[1] and c.status()["crashloop_held"] == ["broken"]
    tiny = next(r for r in c.replicas() if r.model == "tiny")
    assert tiny.state is ReplicaState.READY and tiny.restarts == 0

    # Removed from the configuration, the model is not held: the hold would also stop the drains
    # that retire its replicas (they crash-looped on until `migscale up` was restarted).
    c.declared = frozenset({"tiny"})
    assert "broken" not in c.in_flight()[1] and c.status()["crashloop_held"] == []
    c.declared = None

    # Deleting them ends the crash loop and the hold.
    assert c.apply_and_wait([Action(ActionKind.DELETE, Reason.REPLACE_FAILED, replica=broken.id),
                             Action(ActionKind.DELETE, Reason.REPLACE_FAILED, replica=second.id)], 60) == []
    assert [r.model for r in c.replicas()] == ["tiny"]
    assert "broken" not in c.in_flight()[1]


@pytest.mark.alone  # times a crash after readiness against the back-off
def test_a_model_that_crashes_after_turning_ready_is_held_and_backs_off(tmp_path):
    """Ready for 3 s, then its server is killed: each start turns ready. Readiness alone used to
    end the crash loop, so the policy placed a fresh replica (a fresh back-off) each time."""
    c = LocalCluster(
        tmp_path / "run", {"late": ModelRuntime("late", FAULTS, "late")},
        [GpuState(GPU, "node-a", "A100-SXM4-80GB", layout=tuple(Placement(s, "1g.10gb") for s in (0, 1)))],
        restart_backoff=BackoffPolicy(initial_s=1.0, max_s=4.0, reset_after_s=60.0),
        emulate=False, wait_ready_timeout_s=60,
    )
    c.start()
    try:
        assert c.apply([Action(ActionKind.CREATE, R, gpu=GPU, model="late", profile="1g.10gb", start=0)]) == []
        first = next(r for r in c.replicas())
        wait_until(lambda: first.state is ReplicaState.CRASHLOOP, 60, "the first replica to crash-loop")
        assert first.restarts >= 1  # it was ready, crashed, restarted at once, was ready, crashed again
        assert first.last_error[-1] == "killed by SIGKILL (its log shows no error)", first.last_error
        assert "late" not in c.in_flight()[1]  # one looping replica: the policy may try a replacement
        assert c.apply([Action(ActionKind.CREATE, R, gpu=GPU, model="late", profile="1g.10gb", start=1)]) == []
        second = next(r for r in c.replicas() if r.id != first.id)
        wait_until(lambda: second.state is ReplicaState.CRASHLOOP, 60, "the replacement to crash-loop")
        # the replacement loops too: held, and it stays held while the two turn ready for 3 s at a time
        seen_regions = 0
        deadline = time.monotonic() + 12
        while time.monotonic() < deadline:
            assert c.status()["crashloop_held"] == ["late"], [r.state for r in c.replicas()]
            # each killed server's 1 MiB /dev/shm region goes with it: at most one per live server
            # (one per start accumulated before, in RAM)
            mine = _shm(c.run_dir)
            assert len(mine) <= 2, mine
            seen_regions = max(seen_regions, len(mine))
            time.sleep(0.2)
        assert seen_regions >= 1  # the servers' regions carry the run directory's prefix
        assert {r.id for r in c.replicas()} == {first.id, second.id}
    finally:
        c.stop()
        left = started_from(c.run_dir, [])
        assert left == {}, f"left behind: {[proc_command(p) for p in left]}"
        assert _shm(c.run_dir) == []


def test_a_ready_replica_whose_python_stub_dies_is_restarted_not_left_answering_500(faulty):
    """Its server stays up and healthy by its own endpoints, and answers 500 ("Stub process is not
    healthy") to every request of the model: it serves nothing, so it is restarted."""
    from autoscaler.act.local.pids import proc_children

    c = faulty
    assert c.apply([Action(ActionKind.CREATE, R, gpu=GPU, model="tiny", profile="1g.10gb", start=6)]) == []
    r = next(iter(c.replicas()))
    wait_until(lambda: r.state is ReplicaState.READY, 60, "tiny ready")
    server = r.process.proc.pid
    (stub,) = [p for p in proc_children(server) if "triton_python_backend_stub" in proc_command(p)]
    os.kill(stub, signal.SIGKILL)
    wait_until(lambda: r.restarts == 1 and r.state is ReplicaState.READY, 60, "tiny restarted and ready again")
    assert not proc_alive(server) and r.process.proc.pid != server  # a new server, not the broken one
    assert any(f"Python backend stub {stub} died" in ln for ln in r.last_error), r.last_error


def test_a_replica_that_never_turns_ready_is_stopped_and_restarted_under_the_back_off(tmp_path):
    """Its initialize hangs: the server lives, never ready. It used to stay `starting` for good
    (counted as capacity on its way); after the startup timeout it is stopped and restarted."""
    c = LocalCluster(
        tmp_path / "run", {"hang": ModelRuntime("hang", FAULTS, "hang")},
        [GpuState(GPU, "node-a", "A100-SXM4-80GB", layout=(Placement(0, "1g.10gb"),))],
        restart_backoff=BackoffPolicy(initial_s=30.0, max_s=60.0, reset_after_s=600.0),
        emulate=False, wait_ready_timeout_s=60, startup_timeout_s=4.0,
    )
    c.start()
    try:
        assert c.apply([Action(ActionKind.CREATE, R, gpu=GPU, model="hang", profile="1g.10gb", start=0)]) == []
        r = next(iter(c.replicas()))
        # the first stop restarts it at once (kubelet's first restart); the second waits out the back-off
        wait_until(lambda: r.state is ReplicaState.CRASHLOOP, 60, "the stuck replica to be stopped twice")
        assert r.restarts == 1
        assert r.last_error[-1].startswith("not ready after 4s; stopped"), r.last_error
        assert not r.process.alive() and _stubs(c.run_dir) == []  # its whole group went
    finally:
        c.stop()
        left = started_from(c.run_dir, [])
        assert left == {}, f"left behind: {[proc_command(p) for p in left]}"


class _DrainedWhileLooked:
    """A dead process whose liveness check races a drain, as the drain thread would:
    it sets DRAINING under the cluster's lock (blocking while the supervisor holds it)."""

    def __init__(self, c: LocalCluster, r: LocalReplica) -> None:
        object.__setattr__(self, "real", r.process)
        self.c, self.r, self.proc = c, r, None

    def alive(self) -> bool:
        def drain():
            with self.c._lock:
                self.r.state = ReplicaState.DRAINING

        t = threading.Thread(target=drain)
        t.start()
        t.join(0.3)
        return False

    def __getattr__(self, name):
        return getattr(object.__getattribute__(self, "real"), name)


def test_supervisor_never_overwrites_a_drain(faulty):
    c = faulty
    assert c.apply_and_wait([Action(ActionKind.CREATE, R, gpu=GPU, model="tiny", profile="1g.10gb", start=6),
                             Action(ActionKind.WAIT_READY, R)], 60) == []
    c.supervisor.stop()  # drive the passes by hand
    r = c.replicas()[0]
    real = r.process
    r.process = _DrainedWhileLooked(c, r)  # type: ignore[assignment]
    restarts = r.restarts
    c.supervise_once()
    time.sleep(0.5)
    assert r.state is ReplicaState.DRAINING  # the drain's state stands; no restart on top of it
    assert r.restarts == restarts
    r.process = real


def test_killed_group_leaves_no_process_and_prunes_its_generations(tmp_path):
    """kill -9 the leader of a multinode group again and again, each time once its Python
    stub runs: the stub and the other rank are gone within 5 s, and at the end `stop`
    leaves no process and a few MB on disk."""
    c = LocalCluster(
        tmp_path / "run",
        {"llm": ModelRuntime("llm", TRITON, "llm", "multinode", group_size=2)},
        [GpuState(f"rdma-{i}/0", f"rdma-{i}", "H100-SXM5-80GB", (), mig_enabled=False, rdma=True,
                  fabric="ib-a") for i in range(2)],
        prometheus="off",
        restart_backoff=BackoffPolicy(initial_s=0.0, max_s=0.0, reset_after_s=60.0),
    )
    c.start()
    try:
        assert c.apply([Action(ActionKind.CREATE, R, gpu=f"rdma-{k}/0", model="llm", profile="whole", start=0,
                               replica=f"llm-g0-{k}") for k in range(2)]) == []
        g = c.replicas()[0]
        for kill in range(3):
            gen = g.process.generation
            leader = wait_until(lambda gen=gen: g.process.pid if g.process.generation == gen else None, 10,
                                "a leader")
            stub = wait_until(lambda leader=leader: [p for p in _stubs(c.run_dir) if _pgid(p) == leader], 30,
                              f"the leader's Python stub (kill {kill})")
            gone = [*stub, g.process.pids()[1]]
            os.kill(leader, signal.SIGKILL)
            wait_until(lambda gone=gone: not any(proc_alive(p) for p in gone), 5,
                       "the stub and the other rank to follow their leader")
            wait_until(lambda gen=gen: g.process.generation > gen, 10, "the group to be recreated")
        assert g.restarts >= 3
        gens = sorted(p.name for p in (c.run_dir / "replicas" / "llm-g0").glob("gen*"))
        assert len(gens) <= 3, gens
    finally:
        c.stop()
    assert started_from(c.run_dir, []) == {}
    assert _bytes(c.run_dir) < 20 * 1024 * 1024


def test_nginx_and_prometheus_come_back_and_orphaned_workers_die(faulty):
    c = faulty
    assert c.apply_and_wait([Action(ActionKind.CREATE, R, gpu=GPU, model="tiny", profile="1g.10gb", start=6),
                             Action(ActionKind.WAIT_READY, R)], 60) == []
    master, workers = c.door.pid, c.door.workers()
    assert master and workers
    before = {name: st.restarts for name, st in c.infra.items()}  # one kill, one restart: counted from here
    os.kill(master, signal.SIGKILL)
    wait_until(lambda: not any(proc_alive(w) for w in workers), 5, "the old master's workers to die with it")
    wait_until(lambda: c.door.alive() and c.door.pid != master, 10, "nginx to be restarted")

    def routed() -> bool:
        try:
            with urllib.request.urlopen(f"{c.frontdoor_url}/v2/models/tiny/ready", timeout=2) as r:
                return r.status == 200
        except OSError:
            return False

    wait_until(routed, 10, "the front door to route to tiny again")
    wait_until(lambda: c.status()["infrastructure"]["nginx"]["state"] == "up", 5, "status to say nginx is up")
    assert c.infra["nginx"].restarts == before["nginx"] + 1

    prom = c.prom.pid
    os.kill(prom, signal.SIGKILL)
    wait_until(lambda: c.infra["prometheus"].state == "up" and c.prom.pid != prom, 30, "Prometheus restarted")
    assert c.infra["prometheus"].restarts == before["prometheus"] + 1 and c.prom.mode == "prometheus"


def test_a_taken_port_is_an_error_naming_its_holder(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        door = NginxFrontDoor(tmp_path, port)
        with pytest.raises(PortInUse, match=rf"port {port} is in use by pid {os.getpid()} \(.*{Path(sys.executable).name}"):
            door.start([])
        assert door.proc is None  # nothing started


def test_a_reload_racing_nginx_s_exit_is_an_nginx_error(tmp_path):
    """nginx exits between the liveness check and the reload's signal (at teardown):
    the caller gets NginxError, which it handles, not a ProcessLookupError."""
    door = NginxFrontDoor(tmp_path, free_port())
    door.start([])
    try:
        door.proc.kill()
        door.proc.wait()  # gone and reaped: its PID names nothing we started
        door.alive = lambda: True  # the check that ran just before it exited
        with pytest.raises(NginxError, match="exited before its reload"):
            door.update([Route("tiny", ("127.0.0.1:1",), None)])
    finally:
        door.stop()


def test_a_drain_whose_reload_fails_still_retires_the_replica(faulty, monkeypatch):
    c = faulty
    assert c.apply_and_wait([Action(ActionKind.CREATE, R, gpu=GPU, model="tiny", profile="1g.10gb", start=6),
                             Action(ActionKind.WAIT_READY, R)], 60) == []
    r = c.replicas()[0]
    pids = r.pids()
    crashed = []
    monkeypatch.setattr(threading, "excepthook", lambda args: crashed.append(args.exc_value))

    def refused(routes):
        raise NginxError("nginx exited before its reload (exit -9)")

    monkeypatch.setattr(c.door, "update", refused)
    assert c.apply([Action(ActionKind.DRAIN, R, replica=r.id)]) == []
    wait_until(lambda: not c.replicas(), 30, "the drained replica to be removed")
    assert not any(proc_alive(p) for p in pids)
    assert any(f"drain {r.id}: front door not reloaded" in e for e in c.events)
    assert crashed == []


def _cli_configs(tmp_path: Path, models_text: str, cluster_extra: str = "") -> tuple[Path, Path, Path]:
    models, cluster = tmp_path / "models.yaml", tmp_path / "cluster.yaml"
    models.write_text(models_text)
    cluster.write_text(
        "gpus:\n  - {node: node-a, product: A100-SXM4-80GB, count: 1, emulated: true}\n" + cluster_extra
        + "local: {frontdoor_port: 0, api_port: 0, prometheus: 'off'}\n"
    )
    return models, cluster, tmp_path / "run"


def _popen_up(models: Path, cluster: Path, run_dir: Path, env: dict | None = None):
    return subprocess.Popen(
        [sys.executable, "-m", "autoscaler", "up", str(models), str(cluster), "--run-dir", str(run_dir),
         "--no-control"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True, env=env,
    )


def test_two_up_on_one_run_dir_one_runs_and_down_leaves_nothing(tmp_path):
    models, cluster, run_dir = _cli_configs(
        tmp_path,
        "models:\n"
        f"  - {{name: tiny, model_dir: {FAULTS / 'tiny'}, slo: {{p99_ms: 100}}, profiles: [1g.10gb],"
        " min_replicas: 1, max_replicas: 2, capacity: {1g.10gb: 100}}\n",
    )
    ups = [_popen_up(models, cluster, run_dir)]
    time.sleep(0.3)  # the second a moment later: both race for the run dir
    ups.append(_popen_up(models, cluster, run_dir))
    try:
        loser = wait_until(lambda: next((u for u in ups if u.poll() is not None), None), 60, "one `up` to refuse")
        out = loser.stdout.read()
        winner = ups[1 - ups.index(loser)]
        assert loser.returncode == 2, out
        assert f"a controller is already running there (pid {winner.pid})" in out
        assert winner.poll() is None
        wait_until(lambda: any(r.get("state") == "ready" for r in _status(run_dir)), 60, "tiny ready")
    finally:
        down = subprocess.run([sys.executable, "-m", "autoscaler", "down", "--run-dir", str(run_dir)],
                              capture_output=True, text=True, timeout=120, check=False)
        for u in ups:
            u.wait(30)
    assert down.returncode == 0 and f"stopped controller {winner.pid}" in down.stdout, down.stdout
    assert started_from(run_dir, []) == {}


def _status(run_dir: Path) -> list[dict]:
    r = subprocess.run([sys.executable, "-m", "autoscaler", "status", "--json", "--run-dir", str(run_dir)],
                       capture_output=True, text=True, timeout=60, check=False)
    return json.loads(r.stdout)["replicas"] if r.returncode == 0 else []


def test_up_without_torch_for_a_multinode_model_fails_fast_and_clearly(tmp_path):
    """The reported fault: the venv lacks torch. Injected with tests/notorch's sitecustomize, which
    hides it from every interpreter started with this environment (the stub's and the ranks' too)."""
    notorch = Path(__file__).resolve().parents[1] / "notorch"  # its sitecustomize hides torch
    models, cluster, run_dir = _cli_configs(
        tmp_path,
        "models:\n"
        f"  - {{name: llm, model_dir: {TRITON / 'llm'}, slo: {{p99_ms: 2000}}, memory_gb: 120,"
        " min_replicas: 1, max_replicas: 1, backend: multinode,"
        " multinode: {nodes_per_group: 2, gpus_per_node: 1, group_capacity_rps: 4}}\n",
        "rdma_pool:\n  nodes:\n    - {name: rdma-0, product: H100-SXM5-80GB, gpus: 1, fabric: ib-a}\n"
        "    - {name: rdma-1, product: H100-SXM5-80GB, gpus: 1, fabric: ib-a}\n",
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(notorch), os.environ.get("PYTHONPATH", "")])}
    up = _popen_up(models, cluster, run_dir, env)
    out, _ = up.communicate(timeout=120)
    assert up.returncode == 2, out
    assert "models[0] (llm).backend: multinode model 'llm' needs torch" in out
    assert "No module named 'torch'" in out and "pip install 'migscale[multinode]'" in out
    assert not (run_dir / "replicas").exists()  # nothing was started
    assert started_from(run_dir, []) == {}
