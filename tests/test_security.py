"""Security: TLS and basic auth (exporter-toolkit web config) with a real TLS client,
bearer tokens that never leak, request limits, targets only from configuration."""

from __future__ import annotations

import contextlib
import os
import shutil
import ssl
import subprocess
import time
import urllib.error
from pathlib import Path

import bcrypt
import pytest
import structlog
import structlog.testing
import yaml
from aiohttp import web
from conftest import run_cli
from http_fixtures import LoopbackServer, prom
from prom_harness import wait_for
from security_harness import Serve, bcrypt_hash, get, get_full, make_pki, start_exporter, tls_client, tls_status, write_web_config
from seed_records import render_dump
from vllm_specdec_exporter import poller

TOKEN = "sk-vllm-7f3c9e1d2b4a6085"


@pytest.fixture(scope="module")
def pki(tmp_path_factory) -> Path:
    return make_pki(tmp_path_factory.mktemp("pki"))


def web_config(tmp: Path, pki: Path, **tls_extra) -> Path:
    hashed = bcrypt.hashpw(b"s3cret-pw", bcrypt.gensalt(rounds=10)).decode().replace("$2b$", "$2y$")
    cfg = {"tls_server_config": {"cert_file": str(pki / "server.crt"), "key_file": str(pki / "server.key"), **tls_extra},
           "basic_auth_users": {"prometheus": hashed}}
    path = tmp / "web.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def test_tls_and_basic_auth_with_a_real_tls_client(tmp_path, pki):
    server = Serve("--vllm.url", "http://127.0.0.1:1/metrics", "--web.listen-address", "127.0.0.1:0",
                   "--web.config.file", str(web_config(tmp_path, pki)))
    ctx = ssl.create_default_context(cafile=str(pki / "ca.crt"))
    try:
        port = server.port()
        base = f"https://127.0.0.1:{port}"
        wait_for(lambda: server.proc.poll() is not None or get_ok(f"{base}/healthz", ctx), 30, "TLS /healthz")
        assert get(f"{base}/metrics", ctx)[0] == 401
        assert get(f"{base}/metrics", ctx, ("prometheus", "wrong"))[0] == 401
        assert get(f"{base}/metrics", ctx, ("nobody", "s3cret-pw"))[0] == 401
        status, body = get(f"{base}/metrics", ctx, ("prometheus", "s3cret-pw"))
        assert status == 200 and 'vllm_specdec_up{target="vllm"}' in body
        assert get(f"{base}/", ctx, ("prometheus", "s3cret-pw"))[0] == 200
        assert get(f"{base}/readyz", ctx)[0] == 200  # probes carry no password
        with pytest.raises(urllib.error.URLError) as refused:
            get(f"{base}/healthz", ssl.create_default_context())  # not our CA: refused by the client
        assert isinstance(refused.value.reason, ssl.SSLCertVerificationError)
        with pytest.raises((urllib.error.URLError, ConnectionError)):
            get(f"http://127.0.0.1:{port}/metrics")  # plain HTTP to the TLS port
    finally:
        logs = server.stop()
    assert server.proc.returncode == 0
    assert "s3cret-pw" not in logs


def get_ok(url: str, ctx) -> bool:
    try:
        return get(url, ctx)[0] == 200
    except (OSError, ssl.SSLError):
        return False


def test_client_certificates_when_required(tmp_path, pki):
    cfg = web_config(tmp_path, pki, client_auth_type="RequireAndVerifyClientCert", client_ca_file=str(pki / "ca.crt"))
    server = Serve("--vllm.url", "http://127.0.0.1:1/metrics", "--web.listen-address", "127.0.0.1:0",
                   "--web.config.file", str(cfg))
    with_cert = ssl.create_default_context(cafile=str(pki / "ca.crt"))
    with_cert.load_cert_chain(str(pki / "client.crt"), str(pki / "client.key"))
    without = ssl.create_default_context(cafile=str(pki / "ca.crt"))
    try:
        port = server.port()
        wait_for(lambda: get_ok(f"https://127.0.0.1:{port}/healthz", with_cert), 30, "mTLS /healthz")
        with pytest.raises((ssl.SSLError, urllib.error.URLError, ConnectionError)):
            get(f"https://127.0.0.1:{port}/healthz", without)
        assert get(f"https://127.0.0.1:{port}/metrics", with_cert, ("prometheus", "s3cret-pw"))[0] == 200
    finally:
        server.stop()


