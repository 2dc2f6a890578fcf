"""Where each rule runs, for fleet scale (docs/scale.md; generators/rules/recording.py, files.py):
what is recorded per engine and per server, and what is evaluated every 3 minutes instead of
every 30 s. bench/bench_fleet.py measures the cost; these hold the structure that cost depends on."""

from __future__ import annotations

import re

import pytest
from vllm_specdec_exporter.generators import rules
from vllm_specdec_exporter.generators.rules import options

VARIANTS = ("sidecar", "vllm-direct")


def groups(variant: str) -> dict[str, dict]:
    return {g["name"].removesuffix(f"-{variant}"): g for g in rules.rule_file(variant)["groups"]}


def names(group: dict) -> set[str]:
    return {r.get("record") or r["alert"] for r in group["rules"]}


@pytest.mark.parametrize("variant", VARIANTS)
def test_k_the_baseline_and_the_invariant_alert_run_every_3_minutes(variant):
    g = groups(variant)
    assert set(g) == {"vllm-specdec-recording", "vllm-specdec-recording-long", "vllm-specdec-alerts",
                      "vllm-specdec-alerts-long"}
    assert g["vllm-specdec-recording-long"]["interval"] == g["vllm-specdec-alerts-long"]["interval"] == "3m"
    assert "interval" not in g["vllm-specdec-recording"] and "interval" not in g["vllm-specdec-alerts"]
    long = names(g["vllm-specdec-recording-long"])
    assert {"namespace_pod_model_name:vllm_specdec_num_speculative_tokens:max",
            "namespace_pod_model_name:vllm_specdec_baseline_mean_acceptance_length:max"} <= long
    # None pages: the invariant alert is info, EngineLagging a warning with a 15m `for`,
    # AcceptanceShifted one that reads records of the long group; the two info alerts over the
    # hour (the last position wasted, the per-request extremes) read what changes every 3 minutes.
    assert names(g["vllm-specdec-alerts-long"]) == {"VLLMSpecDecodeCounterInvariantViolated",
                                                    "VLLMSpecDecodeEngineLagging",
                                                    "VLLMSpecDecodeAcceptanceShifted",
                                                    "VLLMSpecDecodeSpeculativeTokensWasted",
                                                    "VLLMSpecDecodeRequestAcceptanceExtreme"}
    # The pages and the warnings are judged every evaluation.
    assert {"VLLMSpecDecodeAcceptanceCollapsedFast", "VLLMSpecDecodeAcceptanceCollapsed",
            "VLLMSpecDecodeEngineCollapsed", "VLLMSpecDecodeAcceptanceBelowBaseline"} <= names(g["vllm-specdec-alerts"])


@pytest.mark.parametrize("variant", VARIANTS)
def test_per_engine_only_two_rates_and_per_server_only_the_ratios_a_rule_reads(variant):
    every = [r for g in rules.rule_file(variant)["groups"] for r in g["rules"]]
    records = [r["record"] for r in every if "record" in r]
    assert sorted(r for r in records if r.startswith("namespace_pod_model_name_engine:")) == [
        "namespace_pod_model_name_engine:vllm_specdec_accepted_tokens:rate5m",
        "namespace_pod_model_name_engine:vllm_specdec_drafts:rate5m",
    ]
    server_ratios = {r for r in records if r.startswith("namespace_pod_model_name:") and ":ratio_rate" in r}
    server_rates = {r for r in records if r.startswith("namespace_pod_model_name:") and ":rate" in r}
    read = set().union(*(rules.references(r["expr"]) for r in every))
    # ... except what a head costs (issue 34): kept per server for the on-call page and the dashboard.
    cost = {r for r in server_ratios | server_rates if r.split(":")[1].removeprefix("vllm_specdec_") in rules.COST_PER_SERVER}
    assert cost == {"namespace_pod_model_name:vllm_specdec_decode_step_factor:ratio_rate5m",
                    "namespace_pod_model_name:vllm_specdec_decode_steps_wasted:ratio_rate5m",
                    "namespace_pod_model_name:vllm_specdec_healthy_output_tokens:rate5m"}
    assert (server_ratios | server_rates) - cost <= read, (server_ratios | server_rates) - cost - read
    # Over 30m and 1h per server only what an alert reads: not generation or draft tokens over 1h.
    assert "namespace_pod_model_name:vllm_specdec_generation_tokens:rate1h" not in records
    assert "namespace_pod_model_name:vllm_specdec_generation_tokens:rate30m" not in records
    # What the alerts read is there: AL over 5m and 30m, acceptance over 30m, positions over 1h.
    assert {"namespace_pod_model_name:vllm_specdec_mean_acceptance_length:ratio_rate5m",
            "namespace_pod_model_name:vllm_specdec_acceptance_ratio:ratio_rate30m",
            "namespace_pod_model_name:vllm_specdec_position_acceptance_ratio:ratio_rate1h"} <= server_ratios
    # The dashboards' levels keep every ratio.
    for w in ("5m", "30m", "1h"):
        for ratio in ("acceptance_ratio", "effective_draft_length", "draft_token_share", "position_acceptance_ratio"):
            assert f"namespace_model_name:vllm_specdec_{ratio}:ratio_rate{w}" in records


