"""Issue 15: the acceptance-count distribution, the fingerprints of causes, per-request
acceptance. Expected figures are worked by hand from the real dumps in tests/fixtures and
the figures of baselines.md (copied into the cases below)."""

from __future__ import annotations

import asyncio
import html
import json
import subprocess
import sys

import aiohttp
import pytest
from aiohttp import web
from conftest import REPO
from sidecar_harness import FakeClock, harness, one, run, start
from vllm_specdec_exporter.parser import parse
from vllm_specdec_exporter.settings import build_settings
from vllm_specdec_exporter.web import POLLERS, create_app

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




# --- 1. Fingerprints of causes, on real dumps and the figures of baselines.md ---
NAMES = {"drafts": "vllm:spec_decode_num_drafts_total", "tokens": "vllm:spec_decode_num_draft_tokens_total",
         "accepted": "vllm:spec_decode_num_accepted_tokens_total"}
POS = "vllm:spec_decode_num_accepted_tokens_per_pos_total"
# Per-engine increments (drafts, draft tokens, accepted, per position) between two scrapes.
BROKEN_HEAD = (6590, 13180, 240, (235, 5))  # vllm-metrics.md: the broken V4-Pro conversion, AL 1.036
HEALTHY_PRO = (6590, 13180, 6089 + 4527, (6089, 4527))  # native V4-Pro k=2: 0.924 / 0.687, AL 2.611


def after(text: str, deltas: dict[str, tuple]) -> str:
    """The same real dump, each engine's four spec-decode counters grown by its increments."""
    out = []
    for line in text.splitlines():
        for engine, (drafts, tokens, accepted, pos) in deltas.items():
            if f'engine="{engine}"' not in line or line.startswith("#"):
                continue
            name, value = line.rsplit(" ", 1)
            add = {NAMES["drafts"]: drafts, NAMES["tokens"]: tokens, NAMES["accepted"]: accepted}.get(
                name.split("{")[0])
            if name.startswith(POS + "{"):
                add = pos[int(name.split('position="')[1].split('"')[0])]
            if add is not None:
                line = f"{name} {float(value) + add!r}"
        out.append(line)
    return "\n".join(out) + "\n"


def diff_json(tmp_path, before: str, after_text: str) -> dict:
    (tmp_path / "a.prom").write_text(before)
    (tmp_path / "b.prom").write_text(after_text)
    proc = cli("diff", "--format", "json", str(tmp_path / "a.prom"), str(tmp_path / "b.prom"))
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)["models"]["deepseek-ai/DeepSeek-V4-Pro"]


def test_draft_head_garbage_on_the_real_broken_head(tmp_path):
    text = DP1.read_text()
    model = diff_json(tmp_path, text, after(text, {"0": BROKEN_HEAD}))
    # 235 / 6590 = 3.57 % of drafts accepted position 0
    assert model["diagnosis"] == [{"cause": "draft_head_garbage",
                                   "evidence": "position 0 accepted in 3.6 % of drafts, on its only engine"}]
    (tmp_path / "b.prom").write_text(after(text, {"0": BROKEN_HEAD}))
    out = cli("diff", str(tmp_path / "a.prom"), str(tmp_path / "b.prom")).stdout
    assert "likely cause (a hint, not a certainty):" in out
    assert "the draft head produces garbage (a broken quantised conversion or loader)" in out


def test_one_rank_on_the_real_eight_engine_dump(tmp_path):
    text = DP8.read_text()
    deltas = {str(e): BROKEN_HEAD if e == 3 else HEALTHY_PRO for e in range(8)}
    model = diff_json(tmp_path, text, after(text, deltas))
    # the other seven: 1 + 7 x 10,616 / (7 x 6,590) = 2.611
    assert model["diagnosis"] == [{"cause": "one_rank",
                                   "evidence": "engine 3 at AL 1.036 while the other 7 are at AL 2.611"}]
    assert model["all"]["mean_acceptance_length"] == pytest.approx(1 + (7 * 10616 + 240) / (8 * 6590))


