"""The config file (issue 29 item 7): read with the web config's loader (no aliases, bounded
nesting), and every error that quotes it bounded, whatever the file holds.

The settings package's tests: what the deployment runs (issue 30 item 2), and below, the tests
of precedence, the flag table and validation that lived in test_serve, test_adapters and
test_helm_limits."""

from __future__ import annotations

import json
import os
import re
import time

import pytest
from conftest import REPO, run_cli
from vllm_specdec_exporter import config
from vllm_specdec_exporter import config as cfg
from vllm_specdec_exporter.scenarios import load_scenario
from vllm_specdec_exporter.settings import LIMITS, ConfigError, build_settings, load_settings

URL = "http://127.0.0.1:1/metrics"
LONG = "x" * 100_000  # a value that must never be quoted whole


def laughs(levels: int, width: int = 9) -> str:
    """A billion-laughs config: ``width ** levels`` strings from a few hundred bytes, in a value
    whose error quoted it (the code before this fix expanded it into the message)."""
    anchors = ["&l0 [" + ", ".join(["lol"] * width) + "]"]
    anchors += [f"&l{i} [" + ", ".join([f"*l{i - 1}"] * width) + "]" for i in range(1, levels)]
    return f"targets: [{{url: '{URL}'}}]\nmin_drafts: [" + ", ".join(anchors) + "]\n"


def refusal(tmp_path, text: str) -> str:
    path = tmp_path / "config.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as refused:
        load_settings({"config_file": str(path)}, {})
    return str(refused.value)


def test_a_yaml_bomb_in_the_config_file_is_refused_in_one_short_line(tmp_path):
    text = laughs(6)  # 531,441 strings: 6.4 MB in the message before this fix (10^9: ~1 GB until killed)
    assert len(text) < 500
    started = time.monotonic()
    error = refusal(tmp_path, text)
    assert error == f"config: --config.file: {tmp_path / 'config.yaml'}: aliases (*name) are refused (line 2): write the value out"
    assert time.monotonic() - started < 1


@pytest.mark.parametrize(
    "text, expected",
    [
        # merge keys are aliases too
        (f"targets: [{{url: '{URL}'}}]\nbase: &b {{interval: 5s}}\npoll:\n  <<: *b\n", "aliases (*name) are refused (line 4)"),
        # PyYAML composes recursively: this was a RecursionError and a traceback
        ("min_drafts: " + "[" * 50_000 + "\n", "nested deeper than 32 levels (line 1)"),
        # values PyYAML cannot build raised a bare ValueError (a traceback)
        ("min_drafts: 2001-13-45\n", "has a value that cannot be read: month must be in 1..12"),
        ("min_drafts: " + "1" * 5000 + "\n", "has a value that cannot be read: Exceeds the limit (4300 digits)"),
        # found attacking the config: PyYAML kept the last of two equal keys, silently (a second url won)
        (f"targets:\n- url: '{URL}'\n  url: 'http://127.0.0.1:2/m'\n", "the key 'url' appears twice in one mapping (line 3): keep one"),
        (f"targets: [{{url: '{URL}'}}]\npoll: {{interval: 5s}}\npoll: {{interval: 7s}}\n", "the key 'poll' appears twice"),
    ],
)
def test_yaml_the_loader_will_not_build_is_one_line_naming_the_file(tmp_path, text, expected):
    error = refusal(tmp_path, text)
    assert error.startswith(f"config: --config.file: {tmp_path / 'config.yaml'}") and expected in error, error[:300]
    assert "\n" not in error and len(error) < 300 + len(str(tmp_path)), error[:300]


@pytest.mark.parametrize("kind", ["fifo", "large"])
def test_a_config_file_that_is_a_fifo_or_over_1_mib_is_refused_at_once(tmp_path, kind):
    """Found attacking the config: a FIFO with no writer hung start-up for ever, with no word."""
    path = tmp_path / "config.yaml"
    if kind == "fifo":
        os.mkfifo(path)
    else:
        path.write_text(f"targets: [{{url: '{URL}'}}]\n" + "#" * (1 << 20))
    started = time.monotonic()
    with pytest.raises(ConfigError) as refused:
        load_settings({"config_file": str(path)}, {})
    expected = "is not a regular file (a FIFO)" if kind == "fifo" else "is larger than 1,048,576 bytes"
    assert str(refused.value) == f"config: --config.file: {path} {expected}" and time.monotonic() - started < 5


