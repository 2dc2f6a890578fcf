"""A real aiohttp server on loopback, in a background thread, for CLI tests."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable

from aiohttp import web


class LoopbackServer:
    """Serves ``handler(request_number) -> web.Response`` on 127.0.0.1:<free port>."""

    def __init__(self, handler: Callable[[int], web.Response]):
        self.handler = handler
        self.requests = 0
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self.port = 0

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        n = self.requests
        self.requests += 1
        return self.handler(n)

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        app = web.Application()
        app.router.add_get("/metrics", self._handle)
        self._runner = web.AppRunner(app, access_log=None)
        self._loop.run_until_complete(self._runner.setup())
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        self._loop.run_until_complete(site.start())
        self.port = site._server.sockets[0].getsockname()[1]
        self._ready.set()
        self._loop.run_forever()
        self._loop.run_until_complete(self._runner.cleanup())
        self._loop.close()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/metrics"

    def __enter__(self) -> LoopbackServer:
        self._thread.start()
        assert self._ready.wait(10), "loopback server did not start"
        return self

    def __exit__(self, *exc) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)


def prom(body: bytes) -> web.Response:
    return web.Response(body=body, content_type="text/plain", charset="utf-8")
