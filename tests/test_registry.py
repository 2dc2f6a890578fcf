"""One registry per concept (issue 12 item 4): each alert is one record in
generators/rules/registry.py ALERTS, and its name is written nowhere else that is code or
configuration; what is generated from the registry is checked for drift elsewhere
(test_rules.py, test_rules_text.py), and the Alertmanager example is checked against it here.
Its expressions (generators/rules/context.py Expr) render config.py's shared threshold formulas."""

from __future__ import annotations

import re
import subprocess

import yaml
from conftest import REPO
from vllm_specdec_exporter.generators import rules

REGISTRY = "exporter/vllm_specdec_exporter/generators/rules/registry.py"
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
    assert len(rules.ALERT_NAMES) == len(set(rules.ALERT_NAMES)) == 18
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


def test_the_degraded_thresholds_promql_is_the_sidecars_formula():
    """Issue 32 item 3: config.degraded_floor and config.position0_share are the one definition of the
    'degraded' threshold: the sidecar computes them on floats, the alerts render them as PromQL."""
    from vllm_specdec_exporter import config
    from vllm_specdec_exporter.generators.rules.context import Expr

    assert str(config.degraded_floor(Expr("0.75"), Expr("b"))) == "1 + 0.75 * (b - 1)"
    assert str(config.position0_share(Expr("0.75"), Expr("b"), Expr("on(x) k"))) == "0.75 * (b - 1) / on(x) k"
    for al, k in ((2.27, 2), (1.99, 7), (1.79, 1)):
        rendered = config.degraded_floor(Expr(f"{config.DETECTION.degraded_fraction!r}"), Expr(repr(al)))
        assert eval(str(rendered)) == config.DETECTION.degraded_floor_under(al)
        share = config.position0_share(Expr("0.75"), Expr(repr(al)), Expr(str(k)))
        assert min(0.5, eval(str(share))) == config.DETECTION.position0_floor_under(al, k)
    alerts = {r["alert"]: r["expr"] for g in rules.rule_file("sidecar")["groups"] for r in g["rules"] if "alert" in r}
    baseline = "namespace_pod_model_name:vllm_specdec_baseline_mean_acceptance_length:max"
    assert f"1 + 0.75 * ({baseline} - 1)" in alerts["VLLMSpecDecodeAcceptanceBelowBaseline"]
    assert f"clamp_max(0.75 * ({baseline} - 1) / on(" in alerts["VLLMSpecDecodeFirstPositionAcceptanceLow"]
