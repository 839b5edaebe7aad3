"""The Kubernetes controller end to end against the fake API server: tick, leadership, CLI, TLS rule."""

from __future__ import annotations

import gc
import http.server
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.parse
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from k8s_helpers import gpu_node, wait_until
from typer.testing import CliRunner

from autoscaler.act.kubernetes.config import build_backend
from autoscaler.cli import app
from autoscaler.clock import VirtualClock
from autoscaler.config import load_cluster, load_models, model_specs
from autoscaler.fakes import FakeMetricsSource
from autoscaler.observe.queries import Queries
from autoscaler.policy.types import ActionKind
from autoscaler.runtime.gcpacing import INCREMENTAL, IdleCollector
from autoscaler.runtime.kubernetes import KubernetesController

T0 = 1_800_000_000.0
LEASE_NS = "migscale-system"
DEPLOY = "resnet-1g-10gb"

MODELS = """
models:
  - name: resnet
    model_dir: models/resnet
    slo: {p99_ms: 150}
    profiles: [1g.10gb]
    min_replicas: 1
    max_replicas: 8
    capacity: {1g.10gb: 58}
"""
CLUSTER = """
namespace: default
gpus:
  - {node: node-a, product: A100-SXM4-80GB, count: 1, emulated: false}
policy: {tick_s: 5}
"""


@pytest.fixture
def configs(tmp_path: Path) -> tuple[Path, Path]:
    (tmp_path / "models.yaml").write_text(MODELS)
    (tmp_path / "cluster.yaml").write_text(CLUSTER)
    return tmp_path / "models.yaml", tmp_path / "cluster.yaml"


@pytest.fixture
def make_controller(fake, configs, tmp_path) -> Iterator:
    """Controllers sharing one fake cluster (seven 1g slices on node-a) and one virtual clock."""
    fake.put_object(gpu_node("node-a", {"1g.10gb": 7}, config="all-1g.10gb"))
    models_cfg, cluster_cfg = load_models(configs[0]), load_cluster(configs[1])
    made: list[KubernetesController] = []

    def make(identity: str, clock: VirtualClock, rps: float | None = 150.0) -> KubernetesController:
        be = build_backend(
            model_specs(models_cfg, cluster_cfg),
            cluster_cfg,
            host=fake.url,
            identity=identity,
            lease_namespace=LEASE_NS,
            clock=clock,
        )
        src = FakeMetricsSource()
        src.set_rate("resnet", rps)
        ctl = KubernetesController(
            be, src, models_cfg, cluster_cfg, clock=clock, decision_log=tmp_path / f"{identity}.jsonl"
        )
        made.append(ctl)
        return ctl

    try:
        yield make
    finally:
        for c in made:
            c.close()


def writes_by(fake, identity: str) -> list:
    return [r for r in fake.writes(f"migscale/{identity}") if "/leases" not in r.path]


def creates(result, profile: str = "1g.10gb") -> int:
    return sum(1 for a in result.actions if a.kind is ActionKind.CREATE and a.profile == profile)


def test_one_tick_with_demand_creates_deployment_and_budget_and_reports_conditions(fake, make_controller, tmp_path):
    ctl = make_controller("a", VirtualClock(T0))
    ctl.check_lease()
    result = ctl.tick()
    assert result.ok, result.errors
    n = creates(result)
    assert n >= 1  # 150 req/s with no replica: scale up
    dep = fake.get("Deployment", DEPLOY)
    assert dep["spec"]["replicas"] == n  # what the plan asked for is what the cluster holds
    limits = dep["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"]
    assert limits == {"nvidia.com/mig-1g.10gb": 1}
    pdb = fake.get("PodDisruptionBudget", DEPLOY)
    assert pdb["metadata"]["ownerReferences"][0]["uid"] == dep["metadata"]["uid"]
    assert fake.list("HorizontalPodAutoscaler") == []  # migscale owns the replicas
    assert fake.get("Service", "resnet") is not None
    assert fake.get("Lease", "migscale-controller", LEASE_NS)["spec"]["holderIdentity"] == "a"
    # the tick is published to the metrics API and logged (it acted)
    assert ctl.api_state.ready
    status = json.loads(ctl.api_state.snapshot.status_body)
    assert status["leader"] is True and status["last_tick"]["acted"] is True
    assert any(c.startswith(f"SuccessfulRescale Deployment/{DEPLOY}") for c in status["apply_calls"])
    cond = status["conditions"]["resnet"]  # no pod is Ready yet (no kubelet here): short of the target, and why
    assert cond["type"] == "AtTarget" and cond["status"] == "False" and cond["reason"] == "WaitingForPods"
    assert cond["desired"] == n and cond["ready"] == 0
    log = [json.loads(line) for line in (tmp_path / "a.jsonl").read_text().splitlines()]
    assert len(log) == 1 and sum(a["kind"] == "create" for a in log[0]["actions"]) == n


