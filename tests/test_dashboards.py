"""Dashboards: drift, Grafana's JSON schema, quality rules, and every panel's
queries answered by a real Prometheus that scraped the exporter and the simulator."""

from __future__ import annotations

import json
import re
import time

import jsonschema
import pytest
import render_preview
from conftest import REPO
from prom_harness import COLLAPSE_AT, COLLAPSE_MODEL, HEALTHY_AL, wait_for
from vllm_specdec_exporter.generators import boards

DASHBOARDS = {"vllm-specdec-overview": "Speculative decoding / Overview",
              "vllm-specdec-exporter": "Speculative decoding / Exporter"}
SCHEMA = json.loads((REPO / "dashboards" / "schema" / "dashboard.schema.json").read_text())


def load(uid: str) -> dict:
    return json.loads((REPO / "dashboards" / f"{uid}.json").read_text())


def all_panels(d: dict) -> list[dict]:
    return [p for p in d["panels"] if p["type"] != "row"]


def test_committed_json_is_generated_from_the_sources():
    chart = REPO / "helm" / "vllm-specdec-exporter" / "files" / "dashboards"
    assert boards.main(["--check", str(REPO / "dashboards"), "--chart-files", str(chart)]) == 0, \
        "dashboards/*.json are stale: run make generate"


@pytest.mark.parametrize("uid", DASHBOARDS)
def test_valid_against_grafanas_schema(uid):
    errors = list(jsonschema.Draft7Validator(SCHEMA).iter_errors(load(uid)))
    assert errors == [], [(list(e.path), e.message[:120]) for e in errors[:5]]


def test_the_schema_check_can_fail():
    d = load("vllm-specdec-overview")
    d["panels"][1]["gridPos"] = {"h": "tall"}
    assert list(jsonschema.Draft7Validator(SCHEMA).iter_errors(d))


def nulls(value, path="") -> list[str]:
    if value is None:
        return [path]
    if isinstance(value, dict):
        if set(value) == {"color", "value"}:  # the base threshold step: null is Grafana's -Infinity
            return []
        return [p for k, v in value.items() for p in nulls(v, f"{path}.{k}")]
    if isinstance(value, list):
        return [p for i, v in enumerate(value) for p in nulls(v, f"{path}[{i}]")]
    return []


def overlaps(panels: list[dict]) -> list[tuple]:
    cells = {}
    out = []
    for p in panels:
        g = p["gridPos"]
        assert g["x"] + g["w"] <= 24, p["title"]
        for x in range(g["x"], g["x"] + g["w"]):
            for y in range(g["y"], g["y"] + g["h"]):
                if (x, y) in cells:
                    out.append((cells[(x, y)], p["title"]))
                cells[(x, y)] = p["title"]
    return out


