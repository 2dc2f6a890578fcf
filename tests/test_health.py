"""summarize hands judge what it has computed of a model's engines (diagnosis.Known: the
sum, its derived figures, which invariants are broken). The verdict and its causes must be
exactly those judge finds from the counters alone, and each engine's invariant messages
must still name its series."""

from __future__ import annotations

import json
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from vllm_specdec_exporter import config
from vllm_specdec_exporter.derive import invariant_violations
from vllm_specdec_exporter.health import Engines, judge
from vllm_specdec_exporter.model import BaselineProfile, Counters, series_name
from vllm_specdec_exporter.summary import summarize


@st.composite
def counters(draw) -> Counters:
    k = draw(st.integers(0, 4))
    drafts = draw(st.sampled_from([0.0, 50.0, 120.0, 1000.0, 5000.0]))
    # Mostly consistent chains, sometimes broken ones (positions above drafts, sums off).
    per_position, prev = [], drafts
    for _ in range(k):
        pick = draw(st.integers(0, 29))
        v = 9e3 if pick == 0 else 0.0 if pick < 4 else float(int(draw(st.floats(0.2, 1)) * prev))
        per_position.append(v)
        prev = v
    accepted = sum(per_position) + (7.0 if draw(st.integers(0, 29)) == 0 else 0.0)
    draft_tokens = max(k, 1) * drafts - draw(st.sampled_from([0.0, 0.0, 10.0]))
    generation = draw(st.one_of(st.none(), st.just(accepted + drafts)))
    return Counters(drafts=drafts, draft_tokens=draft_tokens, accepted=accepted, per_position=tuple(per_position),
                    generation_tokens=generation)


ENGINES = st.dictionaries(st.tuples(st.sampled_from(["m", "n"]), st.sampled_from(["0", "1", "2", "3", "10", "r/0"])),
                          counters(), max_size=6)
PROFILE = BaselineProfile(name="p", model=re.compile(".*"), k=2, mean_acceptance_length=2.2)


def _from_scratch(span, profile=None):
    # A plain dict: judge computes everything itself.
    return lambda model, engines: judge(dict(engines), span, profile, config.DETECTION, config.DEFAULT_MIN_DRAFTS)


def _handed(span, profile=None):
    return lambda model, engines: judge(engines, span, profile, config.DETECTION, config.DEFAULT_MIN_DRAFTS)


@pytest.mark.long
@settings(max_examples=400, deadline=None)
@given(ENGINES, st.sampled_from([None, 10.0, 600.0]), st.sampled_from([None, PROFILE]))
def test_the_verdict_is_the_same_with_what_summarize_computed(engines, span, profile):
    handed = summarize(engines, span, (), _handed(span, profile))
    assert json.dumps(handed) == json.dumps(summarize(engines, span, (), _from_scratch(span, profile)))
    if profile is None:  # the default verdict
        assert json.dumps(summarize(engines, span)) == json.dumps(handed)


@pytest.mark.long
@settings(max_examples=200, deadline=None)
@given(ENGINES)
def test_each_engine_names_its_series_in_its_invariant_messages(engines):
    summary = summarize(engines)
    for (model, engine), c in engines.items():
        assert summary["models"][model]["engines"][engine]["warnings"] == invariant_violations(c, series_name((model, engine)))


def test_engines_changed_by_a_verdict_are_judged_from_scratch():
    good = Counters(drafts=1000.0, draft_tokens=2000.0, accepted=1500.0, per_position=(800.0, 700.0))
    bad = Counters(drafts=1000.0, draft_tokens=2000.0, accepted=0.0, per_position=(0.0, 0.0))
    seen = []

    def verdict(model, engines):
        assert isinstance(engines, Engines) and engines.known is not None
        engines["0"] = engines["1"] = bad  # what was computed no longer holds
        seen.append(judge(engines, None, None, config.DETECTION, config.DEFAULT_MIN_DRAFTS))
        return seen[-1]

    summarize({("m", "0"): good, ("m", "1"): good}, None, (), verdict)
    assert seen[0] == judge({"0": bad, "1": bad}, None, None, config.DETECTION, config.DEFAULT_MIN_DRAFTS)
    assert seen[0].state == "collapsed"


def test_position_0_floor_under_a_profile_is_what_the_profile_allows():
    """Issue 30 item 5: under a profile, position 0's floor is degraded_fraction x (profile AL - 1)
    / k, at most 0.5 (as FirstPositionAcceptanceLow's). A DSpark-like k=7 deployment at position 0
    0.45 and AL 2.5 is healthy against the V4-Flash k=7 profile (1.99: floor 0.75 x 0.99 / 7 =
    0.106, AL threshold 1.7425); at k=2 (profile 2.27: floor 0.476) position 0 at 0.45 is not."""
    det = config.DETECTION
    assert det.position0_floor_under(1.99, 7) == pytest.approx(0.10607, abs=1e-5)
    assert det.position0_floor_under(2.27, 2) == pytest.approx(0.47625)
    assert det.position0_floor_under(1.79, 1) == 0.5  # 0.5925, capped
    k7 = BaselineProfile("flash-k7", re.compile("x"), 7, 1.99)
    # 1,000 drafts: 450 accepted at position 0, then a survival curve summing to 1,500 accepted (AL 2.5).
    dspark = Counters(1000, 7000, 1500, (450, 320, 260, 200, 150, 70, 50))
    assert judge({"0": dspark}, 60.0, k7, det, 100).state == "ok"
    k2 = BaselineProfile("pro-k2", re.compile("x"), 2, 2.27)
    low = Counters(1000, 2000, 900, (450, 450))  # position 0 0.45 < 0.476
    v = judge({"0": low}, 60.0, k2, det, 100)
    assert v.state == "degraded" and "position 0 acceptance 0.450 < 0.476" in v.reason, v
