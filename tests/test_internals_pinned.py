"""aiohttp's and asyncio's internals the server builds on, pinned.

server.py takes each connection itself (TLS chosen per connection, a header timeout, a
connection cap) and hands it to aiohttp's request handler once its first request's
headers are in; no public aiohttp API does that. It relies on what is listed in
INTERNALS. They were written against aiohttp AIOHTTP_WRITTEN_AGAINST (pyproject.toml
bounds aiohttp below the next minor; requirements.lock pins one release of it). When
aiohttp changes, the version test fails first, naming every internal to re-check; each
internal also has a test of its own that names it when it breaks.

To move to a new aiohttp: install it, run this file, fix what it names, then update
AIOHTTP_WRITTEN_AGAINST, the bound in pyproject.toml and requirements.lock (pip-compile).
"""

from __future__ import annotations

import ast
import asyncio
import inspect
import re
import socket
import ssl
import tomllib
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web
from conftest import REPO

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
                                    "(loop, app_protocol, sslcontext, waiter, server_side=, ssl_handshake_timeout=)",
    "aiohttp.web_log.AccessLogger": "web.py: the runner's access_log_class (not exported by aiohttp.web)",
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
    for method in ("connection_made", "connection_lost"):
        assert callable(getattr(SSLProtocol, method, None)), _changed("asyncio.sslproto.SSLProtocol", method)


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
