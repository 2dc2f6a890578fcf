"""The /metrics collector: fresh families on every scrape from immutable target views.

Registered on a private CollectorRegistry (no module-level metric objects). Names are
the public contract; every family's name, help and labels come from metrics.FAMILIES.
"""

from __future__ import annotations

import asyncio
import collections
import functools
import gzip
import os
import platform
import subprocess
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
    StateSetMetricFamily,
)
from prometheus_client.registry import Collector, CollectorRegistry

from . import __version__, capacity, config
from .metrics import FAMILIES, Family
from .settings import Settings
from .views import POLL_DURATION_BUCKETS, TargetView

if TYPE_CHECKING:
    from .webconfig.reload import LiveWebConfig


# Every family from the one registry (metrics.py): its name, help and labels are written there only.
def _family(short: str, kind: str) -> Family:
    f = FAMILIES[short]
    assert f.type == kind, f"{f.name} is a {f.type} in metrics.py"
    return f


def _counter(short: str) -> CounterMetricFamily:
    f = _family(short, "counter")
    return CounterMetricFamily(f.name, f.help, labels=list(f.labels))


def _gauge(short: str) -> GaugeMetricFamily:
    f = _family(short, "gauge")
    return GaugeMetricFamily(f.name, f.help, labels=list(f.labels))


def _stateset(short: str) -> StateSetMetricFamily:
    f = _family(short, "stateset")
    return StateSetMetricFamily(f.name, f.help, labels=list(f.labels))


def _histogram(short: str) -> HistogramMetricFamily:
    f = _family(short, "histogram")
    return HistogramMetricFamily(f.name, f.help, labels=list(f.labels))


def is_fresh(view: TargetView, now: float, staleness: float) -> bool:
    return view.last_success_mono is not None and now - view.last_success_mono <= staleness


