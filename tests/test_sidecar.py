"""The real exporter app against the real simulator over loopback (fake clock)."""

from __future__ import annotations

import asyncio
import json

import pytest
from sidecar_harness import T0, Sidecar, dump, harness, one, run, scrape, values

P = "vllm_specdec"
HEALTHY = (0.924, 0.687)
BROKEN = (0.0357, 0.0008)
MODEL = "deepseek-ai/DeepSeek-V4-Pro"


def expected_al(survival) -> float:
    return 1 + sum(survival)


def health_state(m: dict, model: str = MODEL) -> str:
    states = [s.labels[f"{P}_health"] for s in m[f"{P}_health"] if s.labels["model_name"] == model and s.value == 1.0]
    assert len(states) == 1, states  # exactly one state set
    assert len(values(m, f"{P}_health", model_name=model)) == 5
    return states[0]


def test_healthy_windows_match_the_injected_acceptance():
    async def go():
        async with harness("healthy") as h:
            await h.run_for(120)
            m = await h.metrics()
            for window in ("1m", "5m"):
                al = one(m, f"{P}_mean_acceptance_length", window=window)
                assert al == pytest.approx(expected_al(HEALTHY), rel=0.01)
                assert one(m, f"{P}_acceptance_ratio", window=window) == pytest.approx(sum(HEALTHY) / 2, rel=0.01)
                for pos, s in enumerate(HEALTHY):
                    assert one(m, f"{P}_position_acceptance_ratio", window=window, position=str(pos)) == pytest.approx(s, rel=0.01)
                cond = one(m, f"{P}_position_conditional_acceptance_ratio", window=window, position="1")
                assert cond == pytest.approx(HEALTHY[1] / HEALTHY[0], rel=0.01)
                assert one(m, f"{P}_effective_draft_length", window=window) == pytest.approx(2.0)
            # 8 engines x 40 drafts/s over 60 s
            assert one(m, f"{P}_window_drafts", window="1m") == pytest.approx(8 * 40 * 60, rel=0.02)
            assert one(m, f"{P}_num_speculative_tokens") == 2
            assert one(m, f"{P}_baseline_mean_acceptance_length") == 2.27
            assert health_state(m) == "ok"
            assert len(values(m, f"{P}_engine_mean_acceptance_length", window="1m")) == 8
            # Normalised counters equal the simulator's own counters.
            sim_engine0 = h.simulations[0].engines[0].counters()
            assert one(m, f"{P}_drafts_total", engine="0") == sim_engine0[0]
            assert one(m, f"{P}_accepted_tokens_total", engine="0") == sim_engine0[2]
            assert one(m, f"{P}_position_accepted_tokens_total", engine="0", position="1") == sim_engine0[3][1]
            assert one(m, f"{P}_up", target="vllm") == 1
            assert one(m, f"{P}_exporter_polls_total", result="success") == 25
    run(go())


@pytest.mark.long
def test_collapse_is_seen_in_the_short_window_first():
    async def go():
        async with harness("collapse") as h:
            await h.run_for(120)
            assert health_state(await h.metrics()) == "ok"
            await h.run_for(65)
            m = await h.metrics()
            assert one(m, f"{P}_mean_acceptance_length", window="1m") == pytest.approx(expected_al(BROKEN), rel=0.01)
            assert one(m, f"{P}_acceptance_ratio", window="1m") == pytest.approx(sum(BROKEN) / 2, rel=0.02)
            # The 5m window still mixes in healthy traffic: between the two.
            assert expected_al(BROKEN) < one(m, f"{P}_mean_acceptance_length", window="5m") < expected_al(HEALTHY)
            await h.run_for(240)
            assert health_state(await h.metrics()) == "collapsed"
    run(go())


def test_collapse_is_detected_without_a_baseline_profile():
    async def go():
        async with harness("collapse", {"baselines": {"include_defaults": False}, "health": {"window": "1m"}}) as h:
            await h.run_for(120)
            m = await h.metrics()
            assert health_state(m) == "unknown"
            assert not values(m, f"{P}_baseline_mean_acceptance_length")
            await h.run_for(65)
            assert health_state(await h.metrics()) == "collapsed"
    run(go())