def test_two_controllers_only_the_leader_writes(fake, make_controller, tmp_path):
    clock = VirtualClock(T0)
    a, b = make_controller("a", clock), make_controller("b", clock)
    assert a.check_lease().leader  # a holds the lease first
    b.check_lease()
    rb = b.tick()  # b follows: observes and decides, its actuator is a shadow
    ra = a.tick()
    assert a.role.leader and not b.role.leader and b.role.holder == "a"
    assert writes_by(fake, "a") and writes_by(fake, "b") == []
    assert fake.get("Deployment", DEPLOY)["spec"]["replicas"] == creates(ra)
    # the follower reached the same decision from its own observation but wrote nothing
    assert rb.ok and len(b.gate.shadow_calls) == 1
    assert sum(x.kind is ActionKind.CREATE for x in b.gate.shadow_calls[0]) == creates(ra)
    assert not (tmp_path / "b.jsonl").exists()  # ... and logged nothing it did not do
    assert b.api_state.ready  # ... and still serves the metrics API, saying who leads
    st = json.loads(b.api_state.snapshot.status_body)
    assert st["leader"] is False and st["holder"] == "a" and st["last_tick"]["acted"] is False

    # a shuts down (SIGTERM -> close): the lease is released, b takes over at its next attempt
    a.close()
    clock.advance(5)
    b.source.set_rate("resnet", 400.0)  # and demand rose
    before = fake.get("Deployment", DEPLOY)["spec"]["replicas"]
    assert b.check_lease().leader and "took over" in b.role.reason
    rb2 = b.tick()
    assert rb2.ok and creates(rb2) >= 1, (rb2.errors, rb2.reasons)
    assert writes_by(fake, "b")
    assert fake.get("Deployment", DEPLOY)["spec"]["replicas"] == before + creates(rb2)


def test_the_shadow_and_apply_logs_are_bounded(fake, make_controller):
    ctl = make_controller("a", VirtualClock(T0))
    for i in range(150):
        ctl.gate.apply(())
    assert len(ctl.gate.shadow_calls) == ctl.gate.shadow_calls.maxlen == 100
    assert ctl.backend.apply_calls.maxlen == 500


def test_follower_and_leader_serve_the_metrics_api(fake, make_controller):
    clock = VirtualClock(T0)
    a, b = make_controller("a", clock), make_controller("b", clock)
    handles = [c.start_api("127.0.0.1", 0) for c in (a, b)]
    with httpx.Client(timeout=10) as http:
        assert all(http.get(f"{h.url}/readyz").status_code == 503 for h in handles)  # no tick yet
        assert a.check_lease().leader
        b.check_lease()
        b.tick()
        a.tick()
        for h, leader in zip(handles, (True, False)):
            assert http.get(f"{h.url}/readyz").status_code == 200
            assert http.get(f"{h.url}/v1/status").json()["leader"] is leader
            assert http.get(f"{h.url}/v1/plan").json()["plan"] is not None


