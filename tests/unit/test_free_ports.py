"""Choosing ports for a replica: distinct, never an excluded one, and a clash recognized."""

from __future__ import annotations

import socket
import types

from autoscaler.act.local.triton import TritonPorts, free_ports, port_clash


def test_free_ports_are_distinct_bindable_and_skip_the_excluded():
    first = free_ports(8)
    assert len(set(first)) == 8
    again = free_ports(8, exclude=set(first))
    assert len(set(again)) == 8 and not set(again) & set(first)
    for port in again:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind(("127.0.0.1", port))  # free when returned


def test_triton_ports_are_three_distinct_ones_outside_the_exclusion():
    old = TritonPorts.free()
    new = TritonPorts.free(exclude=set(old))
    assert len(set(new)) == 3 and not set(new) & set(old)


def test_port_clash_reads_triton_gloo_and_python_wordings_and_nothing_else():
    triton = "E1205 main.cc:245] \"failed to start GRPC service: Unavailable - Socket '127.0.0.1:56007' already in use \""
    assert port_clash([triton])
    assert port_clash(["RuntimeError: The server socket has failed to bind. (errno: 98 - Address already in use)."])
    assert port_clash(["OSError: [Errno 98] Address already in use"])
    assert not port_clash([])
    assert not port_clash(["E1205 server.cc:241] \"CudaDriverHelper has not been initialized.\"",
                           "ModuleNotFoundError: No module named 'torch'"])


class _ReusingKernel:
    """``socket.socket`` for ``bind(("127.0.0.1", 0))``: each bind gets the lowest port no
    open socket holds, so a port closed a moment ago is handed out again at once."""

    def __init__(self, first: int = 40000) -> None:
        self.first, self.held = first, set()

    def __call__(self, *_args) -> _FakeSocket:
        return _FakeSocket(self)


class _FakeSocket:
    def __init__(self, kernel: _ReusingKernel) -> None:
        self.kernel, self.port = kernel, None

    def bind(self, addr) -> None:
        assert addr[1] == 0, addr
        k = self.kernel
        self.port = next(p for p in range(k.first, k.first + 100) if p not in k.held)
        k.held.add(self.port)

    def getsockname(self):
        return ("127.0.0.1", self.port)

    def close(self) -> None:
        self.kernel.held.discard(self.port)


def test_a_local_cluster_gives_its_front_door_api_and_prometheus_distinct_ports(tmp_path, monkeypatch):
    from autoscaler.act.local import triton
    from autoscaler.act.local.cluster import LocalCluster

    kernel = _ReusingKernel()
    # only the port chooser's sockets are fake: other threads in this process keep the real module
    monkeypatch.setattr(triton, "socket", types.SimpleNamespace(socket=kernel, AF_INET=socket.AF_INET,
                                                                SOCK_STREAM=socket.SOCK_STREAM))
    assert triton.free_port() == triton.free_port() == kernel.first  # the habit that bit

    c = LocalCluster(tmp_path / "run", {}, [], prometheus="off")
    assert len({c.api_port, c.door.port, c.prom.port}) == 3, (c.api_port, c.door.port, c.prom.port)
    # ports the caller gives are kept, and none of ours is one of them
    c = LocalCluster(tmp_path / "run2", {}, [], prometheus="off", frontdoor_port=kernel.first, api_port=kernel.first + 1)
    assert (c.door.port, c.api_port) == (kernel.first, kernel.first + 1)
    assert c.prom.port not in (kernel.first, kernel.first + 1)
