"""Basic auth under attack (webconfig/auth.py): bcrypt never blocks the event loop, wrong
passwords are never cached (and cannot crowd out the right one), unknown users take as
long as known ones.

bcrypt's queue is bounded (issue 19 item 9): 300 wrong passwords sent at once cannot
make the right one wait behind them (it waited 16 s). Beyond a few pending checks per
client address (or from too many addresses) a request is answered 429 at once, without
a bcrypt; the addresses take turns, so the right password, from another address, waits
for one check per other address at most (issue 29 item 5: a bound on checks in all let
8 addresses refuse it every time).

Real attackers over loopback against the real `serve` command, bcrypt at cost 10 as
htpasswd -B makes it (the attacker on 127.0.0.2, Prometheus on 127.0.0.1 where they
differ); the cache tests count bcrypt calls on the real app in-process. Run with -s to
see the measured figures."""

from __future__ import annotations

import asyncio
import http.client
import itertools
import statistics
import threading
import time
from collections import Counter
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
WRONG = 300


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
def timed(call) -> float:
    started = time.perf_counter()
    call()
    return time.perf_counter() - started


def test_a_wrong_password_flood_does_not_stall_probes_or_polls(tmp_path):
    """16 clients sending wrong passwords as fast as they are answered: /healthz stays
    under 100 ms at p99 (or one bcrypt's time, measured meanwhile, on a busier machine) and
    vLLM is still polled every second."""
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
            # One bcrypt at the same cost, timed here while the flood runs: a probe that queued
            # behind even one (the fault this test is for) takes at least that long.
            hashed = bcrypt_hash(PASSWORD, 10).encode()
            one_bcrypt = min(timed(lambda: bcrypt.checkpw(b"wrong", hashed)) for _ in range(3))
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
    # 100 ms, or one bcrypt's time where a busy machine makes that longer (148 ms was seen at load 7-9).
    assert p99 < max(0.100, one_bcrypt), f"/healthz p99 {p99 * 1000:.0f} ms under the flood (one bcrypt: {one_bcrypt * 1000:.0f} ms)"
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
    from vllm_specdec_exporter.webconfig.reload import LiveWebConfig
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
    from vllm_specdec_exporter.webconfig.auth import Authenticator
    from vllm_specdec_exporter.webconfig.load import load_web_config
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


@pytest.mark.parametrize("header", ["Basic !!!", "Bearer x", "Basic " + "A" * 8000, basic("prometheus", ""),
                                    basic("prometheus", "x" * 73), basic("nobody", PASSWORD + "x" * 72)])
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


def test_a_password_over_72_bytes_is_read_as_bcrypt_reads_it(tmp_path):
    """bcrypt reads the first 72 bytes: htpasswd hashed no more, and exporter-toolkit (Go's bcrypt)
    compares no more. bcrypt 5 raised on a longer one: a 500 and a traceback for any client."""
    long = "p" * 72
    cfg = write_web_config(tmp_path / "web.yaml", users={"prometheus": bcrypt_hash(long, 4)})

    async def go():
        runner, url = await _exporter(cfg)
        try:
            async with aiohttp.ClientSession() as s:
                statuses = []
                for password in (long, long + "-beyond-72", "q" * 73):
                    async with s.get(url, headers={"Authorization": basic("prometheus", password)}) as r:
                        statuses.append(r.status)
                return statuses
        finally:
            await runner.cleanup()
    assert asyncio.run(go()) == [200, 200, 401]


# --- bcrypt's queue: bounded per client address, addresses taking turns -------------------