@pytest.mark.parametrize("variant", VARIANTS)
def test_a_long_window_reads_its_own_levels_5m_rates_not_every_servers(variant):
    exprs = {r["record"]: r["expr"] for g in rules.rule_file(variant)["groups"] for r in g["rules"] if "record" in r}
    for level in ("namespace_model_name", "model_name"):
        for w, span in (("30m", "1500s"), ("1h", "3300s")):
            for metric in ("drafts", "accepted_tokens", "generation_tokens", "position_accepted_tokens"):
                got = exprs[f"{level}:vllm_specdec_{metric}:rate{w}"]
                assert got == f"avg_over_time({level}:vllm_specdec_{metric}:rate5m[{span}])", got


def test_the_invariant_alert_reads_each_engines_totals_at_one_instant():
    """Issue 35 item 3: vLLM-direct's invariant alert was the costliest rule (three [5m] rates per
    engine, accepted tokens three times). Now one sample per series: accepted read twice, the draft
    tokens and the positions once, each summed per engine (a per-server sum hides one engine of eight)."""
    (expr,) = [r["expr"] for g in rules.rule_file("vllm-direct")["groups"] for r in g["rules"]
               if r.get("alert") == "VLLMSpecDecodeCounterInvariantViolated"]
    assert "[" not in expr and "rate(" not in expr, expr
    assert expr.count("vllm:spec_decode_num_accepted_tokens_total") == 2
    assert expr.count("vllm:spec_decode_num_draft_tokens_total") == 1
    assert expr.count("vllm:spec_decode_num_accepted_tokens_per_pos_total") == 1
    assert expr.count("sum by (cluster, namespace, pod, model_name, engine)") == 4
    # The sidecar's float slack, not the rates' 0.1 %
    assert "> 1e-09" in expr and "1.000000001 *" in expr


@pytest.mark.parametrize("variant", VARIANTS)
def test_the_per_position_counters_are_read_every_3_minutes_by_what_no_page_reads(variant):
    """Issue 35: the raw per-position read (every engine's positions, vLLM-direct's 80,000 series at
    10,000 engines) was the costliest of every 30 s evaluation. Its 5m rates and their ratios are
    recorded in the long group; what reads them judges over a `for` of 15m or more, never a page."""
    g = groups(variant)
    counter = (options.SIDECAR if variant == "sidecar" else options.DIRECT).per_pos

    def reading(group: dict, text: str) -> set[str]:
        return {r.get("record") or r["alert"] for r in group["rules"] if text in r["expr"]}

    assert reading(g["vllm-specdec-recording"], counter) == set()
    assert reading(g["vllm-specdec-recording-long"], counter) >= {
        "namespace_pod_model_name:vllm_specdec_position_accepted_tokens:rate5m"}
    position_5m = {r["record"] for r in g["vllm-specdec-recording-long"]["rules"] if r["record"].endswith("rate5m")
                   and ("position" in r["record"] or "acceptance_count" in r["record"])}
    assert {f"{level}:vllm_specdec_{what}:ratio_rate5m" for level in ("namespace_model_name", "model_name")
            for what in ("position_acceptance_ratio", "position_conditional_acceptance_ratio",
                         "acceptance_count_ratio")} <= position_5m
    # Recorded before the hour reads them, within the group.
    order = [r["record"] for r in g["vllm-specdec-recording-long"]["rules"]]
    assert order.index("namespace_pod_model_name:vllm_specdec_position_accepted_tokens:rate5m") < order.index(
        "namespace_pod_model_name:vllm_specdec_position_accepted_tokens:rate1h")
    for alert in g["vllm-specdec-alerts"]["rules"]:
        if any(p in alert["expr"] for p in position_5m):
            assert alert["labels"]["severity"] != "page", alert["alert"]
            assert int(alert["for"].removesuffix("m")) >= 15, alert["alert"]
            # ... over the drafts recorded with the positions: over the 30 s group's, a pod's first minutes
            # and a traffic step read position 0 at half its value for minutes (helper-25).
            assert not DRAFTS_DIVISOR.search(alert["expr"]), alert["alert"]
            assert "(namespace_pod_model_name:vllm_specdec_position_drafts:rate5m >" in alert["expr"], alert["alert"]


# A division by the drafts rates of the 30 s group (not by a traffic gate that reads them).
DRAFTS_DIVISOR = re.compile(r"/ (?:ignoring\(position\) group_left\(\) |on\([^)]*\) )?\(?[a-z_]+:vllm_specdec_drafts:rate")


