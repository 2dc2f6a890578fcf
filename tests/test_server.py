"""server.py: the listening socket, built on aiohttp's and asyncio's internals (pinned here), and
what it does to slow and hostile clients (timeouts, the connection cap, running out of file
descriptors). Each section below keeps the docstring of the file it came from (issue 32).
"""

from __future__ import annotations

import ast
import asyncio
import contextlib
import http.client
import inspect
import multiprocessing
import re
import resource
import selectors
import socket
import ssl
import threading
import time
import tomllib
import urllib.request
from collections.abc import Awaitable, Callable
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web
from conftest import REPO
from prom_harness import wait_for
from security_harness import get, percentile, start_exporter, timed_get
from vllm_specdec_exporter import config, server
from vllm_specdec_exporter.parser import parse

# ---- from test_internals_pinned.py
# aiohttp's and asyncio's internals the server builds on, pinned.
#
# server.py takes each connection itself (TLS chosen per connection, a header timeout, a
# connection cap) and hands it to aiohttp's request handler once its first request's
# headers are in; no public aiohttp API does that. It relies on what is listed in
# INTERNALS. They were written against aiohttp AIOHTTP_WRITTEN_AGAINST (pyproject.toml
# bounds aiohttp below the next minor; requirements.lock pins one release of it). When
# aiohttp changes, the version test fails first, naming every internal to re-check; each
# internal also has a test of its own that names it when it breaks.
#
# To move to a new aiohttp: install it, run this file, fix what it names, then update
# AIOHTTP_WRITTEN_AGAINST, the bound in pyproject.toml and requirements.lock (pip-compile).


AIOHTTP_WRITTEN_AGAINST = "3.14"  # major.minor
PACKAGE = REPO / "exporter" / "vllm_specdec_exporter"
# Files that subclass or reach into aiohttp/asyncio server machinery.
GUARDED_FILES = ("server.py", "web.py")

# internal -> where and why it is used
INTERNALS = {
    "aiohttp.web.BaseSite._runner": "server.py _Watch.data_received: self.site._runner.server builds aiohttp's "
                                    "request handler for a connection once its first headers are in",
    "aiohttp.web.BaseSite._server": "server.py GuardedSite.start stores its asyncio server there, so that "
                                    "BaseSite.stop() (and runner.cleanup()) closes the listening socket",
    "aiohttp.web.BaseSite._backlog": "server.py GuardedSite.start re-listens with the configured backlog",
    "aiohttp.web.BaseSite.start/stop": "server.py GuardedSite calls super().start()/stop() to register the site "
                                       "with its runner (runner.sites, cleanup)",
    "aiohttp.web_server.Server() -> RequestHandler": "server.py: runner.server() builds an asyncio.Protocol fed "
                                                     "connection_made/data_received/eof_received/connection_lost/"
                                                     "pause_writing/resume_writing by _Watch",
    "asyncio.sslproto.SSLProtocol": "server.py _TLS: asyncio's TLS layer (not exported by asyncio), built with "
                                    "(loop, app_protocol, sslcontext, waiter, server_side=, ssl_handshake_timeout=); "
                                    "its buffer_updated (a BufferedProtocol) sees the handshake's bytes",
    "aiohttp.web_protocol.RequestHandler._waiter/_messages": "server.py _Watch.idle: a connection is between "
                                                             "requests when start() awaits _waiter, none queued "
                                                             "(the connection cap closes those first)",
    "aiohttp.web_log.AccessLogger": "web.py: the runner's access_log_class (not exported by aiohttp.web)",
    "aiohttp.web_protocol.RequestHandler(logger=)": "web.py serve: the runner's logger is server.RequestLog; aiohttp "
                                                     "calls its exception(msg, remote, exc_info=exc) for a request it "
                                                     "answers 400 or 500, its debug(...) for a first one not HTTP",
    "aiohttp.http.HttpProcessingError": "server.py RequestLog: the base of every error of aiohttp's request parser "
                                        "(BadHttpMessage, BadStatusLine, LineTooLong: the client's bytes, HTTP 400)",
}
# Modules outside aiohttp's and asyncio's exported API, as INTERNALS names them.
PRIVATE_MODULES = {"asyncio.sslproto": "asyncio.sslproto.SSLProtocol", "aiohttp.web_log": "aiohttp.web_log.AccessLogger"}
# Submodules that are public API (documented, or typing only).
PUBLIC_MODULES = {"aiohttp", "aiohttp.web", "aiohttp.typedefs", "aiohttp.abc", "asyncio"}


def _changed(internal: str, detail: str = "") -> str:
    return (f"aiohttp/asyncio internal {internal} changed (aiohttp {aiohttp.__version__}; written against "
            f"{AIOHTTP_WRITTEN_AGAINST}): {INTERNALS[internal]}" + (f" -- {detail}" if detail else ""))


# --- The version ------------------------------------------------------------------------

def _minor(version: str) -> tuple[int, int]:
    major, minor = re.match(r"(\d+)\.(\d+)", version).groups()  # type: ignore[union-attr]
    return int(major), int(minor)


def test_aiohttp_is_the_version_the_internals_were_written_against():
    assert _minor(aiohttp.__version__) == _minor(AIOHTTP_WRITTEN_AGAINST), (
        f"aiohttp {aiohttp.__version__} is installed; server.py and web.py use internals written against "
        f"{AIOHTTP_WRITTEN_AGAINST}: {', '.join(INTERNALS)}. Re-check each (the other tests in "
        f"{Path(__file__).name}), then update AIOHTTP_WRITTEN_AGAINST, pyproject.toml's bound and requirements.lock")


def test_pyproject_bounds_aiohttp_below_the_next_minor_and_the_lock_agrees():
    deps = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    spec = next(d for d in deps if re.match(r"aiohttp\b", d))
    upper = re.search(r"<\s*(\d+\.\d+)(?:\.0)?\b", spec)
    major, minor = _minor(AIOHTTP_WRITTEN_AGAINST)
    assert upper and _minor(upper.group(1)) == (major, minor + 1), \
        f"pyproject.toml's {spec!r} must exclude aiohttp {major}.{minor + 1} (internals pinned to {major}.{minor})"
    lower = re.search(r">=\s*([\d.]+)", spec)
    assert lower, spec
    pinned = re.search(r"^aiohttp==(\S+)", (REPO / "requirements.lock").read_text(), re.M)
    assert pinned, "requirements.lock pins no aiohttp"
    assert _minor(pinned.group(1)) == (major, minor), \
        f"requirements.lock pins aiohttp {pinned.group(1)}, outside {spec!r}; re-run pip-compile"
    assert tuple(map(int, pinned.group(1).split(".")[:3])) >= tuple(map(int, lower.group(1).split("."))), spec


