"""Issue 10: the figures never lie and the poller never dies.

The real exporter app polls a hostile stand-in for vLLM over loopback HTTP (only the
clock is faked). The stand-in serves one engine with a long healthy life (10 M
drafts at AL 2.6, k=2) that is now in a live collapse (AL 1.03): a glitch of one
poll must not paint the collapse green.
"""

from __future__ import annotations

import asyncio
import json
import math
from collections.abc import Callable
from dataclasses import dataclass

import aiohttp
import pytest
from aiohttp import web
from sidecar_harness import LIFE, V1, FakeClock, engine_lines, exporter, one, payload, poll_for, scrape, start
from vllm_specdec_exporter.parser import parse
from vllm_specdec_exporter.settings import build_settings
from vllm_specdec_exporter.web import POLLERS, create_app

P = "vllm_specdec"
RATE = 100  # drafts per second during the collapse
COLLAPSED_AL = 1.03
WINDOWS = ("1m", "5m", "15m", "1h")

def live(t: float) -> tuple[float, float]:
    """(drafts, accepted beyond the healthy life) at fake time t: a collapse at AL 1.03."""
    extra = RATE * (t - 1000.0)
    return LIFE + extra, extra * (COLLAPSED_AL - 1)


@dataclass
class Stand:
    clock: FakeClock
    glitch: Callable[[float], bytes] | None = None  # served once, then back to normal

    async def handle(self, request: web.Request) -> web.Response:
        if self.glitch is not None:
            body, self.glitch = self.glitch(self.clock.t), None
        else:
            body = payload(engine_lines(*live(self.clock.t)))
        return web.Response(body=body, content_type="text/plain")


# --- each glitch, for one poll ---

def dip_one_position(t):  # position 0 one below its previous poll's value
    drafts, extra = live(t)
    prev_p0 = LIFE * 0.9 + live(t - 5)[1]
    return payload(engine_lines(drafts, extra, positions=(prev_p0 - 1, LIFE * 0.7)))


def cut_between_positions(t):  # the payload ends, at a line end, after position 0
    return payload(engine_lines(*live(t))[:-1])


def k_grows(t):
    drafts, extra = live(t)
    return payload(engine_lines(drafts, extra, positions=(LIFE * 0.9 + extra, LIFE * 0.7, 5.0)))


def replica(drafts: float, p0: float, p1: float) -> bytes:
    """Another server's engine "0" of model m: its own counters (per-position fractions p0, p1)."""
    return payload(engine_lines(drafts, 0, positions=(p0 * drafts, p1 * drafts)))


def other_replica_younger(t):  # a second vLLM behind the same URL (a Service with two pods)
    return replica(3_000_000, 0.9, 0.7)


def other_replica_older(t):
    return replica(14_000_000, 0.9, 0.7)


def fresh_replica(t):  # ... that just started: looks like a restart
    return replica(200, 0.9, 0.7)


GLITCHES = [dip_one_position, cut_between_positions, k_grows, other_replica_younger, other_replica_older,
            fresh_replica]


def health(m: dict) -> str:
    states = [s.labels[f"{P}_health"] for s in m.get(f"{P}_health", []) if s.value == 1]
    assert len(states) == 1, m.get(f"{P}_health")
    return states[0]


@pytest.mark.parametrize("glitch", GLITCHES)
def test_one_glitchy_poll_in_a_live_collapse_keeps_every_window_collapsed(glitch):
    async def go():
        clock = FakeClock()
        stand = Stand(clock)
        async with exporter(stand.handle, clock=clock) as (app, url, session, clock):
            await app[POLLERS][0].poll_once()  # the first poll: running totals start here
            await poll_for(app, clock, 300)
            m = await scrape(session, url)
            for w in WINDOWS:
                assert one(m, f"{P}_mean_acceptance_length", window=w) == pytest.approx(COLLAPSED_AL, abs=1e-6)
            assert health(m) == "collapsed"
            stand.glitch = glitch
            for _ in range(3):  # the glitch, then the polls after it
                await poll_for(app, clock, 5)
                m = await scrape(session, url)
                for w in WINDOWS:
                    al = one(m, f"{P}_mean_acceptance_length", window=w)
                    assert al == pytest.approx(COLLAPSED_AL, abs=0.01), (glitch.__name__, w, al)
                assert health(m) == "collapsed"
                assert one(m, f"{P}_up") == 1
                # the re-exported counters never step down for Prometheus either
                drafts = one(m, f"{P}_drafts_total")
                assert drafts >= LIFE
            assert one(m, f"{P}_exporter_inconsistent_polls_total") >= 1
            assert one(m, f"{P}_exporter_engine_restarts_total") == 0
    asyncio.run(go())


