"""The aiohttp app: /metrics, /, /healthz, /readyz, /api/v1/summary.

``create_app(settings)`` builds the real app (tests drive it on loopback). Pollers
run as tasks owned by the app's cleanup context, so shutting the app down cancels
and awaits every one of them.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from typing import Any

import aiohttp
from aiohttp import web
from aiohttp.web_log import AccessLogger
from prometheus_client import CollectorRegistry, GCCollector, PlatformCollector, ProcessCollector

from . import config
from .collector import ConnectionCollector, Exposition, SpecDecodeCollector, WebConfigCollector, is_fresh
from .derive import Stats
from .diagnosis_state import together, window_verdict
from .formats import accepts_gzip, choose
from .health import Verdict
from .landing import ChartKey, landing_page
from .model import BaselineProfile, Counters, SeriesKey
from .parse_pool import close_parse_pool
from .poller import TargetPoller
from .server import GuardedSite, Limits, RequestLog, open_file_limit
from .settings import Settings
from .summary import cost, profile_entry, summarize
from .views import TargetView
from .webconfig.auth import Authenticator
from .webconfig.middleware import auth_middleware
from .webconfig.reload import LiveWebConfig

# Above the default 128: a burst of scrapes (many Prometheus replicas, a load
# test) must not overflow the accept queue into 1 s SYN retransmits.
LISTEN_BACKLOG = 1024

POLLERS: web.AppKey[list[TargetPoller]] = web.AppKey("pollers")
SETTINGS = web.AppKey("settings", Settings)
MONO: web.AppKey[Callable[[], float]] = web.AppKey("mono")  # the clock every freshness test reads
# The landing page's charts of its last render, per target and model (landing._trend): drawn again
# only when a step of the longest window added a point.
CHARTS: web.AppKey[dict[str, dict[str, tuple[ChartKey, str]]]] = web.AppKey("charts")
READY: web.AppKey[dict[str, bool]] = web.AppKey("ready")
SITES: web.AppKey[list[GuardedSite]] = web.AppKey("sites")  # the listening sites (start_site)
REQUEST_LOG = web.AppKey("request_log", RequestLog)  # the runner's request-error logger (serve)
# (page, window) -> (the views and the fresh targets it was built from, its body): the summary and the
# landing page are built once per state (a poll, a target turning stale), as /metrics is; per request,
# 100 clients slowed /healthz to 200 ms (the summary) and 103 ms (the landing page).
PAGES: web.AppKey[dict[tuple[str, str], tuple[tuple[object, ...], frozenset[str], str]]] = web.AppKey("pages")


def create_app(
    settings: Settings,
    *,
    mono: Callable[[], float] = time.monotonic,
    wall: Callable[[], float] = time.time,
    start_polling: bool = True,
    web_config: LiveWebConfig | None = None,
) -> web.Application:
    # aiohttp's own request limits stand: 8 KiB request line and header fields, 1 MiB body.
    # The auth middleware is there whenever a web config is: a reload may add users.
    authenticator = Authenticator() if web_config else None
    middlewares = [auth_middleware(web_config, authenticator, mono)] if web_config and authenticator else []
    app = web.Application(middlewares=middlewares)
    if authenticator:

        async def close_authenticator(app: web.Application) -> None:
            authenticator.close()

        app.on_cleanup.append(close_authenticator)
    app[SETTINGS] = settings
    app[MONO] = mono
    app[POLLERS] = []
    app[READY] = {"ready": False}
    app[SITES] = []
    app[REQUEST_LOG] = RequestLog()
    app[CHARTS] = {}
    app[PAGES] = {}

    async def pollers_ctx(app: web.Application) -> AsyncIterator[None]:
        async with aiohttp.ClientSession(auto_decompress=True) as session:
            app[POLLERS].extend(TargetPoller(t, settings, session, mono, wall) for t in settings.targets)
            tasks = [asyncio.create_task(p.run(), name=f"poll:{p.target.name}") for p in app[POLLERS]] if start_polling else []
            app[READY]["ready"] = True
            yield
            app[READY]["ready"] = False
            for task in tasks:
                task.cancel()
            for task in tasks:
                with contextlib.suppress(asyncio.CancelledError):
                    await task
            close_parse_pool()  # a big payload still being parsed must not delay the exit

    app.cleanup_ctx.append(pollers_ctx)
    registry = CollectorRegistry(auto_describe=False)
    registry.register(SpecDecodeCollector(lambda: [p.view for p in app[POLLERS]], settings, mono))
    registry.register(ConnectionCollector(lambda: connection_counts(app)))
    if web_config is not None:
        registry.register(WebConfigCollector(web_config))
    # The usual process_* and python_* series, on the private registry.
    ProcessCollector(registry=registry)
    PlatformCollector(registry=registry)
    GCCollector(registry=registry)
    app.router.add_get("/metrics", metrics_handler(app, registry, web_config))
    app.router.add_get("/", landing)
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    app.router.add_get("/api/v1/summary", summary)
    return app


def metrics_handler(
    app: web.Application, registry: CollectorRegistry, web_config: LiveWebConfig | None = None
) -> Callable[[web.Request], Awaitable[web.Response]]:
    """/metrics, rendered once per state off the event loop (collector.Exposition): the
    views are immutable, so until a poll publishes a new one or a target turns stale,
    every scrape gets the same bytes (200 concurrent scrapes cost one render)."""
    exposition = Exposition(registry)

    def state() -> tuple[object, ...]:
        """What the body depends on: the views, their freshness, the reloads, the connection counts."""
        settings, now = app[SETTINGS], app[MONO]()
        views = tuple(p.view for p in app[POLLERS])
        reloads = () if web_config is None else (web_config.last_reload_ok, web_config.reload_failures)
        return (*views, *(is_fresh(v, now, settings.staleness) for v in views), *reloads, *connection_counts(app))

    async def metrics(request: web.Request) -> web.Response:
        encoder, content_type = choose(request.headers.get("Accept", ""))
        identity, zipped = await exposition.bodies(encoder, state)
        headers = {"Content-Type": content_type, "Vary": "Accept, Accept-Encoding"}
        if accepts_gzip(request.headers.get("Accept-Encoding", "")):
            return web.Response(body=zipped, headers={**headers, "Content-Encoding": "gzip"})
        return web.Response(body=identity, headers=headers)

    return metrics


def connection_counts(app: web.Application) -> tuple[int, int, int]:
    """(evicted, timed out) client connections, over the app's listening sites, and requests refused as malformed."""
    sites = app[SITES]
    return sum(s.pool.evicted for s in sites), sum(s.timed_out for s in sites), app[REQUEST_LOG].refused