@pytest.mark.xdist_group("latency")  # a latency figure: never beside another latency test
def test_the_right_password_does_not_wait_behind_300_wrong_ones(tmp_path):
    cfg = write_web_config(tmp_path / "web.yaml", users={"prometheus": bcrypt_hash(PASSWORD, 10)})
    server, port = start_exporter("--web.config.file", str(cfg))
    url = f"http://127.0.0.1:{port}/metrics"

    async def go() -> tuple[float, int, Counter, float, float]:
        attacker = aiohttp.TCPConnector(local_addr=("127.0.0.2", 0), limit=0, force_close=True)
        timeout = aiohttp.ClientTimeout(total=120)
        async with aiohttp.ClientSession(connector=attacker, timeout=timeout) as bad, \
                aiohttp.ClientSession(timeout=timeout) as good:
            statuses: Counter = Counter()
            done = asyncio.Event()

            async def wrong(i: int) -> None:
                """Sent again as soon as answered: WRONG wrong passwords in flight until the scrape is in."""
                n = 0
                while not done.is_set():
                    n += 1
                    async with bad.get(url, headers={"Authorization": basic("prometheus", f"guess-{i}-{n}")}) as r:
                        statuses[r.status] += 1
                    await asyncio.sleep(0.05 if r.status == 429 else 0)  # a retry pause: the client's CPU is the server's
            flood_started = time.monotonic()
            flood = [asyncio.create_task(wrong(i)) for i in range(WRONG)]
            await asyncio.sleep(1.0)
            started = time.monotonic()
            async with good.get(url, headers={"Authorization": basic("prometheus", PASSWORD)}) as r:
                status = r.status
                await r.read()
            waited = time.monotonic() - started
            # One bcrypt at the same cost, while the flood still runs: the unit of waiting.
            hashed = bcrypt_hash(PASSWORD, 10).encode()
            bcrypt_seconds = min(timed(lambda: bcrypt.checkpw(b"wrong", hashed)) for _ in range(3))
            done.set()
            await asyncio.gather(*flood)
            return waited, status, statuses, time.monotonic() - flood_started, bcrypt_seconds

    try:
        waited, status, statuses, flood_seconds, one_bcrypt = asyncio.run(go())
    finally:
        logs = server.stop()
    print(f"\n{WRONG} wrong passwords kept in flight from 127.0.0.2 (bcrypt cost 10): answered {dict(statuses)} "
          f"in {flood_seconds:.1f} s; the right password from 127.0.0.1 answered {status} in {1000 * waited:.0f} ms")
    assert status == 200
    # 5 s, or 20 bcrypts where a busy machine makes those longer (5.6 s was seen at load 11-22); queued
    # behind the 300 wrong ones it waited 33.5 s (about 300 bcrypts).
    assert waited < max(5.0, 20 * one_bcrypt), f"the right password waited {waited:.1f} s (one bcrypt: {one_bcrypt:.2f} s)"
    assert set(statuses) <= {401, 429}, statuses
    # The bound: a few bcrypt checks at a time (one worker), every other request refused at once.
    assert statuses[429] >= WRONG and statuses[401] <= 20 * flood_seconds, statuses
    assert PASSWORD not in logs


def test_pending_checks_are_bounded_per_client_and_take_turns(tmp_path, monkeypatch):
    """In-process: with bcrypt held, the fifth check from one address is refused (None)
    at once, and so is a check from a new address once BCRYPT_MAX_CLIENTS addresses have
    some pending. Below that a new address is let in however many checks the others
    hold (issue 29 item 5), and its check runs after one of each other address's, before
    their second ones."""
    import threading

    import bcrypt
    from vllm_specdec_exporter.webconfig.auth import BCRYPT_MAX_CLIENTS, BCRYPT_MAX_PENDING_PER_CLIENT, Authenticator
    from vllm_specdec_exporter.webconfig.load import load_web_config
    gate = threading.Event()
    real = bcrypt.checkpw
    order: list[bytes] = []

    def held(password, hashed):
        order.append(password)
        gate.wait(30)
        return real(password, hashed)
    monkeypatch.setattr(bcrypt, "checkpw", held)
    cfg = load_web_config(str(write_web_config(tmp_path / "web.yaml",
                                               users={"prometheus": bcrypt_hash(PASSWORD, 4)})))
    auth = Authenticator(workers=1)
    per_client, clients = BCRYPT_MAX_PENDING_PER_CLIENT, BCRYPT_MAX_CLIENTS

    async def go():
        def check(client: str, password: str = "wrong"):
            creds = auth.credentials(cfg, basic("prometheus", password))
            return asyncio.create_task(auth.verify(creds, client))
        first = [check("10.0.0.1", f"wrong-{n}") for n in range(per_client)]
        await asyncio.sleep(0.05)
        assert await check("10.0.0.1") is None  # that client's share is taken
        others = [check(f"10.0.1.{i}", f"wrong-{n}") for i in range(clients - 2) for n in range(per_client)]
        await asyncio.sleep(0.05)
        right = check("10.0.2.1", PASSWORD)  # the last address with room: let in
        await asyncio.sleep(0.05)
        assert await check("10.0.2.2", PASSWORD) is None  # one address too many
        gate.set()
        assert await right is True
        results = await asyncio.gather(*first, *others)
        assert results == [False] * (per_client * (clients - 1))
        # Its turn came after the first check of each of the other clients, before any second one.
        assert order.index(PASSWORD.encode()) == clients - 1, order[:clients]
        assert order[:clients - 1] == [b"wrong-0"] * (clients - 1)
        assert await check("10.0.2.2", PASSWORD) is True  # cached now
        assert not auth._pending and not auth._turns  # nothing left behind
    try:
        asyncio.run(go())
    finally:
        gate.set()
        auth.close()


