"""Hostile or careless web config values (webconfig/load.py; issue 19 item 9): header
values that are not one line of printable ASCII, YAML that expands. Refused with one
line naming what is wrong, at start-up (exit 2) and on reload (the last good config
goes on serving, /healthz included).

The real `serve` command and real files."""

from __future__ import annotations

import time

import pytest
import yaml
from security_harness import get_full, laughs, log_events, serve_refuses, start_exporter, write_web_config

HASH = "$2b$04$q/gJrV.MVg9Bqw7mZ5kEEOb5eP3HOo.MbM0C06r/aoqQwZdxi.muq"  # bcrypt of "pw" at cost 4

BAD_HEADER_VALUES = {
    "CRLF": "default-src 'self'\r\nX-Injected: 1",
    "LF": "default-src 'self'\nX-Injected: 1",
    "NUL": "default-src 'self'\0",
}


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


# --- YAML bombs: bounded before they are parsed (the file's size: test_webconfig_files.py) ---

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
    from vllm_specdec_exporter.webconfig.load import load_web_config
    path = tmp_path / "web.yaml"
    path.write_text(content)
    with pytest.raises(ConfigError, match=None) as refused:
        load_web_config(str(path))
    assert expected in str(refused.value), refused.value


@pytest.mark.parametrize("content, expected", [
    # A section of the wrong type was ignored without a word (TLS or the passwords off, unsaid).
    ("tls_server_config: []\n", "config: tls_server_config: expected a mapping, not a list"),
    ("tls_server_config: ''\n", "config: tls_server_config: expected a mapping, not ''"),
    ("basic_auth_users: []\n", "config: basic_auth_users: expected a mapping, not a list"),
    ("rate_limit: 0\n", "config: rate_limit: expected a mapping, not 0"),
    ("http_server_config: []\n", "config: http_server_config: expected a mapping, not a list"),
    # YAML reads these user names as other types: the operator's user got 401 and nothing said why.
    (f"basic_auth_users:\n  yes: '{HASH}'\n", "config: basic_auth_users.True: a user name must be a string (YAML read a bool): quote it"),
    (f"basic_auth_users:\n  0123: '{HASH}'\n", "config: basic_auth_users.83: a user name must be a string (YAML read a int)"),
    (f"basic_auth_users:\n  ~: '{HASH}'\n", "config: basic_auth_users.None: a user name must be a string"),
    # A long interval was quoted whole: a 3,125-character line (helper-40).
    (f"rate_limit: {{interval: '{'x' * 3000}', burst: 2}}\n", "config: rate_limit.interval: 'xxxxx"),
    (f"rate_limit: {{interval: {'9' * 3000}, burst: 2}}\n", "config: rate_limit.interval: an integer of 9966 bits is not a duration"),
])
def test_a_section_or_user_name_of_the_wrong_type_is_refused(tmp_path, content, expected):
    from vllm_specdec_exporter.settings import ConfigError
    from vllm_specdec_exporter.webconfig.load import load_web_config
    path = tmp_path / "web.yaml"
    path.write_text(content)
    with pytest.raises(ConfigError) as refused:
        load_web_config(str(path))
    assert str(refused.value) == expected or str(refused.value).startswith(expected), refused.value
    assert len(str(refused.value)) < 200, refused.value


def test_empty_sections_and_quoted_user_names_load(tmp_path):
    from vllm_specdec_exporter.webconfig.load import load_web_config
    path = tmp_path / "web.yaml"
    path.write_text(f"tls_server_config:\nrate_limit: {{}}\nbasic_auth_users:\n  'yes': '{HASH}'\n  '0123': '{HASH}'\n")
    cfg = load_web_config(str(path))
    assert (cfg.ssl_context, cfg.rate_limit, sorted(cfg.users)) == (None, None, ["0123", "yes"])
