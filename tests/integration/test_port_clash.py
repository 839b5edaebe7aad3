"""A start that loses a port it was given to another process first is retried on fresh ports.

Ports are chosen free and bound seconds later (tritonserver binds after its models
load; a group's ranks open sockets meanwhile). These tests take one of the chosen
ports before the server binds it, with a real listening socket, and check that the
replica still comes up -- and that ports a caller gave are never silently replaced.
"""

from __future__ import annotations

import socket
import sys
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as httpclient

from autoscaler.act.local import multinode
from autoscaler.act.local.emulation import emulation_env
from autoscaler.act.local.multinode import ProcessGroup
from autoscaler.act.local.triton import TritonError, TritonPorts, TritonProcess, free_ports

pytestmark = pytest.mark.integration

MODELS = Path(__file__).resolve().parents[2] / "triton_models"
sys.path.insert(0, str(MODELS / "llm"))
from tp_mlp import reference


@pytest.fixture
def taken_port():
    """A port something else is listening on for the whole test."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        yield s.getsockname()[1]


def _resnet(tmp_path: Path, ports: TritonPorts | None = None) -> TritonProcess:
    env = emulation_env("A100-SXM4-80GB", "1g.10gb", "g0", 0, "resnet")
    return TritonProcess(MODELS, ["resnet"], tmp_path / "work", ports=ports, env=env, run_dir=tmp_path / "run")


def test_a_server_that_loses_a_port_it_chose_starts_again_on_fresh_ones(tmp_path, taken_port):
    t = _resnet(tmp_path)
    http, metrics = free_ports(2, exclude={taken_port})
    t.ports = TritonPorts(http, taken_port, metrics)  # as if another process took its gRPC port first
    first_pid = None
    try:
        t.start()
        first_pid = t.pid
        t.wait_ready(120)
        assert t.pid != first_pid
        assert taken_port not in set(t.ports)
        assert "already in use" in t.log_path.read_text()  # the first start did clash
        assert httpclient.InferenceServerClient(t.url_http).is_model_ready("resnet")
    finally:
        t.stop()


def test_a_server_on_ports_its_caller_gave_reports_the_clash(tmp_path, taken_port):
    http, metrics = free_ports(2, exclude={taken_port})
    ports = TritonPorts(http, taken_port, metrics)
    t = _resnet(tmp_path, ports)
    try:
        t.start()
        with pytest.raises(TritonError, match="already in use"):
            t.wait_ready(120)
        assert t.ports == ports  # published by the caller: never replaced behind its back
    finally:
        t.stop()


def test_a_group_that_loses_a_port_it_chose_is_recreated_on_fresh_ones(tmp_path, taken_port, monkeypatch):
    real = multinode.free_ports
    calls = []

    def first_choice_clashes(n, exclude=()):
        ports = real(n, exclude=set(exclude) | {taken_port})
        calls.append(n)
        if len(calls) == 1:
            ports[1] = taken_port  # the leader's gRPC port, taken before Triton binds it
        return ports

    monkeypatch.setattr(multinode, "free_ports", first_choice_clashes)
    g = ProcessGroup(MODELS, "llm", 2, tmp_path / "group")
    try:
        g.start()
        assert g.ports.grpc == taken_port
        g.wait_ready(180)
        assert g.generation == 2 and len(calls) == 2
        assert taken_port not in set(g.ports) and g.rendezvous_port not in set(g.ports)
        x = np.ones((1, 256), np.float32)
        c = httpclient.InferenceServerClient(g.url_http)
        inp = httpclient.InferInput("X", list(x.shape), "FP32")
        inp.set_data_from_numpy(x)
        np.testing.assert_allclose(c.infer("llm", [inp]).as_numpy("Y"), reference(x), rtol=1e-4, atol=1e-4)
    finally:
        g.stop()