@pytest.mark.parametrize("content, expected", [
    ({"basic_auth_users": {"prometheus": "plaintext"}}, "config: basic_auth_users.prometheus: must be a bcrypt hash"),
    # Found attacking the config: bcrypt refused these salts at each request (HTTP 500); a cost of 31 hashed for days.
    ({"basic_auth_users": {"p": "$2b$10$4oRdDNl6OKa05+/GxdDBruo1s1BQqbHKy34xbvff082mjVEiX5eKO"}}, "basic_auth_users.p: must be a bcrypt hash"),
    ({"basic_auth_users": {"p": "$2b$10$4oRdDNl6OKa05E/GxdDBrzo1s1BQqbHKy34xbvff082mjVEiX5eKO"}}, "basic_auth_users.p: must be a bcrypt hash"),
    ({"basic_auth_users": {"p": "$2b$31$4oRdDNl6OKa05E/GxdDBruo1s1BQqbHKy34xbvff082mjVEiX5eKO"}}, "p: bcrypt cost '31' outside 4-17"),
    ({"basic_auth_users": {"p": "$2b$03$4oRdDNl6OKa05E/GxdDBruo1s1BQqbHKy34xbvff082mjVEiX5eKO"}}, "p: bcrypt cost '03' outside 4-17"),
    ({"tls_server_config": {"cert_file": "/no/cert.pem", "key_file": "/no/key.pem"}},
     "config: tls_server_config.cert_file: no such file: /no/cert.pem"),
    ({"tls_server_config": {"cert_file": "x", "key_file": "y", "min_version": "TLS10"}},
     "config: tls_server_config.min_version: 'TLS10' is not one of TLS12, TLS13"),
    ({"tls_config": {}}, "config: web config tls_config: unknown key"),
])
def test_web_config_errors_exit_2_naming_the_key(tmp_path, content, expected):
    path = tmp_path / "web.yaml"
    path.write_text(yaml.safe_dump(content))
    proc = run_cli("serve", "--vllm.url", "http://127.0.0.1:1/m", "--web.config.file", str(path))
    assert proc.returncode == 2
    assert expected in proc.stderr.decode(), proc.stderr


def test_bearer_token_reaches_vllm_and_never_leaks(tmp_path):
    (tmp_path / "token").write_text(TOKEN + "\n")
    os.chmod(tmp_path / "token", 0o400)
    dumps = [render_dump({"drafts": 100 * (i + 1), "draft_tokens": 200 * (i + 1), "accepted": 150 * (i + 1),
                          "per_pos": [90 * (i + 1), 60 * (i + 1)]}) for i in range(1000)]
    seen = []

    def handler(n):
        seen.append(n)
        return prom(dumps[min(n, 999)])

    class Guarded(LoopbackServer):
        async def _handle(self, request):
            if request.headers.get("Authorization") != f"Bearer {TOKEN}":
                return web.Response(status=401, text=f"bad token {request.headers.get('Authorization')}")
            return await super()._handle(request)

    with Guarded(handler) as vllm:
        config = tmp_path / "c.yaml"
        config.write_text(yaml.safe_dump({
            "targets": [{"name": "secure", "url": vllm.url, "bearer_token_file": str(tmp_path / "token")},
                        {"name": "no-token", "url": vllm.url}],
            "web": {"listen_address": "127.0.0.1:0"}, "poll": {"interval": "1s"}, "log": {"level": "debug"}}))
        server = Serve("--config.file", str(config))
        try:
            base = f"http://127.0.0.1:{server.port()}"
            wait_for(lambda: get_ok(f"{base}/healthz", None) and
                     'vllm_specdec_up{target="secure"} 1.0' in get(f"{base}/metrics")[1], 30, "an authorised poll")
            refused = 'vllm_specdec_exporter_polls_total{result="http_error",target="no-token"}'
            wait_for(lambda: refused in get(f"{base}/metrics")[1], 10, "the unauthorised poll to be counted", step=0.1)
            metrics = get(f"{base}/metrics")[1]
            assert refused in metrics
            page = get(f"{base}/")[1]
            summary = get(f"{base}/api/v1/summary?window=1m")[1]
        finally:
            logs = server.stop()
    assert "answered HTTP 401" in logs  # the failure is reported ...
    for text in (logs, metrics, page, summary):
        assert TOKEN not in text  # ... but the token never appears


