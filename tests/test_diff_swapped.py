"""diff with BEFORE and AFTER swapped (issue 12 item 5): one line that says so, not one
restart per engine; a restart of some engines is still reported per engine."""

from __future__ import annotations

import json

from conftest import run_cli
from prometheus_client import CollectorRegistry, Counter, generate_latest

V1 = "vllm:spec_decode_num_"


def dump(drafts: dict[str, int]) -> bytes:
    """A vLLM V1 payload: per engine, k=2 with 90 % / 70 % per-position acceptance."""
    reg = CollectorRegistry()
    labels = ["engine", "model_name"]
    c = {n: Counter(f"{V1}{n}", n, labels, registry=reg) for n in ("drafts", "draft_tokens", "accepted_tokens")}
    pos = Counter(f"{V1}accepted_tokens_per_pos", "per pos", [*labels, "position"], registry=reg)
    for engine, d in drafts.items():
        p0, p1 = 9 * d // 10, 7 * d // 10
        c["drafts"].labels(engine, "m").inc(d)
        c["draft_tokens"].labels(engine, "m").inc(2 * d)
        c["accepted_tokens"].labels(engine, "m").inc(p0 + p1)
        pos.labels(engine, "m", "0").inc(p0)
        pos.labels(engine, "m", "1").inc(p1)
    return generate_latest(reg)


def diff_warnings(tmp_path, before: bytes, after: bytes) -> list[str]:
    (tmp_path / "a").write_bytes(before)
    (tmp_path / "b").write_bytes(after)
    proc = run_cli("diff", str(tmp_path / "a"), str(tmp_path / "b"), "--format", "json")
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)["warnings"]


def test_swapped_dumps_of_eight_engines_say_so_in_one_line(tmp_path):
    older = dump({str(e): 10_000 + e for e in range(8)})
    newer = dump({str(e): 20_000 + e for e in range(8)})
    assert diff_warnings(tmp_path, older, newer) == []
    warnings = diff_warnings(tmp_path, newer, older)
    assert len(warnings) == 1, warnings
    assert "look swapped" in warnings[0] and "(8)" in warnings[0]
    (tmp_path / "a").write_bytes(newer)
    (tmp_path / "b").write_bytes(older)
    text = run_cli("diff", str(tmp_path / "a"), str(tmp_path / "b")).stdout.decode()
    assert text.count("look swapped") == 1 and "went down" not in text


def test_a_restart_of_some_engines_is_still_named_per_engine(tmp_path):
    before = dump({str(e): 10_000 for e in range(8)})
    after = dump({**{str(e): 20_000 for e in range(6)}, "6": 50, "7": 60})
    warnings = diff_warnings(tmp_path, before, after)
    assert len(warnings) == 2 and all("went down" in w for w in warnings), warnings
    assert not any("swapped" in w for w in warnings)
