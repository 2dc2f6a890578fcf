"""The generators obey their own options (issue 22 item 1; generators/rules/options.py, references.py):
every window suffix and every fleet label of the rules and dashboards comes from the options, and
generation fails, naming the reader and the series, when an alert, a rule or a dashboard reads a
recorded series that no recording rule defines."""

from __future__ import annotations

import json
import re
import subprocess

import pytest
import yaml
from prom_harness import tool
from vllm_specdec_exporter import config
from vllm_specdec_exporter.generators import boards, rules

CUSTOM_WINDOWS = ("5m", "1h")


def all_rules(o: rules.Options) -> dict[str, list[dict]]:
    return {v: [r for g in rules.rule_file(v, o)["groups"] for r in g["rules"]] for v in rules.VARIANTS}


def assert_no_dangling(o: rules.Options) -> None:
    for variant, rs in all_rules(o).items():
        defined = rules.recorded(rs)
        for r in rs:
            assert rules.references(r["expr"]) <= defined, (variant, r.get("alert") or r["record"])


# --- windows ---

def test_custom_windows_with_the_alert_windows_among_them_leave_nothing_dangling(tmp_path):
    o = rules.default_options(windows=CUSTOM_WINDOWS, trend_window="1h")
    assert_no_dangling(o)
    for variant, rs in all_rules(o).items():
        suffixes = {r["record"].rsplit(":", 1)[1] for r in rs if "record" in r}
        # Only the recorded windows, the day's best hours, k as a label, the max and AcceptanceShifted's
        # own window (config.ALERT_SHIFT_WINDOW, a mean of the 5m rates, its drafts too): nothing of the
        # defaults' 30m.
        assert suffixes == {"rate5m", "rate1h", "ratio_rate5m", "ratio_rate1h", "max", "max_over_time1d", "count_values",
                            f"ratio_rate{config.ALERT_SHIFT_WINDOW}", f"rate{config.ALERT_SHIFT_WINDOW}"}, variant
        text = yaml.safe_dump(rules.rule_file(variant, o))
        # (TargetDown's "unreachable for 30m" is config.TARGET_UNREACHABLE_AFTER, not a window.)
        assert not re.findall(r"rate30m|\[30m\]|offset 30m|over (?:the last )?30m", text), variant
        (tmp_path / f"{variant}.yaml").write_text(rules.dump(rules.rule_file(variant, o), ""))
    proc = subprocess.run([tool("promtool"), "check", "rules", *(str(p) for p in sorted(tmp_path.glob("*.yaml")))],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    # The trend alert reads the 1h series and says so.
    alerts = {r["alert"]: r for r in all_rules(o)["sidecar"] if "alert" in r}
    assert "acceptance_ratio:ratio_rate1h" in alerts["VLLMSpecDecodeAcceptanceSuspiciouslyHigh"]["expr"]
    assert "over 1h" in alerts["VLLMSpecDecodeAcceptanceSuspiciouslyHigh"]["annotations"]["description"]


def test_dashboards_follow_the_windows_and_read_only_recorded_series():
    o = rules.default_options(windows=CUSTOM_WINDOWS, trend_window="1h")
    files = boards.render(o)
    overview = json.loads(files["vllm-specdec-overview.json"])
    (window,) = [v for v in overview["templating"]["list"] if v["name"] == "window"]
    assert window["query"] == "5m,1h"
    used = set()
    for reader in boards.readers(overview).values():
        used |= rules.references(reader, CUSTOM_WINDOWS)
    assert used and not any("30m" in n for n in used)


@pytest.mark.parametrize("change, reader, series", [
    # The shipped alert windows with 30m no longer recorded: the trend alert reads 30m series.
    ({"windows": CUSTOM_WINDOWS}, "VLLMSpecDecodeAcceptanceSuspiciouslyHigh",
     "namespace_pod_model_name:vllm_specdec_acceptance_ratio:ratio_rate30m"),
    ({"windows": CUSTOM_WINDOWS, "detection_window": "1m"}, "VLLMSpecDecodeAcceptanceCollapsed",
     "namespace_pod_model_name:vllm_specdec_mean_acceptance_length:ratio_rate1m"),
    # The day's best hours are the hourly ones': no 1h recorded, no day.
    ({"windows": ("5m", "30m")},
     "recording rule namespace_model_name_num_speculative_tokens:vllm_specdec_mean_acceptance_length:ratio_rate1h",
     "namespace_pod_model_name:vllm_specdec_accepted_tokens:rate1h"),
])
@pytest.mark.parametrize("variant", rules.VARIANTS)
def test_a_rule_reading_an_unrecorded_series_fails_generation(change, reader, series, variant):
    with pytest.raises(rules.DanglingReference) as e:
        rules.rule_file(variant, rules.default_options(**change))
    assert reader in str(e.value) and series in str(e.value) and variant in str(e.value)


def test_rule_windows_set_in_config_reach_the_rules_and_a_dangling_alert_stops_make_generate(monkeypatch, tmp_path,
                                                                                              capsys):
    monkeypatch.setattr(config, "RULE_WINDOWS", CUSTOM_WINDOWS)
    assert rules.default_options().windows == CUSTOM_WINDOWS
    assert rules.main([str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "VLLMSpecDecodeAcceptanceSuspiciouslyHigh reads" in err and "ratio_rate30m" in err
    assert not list(tmp_path.iterdir())  # nothing half-written
    monkeypatch.setattr(config, "ALERT_TREND_WINDOW", "1h")
    o = rules.default_options(trend_window=config.ALERT_TREND_WINDOW)
    assert_no_dangling(o)


def test_a_dashboard_reading_an_unrecorded_series_fails_generation():
    o = rules.default_options()
    board = {"title": "Board", "panels": [{"title": "Ghost", "targets": [
        {"refId": "A", "expr": 'sum(namespace_model_name:vllm_specdec_ghost:ratio_rate$window{namespace=~"$namespace"})'}]}]}
    with pytest.raises(rules.DanglingReference) as e:
        boards.check_dashboard(board, o)
    msg = str(e.value)
    assert "dashboard 'Board'" in msg and "panel 'Ghost'" in msg
    assert "namespace_model_name:vllm_specdec_ghost:ratio_rate5m" in msg
    # A recorded window missing from the options: the overview's $window reads it.
    board["panels"][0]["targets"][0]["expr"] = "namespace_model_name:vllm_specdec_drafts:rate$window"
    boards.check_dashboard(board, o)
    with pytest.raises(rules.DanglingReference, match="rate2h"):
        rules.check_references("dashboard 'Board'", rules.recorded(all_rules(o)["sidecar"]),
                               boards.readers(board), o, (*o.windows, "2h"))


def test_the_reference_parser_finds_our_recorded_names_only():
    expr = ('1 + namespace_pod_model_name:vllm_specdec_accepted_tokens:rate5m{a="b"} / '
            '(model_name:vllm_specdec_drafts:rate$window > 0) + other:metric:rate5m + vllm_specdec_up'
            ' + rate(vllm:spec_decode_num_drafts_total[5m])')
    assert rules.references(expr, ("5m", "1h")) == {
        "namespace_pod_model_name:vllm_specdec_accepted_tokens:rate5m", "model_name:vllm_specdec_drafts:rate5m",
        "model_name:vllm_specdec_drafts:rate1h"}


# --- labels ---

LABELS = {"namespace_label": "k8s_ns", "pod_label": "k8s_pod", "cluster_label": "region"}
DEFAULT_NAMES = re.compile(r"\b(namespace|pod|cluster)\b")


def stray_labels(text: str) -> list[str]:
    """Default fleet label names left in a text once the recorded names (fixed by convention) are out."""
    text = rules.RECORDED_NAME.sub("REC", text)
    return [text[max(0, m.start() - 30):m.end() + 10] for m in DEFAULT_NAMES.finditer(text)]


@pytest.mark.parametrize("variant", rules.VARIANTS)
def test_custom_labels_reach_every_expression_by_clause_and_annotation(variant):
    o = rules.default_options(**LABELS)
    rs = all_rules(o)[variant]
    for r in rs:
        texts = [r["expr"], *r.get("annotations", {}).values()]
        assert [s for t in texts for s in stray_labels(t)] == [], r.get("alert") or r["record"]
    alerts = {r["alert"]: r for r in rs if "alert" in r}
    collapsed = alerts["VLLMSpecDecodeAcceptanceCollapsed"]
    assert "{{ $labels.k8s_ns }}/{{ end }}{{ $labels.k8s_pod }}" in collapsed["annotations"]["description"]
    assert "{{ if $labels.k8s_pod }}" in collapsed["annotations"]["description"]
    assert "on(region, k8s_ns, k8s_pod" in collapsed["expr"]
    # Every alert that names a server (or a model in a namespace: AcceptanceShifted) names it with the
    # configured labels: 14 in either file (the sidecar file has NoBaseline, the vLLM-direct one its
    # invariant alert).
    named = [a for a, r in alerts.items() if "$labels.k8s_ns" in r["annotations"]["description"]]
    assert len(named) == 14, named
    assert_no_dangling(o)


def test_custom_labels_reach_the_dashboards():
    o = rules.default_options(**LABELS)
    for filename, text in boards.render(o).items():
        board = json.loads(text)
        exprs = list(boards.readers(board).values())
        legends = [t.get("legendFormat", "") for p in board["panels"] for t in p.get("targets", [])]
        legends += [a.get("textFormat", "") for a in board.get("annotations", {}).get("list", [])]
        assert [s for t in exprs + legends for s in stray_labels(t)] == [], filename
        names = [v["name"] for v in board["templating"]["list"]]
        assert "k8s_ns" in names and "region" in names and "namespace" not in names, filename


def test_no_cluster_label_means_no_cluster_anywhere():
    o = rules.default_options(cluster_label="")
    for rs in all_rules(o).values():
        assert not any(re.search(r"\bcluster\b", r["expr"]) for r in rs)
    for text in boards.render(o).values():
        assert '"cluster"' not in text and "$cluster" not in text
