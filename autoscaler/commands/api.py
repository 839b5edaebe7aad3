"""``migscale api``: the metrics API on its own, for Kubernetes (behind an APIService).

In Kubernetes the HPA is the scaling actuator; this process observes
(Prometheus: Triton + DCGM series), decides (the same pure ``decide`` as the
local controller) and exports the result through ``custom.metrics.k8s.io`` /
``external.metrics.k8s.io``. The cluster state comes from the Kubernetes API
(``--inventory kubernetes``, in-cluster config or kubeconfig) or, for a dry
look, from cluster.yaml (``--inventory config``).

It refuses to serve plain HTTP unless ``--insecure-http`` is given: the
aggregator must reach it over TLS and authenticate with its front-proxy
client certificate (``--client-ca``, ``--requestheader-allowed-names``).
Without a client certificate only ``/healthz`` and ``/readyz`` answer (the
kubelet's probes); ``--strict-client-auth`` refuses such connections at the
handshake instead.
Bad input exits 2 with one line naming the option and value.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Annotated, Any

import typer

from autoscaler.commands._common import fail, load_or_exit, log_to_stderr, url_problem

EXAMPLE = """

Example (in the Deployment of k8s/, certificates from a Secret):

  migscale api /etc/migscale/models.yaml /etc/migscale/cluster.yaml \\
      --host 0.0.0.0 --port 6443 \\
      --tls-cert /tls/tls.crt --tls-key /tls/tls.key \\
      --client-ca /requestheader/ca.crt \\
      --requestheader-allowed-names front-proxy-client \\
      --prometheus http://prometheus-k8s.monitoring:9090 \\
      --inventory kubernetes

Local look without TLS:

  migscale api examples/models.yaml examples/cluster.yaml \\
      --insecure-http --port 8080
