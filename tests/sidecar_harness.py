"""Drive the real exporter app against the real simulator on loopback, on a fake clock.

Both apps run in the test's event loop on ephemeral loopback ports; the exporter
fetches from the simulator over real HTTP. Only time is faked: the simulator's
scenario clock and the exporter's monotonic clock are the same FakeClock, so a
'2 minutes' test takes a second.
"""

from __future__ import annotations

import asyncio
import contextlib
import html
from collections.abc import Callable
from dataclasses import dataclass

import aiohttp
from aiohttp import web
from vllm_specdec_exporter.parser import parse
from vllm_specdec_exporter.scenarios import load_scenario
from vllm_specdec_exporter.settings import build_settings
from vllm_specdec_exporter.simulate import Simulation, create_simulator_app
from vllm_specdec_exporter.web import POLLERS, create_app, start_site


class FakeClock:
    def __init__(self, t: float = 1000.0):
        self.t = t

    def __call__(self) -> float:
        return self.t


async def start(app: web.Application) -> tuple[web.AppRunner, str]:
    runner = web.AppRunner(app, access_log=None, handle_signals=False)
    await runner.setup()
    _, port = await start_site(runner, "127.0.0.1", 0)
    return runner, f"http://127.0.0.1:{port}"


@dataclass
class Harness:
    clock: FakeClock
    simulations: list[Simulation]
    sim_runners: list[web.AppRunner]
    exporter_url: str
    app: web.Application
    session: aiohttp.ClientSession

    @property
    def pollers(self):
        return self.app[POLLERS]

    async def poll(self) -> list[str]:
        return [await p.poll_once() for p in self.pollers]

    async def run_for(self, seconds: float, step: float = 5.0) -> None:
        """Advance the fake clock in poll-interval steps, polling after each."""
        end = self.clock.t + seconds
        while self.clock.t < end - 1e-9:
            self.clock.t += step
            await self.poll()

    async def get(self, path: str) -> tuple[int, str]:
        async with self.session.get(self.exporter_url + path) as resp:
            return resp.status, await resp.text()

    async def metrics(self) -> dict:
        status, text = await self.get("/metrics")
        assert status == 200
        return parse(text).samples

    async def stop_simulator(self, i: int = 0) -> None:
        await self.sim_runners[i].cleanup()


def values(samples: dict, name: str, **labels) -> list[float]:
    return [s.value for s in samples.get(name, []) if all(s.labels.get(k) == v for k, v in labels.items())]


def one(samples: dict, name: str, **labels) -> float:
    found = values(samples, name, **labels)
    assert len(found) == 1, (name, labels, found)
    return found[0]


@contextlib.asynccontextmanager
async def harness(scenarios: list[str] | str, config: dict | None = None, overrides: dict | None = None):
    scenarios = [scenarios] if isinstance(scenarios, str) else scenarios
    clock = FakeClock()
    simulations, runners, urls = [], [], []
    for i, name in enumerate(scenarios):
        sim = Simulation(load_scenario(name), clock=clock)
        runner, url = await start(create_simulator_app(sim))
        simulations.append(sim)
        runners.append(runner)
        urls.append(f"t{i}={url}/metrics" if len(scenarios) > 1 else f"{url}/metrics")
    settings = build_settings(config or {}, {"urls": urls, "listen_address": "127.0.0.1:0", **(overrides or {})})
    app = create_app(settings, mono=clock, start_polling=False)
    exp_runner, exp_url = await start(app)
    async with aiohttp.ClientSession() as session:
        h = Harness(clock, simulations, runners, exp_url, app, session)
        try:
            await h.poll()  # the first poll: running totals start here
            yield h
        finally:
            await exp_runner.cleanup()
            for r in runners:
                await r.cleanup()


def run(coro):
    return asyncio.run(coro)


# A hand-served stand-in for vLLM (one engine, k=2, its counters given) and the exporter polling it:
# poll_once by hand on a fake clock.
LIFE = 10_000_000  # healthy drafts before the collapse, per position 0.9 and 0.7: AL 2.6
V1 = "vllm:spec_decode_num_"


def engine_lines(drafts: float, accepted_extra: float, engine: str = "0", model: str = "m",
                 positions: tuple[float, ...] | None = None) -> list[str]:
    p0 = LIFE * 0.9 + accepted_extra
    p1 = LIFE * 0.7
    pos = positions if positions is not None else (p0, p1)
    lab = f'engine="{engine}",model_name="{model}"'
    return [
        f"{V1}drafts_total{{{lab}}} {drafts:.0f}",
        f"{V1}draft_tokens_total{{{lab}}} {2 * drafts:.0f}",
        f"{V1}accepted_tokens_total{{{lab}}} {sum(pos[:2]):.0f}",
        *(f'{V1}accepted_tokens_per_pos_total{{{lab},position="{i}"}} {v:.0f}' for i, v in enumerate(pos)),
    ]


