"""Kubelet-style restart back-off (act/local/backoff.py), the crash-loop status, and the
small process/port/lock helpers of the local backend -- no server started here."""

from __future__ import annotations

import itertools
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from autoscaler.act.local.backoff import BackoffPolicy, RestartBackoff
from autoscaler.act.local.pids import RunDirLock, started_from
from autoscaler.act.local.ports import PortInUse, check_bindable, port_holder
from autoscaler.act.local.procs import RUN_DIR_ENV, error_lines, rotate_log, spawn, stop_child
from autoscaler.policy.types import ClusterState, GpuState, Replica, ReplicaState
from autoscaler.status import ReplicaEndpoint, ReplicaHealth, build_status, render_table


def _crash_loop(b: RestartBackoff, runs_s: float, until_s: float, start_s: float = 2.0) -> list[float]:
    """Times at which a process that dies ``runs_s`` after each start is started."""
    starts, now = [0.0], 0.0
    while True:
        exited = now + start_s + runs_s
        wait = b.delay_s("r", exited, exited)
        now = exited + wait
        if now > until_s:
            return starts
        b.restarted("r", exited, now)
        starts.append(now)


def test_kubelet_sequence_first_restart_at_once_then_10_20_40_capped_at_300():
    b = RestartBackoff()
    starts = _crash_loop(b, runs_s=0.0, until_s=1200)
    waits = [round(b2 - b1 - 2.0, 6) for b1, b2 in itertools.pairwise(starts)]
    assert waits[:8] == [0, 10, 20, 40, 80, 160, 300, 300]
    assert max(waits) == 300
    # the worked number of the module doc: 7 starts in the first 10 minutes
    assert [s for s in starts if s <= 600] == [0, 2, 14, 36, 78, 160, 322]


def test_running_longer_than_reset_after_starts_over():
    p = BackoffPolicy(initial_s=10, max_s=300, reset_after_s=600)
    b = RestartBackoff(p)
    b.restarted("r", 0, 0)
    b.restarted("r", 5, 15)  # armed and doubled: 20 s
    assert b.current_s("r") == 20
    assert b.delay_s("r", exited_s=30, now_s=30) == pytest.approx(20)
    # ran 601 s since its last restart: the next exit restarts at once, back-off re-armed at 10 s
    assert b.delay_s("r", exited_s=15 + 601, now_s=15 + 601) == 0
    b.restarted("r", 15 + 601, 15 + 601)
    assert b.current_s("r") == 10


def test_keys_are_independent_and_forgotten():
    b = RestartBackoff(BackoffPolicy(1, 4, 60))
    b.restarted("a", 0, 0)
    assert b.delay_s("a", 1, 1) == pytest.approx(1)
    assert b.delay_s("b", 1, 1) == 0
    b.forget("a")
    assert b.delay_s("a", 1, 1) == 0 and len(b) == 0
    b.restarted("a", 0, 0)
    b.restarted("b", 0, 0)
    b.retain({"b", "nginx"})
    assert len(b) == 1 and b.current_s("b") == 1


def test_policy_rejects_initial_above_max():
    with pytest.raises(ValueError, match="initial_s <= max_s"):
        BackoffPolicy(initial_s=20, max_s=10)


def test_crashloop_row_shows_restarts_and_last_error_lines():
    cluster = ClusterState(
        (GpuState("n/0", "n", "A100-SXM4-80GB"),),
        (Replica("bad-1", "bad", "1g.10gb", "n/0", 0, ReplicaState.CRASHLOOP, 5.0),),
    )
    err = ("E1201 model_lifecycle.cc:642] failed to load 'bad': RuntimeError: cannot open weights",)
    doc = build_status(
        cluster, frontdoor="http://127.0.0.1:1", metrics_api=None, prometheus="http://127.0.0.1:2",
        endpoints={"bad-1": ReplicaEndpoint(1234, 99)},
        health={"bad-1": ReplicaHealth(restarts=3, next_restart_in_s=37.2, last_error=err, exit_code=1)},
        metrics_mode="prometheus-down", crashloop_held=("bad",),
        infrastructure={"nginx": {"state": "crashloop", "restarts": 2, "next_restart_in_s": 9.0,
                                  "last_error": ["bind() to 127.0.0.1:8000 failed (98: Address in use)"]}},
    )
    row = doc["replicas"][0]
    assert (row["state"], row["restarts"], row["next_restart_in_s"], row["exit_code"]) == ("crashloop", 3, 37.2, 1)
    assert row["last_error"] == list(err)
    text = render_table(doc)
    assert "crashloop" in text and "after 3 restart(s), next restart in 37s" in text
    assert "cannot open weights" in text
    assert "bad: every replica tried crash-loops" in text
    assert "DOWN: the loop holds every model (no scale-down)" in text
    assert "[crashloop, restart in 9s: bind() to 127.0.0.1:8000 failed" in text


