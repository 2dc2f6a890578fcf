"""Issue 21: one diagnosis, the same and right on every surface.

Each case is a model served at steady per-position shares from a fresh start (counters at 0
at t=0). The same counters go to ``report`` (the last dump: its totals are the interval),
``diff`` (two dumps), and the sidecar over its health window (``/metrics``'
diagnosis_info, the landing page, ``/api/v1/summary``). Every surface must name the same
causes; the causes and their evidence are worked by hand below.
"""

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
from sidecar_harness import FakeClock, start
from vllm_specdec_exporter.parser import parse
from vllm_specdec_exporter.settings import build_settings
from vllm_specdec_exporter.web import POLLERS, create_app

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


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "vllm_specdec_exporter", *args], capture_output=True, text=True,
                          timeout=60, cwd=REPO)


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