def test_blind_tick_holds_and_writes_nothing_but_the_lease(fake, make_controller):
    ctl = make_controller("a", VirtualClock(T0), rps=None)
    ctl.source.outage = True  # Prometheus down
    ctl.check_lease()
    result = ctl.tick()
    assert not result.source_ok
    assert not any(x.kind is ActionKind.DELETE for x in result.actions)
    assert fake.get("Lease", "migscale-controller", LEASE_NS)["spec"]["holderIdentity"] == "a"


def test_the_model_set_can_change_while_running(fake, make_controller):
    from autoscaler.policy.types import RepartitionScope
    from autoscaler.runtime.kubernetes import ModelSet

    class Source:
        def __init__(self, models: ModelSet) -> None:
            self.models = models

        def current(self) -> ModelSet:
            return self.models

    ctl = make_controller("a", VirtualClock(T0))
    source = Source(ctl.model_source.current())
    ctl.model_source = source
    ctl.check_lease()
    ctl.tick()
    assert fake.get("Deployment", DEPLOY)["spec"]["replicas"] >= 1
    source.models = ModelSet((), {})  # the model is withdrawn (as a deleted MigModel will be)
    ctl.clock.advance(5)
    ctl.check_lease()
    ctl.tick()
    assert ctl.loop.config.models == () and ctl.backend.models == {}
    assert fake.get("Deployment", DEPLOY)["spec"]["replicas"] == 0  # retired: to 0 first, deleted once empty
    # mig-manager drains the node for any cut: the policy knows, also after the model set changed
    assert ctl.loop.config.repartition_scope is RepartitionScope.NODE


# ---------------------------------------------------------------- CLI


class FakePrometheus:
    """/api/v1/query on 127.0.0.1: a request rate for resnet, nothing for any other query."""

    def __init__(self, rps: float, window_s: float = 60.0) -> None:
        rate_q = Queries(replica_label="pod").render("request_rate", window_s)
        self.queries: list[str] = []
        owner = self

        class H(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                u = urllib.parse.urlparse(self.path)
                q = urllib.parse.parse_qs(u.query).get("query", [""])[0]
                owner.queries.append(q)
                result = (
                    [{"metric": {"model": "resnet"}, "value": [time.time(), str(rps)]}] if q == rate_q else []
                )
                body = json.dumps({"status": "success", "data": {"resultType": "vector", "result": result}})
                self.send_response(200 if u.path == "/api/v1/query" else 404)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body.encode())

            def log_message(self, *a: object) -> None:
                pass

        self.srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.url = f"http://127.0.0.1:{self.srv.server_address[1]}"
        threading.Thread(target=self.srv.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()

    def close(self) -> None:
        self.srv.shutdown()
        self.srv.server_close()


@pytest.fixture
def prometheus() -> Iterator[FakePrometheus]:
    p = FakePrometheus(150.0)
    try:
        yield p
    finally:
        p.close()


def test_cli_once_ticks_against_the_cluster_and_exits_0(fake, configs, prometheus):
    fake.put_object(gpu_node("node-a", {"1g.10gb": 7}, config="all-1g.10gb"))
    out = CliRunner().invoke(
        app,
        [
            "controller",
            str(configs[0]),
            str(configs[1]),
            "--once",
            "--kube-host",
            fake.url,
            "--prometheus",
            prometheus.url,
            "--identity",
            "cli-1",
            "--lease-namespace",
            LEASE_NS,
        ],
    )
    assert out.exit_code == 0, out.output
    report = json.loads(out.stdout)
    assert report["leader"] is True and report["last_tick"]["ok"] is True
    # its log is on stderr, INFO lines included, each timestamped
    assert " INFO migscale.controller: serving 1 model: resnet" in out.stderr, out.stderr
    n = sum(a["kind"] == "create" for a in report["last_tick"]["actions"])
    assert n >= 1 and fake.get("Deployment", DEPLOY)["spec"]["replicas"] == n
    assert prometheus.queries  # it really observed through Prometheus
    # the lease is given back on exit, so a real controller need not wait 15 s
    assert "holderIdentity" not in fake.get("Lease", "migscale-controller", LEASE_NS)["spec"]


def test_cli_refuses_plain_http_without_insecure_flag(configs):
    out = CliRunner().invoke(
        app, ["controller", str(configs[0]), str(configs[1]), "--kube-host", "http://127.0.0.1:9"]
    )
    assert out.exit_code == 2
    assert "refusing to serve the metrics API without TLS" in out.output and "--insecure-http" in out.output
    assert "Traceback" not in out.output


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--backend", "local"], "--backend: must be kubernetes"),
        (
            ["--tls-cert", "/nonexistent/tls.crt", "--tls-key", "/nonexistent/tls.key"],
            "--tls-cert: file not found",
        ),
        (["--tls-cert", "/nonexistent/tls.crt"], "--tls-key: required"),
        (
            ["--insecure-http", "--requestheader-allowed-names", "front-proxy-client"],
            "--requestheader-allowed-names: needs --client-ca",
        ),
        (["--fast-scrape-proxy", "10.0.0.1:3128"],
         "--fast-scrape-proxy: an http:// or https:// URL with a host, got '10.0.0.1:3128'"),
        (["--prometheus", "prometheus-k8s:9090"], "--prometheus: an http:// or https:// URL with a host, got "),
        (["--prometheus", "http://"], "--prometheus: an http:// or https:// URL with a host, got 'http://'"),
        (["--kube-host", "https://api:port"], "--kube-host: an http:// or https:// URL with a host, got "),
    ],
)
def test_cli_bad_options_exit_2_naming_the_option(configs, args, message):
    out = CliRunner().invoke(app, ["controller", str(configs[0]), str(configs[1]), *args])
    assert out.exit_code == 2 and message in out.output, out.output


