"""Generate the Prometheus recording rules and alerts from the config module.

Two variants with the same recording-rule names, so the dashboards work with
either: ``sidecar`` reads the exporter's normalised counters (``vllm_specdec_*``),
``vllm-direct`` reads vLLM's own (``vllm:spec_decode_*``) for users who run no
sidecar; alerts that need the sidecar (baseline profiles, target down, exporter
absent) exist only in the first. Ratios are always ratios of summed rates.

    python -m vllm_specdec_exporter.rules [--check] [OUT_DIR]
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path

import yaml

from . import config as c

P = c.PREFIX


@dataclass(frozen=True)
class Source:
    variant: str
    drafts: str
    draft_tokens: str
    accepted: str
    per_pos: str
    generation: str


SIDECAR = Source("sidecar", f"{P}_drafts_total", f"{P}_draft_tokens_total", f"{P}_accepted_tokens_total",
                 f"{P}_position_accepted_tokens_total", f"{P}_generation_tokens_total")
DIRECT = Source("vllm-direct", c.VLLM_V1_DRAFTS, c.VLLM_V1_DRAFT_TOKENS, c.VLLM_V1_ACCEPTED,
                c.VLLM_V1_ACCEPTED_PER_POS, c.VLLM_V1_GENERATION_TOKENS)
VARIANTS = {"sidecar": SIDECAR, "vllm-direct": DIRECT}
FILES = {"sidecar": "rules.yaml", "vllm-direct": "rules-vllm-direct.yaml"}

# The finest level (per engine) is computed from the counters; coarser ones from it.
ENGINE_LEVEL = ("namespace_pod_model_name_engine", ("namespace", "pod", "model_name", "engine"))
LEVELS = (ENGINE_LEVEL, *reversed(c.RULE_LEVELS))  # finest first
ALERT_BY = dict(c.RULE_LEVELS)[c.ALERT_LEVEL]


def name(level: str, metric: str, op: str) -> str:
    return f"{level}:{P}_{metric}:{op}"


def by(labels) -> str:
    return ", ".join(labels)


# The one threshold in each alert's expression a deployment may override (the Helm
# chart's prometheusRule.alerts.<name>.threshold). Dropped's is the fraction of the
# previous day's gain below which it fires (1 - ALERT_DROP_FRACTION).
THRESHOLDS = {
    "VLLMSpecDecodeAcceptanceCollapsed": 1 + c.DEFAULT_COLLAPSE_MARGIN,
    "VLLMSpecDecodeAcceptanceBelowBaseline": c.DEFAULT_DEGRADED_FRACTION,
    "VLLMSpecDecodeAcceptanceDropped": 1 - c.ALERT_DROP_FRACTION,
    "VLLMSpecDecodeNotDrafting": c.ALERT_MIN_GENERATION_TOKENS_PER_SECOND,
    "VLLMSpecDecodeSpeculativeTokensWasted": c.ALERT_WASTED_POSITION_RATE,
    "VLLMSpecDecodeAcceptanceSuspiciouslyHigh": c.ALERT_HIGH_ACCEPTANCE_RATE,
}


@dataclass(frozen=True)
class Options:
    """What a deployment may change without touching the expressions' shape."""

    ranges: dict[str, str]  # window name -> PromQL range (tests shrink them)
    fors: dict[str, str]  # alert -> for
    thresholds: dict[str, str]  # alert -> threshold literal (the chart passes a placeholder)
    runbook_base: str = c.RUNBOOK_BASE_URL
    dashboard_url: str = c.DASHBOARD_URL
    sidecar_selector: str = c.SIDECAR_SELECTOR
    day_range: str = "1d"
    drop_offset: str = "30m"


