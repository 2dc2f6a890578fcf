"""Rules and alerts (generators/rules/files.py, command.py): drift, promtool lint and unit tests, amtool, runbook, and end
to end with a real Prometheus 2.42 scraping the real exporter fed by the simulator."""

from __future__ import annotations

import dataclasses
import re
import subprocess
import time
from pathlib import Path

import promtool_cases
import pytest
import yaml
from conftest import PROMTOOL_SUITES, REPO
from prom_harness import (
    COLLAPSE_AT,
    COLLAPSE_MODEL,
    DEAD_RANK_AT,
    DEAD_RANK_MODEL,
    E2E_OPTIONS,
    HEALTHY_AL,
    Stack,
    tool,
    wait_for,
)
from vllm_specdec_exporter import config, durations
from vllm_specdec_exporter.baselines import match_profile
from vllm_specdec_exporter.generators import rules
from vllm_specdec_exporter.health import judge
from vllm_specdec_exporter.model import Counters
from vllm_specdec_exporter.settings import default_profiles

ALERTS = REPO / "alerts"
ALERT_NAMES = [
    "VLLMSpecDecodeAcceptanceCollapsed", "VLLMSpecDecodeAcceptanceCollapsedFast", "VLLMSpecDecodeEngineCollapsed",
    "VLLMSpecDecodeEngineLagging", "VLLMSpecDecodeFirstPositionAcceptanceLow", "VLLMSpecDecodeAcceptanceBelowBaseline",
    "VLLMSpecDecodeDraftChainBroken", "VLLMSpecDecodeAcceptanceDropped", "VLLMSpecDecodeAcceptanceShifted", "VLLMSpecDecodeNotDrafting", "VLLMSpecDecodeTargetDown", "VLLMSpecDecodeTargetInconsistent",
    "VLLMSpecDecodeExporterAbsent", "VLLMSpecDecodeCounterInvariantViolated", "VLLMSpecDecodeNoBaseline",
    "VLLMSpecDecodeSpeculativeTokensWasted", "VLLMSpecDecodeAcceptanceSuspiciouslyHigh",
    "VLLMSpecDecodeRequestAcceptanceExtreme",
]
SIDECAR_ONLY = {"VLLMSpecDecodeTargetDown", "VLLMSpecDecodeExporterAbsent", "VLLMSpecDecodeTargetInconsistent",
                "VLLMSpecDecodeNoBaseline"}


def alerts_in(path: Path) -> dict[str, dict]:
    data = yaml.safe_load(path.read_text())
    return {r["alert"]: r for g in data["groups"] for r in g["rules"] if "alert" in r}


def test_generated_rules_are_committed():
    schema = REPO / "helm" / "vllm-specdec-exporter" / "values.schema.json"
    assert rules.main(["--check", str(ALERTS), "--chart-schema", str(schema)]) == 0, "stale: run make generate"


def test_generated_promtool_suites_are_committed():
    for filename, text in promtool_cases.render().items():
        assert (ALERTS / "tests" / filename).read_text() == text, f"alerts/tests/{filename} is stale: make generate"


def test_alert_names_severities_and_annotations():
    sidecar, direct = alerts_in(ALERTS / "rules.yaml"), alerts_in(ALERTS / "rules-vllm-direct.yaml")
    assert sorted(sidecar) == sorted(ALERT_NAMES)
    assert sorted(direct) == sorted(set(ALERT_NAMES) - SIDECAR_ONLY)
    for rule in [*sidecar.values(), *direct.values()]:
        assert rule["labels"]["severity"] in ("critical", "warning", "info")
        ann = rule["annotations"]
        assert ("{{" not in ann["summary"] and "{{" in ann["description"]) or rule["alert"] == "VLLMSpecDecodeExporterAbsent"

        assert ann["runbook_url"].endswith("#" + rule["alert"].lower())
    assert sidecar["VLLMSpecDecodeAcceptanceCollapsed"]["labels"]["severity"] == "critical"


