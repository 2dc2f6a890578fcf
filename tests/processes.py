"""Real processes on loopback, for the tests and the benches alike (no pytest here: bench/
imports it too): start a program told to listen on port 0 and read the bound port back from
the kernel, wait for a condition with a deadline, stop what was started, and query a
Prometheus's HTTP API."""

from __future__ import annotations

import json
import os
import subprocess
import time
import urllib.parse
import urllib.request
from contextlib import ExitStack, contextmanager
from pathlib import Path


class Timeout(AssertionError):
    """A condition a test or a bench waited for did not come."""


def listening_port(proc: subprocess.Popen) -> int | None:
    """The TCP port ``proc`` listens on, once it does (its sockets' inodes in /proc/net/tcp)."""
    if proc.poll() is not None:
        raise AssertionError(f"{proc.args[0]} exited with {proc.returncode}")
    inodes = set()
    for fd in os.listdir(f"/proc/{proc.pid}/fd"):
        try:
            link = os.readlink(f"/proc/{proc.pid}/fd/{fd}")
        except OSError:  # closed meanwhile
            continue
        if link.startswith("socket:["):
            inodes.add(link[8:-1])
    with open("/proc/net/tcp") as f:
        for line in f.readlines()[1:]:
            fields = line.split()
            if fields[3] == "0A" and fields[9] in inodes:  # 0A: LISTEN
                return int(fields[1].rsplit(":", 1)[1], 16)
    return None


def wait_for(predicate, timeout: float, what: str, step: float = 0.5):
    """Poll ``predicate`` until it is truthy (at least once, even past the deadline)."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise Timeout(f"timed out after {max(timeout, 0):.0f}s waiting for {what}")
        time.sleep(step)


def get(url: str, timeout: float = 30) -> bytes:
    with urllib.request.urlopen(url, timeout=timeout) as resp:
        return resp.read()


def http_ok(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as resp:
            return resp.status == 200
    except OSError:
        return False


@contextmanager
def process(args: list[str], log: Path, env: dict[str, str] | None = None):
    """``args`` running with its output in ``log`` (in ``env``, or this process's environment);
    terminated (then killed) on exit."""
    with log.open("wb") as out:
        proc = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT, env=env)
    try:
        yield proc
    finally:
        proc.terminate()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)


def start(es: ExitStack, args: list[str], log: Path, env: dict[str, str] | None = None) -> tuple[subprocess.Popen, str]:
    """Start ``args`` (told to listen on 127.0.0.1:0); the process and host:port once it listens."""
    proc = es.enter_context(process(args, log, env))
    port = wait_for(lambda: listening_port(proc), 30, f"{args[0]} to listen (log: {log})", step=0.1)
    return proc, f"127.0.0.1:{port}"


class Prom:
    """A Prometheus's HTTP API."""

    def __init__(self, address: str):  # host:port
        self.base = f"http://{address}"

    def _get(self, path: str) -> dict:
        with urllib.request.urlopen(self.base + path, timeout=10) as resp:
            out = json.load(resp)
        assert out["status"] == "success", out
        return out["data"]

    def query(self, q: str, at: float | None = None) -> list[dict]:
        when = f"&time={at}" if at is not None else ""
        return self._get(f"/api/v1/query?query={urllib.parse.quote(q)}{when}")["result"]

    def query_range(self, q: str, start: float, end: float, step: float) -> list[dict]:
        return self._get(f"/api/v1/query_range?query={urllib.parse.quote(q)}&start={start}&end={end}&step={step}")["result"]

    def alerts(self) -> list[dict]:
        """Prometheus's own alert list: labels, annotations and state of every pending or firing alert."""
        return self._get("/api/v1/alerts")["alerts"]

    def value(self, q: str, at: float | None = None) -> float | None:
        result = self.query(q, at)
        return float(result[0]["value"][1]) if len(result) == 1 else None

    def series(self, q: str, start: float, end: float) -> dict[float, float]:
        """The one series ``q`` gives over [start, end], evaluated every second: {time: value}."""
        result = self.query_range(q, start, end, 1)
        assert len(result) == 1, (q, [r["metric"] for r in result])
        return {float(t): float(v) for t, v in result[0]["values"]}

    def label_values(self, label: str, match: str) -> list[str]:
        return self._get(f"/api/v1/label/{label}/values?match[]={urllib.parse.quote(match)}")
