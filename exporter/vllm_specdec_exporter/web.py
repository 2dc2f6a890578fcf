"""The aiohttp app: /metrics, /, /healthz, /readyz, /api/v1/summary.

``create_app(settings)`` builds the real app (tests drive it on loopback). Pollers
run as tasks owned by the app's cleanup context, so shutting the app down cancels
and awaits every one of them.
"""

from __future__ import annotations

import asyncio
import contextlib
import html
import math
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from typing import Any

import aiohttp
from aiohttp import web
from aiohttp.web_log import AccessLogger
from prometheus_client import CollectorRegistry, GCCollector, PlatformCollector, ProcessCollector
from prometheus_client.exposition import choose_encoder

from . import __version__, config
from .charts import POSITIONS, Frame, acceptance_length_chart, position_chart
from .collector import ConnectionCollector, Exposition, SpecDecodeCollector, WebConfigCollector, is_fresh
from .diagnosis import describe
from .diagnosis_state import together, window_verdict
from .health import NO_BASELINE, Verdict
from .history import TrendPoint
from .model import Counters, SeriesKey
from .parse_pool import close_parse_pool
from .poller import TargetPoller
from .render import bar
from .server import GuardedSite, Limits, open_file_limit
from .settings import Settings
from .summary import summarize
from .views import ModelView, ModelWindow, TargetView
from .webconfig.auth import Authenticator
from .webconfig.middleware import auth_middleware
from .webconfig.reload import LiveWebConfig

# Above the default 128: a burst of scrapes (many Prometheus replicas, a load
# test) must not overflow the accept queue into 1 s SYN retransmits.
LISTEN_BACKLOG = 1024

POLLERS: web.AppKey[list[TargetPoller]] = web.AppKey("pollers")
SETTINGS = web.AppKey("settings", Settings)
MONO: web.AppKey[Callable[[], float]] = web.AppKey("mono")  # the clock every freshness test reads
ChartKey = tuple[tuple[TrendPoint, ...], float, float | None, int, int]  # (trend, end, healthy AL, k, min_drafts)
# The landing page's charts of its last render, per target and model (web._trend): drawn again
# only when a step of the longest window added a point.
CHARTS: web.AppKey[dict[str, dict[str, tuple[ChartKey, str]]]] = web.AppKey("charts")
READY: web.AppKey[dict[str, bool]] = web.AppKey("ready")
SITES: web.AppKey[list[GuardedSite]] = web.AppKey("sites")  # the listening sites (start_site)


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
    app[CHARTS] = {}

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

    async def metrics(request: web.Request) -> web.Response:
        encoder, content_type = choose_encoder(request.headers.get("Accept", ""))
        settings, now = app[SETTINGS], app[MONO]()
        views = tuple(p.view for p in app[POLLERS])
        reloads = () if web_config is None else (web_config.last_reload_ok, web_config.reload_failures)
        state = (*views, *(is_fresh(v, now, settings.staleness) for v in views), *reloads, *connection_counts(app))
        identity, zipped = await exposition.bodies(encoder, state)
        headers = {"Content-Type": content_type, "Vary": "Accept-Encoding"}
        if accepts_gzip(request.headers.get("Accept-Encoding", "")):
            return web.Response(body=zipped, headers={**headers, "Content-Encoding": "gzip"})
        return web.Response(body=identity, headers=headers)

    return metrics


def connection_counts(app: web.Application) -> tuple[int, int]:
    """(evicted, timed out) client connections, over the app's listening sites."""
    sites = app[SITES]
    return sum(s.pool.evicted for s in sites), sum(s.timed_out for s in sites)


def accepts_gzip(header: str) -> bool:
    """RFC 9110: gzip (or *) listed with a q-value above 0; 'gzip;q=0' refuses it."""
    q = {}
    for item in header.lower().split(","):
        name, _, params = item.strip().partition(";")
        weight = 1.0
        for param in params.split(";"):
            key, _, value = param.strip().partition("=")
            if key == "q":
                try:
                    weight = float(value)
                except ValueError:
                    weight = 0.0
        q[name.strip()] = weight
    return q.get("gzip", q.get("*", 0.0)) > 0


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


