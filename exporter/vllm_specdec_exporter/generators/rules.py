"""Generate the Prometheus recording rules and alerts from the config module.

Two variants with the same recording-rule names, so the dashboards work with
either: ``sidecar`` reads the exporter's normalised counters (``vllm_specdec_*``),
``vllm-direct`` reads vLLM's own (``vllm:spec_decode_*``) for users who run no
sidecar; alerts that need the sidecar (baseline profiles, target down, exporter
absent) exist only in the first. Ratios are always ratios of summed rates.

    python -m vllm_specdec_exporter.generators.rules [--check] [OUT_DIR]
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import yaml

from .. import config as c
from .. import metrics as m
from ..health import NO_BASELINE
from ..model import BaselineProfile
from ..settings import default_profiles
from .output import exit_status, update_or_check, write_or_check
from .schema import with_schema_config

Rule = dict[str, Any]  # one recording or alerting rule, as Prometheus's YAML has it


P = c.PREFIX


@dataclass(frozen=True)
class Source:
    variant: str
    drafts: str
    draft_tokens: str
    accepted: str
    per_pos: str
    generation: str


SIDECAR = Source(
    "sidecar",
    m.sample("drafts"),
    m.sample("draft_tokens"),
    m.sample("accepted_tokens"),
    m.sample("position_accepted_tokens"),
    m.sample("generation_tokens"),
)
DIRECT = Source(
    "vllm-direct",
    c.VLLM_V1_DRAFTS,
    c.VLLM_V1_DRAFT_TOKENS,
    c.VLLM_V1_ACCEPTED,
    c.VLLM_V1_ACCEPTED_PER_POS,
    c.VLLM_V1_GENERATION_TOKENS,
)
VARIANTS = {"sidecar": SIDECAR, "vllm-direct": DIRECT}
FILES = {"sidecar": "rules.yaml", "vllm-direct": "rules-vllm-direct.yaml"}


def by(labels: Iterable[str]) -> str:
    return ", ".join(labels)


def name(level: str, metric: str, op: str) -> str:
    return f"{level}:{P}_{metric}:{op}"


# Thresholds in the expressions: the names of config.Detection (read by the sidecar's
# health too, and set by the Helm chart's config.health), plus the alert-only ones.
ALERT_ONLY_THRESHOLDS = {
    "drop_fraction": c.ALERT_DROP_FRACTION,
    "chain_conditional_floor": c.ALERT_CHAIN_CONDITIONAL_FLOOR,
    "reference_min_drafts_per_second": c.ALERT_REFERENCE_MIN_DRAFTS_PER_SECOND,
    "min_generation_tokens_per_second": c.ALERT_MIN_GENERATION_TOKENS_PER_SECOND,
    "wasted_position_ratio": c.ALERT_WASTED_POSITION_RATE,
    "suspicious_acceptance_ratio": c.ALERT_HIGH_ACCEPTANCE_RATE,
    "fast_collapse_min_drafts_per_second": c.ALERT_FAST_COLLAPSE_MIN_DRAFTS_PER_SECOND,
}
THRESHOLD_KEYS = tuple(k for k in c.DETECTION_KEYS if k != "window") + tuple(ALERT_ONLY_THRESHOLDS)


def default_thresholds() -> dict[str, str]:
    det = {k: getattr(c.DETECTION, k) for k in c.DETECTION_KEYS if k != "window"}
    return {k: f"{v:g}" for k, v in {**det, **ALERT_ONLY_THRESHOLDS}.items()}


@dataclass(frozen=True)
class Options:
    """What a deployment may change without touching the expressions' shape."""

    ranges: dict[str, str]  # window name -> PromQL range (tests shrink them; missing: the name itself)
    fors: dict[str, str]  # alert -> for
    thresholds: dict[str, str]  # THRESHOLD_KEYS -> literal (the chart passes placeholders)
    runbook_base: str = c.RUNBOOK_BASE_URL
    dashboard_url: str = c.DASHBOARD_URL
    selector: str = c.RULE_SELECTOR  # added to every series a rule reads
    cluster_label: str = c.CLUSTER_LABEL  # "" for none
    namespace_label: str = c.NAMESPACE_LABEL
    pod_label: str = c.POD_LABEL
    day_range: str = "1d"
    unreachable_range: str = ""  # default: TARGET_UNREACHABLE_AFTER minus TargetDown's for
    profiles: tuple[BaselineProfile, ...] = ()  # baseline profiles for the vllm-direct variant (default: the shipped ones)
    aliases: tuple[tuple[str, str], ...] = ()  # (served name, model name the profiles match) for the vllm-direct variant
    alias_placeholders: bool = False  # the Helm chart's copy: its template adds the aliases from values
    # Every window suffix of a recorded name comes from here (the rate<w> / ratio_rate<w> names).
    windows: tuple[str, ...] = c.RULE_WINDOWS  # the windows recorded
    detection_window: str = c.DETECTION.window  # the ratio alerts' verdicts (the sidecar's health window)
    trend_window: str = c.ALERT_TREND_WINDOW  # AcceptanceDropped, AcceptanceSuspiciouslyHigh
    hourly_window: str = c.ALERT_HOURLY_WINDOW  # SpeculativeTokensWasted; the day's history (rate1d, NotDrafting)
    request_extremes_window: str = c.ALERT_REQUEST_EXTREMES_WINDOW  # a sidecar window / vLLM-direct range
    # The long group's evaluation interval ("": a twentieth of the hourly window's range, at most
    # LONG_INTERVAL_MAX: 3m for 1h). It records what no fast-judging alert reads (docs/scale.md).
    long_interval: str = ""

    def range(self, window: str) -> str:
        return self.ranges.get(window, window)

    def long_group_interval(self) -> str:
        if self.long_interval:
            return self.long_interval
        ms = min(c.parse_duration(self.range(self.hourly_window)) * 1000 / 20, c.parse_duration(LONG_INTERVAL_MAX) * 1000)
        return _duration(max(int(ms), 1000))


def default_options(**changes: Any) -> Options:
    """The shipped options; ``windows`` (default config.RULE_WINDOWS, read now) also sets the ranges."""
    windows = tuple(changes.pop("windows", c.RULE_WINDOWS))
    ranges = {w: w for w in (*windows, c.ALERT_FAST_COLLAPSE_RANGE)}
    return Options(ranges=ranges, fors=dict(DEFAULT_FORS), thresholds=default_thresholds(), windows=windows, **changes)


def _minus(a: str, b: str) -> str:
    return f"{int(c.parse_duration(a) - c.parse_duration(b))}s"


# The long group's interval at most: its series are read instantly (alerts, panels), and an
# instant read looks back 5m at most, so a sample must come more often than that.
LONG_INTERVAL_MAX = "3m"


def _duration(ms: int) -> str:
    """A Prometheus duration for ``ms`` milliseconds: 3m, 90s, 1500ms."""
    if ms % 60000 == 0:
        return f"{ms // 60000}m"
    return f"{ms // 1000}s" if ms % 1000 == 0 else f"{ms}ms"


def levels(src: Source, o: Options) -> list[tuple[str, tuple[str, ...]]]:
    """Recording-rule levels, finest first: (name prefix, labels kept). Names are fixed;
    the fleet labels (cluster, and target in the sidecar variant) ride along at every level."""
    fleet = (o.cluster_label,) if o.cluster_label else ()
    tgt = (c.LABEL_TARGET,) if src is SIDECAR else ()
    ns, pod, model, engine = o.namespace_label, o.pod_label, c.LABEL_MODEL, c.LABEL_ENGINE
    return [
        ("namespace_pod_model_name_engine", (*fleet, ns, pod, *tgt, model, engine)),
        ("namespace_pod_model_name", (*fleet, ns, pod, *tgt, model)),
        ("namespace_model_name", (*fleet, ns, *tgt, model)),
        (model, (*fleet, *tgt, model)),
    ]


