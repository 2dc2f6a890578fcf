"""examples/: each before/after pair gives, through `diff`, the figures examples/README.md
states, and the pair differs only where its provenance says.

Hand-worked (examples/README.md, Provenance):
- healthy-dp8: 8 engines x (+6,590 drafts, +13,180 draft tokens, per position +6,089 / +4,527)
  = 52,720 drafts, 105,440 draft tokens, per position 48,712 / 36,216, accepted 84,928:
  AL = 1 + 84,928 / 52,720 = 2.6109, acceptance 84,928 / 105,440 = 80.55 %, position 0
  48,712 / 52,720 = 92.40 %; AL 2.611 is above the V4-Pro k=2 profile (2.27): ok, no cause.
- broken-v4-pro-mtp: +6,590 drafts, +13,180 draft tokens, per position +235 / +5, accepted 240:
  AL = 1 + 240 / 6,590 = 1.0364 (< 1.1: collapsed), acceptance 240 / 13,180 = 1.82 %,
  position 0 235 / 6,590 = 3.57 % (< 10 % on its only engine: draft_head_garbage).
"""

from __future__ import annotations

import json
import re

import pytest
from conftest import PAYLOADS, REPO, run_cli

EXAMPLES = REPO / "examples"
MODEL = "deepseek-ai/DeepSeek-V4-Pro"
CASES = {
    # pair: engines, drafts, draft tokens, accepted, per position, AL (4 places), acceptance % (2), state, causes
    "healthy-dp8": (8, 52_720, 105_440, 84_928, [48_712, 36_216], 2.6109, 80.55, "ok", []),
    "broken-v4-pro-mtp": (1, 6_590, 13_180, 240, [235, 5], 1.0364, 1.82, "collapsed", ["draft_head_garbage"]),
}
# The increments per engine each pair's provenance states (examples/README.md).
INCREMENTS = {
    "healthy-dp8": {"drafts": 6_590, "draft_tokens": 13_180, "accepted_tokens": 10_616, "pos0": 6_089, "pos1": 4_527},
    "broken-v4-pro-mtp": {"drafts": 6_590, "draft_tokens": 13_180, "accepted_tokens": 240, "pos0": 235, "pos1": 5},
}
LINE = re.compile(r"^(vllm:(?:spec_decode_num_(drafts|draft_tokens|accepted_tokens|accepted_tokens_per_pos)"
                  r"|generation_tokens)_total)\{([^}]*)\} (\S+)$")


def diff(pair: str, *extra: str):
    return run_cli("diff", str(EXAMPLES / pair / "before.prom"), str(EXAMPLES / pair / "after.prom"), *extra)


@pytest.mark.parametrize("pair", sorted(CASES))
def test_diff_of_each_example_pair_gives_the_hand_worked_figures(pair):
    engines, drafts, tokens, accepted, per_pos, al, acceptance, state, causes = CASES[pair]
    proc = diff(pair, "--format", "json")
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert list(out["models"]) == [MODEL] and out["warnings"] == []
    entry = out["models"][MODEL]
    s = entry["all"]
    assert len(entry["engines"]) == engines
    assert (s["num_drafts"], s["num_draft_tokens"], s["num_accepted_tokens"]) == (drafts, tokens, accepted)
    assert s["accepted_per_position"] == per_pos
    assert round(s["mean_acceptance_length"], 4) == al
    assert round(100 * s["acceptance_rate"], 2) == acceptance
    assert entry["health"]["state"] == state
    assert [d["cause"] for d in entry["diagnosis"]] == causes
    text = diff(pair)
    assert text.returncode == 0, text.stderr
    out_text = text.stdout.decode()
    assert f"model {MODEL}  ({engines} engine{'s' if engines > 1 else ''}, k=2)" in out_text
    assert f"mean acceptance length  {al:.3f}" in out_text
    assert ("likely cause" in out_text) == bool(causes)


@pytest.mark.parametrize("pair", sorted(CASES))
def test_each_pair_differs_only_where_its_provenance_says(pair):
    """Only the spec-decode counters and generation tokens move, by the stated increments per
    engine (generation tokens by drafts + accepted); every other line is the same."""
    before = (EXAMPLES / pair / "before.prom").read_text().splitlines()
    after = (EXAMPLES / pair / "after.prom").read_text().splitlines()
    assert len(before) == len(after)
    inc = INCREMENTS[pair]
    moved = 0
    for a, b in zip(before, after, strict=True):
        ma, mb = LINE.match(a), LINE.match(b)
        if ma is None:
            assert a == b
            continue
        assert mb is not None and ma.group(1, 3) == mb.group(1, 3)
        family, labels = ma.group(2), ma.group(3)
        if family is None:
            want = inc["drafts"] + inc["accepted_tokens"]  # generation tokens
        elif family == "accepted_tokens_per_pos":
            want = inc["pos0"] if 'position="0"' in labels else inc["pos1"]
        else:
            want = inc[family]
        assert float(mb.group(4)) - float(ma.group(4)) == want, (a, b)
        moved += 1
    engines = CASES[pair][0]
    assert moved == engines * 6  # drafts, draft tokens, accepted, 2 positions, generation tokens


def test_the_healthy_pair_starts_from_the_shipped_dp8_dump():
    shipped = (EXAMPLES / "vllm-v1-dp8-k2.prom").read_bytes()
    assert (EXAMPLES / "healthy-dp8" / "before.prom").read_bytes() == shipped
    assert shipped == (PAYLOADS / "vllm-v1-dp8-k2-single-process.prom").read_bytes()


def test_the_broken_pair_keeps_the_one_engine_layout():
    """Same lines as the 1-engine fixture payload, but for the counters the provenance names."""
    layout = (PAYLOADS / "vllm-v1-dp1-k2-single-process.prom").read_text().splitlines()
    before = (EXAMPLES / "broken-v4-pro-mtp" / "before.prom").read_text().splitlines()
    assert len(layout) == len(before)
    assert [a for a in layout if not LINE.match(a)] == [b for b in before if not LINE.match(b)]
