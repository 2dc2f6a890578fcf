"""Basic auth under attack: bcrypt never blocks the event loop, wrong passwords are never
cached (and cannot crowd out the right one), unknown users take as long as known ones.

Real attackers over loopback against the real `serve` command; the cache tests count
bcrypt calls on the real app in-process. Run with -s to see the measured figures."""

from __future__ import annotations

import asyncio
import http.client
import itertools
import statistics
import threading
import time
from pathlib import Path

import aiohttp
import bcrypt
import pytest
from aiohttp import web
from http_fixtures import LoopbackServer, prom
from security_harness import basic, bcrypt_hash, get, percentile, start_exporter, timed_get, write_web_config
from seed_records import render_dump
from vllm_specdec_exporter.settings import build_settings
from vllm_specdec_exporter.web import create_app, start_site

PASSWORD = "correct horse battery staple"
FLOOD_SECONDS = 4


def flood(port: int, stop: threading.Event, counter: list[int], user: str = "prometheus") -> None:
    """One attacker: wrong passwords (all different) on a keep-alive connection, as fast as answered.
    counter[0] counts the refusals after a bcrypt (401), counter[1] those refused without
    one (429: too many checks pending from this address)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    n = 0
    while not stop.is_set():
        n += 1
        try:
            conn.request("GET", "/metrics", headers={"Authorization": basic(user, f"guess-{threading.get_ident()}-{n}")})
            resp = conn.getresponse()
            resp.read()
            assert resp.status in (401, 429), resp.status
            counter[0 if resp.status == 401 else 1] += 1
        except (OSError, http.client.HTTPException):
            conn.close()
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    conn.close()


@pytest.mark.xdist_group("latency")  # timing assertions: never beside another latency test
def test_a_wrong_password_flood_does_not_stall_probes_or_polls(tmp_path):
    """16 clients sending wrong passwords as fast as they are answered: /healthz stays
    under 100 ms at p99 and vLLM is still polled every second."""
    hits: list[float] = []
    dump = render_dump({"drafts": 100, "draft_tokens": 200, "accepted": 150, "per_pos": [90, 60]})

    def handler(n):
        hits.append(time.monotonic())
        return prom(dump)

    cfg = write_web_config(tmp_path / "web.yaml", users={"prometheus": bcrypt_hash(PASSWORD, 10)})
    with LoopbackServer(handler) as vllm:
        server, port = start_exporter("--vllm.url", vllm.url, "--poll.interval", "1s", "--web.config.file", str(cfg))
        stop, answered = threading.Event(), [0, 0]
        attackers = [threading.Thread(target=flood, args=(port, stop, answered)) for _ in range(16)]
        try:
            assert get(f"http://127.0.0.1:{port}/metrics", auth=("prometheus", PASSWORD))[0] == 200
            for t in attackers:
                t.start()
            started = time.monotonic()
            latencies = []
            while time.monotonic() - started < FLOOD_SECONDS:
                latencies.append(timed_get(f"http://127.0.0.1:{port}/healthz"))
                time.sleep(0.01)  # a few hundred probes: a p99 that is not just the worst one
            polls = [h for h in hits if started <= h <= time.monotonic()]
            scrape = timed_get(f"http://127.0.0.1:{port}/metrics", auth=("prometheus", PASSWORD), timeout=30)
        finally:
            stop.set()
            for t in attackers:
                t.join(60)
            server.stop()
    p99 = percentile(latencies, 99)
    gaps = [b - a for a, b in itertools.pairwise(polls)] or [float("inf")]

    print(f"\nwrong-password flood, 16 clients, {FLOOD_SECONDS} s: {answered[0]} refusals after a bcrypt, "
          f"{answered[1]} at once (429: too many pending); /healthz p50 "
          f"{1000 * percentile(latencies, 50):.1f} ms, p99 {1000 * p99:.1f} ms, max {1000 * max(latencies):.1f} ms "
          f"over {len(latencies)} probes; {len(polls)} polls, longest gap {max(gaps):.2f} s; "
          f"a scrape with the right (cached) password {1000 * scrape:.0f} ms")
    # the flood really ran (bcrypt ~0.1-0.2 s each, one at a time): 2.5 a second at least
    assert answered[0] >= 2.5 * FLOOD_SECONDS
    assert p99 < 0.100, f"/healthz p99 {p99 * 1000:.0f} ms under the flood"
    # polled every second: at most one poll short of the flood's length (a window edge)
    assert len(polls) >= FLOOD_SECONDS - 1 and max(gaps) < 1.5, f"polls during the flood: {gaps}"
    assert scrape < 1.0  # the right password is cached: it does not queue behind the flood's bcrypt


@pytest.mark.xdist_group("latency")  # timing assertions: never beside another latency test
def test_unknown_user_takes_as_long_as_a_wrong_password(tmp_path):
    """No user names by timing: both go through bcrypt at the same cost."""
    cfg = write_web_config(tmp_path / "web.yaml", users={"prometheus": bcrypt_hash(PASSWORD, 10)})
    server, port = start_exporter("--web.config.file", str(cfg))
    url = f"http://127.0.0.1:{port}/metrics"
    times: dict[str, list[float]] = {"unknown": [], "wrong": []}
    try:
        for i in range(12):
            for kind, user in (("unknown", f"nobody{i}"), ("wrong", "prometheus")):
                started = time.perf_counter()
                assert get(url, auth=(user, f"guess{i}"))[0] == 401
                times[kind].append(time.perf_counter() - started)
    finally:
        server.stop()
    unknown, wrong = statistics.median(times["unknown"]), statistics.median(times["wrong"])
    ratio = max(unknown, wrong) / min(unknown, wrong)
    print(f"\nmedian refusal: unknown user {1000 * unknown:.1f} ms, known user + wrong password {1000 * wrong:.1f} ms, "
          f"ratio {ratio:.2f}")
    assert ratio < 1.5


class CountingBcrypt:
    def __init__(self, monkeypatch):
        self.calls = 0
        real = bcrypt.checkpw

        def checkpw(password, hashed):
            self.calls += 1
            return real(password, hashed)
        monkeypatch.setattr(bcrypt, "checkpw", checkpw)


async def _exporter(cfg_path: Path):
    from vllm_specdec_exporter.webconfig import LiveWebConfig
    settings = build_settings({}, {"urls": ["http://127.0.0.1:1/m"], "listen_address": "127.0.0.1:0"})
    live = LiveWebConfig(str(cfg_path))
    runner = web.AppRunner(create_app(settings, web_config=live, start_polling=False), access_log=None)
    await runner.setup()
    _, port = await start_site(runner, "127.0.0.1", 0, live)
    return runner, f"http://127.0.0.1:{port}/metrics"


def test_wrong_passwords_are_never_cached_and_cannot_crowd_out_the_right_one(tmp_path, monkeypatch):
    cfg = write_web_config(tmp_path / "web.yaml", users={"prometheus": bcrypt_hash(PASSWORD, 4)})
    counting = CountingBcrypt(monkeypatch)

    async def go():
        runner, url = await _exporter(cfg)
        try:
            async with aiohttp.ClientSession() as s:
                async def status(password: str) -> int:
                    async with s.get(url, headers={"Authorization": basic("prometheus", password)}) as r:
                        return r.status
                assert [await status("same-wrong") for _ in range(3)] == [401] * 3
                assert counting.calls == 3  # a refusal is never remembered: each one costs a full bcrypt
                for i in range(300):  # more distinct wrong passwords than any cache holds
                    assert await status(f"wrong-{i}") == 401
                before = counting.calls
                assert [await status(PASSWORD) for _ in range(5)] == [200] * 5
                assert counting.calls == before + 1  # the right password: one bcrypt, then the cache
        finally:
            await runner.cleanup()
    asyncio.run(go())


def test_success_cache_evicts_the_least_recently_used(tmp_path, monkeypatch):
    from vllm_specdec_exporter.webconfig import Authenticator, load_web_config
    users = {f"u{i}": bcrypt_hash(f"pw{i}", 4) for i in range(3)}
    cfg = load_web_config(str(write_web_config(tmp_path / "web.yaml", users=users)))
    counting = CountingBcrypt(monkeypatch)
    auth = Authenticator(workers=1, cache_size=2)

    async def go():
        async def check(i: int) -> bool:
            return await auth.check(cfg, basic(f"u{i}", f"pw{i}"))
        assert [await check(0), await check(1), await check(0)] == [True] * 3
        assert counting.calls == 2
        assert await check(2)  # evicts u1, the least recently used
        assert counting.calls == 3
        assert await check(0) and counting.calls == 3
        assert await check(1) and counting.calls == 4
    try:
        asyncio.run(go())
    finally:
        auth.close()


@pytest.mark.parametrize("header", ["Basic !!!", "Bearer x", "Basic " + "A" * 8000, basic("prometheus", "")])
def test_malformed_credentials_are_refused(tmp_path, header):
    cfg = write_web_config(tmp_path / "web.yaml", users={"prometheus": bcrypt_hash(PASSWORD, 4)})

    async def go():
        runner, url = await _exporter(cfg)
        try:
            async with aiohttp.ClientSession() as s, s.get(url, headers={"Authorization": header}) as r:
                return r.status
        finally:
            await runner.cleanup()
    assert asyncio.run(go()) == 401