def summary_for(app: web.Application, window: str) -> dict[str, Any]:
    """The report JSON schema over one window, across fresh targets (what their views publish)."""
    settings = app[SETTINGS]
    views = fresh_views(app)
    several = len(settings.targets) > 1
    engines: dict[SeriesKey, Counters] = {}
    spans = []
    for v in views:
        if window not in v.window_spans:
            continue
        spans.append(v.window_spans[window])
        # A model that went away has no view: its figures go with its counters (as on /metrics).
        for mv in v.models:
            mw = mv.windows.get(window)
            for engine, c in (mw.counters if mw else {}).items():
                # Two targets can both have engine "0" (replicas): keep them apart.
                engines[(mv.model_name, f"{v.name}/{engine}" if several else engine)] = c
    fresh = {v.name for v in views}
    stale = [t.name for t in settings.targets if t.name not in fresh]
    warnings = [f"target {name}: no fresh data; left out" for name in stale]
    span = max(spans) if spans else None

    def verdict(model: str, per_engine: Mapping[str, Counters]) -> Verdict:
        # The health window of one target: the very verdict /metrics and the landing page show.
        served = [(v.name, mv) for v in views for mv in v.models if mv.model_name == model]
        if window == settings.health_window and len(served) == 1:
            mv = served[0][1]
            return Verdict(mv.health, mv.health_reason, mv.engine_health, mv.health_causes)
        # Any other window, or several targets: judged as the poller judges its health window,
        # with what it saw beside the counters (restarts, k changes, the figures before them,
        # position 0 within the day) and the longest window before it.
        profile = served[0][1].profile if served else None
        last = settings.windows[-1][0]
        longest = [c for _, mv in served if (w := mv.windows.get(last)) is not None for c in w.counters.values()]
        seen = together([(name, mv.seen) for name, mv in served])
        return window_verdict(
            window, per_engine, span, longest, profile, settings.windows, settings.detection, settings.min_drafts, seen
        )

    return summarize(engines, span, warnings, verdict)


async def summary(request: web.Request) -> web.Response:
    settings = request.app[SETTINGS]
    window = request.query.get("window", settings.health_window)
    if window not in dict(settings.windows):
        valid = ", ".join(w for w, _ in settings.windows)
        return web.json_response({"error": f"unknown window {window!r}; valid: {valid}"}, status=400)
    return web.json_response(summary_for(request.app, window))


def _fmt(v: float | None, spec: str) -> str:
    return "-" if v is None else format(v, spec)


def _engine_table(mv: ModelView, w: ModelWindow | None) -> str:
    """Per engine over the health window; a collapsed or lagging engine is marked, so one
    dead data-parallel rank cannot hide behind its siblings."""
    if w is None or not w.engines:
        return ""
    rows = []
    for engine, ef in w.engines.items():
        state = mv.engine_health.get(engine, "idle")
        mark = " &#9888;" if state in ("collapsed", "degraded") else ""
        rows.append(
            f"<tr class=health-{state}><td>{html.escape(engine)}</td><td>{ef.drafts:,.0f}</td>"
            f"<td>{_fmt(ef.mean_acceptance_length, '.3f')}</td>"
            f"<td>{'-' if ef.acceptance_rate is None else f'{100 * ef.acceptance_rate:.1f} %'}</td>"
            f"<td><b>{state}</b>{mark}</td></tr>"
        )
    return (
        "<table class=engines><tr><th>engine</th><th>drafts</th><th>acceptance length</th><th>acceptance</th>"
        f"<th>health</th></tr>{''.join(rows)}</table>"
    )


# The landing page draws at most this many models' charts (each a few ms to build at k=8, once
# per step of the longest window: cached in between); the others keep their words.
LANDING_CHARTS = config.MAX_MODELS_PER_TARGET


def _charts(mv: ModelView, settings: Settings, end: float) -> str:
    """The model's acceptance length and per-position acceptance over the longest window up to
    ``end`` (the last step of its history), one point per step (TargetHistory.trends); no
    figure where fewer than min_drafts drafts stand behind a step."""
    label, seconds = settings.windows[-1]
    k, least = max(mv.k, 1), settings.min_drafts
    healthy = mv.profile.mean_acceptance_length if mv.profile else None
    degraded = settings.detection.degraded_floor_under(healthy) if healthy is not None else None
    shares = [p.position_acceptance if p.drafts >= least else () for p in mv.trend]
    al = [(p.t, p.mean_acceptance_length if p.drafts >= least else None) for p in mv.trend]
    positions = [[(p.t, sh[i] if i < len(sh) else None) for p, sh in zip(mv.trend, shares, strict=True)] for i in range(k)]
    frame = Frame(end - seconds, end, 1.0, k + 1.0)
    return acceptance_length_chart(frame, al, healthy, degraded, f"acceptance length over the last {label}") + position_chart(
        Frame(end - seconds, end, 0.0, 1.0), positions, f"acceptance per position over the last {label}"
    )


