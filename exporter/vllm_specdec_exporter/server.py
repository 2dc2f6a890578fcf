"""The listening socket: TLS chosen per connection, and no client can stall the server.

aiohttp's TCPSite takes one SSL context for the life of the server and has no
header timeout. ``GuardedSite`` instead builds each connection's TLS layer from the
current web config (a rotated certificate or a changed client_auth_type applies to
new connections; open ones keep theirs), and puts a watch between every connection
and aiohttp's handler that

- closes a connection whose TLS handshake and first request headers are not in
  within ``HEADER_TIMEOUT_SECONDS`` (slowloris); aiohttp's keep-alive timeout bounds
  the wait for every later request;
- counts connections against a cap kept below the open-file limit, so accept() never
  runs out of descriptors; at the cap one is closed, in this order (``_Watch.eviction_order``):
  one that sent part of its first headers (slowloris) or announced a body (no route takes
  one: a body that never comes held the connection), one idle between requests with
  its answer sent, one on a later request of a keep-alive client (pipelined too), the
  oldest silent for SILENT_SECONDS (no byte read or waiting: ``Pool.evict``) or whose last
  bytes its TLS handshake could not answer (a ClientHello stalled half-way), then the
  quietest of the rest (on its first request, or its TLS handshake). A probe (a new
  connection, one request) gets in beside slowloris, keep-alive, silent and slow-request
  floods, over TLS too, a Prometheus scrape beside slowloris, and a slow reader gets all
  of its answer;
- checks ``client_allowed_sans`` once the handshake is done.

accept() errors (out of descriptors anyway, e.g. a limit shared with something
else) are logged at most once per ``ACCEPT_ERROR_LOG_INTERVAL_SECONDS`` with a count.
"""

from __future__ import annotations

import array
import asyncio
import fcntl
import heapq
import logging
import socket
import ssl
import termios
from asyncio.sslproto import SSLProtocol
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

import structlog
from aiohttp import http, web

from . import config

if TYPE_CHECKING:  # a type only: the listening socket needs no YAML, bcrypt or config loading
    from .webconfig.load import WebConfig

log = structlog.get_logger("vllm_specdec_exporter")


@dataclass(frozen=True)
class Limits:
    header_timeout: float = config.HEADER_TIMEOUT_SECONDS
    max_connections: int = config.MAX_CONNECTIONS


