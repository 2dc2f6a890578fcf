"""LiveWebConfig (webconfig/reload.py): the web config re-read when it changes, failing closed.

The web config fails closed (issue 19 item 2): a reload that would turn TLS off, drop
every basic-auth user or weaken the client-certificate checks, or that does not parse,
keeps the last good config and logs one error line naming the file. exporter-toolkit
never falls back to plaintext; a deliberate weakening takes a restart. The file is
rewritten in place, as an editor's truncate or a full disk leaves it.

A reload cannot weaken the config (issue 29 item 6). Dropping
`tls_server_config.min_version: TLS13`, removing or loosening `rate_limit`, or removing
`http_server_config.headers` was applied with an info line, and a file cut in place
drops them when they come last. Now they are refused as turning TLS off is: the last
good config is kept and one error line names the file and what would weaken.

The real `serve` command with real TLS clients, and the reload logic in process. An
unchanged broken file is read once, on a thread of its own (issue 19 item 9)."""

from __future__ import annotations

import http.client
import socket
import ssl
import time
from pathlib import Path

import pytest
import structlog
import yaml
from prom_harness import wait_for
from security_harness import (
    bcrypt_hash,
    get,
    get_full,
    laughs,
    log_events,
    make_pki,
    start_exporter,
    tls_client,
    tls_status,
    write_web_config,
)

PASSWORD = "reload-pw-4b8a"
HEADERS = {"X-Frame-Options": "deny", "Strict-Transport-Security": "max-age=31536000"}
RATE = {"interval": "1s", "burst": 3}


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


def config_text(pki: Path, users: dict, *, tls: dict | None = None, headers: dict | None = HEADERS,
                rate: dict | None = RATE) -> str:
    """The web config in the order an operator writes it: TLS, users, then headers and
    rate_limit last (what a cut leaves out first)."""
    doc: dict = {"tls_server_config": tls if tls is not None else
                 {"cert_file": str(pki / "server.crt"), "key_file": str(pki / "server.key"), "min_version": "TLS13"},
                 "basic_auth_users": users}
    if headers is not None:
        doc["http_server_config"] = {"headers": headers}
    if rate is not None:
        doc["rate_limit"] = rate
    return yaml.safe_dump(doc, sort_keys=False)


def replace(path: Path, text: str) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(text)
    tmp.replace(path)  # one change seen at once: no empty file in between


def unauthenticated_statuses(port: int, ctx: ssl.SSLContext, n: int) -> list[int]:
    """``n`` requests without credentials from 127.0.0.2 (a bucket nothing else uses), one connection."""
    conn = http.client.HTTPSConnection("127.0.0.1", port, timeout=10, context=ctx, source_address=("127.0.0.2", 0))
    try:
        out = []
        for _ in range(n):
            conn.request("GET", "/metrics")
            resp = conn.getresponse()
            resp.read()
            out.append(resp.status)
        return out
    finally:
        conn.close()


def _live(path: Path):
    from vllm_specdec_exporter.webconfig.reload import LiveWebConfig

    clock = [0.0]
    return LiveWebConfig(str(path), mono=lambda: clock[0]), clock


def _reload(live, clock, path: Path, content: dict | str):
    path.write_text(content if isinstance(content, str) else yaml.safe_dump(content))
    clock[0] += 10
    return live.current()  # no running loop: loaded in place


# --- Fail closed: TLS, users and client certificates (issue 19 item 2) ---------------------

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
    # Found attacking the reload (helper-29): a lower max_version and a weaker suite were applied.
    (lambda tls: {"tls_server_config": {**tls, "max_version": "TLS12"}, "basic_auth_users": "USERS"},
     "lower the TLS version ceiling (TLS13 -> TLS12)"),
    (lambda tls: {"tls_server_config": {**tls, "max_version": "TLS12", "cipher_suites": ["TLS_ECDHE_RSA_WITH_AES_128_CBC_SHA"]},
                  "basic_auth_users": "USERS"}, "allow cipher suites not allowed before (TLS_ECDHE_RSA_WITH_AES_128_CBC_SHA)"),
], ids=["tls-off", "no-users", "cert-not-required", "cert-not-verified", "sans-dropped", "broken", "max-lowered", "cipher-added"])
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
    # Fewer cipher suites, then the same few: stronger or equal.
    narrow = {**tls, "cipher_suites": ["TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256"]}
    for _ in range(2):
        ctx = _reload(live, clock, path, {"tls_server_config": narrow, "basic_auth_users": users}).ssl_context
        assert ctx is not None and "ECDHE-RSA-AES128-GCM-SHA256" in {c["name"] for c in ctx.get_ciphers()}
    assert live.reload_failures == 0
    # TLS 1.3 only: a TLS 1.2 suite list dropped allows nothing more (helper-30: refused as a weakening).
    tls13 = {**tls, "min_version": "TLS13"}
    _reload(live, clock, path, {"tls_server_config": {**tls13, "cipher_suites": ["TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256"]},
                                "basic_auth_users": users})
    assert _reload(live, clock, path, {"tls_server_config": tls13, "basic_auth_users": users}).ssl_context is not None
    assert live.reload_failures == 0