@pytest.mark.parametrize("top, expected", [
    # Found attacking the config: a staleness under the poll interval blanked every derived gauge
    # between polls (up 1, no AL ever), and a number as the profiles list was a TypeError traceback.
    ({"staleness": "1ms"}, "config: staleness: 0.001s is under two poll intervals (poll.interval 5s)"),
    ({"staleness": "9s"}, "config: staleness: 9s is under two poll intervals (poll.interval 5s)"),
    # A poll timeout past the staleness: a target that hung read up 1 for the timeout's hour (helper-40).
    ({"poll": {"interval": "1s", "timeout": "1h"}}, "config: poll.timeout: 3600s is over staleness (60s): a poll may not outlast its figures"),
    ({"poll": {"timeout": "20s"}, "staleness": "15s"}, "config: poll.timeout: 20s is over staleness (15s): a poll may not outlast its figures"),
    ({"baselines": {"profiles": 5}}, "config: baselines.profiles: 5 is not a list of profiles"),
    ({"baselines": {"profiles": {"name": "x"}}}, "config: baselines.profiles: a dict is not a list of profiles"),
])
def test_a_staleness_under_two_polls_or_profiles_not_a_list_are_refused(tmp_path, top, expected):
    assert refusal(tmp_path, _config(**top)) == expected
    assert load_settings({"config_file": str(_write(tmp_path, _config(staleness="10s")))}, {}).staleness == 10
    assert load_settings({"config_file": str(_write(tmp_path, _config(poll={"interval": "500ms", "timeout": "5s"})))},
                         {}).poll_timeout == 5  # over the interval is fine (the e2e's slow CPU vLLM)


@pytest.mark.parametrize("env, flags, expected", [
    # Found attacking the config: a bad value from the environment was named by a flag never given.
    ({"VLLM_SPECDEC_EXPORTER_POLL_INTERVAL": "5 m"}, {"urls": [URL]}, "config: VLLM_SPECDEC_EXPORTER_POLL_INTERVAL: '5 m' is not"),
    ({"VLLM_SPECDEC_EXPORTER_VLLM_URL": "ftp://x"}, {}, "config: VLLM_SPECDEC_EXPORTER_VLLM_URL[0].url: 'ftp://x' is not"),
    ({"VLLM_SPECDEC_EXPORTER_CONFIG_FILE": "/no/such.yaml"}, {}, "config: VLLM_SPECDEC_EXPORTER_CONFIG_FILE: no such file"),
    # the flag given wins, and is the one named
    ({"VLLM_SPECDEC_EXPORTER_POLL_INTERVAL": "5s"}, {"urls": [URL], "poll_interval": "7x"}, "config: --poll.interval: '7x' is not"),
])
def test_a_bad_value_is_named_by_where_it_came_from(env, flags, expected):
    with pytest.raises(ConfigError) as refused:
        load_settings(flags, env)
    assert str(refused.value).startswith(expected), refused.value


def test_a_web_config_that_does_not_load_is_named_by_where_its_path_came_from(tmp_path):
    """helper-29: the web config's errors named --web.config.file whatever gave the path (a variable,
    the file's web.config.file), and an empty flag was named by the file's key."""
    from vllm_specdec_exporter.settings import named_by_source

    failed = ConfigError("--web.config.file", "/etc is not a regular file (a directory)")
    env = {"VLLM_SPECDEC_EXPORTER_WEB_CONFIG_FILE": "/etc"}
    assert str(named_by_source(failed, {}, env)).startswith("config: VLLM_SPECDEC_EXPORTER_WEB_CONFIG_FILE: /etc is")
    assert str(named_by_source(failed, {}, {})).startswith("config: web.config.file: /etc is")
    assert named_by_source(failed, {"web_config_file": "/etc"}, env) is failed  # the flag given is the one named
    with pytest.raises(ConfigError) as refused:
        load_settings({"urls": [URL], "web_config_file": ""}, {})
    assert str(refused.value) == "config: --web.config.file: '' is not a file path"
    cfg = _write(tmp_path, _config(web={"config": {"file": str(tmp_path)}}))
    proc = run_cli("serve", "--config.file", str(cfg))
    assert proc.returncode == 2 and f"config: web.config.file: {tmp_path} is not a regular file" in proc.stderr.decode()


@pytest.mark.parametrize("url", ["http://127.0.0.1:1/metrics ", "http://127.0.0.1:1/met rics", "http://127.0.0.1:1/m\t"])
def test_a_url_with_a_blank_in_it_is_refused(url):
    """Found attacking the config: a trailing space was polled as /metrics%20, a 404 to hunt for."""
    with pytest.raises(ConfigError, match=r"is not an http\(s\) URL"):
        build_settings({"targets": [{"url": url}]}, {})


