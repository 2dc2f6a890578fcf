"""Hostile input at the documented bounds (`make bench`, through bench_sidecar.py):
/healthz while /metrics of 4,096 engines is rendered, what label churn leaves in memory,
the parsing worker's peak memory on a 32 MiB payload, and a healthy target's polls beside
five hostile ones. The real `serve` process on loopback. Prints `name: value` lines."""

from __future__ import annotations

import contextlib
import itertools
import json
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

CLI = Path(sys.executable).parent / "vllm-specdec-exporter"
V1 = "vllm:spec_decode_num_"


def engine_block(engine: str, d: int, k: int, model: str = "deepseek-ai/DeepSeek-V4-Pro", extra: str = "") -> str:
    lab = f'engine="{engine}",model_name="{model}"{extra}'
    per_position = [int(0.8 ** (i + 1) * d) for i in range(k)]
    return (
        f"{V1}drafts_total{{{lab}}} {d}\n{V1}draft_tokens_total{{{lab}}} {k * d}\n"
        f"{V1}accepted_tokens_total{{{lab}}} {sum(per_position)}\n"
        + "".join(f'{V1}accepted_tokens_per_pos_total{{{lab},position="{i}"}} {n}\n' for i, n in enumerate(per_position))
    )


def engines_payload(n: int, engines: int = 4096, k: int = 8) -> bytes:
    return "".join(engine_block(str(e), 100_000 * (n + 1), k) for e in range(engines)).encode()


def hostile_payload(cap: int = 32 * 1024 * 1024 - 4096) -> bytes:
    """Spec-decode lines only, just under the 32 MiB cap (~60,000 engines)."""
    out, size, e = [], 0, 0
    while True:
        block = engine_block(str(e), 1000, 2)
        if size + len(block) > cap:
            return "".join(out).encode()
        out.append(block)
        size += len(block)
        e += 1


class Upstream:
    """A threaded HTTP server: body(request number) on /metrics."""

    def __init__(self, body: Callable[[int], bytes]):
        self.requests = 0
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                n = outer.requests
                outer.requests += 1
                data = body(n)
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                # The sidecar cuts a payload over its cap mid-body: what the bench measures, not an error.
                with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                    self.wfile.write(data)

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/metrics"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()


def get(port: int, path: str, timeout: float = 60) -> bytes:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=timeout) as resp:
        return resp.read()


class Serve:
    def __init__(self, config: str, *args: str):
        self.cfg = tempfile.NamedTemporaryFile("w", suffix=".yaml")  # noqa: SIM115 (closed in stop)
        self.cfg.write(config)
        self.cfg.flush()
        self.logs = tempfile.TemporaryFile()  # noqa: SIM115 (a file, not a pipe nobody drains)
        self.proc = subprocess.Popen(
            [
                str(CLI),
                "serve",
                "--config.file",
                self.cfg.name,
                "--web.listen-address",
                "127.0.0.1:0",
                "--log.format",
                "json",
                *args,
            ],
            stdout=subprocess.DEVNULL,
            stderr=self.logs,
        )
        self.port = 0
        deadline = time.monotonic() + 120
        while not self.port and time.monotonic() < deadline:
            time.sleep(0.1)
            for record in self.records():
                if record.get("event") == "listening":
                    self.port = int(record["address"].rsplit(":", 1)[1])
        assert self.port, f"serve did not start: {self.records()[-3:]}"

    def records(self) -> list[dict]:
        self.logs.seek(0)
        return [json.loads(line) for line in self.logs.read().decode().splitlines() if line.startswith("{")]

    def counter(self, prefix: str) -> float:
        text = get(self.port, "/metrics").decode()
        return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(prefix))

    def rss_mb(self, pid: int | None = None) -> float:
        status = Path(f"/proc/{pid or self.proc.pid}/status").read_text()
        return int(next(line for line in status.splitlines() if line.startswith("VmRSS:")).split()[1]) / 1024

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(30)
        self.cfg.close()
        self.logs.close()