# --- No weakening: TLS version floor, rate_limit, headers (issue 29 item 6) ---------------

def test_a_weakening_reload_keeps_tls13_the_rate_limit_and_the_headers(tmp_path, pki):
    users = {"prometheus": bcrypt_hash(PASSWORD, 4)}
    cfg = tmp_path / "web.yaml"
    good = config_text(pki, users)
    replace(cfg, good)
    server, port = start_exporter("--web.config.file", str(cfg), tls_ca=pki / "ca.crt")
    ctx = tls_client(pki)
    tls12 = tls_client(pki, maximum_version=ssl.TLSVersion.TLSv1_2)
    url = f"https://127.0.0.1:{port}"

    def failures() -> float:
        from vllm_specdec_exporter.parser import parse

        status, text = get(f"{url}/metrics", ctx, ("prometheus", PASSWORD))
        assert status == 200, status
        return parse(text).samples["vllm_specdec_exporter_web_config_reload_failures_total"][0].value

    def handled(count: int):
        """True once the edit was refused (counted) or applied (the headers went)."""
        return lambda: failures() >= count or "X-Frame-Options" not in get_full(f"{url}/healthz", ctx)[1]

    def assert_still_strong(source: str) -> None:
        assert tls_status(port, tls12) == "refused", f"{source}: TLS 1.2 accepted"
        headers = get_full(f"{url}/healthz", ctx)[1]
        assert {h: headers.get(h) for h in HEADERS} == HEADERS, f"{source}: {headers}"
        statuses = unauthenticated_statuses(port, ctx, RATE["burst"] + 2)
        assert statuses[-1] == 429, f"{source}: no rate limit ({statuses})"

    try:
        assert tls_status(port, tls12) == "refused"
        # 1. Everything weakened in one edit: min_version, headers and rate_limit dropped.
        replace(cfg, config_text(pki, users, tls={"cert_file": str(pki / "server.crt"),
                                                  "key_file": str(pki / "server.key")}, headers=None, rate=None))
        wait_for(handled(1), 15, "the edit to be handled", step=1.0)  # 1/s: within the rate limit
        assert_still_strong("min_version, headers and rate_limit dropped")
        # 2. The file cut in place after the users: headers and rate_limit, last, are gone.
        replace(cfg, good[: good.index("http_server_config")])
        wait_for(handled(2), 15, "the cut file to be handled", step=1.0)
        assert_still_strong("cut after basic_auth_users")
        assert failures() == 2
    finally:
        logs = server.stop()
    errors = log_events(logs, "web_config_reload_failed")
    assert len(errors) == 2, logs
    assert all(r["level"] == "error" and r["file"] == str(cfg) and "restart" in r["error"] for r in errors), errors
    for part in ("lower the TLS version floor (TLS13 -> TLS12)", "remove rate_limit",
                 "remove the headers X-Frame-Options, Strict-Transport-Security"):
        assert part in errors[0]["error"], errors[0]
    assert "remove rate_limit" in errors[1]["error"] and "remove the headers" in errors[1]["error"], errors[1]
    assert "TLS" not in errors[1]["error"], errors[1]
    assert not log_events(logs, "web_config_reloaded")
    assert PASSWORD not in logs


TLS13 = {"min_version": "TLS13"}


