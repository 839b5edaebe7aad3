"""``migscale controller``: the control loop on a Kubernetes cluster (the controller pod's command).

Wires :class:`autoscaler.runtime.kubernetes.KubernetesController`: the Kubernetes
backend (in-cluster config, kubeconfig, or ``--kube-host``), Prometheus as the
metrics source, the leader-elected loop, and the metrics API the HPA reads
through the APIService registrations -- all in one process, so the values
served are the ones the loop decided on.

Like ``migscale api`` it refuses to serve plain HTTP unless ``--insecure-http``
is given. ``--once`` runs one tick, prints what it did as JSON and exits
(no API server, so no TLS needed); with ``--dry-run`` that tick decides but
writes nothing, not even the Lease: a look at what migscale would do.
Bad input exits 2 with one line naming the option and value; SIGTERM stops
the loop and releases the Lease so a follower takes over at its next retry (~2 s).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import threading
from typing import Annotated, Any

import typer

from autoscaler.commands._common import fail, load_or_exit, log_to_stderr, url_problem
from autoscaler.commands._tls import cluster_client_ca, tls_or_exit

# validate_pair's checks that model_dir exists on disk: on Kubernetes the model
# repository is a volume of the Triton pods (k8s_render: --model-repository=/models),
# never of the controller pod, so those two checks do not apply here.

EXAMPLE = """

Example (the container args in k8s/base/deployment.yaml: models from
MigModels in every namespace; for a models.yaml, its path instead of -,
and no --migmodels):

  migscale controller - /etc/migscale/cluster.yaml --migmodels all \\
      --backend kubernetes --leader-elect \\
      --prometheus http://prometheus-k8s.monitoring.svc:9090 \\
      --host 0.0.0.0 --port 6443 \\
      --tls-cert /var/run/serving-cert/tls.crt \\
      --tls-key /var/run/serving-cert/tls.key \\
      --client-ca-from-cluster

What would it do now? One tick against the cluster in your kubeconfig that
writes nothing (prints the decision as JSON, serves nothing):

  migscale controller examples/models.yaml examples/cluster.yaml \\
      --once --dry-run --prometheus http://127.0.0.1:9090
