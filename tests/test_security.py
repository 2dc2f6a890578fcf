"""Security: TLS and basic auth (exporter-toolkit web config) with a real TLS client,
bearer tokens that never leak, request limits, targets only from configuration."""

from __future__ import annotations

import base64
import contextlib
import os
import shutil
import signal
import ssl
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

import bcrypt
import pytest
import yaml
from aiohttp import web

from conftest import cli_path, require, run_cli
from http_fixtures import LoopbackServer, prom
from prom_harness import free_port, wait_for
from seed_records import render_dump

TOKEN = "sk-vllm-7f3c9e1d2b4a6085"


def openssl(*args: str, cwd: Path) -> None:
    exe = shutil.which("openssl")
    require(exe is not None, "openssl")
    subprocess.run([exe, *args], cwd=cwd, check=True, capture_output=True, timeout=60)


@pytest.fixture(scope="module")
def pki(tmp_path_factory) -> Path:
    """A throw-away CA, a server certificate for 127.0.0.1 and a client certificate."""
    d = tmp_path_factory.mktemp("pki")
    openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.crt", "-days", "2",
            "-subj", "/CN=test-ca", cwd=d)
    (d / "san.ext").write_text("subjectAltName=IP:127.0.0.1\n")
    for name in ("server", "client"):
        openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{name}.key", "-out", f"{name}.csr",
                "-subj", f"/CN={name}", cwd=d)
        openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial",
                "-out", f"{name}.crt", "-days", "2", *(["-extfile", "san.ext"] if name == "server" else []), cwd=d)
    return d


class Serve:
    def __init__(self, *args: str, env: dict | None = None):
        self.proc = subprocess.Popen([cli_path(), "serve", "--log.format", "json", *args],
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, env={**os.environ, **(env or {})})

    def stop(self) -> str:
        self.proc.send_signal(signal.SIGTERM)
        try:
            out, err = self.proc.communicate(timeout=15)
        finally:
            self.proc.kill()
        return (out + err).decode()


def get(url: str, context: ssl.SSLContext | None = None, auth: tuple[str, str] | None = None,
        headers: dict | None = None) -> tuple[int, str]:
    req = urllib.request.Request(url, headers=headers or {})
    if auth:
        req.add_header("Authorization", "Basic " + base64.b64encode(f"{auth[0]}:{auth[1]}".encode()).decode())
    try:
        with urllib.request.urlopen(req, timeout=10, context=context) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def web_config(tmp: Path, pki: Path, **tls_extra) -> Path:
    hashed = bcrypt.hashpw(b"s3cret-pw", bcrypt.gensalt(rounds=10)).decode().replace("$2b$", "$2y$")
    cfg = {"tls_server_config": {"cert_file": str(pki / "server.crt"), "key_file": str(pki / "server.key"), **tls_extra},
           "basic_auth_users": {"prometheus": hashed}}
    path = tmp / "web.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def test_tls_and_basic_auth_with_a_real_tls_client(tmp_path, pki):
    port = free_port()
    server = Serve("--vllm.url", "http://127.0.0.1:1/metrics", "--web.listen-address", f"127.0.0.1:{port}",
                   "--web.config.file", str(web_config(tmp_path, pki)))
    ctx = ssl.create_default_context(cafile=str(pki / "ca.crt"))
    base = f"https://127.0.0.1:{port}"
    try:
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
    port = free_port()
    cfg = web_config(tmp_path, pki, client_auth_type="RequireAndVerifyClientCert", client_ca_file=str(pki / "ca.crt"))
    server = Serve("--vllm.url", "http://127.0.0.1:1/metrics", "--web.listen-address", f"127.0.0.1:{port}",
                   "--web.config.file", str(cfg))
    with_cert = ssl.create_default_context(cafile=str(pki / "ca.crt"))
    with_cert.load_cert_chain(str(pki / "client.crt"), str(pki / "client.key"))
    without = ssl.create_default_context(cafile=str(pki / "ca.crt"))
    try:
        wait_for(lambda: get_ok(f"https://127.0.0.1:{port}/healthz", with_cert), 30, "mTLS /healthz")
        with pytest.raises((ssl.SSLError, urllib.error.URLError, ConnectionError)):
            get(f"https://127.0.0.1:{port}/healthz", without)
        assert get(f"https://127.0.0.1:{port}/metrics", with_cert, ("prometheus", "s3cret-pw"))[0] == 200
    finally:
        server.stop()


@pytest.mark.parametrize("content, expected", [
    ({"basic_auth_users": {"prometheus": "plaintext"}}, "config: basic_auth_users.prometheus: must be a bcrypt hash"),
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

    port = free_port()
    with Guarded(handler) as vllm:
        config = tmp_path / "c.yaml"
        config.write_text(yaml.safe_dump({
            "targets": [{"name": "secure", "url": vllm.url, "bearer_token_file": str(tmp_path / "token")},
                        {"name": "no-token", "url": vllm.url}],
            "listen_address": f"127.0.0.1:{port}", "poll": {"interval": "1s"}, "log": {"level": "debug"}}))
        server = Serve("--config.file", str(config))
        try:
            base = f"http://127.0.0.1:{port}"
            wait_for(lambda: get_ok(f"{base}/healthz", None) and
                     'vllm_specdec_up{target="secure"} 1.0' in get(f"{base}/metrics")[1], 30, "an authorised poll")
            time.sleep(1.5)
            metrics = get(f"{base}/metrics")[1]
            assert 'vllm_specdec_exporter_polls_total{result="http_error",target="no-token"}' in metrics
            page = get(f"{base}/")[1]
            summary = get(f"{base}/api/v1/summary?window=1m")[1]
        finally:
            logs = server.stop()
    assert "answered HTTP 401" in logs  # the failure is reported ...
    for text in (logs, metrics, page, summary):
        assert TOKEN not in text  # ... but the token never appears


@contextlib.contextmanager
def plain_exporter():
    """`serve` on plain HTTP with one unreachable target; yields its base URL once /healthz answers."""
    port = free_port()
    server = Serve("--vllm.url", "http://127.0.0.1:1/metrics", "--web.listen-address", f"127.0.0.1:{port}")
    base = f"http://127.0.0.1:{port}"
    try:
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
