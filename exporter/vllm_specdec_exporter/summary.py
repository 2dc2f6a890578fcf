"""Counters per engine -> the stable JSON summary (CLI --format json, /api/v1/summary).

Schema: {"models": {MODEL: {"all": STATS, "engines": {ENGINE: STATS}}},
         "interval_seconds": number|null, "warnings": [...]}
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

from . import config
from .derive import derive, invariant_violations, sum_counters
from .diagnosis import Known
from .health import Engines, Verdict, judge
from .model import Counters, SeriesKey, engine_order, series_name

# model, its engines' counters -> the verdict with its likely causes (health.judge with what
# the caller knows: profile, restarts, k changes, earlier figures).
Judge = Callable[[str, Mapping[str, Counters]], Verdict]


def summarize(
    engines: Mapping[SeriesKey, Counters],
    interval_seconds: float | None = None,
    warnings: Iterable[str] = (),
    verdict: Judge | None = None,
) -> dict[str, Any]:
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
            "health": {"state": v.state, "reason": v.reason},
            "diagnosis": [{"cause": h.cause, "evidence": h.evidence} for h in v.causes],
        }
    return {"models": models, "interval_seconds": interval_seconds, "warnings": list(warnings)}


def _counters_only(span: float | None) -> Judge:
    return lambda model, engines: judge(engines, span, None, config.DETECTION, config.DEFAULT_MIN_DRAFTS)
