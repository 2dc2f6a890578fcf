"""What the exporter shows is its own: redirects are never followed (another host's text
never reaches the landing page, the summary or the logs), and no secret -- a target
URL's password, a bearer token, a basic-auth password, the TLS private key -- ever
appears on any output surface (logs, /metrics, landing page, /api/v1/summary, CLI
errors), whatever the targets answer. Real exporter, real hostile upstreams."""

from __future__ import annotations

import asyncio
import base64
import string
import urllib.parse
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import yaml
from aiohttp import web
from conftest import run_cli
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from prom_harness import wait_for
from security_harness import Upstream, bcrypt_hash, get, make_pki, start_exporter, tls_client, write_web_config
from seed_records import render_dump
from vllm_specdec_exporter.redaction import credentials, redact_url
from vllm_specdec_exporter.settings import ConfigError, build_settings, load_settings

METADATA = "ami-id: i-0METADATA7731"  # what a cloud metadata endpoint would say
METRICS = render_dump({"drafts": 1000, "draft_tokens": 2000, "accepted": 1500, "per_pos": [900, 600]})


@pytest.fixture(scope="module")
def pki(tmp_path_factory) -> Path:
    return make_pki(tmp_path_factory.mktemp("pki"))


def test_redirects_are_not_followed_and_other_hosts_never_show(tmp_path):
    """A target redirects to a stand-in metadata endpoint on another loopback address
    (and one to its own host): neither is followed, the poll counts as http_error with
    a message saying so, and the other host's text is nowhere."""
    metadata = Upstream(lambda r: web.Response(status=500, reason=METADATA, text=METADATA), host="127.0.0.2")
    with metadata:
        def redirect(request):
            if request.path == "/same-host":
                raise web.HTTPTemporaryRedirect("/metrics")
            if request.path == "/metrics":
                return web.Response(text=METRICS.decode())
            raise web.HTTPFound(metadata.url("/latest/meta-data/"))
        with Upstream(redirect) as target:
            config = tmp_path / "c.yaml"
            config.write_text(yaml.safe_dump({
                "targets": [{"name": "away", "url": target.url("/away")},
                            {"name": "same", "url": target.url("/same-host")}],
                "poll": {"interval": "250ms"}, "log": {"level": "debug"}}))
            server, port = start_exporter("--config.file", str(config))
            base = f"http://127.0.0.1:{port}"
            surfaces = {}
            try:
                wait_for(lambda: min(polls(get(f"{base}/metrics")[1], t) for t in ("away", "same")) >= 2, 30,
                         "two polls of each target")
                surfaces = {"metrics": get(f"{base}/metrics")[1], "landing": get(f"{base}/")[1],
                            "summary": get(f"{base}/api/v1/summary?window=1m")[1]}
            finally:
                surfaces["logs"] = server.stop()
            cli = run_cli("report", target.url("/away"), "--timeout", "5s")
    assert cli.returncode == 2 and "redirect" in cli.stderr.decode()
    surfaces["cli"] = cli.stderr.decode() + cli.stdout.decode()
    assert metadata.seen == []  # never even asked
    for name, text in surfaces.items():
        assert "0METADATA7731" not in text, name
    assert "redirects are not followed" in surfaces["landing"]
    assert polls(surfaces["metrics"], "away", "http_error") >= 2 and polls(surfaces["metrics"], "same", "http_error") >= 2


def polls(metrics: str, target: str, result: str | None = None) -> float:
    """polls_total of one target (of one result, if given), summed."""
    total = 0.0
    for line in metrics.splitlines():
        if line.startswith("vllm_specdec_exporter_polls_total{") and f'target="{target}"' in line \
                and (result is None or f'result="{result}"' in line):
            total += float(line.rsplit(" ", 1)[1])
    return total


# --- every secret, every surface -----------------------------------------------------

