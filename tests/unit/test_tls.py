"""HTTPS with client certificates, as the kube-aggregator front proxy talks to migscale.

Real uvicorn servers on 127.0.0.1 (free ports), real TLS handshakes; certs from trustme.
"""

from __future__ import annotations

import ssl

import httpx
import pytest
import trustme

from autoscaler.api import ApiState, TlsSettings, create_app, serve_in_thread
from autoscaler.api.synthetic import demo_models, demo_tick

PATH = "/apis/custom.metrics.k8s.io/v1beta2/namespaces/default/pods/*/migscale_replica_ratio"


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    d = tmp_path_factory.mktemp("pki")
    ca = trustme.CA()
    other_ca = trustme.CA()
    server = ca.issue_cert("127.0.0.1", "localhost")
    server.private_key_pem.write_to_path(str(d / "server.key"))
    server.cert_chain_pems[0].write_to_path(str(d / "server.crt"))
    ca.cert_pem.write_to_path(str(d / "ca.crt"))
    good = ca.issue_cert("front-proxy-client", common_name="front-proxy-client")
    stranger = ca.issue_cert("someone-else", common_name="someone-else")
    forged = other_ca.issue_cert("front-proxy-client", common_name="front-proxy-client")
    return {"dir": d, "ca": ca, "good": good, "stranger": stranger, "forged": forged}


def _app():
    state = ApiState()
    obs, plan, cluster = demo_tick(1_800_000_000.0)
    state.update(obs, plan, cluster, demo_models())
    return create_app(state)


@pytest.fixture(scope="module")
def server(pki):
    d = pki["dir"]
    tls = TlsSettings(str(d / "server.crt"), str(d / "server.key"), str(d / "ca.crt"),
                      allowed_names=("front-proxy-client",))
    tls.check()
    handle = serve_in_thread(_app(), "127.0.0.1", 0, tls)
    try:
        yield handle
    finally:
        handle.stop()


def _client_ctx(pki, cert=None) -> ssl.SSLContext:
    ctx = ssl.create_default_context()
    pki["ca"].configure_trust(ctx)
    if cert is not None:
        cert.configure_cert(ctx)
    return ctx


def test_no_client_certificate_is_rejected(server, pki):
    with httpx.Client(verify=_client_ctx(pki), timeout=5) as c:
        r = c.get(server.url + PATH)
        assert r.status_code == 401
        assert r.json()["kind"] == "Status" and r.json()["reason"] == "Unauthorized"
        assert c.get(server.url + "/ui").status_code == 401
        assert c.get(server.url + "/metrics").status_code == 401
        # the kubelet's probes carry no client certificate: only they pass
        assert c.get(server.url + "/healthz").status_code == 200
        assert c.get(server.url + "/readyz").status_code == 200


def test_a_client_without_a_certificate_cannot_make_the_server_buffer_a_huge_head(server, pki):
    # the probe paths are open to anyone who reaches the port: their request head is capped too
    from autoscaler.api.server import MAX_HEAD_BYTES

    with httpx.Client(verify=_client_ctx(pki), timeout=10) as c:
        r = c.get(server.url + "/healthz", headers={"X-Pad": "a" * (2 * MAX_HEAD_BYTES)})
        assert r.status_code == 431
        assert r.json()["kind"] == "Status" and r.json()["code"] == 431
        assert c.get(server.url + "/healthz").status_code == 200


def test_strict_mode_refuses_at_the_handshake(pki):
    d = pki["dir"]
    tls = TlsSettings(str(d / "server.crt"), str(d / "server.key"), str(d / "ca.crt"), open_paths=())
    assert tls.cert_reqs == ssl.CERT_REQUIRED
    handle = serve_in_thread(_app(), "127.0.0.1", 0, tls)
    try:
        with (pytest.raises((httpx.ConnectError, httpx.ReadError, httpx.RemoteProtocolError)),
              httpx.Client(verify=_client_ctx(pki), timeout=5) as c):
            c.get(handle.url + "/healthz")
        with httpx.Client(verify=_client_ctx(pki, pki["good"]), timeout=5) as c:
            assert c.get(handle.url + PATH).status_code == 200
    finally:
        handle.stop()


def test_certificate_from_another_ca_is_rejected(server, pki):
    with (pytest.raises((httpx.ConnectError, httpx.ReadError, httpx.RemoteProtocolError)),
          httpx.Client(verify=_client_ctx(pki, pki["forged"]), timeout=5) as c):
        c.get(server.url + PATH)


