"""The diagnosis: the likely causes of a fall (or of too good a figure) in one interval's
counters, with the figures that point at them: the one classifier every surface uses (report,
diff, /metrics, the landing page, /api/v1/summary, the demo). A hint, never a certainty.

The verdict (health.py: ok, degraded, collapsed...) calls ``diagnose``; what the sidecar saw
beside the counters (restarts, k changes, the figures before them) is diagnosis_state.py's.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from . import config
from .config import Detection
from .derive import Stats, derive, invariant_violations, sum_counters
from .model import BaselineProfile, Counters


@dataclass(frozen=True, slots=True)
class Hint:
    cause: str  # one of config.CAUSES
    evidence: str  # the figures that point at it


@dataclass(frozen=True, slots=True)
class Earlier:
    """What came before the interval, when known: the sidecar's longer window and what it saw
    change; diff's BEFORE dump across a restart (never report: one dump has no before)."""

    label: str = ""  # the longer window ``counters`` cover
    counters: Counters | None = None  # the model over it: a workload shift needs a fall against it
    position0_healthy: bool = False  # position 0 at or above the floor within the last day
    # The model just before the first restart or k change in sight, where known: diff's BEFORE
    # dump of the engines that restarted, the sidecar's health window at its last poll before it.
    # A fall across a change is then told with both figures, and read against them.
    before: Counters | None = None
    # Restarts and k changes within ``label`` but before the interval (the sidecar): a fall
    # against the longer window across one of them is that change, never a workload shift.
    changes: tuple[str, ...] = ()

    @property
    def gain(self) -> float | None:
        """AL - 1 over the longer window, None without drafts there."""
        c = self.counters
        return None if c is None or c.drafts <= 0 else c.accepted / c.drafts


@dataclass(frozen=True, slots=True)
class Known:
    """What summary.summarize has computed for one model's engines, so that judge does not
    compute it again (it runs for every model of every payload read)."""

    items: tuple[tuple[str, Counters], ...]  # the engines it was computed of, in their order
    total: Counters  # sum_counters(engines.values()), in that order
    stats: Stats  # derive(total, ...): only its ratios are read, which neither span nor warnings change
    total_broken: bool  # invariant_violations(total, ...) is not empty
    broken: frozenset[str]  # the engines whose invariant_violations are not empty