def test_status_names_the_declared_models_that_have_no_replica():
    """Ten models on seven slices: the three without a slice had no row at all, and nothing said so."""
    cluster = ClusterState((GpuState("n/0", "n", "A100-SXM4-80GB"),),
                           (Replica("m00-0", "m00", "1g.10gb", "n/0", 0, ReplicaState.READY, 1.0),))
    doc = build_status(cluster, frontdoor="http://127.0.0.1:1", metrics_api=None, prometheus=None,
                       endpoints={"m00-0": ReplicaEndpoint(1234, 99)})
    doc["config"] = {"generation": 1, "models": ["m00", "m07", "m08"]}
    text = render_table(doc)
    assert "no replica: m07, m08 (the fleet has no room" in text
    doc["config"]["models"] = ["m00"]
    assert "no replica" not in render_table(doc)


def test_error_lines_pick_the_error_not_the_banner():
    log = [
        "I1201 server.cc:305] Waiting for in-flight requests to complete.",
        "+--------+---------+",
        "| broken | 1 | UNAVAILABLE: Internal: RuntimeError: boom |",
        "error: creating server: load failed for model 'broken': RuntimeError: boom",
        "",
    ]
    assert error_lines(log) == ["error: creating server: load failed for model 'broken': RuntimeError: boom"]
    tb = ["Traceback (most recent call last):", '  File "w.py", line 3', "ModuleNotFoundError: No module named 'torch'"]
    assert error_lines(tb)[-1] == "ModuleNotFoundError: No module named 'torch'"
    assert error_lines(["all good", "still good"]) == ["all good", "still good"]


def test_rotate_log_copies_and_truncates_past_the_cap(tmp_path):
    p = tmp_path / "x.log"
    with open(p, "ab") as writer:  # a child's O_APPEND descriptor stays valid across the cut
        writer.write(b"a" * 2000)
        writer.flush()
        assert rotate_log(p, max_bytes=1000)
        writer.write(b"b" * 10)
        writer.flush()
    assert (tmp_path / "x.log.1").stat().st_size == 2000
    assert p.read_bytes() == b"b" * 10
    assert not rotate_log(p, max_bytes=1000)


def test_port_in_use_names_its_holder():
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        h = port_holder(port)
        assert h is not None and h.pid == os.getpid()
        with pytest.raises(PortInUse, match=rf"front door: port {port} is in use by pid {os.getpid()} \("):
            check_bindable(port, "front door")
    check_bindable(port, "front door")  # free again: no error


def test_a_holder_with_a_long_multiline_command_is_named_on_one_short_line():
    code = ("import socket, sys, time\n" + "# filler\n" * 40
            + "s = socket.socket(); s.bind(('127.0.0.1', 0)); s.listen()\n"
            + "print(s.getsockname()[1], flush=True); time.sleep(60)\n")
    p = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        port = int(p.stdout.readline())
        h = port_holder(port)
        assert h is not None and h.pid == p.pid
        assert "\n" not in h.cmdline and len(h.cmdline) <= 120 and h.cmdline.endswith("…")
    finally:
        p.kill()
        p.wait()


def test_run_dir_lock_admits_one_holder_and_names_it(tmp_path):
    a, b = RunDirLock(tmp_path), RunDirLock(tmp_path)
    assert a.acquire()
    assert not b.acquire()
    assert b.held_by_other() and b.holder() == os.getpid()
    # another process sees it held too, and cannot take it
    code = "import sys; from autoscaler.act.local.pids import RunDirLock as L; sys.exit(0 if L(sys.argv[1]).acquire() else 3)"
    r = subprocess.run([sys.executable, "-c", code, str(tmp_path)], check=False, timeout=60)
    assert r.returncode == 3
    a.release()
    assert not b.held_by_other() and b.holder() is None
    assert b.acquire()
    b.release()


