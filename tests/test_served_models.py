"""Issue 30 item 1: the sidecar asks vLLM who it is. A served name no profile matches
(`--served-model-name dsv4`) finds its profile through /v1/models' `root` (the --model
argument), then through baselines.aliases; which matched is exported (model_info), and a
model with no healthy reference is said once. /v1/models is read from the same base URL,
bounded in size and time; its failures never stop polling. A real aiohttp stand-in for
vLLM on loopback (only the clock is faked)."""

from __future__ import annotations

import asyncio
import contextlib
import json

import aiohttp
import pytest
from aiohttp import web
from sidecar_harness import FakeClock, start
from structlog.testing import capture_logs
from vllm_specdec_exporter import config
from vllm_specdec_exporter.baselines import find_profile
from vllm_specdec_exporter.parser import parse
from vllm_specdec_exporter.poller import SERVED_MODELS_MIN_SECONDS
from vllm_specdec_exporter.settings import build_settings
from vllm_specdec_exporter.sources import models_url, read_served_models
from vllm_specdec_exporter.web import POLLERS, create_app

V1 = "vllm:spec_decode_num_"
# What vLLM's OpenAI server answers (vllm/entrypoints/openai/protocol.py, ModelCard).
VLLM_MODELS = {"object": "list", "data": [{
    "id": "dsv4", "object": "model", "created": 1764763200, "owned_by": "vllm",
    "root": "/mnt/weights/deepseek-ai/DeepSeek-V4-Pro-W4A16", "parent": None, "max_model_len": 65536,
    "permission": [{"id": "modelperm-1", "object": "model_permission", "allow_view": True}]}]}


def metrics_body(t: float, model: str = "dsv4") -> bytes:
    d = int(1000 * t)  # AL 2.4 at k=2: healthy against the V4-Pro k=2 profile (2.27)
    lab = f'engine="0",model_name="{model}"'
    return (f"{V1}drafts_total{{{lab}}} {d}\n{V1}draft_tokens_total{{{lab}}} {2 * d}\n"
            f"{V1}accepted_tokens_total{{{lab}}} {int(1.4 * d)}\n"
            f'{V1}accepted_tokens_per_pos_total{{{lab},position="0"}} {int(0.8 * d)}\n'
            f'{V1}accepted_tokens_per_pos_total{{{lab},position="1"}} {int(0.6 * d)}\n').encode()


@contextlib.asynccontextmanager
async def stand_in(models_handler, config_: dict | None = None, path: str = "/metrics", flags: dict | None = None):
    clock = FakeClock()
    calls = {"models": 0}

    async def metrics(request):
        return web.Response(body=metrics_body(clock.t), content_type="text/plain")

    async def models(request):
        calls["models"] += 1
        return await models_handler(request)

    app = web.Application()
    app.router.add_get(path, metrics)
    app.router.add_get(path.rsplit("/", 1)[0] + "/v1/models", models)
    runner, url = await start(app)
    settings = build_settings({"poll": {"interval": "5s", "timeout": "1s"}, **(config_ or {})},
                              {"urls": [f"{url}{path}"], "listen_address": "127.0.0.1:0", **(flags or {})})
    exp = create_app(settings, mono=clock, start_polling=False)
    exp_runner, exp_url = await start(exp)
    try:
        async with aiohttp.ClientSession() as session:
            yield exp[POLLERS][0], exp_url, session, clock, calls
    finally:
        await exp_runner.cleanup()
        await runner.cleanup()


async def info(session, url: str) -> list[dict]:
    async with session.get(url + "/metrics") as resp:
        return [s.labels for s in parse(await resp.text()).samples.get("vllm_specdec_model_info", [])]


async def answer_vllm(request):
    return web.json_response(VLLM_MODELS)


def test_a_served_name_no_profile_matches_finds_its_profile_through_the_root():
    async def go():
        async with stand_in(answer_vllm) as (poller, url, session, clock, calls):
            for _ in range(3):
                clock.t += 5
                assert await poller.poll_once() == "success"
            assert await info(session, url) == [{
                "target": "vllm", "model_name": "dsv4", "root": "/mnt/weights/deepseek-ai/DeepSeek-V4-Pro-W4A16",
                "profile": "deepseek-v4-pro-mtp-k2", "profile_matched_by": "root"}]
            assert poller.view.models[0].health == "ok"
            assert calls["models"] == 1  # read once, not on every poll
            clock.t += config.SERVED_MODELS_REFRESH_SECONDS
            await poller.poll_once()
            assert calls["models"] == 2  # and again at the slow interval
    asyncio.run(go())


def test_the_models_path_sits_beside_a_metrics_path_under_a_prefix():
    async def go():
        async with stand_in(answer_vllm, path="/vllm/metrics") as (poller, url, session, clock, calls):
            clock.t += 5
            await poller.poll_once()
            assert calls["models"] == 1 and (await info(session, url))[0]["profile_matched_by"] == "root"
    asyncio.run(go())


