"""HTTPS with client-certificate authentication, like the kube-aggregator front proxy.

Part of the export step's edge. In Kubernetes the API server reaches
migscale through an APIService; the aggregator presents its front-proxy
client certificate (``--proxy-client-cert-file``), signed by the
requestheader CA. So migscale:

1. serves HTTPS with the given certificate and key;
2. verifies client certificates against ``client_ca_file`` (or
   ``client_ca_pem``, the CA as text: the controller reads it from the
   cluster and keeps it in memory, so no file outlives the process, however
   it ends). A certificate
   from another CA fails the TLS handshake. A connection *without* a
   certificate is refused too -- at the handshake (``ssl.CERT_REQUIRED``)
   when ``open_paths`` is empty, or with a 401 Status on every path except
   ``open_paths`` (default ``/healthz``, ``/readyz``) otherwise. The second
   form (``ssl.CERT_OPTIONAL`` + this check) is what Kubernetes' own
   aggregated servers do, because the kubelet's HTTPS probes carry no client
   certificate: with CERT_REQUIRED a pod whose probes hit this port never
   becomes ready;
3. optionally accepts only certificates whose subject CN is in
   ``allowed_names`` (``--requestheader-allowed-names``, usually
   ``front-proxy-client``): other names get a 403 Status.

uvicorn does not put the peer certificate into the ASGI scope, so
:class:`PeerCertProtocol` (a subclass of uvicorn's HTTP protocol, passed as
``http=``) reads it from the TLS transport once per connection and puts
``(verified, CN)`` into that connection's ``scope["state"]``;
:class:`ClientAuthMiddleware` checks it. ``scope["state"]`` is copied from
the server per request and cannot be set by a client.
"""

from __future__ import annotations

import ssl
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

try:  # httptools is the fast parser; h11 is uvicorn's pure-Python fallback
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol as _BaseProtocol

    HTTP_IMPL = "httptools"
except ImportError:  # pragma: no cover - only without httptools
    from uvicorn.protocols.http.h11_impl import H11Protocol as _BaseProtocol  # type: ignore[assignment]

    HTTP_IMPL = "h11"

PEER_CN_KEY = "migscale.peer_cn"
PEER_VERIFIED_KEY = "migscale.peer_verified"
PROBE_PATHS = ("/healthz", "/readyz")


class TlsConfigError(ValueError):
    """A TLS file that is missing or unreadable; the message names the option and path."""


@dataclass(frozen=True)
class TlsSettings:
    cert_file: str
    key_file: str
    client_ca_file: str | None = None  # None (and no client_ca_pem): server TLS only, no client authentication
    allowed_names: tuple[str, ...] = ()  # empty: any certificate the CA signed
    # reachable without a client certificate (kubelet probes); () = CERT_REQUIRED at the handshake
    open_paths: tuple[str, ...] = PROBE_PATHS
    client_ca_pem: str | None = None  # the client CA as PEM text, held in memory (instead of client_ca_file)

    @property
    def verifies_clients(self) -> bool:
        return self.client_ca_file is not None or self.client_ca_pem is not None

    def check(self, *, client_ca_to_come: bool = False) -> None:
        """Raise TlsConfigError naming the option when a file is missing or does not load.

        ``client_ca_to_come``: the client CA is added later (read from the cluster), so
        allowed names without one yet are not an error."""
        for option, path in (("--tls-cert", self.cert_file), ("--tls-key", self.key_file),
                             ("--client-ca", self.client_ca_file)):
            if path is not None and not Path(path).is_file():
                raise TlsConfigError(f"{option}: file not found, got {path!r}")
        if self.allowed_names and not (self.verifies_clients or client_ca_to_come):
            raise TlsConfigError(
                "--requestheader-allowed-names: needs --client-ca (names come from verified client "
                f"certificates), got {','.join(self.allowed_names)!r}"
            )
        self.server_context()  # what the server will load, loaded now: a bad file is an error at start

    def uvicorn_kwargs(self) -> dict[str, Any]:
        """Keyword arguments for ``uvicorn.Config``: the context :meth:`server_context` builds."""
        return {"ssl_context_factory": lambda _config, _default: self.server_context()}

    @property
    def cert_reqs(self) -> ssl.VerifyMode:
        """CERT_REQUIRED when no path is open; CERT_OPTIONAL (a presented cert is still verified) otherwise."""
        return ssl.CERT_OPTIONAL if self.open_paths else ssl.CERT_REQUIRED

    def server_context(self) -> ssl.SSLContext:
        """The server's SSLContext; TlsConfigError naming the option for what does not load."""
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.minimum_version = ssl.TLSVersion.TLSv1_2
        try:
            ctx.load_cert_chain(self.cert_file, self.key_file)
        except (ssl.SSLError, OSError) as exc:
            raise TlsConfigError(
                f"--tls-cert/--tls-key: not a PEM certificate and its key, got {self.cert_file!r} and "
                f"{self.key_file!r}: {exc}"
            ) from None
        if self.verifies_clients:
            try:
                if self.client_ca_file is not None:
                    ctx.load_verify_locations(cafile=self.client_ca_file)
                if self.client_ca_pem is not None:
                    ctx.load_verify_locations(cadata=self.client_ca_pem)
            except (ssl.SSLError, OSError, ValueError) as exc:
                where = repr(self.client_ca_file) if self.client_ca_file is not None else "the CA's PEM text"
                raise TlsConfigError(f"--client-ca: not a PEM CA certificate, got {where}: {exc}") from None
            ctx.verify_mode = self.cert_reqs
        return ctx