def engine_states(m: dict, model: str = MODEL) -> dict[str, str]:
    return {s.labels["engine"]: s.labels[f"{P}_engine_health"] for s in m.get(f"{P}_engine_health", [])
            if s.labels["model_name"] == model and s.value == 1.0}


def test_a_dead_rank_is_named_by_health_and_marked_on_the_landing_page():
    """DP=8, engine 5 at the broken-head figures, seven healthy: the model's AL is 2.41,
    yet its health is not ok and the broken engine is named everywhere."""
    async def go():
        async with harness("bad-engine") as h:
            await h.run_for(60)
            m = await h.metrics()
            assert health_state(m) == "ok" and set(engine_states(m).values()) == {"ok"}
            await h.run_for(300)
            m = await h.metrics()
            assert one(m, f"{P}_mean_acceptance_length", window="5m") > 2.3  # hidden behind its siblings
            assert health_state(m) == "degraded"
            states = engine_states(m)
            assert states.pop("5") == "collapsed" and set(states.values()) == {"ok"} and len(states) == 7
            status, page = await h.get("/")
            assert status == 200
            assert "engine 5 collapsed" in page  # the reason names it
            row = page[page.index("<tr class=health-collapsed><td>5</td>"):]
            assert "&#9888;" in row[:row.index("</tr>")]
            assert page.count("<tr class=health-ok>") == 7
    run(go())


def test_counters_that_break_vllm_invariants_are_never_ok():
    from vllm_specdec_exporter import config
    from vllm_specdec_exporter.health import judge
    from vllm_specdec_exporter.model import Counters

    sane = Counters(3000, 6000, 4833, (2772, 2061))
    bad = Counters(3000, 6000, 7000, (3000, 4000))  # accepted > draft tokens, position 1 > position 0
    assert judge({"0": sane}, 300, None, config.DETECTION, 100).state == "unknown"  # no profile, nothing wrong
    verdict = judge({"0": sane, "1": bad}, 300, None, config.DETECTION, 100)
    assert verdict.state == "unknown" and "invariant" in verdict.reason
    assert verdict.engines == {"0": "ok", "1": "unknown"}


def test_the_metric_contract():
    """_ratio names, health as an OpenMetrics StateSet, canonical window labels,
    process_/python_ series and build_info with a revision."""
    async def go():
        async with harness("healthy", {"windows": ["60s", "300s"], "health": {"window": "300s"}}) as h:
            await h.run_for(60)
            m = await h.metrics()
            assert {s.labels["window"] for s in m[f"{P}_window_drafts"]} == {"1m", "5m"}
            assert one(m, f"{P}_acceptance_ratio", window="1m") > 0.7 and f"{P}_acceptance_rate" not in m
            assert {s.labels[f"{P}_health"] for s in m[f"{P}_health"]} == {"ok", "degraded", "collapsed", "idle",
                                                                           "unknown"}
            assert len(values(m, f"{P}_engine_health")) == 8 * 5
            (info,) = m[f"{P}_exporter_build_info"]
            assert info.labels["revision"] and info.labels["version"]
            assert values(m, "process_resident_memory_bytes") and values(m, "python_info")
            async with h.session.get(h.exporter_url + "/metrics",
                                     headers={"Accept": "application/openmetrics-text; version=1.0.0"}) as resp:
                om = await resp.text()
            assert f"# TYPE {P}_health stateset" in om and f"# TYPE {P}_engine_health stateset" in om
    run(go())


def test_degraded_against_a_user_profile():
    profile = {"name": "strict", "model": "V4-Pro", "k": 2, "mean_acceptance_length": 3.0}
    async def go():
        config = {"baselines": {"profiles": [profile]}, "health": {"degraded_fraction": 0.9}}
        async with harness("healthy", config) as h:
            await h.run_for(60)
            m = await h.metrics()
            # user profiles come first: expected gain 2.0, observed 1.611 < 0.9 * 2.0
            assert one(m, f"{P}_baseline_mean_acceptance_length", profile="strict") == 3.0
            assert health_state(m) == "degraded"
    run(go())