ENGINE = "namespace_pod_model_name_engine"
# Per engine only what an alert or a panel reads there: drafts and accepted tokens (the mean
# acceptance length, the engine panels and variable); the server level reads the other counters.
ENGINE_RATES = ("drafts", "accepted_tokens")
SERVER = "namespace_pod_model_name"
MODEL_LEVEL = "namespace_model_name"  # where the healthy reference is kept: a rollout does not reset it
K_LABEL = "num_speculative_tokens"  # k as a label, on the reference kept per k
K_LEVEL = f"{MODEL_LEVEL}_{K_LABEL}"
K_SERVER = f"{SERVER}_{K_LABEL}"
DAY = "1d"  # the day-long series' suffix: the best of o.hourly_window rates over o.day_range


def _sel(o: Options, extra: str = "") -> str:
    inner = ", ".join(x for x in (o.selector, extra) if x)
    return f"{{{inner}}}" if inner else ""


def _model_regex(profile: BaselineProfile, o: Options, index: int) -> str:
    """A profile's Python regex (re.search) as an anchored RE2 for =~, plus the served
    names that are aliases of a model it matches."""
    pattern = profile.model.pattern
    body = f"(?i:.*{pattern[4:]}.*)" if pattern.startswith("(?i)") else f".*(?:{pattern}).*"
    served = [re.escape(s) for s, model in o.aliases if profile.model.search(model)]
    return "|".join([body, *served]) + (alias_placeholder(index) if o.alias_placeholders else "")


def alias_placeholder(index: int) -> str:
    return f"__ALIASES_{index}__"


def baseline_expr(src: Source, o: Options, by_labels: Iterable[str]) -> str:
    if src is SIDECAR:
        return f"max by ({by(by_labels)}) ({m.name('baseline_mean_acceptance_length')}{_sel(o)})"
    # vllm-direct: the shipped profiles as rules, keyed by model regex and k; first match wins.
    k = name(c.ALERT_LEVEL, "num_speculative_tokens", "max")
    profiles = o.profiles or tuple(default_profiles())
    clauses = [
        f"label_replace({p.mean_acceptance_length:g} + 0 * ({k}{{{c.LABEL_MODEL}=~`{_model_regex(p, o, i)}`}} "
        f'== {p.k}), "profile", "{p.name}", "", "")'
        for i, p in enumerate(profiles)
    ]
    return f"\n  or on({by(by_labels)}) ".join(clauses)


def base_window(o: Options) -> str:
    """The shortest recorded window: the only one that reads the raw counters."""
    return min(o.windows, key=lambda w: c.parse_duration(o.range(w)))


def long_windows(o: Options) -> tuple[str, ...]:
    """The windows recorded in the long group (at Options.long_group_interval): as long as the
    hourly window or longer, and not the detection or trend window, which alerts judge every
    evaluation."""
    hourly = c.parse_duration(o.range(o.hourly_window))
    return tuple(
        w
        for w in o.windows
        if w not in (base_window(o), o.detection_window, o.trend_window) and c.parse_duration(o.range(w)) >= hourly
    )


