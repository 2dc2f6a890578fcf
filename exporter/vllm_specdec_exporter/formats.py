"""What /metrics is written in: the format and the encoding a client asks for (q-values
honoured), and the two encoders.

The encoders write byte for byte what prometheus_client writes (tests/test_formats.py checks
them against it), in a fraction of its time: prometheus_client checks and escapes every label
name of every sample, about 5 µs a sample, most of a DP=8 render (docs/performance.md). Here
a name is checked once per render. A body this writer does not cover (a name outside
[a-zA-Z_][a-zA-Z0-9_]* or starting "__", an escaping other than underscores or allow-utf-8, a timestamp, an
exemplar, a native histogram, no value) is left whole to prometheus_client."""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Iterable

from prometheus_client import CollectorRegistry
from prometheus_client import exposition as text_format
from prometheus_client.metrics_core import Metric
from prometheus_client.openmetrics import exposition as om_format
from prometheus_client.registry import Collector
from prometheus_client.samples import Sample
from prometheus_client.utils import floatToGoString

Encoder = Callable[[CollectorRegistry], bytes]
_go_float: Callable[[float], str] = floatToGoString  # Go's float text, as both formats write values

# Names the escapings covered leave as they are: the label-name charset, as prometheus_client
# writes an OpenMetrics sample's name with the label-name runes (a colon becomes "_").
_PLAIN_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")
_COVERED_ESCAPINGS = (om_format.UNDERSCORES, om_format.ALLOWUTF8)
# The text format's names and types for OpenMetrics' types (prometheus_client's munging).
_TEXT_TYPES = {
    "counter": ("_total", "counter"),
    "info": ("_info", "gauge"),
    "stateset": ("", "gauge"),
    "gaugehistogram": ("", "histogram"),
    "unknown": ("", "untyped"),
}
_TEXT_LATE = ("_created", "_gsum", "_gcount")  # samples the text format puts in a gauge after the family


def _weighted(header: str) -> list[tuple[str, str, float]]:
    """An Accept-style header's items: (name lower-cased, its parameters as sent, its q-value:
    1 when absent, 0 when not a number from 0 to 1)."""
    items = []
    for item in header.split(","):
        name, _, params = item.strip().partition(";")
        weight = 1.0
        for param in params.split(";"):
            key, _, value = param.partition("=")
            if key.strip().lower() == "q":
                try:
                    weight = float(value.strip())
                except ValueError:
                    weight = 0.0
                weight = weight if 0.0 <= weight <= 1.0 else 0.0  # nan, inf and 1_0 (float reads 10) too
        items.append((name.strip().lower(), params.strip(), weight))
    return items


def accepts_gzip(header: str) -> bool:
    """RFC 9110: gzip (or *) listed with a q-value above 0; 'gzip;q=0' refuses it."""
    q = {name: weight for name, _, weight in _weighted(header)}
    return q.get("gzip", q.get("*", 0.0)) > 0


_SERVED_FORMATS = ("application/openmetrics-text", "text/plain", "text/*", "*/*")


def choose(accept: str) -> tuple[Encoder, str]:
    """The encoder and Content-Type for the first format we serve in the client's order of
    preference (highest q-value first, ties as sent; media types lower-cased), as
    prometheus_client's choose_encoder reads that item alone; an OpenMetrics item it does not
    honour (version 0.0.1) or cannot read ('version=abc') passes to the next. choose_encoder
    alone reads the items as sent and ignores q-values ('application/openmetrics-text;q=0' got
    OpenMetrics), and an unreadable version raised out of the handler: a 500."""
    items = _weighted(accept)
    ranked = sorted(
        ((weight, f"{name};{params}" if params else name) for name, params, weight in items),
        key=lambda ranked_item: -ranked_item[0],
    )
    chosen, content_type = text_format.choose_encoder("")  # the text format, when nothing else is
    # RFC 9110: the most specific item wins, so "*/*, text/plain;q=0" refuses text and takes
    # OpenMetrics (unless that is refused too: then nothing is acceptable, and text is the default).
    refused = {name for name, _, weight in items if weight <= 0}
    for weight, item in ranked:
        kind = item.split(";", 1)[0]
        if weight <= 0 or kind not in _SERVED_FORMATS or ("text/plain" in refused and kind == "text/*"):
            continue
        if "text/plain" in refused and kind == "*/*":
            if "application/openmetrics-text" in refused:
                continue
            item = "application/openmetrics-text"
        try:
            encoder, got_type = text_format.choose_encoder(item)
        except (TypeError, ValueError):  # a version that is not numbers, compared with a tuple of ints
            continue
        if kind != "application/openmetrics-text" or got_type != content_type:
            chosen, content_type = encoder, got_type
            break
    func, kw = (chosen.func, chosen.keywords) if isinstance(chosen, functools.partial) else (chosen, {})
    ours = _OURS.get(func)
    # An encoder this module does not write (a later prometheus_client's new format): the library's own.
    return (functools.partial(ours, **kw), content_type) if ours else (chosen, content_type)