# --- Every internal use is listed ------------------------------------------------------------

def _bases_from_aiohttp_or_asyncio(cls: type) -> list[type]:
    return [b for b in cls.__mro__[1:] if b.__module__.split(".")[0] in ("aiohttp", "asyncio")]


def test_every_internal_used_is_listed():
    """Non-self private attributes, self attributes inherited from an aiohttp/asyncio
    base class, and imports of their unexported modules: each must be in INTERNALS."""
    import importlib

    found: dict[str, str] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        tree = ast.parse(path.read_text(), str(path))
        where = f"{path.relative_to(REPO)}"
        for node in ast.walk(tree):
            modules: list[str] = []
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                modules = [node.module]
            elif isinstance(node, ast.Import):
                modules = [a.name for a in node.names]
            for m in modules:
                if m.split(".")[0] in ("aiohttp", "asyncio") and m not in PUBLIC_MODULES:
                    found[PRIVATE_MODULES.get(m, f"module {m}")] = f"{where}:{node.lineno}"
        if path.name not in GUARDED_FILES:
            continue
        module = importlib.import_module(f"vllm_specdec_exporter.{path.stem}")
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__") \
                    and not (isinstance(node.value, ast.Name) and node.value.id in ("self", "cls")):
                owner = "aiohttp.web.BaseSite" if node.attr in web.BaseSite.__slots__ else "?"
                found[f"{owner}.{node.attr}"] = f"{where}:{node.lineno}"
            if isinstance(node, ast.ClassDef):
                cls = getattr(module, node.name, None)
                bases = _bases_from_aiohttp_or_asyncio(cls) if isinstance(cls, type) else []
                for sub in ast.walk(node):
                    if isinstance(sub, ast.Attribute) and isinstance(sub.value, ast.Name) and sub.value.id == "self" \
                            and sub.attr.startswith("_") and not sub.attr.startswith("__"):
                        for base in bases:
                            if sub.attr in getattr(base, "__slots__", ()) or hasattr(base, sub.attr):
                                name = "aiohttp.web.BaseSite" if base is web.BaseSite else \
                                    f"{base.__module__}.{base.__qualname__}"
                                found[f"{name}.{sub.attr}"] = f"{where}:{sub.lineno}"
                                break
    unlisted = {k: v for k, v in found.items() if k not in INTERNALS}
    assert not unlisted, ("aiohttp/asyncio internals used but not pinned in INTERNALS (add each, with a test): "
                          + ", ".join(f"{k} at {v}" for k, v in sorted(unlisted.items())))
    # The three BaseSite attributes really are used (else drop them from the list).
    for name in ("aiohttp.web.BaseSite._runner", "aiohttp.web.BaseSite._server", "aiohttp.web.BaseSite._backlog",
                 "asyncio.sslproto.SSLProtocol", "aiohttp.web_log.AccessLogger"):
        assert name in found, f"{name} is listed in INTERNALS but no longer used: remove it"


# --- Each internal, checked ----------------------------------------------------------------

def test_basesite_keeps_runner_backlog_and_server_in_its_slots():
    for attr in ("_runner", "_backlog", "_server"):
        assert attr in getattr(web.BaseSite, "__slots__", ()), _changed(f"aiohttp.web.BaseSite.{attr}",
                                                                        "no longer a BaseSite slot")
    src = inspect.getsource(web.BaseSite.stop)
    assert "self._server" in src and ".close()" in src, _changed("aiohttp.web.BaseSite._server",
                                                                 "BaseSite.stop no longer closes self._server")


def test_request_handler_is_an_asyncio_protocol_built_with_no_arguments():
    from aiohttp import web_protocol, web_server

    internal = "aiohttp.web_server.Server() -> RequestHandler"
    params = [p for p in inspect.signature(web_server.Server.__call__).parameters.values() if p.name != "self"]
    assert all(p.default is not p.empty or p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD) for p in params), \
        _changed(internal, f"Server.__call__ now takes {params}")
    handler = web_protocol.RequestHandler
    assert issubclass(handler, asyncio.Protocol), _changed(internal, "RequestHandler is no asyncio.Protocol")
    for method in ("connection_made", "data_received", "eof_received", "connection_lost", "pause_writing",
                   "resume_writing"):
        assert callable(getattr(handler, method, None)), _changed(internal, f"RequestHandler has no {method}")


def test_sslprotocol_takes_the_arguments_server_py_passes():
    from asyncio.sslproto import SSLProtocol

    params = inspect.signature(SSLProtocol.__init__).parameters
    expected = ["self", "loop", "app_protocol", "sslcontext", "waiter", "server_side", "server_hostname",
                "call_connection_made", "ssl_handshake_timeout"]
    assert list(params)[:len(expected)] == expected, _changed("asyncio.sslproto.SSLProtocol", f"signature {list(params)}")
    for method in ("connection_made", "connection_lost", "buffer_updated"):
        assert callable(getattr(SSLProtocol, method, None)), _changed("asyncio.sslproto.SSLProtocol", method)
    assert issubclass(SSLProtocol, asyncio.BufferedProtocol), _changed("asyncio.sslproto.SSLProtocol",
                                                                      "no longer a BufferedProtocol")


def test_request_handler_waits_for_the_next_request_on_waiter_with_messages_queued():
    from aiohttp import web_protocol

    internal = "aiohttp.web_protocol.RequestHandler._waiter/_messages"
    handler = web_protocol.RequestHandler
    assert {"_waiter", "_messages"} <= set(handler.__slots__), _changed(internal, "no longer RequestHandler slots")
    start = inspect.getsource(handler.start)
    assert "if not self._messages:" in start and "await self._waiter" in start, _changed(internal, "start() changed")
    assert "self._messages.append(" in inspect.getsource(handler.data_received), _changed(internal, "data_received")


def test_access_logger_is_still_an_access_logger():
    from aiohttp.abc import AbstractAccessLogger
    from aiohttp.web_log import AccessLogger

    assert issubclass(AccessLogger, AbstractAccessLogger), _changed("aiohttp.web_log.AccessLogger")


@pytest.fixture(scope="module")
def server_cert(tmp_path_factory) -> tuple[Path, Path]:
    from security_harness import openssl

    d = tmp_path_factory.mktemp("cert")
    openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-keyout", "k.pem",
            "-out", "c.pem", "-days", "1", "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1", cwd=d)
    return d / "c.pem", d / "k.pem"