def recording_rules(src: Source, o: Options) -> tuple[list[Rule], list[Rule]]:
    """(the evaluation-interval group, the long group). Fleet scale (docs/scale.md): only the
    shortest window reads the raw counters; a longer window w is the mean of the shortest
    window's recorded rates over w minus that window (so it spans w), taken per server (and
    position) after the engines are summed, and per engine nothing but the shortest window is
    kept. The hourly window, the day-long series and the day's range of k are recorded in the
    long group, so the `[1d]` reads see a sample every few minutes, not every evaluation."""
    fast: list[Rule] = []
    slow: list[Rule] = []

    def record(to: list[Rule], record: str, expr: str) -> None:
        to.append({"record": record, "expr": expr})

    sel = _sel(o)
    counters = {
        "drafts": src.drafts,
        "draft_tokens": src.draft_tokens,
        "accepted_tokens": src.accepted,
        "generation_tokens": src.generation,
    }
    lv = levels(src, o)
    base, long = base_window(o), long_windows(o)
    for w in o.windows:
        to = slow if w in long else fast
        rng = o.range(w)
        span = _minus(rng, o.range(base)) if w != base else ""
        if span and c.parse_duration(span) <= 0:
            span = ""
        # A longer window at every level is the mean of that level's own shortest-window rates:
        # a namespace reads its few series, not every server's (docs/scale.md).
        from_base = bool(span)
        finer: str | None = None  # the level just recorded, which the next one sums
        for level, labels in lv:
            if from_base and level == ENGINE:
                continue  # per engine: the shortest window only (the engine panel averages it)
            for metric, counter in counters.items():
                if level == ENGINE and metric not in ENGINE_RATES:
                    continue
                if from_base:
                    record(to, name(level, metric, f"rate{w}"), f"avg_over_time({name(level, metric, f'rate{base}')}[{span}])")
                    continue
                if finer is None or (finer == ENGINE and metric not in ENGINE_RATES):
                    source = f"rate({counter}{sel}[{rng}])"
                else:
                    source = name(finer, metric, f"rate{w}")
                record(to, name(level, metric, f"rate{w}"), f"sum by ({by(labels)}) ({source})")
            if level != ENGINE:
                # Positions are not kept per engine: the first level below reads the counters.
                pos = name(level, "position_accepted_tokens", f"rate{w}")
                if from_base:
                    record(to, pos, f"avg_over_time({name(level, 'position_accepted_tokens', f'rate{base}')}[{span}])")
                else:
                    source = (
                        f"rate({src.per_pos}{sel}[{rng}])"
                        if finer is None or finer == ENGINE
                        else name(finer, "position_accepted_tokens", f"rate{w}")
                    )
                    record(to, pos, f"sum by ({by(labels)}, position) ({source})")
            drafts = name(level, "drafts", f"rate{w}")
            accepted = name(level, "accepted_tokens", f"rate{w}")
            if level == ENGINE:
                # No ratio per engine: the engine alerts divide the two rates themselves (one join
                # each, not a recorded ratio read three times: docs/scale.md).
                finer = level
                continue
            # Dividing by "(x > 0)" leaves no sample, not NaN, when there were no drafts.
            record(to, name(level, "mean_acceptance_length", f"ratio_rate{w}"), f"1 + {accepted} / ({drafts} > 0)")
            record(
                to,
                name(level, "acceptance_ratio", f"ratio_rate{w}"),
                f"{accepted} / ({name(level, 'draft_tokens', f'rate{w}')} > 0)",
            )
            record(
                to,
                name(level, "position_acceptance_ratio", f"ratio_rate{w}"),
                f"{name(level, 'position_accepted_tokens', f'rate{w}')} / ignoring(position) group_left() ({drafts} > 0)",
            )
            record(
                to,
                name(level, "effective_draft_length", f"ratio_rate{w}"),
                f"{name(level, 'draft_tokens', f'rate{w}')} / ({drafts} > 0)",
            )
            record(
                to,
                name(level, "draft_token_share", f"ratio_rate{w}"),
                f"{accepted} / ({name(level, 'generation_tokens', f'rate{w}')} > 0)",
            )
            if level != SERVER:
                # Only where the dashboards read them (a clause per position each): not per server.
                record(to, name(level, "position_conditional_acceptance_ratio", f"ratio_rate{w}"), _conditional(level, w))
                record(to, name(level, "acceptance_count_ratio", f"ratio_rate{w}"), _count_distribution(level, w))
            finer = level

    # k and the baseline, per server (the alert level).
    level, labels = c.ALERT_LEVEL, dict(lv)[c.ALERT_LEVEL]
    if src is SIDECAR:
        k_expr = f"max by ({by(labels)}) ({m.name('num_speculative_tokens')}{sel})"
    else:
        # k = the number of distinct positions an engine reports (grouped first: a pod scraped by
        # two jobs has each position twice).
        eng = f"{by(labels)}, instance, {c.LABEL_ENGINE}"
        k_expr = f"max by ({by(labels)}) (\n  count by ({eng}) (group by ({eng}, position) ({src.per_pos}{sel}))\n)"
    # k and the baseline change with a restart at most: recorded in the long group, they cost a
    # sixth (vLLM-direct counts every engine's position series) and are up to its interval late.
    k = name(level, "num_speculative_tokens", "max")
    record(slow, k, k_expr)
    record(slow, name(level, "baseline_mean_acceptance_length", "max"), baseline_expr(src, o, labels))
    # The healthy reference, kept per namespace and model (MODEL_LEVEL), never per pod: a rolling
    # update replaces every pod, and a broken rollout's new pods must still be compared with
    # their predecessors' history. Each is the best hour of the day (max_over_time of the hourly
    # rates, recorded here every few minutes): a fault only lowers hours, so the reference stays
    # healthy for as long as a healthy hour is within the day.
    hw, ml, mlabels = o.hourly_window, MODEL_LEVEL, dict(lv)[MODEL_LEVEL]
    # Each server's k as a label, so that the reference is kept per k: AL moves with k, and a k
    # change starts a new history instead of blinding the comparison for a day. A server whose k
    # changed within the hour adds nothing to that hour.
    k_label = name(K_SERVER, "num_speculative_tokens", "count_values")
    record(slow, k_label, f'count_values by ({by(labels)}) ("{K_LABEL}", {k})')
    # Only full hours count (k recorded at nine tenths of this group's evaluations over the hour:
    # a younger pod's "hour" is shorter, a warm-up's), at production traffic.
    rng = o.range(hw)
    full = int(0.9 * c.parse_duration(rng) / c.parse_duration(o.long_group_interval()))
    young = f"changes({k}[{rng}]) > 0 or count_over_time({k}[{rng}]) < {full}"
    stable = f"on({by(labels)}) group_left({K_LABEL}) ({k_label} unless on({by(labels)}) ({young}))"
    hourly = {
        m_: f"sum by ({by(mlabels)}, {K_LABEL}) ({name(level, m_, f'rate{hw}')} * {stable})"
        for m_ in ("accepted_tokens", "drafts")
    }
    at_k = name(K_LEVEL, "mean_acceptance_length", f"ratio_rate{hw}")
    floor = o.thresholds["reference_min_drafts_per_second"]
    record(slow, at_k, f"1 + {hourly['accepted_tokens']}\n  / ({hourly['drafts']} >= {floor})")
    record(slow, name(K_LEVEL, "mean_acceptance_length", f"max_over_time{DAY}"), f"max_over_time({at_k}[{o.day_range}])")
    # Whether the model was drafting (NotDrafting), its position 0 healthy (FirstPositionAcceptanceLow)
    # and its chain past position 0 healthy (DraftChainBroken) within the day: position 0 and the
    # conditional acceptance of position 1 do not depend on k.
    record(slow, name(ml, "drafts", f"max_over_time{DAY}"), f"max_over_time({name(ml, 'drafts', f'rate{hw}')}[{o.day_range}])")
    p0 = name(ml, "position_acceptance_ratio", f"ratio_rate{hw}")
    record(
        slow, name(ml, "position_acceptance_ratio", f"max_over_time{DAY}"), f'max_over_time({p0}{{position="0"}}[{o.day_range}])'
    )
    # Position 1's conditional over the servers that draft a position 1 only: a k=1 server beside
    # k>=2 ones adds position-0 acceptances with no position 1, which would dilute the ratio.
    pos = name(SERVER, "position_accepted_tokens", f"rate{hw}")
    chain = name(ml, "position1_conditional_acceptance_ratio", f"ratio_rate{hw}")
    record(
        slow,
        chain,
        f'sum by ({by(mlabels)}) ({pos}{{position="1"}})\n  / (sum by ({by(mlabels)}) ({pos}{{position="0"}} '
        f'and on({by(labels)}) {pos}{{position="1"}}) > 0)',
    )
    record(
        slow, name(ml, "position1_conditional_acceptance_ratio", f"max_over_time{DAY}"), f"max_over_time({chain}[{o.day_range}])"
    )
    if src is DIRECT:
        # vLLM's per-request histogram over the request-extremes window (the sidecar has gauges).
        w, rng = o.request_extremes_window, o.range(o.request_extremes_window)
        for metric, suffix, edge in (
            ("requests_finished", "_count", ""),
            ("requests_acceptance_le_low", "_bucket", f"{c.REQUEST_ACCEPTANCE_LOW:g}"),
            ("requests_acceptance_le_high", "_bucket", f"{c.REQUEST_ACCEPTANCE_HIGH:g}"),
        ):
            bsel = _sel(o, f'le="{edge}"') if edge else sel
            # Both names vLLM may use (config.VLLM_V1_REQUEST_ACCEPTANCE_NAMES); the first wins when both are there.
            either = " or ".join(f"rate({n}{suffix}{bsel}[{rng}])" for n in c.VLLM_V1_REQUEST_ACCEPTANCE_NAMES)
            record(slow, name(level, metric, f"rate{w}"), f"sum by ({by(labels)}) ({either})")
    return fast, slow


def _conditional(level: str, w: str) -> str:
    """per_pos[i] / per_pos[i-1], with per_pos[-1] = drafts: relabel i-1 as i so the two sides
    match, one clause per position (one rule, so the record name is not duplicated)."""
    pos, drafts = name(level, "position_accepted_tokens", f"rate{w}"), name(level, "drafts", f"rate{w}")
    clauses = [f'{pos}{{position="0"}} / ignoring(position) group_left() ({drafts} > 0)']
    clauses += [
        f'{pos}{{position="{i}"}} / label_replace({pos}{{position="{i - 1}"}} > 0, "position", "{i}", "position", ".*")'
        for i in range(1, c.MAX_SPECULATIVE_TOKENS)
    ]
    return "\n  or ".join(clauses)


def _count_distribution(level: str, w: str) -> str:
    """The acceptance-count distribution: drafts that accepted exactly j tokens, as a share,
    = survival[j-1] - survival[j] (survival[-1] = 1, survival[k] = 0: a missing position counts
    as 0). The position label goes, `accepted` = j comes."""
    surv = name(level, "position_acceptance_ratio", f"ratio_rate{w}")
    clauses = [f'1 - {surv}{{position="0"}}']
    clauses += [
        f'{surv}{{position="{j - 1}"}} - ignoring(position) ({surv}{{position="{j}"}} '
        f'or ignoring(position) 0 * {surv}{{position="{j - 1}"}})'
        for j in range(1, c.MAX_SPECULATIVE_TOKENS + 1)
    ]
    clauses = [
        f'label_replace(label_replace({x}, "accepted", "{j}", "", ""), "position", "", "", "")' for j, x in enumerate(clauses)
    ]
    return "\n  or ".join(clauses)


# --- The alert registry: ONE record per alert. Its name, severity, `for`, the thresholds it reads
# (their meaning: THRESHOLD_MEANINGS), its expression builder and its annotations (summary, the
# builder's description, likely cause) generate the rules, the Helm schema's alert names, the
# runbook's index and the Alertmanager example's checks (tests/test_registry.py). ---
def label(key: str) -> str:
    """An alert annotation's reference to one of the alert's labels."""
    return f"{{{{ $labels.{key} }}}}"


def where(src: Source, o: Options) -> str:
    """'<model> on <namespace>/<pod>' in every description, with the labels the options name.
    Outside Kubernetes (a static scrape) there is no pod: the sidecar variant names the target
    instead, the vLLM-direct one the model alone, never an empty 'on /'."""
    ns, pod = f"$labels.{o.namespace_label}", f"$labels.{o.pod_label}"
    at = f"{{{{ if {ns} }}}}{label(o.namespace_label)}/{{{{ end }}}}{label(o.pod_label)}"
    other = f"{{{{ else }}}} (target {label(c.LABEL_TARGET)})" if src is SIDECAR else ""
    return f"{label(c.LABEL_MODEL)}{{{{ if {pod} }}}} on {at}{other}{{{{ end }}}}"


