"""The sidecar's polling core: one poller per target, publishing immutable views.

Each poll fetches /metrics, reads the payload (parse_pool), folds it into the
target's history and publishes a fresh frozen ``views.TargetView`` (an attribute
swap, so /metrics and the API always read a consistent state without locks). Clocks
and the HTTP session are injected: tests drive ``poll_once`` with a fake clock.
"""

from __future__ import annotations

import asyncio
import hashlib
import random
import time
from collections.abc import Callable, Mapping
from dataclasses import replace

import aiohttp
import structlog

from . import config, parse_pool
from .baselines import NO_BASELINE, named_profile
from .derive import invariant_violations
from .diagnosis_state import DiagnosisState, Seen
from .errors import ConfigError
from .history import Observation, TargetHistory
from .localfiles import read_capped
from .metrics import sample
from .model import Counters, SeriesKey, series_name
from .parse_pool import Failure, Payload, Read, WorkerError
from .parser import PayloadTooLarge
from .redaction import credentials, redact_url, scrub
from .settings import Settings, Target
from .sources import MODELS_PATH, SourceError, fetch_metrics, models_url, read_served_models
from .views import POLL_DURATION_BUCKETS, ModelView, TargetView, history_windows, model_views

log = structlog.get_logger("vllm_specdec_exporter")

MAX_BEARER_TOKEN_BYTES = 64 << 10  # re-read each poll: a Kubernetes service-account token is 1-2 KB
RESETS_LOGGED_PER_POLL = 8  # a DP=8 server's restart, one line per engine; more in one line
SERVED_MODELS_MIN_SECONDS = 0.2  # the poll's time left under which /v1/models waits for the next poll

