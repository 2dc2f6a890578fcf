"""A sidecar killed outright (SIGKILL, the OOM killer) takes its parsing processes with it.
They waited on their call queue, whose write end they hold too, so they never saw EOF and
ran on (~160 MB each) after every killed `serve`: found as orphans after test runs."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

from http_fixtures import LoopbackServer, prom
from test_bounded_parsing import healthy_payload
from test_scale import polls_done, start_serve


def children(pid: int) -> list[int]:
    out = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                out.append(int(entry.name))
    return out


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def test_parsing_processes_exit_when_serve_is_killed(tmp_path):
    assert len(healthy_payload(0)) > 256 * 1024  # parsed in a parsing process, not on the loop
    with LoopbackServer(lambda n: prom(healthy_payload(n))) as server:
        cfg = tmp_path / "config.yaml"
        cfg.write_text(f"targets:\n  - {{name: t, url: '{server.url}'}}\npoll: {{interval: 500ms}}\n")
        proc, port = start_serve("--config.file", str(cfg))
        try:
            deadline = time.monotonic() + 60
            while polls_done(port) < 2 and time.monotonic() < deadline:
                time.sleep(0.2)
            assert polls_done(port) >= 2
            workers = [c for c in children(proc.pid)
                       if b"spawn_main" in Path(f"/proc/{c}/cmdline").read_bytes()]
            assert workers, "no parsing process was started"
        finally:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(10)
    deadline = time.monotonic() + 10
    while any(alive(w) for w in workers) and time.monotonic() < deadline:
        time.sleep(0.2)
    left = [w for w in workers if alive(w)]
    for w in left:
        os.kill(w, signal.SIGKILL)
    assert left == [], f"parsing processes {left} outlived the killed serve"