ENGINE_LABEL, POSITION_LABEL = label(c.LABEL_ENGINE), label(c.LABEL_POSITION)
TARGET_AT_INSTANCE = f"Target {label(c.LABEL_TARGET)} of the exporter at {label('instance')}"


@dataclass(frozen=True)
class X:
    """What every alert expression is built from, per variant and options."""

    src: Source
    o: Options
    lv: dict[str, tuple[str, ...]]
    t: dict[str, str]
    on: str
    on_model: str  # the model's labels: where the healthy reference is kept
    floor: str
    w: str
    al5: str
    d5: str
    egain: str  # an engine's speculative gain (AL - 1) over w, only with real traffic
    collapse: str
    k: str
    where: str  # the server an alert names, from o's labels
    dtr: str  # drafts over the trend window


def _context(src: Source, o: Options) -> X:
    L, lv = c.ALERT_LEVEL, dict(levels(src, o))
    t, w, tr = o.thresholds, o.detection_window, o.trend_window
    return X(
        src=src,
        o=o,
        lv=lv,
        t=t,
        on=f"on({by(lv[L])})",
        on_model=f"on({by(lv[MODEL_LEVEL])})",
        floor=t["min_drafts_per_second"],
        w=w,
        al5=name(L, "mean_acceptance_length", f"ratio_rate{w}"),
        d5=name(L, "drafts", f"rate{w}"),
        # No ratio is recorded per engine: the engine alerts divide the two rates (docs/scale.md).
        egain=f"{name(ENGINE, 'accepted_tokens', f'rate{w}')} / ({name(ENGINE, 'drafts', f'rate{w}')} > {t['min_drafts_per_second']})",
        collapse=f"1 + {t['collapse_margin']}",
        k=name(L, "num_speculative_tokens", "max"),
        where=where(src, o),
        dtr=name(L, "drafts", f"rate{tr}"),
    )


def _collapsed(x: X) -> tuple[str, str]:
    return (
        f"{x.al5} < {x.collapse}\nand {x.on} {x.d5} > {x.floor}",
        f'Mean acceptance length of {x.where} is {{{{ $value | printf "%.3f" }}}} over {x.w} (1.0 means no draft '
        f"token is accepted) with real traffic. Decoding still works but runs at non-speculative speed: "
        f"suspect the draft head (quantised conversion, loader) or draft sampling.",
    )


def _collapsed_fast(x: X) -> tuple[str, str]:
    # The fast page: at production traffic a collapse is certain within a couple of minutes
    # (config.ALERT_FAST_COLLAPSE_*: the binomial bound); below the floor the slow path pages.
    fr = x.o.range(c.ALERT_FAST_COLLAPSE_RANGE)
    fd = f"sum by ({by(x.lv[c.ALERT_LEVEL])}) (rate({x.src.drafts}{_sel(x.o)}[{fr}]))"
    fa = f"sum by ({by(x.lv[c.ALERT_LEVEL])}) (rate({x.src.accepted}{_sel(x.o)}[{fr}]))"
    return (
        f"1 + {fa}\n  / ({fd} >= {x.t['fast_collapse_min_drafts_per_second']})\n< {x.collapse}",
        f'Mean acceptance length of {x.where} is {{{{ $value | printf "%.3f" }}}} over the last '
        f"{c.ALERT_FAST_COLLAPSE_RANGE} with at least {x.t['fast_collapse_min_drafts_per_second']} drafts/s: "
        f"enough drafts to make it certain. Decoding runs at non-speculative speed: suspect the draft head "
        f"(quantised conversion, loader) or draft sampling.",
    )


def _engine_collapsed(x: X) -> tuple[str, str]:
    return (
        f"1 + {x.egain} < {x.collapse}\nunless {x.on} {x.al5} < {x.collapse}",
        f"Engine {ENGINE_LABEL} of {x.where} has a mean acceptance length of "
        f'{{{{ $value | printf "%.3f" }}}} over {x.w} with real traffic, while the server as a whole has not '
        f"collapsed: one data-parallel rank decodes at non-speculative speed (its draft head failed to load or "
        f"is corrupt on that rank).",
    )


def _engine_lagging(x: X) -> tuple[str, str]:
    f = x.t["engine_lag_fraction"]
    return (
        # Not a collapsed engine (EngineCollapsed's case).
        f"({x.egain} >= {x.t['collapse_margin']})\n  < {x.on} group_left() {f} * ({x.al5} - 1)",
        f"The speculative gain (mean acceptance length - 1) of engine {ENGINE_LABEL} of {x.where} is "
        f'{{{{ $value | printf "%.3f" }}}} over {x.w}, below {f} x the whole server\'s. '
        f"Engines of one server share traffic and weights and differ by a few percent: this rank is broken.",
    )


def _position0_floor(x: X) -> str:
    """Position 0's floor per server: where a profile matches, config.Detection.position0_floor_under
    (degraded_fraction x (profile AL - 1) / k, at most position0_floor); without one,
    position0_floor once the model's position 0 reached it within the day (in any of its pods,
    so a rollout keeps it). A steady weak drafter with neither (vLLM's Qwen3-VL EAGLE3
    reference: 0.29) has not fallen."""
    L, floor = c.ALERT_LEVEL, x.t["position0_floor"]
    baseline = name(L, "baseline_mean_acceptance_length", "max")
    best = name(MODEL_LEVEL, "position_acceptance_ratio", f"max_over_time{DAY}")  # position 0's best hour
    return (
        f"clamp_max({x.t['degraded_fraction']} * ({baseline} - 1) / {x.on} {x.k}, {floor})\n"
        f"  or {x.on} (0 * {x.d5} + {floor} and {x.on_model} max without(position) ({best}) >= {floor})"
    )


def _position(x: X, i: int) -> str:
    return f'max without(position) ({name(c.ALERT_LEVEL, "position_accepted_tokens", f"rate{x.w}")}{{position="{i}"}})'


def _position0_low(x: X) -> tuple[str, str]:
    floor = x.t["position0_floor"]
    return (
        f"{_position(x, 0)} / {x.on} ({x.d5} > {x.floor})\n  < {x.on} (\n  {_position0_floor(x)}\n)",
        f"Position 0 of {x.where} was accepted in {{{{ $value | humanizePercentage }}}} of drafts over {x.w} "
        f"(healthy MTP: 66 % or more, whatever k): below what its profile allows (at most {floor}), or below "
        f"{floor} after the model was at {floor} or more within {x.o.day_range}. Either a broken draft path (draft "
        f"sampling, missing draft context, a partly broken head), or synthetic random-token load such as a "
        f"benchmark, which gives the same counters.",
    )


def _chain_broken(x: X) -> tuple[str, str]:
    # Position 1's conditional acceptance (of the drafts whose position 0 was accepted), with
    # position 0 healthy: a chain that breaks after its first token passes every AL-based
    # alert when k is small (SGLang's V4 MTP k=3 bug: AL 2.17 against a profile floor of 2.12).
    # Against a profile, or after the model's chain was healthy within the day.
    floor, cfloor = x.t["position0_floor"], x.t["chain_conditional_floor"]
    baseline = name(c.ALERT_LEVEL, "baseline_mean_acceptance_length", "max")
    best = name(MODEL_LEVEL, "position1_conditional_acceptance_ratio", f"max_over_time{DAY}")
    p0 = _position(x, 0)
    return (
        f"{_position(x, 1)} / {x.on} ({p0} > 0) < {cfloor}\n"
        f"and {x.on} {p0} / {x.on} ({x.d5} > {x.floor}) >= {floor}\n"
        f"and {x.on_model} (max by ({by(x.lv[MODEL_LEVEL])}) ({baseline}) or {best} >= 2 * {cfloor})",
        f"Of the drafts of {x.where} whose position 0 was accepted, position 1 was accepted in "
        f"{{{{ $value | humanizePercentage }}}} over {x.w} (healthy: 41 % or more), while position 0 is healthy: "
        f"the draft chain breaks after its first token.",
    )


