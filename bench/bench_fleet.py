"""Fleet scale (`make bench`): the shipped rules on a real Prometheus 2.42 scraping
10,000 (and 1,000) simulated engines, both variants, measured by Prometheus itself.
Prints `name: value` lines.

Set-up, per variant and fleet size (each on its own Prometheus; the two variants record
the same names):

- The pod payload is captured once from the real programs: `simulate` (8 engines, k=3)
  and `serve` polling it. The sidecar variant serves that sidecar's whole /metrics per
  pod (about 330 series); the vllm-direct variant serves the families its rules read
  (vLLM's spec-decode counters, generation tokens and the per-request acceptance
  histogram, about 60 series per engine with `_created`), not vLLM's other ~2,500
  series per pod, which are the user's cost whatever rules they load.
- One cheap generator on loopback serves many pods per target (50 pods a target),
  with `namespace`, `pod` and `instance` labels (honor_labels), counters growing at
  constant per-engine rates. Scrape and evaluation interval 30 s (kube-prometheus-stack's
  defaults), the production ranges (5m, 30m, 1h, 2m, 1d): nothing is shortened.
- The long windows are full from the first evaluation: before the rules are loaded, the
  generator's own counters are backfilled for the last 65 minutes, and the recorded
  series that the rules read over a range or with `offset` (the day-long history) for
  the last 24 h 30 m, through Prometheus's remote-write receiver in time order (so they
  land in the head block, as a day of real running leaves them), each at the interval
  of the group that records it (30 s, or the long group's 3 m).
  Only the series a rule reads over a range are backfilled: the other sidecar gauges
  hold minutes of samples, so the RSS is a lower bound on the 3 h head of a real server.
- Then the scrape config alone is loaded (/-/reload) and Prometheus's CPU measured, then
  with the reference file, then with the rules: each over whole garbage-collection cycles
  (CpuWindow), the rules' from the first collection after every group's first evaluation
  (which creates the recorded series) over at least two of the slowest group's periods,
  each group charged its share of that window (share_of_window); Prometheus's own
  prometheus_rule_group_last_duration_seconds read every 2 s meanwhile, and scraping alone
  measured again after the rules are unloaded.
  fleet_rule_eval_seconds is the worst sum over the groups evaluated every interval,
  fleet_rule_eval_long_share the long group's worst duration over its own interval. On a
  machine shared with other work those wall-clock durations grow with the load average
  (printed beside them); rules_cpu_seconds_per_interval (Prometheus's CPU seconds per
  interval with the rules minus without) does not. The costliest rules of the last
  evaluation and each group's worst duration go to stderr.

    .venv/bin/python bench/bench_fleet.py [--engines 1000,10000] [--variants sidecar,vllm-direct] [--gogc 200]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import shutil
import signal
import statistics
import struct
import sys
import tempfile
import threading
import time
import urllib.parse
import urllib.request
from collections import defaultdict
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import numpy as np
import yaml
from vllm_specdec_exporter import config as c
from vllm_specdec_exporter.generators import rules

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))  # the one process harness
from processes import get, wait_for
from processes import start as start_listening
from vllm_specdec_exporter import durations

CLI = Path(sys.executable).parent / "vllm-specdec-exporter"
ENGINES_PER_POD = 8
K = 3
PODS_PER_TARGET = 50
INTERVAL = 30  # scrape and evaluation, seconds
RAW_HISTORY = 65 * 60  # the longest raw range (1h) and a margin
RECORDED_HISTORY = 24 * 3600 + 45 * 60  # 1d, the drop alert's offset (30m) and a margin
MODELS = ("deepseek-ai/DeepSeek-V4-Pro", "deepseek-ai/DeepSeek-V4-Flash")
NAMESPACES = 10
TARGET_EVALUATIONS = 10  # of each group at the evaluation interval (issue 35: a median over ten)
# Seconds of scraping alone (before and after the rules), then of the reference rules: their CPU. As
# long as the rules' own CPU window: over four intervals, scraping alone moved 0.95 -> 1.47 CPU s an
# interval between runs of one payload (stop 56), and the rules are charged net of it.
REFERENCE_WINDOW = TARGET_EVALUATIONS * INTERVAL
ALTERNATE_ROUNDS = 2  # --alternate: each file (and the shipped rules) measured this many times, in turn
# Go's garbage-collector target in Prometheus's environment, as docs/scale.md sizes a Prometheus for
# 10,000 engines: Go's default (100) marks the whole heap twice as often, 0.4-1.4 CPU s an interval more.
PROMETHEUS_GOGC = "200"
HOLD = [0.0]  # --hold: keep each Prometheus up this long after measuring (to try queries against it)


# --- the pod payloads, captured from the real programs ---
LINE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? (\S+)$")
LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')


def parse(text: str) -> list[tuple[str, dict[str, str], float]]:
    out = []
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = LINE.match(line)
        if m:
            out.append((m[1], dict(LABEL.findall(m[2] or "")), float(m[3])))
    return out


def capture_payloads(tmp: Path) -> tuple[str, str]:
    """One pod's sidecar /metrics and vLLM /metrics: 8 engines of DeepSeek MTP, k=3."""
    (tmp / "scenario.yaml").write_text(
        yaml.safe_dump(
            {
                "model_name": MODELS[0],
                "engines": ENGINES_PER_POD,
                "k": K,
                "drafts_per_second": 40,
                "per_position": [0.9, 0.7, 0.5],
            }
        )
    )
    with ExitStack() as es:
        _, sim = start_listening(
            es,
            [str(CLI), "simulate", "--scenario", str(tmp / "scenario.yaml"), "--web.listen-address", "127.0.0.1:0"],
            tmp / "sim.log",
        )
        (tmp / "exporter.yaml").write_text(
            yaml.safe_dump(
                {
                    "targets": [{"name": "vllm", "url": f"http://{sim}/metrics"}],
                    "web": {"listen_address": "127.0.0.1:0"},
                    "poll": {"interval": "1s"},
                }
            )
        )
        _, exp = start_listening(es, [str(CLI), "serve", "--config.file", str(tmp / "exporter.yaml")], tmp / "exporter.log")
        wait_for(lambda: b"vllm_specdec_drafts_total{" in get(f"http://{exp}/metrics"), 30, "the sidecar's first poll")
        time.sleep(4)
        return get(f"http://{exp}/metrics").decode(), get(f"http://{sim}/metrics").decode()


# --- the fleet model ---
@dataclass
class Series:
    name: str
    labels: dict[str, str]  # without job
    rate: float  # per second; 0 for a gauge
    value: float  # the gauge's value
    backfill: bool  # read over a range by the rules