def test_cli_bad_config_exits_2(configs):
    configs[1].write_text(CLUSTER.replace("tick_s: 5", "tick_s: -1"))
    out = CliRunner().invoke(
        app, ["controller", str(configs[0]), str(configs[1]), "--once", "--kube-host", "http://127.0.0.1:9"]
    )
    assert out.exit_code == 2 and "tick_s" in out.output and "Traceback" not in out.output


def _controller_process(fake, configs, prometheus, *serving: str, port: int = 0, env: dict[str, str] | None = None):
    """A real controller process that has taken the lease and acted (a Deployment exists)."""
    fake.put_object(gpu_node("node-a", {"1g.10gb": 7}, config="all-1g.10gb"))
    cmd = [
        sys.executable,
        "-m",
        "autoscaler",
        "controller",
        str(configs[0]),
        str(configs[1]),
        "--kube-host",
        fake.url,
        "--prometheus",
        prometheus.url,
        "--identity",
        "pod-1",
        "--lease-namespace",
        LEASE_NS,
        *serving,
        "--port",
        str(port),
    ]
    proc = subprocess.Popen(
        cmd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})},
    )
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and proc.poll() is None:
        lease = fake.get("Lease", "migscale-controller", LEASE_NS)
        if lease and lease["spec"].get("holderIdentity") == "pod-1" and fake.get("Deployment", DEPLOY):
            break
        time.sleep(0.1)
    return proc


def _stop(proc: subprocess.Popen) -> str:
    """SIGTERM, then its stderr; the process must exit 0."""
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    return err


def test_sigterm_stops_the_controller_and_releases_the_lease(fake, configs, prometheus, tmp_path):
    """A real process: serve over plain HTTP, hold the lease, SIGTERM -> exit 0 with the lease given back."""
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    proc = _controller_process(fake, configs, prometheus, "--insecure-http", env={"TMPDIR": str(tmp)})
    try:
        assert proc.poll() is None, proc.communicate()
        assert list(tmp.iterdir()) == []  # no CA to keep: no directory for one, even if it is killed
        assert fake.get("Deployment", DEPLOY) is not None  # it acted
        assert "lease released" in _stop(proc)
        assert "holderIdentity" not in fake.get("Lease", "migscale-controller", LEASE_NS)["spec"]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def _front_proxy_ca(fake, tmp_path, data: dict[str, str] | None = None):
    """A CA published as the API server does (kube-system/extension-apiserver-authentication),
    and a serving certificate from it in tmp_path (tls.crt, tls.key)."""
    import trustme

    ca = trustme.CA()
    server = ca.issue_cert("127.0.0.1")
    server.private_key_pem.write_to_path(str(tmp_path / "tls.key"))
    server.cert_chain_pems[0].write_to_path(str(tmp_path / "tls.crt"))
    fake.put_object(
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": "extension-apiserver-authentication", "namespace": "kube-system"},
            "data": {"requestheader-client-ca-file": ca.cert_pem.bytes().decode(), **(data or {})},
        }
    )
    return ca


