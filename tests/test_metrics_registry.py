"""One metric registry (issue 12 item 4): every family the sidecar exports is declared once in
metrics.py (name, type, help, labels); the collector, the rule generator, the dashboards and the
demo take names from it, and no exported name is rebuilt as a string anywhere else."""

from __future__ import annotations

import asyncio
import re

from aiohttp import web
from conftest import REPO
from sidecar_harness import engine_lines, exporter, payload, poll_for
from vllm_specdec_exporter import config
from vllm_specdec_exporter.metrics import FAMILIES

PACKAGE = REPO / "exporter" / "vllm_specdec_exporter"


def rebuilt_name() -> re.Pattern[str]:
    """An exported family's name (or one of its samples') written out, or built from the prefix P."""
    shorts = "|".join(sorted(FAMILIES, key=len, reverse=True))
    return re.compile(rf"(?:{config.PREFIX}|\{{P\}})_(?:{shorts})(?:_total|_bucket|_count|_sum)?\b")


def test_every_exported_family_is_the_registry_s_with_its_type_and_help():
    async def go() -> str:
        n = {"i": 0}

        async def handle(request):
            n["i"] += 1
            return web.Response(body=payload(engine_lines(1000 * n["i"], 0)), content_type="text/plain")
        async with exporter(handle) as (app, url, session, clock):
            assert await poll_for(app, clock, 15) == ["success"] * 3
            async with session.get(url + "/metrics") as resp:
                return await resp.text()
    text = asyncio.run(go())
    helps = dict(re.findall(r"^# HELP (vllm_specdec_\w+) (.*)$", text, re.M))
    types = dict(re.findall(r"^# TYPE (vllm_specdec_\w+) (\w+)$", text, re.M))
    # The text format names a counter's family by its samples (_total) and shows a StateSet as a gauge.
    by_name = {f.sample: f for f in FAMILIES.values()}
    wire_type = {"counter": "counter", "gauge": "gauge", "stateset": "gauge", "histogram": "histogram"}
    assert len(types) >= 25  # the scrape had a real target: most families are present
    for name, kind in types.items():
        assert name in by_name, f"{name} is exported but not in metrics.py"
        assert (kind, helps[name]) == (wire_type[by_name[name].type], by_name[name].help.replace("\\", "\\\\")), name


def test_no_exported_name_is_rebuilt_as_a_string_outside_the_registry():
    pattern = rebuilt_name()
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        if path.name == "metrics.py":
            continue
        hits = [line.strip() for line in path.read_text().splitlines()
                if pattern.search(line) and not line.lstrip().startswith("#")]
        if hits:
            found[str(path.relative_to(REPO))] = hits
    assert found == {}


def test_the_scanner_sees_a_rebuilt_name(tmp_path):
    pattern = rebuilt_name()
    assert pattern.search('x = f"{P}_drafts_total"') and pattern.search('"vllm_specdec_health"')
    assert not pattern.search('"vllm_specdec_exporter"')  # the logger's name, not a family