"""


def register(app: typer.Typer) -> None:
    @app.command(
        "controller",
        help="Run the control loop on Kubernetes (leader-elected) and serve the metrics API." + EXAMPLE,
    )
    def controller(
        models: Annotated[str, typer.Argument(metavar="MODELS", help="models.yaml, or - with --migmodels (models come from MigModels)")],
        cluster: Annotated[str, typer.Argument(metavar="CLUSTER", help="cluster.yaml")],
        backend: Annotated[
            str, typer.Option(help="where replicas live: kubernetes (the local backend is `migscale up`)")
        ] = "kubernetes",
        leader_elect: Annotated[
            bool,
            typer.Option(
                "--leader-elect/--no-leader-elect",
                help="act only while holding the migscale-controller Lease (run 2 replicas with it on)",
            ),
        ] = True,
        identity: Annotated[
            str | None,
            typer.Option(help="this replica's name in the Lease (default: $POD_NAME, else the hostname)"),
        ] = None,
        lease_namespace: Annotated[
            str | None,
            typer.Option(
                "--lease-namespace",
                help="namespace of the Lease (default: $POD_NAMESPACE, else cluster.yaml's)",
            ),
        ] = None,
        prometheus: Annotated[
            str | None,
            typer.Option(help="Prometheus URL; without it every tick is blind and every model holds"),
        ] = None,
        rate_window: Annotated[
            float,
            typer.Option(
                "--rate-window",
                min=1.0,
                help="PromQL rate window, seconds; keep >= 4 scrape intervals (15 s PodMonitor -> 60)",
            ),
        ] = 60.0,
        kube_host: Annotated[
            str | None,
            typer.Option(
                "--kube-host",
                help="API server URL (no auth; tests, kubectl proxy); default in-cluster, else kubeconfig",
            ),
        ] = None,
        host: Annotated[str, typer.Option(help="address the metrics API binds")] = "127.0.0.1",
        port: Annotated[
            int, typer.Option(help="port the metrics API binds (0: a free one)", min=0, max=65535)
        ] = 6443,
        tls_cert: Annotated[str | None, typer.Option("--tls-cert", help="serving certificate (PEM)")] = None,
        tls_key: Annotated[str | None, typer.Option("--tls-key", help="its private key (PEM)")] = None,
        client_ca: Annotated[
            str | None,
            typer.Option(
                "--client-ca",
                help="CA that signs client certificates (the requestheader CA); "
                "client certificates are then required",
            ),
        ] = None,
        allowed_names: Annotated[
            str | None,
            typer.Option(
                "--requestheader-allowed-names", help="comma-separated client certificate CNs to accept"
            ),
        ] = None,
        client_ca_from_cluster: Annotated[
            bool,
            typer.Option(
                "--client-ca-from-cluster",
                help="take the client CA and allowed names from kube-system/extension-apiserver-authentication "
                "(what the aggregator's front proxy presents); instead of --client-ca",
            ),
        ] = False,
        strict_client_auth: Annotated[
            bool,
            typer.Option(
                "--strict-client-auth",
                help="refuse connections without a client certificate at the TLS handshake, /healthz and "
                "/readyz included (default: those two stay open for the kubelet's probes)",
            ),
        ] = False,
        insecure_http: Annotated[
            bool,
            typer.Option("--insecure-http", help="serve plain HTTP without TLS (never in a real cluster)"),
        ] = False,
        decision_log: Annotated[
            str | None,
            typer.Option(
                "--decision-log", help="append the leader's decisions as JSON lines (for `migscale explain`)"
            ),
        ] = None,
        dry_run: Annotated[
            bool,
            typer.Option(
                "--dry-run", help="observe and decide, write nothing to the cluster (not even the Lease)"
            ),
        ] = False,
        lease_duration: Annotated[
            int,
            typer.Option("--lease-duration", help="seconds a follower waits, from when it last saw the "
                         "Lease change, before taking over (client-go default 15)"),
        ] = 15,
        renew_deadline: Annotated[
            float,
            typer.Option("--renew-deadline", help="seconds the leader keeps acting without a successful "
                         "renewal; must be < --lease-duration (default 10)"),
        ] = 10.0,
        retry_period: Annotated[
            float,
            typer.Option("--retry-period", help="seconds between acquire/renew attempts (default 2)"),
        ] = 2.0,
        migmodels: Annotated[
            str | None,
            typer.Option(
                "--migmodels",
                help="serve the MigModels of these namespaces ('all', or comma-separated names); "
                "each model's workloads go into its MigModel's namespace (MODELS is then -)",
            ),
        ] = None,
        once: Annotated[
            bool,
            typer.Option(
                "--once", help="run one tick, print it as JSON and exit (no API server); exit 1 if it failed"
            ),
        ] = False,
        fast_scrape: Annotated[
            bool,
            typer.Option(
                "--fast-scrape/--no-fast-scrape",
                help="scrape each Ready Triton pod's metrics port every second for the burst layer, "
                "beside Prometheus (needs the controller to reach the pods: see docs/kubernetes.md)",
            ),
        ] = True,
        fast_scrape_proxy: Annotated[
            str | None,
            typer.Option(
                "--fast-scrape-proxy",
                help="reach the pods through this HTTP proxy (a controller outside the pod network); "
                "default: straight to each pod IP, whatever HTTP_PROXY says",
            ),
        ] = None,
    ) -> None:
        problems = [p for p in (url_problem("--fast-scrape-proxy", fast_scrape_proxy),
                                url_problem("--prometheus", prometheus), url_problem("--kube-host", kube_host)) if p]
        if problems:
            fail(problems)
        if backend != "kubernetes":
            fail([f"--backend: must be kubernetes (the local backend is `migscale up`), got {backend!r}"])
        if client_ca_from_cluster and client_ca:
            fail(
                [f"--client-ca-from-cluster: give it or --client-ca, not both, got --client-ca {client_ca!r}"]
            )
        if client_ca_from_cluster and not (tls_cert and tls_key):
            fail(["--client-ca-from-cluster: needs --tls-cert and --tls-key, got neither"])
        tls = tls_or_exit(
            tls_cert,
            tls_key,
            client_ca,
            allowed_names,
            insecure_http,
            serving=not once,
            strict_client_auth=strict_client_auth,
            client_ca_from_cluster=client_ca_from_cluster,
        )
        from autoscaler.act.kubernetes.leader import check_timings

        problems = check_timings(lease_duration, renew_deadline, retry_period)
        if problems:
            fail(problems)
        log_to_stderr(tracebacks=not once)
        spaces = _migmodel_namespaces(migmodels, models)
        if spaces is None:
            models_cfg, cluster_cfg = load_for_cluster(models, cluster)
        else:
            from autoscaler.commands._common import load_cluster_or_exit

            models_cfg, cluster_cfg = None, load_cluster_or_exit(cluster)

        from autoscaler.act.kubernetes.config import LeaseTimings, build_backend
        from autoscaler.clock import WallClock
        from autoscaler.config import model_specs
        from autoscaler.runtime.gcpacing import IdleCollector
        from autoscaler.runtime.kubernetes import KubernetesController

        clock = WallClock()
        identity = identity or os.environ.get("POD_NAME") or socket.gethostname()
        try:
            kube = build_backend(
                model_specs(models_cfg, cluster_cfg) if models_cfg is not None else [],
                cluster_cfg,
                host=kube_host,
                identity=identity,
                lease_namespace=lease_namespace,
                clock=clock,
                leader_elect=leader_elect,
                dry_run=dry_run,
                lease=LeaseTimings(lease_duration, renew_deadline, retry_period),
                backend_options={"all_namespaces": spaces is not None},
            )
        except Exception as exc:  # noqa: BLE001 - kubernetes.config raises several types; one line each
            fail(
                [
                    (
                        f"--kube-host: no Kubernetes API to talk to (not in a pod, no kubeconfig, no --kube-host): "
                        f"{type(exc).__name__}: {exc}"
                    )
                ]
            )
        model_source = None
        if spaces is not None:
            from autoscaler.act.kubernetes.client import KubeError
            from autoscaler.runtime.migmodels import MigModelSource

            try:
                model_source = MigModelSource(kube.rest, cluster_cfg, namespaces=spaces or None)
            except KubeError as exc:
                kube.close()
                fail([f"--migmodels: {exc}"])
        ctl = KubernetesController(
            kube,
            _source(prometheus, rate_window, cluster_cfg),
            models_cfg,
            cluster_cfg,
            # one tick (--once) has one scrape, no rate: the path runs only in the loop
            fast=build_fast_scrape(kube, fast_scrape_proxy) if fast_scrape and prometheus is not None and not once else None,
            clock=clock,
            identity=identity,
            decision_log=decision_log,
            dry_run=dry_run,
            model_source=model_source,
            # this process is the controller: its full garbage collections go between ticks
            collector=IdleCollector(),
        )
        if once:
            try:
                ctl.check_lease()
                result = ctl.tick()
                typer.echo(json.dumps(ctl.status(result), indent=2, default=str))
            finally:
                ctl.close()
            if not result.ok:
                typer.echo(f"migscale controller: the tick failed: {'; '.join(result.errors) or 'see last_tick'}",
                           err=True)
            raise typer.Exit(0 if result.ok else 1)
        if client_ca_from_cluster:
            try:
                tls = cluster_client_ca(kube.rest, tls)
            except typer.Exit:
                ctl.close()
                raise
        _serve(ctl, host, port, tls, cluster_cfg.namespace)


def _migmodel_namespaces(option: str | None, models_path: str) -> list[str] | None:
    """None: models from MODELS; [] = MigModels of all namespaces; else those namespaces'. Bad input exits 2."""
    if option is None:
        if models_path == "-":
            fail(["MODELS: '-' means models come from MigModels; give --migmodels too, got '-'"])
        return None
    if models_path != "-":
        fail([f"MODELS: with --migmodels the models come from MigModels; give - , got {models_path!r}"])
    if option.strip() == "all":
        return []
    from autoscaler.config.schema import DNS_LABEL

    names = [n.strip() for n in option.split(",")]
    bad = [n for n in names if not DNS_LABEL.fullmatch(n)]
    if bad or not names:
        fail([f"--migmodels: 'all' or comma-separated namespace names, got {option!r}"])
    return list(dict.fromkeys(names))