@pytest.mark.parametrize("change, problem", [
    ({"tls": {}}, "lower the TLS version floor (TLS13 -> TLS12)"),
    ({"tls": {"min_version": "TLS12"}}, "lower the TLS version floor (TLS13 -> TLS12)"),
    ({"rate": None}, "remove rate_limit"),
    ({"rate": {"interval": 0}}, "remove rate_limit"),
    ({"rate": {"interval": "500ms", "burst": 3}}, "loosen rate_limit (interval 1s, burst 3 -> interval 0.5s, burst 3)"),
    ({"rate": {"interval": "1s", "burst": 4}}, "loosen rate_limit (interval 1s, burst 3 -> interval 1s, burst 4)"),
    ({"headers": None}, "remove the headers X-Frame-Options, Strict-Transport-Security"),
    ({"headers": {"X-Frame-Options": "deny"}}, "remove the header Strict-Transport-Security"),
    ({"headers": {**HEADERS, "X-Frame-Options": "sameorigin"}}, "change the header X-Frame-Options"),
    ({"headers": {**HEADERS, "Strict-Transport-Security": "max-age=0"}}, "change the header Strict-Transport-Security"),
], ids=["min-version-dropped", "min-version-lowered", "rate-removed", "rate-interval-0", "rate-faster",
        "rate-bigger-burst", "headers-removed", "header-removed", "header-changed", "hsts-max-age-0"])
def test_every_new_weakening_is_refused_in_process(tmp_path, pki, change, problem):
    users = {"prometheus": bcrypt_hash(PASSWORD, 4)}
    tls = {"cert_file": str(pki / "server.crt"), "key_file": str(pki / "server.key")}
    good = config_text(pki, users, tls={**tls, **TLS13})
    path = tmp_path / "web.yaml"
    path.write_text(good)
    live, clock = _live(path)
    before = live.config
    kw = {**change, "tls": {**tls, **change["tls"]}} if "tls" in change else change
    with structlog.testing.capture_logs() as logs:
        assert _reload(live, clock, path, config_text(pki, users, **kw)) is before
    assert live.reload_failures == 1 and live.last_reload_ok is False
    assert [(r["event"], r["log_level"], r["file"]) for r in logs] == [("web_config_reload_failed", "error", str(path))]
    assert problem in logs[0]["error"], logs[0]["error"]
    assert _reload(live, clock, path, good) is not before and live.last_reload_ok is True


def test_a_stronger_reload_still_applies(tmp_path, pki):
    """A higher floor, a slower or smaller rate limit, a header added, one set where there was none."""
    users = {"prometheus": bcrypt_hash(PASSWORD, 4)}
    tls = {"cert_file": str(pki / "server.crt"), "key_file": str(pki / "server.key")}
    path = tmp_path / "web.yaml"
    path.write_text(config_text(pki, users, tls=tls, headers={"X-Frame-Options": "deny"}, rate=None))
    live, clock = _live(path)
    for kw in ({"tls": {**tls, **TLS13}, "headers": {"X-Frame-Options": "deny"}, "rate": None},
               {"tls": {**tls, **TLS13}, "headers": {"X-Frame-Options": "deny"}, "rate": RATE},
               {"tls": {**tls, **TLS13}, "headers": HEADERS, "rate": {"interval": "2s", "burst": 3}},
               {"tls": {**tls, **TLS13}, "headers": HEADERS, "rate": {"interval": "2s", "burst": 1}}):
        new = _reload(live, clock, path, config_text(pki, users, **kw))
        assert live.last_reload_ok is True, kw
        assert new.ssl_context.minimum_version == ssl.TLSVersion.TLSv1_3
    assert new.headers == HEADERS and new.rate_limit == (2.0, 1)
    assert live.reload_failures == 0


# --- A broken file is read once, never on the event loop (issue 19 item 9) ---------------

def test_an_unchanged_broken_file_is_parsed_once_and_never_on_the_event_loop(tmp_path, monkeypatch):
    import asyncio
    import threading

    from vllm_specdec_exporter.webconfig import reload
    cfg = write_web_config(tmp_path / "web.yaml", http_server_config={"headers": {"X-Frame-Options": "deny"}})
    clock = [0.0]
    live = reload.LiveWebConfig(str(cfg), mono=lambda: clock[0])
    good = live.config
    loads: list[str] = []
    real = reload.load_web_config

    def counting(*args, **kw):
        loads.append(threading.current_thread().name)
        return real(*args, **kw)
    monkeypatch.setattr(reload, "load_web_config", counting)  # as LiveWebConfig looks it up
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