@pytest.mark.parametrize("tls", [False, True], ids=["http", "https"])
def test_guarded_site_serves_through_aiohttp_and_stops(server_cert, tls):
    """The internals end to end, in-process: the site's attributes as BaseSite set them, a
    request served by the handler built through _runner.server (under asyncio's
    SSLProtocol for https), and the listening socket closed by BaseSite.stop via _server."""
    from vllm_specdec_exporter.server import GuardedSite
    from vllm_specdec_exporter.webconfig.load import WebConfig

    server_ctx = None
    if tls:
        server_ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        server_ctx.load_cert_chain(*map(str, server_cert))
    cfg = WebConfig(ssl_context=server_ctx)

    async def main() -> None:
        app = web.Application()
        async def ok(request: web.Request) -> web.Response:
            return web.Response(text="ok")

        app.router.add_get("/x", ok)
        runner = web.AppRunner(app, handle_signals=False)
        await runner.setup()
        site = GuardedSite(runner, "127.0.0.1", 0, backlog=77, web_config=lambda: cfg)
        try:
            assert getattr(site, "_runner", None) is runner, _changed("aiohttp.web.BaseSite._runner")
            assert getattr(site, "_backlog", None) == 77, _changed("aiohttp.web.BaseSite._backlog")
            assert getattr(site, "_server", "missing") is None, _changed("aiohttp.web.BaseSite._server")
            await site.start()
            assert site in runner.sites, _changed("aiohttp.web.BaseSite.start/stop", "the site is not registered")
            listening = getattr(site, "_server", None)
            assert isinstance(listening, asyncio.AbstractServer), _changed("aiohttp.web.BaseSite._server")
            client_ctx = ssl.create_default_context(cafile=str(server_cert[0])) if tls else False
            url = f"{'https' if tls else 'http'}://127.0.0.1:{site.bound_port}/x"
            async with aiohttp.ClientSession() as session, session.get(url, ssl=client_ctx) as resp:
                assert (resp.status, await resp.text()) == (200, "ok"), \
                    _changed("aiohttp.web_server.Server() -> RequestHandler" if not tls else
                             "asyncio.sslproto.SSLProtocol")
        finally:
            await runner.cleanup()
        assert site not in runner.sites, _changed("aiohttp.web.BaseSite.start/stop", "cleanup left the site")
        assert not listening.is_serving(), _changed("aiohttp.web.BaseSite._server", "still listening after cleanup")
        with pytest.raises(OSError), socket.create_connection(("127.0.0.1", site.bound_port), timeout=2):
            pass

    asyncio.run(main())


# ---- from test_slow_clients.py
# Slow and hostile clients against the real `serve` over loopback: a few hundred
# half-open (slowloris) connections, idle keep-alive connections, and running out of
# file descriptors. Run with -s to see the measured probe latency.


# Timing assertions (lifetimes, probe p99): in make test's parallel run, never beside another latency test.
LATENCY = pytest.mark.xdist_group("latency")

# What these tests prove does not depend on the production timeouts (5 s headers, 75 s
# idle): `serve` runs with shorter ones, set before server.Limits binds its default;
# test_the_production_timeouts_are_the_documented_ones checks the real values.
HEADER_TIMEOUT = 1.5
IDLE_TIMEOUT = 1.0


def launcher(*patches: str) -> str:
    """`serve` through ``python -c`` with the short header timeout and ``patches``."""
    return "\n".join(["import sys", "from vllm_specdec_exporter import config",
                      f"config.HEADER_TIMEOUT_SECONDS = {HEADER_TIMEOUT}", *patches,
                      "from vllm_specdec_exporter import cli", "sys.exit(cli.main(sys.argv[1:]))"])


SHORT = launcher()


@LATENCY
def test_the_production_timeouts_are_the_documented_ones():
    assert config.HEADER_TIMEOUT_SECONDS == 5.0 and config.IDLE_TIMEOUT_SECONDS == 75.0
    assert server.Limits().header_timeout == config.HEADER_TIMEOUT_SECONDS  # what `serve` uses
    readme = (REPO / "docs" / "security.md").read_text()
    assert "headers within 5 s (`HEADER_TIMEOUT_SECONDS`)" in readme
    assert "75 s keep-alive timeout (`IDLE_TIMEOUT_SECONDS`" in readme


def nofile(limit: int):
    return lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (limit, limit))


class _Clients:
    """``n`` client connections driven by one thread; ``ready`` says when they are all at it."""

    def __init__(self, port: int, n: int):
        self.port, self.n = port, n
        self.stop = threading.Event()
        self.sel = selectors.DefaultSelector()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        raise NotImplementedError

    def ready(self) -> bool:
        raise NotImplementedError

    def report(self) -> tuple:
        raise NotImplementedError

    def __enter__(self):
        self.thread.start()
        wait_for(self.ready, 30, f"{self.n} {type(self).__name__} connections", step=0.1)
        return self

    def __exit__(self, *exc) -> None:
        self.stop.set()
        self.thread.join(10)
        for key in list(self.sel.get_map().values()):
            key.fileobj.close()


def _attack(clients: type[_Clients], port: int, n: int, stop, results) -> None:
    with clients(port, n) as attack:
        results.send("started")
        stop.wait(60)
        results.send(attack.report())


@contextlib.contextmanager
def attacker(clients: type[_Clients], port: int, n: int):
    """``clients`` run from another process, as an attacker's would; yields a function that
    stops them and returns their ``report()``."""
    stop = multiprocessing.Event()
    results, child_end = multiprocessing.Pipe(duplex=False)
    process = multiprocessing.Process(target=_attack, args=(clients, port, n, stop, child_end))
    process.start()

    def finish() -> tuple:
        stop.set()
        assert results.poll(30)
        return results.recv()

    try:
        assert results.poll(60) and results.recv() == "started"
        yield finish
    finally:
        stop.set()
        process.join(30)


