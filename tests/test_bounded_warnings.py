"""Issue 19 item 3: what the sidecar remembers of upstream warnings is bounded in bytes.

Warnings embed label values (the parser's duplicate-series line, TRT-LLM's and SGLang's
series warnings). A label that changes on every poll makes every warning new; before,
each one was remembered whole (up to 1,000 of them), and the main process grew by
megabytes per poll."""

from __future__ import annotations

import asyncio
import sys

from aiohttp import web
from sidecar_harness import engine_lines, exporter, payload
from vllm_specdec_exporter.web import POLLERS

POLLS = 50
LABEL = 30_000  # characters of a label value that changes on every poll
BOUND = 256 * 1024  # bytes the remembered warnings may hold, whatever the upstream sends


def rss() -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmRSS:"))


def vllm_body(n: int) -> bytes:
    """A healthy engine, and 25 duplicated series whose label is new on every poll:
    the parser reports each duplicate with all of its labels."""
    lines = engine_lines(1000.0 * (n + 1), 0)
    for i in range(25):
        junk = f"{n}-{i}-" + "x" * LABEL
        line = f'vllm:spec_decode_num_drafts_total{{engine="0",junk="{junk}",model_name="m"}} 1'
        lines += [line, line]
    return payload(lines)


def trtllm_body(n: int) -> bytes:
    """A TRT-LLM engine, and series whose values are not counters, each with a long new label."""
    lines = [f'trtllm_spec_decode_drafted_tokens_total{{token_position="0"}} {1000 * (n + 1)}',
             f'trtllm_spec_decode_accepted_tokens_total{{token_position="0"}} {600 * (n + 1)}']
    for i in range(25):
        lines.append(f'trtllm_spec_decode_drafted_tokens_total{{junk="{n}-{i}-{"y" * LABEL}",token_position="0"}} -1')
    return payload(lines)


def held_bytes(poller) -> int:
    seen = poller._seen_warnings
    return sys.getsizeof(seen) + sum(sys.getsizeof(w) for w in seen)


def churn(body) -> tuple[int, list[str], int, int]:
    async def go():
        n = {"i": 0}

        async def handle(request):
            n["i"] += 1
            return web.Response(body=body(n["i"]), content_type="text/plain")

        async with exporter(handle) as (app, _url, _session, clock):
            poller = app[POLLERS][0]
            results, before = [], rss()
            for _ in range(POLLS):
                clock.t += 5
                results.append(await poller.poll_once())
            return held_bytes(poller), results, before, rss()
    return asyncio.run(go())


def test_warnings_with_a_label_that_changes_every_poll_are_remembered_in_bounded_bytes():
    for name, body in (("vllm", vllm_body), ("trtllm", trtllm_body)):
        held, results, before, after = churn(body)
        print(f"{name}: {POLLS} polls of label churn: warnings held {held:,} bytes; "
              f"RSS {before / 1e6:.1f} -> {after / 1e6:.1f} MB")
        assert results == ["success"] * POLLS, results
        assert held < BOUND, f"{name}: {held:,} bytes of warnings held after {POLLS} polls"
