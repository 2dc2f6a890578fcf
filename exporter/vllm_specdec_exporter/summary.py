"""Counters per engine -> the stable JSON summary (CLI --format json, /api/v1/summary).

Schema: {"models": {MODEL: {"all": STATS, "engines": {ENGINE: STATS},
                           "health": {"state": ..., "reason": ..., "engines": {ENGINE: STATE}}, "diagnosis": [...],
                           "cost": COST (/api/v1/summary; the CLI adds its own)}},
         "interval_seconds": number|null, "warnings": [...]}
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Mapping
from typing import Any

from . import capacity, config
from .derive import Stats, derive, invariant_violations, sum_counters
from .diagnosis import Known
from .health import Engines, Verdict, judge
from .model import BaselineProfile, Counters, SeriesKey, engine_order, series_name

# model, its engines' counters -> the verdict with its likely causes (health.judge with what
# the caller knows: profile, restarts, k changes, earlier figures).
Judge = Callable[[str, Mapping[str, Counters]], Verdict]
# model, its figures over the interval (summed over its engines) -> its "cost" entry (``cost``).
Cost = Callable[[str, Stats], dict[str, Any]]


def summarize(
    engines: Mapping[SeriesKey, Counters],
    interval_seconds: float | None = None,
    warnings: Iterable[str] = (),
    verdict: Judge | None = None,
    cost_of: Cost | None = None,
    unlisted: Collection[SeriesKey] = (),
) -> dict[str, Any]:
    """The schema over ``engines``' counters; ``verdict``: each model's verdict (counters alone
    without); ``cost_of``: each model's "cost" entry (none without: the CLI adds its own);
    ``unlisted``: engines in the model's sums and verdict without an entry of their own (the
    sidecar's engines gone from the payload: what they drafted in the window stays the model's)."""
    by_model: dict[str, Engines] = {}
    for (model, engine), counters in engines.items():
        by_model.setdefault(model, Engines())[engine] = counters
    models = {}
    for model in sorted(by_model):
        per_engine = by_model[model]
        engines_json = {}
        broken = []
        for engine in sorted(per_engine, key=engine_order):
            c = per_engine[engine]
            if (model, engine) in unlisted:
                continue
            # Named only when there is something to report (the message is all the name is for).
            checks = invariant_violations(c, "")
            if checks:
                checks = invariant_violations(c, series_name((model, engine)))
                broken.append(engine)
            engines_json[engine] = derive(c, interval_seconds, checks).to_json()
        total = sum_counters(per_engine.values())
        checks = invariant_violations(total, f'{config.LABEL_MODEL}="{model}" (sum of {len(per_engine)} engines)')
        total_broken = bool(checks)
        ks = sorted({c.k for c in per_engine.values()})
        if len(ks) > 1:
            checks.append(f'{config.LABEL_MODEL}="{model}": engines disagree on k {ks}; positions summed where present')
        stats = derive(total, interval_seconds, checks)
        # The verdict and the likely causes (a hint: every cause that fits), by the one classifier,
        # handed what was computed here (diagnosis.Known) so that judge does not compute it again.
        per_engine.known = Known(tuple(per_engine.items()), total, stats, total_broken, frozenset(broken))
        v = (verdict or _counters_only(interval_seconds))(model, per_engine)
        models[model] = {
            "all": stats.to_json(),
            "engines": engines_json,
            # Each engine's state as /metrics' vllm_specdec_engine_health gives it (health.engine_state).
            "health": {
                "state": v.state,
                "reason": v.reason,
                "engines": {e: v.engines[e] for e in engines_json if e in v.engines},
            },
            "diagnosis": [{"cause": h.cause, "evidence": h.evidence} for h in v.causes],
        }
        if cost_of is not None:
            models[model]["cost"] = cost_of(model, stats)
    return {"models": models, "interval_seconds": interval_seconds, "warnings": list(warnings)}


def profile_entry(p: BaselineProfile | None) -> dict[str, Any] | None:
    """A model's "profile" entry (the CLI's and /api/v1/summary's): the baseline profile it is judged
    against, None without one (no healthy reference)."""
    return None if p is None else {"name": p.name, "mean_acceptance_length": p.mean_acceptance_length}


def _counters_only(span: float | None) -> Judge:
    return lambda model, engines: judge(engines, span, None, config.DETECTION, config.DEFAULT_MIN_DRAFTS)


def cost(
    k: int, al: float | None, drafts: float, healthy: float | None, draft_step_cost: float, min_drafts: int, span: float | None
) -> dict[str, Any]:
    """What the head costs in decode steps over the interval: the sidecar's cost gauges
    (collector: capacity.capacity and break_even, on the same figures) against the healthy AL
    they read (``healthy``: the profile's, None without one), null wherever they are absent:
    the window figures with fewer than ``min_drafts`` drafts (``below_break_even`` too), the
    factor, the share and the healthy tokens/s without a healthy AL, the tokens/s without a
    ``span`` (seconds) to make a rate of (the CLI's report and diff: none). ``k``, ``al`` and
    ``drafts``: the figures' k, mean acceptance length and drafts."""
    enough = al is not None and drafts >= min_drafts
    per_second = drafts / span if span is not None and span > 0 else None
    c = capacity.capacity(al, healthy, k, draft_step_cost, per_second) if enough else None
    break_even = capacity.break_even(k, draft_step_cost) if k else None
    return {
        "healthy_mean_acceptance_length": healthy,
        "decode_step_factor_ratio": None if c is None else c.step_factor,
        "decode_steps_wasted_ratio": None if c is None else c.wasted_share,
        "healthy_output_tokens_per_second": None if c is None else c.healthy_tokens_per_second,
        "break_even_mean_acceptance_length": break_even,
        "below_break_even": (break_even is not None and al is not None and al < break_even) if enough else None,
    }