def test_restart_mid_window_gives_no_negative_or_inflated_rate():
    async def go():
        async with harness("restart") as h:
            for _ in range(36):  # 180 s across the restart at 90 s
                await h.run_for(5)
                m = await h.metrics()
                for window in ("1m", "5m"):
                    al = values(m, f"{P}_mean_acceptance_length", window=window)
                    rate = values(m, f"{P}_acceptance_ratio", window=window)
                    drafts = one(m, f"{P}_window_drafts", window=window)
                    assert drafts >= 0
                    # exported whenever the window holds drafts (not skipped across the restart)
                    assert len(al) == len(rate) == (drafts > 0), (h.clock.t, window, drafts, al, rate)
                    assert all(v == pytest.approx(1 + 0.85 + 0.62, rel=0.01) for v in al), (h.clock.t, al)
                    assert all(0 <= v <= 1 for v in rate)
            m = await h.metrics()
            assert one(m, f"{P}_exporter_engine_restarts_total") == 2  # both engines
            # 2 engines x 50 drafts/s: nothing double-counted. Only the 5 s between the
            # last poll before the restart and the restart itself are lost, as they
            # are for Prometheus: vLLM took them with it.
            assert one(m, f"{P}_window_drafts", window="1m") == 2 * 50 * 60
            assert one(m, f"{P}_window_drafts", window="5m") == 2 * 50 * (180 - 5)
    run(go())


def test_target_down_goes_up_0_at_once_and_gauges_vanish_after_staleness():
    async def go():
        async with harness("healthy", {"staleness": "60s"}) as h:
            await h.run_for(60)
            await h.stop_simulator()
            await h.run_for(5)
            m = await h.metrics()
            assert one(m, f"{P}_up") == 0
            assert one(m, f"{P}_exporter_polls_total", result="connect_error") == 1
            assert values(m, f"{P}_mean_acceptance_length")  # within the staleness timeout
            await h.run_for(60)
            m = await h.metrics()
            assert one(m, f"{P}_up") == 0
            for family in ("mean_acceptance_length", "acceptance_ratio", "position_acceptance_ratio", "health",
                           "window_drafts", "drafts_total", "engine_mean_acceptance_length"):
                assert not values(m, f"{P}_{family}"), family
            assert one(m, f"{P}_exporter_last_success_timestamp_seconds") > 0
            for path in ("/healthz", "/readyz"):
                assert (await h.get(path))[0] == 200  # probes never depend on vLLM
    run(go())


def test_idle_window_shows_no_ratio_gauges():
    async def go():
        async with harness("idle", {"health": {"window": "1m"}}) as h:
            await h.run_for(60)
            assert values(await h.metrics(), f"{P}_mean_acceptance_length", window="1m")
            await h.run_for(130)
            m = await h.metrics()
            assert not values(m, f"{P}_mean_acceptance_length", window="1m")
            assert not values(m, f"{P}_acceptance_ratio", window="1m")
            assert one(m, f"{P}_window_drafts", window="1m") == 0
            assert health_state(m) == "idle"
            # the 5m window still holds the traffic of the first minute
            assert values(m, f"{P}_mean_acceptance_length", window="5m")
    run(go())


def test_one_bad_engine_stands_out():
    async def go():
        async with harness("bad-engine") as h:
            await h.run_for(130)
            m = await h.metrics()
            per_engine = {s.labels["engine"]: s.value for s in m[f"{P}_engine_mean_acceptance_length"]
                          if s.labels["window"] == "1m"}
            assert per_engine["5"] == pytest.approx(expected_al(BROKEN), rel=0.01)
            assert all(v == pytest.approx(expected_al(HEALTHY), rel=0.01) for e, v in per_engine.items() if e != "5")
            # the aggregate is the sum of counters: 7 healthy + 1 broken engine
            want = 1 + (7 * sum(HEALTHY) + sum(BROKEN)) / 8
            assert one(m, f"{P}_mean_acceptance_length", window="1m") == pytest.approx(want, rel=0.01)
    run(go())


def test_concurrent_scrapes_agree():
    async def go():
        async with harness("healthy") as h:
            await h.run_for(30)
            bodies = await asyncio.gather(*(h.get("/metrics") for _ in range(50)))
            assert {b for _, b in bodies} == {bodies[0][1]}
            assert all(status == 200 for status, _ in bodies)
    run(go())


