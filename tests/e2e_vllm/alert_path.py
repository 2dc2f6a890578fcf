"""The page path of the MTP e2e checks: Prometheus with the shipped rules, Alertmanager with the
shipped example routing, and a webhook receiver inside the test. All on 127.0.0.1, ports read back.

- Prometheus 2.42 (Debian's), twice: the sidecar rules scraping the exporter, and the
  vllm-direct rules scraping vLLM itself (the two variants record the same names from
  different inputs, so they cannot share one server). Each tags its alerts with an
  external label ``rules`` so the receiver can tell them apart. Windows and ``for``
  shortened as tests/prom_harness.py does (the expressions keep their shape).
- Alertmanager (Debian's prometheus-alertmanager): alerts/alertmanager.example.yaml as
  shipped (routes, inhibitions), with its receivers pointed at the test's webhook
  (``page``: PagerDuty there, ``/page`` here; ``ticket``: ``/ticket``) and its timers
  shortened like the windows. Cluster listening off, loopback only.
- The receiver: aiohttp on its own thread, keeping every notification with its arrival time.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import threading
import time
from contextlib import ExitStack
from pathlib import Path

import yaml
from aiohttp import web
from conftest import REPO
from prom_harness import Prom, http_ok, listening_port, process, tool, wait_for
from vllm_specdec_exporter.generators import rules

EXAMPLE_ROUTING = REPO / "alerts" / "alertmanager.example.yaml"
# Alertmanager's timers, shortened like the rule windows (30s / 5m / 1h / 4h shipped).
AM_TIMERS = {"group_wait": "2s", "group_interval": "4s", "repeat_interval": "1h"}
# `for` shortened keeping production's order (2m < 10m < 15m < 30m) and about its margins:
# a collapse crosses the warnings' thresholds a few seconds before its own (the windows are
# seconds here), and must still page first so that the shipped inhibitions mute the warnings.
SHORT_FORS = {"2m": "4s", "10m": "8s", "15m": "16s", "30m": "20s"}
# The alerts this test drives, with their `for` shortened; the others keep theirs (so
# ExporterAbsent, TargetDown, ... cannot fire in a run of a few minutes).
DRIVEN = ("VLLMSpecDecodeAcceptanceCollapsed", "VLLMSpecDecodeAcceptanceCollapsedFast",
          "VLLMSpecDecodeFirstPositionAcceptanceLow", "VLLMSpecDecodeAcceptanceBelowBaseline",
          "VLLMSpecDecodeSpeculativeTokensWasted", "VLLMSpecDecodeEngineCollapsed")


def options(profiles=(), aliases=()) -> rules.Options:
    """prom_harness.E2E_OPTIONS's windows (5m -> 8s, 30m -> 16s, 1h -> 30s), the fast collapse's
    2m -> 8s, and SHORT_FORS on the alerts driven here."""
    return rules.Options(
        ranges={"5m": "8s", "30m": "16s", "1h": "30s", "2m": "8s"},
        fors={**rules.DEFAULT_FORS, **{a: SHORT_FORS[rules.DEFAULT_FORS[a]] for a in DRIVEN}},
        thresholds=rules.default_options().thresholds, day_range="60s", unreachable_range="30s",
        profiles=tuple(profiles), aliases=tuple(aliases))


def routing(webhook: str) -> dict:
    """The shipped example routing, its receivers pointed at ``webhook`` and its timers shortened."""
    cfg = yaml.safe_load(EXAMPLE_ROUTING.read_text())
    names = {r["name"] for r in cfg["receivers"]}
    assert names == {"page", "ticket", "null"}, names
    cfg["receivers"] = [
        {"name": "page", "webhook_configs": [{"url": f"{webhook}/page", "send_resolved": True}]},
        {"name": "ticket", "webhook_configs": [{"url": f"{webhook}/ticket", "send_resolved": True}]},
        {"name": "null"},
    ]
    cfg["route"] |= AM_TIMERS
    for r in cfg["route"]["routes"]:
        if "repeat_interval" in r:
            r["repeat_interval"] = AM_TIMERS["repeat_interval"]
    return cfg


class Receiver:
    """A webhook receiver on 127.0.0.1 (aiohttp, its own thread and loop)."""

    def __init__(self):
        self.notifications: list[dict] = []  # each: {"path", "at" (time.time()), "body"}
        self._lock = threading.Lock()
        self._ready = threading.Event()
        self._loop = asyncio.new_event_loop()
        threading.Thread(target=self._run, daemon=True).start()
        self._ready.wait(10)
        self.url = f"http://127.0.0.1:{self.port}"

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)

        async def hook(request: web.Request) -> web.Response:
            body = await request.json()
            with self._lock:
                self.notifications.append({"path": request.path, "at": time.time(), "body": body})
            return web.Response(text="ok")

        async def start() -> None:
            app = web.Application()
            app.router.add_post("/page", hook)
            app.router.add_post("/ticket", hook)
            self._runner = web.AppRunner(app)
            await self._runner.setup()
            site = web.TCPSite(self._runner, "127.0.0.1", 0)
            await site.start()
            self.port = site._server.sockets[0].getsockname()[1]
            self._ready.set()

        self._loop.run_until_complete(start())
        self._loop.run_forever()

    def alerts(self, since: float = 0.0, path: str | None = None, status: str | None = None, **labels) -> list[dict]:
        """Every alert in the notifications received after ``since`` (on ``path``), with its arrival
        time and path, whose labels include ``labels`` (and whose status is ``status``)."""
        out = []
        with self._lock:
            notes = list(self.notifications)
        for n in notes:
            if n["at"] < since or (path and n["path"] != path):
                continue
            for a in n["body"]["alerts"]:
                if status and a["status"] != status:
                    continue
                if all(a["labels"].get(k) == v for k, v in labels.items()):
                    out.append(a | {"_at": n["at"], "_path": n["path"]})
        return out

    def firing(self, since: float = 0.0, path: str | None = None) -> set[tuple[str, str]]:
        """(alertname, rules) whose latest notification after ``since`` says firing. Alertmanager
        sends every alert of a group in each notification, so one resolved alert can arrive beside
        others of the group still firing: only the latest status of each alert tells."""
        latest = {}
        for a in sorted(self.alerts(since, path), key=lambda a: a["_at"]):
            latest[a["labels"]["alertname"], a["labels"]["rules"]] = a["status"]
        return {k for k, v in latest.items() if v == "firing"}

    def close(self) -> None:
        async def stop() -> None:
            await self._runner.cleanup()
        asyncio.run_coroutine_threadsafe(stop(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)


def serve_listening(es: ExitStack, args: list[str], log: Path) -> str:
    proc = es.enter_context(process(args, log))
    port = wait_for(lambda: listening_port(proc), 60, f"{args[0]} to listen (log: {log})", step=0.1)
    return f"127.0.0.1:{port}"


def alertmanager(es: ExitStack, tmp: Path, webhook: str) -> str:
    tmp.mkdir()
    (tmp / "alertmanager.yml").write_text(yaml.safe_dump(routing(webhook), sort_keys=False))
    amtool = tool("amtool")
    res = subprocess.run([amtool, "check-config", str(tmp / "alertmanager.yml")], capture_output=True, text=True)
    assert res.returncode == 0, res.stdout + res.stderr
    address = serve_listening(es, [tool("prometheus-alertmanager"), f"--config.file={tmp / 'alertmanager.yml'}",
                                   f"--storage.path={tmp / 'data'}", "--web.listen-address=127.0.0.1:0",
                                   "--cluster.listen-address="], tmp / "alertmanager.log")
    wait_for(lambda: http_ok(f"http://{address}/-/ready"), 30, "Alertmanager to be ready", step=0.2)
    return address


def prometheus(es: ExitStack, tmp: Path, rules_text: str, targets: list[str], am: str, variant: str) -> Prom:
    """Prometheus with ``rules_text``, scraping ``targets`` every second, sending to Alertmanager ``am``."""
    tmp.mkdir()
    (tmp / "rules.yaml").write_text(rules_text)
    (tmp / "prometheus.yml").write_text(yaml.safe_dump({
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s", "external_labels": {"rules": variant}},
        "rule_files": [str(tmp / "rules.yaml")],
        "alerting": {"alertmanagers": [{"static_configs": [{"targets": [am]}]}]},
        "scrape_configs": [{"job_name": "e2e-mtp", "static_configs": [{"targets": targets}]}],
    }))
    address = serve_listening(es, [tool("prometheus"), f"--config.file={tmp / 'prometheus.yml'}",
                                   f"--storage.tsdb.path={tmp / 'tsdb'}", "--web.listen-address=127.0.0.1:0"],
                              tmp / "prometheus.log")
    prom = Prom(address)
    wait_for(lambda: http_ok(f"{prom.base}/-/ready"), 30, "Prometheus to be ready", step=0.2)
    return prom


def am_alerts(am: str) -> list[dict]:
    """What Alertmanager holds now (its v2 API), routed or not."""
    import urllib.request
    with urllib.request.urlopen(f"http://{am}/api/v2/alerts", timeout=5) as resp:
        return json.load(resp)
