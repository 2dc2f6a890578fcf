"""The real `serve` process against loopback targets: start it on port 0 (its bound port read
from its log), read its endpoints, count its polls; and the biggest payload a target may serve."""

from __future__ import annotations

import json
import subprocess
import time
import urllib.request

from conftest import cli_path

V1 = "vllm:spec_decode_num_"


def biggest_payload(cap: int) -> bytes:
    """Spec-decode lines only, just under the default 32 MiB cap: the most parsing work a
    target can ask for (~60,000 engines, every line on the fast path)."""
    lines, size, engine = [], 0, 0
    while True:
        lab = f'engine="{engine}",model_name="deepseek-ai/DeepSeek-V4-Pro"'
        block = (f"{V1}drafts_total{{{lab}}} 1000\n{V1}draft_tokens_total{{{lab}}} 2000\n"
                 f"{V1}accepted_tokens_total{{{lab}}} 1500\n"
                 f'{V1}accepted_tokens_per_pos_total{{{lab},position="0"}} 900\n'
                 f'{V1}accepted_tokens_per_pos_total{{{lab},position="1"}} 600\n')
        if size + len(block) > cap:
            return "".join(lines).encode()
        lines.append(block)
        size += len(block)
        engine += 1


def start_serve(*args: str) -> tuple[subprocess.Popen, int]:
    proc = subprocess.Popen([cli_path(), "serve", "--web.listen-address", "127.0.0.1:0", "--log.format", "json", *args],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        line = proc.stderr.readline()
        if not line:
            break
        record = json.loads(line)
        if record["event"] == "listening":
            return proc, int(record["address"].rsplit(":", 1)[1])
    proc.kill()
    raise AssertionError(f"serve did not start: {proc.stderr.read()[:2000]!r}")


def get(port: int, path: str, timeout: float = 10) -> tuple[int, bytes]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=timeout) as resp:
        return resp.status, resp.read()


def polls_done(port: int, result: str = "success") -> float:
    _, body = get(port, "/metrics", timeout=60)
    return sum(float(line.rsplit(" ", 1)[1]) for line in body.decode().splitlines()
               if line.startswith("vllm_specdec_exporter_polls_total{") and f'result="{result}"' in line)


def healthy_payload(n: int) -> bytes:
    """8 engines (k=2) growing with the poll number, and ~0.5 MB of other families, as a
    TP=8/DP=8 vLLM serves: over the size parsed on the event loop."""
    lines = []
    for e in range(8):
        lab = f'engine="{e}",model_name="m"'
        d = 1000 * (n + 1)
        lines += [f"{V1}drafts_total{{{lab}}} {d}", f"{V1}draft_tokens_total{{{lab}}} {2 * d}",
                  f"{V1}accepted_tokens_total{{{lab}}} {int(1.5 * d)}",
                  f'{V1}accepted_tokens_per_pos_total{{{lab},position="0"}} {int(0.9 * d)}',
                  f'{V1}accepted_tokens_per_pos_total{{{lab},position="1"}} {int(0.6 * d)}']
    lines += [f'vllm:iteration_tokens_total_bucket{{engine="{i % 8}",le="{i}",model_name="m"}} {i}' for i in range(7000)]
    return ("\n".join(lines) + "\n").encode()