def test_summary_api_and_landing_page():
    async def go():
        async with harness("healthy") as h:
            await h.run_for(60)
            status, text = await h.get("/api/v1/summary?window=1m")
            assert status == 200
            out = json.loads(text)
            assert set(out) == {"models", "interval_seconds", "warnings"}
            s = out["models"][MODEL]["all"]
            assert s["mean_acceptance_length"] == pytest.approx(expected_al(HEALTHY), rel=0.01)
            assert len(out["models"][MODEL]["engines"]) == 8
            assert out["interval_seconds"] == pytest.approx(60, abs=5)
            status, text = await h.get("/api/v1/summary?window=7m")
            assert status == 400 and "valid: 1m, 5m, 15m, 1h" in text
            status, page = await h.get("/")
            assert status == 200
            for needle in (MODEL, "health: <b>ok</b>", "position 1", "/metrics", "2.27"):
                assert needle in page
    run(go())


def test_two_targets_multiprocess_and_single_process():
    async def go():
        async with harness(["healthy", "demo"]) as h:
            await h.run_for(30)
            m = await h.metrics()
            assert sorted(values(m, f"{P}_up")) == [1, 1]
            assert {s.labels["target"] for s in m[f"{P}_drafts_total"]} == {"t0", "t1"}
            _, text = await h.get("/api/v1/summary?window=1m")
            engines = json.loads(text)["models"][MODEL]["engines"]

            assert "t0/0" in engines and "t1/7" in engines  # replicas kept apart
    run(go())


def test_backoff_grows_with_jitter_and_is_capped():
    async def go():
        async with harness("healthy", {"poll": {"interval": "2s", "max_backoff": "30s"}}) as h:
            poller = h.pollers[0]
            assert poller.next_delay() == 2
            await h.stop_simulator()
            delays = []
            for _ in range(8):
                await poller.poll_once()
                delays.append([poller.next_delay() for _ in range(50)])
            assert all(2 <= d <= 30 for ds in delays for d in ds)
            assert max(delays[0]) <= 4 and min(delays[-1]) >= 15  # grows to the cap
            assert len(set(delays[-1])) > 1  # jittered
    run(go())


def test_summary_api_carries_the_cost_gauges():
    """/api/v1/summary's "cost" per model is the sidecar's cost gauges over the same window.
    Three targets, k=2, polled every 5 s (their counters carry _created):
    - V4-Pro (profile AL 2.27) at 50 drafts/s, position 0 in 4 % of drafts and 1 in 0.4 %: 10 + 1
      accepted of every 250 drafts, AL 1.044; 2.27 / 1.044 = 2.17433x the decode steps,
      1 - 1.044 / 2.27 = 54.0088 % wasted, 50 drafts/s x 2.27 = 113.5 healthy tokens/s, under the
      break-even 1 + 0.05 x 2 = 1.1;
    - my-model (no profile) at 50 drafts/s, AL 1 + 0.5 + 0.2 = 1.7: no healthy AL, so no factor,
      share or tokens/s (null, as the gauges are absent), above the break-even;
    - slow-model at 1 draft/s: 60 drafts in 1m, under min_drafts (100): no figure at all but the
      break-even (below_break_even null)."""
    serves = {
        "pro": lambda t: dump(MODEL, 50 * (t - T0), (0.04, 0.004), T0),
        "mine": lambda t: dump("my-model", 50 * (t - T0), (0.5, 0.2), T0),
        "slow": lambda t: dump("slow-model", 1 * (t - T0), (0.5, 0.2), T0),
    }

    async def go():
        async with Sidecar(serves, T0 + 10) as s:
            await s.poll_until(T0 + 3700)  # every window (up to 1h) full
            async with s.session.get(f"{s.url}/api/v1/summary?window=1m") as r:
                models = (await r.json())["models"]
            assert models[MODEL]["cost"] == {
                "healthy_mean_acceptance_length": 2.27,
                "decode_step_factor_ratio": pytest.approx(2.17433, abs=5e-6),
                "decode_steps_wasted_ratio": pytest.approx(0.540088, abs=5e-7),
                "healthy_output_tokens_per_second": pytest.approx(113.5),
                "break_even_mean_acceptance_length": pytest.approx(1.1),
                "below_break_even": True,
            }
            assert models["my-model"]["cost"] == {
                "healthy_mean_acceptance_length": None, "decode_step_factor_ratio": None,
                "decode_steps_wasted_ratio": None, "healthy_output_tokens_per_second": None,
                "break_even_mean_acceptance_length": pytest.approx(1.1), "below_break_even": False,
            }
            assert models["slow-model"]["cost"] == {
                "healthy_mean_acceptance_length": None, "decode_step_factor_ratio": None,
                "decode_steps_wasted_ratio": None, "healthy_output_tokens_per_second": None,
                "break_even_mean_acceptance_length": pytest.approx(1.1), "below_break_even": None,
            }
            # Each model's profile, as report --format json has it (helper-42: the summary had none).
            assert models[MODEL]["profile"] == {"name": "deepseek-v4-pro-mtp-k2", "mean_acceptance_length": 2.27}
            assert models["my-model"]["profile"] is None
            # The same figures as the gauges, window by window; null where a gauge is absent.
            m = await scrape(s.session, s.url)
            gauges = ("decode_step_factor_ratio", "decode_steps_wasted_ratio", "healthy_output_tokens_per_second")
            for window in ("1m", "5m", "15m", "1h"):
                async with s.session.get(f"{s.url}/api/v1/summary?window={window}") as r:
                    models = (await r.json())["models"]
                assert set(models) == {MODEL, "my-model", "slow-model"}
                for model, entry in models.items():
                    for name in gauges:
                        found = values(m, f"{P}_{name}", model_name=model, window=window)
                        assert entry["cost"][name] == (found[0] if found else None), (window, model, name)
                    assert [entry["cost"]["break_even_mean_acceptance_length"]] == values(
                        m, f"{P}_break_even_mean_acceptance_length", model_name=model)
                assert models[MODEL]["cost"]["decode_step_factor_ratio"] is not None, window
                assert models["slow-model"]["cost"]["below_break_even"] is (None if window == "1m" else False), window

    run(go())


