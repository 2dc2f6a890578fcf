"""Prometheus text (0.0.4) and OpenMetrics parser with a fast path.

A vLLM TP=8/DP=8 endpoint serves ~3,400 lines of which ~50 are speculative
decoding. With ``wanted`` set, the parser finds the stretches of lines that hold
one of a few anchors (``bytes.rfind``, C speed), reads each stretch with one bytes
regex that yields only the wanted names' lines, and tokenises each series (name and
labels) once, keeping it for the next polls, instead of tokenising 3,400 lines in
Python. Names are matched exactly at the start of a line and must be followed by
``{`` or a blank, so ``foo_total`` never matches ``foo_total_created`` and
``x_accepted_tokens_total`` never matches ``x_accepted_tokens_per_pos_total``. Any
line of a wanted name that is not of the simple shape goes to the careful
line-by-line path (parse_sample_line), which reads it or says why not.

Malformed lines never abort a parse: they are counted and the first few are kept
with their line numbers; the rest of the payload still counts.
"""

from __future__ import annotations

import codecs
import itertools
import math
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import NamedTuple

from . import config
from .scan import B_INDENT, STEP, end_of, find_eof, finder, runs

_MAX_ISSUES_KEPT = 20  # detail kept per parse; the count is always exact
_SNIFF_BYTES = 4096

_NAME_RE = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*+")
_LABEL_RE = re.compile(r'[ \t]*+([a-zA-Z_][a-zA-Z0-9_]*+)[ \t]*+=[ \t]*+"((?:[^"\\\n]|\\.)*+)"[ \t]*+(,?)')
_UNESCAPE_RE = re.compile(r"\\(.)")
_UNESCAPES = {"n": "\n", "\\": "\\", '"': '"'}
# Canonical lines (what prometheus_client and Go clients write: no blanks inside
# the braces, no escapes) take one regex; anything else goes to the careful path.
_FAST_LINE_RE = re.compile(
    r"([a-zA-Z_:][a-zA-Z0-9_:]*+)"
    r'(?:\{((?:[a-zA-Z_][a-zA-Z0-9_]*+="[^"\\\n]*+"(?:,[a-zA-Z_][a-zA-Z0-9_]*+="[^"\\\n]*+")*+)?),?\})?'
    r"[ \t]++([^ \t#]++)(?:[ \t]++([^ \t#]++))?[ \t]*+(?:#.*+)?"
)
_FAST_LABEL_RE = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*+)="([^"]*+)"')
_LEADING_BLANKS_RE = re.compile(rb"(?:\n|" + B_INDENT + rb")*+")
# First meaningful line of any exposition: a comment or a sample name.
_SNIFF_RE = re.compile(rb"[ \t]*+(#|[a-zA-Z_:][a-zA-Z0-9_:]*+[ \t{])")


class ParseError(ValueError):
    """The payload as a whole cannot be used (too big, not Prometheus text)."""


class PayloadTooLarge(ParseError):
    """``size`` is the real size when known (Content-Length, a file), else None:
    the body was cut off as soon as it passed the cap."""

    def __init__(self, size: int | None, cap: int, source: str | None = None):
        amount = f"{size:,} bytes" if size is not None else f"more than {cap:,} bytes"
        super().__init__(f"{source + ': ' if source else ''}payload is {amount}, over the {cap:,}-byte cap")
        self.size = size
        self.cap = cap


class NotPrometheusText(ParseError):
    pass


class Sample(NamedTuple):
    """One sample line read (a named tuple: built ~3x faster than a frozen dataclass, and a
    DP=8 payload is read every few seconds)."""

    name: str
    labels: dict[str, str]
    value: float


@dataclass(frozen=True, slots=True)
class LineIssue:
    line: int  # 1-based
    message: str

    def __str__(self) -> str:
        return f"line {self.line}: {self.message}"


@dataclass(slots=True)
class Exposition:
    """Samples by exact sample name, with what went wrong along the way."""

    samples: dict[str, list[Sample]] = field(default_factory=dict)
    malformed_lines: int = 0
    duplicate_series: int = 0
    issues: list[LineIssue] = field(default_factory=list)  # first few, with line numbers
    openmetrics: bool = False
    size: int = 0
    cut_at: int | None = None  # the max_samples bound, when the payload held more and the rest was not read

    def issue_messages(self) -> list[str]:
        out = [str(i) for i in self.issues]
        hidden = self.malformed_lines + self.duplicate_series - len(self.issues)
        if hidden > 0:
            out.append(f"... and {hidden} more problem line(s)")
        return out