async def healthz(request: web.Request) -> web.Response:
    # Liveness never depends on vLLM: failing it would restart the GPU pod.
    return web.Response(text="ok\n")


async def readyz(request: web.Request) -> web.Response:
    if request.app[READY]["ready"]:
        return web.Response(text="ready\n")
    return web.Response(status=503, text="starting\n")


def fresh_views(app: web.Application) -> list[TargetView]:
    settings, now = app[SETTINGS], app[MONO]()
    return [p.view for p in app[POLLERS] if is_fresh(p.view, now, settings.staleness)]


def summary_for(app: web.Application, window: str, views: list[TargetView]) -> dict[str, Any]:
    """The report JSON schema over one window, across the fresh targets' ``views``."""
    settings = app[SETTINGS]
    several = len(settings.targets) > 1

    def engine_key(target: str, engine: str) -> str:  # two targets can both have engine "0" (replicas): kept apart
        return f"{target}/{engine}" if several else engine

    engines: dict[SeriesKey, Counters] = {}
    gone: set[SeriesKey] = set()  # summed and judged with their model, listed nowhere (as on /metrics)
    spans = {}
    for v in views:
        if window not in v.window_spans:
            continue
        spans[v.name] = v.window_spans[window]
        # A model that went away has no view: its figures go with its counters (as on /metrics).
        for mv in v.models:
            mw = mv.windows.get(window)
            for engine, c in (mw.counters if mw else {}).items():
                key = (mv.model_name, engine_key(v.name, engine))
                engines[key] = c
                if mw is not None and engine not in mw.engines:
                    gone.add(key)
    fresh = {v.name for v in views}
    stale = [t.name for t in settings.targets if t.name not in fresh]
    warnings = [f"target {name}: no fresh data; left out" for name in stale]
    longest_span = max(spans.values()) if spans else None
    # One span for every rate: targets whose windows span different times (one polled for less
    # than the window) give no per-second figure, rather than rates over the longest (helper-42).
    span = longest_span
    if span is not None and span - min(spans.values()) > span / config.WINDOW_RESOLUTION + settings.poll_interval:
        shown = ", ".join(f"{name} {seconds:.0f} s" for name, seconds in spans.items())
        warnings.append(f"the targets' {window} windows span different times ({shown}): no per-second figures")
        span = None

    # Each model's profile: the one its first view shows (the verdict's, the cost's and the entry's).
    profiles: dict[str, BaselineProfile | None] = {}
    for v in views:
        for mv in v.models:
            profiles.setdefault(mv.model_name, mv.profile)

    def verdict(model: str, per_engine: Mapping[str, Counters]) -> Verdict:
        # The health window of one target: the very verdict /metrics and the landing page show.
        served = [(v.name, mv) for v in views for mv in v.models if mv.model_name == model]
        if window == settings.health_window and len(served) == 1:
            name, mv = served[0]
            states = {engine_key(name, e): state for e, state in mv.engine_health.items()}
            return Verdict(mv.health, mv.health_reason, states, mv.health_causes)
        # Any other window, or several targets: judged as the poller judges its health window,
        # with what it saw beside the counters (restarts, k changes, the figures before them,
        # position 0 within the day) and the longest window before it.
        profile = profiles.get(model)
        last = settings.windows[-1][0]
        longest = [c for _, mv in served if (w := mv.windows.get(last)) is not None for c in w.counters.values()]
        seen = together([(name, mv.seen) for name, mv in served])
        return window_verdict(
            window, per_engine, longest_span, longest, profile, settings.windows, settings.detection, settings.min_drafts, seen
        )

    def cost_of(model: str, stats: Stats) -> dict[str, Any]:
        # The cost gauges' own reference over every window: the profile of the model's view.
        profile = profiles.get(model)
        healthy = None if profile is None else profile.mean_acceptance_length
        k, al, drafts = stats.k, stats.mean_acceptance_length, stats.num_drafts
        return cost(k, al, drafts, healthy, settings.detection.draft_step_cost, settings.min_drafts, span)

    out = summarize(engines, span, warnings, verdict, cost_of, gone)
    for model, entry in out["models"].items():  # as report --format json has it (None: no healthy reference)
        entry["profile"] = profile_entry(profiles.get(model))
    return out


