"""A vLLM V1 /metrics simulator driven by a scenario: healthy, collapse at T,
restart, idle, one bad engine.

Counters are integrated deterministically from the scenario's rates (no
randomness), so the acceptance a test injects is exactly what the counters say,
and they keep vLLM's invariants by construction: integer drafts, per-position
counts floored from a non-increasing survival curve, accepted = their sum, draft
tokens between accepted and k * drafts. The payload is rendered by
prometheus_client like vLLM's own, with the rest of vLLM's families so it has the
real size and shape: single-process (with ``_created`` and process metrics) or
multiprocess (neither).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace

from aiohttp import web
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.samples import Sample
from prometheus_client.utils import floatToGoString

from . import config
from .scenarios import Params, Scenario

# vLLM's bucket sets (they change between versions; the exporter never relies on them).
ITL_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0)
# fmt: off
LATENCY_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0,
                   960.0, 1920.0, 7680.0)
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0,
                160.0, 640.0, 2560.0)
# fmt: on
TOKEN_BUCKETS = tuple(float(m * 10**e) for e in range(6) for m in (1, 2, 5))[:16]  # vLLM's build_1_2_5_buckets(100000)
ITERATION_BUCKETS = (1.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0, 1024.0, 2048.0, 4096.0, 8192.0, 16384.0)


@dataclass(slots=True)
class EngineState:
    params: Params
    created: float
    drafts: int = 0
    drafts_f: float = 0.0
    tokens_f: float = 0.0
    pos_f: list[float] = field(default_factory=list)
    generation_f: float = 0.0

    def advance(self, dt: float) -> None:
        """Integrate dt seconds of traffic at the current parameters."""
        if dt <= 0:
            return
        p = self.params
        self.drafts_f += p.drafts_per_second * dt
        new = math.floor(self.drafts_f) - self.drafts  # whole drafts only: integer counters
        if new <= 0:
            return
        self.drafts += new
        self.tokens_f += new * p.effective_draft_length
        for i, s in enumerate(p.per_position):
            self.pos_f[i] += new * s
        self.generation_f += new * (1.0 + sum(p.per_position))

    def counters(self) -> tuple[int, int, int, list[int], int]:
        per_pos = [math.floor(v) for v in self.pos_f]
        return self.drafts, math.floor(self.tokens_f), sum(per_pos), per_pos, math.floor(self.generation_f)


class Simulation:
    """Scenario time runs at ``speed`` x the injected clock."""

    def __init__(
        self,
        scenario: Scenario,
        clock: Callable[[], float] = time.monotonic,
        speed: float = 1.0,
        wall: Callable[[], float] = time.time,
    ):
        self.scenario = scenario
        self._clock = clock
        self._speed = speed
        self._t0 = clock()
        self._now = 0.0
        self._next_phase = 0
        self._start_wall = wall()
        self.engines = [self._fresh(scenario.params, self._start_wall) for _ in range(scenario.engines)]

    def _fresh(self, params: Params, created: float) -> EngineState:
        return EngineState(params, created, pos_f=[0.0] * self.scenario.k)

    @property
    def elapsed(self) -> float:
        return self._now

    def advance_to(self, t: float) -> None:
        """Advance scenario time to t seconds, applying phases in order."""
        phases = self.scenario.phases
        while self._next_phase < len(phases) and phases[self._next_phase].at <= t:
            phase = phases[self._next_phase]
            self._step(phase.at)
            for i in phase.engines if phase.engines is not None else range(len(self.engines)):
                params = replace(self.engines[i].params, **phase.changes)
                if phase.restart:
                    # Started at the restart's scenario time (at any speed, and under a test's clock).
                    self.engines[i] = self._fresh(params, self._start_wall + phase.at)
                else:
                    self.engines[i].params = params
            self._next_phase += 1
        self._step(t)

    def _step(self, t: float) -> None:
        dt = t - self._now
        if dt > 0:
            for e in self.engines:
                e.advance(dt)
            self._now = t

    def tick(self) -> None:
        self.advance_to((self._clock() - self._t0) * self._speed)

    def render(self) -> bytes:
        """The spec-decode and vLLM families at the current scenario time, as text (no process metrics)."""
        registry = CollectorRegistry(auto_describe=False)
        registry.register(_Families(self))
        return generate_latest(registry)

    def families(self) -> Iterable[Metric]:
        s = self.scenario
        single = s.form == "single-process"
        labels = [config.LABEL_ENGINE, config.LABEL_MODEL]

        def counter(name: str, doc: str, extra: list[str] | None = None) -> CounterMetricFamily:
            return CounterMetricFamily(name, doc, labels=[*labels, *(extra or [])])

        drafts = counter("vllm:spec_decode_num_drafts", "Number of spec decoding drafts.")
        tokens = counter("vllm:spec_decode_num_draft_tokens", "Number of draft tokens.")
        accepted = counter("vllm:spec_decode_num_accepted_tokens", "Number of accepted tokens.")
        per_pos = counter("vllm:spec_decode_num_accepted_tokens_per_pos", "Accepted tokens per draft position.", ["position"])
        generation = counter("vllm:generation_tokens", "Number of generation tokens processed.")
        prompt = counter("vllm:prompt_tokens", "Number of prefill tokens processed.")
        success = counter("vllm:request_success", "Count of successfully processed requests.", ["finished_reason"])
        preempt = counter("vllm:num_preemptions", "Cumulative number of preemption from the engine.")
        cache_q = counter("vllm:prefix_cache_queries", "Prefix cache queries, in terms of number of queried tokens.")
        cache_h = counter("vllm:prefix_cache_hits", "Prefix cache hits, in terms of number of cached tokens.")
        running = GaugeMetricFamily("vllm:num_requests_running", "Number of requests in model execution batches.", labels=labels)
        waiting = GaugeMetricFamily("vllm:num_requests_waiting", "Number of requests waiting to be processed.", labels=labels)
        kv = GaugeMetricFamily("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.", labels=labels)
        hists = {
            "vllm:inter_token_latency_seconds": ("Histogram of inter-token latency in seconds.", ITL_BUCKETS),
            "vllm:request_time_per_output_token_seconds": (
                "Histogram of time_per_output_token_seconds per request.",
                ITL_BUCKETS,
            ),
            "vllm:time_to_first_token_seconds": ("Histogram of time to first token in seconds.", TTFT_BUCKETS),
            "vllm:e2e_request_latency_seconds": ("Histogram of e2e request latency in seconds.", LATENCY_BUCKETS),
            "vllm:request_queue_time_seconds": ("Histogram of time spent in WAITING phase for request.", LATENCY_BUCKETS),
            "vllm:request_inference_time_seconds": ("Histogram of time spent in RUNNING phase for request.", LATENCY_BUCKETS),
            "vllm:request_prefill_time_seconds": ("Histogram of time spent in PREFILL phase for request.", LATENCY_BUCKETS),
            "vllm:request_decode_time_seconds": ("Histogram of time spent in DECODE phase for request.", LATENCY_BUCKETS),
            "vllm:request_prompt_tokens": ("Number of prefill tokens processed.", TOKEN_BUCKETS),
            "vllm:request_generation_tokens": ("Number of generation tokens processed.", TOKEN_BUCKETS),
            "vllm:request_params_max_tokens": ("Histogram of the max_tokens request parameter.", TOKEN_BUCKETS),
            "vllm:request_max_num_generation_tokens": (
                "Histogram of maximum number of requested generation tokens.",
                TOKEN_BUCKETS,
            ),
            "vllm:iteration_tokens_total": ("Histogram of number of tokens per engine_step.", ITERATION_BUCKETS),
        }
        hist_families = {name: HistogramMetricFamily(name, doc, labels=labels) for name, (doc, _) in hists.items()}

        for i, e in enumerate(self.engines):
            lv = [str(i), s.model_name]
            created = e.created if single else None
            d, t, a, pp, g = e.counters()
            drafts.add_metric(lv, d, created=created)
            tokens.add_metric(lv, t, created=created)
            accepted.add_metric(lv, a, created=created)
            for pos, v in enumerate(pp):
                per_pos.add_metric([*lv, str(pos)], v, created=created)
            generation.add_metric(lv, g, created=created)
            requests = g // max(1, s.output_tokens_per_request)
            prompt.add_metric(lv, requests * 1024, created=created)
            for reason, share in (("stop", 0.9), ("length", 0.1), ("abort", 0.0)):
                success.add_metric([*lv, reason], math.floor(requests * share), created=created)
            preempt.add_metric(lv, 0, created=created)
            cache_q.add_metric(lv, requests * 1024, created=created)
            cache_h.add_metric(lv, requests * 512, created=created)
            busy = e.params.drafts_per_second > 0
            running.add_metric(lv, 8.0 if busy else 0.0)
            waiting.add_metric(lv, 0.0)
            kv.add_metric(lv, 0.42 if busy else 0.0)
            step = e.params.step_latency_seconds
            observations = {
                "vllm:inter_token_latency_seconds": (d, step, d * step),  # once per decode step
                "vllm:request_time_per_output_token_seconds": (requests, step / 2, requests * step / 2),
                "vllm:time_to_first_token_seconds": (requests, 0.2, requests * 0.2),
                "vllm:request_prompt_tokens": (requests, 1024, requests * 1024),
                "vllm:request_generation_tokens": (requests, s.output_tokens_per_request, g),
                "vllm:request_params_max_tokens": (requests, 4096, requests * 4096),
                "vllm:request_max_num_generation_tokens": (requests, 4096, requests * 4096),
                "vllm:iteration_tokens_total": (d, 64, d * 64),
            }
            for name, family in hist_families.items():
                count, value, total = observations.get(name, (requests, 20.0, requests * 20.0))
                # prometheus_client.utils is untyped: floatToGoString(float) -> str
                buckets = [(floatToGoString(b), count if value <= b else 0) for b in hists[name][1]]  # type: ignore[no-untyped-call]
                family.add_metric(lv, [*buckets, ("+Inf", count)], total)
                if single:
                    family.samples.append(Sample(f"{name}_created", dict(zip(labels, lv, strict=True)), e.created))

        spec = [drafts, tokens, accepted, per_pos]
        rest = [running, waiting, kv, cache_q, cache_h, preempt, prompt, generation, success, *hist_families.values()]
        # Multiprocess mode orders families differently; the exporter must not care.
        return [*rest, *spec] if single else [*spec, *reversed(rest)]


class _Families:
    def __init__(self, simulation: Simulation):
        self.simulation = simulation

    def collect(self) -> Iterable[Metric]:
        return self.simulation.families()


class _Collector(_Families):
    """What the simulator's /metrics serves: the scenario advanced to now."""

    def collect(self) -> Iterable[Metric]:
        self.simulation.tick()
        return self.simulation.families()


def create_simulator_app(simulation: Simulation) -> web.Application:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Collector(simulation))
    if simulation.scenario.form == "single-process":
        from prometheus_client import GCCollector, PlatformCollector, ProcessCollector

        for collector in (GCCollector, PlatformCollector, ProcessCollector):
            collector(registry=registry)

    async def metrics(request: web.Request) -> web.Response:
        return web.Response(body=generate_latest(registry), headers={"Content-Type": "text/plain; version=0.0.4; charset=utf-8"})

    async def index(request: web.Request) -> web.Response:
        s = simulation.scenario
        return web.Response(
            text=f"vLLM /metrics simulator: scenario {s.name} ({s.description}); "
            f"{s.engines} engines, k={s.k}, {s.form}; t={simulation.elapsed:.0f}s. See /metrics.\n"
        )

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/", index)
    return app