def _profile_entry(**over) -> dict:
    return {"name": "mine", "model": "acme/.*", "k": 2, "mean_acceptance_length": 2.2, **over}


@pytest.mark.parametrize("profiles, expected", [
    # Found attacking the config: these were taken as the name "[1, 2]", the pattern "5", a method
    # no target has, and the second of two profiles of one name never found.
    ([_profile_entry(name=[1, 2])], "config: baselines.profiles[0].name: a list is not a non-empty string"),
    ([_profile_entry(model=5)], "config: baselines.profiles[0].model: 5 is not a non-empty string"),
    ([_profile_entry(method=["mtp"])], "config: baselines.profiles[0].method: a list is not a non-empty string"),
    ([_profile_entry(), _profile_entry(k=3, mean_acceptance_length=2.5)],
     "config: baselines.profiles: the name 'mine' is given to two profiles"),
])
def test_a_profile_of_the_wrong_shape_is_refused_naming_its_key(tmp_path, profiles, expected):
    assert refusal(tmp_path, _config(baselines={"profiles": profiles})) == expected


@pytest.mark.parametrize("pattern, refused", [
    ("(?:a?){40}a{40}", "a repeat inside a repeat"),  # 2^n: 0.94 s at 24 characters, hours at 40 (helper-40)
    ("((a+)?)+", "a repeat inside a repeat"),
    ("a{1,9}b{1,9}c{1,9}d{1,9}", "more than 3 variable-length repeats"),
    (r"(?i)qwen3-\d{3}b-\d{4}-\d{2}-\d{2}", None),  # fixed counts: refused as "open-ended" before
    ("(?:ab{2}){3}", None),
    ("^deepseek-ai/DeepSeek-V4-(Pro|Flash)$", None),
])
def test_a_profile_pattern_that_backtracks_is_refused_and_fixed_counts_are_not(pattern, refused):
    profiles = {"profiles": [{"name": "p", "model": pattern, "k": 2, "mean_acceptance_length": 2.0}]}
    if refused is None:
        assert build_settings({"targets": [{"url": URL}], "baselines": profiles}, {}).baselines[0].model.pattern == pattern
        return
    with pytest.raises(ConfigError, match=re.escape(refused)):
        build_settings({"targets": [{"url": URL}], "baselines": profiles}, {})


def test_an_anchor_without_an_alias_is_plain_yaml(tmp_path):
    path = tmp_path / "config.yaml"
    path.write_text(f"targets: &t [{{url: '{URL}'}}]\n")
    assert load_settings({"config_file": str(path)}, {}).targets[0].url == URL


def _write(tmp_path, text: str):
    path = tmp_path / "ok.yaml"
    path.write_text(text)
    return path


def _config(**top) -> str:
    return json.dumps({"targets": [{"url": URL}], **top})  # JSON is YAML


