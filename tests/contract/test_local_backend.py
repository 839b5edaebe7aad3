"""The local backend's side of the contract that the shared suite cannot reach.

- A WAIT_READY on a process that never becomes ready times out
  (``wait_ready_timeout_s``) and drops the rest of its chain: the suite's
  fault is a start that fails, this is one that hangs.
- ONE real ``tritonserver`` case: the same make-before-break swap as the suite,
  on real processes, and ``apply`` returns while the new replica is still
  starting (a Triton start takes ~1.5 s; the wait is the backend's, not the tick's).
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
from fakeproc import FakeLauncher

from autoscaler.act.local.cluster import LocalCluster
from autoscaler.act.local.replicas import ModelRuntime
from autoscaler.mig import Placement
from autoscaler.policy.types import Action, ActionKind, GpuState, Reason, ReplicaState

REPO = Path(__file__).resolve().parents[2] / "triton_models"
R = Reason.PROFILE_EFFICIENCY
P1 = "1g.10gb"
GPU = GpuState("g0", "node", "A100-SXM4-80GB", layout=(Placement(0, P1), Placement(1, P1)))


def _swap(old: str, new: str) -> list[Action]:
    return [
        Action(ActionKind.CREATE, R, gpu="g0", model="resnet", profile=P1, start=1, replica=new),
        Action(ActionKind.WAIT_READY, R, gpu="g0", model="resnet", profile=P1, start=1, replica=new),
        Action(ActionKind.DRAIN, R, gpu="g0", model="resnet", replica=old),
        Action(ActionKind.DELETE, R, gpu="g0", model="resnet", replica=old),
    ]


def _first(rid: str) -> list[Action]:
    return [Action(ActionKind.CREATE, R, gpu="g0", model="resnet", profile=P1, start=0, replica=rid),
            Action(ActionKind.WAIT_READY, R, gpu="g0", model="resnet", profile=P1, start=0, replica=rid)]


def test_wait_ready_times_out_on_a_hanging_start_and_drops_the_rest(tmp_path):
    launcher = FakeLauncher()
    c = LocalCluster(tmp_path, {"resnet": ModelRuntime("resnet", REPO, "resnet")}, [GPU], launcher=launcher,
                     prometheus="off", wait_ready_timeout_s=0.3, drain_timeout_s=0.1, term_timeout_s=0.1)
    c.supervisor.start()
    try:
        assert c.apply_and_wait(_first("old"), 10) == []
        launcher.hanging.add("new")
        assert c.apply(_swap("old", "new")) == []
        errors = c.wait_settled(timeout_s=0.2)  # "new" stays STARTING: not settled
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and not any("not ready after" in e for e in errors):
            time.sleep(0.05)
            errors += c.take_errors()
        assert any("wait_ready new: not ready after" in e for e in errors), errors
        assert sum("skipped" in e for e in errors) == 2  # the DRAIN and the DELETE of "old"
        assert c.replica("old").state is ReplicaState.READY  # never break before make
        assert not c.queue
    finally:
        c.stop()


@pytest.mark.integration
def test_a_real_tritonserver_swap_is_make_before_break_and_apply_never_blocks(tmp_path):
    c = LocalCluster(tmp_path, {"resnet": ModelRuntime("resnet", REPO, "resnet")}, [GPU], prometheus="off",
                     drain_timeout_s=2.0)
    c.supervisor.start()  # real processes and readiness probes; routing is not under test here
    try:
        assert c.apply_and_wait(_first("old"), 60) == []
        old_pid = c.replica("old").process.pid
        assert c.apply(_swap("old", "new")) == []
        new = c.replica("new")
        assert new is not None and new.state is ReplicaState.STARTING, "apply waited for the start"
        assert c.replica("old").state is ReplicaState.READY
        assert "resnet" in c.in_flight()[1]  # the queued DRAIN/DELETE of "old"
        assert c.wait_settled(60) == []
        assert c.replica("new").state is ReplicaState.READY and c.replica("old") is None
        with pytest.raises(ProcessLookupError):
            os.kill(old_pid, 0)
    finally:
        c.stop()
