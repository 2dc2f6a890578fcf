"""One registry per concept (issue 12 item 4): each alert is one record in
generators/rules.py ALERTS, and its name is written nowhere else that is code or
configuration; what is generated from the registry is checked for drift elsewhere
(test_rules.py), and the Alertmanager example is checked against it here."""

from __future__ import annotations

import re
import subprocess

import yaml
from conftest import REPO
from vllm_specdec_exporter.generators import rules

REGISTRY = "exporter/vllm_specdec_exporter/generators/rules.py"
# Generated from the registry (and drift-checked), or checked against it below.
GENERATED = {"alerts/rules.yaml", "alerts/rules-vllm-direct.yaml", "alerts/tests/sidecar.yaml",
             "alerts/tests/vllm-direct.yaml", "alerts/runbook.md", "alerts/alertmanager.example.yaml",
             "helm/vllm-specdec-exporter/values.schema.json"}
# tests/ writes the names on purpose: an expectation must not come from the code under test.
# helm/.../ci/ are test inputs of the chart, validated by the generated schema.
EXEMPT_FOLDERS = ("tests/", "helm/vllm-specdec-exporter/files/", "helm/vllm-specdec-exporter/ci/")
SOURCES = (".py", ".yaml", ".yml", ".json", ".tpl", ".sh")


def code_lines(path: str) -> list[str]:
    """Lines that are code or configuration: comment lines are documentation."""
    return [line for line in (REPO / path).read_text().splitlines() if not line.lstrip().startswith(("#", "//"))]


def test_each_alert_name_is_written_only_in_the_registry():
    files = subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True, check=True).stdout.split()
    pattern = re.compile("|".join(rules.ALERT_NAMES))
    assert len(rules.ALERT_NAMES) == len(set(rules.ALERT_NAMES)) == 17
    found = {}
    for path in files:
        if (not path.endswith(SOURCES) or path in GENERATED or path == REGISTRY or path.startswith(EXEMPT_FOLDERS)
                or not (REPO / path).exists()):
            continue
        hits = [line.strip() for line in code_lines(path) if pattern.search(line)]
        if hits:
            found[path] = hits
    assert found == {}, "alert names written outside the registry"
    # Within the registry, each name once.
    text = (REPO / REGISTRY).read_text()
    assert {n: len(re.findall(rf'"{n}"', text)) for n in rules.ALERT_NAMES} == dict.fromkeys(rules.ALERT_NAMES, 1)


def test_the_runbook_index_lists_every_alert_with_its_registry_severity_and_for():
    text = (REPO / "alerts" / "runbook.md").read_text()
    block = text.split(rules.INDEX_BEGIN)[1].split(rules.INDEX_END)[0]
    rows = [r.split(" | ") for r in block.strip().splitlines()[2:]]
    assert [(re.search(r"\[(\w+)\]", r[0]).group(1), r[1], r[2]) for r in rows] == \
        [(a.name, a.severity, a.for_) for a in rules.ALERTS]
    # A registry change the committed runbook does not have is drift (make generate fixes it).
    assert rules.with_runbook_index(text) == text
    assert rules.with_runbook_index(text.replace("| critical |", "| warning |", 1)) == text


def _matches(matchers: list[str], labels: dict[str, str]) -> bool:
    for m in matchers:
        key, op, value = re.fullmatch(r'(\w+)(=~|!~|!=|=)"(.*)"', m).groups()
        got = labels.get(key, "")
        ok = re.fullmatch(value, got) is not None if "~" in op else got == value
        if ok != (not op.startswith("!")):
            return False
    return True


def test_the_alertmanager_example_routes_every_registry_alert_by_its_severity():
    am = yaml.safe_load((REPO / "alerts" / "alertmanager.example.yaml").read_text())
    receiver = {"critical": "page", "warning": "ticket", "info": "null"}
    for a in rules.ALERTS:
        labels = {"alertname": a.name, "severity": a.severity}
        route = next((r for r in am["route"]["routes"] if _matches(r["matchers"], labels)), am["route"])
        assert route["receiver"] == receiver[a.severity], a.name
    # Every inhibition's source and target name alerts that exist, and only a higher or equal
    # severity inhibits a lower one (a warning never silences a page).
    rank = {s: i for i, s in enumerate(rules.SEVERITIES)}
    for rule in am["inhibit_rules"]:
        sources = [a for a in rules.ALERTS if _matches(rule["source_matchers"], {"alertname": a.name})]
        targets = [a for a in rules.ALERTS if _matches(rule["target_matchers"], {"alertname": a.name})]
        assert sources and targets, rule
        assert max(rank[a.severity] for a in sources) <= min(rank[a.severity] for a in targets), rule


def test_the_matcher_reader_refuses_what_does_not_match():
    assert _matches(['alertname=~"VLLMSpecDecode.*"', 'severity="critical"'], {"alertname": "VLLMSpecDecodeX",
                                                                               "severity": "critical"})
    assert not _matches(['alertname=~"VLLMSpecDecode.*"', 'severity="critical"'], {"alertname": "VLLMSpecDecodeX",
                                                                                   "severity": "info"})
    assert not _matches(['alertname="VLLMSpecDecodeX"'], {"alertname": "VLLMSpecDecodeXY"})


def test_the_helm_schema_takes_exactly_the_registry_alerts():
    import json

    schema = json.loads((REPO / "helm" / "vllm-specdec-exporter" / "values.schema.json").read_text())
    alerts = schema["properties"]["prometheusRule"]["properties"]["alerts"]
    assert list(alerts["properties"]) == list(rules.ALERT_NAMES)
    assert alerts["additionalProperties"] is False
