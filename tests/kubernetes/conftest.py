"""Fixtures for the Kubernetes tests: the emulated API server alone, or a whole emulated cluster."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from crdschema import own_admission, validate_crd_object
from emulated import EmulatedCluster
from fakeapi import FakeKube

from autoscaler.act.kubernetes.client import KubeRest


@pytest.fixture
def fake() -> Iterator[FakeKube]:
    """The API server alone (no controllers): objects change only when a test writes them."""
    server = FakeKube(version="1.30", crd_validator=validate_crd_object, crds=own_admission(), bookmark_s=0.1)
    url = server.serve()
    server.url = url  # type: ignore[attr-defined]
    try:
        yield server
    finally:
        server.close()


@pytest.fixture
def cluster() -> Iterator[EmulatedCluster]:
    """API server plus Deployment/ReplicaSet/disruption controllers, scheduler, kubelet, mig-manager."""
    c = EmulatedCluster(ready_delay_s=0.3, stop_s=0.2, mig_delay_s=0.5, bookmark_s=0.1).start()
    try:
        yield c
    finally:
        c.stop()


@pytest.fixture
def connect(request: pytest.FixtureRequest) -> Iterator:
    """KubeRest clients to whichever server the test uses (``cluster`` if requested, else ``fake``)."""
    clients: list[KubeRest] = []
    url = (request.getfixturevalue("cluster").url if "cluster" in request.fixturenames
           else request.getfixturevalue("fake").url)

    def make(user_agent: str = "migscale-test") -> KubeRest:
        rest = KubeRest.connect(url, user_agent=user_agent)
        clients.append(rest)
        return rest

    try:
        yield make
    finally:
        for c in clients:
            c.close()


@pytest.fixture
def backends(connect) -> Iterator:
    """KubernetesBackends on the test's server, closed (informers stopped) at the end."""
    from k8s_helpers import CFG, LLM, RESNET

    from autoscaler.act.kubernetes.backend import KubernetesBackend

    made: list[KubernetesBackend] = []

    def make(models=(RESNET, LLM), cfg=CFG, user_agent: str = "migscale/test", **kw) -> KubernetesBackend:
        kw.setdefault("identity", user_agent.rpartition("/")[2])
        # These tests assert what one pass writes; on a busy machine the emulated API
        # server is slow enough to trip the wall-clock write budget. The budget has
        # its own tests (test_k8s_rollout.py), on a clock that ticks per write.
        kw.setdefault("pass_budget_s", None)
        be = KubernetesBackend(connect(user_agent), list(models), cfg, watch_timeout_s=5, **kw)
        made.append(be)
        return be

    try:
        yield make
    finally:
        for be in made:
            be.close()