def _below_baseline(x: X) -> tuple[str, str]:
    baseline = name(c.ALERT_LEVEL, "baseline_mean_acceptance_length", "max")
    f = x.t["degraded_fraction"]
    return (
        f"{x.al5}\n  < {x.on} 1 + {f} * ({baseline} - 1)\nand {x.on} {x.d5} > {x.floor}",
        f'Mean acceptance length of {x.where} is {{{{ $value | printf "%.3f" }}}} over {x.w}, below '
        f"1 + {f} x (baseline - 1) for its baseline profile "
        f"({baseline}).",
    )


def _dropped(x: X) -> tuple[str, str]:
    # Against the model's best hour of the day at the server's own k (kept per model, so a
    # rollout does not reset it, and per k, so a k change starts a new history): a fall of more
    # than drop_fraction of the gain within minutes, whether it came at once or slowly.
    ref = name(K_LEVEL, "mean_acceptance_length", f"max_over_time{DAY}")
    k_label = name(K_SERVER, "num_speculative_tokens", "count_values")
    keep = f"(1 - {x.t['drop_fraction']})"
    return (
        f"({x.al5} - 1)\n  < {x.on} {keep} * ({ref} + on({by(x.lv[MODEL_LEVEL])}, {K_LABEL}) group_right() (0 * {k_label}) - 1)\n"
        f"and {x.on} {x.d5} > {x.floor}",
        f'The speculative gain (mean acceptance length - 1) of {x.where} is {{{{ $value | printf "%.3f" }}}} '
        f"over {x.w}, more than {x.t['drop_fraction']} below the model's best hour of the last "
        f"{x.o.day_range} at the same k.",
    )


def _not_drafting(x: X) -> tuple[str, str]:
    L = c.ALERT_LEVEL
    g5 = name(L, "generation_tokens", f"rate{x.w}")
    return (
        f"{g5} > {x.t['min_generation_tokens_per_second']}\nunless {x.on} {x.d5} > 0\n"
        f"and {x.on_model} {name(MODEL_LEVEL, 'drafts', f'max_over_time{DAY}')} > {x.floor}",
        f"{x.where} generates {{{{ $value | humanize }}}} tokens/s with no drafts over {x.w}, although it was "
        f"drafting within the last day: speculative decoding is off or silently disabled.",
    )


_TARGET_DOWN = "VLLMSpecDecodeTargetDown"  # its builder reads its own `for`


def _target_down(x: X) -> tuple[str, str]:
    o = x.o
    fail = "|".join(c.TARGET_MISCONFIGURED_RESULTS)
    unreachable = o.unreachable_range or _minus(c.TARGET_UNREACHABLE_AFTER, o.fors[_TARGET_DOWN])
    up = m.name("up")
    return (
        f"(\n  {up}{_sel(o)} == 0\n  and ignoring(result) "
        f"increase({m.sample('exporter_polls')}{_sel(o, f'result=~{chr(34)}{fail}{chr(34)}')}[5m]) > 0\n)\n"
        f"or max_over_time({up}{_sel(o)}[{unreachable}]) == 0",
        f"{TARGET_AT_INSTANCE} either answers with something "
        "that is not vLLM's metrics (an HTTP error, an auth failure, a body that is not Prometheus text: a "
        f"misconfiguration), or has been unreachable for {c.TARGET_UNREACHABLE_AFTER}, longer than any "
        f"weight reload. See {m.sample('exporter_polls')} by result and the sidecar's log.",
    )


def _target_inconsistent(x: X) -> tuple[str, str]:
    w, share = c.TARGET_INCONSISTENT_WINDOW, c.TARGET_INCONSISTENT_SHARE
    ok = f"increase({m.sample('exporter_polls')}{_sel(x.o, 'result=' + chr(34) + 'success' + chr(34))}[{w}])"
    return (
        f"increase({m.sample('exporter_inconsistent_polls')}{_sel(x.o)}[{w}])\n"
        f"  >= ignoring(result) {share} * {ok}\nand ignoring(result) {ok} > 0",
        f"{TARGET_AT_INSTANCE} gave {{{{ $value | humanize }}}} "
        f"inconsistent engine polls in {w} (counters that went down without a restart, drafts faster than "
        f"any engine, two servers behind one URL): they are not counted, so its figures and alerts are blind. "
        "See the sidecar's log (target_warning) for the reason.",
    )


def _exporter_absent(x: X) -> tuple[str, str]:
    return (
        f"absent({m.name('exporter_build_info')}{_sel(x.o)})",
        f"Prometheus has no {m.name('exporter_build_info')} series: the sidecar is not running, not "
        "scraped, or its series are dropped.",
    )


def _invariant(x: X) -> tuple[str, str]:
    if x.src is SIDECAR:
        return (
            f"increase({m.sample('exporter_invariant_violations')}{_sel(x.o)}[10m]) > 0",
            f"The exporter at {label('instance')} (target {label(c.LABEL_TARGET)}) saw {{{{ $value | humanize }}}} "
            "invariant violations in 10m: a partial scrape, a parse problem or a broken producer. The "
            "figures of the affected engine are suspect.",
        )
    eb = by(x.lv[ENGINE])
    rng, sel, src = x.o.range(x.w), _sel(x.o), x.src
    acc = f"sum by ({eb}) (rate({src.accepted}{sel}[{rng}]))"
    return (
        f"{acc}\n  > on({eb}) sum by ({eb}) (rate({src.draft_tokens}{sel}[{rng}]))\n"
        f"or\nabs({acc} - on({eb}) sum by ({eb}) (rate({src.per_pos}{sel}[{rng}])))\n"
        f"  > on({eb}) 0.001 * {acc} + 0.001",
        f"Engine {ENGINE_LABEL} of {x.where} reports accepted tokens that exceed its draft tokens "
        f"or differ from the sum of its per-position counts: a partial scrape or a broken producer.",
    )


def _no_baseline(x: X) -> tuple[str, str]:
    info, unmatched = m.name("model_info"), 'profile_matched_by="none"'
    return (
        f"max by ({by(x.lv[c.ALERT_LEVEL])}) ({info}{_sel(x.o, unmatched)})\nand {x.on} {x.d5} > {x.floor}",
        f"{x.where} drafts with no baseline profile: none matches its served name, the model vLLM's /v1/models "
        f"names as its root, or an alias. {NO_BASELINE[:1].upper()}{NO_BASELINE[1:]} ({info} shows the root).",
    )


def _wasted(x: X) -> tuple[str, str]:
    hw = x.o.hourly_window
    pos1h = name(c.ALERT_LEVEL, "position_acceptance_ratio", f"ratio_rate{hw}")
    clauses = [
        f'({pos1h}{{position="{i}"}} < {x.t["wasted_position_ratio"]} and {x.on} {x.k} == {i + 1})'
        for i in range(1, c.MAX_SPECULATIVE_TOKENS)
    ]
    return (
        "(\n  " + "\n  or ".join(clauses) + f"\n)\nand {x.on} {name(c.ALERT_LEVEL, 'drafts', f'rate{hw}')} > {x.floor}",
        f"The last draft position (position {POSITION_LABEL}) of {x.where} was accepted in "
        f"{{{{ $value | humanizePercentage }}}} of drafts over {hw}. Each draft still pays for it; consider "
        f"num_speculative_tokens = {POSITION_LABEL}.",
    )


