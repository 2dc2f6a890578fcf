"""The web config fails closed (issue 19 item 2): a reload that would turn TLS off, drop
every basic-auth user or weaken the client-certificate checks, or that does not parse,
keeps the last good config and logs one error line naming the file. exporter-toolkit
never falls back to plaintext; a deliberate weakening takes a restart.

The real `serve` command with a real TLS client; the file rewritten in place, as an
editor's truncate or a full disk leaves it."""

from __future__ import annotations

import socket
import time
from pathlib import Path

import pytest
import structlog
import yaml
from prom_harness import wait_for
from security_harness import bcrypt_hash, get, get_full, log_events, make_pki, start_exporter, tls_client, write_web_config

PASSWORD = "fail-closed-pw-7d1e"


@pytest.fixture(scope="module")
def pki(tmp_path_factory) -> Path:
    return make_pki(tmp_path_factory.mktemp("pki"))


def plain_http_status(port: int, path: str = "/metrics") -> int | str:
    """One plain-HTTP request to the port: its status, or 'refused' when the server
    answers no HTTP (a TLS port reads the request as a broken handshake and closes)."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
            s.sendall(f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n".encode())
            data = b""
            while chunk := s.recv(65536):
                data += chunk
    except (ConnectionError, TimeoutError):
        return "refused"
    return int(data.split()[1]) if data.startswith(b"HTTP/1.") else "refused"




def assert_still_secure(port: int, pki: Path, seconds: float = 3.0) -> None:
    """For ``seconds`` (the config is looked at once a second, on requests): no plain
    HTTP, no /metrics without the password, the password still works."""
    ctx = tls_client(pki)
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        assert plain_http_status(port) == "refused"
        assert get(f"https://127.0.0.1:{port}/metrics", ctx)[0] == 401
        assert get(f"https://127.0.0.1:{port}/metrics", ctx, ("prometheus", PASSWORD))[0] == 200
        time.sleep(0.2)


def reload_metrics(port: int, ctx) -> tuple[float, float]:
    """(last reload successful, reload failures) from /metrics."""
    from vllm_specdec_exporter.parser import parse

    status, text = get(f"https://127.0.0.1:{port}/metrics", ctx, ("prometheus", PASSWORD))
    assert status == 200
    samples = parse(text).samples
    ok = samples["vllm_specdec_exporter_web_config_last_reload_successful"]
    failures = samples["vllm_specdec_exporter_web_config_reload_failures_total"]
    return ok[0].value, failures[0].value


def half_written(text: str) -> str:
    """The TLS section without the users: what a write cut short leaves of a file whose
    users come last."""
    return yaml.safe_dump({"tls_server_config": yaml.safe_load(text)["tls_server_config"]})


def test_a_truncated_or_half_written_web_config_keeps_tls_and_the_password(tmp_path, pki):
    cfg = write_web_config(tmp_path / "web.yaml", pki, users={"prometheus": bcrypt_hash(PASSWORD, 4)})
    good = cfg.read_text()
    server, port = start_exporter("--web.config.file", str(cfg), tls_ca=pki / "ca.crt")
    ctx = tls_client(pki)
    try:
        assert_still_secure(port, pki, seconds=0)
        # 1. Truncated in place (an editor's O_TRUNC, a full disk): an empty file.
        with open(cfg, "w"):
            pass
        assert_still_secure(port, pki)
        # 2. Half-written: the TLS section is there, the users are not.
        cfg.write_text(half_written(good))
        assert_still_secure(port, pki)
        # 3. TLS dropped, users kept.
        cfg.write_text(yaml.safe_dump({"basic_auth_users": {"prometheus": bcrypt_hash(PASSWORD, 4)}}))
        assert_still_secure(port, pki)
        # Counted on /metrics, as Prometheus's config_last_reload_successful (one per refused edit).
        assert reload_metrics(port, ctx) == (0.0, 3.0)
        # A change that weakens nothing still applies (and shows the refusals above were
        # handled: reloads are done in order).
        write_web_config(cfg, pki, users={"prometheus": bcrypt_hash(PASSWORD, 4)},
                         http_server_config={"headers": {"X-Frame-Options": "deny"}})
        wait_for(lambda: get_full(f"https://127.0.0.1:{port}/healthz", ctx)[1].get("X-Frame-Options") == "deny",
                 15, "the harmless change to apply", step=0.2)
        assert_still_secure(port, pki, seconds=0)
        assert reload_metrics(port, ctx) == (1.0, 3.0)
    finally:
        logs = server.stop()
    errors = log_events(logs, "web_config_reload_failed")
    assert len(errors) == 3, logs
    for record in errors:
        assert record["level"] == "error" and record["file"] == str(cfg), record
    assert "turn TLS off" in errors[0]["error"] and "remove every basic_auth_users" in errors[0]["error"], errors[0]
    assert "remove every basic_auth_users" in errors[1]["error"] and "TLS" not in errors[1]["error"], errors[1]
    assert "turn TLS off" in errors[2]["error"], errors[2]
    assert all("restart" in r["error"] for r in errors)
    assert len(log_events(logs, "web_config_reloaded")) == 1
    assert PASSWORD not in logs


def _live(path: Path):
    from vllm_specdec_exporter.webconfig import LiveWebConfig

    clock = [0.0]
    return LiveWebConfig(str(path), mono=lambda: clock[0]), clock


def _reload(live, clock, path: Path, content: dict | str):
    path.write_text(content if isinstance(content, str) else yaml.safe_dump(content))
    clock[0] += 10
    return live.current()  # no running loop: loaded in place


@pytest.mark.parametrize("change, problem", [
    (lambda tls: {}, "turn TLS off"),
    (lambda tls: {"tls_server_config": tls}, "remove every basic_auth_users"),
    (lambda tls: {"tls_server_config": {**tls, "client_auth_type": "VerifyClientCertIfGiven"},
                  "basic_auth_users": "USERS"}, "stop requiring a client certificate"),
    (lambda tls: {"tls_server_config": {"cert_file": tls["cert_file"], "key_file": tls["key_file"]},
                  "basic_auth_users": "USERS"}, "stop verifying client certificates"),
    (lambda tls: {"tls_server_config": {k: v for k, v in tls.items() if k != "client_allowed_sans"},
                  "basic_auth_users": "USERS"}, "drop client_allowed_sans"),
    (lambda tls: "tls_server_config: [broken", "cannot read"),
], ids=["tls-off", "no-users", "cert-not-required", "cert-not-verified", "sans-dropped", "broken"])
def test_every_weakening_reload_is_refused_in_process(tmp_path, pki, change, problem):
    tls = {"cert_file": str(pki / "server.crt"), "key_file": str(pki / "server.key"),
           "client_auth_type": "RequireAndVerifyClientCert", "client_ca_file": str(pki / "ca.crt"),
           "client_allowed_sans": ["prometheus.monitoring"]}
    users = {"prometheus": bcrypt_hash(PASSWORD, 4)}
    path = tmp_path / "web.yaml"
    path.write_text(yaml.safe_dump({"tls_server_config": tls, "basic_auth_users": users}))
    live, clock = _live(path)
    before = live.config
    content = change(tls)
    if isinstance(content, dict) and content.get("basic_auth_users") == "USERS":
        content["basic_auth_users"] = users
    assert live.reload_failures == 0
    with structlog.testing.capture_logs() as logs:
        assert _reload(live, clock, path, content) is before
        assert _reload(live, clock, path, content) is before  # the same edit again: refused, counted, not logged
    assert live.reload_failures == 2 and live.last_reload_ok is False
    assert [(r["event"], r["log_level"], r["file"]) for r in logs] == [("web_config_reload_failed", "error",
                                                                        str(path))]
    assert problem in logs[0]["error"]
    # Putting the good config back is a reload like any other.
    path.write_text(yaml.safe_dump({"tls_server_config": tls, "basic_auth_users": users}))
    clock[0] += 10
    assert live.current() is not before and live.last_reload_ok is True


def test_a_stronger_or_equal_config_still_reloads(tmp_path, pki):
    path = write_web_config(tmp_path / "web.yaml", pki)
    live, clock = _live(path)
    assert live.config.ssl_context and not live.config.users
    users = {"prometheus": bcrypt_hash(PASSWORD, 4)}
    tls = {"cert_file": str(pki / "server.crt"), "key_file": str(pki / "server.key")}
    assert _reload(live, clock, path, {"tls_server_config": tls, "basic_auth_users": users}).users
    # One user of two removed: not every user, so not a weakening.
    two = {**users, "other": bcrypt_hash("x", 4)}
    assert set(_reload(live, clock, path, {"tls_server_config": tls, "basic_auth_users": two}).users) == \
        {"prometheus", "other"}
    assert set(_reload(live, clock, path, {"tls_server_config": tls, "basic_auth_users": users}).users) == \
        {"prometheus"}
    assert live.reload_failures == 0