def test_a_real_restart_is_still_a_restart():
    async def go():
        clock = FakeClock()
        state = {"restarted_at": None}

        async def handle(request):
            t0 = state["restarted_at"]
            if t0 is None:
                body = payload(engine_lines(*live(clock.t)))
            else:  # all counters start again from zero, healthy now (AL 2.5)
                d = RATE * (clock.t - t0)
                body = payload(engine_lines(d, 0, positions=(0.9 * d, 0.6 * d)))
            return web.Response(body=body, content_type="text/plain")

        async with exporter(handle, clock=clock) as (app, url, session, clock):
            await app[POLLERS][0].poll_once()
            await poll_for(app, clock, 120)
            state["restarted_at"] = clock.t
            await poll_for(app, clock, 65)
            m = await scrape(session, url)
            assert one(m, f"{P}_exporter_engine_restarts_total") == 1
            assert one(m, f"{P}_exporter_inconsistent_polls_total") == 0
            assert one(m, f"{P}_mean_acceptance_length", window="1m") == pytest.approx(2.5, abs=1e-6)
    asyncio.run(go())


# --- 1. the poller never dies; labels are arbitrary strings ---

HOSTILE_ENGINES = ["²", "7" * 250, "٣", 'a"b\\c\nd', "<script>alert(1)</script>", "\u202e", " ", "-1", "1e3",
                   "\x1b[31mred"]
TOO_LONG = "7" * 4301  # over config.MAX_LABEL_VALUE_LENGTH: refused with a warning


def test_any_engine_label_is_served_and_ordered():
    def body(scale: int) -> bytes:
        lines = []
        for i, engine in enumerate(["0", "10", "2", *HOSTILE_ENGINES, TOO_LONG]):
            esc = engine.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
            d = 1000 * (i + 1) * scale
            lines += [ln.replace('engine="X"', f'engine="{esc}"') for ln in
                      engine_lines(d, 0, engine="X", positions=(0.9 * d, 0.6 * d))]
        return payload(lines)

    async def go():
        n = {"i": 0}

        async def handle(request):
            n["i"] += 1
            return web.Response(body=body(n["i"]), content_type="text/plain")
        windows = {"windows": ["20s", "1m", "5m", "15m", "1h"]}  # 20s: the demo's window
        async with exporter(handle, windows) as (app, url, session, clock):
            assert await poll_for(app, clock, 15) == ["success"] * 3  # the engine ordering ran on each
            async with session.get(url + "/metrics") as resp:
                raw = await resp.read()
            m = parse(raw).samples
            engines = [s.labels["engine"] for s in m[f"{P}_drafts_total"]]
            assert sorted(engines) == sorted(["0", "10", "2", *HOSTILE_ENGINES])
            assert one(m, f"{P}_up") == 1 and one(m, f"{P}_exporter_polls_total", result="success") == 3
            assert len(m[f"{P}_engine_mean_acceptance_length"]) == 5 * len(engines)
            async with session.get(url + "/api/v1/summary?window=1m") as resp:
                summary = strict_json(await resp.text())
            assert list(summary["models"]["m"]["engines"])[:3] == ["0", "2", "10"]  # numbers first, in order
            async with session.get(url + "/") as resp:
                page = await resp.text()
            assert resp.status == 200 and "<script>alert" not in page
            from vllm_specdec_exporter.demo import render_frame  # the demo's terminal view
            frame = render_frame(raw, 1.0, "http://sim", url)
            assert "per engine AL  0:2.50  2:2.50  10:2.50" in frame and "\x1b" not in frame
    asyncio.run(go())