class _Malformed(Exception):
    pass


def _unescape(value: str) -> str:
    if "\\" not in value:
        return value
    return _UNESCAPE_RE.sub(lambda m: _UNESCAPES.get(m.group(1), "\\" + m.group(1)), value)


def _parse_float(token: str) -> float:
    # Go's ParseFloat forms (1.5e+06, +Inf, NaN); Python's float() also takes
    # "1_000" and "infinity" spellings that no exposition contains: refuse them.
    # float() also reads non-ASCII digits ('١٢'), which no exposition format allows.
    if "_" in token or not token or not token.isascii():
        raise _Malformed(f"bad value {token[:40]!r}")
    try:
        return float(token)
    except ValueError:
        raise _Malformed(f"bad value {token[:40]!r}") from None


def parse_sample_line(line: str, strings: dict[str, str] | None = None) -> Sample:
    """One sample line -> Sample, or _Malformed with the reason. With ``strings`` (one
    parse's table), names and label strings seen before are shared, not held again."""
    fast = _FAST_LINE_RE.fullmatch(line)
    if fast:
        name, body, value, timestamp = fast.groups()
        pairs = _FAST_LABEL_RE.findall(body) if body else []
        if strings is not None:
            name = strings.setdefault(name, name)
            pairs = [(strings.setdefault(k, k), strings.setdefault(v, v)) for k, v in pairs]
        labels: dict[str, str] = dict(pairs)
        if len(labels) == len(pairs):  # a repeated label name gets the careful path's error
            if timestamp is not None:
                _parse_float(timestamp)
            return Sample(name, labels, _parse_float(value))
    m = _NAME_RE.match(line)
    if not m:
        raise _Malformed("no metric name")
    name = m.group(0)
    pos = m.end()
    labels = {}
    if pos < len(line) and line[pos] == "{":
        pos += 1
        while True:
            while pos < len(line) and line[pos] in " \t":
                pos += 1
            if pos < len(line) and line[pos] == "}":
                pos += 1
                break
            lm = _LABEL_RE.match(line, pos)
            if not lm:
                raise _Malformed(f"bad label set in {name}")
            key = lm.group(1)
            if key in labels:
                raise _Malformed(f"label {key!r} repeated in {name}")
            labels[key] = _unescape(lm.group(2))
            pos = lm.end()
            if not lm.group(3):  # no comma: the set must close here
                while pos < len(line) and line[pos] in " \t":
                    pos += 1
                if pos >= len(line) or line[pos] != "}":
                    raise _Malformed(f"unterminated label set in {name}")
                pos += 1
                break
    rest = line[pos:]
    if not rest or rest[0] not in " \t":
        raise _Malformed(f"no value after {name}")
    # value [timestamp] [# exemplar (OpenMetrics)]
    fields = rest.split("#", 1)[0].split()
    if not fields or len(fields) > 2:
        raise _Malformed(f"expected 'value [timestamp]' after {name}")
    value = _parse_float(fields[0])
    if len(fields) == 2:
        _parse_float(fields[1])
    return Sample(name, labels, value)


def _check_payload(data: bytes, max_bytes: int) -> None:
    if len(data) > max_bytes:
        raise PayloadTooLarge(len(data), max_bytes)
    # The first bytes after the leading blanks, however many (a payload may start with blank lines).
    blanks = _LEADING_BLANKS_RE.match(data)  # always a match: the empty string is one
    start = blanks.end() if blanks else 0
    if start == len(data):
        raise NotPrometheusText("empty payload")
    stripped = data[start : start + _SNIFF_BYTES]
    if b"\x00" in stripped:
        raise NotPrometheusText("binary data, not Prometheus text")
    if stripped[:1] == b"<":
        raise NotPrometheusText("HTML or XML, not Prometheus text (an error page?)")
    if not _SNIFF_RE.match(stripped):
        first = stripped.split(b"\n", 1)[0][:60].decode("utf-8", "replace")
        raise NotPrometheusText(f"not Prometheus text: first line starts {first!r}")
    # Both formats are UTF-8 by definition; anything else (Latin-1, UTF-16, random
    # bytes after a text-like start) is not Prometheus text. C speed: ~10 ms for 32 MiB.
    # In 1 MiB steps: one C call over 32 MiB would hold the GIL for ~100 ms, stalling
    # the event loop while this runs in the parsing thread.
    if data.isascii():  # ASCII is UTF-8, and vLLM's payloads are ASCII (~3 ms for 32 MiB)
        return
    decoder = codecs.getincrementaldecoder("utf-8")()
    for start in range(0, len(data), STEP):
        try:
            decoder.decode(data[start : start + STEP], final=start + STEP >= len(data))
        except UnicodeDecodeError as e:
            at = start + e.start
            line = data.count(b"\n", 0, at) + 1
            raise NotPrometheusText(f"not Prometheus text: not valid UTF-8 (line {line}, byte {at})") from None