def open_file_limit(reserve: int) -> int:
    """Raise the soft open-file limit to the hard one (as Go does at start-up) and
    return how many connections fit under it, ``reserve`` descriptors kept for polls."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or soft < hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            soft = hard
        except (ValueError, OSError):
            pass
    return 1 << 20 if soft == resource.RLIM_INFINITY else soft - reserve


class Pool:
    def __init__(self, limit: int):
        self.limit = max(1, limit)
        self.conns: dict[_Watch, None] = {}  # insertion order: oldest first
        self.evicted = 0

    def add(self, conn: _Watch) -> None:
        if len(self.conns) >= self.limit:
            self.evict()
        self.conns[conn] = None

    def evict(self) -> None:
        if not self.conns:
            return
        # A connection accepted a loop turn ago is read a turn later: one not heard yet with bytes
        # waiting in the kernel is not silent. Asked of the few first candidates only.
        now = asyncio.get_running_loop().time()
        candidates = heapq.nsmallest(EVICTION_CANDIDATES, self.conns, key=lambda c: c.eviction_order(now))
        victim = next((c for c in candidates if c.heard or not c.bytes_waiting()), candidates[0])
        self.conns.pop(victim, None)
        self.evicted += 1
        victim.abort()


EVICTION_CANDIDATES = 3 * config.ACCEPT_BATCH  # connections accepted but not yet read, at most
# Silent this long after accept: not a client whose first bytes are on their way (through a proxy
# that connected on its own accept, they come a hop later). Real clients send with the last ACK.
SILENT_SECONDS = 0.05


class _Watch(asyncio.Protocol):
    """Between one connection and aiohttp (plaintext side). aiohttp's handler is only
    created once the first request's headers are in: a connection that never sends
    them costs a few hundred bytes and a timer, not a handler and its task."""

    def __init__(self, site: GuardedSite, allowed_sans: frozenset[str] | None):
        self.site, self.allowed_sans = site, allowed_sans
        self.raw: asyncio.Transport | None = None
        self.transport: asyncio.BaseTransport | None = None
        self.handler: asyncio.Protocol | None = None
        self.waiting = True  # for the first request's headers
        self.reused = False  # sent more after its first request (keep-alive, pipelined)
        self.bodied = False  # its first request announced a body: no route here takes one
        self.heard = False  # any byte read from the peer (a TLS handshake's too)
        self.answered_at: float | None = None  # the server's last write to the socket (under TLS: a handshake flight)
        self._head = b""
        self._timer: asyncio.TimerHandle | None = None
        self.opened_at = self.active = 0.0

    @property
    def connected(self) -> bool:
        return self.handler is not None

    @property
    def idle(self) -> bool:
        """Between requests: aiohttp's handler waits for the next one, none queued, and the last
        answer has left (a slow reader's may still sit in the transport's buffer)."""
        waiter = getattr(self.handler, "_waiter", None)
        if waiter is None or waiter.done() or getattr(self.handler, "_messages", True):
            return False
        return not any(t.get_write_buffer_size() for t in (self.raw, self.transport) if isinstance(t, asyncio.WriteTransport))

    def eviction_order(self, now: float) -> tuple[int, float]:
        """Lowest is closed first at the cap (the module's docstring says the order). Silent means
        for SILENT_SECONDS: a new connection's bytes are read a loop turn after it is accepted (and
        Pool.evict asks the kernel), so a young one goes with the rest, quietest first. Unanswered
        TLS bytes rank with silence, oldest first: a real hello split over two segments (a
        post-quantum key share makes it ~1.5 KB) is the youngest of them while its rest comes."""
        if (self.waiting and (self._head or self.connected)) or self.bodied:  # part of its first headers, or a body
            return 0, self.opened_at
        if self.idle:
            return 1, self.active
        if self.reused:
            return 2, self.active
        if (not self.heard and now - self.opened_at > SILENT_SECONDS) or self.tls_bytes_unanswered:
            return 3, self.opened_at
        return 4, self.active

    @property
    def tls_bytes_unanswered(self) -> bool:
        """Under TLS, before the handshake is done: its last bytes were not answered. The handshake
        answers a whole flight (or ends) in the turn it reads it, so these are part of one: a
        ClientHello stalled half-way, or the first byte of a later flight."""
        return self.transport is None and self.heard and (self.answered_at is None or self.answered_at < self.active)

    def bytes_waiting(self) -> bool:
        """Bytes the kernel holds for this socket, not read yet (FIONREAD: no read, no side effect)."""
        sock = self.raw.get_extra_info("socket") if self.raw is not None else None
        fd = sock.fileno() if sock is not None else -1
        if fd < 0:
            return False
        waiting = array.array("i", [0])
        try:
            fcntl.ioctl(fd, termios.FIONREAD, waiting, True)
        except OSError:
            return False
        return waiting[0] > 0

    def opened(self, raw: asyncio.Transport) -> None:
        """The socket is accepted (before any TLS handshake)."""
        loop = asyncio.get_running_loop()
        self.raw, self.opened_at = raw, loop.time()
        self.active = self.opened_at
        self._timer = loop.call_later(self.site.limits.header_timeout, self._too_slow)
        self.site.pool.add(self)

    def closed(self) -> None:
        self.site.pool.conns.pop(self, None)
        if self._timer:
            self._timer.cancel()

    def abort(self) -> None:
        if self.raw is not None:
            self.raw.abort()

    def _too_slow(self) -> None:
        if self.waiting:
            self.site.timed_out += 1
            self.abort()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        if self.raw is None:
            # plain HTTP: the socket's own transport (asyncio hands it over as a BaseTransport)
            self.opened(cast(asyncio.Transport, transport))
        if self.allowed_sans is not None and not _san_allowed(transport, self.allowed_sans):
            log.warning("client_certificate_refused", reason="no allowed SAN", peer=transport.get_extra_info("peername"))
            self.abort()
            return
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.active, self.heard = asyncio.get_running_loop().time(), True
        if self.handler is not None:
            self.reused = not self.waiting  # GET has no body: more bytes are another request
            self.handler.data_received(data)
            if self.waiting and getattr(self.handler, "_messages", None):  # a head over 16 KiB, now parsed (or refused)
                self._headers_in()
            return
        if self.transport is None:
            return
        self._head += data
        end = _headers_end(self._head)
        # Over 16 KiB without an end: aiohttp refuses most such heads at once (400); one it waits on
        # (long lines, few of them) is waited for until it parses the request, or the header timeout.
        if end is not None or len(self._head) > 16384:
            server = self.site._runner.server
            if server is None:  # the runner is set up before any site starts
                raise RuntimeError("connection before the web runner was set up")
            self.handler = server()
            self.handler.connection_made(self.transport)
            head, self._head = self._head, b""
            self.bodied = end is not None and _announces_body(head[:end])
            self.handler.data_received(head)
            # aiohttp queues a request in the call that reads its end: one over 16 KiB may still be coming
            if end is not None or getattr(self.handler, "_messages", None):
                self._headers_in()
            # Pipelined in its first bytes (GET has no body), behind an Upgrade too, which aiohttp's parser
            # leaves unparsed; a stray blank line after the request is not another one.
            self.reused = end is not None and bool(head[end:].strip(b"\r\n"))

    def _headers_in(self) -> None:
        """The first request's headers are in: the header timeout no longer applies."""
        self.waiting = False
        if self._timer:
            self._timer.cancel()

    def eof_received(self) -> bool | None:
        return self.handler.eof_received() if self.handler else None

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed()
        if self.handler is not None:
            handler, self.handler = self.handler, None
            handler.connection_lost(exc)

    def pause_writing(self) -> None:
        if self.handler is not None:
            self.handler.pause_writing()

    def resume_writing(self) -> None:
        if self.handler is not None:
            self.handler.resume_writing()