def test_garbage_on_every_engine_is_not_one_rank(tmp_path):
    text = DP8.read_text()
    model = diff_json(tmp_path, text, after(text, {str(e): BROKEN_HEAD for e in range(8)}))
    assert [h["cause"] for h in model["diagnosis"]] == ["draft_head_garbage"]
    assert model["diagnosis"][0]["evidence"] == "position 0 accepted in 3.6 % of drafts, on every engine"


def test_healthy_real_figures_get_no_hint(tmp_path):
    text = DP8.read_text()
    assert diff_json(tmp_path, text, after(text, {str(e): HEALTHY_PRO for e in range(8)}))["diagnosis"] == []
    proc = cli("report", "--format", "json", str(DP8))  # the real dump's totals: AL 2.572
    assert json.loads(proc.stdout)["models"]["deepseek-ai/DeepSeek-V4-Pro"]["diagnosis"] == []


def judge_one(counters, changes=(), profile=None):
    from vllm_specdec_exporter import config
    from vllm_specdec_exporter.health import judge
    from vllm_specdec_exporter.model import Counters

    engines = {str(e): Counters(d, t, a, p) for e, (d, t, a, p) in enumerate(counters)}
    return judge(engines, 300.0, profile, config.DETECTION, config.DEFAULT_MIN_DRAFTS, changes)


def profile(model: str, k: int):
    from vllm_specdec_exporter.baselines import match_profile
    from vllm_specdec_exporter.settings import default_profiles

    return match_profile(default_profiles(), model, k, None)


def test_chain_break_after_position_0():
    # V4-Pro k=3: position 0 at the native 92.4 %, positions 1 and 2 nearly never (a layer
    # beyond the first mis-wired): AL 1.95, below the k=3 profile's 1 + 0.75 x 1.49 = 2.12.
    v = judge_one([(1000, 3000, 924 + 20 + 6, (924, 20, 6))], profile=profile("deepseek-ai/DeepSeek-V4-Pro", 3))
    assert v.state == "degraded"
    assert [(h.cause, h.evidence) for h in v.causes] == [
        ("chain_break", "position 0 accepted in 92.4 % of drafts, position 1 in 2.2 % of those that reached it")]


def test_workload_shift_only_after_a_fall_was_seen():
    """Issue 21: V4-Flash k=2 at 0.149 / 0.057 per position (the draft-sampling bug, and also
    random-token load on a healthy V4-Flash: the same counters). From one interval with
    nothing earlier, the head is named first and no history is claimed; after a fall seen
    over the longest window (AL 1.99 there, no restart or k change) it is a workload shift."""
    from vllm_specdec_exporter import config
    from vllm_specdec_exporter.diagnosis import Earlier
    from vllm_specdec_exporter.health import judge
    from vllm_specdec_exporter.model import Counters

    flash = profile("deepseek-ai/DeepSeek-V4-Flash", 2)
    v = judge_one([(1000, 2000, 206, (149, 57))], profile=flash)
    assert v.state == "degraded" and [h.cause for h in v.causes] == ["draft_head_partial"]
    assert v.causes[0].evidence == ("every engine (1) and every position low: position 0 at 14.9 %, then 38.3 % "
                                    "conditional, with no fall seen (nothing earlier to compare with); synthetic "
                                    "random-token load gives the same counters")  # 57 / 149
    assert "hours" not in v.hint
    after_fall = judge({"0": Counters(1000, 2000, 206, (149, 57))}, 300.0, flash, config.DETECTION,
                       config.DEFAULT_MIN_DRAFTS, (), Earlier("1h", Counters(1000, 2000, 990, (700, 290))))
    assert [(h.cause, h.evidence) for h in after_fall.causes] == [
        ("workload_shift", "every engine (1) and every position lower together: position 0 at 14.9 %, then 38.3 % "
                           "conditional; AL 1.206 against 1.990 over 1h, with no restart or k change")]
    assert "synthetic random-token load" in after_fall.hint


