"""Health of one model on one target: ok | degraded | collapsed | idle | unknown."""

from __future__ import annotations

from collections.abc import Sequence

from .derive import Stats
from .settings import BaselineProfile


def match_profile(
    profiles: Sequence[BaselineProfile], model_name: str, k: int, method: str | None
) -> BaselineProfile | None:
    return next((p for p in profiles if p.matches(model_name, k, method)), None)


def classify(
    stats: Stats | None,
    profile: BaselineProfile | None,
    min_drafts: int,
    collapse_margin: float,
    degraded_fraction: float,
) -> str:
    """Idle first (too few drafts to judge), then collapse (needs no profile), then the profile."""
    if stats is None or stats.num_drafts < min_drafts or stats.mean_acceptance_length is None:
        return "idle"
    al = stats.mean_acceptance_length
    if al - 1.0 < collapse_margin:
        return "collapsed"
    if profile is None:
        return "unknown"
    if al - 1.0 < degraded_fraction * (profile.mean_acceptance_length - 1.0):
        return "degraded"
    return "ok"