@pytest.mark.parametrize("variant", VARIANTS)
def test_every_position_ratio_divides_by_drafts_recorded_with_the_positions(variant):
    """A ratio of series sampled at different times is not a ratio: the 5m positions (every 3 minutes)
    over the 30 s group's drafts read 2.59 at a model's first pods, and their hour, averaged from samples
    weighed apart, let one traffic burst record a steady 0.40 drafter's best hour at 0.52 (helper-25)."""
    records = [r for g in rules.rule_file(variant)["groups"] for r in g["rules"] if "record" in r]
    where = {r["record"]: g["name"] for g in rules.rule_file(variant)["groups"] for r in g["rules"] if "record" in r}
    dividing = [r for r in records if "position_accepted_tokens:rate" in r["expr"] and "/" in r["expr"]
                and ":max_over_time" not in r["record"]]
    assert len(dividing) >= 9, [r["record"] for r in dividing]
    for r in dividing:
        assert not DRAFTS_DIVISOR.search(r["expr"]), r["record"]
    for level in ("namespace_pod_model_name", "namespace_model_name", "model_name"):
        pos, drafts = (f"{level}:vllm_specdec_{m}:rate5m" for m in ("position_accepted_tokens", "position_drafts"))
        assert where[pos] == where[drafts], level


LONG_GROUP_RATIOS = {"acceptance_ratio": "draft_tokens", "effective_draft_length": "draft_tokens"}


@pytest.mark.parametrize("variant", VARIANTS)
def test_the_draft_token_counter_is_read_every_3_minutes_with_what_it_divides(variant):
    """Issue 35: the raw draft-token read was among the costliest of a 30 s evaluation, and nothing
    that pages reads it. Its rates are recorded in the long group at every window; each ratio over them
    is recorded there too, over rates read at the same evaluations (the accepted tokens and the drafts
    read with the positions): over the 30 s group's, read up to an evaluation apart, a first window
    read 0.72 for 0.81 (test_rules' sidecar stack), and averaged from samples taken apart, an hour
    of bursts weighs the two sides differently (as it did the positions, helper-25). The generation
    tokens stay at 30 s: NotDrafting reads them per server."""
    g = groups(variant)
    src = options.SIDECAR if variant == "sidecar" else options.DIRECT
    fast = [r for n in ("vllm-specdec-recording", "vllm-specdec-alerts") for r in g[n]["rules"]]
    assert not [r.get("record") or r["alert"] for r in fast if src.draft_tokens in r["expr"]]
    assert [r["record"] for r in fast if src.generation in r["expr"]] == [
        "namespace_pod_model_name:vllm_specdec_generation_tokens:rate5m"]
    long = {r["record"]: r["expr"] for r in g["vllm-specdec-recording-long"]["rules"]}
    assert "namespace_pod_model_name:vllm_specdec_draft_tokens:rate5m" in long
    for rule in fast:
        if f"_{rules.LONG_GROUP_RATE}:rate" in rule["expr"]:
            assert "alert" in rule and rule["labels"]["severity"] != "critical", rule.get("record") or rule["alert"]
    ratios = [(r, m) for r in long for m in LONG_GROUP_RATIOS if r.split(":")[1] == f"vllm_specdec_{m}"]
    assert len(ratios) >= 2 * 2 * 3, ratios  # two ratios, namespace and model, three windows
    for record, metric in ratios:
        level, _, op = record.split(":")
        w = op.removeprefix("ratio_rate")
        read = set(re.findall(r"[a-z_]+:vllm_specdec_[a-z0-9_]+:rate[0-9a-z]+", long[record]))
        assert f"{level}:vllm_specdec_{LONG_GROUP_RATIOS[metric]}:rate{w}" in read, record
        assert read <= set(long), (record, read - set(long))  # every side recorded in this group
    # The accepted tokens read with them: the raw counter per server, summed above; a longer window the
    # mean of those; each recorded before what divides it.
    order = list(long)
    accepted = f"namespace_pod_model_name:vllm_specdec_{rules.LONG_GROUP_ACCEPTED}:rate5m"
    assert f"rate({src.accepted}" in long[accepted], long[accepted]
    for level in ("namespace_model_name", "model_name"):
        mine = f"{level}:vllm_specdec_{rules.LONG_GROUP_ACCEPTED}:rate"
        assert long[mine + "5m"].startswith("sum by (") and f"_{rules.LONG_GROUP_ACCEPTED}:rate5m)" in long[mine + "5m"]
        assert long[mine + "1h"].startswith(f"avg_over_time({mine}5m[")
        assert order.index(mine + "5m") < order.index(f"{level}:vllm_specdec_acceptance_ratio:ratio_rate5m")
