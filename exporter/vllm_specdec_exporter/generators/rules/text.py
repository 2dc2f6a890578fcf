"""The text generated from the registry: the runbook (from its template) with its index of alerts,
the Helm schema's alert names, and the figures the runbook and docs/alerts.md's table
(generators/pages.py) state, from the Options the rule expressions are built from.
"""

from __future__ import annotations

import json
import re

from ... import config as c
from ... import durations
from ...settings import default_profiles
from .expressions import CHAIN_HEALTHY_FACTOR
from .options import ALERT_ONLY_THRESHOLDS, SHARE_THRESHOLDS, THRESHOLD_MEANINGS, Options, base_window, default_thresholds
from .registry import ALERT_NAMES, ALERTS, default_options

INDEX_BEGIN = "<!-- BEGIN alert index: generated from generators/rules/registry.py ALERTS by make generate; do not edit -->"
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


RUNBOOK_TEMPLATE = "runbook.template.md"  # the runbook's source, beside it in alerts/
FIGURE = re.compile(r"\$\{(\w+)\}")


def runbook(template: str, o: Options | None = None) -> str:
    """alerts/runbook.md from its template: each ${NAME} becomes a figure the rules are built from
    (alert_figures; within an alert's section, that alert's `for` and severity too), so a changed
    threshold changes the runbook as it changes the rule; then the index of alerts."""
    o = o or default_options()
    severities = {a.name: a.severity for a in ALERTS}
    sections = []
    for section in re.split(r"(?m)^(?=## )", template):
        heading = section.split("\n", 1)[0].removeprefix("## ") if section.startswith("## ") else "(the preamble)"
        alert = heading if heading in severities else None
        figures = {**alert_figures(o, alert), **({"severity": severities[alert]} if alert else {})}

        def figure(m: re.Match[str], figures: dict[str, str] = figures, heading: str = heading) -> str:
            if m[1] not in figures:
                raise ValueError(f"runbook template, section {heading}: ${{{m[1]}}} is not a figure the rules are built from")
            return figures[m[1]]

        sections.append(FIGURE.sub(figure, section))
    title, _, rest = "".join(sections).partition("\n")
    note = f"<!-- Generated from {RUNBOOK_TEMPLATE} by make generate, with the rules' figures: edit the template. -->"
    # The index of alerts goes before the first alert's section.
    head, sep, rest = f"{title}\n{note}\n{rest}".partition(f"\n## {ALERTS[0].name}\n")
    return head + "\n" + runbook_index() + "\n" + sep + rest


def with_schema_alerts(text: str) -> str:
    """values.schema.json with prometheusRule.alerts' property names from the registry, and
    prometheusRule.thresholds' from the alert-only thresholds (shares at most 1)."""
    schema = json.loads(text)
    rule = schema["properties"]["prometheusRule"]["properties"]
    per_alert = next(iter(rule["alerts"]["properties"].values()))
    rule["alerts"]["properties"] = {a: per_alert for a in ALERT_NAMES}
    rule["thresholds"]["properties"] = {
        k: {"type": "number", "minimum": 0, **({"maximum": 1} if k in SHARE_THRESHOLDS else {})} for k in ALERT_ONLY_THRESHOLDS
    }
    return json.dumps(schema, indent=2) + "\n"


def _percent(value: float | str) -> str:
    return f"{float(value) * 100:g} %"


def alert_figures(o: Options, alert: str | None) -> dict[str, str]:
    """The figures docs/alerts.md's table and the runbook state (of ``alert``, or of none: no `for`),
    the {NAME}s of generators/pages.py ALERT_NOTES and the ${NAME}s of the runbook's template, from
    what the rules are built from: ``o``'s thresholds (each by its key), windows and `for`s,
    config's fixed figures, and what follows from them (the shipped profiles' floors by the formulas
    config.py defines for the sidecar and the rules). A changed threshold changes both."""
    t = o.thresholds
    profiles = {p.name: p for p in (o.profiles or default_profiles())}

    def degraded_floor(profile: str) -> str:
        return f"{c.degraded_floor(float(t['degraded_fraction']), profiles[profile].mean_acceptance_length):.2f}"

    def position0_floor(profile: str) -> str:
        p = profiles[profile]
        share = c.position0_share(float(t["degraded_fraction"]), p.mean_acceptance_length, float(p.k))
        return f"{min(float(t['position0_floor']), share):.3f}"

    fast = c.ALERT_FAST_COLLAPSE_RANGE
    return {
        **t,
        **({"for": o.fors[alert]} if alert else {}),
        "window": o.detection_window,
        "trend_window": o.trend_window,
        "hourly_window": o.hourly_window,
        "day_range": o.day_range,
        "request_extremes_window": o.request_extremes_window,
        "long_interval": o.long_group_interval(),
        "fast_collapse_range": fast,
        "collapse_al": f"{c.collapse_floor(float(t['collapse_margin'])):g}",
        "fast_collapse_drafts": f"{float(t['fast_collapse_min_drafts_per_second']) * durations.parse_duration(o.range(fast)):,.0f}",
        "chain_healthy": f"{CHAIN_HEALTHY_FACTOR * float(t['chain_conditional_floor']):g}",
        "drop_percent": _percent(t["drop_fraction"]),
        "shift_percent": _percent(t["shift_fraction"]),
        "wasted_percent": _percent(t["wasted_position_ratio"]),
        "suspicious_percent": _percent(t["suspicious_acceptance_ratio"]),
        "unreachable_after": c.TARGET_UNREACHABLE_AFTER,
        "inconsistent_window": c.TARGET_INCONSISTENT_WINDOW,
        "inconsistent_percent": _percent(c.TARGET_INCONSISTENT_SHARE),
        "request_percent": _percent(c.ALERT_REQUEST_EXTREMES_SHARE),
        "request_min": f"{c.ALERT_REQUEST_EXTREMES_MIN_REQUESTS}",
        "request_low": f"{c.REQUEST_ACCEPTANCE_LOW:g}",
        "request_high": f"{c.REQUEST_ACCEPTANCE_HIGH:g}",
        "request_low_percent": _percent(c.REQUEST_ACCEPTANCE_LOW),
        "request_high_percent": _percent(c.REQUEST_ACCEPTANCE_HIGH),
        "collapse_percent": _percent(t["collapse_margin"]),
        "degraded_percent": _percent(t["degraded_fraction"]),
        "base_window": base_window(o),
        "invariant_window": c.ALERT_INVARIANT_WINDOW,
        # The longest a pod can be down and come back settled (ALERT_RECORDED_SHARE of the hour).
        "young_gap": durations.format_duration(
            round((1 - c.ALERT_RECORDED_SHARE) * durations.parse_duration(o.range(o.hourly_window)))
        ),
        "shift_window": c.ALERT_SHIFT_WINDOW,
        "dropped_settle": c.ALERT_DROPPED_SETTLE,
        "v4_flash_k7_al": f"{profiles['deepseek-v4-flash-mtp-k7'].mean_acceptance_length:g}",
        "v4_pro_k2_al": f"{profiles['deepseek-v4-pro-mtp-k2'].mean_acceptance_length:g}",
        "v4_pro_k2_position0_floor": position0_floor("deepseek-v4-pro-mtp-k2"),
        "v4_flash_k2_degraded_floor": degraded_floor("deepseek-v4-flash-mtp-k2"),
        "v4_flash_k7_position0_floor": position0_floor("deepseek-v4-flash-mtp-k7"),
        "v4_pro_k3_degraded_floor": degraded_floor("deepseek-v4-pro-mtp-k3"),
    }
