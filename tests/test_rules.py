"""Rules and alerts: drift, promtool lint and unit tests, amtool, runbook, and end
to end with a real Prometheus 2.42 scraping the real exporter fed by the simulator."""

from __future__ import annotations

import json
import re
import shutil
import socket
import subprocess
import tempfile
import time
import urllib.parse
import urllib.request
from contextlib import ExitStack, contextmanager
from pathlib import Path

import pytest
import yaml

import promtool_cases
from conftest import REPO, cli_path, require
from vllm_specdec_exporter import rules

ALERTS = REPO / "alerts"
ALERT_NAMES = [
    "VLLMSpecDecodeAcceptanceCollapsed", "VLLMSpecDecodeAcceptanceBelowBaseline", "VLLMSpecDecodeAcceptanceDropped",
    "VLLMSpecDecodeNotDrafting", "VLLMSpecDecodeTargetDown", "VLLMSpecDecodeExporterAbsent",
    "VLLMSpecDecodeCounterInvariantViolated", "VLLMSpecDecodeSpeculativeTokensWasted",
    "VLLMSpecDecodeAcceptanceSuspiciouslyHigh",
]
SIDECAR_ONLY = {"VLLMSpecDecodeAcceptanceBelowBaseline", "VLLMSpecDecodeTargetDown", "VLLMSpecDecodeExporterAbsent"}


def tool(name: str) -> str:
    path = shutil.which(name)
    require(path is not None, f"{name} (make tools installs Debian's prometheus and prometheus-alertmanager)")
    return path


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

SCENARIO = """
description: e2e -- healthy, then the draft head breaks at 30s
model_name: deepseek-ai/DeepSeek-V4-Pro
engines: 2
k: 2
drafts_per_second: 50
per_position: [0.924, 0.687]
phases:
  - at: 30s
    per_position: [0.0357, 0.0008]
"""
HEALTHY_AL = 1 + 0.924 + 0.687
# Short windows and for: so the test takes a minute; the expressions keep their shape.
E2E_OPTIONS = rules.Options(
    ranges={"5m": "8s", "30m": "16s", "1h": "30s"},
    fors={**rules.DEFAULT_FORS, "VLLMSpecDecodeAcceptanceCollapsed": "4s"},
    day_range="60s", drop_offset="16s",
)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(predicate, timeout: float, what: str, step: float = 0.5):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(step)
    raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")


def http_ok(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as resp:
            return resp.status == 200
    except OSError:
        return False


class Prom:
    def __init__(self, port: int):
        self.base = f"http://127.0.0.1:{port}"

    def query(self, q: str) -> list[dict]:
        url = f"{self.base}/api/v1/query?query={urllib.parse.quote(q)}"
        with urllib.request.urlopen(url, timeout=5) as resp:
            out = json.load(resp)
        assert out["status"] == "success", out
        return out["data"]["result"]

    def value(self, q: str) -> float | None:
        result = self.query(q)
        return float(result[0]["value"][1]) if len(result) == 1 else None


@contextmanager
def process(args: list[str], log: Path):
    with log.open("wb") as out:
        proc = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT)
    try:
        yield proc
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()


@contextmanager
def stack(direct: bool):
    """Simulator, (exporter,) Prometheus with the generated rules, all on loopback."""
    prometheus = tool("prometheus")
    with ExitStack() as es:
        tmp = Path(es.enter_context(tempfile.TemporaryDirectory()))
        (tmp / "scenario.yaml").write_text(SCENARIO)
        sim_port, exp_port, prom_port = free_port(), free_port(), free_port()
        sim_started = time.monotonic()  # scenario time runs from here
        es.enter_context(process([cli_path(), "simulate", "--scenario", str(tmp / "scenario.yaml"),
                                  "--web.listen-address", f"127.0.0.1:{sim_port}"], tmp / "sim.log"))
        target = f"127.0.0.1:{sim_port}"
        if not direct:
            (tmp / "exporter.yaml").write_text(yaml.safe_dump({
                "targets": [{"url": f"http://127.0.0.1:{sim_port}/metrics"}],
                "listen_address": f"127.0.0.1:{exp_port}", "poll": {"interval": "1s"},
                "windows": ["8s", "1m"], "health": {"window": "8s"}, "min_drafts": 10}))
            es.enter_context(process([cli_path(), "serve", "--config.file", str(tmp / "exporter.yaml"),
                                      "--log.format", "json"], tmp / "exporter.log"))
            target = f"127.0.0.1:{exp_port}"
        variant = "vllm-direct" if direct else "sidecar"
        (tmp / "rules.yaml").write_text(rules.dump(rules.rule_file(variant, E2E_OPTIONS), ""))
        (tmp / "prometheus.yml").write_text(yaml.safe_dump({
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
            "rule_files": [str(tmp / "rules.yaml")],
            "scrape_configs": [{"job_name": "e2e", "static_configs": [{"targets": [target]}]}],
        }))
        wait_for(lambda: http_ok(f"http://{target}/metrics"), 30, "the scrape target")
        es.enter_context(process([prometheus, f"--config.file={tmp / 'prometheus.yml'}",
                                  f"--storage.tsdb.path={tmp / 'tsdb'}",
                                  f"--web.listen-address=127.0.0.1:{prom_port}"], tmp / "prometheus.log"))
        prom = Prom(prom_port)
        wait_for(lambda: http_ok(f"{prom.base}/-/ready"), 30, "Prometheus to be ready")
        yield prom, sim_started


AL_RULE = "namespace_pod_model_name:vllm_specdec_mean_acceptance_length:ratio_rate5m"


def our_alerts(prom: Prom) -> list[tuple[str, str]]:
    return sorted((r["metric"]["alertname"], r["metric"]["alertstate"])
                  for r in prom.query('ALERTS{alertname=~"VLLMSpecDecode.*"}'))


def run_collapse(prom: Prom, started: float, direct: bool) -> None:
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
    with stack(direct=False) as (prom, started):
        run_collapse(prom, started, direct=False)


def test_e2e_direct_rules_on_a_real_prometheus():
    with stack(direct=True) as (prom, started):
        run_collapse(prom, started, direct=True)
