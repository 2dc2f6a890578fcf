"""Health of one model on one target, and of each of its engines.

The verdicts read ``config.Detection``: the same thresholds, windows and traffic
floor the generated alerts (rules.py) are written from, so the sidecar's health and
Prometheus's alerts say the same thing about the same counters (tested: the same
series go through promtool and through ``judge``).

Model: idle | unknown (invariants broken) | collapsed | degraded | ok | unknown (no profile).
Engine: idle | unknown (invariants broken) | collapsed | degraded (lags its model) | ok.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from .config import Detection
from .derive import derive, invariant_violations, sum_counters
from .model import BaselineProfile, Counters


def match_profile(
    profiles: Sequence[BaselineProfile], model_name: str, k: int, method: str | None
) -> BaselineProfile | None:
    return next((p for p in profiles if p.matches(model_name, k, method)), None)


@dataclass(frozen=True, slots=True)
class Verdict:
    state: str
    reason: str  # one line: why (names the engine when an engine is the cause)
    engines: Mapping[str, str]  # engine -> state


def _gain(c: Counters) -> float:
    return c.accepted / c.drafts


def _idle(c: Counters, span: float | None, det: Detection, min_drafts: int) -> bool:
    # Both floors: enough drafts for a ratio to mean something, and real traffic
    # (the alerts' rate floor), so a short or a trickling window is never judged.
    return c.drafts < max(min_drafts, 1) or not span or c.drafts / span < det.min_drafts_per_second


def engine_state(c: Counters, model_gain: float | None, span: float | None, det: Detection, min_drafts: int) -> str:
    if _idle(c, span, det, min_drafts):
        return "idle"
    if invariant_violations(c, "engine"):
        return "unknown"
    if _gain(c) < det.collapse_margin:
        return "collapsed"
    if model_gain is not None and _gain(c) < det.engine_lag_fraction * model_gain:
        return "degraded"
    return "ok"


def judge(engines: Mapping[str, Counters], span: float | None, profile: BaselineProfile | None,
          det: Detection, min_drafts: int) -> Verdict:
    """The verdict over one window: ``engines`` are that window's counter increments."""
    if not engines:
        return Verdict("idle", "no drafts in the window", {})
    total = sum_counters(engines.values())
    model_gain = None if total.drafts <= 0 else _gain(total)
    states = {e: engine_state(c, model_gain, span, det, min_drafts) for e, c in engines.items()}
    if _idle(total, span, det, min_drafts):
        return Verdict("idle", f"under {det.min_drafts_per_second:g} drafts/s or {min_drafts} drafts", states)
    if invariant_violations(total, "model"):
        return Verdict("unknown", "the counters break vLLM's invariants: figures not trusted", states)
    st = derive(total, span)
    al = st.mean_acceptance_length
    if al - 1.0 < det.collapse_margin:
        return Verdict("collapsed", f"mean acceptance length {al:.3f} < {1 + det.collapse_margin:g}", states)
    bad = [e for e, s in states.items() if s in ("collapsed", "degraded")]
    if bad:
        what = ", ".join(f"engine {e} {states[e]} (AL {1 + _gain(engines[e]):.3f})" for e in bad)
        return Verdict("degraded", what, states)
    pos0 = st.per_position_acceptance[0] if st.per_position_acceptance else None
    if pos0 is not None and pos0 < det.position0_floor:
        return Verdict("degraded", f"position 0 acceptance {pos0:.3f} < {det.position0_floor:g}: a broken draft "
                       f"path, or synthetic random-token load such as a benchmark", states)
    if profile is not None:
        floor = 1 + det.degraded_fraction * (profile.mean_acceptance_length - 1)
        if al < floor:
            return Verdict("degraded", f"mean acceptance length {al:.3f} < {floor:.3f} "
                           f"(profile {profile.name}: {profile.mean_acceptance_length:g})", states)
        return Verdict("ok", f"mean acceptance length {al:.3f}", states)
    return Verdict("unknown", f"mean acceptance length {al:.3f}; no baseline profile", states)
