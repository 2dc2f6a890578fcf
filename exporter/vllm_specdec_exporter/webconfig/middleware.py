"""The aiohttp middleware in front of every endpoint but /healthz and /readyz: rate_limit,
basic auth, and the configured headers on every response."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from aiohttp import web
from aiohttp.typedefs import Handler, Middleware

from .auth import Authenticator
from .limits import RateLimiter, client_key
from .load import WebConfig
from .reload import LiveWebConfig

OPEN_PATHS = frozenset({"/healthz", "/readyz"})
# A request refused without a bcrypt check (429: too many checks pending, auth.py's bounds)
# is answered after this pause: a client sending again as soon as answered gets a few
# a second per connection, not thousands (which would cost the event loop what bcrypt no longer does).
BCRYPT_REFUSAL_DELAY_SECONDS = 0.2


def _too_many(retry_after: int | None = None) -> web.Response:
    return web.Response(
        status=429, text="too many requests\n", headers={"Retry-After": str(retry_after)} if retry_after else None
    )


def auth_middleware(live: LiveWebConfig, authenticator: Authenticator, mono: Callable[[], float] = time.monotonic) -> Middleware:
    """Basic auth and rate_limit. exporter-toolkit takes one bucket for every request
    before auth, so a client without the password could use up the real scrapes'
    share; here each client address has its own buckets, and requests without valid
    credentials (none, malformed, wrong, or not yet known to be right) draw on a
    bucket of their own: they can neither use up nor wait for an authenticated one's."""
    limiter = RateLimiter(mono)

    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        cfg = live.current()
        try:
            response = await _guarded(request, handler, cfg)
        except web.HTTPException as e:  # 404 and friends get the configured headers too
            e.headers.update(cfg.headers)
            raise
        response.headers.update(cfg.headers)
        return response

    async def _guarded(request: web.Request, handler: Handler, cfg: WebConfig) -> web.StreamResponse:
        if request.path in OPEN_PATHS:
            return await handler(request)
        client = client_key(request.remote)
        if not cfg.users:
            if cfg.rate_limit and not limiter.allow(cfg.rate_limit, "any", client):
                return _too_many()
            return await handler(request)
        creds = authenticator.credentials(cfg, request.headers.get("Authorization"))
        if creds is not None and authenticator.cached(creds):
            if cfg.rate_limit and not limiter.allow(cfg.rate_limit, "authenticated", client):
                return _too_many()
            return await handler(request)
        # Not known to be right: its own bucket, taken before the bcrypt it would cost.
        if cfg.rate_limit and not limiter.allow(cfg.rate_limit, "unauthenticated", client):
            return _too_many()
        if creds is not None:
            ok = await authenticator.verify(creds, client)
            if ok is None:  # too many password checks pending: refused without one
                await asyncio.sleep(BCRYPT_REFUSAL_DELAY_SECONDS)
                return _too_many(retry_after=1)
            if ok:
                return await handler(request)
        return web.Response(
            status=401, text="unauthorized\n", headers={"WWW-Authenticate": 'Basic realm="vllm-specdec-exporter"'}
        )

    return middleware
