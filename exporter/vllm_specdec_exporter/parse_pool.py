"""Reading a payload, and the processes that read the big ones.

``read`` parses one payload and bounds it to what a target may hold: on the event loop
while the target's own parses are cheap and its payload not big, otherwise in a parsing
process (in a thread it would share the GIL: /healthz and /metrics stalled 0.5 s,
measured), in the lane that the target's own cost picks, so a real server's payload never
waits behind a hostile one (config.PARSE_ON_LOOP_SECONDS and below).
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import multiprocessing
import os
import signal
import threading
import time
import traceback
import weakref
from collections.abc import Callable, Mapping
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, replace
from typing import TypeVar

from . import config
from .adapters import WANTED, NoSpecDecodeFamilies, UnsupportedProducer, extract
from .admission import admit
from .model import Counters, SeriesKey, Snapshot
from .parser import NotPrometheusText, PayloadTooLarge, SeriesCache
from .scan import prepare

# Here and in each parsing process (it imports this module): a target's first parse is then
# charged its own cost only, and a real DP=8 payload's (~1 ms) stays on the event loop.
prepare(WANTED)


@dataclass(frozen=True, slots=True)
class Read:
    """A usable payload, bounded: its snapshot (without engines, warnings cut) and the engines kept."""

    snapshot: Snapshot
    kept: dict[SeriesKey, Counters]  # within the bounds
    refused: int
    forget: list[SeriesKey]


@dataclass(frozen=True, slots=True)
class Failure:
    """An expected way for a payload to be unusable, as a value (see read_payload)."""

    result: str
    error: str
    generation: dict[SeriesKey, float]


class WorkerError(Exception):
    """An unexpected exception in the parsing process, with its traceback as text."""

    def __init__(self, message: str, details: str):
        super().__init__(message)
        self.details = details

    def __reduce__(self) -> tuple[type[WorkerError], tuple[str, str]]:
        return WorkerError, (str(self), self.details)


@dataclass(frozen=True, slots=True)
class Payload:
    """One poll's payload and what bounds its reading: the target it came from (its lane and
    series cache), the producer named for it, the engines it holds with when each was last
    seen, and when its last poll was read (admission.admit)."""

    target: str
    body: bytes
    max_bytes: int
    producer: str | None
    held: Mapping[SeriesKey, float]
    max_series: int
    last_poll: float | None = None


async def read(payload: Payload) -> Read | Failure:
    """``read_payload``, in a parsing process for a big payload (in the lane the target's own
    cost picks: ``_heavy``). Raises ``WorkerError`` on an unexpected exception in the parse,
    or when the parsing process died or took too long."""
    size = len(payload.body)
    if _on_loop(payload.target, size):
        started = time.thread_time()  # CPU: a preempted parse is not a costly one
        got = read_payload(payload)
        _note_cost(payload.target, time.thread_time() - started, on_loop=True)
    else:
        got = await _in_worker(_heavy(payload.target, size), payload.target, read_payload, payload)
    if isinstance(got, WorkerError):
        raise got
    return got


# Each process's series caches, one per target (parser.SeriesCache); at most this many targets are
# remembered, here and in _HEAVY_UNTIL.
_CACHES: dict[str, SeriesCache] = {}
_TARGETS_REMEMBERED = 256


def _cache(target: str) -> SeriesCache:
    cache = _CACHES.pop(target, None) or SeriesCache()
    _CACHES[target] = cache  # the most recently used last
    if len(_CACHES) > _TARGETS_REMEMBERED:
        del _CACHES[next(iter(_CACHES))]
    return cache


def read_payload(p: Payload) -> Read | Failure | WorkerError:
    """Parse one payload and bound it to what may be held. Pure CPU; runs in the parsing
    process for big payloads, so what it hands back is small (at most ``p.max_series``
    engines, a few warnings) and the expected failures come back as values: exceptions
    with their own constructors do not survive pickling."""
    try:
        snapshot = extract(
            p.body, p.max_bytes, p.producer, cache=_cache(p.target), max_samples=p.max_series * config.MAX_SAMPLES_PER_ENGINE
        )
    except (PayloadTooLarge, NotPrometheusText, UnsupportedProducer, NoSpecDecodeFamilies) as e:
        return Failure(
            _RESULTS[next(c for c in _RESULTS if isinstance(e, c))], str(e), dict(getattr(e, "generation", None) or {})
        )
    except Exception as e:
        return WorkerError(f"{type(e).__name__}: {e}"[:500], traceback.format_exc()[-4000:])
    kept, refused, forget = admit(snapshot.engines, p.held, p.max_series, config.MAX_MODELS_PER_TARGET, p.last_poll)
    # What crosses back is small: warnings quote labels, so each is cut (twice the logged length: scrubbed then cut).
    cut = 2 * config.MAX_WARNING_CHARS
    small = replace(snapshot, engines={}, warnings=tuple(w[:cut] for w in snapshot.warnings[:200]))
    return Read(small, kept, refused, forget)


# In this order: the first class a failure is an instance of names it.
_RESULTS = {
    PayloadTooLarge: "too_large",
    NotPrometheusText: "not_prometheus",
    UnsupportedProducer: "unsupported_producer",
    NoSpecDecodeFamilies: "no_spec_decode",
}


# The parsing processes, one per lane, each started on its lane's first payload: the heavy
# lane (True) for the targets whose own payloads are big or slow to parse, the light lane
# for the others (config.PARSE_BUDGET_SECONDS), so a real server's payload never waits
# behind a hostile target's.
_POOLS: dict[bool, ProcessPoolExecutor] = {}
# One payload at a time per process, the others wait here (at most one per target: a
# target's polls are sequential). Per event loop: an asyncio.Lock belongs to one.
_LANES: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[bool, asyncio.Lock]] = weakref.WeakKeyDictionary()
# Target name -> until when (time.monotonic()) its parses go to the heavy lane, or stay off
# the event loop; and what its last parse cost (seconds).
_HEAVY_UNTIL: dict[str, float] = {}
_OFF_LOOP_UNTIL: dict[str, float] = {}
_LAST_COST: dict[str, float] = {}


def _on_loop(target: str, size: int) -> bool:
    """Whether this payload is parsed on the event loop: a small one of a target not yet
    measured, or one up to PARSE_ON_LOOP_MAX_BYTES of a target whose parses are cheap (the
    worker's round trip cost a real DP=8 poll more than its 0.6 ms parse); never while the
    target is held off the loop by a costly parse."""
    if time.monotonic() < _OFF_LOOP_UNTIL.get(target, -math.inf):
        return False
    cheap = _LAST_COST.get(target, math.inf) < config.PARSE_ON_LOOP_SECONDS
    return size <= config.PARSE_IN_WORKER_BYTES or (size <= config.PARSE_ON_LOOP_MAX_BYTES and cheap)


def _heavy(target: str, size: int) -> bool:
    """Whether this target's payload goes to the heavy lane: by its size, or by what the
    target's own last parses cost. Judged per target, never per size class alone: three
    targets serving 3.9 MiB of spec-decode lines each shared one process with a real
    server's 0.4 MB and cut its polls from 42 to 3 in 40 s."""
    return size > config.PARSE_BIG_BYTES or time.monotonic() < _HEAVY_UNTIL.get(target, -math.inf)


def _note_cost(target: str, seconds: float, on_loop: bool = False) -> None:
    """A parse's cost: a costly one on the loop holds the target off it (a worker's parse
    picks the next place by its cost alone: a process it starts may be slow to warm up)."""
    for held in (_HEAVY_UNTIL, _OFF_LOOP_UNTIL, _LAST_COST):
        if len(held) > _TARGETS_REMEMBERED:
            held.clear()  # bounded: names come from the config, this only guards a bug
    _LAST_COST[target] = seconds
    until = time.monotonic() + config.PARSE_HEAVY_HOLD_SECONDS
    if on_loop and seconds > config.PARSE_ON_LOOP_SECONDS:
        _OFF_LOOP_UNTIL[target] = until
    if seconds > config.PARSE_BUDGET_SECONDS:
        _HEAVY_UNTIL[target] = until


def _pool(big: bool) -> ProcessPoolExecutor:
    if big not in _POOLS:
        # spawn, not fork: the sidecar has threads (aiohttp's resolver), and a fork of a
        # threaded process can deadlock. A ProcessPoolExecutor (not multiprocessing.Pool)
        # notices a worker that died and fails its future instead of waiting forever.
        _POOLS[big] = ProcessPoolExecutor(
            1, mp_context=multiprocessing.get_context("spawn"), initializer=_exit_with_parent, initargs=(os.getpid(),)
        )
    return _POOLS[big]


PARENT_CHECK_SECONDS = 1.0


def _exit_with_parent(parent: int) -> None:
    """In a parsing process: exit once the sidecar is gone. A worker waits on its call queue,
    whose write end it holds too, so a sidecar killed outright (SIGKILL, the OOM killer)
    left its parsing processes running, ~160 MB each, for good. And ignore SIGINT: a terminal's
    Ctrl-C reaches the whole process group, and the sidecar shuts its workers down itself (their
    KeyboardInterrupt printed a multi-line traceback, outside the JSON log, one run in a few)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(PARENT_CHECK_SECONDS)
        os._exit(0)

    threading.Thread(target=watch, name="exit-with-parent", daemon=True).start()


def close_parse_pool(big: bool | None = None) -> None:
    """Kill the parsing processes, or one lane's (at shutdown: a parse in progress must
    not hold up SIGTERM)."""
    for lane in list(_POOLS) if big is None else [big]:
        pool = _POOLS.pop(lane, None)
        if pool is None:
            continue
        processes = list((getattr(pool, "_processes", None) or {}).values())  # no public handle on them
        pool.shutdown(wait=False, cancel_futures=True)
        for proc in processes:
            with contextlib.suppress(Exception):
                proc.kill()


_T = TypeVar("_T")


def _timed(fn: Callable[..., _T], *args: object) -> tuple[_T, float]:
    """In the parsing process: ``fn(*args)`` and the seconds it took there (the process's
    start and the wait for it excluded: they are not the target's cost)."""
    started = time.perf_counter()
    return fn(*args), time.perf_counter() - started


async def _in_worker(big: bool, target: str, fn: Callable[..., _T], *args: object) -> _T:
    """``fn(*args)`` in the parsing process of the given lane. The timeout counts the parse
    alone, not the wait for the process; as a process parses one payload at a time, one
    that dies or is killed fails that payload's poll only. What the parse cost there picks
    the target's next lane."""
    lock = _LANES.setdefault(asyncio.get_running_loop(), {}).setdefault(big, asyncio.Lock())
    async with lock:
        try:
            future = asyncio.get_running_loop().run_in_executor(_pool(big), _timed, fn, *args)
            # A starved or stuck worker must not hold the poll forever.
            got, seconds = await asyncio.wait_for(future, config.PARSE_TIMEOUT_SECONDS)
        except (TimeoutError, BrokenProcessPool) as e:
            close_parse_pool(big)  # the lane's next payload starts a fresh process
            _note_cost(target, math.inf)
            what = f"took over {config.PARSE_TIMEOUT_SECONDS} s" if isinstance(e, TimeoutError) else "died"
            raise WorkerError(f"the parsing process {what}; it was replaced", "") from None
    _note_cost(target, seconds)
    return got