DEFAULT_FORS = {
    "VLLMSpecDecodeAcceptanceCollapsed": c.ALERT_COLLAPSE_FOR,
    "VLLMSpecDecodeAcceptanceBelowBaseline": c.ALERT_BELOW_BASELINE_FOR,
    "VLLMSpecDecodeAcceptanceDropped": c.ALERT_DROPPED_FOR,
    "VLLMSpecDecodeNotDrafting": c.ALERT_NOT_DRAFTING_FOR,
    "VLLMSpecDecodeTargetDown": c.ALERT_TARGET_DOWN_FOR,
    "VLLMSpecDecodeExporterAbsent": c.ALERT_EXPORTER_ABSENT_FOR,
    "VLLMSpecDecodeCounterInvariantViolated": c.ALERT_INVARIANT_FOR,
    "VLLMSpecDecodeSpeculativeTokensWasted": c.ALERT_WASTED_FOR,
    "VLLMSpecDecodeAcceptanceSuspiciouslyHigh": c.ALERT_HIGH_FOR,
}


def default_options() -> Options:
    return Options(ranges={w: w for w in c.RULE_WINDOWS}, fors=dict(DEFAULT_FORS),
                   thresholds={a: f"{v:g}" for a, v in THRESHOLDS.items()})


def recording_rules(src: Source, o: Options) -> list[dict]:
    rules: list[dict] = []

    def record(record: str, expr: str) -> None:
        rules.append({"record": record, "expr": expr})

    counters = {"drafts": src.drafts, "draft_tokens": src.draft_tokens, "accepted_tokens": src.accepted,
                "generation_tokens": src.generation}
    for w in c.RULE_WINDOWS:
        rng = o.ranges[w]
        finer = None
        for level, labels in LEVELS:
            for metric, counter in counters.items():
                source = f"rate({counter}[{rng}])" if finer is None else name(finer, metric, f"rate{w}")
                record(name(level, metric, f"rate{w}"), f"sum by ({by(labels)}) ({source})")
            if level != ENGINE_LEVEL[0]:
                # Positions are not kept per engine: the first level below reads the counters.
                source = (f"rate({src.per_pos}[{rng}])" if finer == ENGINE_LEVEL[0]
                          else name(finer, "position_accepted_tokens", f"rate{w}"))
                record(name(level, "position_accepted_tokens", f"rate{w}"),
                       f"sum by ({by(labels)}, position) ({source})")
            drafts = name(level, "drafts", f"rate{w}")
            accepted = name(level, "accepted_tokens", f"rate{w}")
            # Dividing by "(x > 0)" leaves no sample, not NaN, when there were no drafts.
            record(name(level, "mean_acceptance_length", f"ratio_rate{w}"), f"1 + {accepted} / ({drafts} > 0)")
            record(name(level, "acceptance_rate", f"ratio_rate{w}"),
                   f"{accepted} / ({name(level, 'draft_tokens', f'rate{w}')} > 0)")
            if level != ENGINE_LEVEL[0]:
                pos = name(level, "position_accepted_tokens", f"rate{w}")
                record(name(level, "position_acceptance_rate", f"ratio_rate{w}"),
                       f"{pos} / ignoring(position) group_left() ({drafts} > 0)")
                record(name(level, "effective_draft_length", f"ratio_rate{w}"),
                       f"{name(level, 'draft_tokens', f'rate{w}')} / ({drafts} > 0)")
                record(name(level, "draft_token_share", f"ratio_rate{w}"),
                       f"{accepted} / ({name(level, 'generation_tokens', f'rate{w}')} > 0)")
                # per_pos[i] / per_pos[i-1], with per_pos[-1] = drafts: relabel i-1 as i
                # so the two sides match, one clause per position (one rule, so the
                # record name is not duplicated).
                clauses = [f'{pos}{{position="0"}} / ignoring(position) group_left() ({drafts} > 0)']
                clauses += [f'{pos}{{position="{i}"}} / label_replace({pos}{{position="{i - 1}"}} > 0, '
                            f'"position", "{i}", "position", ".*")' for i in range(1, c.MAX_SPECULATIVE_TOKENS)]
                record(name(level, "position_conditional_acceptance_rate", f"ratio_rate{w}"),
                       "\n  or ".join(clauses))
            finer = level

    # k, and the day-long history the drop alert compares against (alert level only).
    level, labels = c.ALERT_LEVEL, ALERT_BY
    if src is SIDECAR:
        k_expr = f"max by ({by(labels)}) ({P}_num_speculative_tokens{_sel(o)})"
    else:
        k_expr = (f"max by ({by(labels)}) (\n  count by ({by(labels)}, instance, engine) ({src.per_pos})\n)")
    record(name(level, "num_speculative_tokens", "max"), k_expr)
    for metric in ("drafts", "accepted_tokens"):
        # The mean of equal-length hourly rates is the day's rate: still a sum before the ratio.
        record(name(level, metric, "rate1d"), f"avg_over_time({name(level, metric, 'rate1h')}[{o.day_range}])")
    record(name(level, "mean_acceptance_length", "ratio_rate1d"),
           f"1 + {name(level, 'accepted_tokens', 'rate1d')} / ({name(level, 'drafts', 'rate1d')} > 0)")
    return rules