# Characters a password may carry in a URL's userinfo without percent-encoding.
# At least 8 different characters, and a marker in front: a secret that could turn up
# by chance ("0000000000" in a timestamp, or the "--config.file" Hypothesis likes to
# try) would prove nothing.
SECRET = st.text(alphabet=string.ascii_letters + string.digits + "-._~!$&'()*+,;=", min_size=12,
                 max_size=40).filter(lambda s: len(set(s[:8])) >= 7).map(lambda s: "Zq" + s)


def _echo(request: web.Request) -> str:
    return f"{request.headers.get('Authorization', '')} {request.url}"


async def _slow(request: web.Request) -> web.Response:
    await asyncio.sleep(3)  # well past the 1 s timeouts; the upstream waits for it before it stops
    return web.Response(text=METRICS.decode())


def _upstream_handler(request: web.Request):
    """A hostile or broken 'vLLM': echoes the credentials it got back in every form it can."""
    kind = request.path.strip("/")
    if kind == "echo-401":
        return web.Response(status=401, reason="denied " + _echo(request)[:200], text=_echo(request))
    if kind == "echo-text":
        return web.Response(text=_echo(request) + "\n")
    if kind == "echo-junk":  # not Prometheus text: its first line is quoted in the error
        return web.Response(text="= " + _echo(request) + "\n")
    if kind == "echo-html":
        return web.Response(text=f"<html>{_echo(request)}</html>", content_type="text/html")
    if kind == "slow":
        return _slow(request)
    if kind == "ok":
        return web.Response(text=METRICS.decode())
    raise web.HTTPFound(f"http://user:{request.url.password or 'x'}@127.0.0.2:1/" + _echo(request).replace(" ", "/"))


def leaks(text: str, secrets: dict[str, str]) -> list[str]:
    found = []
    for name, secret in secrets.items():
        forms = {secret, secret[:10], urllib.parse.quote(secret, safe=""), urllib.parse.quote(secret)}
        found += [f"{name} ({form!r})" for form in forms if form in text]
    return found


# Each example runs the real exporter and fifteen CLI commands: few examples, no
# shrinking (a failure prints its secrets and the surface they reached). The CLI
# commands need only the upstream, so they run beside the exporter, a few at a time.
@pytest.mark.long
@settings(max_examples=3, deadline=None, suppress_health_check=list(HealthCheck),
          phases=(Phase.explicit, Phase.reuse, Phase.generate))