@dataclass
class Fleet:
    variant: str
    pods: int
    per_target: list[list[Series]] = field(default_factory=list)
    t0: float = 0.0  # counters are rate * (t - t0)

    @property
    def engines(self) -> int:
        return self.pods * ENGINES_PER_POD

    def all(self):
        for group in self.per_target:
            yield from group


def _request_histogram(engine_labels: dict[str, str]) -> list[tuple[str, dict[str, str], float]]:
    """vLLM's per-request acceptance histogram (PR #44487's buckets), 2 finished requests/s an engine."""
    h = c.VLLM_V1_REQUEST_ACCEPTANCE
    edges = ("0.0", "0.05", "0.1", "0.2", "0.3", "0.4", "0.5", "0.6", "0.7", "0.8", "0.9", "0.95", "0.98", "1.0", "+Inf")
    cumulative = (0, 1, 2, 4, 6, 9, 14, 20, 27, 33, 37, 38, 39, 40, 40)
    out = [(f"{h}_bucket", {**engine_labels, "le": e}, 2 * n / 40) for e, n in zip(edges, cumulative, strict=True)]
    return [*out, (f"{h}_count", dict(engine_labels), 2.0), (f"{h}_sum", dict(engine_labels), 1.3)]


def pod_template(variant: str, sidecar_text: str, vllm_text: str) -> list[tuple[str, dict[str, str], float, bool]]:
    """(name, labels, value, is_counter) of one pod; a counter's value is its count after ~5 s."""
    if variant == "sidecar":
        lines = parse(sidecar_text)
        counter = re.compile(r".*(_total|_count|_sum|_bucket)$")
        return [(n, lab, v, bool(counter.match(n))) for n, lab, v in lines]
    keep = (c.VLLM_V1_DRAFTS, c.VLLM_V1_DRAFT_TOKENS, c.VLLM_V1_ACCEPTED, c.VLLM_V1_ACCEPTED_PER_POS, c.VLLM_V1_GENERATION_TOKENS)
    keep_created = tuple(k.removesuffix("_total") + "_created" for k in keep)
    out = []
    for n, lab, v in parse(vllm_text):
        if n in keep:
            out.append((n, lab, v, True))
        elif n in keep_created:
            out.append((n, lab, v, False))
    for e in sorted({lab["engine"] for _n, lab, _v, _c in out if "engine" in lab}, key=int):
        for n, lab, rate in _request_histogram({"engine": e, "model_name": MODELS[0]}):
            out.append((n, lab, rate * 5, True))
    return out


def read_over_range(text: str) -> tuple[set[str], dict[str, float]]:
    """The raw metric names the rule file ``text`` reads with a range or an offset, and the
    recorded names it reads so, each with the history it needs (its longest range + offset)."""
    exprs = [r["expr"] for g in yaml.safe_load(text)["groups"] for r in g["rules"]]
    raw: set[str] = set()
    recorded: dict[str, float] = {}
    sel = r"([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?(?:\[([0-9a-z]+)\])?(?: offset ([0-9a-z]+))?"
    for e in exprs:
        for m in re.finditer(sel, e):
            if m[3] is None and m[4] is None:
                continue
            need = sum(durations.parse_duration(x) for x in (m[3], m[4]) if x)
            if rules.RECORDED_NAME.fullmatch(m[1]):
                recorded[m[1]] = max(recorded.get(m[1], 0.0), need)
            else:
                raw.add(m[1])
    return raw, recorded


def group_intervals(text: str) -> dict[str, float]:
    """Each group's evaluation interval in seconds (its own `interval`, else the global one)."""
    return {g["name"]: durations.parse_duration(g.get("interval", f"{INTERVAL}s")) for g in yaml.safe_load(text)["groups"]}


def recorded_every(text: str) -> dict[str, float]:
    """Each recorded name and how often its group records it: the history is backfilled at that step."""
    return {
        r["record"]: durations.parse_duration(g.get("interval", f"{INTERVAL}s"))
        for g in yaml.safe_load(text)["groups"]
        for r in g["rules"]
        if "record" in r
    }


def build_fleet(variant: str, pods: int, sidecar_text: str, vllm_text: str, t0: float, rule_text: str) -> Fleet:
    template = pod_template(variant, sidecar_text, vllm_text)
    raw_ranged, _ = read_over_range(rule_text)
    # A pod's counters grow at value / 5 s (the capture's age): ratios as the simulator made them.
    fleet = Fleet(variant, pods, t0=t0)
    for p in range(pods):
        spread = 0.8 + 0.4 * ((p * 7919) % 101) / 100
        pod_labels = {
            "namespace": f"inference-{p % NAMESPACES}",
            "pod": f"vllm-{p:05d}",
            "instance": f"10.{p // 250}.{p % 250}.7:{9100 if variant == 'sidecar' else 8000}",
        }
        model = MODELS[p % len(MODELS)]
        if p % PODS_PER_TARGET == 0:
            fleet.per_target.append([])
        for n, lab, v, is_counter in template:
            labels = {**lab, **pod_labels}
            if "model_name" in labels:
                labels["model_name"] = model
            fleet.per_target[-1].append(
                Series(
                    n,
                    labels,
                    spread * v / 5 if is_counter else 0.0,
                    v,
                    (is_counter and n in raw_ranged) or n == rules.m.name("up"),
                )
            )
    return fleet


def summed_positions(series: list[Series]) -> dict[int, list[int]]:
    """Per vLLM accepted-token series (its index), the indices of its engine's per-position series:
    its value is their sum, as vLLM counts it (each counter floored alone would differ from the sum
    by up to k tokens, which the invariant alert reads as a broken producer)."""
    key = lambda s: tuple(sorted((k, v) for k, v in s.labels.items() if k != c.LABEL_POSITION))
    positions: dict[tuple, list[int]] = defaultdict(list)
    for i, s in enumerate(series):
        if s.name == c.VLLM_V1_ACCEPTED_PER_POS:
            positions[key(s)].append(i)
    return {i: positions[key(s)] for i, s in enumerate(series) if s.name == c.VLLM_V1_ACCEPTED and positions.get(key(s))}


def fmt_labels(labels: dict[str, str]) -> str:
    return ",".join(f'{k}="{v}"' for k, v in labels.items())


