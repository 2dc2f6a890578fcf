"""Issue 15: the acceptance-count distribution, the fingerprints of causes, per-request
acceptance. Expected figures are worked by hand from the real dumps in tests/fixtures and
the figures of baselines.md (copied into the cases below)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from conftest import REPO
from sidecar_harness import harness, one, run

P = "vllm_specdec"
DP1 = REPO / "tests" / "fixtures" / "payloads" / "vllm-v1-dp1-k2-single-process.prom"
DP8 = REPO / "tests" / "fixtures" / "payloads" / "vllm-v1-dp8-k2-single-process.prom"


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "vllm_specdec_exporter", *args], capture_output=True, text=True,
                          timeout=60, cwd=REPO)


# --- 2. The acceptance-count distribution ---
# The real 1-engine dump: drafts 1,561,637; position 0 1,327,391; position 1 1,128,282 (k=2).
# Exactly 0 accepted: 1,561,637 - 1,327,391 = 234,246; exactly 1: 1,327,391 - 1,128,282 =
# 199,109; exactly 2 (all of k): 1,128,282. Shares: 234,246 / 1,561,637 = 0.1500003,
# 199,109 / 1,561,637 = 0.1275002, 1,128,282 / 1,561,637 = 0.7224995.
DP1_COUNTS = [234246, 199109, 1128282]
DP1_SHARES = [0.1500003, 0.1275002, 0.7224995]


def test_distribution_in_report_json_is_exact_on_a_real_dump():
    proc = cli("report", "--format", "json", str(DP1))
    assert proc.returncode == 0, proc.stderr
    s = json.loads(proc.stdout)["models"]["deepseek-ai/DeepSeek-V4-Pro"]["all"]
    assert s["accepted_count_drafts"] == DP1_COUNTS
    assert s["accepted_count_ratio"] == pytest.approx(DP1_SHARES, abs=1e-7)


def test_distribution_of_eight_engines_sums_counters_first():
    # Engine 0 of the 8-engine dump: drafts 1,561,637, positions 1,327,391 / 1,128,282 (as
    # above); the model's line sums the 8 engines' counters before dividing.
    proc = cli("report", "--format", "json", str(DP8))
    assert proc.returncode == 0, proc.stderr
    model = json.loads(proc.stdout)["models"]["deepseek-ai/DeepSeek-V4-Pro"]
    assert model["engines"]["0"]["accepted_count_drafts"] == DP1_COUNTS
    total = model["all"]
    drafts = total["num_drafts"]
    pos = total["accepted_per_position"]
    assert total["accepted_count_drafts"] == [drafts - pos[0], pos[0] - pos[1], pos[1]]
    assert sum(total["accepted_count_drafts"]) == drafts


def test_distribution_in_the_text_report():
    proc = cli("report", str(DP1))
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    head = lines.index("  accepted exactly      drafts       share")
    assert [line.split()[:4] for line in lines[head + 1:head + 4]] == [
        ["0", "234,246", "15.0", "%"], ["1", "199,109", "12.8", "%"], ["2", "1,128,282", "72.2", "%"]]


def test_distribution_is_none_without_drafts_and_empty_without_positions():
    from vllm_specdec_exporter.derive import derive
    from vllm_specdec_exporter.model import Counters

    assert derive(Counters(0, 0, 0, (0, 0))).accepted_count_ratio == [None, None, None]
    assert derive(Counters(500, 0, 0, ())).accepted_count_ratio == []  # k=0 (SGLang): never "all at 0"


def test_distribution_exported_per_window_and_in_the_summary_api():
    """The simulator's healthy V4-Pro (survival 0.924 / 0.687): exactly 0 = 1 - 0.924 =
    0.076, exactly 1 = 0.924 - 0.687 = 0.237, exactly 2 = 0.687."""
    async def go():
        async with harness("healthy") as h:
            await h.run_for(120)
            m = await h.metrics()
            for j, share in enumerate((0.076, 0.237, 0.687)):
                got = one(m, f"{P}_acceptance_count_ratio", window="1m", accepted=str(j))
                assert got == pytest.approx(share, abs=0.005), (j, got)
            status, body = await h.get("/api/v1/summary?window=1m")
            assert status == 200
            s = json.loads(body)["models"]["deepseek-ai/DeepSeek-V4-Pro"]["all"]
            assert s["accepted_count_ratio"] == pytest.approx([0.076, 0.237, 0.687], abs=0.005)
    run(go())


