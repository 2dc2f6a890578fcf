"""Shared pieces of the security tests: a throw-away PKI made with the real openssl,
the real exporter as a subprocess, a raw TLS client, latency percentiles."""

from __future__ import annotations

import base64
import json
import os
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import bcrypt
import yaml
from conftest import cli_path, require, run_cli
from prom_harness import listening_port, wait_for


def openssl(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    exe = shutil.which("openssl")
    require(exe is not None, "openssl")
    return subprocess.run([exe, *args], cwd=cwd, check=True, capture_output=True, timeout=60)


def make_pki(d: Path) -> Path:
    """A CA; server certificates for 127.0.0.1 (server, and server-b for rotation); a
    client certificate with SAN DNS:prometheus.monitoring, one (client2) without it,
    both from the CA; and a self-signed client certificate the CA never saw."""
    openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.crt", "-days", "2",
            "-subj", "/CN=test-ca", cwd=d)
    (d / "server.ext").write_text("subjectAltName=IP:127.0.0.1\n")
    (d / "client.ext").write_text("subjectAltName=DNS:prometheus.monitoring\n")
    (d / "client2.ext").write_text("subjectAltName=DNS:somebody.else\n")
    for name, ext in (("server", "server"), ("server-b", "server"), ("client", "client"), ("client2", "client2")):
        openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{name}.key", "-out", f"{name}.csr",
                "-subj", f"/CN={name}", cwd=d)
        openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial",
                "-out", f"{name}.crt", "-days", "2", "-extfile", f"{ext}.ext", cwd=d)
    openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "selfsigned.key", "-out", "selfsigned.crt",
            "-days", "2", "-subj", "/CN=selfsigned", "-addext", "subjectAltName=DNS:prometheus.monitoring", cwd=d)
    return d


def bcrypt_hash(password: str, rounds: int = 10) -> str:
    return bcrypt.hashpw(password.encode(), bcrypt.gensalt(rounds=rounds)).decode().replace("$2b$", "$2y$")


def write_web_config(path: Path, pki: Path | None = None, users: dict | None = None, **extra) -> Path:
    cfg: dict = dict(extra)
    if pki is not None:
        cfg["tls_server_config"] = {"cert_file": str(pki / "server.crt"), "key_file": str(pki / "server.key"),
                                    **cfg.get("tls_server_config", {})}
    if users:
        cfg["basic_auth_users"] = users
    tmp = path.with_suffix(".tmp")
    tmp.write_text(yaml.safe_dump(cfg))
    os.replace(tmp, path)  # atomic, as a ConfigMap update is
    return path


class Serve:
    """The real `serve` command; ``launcher`` runs it through ``python -c`` instead, to
    shrink a constant or the open-file limit for one test."""

    def __init__(self, *args: str, env: dict | None = None, launcher: str | None = None, preexec_fn=None):
        cmd = ([sys.executable, "-c", launcher, "serve"] if launcher else [cli_path(), "serve"])
        self.proc = subprocess.Popen([*cmd, "--log.format", "json", *args], stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, env={**os.environ, **(env or {})}, preexec_fn=preexec_fn)

    def stop(self) -> str:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            out, err = self.proc.communicate(timeout=20)
        finally:
            self.proc.kill()
        return (out + err).decode(errors="replace")

    def port(self) -> int:
        """The port it listens on (told 127.0.0.1:0), read back once it does."""
        def bound():
            if self.proc.poll() is not None:
                raise AssertionError(f"serve exited: {self.stop()}")
            return listening_port(self.proc)
        return wait_for(bound, 30, "serve to listen", step=0.05)


def start_exporter(*args: str, tls_ca: Path | None = None, **kw) -> tuple[Serve, int]:
    """`serve` on loopback port 0 with an unreachable target (unless args name targets);
    returns once /healthz answers, with the port it got."""
    targets = () if any(a in ("--vllm.url", "--config.file") for a in args) else ("--vllm.url", "http://127.0.0.1:1/m")
    server = Serve(*targets, "--web.listen-address", "127.0.0.1:0", *args, **kw)
    ctx = ssl.create_default_context(cafile=str(tls_ca)) if tls_ca else None
    scheme = "https" if tls_ca else "http"

    def up():
        if server.proc.poll() is not None:
            raise AssertionError(f"serve exited: {server.stop()}")
        try:
            return get(f"{scheme}://127.0.0.1:{port}/healthz", ctx)[0] == 200
        except OSError:
            return False
    try:
        port = server.port()
        wait_for(up, 30, "/healthz", step=0.1)
    except BaseException:
        server.stop()
        raise
    return server, port


def basic(user: str, password: str) -> str:
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()