def _trend(
    mv: ModelView,
    settings: Settings,
    end: float,
    last_poll: float | None,
    cache: Mapping[str, tuple[ChartKey, str]] | None = None,
    kept: dict[str, tuple[ChartKey, str]] | None = None,
) -> str:
    """The charts and the words beside them, which say what they show, so a terminal browser
    loses nothing but the picture. The charts come from ``cache`` (the last render's) while
    no step added a point; what is drawn goes to ``kept``."""
    enough = [p for p in mv.trend if p.drafts >= settings.min_drafts]
    if not enough:
        return ""
    label, seconds = settings.windows[-1]
    esc, k = html.escape, max(mv.k, 1)
    healthy = mv.profile.mean_acceptance_length if mv.profile else None
    key: ChartKey = (mv.trend, end, healthy, k, settings.min_drafts)
    cached = cache.get(mv.model_name) if cache is not None else None
    if cached is not None and cached[0][0] is mv.trend and cached[0][1:] == key[1:]:
        svgs = cached[1]
    else:
        svgs = _charts(mv, settings, end)
    if kept is not None:
        kept[mv.model_name] = (key, svgs)
    figures = [p.mean_acceptance_length or 1.0 for p in enough]
    against = (
        f"against the healthy reference {healthy:.2f} (green dashes, the profile) and the degraded threshold "
        f"{settings.detection.degraded_floor_under(healthy):.3f} (orange dots)"
        if healthy is not None
        else "with no healthy reference (no profile)"
    )
    step = seconds / config.WINDOW_RESOLUTION
    behind = ""
    if last_poll is not None and last_poll - end > 2 * step:
        behind = f" (up to {esc(config.format_duration(round(last_poll - end)))} before the last poll: no drafts since)"
    swatches = ", ".join(f'<span style="color:{POSITIONS[i % len(POSITIONS)]}">&#9632; position {i}</span>' for i in range(k))
    return (
        f"<figure class=trend>{svgs}<figcaption>Last {esc(label)}{behind}, one point per "
        f"{esc(config.format_duration(step))} with at least {settings.min_drafts:,} drafts: acceptance length (blue; 1 "
        f"to k+1 = {k + 1}; lowest {min(figures):.3f}, latest {figures[-1]:.3f}) {against}; acceptance per position "
        f"(0 to 100 %): {swatches}.</figcaption></figure>"
    )