def test_configuration_change_and_garbage_both_named():
    v = judge_one([BROKEN_HEAD], changes=["a restart of engine 0", "k 3 -> 2"])
    assert v.state == "collapsed"
    assert [(h.cause, h.evidence) for h in v.causes] == [
        ("configuration_change", "the fall coincides with a restart of engine 0, k 3 -> 2"),
        ("draft_head_garbage", "position 0 accepted in 3.6 % of drafts, on its only engine")]
    assert v.hint.startswith("likely cause (a hint): a configuration change") and "; or the draft head" in v.hint


def test_too_good_to_be_true():
    v = judge_one([(1000, 2000, 1980, (995, 985))])  # 99.0 % acceptance: repetition loops
    assert [(h.cause, h.evidence) for h in v.causes] == [
        ("too_good", "acceptance 99.0 % of 2,000 draft tokens (healthy model-drafted traffic: at most ~96 %; "
                     "copy-heavy ngram workloads run higher)")]
    assert judge_one([(1000, 2000, 1950, (975, 975))]).causes == ()  # 97.5 %: no hint


def test_healthy_baseline_figures_get_no_hint():
    """Every healthy figure of baselines.md that promtool_cases runs through the classifier."""
    import promtool_cases as pc

    for pod, model, engines, _, verdict, _ in pc.VERDICT_CASES:
        if verdict not in ("ok", "unknown"):
            continue
        k = len(engines[0]["pos"])
        v = judge_one([(5 * m["drafts"], 5 * m["tokens"], 5 * m["accepted"], tuple(5 * x for x in m["pos"]))
                       for m in engines], profile=profile(model, k))
        assert v.causes == (), (pod, v)


RESTART_INTO_BROKEN = """\
description: V4-Pro k=2, 1 engine; restarted at 120s with a broken draft head
model_name: deepseek-ai/DeepSeek-V4-Pro
engines: 1
k: 2
drafts_per_second: 50
per_position: [0.924, 0.687]
phases:
  - at: 120s
    restart: true
    per_position: [0.0357, 0.0008]
"""


def test_sidecar_names_a_restart_into_a_broken_head(tmp_path):
    """The info series, /metrics and the landing page: the fall coincides with a restart (the
    sidecar saw it) and position 0 is garbage: both are named. The restart is told with the
    figures on both sides (issue 31: the 1m window at the poll before it held 50 drafts/s x 60 s
    = 3,000 drafts at 92.4 % / 68.7 %: AL 2.611), and stays named while the longest window
    (1h), which the fall is read against, holds it."""
    scenario = tmp_path / "restart-broken.yaml"
    scenario.write_text(RESTART_INTO_BROKEN)

    async def go():
        async with harness(str(scenario), {"health": {"window": "1m"}}) as h:
            await h.run_for(100)
            m = await h.metrics()
            assert not m.get(f"{P}_diagnosis_info")
            await h.run_for(80)
            m = await h.metrics()
            causes = {s.labels["cause"] for s in m[f"{P}_diagnosis_info"]}
            assert causes == {"configuration_change", "draft_head_garbage"}
            status, page = await h.get("/")
            assert status == 200
            assert "likely cause (a hint): a configuration change" in page
            assert ("the draft head changed at a restart of engine 0: position 0 accepted in 3.6 % of drafts since "
                    "it, against 92.4 % of 3,000 drafts before it (AL 1.036 since it, against 2.611 before it)") in page
            await h.run_for(120)  # the restart has left the 1m window, not the 1h one
            m = await h.metrics()
            assert {s.labels["cause"] for s in m[f"{P}_diagnosis_info"]} == {"configuration_change", "draft_head_garbage"}
            status, page = await h.get("/")
            assert "the draft head changed at a restart of engine 0: position 0 accepted in 3.6 % of drafts" in page
    run(go())


@pytest.mark.long
def test_sidecar_names_one_rank():
    async def go():
        async with harness("bad-engine") as h:
            await h.run_for(360)
            m = await h.metrics()
            assert [s.labels["cause"] for s in m[f"{P}_diagnosis_info"]] == ["one_rank"]
    run(go())


