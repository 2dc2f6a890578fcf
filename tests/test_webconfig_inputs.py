"""Hostile or careless web config files (issue 19 item 9): refused with one line
naming what is wrong, at start-up (exit 2) and on reload (the last good config goes
on serving, /healthz included).

The real `serve` command and real files."""

from __future__ import annotations

import subprocess
import time

import pytest
import yaml
from conftest import run_cli
from security_harness import get_full, log_events, start_exporter, write_web_config

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


# --- YAML bombs: bounded before they are parsed, not parsed again while unchanged ---------

def laughs(levels: int, width: int = 9) -> str:
    """A billion-laughs web config: ``width ** levels`` strings from a few hundred bytes,
    in a header value, which the code before this fix turned into one string."""
    anchors = ["&l0 [" + ", ".join(["lol"] * width) + "]"]
    anchors += [f"&l{i} [" + ", ".join([f"*l{i - 1}"] * width) + "]" for i in range(1, levels)]
    return "http_server_config:\n  headers:\n    Content-Security-Policy: [" + ", ".join(anchors) + "]\n"


def test_a_yaml_bomb_is_refused_at_start_in_one_short_line(tmp_path):
    path = tmp_path / "web.yaml"
    path.write_text(laughs(6))  # 531,441 strings (kept small: the code before this fix expanded them)
    assert len(path.read_bytes()) < 500
    err = serve_refuses(path)
    assert f"config: --web.config.file: cannot read {path}: aliases (*name) are refused" in err, err[:300]
    assert len(err) < 400, err[:300]


@pytest.mark.parametrize("content, expected", [
    ("a: " + "[" * 100 + "]" * 100 + "\n", "nested deeper than 32 levels"),
    ("base: &b {x: 1}\nother:\n  <<: *b\n", "aliases (*name) are refused"),
])
def test_other_expanding_yaml_is_refused(tmp_path, content, expected):
    from vllm_specdec_exporter.settings import ConfigError
    from vllm_specdec_exporter.webconfig import load_web_config
    path = tmp_path / "web.yaml"
    path.write_text(content)
    with pytest.raises(ConfigError, match=None) as refused:
        load_web_config(str(path))
    assert expected in str(refused.value), refused.value


def test_an_oversized_web_config_is_refused_unread(tmp_path):
    path = tmp_path / "web.yaml"
    path.write_text("# " + "x" * (1 << 20) + "\n")
    assert f"config: --web.config.file: {path} is larger than 1,048,576 bytes" in serve_refuses(path)


def test_an_unchanged_broken_file_is_parsed_once_and_never_on_the_event_loop(tmp_path, monkeypatch):
    import asyncio
    import threading

    from vllm_specdec_exporter import webconfig
    cfg = write_web_config(tmp_path / "web.yaml", http_server_config={"headers": {"X-Frame-Options": "deny"}})
    clock = [0.0]
    live = webconfig.LiveWebConfig(str(cfg), mono=lambda: clock[0])
    good = live.config
    loads: list[str] = []
    real = webconfig.load_web_config

    def counting(*args, **kw):
        loads.append(threading.current_thread().name)
        return real(*args, **kw)
    monkeypatch.setattr(webconfig, "load_web_config", counting)
    cfg.write_text(laughs(9))  # 387 million strings, were it expanded

    async def checks() -> None:
        for _ in range(10):  # ten seconds' worth of checks, the file unchanged
            clock[0] += 1.5
            assert live.current() is good
            for _ in range(200):  # let the load thread finish
                await asyncio.sleep(0.01)
                if not live._loading:
                    break
    asyncio.run(checks())
    assert loads == ["web-config"], loads  # once, on its own thread
    assert live.reload_failures == 1
    cfg.write_text(laughs(9) + "\n")  # a change: read again
    asyncio.run(checks())
    assert len(loads) == 2


def test_healthz_keeps_answering_while_a_yaml_bomb_sits_in_the_web_config(tmp_path):
    cfg = write_web_config(tmp_path / "web.yaml")
    server, port = start_exporter("--web.config.file", str(cfg))
    try:
        cfg.write_text(laughs(9))
        started = time.monotonic()
        slowest = 0.0
        while time.monotonic() - started < 4:
            t = time.monotonic()
            assert get_full(f"http://127.0.0.1:{port}/healthz", timeout=10)[0] == 200
            slowest = max(slowest, time.monotonic() - t)
            time.sleep(0.1)
    finally:
        logs = server.stop()
    failed = log_events(logs, "web_config_reload_failed")
    assert len(failed) == 1 and "aliases (*name) are refused" in failed[0]["error"], logs[-2000:]
    assert slowest < 5, slowest