def _record(exp: Exposition, data: bytes, pos: int, message: str) -> None:
    if len(exp.issues) < _MAX_ISSUES_KEPT:
        # Cut: a message quotes the line's labels, which the payload chooses.
        exp.issues.append(LineIssue(data.count(b"\n", 0, pos) + 1, message[: 2 * config.MAX_WARNING_CHARS]))


def _add_line(exp: Exposition, seen: set[int], strings: dict[str, str], data: bytes, start: int, end: int) -> bool:
    """Read one line with the careful path; True when it added a sample."""
    try:
        text = data[start:end].decode("utf-8").strip()
    except UnicodeDecodeError:
        exp.malformed_lines += 1
        _record(exp, data, start, "not valid UTF-8")
        return False
    if not text or text.startswith("#"):  # blank or a comment once Unicode blanks are off, as prometheus_client reads it
        return False
    try:
        sample = parse_sample_line(text, strings)
    except _Malformed as e:
        exp.malformed_lines += 1
        _record(exp, data, start, str(e))
        return False
    # A series is remembered by its hash (Python's keyed 64-bit SipHash), not its strings:
    # ~60 bytes a series instead of ~450. Two series colliding (~1e-8 for 600,000 series)
    # would be reported as a duplicate, never merged silently.
    key = hash((sample.name, frozenset(sample.labels.items())))
    if key in seen:
        exp.duplicate_series += 1
        _record(exp, data, start, f"duplicate series {format_series(sample.name, sample.labels)} (first value kept)")
        return False
    seen.add(key)
    exp.samples.setdefault(sample.name, []).append(sample)
    return True


# A wanted line's series part (scan's line regex: name and label set), its grammar checked once per series.
_B_SERIES_RE = re.compile(
    rb'[a-zA-Z_:][a-zA-Z0-9_:]*+(?:\{(?:[a-zA-Z_][a-zA-Z0-9_]*+="[^"\\\n]*+"(?:,[a-zA-Z_][a-zA-Z0-9_]*+="[^"\\\n]*+")*+)?,?\})?'
)  # the series part of _FAST_LINE_RE


class SeriesCache:
    """The series one target served before (name and label set, as bytes) -> (name, labels,
    key): a payload keeps its label sets from poll to poll (only values move), so each is
    tokenised once, not on every poll. One per target, so a target whose series churn
    clears only its own (a cache shared by every target let one churning target make the
    others' parses ~3x slower). Bounded: cleared when full; series longer than
    ``max_bytes`` are never kept. Sample labels are copies: a consumer that changes one
    cannot change the cache."""

    def __init__(self, max_entries: int = 2048, max_bytes: int = 512):
        self.entries: dict[bytes, tuple[str, dict[str, str], int]] = {}
        self.strings: dict[str, str] = {}  # names and label strings of the kept series, each held once
        self.max_entries = max_entries
        self.max_bytes = max_bytes

    def series(self, raw: bytes) -> tuple[str, dict[str, str], int] | None:
        """(name, labels, key) of a canonical series, or None (not canonical, or a label
        repeated: the careful path says why)."""
        entry = self.entries.get(raw)
        if entry is not None:
            return entry
        if not _B_SERIES_RE.fullmatch(raw):
            return None
        text = raw.decode("utf-8")  # the payload was checked to be UTF-8, and lines end at whole characters
        brace = text.find("{")
        kept = len(raw) <= self.max_bytes
        if kept and len(self.entries) >= self.max_entries:
            self.entries.clear()
            self.strings.clear()
        strings = self.strings if kept else {}  # a series not kept leaves no string behind either
        name = text if brace == -1 else text[:brace]
        name = strings.setdefault(name, name)
        pairs = (
            []
            if brace == -1
            else [(strings.setdefault(k, k), strings.setdefault(v, v)) for k, v in _FAST_LABEL_RE.findall(text, brace)]
        )
        labels = dict(pairs)
        if len(labels) != len(pairs):
            return None
        entry = (name, labels, hash((name, frozenset(labels.items()))))  # the key as _add_line computes it
        if kept:
            self.entries[raw] = entry
        return entry