COSTED = {"VLLMSpecDecodeAcceptanceCollapsed", "VLLMSpecDecodeAcceptanceCollapsedFast",
          "VLLMSpecDecodeAcceptanceBelowBaseline", "VLLMSpecDecodeAcceptanceDropped"}


@pytest.mark.parametrize("filename", ["rules.yaml", "rules-vllm-direct.yaml"])
def test_collapse_pages_and_degradation_tickets_say_what_the_head_costs(filename):
    """Issue 34 item 3: the collapse pages and the degradation tickets (and only they) read the recorded
    per-server cost and break-even for the alert's own server, on every label the alert carries
    (promtool's suites check the expanded text, figures written by hand)."""
    alerts = alerts_in(ALERTS / filename)
    labels = ["cluster", "namespace", "pod", *(["target"] if filename == "rules.yaml" else []), "model_name"]
    sel = "{" + ",".join(f"{k}=%q" for k in labels) + "}"
    args = " ".join(f"$labels.{k}" for k in labels)
    server = "namespace_pod_model_name:vllm_specdec_"
    for name, rule in alerts.items():
        text = rule["annotations"]["description"]
        assert ("| query" in text) == (name in COSTED), name
        if name not in COSTED:
            continue
        assert f'printf "100 * {server}decode_steps_wasted:ratio_rate5m{sel}" {args} | query' in text, name
        assert f'printf "{server}decode_step_factor:ratio_rate5m{sel}" {args} | query' in text, name
        assert (f'printf "{server}mean_acceptance_length:ratio_rate5m{sel} < {server}break_even_mean_acceptance_length'
                f':max{sel}" {args} {args} | query') in text, name
        assert "{{ else }} Cost unknown: no healthy reference" in text, name
        assert "slower than no speculative decoding: consider turning it off until the head is fixed." in text, name


def test_classifier_and_promtool_give_the_same_verdicts():
    """One source of truth: each VERDICT_CASES series goes through promtool (the suites
    assert the hand-written alerts) and here through the sidecar's classifier, which must
    give the hand-written verdict; and the alerts promtool expects must say that verdict."""
    profiles = default_profiles()
    for pod, model, engines, profile, verdict, alerts in promtool_cases.VERDICT_CASES:
        window = {str(e): Counters(5 * m["drafts"], 5 * m["tokens"], 5 * m["accepted"],
                                   tuple(5 * x for x in m["pos"])) for e, m in enumerate(engines)}
        matched = match_profile(profiles, model, len(engines[0]["pos"]), None)
        assert (matched.name, matched.mean_acceptance_length) == profile if profile else matched is None, pod
        got = judge(window, 300.0, matched, config.DETECTION, config.DEFAULT_MIN_DRAFTS)
        assert got.state == verdict, (pod, got)
        names = {a for a, *_ in alerts}
        assert (got.state == "collapsed") == ("VLLMSpecDecodeAcceptanceCollapsed" in names), pod
        assert (got.state == "degraded") == bool(names - {"VLLMSpecDecodeAcceptanceCollapsed"}), pod
        # Synthetic load and every partial degradation warn; only a collapse pages.
        if got.state != "collapsed":
            assert not names & (promtool_cases.CRITICAL - {"VLLMSpecDecodeEngineCollapsed"}), pod
        for engine, state in got.engines.items():
            flagged = {e for a, e, *_ in alerts if a in ("VLLMSpecDecodeEngineCollapsed", "VLLMSpecDecodeEngineLagging")}
            assert (state in ("collapsed", "degraded")) == (engine in flagged), (pod, engine, state)
    assert {v for *_, v, _ in promtool_cases.VERDICT_CASES} == {"ok", "degraded", "idle", "unknown"}