@given(url_password=SECRET, token=SECRET, auth_password=SECRET)
def test_no_secret_reaches_any_output_surface(tmp_path_factory, pki, url_password, token, auth_password):
    tmp = tmp_path_factory.mktemp("secrets")
    key_lines = [line for line in (pki / "server.key").read_text().splitlines() if "-----" not in line]
    secrets = {"url password": url_password, "bearer token": token, "basic-auth password": auth_password,
               "url credentials as a Basic header": base64.b64encode(f"scraper:{url_password}".encode()).decode(),
               **{f"private key line {i}": line[:16] for i, line in enumerate(key_lines)}}
    (tmp / "token").write_text(token + "\n")
    userinfo = f"scraper:{url_password}"
    refused = (("report", f"http://{userinfo}@127.0.0.1:1/metrics"), ("report", f"http://{userinfo}@[::1/metrics"),
               ("report", f"ftp://{userinfo}@127.0.0.1/metrics"), ("report", str(pki / "server.key")),
               ("serve", "--vllm.url", f"http://{userinfo}@127.0.0.1:1/m", "--web.config.file", str(pki / "server.key")),
               ("serve", "--config.file", str(pki / "server.key")),
               ("serve", "--vllm.url", f"gopher://{userinfo}@127.0.0.1:1/m", "--web.listen-address", "127.0.0.1:1"))
    with Upstream(_upstream_handler) as up, ThreadPoolExecutor(3) as pool:
        kinds = ("echo-401", "echo-text", "echo-junk", "echo-html", "slow", "ok", "redirect")
        commands = {f"report {k}": ("report", up.url(f"/{k}", userinfo), "--timeout", "1s") for k in kinds}
        commands["diff --url"] = ("diff", "--url", up.url("/echo-text", userinfo), "--interval", "0.1s")
        commands.update({" ".join(args): args for args in refused})
        runs = {name: pool.submit(run_cli, *args) for name, args in commands.items()}
        # Each kind twice, once per credential form (both on one target are refused at start-up).
        targets = [t for k in kinds for t in ({"name": f"{k}-url", "url": up.url(f"/{k}", userinfo)},
                                              {"name": f"{k}-token", "url": up.url(f"/{k}"),
                                               "bearer_token_file": str(tmp / "token")})]
        names = [t["name"] for t in targets]
        targets.append({"name": "refused", "url": f"http://{userinfo}@127.0.0.1:1/metrics"})
        config = tmp / "c.yaml"
        config.write_text(yaml.safe_dump({"targets": targets, "poll": {"interval": "1s", "timeout": "1s"},
                                          "log": {"level": "debug"}}))
        web_cfg = write_web_config(tmp / "web.yaml", pki, users={"prometheus": bcrypt_hash(auth_password, 4)})
        server, port = start_exporter("--config.file", str(config), "--web.config.file", str(web_cfg),
                                      tls_ca=pki / "ca.crt")
        ctx, base = tls_client(pki), f"https://127.0.0.1:{port}"
        auth = ("prometheus", auth_password)
        surfaces = {}
        try:
            def polled():  # every target reached its upstream: answered, refused, or timed out there
                body = get(f"{base}/metrics", ctx, auth)[1]
                return all(polls(body, t) > polls(body, t, "error") + polls(body, t, "connect_error") for t in names) \
                    and all(polls(body, f"slow-{form}", "timeout") >= 1 for form in ("url", "token"))
            wait_for(polled, 30, "every target polled", step=0.1)
            # Wrong guesses: the right password for an unknown user, a near miss for the known one.
            get(f"{base}/metrics", ctx, ("admin", auth_password))
            get(f"{base}/metrics", ctx, ("prometheus", auth_password[:-1]))
            surfaces["/metrics"] = get(f"{base}/metrics", ctx, auth)[1]
            surfaces["landing page"] = get(f"{base}/", ctx, auth)[1]
            surfaces["summary"] = get(f"{base}/api/v1/summary?window=1m", ctx, auth)[1]
        finally:
            surfaces["logs"] = server.stop()
        done = {name: run.result() for name, run in runs.items()}  # the upstream stays up until the last
    assert "echo-text-url" in surfaces["landing page"] and "scraper" not in surfaces["landing page"]
    # The upstream was reached: it echoed both credential forms back (a poll refused before its
    # request proves nothing about what an echo does).
    schemes = {headers.get("Authorization", "").partition(" ")[0] for _, headers in up.seen}
    assert {"Basic", "Bearer"} <= schemes, schemes
    assert [name for name in map(" ".join, refused) if done[name].returncode == 0] == []
    surfaces.update({name: proc.stdout.decode() + proc.stderr.decode() for name, proc in done.items()})
    found = {name: leaks(text, secrets) for name, text in surfaces.items()}
    assert not any(found.values()), {k: v for k, v in found.items() if v}


# ---- from test_bounds_url_secrets.py
# A target URL's query values are secrets too (issue 19, item 9): ``?token=s3cret``
# is shown as ``?token=<redacted>`` wherever the URL is (landing page, /api/v1/summary,
# logs, errors; /metrics has no URL label) and never leaks, even when the target echoes
# its own URL back. redaction.redact_url and redaction.credentials are the one place, as
# for a URL's user:password.


SHORT_SECRET = "s3cret"  # 6 characters: scrub() replaced only secrets of 8 or more