def test_the_clusters_client_ca_is_never_written_to_disk(fake, configs, prometheus, tmp_path):
    """--client-ca-from-cluster: the real process verifies client certificates against the
    ConfigMap's CA, held in memory: nothing in TMPDIR while it runs, nor after a SIGKILL."""
    import ssl

    import trustme

    ca = _front_proxy_ca(fake, tmp_path)
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    tls = ["--tls-cert", str(tmp_path / "tls.crt"), "--tls-key", str(tmp_path / "tls.key"),
           "--client-ca-from-cluster"]
    proc = _controller_process(fake, configs, prometheus, *tls, port=port, env={"TMPDIR": str(tmp)})

    def client(issuer) -> httpx.Client:
        c = ssl.create_default_context()
        ca.configure_trust(c)
        issuer.issue_cert("front-proxy-client", common_name="front-proxy-client").configure_cert(c)
        return httpx.Client(verify=c, timeout=5)

    try:
        assert proc.poll() is None, proc.communicate()
        url = f"https://127.0.0.1:{port}/v1/status"
        with client(ca) as proxy, client(trustme.CA()) as forged:
            got: list[int] = []

            def answered() -> bool:
                try:
                    got.append(proxy.get(url).status_code)
                except httpx.ConnectError:
                    return False
                return True

            wait_until(answered, 30, "the controller's HTTPS port")
            assert got[-1] == 200
            # another CA's certificate fails the handshake (TLS 1.3: the server closes after it)
            with pytest.raises((httpx.ConnectError, httpx.ReadError, httpx.RemoteProtocolError)):
                forged.get(url)
        assert list(tmp.iterdir()) == []
        proc.kill()
        proc.wait(timeout=30)
        assert list(tmp.iterdir()) == []
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_cli_pair_problems_still_exit_2(configs):
    configs[0].write_text(MODELS.replace("    capacity: {1g.10gb: 58}\n", ""))
    out = CliRunner().invoke(
        app, ["controller", str(configs[0]), str(configs[1]), "--once", "--kube-host", "http://127.0.0.1:9"]
    )
    assert out.exit_code == 2 and "models[0]" in out.output, out.output
    assert "model_dir" not in out.output  # the model repository lives in the Triton pods, not here


def test_deployment_manifest_args_parse_with_the_real_cli():
    import typer.main
    import yaml

    root = Path(__file__).resolve().parents[2] / "k8s" / "base"
    dep = yaml.safe_load((root / "deployment.yaml").read_text())
    containers = dep["spec"]["template"]["spec"]["containers"]
    ours = [c for c in containers if c["args"][0] == "controller"]
    assert len(ours) == 1  # one process acts and serves
    args = ours[0]["args"]
    cmd = typer.main.get_command(app).commands["controller"]  # type: ignore[attr-defined]
    ctx = cmd.make_context("controller", list(args[1:]))  # raises on an unknown flag
    p = ctx.params
    assert p["backend"] == "kubernetes" and p["leader_elect"] is True
    assert p["tls_cert"] and p["tls_key"] and not p["insecure_http"] and not p["once"]
    assert p["client_ca_from_cluster"] and p["prometheus"]
    mounts = {m["mountPath"] for m in ours[0]["volumeMounts"]}
    assert "/tmp" in mounts  # a writable /tmp beside the read-only root fs
    assert Path(p["tls_cert"]).parent.as_posix() in mounts
    assert p["models"] == "-" and p["migmodels"] == "all"  # models come from MigModels in every namespace
    assert Path(p["cluster"]).parent.as_posix() in mounts
    port = next(x["containerPort"] for x in ours[0]["ports"] if x["name"] == "https")
    assert p["port"] == port and p["host"] == "0.0.0.0"
    env = {e["name"] for e in ours[0]["env"]}
    assert {"POD_NAME", "POD_NAMESPACE"} <= env  # Lease identity and namespace
    # the command's help shows these same args as its example
    from autoscaler.commands.controller import EXAMPLE

    first = EXAMPLE.split("migscale controller ", 1)[1].split("\n\n", 1)[0]
    shown = cmd.make_context("controller", first.replace("\\\n", " ").split()).params
    assert {k: v for k, v in shown.items() if v != p[k]} == {}


