"""Generate the Prometheus recording rules and alerts from the config module.

Two variants with the same recording-rule names, so the dashboards work with
either: ``sidecar`` reads the exporter's normalised counters (``vllm_specdec_*``),
``vllm-direct`` reads vLLM's own (``vllm:spec_decode_*``) for users who run no
sidecar; alerts that need the sidecar (baseline profiles, target down, exporter
absent) exist only in the first. Ratios are always ratios of summed rates.

    python -m vllm_specdec_exporter.generators.rules [--check] [OUT_DIR]

By concern, each module importing only those above it in this list:

- options.py: the configuration every generator reads, the dashboards too (sources, thresholds,
  Options, windows, levels and recorded names);
- references.py: recorded names an expression reads, and the dangling-reference check;
- recording.py: the recording rules and the per-server pruning;
- expressions.py: each alert's expression and description;
- registry.py: the alert registry (ALERTS), the alerting rules, default_options;
- files.py: the rule files and the Helm chart's copies;
- text.py: the runbook's index, the chart schema's alert names, docs/alerts.md's figures;
- command.py: the command line (__main__.py runs it).

This module only gathers their public names for the callers (tests, bench, the other generators).
"""

from ... import metrics as m
from .command import main
from .files import HEADER, RUNBOOK_PLACEHOLDER, SELECTOR_PLACEHOLDER, dump, placeholder, render_all, render_chart_files, rule_file
from .options import (
    FILES,
    K_LABEL,
    K_LEVEL,
    MODEL_LEVEL,
    THRESHOLD_KEYS,
    THRESHOLD_MEANINGS,
    VARIANTS,
    Options,
    P,
    Rule,
    Source,
    base_window,
    default_thresholds,
    levels,
    long_windows,
    name,
)
from .recording import COST_PER_SERVER, LONG_GROUP_ACCEPTED, LONG_GROUP_RATE, recording_rules
from .references import RECORDED_NAME, WINDOW_VARIABLE, DanglingReference, check_references, recorded, references
from .registry import ALERT_NAMES, ALERTS, DEFAULT_FORS, SEVERITIES, Alert, alert_rules, default_options
from .text import (
    INDEX_BEGIN,
    INDEX_END,
    RUNBOOK_TEMPLATE,
    alert_figures,
    runbook,
    runbook_index,
    with_schema_alerts,
)

__all__ = [
    "ALERTS",
    "ALERT_NAMES",
    "COST_PER_SERVER",
    "DEFAULT_FORS",
    "FILES",
    "HEADER",
    "INDEX_BEGIN",
    "INDEX_END",
    "K_LABEL",
    "K_LEVEL",
    "LONG_GROUP_ACCEPTED",
    "LONG_GROUP_RATE",
    "MODEL_LEVEL",
    "RECORDED_NAME",
    "RUNBOOK_PLACEHOLDER",
    "RUNBOOK_TEMPLATE",
    "SELECTOR_PLACEHOLDER",
    "SEVERITIES",
    "THRESHOLD_KEYS",
    "THRESHOLD_MEANINGS",
    "VARIANTS",
    "WINDOW_VARIABLE",
    "Alert",
    "DanglingReference",
    "Options",
    "P",
    "Rule",
    "Source",
    "alert_figures",
    "alert_rules",
    "base_window",
    "check_references",
    "default_options",
    "default_thresholds",
    "dump",
    "levels",
    "long_windows",
    "m",
    "main",
    "name",
    "placeholder",
    "recorded",
    "recording_rules",
    "references",
    "render_all",
    "render_chart_files",
    "rule_file",
    "runbook",
    "runbook_index",
    "with_schema_alerts",
]
