"""The MTP incident on a real vLLM, shared by the e2e checks (e2e_mtp_checks.py) and `make demo-real`.

A tiny DeepSeek-V3 with one MTP layer (build_mtp_model.py) is served by `vllm serve` with
``"method": "mtp"`` behind one forwarded URL, as behind a Kubernetes Service. Rollouts
are server restarts: the next checkpoint boots beside the current one, the URL switches
to it, the old one stops. The sidecar polls the URL; Prometheus with the sidecar rules
scrapes the sidecar, a second Prometheus with the vllm-direct rules scrapes the URL; both
send to Alertmanager with the shipped routing, which posts to the test's webhook.

Phases, in order: healthy (k=2) -> collapse (k=2) -> healthy again -> partial (k=2) ->
beyond-k (the healthy head at k=4, beyond the two steps it was trained for) -> chain (k=2, a
head whose chained step is broken). Each phase's server boots once the one before it serves
(Incident._launcher), so that its engine starts later, as a rolled-out pod's does.

Server flags and the three traps they avoid (measured on this machine kind, December 2026),
in docs/e2e-vllm.md, "The MTP incident":
CPU_MLA for the target and the drafter (AMX_MLA is picked otherwise and the block sizes
do not match), float32, and vLLM's CPU rotary custom op off (wrong for DeepSeek's 3-D query).
"""

from __future__ import annotations

import json
import re
import threading
import time
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path

import alert_path
from driver import Forwarder, Sidecar, VllmServer, _post, free_port, http_get, pick, wait_for
from prompts import MTP_MAX_TOKENS, PROMPTS
from vllm_specdec_exporter.generators import rules
from vllm_specdec_exporter.model import BaselineProfile

MTP_NAME = "tiny-deepseek-v3-mtp"
TARGET = "mtp"  # the sidecar's name for the URL
MTP_FLAGS = ("--dtype", "float32", "--attention-backend", "CPU_MLA",
             "--compilation-config", json.dumps({"custom_ops": ["all", "-rotary_embedding"]}))
# The lowest healthy figure, for k=2 (measured: see README); k=4 gets the same floor, as the
# shipped profiles give k=3..8 the k=2 floor (a longer chain never lowers AL).
PROFILE_AL = 2.5
PROFILES = [{"name": f"tiny-mtp-k{k}", "model": f"^{re.escape(MTP_NAME)}$", "k": k, "method": "mtp",
             "mean_acceptance_length": PROFILE_AL} for k in (2, 4)]
# The sidecar's profiles match the checkpoint (vLLM's --model, read back from /v1/models'
# root), never the served name: the served name matches no profile, as in production
# (issue 30), and the sidecar must find the profile by what the server loaded. The
# vllm-direct rules, which have no /v1/models, keep the served-name profiles above.
SIDECAR_PROFILES = [{**p, "name": f"tiny-mtp-root-k{p['k']}", "model": r"/mtp-[0-9a-f]{12}/[a-z_]+$"} for p in PROFILES]
SIDECAR_WINDOWS = ["8s", "20s", "1m"]  # 8s: the health window (5m shortened); 20s: the demo view's


def spec(k: int) -> dict:
    return {"method": "mtp", "num_speculative_tokens": k, "attention_backend": "CPU_MLA"}


@dataclass
class Phase:
    name: str
    checkpoint: str  # healthy | collapse | partial
    k: int
    server: VllmServer | None = None
    switch: float | None = None  # time.time() its rollout began (the load paused)
    rollout: float | None = None  # time.time() of the first request it served
    figures: dict = field(default_factory=dict)


PLAN = (("healthy", "healthy", 2), ("collapse", "collapse", 2), ("healthy-again", "healthy", 2),
        ("partial", "partial", 2), ("beyond-k", "healthy", 4), ("chain", "chain", 2))
ALIVE = 3  # vLLM servers at once (about 2.2 GB each; the machine is shared)