def _sel(o: Options) -> str:
    return f"{{{o.sidecar_selector}}}" if o.sidecar_selector else ""


def _annotations(alert: str, summary: str, description: str, o: Options) -> dict:
    out = {"summary": summary, "description": description, "runbook_url": f"{o.runbook_base}#{alert.lower()}"}
    if o.dashboard_url:
        out["dashboard_url"] = o.dashboard_url
    return out


WHERE = "{{ $labels.model_name }} on {{ $labels.namespace }}/{{ $labels.pod }}"


def alert_rules(src: Source, o: Options) -> list[dict]:
    L = c.ALERT_LEVEL
    on = f"on({by(ALERT_BY)})"
    floor = c.ALERT_MIN_DRAFTS_PER_SECOND
    al5, d5 = name(L, "mean_acceptance_length", "ratio_rate5m"), name(L, "drafts", "rate5m")
    alerts = []

    def alert(alertname: str, severity: str, expr: str, summary: str, description: str) -> None:
        alerts.append({
            "alert": alertname, "expr": expr, "for": o.fors[alertname], "labels": {"severity": severity},
            "annotations": _annotations(alertname, summary, description, o),
        })

    t = o.thresholds
    alert("VLLMSpecDecodeAcceptanceCollapsed", "critical",
          f"{al5} < {t['VLLMSpecDecodeAcceptanceCollapsed']}\nand {on} {d5} > {floor:g}",
          "Speculative-decoding acceptance has collapsed: draft tokens are almost never accepted.",
          f"Mean acceptance length of {WHERE} is {{{{ $value | printf \"%.3f\" }}}} over 5m (1.0 means no draft "
          f"token is accepted) with real traffic. Decoding still works but runs at non-speculative speed: "
          f"suspect the draft head (quantised conversion, loader) or draft sampling.")
    if src is SIDECAR:
        baseline = f"max by ({by(ALERT_BY)}) ({P}_baseline_mean_acceptance_length{_sel(o)})"
        alert("VLLMSpecDecodeAcceptanceBelowBaseline", "warning",
              f"{al5}\n  < {on} 1 + {t['VLLMSpecDecodeAcceptanceBelowBaseline']} * ({baseline} - 1)\n"
              f"and {on} {d5} > {floor:g}",
              "Speculative-decoding acceptance is below the baseline profile's expectation.",
              f"Mean acceptance length of {WHERE} is {{{{ $value | printf \"%.3f\" }}}} over 5m, below "
              f"1 + {t['VLLMSpecDecodeAcceptanceBelowBaseline']} x (baseline - 1) for its baseline profile "
              f"(vllm_specdec_baseline_mean_acceptance_length).")
    al30, d30 = name(L, "mean_acceptance_length", "ratio_rate30m"), name(L, "drafts", "rate30m")
    al1d, d1d = name(L, "mean_acceptance_length", "ratio_rate1d"), name(L, "drafts", "rate1d")
    keep = t["VLLMSpecDecodeAcceptanceDropped"]
    alert("VLLMSpecDecodeAcceptanceDropped", "warning",
          f"({al30} - 1)\n  < {on} {keep} * ({al1d} offset {o.drop_offset} - 1)\n"
          f"and {on} {d30} > {floor:g}\nand {on} {d1d} offset {o.drop_offset} > {floor:g}",
          "Speculative-decoding acceptance fell sharply against this deployment's own history.",
          f"The speculative gain (mean acceptance length - 1) of {WHERE} is {{{{ $value | printf \"%.3f\" }}}} "
          f"over the last 30m, below {keep} x its average over the previous day.")
    g5 = name(L, "generation_tokens", "rate5m")
    alert("VLLMSpecDecodeNotDrafting", "warning",
          f"{g5} > {t['VLLMSpecDecodeNotDrafting']}\nunless {on} {d5} > 0\n"
          f"and {on} max_over_time({name(L, 'drafts', 'rate1h')}[{o.day_range}]) > {floor:g}",
          "vLLM generates tokens but speculative decoding has stopped drafting.",
          f"{WHERE} generates {{{{ $value | humanize }}}} tokens/s with no drafts over 5m, although it was "
          f"drafting within the last day: speculative decoding is off or silently disabled.")
    if src is SIDECAR:
        alert("VLLMSpecDecodeTargetDown", "warning", f"{P}_up{_sel(o)} == 0",
              "The vllm-specdec-exporter sidecar cannot read vLLM's /metrics.",
              "Target {{ $labels.target }} of the exporter at {{ $labels.instance }} has failed its polls; see "
              "vllm_specdec_exporter_polls_total by result and the sidecar's log for why.")
        alert("VLLMSpecDecodeExporterAbsent", "warning", f"absent({P}_exporter_build_info{_sel(o)})",
              "No vllm-specdec-exporter series at all: MTP acceptance is not monitored.",
              "Prometheus has no vllm_specdec_exporter_build_info series: the sidecar is not running, not "
              "scraped, or its series are dropped.")
        alert("VLLMSpecDecodeCounterInvariantViolated", "info",
              f"increase({P}_exporter_invariant_violations_total{_sel(o)}[10m]) > 0",
              "vLLM's speculative-decoding counters break their own invariants.",
              "The exporter at {{ $labels.instance }} (target {{ $labels.target }}) saw {{ $value | humanize }} "
              "invariant violations in 10m: a partial scrape, a parse problem or a broken producer. The "
              "figures of the affected engine are suspect.")
    else:
        eb = by(ENGINE_LEVEL[1])
        rng = o.ranges["5m"]
        acc = f"sum by ({eb}) (rate({src.accepted}[{rng}]))"
        alert("VLLMSpecDecodeCounterInvariantViolated", "info",
              f"{acc}\n  > on({eb}) sum by ({eb}) (rate({src.draft_tokens}[{rng}]))\n"
              f"or\nabs({acc} - on({eb}) sum by ({eb}) (rate({src.per_pos}[{rng}])))\n"
              f"  > on({eb}) 0.001 * {acc} + 0.001",
              "vLLM's speculative-decoding counters break their own invariants.",
              f"Engine {{{{ $labels.engine }}}} of {WHERE} reports accepted tokens that exceed its draft tokens "
              f"or differ from the sum of its per-position counts: a partial scrape or a broken producer.")
    pos1h = name(L, "position_acceptance_rate", "ratio_rate1h")
    k = name(L, "num_speculative_tokens", "max")
    clauses = [f'({pos1h}{{position="{i}"}} < {t["VLLMSpecDecodeSpeculativeTokensWasted"]} and {on} {k} == {i + 1})'
               for i in range(1, c.MAX_SPECULATIVE_TOKENS)]
    alert("VLLMSpecDecodeSpeculativeTokensWasted", "info",
          "(\n  " + "\n  or ".join(clauses) + f"\n)\nand {on} {name(L, 'drafts', 'rate1h')} > {floor:g}",
          "The last speculative position is almost never accepted: a smaller k would save draft compute.",
          f"The last draft position (position {{{{ $labels.position }}}}) of {WHERE} was accepted in "
          f"{{{{ $value | humanizePercentage }}}} of drafts over 1h. Each draft still pays for it; consider "
          f"num_speculative_tokens = {{{{ $labels.position }}}}.")
    rate30 = name(L, "acceptance_rate", "ratio_rate30m")
    alert("VLLMSpecDecodeAcceptanceSuspiciouslyHigh", "info",
          f"{rate30} > {t['VLLMSpecDecodeAcceptanceSuspiciouslyHigh']}\nand {on} {d30} > {floor:g}",
          "Speculative-decoding acceptance is suspiciously close to 100 %.",
          f"Draft acceptance of {WHERE} is {{{{ $value | humanizePercentage }}}} over 30m. Sustained acceptance "
          f"this high goes with repetition loops (draft and target agree on repeating text).")
    return alerts


