"""diff with BEFORE and AFTER swapped (issue 12 item 5): one line that says so, not one
restart per engine; a restart of some engines is still reported per engine."""

from __future__ import annotations

import json

from conftest import run_cli
from prometheus_client import CollectorRegistry, Counter, generate_latest

V1 = "vllm:spec_decode_num_"


T0 = 1.7959717480831244e09


def dump(drafts: dict[str, int], started: dict[str, float] | None = None) -> bytes:
    """A vLLM V1 payload: per engine, k=2 with 90 % / 70 % per-position acceptance. With
    ``started`` (engine -> start time), the single-API-server form whose _created says when
    each engine's counters started; without it, the multiprocess form (no _created)."""
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
    out = []
    for line in generate_latest(reg).decode().splitlines():
        if "_created" in line:
            if started is None:
                continue
            if not line.startswith("#"):
                engine = line.split('engine="')[1].split('"')[0]
                line = f"{line.rsplit(' ', 1)[0]} {started[engine]!r}"
        out.append(line + "\n")
    return "".join(out).encode()


def diff_warnings(tmp_path, before: bytes, after: bytes) -> list[str]:
    (tmp_path / "a").write_bytes(before)
    (tmp_path / "b").write_bytes(after)
    proc = run_cli("diff", str(tmp_path / "a"), str(tmp_path / "b"), "--format", "json")
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)["warnings"]


def test_swapped_dumps_of_eight_engines_say_so_in_one_line(tmp_path):
    """Without _created (multiprocess mode) the counters alone cannot tell swapped dumps from a
    whole-server restart: one line says both. Counters down to half or less are a restart's
    (RESTART_MAX_SHARE): counted from zero, one warning."""
    older = dump({str(e): 10_000 + e for e in range(8)})
    newer = dump({str(e): 25_000 + e for e in range(8)})
    assert diff_warnings(tmp_path, older, newer) == []
    warnings = diff_warnings(tmp_path, newer, older)
    assert len(warnings) == 1, warnings
    assert "look swapped" in warnings[0] and "(8)" in warnings[0]
    (tmp_path / "a").write_bytes(newer)
    (tmp_path / "b").write_bytes(older)
    text = run_cli("diff", str(tmp_path / "a"), str(tmp_path / "b")).stdout.decode()
    assert text.count("look swapped") == 1 and "went down" not in text


def test_swapped_dumps_a_minute_apart_are_refused_in_one_line_as_swapped(tmp_path):
    """Counters a little lower in AFTER (dumps a minute apart, swapped) are no restart's: a restart
    starts from zero. One line, exit 2, not a restart counted from zero per engine."""
    older = dump({str(e): 10_000 + e for e in range(8)})
    newer = dump({str(e): 10_600 + e for e in range(8)})
    (tmp_path / "a").write_bytes(newer)
    (tmp_path / "b").write_bytes(older)
    proc = run_cli("diff", str(tmp_path / "a"), str(tmp_path / "b"))
    err = proc.stderr.decode().strip().splitlines()
    assert proc.returncode == 2 and len(err) == 1 and "look swapped" in err[0] and "(8)" in err[0], err


def test_swapped_dumps_of_one_process_are_refused_as_swapped(tmp_path):
    """With _created (issue 31) it is known: the same process, counters lower in AFTER."""
    one = {str(e): T0 for e in range(8)}
    older, newer = dump({str(e): 10_000 + e for e in range(8)}, one), dump({str(e): 20_000 + e for e in range(8)}, one)
    assert diff_warnings(tmp_path, older, newer) == []
    (tmp_path / "a").write_bytes(newer)
    (tmp_path / "b").write_bytes(older)
    proc = run_cli("diff", str(tmp_path / "a"), str(tmp_path / "b"))
    assert proc.returncode != 0 and b"did not restart" in proc.stderr and b"swapped" in proc.stderr, proc.stderr


def test_a_whole_server_restart_known_from_created_is_not_called_swapped(tmp_path):
    before = dump({str(e): 10_000 for e in range(8)}, {str(e): T0 for e in range(8)})
    after = dump({str(e): 20_000 for e in range(8)}, {str(e): T0 + 600 for e in range(8)})  # grew past, restarted
    warnings = diff_warnings(tmp_path, before, after)
    assert len(warnings) == 8 and all("started again at" in w for w in warnings), warnings
    assert not any("swapped" in w for w in warnings)


def test_a_restart_of_some_engines_is_still_named_per_engine(tmp_path):
    before = dump({str(e): 10_000 for e in range(8)})
    after = dump({**{str(e): 20_000 for e in range(6)}, "6": 50, "7": 60})
    warnings = diff_warnings(tmp_path, before, after)
    assert len(warnings) == 2 and all("went down" in w for w in warnings), warnings
    assert not any("swapped" in w for w in warnings)
    # The same with _created: engines 6 and 7 started again, the others did not.
    same = {str(e): T0 for e in range(8)}
    warnings = diff_warnings(tmp_path, dump({str(e): 10_000 for e in range(8)}, same),
                             dump({**{str(e): 20_000 for e in range(6)}, "6": 50, "7": 60}, {**same, "6": T0 + 9, "7": T0 + 9}))
    assert len(warnings) == 2 and all("started again at" in w for w in warnings), warnings