@pytest.mark.parametrize("position", ["²", "-1", "1e3", "a", "99999999999999999999", "64"])
def test_one_bad_position_series_is_dropped_with_a_warning_not_the_target(position, capsys):
    good = engine_lines(1000, 0, positions=(900.0, 600.0))
    bad = f'{V1}accepted_tokens_per_pos_total{{engine="0",model_name="m",position="{position}"}} 5'

    async def go():
        n = {"i": 0}

        async def handle(request):
            n["i"] += 1
            scale = n["i"]
            lines = engine_lines(1000 * scale, 0, positions=(900.0 * scale, 600.0 * scale))
            return web.Response(body=payload([*lines, bad]), content_type="text/plain")
        async with exporter(handle) as (app, url, session, clock):
            assert await poll_for(app, clock, 15) == ["success"] * 3
            m = await scrape(session, url)
            assert one(m, f"{P}_up") == 1
            assert sorted(s.labels["position"] for s in m[f"{P}_position_accepted_tokens_total"]) == ["0", "1"]
            assert one(m, f"{P}_mean_acceptance_length", window="1m") == pytest.approx(2.5)
    asyncio.run(go())
    out = capsys.readouterr().out
    assert out.count("target_warning") == 1 and "Traceback" not in out, out  # warned once, no traceback
    assert good  # the good lines are what the figures come from


def test_an_exception_anywhere_in_a_poll_is_counted_logged_once_and_the_next_poll_works(monkeypatch, capsys):
    from vllm_specdec_exporter import poller as polling

    async def go():
        clock = FakeClock()
        stand = Stand(clock)
        async with exporter(stand.handle, clock=clock) as (app, url, session, clock):
            poller = app[POLLERS][0]
            assert await poller.poll_once() == "success"
            real = polling.model_views
            monkeypatch.setattr(polling, "model_views", lambda *a: 1 / 0)
            assert await poll_for(app, clock, 10) == ["error", "error"]
            m = await scrape(session, url)
            assert one(m, f"{P}_up") == 0 and one(m, f"{P}_exporter_polls_total", result="error") == 2
            monkeypatch.setattr(polling, "model_views", real)
            assert await poll_for(app, clock, 5) == ["success"]
            assert one(await scrape(session, url), f"{P}_up") == 1
    asyncio.run(go())
    out = capsys.readouterr().out
    assert out.count("poll_failed_unexpectedly") == 1 and out.count("ZeroDivisionError") >= 1


def test_a_poll_loop_that_fails_is_restarted_and_counted(monkeypatch):
    """The real polling task (start_polling), with the poll itself made to raise."""
    async def go():
        calls = {"n": 0}
        clock = FakeClock()
        stand = Stand(clock)
        app = web.Application()
        app.router.add_get("/metrics", stand.handle)
        runner, target = await start(app)
        settings = build_settings({"poll": {"interval": "100ms", "timeout": "100ms"}, "windows": ["1s", "1m"],
                                   "health": {"window": "1m"}},
                                  {"urls": [f"{target}/metrics"], "listen_address": "127.0.0.1:0"})
        exp = create_app(settings)
        exp_runner, url = await start(exp)
        try:
            poller = exp[POLLERS][0]
            real = type(poller).poll_once

            async def flaky(self):
                calls["n"] += 1
                if calls["n"] == 2:
                    raise RuntimeError("boom outside the poll's own handling")
                return await real(self)
            monkeypatch.setattr(type(poller), "poll_once", flaky)
            loop = asyncio.get_running_loop()
            deadline = loop.time() + 20
            while calls["n"] < 5 and loop.time() < deadline:  # noqa: ASYNC110 -- a bounded wait on the patched poller's count
                await asyncio.sleep(0.05)

            assert calls["n"] >= 5  # still polling after the failure
            async with aiohttp.ClientSession() as session:
                m = await scrape(session, url)
            assert one(m, f"{P}_exporter_poll_task_restarts_total") == 1
            assert one(m, f"{P}_up") == 1
        finally:
            await exp_runner.cleanup()
            await runner.cleanup()
    asyncio.run(go())


