"""A real Prometheus 2.42 on loopback scraping the real exporter and/or the simulator.

Everything runs as real processes (the console script and Debian's prometheus),
with temporary config and TSDB directories, listening on port 0 (the bound port is
read back from the kernel), and is stopped by PID afterwards. ``collapse_stack``
is the one stack the end-to-end tests share (conftest's ``collapse_stack`` fixture).
"""

from __future__ import annotations

import json
import shutil
import tempfile
import time
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path

import yaml
from conftest import cli_path, require
from processes import Prom, http_ok, listening_port, process, start, wait_for  # noqa: F401  (re-exported to the tests)
from vllm_specdec_exporter.generators import rules

COLLAPSE_AT = 40  # scenario seconds at which the shared scenario's draft head breaks
# 40, not 30: the healthy phase read back must hold, after the rules' first data, a full 8 s window
# and three evaluations. The stack starts beside the suite's longest tests; on a busy machine its first
# rule data came 17-20 s after the scenario's start and 30 s left 1-2 points (seen twice). Free in time:
# its readers run last, minutes later.
COLLAPSE_MODEL = "deepseek-ai/DeepSeek-V4-Pro"
DEAD_RANK_AT = 10  # ... and at which one rank of the server beside it loses its head
DEAD_RANK_MODEL = "deepseek-ai/DeepSeek-V4-Flash"


def sim_scenario(description: str, model: str, per_position: list[float], *, engines: int = 1,
                 then: list[float] | None = None, at_seconds: int = 4, only: str = "") -> str:
    """``engines`` engines of ``model`` at k=2, 50 drafts a second at ``per_position``; ``then``: their
    positions from ``at_seconds`` on (on the engines ``only`` lists, if given)."""
    engines_of = f"\n    engines: {only}" if only else ""
    phases = f"\nphases:\n  - at: {at_seconds}s{engines_of}\n    per_position: {then}" if then else ""
    return f"""
description: e2e -- {description}
model_name: {model}
engines: {engines}
k: 2
drafts_per_second: 50
per_position: {per_position}{phases}
"""


def _healthy_then_broken(description: str, model: str, at_seconds: int, engines: str = "") -> str:
    """2 engines of healthy MTP k=2 whose draft head breaks at ``at_seconds`` (on ``engines`` only, if given)."""
    return sim_scenario(description, model, [0.924, 0.687], engines=2, then=[0.0357, 0.0008], at_seconds=at_seconds,
                        only=engines)


def collapse_scenario(at_seconds: int) -> str:
    """2 engines of healthy DeepSeek-V4-Pro MTP k=2 whose draft head breaks at ``at_seconds``."""
    return _healthy_then_broken(f"healthy, then the draft head breaks at {at_seconds}s", COLLAPSE_MODEL, at_seconds)


def dead_rank_scenario(at_seconds: int) -> str:
    """A second server beside it: 2 healthy engines of another model, engine 1 of which
    loses its draft head at ``at_seconds`` (one dead data-parallel rank)."""
    return _healthy_then_broken(f"one of two ranks loses its draft head at {at_seconds}s", DEAD_RANK_MODEL,
                                at_seconds, engines="[1]")


HEALTHY_AL = 1 + 0.924 + 0.687
# Short windows and for: so the scenario takes a minute; the expressions keep their shape.
E2E_OPTIONS = rules.Options(
    ranges={"5m": "8s", "30m": "16s", "1h": "30s"},
    fors={**rules.DEFAULT_FORS, "VLLMSpecDecodeAcceptanceCollapsed": "4s", "VLLMSpecDecodeEngineCollapsed": "4s"},
    thresholds=rules.default_options().thresholds, day_range="60s", unreachable_range="30s",
)
E2E_EXPORTER_CONFIG = {"windows": ["8s", "1m"], "health": {"window": "8s"}, "min_drafts": 10}


def tool(name: str) -> str:
    path = shutil.which(name)
    require(path is not None, f"{name} (make tools installs Debian's prometheus and prometheus-alertmanager)")
    return path


def serve(es: ExitStack, args: list[str], log: Path) -> str:
    """Start ``args`` (told to listen on 127.0.0.1:0) and return host:port once it listens."""
    return start(es, args, log)[1]


def prometheus(es: ExitStack, tmp: Path, rules_text: str, targets: list[str] | Path) -> Prom:
    """A Prometheus in ``tmp`` with ``rules_text`` loaded, scraping ``targets``; 1 s scrape and evaluation.
    ``targets`` as a path: a file_sd file (write_targets), re-read as soon as it is rewritten."""
    tmp.mkdir()
    (tmp / "rules.yaml").write_text(rules_text)
    sd = ({"file_sd_configs": [{"files": [str(targets)], "refresh_interval": "1s"}]} if isinstance(targets, Path)
          else {"static_configs": [{"targets": targets}]})
    (tmp / "prometheus.yml").write_text(yaml.safe_dump({
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "rule_files": [str(tmp / "rules.yaml")],
        "scrape_configs": [{"job_name": "e2e", **sd}],
    }))
    prom = Prom(serve(es, [tool("prometheus"), f"--config.file={tmp / 'prometheus.yml'}",
                           f"--storage.tsdb.path={tmp / 'tsdb'}", "--web.listen-address=127.0.0.1:0"],
                      tmp / "prometheus.log"))
    wait_for(lambda: http_ok(f"{prom.base}/-/ready"), 30, "Prometheus to be ready", step=0.2)
    return prom