class SpecDecodeCollector(Collector):
    def __init__(self, views: Callable[[], Iterable[TargetView]], settings: Settings, mono: Callable[[], float] = time.monotonic):
        self._views = views
        self._settings = settings
        self._mono = mono

    def describe(self) -> Iterable[Metric]:
        return []  # families depend on the data; do not collect at registration

    def collect(self) -> Iterable[Metric]:
        s = self._settings
        views = list(self._views())
        now = self._mono()
        fresh = [v for v in views if is_fresh(v, now, s.staleness)]
        for family in (*self._normalised_counters(fresh), *self._derived(fresh), *self._self_metrics(views)):
            if family.samples:  # no HELP/TYPE for families with nothing to say
                yield family

    # --- vLLM's counters, renamed and stable across producers ---
    def _normalised_counters(self, views: list[TargetView]) -> Iterable[Metric]:
        drafts = _counter("drafts")
        tokens = _counter("draft_tokens")
        accepted = _counter("accepted_tokens")
        per_pos = _counter("position_accepted_tokens")
        generation = _counter("generation_tokens")
        for v in views:
            for (model, engine), c in v.raw.items():
                labels = [v.name, model, engine]
                drafts.add_metric(labels, c.drafts)
                tokens.add_metric(labels, c.draft_tokens)
                accepted.add_metric(labels, c.accepted)
                for i, value in enumerate(c.per_position):
                    per_pos.add_metric([*labels, str(i)], value)
                if c.generation_tokens is not None:
                    generation.add_metric(labels, c.generation_tokens)
            for (model, engine), value in v.generation_only.items():
                generation.add_metric([v.name, model, engine], value)
        yield from (drafts, tokens, accepted, per_pos, generation)

    # --- windowed figures, summed over engines, and health ---
    def _derived(self, views: list[TargetView]) -> Iterable[Metric]:
        s = self._settings
        al = _gauge("mean_acceptance_length")
        # 0-1 figures end in _ratio (a PromQL reader takes "rate" for per-second).
        rate = _gauge("acceptance_ratio")
        pos = _gauge("position_acceptance_ratio")
        cond = _gauge("position_conditional_acceptance_ratio")
        edl = _gauge("effective_draft_length")
        dist = _gauge("acceptance_count_ratio")
        drafts = _gauge("window_drafts")
        span = _gauge("window_span_seconds")
        e_al = _gauge("engine_mean_acceptance_length")
        e_rate = _gauge("engine_acceptance_ratio")
        k = _gauge("num_speculative_tokens")
        factor, wasted, healthy_tokens = (
            _gauge("decode_step_factor_ratio"),
            _gauge("decode_steps_wasted_ratio"),
            _gauge("healthy_output_tokens_per_second"),
        )
        e_factor, e_wasted = _gauge("engine_decode_step_factor_ratio"), _gauge("engine_decode_steps_wasted_ratio")
        break_even = _gauge("break_even_mean_acceptance_length")
        cost = s.detection.draft_step_cost
        baseline = _gauge("baseline_mean_acceptance_length")
        info = _gauge("model_info")
        # OpenMetrics StateSets: one series per state, the state in a label named after the family.
        health = _stateset("health")
        e_health = _stateset("engine_health")
        diagnosis = _gauge("diagnosis_info")
        # vLLM's per-request histogram (PR #44487), only when the target has it.
        req_below = _gauge("request_acceptance_below_ratio")
        req_above = _gauge("request_acceptance_above_ratio")
        requests = _gauge("window_requests")
        for v in views:
            for mv in v.models:
                k.add_metric([v.name, mv.model_name], mv.k)
                if mv.k:
                    break_even.add_metric([v.name, mv.model_name], capacity.break_even(mv.k, cost))
                healthy = mv.profile.mean_acceptance_length if mv.profile is not None else None
                if mv.profile is not None:
                    baseline.add_metric([v.name, mv.model_name, mv.profile.name], mv.profile.mean_acceptance_length)
                profile = mv.profile.name if mv.profile is not None else ""
                info.add_metric([v.name, mv.model_name, mv.root or "", profile, mv.profile_matched_by], 1.0)
                health.add_metric([v.name, mv.model_name], {st: st == mv.health for st in config.HEALTH_STATES})
                for hint in mv.health_causes:
                    diagnosis.add_metric([v.name, mv.model_name, hint.cause], 1.0)
                for engine, state in mv.engine_health.items():
                    e_health.add_metric([v.name, mv.model_name, engine], {st: st == state for st in config.HEALTH_STATES})
                for window, mw in mv.windows.items():
                    labels = [v.name, mv.model_name, window]
                    st = mw.stats
                    drafts.add_metric(labels, st.num_drafts)
                    span.add_metric(labels, mw.span_seconds)
                    if (ra := st.request_acceptance) is not None:
                        requests.add_metric(labels, ra.requests)
                        if ra.below_edge is not None:
                            _add(req_below, [*labels, f"{ra.below_edge:g}"], ra.below_ratio)
                        if ra.above_edge is not None:
                            _add(req_above, [*labels, f"{ra.above_edge:g}"], ra.above_ratio)
                    for engine, ef in mw.engines.items():
                        if ef.drafts >= s.min_drafts:
                            el = [v.name, mv.model_name, engine, window]
                            _add(e_al, el, ef.mean_acceptance_length)
                            _add(e_rate, el, ef.acceptance_rate)
                            if (ec := capacity.capacity(ef.mean_acceptance_length, healthy, mv.k, cost)) is not None:
                                e_factor.add_metric(el, ec.step_factor)
                                e_wasted.add_metric(el, ec.wasted_share)
                    if st.num_drafts < s.min_drafts:
                        continue  # an idle window shows no noise
                    per_second = st.num_drafts / mw.span_seconds if mw.span_seconds > 0 else None
                    if (mc := capacity.capacity(st.mean_acceptance_length, healthy, mv.k, cost, per_second)) is not None:
                        factor.add_metric(labels, mc.step_factor)
                        wasted.add_metric(labels, mc.wasted_share)
                        _add(healthy_tokens, labels, mc.healthy_tokens_per_second)
                    _add(al, labels, st.mean_acceptance_length)
                    _add(rate, labels, st.acceptance_rate)
                    _add(edl, labels, st.effective_draft_length)
                    for i, (p, c) in enumerate(zip(st.per_position_acceptance, st.conditional_acceptance, strict=True)):
                        _add(pos, [*labels, str(i)], p)
                        _add(cond, [*labels, str(i)], c)
                    for j, share in enumerate(st.accepted_count_ratio):
                        _add(dist, [*labels, str(j)], share)
        yield from (
            al,
            rate,
            pos,
            cond,
            edl,
            dist,
            drafts,
            span,
            e_al,
            e_rate,
            k,
            break_even,
            factor,
            wasted,
            healthy_tokens,
            e_factor,
            e_wasted,
            baseline,
            info,
            health,
            e_health,
            diagnosis,
            req_below,
            req_above,
            requests,
        )

    # --- the exporter's own health ---
    def _self_metrics(self, views: list[TargetView]) -> Iterable[Metric]:
        up = _gauge("up")
        polls = _counter("exporter_polls")
        duration = _histogram("exporter_poll_duration_seconds")
        last = _gauge("exporter_last_success_timestamp_seconds")
        resets = _counter("exporter_engine_restarts")
        violations = _counter("exporter_invariant_violations")
        parse_errors = _gauge("exporter_last_poll_parse_errors")
        refused = _gauge("exporter_last_poll_series_refused")
        forgotten = _counter("exporter_series_forgotten")
        inconsistent = _counter("exporter_inconsistent_polls")
        restarts = _counter("exporter_poll_task_restarts")
        served_failures = _counter("exporter_served_models_failures")
        suppressed = _counter("exporter_warnings_suppressed")
        target_info = _gauge("target_info")
        for v in views:
            up.add_metric([v.name], 1.0 if v.up else 0.0)
            for result, n in v.polls.items():
                polls.add_metric([v.name, result], n)
            cumulative = [(f"{b:g}", n) for b, n in zip(POLL_DURATION_BUCKETS, v.duration_buckets, strict=True)]
            duration.add_metric([v.name], [*cumulative, ("+Inf", v.duration_count)], v.duration_sum)

            if v.last_success_wall is not None:
                last.add_metric([v.name], v.last_success_wall)
            resets.add_metric([v.name], v.counter_resets)
            violations.add_metric([v.name], v.invariant_violations)
            parse_errors.add_metric([v.name], v.last_poll_parse_errors)
            refused.add_metric([v.name], v.last_poll_series_refused)
            forgotten.add_metric([v.name], v.series_forgotten)
            inconsistent.add_metric([v.name], v.inconsistent_polls)
            restarts.add_metric([v.name], v.poll_task_restarts)
            served_failures.add_metric([v.name], v.served_models_failures)
            suppressed.add_metric([v.name], v.warnings_suppressed)
            if v.producer:
                target_info.add_metric([v.name, v.producer, ",".join(v.approximate)], 1.0)
        info = _gauge("exporter_build_info")
        info.add_metric([__version__, revision(), platform.python_version()], 1.0)
        yield target_info
        yield from (
            up,
            polls,
            duration,
            last,
            resets,
            violations,
            parse_errors,
            refused,
            forgotten,
            inconsistent,
            restarts,
            served_failures,
            suppressed,
            info,
        )


