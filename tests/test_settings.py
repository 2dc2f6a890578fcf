"""The config file (issue 29 item 7): read with the web config's loader (no aliases, bounded
nesting), and every error that quotes it bounded, whatever the file holds."""

from __future__ import annotations

import json
import time

import pytest
from vllm_specdec_exporter.settings import ConfigError, load_settings

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
    ],
)
def test_yaml_the_loader_will_not_build_is_one_line_naming_the_file(tmp_path, text, expected):
    error = refusal(tmp_path, text)
    assert error.startswith(f"config: --config.file: {tmp_path / 'config.yaml'}") and expected in error, error[:300]
    assert "\n" not in error and len(error) < 300 + len(str(tmp_path)), error[:300]


def test_an_anchor_without_an_alias_is_plain_yaml(tmp_path):
    path = tmp_path / "config.yaml"
    path.write_text(f"targets: &t [{{url: '{URL}'}}]\n")
    assert load_settings({"config_file": str(path)}, {}).targets[0].url == URL


def _config(**top) -> str:
    return json.dumps({"targets": [{"url": URL}], **top})  # JSON is YAML


@pytest.mark.parametrize(
    "text, expected",
    [
        (json.dumps({"targets": [{"url": LONG}]}), "targets[0].url: 'xxx"),
        (json.dumps({"targets": [{"url": "ftp://" + LONG}]}), "targets[0].url: 'ftp://xxx"),
        (json.dumps({"targets": [{"url": URL, "name": LONG}]}), "targets[0].name: 'xxx"),
        (json.dumps({"targets": [{"url": URL, "method": [LONG]}]}), "targets[0].method: a list is not a string"),
        (json.dumps({"targets": [{"url": URL, "producer": LONG}]}), "targets[0].producer: 'xxx"),
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