async def landing(request: web.Request) -> web.Response:
    settings = request.app[SETTINGS]
    fresh = {v.name for v in fresh_views(request.app)}
    esc = html.escape
    rows, models = [], []
    # Each target's charts of the last render (only those drawn again are kept), and how many.
    previous, drawn, undrawn = request.app[CHARTS].copy(), 0, 0
    charts: dict[str, dict[str, tuple[ChartKey, str]]] = {}
    for p in request.app[POLLERS]:
        v = p.view
        state = "up" if v.up else "down"
        last = (
            "never" if v.last_success_wall is None else time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(v.last_success_wall))
        )
        producer = esc(v.producer or "-") + (f" (approximate: {esc(', '.join(v.approximate))})" if v.approximate else "")
        rows.append(
            f"<tr><td>{esc(v.name)}</td><td>{esc(v.url)}</td><td>{producer}</td><td class={state}>{state}</td>"
            f"<td>{last}</td><td>{esc(v.last_error or '')}</td></tr>"
        )
        if v.name not in fresh:
            continue
        # The charts end at the target's last step (every model that drafted in it has a point there).
        trend_end = max((mv.trend[-1].t for mv in v.models if mv.trend), default=None)
        kept = charts[v.name] = {}
        for mv in v.models:
            w = mv.windows.get(settings.health_window)
            st = w.stats if w else None
            # The verdict's threshold beside the profile's AL: 'ok' at 2.1 under a profile of 2.27 is right.
            floor = settings.detection.degraded_floor_under(mv.profile.mean_acceptance_length) if mv.profile else 0.0
            baseline = (
                f"{mv.profile.mean_acceptance_length:.2f} ({esc(mv.profile.name)}; healthy from {floor:.3f} = 1 + "
                f"{settings.detection.degraded_fraction:g} x (baseline - 1))"
                if mv.profile
                else f"no profile: {esc(NO_BASELINE)}"
            )
            if mv.profile and mv.profile_matched_by != "served_name":
                how = mv.profile_matched_by.replace("_", " ")
                baseline += ", named by the target" if how == "config" else f", matched by {esc(how)}"
            if mv.root and mv.root != mv.model_name:
                baseline += f"; serves {esc(mv.root)} (its --model)"
            bars = ""
            if st is not None and st.num_drafts >= settings.min_drafts:
                for i, fraction in enumerate(st.per_position_acceptance):
                    pct = 0 if fraction is None else 100 * fraction
                    bars += (
                        f"<div class=bar><span>position {i}</span><meter min=0 max=1 value={fraction or 0:.4f}>"
                        f"</meter> {pct:.1f} % <code>{bar(fraction, 20)}</code></div>"
                    )
            al = _fmt(st.mean_acceptance_length if st and st.num_drafts >= settings.min_drafts else None, ".3f")
            chart = ""
            if trend_end is not None and drawn < LANDING_CHARTS:
                chart = _trend(mv, settings, trend_end, v.last_success_mono, previous.get(v.name), kept)
                drawn += bool(chart)
            elif mv.trend:
                undrawn += 1
            models.append(
                f"<section><h3>{esc(mv.model_name)} <small>on {esc(v.name)}, k={mv.k}</small></h3>"
                f"<p class=health-{mv.health}>health: <b>{mv.health}</b> (window {esc(settings.health_window)})"
                f"{': ' + esc(mv.health_reason) if mv.health_reason else ''}</p>"
                f"{'<p class=hint>' + esc(describe(mv.health_causes)) + '</p>' if mv.health_causes else ''}"
                f"<p>mean acceptance length <b>{al}</b> against baseline {baseline}; "
                f"drafts in window: {_fmt(st.num_drafts if st else None, ',.0f')}</p>"
                f"{chart}{bars}"
                f"{_engine_table(mv, w)}</section>"
            )
    request.app[CHARTS].clear()  # the app's state is frozen once started: its dict is not
    request.app[CHARTS].update(charts)
    cut = f"<p>Charts drawn for the first {LANDING_CHARTS} models only; {undrawn} more have none.</p>" if undrawn else ""
    # The page refreshes itself (every poll, no more often than every 5 s) and says when it was rendered.
    refresh = max(5, math.ceil(settings.poll_interval))
    rendered = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
    page = f"""<!doctype html>
<html><head><meta charset=utf-8><meta http-equiv=refresh content={refresh}><title>vllm-specdec-exporter</title>
<style>body{{font-family:sans-serif;max-width:60em;margin:2em auto}}td,th{{padding:.2em .8em;text-align:left}}
.up{{color:green}}.down{{color:#b00}}.health-collapsed,.health-degraded{{color:#b00}}.health-ok{{color:green}}
.bar span{{display:inline-block;width:7em}}meter{{width:20em}}svg.chart{{margin:0 1em .3em 0;vertical-align:top}}
figure.trend{{margin:.5em 0}}figcaption{{font-size:.85em;color:#444}}</style></head>
<body><h1>vllm-specdec-exporter {__version__}</h1>
<p>Speculative-decoding acceptance of the vLLM servers below, polled every {settings.poll_interval:g} s.
Windows: {esc(", ".join(w for w, _ in settings.windows))}.</p>
<p class=rendered>Rendered {rendered}; this page refreshes itself every {refresh} s.</p>
<p><a href="/metrics">/metrics</a> · <a href="/api/v1/summary?window={esc(settings.health_window)}">/api/v1/summary</a>
· <a href="/healthz">/healthz</a> · <a href="/readyz">/readyz</a></p>
<h2>Targets</h2><table><tr><th>target</th><th>url</th><th>producer</th><th>state</th><th>last success</th><th>last error</th></tr>
{"".join(rows)}</table>
<h2>Models</h2>{"".join(models) or "<p>No fresh data yet.</p>"}{cut}
</body></html>"""
    return web.Response(text=page, content_type="text/html")


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
    runner = web.AppRunner(
        create_app(settings, web_config=web_config),
        access_log_class=AccessLogger,
        handle_signals=False,
        keepalive_timeout=config.IDLE_TIMEOUT_SECONDS,
    )
    await runner.setup()
    _, port = await start_site(runner, settings.listen_host or None, settings.listen_port, web_config, limits)
    current = web_config.current() if web_config else None
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
