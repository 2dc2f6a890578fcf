"""What the diagnosis reads beside one target's counters: the restarts and k changes its poller
saw, with when; each model's figures just before the first of them; whether position 0 was
healthy within the day; and the counters since a restart of every engine of a model that came
while the model was already down (a restart that ended a fall), which the diagnosis reads alone.

One ``DiagnosisState`` per target, fed by its poller one way: each poll's restarts, counters and
history windows (``observe``), then the poll's health verdicts and profiles (``judged``); it reads
no view. What comes out is an immutable ``Seen`` per model, which the views carry and the verdict
of every window reads (``window_verdict``): the health window's on /metrics and the landing page,
any window's on /api/v1/summary, with the same inputs, held per window.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

from . import config
from .config import Detection
from .derive import sum_counters
from .diagnosis import Earlier
from .health import Verdict, judge
from .history import WindowDelta
from .model import BaselineProfile, Counters, SeriesKey


@dataclass(frozen=True, slots=True)
class Seen:
    """What the poller saw of one model beside its counters, as each window reads it: the restarts
    and k changes it holds for that window, the model over that window just before the first of
    them, and whether position 0 was healthy within the day. The verdict of every window reads it
    (``window_verdict``): the health window's on /metrics and the landing page, any window's on
    /api/v1/summary, each as the health window's would be were it the health window."""

    at: float = 0.0  # the poll's monotonic time
    # Window label -> (first, last, what): each change held for that window, when first and last seen.
    changes: Mapping[str, tuple[tuple[float, float, str], ...]] = field(default_factory=dict)
    # Window label -> the model over that window at the last poll before the first of them (its
    # engines summed, when they drafted at least min_drafts), while a change is held for it.
    before: Mapping[str, Counters | None] = field(default_factory=dict)
    position0_healthy: bool = False
    # Window label -> each engine's counters since its restart, where every engine of the model
    # restarted within that window while the model was already degraded or collapsed over it: the
    # restarts that ended a fall (never held as a change: they are not its cause). While the
    # window still holds the fall from before them, the likely cause is read from these alone.
    fixed: Mapping[str, Mapping[str, Counters]] = field(default_factory=dict)

    def within(self, label: str, seconds: float) -> list[str]:
        """The changes held for window ``label`` seen within the last ``seconds``."""
        return [what for _, last, what in self.changes.get(label, ()) if last >= self.at - seconds]

    def older(self, label: str, seconds: float) -> tuple[str, ...]:
        """The changes held for window ``label`` seen before the last ``seconds``."""
        return tuple(what for first, _, what in self.changes.get(label, ()) if first < self.at - seconds)


def window_verdict(
    label: str,
    engines: Mapping[str, Counters],
    span: float | None,
    longest: Sequence[Counters] | None,
    profile: BaselineProfile | None,
    windows: Sequence[tuple[str, float]],
    det: Detection,
    min_drafts: int,
    seen: Seen,
) -> Verdict:
    """The verdict over one window (``engines``: its counters) with what the poller saw beside
    them: the changes within the window; and what came before it (``longest``: the model over the
    longest window, when longer): the changes older than the window, the model over the same
    window before the first change, whether position 0 was healthy within the day.

    Where every engine of the model restarted within the window while it was already down
    (``seen.fixed``), the verdict is the window's (it still holds the fall) and the likely causes
    are those of the counters since the restart, judged alone: the fall before a restart that
    ended it is not read as a workload shift or a partly broken head (the mix of a broken and a
    healthy head), nor the restart as its cause."""
    seconds = dict(windows)[label]
    last = windows[-1][0]
    total = sum_counters(longest) if longest is not None and label != last else None
    changes = seen.within(label, seconds)
    older = seen.older(label, seconds) if label != last else ()
    earlier = Earlier(
        last,
        total if total is not None and total.drafts >= max(min_drafts, 1) else None,
        seen.position0_healthy,
        seen.before.get(label) if changes or older else None,
        older,
    )
    verdict = judge(engines, span, profile, det, min_drafts, changes, earlier)
    since = seen.fixed.get(label)
    if since and sum(c.drafts for c in since.values()) <= sum(c.drafts for c in engines.values()):
        # (Never more than the window holds: a restart the window's start has passed is not in it.)
        return replace(verdict, causes=judge(since, None, profile, det, min_drafts).causes)
    return verdict