class _Uncovered(Exception):
    """A body this writer does not cover: prometheus_client writes it."""


class _Collected(Collector):
    """Families already collected, for prometheus_client's encoders (they collect themselves)."""

    def __init__(self, families: list[Metric]):
        self._families = families

    def collect(self) -> Iterable[Metric]:
        return self._families


def _escaped(value: str) -> str:
    if "\\" in value or "\n" in value or '"' in value:
        return value.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")
    return value


class _Lines:
    """Sample lines, each name checked once a render."""

    def __init__(self) -> None:
        self._plain: set[str] = set()

    def name(self, name: str) -> str:
        if name not in self._plain:
            if not _PLAIN_NAME.fullmatch(name) or name.startswith("__"):  # "__": reserved, quoted in allow-utf-8
                raise _Uncovered
            self._plain.add(name)
        return name

    def line(self, s: Sample) -> str:
        if s.value is None or s.timestamp is not None or s.exemplar is not None or s.native_histogram is not None:
            raise _Uncovered
        value = _go_float(s.value)
        if not s.labels:
            return f"{self.name(s.name)} {value}\n"
        if not self._plain.issuperset(s.labels):
            for label in s.labels:
                self.name(label)
        labels = ",".join(f'{k}="{_escaped(v)}"' for k, v in sorted(s.labels.items()))
        return f"{self.name(s.name)}{{{labels}}} {value}\n"


def text(registry: Collector, escaping: str = om_format.UNDERSCORES) -> bytes:
    """prometheus_client.exposition.generate_latest's body."""
    families = list(registry.collect())
    try:
        return _text(families, escaping)
    except _Uncovered:
        return text_format.generate_latest(_Collected(families), escaping)


def openmetrics(registry: Collector, escaping: str = om_format.UNDERSCORES, version: str = "1.0.0") -> bytes:
    """prometheus_client.openmetrics.exposition.generate_latest's body (no native histogram is
    written here, so every version reads the same)."""
    families = list(registry.collect())
    try:
        return _openmetrics(families, escaping)
    except _Uncovered:
        return om_format.generate_latest(_Collected(families), escaping, version)  # type: ignore[no-untyped-call,no-any-return]


def _text(families: list[Metric], escaping: str) -> bytes:
    if escaping not in _COVERED_ESCAPINGS:
        raise _Uncovered
    lines, out = _Lines(), []
    for m in families:
        suffix, kind = _TEXT_TYPES.get(m.type, ("", m.type))
        name, doc = lines.name(m.name + suffix), m.documentation.replace("\\", r"\\").replace("\n", r"\n")
        out.append(f"# HELP {name} {doc}\n# TYPE {name} {kind}\n")
        late_names = {m.name + late: late for late in _TEXT_LATE}
        late: dict[str, list[str]] = {}
        for s in m.samples:
            if s.name in late_names:
                late.setdefault(late_names[s.name], []).append(lines.line(s))
            else:
                out.append(lines.line(s))
        for suffix, written in sorted(late.items()):
            name = lines.name(m.name + suffix)
            out.append(f"# HELP {name} {doc}\n# TYPE {name} gauge\n")
            out.extend(written)
    return "".join(out).encode("utf-8")


def _openmetrics(families: list[Metric], escaping: str) -> bytes:
    if escaping not in _COVERED_ESCAPINGS:
        raise _Uncovered
    lines, out = _Lines(), []
    for m in families:
        name = lines.name(m.name)
        out.append(f"# HELP {name} {_escaped(m.documentation)}\n# TYPE {name} {m.type}\n")
        if m.unit:
            out.append(f"# UNIT {name} {m.unit}\n")
        out.extend(lines.line(s) for s in m.samples)
    out.append("# EOF\n")
    return "".join(out).encode("utf-8")


_OURS: dict[object, Callable[..., bytes]] = {text_format.generate_latest: text, om_format.generate_latest: openmetrics}
