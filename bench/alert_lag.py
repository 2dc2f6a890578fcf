"""When the position warnings fire at the shipped cadence, against every group at 30 s
(docs/alerts.md: their 5m positions are recorded every 3 minutes). About 30 minutes, idle.

    .venv/bin/python bench/alert_lag.py

Two simulated DeepSeek-V4-Pro MTP k=2 servers (`simulate`, 2 engines, 40 drafts/s) break
6 minutes after start: one's position 0 falls from 0.924 to 0.38 (FirstPositionAcceptanceLow),
the other's position 1 from 0.687 to 0.02 (DraftChainBroken). Two real Prometheus servers
(Debian's 2.42: `make tools`) scrape both every 30 s: one with alerts/rules-vllm-direct.yaml as
shipped, one with its groups' `interval: 3m` removed. Prints each alert state as first seen
(read every 10 s), in seconds from the break, then `name: value` lines.
"""

from __future__ import annotations

import json
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import yaml
from vllm_specdec_exporter.generators.rules import ALERT_NAMES

REPO = Path(__file__).resolve().parent.parent
CLI = Path(sys.executable).parent / "vllm-specdec-exporter"
BREAK_AT = 360
# The two warnings, named by the registry (the one place alert names are written).
FIRST, CHAIN = (next(n for n in ALERT_NAMES if n.endswith(short)) for short in ("FirstPositionAcceptanceLow", "DraftChainBroken"))
WATCHED = (FIRST, CHAIN)
SCENARIOS = {  # pod label -> the position that breaks and to what
    "partial": [0.38, 0.0098],
    "chain": [0.938, 0.0205],
}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def main() -> int:
    prometheus = shutil.which("prometheus")
    if prometheus is None:
        print("alert_lag: prometheus is not installed (make tools)", file=sys.stderr)
        return 1
    work = Path(tempfile.mkdtemp(prefix="alert-lag-"))
    rules = (REPO / "alerts" / "rules-vllm-direct.yaml").read_text()
    variants = {"shipped": rules, "all_30s": "".join(line for line in rules.splitlines(True) if line != "  interval: 3m\n")}
    assert rules.count("  interval: 3m\n") == 2, "the vLLM-direct rules' two 3-minute groups are not where this expects"
    procs, targets = [], []
    try:
        for pod, broken in SCENARIOS.items():
            scenario = {
                "description": f"{pod}: V4-Pro MTP k=2 breaking at {BREAK_AT}s",
                "model_name": "deepseek-ai/DeepSeek-V4-Pro",
                "engines": 2,
                "k": 2,
                "drafts_per_second": 40,
                "per_position": [0.924, 0.687],
                "step_latency_seconds": 0.035,
                "phases": [{"at": f"{BREAK_AT}s", "per_position": broken}],
            }
            (work / f"{pod}.yaml").write_text(yaml.safe_dump(scenario))
            port = free_port()
            procs.append(
                subprocess.Popen(
                    [str(CLI), "simulate", "--scenario", str(work / f"{pod}.yaml"), "--web.listen-address", f"127.0.0.1:{port}"],
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                )
            )
            targets.append({"targets": [f"127.0.0.1:{port}"], "labels": {"pod": pod, "namespace": "lag"}})
        broken_at = time.time() + BREAK_AT
        apis = {}
        for variant, text in variants.items():
            (work / f"rules-{variant}.yaml").write_text(text)
            config = {
                "global": {"scrape_interval": "30s", "evaluation_interval": "30s"},
                "rule_files": [str(work / f"rules-{variant}.yaml")],
                "scrape_configs": [{"job_name": "vllm", "static_configs": targets}],
            }
            (work / f"prometheus-{variant}.yaml").write_text(json.dumps(config))
            port = free_port()
            procs.append(
                subprocess.Popen(
                    [
                        prometheus,
                        f"--config.file={work / f'prometheus-{variant}.yaml'}",
                        f"--storage.tsdb.path={work / variant}",
                        f"--web.listen-address=127.0.0.1:{port}",
                    ],
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                )
            )
            apis[variant] = f"http://127.0.0.1:{port}/api/v1/alerts"
        seen: dict[tuple[str, str, str, str], float] = {}
        while time.time() < broken_at + 35 * 60 and len([k for k in seen if k[3] == "firing" and k[1] in WATCHED]) < 4:
            for variant, api in apis.items():
                try:
                    with urllib.request.urlopen(api, timeout=5) as r:
                        alerts = json.load(r)["data"]["alerts"]
                except OSError:
                    continue
                for a in alerts:
                    key = (variant, a["labels"]["alertname"], a["labels"].get("pod", ""), a["state"])
                    if key not in seen:
                        seen[key] = time.time() - broken_at
                        print(f"# {variant:8} {key[1]} ({key[2]}) {key[3]} at {seen[key]:+.0f} s", flush=True)
            time.sleep(10)
        for alert in WATCHED:
            pod = "partial" if alert == FIRST else "chain"
            for variant in variants:
                at = seen.get((variant, alert, pod, "firing"))
                print(
                    f"alert_lag_{alert.removeprefix('VLLMSpecDecode')}_{variant}_seconds: {'none' if at is None else f'{at:.0f}'}"
                )
        return 0
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # through main's finally: no server left behind
    sys.exit(main())