# --- 5. figures stay finite, JSON stays valid ---

def strict_json(text: str):
    def refuse(name):
        raise ValueError(f"{name} is not RFC 8259 JSON")
    return json.loads(text, parse_constant=refuse)


def huge_payload(scale: int = 1) -> bytes:
    # Each engine has AL 1.8 taken alone; summed, 1e308-sized counters overflow to inf.
    lines = []
    for engine in ("0", "1"):
        lines += [f'{V1}drafts_total{{engine="{engine}",model_name="m"}} 1e308',
                  f'{V1}draft_tokens_total{{engine="{engine}",model_name="m"}} 1.5e308',
                  f'{V1}accepted_tokens_total{{engine="{engine}",model_name="m"}} 0.8e308',
                  f'{V1}accepted_tokens_per_pos_total{{engine="{engine}",model_name="m",position="0"}} 0.5e308',
                  f'{V1}accepted_tokens_per_pos_total{{engine="{engine}",model_name="m",position="1"}} 0.3e308']
    return payload([*lines, *engine_lines(1000 * scale, 0, engine="2", positions=(900.0 * scale, 600.0 * scale))])


def test_overflowing_counters_never_make_a_non_finite_figure_or_invalid_json():
    async def go():
        n = {"i": 0}

        async def handle(request):
            n["i"] += 1
            body = huge_payload(n["i"])
            return web.Response(body=body, content_type="text/plain")
        async with exporter(handle) as (app, url, session, clock):
            await poll_for(app, clock, 15)
            async with session.get(url + "/metrics") as resp:
                text = await resp.text()
            m = parse(text).samples
            for samples in m.values():
                for s in samples:
                    assert math.isfinite(s.value), s
            assert sorted(s.labels["engine"] for s in m[f"{P}_drafts_total"]) == ["2"]  # the others refused
            assert one(m, f"{P}_mean_acceptance_length", window="1m") == pytest.approx(2.5)
            assert one(m, f"{P}_exporter_invariant_violations_total") >= 10  # each refused value counts
            async with session.get(url + "/api/v1/summary?window=1m") as resp:
                strict_json(await resp.text())
    asyncio.run(go())


def test_report_json_of_overflowing_counters_is_valid(tmp_path):
    from conftest import run_cli
    dump = tmp_path / "huge.prom"
    dump.write_bytes(huge_payload())
    res = run_cli("report", str(dump), "--format", "json")
    assert res.returncode == 0, res.stderr
    summary = strict_json(res.stdout.decode())
    assert list(summary["models"]["m"]["engines"]) == ["2"]
    assert any("not a counter value" in w for w in summary["warnings"])
    res = run_cli("report", str(dump))
    assert res.returncode == 0 and b"Traceback" not in res.stderr and b"inf" not in res.stdout.lower()


# --- 6. the diagnosis is right ---

@pytest.mark.parametrize("body", [
    payload(engine_lines(1000, 0)).replace(b'model_name="m"', b'model_name="m\xff\xfe"'),
    "# HELP vllm:x caf\u00e9\n".encode("latin-1") + payload(engine_lines(1000, 0)),
])
def test_a_payload_that_is_not_utf8_is_not_prometheus_text(body):
    async def go():
        async def handle(request):
            return web.Response(body=body, content_type="text/plain")
        async with exporter(handle) as (app, url, session, _clock):
            assert await app[POLLERS][0].poll_once() == "not_prometheus"

            m = await scrape(session, url)
            assert one(m, f"{P}_up") == 0
            assert "UTF-8" in app[POLLERS][0].view.last_error
    asyncio.run(go())


# --- 8. small ones ---

@pytest.mark.parametrize("header, gzipped", [("gzip", True), ("gzip;q=0", False), ("gzip; q=0.0, identity", False),
                                             ("identity, *;q=0.5", True), ("br", False), ("*;q=0, gzip;q=0.1", True)])
def test_accept_encoding_q_values_are_honoured(header, gzipped):
    async def go():
        clock = FakeClock()
        stand = Stand(clock)
        async with exporter(stand.handle, clock=clock) as (app, url, session, clock):
            await poll_for(app, clock, 10)
            async with session.get(url + "/metrics", headers={"Accept-Encoding": header}, auto_decompress=False) as resp:
                assert resp.status == 200
                assert (resp.headers.get("Content-Encoding") == "gzip") == gzipped
    asyncio.run(go())