def test_runbook_has_a_section_per_cause():
    import re

    from vllm_specdec_exporter import config

    text = (REPO / "alerts" / "runbook.md").read_text()
    assert re.findall(r"^### (\w+)$", text, re.M) == list(config.CAUSES)


def test_one_rank_only_while_the_others_stand():
    """The demo at 100-120 s: engine 5 collapsed while the other seven fall too (AL 1.745,
    below V4-Pro k=2's threshold 1 + 0.75 x 1.27 = 1.953): not one rank. With the seven at
    the native 2.611 it is one rank, as before."""
    pro = profile("deepseek-ai/DeepSeek-V4-Pro", 2)
    falling = (6590, 13180, 3295 + 1615, (3295, 1615))  # 0.5 / 0.245 per position: AL 1.745
    v = judge_one([BROKEN_HEAD if e == 5 else falling for e in range(8)], profile=pro)
    assert v.state == "degraded" and "one_rank" not in [h.cause for h in v.causes], v.causes
    assert [h.cause for h in v.causes] == ["draft_head_partial"]
    # 1 + (7 x 4,910 + 240) / (8 x 6,590) = 1.656: the reason says the whole model first
    assert v.reason.startswith("mean acceptance length 1.656 < 1.953 on the whole model; engine 5 collapsed")
    v = judge_one([BROKEN_HEAD if e == 5 else HEALTHY_PRO for e in range(8)], profile=pro)
    assert [h.cause for h in v.causes] == ["one_rank"]


def test_the_real_mtp_heads_of_the_e2e_get_their_causes():
    """Issue 20's real vLLM (tiny DeepSeek-V3, one MTP layer, k=2), the exporter's figures per
    head over one interval: the collapse is garbage alone (position 1 at exactly 0 of 550
    is the broken head's consequence, not a draft shorter than k); the partial head (position
    0 at 42.7 %, position 1 at 2.4 % of those that reached it) names the weak head first and
    the chain shape beside it."""
    from vllm_specdec_exporter import config
    from vllm_specdec_exporter.diagnosis import diagnose
    from vllm_specdec_exporter.model import Counters

    collapse = {"0": Counters(550, 1100, 16, (16, 0))}  # 0.0291 / 0
    assert [h.cause for h in diagnose(collapse, config.DETECTION, 100)] == ["draft_head_garbage"]
    partial = {"0": Counters(398, 796, 174, (170, 4))}  # 0.4271 / 0.0101
    assert [h.cause for h in diagnose(partial, config.DETECTION, 100)] == ["draft_head_partial", "chain_break"]


def test_a_rollout_into_a_partly_broken_head_names_the_restart_and_the_head():
    """Issue 20's e2e partial head, deployed as a restart: the configuration change and the
    weak head both fit, so both are named (and the chain shape beside them)."""
    from vllm_specdec_exporter import config
    from vllm_specdec_exporter.diagnosis import diagnose
    from vllm_specdec_exporter.model import Counters

    partial = {"0": Counters(398, 796, 174, (170, 4))}
    causes = diagnose(partial, config.DETECTION, 100, True, ["a restart of engine 0"])
    assert [h.cause for h in causes] == ["configuration_change", "draft_head_partial", "chain_break"]
    assert causes[1].evidence == ("every engine (1) and every position low since a restart of engine 0: position 0 "
                                  "at 42.7 %, then 2.4 % conditional")