class ConnectionCollector(Collector):
    """What the listening sites did to client connections (server.GuardedSite's counts)."""

    def __init__(self, counts: Callable[[], tuple[int, int, int]]):
        self._counts = counts  # (evicted, timed out) summed over the sites, requests refused

    def describe(self) -> Iterable[Metric]:
        return []

    def collect(self) -> Iterable[Metric]:
        evicted, timed_out, refused = self._counts()
        e, t = _counter("exporter_connections_evicted"), _counter("exporter_connections_timed_out")
        r = _counter("exporter_requests_refused")
        e.add_metric([], evicted)
        t.add_metric([], timed_out)
        r.add_metric([], refused)
        yield from (e, t, r)


class WebConfigCollector(Collector):
    """The web config's reload outcome (with --web.config.file only)."""

    def __init__(self, live: LiveWebConfig):
        self._live = live

    def describe(self) -> Iterable[Metric]:
        return []

    def collect(self) -> Iterable[Metric]:
        ok, failures = _gauge("exporter_web_config_last_reload_successful"), _counter("exporter_web_config_reload_failures")
        ok.add_metric([], 1.0 if self._live.last_reload_ok else 0.0)
        failures.add_metric([], self._live.reload_failures)
        yield from (ok, failures)


class Exposition:
    """/metrics bodies (identity and gzip), rendered once per state and off the event loop.

    At the bounds (4,096 engines: tens of MB) one render takes seconds of Python; on the
    loop it stopped /healthz for as long. In a thread it only shares the GIL (the loop gets
    it back every few ms), and the views it reads are immutable. One render at a time;
    until the state changes (a poll publishes a view, a target turns stale) every scrape
    gets the same bytes, and a scrape that waited for a render begun after it arrived
    takes that one: a flood of scrapes, each changing the connection counts, cost one
    render per scrape and queued every scrape behind all of them. A render drops the
    other formats' bodies of an older state unless a scrape still waiting may take them
    (begun after it arrived): scrapes alternating two formats while each render saw the
    state change rendered once each (helper-37: 41 renders for 41 scrapes, now 3)."""

    def __init__(self, registry: CollectorRegistry):
        self._registry = registry
        self._lock = asyncio.Lock()
        self._started = 0  # renders begun
        self._waiting: collections.Counter[int] = collections.Counter()  # renders begun when each waiting scrape came
        # body_key(encoder) -> (the state rendered, which render, identity body, gzip body)
        self._cache: dict[tuple[object, ...], tuple[tuple[object, ...], int, bytes, bytes]] = {}

    async def bodies(
        self, encoder: Callable[[CollectorRegistry], bytes], state: Callable[[], tuple[object, ...]]
    ) -> tuple[bytes, bytes]:
        """(identity, gzip) bodies for the current ``state()``: objects compared by identity (the
        views). Read once the lock is held: read on arrival, a scrape that waited while a poll
        published labelled its render with the older state and dropped the other encoders'
        bodies of the newer one (each rendered again on its next scrape)."""
        key = body_key(encoder)
        arrived = self._started
        self._waiting[arrived] += 1
        try:
            async with self._lock:
                now = state()
                cached = self._cache.get(key)
                if cached is None or not (cached[1] > arrived or _same(cached[0], now)):
                    self._started += 1
                    render = self._started
                    body, zipped = await asyncio.to_thread(self._render, encoder)
                    oldest = min(self._waiting)
                    self._cache = {t: c for t, c in self._cache.items() if _same(c[0], now) or c[1] > oldest}
                    self._cache[key] = cached = (now, render, body, zipped)
                return cached[2], cached[3]
        finally:
            self._waiting[arrived] -= 1
            if not self._waiting[arrived]:
                del self._waiting[arrived]

    def _render(self, encoder: Callable[[CollectorRegistry], bytes]) -> tuple[bytes, bytes]:
        body = encoder(self._registry)
        # Level 1: a quarter of level 6's time for a body ~20 % larger, which a scrape over the
        # pod's network does not notice (docs/performance.md).
        return body, gzip.compress(body, compresslevel=1)