def test_metrics_api_over_tls_with_the_aggregator_client_certificate(make_controller, tmp_path):
    import ssl

    import trustme

    from autoscaler.commands._tls import tls_or_exit as _tls_or_exit

    ca = trustme.CA()
    server = ca.issue_cert("127.0.0.1")
    server.private_key_pem.write_to_path(str(tmp_path / "tls.key"))
    server.cert_chain_pems[0].write_to_path(str(tmp_path / "tls.crt"))
    ca.cert_pem.write_to_path(str(tmp_path / "ca.crt"))
    proxy = ca.issue_cert("front-proxy-client", common_name="front-proxy-client")
    # the same flags the CLI takes: cert, key, client CA, allowed names
    tls = _tls_or_exit(
        str(tmp_path / "tls.crt"),
        str(tmp_path / "tls.key"),
        str(tmp_path / "ca.crt"),
        "front-proxy-client",
        insecure_http=False,
        serving=True,
    )
    ctl = make_controller("a", VirtualClock(T0))
    handle = ctl.start_api("127.0.0.1", 0, tls)
    assert handle.url.startswith("https://")
    ctl.check_lease()
    ctl.tick()

    def ctx(cert=None) -> ssl.SSLContext:
        c = ssl.create_default_context()
        ca.configure_trust(c)
        if cert is not None:
            cert.configure_cert(c)
        return c

    with httpx.Client(verify=ctx(), timeout=10) as anon:
        assert anon.get(f"{handle.url}/readyz").status_code == 200  # kubelet probe: no client cert
        assert anon.get(f"{handle.url}/v1/status").status_code == 401
    with httpx.Client(verify=ctx(proxy), timeout=10) as aggregator:
        assert aggregator.get(f"{handle.url}/v1/status").json()["leader"] is True


def test_client_ca_from_the_cluster_admits_only_the_front_proxy(fake, connect, make_controller, tmp_path):
    import ssl

    from autoscaler.api.tls import TlsSettings
    from autoscaler.commands._tls import cluster_client_ca

    ca = _front_proxy_ca(fake, tmp_path, {"requestheader-allowed-names": '["front-proxy-client"]'})
    tls = cluster_client_ca(connect(), TlsSettings(str(tmp_path / "tls.crt"), str(tmp_path / "tls.key")))
    assert tls.allowed_names == ("front-proxy-client",)
    assert tls.client_ca_pem == ca.cert_pem.bytes().decode() and tls.client_ca_file is None
    ctl = make_controller("a", VirtualClock(T0))
    handle = ctl.start_api("127.0.0.1", 0, tls)
    ctl.check_lease()
    ctl.tick()

    def client(cn: str) -> httpx.Client:
        c = ssl.create_default_context()
        ca.configure_trust(c)
        ca.issue_cert(cn, common_name=cn).configure_cert(c)
        return httpx.Client(verify=c, timeout=10)

    with client("front-proxy-client") as proxy, client("someone-else") as stranger:
        assert proxy.get(f"{handle.url}/v1/status").status_code == 200
        assert stranger.get(f"{handle.url}/v1/status").status_code == 403