def test_a_position_the_model_accepted_before_its_restart_is_a_chain_break_not_a_short_draft():
    """Stop 41's e2e MTP head whose chained step is broken, read by the sidecar after its
    rollout (k 4 -> 2): position 1 at exactly 0 of 1,908 drafts. By the counters alone a draft
    shorter than k, but the same model accepted position 1 in 92 % of the drafts that reached it
    before the restart: the chain breaks there. A DSpark-like draft whose position was at 0
    before as well, or a k raised past what was drafted before, stays a short draft."""
    from vllm_specdec_exporter import config
    from vllm_specdec_exporter.diagnosis import Earlier, diagnose
    from vllm_specdec_exporter.model import Counters

    now = {"0": Counters(1908, 3816, 1779, (1779, 0))}
    change = ["a restart of engine 0, k 4 -> 2"]
    alone = diagnose(now, config.DETECTION, 100, True)
    assert [h.cause for h in alone] == ["draft_shorter_than_k"]

    healthy_k4 = Counters(280, 1120, 925, (252, 232, 224, 217))
    causes = diagnose(now, config.DETECTION, 100, True, change, Earlier(before=healthy_k4))
    assert "draft_shorter_than_k" not in [h.cause for h in causes], causes
    [chain] = [h for h in causes if h.cause == "chain_break"]
    assert chain.evidence == ("position 0 accepted in 93.2 % of drafts, position 1 in exactly 0 of 1,779 that "
                              "reached it, against 92.1 % before a restart of engine 0, k 4 -> 2: the chain breaks "
                              "there (a draft shorter than k only if the change brought another draft)")

    dead_before = Counters(280, 1120, 252, (252, 0, 0, 0))
    short_before = Counters(280, 280, 252, (252,))  # k=1 before: position 1 was never drafted
    for before in (dead_before, short_before):
        causes = diagnose(now, config.DETECTION, 100, True, change, Earlier(before=before))
        assert causes[0].cause == "draft_shorter_than_k" and "chain_break" not in [h.cause for h in causes], causes


def test_one_rank_of_two_says_the_other_one_is():
    """Issue 31 wording: 'the other 1 are' read wrong."""
    from vllm_specdec_exporter import config
    from vllm_specdec_exporter.health import judge
    from vllm_specdec_exporter.model import Counters

    healthy = Counters(10_000, 20_000, 16_110, (9_240, 6_870))
    broken = Counters(10_000, 20_000, 240, (235, 5))
    verdict = judge({"0": healthy, "1": broken}, 60.0, None, config.DETECTION, config.DEFAULT_MIN_DRAFTS)
    [hint] = [h for h in verdict.causes if h.cause == "one_rank"]
    assert hint.evidence == "engine 1 at AL 1.024 while the other 1 is at AL 2.611", hint


# ---- from test_one_diagnosis.py
# Issue 21: one diagnosis, the same and right on every surface.
#
# Each case is a model served at steady per-position shares from a fresh start (counters at 0
# at t=0). The same counters go to ``report`` (the last dump: its totals are the interval),
# ``diff`` (two dumps), and the sidecar over its health window (``/metrics``'
# diagnosis_info, the landing page, ``/api/v1/summary``). Every surface must name the same
# causes; the causes and their evidence are worked by hand below.


V1 = "vllm:spec_decode_num_"
RATE = 100.0  # drafts per second per engine


def payload(model: str, shares: list[list[float]], t: float, k: int | None = None,
            draft_tokens_per_draft: float | None = None) -> bytes:
    """Engines of ``model`` at ``shares`` (per engine: per-position survival), t seconds after start."""
    lines = []
    for e, pos in enumerate(shares):
        k_ = k or len(pos)
        drafts = RATE * t
        counts = [round(s * drafts) for s in pos]
        lab = f'engine="{e}",model_name="{model}"'
        lines += [f"{V1}drafts_total{{{lab}}} {drafts:.0f}",
                  f"{V1}draft_tokens_total{{{lab}}} {drafts * (draft_tokens_per_draft or k_):.0f}",
                  f"{V1}accepted_tokens_total{{{lab}}} {sum(counts)}"]
        lines += [f'{V1}accepted_tokens_per_pos_total{{{lab},position="{i}"}} {v}' for i, v in enumerate(counts)]
    return ("\n".join(lines) + "\n").encode()


def cli_causes(tmp_path, model: str, before: bytes, after: bytes) -> tuple[list, list]:
    (tmp_path / "a.prom").write_bytes(before)
    (tmp_path / "b.prom").write_bytes(after)
    out = []
    for args in (("report", str(tmp_path / "b.prom")), ("diff", str(tmp_path / "a.prom"), str(tmp_path / "b.prom"))):
        proc = cli(*args, "--format", "json")
        assert proc.returncode == 0, proc.stderr
        out.append(json.loads(proc.stdout)["models"][model]["diagnosis"])
    return out[0], out[1]