def test_right_certificate_gets_200(server, pki):
    assert server.url.startswith("https://127.0.0.1:")
    with httpx.Client(verify=_client_ctx(pki, pki["good"]), timeout=5) as c:
        r = c.get(server.url + PATH, params={"labelSelector": "migscale.io/model=resnet"})
        assert r.status_code == 200
        assert r.json()["kind"] == "MetricValueList"
        assert len(r.json()["items"]) == 2
        assert c.get(server.url + "/ui").status_code == 200  # the web view sits behind the same auth


def test_name_not_in_allowed_names_gets_403_status(server, pki):
    with httpx.Client(verify=_client_ctx(pki, pki["stranger"]), timeout=5) as c:
        r = c.get(server.url + PATH)
    assert r.status_code == 403
    body = r.json()
    assert body["kind"] == "Status" and body["reason"] == "Forbidden" and "someone-else" in body["message"]


def test_any_ca_signed_cert_when_no_allowed_names(pki):
    d = pki["dir"]
    tls = TlsSettings(str(d / "server.crt"), str(d / "server.key"), str(d / "ca.crt"))
    handle = serve_in_thread(_app(), "127.0.0.1", 0, tls)
    try:
        with httpx.Client(verify=_client_ctx(pki, pki["stranger"]), timeout=5) as c:
            assert c.get(handle.url + "/healthz").json() == {"status": "ok"}
    finally:
        handle.stop()
    assert not handle.thread.is_alive()


def test_plain_http_in_thread_and_stop_frees_the_port():
    handle = serve_in_thread(_app(), "127.0.0.1", 0)
    try:
        assert handle.url.startswith("http://127.0.0.1:")
        assert httpx.get(handle.url + "/readyz", timeout=5).status_code == 200
    finally:
        handle.stop()
    with pytest.raises(httpx.ConnectError):
        httpx.get(handle.url + "/readyz", timeout=2)


def test_settings_check_names_the_option(tmp_path):
    with pytest.raises(ValueError, match="--tls-cert: file not found"):
        TlsSettings(str(tmp_path / "nope.crt"), str(tmp_path / "nope.key")).check()
    (tmp_path / "a").write_text("x")
    with pytest.raises(ValueError, match="--requestheader-allowed-names: needs --client-ca"):
        TlsSettings(str(tmp_path / "a"), str(tmp_path / "a"), None, ("x",)).check()


def test_a_client_ca_held_as_text_verifies_as_the_file_does(pki):
    d = pki["dir"]
    tls = TlsSettings(str(d / "server.crt"), str(d / "server.key"), allowed_names=("front-proxy-client",),
                      client_ca_pem=pki["ca"].cert_pem.bytes().decode())
    tls.check()
    handle = serve_in_thread(_app(), "127.0.0.1", 0, tls)
    try:
        with httpx.Client(verify=_client_ctx(pki, pki["good"]), timeout=5) as c:
            assert c.get(handle.url + PATH).status_code == 200
        with httpx.Client(verify=_client_ctx(pki, pki["stranger"]), timeout=5) as c:
            assert c.get(handle.url + PATH).status_code == 403
        with httpx.Client(verify=_client_ctx(pki), timeout=5) as c:
            assert c.get(handle.url + PATH).status_code == 401
            assert c.get(handle.url + "/readyz").status_code == 200
        with (pytest.raises((httpx.ConnectError, httpx.ReadError, httpx.RemoteProtocolError)),
              httpx.Client(verify=_client_ctx(pki, pki["forged"]), timeout=5) as c):
            c.get(handle.url + PATH)
    finally:
        handle.stop()


def test_files_that_do_not_load_name_their_option_at_check(tmp_path, pki):
    d = pki["dir"]
    (tmp_path / "junk").write_text("not a certificate\n")
    with pytest.raises(ValueError, match="--tls-cert/--tls-key: not a PEM certificate and its key"):
        TlsSettings(str(tmp_path / "junk"), str(d / "server.key")).check()
    other = trustme.CA().issue_cert("127.0.0.1")  # a key that is not the certificate's
    other.private_key_pem.write_to_path(str(tmp_path / "other.key"))
    with pytest.raises(ValueError, match="--tls-cert/--tls-key"):
        TlsSettings(str(d / "server.crt"), str(tmp_path / "other.key")).check()
    with pytest.raises(ValueError, match="--client-ca: not a PEM CA certificate, got '.*junk'"):
        TlsSettings(str(d / "server.crt"), str(d / "server.key"), str(tmp_path / "junk")).check()
    TlsSettings(str(d / "server.crt"), str(d / "server.key"), str(d / "ca.crt")).check()  # the right ones load