def healthz_beside_metrics(interval: str, seconds: float = 30.0) -> dict:
    """/healthz every 20 ms for ``seconds`` while /metrics is scraped in a loop, 4,096 engines (k=8)."""
    up = Upstream(engines_payload)
    serve = Serve(f"targets: [{{url: '{up.url}'}}]\nmax_series_per_target: 4096\nmin_drafts: 1\n", "--poll.interval", interval)
    try:
        while serve.counter('vllm_specdec_exporter_polls_total{result="success"') < 2:
            time.sleep(0.5)
        stop, sizes = threading.Event(), []

        def scrape() -> None:
            while not stop.is_set():
                sizes.append(len(get(serve.port, "/metrics")))

        scraper = threading.Thread(target=scrape)
        scraper.start()
        latencies = []
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            started = time.monotonic()
            get(serve.port, "/healthz", timeout=30)
            latencies.append(time.monotonic() - started)
            time.sleep(0.02)
        stop.set()
        scraper.join(60)
        latencies.sort()
        return {
            "p99_ms": 1000 * latencies[int(0.99 * (len(latencies) - 1))],
            "worst_ms": 1000 * latencies[-1],
            "metrics_mb": max(sizes) / 1e6,
            "scrapes": len(sizes),
        }
    finally:
        serve.stop()
        up.close()


def worker_peak_mb(size: int) -> tuple[float, float]:
    """Peak resident memory of a fresh parsing process over one payload of ``size`` bytes
    (spec-decode lines only: the most a payload can make it hold), and the seconds it took."""
    import asyncio

    from vllm_specdec_exporter import config, parse_pool

    body = hostile_payload(size)

    async def go() -> tuple[int, float]:
        started = time.perf_counter()
        big = len(body) > config.PARSE_BIG_BYTES
        payload = parse_pool.Payload("bench", body, 32 * 1024 * 1024, None, {}, 512)
        await parse_pool._in_worker(big, "bench", parse_pool.read_payload, payload)
        pid = next(iter(parse_pool._pool(big)._processes))
        took = time.perf_counter() - started
        return pid, took

    pid, took = asyncio.run(go())
    status = Path(f"/proc/{pid}/status").read_text()
    parse_pool.close_parse_pool()
    return int(next(line for line in status.splitlines() if line.startswith("VmHWM:")).split()[1]) / 1024, took