@pytest.mark.parametrize("uid", DASHBOARDS)
def test_quality(uid):
    d = load(uid)
    assert d["uid"] == uid and d["title"] == DASHBOARDS[uid]
    assert d["schemaVersion"] >= 39
    assert nulls(d) == []
    ids = [p["id"] for p in d["panels"]]
    assert len(ids) == len(set(ids))
    assert overlaps(d["panels"]) == []
    for p in all_panels(d):
        assert "maxDataPoints" not in p, p["title"]
        assert p["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
        assert len(p["description"]) > 40 and "Bad" in p["description"], p["title"]
        assert p["fieldConfig"]["defaults"].get("unit"), p["title"]
        assert p["fieldConfig"]["defaults"]["thresholds"]["steps"] or p["type"] == "timeseries", p["title"]
        for t in p["targets"]:
            assert t["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
            assert t["expr"] and t["legendFormat"], p["title"]
    names = [v["name"] for v in d["templating"]["list"]]
    assert names[0] == "datasource"
    if uid == "vllm-specdec-overview":
        assert names == ["datasource", "cluster", "namespace", "model_name", "engine", "window"]
        assert d["annotations"]["list"][0]["expr"].startswith("ALERTS{")


def test_overview_reads_the_recording_rules_where_they_exist():
    """Both rule variants record these names, so the same dashboard works with either."""
    recorded = [set(re.findall(r"record: (\S+)", (REPO / "alerts" / f).read_text()))
                for f in ("rules.yaml", "rules-vllm-direct.yaml")]
    exprs = " ".join(t["expr"] for p in all_panels(load("vllm-specdec-overview")) for t in p["targets"])
    used = set(re.findall(r"\b[a-z_]+:vllm_specdec_[a-z_]+:[a-z_0-9$]+", exprs))
    assert len(used) >= 10, used
    for metric in used:
        for window in ("5m", "30m", "1h"):
            concrete = metric.replace("$window", window)
            assert all(concrete in r for r in recorded), concrete
    # vLLM's own series only where no rule can stand in: its latency histogram, and the
    # per-request acceptance histogram of vLLM PR #44487 (read at fixed bucket edges).
    assert set(re.findall(r"vllm:[a-z_]+", exprs)) == {
        "vllm:inter_token_latency_seconds_sum", "vllm:inter_token_latency_seconds_count",
        "vllm:inter_token_latency_seconds_bucket", "vllm:request_spec_decode_acceptance_rate_bucket",
        "vllm:request_spec_decode_acceptance_rate_count"}


# The collapsing model only: the server beside it has a dead rank from DEAD_RANK_AT s, and with
# $model_name=.* its series would answer every panel (its "Likely cause" even while this one is healthy).
ONE_MODEL = {**render_preview.SUBSTITUTE, "$model_name": COLLAPSE_MODEL}


def panel_queries(uid: str) -> list[tuple[str, str]]:
    return [(p["title"], render_preview.substitute(t["expr"], ONE_MODEL)) for p in all_panels(load(uid))
            for t in p["targets"]]


# Panels of optional families the simulated vLLM does not have (vLLM PR #44487's histogram):
# empty here by design, as on any vLLM without it.
OPTIONAL = {"Requests at the acceptance extremes"}
# Panels empty while nothing is wrong, by design: they must answer once acceptance fell.
EMPTY_WHEN_HEALTHY = {"Likely cause"}


def empty_panels(prom, uid: str, at: float | None = None, allowed: set[str] = OPTIONAL) -> list[str]:
    return [f"{title}: {expr}" for title, expr in panel_queries(uid) if title not in allowed and not prom.query(expr, at)]


def test_every_panel_query_answers_from_a_real_prometheus(collapse_stack, tmp_path):
    st = collapse_stack
    prom = st.prom
    model = f'model_name="{COLLAPSE_MODEL}"'  # a second server, with one dead rank, runs beside it
    al_rule = f"namespace_model_name:vllm_specdec_mean_acceptance_length:ratio_rate5m{{{model}}}"
    # The collapsed scenario (waited for first; the healthy phase is read back from history).
    deadline = st.started + COLLAPSE_AT + 60
    wait_for(lambda: (prom.value(f'vllm_specdec_health{{vllm_specdec_health="collapsed",{model}}}') or 0) == 1, deadline - time.time(),
             "the exporter's health to read collapsed")
    wait_for(lambda: (prom.value(al_rule) or 9) < 1.9, deadline - time.time(), "the 5m recording rule to fall")
    # Healthy (2 s before the collapse): every panel answers, with the healthy figures.
    healthy_at = st.started + COLLAPSE_AT - 2
    assert empty_panels(prom, "vllm-specdec-overview", healthy_at, OPTIONAL | EMPTY_WHEN_HEALTHY) == []
    assert not [t for t, expr in panel_queries("vllm-specdec-overview") if t in EMPTY_WHEN_HEALTHY and prom.query(expr, healthy_at)]
    assert empty_panels(prom, "vllm-specdec-exporter", healthy_at) == []
    assert prom.value(al_rule, healthy_at) == pytest.approx(HEALTHY_AL, rel=0.02)
    for var, label, match in (("model_name", "model_name", "namespace_model_name:vllm_specdec_drafts:rate5m"),
                              ("engine", "engine", "namespace_pod_model_name_engine:vllm_specdec_drafts:rate5m"),
                              ("target", "target", "vllm_specdec_up")):
        assert prom.label_values(label, match), var
    # Collapsed: the same panels still answer, and show the collapse.
    assert empty_panels(prom, "vllm-specdec-overview") == []
    # What it costs (issue 34), worked by hand against the V4-Pro k=2 profile (AL 2.27): healthy
    # (AL 2.611, above it) nothing wasted or forgone; broken (AL 1 + 0.0357 + 0.0008) the same
    # output takes 2.27 / 1.0365 = 2.19x the decode steps, 54.3 % of them wasted, and 100 drafts/s
    # x (2.27 - 1.0365) = 123.4 tokens/s forgone (at 100 drafts/s).
    cost = {t: expr for t, expr in panel_queries("vllm-specdec-overview")
            if t in ("Decode steps wasted", "Decode-step factor per server", "Output tokens/s forgone")}
    assert len(cost) == 3
    broken_al = 1 + 0.0357 + 0.0008
    wait_for(lambda: (prom.value(cost["Decode-step factor per server"]) or 0) > 0.99 * 2.27 / broken_al,
             deadline - time.time(), "the decode-step factor to reach the broken head's")
    assert prom.value(cost["Decode steps wasted"]) == pytest.approx(1 - broken_al / 2.27, rel=0.02)
    assert prom.value(cost["Decode-step factor per server"]) == pytest.approx(2.27 / broken_al, rel=0.02)
    # 100 drafts/s simulated; Prometheus's rate over the 8 s range reads a little less: its own figure.
    # Both read at one finished evaluation of their group, just before the latest: a query at "now"
    # can land while the group is being evaluated, and read this rule's new figure beside the
    # panel's rules' previous one (seen under a busy machine, where the simulated rate jitters:
    # 115.3 against 134.4).
    # That evaluation must itself be past the collapse: the wait above saw the latest one broken,
    # and the one before it can still hold a moment of the healthy head in its range (stop 66: AL
    # 1.094 there, forgone 117.9 against 123.7 expected).
    drafts_rule = f"namespace_model_name:vllm_specdec_drafts:rate5m{{{model}}}"

    def broken_evaluation() -> float | None:
        at = prom.value(f"timestamp({drafts_rule})") - 0.5
        return at if (prom.value(cost["Decode-step factor per server"], at) or 0) > 0.99 * 2.27 / broken_al else None

    at = wait_for(broken_evaluation, deadline - time.time(), "an evaluation before the latest to read the broken head")
    drafts = prom.value(drafts_rule, at)
    # rate() extrapolates 7 scrape intervals to the 8 s range (101.14 was read), and the simulator
    # counts on its own clock between two fetches that Prometheus stamps at their scrape's start: a
    # fetch served late lengthens the span counted by what the stamps do not show (114.86, 0.5 % over
    # 8/7, in a fresh-clone run at stop 66). 5 % of room for that, far from a doubled or halved rate.
    assert 70 < drafts <= 100 * 8 / 7 * 1.05
    assert prom.value(cost["Output tokens/s forgone"], at) == pytest.approx(drafts * (2.27 - broken_al), rel=0.02)
    assert prom.value(cost["Decode steps wasted"], healthy_at) == 0
    assert prom.value(cost["Output tokens/s forgone"], healthy_at) == 0
    assert prom.value(cost["Decode-step factor per server"], healthy_at) == pytest.approx(2.27 / HEALTHY_AL, rel=0.02)
    assert empty_panels(prom, "vllm-specdec-exporter") == []
    # The README's preview is made by this script from the same kind of data.
    out = tmp_path / "preview.png"
    render_preview.render(prom.base, st.started, time.time(), out, step=2)
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and out.stat().st_size > 20_000
