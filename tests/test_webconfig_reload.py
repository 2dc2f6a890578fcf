"""A reload cannot weaken the config (issue 29 item 6). Dropping
`tls_server_config.min_version: TLS13`, removing or loosening `rate_limit`, or removing
`http_server_config.headers` was applied with an info line, and a file cut in place
drops them when they come last. Now they are refused as turning TLS off is: the last
good config is kept and one error line names the file and what would weaken.

The real `serve` command with real TLS clients, and the reload logic in process."""

from __future__ import annotations

import http.client
import ssl
from pathlib import Path

import pytest
import structlog
import yaml
from prom_harness import wait_for
from security_harness import bcrypt_hash, get, get_full, log_events, make_pki, start_exporter, tls_client, tls_status

PASSWORD = "reload-pw-4b8a"
HEADERS = {"X-Frame-Options": "deny", "Strict-Transport-Security": "max-age=31536000"}
RATE = {"interval": "1s", "burst": 3}


@pytest.fixture(scope="module")
def pki(tmp_path_factory) -> Path:
    return make_pki(tmp_path_factory.mktemp("pki"))


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


def _live(path: Path):
    from vllm_specdec_exporter.webconfig import LiveWebConfig

    clock = [0.0]
    return LiveWebConfig(str(path), mono=lambda: clock[0]), clock


def _reload(live, clock, path: Path, text: str):
    path.write_text(text)
    clock[0] += 10
    return live.current()  # no running loop: loaded in place


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
