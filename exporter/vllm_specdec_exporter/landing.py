"""The landing page (/): the targets, then per model its verdict, figures, charts and engines.

Plain HTML with no script; the charts (charts.py) are drawn again only when a step of the
longest window added a point, and the words beside them say what they show."""

from __future__ import annotations

import html
import math
import time
from collections.abc import Iterable, Mapping, Sequence, Set

from . import __version__, config, durations
from .baselines import NO_BASELINE
from .charts import POSITIONS, Frame, acceptance_length_chart, position_chart
from .diagnosis import describe
from .render import bar
from .settings import Settings
from .trend import TrendPoint
from .views import ModelView, ModelWindow, TargetView

ChartKey = tuple[tuple[TrendPoint, ...], float, float | None, int, int]  # (trend, end, healthy AL, k, min_drafts)


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


def _charts(mv: ModelView, settings: Settings, end: float, top: float) -> str:
    """The model's acceptance length and per-position acceptance over the longest window up to
    ``end`` (the last step of its history), one point per step (TargetHistory.trends); no
    figure where fewer than min_drafts drafts stand behind a step. The AL chart spans 1 to ``top``."""
    label, seconds = settings.windows[-1]
    k, least = mv.k, settings.min_drafts
    healthy = mv.profile.mean_acceptance_length if mv.profile else None
    degraded = settings.detection.degraded_floor_under(healthy) if healthy is not None else None
    al = [(p.t, p.mean_acceptance_length if p.drafts >= least else None) for p in mv.trend]
    chart = acceptance_length_chart(
        Frame(end - seconds, end, 1.0, top), al, healthy, degraded, f"acceptance length over the last {label}"
    )
    if not k:  # no per-position counters: nothing to draw per position
        return chart
    shares = [p.position_acceptance if p.drafts >= least else () for p in mv.trend]
    positions = [[(p.t, sh[i] if i < len(sh) else None) for p, sh in zip(mv.trend, shares, strict=True)] for i in range(k)]
    return chart + position_chart(
        Frame(end - seconds, end, 0.0, 1.0), positions, f"acceptance per position over the last {label}"
    )


def _al_top(k: int, healthy: float | None, figures: Iterable[float]) -> float:
    """The acceptance length chart's top: k + 1, AL's bound; the highest AL drawn where that is higher
    (k unknown: no per-position counters, as SGLang; or k lowered within the window)."""
    return max([k + 1.0 if k else 2.0, healthy or 0.0, *figures])


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
    enough = [p for p in mv.trend if p.drafts >= settings.min_drafts and p.mean_acceptance_length is not None]
    if not enough:
        return ""
    label, seconds = settings.windows[-1]
    esc, k = html.escape, max(mv.k, 1)
    healthy = mv.profile.mean_acceptance_length if mv.profile else None
    figures = [al for p in enough if (al := p.mean_acceptance_length) is not None]
    top = _al_top(mv.k, healthy, figures)  # the chart's and its caption's
    key: ChartKey = (mv.trend, end, healthy, mv.k, settings.min_drafts)  # mv.k: k unknown (0) draws otherwise than 1
    cached = cache.get(mv.model_name) if cache is not None else None
    if cached is not None and cached[0][0] is mv.trend and cached[0][1:] == key[1:]:
        svgs = cached[1]
    else:
        svgs = _charts(mv, settings, end, top)
    if kept is not None:
        kept[mv.model_name] = (key, svgs)
    against = (
        f"against the healthy reference {healthy:.2f} (green dashes, the profile) and the degraded threshold "
        f"{settings.detection.degraded_floor_under(healthy):.3f} (orange dots)"
        if healthy is not None
        else "with no healthy reference (no profile)"
    )
    step = seconds / config.WINDOW_RESOLUTION
    behind = ""
    if last_poll is not None and last_poll - end > 2 * step:
        behind = f" (up to {esc(durations.format_duration(round(last_poll - end)))} before the last poll: no drafts since)"
    swatches = ", ".join(f'<span style="color:{POSITIONS[i % len(POSITIONS)]}">&#9632; position {i}</span>' for i in range(k))
    if not mv.k:
        scale = "1 up, k unknown"
    elif top == mv.k + 1:
        scale = f"1 to k+1 = {k + 1}"
    else:
        scale = f"1 to {top:.2f}, k having been higher within the window"
    per_position = f"(0 to 100 %): {swatches}" if mv.k else "none (no per-position counters)"
    return (
        f"<figure class=trend>{svgs}<figcaption>Last {esc(label)}{behind}, one point per "
        f"{esc(durations.format_duration(step))} with at least {settings.min_drafts:,} drafts: acceptance length (blue; "
        f"{scale}; lowest {min(figures):.3f}, latest {figures[-1]:.3f}) {against}; acceptance per position "
        f"{per_position}.</figcaption></figure>"
    )


def landing_page(
    settings: Settings, views: Sequence[TargetView], fresh: Set[str], previous: Mapping[str, Mapping[str, tuple[ChartKey, str]]]
) -> tuple[str, dict[str, dict[str, tuple[ChartKey, str]]]]:
    """The page over every target's view (models of the ``fresh`` ones only), and the charts it
    drew, per target and model: the next render takes them from ``previous`` while no step added a point."""
    esc = html.escape
    rows, models = [], []
    # Each target's charts of this render (only those drawn again are kept), and how many.
    drawn, undrawn = 0, 0
    charts: dict[str, dict[str, tuple[ChartKey, str]]] = {}
    for v in views:
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
                    shown = "-" if fraction is None else f"{100 * fraction:.1f} %"  # no figure, never a fake 0
                    meter = "" if fraction is None else f" value={fraction:.4f}"
                    bars += (
                        f"<div class=bar><span>position {i}</span><meter min=0 max=1{meter}>"
                        f"</meter> {shown} <code>{bar(fraction, 20)}</code></div>"
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
    cut = f"<p>Charts drawn for the first {LANDING_CHARTS} models only; {undrawn} more have none.</p>" if undrawn else ""
    # The page refreshes itself (every poll, no more often than every 5 s) and says when it was built:
    # once per state (web.per_state), so a target backing off leaves it, and its time, as they were.
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
<p class=rendered>Built {rendered}, at the last poll or target going stale; this page refreshes itself every {refresh} s.</p>
<p><a href="/metrics">/metrics</a> · <a href="/api/v1/summary?window={esc(settings.health_window)}">/api/v1/summary</a>
· <a href="/healthz">/healthz</a> · <a href="/readyz">/readyz</a></p>
<h2>Targets</h2><table><tr><th>target</th><th>url</th><th>producer</th><th>state</th><th>last success</th><th>last error</th></tr>
{"".join(rows)}</table>
<h2>Models</h2>{"".join(models) or "<p>No fresh data yet.</p>"}{cut}
</body></html>"""
    return page, charts