def _headers_end(head: bytes) -> int | None:
    """Where the first request's headers end (past their blank line), once they have. Blank
    lines before the request line are skipped, as aiohttp's parser does (RFC 9112 2.2): taken
    for the end, they let a slowloris out of the header timeout."""
    start = len(head) - len(head.lstrip(b"\r\n"))
    return min((i + len(sep) for sep in (b"\r\n\r\n", b"\n\n") if (i := head.find(sep, start)) >= 0), default=None)


def _announces_body(head: bytes) -> bool:
    """Whether a request's headers announce a body (a Content-Length other than 0, or a
    Transfer-Encoding): every route here is GET, so such a client waits on nothing of ours."""
    for line in head.split(b"\n")[1:]:
        name, colon, value = line.partition(b":")
        name = name.strip().lower()
        if colon and (name == b"transfer-encoding" or (name == b"content-length" and value.strip() not in (b"0", b""))):
            return True
    return False


def _san_allowed(transport: asyncio.BaseTransport, allowed: frozenset[str]) -> bool:
    sslobj = transport.get_extra_info("ssl_object")
    cert = sslobj.getpeercert() if sslobj is not None else None
    values = {v for kind, v in (cert or {}).get("subjectAltName", ()) if kind in ("DNS", "email", "IP Address", "URI")}
    return bool(values & allowed)


class _TLS(SSLProtocol):
    """asyncio's own TLS layer, told when the socket opens and closes."""

    def __init__(self, watch: _Watch, ctx: ssl.SSLContext, handshake_timeout: float):
        # typeshed asks for a waiter future and an int timeout; asyncio takes None (nobody waits) and float seconds.
        super().__init__(
            asyncio.get_running_loop(),
            watch,
            ctx,
            None,  # type: ignore[arg-type]
            server_side=True,
            ssl_handshake_timeout=handshake_timeout,  # type: ignore[arg-type]
        )
        self.watch = watch

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.watch.opened(cast(asyncio.Transport, transport))  # the socket's transport, under TLS
        # A stand-in, not a subclass: asyncio.Transport's own methods would shadow the delegation.
        super().connection_made(cast(asyncio.BaseTransport, _Written(cast(asyncio.Transport, transport), self.watch)))

    def buffer_updated(self, nbytes: int) -> None:
        # The handshake's bytes: a probe mid-handshake is not a silent socket.
        self.watch.active, self.watch.heard = asyncio.get_running_loop().time(), True
        super().buffer_updated(nbytes)

    def connection_lost(self, exc: BaseException | None) -> None:
        self.watch.closed()
        super().connection_lost(exc)


class _Written:
    """The socket's transport as asyncio's TLS layer sees it: notes when the watch was last
    answered (only public calls; every other attribute is the transport's own)."""

    def __init__(self, transport: asyncio.Transport, watch: _Watch):
        self._transport, self._watch = transport, watch

    def write(self, data: bytes | bytearray | memoryview) -> None:
        self._watch.answered_at = asyncio.get_running_loop().time()
        self._transport.write(data)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)