class Load:
    """Greedy completions through the URL, ``workers`` at a time, until paused or stopped."""

    def __init__(self, url: str, workers: int = 4, max_tokens: int = MTP_MAX_TOKENS):
        self.url, self.workers, self.max_tokens = url, workers, max_tokens
        self._go = threading.Event()
        self._stop = threading.Event()
        self._busy = 0
        self._lock = threading.Lock()
        self.errors = 0
        self.completions = 0
        self._threads = [threading.Thread(target=self._run, args=(i,), daemon=True) for i in range(workers)]
        for t in self._threads:
            t.start()

    def _run(self, i: int) -> None:
        n = i
        while not self._stop.is_set():
            if not self._go.wait(0.2):
                continue
            with self._lock:
                if not self._go.is_set():
                    continue
                self._busy += 1
            try:
                _post(self.url, "/v1/completions", {"prompt": PROMPTS[n % len(PROMPTS)], "max_tokens": self.max_tokens,
                                                    "temperature": 0, "ignore_eos": True}, MTP_NAME)
                self.completions += 1
            except Exception:  # a connection cut by a rollout: the next request goes to the new server
                self.errors += 1
                time.sleep(0.2)
            finally:
                with self._lock:
                    self._busy -= 1
            n += self.workers

    def resume(self) -> float:
        self._go.set()
        return time.time()

    def pause(self) -> None:
        with self._lock:
            self._go.clear()
        wait_for(lambda: self._busy == 0, 120, "the load's requests in flight to finish")

    def stop(self) -> None:
        self._stop.set()
        self._go.clear()