def _suspicious(x: X) -> tuple[str, str]:
    rate30 = name(c.ALERT_LEVEL, "acceptance_ratio", f"ratio_rate{x.o.trend_window}")
    return (
        f"{rate30} > {x.t['suspicious_acceptance_ratio']}\nand {x.on} {x.dtr} > {x.floor}",
        f"Draft acceptance of {x.where} is {{{{ $value | humanizePercentage }}}} over {x.o.trend_window}. Sustained acceptance "
        f"this high goes with repetition loops (draft and target agree on repeating text).",
    )


def _request_extremes(x: X) -> tuple[str, str]:
    """vLLM's per-request histogram (PR #44487): vLLM-direct reads its buckets at le="0.05" and
    le="0.98" (no figure without those edges); the sidecar's gauges are read at its nearest edge."""
    lb, w = by(x.lv[c.ALERT_LEVEL]), x.o.request_extremes_window
    share, least = c.ALERT_REQUEST_EXTREMES_SHARE, c.ALERT_REQUEST_EXTREMES_MIN_REQUESTS
    low, high = f"{c.REQUEST_ACCEPTANCE_LOW:g}", f"{c.REQUEST_ACCEPTANCE_HIGH:g}"
    if x.src is SIDECAR:
        sel = _sel(x.o, f'{c.LABEL_WINDOW}="{w}"')
        below, above = (f"max by ({lb}) ({m.name(f'request_acceptance_{side}_ratio')}{sel})" for side in ("below", "above"))
        finished = f"max by ({lb}) ({m.name('window_requests')}{sel})"
    else:
        # Recorded in the long group (recording_rules): the rates over the window, per server.
        L = c.ALERT_LEVEL
        count, le_low, le_high = (
            name(L, n, f"rate{w}") for n in ("requests_finished", "requests_acceptance_le_low", "requests_acceptance_le_high")
        )
        finished = f"{count} * {c.parse_duration(x.o.range(w)):g}"
        below, above = f"{le_low} / on({lb}) {count}", f"1 - {le_high} / on({lb}) {count}"
    return (
        f"(\n  {below} > {share}\nor\n  {above} > {share}\n)\nand on({lb}) {finished} >= {least}",
        f"Over {w}, {{{{ $value | humanizePercentage }}}} of the finished requests of {x.where} had a draft "
        f"acceptance at or below {low} or above {high} (vLLM's per-request histogram). Very low goes with garbled output, "
        f"very high with repetition loops; look at the dashboard's extremes panel for which end.",
    )


# Each threshold the alerts read, and what it means (the Helm chart's prometheusRule.thresholds).
THRESHOLD_MEANINGS = {
    "collapse_margin": "collapsed: mean acceptance length below 1 + this",
    "position0_floor": "position 0 accepted in fewer than this share of drafts",
    "degraded_fraction": "speculative gain below this fraction of the baseline profile's",
    "engine_lag_fraction": "an engine's gain below this fraction of its server's",
    "min_drafts_per_second": "traffic floor: drafts/s below which nothing is judged",
    "drop_fraction": "gain over 5m more than this fraction below the model's best hour of the day at the same k",
    "chain_conditional_floor": "position 1 accepted in fewer than this share of the drafts whose position 0 was",
    "reference_min_drafts_per_second": "the drafts/s an hour needs to become the model's healthy reference",
    "min_generation_tokens_per_second": "generation tokens/s above which no drafts means not drafting",
    "wasted_position_ratio": "the last position accepted in fewer than this share of drafts",
    "suspicious_acceptance_ratio": "acceptance above this share",
    "fast_collapse_min_drafts_per_second": "the fast page's traffic floor (drafts/s)",
}

# The likely cause each alert's own expression points at (the broken cases' fingerprints, as far as
# PromQL sees them): a hint, never a certainty; where two causes fit, both. The sidecar's
# vllm_specdec_diagnosis_info names the cause from per-engine, restart and k evidence too.
_GARBAGE = (
    "the draft head produces garbage (a broken quantised conversion or loader): AL below 1.1 means "
    "position 0 was accepted in under 10 % of drafts"
)
_CONFIG = f"{_GARBAGE}; or a configuration change, if it began with a restart or a new k."
_RANK = "one rank: its siblings on the same server are healthy (a rank-specific load, device or node)."


@dataclass(frozen=True)
class Alert:
    name: str
    severity: str  # critical pages, warning opens a ticket, info goes nowhere (alertmanager.example.yaml)
    for_: str
    thresholds: tuple[str, ...]  # THRESHOLD_MEANINGS keys the expression reads
    summary: str
    build: Callable[[X], tuple[str, str]]  # -> (expr, description)
    likely_cause: str | None = None
    sidecar_only: bool = False  # needs the sidecar's own series (profiles as gauges, up, build info)
    # Judged at the long group's interval (docs/scale.md): an alert that does not page and reads
    # every engine's series, which would otherwise cost as much as a raw counter's 5m rates.
    slow: bool = False