def test_a_bad_bearer_token_file_fails_its_polls_and_stalls_nothing(tmp_path):
    """A FIFO, a file over MAX_BEARER_TOKEN_BYTES and a two-line token: each poll of those targets
    fails with a line naming the file, while /healthz answers and the good target is polled (the
    FIFO's open blocked the event loop: the port never opened; a 300 MB file held it minutes)."""
    os.mkfifo(tmp_path / "fifo")
    (tmp_path / "big").write_bytes(b"x" * (poller.MAX_BEARER_TOKEN_BYTES + 1))
    (tmp_path / "two-lines").write_text(TOKEN + "\nX-Injected: 1\n")
    (tmp_path / "token").write_text(TOKEN + "\n")
    with LoopbackServer(lambda n: prom(render_dump({"drafts": 100 * (n + 1), "draft_tokens": 200 * (n + 1),
                                                    "accepted": 150 * (n + 1), "per_pos": [90 * (n + 1), 60 * (n + 1)]}))) as vllm:
        cfg = tmp_path / "c.yaml"
        cfg.write_text(yaml.safe_dump({
            "targets": [{"name": name, "url": vllm.url, "bearer_token_file": str(tmp_path / name)}
                        for name in ("fifo", "big", "two-lines", "token")],
            "web": {"listen_address": "127.0.0.1:0"}, "poll": {"interval": "1s"}}))
        server = Serve("--config.file", str(cfg))
        try:
            base = f"http://127.0.0.1:{server.port()}"
            wait_for(lambda: 'vllm_specdec_up{target="token"} 1.0' in get(f"{base}/metrics")[1], 30, "the good target")
            failed = [f'vllm_specdec_exporter_polls_total{{result="error",target="{t}"}}' for t in ("fifo", "big", "two-lines")]
            wait_for(lambda: all(f in get(f"{base}/metrics")[1] for f in failed), 10, "the bad token files' polls")
            assert get_ok(f"{base}/healthz", None)
        finally:
            logs = server.stop()
    assert "is not a regular file (a FIFO)" in logs and f"is larger than {poller.MAX_BEARER_TOKEN_BYTES:,} bytes" in logs
    assert "not one line of printable UTF-8" in logs and TOKEN not in logs and "Traceback" not in logs


@contextlib.contextmanager
def plain_exporter():
    """`serve` on plain HTTP with one unreachable target; yields its base URL once /healthz answers."""
    server = Serve("--vllm.url", "http://127.0.0.1:1/metrics", "--web.listen-address", "127.0.0.1:0")
    try:
        base = f"http://127.0.0.1:{server.port()}"
        wait_for(lambda: get_ok(f"{base}/healthz", None), 30, "/healthz")
        yield base
    finally:
        server.stop()


def test_oversized_request_headers_are_refused_and_the_exporter_goes_on():
    with plain_exporter() as base:
        status, _ = get(f"{base}/metrics", headers={"X-Junk": "a" * 100_000})
        assert status in (400, 431)
        status, _ = get(f"{base}/metrics?" + "q=" + "b" * 20_000)
        assert status in (400, 414)
        assert get(f"{base}/metrics")[0] == 200


def test_targets_come_only_from_configuration():
    """No endpoint takes a target: /metrics and the summary ignore any URL a client passes."""
    with plain_exporter() as base:
        body = get(f"{base}/metrics?target=http://169.254.169.254/&url=http://example.com/")[1]
        assert "169.254" not in body and "example.com" not in body
        assert sorted(set(line.split('target="')[1].split('"')[0] for line in body.splitlines()
                          if 'target="' in line)) == ["vllm"]
        assert get(f"{base}/probe?target=http://127.0.0.1:1/")[0] == 404


# --- exporter-toolkit semantics, key by key (each against a real TLS client) ---------