def run_sidecar(serve, interval: float, polls: int) -> tuple[dict, str, dict]:
    """The real exporter polling ``serve(t)`` (t: fake seconds from 0) ``polls`` times, one
    ``interval`` apart; then its /metrics samples, landing page and /api/v1/summary."""
    async def go():
        clock = FakeClock(0.0)

        async def handle(request):
            return web.Response(body=serve(clock.t), content_type="text/plain")

        app = web.Application()
        app.router.add_get("/metrics", handle)
        runner, url = await start(app)
        settings = build_settings({"poll": {"interval": f"{interval:g}s", "timeout": "2s"}},
                                  {"urls": [f"{url}/metrics"], "listen_address": "127.0.0.1:0"})
        exp = create_app(settings, mono=clock, start_polling=False)
        exp_runner, exp_url = await start(exp)
        try:
            async with aiohttp.ClientSession() as session:
                for _ in range(polls):
                    await exp[POLLERS][0].poll_once()
                    clock.t += interval
                async with session.get(exp_url + "/metrics") as r:
                    m = parse(await r.text()).samples
                async with session.get(exp_url + "/") as r:
                    page = html.unescape(await r.text())
                async with session.get(exp_url + "/api/v1/summary") as r:
                    summary = await r.json()
        finally:
            await exp_runner.cleanup()
            await runner.cleanup()
        return m, page, summary
    return asyncio.run(go())


def sidecar_causes(model: str, serve) -> tuple[set, str, list, str]:
    """Poll ``serve(t)`` for 6 min of fake time; the causes on /metrics, the landing page's
    hint line, /api/v1/summary's diagnosis and its health state."""
    m, page, summary = run_sidecar(lambda t: serve(t + 60.0), 5.0, 73)
    causes = {s.labels["cause"] for s in m.get("vllm_specdec_diagnosis_info", []) if s.labels["model_name"] == model}
    hint = next((line for line in page.splitlines() if "likely cause" in line), "")
    entry = summary["models"][model]
    return causes, hint, entry["diagnosis"], entry["health"]["state"]


PRO, FLASH = "deepseek-ai/DeepSeek-V4-Pro", "deepseek-ai/DeepSeek-V4-Flash"

