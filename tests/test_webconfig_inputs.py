"""Hostile or careless web config files (issue 19 item 9): refused with one line
naming what is wrong, at start-up (exit 2) and on reload (the last good config goes
on serving, /healthz included).

The real `serve` command and real files."""

from __future__ import annotations

import json
import subprocess
import time

import pytest
import yaml

from conftest import run_cli
from security_harness import get_full, start_exporter, write_web_config

BAD_HEADER_VALUES = {
    "CRLF": "default-src 'self'\r\nX-Injected: 1",
    "LF": "default-src 'self'\nX-Injected: 1",
    "NUL": "default-src 'self'\0",
}


def serve_refuses(path, timeout: float = 20) -> str:
    """`serve` with the web config ``path`` must exit 2 (not hang, not serve); its stderr."""
    try:
        proc = run_cli("serve", "--vllm.url", "http://127.0.0.1:1/m", "--web.listen-address", "127.0.0.1:0",
                       "--web.config.file", str(path), timeout=timeout)
    except subprocess.TimeoutExpired:
        raise AssertionError(f"serve did not refuse {path} within {timeout:g} s") from None
    err = proc.stderr.decode()
    assert proc.returncode == 2, err
    assert len(err.strip().splitlines()) == 1, err  # one line, never a traceback
    return err


def log_events(logs: str, event: str) -> list[dict]:
    out = []
    for line in logs.splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if isinstance(record, dict) and record.get("event") == event:
            out.append(record)
    return out


@pytest.mark.parametrize("kind", BAD_HEADER_VALUES)
def test_a_header_value_with_cr_lf_or_nul_is_refused_at_start(tmp_path, kind):
    path = tmp_path / "web.yaml"
    path.write_text(yaml.safe_dump({"http_server_config": {"headers": {
        "Content-Security-Policy": BAD_HEADER_VALUES[kind]}}}))
    err = serve_refuses(path)
    assert "config: http_server_config.headers.Content-Security-Policy: " in err, err
    assert "control character" in err and "X-Injected" not in err, err


def test_a_header_value_with_crlf_on_reload_keeps_every_response_working(tmp_path):
    cfg = write_web_config(tmp_path / "web.yaml", http_server_config={"headers": {"Content-Security-Policy":
                                                                                  "default-src 'self'"}})
    server, port = start_exporter("--web.config.file", str(cfg))
    base = f"http://127.0.0.1:{port}"
    try:
        write_web_config(cfg, http_server_config={"headers": {"Content-Security-Policy": BAD_HEADER_VALUES["CRLF"]}})
        for _ in range(15):  # 3 s: the config is looked at once a second, on requests
            for path in ("/healthz", "/metrics"):
                status, headers, _ = get_full(base + path, timeout=5)
                assert status == 200 and headers.get("Content-Security-Policy") == "default-src 'self'", \
                    (path, status, headers)
                assert "X-Injected" not in headers
            time.sleep(0.2)
    finally:
        logs = server.stop()
    failed = log_events(logs, "web_config_reload_failed")
    assert len(failed) == 1 and "http_server_config.headers.Content-Security-Policy" in failed[0]["error"], logs


def test_a_non_string_header_value_is_refused(tmp_path):
    path = tmp_path / "web.yaml"
    path.write_text(yaml.safe_dump({"http_server_config": {"headers": {"Strict-Transport-Security": {"a": 1}}}}))
    assert "config: http_server_config.headers.Strict-Transport-Security: expected a string" in serve_refuses(path)


# --- Not a regular file: never opened in a way that can block ----------------------------

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
