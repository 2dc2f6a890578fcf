"""Counters per engine -> the stable JSON summary (CLI --format json, /api/v1/summary).

Schema: {"models": {MODEL: {"all": STATS, "engines": {ENGINE: STATS}}},
         "interval_seconds": number|null, "warnings": [...]}
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any


from . import config
from .derive import derive, invariant_violations, sum_counters
from .health import diagnose
from .model import Counters, SeriesKey, series_name


def engine_order(engine: str) -> tuple[int, int, str]:
    """Numeric ranks in numeric order (2 before 10), any other string after.

    Label values are arbitrary strings: only short ASCII digit strings are read as
    numbers (str.isdigit() accepts '²', which int() refuses, and int() refuses
    more than 4,300 digits).
    """
    if engine.isascii() and engine.isdigit() and len(engine) <= 18:
        return (0, int(engine), "")
    return (1, 0, engine)


def summarize(
    engines: Mapping[SeriesKey, Counters],
    interval_seconds: float | None = None,
    warnings: Iterable[str] = (),
) -> dict[str, Any]:
    by_model: dict[str, dict[str, Counters]] = {}
    for (model, engine), counters in engines.items():
        by_model.setdefault(model, {})[engine] = counters
    models = {}
    for model in sorted(by_model):
        per_engine = by_model[model]
        engines_json = {}
        for engine in sorted(per_engine, key=engine_order):
            c = per_engine[engine]
            checks = invariant_violations(c, series_name((model, engine)))
            engines_json[engine] = derive(c, interval_seconds, checks).to_json()
        total = sum_counters(per_engine.values())
        checks = invariant_violations(total, f'{config.LABEL_MODEL}="{model}" (sum of {len(per_engine)} engines)')
        ks = sorted({c.k for c in per_engine.values()})
        if len(ks) > 1:
            checks.append(f'{config.LABEL_MODEL}="{model}": engines disagree on k {ks}; positions summed where present')
        # The likely causes of a fall, from the counters alone (a hint: every cause that fits).
        hints = diagnose(per_engine, config.DETECTION, config.DEFAULT_MIN_DRAFTS)
        models[model] = {"all": derive(total, interval_seconds, checks).to_json(), "engines": engines_json,
                         "diagnosis": [{"cause": h.cause, "evidence": h.evidence} for h in hints]}
    return {"models": models, "interval_seconds": interval_seconds, "warnings": list(warnings)}