def test_an_engine_gone_from_the_payload_has_no_figures_or_health_of_its_own():
    """Found attacking the sidecar: DP engine 1 left the payload, engine 0 went on; 63 s later
    engine 1 still read health ok on /metrics and in the summary, for the health window's length.
    Now its figures go with its counters, as a model's do; the model's sums keep what it drafted."""
    def serve(t: float) -> bytes:
        drafts = 1000 + 100 * (t - T0)
        return dump("m", drafts, (0.9, 0.7), T0, engines=2 if t < T0 + 60 else 1)

    async def go():
        async with Sidecar(serve, T0) as s:
            await s.poll_until(T0 + 60)
            m = await scrape(s.session, s.url)
            assert {x.labels["engine"] for x in m[f"{P}_engine_health"]} == {"0", "1"}
            before = one(m, f"{P}_window_drafts", window="5m")
            await s.poll_until(T0 + 70)
            m = await scrape(s.session, s.url)
            assert {x.labels["engine"] for x in m[f"{P}_engine_health"]} == {"0"}
            assert {x.labels["engine"] for x in m.get(f"{P}_engine_mean_acceptance_length", [])} <= {"0"}
            assert one(m, f"{P}_window_drafts", window="5m") > before  # engine 1's drafts still in the model's window
            summary = await s.summary("5m")
            assert set(summary["engines"]) == {"0"}
            # ... and so do the summary's: it summed the engines still there (helper-42: 8,500 against 14,000)
            assert summary["all"]["num_drafts"] == one(m, f"{P}_window_drafts", window="5m")
            assert summary["all"]["mean_acceptance_length"] == pytest.approx(one(m, f"{P}_mean_acceptance_length", window="5m"))
    run(go())