ALERTS: tuple[Alert, ...] = (
    Alert(
        "VLLMSpecDecodeAcceptanceCollapsed",
        "critical",
        c.ALERT_COLLAPSE_FOR,
        ("collapse_margin", "min_drafts_per_second"),
        "Speculative-decoding acceptance has collapsed: draft tokens are almost never accepted.",
        _collapsed,
        _CONFIG,
    ),
    Alert(
        "VLLMSpecDecodeAcceptanceCollapsedFast",
        "critical",
        c.ALERT_FAST_COLLAPSE_FOR,
        ("collapse_margin", "fast_collapse_min_drafts_per_second"),
        "Speculative-decoding acceptance has collapsed at production traffic: draft tokens are almost never accepted.",
        _collapsed_fast,
        _CONFIG,
    ),
    Alert(
        "VLLMSpecDecodeEngineCollapsed",
        "critical",
        c.ALERT_ENGINE_COLLAPSE_FOR,
        ("collapse_margin", "min_drafts_per_second"),
        "One engine's speculative decoding has collapsed while its siblings are healthy.",
        _engine_collapsed,
        _RANK,
    ),
    Alert(
        "VLLMSpecDecodeEngineLagging",
        "warning",
        c.ALERT_ENGINE_LAG_FOR,
        ("engine_lag_fraction", "collapse_margin", "min_drafts_per_second"),
        "One engine's speculative gain lags far behind its siblings'.",
        _engine_lagging,
        _RANK,
        slow=True,
    ),
    Alert(
        "VLLMSpecDecodeFirstPositionAcceptanceLow",
        "warning",
        c.ALERT_POSITION0_FOR,
        ("position0_floor", "min_drafts_per_second"),
        "The first draft position is rarely accepted: a broken draft path, or synthetic load.",
        _position0_low,
        "a partly broken draft head (conversion, loader, draft sampling or context) if it has been low since a deployment; a workload shift (synthetic random-token load, temperature, traffic mix) if it fell without one: the counters alone cannot tell them apart.",
    ),
    Alert(
        "VLLMSpecDecodeAcceptanceBelowBaseline",
        "warning",
        c.ALERT_BELOW_BASELINE_FOR,
        ("degraded_fraction", "min_drafts_per_second"),
        "Speculative-decoding acceptance is below the baseline profile's expectation.",
        _below_baseline,
        "a partly broken draft head if it has been below its profile since a deployment; a workload shift (traffic mix, temperature, synthetic load) if it fell without one; if position 0 is healthy, the chain breaks after it.",
    ),
    Alert(
        "VLLMSpecDecodeDraftChainBroken",
        "warning",
        c.ALERT_CHAIN_BROKEN_FOR,
        ("chain_conditional_floor", "position0_floor", "min_drafts_per_second"),
        "The draft chain breaks after its first token: position 1 is rarely accepted while position 0 is healthy.",
        _chain_broken,
        "the chain breaks after position 0: a mis-wired or unloaded later MTP layer, a backend bug in how later "
        "draft positions are built, or k beyond what the draft was trained for.",
    ),
    Alert(
        "VLLMSpecDecodeAcceptanceDropped",
        "warning",
        c.ALERT_DROPPED_FOR,
        ("drop_fraction", "min_drafts_per_second"),
        "Speculative-decoding acceptance fell sharply against the model's own best hour of the day.",
        _dropped,
        "a configuration change (a new artifact, version or rollout at the same k) if it began with one; "
        "a head degrading in service, or a workload shift beyond what workload alone explains, if not.",
    ),
    Alert(
        "VLLMSpecDecodeNotDrafting",
        "warning",
        c.ALERT_NOT_DRAFTING_FOR,
        ("min_generation_tokens_per_second", "min_drafts_per_second"),
        "vLLM generates tokens but speculative decoding has stopped drafting.",
        _not_drafting,
    ),
    Alert(
        _TARGET_DOWN,
        "warning",
        c.ALERT_TARGET_DOWN_FOR,
        (),
        "The vllm-specdec-exporter sidecar cannot read vLLM's /metrics.",
        _target_down,
        sidecar_only=True,
    ),
    Alert(
        "VLLMSpecDecodeTargetInconsistent",
        "warning",
        c.ALERT_TARGET_INCONSISTENT_FOR,
        (),
        "Most polls of a target are inconsistent: its figures are not counted.",
        _target_inconsistent,
        "two servers behind one URL (scrape the pods, not a Service), a producer whose counters go down "
        "without a restart, or an engine faster than MAX_DRAFTS_PER_SECOND.",
        sidecar_only=True,
    ),
    Alert(
        "VLLMSpecDecodeExporterAbsent",
        "warning",
        c.ALERT_EXPORTER_ABSENT_FOR,
        (),
        "No vllm-specdec-exporter series at all: MTP acceptance is not monitored.",
        _exporter_absent,
        sidecar_only=True,
    ),
    Alert(
        "VLLMSpecDecodeCounterInvariantViolated",
        "info",
        c.ALERT_INVARIANT_FOR,
        (),
        "vLLM's speculative-decoding counters break their own invariants.",
        _invariant,
        slow=True,
    ),
    Alert(
        "VLLMSpecDecodeNoBaseline",
        "info",
        c.ALERT_NO_BASELINE_FOR,
        ("min_drafts_per_second",),
        "A model drafts with no baseline profile: a head partly broken from the start goes unseen.",
        _no_baseline,
        sidecar_only=True,
    ),
    Alert(
        "VLLMSpecDecodeSpeculativeTokensWasted",
        "info",
        c.ALERT_WASTED_FOR,
        ("wasted_position_ratio", "min_drafts_per_second"),
        "The last speculative position is almost never accepted: a smaller k would save draft compute.",
        _wasted,
        "the draft chain breaks before the last position: k beyond what the draft was trained for, or a mis-wired later layer.",
    ),
    Alert(
        "VLLMSpecDecodeAcceptanceSuspiciouslyHigh",
        "info",
        c.ALERT_HIGH_FOR,
        ("suspicious_acceptance_ratio", "min_drafts_per_second"),
        "Speculative-decoding acceptance is suspiciously close to 100 %.",
        _suspicious,
        "too good to be true: repetition loops, a broken detector or broken metrics.",
    ),
    Alert(
        "VLLMSpecDecodeRequestAcceptanceExtreme",
        "info",
        c.ALERT_REQUEST_EXTREMES_FOR,
        (),
        "Many finished requests had almost no draft token accepted, or almost all.",
        _request_extremes,
        "very low per-request acceptance: garbled or rare-character output (the target rejects the draft); very "
        "high: repetition loops (a corrupted state in a high-confidence loop) -- or a workload that is one or the "
        "other by design.",
    ),
)
ALERT_NAMES = tuple(a.name for a in ALERTS)
DEFAULT_FORS = {a.name: a.for_ for a in ALERTS}
SEVERITIES = ("critical", "warning", "info")


def _annotations(a: Alert, description: str, o: Options) -> dict[str, str]:
    out = {"summary": a.summary, "description": description, "runbook_url": f"{o.runbook_base}#{a.name.lower()}"}
    if a.likely_cause:
        out["likely_cause"] = a.likely_cause
    if o.dashboard_url:
        out["dashboard_url"] = o.dashboard_url
    return out


def alert_rules(src: Source, o: Options) -> list[Rule]:
    x = _context(src, o)
    out: list[Rule] = []
    for a in ALERTS:
        if a.sidecar_only and src is not SIDECAR:
            continue
        expr, description = a.build(x)
        out.append(
            {
                "alert": a.name,
                "expr": expr,
                "for": o.fors[a.name],
                "labels": {"severity": a.severity},
                "annotations": _annotations(a, description, o),
            }
        )
    return out


def _read_server_series(fast: list[Rule], slow: list[Rule], alerting: list[Rule]) -> tuple[list[Rule], list[Rule]]:
    """Per server, only the rates and ratios a rule reads (docs/scale.md): each costs a read or a
    join per server every evaluation, and the dashboards read the namespace and model levels.
    Repeated until nothing more goes: a dropped ratio may leave its rates unread."""

    def kept(r: Rule, read: set[str]) -> bool:
        level, _, op = r.get("record", "::").split(":")
        return not (level == c.ALERT_LEVEL and op.startswith(("rate", "ratio_rate"))) or r["record"] in read

    while True:
        read = set().union(*(references(r["expr"]) for r in (*fast, *slow, *alerting)))
        pruned = [r for r in fast if kept(r, read)], [r for r in slow if kept(r, read)]
        if len(pruned[0]) + len(pruned[1]) == len(fast) + len(slow):
            return pruned
        fast, slow = pruned


def rule_file(variant: str, o: Options | None = None) -> dict[str, Any]:
    """One variant's rules; raises DanglingReference when a rule reads a recorded series no rule records."""
    o = o or default_options()
    src = VARIANTS[variant]
    (fast, slow), alerting = recording_rules(src, o), alert_rules(src, o)
    check_references(
        f"{variant} rules",
        recorded((*fast, *slow)),
        {(r.get("alert") or f"recording rule {r['record']}"): r["expr"] for r in (*fast, *slow, *alerting)},
        o,
    )
    fast, slow = _read_server_series(fast, slow, alerting)
    slow_alerts = {a.name for a in ALERTS if a.slow}
    long_interval = o.long_group_interval()
    # In this order: promtool's unit tests evaluate every group at every step in file order (a
    # group's interval is ignored there), so the alerts see this step's recorded series.
    return {
        "groups": [
            {"name": f"vllm-specdec-recording-{variant}", "rules": fast},
            {"name": f"vllm-specdec-recording-long-{variant}", "interval": long_interval, "rules": slow},
            {"name": f"vllm-specdec-alerts-{variant}", "rules": [r for r in alerting if r["alert"] not in slow_alerts]},
            {
                "name": f"vllm-specdec-alerts-long-{variant}",
                "interval": long_interval,
                "rules": [r for r in alerting if r["alert"] in slow_alerts],
            },
        ]
    }


# --- Dangling references: a rule or a dashboard panel that reads a recording rule nobody records
# would silently never fire / stay empty. Generation fails instead, naming the reader and the series. ---
# Recorded names of our own prefix (level:vllm_specdec_metric:op); a dashboard's op may hold $window.
RECORDED_NAME = re.compile(rf"(?<![A-Za-z0-9_:$])[A-Za-z_][A-Za-z0-9_]*:{P}_[A-Za-z0-9_]+:[A-Za-z0-9_$]+")
WINDOW_VARIABLE = "$window"


class DanglingReference(ValueError):
    """A generated rule or dashboard reads a recorded series that no recording rule defines."""


def recorded(rules: Iterable[Rule]) -> set[str]:
    return {r["record"] for r in rules if "record" in r}