def parse(
    data: bytes | str,
    wanted: Iterable[str] | None = None,
    max_bytes: int = config.DEFAULT_MAX_PAYLOAD_BYTES,
    *,
    cache: SeriesCache | None = None,
    max_samples: int | None = None,
) -> Exposition:
    """Parse an exposition; with ``wanted``, only samples with those exact names. ``cache``
    keeps a target's series from one poll to the next; past ``max_samples`` samples read,
    the rest of the payload is not read (``Exposition.cut_at``: what a target may hold is
    bounded anyway, and so are the memory and the time its parse takes)."""
    if isinstance(data, str):
        data = data.encode("utf-8")
    _check_payload(data, max_bytes)
    exp = Exposition(size=len(data))
    seen: set[int] = set()  # the series read (_add_line)
    strings: dict[str, str] = {}  # names and label strings, each held once (a payload repeats them per line)

    # OpenMetrics ends at the first "# EOF" line, wherever it is; a sample after it
    # is not part of the exposition (find_eof: memrchr, ~0.1 ms per MB).
    limit = len(data)
    eof = find_eof(data)
    if eof != -1:
        exp.openmetrics = True
        if data[eof + 5 :].strip():
            exp.malformed_lines += 1
            _record(exp, data, eof, "content after '# EOF' ignored")
        limit = eof
    elif not data.endswith(b"\n"):
        # A payload cut mid-line: its last line may parse as a wrong number
        # (1.561637e+06 cut to 1.5616), so it is never read.
        exp.malformed_lines += 1
        limit = data.rfind(b"\n") + 1
        _record(exp, data, limit, "payload ends mid-line (truncated?); its last line ignored")

    if wanted is None:
        pos = 0
        while pos < limit:
            end = end_of(data, pos, limit)
            line = data[pos:end].strip()
            if line and not line.startswith(b"#"):
                _add_line(exp, seen, strings, data, pos, end)
            pos = end + 1
        return exp

    # The stretches of lines that hold an anchor, then one regex pass over each that yields
    # only the wanted names' lines (exact name, then '{' or a blank), in payload order.
    anchors, lines, first_line = finder(frozenset(wanted))
    series = (cache or SeriesCache()).series
    samples, seen_add, new_sample = exp.samples, seen.add, tuple.__new__
    room = math.inf if max_samples is None else max_samples
    for run_start, run_end in runs(data, anchors, limit):
        found: Iterable[re.Match[bytes]] = lines.finditer(data, run_start - 1, run_end)
        if run_start == 0:  # the payload's first line: no newline before it
            found = itertools.chain(filter(None, [first_line.match(data, 0, run_end)]), found)
        for m in found:
            if room <= 0:  # one more wanted line than may be read
                exp.cut_at = max_samples
                _record(exp, data, m.end(), f"more than {max_samples:,} samples of the wanted names: the rest not read")
                return exp
            raw, value, timestamp = m.group(1, 2, 3)
            entry = None if raw is None else series(raw)
            if entry is not None:
                name, labels, key = entry
                if key not in seen:
                    try:
                        number = float(value)
                        if timestamp is not None:
                            float(timestamp)
                    except ValueError:
                        pass
                    else:
                        seen_add(key)
                        samples.setdefault(name, []).append(new_sample(Sample, (name, labels.copy(), number)))
                        room -= 1
                        continue
            # Not canonical, a repeated series or a bad number: the careful path reads it and says why.
            start = m.start() + (data[m.start()] == 0x0A)
            room -= _add_line(exp, seen, strings, data, start, end_of(data, start, run_end))
    return exp


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def format_series(name: str, labels: dict[str, str]) -> str:
    """name{k="v",...} escaped as on the wire, so it always fits on one line."""
    if not labels:
        return name
    body = ",".join(f'{k}="{_escape(v)}"' for k, v in sorted(labels.items()))
    return f"{name}{{{body}}}"