def load_for_cluster(models_path: str, cluster_path: str) -> tuple[Any, Any]:
    """``load_or_exit`` without the on-disk model_dir checks; every other problem exits 2."""
    return load_or_exit(models_path, cluster_path, check_dirs=False)


def _source(prometheus: str | None, window_s: float, cluster_cfg: Any) -> Any:
    from autoscaler.observe.prometheus import PrometheusSource, PrometheusUnavailable
    from autoscaler.observe.queries import Queries

    if prometheus is None:
        typer.echo("migscale controller: no --prometheus: every tick is blind, every model holds", err=True)

        class NoPrometheus:
            last_notes: tuple[str, ...] = ()

            def read(self, models: Any, replicas: Any, now_s: float) -> Any:
                raise PrometheusUnavailable("no --prometheus given")

        return NoPrometheus()
    # In Kubernetes a replica is a pod: the PodMonitor's series carry `pod`, not `replica`.
    return PrometheusSource(
        prometheus,
        Queries(replica_label="pod"),
        window_s=window_s,
        metrics_stale_s=float(cluster_cfg.policy.metrics_stale_s),
    )


def build_fast_scrape(kube: Any, proxy: str | None) -> Any:
    """The pods' direct scrape: 16 fetches side by side, so a round over a few hundred pods
    ends within its second even when some time out (0.5 s each); rounds take at most a
    quarter of the time (``max_duty``), so on a fleet of thousands of pods they come further
    apart instead of taking the CPU the ticks need (docs/kubernetes.md, "The fast path")."""
    from autoscaler.observe.fast import FastScrape

    raise_open_files_limit()
    return FastScrape(kube.inventory.metrics_targets, workers=16, max_duty=0.25, proxy=proxy)


