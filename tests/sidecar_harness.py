"""Drive the real exporter app against the real simulator on loopback, on a fake clock.

Both apps run in the test's event loop on ephemeral loopback ports; the exporter
fetches from the simulator over real HTTP. Only time is faked: the simulator's
scenario clock and the exporter's monotonic clock are the same FakeClock, so a
'2 minutes' test takes a second.
"""

from __future__ import annotations

import asyncio
import contextlib
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
