"""The web config and the files it names are read only if they are regular files, never
opened in a way that can block, and read no further than a cap (webconfig/files.py;
issue 19 item 9): refused with one line naming what is wrong, at start-up (exit 2) and
on reload (the last good config goes on serving, /healthz included).

The real `serve` command and real files."""

from __future__ import annotations

import time

import pytest
import yaml
from security_harness import get_full, log_events, serve_refuses, start_exporter, write_web_config


def _fifo(path):
    import os
    os.mkfifo(path)
    return path


@pytest.mark.parametrize("kind", ["fifo", "directory", "device"])
def test_a_web_config_that_is_not_a_regular_file_is_refused_at_start(tmp_path, kind):
    path = {"fifo": lambda: _fifo(tmp_path / "web.yaml"), "directory": lambda: tmp_path,
            "device": lambda: "/dev/null"}[kind]()
    err = serve_refuses(path)
    assert f"config: --web.config.file: {path} is not a regular file" in err, err


def test_a_certificate_that_is_a_fifo_is_refused_at_start(tmp_path):
    path = tmp_path / "web.yaml"
    path.write_text(yaml.safe_dump({"tls_server_config": {"cert_file": str(_fifo(tmp_path / "tls.crt")),
                                                          "key_file": str(_fifo(tmp_path / "tls.key"))}}))
    err = serve_refuses(path)
    assert f"config: tls_server_config.cert_file: {tmp_path / 'tls.crt'} is not a regular file" in err, err


def test_a_fifo_swapped_in_on_reload_blocks_neither_later_reloads_nor_sigterm(tmp_path):
    import os

    from security_harness import bcrypt_hash
    users = {"prometheus": bcrypt_hash("pw", 4)}
    cfg = write_web_config(tmp_path / "web.yaml", users=users)
    server, port = start_exporter("--web.config.file", str(cfg))
    base = f"http://127.0.0.1:{port}"
    try:
        os.replace(_fifo(tmp_path / "fifo"), cfg)  # as a ConfigMap swap would, but a FIFO
        for _ in range(15):  # 3 s: the config is looked at once a second, on requests
            assert get_full(base + "/healthz", timeout=5)[0] == 200
            assert get_full(base + "/metrics", timeout=5)[0] == 401
            time.sleep(0.2)
        # A later, good edit still applies: the reloads are not stuck on the FIFO.
        write_web_config(cfg, users=users, http_server_config={"headers": {"X-Frame-Options": "deny"}})
        deadline = time.monotonic() + 15
        while get_full(base + "/healthz", timeout=5)[1].get("X-Frame-Options") != "deny":
            assert time.monotonic() < deadline, "the edit after the FIFO was never applied"
            time.sleep(0.2)
        started = time.monotonic()
    finally:
        logs = server.stop()  # SIGTERM; fails (TimeoutExpired) if the process hangs
    assert server.proc.returncode == 0 and time.monotonic() - started < 10, logs
    failed = log_events(logs, "web_config_reload_failed")
    assert len(failed) == 1 and "is not a regular file" in failed[0]["error"], logs


def test_an_oversized_web_config_is_refused_unread(tmp_path):
    path = tmp_path / "web.yaml"
    path.write_text("# " + "x" * (1 << 20) + "\n")
    assert f"config: --web.config.file: {path} is larger than 1,048,576 bytes" in serve_refuses(path)