def test_summary_drops_a_model_that_went_away_with_its_counters():
    async def go():
        clock = FakeClock()
        served = {"models": ["a", "b"]}

        async def handle(request):
            lines = []
            for model in served["models"]:
                lines += engine_lines(*live(clock.t), model=model)
            return web.Response(body=payload(lines), content_type="text/plain")
        async with exporter(handle, clock=clock) as (app, url, session, clock):
            await poll_for(app, clock, 30)
            served["models"] = ["a"]
            await poll_for(app, clock, 10)
            async with session.get(url + "/api/v1/summary?window=1m") as resp:
                summary = strict_json(await resp.text())
            assert list(summary["models"]) == ["a"]
            m = await scrape(session, url)
            assert {s.labels["model_name"] for s in m[f"{P}_mean_acceptance_length"]} == {"a"}
    asyncio.run(go())


def test_a_parsing_process_that_dies_fails_one_poll_not_the_poller():
    """A big payload goes to the parsing process; kill it: that poll is an error, the
    next one works with a fresh process."""
    import os

    from vllm_specdec_exporter import parse_pool

    big = payload(engine_lines(*live(1000.0))) + b"# padding\n" * 40_000  # over PARSE_IN_WORKER_BYTES

    async def go():
        clock = FakeClock()

        async def handle(request):
            return web.Response(body=big, content_type="text/plain")
        async with exporter(handle, clock=clock) as (app, url, session, clock):
            poller = app[POLLERS][0]
            assert await poller.poll_once() == "success"  # the parsing process is up
            for proc in [p for pool in parse_pool._POOLS.values() for p in pool._processes.values()]:  # the worker dies (killed, out of memory; whichever lane the target uses)
                os.kill(proc.pid, 9)
            assert await poller.poll_once() == "error"  # that poll only
            assert "parsing process died" in poller.view.last_error
            assert await poller.poll_once() == "success"  # a fresh process
            assert one(await scrape(session, url), f"{P}_up") == 1
    asyncio.run(go())


def test_invariant_violations_of_a_window_are_in_the_model_view():
    """Counters that break vLLM's invariants (accepted above draft tokens, AL 10 at k=2)
    are still read; the view carries the violations for health to use."""
    async def go():
        n = {"i": 0}

        async def handle(request):
            n["i"] += 1
            d = 1000 * n["i"]
            lab = 'engine="0",model_name="m"'
            return web.Response(body=payload([f"{V1}drafts_total{{{lab}}} {d}", f"{V1}draft_tokens_total{{{lab}}} {2 * d}",
                                              f"{V1}accepted_tokens_total{{{lab}}} {9 * d}",
                                              f'{V1}accepted_tokens_per_pos_total{{{lab},position="0"}} {0.9 * d:.0f}',
                                              f'{V1}accepted_tokens_per_pos_total{{{lab},position="1"}} {0.6 * d:.0f}']),
                                content_type="text/plain")
        async with exporter(handle) as (app, _url, _session, clock):
            await poll_for(app, clock, 15)
            view = app[POLLERS][0].view
            warnings = view.models[0].windows["1m"].stats.warnings
            assert any("accepted=" in w and "exceeds draft_tokens" in w for w in warnings), warnings
            assert view.invariant_violations > 0
    asyncio.run(go())


# --- issue 19 item 1: trouble in the histogram or generation tokens is theirs alone ---

HIST = "vllm:request_spec_decode_acceptance_rate"
EDGES = ("0.05", "0.5", "0.98")
HEALTHY_UNTIL = 1000.0 + 7200  # two watched hours at AL 2.6, then a live collapse