# What Go's crypto/tls (and so exporter-toolkit) does for each client_auth_type, for a
# client with no certificate, with one from the CA, and with a self-signed one.
CLIENT_AUTH_MATRIX = {
    "NoClientCert": {None: 200, "client": 200, "selfsigned": 200},
    "VerifyClientCertIfGiven": {None: 200, "client": 200, "selfsigned": "refused"},
    "RequireAndVerifyClientCert": {None: "refused", "client": 200, "selfsigned": "refused"},
}
# The modes that accept a certificate unverified: Python's ssl has no supported API for
# them (it verifies every certificate it asks for), so they are refused, naming what to use.
REFUSED_CLIENT_AUTH = {
    "RequestClientCert": "VerifyClientCertIfGiven",
    "RequireAnyClientCert": "RequireAndVerifyClientCert",
    "RequireClientCert": "RequireAndVerifyClientCert",
}


@pytest.mark.parametrize("mode", CLIENT_AUTH_MATRIX)
def test_every_client_auth_type_behaves_as_in_exporter_toolkit(tmp_path, pki, mode):
    """The verify modes check a presented certificate against client_ca_file."""
    tls = {"client_auth_type": mode}
    if "Verify" in mode:
        tls["client_ca_file"] = str(pki / "ca.crt")
    cfg = write_web_config(tmp_path / "web.yaml", pki, tls_server_config=tls)
    server, port = _start_mtls(cfg, pki) if mode.startswith("Require") else \
        start_exporter("--web.config.file", str(cfg), tls_ca=pki / "ca.crt")
    try:
        seen = {cert: tls_status(port, tls_client(pki, cert)) for cert in (None, "client", "selfsigned")}
    finally:
        server.stop()
    assert seen == CLIENT_AUTH_MATRIX[mode]


@pytest.mark.parametrize("mode", REFUSED_CLIENT_AUTH)
def test_unverified_client_auth_modes_are_refused_at_start_in_one_line(tmp_path, pki, mode):
    """exit 2 and one stderr line naming the mode and what to use instead; the refusal
    comes from the config check, never from anything that touches OpenSSL's memory."""
    cfg = write_web_config(tmp_path / "web.yaml", pki, tls_server_config={
        "client_auth_type": mode, "client_ca_file": str(pki / "ca.crt")})
    proc = run_cli("serve", "--vllm.url", "http://127.0.0.1:1/m", "--web.config.file", str(cfg))
    err = proc.stderr.decode()
    assert proc.returncode == 2, err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1, err
    assert lines[0].startswith("vllm-specdec-exporter: error: config: tls_server_config.client_auth_type: "
                               + mode + " "), lines[0]
    assert f"use {REFUSED_CLIENT_AUTH[mode]} with client_ca_file" in lines[0], lines[0]
    assert "Traceback" not in err and "Segmentation" not in err


@pytest.mark.parametrize("mode", REFUSED_CLIENT_AUTH)
def test_a_reload_to_an_unverified_client_auth_mode_keeps_the_last_good_config(tmp_path, pki, mode):
    from vllm_specdec_exporter.webconfig.reload import LiveWebConfig

    good = {"client_auth_type": "VerifyClientCertIfGiven", "client_ca_file": str(pki / "ca.crt")}
    path = write_web_config(tmp_path / "web.yaml", pki, tls_server_config=good)
    clock = [0.0]
    live = LiveWebConfig(str(path), mono=lambda: clock[0])
    before = live.config
    write_web_config(path, pki, tls_server_config={**good, "client_auth_type": mode})
    clock[0] += 10
    with structlog.testing.capture_logs() as logs:
        assert live.current() is before  # no running loop: loaded in place, and refused
    assert live.last_reload_ok is False and live.reload_failures == 1
    assert before.client_auth == "VerifyClientCertIfGiven"
    assert before.ssl_context is not None and before.ssl_context.verify_mode == ssl.CERT_OPTIONAL
    assert [(r["event"], r["log_level"]) for r in logs] == [("web_config_reload_failed", "error")]
    error = logs[0]["error"]
    assert "\n" not in error and f"tls_server_config.client_auth_type: {mode}" in error, error
    assert f"use {REFUSED_CLIENT_AUTH[mode]}" in error, error