def together(seen: Sequence[tuple[str, Seen]]) -> Seen:
    """What the pollers of the targets serving one model saw (target name, its ``Seen``): one
    target's as it is; several targets' together, each change naming its target, the model before
    them summed over the targets where every one of them has it."""
    if len(seen) == 1:
        return seen[0][1]
    labels = {label for _, s in seen for label in (*s.changes, *s.before)}
    changes = {
        label: tuple((a, b, f"{what} on target {name}") for name, s in seen for a, b, what in s.changes.get(label, ()))
        for label in labels
    }
    before: dict[str, Counters | None] = {}
    for label in labels:
        each = [s.before.get(label) for _, s in seen]
        if any(label in s.before for _, s in seen):
            before[label] = sum_counters([b for b in each if b is not None]) if all(b is not None for b in each) else None
    # The counters since a restart that ended a fall: where every target's engines restarted so.
    fixed = {
        label: {f"{name}/{e}": c for name, s in seen for e, c in s.fixed[label].items()}
        for label in {label for _, s in seen for label in s.fixed}
        if all(label in s.fixed for _, s in seen)
    }
    return Seen(
        max((s.at for _, s in seen), default=0.0),
        {label: c for label, c in changes.items() if c},
        before,
        any(s.position0_healthy for _, s in seen),
        fixed,
    )


def position0_healthy(total: Counters, det: Detection, min_drafts: int) -> bool:
    """A model's position 0 at or above its floor over at least ``min_drafts`` drafts: a low one
    after it is a fall, never a weak drafter from the start (Earlier.position0_healthy)."""
    if not total.k or total.drafts < max(min_drafts, 1):
        return False
    pos0 = total.per_position[0] / total.drafts
    return math.isfinite(pos0) and pos0 >= det.position0_floor


def model_totals(window: WindowDelta, models: Sequence[str] | set[str], min_drafts: int) -> dict[str, Counters]:
    """Each of ``models`` over one window (its engines summed, in the window's order), where it
    drafted at least ``min_drafts``."""
    grouped: dict[str, list[Counters]] = {}
    for (model, _), c in window.engines.items():
        if model in models:
            grouped.setdefault(model, []).append(c)
    totals = {m: sum_counters(cs) for m, cs in grouped.items()}
    return {m: c for m, c in totals.items() if c.drafts >= max(min_drafts, 1)}


