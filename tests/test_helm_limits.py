"""One place for the limits (issue 22 item 2): the chart's values.schema.json takes `config`'s
keys, health keys, ranges, producers and target-name pattern from the exporter's settings
module, so `helm install` refuses what the exporter would refuse at start-up (a pod that
crash-loops). The test walks settings.LIMITS: each value outside a range is refused by both,
each bound is accepted by both."""

from __future__ import annotations

import json
import re

import pytest
import yaml
from test_helm import CHART, by_kind, helm
from vllm_specdec_exporter import config as cfg
from vllm_specdec_exporter.adapters import PRODUCERS
from vllm_specdec_exporter.generators import schema
from vllm_specdec_exporter.settings import LIMITS, ConfigError, Limit, build_settings

TARGETS = [{"url": "http://127.0.0.1:8000/metrics"}]


def config_with(key: str, value: object) -> dict:
    """A config setting one LIMITS key (a profile's key inside an otherwise valid profile)."""
    if key.startswith("baselines.profiles[]."):
        field = key.rsplit(".", 1)[1]
        profile = {"name": "p", "model": "m", "k": cfg.MAX_K, "mean_acceptance_length": 1.5, field: value}
        return {"targets": TARGETS, "baselines": {"profiles": [profile]}}
    *parents, leaf = key.split(".")
    out: dict = {"targets": TARGETS}
    node = out
    for p in parents:
        node = node.setdefault(p, {})
    node[leaf] = value
    return out


def schema_path(key: str) -> str:
    return "/config/" + key.replace("profiles[].", "profiles/0/").replace(".", "/")


def chart(config: dict, tmp_path, name: str = "v.yaml"):
    values = tmp_path / name
    values.write_text(json.dumps({"config": config}))
    return helm("template", "rel", ".", "-f", str(values), check=False)


def exporter_accepts(config: dict) -> bool:
    try:
        build_settings(config, {})
    except ConfigError:
        return False
    return True


def outside(limit: Limit) -> list[float]:
    step = 1 if limit.integer else 0.5
    values = [limit.low - step, limit.high + step]
    if limit.integer:
        values.append(limit.low + 0.5)  # not an integer
    return values


@pytest.mark.parametrize("key", LIMITS)
def test_every_limit_is_refused_by_the_chart_as_by_the_exporter(key, tmp_path):
    limit = LIMITS[key]
    for i, value in enumerate(outside(limit)):
        config = config_with(key, value)
        assert not exporter_accepts(config), (key, value)
        proc = chart(config, tmp_path, f"bad{i}.yaml")
        assert proc.returncode != 0 and f"at '{schema_path(key)}'" in proc.stderr, (key, value, proc.stderr)
    for i, value in enumerate((limit.low, limit.high)):
        value = int(value) if limit.integer else float(value)
        proc = chart(config_with(key, value), tmp_path, f"ok{i}.yaml")
        assert proc.returncode == 0, (key, value, proc.stderr)
        (cm,) = [d for d in by_kind([d for d in yaml.safe_load_all(proc.stdout) if d], "ConfigMap")
                 if "config.yaml" in d["data"]]
        assert exporter_accepts(yaml.safe_load(cm["data"]["config.yaml"])), (key, value)


def test_collapse_margin_above_one_fails_lint_and_template():
    """The case that crash-looped: the schema let 1.5 through, the exporter refused it at start-up."""
    args = ("--set-json", "config.health.collapse_margin=1.5")
    for proc in (helm("lint", "--strict", ".", *args, check=False), helm("template", "rel", ".", *args, check=False)):
        out = proc.stdout + proc.stderr
        assert proc.returncode != 0 and "at '/config/health/collapse_margin': maximum: got 1.5, want 1" in out, out
    with pytest.raises(ConfigError, match=re.escape("health.collapse_margin: 1.5 is out of range")):
        build_settings({"targets": TARGETS, "health": {"collapse_margin": 1.5}}, {})


