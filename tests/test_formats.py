"""formats.py: /metrics' encoders write byte for byte what prometheus_client writes, in both
formats and every escaping (the library is the reference, run on the same families), and the
format follows the client's q-values."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry
from prometheus_client import exposition as text_format
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeHistogramMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    InfoMetricFamily,
    StateSetMetricFamily,
    SummaryMetricFamily,
    UnknownMetricFamily,
)
from prometheus_client.openmetrics import exposition as om_format
from prometheus_client.registry import Collector
from prometheus_client.samples import Exemplar
from vllm_specdec_exporter import formats

ESCAPINGS = (om_format.UNDERSCORES, om_format.ALLOWUTF8, om_format.VALUES, om_format.DOTS)
# Label values and help texts with what must be escaped, and what must not be.
TEXT = st.text(alphabet=st.sampled_from([*'ab_\\"\n\t é{},=#', "\u202e", "\x00"]), max_size=12)
# Mostly plain names; now and then one the writer leaves to prometheus_client.
NAMES = st.one_of(st.from_regex(r"[a-z_][a-z0-9_]{0,8}", fullmatch=True),
                  st.sampled_from(["a:b", "x.y", "é", "__x", "1a", "_"]))
VALUES = st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.integers(-(2**70), 2**70),
                   st.sampled_from([0.0, -0.0, 1e21, 1234567.0, 123456789.5, 1e-7]))


class Families(Collector):
    def __init__(self, families):
        self.families = families

    def collect(self):
        return self.families


@st.composite
def family(draw):
    name, doc = draw(st.from_regex(r"[a-z][a-z0-9_]{0,8}", fullmatch=True)), draw(TEXT)
    if draw(st.integers(0, 15)) == 0:
        name = draw(NAMES)
    labels = draw(st.lists(st.one_of(st.from_regex(r"[a-z][a-z0-9_]{0,5}", fullmatch=True), NAMES),
                           max_size=3, unique=True).filter(lambda ls: not {"le", "quantile"} & set(ls)))
    kind = draw(st.sampled_from(["gauge", "counter", "histogram", "info", "summary", "unknown", "stateset",
                                 "gaugehistogram"]))
    rows = draw(st.lists(st.tuples(st.lists(TEXT, min_size=len(labels), max_size=len(labels)), VALUES), max_size=3))
    unit = draw(st.sampled_from(["", "seconds"])) if kind in ("gauge", "counter") else ""
    if unit and not name.endswith("_" + unit):
        name += "_" + unit
    if kind == "gauge":
        f = GaugeMetricFamily(name, doc, labels=labels, unit=unit)
        for values, v in rows:
            f.add_metric(values, v, timestamp=1.5 if draw(st.integers(0, 9)) == 0 else None)
    elif kind == "counter":
        f = CounterMetricFamily(name, doc, labels=labels, unit=unit)
        for values, v in rows:
            exemplar = Exemplar({"trace_id": "x"}, 1.0) if draw(st.integers(0, 9)) == 0 else None
            f.add_metric(values, abs(v), created=draw(st.one_of(st.none(), st.floats(0, 2e9))), exemplar=exemplar)
    elif kind == "histogram":
        f = HistogramMetricFamily(name, doc, labels=labels)
        for values, v in rows:
            f.add_metric(values, [("0.5", 1), ("+Inf", 3)], sum_value=abs(v))
    elif kind == "gaugehistogram":
        f = GaugeHistogramMetricFamily(name, doc, labels=labels)
        for values, v in rows:
            f.add_metric(values, [("1.0", 2), ("+Inf", 4)], gsum_value=v)
    elif kind == "summary":
        f = SummaryMetricFamily(name, doc, labels=labels)
        for values, v in rows:
            f.add_metric(values, count_value=3, sum_value=abs(v))
    elif kind == "info":
        f = InfoMetricFamily(name, doc, labels=labels)
        for values, _ in rows:
            f.add_metric(values, {"version": draw(TEXT)})
    elif kind == "stateset":
        f = StateSetMetricFamily(name, doc, labels=labels)
        for values, _ in rows:
            f.add_metric(values, {"on": True, "off": False})
    else:
        f = UnknownMetricFamily(name, doc, labels=labels)
        for values, v in rows:
            f.add_metric(values, v)
    return shuffled(draw, f)


def shuffled(draw, f):
    """The family with its samples in any order: a collector need not add them as the
    library's constructors do (the text format moves _created, _gsum and _gcount after)."""
    f.samples = draw(st.permutations(f.samples))
    return f


def same_as_the_library(families) -> None:
    registry = Families(families)
    for escaping in ESCAPINGS:
        assert formats.text(registry, escaping) == text_format.generate_latest(registry, escaping), escaping
        assert formats.openmetrics(registry, escaping) == om_format.generate_latest(registry, escaping), escaping


@settings(deadline=None)  # examples: the profile (tests/conftest.py; make fuzz runs 20,000)
@given(st.lists(family(), max_size=4, unique_by=lambda f: f.name))
def test_both_encoders_write_what_prometheus_client_writes(families):
    same_as_the_library(families)


