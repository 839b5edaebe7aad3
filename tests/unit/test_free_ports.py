"""Choosing ports for a replica: distinct, never an excluded one, and a clash recognized."""

from __future__ import annotations

import socket

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