def test_spawned_child_is_marked_grouped_and_its_group_swept(tmp_path):
    # the child forks a grandchild that would outlive it; both carry the run-dir mark
    code = "import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); time.sleep(60)"
    proc = spawn([sys.executable, "-c", code], log_path=tmp_path / "c.log", run_dir=tmp_path)
    try:
        deadline = time.monotonic() + 20
        while len(started_from(tmp_path, [])) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        found = started_from(tmp_path, [])
        assert proc.pid in found and len(found) == 2
        assert os.getpgid(proc.pid) == proc.pid  # its own group
        assert all(os.getpgid(p) == proc.pid for p in found)
        env = Path(f"/proc/{proc.pid}/environ").read_bytes().split(b"\0")
        assert f"{RUN_DIR_ENV}={tmp_path.resolve()}".encode() in env
    finally:
        stop_child(proc, 5)
    assert started_from(tmp_path, []) == {}  # the grandchild went with the group


def test_the_policy_does_not_count_a_crash_looping_replica_and_places_elsewhere():
    from autoscaler.mig.layout import Placement
    from autoscaler.policy.capacity import current_capacity
    from autoscaler.policy.planner import plan
    from autoscaler.policy.planner.work import HEALTHY
    from autoscaler.policy.types import ActionKind, ModelSpec

    assert ReplicaState.CRASHLOOP not in HEALTHY
    lay = (Placement(0, "3g.40gb"), Placement(4, "3g.40gb"))
    gpus = tuple(GpuState(f"n/{i}", "n", "A100-SXM4-80GB", layout=lay) for i in range(2))
    spec = ModelSpec("m", {"3g.40gb": 100.0}, ("3g.40gb",), min_replicas=1)
    looping = Replica("m-1", "m", "3g.40gb", "n/0", 0, ReplicaState.CRASHLOOP, 0.0)
    cluster = ClusterState(gpus, (looping,))
    assert current_capacity(spec, cluster)[:2] == (0, 0.0)
    p = plan([spec], {"m": 50.0}, cluster)
    creates = [a for a in p.actions if a.kind is ActionKind.CREATE]
    assert len(creates) == 1 and (creates[0].gpu, creates[0].start) != ("n/0", 0)  # elsewhere
    # make before break: the crash-looping one goes only after the replacement's WAIT_READY
    kinds = [(a.kind, a.replica) for a in p.actions]
    assert kinds.index((ActionKind.DELETE, "m-1")) > kinds.index((ActionKind.WAIT_READY, creates[0].replica))


def test_a_restarted_prometheus_holds_the_loop_for_a_whole_window(tmp_path):
    from autoscaler.act.local.prometheus import HoldWhileWarming, PrometheusServer, PrometheusWarming

    class Inner:
        last_notes = ("n",)

        def read(self, models, replicas, now):
            return {"m": None}, {}

    server = PrometheusServer(tmp_path, binary=sys.executable)
    src = HoldWhileWarming(Inner(), server)
    server.warm_s = 34.0
    assert src.read(["m"], [], 0.0) == ({"m": None}, {})  # first start: no hold
    server.started, server.restarted_at = True, time.time() - 10
    server.proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        assert server.mode == "prometheus-warming"
        # whole seconds of wall time: a slow machine may pass one between the two readings
        with pytest.raises(PrometheusWarming, match=r"it restarted 1[01]s ago; holding 2[34]s more"):
            src.read(["m"], [], 0.0)
        server.restarted_at = time.time() - 35
        assert server.mode == "prometheus" and src.read(["m"], [], 0.0) == ({"m": None}, {})
        assert src.last_notes == ("n",)
        # a full disk: Prometheus dropped its scrapes, so the same hold from the last failed write
        server.storage_failed(time.time() - 4)
        assert server.mode == "prometheus-warming"
        with pytest.raises(PrometheusWarming, match=r"its disk was full \(scrapes dropped\) [45]s ago; holding (30|29)s"):
            src.read(["m"], [], 0.0)
        server.lost_samples_at = time.time() - 35
        assert src.read(["m"], [], 0.0) == ({"m": None}, {})
    finally:
        server.proc.kill()
        server.proc.wait()
    assert server.mode == "prometheus-down"