POLL_RESULTS = (
    "success",
    "http_error",
    "timeout",
    "connect_error",
    "invalid_url",
    "too_large",
    "not_prometheus",
    "no_spec_decode",
    "unsupported_producer",
    "error",
)


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
        self.max_series = min(settings.max_series_per_target, max(1, config.MAX_SERIES_TOTAL // max(1, len(settings.targets))))
        self.failures = 0
        self._polls = {r: 0 for r in POLL_RESULTS}
        self._buckets = [0] * len(POLL_DURATION_BUCKETS)
        self._seen_warnings: set[bytes] = set()  # digests of the warnings logged (_warn_once)
        self._warnings_suppressed = 0
        self._secrets = credentials(target.url)  # + the bearer token once read
        self._last_exception: str | None = None
        # What the diagnosis reads beside the counters (restarts, k changes, the figures before
        # them, position 0 within the day): fed here, one way, on every poll.
        self.diagnosis = DiagnosisState(settings.windows, settings.health_window, settings.detection, settings.min_drafts)
        self._appeared_logged = 0
        # What vLLM serves under each served name (/v1/models): read by _read_served_models.
        self.served: dict[str, str] = {}
        self._models_url = models_url(target.url)
        self._served_read_at: float | None = None
        self._served_asked: set[str] = set()  # the model names /v1/models was read for
        self._served_due = False  # a restart: read it again on the next poll
        self.view = TargetView(target.name, redact_url(target.url), polls=dict(self._polls))

    def _headers(self) -> dict[str, str]:
        if not self.target.bearer_token_file:
            return {}
        # Read on every poll so a rotated token is picked up; never logged. A regular file of at
        # most MAX_BEARER_TOKEN_BYTES, opened without blocking: a FIFO or a huge file stalled the loop.
        try:
            raw = read_capped("bearer_token_file", self.target.bearer_token_file, MAX_BEARER_TOKEN_BYTES)
        except ConfigError as e:
            raise SourceError(f"bearer_token_file: {e.message}", "error") from None
        try:
            token = raw.decode("utf-8").strip()
        except UnicodeDecodeError:
            token = "\0"  # refused below
        if not token or not token.isprintable():
            raise SourceError(
                f"bearer_token_file {self.target.bearer_token_file}: not one line of printable UTF-8 (empty, "
                "several lines or control characters)",
                "error",
            )
        self._secrets = credentials(self.target.url, token)
        return {"Authorization": f"Bearer {token}"}

    async def poll_once(self) -> str:
        """One poll; returns the result word (also counted in polls_total). Never raises
        (but for cancellation): whatever goes wrong is counted as a result."""
        started = self.mono()
        got: Read | Failure | None = None
        generation: Mapping[SeriesKey, float] = {}  # spec decode off: vLLM's generation counters only
        error: str | None = None
        try:
            body = await fetch_metrics(
                self.session,
                self.target.url,
                max_bytes=self.settings.max_payload_bytes,
                timeout=self.settings.poll_timeout,
                headers=self._headers(),
            )
            # A big payload is read in a parsing process, so /healthz and /metrics keep answering.
            got = await parse_pool.read(
                Payload(
                    self.target.name,
                    body,
                    self.settings.max_payload_bytes,
                    self.target.producer,
                    self.history.seen(),
                    self.max_series,
                    self.history.last_poll(),
                )
            )
            if isinstance(got, Failure):  # e.g. not Prometheus text, no spec decode, a refused producer
                result, error, generation = got.result, got.error, got.generation
                generation = {k: v for k, v in generation.items() if not self._carries_secret(*k)}
            else:
                result = "success"
                got = self._without_secrets(got)
                await self._read_served_models(got, started)
        except PayloadTooLarge as e:  # from the response's length, before the payload is read
            result, error = "too_large", str(e)
        except SourceError as e:
            result, error = e.kind, str(e)
        except WorkerError as e:  # a bug in the worker process: its traceback comes as text
            result, error = "error", self._log_exception(e, e.details)
        except Exception as e:  # a bug must not kill the poller: count it, log it, go on
            result, error = "error", self._log_exception(e)
        duration = self.mono() - started
        error = scrub(error, self._secrets)  # a target may echo its credentials back
        try:
            if isinstance(got, Read):
                await self._record_success(got, duration)
            elif result == "no_spec_decode":
                self._record_spec_decode_off(error, generation, duration)
            else:
                self._record_failure(result, error, duration)
        except Exception as e:  # e.g. in the history or the views: this poll failed, not the poller
            result = "error"
            self._record_failure(result, self._log_exception(e), duration)
        return result

    def _carries_secret(self, *values: str) -> bool:
        # Whole secrets only: scrub's 8-character prefixes (for quotes cut short) would take a
        # password starting "deepseek" for an echo in every DeepSeek model name.
        return any(secret in v for secret in self._secrets for v in values)

    def _without_secrets(self, read: Read) -> Read:
        """A target may echo its credentials into label values, which /metrics, the landing page and
        the summary show as read: its series whose model or engine carries one are left out."""
        leaked = {key for key in read.kept if self._carries_secret(*key)}
        if not leaked:
            return read
        self._warn_once(f"{len(leaked)} series left out: their labels carry the target's credentials", "credentials_in_labels")
        return replace(read, kept={k: v for k, v in read.kept.items() if k not in leaked})

    async def _read_served_models(self, read: Read, poll_started: float) -> None:
        """What a vLLM target serves under each served name, from its /v1/models: on the first
        poll, when a model name it was not read for appears, after a restart, and every
        SERVED_MODELS_REFRESH_SECONDS. Bounded in size and time; a failure keeps the last
        answer, is counted and warned about once, and never fails the poll."""
        if self._models_url is None or read.snapshot.producer not in config.VLLM_PRODUCERS:
            return
        now, names = self.mono(), {model for model, _ in read.kept}
        stale = self._served_read_at is None or now - self._served_read_at >= config.SERVED_MODELS_REFRESH_SECONDS
        # Within the poll's own timeout, not a second one: a slow /v1/models read at every poll (model
        # names that churn ask for it each time) made each poll last twice its timeout.
        left = self.settings.poll_timeout - (now - poll_started)
        if not (stale or self._served_due or names - self._served_asked):
            return
        if left < SERVED_MODELS_MIN_SECONDS:  # asked again next poll; said, not silently never read
            self.view = replace(self.view, served_models_failures=self.view.served_models_failures + 1)
            self._warn_once(
                f"{MODELS_PATH}: not read, the payload took the poll's timeout ({self.settings.poll_timeout:g} s); "
                "baseline profiles are matched by the served name alone",
                "served_models_unread",
            )
            return
        self._served_read_at, self._served_due, self._served_asked = now, False, names
        try:
            body = await fetch_metrics(
                self.session,
                self._models_url,
                max_bytes=config.MAX_SERVED_MODELS_BYTES,
                timeout=left,
                headers=self._headers(),
            )
            self.served = {k: v for k, v in read_served_models(body).items() if not self._carries_secret(k, v)}
        except (SourceError, PayloadTooLarge, ValueError) as e:
            self.view = replace(self.view, served_models_failures=self.view.served_models_failures + 1)
            self._warn_once(f"{MODELS_PATH}: {e}; baseline profiles are matched by the served name alone", "served_models_unread")

    def _log_exception(self, e: Exception, details: str | None = None) -> str:
        message = f"{type(e).__name__}: {e}"[:500]
        if message != self._last_exception:  # once with its traceback, not on every poll
            self._last_exception = message
            if details:
                log.error("poll_failed_unexpectedly", target=self.target.name, error=message, traceback=details)
            else:
                log.exception("poll_failed_unexpectedly", target=self.target.name, error=message)
        return message

    def _counted(self, result: str, duration: float) -> TargetView:
        """The view with this poll counted (its result and duration)."""
        self._polls[result] = self._polls.get(result, 0) + 1
        for i, bound in enumerate(POLL_DURATION_BUCKETS):
            if duration <= bound:
                self._buckets[i] += 1
        view = self.view
        return replace(
            view,
            last_result=result,
            polls=dict(self._polls),
            duration_buckets=tuple(self._buckets),
            duration_sum=view.duration_sum + duration,
            duration_count=view.duration_count + 1,
        )

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
        self.diagnosis.cleared()
        self.view = replace(
            self._counted(result, duration),
            up=True,
            last_error=error,
            last_success_wall=self.wall(),
            last_success_mono=self.mono(),
            raw={},
            models=(),
            generation_only=dict(generation),
        )

    async def _record_success(self, read: Read, duration: float) -> None:
        view = self.view
        # The history and views first: if they raise, nothing is counted twice.
        now = self.mono()
        observation = self.history.observe(now, read.kept, read.forget)
        # The views read the history (only this poller writes it, and it waits here): in a
        # thread, as at 4,096 engines they take ~0.4 s that /healthz would otherwise wait.
        raw = _consistent(self.history, read.kept)
        models, spans = await asyncio.to_thread(self._views, now, observation, read.kept, raw)
        for mv in models:
            if mv.profile is None:
                self._warn_once(self._no_profile(mv), "no_baseline")
        counted = self._counted("success", duration)
        if not view.up or view.last_error:
            log.info("target_up", target=self.target.name, url=view.url)
        self.failures = 0
        self._last_exception = None
        snapshot = read.snapshot
        if read.refused:
            self._warn_once(
                f"model/engine series over the {self.max_series} held per target (max_series_per_target) "
                f"or over {config.MAX_MODELS_PER_TARGET} models refused"
            )
        if read.forget:
            self._warn_once(
                f"model/engine series unseen the longest forgotten to stay within the "
                f"{self.max_series} held per target (max_series_per_target)"
            )
        violations = snapshot.impossible_values
        for key, inc in observation.increments.items():
            for message in invariant_violations(inc, series_name(key)):
                violations += 1
                self._warn_once(f"invariant violated in the last poll: {message}")
        for key, reason in observation.inconsistent:
            self._warn_once(f"{series_name(key)[:300]}: inconsistent poll, nothing added to the windows: {reason}")
        for key, reason in observation.skipped:
            self._warn_once(f"{series_name(key)[:300]}: {reason}; that series skipped this poll, the counters counted")
        self._served_due = self._served_due or bool(observation.restarted)
        restarted = list(observation.restarted)
        for key in restarted[:RESETS_LOGGED_PER_POLL]:
            log.info("counter_reset", target=self.target.name, series=series_name(key)[:300])
        if len(restarted) > RESETS_LOGGED_PER_POLL:  # names that churn with restarts: not a flood (helper-39)
            log.info("counter_reset", target=self.target.name, more=len(restarted) - RESETS_LOGGED_PER_POLL)
        for key in observation.appeared:
            self._appeared_logged += 1
            if self._appeared_logged <= 100:  # churn of labels is not a flood of log lines
                log.info(
                    "engine_appeared",
                    target=self.target.name,
                    series=series_name(key)[:300],
                    note="the last one logged" if self._appeared_logged == 100 else None,
                )
        for message in snapshot.warnings:
            self._warn_once(message)
        for k in sorted({c.k for c in read.kept.values()} - set(range(config.MAX_SPECULATIVE_TOKENS + 1))):
            self._warn_once(
                f"k={k} is above the {config.MAX_SPECULATIVE_TOKENS} positions the generated rules "
                f"cover (config.MAX_SPECULATIVE_TOKENS): the wasted-tokens alert cannot fire for it"
            )
        self.diagnosis.judged({mv.model_name: mv.health for mv in models}, {mv.model_name: mv.profile for mv in models})
        self.view = replace(
            counted,
            up=True,
            last_error=None,
            last_success_wall=self.wall(),
            last_success_mono=now,
            counter_resets=view.counter_resets + len(observation.restarted),
            invariant_violations=view.invariant_violations + violations,
            inconsistent_polls=view.inconsistent_polls + len(observation.inconsistent) + len(observation.skipped),
            warnings_suppressed=self._warnings_suppressed,
            last_poll_parse_errors=snapshot.malformed_lines + snapshot.duplicate_series,
            last_poll_series_refused=read.refused,
            series_forgotten=view.series_forgotten + len(read.forget),
            raw=raw,
            generation_only={},
            models=models,
            window_spans=spans,
            producer=snapshot.producer,
            approximate=snapshot.approximate,
        )

    def _views(
        self, now: float, observation: Observation, kept: Mapping[SeriesKey, Counters], raw: Mapping[SeriesKey, Counters]
    ) -> tuple[tuple[ModelView, ...], dict[str, float]]:
        """The model views and each window's span, from one reading of the history's windows,
        which the diagnosis state is fed with the poll's restarts and counters."""
        windows = history_windows(self.history, self.settings)
        seen: dict[str, Seen] = self.diagnosis.observe(now, observation.restarted, kept, windows)
        models = model_views(windows, raw, self.settings, self.target, seen, self.served, self.history.trends())
        return models, {label: w.span_seconds for label, w in windows.items()}

    def _no_profile(self, mv: ModelView) -> str:
        """Why a model has no profile, said once (no_baseline)."""
        named = self.target.profile and named_profile(self.settings.baselines, self.target.profile)
        if named:  # a name and method settings checked: only the counters' k can differ
            return (
                f"no healthy reference for {mv.model_name} at k={mv.k}: the target's profile {named.name} is for "
                f"k={named.k} and applies at that k only; name the one for k={mv.k}, or leave the profile out to "
                f"match one by model"
            )
        root = f" (root {mv.root})" if mv.root and mv.root != mv.model_name else ""
        return f"no healthy reference for {mv.model_name}{root} at k={mv.k}: {NO_BASELINE}"

    def _warn_once(self, message: str, event: str = "target_warning") -> None:
        # Upstream problems are logged when first seen, not on every poll. What is
        # remembered is a digest of the cut message: labels that change on every poll
        # (warnings quote them) cannot grow memory (config.WARNINGS_REMEMBERED).
        cut = config.MAX_WARNING_CHARS
        message = scrub(message[: 2 * cut], self._secrets)[:cut]  # scrubbed before the cut: no half secret
        digest = hashlib.blake2b(message.encode(), digest_size=16).digest()
        if digest in self._seen_warnings:
            return
        if len(self._seen_warnings) >= config.WARNINGS_REMEMBERED:
            if not self._warnings_suppressed:
                log.warning(
                    "target_warnings_suppressed",
                    target=self.target.name,
                    note=f"{config.WARNINGS_REMEMBERED} distinct warnings logged; new ones are only counted "
                    f"({sample('exporter_warnings_suppressed')})",
                )
            self._warnings_suppressed += 1
            return
        self._seen_warnings.add(digest)
        log.warning(event, target=self.target.name, warning=message)

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


def _consistent(history: TargetHistory, kept: Mapping[SeriesKey, Counters]) -> dict[SeriesKey, Counters]:
    """What is re-exported: each engine's last consistent values, so a glitch (a cut
    payload, a dip) never reaches Prometheus as a counter reset."""
    return {key: history.base(key) or c for key, c in kept.items()}