def test_client_ca_from_the_cluster_missing_exits_2(fake, connect, capsys):
    import typer

    from autoscaler.api.tls import TlsSettings
    from autoscaler.commands._tls import cluster_client_ca

    with pytest.raises(typer.Exit) as exc:
        cluster_client_ca(connect(), TlsSettings("tls.crt", "tls.key"))
    assert exc.value.exit_code == 2
    assert "extension-apiserver-authentication has no requestheader-client-ca-file" in capsys.readouterr().err


def test_cli_once_dry_run_decides_but_writes_nothing(fake, configs, prometheus):
    fake.put_object(gpu_node("node-a", {"1g.10gb": 7}, config="all-1g.10gb"))
    args = ["controller", str(configs[0]), str(configs[1]), "--once", "--dry-run"]
    out = CliRunner().invoke(app, [*args, "--kube-host", fake.url, "--prometheus", prometheus.url])
    assert out.exit_code == 0, out.output
    report = json.loads(out.stdout)
    assert report["leader"] is False and "dry run" in report["lease"]
    assert any(a["kind"] == "create" for a in report["last_tick"]["actions"])  # it would scale up ...
    assert report["last_tick"]["acted"] is False
    assert fake.writes() == []  # ... but wrote nothing, not even a Lease


def test_the_tick_sends_its_metric_queries_before_the_backends_writes(fake, make_controller):
    ctl = make_controller("a", VirtualClock(T0))
    ctl.check_lease()
    order: list[str] = []
    inner = ctl.source

    class Prefetching:  # a source that can send its queries ahead (PrometheusSource does)
        last_notes = ()

        def prefetch(self, now_s: float) -> None:
            order.append(f"prefetch {now_s}")

        def read(self, models, replicas, now_s):
            order.append(f"read {now_s}")
            return inner.read(models, replicas, now_s)

    ctl.loop.source = ctl.source = Prefetching()
    advance = ctl.backend.advance
    ctl.backend.advance = lambda: (order.append("advance"), advance())[1]
    assert ctl.tick().ok
    # the queries go out first, their round trips overlap the writes; the tick's read takes them
    assert order == [f"prefetch {T0}", "advance", f"read {T0}"]


@pytest.mark.skipif(INCREMENTAL, reason="CPython 3.14.0-3.14.4 collects the old generation incrementally")
def test_a_due_full_collection_runs_in_the_wait_between_ticks_never_in_a_tick(fake, make_controller):
    ctl = make_controller("a", VirtualClock(T0))
    ctl.check_lease()
    ctl.collector = collector = IdleCollector()
    collector.install()  # as ``run`` does
    where = ["tick"]
    starts: list[str] = []

    def seen(phase: str, info: dict) -> None:
        if phase == "start" and info["generation"] == 2:
            starts.append(where[0])

    ballast: list[list[int]] = []
    advance = ctl.backend.advance

    def allocating_advance():  # a tick that allocates enough for a full collection to fall due
        ballast.extend([i] for i in range(max(len(gc.get_objects()), 100_000) + 50_000))
        return advance()

    ctl.backend.advance = allocating_advance
    gc.callbacks.append(seen)
    try:
        assert ctl.tick().ok
        assert collector.due() and starts == []
        where[0] = "wait"
        # The fake API server's threads collect too; while one of theirs is in progress
        # CPython refuses ours (``busy``) and the next wait tries again.
        for _ in range(100):
            ctl.driver.wait(ctl.policy.tick_s, lambda: False)
            if collector.stats.collections:
                break
            time.sleep(0.01)
        assert starts == ["wait"] and collector.stats.collections == 1
        assert ctl.status(None)["gc"]["collections"] == 1
    finally:
        gc.callbacks.remove(seen)
        ctl.close()
    assert gc.get_freeze_count() == 0  # close gives the interpreter its settings back


