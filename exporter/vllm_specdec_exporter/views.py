"""What a poller publishes: immutable views of one target, its models and their windows.

A poll builds a fresh frozen ``TargetView`` and swaps it in (an attribute swap), so
/metrics, the landing page and /api/v1/summary always read one consistent state
without locks. ``model_views`` derives the per-model figures from a target's history.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from .baselines import find_profile
from .derive import Stats, derive, invariant_violations, mean_acceptance_length, ratio, sum_counters, within
from .diagnosis import Hint
from .diagnosis_state import Seen, window_verdict
from .health import Verdict
from .history import TargetHistory, WindowDelta
from .model import BaselineProfile, Counters, SeriesKey, engine_order, series_name
from .settings import Settings, Target
from .trend import TrendPoint

POLL_DURATION_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


@dataclass(frozen=True, slots=True)
class EngineFigures:
    drafts: float
    mean_acceptance_length: float | None
    acceptance_rate: float | None


@dataclass(frozen=True, slots=True)
class ModelWindow:
    span_seconds: float
    stats: Stats  # summed over the model's engines
    engines: Mapping[str, EngineFigures]  # in engine order
    # Each engine's counters over the window, in the history's order (what /api/v1/summary sums),
    # those gone from the payload too (``engines`` has figures only for those still in it).
    counters: Mapping[str, Counters] = field(default_factory=dict)


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
    # What the served name serves (--model), when known: vLLM's /v1/models, else the target's model.
    root: str | None = None
    profile_matched_by: str = "none"  # baselines.MATCHED_BY: config, served_name, root, alias or none
    seen: Seen = field(default_factory=lambda: Seen())  # what the verdict of any window reads beside the counters
    # One point per step of the longest window, over it (TargetHistory.trends): the landing page's chart.
    trend: tuple[TrendPoint, ...] = ()


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
    served_models_failures: int = 0  # reads of /v1/models that failed
    raw: Mapping[SeriesKey, Counters] = field(default_factory=dict)
    # Spec decode off: only vLLM's generation-token counters, so generating without
    # drafting stays visible (and alertable) through the sidecar alone.
    generation_only: Mapping[SeriesKey, float] = field(default_factory=dict)
    models: tuple[ModelView, ...] = ()
    # Window label -> the span of the target's history over it (every window once a poll was
    # counted, whether or not a model still has engines in it).
    window_spans: Mapping[str, float] = field(default_factory=dict)
    producer: str | None = None  # adapters.PRODUCERS name of the last successful poll
    approximate: tuple[str, ...] = ()  # figures that are estimates for that producer


def history_windows(history: TargetHistory, settings: Settings) -> dict[str, WindowDelta]:
    """The counters of every window of the history (none before the first poll is counted)."""
    return {label: w for label, _ in settings.windows if (w := history.window(label)) is not None}


def model_views(
    windows: Mapping[str, WindowDelta],
    raw: Mapping[SeriesKey, Counters],
    settings: Settings,
    target: Target | None,
    seen: Mapping[str, Seen] | None = None,
    roots: Mapping[str, str] | None = None,
    trends: Mapping[str, tuple[TrendPoint, ...]] | None = None,
) -> tuple[ModelView, ...]:
    """Derived figures per model and window (``history_windows``), summed over
    engines (sums before ratios). ``roots``: served name -> the model it serves (vLLM's
    /v1/models), where known; where not (or where it names no root but the served name
    itself), the ``target``'s model. A profile is looked for under both, unless the target
    names one outright (baselines.find_profile). ``seen``: what the poller saw beside the counters
    per model (diagnosis_state.DiagnosisState.observe), read by the verdict. ``trends``: each
    model's points over the longest window (TargetHistory.trends), passed through."""
    k_by_model: dict[str, int] = {}
    for (model, _), c in raw.items():
        k_by_model[model] = max(k_by_model.get(model, 0), c.k)
    per_model: dict[str, dict[str, ModelWindow]] = {m: {} for m in k_by_model}
    roots = {m: root for m in k_by_model if (root := _root(m, (roots or {}).get(m), target))}
    method, named = (target.method, target.profile) if target is not None else (None, None)
    found = {
        m: find_profile(settings.baselines, settings.profile_aliases, m, roots.get(m), k, method, named)
        for m, k in k_by_model.items()
    }
    profiles = {m: profile for m, (profile, _) in found.items()}
    seen_of = {m: (seen or {}).get(m) or Seen() for m in k_by_model}
    judged: dict[str, Verdict] = {}
    for label, window in windows.items():
        grouped: dict[str, dict[str, Counters]] = {}
        for (model, engine), c in window.engines.items():
            grouped.setdefault(model, {})[engine] = c
        for model, in_window in grouped.items():
            if model not in per_model:
                continue  # a model no longer served: its figures go with its counters
            # So does an engine: the model's sums and verdict keep what it drafted in the window, but it
            # has no figures or health of its own once it is gone (its health read ok for the window).
            engines = {e: c for e, c in in_window.items() if (model, e) in raw}
            span = window.span_seconds or None
            engines_fig = {
                e: EngineFigures(
                    c.drafts,
                    mean_acceptance_length(c.drafts, c.accepted, c.k),
                    within(ratio(c.accepted, c.draft_tokens), 0.0, 1.0),
                )
                for e, c in sorted(engines.items(), key=lambda kv: engine_order(kv[0]))
            }
            total = sum_counters(in_window.values())
            # The window's invariant violations ride along in Stats.warnings (health reads them).
            checks = invariant_violations(total, series_name((model, "sum"))[:300])
            per_model[model][label] = ModelWindow(window.span_seconds, derive(total, span, checks), engines_fig, in_window)
            if label == settings.health_window:
                # The verdict reads the raw counters of the window, not derived figures.
                longest = windows.get(settings.windows[-1][0])
                judged[model] = window_verdict(
                    label,
                    in_window,  # the model's verdict reads what its figures read
                    window.span_seconds,
                    None if longest is None else [c for (m, _), c in longest.engines.items() if m == model],
                    profiles[model],
                    settings.windows,
                    settings.detection,
                    settings.min_drafts,
                    seen_of[model],
                )
    views = []
    for model in sorted(per_model):
        verdict = judged.get(model) or Verdict("idle", "no drafts in the window", {})
        views.append(
            ModelView(
                model,
                k_by_model[model],
                per_model[model],
                profiles[model],
                verdict.state,
                verdict.reason,
                {e: state for e, state in verdict.engines.items() if (model, e) in raw},
                verdict.causes,
                roots.get(model),
                found[model][1],
                seen_of[model],
                (trends or {}).get(model, ()),
            )
        )
    return tuple(views)


def _root(served: str, root: str | None, target: Target | None) -> str | None:
    """What a served name serves: /v1/models' root, else (no answer, or one naming no root
    but the id itself) the target's model, the deployment's --model."""
    if (root is None or root == served) and target is not None and target.model:
        return target.model
    return root