def test_targets_whose_windows_span_different_times_give_the_summary_no_rates():
    """helper-42: b answered only from 240 s on; the summary divided b's and the model's drafts by a's
    300 s (b/0 30 drafts/s for 100, the model 130 for 200). No per-second figure, and a warning saying so."""
    from aiohttp import web

    def serve(late: bool):
        def at(t: float) -> bytes:
            if late and t < T0 + 240:
                raise web.HTTPServiceUnavailable()
            return dump("m", 1000 + 100 * (t - T0), (0.9, 0.7), T0)
        return at

    async def go():
        async with Sidecar({"a": serve(False), "b": serve(True)}, T0) as s:
            await s.poll_until(T0 + 335)
            m = await scrape(s.session, s.url)
            spans = {x.labels["target"]: x.value for x in m[f"{P}_window_span_seconds"] if x.labels["window"] == "5m"}
            async with s.session.get(f"{s.url}/api/v1/summary?window=5m") as r:
                return spans, await r.json()

    spans, summary = run(go())
    assert spans["a"] >= 300 and spans["b"] <= 100, spans
    entry = summary["models"]["m"]
    assert summary["interval_seconds"] is None and entry["all"]["num_drafts"] > 0
    assert entry["all"]["drafts_per_second"] is None and entry["engines"]["b/0"]["drafts_per_second"] is None
    assert any("span different times (a 3" in w and ", b " in w for w in summary["warnings"]), summary["warnings"]


def test_the_summary_is_built_once_per_state_not_per_request(monkeypatch):
    """Found attacking the sidecar: /api/v1/summary was rebuilt for every request (100 clients slowed
    /healthz to 200 ms). Now once per state per window, as /metrics is; a poll makes a new one."""
    from vllm_specdec_exporter import web as exporter_web

    built = []
    real = exporter_web.summary_for
    monkeypatch.setattr(exporter_web, "summary_for", lambda app, window, views: built.append(window) or real(app, window, views))

    def serve(t: float) -> bytes:
        return dump("m", 1000 + 100 * (t - T0), (0.9, 0.7), T0)

    async def go():
        async with Sidecar(serve, T0) as s:
            await s.poll_until(T0 + 30)
            first = [await s.summary("5m") for _ in range(5)]
            assert built == ["5m"] and all(x == first[0] for x in first)
            await s.summary("1m")
            assert built == ["5m", "1m"]
            await s.poll_until(T0 + 40)
            after = await s.summary("5m")
            assert built == ["5m", "1m", "5m"] and after["all"]["num_drafts"] > first[0]["all"]["num_drafts"]
    run(go())


def test_the_landing_page_is_built_once_per_state_not_per_request(monkeypatch):
    """Found attacking the sidecar (stop 44, left then): the landing page was rebuilt for every
    request (a flood held /healthz at p99 103 ms). Now once per state, as the summary; a poll makes a new one."""
    from vllm_specdec_exporter import web as exporter_web

    built = []
    real = exporter_web.landing_page
    monkeypatch.setattr(exporter_web, "landing_page", lambda *a: built.append(1) or real(*a))

    def serve(t: float) -> bytes:
        return dump("m", 1000 + 100 * (t - T0), (0.9, 0.7), T0)

    async def go():
        async with Sidecar(serve, T0) as s:
            await s.poll_until(T0 + 30)
            first = [await s.page() for _ in range(5)]
            assert len(built) == 1 and all(x == first[0] for x in first)
            await s.poll_until(T0 + 40)
            after = await s.page()
            assert len(built) == 2 and after != first[0]
    run(go())


def test_the_summary_names_each_engines_state_when_two_targets_serve_one_model_each():
    """helper-45: at the health window a model on one target takes its poller's verdict, whose engines
    are keyed "0", "1"; with two targets the summary keys them "a/0", "a/1", so health.engines was {}."""

    def serve(model: str, broken: bool):
        def at(t: float) -> bytes:  # two engines; engine 1 of a broken one accepts next to nothing
            d, second = 1000 + 100 * (t - T0), (0.01, 0.0) if broken else (0.9, 0.7)
            return dump(model, d, (0.9, 0.7), T0) + dump(model, d, second, T0).replace(b'engine="0"', b'engine="1"')
        return at

    async def go():
        async with Sidecar({"a": serve("m", False), "b": serve("n", True)}, T0) as s:
            await s.poll_until(T0 + 335)
            async with s.session.get(f"{s.url}/api/v1/summary") as r:  # the health window
                return await r.json()

    models = run(go())["models"]
    assert models["m"]["health"]["engines"] == {"a/0": "ok", "a/1": "ok"}
    assert models["n"]["health"]["engines"] == {"b/0": "ok", "b/1": "collapsed"}, models["n"]["health"]
