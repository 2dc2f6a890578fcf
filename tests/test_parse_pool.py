"""parse_pool: where a payload is parsed. On the event loop while the target's own parses
are cheap (a real DP=8 payload), in a parsing process otherwise; a costly parse on the
loop holds the target off it, so a hostile target stalls the loop once, not every poll."""

from __future__ import annotations

import asyncio
import time

import pytest
from conftest import REPO
from vllm_specdec_exporter import config, parse_pool
from vllm_specdec_exporter.parse_pool import Payload, Read

V1 = "vllm:spec_decode_num_"
PAYLOADS = REPO / "tests" / "fixtures" / "payloads"
REAL_DP8 = (PAYLOADS / "vllm-v1-dp8-k2-single-process.prom").read_bytes()  # 364 KB
REAL_DP1 = (PAYLOADS / "vllm-v1-dp1-k2-single-process.prom").read_bytes()  # 54 KB


def churn(size: int, seed: int) -> bytes:
    """Spec-decode lines of ``size`` bytes, every series new (the costliest shape per byte)."""
    out, n, e = [], 0, 0
    while n < size:
        lab = f'engine="{seed}-{e}",model_name="m"'
        block = f"{V1}drafts_total{{{lab}}} 100\n{V1}draft_tokens_total{{{lab}}} 200\n{V1}accepted_tokens_total{{{lab}}} 150\n"
        out.append(block)
        n += len(block)
        e += 1
    return "".join(out).encode()[:size].rsplit(b"\n", 1)[0] + b"\n"


@pytest.fixture
def lanes(monkeypatch):
    """Which reads went to a parsing process; the lane state emptied before and after."""
    for held in (parse_pool._HEAVY_UNTIL, parse_pool._OFF_LOOP_UNTIL, parse_pool._LAST_COST):
        held.clear()
    sent: list[str] = []
    in_worker = parse_pool._in_worker

    async def spy(big, target, fn, *args):
        sent.append(target)
        return await in_worker(big, target, fn, *args)

    monkeypatch.setattr(parse_pool, "_in_worker", spy)
    yield sent
    parse_pool.close_parse_pool()
    for held in (parse_pool._HEAVY_UNTIL, parse_pool._OFF_LOOP_UNTIL, parse_pool._LAST_COST):
        held.clear()


def read(target: str, body: bytes) -> object:
    return asyncio.run(parse_pool.read(Payload(target, body, 32 << 20, None, {}, 4096)))


def test_a_real_dp8_payload_is_parsed_on_the_loop_once_its_cost_is_known(lanes):
    assert config.PARSE_IN_WORKER_BYTES < len(REAL_DP8) <= config.PARSE_ON_LOOP_MAX_BYTES
    results = [read("real", REAL_DP8) for _ in range(2)]
    # The first, not yet measured, in the parsing process; a fresh process's first parse may
    # cost over the bound (imports, caches), so a second there; then on the loop, for good.
    assert 1 <= len(lanes) <= 2 and set(lanes) == {"real"}, lanes
    sent = len(lanes)
    results += [read("real", REAL_DP8) for _ in range(3)]
    assert len(lanes) == sent
    assert all(isinstance(r, Read) and len(r.kept) == 8 for r in results)
    assert parse_pool._LAST_COST["real"] < config.PARSE_ON_LOOP_SECONDS


def test_a_big_payload_stays_in_the_parsing_process_however_cheap():
    big = REAL_DP8 + b"# padding\n" * 80_000
    assert len(big) > config.PARSE_ON_LOOP_MAX_BYTES
    assert not parse_pool._on_loop("never-measured", len(big))
    parse_pool._LAST_COST["cheap"] = 0.0
    try:
        assert not parse_pool._on_loop("cheap", len(big)) and parse_pool._on_loop("cheap", len(REAL_DP8))
    finally:
        parse_pool._LAST_COST.pop("cheap")


def test_a_costly_small_payload_holds_its_target_off_the_loop(lanes, monkeypatch):
    """Today's thresholds sit between the shapes: a real payload parses in ~0.6 ms of CPU, 256 KiB
    of new series in ~20-30 ms (config.PARSE_ON_LOOP_SECONDS: 10 ms)."""
    body = churn(config.PARSE_IN_WORKER_BYTES, 0)
    assert isinstance(read("hostile", body), Read)
    assert lanes == []  # not yet measured and small: on the loop, once
    assert parse_pool._LAST_COST["hostile"] > config.PARSE_ON_LOOP_SECONDS
    # Held off the loop even when it turns small and cheap, for the hold.
    assert isinstance(read("hostile", REAL_DP1), Read)
    assert isinstance(read("hostile", churn(config.PARSE_IN_WORKER_BYTES, 1)), Read)
    assert lanes == ["hostile", "hostile"]
    assert parse_pool._OFF_LOOP_UNTIL["hostile"] > time.monotonic() + config.PARSE_HEAVY_HOLD_SECONDS - 60
    # Another target is not held by it.
    assert isinstance(read("real", REAL_DP1), Read)
    assert lanes == ["hostile", "hostile"]


def test_the_hold_ends(lanes, monkeypatch):
    monkeypatch.setattr(config, "PARSE_ON_LOOP_SECONDS", 0.0)  # every parse is costly
    small = REAL_DP1
    read("t", small)
    read("t", small)
    assert lanes == ["t"]  # the first on the loop held it off
    monkeypatch.setattr(config, "PARSE_ON_LOOP_SECONDS", 1.0)
    parse_pool._OFF_LOOP_UNTIL["t"] = time.monotonic() - 1  # the hold is over
    read("t", small)
    assert lanes == ["t"]  # back on the loop
