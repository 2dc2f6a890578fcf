"""webconfig/tls.py: client_allowed_sans matches IP SANs by address, IPv6 included
(issue 19 item 9).

Python's ssl shows an IPv6 SAN as '2001:DB8:0:0:0:0:0:5' (upper case, nothing
compressed), so an allowed '2001:db8::5' never matched a certificate that carried it.
exporter-toolkit compares Go's normalized form of the address; here any spelling of
the same address matches. Real certificates made with openssl, a real TLS client."""

from __future__ import annotations

from pathlib import Path

import pytest
from prom_harness import wait_for
from security_harness import Serve, make_pki, openssl, tls_client, tls_status, write_web_config


@pytest.fixture(scope="module")
def pki(tmp_path_factory) -> Path:
    d = make_pki(tmp_path_factory.mktemp("pki"))
    for name, san in (("client-v6", "IP:2001:db8::5"), ("client-v4", "IP:10.1.2.3"), ("client-other-v6", "IP:2001:db8::6")):
        (d / f"{name}.ext").write_text(f"subjectAltName={san}\n")
        openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{name}.key", "-out", f"{name}.csr",
                "-subj", f"/CN={name}", cwd=d)
        openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial",
                "-out", f"{name}.crt", "-days", "2", "-extfile", f"{name}.ext", cwd=d)
    return d


def _start(cfg: Path, pki: Path, probe_cert: str) -> tuple[Serve, int]:
    server = Serve("--vllm.url", "http://127.0.0.1:1/m", "--web.listen-address", "127.0.0.1:0",
                   "--web.config.file", str(cfg))
    try:
        port = server.port()
        wait_for(lambda: server.proc.poll() is not None or tls_status(port, tls_client(pki, probe_cert)) != "refused"
                 or tls_status(port, tls_client(pki, "client")) == 200, 30, "TLS to answer", step=0.1)
        assert server.proc.poll() is None, server.stop()
    except BaseException:
        server.stop()
        raise
    return server, port


@pytest.mark.parametrize("allowed", ["2001:db8::5", "2001:DB8:0:0:0:0:0:5", "2001:0db8::0005"])
def test_an_ipv6_san_is_matched_however_the_allowed_address_is_written(tmp_path, pki, allowed):
    cfg = write_web_config(tmp_path / "web.yaml", pki, tls_server_config={
        "client_auth_type": "RequireAndVerifyClientCert", "client_ca_file": str(pki / "ca.crt"),
        "client_allowed_sans": [allowed, "prometheus.monitoring"]})
    server, port = _start(cfg, pki, "client-v6")
    try:
        seen = {cert: tls_status(port, tls_client(pki, cert))
                for cert in ("client-v6", "client-other-v6", "client", "client2", "client-v4")}
    finally:
        server.stop()
    assert seen == {"client-v6": 200, "client-other-v6": "refused", "client": 200, "client2": "refused",
                    "client-v4": "refused"}


def test_an_ipv4_san_is_matched(tmp_path, pki):
    cfg = write_web_config(tmp_path / "web.yaml", pki, tls_server_config={
        "client_auth_type": "RequireAndVerifyClientCert", "client_ca_file": str(pki / "ca.crt"),
        "client_allowed_sans": ["10.1.2.3"]})
    server, port = _start(cfg, pki, "client-v4")
    try:
        assert tls_status(port, tls_client(pki, "client-v4")) == 200
        assert tls_status(port, tls_client(pki, "client-v6")) == "refused"
    finally:
        server.stop()


def test_an_empty_allowed_sans_list_restricts_nothing_as_in_exporter_toolkit(tmp_path, pki):
    """`client_allowed_sans: []` loaded, then refused every client, /healthz probes included (helper-29)."""
    cfg = write_web_config(tmp_path / "web.yaml", pki, tls_server_config={
        "client_auth_type": "RequireAndVerifyClientCert", "client_ca_file": str(pki / "ca.crt"),
        "client_allowed_sans": []})
    server, port = _start(cfg, pki, "client-v4")
    try:
        assert {cert: tls_status(port, tls_client(pki, cert)) for cert in ("client-v4", "client")} == {
            "client-v4": 200, "client": 200}
    finally:
        server.stop()


@pytest.mark.parametrize("tls, expected", [
    # helper-29: "a value of an unexpected type (TypeError)", "(None)", and the wrong key named.
    ({"client_auth_type": ["a"]}, "tls_server_config.client_auth_type: a list is not one of"),
    ({"min_version": ["TLS12"]}, "tls_server_config.min_version: a list is not one of TLS12, TLS13"),
    ({"cipher_suites": [{"a": 1}]}, "tls_server_config.cipher_suites: unknown"),
    ({"cert_file": "server.key", "key_file": "server.crt"}, "tls_server_config.cert_file: cannot load the certificate and key ("),
    ({"client_auth_type": "RequireAndVerifyClientCert", "client_ca": "not a PEM"}, "tls_server_config.client_ca: cannot load the CA"),
])
def test_a_tls_value_of_the_wrong_type_or_content_is_named(tmp_path, pki, tls, expected):
    from vllm_specdec_exporter.settings import ConfigError
    from vllm_specdec_exporter.webconfig.load import load_web_config
    files = {"cert_file": str(pki / "server.crt"), "key_file": str(pki / "server.key")}
    cfg = write_web_config(tmp_path / "web.yaml", pki, tls_server_config={
        **files, **{k: (str(pki / v) if k.endswith("_file") else v) for k, v in tls.items()}})
    with pytest.raises(ConfigError) as refused:
        load_web_config(str(cfg))
    assert expected in str(refused.value) and "None" not in str(refused.value), refused.value
