"""Rules and alerts: drift, promtool lint and unit tests, amtool, runbook, and end
to end with a real Prometheus 2.42 scraping the real exporter fed by the simulator."""

from __future__ import annotations

import re
import subprocess
import time
from pathlib import Path

import pytest
import yaml

import promtool_cases
from conftest import REPO
from prom_harness import Prom, collapse_scenario, stack, tool, wait_for
from vllm_specdec_exporter import rules

ALERTS = REPO / "alerts"
ALERT_NAMES = [
    "VLLMSpecDecodeAcceptanceCollapsed", "VLLMSpecDecodeAcceptanceBelowBaseline", "VLLMSpecDecodeAcceptanceDropped",
    "VLLMSpecDecodeNotDrafting", "VLLMSpecDecodeTargetDown", "VLLMSpecDecodeExporterAbsent",
    "VLLMSpecDecodeCounterInvariantViolated", "VLLMSpecDecodeSpeculativeTokensWasted",
    "VLLMSpecDecodeAcceptanceSuspiciouslyHigh",
]
SIDECAR_ONLY = {"VLLMSpecDecodeAcceptanceBelowBaseline", "VLLMSpecDecodeTargetDown", "VLLMSpecDecodeExporterAbsent"}


def alerts_in(path: Path) -> dict[str, dict]:
    data = yaml.safe_load(path.read_text())
    return {r["alert"]: r for g in data["groups"] for r in g["rules"] if "alert" in r}


def test_generated_rules_are_committed():
    assert rules.main(["--check", str(ALERTS)]) == 0, "alerts/*.yaml are stale: run make generate"


def test_generated_promtool_suites_are_committed():
    for filename, text in promtool_cases.render().items():
        assert (ALERTS / "tests" / filename).read_text() == text, f"alerts/tests/{filename} is stale: make generate"


def test_alert_names_severities_and_annotations():
    sidecar, direct = alerts_in(ALERTS / "rules.yaml"), alerts_in(ALERTS / "rules-vllm-direct.yaml")
    assert sorted(sidecar) == sorted(ALERT_NAMES)
    assert sorted(direct) == sorted(set(ALERT_NAMES) - SIDECAR_ONLY)
    for rule in [*sidecar.values(), *direct.values()]:
        assert rule["labels"]["severity"] in ("critical", "warning", "info")
        ann = rule["annotations"]
        assert "{{" not in ann["summary"] and "{{" in ann["description"] or rule["alert"] == "VLLMSpecDecodeExporterAbsent"
        assert ann["runbook_url"].endswith("#" + rule["alert"].lower())
    assert sidecar["VLLMSpecDecodeAcceptanceCollapsed"]["labels"]["severity"] == "critical"


def test_runbook_has_a_section_per_alert():
    text = (ALERTS / "runbook.md").read_text()
    sections = re.findall(r"^## (\w+)$", text, re.M)
    assert sections == ALERT_NAMES