@pytest.mark.parametrize("config, chart_says", [
    ({"targets": [{"url": "http://a:1/metrics"}, {"url": "http://b:1/metrics"}]},
     "config.targets[1].name: vllm is another target's too"),
    ({"targets": TARGETS, "web": {"listen_adress": ":1"}}, "at '/config/web': additional properties 'listen_adress'"),
    ({"targets": [{**TARGETS[0], "method": " "}]}, "at '/config/targets/0/method': ' ' does not match pattern"),
    ({"targets": [{**TARGETS[0], "bearer_token_file": ""}]}, "at '/config/targets/0/bearer_token_file': minLength"),
    ({"targets": TARGETS, "baselines": {"profiles": [{"name": "", "model": "m", "k": 2, "mean_acceptance_length": 2}]}},
     "at '/config/baselines/profiles/0/name': minLength"),
    ({"targets": TARGETS, "poll": {"interval": "0m0s"}}, "at '/config/poll/interval': 'not' failed"),
], ids=["two-unnamed-targets", "web-key-typo", "blank-method", "empty-token-file", "empty-profile-name", "zero-duration"])
def test_the_chart_refuses_what_the_exporter_refuses_at_start_up(config, chart_says):
    """Each rendered with helm rc=0 and crash-looped the pod (helper-40)."""
    proc = helm("template", "rel", ".", "--set", "mode=standalone", "--set-json", f"config={json.dumps(config)}", check=False)
    assert proc.returncode != 0 and chart_says in proc.stderr, proc.stderr
    with pytest.raises(ConfigError):
        build_settings(config, {})


def test_an_upper_case_scheme_is_taken_by_both():
    config = {"targets": [{"url": "HTTP://127.0.0.1:8000/metrics"}]}
    helm("template", "rel", ".", "--set", "mode=standalone", "--set-json", f"config={json.dumps(config)}")
    assert build_settings(config, {}).targets[0].url == "HTTP://127.0.0.1:8000/metrics"


def test_every_alert_only_threshold_is_settable_and_a_share_over_one_refused():
    """The chart README lists eight alert-only thresholds: the schema took five (shift_fraction and two
    more were refused), and took 40 for drop_fraction, an AcceptanceDropped that can never fire (helper-40)."""
    from vllm_specdec_exporter.generators.rules.options import ALERT_ONLY_THRESHOLDS, SHARE_THRESHOLDS

    on = ("--set", "prometheusRule.enabled=true", "--set", "prometheusRule.force=true")

    def rules(*args: str) -> str:
        (rule,) = by_kind([d for d in yaml.safe_load_all(helm("template", "rel", ".", *on, *args).stdout) if d], "PrometheusRule")
        return json.dumps(rule["spec"])

    default = rules()
    for key in ALERT_ONLY_THRESHOLDS:  # each accepted, and each changes the rules
        assert rules("--set-json", f"prometheusRule.thresholds.{key}={0.123 if key in SHARE_THRESHOLDS else 12.3}") != default, key
    for key in SHARE_THRESHOLDS:
        proc = helm("template", "rel", ".", *on, "--set-json", f"prometheusRule.thresholds.{key}=40", check=False)
        out = proc.stdout + proc.stderr
        assert proc.returncode != 0 and f"at '/prometheusRule/thresholds/{key}': maximum: got 40, want 1" in out, out


def test_producers_names_and_keys_are_the_exporters(tmp_path):
    committed = json.loads((CHART / "values.schema.json").read_text())["properties"]["config"]
    target = committed["properties"]["targets"]["items"]["properties"]
    assert target["producer"]["enum"] == list(PRODUCERS)
    for name, ok in (("a" * 64, True), ("a" * 65, False), ("bad name", False), ("rank-0.a_b", True)):
        config = {"targets": [{"name": name, "url": "http://x:8000/metrics"}]}
        assert exporter_accepts(config) is ok, name
        assert (chart(config, tmp_path).returncode == 0) is ok, name
    for config in ({"targets": [{"url": "http://x:8000/metrics", "producer": "tgi"}]},
                   {"targets": TARGETS, "health": {"collapse": 0.1}},  # not a health key
                   {"targets": TARGETS, "bogus": 1},  # not a config key
                   {"targets": TARGETS, "log": {"level": "trace"}},
                   {"targets": TARGETS, "baselines": {"profiles": [{"name": "p", "model": "m", "k": 2}]}}):
        assert not exporter_accepts(config), config
        assert chart(config, tmp_path).returncode != 0, config


def test_the_committed_schema_is_the_generated_one(monkeypatch):
    text = (CHART / "values.schema.json").read_text()
    assert schema.with_schema_config(text) == text, "values.schema.json is stale: make generate"
    # A change to the range table reaches the schema (and so the drift check).
    monkeypatch.setitem(LIMITS, "health.collapse_margin", Limit(0.0, 0.5))
    changed = json.loads(schema.with_schema_config(text))
    assert changed["properties"]["config"]["properties"]["health"]["properties"]["collapse_margin"]["maximum"] == 0.5
