"""The sidecar's polling core: one poller per vLLM target, publishing immutable views.

Each poll fetches /metrics, extracts the snapshot, folds it into the target's
history and publishes a fresh frozen ``TargetView`` (an attribute swap, so the
/metrics collector always reads a consistent state without locks). Clocks and the
HTTP session are injected: tests drive ``poll_once`` with a fake clock.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import multiprocessing
import random
import time
import traceback
import weakref
from collections.abc import Callable, Collection, Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, field, replace
from typing import TypeVar

import aiohttp
import structlog

from . import config
from .adapters import NoSpecDecodeFamilies, UnsupportedProducer, extract
from .derive import Stats, derive, invariant_violations, ratio, sum_counters
from .health import Earlier, Hint, Verdict, judge, match_profile
from .history import Observation, TargetHistory, admit
from .metrics import sample
from .model import BaselineProfile, Counters, SeriesKey, Snapshot, series_name
from .parser import NotPrometheusText, PayloadTooLarge
from .settings import Settings, Target
from .sources import SourceError, credentials, fetch_metrics, redact_url, scrub
from .summary import engine_order

log = structlog.get_logger("vllm_specdec_exporter")

POLL_DURATION_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
POLL_RESULTS = ("success", "http_error", "timeout", "connect_error", "invalid_url", "too_large",
                "not_prometheus", "no_spec_decode", "unsupported_producer", "error")


@dataclass(frozen=True, slots=True)
class EngineFigures:
    drafts: float
    mean_acceptance_length: float | None
    acceptance_rate: float | None


@dataclass(frozen=True, slots=True)
class ModelWindow:
    span_seconds: float
    stats: Stats  # summed over the model's engines
    engines: Mapping[str, EngineFigures]


@dataclass(frozen=True, slots=True)
class ModelView:
    model_name: str
    k: int
    windows: Mapping[str, ModelWindow]
    profile: BaselineProfile | None
    health: str  # over settings.health_window
    health_reason: str = ""  # why, in one line (names the engine when one is the cause)
    engine_health: Mapping[str, str] = field(default_factory=dict)  # engine -> state
    health_causes: tuple[Hint, ...] = ()  # the likely causes of a fall, with their evidence


@dataclass(frozen=True, slots=True)
class TargetView:
    name: str
    url: str  # redacted
    up: bool = False
    last_success_wall: float | None = None
    last_success_mono: float | None = None
    last_error: str | None = None
    last_result: str | None = None
    polls: Mapping[str, int] = field(default_factory=dict)
    duration_buckets: tuple[int, ...] = (0,) * len(POLL_DURATION_BUCKETS)
    duration_sum: float = 0.0
    duration_count: int = 0
    counter_resets: int = 0
    invariant_violations: int = 0
    last_poll_parse_errors: int = 0  # of the last successful poll (a gauge: not summed over polls)
    last_poll_series_refused: int = 0
    series_forgotten: int = 0  # held engines dropped to make room (max_series_per_target)
    inconsistent_polls: int = 0  # engine polls that were neither consistent nor a restart
    warnings_suppressed: int = 0  # new upstream warnings not logged: WARNINGS_REMEMBERED were
    poll_task_restarts: int = 0
    raw: Mapping[SeriesKey, Counters] = field(default_factory=dict)
    # Spec decode off: only vLLM's generation-token counters, so generating without
    # drafting stays visible (and alertable) through the sidecar alone.
    generation_only: Mapping[SeriesKey, float] = field(default_factory=dict)
    models: tuple[ModelView, ...] = ()
    producer: str | None = None  # adapters.PRODUCERS name of the last successful poll
    approximate: tuple[str, ...] = ()  # figures that are estimates for that producer


def model_views(history: TargetHistory, raw: Mapping[SeriesKey, Counters], settings: Settings,
                method: str | None, changes: Mapping[str, Sequence[str]] | None = None,
                position0_healthy: Collection[str] = ()) -> tuple[ModelView, ...]:
    """Derived figures per model and window, summed over engines (sums before ratios)."""
    k_by_model: dict[str, int] = {}
    for (model, _), c in raw.items():
        k_by_model[model] = max(k_by_model.get(model, 0), c.k)
    per_model: dict[str, dict[str, ModelWindow]] = {m: {} for m in k_by_model}
    profiles = {m: match_profile(settings.baselines, settings.profile_aliases.get(m, m), k, method)
                for m, k in k_by_model.items()}
    judged: dict[str, Verdict] = {}
    for label, _ in settings.windows:
        window = history.window(label)
        if window is None:
            continue
        grouped: dict[str, dict[str, Counters]] = {}
        for (model, engine), c in window.engines.items():
            grouped.setdefault(model, {})[engine] = c
        for model, engines in grouped.items():
            if model not in per_model:
                continue  # a model no longer served: its figures go with its counters
            span = window.span_seconds or None
            engines_fig = {
                e: EngineFigures(c.drafts, None if c.drafts <= 0 else 1.0 + c.accepted / c.drafts,
                                 ratio(c.accepted, c.draft_tokens))
                for e, c in sorted(engines.items(), key=lambda kv: engine_order(kv[0]))
            }
            total = sum_counters(engines.values())
            # The window's invariant violations ride along in Stats.warnings (health reads them).
            checks = invariant_violations(total, series_name((model, "sum"))[:300])
            per_model[model][label] = ModelWindow(window.span_seconds, derive(total, span, checks), engines_fig)
            if label == settings.health_window:
                # The verdict reads the raw counters of the window, not derived figures.
                judged[model] = judge(engines, window.span_seconds, profiles[model], settings.detection,
                                      settings.min_drafts, (changes or {}).get(model, ()),
                                      _earlier(history, settings, model, model in position0_healthy))
    views = []
    for model in sorted(per_model):
        verdict = judged.get(model) or Verdict("idle", "no drafts in the window", {})
        views.append(ModelView(model, k_by_model[model], per_model[model], profiles[model], verdict.state,
                               verdict.reason, verdict.engines, verdict.causes))
    return tuple(views)


def _earlier(history: TargetHistory, settings: Settings, model: str, position0_healthy: bool) -> Earlier:
    """What came before the health window: the model over the longest window (when longer) and
    whether its position 0 was healthy within the last day."""
    label = settings.windows[-1][0]
    window = history.window(label) if label != settings.health_window else None
    total = None
    if window is not None:
        total = sum_counters([c for (m, _), c in window.engines.items() if m == model])
    return Earlier(label, total if total is not None and total.drafts >= max(settings.min_drafts, 1) else None,
                   position0_healthy)


class TargetPoller:
    def __init__(
        self,
        target: Target,
        settings: Settings,
        session: aiohttp.ClientSession,
        mono: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
    ):
        self.target = target
        self.settings = settings
        self.session = session
        self.mono = mono
        self.wall = wall
        self.history = TargetHistory(settings.windows, settings.windows[-1][1] + settings.staleness)
        # Hard bound on the model/engine series held, per target and over all targets.
        self.max_series = min(settings.max_series_per_target,
                              max(1, config.MAX_SERIES_TOTAL // max(1, len(settings.targets))))
        self.failures = 0
        self._polls = {r: 0 for r in POLL_RESULTS}
        self._buckets = [0] * len(POLL_DURATION_BUCKETS)
        self._seen_warnings: set[bytes] = set()  # digests of the warnings logged (_warn_once)
        self._warnings_suppressed = 0
        self._secrets = credentials(target.url)  # + the bearer token once read
        self._last_exception: str | None = None
        # What changed per model (restarts, k), with when: a fall that coincides is a hint.
        self._changes: dict[str, list[tuple[float, str]]] = {}
        self._k: dict[str, int] = {}
        self._position0_healthy_at: dict[str, float] = {}  # model -> when its position 0 was last healthy
        self._appeared_logged = 0
        self.view = TargetView(target.name, redact_url(target.url), polls=dict(self._polls))

    def _headers(self) -> dict[str, str]:
        if not self.target.bearer_token_file:
            return {}
        # Read on every poll so a rotated token is picked up; never logged.
        try:
            with open(self.target.bearer_token_file, encoding="utf-8") as f:
                token = f.read().strip()
        except OSError as e:
            raise SourceError(f"cannot read bearer_token_file: {e.strerror}", "error") from None
        self._secrets = credentials(self.target.url, token)
        return {"Authorization": f"Bearer {token}"}

    async def _read(self, body: bytes) -> _Read | _Failure:
        args = (body, self.settings.max_payload_bytes, self.target.producer, self.history.seen(), self.max_series)
        # A 32 MiB payload takes seconds of Python: in a worker process, so /healthz and
        # /metrics keep answering (a thread would share the GIL: 0.5 s stalls, measured).
        read = await _in_worker(len(body), read_payload, *args) if len(body) > config.PARSE_IN_WORKER_BYTES \
            else read_payload(*args)
        if isinstance(read, _WorkerError):
            raise read
        return read

    async def poll_once(self) -> str:
        """One poll; returns the result word (also counted in polls_total). Never raises
        (but for cancellation): whatever goes wrong is counted as a result."""
        started = self.mono()
        read: _Read | None = None  # set only on success
        generation: Mapping[SeriesKey, float] = {}  # spec decode off: vLLM's generation counters only
        error: str | None = None
        try:
            body = await fetch_metrics(
                self.session, self.target.url, max_bytes=self.settings.max_payload_bytes,
                timeout=self.settings.poll_timeout, headers=self._headers(),
            )
            got = await self._read(body)
            if isinstance(got, _Failure):
                result, error, generation = got.result, got.error, got.generation
            else:
                result, read = "success", got
        except PayloadTooLarge as e:
            result, error = "too_large", str(e)
        except NotPrometheusText as e:
            result, error = "not_prometheus", str(e)
        except UnsupportedProducer as e:  # recognised (e.g. vLLM V0) and refused: no figure would be right
            result, error = "unsupported_producer", str(e)
        except NoSpecDecodeFamilies as e:
            result, error, generation = "no_spec_decode", str(e), e.generation
        except SourceError as e:
            result, error = e.kind, str(e)
        except _WorkerError as e:  # a bug in the worker process: its traceback comes as text
            result, error = "error", self._log_exception(e, e.details)
        except Exception as e:  # a bug must not kill the poller: count it, log it, go on
            result, error = "error", self._log_exception(e)
        duration = self.mono() - started
        error = scrub(error, self._secrets)  # a target may echo its credentials back
        try:
            if read is not None:
                await self._record_success(read, duration)
            elif result == "no_spec_decode":
                self._record_spec_decode_off(error, generation, duration)
            else:
                self._record_failure(result, error, duration)
        except Exception as e:  # e.g. in the history or the views: this poll failed, not the poller
            result = "error"
            self._record_failure(result, self._log_exception(e), duration)
        return result

    def _log_exception(self, e: Exception, details: str | None = None) -> str:
        message = f"{type(e).__name__}: {e}"[:500]
        if message != self._last_exception:  # once with its traceback, not on every poll
            self._last_exception = message
            if details:
                log.error("poll_failed_unexpectedly", target=self.target.name, error=message, traceback=details)
            else:
                log.exception("poll_failed_unexpectedly", target=self.target.name, error=message)
        return message

    def _remember_position0(self, now: float, models: Sequence[ModelView]) -> None:
        """Which models had a healthy position 0 within a day (the alert's lookback): a low one
        then is a fall, not a steady weak drafter (health.judge)."""
        for mv in models:
            w = mv.windows.get(self.settings.health_window)
            pos0 = w.stats.per_position_acceptance[0] if w is not None and w.stats.k else None
            if pos0 is not None and pos0 >= self.settings.detection.position0_floor \
                    and w is not None and w.stats.num_drafts >= self.settings.min_drafts:
                self._position0_healthy_at[mv.model_name] = now
        horizon = now - config.POSITION0_LOOKBACK_SECONDS
        self._position0_healthy_at = {m: t for m, t in self._position0_healthy_at.items() if t >= horizon}

    def _recent_changes(self, now: float, observation: Observation, kept: Mapping[SeriesKey, Counters]) -> dict[str, list[str]]:
        """Restarts and k changes per model within the health window (for the diagnosis). A change
        while the model was already degraded or collapsed (the last verdict) is not kept: the fall
        started before it, so it cannot be its cause (a restart that fixes a fall, issue 24)."""
        fallen = {mv.model_name for mv in self.view.models if mv.health in ("degraded", "collapsed")}
        for model, engine in observation.restarted:
            if model not in fallen:
                self._changes.setdefault(model, []).append((now, f"a restart of engine {engine}"))
        ks: dict[str, int] = {}
        for (model, _), c in kept.items():
            ks[model] = max(ks.get(model, 0), c.k)
        for model, k in ks.items():
            if self._k.get(model, k) != k and model not in fallen:
                self._changes.setdefault(model, []).append((now, f"k {self._k[model]} -> {k}"))
            self._k[model] = k
        horizon = now - dict(self.settings.windows)[self.settings.health_window]
        self._changes = {m: kept_ for m, v in self._changes.items() if (kept_ := [x for x in v if x[0] >= horizon])}
        return {m: list(dict.fromkeys(text for _, text in v)) for m, v in self._changes.items()}

    def _counted(self, result: str, duration: float) -> TargetView:
        """The view with this poll counted (its result and duration)."""
        self._polls[result] = self._polls.get(result, 0) + 1
        for i, bound in enumerate(POLL_DURATION_BUCKETS):
            if duration <= bound:
                self._buckets[i] += 1
        view = self.view
        return replace(view, last_result=result, polls=dict(self._polls), duration_buckets=tuple(self._buckets),
                       duration_sum=view.duration_sum + duration, duration_count=view.duration_count + 1)

    def _record_failure(self, result: str, error: str | None, duration: float) -> None:
        view = self.view
        self.failures += 1
        # Logged when the failure starts or changes kind, not on every poll (the
        # message itself may vary: byte counts, addresses).
        if view.up or view.last_result != result:
            log.warning("target_poll_failed", target=self.target.name, result=result, error=error)
        self.view = replace(self._counted(result, duration), up=False, last_error=error)

    def _record_spec_decode_off(self, error: str | None, generation: Mapping[SeriesKey, float], duration: float) -> None:
        # vLLM answers, with spec decode off: reachable and current, but with
        # nothing to derive. Only its generation tokens are exported.
        result = "no_spec_decode"
        if self.view.last_result != result:
            log.warning("spec_decode_off", target=self.target.name, error=error)
        self.failures = 0
        self.view = replace(self._counted(result, duration), up=True, last_error=error, last_success_wall=self.wall(),
                            last_success_mono=self.mono(), raw={}, models=(), generation_only=dict(generation))

    async def _record_success(self, read: _Read, duration: float) -> None:
        view = self.view
        # The history and views first: if they raise, nothing is counted twice.
        now = self.mono()
        observation = self.history.observe(now, read.kept, read.forget)
        # The views read the history (only this poller writes it, and it waits here): in a
        # thread, as at 4,096 engines they take ~0.4 s that /healthz would otherwise wait.
        models = await asyncio.to_thread(model_views, self.history, _consistent(self.history, read.kept), self.settings,
                                         self.target.method, self._recent_changes(now, observation, read.kept),
                                         set(self._position0_healthy_at))
        self._remember_position0(now, models)
        counted = self._counted("success", duration)
        if not view.up or view.last_error:
            log.info("target_up", target=self.target.name, url=view.url)
        self.failures = 0
        self._last_exception = None
        snapshot = read.snapshot
        if read.refused:
            self._warn_once(f"model/engine series over the {self.max_series} held per target (max_series_per_target) "
                            f"or over {config.MAX_MODELS_PER_TARGET} models refused")
        if read.forget:
            self._warn_once(f"model/engine series unseen the longest forgotten to stay within the "
                            f"{self.max_series} held per target (max_series_per_target)")
        violations = snapshot.impossible_values
        for key, inc in observation.increments.items():
            for message in invariant_violations(inc, series_name(key)):
                violations += 1
                self._warn_once(f"invariant violated in the last poll: {message}")
        for key, reason in observation.inconsistent:
            self._warn_once(f"{series_name(key)[:300]}: inconsistent poll, nothing added to the windows: {reason}")
        for key, reason in observation.skipped:
            self._warn_once(f"{series_name(key)[:300]}: {reason}; that series skipped this poll, the counters counted")
        for key in observation.restarted:
            log.info("counter_reset", target=self.target.name, series=series_name(key)[:300])
        for key in observation.appeared:
            self._appeared_logged += 1
            if self._appeared_logged <= 100:  # churn of labels is not a flood of log lines
                log.info("engine_appeared", target=self.target.name, series=series_name(key)[:300],
                         note="the last one logged" if self._appeared_logged == 100 else None)
        for message in snapshot.warnings:
            self._warn_once(message)
        for k in sorted({c.k for c in read.kept.values()} - set(range(config.MAX_SPECULATIVE_TOKENS + 1))):
            self._warn_once(f"k={k} is above the {config.MAX_SPECULATIVE_TOKENS} positions the generated rules "
                            f"cover (config.MAX_SPECULATIVE_TOKENS): the wasted-tokens alert cannot fire for it")
        self.view = replace(
            counted, up=True, last_error=None, last_success_wall=self.wall(), last_success_mono=now,
            counter_resets=view.counter_resets + len(observation.restarted),
            invariant_violations=view.invariant_violations + violations,
            inconsistent_polls=view.inconsistent_polls + len(observation.inconsistent) + len(observation.skipped),
            warnings_suppressed=self._warnings_suppressed,
            last_poll_parse_errors=snapshot.malformed_lines + snapshot.duplicate_series,
            last_poll_series_refused=read.refused,
            series_forgotten=view.series_forgotten + len(read.forget),
            raw=_consistent(self.history, read.kept), generation_only={}, models=models,
            producer=snapshot.producer, approximate=snapshot.approximate,
        )

    def _warn_once(self, message: str) -> None:
        # Upstream problems are logged when first seen, not on every poll. What is
        # remembered is a digest of the cut message: labels that change on every poll
        # (warnings quote them) cannot grow memory (config.WARNINGS_REMEMBERED).
        cut = config.MAX_WARNING_CHARS
        message = scrub(message[:2 * cut], self._secrets)[:cut]  # scrubbed before the cut: no half secret
        digest = hashlib.blake2b(message.encode(), digest_size=16).digest()
        if digest in self._seen_warnings:
            return
        if len(self._seen_warnings) >= config.WARNINGS_REMEMBERED:
            if not self._warnings_suppressed:
                log.warning("target_warnings_suppressed", target=self.target.name,
                            note=f"{config.WARNINGS_REMEMBERED} distinct warnings logged; new ones are only counted "
                                 f"({sample('exporter_warnings_suppressed')})")
            self._warnings_suppressed += 1
            return
        self._seen_warnings.add(digest)
        log.warning("target_warning", target=self.target.name, warning=message)

    def next_delay(self) -> float:
        """The poll interval, or exponential backoff with jitter while the target fails."""
        interval = self.settings.poll_interval
        if not self.failures:
            return interval
        ceiling = min(self.settings.max_backoff, interval * 2 ** min(self.failures, 20))
        return random.uniform(max(interval, ceiling / 2), max(interval, ceiling))

    async def run(self) -> None:
        """Poll forever. poll_once never raises; should anything else here fail, the
        loop is restarted after one interval, and that is counted and logged."""
        while True:
            try:
                while True:
                    started = self.mono()
                    await self.poll_once()
                    await asyncio.sleep(max(0.0, started + self.next_delay() - self.mono()))
            except Exception as e:
                self.view = replace(self.view, up=False, poll_task_restarts=self.view.poll_task_restarts + 1)
                log.exception("poll_task_restarted", target=self.target.name, error=f"{type(e).__name__}: {e}"[:500])
                await asyncio.sleep(self.settings.poll_interval)


@dataclass(frozen=True, slots=True)
class _Read:
    snapshot: Snapshot
    kept: dict[SeriesKey, Counters]  # within the bounds
    refused: int
    forget: list[SeriesKey]


def _consistent(history: TargetHistory, kept: Mapping[SeriesKey, Counters]) -> dict[SeriesKey, Counters]:
    """What is re-exported: each engine's last consistent values, so a glitch (a cut
    payload, a dip) never reaches Prometheus as a counter reset."""
    return {key: history.base(key) or c for key, c in kept.items()}


class _WorkerError(Exception):
    """An unexpected exception in the parsing process, with its traceback as text."""

    def __init__(self, message: str, details: str):
        super().__init__(message)
        self.details = details

    def __reduce__(self) -> tuple[type[_WorkerError], tuple[str, str]]:
        return _WorkerError, (str(self), self.details)


def read_payload(body: bytes, max_bytes: int, producer: str | None, held: Mapping[SeriesKey, float],
                 max_series: int) -> _Read | _Failure | _WorkerError:
    """Parse one payload and bound it to what may be held. Pure CPU; runs in the parsing
    process for big payloads, so what it hands back is small (at most ``max_series``
    engines, a few warnings) and the expected failures come back as values: exceptions
    with their own constructors do not survive pickling."""
    try:
        snapshot = extract(body, max_bytes, producer)
    except (PayloadTooLarge, NotPrometheusText, UnsupportedProducer, NoSpecDecodeFamilies) as e:
        return _Failure(_RESULTS[next(c for c in _RESULTS if isinstance(e, c))], str(e),
                        dict(getattr(e, "generation", None) or {}))
    except Exception as e:
        return _WorkerError(f"{type(e).__name__}: {e}"[:500], traceback.format_exc()[-4000:])
    kept, refused, forget = admit(snapshot.engines, held, max_series, config.MAX_MODELS_PER_TARGET)
    # What crosses back is small: warnings quote labels, so each is cut (twice the logged length: scrubbed then cut).
    cut = 2 * config.MAX_WARNING_CHARS
    small = replace(snapshot, engines={}, warnings=tuple(w[:cut] for w in snapshot.warnings[:200]))
    return _Read(small, kept, refused, forget)


@dataclass(frozen=True, slots=True)
class _Failure:
    """An expected way for a payload to be unusable, as a value (see read_payload)."""

    result: str
    error: str
    generation: dict[SeriesKey, float]


# In this order: the first class a failure is an instance of names it.
_RESULTS = {PayloadTooLarge: "too_large", NotPrometheusText: "not_prometheus",
            UnsupportedProducer: "unsupported_producer", NoSpecDecodeFamilies: "no_spec_decode"}


# The parsing processes, one per lane, each started on its lane's first payload: payloads
# over PARSE_BIG_BYTES (True) and the others, so a real server's payload (~0.4 MB for
# TP=8/DP=8) never waits behind a hostile 32 MiB one (seconds of parsing).
_POOLS: dict[bool, ProcessPoolExecutor] = {}
# One payload at a time per process, the others wait here (at most one per target: a
# target's polls are sequential). Per event loop: an asyncio.Lock belongs to one.
_LANES: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[bool, asyncio.Lock]] = weakref.WeakKeyDictionary()


def _pool(big: bool = False) -> ProcessPoolExecutor:
    if big not in _POOLS:
        # spawn, not fork: the sidecar has threads (aiohttp's resolver), and a fork of a
        # threaded process can deadlock. A ProcessPoolExecutor (not multiprocessing.Pool)
        # notices a worker that died and fails its future instead of waiting forever.
        _POOLS[big] = ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn"))
    return _POOLS[big]


def close_parse_pool(big: bool | None = None) -> None:
    """Kill the parsing processes, or one lane's (at shutdown: a parse in progress must
    not hold up SIGTERM)."""
    for lane in list(_POOLS) if big is None else [big]:
        pool = _POOLS.pop(lane, None)
        if pool is None:
            continue
        processes = list((getattr(pool, "_processes", None) or {}).values())  # no public handle on them
        pool.shutdown(wait=False, cancel_futures=True)
        for proc in processes:
            with contextlib.suppress(Exception):
                proc.kill()


_T = TypeVar("_T")


async def _in_worker(size: int, fn: Callable[..., _T], *args: object) -> _T:
    """``fn(*args)`` in the parsing process of the lane for a ``size``-byte payload. The
    timeout counts the parse alone, not the wait for the process; as a process parses one
    payload at a time, one that dies or is killed fails that payload's poll only."""
    big = size > config.PARSE_BIG_BYTES
    lock = _LANES.setdefault(asyncio.get_running_loop(), {}).setdefault(big, asyncio.Lock())
    async with lock:
        try:
            future = asyncio.get_running_loop().run_in_executor(_pool(big), fn, *args)
            # A starved or stuck worker must not hold the poll forever.
            return await asyncio.wait_for(future, config.PARSE_TIMEOUT_SECONDS)
        except (TimeoutError, BrokenProcessPool) as e:
            close_parse_pool(big)  # the lane's next payload starts a fresh process
            what = f"took over {config.PARSE_TIMEOUT_SECONDS} s" if isinstance(e, TimeoutError) else "died"
            raise _WorkerError(f"the parsing process {what}; it was replaced", "") from None