def test_query_values_are_redacted_and_scrubbed():
    assert redact_url("http://h:9/m?token=s3cret&format=text&debug") == \
        "http://h:9/m?token=<redacted>&format=<redacted>&debug"
    assert redact_url("http://u:pw@[::1]:8000/m?key=a%2Fb") == "http://[::1]:8000/m?key=<redacted>"
    assert redact_url("http://[::1/m?token=s3cret") == "http://<invalid URL>"
    assert redact_url("dumps/a?b=c.prom") == "dumps/a?b=c.prom"  # a file name, not a URL
    assert {"s3cret", "ab%2Fcd", "ab/cd"} <= set(credentials("http://h/m?token=s3cret&key=ab%2Fcd"))


@pytest.mark.parametrize("url", ["user:S3CRETPW@127.0.0.1:18100/metrics", "user:S3CRETPW@[::1]:18100/metrics",
                                 "//user:S3CRETPW@h/m", "http:/user:S3CRETPW@h/m", "http//user:S3CRETPW@h/m",
                                 "http:user:S3CRETPW@h/m", "http:\\\\user:S3CRETPW@h/m", "http//h/m?token=S3CRETPW&a=b"])
def test_a_url_with_its_scheme_mistyped_is_refused_without_its_secret(url):
    """Found attacking the config: a URL with no scheme or a mistyped one was quoted whole."""
    with pytest.raises(ConfigError) as refused:
        build_settings({"targets": [{"name": "vllm", "url": url}]}, {})
    assert "S3CRETPW" not in str(refused.value) and "is not an http(s) URL" in str(refused.value), refused.value
    assert "S3CRETPW" not in redact_url(url)


def test_a_password_cut_at_the_environments_comma_is_not_quoted():
    """VLLM_SPECDEC_EXPORTER_VLLM_URL lists URLs split at commas: a password with a comma is cut in two,
    and neither half may be quoted (the first reads as host:port, which urlsplit refuses)."""
    with pytest.raises(ConfigError) as refused:
        load_settings({}, {"VLLM_SPECDEC_EXPORTER_VLLM_URL": "http://user:pa,SECRETPART@127.0.0.1:18100/metrics"})
    assert "user:pa" not in str(refused.value) and "SECRETPART" not in str(refused.value), refused.value


def test_report_of_a_mistyped_url_does_not_quote_its_password():
    proc = run_cli("report", "user:S3CRETPW@127.0.0.1:18100/metrics")
    out = (proc.stdout + proc.stderr).decode()
    assert proc.returncode != 0 and "S3CRETPW" not in out and "no such file: <redacted>@127.0.0.1" in out, out


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
            "targets": [{"name": k, "url": up.url(f"/{k}?token={SHORT_SECRET}")} for k in kinds],
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
            done = run_cli("report", up.url(f"/{kind}?token={SHORT_SECRET}"), "--timeout", "5s")
            surfaces[f"report {kind}"] = done.stdout.decode() + done.stderr.decode()
    leaked = {name: text[max(0, text.index(SHORT_SECRET) - 200):text.index(SHORT_SECRET) + 20] for name, text in surfaces.items()
              if SHORT_SECRET in text}
    assert leaked == {}
    assert "/ok?token=&lt;redacted&gt;</td>" in surfaces["landing page"]
    assert "/echo-junk?token=&lt;redacted&gt;&#x27;</td>" in surfaces["landing page"]  # the echo, scrubbed
    assert "/ok?token=<redacted>)" in surfaces["report ok"]
    assert "/ok?token=<redacted>" in surfaces["logs"]  # target_up names the URL, redacted


LABEL_SECRET = "pw-LABEL-7731x"
MODEL = "/scratch/weights/deepseek-v4-flash"  # render_dump's