class GuardedSite(web.BaseSite):
    def __init__(
        self,
        runner: web.BaseRunner,
        host: str | None,
        port: int,
        *,
        backlog: int,
        web_config: Callable[[], WebConfig] | None = None,
        limits: Limits = Limits(),
    ):
        super().__init__(runner, backlog=backlog)
        self.host, self.port = host, port
        self.bound_port = port

        self.web_config = web_config
        self.limits = limits
        self.pool = Pool(limits.max_connections)
        self.timed_out = 0

    @property
    def name(self) -> str:
        return f"{'https' if self.tls else 'http'}://{self.host or '0.0.0.0'}:{self.port}"

    @property
    def tls(self) -> bool:
        return bool(self.web_config and self.web_config().ssl_context)

    async def start(self) -> None:
        await super().start()
        loop = asyncio.get_running_loop()
        # asyncio accepts up to `backlog` connections per loop tick before any of our
        # code runs, and an evicted socket's descriptor is only freed on the next tick:
        # keep that batch small (it is counted in the descriptor budget), and the
        # kernel's queue long (a burst of scrapes must not overflow into SYN retries).
        server = await loop.create_server(self._connection, self.host, self.port, backlog=config.ACCEPT_BATCH)
        self._server = server
        self.bound_port = int(server.sockets[0].getsockname()[1])  # the one chosen, with port 0
        for listening in server.sockets:
            with socket.fromfd(listening.fileno(), listening.family, listening.type) as dup:
                dup.listen(self._backlog)
        install_accept_error_handler(loop, self.pool)

    def _connection(self) -> asyncio.BaseProtocol:
        cfg = self.web_config() if self.web_config else None
        watch = _Watch(self, cfg.allowed_sans if cfg else None)
        if cfg is None or cfg.ssl_context is None:
            return watch
        return _TLS(watch, cfg.ssl_context, self.limits.header_timeout)

    async def stop(self) -> None:
        await super().stop()
        for conn in list(self.pool.conns):  # still in the handshake or the first headers: aiohttp does not know them
            if not conn.connected:
                conn.abort()


class RequestLog:
    """aiohttp's request-error logger (its handler calls ``exception`` and ``debug``). A request its
    parser refuses (a client's malformed bytes: HTTP 400) is counted and logged one line, without
    its traceback, at most once per ACCEPT_ERROR_LOG_INTERVAL_SECONDS: a traceback per request let
    any client, before any authentication, write 24 MB of log in 10 s. A handler's own error
    (HTTP 500) is logged in full."""

    def __init__(self) -> None:
        self.refused = 0
        self._logged, self._suppressed = float("-inf"), 0
        self._server_log = logging.getLogger("aiohttp.server")  # where aiohttp logs them itself

    def debug(self, msg: str, *args: Any, exc_info: BaseException | None = None, **kw: Any) -> None:
        if isinstance(exc_info, http.HttpProcessingError):  # not HTTP at all on a first request (TLS, a scanner)
            self.refused += 1
        self._server_log.debug(msg, *args, exc_info=exc_info, **kw)

    def exception(self, msg: str, *args: Any, exc_info: BaseException | None = None, **kw: Any) -> None:
        if not isinstance(exc_info, http.HttpProcessingError):
            self._server_log.exception(msg, *args, exc_info=exc_info, **kw)
            return
        self.refused += 1
        now = asyncio.get_running_loop().time()
        if now - self._logged < config.ACCEPT_ERROR_LOG_INTERVAL_SECONDS:
            self._suppressed += 1
            return
        # The exception's class, not its text: the text quotes the client's bytes.
        log.warning("bad_request_refused", reason=type(exc_info).__name__, suppressed_since_last=self._suppressed)
        self._logged, self._suppressed = now, 0


def install_accept_error_handler(loop: asyncio.AbstractEventLoop, pool: Pool) -> None:
    """asyncio logs every failed accept() (one per pending connection per tick: ~100 k
    lines in seconds when descriptors run out). Log them at a bounded rate, and close
    the quietest connection (at most one per 100 ms) so the next accept can succeed."""
    previous = loop.get_exception_handler()
    state = {"logged": float("-inf"), "evicted": float("-inf"), "suppressed": 0}

    def handler(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        if not str(context.get("message", "")).startswith("socket.accept() out of system resource"):
            if previous:
                previous(loop, context)
            else:
                loop.default_exception_handler(context)
            return
        now = loop.time()
        if now - state["evicted"] >= 0.1:
            state["evicted"] = now
            pool.evict()
        if now - state["logged"] < config.ACCEPT_ERROR_LOG_INTERVAL_SECONDS:
            state["suppressed"] += 1
            return
        log.error(
            "accept_failed",
            error=str(context.get("exception")),
            connections=len(pool.conns),
            suppressed_since_last=state["suppressed"],
        )
        state.update(logged=now, suppressed=0)

    loop.set_exception_handler(handler)