def _start_mtls(cfg: Path, pki: Path):
    server = Serve("--vllm.url", "http://127.0.0.1:1/m", "--web.listen-address", "127.0.0.1:0",
                   "--web.config.file", str(cfg))
    try:
        port = server.port()
        wait_for(lambda: server.proc.poll() is not None or tls_status(port, tls_client(pki, "client")) == 200, 30,
                 "TLS /healthz with a client certificate", step=0.1)
        assert server.proc.poll() is None, server.stop()
    except BaseException:
        server.stop()
        raise
    return server, port


def test_min_and_max_version(tmp_path, pki):
    cfg = write_web_config(tmp_path / "web.yaml", pki, tls_server_config={"max_version": "TLS12"})
    server, port = start_exporter("--web.config.file", str(cfg), tls_ca=pki / "ca.crt")
    try:
        assert tls_status(port, tls_client(pki, minimum_version=ssl.TLSVersion.TLSv1_3)) == "refused"
        ctx = tls_client(pki, maximum_version=ssl.TLSVersion.TLSv1_2)
        assert tls_status(port, ctx) == 200
    finally:
        server.stop()
    write_web_config(tmp_path / "web.yaml", pki, tls_server_config={"min_version": "TLS13"})
    server, port = start_exporter("--web.config.file", str(cfg), tls_ca=pki / "ca.crt")
    try:
        assert tls_status(port, tls_client(pki, maximum_version=ssl.TLSVersion.TLSv1_2)) == "refused"
        assert tls_status(port, tls_client(pki, minimum_version=ssl.TLSVersion.TLSv1_3)) == 200
    finally:
        server.stop()


def s_client(port: int, *args: str) -> str:
    exe = shutil.which("openssl")
    proc = subprocess.run([exe, "s_client", "-connect", f"127.0.0.1:{port}", "-brief", *args],
                          input=b"GET /healthz HTTP/1.0\r\n\r\n", capture_output=True, timeout=30)
    return (proc.stdout + proc.stderr).decode()


def test_cipher_suites_and_curve_preferences(tmp_path, pki):
    cfg = write_web_config(tmp_path / "web.yaml", pki, tls_server_config={
        "max_version": "TLS12", "cipher_suites": ["TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384"],
        "curve_preferences": ["CurveP384"]})
    server, port = start_exporter("--web.config.file", str(cfg), tls_ca=pki / "ca.crt")
    try:
        out = s_client(port, "-tls1_2")
        assert "Ciphersuite: ECDHE-RSA-AES256-GCM-SHA384" in out and "Server Temp Key: ECDH, secp384r1" in out, out
        # A client that offers neither the cipher nor the curve gets no handshake.
        assert "CONNECTION ESTABLISHED" not in s_client(port, "-tls1_2", "-cipher", "ECDHE-RSA-AES128-GCM-SHA256")
        out = s_client(port, "-tls1_2", "-groups", "X25519")
        assert "CONNECTION ESTABLISHED" not in out and "secp384r1" not in out, out
        assert "CONNECTION ESTABLISHED" in s_client(port, "-tls1_2", "-groups", "P-384")
    finally:
        server.stop()


def test_http_server_config_headers_on_every_response(tmp_path, pki):
    cfg = write_web_config(tmp_path / "web.yaml", pki, users={"prometheus": bcrypt_hash("pw", 4)},
                           http_server_config={"headers": {"X-Frame-Options": "deny",
                                                           "X-Content-Type-Options": "nosniff",
                                                           "Strict-Transport-Security": "max-age=31536000"}})
    server, port = start_exporter("--web.config.file", str(cfg), tls_ca=pki / "ca.crt")
    ctx = tls_client(pki)
    base = f"https://127.0.0.1:{port}"
    try:
        for path, auth, status in (("/metrics", ("prometheus", "pw"), 200), ("/metrics", None, 401),
                                   ("/healthz", None, 200), ("/nope", ("prometheus", "pw"), 404)):
            got, headers, _ = get_full(base + path, ctx, auth)
            assert got == status
            assert headers.get("X-Frame-Options") == "deny", (path, headers)
            assert headers.get("X-Content-Type-Options") == "nosniff"
            assert headers.get("Strict-Transport-Security") == "max-age=31536000"
    finally:
        server.stop()