"""


class _FeedTick:
    def __init__(self, ok: bool, next_delay_s: float) -> None:
        self.ok, self.next_delay_s = ok, next_delay_s


class _Feeder:
    """One tick of the standalone API: observe -> decide -> publish (no actuator: the HPA acts)."""

    def __init__(self, state: Any, cfg: Any, source: Any, snapshot: Any) -> None:
        from autoscaler.policy.state import PolicyState

        self.state, self.cfg, self.source, self.snapshot = state, cfg, source, snapshot
        self.pstate = PolicyState()

    def tick(self) -> _FeedTick:
        from autoscaler.policy.decide import decide
        from autoscaler.policy.types import Observation, Reason

        cfg = self.cfg
        t0 = time.perf_counter()
        now = time.time()
        notes: list[str] = []
        try:
            cluster = self.snapshot()
        except Exception as exc:  # noqa: BLE001 - inventory down: the last picture ages out (the HPA holds)
            typer.echo(f"migscale api: inventory failed: {type(exc).__name__}: {exc}", err=True)
            return _FeedTick(False, cfg.tick_s)
        names = [m.name for m in cfg.models]
        source_ok = True
        try:
            models, replicas = self.source.read(names, [r.id for r in cluster.replicas], now)
        except Exception as exc:  # noqa: BLE001 - a metrics outage holds every model (decide's rule)
            source_ok, models, replicas = False, {}, {}
            notes.append(f"{Reason.HOLD_MISSING_METRICS.value}: {type(exc).__name__}: {exc}")
        obs = Observation(now, cluster, dict(models), dict(replicas), source_ok, tuple(notes))
        t1 = time.perf_counter()
        try:
            plan, self.pstate = decide(obs, self.pstate, cfg, now)
        except Exception as exc:  # noqa: BLE001 - a bug must not take the API down; the last plan ages out
            typer.echo(f"migscale api: decide failed: {type(exc).__name__}: {exc}", err=True)
            return _FeedTick(False, cfg.tick_s)
        t2 = time.perf_counter()
        self.state.update(obs, plan, cluster, cfg.models, slo_p99_ms=cfg.slo_p99_ms,
                          tick_duration_s=time.perf_counter() - t0, plan_duration_s=t2 - t1)
        return _FeedTick(True, cfg.tick_s)


def _feeder(state: Any, models_cfg: Any, cluster_cfg: Any, prometheus: str, inventory: str,
            stop: threading.Event) -> threading.Thread:
    """Observe -> decide -> publish every tick, run by the one ``Driver``, until ``stop``.

    The API then follows the driver: ``/readyz`` fails and every value is
    absent once no tick has been published for three ticks (inventory or
    Prometheus down, a stuck decide), so the HPA holds instead of reading a
    frozen picture.
    """
    from autoscaler.clock import WallClock
    from autoscaler.config import initial_cluster_state, policy_config
    from autoscaler.driver import Driver
    from autoscaler.observe.prometheus import PrometheusSource

    cfg = policy_config(models_cfg, cluster_cfg)
    source = PrometheusSource(prometheus, metrics_stale_s=cfg.metrics_stale_s)
    close: Callable[[], None] = lambda: None
    if inventory == "kubernetes":
        from autoscaler.act.kubernetes.client import KubeRest

        snapshot, close = kube_snapshot(KubeRest.connect(user_agent="migscale-api"), cluster_cfg.namespace)
    else:
        static = initial_cluster_state(cluster_cfg)

        def snapshot():  # type: ignore[no-untyped-def]
            return static

    driver = Driver(_Feeder(state, cfg, source, snapshot), WallClock(), tick_s=cfg.tick_s)
    state.max_age_s = driver.max_snapshot_age_s
    state.health = driver.health

    def run() -> None:
        try:
            driver.run(stop)
        finally:
            close()

    th = threading.Thread(target=run, name="migscale-api-feeder", daemon=True)
    th.start()
    return th


def kube_snapshot(rest: Any, namespace: str) -> tuple[Callable[[], Any], Callable[[], None]]:
    """(snapshot, close): the cluster from Node and Pod informers, as the controller reads it.

    Until both caches have listed, a snapshot raises (the tick fails and the
    API stays not ready) rather than describing an empty cluster.
    """
    from autoscaler.act.kubernetes.client import KubeError
    from autoscaler.act.kubernetes.inventory import KubeInventory
    from autoscaler.act.kubernetes.render import RenderConfig
    from autoscaler.act.kubernetes.workloads import make_caches

    cfg = RenderConfig(namespace=namespace)
    caches = make_caches(rest, cfg)
    informers = (caches.nodes, caches.pods)  # the inventory reads only these
    for i in informers:
        i.start()
    inv = KubeInventory(cfg, caches.nodes, caches.pods)

    def snapshot() -> Any:
        if not all(i.synced for i in informers):
            raise KubeError(0, "Node and Pod caches not synced yet")
        return inv.snapshot()

    def close() -> None:
        for i in informers:
            i.stop()
        rest.close()

    return snapshot, close


def register(app: typer.Typer) -> None:
    @app.command("api", help="Serve the metrics API for the HPA (Kubernetes mode)." + EXAMPLE)
    def api(
        models: Annotated[str, typer.Argument(metavar="MODELS", help="models.yaml")],
        cluster: Annotated[str, typer.Argument(metavar="CLUSTER", help="cluster.yaml")],
        host: Annotated[str, typer.Option(help="address to bind")] = "127.0.0.1",
        port: Annotated[int, typer.Option(help="port to bind (0: a free one)", min=0, max=65535)] = 6443,
        tls_cert: Annotated[str | None, typer.Option("--tls-cert", help="serving certificate (PEM)")] = None,
        tls_key: Annotated[str | None, typer.Option("--tls-key", help="its private key (PEM)")] = None,
        client_ca: Annotated[str | None, typer.Option(
            "--client-ca", help="CA that signs client certificates (the requestheader CA); required client certs"
        )] = None,
        allowed_names: Annotated[str | None, typer.Option(
            "--requestheader-allowed-names", help="comma-separated client certificate CNs to accept"
        )] = None,
        strict_client_auth: Annotated[bool, typer.Option(
            "--strict-client-auth",
            help="refuse connections without a client certificate at the TLS handshake, /healthz and "
                 "/readyz included (default: those two stay open for the kubelet's probes, every "
                 "other path answers 401)",
        )] = False,
        insecure_http: Annotated[bool, typer.Option(
            "--insecure-http", help="serve plain HTTP without TLS (never in a real cluster)"
        )] = False,
        prometheus: Annotated[str | None, typer.Option(
            help="Prometheus URL to observe; without it only config-derived values are served"
        )] = None,
        inventory: Annotated[str, typer.Option(help="cluster state from: kubernetes | config")] = "config",
    ) -> None:
        from autoscaler.api import ApiState, create_app
        from autoscaler.api.server import serve_forever
        from autoscaler.commands._tls import tls_or_exit
        from autoscaler.config import initial_cluster_state, model_specs

        if inventory not in ("kubernetes", "config"):
            fail([f"--inventory: must be kubernetes or config, got {inventory!r}"])
        tls = tls_or_exit(tls_cert, tls_key, client_ca, allowed_names, insecure_http, serving=True,
                          strict_client_auth=strict_client_auth, command="migscale api", ca_options="--client-ca")
        if (bad := url_problem("--prometheus", prometheus)) is not None:
            fail([bad])
        models_cfg, cluster_cfg = load_or_exit(models, cluster)
        log_to_stderr()
        state = ApiState(namespace=cluster_cfg.namespace)
        specs = model_specs(models_cfg, cluster_cfg)
        slos = {m.name: float(m.slo.p99_ms) for m in models_cfg.models}
        # config only: GPUs and models are known, no plan -> no replica ratio is served (absent, not 0)
        state.update(None, None, initial_cluster_state(cluster_cfg), specs, slo_p99_ms=slos, t_s=time.time())
        stop = threading.Event()
        if prometheus:
            _feeder(state, models_cfg, cluster_cfg, prometheus, inventory, stop)
        else:
            typer.echo("migscale api: no --prometheus: serving config-derived values only"
                       + (" (--inventory kubernetes is read only with it)" if inventory == "kubernetes" else ""),
                       err=True)
        scheme = "https" if tls else "http"
        typer.echo(f"migscale api: serving {scheme}://{host}:{port} (namespace {cluster_cfg.namespace})", err=True)
        try:
            serve_forever(create_app(state), host, port, tls)
        except OSError as exc:
            fail([f"--port: cannot bind {host}:{port}: {exc.strerror or exc}"])
        finally:
            stop.set()
