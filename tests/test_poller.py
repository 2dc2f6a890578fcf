"""The poller against hostile targets: the figures never lie and the poller never dies.

The real exporter app (or the real `serve` process) polls hostile stand-ins for vLLM over
loopback HTTP: glitches of one poll, every way a target goes wrong and recovers, warnings
that grow without bound, a k beyond what the rules cover. Each section below keeps the
docstring of the file it came from (issue 32: tests by module).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import math
import sys
from collections.abc import Callable
from dataclasses import dataclass, field

import aiohttp
import pytest
from aiohttp import web
from http_fixtures import LoopbackServer, prom
from sidecar_harness import LIFE, V1, FakeClock, engine_lines, exporter, one, payload, poll_for, scrape, start, values
from vllm_specdec_exporter import config
from vllm_specdec_exporter.parser import parse
from vllm_specdec_exporter.scenarios import load_scenario, parse_scenario
from vllm_specdec_exporter.settings import build_settings
from vllm_specdec_exporter.simulate import Simulation
from vllm_specdec_exporter.web import POLLERS, create_app, start_site

# ---- from test_glitches.py
# Issue 10: the figures never lie and the poller never dies.
#
# The real exporter app polls a hostile stand-in for vLLM over loopback HTTP (only the
# clock is faked). The stand-in serves one engine with a long healthy life (10 M
# drafts at AL 2.6, k=2) that is now in a live collapse (AL 1.03): a glitch of one
# poll must not paint the collapse green.


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
    status, headers, _ = asyncio.run(metrics_with({"Accept-Encoding": header}))
    assert status == 200
    assert (headers.get("Content-Encoding") == "gzip") == gzipped


async def metrics_with(headers: dict) -> tuple[int, dict, bytes]:
    """/metrics with these request headers, after 10 s of polls of a stand-in (the body as sent)."""
    clock = FakeClock()
    stand = Stand(clock)
    async with exporter(stand.handle, clock=clock) as (app, url, session, clock):
        await poll_for(app, clock, 10)
        async with session.get(url + "/metrics", headers=headers, auto_decompress=False) as resp:
            return resp.status, dict(resp.headers), await resp.read()


OM, TEXT = "application/openmetrics-text", "text/plain"


@pytest.mark.parametrize("header, served", [
    ("", TEXT), ("*/*", TEXT), ("application/json", TEXT),
    # Prometheus 2.42's header: OpenMetrics first.
    ("application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,"
     "text/plain;version=0.0.4;q=0.5,*/*;q=0.1", OM),
    # q-values, which prometheus_client's choose_encoder ignores: refused, or preferred less than text.
    ("application/openmetrics-text;version=1.0.0;q=0", TEXT), ("application/openmetrics-text; Q=0.0, */*", TEXT),
    ("text/plain;version=0.0.4;q=0.9,application/openmetrics-text;version=1.0.0;q=0.5,*/*;q=0.1", TEXT),
    ("text/plain;q=0.2, application/openmetrics-text;version=1.0.0;q=0.8", OM),
    ("application/openmetrics-text;version=1.0.0;q=nan, text/plain", TEXT),
    # A version that is not numbers raised out of prometheus_client's choose_encoder: a 500.
    ("application/openmetrics-text;version=abc", TEXT), ("application/openmetrics-text;version=x, */*;q=0.1", TEXT),
])
def test_the_metrics_format_honours_accept_q_values(header, served):
    status, headers, body = asyncio.run(metrics_with({"Accept": header, "Accept-Encoding": "identity"}))
    assert status == 200 and headers["Content-Type"].startswith(served), headers
    assert body.endswith(b"# EOF\n") == (served == OM)
    # Its format and encoding follow the request's headers: a cache must key on both (helper-29).
    assert {v.strip() for v in headers["Vary"].split(",")} == {"Accept", "Accept-Encoding"}, headers


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

    big = payload(engine_lines(*live(1000.0))) + b"# padding\n" * 120_000  # over PARSE_ON_LOOP_MAX_BYTES

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


# ---- from test_faults.py
# Fault suite: the real exporter against real hostile HTTP servers on loopback.
#
# One loopback server plays vLLM and can be switched, between polls, to every way a
# target goes wrong. For each fault: the exporter stays up, /metrics answers 200,
# `up` and the error counters say what happened, no derived figure is out of
# range or frozen from before the fault, and it recovers by itself.


HEALTHY_AL = 1 + 0.924 + 0.687


@dataclass
class Hostile:
    """What the fake vLLM does on the next request."""

    sim: Simulation
    mode: str = "ok"
    override: bytes | None = None
    requests: int = 0
    log: list[str] = field(default_factory=list)

    async def handle(self, request: web.Request) -> web.StreamResponse:
        self.requests += 1
        self.sim.tick()
        mode = self.mode
        if mode in ("500", "404", "html", "empty", "garbage", "reset"):  # no payload: skip the ~0.1 s render
            body = b""
        else:
            body = self.override if self.override is not None else self.sim.render()
        if mode == "ok":
            return web.Response(body=body, content_type="text/plain")
        if mode in ("500", "404"):
            return web.Response(status=int(mode), text="error")
        if mode == "html":
            return web.Response(text="<!DOCTYPE html><html><body><h1>502 Bad Gateway</h1></body></html>",
                                content_type="text/html")
        if mode == "empty":
            return web.Response(body=b"", content_type="text/plain")
        if mode == "garbage":
            return web.Response(body=bytes(range(256)) * 64, content_type="application/octet-stream")
        if mode == "truncated":
            cut = body.index(b'vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="5"') + 40
            return web.Response(body=body[:cut], content_type="text/plain")
        if mode == "oversize":
            return web.Response(body=body + b"# padding\n" * 300_000, content_type="text/plain")  # > 2 MiB cap
        if mode == "long-line":
            # a 10 MB line that starts like a spec-decode series: read, refused, counted
            line = b"vllm:spec_decode_num_drafts_total{" + b"a" * (10 * 1024 * 1024)
            return web.Response(body=line + b"\n" + body, content_type="text/plain")
        if mode == "spec-off":  # restarted without --speculative-config: the families are gone
            return web.Response(body=b"\n".join(l for l in body.split(b"\n") if b"spec_decode" not in l),
                                content_type="text/plain")
        if mode == "slow":
            await asyncio.sleep(1)  # past SLOW_POLL_TIMEOUT
            return web.Response(body=body, content_type="text/plain")
        if mode == "reset":
            request.transport.close()  # the connection drops mid-request
            raise ConnectionResetError("reset by the hostile server")
        raise AssertionError(mode)


def started_at(scenario, clock: FakeClock) -> Simulation:
    """vLLM (simulated) started now on the test's clock: its _created moves as that clock does
    (a restart in the test's minutes, not the real milliseconds, which are the same start)."""
    return Simulation(scenario, clock=clock, wall=lambda: 1.7e9 + clock())


@contextlib.asynccontextmanager
async def hostile_target(scenario="healthy", config: dict | None = None):
    clock = FakeClock()
    sim = started_at(load_scenario(scenario) if isinstance(scenario, str) else scenario, clock)
    hostile = Hostile(sim)
    app = web.Application()
    app.router.add_get("/metrics", hostile.handle)
    runner, url = await start(app)
    settings = build_settings(
        {"poll": {"interval": "5s", "timeout": "2s"}, "staleness": "30s", "max_payload_bytes": 2 * 1024 * 1024,
         "health": {"window": "1m"}, **(config or {})},
        {"urls": [f"{url}/metrics"], "listen_address": "127.0.0.1:0"})
    exporter = create_app(settings, mono=clock, start_polling=False)
    exp_runner, exp_url = await start(exporter)
    async with aiohttp.ClientSession() as session:
        h = Target(clock, hostile, exporter, session, exp_url, runner)
        try:
            await h.poll()
            yield h
        finally:
            await exp_runner.cleanup()
            with contextlib.suppress(Exception):
                await runner.cleanup()


@dataclass
class Target:
    clock: FakeClock
    hostile: Hostile
    app: web.Application
    session: aiohttp.ClientSession
    exporter_url: str
    runner: web.AppRunner

    async def poll(self) -> str:
        return await self.app[POLLERS][0].poll_once()

    async def run_for(self, seconds: float) -> list[str]:
        results = []
        for _ in range(int(seconds // 5)):
            self.clock.t += 5
            results.append(await self.poll())
        return results

    async def metrics(self) -> dict:
        async with self.session.get(self.exporter_url + "/metrics") as resp:
            assert resp.status == 200
            return parse(await resp.text()).samples


def assert_sane(m: dict, k: int = 2) -> None:
    """No derived figure outside its range, whatever happened."""
    for s in m.get(f"{P}_acceptance_ratio", []) + m.get(f"{P}_engine_acceptance_ratio", []):
        assert 0.0 <= s.value <= 1.0, s
    for name in ("position_acceptance_ratio", "position_conditional_acceptance_ratio"):
        for s in m.get(f"{P}_{name}", []):
            assert 0.0 <= s.value <= 1.0, s
    for name in ("mean_acceptance_length", "engine_mean_acceptance_length"):
        for s in m.get(f"{P}_{name}", []):
            assert 1.0 <= s.value <= k + 1 and math.isfinite(s.value), s
    for s in m.get(f"{P}_window_drafts", []):
        assert s.value >= 0, s


# The slow case's own poll timeout: each of its ~8 timed-out polls waits for it in real
# time. The others keep 2 s (a 2 MiB oversize body needs it on a loaded machine).
SLOW_POLL_TIMEOUT = "300ms"
FAULTS = [
    ("500", "http_error"), ("404", "http_error"), ("html", "not_prometheus"), ("empty", "not_prometheus"),
    ("garbage", "not_prometheus"), ("oversize", "too_large"), ("slow", "timeout"), ("reset", None),
]


@pytest.mark.parametrize("mode, result", FAULTS)
def test_fault_then_recovery(mode, result):
    async def go():
        config = {"poll": {"interval": "5s", "timeout": SLOW_POLL_TIMEOUT}} if mode == "slow" else None
        async with hostile_target(config=config) as t:
            await t.run_for(120)
            before = await t.metrics()
            assert one(before, f"{P}_up") == 1
            assert one(before, f"{P}_mean_acceptance_length", window="1m") == pytest.approx(HEALTHY_AL, rel=0.01)
            t.hostile.mode = mode
            results = await t.run_for(10)
            assert results[0] != "success"
            if result:
                assert set(results) == {result}
            m = await t.metrics()
            assert one(m, f"{P}_up") == 0  # at once
            # Counted from the fault on: on a loaded machine a healthy poll may have timed out
            # before it at the slow case's 300 ms (seen once at load 8).
            def failed(ms: dict, res: str | None = None) -> float:
                return sum(s.value for s in ms[f"{P}_exporter_polls_total"]
                           if s.labels["result"] != "success" and res in (None, s.labels["result"]))
            assert failed(m) - failed(before) == 2
            if result:
                assert failed(m, result) - failed(before, result) == 2
            assert_sane(m)
            await t.run_for(30)  # past the 30 s staleness: nothing frozen from before the fault
            m = await t.metrics()
            assert not values(m, f"{P}_mean_acceptance_length") and not values(m, f"{P}_health")
            assert not values(m, f"{P}_drafts_total")
            t.hostile.mode = "ok"
            await t.run_for(65)  # recovers by itself, with fresh figures
            m = await t.metrics()
            assert one(m, f"{P}_up") == 1
            assert one(m, f"{P}_mean_acceptance_length", window="1m") == pytest.approx(HEALTHY_AL, rel=0.01)
            assert_sane(m)
    asyncio.run(go())


def test_refused_port_then_back():
    async def go():
        async with hostile_target() as t:
            await t.run_for(60)
            port = int(t.app[POLLERS][0].target.url.rsplit(":", 1)[1].split("/")[0])
            await t.runner.cleanup()  # nothing listens any more
            assert await t.poll() == "connect_error"
            m = await t.metrics()
            assert one(m, f"{P}_up") == 0 and one(m, f"{P}_exporter_polls_total", result="connect_error") == 1
            assert_sane(m)
            app = web.Application()  # vLLM comes back on the same port
            app.router.add_get("/metrics", t.hostile.handle)
            t.runner = web.AppRunner(app, access_log=None)
            await t.runner.setup()
            await start_site(t.runner, "127.0.0.1", port)
            await t.run_for(65)
            m = await t.metrics()
            assert one(m, f"{P}_up") == 1
            assert one(m, f"{P}_mean_acceptance_length", window="1m") == pytest.approx(HEALTHY_AL, rel=0.01)
    asyncio.run(go())


def test_truncated_payload_keeps_what_arrived_without_lying():
    async def go():
        async with hostile_target() as t:
            await t.run_for(120)
            t.hostile.mode = "truncated"
            assert set(await t.run_for(30)) == {"success"}  # the engines before the cut still count
            m = await t.metrics()
            assert_sane(m)
            assert one(m, f"{P}_exporter_last_poll_parse_errors") == 1  # the line cut short, in the last poll
            # engines 5..7 were cut off: their counters are not re-exported from a partial scrape
            assert sorted(s.labels["engine"] for s in m[f"{P}_drafts_total"]) == ["0", "1", "2", "3", "4"]
            assert one(m, f"{P}_mean_acceptance_length", window="1m") == pytest.approx(HEALTHY_AL, rel=0.01)
    asyncio.run(go())


def test_ten_megabyte_single_line_is_survived():
    async def go():
        async with hostile_target(config={"max_payload_bytes": 16 * 1024 * 1024}) as t:
            await t.run_for(60)
            t.hostile.mode = "long-line"
            assert set(await t.run_for(10)) == {"success"}
            m = await t.metrics()
            assert one(m, f"{P}_up") == 1 and one(m, f"{P}_exporter_last_poll_parse_errors") >= 1
            assert_sane(m)
    asyncio.run(go())


def test_restart_with_a_new_k_and_an_engine_that_disappears_and_comes_back():
    k2 = parse_scenario({"model_name": "m", "engines": 2, "k": 2, "drafts_per_second": 50,
                         "per_position": [0.9, 0.6]}, "k2")
    k3 = parse_scenario({"model_name": "m", "engines": 2, "k": 3, "drafts_per_second": 50,
                         "per_position": [0.9, 0.6, 0.3]}, "k3")

    async def go():
        async with hostile_target(k2) as t:
            await t.run_for(60)
            assert one(await t.metrics(), f"{P}_num_speculative_tokens") == 2
            # engine 1 vanishes from the payload for a while, then returns
            full = t.hostile.sim.render()
            t.hostile.override = b"\n".join(l for l in full.split(b"\n") if b'engine="1"' not in l) + b"\n"
            await t.run_for(20)
            m = await t.metrics()
            assert_sane(m)
            assert sorted(s.labels["engine"] for s in m[f"{P}_drafts_total"]) == ["0"]
            t.hostile.override = None
            await t.run_for(20)
            assert sorted(s.labels["engine"] for s in (await t.metrics())[f"{P}_drafts_total"]) == ["0", "1"]
            # vLLM restarts with k=3: counters back to zero, one more position
            t.hostile.sim = started_at(k3, t.clock)
            await t.run_for(70)
            m = await t.metrics()
            assert_sane(m, k=3)
            assert one(m, f"{P}_num_speculative_tokens") == 3
            assert one(m, f"{P}_exporter_engine_restarts_total") == 2
            assert one(m, f"{P}_mean_acceptance_length", window="1m") == pytest.approx(1 + 0.9 + 0.6 + 0.3, rel=0.01)
            assert sorted(s.labels["position"] for s in values_of(m, "position_acceptance_ratio", window="1m")) == ["0", "1", "2"]
    asyncio.run(go())


def values_of(m, name, **labels):
    return [s for s in m.get(f"{P}_{name}", []) if all(s.labels.get(k) == v for k, v in labels.items())]


def test_labels_with_quotes_backslashes_and_newlines():
    weird = 'weird "model" \\ path\nline2'
    scenario = parse_scenario({"model_name": weird, "engines": 1, "k": 2, "drafts_per_second": 50,
                               "per_position": [0.9, 0.6]}, "weird")

    async def go():
        async with hostile_target(scenario) as t:
            await t.run_for(70)
            m = await t.metrics()  # our own exposition parses back to the same label value
            assert one(m, f"{P}_mean_acceptance_length", model_name=weird, window="1m") == pytest.approx(2.5, rel=0.01)
            async with t.session.get(t.exporter_url + "/") as resp:
                page = await resp.text()
            assert "weird &quot;model&quot;" in page  # escaped on the landing page
    asyncio.run(go())


def test_a_flood_of_engines_is_capped_counted_and_logged(caplog, capsys):
    flood = parse_scenario({"model_name": "m", "engines": 120, "k": 1, "drafts_per_second": 5,
                            "per_position": [0.8]}, "flood")

    async def go():
        config = {"max_series_per_target": 50, "max_payload_bytes": 16 * 1024 * 1024,
                  "poll": {"interval": "5s", "timeout": "20s"}}  # 120 engines: a 3.2 MB payload
        async with hostile_target(flood, config=config) as t:
            await t.run_for(10)
            m = await t.metrics()
            assert len(m[f"{P}_drafts_total"]) == 50
            polls = one(m, f"{P}_exporter_polls_total", result="success")
            assert polls >= 3
            assert one(m, f"{P}_exporter_last_poll_series_refused") == 70  # a gauge of the last poll, not 70 x polls
            assert one(m, f"{P}_up") == 1
            assert_sane(m, k=1)
    asyncio.run(go())
    logged = capsys.readouterr().out + caplog.text
    assert "model/engine series over the 50 held per target (max_series_per_target)" in logged


def test_200_concurrent_scrapes_all_answered_and_consistent():
    async def go():
        async with hostile_target() as t:
            await t.run_for(60)
            connector = aiohttp.TCPConnector(limit=0)
            async with aiohttp.ClientSession(connector=connector) as session:
                async def scrape():
                    started = asyncio.get_running_loop().time()
                    async with session.get(t.exporter_url + "/metrics") as resp:
                        return resp.status, await resp.read(), asyncio.get_running_loop().time() - started
                results = await asyncio.gather(*(scrape() for _ in range(200)))
            assert [r[0] for r in results] == [200] * 200
            assert len({r[1] for r in results}) == 1  # one consistent state
            latencies = sorted(r[2] for r in results)
            p99 = latencies[int(0.99 * len(latencies)) - 1]
            print(f"scrape_p99_seconds_200_concurrent: {p99:.4f}")
            assert p99 < 5  # bounded; was ~1 s (SYN retransmits) before the listen backlog was raised
    asyncio.run(go())


SOAK = parse_scenario({"model_name": "m", "engines": 2, "k": 2, "drafts_per_second": 50, "per_position": [0.9, 0.6]},
                      "soak")


def soak(minutes: int, restart_every: int, outage_every: int, probe_at: tuple[int, int], probe, config=None) -> list:
    """Polls every 5 s for ``minutes`` simulated minutes; vLLM restarts every ``restart_every``
    minutes and answers 500 for one minute every ``outage_every``. Returns ``probe()`` (plus
    tasks and file descriptors) at the two minutes of ``probe_at``, after a scrape."""
    import gc
    import os

    async def go():
        async with hostile_target(SOAK, config=config) as t:
            samples = []
            for minute in range(minutes):
                if minute % restart_every == restart_every - 1:
                    t.hostile.sim = started_at(SOAK, t.clock)  # vLLM restarts
                t.hostile.mode = "500" if minute % outage_every == outage_every // 2 else "ok"
                await t.run_for(60)
                if minute in probe_at:
                    assert_sane(await t.metrics())
                    for _ in range(20):  # let closed connections' callbacks run (no time passes)
                        await asyncio.sleep(0)
                    gc.collect()
                    samples.append((probe(), len(asyncio.all_tasks()), len(os.listdir("/proc/self/fd"))))
            m = await t.metrics()
            assert one(m, f"{P}_exporter_engine_restarts_total") == 2 * (minutes // restart_every)
            assert one(m, f"{P}_up") == 1
            return samples

    (first, tasks_first, fds_first), (last, tasks_last, fds_last) = asyncio.run(go())
    assert tasks_last == tasks_first
    assert fds_last <= fds_first + 2
    return [first, last]


def test_soak_restarts_and_outages_leave_nothing_growing():
    """Half an hour of 5 s polls (windows of 1m and 5m, full after 5 min), a restart and
    an outage every 5 min: between minute 9 and 29 (240 polls), the task and fd counts
    are flat, and so are Python's allocated blocks and the RSS: a cheap stand-in for
    tracemalloc (the two-hour traced soak is `make soak`). A leak of 2 small objects
    per poll, or of 8 KB per poll, fails it; measured growth without one: about 60 blocks."""
    import os
    import sys

    def probe():
        with open("/proc/self/statm") as f:
            return sys.getallocatedblocks(), int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")

    (blocks_first, rss_first), (blocks_last, rss_last) = soak(
        30, 5, 5, (9, 29), probe, config={"windows": ["1m", "5m"]})
    assert blocks_last - blocks_first < 400, (blocks_first, blocks_last)
    assert rss_last - rss_first < 1024 * 1024, (rss_first, rss_last)


@pytest.mark.soak
def test_soak_two_hours_traced_by_tracemalloc():
    """`make soak`: two simulated hours with the default windows (up to 1h), a restart
    every 30 min and an outage every 20 min; traced memory between minute 65 (every
    window full) and 119 stays flat."""
    import tracemalloc

    tracemalloc.start()
    try:
        first, last = soak(120, 30, 20, (65, 119), lambda: tracemalloc.get_traced_memory()[0])
    finally:
        tracemalloc.stop()
    assert last - first < 512 * 1024, (first, last)  # windows are bounded: no growth with uptime


def test_a_failing_target_is_logged_when_it_starts_failing_not_on_every_poll(capsys, caplog):
    async def go():
        async with hostile_target() as t:
            await t.run_for(30)
            t.hostile.mode = "oversize"  # the message varies with the payload size
            await t.run_for(60)
            t.hostile.mode = "500"
            await t.run_for(30)
    asyncio.run(go())
    logged = capsys.readouterr().out + caplog.text
    assert logged.count("target_poll_failed") == 2, logged  # one per kind of failure, not 18


def test_spec_decode_switched_off_keeps_generation_visible():
    async def go():
        async with hostile_target() as t:
            await t.run_for(120)
            t.hostile.mode = "spec-off"
            assert set(await t.run_for(40)) == {"no_spec_decode"}
            m = await t.metrics()
            assert one(m, f"{P}_up") == 1  # vLLM answers: it is reachable
            assert one(m, f"{P}_exporter_polls_total", result="no_spec_decode") == 8
            generation = {s.labels["engine"]: s.value for s in m[f"{P}_generation_tokens_total"]}
            assert sorted(generation) == [str(e) for e in range(8)]
            for family in ("drafts_total", "mean_acceptance_length", "health", "window_drafts"):
                assert not values(m, f"{P}_{family}"), family  # nothing derived from absent families
            await t.run_for(20)
            later = {s.labels["engine"]: s.value for s in (await t.metrics())[f"{P}_generation_tokens_total"]}
            assert all(later[e] > generation[e] for e in generation)  # still counting
            t.hostile.mode = "ok"
            await t.run_for(65)
            m = await t.metrics()
            assert one(m, f"{P}_mean_acceptance_length", window="1m") == pytest.approx(HEALTHY_AL, rel=0.01)
            assert_sane(m)
    asyncio.run(go())


def churn(polls: int, interval: str, config: str = "") -> dict:
    """The real `serve` process against a target with a new engine label on every poll
    (plus one steady engine): what it holds must stay bounded. Returns the figures."""
    import json as _json
    import re
    import subprocess
    import tempfile
    import time
    import urllib.request

    from conftest import cli_path
    from http_fixtures import LoopbackServer, prom

    def body(n: int) -> bytes:
        lines = []
        for engine, drafts in (("0", 1000 * (n + 1)), (f"churn-{n}", 1000)):
            lab = f'engine="{engine}",model_name="m"'
            lines += [f"vllm:spec_decode_num_drafts_total{{{lab}}} {drafts}",
                      f"vllm:spec_decode_num_draft_tokens_total{{{lab}}} {2 * drafts}",
                      f"vllm:spec_decode_num_accepted_tokens_total{{{lab}}} {1.5 * drafts:.0f}",
                      f'vllm:spec_decode_num_accepted_tokens_per_pos_total{{{lab},position="0"}} {0.9 * drafts:.0f}',
                      f'vllm:spec_decode_num_accepted_tokens_per_pos_total{{{lab},position="1"}} {0.6 * drafts:.0f}']
        return ("\n".join(lines) + "\n").encode()

    def get(port: int, path: str) -> bytes:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=30) as resp:
            return resp.read()

    def counter(text: str, name: str) -> float:
        return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(name))

    with LoopbackServer(lambda n: prom(body(n))) as vllm, tempfile.NamedTemporaryFile("w", suffix=".yaml") as cfg, \
            tempfile.TemporaryFile() as logs:  # a file, not a pipe nobody drains: 600 polls of logs fill one
        cfg.write(f"targets: [{{url: '{vllm.url}'}}]\n{config}")
        cfg.flush()
        proc = subprocess.Popen([cli_path(), "serve", "--config.file", cfg.name, "--poll.interval", interval,
                                 "--web.listen-address", "127.0.0.1:0", "--log.format", "json"],
                                stdout=subprocess.DEVNULL, stderr=logs)
        try:
            port, deadline = None, time.monotonic() + 60
            while port is None and time.monotonic() < deadline:
                time.sleep(0.1)
                logs.seek(0)
                for line in logs.read().decode().splitlines():
                    record = _json.loads(line)
                    if record["event"] == "listening":
                        port = int(record["address"].rsplit(":", 1)[1])
            assert port, "serve did not start"
            deadline = time.monotonic() + polls * 2 + 120
            while vllm.requests < polls and time.monotonic() < deadline:
                time.sleep(0.5)
            metrics = get(port, "/metrics")
            with open(f"/proc/{proc.pid}/status") as f:
                rss = next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmRSS:"))
            text = metrics.decode()
            figures = {"polls": vllm.requests, "rss_bytes": rss, "metrics_bytes": len(metrics),
                       "forgotten": counter(text, "vllm_specdec_exporter_series_forgotten_total{"),
                       "engines": len(set(re.findall(r'engine="([^"]*)"', text))),
                       "series": sum(1 for line in text.splitlines() if line and not line.startswith("#"))}
            print(f"churn over {figures['polls']} polls: RSS {rss / 1e6:.1f} MB, /metrics {len(metrics):,} bytes "
                  f"({figures['series']} series, {figures['engines']} engines), {figures['forgotten']:.0f} engines forgotten")
            return figures
        finally:
            proc.terminate()
            proc.wait(30)


@pytest.mark.long
def test_churn_of_engine_labels_stays_bounded():
    """Short form (issue 10, item 3): a new engine label on every 100 ms poll, with a cap
    of 20 held engines: the oldest are forgotten, counted, memory and /metrics bounded."""
    cap = 20
    f = churn(70, "100ms", f"max_series_per_target: {cap}\n")
    assert f["forgotten"] >= f["polls"] - (cap + 10)  # one forgotten per poll once the cap is held
    assert 0 < f["engines"] <= cap  # what /metrics shows is what is held
    assert f["rss_bytes"] < 100 * 1024 * 1024
    assert f["metrics_bytes"] < 2 * 1024 * 1024


@pytest.mark.soak
@pytest.mark.timeout(1800)
def test_churn_of_engine_labels_for_ten_minutes_stays_under_100_mb():
    """`make soak`: a new engine label every 1 s poll for 10 minutes, default bounds."""
    f = churn(600, "1s")
    assert f["forgotten"] >= 600 - 512 - 10
    assert f["rss_bytes"] < 100 * 1024 * 1024
    assert f["metrics_bytes"] < 2 * 1024 * 1024


# ---- from test_bounded_warnings.py
# Issue 19 item 3: what the sidecar remembers of upstream warnings is bounded in bytes.
#
# Warnings embed label values (the parser's duplicate-series line, TRT-LLM's and SGLang's
# series warnings). A label that changes on every poll makes every warning new; before,
# each one was remembered whole (up to 1,000 of them), and the main process grew by
# megabytes per poll.


POLLS = 50
LABEL = 30_000  # characters of a label value that changes on every poll
BOUND = 256 * 1024  # bytes the remembered warnings may hold, whatever the upstream sends


def rss() -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmRSS:"))


def vllm_body(n: int) -> bytes:
    """A healthy engine, and 25 duplicated series whose label is new on every poll:
    the parser reports each duplicate with all of its labels."""
    lines = engine_lines(1000.0 * (n + 1), 0)
    for i in range(25):
        junk = f"{n}-{i}-" + "x" * LABEL
        line = f'vllm:spec_decode_num_drafts_total{{engine="0",junk="{junk}",model_name="m"}} 1'
        lines += [line, line]
    return payload(lines)


def trtllm_body(n: int) -> bytes:
    """A TRT-LLM engine, and series whose values are not counters, each with a long new label."""
    lines = [f'trtllm_spec_decode_drafted_tokens_total{{token_position="0"}} {1000 * (n + 1)}',
             f'trtllm_spec_decode_accepted_tokens_total{{token_position="0"}} {600 * (n + 1)}']
    for i in range(25):
        lines.append(f'trtllm_spec_decode_drafted_tokens_total{{junk="{n}-{i}-{"y" * LABEL}",token_position="0"}} -1')
    return payload(lines)


def held_bytes(poller) -> int:
    seen = poller._seen_warnings
    return sys.getsizeof(seen) + sum(sys.getsizeof(w) for w in seen)


def warning_churn(body) -> tuple[int, list[str], int, int]:
    async def go():
        n = {"i": 0}

        async def handle(request):
            n["i"] += 1
            return web.Response(body=body(n["i"]), content_type="text/plain")

        async with exporter(handle) as (app, _url, _session, clock):
            poller = app[POLLERS][0]
            results, before = [], rss()
            for _ in range(POLLS):
                clock.t += 5
                results.append(await poller.poll_once())
            return held_bytes(poller), results, before, rss()
    return asyncio.run(go())


def test_warnings_with_a_label_that_changes_every_poll_are_remembered_in_bounded_bytes():
    for name, body in (("vllm", vllm_body), ("trtllm", trtllm_body)):
        held, results, before, after = warning_churn(body)
        print(f"{name}: {POLLS} polls of label churn: warnings held {held:,} bytes; "
              f"RSS {before / 1e6:.1f} -> {after / 1e6:.1f} MB")
        assert results == ["success"] * POLLS, results
        assert held < BOUND, f"{name}: {held:,} bytes of warnings held after {POLLS} polls"


# ---- from test_max_k.py
# One maximum k (issue 12 item 4): config.MAX_K bounds k where profiles, scenarios and
# payloads are read; a target whose k is above the positions the generated rules cover is
# still read and exported, with one warning that the wasted-tokens alert cannot fire for it.




def k_lines(k: int, scale: int) -> list[str]:
    drafts, per_pos = 1000 * scale, [900 * scale // (i + 1) for i in range(k)]
    lab = 'engine="0",model_name="m"'
    return [f"{V1}drafts_total{{{lab}}} {drafts}", f"{V1}draft_tokens_total{{{lab}}} {k * drafts}",
            f"{V1}accepted_tokens_total{{{lab}}} {sum(per_pos)}",
            *(f'{V1}accepted_tokens_per_pos_total{{{lab},position="{i}"}} {v}' for i, v in enumerate(per_pos))]


@pytest.mark.parametrize(("k", "warned"), [(config.MAX_SPECULATIVE_TOKENS, False), (config.MAX_SPECULATIVE_TOKENS + 2, True)])
def test_a_k_beyond_the_rules_coverage_is_exported_with_one_warning(k, warned, capsys):
    async def go():
        n = {"i": 0}

        async def handle(request):
            n["i"] += 1
            return web.Response(body=payload(k_lines(k, n["i"])), content_type="text/plain")
        async with exporter(handle) as (app, url, session, clock):
            assert await poll_for(app, clock, 15) == ["success"] * 3
            m = await scrape(session, url)
            assert one(m, f"{P}_num_speculative_tokens") == k
    asyncio.run(go())
    out = capsys.readouterr().out
    assert out.count("wasted-tokens alert cannot fire") == (1 if warned else 0), out


@pytest.mark.parametrize("answer", [
    b"HTTP/1.1 200 OK\r\n" + b"".join(b"X-%d: y\r\n" % i for i in range(200_000)),  # headers that never end
    b"HTTP/1.1 200 OK\r\nContent-Length: 1000\r\n\r\nvllm:x 1\n",  # a body cut short
    b"",  # a hang-up before any answer
    # helper-28: aiohttp quotes the bytes it could not read: an 8 KB status line reached the log and the page.
    b"HTTP/1.1 " + b"<script>alert(1)</script>" * 320 + b"\r\n\r\n",
    b"HTTP/1.1 200 OK\r\n" + b"X" * 7000 + b" bad: y\r\n\r\n",  # an invalid header token
])
def test_an_answer_that_is_not_readable_http_is_the_targets_http_error_not_ours(answer):
    """Found attacking the sidecar: endless headers were counted result="error" (the category of the
    sidecar's own faults) with aiohttp's "400, Too many headers" (as if the target had answered 400)."""
    failed = asyncio.run(refused_fetch(answer, "pw123456789"))
    assert failed.kind == "http_error", failed
    assert "sent an answer that is not readable HTTP" in str(failed) and "pw123456789" not in str(failed)
    assert len(str(failed)) < 300 and "\n" not in str(failed), str(failed)[:500]


async def refused_fetch(answer: bytes, password: str):
    """The SourceError of fetching, as u:``password``, from a server that answers ``answer`` and hangs up."""
    from vllm_specdec_exporter.sources import SourceError, fetch_metrics

    async def answer_and_close(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(answer)
        with contextlib.suppress(ConnectionError):
            await writer.drain()
        writer.close()

    server = await asyncio.start_server(answer_and_close, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        async with aiohttp.ClientSession() as session:
            with pytest.raises(SourceError) as failed:
                await fetch_metrics(session, f"http://u:{password}@127.0.0.1:{port}/metrics", timeout=10)
    finally:
        server.close()
        await server.wait_closed()
    return failed.value


def test_a_password_echoed_in_an_unreadable_answer_is_scrubbed_before_it_is_cut():
    """helper-30: the quoted answer was cut to 120 characters before the URL's password was scrubbed,
    and scrub matches a secret's first 8+ characters: a password cut at the edge leaked its first 7."""
    secret = "Zq7xKw9mPassw0rd"
    for pad in range(60, 130, 3):
        message = str(asyncio.run(refused_fetch(b"HTTP/1.1 " + b"x" * pad + secret.encode() + b"\r\n\r\n", secret)))
        assert secret[:3] not in message, (pad, message)


def _engine_lines(labels: str, d: float, created: float | None = None) -> list[str]:
    """One k=2 engine at AL 2.5 in vLLM's text, its start time if given."""
    out = [f"vllm:spec_decode_num_{name}_total{{{labels}}} {v}"
           for name, v in (("drafts", d), ("draft_tokens", 2 * d), ("accepted_tokens", 1.5 * d))]
    out += [f"vllm:spec_decode_num_drafts_created{{{labels}}} {created}"] if created is not None else []
    return out + [f'vllm:spec_decode_num_accepted_tokens_per_pos_total{{{labels},position="{p}"}} {v}'
                  for p, v in ((0, 0.9 * d), (1, 0.6 * d))]


def _polled(payload_of, config: dict, polls: int, read) -> list:
    """``polls`` polls 5 s apart (a fake clock) of a loopback vLLM answering ``payload_of(n)``; what
    ``read(poller)`` says halfway and at the end."""
    from vllm_specdec_exporter.poller import TargetPoller

    async def go():
        clock = FakeClock()
        with LoopbackServer(payload_of) as vllm:
            settings = build_settings({"poll": {"interval": "5s"}, **config}, {"urls": [vllm.url]})
            async with aiohttp.ClientSession() as session:
                poller = TargetPoller(settings.targets[0], settings, session, mono=clock)
                seen = []
                for i in range(polls):
                    clock.t += 5
                    assert await poller.poll_once() == "success"
                    if i in (polls // 2 - 1, polls - 1):
                        seen.append(read(poller))
        return seen

    return asyncio.run(go())


def test_model_names_that_churn_at_every_poll_leave_nothing_growing():
    """helper-28: 40 model names never seen before at every poll. The engines held stay capped,
    but the diagnosis kept every name's k and position 0 (60,040 after 1,500 polls, 31 MB)."""

    fresh = itertools.count()

    def payload_of(n: int) -> bytes:
        out = []
        for m in (f"model-{next(fresh)}" for _ in range(40)):
            out += _engine_lines(f'engine="0",model_name="{m}"', 1000 * (n + 1))
        return prom(("\n".join(out) + "\n").encode())

    (k_then, _), (k_now, pos0_now) = _polled(payload_of, {}, 100, lambda p: (len(p.diagnosis._k), len(p.diagnosis._position0_healthy_at)))
    assert k_now <= k_then and pos0_now <= config.MAX_MODELS_PER_TARGET, (k_then, k_now, pos0_now)
    assert k_now <= config.DEFAULT_MAX_SERIES_PER_TARGET  # the models the windows hold, not the 4,000 names seen


def test_model_names_that_churn_with_restarts_leave_no_restart_growing():
    """helper-39: new names at every poll, and last poll's names again with a later _created (each
    engine a restart). The restarts a diagnosis reads were kept a day per name, held or not:
    307,200 of them after 600 polls, 155 MB, each poll 1 s. Now those of the models the windows hold."""

    def payload_of(n: int) -> bytes:
        out = []
        for gen, created, d in ((n, 1000.0, 5000), (n - 1, 2000.0, 10)):
            for j in range(16) if gen >= 0 else ():
                for e in range(4):
                    out += _engine_lines(f'engine="{e}",model_name="m{gen}-{j}"', d, created)
        return prom(("\n".join(out) + "\n").encode())

    def read(poller):
        return len({m for by_model in poller.diagnosis._changes.values() for m in by_model}), poller.view.counter_resets

    (then, resets_then), (now, resets_now) = _polled(payload_of, {"max_series_per_target": 256}, 120, read)
    assert resets_now > resets_then >= 59 * 64  # the restarts were seen
    # 16 names of 4 engines each a poll, 256 series held: at most 64 models (1,920 names by poll 120 before)
    assert 0 < now <= 256 // 4 and now <= then, (then, now)