@pytest.mark.parametrize("case", ["404", "not json", "huge", "slow", "wrong shape", "deep"])
def test_a_failing_models_endpoint_never_stops_polling_and_is_counted_once_per_read(case):
    async def models(request):
        if case == "404":
            raise web.HTTPNotFound()
        if case == "slow":
            await asyncio.sleep(3)  # over the 1 s poll timeout
        body = {"not json": b"<html>", "huge": b"[" + b"1," * config.MAX_SERVED_MODELS_BYTES + b"1]",
                "wrong shape": b'{"data": {"id": 1}}', "deep": b"[" * 100_000, "slow": b"{}"}[case]
        return web.Response(body=body, content_type="application/json")

    async def go():
        async with stand_in(models) as (poller, url, session, clock, calls):
            with capture_logs() as logs:
                for _ in range(3):
                    clock.t += 5
                    assert await poller.poll_once() == "success"
            assert [i["profile_matched_by"] for i in await info(session, url)] == ["none"]
            assert poller.view.served_models_failures == 1 and calls["models"] == 1
            unread = [entry for entry in logs if entry["event"] == "served_models_unread"]
            assert len(unread) == 1 and "/v1/models" in unread[0]["warning"]
            said = [entry for entry in logs if entry["event"] == "no_baseline"]
            assert len(said) == 1 and "no healthy reference for dsv4 at k=2" in said[0]["warning"]
            async with session.get(url + "/metrics") as resp:
                text = await resp.text()
            assert 'vllm_specdec_exporter_served_models_failures_total{target="vllm"} 1.0' in text
    asyncio.run(go())


def test_the_operators_mapping_is_tried_after_the_root():
    async def models(request):
        return web.json_response({"data": [{"id": "dsv4", "root": "/weights/x"}]})

    async def go():
        async with stand_in(models,
                            {"baselines": {"aliases": {"dsv4": "deepseek-ai/DeepSeek-V4-Flash"}}}) as (
                poller, url, session, clock, _):
            clock.t += 5
            await poller.poll_once()
            [got] = await info(session, url)
            assert (got["root"], got["profile"], got["profile_matched_by"]) == (
                "/weights/x", "deepseek-v4-flash-mtp-k2", "alias")
    asyncio.run(go())


async def not_found(request):
    raise web.HTTPNotFound()


async def no_root(request):
    return web.json_response({"data": [{"id": "dsv4"}]})  # an older server: the id alone


# Issue 30 item 2: the deployment's own --model and k (the Helm chart passes them), and a profile named outright.

@pytest.mark.parametrize("models", [not_found, no_root], ids=["no /v1/models", "no root"])
def test_the_targets_model_is_the_root_where_v1_models_names_none(models):
    async def go():
        async with stand_in(models, flags={"vllm_model": "deepseek-ai/DeepSeek-V4-Pro", "vllm_k": "2"}) as (
                poller, url, session, clock, _):
            with capture_logs() as logs:
                for _ in range(3):
                    clock.t += 5
                    assert await poller.poll_once() == "success"
            assert await info(session, url) == [{
                "target": "vllm", "model_name": "dsv4", "root": "deepseek-ai/DeepSeek-V4-Pro",
                "profile": "deepseek-v4-pro-mtp-k2", "profile_matched_by": "root"}]
            assert poller.view.models[0].health == "ok"
            assert not [e for e in logs if e["event"] == "no_baseline"]
    asyncio.run(go())


def test_v1_models_root_wins_over_the_targets_model():
    async def go():
        async with stand_in(answer_vllm, flags={"vllm_model": "deepseek-ai/DeepSeek-V4-Flash"}) as (
                poller, url, session, clock, _):
            clock.t += 5
            await poller.poll_once()
            [got] = await info(session, url)
            assert (got["root"], got["profile"]) == ("/mnt/weights/deepseek-ai/DeepSeek-V4-Pro-W4A16", "deepseek-v4-pro-mtp-k2")
    asyncio.run(go())


def test_a_profile_named_by_the_target_comes_first():
    """The served name and the root both match V4-Pro; the target names the V4-Flash profile: it wins."""
    async def go():
        async with stand_in(answer_vllm, flags={"vllm_profile": "deepseek-v4-flash-mtp-k2"}) as (
                poller, url, session, clock, _):
            clock.t += 5
            await poller.poll_once()
            [got] = await info(session, url)
            assert (got["profile"], got["profile_matched_by"]) == ("deepseek-v4-flash-mtp-k2", "config")
            assert poller.view.models[0].profile.mean_acceptance_length == 1.99
    asyncio.run(go())


def test_a_named_profile_for_another_k_applies_to_none_and_the_log_says_why_once():
    async def go():
        # The counters say k=2; the target names the k=3 profile (no k declared, so settings could not refuse it).
        async with stand_in(answer_vllm, flags={"vllm_profile": "deepseek-v4-pro-mtp-k3"}) as (
                poller, url, session, clock, _):
            with capture_logs() as logs:
                for _ in range(3):
                    clock.t += 5
                    await poller.poll_once()
            [got] = await info(session, url)
            assert (got["profile"], got["profile_matched_by"]) == ("", "none")  # no fallback to the root's V4-Pro k=2
            said = [e["warning"] for e in logs if e["event"] == "no_baseline"]
            assert said == ["no healthy reference for dsv4 at k=2: the target's profile deepseek-v4-pro-mtp-k3 is for "
                            "k=3 and applies at that k only; name the one for k=2, or leave the profile out to match "
                            "one by model"]
    asyncio.run(go())