def write_targets(path: Path, targets: list[tuple[str, dict[str, str]]]) -> None:
    """A file_sd file: each (host:port, its target labels, e.g. namespace and pod); written then
    renamed, so Prometheus never reads half of it."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps([{"targets": [address], "labels": labels} for address, labels in targets]))
    tmp.rename(path)


def simulator(es: ExitStack, tmp: Path, name: str, scenario: str) -> str:
    """A simulated vLLM server (``vllm-specdec-exporter simulate``) playing ``scenario``: its host:port."""
    (tmp / f"{name}.yaml").write_text(scenario)
    return serve(es, [cli_path(), "simulate", "--scenario", str(tmp / f"{name}.yaml"),
                      "--web.listen-address", "127.0.0.1:0"], tmp / f"{name}.log")


def sidecar(es: ExitStack, tmp: Path, name: str, vllm: str, exporter_config: dict) -> str:
    """The exporter beside one vLLM server (its target named "vllm", as in a pod): its host:port."""
    config = {"targets": [{"name": "vllm", "url": f"http://{vllm}/metrics"}], "web": {"listen_address": "127.0.0.1:0"},
              "poll": {"interval": "1s"}, **exporter_config}
    (tmp / f"{name}.yaml").write_text(yaml.safe_dump(config))
    return serve(es, [cli_path(), "serve", "--config.file", str(tmp / f"{name}.yaml"), "--log.format", "json"],
                 tmp / f"{name}.log")


@dataclass
class Stack:
    prom: Prom
    started: float  # wall-clock (Prometheus's) time at which the scenario clock started
    simulator_url: str
    exporter_url: str | None
    direct_prom: Prom | None = None  # the vllm-direct rules' own Prometheus, scraping vLLM alone


@contextmanager
def stack(scenario: str, rules_text: str, *, sidecar: bool = True, scrape_simulator: bool = False,
          exporter_config: dict | None = None, direct_rules_text: str | None = None, beside: str | None = None):
    """Simulator (+ exporter) + Prometheus with ``rules_text`` loaded. With ``direct_rules_text``, a
    second Prometheus scrapes the simulator alone with those (vllm-direct) rules: the two rule
    variants record the same names from different inputs, so they cannot share one. ``beside``:
    a second simulated server (another model), polled and scraped alongside the first."""
    tool("prometheus")
    with ExitStack() as es:
        tmp = Path(es.enter_context(tempfile.TemporaryDirectory()))
        (tmp / "scenario.yaml").write_text(scenario)
        started = time.time()
        sim = serve(es, [cli_path(), "simulate", "--scenario", str(tmp / "scenario.yaml"),
                         "--web.listen-address", "127.0.0.1:0"], tmp / "sim.log")
        sims = [sim]
        if beside is not None:
            (tmp / "beside.yaml").write_text(beside)
            sims.append(serve(es, [cli_path(), "simulate", "--scenario", str(tmp / "beside.yaml"),
                                   "--web.listen-address", "127.0.0.1:0"], tmp / "beside.log"))
        targets = []
        exporter_url = None
        if sidecar:
            polled = [{"name": f"vllm-{i}" if i else "vllm", "url": f"http://{s}/metrics"} for i, s in enumerate(sims)]
            config = {"targets": polled, "web": {"listen_address": "127.0.0.1:0"},
                      "poll": {"interval": "1s"}, **(exporter_config or {})}
            (tmp / "exporter.yaml").write_text(yaml.safe_dump(config))
            exporter = serve(es, [cli_path(), "serve", "--config.file", str(tmp / "exporter.yaml"),
                                  "--log.format", "json"], tmp / "exporter.log")
            targets.append(exporter)
            exporter_url = f"http://{exporter}"
        if scrape_simulator or not sidecar:
            targets += sims
        prom = prometheus(es, tmp / "prometheus", rules_text, targets)
        direct = prometheus(es, tmp / "direct", direct_rules_text, sims) if direct_rules_text is not None else None
        yield Stack(prom, started, f"http://{sim}", exporter_url, direct)


@contextmanager
def collapse_stack():
    """The stack every end-to-end test reads: 2 healthy engines of COLLAPSE_MODEL whose draft
    head breaks at COLLAPSE_AT s, and beside them a server of DEAD_RANK_MODEL whose engine 1
    loses its head at DEAD_RANK_AT s; the exporter (windows of 8s) and vLLM scraped by ``prom``
    with the sidecar rules, vLLM by ``direct_prom`` with the vllm-direct rules (both with
    E2E_OPTIONS). Tests wait for the end state they need, then read earlier phases back."""
    with stack(collapse_scenario(COLLAPSE_AT), rules.dump(rules.rule_file("sidecar", E2E_OPTIONS), ""),
               scrape_simulator=True, exporter_config=E2E_EXPORTER_CONFIG, beside=dead_rank_scenario(DEAD_RANK_AT),
               direct_rules_text=rules.dump(rules.rule_file("vllm-direct", E2E_OPTIONS), "")) as st:
        yield st