def rule_file(variant: str, o: Options | None = None) -> dict:
    o = o or default_options()
    src = VARIANTS[variant]
    return {"groups": [
        {"name": f"vllm-specdec-recording-{variant}", "rules": recording_rules(src, o)},
        {"name": f"vllm-specdec-alerts-{variant}", "rules": alert_rules(src, o)},
    ]}


class _Dumper(yaml.SafeDumper):
    pass


def _str(dumper: yaml.SafeDumper, data: str):
    style = "|" if "\n" in data else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", data, style=style)


_Dumper.add_representer(str, _str)


def dump(data: dict, header: str) -> str:
    return header + yaml.dump(data, Dumper=_Dumper, sort_keys=False, width=1000)


HEADER = ("# Generated by `python -m vllm_specdec_exporter.rules` from exporter/vllm_specdec_exporter/config.py.\n"
          "# Do not edit: change the config module and regenerate (CI fails on drift).\n")


def render_all(o: Options | None = None) -> dict[str, str]:
    return {FILES[v]: dump(rule_file(v, o), HEADER + f"# Variant: {v}.\n") for v in VARIANTS}


# The Helm chart's copies carry placeholders its template fills from values
# (prometheusRule.alerts.<name>.threshold, prometheusRule.runbookUrl).
THRESHOLD_PLACEHOLDER = "__THRESHOLD__"
RUNBOOK_PLACEHOLDER = "__RUNBOOK_BASE__"


