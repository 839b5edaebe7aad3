"""``migscale api``: refuses plain HTTP without --insecure-http; serves with it."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
from typer.testing import CliRunner

from autoscaler.cli import app

ROOT = Path(__file__).resolve().parents[2]
MODELS = str(ROOT / "examples" / "models.yaml")
CLUSTER = str(ROOT / "examples" / "cluster.yaml")
runner = CliRunner()


def test_refuses_without_tls():
    r = runner.invoke(app, ["api", MODELS, CLUSTER])
    assert r.exit_code == 2
    assert "migscale api: refusing to serve the metrics API without TLS" in r.output and "--insecure-http" in r.output


def test_missing_key_file_names_the_option(tmp_path):
    cert = tmp_path / "c.pem"
    cert.write_text("x")
    r = runner.invoke(app, ["api", MODELS, CLUSTER, "--tls-cert", str(cert), "--tls-key", str(tmp_path / "no.pem")])
    assert r.exit_code == 2
    assert "--tls-key: file not found" in r.output and "no.pem" in r.output
    r = runner.invoke(app, ["api", MODELS, CLUSTER, "--tls-cert", str(cert)])
    assert r.exit_code == 2 and "--tls-key" in r.output


def test_allowed_names_need_tls():
    r = runner.invoke(app, ["api", MODELS, CLUSTER, "--insecure-http", "--requestheader-allowed-names", "a"])
    assert r.exit_code == 2 and "--requestheader-allowed-names" in r.output


def test_prometheus_must_be_a_url():
    # a bare host:port would fail every query, each tick, with nothing said at start-up
    r = runner.invoke(app, ["api", MODELS, CLUSTER, "--insecure-http", "--prometheus", "prometheus:9090"])
    assert r.exit_code == 2 and "--prometheus: an http:// or https:// URL with a host, got 'prometheus:9090'" in r.output


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_insecure_http_serves_config_state():
    port = _free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "autoscaler", "api", MODELS, CLUSTER, "--insecure-http", "--port", str(port)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=ROOT, start_new_session=True,
    )
    try:
        base = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 60
        while True:
            try:
                r = httpx.get(base + "/readyz", timeout=2)
                break
            except httpx.TransportError:
                assert proc.poll() is None, proc.communicate()[1].decode()
                assert time.monotonic() < deadline, "server did not start"
                time.sleep(0.2)
        assert r.status_code == 200
        plan = httpx.get(base + "/v1/plan", timeout=5).json()
        assert plan["plan"] is None and plan["cluster"]["gpus"]  # GPUs from cluster.yaml, no plan yet
        # without a plan the steering metric is absent, never 0
        ratio = httpx.get(base + "/apis/custom.metrics.k8s.io/v1beta2/namespaces/default/pods/*/"
                          "migscale_replica_ratio", timeout=5).json()
        assert ratio["items"] == []
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(5)
    assert proc.returncode is not None


def test_tls_with_client_ca_from_the_command_line(tmp_path):
    import ssl

    import trustme

    ca = trustme.CA()
    server = ca.issue_cert("127.0.0.1")
    server.private_key_pem.write_to_path(str(tmp_path / "k.pem"))
    server.cert_chain_pems[0].write_to_path(str(tmp_path / "c.pem"))
    ca.cert_pem.write_to_path(str(tmp_path / "ca.pem"))
    client = ca.issue_cert("front-proxy-client", common_name="front-proxy-client")
    port = _free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "autoscaler", "api", MODELS, CLUSTER, "--port", str(port),
         "--tls-cert", str(tmp_path / "c.pem"), "--tls-key", str(tmp_path / "k.pem"),
         "--client-ca", str(tmp_path / "ca.pem"), "--requestheader-allowed-names", "front-proxy-client"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=ROOT, start_new_session=True,
    )
    try:
        ctx = ssl.create_default_context()
        ca.configure_trust(ctx)
        client.configure_cert(ctx)
        deadline = time.monotonic() + 60
        while True:
            try:
                with httpx.Client(verify=ctx, timeout=2) as c:
                    r = c.get(f"https://127.0.0.1:{port}/apis/custom.metrics.k8s.io/v1beta2")
                break
            except httpx.TransportError:
                assert proc.poll() is None, proc.communicate()[1].decode()
                assert time.monotonic() < deadline, "server did not start"
                time.sleep(0.2)
        assert r.status_code == 200 and r.json()["kind"] == "APIResourceList"
        bare = ssl.create_default_context()
        ca.configure_trust(bare)
        with httpx.Client(verify=bare, timeout=2) as c:
            assert c.get(f"https://127.0.0.1:{port}/apis").status_code == 401
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(5)


def test_a_certificate_that_does_not_load_exits_2_naming_it(tmp_path):
    junk = tmp_path / "c.pem"
    junk.write_text("x")
    r = runner.invoke(app, ["api", MODELS, CLUSTER, "--tls-cert", str(junk), "--tls-key", str(junk)])
    assert r.exit_code == 2 and "--tls-cert/--tls-key: not a PEM certificate" in r.output
    assert "Traceback" not in r.output