@pytest.mark.parametrize(
    "text, expected",
    [
        (json.dumps({"targets": [{"url": LONG}]}), "targets[0].url: 'xxx"),
        (json.dumps({"targets": [{"url": "ftp://" + LONG}]}), "targets[0].url: 'ftp://xxx"),
        (json.dumps({"targets": [{"url": URL, "name": LONG}]}), "targets[0].name: 'xxx"),
        (json.dumps({"targets": [{"url": URL, "method": [LONG]}]}), "targets[0].method: a list is not a non-empty string"),
        (json.dumps({"targets": [{"url": URL, "producer": LONG}]}), "targets[0].producer: 'xxx"),
        (json.dumps({"targets": [{"url": URL, "model": LONG}]}), "targets[0].model: 'xxx"),
        (json.dumps({"targets": [{"url": URL, "profile": LONG}]}), "targets[0].profile: 'xxx"),
        (json.dumps({"targets": [{"url": URL, "k": LONG}]}), "targets[0].k: 'xxx"),
        (json.dumps({"targets": [{"url": URL, "bearer_token_file": ""}]}), "targets[0].bearer_token_file: must be a file path"),
        (json.dumps({"targets": {"url": URL}}), "config: targets: expected a list of targets (- url: ...), not a dict"),
        (_config(web={"listen_address": LONG}), "web.listen_address: 'xxx"),
        (_config(web={"listen_address": LONG + ":99999"}), "web.listen_address: 'xxx"),
        (_config(web={"config": {"file": [LONG]}}), "web.config.file: a list is not a file path"),
        (_config(poll={"interval": LONG}), "poll.interval: 'xxx"),
        (_config(poll={"interval": [LONG]}), "poll.interval: a list is not a duration"),
        (_config(windows=["1m", LONG]), "windows[1]: 'xxx"),
        (_config(windows=["0" * 4000 + "1m", "60s"]), "windows: durations must be distinct, got '000"),
        (_config(health={"window": "9" * 4000 + "s"}), "health.window: '999"),
        (_config(min_drafts=LONG), "min_drafts: 'xxx"),
        (_config(min_drafts=[LONG] * 3), "min_drafts: a list is not an integer"),
        (f"targets: [{{url: '{URL}'}}]\nmin_drafts: 0x{'f' * 5000}\n", "min_drafts: an integer of 20000 bits is out of range"),
        (_config(log={"format": LONG}), "log.format: 'xxx"),
        (_config(baselines={"include_defaults": LONG}), "baselines.include_defaults: 'xxx"),
        (_config(baselines={"profiles": [{"name": "p", "model": "(" + LONG, "k": 2, "mean_acceptance_length": 2}]}),
         "baselines.profiles[0].model: '(xxx"),
        (_config(baselines={"profiles": [{"name": "p", "model": f"(?P=a{LONG})", "k": 2, "mean_acceptance_length": 2}]}),
         "is not a regular expression: "),
        (_config(baselines={"profiles": [{"name": "p", "model": "(a+)+" + LONG, "k": 2, "mean_acceptance_length": 2}]}),
         "a repeat inside a repeat"),
        (f"targets: [{{url: '{URL}'}}]\n? {LONG}\n: 1\n", "config: 'xxx"),
        (f"targets: [{{url: '{URL}'}}]\npoll:\n  ? {LONG}\n  : 1\n", "config: poll.'xxx"),
        (f"targets: [{{url: '{URL}'}}]\nmin_drafts: !<tag:{LONG}> 1\n", "could not determine a constructor for the tag"),
    ],
)
def test_an_error_quotes_at_most_a_hundred_characters_of_the_file(tmp_path, text, expected):
    """Each error names the key and quotes at most SHOWN_CHARS of a value (before, the whole
    value: 100,000 characters here, or a traceback for an int too long to print)."""
    error = refusal(tmp_path, text)
    assert expected in error and "\n" not in error, error[:300]
    assert len(error.replace(str(tmp_path / "config.yaml"), "")) < 400, error[:500]


# --- issue 30 item 2: what the deployment runs (its --model, k, method) and a profile named outright ---


def target_of(target: dict, flags: dict | None = None, env: dict | None = None, **top):
    data = {"targets": [{"url": URL, **target}], **top}
    return (load_settings(flags or {}, env) if env else build_settings(data, flags or {})).targets[0]


def test_a_targets_model_k_method_and_profile():
    t = target_of({"model": "deepseek-ai/DeepSeek-V4-Flash", "k": 2, "method": "mtp", "profile": "deepseek-v4-flash-mtp-k2"})
    assert (t.model, t.k, t.method, t.profile) == ("deepseek-ai/DeepSeek-V4-Flash", 2, "mtp", "deepseek-v4-flash-mtp-k2")
    unset = target_of({})
    assert (unset.model, unset.k, unset.profile) == (None, None, None)
    # A profile of the file's own may be named, and include_defaults: false leaves only those to name.
    mine = {"profiles": [{"name": "mine", "model": "x", "k": 3, "mean_acceptance_length": 2.0}], "include_defaults": False}
    assert target_of({"profile": "mine", "k": 3}, baselines=mine).profile == "mine"


@pytest.mark.parametrize("written, method", [("mtp", "mtp"), ("deepseek_mtp", "mtp"), ("qwen3_next_mtp", "mtp"),
                                             ("MTP", "mtp"), (" Eagle3 ", "eagle3"), ("dspark", "dspark")])
def test_a_method_is_read_as_vllm_runs_it(written, method):
    """vLLM rewrites its per-model MTP names (deepseek_mtp, which the chart passes on from vLLM's own
    --speculative-config) to mtp: the shipped MTP profiles match them, a profile's method alike."""
    t = target_of({"method": written, "k": 2, "profile": "deepseek-v4-pro-mtp-k2"} if method == "mtp" else {"method": written})
    assert t.method == method
    mine = {"profiles": [{"name": "mine", "model": "x", "k": 2, "method": written, "mean_acceptance_length": 2.0}]}
    assert build_settings({"targets": [{"url": URL}], "baselines": mine}, {}).baselines[0].method == method