class Generator:
    """Serves target i's pods at /metrics?shard=i; counters computed at request time."""

    def __init__(self, fleet: Fleet):
        self.shards = []
        for group in fleet.per_target:
            counting = [s for s in group if s.rate]
            counters = [(f"{s.name}{{{fmt_labels(s.labels)}}} ", s.rate) for s in counting]
            gauges = "".join(f"{s.name}{{{fmt_labels(s.labels)}}} {s.value:g}\n" for s in group if not s.rate)
            self.shards.append((counters, gauges.encode(), summed_positions(counting)))
        self.t0 = fleet.t0
        gen = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):
                shard = int(urllib.parse.parse_qs(urllib.parse.urlsplit(self.path).query)["shard"][0])
                body = gen.render(shard)
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.address = f"127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def render(self, shard: int) -> bytes:
        counters, gauges, summed = self.shards[shard]
        dt = time.time() - self.t0
        values = [math.floor(r * dt) for _p, r in counters]
        for i, parts in summed.items():
            values[i] = sum(values[j] for j in parts)
        return "".join([f"{p}{v}\n" for (p, _r), v in zip(counters, values, strict=True)]).encode() + gauges

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.server.shutdown()
        self.server.server_close()


# --- backfill through the remote-write receiver (protobuf and snappy written by hand) ---
def varint(n: int) -> bytes:
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def field_bytes(number: int, payload: bytes) -> bytes:
    return varint(number << 3 | 2) + varint(len(payload)) + payload


def labels_bytes(name: str, labels: dict[str, str]) -> bytes:
    items = sorted({"__name__": name, **labels}.items())
    return b"".join(field_bytes(1, field_bytes(1, k.encode()) + field_bytes(2, v.encode())) for k, v in items)


SAMPLE = np.dtype([("tag", "u1"), ("len", "u1"), ("vtag", "u1"), ("value", "<f8"), ("ttag", "u1"), ("ts", "u1", (6,))])


def samples_bytes(values: np.ndarray, ts_varints: np.ndarray) -> bytes:
    """Sample{value=1 double, timestamp=2 int64} messages, each 18 bytes (6-byte varint timestamps)."""
    a = np.empty(len(values), SAMPLE)
    a["tag"], a["len"], a["vtag"], a["ttag"] = 0x12, 16, 0x09, 0x10
    a["value"] = values
    a["ts"] = ts_varints
    return a.tobytes()


def ts_varints(ms: np.ndarray) -> np.ndarray:
    out = np.empty((len(ms), 6), "u1")
    for i in range(6):
        out[:, i] = (ms >> (7 * i)) & 0x7F
    out[:, :5] |= 0x80
    assert (ms < 1 << 42).all() and (ms >= 1 << 35).all()
    return out


def snappy_literal(data: bytes) -> bytes:
    """A valid snappy block that stores ``data`` as literals (no compression needed on loopback)."""
    out = bytearray(varint(len(data)))
    step = 1 << 24
    for i in range(0, len(data), step):
        chunk = data[i : i + step]
        out += bytes([63 << 2]) + struct.pack("<I", len(chunk) - 1) + chunk
    return bytes(out)


def remote_write(base: str, timeseries: list[bytes]) -> None:
    body = snappy_literal(b"".join(field_bytes(1, ts) for ts in timeseries))
    req = urllib.request.Request(
        f"{base}/api/v1/write",
        data=body,
        method="POST",
        headers={
            "Content-Encoding": "snappy",
            "Content-Type": "application/x-protobuf",
            "X-Prometheus-Remote-Write-Version": "0.1.0",
        },
    )
    with urllib.request.urlopen(req, timeout=120) as resp:
        resp.read()


def recorded_history(fleet: Fleet, o: rules.Options, rule_text: str) -> list[tuple[str, dict[str, str], float, float]]:
    """The recorded series the rules read over a range or with offset, at the values the rules
    would have recorded from the generator's constant rates: (name, labels, value)."""
    src = rules.VARIANTS[fleet.variant]
    _, needs = read_over_range(rule_text)
    family = {
        src.drafts: "drafts",
        src.draft_tokens: "draft_tokens",
        src.accepted: "accepted_tokens",
        src.per_pos: "position_accepted_tokens",
        src.generation: "generation_tokens",
    }
    levels = dict(rules.levels(src, o))
    # The reference kept per k: the model's level, with k as a label (every pod here drafts K).
    levels[rules.K_LEVEL] = levels[rules.MODEL_LEVEL]
    out = []
    for rec in sorted(needs):
        level, metric, op = rec.split(":")
        metric = metric.removeprefix(f"{rules.P}_")
        keep = levels[level]
        k_label = {rules.K_LABEL: str(K)} if level == rules.K_LEVEL else {}
        per_position = metric.startswith("position_")
        sums: dict[tuple, dict[str, float]] = defaultdict(lambda: defaultdict(float))
        positions: dict[tuple, dict[str, float]] = defaultdict(lambda: defaultdict(float))
        for s in fleet.all():
            fam = family.get(s.name)
            if fam is None:
                continue
            key = tuple(s.labels.get(k, "") for k in keep)
            sums[key][fam] += s.rate
            if fam == "position_accepted_tokens":
                positions[key][s.labels[c.LABEL_POSITION]] += s.rate
        for key, r in sums.items():
            labels = {k: v for k, v in zip(keep, key, strict=True) if v}
            if op == "max" and metric == "num_speculative_tokens":
                values = {None: float(K)}
            elif op.startswith("rate") and metric == "position_drafts":  # the drafts, read with the positions
                values = {None: r["drafts"]}
            elif op.startswith("rate") and metric == rules.LONG_GROUP_ACCEPTED:  # read with the draft tokens
                values = {None: r["accepted_tokens"]}
            elif per_position and op.startswith("rate"):
                values = positions[key]
            elif per_position and op.startswith("ratio_rate") and metric == "position_acceptance_ratio":
                values = {p: v / r["drafts"] for p, v in positions[key].items()}
            elif op.startswith("rate") and metric in r:
                values = {None: r[metric]}
            elif op.startswith("ratio_rate") and metric in (
                "mean_acceptance_length",
                "settled_mean_acceptance_length",
                "settled_reference_mean_acceptance_length",
            ):
                # (every simulated pod has served for the whole history: all settled, none a newcomer)
                values = {None: 1 + r["accepted_tokens"] / r["drafts"]}
            elif op.startswith("ratio_rate") and metric == "acceptance_ratio":
                values = {None: r["accepted_tokens"] / r["draft_tokens"]}
            elif op.startswith("ratio_rate") and metric == "position0_acceptance_ratio":
                values = {"0": positions[key]["0"] / r["drafts"]}  # the best server's: every pod here is alike
            elif op.startswith("ratio_rate") and metric == "position1_conditional_acceptance_ratio":
                values = {None: positions[key]["1"] / positions[key]["0"]}
            else:
                raise SystemExit(f"bench_fleet: no model of the recorded series {rec} (read over a range)")
            for position, value in values.items():
                extra = {} if position is None else {c.LABEL_POSITION: position}
                out.append((rec, {**labels, **k_label, **extra}, value, needs[rec]))
    return out


