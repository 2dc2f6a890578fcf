"""The text generated from the alert registry (generators/rules/text.py): the runbook's index, the Helm
schema's alert names, and the figures of docs/alerts.md's table (generators/pages.py), which come from
the Options the rule expressions are built from (issue 32 item 2)."""

from __future__ import annotations

import dataclasses
import re

import pytest
from conftest import REPO
from vllm_specdec_exporter.generators import pages, rules


def test_the_runbook_index_lists_every_alert_with_its_registry_severity_and_for():
    text = (REPO / "alerts" / "runbook.md").read_text()
    block = text.split(rules.INDEX_BEGIN)[1].split(rules.INDEX_END)[0]
    rows = [r.split(" | ") for r in block.strip().splitlines()[2:]]
    assert [(re.search(r"\[(\w+)\]", r[0]).group(1), r[1], r[2]) for r in rows] == \
        [(a.name, a.severity, a.for_) for a in rules.ALERTS]
    # The index comes from the registry, not the template: a row edited by hand is drift (make generate fixes it).
    template = (REPO / "alerts" / rules.RUNBOOK_TEMPLATE).read_text()
    assert rules.INDEX_BEGIN not in template and rules.runbook(template) == text
    assert rules.runbook(template) != text.replace("| critical |", "| warning |", 1)


def test_the_helm_schema_takes_exactly_the_registry_alerts():
    import json

    schema = json.loads((REPO / "helm" / "vllm-specdec-exporter" / "values.schema.json").read_text())
    alerts = schema["properties"]["prometheusRule"]["properties"]["alerts"]
    assert list(alerts["properties"]) == list(rules.ALERT_NAMES)
    assert alerts["additionalProperties"] is False


def row(table: str, alert: str) -> str:
    return next(r for r in table.splitlines() if f"[`{alert}`]" in r)


def alert_exprs(o: rules.Options) -> dict[str, str]:
    return {r["alert"]: r["expr"] for g in rules.rule_file("sidecar", o)["groups"] for r in g["rules"] if "alert" in r}


def test_the_alert_table_states_the_thresholds_the_rules_are_built_from():
    """A threshold changed in the Options changes the table as it changes the rule: no figure of the
    table is written by hand beside the one the expression reads."""
    o = rules.default_options()
    changed = dataclasses.replace(o, day_range="2d", thresholds={
        **o.thresholds, "chain_conditional_floor": "0.2", "collapse_margin": "0.2", "degraded_fraction": "0.5"})
    before, after = pages.alerts_table(o), pages.alerts_table(changed)
    chain, collapsed = "VLLMSpecDecodeDraftChainBroken", "VLLMSpecDecodeAcceptanceCollapsed"
    below, position0 = "VLLMSpecDecodeAcceptanceBelowBaseline", "VLLMSpecDecodeFirstPositionAcceptanceLow"
    assert "`chain_conditional_floor` (0.3)" in row(before, chain)
    assert "the model's best busy server's was at 0.6 or more over an hour within 1d" in row(before, chain)
    assert "`chain_conditional_floor` (0.2)" in row(after, chain)
    assert "the model's best busy server's was at 0.4 or more over an hour within 2d" in row(after, chain)
    assert "< 1 + `collapse_margin` (1.1)" in row(before, collapsed) and "0.1: every broken-collapse" in row(before, collapsed)
    assert "< 1 + `collapse_margin` (1.2)" in row(after, collapsed) and "0.2: every broken-collapse" in row(after, collapsed)
    assert "`degraded_fraction` (0.5)" in row(after, below) and "(V4-Flash k=7: 0.071)" in row(after, position0)
    # The rules read the same figures.
    exprs = alert_exprs(changed)
    assert "< 0.2\n" in exprs[chain] and ">= 2 * 0.2)" in exprs[chain]
    assert "< 1 + 0.2\n" in exprs[collapsed] and "1 + 0.5 * (" in exprs[below]
    # And the shipped table is the committed one (test_docs.py checks the whole block).
    assert before in (REPO / "docs" / "alerts.md").read_text()


def test_every_figure_of_the_alert_notes_is_one_the_rules_are_built_from():
    names = {n for notes in pages.ALERT_NOTES.values() for text in notes for n in re.findall(r"\{(\w+)\}", text)}
    figures = rules.alert_figures(rules.default_options(), rules.ALERT_NAMES[0])
    assert names and names <= set(figures), names - set(figures)