def payload(lines: list[str]) -> bytes:
    return ("\n".join(lines) + "\n").encode()


@contextlib.asynccontextmanager
async def exporter(handler, config: dict | None = None, clock: FakeClock | None = None):
    clock = clock or FakeClock()
    app = web.Application()
    app.router.add_get("/metrics", handler)
    runner, url = await start(app)
    settings = build_settings({"poll": {"interval": "5s", "timeout": "2s"}, **(config or {})},
                              {"urls": [f"{url}/metrics"], "listen_address": "127.0.0.1:0"})
    exp = create_app(settings, mono=clock, start_polling=False)
    exp_runner, exp_url = await start(exp)
    try:
        async with aiohttp.ClientSession() as session:
            yield exp, exp_url, session, clock
    finally:
        await exp_runner.cleanup()
        await runner.cleanup()


async def poll_for(app, clock: FakeClock, seconds: float, step: float = 5.0) -> list[str]:
    results = []
    for _ in range(int(seconds // step)):
        clock.t += step
        results.append(await app[POLLERS][0].poll_once())
    return results


async def scrape(session, url: str) -> dict:
    async with session.get(url + "/metrics") as resp:
        assert resp.status == 200
        return parse(await resp.text()).samples


# The exporter polling hand-served targets whose counters carry _created (restarts known).
T0 = 1.79e9  # when the first process's counters started (unix seconds)


def dump(model: str, drafts: float, shares: tuple[float, ...], started: float, engines: int = 1) -> bytes:
    """vLLM V1 counters of ``engines`` engines at per-position survival ``shares`` (k = len), each
    engine's _created at ``started`` (the single-API-server form)."""
    lines = []
    for e in range(engines):
        lab = f'engine="{e}",model_name="{model}"'
        pos = [round(s * drafts) for s in shares]
        lines += [f"{V1}drafts_total{{{lab}}} {drafts:.0f}", f"{V1}drafts_created{{{lab}}} {started!r}",
                  f"{V1}draft_tokens_total{{{lab}}} {len(shares) * drafts:.0f}",
                  f"{V1}accepted_tokens_total{{{lab}}} {sum(pos)}"]
        lines += [f'{V1}accepted_tokens_per_pos_total{{{lab},position="{i}"}} {v}' for i, v in enumerate(pos)]
    return ("\n".join(lines) + "\n").encode()


class Sidecar:
    """The real exporter polling loopback servers that answer ``serve(t)`` (t: the fake clock):
    one target "vllm", or one per name of a mapping."""

    def __init__(self, serve: Callable[[float], bytes] | dict[str, Callable[[float], bytes]], t0: float,
                 config: dict | None = None):
        self.serves = serve if isinstance(serve, dict) else {"vllm": serve}
        self.clock, self.config, self.runners = FakeClock(t0), config or {}, []

    async def __aenter__(self) -> Sidecar:
        targets = []
        for name, serve in self.serves.items():
            async def handle(request, serve=serve):
                return web.Response(body=serve(self.clock.t), content_type="text/plain")

            app = web.Application()
            app.router.add_get("/metrics", handle)
            runner, url = await start(app)
            self.runners.append(runner)
            targets.append({"name": name, "url": f"{url}/metrics"})
        settings = build_settings({"poll": {"interval": "5s", "timeout": "2s"}, "targets": targets, **self.config},
                                  {"listen_address": "127.0.0.1:0"})
        self.app = create_app(settings, mono=self.clock, start_polling=False)
        self.exp_runner, self.url = await start(self.app)
        self.session = aiohttp.ClientSession()
        return self

    async def __aexit__(self, *exc) -> None:
        await self.session.close()
        await self.exp_runner.cleanup()
        for runner in self.runners:
            await runner.cleanup()

    async def poll_until(self, t: float) -> None:
        while self.clock.t < t:
            for poller in self.app[POLLERS]:
                await poller.poll_once()
            self.clock.t += 5.0

    def model(self, target: int = 0):
        [mv] = self.app[POLLERS][target].view.models
        return mv

    async def summary(self, window: str) -> dict:
        async with self.session.get(f"{self.url}/api/v1/summary?window={window}") as r:
            assert r.status == 200
            [entry] = (await r.json())["models"].values()
            return entry

    async def page(self) -> str:
        async with self.session.get(self.url + "/") as r:
            return html.unescape(await r.text())