def backfill(base: str, fleet: Fleet, end: float, o: rules.Options, rule_text: str) -> tuple[int, float]:
    """Write the history in time order, 10-minute slices; returns (samples, seconds)."""
    started = time.monotonic()
    raw_series = [s for s in fleet.all() if s.backfill]
    raw = [(labels_bytes(s.name, {**s.labels, "job": "fleet"}), s.rate, s.value) for s in raw_series]
    summed = summed_positions(raw_series)
    # A series of the long group has a sample every few minutes, as its group would have left.
    every = recorded_every(rule_text)
    recorded = [
        (labels_bytes(n, lab), v, end - need - 600, every[n]) for n, lab, v, need in recorded_history(fleet, o, rule_text)
    ]
    first = min([r[2] for r in recorded] + [end - RAW_HISTORY]) // INTERVAL * INTERVAL
    raw_first = end - RAW_HISTORY
    samples = 0
    slice_seconds = 600
    t = first
    while t < end:
        ts = np.arange(t, min(t + slice_seconds, end), INTERVAL, dtype=np.float64)
        ms = (ts * 1000).astype(np.int64)
        tv = ts_varints(ms)
        batch: list[bytes] = []
        for lab, v, start, step in recorded:
            keep = (ts >= start) & (ts % step == 0)
            if keep.any():
                batch.append(lab + samples_bytes(np.full(int(keep.sum()), v), tv[keep]))
                samples += int(keep.sum())
        if ts[-1] >= raw_first:
            keep = ts >= raw_first
            rts, rtv = ts[keep], tv[keep]
            values = [np.floor(rate * (rts - fleet.t0)) if rate else np.full(len(rts), value) for _lab, rate, value in raw]
            for i, parts in summed.items():
                values[i] = sum(values[j] for j in parts)
            for (lab, _rate, _value), v in zip(raw, values, strict=True):
                batch.append(lab + samples_bytes(v, rtv))
                if len(batch) >= 20000:
                    remote_write(base, batch)
                    batch = []
            samples += len(raw) * len(rts)
        if batch:
            remote_write(base, batch)
        t += slice_seconds
    return samples, time.monotonic() - started


# --- one measured run ---
def prom_metrics(base: str) -> dict[str, float]:
    out = {}
    for line in get(f"{base}/metrics").decode().splitlines():
        if (
            line.startswith("prometheus_rule_group_")
            or line.startswith("process_resident_memory_bytes")
            or line.startswith("prometheus_tsdb_head_series ")
            or line.startswith("go_gc_duration_seconds_count ")
            or line.startswith("go_memstats_next_gc_bytes ")
            or line.startswith("prometheus_tsdb_compactions_total ")
        ):
            key, _, value = line.rpartition(" ")
            out[key] = float(value)
    return out


def evaluations(pm: dict[str, float], groups: list[str]) -> dict[str, tuple[float, float]]:
    """Each group's last evaluation in ``pm`` (prom_metrics): (when it ran, how long it took)."""
    last, stamps = {}, {}
    for key, v in pm.items():
        for g in groups:
            if f';{g}"' in key:  # rule_group="<file>;<group>"
                if key.startswith("prometheus_rule_group_last_duration_seconds"):
                    last[g] = v
                elif key.startswith("prometheus_rule_group_last_evaluation_timestamp_seconds"):
                    stamps[g] = v
    return {g: (stamps[g], last[g]) for g in groups if g in stamps and g in last}


def median(values: list[float]) -> float:
    """The upper median (as the group lines always printed it); nan for no value."""
    return statistics.median_high(values) if values else math.nan


def query(base: str, q: str) -> list[dict]:
    out = json.loads(get(f"{base}/api/v1/query?query={urllib.parse.quote(q)}"))
    assert out["status"] == "success", out
    return out["data"]["result"]


def settle(base: str) -> None:
    """Wait (at most 10 min) for the head to be cut to its last hours and the compactions to stop:
    the backfilled day sits in the head until Prometheus's 1-minute compaction tick moves it into
    blocks, which would otherwise run during the measurement."""
    started = time.monotonic()

    def compactions() -> tuple[float, float]:
        pm = {}
        for line in get(f"{base}/metrics").decode().splitlines():
            if line.startswith(("prometheus_tsdb_head_min_time ", "prometheus_tsdb_compactions_total ")):
                key, _, value = line.rpartition(" ")
                pm[key] = float(value)
        return pm["prometheus_tsdb_head_min_time"], pm["prometheus_tsdb_compactions_total"]

    wait_for(lambda: time.time() * 1000 - compactions()[0] < 4 * 3600 * 1000, 600, "the head compaction", step=5)
    last, quiet_since = compactions()[1], time.monotonic()
    while time.monotonic() - quiet_since < 75 and time.monotonic() - started < 600:
        time.sleep(5)
        now = compactions()[1]
        if now != last:
            last, quiet_since = now, time.monotonic()
    print(f"# compactions settled after {time.monotonic() - started:.0f} s ({last:.0f} compactions)", file=sys.stderr, flush=True)


class CpuWindow:
    """Prometheus's CPU cores over whole garbage-collection cycles: from the end of one collection
    to the end of the first one at least ``seconds`` later. A collection marks the whole heap (~1.5
    CPU s at 10,000 engines) and comes every 2 minutes when little is allocated (Go's forced
    collection) or every ~45 s with the rules: a window cut by the clock held two or three of them
    (scraping alone, 0.82 and 0.96 CPU s an interval in one run, stop 60), which moved every figure
    charged net of it. ``poll`` (call it every second or two with prom_metrics' latest read, which the
    caller reads anyway) returns the cores once the window ends.

    A window that holds a TSDB compaction starts again at the next collection's end: Prometheus
    compacts its head into a block when it spans 3 h, so at every odd UTC hour here (the 2 h
    blocks are aligned to the epoch), 4-7 CPU s more at 10,000 engines (stop 66): 0.35-0.6 CPU s
    an interval more in the window that holds it, whatever the rules cost. ``lost`` counts the
    seconds a caller's deadline must grow by."""

    def __init__(self, pm: dict[str, float], pid: int, seconds: float):
        self.pid, self.seconds = pid, seconds
        self.before = pm["go_gc_duration_seconds_count"]
        self.compactions = pm.get("prometheus_tsdb_compactions_total", 0.0)
        self.cpu0 = self.wall0 = 0.0
        self.started, self.due = False, math.inf  # due: the collections counted once the window is long enough
        self.cycles = self.length = self.heap_goal = math.nan
        self.span = (math.nan, math.nan)  # its start and end in Unix time, as the rule groups stamp evaluations
        self.restarts, self.lost = 0, 0.0

    def poll(self, pm: dict[str, float]) -> float | None:
        n, now = pm["go_gc_duration_seconds_count"], time.monotonic()
        compactions = pm.get("prometheus_tsdb_compactions_total", 0.0)
        if compactions != self.compactions:
            if self.started:
                self.restarts, self.lost = self.restarts + 1, self.lost + now - self.wall0
            self.started, self.before, self.due, self.compactions = False, n, math.inf, compactions
            return None
        if not self.started:
            if n > self.before:
                self.started, self.before, self.cpu0, self.wall0 = True, n, cpu_seconds(self.pid), now
                self.span = (time.time(), math.nan)
            return None
        if self.due == math.inf and now - self.wall0 >= self.seconds:
            self.due = n
        if n <= self.due:
            return None
        self.cycles, self.length, self.span = n - self.before, now - self.wall0, (self.span[0], time.time())
        # The heap its last collection marked, times (1 + GOGC/100): a window's costlier collections show here.
        self.heap_goal = pm.get("go_memstats_next_gc_bytes", math.nan)
        return (cpu_seconds(self.pid) - self.cpu0) / self.length