def get(url: str, context: ssl.SSLContext | None = None, auth: tuple[str, str] | None = None,
        headers: dict | None = None, timeout: float = 10) -> tuple[int, str]:
    req = urllib.request.Request(url, headers=headers or {})
    if auth:
        req.add_header("Authorization", basic(*auth))
    try:
        with urllib.request.urlopen(req, timeout=timeout, context=context) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def get_full(url: str, context=None, auth=None, timeout: float = 10) -> tuple[int, dict, str]:
    req = urllib.request.Request(url)
    if auth:
        req.add_header("Authorization", basic(*auth))
    try:
        with urllib.request.urlopen(req, timeout=timeout, context=context) as resp:
            return resp.status, dict(resp.headers), resp.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, dict(e.headers), e.read().decode()


def tls_client(pki: Path, cert: str | None = None, **versions) -> ssl.SSLContext:
    ctx = ssl.create_default_context(cafile=str(pki / "ca.crt"))
    if cert:
        ctx.load_cert_chain(str(pki / f"{cert}.crt"), str(pki / f"{cert}.key"))
    for k, v in versions.items():
        setattr(ctx, k, v)
    return ctx


def tls_status(port: int, ctx: ssl.SSLContext, path: str = "/healthz") -> int | str:
    """One request over a fresh TLS connection: the HTTP status, or 'refused' when the
    server ends the handshake or the connection (with TLS 1.3 a refused client
    certificate shows on the first read, after the client's handshake is done)."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=10) as raw, \
                ctx.wrap_socket(raw, server_hostname="127.0.0.1") as s:
            s.sendall(f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n".encode())
            data = b""
            while chunk := s.recv(65536):
                data += chunk
    except (ssl.SSLError, ConnectionError, TimeoutError):
        return "refused"
    if not data.startswith(b"HTTP/1.1 "):
        return "refused"
    return int(data.split()[1])


def percentile(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(p / 100 * (len(ordered) - 1)))]



def timed_get(url: str, timeout: float = 5, **kw) -> float:
    started = time.perf_counter()
    status = get(url, timeout=timeout, **kw)[0]
    assert status == 200, status
    return time.perf_counter() - started


class Upstream:
    """A real aiohttp server on ``host`` (any 127/8 address) in a background thread:
    ``handler(request) -> web.Response`` (may be async) for every path; records the
    requests it saw."""

    def __init__(self, handler, host: str = "127.0.0.1"):
        import asyncio
        import threading
        self.handler, self.host = handler, host
        self.seen: list[tuple[str, dict]] = []
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self.port = 0

    async def _handle(self, request):
        import inspect
        self.seen.append((request.path_qs, dict(request.headers)))
        out = self.handler(request)
        return await out if inspect.isawaitable(out) else out

    def _run(self) -> None:
        import asyncio

        from aiohttp import web
        asyncio.set_event_loop(self._loop)
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self._handle)
        runner = web.AppRunner(app, access_log=None)
        self._loop.run_until_complete(runner.setup())
        site = web.TCPSite(runner, self.host, 0)
        self._loop.run_until_complete(site.start())
        self.port = site._server.sockets[0].getsockname()[1]
        self._ready.set()
        self._loop.run_forever()
        self._loop.run_until_complete(runner.cleanup())
        self._loop.close()

    def url(self, path: str = "/metrics", userinfo: str = "") -> str:
        return f"http://{userinfo + '@' if userinfo else ''}{self.host}:{self.port}{path}"

    def __enter__(self) -> Upstream:
        self._thread.start()
        assert self._ready.wait(10), "upstream did not start"
        return self

    def __exit__(self, *exc) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)


def log_events(logs: str, event: str) -> list[dict]:
    """The JSON log records of ``event`` in a server's output (other lines skipped)."""
    out = []
    for line in logs.splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if isinstance(record, dict) and record.get("event") == event:
            out.append(record)
    return out


# --- The web config tests' shared pieces ----------------------------------------------------

def serve_refuses(path, timeout: float = 20) -> str:
    """`serve` with the web config ``path`` must exit 2 (not hang, not serve); its stderr."""
    try:
        proc = run_cli("serve", "--vllm.url", "http://127.0.0.1:1/m", "--web.listen-address", "127.0.0.1:0",
                       "--web.config.file", str(path), timeout=timeout)
    except subprocess.TimeoutExpired:
        raise AssertionError(f"serve did not refuse {path} within {timeout:g} s") from None
    err = proc.stderr.decode()
    assert proc.returncode == 2, err
    assert len(err.strip().splitlines()) == 1, err  # one line, never a traceback
    return err


def laughs(levels: int, width: int = 9) -> str:
    """A billion-laughs web config: ``width ** levels`` strings from a few hundred bytes,
    in a header value, which the code before this fix turned into one string."""
    anchors = ["&l0 [" + ", ".join(["lol"] * width) + "]"]
    anchors += [f"&l{i} [" + ", ".join([f"*l{i - 1}"] * width) + "]" for i in range(1, levels)]
    return "http_server_config:\n  headers:\n    Content-Security-Policy: [" + ", ".join(anchors) + "]\n"