def raise_open_files_limit() -> None:
    """Raise this process's soft limit on open files to its hard limit, as Go programs do at
    start. The scrape keeps a connection per pod for up to a
    quarter of the soft limit; at the common soft limit of 1,024 that is 256 pods, and a
    larger fleet fetched in turn would find none of its connections still open. Nothing here
    waits with ``select()``, whose descriptors must stay below 1,024."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and (hard == resource.RLIM_INFINITY or soft < hard):
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
        except (ValueError, OSError):
            pass  # a container may forbid it: the scrape's bound follows the old limit


def _serve(ctl: Any, host: str, port: int, tls: Any, namespace: str) -> None:
    stop = threading.Event()

    def on_signal(signum: int, _frame: Any) -> None:
        stop.set()

    try:
        ctl.start_api(host, port, tls)
    except (OSError, RuntimeError) as exc:
        ctl.close()
        fail([f"--port: cannot serve on {host}:{port}: {exc}"])
    prev = {s: signal.signal(s, on_signal) for s in (signal.SIGTERM, signal.SIGINT)}
    scheme = "https" if tls is not None else "http"
    typer.echo(
        f"migscale controller {ctl.identity}: serving {ctl.api.url} ({scheme}), "
        f"acting in namespace {namespace}",
        err=True,
    )
    try:
        ctl.run(stop)
    finally:
        for s, h in prev.items():
            signal.signal(s, h)
        ctl.close()  # releases the Lease: a follower takes over at its next renewal
        what = ctl.close_error or ("lease released" if ctl.released else "was not the leader")
        typer.echo(f"migscale controller {ctl.identity}: stopped, {what}", err=True)
