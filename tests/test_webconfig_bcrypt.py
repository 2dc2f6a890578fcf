"""bcrypt's queue is bounded (issue 19 item 9): 300 wrong passwords sent at once cannot
make the right one wait behind them (it waited 16 s). Beyond a few pending checks per
client address (or from too many addresses) a request is answered 429 at once, without
a bcrypt; the addresses take turns, so the right password, from another address, waits
for one check per other address at most (issue 29 item 5: a bound on checks in all let
8 addresses refuse it every time).

The real `serve` command, bcrypt at cost 10 as htpasswd -B makes it; the attacker on
127.0.0.2, Prometheus on 127.0.0.1. Run with -s to see the figures."""

from __future__ import annotations

import asyncio
import time
from collections import Counter

import aiohttp
import pytest
from security_harness import basic, bcrypt_hash, start_exporter, write_web_config

PASSWORD = "bcrypt-queue-pw-5e0b"
WRONG = 300


@pytest.mark.xdist_group("latency")  # a latency figure: never beside another latency test
def test_the_right_password_does_not_wait_behind_300_wrong_ones(tmp_path):
    cfg = write_web_config(tmp_path / "web.yaml", users={"prometheus": bcrypt_hash(PASSWORD, 10)})
    server, port = start_exporter("--web.config.file", str(cfg))
    url = f"http://127.0.0.1:{port}/metrics"

    async def go() -> tuple[float, int, Counter, float]:
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
            done.set()
            await asyncio.gather(*flood)
            return waited, status, statuses, time.monotonic() - flood_started

    try:
        waited, status, statuses, flood_seconds = asyncio.run(go())
    finally:
        logs = server.stop()
    print(f"\n{WRONG} wrong passwords kept in flight from 127.0.0.2 (bcrypt cost 10): answered {dict(statuses)} "
          f"in {flood_seconds:.1f} s; the right password from 127.0.0.1 answered {status} in {1000 * waited:.0f} ms")
    assert status == 200
    assert waited < 5.0, f"the right password waited {waited:.1f} s"  # before: 33.5 s
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
    from vllm_specdec_exporter import webconfig
    gate = threading.Event()
    real = bcrypt.checkpw
    order: list[bytes] = []

    def held(password, hashed):
        order.append(password)
        gate.wait(30)
        return real(password, hashed)
    monkeypatch.setattr(bcrypt, "checkpw", held)
    cfg = webconfig.load_web_config(str(write_web_config(tmp_path / "web.yaml",
                                                         users={"prometheus": bcrypt_hash(PASSWORD, 4)})))
    auth = webconfig.Authenticator(workers=1)
    per_client, clients = webconfig.BCRYPT_MAX_PENDING_PER_CLIENT, webconfig.BCRYPT_MAX_CLIENTS

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
