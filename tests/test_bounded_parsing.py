"""Issue 19 item 5: hostile targets cannot starve a healthy one of parsing. Five targets
serve 32 MiB payloads of spec-decode lines (seconds of parsing each); a healthy target
beside them (a real server's ~0.5 MB payload, parsed in a worker process too) keeps its
poll interval and its figures fresh. Before, the one parsing process took payloads in
turn, so the healthy poll waited behind every hostile parse (tens of seconds). The real
`serve` process; the worker's peak memory is in bench/bench_bounds.py."""

from __future__ import annotations

import itertools
import tempfile
import time

import pytest
from http_fixtures import LoopbackServer, prom
from test_scale import biggest_payload, get, start_serve

V1 = "vllm:spec_decode_num_"
HOSTILE = 5


def healthy_payload(n: int) -> bytes:
    """8 engines (k=2) growing with the poll number, and ~0.5 MB of other families, as a
    TP=8/DP=8 vLLM serves: over the size parsed on the event loop."""
    lines = []
    for e in range(8):
        lab = f'engine="{e}",model_name="m"'
        d = 1000 * (n + 1)
        lines += [f"{V1}drafts_total{{{lab}}} {d}", f"{V1}draft_tokens_total{{{lab}}} {2 * d}",
                  f"{V1}accepted_tokens_total{{{lab}}} {int(1.5 * d)}",
                  f'{V1}accepted_tokens_per_pos_total{{{lab},position="0"}} {int(0.9 * d)}',
                  f'{V1}accepted_tokens_per_pos_total{{{lab},position="1"}} {int(0.6 * d)}']
    lines += [f'vllm:iteration_tokens_total_bucket{{engine="{i % 8}",le="{i}",model_name="m"}} {i}' for i in range(7000)]
    return ("\n".join(lines) + "\n").encode()


@pytest.mark.timeout(600)
def test_a_healthy_target_keeps_its_polls_beside_five_hostile_ones():
    hostile = biggest_payload(32 * 1024 * 1024 - 4096)
    assert len(healthy_payload(0)) > 256 * 1024
    servers = [LoopbackServer(healthy_payload)] + [LoopbackServer(lambda n: prom(hostile)) for _ in range(HOSTILE)]
    seen: list[float] = []
    healthy = servers[0]
    healthy.handler = lambda n: (seen.append(time.monotonic()), prom(healthy_payload(n)))[1]
    for server in servers:
        server.__enter__()
    try:
        with tempfile.NamedTemporaryFile("w", suffix=".yaml") as cfg:
            cfg.write("targets:\n" + "".join(f"  - {{name: t{i}, url: '{s.url}'}}\n" for i, s in enumerate(servers))
                      + "poll: {interval: 1s, timeout: 4s}\nstaleness: 10s\n")
            cfg.flush()
            proc, port = start_serve("--config.file", cfg.name)
            try:
                deadline = time.monotonic() + 120
                while sum(s.requests for s in servers[1:]) < 2 * HOSTILE and time.monotonic() < deadline:
                    time.sleep(0.5)  # every hostile target fetched and parsed at least once
                start = time.monotonic()
                time.sleep(30)
                window = [t for t in seen if t >= start]
                gaps = [b - a for a, b in itertools.pairwise(window)] or [30.0]  # none: no two polls
                text = get(port, "/metrics", timeout=30)[1].decode()
                up = {line.split('"')[1]: float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                      if line.startswith("vllm_specdec_up{")}
                hostile_polls = sum(s.requests for s in servers[1:])
                print(f"healthy target beside {HOSTILE} hostile ones (32 MiB): {len(window)} polls in 30 s, "
                      f"longest gap {max(gaps):.2f} s; {hostile_polls} hostile fetches in all")
                assert up["t0"] == 1
                assert len(window) >= 10, window  # a 1 s interval: ~25 polls
                assert max(gaps) < 6.0, gaps  # generous: a shared 2-core machine parsing 32 MiB payloads
                assert 'vllm_specdec_mean_acceptance_length{model_name="m",target="t0",window="1m"}' in text  # fresh
            finally:
                proc.kill()
                proc.wait()
    finally:
        for server in servers:
            server.__exit__(None, None, None)