def test_a_method_no_profile_is_for_is_named():
    assert build_settings({"targets": [{"url": URL, "method": "mpt"}, {"url": URL, "name": "b", "method": "mtp"}]},
                          {}).methods_without_profile == {"vllm": "mpt"}
    assert build_settings({"targets": [{"url": URL, "method": "eagle3"}]}, {}).methods_without_profile == {"vllm": "eagle3"}
    # a profile for any method (none declared) is for every method
    anyone = {"profiles": [{"name": "any", "model": "x", "k": 2, "mean_acceptance_length": 2.0}]}
    assert build_settings({"targets": [{"url": URL, "method": "mpt"}], "baselines": anyone}, {}).methods_without_profile == {}


@pytest.mark.parametrize(
    "target, top, expected",
    [
        ({"profile": "nope"}, {}, "config: targets[0].profile: 'nope' is not a baseline profile (known: "
                                  "deepseek-v4-pro-mtp-k1, deepseek-v4-pro-mtp-k2, "),
        ({"profile": "deepseek-v4-flash-mtp-k2"},
         {"baselines": {"include_defaults": False, "profiles": [{"name": "mine", "model": "x", "k": 2,
                                                                 "mean_acceptance_length": 2.0}]}},
         "config: targets[0].profile: 'deepseek-v4-flash-mtp-k2' is not a baseline profile (known: mine)"),
        ({"profile": "deepseek-v4-flash-mtp-k2", "k": 3}, {},
         "config: targets[0].profile: deepseek-v4-flash-mtp-k2 is for k=2, the target's k is 3: name the profile for k=3"),
        ({"profile": "deepseek-v4-flash-mtp-k2", "method": "eagle3"}, {},
         "config: targets[0].profile: deepseek-v4-flash-mtp-k2 is for method mtp, the target's method is eagle3"),
        ({"profile": 2}, {}, "config: targets[0].profile: 2 is not a string of 1 to 256 characters (a baseline profile's name)"),
        ({"profile": ""}, {}, "config: targets[0].profile: '' is not a string of 1 to 256"),
        ({"model": ["a"]}, {}, "config: targets[0].model: a list is not a string of 1 to 256 characters (vLLM's --model"),
        ({"model": ""}, {}, "config: targets[0].model: '' is not a string"),
        ({"k": "2"}, {}, "config: targets[0].k: '2' is not an integer (valid: 1 to 64)"),
        ({"k": 2.0}, {}, "config: targets[0].k: 2.0 is not an integer"),
        ({"k": True}, {}, "config: targets[0].k: True is not an integer"),
        ({"k": 0}, {}, "config: targets[0].k: 0 is out of range (valid: 1 to 64)"),
        ({"k": 65}, {}, "config: targets[0].k: 65 is out of range (valid: 1 to 64)"),
        ({"method": ""}, {}, "config: targets[0].method: '' is not a non-empty string (e.g. mtp, eagle3)"),
        ({"method": " "}, {}, "config: targets[0].method: ' ' is not a non-empty string"),
        ({"url": "http://scraper:Pa55word99@127.0.0.1:1/metrics", "bearer_token_file": "/t"}, {},
         "config: targets[0]: user:password in the url and a bearer_token_file: give one of the two"),
    ],
)
def test_a_bad_model_k_or_profile_is_one_line_naming_the_key(target, top, expected):
    with pytest.raises(ConfigError) as refused:
        target_of(target, **top)
    assert str(refused.value).startswith(expected) and "\n" not in str(refused.value), str(refused.value)


def test_the_vllm_flags_and_variables_set_every_target_over_the_file():
    flags = {"vllm_model": "/weights/v4-flash", "vllm_k": "2", "vllm_method": "mtp", "vllm_profile": "deepseek-v4-flash-mtp-k2"}
    file_target = {"model": "other", "k": 5, "method": "eagle3", "profile": "deepseek-v4-pro-mtp-k5"}
    t = target_of(file_target, flags)
    assert (t.model, t.k, t.method, t.profile) == ("/weights/v4-flash", 2, "mtp", "deepseek-v4-flash-mtp-k2")
    many = build_settings({}, {"urls": ["a=http://a:1/metrics", "b=http://b:1/metrics"], **flags}).targets
    assert {(u.model, u.k, u.profile) for u in many} == {("/weights/v4-flash", 2, "deepseek-v4-flash-mtp-k2")}
    env = {"VLLM_SPECDEC_EXPORTER_VLLM_URL": URL, "VLLM_SPECDEC_EXPORTER_VLLM_K": "2",
           "VLLM_SPECDEC_EXPORTER_VLLM_PROFILE": "deepseek-v4-flash-mtp-k2"}
    from_env = target_of({}, env=env)
    assert (from_env.k, from_env.profile) == (2, "deepseek-v4-flash-mtp-k2")
    for bad, expected in (({"vllm_k": "2.5"}, "config: --vllm.k: '2.5' is not an integer (valid: 1 to 64)"),
                          ({"vllm_k": "x"}, "config: --vllm.k: 'x' is not an integer"),
                          ({"vllm_profile": "nope"}, "config: --vllm.profile: 'nope' is not a baseline profile (known: "),
                          ({"vllm_k": "3", "vllm_profile": "deepseek-v4-flash-mtp-k2"},
                           "config: --vllm.profile: deepseek-v4-flash-mtp-k2 is for k=2, the target's k is 3")):
        with pytest.raises(ConfigError) as refused:
            target_of({}, bad)
        assert str(refused.value).startswith(expected), str(refused.value)


