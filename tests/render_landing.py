"""docs/landing.png: a real screenshot of the exporter's landing page during `make demo`.

Starts the demo (the simulated 8-engine DeepSeek-V4-Pro vLLM and the real exporter) at
its default speed (1, as `make demo`), waits until scenario second ~140 (engine 5 lost its
draft head at 40 s, every engine at 100 s; the restart that fixes it comes at 160 s), and
has headless Chromium (Debian's `chromium`: apt-get install -y chromium) take the page,
its charts with the fall in them. Not run by make test:

    .venv/bin/python tests/render_landing.py [--out docs/landing.png] [--at 140] [--speed 1]
"""

from __future__ import annotations

import argparse
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=str(REPO / "docs" / "landing.png"))
    ap.add_argument("--at", type=float, default=140.0, help="scenario second to take the picture at")
    ap.add_argument("--speed", type=float, default=1.0)
    args = ap.parse_args()
    browser = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
    if not browser:
        print("no chromium: apt-get install -y chromium", file=sys.stderr)
        return 2
    exporter, simulator = free_port(), free_port()
    cli = str(Path(sys.executable).parent / "vllm-specdec-exporter")
    demo = subprocess.Popen([cli, "demo", "--speed", str(args.speed), "--exporter-port", str(exporter),
                             "--simulator-port", str(simulator)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        url = f"http://127.0.0.1:{exporter}/"
        started = time.monotonic()
        while True:
            try:
                urllib.request.urlopen(url, timeout=1).read()
                break
            except OSError:
                if time.monotonic() - started > 30:
                    print("the demo did not start", file=sys.stderr)
                    return 1
                time.sleep(0.2)
        time.sleep(max(0.0, args.at / args.speed - (time.monotonic() - started)))
        subprocess.run([browser, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                        "--window-size=1200,900", f"--screenshot={args.out}", url],
                       check=True, capture_output=True, timeout=60)
        print(f"wrote {args.out} at scenario second ~{args.at:g}")
        return 0
    finally:
        demo.terminate()
        demo.wait(timeout=10)


if __name__ == "__main__":
    sys.exit(main())