def healthy_beside_hostile(seconds: float = 60.0, hostile: int = 5) -> dict:
    """A healthy target (8 engines, ~0.5 MB) beside ``hostile`` targets serving 32 MiB payloads,
    1 s polls: the healthy target's poll gaps, and the peak memory of every process."""
    big = hostile_payload()
    seen: list[float] = []

    def healthy(n: int) -> bytes:
        seen.append(time.monotonic())
        body = "".join(engine_block(str(e), 1000 * (n + 1), 2, "m") for e in range(8))
        return (body + "".join(f'vllm:iteration_tokens_total_bucket{{le="{i}"}} {i}\n' for i in range(7000))).encode()

    ups = [Upstream(healthy)] + [Upstream(lambda n: big) for _ in range(hostile)]
    targets = "".join(f"  - {{name: t{i}, url: '{u.url}'}}\n" for i, u in enumerate(ups))
    serve = Serve(f"targets:\n{targets}poll: {{interval: 1s, timeout: 4s}}\n")
    try:
        while sum(u.requests for u in ups[1:]) < 2 * hostile:
            time.sleep(0.5)
        start = time.monotonic()
        time.sleep(seconds)
        window = [t for t in seen if t >= start]
        gaps = [b - a for a, b in itertools.pairwise(window)] or [seconds]
        children = Path(f"/proc/{serve.proc.pid}/task/{serve.proc.pid}/children").read_text().split()

        def hwm(pid: int | str) -> float:
            status = Path(f"/proc/{pid}/status").read_text()
            return int(next(line for line in status.splitlines() if line.startswith("VmHWM:")).split()[1]) / 1024

        return {
            "polls": len(window),
            "longest_gap_s": max(gaps),
            "median_gap_s": sorted(gaps)[len(gaps) // 2],
            "main_peak_mb": hwm(serve.proc.pid),
            "children_peak_mb": sorted((hwm(c) for c in children), reverse=True),
        }
    finally:
        serve.stop()
        for u in ups:
            u.close()


def the_attack(seconds: float = 40.0, small_targets: int = 3, big_targets: int = 1) -> dict:
    """Issue 29's attack: three targets serving 3.9 MiB and one 31.9 MiB of spec-decode lines
    beside a healthy one (1 s polls), /healthz probed all along: the healthy target's polls,
    the slowest /healthz, and the sum of every process's peak memory (the pod's)."""
    small, big = hostile_payload(int(3.9 * 1024 * 1024)), hostile_payload(int(31.9 * 1024 * 1024))
    seen: list[float] = []

    def healthy(n: int) -> bytes:
        seen.append(time.monotonic())
        body = "".join(engine_block(str(e), 1000 * (n + 1), 2, "m") for e in range(8))
        # ~0.4 MB like vLLM's TP=8/DP=8 payload: parsed in a process, as a real server's is
        return (body + "".join(f'vllm:iteration_tokens_total_bucket{{le="{i}"}} {i}\n' for i in range(7000))).encode()

    ups = [Upstream(healthy)] + [Upstream(lambda n: small) for _ in range(small_targets)]
    ups += [Upstream(lambda n: big) for _ in range(big_targets)]
    targets = "".join(f"  - {{name: t{i}, url: '{u.url}'}}\n" for i, u in enumerate(ups))
    serve = Serve(f"targets:\n{targets}poll: {{interval: 1s, timeout: 4s}}\n")
    try:
        while sum(u.requests for u in ups[1:]) < 2 * (len(ups) - 1):
            time.sleep(0.2)
        start, latencies = time.monotonic(), []
        while time.monotonic() < start + seconds:
            t0 = time.monotonic()
            get(serve.port, "/healthz", timeout=30)
            latencies.append(time.monotonic() - t0)
            time.sleep(0.2)
        window = [t for t in seen if start <= t <= start + seconds]
        gaps = [b - a for a, b in itertools.pairwise(window)]
        pids = [serve.proc.pid, *Path(f"/proc/{serve.proc.pid}/task/{serve.proc.pid}/children").read_text().split()]

        def hwm(pid: int | str) -> float:
            status = Path(f"/proc/{pid}/status").read_text()
            return int(next(line for line in status.splitlines() if line.startswith("VmHWM:")).split()[1]) / 1024

        return {
            "polls": len(window),
            "normal_share": sum(g <= 1.5 for g in gaps) / max(len(gaps), 1),
            "healthz_worst_ms": 1000 * max(latencies),
            "probes": len(latencies),
            "peaks_mb": [hwm(p) for p in pids],
            "hostile_polls": [u.requests for u in ups[1:]],
        }
    finally:
        serve.stop()
        for u in ups:
            u.close()


def main() -> int:
    r = the_attack()
    print(
        f"attack_healthy_polls_in_40_s: {r['polls']}  ({100 * r['normal_share']:.0f} % of gaps <= 1.5 s at a 1 s interval; "
        f"hostile targets polled {r['hostile_polls']})"
    )
    print(f"attack_healthz_worst_ms: {r['healthz_worst_ms']:.0f}  ({r['probes']} probes)")
    print(
        f"attack_pod_peak_mb: {sum(r['peaks_mb']):.0f}  (main {r['peaks_mb'][0]:.0f}, "
        f"children {', '.join(f'{m:.0f}' for m in r['peaks_mb'][1:])})"
    )
    r = the_attack(20.0, small_targets=0)
    print(
        f"one_31_9_mib_target_pod_peak_mb: {sum(r['peaks_mb']):.0f}  (main {r['peaks_mb'][0]:.0f}, "
        f"children {', '.join(f'{m:.0f}' for m in r['peaks_mb'][1:])})"
    )
    for mib in (8, 16, 32):
        peak, took = worker_peak_mb(mib * 1024 * 1024 - 4096)
        print(f"parsing_process_peak_mb_{mib}_mib_payload: {peak:.0f}  ({took:.1f} s)")
    r = healthy_beside_hostile()
    print(
        f"healthy_target_poll_gap_s_beside_5_hostile: median {r['median_gap_s']:.2f}, longest {r['longest_gap_s']:.2f}  "
        f"({r['polls']} polls in 60 s at a 1 s interval)"
    )
    print(
        f"serve_peak_mb_beside_5_hostile: main {r['main_peak_mb']:.0f}, parsing processes "
        f"{', '.join(f'{m:.0f}' for m in r['children_peak_mb'])}"
    )
    for interval in ("5s", "1s"):
        r = healthz_beside_metrics(interval)
        print(
            f"healthz_p99_ms_4096_engines_poll_{interval}: {r['p99_ms']:.0f}  (worst {r['worst_ms']:.0f} ms, "
            f"/metrics {r['metrics_mb']:.1f} MB, {r['scrapes']} scrapes)"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