def test_promtool_check_rules_with_lint():
    proc = subprocess.run([tool("promtool"), "check", "rules", "--lint=all", "--lint-fatal",
                           str(ALERTS / "rules.yaml"), str(ALERTS / "rules-vllm-direct.yaml")],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.count("SUCCESS") == 2


@pytest.mark.parametrize("suite", ["sidecar.yaml", "vllm-direct.yaml"])
def test_promtool_unit_tests(suite):
    proc = subprocess.run([tool("promtool"), "test", "rules", suite], cwd=ALERTS / "tests",
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "SUCCESS" in proc.stdout


def test_promtool_unit_tests_can_fail(tmp_path):
    """A wrong expectation must fail the suite: the suites really evaluate the rules."""
    text = (ALERTS / "tests" / "sidecar.yaml").read_text().replace("is 1.036 over 5m", "is 1.037 over 5m")
    (tmp_path / "rules.yaml").write_text((ALERTS / "rules.yaml").read_text())
    (tmp_path / "t").mkdir()
    (tmp_path / "t" / "s.yaml").write_text(text)
    proc = subprocess.run([tool("promtool"), "test", "rules", "s.yaml"], cwd=tmp_path / "t",
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0 and "1.036" in proc.stdout + proc.stderr


def test_alertmanager_example_is_valid():
    proc = subprocess.run([tool("amtool"), "check-config", str(ALERTS / "alertmanager.example.yaml")],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "SUCCESS" in proc.stdout


# --- End to end: a real Prometheus, the real exporter, the simulator ---

SCENARIO = collapse_scenario(30)
HEALTHY_AL = 1 + 0.924 + 0.687
# Short windows and for: so the test takes a minute; the expressions keep their shape.
E2E_OPTIONS = rules.Options(
    ranges={"5m": "8s", "30m": "16s", "1h": "30s"},
    fors={**rules.DEFAULT_FORS, "VLLMSpecDecodeAcceptanceCollapsed": "4s"},
    thresholds=rules.default_options().thresholds, day_range="60s", drop_offset="16s",
)


AL_RULE = "namespace_pod_model_name:vllm_specdec_mean_acceptance_length:ratio_rate5m"


def our_alerts(prom: Prom) -> list[tuple[str, str]]:
    return sorted((r["metric"]["alertname"], r["metric"]["alertstate"])
                  for r in prom.query('ALERTS{alertname=~"VLLMSpecDecode.*"}'))


def run_collapse(direct: bool) -> None:
    variant = "vllm-direct" if direct else "sidecar"
    exporter_config = {"windows": ["8s", "1m"], "health": {"window": "8s"}, "min_drafts": 10}
    with stack(SCENARIO, rules.dump(rules.rule_file(variant, E2E_OPTIONS), ""), sidecar=not direct,
               exporter_config=exporter_config) as st:
        check_collapse(st.prom, st.sim_started, direct)


def check_collapse(prom: Prom, started: float, direct: bool) -> None:
    # Healthy phase (scenario time < 30 s): rules agree with the exporter's own
    # window gauges; nothing pending.
    wait_for(lambda: prom.value(AL_RULE), 25, "the recording rules to produce data")
    checks = 0
    while time.monotonic() - started < 26:
        al = prom.value(AL_RULE)
        assert al == pytest.approx(HEALTHY_AL, rel=0.02), al
        if not direct:
            gauge = prom.value('vllm_specdec_mean_acceptance_length{window="8s"}')
            assert gauge is not None and al == pytest.approx(gauge, rel=0.02), (al, gauge)
            rate = prom.value("namespace_pod_model_name:vllm_specdec_acceptance_rate:ratio_rate5m")
            assert rate == pytest.approx(prom.value('vllm_specdec_acceptance_rate{window="8s"}'), rel=0.02)
            pos = prom.value('namespace_pod_model_name:vllm_specdec_position_acceptance_rate:ratio_rate5m{position="1"}')
            assert pos == pytest.approx(0.687, rel=0.02)
        assert our_alerts(prom) == [], our_alerts(prom)
        checks += 1
        time.sleep(1)
    assert checks >= 3
    # The collapse at 30s: pending, then firing.
    wait_for(lambda: ("VLLMSpecDecodeAcceptanceCollapsed", "pending") in our_alerts(prom), 40, "Collapsed pending")
    wait_for(lambda: ("VLLMSpecDecodeAcceptanceCollapsed", "firing") in our_alerts(prom), 20, "Collapsed firing")
    firing = prom.query('ALERTS{alertname="VLLMSpecDecodeAcceptanceCollapsed",alertstate="firing"}')[0]["metric"]
    assert firing["severity"] == "critical" and firing["model_name"] == "deepseek-ai/DeepSeek-V4-Pro"
    assert prom.value(AL_RULE) < 1.1


def test_e2e_sidecar_rules_on_a_real_prometheus():
    run_collapse(direct=False)


def test_e2e_direct_rules_on_a_real_prometheus():
    run_collapse(direct=True)