def render_chart_files() -> dict[str, str]:
    """files/ of the Helm chart: both rule variants with placeholders, and the defaults they stand for."""
    o = default_options()
    chart = Options(ranges=o.ranges, fors=o.fors, thresholds={a: THRESHOLD_PLACEHOLDER for a in THRESHOLDS},
                    runbook_base=RUNBOOK_PLACEHOLDER, dashboard_url="")
    header = HEADER + "# Helm chart copy: __THRESHOLD__ and __RUNBOOK_BASE__ are filled by templates/prometheusrule.yaml.\n"
    out = {f"rules-{v}.yaml": dump(rule_file(v, chart), header) for v in VARIANTS}
    defaults = {"runbookBase": o.runbook_base, "thresholds": {a: float(v) for a, v in o.thresholds.items()}}
    out["rule-defaults.yaml"] = dump(defaults, HEADER)
    return out


def write_or_check(files: dict[str, str], out: Path, check: bool) -> list[str]:
    stale = []
    for filename, text in files.items():
        path = out / filename
        if check:
            if not path.exists() or path.read_text() != text:
                stale.append(str(path))
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
    return stale


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m vllm_specdec_exporter.rules")
    parser.add_argument("out_dir", nargs="?", default="alerts")
    parser.add_argument("--chart-files", help="also write the Helm chart's copies into this folder")
    parser.add_argument("--check", action="store_true", help="fail if the committed files differ")
    args = parser.parse_args(argv)
    stale = write_or_check(render_all(), Path(args.out_dir), args.check)
    if args.chart_files:
        stale += write_or_check(render_chart_files(), Path(args.chart_files), args.check)
    if stale:
        print(f"out of date (run make generate): {', '.join(stale)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
