"""A real Prometheus 2.42 on loopback scraping the real exporter and/or the simulator.

Everything runs as real processes (the console script and Debian's prometheus),
with temporary config and TSDB directories, and is stopped by PID afterwards.
"""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import tempfile
import time
import urllib.parse
import urllib.request
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path

import yaml

from conftest import cli_path, require


def collapse_scenario(at_seconds: int) -> str:
    """2 engines of healthy DeepSeek-V4-Pro MTP k=2 whose draft head breaks at ``at_seconds``."""
    return f"""
description: e2e -- healthy, then the draft head breaks at {at_seconds}s
model_name: deepseek-ai/DeepSeek-V4-Pro
engines: 2
k: 2
drafts_per_second: 50
per_position: [0.924, 0.687]
phases:
  - at: {at_seconds}s
    per_position: [0.0357, 0.0008]
"""


def tool(name: str) -> str:
    path = shutil.which(name)
    require(path is not None, f"{name} (make tools installs Debian's prometheus and prometheus-alertmanager)")
    return path


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

    def _get(self, path: str) -> dict:
        with urllib.request.urlopen(self.base + path, timeout=10) as resp:
            out = json.load(resp)
        assert out["status"] == "success", out
        return out["data"]

    def query(self, q: str) -> list[dict]:
        return self._get(f"/api/v1/query?query={urllib.parse.quote(q)}")["result"]

    def query_range(self, q: str, start: float, end: float, step: float) -> list[dict]:
        return self._get(f"/api/v1/query_range?query={urllib.parse.quote(q)}&start={start}&end={end}&step={step}")["result"]

    def value(self, q: str) -> float | None:
        result = self.query(q)
        return float(result[0]["value"][1]) if len(result) == 1 else None

    def label_values(self, label: str, match: str) -> list[str]:
        return self._get(f"/api/v1/label/{label}/values?match[]={urllib.parse.quote(match)}")


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


@dataclass
class Stack:
    prom: Prom
    sim_started: float  # monotonic time the scenario clock started
    simulator_url: str
    exporter_url: str | None


@contextmanager
def stack(scenario: str, rules_text: str, *, sidecar: bool = True, scrape_simulator: bool = False,
          exporter_config: dict | None = None):
    """Simulator (+ exporter) + Prometheus with ``rules_text`` loaded, 1 s scrape and evaluation."""
    prometheus = tool("prometheus")
    with ExitStack() as es:
        tmp = Path(es.enter_context(tempfile.TemporaryDirectory()))
        (tmp / "scenario.yaml").write_text(scenario)
        sim_port, exp_port, prom_port = free_port(), free_port(), free_port()
        sim_started = time.monotonic()
        es.enter_context(process([cli_path(), "simulate", "--scenario", str(tmp / "scenario.yaml"),
                                  "--web.listen-address", f"127.0.0.1:{sim_port}"], tmp / "sim.log"))
        sim = f"127.0.0.1:{sim_port}"
        targets = []
        exporter_url = None
        if sidecar:
            config = {"targets": [{"url": f"http://{sim}/metrics"}], "listen_address": f"127.0.0.1:{exp_port}",
                      "poll": {"interval": "1s"}, **(exporter_config or {})}
            (tmp / "exporter.yaml").write_text(yaml.safe_dump(config))
            es.enter_context(process([cli_path(), "serve", "--config.file", str(tmp / "exporter.yaml"),
                                      "--log.format", "json"], tmp / "exporter.log"))
            targets.append(f"127.0.0.1:{exp_port}")
            exporter_url = f"http://127.0.0.1:{exp_port}"
        if scrape_simulator or not sidecar:
            targets.append(sim)
        (tmp / "rules.yaml").write_text(rules_text)
        (tmp / "prometheus.yml").write_text(yaml.safe_dump({
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
            "rule_files": [str(tmp / "rules.yaml")],
            "scrape_configs": [{"job_name": "e2e", "static_configs": [{"targets": targets}]}],
        }))
        for t in targets:
            wait_for(lambda t=t: http_ok(f"http://{t}/metrics"), 30, f"scrape target {t}")
        es.enter_context(process([prometheus, f"--config.file={tmp / 'prometheus.yml'}",
                                  f"--storage.tsdb.path={tmp / 'tsdb'}",
                                  f"--web.listen-address=127.0.0.1:{prom_port}"], tmp / "prometheus.log"))
        prom = Prom(prom_port)
        wait_for(lambda: http_ok(f"{prom.base}/-/ready"), 30, "Prometheus to be ready")
        yield Stack(prom, sim_started, f"http://{sim}", exporter_url)