def watched(t: float, glitch: str = "") -> bytes:
    """Engine 0: healthy (per position 0.9, 0.7) for two watched hours, then AL 1.03; with
    vLLM's per-request histogram (one finished request per 10 drafts) and generation tokens
    after the counters, as vLLM writes them. ``glitch`` breaks one of those for this poll."""
    healthy = min(t, HEALTHY_UNTIL) - 1000.0
    collapsed = max(t - HEALTHY_UNTIL, 0.0)
    drafts = LIFE + RATE * (healthy + collapsed)
    p0 = LIFE * 0.9 + RATE * (0.9 * healthy + (COLLAPSED_AL - 1) * collapsed)
    p1 = LIFE * 0.7 + RATE * 0.7 * healthy
    lines = engine_lines(drafts, 0, positions=(p0, p1))
    before, since = (LIFE + RATE * healthy) / 10, RATE * collapsed / 10  # finished requests
    requests = before + since  # every request since the collapse accepts below 0.05
    low, mid = before * 0.1 + since, before * 0.2 + since
    buckets = dict(zip(EDGES, (low, mid, before * 0.5 + since), strict=True))
    lab = 'engine="0",model_name="m"'
    if glitch == "nan_bucket":
        buckets["0.5"] = math.nan
    if glitch == "bucket_dips":
        buckets["0.05"] = 1.0
    if glitch == "other_edges":
        buckets = {"0.1": low, "0.9": mid}
    hist = [f'{HIST}_bucket{{{lab},le="{e}"}} {v}' for e, v in buckets.items()]
    hist += [f'{HIST}_bucket{{{lab},le="+Inf"}} {requests}', f"{HIST}_count{{{lab}}} {requests}"]
    generation = [f"vllm:generation_tokens_total{{{lab}}} {3 * drafts:.0f}"]
    if glitch == "histogram_missing":  # a scrape cut after the counters: vLLM writes the histogram after them
        hist = []
    if glitch == "generation_missing":
        generation = []
    if glitch == "generation_dips":
        generation = [f"vllm:generation_tokens_total{{{lab}}} 5"]
    return payload(lines + generation + hist)


@pytest.mark.parametrize("glitch", ["histogram_missing", "other_edges", "nan_bucket", "bucket_dips",
                                    "generation_missing", "generation_dips"])
def test_a_glitch_in_the_histogram_or_generation_never_paints_a_collapse_healthy(glitch):
    """Before the fix, one poll without the histogram dropped its running total, the next
    restarted it from zero, and every window read that as an engine restart: the whole
    watched history (two healthy hours) came back into every window, AL 1.03 -> ~2.5."""
    async def go():
        clock = FakeClock()
        state = {"glitch": ""}

        async def handle(request):
            body, state["glitch"] = watched(clock.t, state["glitch"]), ""
            return web.Response(body=body, content_type="text/plain")

        async with exporter(handle, clock=clock) as (app, url, session, clock):
            await app[POLLERS][0].poll_once()
            await poll_for(app, clock, HEALTHY_UNTIL - 1000.0 + 3600, step=30)  # 2 h healthy, 1 h collapsed
            m = await scrape(session, url)
            assert health(m) == "collapsed"
            requests_1h = one(m, f"{P}_window_requests", window="1h")
            assert requests_1h == pytest.approx(RATE * 3600 / 10, rel=0.02)
            state["glitch"] = glitch
            for _ in range(4):  # the glitch, then the polls after it
                await poll_for(app, clock, 30, step=30)
                m = await scrape(session, url)
                for w in WINDOWS:
                    al = one(m, f"{P}_mean_acceptance_length", window=w)
                    assert al == pytest.approx(COLLAPSED_AL, abs=0.01), (glitch, w, al)
                assert health(m) == "collapsed"
                assert one(m, f"{P}_exporter_engine_restarts_total") == 0
                # the histogram's window never holds more than the window's requests
                assert one(m, f"{P}_window_requests", window="1h") <= requests_1h * 1.02
            # the histogram keeps counting through the glitch: nothing lost
            assert one(m, f"{P}_window_requests", window="1h") == pytest.approx(requests_1h, rel=0.02)
            assert one(m, f"{P}_request_acceptance_below_ratio", window="1h", edge="0.05") == pytest.approx(1.0, abs=0.02)
            assert one(m, f"{P}_exporter_inconsistent_polls_total") >= 1  # counted, and logged once
    asyncio.run(go())
