"""Fixtures for the Kubernetes backend tests: a fake API server on a free loopback port."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from crdschema import validate_crd_object
from fakeapi import FakeKube

from autoscaler.act.kubernetes.client import KubeRest


@pytest.fixture
def fake() -> Iterator[FakeKube]:
    server = FakeKube(version="1.30", crd_validator=validate_crd_object)
    url = server.serve()
    server.url = url  # type: ignore[attr-defined]
    try:
        yield server
    finally:
        server.close()


@pytest.fixture
def connect(fake: FakeKube) -> Iterator:
    clients: list[KubeRest] = []

    def make(user_agent: str = "migscale-test") -> KubeRest:
        rest = KubeRest.connect(fake.url, user_agent=user_agent)  # type: ignore[attr-defined]
        clients.append(rest)
        return rest

    try:
        yield make
    finally:
        for c in clients:
            c.close()
