"""The rules' configuration: what every generator reads, the dashboards too (as kubernetes-mixin's
``_config``): the two sources (variants), the thresholds, the Options a deployment may change, the
recorded windows and the recording-rule levels and names. ``default_options`` (the shipped
Options) is in registry.py, beside the alerts' `for`s it holds.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from ... import config as c
from ... import durations
from ... import metrics as m
from ...model import BaselineProfile

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
    "shift_fraction": c.ALERT_SHIFT_FRACTION,
    "chain_conditional_floor": c.ALERT_CHAIN_CONDITIONAL_FLOOR,
    "reference_min_drafts_per_second": c.ALERT_REFERENCE_MIN_DRAFTS_PER_SECOND,
    "min_generation_tokens_per_second": c.ALERT_MIN_GENERATION_TOKENS_PER_SECOND,
    "wasted_position_ratio": c.ALERT_WASTED_POSITION_RATE,
    "suspicious_acceptance_ratio": c.ALERT_HIGH_ACCEPTANCE_RATE,
    "fast_collapse_min_drafts_per_second": c.ALERT_FAST_COLLAPSE_MIN_DRAFTS_PER_SECOND,
}
THRESHOLD_KEYS = tuple(k for k in c.DETECTION_KEYS if k != "window") + tuple(ALERT_ONLY_THRESHOLDS)
# The alert-only thresholds that are shares (of drafts, or of a gain), so at most 1: a percent
# written for one (40 for 0.4) makes an alert that can never fire. The others are per-second floors.
SHARE_THRESHOLDS = (
    "drop_fraction",
    "shift_fraction",
    "chain_conditional_floor",
    "wasted_position_ratio",
    "suspicious_acceptance_ratio",
)


def default_thresholds() -> dict[str, str]:
    det = {k: getattr(c.DETECTION, k) for k in c.DETECTION_KEYS if k != "window"}
    return {k: f"{v:g}" for k, v in {**det, **ALERT_ONLY_THRESHOLDS}.items()}


# Each threshold the alerts read, and what it means (the Helm chart's prometheusRule.thresholds).
THRESHOLD_MEANINGS = {
    "collapse_margin": "collapsed: mean acceptance length below 1 + this",
    "position0_floor": "position 0 accepted in fewer than this share of drafts",
    "degraded_fraction": "speculative gain below this fraction of the baseline profile's",
    "engine_lag_fraction": "an engine's gain below this fraction of its server's",
    "draft_step_cost": "what one draft token adds to a decode step: below AL 1 + this x k, drafting costs more than it returns",
    "min_drafts_per_second": "traffic floor: drafts/s below which nothing is judged",
    "drop_fraction": "gain over 5m more than this fraction below the model's best hour of the day at the same k",
    "shift_fraction": "a rollout's newcomers' gain more than this fraction below the servers they join or replace, same k",
    "chain_conditional_floor": "position 1 accepted in fewer than this share of the drafts whose position 0 was",
    "reference_min_drafts_per_second": "the drafts/s an hour needs to become the model's healthy reference",
    "min_generation_tokens_per_second": "generation tokens/s above which no drafts means not drafting",
    "wasted_position_ratio": "the last position accepted in fewer than this share of drafts",
    "suspicious_acceptance_ratio": "acceptance above this share",
    "fast_collapse_min_drafts_per_second": "the fast page's traffic floor (drafts/s)",
}


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
        ms = min(
            durations.parse_duration(self.range(self.hourly_window)) * 1000 / 20,
            durations.parse_duration(LONG_INTERVAL_MAX) * 1000,
        )
        return durations.format_duration(max(int(ms), 1000) / 1000)


def minus(a: str, b: str) -> str:
    """The duration ``a`` - ``b`` in seconds, as PromQL reads it."""
    return f"{int(durations.parse_duration(a) - durations.parse_duration(b))}s"


# The long group's interval at most: its series are read instantly (alerts, panels), and an
# instant read looks back 5m at most, so a sample must come more often than that.
LONG_INTERVAL_MAX = "3m"


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


def selector_of(o: Options, extra: str = "") -> str:
    """A series selector with the options' selector (and ``extra`` matchers); "" for none."""
    inner = ", ".join(x for x in (o.selector, extra) if x)
    return f"{{{inner}}}" if inner else ""


def young(o: Options, over: str) -> str:
    """The servers not (yet) at one k for the whole range ``over``: their k (recorded in the long
    group) changed within it or was recorded at under ALERT_RECORDED_SHARE of that group's
    evaluations over it (a new pod, or one back from being down for more than the rest)."""
    k = name(c.ALERT_LEVEL, "num_speculative_tokens", "max")
    full = int(c.ALERT_RECORDED_SHARE * durations.parse_duration(over) / durations.parse_duration(o.long_group_interval()))
    return f"changes({k}[{over}]) > 0 or count_over_time({k}[{over}]) < {full}"


def base_window(o: Options) -> str:
    """The shortest recorded window: the only one that reads the raw counters."""
    return min(o.windows, key=lambda w: durations.parse_duration(o.range(w)))


def long_windows(o: Options) -> tuple[str, ...]:
    """The windows recorded in the long group (at Options.long_group_interval): as long as the
    hourly window or longer, and not the detection or trend window, which alerts judge every
    evaluation."""
    hourly = durations.parse_duration(o.range(o.hourly_window))
    return tuple(
        w
        for w in o.windows
        if w not in (base_window(o), o.detection_window, o.trend_window) and durations.parse_duration(o.range(w)) >= hourly
    )
