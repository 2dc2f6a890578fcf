"""One duration grammar everywhere: Prometheus's own, in the config, the flags and the Helm schema."""

from __future__ import annotations

import json
import re

import pytest
from conftest import REPO
from vllm_specdec_exporter.durations import format_duration, parse_duration

VALID = {"500ms": 0.5, "1s": 1, "90s": 90, "1m30s": 90, "5m": 300, "1h": 3600, "1d": 86400,
         "1w": 604800, "1y": 31536000, "2h15m": 8100, "1m500ms": 60.5}
INVALID = ["60", "1.5s", "5m1h", "1s1s", "", " ", "-1s", "1M", "5 m", "soon", "1h 30m",
           "\u0665s", "\uff15m"]  # Arabic-Indic and full-width digits: \d took them (found attacking the config)


@pytest.mark.parametrize("text, seconds", VALID.items())
def test_prometheus_durations_parse(text, seconds):
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", INVALID)
def test_anything_else_is_refused_with_the_form_named(text):
    with pytest.raises(ValueError, match="Prometheus form"):
        parse_duration(text)


@pytest.mark.parametrize("text", ["0", "0s", "0ms"])
def test_zero_is_refused_as_not_positive(text):
    with pytest.raises(ValueError, match="not a positive duration"):
        parse_duration(text)


# One spelling (issue 32: three formatters became one): the largest unit that divides, as window
# labels have always been spelled; 90 s was '1m30s' and 8 days '1w1d' in the landing page's query step.
@pytest.mark.parametrize("seconds, text", [(300, "5m"), (90, "90s"), (3600, "1h"), (0.5, "500ms"), (86400 * 8, "8d"),
                                           (1.5, "1500ms"), (180, "3m"), (1000.001, "1000001ms"), (1234.567, "1234567ms")])
def test_canonical_spelling(seconds, text):
    assert format_duration(seconds) == text
    assert parse_duration(format_duration(seconds)) == seconds


def test_helm_schema_accepts_exactly_what_the_exporter_accepts():
    schema = (REPO / "helm/vllm-specdec-exporter/values.schema.json").read_text()
    patterns = {m for m in re.findall(r'"pattern": "(\^\(\([^"]*)"', schema)}
    assert len(patterns) == 1, patterns  # one grammar for every duration in the chart
    pattern = json.loads(f'"{patterns.pop()}"')
    for text in [*VALID, *INVALID]:
        assert bool(text and re.fullmatch(pattern, text)) == (text in VALID), text


def test_an_absurdly_long_duration_is_an_error_not_a_crash():
    with pytest.raises(ValueError, match="too long"):
        parse_duration("9" * 400 + "y")
