"""A target URL's query values are secrets too (issue 19, item 9): ``?token=s3cret``
is shown as ``?token=<redacted>`` wherever the URL is (landing page, /api/v1/summary,
logs, errors; /metrics has no URL label) and never leaks, even when the target echoes
its own URL back. sources.redact_url and sources.credentials are the one place, as
for a URL's user:password."""

from __future__ import annotations

import yaml
from aiohttp import web
from conftest import run_cli
from prom_harness import wait_for
from security_harness import Upstream, get, start_exporter
from seed_records import render_dump
from vllm_specdec_exporter.sources import credentials, redact_url

SECRET = "s3cret"  # 6 characters: scrub() replaced only secrets of 8 or more
METRICS = render_dump({"drafts": 1000, "draft_tokens": 2000, "accepted": 1500, "per_pos": [900, 600]})


def test_query_values_are_redacted_and_scrubbed():
    assert redact_url("http://h:9/m?token=s3cret&format=text&debug") == \
        "http://h:9/m?token=<redacted>&format=<redacted>&debug"
    assert redact_url("http://u:pw@[::1]:8000/m?key=a%2Fb") == "http://[::1]:8000/m?key=<redacted>"
    assert redact_url("http://[::1/m?token=s3cret") == "http://<invalid URL>"
    assert redact_url("dumps/a?b=c.prom") == "dumps/a?b=c.prom"  # a file name, not a URL
    assert {"s3cret", "ab%2Fcd", "ab/cd"} <= set(credentials("http://h/m?token=s3cret&key=ab%2Fcd"))


def _handler(request: web.Request):
    kind = request.path.strip("/")
    echo = str(request.url)  # the target quotes its own URL, query string and all
    if kind == "echo-401":
        return web.Response(status=401, text=echo)
    if kind == "echo-junk":  # not Prometheus text: its first line is quoted in the error
        return web.Response(text=f"= {echo}\n")
    return web.Response(text=METRICS.decode())


def test_a_query_string_secret_reaches_no_output(tmp_path):
    with Upstream(_handler) as up:
        kinds = ("ok", "echo-401", "echo-junk")
        config = tmp_path / "c.yaml"
        config.write_text(yaml.safe_dump({
            "targets": [{"name": k, "url": up.url(f"/{k}?token={SECRET}")} for k in kinds],
            "poll": {"interval": "250ms"}, "log": {"level": "debug"}}))
        server, port = start_exporter("--config.file", str(config))
        base = f"http://127.0.0.1:{port}"
        surfaces = {}
        try:
            wait_for(lambda: all(f'vllm_specdec_up{{target="{k}"}}' in get(f"{base}/metrics")[1] for k in kinds)
                     and 'vllm_specdec_up{target="ok"} 1' in get(f"{base}/metrics")[1], 30, "every target polled")
            surfaces = {"/metrics": get(f"{base}/metrics")[1], "landing page": get(f"{base}/")[1],
                        "summary": get(f"{base}/api/v1/summary?window=1m")[1]}
        finally:
            surfaces["logs"] = server.stop()
        for kind in kinds:
            done = run_cli("report", up.url(f"/{kind}?token={SECRET}"), "--timeout", "5s")
            surfaces[f"report {kind}"] = done.stdout.decode() + done.stderr.decode()
    leaked = {name: text[max(0, text.index(SECRET) - 200):text.index(SECRET) + 20] for name, text in surfaces.items()
              if SECRET in text}
    assert leaked == {}
    assert "/ok?token=&lt;redacted&gt;</td>" in surfaces["landing page"]
    assert "/echo-junk?token=&lt;redacted&gt;&#x27;</td>" in surfaces["landing page"]  # the echo, scrubbed
    assert "/ok?token=<redacted>)" in surfaces["report ok"]
    assert "/ok?token=<redacted>" in surfaces["logs"]  # target_up names the URL, redacted


def test_harmless_short_query_values_are_not_scrubbed_from_messages():
    """Every query value is redacted where the URL is shown, but only credential-like keys
    (token, key, secret, pass, auth, sig...) or values of 12+ characters are scrubbed from
    free text: with `format=text` scrubbed, "not Prometheus text" read "not Prometheus
    <redacted>" (review of a782915)."""
    from vllm_specdec_exporter.sources import scrub

    secrets = credentials("http://h:9/m?format=text&token=s3cret&x=0123456789abcdef")
    assert "text" not in secrets and {"s3cret", "0123456789abcdef"} <= set(secrets)
    assert scrub("body is not Prometheus text: s3cret", secrets) == "body is not Prometheus text: <redacted>"