def body_key(encoder: Callable[[CollectorRegistry], bytes]) -> tuple[object, ...]:
    """What decides a /metrics body: the encoder and its escaping, and OpenMetrics' version
    only as below or from 2.0.0 (native histograms, never exported here). Keyed by the echoed
    Content-Type, a client cycling version=1.0.<n> forced one render per scrape and held one
    body per version; the escapings prometheus_client accepts are a handful."""
    if not isinstance(encoder, functools.partial):
        return (encoder,)
    kw = encoder.keywords
    major = str(kw.get("version", "1")).split(".", 1)[0]
    return (encoder.func, kw.get("escaping"), major.isdigit() and int(major) >= 2)


def _same(a: tuple[object, ...], b: tuple[object, ...]) -> bool:
    """Views by identity (immutable: a new poll is a new object); counts by value (two equal
    large ints are different objects: by identity every scrape would render again)."""
    return len(a) == len(b) and all(x is y or (type(x) is int and type(y) is int and x == y) for x, y in zip(a, b, strict=True))


@functools.cache
def revision() -> str:
    """The source revision: $VLLM_SPECDEC_EXPORTER_REVISION (set by the image build), else
    the git commit of a source checkout, else "unknown"."""
    env = os.environ.get(config.REVISION_ENV, "").strip()
    if env:
        return env[:40]
    try:
        out = subprocess.run(
            ["git", "rev-parse", "--short=12", "HEAD"], cwd=Path(__file__).parent, capture_output=True, text=True, timeout=2
        )
        return out.stdout.strip() if out.returncode == 0 and out.stdout.strip() else "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def _add(family: GaugeMetricFamily, labels: list[str], value: float | None) -> None:
    if value is not None:
        family.add_metric(labels, value)