class DiagnosisState:
    """What one target's poller saw change per model (restarts, k), with when, held for the day
    at most, with the model over each window just before the first of them; and when each
    model's position 0 was last healthy over the health window (the alert's lookback).

    Changes are held per window, each as the health window's would be were it the health window:
    forgotten for a window once it has passed with the model not fallen over it."""

    def __init__(self, windows: Sequence[tuple[str, float]], health_window: str, det: Detection, min_drafts: int):
        self.windows = tuple(windows)
        self.health_window = health_window
        self.det = det
        self.min_drafts = min_drafts
        # Window label -> model -> what -> (first, last) seen; window label -> model -> (when, before).
        self._changes: dict[str, dict[str, dict[str, tuple[float, float]]]] = {}
        self._before: dict[str, dict[str, tuple[float, Counters | None]]] = {}
        self._k: dict[str, int] = {}
        self._position0_healthy_at: dict[str, float] = {}  # model -> when its position 0 was last healthy
        # Window label -> model -> engine -> when it restarted while the model was down over that
        # window (a restart that ended a fall), held while the window holds it.
        self._fixed: dict[str, dict[str, dict[str, float]]] = {}
        # The last published poll: its windows, its models, and their verdict over each window
        # (window label -> model -> state): the health window's for every model, another window's
        # for the models a change is held for over it.
        self._windows: Mapping[str, WindowDelta] = {}
        self._published: set[str] = set()
        self._states: dict[str, dict[str, str]] = {}
        # This poll's time, windows and what each model's verdicts read, until they are published.
        self._pending: tuple[float, Mapping[str, WindowDelta], dict[str, Seen]] = (0.0, {}, {})

    def observe(
        self,
        now: float,
        restarted: Sequence[SeriesKey],
        kept: Mapping[SeriesKey, Counters],
        windows: Mapping[str, WindowDelta],
    ) -> dict[str, Seen]:
        """One poll: its restarted engines, the counters it kept and the history's windows. Returns
        what each model's verdicts read (``Seen``)."""
        # k and changes are remembered for the models the windows still hold: names that churn are
        # not kept forever (with restarts, 307,200 changes held after 600 polls: helper-39).
        longest = windows.get(self.windows[-1][0])
        held = {m for m, _ in kept} | ({m for m, _ in longest.engines} if longest else set())
        changed = self._recent_changes(now, restarted, kept, held)
        self._k = {m: k for m, k in self._k.items() if m in held}
        fixed = self._restarts_after_a_fall(now, restarted, kept)
        healthy = set(self._position0_healthy_at)
        seen = {}
        for m in {m for m, _ in kept}:
            s = changed.get(m)
            seen[m] = (
                Seen(s.at, s.changes, s.before, m in healthy, fixed.get(m, {}))
                if s
                else Seen(now, position0_healthy=m in healthy, fixed=fixed.get(m, {}))
            )
        self._pending = (now, windows, seen)
        return seen

    def judged(self, health: Mapping[str, str], profiles: Mapping[str, BaselineProfile | None]) -> None:
        """The health verdict of each model this poll publishes (after ``observe``), and each
        model's profile: a change while a model is already degraded or collapsed over a window is
        not its cause there, and a change is read against the figures of the last poll published.
        The verdicts over the other windows are found here, for the models a change is held for."""
        now, windows, seen = self._pending
        self._windows, self._published = windows, set(health)
        self._states = {self.health_window: dict(health)}
        last = self.windows[-1][0]
        for label, _ in self.windows:
            held, w = self._changes.get(label, {}), windows.get(label)
            if label == self.health_window or w is None:
                continue
            models = {m for m in held if m in seen}
            grouped: dict[str, dict[str, Counters]] = {}
            for (model, engine), c in w.engines.items():
                if model in models:
                    grouped.setdefault(model, {})[engine] = c
            longest = windows.get(last)
            self._states[label] = {
                m: window_verdict(
                    label,
                    engines,
                    w.span_seconds,
                    None if longest is None else [c for (mm, _), c in longest.engines.items() if mm == m],
                    profiles.get(m),
                    self.windows,
                    self.det,
                    self.min_drafts,
                    seen[m],
                ).state
                for m, engines in grouped.items()
            }
        self._remember_position0(now, windows.get(self.health_window), set(seen))

    def cleared(self) -> None:
        """A poll that published no models (spec decode off): nothing to read a change against."""
        self._windows, self._published, self._states = {}, set(), {}

    def _remember_position0(self, now: float, window: WindowDelta | None, models: set[str]) -> None:
        """Which models had a healthy position 0 within a day (the alert's lookback): a low one
        then is a fall, not a steady weak drafter (health.judge)."""
        if window is not None:
            for model, total in model_totals(window, models, self.min_drafts).items():
                if position0_healthy(total, self.det, self.min_drafts):
                    self._position0_healthy_at[model] = now
        horizon = now - config.POSITION0_LOOKBACK_SECONDS
        recent = sorted(((t, m) for m, t in self._position0_healthy_at.items() if t >= horizon), reverse=True)
        # The newest models a target can serve at once: names that churn do not pile up for a day.
        self._position0_healthy_at = {m: t for t, m in recent[: config.MAX_MODELS_PER_TARGET]}

    def _fallen(self, label: str) -> set[str]:
        """The models degraded or collapsed over a window at the last poll published (over the
        health window where their verdict over that one was not found)."""
        health = self._states.get(self.health_window, {})
        states = {**health, **self._states.get(label, {})}
        return {m for m, state in states.items() if state in ("degraded", "collapsed")}

    def _recent_changes(
        self, now: float, restarted: Sequence[SeriesKey], kept: Mapping[SeriesKey, Counters], in_windows: set[str]
    ) -> dict[str, Seen]:
        """Restarts and k changes per model within the day, with when (each window's verdict reads
        those within it: window_verdict), and the model over each window at the last poll before
        the first of them. A change while the model was already degraded or collapsed (the last
        verdict) is not kept: the fall started before it, so it cannot be its cause (a restart that
        fixes a fall is not blamed for it)."""
        found: dict[str, list[str]] = {}
        for model, engine in restarted:
            found.setdefault(model, []).append(f"a restart of engine {engine}")
        ks: dict[str, int] = {}
        for (model, _), c in kept.items():
            ks[model] = max(ks.get(model, 0), c.k)
        for model, k in ks.items():
            if self._k.get(model, k) != k:
                found.setdefault(model, []).append(f"k {self._k[model]} -> {k}")
            self._k[model] = k
        # Held as long as the verdict may read position 0 from the day (POSITION0_LOOKBACK_SECONDS),
        # and never past a window in which the model stood (below).
        horizon = now - max(self.windows[-1][1], config.POSITION0_LOOKBACK_SECONDS)
        for label, seconds in self.windows:
            fallen = self._fallen(label)
            changes, befores = self._changes.setdefault(label, {}), self._before.setdefault(label, {})
            # A change whose whole window has passed with the model not fallen caused nothing
            # that is still there: forgotten, so a later fall is not pinned on it.
            passed = now - seconds
            for model, held in changes.items():
                if model in self._published and model not in fallen:
                    for text in [w for w, (_, last) in held.items() if last < passed]:
                        del held[text]
                    if not held:
                        befores.pop(model, None)
            for model, texts in found.items():
                if model in fallen:
                    continue
                held = changes.setdefault(model, {})
                for text in texts:  # one entry per change, however often it recurs: bounded
                    held[text] = (held.get(text, (now, now))[0], now)
                if model not in befores or befores[model][0] < horizon:
                    befores[model] = (now, self._total_before(model, label))
            self._changes[label] = {
                m: kept_
                for m, v in changes.items()
                if m in in_windows and (kept_ := {w: seen for w, seen in v.items() if seen[1] >= horizon})
            }
            self._before[label] = {m: b for m, b in befores.items() if m in self._changes[label]}
        models = {m for held in self._changes.values() for m in held}
        return {
            m: Seen(
                now,
                {label: tuple((a, b, w) for w, (a, b) in held[m].items()) for label, held in self._changes.items() if m in held},
                {label: b[m][1] for label, b in self._before.items() if m in b},
            )
            for m in models
        }

    def _restarts_after_a_fall(
        self, now: float, restarted: Sequence[SeriesKey], kept: Mapping[SeriesKey, Counters]
    ) -> dict[str, dict[str, dict[str, Counters]]]:
        """Per model and window, each engine's counters since its restart (``kept``: what vLLM
        counted since it started), where every engine of the model restarted within the window
        while the model was down over it (the last verdict published): the restarts that ended a
        fall, which ``_recent_changes`` does not hold. A restart while the model was not down is
        a change (held there): the engine is no longer read from the restart that ended a fall."""
        engines: dict[str, list[str]] = {}
        for model, engine in kept:
            engines.setdefault(model, []).append(engine)
        out: dict[str, dict[str, dict[str, Counters]]] = {}
        for label, seconds in self.windows:
            fallen = self._fallen(label)
            held = self._fixed.setdefault(label, {})
            for model, engine in restarted:
                if model in fallen:
                    held.setdefault(model, {})[engine] = now
                elif model in held:
                    held[model].pop(engine, None)
            passed = now - seconds
            self._fixed[label] = held = {
                m: kept_ for m, at in held.items() if m in engines and (kept_ := {e: t for e, t in at.items() if t > passed})
            }
            for model, at in held.items():
                if all(e in at for e in engines[model]):
                    out.setdefault(model, {})[label] = {e: kept[(model, e)] for e in engines[model]}
        return out

    def _total_before(self, model: str, label: str) -> Counters | None:
        """The model over window ``label`` at the last published poll (None where it was not in
        it, or drafted under min_drafts)."""
        w = self._windows.get(label)
        return model_totals(w, {model}, self.min_drafts).get(model) if model in self._published and w is not None else None
