"""One maximum k (issue 12 item 4): config.MAX_K bounds k where profiles, scenarios and
payloads are read; a target whose k is above the positions the generated rules cover is
still read and exported, with one warning that the wasted-tokens alert cannot fire for it."""

from __future__ import annotations

import asyncio

import pytest
from aiohttp import web
from sidecar_harness import V1, exporter, one, payload, poll_for, scrape
from vllm_specdec_exporter import config
from vllm_specdec_exporter.scenarios import load_scenario
from vllm_specdec_exporter.settings import ConfigError, build_settings

P = config.PREFIX


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


def test_profiles_and_scenarios_take_k_up_to_the_one_maximum(tmp_path):
    def profile(k: int) -> dict:
        return {"targets": [{"name": "t", "url": "http://127.0.0.1:1/metrics"}],
                "baselines": {"profiles": [{"name": "p", "model": "m", "k": k, "mean_acceptance_length": 1.5}]}}
    assert build_settings(profile(config.MAX_K), {}).baselines[0].k == config.MAX_K
    with pytest.raises(ConfigError, match="k"):
        build_settings(profile(config.MAX_K + 1), {})
    for k, ok in ((config.MAX_K, True), (config.MAX_K + 1, False)):
        path = tmp_path / f"k{k}.yaml"
        path.write_text(f"k: {k}\nengines: 1\ndrafts_per_second: 10\nper_position: {[0.5] * k}\n")
        if ok:
            assert load_scenario(str(path)).k == k
        else:
            with pytest.raises(ConfigError, match=f"k must be 1-{config.MAX_K}"):
                load_scenario(str(path))
