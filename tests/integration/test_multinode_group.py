"""A local multinode group: correct results vs the single-process reference, and group recreation."""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as httpclient

from autoscaler.act.local.multinode import ProcessGroup

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2] / "triton_models"
sys.path.insert(0, str(REPO / "llm"))
from tp_mlp import reference


def _infer(url: str, x: np.ndarray) -> np.ndarray:
    c = httpclient.InferenceServerClient(url)
    inp = httpclient.InferInput("X", list(x.shape), "FP32")
    inp.set_data_from_numpy(x)
    return c.infer("llm", [inp]).as_numpy("Y")


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


@pytest.fixture
def group(tmp_path):
    g = ProcessGroup(REPO, "llm", 2, tmp_path / "group")
    g.start()
    try:
        yield g
    finally:
        started = g.pids()
        g.stop()
        assert not [p for p in started if _pid_alive(p)]


def test_group_of_two_matches_single_process(group):
    group.wait_ready(120)
    members = group.members()
    assert [m["rank"] for m in members] == [0, 1]
    assert all(m["state"] == "ready" for m in members)
    x = np.random.default_rng(7).standard_normal((3, 256)).astype(np.float32)
    np.testing.assert_allclose(_infer(group.url_http, x), reference(x), rtol=1e-4, atol=1e-4)


def test_killing_a_worker_recreates_the_whole_group(group):
    group.wait_ready(120)
    old_leader, old_worker = group.pids()
    os.kill(old_worker, signal.SIGKILL)
    deadline = time.time() + 10
    while not group.failed() and time.time() < deadline:
        time.sleep(0.1)
    assert group.failed(), "losing a worker must mark the group failed"
    group.recreate()
    group.wait_ready(120)  # as the first start: a fresh group of processes on a machine shared with other tests
    new_pids = group.pids()
    # RecreateGroupOnPodRestart: every member is new, the old leader is gone too.
    assert old_leader not in new_pids and old_worker not in new_pids
    assert not _pid_alive(old_leader)
    x = np.ones((1, 256), np.float32)
    try:
        y = _infer(group.url_http, x)
    except Exception as exc:  # what the new generation said: a failure here must be diagnosable from CI output
        raise AssertionError(f"{exc!r}; exited: {group.exited()}; logs:\n{group.tail_logs(30)}") from exc
    np.testing.assert_allclose(y, reference(x), rtol=1e-4, atol=1e-4)
