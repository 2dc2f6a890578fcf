"""Parser, adapter and `report` against the real vLLM payloads, checked against
prometheus_client's own parser as an independent reference."""

from __future__ import annotations

import json
from collections import defaultdict
from dataclasses import replace

import pytest
from conftest import PAYLOADS, run_cli
from prometheus_client.parser import text_string_to_metric_families
from vllm_specdec_exporter import config
from vllm_specdec_exporter.adapters import extract

NAMES = {
    config.VLLM_V1_DRAFTS: "num_drafts",
    config.VLLM_V1_DRAFT_TOKENS: "num_draft_tokens",
    config.VLLM_V1_ACCEPTED: "num_accepted_tokens",
}


def reference_totals(data: bytes) -> dict:
    """Per model: sums over engines of the _total samples, by prometheus_client."""
    out: dict = defaultdict(lambda: defaultdict(float))
    for family in text_string_to_metric_families(data.decode()):
        for s in family.samples:
            model = s.labels.get("model_name")
            if s.name in NAMES:
                out[model][NAMES[s.name]] += s.value
            elif s.name == config.VLLM_V1_ACCEPTED_PER_POS:
                out[model][f"pos{s.labels['position']}"] += s.value
            elif s.name == config.VLLM_V1_GENERATION_TOKENS:
                out[model]["gen"] += s.value
            elif s.name.endswith("_created") and "spec_decode" in s.name:
                out[model]["created_seen"] += 1
    return out


@pytest.mark.parametrize("name", ["vllm-v1-dp1-k2-single-process.prom", "vllm-v1-dp8-k2-single-process.prom",
                                  "vllm-v1-dp8-k2-multiprocess.prom"])
def test_report_json_matches_prometheus_client(payloads, name):
    data = payloads[name]
    ref = reference_totals(data)
    proc = run_cli("report", str(PAYLOADS / name), "--format", "json")
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert set(out) == {"models", "interval_seconds", "warnings", "producer", "approximate", "request_acceptance_family"}
    assert out["interval_seconds"] is None and out["warnings"] == []
    assert out["producer"] == "vllm-v1" and out["approximate"] == [] and out["request_acceptance_family"] is None
    engines = 1 if "dp1" in name else 8
    for model, expect in ref.items():
        entry = out["models"][model]
        assert len(entry["engines"]) == engines
        s = entry["all"]
        for key in NAMES.values():
            assert s[key] == expect[key]
        assert s["accepted_per_position"] == [expect["pos0"], expect["pos1"]]
        assert s["num_generation_tokens"] == expect["gen"]
        assert s["k"] == 2
        assert s["mean_acceptance_length"] == pytest.approx(1 + expect["num_accepted_tokens"] / expect["num_drafts"])
        assert s["acceptance_rate"] == pytest.approx(expect["num_accepted_tokens"] / expect["num_draft_tokens"])
        assert s["warnings"] == []
        # The _created trap: the single-process form has them; none leaked into the sums.
        if "single-process" in name:
            assert expect["created_seen"] > 0
        assert s["num_drafts"] < 1e9


def test_multiprocess_and_single_process_forms_agree(payloads):
    a = extract(payloads["vllm-v1-dp8-k2-single-process.prom"])
    b = extract(payloads["vllm-v1-dp8-k2-multiprocess.prom"])
    # The same counters; only the single API server says when each engine's started (_created).
    assert {k: replace(c, started=None) for k, c in a.engines.items()} == b.engines
    assert all(1.7e9 < c.started < 1.9e9 for c in a.engines.values())
    assert all(c.started is None for c in b.engines.values())


def test_report_text_has_table_bars_and_engines():
    proc = run_cli("report", str(PAYLOADS / "vllm-v1-dp8-k2-single-process.prom"))
    assert proc.returncode == 0, proc.stderr
    text = proc.stdout.decode()
    assert "model deepseek-ai/DeepSeek-V4-Pro  (8 engines, k=2)" in text
    assert "mean acceptance length  2.572" in text
    assert "█" in text
    for engine in range(8):
        assert f"\n  {engine:>8}  " in text
