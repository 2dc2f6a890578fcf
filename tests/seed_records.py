"""Before/after counters and measured acceptance recorded on real DeepSeek-V4 deployments.

The recorded fields live in tests/fixtures/seed_records.json (copied verbatim from
the seed data; provenance in tests/fixtures/README.md).

Each record becomes two real /metrics dumps rendered by prometheus_client exactly
as vLLM renders them (counters with ``_created``), so ``diff`` is tested end to end
against figures that someone measured on a real DeepSeek-V4 deployment.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from prometheus_client import CollectorRegistry, Counter, generate_latest

MODEL = "/scratch/weights/deepseek-v4-flash"


@dataclass
class Record:
    name: str
    before: dict  # drafts, draft_tokens, accepted, per_pos (list)
    after: dict
    acceptance_rate: float  # as recorded (fraction)
    rate_tolerance: float
    mean_acceptance_length: float | None = None
    per_position: list[float] | None = None


def _counters(drafts, draft_tokens, accepted, per_pos=None) -> dict:
    if per_pos is None:
        # Only k=1 records lack per-position counts; there pos0 == accepted by vLLM's invariant.
        assert drafts == draft_tokens, "a k>1 record without per-position counts"
        per_pos = [accepted]
    return {"drafts": drafts, "draft_tokens": draft_tokens, "accepted": accepted, "per_pos": list(per_pos)}


ZERO = _counters(0.0, 0.0, 0.0)


def _from_mtp_delta(name: str, d: dict) -> Record | None:
    delta, pre, post = d.get("mtp_delta", {}), d.get("pre_metrics"), d.get("post_metrics")
    al = delta.get("tokens_per_step")
    if pre and post:
        before = _counters(pre["drafts"], pre["draft_tokens"], pre["accepted_tokens"])
        after = _counters(post["drafts"], post["draft_tokens"], post["accepted_tokens"])
    elif "d_drafts" in delta:
        before = ZERO
        after = _counters(delta["d_drafts"], delta["d_draft_tokens"], delta["d_accepted_tokens"])
    else:
        return None  # e.g. a run terminated before its post-scrape
    return Record(name, before, after, delta["acceptance_rate"], 1e-9, al)


def _from_vllm_bench(name: str, d: dict) -> Record:
    drafts, tokens, accepted = d["spec_decode_num_drafts"], d["spec_decode_draft_tokens"], d["spec_decode_accepted_tokens"]
    rates = d["spec_decode_per_position_acceptance_rates"]
    per_pos = [round(r * drafts) for r in rates]
    return Record(
        name, {**ZERO, "per_pos": [0.0] * len(rates)},
        _counters(drafts, tokens, accepted, per_pos),
        d["spec_decode_acceptance_rate"] / 100.0, 1e-9,
        d["spec_decode_acceptance_length"], rates,
    )


def _from_metrics_txt(name: str, kv: dict) -> Record:
    f = lambda k: float(kv[k])

    # k=1 run: draft tokens == drafts; the file records drafts, accepted and pos0.
    before = _counters(f("pre_draft"), f("pre_draft"), f("pre_accepted"), [f("pre_pos0")])
    after = _counters(f("post_draft"), f("post_draft"), f("post_accepted"), [f("post_pos0")])
    return Record(name, before, after, f("acceptance_rate"), 5e-5, per_position=[f("acceptance_rate_pos0")])


def _from_workload(name: str, d: dict) -> list[Record]:
    assert d["num_speculative_tokens"] == 1
    return [
        Record(f"{name}#{b['name']}", ZERO, _counters(b["delta_draft"], b["delta_draft"], b["delta_accepted"]),
               b["acceptance_rate"], 1e-9)
        for b in d["buckets"]
    ]


def load_records(path: Path) -> tuple[list[Record], list[str]]:
    """Every record with counters and a measured acceptance, and the runs left out (with why)."""
    records: list[Record] = []
    left_out: list[str] = []
    for d in json.loads(path.read_text()):
        name = d["source"]
        if "metrics_txt" in d:
            records.append(_from_metrics_txt(name, d["metrics_txt"]))
        elif "spec_decode_num_drafts" in d:
            records.append(_from_vllm_bench(name, d))
        elif "mtp_delta" in d:
            rec = _from_mtp_delta(name, d)
            if rec is None:
                left_out.append(f"{name}: no post-run counters")
            else:
                records.append(rec)
        elif "buckets" in d:
            records.extend(_from_workload(name, d))
        else:
            raise ValueError(f"{path}: {name}: no recorded counters")
    return records, left_out


def render_dump(c: dict, engine: str = "0", started: float = 1.7959717480831244e09) -> bytes:
    """A vLLM V1 single-API-server /metrics payload (with _created) for these counters. The
    ``_created`` samples are set to ``started``, as one vLLM process serves them on every
    scrape (prometheus_client would stamp each rendering's own creation time: a restart)."""
    reg = CollectorRegistry()
    labels = ["engine", "model_name"]
    vals = {
        "vllm:spec_decode_num_drafts": c["drafts"],
        "vllm:spec_decode_num_draft_tokens": c["draft_tokens"],
        "vllm:spec_decode_num_accepted_tokens": c["accepted"],
    }
    for metric, value in vals.items():
        Counter(metric, metric, labels, registry=reg).labels(engine, MODEL).inc(value)
    per_pos = Counter("vllm:spec_decode_num_accepted_tokens_per_pos", "per pos", [*labels, "position"], registry=reg)
    for i, v in enumerate(c["per_pos"]):
        per_pos.labels(engine, MODEL, str(i)).inc(v)
    lines = generate_latest(reg).decode().splitlines()
    return "".join(
        (line.rsplit(" ", 1)[0] + f" {started!r}" if "_created{" in line and not line.startswith("#") else line) + "\n"
        for line in lines
    ).encode()