class Incident:
    def __init__(self, es: ExitStack, venv: Path, models: Path, scratch: Path, cache: Path, cli: str,
                 log=print, plan=PLAN):
        self.es, self.venv, self.models, self.scratch, self.cache, self.cli = es, venv, models, scratch, cache, cli
        self.log = log
        self.phases = [Phase(*p) for p in plan]
        self.forwarder = Forwarder()
        es.callback(self.forwarder.close)
        self._launched = 0
        self._stops: list[threading.Thread] = []
        self._closing = threading.Event()
        self._launcher_thread: threading.Thread | None = None
        self.current: Phase | None = None
        self.timings: dict[str, float] = {}
        self.started = time.monotonic()
        es.callback(self._stop_all)

    # --- servers -----------------------------------------------------------------------
    def _launcher(self) -> None:
        """Boot the phases' servers in order, each once the one before it serves, at most ALIVE.

        A rollout is a restart for the sidecar only if the new server's engine started after
        the old one's (vLLM's _created; an earlier one reads as an older server answering), so
        a server may not boot beside its predecessor, which it could overtake (three booting
        side by side from the start did: the collapse's server started 1 s before the healthy
        one's, and the sidecar read the rollout as an older server answering). Each boots during
        the phases before its own."""
        while not self._closing.is_set() and self._launched < len(self.phases):
            before = self.phases[self._launched - 1].server if self._launched else None
            if self._alive() < ALIVE and (before is None or before.started_seconds is not None
                                          or http_get(before.url + "/health", timeout=1)[0] == 200):
                p = self.phases[self._launched]
                server = VllmServer(self.venv, self.models, self.scratch, self.cache, p.name, free_port(), spec(p.k),
                                    MTP_FLAGS, target=self.models / p.checkpoint, served_name=MTP_NAME)
                server.launch()  # seen by ready() only once launched (the first launch starts the fork server)
                p.server = server
                self._launched += 1
            else:
                self._closing.wait(0.5)

    def _alive(self) -> int:
        return sum(1 for p in self.phases if p.server is not None and p.server.proc is not None
                   and p.server.proc.poll() is None)

    def _stop_all(self) -> None:
        self._closing.set()
        if self._launcher_thread is not None:
            self._launcher_thread.join()
        for t in self._stops:
            t.join()
        for p in self.phases:
            if p.server is not None:
                p.server.stop()

    def boot(self) -> None:
        self._launcher_thread = threading.Thread(target=self._launcher, daemon=True)
        self._launcher_thread.start()

    def ready(self, phase: Phase) -> VllmServer:
        wait_for(lambda: phase.server is not None or not self._launcher_thread.is_alive(), 900,
                 f"the launch of {phase.name}'s server", step=0.5)
        assert phase.server is not None, f"the launcher ended before {phase.name}'s server (see the log above)"
        phase.server.wait_ready(900)
        self.timings[f"ready {phase.name}"] = phase.server.started_seconds
        return phase.server

    # --- the page path -------------------------------------------------------------------
    def start_monitoring(self, health_window: str = "8s") -> None:
        """Receiver, Alertmanager, the sidecar (health over ``health_window``: 8s, the rules' 5m
        shortened; the demo's view shows 20s), both Prometheus servers and the load (paused)."""
        scratch = self.scratch
        self.receiver = alert_path.Receiver()
        self.es.callback(self.receiver.close)
        self.am = alert_path.alertmanager(self.es, scratch / "alertmanager", self.receiver.url)
        config = {"targets": [{"name": TARGET, "url": self.forwarder.url + "/metrics", "method": "mtp"}],
                  "web": {"listen_address": "127.0.0.1:0"},
                  "poll": {"interval": "500ms", "timeout": "5s", "max_backoff": "1s"},
                  "windows": SIDECAR_WINDOWS, "health": {"window": health_window}, "min_drafts": 10,
                  "baselines": {"profiles": SIDECAR_PROFILES}}
        self.sidecar = Sidecar(self.cli, scratch, "exporter-mtp", self.forwarder.url, config)
        self.es.callback(self.sidecar.stop)
        profiles = [BaselineProfile(p["name"], re.compile(p["model"]), p["k"], p["mean_acceptance_length"], p["method"])
                    for p in PROFILES]
        sidecar_rules = rules.dump(rules.rule_file("sidecar", alert_path.options()), "")
        direct_rules = rules.dump(rules.rule_file("vllm-direct", alert_path.options(profiles)), "")
        exporter = self.sidecar.url.removeprefix("http://")
        self.prom = alert_path.prometheus(self.es, scratch / "prometheus", sidecar_rules, [exporter], self.am, "sidecar")
        self.direct = alert_path.prometheus(self.es, scratch / "prometheus-direct", direct_rules,
                                            [self.forwarder.url.removeprefix("http://")], self.am, "vllm-direct")
        self.load = Load(self.forwarder.url)
        self.es.callback(self.load.stop)

    # --- rollouts -----------------------------------------------------------------------
    def roll_out(self, phase: Phase) -> float:
        """The URL moves to ``phase``'s freshly started server; the old one stops. Returns the
        time of the first request the new server gets (the load resumes then)."""
        phase.switch = time.time()
        self.load.pause() if self.current is not None else None
        self.ready(phase)
        old = self.current
        self.forwarder.backend = phase.server.port
        self.current = phase
        if old is not None:  # stopped beside the new one (the launcher boots the next when it is gone)
            t = threading.Thread(target=old.server.stop, daemon=True)
            t.start()
            self._stops.append(t)
        # The sidecar's first poll of the new server sees its counters at zero, as after a real
        # restart (load before that poll could lift a counter above the old server's).
        self.sidecar.caught_up()
        phase.rollout = self.load.resume()
        self.log(f"rolled out {phase.name} ({phase.checkpoint}, k={phase.k}) on :{phase.server.port}")
        return phase.rollout

    # --- reading the sidecar ---------------------------------------------------------------
    def health(self) -> str | None:
        states = pick(self.sidecar.metrics(), "vllm_specdec_health", target=TARGET, model_name=MTP_NAME)
        return next((dict(k)["vllm_specdec_health"] for k, v in states.items() if v == 1.0), None)

    def model_info(self) -> dict[str, str] | None:
        """The labels of the sidecar's model_info for the served model (what /v1/models said)."""
        found = pick(self.sidecar.metrics(), "vllm_specdec_model_info", target=TARGET, model_name=MTP_NAME)
        return dict(next(iter(found))) if found else None

    def causes(self) -> set[str]:
        return {dict(k)["cause"] for k in pick(self.sidecar.metrics(), "vllm_specdec_diagnosis_info", target=TARGET)}

    def window(self, name: str, window: str = "8s") -> dict:
        return pick(self.sidecar.metrics(), name, target=TARGET, window=window)