ATTACKERS = 8  # addresses sending wrong passwords (issue 29 item 5)
TRIES = 18
COST = 6  # short; at cost 10, the code before this fix refused 18 of 18 (docs/security.md)


@pytest.mark.xdist_group("latency")
def test_the_right_password_is_answered_while_8_addresses_send_wrong_ones(tmp_path):
    """Issue 29 item 5: the bound on pending checks was global, so 8 addresses sending
    wrong passwords (4 pending each) kept all 16 slots taken, and a right password
    that needs a bcrypt (the first scrape after a start or a password rotation) got
    429 on 18 of 18 tries. Each try here is such a first scrape: 18 users share one
    hash, and each try names another one, so none is in the success cache. 8 requests
    per address kept in flight, each sent again as soon as answered."""
    hashed = bcrypt_hash(PASSWORD, COST)
    users = {"prometheus": hashed, **{f"scrape-{i}": hashed for i in range(TRIES)}}
    cfg = write_web_config(tmp_path / "web.yaml", users=users)
    server, port = start_exporter("--web.config.file", str(cfg))
    url = f"http://127.0.0.1:{port}/metrics"

    async def go() -> tuple[list[int], list[float], Counter]:
        timeout = aiohttp.ClientTimeout(total=30)
        statuses: Counter = Counter()
        done = asyncio.Event()
        sessions = [aiohttp.ClientSession(timeout=timeout, connector=aiohttp.TCPConnector(
            local_addr=(f"127.0.0.{2 + a}", 0), limit=0, force_close=True)) for a in range(ATTACKERS)]

        async def wrong(bad: aiohttp.ClientSession, i: int) -> None:
            n = 0
            while not done.is_set():
                n += 1
                async with bad.get(url, headers={"Authorization": basic("prometheus", f"guess-{i}-{n}")}) as r:
                    statuses[r.status] += 1
        try:
            flood = [asyncio.create_task(wrong(bad, i)) for bad in sessions for i in range(8)]
            await asyncio.sleep(0.5)
            got, waits = [], []
            async with aiohttp.ClientSession(timeout=timeout) as good:
                for i in range(TRIES):
                    await asyncio.sleep(0.05)  # a try's freed slot is not kept for the next one
                    started = time.monotonic()
                    async with good.get(url, headers={"Authorization": basic(f"scrape-{i}", PASSWORD)}) as r:
                        got.append(r.status)
                        await r.read()
                    waits.append(time.monotonic() - started)
            done.set()
            await asyncio.gather(*flood)
        finally:
            for s in sessions:
                await s.close()
        return got, waits, statuses

    try:
        got, waits, statuses = asyncio.run(go())
    finally:
        logs = server.stop()
    print(f"\n{ATTACKERS} addresses sending wrong passwords (answered {dict(statuses)}); the right password, "
          f"{TRIES} uncached tries from 127.0.0.1: {Counter(got)}, longest wait {1000 * max(waits):.0f} ms")
    assert got == [200] * TRIES, Counter(got)
    assert statuses[401] > 0 and set(statuses) <= {401, 429}, statuses
    assert PASSWORD not in logs