def test_the_pods_scrape_raises_the_open_files_limit_to_the_hard_one():
    """Built at a soft limit of 256 (a process of its own, so this one's limit stays), the
    scrape raises it to the hard limit first, and keeps connections for a quarter of that."""
    code = (
        "import resource, types\n"
        "hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]\n"
        "resource.setrlimit(resource.RLIMIT_NOFILE, (256, hard))\n"
        "from autoscaler.commands.controller import build_fast_scrape\n"
        "kube = types.SimpleNamespace(inventory=types.SimpleNamespace(metrics_targets=lambda: {}))\n"
        "fast = build_fast_scrape(kube, None)\n"
        "print(resource.getrlimit(resource.RLIMIT_NOFILE)[0], hard, fast._client.hosts)\n"
        "fast.close()\n"
    )
    out = subprocess.run([sys.executable, "-c", code], check=False, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    soft, hard, hosts = (int(x) for x in out.stdout.split())
    assert hard > 256  # this machine's hard limit; the test needs room above the soft one
    assert soft == hard and hosts == max(16, min(4096, hard // 4))


@pytest.mark.parametrize(("flags", "built"), [([], True), (["--no-fast-scrape"], False)])
def test_cli_runs_the_pods_fast_scrape_unless_told_not_to(fake, configs, monkeypatch, flags, built):
    """The controller's loop gets the 1 s pod scrape by default (16 at a time, a quarter of the
    time at most, never through the environment's proxy); ``--no-fast-scrape`` leaves it out."""
    import autoscaler.commands.controller as command
    import autoscaler.runtime.kubernetes as runtime

    fake.put_object(gpu_node("node-a", {"1g.10gb": 7}, config="all-1g.10gb"))
    seen: dict = {}

    class Spy(runtime.KubernetesController):
        def __init__(self, *a, **kw) -> None:
            seen["fast"] = kw.get("fast")
            super().__init__(*a, **kw)

    monkeypatch.setattr(runtime, "KubernetesController", Spy)
    monkeypatch.setattr(command, "_serve", lambda ctl, *a: ctl.close())  # built, then stopped
    out = CliRunner().invoke(app, ["controller", str(configs[0]), str(configs[1]), "--kube-host", fake.url,
                                   "--prometheus", "http://127.0.0.1:9", "--insecure-http", "--no-leader-elect",
                                   *flags])
    assert out.exit_code == 0, out.output
    fast = seen["fast"]
    assert (fast is not None) is built
    if built:
        assert fast.max_duty == 0.25 and fast._pool is not None and fast._pool._max_workers == 16
        from autoscaler.observe.scrape import HttpFetch

        # pods reached directly: urllib3's own pools, which never take a proxy from the environment
        assert isinstance(fast._client, HttpFetch) and fast._client._proxy is None
        assert fast._pool._shutdown  # closed with the controller


def test_client_ca_from_the_cluster_takes_explicit_names_and_refuses_a_ca_that_is_not_pem(fake, connect, tmp_path,
                                                                                         capsys):
    import typer

    from autoscaler.commands._tls import cluster_client_ca
    from autoscaler.commands._tls import tls_or_exit as _tls_or_exit

    _front_proxy_ca(fake, tmp_path, {"requestheader-allowed-names": '["front-proxy-client"]'})
    # the names given on the command line, before the CA is read, win over the ConfigMap's
    tls = _tls_or_exit(str(tmp_path / "tls.crt"), str(tmp_path / "tls.key"), None, "aggregator",
                       insecure_http=False, serving=True, client_ca_from_cluster=True)
    assert cluster_client_ca(connect(), tls).allowed_names == ("aggregator",)
    fake.put_object({"apiVersion": "v1", "kind": "ConfigMap",
                     "metadata": {"name": "extension-apiserver-authentication", "namespace": "kube-system"},
                     "data": {"requestheader-client-ca-file": "-----BEGIN CERTIFICATE-----\nnot one\n"}})
    with pytest.raises(typer.Exit) as exc:
        cluster_client_ca(connect(), tls)
    assert exc.value.exit_code == 2
    err = capsys.readouterr().err
    assert "requestheader-client-ca-file in kube-system/extension-apiserver-authentication is not a PEM CA" in err