CAUSE_TEXT = {
    "draft_head_garbage": "the draft head produces garbage (a broken quantised conversion or loader)",
    "draft_head_partial": "a partly broken draft head (conversion, loader, draft sampling or context)",
    "chain_break": "the draft chain breaks part-way, at the position the evidence names (k beyond what the "
    "draft was trained for, or a mis-wired later layer)",
    "draft_shorter_than_k": "the draft produces fewer tokens than k (lower k, or fix the draft)",
    "one_rank": "one rank or several, not the whole server (a rank-specific load, device or node)",
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


def _positions(ps: Sequence[int]) -> str:
    return ("position " if len(ps) == 1 else "positions ") + ", ".join(map(str, ps))


def _dead(total: Counters) -> list[int]:
    """The positions past 0 never accepted, nor any after them."""
    return [i for i in range(1, total.k) if all(v == 0 for v in total.per_position[i:])]


def _chain(total: Counters, min_drafts: int) -> list[Hint]:
    """What the shape of the chain says, whatever the verdict: positions never accepted (a draft
    shorter than k, or k lowered within the interval) and a chain that falls off after position 0."""
    k, drafts = total.k, total.drafts
    dead = _dead(total)
    hints = []
    if dead and total.per_position[0] > 0 and drafts >= max(min_drafts, 1):
        per_draft = total.draft_tokens / drafts
        if per_draft < dead[0] + 0.5:  # vLLM drafted only up to the dead positions: k itself changed
            hints.append(
                Hint(
                    "configuration_change",
                    f"{per_draft:.2f} draft tokens per draft while the series say "
                    f"k={k}: k was {dead[0]} over this interval "
                    f"({_positions(dead)} did not move)",
                )
            )
        elif (
            total.per_position[0] / drafts >= config.DIAG_GARBAGE_POSITION0
            and total.per_position[dead[0] - 1] >= config.DIAG_MIN_REACHED
        ):
            # Zero only means something where many drafts reached the position: behind a
            # garbage head (16 of 550 drafts past position 0) zeros are its consequence.
            hints.append(
                Hint(
                    "draft_shorter_than_k",
                    f"{_positions(dead)} accepted in exactly 0 of {drafts:,.0f} drafts at k={k}: try k={dead[0]}",
                )
            )
    live = dead[0] if dead else k
    pos0 = total.per_position[0] / drafts if k and drafts > 0 else 0.0
    chain = (drafts, *total.per_position[:live])
    broken = [i for i in range(1, live) if chain[i] > 0 and chain[i + 1] / chain[i] < config.DIAG_CHAIN_BREAK_CONDITIONAL]
    if pos0 >= config.DIAG_GARBAGE_POSITION0 and broken:
        i = broken[0]
        hints.append(
            Hint(
                "chain_break",
                f"position 0 accepted in {_pct(pos0)} of drafts, position {i} in "
                f"{_pct(chain[i + 1] / chain[i])} of those that reached it",
            )
        )
    return hints


def diagnose(
    engines: Mapping[str, Counters],
    det: Detection,
    min_drafts: int,
    fell: bool | None = None,
    changes: Sequence[str] = (),
    earlier: Earlier | None = None,
    profile: BaselineProfile | None = None,
    known: Known | None = None,
) -> tuple[Hint, ...]:
    """Fingerprints of the causes in one interval's counters: the one classifier every surface
    uses (report/diff, /metrics, the landing page, /api/v1/summary, the demo).

    ``fell``: the verdict is degraded or collapsed (None: from the counters alone);
    ``changes``: restarts and k changes seen over the interval; ``earlier``: the counters of
    a longer earlier period when known (the sidecar's longest window; never in report or
    diff): only a fall seen there, with no change, is called a workload shift; ``profile``:
    one rank is named only while the others stand above it (and above their earlier figure);
    ``known``: what summarize computed of ``engines``."""
    judged = {
        e: c
        for e, c in engines.items()
        if c.drafts >= max(min_drafts, 1)
        and c.k
        and not (e in known.broken if known is not None else invariant_violations(c, "engine"))
    }
    if not judged:
        return ()
    if known is not None and len(judged) == len(engines):  # the same engines summed in the same order
        total, st = known.total, known.stats
    else:
        total = sum_counters(judged.values())
        st = derive(total)
    gain = gain_of(total)
    hints: list[Hint] = []
    if st.acceptance_rate is not None and st.acceptance_rate > config.DIAG_TOO_GOOD_ACCEPTANCE:
        hints.append(
            Hint(
                "too_good",
                f"acceptance {_pct(st.acceptance_rate)} of {total.draft_tokens:,.0f} draft "
                f"tokens (healthy model-drafted traffic: at most ~96 %; copy-heavy ngram workloads run higher)",
            )
        )
    shape = _chain(total, min_drafts)
    bad = sorted(
        (e for e, c in judged.items() if gain_of(c) < det.collapse_margin or gain_of(c) < det.engine_lag_fraction * gain),
        key=lambda e: gain_of(judged[e]),
    )
    pos0 = total.per_position[0] / total.drafts  # drafts > 0: every judged engine has min_drafts
    if fell is None:
        fell = gain < det.collapse_margin or bool(bad) or pos0 < det.position0_floor
    seen = list(changes) or list(earlier.changes if earlier is not None else ())
    ref, ref_label = _reference(earlier, seen)
    shape = [_drafted_before(h, total, ref, ref_label) for h in shape]
    if not any(h.cause == "chain_break" for h in shape):
        shape += _chain_floor(total, det, profile, ref, ref_label)
    # A fall against history (the Dropped alert's: the gain below DIAG_FALL_FRACTION of the
    # earlier figure at the same k) is a fall whatever the profile says.
    dropped = ref is not None and ref.k == total.k and gain < config.DIAG_FALL_FRACTION * gain_of(ref)
    if not (fell or dropped):
        return tuple(shape + _drift(total, ref, ref_label, seen) + hints)
    falls: list[Hint] = []
    if seen:
        falls.append(_changed(seen, total, earlier.before if earlier is not None else None))
    rest = sum_counters(c for e, c in judged.items() if e not in bad)
    if len(judged) > 1 and bad and len(bad) < len(judged) and not _fell(rest, det, earlier, profile):
        # Every low engine is named (up to MAX_NAMED_ENGINES, lowest first), and how many of how
        # many they are: two of eight, or six of eight, are not "one rank".
        worst = ", ".join(f"engine {e} at AL {1 + gain_of(judged[e]):.3f}" for e in bad[:MAX_NAMED_ENGINES])
        if len(bad) > MAX_NAMED_ENGINES:
            worst += f" and {len(bad) - MAX_NAMED_ENGINES} more"
        if len(bad) > 1:
            worst = f"{len(bad)} of {len(judged)} engines ({worst})"
        others = len(judged) - len(bad)
        falls.append(
            Hint("one_rank", f"{worst} while the other {others} {'is' if others == 1 else 'are'} at AL {1 + gain_of(rest):.3f}")
        )
    zero = [e for e, c in judged.items() if c.per_position[0] / c.drafts < config.DIAG_GARBAGE_POSITION0]
    if len(zero) == len(judged):
        where = "on every engine" if len(judged) > 1 else "on its only engine"
        falls.append(Hint("draft_head_garbage", f"position 0 accepted in {_pct(pos0)} of drafts, {where}"))
    if ref is not None and not any(h.cause in ("one_rank", "draft_head_garbage", "chain_break") for h in falls + shape):
        # Position 0 held while a later position fell against history: the chain after position 0.
        falls += _chain_against(total, ref, ref_label)
    # The head itself is weak (position 0 under the floor): named even beside a restart or a
    # chain shape (both fit); never beside garbage, one rank or a chain that broke against
    # history, which say more. Across a change whose before figures are known, a position 0
    # above the floor is the change (every position lower together), not a head defect.
    if not any(h.cause in ("one_rank", "draft_head_garbage", "chain_break") for h in falls) and (
        (not shape and not (seen and ref is not None)) or pos0 < det.position0_floor
    ):
        cond = [v for v in st.conditional_acceptance[1:] if v is not None]
        then = f", then {', '.join(_pct(v) for v in cond)} conditional" if cond else ""
        before = earlier.gain if earlier is not None else None
        if seen:
            falls.append(
                Hint(
                    "draft_head_partial",
                    f"every engine ({len(judged)}) and every position low since "
                    f"{', '.join(seen)}: position 0 at {_pct(pos0)}{then}",
                )
            )
        elif earlier is not None and before is not None and _fell(total, det, earlier, None):
            falls.append(
                Hint(
                    "workload_shift",
                    f"every engine ({len(judged)}) and every position lower together: "
                    f"position 0 at {_pct(pos0)}{then}; AL {1 + gain:.3f} against "
                    f"{1 + before:.3f} over {earlier.label}, with no restart or k change",
                )
            )
        elif (
            earlier is not None
            and earlier.position0_healthy
            and pos0 < det.position0_floor
            and not any(h.cause == "draft_shorter_than_k" for h in shape)
        ):
            # Position 0 was healthy within the day and fell with no restart or k change, more
            # slowly than the longer window shows (a decode node decaying over hours). Not beside
            # a draft shorter than k: it lowers position 0 too, and that floor is MTP's.
            over = f" (AL {1 + gain:.3f} against {1 + before:.3f} over {earlier.label})" if before is not None else ""
            falls.append(
                Hint(
                    "workload_shift",
                    f"every engine ({len(judged)}) lower: position 0 fell from {_pct(det.position0_floor)} or more "
                    f"within the last day to {_pct(pos0)}{then}, with no restart or k change{over}",
                )
            )
        else:
            # Nothing earlier to compare with: at the start of a deployment the head is the likelier cause.
            falls.append(
                Hint(
                    "draft_head_partial",
                    f"every engine ({len(judged)}) and every position low: position "
                    f"0 at {_pct(pos0)}{then}, with no fall seen (nothing earlier "
                    f"to compare with); synthetic random-token load gives the same "
                    f"counters",
                )
            )
    short = [h for h in shape if h.cause == "draft_shorter_than_k"]
    if short:
        # Positions accepted in exactly 0 of many drafts: the draft is shorter than k, and that
        # explains the low positions too (DSpark's 5-token block at k=7 lowers the first ones as
        # well). It comes first, and only evidence of its own stands beside it: a restart or k
        # change, a rank apart, a fall against history, a break among the live positions. A
        # partly broken head read from the same low positions is not.
        falls = [h for h in falls if h.cause in INDEPENDENT_OF_SHORT]
        return tuple(short + falls + [h for h in shape if h not in short] + hints)
    return tuple(falls + shape + hints)


def _drift(total: Counters, ref: Counters | None, ref_label: str, seen: Sequence[str]) -> list[Hint]:
    """Every position lower together than the reference at the same k, the gain under
    DIAG_DRIFT_FRACTION of it, with no fall: a hint only (an upgrade's drift or a traffic mix)."""
    if ref is None or ref.k != total.k or ref.drafts <= 0 or gain_of(total) >= config.DIAG_DRIFT_FRACTION * gain_of(ref):
        return []
    if not all(a / total.drafts < b / ref.drafts for a, b in zip(total.per_position, ref.per_position, strict=True)):
        return []
    figures = (
        f"every position lower together: AL {1 + gain_of(total):.3f} against {1 + gain_of(ref):.3f} {ref_label} "
        f"(the gain at {_pct(gain_of(total) / gain_of(ref))} of it)"
    )
    if seen:
        since = "" if ref_label.startswith("before") else f", since {', '.join(seen)}"
        return [Hint("configuration_change", f"{figures}{since}: a drift that came with it")]
    return [Hint("workload_shift", f"{figures}, with no restart or k change: a traffic-mix change, or a drift")]


def _drafted_before(hint: Hint, total: Counters, ref: Counters | None, ref_label: str) -> Hint:
    """A position never accepted now that the reference accepted (its conditional at least
    DIAG_CHAIN_BREAK_CONDITIONAL, at a k that reached it) is not a draft shorter than k: the
    same model drafted it, so the chain breaks there (the e2e MTP head tuned to a few % read
    exactly 0 of 1,908 drafts, after 92 % at k=4 before its restart)."""
    if hint.cause != "draft_shorter_than_k" or ref is None or total.drafts <= 0:
        return hint
    dead = _dead(total)[0]  # a short draft's hint names at least one
    if ref.k <= dead or ref.per_position[dead - 1] <= 0:
        return hint
    was = ref.per_position[dead] / ref.per_position[dead - 1]
    if was < config.DIAG_CHAIN_BREAK_CONDITIONAL:
        return hint
    return Hint(
        "chain_break",
        f"position 0 accepted in {_pct(total.per_position[0] / total.drafts)} of drafts, position {dead} in exactly "
        f"0 of {total.per_position[dead - 1]:,.0f} that reached it, against {_pct(was)} {ref_label}: the chain "
        f"breaks there (a draft shorter than k only if the change brought another draft)",
    )


def _reference(earlier: Earlier | None, seen: Sequence[str]) -> tuple[Counters | None, str]:
    """What the interval is read against, and how to say it: the figures before a restart or k
    change in sight when known, else the longer window (the sidecar); None before any."""
    if earlier is None:
        return None, ""
    if seen and earlier.before is not None and earlier.before.drafts > 0 and earlier.before.k:
        return earlier.before, f"before {seen[0]}"
    if earlier.counters is not None and earlier.counters.drafts > 0 and earlier.counters.k:
        return earlier.counters, f"over {earlier.label}"
    return None, ""


def _changed(seen: Sequence[str], total: Counters, before: Counters | None) -> Hint:
    """A restart or k change the fall follows; with the figures on both sides where the ones
    before it are known. A position 0 fallen below DIAG_FALL_FRACTION of its figure before: the
    draft head changed at it."""
    what = ", ".join(seen)
    if before is None or before.drafts <= 0 or not before.k:
        return Hint("configuration_change", "the fall coincides with " + what)
    pos0, pos0_before = total.per_position[0] / total.drafts, before.per_position[0] / before.drafts
    same_k = before.k == total.k
    al = f"AL {1 + gain_of(total):.3f} since it, against {1 + gain_of(before):.3f} before it" if same_k else ""
    if pos0 < config.DIAG_FALL_FRACTION * pos0_before:
        al = f" ({al})" if al else ""
        # Every later position held its share of the one before: the whole chain scaled down
        # together (an upgrade's drift), not a head that drafts worse past position 0 too.
        now, was = (total.drafts, *total.per_position), (before.drafts, *before.per_position)
        together = (
            same_k
            and total.k > 1
            and all(
                now[i + 1] * was[i] >= config.DIAG_FALL_FRACTION * was[i + 1] * now[i]
                for i in range(1, total.k)
                if was[i] > 0 and now[i] > 0
            )
        )
        head = f"every position fell together at {what}" if together else f"the draft head changed at {what}"
        return Hint(
            "configuration_change",
            f"{head}: position 0 accepted in {_pct(pos0)} of drafts since it, "
            f"against {_pct(pos0_before)} of {before.drafts:,.0f} drafts before it{al}",
        )
    if pos0 >= pos0_before and (not same_k or gain_of(total) >= gain_of(before)):
        return Hint("configuration_change", "the fall coincides with " + what)  # nothing fell across it
    figures = al or f"position 0 accepted in {_pct(pos0)} of drafts since it, against {_pct(pos0_before)} before it"
    return Hint("configuration_change", f"the fall coincides with {what}: {figures}")


def _chain_floor(
    total: Counters, det: Detection, profile: BaselineProfile | None, ref: Counters | None, label: str
) -> list[Hint]:
    """The DraftChainBroken alert's reading, whatever the verdict: position 1 accepted in under
    ALERT_CHAIN_CONDITIONAL_FLOOR of the drafts whose position 0 was, with position 0 healthy,
    against a profile or a chain that was healthy (twice the floor) before."""
    if total.k < 2 or total.per_position[1] <= 0 or total.per_position[0] / total.drafts < det.position0_floor:
        return []  # (a position at exactly 0 is a draft shorter than k, or k lowered: _chain says which)
    cond = total.per_position[1] / total.per_position[0]
    known = ref is not None and ref.k >= 2 and ref.per_position[0] > 0
    healthy_before = (
        known and ref is not None and ref.per_position[1] / ref.per_position[0] >= 2 * config.ALERT_CHAIN_CONDITIONAL_FLOOR
    )
    if cond >= config.ALERT_CHAIN_CONDITIONAL_FLOOR or not (profile is not None or healthy_before):
        return []
    return [_chain_hint(total, ref if known else None, label, 1)]


def _chain_hint(total: Counters, ref: Counters | None, label: str, i: int) -> Hint:
    """chain_break at position ``i``, with the figures of ``ref`` beside when known."""
    now = (total.drafts, *total.per_position)
    if ref is None:
        return Hint(
            "chain_break",
            f"position 0 accepted in {_pct(now[1] / now[0])} of drafts, position {i} in {_pct(now[i + 1] / now[i])} "
            f"of those that reached it (healthy: 41 % or more)",
        )
    was = (ref.drafts, *ref.per_position)
    return Hint(
        "chain_break",
        f"position 0 accepted in {_pct(now[1] / now[0])} of drafts ({_pct(was[1] / was[0])} {label}), "
        f"position {i} in {_pct(now[i + 1] / now[i])} of those that reached it ({_pct(was[i + 1] / was[i])} {label})",
    )


def _chain_against(total: Counters, ref: Counters, label: str) -> list[Hint]:
    """A chain that broke against history: position 0 fell by less than the Dropped alert's
    fraction while a later position's conditional acceptance fell below DIAG_FALL_FRACTION of
    its earlier value (an SGLang DeepSeek-V4 MTP k=3 bug: 0.894 / 0.223 / 0.054 against 0.999 /
    0.710 / 0.333). Compared only at the same k."""
    if ref.k != total.k or total.k < 2:
        return []
    now = (total.drafts, *total.per_position)
    was = (ref.drafts, *ref.per_position)
    if now[1] < config.DIAG_FALL_FRACTION * (now[0] * was[1] / was[0]):
        return []  # position 0 fell as much: the head, not the chain after it
    for i in range(1, total.k):
        if now[i] > 0 and was[i] > 0 and now[i + 1] / now[i] < config.DIAG_FALL_FRACTION * (was[i + 1] / was[i]):
            return [_chain_hint(total, ref, label, i)]
    return []


# The low engines one_rank names one by one; the rest are counted.
MAX_NAMED_ENGINES = 8
# Causes that rest on evidence a draft shorter than k does not explain (diagnose).
INDEPENDENT_OF_SHORT = ("configuration_change", "one_rank", "workload_shift", "chain_break")


def _fell(c: Counters, det: Detection, earlier: Earlier | None, profile: BaselineProfile | None) -> bool:
    """Below the profile's threshold, or below DIAG_FALL_FRACTION of the earlier figure."""
    if profile is not None and gain_of(c) < det.degraded_gain_under(profile.mean_acceptance_length):
        return True
    before = earlier.gain if earlier is not None else None
    return before is not None and gain_of(c) < config.DIAG_FALL_FRACTION * before


def gain_of(c: Counters) -> float:
    """The speculative gain, AL - 1 (accepted tokens per draft), of counters with drafts."""
    return c.accepted / c.drafts