# --- settings tests that lived in other files: moved here unchanged (issue 32) ---
# from test_serve.py: precedence, the documented example, the one table of flags, keys and variables


@pytest.mark.parametrize("address, host", [(":9746", ""), ("0.0.0.0:9746", "0.0.0.0"), ("[::1]:9746", "::1"),
                                           ("::1:9746", "::1"), ("exporter.llm.svc.cluster.local:9746", "exporter.llm.svc.cluster.local")])
def test_a_listen_address_host_is_an_ip_or_a_host_name(address, host):
    assert build_settings({"targets": [{"url": URL}], "web": {"listen_address": address}}, {}).listen_host == host


def test_a_mistyped_variable_is_refused_naming_it():
    """A VLLM_SPECDEC_EXPORTER_ variable that names no flag was ignored (helper-40): refused as a mistyped
    flag or key is, naming it and not quoting its value; the image's REVISION is not a setting."""
    env = {"VLLM_SPECDEC_EXPORTER_VLLM_URL": URL, "VLLM_SPECDEC_EXPORTER_POLL_INTERVALL": "S3CRET-1h"}
    with pytest.raises(ConfigError) as refused:
        load_settings({}, env)
    message = str(refused.value)
    assert message.startswith("config: VLLM_SPECDEC_EXPORTER_POLL_INTERVALL: unknown variable (valid: ") and "S3CRET" not in message
    assert "POLL_INTERVAL," in message and "\n" not in message
    assert load_settings({}, {"VLLM_SPECDEC_EXPORTER_VLLM_URL": URL, "VLLM_SPECDEC_EXPORTER_REVISION": "abc"}).targets