def test_the_bodies_that_need_escaping_or_fall_back_are_the_librarys():
    g = GaugeMetricFamily("g", 'help with \\ and "quotes"\nand a line', labels=["a", "b"])
    g.add_metric(['v"1\\\n', "é\u202e"], math.nan)
    g.add_metric(["", "x"], -0.0)
    c = CounterMetricFamily("c", "counted", labels=["a"], created=None)
    c.add_metric(["x"], 1e21, created=1700000000.5)
    same_as_the_library([g, c])
    colon = GaugeMetricFamily("a:b", "a colon, which OpenMetrics writes as _ in sample names")
    colon.add_metric([], 1)
    same_as_the_library([g, colon])
    stamped = GaugeMetricFamily("t", "a timestamp")
    stamped.add_metric([], 1, timestamp=12.25)
    same_as_the_library([stamped, c])


def test_the_exporters_own_families_are_written_as_the_library_writes_them():
    """The families serve exports (the spec-decode collector over a minute of the simulator's
    bad-engine scenario, 8 engines, and the process, platform and GC collectors), collected
    once, in both formats."""
    from prometheus_client import GCCollector, PlatformCollector, ProcessCollector
    from sidecar_harness import harness, run
    from vllm_specdec_exporter.collector import SpecDecodeCollector
    from vllm_specdec_exporter.web import SETTINGS

    async def go():
        async with harness("bad-engine") as h:
            await h.run_for(90)
            registry = CollectorRegistry(auto_describe=False)
            registry.register(SpecDecodeCollector(lambda: [p.view for p in h.pollers], h.app[SETTINGS], h.clock))
            ProcessCollector(registry=registry)
            PlatformCollector(registry=registry)
            GCCollector(registry=registry)
            return list(registry.collect())

    families = run(go())
    assert sum(len(f.samples) for f in families if f.name.startswith("vllm_specdec_")) > 200
    same_as_the_library(families)


@pytest.mark.parametrize("header, library_header", [
    ("", ""),
    ("application/openmetrics-text;version=1.0.0,text/plain;version=0.0.4;q=0.5", "application/openmetrics-text;version=1.0.0"),
    ("application/openmetrics-text;version=1.0.0;q=0", ""),  # refused: the default, text
    ("text/plain;version=1.0.0;escaping=allow-utf-8", "text/plain;version=1.0.0;escaping=allow-utf-8"),
    ("application/openmetrics-text;version=1.0.0;escaping=dots", "application/openmetrics-text;version=1.0.0;escaping=dots"),
    # An unreadable version is left out (choose_encoder raised on it: a 500), not the item after it.
    ("text/plain;version=1.0.0;q=0.1, application/openmetrics-text;version=abc", "text/plain;version=1.0.0"),
    ("application/openmetrics-text;version=1..0", ""),
    # Media types are case-insensitive; an item choose_encoder does not honour passes to the next.
    ("APPLICATION/OpenMetrics-Text;version=1.0.0, text/plain;q=0.5", "application/openmetrics-text;version=1.0.0"),
    ("application/openmetrics-text;version=0.0.1, text/plain;version=1.0.0;escaping=allow-utf-8;q=0.5",
     "text/plain;version=1.0.0;escaping=allow-utf-8"),
    # q-values outside 0..1, unreadable or spaced.
    ("application/openmetrics-text;version=1.0.0;q=1e400", ""), ("application/openmetrics-text;version=1.0.0;q=1_0", ""),
    ("application/openmetrics-text;version=1.0.0; q = 0", ""), ("application/openmetrics-text;version=1.0.0;q=-1", ""),
    ("text/plain;q=0.3, application/openmetrics-text;version=1.0.0;q=0.300", "text/plain"),
    # The most specific item wins (RFC 9110): text refused, */* is OpenMetrics; text/* is nothing left.
    ("*/*, text/plain;q=0", "application/openmetrics-text"), ("text/plain;q=0, */*;q=0.1", "application/openmetrics-text"),
    ("text/*;q=0.9, text/plain;q=0, application/openmetrics-text;version=1.0.0;q=0.5", "application/openmetrics-text;version=1.0.0"),
    ("*/*", ""), ("text/*", ""),
    # both refused: nothing acceptable, the default (helper-30: it got OpenMetrics, which it refused)
    ("text/plain;q=0, */*;q=0.5, application/openmetrics-text;q=0", ""),
])
def test_choose_gives_this_modules_encoders_with_the_librarys_arguments(header, library_header):
    """The item chosen, encoded as prometheus_client's choose_encoder encodes it alone."""
    encoder, content_type = formats.choose(header)
    library, library_type = text_format.choose_encoder(library_header)
    assert content_type == library_type
    registry = CollectorRegistry()
    g = GaugeMetricFamily("g.x", "a name the dots and underscores escapings change", labels=["a"])
    g.add_metric(["x.y"], 1.0)
    registry.register(Families([g]))
    assert encoder(registry) == library(registry)


def test_an_encoder_this_module_does_not_write_is_the_librarys_own(monkeypatch):
    """A later prometheus_client's new format (say protobuf) is served by its own encoder under
    its own Content-Type, not as this module's text under that type."""
    def protobuf(registry):
        return b"\x08\x01"

    monkeypatch.setattr(text_format, "choose_encoder", lambda accept: (protobuf, "application/vnd.google.protobuf"))
    encoder, content_type = formats.choose("application/openmetrics-text;version=1.0.0")
    assert encoder is protobuf and content_type == "application/vnd.google.protobuf"