class Slowloris(_Clients):
    """Keeps ``n`` connections open that send request headers one line at a time and
    never finish them; reopens each one the server closes, and records how long the
    server let it live."""

    def __init__(self, port: int, n: int):
        super().__init__(port, n)
        self.lifetimes: list[float] = []
        self.opened = 0

    def _open(self) -> None:
        s = socket.create_connection(("127.0.0.1", self.port), timeout=5)
        s.sendall(b"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\n")
        s.setblocking(False)
        self.sel.register(s, selectors.EVENT_READ, time.monotonic())
        self.opened += 1

    def _closed(self, key) -> None:
        self.sel.unregister(key.fileobj)
        key.fileobj.close()
        self.lifetimes.append(time.monotonic() - key.data)

    def _run(self) -> None:
        for _ in range(self.n):
            self._open()
        next_trickle = time.monotonic()
        while not self.stop.is_set():
            for key, _ in self.sel.select(0.1):
                try:
                    if key.fileobj.recv(4096) == b"":
                        self._closed(key)
                except OSError:
                    self._closed(key)
            if time.monotonic() >= next_trickle:
                next_trickle += 0.5
                for key in list(self.sel.get_map().values()):
                    try:
                        key.fileobj.send(b"X-Slow: 1\r\n")
                    except OSError:
                        self._closed(key)
                for _ in range(self.n - len(self.sel.get_map())):
                    self._open()

    def open_ages(self) -> list[float]:
        now = time.monotonic()
        return [now - key.data for key in self.sel.get_map().values()]

    def ready(self) -> bool:
        return self.opened >= self.n

    def report(self) -> tuple[float, int, float]:
        return max(self.open_ages()), len(self.lifetimes), max(self.lifetimes, default=0.0)


@LATENCY
def test_slowloris_connections_are_timed_out_and_probes_still_served():
    """300 connections that never finish their headers (from another process, as an
    attacker would be), against an exporter limited to 192 file descriptors: the
    server closes each within the header timeout, its connection cap keeps it below
    the descriptor limit (no accept() errors), and /healthz answers throughout; a
    scraper on one keep-alive connection, that never retries, is never cut (a first order
    closing connections served before those still sending headers cut 9 of 10: helper-32)."""
    serve, port = start_exporter(launcher=SHORT, preexec_fn=nofile(192))
    scraper, scrapes = http.client.HTTPConnection("127.0.0.1", port, timeout=5), []
    try:
        with attacker(Slowloris, port, 300) as finish:
            latencies = []
            started = time.monotonic()
            # Past the header timeout, and enough probes for a p99 and ten scrapes on a busy machine
            # (a fixed 5.5 s gave 8 scrapes at load 3); bounded, as a server that stalls ends it sooner.
            while (time.monotonic() - started < HEADER_TIMEOUT + 4 or len(latencies) < 60) \
                    and time.monotonic() - started < HEADER_TIMEOUT + 30:
                latencies.append(timed_get(f"http://127.0.0.1:{port}/healthz", timeout=5))
                if len(latencies) % 5 == 0:
                    try:
                        scraper.request("GET", "/metrics")
                        scrapes.append(scraper.getresponse().read().endswith(b"\n"))
                    except OSError as exc:
                        scrapes.append(type(exc).__name__)
                time.sleep(0.05)
            oldest, closed, longest = finish()
        # What the server did, on /metrics (they were counted and never exported before).
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as resp:
            samples = parse(resp.read()).samples
        evicted = samples["vllm_specdec_exporter_connections_evicted_total"][0].value
        timed_out = samples["vllm_specdec_exporter_connections_timed_out_total"][0].value
    finally:
        logs = serve.stop()
    p99 = percentile(latencies, 99)
    print(f"\nslowloris, 300 half-open connections, fd limit 192: /healthz p50 {1000 * percentile(latencies, 50):.1f} ms, "
          f"p99 {1000 * p99:.1f} ms over {len(latencies)} probes; {closed} attacker connections closed by the server "
          f"(longest lived {longest:.1f} s); oldest still open {oldest:.1f} s; {len(logs.splitlines())} log lines")
    # Every attacker connection the cap closes comes straight back: the server accepts
    # and closes ~450 a second here, and a probe queues behind them in the kernel. A probe the
    # listen queue dropped waits for its SYN's retransmit, 1 s: under it, none was (0.47-0.64 s
    # at load 3, where 0.5 failed one run in four).
    assert p99 < 0.900
    assert closed >= 300 and longest < HEADER_TIMEOUT + 1
    assert evicted + timed_out >= closed >= 300, (evicted, timed_out, closed)  # every close counted
    assert oldest < HEADER_TIMEOUT + 1
    assert "accept" not in logs and len(logs.splitlines()) < 20, logs[-3000:]
    assert len(scrapes) >= 10 and all(s is True for s in scrapes), scrapes