def peer_certificate(transport: Any) -> tuple[bool, str | None]:
    """(a verified client certificate is present, its subject CN) for ``transport``.

    ``getpeercert()`` returns a non-empty dict only for a certificate that
    passed verification (a bad one already failed the handshake).
    """
    ssl_object = transport.get_extra_info("ssl_object") if transport is not None else None
    cert = ssl_object.getpeercert() if ssl_object is not None else None
    if not cert:
        return False, None
    for rdn in cert.get("subject", ()):
        for key, value in rdn:
            if key == "commonName":
                return True, value
    return True, None


class PeerCertProtocol(_BaseProtocol):  # type: ignore[misc, valid-type]
    """uvicorn HTTP protocol that exposes the client certificate's CN to the app."""

    def connection_made(self, transport: Any) -> None:  # type: ignore[override]
        super().connection_made(transport)
        verified, cn = peer_certificate(transport)
        # a per-connection copy: every request's scope["state"] is copied from it
        self.app_state = {**self.app_state, PEER_VERIFIED_KEY: verified, PEER_CN_KEY: cn}


class ClientAuthMiddleware:
    """ASGI middleware: 401 without a verified client certificate, 403 for a CN not allowed.

    ``open_paths`` (the kubelet's probes) pass without a certificate.
    """

    def __init__(self, app: Callable, settings: TlsSettings) -> None:
        self.app = app
        self.allowed = frozenset(settings.allowed_names)
        self.open_paths = frozenset(settings.open_paths)

    async def __call__(self, scope: dict, receive: Callable, send: Callable) -> None:
        if scope["type"] != "http" or scope["path"] in self.open_paths:
            await self.app(scope, receive, send)
            return
        state = scope.get("state", {})
        if not state.get(PEER_VERIFIED_KEY):
            await _deny(send, 401, "Unauthorized", "a client certificate signed by the client CA is required")
            return
        cn = state.get(PEER_CN_KEY)
        if self.allowed and cn not in self.allowed:
            await _deny(send, 403, "Forbidden", f"client certificate CN {cn!r} is not in the allowed names")
            return
        await self.app(scope, receive, send)


async def _deny(send: Callable, code: int, reason: str, message: str) -> None:
    from autoscaler.api.errors import status_body
    from autoscaler.api.state import dumps

    body = dumps(status_body(code, message, reason))
    await send({"type": "http.response.start", "status": code,
                "headers": [(b"content-type", b"application/json"),
                            (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})
