"""bcrypt's queue is bounded (issue 19 item 9): 300 wrong passwords sent at once cannot
make the right one wait behind them (it waited 16 s). Beyond a few pending checks per
client address (and a few more in all) a request is answered 429 at once, without a
bcrypt; the right password, from another address, waits for a handful at most.

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


def test_pending_checks_are_bounded_per_client_and_in_all(tmp_path, monkeypatch):
    """In-process: with bcrypt held, the fifth check from one address and the
    seventeenth in all are refused (None) at once; released, they all complete."""
    import threading

    import bcrypt
    from vllm_specdec_exporter import webconfig
    gate = threading.Event()
    real = bcrypt.checkpw

    def held(password, hashed):
        gate.wait(30)
        return real(password, hashed)
    monkeypatch.setattr(bcrypt, "checkpw", held)
    cfg = webconfig.load_web_config(str(write_web_config(tmp_path / "web.yaml",
                                                         users={"prometheus": bcrypt_hash(PASSWORD, 4)})))
    auth = webconfig.Authenticator(workers=1)

    async def go():
        def check(client: str, password: str = "wrong"):
            creds = auth.credentials(cfg, basic("prometheus", password))
            return asyncio.create_task(auth.verify(creds, client))
        first = [check("10.0.0.1") for _ in range(webconfig.BCRYPT_MAX_PENDING_PER_CLIENT)]
        await asyncio.sleep(0.05)
        assert await check("10.0.0.1") is None  # that client's share is taken
        others = [check(f"10.0.1.{i}") for i in range(webconfig.BCRYPT_MAX_PENDING - len(first))]
        await asyncio.sleep(0.05)
        assert await check("10.0.2.1", PASSWORD) is None  # all taken
        gate.set()
        results = await asyncio.gather(*first, *others)
        assert results == [False] * webconfig.BCRYPT_MAX_PENDING
        assert await check("10.0.0.1", PASSWORD) is True  # freed again
    try:
        asyncio.run(go())
    finally:
        gate.set()
        auth.close()