def _echo_in_labels(request: web.Request):
    """A target that puts what it was sent into label values: the URL's password in a model name, the
    query's token in an engine, and its Authorization header in /v1/models' root."""
    password = base64.b64decode(request.headers["Authorization"].split()[-1]).decode().partition(":")[2]
    if request.path.endswith("/v1/models"):
        return web.json_response({"data": [{"id": "m", "root": f"root-{request.headers['Authorization']}"},
                                           {"id": f"id-{password}", "root": "r"}]})
    text = METRICS.decode()
    samples = "".join(line + "\n" for line in text.splitlines() if not line.startswith("#"))
    echoed = samples.replace(f'model_name="{MODEL}"', f'model_name="up-{password}"')
    engine = samples.replace('engine="0"', f'engine="{request.query["token"]}"')
    return web.Response(text=text + echoed + engine)


def test_credentials_a_target_echoes_into_label_values_reach_no_output(tmp_path):
    """Found attacking the sidecar: label values were exported as read, so a target echoing its
    credentials into them had them shown on /metrics (model_name, vllm_specdec_model_info's root),
    the landing page and the summary. Those series are left out, and said once."""
    assert f'model_name="{MODEL}"' in METRICS.decode() and 'engine="0"' in METRICS.decode()
    with Upstream(_echo_in_labels) as up:
        url = up.url("/metrics?token=tok-LABEL-0099").replace("http://", f"http://u:{LABEL_SECRET}@")
        server, port = start_exporter("--vllm.url", url, "--poll.interval", "250ms")
        base = f"http://127.0.0.1:{port}"
        try:
            wait_for(lambda: 'vllm_specdec_up{target="vllm"} 1' in get(f"{base}/metrics")[1], 30, "the target polled")
            wait_for(lambda: "vllm_specdec_model_info{" in get(f"{base}/metrics")[1], 30, "/v1/models read")
            surfaces = {"/metrics": get(f"{base}/metrics")[1], "landing page": get(f"{base}/")[1],
                        "summary": get(f"{base}/api/v1/summary")[1]}
        finally:
            surfaces["logs"] = server.stop()
    for secret in (LABEL_SECRET, "tok-LABEL-0099", base64.b64encode(f"u:{LABEL_SECRET}".encode()).decode()):
        assert not [name for name, text in surfaces.items() if secret in text], secret
    assert f'model_name="{MODEL}"' in surfaces["/metrics"]  # the clean series are kept
    assert "credentials_in_labels" in surfaces["logs"]


def test_a_password_that_starts_like_the_model_name_leaves_its_series_in(tmp_path):
    """Labels are checked against whole secrets: error messages also scrub a secret's first 8+
    characters (a quote cut short), which in labels took the password 'deepseek-v4-pass' for an
    echo in the model name '/scratch/weights/deepseek-v4-flash'."""
    assert "deepseek-v4-pass"[:12] in MODEL and "deepseek-v4-pass" not in MODEL
    with Upstream(lambda request: web.Response(text=METRICS.decode())) as up:
        url = up.url("/metrics").replace("http://", "http://u:deepseek-v4-pass@")
        server, port = start_exporter("--vllm.url", url, "--poll.interval", "250ms")
        try:
            wait_for(lambda: f'model_name="{MODEL}"' in get(f"http://127.0.0.1:{port}/metrics")[1], 30, "the series kept")
        finally:
            logs = server.stop()
    assert "credentials_in_labels" not in logs


def test_harmless_short_query_values_are_not_scrubbed_from_messages():
    """Every query value is redacted where the URL is shown, but only credential-like keys
    (token, key, secret, pass, auth, sig...) or values of 12+ characters are scrubbed from
    free text: with `format=text` scrubbed, "not Prometheus text" read "not Prometheus
    <redacted>" (review of a782915)."""
    from vllm_specdec_exporter.redaction import scrub

    secrets = credentials("http://h:9/m?format=text&token=s3cret&x=0123456789abcdef")
    assert "text" not in secrets and {"s3cret", "0123456789abcdef"} <= set(secrets)
    assert scrub("body is not Prometheus text: s3cret", secrets) == "body is not Prometheus text: <redacted>"