def test_rate_limit_answers_429_beyond_the_burst_and_never_limits_probes(tmp_path):
    cfg = write_web_config(tmp_path / "web.yaml", rate_limit={"interval": "1h", "burst": 2})
    server, port = start_exporter("--web.config.file", str(cfg))
    base = f"http://127.0.0.1:{port}"
    try:
        assert [get(f"{base}/metrics")[0] for _ in range(3)] == [200, 200, 429]
        assert all(get(f"{base}/healthz")[0] == 200 for _ in range(5))
    finally:
        server.stop()


def test_client_allowed_sans(tmp_path, pki):
    cfg = write_web_config(tmp_path / "web.yaml", pki, tls_server_config={
        "client_auth_type": "RequireAndVerifyClientCert", "client_ca_file": str(pki / "ca.crt"),
        "client_allowed_sans": ["prometheus.monitoring"]})
    server, port = _start_mtls(cfg, pki)
    try:
        assert tls_status(port, tls_client(pki, "client")) == 200
        assert tls_status(port, tls_client(pki, "client2")) == "refused"  # from the CA, but not an allowed SAN
    finally:
        server.stop()


@pytest.mark.parametrize("content, expected", [
    ({"http_server_config": {"headers": {"Content-Type": "foo"}}},
     "config: http_server_config.headers.Content-Type: cannot be configured"),
    ({"http_server_config": {"headers": {"X-Frame-Options": "foo"}}},
     "config: http_server_config.headers.X-Frame-Options: 'foo' is not one of deny, sameorigin"),
    ({"http_server_config": {"http2": True}}, "config: http_server_config.http2: this exporter serves HTTP/1.1 only"),
    ({"http_server_config": {"keepalive": 1}}, "config: http_server_config.keepalive: unknown key"),
    ({"tls_server_config": {"cert": "PEM", "key": "PEM"}}, "config: tls_server_config.cert: unknown or unsupported"),
    ({"tls_server_config": {"cert_file": "{crt}", "key_file": "{key}", "max_version": "TLS11"}},
     "config: tls_server_config.max_version: 'TLS11' is not one of TLS12, TLS13"),
    ({"tls_server_config": {"cert_file": "{crt}", "key_file": "{key}", "cipher_suites": ["TLS_RSA_WITH_RC4_128_SHA"]}},
     "config: tls_server_config.cipher_suites: unknown 'TLS_RSA_WITH_RC4_128_SHA'"),
    ({"tls_server_config": {"cert_file": "{crt}", "key_file": "{key}", "curve_preferences": ["CurveP224"]}},
     "config: tls_server_config.curve_preferences: unknown 'CurveP224'"),
    ({"tls_server_config": {"cert_file": "{crt}", "key_file": "{key}", "curve_preferences": ["X25519", "CurveP256"]}},
     "config: tls_server_config.curve_preferences: 2 curves listed: Python's ssl module sets one curve"),
    ({"tls_server_config": {"cert_file": "{crt}", "key_file": "{key}", "client_auth_type": "RequestClientCert"}},
     "config: tls_server_config.client_auth_type: RequestClientCert (accept a client certificate without verifying "
     "it) cannot be honoured"),
    ({"tls_server_config": {"cert_file": "{crt}", "key_file": "{key}", "client_ca_file": "{ca}"}},
     "config: tls_server_config.client_ca_file: set without a client_auth_type"),
    ({"tls_server_config": {"cert_file": "{crt}", "key_file": "{key}", "client_auth_type": "VerifyClientCertIfGiven"}},
     "config: tls_server_config.client_ca_file: required with client_auth_type VerifyClientCertIfGiven"),
    ({"tls_server_config": {"cert_file": "{crt}", "key_file": "{key}", "min_version": "TLS13", "max_version": "TLS12"}},
     "config: tls_server_config.min_version: is above max_version"),
    ({"rate_limit": {"interval": "fast", "burst": 1}}, "config: rate_limit.interval:"),
    ({"tls_server_config": {"cert_file": "{crt}", "key_file": "{key}", "cipher_suites": [[1]]}},
     "config: tls_server_config.cipher_suites: unknown a list (valid: "),  # one line naming it, never a traceback
])
def test_keys_that_cannot_be_honoured_are_errors_naming_them(tmp_path, pki, content, expected):
    text = yaml.safe_dump(content).replace("'{crt}'", str(pki / "server.crt")).replace(
        "'{key}'", str(pki / "server.key")).replace("'{ca}'", str(pki / "ca.crt"))
    path = tmp_path / "web.yaml"
    path.write_text(text)
    proc = run_cli("serve", "--vllm.url", "http://127.0.0.1:1/m", "--web.config.file", str(path))
    assert proc.returncode == 2
    assert expected in proc.stderr.decode(), proc.stderr


