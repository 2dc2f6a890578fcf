"""Property-based tests: any counter stream with restarts gives sane figures;
no input makes the parser raise anything but a clear ParseError."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st
from vllm_specdec_exporter.adapters import extract
from vllm_specdec_exporter.model import series_name
from vllm_specdec_exporter.parser import ParseError, parse
from vllm_specdec_exporter.restarts import delta_engines
from vllm_specdec_exporter.summary import summarize

FAMS = ("vllm:spec_decode_num_drafts_total", "vllm:spec_decode_num_draft_tokens_total",
        "vllm:spec_decode_num_accepted_tokens_total")


def dump(state: dict) -> str:
    lines = []
    for engine, c in state.items():
        lbl = f'engine="{engine}",model_name="m\\"odel\\\\x"'
        for fam, v in zip(FAMS, (c["drafts"], c["tokens"], c["accepted"]), strict=True):
            lines.append(f"{fam}{{{lbl}}} {v:g}")
        for i, v in enumerate(c["pos"]):
            lines.append(f'vllm:spec_decode_num_accepted_tokens_per_pos_total{{{lbl},position="{i}"}} {v}')
    return "\n".join(lines) + "\n"


def zero(k):
    return {"drafts": 0, "tokens": 0, "accepted": 0, "pos": [0] * k}


# A step: per engine, either a restart or a batch of drafts (tokens proposed, tokens accepted).
draft = st.integers(1, 4).flatmap(lambda t: st.tuples(st.just(t), st.integers(0, t)))
engine_step = st.one_of(st.just("restart"), st.lists(draft, max_size=8))


@pytest.mark.long
@given(k=st.integers(1, 4), engines=st.integers(1, 3), steps=st.lists(st.lists(engine_step, min_size=3, max_size=3),
                                                                         min_size=1, max_size=6))
def test_counter_streams_with_restarts(k, engines, steps):
    state = {str(e): zero(k) for e in range(engines)}
    prev = extract(dump(state))
    for step in steps:
        truth = zero(k)
        for e in range(engines):
            c = state[str(e)]
            action = step[e]
            if action == "restart":
                if c["drafts"] < 2 or c["accepted"] == 1:
                    # A restart is told by every total going down (the sidecar's reading,
                    # and diff's): one draft accepting one token after it leaves drafts
                    # and tokens lower but accepted no lower than 1 -- a pair no restart
                    # explains (a total at 0 cannot go down and does not count): skip.
                    continue
                c = state[str(e)] = zero(k)
                action = [(1, 1)]  # one draft after the restart: drafts fall from >= 2 to 1
            for tokens, accepted in action:
                tokens = min(tokens, k)
                accepted = min(accepted, tokens)
                for target in (c, truth):
                    target["drafts"] += 1
                    target["tokens"] += tokens
                    target["accepted"] += accepted
                    for i in range(accepted):
                        target["pos"][i] += 1
        snap = extract(dump(state))
        deltas = delta_engines(prev.engines, snap.engines, series_name)
        s = summarize(deltas.counters)["models"]['m"odel\\x']["all"]
        assert s["warnings"] == []
        assert s["num_drafts"] == truth["drafts"]
        assert s["num_accepted_tokens"] == truth["accepted"]
        assert s["accepted_per_position"] == truth["pos"]
        if truth["drafts"]:
            assert 1.0 <= s["mean_acceptance_length"] <= k + 1
            assert 0.0 <= s["acceptance_rate"] <= 1.0
            survival = s["per_position_acceptance"]
            assert all(0.0 <= v <= 1.0 for v in survival)
            assert survival == sorted(survival, reverse=True)
            assert all(v is None or 0.0 <= v <= 1.0 for v in s["conditional_acceptance"])
        else:
            assert s["mean_acceptance_length"] is None and s["acceptance_rate"] is None
        prev = snap


@given(st.binary(max_size=2000))
def test_parser_never_raises_on_junk_bytes(data):
    try:
        parse(data)
        parse(data, FAMS)
        extract(data)
    except ParseError:
        pass


line_chars = st.sampled_from([*'vlm:_spec{}="\\,0123456789.e+-# \nInfNa', FAMS[0], "engine", "model_name"])
# A sample line of a wanted family, then near misses of it: most texts parse, so the checks on
# what was read run (from characters alone, 198 texts in 200 were refused before them).
sample_line = st.builds(lambda fam, engine, value: f'{fam}{{engine="{engine}"}} {value}\n',
                        st.sampled_from(FAMS), st.sampled_from(["0", "1", 'a\\"b']), st.sampled_from(["1", "2.5", "NaN", "1e3"]))
near_miss_line = st.one_of(sample_line, sample_line.flatmap(
    lambda line: st.tuples(st.integers(0, len(line) - 1), line_chars).map(lambda cut: line[:cut[0]] + cut[1] + line[cut[0] + 1:])))


@given(st.lists(near_miss_line, max_size=12).map("".join))
def test_parser_never_raises_on_near_miss_text(text):
    try:
        exp = parse(text, FAMS)
    except ParseError:
        return
    for issue in exp.issues:  # each reported problem points at a line of the text
        assert 1 <= issue.line <= text.count("\n") + 1
    for samples in exp.samples.values():
        for s in samples:
            assert s.name in FAMS


counter_value = st.one_of(st.integers(0, 10**12).map(str), st.sampled_from(["NaN", "+Inf", "-Inf", "-1", "1e400", "0.5"]),
                          st.floats(allow_nan=True, allow_infinity=True).map(repr))
label_value = st.text(alphabet=st.characters(codec="utf-8", exclude_categories=["Cs"]), max_size=12)


@given(st.lists(st.tuples(st.sampled_from([*FAMS, "vllm:spec_decode_num_accepted_tokens_per_pos_total",
                                            "vllm:generation_tokens_total"]),
                          st.sampled_from(["0", "1", "x"]), label_value, st.sampled_from(["0", "1", "2", "-1", "a"]),
                          counter_value), max_size=40))
def test_adapter_and_math_on_arbitrary_spec_decode_series(rows):
    """Any values and labels in the spec-decode families: no exception, and wherever the
    counters keep vLLM's invariants, every figure is in its range (arbitrary model names seldom
    give an engine all its counters: the test below draws only consistent ones)."""
    lines = []
    for fam, engine, model, position, value in rows:
        escaped = model.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
        pos = f',position="{position}"' if fam.endswith("per_pos_total") else ""
        lines.append(f'{fam}{{engine="{engine}",model_name="{escaped}"{pos}}} {value}')
    try:
        snap = extract("\n".join(lines) + "\n")
    except ParseError:
        return
    for model in summarize(snap.engines)["models"].values():
        for s in [model["all"], *model["engines"].values()]:
            if s["warnings"]:
                continue
            if s["acceptance_rate"] is not None:
                assert 0.0 <= s["acceptance_rate"] <= 1.0
            if s["mean_acceptance_length"] is not None:
                assert 1.0 <= s["mean_acceptance_length"] <= s["k"] + 1 or s["k"] == 0


@st.composite
def consistent_engine(draw):
    """One engine's totals as vLLM keeps them: k positions, each accepted in at most as many
    drafts as the one before (position 0 at most the drafts), each draft proposing 1..k tokens."""
    k = draw(st.integers(1, 6))
    drafts = draw(st.integers(1, 10**9))
    per_position, most = [], drafts
    for _ in range(k):
        most = draw(st.integers(0, most))
        per_position.append(most)
    accepted = sum(per_position)
    draft_tokens = draw(st.integers(max(drafts, accepted), k * drafts))
    return k, drafts, draft_tokens, per_position


@given(st.lists(consistent_engine(), min_size=1, max_size=4))
def test_consistent_counters_give_vllms_figures(engines):
    """vLLM's definitions, worked here: AL = 1 + accepted / drafts, acceptance = accepted /
    draft tokens, position i's acceptance = its accepted / drafts; summed over engines of one k."""
    k = engines[0][0]
    engines = [e for e in engines if e[0] == k]  # one model has one k
    lines = []
    for n, (_, drafts, draft_tokens, per_position) in enumerate(engines):
        lbl = f'engine="{n}",model_name="m"'
        for fam, v in zip(FAMS, (drafts, draft_tokens, sum(per_position)), strict=True):
            lines.append(f"{fam}{{{lbl}}} {v}")
        lines += [f'vllm:spec_decode_num_accepted_tokens_per_pos_total{{{lbl},position="{i}"}} {v}'
                  for i, v in enumerate(per_position)]
    s = summarize(extract("\n".join(lines) + "\n").engines)["models"]["m"]["all"]
    drafts = sum(e[1] for e in engines)
    draft_tokens = sum(e[2] for e in engines)
    positions = [sum(e[3][i] for e in engines) for i in range(k)]
    assert s["warnings"] == [] and s["k"] == k
    assert s["mean_acceptance_length"] == pytest.approx(1 + sum(positions) / drafts, rel=1e-12)
    assert 1.0 <= s["mean_acceptance_length"] <= k + 1
    assert s["acceptance_rate"] == pytest.approx(sum(positions) / draft_tokens, rel=1e-12)
    assert s["per_position_acceptance"] == pytest.approx([p / drafts for p in positions], rel=1e-12)