def share_of_window(
    window: CpuWindow, durations_of: dict[str, dict[float, float]], medians: dict[str, float], intervals: dict[str, float]
) -> float:
    """The evaluation time ``window``'s length calls for (each group's share of it: length / interval
    evaluations at the group's median duration, ``medians``) over the evaluation time it held; the rules' CPU in
    the window times this is their CPU per second. The window ends at a collection, not at an
    evaluation: one of 389 s held two evaluations of a 3-minute group whose share was 2.16 (stop 60,
    a figure up to a sixth low on that group). Held: the evaluations that ended inside it
    (``durations_of``: per group, start -> duration; Prometheus publishes one when it ends, so one
    straddling an edge counts in one of two windows side by side)."""
    start, end = window.span
    due = held = 0.0
    for g, every in intervals.items():
        due += window.length / every * medians[g]
        held += sum(start < stamp + t <= end for stamp, t in durations_of[g].items()) * medians[g]
    return due / held if held else math.nan  # none held: no figure


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def reference_rules(variant: str) -> str:
    """The least any user records (issue 35): each server's 5m acceptance and mean acceptance
    length, as vLLM's own Grafana dashboard computes them, from the same series the shipped
    rules read. The shipped rules' CPU is reported as a ratio to this file's, measured in the
    same Prometheus on the same series, which carries from one machine to another."""
    src = rules.VARIANTS[variant]
    by = "namespace, pod, model_name"

    def rate(name: str) -> str:
        return f"sum by ({by}) (rate({name}[5m]))"

    return yaml.safe_dump(
        {
            "groups": [
                {
                    "name": "reference",
                    "rules": [
                        {
                            "record": "namespace_pod_model_name:reference_mean_acceptance_length:ratio_rate5m",
                            "expr": f"1 + {rate(src.accepted)} / {rate(src.drafts)}",
                        },
                        {
                            "record": "namespace_pod_model_name:reference_acceptance_ratio:ratio_rate5m",
                            "expr": f"{rate(src.accepted)} / {rate(src.draft_tokens)}",
                        },
                    ],
                }
            ]
        },
        sort_keys=False,
    )


def _ratio(cores: float, reference_cores: float) -> float:
    """cores / reference_cores, nan when the reference is under what /proc's clock ticks resolve."""
    return cores / reference_cores if reference_cores * REFERENCE_WINDOW >= 0.1 else math.nan


def cpu_model() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return "unknown"


def alternate(
    base: str, pid: int, load: Callable[[list[str]], None], files: dict[str, Path], rounds: int, scrape_cpu: float
) -> dict[str, list[float]]:
    """Rule files measured in turn in one Prometheus on the same series, ``rounds`` times over
    (`--alternate`): the same file measured in two runs differs by up to a third, files in turn in
    one run differ by what they cost. Each is loaded by a reload and, once every group of it has
    evaluated, charged as the shipped rules are: Prometheus's CPU over whole collection cycles spanning
    two periods of its slowest group, net of scraping alone (``scrape_cpu``, cores), each group at its
    share of the window (share_of_window). Per file, its CPU seconds per interval, one a round."""
    out: dict[str, list[float]] = {name: [] for name in files}
    for _ in range(rounds):
        for name, path in files.items():
            intervals = group_intervals(path.read_text())
            groups, longest = list(intervals), max(intervals.values())
            load([str(path)])
            loaded = time.time()
            durations_of: dict[str, dict[float, float]] = defaultdict(dict)
            window: CpuWindow | None = None
            cores = None
            allowed = 4 * longest + REFERENCE_WINDOW + 300
            deadline = time.monotonic() + allowed
            while cores is None:
                if time.monotonic() > deadline + (window.lost if window else 0.0):
                    raise SystemExit(f"bench_fleet: no whole CPU window of {name} in {allowed:.0f} s")
                time.sleep(2)
                pm = prom_metrics(base)
                evaluated = {g: e for g, e in evaluations(pm, groups).items() if e[0] > loaded}
                for g, (stamp, took) in evaluated.items():
                    durations_of[g][stamp] = took
                if window is None:
                    if len(evaluated) == len(groups):
                        window = CpuWindow(pm, pid, max(REFERENCE_WINDOW, 2 * longest))
                else:
                    cores = window.poll(pm)
            assert window is not None
            medians = {g: median(list(durations_of[g].values())) for g in groups}
            share = share_of_window(window, durations_of, medians, intervals)
            out[name].append((cores - scrape_cpu) * share * INTERVAL)
            print(
                f"#   alternate {name}: {out[name][-1]:.2f} CPU s an interval (Prometheus {cores * INTERVAL:.2f}, "
                f"share {share:.3f}, {window.cycles:.0f} collections in {window.length:.0f} s, "
                f"{window.restarts} restarts for a compaction); group medians " + ", ".join(f"{medians[g]:.3f}" for g in groups),
                file=sys.stderr,
                flush=True,
            )
    return out