CASES = {
    # k=3, position 0 at 82 %, position 1 at 2 % (2.4 % of those that reached it): a chain
    # break, on one engine or eight, whatever the verdict (AL 1.845 < the k=3 profile's 2.12).
    "chain_break_one": (PRO, [[0.82, 0.02, 0.005]], {},
                        [("chain_break", "position 0 accepted in 82.0 % of drafts, position 1 in 2.4 % of those "
                                         "that reached it")]),
    "chain_break_eight": (PRO, [[0.82, 0.02, 0.005]] * 8, {},
                          [("chain_break", "position 0 accepted in 82.0 % of drafts, position 1 in 2.4 % of those "
                                           "that reached it")]),
    # DSpark k=7 past its 5-token block: positions 5 and 6 always exactly 0 (no profile for the name).
    "dspark_k7": ("z-lab/dspark-k7", [[0.75, 0.55, 0.4, 0.3, 0.2, 0.0, 0.0]], {},
                  [("draft_shorter_than_k", "positions 5, 6 accepted in exactly 0 of {drafts} drafts at k=7: try k=5")]),
    # DeepSeek-V4.1 DSpark at k=7 with position 0 at 43 % (profile 2.82, threshold 2.365; AL 1.744
    # and position 0 under the floor: degraded): the short draft first and alone (issue 31 item 4).
    "dspark_v41_k7": ("deepseek-ai/DeepSeek-V4.1-Flash", [[0.43, 0.185, 0.08, 0.034, 0.015, 0.0, 0.0]], {},
                      [("draft_shorter_than_k", "positions 5, 6 accepted in exactly 0 of {drafts} drafts at k=7: "
                                                "try k=5")]),
    # A partly broken DeepSeek MTP head served as V4-Flash (profile 1.99 at k=2): 43 % / 10 %,
    # AL 1.53 < 1.74, one interval, nothing earlier: the head first, no history claimed.
    "partial_head": (FLASH, [[0.43, 0.10]], {},
                     [("draft_head_partial", "every engine (1) and every position low: position 0 at 43.0 %, then "
                                             "23.3 % conditional, with no fall seen (nothing earlier to compare "
                                             "with); synthetic random-token load gives the same counters")]),
    # A steady weak drafter: vLLM's own CI reference for a Qwen3-VL EAGLE3 speculator (AL 1.36,
    # position 0 at 0.29), no profile, nothing earlier: no cause, and health `unknown`.
    "steady_weak_drafter": ("Qwen/Qwen3-VL-8B-Instruct", [[0.29, 0.06, 0.01]], {}, []),
    # The broken V4-Pro conversion (235 / 6590, 5 / 6590): garbage.
    "garbage": (PRO, [[235 / 6590, 5 / 6590]], {},
                [("draft_head_garbage", "position 0 accepted in 3.6 % of drafts, on its only engine")]),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_every_surface_names_the_same_hand_worked_causes(case, tmp_path):
    model, shares, _, expected = CASES[case]
    # report of the dump at 300 s (its totals: 300 s from zero); diff from 60 s to 360 s.
    report, diff = cli_causes(tmp_path, model, payload(model, shares, 60.0), payload(model, shares, 360.0))
    drafts = {"report": f"{RATE * 360 * len(shares):,.0f}", "diff": f"{RATE * 300 * len(shares):,.0f}"}
    for surface, got in (("report", report), ("diff", diff)):
        want = [{"cause": c, "evidence": e.replace("{drafts}", drafts[surface])} for c, e in expected]
        assert got == want, surface
    causes, hint, summary, state = sidecar_causes(model, lambda t: payload(model, shares, t))
    assert causes == {c for c, _ in expected}, "metrics"
    if case == "steady_weak_drafter":
        assert state == "unknown" and hint == ""  # nothing above info: not degraded
    assert [h["cause"] for h in summary] == [c for c, _ in expected], "summary"
    assert summary == [h for h in summary if h["cause"] in causes]
    if expected:
        assert hint, "landing page"
        for c, e in expected:
            assert e.split("{drafts}")[0] in hint, (c, hint)


def test_healthy_figures_name_nothing_anywhere(tmp_path):
    shares = [[0.924, 0.687]] * 8  # native V4-Pro k=2
    report, diff = cli_causes(tmp_path, PRO, payload(PRO, shares, 60.0), payload(PRO, shares, 360.0))
    assert report == diff == []
    causes, hint, summary, state = sidecar_causes(PRO, lambda t: payload(PRO, shares, t))
    assert causes == set() and hint == "" and summary == [] and state == "ok"


def test_diff_names_a_k_change_between_the_dumps(tmp_path):
    """k changed from 3 to 1 between the dumps with the counters kept (every counter rose;
    positions 1 and 2 stopped): 1.00 draft token per draft over the interval, k=3 in the
    series. Named as a configuration change, never "swapped"."""
    model = PRO
    before = payload(model, [[0.8, 0.5, 0.3]], 60.0)
    # 6,000 drafts at k=3, then 30,000 drafts at k=1 (positions 1, 2 frozen)
    after = (f'{V1}drafts_total{{engine="0",model_name="{model}"}} 36000\n'
             f'{V1}draft_tokens_total{{engine="0",model_name="{model}"}} {18000 + 30000}\n'
             f'{V1}accepted_tokens_total{{engine="0",model_name="{model}"}} {4800 + 3000 + 1800 + 24000}\n'
             f'{V1}accepted_tokens_per_pos_total{{engine="0",model_name="{model}",position="0"}} {4800 + 24000}\n'
             f'{V1}accepted_tokens_per_pos_total{{engine="0",model_name="{model}",position="1"}} 3000\n'
             f'{V1}accepted_tokens_per_pos_total{{engine="0",model_name="{model}",position="2"}} 1800\n').encode()
    (tmp_path / "a.prom").write_bytes(before)
    (tmp_path / "b.prom").write_bytes(after)
    proc = cli("diff", "--format", "json", str(tmp_path / "a.prom"), str(tmp_path / "b.prom"))
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["models"][model]["diagnosis"] == [
        {"cause": "configuration_change", "evidence": "1.00 draft tokens per draft while the series say k=3: k was 1 "
                                                      "over this interval (positions 1, 2 did not move)"}]
    assert not any("swapped" in w for w in out["warnings"])


def test_diff_refuses_a_pair_that_is_no_interval(tmp_path):
    """One restart definition: a one-count dip of one position counter is a glitch for the
    sidecar, so diff refuses the pair with one line instead of reporting the engine's
    lifetime as the interval."""
    model = PRO
    before = payload(model, [[0.9, 0.7]], 300.0)
    after = payload(model, [[0.9, 0.7]], 360.0).replace(
        f'position="0"}} {round(0.9 * RATE * 360)}'.encode(), f'position="0"}} {round(0.9 * RATE * 300) - 1}'.encode())
    assert after != payload(model, [[0.9, 0.7]], 360.0)
    (tmp_path / "a.prom").write_bytes(before)
    (tmp_path / "b.prom").write_bytes(after)
    proc = cli("diff", str(tmp_path / "a.prom"), str(tmp_path / "b.prom"))
    assert proc.returncode == 2 and proc.stdout == ""
    assert len(proc.stderr.strip().splitlines()) == 1
    assert "not an interval of the same engines" in proc.stderr and "only some counters went down" in proc.stderr
    # Among eight engines, the one that dipped is left out, named; the others are counted.
    eight_before = payload(model, [[0.9, 0.7]] * 8, 300.0)
    eight_after = payload(model, [[0.9, 0.7]] * 8, 360.0).replace(
        f'engine="3",model_name="{model}",position="0"}} {round(0.9 * RATE * 360)}'.encode(),
        f'engine="3",model_name="{model}",position="0"}} {round(0.9 * RATE * 300) - 1}'.encode())
    (tmp_path / "a.prom").write_bytes(eight_before)
    (tmp_path / "b.prom").write_bytes(eight_after)
    proc = cli("diff", "--format", "json", str(tmp_path / "a.prom"), str(tmp_path / "b.prom"))
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert set(out["models"][model]["engines"]) == {str(e) for e in range(8)} - {"3"}
    assert out["models"][model]["all"]["num_drafts"] == 7 * RATE * 60
    assert any("engine=\"3\"" in w and "not an interval (only some counters went down)" in w for w in out["warnings"])


def test_the_same_weak_figure_after_a_fall_is_degraded_and_a_workload_shift():
    """The steady weak drafter's figures, on a served name with no profile that was healthy
    (0.92 / 0.69 / 0.5) for 40 minutes first: position 0 fell, so the verdict is degraded and,
    with the fall seen over the 1h window and no restart or k change, a workload shift."""
    model = "my-served-name"

    def serve(t: float) -> bytes:
        healthy, weak = [[0.92, 0.69, 0.5]], [[0.29, 0.06, 0.01]]
        if t <= 2400:
            return payload(model, healthy, t)
        lines = []
        for a, b in zip(payload(model, healthy, 2400).decode().splitlines(),
                        payload(model, weak, t - 2400).decode().splitlines(), strict=True):
            name, va = a.rsplit(" ", 1)
            lines.append(f"{name} {float(va) + float(b.rsplit(' ', 1)[1]):.0f}")
        return ("\n".join(lines) + "\n").encode()

    # polls at 0, 15, ..., 2,820 s: 40 healthy minutes, then 7 weak ones
    _, _, summary = run_sidecar(serve, 15.0, (2400 + 420) // 15 + 1)
    entry = summary["models"][model]
    assert entry["health"]["state"] == "degraded"
    assert [h["cause"] for h in entry["diagnosis"]] == ["workload_shift"]
    assert "over 1h, with no restart or k change" in entry["diagnosis"][0]["evidence"]