async def summary(request: web.Request) -> web.Response:
    settings = request.app[SETTINGS]
    window = request.query.get("window", settings.health_window)
    if window not in dict(settings.windows):
        valid = ", ".join(w for w, _ in settings.windows)
        return web.json_response({"error": f"unknown window {window!r}; valid: {valid}"}, status=400)
    app = request.app
    text = per_state(
        app, ("summary", window), lambda views, fresh: json.dumps(summary_for(app, window, [v for v in views if v.name in fresh]))
    )
    return web.Response(text=text, content_type="application/json")


async def landing(request: web.Request) -> web.Response:
    app = request.app

    def build(views: tuple[TargetView, ...], fresh: frozenset[str]) -> str:
        kept = app[CHARTS]  # the app's state is frozen once started: its dict is not
        text, charts = landing_page(app[SETTINGS], list(views), set(fresh), kept)
        kept.clear()
        kept.update(charts)
        return text

    return web.Response(text=per_state(app, ("landing", ""), build), content_type="text/html")


def per_state(app: web.Application, page: tuple[str, str], build: Callable[[tuple[TargetView, ...], frozenset[str]], str]) -> str:
    """``page``'s body, built again only when a poll published a view (by identity: views are
    immutable) or a target turned stale since the last build; built from that very state (the views,
    the fresh targets' names), so the body and what it is cached under cannot disagree."""
    views = tuple(p.view for p in app[POLLERS])
    fresh = frozenset(v.name for v in fresh_views(app))
    cached = app[PAGES].get(page)
    if cached is None or cached[1] != fresh or any(a is not b for a, b in zip(cached[0], views, strict=True)):
        cached = app[PAGES][page] = (views, fresh, build(views, fresh))
    return cached[2]


async def start_site(
    runner: web.AppRunner, host: str | None, port: int, web_config: LiveWebConfig | None = None, limits: Limits = Limits()
) -> tuple[GuardedSite, int]:
    """Start ``runner`` on host:port; returns the site and the bound port (useful with port 0).
    TLS comes from the web config's current state, per connection (server.py)."""
    site = GuardedSite(
        runner, host, port, backlog=LISTEN_BACKLOG, limits=limits, web_config=web_config.current if web_config else None
    )
    await site.start()
    if SITES in runner.app:
        runner.app[SITES].append(site)  # its connection counts go to /metrics
    return site, site.bound_port


async def serve(settings: Settings, stop: asyncio.Event | None = None, web_config: LiveWebConfig | None = None) -> None:
    """Run until SIGTERM/SIGINT (or ``stop``), then shut down with no task left behind."""
    import signal

    import structlog

    log = structlog.get_logger("vllm_specdec_exporter")
    stop = stop or asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    # Connections stay below the open-file limit, a reserve kept for the polls.
    fit = open_file_limit(config.FD_RESERVE + 3 * config.ACCEPT_BATCH + 2 * len(settings.targets))
    limits = Limits(max_connections=max(8, min(config.MAX_CONNECTIONS, fit)))
    app = create_app(settings, web_config=web_config)
    runner = web.AppRunner(
        app,
        access_log_class=AccessLogger,
        handle_signals=False,
        keepalive_timeout=config.IDLE_TIMEOUT_SECONDS,
        logger=app[REQUEST_LOG],
    )
    await runner.setup()
    _, port = await start_site(runner, settings.listen_host or None, settings.listen_port, web_config, limits)
    current = web_config.current() if web_config else None
    if settings.file_targets_replaced:
        log.warning("config_targets_replaced", by=settings.file_targets_replaced_by, file_targets=settings.file_targets_replaced)
    methods = sorted({p.method for p in settings.baselines if p.method})
    for name, method in settings.methods_without_profile.items():
        log.warning("method_without_profile", target=name, method=method, profiles_are_for=methods)
    log.info(
        "listening",
        address=f"{settings.listen_host or '0.0.0.0'}:{port}",
        tls=bool(current and current.ssl_context),
        basic_auth=bool(current and current.users),
        max_connections=limits.max_connections,
        targets=[t.name for t in settings.targets],
        windows=[w for w, _ in settings.windows],
    )
    try:
        await stop.wait()
    finally:
        log.info("shutting_down")
        await runner.cleanup()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(sig)
        leftover = [t for t in asyncio.all_tasks() if t is not asyncio.current_task() and not t.done()]
        log.info("stopped", leftover_tasks=len(leftover))