def test_find_profile_a_named_profile_first_and_alone():
    from vllm_specdec_exporter.settings import default_profiles

    profiles = default_profiles()
    pro = "deepseek-ai/DeepSeek-V4-Pro"
    assert find_profile(profiles, {}, pro, pro, 2, None, "deepseek-v4-flash-mtp-k2")[1] == "config"
    assert find_profile(profiles, {}, pro, pro, 3, None, "deepseek-v4-flash-mtp-k2") == (None, "none")
    assert find_profile(profiles, {}, pro, pro, 2, "eagle3", "deepseek-v4-flash-mtp-k2") == (None, "none")
    assert find_profile(profiles, {}, "x", pro, 2, None)[1] == "root"


def test_find_profile_order_served_name_root_alias():
    from vllm_specdec_exporter.settings import default_profiles

    profiles = default_profiles()
    flash = "deepseek-ai/DeepSeek-V4-Flash"
    assert find_profile(profiles, {}, "deepseek-ai/DeepSeek-V4-Pro", flash, 2, None)[1] == "served_name"
    assert find_profile(profiles, {"x": flash}, "x", "/w/DeepSeek-V4-Pro", 2, None)[0].name == "deepseek-v4-pro-mtp-k2"
    assert find_profile(profiles, {"x": flash}, "x", "/w/other", 2, None)[1] == "alias"
    assert find_profile(profiles, {}, "x", None, 2, None) == (None, "none")


def test_read_served_models_shapes_and_bounds():
    assert read_served_models(json.dumps(VLLM_MODELS).encode()) == {
        "dsv4": "/mnt/weights/deepseek-ai/DeepSeek-V4-Pro-W4A16"}
    assert read_served_models(b'{"data": [{"id": "a"}]}') == {"a": "a"}  # no root: the id is the model
    many = {"data": [{"id": f"m{i}", "root": "r"} for i in range(1000)]}
    assert len(read_served_models(json.dumps(many).encode())) == config.MAX_MODELS_PER_TARGET
    long = {"data": [{"id": "a", "root": "r" * (config.MAX_LABEL_VALUE_LENGTH + 1)}, {"id": "b", "root": "r"}]}
    assert read_served_models(json.dumps(long).encode()) == {"b": "r"}
    for bad, message in [(b"<html>", "not JSON"), (b"[]", "no 'data' list"), (b'{"data": [{"id": 1}]}', "string 'id'")]:
        with pytest.raises(ValueError, match=message):
            read_served_models(bad)


def test_models_url():
    assert models_url("http://u:p@127.0.0.1:8000/metrics") == "http://u:p@127.0.0.1:8000/v1/models"
    assert models_url("https://h/vllm/metrics?token=x") == "https://h/vllm/v1/models?token=x"
    assert models_url("dump.prom") is None


def test_v1_models_is_read_within_the_polls_own_timeout():
    """helper-28: /v1/models was read with a full timeout of its own after the payload's, so a slow
    one (re-read at every poll when model names churn) made a poll last twice its timeout. The
    payload here takes 0.7 s of the 1 s timeout (on the poller's clock): /v1/models gets the 0.3 s
    left; with less than SERVED_MODELS_MIN_SECONDS left it waits for the next poll."""
    import time

    async def slow_models(request):
        await asyncio.sleep(3)
        return web.json_response(VLLM_MODELS)

    async def go():
        async with stand_in(slow_models) as (poller, _, _, clock, calls):
            spent = {"s": 0.7}
            original = poller.session.get

            def timed_get(u, **kw):  # the payload's fetch takes `spent` seconds of the poller's clock
                if u.endswith("/metrics"):
                    clock.t += spent["s"]
                return original(u, **kw)

            poller.session.get = timed_get
            clock.t += 5
            began = time.monotonic()
            assert await poller.poll_once() == "success"
            took = time.monotonic() - began
            assert calls["models"] == 1 and poller.view.served_models_failures == 1
            assert took < 0.9, took  # the 0.3 s left, not a second 1 s timeout
            spent["s"] = 1 - SERVED_MODELS_MIN_SECONDS / 2
            clock.t += config.SERVED_MODELS_REFRESH_SECONDS
            with capture_logs() as logs:
                assert await poller.poll_once() == "success"
            assert calls["models"] == 1  # no time left: not asked this poll, but counted and said
            assert poller.view.served_models_failures == 2
            assert [e["warning"] for e in logs if e["event"] == "served_models_unread"] == [
                "/v1/models: not read, the payload took the poll's timeout (1 s); baseline profiles are matched by the served name alone"]
            spent["s"] = 0.0
            clock.t += 5
            await poller.poll_once()
            assert calls["models"] == 2  # asked on the next
    asyncio.run(go())