def section(runbook: str, alert: str) -> str:
    return runbook.split(f"\n## {alert}\n", 1)[1].split("\n## ", 1)[0]


def test_the_runbook_states_the_figures_the_rules_are_built_from():
    """alerts/runbook.md is generated from its template: a threshold, a window or a `for` changed in
    the Options changes every section that states it, as it changes the rule (issue 32 item 3)."""
    template = (REPO / "alerts" / rules.RUNBOOK_TEMPLATE).read_text()
    o = rules.default_options()
    changed = dataclasses.replace(
        o, day_range="2d", fors={**o.fors, "VLLMSpecDecodeAcceptanceCollapsed": "20m"},
        thresholds={**o.thresholds, "collapse_margin": "0.2", "drop_fraction": "0.5", "degraded_fraction": "0.5"})
    before, after = rules.runbook(template, o), rules.runbook(template, changed)
    assert before == (REPO / "alerts" / "runbook.md").read_text()
    collapsed, dropped = "VLLMSpecDecodeAcceptanceCollapsed", "VLLMSpecDecodeAcceptanceDropped"
    assert "**Severity: critical.** Mean acceptance length over 5m below 1.1" in section(before, collapsed)
    assert "draft/s, for 10m." in section(before, collapsed)
    assert "**Severity: critical.** Mean acceptance length over 5m below 1.2" in section(after, collapsed)
    assert "draft/s, for 20m." in section(after, collapsed)
    assert "a window reads AL below 1.2\nonly if fewer than 20 % of its drafts" in section(after, f"{collapsed}Fast")
    assert "more than 40 % below the model's best hour of the last 1d" in section(before, dropped)
    assert "more than 50 % below the model's best hour of the last 2d" in section(after, dropped)
    assert "AcceptanceDropped's 50 %." in section(after, "VLLMSpecDecodeAcceptanceShifted")
    below = section(after, "VLLMSpecDecodeAcceptanceBelowBaseline")
    assert "`degraded_fraction`\n(0.5)" in below and "gains under 50 % of what" in below
    # The V4-Flash k=7 floor follows degraded_fraction by config.position0_share: 0.5 x 0.99 / 7.
    assert "allows 0.071;" in section(after, "VLLMSpecDecodeFirstPositionAcceptanceLow")
    # Each alert's section states its own severity from the registry.
    for a in rules.ALERTS:
        assert section(before, a.name).startswith(f"\n**Severity: {a.severity}.**")


def test_a_figure_the_rules_do_not_have_stops_the_runbook_naming_it():
    with pytest.raises(ValueError, match=r"section VLLMSpecDecodeNoBaseline: \$\{colapse_margin\} is not a figure"):
        rules.runbook("# r\n\n## VLLMSpecDecodeNoBaseline\n\nbelow ${colapse_margin}\n")
    # `for` belongs to an alert's section only.
    with pytest.raises(ValueError, match=r"section \(the preamble\): \$\{for\}"):
        rules.runbook("# r\n\nfor ${for}\n\n## VLLMSpecDecodeNoBaseline\n")


def test_the_settled_share_is_one_figure_for_the_rules_and_the_runbook(monkeypatch):
    """config.ALERT_RECORDED_SHARE decides both the rules' "full hour" count and the gap the runbook
    says a restarted pod may be down and come back settled."""
    from vllm_specdec_exporter import config

    template = (REPO / "alerts" / rules.RUNBOOK_TEMPLATE).read_text()
    shifted = "VLLMSpecDecodeAcceptanceShifted"
    assert "down for more than 6m," in section(rules.runbook(template), shifted)
    monkeypatch.setattr(config, "ALERT_RECORDED_SHARE", 0.8)
    assert "down for more than 12m," in section(rules.runbook(template), shifted)
    long_group = rules.rule_file("sidecar")["groups"][1]["rules"]
    # The settled servers (the reference's), recorded once for every rule that sums over them.
    settled = next(r["expr"] for r in long_group if r["record"].endswith(":vllm_specdec_settled_num_speculative_tokens:count_values"))
    assert "count_over_time(namespace_pod_model_name:vllm_specdec_num_speculative_tokens:max[1h]) < 16" in settled