def test_direct_rules_match_served_names_through_aliases(tmp_path):
    """A served name mapped to a model in the generator reaches that model's profile in
    the vllm-direct file (the sidecar does the same from baselines.aliases)."""
    assert rules.main([str(tmp_path), "--alias", "DSV4-W4A16-FP8-MTP=deepseek-ai/DeepSeek-V4-Pro"]) == 0
    (tmp_path / "rules.yaml").write_text((tmp_path / "rules-vllm-direct.yaml").read_text())
    case = promtool_cases.deployment("vllm-direct", "served", "DSV4-W4A16-FP8-MTP",
                                     [(promtool_cases.mix(1000, [150, 40, 10]), 60)])
    suite = {"rule_files": ["rules.yaml"], "evaluation_interval": "1m", "tests": [{
        "interval": "1m", "input_series": case,
        "promql_expr_test": [{"expr": "namespace_pod_model_name:vllm_specdec_baseline_mean_acceptance_length:max",
                              "eval_time": "30m",
                              "exp_samples": [{"labels": 'namespace_pod_model_name:vllm_specdec_baseline_mean_'
                                               'acceptance_length:max{namespace="llm",pod="served",model_name='
                                               '"DSV4-W4A16-FP8-MTP",profile="deepseek-v4-pro-mtp-k3"}',
                                               "value": 2.49}]}]}]}
    (tmp_path / "t.yaml").write_text(yaml.safe_dump(suite))
    proc = subprocess.run([tool("promtool"), "test", "rules", "t.yaml"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr


@pytest.mark.parametrize("variant", ["sidecar", "vllm-direct"])
def test_a_slow_fall_is_warned_within_30_minutes(tmp_path, variant):
    """Issue 30: AL 2.61 -> 1.80 evenly over 30 minutes. promtool expects no alert at every
    minute of the fall; the minutes it reports the drop alert at are when it fired."""
    promtool_cases.VARIANT["v"] = variant
    start, name = promtool_cases.SLOW_FALL_START, "VLLMSpecDecodeAcceptanceDropped"
    suite = {"rule_files": [str(ALERTS / rules.FILES[variant])], "evaluation_interval": "1m", "tests": [
        promtool_cases.group("slow fall", promtool_cases.slow_fall(variant),
                             [promtool_cases.check(f"{m}m", name, []) for m in range(start, start + 40)])]}
    (tmp_path / "t.yaml").write_text(yaml.safe_dump(suite, width=1000))
    proc = subprocess.run([tool("promtool"), "test", "rules", "t.yaml"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=300)
    fired = sorted(int(h) * 60 + int(m) for h, m in re.findall(r"alertname: " + name + r", time: (\d+)h(\d+)m",
                                                               proc.stdout + proc.stderr))
    assert fired, proc.stdout + proc.stderr
    assert 20 <= fired[0] - start <= 30, fired  # not before the fall passes 40 %, within 30 minutes
    assert fired == list(range(fired[0], start + 40))  # and it stays


@pytest.mark.parametrize("variant", ["sidecar", "vllm-direct"])
def test_dropped_waits_until_a_new_servers_k_has_held_for_its_settling_time(variant):
    """A new pod's warm-up requests (AL ~1.3) had every new pod warn; test_e2e_shift shows the gate
    keeping one quiet on a real Prometheus, and the warning without it."""
    k = "namespace_pod_model_name:vllm_specdec_num_speculative_tokens:max"

    def dropped(o: rules.Options) -> str:
        [rule] = [r for g in rules.rule_file(variant, o)["groups"] for r in g["rules"]
                  if r.get("alert") == "VLLMSpecDecodeAcceptanceDropped"]
        return rule["expr"]

    # k recorded every 3m: nine tenths of the 10m's 3.33 evaluations is 3; every minute, 9.
    assert dropped(rules.default_options()).endswith(f"\nunless on(cluster, namespace, pod, {'target, ' if variant == 'sidecar' else ''}"
                                                     f"model_name) (changes({k}[10m]) > 0 or count_over_time({k}[10m]) < 3)")
    assert dropped(dataclasses.replace(rules.default_options(), long_interval="1m")).endswith("[10m]) < 9)")


@pytest.mark.parametrize("alias, says", [("DSV4", "expected SERVED=MODEL"), ("=deepseek-ai/DeepSeek-V4-Pro", "expected"),
                                         ("DSV4=acme/unknown", "no shipped profile matches the model 'acme/unknown'")])
def test_a_bad_alias_stops_the_generator_naming_it(tmp_path, capsys, alias, says):
    with pytest.raises(SystemExit) as e:
        rules.main([str(tmp_path), "--alias", alias])
    assert e.value.code == 2 and says in capsys.readouterr().err and not list(tmp_path.iterdir())


def test_runbook_has_a_section_per_alert():
    text = (ALERTS / "runbook.md").read_text()
    sections = re.findall(r"^## (\w+)$", text, re.M)
    assert sections == ALERT_NAMES


def test_promtool_check_rules_with_lint():
    proc = subprocess.run([tool("promtool"), "check", "rules", "--lint=all", "--lint-fatal",
                           str(ALERTS / "rules.yaml"), str(ALERTS / "rules-vllm-direct.yaml")],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.count("SUCCESS") == 2


@pytest.mark.timeout(1800)  # waits for the suites started after collection (conftest: the same bound)
@pytest.mark.parametrize("suite", PROMTOOL_SUITES)
def test_promtool_unit_tests(suite, promtool_suites):
    returncode, out = promtool_suites[suite]  # `promtool test rules <suite>`, run after collection
    assert returncode == 0, out[-5000:]
    assert "SUCCESS" in out


def test_promtool_unit_tests_can_fail(tmp_path):
    """A wrong expectation must fail the suite: the suites really evaluate the rules.
    Only the smallest group holding the expectation runs (the whole suites pass above)."""
    suite = yaml.safe_load((ALERTS / "tests" / "sidecar.yaml").read_text())
    groups = [g for g in suite["tests"] if "is 1.036 over 5m" in yaml.safe_dump(g, width=1 << 20)]
    group = min(groups, key=lambda g: len(g["input_series"]))
    text = yaml.safe_dump({**suite, "rule_files": [str(ALERTS / "rules.yaml")], "tests": [group]}, width=1 << 20)
    assert "is 1.036 over 5m" in text
    (tmp_path / "s.yaml").write_text(text.replace("is 1.036 over 5m", "is 1.037 over 5m"))
    proc = subprocess.run([tool("promtool"), "test", "rules", "s.yaml"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=120)
    out = proc.stdout + proc.stderr
    # promtool prints the expected (mutated) and the evaluated annotation
    assert proc.returncode != 0 and "is 1.037 over 5m" in out and "is 1.036 over 5m" in out, out[-2000:]


def test_exactly_the_traffic_floor_is_judged_as_by_the_sidecar(tmp_path):
    """helper-41: at exactly min_drafts_per_second (1 draft/s) the sidecar judges a model (idle only
    under it, as the docs say: "with >= 1"), but the rules read "> 1": a collapse there never paged."""
    lab = 'namespace="llm",pod="one-per-second",model_name="deepseek-ai/DeepSeek-V4-Pro",engine="0",job="vllm"'
    series = [(f"vllm:spec_decode_num_{name}_total{{{lab}}}", f"0+{per_minute}x40")
              for name, per_minute in (("drafts", 60), ("draft_tokens", 120), ("accepted_tokens", 2))]
    series += [(f'vllm:spec_decode_num_accepted_tokens_per_pos_total{{{lab},position="{i}"}}', f"0+{n}x40")
               for i, n in ((0, 2), (1, 0))]
    series += [(f"vllm:generation_tokens_total{{{lab}}}", "0+62x40")]
    rate = "namespace_pod_model_name:vllm_specdec_drafts:rate5m"
    suite = {"rule_files": [str(ALERTS / "rules-vllm-direct.yaml")], "evaluation_interval": "1m", "tests": [{
        "interval": "1m", "input_series": [{"series": s, "values": v} for s, v in series],
        "promql_expr_test": [
            {"expr": rate, "eval_time": "30m", "exp_samples": [
                {"labels": f'{rate}{{model_name="deepseek-ai/DeepSeek-V4-Pro",namespace="llm",pod="one-per-second"}}', "value": 1}]},
            {"expr": 'count(ALERTS{alertname="VLLMSpecDecodeAcceptanceCollapsed",alertstate="firing"})', "eval_time": "30m",
             "exp_samples": [{"labels": "{}", "value": 1}]}]}]}
    (tmp_path / "t.yaml").write_text(yaml.safe_dump(suite, width=1 << 20))
    proc = subprocess.run([tool("promtool"), "test", "rules", "t.yaml"], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-2000:]


def test_alertmanager_example_is_valid():
    proc = subprocess.run([tool("amtool"), "check-config", str(ALERTS / "alertmanager.example.yaml")],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "SUCCESS" in proc.stdout


# --- End to end: a real Prometheus, the real exporter, the simulator ---
# One stack for all of them (prom_harness.collapse_stack): each test waits for the end
# state it needs, then checks the healthy phase and the collapse in Prometheus's history.

SERVER = "namespace_pod_model_name:vllm_specdec_"
AL = f"{SERVER}mean_acceptance_length:ratio_rate5m"


def engine_al(sel: str) -> str:
    """An engine's mean acceptance length from its recorded rates (no ratio is recorded per engine)."""
    e = "namespace_pod_model_name_engine:vllm_specdec_"
    return f"1 + {e}accepted_tokens:rate5m{{{sel}}} / {e}drafts:rate5m{{{sel}}}"


PRO = f'model_name="{COLLAPSE_MODEL}"'
AL_RULE = f"{AL}{{{PRO}}}"
COLLAPSED = "VLLMSpecDecodeAcceptanceCollapsed"
ENGINE_COLLAPSED = "VLLMSpecDecodeEngineCollapsed"


def check_collapse(st: Stack, direct: bool) -> None:
    prom = st.direct_prom if direct else st.prom
    firing = f'ALERTS{{alertname="{COLLAPSED}",alertstate="firing"}}'
    wait_for(lambda: prom.query(firing), st.started + COLLAPSE_AT + 60 - time.time(), f"{COLLAPSED} to fire")
    # Healthy phase (from the rules' first data to scenario time COLLAPSE_AT - 4 s, every
    # second): rules agree with the exporter's own window gauges; nothing pending.
    end = st.started + COLLAPSE_AT - 4
    al = prom.series(AL_RULE, st.started, end)
    assert len(al) >= 3 and all(v == pytest.approx(HEALTHY_AL, rel=0.02) for v in al.values()), al
    start = min(al)
    if not direct:
        for rule, gauge in ((AL_RULE, f'vllm_specdec_mean_acceptance_length{{window="8s",{PRO}}}'),
                            # (over the accepted tokens read with the draft tokens, every long-group interval:
                            # over the 30 s group's, the ramp-up's first seconds read 0.72-0.76 against 0.81;
                            # "> 0" as the recorded ratio divides: a first evaluation before any draft read 0/0, NaN)
                            (f"{SERVER}long_group_accepted_tokens:rate5m{{{PRO}}} / ({SERVER}draft_tokens:rate5m{{{PRO}}} > 0)",
                             f'vllm_specdec_acceptance_ratio{{window="8s",{PRO}}}')):
            by_rule, by_gauge = prom.series(rule, start, end), prom.series(gauge, start, end)
            both = sorted(by_rule.keys() & by_gauge.keys())
            assert len(both) >= 3, (rule, gauge)
            for t in both:
                assert by_rule[t] == pytest.approx(by_gauge[t], rel=0.02), (rule, t, by_rule[t], by_gauge[t])
        # No ratio per server but those an alert reads: position 1's from the recorded rates, over the
        # drafts recorded with them (divided by the drafts of the 30 s group it read 0.45-0.63).
        # From one full window after the first data: the first samples' window holds a few drafts
        # (12 of 17 is 0.706, 2.7 % off; one fresh-clone run in eight read it).
        full = start + durations.parse_duration(E2E_OPTIONS.range("5m"))
        pos = prom.series(f'{SERVER}position_accepted_tokens:rate5m{{position="1",{PRO}}}'
                          f" / ignoring(position) {SERVER}position_drafts:rate5m{{{PRO}}}", full, end)
        assert len(pos) >= 3 and all(v == pytest.approx(0.687, rel=0.02) for v in pos.values()), pos
    # (the server beside it has its own dead rank: test_e2e_one_dead_rank_pages_engine_collapsed)
    healthy_alerts = prom.query_range(f'ALERTS{{alertname=~"VLLMSpecDecode.*",model_name!="{DEAD_RANK_MODEL}"}}',
                                      start, end, 1)
    assert healthy_alerts == [], [a["metric"] for a in healthy_alerts]
    # The collapse at COLLAPSE_AT: pending, then firing.
    after = st.started + COLLAPSE_AT
    states = {state: prom.series(f'ALERTS{{alertname="{COLLAPSED}",alertstate="{state}"}}', after, time.time() + 1)
              for state in ("pending", "firing")}
    assert min(states["pending"]) < min(states["firing"]), states
    labels = prom.query(firing)[0]["metric"]
    assert labels["severity"] == "critical" and labels["model_name"] == "deepseek-ai/DeepSeek-V4-Pro"
    assert prom.value(AL_RULE) < 1.1


def test_e2e_sidecar_rules_on_a_real_prometheus(collapse_stack):
    check_collapse(collapse_stack, direct=False)


def test_e2e_direct_rules_on_a_real_prometheus(collapse_stack):
    check_collapse(collapse_stack, direct=True)


@pytest.mark.parametrize("direct", [False, True], ids=["sidecar", "vllm-direct"])
def test_e2e_one_dead_rank_pages_engine_collapsed(collapse_stack, direct):
    """Beside the collapse, a server of another model loses its draft head on one of its two
    ranks: EngineCollapsed pages for that engine (pending first), its model as a whole is not
    collapsed, and the engines of the model that collapsed entirely never page it (the whole
    model's alert covers them)."""
    st = collapse_stack
    prom = st.direct_prom if direct else st.prom
    firing = f'ALERTS{{alertname="{ENGINE_COLLAPSED}",alertstate="firing"}}'
    wait_for(lambda: prom.query(firing), st.started + DEAD_RANK_AT + 60 - time.time(), f"{ENGINE_COLLAPSED} to fire")
    labels = prom.query(firing)[0]["metric"]
    assert (labels["model_name"], labels["engine"], labels["severity"]) == (DEAD_RANK_MODEL, "1", "critical"), labels
    flash = f'model_name="{DEAD_RANK_MODEL}"'
    assert prom.value(engine_al(f'{flash},engine="1"')) < 1.1
    assert prom.value(engine_al(f'{flash},engine="0"')) == pytest.approx(HEALTHY_AL, rel=0.02)
    assert 1.5 < prom.value(f"{AL}{{{flash}}}") < 2.0  # half the steps still accept: not a collapse
    # Once the other model has collapsed entirely, its engines have still never paged on their own.
    wait_for(lambda: prom.query(f'ALERTS{{alertname="{COLLAPSED}",alertstate="firing"}}'),
             st.started + COLLAPSE_AT + 60 - time.time(), f"{COLLAPSED} to fire")
    ever = prom.query_range(f'ALERTS{{alertname="{ENGINE_COLLAPSED}"}}', st.started, time.time(), 1)
    assert {(a["metric"]["model_name"], a["metric"]["engine"]) for a in ever} == {(DEAD_RANK_MODEL, "1")}, ever
    states = {s: prom.series(f'ALERTS{{alertname="{ENGINE_COLLAPSED}",alertstate="{s}"}}', st.started, time.time() + 1)
              for s in ("pending", "firing")}
    assert min(states["pending"]) < min(states["firing"]), states
