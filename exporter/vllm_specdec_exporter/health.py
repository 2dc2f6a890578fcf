"""Health of one model on one target, and of each of its engines.

The verdicts read ``config.Detection``: the same thresholds, windows and traffic
floor the generated alerts (rules.py) are written from, so the sidecar's health and
Prometheus's alerts say the same thing about the same counters (tested: the same
series go through promtool and through ``judge``).

Model: idle | unknown (invariants broken) | collapsed | degraded | ok | unknown (no profile).
Engine: idle | unknown (invariants broken) | collapsed | degraded (lags its model) | ok.

The verdict is this module's (thresholds, states), against the profile baselines.py finds; the
likely causes it carries are diagnosis.py's (``diagnose``), called by ``judge``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

from . import capacity
from .config import Detection, collapse_floor
from .derive import derive, invariant_violations, sum_counters
from .diagnosis import Earlier, Hint, Known, describe, diagnose, gain_of
from .model import BaselineProfile, Counters


@dataclass(frozen=True, slots=True)
class Verdict:
    state: str
    reason: str  # one line: why (names the engine when an engine is the cause)
    engines: Mapping[str, str]  # engine -> state
    causes: tuple[Hint, ...] = ()  # the likely causes of a fall (or of too good a figure): hints

    @property
    def hint(self) -> str:
        return describe(self.causes)


class Engines(dict[str, Counters]):
    """One model's engines as summarize hands them to its verdict, with what it computed of
    them (``known``, set once they are all in). A verdict that passes them to judge unchanged
    spares judge the work; any other mapping is judged from scratch."""

    __slots__ = ("known",)

    def __init__(self) -> None:
        super().__init__()
        self.known: Known | None = None


def _known(engines: Mapping[str, Counters]) -> Known | None:
    """``known`` when it was computed of these very engines (a verdict may have changed them)."""
    known = engines.known if isinstance(engines, Engines) else None
    return known if known is not None and tuple(engines.items()) == known.items else None


def _idle(c: Counters, span: float | None, det: Detection, min_drafts: int) -> bool:
    # Both floors: enough drafts for a ratio to mean something, and real traffic
    # (the alerts' rate floor), so a short or a trickling window is never judged.
    # span None: unknown (two dumps), judged on the drafts floor alone.
    return c.drafts < max(min_drafts, 1) or (span is not None and (span <= 0 or c.drafts / span < det.min_drafts_per_second))


def engine_state(
    c: Counters, model_gain: float | None, span: float | None, det: Detection, min_drafts: int, broken: bool | None = None
) -> str:
    """``broken``: whether the engine's invariants are broken, when already known."""
    if _idle(c, span, det, min_drafts):
        return "idle"
    if invariant_violations(c, "engine") if broken is None else broken:
        return "unknown"
    if gain_of(c) < det.collapse_margin:
        return "collapsed"
    if model_gain is not None and gain_of(c) < det.engine_lag_fraction * model_gain:
        return "degraded"
    return "ok"


def _cost(al: float, profile: BaselineProfile | None, k: int, det: Detection) -> str:
    """What a fallen head costs, for a verdict's reason (capacity.py): against the profile where one
    matches; below the break-even, that drafting is slower than none, with or without one."""
    c = capacity.capacity(al, None if profile is None else profile.mean_acceptance_length, k, det.draft_step_cost)
    if c is not None and (text := capacity.describe(c)):
        return "; " + text
    if k and al < capacity.break_even(k, det.draft_step_cost):
        return "; " + capacity.SLOWER_THAN_OFF
    return ""


def judge(
    engines: Mapping[str, Counters],
    span: float | None,
    profile: BaselineProfile | None,
    det: Detection,
    min_drafts: int,
    changes: Sequence[str] = (),
    earlier: Earlier | None = None,
) -> Verdict:
    """The verdict over one interval (``engines``: its counter increments; ``span``: its seconds,
    None when unknown, as between two dumps), with the likely causes (``diagnose``). ``engines``
    from summarize (``Engines``) bring what it computed of them (``Known``)."""
    known = _known(engines)
    v = _judge(engines, span, profile, det, min_drafts, earlier, known)
    if v.state in ("idle",) or (v.state == "unknown" and "invariants" in v.reason):
        return v
    fell = v.state in ("degraded", "collapsed")
    return replace(v, causes=diagnose(engines, det, min_drafts, fell, changes, earlier, profile, known))


def _judge(
    engines: Mapping[str, Counters],
    span: float | None,
    profile: BaselineProfile | None,
    det: Detection,
    min_drafts: int,
    earlier: Earlier | None = None,
    known: Known | None = None,
) -> Verdict:
    if not engines:
        return Verdict("idle", "no drafts in the window", {})
    total = known.total if known is not None else sum_counters(engines.values())
    model_gain = None if total.drafts <= 0 else gain_of(total)
    states = {
        e: engine_state(c, model_gain, span, det, min_drafts, None if known is None else e in known.broken)
        for e, c in engines.items()
    }
    if _idle(total, span, det, min_drafts):
        return Verdict("idle", f"under {det.min_drafts_per_second:g} drafts/s or {min_drafts} drafts", states)
    if known.total_broken if known is not None else invariant_violations(total, "model"):
        return Verdict("unknown", "the counters break vLLM's invariants: figures not trusted", states)
    st = known.stats if known is not None else derive(total, span)
    al = st.mean_acceptance_length
    if al is None:  # no drafts at all (possible only with min_drafts 0)
        return Verdict("idle", "no drafts", states)
    if al < collapse_floor(det.collapse_margin):
        reason = f"mean acceptance length {al:.3f} < {collapse_floor(det.collapse_margin):g}"
        return Verdict("collapsed", reason + _cost(al, profile, total.k, det), states)
    bad = [e for e, s in states.items() if s in ("collapsed", "degraded")]
    floor = None if profile is None else det.degraded_floor_under(profile.mean_acceptance_length)
    if bad:
        what = ", ".join(f"engine {e} {states[e]} (AL {1 + gain_of(engines[e]):.3f})" for e in bad)
        if floor is not None and al < floor:  # the whole model fell too: say so first
            what = f"mean acceptance length {al:.3f} < {floor:.3f} on the whole model; " + what
        return Verdict("degraded", what + _cost(al, profile, total.k, det), states)
    pos0 = st.per_position_acceptance[0] if st.per_position_acceptance else None
    p0floor = det.position0_floor if profile is None else det.position0_floor_under(profile.mean_acceptance_length, profile.k)
    if pos0 is not None and pos0 < p0floor:
        # Low against a profile, or after it was better: a fall. Low from the start with neither:
        # a steady weak drafter and a partly broken one cannot be told apart (as the alert).
        if profile is None and not (earlier is not None and earlier.position0_healthy):
            return Verdict(
                "unknown",
                f"position 0 acceptance {pos0:.3f} < {p0floor:g} from the start, "
                f"with no profile: a weak drafter or a partly broken one",
                states,
            )
        return Verdict(
            "degraded",
            f"position 0 acceptance {pos0:.3f} < {p0floor:.3g}: a broken draft "
            f"path, or synthetic random-token load such as a benchmark" + _cost(al, profile, total.k, det),
            states,
        )
    if profile is not None and floor is not None:
        if al < floor:
            return Verdict(
                "degraded",
                f"mean acceptance length {al:.3f} < {floor:.3f} (profile {profile.name}: {profile.mean_acceptance_length:g})"
                + _cost(al, profile, total.k, det),
                states,
            )
        return Verdict("ok", f"mean acceptance length {al:.3f}", states)
    return Verdict("unknown", f"mean acceptance length {al:.3f}; no baseline profile", states)
