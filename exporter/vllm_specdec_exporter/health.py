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
from dataclasses import dataclass, replace

from . import config
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
    causes: tuple[Hint, ...] = ()  # the likely causes of a fall (or of too good a figure): hints

    @property
    def hint(self) -> str:
        return describe(self.causes)


@dataclass(frozen=True, slots=True)
class Hint:
    cause: str  # one of config.CAUSES
    evidence: str  # the figures that point at it


CAUSE_TEXT = {
    "draft_head_garbage": "the draft head produces garbage (a broken quantised conversion or loader)",
    "chain_break": "the draft chain breaks after the first position (k beyond what the draft was trained for, "
                   "or a mis-wired later layer)",
    "one_rank": "one rank (a rank-specific load, device or node)",
    "configuration_change": "a configuration change (a restart, a new k, a new version)",
    "workload_shift": "a workload shift (traffic mix, temperature, synthetic random-token load), or a partly "
                      "broken draft path (draft sampling, missing draft context)",
    "too_good": "too good to be true (repetition loops, a broken detector or broken metrics)",
}


def describe(causes: Sequence[Hint]) -> str:
    """One line: a hint, never a certainty; every cause that fits is named."""
    if not causes:
        return ""
    return "likely cause (a hint): " + "; or ".join(f"{CAUSE_TEXT[h.cause]}: {h.evidence}" for h in causes)


def _pct(v: float) -> str:
    return f"{100 * v:.1f} %"


def diagnose(engines: Mapping[str, Counters], det: Detection, min_drafts: int, fell: bool | None = None,
             changes: Sequence[str] = ()) -> tuple[Hint, ...]:
    """Fingerprints of the causes in one window's counters. ``fell``: the verdict is degraded or
    collapsed (None: decide from the counters alone, as report/diff do); ``changes``: what the
    sidecar saw change in the window (restarts, k)."""
    judged = {e: c for e, c in engines.items()
              if c.drafts >= max(min_drafts, 1) and c.k and not invariant_violations(c, "engine")}
    if not judged:
        return ()
    total = sum_counters(judged.values())
    st = derive(total)
    gain = _gain(total)
    hints: list[Hint] = []
    if st.acceptance_rate is not None and st.acceptance_rate > config.DIAG_TOO_GOOD_ACCEPTANCE:
        hints.append(Hint("too_good", f"acceptance {_pct(st.acceptance_rate)} of {total.draft_tokens:,.0f} draft "
                                      f"tokens (healthy real traffic: at most ~96 %)"))
    bad = sorted((e for e, c in judged.items() if _gain(c) < det.collapse_margin
                  or _gain(c) < det.engine_lag_fraction * gain), key=lambda e: _gain(judged[e]))
    pos0 = total.per_position[0] / total.drafts  # drafts > 0: every judged engine has min_drafts
    cond = {i: v for i, v in enumerate(st.conditional_acceptance) if i > 0 and v is not None}
    if fell is None:
        fell = gain < det.collapse_margin or bool(bad) or pos0 < det.position0_floor
    if not fell:
        return tuple(hints)
    falls: list[Hint] = []
    if changes:
        falls.append(Hint("configuration_change", "the fall coincides with " + ", ".join(changes)))
    if len(judged) > 1 and bad and len(bad) < len(judged):
        rest = sum_counters(c for e, c in judged.items() if e not in bad)
        worst = ", ".join(f"engine {e} at AL {1 + _gain(judged[e]):.3f}" for e in bad[:3])
        falls.append(Hint("one_rank", f"{worst} while the other {len(judged) - len(bad)} are at AL "
                                      f"{1 + _gain(rest):.3f}"))
    zero = [e for e, c in judged.items() if c.per_position[0] / c.drafts < config.DIAG_GARBAGE_POSITION0]
    if len(zero) == len(judged):
        where = "on every engine" if len(judged) > 1 else "on its only engine"
        falls.append(Hint("draft_head_garbage", f"position 0 accepted in {_pct(pos0)} of drafts, {where}"))
    broken = [i for i, v in cond.items() if v < config.DIAG_CHAIN_BREAK_CONDITIONAL]
    if pos0 >= det.position0_floor and broken:
        i = broken[0]
        falls.append(Hint("chain_break", f"position 0 accepted in {_pct(pos0)} of drafts, position {i} in "
                                         f"{_pct(cond[i])} of those that reached it"))
    if not any(h.cause in ("one_rank", "draft_head_garbage", "chain_break") for h in falls):
        then = ", ".join(_pct(v) for v in cond.values())
        falls.append(Hint("workload_shift", f"every engine ({len(judged)}) and every position lower together: "
                                            f"position 0 at {_pct(pos0)}" + (f", then {then} conditional" if then
                                                                                else "")
                          + "; a fall over hours rather than at once points at the workload"))
    return tuple(falls + hints)


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
          det: Detection, min_drafts: int, changes: Sequence[str] = ()) -> Verdict:
    """The verdict over one window (``engines``: that window's counter increments), with the
    likely causes when it fell (or is too good to be true)."""
    v = _judge(engines, span, profile, det, min_drafts)
    if v.state in ("idle",) or (v.state == "unknown" and "invariants" in v.reason):
        return v
    return replace(v, causes=diagnose(engines, det, min_drafts, v.state in ("degraded", "collapsed"), changes))


def _judge(engines: Mapping[str, Counters], span: float | None, profile: BaselineProfile | None,
           det: Detection, min_drafts: int) -> Verdict:
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
    if al is None:  # no drafts at all (possible only with min_drafts 0)
        return Verdict("idle", "no drafts", states)
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