def test_precedence_flags_then_env_then_file(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("targets: [{url: 'http://file:1/m', name: f}]\npoll: {interval: 7s}\nweb: {listen_address: ':1111'}\n")
    env = {"VLLM_SPECDEC_EXPORTER_POLL_INTERVAL": "3s", "VLLM_SPECDEC_EXPORTER_VLLM_URL": "a=http://env:1/m,b=http://env:2/m"}
    s = load_settings({"config_file": str(path)}, env)
    assert s.poll_interval == 3 and [t.name for t in s.targets] == ["a", "b"] and s.listen_port == 1111
    s = load_settings({"config_file": str(path), "poll_interval": "2s", "urls": ["http://flag:1/m"]}, env)
    assert s.poll_interval == 2 and [(t.name, t.url) for t in s.targets] == [("vllm", "http://flag:1/m")]
    s = load_settings({"config_file": str(path)}, {})
    assert s.poll_interval == 7 and s.targets[0].name == "f"
    # Named by the variable it came from (it was --poll.interval, a flag never given).
    with pytest.raises(ConfigError, match=r"^config: VLLM_SPECDEC_EXPORTER_POLL_INTERVAL: 'never'"):
        load_settings({"urls": ["http://x:1/m"]}, {"VLLM_SPECDEC_EXPORTER_POLL_INTERVAL": "never"})


def test_urls_given_by_flag_or_variable_count_the_file_targets_they_replace(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("targets: [{url: 'http://file:1/m', name: f}, {url: 'http://file:2/m', name: g}]\n")
    assert load_settings({"config_file": str(path)}, {}).file_targets_replaced == 0
    by_flag = load_settings({"config_file": str(path), "urls": ["http://flag:1/m"]}, {})
    assert (by_flag.file_targets_replaced, by_flag.file_targets_replaced_by) == (2, "--vllm.url")
    env = {"VLLM_SPECDEC_EXPORTER_VLLM_URL": "http://env:1/m"}
    by_env = load_settings({"config_file": str(path)}, env)
    assert (by_env.file_targets_replaced, by_env.file_targets_replaced_by) == (2, "VLLM_SPECDEC_EXPORTER_VLLM_URL")
    assert load_settings({"config_file": str(path), "urls": ["http://flag:1/m"]}, env).file_targets_replaced_by == "--vllm.url"
    assert load_settings({"urls": ["http://flag:1/m"]}, {}).file_targets_replaced == 0


def test_the_documented_example_config_loads():
    from conftest import REPO

    s = load_settings({"config_file": str(REPO / "examples" / "config.yaml")}, {})
    assert s.targets[0].method == "mtp"
    assert s.baselines[0].name == "my-v4-pro-chat"  # user profiles before the shipped ones
    assert {p.name for p in s.baselines} >= {"deepseek-v4-pro-mtp-k2", "deepseek-v4-flash-mtp-k2"}
    assert [w for w, _ in s.windows] == ["1m", "5m", "15m", "1h"]


def test_flags_keys_and_environment_variables_map_one_way_from_one_table():
    from vllm_specdec_exporter.cli import build_parser
    from vllm_specdec_exporter.settings import FLAGS, flags_markdown

    assert flags_markdown() in (REPO / "docs" / "configuration.md").read_text(), \
        "docs/configuration.md's flag table differs from settings.FLAGS (make generate)"
    # Written out by hand: the rule, not the code's rendering of it.
    expected = {"--web.listen-address": ("web.listen_address", "VLLM_SPECDEC_EXPORTER_WEB_LISTEN_ADDRESS"),
                "--web.config.file": ("web.config.file", "VLLM_SPECDEC_EXPORTER_WEB_CONFIG_FILE"),
                "--poll.interval": ("poll.interval", "VLLM_SPECDEC_EXPORTER_POLL_INTERVAL"),
                "--log.format": ("log.format", "VLLM_SPECDEC_EXPORTER_LOG_FORMAT"),
                "--log.level": ("log.level", "VLLM_SPECDEC_EXPORTER_LOG_LEVEL"),
                "--vllm.url": (None, "VLLM_SPECDEC_EXPORTER_VLLM_URL"),
                "--vllm.model": (None, "VLLM_SPECDEC_EXPORTER_VLLM_MODEL"),
                "--vllm.method": (None, "VLLM_SPECDEC_EXPORTER_VLLM_METHOD"),
                "--vllm.k": (None, "VLLM_SPECDEC_EXPORTER_VLLM_K"),
                "--vllm.profile": (None, "VLLM_SPECDEC_EXPORTER_VLLM_PROFILE"),
                "--config.file": (None, "VLLM_SPECDEC_EXPORTER_CONFIG_FILE")}
    assert {f.flag: (f.key, f.env) for f in FLAGS} == expected
    serve = build_parser()._subparsers._group_actions[0].choices["serve"]
    assert sorted(o for a in serve._actions for o in a.option_strings if o not in ("-h", "--help")) == sorted(expected)


def test_each_flag_its_key_and_its_variable_set_the_same_setting(tmp_path):
    path = tmp_path / "c.yaml"
    cases = {"web.listen_address": ("web: {listen_address: '127.0.0.1:1234'}", "--web.listen-address", "127.0.0.1:1234"),
             "poll.interval": ("poll: {interval: 3s}", "--poll.interval", "3s"),
             "log.level": ("log: {level: debug}", "--log.level", "debug")}
    from vllm_specdec_exporter.cli import build_parser
    from vllm_specdec_exporter.settings import FLAGS

    by_flag = {f.flag: f for f in FLAGS}
    for key, (yaml_text, flag, value) in cases.items():
        path.write_text(f"targets: [{{url: 'http://a:1/m'}}]\n{yaml_text}\n")
        from_file = load_settings({"config_file": str(path)}, {})
        args = vars(build_parser().parse_args(["serve", "--vllm.url", "http://a:1/m", flag, value]))
        from_flag = load_settings(args, {})
        from_env = load_settings({"urls": ["http://a:1/m"]}, {by_flag[flag].env: value})
        assert from_file == from_flag == from_env, key
    path.write_text("targets: [{url: 'http://a:1/m'}]\nlisten_address: ':1'\n")
    with pytest.raises(ConfigError, match=r"renamed to web\.listen_address"):
        load_settings({"config_file": str(path)}, {})


# from test_adapters.py


def test_config_producer_is_validated():
    from vllm_specdec_exporter.settings import ConfigError, build_settings

    with pytest.raises(ConfigError, match=r"targets\[0\]\.producer: 'tgi' is not a known producer \(one of vllm-v0"):
        build_settings({"targets": [{"url": "http://127.0.0.1:1/metrics", "producer": "tgi"}]}, {})


# from test_helm_limits.py (no helm needed)
TARGETS = [{"url": "http://127.0.0.1:8000/metrics"}]


def test_detection_is_built_once_from_the_table():
    s = build_settings({"targets": TARGETS, "min_drafts": 7, "health": {"collapse_margin": 0.2}}, {})
    assert s.detection == cfg.Detection(collapse_margin=0.2, min_drafts=7)
    assert s.detection is s.detection and (s.min_drafts, s.health_window) == (7, "5m")
    assert "min_drafts" not in cfg.DETECTION_KEYS and set(cfg.DETECTION_KEYS) - {"window"} == {
        k.split(".", 1)[1] for k in LIMITS if k.startswith("health.")}
    with pytest.raises(ConfigError, match="baselines.profiles.0..mean_acceptance_length: 65.5 is out of range "
                                          r"\(valid: 1 to 65\)"):
        build_settings({"targets": TARGETS, "baselines": {"profiles": [
            {"name": "p", "model": "m", "k": cfg.MAX_K, "mean_acceptance_length": cfg.MAX_K + 1.5}]}}, {})


# --- issue 32: the package's layout ---
# Each module imports only the ones before it here (no cycle), so the sources (flags, overrides,
# yamlfile) stay apart from validation, and none imports what serves, the CLI or the package itself.
SETTINGS_ORDER = ("values", "yamlfile", "flags", "overrides", "checks", "targets", "profiles", "validate", "__init__")
SERVING = {"server", "web", "poller", "views", "collector", "cli", "demo", "webconfig", "generators"}


def test_the_settings_modules_import_one_way_and_nothing_that_serves():
    import ast

    package = REPO / "exporter" / "vllm_specdec_exporter" / "settings"
    assert sorted(p.stem for p in package.glob("*.py")) == sorted(SETTINGS_ORDER)
    for path in package.glob("*.py"):
        assert len(path.read_text().splitlines()) <= 300, f"{path.name}: one job per module"
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.ImportFrom) or not node.level:
                continue
            if node.level == 1:
                assert node.module, f"{path.name}: `from . import ...`: the package itself"
                assert SETTINGS_ORDER.index(node.module) < SETTINGS_ORDER.index(path.stem), f"{path.name} imports {node.module}"
            else:
                names = {node.module.split(".")[0]} if node.module else {a.name for a in node.names}
                assert not names & SERVING, f"{path.name} imports {sorted(names & SERVING)}"


# ---- from test_max_k.py
# One maximum k (issue 12 item 4): config.MAX_K bounds k where profiles, scenarios and
# payloads are read; a target whose k is above the positions the generated rules cover is
# still read and exported, with one warning that the wasted-tokens alert cannot fire for it.


def test_profiles_and_scenarios_take_k_up_to_the_one_maximum(tmp_path):
    def profile(k: int) -> dict:
        return {"targets": [{"name": "t", "url": "http://127.0.0.1:1/metrics"}],
                "baselines": {"profiles": [{"name": "p", "model": "m", "k": k, "mean_acceptance_length": 1.5}]}}
    assert build_settings(profile(config.MAX_K), {}).baselines[0].k == config.MAX_K
    with pytest.raises(ConfigError, match="k"):
        build_settings(profile(config.MAX_K + 1), {})
    for k, ok in ((config.MAX_K, True), (config.MAX_K + 1, False)):
        path = tmp_path / f"k{k}.yaml"
        path.write_text(f"k: {k}\nengines: 1\ndrafts_per_second: 10\nper_position: {[0.5] * k}\n")
        if ok:
            assert load_scenario(str(path)).k == k
        else:
            with pytest.raises(ConfigError, match=f"k must be 1-{config.MAX_K}"):
                load_scenario(str(path))


@pytest.mark.parametrize("entry", ["http//admin:s3cr=etpw@127.0.0.1:8000/metrics", "admin:s3cr=etpw@127.0.0.1:8000/m",
                                   "http://admin:s3cr=etpw@127.0.0.1:8000/m?x"])
def test_a_url_flag_with_an_equals_sign_is_a_url_not_a_name(entry):
    """NAME=URL only where NAME is a target name: an '=' in a mistyped URL's password made the part
    before it a "name", quoted in the error (helper-29); now the URL is refused, its password redacted."""
    try:
        targets = build_settings({}, {"urls": [entry]}).targets
    except ConfigError as refused:
        assert str(refused).startswith("config: --vllm.url[0].url: '<redacted>@127.0.0.1:8000/m"), str(refused)
        assert "s3cr" not in str(refused) and "admin" not in str(refused)
    else:
        assert [(t.name, t.url) for t in targets] == [("vllm", entry)]