def peer_cn(port: int, ctx: ssl.SSLContext) -> str:
    import socket
    with socket.create_connection(("127.0.0.1", port), timeout=10) as raw, \
            ctx.wrap_socket(raw, server_hostname="127.0.0.1") as s:
        return dict(x[0] for x in s.getpeercert()["subject"])["commonName"]


@pytest.mark.long
def test_certificates_and_config_are_reread_without_restart_or_dropping_connections(tmp_path, pki):
    """cert-manager rotates the Secret (files swapped atomically): new connections get the
    new certificate, an open keep-alive connection goes on; then the config itself
    changes (basic auth added, client certificates required); a broken edit keeps the
    last good config."""
    import http.client

    live = tmp_path / "live"
    live.mkdir()
    for ext in ("crt", "key"):
        shutil.copy(pki / f"server.{ext}", live / f"tls.{ext}")
    cfg = tmp_path / "web.yaml"
    tls = {"cert_file": str(live / "tls.crt"), "key_file": str(live / "tls.key")}
    write_web_config(cfg, tls_server_config=tls)
    server, port = start_exporter("--web.config.file", str(cfg), tls_ca=pki / "ca.crt")
    ctx = tls_client(pki)
    try:
        kept = http.client.HTTPSConnection("127.0.0.1", port, context=ctx, timeout=10)
        kept.request("GET", "/healthz")
        assert kept.getresponse().read() == b"ok\n"
        assert peer_cn(port, ctx) == "server"
        for ext in ("crt", "key"):  # rotate: write aside, then rename over (what kubelet does via ..data)
            shutil.copy(pki / f"server-b.{ext}", live / f"new.{ext}")
        os.replace(live / "new.key", live / "tls.key")
        os.replace(live / "new.crt", live / "tls.crt")
        wait_for(lambda: peer_cn(port, ctx) == "server-b", 15, "the rotated certificate", step=0.2)
        kept.request("GET", "/healthz")  # the connection opened before the rotation still works
        assert kept.getresponse().read() == b"ok\n"
        assert dict(x[0] for x in kept.sock.getpeercert()["subject"])["commonName"] == "server"

        write_web_config(cfg, users={"prometheus": bcrypt_hash("pw", 4)}, tls_server_config=tls)
        wait_for(lambda: get(f"https://127.0.0.1:{port}/metrics", ctx)[0] == 401, 15, "basic auth from the new config",
                 step=0.2)
        assert get(f"https://127.0.0.1:{port}/metrics", ctx, ("prometheus", "pw"))[0] == 200

        cfg.write_text("tls_server_config: [this is: not valid")  # a broken edit
        time.sleep(1.5)  # the config is looked at once a second; nothing must change
        assert get(f"https://127.0.0.1:{port}/metrics", ctx)[0] == 401
        assert get(f"https://127.0.0.1:{port}/metrics", ctx, ("prometheus", "pw"))[0] == 200

        write_web_config(cfg, users={"prometheus": bcrypt_hash("pw", 4)},  # dropping the users would be refused
                         tls_server_config={**tls, "client_auth_type": "RequireAndVerifyClientCert",
                                            "client_ca_file": str(pki / "ca.crt")})
        wait_for(lambda: tls_status(port, ctx) == "refused", 15, "client certificates required", step=0.2)
        assert tls_status(port, tls_client(pki, "client")) == 200
        kept.request("GET", "/healthz")
        assert kept.getresponse().read() == b"ok\n"
        kept.close()
    finally:
        logs = server.stop()
    assert logs.count("web_config_reload_failed") == 1, logs
    assert "web_config_reloaded" in logs
