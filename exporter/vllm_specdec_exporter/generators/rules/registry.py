"""The alert registry: ONE record per alert. Its name, severity, `for`, the thresholds it reads
(their meaning: options.THRESHOLD_MEANINGS), its expression builder (expressions.py) and its
annotations (summary, the builder's description, likely cause) generate the rules, the Helm
schema's alert names, the runbook's index, docs/alerts.md's table and the Alertmanager example's
checks (tests/test_registry.py). ``default_options`` is here: the shipped Options hold the
registry's `for`s (options.py, below this module, cannot read them).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from ... import config as c
from . import expressions as e
from .context import X, context
from .options import SIDECAR, Options, Rule, Source, default_thresholds

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
    # every engine's series, which would otherwise cost as much as a raw counter's 5m rates; or an
    # info alert over the hourly window, whose inputs the long group records or that barely move in
    # its interval (judged every 30 s, it would read each record six times).
    slow: bool = False


ALERTS: tuple[Alert, ...] = (
    Alert(
        "VLLMSpecDecodeAcceptanceCollapsed",
        "critical",
        c.ALERT_COLLAPSE_FOR,
        ("collapse_margin", "min_drafts_per_second"),
        "Speculative-decoding acceptance has collapsed: draft tokens are almost never accepted.",
        e.collapsed,
        _CONFIG,
    ),
    Alert(
        "VLLMSpecDecodeAcceptanceCollapsedFast",
        "critical",
        c.ALERT_FAST_COLLAPSE_FOR,
        ("collapse_margin", "fast_collapse_min_drafts_per_second"),
        "Speculative-decoding acceptance has collapsed at production traffic: draft tokens are almost never accepted.",
        e.collapsed_fast,
        _CONFIG,
    ),
    Alert(
        "VLLMSpecDecodeEngineCollapsed",
        "critical",
        c.ALERT_ENGINE_COLLAPSE_FOR,
        ("collapse_margin", "min_drafts_per_second"),
        "One engine's speculative decoding has collapsed while its siblings are healthy.",
        e.engine_collapsed,
        _RANK,
    ),
    Alert(
        "VLLMSpecDecodeEngineLagging",
        "warning",
        c.ALERT_ENGINE_LAG_FOR,
        ("engine_lag_fraction", "collapse_margin", "min_drafts_per_second"),
        "One engine's speculative gain lags far behind its siblings'.",
        e.engine_lagging,
        _RANK,
        slow=True,
    ),
    Alert(
        "VLLMSpecDecodeFirstPositionAcceptanceLow",
        "warning",
        c.ALERT_POSITION0_FOR,
        ("position0_floor", "min_drafts_per_second"),
        "The first draft position is rarely accepted: a broken draft path, or synthetic load.",
        e.position0_low,
        "a partly broken draft head (conversion, loader, draft sampling or context) if it has been low since a deployment; a workload shift (synthetic random-token load, temperature, traffic mix) if it fell without one: the counters alone cannot tell them apart.",
    ),
    Alert(
        "VLLMSpecDecodeAcceptanceBelowBaseline",
        "warning",
        c.ALERT_BELOW_BASELINE_FOR,
        ("degraded_fraction", "min_drafts_per_second"),
        "Speculative-decoding acceptance is below the baseline profile's expectation.",
        e.below_baseline,
        "a partly broken draft head if it has been below its profile since a deployment; a workload shift (traffic mix, temperature, synthetic load) if it fell without one; if position 0 is healthy, the chain breaks after it.",
    ),
    Alert(
        "VLLMSpecDecodeDraftChainBroken",
        "warning",
        c.ALERT_CHAIN_BROKEN_FOR,
        ("chain_conditional_floor", "position0_floor", "min_drafts_per_second"),
        "The draft chain breaks after its first token: position 1 is rarely accepted while position 0 is healthy.",
        e.chain_broken,
        "the chain breaks after position 0: a mis-wired or unloaded later MTP layer, a backend bug in how later "
        "draft positions are built, or k beyond what the draft was trained for.",
    ),
    Alert(
        "VLLMSpecDecodeAcceptanceDropped",
        "warning",
        c.ALERT_DROPPED_FOR,
        ("drop_fraction", "min_drafts_per_second"),
        "Speculative-decoding acceptance fell sharply against the model's own best hour of the day.",
        e.dropped,
        "a configuration change (a new artifact, version or rollout at the same k) if it began with one; "
        "a head degrading in service, or a workload shift beyond what workload alone explains, if not.",
    ),
    Alert(
        "VLLMSpecDecodeAcceptanceShifted",
        "warning",
        c.ALERT_SHIFTED_FOR,
        ("shift_fraction", "min_drafts_per_second", "reference_min_drafts_per_second"),
        "A rollout's new servers draft worse than the servers they join or replace, at the same k.",
        e.shifted,
        "what was rolled out (a new artifact, quantisation, version or flag): the new servers serve the same "
        "traffic at the same time as their predecessors; a traffic-mix shift that came with the rollout, if one did.",
        slow=True,
    ),
    Alert(
        "VLLMSpecDecodeNotDrafting",
        "warning",
        c.ALERT_NOT_DRAFTING_FOR,
        ("min_generation_tokens_per_second", "min_drafts_per_second"),
        "vLLM generates tokens but speculative decoding has stopped drafting.",
        e.not_drafting,
    ),
    Alert(
        "VLLMSpecDecodeTargetDown",
        "warning",
        c.ALERT_TARGET_DOWN_FOR,
        (),
        "The vllm-specdec-exporter sidecar cannot read vLLM's /metrics.",
        e.target_down,
        sidecar_only=True,
    ),
    Alert(
        "VLLMSpecDecodeTargetInconsistent",
        "warning",
        c.ALERT_TARGET_INCONSISTENT_FOR,
        (),
        "Most polls of a target are inconsistent: its figures are not counted.",
        e.target_inconsistent,
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
        e.exporter_absent,
        sidecar_only=True,
    ),
    Alert(
        "VLLMSpecDecodeCounterInvariantViolated",
        "info",
        c.ALERT_INVARIANT_FOR,
        (),
        "vLLM's speculative-decoding counters break their own invariants.",
        e.invariant,
        slow=True,
    ),
    Alert(
        "VLLMSpecDecodeNoBaseline",
        "info",
        c.ALERT_NO_BASELINE_FOR,
        ("min_drafts_per_second",),
        "A model drafts with no baseline profile: a head partly broken from the start goes unseen.",
        e.no_baseline,
        sidecar_only=True,
    ),
    Alert(
        "VLLMSpecDecodeSpeculativeTokensWasted",
        "info",
        c.ALERT_WASTED_FOR,
        ("wasted_position_ratio", "min_drafts_per_second"),
        "The last speculative position is almost never accepted: a smaller k would save draft compute.",
        e.wasted,
        "the draft chain breaks before the last position: k beyond what the draft was trained for, or a mis-wired later layer.",
        slow=True,
    ),
    Alert(
        "VLLMSpecDecodeAcceptanceSuspiciouslyHigh",
        "info",
        c.ALERT_HIGH_FOR,
        ("suspicious_acceptance_ratio", "min_drafts_per_second"),
        "Speculative-decoding acceptance is suspiciously close to 100 %.",
        e.suspicious,
        "too good to be true: repetition loops, a broken detector or broken metrics.",
    ),
    Alert(
        "VLLMSpecDecodeRequestAcceptanceExtreme",
        "info",
        c.ALERT_REQUEST_EXTREMES_FOR,
        (),
        "Many finished requests had almost no draft token accepted, or almost all.",
        e.request_extremes,
        "very low per-request acceptance: garbled or rare-character output (the target rejects the draft); very "
        "high: repetition loops (a corrupted state in a high-confidence loop) -- or a workload that is one or the "
        "other by design.",
        slow=True,
    ),
)
ALERT_NAMES = tuple(a.name for a in ALERTS)
DEFAULT_FORS = {a.name: a.for_ for a in ALERTS}
SEVERITIES = ("critical", "warning", "info")


def default_options(**changes: Any) -> Options:
    """The shipped options; ``windows`` (default config.RULE_WINDOWS, read now) also sets the ranges."""
    windows = tuple(changes.pop("windows", c.RULE_WINDOWS))
    ranges = {w: w for w in (*windows, c.ALERT_FAST_COLLAPSE_RANGE)}
    return Options(ranges=ranges, fors=dict(DEFAULT_FORS), thresholds=default_thresholds(), windows=windows, **changes)


def _annotations(a: Alert, description: str, o: Options) -> dict[str, str]:
    out = {"summary": a.summary, "description": description, "runbook_url": f"{o.runbook_base}#{a.name.lower()}"}
    if a.likely_cause:
        out["likely_cause"] = a.likely_cause
    if o.dashboard_url:
        out["dashboard_url"] = o.dashboard_url
    return out


def alert_rules(src: Source, o: Options) -> list[Rule]:
    x = context(src, o)
    out: list[Rule] = []
    for a in ALERTS:
        if a.sidecar_only and src is not SIDECAR:
            continue
        expr, description = a.build(replace(x, for_=o.fors[a.name]))
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