def run(
    variant: str,
    pods: int,
    payloads: tuple[str, str],
    rule_text: str,
    tmp: Path,
    against: tuple[Path, ...] = (),
    gogc: str = PROMETHEUS_GOGC,
) -> dict[str, float]:
    prom_bin = shutil.which("prometheus")
    if prom_bin is None:
        raise SystemExit("bench_fleet: no prometheus binary (make tools installs Debian's)")
    tmp.mkdir()
    now = time.time()
    fleet = build_fleet(variant, pods, *payloads, t0=now - RECORDED_HISTORY - 3600, rule_text=rule_text)
    config = tmp / "prometheus.yml"
    config.write_text(yaml.safe_dump({"global": {"scrape_interval": f"{INTERVAL}s", "evaluation_interval": f"{INTERVAL}s"}}))
    (tmp / "rules.yaml").write_text(rule_text)
    (tmp / "reference.yaml").write_text(reference_rules(variant))
    with ExitStack() as es:
        gen = es.enter_context(Generator(fleet))
        proc, address = start_listening(
            es,
            [
                prom_bin,
                f"--config.file={config}",
                f"--storage.tsdb.path={tmp / 'tsdb'}",
                "--web.listen-address=127.0.0.1:0",
                "--web.enable-remote-write-receiver",
                "--web.enable-lifecycle",
                "--log.level=warn",
            ],
            tmp / "prometheus.log",
            {**os.environ, "GOGC": gogc},
        )
        base = f"http://{address}"
        wait_for(lambda: get(f"{base}/-/ready", 5), 60, "Prometheus to be ready")
        samples, seconds = backfill(base, fleet, time.time(), rules.default_options(), rule_text)
        print(
            f"# {variant} {fleet.engines} engines: backfilled {samples:,} samples in {seconds:.0f} s", file=sys.stderr, flush=True
        )
        settle(base)
        scrape = [
            {
                "job_name": "fleet",
                "honor_labels": True,
                "static_configs": [
                    {"targets": [gen.address], "labels": {"__param_shard": str(i), "shard": str(i)}}
                    for i in range(len(fleet.per_target))
                ],
                "metric_relabel_configs": [{"action": "labeldrop", "regex": "shard"}],
            }
        ]
        intervals = group_intervals(rule_text)
        groups = list(intervals)
        longest = max(intervals.values())
        # At least TARGET_EVALUATIONS of the groups at the evaluation interval and two of a slower
        # one; the CPU over at least two of the slowest group's periods (share_of_window charges each its share).
        needed = {g: max(2, math.ceil(TARGET_EVALUATIONS * INTERVAL / iv)) for g, iv in intervals.items()}
        cpu_window = max(TARGET_EVALUATIONS * INTERVAL, 2 * longest)

        def load(rule_files: list[str]) -> None:
            config.write_text(
                yaml.safe_dump(
                    {
                        "global": {"scrape_interval": f"{INTERVAL}s", "evaluation_interval": f"{INTERVAL}s"},
                        "rule_files": rule_files,
                        "scrape_configs": scrape,
                    }
                )
            )
            urllib.request.urlopen(urllib.request.Request(f"{base}/-/reload", method="POST"), timeout=60).read()

        def scraped() -> bool:
            up = query(base, 'up{job="fleet"}')
            return len(up) == len(fleet.per_target) and all(u["value"][1] == "1" for u in up)

        # Scraping alone first: Prometheus's CPU without the rules, over at least REFERENCE_WINDOW.
        # CPU seconds do not grow when other processes share the cores; wall-clock durations do.
        windows: dict[str, CpuWindow] = {}  # each CPU window: its garbage collections and length

        def cpu_over(seconds: float, window: str, each: Callable[[dict[str, float]], object] = lambda pm: None) -> float:
            """Prometheus's CPU cores over whole collection cycles spanning at least ``seconds``
            (CpuWindow), calling ``each`` every 2 s meanwhile."""
            w = windows[window] = CpuWindow(prom_metrics(base), proc.pid, seconds)
            # Go collects at least every 2 minutes: two cycles at most beyond the window.
            deadline = time.monotonic() + seconds + 300
            while time.monotonic() < deadline + w.lost:
                time.sleep(2)
                pm = prom_metrics(base)
                each(pm)
                cores = w.poll(pm)
                if cores is not None:
                    return cores
            raise SystemExit(f"bench_fleet: no garbage collection in Prometheus for {seconds + 300:.0f} s")

        load([])
        wait_for(scraped, 120, "every target's first scrape", step=1)
        scrape_cpu = cpu_over(REFERENCE_WINDOW, "scrape_before")
        # The reference file next, over the same span, once its first evaluation has run.
        load([str(tmp / "reference.yaml")])
        wait_for(scraped, 120, "every target's first scrape", step=1)
        wait_for(
            lambda: query(base, "count(namespace_pod_model_name:reference_mean_acceptance_length:ratio_rate5m)"),
            120,
            "the reference rules' first evaluation",
            step=1,
        )
        # Its evaluations' durations too, polled as the rules' are below: a ratio of wall-clock
        # durations in one run, which a slower or busier machine stretches on both sides.
        reference_took: dict[float, float] = {}  # evaluation time -> duration
        reference_cpu = cpu_over(
            REFERENCE_WINDOW, "reference", lambda pm: reference_took.update(evaluations(pm, ["reference"]).values())
        )
        load([str(tmp / "rules.yaml")])
        wait_for(scraped, 120, "every target's first scrape", step=1)
        first_scrape = time.time()
        # Worst over the evaluations of every group after the first scrape. The CPU is counted from
        # the first collection after every group's first evaluation (which creates the recorded
        # series): the steady state; each group then charged its share of the window's length
        # (share_of_window).
        worst, seen, sums, loads = 0.0, defaultdict(set), [], []
        worst_group: dict[str, float] = defaultdict(float)
        durations_of: dict[str, dict[float, float]] = defaultdict(dict)  # per group: evaluation time -> duration
        rules_window: CpuWindow | None = None
        cpu_share = None
        deadline = time.monotonic() + cpu_window + 4 * longest
        while time.monotonic() < deadline + (rules_window.lost if rules_window else 0.0):
            pm = prom_metrics(base)
            if cpu_share is None and rules_window is not None:
                cpu_share = rules_window.poll(pm)
            now = evaluations(pm, groups)
            if len(now) == len(groups) and all(stamp > first_scrape for stamp, _ in now.values()):
                if rules_window is None:
                    rules_window = windows["rules"] = CpuWindow(pm, proc.pid, cpu_window)
                for g, (stamp, took) in now.items():
                    seen[g].add(stamp)
                    worst_group[g] = max(worst_group[g], took)
                    durations_of[g][stamp] = took
                # The groups at the evaluation interval run every interval: their durations add up.
                at_interval = sum(took for g, (_, took) in now.items() if intervals[g] == INTERVAL)
                worst = max(worst, at_interval)
                sums.append(at_interval)
                loads.append(float(Path("/proc/loadavg").read_text().split()[0]))
                if cpu_share is not None and all(len(seen[g]) >= needed[g] for g in groups):
                    break
            time.sleep(2)
        else:
            raise SystemExit(f"bench_fleet: fewer than {needed} evaluations of {groups} in time")
        medians = {g: median(list(durations_of[g].values())) for g in groups}
        for g in groups:
            print(
                f"#   group {g} (every {intervals[g]:.0f} s): median {medians[g]:.3f} s, "
                f"worst {worst_group[g]:.3f} s over {len(seen[g])} evaluations",
                file=sys.stderr,
            )
        # The rules' evaluation time per interval (each group's median, a slower group's share of
        # it) against the reference group's median over its own window.
        eval_per_interval = sum(medians[g] * INTERVAL / intervals[g] for g in groups)
        reference_eval = median(list(reference_took.values()))
        print(
            f"#   reference group: median {reference_eval:.3f} s over {len(reference_took)} evaluations",
            file=sys.stderr,
        )
        costly = sorted(
            (
                (r["evaluationTime"], r["name"], g["name"])
                for g in json.loads(get(f"{base}/api/v1/rules"))["data"]["groups"]
                for r in g["rules"]
            ),
            reverse=True,
        )
        raw_names = read_over_range(rule_text)[0] | {rules.VARIANTS[variant].per_pos}
        exprs = {r.get("record") or r["alert"]: r["expr"] for g in yaml.safe_load(rule_text)["groups"] for r in g["rules"]}
        raw_cost = sum(sec for sec, name, _ in costly if any(n + "{" in exprs[name] or n + "[" in exprs[name] for n in raw_names))
        print(
            f"#   last evaluation: {sum(x[0] for x in costly):.3f} s in all rules, {raw_cost:.3f} s in those "
            f"reading raw series; the costliest:",
            file=sys.stderr,
        )
        for seconds, name, _group in costly[:15]:
            print(f"#   {seconds:7.3f} s  {name}", file=sys.stderr)
        if HOLD[0]:
            print(f"# holding {base} for {HOLD[0]:.0f} s (generator {gen.address})", file=sys.stderr, flush=True)
            time.sleep(HOLD[0])
        pm = prom_metrics(base)
        recorded = float(query(base, f'count({{__name__=~".+:{rules.P}_.+:.+"}})')[0]["value"][1])
        rss = rss_mb(proc.pid)  # with the rules loaded
        # The shipped rules and each file to compare, in turn (after the series count and the RSS,
        # which stay the shipped rules').
        files = {"shipped": tmp / "rules.yaml"}
        for i, f in enumerate(against):
            files[f.stem] = tmp / f"against-{i}.yaml"
            files[f.stem].write_text(f.read_text())
        turns = alternate(base, proc.pid, load, files, ALTERNATE_ROUNDS, scrape_cpu) if against else {}
        # Scraping alone again, in the steady state the rules left: the first measurement follows
        # the backfill's compactions, and a late one inflated it by 0.6 s an interval once (stop 43),
        # which flattered the rules' figure. The rules are charged against the lower of the two.
        load([])
        time.sleep(INTERVAL)
        scrape_after = cpu_over(REFERENCE_WINDOW, "scrape_after")
        scrape_before, scrape_cpu = scrape_cpu, min(scrape_cpu, scrape_after)
        missed = sum(
            v
            for k, v in pm.items()
            if k.startswith("prometheus_rule_group_iterations_missed_total") and any(f';{g}"' in k for g in groups)
        )
        # The history is there: the recorded series read over the longest range have samples that old.
        name, need = max(read_over_range(rule_text)[1].items(), key=lambda x: x[1])
        day_full = bool(query(base, f"count(count_over_time({name}[5m] offset {int(need)}s))"))
        slow = [g for g in groups if intervals[g] != INTERVAL]
        assert rules_window is not None and cpu_share is not None  # the loop ends only once both are set
        share = share_of_window(rules_window, durations_of, medians, intervals)
        rules_cpu = (cpu_share - scrape_cpu) * share  # cores
        return {
            "engines": fleet.engines,
            "series_scraped": sum(len(g) for g in fleet.per_target),
            "rule_eval_seconds": worst,
            # The slower groups' worst duration and its share of their interval.
            "rule_eval_seconds_long": sum(worst_group[g] for g in slow),
            "rule_eval_long_share": max([worst_group[g] / intervals[g] for g in slow], default=0.0),
            "rule_eval_seconds_per_interval": sum(worst_group[g] * INTERVAL / intervals[g] for g in groups),
            "rule_eval_seconds_median": sorted(sums)[len(sums) // 2],
            "load_average": max(loads),
            "prometheus_cpu_cores": cpu_share,
            "prometheus_cpu_cores_scrape_only": scrape_cpu,
            "scrape_cpu_seconds_per_interval_before": scrape_before * INTERVAL,
            "scrape_cpu_seconds_per_interval_after": scrape_after * INTERVAL,
            "rules_cpu_seconds_per_interval": rules_cpu * INTERVAL,
            # What that figure was scaled by: the evaluation time due in the window over what it held.
            "rules_window_share_factor": share,
            "scrape_cpu_seconds_per_interval": scrape_cpu * INTERVAL,
            "reference_rules_cpu_seconds_per_interval": (reference_cpu - scrape_cpu) * INTERVAL,
            # Ratios measured in one Prometheus on the same series: what carries to another machine.
            # (nan where the denominator is under 0.1 CPU second over its window: ten clock ticks)
            "rules_cpu_to_reference_ratio": _ratio(rules_cpu, reference_cpu - scrape_cpu),
            "rules_cpu_to_scrape_ratio": _ratio(rules_cpu, scrape_cpu),
            "rule_eval_seconds_median_per_interval": eval_per_interval,
            "reference_eval_seconds_median": reference_eval,
            "rule_eval_to_reference_eval_ratio": eval_per_interval / reference_eval if reference_eval > 0 else math.nan,
            "recorded_series": recorded,
            "recorded_series_per_engine": recorded / fleet.engines,
            "rss_mb": rss,
            "head_series": pm.get("prometheus_tsdb_head_series", float("nan")),
            "iterations_missed": missed,
            "backfill_samples": samples,
            "history_full": float(day_full),
            # Per file compared (--alternate): its figure each round and its median over the shipped rules'.
            **{
                f"alternate_{name}_round{i + 1}_cpu_seconds_per_interval": v
                for name, vs in turns.items()
                for i, v in enumerate(vs)
            },
            **{
                # nan where the shipped rules' own figure is under what the clock ticks resolve (a tiny fleet)
                f"alternate_{name}_to_shipped_ratio": _ratio(
                    statistics.median(vs) / INTERVAL, statistics.median(turns["shipped"]) / INTERVAL
                )
                for name, vs in turns.items()
                if name != "shipped"
            },
            # Each CPU window's garbage collections and length (CpuWindow).
            **{f"gc_cycles_{name}": w.cycles for name, w in windows.items()},
            **{f"cpu_window_seconds_{name}": w.length for name, w in windows.items()},
            **{f"heap_goal_mb_{name}": w.heap_goal / 1e6 for name, w in windows.items()},
            **{f"restarts_for_compaction_{name}": w.restarts for name, w in windows.items()},
        }


def main(argv: list[str] | None = None) -> int:
    # SIGTERM (timeout, kill) unwinds like Ctrl-C: every server started here is stopped by PID.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    ap = argparse.ArgumentParser()
    ap.add_argument("--engines", default="1000,10000")
    ap.add_argument("--variants", default="sidecar,vllm-direct")
    ap.add_argument(
        "--rules",
        action="append",
        default=[],
        metavar="VARIANT=FILE",
        help="measure this rule file instead of the generated one (e.g. an older rules.yaml)",
    )
    ap.add_argument(
        "--alternate",
        action="append",
        default=[],
        metavar="VARIANT=FILE",
        help=f"after the measurement, measure this rule file and the shipped one in turn in the same Prometheus "
        f"({ALTERNATE_ROUNDS} rounds): a side-by-side comparison (repeatable)",
    )
    ap.add_argument(
        "--gogc",
        default=os.environ.get("GOGC", PROMETHEUS_GOGC),
        help=f"Go's GOGC in Prometheus's environment (default: $GOGC, else {PROMETHEUS_GOGC}, what docs/scale.md "
        "gives a Prometheus at 10,000 engines; 100 is Go's own default)",
    )
    ap.add_argument("--hold", type=float, default=0.0, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    HOLD[0] = args.hold
    if args.gogc != "off" and not (args.gogc.isascii() and args.gogc.isdigit() and int(args.gogc) > 0):
        raise SystemExit(f"bench_fleet: --gogc {args.gogc!r}: want a positive whole percentage (Go's GOGC), or off")
    # Checked before a run of half an hour, not at its end: each file read, each named apart.
    alternates: dict[str, list[Path]] = defaultdict(list)
    for given in args.alternate:
        variant, _, path = given.partition("=")
        f = Path(path)
        if variant not in rules.VARIANTS:
            raise SystemExit(f"bench_fleet: --alternate {given!r}: want VARIANT=FILE, VARIANT one of {sorted(rules.VARIANTS)}")
        if not f.is_file():
            raise SystemExit(f"bench_fleet: --alternate {given!r}: no such file {path!r}")
        if f.stem in ("shipped", *(a.stem for a in alternates[variant])):
            raise SystemExit(f"bench_fleet: --alternate {given!r}: name each file apart, and not 'shipped'")
        alternates[variant].append(f)
    sizes = [int(x) for x in args.engines.split(",")]
    variants = args.variants.split(",")
    results: dict[tuple[str, int], dict[str, float]] = {}
    with tempfile.TemporaryDirectory(prefix="bench-fleet-") as d:
        tmp = Path(d)
        (tmp / "capture").mkdir()
        payloads = capture_payloads(tmp / "capture")
        for variant in variants:
            given = dict(x.split("=", 1) for x in args.rules)
            rule_text = Path(given[variant]).read_text() if variant in given else rules.dump(rules.rule_file(variant), "")
            for engines in sizes:
                r = run(
                    variant,
                    engines // ENGINES_PER_POD,
                    payloads,
                    rule_text,
                    tmp / f"{variant}-{engines}",
                    tuple(alternates[variant]),
                    args.gogc,
                )
                results[variant, engines] = r
                tag = f"fleet_{variant.replace('-', '_')}_{engines}"
                # Every figure run returns, in its order: a second list of names dropped the heap goals once.
                for key, value in r.items():
                    print(
                        f"{tag}_{key}: {value:.3f}"
                        if isinstance(value, float) and not value.is_integer()
                        else f"{tag}_{key}: {int(value)}",
                        flush=True,
                    )
    top = max(sizes)
    worst = max(results[v, top]["rule_eval_seconds"] for v in variants)
    print(f"fleet_cpu_model: {cpu_model()}")
    print(f"fleet_cores: {os.cpu_count()}")
    print(f"fleet_prometheus_gogc: {args.gogc}")
    print(f"fleet_engines: {top}")
    print(f"fleet_rule_interval_seconds: {INTERVAL}")
    print(f"fleet_rule_eval_seconds: {worst:.3f}")
    print(f"fleet_recorded_series_per_engine: {max(results[v, top]['recorded_series_per_engine'] for v in variants):.2f}")
    print(f"fleet_prometheus_rss_mb: {max(results[v, top]['rss_mb'] for v in variants):.0f}")
    if len(sizes) > 1:
        low = min(sizes)
        for v in variants:
            growth = results[v, top]["rule_eval_seconds"] / max(results[v, low]["rule_eval_seconds"], 1e-9)
            print(f"fleet_{v.replace('-', '_')}_eval_growth_{low}_to_{top}: {growth:.1f}")
    long_share = max(results[v, top]["rule_eval_long_share"] for v in variants)
    cpu = max(results[v, top]["rules_cpu_seconds_per_interval"] for v in variants)
    print(f"fleet_rule_eval_long_share: {long_share:.3f}")
    print(f"fleet_rules_cpu_seconds_per_interval: {cpu:.3f}")
    for v in variants:
        r = results[v, top]
        print(
            f"fleet_{v.replace('-', '_')}_{top}_ratios: rules {r['rules_cpu_to_reference_ratio']:.1f}x the reference "
            f"rules' CPU, {r['rules_cpu_to_scrape_ratio']:.2f}x scraping's; their median evaluation time "
            f"{r['rule_eval_to_reference_eval_ratio']:.1f}x the reference's (load average up to {r['load_average']:.1f})"
        )
    # The target per group: the groups at the evaluation interval together within a tenth of it,
    # a slower group within a tenth of its own. Wall-clock durations grow with the machine's load
    # average; the CPU seconds Prometheus spends on the rules per interval do not.
    ok = worst <= INTERVAL / 10 and long_share <= 0.1
    print(
        f"fleet_target_met: {int(ok)}  (rules evaluate in at most a tenth of their {INTERVAL} s interval "
        f"at {top} engines, wall-clock)"
    )
    print(f"fleet_target_met_cpu: {int(cpu <= INTERVAL / 10)}  (the rules' CPU seconds per {INTERVAL} s interval)")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
