"""The TLS options of ``migscale controller`` and ``migscale api``: the serving certificate and the aggregator's client CA.

Part of the command-line edge of both commands: ``tls_or_exit`` turns
``--tls-cert``/``--tls-key``/``--client-ca``/``--requestheader-allowed-names``
into ``TlsSettings`` (or plain HTTP with ``--insecure-http``), and
``cluster_client_ca`` reads the client CA the API server publishes
(``--client-ca-from-cluster``). Bad input exits 2 with one line naming the option.
The leading underscore keeps ``cli.py`` from registering this module as commands.
"""

from __future__ import annotations

import json
from typing import Any

from autoscaler.commands._common import fail


def tls_or_exit(
    tls_cert: str | None,
    tls_key: str | None,
    client_ca: str | None,
    allowed_names: str | None,
    insecure_http: bool,
    serving: bool,
    strict_client_auth: bool = False,
    client_ca_from_cluster: bool = False,
    command: str = "migscale controller",
    ca_options: str = "--client-ca or --client-ca-from-cluster",
) -> Any:
    """TlsSettings, None for plain HTTP (only with --insecure-http), or exit 2.

    ``client_ca_from_cluster``: the client CA is read from the cluster later, so allowed
    names given without --client-ca are not an error."""
    from autoscaler.api.tls import PROBE_PATHS, TlsConfigError, TlsSettings

    names = tuple(n.strip() for n in (allowed_names or "").split(",") if n.strip())
    if tls_cert or tls_key or client_ca:
        if not (tls_cert and tls_key):
            which = "--tls-key" if tls_cert else "--tls-cert"
            fail([f"{which}: required together with --tls-cert/--tls-key, got nothing"])
        # the kubelet's probes carry no client certificate: /healthz and /readyz stay open
        open_paths = () if strict_client_auth else PROBE_PATHS
        tls = TlsSettings(tls_cert, tls_key, client_ca, names, open_paths=open_paths)  # type: ignore[arg-type]
        try:
            tls.check(client_ca_to_come=client_ca_from_cluster)
        except TlsConfigError as exc:
            fail([str(exc)])
        return tls
    if names:
        fail([f"--requestheader-allowed-names: needs --client-ca and TLS, got {allowed_names!r}"])
    if serving and not insecure_http:
        fail(
            [
                (
                    f"{command}: refusing to serve the metrics API without TLS: give --tls-cert and "
                    f"--tls-key (and {ca_options} for the aggregator's client certificate), or --insecure-http"
                )
            ]
        )
    return None


AUTH_CM = ("kube-system", "extension-apiserver-authentication")


def cluster_client_ca(rest: Any, tls: Any) -> Any:
    """``tls`` with the aggregator's client CA (and allowed names) read from the cluster, or exit 2.

    The API server publishes its front-proxy CA in the ConfigMap
    kube-system/extension-apiserver-authentication (key
    ``requestheader-client-ca-file``, with ``requestheader-allowed-names`` as a
    JSON list); k8s/base grants read on it. It cannot be mounted into a pod of
    another namespace, so the server keeps it in memory (``client_ca_pem``): no file
    of it outlives the process, even one killed by SIGKILL. Explicit
    ``--requestheader-allowed-names`` win over the ConfigMap's.
    """
    import dataclasses

    from autoscaler.act.kubernetes.client import KubeError
    from autoscaler.api.tls import TlsConfigError

    where = f"{AUTH_CM[0]}/{AUTH_CM[1]}"
    try:
        cm = rest.get("v1", "ConfigMap", *AUTH_CM)
    except KubeError as exc:
        fail([f"--client-ca-from-cluster: cannot read ConfigMap {where}: {exc}"])
    data = (cm or {}).get("data") or {}
    pem = data.get("requestheader-client-ca-file")
    if not pem:
        fail(
            [
                (
                    f"--client-ca-from-cluster: ConfigMap {where} has no requestheader-client-ca-file "
                    f"(is the aggregation layer enabled?), got keys {sorted(data)!r}"
                )
            ]
        )
    names = tls.allowed_names
    if not names:
        raw = data.get("requestheader-allowed-names") or "[]"
        try:
            names = tuple(str(n) for n in json.loads(raw))
        except (ValueError, TypeError):
            fail(
                [
                    f"--client-ca-from-cluster: requestheader-allowed-names in {where} is not a JSON list, got {raw!r}"
                ]
            )
    out = dataclasses.replace(tls, client_ca_pem=pem, allowed_names=names)
    try:
        out.server_context()  # what the server will load, loaded now
    except TlsConfigError as exc:
        fail([f"--client-ca-from-cluster: requestheader-client-ca-file in {where} is not a PEM CA certificate: {exc}"])
    return out