def references(expr: str, windows: Iterable[str] = ()) -> set[str]:
    """The recorded names of our prefix an expression reads; $window expanded over ``windows``."""
    found = set(RECORDED_NAME.findall(expr))
    return {n.replace(WINDOW_VARIABLE, w) for n in found for w in (windows if WINDOW_VARIABLE in n else ("",))}


def check_references(where: str, defined: set[str], readers: dict[str, str], o: Options, windows: Iterable[str] = ()) -> None:
    """Fail on the first reader (an alert, a rule, a panel) whose expression reads an unrecorded series."""
    windows = tuple(windows)
    for reader, expr in readers.items():
        missing = sorted(references(expr, windows) - defined)
        if missing:
            raise DanglingReference(
                f"{where}: {reader} reads {', '.join(missing)}, which no recording rule defines (recorded windows: "
                f"{', '.join(o.windows)}; detection {o.detection_window}, trend {o.trend_window}, hourly "
                f"{o.hourly_window}: each must be a recorded window)"
            )


class _Dumper(yaml.SafeDumper):
    pass


def _str(dumper: yaml.SafeDumper, data: str) -> yaml.ScalarNode:
    style = "|" if "\n" in data else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", data, style=style)


_Dumper.add_representer(str, _str)


def dump(data: dict[str, Any], header: str) -> str:
    return header + yaml.dump(data, Dumper=_Dumper, sort_keys=False, width=1000)


HEADER = (
    "# Generated by `python -m vllm_specdec_exporter.generators.rules` from exporter/vllm_specdec_exporter/config.py.\n"
    "# Do not edit: change the config module and regenerate (CI fails on drift).\n"
)


def render_all(o: Options | None = None) -> dict[str, str]:
    return {FILES[v]: dump(rule_file(v, o), HEADER + f"# Variant: {v}.\n") for v in VARIANTS}


# The Helm chart's copies carry placeholders its template fills from values: each
# threshold's __NAME__ from config.health.<name> (the exporter's own health settings:
# one source for both) or prometheusRule.thresholds.<name>, and the runbook base.
RUNBOOK_PLACEHOLDER = "__RUNBOOK_BASE__"
SELECTOR_PLACEHOLDER = "__SELECTOR__"  # prometheusRule.selector, in every series selector


def placeholder(key: str) -> str:
    return f"__{key.upper()}__"


def render_chart_files() -> dict[str, str]:
    """files/ of the Helm chart: both rule variants with placeholders, and the defaults they stand for."""
    o = default_options()
    chart = replace(
        o,
        thresholds={k: placeholder(k) for k in THRESHOLD_KEYS},
        runbook_base=RUNBOOK_PLACEHOLDER,
        dashboard_url="",
        alias_placeholders=True,
        selector=SELECTOR_PLACEHOLDER,
    )
    header = HEADER + "# Helm chart copy: the __NAME__ placeholders are filled by templates/prometheusrule.yaml.\n"
    out = {f"rules-{v}.yaml": dump(rule_file(v, chart), header) for v in VARIANTS}
    # The window the alerts judge over: the chart refuses a config.health.window (or config.windows
    # without it) that would make the exporter's health judge over another (templates/configmap.yaml).
    defaults = {
        "runbookBase": o.runbook_base,
        "window": o.detection_window,
        "thresholds": {k: float(v) for k, v in o.thresholds.items()},
        "health": [k for k in THRESHOLD_KEYS if k in c.DETECTION_KEYS],
        # config.baselines.aliases: the template adds "|<served name>" where a profile's
        # regex matches the model a served name stands for (vllm-direct baseline rules).
        "profiles": [{"placeholder": alias_placeholder(i), "model": p.model.pattern} for i, p in enumerate(default_profiles())],
    }
    out["rule-defaults.yaml"] = dump(defaults, HEADER)
    return out


INDEX_BEGIN = "<!-- BEGIN alert index: generated from generators/rules.py ALERTS by make generate; do not edit -->"
INDEX_END = "<!-- END alert index -->"


def runbook_index() -> str:
    """The runbook's index of alerts, from the registry: each alert, its severity, `for` and thresholds."""
    t = default_thresholds()
    rows = ["| Alert | Severity | For | Variants | Thresholds (default) |", "|---|---|---|---|---|"]
    for a in ALERTS:
        th = "; ".join(f"`{k}` = {t[k]}: {THRESHOLD_MEANINGS[k]}" for k in a.thresholds) or "-"
        variants = "sidecar" if a.sidecar_only else "sidecar, vllm-direct"
        rows.append(f"| [{a.name}](#{a.name.lower()}) | {a.severity} | {a.for_} | {variants} | {th} |")
    return "\n".join([INDEX_BEGIN, *rows, INDEX_END])


def with_runbook_index(text: str) -> str:
    """The runbook with its generated block replaced (or added before the first alert's section)."""
    if INDEX_BEGIN in text:
        head, rest = text.split(INDEX_BEGIN, 1)
        return head + runbook_index() + rest.split(INDEX_END, 1)[1]
    head, sep, rest = text.partition(f"\n## {ALERTS[0].name}\n")
    return head + "\n" + runbook_index() + "\n" + sep + rest


def with_schema_alerts(text: str) -> str:
    """values.schema.json with prometheusRule.alerts' property names from the registry."""
    schema = json.loads(text)
    alerts = schema["properties"]["prometheusRule"]["properties"]["alerts"]
    per_alert = next(iter(alerts["properties"].values()))
    alerts["properties"] = {a: per_alert for a in ALERT_NAMES}
    return json.dumps(schema, indent=2) + "\n"


def _alias(text: str) -> tuple[str, str]:
    served, sep, model = text.partition("=")
    if not sep or not served.strip() or not model.strip():
        raise ValueError(f"--alias {text!r}: expected SERVED=MODEL, e.g. DSV4-W4A16-FP8-MTP=deepseek-ai/DeepSeek-V4-Pro")
    if not any(p.model.search(model.strip()) for p in default_profiles()):
        raise ValueError(f"--alias {text!r}: no shipped profile matches the model {model.strip()!r}")
    return served.strip(), model.strip()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m vllm_specdec_exporter.generators.rules")
    parser.add_argument("out_dir", nargs="?", default="alerts")
    parser.add_argument("--chart-files", help="also write the Helm chart's copies into this folder")
    parser.add_argument("--chart-schema", help="the Helm chart's values.schema.json: its alert names")
    parser.add_argument("--check", action="store_true", help="fail if the committed files differ")
    parser.add_argument(
        "--alias",
        action="append",
        default=[],
        metavar="SERVED=MODEL",
        help="a served name (--served-model-name) and the model it serves, which the shipped profiles match: "
        "the vllm-direct baseline rules then cover that served name (repeatable). Without it a served name no "
        "profile matches has no baseline, and a head partly broken from the start goes unseen",
    )
    args = parser.parse_args(argv)
    try:
        aliases = tuple(_alias(a) for a in args.alias)
    except ValueError as e:
        parser.error(str(e))
    try:
        files, chart_files = render_all(default_options(aliases=aliases) if aliases else None), render_chart_files()
    except DanglingReference as e:
        print(f"cannot generate: {e}", file=sys.stderr)
        return 2
    stale = write_or_check(files, Path(args.out_dir), args.check)
    if args.chart_files:
        stale += write_or_check(chart_files, Path(args.chart_files), args.check)
    if (Path(args.out_dir) / "runbook.md").exists():
        stale += update_or_check(Path(args.out_dir) / "runbook.md", with_runbook_index, args.check)
    if args.chart_schema:  # the alert names from ALERTS, `config` from the settings module
        stale += update_or_check(Path(args.chart_schema), lambda t: with_schema_config(with_schema_alerts(t)), args.check)
    return exit_status(stale)


if __name__ == "__main__":
    sys.exit(main())