class KeepAliveFlood(_Clients):
    """``n`` keep-alive clients that send /healthz again as soon as an answer comes, and
    reconnect at once when the server closes them."""

    depth = 1  # requests each keeps in flight

    def __init__(self, port: int, n: int):
        super().__init__(port, n)
        self.answers = self.closed = 0

    def _ask(self, s: socket.socket, n: int = 1) -> bool:
        try:
            s.send(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n" * n)
            return True
        except OSError:
            return False

    def _open(self) -> None:
        try:
            s = socket.create_connection(("127.0.0.1", self.port), timeout=5)
        except OSError:
            return
        s.setblocking(False)
        if self._ask(s, self.depth):
            self.sel.register(s, selectors.EVENT_READ)
        else:
            s.close()

    def _run(self) -> None:
        while not self.stop.is_set():
            for _ in range(self.n - len(self.sel.get_map())):
                self._open()
            for key, _ in self.sel.select(0.05):
                try:
                    answer = key.fileobj.recv(65536)
                except OSError:
                    answer = b""
                answered = answer.count(b"HTTP/1.1 ")
                self.answers += answered
                if not answer or (answered and not self._ask(key.fileobj, answered)):
                    self.sel.unregister(key.fileobj)
                    key.fileobj.close()
                    self.closed += 1

    def ready(self) -> bool:
        return self.closed >= self.n  # the cap is at work

    def report(self) -> tuple[int, int]:
        return self.answers, self.closed


class PipelinedFlood(KeepAliveFlood):
    """The same, four requests in flight on each connection from its first bytes."""

    depth = 4


@LATENCY
@pytest.mark.parametrize("flood", [KeepAliveFlood, PipelinedFlood])
def test_liveness_probes_get_in_beside_a_keep_alive_flood_over_the_cap(flood):
    """300 keep-alive clients asking /healthz back to back (or four at a time), against a cap of
    78 connections (192 descriptors): the cap closes connections that were served, not a probe's
    new one. It closed the oldest one still sending headers, else the quietest, which a probe
    being answered is: 40 of 40 probes were reset; a first fix that knew keep-alive clients only
    by a request sent after an answer still lost 60 of 60 beside pipelining ones (helper-32)."""
    serve, port = start_exporter(launcher=SHORT, preexec_fn=nofile(192))
    failed: list[str] = []
    try:
        with attacker(flood, port, 300) as finish:
            for _ in range(40):
                try:
                    if get(f"http://127.0.0.1:{port}/healthz", timeout=5)[0] != 200:
                        failed.append("status")
                except OSError as exc:
                    failed.append(type(exc).__name__)
                time.sleep(0.05)
            answers, closed = finish()
    finally:
        serve.stop()
    print(f"\n{flood.__name__}, 300 clients over a cap of 78: {answers} answers, {closed} closed; "
          f"{len(failed)} of 40 probes failed")
    assert closed >= 300 and answers >= 1000  # the flood was served and over the cap throughout
    assert not failed, failed


async def _recv_until(s: socket.socket, until: Callable[[bytes], bool], seconds: float = 5) -> bytes:
    """What ``s`` receives until ``until`` holds, EOF (then ends with b"<EOF>") or ``seconds``;
    never blocking the loop of a server running in this thread."""
    s.setblocking(False)
    got, deadline = b"", time.monotonic() + seconds
    while not until(got) and time.monotonic() < deadline:
        await asyncio.sleep(0.005)
        try:
            chunk = s.recv(65536)
        except BlockingIOError:
            continue
        except OSError:
            break
        if not chunk:
            return got + b"<EOF>"
        got += chunk
    return got


async def _answer_beside(answer: Awaitable[bytes], others: list[socket.socket], *rest: socket.socket,
                         within: float = 0.5) -> tuple[bytes, list[bytes]]:
    """``answer`` (a client's, "ok\\n" once served), then what each of ``others`` receives until
    EOF or ``within`` s; then all of them and ``rest`` closed. At the cap: who was kept, who cut."""
    got = await answer
    closed = [await _recv_until(s, lambda got: False, within) for s in others]
    for s in (*others, *rest):
        s.close()
    assert got.startswith(b"HTTP/1.1 200") and got.endswith(b"ok\n"), got
    return got, closed


def _plain_answer(s: socket.socket) -> Awaitable[bytes]:
    return _recv_until(s, lambda got: got.endswith(b"ok\n"))


async def _ok(request: web.Request) -> web.Response:
    return web.Response(text="ok\n")


async def _guarded_site(limits: server.Limits, web_config=None, **routes) -> tuple[web.AppRunner, server.GuardedSite]:
    """A started GuardedSite on a loopback port, answering "ok\n" at /x and each ``routes`` path."""
    app = web.Application()
    for path, handler in {"x": _ok, **routes}.items():
        app.router.add_get(f"/{path}", handler)
    runner = web.AppRunner(app, handle_signals=False)
    await runner.setup()
    site = server.GuardedSite(runner, "127.0.0.1", 0, backlog=16, limits=limits, web_config=web_config)
    await site.start()
    return runner, site


class _TLSClient:
    """A TLS client driven by hand (memory BIOs), so that a test can hold it mid-handshake."""

    def __init__(self, ca: Path, port: int):
        self.incoming, self.outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
        ctx = ssl.create_default_context(cafile=str(ca))
        self.tls = ctx.wrap_bio(self.incoming, self.outgoing, server_hostname="127.0.0.1")
        self.sock = socket.create_connection(("127.0.0.1", port))

    def hello(self) -> bytes:
        with contextlib.suppress(ssl.SSLWantReadError):
            self.tls.do_handshake()
        return self.outgoing.read()

    async def finish(self, flight: bytes) -> bytes:
        """The rest of the handshake from the server's first ``flight``, then GET /x: its answer."""
        while True:
            self.incoming.write(flight)
            try:
                self.tls.do_handshake()
                break
            except ssl.SSLWantReadError:
                self.sock.sendall(self.outgoing.read())
                flight = await _recv_until(self.sock, lambda got: len(got) > 0)
                assert flight and not flight.endswith(b"<EOF>"), "the TLS client was closed mid-handshake"
        self.tls.write(b"GET /x HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        self.sock.sendall(self.outgoing.read())
        answer = b""
        while not answer.endswith(b"ok\n"):
            data = await _recv_until(self.sock, lambda got: len(got) > 0)
            assert data and not data.endswith(b"<EOF>"), answer
            self.incoming.write(data)
            with contextlib.suppress(ssl.SSLWantReadError):
                answer += self.tls.read(65536)
        return answer



def _tls_config(server_cert):
    from vllm_specdec_exporter.webconfig.load import WebConfig

    server_ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server_ctx.load_cert_chain(*map(str, server_cert))
    return WebConfig(ssl_context=server_ctx)


@pytest.mark.parametrize("others", ["silent", "half-a-ClientHello", "a-ClientHello-then-one-byte"])
def test_a_tls_client_mid_handshake_outlasts_silent_connections(server_cert, others):
    """At the cap (3 here): a TLS client that sent its ClientHello and waits on the server's
    answer, two other sockets, then one more connection: one of the two is closed, and the TLS
    client completes its handshake and its request. The two: silent past SILENT_SECONDS, or
    that sent the first bytes of a ClientHello after it and no more, or a whole ClientHello
    before it (answered) and, after it, the first byte of their next flight. Ranked by accept
    time alone (the handshake's bytes unseen), the client was the oldest quiet connection and
    was closed: helper-35 saw 17-38 of 40 TLS probes fail beside silent sockets at ~6,500 a
    second, 3 ms each way. Ranked by their last byte, the other two were fresher than it: 26-27
    of 32 probes failed beside half-sent hellos (helper-36 found the second flight's way)."""
    cfg = _tls_config(server_cert)

    async def main() -> tuple[bytes, list[bytes]]:
        runner, site = await _guarded_site(server.Limits(header_timeout=30, max_connections=3), lambda: cfg)
        try:
            port, other = site.bound_port, []
            if others == "a-ClientHello-then-one-byte":  # before the client: their hellos answered
                other = [socket.create_connection(("127.0.0.1", port)) for _ in range(2)]
                for s in other:
                    s.sendall(_TLSClient(server_cert[0], port).hello())
                await asyncio.sleep(0.02)
            client = _TLSClient(server_cert[0], port)
            client.sock.sendall(client.hello())
            flight = await _recv_until(client.sock, lambda got: len(got) > 0)  # the server read it and answered
            await asyncio.sleep(0.02)
            other = other or [socket.create_connection(("127.0.0.1", port)) for _ in range(2)]
            for s in other:
                s.sendall({"silent": b"", "half-a-ClientHello": b"\x16\x03\x01\x02\x00\x01"}.get(others, b"\x14"))
            await asyncio.sleep(2 * server.SILENT_SECONDS)  # read: silent, or heard after the TLS client
            newcomer = socket.create_connection(("127.0.0.1", port))  # over the cap
            await asyncio.sleep(0.05)
            return await _answer_beside(client.finish(flight), other, newcomer, client.sock)
        finally:
            await runner.cleanup()

    _, closed = asyncio.run(main())
    assert any(c.endswith(b"<EOF>") for c in closed), closed  # one of the other two was closed


def test_a_tls_client_whose_hello_comes_in_two_parts_outlasts_silent_connections(server_cert):
    """At the cap (3 here): two sockets silent past SILENT_SECONDS, then a TLS client whose
    ClientHello comes in two parts 40 ms apart (a post-quantum key share makes a hello span two
    segments), one more connection in between: a silent one is closed, not the client (ranked
    with slowloris, before silence, it was: helper-36)."""
    cfg = _tls_config(server_cert)

    async def main() -> tuple[bytes, list[bytes]]:
        runner, site = await _guarded_site(server.Limits(header_timeout=30, max_connections=3), lambda: cfg)
        try:
            silent = [socket.create_connection(("127.0.0.1", site.bound_port)) for _ in range(2)]
            await asyncio.sleep(2 * server.SILENT_SECONDS)
            client = _TLSClient(server_cert[0], site.bound_port)
            client.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            hello = client.hello()
            client.sock.sendall(hello[: len(hello) // 2])
            await asyncio.sleep(0.02)
            newcomer = socket.create_connection(("127.0.0.1", site.bound_port))  # over the cap
            await asyncio.sleep(0.02)
            client.sock.sendall(hello[len(hello) // 2 :])
            flight = await _recv_until(client.sock, lambda got: len(got) > 0)
            assert flight and not flight.endswith(b"<EOF>"), "the TLS client was closed mid-hello"
            return await _answer_beside(client.finish(flight), silent, newcomer, client.sock)
        finally:
            await runner.cleanup()

    _, closed = asyncio.run(main())
    assert b"<EOF>" in closed, closed  # a silent one was closed


def test_a_request_not_read_yet_is_not_taken_for_a_silent_socket():
    """At the cap (2 here), three connections accepted in one batch: the first has sent its
    request, not read yet (asyncio reads a new socket a loop turn after it is accepted), the
    second nothing. The third closes the silent one: the kernel holds the first one's bytes."""

    async def main() -> tuple[bytes, list[bytes]]:
        runner, site = await _guarded_site(server.Limits(header_timeout=30, max_connections=2))
        try:
            asking = socket.create_connection(("127.0.0.1", site.bound_port))
            asking.sendall(b"GET /x HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            silent = socket.create_connection(("127.0.0.1", site.bound_port))
            third = socket.create_connection(("127.0.0.1", site.bound_port))  # all three before the loop runs
            return await _answer_beside(_plain_answer(asking), [silent], asking, third)
        finally:
            await runner.cleanup()

    assert asyncio.run(main())[1] == [b"<EOF>"]


def _cut_beside_a_probe(second: bytes) -> list[bytes]:
    """At the cap (2 here): a probe on its first request, then a connection that sends
    ``second``, both answers slow (0.5 s); then one more connection. What the second one
    receives (the probe must be answered)."""

    async def slow(request: web.Request) -> web.Response:
        await asyncio.sleep(0.5)
        return web.Response(text="ok\n")

    async def main() -> tuple[bytes, list[bytes]]:
        runner, site = await _guarded_site(server.Limits(header_timeout=30, max_connections=2), slow=slow)
        try:
            probe = socket.create_connection(("127.0.0.1", site.bound_port))
            probe.sendall(b"GET /slow HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            await asyncio.sleep(0.05)
            other = socket.create_connection(("127.0.0.1", site.bound_port))
            other.sendall(second)
            await asyncio.sleep(0.05)
            third = socket.create_connection(("127.0.0.1", site.bound_port))
            return await _answer_beside(_plain_answer(probe), [other], probe, third, within=1.5)
        finally:
            await runner.cleanup()

    return asyncio.run(main())[1]


@pytest.mark.parametrize("first", [b"", b"Connection: Upgrade\r\nUpgrade: websocket\r\n"], ids=["plain", "upgrade"])
def test_requests_pipelined_behind_a_first_one_mark_the_connection_reused(first):
    """A connection that pipelined a second request behind its first in its first bytes (an
    Upgrade aiohttp declines too: its parser stops at an upgrade and left the rest unparsed, so
    it was not counted) is closed at the cap, not the probe beside it: ranked with first
    requests, the probe was the quieter and was closed."""
    pipelining = b"GET /slow HTTP/1.1\r\nHost: x\r\n" + first + b"\r\nGET /slow HTTP/1.1\r\nHost: x\r\n\r\n"
    assert _cut_beside_a_probe(pipelining) == [b"<EOF>"]  # cut before its answers


@pytest.mark.parametrize("body", [b"Content-Length: 100\r\n", b"Transfer-Encoding: chunked\r\n", b"content-length:7\r\n"],
                         ids=["length", "chunked", "lower-case"])
def test_a_request_whose_body_never_comes_is_closed_before_a_probe(body):
    """A request announcing a body that never comes (every route here is GET: no client of this
    server sends one) is closed at the cap, not the probe beside it: ranked with first requests,
    the probe was the quieter and was closed (stop 51's note: still open)."""
    assert _cut_beside_a_probe(b"GET /slow HTTP/1.1\r\nHost: x\r\n" + body + b"\r\n") == [b"<EOF>"]  # cut before its answer


def test_a_slow_readers_answer_is_not_cut_for_an_idle_keep_alive_connection():
    """At the cap (2 here), a connection whose handler waits for its next request while its last
    answer still sits in the transport's buffer (a slow reader) is not idle: the keep-alive
    connection idle with nothing to send is closed, and the slow reader gets all of its answer.
    Taken for idle, it was closed first (its request is the older) and its answer cut (helper-32)."""
    big = b"x" * 400_000

    async def large(request: web.Request) -> web.Response:
        return web.Response(body=big)

    async def main() -> tuple[bytes, bytes]:
        runner, site = await _guarded_site(server.Limits(header_timeout=30, max_connections=2), big=large)
        port = site.bound_port
        try:
            slow = socket.socket()
            slow.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            slow.connect(("127.0.0.1", port))
            slow.sendall(b"GET /x HTTP/1.1\r\nHost: x\r\n\r\n")
            first = await _recv_until(slow, lambda got: got.endswith(b"ok\n"))
            (watch,) = site.pool.conns
            watch.raw.get_extra_info("socket").setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)  # a slow path
            slow.sendall(b"GET /big HTTP/1.1\r\nHost: x\r\n\r\n")
            slow.setblocking(False)
            got = b""
            # Read slowly until aiohttp has written all of it and waits for the next request.
            for _ in range(5000):
                await asyncio.sleep(0.002)
                with contextlib.suppress(BlockingIOError):
                    got += slow.recv(2048)
                waiter = watch.handler._waiter
                if waiter is not None and not waiter.done() and watch.raw.get_write_buffer_size():
                    break
            assert watch.raw.get_write_buffer_size() > 0, "the answer left the buffer: no slow reader to test"
            idle = socket.create_connection(("127.0.0.1", port))  # keep-alive, answered, now idle
            idle.sendall(b"GET /x HTTP/1.1\r\nHost: x\r\n\r\n")
            assert (await _recv_until(idle, lambda got: got.endswith(b"ok\n"))).endswith(b"ok\n")
            newcomer = socket.create_connection(("127.0.0.1", port))  # over the cap: one is closed
            got += await _recv_until(slow, lambda got_now: (got + got_now).endswith(big))
            after = await _recv_until(idle, lambda got: False)  # until EOF, or 5 s
            for s in (slow, idle, newcomer):
                s.close()
            return after, first + got
        finally:
            await runner.cleanup()

    idle_after, received = asyncio.run(main())
    assert received.count(b"HTTP/1.1 200") == 2
    assert received.endswith(big), f"the slow reader's answer was cut: {len(received)} bytes"
    assert idle_after == b"<EOF>"  # the idle keep-alive connection was the one closed


SHORT_IDLE = launcher(f"config.IDLE_TIMEOUT_SECONDS = {IDLE_TIMEOUT}")


def _wait_closed(s: socket.socket, deadline: float) -> float | None:
    """Seconds until the server closes ``s`` (None if it is still open at the deadline)."""
    started = time.monotonic()
    s.settimeout(deadline)
    try:
        while s.recv(65536):
            pass
    except TimeoutError:
        return None
    except OSError:
        pass
    return time.monotonic() - started


@LATENCY
def test_idle_keep_alive_connections_are_closed():
    """After a response, the next complete request must come within the idle timeout;
    a connection that sits idle, or sends half a second request, is closed."""
    serve, port = start_exporter(launcher=SHORT_IDLE)
    try:
        idle = socket.create_connection(("127.0.0.1", port))
        half = socket.create_connection(("127.0.0.1", port))
        for s in (idle, half):
            s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
            assert s.recv(65536).startswith(b"HTTP/1.1 200")
        half.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")
        waited = [_wait_closed(s, 10) for s in (idle, half)]
    finally:
        serve.stop()
    # closed at their timeouts (idle 1 s, header 1.5 s): a doubled timeout fails this
    assert all(w is not None and w < HEADER_TIMEOUT + 1 for w in waited), waited


# as if the cap were set above the real descriptor limit
NO_CAP = launcher("from vllm_specdec_exporter import web", "web.open_file_limit = lambda reserve: 100_000")
# The attack itself is the thing measured: descriptors exhausted for two header
# timeouts, so timed-out connections come straight back and fail accept() again.
ATTACK_SECONDS = 2 * HEADER_TIMEOUT


@LATENCY
def test_running_out_of_descriptors_logs_at_a_bounded_rate_and_recovers():
    """With connections allowed above the descriptor limit (e.g. descriptors shared with
    something else), accept() fails: asyncio logs every failure, for every pending
    connection, on every tick (the issue saw ~100 k lines in seconds). Here the log
    stays bounded, and /healthz answers again as soon as the attack stops."""
    serve, port = start_exporter(launcher=NO_CAP, preexec_fn=nofile(128))
    try:
        with Slowloris(port, 300):
            time.sleep(ATTACK_SECONDS)
        recovered = wait_for(lambda: _healthz_ok(port), 15, "/healthz after the attack", step=0.05)
    finally:
        logs = serve.stop()
    lines = logs.splitlines()
    accept_lines = [line for line in lines if "accept" in line]
    print(f"\ndescriptors exhausted for {ATTACK_SECONDS} s: {len(lines)} log lines, {len(accept_lines)} about accept()")
    # at most one line per 1.5 s of attack: catches a log interval well under the real 10 s
    assert 1 <= len(accept_lines) <= 2 and len(lines) < 30, lines[:20]
    assert recovered


def test_malformed_requests_are_counted_and_logged_at_a_bounded_rate():
    """Found attacking the server: each request aiohttp's parser refused was logged at ERROR with its
    traceback, before any authentication (50 clients for 10 s: 36,391 lines, 24 MB). Now each is
    counted, and logged one line without the client's bytes at most every 10 s."""
    from security_harness import log_events

    serve, port = start_exporter()
    bad = [b"GET / HTTP/9.9\r\nHost: x\r\n\r\n", b"GET / HTTP/1.1\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\nab",
           b"GET /\x00 HTTP/1.1\r\n\r\n", b"GET / HTTP/1.1\r\nX: " + b"a" * 20_000 + b"\r\n\r\n"]
    try:
        for i in range(200):
            with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
                s.sendall(bad[i % len(bad)])
                assert b" 400 Bad Request" in s.recv(4096).split(b"\r\n", 1)[0], i
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as resp:
            samples = {n: s[0].value for n, s in parse(resp.read()).samples.items()}
    finally:
        logs = serve.stop()
    assert samples["vllm_specdec_exporter_requests_refused_total"] == 200
    refused = log_events(logs, "bad_request_refused")
    assert len(refused) == 1 and refused[0]["suppressed_since_last"] == 0, refused
    assert "Traceback" not in logs and "Error handling request" not in logs and "aaaa" not in logs, logs[-2000:]


def _healthz_ok(port: int) -> bool:
    try:
        return timed_get(f"http://127.0.0.1:{port}/healthz", timeout=2) >= 0
    except (OSError, AssertionError):
        return False


@LATENCY
def test_half_open_connections_are_closed_at_the_header_timeout():
    """50 slowloris connections, under the connection cap: each is closed by the header
    timeout (the issue saw them open after 100 s), not before."""
    serve, port = start_exporter(launcher=SHORT)
    try:
        with Slowloris(port, 50) as attack:
            wait_for(lambda: len(attack.lifetimes) >= 50, HEADER_TIMEOUT + 10,
                     "the server to close 50 half-open connections", step=0.05)
            lifetimes = sorted(attack.lifetimes)[:50]
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as resp:
            timed_out = parse(resp.read()).samples["vllm_specdec_exporter_connections_timed_out_total"][0].value
    finally:
        serve.stop()
    assert timed_out >= 50  # counted on /metrics
    # not before: each sent a header line every 0.5 s meanwhile, which must not reset the timeout
    # ... and not much after: a doubled timeout fails this
    assert lifetimes[0] > HEADER_TIMEOUT - 0.5 and lifetimes[-1] < HEADER_TIMEOUT + 1, (lifetimes[0], lifetimes[-1])



@pytest.mark.parametrize("head", [
    b"\r\n\r\nGET /x HTTP/1.1\r\nX-Slow: 1\r\n",  # blank lines first: aiohttp skips them (RFC 9112 2.2)
    b"GET /x HTTP/1.1\r\n" + 3 * (b"X-Long: " + 6000 * b"a" + b"\r\n"),  # over 16 KiB, no line over aiohttp's 8190
], ids=["leading-blank-lines", "over-16-KiB"])
def test_first_headers_that_only_look_ended_keep_the_header_timeout(head):
    """First bytes whose headers are not ended, though a blank line came first or they passed the
    16 KiB handed to aiohttp: closed at the header timeout (1 s here), counted, and ranked with
    slowloris meanwhile. Both waited for aiohttp's keep-alive timeout (75 s in production) instead,
    ranked idle (helper-37)."""

    async def main() -> tuple[int, float, bytes, int]:
        runner, site = await _guarded_site(server.Limits(header_timeout=1, max_connections=8))
        try:
            s = socket.create_connection(("127.0.0.1", site.bound_port))
            s.sendall(head)
            started = time.monotonic()
            await asyncio.sleep(0.2)
            [watch] = site.pool.conns
            rank = watch.eviction_order(asyncio.get_running_loop().time())[0]
            got = await _recv_until(s, lambda got: False, 3)
            s.close()
            return rank, time.monotonic() - started, got, site.timed_out
        finally:
            await runner.cleanup()

    rank, lived, got, timed_out = asyncio.run(main())
    assert rank == 0
    assert got.endswith(b"<EOF>") and lived < 1.5, (lived, got[:80])
    assert timed_out == 1


@pytest.mark.parametrize("then", ["slow-answer", "keep-alive"])
def test_a_real_head_over_16_kib_in_two_reads_is_served_and_kept(then):
    """An 18 KB head aiohttp accepts (three 6,000-byte lines), its first read past 16 KiB without
    the end, the rest 50 ms later: answered though the answer takes longer than the header
    timeout (1 s here), then idle and asked again after it, never counted as timed out. Held to
    the header timeout once handed on, it was cut at 1 s both ways (helper-38)."""
    big = b"GET /slow HTTP/1.1\r\nHost: x\r\n" + b"".join(b"X-Long-%d: " % i + 6000 * b"a" + b"\r\n" for i in range(3)) + b"\r\n"

    async def slow(request: web.Request) -> web.Response:
        await asyncio.sleep(1.5 if then == "slow-answer" else 0)
        return web.Response(text="ok\n")

    async def main() -> tuple[bytes, int, bytes, int]:
        runner, site = await _guarded_site(server.Limits(header_timeout=1, max_connections=8), slow=slow)
        try:
            s = socket.create_connection(("127.0.0.1", site.bound_port))
            s.sendall(big[:16500])
            await asyncio.sleep(0.05)
            s.sendall(big[16500:])
            first = await _recv_until(s, lambda got: got.endswith(b"ok\n"), 3)
            [watch] = site.pool.conns
            # The answer can reach the client before aiohttp's handler waits for the next request
            # (rank 4 for that moment: CI, at load): idle within a moment, never slowloris (0).
            for _ in range(50):  # 0.5 s at most
                rank = watch.eviction_order(asyncio.get_running_loop().time())[0]
                if rank in (1, 2):
                    break
                await asyncio.sleep(0.01)
            await asyncio.sleep(1.2 if then == "keep-alive" else 0)
            s.sendall(b"GET /slow HTTP/1.1\r\nHost: x\r\n\r\n")
            second = await _recv_until(s, lambda got: got.endswith(b"ok\n"), 3)
            s.close()
            return first, rank, second, site.timed_out
        finally:
            await runner.cleanup()

    first, rank, second, timed_out = asyncio.run(main())
    assert first.endswith(b"ok\n") and second.endswith(b"ok\n"), (first[-40:], second[-40:])
    assert rank in (1, 2) and timed_out == 0, (rank, timed_out)  # idle, or a later request: not slowloris


def test_a_request_followed_by_a_stray_blank_line_is_not_taken_for_pipelining():
    """A bare CRLF after the request (as `echo ... | nc` sends) is not another request: the
    connection is not marked reused."""

    async def main() -> bool:
        runner, site = await _guarded_site(server.Limits(header_timeout=30, max_connections=8))
        try:
            s = socket.create_connection(("127.0.0.1", site.bound_port))
            s.sendall(b"GET /x HTTP/1.1\r\nHost: x\r\n\r\n\r\n")
            await _recv_until(s, lambda got: got.endswith(b"ok\n"))
            [watch] = site.pool.conns
            s.close()
            return watch.reused
        finally:
            await runner.cleanup()

    assert asyncio.run(main()) is False


@LATENCY
def test_tls_connections_that_never_finish_the_handshake_are_closed(tmp_path):
    """Slowloris on the TLS port: 30 connections that send three bytes of a ClientHello
    and stop are closed at the header timeout (asyncio's own handshake timeout is 60 s)."""
    from security_harness import make_pki, write_web_config
    pki = make_pki(tmp_path)
    cfg = write_web_config(tmp_path / "web.yaml", pki)
    serve, port = start_exporter("--web.config.file", str(cfg), tls_ca=pki / "ca.crt", launcher=SHORT)
    try:
        conns = [socket.create_connection(("127.0.0.1", port)) for _ in range(30)]
        for s in conns:
            s.sendall(b"\x16\x03\x01")
        waited = [_wait_closed(s, HEADER_TIMEOUT + 5) for s in conns]
    finally:
        serve.stop()
    assert all(w is not None and w < HEADER_TIMEOUT + 1 for w in waited), waited
